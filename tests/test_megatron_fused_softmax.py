"""Megatron's FusedScaleMaskSoftmax.is_kernel_available: where the fused kernel does not run, torch's softmax does."""

from __future__ import annotations

import pytest

from wattcast.featurize.hf_models import fused_softmax_batch_per_block, megatron_fused_softmax_available
from wattcast.featurize.workload import StepOptions, step_graph


def _gpt(heads: int = 16, **kw) -> dict:
    return {"model_type": "gpt2", "n_embd": 64 * heads, "n_head": heads, "n_layer": 2, "n_positions": 1024,
            "vocab_size": 50257, "activation_function": "gelu", "_name_or_path": "tiny-gpt", **kw}


def _names(framework: str, tp: int, batch: int, dtype: str = "fp16", seq: int = 1024, **kw) -> list[str]:
    g = step_graph(_gpt(**kw), StepOptions(batch=batch, seq=seq, dtype=dtype, mode="train", framework=framework, tp=tp))
    n = g.nodes
    return list(n.loc[n["layer"] == 0, "name"].astype(str))


def test_kernel_availability_follows_megatron_rule():
    # megatron-core 0.16.1 fused_softmax.py l. 252-270: b x heads per rank a multiple of 4 (4 batches a block, sk > 128)
    assert fused_softmax_batch_per_block(1024) == 4 and fused_softmax_batch_per_block(128) == 8
    assert fused_softmax_batch_per_block(32) == 8 and fused_softmax_batch_per_block(4096) == 4
    assert megatron_fused_softmax_available("fp16", 1, 4, 1024, 1024)
    assert not megatron_fused_softmax_available("fp16", 1, 2, 1024, 1024)  # GPT 16 heads, TP 8, micro-batch 1
    assert megatron_fused_softmax_available("bf16", 2, 2, 1024, 1024)
    assert not megatron_fused_softmax_available("fp32", 4, 4, 1024, 1024)
    assert not megatron_fused_softmax_available("fp16", 4, 4, 8192, 8192)  # sk > 4096
    assert not megatron_fused_softmax_available("fp16", 4, 4, 16, 16)  # sk <= 16
    assert not megatron_fused_softmax_available("fp16", 4, 4, 1022, 1022)  # sq, sk not multiples of 4
    assert not megatron_fused_softmax_available("fp16", 1, 4, 64, 64)  # 4 batches, 8 a block at sk <= 128 (causal)
    assert megatron_fused_softmax_available("fp16", 1, 4, 64, 64, causal=False)  # a padding mask: sq 64 % 8 == 0


@pytest.mark.parametrize("framework", ["megatron-deepspeed", "megatron"])
def test_gpt_falls_back_to_torch_softmax_where_the_kernel_is_unavailable(framework):
    """16 heads at TP 8: micro-batch 1 has 2 attention batches a rank (not a multiple of 4), so Megatron runs
    forward_torch_softmax (the masked fill and torch's softmax); micro-batch 2 and TP 4 keep the fused kernel."""
    fallback = _names(framework, 8, 1)
    assert "attn.mask" in fallback and "attn.softmax" in fallback
    for tp, batch in ((8, 2), (4, 1)):
        fused = _names(framework, tp, batch)
        assert "attn.mask" not in fused and "attn.softmax_float" not in fused and "attn.softmax" in fused
    # Megatron-DeepSpeed's default query-key layer scaling forces softmax_in_fp32 and a scale by the layer number:
    # input.float(), * scale, masked_fill_, softmax (fp32), .half(); Megatron-LM 0.19.2's defaults: mask and softmax only
    fp32 = {"attn.softmax_float", "attn.scale", "attn.softmax_half"}
    assert fp32 <= set(fallback) if framework == "megatron-deepspeed" else not fp32 & set(fallback)


def test_fp32_softmax_kernels_run_in_fp32_and_the_config_can_turn_scaling_off():
    g = step_graph(_gpt(), StepOptions(batch=1, seq=1024, dtype="fp16", mode="train", framework="megatron-deepspeed", tp=8))
    n = g.nodes[g.nodes["layer"] == 0]
    soft = n[n["name"].str.match(r"attn\.(scale|mask|softmax)(\.grad\d?)?$")]
    assert len(soft) == 6 and set(soft["dtype"]) == {"fp32"}
    off = _names("megatron-deepspeed", 8, 1, apply_query_key_layer_scaling=False)
    assert "attn.mask" in off and "attn.scale" not in off and "attn.softmax_float" not in off
    on = _names("megatron", 8, 1, attention_softmax_in_fp32=True)
    assert "attn.softmax_float" in on and "attn.scale" not in on
