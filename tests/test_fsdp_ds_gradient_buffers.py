"""Gradient buffers of the sharded data-parallel frameworks, against the framework source each term follows.

- PyTorch FSDP (framework hf, ZeRO-3; torch 2.13 ``torch/distributed/fsdp/_runtime_utils.py``): the unsharded gradient
  of the unit being reduce-scattered (``_post_backward_hook``: the gradient in the parameters' dtype kept until the
  reduce-scatter ends, its ``reduce_dtype`` cast when that differs, the new 1/dp shard of ``_get_reduce_scatter_tensors``),
  a second unit's with the collectives prefetched, and the LM head's gradient (the backward's first, reduced with the
  root unit at the backward's end) beside the activations: the ``unsharded_gradients_gb`` line. At the end of the
  backward the root unit's views' gradients and their concatenated flat gradient (``SplitWithSizesBackward``) in
  ``post_backward_buffers_gb``, beside the root's parameters and the first block's gradient in reduction, no block's
  parameters (stop 43; stop 42 kept two blocks' there). Until stop 42 none of these was counted.
- DeepSpeed ZeRO-2/3 (framework megatron-deepspeed; DeepSpeed 0.19.8): gradient partitions in the model's dtype
  (``stage_1_and_2.py`` ``grads_in_partition``, ``stage3.py`` ``grad_partitions_flat_buffer`` in
  ``gradient_accumulation_dtype`` = the model's, ``engine.py`` ``get_data_types``), not half + fp32 (6 B for bf16)
  as ``BF16_Optimizer``; the 5e8-element reduce bucket held through the passes, full size (not / dp); ZeRO-3's
  5e7-element prefetch bucket; fp32 gradients of the partition at the step (ZeRO-3 one 1e9-element sub-group).
"""

from __future__ import annotations

import numpy as np
import pytest

import wattcast
from wattcast.simulate.stage_memory import (CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, buffer_bytes,
                                            held_gradient_bytes, stage_memory, stage_memory_gb, stage_total_gb)

# Pythia-160M (EleutherAI/pythia-160m config.json): hidden 768, 12 layers, vocab 50,304, untied embed_in / embed_out
H, VOCAB = 768, 50304
BLOCK = 12 * H * H + 13 * H  # a GPT-NeoX block (tests/test_fsdp_root_unit.py)
HEAD = VOCAB * H + 2 * H  # embed_out and the final LayerNorm: the layers after the blocks
ROOT = 2 * VOCAB * H + 2 * H
CTX = CUBLAS_WORKSPACE_BYTES + CUDA_CONTEXT_BYTES
KW = dict(gpus=16, batch=32, seq=1024, micro_batch=2, dtype="bf16")


def _fsdp_inflight(block, head, db, rb, dp, units):
    """The source's buffers, written out: head gradient + ``units`` unsharded unit gradients (param dtype) + the
    reduce dtype cast of the one being reduced (if it differs) + its new shard."""
    return head * db + units * block * db + (block * rb if rb != db else 0) + block / dp * rb


@pytest.mark.parametrize("reduce_dtype,rb", [(None, 2), ("fp32", 4)])
@pytest.mark.parametrize("prefetch", [False, True])
def test_fsdp_unsharded_gradients_line(reduce_dtype, rb, prefetch):
    r = wattcast.predict_cluster("pythia_160m", "DGX-A100", zero=3, framework="hf", fsdp_reduce_dtype=reduce_dtype,
                                 zero3_prefetch=prefetch, **KW)
    mem = r.memory
    assert r.to_dict()["param_count"] == 12 * BLOCK + ROOT
    expected = _fsdp_inflight(BLOCK, HEAD, 2, rb, 16, 2 if prefetch else 1)
    assert mem["unsharded_gradients_gb"] * 1e9 == pytest.approx(expected, rel=1e-9)
    # held beside the activations: the total counts it (the passes' peak beats the end-of-backward one here)
    states = mem["weights_gb"] + mem["master_weights_gb"] + mem["gradients_gb"] + mem["optimizer_gb"]
    assert mem["total_gb"] == pytest.approx(states + mem["activations_gb"] + mem["transient_gb"] + mem["buffers_gb"]
                                            + mem["unsharded_gradients_gb"], rel=1e-12)


def _fsdp_end_of_backward(block, root, db, rb, dp):
    """torch 2.13 FSDP1 at the root's gradient, written out: the root's unsharded parameters; the first block's
    gradient still in its reduce-scatter (param dtype + reduce-dtype cast if it differs + 1/dp shard; its parameters
    were freed by its own ``_post_backward_reshard`` and nothing was prefetched for it); then the larger of
    SplitWithSizesBackward's views' gradients + flat gradient (2 x root, param dtype) and, after the root's reshard,
    its gradient, cast and new shard."""
    block_grad = block * db + (block * rb if rb != db else 0) + block / dp * rb
    split = 2 * root * db
    reduce = root * (db + (rb if rb != db else 0)) + root / dp * rb - root * db
    return CTX + root * db + block_grad + max(split, reduce)


def test_fsdp_root_gradient_at_the_end_of_the_backward():
    """No block's unsharded parameters at the backward's end (stop 42 kept the running and the prefetched block's,
    2 x block x dtype, there); the first block's gradient in reduction is."""
    for rb in (2, 4):
        during, after = buffer_bytes("hf", params=1e9, grad_bytes=4, dtype_bytes=2, zero=3, dp=8, block_params=1e7,
                                     root_params=5e8, reduce_bytes=rb)
        assert during == pytest.approx(CTX + (2e7 + 5e8) * 2)
        assert after == pytest.approx(_fsdp_end_of_backward(1e7, 5e8, 2, rb, 8), rel=1e-12)


@pytest.mark.parametrize("reduce_dtype,rb", [(None, 2), ("fp32", 4)])
def test_llama3_70b_fsdp_end_of_backward_bytes(reduce_dtype, rb):
    """Llama 3 70B on 64 H100s (hf, FSDP, bf16): a block is 8,192^2 x 2 (q, o) + 8,192 x 1,024 x 2 (k, v, 8 KV
    heads) + 3 x 8,192 x 28,672 (SwiGLU) + 2 x 8,192 (its two RMSNorms) parameters, the root unit the untied
    128,256 x 8,192 embedding and head and the final norm's 8,192 (Meta's config.json; until the eager RMSNorm owned
    its weight, tests/test_stage_params_norms.py, the rank graph's unit sizes came to these without the norms).
    bf16 reduce: 14.88 GB after the backward (was 16.56: 1.68 GB of two blocks' parameters over); fp32 reduce:
    18.46 GB (was 16.70: the reduced block's gradient and its fp32 cast under)."""
    h, ffn, kv, vocab = 8192, 28672, 1024, 128256
    block = 2 * h * h + 2 * h * kv + 3 * h * ffn + 2 * h
    root = 2 * vocab * h + h
    r = wattcast.predict_cluster("llama3_70b", "DGX-H100", gpus=64, batch=64, seq=4096, micro_batch=1, dtype="bf16",
                                 zero=3, framework="hf", recompute="full", fsdp_reduce_dtype=reduce_dtype)
    # stop 42's figures are 1.7 GB off
    assert r.memory["post_backward_buffers_gb"] * 1e9 == pytest.approx(_fsdp_end_of_backward(block, root, 2, rb, 64),
                                                                       rel=1e-9)
    # the passes still hold the running and the prefetched block and the root unit
    assert r.memory["buffers_gb"] * 1e9 == pytest.approx(CTX + (2 * block + root) * 2, rel=1e-9)


def test_fsdp_lines_only_under_fsdp():
    kw = dict(params=np.array([1e9]), act_bytes_per_chunk=np.array([1e9]), inflight=np.array([1]),
              full_recompute_extra_bytes=0.0, dtype_bytes=2, grad_bytes=4, held_grad_bytes=4, optimizer="adamw", dp=8,
              block_params=1e7, root_params=np.array([5e8]), head_params=np.array([2e8]), reduce_bytes=2)
    for fw, zero in (("hf", 0), ("hf", 1), ("megatron", 1), ("megatron-deepspeed", 3)):
        assert stage_memory_gb(framework=fw, zero=zero, **kw)["unsharded_gradients_gb"][0] == 0.0
    # Megatron-FSDP's ZeRO-3 has its own line since stop 46 (until then none): its reduce-scatter queue holds 1e9
    # elements of 1e7-parameter layers' fp32 buckets, + the launched and the filling one, at most the stage's 1e9
    # (tests/test_megatron_fsdp_source.py)
    assert stage_memory_gb(framework="megatron", zero=3, **kw)["unsharded_gradients_gb"][0] == pytest.approx(4.0)
    got = stage_memory_gb(framework="hf", zero=3, **kw)
    assert got["unsharded_gradients_gb"][0] * 1e9 == pytest.approx(_fsdp_inflight(1e7, 2e8, 2, 2, 8, 1))
    # FSDP's ZeRO-2 (SHARD_GRAD_OP) reduce-scatters each unit as its backward ends as FULL_SHARD does (until stop 45
    # hf zero 2 had no FSDP lines); it holds every unit's parameters unsharded instead of two blocks and the root
    z2 = stage_memory_gb(framework="hf", zero=2, **kw)
    assert z2["unsharded_gradients_gb"][0] == got["unsharded_gradients_gb"][0]
    assert (z2["buffers_gb"][0] - got["buffers_gb"][0]) * 1e9 == pytest.approx((1e9 - 2 * 1e7 - 5e8) * 2, rel=1e-9)
    np.testing.assert_array_equal(stage_total_gb(framework="hf", zero=2, **kw), z2["total_gb"])
    # the search's total alone and the scalar StageMemory agree with the per-term arrays
    np.testing.assert_array_equal(stage_total_gb(framework="hf", zero=3, **kw), got["total_gb"])
    one = stage_memory(params=1e9, act_bytes_per_chunk=1e9, inflight=1, full_recompute_extra_bytes=0.0, dtype_bytes=2,
                       grad_bytes=4, held_grad_bytes=4, optimizer="adamw", zero=3, dp=8, framework="hf",
                       block_params=1e7, root_params=5e8, head_params=2e8, reduce_bytes=2)
    assert one.to_gb_dict()["total_gb"] == pytest.approx(float(got["total_gb"][0]), rel=1e-12)


def test_llama3_70b_root_gradient_counted():
    """The brief's figure: Llama 3 70B's untied head (128,256 x 8,192, bf16) is 2.1 GB of gradient held beside the
    activations under FSDP."""
    r = wattcast.predict_cluster("llama3_70b", "DGX-H100", gpus=64, batch=64, seq=4096, micro_batch=1, dtype="bf16",
                                 zero=3, framework="hf")
    head = 128256 * 8192 + 8192  # lm_head and the final RMSNorm
    assert r.memory["unsharded_gradients_gb"] * 1e9 > head * 2


def test_deepspeed_gradient_partitions_in_model_dtype():
    assert held_gradient_bytes("megatron-deepspeed", "bf16", 2, zero=2) == 2
    assert held_gradient_bytes("megatron-deepspeed", "bf16", 2, zero=3) == 2
    assert held_gradient_bytes("megatron-deepspeed", "fp16", 2, zero=3) == 2
    assert held_gradient_bytes("megatron-deepspeed", "bf16", 2, zero=1) == 6  # BF16_Optimizer below ZeRO-2
    r = wattcast.predict_cluster("gpt2", "DGX-A100", zero=3, framework="megatron-deepspeed", **KW)
    assert r.memory["gradients_gb"] * 1e9 == pytest.approx(r.to_dict()["param_count"] * 2 / 16, rel=1e-9)


@pytest.mark.parametrize("zero", [2, 3])
def test_deepspeed_buckets(zero):
    params, dp = np.array([3e9, 1e8]), 8
    during, after = buffer_bytes("megatron-deepspeed", params=params, grad_bytes=2, dtype_bytes=2, zero=zero, dp=dp,
                                 block_params=1e7)
    held = 5e8 * 2 + (5e7 * 2 if zero == 3 else 0)  # reduce bucket (+ ZeRO-3 prefetch bucket), whatever the model
    np.testing.assert_allclose(np.broadcast_to(during, 2), CTX + held)
    part = params / dp if zero == 2 else np.minimum(params / dp, 1e9)
    np.testing.assert_allclose(after, CTX + held + part * 4)
