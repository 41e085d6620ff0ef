"""benchmarks/fit_framework_overhead.py's --host-model: the megatron-deepspeed preset's host model is set for the fit
and restored after it (the grid itself predicts the vTrain fitting half and is not run here)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from conftest import load_script
from wattcast.simulate.distributed import FRAMEWORK_HOST_MODEL

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "fit_framework_overhead.py"


@pytest.fixture(scope="module")
def fit_script():
    return load_script(BENCH, "fit_framework_overhead")


def _row() -> pd.DataFrame:
    """One vTrain-shaped single-node run (the columns load_vtrain gives): GPT hidden 1,024, 12 layers, TP2, micro-batch
    2 of a batch of 8; host-bound at 72.5 us per kernel (vTrain's plateau: its short kernels are many). measured_ms is
    a placeholder: only the predictions are compared."""
    return pd.DataFrame([dict(gpus=2, batch=8, micro_batch=2, hidden=1024, heads=16, layers=12, seq=1024, tp=2, dp=1,
                              pp=1, measured_ms=190.0)])


def test_host_model_is_set_for_the_fit_and_restored(fit_script):
    from wattcast.validation.distributed_validation import predict_vtrain

    shipped = FRAMEWORK_HOST_MODEL["megatron-deepspeed"]
    other = "queue" if shipped == "max" else "max"
    before = float(predict_vtrain(_row(), host_ms=(0.0725, 2.5))["predicted_ms"].iloc[0])
    with fit_script.host_model(other):
        assert FRAMEWORK_HOST_MODEL["megatron-deepspeed"] == other
        during = float(predict_vtrain(_row(), host_ms=(0.0725, 2.5))["predicted_ms"].iloc[0])
    assert FRAMEWORK_HOST_MODEL["megatron-deepspeed"] == shipped
    after = float(predict_vtrain(_row(), host_ms=(0.0725, 2.5))["predicted_ms"].iloc[0])
    # the queue lets the host run ahead through the kernels longer than its launch cost, which the per-kernel max
    # charges in full: the two compose the same costs into different step times, and the shipped one comes back
    assert abs(during - before) > 1e-3 * before
    assert after == pytest.approx(before, rel=1e-12)


def test_host_model_restored_after_an_error_and_checked(fit_script):
    shipped = FRAMEWORK_HOST_MODEL["megatron-deepspeed"]
    with pytest.raises(RuntimeError, match="inside"):
        with fit_script.host_model("queue"):
            raise RuntimeError("inside")
    assert FRAMEWORK_HOST_MODEL["megatron-deepspeed"] == shipped
    with pytest.raises(ValueError, match="--host-model"):
        with fit_script.host_model("lifo"):
            pass
    assert FRAMEWORK_HOST_MODEL["megatron-deepspeed"] == shipped
