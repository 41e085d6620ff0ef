"""Megatron-Core's selective recomputation modules (``--recompute-modules``), what autograd keeps of a product, and one
FP8 cast for Megatron-Core's fused ``linear_fc1``: the activation memory terms DeepSeek-V3's published configuration
turns on (2,048 GPUs of 80 GB, PP16 x EP64, FP8), which wattcast refused at 149.5 GB per GPU."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattcast
from conftest import flat, run_cli
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.recompute import RecomputeError, parse_recompute, recompute_setting
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.memory import estimate_memory, kept_tensors
from wattcast.simulate.strategy import parse_strategy

DSV3_FIVE = 5  # DeepSeek-V3's three dense blocks and two MoE blocks: every kind of block it has


def _graph(model, **kw):
    opts = dict(batch=1, seq=256, mode="train", dtype="bf16", attention="flash")
    return step_graph(model, StepOptions(**{**opts, **kw}))


def _kept_by(g, keeper: str) -> float:
    """Bytes of the tensors the forward node ``keeper`` saves for backward."""
    fwd = g.nodes[g.nodes["phase"] == "forward"].reset_index(drop=True)
    i = int(np.flatnonzero(fwd["name"].to_numpy() == keeper)[0])
    return float(sum(g.saved["tensor_bytes"][t] for t in g.saved["by_node"][i]))


# ------------------------------------------------------------------ settings
def test_settings_are_canonical_and_checked():
    assert recompute_setting("selective") == "selective"
    assert recompute_setting("none", "core_attn") == "selective"  # the default list reads as before
    assert recompute_setting("none", ["moe_act", "core_attn"]) == "selective:core_attn,moe_act"
    assert recompute_setting("selective:layernorm, mla_up_proj") == "selective:layernorm,mla_up_proj"
    assert parse_recompute("full") == ("full", ())
    with pytest.raises(RecomputeError, match="unknown recompute module"):
        recompute_setting("selective", "attention")
    with pytest.raises(RecomputeError, match="full"):
        recompute_setting("full", "moe_act")
    with pytest.raises(RecomputeError, match="unknown recompute"):
        recompute_setting("partial")


def test_strategy_strings_carry_the_modules():
    st = parse_strategy("tp1-pp1-dp8-mb1-rcselective:core_attn,moe_act")
    assert st.recompute == "selective:core_attn,moe_act"


# ------------------------------------------------------------------ what a product keeps
def test_rope_keeps_its_frequencies_not_the_queries():
    """``q * cos``: autograd keeps ``cos`` for q's gradient and would keep q only if cos needed one; the HF RoPE kept
    q and its rotated half (for Llama 3 8B at 8k tokens 10% of a layer's activations)."""
    g = _graph("llama3_8b", blocks=1)
    freqs = 1 * 1 * 256 * 128 * 2  # (batch, 1, seq, head_dim) bf16; the queries are 32x that
    assert _kept_by(g, "rope.q.cos") == _kept_by(g, "rope.q.sin") == freqs
    # a product of two tensors that both need a gradient keeps both (the SwiGLU product)
    assert _kept_by(g, "mlp.mul") == pytest.approx(2 * 256 * 14336 * 2)


def test_megatron_fc1_is_one_gemm_with_one_fp8_cast_and_no_gradient_accumulation():
    """Megatron-Core's linear_fc1 is one GEMM of gate and up (2 x ffn outputs): one FP8 cast of its input, one FP8 copy
    saved, one dgrad (no autograd accumulation of two input gradients), and the fused SwiGLU reads its 2 x ffn output
    (it was costed as two GEMMs of ffn whose input gradients were summed by an extra add kernel)."""
    g = _graph("llama3_8b", blocks=1, dtype="fp8", framework="megatron")
    n = g.nodes
    names = set(n["name"])
    assert "mlp.linear_fc1.fp8_cast" in names and not any(x.startswith("mlp.linear_fc1.gate") for x in names)
    assert _kept_by(g, "mlp.linear_fc1") == 256 * 4096  # 1 B an element
    assert _kept_by(g, "mlp.swiglu") == 256 * 2 * 14336 * 2  # the fused activation keeps its 2 x ffn bf16 input
    fc1 = n[(n["name"] == "mlp.linear_fc1") & (n["phase"] == "forward")].iloc[0]
    assert (fc1["M"], fc1["N"], fc1["K"]) == (256, 4096, 2 * 14336)
    assert (n["name"] == "mlp.linear_fc1.dgrad").sum() == 1
    assert not n["name"].str.startswith("pre_mlp_layernorm.grad_accumulate").any()


# ------------------------------------------------------------------ modules
def _act_gb(model, recompute, **kw):
    return estimate_memory(_graph(model, recompute=recompute, **kw)).activations_gb


def test_each_module_drops_what_megatron_core_drops():
    kw = dict(blocks=DSV3_FIVE, dtype="fp8", framework="megatron")
    none = _act_gb("deepseek_v3", "none", **kw)
    steps = [_act_gb("deepseek_v3", recompute_setting("none", mods), **kw)
             for mods in (["layernorm"], ["layernorm", "mla_up_proj"], ["layernorm", "mla_up_proj", "moe_act"])]
    assert none > steps[0] > steps[1]
    # under FP8 the experts' second GEMM keeps its own FP8 copy of the activation (Transformer Engine's), so the
    # activation's recomputation frees nothing more; in bf16 it frees that GEMM's input
    assert steps[2] == pytest.approx(steps[1])
    bf16 = dict(kw, dtype="bf16")
    assert _act_gb("deepseek_v3", "selective:moe_act", **bf16) < _act_gb("deepseek_v3", "none", **bf16)
    # the up-projections' q, k and v (what the fused attention keeps) are re-made: (q 192 + k 192 + v 128 of 128 heads)
    # x 2 B, 131,072 B a token a layer, at least
    assert (steps[0] - steps[1]) * 1e9 >= 5 * 256 * 128 * (192 + 192 + 128) * 2
    # moe covers the experts (their activation included) and the shared experts: it keeps less than moe_act alone
    assert _act_gb("deepseek_v3", "selective:moe", **kw) < _act_gb("deepseek_v3", "selective:moe_act", **kw)


def test_checkpointed_module_keeps_its_input_in_its_own_dtype():
    """A checkpointed dense MLP keeps its input (the bf16 norm output, not the FP8 copy its fc1 saved) and nothing
    made inside it."""
    g = _graph("llama3_8b", blocks=1, dtype="fp8", framework="megatron", recompute="selective:mlp")
    fwd = g.nodes[g.nodes["phase"] == "forward"].reset_index(drop=True)
    kept = kept_tensors(g)
    tnode = g.saved["tensor_node"]
    made = {fwd["name"][tnode[t]] for t in kept if tnode[t] >= 0}
    assert "pre_mlp_layernorm" in made  # the module's input, 2 B an element
    assert not {"mlp.swiglu", "mlp.linear_fc1"} & made


def test_recomputed_modules_run_again_in_backward():
    g = _graph("deepseek_v3", blocks=DSV3_FIVE, framework="megatron", recompute="selective:mla_up_proj,moe_act")
    rec = g.nodes[g.nodes["recompute"].astype(bool)]
    assert rec["name"].str.contains("q_b_proj").any() and rec["name"].str.contains("swiglu").any()
    assert not rec["name"].str.contains("o_proj").any()


def test_a_module_the_model_lacks_is_an_error():
    with pytest.raises(GraphError, match="mla_up_proj"):
        _graph("llama3_8b", blocks=1, recompute="selective:mla_up_proj")
    with pytest.raises(GraphError, match="moe"):
        _graph("llama3_8b", blocks=1, recompute="selective:moe_act")
    # the attention core may have nothing to re-run (a fused kernel keeps no scores): as before, no error
    assert _graph("llama3_8b", blocks=1, recompute="selective:core_attn") is not None


# ------------------------------------------------------------------ the published configuration
def test_deepseek_v3_as_published_fits_an_80_gb_gpu():
    """DeepSeek-V3 (tech report Sec. 3.2-3.3): 2,048 GPUs, PP16 x EP64 x DP128, ZeRO-1, FP8, 15,360 x 4,096 tokens,
    RMSNorm and MLA up-projections recomputed. Refused at 149.5 GB per GPU until the changes pinned above; DeepSeek's
    BF16 optimizer moments, FP8-cached SwiGLU inputs and DualPipe are still not modelled (all in the fitting direction
    but DualPipe's second parameter copy). Without the recomputation the cost-balanced split needs 119.6 GB on stage 2;
    since stop 53 the memory-aware automatic split (water-filling over every per-stage count) fits it by skewing the
    stages (2, 2, 2, 3 x 4, 4, 4, 5 x 7: the early stages hold the most micro-batches in flight), at 85.8 GB and a
    slower step than DeepSeek's recomputation (43.3 s against 32.7 s): their choice is the faster one."""
    kw = dict(gpus=2048, batch=15360, seq=4096, tp=1, pp=16, ep=64, dp=128, zero=1, micro_batch=1, dtype="fp8",
              framework="megatron")
    published = wattcast.predict_cluster("deepseek_v3", "DGX-H100", recompute_modules="layernorm,mla_up_proj,moe_act", **kw)
    plain = wattcast.predict_cluster("deepseek_v3", "DGX-H100", **kw)
    assert published.fits and published.memory_gb < 80
    # the memory-aware split's note ("automatic pipeline split: stages [...] instead of the cost-balanced ..."; since
    # stop 59 every automatic uneven split also warns how Megatron-Core builds it, simulate/parallel.py
    # pipeline_split_report: 61 layers on 16 stages do not divide, so both carry that one)
    skewed = "instead of the cost-balanced"
    assert not any(skewed in w for w in published.meta.get("warnings") or [])
    assert any(skewed in w for w in plain.meta.get("warnings") or [])  # only a skewed split fits
    assert plain.step_time_ms > published.step_time_ms


def test_cli_flag_and_its_errors():
    args = ("predict", "--model", "gpt2", "--device", "H100-SXM", "--batch", "1", "--seq", "128")
    r = run_cli(*args, "--recompute-modules", "layernorm,core_attn", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["settings"]["recompute"] == "selective:core_attn,layernorm"
    r = run_cli(*args, "--recompute", "full", "--recompute-modules", "mlp")
    assert r.returncode != 0 and "full" in flat(r.stderr + r.stdout)
    r = run_cli(*args, "--recompute-modules", "moe")
    assert r.returncode != 0 and "moe" in flat(r.stderr + r.stdout)


def test_search_tries_the_modules_and_its_rows_predict_back():
    r = run_cli("search", "--model", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", "--batch", "16", "--seq", "512",
                "--recompute-modules", "layernorm", "--json", "--top", "400", "--workers", "1")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["ranked"]
    assert {row["recompute"] for row in rows} == {"none", "selective:layernorm", "full"}
    row = next(row for row in rows if row["recompute"] == "selective:layernorm")
    again = wattcast.predict_cluster("gpt2", "DGX-A100", strategy=row["strategy"], seq=512)
    assert again.step_time_ms == pytest.approx(row["step_time_ms"], rel=1e-6)


# ------------------------------------------------------------------ what a recomputed module keeps and re-runs
def _made_by(g, kept) -> set[str]:
    fwd = g.nodes[g.nodes["phase"] == "forward"].reset_index(drop=True)
    tnode = g.saved["tensor_node"]
    return {fwd["name"][tnode[t]] for t in kept if tnode[t] >= 0}


def test_a_recomputed_module_keeps_its_inputs():
    """The eager RMSNorm's only saved copy of its input is its own fp32 cast (made inside the norm): under
    ``layernorm`` the block input (the residual stream) is what is kept. MLA's up-projections keep the latents."""
    g = _graph("llama3_8b", blocks=2, recompute="selective:layernorm")
    made = _made_by(g, kept_tensors(g))
    assert {"residual_1", "residual_2"} <= made
    assert not {"input_layernorm.to_fp32", "post_attention_layernorm.to_dtype"} & made
    g = _graph("deepseek_v3", blocks=4, framework="megatron", recompute="selective:mla_up_proj")
    made = _made_by(g, kept_tensors(g))
    assert {"self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"} <= made
    assert not {"self_attn.q_b_proj", "self_attn.kv_b_proj", "self_attn.q_cat", "self_attn.k_cat"} & made


def test_layernorm_is_the_blocks_two_norms_only():
    """Megatron-Core's ``layernorm`` module is a block's input and pre-MLP norms: Qwen3's q/k norms and MLA's latent
    norms stay."""
    g = _graph("qwen3_8b", blocks=1, recompute="selective:layernorm")
    made = _made_by(g, kept_tensors(g))
    assert any(n.startswith("self_attn.q_norm") for n in made)
    assert not any(n.startswith("input_layernorm") for n in made)


def test_recomputed_mlp_reruns_its_sequence_parallel_collectives():
    g = _graph("llama3_70b", blocks=1, framework="megatron", tp=8, sp=True, seq=1024, recompute="selective:mlp")
    rec = g.nodes[g.nodes["recompute"].astype(bool)]
    assert rec["name"].str.startswith("mlp.enter").any() and rec["name"].str.startswith("mlp.exit").any()


@pytest.mark.parametrize("model", ["opt_1.3b", "bloom_560m", "falcon_7b", "mpt_7b", "pythia_160m", "bert_base"])
def test_every_dense_mlp_is_a_module(model):
    assert _act_gb(model, "selective:mlp", blocks=1) < _act_gb(model, "none", blocks=1)


def test_megatron_core_checkpoints_the_fused_attention():
    """Megatron-Core's ``core_attn`` re-runs the fused attention's forward in backward; Megatron-LM and Hugging Face
    skip a fused kernel (their selective recomputation re-runs nothing then)."""
    mc = _graph("llama3_8b", blocks=1, framework="megatron", recompute="selective")
    hf = _graph("llama3_8b", blocks=1, recompute="selective")
    assert mc.nodes.loc[mc.nodes["recompute"].astype(bool), "name"].str.contains("flash").any()
    assert not hf.nodes["recompute"].astype(bool).any()


@pytest.mark.parametrize("mode, modules, match", [
    ("selective:", None, "names no module"), ("none", "", "empty"), ("none", [], "empty"), ("none", 5, "names"),
    ("selective:mlp", "layernorm", "twice"), ("full:", None, "selective")])
def test_bad_settings_are_clear_errors(mode, modules, match):
    with pytest.raises(RecomputeError, match=match):
        recompute_setting(mode, modules)


def test_python_api_refuses_modules_for_inference():
    with pytest.raises(ValueError, match="inference"):
        wattcast.predict("gpt2", "H100-SXM", batch=1, seq=128, mode="inference", recompute_modules="mlp")


def test_eager_rmsnorm_keeps_its_fp32_cast_at_four_bytes():
    """LlamaRMSNorm runs on ``hidden_states.to(torch.float32)``: pow and the normalising product keep that fp32 tensor
    (it was counted at the model's 2 B an element)."""
    g = _graph("llama3_8b", blocks=1)
    assert _kept_by(g, "input_layernorm.pow") == 256 * 4096 * 4
    assert _kept_by(g, "input_layernorm.weight") == 256 * 4096 * 2 + 4096 * 2  # the bf16 cast back, and the weight


def test_selective_recomputation_with_nothing_to_recompute_says_so():
    """Selective recomputation re-runs the attention core; a fused attention kernel keeps no scores, so under hf with
    flash attention nothing is recomputed: the prediction (the same as without) carries a warning instead of silence."""
    import wattcast

    kw = dict(gpus=8, batch=16, seq=1024, tp=2, sp=True, zero=1, attention="flash")
    sel = wattcast.predict_cluster("llama3_8b", "DGX-H100", recompute="selective", **kw)
    none = wattcast.predict_cluster("llama3_8b", "DGX-H100", **kw)
    assert sel.step_time_ms == none.step_time_ms
    assert any("nothing in this model's layers is recomputed" in w for w in sel.to_dict()["warnings"])
    assert not none.to_dict()["warnings"]
    eager = wattcast.predict_cluster("llama3_8b", "DGX-H100", recompute="selective", **dict(kw, attention="eager"))
    assert not eager.to_dict()["warnings"]
