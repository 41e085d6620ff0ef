"""``--framework hf --zero 2`` is PyTorch FSDP's ``ShardingStrategy.SHARD_GRAD_OP`` (torch 2.13
``torch/distributed/fsdp``; simulate/distributed.py ``fsdp_shard_grad_op``): every micro-batch's forward all-gathers
each unit, the gathered parameters are kept through the backward (``_post_forward_reshard`` frees only under a
reshard-after-forward strategy, ``_runtime_utils.py`` l. 486-500; ``needs_unshard`` is then False in the backward,
``_flat_param.py`` l. 1385-1393), and each unit's gradient is reduce-scattered as its backward ends. Until this stop it
had ZeRO-1's once-a-step bucketed reduction and parameter all-gather after the step."""
import pytest

import wattcast
from wattcast.simulate.distributed import (DistributedOptions, ParallelConfig, collective_ms, fsdp_shard_grad_op,
                                           per_unit_collectives, schedule_context)

# gpt2 (12 blocks: FSDP's units) on 4 A100s, batch 16 of micro-batches of 1: 4 micro-batches per step
KW = dict(gpus=4, batch=16, seq=512, micro_batch=1, framework="hf", trace=True)
N_MICRO, UNITS, DP = 4, 12, 4


def _run(zero, **extra):
    return wattcast.predict_cluster("gpt2", "DGX-A100", zero=zero, **KW, **extra)


def _task_ms(r, kind):
    return [e["end_ms"] - e["start_ms"] for e in r.events if e["stream"] == "compute" and e["name"][0] == kind
            and e["name"][1:].isdigit()]


def _one_collective_ms(op, nbytes):
    par = ParallelConfig(gpus=4, dp=4, micro_batch=1, zero=2)
    ctx = schedule_context("gpt2", "DGX-A100", par, DistributedOptions(batch=16, seq=512, dtype="bf16", framework="hf"))
    return collective_ms(ctx.cm, [op], [nbytes], ctx.lay["dp"], ctx.cl)[0][0]


def test_only_hf_zero2_is_shard_grad_op():
    assert fsdp_shard_grad_op("hf", 2)
    assert not any(fsdp_shard_grad_op(f, z) for f, z in (("hf", 1), ("hf", 3), ("megatron", 2),
                                                          ("megatron-deepspeed", 2)))
    assert per_unit_collectives("hf", 2) and per_unit_collectives("megatron", 3)
    assert not per_unit_collectives("megatron", 2) and not per_unit_collectives("hf", 1)
    # PyTorch FSDP: hf's ZeRO-2 (SHARD_GRAD_OP) and ZeRO-3 (FULL_SHARD), no other framework's
    from wattcast.simulate.stage_memory import pytorch_fsdp
    assert pytorch_fsdp("hf", 2) and pytorch_fsdp("hf", 3)
    assert not any(pytorch_fsdp(f, z) for f, z in (("hf", 0), ("hf", 1), ("megatron", 2), ("megatron", 3),
                                                    ("megatron-deepspeed", 3)))


def test_hf_zero2_gathers_in_forward_reduce_scatters_in_backward_every_micro_batch():
    """Hand count, gpt2 dp 4: per micro-batch 12 all-gathers of params/12 x 2 B (bf16 param_dtype) in the forward, none
    in the backward, and 12 reduce-scatters of params/12 x 2 B (reduce_dtype = param_dtype by default; fp32 doubles
    them); nothing after the step."""
    z2 = _run(2)
    p = z2.per_device[0]["params"]
    c = z2.comm
    assert c["dp_zero2_gathers_per_micro"] == UNITS and c["dp_zero2_collectives_per_micro"] == UNITS
    assert c["dp_zero2_gather_bytes_per_micro"] == pytest.approx(p * 2, rel=1e-12)
    assert c["dp_zero2_bytes_per_micro"] == pytest.approx(p * 2, rel=1e-12)
    assert c["dp_zero2_gather_ms_per_micro"] == pytest.approx(UNITS * _one_collective_ms("all_gather", p * 2 / UNITS),
                                                              rel=1e-9)
    assert c["dp_zero2_ms_per_micro"] == pytest.approx(UNITS * _one_collective_ms("reduce_scatter", p * 2 / UNITS),
                                                       rel=1e-9)
    assert c["dp_sync_ms"] == 0.0 and c["dp_param_gather_ms"] == 0.0
    names = sorted(e["name"] for e in z2.events if e["stream"] == "comm")
    assert names == sorted([f"zero2.all_gather{m}" for m in range(N_MICRO)]
                           + [f"zero2.reduce_scatter{m}" for m in range(N_MICRO)])
    fp32 = _run(2, fsdp_reduce_dtype="fp32").comm
    assert fp32["dp_zero2_bytes_per_micro"] == pytest.approx(p * 4, rel=1e-12)
    assert fp32["dp_zero2_gather_bytes_per_micro"] == pytest.approx(p * 2, rel=1e-12)


# gpt2's FSDP root unit (embeddings wte + wpe, final LayerNorm; the head is tied to wte): kept unsharded from the forward
# to the end of the backward, so FULL_SHARD's backward re-gathers the 12 blocks alone (stop 58, audit 58e)
GPT2_ROOT = 50257 * 768 + 1024 * 768 + 2 * 768


def test_hf_zero2_backward_has_no_regather():
    """In series (hf's default, as its ZeRO-3): the forward tasks are ZeRO-3's (the same gathers), each backward task
    is ZeRO-3's less the re-gathers FULL_SHARD runs and SHARD_GRAD_OP does not (the blocks', the root unit staying
    gathered: torch 2.13 _runtime_utils.py l. 493-500); prefetched, the collectives hide."""
    z2, z3 = _run(2), _run(3)
    gather = z2.comm["dp_zero2_gather_ms_per_micro"]
    assert gather > 0
    p = z3.to_dict()["param_count"]
    regather = UNITS * _one_collective_ms("all_gather", (p - GPT2_ROOT) * 2 / UNITS)
    assert 0 < regather < gather
    assert _task_ms(z2, "F") == pytest.approx(_task_ms(z3, "F"), rel=1e-12)
    assert _task_ms(z2, "B") == pytest.approx([b - regather for b in _task_ms(z3, "B")], rel=1e-9)
    assert z3.comm["dp_zero3_ms_per_micro"] == pytest.approx(gather + regather + z2.comm["dp_zero2_ms_per_micro"],
                                                             rel=1e-9)
    assert z2.step_time_ms < z3.step_time_ms
    pre = _run(2, zero3_prefetch=True)
    assert sum(_task_ms(pre, "B")) < sum(_task_ms(z2, "B"))
    assert sum(_task_ms(pre, "F")) < sum(_task_ms(z2, "F"))


def test_hf_zero2_memory_holds_every_unit_unsharded():
    """SHARD_GRAD_OP's persistent parameter is the fp32 flat shard (weights p x 4 / dp, no master copy), the gradients
    between micro-batches the 1/dp shard; every unit's bf16 parameters are held unsharded from the forward to the
    backward (buffers: ZeRO-1's + p x 2), where FULL_SHARD holds two blocks and the root."""
    z1, z2, z3 = _run(1), _run(2), _run(3)
    p = z2.per_device[0]["params"]
    m1, m2, m3 = (r.to_dict()["memory"] for r in (z1, z2, z3))
    assert m2["weights_gb"] == pytest.approx(p * 4 / DP / 1e9, rel=1e-12) and m2["master_weights_gb"] == 0.0
    assert m2["gradients_gb"] == pytest.approx(p * 4 / DP / 1e9, rel=1e-12)
    assert m2["buffers_gb"] - m1["buffers_gb"] == pytest.approx(p * 2 / 1e9, rel=1e-9)
    assert m2["unsharded_gradients_gb"] == pytest.approx(m3["unsharded_gradients_gb"], rel=1e-12)
    assert m2["unsharded_gradients_gb"] > 0
    assert m2["post_backward_buffers_gb"] == pytest.approx(m3["post_backward_buffers_gb"], rel=1e-12)
    assert m3["buffers_gb"] < m2["buffers_gb"] and m3["total_gb"] < m2["total_gb"]
