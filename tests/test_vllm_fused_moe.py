"""MoE layers of a vLLM serving step run vLLM's fused MoE (``featurize.hf_models._moe_vllm_fused``), not transformers'
per-expert loop: ``fused_topk`` (one top-k softmax kernel, the renormalisation), ``moe_align_block_size``, ONE grouped
GEMM launch for w13 (gate and up) and one for w2 over every routed (token, expert) pair, each active expert's weights
read once, ``silu_and_mul`` between them, ``moe_sum`` after, and the TP all-reduce. The tensor-parallel group
(``predict_cluster(kv_context=...)``, "as vLLM runs it") and ``predict(serving="vllm")`` build it; the bare KV-cached
``predict(kv_context=...)`` keeps Hugging Face eager's loop. Until this change every path looped over the experts:
Qwen3-235B-A22B decode at TP8 batch 16 on HGX-H200 was 321 ms for 42 GB read per GPU (37x its byte roofline) and
barely moved from TP4 (322 ms)."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.data.catalog import resolve_device
from wattcast.featurize.hf_config import load_hf_config
from wattcast.featurize.hf_models import active_local_experts
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph

CLUSTER = "HGX-H200"
DECODE = dict(kv_context=2047, seq=1, batch=16)
FUSED = ["moe.gate", "moe.topk_softmax", "moe.normalise", "moe.align_block_size", "moe.experts.w13",
         "moe.silu_and_mul", "moe.experts.w2", "moe.sum"]


def _tp(model: str, tp: int, **kw):
    return wattcast.predict_cluster(model, CLUSTER, gpus=tp, tp=tp, **{**DECODE, **kw})


def _moe_kernels(nodes, layer: int = 1):
    n = nodes[(nodes["layer"] == layer) & (nodes["op_class"] != "collective")]
    return n[n["name"].str.startswith("moe.") | n["scope"].astype(str).str.contains(r"experts\.")]


def test_tp_group_runs_two_grouped_gemm_launches_per_moe_layer():
    res = _tp("qwen3_30b_a3b", 8)
    moe = _moe_kernels(res.nodes)
    assert moe["name"].tolist() == FUSED  # was 419 nodes a layer: 82 experts x (index, gate, up, silu, mul, down)
    gemms = moe[moe["op_class"] == "linear"]
    assert len(gemms) == 3  # the replicated router and the two fused kernels
    cfg = load_hf_config("qwen3_30b_a3b")
    h, ffn, tp = cfg.hidden, cfg.count("moe_intermediate_size"), 8
    active = active_local_experts(128, 8, 16, 1)
    assert active == 82  # 128 (1 - (1 - 8/128)^16) = 82.2
    w13, w2 = (gemms[gemms["name"] == f"moe.experts.{w}"].iloc[0] for w in ("w13", "w2"))
    # M: the groups' mean rows, 16 x 8 / 82 (46 experts take 2 rows, 36 take 1: every routed pair once)
    assert (w13.B, w13.M, w13.N, w13.K) == (active, pytest.approx(16 * 8 / active), h, 2 * ffn // tp)
    assert (w2.B, w2.M, w2.N, w2.K) == (active, pytest.approx(16 * 8 / active), ffn // tp, h)
    # each active expert's rank-local weights read once (bf16), plus the 128 routed rows
    rows, k13, k2 = 16 * 8, 2 * ffn // tp, ffn // tp
    assert w13.bytes == (active * h * k13 + rows * h + rows * k13) * 2
    assert w2.bytes == (active * k2 * h + rows * k2 + rows * h) * 2
    # one all-reduce of the layer's (tokens, hidden) output after moe_sum
    coll = res.nodes[(res.nodes["layer"] == 1) & (res.nodes["name"] == "moe.exit.all_reduce")]
    assert len(coll) == 1 and coll["bytes"].iloc[0] == 16 * h * 2
    assert res.meta["moe_kernels"] == "vllm_fused"


def test_decode_step_is_near_its_byte_roofline_and_speeds_up_with_tp():
    bw = resolve_device("H200-SXM-141GB").memory_bandwidth_gbps * 1e9
    # the GPU's step (host_us=0): at eager PyTorch's host cost (40 us a launch in a queue, since stop 56) a decode step
    # without --serving is host-bound, its kernels hidden behind the launches
    one = _tp("qwen3_30b_a3b", 1, host_us=0)
    n = one.nodes
    expert = n["name"].str.startswith("moe.") | n["scope"].astype(str).str.contains(r"experts\.")
    moe = n[expert & (n["op_class"] != "collective")]  # every layer's MoE kernels
    roof_ms = moe["bytes"].sum() / bw * 1e3
    # the MoE layers' kernels (launch floors included) within 2.5x of the bytes they move (was 15x: 4,000 kernels a step)
    assert moe["time_ms"].sum() < 2.5 * roof_ms
    tp4, tp8 = _tp("qwen3_235b_a22b", 4, host_us=0), _tp("qwen3_235b_a22b", 8, host_us=0)
    n = tp8.nodes
    roof8_ms = n[n["op_class"] != "collective"]["bytes"].sum() / bw * 1e3
    assert tp8.step_time_ms < 8 * roof8_ms  # was 321.3 ms for 8.7 ms of bytes (37x); the rest: eager HF norms/rope
    assert tp8.step_time_ms < 0.85 * tp4.step_time_ms  # was 322.4 -> 321.3 ms


def test_served_single_gpu_step_is_fused_and_bare_hf_eager_keeps_the_loop():
    dev, kw = "H200-SXM-141GB", dict(mode="inference", **DECODE)
    eager = wattcast.predict("qwen3_30b_a3b", dev, **kw)
    served = wattcast.predict("qwen3_30b_a3b", dev, serving="vllm", prompt_tokens=128, output_tokens=100, **kw)
    assert _moe_kernels(served.nodes)["name"].tolist() == FUSED
    loop = _moe_kernels(eager.nodes)
    assert (loop["name"] == "experts.0.gate_proj").sum() == 1 and len(loop) > 400  # transformers' loop, per expert
    assert "moe_kernels" not in eager.meta
    # the same weights resident and the same parameters either way (idle experts held, not read)
    assert served.memory.weights_gb == eager.memory.weights_gb and served.meta["param_count"] == eager.meta["param_count"]
    assert served.meta["serving"]["gpu_step_ms"] < 0.5 * eager.step_time_ms


def test_mixtral_tp_group_is_fused_and_training_cannot_ask_for_it():
    res = _tp("mixtral_8x7b", 2)
    gemms = _moe_kernels(res.nodes)
    w13 = gemms[gemms["name"] == "moe.experts.w13"].iloc[0]
    assert w13.B == 8 and w13.M == 4  # batch 16 x top-2 over all 8 experts
    assert "moe.normalise" in gemms["name"].tolist()  # Mixtral renormalises its top-2
    with pytest.raises(GraphError, match="fused_moe"):
        step_graph("qwen3_30b_a3b", StepOptions(batch=1, seq=8, mode="train", dtype="bf16", blocks=1, fused_moe=True))
    with pytest.raises(GraphError, match="fused_moe"):
        step_graph("qwen3_30b_a3b", StepOptions(batch=1, seq=8, mode="inference", dtype="bf16", blocks=1,
                                                framework="megatron", fused_moe=True))
