"""What the ``ood`` flag and the 90% band mean beyond leave-one-generation-out coverage (issue 14, audit 58d).

- A kernel whose GPU lies beyond the covered range (training GPUs' range widened by the farthest any fold
  extrapolated) has its band widened by its distance beyond it (models/coverage.py), not by a flat factor: a
  descriptor change that moves no prediction moves the band by no more than it moves the distance (at 1000 W a B200 x
  1.5 spec's fp8 GEMMs were OOD on watts per TFLOP/s 0.148 against the covered 0.149, and the band's top fell 35% at
  1010 W with an identical prediction).
- A step's OOD kernels carry the band ``kernels`` shows for them (simulate/step_band.py), so a step far beyond every
  fold gets a wider band than one at the coverage edge.
- The cluster JSON, search rows and Chrome traces carry the keys a single prediction has.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import wattcast
from wattcast.data.catalog import resolve_device
from wattcast.models.coverage import device_excess_log
from wattcast.models.kernel_bundle import load_bundle

#: the audit's llama.csv GEMM rows (bf16 and fp8 Llama-3-8B linears)
GEMMS = pd.DataFrame({"op": ["linear"] * 4, "B": 1, "M": [2048, 2048, 8192, 2048], "N": [4096, 28672, 8192, 4096],
                      "K": [4096, 4096, 8192, 14336], "dtype": ["fp8", "fp8", "fp8", "bf16"]})
VECTOR = pd.DataFrame({"op": ["add", "ln", "softmax"], "B": [2048, 2048, 2048], "H": [4096, 4096, 4096],
                       "dtype": "bf16"})


def _next_gen(tdp_w: float):
    """The audit's NextGen.yaml: a B200 with 1.5x every peak, 1.6x bandwidth and 1.5x SMs (222), at ``tdp_w``."""
    b = resolve_device("B200")
    peaks = {f: getattr(b, f) * 1.5 for f in ("peak_fp32_tflops", "peak_tf32_tflops", "peak_fp16_tflops",
                                               "peak_bf16_tflops", "peak_fp8_tflops")}
    return replace(b, name=f"NextGen{int(tdp_w)}", aliases=(), num_sms=222, tdp_w=tdp_w,
                   memory_bandwidth_gbps=b.memory_bandwidth_gbps * 1.6, **peaks)


def _ratios(out: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return (out["pred_low_ms"] / out["pred_latency_ms"]).to_numpy(), (out["pred_high_ms"] / out["pred_latency_ms"]).to_numpy()


def test_a_knife_edge_descriptor_moves_neither_prediction_nor_band():
    """The 1000 W / 1010 W pair: the fp8 GEMMs' flag may flip (0.148 against the covered 0.149), their predictions
    and bands stay within 3% (the old flat x2 moved the band's top by 35%)."""
    a = wattcast.predict_kernels(GEMMS, _next_gen(1000.0))
    b = wattcast.predict_kernels(GEMMS, _next_gen(1010.0))
    np.testing.assert_allclose(a["pred_latency_ms"], b["pred_latency_ms"], rtol=1e-9)
    for x, y in zip(_ratios(a), _ratios(b)):
        np.testing.assert_allclose(x, y, rtol=0.03)


def test_the_band_widens_with_the_distance_beyond_coverage():
    """Bandwidth 1x, 2.5x and 5x an H100's (every vector kernel beyond coverage at 2.5x and 5x): the band's high end
    grows with the distance beyond coverage."""
    h = resolve_device("H100-SXM5-80GB")
    outs = {k: wattcast.predict_kernels(VECTOR, replace(h, name=f"H{k}", aliases=(),
                                                        memory_bandwidth_gbps=h.memory_bandwidth_gbps * k))
            for k in (1.0, 2.5, 5.0)}
    hi = {k: _ratios(o)[1] for k, o in outs.items()}
    assert outs[2.5]["ood"].all() and outs[5.0]["ood"].all()
    assert (hi[5.0] >= hi[2.5] * 0.999).all()  # never narrower farther out
    assert (hi[2.5] > hi[1.0]).all()


def test_the_distance_widening_is_capped_at_the_flat_factor():
    """3x and 5x an H100's bandwidth (1.0 and 1.5 log units beyond what the folds covered): past the cap, at most the
    flat OOD_BAND_FACTOR's widening (the folds show no error growth with extrapolation; slope 1 uncapped read +900% on
    a 10x spec), the band no longer grows: the same ratios at both, where slope 1 would add log(5/3) = 0.51."""
    h = resolve_device("H100-SXM5-80GB")
    three, five = (wattcast.predict_kernels(VECTOR, replace(h, name=f"H{k}x", aliases=(),
                                                            memory_bandwidth_gbps=h.memory_bandwidth_gbps * k))
                   for k in (3, 5))
    assert three["ood"].all() and five["ood"].all()
    # the LightGBM / MLP disagreement (``spread``) still moves with the bandwidth (up to 0.15 log here): < 0.3, where
    # slope 1 uncapped adds 0.51 on top of it
    assert (np.abs(np.log(_ratios(five)[1]) - np.log(_ratios(three)[1])) < 0.3).all()


def test_the_excess_is_zero_inside_coverage_and_grows_on_the_roofline_side():
    """models/coverage.py: a rate above the covered range widens only the band's high end, by its log distance."""
    fm = load_bundle().families["elementwise"]
    i = fm._sup_names.index("dev_log_bw_gbps")
    hi_edge = float(fm._sup_hi[i])
    cols = ["dev_log_bw_gbps"]
    A = np.array([[hi_edge - 0.1], [hi_edge], [hi_edge + 0.5]])
    lo_w, hi_w = device_excess_log(fm, A, cols, pd.DataFrame(index=range(3)), None, matmul=False)
    np.testing.assert_allclose(hi_w, [0.0, 0.0, 0.5])
    np.testing.assert_allclose(lo_w, 0.0)


def test_a_ridge_inside_the_folds_coverage_is_not_ood():
    """An A100 PCIe 40 GB with more bandwidth (FP32 ridge 11.8, below every FP32 training GPU's 12.5 but within the
    extrapolation the folds covered, 11.4) is in distribution; beyond it (8.0) it is flagged and its band grows
    by about its distance beyond coverage (log(10.8 / 8) = 0.30 on the pooled range), not doubled; at the edge the band
    is continuous."""
    a = resolve_device("A100-PCIe-40GB")
    rows = pd.DataFrame({"op": ["linear"], "B": 1, "M": [4096], "N": [4096], "K": [4096], "dtype": ["fp32"]})
    inside = replace(a, name="A100x", aliases=(), memory_bandwidth_gbps=a.peak_fp32_tflops * 1000 / 11.8)
    beyond = replace(a, name="A100y", aliases=(), memory_bandwidth_gbps=a.peak_fp32_tflops * 1000 / 8.0)
    out_in = wattcast.predict_kernels(rows, inside)
    out_far = wattcast.predict_kernels(rows, beyond)
    assert not out_in["ood"].any() and out_far["ood"].all()
    w_in = math.log(out_in["pred_high_ms"].iloc[0] / out_in["pred_low_ms"].iloc[0])
    w_far = math.log(out_far["pred_high_ms"].iloc[0] / out_far["pred_low_ms"].iloc[0])
    assert 0.2 < w_far - w_in < 0.5
    edge = wattcast.predict_kernels(rows, replace(a, name="A100z", aliases=(),
                                                  memory_bandwidth_gbps=a.peak_fp32_tflops * 1000 / 11.3))
    assert edge["ood"].all()  # just beyond the class's covered 11.4
    assert edge["pred_high_ms"].iloc[0] / edge["pred_latency_ms"].iloc[0] == pytest.approx(
        out_in["pred_high_ms"].iloc[0] / out_in["pred_latency_ms"].iloc[0], rel=0.05)


def test_an_all_ood_step_band_is_at_least_its_kernels_band():
    """A step 10x beyond every fold: its band's high end is at least its OOD kernels' time-weighted high end (the
    kernels' own bands)."""
    h = resolve_device("B200")
    rates = ("peak_fp32_tflops", "peak_tf32_tflops", "peak_fp16_tflops", "peak_bf16_tflops", "peak_fp8_tflops",
             "memory_bandwidth_gbps")
    huge = replace(h, name="Huge10x", aliases=(), num_sms=h.num_sms * 10, tdp_w=h.tdp_w * 3,
                   **{f: getattr(h, f) * 10 for f in rates})
    far = wattcast.predict("llama3_8b", huge, batch=1, seq=2048)
    band = far.step_band
    assert band["ood_time_share"] > 0.9
    # the OOD share carries the kernels' own band, time-weighted (the basis names it): the step's high end is at
    # least that share of it
    m = re.search(r"own band \(([-+]\d+) \.\. ([-+]\d+)%\)", band["basis"])
    assert m, band["basis"]
    kern_hi = 1 + float(m.group(2)) / 100
    assert kern_hi > 1.0  # 10x beyond coverage: widened up to the flat factor's cap
    assert band["high_ms"] / far.step_time_ms >= band["ood_time_share"] * kern_hi * 0.99


def test_cluster_json_has_the_single_device_ood_keys():
    d = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=16, seq=2048, tp=2, pp=2, micro_batch=1).to_dict()
    assert 0.0 <= d["ood_time_fraction"] <= 1.0 and 0.0 <= d["ood_kernel_time_fraction"] <= 1.0
    assert d["ood_time_fraction"] == pytest.approx(d["step_time_band"]["ood_time_share"])
    # the kernel share leaves the rank's in-graph collectives (TP here) out of the denominator
    assert d["ood_kernel_time_fraction"] >= d["ood_time_fraction"]


def test_search_rows_carry_predict_clusters_basis_and_generation():
    res = wattcast.search("gpt2_medium", "DGX-H100", gpus=8, batch=16, seq=1024, max_configs=20, workers=1)
    for _, row in res.ranked.head(3).iterrows():
        p = wattcast.predict_cluster("gpt2_medium", "DGX-H100", seq=1024, strategy=row["strategy"])
        assert row["step_time_band_generation"] == p.step_band["generation"] == "Hopper"
        assert row["step_time_band_basis"] == p.step_band["basis"]


def test_an_fp8_search_row_says_what_predict_clusters_fp8_basis_says():
    """An FP8 step on Hopper (no FP8 step measured there) carries the FP8 kernels' error on its linear share;
    predict_cluster's basis names it apart from the generation term. Until stop 59 the search row's basis had no FP8
    clause and its generation figure held both terms (+/-5.9% against +/-3.0% and FP8 +/-2.9%); the band was the same."""
    kw = dict(dtype="fp8", framework="megatron")
    res = wattcast.search("llama3_8b", "DGX-H100", gpus=8, batch=8, seq=2048, tp=(8,), pp=(1,), micro_batch=(1,),
                          zero=(1,), sp=(True,), recompute=("none",), interleave=(1,), workers=1, **kw)
    row = res.ranked.iloc[0]
    p = wattcast.predict_cluster("llama3_8b", "DGX-H100", seq=2048, strategy=row["strategy"], **kw)
    assert "FP8 GEMMs' error" in p.step_band["basis"]
    assert row["step_time_band_basis"] == p.step_band["basis"]
    assert row["step_time_band_low_ms"] == pytest.approx(p.step_band["low_ms"], rel=1e-12)
    assert row["step_time_band_high_ms"] == pytest.approx(p.step_band["high_ms"], rel=1e-12)
    # the same search in bf16 has no FP8 clause
    bf = wattcast.search("llama3_8b", "DGX-H100", gpus=8, batch=8, seq=2048, tp=(8,), pp=(1,), micro_batch=(1,),
                         zero=(1,), sp=(True,), recompute=("none",), interleave=(1,), workers=1, framework="megatron")
    assert "FP8" not in bf.ranked.iloc[0]["step_time_band_basis"]


def test_traces_carry_the_step_band(tmp_path):
    from wattcast.simulate.trace import write_chrome_trace, write_distributed_trace

    p = wattcast.predict("gpt2", "A100-SXM4-80GB", batch=1, seq=128)
    other = json.loads(write_chrome_trace(p, tmp_path / "t.json").read_text())["otherData"]
    assert other["step_time_band_ms"] == pytest.approx(p.to_dict()["step_time_band_ms"])
    assert other["ood_time_fraction"] == pytest.approx(p.ood_time_fraction)
    c = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=16, seq=2048, tp=1, pp=2, micro_batch=1)
    other = json.loads(write_distributed_trace(c, tmp_path / "c.json").read_text())["otherData"]
    assert other["step_time_band_ms"] == pytest.approx(c.to_dict()["step_time_band_ms"])
    assert other["step_time_band"]["basis"] == c.step_band["basis"]


def test_the_validated_coverage_scores_the_band_predict_ships():
    """validation/step_band.py: a check row outside the measured-step band but inside the band its OOD term widens
    it to counts as covered (until stop 58 the OOD widening predict applies was skipped)."""
    from wattcast.validation.step_band import calibrate

    cal = pd.DataFrame({"setting": "single", "source": "a", "role": "calibrate", "device": "A100-SXM4-80GB",
                        "log_ratio": np.linspace(-0.1, 0.1, 21), "per_op": None, "tensor": False, "ood_band": None})
    chk = pd.DataFrame({"setting": "single", "source": "b", "role": "check", "device": "A100-SXM4-80GB",
                        "log_ratio": [0.3, 0.3], "per_op": None, "tensor": False,
                        "ood_band": [{"share": 1.0, "low_log": -0.5, "high_log": 0.5}, None]})
    s = calibrate(pd.concat([cal, chk], ignore_index=True))["settings"]["single"]
    assert s["check_coverage"] == pytest.approx(0.5) and s["check_coverage_without_ood"] == 0.0
    assert s["check_ood_time_share"] == pytest.approx(0.5)


def test_a_tensor_core_query_is_checked_against_its_own_dtypes_gpus():
    """Audit 58d: the tensor-core class's peak range was pooled over 16-bit and fp8 rows (19 .. 8,230 TFLOP/s). Per
    dtype (kernel_coverage.json; bf16 and fp16 as one) an fp8 GEMM is checked against the GPUs that measured fp8
    (B200, MI300X, MI355X: 2,610 .. 5,030 TFLOP/s, widened by the 0.54 log units the CDNA3 fold extrapolated): an
    L40S's fp8 peak (733) is named beyond it; the H100's (1,979) is inside. (The audit's NextGen bf16 GEMMs at 3,375
    TFLOP/s are inside the 16-bit coverage: the Pascal fold extrapolated the 16-bit peak by 1.23 log units.)"""
    from wattcast.models.coverage import dtype_coverage_for

    cov = dtype_coverage_for(load_bundle())
    assert cov and "16-bit" in cov["gemm"] and "fp8" in cov["gemm"]
    fp8 = GEMMS[GEMMS["dtype"] == "fp8"]
    l40s = wattcast.predict_kernels(fp8, resolve_device("L40S"))
    assert l40s["ood"].all() and l40s["ood_reason"].str.contains("peak_tflops 733 below the covered").all(), \
        l40s["ood_reason"].tolist()
    assert not wattcast.predict_kernels(fp8, resolve_device("H100-SXM5-80GB"))["ood"].any()
    ng = wattcast.predict_kernels(GEMMS[GEMMS["dtype"] == "bf16"], _next_gen(1000.0))
    assert not ng["ood"].any()


def test_the_dtype_coverage_applies_only_to_the_bundle_it_was_made_for():
    from types import SimpleNamespace

    from wattcast.models.coverage import dtype_coverage_for

    assert dtype_coverage_for(load_bundle()) is not None
    assert dtype_coverage_for(SimpleNamespace(train_devices=["A100-SXM4-80GB"])) is None
