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
    assert set(FLASH_KERNELS) == {"fa1", "fa2"}


def test_flash1_option_builds_the_same_node_with_the_older_kernel():
    o = StepOptions(attention="flash1").validated()
    assert o.attention == "flash" and o.flash_kernel == "fa1"
    assert o.validated().flash_kernel == "fa1"  # validating twice keeps it
    assert StepOptions(attention="flash").validated().flash_kernel == "fa2"
    with pytest.raises(GraphError, match="eager, flash or flash1"):
        StepOptions(attention="flash3").validated()


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
