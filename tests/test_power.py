"""Power: features, the physically shaped model, power limits / clock caps, node overhead, training e2e."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from wattcast.data.catalog import resolve_device
from wattcast.featurize.power_features import IDLE_FRACTION_OF_TDP, kernel_power_features
from wattcast.models.power import (
    MANIFEST,
    PowerModel,
    analytical_model,
    apply_clock,
    apply_power_limit,
    comm_power_w,
    idle_power_w,
    load_power_model,
    resolve_power_folder,
)

DEVICES = ("A100-SXM4-80GB", "H100-SXM5-80GB", "V100-PCIe-32GB", "Quadro-RTX-6000", "L4")


@pytest.fixture(scope="module", params=["shipped", "analytical"])
def model(request) -> PowerModel:
    return load_power_model() if request.param == "shipped" else analytical_model()


def _feats(spec, cu, mu, dtype="bf16"):
    """Features for kernels at the given compute / memory utilisations (1 ms each)."""
    cu, mu = np.broadcast_arrays(np.asarray(cu, float), np.asarray(mu, float))
    flops = cu * spec.peak_matrix_tflops(dtype) * 1e12 * 1e-3
    bytes_ = mu * spec.memory_bandwidth_gbps * 1e9 * 1e-3
    return kernel_power_features(flops, bytes_, 1.0, dtype, spec)


# ------------------------------------------------------------------------------------------ features
def test_features_vectorised_and_match_a_loop():
    spec = resolve_device("A100-SXM4-80GB")
    rng = np.random.default_rng(0)
    n = 500
    flops = rng.uniform(0, 5e11, n)
    bytes_ = rng.uniform(0, 3e9, n)
    t = rng.uniform(0.01, 5.0, n)
    dts = rng.choice(["fp32", "bf16", "fp16", "tf32", "int8"], n)
    f = kernel_power_features(flops, bytes_, t, dts, spec)
    assert len(f) == n and f.index.equals(pd.RangeIndex(n))
    for i in rng.choice(n, 25, replace=False):
        one = kernel_power_features(flops[i], bytes_[i], t[i], dts[i], spec).iloc[0]
        pd.testing.assert_series_equal(one, f.iloc[i], check_names=False)
    # compute utilisation against the dtype's peak; unknown dtypes use FP32 and 4 bytes
    i = int(np.flatnonzero(dts == "bf16")[0])
    assert f.loc[i, "compute_util"] == pytest.approx(min(flops[i] / (t[i] * 1e-3 * 312e12), 1.2))
    j = int(np.flatnonzero(dts == "int8")[0])
    assert f.loc[j, "dtype_bytes"] == 4 and not f.loc[j, "tensor"]
    assert f.loc[i, "tensor"] and f.loc[i, "dtype_bytes"] == 2
    assert f["memory_util"].between(0, 1.2).all() and f["compute_util"].between(0, 1.2).all()
    # scalar dtype, zero-time markers, clipping
    g = kernel_power_features([1e12, 0.0, 1e20], [1e9, 0.0, 1e20], [1.0, 0.0, 1.0], "fp16", spec)
    assert g.loc[1, "compute_util"] == 0 and g.loc[1, "memory_util"] == 0
    assert g.loc[2, "compute_util"] == 1.2 and g.loc[2, "memory_util"] == 1.2
    assert len(kernel_power_features(np.array([]), np.array([]), np.array([]), "fp16", spec)) == 0


def test_missing_idle_power_is_a_stated_fraction_of_tdp():
    spec = resolve_device("A100-SXM4-80GB")
    assert spec.idle_power_w is None
    f = kernel_power_features(1e12, 1e9, 1.0, "bf16", spec)
    assert f.loc[0, "idle_w"] == pytest.approx(IDLE_FRACTION_OF_TDP * spec.tdp_w)
    assert bool(f.loc[0, "idle_is_default"])
    assert idle_power_w(spec) == pytest.approx(IDLE_FRACTION_OF_TDP * spec.tdp_w)
    given = dataclasses.replace(spec, idle_power_w=52.0)
    f2 = kernel_power_features(1e12, 1e9, 1.0, "bf16", given)
    assert f2.loc[0, "idle_w"] == 52.0 and not bool(f2.loc[0, "idle_is_default"])
    assert idle_power_w(given) == 52.0
    assert idle_power_w(spec) < comm_power_w(spec) < spec.tdp_w
    # descriptors that may be missing
    assert np.isnan(kernel_power_features(1.0, 1.0, 1.0, "fp32", dataclasses.replace(spec, process_node_nm=None))
                    .loc[0, "process_node_nm"])
    with pytest.raises(ValueError, match="tdp_w"):
        kernel_power_features(1.0, 1.0, 1.0, "fp32", dataclasses.replace(spec, tdp_w=None))


# ------------------------------------------------------------------------------------------- model
def test_power_monotone_in_utilisation(model):
    spec = resolve_device("A100-SXM4-80GB")
    u = np.linspace(0, 1.2, 49)
    for fixed in (0.0, 0.2, 0.6):
        w_c = model.predict_w(_feats(spec, u, fixed))[0]
        w_m = model.predict_w(_feats(spec, fixed, u))[0]
        assert np.all(np.diff(w_c) >= -1e-9) and np.all(np.diff(w_m) >= -1e-9)
        assert w_c[-1] > w_c[0] and w_m[-1] > w_m[0]


@pytest.mark.parametrize("name", DEVICES)
def test_power_within_idle_and_tdp(model, name):
    spec = resolve_device(name)
    rng = np.random.default_rng(1)
    f = _feats(spec, rng.uniform(0, 1.2, 300), rng.uniform(0, 1.2, 300), rng.choice(["fp32", "bf16", "fp16"]))
    w, lo, hi, ood = model.predict_w(f)
    idle = idle_power_w(spec)
    assert np.all(w >= idle - 1e-9) and np.all(w <= spec.tdp_w + 1e-9)
    assert np.all(lo <= w + 1e-9) and np.all(hi >= w - 1e-9)
    assert np.all(lo >= idle - 1e-9) and np.all(hi <= spec.tdp_w + 1e-9)
    assert ood.dtype == bool and len(ood) == 300
    # no activity draws idle
    assert model.predict_w(_feats(spec, 0.0, 0.0))[0][0] == pytest.approx(idle, rel=0.02)


def test_fallback_when_the_artifact_is_absent(tmp_path):
    m = load_power_model(str(tmp_path))
    assert m.fallback and m.form == "curve"
    f = _feats(resolve_device("A100-SXM4-80GB"), [0.1, 0.7], [0.3, 0.2])
    assert m.predict_w(f)[3].all()  # flagged


def test_save_load_roundtrip(tmp_path):
    m = PowerModel(form="curve", params={"a0": 0.0, "a_c": 1.7, "a_m": 2.2}, alpha=2.1, u_ref=0.9,
                   band_log=(-0.1, 0.12), support={"compute_util": (0.0, 0.9)}, meta={"x": 1})
    m.save(tmp_path)
    back = load_power_model(str(tmp_path))
    assert not back.fallback and back.params == m.params and back.alpha == 2.1 and back.u_ref == 0.9
    f = _feats(resolve_device("V100-PCIe-32GB"), [0.1, 0.5, 1.0], [0.1, 0.2, 0.1], "fp32")
    np.testing.assert_allclose(back.predict_w(f)[0], m.predict_w(f)[0])
    assert back.predict_w(f)[3].tolist() == [False, False, True]  # 1.0 is beyond the compute support
    assert json.loads((tmp_path / MANIFEST).read_text())["form"] == "curve"
    assert not list(tmp_path.glob(".*"))  # no temp files left behind


# --------------------------------------------------------------------------------- limits and clocks
def test_power_limit_lowers_power_and_slows_compute_bound_kernels(model):
    spec = resolve_device("A100-SXM4-80GB")
    t = np.array([2.0, 2.0])
    cu = np.array([0.85, 0.05])  # compute-bound, memory-bound
    f = _feats(spec, cu, [0.15, 0.9])
    p = model.predict_w(f)[0]
    assert np.all(p > 250)
    t2, p2 = apply_power_limit(t, p, 250.0, spec, cu, model=model)
    assert np.all(p2 < p) and np.all(p2 <= 250.0 + 1e-6)
    assert t2[0] > t[0] * 1.1  # compute-bound: ~1/clock
    assert t2[1] < t[1] * 1.05  # memory-bound: barely moves
    assert t2[0] / t[0] > t2[1] / t[1]
    # a tighter limit slows more and draws less
    t3, p3 = apply_power_limit(t, p, 180.0, spec, cu, model=model)
    assert t3[0] > t2[0] and np.all(p3 < p2)


def test_power_limit_above_draw_changes_nothing(model):
    spec = resolve_device("V100-PCIe-32GB")
    t, p = np.array([1.0, 3.0]), np.array([120.0, 200.0])
    t2, p2 = apply_power_limit(t, p, 250.0, spec, np.array([0.8, 0.2]), model=model)
    np.testing.assert_allclose(t2, t)
    np.testing.assert_allclose(p2, p)
    t3, p3 = apply_power_limit(t, p, None, spec, np.array([0.8, 0.2]), model=model)
    np.testing.assert_allclose(t3, t)
    with pytest.raises(ValueError):
        apply_power_limit(t, p, 0.0, spec, 0.5, model=model)


def test_clock_cap_moves_time_and_power(model):
    spec = resolve_device("H100-SXM5-80GB")
    t, p, cu = np.array([1.0]), np.array([600.0]), np.array([0.8])
    t2, p2 = apply_power_limit(t, p, None, spec, cu, model=model, clock_cap_mhz=spec.boost_clock_mhz * 0.7)
    assert t2[0] > 1.2 and p2[0] < 600
    idle = idle_power_w(spec)
    assert p2[0] == pytest.approx(idle + (600 - idle) * 0.7 ** model.alpha)
    # the same through apply_clock, and scalars work
    t3, p3 = apply_clock(1.0, 600.0, 0.7, spec, 0.8, model=model)
    assert float(t3) == pytest.approx(t2[0]) and float(p3) == pytest.approx(p2[0])
    # clock cap plus power limit: the tighter of the two wins
    t4, p4 = apply_power_limit(t, p, 300.0, spec, cu, model=model, clock_cap_mhz=spec.boost_clock_mhz * 0.9)
    assert p4[0] <= 300 + 1e-6 and t4[0] > 1.0


def test_clock_cap_lowers_wait_power_as_it_lowers_a_kernels(model):
    """Waiting (bubbles, exposed communication) is NCCL kernels polling on SMs at the clock: a clock cap lowers its
    dynamic part by the same ratio**alpha as any kernel's (models.power.comm_power_w), never below idle; until stop 55
    it kept the uncapped figure, above what the capped computation drew."""
    from wattcast.models.power import comm_power_w

    spec = resolve_device("H100-SXM5-80GB")
    idle, w = idle_power_w(spec), comm_power_w(spec)
    capped = comm_power_w(spec, clock_cap_mhz=spec.boost_clock_mhz * 0.5, model=model)
    assert capped == pytest.approx(idle + (w - idle) * 0.5 ** model.alpha) and idle < capped < w
    assert capped == pytest.approx(float(apply_clock(1.0, w, 0.5, spec, 0.0, model=model)[1]))
    assert comm_power_w(spec, clock_cap_mhz=spec.boost_clock_mhz * 2, model=model) == pytest.approx(w)  # not binding
    assert comm_power_w(spec, 150.0, spec.boost_clock_mhz * 0.5, model) == pytest.approx(min(capped, 150.0))


def test_a_capped_cluster_step_waits_below_its_capped_computation():
    """predict --cluster --clock-cap-mhz: the bubbles' and exposed communication's power (per_device wait_power_w)
    follows the cap; the step's time does not move with it (waits are not clock-bound). gpt2 on 16 H100s, tp2 pp4:
    at 1000 MHz busy 208 W beside waits of 224 W before the fix."""
    from wattcast import predict_cluster

    # host_us=0: the GPU's step. Since stop 56 eager PyTorch's launch queue (40 us a launch) makes this small-micro-batch
    # gpt2 host-bound: its busy time is then mostly launch gaps at idle power, below the waits' 224 W, and a cap's
    # slower kernels fill those gaps (the step does not move)
    kw = dict(model="gpt2", cluster="DGX-H100", gpus=16, tp=2, pp=4, batch=64, seq=1024, host_us=0)
    base = predict_cluster(**kw)
    cap = predict_cluster(**kw, clock_cap_mhz=1000)
    spec = resolve_device("H100-SXM5-80GB")
    for d0, d in zip(base.per_device, cap.per_device):
        # the uncapped wait at 1000 of 1980 MHz, as apply_clock moves any kernel at compute utilisation 0
        want = float(apply_clock(1.0, d0["wait_power_w"], 1000 / spec.boost_clock_mhz, spec, 0.0)[1])
        assert d["wait_power_w"] == pytest.approx(want)
        assert idle_power_w(spec) < d["wait_power_w"] < d["busy_power_w"] < d0["busy_power_w"]
    assert cap.step_time_ms > base.step_time_ms and cap.energy_j < base.energy_j


def test_prediction_code_does_not_import_training():
    code = ("import sys, wattcast.models.power, wattcast.featurize.power_features; "
            "bad = [m for m in sys.modules if m.startswith('wattcast.training')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------------------ e2e
@pytest.mark.e2e
def test_train_power_end_to_end(data_root, tmp_path):
    if not (data_root / "power").is_dir():
        pytest.skip("shared/datasets/power not available")
    from wattcast.training.power import run_train_power

    out = tmp_path / "artifacts"
    r = run_train_power(data=data_root, out_dir=out, use_mlflow=False, log=lambda *_: None)
    assert r["replaced"] and r["run_id"] is None
    s = r["summary"]
    assert {"device", "source", "chosen_mape_pct", "baseline_mape_pct"} <= set(s.columns)
    assert s["device"].nunique() >= 3
    m = r["metrics"]
    # leave-one-GPU-out beats TDP x utilisation, and the clock response is physical
    assert m["lodo_mean_gpu_mape_pct"] < m["baseline_tdp_x_util_mean_gpu_mape_pct"]
    assert 1.0 <= m["clock_alpha"] <= 3.5
    assert any(k.startswith("limit_zeus_") and k.endswith("_time_mape_pct") for k in m)
    trained = load_power_model(str(out))
    # installed as a version under power_versions/, made live by the POWER_CURRENT pointer
    assert not trained.fallback and (resolve_power_folder(out) / MANIFEST).is_file() and (out / "POWER_CURRENT").is_file()
    assert trained.alpha == pytest.approx(m["clock_alpha"])
    spec = resolve_device("A100-SXM4-40GB")
    w = trained.predict_w(_feats(spec, [0.05, 0.7], [0.1, 0.25]))[0]
    assert 60 <= w[0] < w[1] <= 400
    # the same data again: the gate lets an equal model through
    r2 = run_train_power(data=data_root, out_dir=out, use_mlflow=False, log=lambda *_: None)
    assert r2["replaced"], r2["reason"]
