"""Qwen3, Phi-3, Gemma 2 and Gemma 3 configs: the graphs Hugging Face runs, checked on published sizes and structure."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph

GEMMA3_TEXT = {  # google/gemma-3-4b-it text_config sizes, cut to 12 layers
    "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 12,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208,
    "max_position_embeddings": 131072, "sliding_window": 1024, "sliding_window_pattern": 6,
    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "_name_or_path": "gemma3-text-12l"}


@pytest.mark.parametrize("name,params_b", [("qwen3_8b", 8.19), ("phi3_mini", 3.82), ("gemma2_9b", 9.24)])
def test_parameter_counts_match_the_published_models(name, params_b):
    g = step_graph(name, StepOptions(batch=1, seq=128, mode="inference", dtype="bf16"))
    assert g.param_count / 1e9 == pytest.approx(params_b, rel=0.005)


def _names(model, **kw):
    g = step_graph(model, StepOptions(**{"batch": 1, "seq": 256, "mode": "inference", "dtype": "bf16", **kw}))
    return g.nodes, set(g.nodes["name"].astype(str))


def test_qwen3_normalises_each_heads_query_and_key():
    nodes, names = _names("qwen3_8b")
    assert any(n.startswith("self_attn.q_norm") for n in names) and any(n.startswith("self_attn.k_norm") for n in names)
    _, llama = _names("llama3_8b")
    assert not any("q_norm" in n for n in llama)


def test_phi3_runs_fused_projections():
    nodes, names = _names("phi3_mini")
    assert "self_attn.qkv_proj" in names and "mlp.gate_up_proj" in names
    assert "self_attn.q_proj" not in names and "mlp.gate_proj" not in names
    qkv = nodes[nodes["name"] == "self_attn.qkv_proj"].iloc[0]
    assert int(qkv["K"]) == 3 * 3072  # (heads + 2 kv heads) x head dim


def test_gemma2_sandwich_norms_and_soft_capping():
    nodes, names = _names("gemma2_9b", attention="eager")
    for n in ("post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
        assert any(x.startswith(n) for x in names), n
    assert {"attn.softcap.tanh", "lm_head.softcap.tanh"} <= names
    _, flash = _names("gemma2_9b", attention="flash")
    assert "lm_head.softcap.tanh" in flash and "attn.softcap.tanh" not in flash  # fused into the kernel


def test_local_layers_attend_to_their_window_only():
    g = step_graph("gemma2_9b", StepOptions(batch=1, seq=16384, mode="inference", dtype="bf16", attention="flash"))
    fl = g.nodes[g.nodes["op_class"] == "flash_attention"].set_index("layer")["flops"]
    local, glob = fl.loc[0], fl.loc[1]  # Gemma 2: even layers local (window 4096), odd ones global
    s, w = 16384, 4096
    assert local / glob == pytest.approx((w * s - w * (w - 1) / 2) / (s * s / 2), rel=1e-6)
    g3 = step_graph(GEMMA3_TEXT, StepOptions(batch=1, seq=4096, mode="inference", dtype="bf16", attention="flash"))
    f3 = g3.nodes[g3.nodes["op_class"] == "flash_attention"].set_index("layer")["flops"]
    glob3 = [int(i) for i in f3.index if f3.loc[i] == f3.max()]
    assert glob3 == [5, 11]  # five local layers to one global
    _, names = _names(GEMMA3_TEXT)
    assert any(n.startswith("self_attn.q_norm") for n in names) and "lm_head.softcap.tanh" not in names


def test_bad_softcap_is_named():
    cfg = {**GEMMA3_TEXT, "final_logit_softcapping": "thirty"}
    with pytest.raises(GraphError, match="final_logit_softcapping"):
        step_graph(cfg, StepOptions(batch=1, seq=64, mode="inference"))


def test_new_families_train_on_a_cluster():
    r = wattcast.predict_cluster("qwen3_8b", "DGX-H100", gpus=8, batch=16, seq=2048, tp=2, micro_batch=1, zero=1)
    assert r.step_time_ms > 0 and r.fits
    p = wattcast.predict("gemma2_9b", "H100-SXM5-80GB", batch=1, seq=2048)
    assert p.step_time_ms > 0 and all(f.get("op_class") != "linear" for f in p.fallback_ops)


DSV2_LITE = {  # deepseek-ai/DeepSeek-V2-Lite config.json sizes
    "model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
    "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2,
    "n_routed_experts": 64, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "vocab_size": 102400, "max_position_embeddings": 163840, "hidden_act": "silu", "tie_word_embeddings": False,
    "_name_or_path": "deepseek-v2-lite"}


@pytest.mark.parametrize("model,params_b", [(DSV2_LITE, 15.71), ("deepseek_v3", 671.0)])
def test_deepseek_parameter_counts_match_the_published_models(model, params_b):
    g = step_graph(model, StepOptions(batch=1, seq=16, mode="inference", dtype="bf16"))
    assert g.param_count / 1e9 == pytest.approx(params_b, rel=0.002)


def test_deepseek_latent_attention_shared_experts_and_dense_first_blocks():
    g = step_graph(DSV2_LITE, StepOptions(batch=1, seq=256, mode="inference", dtype="bf16", attention="flash"))
    n = g.nodes
    names = set(n["name"].astype(str))
    assert {"self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj", "self_attn.q_proj", "self_attn.q_cat"} <= names
    assert "self_attn.q_a_proj" not in names  # V2-Lite has no q_lora_rank
    kv_a = n[n["name"] == "self_attn.kv_a_proj_with_mqa"].iloc[0]
    assert int(kv_a["K"]) == 512 + 64  # compressed KV plus the shared rotary key
    per_layer = n.groupby("layer")["name"].apply(set)
    assert "mlp.gate_proj" in per_layer.loc[0] and not any("experts" in x for x in per_layer.loc[0])  # dense block 0
    assert any(x.startswith("experts.63.") for x in per_layer.loc[1]) and "mlp.shared_add" in per_layer.loc[1]
    fl = n[n["op_class"] == "flash_attention"].iloc[0]
    # QK^T over 192 (128 + 64) and PV over 128: 4 x (192 + 128) / 2 per score pair, half the square (causal)
    assert fl["flops"] == pytest.approx(4.0 * 16 * 256 * 256 * 160 * 0.5)
    v3 = step_graph("deepseek_v3", StepOptions(batch=1, seq=16, mode="inference", dtype="bf16", blocks=4))
    names3 = set(v3.nodes["name"].astype(str))
    assert {"self_attn.q_a_proj", "self_attn.q_b_proj", "moe.router_sigmoid"} <= names3


def test_deepseek_on_a_cluster_with_expert_parallelism():
    r = wattcast.predict_cluster(DSV2_LITE, "DGX-H100", gpus=16, batch=32, seq=2048, tp=1, ep=8, micro_batch=1, zero=1)
    assert r.step_time_ms > 0 and r.exposed_comm_split_ms.get("ep", 0) >= 0
    with pytest.raises(ValueError, match=r"experts \(64\) must be divisible by ep \(6\)"):
        wattcast.predict_cluster(DSV2_LITE, "DGX-H100", gpus=48, batch=48, seq=2048, tp=1, ep=6, micro_batch=1)


def test_megatron_core_moe_layer():
    """--framework megatron runs Mixtral and DeepSeek as Megatron-Core does: all-to-all dispatcher, grouped GEMMs over
    contiguous permuted tokens (no per-expert gather), fused SwiGLU and one fused unpermute (HF: weight multiply and
    index_add), fused RMSNorm kernels and the loss on fp32 logits; the same expert GEMM shapes and parameters."""
    kw = dict(batch=1, seq=128, mode="train", blocks=2)
    hf = step_graph("mixtral_8x7b", StepOptions(**kw))
    mc = step_graph("mixtral_8x7b", StepOptions(framework="megatron", **kw))
    fwd = mc.nodes[mc.nodes["phase"] == "forward"]
    names = fwd["name"].astype(str)
    assert (names == "moe.unpermute").sum() == 2 and not names.str.contains(r"experts\.\d+\.index").any()
    assert not names.isin(["moe.weight", "moe.index_add"]).any()
    assert names.str.fullmatch(r"experts\.\d+\.swiglu").sum() == 2 * 8
    gemm = lambda g: g.nodes[(g.nodes["phase"] == "forward") & g.nodes["name"].astype(str).str.contains(r"experts\.")  # noqa: E731
                             & (g.nodes["op_class"] == "linear")]
    # Megatron-Core's linear_fc1 is gate and up in one GEMM of twice the width (HF: gate_proj and up_proj)
    assert len(gemm(mc)) == 2 * 8 * 2 and len(gemm(hf)) == 2 * 8 * 3
    assert set(gemm(mc)["M"]) == set(gemm(hf)["M"]) == {32.0}  # 128 tokens x top-2 / 8 experts
    assert gemm(mc)["flops"].sum() == pytest.approx(gemm(hf)["flops"].sum())
    assert mc.param_count == pytest.approx(hf.param_count, rel=1e-3)
    ds = step_graph("deepseek_v3", StepOptions(framework="megatron", **dict(kw, blocks=4)))  # 3 dense blocks first
    dn = ds.nodes[ds.nodes["phase"] == "forward"]
    assert {"input_layernorm", "moe.unpermute", "self_attn.kv_a_proj_with_mqa"} <= set(dn["name"].astype(str))
    assert (dn.loc[dn["name"] == "input_layernorm", "op_class"] == "layernorm").all()
    r = wattcast.predict_cluster(DSV2_LITE, "DGX-H100", gpus=16, batch=32, seq=2048, ep=8, micro_batch=1, zero=1,
                                 framework="megatron")
    h = wattcast.predict_cluster(DSV2_LITE, "DGX-H100", gpus=16, batch=32, seq=2048, ep=8, micro_batch=1, zero=1)
    assert r.fits and r.exposed_comm_split_ms["ep"] > 0 and r.parallel.overlap_grad_reduce
    assert r.memory["activations_gb"] < h.memory["activations_gb"]  # fused kernels save less for backward
    with pytest.raises(ValueError, match="framework 'megatron' models"):
        step_graph("bert_base", StepOptions(framework="megatron", batch=1, seq=128))


def test_search_varies_expert_parallelism_for_moe_models():
    from wattcast.planning.search import candidate_configs

    moe = candidate_configs("mixtral_8x7b", "DGX-H100", 16, 32, 2048)
    assert {c.ep for c in moe} == {1, 2, 4, 8}  # powers of two dividing 8 experts
    assert {c.ep for c in candidate_configs("gpt2", "DGX-H100", 16, 32, 1024)} == {1}
    assert {c.ep for c in candidate_configs("mixtral_8x7b", "DGX-H100", 16, 32, 2048, ep=(1, 4))} == {1, 4}
    r = wattcast.search(DSV2_LITE, "DGX-H100", 16, 32, 2048, framework="megatron", max_configs=400, tp=(1,), pp=(1,),
                        zero=(1,), sp=(False,), recompute=("none",), interleave=(1,))
    ranked = r.ranked[r.ranked["fits"]]
    assert {2, 8, 16} <= set(ranked["ep"]) and ranked.iloc[0]["step_time_ms"] > 0  # 64 experts: ep up to 16 GPUs
