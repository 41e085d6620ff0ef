"""Leave-one-generation-out calibration of the kernel surrogates: what OOD means and how wide the band is."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import wattcast
from wattcast.data.catalog import resolve_device
from wattcast.simulate.single_device import GPU_KERNEL_FLOOR_MS
from wattcast.data.device_spec import DeviceSpec
from wattcast.models.kernel_bundle import load_bundle, shipped_folder
from wattcast.models.kernel_predictor import predict_kernels
from wattcast.training.generation_calibration import (attach_calibration, calibrate_generations, calibration_table,
                                                      generation_of)


def test_generation_is_the_first_word_of_the_arch():
    assert generation_of(resolve_device("A100-SXM4-80GB")) == "Ampere"
    assert generation_of(resolve_device("A40")) == "Ampere"
    assert generation_of(resolve_device("MI210")) == "CDNA2"


def test_shipped_bundle_is_calibrated_per_generation():
    m = json.loads((shipped_folder() / "kernel_manifest.json").read_text())
    for fam, e in m["families"].items():
        logo = e["logo"]
        lo, hi = logo["band_log"]
        assert lo < 0 < hi, fam
        assert len(logo["folds"]) >= 3, fam
        assert all(v >= 0 for v in logo["margin"].values())
    assert {"Blackwell", "Ampere", "CDNA4"} <= set(m["families"]["gemm"]["logo"]["folds"])


def test_tensor_core_gemms_of_a_new_generation_are_covered_by_the_folds():
    # an H100 / B200 bf16 GEMM sits inside what the Ampere and Blackwell folds covered: not OOD, calibrated band
    gemm = load_bundle().families["gemm"]
    lo, hi = (float(v[0]) for v in gemm.band_log_rows(np.ones(1, dtype=bool)))  # the tensor-core rows' band
    for dev in ("H100-SXM5-80GB", "B200"):
        p = wattcast.predict("llama3_8b", dev, batch=1, seq=2048, dtype="bf16")
        lin = p.nodes[(p.nodes["op_class"] == "linear") & (p.nodes["method"] == "surrogate")]
        # (the 128k-vocabulary output layer is larger than any training GEMM: shape-OOD, rightly)
        lin = lin[~lin["name"].str.startswith("lm_head")]
        assert len(lin) > 100 and not lin["ood"].any(), dev
        big = lin[lin["gpu_ms"] > 0.05]
        # the kernels' own band: since stop 56 a node's time and band also carry its launch gap (eager PyTorch's launch
        # queue: time_ms = gpu_ms + gap, low / high shifted by the same gap), taken off here
        gap = big["time_ms"] - big["gpu_ms"]
        big = big.assign(low_ms=big["low_ms"] - gap, high_ms=big["high_ms"] - gap, time_ms=big["gpu_ms"])
        # the calibrated band plus the ensemble's spread, never the doubled OOD band
        up, down = np.log(big["high_ms"] / big["time_ms"]), np.log(big["low_ms"] / big["time_ms"])
        assert (up >= hi - 0.01).all() and (up < 1.5 * hi).all()
        # the low end at the calibrated band, or (since stop 46) at the physical floor, the GEMM's work at the dense
        # peak, where the band would reach below it (since stop 49 plus the GPU-side fixed time of a kernel)
        floor_ms = big["flops"] / (resolve_device(dev).peak_bf16_tflops * 1e9) + GPU_KERNEL_FLOOR_MS
        at_floor = np.isclose(big["low_ms"], floor_ms, rtol=1e-3)
        # or (since stop 51) at the device's measured matmul ceiling x 1.09 where it has one (B200: MAMF's 0.776 of
        # the dense peak; H100 takes NVIDIA's median, no measurement of it, and is not clipped there)
        own = gemm.ceiling_member["ceilings"].get(dev, {}).get("bf16")
        ceiling_ms = (floor_ms - GPU_KERNEL_FLOOR_MS) / min(own * 1.09, 1.0) if own else np.inf
        at_ceiling = (np.isclose(big["low_ms"], ceiling_ms, rtol=1e-3)
                      | np.isclose(big["low_ms"], ceiling_ms + GPU_KERNEL_FLOOR_MS, rtol=1e-3))
        assert ((down <= lo + 0.01) | at_floor | at_ceiling).all() and (down > 1.5 * lo).all()
        assert (dev == "B200") == bool(at_ceiling.any())


def test_fp32_gemms_on_a_gpu_with_less_power_per_flop_than_any_fp32_fold_are_flagged():
    # L4: 72 W for 30 FP32 TFLOP/s; every FP32 training GPU has 8+ W per TFLOP/s (bf16 rows go lower, pooled)
    k = pd.DataFrame({"op": ["linear"] * 2, "dtype": ["fp32", "bf16"], "B": [1.0] * 2, "M": [2048.0] * 2,
                      "N": [2048.0] * 2, "K": [2048.0] * 2})
    r = predict_kernels(k, resolve_device("L4"))
    assert bool(r["ood"].iloc[0]) and "device" in r["ood_reason"].iloc[0]


def test_a_gpu_beyond_every_fold_is_still_device_ood_with_a_wider_band():
    h100 = resolve_device("H100-SXM5-80GB")
    with wattcast.allow_exotic():  # its 80 GB read whole in 0.53 ms, 34x under the catalog's least: deliberately exotic
        fast = DeviceSpec(**{**h100.__dict__, "name": "far-future", "memory_bandwidth_gbps": 150_000.0,
                             "peak_bf16_tflops": 90_000.0, "peak_fp16_tflops": 90_000.0, "peak_fp32_tflops": 6_000.0,
                             "num_sms": 100 * h100.num_sms, "l2_cache_mb": 5000.0,
                             "peak_tf32_tflops": 45_000.0, "peak_fp8_tflops": 180_000.0})
    k = pd.DataFrame({"op": ["linear"], "dtype": ["bf16"], "B": [1.0], "M": [4096.0], "N": [4096.0], "K": [4096.0]})
    near = predict_kernels(k, h100).iloc[0]
    far = predict_kernels(k, fast).iloc[0]
    assert not near["ood"] and far["ood"] and "device" in far["ood_reason"]
    width = lambda r: np.log(r["pred_high_ms"] / r["pred_low_ms"])  # noqa: E731
    assert width(far) > 1.5 * width(near)


def test_calibration_on_real_rows_reports_each_generation(data_root):
    from wattcast.data.kernel_datasets import load_kernels, split_heldout

    rows, _ = split_heldout(load_kernels(data_root))
    rows = rows[rows["op"] == "softmax"]
    specs = {d: resolve_device(d) for d in rows["device"].unique()}
    bundle = load_bundle()
    cal = calibrate_generations(rows, specs, bundle, rounds=20, max_rows=3000)
    assert set(cal) == {"softmax"}
    c = cal["softmax"]
    gens = {generation_of(specs[d]) for d in rows["device"].unique()}
    assert set(c["folds"]) == gens
    t = calibration_table(cal)
    assert (t["rows"] > 0).all() and np.isfinite(t[["mape_pct", "bias_pct"]]).all().all()
    assert (t["band_low_pct"] < 0).all() and (t["band_high_pct"] > 0).all()
    new = attach_calibration(bundle, cal)
    assert new.families["softmax"].logo is c and new.families["gemm"].logo is bundle.families["gemm"].logo
    assert new.families["softmax"].calibrated_band_log == tuple(c["band_log"])


def test_vector_kernels_are_not_flagged_by_an_arithmetic_rate_they_do_not_use():
    """A bf16 elementwise kernel streams memory on the vector units: an H100's FP32 peak (beyond every fold) does not
    make it OOD, its bandwidth (inside what the Ampere fold covered) does not either; a B200's bandwidth (3.8x the
    training maximum, beyond every fold) still does. GEMMs keep every descriptor and their dtype class's support."""
    from wattcast.models.kernel_bundle import RATE_DESCRIPTORS, load_bundle
    from wattcast.models.kernel_predictor import DTYPE_CLASS_FAMILIES

    checked = load_bundle().families["elementwise"].checked_descriptors
    assert "elementwise" not in DTYPE_CLASS_FAMILIES and "dev_log_bw_gbps" in checked
    assert not RATE_DESCRIPTORS & checked
    k = pd.DataFrame({"op": ["add", "mul"], "dtype": ["bf16"] * 2, "B": [1.0, 1.0], "H": [2.0**24, 2.0**26]})
    h100 = predict_kernels(k, resolve_device("H100-SXM5-80GB"))
    b200 = predict_kernels(k, resolve_device("B200"))
    assert not h100["ood"].any(), h100["ood_reason"].tolist()
    assert b200["ood"].all() and all("device" in r for r in b200["ood_reason"])
    # softmax was measured on GPUs up to 1.6 TB/s only: an H100's 3.35 TB/s is beyond its folds, still flagged
    sm = predict_kernels(pd.DataFrame({"op": ["softmax"], "dtype": ["bf16"], "B": [4096.0], "H": [4096.0]}),
                         resolve_device("H100-SXM5-80GB"))
    assert bool(sm["ood"].iloc[0]) and "device" in sm["ood_reason"].iloc[0]
    p = wattcast.predict("llama3_8b", "H100-SXM5-80GB", batch=1, seq=2048, dtype="bf16")
    assert p.ood_fraction < 0.15


def test_a_fold_scores_only_the_sources_its_training_rows_still_have(data_root):
    """Vidur's FP16 RMSNorm kernels were measured on A100 and A40 only: with Ampere held out no training row has
    that timing method, so the fold scores Ampere's NeuSight rows and says how many it left out."""
    from wattcast.data.kernel_datasets import load_kernels, split_heldout

    rows, _ = split_heldout(load_kernels(data_root))
    rows = rows[rows["op"].isin(["ln", "rmsnorm"])]
    specs = {d: resolve_device(d) for d in rows["device"].unique()}
    cal = calibrate_generations(rows, specs, load_bundle(), rounds=20, max_rows=3000, families=["ln"])
    amp = cal["ln"]["folds"]["Ampere"]
    gen = rows["device"].map({d: generation_of(s) for d, s in specs.items()})
    ampere = rows[gen == "Ampere"]
    only_ampere = ~ampere["source"].isin(set(rows.loc[gen != "Ampere", "source"]))
    assert only_ampere.any() and amp["rows_new_source"] == int(only_ampere.sum())
    assert amp["rows"] == int((~only_ampere).sum())
    for g, f in cal["ln"]["folds"].items():  # every fold by the same rule (MI210's LLMCompass rows are CDNA2's alone)
        held = rows[gen == g]
        assert f["rows_new_source"] == int((~held["source"].isin(set(rows.loc[gen != g, "source"]))).sum())


def test_each_family_draws_its_own_random_stream(data_root):
    """A family's calibration is the same whether other families run before it or not (one shared stream made adding
    rows to one family redraw every later family's subsamples)."""
    from wattcast.data.kernel_datasets import load_kernels, split_heldout

    rows, _ = split_heldout(load_kernels(data_root))
    rows = rows[rows["op"].isin(["softmax", "ln"])]
    specs = {d: resolve_device(d) for d in rows["device"].unique()}
    kw = dict(rounds=10, max_rows=2000)
    both = calibrate_generations(rows, specs, load_bundle(), families=["ln", "softmax"], **kw)
    alone = calibrate_generations(rows, specs, load_bundle(), families=["softmax"], **kw)
    assert set(alone) == {"softmax"} and alone["softmax"]["band_log"] == both["softmax"]["band_log"]


def test_recalibrating_a_folder_keeps_the_other_families_and_refuses_a_missing_xla_table(tmp_path, data_root):
    import shutil

    from wattcast.training.generation_calibration import calibrate_folder

    folder = tmp_path / "bundle"
    shutil.copytree(shipped_folder(), folder, ignore=shutil.ignore_patterns("__pycache__"))
    before = json.loads((folder / "kernel_manifest.json").read_text())
    assert before.get("xla_tables")  # the shipped GEMM family was trained with an extra XLA table
    with pytest.raises(ValueError, match="extra XLA table"):
        calibrate_folder(folder, data_root, xla_tables=[])
    with pytest.raises(ValueError, match="no family"):
        calibrate_folder(folder, data_root, families=["attention"])
    t = calibrate_folder(folder, data_root, families=["softmax"], xla_tables=[], rounds=10, max_rows=2000)
    assert set(t["family"]) == {"softmax"}
    after = json.loads((folder / "kernel_manifest.json").read_text())
    for fam in ("gemm", "conv", "ln", "elementwise"):
        assert after["families"][fam]["logo"] == before["families"][fam]["logo"]
    assert after["generation_calibration"]["families"] == before["generation_calibration"]["families"]


def test_tensor_core_and_fp32_rows_carry_their_own_classes_band():
    """The GEMM family's calibration has a band per dtype class (the ceiling and floor members predict a new
    generation's tensor-core GEMMs, the roofline member its FP32 ones); each row carries its class's."""
    gemm = load_bundle().families["gemm"]
    by = gemm.logo["band_log_by_class"]
    assert set(by) == {"tensor", "vector"} and by["tensor"] != by["vector"]
    lo, hi = gemm.band_log_rows(np.array([True, False]))
    assert [lo[0], hi[0]] == by["tensor"] and [lo[1], hi[1]] == by["vector"]
    k = pd.DataFrame({"op": ["linear"] * 2, "dtype": ["bf16", "fp32"], "B": [1.0] * 2, "M": [4096.0] * 2,
                      "N": [4096.0] * 2, "K": [4096.0] * 2})
    r = predict_kernels(k, resolve_device("B200"))
    assert not r["ood"].iloc[0]
    # the band's top (since stop 51 its low end is held at the B200's measured matmul ceiling x 1.09: narrower)
    up = np.log(r["pred_high_ms"] / r["pred_latency_ms"]).to_numpy()
    down = np.log(r["pred_low_ms"] / r["pred_latency_ms"]).to_numpy()
    assert up[0] == pytest.approx(by["tensor"][1], abs=0.05)  # plus the ensemble's spread, if any
    assert by["tensor"][0] - 0.05 <= down[0] < 0
    # the folds that measured the tensor-core class are the ones the band pooled, each with its rows and bias
    folds = gemm.logo["folds"]
    assert {"Blackwell", "CDNA3", "CDNA4"} <= {g for g, f in folds.items() if f["by_class"].get("tensor", {}).get("rows", 0) >= 100}
    # a family calibrated before classes existed keeps its one band for every row
    import dataclasses
    old = dataclasses.replace(gemm, logo={k: v for k, v in gemm.logo.items() if k != "band_log_by_class"})
    lo, hi = old.band_log_rows(np.array([True, False]))
    assert list(lo) == [gemm.calibrated_band_log[0]] * 2 and list(hi) == [gemm.calibrated_band_log[1]] * 2


def test_the_gemm_folds_refit_the_floor_and_ceiling_members(data_root):
    """The GEMM family's folds predict with the recipe the bundle uses (roofline, floor and ceiling members refitted
    per fold): a tensor-core band of its own, and a held-out Blackwell within what the members reach (the roofline
    member alone read +32% there)."""
    from wattcast.data.kernel_datasets import load_kernels, split_heldout

    rows, _ = split_heldout(load_kernels(data_root, xla_tables=[]))
    rows = rows[rows["op"].isin(["bmm", "linear"]) & rows["source"].isin(["xla", "neusight/kernels"])]
    rows = rows.sample(frac=1.0, random_state=0).groupby(["device", "dtype"]).head(400).reset_index(drop=True)
    specs = {d: resolve_device(d) for d in rows["device"].unique()}
    cal = calibrate_generations(rows, specs, load_bundle(), rounds=30, max_rows=6000, families=["gemm"],
                                root=data_root)["gemm"]
    assert "floor and ceiling members" in cal["model"]
    assert set(cal["band_log_by_class"]) == {"tensor", "vector"}
    b = cal["folds"]["Blackwell"]["by_class"]["tensor"]
    assert b["rows"] >= 1000 and abs(b["bias_pct"]) < 20, b
    t = calibration_table({"gemm": cal}).set_index("generation")
    assert t.loc["Blackwell", "tensor_bias_pct"] == pytest.approx(b["bias_pct"])
    assert t["tensor_band_low_pct"].iloc[0] < 0 < t["tensor_band_high_pct"].iloc[0]


def test_a_gemm_fold_without_the_floor_members_source_scores_the_roofline_member(data_root):
    """A fold whose training rows have no XLA row cannot fit the floor member (it predicts with XLA's floor): the
    fold scores the roofline member (None from the members) instead of failing the calibration."""
    from wattcast.data.kernel_datasets import load_kernels, split_heldout
    from wattcast.featurize.kernel_features import featurize_kernels
    from wattcast.training.generation_calibration import _gemm_members

    rows, _ = split_heldout(load_kernels(data_root, xla_tables=[]))
    rows = rows[rows["op"].isin(["bmm", "linear"]) & (rows["source"] == "neusight/kernels")]
    rows = rows.sample(frac=1.0, random_state=0).groupby("device").head(300).reset_index(drop=True)
    specs = {d: resolve_device(d) for d in rows["device"].unique()}
    X = featurize_kernels(rows, specs)
    fm = load_bundle().families["gemm"]
    te = np.zeros(len(rows), dtype=bool)
    te[:10] = True
    assert _gemm_members(np.zeros(10), rows, X, specs, fm, np.arange(10, len(rows)), te, np.full(len(rows), np.nan),
                         rounds=5, seed=0) is None
