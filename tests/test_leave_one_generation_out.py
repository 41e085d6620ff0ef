"""benchmarks/leave_one_generation_out.py: the per-(lhs, rhs, out) fp8 combination summary (pure function, synthetic
frame; the benchmark itself takes minutes and is not run here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import load_script

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "leave_one_generation_out.py"


@pytest.fixture(scope="module")
def logo():
    return load_script(BENCH, "leave_one_generation_out")


def _rows() -> pd.DataFrame:
    # device X: a kept same-format combination (two rows >= 1 GFLOP, one below) and a mixed one; device Y: one
    # combination with a reading above its peak. 2*1*1024*1024*1024 = 2.15 GFLOP, 2*1*256*256*256 = 0.03 GFLOP.
    return pd.DataFrame({
        "device": ["X", "X", "X", "X", "X", "Y"],
        "lhs_dtype": ["e4", "e4", "e4", "e4", "e5", "e4"],
        "rhs_dtype": ["e4", "e4", "e4", "e5", "e4", "e4"],
        "out_dtype": ["bf16"] * 6,
        "kept": [True, True, True, False, False, True],
        "B": [1.0] * 6,
        "M": [1024.0, 1024.0, 256.0, 1024.0, 1024.0, 1024.0],
        "N": [1024.0, 1024.0, 256.0, 1024.0, 1024.0, 1024.0],
        "K": [1024.0, 1024.0, 256.0, 1024.0, 1024.0, 1024.0],
        "latency_ms": [1.0, 2.0, 1.0, 1.0, 1.0, 1.0],
        "tflops": [400.0, 200.0, 450.0, 900.0, 800.0, 1200.0],
    })


def test_fp8_combination_table_groups_and_summarises(logo):
    rows = _rows()
    pred_ms = np.array([0.5, 1.0, 100.0, 1.2, 0.9, 1.0])  # the 0.03 GFLOP row's error must not count
    peak = np.array([1000.0] * 5 + [1100.0])
    t = logo.fp8_combination_table(rows, pred_ms, peak, "fold", "m")
    assert list(t[["device", "lhs", "rhs"]].itertuples(index=False, name=None)) == [
        ("X", "e4", "e4"), ("X", "e4", "e5"), ("X", "e5", "e4"), ("Y", "e4", "e4")]
    same = t.iloc[0]
    assert bool(same.kept) and same.rows == 2
    assert same.mape_pct == pytest.approx(50.0) and same.bias_pct == pytest.approx(-50.0)
    assert same.best_tflops == pytest.approx(450.0)  # best at any size
    assert same.best_over_peak == pytest.approx(0.45) and same.rows_over_peak == 0
    mixed = t.iloc[1]
    assert not bool(mixed.kept) and mixed.mape_pct == pytest.approx(20.0) and mixed.bias_pct == pytest.approx(20.0)
    assert t.iloc[2].bias_pct == pytest.approx(-10.0) and t.iloc[2].best_over_peak == pytest.approx(0.8)
    y = t.iloc[3]
    assert y.rows_over_peak == 1 and y.best_over_peak == pytest.approx(1200.0 / 1100.0)
    assert set(t["fold"]) == {"fold"} and set(t["model"]) == {"m"}


def test_fp8_metric_key_follows_the_cell_naming(logo):
    # rows as DataFrame.itertuples yields them (main() builds the keys that way)
    r = next(pd.DataFrame({"model": ["bundle+floor-blend/ceiling-member"], "device": ["MI355X"], "lhs": ["f8e4m3fn"],
                           "rhs": ["f8e5m2"], "out": ["bf16"]}).itertuples())
    cell = next(pd.DataFrame({"model": [r.model], "device": ["MI355X"], "dtype": ["fp8"], "source": ["xla"],
                              "size": [">= 1 GFLOP"]}).itertuples())
    assert logo.metric_key(cell, "mape_pct") == "bundle_plus_floor-blend_over_ceiling-member_MI355X_fp8_xla_big_mape_pct"
    assert (logo.fp8_metric_key(r, "mape_pct")
            == "bundle_plus_floor-blend_over_ceiling-member_MI355X_fp8_f8e4m3fn_f8e5m2_bf16_xla_big_mape_pct")


def test_bound_table_splits_by_roofline_side_and_reports_fractions(logo):
    # three GEMMs of 2 x 1024^3 = 2.15 GFLOP and one of 0.03 GFLOP (left out); device X: two compute-bound rows
    # (t_compute > t_mem) and one memory-bound one
    df = pd.DataFrame({"device": ["X", "X", "X", "X"], "dtype": ["bf16"] * 4, "B": [1.0] * 4,
                       "M": [1024.0, 1024.0, 1024.0, 256.0], "N": [1024.0, 1024.0, 1024.0, 256.0],
                       "K": [1024.0, 1024.0, 1024.0, 256.0], "latency_ms": [1.0, 2.0, 1.0, 1.0]})
    pred = np.array([0.8, 2.4, 0.5, 9.0])
    tc = np.array([0.5, 0.5, 0.1, 0.1])
    tm = np.array([0.2, 0.2, 0.4, 0.01])
    t = logo.bound_table(df, pred, tc, tm, "fold", "m")
    assert list(t["bound"]) == ["compute", "memory"] and list(t["rows"]) == [2, 1]
    c, m = t.iloc[0], t.iloc[1]
    assert c.mape_pct == pytest.approx(20.0) and c.bias_pct == pytest.approx(0.0)  # -20% and +20%
    assert c.peak_frac_measured == pytest.approx((0.5 + 0.25) / 2)  # 0.5 / 1 and 0.5 / 2
    assert c.peak_frac_predicted == pytest.approx((0.5 / 0.8 + 0.5 / 2.4) / 2)
    assert m.bias_pct == pytest.approx(-50.0) and m.bw_frac_measured == pytest.approx(0.4)
    assert m.bw_frac_predicted == pytest.approx(0.8)
    assert set(t["fold"]) == {"fold"} and set(t["model"]) == {"m"}


def test_folds_hold_out_every_training_gpu_of_their_generations(logo):
    """A fold leaves its whole generation out (the spec's ``arch``, as training/generation_calibration.py folds the
    shipped band): until stop 53 the Ampere fold kept the A40 (Vidur's other Ampere GPU) in training."""
    from wattcast.data.catalog import resolve_device
    from wattcast.data.device_spec import generation_of
    from wattcast.models.kernel_bundle import load_bundle

    training = load_bundle().train_devices
    gen = {d: generation_of(resolve_device(d)) for d in training}
    assert gen["A40"] == gen["A100-SXM4-80GB"]  # the case the test is about
    for fold, devices in logo.FOLDS.items():
        held = {generation_of(resolve_device(d if d != "A100-80GB-unknown" else "A100-SXM4-80GB")) for d in devices}
        missing = sorted(d for d in training if gen[d] in held and d not in devices)
        assert not missing, f"{fold} keeps {missing} of its own generation in training"


def test_fold_floors_give_an_unseen_source_the_predictors_floor(logo):
    from wattcast.models.gemm_floor import PREDICT_SOURCE

    fitted = {PREDICT_SOURCE: 0.006, "neusight/kernels": 0.032, "deepbench": 0.010}
    out = logo.fold_floors_ms(fitted, ["vidur", "deepbench", PREDICT_SOURCE, "vidur"])
    assert out["vidur"] == pytest.approx(0.006)  # not the median of the fitted floors (0.010)
    assert {k: out[k] for k in fitted} == fitted  # the fitted floors untouched
    assert fitted == {PREDICT_SOURCE: 0.006, "neusight/kernels": 0.032, "deepbench": 0.010}  # the input not mutated


def test_fold_floors_name_a_missing_predictor_source(logo):
    with pytest.raises(ValueError, match="predictor's source"):
        logo.fold_floors_ms({"vidur": 0.004}, ["vidur", "deepbench"])
