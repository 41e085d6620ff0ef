"""The Python API refuses an optimizer or a recomputation in an inference step, as the CLI does (one shared check:
featurize.workload.check_training_only_options); the user audit had wattcast.predict(..., mode='inference',
recompute='full') return settings.recompute 'full' for a forward pass."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.featurize.workload import check_training_only_options
from wattcast.request import PredictRequest

from conftest import flat, run_cli


@pytest.mark.parametrize("kw", [dict(optimizer="sgd"), dict(recompute="full"), dict(recompute="selective")])
def test_predict_refuses_training_options_in_inference(kw):
    with pytest.raises(ValueError, match="describe a training step; mode='inference' runs the forward pass only"):
        wattcast.predict("gpt2", "H100", mode="inference", seq=64, **kw)


def test_predict_request_refuses_them_too():
    with pytest.raises(ValueError, match="describe a training step"):
        PredictRequest(model="gpt2", device="H100", mode="inference", optimizer="sgd", seq=64).predict()


def test_inference_without_them_still_runs():
    for kw in ({}, dict(optimizer="none"), dict(recompute="none")):
        assert wattcast.predict("gpt2", "H100", mode="inference", seq=64, **kw).step_time_ms > 0
    assert PredictRequest(model="gpt2", device="H100", mode="inference", seq=64).predict().step_time_ms > 0


def test_the_cli_and_the_check_agree():
    with pytest.raises(ValueError, match="--optimizer and --recompute"):
        check_training_only_options("inference", "adamw", "none", names="--optimizer and --recompute")
    check_training_only_options("train", "sgd", "full")
    r = run_cli("predict", "-m", "gpt2", "-d", "H100", "--mode", "inference", "--optimizer", "sgd")
    assert r.returncode == 2 and "--optimizer and --recompute describe a training step" in flat(r.stderr)
