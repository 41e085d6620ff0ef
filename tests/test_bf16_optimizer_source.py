"""DeepSpeed 0.19.8's ``BF16_Optimizer`` under megatron-deepspeed, term by term from its source.

- What crosses the wire (``runtime/pipe/engine.py`` ``_exec_reduce_grads`` l. 286-297 -> ``_bf16_reduce_grads`` ->
  ``engine.py`` ``buffered_allreduce_fallback`` l. 3921-3934 -> ``get_grads_for_reduction``, the optimizer's flat
  accumulation buffers, ``bf16_optimizer.py`` l. 541-544 -> ``allreduce_no_retain`` -> ``allreduce_bucket``
  l. 3795-3821): the fp32 buffer is cast to ``communication_data_type`` -- by default the model's bf16 (l. 1719-1730;
  ``constants.py`` l. 216: config default None) -- and ``dist.all_reduce``-d: 2 B/param in an all-reduce (not the
  distributed optimizer's reduce-scatter); the cast's bf16 copy of the whole group is made at that moment (a single
  tensor flattens to a view: no fp32 copy).
- ZeRO-2/3: ``_do_optimizer_sanity_check`` (engine.py l. 2305-2311) never returns ``BFLOAT16`` above stage 1, so no
  fp32 accumulation pass and no fp32 ``_hp_grad``.
- ZeRO-0 with bf16 and a pipeline: ``BF16_Optimizer`` with ``grad_acc_dtype`` the model's bf16 (l. 2313-2320, the
  default ``get_data_types``): 2 + 2 B/param of gradients (l. 191), its fp32 master weights and moments sharded over DP
  (l. 152-183), a bf16 add per micro-batch (``_update_hp_grad`` l. 523: the cast is a no-op), the weights all-gathered
  after the step (``update_lp_params``, l. 593-603).
Until stop 43: a reduce-scatter, a 5e8-element bucket, 18 B/param every micro-batch at ZeRO-2/3, and ZeRO-0 as
unsharded BF16_Optimizer with fp32 accumulation.
"""

from __future__ import annotations

import pytest

import wattcast
from wattcast.simulate.distributed import (collective_ms, grad_accumulation_bytes, resolved_grad_accum_dtype,
                                           schedule_context, schedule_step, tied_grad_bytes)
from wattcast.simulate.options import DistributedOptions
from wattcast.simulate.parallel import ParallelConfig
from wattcast.simulate.stage_memory import (DEEPSPEED_BUCKET_ELEMENTS, held_gradient_bytes, stage_memory,
                                            stage_total_gb)

SMALL = {"model_type": "gpt2", "n_embd": 1024, "n_head": 16, "n_layer": 8, "n_positions": 2048, "vocab_size": 50257,
         "activation_function": "gelu", "_name_or_path": "gpt-small-bf16opt"}


def _step(zero: int, grad_accum_dtype: str | None = None):
    par = ParallelConfig(gpus=16, tp=2, pp=4, dp=2, micro_batch=1, zero=zero)
    ctx = schedule_context(SMALL, "DGX-A100", par, DistributedOptions(
        batch=16, seq=2048, dtype="bf16", attention="eager", framework="megatron-deepspeed",
        grad_accum_dtype=grad_accum_dtype, trace=True))
    return ctx, schedule_step(ctx)


@pytest.mark.parametrize("zero", [0, 1])
def test_bf16_optimizer_all_reduces_bf16_bytes(zero):
    ctx, r = _step(zero)
    s = int(r.memory["stage"])
    params = r.memory["weights_gb"] * 1e9 / 2  # the worst stage's bf16 weights (not sharded below ZeRO-3)
    assert params < DEEPSPEED_BUCKET_ELEMENTS  # one message
    wire = collective_ms(ctx.cm, ["all_reduce"], [params * 2.0], ctx.lay["dp"], ctx.cl)[0][0]
    assert r.comm["dp_sync_ms_by_stage"][s] == pytest.approx(wire, rel=1e-9)
    names = {e["name"] for e in r.events if e["name"].startswith("dp.")}
    assert any(n.startswith("dp.all_reduce") for n in names) and "dp.param_all_gather" in names
    assert not any("reduce_scatter" in n for n in names)
    # the ZeRO-1 optimizer (grad_accum_dtype bf16) all-reduces its buckets too (stage_1_and_2.py average_tensor with
    # use_multi_rank_bucket_allreduce, its default: tests/test_deepspeed_step_passes.py; a reduce-scatter until stop 44)
    _, z = _step(1, "bf16")
    assert any(e["name"].startswith("dp.all_reduce") for e in z.events)
    assert not any("reduce_scatter" in e["name"] for e in z.events)


@pytest.mark.parametrize("accum,zero,made", [(None, 1, 2.0), ("fp32", 0, 2.0), (None, 0, 0.0)])
def test_bf16_optimizer_reduce_buffer_is_its_cast_group(accum, zero, made):
    """fp32 accumulation: a bf16 copy of the whole flat buffer (beyond the 5e8-element bucket); bf16: nothing."""
    from wattcast.simulate.stage_memory import effective_grad_accum

    params, dp = 2.0e9, 8
    eff = effective_grad_accum("megatron-deepspeed", "bf16", zero, accum)
    held = held_gradient_bytes("megatron-deepspeed", "bf16", 2, zero, accum)
    assert held == (6 if eff == "fp32" else 4)
    kw = dict(act_bytes_per_chunk=1e9, inflight=2, full_recompute_extra_bytes=0.0, dtype_bytes=2, grad_bytes=2,
              held_grad_bytes=held, optimizer="adamw", zero=zero, dp=dp, framework="megatron-deepspeed",
              block_params=params / 10, grad_accum_dtype=eff)
    m = stage_memory(params=params, **kw)
    assert m.post_backward_buffers_bytes == pytest.approx(params * made, rel=1e-12)
    assert m.gradients_bytes == pytest.approx(params * held, rel=1e-12)
    # master weights (4 B) and Adam's moments (8 B) sharded over DP at ZeRO-0 too
    assert m.master_weights_bytes == pytest.approx(params * 4 / dp, rel=1e-12)
    assert m.optimizer_bytes == pytest.approx(params * 8 / dp, rel=1e-12)
    tot = stage_total_gb(params=[params], **{k: ([v] if k in ("act_bytes_per_chunk", "inflight") else v)
                                             for k, v in kw.items()})
    assert tot[0] * 1e9 == pytest.approx(m.total_bytes, rel=1e-12)


def test_no_bf16_optimizer_at_zero2_and_3():
    for zero in (2, 3):
        assert grad_accumulation_bytes("megatron-deepspeed", "bf16", None, zero) == (6.0, False)  # autograd, bf16
        assert tied_grad_bytes("megatron-deepspeed", "bf16", None, zero) == 2
        assert held_gradient_bytes("megatron-deepspeed", "bf16", 2, zero) == 2
        assert resolved_grad_accum_dtype("megatron-deepspeed", None, "bf16", zero) == "bf16"
    # the pass's time at ZeRO-2: autograd's 3 x 2 B over the rank's partition after the first micro-batch, as under
    # fp16 (the old 18 B every micro-batch was 6x it with two micro-batches)
    job = dict(gpus=8, batch=32, seq=1024, tp=1, pp=1, micro_batch=2, zero=2, framework="megatron-deepspeed")
    bf16 = wattcast.predict_cluster("gpt2", "DGX-A100", dtype="bf16", **job).comm["grad_accumulation_ms_per_micro"]
    fp16 = wattcast.predict_cluster("gpt2", "DGX-A100", dtype="fp16", **job).comm["grad_accumulation_ms_per_micro"]
    assert bf16 > 0 and bf16 == pytest.approx(fp16, rel=1e-9)


def test_zero0_is_bf16_optimizer_with_bf16_accumulation():
    assert grad_accumulation_bytes("megatron-deepspeed", "bf16", None, 0) == (6.0, True)  # bf16 add, every micro-batch
    assert grad_accumulation_bytes("megatron-deepspeed", "bf16", "fp32", 0) == (18.0, True)
    assert tied_grad_bytes("megatron-deepspeed", "bf16", None, 0) == 2
    assert held_gradient_bytes("megatron-deepspeed", "bf16", 2, 0) == 4
    ctx0, z0 = _step(0)
    ctx1, z1 = _step(1)
    d = z0.to_dict()
    assert d["parallel"]["grad_accum_dtype"] == "bf16"
    params = z0.memory["weights_gb"] * 1e9 / 2
    assert z0.memory["gradients_gb"] * 1e9 == pytest.approx(params * 4, rel=1e-9)
    # sharded like ZeRO-1's BF16_Optimizer: same master weights and moments
    assert z0.memory["master_weights_gb"] == pytest.approx(z1.memory["master_weights_gb"], rel=1e-12)
    assert z0.memory["optimizer_gb"] == pytest.approx(z1.memory["optimizer_gb"], rel=1e-12)
    assert z0.comm["embedding_grad_allreduce_bytes"] * 2 == pytest.approx(z1.comm["embedding_grad_allreduce_bytes"])
    assert z0.comm["dp_param_gather_ms"] > 0
    # the explicit fp32 that 0.19.8 refuses is warned and costed as the older BF16_Optimizer (fp32 buffer)
    r = wattcast.predict_cluster("gpt2", "DGX-A100", gpus=8, batch=32, seq=1024, tp=2, pp=2, micro_batch=2, zero=0,
                                 dtype="bf16", framework="megatron-deepspeed", grad_accum_dtype="fp32")
    assert any("NotImplementedError" in w for w in r.meta["warnings"])
    p = r.memory["weights_gb"] * 1e9 / 2
    assert r.memory["gradients_gb"] * 1e9 == pytest.approx(p * 6, rel=1e-9)
