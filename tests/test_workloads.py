"""Operator graphs from Hugging Face configs: parameters, FLOPs, backward rules, options, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattcast
from wattcast.featurize.hf_config import load_hf_config, normalise_config
from wattcast.featurize.op_graph import GraphBuilder, GraphError
from wattcast.featurize.training_graph import training_graph
from wattcast.featurize.workload import StepOptions, step_graph

# Parameter counts of the Hugging Face classes the generators mirror (sum(p.numel()) of
# GPT2LMHeadModel, BertForPreTraining, OPTForCausalLM, LlamaForCausalLM, MixtralForCausalLM). MPT's generated
# counts are checked against MosaicML's published table in tests/test_distributed.py.
HF_PARAMS = {
    "gpt2": 124_439_808,
    "bert_base": 110_106_428,
    "opt_1.3b": 1_315_758_080,
    "llama2_7b": 6_738_415_616,
    "llama3_8b": 8_030_261_248,
    "mixtral_8x7b": 46_702_792_704,
    "pythia_160m": 162_322_944,  # GPTNeoXForCausalLM (EleutherAI/pythia-160m; untied embed_out)
    "bloom_560m": 559_214_592,  # BloomForCausalLM (bigscience/bloom-560m)
    "gemma_2b": 2_506_172_416,  # GemmaForCausalLM (google/gemma-2b; multi-query, head_dim 256, tied head)
    "falcon_7b": 6_921_720_704,  # FalconForCausalLM (tiiuae/falcon-7b; multi-query, parallel attention, no biases)
}


@pytest.mark.parametrize("name", sorted(HF_PARAMS))
def test_parameter_counts_match_hugging_face(name):
    g = step_graph(name, StepOptions(batch=1, seq=128, mode="train"))
    assert g.param_count == HF_PARAMS[name]


def test_bert_inference_is_sequence_classification():
    # BertForSequenceClassification: BertModel (109,482,240) + a 768 x 2 classifier
    assert step_graph("bert_base", StepOptions(batch=1, seq=128, mode="inference")).param_count == 109_482_240 + 768 * 2 + 2


def _gemm_flops(g, phase):
    n = g.nodes
    sel = (n["phase"] == phase) & n["op_class"].isin(["linear", "bmm"]) & ~n["recompute"]
    return float(n.loc[sel, "flops"].sum())


@pytest.mark.parametrize("name,batch,seq", [("gpt2", 4, 1024), ("gpt3_2.7b", 1, 2048), ("llama2_7b", 2, 512), ("mpt_7b", 1, 1024),
                                                ("pythia_160m", 2, 512), ("bloom_560m", 1, 1024), ("gemma_2b", 1, 1024),
                                                ("falcon_7b", 1, 512)])
def test_training_flops_match_closed_form(name, batch, seq):
    """6 x (matmul parameters) x tokens + attention (3 x 4 B S^2 d L) within 2%."""
    cfg = load_hf_config(name)
    g = step_graph(name, StepOptions(batch=batch, seq=seq, mode="train", optimizer="none"))
    d, L, V, T = cfg.hidden, cfg.n_layers, cfg.vocab, batch * seq
    ffn_mats = 3 if cfg.family in ("llama", "gemma") else 2
    attn_proj = 2 * d * d + 2 * d * cfg.n_kv_heads * cfg.head_dim
    matmul_params = L * (attn_proj + ffn_mats * d * cfg.ffn) + V * d  # + LM head
    closed = 6.0 * matmul_params * T + 3 * 4.0 * batch * seq * seq * d * L
    total = float(g.nodes.loc[~g.nodes["recompute"], "flops"].sum())
    assert abs(total - closed) / closed < 0.02
    # backward GEMMs are twice the forward GEMMs (dX and dW per GEMM; forward also counts bias adds)
    assert _gemm_flops(g, "backward") == pytest.approx(2 * _gemm_flops(g, "forward"), rel=1e-3)
    assert _gemm_flops(g, "backward") <= 2 * _gemm_flops(g, "forward")


def test_inference_graph_has_no_backward_or_dropout():
    g = step_graph("gpt2", StepOptions(batch=2, seq=256, mode="inference"))
    assert set(g.nodes["phase"]) == {"forward"}
    assert "dropout" not in set(g.nodes["op_class"])
    assert "loss" not in set(g.nodes["op_class"])


def test_every_node_knows_layer_and_pass_and_edges_are_valid():
    g = step_graph("bert_base", StepOptions(batch=2, seq=128, mode="train"))
    n = g.nodes
    assert set(n["phase"]) == {"forward", "backward", "optimizer"}
    assert n["layer"].min() == -1 and n["layer"].max() == 12
    assert (n.loc[n["phase"] == "backward", "fwd_id"] >= 0).sum() > 0
    assert g.edges.min() >= 0 and g.edges.max() < len(n)
    assert (g.edges[:, 0] != g.edges[:, 1]).all()


def test_gpt2_new_gelu_is_eight_kernels_and_compile_fuses_them():
    eager = step_graph("gpt2", StepOptions(batch=1, seq=256, mode="inference"))
    assert (eager.nodes["name"].str.startswith("gelu.")).sum() == 8 * 12
    fused = step_graph("gpt2", StepOptions(batch=1, seq=256, mode="inference", compile=True))
    assert len(fused) < len(eager)
    assert (fused.nodes["op_class"] == "fused").any()
    assert not (fused.nodes["name"].str.startswith("gelu.")).any()
    # the GEMM work is untouched by fusion
    assert _gemm_flops(fused, "forward") == _gemm_flops(eager, "forward")


def test_recompute_trades_memory_for_time():
    res = {r: wattcast.predict("gpt2_medium", "A100-SXM4-80GB", batch=8, seq=1024, recompute=r, attention="eager")
           for r in ("none", "selective", "full")}
    assert res["none"].step_time_ms < res["selective"].step_time_ms < res["full"].step_time_ms
    assert res["none"].memory.activations_gb > res["selective"].memory.activations_gb > res["full"].memory.activations_gb
    # model FLOPs do not count recomputation
    assert res["full"].flops == pytest.approx(res["none"].flops)


def test_flash_attention_removes_the_score_matrix():
    eager = wattcast.predict("gpt3_xl", "A100-SXM4-80GB", batch=4, seq=2048, dtype="bf16", attention="eager")
    flash = wattcast.predict("gpt3_xl", "A100-SXM4-80GB", batch=4, seq=2048, dtype="bf16", attention="flash")
    assert flash.memory.activations_gb < 0.5 * eager.memory.activations_gb
    assert flash.step_time_ms < eager.step_time_ms
    assert any(r["op_class"] == "flash_attention" for r in flash.per_op)


def test_mixed_precision_memory_counts_master_weights_and_adam_states():
    r = wattcast.predict("gpt2", "H100-SXM5-80GB", batch=1, seq=128, dtype="bf16")
    p = r.meta["param_count"]
    assert r.memory.weights_gb == pytest.approx(p * (2 + 4) / 1e9)
    assert r.memory.gradients_gb == pytest.approx(p * 4 / 1e9)  # PyTorch AMP: fp32 .grad of fp32 parameters
    assert r.memory.optimizer_gb == pytest.approx(p * 8 / 1e9)
    # the same model states as a one-GPU cluster (framework hf) counts: 18 B/param
    c = wattcast.predict_cluster("gpt2", "DGX-H100", gpus=1, batch=1, seq=128, dtype="bf16").memory
    assert (r.memory.weights_gb + r.memory.gradients_gb + r.memory.optimizer_gb == pytest.approx(
        c["weights_gb"] + c["master_weights_gb"] + c["gradients_gb"] + c["optimizer_gb"], rel=1e-3))
    sgd = wattcast.predict("gpt2", "H100-SXM5-80GB", batch=1, seq=128, dtype="bf16", optimizer="sgd")
    assert sgd.memory.optimizer_gb == 0 and sgd.optimizer_ms < r.optimizer_ms


@pytest.mark.parametrize("model,kw", [("gpt2", dict(batch=8, seq=1024)),
                                      ("llama3_8b", dict(batch=1, seq=4096, attention="flash")),
                                      ("qwen3_8b", dict(batch=1, seq=512, attention="flash", recompute="full"))])
def test_one_device_and_a_one_gpu_cluster_count_the_same_model_flops(model, kw):
    """Model FLOPs: forward and backward without the optimizer step or FlashAttention's recomputed scores, on one
    device as on a cluster (one device counted both: 1-2% more)."""
    a = wattcast.predict(model, "H100-SXM5-80GB", **kw)
    b = wattcast.predict_cluster(model, "DGX-H100", gpus=1, **kw)
    assert a.flops == pytest.approx(b.flops, rel=1e-12)
    opt = sum(r["flops"] for r in a.per_op if r["op_class"] == "optimizer")
    assert opt > 0  # the optimizer does FLOPs, which model FLOPs leave out


def test_prediction_fields_add_up_and_repeat_calls_are_cheap():
    import time

    r = wattcast.predict("gpt2", "L4", batch=2, seq=512)
    assert r.step_time_ms == pytest.approx(r.forward_ms + r.backward_ms + r.optimizer_ms)
    assert sum(x["time_ms"] for x in r.per_op) == pytest.approx(r.step_time_ms)
    # every graph kernel once; data_loading counts the batch's copies, which are not graph nodes
    assert sum(x["count"] for x in r.per_op if x["op_class"] != "data_loading") == len(r.nodes)
    assert [x["count"] for x in r.per_op if x["op_class"] == "data_loading"] == [3]
    assert 0 <= r.ood_fraction <= 1 and r.flops > 0 and r.memory_gb > 0
    t = time.perf_counter()
    for _ in range(3):
        wattcast.predict("gpt2", "L4", batch=2, seq=512)
    # not a speed target (benchmarks/ has those): only that the graph is cached, not rebuilt
    assert (time.perf_counter() - t) / 3 < 5.0


def test_gqa_llama_repeat_kv_and_rope_present():
    g = step_graph("llama3_8b", StepOptions(batch=1, seq=256, mode="inference"))
    names = g.nodes["name"]
    assert names.str.startswith("repeat_kv").sum() == 2 * 32
    assert names.str.startswith("rope.").sum() == 2 * 5 * 32
    assert (g.nodes["kernel"] == "silu").sum() == 32


def test_mixtral_routes_tokens_to_experts():
    g = step_graph("mixtral_8x7b", StepOptions(batch=1, seq=128, mode="inference"))
    expert_gemms = g.nodes[g.nodes["name"].str.contains(r"experts\.\d+\.(?:gate|up|down)_proj")]
    assert len(expert_gemms) == 32 * 8 * 3
    # balanced routing: 128 tokens x top-2 / 8 experts = 32 rows per expert GEMM
    assert set(expert_gemms["M"]) == {32.0}


# --------------------------------------------------------------------------- bad input
def test_unknown_model_type_is_a_clear_error():
    with pytest.raises(GraphError, match="unknown model_type 'mamba'"):
        normalise_config({"model_type": "mamba", "hidden_size": 8})


def test_missing_and_inconsistent_fields_are_named():
    with pytest.raises(GraphError, match="missing n_layers"):
        normalise_config({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "vocab_size": 10})
    with pytest.raises(GraphError, match="not divisible by 5 heads"):
        normalise_config({"model_type": "gpt2", "n_embd": 64, "n_head": 5, "n_layer": 2, "vocab_size": 10})
    with pytest.raises(GraphError, match="must be a positive integer"):
        normalise_config({"model_type": "gpt2", "n_embd": -64, "n_head": 4, "n_layer": 2, "vocab_size": 10})


def test_aliases_are_normalised():
    a = normalise_config({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 10})
    b = normalise_config({"model_type": "gpt2", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 10})
    assert (a.hidden, a.n_heads, a.n_layers, a.ffn) == (b.hidden, b.n_heads, b.n_layers, b.ffn) == (64, 4, 2, 256)


def test_bad_options_and_unknown_builtin():
    with pytest.raises(GraphError, match="not a file and not a built-in model"):
        step_graph("no_such_model", StepOptions())
    with pytest.raises(GraphError, match="unknown attention"):
        step_graph("gpt2", StepOptions(attention="paged"))
    with pytest.raises(GraphError, match="exceeds the model's 1024 learned positions"):
        step_graph("gpt2", StepOptions(seq=4096))


def test_builder_rejects_impossible_shapes():
    b = GraphBuilder("fp32")
    with pytest.raises(GraphError, match="contraction dims differ"):
        b.matmul(b.input((2, 3, 4)), b.input((2, 5, 6)))
    with pytest.raises(GraphError, match="do not broadcast"):
        b.elementwise("add", b.input((3, 4)), b.input((5, 4)))
    with pytest.raises(GraphError, match="unknown dtype"):
        GraphBuilder("fp12")


def test_training_graph_rejects_unknown_options():
    g = step_graph("gpt2", StepOptions(batch=1, seq=64, mode="inference"))
    with pytest.raises(GraphError, match="unknown optimizer"):
        training_graph(g, optimizer="lion")
    with pytest.raises(GraphError, match="unknown recompute"):
        training_graph(g, recompute="some")


def test_chrome_trace(tmp_path):
    from wattcast.simulate.trace import write_chrome_trace

    r = wattcast.predict("gpt2", "T4", batch=1, seq=128, mode="inference")
    p = write_chrome_trace(r, tmp_path / "t.json")
    ev = json.loads(p.read_text())["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X"]
    # one event per kernel, and the batch's loading before the first (simulate/data_loading.py)
    assert len(xs) == len(r.nodes) + 1 and xs[0]["name"] == "data_loading"
    # each duration is rounded to 1 ns (3 decimals of a microsecond): the sum may drift by up to 0.5 ns per event
    assert sum(e["dur"] for e in xs) == pytest.approx(r.step_time_ms * 1e3, abs=5e-4 * len(xs))
    assert all(np.diff([e["ts"] for e in xs]) >= 0)
    power = [e for e in ev if e["ph"] == "C" and e["name"] == "power"]
    assert power and all(0 < e["args"]["board_w"] <= 70 for e in power)  # T4: 70 W TDP


def _counter_integral_j(ev, pid=0):
    """The integral (J) of a trace's power counter of process ``pid`` up to the end of its last compute slice."""
    c = [(e["ts"], e["args"]["board_w"]) for e in ev if e["ph"] == "C" and e["name"] == "power" and e["pid"] == pid]
    end = max(e["ts"] + e["dur"] for e in ev if e["ph"] == "X" and e["pid"] == pid)
    return sum(w * ((c[i + 1][0] if i + 1 < len(c) else end) - t) for i, (t, w) in enumerate(c)) / 1e6


@pytest.mark.parametrize("mode", ["train", "inference"])
def test_chrome_trace_power_counter_integrates_to_the_step_energy(mode):
    # the counter charges what energy_j charges: kernels at their power over their GPU time, launch gaps and the
    # batch's loading at idle power (it held a kernel's power over its whole slot: +7.2% on gpt2 H100 training)
    from wattcast.simulate.trace import chrome_trace_events

    r = wattcast.predict("gpt2", "H100", batch=2, seq=128, mode=mode)
    assert (r.nodes["time_ms"] > r.nodes["gpu_ms"]).any() and r.meta["data_loading"]["step_ms"] > 0
    ev = chrome_trace_events(r)
    assert next(e for e in ev if e["ph"] == "C")["ts"] == 0.0  # a sample from the start: the loading's idle power
    assert _counter_integral_j(ev) == pytest.approx(r.energy_j, rel=1e-5)


def test_tf32_is_a_matrix_product_mode():
    g = step_graph("gpt2", StepOptions(batch=1, seq=128, mode="train", dtype="tf32"))
    n = g.nodes
    gemm = n["op_class"].isin(["linear", "bmm"])
    assert set(n.loc[gemm, "dtype"]) == {"tf32"} and set(n.loc[~gemm, "dtype"]) == {"fp32"}


def test_gradient_clipping_rows_and_megatron_fp32_mask():
    from wattcast.featurize.training_graph import CLIP_BYTES_PER_PARAM

    g = step_graph("gpt2", StepOptions(batch=1, seq=128, mode="train", optimizer="adamw"))
    clip = g.nodes[g.nodes["name"].str.startswith("clip_grad_norm")]
    assert clip["bytes"].sum() == CLIP_BYTES_PER_PARAM * g.nodes["param_count"].sum()
    assert (clip["phase"] == "optimizer").all() and g.meta["clip_grad"]
    g0 = step_graph("gpt2", StepOptions(batch=1, seq=128, mode="train", optimizer="none"))
    assert not g0.nodes["name"].str.startswith("clip_grad_norm").any()
    # Megatron's fused softmax takes half precision only: fp32 keeps the masked fill, fp16 folds it in (at seq 256: at
    # 128 keys a block of the kernel takes 8 attention batches, more than GPT-2's 12 heads x 1 divide into)
    masks = {(dt, s): step_graph("gpt2", StepOptions(batch=1, seq=s, dtype=dt, framework="megatron")).nodes["name"]
             .eq("attn.mask").sum() for dt in ("fp32", "fp16") for s in (128, 256)}
    assert masks["fp32", 256] == 12 and masks["fp16", 256] == 0 and masks["fp16", 128] == 12


def _mpt(**kw):
    cfg = {"model_type": "mpt", "d_model": 256, "n_heads": 8, "n_layers": 2, "expansion_ratio": 4, "max_seq_len": 128,
           "vocab_size": 1000, "no_bias": True, "attn_config": {"alibi": True}, "learned_pos_emb": False}
    cfg.update(kw)
    return cfg


def test_mpt_config_alibi_gqa_and_bad_fields():
    g = step_graph(_mpt(), StepOptions(batch=2, seq=128, mode="train", optimizer="none"))
    names = set(g.nodes["name"])
    assert "attn.position_bias" in names and "wpe" not in names  # ALiBi: a score bias, no position table
    assert not any(n.endswith("bias") and "grad" in n for n in names)
    d, L, V = 256, 2, 1000
    assert g.param_count == V * d + L * (12 * d * d + 2 * d) + d  # no biases, LN weights only, tied head
    learned = step_graph(_mpt(attn_config={"alibi": False}, learned_pos_emb=True), StepOptions(batch=2, seq=128, mode="train"))
    assert learned.param_count == g.param_count + 128 * d and "wpe" in set(learned.nodes["name"])
    gqa = load_hf_config(_mpt(attn_config={"attn_type": "grouped_query_attention", "kv_n_heads": 2}, expansion_ratio=2.5))
    assert gqa.n_kv_heads == 2 and gqa.ffn == 640
    assert step_graph(_mpt(attn_config={"attn_type": "grouped_query_attention", "kv_n_heads": 2, "alibi": True}),
                      StepOptions(batch=1, seq=64, mode="train")).param_count == V * d + L * (d * (d + 2 * 64) + d * d + 8 * d * d + 2 * d) + d
    for bad, msg in ((_mpt(attn_config={"attn_type": "sparse"}), "unknown attn_config.attn_type"),
                     (_mpt(expansion_ratio=-1), "expansion_ratio must be a positive number"),
                     (_mpt(attn_config={"attn_type": "grouped_query_attention", "kv_n_heads": 3}), "not divisible")):
        with pytest.raises(GraphError, match=msg):
            load_hf_config(bad)
    with pytest.raises(GraphError, match="max_seq_len 128"):
        step_graph(_mpt(), StepOptions(batch=1, seq=256, mode="train"))


def test_gpt_neox_parallel_residual_partial_rotary_and_bloom_alibi():
    g = step_graph("pythia_160m", StepOptions(batch=1, seq=256, mode="inference"))
    names = list(g.nodes["name"])
    assert "rope.q.cat_pass" in names and "residual_mlp_attn" in names  # rotary on 25% of dims; parallel residual
    seq_res = step_graph({**load_hf_config("pythia_160m").raw, "use_parallel_residual": False},
                         StepOptions(batch=1, seq=256, mode="inference"))
    assert "residual_1" in set(seq_res.nodes["name"]) and seq_res.param_count == g.param_count
    bl = step_graph("bloom_560m", StepOptions(batch=2, seq=128, mode="train"))
    names = set(bl.nodes["name"])
    assert {"word_embeddings_layernorm", "attn.position_bias", "gelu.tanh"} <= names and "wpe" not in names


def test_gemma_is_a_tied_geglu_llama_with_a_scaled_embedding():
    g = step_graph("gemma_2b", StepOptions(batch=1, seq=128, mode="inference"))
    n = g.nodes
    assert "embed_tokens.normalizer" in set(n["name"]) and "gelu" in set(n["kernel"]) and "silu" not in set(n["kernel"])
    lm = n[n["name"] == "lm_head"].iloc[0]
    assert lm["param_count"] == 0  # tied to the embedding


def test_falcon_new_decoder_architecture_groups_and_two_norms():
    cfg = {"model_type": "falcon", "hidden_size": 256, "n_head": 8, "n_layer": 2, "vocab_size": 1000,
           "new_decoder_architecture": True, "num_kv_heads": 2, "bias": True}
    assert load_hf_config(cfg).n_kv_heads == 2 and load_hf_config({**cfg, "new_decoder_architecture": False}).n_kv_heads == 1
    g = step_graph(cfg, StepOptions(batch=1, seq=64, mode="train"))
    d, hd = 256, 32
    per_layer = 2 * 2 * d + d * (8 + 4) * hd + (8 + 4) * hd + d * d + d + 4 * d * d + 4 * d + 4 * d * d + d
    assert g.param_count == 1000 * d + 2 * per_layer + 2 * d
    assert {"ln_attn", "ln_mlp", "mlp_plus_attention"} <= set(g.nodes["name"])


def test_step_overheads_are_named_and_inside_the_step():
    r = wattcast.predict("gpt2", "A100-SXM4-80GB", batch=2, seq=512)
    o = r.to_dict()["overheads"]
    assert set(o) == {"optimizer_step_ms", "clip_grad_norm_ms", "loss_scaling_ms", "grad_accumulation_ms", "fp8_cast_ms",
                      "memcpy_ms", "launch_gap_ms", "data_loading_ms"}
    assert o["optimizer_step_ms"] > 0 and o["clip_grad_norm_ms"] > 0 and o["fp8_cast_ms"] == 0
    assert o["loss_scaling_ms"] == 0  # fp32: no loss scaling
    assert o["optimizer_step_ms"] + o["clip_grad_norm_ms"] == pytest.approx(r.optimizer_ms, rel=1e-9)
    h = wattcast.predict("gpt2", "A100-SXM4-80GB", batch=2, seq=512, dtype="fp16")
    bf = wattcast.predict("gpt2", "A100-SXM4-80GB", batch=2, seq=512, dtype="bf16")
    # fp16 unscales and checks every fp32 gradient once (8 B per parameter), bf16 does not scale
    assert h.overheads["loss_scaling_ms"] > 0 and bf.overheads["loss_scaling_ms"] == 0
    assert h.overheads["loss_scaling_ms"] == pytest.approx(h.overheads["clip_grad_norm_ms"] * 8 / 12, rel=0.35)
    assert sum(h.overheads[k] for k in ("optimizer_step_ms", "clip_grad_norm_ms", "loss_scaling_ms")) == \
        pytest.approx(h.optimizer_ms, rel=1e-9)
    assert sum(o.values()) < r.step_time_ms
    f8 = wattcast.predict("gpt2", "H100-SXM5-80GB", batch=2, seq=512, dtype="fp8")
    assert f8.overheads["fp8_cast_ms"] > 0
    inf = wattcast.predict("gpt2", "A100-SXM4-80GB", batch=2, seq=512, mode="inference")
    assert inf.overheads["optimizer_step_ms"] == 0 and inf.overheads["clip_grad_norm_ms"] == 0
