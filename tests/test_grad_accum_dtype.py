"""DeepSpeed's gradient-accumulation dtype (``data_types.grad_accum_dtype``, framework megatron-deepspeed).

DeepSpeed 0.19.8 ``runtime/engine.py`` ``_do_optimizer_sanity_check`` (l. 2294-2323) gives ZeRO stage 1 with bf16 its
``BF16_Optimizer`` only under ``grad_accum_dtype: fp32`` (l. 2305-2310); without the key ``get_data_types``
(l. 1799-1810) takes the model's dtype and the ZeRO optimizer runs (``runtime/zero/stage_1_and_2.py``).

- ``BF16_Optimizer`` ("fp32", the default, BLOOM-176B's): the bf16 ``param.grad`` (``clear_lp_grads`` zeroes it in
  place) plus a whole-model fp32 accumulation buffer (``bf16_optimizer.py`` l. 191, ``fp32_flat_buffer =
  torch.zeros_like(self.bf16_groups_flat[i], dtype=self.grad_acc_dtype)``): 6 B/param, not sharded; an fp32
  accumulation pass after every micro-batch (``update_hp_grads``); the tied embedding's fp32 ``_hp_grad`` all-reduced
  (``pipe/engine.py`` l. 283).
- the ZeRO optimizer ("bf16" at ZeRO-1): 2 B/param of bf16 ``param.grad`` (no separate accumulation buffer when the
  accumulation dtype is the model's, ``stage_1_and_2.py`` l. 394-404) and, at the step, the rank's partition
  flattened in bf16 and cast to fp32 (l. 3117-3118): params / dp x (2 + 4), after the reduce bucket is released;
  autograd accumulates into ``param.grad`` (3 x 2 B for each micro-batch after the first); the tied embedding's bf16
  ``weight.grad`` all-reduced.

Until stop 43 every megatron-deepspeed bf16 step below ZeRO-2 was charged as ``BF16_Optimizer``.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import wattcast
from wattcast.simulate.distributed import (checked_grad_accum_dtype, grad_accumulation_bytes, tied_grad_bytes)
from wattcast.simulate.stage_memory import (DEEPSPEED_BUCKET_ELEMENTS, held_gradient_bytes, stage_memory,
                                            stage_total_gb)

# gpt2 on 8 GPUs: TP2 PP2 DP2, so the step's partition copies (6 B / dp = 3 B/param) exceed the reduce bucket (2 B/param
# of a stage below 5e8 parameters)
JOB = dict(gpus=8, batch=32, seq=1024, tp=2, pp=2, micro_batch=2, zero=1, dtype="bf16", framework="megatron-deepspeed")
ARGS = ["predict", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", "--batch", "32", "--seq", "1024", "--tp", "2",
        "--pp", "2", "--micro-batch", "2", "--zero", "1", "--framework", "megatron-deepspeed", "--json"]


def _source_terms(params: float, dp: int, accum: str) -> tuple[float, float]:
    """(held gradients, made after the last backward) bytes of one stage, written out from DeepSpeed's source."""
    # the bf16 reduce bucket when the gradients are reduced (no data-parallel reduction with dp 1)
    bucket = min(params, DEEPSPEED_BUCKET_ELEMENTS) * 2 if dp > 1 else 0.0
    if accum == "fp32":
        # bf16 param.grad + BF16_Optimizer's fp32 flat buffer, whole model; its all-reduce casts the whole buffer to
        # bf16 (engine.py allreduce_bucket l. 3800-3801; tests/test_bf16_optimizer_source.py)
        return params * (2 + 4), params * 2 if dp > 1 else 0.0
    return params * 2, max(bucket, params / dp * (2 + 4))  # bf16 param.grad; flat bf16 + fp32 partition at the step


@pytest.mark.parametrize("accum", ["fp32", "bf16"])
@pytest.mark.parametrize("params,dp", [(2.0e9, 8), (4.0e8, 2), (3.0e8, 1)])
def test_per_term_bytes_follow_the_source(accum, params, dp):
    held_b = held_gradient_bytes("megatron-deepspeed", "bf16", 2, 1, accum)
    assert held_b == (6 if accum == "fp32" else 2)
    m = stage_memory(params=params, act_bytes_per_chunk=1e9, inflight=2, full_recompute_extra_bytes=0.0, dtype_bytes=2,
                     grad_bytes=2, held_grad_bytes=held_b, optimizer="adamw", zero=1, dp=dp,
                     framework="megatron-deepspeed", block_params=params / 10, grad_accum_dtype=accum)
    grads, after = _source_terms(params, dp, accum)
    assert m.gradients_bytes == pytest.approx(grads, rel=1e-12)
    assert m.post_backward_buffers_bytes == pytest.approx(after, rel=1e-12)
    # the search's total-only path gives the same figure
    tot = stage_total_gb(params=[params], act_bytes_per_chunk=[1e9], inflight=[2], full_recompute_extra_bytes=0.0,
                         dtype_bytes=2, grad_bytes=2, held_grad_bytes=held_b, optimizer="adamw", zero=1, dp=dp,
                         framework="megatron-deepspeed", block_params=params / 10, grad_accum_dtype=accum)
    assert tot[0] * 1e9 == pytest.approx(m.total_bytes, rel=1e-12)


def test_default_is_bf16_optimizer_and_zero_optimizer_only_when_asked():
    assert held_gradient_bytes("megatron-deepspeed", "bf16", 2, 1) == 6
    assert held_gradient_bytes("megatron-deepspeed", "bf16", 2, 1, "fp32") == 6
    assert held_gradient_bytes("megatron-deepspeed", "bf16", 2, 1, "bf16") == 2
    # only ZeRO-1 switches optimizer: ZeRO-0 stays BF16_Optimizer, with a bf16 buffer by default in DeepSpeed 0.19.8
    # (an fp32 one as BLOOM's older DeepSpeed ran it when asked), ZeRO-2 partitions in bf16 either way
    assert held_gradient_bytes("megatron-deepspeed", "bf16", 2, 0, "bf16") == 4
    assert held_gradient_bytes("megatron-deepspeed", "bf16", 2, 0) == 4
    assert held_gradient_bytes("megatron-deepspeed", "bf16", 2, 0, "fp32") == 6
    assert held_gradient_bytes("megatron-deepspeed", "bf16", 2, 2, "bf16") == 2
    # the time model's terms: no fp32 pass every micro-batch, autograd's in-place add after the first; bf16 tied grad
    assert grad_accumulation_bytes("megatron-deepspeed", "bf16") == (18.0, True)
    assert grad_accumulation_bytes("megatron-deepspeed", "bf16", "bf16") == (6.0, False)
    assert tied_grad_bytes("megatron-deepspeed", "bf16") == 4 and tied_grad_bytes("megatron-deepspeed", "bf16", "bf16") == 2


def test_predict_cluster_memory_and_time():
    base = wattcast.predict_cluster("gpt2", "DGX-A100", **JOB)
    fp32 = wattcast.predict_cluster("gpt2", "DGX-A100", **JOB, grad_accum_dtype="fp32")
    bf16 = wattcast.predict_cluster("gpt2", "DGX-A100", **JOB, grad_accum_dtype="bf16")
    assert base.to_dict() == fp32.to_dict()  # the default is BF16_Optimizer, figure for figure
    assert base.to_dict()["parallel"]["grad_accum_dtype"] == "fp32"
    assert bf16.to_dict()["parallel"]["grad_accum_dtype"] == "bf16"
    assert bf16.meta["settings"]["grad_accum_dtype"] == "bf16"
    params = fp32.memory["weights_gb"] * 1e9 / 2  # the worst stage's parameters (bf16 weights, not sharded at ZeRO-1)
    for r, accum in ((fp32, "fp32"), (bf16, "bf16")):
        assert r.memory["stage"] == fp32.memory["stage"]
        grads, after = _source_terms(params, 2, accum)
        assert r.memory["gradients_gb"] * 1e9 == pytest.approx(grads, rel=1e-9)
        assert r.memory["post_backward_buffers_gb"] * 1e9 == pytest.approx(after, rel=1e-9)
    assert fp32.memory["total_gb"] - bf16.memory["total_gb"] == pytest.approx(4 * params / 1e9, rel=1e-9)
    # no fp32 accumulation pass after every micro-batch: a shorter step
    assert bf16.step_time_ms < fp32.step_time_ms


def test_no_effect_is_a_warning_and_other_frameworks_are_refused():
    for zero in (2,):  # ZeRO-2: without a pipeline (DeepSpeed's pipeline engine runs ZeRO-1 at most)
        job = dict(JOB, zero=zero, pp=1)
        a = wattcast.predict_cluster("gpt2", "DGX-A100", **job, grad_accum_dtype="bf16")
        b = wattcast.predict_cluster("gpt2", "DGX-A100", **job)
        assert a.step_time_ms == b.step_time_ms and a.memory == b.memory
        assert any(f"no effect at ZeRO-{zero}" in w for w in a.meta["warnings"])
    # ZeRO-0: "bf16" is DeepSpeed 0.19.8's default there (BF16_Optimizer with a bf16 buffer): the same step, no warning
    a = wattcast.predict_cluster("gpt2", "DGX-A100", **dict(JOB, zero=0), grad_accum_dtype="bf16")
    b = wattcast.predict_cluster("gpt2", "DGX-A100", **dict(JOB, zero=0))
    assert a.step_time_ms == b.step_time_ms and a.memory == b.memory
    assert not any("grad_accum_dtype" in w for w in a.meta.get("warnings", []))
    # hf refused (pointing to --fsdp-reduce-dtype); megatron takes it as its main-gradient dtype
    # (tests/test_grad_reduce_in_bf16.py)
    with pytest.raises(ValueError, match="fsdp-reduce-dtype"):
        wattcast.predict_cluster("gpt2", "DGX-A100", **dict(JOB, framework="hf"), grad_accum_dtype="fp32")
    with pytest.raises(ValueError, match="framework hf"):
        wattcast.search("gpt2", "DGX-A100", 8, 32, 1024, framework="hf", grad_accum_dtype="bf16", max_configs=5)
    with pytest.raises(ValueError, match="grad_accum_dtype must be one of fp32, bf16"):
        checked_grad_accum_dtype("megatron-deepspeed", "fp16")
    assert checked_grad_accum_dtype("megatron-deepspeed", "BFloat16") == "bf16"
    assert checked_grad_accum_dtype("megatron-deepspeed", "float32") == "fp32"


def test_cli_flag_request_search_and_sweep():
    from wattcast.cli import app

    runner = CliRunner()
    out = {}
    for value in ("fp32", "bf16"):
        r = runner.invoke(app, [*ARGS, "--grad-accum-dtype", value])
        assert r.exit_code == 0, r.output
        d = json.loads(r.stdout)
        assert d["parallel"]["grad_accum_dtype"] == value
        ref = wattcast.predict_cluster("gpt2", "DGX-A100", **JOB, grad_accum_dtype=value)
        assert d["step_time_ms"] == pytest.approx(ref.step_time_ms, rel=1e-12)
        out[value] = d["memory"]["gradients_gb"]
    assert out["fp32"] == pytest.approx(3 * out["bf16"], rel=1e-9)
    bad = runner.invoke(app, [a if a != "megatron-deepspeed" else "hf" for a in ARGS] + ["--grad-accum-dtype", "bf16"])
    assert bad.exit_code != 0 and "--fsdp-reduce-dtype" in " ".join(bad.output.split())
    single = runner.invoke(app, ["predict", "-m", "gpt2", "-d", "A100-SXM4-80GB", "--grad-accum-dtype", "bf16"])
    assert single.exit_code == 2 and "needs --cluster" in " ".join(single.output.split())
    req = wattcast.request.PredictRequest(model="gpt2", cluster="DGX-A100", batch=32, seq=1024, dtype="bf16",
                                          framework="megatron-deepspeed", grad_accum_dtype="bf16",
                                          parallel=wattcast.request.ParallelOptions(gpus=8, tp=2, pp=2, micro_batch=2,
                                                                                    zero=1))
    assert req.predict().step_time_ms == pytest.approx(
        wattcast.predict_cluster("gpt2", "DGX-A100", **JOB, grad_accum_dtype="bf16").step_time_ms, rel=1e-12)

    space = dict(tp=[2], pp=[2], zero=[1], micro_batch=[2], recompute=["none"], interleave=[1])
    kw = dict(framework="megatron-deepspeed", max_configs=50, workers=1, dtype="bf16", **space)
    rows = wattcast.search("gpt2", "DGX-A100", 8, 32, 1024, grad_accum_dtype="bf16", **kw).ranked
    default = wattcast.search("gpt2", "DGX-A100", 8, 32, 1024, **kw).ranked
    assert len(rows) >= 1 and set(rows["strategy"]) == set(default["strategy"])
    for _, row in rows.iterrows():  # a row is the step predict_cluster gives that strategy with the same option
        one = wattcast.predict_cluster("gpt2", "DGX-A100", gpus=8, batch=32, seq=1024, strategy=row["strategy"],
                                       framework="megatron-deepspeed", dtype="bf16", grad_accum_dtype="bf16")
        assert one.step_time_ms == pytest.approx(row["step_time_ms"], rel=1e-9)
        assert row["memory_gb"] == pytest.approx(one.memory_gb, rel=1e-9)
        assert row["memory_gb"] < float(default.set_index("strategy").loc[row["strategy"], "memory_gb"])
    r = runner.invoke(app, ["search", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", "--batch", "32", "--seq",
                            "1024", "--framework", "megatron-deepspeed", "--max-configs", "1", "--workers", "1",
                            "--grad-accum-dtype", "bf16", "--json"])
    assert r.exit_code == 0, r.output

    from wattcast.sweep import SweepSpecError, load_spec

    spec = dict(models=["gpt2"], clusters=["DGX-A100"], gpus=[8], batch=32, seq=1024, framework="megatron-deepspeed")
    plain, bf16 = load_spec(spec).tasks()[0], load_spec(dict(spec, grad_accum_dtype="bf16")).tasks()[0]
    assert "grad_accum_dtype" not in plain and bf16["grad_accum_dtype"] == "bf16"
    assert bf16["task_id"] != plain["task_id"]
    with pytest.raises(SweepSpecError, match="fsdp-reduce-dtype"):
        load_spec(dict(spec, grad_accum_dtype="bf16", framework="hf"))
