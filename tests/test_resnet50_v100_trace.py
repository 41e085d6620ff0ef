"""benchmarks/resnet50_v100_trace.py's trace parsing on the real V100 ResNet-50 Kineto trace (HolisticTraceAnalysis
tests/data/ns_resolution_trace; skipped when $WATTCAST_DATA/traces/v100_rank0.json.gz is absent): the structural facts
the trace shows, not accuracy targets (the benchmark prints those)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import load_script

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "resnet50_v100_trace.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(BENCH, "resnet50_v100_trace")


@pytest.fixture(scope="module")
def kernels(bench):
    from wattcast.data.kernel_datasets import DataNotFoundError, resolve_data_root

    try:
        path = resolve_data_root() / bench.TRACE
    except DataNotFoundError:
        pytest.skip("no datasets folder")
    if not path.is_file():
        pytest.skip(f"no trace at {path}")
    return bench.classify(bench.load_trace(path))


def test_steady_steps_structure(bench, kernels):
    facts = bench.structure(kernels)
    assert sorted(facts) == sorted(bench.STEADY_STEPS)
    couts = bench.torchvision_convs().cout.tolist()
    assert len(couts) == 53
    for step, f in facts.items():
        assert f["bn_fw_kernels"] == 53 and f["bn_bw_kernels"] == 53, step
        assert f["conv_fwd_ops"] == 53, step
        assert f["bn_channels"] == couts, step  # torchvision's conv output channels, in its order
        assert f["maxpool_threads"] == 32 * 64 * 56 * 56, step  # batch 32
        assert 93.0 <= f["kernel_ms"] <= 95.0, step
        assert f["kernels"] == 870, step


def test_conv_backward_split_and_order(bench, kernels):
    for step, g in kernels.groupby("step"):
        # conv1's input needs no gradient: 52 dgrad calls, 53 wgrad calls, each tied to a forward conv
        assert g[g.term == "conv_dgrad"].layer.nunique() == 52
        assert g[g.term == "conv_wgrad"].layer.nunique() == 53
        assert 0 not in set(g[g.term == "conv_dgrad"].layer)
        # the forward pass precedes the backward: every forward conv launched before the first backward conv kernel
        assert g[g.term == "conv_fwd"].launch_ts.max() < g[g.term.isin(["conv_dgrad", "conv_wgrad"])].launch_ts.min()
        # the backward runs the layers in reverse: the last forward conv's gradient comes first
        first_bwd = g[g.term.isin(["conv_dgrad", "conv_wgrad"])].sort_values("launch_ts").layer.iloc[0]
        assert first_bwd == 52
        # cuDNN's kernels where their names say so: weight-gradient engines only in wgrad, dgrad engines only in dgrad
        assert not g[g.term == "conv_dgrad"].name.str.contains("wgrad|Wgrad|cudnn_train").any()
        assert g[g.name.str.contains("dgrad_engine")].term.eq("conv_dgrad").all()


def test_terms_cover_every_kernel(bench, kernels):
    m = bench.measured_terms(kernels)
    assert set(kernels.term) <= set(bench.TERMS)
    assert m.measured_ms.sum() == pytest.approx(kernels.dur_us.sum() / 1e3 / len(bench.STEADY_STEPS))
    assert m.loc["bn_fw", "kernels"] == 53 and m.loc["optimizer", "kernels"] > 0


def test_not_a_kineto_trace_is_a_clear_error(bench, tmp_path):
    p = tmp_path / "t.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1, "tid": 1}]}, f)
    with pytest.raises(ValueError, match="no kernel events"):
        bench.load_trace(p)
    with gzip.open(p, "wt") as f:
        json.dump({"traceEvents": []}, f)
    with pytest.raises(ValueError, match="not a Kineto trace"):
        bench.load_trace(p)


def test_1x1_convs_costed_as_gemms_against_the_trace(bench, kernels):
    """FP32 1x1 stride-1 convs (33 a step: 32 main, 1 downsample) are costed as the batched SGEMMs cuDNN runs them
    as (``volta_sgemm_*`` in the trace): their forward / dgrad / wgrad within 25% of the measured time, and the conv
    total within 25% (by the conv surrogate they were +53.7 / +57.9 / +13.6% and the total +37.5%)."""
    from wattcast.data.kernel_datasets import resolve_data_root

    terms, whole, lay, _, _ = bench.comparison(resolve_data_root() / bench.TRACE)
    conv = whole.loc["conv (fwd + dgrad + wgrad)"]
    assert 59.0 < conv.measured_ms < 61.5  # the measured facts: 60.12 ms of conv kernels a step
    one = lay[(lay.k == 1) & (lay.stride == 1)]
    assert len(one) == 33
    # cuDNN ran the 1x1 convs' forward as cuBLAS SGEMMs or its implicit-GEMM kernels, never Winograd
    assert one.conv_fwd_kernel.str.contains("sgemm|scudnn").all()
    assert not one.conv_fwd_kernel.str.contains("winograd").any()
    assert one.conv_dgrad_kernel.str.contains("sgemm").sum() >= 10
    assert 9.5 < one.conv_fwd_us.sum() / 1e3 < 10.2 and 12.9 < one.conv_wgrad_us.sum() / 1e3 < 13.8
    for ph in ("fwd", "dgrad", "wgrad"):
        pct = 100 * (one[f"pred_{ph}_us"].sum() / one[f"conv_{ph}_us"].sum() - 1)
        assert abs(pct) < 25, (ph, pct)
    assert abs(conv.signed_pct) < 25, conv.signed_pct
