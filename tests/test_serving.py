"""A serving engine's decode iteration (``serving="vllm"``, ``simulate/serving.py``): off changes nothing, on adds the
fitted host time (a + b x batch, in series) and the amortised prefill, bad values are clear errors, and the shipped
constants are what ``training/serving_fit.py`` fits on half A of ML.ENERGY v2's models."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

import wattcast
from conftest import flat, run_cli
from wattcast.simulate import serving as sv
from wattcast.training import serving_fit
from wattcast.validation.serving_terms import gpu_terms

A100 = "A100-SXM4-40GB"
MODEL = "gemma_2b"  # CodeGemma 2B's architecture, the smallest of the validation's models


def _decode(batch=64, context=300, **kw):
    return wattcast.predict(MODEL, A100, batch=batch, seq=1, mode="inference", dtype="bf16", attention="flash",
                            kv_context=context, **kw)


def _served(batch=64, context=300, prompt=128, output=240, **kw):
    return _decode(batch, context, serving="vllm", prompt_tokens=prompt, output_tokens=output, **kw)


def test_off_is_bit_identical_and_on_keeps_the_gpu_step():
    """Default and serving=None give the same JSON, with no serving key anywhere; on, the GPU step inside the
    iteration is the off step, bit for bit."""
    default, none = _decode(), _decode(serving=None)
    a, b = default.to_dict(), none.to_dict()
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
    assert "serving" not in a and "serving" not in a["settings"]
    assert not any(k.startswith("serving") for k in a["overheads"])
    on = _served()
    # since stop 56 the off step is eager transformers' (a launch queue at 40 us a launch, host-bound here) and the
    # served one vLLM's GPU step as its serving fit had it (CUDA graphs: max(GPU, 6 us) per kernel), the same graph
    bare = _bare_gpu_step()
    assert on.meta["serving"]["gpu_step_ms"] == bare.step_time_ms + default.overheads.get("data_loading_ms", 0.0)
    assert on.meta["serving"]["gpu_step_ms"] < default.step_time_ms < on.step_time_ms


def _bare_gpu_step(batch=64, context=300):
    """The decode step as the served iteration costs its GPU step (``step_host_cost(served=True)``)."""
    from wattcast.data.catalog import resolve_device
    from wattcast.featurize.workload import StepOptions, step_graph
    from wattcast.simulate.single_device import predict_graph, step_host_cost

    g = step_graph(MODEL, StepOptions(batch=batch, seq=1, mode="inference", dtype="bf16", attention="flash",
                                      kv_context=context, fused_moe=True))
    launch_ms, host_model = step_host_cost(served=True)
    assert host_model == "max"
    return predict_graph(g, resolve_device(A100), launch_overhead_ms=launch_ms, host_model=host_model)


def test_iteration_is_gpu_plus_host_plus_prefill_in_series():
    c = sv.serving_constants("vllm")
    assert c["host_overlaps_gpu"] is False  # vLLM v0.x: synchronous engine
    on = _served(batch=64, output=240)
    s = on.meta["serving"]
    assert s["host_ms"] == pytest.approx(c["host_fixed_ms"] + 64 * c["host_per_seq_ms"], rel=1e-12)
    assert on.step_time_ms == pytest.approx(s["gpu_step_ms"] + s["host_ms"] + s["prefill_ms"], rel=1e-12)
    assert on.ms_per_token == on.step_time_ms
    assert on.overheads["serving_host_ms"] == s["host_ms"] and on.overheads["serving_prefill_ms"] == s["prefill_ms"]
    assert on.to_dict()["serving"]["engine"] == "vllm" and on.to_dict()["settings"]["serving"] == "vllm"
    # 64 / 240 requests per iteration: one request's 128-token prefill, a 0.267 share of it per iteration
    assert s["prefill_requests"] == 1
    assert s["prefill_ms"] == pytest.approx(s["prefill_step_ms"] * 64 / 240, rel=1e-12)
    # the GPU idles through the host time: energy grows, power falls (against the served GPU step alone: since stop 56
    # the off step is eager transformers', host-bound, idling more)
    off = _bare_gpu_step(batch=64)
    assert on.energy_j > off.energy_j and on.avg_power_w < off.avg_power_w


def test_tpot_grows_with_batch_at_the_fitted_slope():
    """Host time grows by exactly host_per_seq_ms a sequence; the whole TPOT by at least that."""
    c = sv.serving_constants("vllm")
    lo, hi = _served(batch=128), _served(batch=512)
    d_host = hi.meta["serving"]["host_ms"] - lo.meta["serving"]["host_ms"]
    assert d_host == pytest.approx(c["host_per_seq_ms"] * (512 - 128), rel=1e-9)
    assert c["host_per_seq_ms"] > 0
    assert hi.ms_per_token - lo.ms_per_token >= c["host_per_seq_ms"] * (512 - 128)
    # several requests arrive per iteration at 512 / 240: their prefills run together
    assert hi.meta["serving"]["prefill_requests"] == 3


def test_overlapped_host_takes_the_longer_of_the_two():
    assert sv.iteration_ms(10.0, 4.0, 1.0, host_overlaps_gpu=True) == 11.0
    assert sv.iteration_ms(10.0, 14.0, 1.0, host_overlaps_gpu=True) == 15.0
    assert sv.iteration_ms(10.0, 4.0, 1.0, host_overlaps_gpu=False) == 15.0


@pytest.mark.parametrize("kw, msg", [
    (dict(serving="sglang", prompt_tokens=128, output_tokens=240), "must be one of vllm"),
    (dict(serving="vllm", prompt_tokens=128), "output_tokens is missing"),
    (dict(serving="vllm", prompt_tokens=0, output_tokens=240), "prompt_tokens"),
    (dict(serving="vllm", prompt_tokens=128, output_tokens=-5), "output_tokens"),
    (dict(serving="vllm", prompt_tokens=128, output_tokens=2.5), "output_tokens"),
    (dict(prompt_tokens=128, output_tokens=240), "give serving='vllm'"),
])
def test_bad_values_are_clear_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        _decode(**kw)


def test_serving_needs_a_decode_step_and_a_positive_batch():
    with pytest.raises(ValueError, match="kv_context"):
        wattcast.predict(MODEL, A100, batch=8, seq=1, mode="inference", serving="vllm", prompt_tokens=128,
                         output_tokens=240)
    with pytest.raises(ValueError, match="seq .* must be 1"):
        wattcast.predict(MODEL, A100, batch=8, seq=4, mode="inference", kv_context=100, serving="vllm",
                         prompt_tokens=128, output_tokens=240)
    with pytest.raises(ValueError, match="batch"):
        _served(batch=-3)
    with pytest.raises(ValueError, match="batch"):
        sv.check_batch(0)


def test_cli_serving_line_and_errors():
    ok = run_cli("predict", "--model", MODEL, "--device", A100, "--mode", "inference", "--batch", "64", "--seq", "1",
                 "--kv-context", "300", "--serving", "vllm", "--prompt-tokens", "128", "--output-tokens", "240", "--json")
    assert ok.returncode == 0, ok.stderr
    d = json.loads(ok.stdout)
    assert d["serving"]["engine"] == "vllm" and d["ms_per_token"] == pytest.approx(
        d["serving"]["gpu_step_ms"] + d["serving"]["host_ms"] + d["serving"]["prefill_ms"])
    bad = run_cli("predict", "--model", MODEL, "--device", A100, "--mode", "inference", "--batch", "64", "--seq", "1",
                  "--kv-context", "300", "--serving", "vllm", "--prompt-tokens", "128")
    assert bad.returncode != 0 and "output_tokens is missing" in flat(bad.stdout + bad.stderr)


def test_fit_recovers_known_constants():
    """fit_host on synthetic rows made with a = 2 ms, b = 0.25 ms a sequence gives them back."""
    batch = np.array([32, 64, 128, 256, 512, 1024], dtype=float)
    gpu, pre = 10 + 0.03 * batch, 0.02 * batch
    a, b = serving_fit.fit_host(batch, gpu, pre, gpu + pre + 2.0 + 0.25 * batch)
    assert a == pytest.approx(2.0, abs=1e-9) and b == pytest.approx(0.25, abs=1e-12)


def test_shipped_constants_and_provenance():
    c = sv.serving_constants("vllm")
    p = c["provenance"]
    assert p["fit_models"] == list(serving_fit.HALVES["A"])
    assert not set(p["fit_models"]) & set(p["evaluation_models"])
    assert set(p["fit_models"]) | set(p["evaluation_models"]) == set(serving_fit.MODELS)
    assert all(math.isfinite(c[k]) and c[k] >= 0 for k in ("host_fixed_ms", "host_per_seq_ms"))


_DATA = Path(os.environ.get("WATTCAST_DATA", "/work/shared/datasets")) / serving_fit.DATA_FILE


@pytest.mark.skipif(not _DATA.is_file(), reason="needs the ML.ENERGY v2 table")
def test_refit_on_half_a_gives_the_shipped_constants():
    """The shipped constants are training/serving_fit.py's fit on half A's rows only (20 rows of three models)."""
    t = serving_fit.rows()
    assert len(t) == 32 and (t["half"] == "A").sum() == 20
    a_rows = gpu_terms(t[t["half"] == "A"])
    a, b = serving_fit.fit_host(a_rows["batch"], a_rows["gpu_step_ms"], a_rows["prefill_ms"], a_rows["measured_ms"])
    c = sv.serving_constants("vllm")
    assert a == pytest.approx(c["host_fixed_ms"], abs=1e-5) and b == pytest.approx(c["host_per_seq_ms"], abs=1e-6)


def test_a_served_step_without_seq_is_a_decode_iteration():
    """serving without seq= is one new token per sequence, not the default 1,024-token step (it priced a 4.8 s
    'decode iteration' before)."""
    implicit = wattcast.predict(MODEL, A100, batch=64, mode="inference", dtype="bf16", attention="flash", kv_context=300,
                                serving="vllm", prompt_tokens=128, output_tokens=240)
    assert implicit.meta["settings"]["seq"] == 1
    assert implicit.step_time_ms == _served().step_time_ms


def test_the_prefill_brings_its_warnings_and_working_set():
    """A prompt beyond the model's positions warns as a plain prefill does; the prefill's activations and working
    set replace the decode step's while it runs (weights and the running sequences' cache stay)."""
    long = _served(batch=1, context=20_000, prompt=20_000)
    plain = wattcast.predict(MODEL, A100, batch=1, seq=20_000, mode="inference", dtype="bf16", attention="flash",
                             kv_context=0)
    beyond = [w for w in plain.meta["warnings"] if "max_position_embeddings" in w]
    assert beyond and any(beyond[0] in w and w.startswith("serving prefill") for w in long.meta["warnings"])
    decode = _decode(batch=1, context=20_000)
    assert long.memory.kv_cache_gb == decode.memory.kv_cache_gb and long.memory.weights_gb == decode.memory.weights_gb
    assert long.memory.transient_gb == max(decode.memory.transient_gb, plain.memory.transient_gb)
    assert long.memory_gb > decode.memory_gb


@pytest.mark.parametrize("call", ["python", "cli"])
def test_a_context_shorter_than_the_prompt_is_refused(call):
    """A running sequence's cache holds its prompt: kv_context 10 with 8,000-token prompts costed a 10-token cache
    (Llama 3 8B on H100, batch 8: 22.75 ms, no warning)."""
    if call == "python":
        with pytest.raises(ValueError, match=r"kv_context \(--kv-context\) 10 \+ 1 new token is shorter than "
                                             r"prompt_tokens \(--prompt-tokens\) 8000.*kv_context >= 7999"):
            _served(batch=8, context=10, prompt=8_000, output=500)
        # the prompt's last token may be the step's new one
        assert _served(batch=8, context=7_999, prompt=8_000, output=500).step_time_ms > 0
    else:
        r = run_cli("predict", "--model", MODEL, "--device", A100, "--mode", "inference", "--batch", "8", "--seq", "1",
                    "--kv-context", "10", "--serving", "vllm", "--prompt-tokens", "8000", "--output-tokens", "500")
        assert r.returncode != 0 and "shorter than prompt_tokens" in flat(r.stdout + r.stderr)
