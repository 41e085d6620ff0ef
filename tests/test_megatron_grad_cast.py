"""Megatron-Core's once-per-step cast of half-precision main gradients to fp32 (issue 15), under every ZeRO stage and
both half-precision dtypes, and the ``--grad-reduce-in-bf16`` checks shared by the CLI and a sweep spec.

- Megatron-FSDP (``--framework megatron --zero 2/3``): the distributed optimizer's ``_copy_model_grads_to_main_grads``
  returns early (megatron-core 0.16.1 ``optimizer/distrib_optimizer.py`` l. 2397-2398), but the buffer's
  ``update_main_grads`` (``distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py`` l. 2615-2667), run by
  ``finish_grad_sync`` after the reduce-scatter (``megatron_fsdp.py`` l. 1183-1204), casts the rank's shard to the
  fp32 main weight's dtype (l. 2646-2648) and keeps it in ``dist_main_grad`` until ``zero_grad`` (l. 2470-2480).
  Until stop 51 ``megatron_grad_cast`` was False at ZeRO >= 2.
- ``--dtype fp16`` without ``--accumulate-allreduce-grads-in-fp32``: the main-gradient buffer is fp16
  (``distributed_data_parallel.py`` l. 147, ``grad_reduce_in_fp32`` False by default,
  ``distributed_data_parallel_config.py`` l. 11), cast with ``.float()`` at the step (``optimizer.py`` l. 754-761,
  ``distrib_optimizer.py`` l. 2419). Until stop 51 only bf16 was charged.
- ``--grad-reduce-in-bf16`` is Megatron-LM's flag: under megatron-deepspeed it was silently DeepSpeed's
  ``data_types.grad_accum_dtype`` bf16 (another optimizer at ZeRO-1) until stop 51; now refused, pointing to
  ``--grad-accum-dtype bf16``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import wattcast
from wattcast.simulate.stage_memory import (MEGATRON_GRAD_CAST_HELD_BYTES_PER_PARAM, megatron_grad_cast,
                                            stage_memory_gb)

# TP2 x DP4 on one DGX A100 (Megatron-FSDP runs no pipeline here)
JOB = dict(gpus=8, batch=32, seq=1024, tp=2, pp=1, micro_batch=2, framework="megatron")
DP = 4


def _run(**kw):
    return wattcast.predict_cluster("gpt2", "DGX-A100", **JOB, **kw)


@pytest.mark.parametrize("zero", [2, 3])
def test_megatron_fsdp_holds_the_fp32_shard_of_bf16_main_grads(zero):
    """The fp32 gradient shard update_main_grads makes (4 B per parameter the rank steps) after the backward, as under
    the distributed optimizer; none with fp32 main gradients (``.to(torch.float32)`` returns the tensor itself) nor
    with the precision-aware optimizer (the bf16 shard as ``decoupled_grad``)."""
    assert megatron_grad_cast("megatron", "bf16", zero, "adamw", "bf16")
    base = _run(zero=zero, dtype="bf16")
    bf16 = _run(zero=zero, dtype="bf16", grad_accum_dtype="bf16")
    zero1 = _run(zero=1, dtype="bf16", grad_accum_dtype="bf16")
    for a, b, c in zip(base.per_device, bf16.per_device, zero1.per_device):
        assert a["post_backward_buffers_gb"] == 0.0
        assert b["post_backward_buffers_gb"] * 1e9 == pytest.approx(
            b["params"] * MEGATRON_GRAD_CAST_HELD_BYTES_PER_PARAM / DP, rel=1e-12)
        assert b["post_backward_buffers_gb"] == pytest.approx(c["post_backward_buffers_gb"], rel=1e-12)
    pa = _run(zero=zero, dtype="bf16", grad_accum_dtype="bf16", optimizer="adamw-bf16")
    assert all(s["post_backward_buffers_gb"] == 0.0 for s in pa.per_device)


@pytest.mark.parametrize("zero", [2, 3])
def test_megatron_fsdp_cast_time_is_the_shards_pass(zero):
    """update_main_grads streams the rank's shard (read 2, write 4 B/param) after the reduce-scatter: the same
    optimizer-phase time as the distributed optimizer's cast of its shard at ZeRO-1 (both 1/dp of the stage)."""
    cast_z = _run(zero=zero, dtype="bf16", grad_accum_dtype="bf16").optimizer_ms - _run(zero=zero,
                                                                                          dtype="bf16").optimizer_ms
    cast_1 = _run(zero=1, dtype="bf16", grad_accum_dtype="bf16").optimizer_ms - _run(zero=1, dtype="bf16").optimizer_ms
    assert cast_1 > 0
    assert cast_z == pytest.approx(cast_1, rel=1e-9)


def test_expert_shard_over_the_expert_fsdp_group():
    """Megatron-FSDP shards an expert group's main weights and gradients over the expert FSDP group
    (``get_fsdp_group(is_expert_parallel=True)``, param_and_grad_buffer.py l. 1918-1921): so is its fp32 copy."""
    params, experts, dp, edp = 8e9, 6e9, 8, 2
    kw = dict(params=np.array([params]), act_bytes_per_chunk=np.array([0.0]), inflight=np.array([1]),
              full_recompute_extra_bytes=0.0, dtype_bytes=2, grad_bytes=2, held_grad_bytes=2, optimizer="adamw",
              zero=3, dp=dp, framework="megatron", block_params=1e8, expert_params=np.array([experts]),
              expert_dp=edp)
    with_cast = stage_memory_gb(main_grad_cast=True, **kw)["post_backward_buffers_gb"][0]
    without = stage_memory_gb(main_grad_cast=False, **kw)["post_backward_buffers_gb"][0]
    assert (with_cast - without) * 1e9 == pytest.approx((params - experts) * 4 / dp + experts * 4 / edp, rel=1e-12)


def test_fp16_main_grads_are_cast_at_every_zero_stage():
    """fp16 parameters without --accumulate-allreduce-grads-in-fp32: fp16 main gradients, cast to fp32 once per
    step (every parameter at ZeRO-0, Float16OptimizerWithFloat16Params; the shard at ZeRO-1/2/3), the same pass and
    held copy as bf16 main gradients; --grad-accum-dtype fp32 (--accumulate-allreduce-grads-in-fp32) makes none."""
    for zero in (0, 1, 2, 3):
        assert megatron_grad_cast("megatron", "fp16", zero, "adamw")
        assert not megatron_grad_cast("megatron", "fp16", zero, "adamw", "fp32")
        assert not megatron_grad_cast("megatron", "fp16", zero, "none")
    assert not megatron_grad_cast("megatron", "fp32", 1, "adamw")
    assert not megatron_grad_cast("megatron-deepspeed", "fp16", 1, "adamw")
    for zero, share in ((0, 1.0), (1, 1.0 / DP), (3, 1.0 / DP)):
        fp16 = _run(zero=zero, dtype="fp16")
        for s in fp16.per_device:
            assert s["post_backward_buffers_gb"] * 1e9 == pytest.approx(s["params"] * 4 * share, rel=1e-12)
    fp32_acc = _run(zero=1, dtype="fp16", grad_accum_dtype="fp32")
    assert all(s["post_backward_buffers_gb"] == 0.0 for s in fp32_acc.per_device)
    # the cast's optimizer-phase time: as bf16 main gradients' at the same ZeRO stage
    bf16_cast = _run(zero=1, dtype="bf16", grad_accum_dtype="bf16").optimizer_ms - _run(zero=1, dtype="bf16").optimizer_ms
    assert _run(zero=1, dtype="fp16").optimizer_ms - fp32_acc.optimizer_ms == pytest.approx(bf16_cast, rel=1e-9)


ARGS = ["--cluster", "DGX-A100", "--gpus", "8", "--batch", "32", "--seq", "1024", "--tp", "2", "--pp", "2",
        "--micro-batch", "2", "--zero", "1"]


def _out(r) -> str:
    return " ".join(r.output.split())


def test_grad_reduce_in_bf16_refused_under_megatron_deepspeed():
    """DeepSpeed has no --grad-reduce-in-bf16: predict, search and a sweep spec refuse it, naming DeepSpeed's own
    option; that option itself (--grad-accum-dtype bf16 / grad_accum_dtype) still runs."""
    from wattcast.cli import app
    from wattcast.sweep import SweepSpecError, load_spec

    runner = CliRunner()
    ds = ["--framework", "megatron-deepspeed"]
    r = runner.invoke(app, ["predict", "-m", "gpt2", *ARGS, *ds, "--grad-reduce-in-bf16", "--json"])
    assert r.exit_code == 2 and "DeepSpeed has no such option" in _out(r) and "--grad-accum-dtype bf16" in _out(r)
    r = runner.invoke(app, ["search", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", "--batch", "32", "--seq",
                            "1024", *ds, "--max-configs", "1", "--workers", "1", "--grad-reduce-in-bf16", "--json"])
    assert r.exit_code == 2 and "DeepSpeed has no such option" in _out(r) and "--grad-accum-dtype bf16" in _out(r)
    ok = runner.invoke(app, ["predict", "-m", "gpt2", *ARGS, *ds, "--grad-accum-dtype", "bf16", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["parallel"]["grad_accum_dtype"] == "bf16"
    spec = dict(models=["gpt2"], clusters=["DGX-A100"], gpus=[8], batch=32, seq=1024, framework="megatron-deepspeed")
    with pytest.raises(SweepSpecError, match="DeepSpeed has no such option.*'grad_accum_dtype' bf16"):
        load_spec(dict(spec, grad_reduce_in_bf16=True))
    assert load_spec(dict(spec, grad_accum_dtype="bf16")).tasks()[0]["grad_accum_dtype"] == "bf16"
    assert "grad_accum_dtype" not in load_spec(dict(spec, grad_reduce_in_bf16=False)).tasks()[0]


def test_one_check_names_each_callers_options():
    """folded_grad_accum_dtype: the CLI and a sweep spec's check, each message in the caller's names."""
    from wattcast.simulate.distributed import folded_grad_accum_dtype

    assert folded_grad_accum_dtype("megatron", None, True) == "bf16"
    assert folded_grad_accum_dtype("Megatron", "bfloat16", True) == "bf16"
    assert folded_grad_accum_dtype("megatron-deepspeed", "fp32", False) == "fp32"
    with pytest.raises(ValueError, match=r"^--grad-reduce-in-bf16 is --grad-accum-dtype bf16 under framework "
                                         r"megatron; it contradicts --grad-accum-dtype fp32$"):
        folded_grad_accum_dtype("megatron", "fp32", True)
    with pytest.raises(ValueError, match=r"^'grad_reduce_in_bf16' is 'grad_accum_dtype' bf16 under framework "
                                         r"megatron; it contradicts 'grad_accum_dtype' float32$"):
        folded_grad_accum_dtype("megatron", "float32", True, accum_name="'grad_accum_dtype'",
                                bf16_name="'grad_reduce_in_bf16'")
    with pytest.raises(ValueError, match="needs framework megatron.*FSDP_DTYPE"):
        folded_grad_accum_dtype("hf", None, True, fsdp_name="FSDP_DTYPE")
    from wattcast.cli import app
    from wattcast.sweep import SweepSpecError, load_spec

    r = CliRunner().invoke(app, ["predict", "-m", "gpt2", *ARGS, "--framework", "megatron", "--grad-reduce-in-bf16",
                                 "--grad-accum-dtype", "fp32"])
    assert r.exit_code == 2 and "--grad-reduce-in-bf16 is --grad-accum-dtype bf16 under framework megatron; it " \
                                "contradicts --grad-accum-dtype fp32" in _out(r)
    spec = dict(models=["gpt2"], clusters=["DGX-A100"], gpus=[8], batch=32, seq=1024, framework="megatron")
    with pytest.raises(SweepSpecError, match="'grad_reduce_in_bf16' is 'grad_accum_dtype' bf16 under framework "
                                             "megatron; it contradicts 'grad_accum_dtype' fp32"):
        load_spec(dict(spec, grad_reduce_in_bf16=True, grad_accum_dtype="fp32"))
