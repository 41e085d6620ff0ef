"""FSDP's root unit (framework hf, ZeRO-3): PyTorch FSDP gathers the parameters outside the wrapped transformer blocks
(embeddings, final norm, an untied LM head) at the start of the forward and keeps them unsharded until the backward
ends (torch 2.13 ``torch/distributed/fsdp/_runtime_utils.py`` ``_post_forward_reshard``: ``free_unsharded_flat_param =
not state._is_root and ...``; FSDP2 ``_fully_shard/_fsdp_state.py``: "For the root, do not reshard after forward").
Until stop 41 only the running and the prefetched block were counted."""

from __future__ import annotations

import numpy as np
import pytest

import wattcast
from wattcast.simulate.stage_memory import CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, buffer_bytes

# Pythia-160M (EleutherAI/pythia-160m config.json): hidden 768, 12 layers, vocab 50,304, untied embed_in / embed_out
H, VOCAB = 768, 50304
# a GPT-NeoX block: qkv 3h^2 + 3h, dense h^2 + h, MLP 4h^2 + 4h and 4h^2 + h, two LayerNorms 4h
BLOCK = 12 * H * H + 13 * H
# the root unit: embed_in and embed_out (vocab x hidden each) and the final LayerNorm (2h)
ROOT = 2 * VOCAB * H + 2 * H
KW = dict(gpus=16, batch=32, seq=1024, micro_batch=2, dtype="bf16")


def test_fsdp_buffers_hold_the_root_unit_unsharded():
    r = wattcast.predict_cluster("pythia_160m", "DGX-A100", zero=3, framework="hf", **KW)
    assert r.to_dict()["param_count"] == 12 * BLOCK + ROOT  # the graph is the model the figures below assume
    # the running and the prefetched block and the root unit, bf16 (FSDP's param_dtype), plus the workspace and context
    expected = CUBLAS_WORKSPACE_BYTES + CUDA_CONTEXT_BYTES + (2 * BLOCK + ROOT) * 2
    assert r.memory["buffers_gb"] * 1e9 == pytest.approx(expected, rel=1e-9)


def test_root_unit_only_under_fsdp():
    """DDP (hf ZeRO-0), hf ZeRO-1 and DeepSpeed's ZeRO-3 (per-module fetch and release, no root unit) hold no root unit."""
    for fw, zero in (("hf", 0), ("hf", 1), ("megatron-deepspeed", 3)):
        with_root = buffer_bytes(fw, params=1e9, grad_bytes=4, dtype_bytes=2, zero=zero, dp=8, block_params=1e7,
                                 root_params=5e8)
        without = buffer_bytes(fw, params=1e9, grad_bytes=4, dtype_bytes=2, zero=zero, dp=8, block_params=1e7)
        assert with_root == without
    got = buffer_bytes("hf", params=np.array([1e9, 1e9]), grad_bytes=4, dtype_bytes=2, zero=3, dp=8, block_params=1e7,
                       root_params=np.array([5e8, 0.0]))[0]
    np.testing.assert_allclose(got - (CUBLAS_WORKSPACE_BYTES + CUDA_CONTEXT_BYTES), [(2e7 + 5e8) * 2, 2e7 * 2])
