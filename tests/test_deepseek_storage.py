"""DeepSeek-V3's memory-saving storage (tech report arXiv 2412.19437 Sec. 3.2.3 and 3.3.3) as ``--fp8-recipe deepseek``,
DualPipe's shared embedding and head (Sec. 3.2.3) and DualPipe's per-rank activation peak with chunks of their own size:
the terms that kept DeepSeek-V3's published layout (2,048 GPUs, PP16 x EP64 x DP128, DualPipe) at 106.2 GB on 80 GB."""

from __future__ import annotations

import numpy as np
import pytest

import wattcast
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.dualpipe import peak_activation_bytes
from wattcast.simulate.memory import activation_bytes_by_layer

SEQ = 4096
H, FFN, TOPK, EP, N_EXP = 7168, 2048, 8, 64, 256  # DeepSeek-V3's config (hidden, moe ffn, top-8 of 256 experts)


def _graph(recipe="deepseek", recompute="selective:layernorm,mla_up_proj", **kw):
    o = dict(batch=1, seq=SEQ, mode="train", dtype="fp8", attention="flash", framework="megatron", blocks=4, ep=EP,
             recompute=recompute, fp8_recipe=recipe)
    return step_graph("deepseek_v3", StepOptions(**{**o, **kw}))


def test_one_moe_layer_by_hand():
    """One MoE layer (the fourth block), micro-batch 1 of 4,096 tokens, bytes a token, as the report stores it:"""
    s = 4  # fp32 scale per 1x128 tile (fine-grained quantisation, Sec. 3.3.2)
    residuals = 2 * H * 2  # the block input and the post-attention residual, bf16: the two RMSNorms re-made (3.2.3)
    latents = (1536 + 512 + 64) * 2  # q_a_proj's and kv_a_proj's outputs, the up-projections' inputs (3.2.3)
    att = 128 * 128 * 1.5 + 128 * 128 // 128 * s + 128 * 4  # o_proj's input once in E5M6 (3.3.3 (1)) + fp32 lse
    router = 256 * 2 + 256 * 2 + 2  # sigmoid scores and gate logits (bf16), the top-k normaliser
    dispatched = TOPK * (H + H // 128 * s)  # the FP8 tokens the up-projections keep (3.3.3, dispatched in FP8)
    swiglu_in = (TOPK + 1) * (2 * FFN + 2 * FFN // 128 * s)  # routed + shared SwiGLU inputs in FP8 (3.3.3 (2))
    per_token = residuals + latents + att + router + dispatched + swiglu_in
    per, _ = activation_bytes_by_layer(_graph())
    assert per[3] / SEQ == pytest.approx(per_token)  # 156,674 B a token: 642 MB a micro-batch
    # Transformer Engine's storage of the same layer (delayed recipe, the default): 254,594 B a token
    old, _ = activation_bytes_by_layer(_graph(recipe=None))
    assert old[3] / SEQ == pytest.approx(254594)


def test_swiglu_re_run_without_a_recompute_setting():
    g = _graph(recompute="none")
    rec = g.nodes[g.nodes["recompute"].astype(bool)]["name"]
    assert rec.str.contains(r"experts\.\d+\.swiglu").any() and rec.str.contains("shared_experts.swiglu").any()
    assert not rec.str.contains("linear_fc1").any()
    assert not _graph(recipe=None, recompute="none").nodes["recompute"].astype(bool).any()
    # moe_act given too changes nothing (the recipe's own recomputation, its FP8 input kept)
    a, _ = activation_bytes_by_layer(_graph(recompute="selective:layernorm,mla_up_proj,moe_act"))
    b, _ = activation_bytes_by_layer(_graph())
    assert a[3] == b[3]


def test_dispatch_in_fp8_combine_in_bf16():
    def a2a(recipe):
        n = _graph(recipe=recipe).nodes
        f = n[n["phase"] == "forward"]
        return (float(f.loc[f["name"].str.endswith("moe.dispatch"), "bytes"].iloc[0]),
                float(f.loc[f["name"].str.endswith("moe.combine"), "bytes"].iloc[0]))
    d_new, c_new = a2a("deepseek")
    d_old, c_old = a2a(None)
    assert c_new == c_old and d_new == pytest.approx(d_old / 2 * (1 + 4 / 128))


def test_recipe_refused_below_hopper():
    """Blockwise scaling's GPUs (Hopper, Blackwell; not Ada): DeepSeek's 128x128 / 1x128 scales need them too."""
    from types import SimpleNamespace
    from wattcast.featurize.fp8_recipes import unsupported_fp8_recipe
    ada = SimpleNamespace(arch="ada", vendor="nvidia", name="an Ada GPU")
    hopper = SimpleNamespace(arch="hopper", vendor="nvidia", name="H100")
    assert "--fp8-recipe deepseek" in unsupported_fp8_recipe(ada, "deepseek")
    assert unsupported_fp8_recipe(hopper, "deepseek") is None


@pytest.mark.parametrize("P,M", [(4, 8), (16, 120)])
def test_dualpipe_peak_with_chunks_of_their_own_size(P, M):
    assert np.allclose(peak_activation_bytes(np.full(P, 3.0), M), (P + 1) * 3.0)
    a = np.ones(P)
    a[-1] = 10.0  # a heavy last stage (the head's logits)
    pk = peak_activation_bytes(a, M)
    # ranks 0 and P-1 hold mostly the first stage's micro-batches, not P + 1 of the mean of their two chunks
    assert pk[0] == pk[-1] < (P + 1) * (a[0] + a[-1]) / 2
    assert pk[0] >= (P + 1) * a[0]


KW = dict(gpus=8, batch=16, seq=512, pp=4, micro_batch=1, zero=1, framework="megatron")


def test_dualpipe_rank0_holds_one_tied_embedding():
    """Sec. 3.2.3: with DualPipe the embedding and the output head are on the same rank, one physical table: no
    pipeline copy of a tied embedding (the MTP embedding likewise)."""
    one = {d["stage"]: d for d in wattcast.predict_cluster("gpt2", "DGX-H100", schedule="1f1b", **KW).per_device}
    dual = {d["stage"]: d for d in wattcast.predict_cluster("gpt2", "DGX-H100", schedule="dualpipe", **KW).per_device}
    tied = 50304 * 768  # GPT-2's 50,257 tokens padded to a multiple of 128 (Megatron-LM --make-vocab-size-divisible-by)
    assert one[3]["params"] - tied > 0
    assert dual[0]["params"] == pytest.approx(one[0]["params"] + one[3]["params"] - tied)
    assert dual[1]["params"] == pytest.approx(one[1]["params"] + one[2]["params"])


def test_published_layout_fits_80_gb_with_the_reports_storage():
    """DeepSeek-V3 as published (Sec. 3.2-3.3) under DualPipe: refused at 106.2 GB with Transformer Engine's storage and
    fp32 moments; with the report's storage and BF16 moments (Sec. 3.3.3) it fits 80 GB."""
    kw = dict(gpus=2048, batch=15360, seq=4096, tp=1, pp=16, ep=64, dp=128, zero=1, micro_batch=1, dtype="fp8",
              framework="megatron", recompute_modules="layernorm,mla_up_proj", schedule="dualpipe")
    r = wattcast.predict_cluster("deepseek_v3", "DGX-H100", fp8_recipe="deepseek", optimizer="adamw-bf16", **kw)
    assert r.fits and r.memory_gb < 80
    assert r.memory["inflight_chunks"] == 17
