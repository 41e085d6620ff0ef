"""The step's 90% band: calibrated on measured steps (validation/step_band.py), carried by every prediction
(simulate/step_band.py), widened by the kernels' generation error off the calibrated generations."""

from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import wattcast
from conftest import REPO, flat, run_cli, write_preset_cluster
from wattcast.data.catalog import resolve_device
from wattcast.simulate import step_band as sb
from wattcast.validation.step_band import calibrate, weighted_quantiles

CAL = {"settings": {"single": {"band_log": [-0.1, 0.2], "generations": ["Ampere"]},
                    "cluster": {"band_log": [-0.05, 0.1], "generations": ["Ampere"]}}}


def _bundle(**fold_biases):
    """A bundle-like object whose families carry ``logo.folds`` (bias_pct, optional by_class)."""
    fams = {f: SimpleNamespace(logo={"folds": folds}) for f, folds in fold_biases.items()}
    return SimpleNamespace(families=fams)


@pytest.mark.parametrize("entry,msg", [
    ({}, "'settings'"),
    ({"settings": {"single": {"band_log": [0.1, 0.2], "generations": []}}}, "band_log"),
    ({"settings": {"single": {"band_log": [-0.1, float("nan")], "generations": []}}}, "band_log"),
    ({"settings": {"single": {"band_log": [-0.1, 0.2], "generations": "Ampere"}}}, "generations"),
])
def test_a_bad_calibration_is_refused(entry, msg):
    with pytest.raises(ValueError, match=msg):
        sb.check_step_band(entry, "x.json")


def test_generation_width_weighs_each_familys_worst_fold_bias_by_its_share():
    bundle = _bundle(
        gemm={"A": {"bias_pct": 30.0, "by_class": {"vector": {"bias_pct": 30.0, "rows": 5000}}},
              "B": {"bias_pct": -8.0, "by_class": {"tensor": {"bias_pct": -8.0, "rows": 1000}}},
              "C": {"bias_pct": 40.0, "by_class": {"tensor": {"bias_pct": 40.0, "rows": 50}}}},  # too few rows
        elementwise={"A": {"bias_pct": -20.0, "by_class": {}}, "B": {"bias_pct": 5.0}})
    per_op = [{"op_class": "linear", "time_ms": 60.0}, {"op_class": "elementwise", "time_ms": 20.0},
              {"op_class": "collective", "time_ms": 20.0}]
    tensor = sb.generation_log_width(per_op, bundle, tensor=True)
    assert tensor == pytest.approx(0.6 * math.log(1.08) + 0.2 * math.log(1.20))
    vector = sb.generation_log_width(per_op, bundle, tensor=False)
    assert vector == pytest.approx(0.6 * math.log(1.30) + 0.2 * math.log(1.20))
    assert sb.generation_log_width([{"op_class": "linear", "time_ms": float("nan")}], bundle, tensor=True) == 0.0
    assert sb.generation_log_width([], bundle, tensor=True) == 0.0
    assert sb.generation_log_width(per_op, None, tensor=True) == 0.0


def test_the_band_widens_off_the_calibrated_generations(monkeypatch):
    monkeypatch.setattr(sb, "load_step_band", lambda: CAL)
    bundle = _bundle(gemm={"Blackwell": {"bias_pct": 10.0, "by_class": {"tensor": {"bias_pct": 10.0, "rows": 500}}}})
    per_op = [{"op_class": "linear", "time_ms": 50.0}, {"op_class": "collective", "time_ms": 50.0}]
    a100 = sb.step_band(100.0, "cluster", resolve_device("A100-SXM4-80GB"), per_op, bundle, tensor=True)
    assert a100["low_ms"] == pytest.approx(100 * math.exp(-0.05)) and a100["high_ms"] == pytest.approx(100 * math.exp(0.1))
    assert "Ampere" in a100["basis"] and a100["generation"] == "Ampere"
    b200 = sb.step_band(100.0, "cluster", resolve_device("B200"), per_op, bundle, tensor=True)
    extra = 0.5 * math.log(1.10)
    assert b200["low_ms"] == pytest.approx(100 * math.exp(-0.05 - extra))
    assert b200["high_ms"] == pytest.approx(100 * math.exp(0.1 + extra))
    assert "Blackwell is not among them" in b200["basis"]
    assert sb.step_band(float("nan"), "cluster", resolve_device("B200"), per_op, bundle, tensor=True) == {}
    assert sb.step_band(100.0, "no-such-setting", resolve_device("B200"), per_op, bundle, tensor=True) == {}
    assert sb.band_keys({}) == {"step_time_band_ms": None, "step_time_band": None}


def test_calibration_weighs_every_source_the_same_and_scores_the_check_rows():
    rng = np.random.default_rng(0)
    big = pd.DataFrame({"setting": "cluster", "source": "big", "role": "calibrate", "device": "A100-SXM4-80GB",
                        "log_ratio": rng.normal(0.0, 0.01, 1000)})
    small = pd.DataFrame({"setting": "cluster", "source": "small", "role": "calibrate", "device": "A100-SXM4-80GB",
                          "log_ratio": np.full(10, 0.3)})
    chk = pd.DataFrame({"setting": "cluster", "source": "check", "role": "check", "device": "A100-SXM4-80GB",
                        "log_ratio": [0.0, 0.1, 0.5, -0.5]})
    out = calibrate(pd.concat([big, small, chk], ignore_index=True))["settings"]["cluster"]
    lo, hi = out["band_log"]
    assert hi == pytest.approx(0.3, abs=1e-6)  # the 10-row source holds half the weight
    assert -0.05 < lo < 0 and out["generations"] == ["Ampere"]
    assert out["check_rows"] == 4 and out["check_coverage"] == pytest.approx(0.5)
    assert out["sources"]["small"]["rows"] == 10 and out["sources"]["check"]["role"] == "check"
    assert weighted_quantiles(np.array([1.0, 2.0]), np.array([1.0, 1.0]), [0.25, 0.75]) == pytest.approx([1.0, 2.0])


def test_predictions_carry_the_band_in_json():
    one = wattcast.predict("gpt2", "A100-SXM4-80GB", batch=4, seq=512).to_dict()
    lo, hi = one["step_time_band_ms"]
    assert lo < one["step_time_ms"] < hi and one["step_time_band"]["basis"].startswith("measured single steps")
    new = wattcast.predict("gpt2", "B200", batch=4, seq=512).to_dict()
    assert "Blackwell is not among them" in new["step_time_band"]["basis"]
    # an unmeasured generation's step carries its kernels' leave-one-generation-out bands (not the A100's measured
    # single-step band, which reflects its labels' own spread): at least +20% on top here
    assert new["step_time_band_ms"][1] / new["step_time_ms"] > 1.2
    cl = wattcast.predict_cluster("gpt3_2.7b", "DGX-A100", gpus=16, batch=64, seq=2048, tp=2, pp=2, micro_batch=2).to_dict()
    lo, hi = cl["step_time_band_ms"]
    assert lo < cl["step_time_ms"] < hi and cl["step_time_band"]["basis"] == "measured cluster steps (Ampere)"


def test_shipped_calibration_is_the_one_the_data_gives(data_root, tmp_path):
    """The shipped step_band.json is what ``python -m wattcast.validation.step_band`` (and ``wattcast validate
    step-band --output``, run here) makes from the shared data with the shipped models (re-run it after any change
    that moves predictions)."""
    out = tmp_path / "step_band.json"
    r = run_cli("validate", "step-band", "--data", data_root, "--output", out, "--no-mlflow", data=data_root)
    assert r.returncode == 0, r.stderr
    # the checking rows (never fitted) fall inside the 90% band about 90% of the time
    cover = re.search(r"rows not fitted inside: ([\d.]+)% of 780", flat(r.stdout))
    assert cover and 85.0 <= float(cover.group(1)) <= 95.0 and "vtrain-single (evaluation half)" in r.stdout
    made, shipped = json.loads(out.read_text()), sb.load_step_band()
    assert set(made["settings"]) == set(shipped["settings"]) == {"single", "cluster"}
    for k, s in made["settings"].items():
        assert s["band_log"] == pytest.approx(shipped["settings"][k]["band_log"], abs=1e-6)
        assert s["generations"] == shipped["settings"][k]["generations"]
        assert s["check_coverage"] == pytest.approx(shipped["settings"][k]["check_coverage"], abs=1e-9)
    assert made["settings"]["cluster"]["generations"] == ["Ampere"]


def test_the_band_widens_monotonically_with_the_ood_share():
    lo, hi = -0.1, 0.2
    ood = {"low_log": -0.4, "high_log": 0.5}
    assert sb.mix_band_log(lo, hi, None) == (lo, hi) and sb.mix_band_log(lo, hi, dict(ood, share=0.0)) == (lo, hi)
    assert sb.mix_band_log(lo, hi, dict(ood, share=1.0)) == pytest.approx((-0.4, 0.5))
    edges = [sb.mix_band_log(lo, hi, dict(ood, share=s)) for s in np.linspace(0, 1, 11)]
    assert all(b[0] >= a[0] - 1e-12 for a, b in zip(edges[1:], edges)) and all(b[1] >= a[1] for a, b in zip(edges, edges[1:]))
    assert edges[5][1] == pytest.approx(math.log(0.5 * math.exp(0.2) + 0.5 * math.exp(0.5)))
    # an OOD band narrower than the in-distribution one never narrows the step's
    assert sb.mix_band_log(lo, hi, {"share": 0.7, "low_log": -0.01, "high_log": 0.01}) == pytest.approx((lo, hi))


def test_ood_kernels_carry_their_own_kernel_band():
    """An OOD kernel's time carries the band ``wattcast kernels`` gives it (its low_ms / high_ms; no kernel bundle is
    read): until stop 58 its family's un-widened leave-one-generation-out band replaced it (audit 58d: a 10x GPU's step
    got a catalog GPU's band)."""
    costed = pd.DataFrame({"op_class": ["elementwise", "optimizer", "linear", "collective"],
                           "method": ["surrogate", "proxy", "surrogate", "collective"], "dtype": "bf16",
                           "time_ms": [10.0, 30.0, 60.0, 0.0], "low_ms": [1.0, 3.0, 30.0, 0.0],
                           "high_ms": [100.0, 300.0, 120.0, 0.0], "ood": [True, True, False, True]})
    got = sb.ood_band_log(costed)
    assert got["share"] == pytest.approx(0.4)
    assert got["low_log"] == pytest.approx(math.log(0.1)) and got["high_log"] == pytest.approx(math.log(10.0))
    assert sb.ood_band_log(costed.assign(ood=False)) == {}
    assert sb.ood_warning(0.5) is None and "51%" in sb.ood_warning(0.51)


def _scaled(spec, k: float, name: str):
    """``spec`` with every rate (peaks, bandwidth, SMs, L2, TDP) ``k`` times higher: a made-up GPU."""
    from dataclasses import replace

    rates = ("peak_fp32_tflops", "peak_tf32_tflops", "peak_fp16_tflops", "peak_bf16_tflops", "peak_fp8_tflops",
             "memory_bandwidth_gbps", "l2_cache_mb")
    kw = {f: getattr(spec, f) * k for f in rates if getattr(spec, f) is not None}
    return replace(spec, name=name, arch="Futura (FX1)", aliases=(), num_sms=int(spec.num_sms * k),
                   tdp_w=spec.tdp_w * k, **kw)


def _assert_ood_widened(far: dict, h100: dict) -> None:
    """``far`` (a prediction's to_dict on a made-up GPU far beyond every fold) has a band over 1.2x as wide as the
    H100's, mostly OOD time named in its basis, and the OOD warning the H100 has not."""
    def width(d):
        lo, hi = d["step_time_band_ms"]
        return hi / lo

    assert width(far) > 1.2 * width(h100)
    assert far["step_time_band"]["ood_time_share"] > 0.9 and "out of distribution" in far["step_time_band"]["basis"]
    assert any("out of distribution" in w for w in far["warnings"])
    assert not any("out of distribution" in w for w in h100["warnings"])


def test_a_gpu_far_beyond_every_fold_is_ood_with_a_wider_band_and_a_warning():
    h100 = wattcast.predict("llama3_8b", "H100-SXM5-80GB", batch=1, seq=2048).to_dict()
    x6 = wattcast.predict("llama3_8b", _scaled(resolve_device("H100-SXM5-80GB"), 6.0, "FutureX6"),
                          batch=1, seq=2048).to_dict()
    assert h100["ood_fraction"] < 0.2 and x6["ood_fraction"] > 0.9
    _assert_ood_widened(x6, h100)


def _made_up_cluster(tmp_path):
    """A cluster file (the DGX-H100 preset's network) pointing at a device file at 6x an H100's rates."""
    import yaml

    spec = yaml.safe_load((REPO / "data" / "devices" / "H100-SXM5-80GB.yaml").read_text())
    for f in ("peak_fp32_tflops", "peak_tf32_tflops", "peak_fp16_tflops", "peak_bf16_tflops", "peak_fp8_tflops",
              "memory_bandwidth_gbps", "l2_cache_mb"):
        spec[f] *= 6.0
    spec.update(name="FutureX6", arch="Futura (FX1)", aliases=[], num_sms=spec["num_sms"] * 6, tdp_w=spec["tdp_w"] * 6)
    (tmp_path / "fx6.yaml").write_text(yaml.safe_dump(spec))
    return str(write_preset_cluster(tmp_path / "fx6-cluster.yaml", "fx6.yaml"))


CLUSTER_STEP = dict(gpus=8, batch=16, seq=2048, tp=1, pp=2, micro_batch=1)


def test_a_made_up_gpu_cluster_gets_the_ood_band_and_the_warning(tmp_path):
    h100 = wattcast.predict_cluster("llama3_8b", "DGX-H100", **CLUSTER_STEP).to_dict()
    x6 = wattcast.predict_cluster("llama3_8b", _made_up_cluster(tmp_path), **CLUSTER_STEP).to_dict()
    assert x6["device"] == "FutureX6" and x6["ood_fraction"] > 0.9
    _assert_ood_widened(x6, h100)


def test_the_dgx_h100_band_barely_moves_with_the_ood_term():
    """H100 kernels are nearly all inside the generation folds' coverage: the critical rank's OOD term leaves the
    preset's band where the measured-step band and the generation term put it, within a rounding of its percent."""
    from wattcast.models.kernel_bundle import load_bundle

    for kw in (CLUSTER_STEP, dict(gpus=16, batch=64, seq=2048, tp=2, pp=2, micro_batch=2)):
        res = wattcast.predict_cluster("llama3_8b", "DGX-H100", **kw)
        plain = sb.step_band(res.step_time_ms, "cluster", resolve_device("H100-SXM5-80GB"), res.per_op, load_bundle(),
                             tensor=True)
        assert res.step_band["ood_time_share"] < 0.05
        assert not any("out of distribution" in w for w in res.to_dict()["warnings"])
        for k in ("low_ms", "high_ms"):
            assert res.step_band[k] / res.step_time_ms == pytest.approx(plain[k] / res.step_time_ms, abs=0.005)


def test_the_critical_ranks_ood_term_counts_micro_batches_the_sharded_optimizer_and_not_collectives():
    from wattcast.simulate.distributed import critical_rank_ood

    stage = dict(f_ms=3.0, b_ms=7.0, ood_fb_ms=2.0, ood_fb_low_ms=1.0, ood_fb_high_ms=4.0, ood_opt_ms=4.0,
                 ood_opt_low_ms=2.0, ood_opt_high_ms=8.0, ood_coll_ms=1.0)
    got = critical_rank_ood(stage, 4, opt_ms=5.0, opt_raw_ms=20.0)  # ZeRO: a quarter of the optimizer step
    # 4 x 10 ms of micro-batches + 5 ms of optimizer; OOD: 4 x 2 + 4 / 4
    assert got["share"] == pytest.approx(9.0 / 45.0) and got["collective_share"] == pytest.approx(4.0 / 45.0)
    assert got["low_log"] == pytest.approx(math.log(0.5)) and got["high_log"] == pytest.approx(math.log(2.0))
    no_kernels = dict(stage, ood_fb_ms=0.0, ood_opt_ms=0.0)
    assert critical_rank_ood(no_kernels, 4, 5.0, 20.0) == {"collective_share": pytest.approx(4.0 / 45.0)}
    # OOD collectives alone never widen the band (no calibration covers them): the measured band, the share reported
    band = sb.step_band(100.0, "cluster", resolve_device("A100-SXM4-80GB"), [], None, tensor=True,
                        ood={"collective_share": 0.3})
    lo, hi = sb.load_step_band()["settings"]["cluster"]["band_log"]
    assert band["low_ms"] == pytest.approx(100 * math.exp(lo)) and band["high_ms"] == pytest.approx(100 * math.exp(hi))
    assert band["ood_collective_time_share"] == 0.3 and band["ood_time_share"] == 0.0
