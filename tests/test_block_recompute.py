"""Megatron's block recomputation (``--recompute-granularity full --recompute-method block --recompute-num-layers N``):
only the first N transformer layers of each model chunk are recomputed, the others keep their activations."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattcast
from conftest import run_cli
from wattcast.planning.search import candidate_configs
from wattcast.simulate.distributed import recomputed_layers
from wattcast.simulate.parallel import ParallelConfigError
from wattcast.simulate.strategy import format_strategy, parse_strategy

KW = dict(gpus=8, batch=16, seq=2048, tp=2, pp=4, micro_batch=1, sp=True, zero=1, framework="megatron", dtype="bf16",
          attention="flash")


def _step(recompute="full", n=None, **kw):
    return wattcast.predict_cluster("llama2_7b", "DGX-A100", recompute=recompute, recompute_num_layers=n, **dict(KW, **kw))


def test_recomputed_layers_are_the_first_of_each_chunk():
    ids = np.arange(-1, 13)  # embedding (-1), 12 blocks, head (12)
    counts = [3, 4, 4, 1]
    chunk = np.array([0] + [0] * 3 + [1] * 4 + [2] * 4 + [3] + [3])
    rc = recomputed_layers(ids, chunk, counts, 12, 2)
    assert ids[rc].tolist() == [0, 1, 3, 4, 7, 8, 11]  # two per chunk, the one-layer chunk's only layer
    assert not rc[0] and not rc[-1]  # embedding and head never


def test_block_recomputation_sits_between_none_and_full_and_is_linear_in_layers():
    none, full = _step("none"), _step("full")
    parts = {n: _step("full", n) for n in (2, 4, 6, 8)}  # 32 layers on 4 stages: 8 per stage
    assert parts[8].step_time_ms == pytest.approx(full.step_time_ms, rel=1e-9)  # every layer of every stage
    assert parts[8].memory_gb == pytest.approx(full.memory_gb, rel=1e-9)
    # whole-model summaries blend by the share of blocks recomputed: all of them gives full's own
    by_class = lambda p: {r["op_class"]: (r["count"], r["time_ms"]) for r in p.per_op}  # noqa: E731
    assert by_class(parts[8]).keys() == by_class(full).keys()
    for k, (n, t) in by_class(full).items():
        assert by_class(parts[8])[k][0] == n and by_class(parts[8])[k][1] == pytest.approx(t, rel=1e-9)
    assert parts[8].forward_ms == pytest.approx(full.forward_ms, rel=1e-9)
    assert none.backward_ms < parts[2].backward_ms < full.backward_ms  # the recomputed forwards run in the backward
    t = [none.step_time_ms] + [parts[n].step_time_ms for n in (2, 4, 6, 8)]
    m = [none.memory["activations_gb"]] + [parts[n].memory["activations_gb"] for n in (2, 4, 6, 8)]
    assert all(a < b for a, b in zip(t, t[1:]))  # more layers recomputed: slower ...
    assert all(a > b for a, b in zip(m, m[1:]))  # ... and fewer activations kept
    # each recomputed layer keeps its input instead of its activations: two more layers save the same each time
    assert m[1] - m[2] == pytest.approx(m[2] - m[3], rel=1e-6)
    assert m[2] - m[3] == pytest.approx(m[3] - m[4], rel=1e-6)
    # hardware FLOPs count the recomputed forwards of those layers only: linear in N, all of them at N = 8
    hw = {n: p.hfu * p.step_time_ms for n, p in parts.items()}
    assert hw[4] - hw[2] == pytest.approx(hw[6] - hw[4], rel=1e-6)
    assert hw[8] == pytest.approx(full.hfu * full.step_time_ms, rel=1e-9)
    assert none.hfu * none.step_time_ms < hw[2]
    assert parts[2].to_dict()["parallel"]["recompute_num_layers"] == 2


def test_block_recomputation_rules():
    with pytest.raises(ParallelConfigError, match="needs --recompute full"):
        _step("selective", 2)
    with pytest.raises(ParallelConfigError, match="whole number of layers >= 1"):
        _step("full", 0)
    r = run_cli("predict", "--model", "llama2_7b", "--device", "A100-SXM4-80GB", "--recompute", "full",
                "--recompute-num-layers", "2")
    assert r.returncode != 0 and "need --cluster" in r.stderr


def test_strategy_string_round_trips_and_predicts_the_same():
    st = parse_strategy("tp2-pp4-dp1-mb1-ga16-zero1-sp-rcfull3")
    assert st.recompute == "full" and st.recompute_num_layers == 3
    p = _step("full", 3)
    s = format_strategy(p.parallel, 16, "megatron")
    assert "-rcfull3-" in s and parse_strategy(s).recompute_num_layers == 3
    again = wattcast.predict_cluster("llama2_7b", "DGX-A100", strategy=s, seq=2048, framework="megatron", dtype="bf16",
                                     attention="flash")
    assert again.step_time_ms == pytest.approx(p.step_time_ms, rel=1e-12)
    with pytest.raises(ValueError, match="recomputed layers must be at least 1"):
        parse_strategy("tp1-pp1-dp1-mb1-rcfull0")


def test_search_adds_block_counts_to_full_recomputation_only():
    cands = candidate_configs("llama2_7b", "DGX-A100", 8, 16, 2048, tp=(2,), pp=(4,), micro_batch=(1,), zero=(0,),
                              sp=(True,), recompute=("none",), interleave=(1, 2), recompute_num_layers=(2, 4))
    got = sorted((c.recompute, c.interleave, c.recompute_num_layers or 0) for c in cands)
    # full added; 4 layers per chunk under v2 (32 / 8) makes rcfull4 the same as rcfull there
    assert got == [("full", 1, 0), ("full", 1, 2), ("full", 1, 4), ("full", 2, 0), ("full", 2, 2),
                   ("none", 1, 0), ("none", 2, 0)]


def test_cli_search_and_predict_flags():
    r = run_cli("search", "--model", "llama2_7b", "--cluster", "DGX-A100", "--gpus", "8", "--batch", "16", "--seq", "2048",
                "--framework", "megatron", "--recompute-num-layers", "2", "--json", "--top", "200")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["ranked"]
    assert any("-rcfull2-" in row["strategy"] for row in rows)
    r = run_cli("predict", "--model", "llama2_7b", "--cluster", "DGX-A100", "--gpus", "8", "--batch", "16", "--seq", "2048",
                "--tp", "2", "--pp", "4", "--sp", "--zero", "1", "--framework", "megatron", "--recompute", "full",
                "--recompute-num-layers", "2", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["parallel"]["recompute_num_layers"] == 2 and "rc-full2" in d["parallel"]["name"]


def test_uniform_method_recomputes_every_layer_and_keeps_each_groups_input():
    """Megatron's --recompute-method uniform: the time of full recomputation; per chunk the input of every group of N
    layers is kept and the backward re-makes N layers at once (N = 1 is plain full recomputation)."""
    full = _step("full")
    u = {n: _step("full", n, recompute_method="uniform") for n in (1, 2, 4)}
    assert u[1].memory_gb == pytest.approx(full.memory_gb, rel=1e-12)
    for p in u.values():
        assert p.step_time_ms == pytest.approx(full.step_time_ms, rel=1e-12)
    # a group's transient grows with N faster than the kept inputs shrink (4 micro-batches in flight, 8 layers a stage)
    assert u[1].memory["activations_gb"] < u[2].memory["activations_gb"] < u[4].memory["activations_gb"]
    s = format_strategy(u[4].parallel, 16, "megatron")
    assert "-rcfullu4-" in s and parse_strategy(s).recompute_method == "uniform"
    again = wattcast.predict_cluster("llama2_7b", "DGX-A100", strategy=s, seq=2048, framework="megatron", dtype="bf16",
                                     attention="flash")
    assert again.memory_gb == pytest.approx(u[4].memory_gb, rel=1e-12)
    with pytest.raises(ParallelConfigError, match="give that too"):
        _step("full", None, recompute_method="uniform")
    with pytest.raises(ParallelConfigError, match="block or uniform"):
        _step("full", 2, recompute_method="random")
