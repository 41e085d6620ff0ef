"""A serving engine around a KV-cached decode step: what a decode iteration costs beyond the bare GPU step.

``wattcast.predict(..., kv_context=N, seq=1, serving="vllm")`` (CLI ``--serving vllm``) turns the one-device decode
step into one iteration of a continuously-batched serving engine with ``batch`` running sequences:

    iteration_ms = gpu_step_ms + host_ms + prefill_ms
    host_ms      = host_fixed_ms + host_per_seq_ms x batch            (in series with the GPU step)
    prefill_ms   = prefill_step_ms(k, prompt_tokens) x (batch / output_tokens) / k,  k = ceil(batch / output_tokens)

- ``host_ms``: the engine's host work per iteration (scheduling, block tables, input preparation, sampling and
  detokenisation, per-request Python bookkeeping). vLLM's v0.x engine runs it synchronously: the GPU waits while
  the host prepares the next iteration and processes the last one's outputs, so it adds to the GPU step
  (``host_overlaps_gpu`` false in the artifact). The ML.ENERGY v2 data that the constants are fitted on does not
  state its vLLM version (``$WATTCAST_DATA/power/SOURCE-mlenergy-inference-power.md``); a v0.x engine is ASSUMED (the
  V1 engine, which overlaps host work with the GPU, became vLLM's default only in 0.8.0).
- ``prefill_ms``: continuous batching admits a new request when one finishes; in steady state ``batch /
  output_tokens`` requests finish (and as many start) per decode iteration, and vLLM v0 (no chunked prefill) runs
  their prompts' prefill as its own iteration while the decoding sequences wait. Each request's prefill is costed
  once per output sequence with the existing prefill path (a ``kv_context=0`` step of ``prompt_tokens``), batched as
  the ``k`` requests that arrive together, and amortised over the decode iterations.

The two host constants are FITTED (``training/serving_fit.py`` on ML.ENERGY v2's A100-SXM4-40GB rows of half of the
models) and shipped as ``models/artifacts/serving_vllm.json`` with their provenance; nothing here imports
``wattcast.training``. They are a vLLM v0.x engine's host on ML.ENERGY's server: another CPU, another vLLM version
or another engine has its own.

A tensor-parallel group (``predict_cluster(..., tp=T, kv_context=, serving="vllm")``, T > 1) adds, in series,

    tp_sync_ms = tp_sync_ms_per_layer_log2_tp x n_layers x log2(T)

an EMPIRICAL per-layer cost of vLLM's TP workers that the GPU terms do not have: ML.ENERGY v2's TP2 decode
iterations are no faster than TP1 ones at the same batch (CodeLlama 7B batch 32: 37.7 ms at TP1, 42.2 ms at TP2)
while the predicted kernels halve and the two all-reduces per layer cost 7 us each (45 us at TP8: the collective
model is not what is missing). What it is (the driver's per-step broadcast and the workers' host-bound kernel
launches in vLLM v0.x, ranks waiting on the slowest one at each all-reduce) is not separable in these data. Its
constant is FITTED (``training/serving_fit.py`` ``fit_tp_sync``) on the TP rows of half of the TP models
(``TP_HALVES``); TP 1 adds nothing (the single-GPU iteration is unchanged bit for bit).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

import numpy as np

from wattcast.data.checks import real_in
from wattcast.featurize.workload import INFERENCE_MODES

#: the serving engines wattcast models, by name: the artifact holding each one's fitted constants
SERVING_ENGINES = {"vllm": "serving_vllm.json"}
SERVING_SCHEMA = 1


def serving_artifact_path(engine: str) -> Path:
    return Path(str(files("wattcast.models") / "artifacts")) / SERVING_ENGINES[engine]


@lru_cache(maxsize=None)
def serving_constants(engine: str) -> dict:
    """The shipped constants of ``engine`` (``host_fixed_ms``, ``host_per_seq_ms``, ``host_overlaps_gpu``,
    ``provenance``), checked: finite numbers >= 0 and the schema this wattcast reads."""
    path = serving_artifact_path(engine)
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("schema") != SERVING_SCHEMA:
        raise ValueError(f"{path}: serving schema {doc.get('schema')} is not {SERVING_SCHEMA}, the one this wattcast reads")
    for k in ("host_fixed_ms", "host_per_seq_ms"):
        if real_in(doc.get(k), 0.0, math.inf) is None:
            raise ValueError(f"{path}: {k} must be a finite number >= 0, got {doc.get(k)!r}")
    if not isinstance(doc.get("host_overlaps_gpu"), bool):
        raise ValueError(f"{path}: host_overlaps_gpu must be true or false")
    if "tp_sync_ms_per_layer_log2_tp" in doc and real_in(doc["tp_sync_ms_per_layer_log2_tp"], 0.0, math.inf) is None:
        raise ValueError(f"{path}: tp_sync_ms_per_layer_log2_tp must be a finite number >= 0, got "
                         f"{doc['tp_sync_ms_per_layer_log2_tp']!r}")
    return doc


def tp_sync_ms(n_layers, tp, ms_per_layer_log2_tp: float):
    """The tensor-parallel engine's per-iteration cost (ms): ``ms_per_layer_log2_tp x n_layers x log2(tp)``, 0 at
    tp 1 (array or scalar)."""
    return ms_per_layer_log2_tp * np.asarray(n_layers, dtype=float) * np.log2(np.asarray(tp, dtype=float))


def check_serving(serving, *, kv_context, seq, mode: str, prompt_tokens, output_tokens) -> str | None:
    """``serving`` checked (None: off) with the step it applies to; ValueError with a clear message otherwise.
    Returns the engine name (lower case) or None."""
    given = prompt_tokens is not None or output_tokens is not None
    if serving is None:
        if given:
            raise ValueError("prompt_tokens= / output_tokens= (--prompt-tokens / --output-tokens) describe the requests "
                             "of a serving engine: give serving='vllm' (--serving vllm) too")
        return None
    engine = str(serving).lower()
    if engine not in SERVING_ENGINES:
        raise ValueError(f"serving (--serving) must be one of {', '.join(SERVING_ENGINES)}, got {serving!r}")
    if str(mode).lower() not in INFERENCE_MODES or kv_context is None:
        raise ValueError("serving (--serving) models a serving engine's decode iteration: it needs mode='inference' "
                         "(--mode inference) and kv_context= (--kv-context, the tokens cached per sequence)")
    if seq is not None and seq != 1:
        raise ValueError(f"serving (--serving) models a decode iteration: seq (--seq) must be 1 (one new token per "
                         f"sequence), got {seq!r}")
    for name, v in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
        if v is None:
            raise ValueError(f"serving (--serving) amortises each request's prefill over its output: give both "
                             f"prompt_tokens= and output_tokens= (--prompt-tokens / --output-tokens); {name} is missing")
        f = real_in(v, 1.0, math.inf)
        if f is None or not f.is_integer():
            raise ValueError(f"{name} (--{name.replace('_', '-')}) must be a whole number of tokens >= 1, got {v!r}")
    # the decode step's cache holds each running sequence's prompt and what it has generated: kv_context + the new
    # token is at least the prompt (a shorter context costs a cache the requests never had)
    ctx = real_in(kv_context, 0.0, math.inf)
    new = 1 if seq is None else seq
    if ctx is not None and ctx + new < float(prompt_tokens):
        raise ValueError(f"serving (--serving): kv_context (--kv-context) {kv_context!r} + {new} new token is shorter than "
                         f"prompt_tokens (--prompt-tokens) {prompt_tokens!r}: a running sequence's cache holds its whole "
                         f"prompt and the tokens it has generated, so the decode step reads at least the prompt; give "
                         f"kv_context >= {int(float(prompt_tokens)) - new} (a typical running sequence: prompt + half "
                         f"the output, {int(float(prompt_tokens)) + int(float(output_tokens)) // 2})")
    return engine


def check_batch(batch) -> int:
    """The running sequences of a serving iteration: a whole number >= 1."""
    f = real_in(batch, 1.0, math.inf)
    if f is None or not f.is_integer():
        raise ValueError(f"serving: batch (--batch, the running sequences of a decode iteration) must be a whole number "
                         f">= 1, got {batch!r}")
    return int(f)


def host_ms(batch, host_fixed_ms: float, host_per_seq_ms: float):
    """The engine's host time per decode iteration (ms) for ``batch`` running sequences (array or scalar)."""
    return host_fixed_ms + host_per_seq_ms * np.asarray(batch, dtype=float)


def prefill_batch(batch, output_tokens):
    """Requests whose prefill runs together: the ``batch / output_tokens`` that finish (and start) per decode
    iteration, rounded up, at least 1 (array or scalar)."""
    return np.maximum(np.ceil(np.asarray(batch, dtype=float) / np.asarray(output_tokens, dtype=float)), 1.0)


def amortised_prefill_ms(prefill_step_ms, batch, output_tokens, prefill_requests):
    """A prefill iteration of ``prefill_requests`` prompts (``prefill_step_ms``) spread over the decode iterations:
    ``batch / output_tokens`` prompts per iteration (array or scalar)."""
    per_iter = np.asarray(batch, dtype=float) / np.asarray(output_tokens, dtype=float)
    return np.asarray(prefill_step_ms, dtype=float) * per_iter / np.asarray(prefill_requests, dtype=float)


def iteration_ms(gpu_step_ms, host_ms_, prefill_ms_, *, host_overlaps_gpu: bool):
    """A decode iteration: the GPU step and the host in series (vLLM v0.x) or overlapped (the longer of the two),
    plus the amortised prefill."""
    g, h = np.asarray(gpu_step_ms, dtype=float), np.asarray(host_ms_, dtype=float)
    return (np.maximum(g, h) if host_overlaps_gpu else g + h) + np.asarray(prefill_ms_, dtype=float)


def with_serving(res, prefill, *, engine: str, prompt_tokens: int, output_tokens: int, prefill_requests: int,
                 idle_power_w: float, tp: int = 1):
    """``res`` (a decode step's StepPrediction) as one serving iteration: ``step_time_ms`` (and so ``ms_per_token``,
    ``tokens_per_s``) with the engine's host time and the amortised prefill of ``prefill`` (the StepPrediction of a
    ``prefill_requests`` x ``prompt_tokens`` prefill); ``overheads`` gains ``serving_host_ms`` and
    ``serving_prefill_ms``, ``meta["serving"]`` the figures and the constants' provenance; the energy adds the GPU's
    idle power over the exposed host time and the prefill's energy in the same share. ``tp`` > 1 (one rank of a
    tensor-parallel group) adds the engine's TP cost (:func:`tp_sync_ms`) in series, as host time: ``overheads``
    ``serving_tp_sync_ms``, ``meta["serving"]["tp_sync_ms"]``, per-op class ``serving_tp_sync``."""
    c = serving_constants(engine)
    batch = check_batch(res.meta.get("batch"))
    if tp > 1:
        return _with_tp_sync(with_serving(res, prefill, engine=engine, prompt_tokens=prompt_tokens,
                                          output_tokens=output_tokens, prefill_requests=prefill_requests,
                                          idle_power_w=idle_power_w), c, tp=int(tp), idle_power_w=idle_power_w)
    host = float(host_ms(batch, c["host_fixed_ms"], c["host_per_seq_ms"]))
    pre = float(amortised_prefill_ms(prefill.step_time_ms, batch, output_tokens, prefill_requests))
    step = float(iteration_ms(res.step_time_ms, host, pre, host_overlaps_gpu=c["host_overlaps_gpu"]))
    exposed_host = max(host - res.step_time_ms, 0.0) if c["host_overlaps_gpu"] else host
    share = pre / prefill.step_time_ms if prefill.step_time_ms > 0 else 0.0
    energy = res.energy_j + idle_power_w * exposed_host / 1e3 + prefill.energy_j * share
    info = dict(engine=engine, gpu_step_ms=res.step_time_ms, host_ms=host, exposed_host_ms=exposed_host,
                prefill_ms=pre, prefill_requests=int(prefill_requests), prefill_step_ms=prefill.step_time_ms,
                prompt_tokens=int(prompt_tokens), output_tokens=int(output_tokens),
                requests_per_iteration=batch / output_tokens, host_fixed_ms=c["host_fixed_ms"],
                host_per_seq_ms=c["host_per_seq_ms"], host_overlaps_gpu=c["host_overlaps_gpu"],
                provenance=c.get("provenance"),
                # the powers the energy above charges each part at (the trace draws them: simulate/trace.py): the
                # GPU idles over the exposed host time; the prefill's share is drawn at its step's mean power
                host_power_w=float(idle_power_w),
                prefill_power_w=prefill.energy_j / (prefill.step_time_ms / 1e3) if prefill.step_time_ms > 0 else 0.0)
    per_op = sorted([*res.per_op,
                     dict(op_class="serving_host", count=1, time_ms=exposed_host, flops=0.0, launch_gap_ms=0.0),
                     dict(op_class="serving_prefill", count=int(prefill_requests), time_ms=pre,
                          flops=prefill.flops * share, launch_gap_ms=0.0)],
                    key=lambda o: -o["time_ms"])
    added = step - res.step_time_ms
    band = dict(res.step_band)
    if band:  # the GPU step's band, moved by what the engine adds (whose own error is the benchmark's, not in it)
        band.update(low_ms=band["low_ms"] + added, high_ms=band["high_ms"] + added,
                    basis=band["basis"] + f"; + the {engine} engine's host and prefill ({added:.2f} ms) as predicted, "
                    "their error not in the band (benchmarks/bench_mlenergy_decode.py)")
    return replace(res, step_time_ms=step, step_band=band, forward_ms=res.forward_ms + added, per_op=per_op,
                   flops=res.flops + prefill.flops * share,
                   overheads=dict(res.overheads, serving_host_ms=exposed_host, serving_prefill_ms=pre),
                   energy_j=energy, avg_power_w=energy / (step / 1e3), meta=dict(res.meta, serving=info))


def _with_tp_sync(res, c: dict, *, tp: int, idle_power_w: float):
    """``res`` (a served iteration of one rank) with the TP engine's cost of ``c`` added in series (idle power over it)."""
    if "tp_sync_ms_per_layer_log2_tp" not in c:
        raise ValueError(f"the {c.get('engine')} serving artifact has no tensor-parallel constant "
                         "(tp_sync_ms_per_layer_log2_tp): tensor-parallel serving cannot be predicted with it")
    n_layers = res.meta.get("n_layers")
    if real_in(n_layers, 1.0, math.inf) is None:
        raise ValueError(f"serving on a tensor-parallel group needs the model's layer count, got {n_layers!r}")
    k = c["tp_sync_ms_per_layer_log2_tp"]
    sync = float(tp_sync_ms(n_layers, tp, k))
    step = res.step_time_ms + sync
    energy = res.energy_j + idle_power_w * sync / 1e3
    info = dict(res.meta["serving"], tp_sync_ms=sync, tp_sync_ms_per_layer_log2_tp=k,
                tp_provenance=c.get("tp_provenance"), tp_sync_power_w=float(idle_power_w))
    per_op = sorted([*res.per_op, dict(op_class="serving_tp_sync", count=1, time_ms=sync, flops=0.0, launch_gap_ms=0.0)],
                    key=lambda o: -o["time_ms"])
    band = dict(res.step_band)
    if band:
        band.update(low_ms=band["low_ms"] + sync, high_ms=band["high_ms"] + sync,
                    basis=band["basis"] + f"; + the TP engine cost ({sync:.2f} ms) as predicted")
    return replace(res, step_time_ms=step, step_band=band, forward_ms=res.forward_ms + sync, per_op=per_op,
                   overheads=dict(res.overheads, serving_tp_sync_ms=sync), energy_j=energy,
                   avg_power_w=energy / (step / 1e3), meta=dict(res.meta, serving=info))
