"""Model FLOPs (MFU's numerator) do not depend on the attention kernel (audit 54a, finding 2).

Until this change ``simulate/single_device.model_flops`` summed the kernels' own FLOPs: the fused attention counts the
pairs its mask keeps (causal: half the S x S), the eager one computes, and so counted, all S x S plus the softmax work
on the scores. Llama 3 8B at 8,192 tokens read 3.80e15 model FLOPs a step with ``--attention eager`` against 3.37e15
with flash (+12.7%), GPT-3 175B at 2,048 tokens +1.4%, BERT (non-causal: the softmax side alone) +0.16%. Now an eager
attention's score and context products count at the mask's share of the pairs (Megatron-LM's convention for causal
attention, ``featurize.op_graph.attention_pair_share``) and its softmax-side kernels in hardware FLOPs only (HFU);
the kernels' own ``flops`` (costing, power, roofline) and every time are as before."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.featurize.op_graph import GraphBuilder, attention_pair_share
from wattcast.featurize.workload import step_graph
from wattcast.simulate.single_device import model_flops

#: a small Mistral-style config whose every layer has a 128-key sliding window
WINDOWED = {"model_type": "mistral", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 4,
            "num_hidden_layers": 2, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 8192,
            "sliding_window": 128}


def _pair(model, **kw):
    return [wattcast.predict(model, "H100-SXM", attention=a, **kw) for a in ("flash", "eager")]


def test_pair_share_is_the_fused_kernels():
    """The share the fused kernel computes (its FLOPs, unchanged: 4 b h s skv d x share) is the one model FLOPs take."""
    assert attention_pair_share(1024, 1024, causal=True) == 0.5
    assert attention_pair_share(1024, 1024, causal=False) == 1.0
    assert attention_pair_share(1, 4097, causal=True) == 1.0  # a decode step sees every cached key
    assert attention_pair_share(16, 4112, causal=True) == pytest.approx(1 - 15 / (2 * 4112))
    assert attention_pair_share(512, 512, causal=True, window=128) == pytest.approx((128 * 512 - 128 * 127 / 2) / 512**2)
    b = GraphBuilder(dtype="bf16")
    q = b.input((2, 4, 256, 64))
    b.flash_attention(q, q, q, causal=True, name="f")
    assert b.build().nodes["flops"].iloc[-1] == 4.0 * 2 * 4 * 256 * 256 * 64 * 0.5


@pytest.mark.parametrize("model,kw", [
    ("gpt2", dict(batch=1, seq=1024)),  # causal, learned positions, the strided q/k/v copies
    ("bert_base", dict(batch=2, seq=512)),  # encoder: no mask to halve, the softmax side only
    (WINDOWED, dict(batch=1, seq=512)),  # sliding window: the fused kernel's band
    ("llama3_8b", dict(batch=2, seq=16, mode="inference", kv_context=1024)),  # KV cache: s < skv
])
def test_eager_and_flash_count_the_same_model_flops(model, kw):
    flash, eager = _pair(model, **kw)
    assert eager.flops == pytest.approx(flash.flops, rel=1e-6)
    assert eager.step_time_ms != flash.step_time_ms  # the kernels (and their costs) differ


def test_eager_products_count_their_share_and_the_softmax_side_none():
    g = step_graph("gpt2", mode="train", batch=1, seq=256, attention="eager")
    n = g.nodes
    lay = n[(n["layer"] == 0) & ~n["recompute"]]
    share = dict(zip(lay["name"], lay["model_share"]))
    for name in ("attn.qk", "attn.pv", "attn.qk.grad_a", "attn.qk.grad_b", "attn.pv.grad_a", "attn.pv.grad_b"):
        assert share[name] == 0.5, name
    for name in ("attn.scale", "attn.mask", "attn.softmax", "attn.dropout"):
        assert share[name] == 0.0, name
    assert share["attn.c_attn"] == 1.0 and share["mlp.c_fc"] == 1.0
    model, flash_rc, extra = model_flops(n)
    work = (n["phase"] != "optimizer") & ~n["recompute"]
    # what the model FLOPs leave out is hardware work: the two add up to every kernel's FLOPs
    assert flash_rc == 0.0 and model + extra == pytest.approx(float(n.loc[work, "flops"].sum()), rel=1e-12)
    assert extra > 0


def test_cluster_mfu_is_the_kernels_and_hfu_keeps_the_eager_work():
    """``predict --cluster``: Llama-architecture under Megatron-Core with full recomputation, eager against flash: the
    same model FLOPs; the eager step's HFU counts the masked pairs and the softmax side (above its MFU)."""
    kw = dict(gpus=2, batch=2, seq=1024, tp=2, micro_batch=1, sp=True, framework="megatron", recompute="full")
    flash, eager = (wattcast.predict_cluster(WINDOWED | {"sliding_window": None}, "DGX-H100", attention=a, **kw)
                    for a in ("flash", "eager"))
    assert eager.flops == pytest.approx(flash.flops, rel=1e-6)
    assert eager.mfu == pytest.approx(flash.mfu * flash.step_time_ms / eager.step_time_ms, rel=1e-4)
    assert eager.hfu > eager.mfu and flash.hfu > flash.mfu
