"""Fused attention: the spec-sheet kernel model (models/attention.py) and its use in predictions."""

from __future__ import annotations

import numpy as np
import pytest

import wattcast
from wattcast.data.catalog import resolve_device
from wattcast.featurize.op_graph import GraphBuilder, GraphError
from wattcast.featurize.workload import StepOptions
from wattcast.models.attention import FLASH_KERNELS, flash_attention_ms

A100 = resolve_device("A100-SXM4-80GB")


def _one(kernel="fa2", phase="forward", s=16384, d=128, bh=32, kept=0.5, spec=A100, dtype="bf16"):
    io = 4 * bh * s * d * 2.0
    return float(flash_attention_ms(kernel=np.array([kernel]), phase=np.array([phase]), bh=[bh], s_q=[s], s_kv=[s],
                                    head_dim=[d], kept=[kept], io_bytes=[io],
                                    peak_tflops=[spec.peak_matrix_tflops(dtype)], fp32_tflops=spec.peak_fp32_tflops,
                                    memory_gbps=spec.memory_bandwidth_gbps, sms=spec.num_sms)[0])


def _share(ms, s=16384, d=128, bh=32, kept=0.5, phase="forward", spec=A100):
    flops = 4.0 * bh * s * s * d * kept * (2.5 if phase == "backward" else 1.0)
    return flops / (ms * 1e-3) / (spec.peak_matrix_tflops("bf16") * 1e12)


@pytest.mark.parametrize("kernel,phase,share", [("fa2", "forward", 0.73), ("fa2", "backward", 0.63),
                                                ("fa1", "forward", 0.40), ("fa1", "backward", 0.30)])
def test_long_head_dim_128_kernels_reach_the_papers_share_of_an_a100(kernel, phase, share):
    # non-causal, long sequence, full waves: the case the published figures describe
    ms = _one(kernel, phase, s=16384, d=128, bh=108, kept=1.0)
    assert _share(ms, bh=108, kept=1.0, phase=phase) == pytest.approx(share, rel=0.01)


def test_head_dim_64_does_more_softmax_work_per_flop_than_128():
    s64 = _share(_one(d=64, bh=64, kept=1.0), d=64, bh=64, kept=1.0)
    s128 = _share(_one(d=128, bh=64, kept=1.0), d=128, bh=64, kept=1.0)
    assert 0.5 < s64 < s128


def test_fused_attention_does_not_depend_on_memory_bandwidth():
    # no S x S tensor in HBM: a 40 GB A100 (1.6 TB/s) runs it as fast as an 80 GB (2.0 TB/s)
    a40 = resolve_device("A100-SXM4-40GB")
    assert _one(spec=a40) == pytest.approx(_one(spec=A100), rel=0.01)


def test_causal_short_sequences_pay_for_their_diagonal_blocks():
    full, causal = _one(s=256, kept=1.0), _one(s=256, kept=0.5)
    # 2 key blocks: the causal kernel computes 3 of 4 blocks, not 2
    assert causal / full == pytest.approx(0.75, rel=0.02)
    assert _one(s=32768, kept=0.5) / _one(s=32768, kept=1.0) == pytest.approx(0.5, rel=0.01)


def test_small_grids_leave_sms_idle():
    # one (batch, head) with two query blocks: 2 of 108 SMs busy
    per_flop_small = _one(s=256, bh=1, kept=1.0) / 1
    per_flop_big = _one(s=256, bh=108, kept=1.0) / 108
    assert per_flop_small > 20 * per_flop_big


def test_older_kernel_class_is_slower_and_unknown_class_is_an_error():
    assert _one("fa1") > 1.8 * _one("fa2")
    with pytest.raises(ValueError, match="unknown flash attention kernel"):
        _one("fa9")
    with pytest.raises(GraphError, match="unknown flash attention kernel"):
        GraphBuilder("bf16", flash_kernel="fa9")
    assert set(FLASH_KERNELS) == {"fa1", "fa2", "fa3"}


def test_flash1_option_builds_the_same_node_with_the_older_kernel():
    o = StepOptions(attention="flash1").validated()
    assert o.attention == "flash" and o.flash_kernel == "fa1"
    assert o.validated().flash_kernel == "fa1"  # validating twice keeps it
    assert StepOptions(attention="flash").validated().flash_kernel == "fa2"
    with pytest.raises(GraphError, match="eager, flash, flash1 or flash3"):
        StepOptions(attention="flash4").validated()


def test_predictions_use_the_kernel_class_and_keep_linears_unchanged():
    kw = dict(batch=1, seq=8192, dtype="bf16")
    p2 = wattcast.predict("llama3_8b", "A100-SXM4-80GB", attention="flash", **kw)
    p1 = wattcast.predict("llama3_8b", "A100-SXM4-80GB", attention="flash1", **kw)
    n1, n2 = p1.nodes, p2.nodes
    assert set(n1.loc[n1.op_class == "flash_attention", "kernel"]) == {"fa1"}
    assert set(n2.loc[n2.op_class == "flash_attention", "kernel"]) == {"fa2"}
    a1 = n1.loc[n1.op_class == "flash_attention", "time_ms"].sum()
    a2 = n2.loc[n2.op_class == "flash_attention", "time_ms"].sum()
    assert a1 > 1.8 * a2
    lin = lambda n: n.loc[n.op_class == "linear", "time_ms"].sum()  # noqa: E731
    assert lin(n1) == pytest.approx(lin(n2))
    assert p1.meta.get("flash_kernel") == "fa1" and p2.meta.get("flash_kernel") == "fa2"


# --- the tensor-core part transfers across devices by their achievable-matmul ceiling (stop 40) ---

def _costed_attention(device: str, *, d=128, s=16384, b=4, h=27, causal=False, dtype="bf16",
                      kernel="fa2") -> dict[str, float]:
    """{phase: achieved TFLOP/s} of one fused attention kernel (forward and backward) as a prediction costs it."""
    from wattcast.featurize.training_graph import training_graph
    from wattcast.simulate.single_device import cost_nodes

    g = GraphBuilder(dtype, train=True, flash_kernel=kernel)
    q, k, v = (g.input((b, h, s, d)) for _ in range(3))
    g.flash_attention(q, k, v, causal=causal)
    costed = cost_nodes(training_graph(g.build(), optimizer="none"), resolve_device(device))
    fa = costed[costed["op_class"] == "flash_attention"]
    return {ph: float(r.flops / (r.time_ms * 1e-3) / 1e12) for ph, r in zip(fa["phase"], fa.itertuples())}


def _mamf_ceilings() -> dict[str, float]:
    """{catalog device: MAMF's best achievable bf16 matmul over the catalog's dense bf16 peak} for the MAMF table's
    devices (ml-engineering's table, in the tensorcore datasets)."""
    import pandas as pd

    from wattcast.data.kernel_datasets import resolve_data_root

    t = pd.read_csv(resolve_data_root() / "tensorcore" / "mamf_max_achievable_matmul_tflops.csv")
    best = {r.accelerator: r.mamf_tflops for r in t.itertuples() if r.dtype == "bf16"}
    names = {"A100-SXM4-80GB": "NVIDIA A100 SXM", "B200": "NVIDIA B200 SXM", "GB200": "NVIDIA GB200 SXM",
             "MI300X": "AMD MI300X", "MI355X": "AMD MI355X"}
    return {dev: best[n] / resolve_device(dev).peak_matrix_tflops("bf16") for dev, n in names.items()}


def _tensor_core_share(device: str, phase: str, kernel: str = "fa3") -> float:
    """The share of the dense bf16 peak the kernel's matrix part runs at, read off the predictions: head dims 64 and
    128 on the same grid (whole waves: batch x heads a multiple of the SMs over 128 query blocks) differ only in
    matrix work per score element, so t(128) - t(64) is the matrix time of head dim 64."""
    import math

    spec = resolve_device(device)
    s, h = 16384, spec.num_sms // math.gcd(spec.num_sms, 128)
    t = {d: 4.0 * h * s * s * d * (2.5 if phase == "backward" else 1.0)
         / (_costed_attention(device, d=d, s=s, b=1, h=h, kernel=kernel)[phase] * 1e12) for d in (64, 128)}
    mma_flops = 4.0 * h * s * s * 64 * (2.5 if phase == "backward" else 1.0)
    return mma_flops / (t[128] - t[64]) / (spec.peak_matrix_tflops("bf16") * 1e12)


@pytest.mark.parametrize("device", ["B200", "GB200", "MI300X", "MI355X"])
def test_fused_attention_never_outruns_the_devices_own_best_matmul(device):
    # the kernel's inner loops are GEMM tiles plus softmax work: the whole kernel reaches no higher share of the dense
    # peak than the device's best achievable GEMM (MAMF), and its matrix part no higher share of that ceiling than on
    # the A100 its figures were measured on (97% forward, 80% backward). Until stop 40 every device took the A100's
    # share of its own peak: MI300X attention ran at 74% / 63% forward / backward where its best GEMM reaches 51%.
    # The class native on every GPU ("fa3", the generation's own kernel; FA2 is off-native on B200 since stop 58)
    ceil = _mamf_ceilings()
    got = _costed_attention(device, kernel="fa3")
    peak = resolve_device(device).peak_matrix_tflops("bf16")
    for ph in ("forward", "backward"):
        assert got[ph] / peak < ceil[device]
        ref = _tensor_core_share("A100-SXM4-80GB", ph) / ceil["A100-SXM4-80GB"]
        assert _tensor_core_share(device, ph) / ceil[device] == pytest.approx(ref, rel=0.01)


@pytest.mark.parametrize("device", ["A100-SXM4-80GB", "A100-SXM4-40GB"])
def test_a100_predictions_keep_the_papers_shares(device):
    # the calibration device and its 40 GB twin (the same chip; MPT's runs) are unscaled: the prediction path still
    # reaches FlashAttention-2's 73% / 63% of the peak (non-causal, 4 x 27 heads = one full wave of 108 SMs). A 40 GB
    # A100 taking the GEMM family's NVIDIA median ceiling (it is neither in MAMF nor a training device) would be 7% slow
    got = _costed_attention(device)
    peak = resolve_device(device).peak_matrix_tflops("bf16")
    assert got["forward"] / peak == pytest.approx(0.73, rel=0.01)
    assert got["backward"] / peak == pytest.approx(0.63, rel=0.01)


def test_softmax_work_runs_at_single_issue_fp32_on_cdna3():
    # MI300X's datasheet FP32 peak (163.4 TFLOP/s) counts packed FP32, twice its 304 CUs x 64 lanes x 2 x 2.1 GHz =
    # 81.7; softmax's max and exp have no packed form. Two head dims on the same grid differ only in matrix work per
    # score element, so 2 x t(64) - t(128) is the softmax time alone: the FP32 rate it implies must be 81.7, not 163.4
    from wattcast.models.attention import SOFTMAX_FP32_OPS

    s, b, h = 16384, 4, 76  # 4 x 76 x 128 query blocks = 128 full waves of 304 CUs
    t = {d: 4.0 * b * h * s * s * d / (_costed_attention("MI300X", d=d, s=s, b=b, h=h)["forward"] * 1e12)
         for d in (64, 128)}
    softmax_s = 2.0 * t[64] - t[128]
    implied_tflops = b * h * s * s * SOFTMAX_FP32_OPS["forward"] / softmax_s / 1e12
    assert implied_tflops == pytest.approx(304 * 64 * 2 * 2.1e9 / 1e12, rel=0.01)


@pytest.mark.parametrize("kernel", ["flash", "flash1"])
def test_a_recomputed_forward_costs_the_forward_kernel(kernel):
    """Full recomputation re-runs each layer's forward in the backward (torch.utils.checkpoint calls the module's
    forward again): its fused attention is the forward kernel with the forward's FLOPs, so it takes the forward's
    time. Until this stop it was costed as a backward kernel (its forward FLOPs read as 2.5x fewer scores at the
    backward's efficiency): 1.33x the forward on an A100 for the FlashAttention-1 class (MPT's long-sequence rows)."""
    p = wattcast.predict("llama3_8b", "A100-SXM4-80GB", batch=1, seq=8192, dtype="bf16", attention=kernel,
                         recompute="full")
    n = p.nodes
    fa = n[n.op_class == "flash_attention"]
    fwd = fa[(fa.phase == "forward") & ~fa.recompute.astype(bool)]
    rc = fa[fa.recompute.astype(bool)]
    assert len(rc) == len(fwd) > 0
    assert rc["flops"].sum() == pytest.approx(fwd["flops"].sum())
    assert rc["time_ms"].sum() == pytest.approx(fwd["time_ms"].sum(), rel=1e-9)
    # the backward kernel (2.5x the forward's FLOPs) stays slower than the forward
    bwd = fa[(fa.phase == "backward") & ~fa.recompute.astype(bool)]
    assert bwd["time_ms"].sum() > 2.0 * fwd["time_ms"].sum()
