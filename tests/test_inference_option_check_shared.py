"""One check of the training-only options an inference step refuses, shared by ``wattcast predict`` and the Python
API (``wattcast.request.check_inference_options``): before it, ``wattcast.predict(mode='inference',
grad_accumulation=True)`` and ``wattcast.predict_cluster(kv_context=..., optimizer='sgd')`` ran (the option silently
ignored), and PredictRequest refused ``optimizer_impl=`` with a message of its own."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.request import PredictRequest, ParallelOptions, check_inference_options

from conftest import flat, run_cli

_IMPL_API = "optimizer_impl= (the optimizer step's kernels) describes a training step; mode='inference' runs the forward pass only"
_IMPL_CLI = "--optimizer-impl (the optimizer step's kernels) describes a training step; --mode inference runs the forward pass only"


def test_one_message_per_interface():
    with pytest.raises(ValueError) as api:
        check_inference_options("inference", optimizer_impl="fused")
    with pytest.raises(ValueError) as cli:
        check_inference_options("inference", optimizer_impl="fused", cli=True)
    assert str(api.value) == _IMPL_API and str(cli.value) == _IMPL_CLI
    check_inference_options("train", optimizer="sgd", optimizer_impl="fused", recompute="full", grad_accumulation=True)


def test_cli_and_api_refuse_optimizer_impl_alike():
    r = run_cli("predict", "-m", "gpt2", "-d", "H100", "--mode", "inference", "--optimizer-impl", "fused")
    assert r.returncode == 2 and _IMPL_CLI in flat(r.stderr)
    with pytest.raises(ValueError, match="^" + _IMPL_API.replace("(", r"\(").replace(")", r"\)") + "$"):
        wattcast.predict("gpt2", "H100", mode="inference", seq=64, optimizer_impl="fused")


def test_predict_refuses_grad_accumulation_in_inference():
    with pytest.raises(ValueError, match="grad_accumulation= .* describes a training step; mode='inference'"):
        wattcast.predict("gpt2", "H100", mode="inference", seq=64, grad_accumulation=True)


def test_kv_cached_cluster_inference_refuses_an_optimizer():
    with pytest.raises(ValueError, match="optimizer= and recompute= describe a training step"):
        wattcast.predict_cluster("gpt2", "dgx-h100", gpus=1, tp=1, batch=1, seq=1, kv_context=16, optimizer="sgd")


def test_request_kv_cached_cluster_refuses_optimizer_impl_with_the_shared_message():
    req = PredictRequest(model="gpt2", cluster="dgx-h100", mode="inference", kv_context=16, seq=1,
                         parallel=ParallelOptions(gpus=1, tp=1), optimizer_impl="fused")
    with pytest.raises(ValueError) as e:
        req.predict()
    assert str(e.value) == _IMPL_API
