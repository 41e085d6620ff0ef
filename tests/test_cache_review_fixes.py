"""Review findings on the warm-predict caches: the kernel prediction cache past its bound, the row-weighed LRU under
threads, and the column-mask cache's weighing (a big graph's masks must not evict each other within one predict)."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pandas as pd

import wattcast
from wattcast.featurize import graph_cache
from wattcast.featurize.graph_cache import GraphMemo, RowsCache, column_is
from wattcast.simulate import single_device as sd


def test_prediction_cache_past_its_bound_predicts_instead_of_raising(monkeypatch):
    # 10 rows stands for the 500,000 distinct kernel rows a long search or sweep worker meets: the cache used to be
    # cleared after the lookup, losing the rows it had just found cached (KeyError)
    monkeypatch.setattr(sd, "_CACHE_MAX_ROWS", 10)
    sd._PREDICTION_CACHE.clear()
    a = wattcast.predict("gpt2", "H100-SXM5-80GB", batch=2, seq=128, dtype="bf16")
    b = wattcast.predict("gpt2", "H100-SXM5-80GB", batch=4, seq=128, dtype="bf16")  # shares rows, adds others
    sd._PREDICTION_CACHE.clear()
    monkeypatch.setattr(sd, "_CACHE_MAX_ROWS", 500_000)
    assert b.step_time_ms == wattcast.predict("gpt2", "H100-SXM5-80GB", batch=4, seq=128, dtype="bf16").step_time_ms
    assert a.step_time_ms < b.step_time_ms


def _hammer(work, n_threads: int = 4) -> list[str]:
    errs: list[str] = []

    def run(seed):
        try:
            work(np.random.default_rng(seed))
        except Exception as e:  # noqa: BLE001 - the test reports any
            errs.append(f"{type(e).__name__}: {e}")

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        ts = [threading.Thread(target=run, args=(s,)) for s in range(n_threads)]
        [t.start() for t in ts]
        [t.join() for t in ts]
    finally:
        sys.setswitchinterval(old)
    return errs


def test_rows_cache_and_graph_memo_under_threads():
    cache = RowsCache(max_rows=10**9, max_entries=8)
    wrong = []

    def lru(rng):
        for _ in range(20_000):
            k = int(rng.integers(40))
            v = cache.get(k)
            if v is None:
                cache.put(k, k, rows=1)
            elif v != k:
                wrong.append((k, v))

    assert _hammer(lru) == [] and wrong == []
    memo = GraphMemo(max_entries=4)

    class G:
        pass

    objs = [G() for _ in range(40)]

    def memo_work(rng):
        for _ in range(20_000):
            g = objs[int(rng.integers(len(objs)))]
            assert memo.get_or_build(g, (), lambda g=g: id(g)) == id(g)

    assert _hammer(memo_work) == []


def test_column_masks_of_a_big_frame_do_not_evict_each_other():
    graph_cache._COLUMNS.clear()
    n = 200_000  # by rows, 17 masks of a 200k-row graph were 3.4M "rows" against a 1M bound
    f = pd.DataFrame({c: pd.array(np.where(np.arange(n) % 3 == 0, "a", "b"), dtype="str") for c in "pqrstuvwxyz"})
    masks = [column_is(f, c, "a") for c in f.columns]
    ev = graph_cache._COLUMNS.evictions
    again = [column_is(f, c, "a") for c in f.columns]
    assert graph_cache._COLUMNS.evictions == ev and all(m is a for m, a in zip(masks, again))
