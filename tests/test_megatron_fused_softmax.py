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


def _mc_attn(model: str, tp: int, batch: int, seq: int = 1024, dtype: str = "bf16", **cfg_kw) -> list[str]:
    from wattcast.featurize.hf_config import load_hf_config

    cfg = model
    if cfg_kw:
        cfg = {**load_hf_config(model).raw, **cfg_kw}
    g = step_graph(cfg, StepOptions(batch=batch, seq=seq, dtype=dtype, mode="train", framework="megatron", tp=tp,
                                    attention="eager", blocks=2))
    n = g.nodes
    f = n[(n["layer"] == 0) & (n["phase"] == "forward")]
    return list(f.loc[f["name"].str.startswith("attn."), "name"].astype(str))


@pytest.mark.parametrize("model,heads", [("llama3_8b", 32), ("deepseek_v3", 128)])
def test_megatron_core_attention_follows_the_fused_softmax_rule(model, heads):
    """Megatron-Core's DotProductAttention (megatron-core 0.16.1 dot_product_attention.py l. 100-109) holds the same
    FusedScaleMaskSoftmax: Llama and DeepSeek's MLA under --framework megatron run the one fused kernel (no separate
    scale or mask) where is_kernel_available allows it, else forward_torch_softmax's masked fill and softmax."""
    tp_fallback = heads // 2  # 2 attention batches a rank at micro-batch 1
    fused = _mc_attn(model, 8, 1)
    assert "attn.softmax" in fused and "attn.mask" not in fused and "attn.scale" not in fused
    fallback = _mc_attn(model, tp_fallback, 1)
    assert "attn.mask" in fallback and "attn.softmax" in fallback and "attn.softmax_float" not in fallback
    # softmax_in_fp32 (a config's attention_softmax_in_fp32): the cast to fp32 and back around the fallback
    assert {"attn.softmax_float", "attn.softmax_half"} <= set(_mc_attn(model, tp_fallback, 1,
                                                                       attention_softmax_in_fp32=True))
