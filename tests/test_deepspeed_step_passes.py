"""DeepSpeed 0.19.8's per-step memory passes and DP collective under megatron-deepspeed, from its source (stop 44).

- ``BF16_Optimizer`` (``runtime/bf16_optimizer.py``): ``clear_lp_grads`` zeroes the bf16 ``param.grad`` before each
  backward (l. 612-623; ``pipe/engine.py`` l. 838-840), so autograd adds into it in place (2 + 6 B/param every
  micro-batch after a step's first: the step's ``zero_grad`` frees them, l. 625-627); once per step the casts and
  1/dp scale around its all-reduce (``engine.py`` ``allreduce_bucket`` l. 3795-3821), the gradient norm and clipping
  over the whole (unsharded) gradient (``step`` l. 384-433, ``utils.py`` l. 946-991), the fp32 master partition
  copied into the bf16 weights (l. 593-597) and the accumulation buffer zeroed twice (l. 433, 627).
- the ZeRO-1/2 optimizer (``runtime/zero/stage_1_and_2.py``): with the default ``reduce_scatter: true`` and
  ``use_multi_rank_bucket_allreduce: true`` (``zero/config.py`` l. 108, 119) ``average_tensor`` (l. 1590-1720) puts
  every partition's slice under one ``("allreduce", group)`` key and ``allreduce_bucket`` (l. 2359-2392) runs
  ``dist.all_reduce`` on the whole bucket: no reduce-scatter.
Until stop 44 none of the BF16_Optimizer passes above were costed and the ZeRO optimizer was given a reduce-scatter.
"""

from __future__ import annotations

import pytest

import wattcast.simulate.distributed as dist_mod
from wattcast.simulate.distributed import (bf16_optimizer_lp_grad_bytes, bf16_optimizer_step_bytes, collective_ms,
                                           deepspeed_zero_search_notes, dp_reduce_op, schedule_context, schedule_step)
from wattcast.simulate.options import DistributedOptions
from wattcast.simulate.parallel import ParallelConfig
from wattcast.simulate.stage_memory import DEEPSPEED_BUCKET_ELEMENTS

SMALL = {"model_type": "gpt2", "n_embd": 1024, "n_head": 16, "n_layer": 8, "n_positions": 2048, "vocab_size": 50257,
         "activation_function": "gelu", "_name_or_path": "gpt-small-ds-passes"}


def _step(zero: int, grad_accum_dtype: str | None = None, pp: int = 1, dp: int = 4, batch: int = 16):
    par = ParallelConfig(gpus=2 * pp * dp, tp=2, pp=pp, dp=dp, micro_batch=1, zero=zero)
    ctx = schedule_context(SMALL, "DGX-A100", par, DistributedOptions(
        batch=batch, seq=2048, dtype="bf16", attention="eager", framework="megatron-deepspeed",
        grad_accum_dtype=grad_accum_dtype, trace=True))
    return ctx, schedule_step(ctx)


def _stage_params(r) -> float:
    return r.memory["weights_gb"] * 1e9 / 2  # the worst stage's bf16 weights (not sharded below ZeRO-3)


@pytest.mark.parametrize("accum,dp,clip,want", [
    # fp32 buffer: cast 6 + scale 4 + copy back 6, norm 4, clip 8, zeroed twice 8; partition: +2 (fp32 read of the
    # lp copy) - the graph's sharded clipping row (12)
    ("fp32", 8, True, (36.0, -10.0)),
    ("fp32", 1, True, (32.0, -10.0)),   # dp 1: no 1/dp scale (gradient_predivide_factor == dp), the casts still run
    ("fp32", 8, False, (28.0, 2.0)),    # no clipping: the norm only, no graph clipping row to replace
    # bf16 buffer: scale 4, norm over an fp32 copy 2 + 4 + 4, clip 4, zeroed twice 4; partition: +2, the cast to fp32
    # for the optimizer 6, - 12
    ("bf16", 8, True, (22.0, -4.0)),
    ("bf16", 1, True, (18.0, -4.0)),
])
def test_bf16_optimizer_step_bytes_follow_the_source(accum, dp, clip, want):
    assert bf16_optimizer_step_bytes(accum, dp, clip) == want


def test_lp_grad_passes_only_under_bf16_optimizer():
    assert bf16_optimizer_lp_grad_bytes("megatron-deepspeed", "bf16", None, 1) == 8.0   # BF16_Optimizer, fp32 buffer
    assert bf16_optimizer_lp_grad_bytes("megatron-deepspeed", "bf16", None, 0) == 8.0   # BF16_Optimizer, bf16 buffer
    assert bf16_optimizer_lp_grad_bytes("megatron-deepspeed", "bf16", "bf16", 1) == 0.0  # the ZeRO optimizer
    assert bf16_optimizer_lp_grad_bytes("megatron-deepspeed", "bf16", None, 2) == 0.0
    assert bf16_optimizer_lp_grad_bytes("megatron-deepspeed", "fp16", None, 1) == 0.0
    assert bf16_optimizer_lp_grad_bytes("megatron", "bf16", None, 1) == 0.0


@pytest.mark.parametrize("zero", [0, 1])
def test_bf16_optimizer_step_and_backward_carry_the_passes(zero, monkeypatch):
    """No pipeline (pp 1): the step time grows by exactly the passes streamed at the context's bandwidth."""
    ctx, r = _step(zero)
    n_micro = 16 // 4
    params = _stage_params(r)
    accum = "fp32" if zero == 1 else "bf16"
    whole, part = bf16_optimizer_step_bytes(accum, 4, True)
    bw = ctx.stream_gbps * 1e9
    step_ms = params * (whole + part / 4) / bw * 1e3
    lp_ms = n_micro * params * 8.0 * (n_micro - 1) / n_micro / bw * 1e3
    monkeypatch.setattr(dist_mod, "bf16_optimizer_step_bytes", lambda *a, **k: (0.0, 0.0))
    monkeypatch.setattr(dist_mod, "bf16_optimizer_lp_grad_bytes", lambda *a, **k: 0.0)
    _, old = _step(zero)
    assert r.optimizer_ms - old.optimizer_ms == pytest.approx(step_ms, rel=1e-6)
    assert r.step_time_ms - old.step_time_ms == pytest.approx(step_ms + lp_ms, rel=1e-6)
    assert step_ms > 0 and lp_ms > 0


@pytest.mark.parametrize("zero,accum", [(1, "bf16"), (2, None)])
def test_zero_optimizer_all_reduces_its_buckets(zero, accum):
    """Stage 1 all-reduces its bucket once, after the last backward (``dp.all_reduce``); stage 2 in every micro-batch's
    backward (``reduce_ready_partitions_and_remove_grads``, ``stage_1_and_2.py`` l. 2293-2295: ``zero2.all_reduce<m>``
    events, one per micro-batch, nothing after the step; until this stop stage 2 had stage 1's once-a-step sync)."""
    ctx, r = _step(zero, accum)
    names = [e["name"] for e in r.events if e["name"].startswith(("dp.", "zero2."))]
    s = int(r.memory["stage"])
    params = _stage_params(r)
    assert params < DEEPSPEED_BUCKET_ELEMENTS  # one bucket
    wire = collective_ms(ctx.cm, ["all_reduce"], [params * 2.0], ctx.lay["dp"], ctx.cl)[0][0]
    assert not any("reduce_scatter" in n for n in names)
    if zero == 1:
        assert any(n.startswith("dp.all_reduce") for n in names)
        assert r.comm["dp_sync_ms_by_stage"][s] == pytest.approx(wire, rel=1e-9)
    else:
        assert sorted(n for n in names if n != "dp.param_all_gather") == [f"zero2.all_reduce{m}" for m in range(16 // 4)]
        assert r.comm["dp_sync_ms_by_stage"][s] == 0.0
        assert r.comm["dp_zero2_ms_per_micro"] == pytest.approx(wire, rel=1e-9)
        assert r.comm["dp_zero2_bytes_per_micro"] == pytest.approx(params * 2.0, rel=1e-12)


def test_dp_reduce_op_per_framework():
    assert dp_reduce_op("megatron-deepspeed", 1) == dp_reduce_op("megatron-deepspeed", 2) == "all_reduce"
    assert dp_reduce_op("megatron", 1) == dp_reduce_op("hf", 2) == "reduce_scatter"
    assert dp_reduce_op("megatron", 0) == "all_reduce"


def test_search_says_why_zero0_can_beat_zero1():
    import wattcast

    assert deepspeed_zero_search_notes("megatron-deepspeed", "bf16", None)
    assert not deepspeed_zero_search_notes("megatron-deepspeed", "bf16", "bf16")
    assert not deepspeed_zero_search_notes("megatron-deepspeed", "fp16", None)
    assert not deepspeed_zero_search_notes("megatron", "bf16", None)
    space = dict(tp=[2], pp=[2], zero=[0, 1], micro_batch=[2], recompute=["none"], interleave=[1])
    res = wattcast.search("gpt2", "DGX-A100", 8, 32, 1024, framework="megatron-deepspeed", dtype="bf16",
                          max_configs=4, workers=1, **space)
    assert any("ZeRO-0 can rank ahead" in w for w in res.warnings)


def test_clear_lp_grads_set_to_none_drops_the_zero_and_add(monkeypatch):
    """DeepSpeed 0.6.5's ``clear_lp_grads`` (``bf16_optimizer.py`` l. 445-448) sets ``param.grad = None``: no zeroing,
    no in-place add. The option removes exactly the per-micro-batch pass; 0.19.8's zeroing stays the default."""
    assert bf16_optimizer_lp_grad_bytes("megatron-deepspeed", "bf16", None, 1, "set_to_none") == 0.0
    assert bf16_optimizer_lp_grad_bytes("megatron-deepspeed", "bf16", None, 1, "zero") == 8.0
    assert DistributedOptions(batch=1, seq=1).deepspeed_clear_lp_grads == "zero"
    with pytest.raises(ValueError, match="deepspeed_clear_lp_grads"):
        bf16_optimizer_lp_grad_bytes("megatron-deepspeed", "bf16", None, 1, "free")
    ctx, r = _step(1)
    par = ParallelConfig(gpus=8, tp=2, pp=1, dp=4, micro_batch=1, zero=1)
    ctx0 = schedule_context(SMALL, "DGX-A100", par, DistributedOptions(
        batch=16, seq=2048, dtype="bf16", attention="eager", framework="megatron-deepspeed",
        deepspeed_clear_lp_grads="set_to_none", trace=True))
    r0 = schedule_step(ctx0)
    n_micro = 4
    lp_ms = n_micro * _stage_params(r) * 8.0 * (n_micro - 1) / n_micro / (ctx.stream_gbps * 1e9) * 1e3
    assert r.step_time_ms - r0.step_time_ms == pytest.approx(lp_ms, rel=1e-6) and lp_ms > 0
    assert r.optimizer_ms == pytest.approx(r0.optimizer_ms, rel=1e-12)


def test_bloom_is_predicted_with_the_deepspeed_it_ran(monkeypatch):
    """benchmarks/published_runs.py predicts BLOOM-176B with DeepSpeed 0.6.5's param.grad = None."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import published_runs
    finally:
        sys.path.pop(0)
    seen = {}

    class _Stop(Exception):
        pass

    def fake(*a, **kw):
        seen.update(kw)
        raise _Stop

    monkeypatch.setattr(published_runs, "predict_distributed", fake)
    with pytest.raises(_Stop):
        published_runs.bloom_176b()
    assert seen["framework"] == "megatron-deepspeed" and seen["deepspeed_clear_lp_grads"] == "set_to_none"


def test_zero0_note_only_when_both_stages_are_searched():
    import wattcast

    assert deepspeed_zero_search_notes("megatron-deepspeed", "bf16", None, (0, 1, 2))
    assert not deepspeed_zero_search_notes("megatron-deepspeed", "bf16", None, (1,))
    assert not deepspeed_zero_search_notes("megatron-deepspeed", "bf16", None, (0, 2))
    space = dict(tp=[2], pp=[2], zero=[1], micro_batch=[2], recompute=["none"], interleave=[1])
    res = wattcast.search("gpt2", "DGX-A100", 8, 32, 1024, framework="megatron-deepspeed", dtype="bf16",
                          max_configs=4, workers=1, **space)
    assert not any("ZeRO-0 can rank ahead" in w for w in res.warnings)
