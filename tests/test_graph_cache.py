"""Graph caches are bounded by the kernel rows they hold, and a strategy search does not pin its rank graphs: a search
of gpt-oss-120b on 16 GPUs grew past 15 GB over its 5,000 configurations because every candidate group's schedule
context held its whole rank graph (and the entry-bounded caches held hundreds of 150,000-row graphs)."""

from __future__ import annotations

import gc

import numpy as np
import pandas as pd

import wattcast
import wattcast.simulate.distributed as dist
from wattcast.featurize import graph_cache, workload
from wattcast.featurize.graph_cache import RowsCache, graph_rows
from wattcast.featurize.op_graph import OpGraph


def _frame(rows: int) -> pd.DataFrame:
    return pd.DataFrame({"x": np.zeros(rows)})


def test_rows_cache_evicts_the_least_recently_used_by_rows():
    c = RowsCache(max_rows=250)
    c["a"], c["b"] = _frame(100), _frame(100)
    assert c.get("a") is not None  # "b" is now the least recently used
    c["c"] = _frame(100)
    assert "b" not in c and "a" in c and "c" in c and c.rows == 200
    c["big"] = _frame(1000)  # the newest entry stays, however big: it alone
    assert list(c._data) == ["big"] and c.rows == 1000
    c.put("small", "not a graph", rows=5)
    assert list(c._data) == ["small"] and c.rows == 5
    assert c.get_or_build("t", lambda: (OpGraph(_frame(7), np.zeros((0, 2))), 3)) == c.get("t")
    assert graph_rows(c.get("t")) == 7 and c.rows == 12
    n = RowsCache(max_rows=10**9, max_entries=2)
    for k in range(5):
        n[k] = _frame(1)
    assert list(n._data) == [3, 4]


def _held_rows(g: OpGraph) -> int:
    """The kernel rows whose memory ``g``'s node frame holds: its own, or more when its columns are views of a bigger
    frame's (an empty slice of a graph keeps the whole graph's columns alive)."""
    rows = len(g.nodes)
    for blk in g.nodes._mgr.blocks:
        arr = blk.values
        base = getattr(arr, "base", None)
        while isinstance(getattr(base, "base", None), np.ndarray):
            base = base.base
        if isinstance(base, np.ndarray) and arr.ndim == 2 and arr.shape[0]:
            rows = max(rows, base.size // arr.shape[0])
    return rows


def _live_graph_rows() -> int:
    """Kernel rows held by every operator graph alive in the process."""
    return sum(_held_rows(o) for o in gc.get_objects() if type(o) is OpGraph)


def test_a_search_holds_no_more_graph_rows_than_its_caches_bound(monkeypatch):
    """With every graph cache bounded at 1,500 rows (a 3-block Llama 3 8B rank graph has ~330), the graphs alive
    during a search stay within the caches' bounds, whatever the number of rank graphs the search builds; the rows are
    the same as with the caches unbounded."""
    budget = 1_500
    for cache in (dist._COSTED, dist._TOTALS, workload.cached_path_graph.cache, workload._cached_dict_graph.cache,
                  workload._FORWARDS):
        monkeypatch.setattr(cache, "max_rows", budget)
        cache.clear()
    monkeypatch.setattr(graph_cache, "GRAPH_CACHE_ROWS", budget)  # the search's own rank-graph cache
    peak = [0]
    seen = set()

    def progress(done, total):
        if done % 25 == 0:
            peak[0] = max(peak[0], _live_graph_rows())
        seen.add(done)

    space = dict(pp=(1, 2), zero=(0,), interleave=(1,), sp=(False, True), micro_batch=(1, 2, 4), cp=(1, 2))
    res = wattcast.search("llama3_8b", "DGX-H100", 16, 64, 4096, max_configs=400, progress=progress, **space)
    groups = res.ranked[["tp", "sp", "cp", "micro_batch", "recompute"]].drop_duplicates()
    assert len(groups) >= 20  # rank graphs of some 330 rows each: unbounded, ~10,000 rows alive
    # each of the four caches of graphs (files, the forward graphs of recompute siblings, the search's rank graphs, the
    # costed ones) at most its bound, plus the newest entry beyond it
    assert peak[0] <= 4 * budget + 1_000, peak[0]
    for cache in (dist._COSTED, workload.cached_path_graph.cache):
        monkeypatch.setattr(cache, "max_rows", 10**9)
        cache.clear()
    monkeypatch.setattr(graph_cache, "GRAPH_CACHE_ROWS", 10**9)
    again = wattcast.search("llama3_8b", "DGX-H100", 16, 64, 4096, max_configs=400, **space)
    pd.testing.assert_frame_equal(res.ranked, again.ranked)
