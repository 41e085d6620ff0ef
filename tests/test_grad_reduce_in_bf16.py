"""Megatron-LM's ``--grad-reduce-in-bf16`` (``grad_accum_dtype="bf16"`` under ``framework="megatron"``).

Megatron-LM turns ``accumulate_allreduce_grads_in_fp32`` on for ``--bf16`` unless ``--grad-reduce-in-bf16``
(``megatron/training/arguments.py`` l. 1181-1194 of the 0.19.2 tree) and passes it on as
``DistributedDataParallelConfig.grad_reduce_in_fp32`` (``training.py`` l. 1988); Megatron-Core 0.16.1
``distributed_data_parallel.py`` l. 147: ``grad_dtype = torch.float if self.ddp_config.grad_reduce_in_fp32 else
param.dtype``. So with the flag the main-gradient buffer is bf16: 2 B/param instead of 4 (Megatron-LM's
``theoretical_memory_usage.py`` counts 18 B/param, 6 + 12/d with the distributed optimizer, for fp32 main gradients:
16 and 4 + 12/d with bf16 ones), the data-parallel reduction and the tied embedding's all-reduce move half the bytes,
and the optimizer casts the rank's bf16 gradient shard to fp32 at the step (``distrib_optimizer.py``
``_copy_model_grads_to_main_grads``, ``shard_model_grad.float()``: read 2, write 4 B, the fp32 copy held until the next
``zero_grad``). Until stop 50 ``grad_accum_dtype`` was refused under megatron.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import wattcast
from wattcast.simulate.distributed import dp_reduce_bytes, tied_grad_bytes
from wattcast.simulate.stage_memory import (MEGATRON_GRAD_CAST_BYTES_PER_PARAM, held_gradient_bytes,
                                            megatron_main_grad_bytes)

JOB = dict(gpus=8, batch=32, seq=1024, tp=2, pp=2, micro_batch=2, dtype="bf16", framework="megatron")
ARGS = ["predict", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", "--batch", "32", "--seq", "1024", "--tp", "2",
        "--pp", "2", "--micro-batch", "2", "--zero", "1", "--framework", "megatron", "--json"]


def _states_b(stage: dict) -> float:
    """Model-state bytes of a stage (its ``per_device`` ``weights_gb`` includes the master weights)."""
    return (stage["weights_gb"] + stage["gradients_gb"] + stage["optimizer_gb"]) * 1e9


@pytest.mark.parametrize("zero", [0, 1])
def test_model_states_follow_megatrons_formula_with_bf16_main_grads(zero):
    """Per parameter: 18 -> 16 B without the distributed optimizer, 6 + 12/d -> 4 + 12/d with it, every stage; the
    optimizer's fp32 copy of the bf16 gradient (4 B per parameter it steps) after the last backward."""
    dp = 2
    base = wattcast.predict_cluster("gpt2", "DGX-A100", zero=zero, **JOB)
    bf16 = wattcast.predict_cluster("gpt2", "DGX-A100", zero=zero, grad_accum_dtype="bf16", **JOB)
    per_param = (lambda g: 2 + g + 12 / dp) if zero else (lambda g: 2 + g + 12)
    for a, b in zip(base.per_device, bf16.per_device):
        params = (a["weights_gb"] - a["master_weights_gb"]) * 1e9 / 2  # bf16 weights, not sharded at ZeRO-0/1
        assert _states_b(a) == pytest.approx(params * per_param(4), rel=1e-9)
        assert _states_b(b) == pytest.approx(params * per_param(2), rel=1e-9)
        assert b["gradients_gb"] == pytest.approx(a["gradients_gb"] / 2, rel=1e-12)
        assert a["post_backward_buffers_gb"] == 0.0
        assert b["post_backward_buffers_gb"] * 1e9 == pytest.approx(params * 4 / (dp if zero else 1), rel=1e-9)
    assert bf16.memory_gb < base.memory_gb
    # the precision-aware optimizer (adamw-bf16) hands the bf16 shard over as it is: no fp32 copy
    pa = wattcast.predict_cluster("gpt2", "DGX-A100", zero=1, grad_accum_dtype="bf16", optimizer="adamw-bf16", **JOB)
    assert all(s["post_backward_buffers_gb"] == 0.0 for s in pa.per_device)


def test_dp_and_tied_embedding_bytes_halved_and_step_cast_costed():
    assert megatron_main_grad_bytes("bf16") == 4 and megatron_main_grad_bytes("bf16", "bf16") == 2
    assert megatron_main_grad_bytes("fp16") == 2 and megatron_main_grad_bytes("fp16", "fp32") == 4
    assert megatron_main_grad_bytes("fp16", "bf16") == 2 and megatron_main_grad_bytes("fp32", "bf16") == 4
    for zero in (0, 1, 2, 3):  # the reduce-scatter / all-reduce (and Megatron-FSDP's) in the buffer's dtype
        assert dp_reduce_bytes("megatron", "bf16", zero, None, "bf16") * 2 == dp_reduce_bytes("megatron", "bf16", zero)
        assert held_gradient_bytes("megatron", "bf16", 2, zero, "bf16") == 2
    assert tied_grad_bytes("megatron", "bf16", "bf16") * 2 == tied_grad_bytes("megatron", "bf16")
    base = wattcast.predict_cluster("gpt2", "DGX-A100", zero=1, **JOB)
    bf16 = wattcast.predict_cluster("gpt2", "DGX-A100", zero=1, grad_accum_dtype="bf16", **JOB)
    assert bf16.comm["embedding_grad_allreduce_bytes"] * 2 == base.comm["embedding_grad_allreduce_bytes"] > 0
    assert bf16.comm["dp_sync_ms"] < 0.55 * base.comm["dp_sync_ms"]  # half the bytes, the same latency
    # the step's cast of the rank's shard (read 2, write 4 B/param): more optimizer time, by that pass alone
    assert MEGATRON_GRAD_CAST_BYTES_PER_PARAM == 6.0
    assert bf16.optimizer_ms > base.optimizer_ms
    assert bf16.step_time_ms < base.step_time_ms
    assert base.to_dict()["parallel"]["grad_accum_dtype"] == "fp32"
    assert bf16.to_dict()["parallel"]["grad_accum_dtype"] == "bf16"


def test_refusals_and_no_effect_warnings():
    with pytest.raises(ValueError, match="--fsdp-reduce-dtype"):
        wattcast.predict_cluster("gpt2", "DGX-A100", zero=1, grad_accum_dtype="bf16", **dict(JOB, framework="hf"))
    with pytest.raises(ValueError, match="grad_accum_dtype must be one of fp32, bf16"):
        wattcast.predict_cluster("gpt2", "DGX-A100", zero=1, grad_accum_dtype="fp16", **JOB)
    # fp16: Megatron-LM reads --grad-reduce-in-bf16 only with --bf16: the same step, with a warning
    a = wattcast.predict_cluster("gpt2", "DGX-A100", zero=1, grad_accum_dtype="bf16", **dict(JOB, dtype="fp16"))
    b = wattcast.predict_cluster("gpt2", "DGX-A100", zero=1, **dict(JOB, dtype="fp16"))
    assert a.step_time_ms == b.step_time_ms and a.memory == b.memory
    assert any("has no effect under fp16" in w for w in a.meta["warnings"])
    runner = CliRunner()
    from wattcast.cli import app

    hf = runner.invoke(app, [x if x != "megatron" else "hf" for x in ARGS] + ["--grad-reduce-in-bf16"])
    assert hf.exit_code != 0 and "--fsdp-reduce-dtype" in " ".join(hf.output.split())
    both = runner.invoke(app, [*ARGS, "--grad-reduce-in-bf16", "--grad-accum-dtype", "fp32"])
    assert both.exit_code != 0 and "contradicts --grad-accum-dtype fp32" in " ".join(both.output.split())
    from wattcast.sweep import SweepSpecError, load_spec

    spec = dict(models=["gpt2"], clusters=["DGX-A100"], gpus=[8], batch=32, seq=1024, framework="megatron")
    with pytest.raises(SweepSpecError, match="contradicts"):
        load_spec(dict(spec, grad_reduce_in_bf16=True, grad_accum_dtype="fp32"))
    with pytest.raises(SweepSpecError, match="true or false"):
        load_spec(dict(spec, grad_reduce_in_bf16="yes"))
    with pytest.raises(SweepSpecError, match="needs framework megatron.*'fsdp_reduce_dtype'"):
        load_spec(dict(spec, grad_reduce_in_bf16=True, framework="hf"))


def test_cli_python_search_and_sweep_agree():
    from wattcast.cli import app

    runner = CliRunner()
    ref = wattcast.predict_cluster("gpt2", "DGX-A100", zero=1, grad_accum_dtype="bf16", **JOB)
    for extra in (["--grad-reduce-in-bf16"], ["--grad-accum-dtype", "bf16"]):
        r = runner.invoke(app, [*ARGS, *extra])
        assert r.exit_code == 0, r.output
        d = json.loads(r.stdout)
        assert d["parallel"]["grad_accum_dtype"] == "bf16"
        assert d["step_time_ms"] == pytest.approx(ref.step_time_ms, rel=1e-12)
        assert d["memory_gb"] == pytest.approx(ref.memory_gb, rel=1e-12)
    space = dict(tp=[2], pp=[2], zero=[0, 1], micro_batch=[2], recompute=["none"], interleave=[1])
    kw = dict(framework="megatron", max_configs=50, workers=1, dtype="bf16", **space)
    rows = wattcast.search("gpt2", "DGX-A100", 8, 32, 1024, grad_accum_dtype="bf16", **kw).ranked
    default = wattcast.search("gpt2", "DGX-A100", 8, 32, 1024, **kw).ranked.set_index("strategy")
    assert len(rows) >= 2
    for _, row in rows.iterrows():  # a row is the step predict_cluster gives that strategy with the same option
        one = wattcast.predict_cluster("gpt2", "DGX-A100", gpus=8, batch=32, seq=1024, strategy=row["strategy"],
                                       framework="megatron", dtype="bf16", grad_accum_dtype="bf16")
        assert one.step_time_ms == pytest.approx(row["step_time_ms"], rel=1e-9)
        assert row["memory_gb"] == pytest.approx(one.memory_gb, rel=1e-9)
        assert row["memory_gb"] < float(default.loc[row["strategy"], "memory_gb"])
    r = runner.invoke(app, ["search", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", "--batch", "32", "--seq",
                            "1024", "--framework", "megatron", "--max-configs", "1", "--workers", "1",
                            "--grad-reduce-in-bf16", "--json"])
    assert r.exit_code == 0, r.output
    from wattcast.sweep import load_spec

    spec = dict(models=["gpt2"], clusters=["DGX-A100"], gpus=[8], batch=32, seq=1024, framework="megatron")
    plain = load_spec(spec).tasks()[0]
    flag = load_spec(dict(spec, grad_reduce_in_bf16=True)).tasks()[0]
    named = load_spec(dict(spec, grad_accum_dtype="bf16")).tasks()[0]
    assert "grad_accum_dtype" not in plain and flag["grad_accum_dtype"] == named["grad_accum_dtype"] == "bf16"
    assert flag["task_id"] == named["task_id"] != plain["task_id"]
