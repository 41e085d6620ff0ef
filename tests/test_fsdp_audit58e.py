"""Audit 58e (FSDP2 / torchtitan-style training): each test fails on the code before stop 58's fixes.

1. ``--compile`` + ``--recompute full`` kept each block's input twice: the block input was the whole output of the node
   before the block, under compile a fused kernel writing two residual-sized tensors (simulate/memory.py
   ``block_input_bytes``; featurize/fusion.py now re-maps each fused node's input tensors).
2. ``search`` had no ``compile`` (Python, CLI, sweep spec).
3. FP8 under PyTorch FSDP (hf, ZeRO-2/3): no held FP8 weight copy (Transformer Engine 2.20.2 under FSDP2 neither caches
   nor saves it), every micro-batch's forward and backward quantize the gathered weight.
4. hf ZeRO-3's backward re-gathered FSDP's root unit, which the root keeps unsharded through the backward.
5. ``predict_cluster(trace="file.json")`` silently wrote nothing.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattcast
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.memory import block_input_bytes

# Llama 3 8B (meta-llama/Meta-Llama-3-8B config.json): hidden 4,096, 32 layers
HIDDEN, LAYERS = 4096, 32


# 1. compile + full recomputation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("compile_", [False, True])
def test_full_recompute_keeps_one_residual_per_block(compile_):
    """A checkpointed block keeps its input alone (torch.utils.checkpoint saves the function's arguments): the residual
    stream, s x b x h x 2 B in bf16 (Korthikanti et al. 2022, 2sbh a layer under full recomputation), compiled or
    not. Before stop 58 the compiled graph gave 2 x that for layers 1-31."""
    seq, batch = 1024, 1
    g = step_graph("llama3_8b", StepOptions(batch=batch, seq=seq, mode="train", dtype="bf16", attention="flash",
                                             compile=compile_, recompute="full"))
    got = np.array(block_input_bytes(g, LAYERS))
    assert len(got) == LAYERS
    np.testing.assert_allclose(got, seq * batch * HIDDEN * 2, rtol=0)


def test_compiled_full_recompute_memory_equals_eager():
    kw = dict(batch=1, seq=2048, attention="flash", recompute="full")
    eager = wattcast.predict("llama3_8b", "H100-SXM5-80GB", **kw)
    compiled = wattcast.predict("llama3_8b", "H100-SXM5-80GB", compile=True, **kw)
    assert compiled.memory.activations_gb == pytest.approx(eager.memory.activations_gb, rel=1e-12)


def test_compiled_full_recompute_cluster_memory_equals_eager():
    kw = dict(gpus=8, batch=8, seq=2048, tp=2, sp=True, zero=3, framework="hf", attention="flash", recompute="full",
              micro_batch=1)
    eager = wattcast.predict_cluster("llama3_8b", "DGX-H100", **kw)
    compiled = wattcast.predict_cluster("llama3_8b", "DGX-H100", compile=True, **kw)
    assert compiled.memory["activations_gb"] == pytest.approx(eager.memory["activations_gb"], rel=1e-12)


def test_fused_graph_input_tensors_align_with_its_nodes():
    """featurize/fusion.py keeps one input-tensor list per fused node (before stop 58: the unfused graph's lists)."""
    g = step_graph("llama3_8b", StepOptions(batch=1, seq=256, mode="train", attention="flash", compile=True))
    assert len(g.saved["input_tids"]) == len(g.saved["by_node"])
    tnode = g.saved["tensor_node"]
    for i, tids in enumerate(g.saved["input_tids"]):
        assert all(int(tnode[t]) != i for t in tids)  # a node reads no tensor it makes itself


# 2. search --compile ---------------------------------------------------------------------------------------------


SEARCH_KW = dict(gpus=8, batch=8, seq=2048, framework="hf", attention="flash", zero=[3], tp=[1], pp=[1],
                 micro_batch=[1], recompute=["full"], max_configs=4)


def test_search_costs_compiled_steps():
    eager = wattcast.search("llama3_8b", "DGX-H100", **SEARCH_KW)
    compiled = wattcast.search("llama3_8b", "DGX-H100", compile=True, **SEARCH_KW)
    assert compiled.settings["compile"] is True and eager.settings["compile"] is False
    row = compiled.ranked.iloc[0]
    assert bool(row["compile"]) and not bool(eager.ranked.iloc[0]["compile"])
    assert row["step_time_ms"] < eager.ranked.iloc[0]["step_time_ms"]
    # the row replays as predict_cluster with the recorded settings
    r = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=8, seq=2048, framework="hf",
                                 attention="flash", strategy=row["strategy"], compile=True)
    assert r.step_time_ms == pytest.approx(row["step_time_ms"], rel=1e-9)


def test_search_compile_bad_value_named():
    with pytest.raises(ValueError, match="compile"):
        wattcast.search("llama3_8b", "DGX-H100", compile="yes", **SEARCH_KW)


def test_search_cli_has_compile():
    from typer.testing import CliRunner

    from wattcast.cli import app

    out = CliRunner().invoke(app, ["search", "--help"], terminal_width=200)
    assert "--compile" in out.output


def test_sweep_spec_compile():
    from wattcast.sweep import SweepSpecError, load_spec

    base = dict(models=["llama3_8b"], clusters=["DGX-H100"], gpus=[8], batch=8, seq=2048)
    eager, compiled = load_spec(dict(base)), load_spec(dict(base, compile=True))
    assert compiled.compile and not eager.compile
    assert compiled.tasks()[0]["compile"] is True and "compile" not in eager.tasks()[0]
    assert compiled.tasks()[0]["task_id"] != eager.tasks()[0]["task_id"]
    with pytest.raises(SweepSpecError, match="compile"):
        load_spec(dict(base, compile="yes"))


# 3. FP8 weight copies under FSDP ---------------------------------------------------------------------------------


FP8_KW = dict(gpus=8, batch=8, seq=2048, micro_batch=1, framework="hf", attention="flash", recompute="full")


@pytest.mark.parametrize("zero", [2, 3])
def test_fsdp_fp8_holds_no_weight_copy(zero):
    bf16 = wattcast.predict_cluster("llama3_8b", "DGX-H100", zero=zero, **FP8_KW)
    fp8 = wattcast.predict_cluster("llama3_8b", "DGX-H100", zero=zero, dtype="fp8", **FP8_KW)
    assert fp8.memory["weights_gb"] == pytest.approx(bf16.memory["weights_gb"], rel=1e-12)


def test_megatron_fp8_keeps_its_cached_copy():
    """Outside FSDP Transformer Engine's cached FP8 weight + transpose stays (2 B per FP8 parameter)."""
    kw = dict(gpus=8, batch=8, seq=2048, micro_batch=1, framework="megatron", attention="flash", zero=1)
    bf16 = wattcast.predict_cluster("llama3_8b", "DGX-H100", **kw)
    fp8 = wattcast.predict_cluster("llama3_8b", "DGX-H100", dtype="fp8", **kw)
    assert fp8.memory["weights_gb"] - bf16.memory["weights_gb"] > 10.0  # ~2 B x 7e9 FP8 parameters, unsharded


def test_fsdp_fp8_casts_every_micro_batch():
    from wattcast.simulate.distributed import fsdp_fp8_cast_share

    meta = {"fp8_scaling": "delayed", "fp8_transpose": True}
    assert fsdp_fp8_cast_share(meta, 1) == pytest.approx(1.75)  # (2 + 1) forward, (2 + 2) backward over (2 + 2)
    assert fsdp_fp8_cast_share(meta, 4) == pytest.approx(7.0)
    one = wattcast.predict_cluster("llama3_8b", "DGX-H100", zero=3, dtype="fp8", **FP8_KW)
    two = wattcast.predict_cluster("llama3_8b", "DGX-H100", zero=3, dtype="fp8", **dict(FP8_KW, batch=16))
    # the step's casts scale with its micro-batches (before stop 58: once a step whatever their number)
    assert two.optimizer_ms > one.optimizer_ms + 5.0


# 4. FSDP's root unit is not re-gathered in the backward ----------------------------------------------------------


def test_backward_regathers_the_blocks_alone():
    kw = dict(gpus=8, batch=8, seq=2048, micro_batch=1, framework="hf", attention="flash", recompute="full")
    z3 = wattcast.predict_cluster("llama3_8b", "DGX-H100", zero=3, **kw).comm
    z2 = wattcast.predict_cluster("llama3_8b", "DGX-H100", zero=2, **kw).comm
    fwd_gather = z2["dp_zero2_gather_ms_per_micro"]  # the same units' forward gathers
    bwd_gather = z3["dp_zero3_ms_per_micro"] - fwd_gather - z2["dp_zero2_ms_per_micro"]
    # the blocks' share of the parameters: 32 x 218.1M of 8.03B (the root: embeddings and head, 2 x 525M)
    blocks = LAYERS * 218_112_000 / 8_030_261_248
    assert bwd_gather / fwd_gather == pytest.approx(blocks, abs=0.03)  # before stop 58: 1.0


# 5. predict_cluster(trace=PATH) ---------------------------------------------------------------------------------


CLUSTER_KW = dict(gpus=8, batch=8, seq=1024, micro_batch=1, zero=3, framework="hf", attention="flash")


def test_predict_cluster_trace_path_writes_it(tmp_path):
    path = tmp_path / "api_trace.json"
    r = wattcast.predict_cluster("llama3_8b", "DGX-H100", trace=str(path), **CLUSTER_KW)
    doc = json.loads(path.read_text())
    assert doc["traceEvents"] and doc["otherData"]["step_time_ms"] == pytest.approx(r.step_time_ms)
    assert r.events  # the timeline is kept too, as trace=True does
    path2 = tmp_path / "p.json"
    wattcast.predict_cluster("llama3_8b", "DGX-H100", trace=path2, **CLUSTER_KW)  # os.PathLike
    assert path2.exists()


@pytest.mark.parametrize("bad", [1, ["t.json"], 0.5])
def test_predict_cluster_trace_bad_value_named(bad):
    with pytest.raises(TypeError, match="trace"):
        wattcast.predict_cluster("llama3_8b", "DGX-H100", trace=bad, **CLUSTER_KW)
