"""Stop 52's search speed-ups change no figure: the forward graph shared by the training graphs that differ only in
recomputation (featurize.workload._FORWARDS: the same graph as a fresh build, a changed input a miss), the search's
sibling order (serial and worker assignment) and the unsharded model totals keyed once for etp None and 1."""

from __future__ import annotations

import json
import os

import pandas as pd

import wattcast
from wattcast.featurize import workload
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.planning import search as S
from wattcast.simulate.parallel import new_config

_TINY_MOE = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "num_local_experts": 4,
             "num_experts_per_tok": 2, "max_position_embeddings": 512}


def _fresh(monkeypatch):
    """Every graph cache of the path graphs empty (and restored empty after the test)."""
    workload.cached_path_graph.cache.clear()
    workload._FORWARDS.clear()
    monkeypatch.setattr(workload, "_FORWARDS", workload.RowsCache(max_rows=workload.FORWARD_CACHE_ROWS, max_entries=2))


def _assert_same_graph(a, b):
    pd.testing.assert_frame_equal(a.nodes, b.nodes)
    assert (a.edges == b.edges).all() and a.edges.shape == b.edges.shape
    assert a.meta == b.meta


def test_recompute_siblings_share_the_forward_and_equal_fresh_builds(monkeypatch):
    _fresh(monkeypatch)
    base = StepOptions(batch=2, seq=256, dtype="bf16", attention="flash", framework="megatron", tp=2, sp=True)
    full = step_graph("llama3_8b", base, recompute="full")
    assert workload._FORWARDS.misses == 1
    none = step_graph("llama3_8b", base, recompute="none")
    assert workload._FORWARDS.hits == 1 and workload._FORWARDS.misses == 1  # the forward built once
    assert full.nodes["recompute"].any() and not none.nodes["recompute"].any()
    # each is the graph a build of its own gives (no forward kept: the path before stop 52)
    for opts, got in ((replace_opts(base, "full"), full), (replace_opts(base, "none"), none)):
        _assert_same_graph(got, workload._build_forward_and_step("llama3_8b", opts))
    # the forward graph is not changed by the training graphs built from it
    fwd = next(iter(workload._FORWARDS._data.values()))[0]
    _assert_same_graph(fwd, workload._build_forward_and_step("llama3_8b", replace_opts(base, "none"), forward_only=True))


def replace_opts(opts, recompute):
    from dataclasses import replace

    return replace(opts, recompute=recompute).validated().with_default_shape()


def test_a_changed_input_misses_the_forward_cache(monkeypatch, tmp_path):
    _fresh(monkeypatch)
    base = StepOptions(batch=1, seq=128, dtype="bf16", attention="flash", framework="megatron")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(_TINY_MOE))
    g1 = step_graph(str(cfg), base, recompute="none")
    # any other option than recompute: another forward graph
    for kw in (dict(tp=2), dict(ep=2), dict(batch=2), dict(etp=1, tp=2), dict(seq=64), dict(dtype="fp16")):
        misses = workload._FORWARDS.misses
        step_graph(str(cfg), base, recompute="full", **kw)
        assert workload._FORWARDS.misses == misses + 1, kw
    # the file rewritten (another modification time): its new contents, not the kept forward graph
    cfg.write_text(json.dumps(dict(_TINY_MOE, intermediate_size=256)))
    os.utime(cfg, (1e9, 1e9))
    misses = workload._FORWARDS.misses
    g2 = step_graph(str(cfg), base, recompute="full")
    assert workload._FORWARDS.misses == misses + 1
    assert g2.param_count > g1.param_count
    workload.cached_path_graph.cache_clear()  # a cleared path-graph cache builds cold: its forward graphs go too
    assert len(workload._FORWARDS) == 0 and len(workload.cached_path_graph.cache) == 0


def test_the_forward_cache_is_bounded():
    c = workload._FORWARDS
    assert c.max_entries is not None and c.max_entries <= 4 and c.max_rows <= 500_000


def _cands():
    return S.candidate_configs("mixtral_8x7b", "DGX-H100", 16, 64, 2048, tp=(1, 2), pp=(1, 2), micro_batch=(1, 2),
                               zero=(1,), sp=(False, True), recompute=("none", "full"), interleave=(1,), ep=(1, 2))


def test_sibling_order_puts_recompute_siblings_together_and_keeps_candidate_order_within():
    cands = _cands()
    order = S._sibling_order(cands)
    assert sorted(order) == list(range(len(cands)))
    bundles = [S._forward_key(S._group_key(cands[i])) for i in order]
    # each bundle contiguous, both recompute groups in it, candidate order within it
    seen = []
    for b in bundles:
        if not seen or seen[-1] != b:
            assert b not in seen
            seen.append(b)
    for b in seen:
        idx = [i for i in order if S._forward_key(S._group_key(cands[i])) == b]
        assert idx == sorted(idx)
        assert {cands[i].recompute for i in idx} == {"none", "full"}


def test_workers_get_recompute_siblings_together():
    cands = _cands()
    groups: dict = {}
    for i, par in enumerate(cands):
        groups.setdefault(S._group_key(par), []).append((i, par))
    S._HOMES.pop("job-siblings", None)
    parts = S._assign_groups("job-siblings", groups, 2)
    S._HOMES.pop("job-siblings", None)
    where = {}
    for w, mine in enumerate(parts):
        keys = [S._group_key(g[0][1]) for g in mine]
        for j, k in enumerate(keys):
            where[k] = w
        # siblings one after the other in the worker's list
        fks = [S._forward_key(k) for k in keys]
        for f in set(fks):
            pos = [j for j, x in enumerate(fks) if x == f]
            assert pos == list(range(pos[0], pos[0] + len(pos)))
    for k in groups:
        assert where[k] == where[S._forward_key(k)[:5] + ("none",) + S._forward_key(k)[5:]]
    assert sorted(where) == sorted(groups) and set(where.values()) == {0, 1}


def test_search_rows_equal_candidate_order_evaluation(monkeypatch):
    """The serial search in sibling order gives the rows of the candidate-order walk (sibling order off)."""
    space = dict(tp=(1, 2), pp=(1, 2), micro_batch=(1, 2), zero=(1,), sp=(False, True), recompute=("none", "full"),
                 interleave=(1,), ep=(1, 2))
    a = wattcast.search("mixtral_8x7b", "DGX-H100", 16, 64, 2048, framework="megatron", workers=1, **space)
    monkeypatch.setattr(S, "_sibling_order", lambda cands: range(len(cands)))
    workload._FORWARDS.clear()
    b = wattcast.search("mixtral_8x7b", "DGX-H100", 16, 64, 2048, framework="megatron", workers=1, **space)
    pd.testing.assert_frame_equal(a.ranked, b.ranked)
    pd.testing.assert_frame_equal(a.rejected, b.rejected)


def test_model_totals_of_etp_one_equal_etp_none():
    from wattcast.simulate.distributed import DistributedOptions, schedule_context

    opts = DistributedOptions(batch=64, seq=2048, dtype="bf16", attention="flash", framework="megatron")
    base = dict(gpus=16, tp=2, pp=1, dp=8, micro_batch=1, zero=1, sp=True, ep=2)
    a = schedule_context("mixtral_8x7b", "DGX-H100", new_config(**base, etp=1), opts).model_totals
    b = schedule_context("mixtral_8x7b", "DGX-H100", new_config(**base), opts).model_totals
    assert a == b and a["flops"] > 0
