"""`wattcast predict` parses its flags into one PredictRequest and calls the Python API with it: its JSON is the
Python API's result for the same request (one device and a cluster), its flags map onto the request's fields, and a
request that would ignore an option is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

import wattcast
import wattcast.cli as cli
from conftest import flat, run_cli
from wattcast.request import ParallelOptions, PredictRequest, RunOptions, StepTokensUnknownError

STRATEGY = "tp2-pp1-dp4-cp1-ep1-mb2-ga2-zero1-v1-sp-rcnone-1f1b"


def _api_json(res) -> str:
    """The prediction as `predict --json` prints it."""
    return json.dumps(res.to_dict(), indent=2, default=str)


def _cli_json(*args) -> str:
    r = run_cli("predict", *args, "--json")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _same(cli_out: str, api_out: str) -> None:
    """The same JSON: keys in the same order, every string, count and flag equal, every float equal up to 1e-6
    relative (a process that predicted other steps first holds kernel times predicted in other batches: in one test
    session they differed in the 9th digit)."""
    def walk(a, b, path="$"):
        assert type(a) is type(b), f"{path}: {a!r} vs {b!r}"
        if isinstance(a, dict):
            assert list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}"
            for k in a:
                walk(a[k], b[k], f"{path}.{k}")
        elif isinstance(a, list):
            assert len(a) == len(b), f"{path}: {len(a)} vs {len(b)} items"
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{path}[{i}]")
        elif isinstance(a, float):
            assert a == pytest.approx(b, rel=1e-6, abs=1e-12, nan_ok=True), f"{path}: {a!r} vs {b!r}"
        else:
            assert a == b, f"{path}: {a!r} vs {b!r}"

    walk(json.loads(cli_out), json.loads(api_out))


# ------------------------------------------------------------------------------ CLI JSON == Python API result
def test_cli_json_is_the_python_api_result_on_one_device():
    cli_out = _cli_json("-m", "gpt2", "-d", "A100-SXM4-80GB", "-b", "4", "-s", "512", "--tokens", "1e9",
                        "--region", "DEU", "--pue", "1.1")
    res = wattcast.predict("gpt2", "A100-SXM4-80GB", batch=4, seq=512, tokens=1e9, region="DEU", pue=1.1)
    assert res.run is not None and "run" in json.loads(cli_out)
    _same(cli_out, _api_json(res))


def test_cli_json_is_the_python_api_result_on_a_cluster():
    cli_out = _cli_json("-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", "--tp", "2", "--zero", "1", "--batch", "16",
                        "--seq", "512", "--tokens", "1e9")
    res = wattcast.predict_cluster("gpt2", "DGX-A100", gpus=8, tp=2, zero=1, batch=16, seq=512, tokens=1e9)
    assert res.parallel.tp == 2 and res.parallel.dp == 4 and res.run is not None
    _same(cli_out, _api_json(res))


def test_cli_strategy_json_is_the_python_api_strategy_result():
    cli_out = _cli_json("-m", "gpt2", "--cluster", "DGX-A100", "--strategy", STRATEGY, "--seq", "512")
    res = wattcast.predict_cluster("gpt2", "DGX-A100", strategy=STRATEGY, seq=512)
    assert json.loads(cli_out)["parallel"]["name"] == res.parallel.describe()
    _same(cli_out, _api_json(res))


def test_a_request_predicts_what_the_api_call_predicts():
    req = PredictRequest("gpt2", "L4", batch=2, seq=256, mode="inference", optimizer="none")
    a, b = req.predict(), wattcast.predict("gpt2", "L4", batch=2, seq=256, mode="inference", optimizer="none")
    assert a.step_time_ms == b.step_time_ms > 0 and _api_json(a) == _api_json(b)


# ------------------------------------------------------------------------------ flags -> one request
@pytest.fixture
def parsed(monkeypatch):
    """Run `predict` in-process up to the API call and return the request it built (nothing is predicted)."""
    seen = []

    def capture(req):
        seen.append(req)
        raise typer.Exit(0)

    monkeypatch.setattr(cli, "_request_prediction", capture)

    def parse(*args):
        r = CliRunner().invoke(cli.app, ["predict", *map(str, args)])
        assert r.exit_code == 0 and not (r.exception and not isinstance(r.exception, SystemExit)), r.output
        return seen.pop()

    return parse


def test_single_device_flags_make_one_request(parsed):
    req = parsed("-m", "gpt2", "-d", "L4", "-b", "8", "--dim", "past=3", "--tokens", "1e9", "--region", "DEU",
                 "--mtbf-gpu-hours", "5e4", "--power-limit-w", "200", "--compile", "--recompute", "full")
    assert req == PredictRequest("gpt2", "L4", batch=8, dims=(("past", 3),), compile=True, recompute="full",
                                 power_limit_w=200.0, run=RunOptions(tokens=1e9, region="DEU", mtbf_gpu_hours=5e4))
    assert not req.distributed
    # the flags' defaults are the Python API's (simulate/defaults.py)
    assert parsed("-m", "gpt2", "-d", "L4") == PredictRequest("gpt2", "L4")


def test_cluster_flags_make_one_request(parsed):
    req = parsed("-m", "llama3_8b", "--cluster", "DGX-H100", "--gpus", "16", "--tp", "4", "--pp", "2", "--sp",
                 "--framework", "megatron", "--batch", "32", "--no-overlap-grad-reduce", "--trace", "unused.json")
    assert req == PredictRequest("llama3_8b", cluster="DGX-H100", batch=32, seq=1024, framework="megatron", timeline=True,
                                 parallel=ParallelOptions(gpus=16, tp=4, pp=2, sp=True, overlap_grad_reduce=False))
    # without --gpus the job is tp x pp x dp GPUs, and the global batch defaults to 1
    req = parsed("-m", "gpt2", "--cluster", "DGX-A100", "--tp", "2", "--pp", "2")
    assert req.parallel.gpus == 4 and req.batch == 1 and req.seq == 1024 and not req.timeline


def test_strategy_flag_fills_the_request(parsed):
    req = parsed("-m", "gpt2", "--cluster", "DGX-A100", "--strategy", STRATEGY)
    assert req.parallel == ParallelOptions(gpus=8, tp=2, dp=4, micro_batch=2, zero=1, sp=True)
    assert req.batch == 2 * 2 * 4 and req.recompute == "none"


@pytest.mark.parametrize("flag", ["--batch", "--seq"])
def test_cluster_zero_batch_or_seq_is_refused_naming_the_flag(flag):
    # these were silently run as --batch 1 / --seq 1024
    r = CliRunner().invoke(cli.app, ["predict", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", flag, "0"])
    assert r.exit_code == 2 and f"{flag} must be at least 1, got 0" in flat(r.output)


# ------------------------------------------------------------------------------ requests that would ignore an option
@pytest.mark.parametrize("req, needle", [
    (PredictRequest("gpt2", "L4", parallel=ParallelOptions(gpus=8)), "give cluster= too"),
    (PredictRequest("gpt2", "L4", framework="megatron"), "give cluster= too"),
    (PredictRequest("gpt2", cluster="DGX-A100", batch=8), "needs parallel="),
    (PredictRequest("gpt2", cluster="DGX-A100", batch=8, mode="inference", parallel=ParallelOptions(gpus=8)),
     "training steps"),
    (PredictRequest("gpt2", cluster="DGX-A100", batch=8, dims=(("a", 1),), parallel=ParallelOptions(gpus=8)), "dims="),
])
def test_a_request_that_would_ignore_an_option_is_refused(req, needle):
    with pytest.raises(ValueError, match=needle):
        req.predict()


def test_run_options_without_tokens_are_refused():
    assert RunOptions(region="DEU", pue=1.1).given_without_tokens() == ["region", "pue"]
    assert RunOptions(tokens=1e9, region="DEU").given_without_tokens() == []
    with pytest.raises(ValueError, match="give tokens= too"):
        PredictRequest("gpt2", "L4", run=RunOptions(region="DEU")).predict()


def test_tokens_on_a_graph_without_batch_and_sequence_dims(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((64, 128), np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [128, 128])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "fixed", [x], [y], [w])
    f = tmp_path / "fixed.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(f))
    with pytest.raises(StepTokensUnknownError):
        wattcast.predict(str(f), "A10", tokens=1e9)
    r = CliRunner().invoke(cli.app, ["predict", "-m", str(f), "-d", "A10", "--tokens", "1e9"])
    assert r.exit_code == 2 and "--tokens needs the step's tokens: this ONNX graph's batch and sequence dims are fixed" \
        in flat(r.output)


def test_run_options_are_the_python_api_run_options():
    from dataclasses import fields

    assert {f.name for f in fields(RunOptions)} - {"tokens"} <= set(wattcast.RUN_OPTIONS)
    assert RunOptions(tokens=1e9, pue=1.1).kwargs() == {"tokens": 1e9, "pue": 1.1}


def test_predict_cluster_fills_the_parallel_options_defaults():
    from wattcast.request import parallel_defaults

    assert parallel_defaults() == dict(tp=1, pp=1, zero=0, sp=False, ep=1, interleave=1, schedule="1f1b", cp=1,
                                   recompute_method="block")
    with pytest.raises(ValueError, match="--zero must be 0, 1, 2 or 3"):
        wattcast.predict_cluster("gpt2", "DGX-A100", gpus=8, batch=8, zero=7)
