"""Qwen2-MoE and Qwen3-MoE configs (``qwen2_moe``, ``qwen3_moe``): the graphs ``transformers`` runs
(Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock) and Megatron-Core's, checked on the published sizes, the placement
of sparse and dense layers, the shared expert, and their predictions on one device, on a cluster and in a search."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import wattcast
import wattcast.simulate.distributed as dist
from wattcast.featurize.hf_config import builtin_models, load_hf_config
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph

CONFIGS = Path(wattcast.featurize.__file__).resolve().parent / "hf_configs"


def _raw(name: str, **changes) -> dict:
    return {**json.loads((CONFIGS / f"{name}.json").read_text()), **changes}


def _graph(model, **kw):
    return step_graph(model, StepOptions(**{"batch": 1, "seq": 16, "mode": "inference", "dtype": "bf16", **kw}))


def _forward_names(g, layer: int) -> list[str]:
    n = g.nodes
    return list(n.loc[(n["layer"] == layer) & (n["phase"] == "forward"), "name"].astype(str))


def _total_and_active(name: str) -> tuple[float, float]:
    """(parameters, parameters active per token) of a built-in whose blocks are all alike, from two short graphs
    (block 1 repeated, as the cluster path counts it) and the routed experts' share of one block."""
    cfg = load_hf_config(name)
    g2, g3 = _graph(name, blocks=2), _graph(name, blocks=3)
    block = g3.param_count - g2.param_count
    total = g2.param_count + (cfg.n_layers - 2) * block
    n = g3.nodes
    experts = n.loc[(n["layer"] == 1) & (n["phase"] == "forward") & n["scope"].astype(str).str.contains(r"experts\."),
                    "param_count"].sum()
    idle = cfg.n_layers * experts * (1 - cfg.experts_per_token / cfg.n_experts)
    return total, total - idle


@pytest.mark.parametrize("name,total_b,active_b", [
    ("qwen3_30b_a3b", 30.5, 3.3), ("qwen3_235b_a22b", 235.0, 22.0), ("qwen1.5_moe_a2.7b", 14.3, 2.7)])
def test_parameter_counts_match_the_published_models(name, total_b, active_b):
    total, active = _total_and_active(name)
    print(f"{name}: {total / 1e9:.3f}B total, {active / 1e9:.3f}B active")
    assert total / 1e9 == pytest.approx(total_b, rel=0.01)
    assert active / 1e9 == pytest.approx(active_b, rel=0.02)  # the published actives are rounded to 2 digits
    assert name in builtin_models()


def test_the_short_count_is_the_full_graphs():
    g = _graph("qwen1.5_moe_a2.7b")
    assert _total_and_active("qwen1.5_moe_a2.7b")[0] == g.param_count == 14_315_784_192


# a Qwen2-MoE of 8 layers: sparse every second layer (1, 3, 5, 7) except layer 5, listed in mlp_only_layers
MIXED = _raw("qwen1.5_moe_a2.7b", num_hidden_layers=8, decoder_sparse_step=2, mlp_only_layers=[5],
             _name_or_path="qwen2-moe-mixed")


def test_sparse_and_dense_layers_where_decoder_sparse_step_and_mlp_only_layers_put_them():
    cfg = load_hf_config(MIXED)
    assert [cfg.moe_layer(i) for i in range(8)] == [False, True, False, True, False, False, False, True]
    assert not cfg.layers_alike and load_hf_config("qwen3_30b_a3b").layers_alike
    g = _graph(MIXED)
    n = g.nodes
    for i in range(8):
        names = _forward_names(g, i)
        sparse = i in (1, 3, 7)
        assert ("moe.gate" in names) == sparse and ("mlp.gate_proj" in names) == (not sparse), i
    dense_up = n[(n["layer"] == 0) & (n["name"] == "mlp.up_proj")].iloc[0]
    expert_up = n[(n["layer"] == 1) & (n["name"] == "experts.0.up_proj")].iloc[0]
    shared_up = n[(n["layer"] == 1) & (n["name"] == "mlp.shared_expert.up_proj")].iloc[0]
    assert (dense_up["param_count"], expert_up["param_count"], shared_up["param_count"]) == (
        2048 * 5632, 2048 * 1408, 2048 * 5632)
    # 16 tokens x top-4 of 60 experts reach 60 (1 - (56/60)^16) = 40.1 of them (hf_models.active_local_experts);
    # the idle 20 are held (the layer's expert parameters are all 60's), and 256 tokens reach all 60
    downs = n[(n["layer"] == 1) & (n["phase"] == "forward") & n["name"].astype(str).str.match(r"experts\.\d+\.down_proj")]
    assert len(downs) == 40 and downs["param_count"].sum() == 60 * 1408 * 2048
    assert sum(x.startswith("experts.") and x.endswith(".down_proj") for x in _forward_names(_graph(MIXED, seq=256), 1)) == 60
    # no experts at all, or every layer listed: a dense model (no expert count, no moe_intermediate_size needed)
    for dense in (_raw("qwen3_30b_a3b", num_experts=0, moe_intermediate_size=None),
                  _raw("qwen3_30b_a3b", num_hidden_layers=4, mlp_only_layers=[0, 1, 2, 3])):
        assert load_hf_config(dense).n_experts is None
        assert not _graph(dense, blocks=4).nodes["name"].astype(str).str.startswith("moe.").any()


def test_qwen2_moe_shared_expert_bias_and_unnormalised_router():
    g = _graph("qwen1.5_moe_a2.7b", blocks=1)
    n = g.nodes[(g.nodes["layer"] == 0) & (g.nodes["phase"] == "forward")]
    names = list(n["name"].astype(str))
    for x in ("mlp.shared_expert.gate_proj", "mlp.shared_expert.down_proj", "mlp.shared_expert_gate",
              "mlp.shared_expert.gate_sigmoid", "mlp.shared_expert.gate_mul", "mlp.shared_add"):
        assert x in names, x
    gate = n[n["name"] == "mlp.shared_expert_gate"].iloc[0]
    assert gate["param_count"] == 2048  # Linear(hidden, 1), no bias
    assert (n.loc[n["name"].str.startswith("mlp.shared_expert"), "tag"].astype(str).str.contains("shared_experts")).all()
    assert "moe.normalise" not in names  # norm_topk_prob false
    q = n[n["name"] == "self_attn.q_proj"].iloc[0]
    assert q["param_count"] == 2048 * 2048 + 2048  # Qwen2's q/k/v bias
    q3 = _forward_names(_graph("qwen3_30b_a3b", blocks=1), 0)
    assert "moe.normalise" in q3 and not any("shared_expert" in x for x in q3)  # norm_topk_prob true, no shared expert
    assert any(x.startswith("self_attn.q_norm") for x in q3) and any(x.startswith("self_attn.k_norm") for x in q3)
    # transformers' default for norm_topk_prob is false
    unnorm = _forward_names(_graph(_raw("qwen3_30b_a3b", norm_topk_prob=None), blocks=1), 0)
    assert "moe.normalise" not in unnorm


def test_megatron_qk_layernorm_shared_expert_gate_and_the_same_parameters():
    kw = dict(framework="megatron", blocks=2)
    q3 = _graph("qwen3_30b_a3b", **kw)
    names = _forward_names(q3, 0)
    assert {"self_attention.q_layernorm", "self_attention.k_layernorm", "self_attention.rope.q", "moe.unpermute",
            "moe.normalise"} <= set(names)
    qn = q3.nodes[q3.nodes["name"] == "self_attention.q_layernorm"].iloc[0]
    assert qn["op_class"] == "layernorm" and qn["param_count"] == 128  # over each head's 128 dims
    dense = _forward_names(_graph("qwen3_8b", **kw), 0)  # refused under megatron before
    assert "self_attention.q_layernorm" in dense and "mlp.linear_fc1" in dense
    assert "self_attention.q_layernorm" not in _forward_names(_graph("llama3_8b", **kw), 0)
    q2 = _graph("qwen1.5_moe_a2.7b", **kw)
    n2 = _forward_names(q2, 1)
    assert {"mlp.shared_experts.linear_fc1", "mlp.shared_experts.swiglu", "mlp.shared_experts.gate",
            "mlp.shared_experts.gate_sigmoid", "mlp.shared_add"} <= set(n2)
    assert "self_attention.q_layernorm" not in n2 and "moe.normalise" not in n2
    assert not any(x.startswith("experts.") and x.endswith(".index") for x in n2)  # grouped GEMM: no gather
    for name in ("qwen3_30b_a3b", "qwen1.5_moe_a2.7b"):  # Megatron-Core's modules hold the same weights as HF's
        assert _graph(name, **kw).param_count == _graph(name, blocks=2).param_count
    mixed = _graph(MIXED, framework="megatron")
    assert [("moe.gate" in _forward_names(mixed, i)) for i in range(8)] == [False, True, False, True, False, False,
                                                                             False, True]
    with pytest.raises(GraphError, match="hidden_act"):
        _graph(_raw("qwen3_30b_a3b", hidden_act="gelu_new"), framework="megatron", blocks=1)


def test_predict_on_one_device():
    p = wattcast.predict("qwen1.5_moe_a2.7b", "H100-SXM5-80GB", batch=1, seq=256, dtype="bf16")
    assert p.step_time_ms > 0 and p.energy_j > 0


def test_cluster_with_expert_parallelism_and_megatron_sequence_parallelism():
    hf = wattcast.predict_cluster("qwen3_30b_a3b", "DGX-H100", gpus=16, batch=16, seq=1024, ep=8, micro_batch=1,
                                  zero=1, dtype="bf16")
    assert hf.fits and hf.step_time_ms > 0 and hf.exposed_comm_split_ms["ep"] > 0
    mg = wattcast.predict_cluster("qwen1.5_moe_a2.7b", "DGX-H100", gpus=16, batch=16, seq=1024, tp=2, sp=True, ep=4,
                                  micro_batch=1, zero=1, dtype="bf16", framework="megatron")
    assert mg.fits and mg.step_time_ms > 0 and mg.exposed_comm_split_ms["ep"] > 0
    with pytest.raises(ValueError, match=r"experts \(60\) must be divisible by ep \(8\)"):
        wattcast.predict_cluster("qwen1.5_moe_a2.7b", "DGX-H100", gpus=16, batch=16, seq=1024, ep=8, micro_batch=1)
    busy = wattcast.predict_cluster("qwen1.5_moe_a2.7b", "DGX-H100", gpus=16, batch=16, seq=1024, tp=2, sp=True, ep=4,
                                    micro_batch=1, zero=1, dtype="bf16", framework="megatron", moe_load_imbalance=1.3)
    assert busy.step_time_ms > mg.step_time_ms
    whole = wattcast.predict_cluster("qwen1.5_moe_a2.7b", "DGX-H100", gpus=16, batch=16, seq=1024, tp=2, sp=True, ep=4,
                                     etp=1, micro_batch=1, zero=1, dtype="bf16", framework="megatron")
    assert whole.memory["weights_gb"] > mg.memory["weights_gb"]  # etp 1: each rank holds its experts whole
    rc = wattcast.predict_cluster("qwen1.5_moe_a2.7b", "DGX-H100", gpus=16, batch=16, seq=1024, tp=2, sp=True, ep=4,
                                  micro_batch=1, zero=1, dtype="bf16", framework="megatron",
                                  recompute="selective:moe_act,shared_experts,layernorm")
    assert rc.memory["activations_gb"] < mg.memory["activations_gb"] and rc.step_time_ms > mg.step_time_ms


def _cluster(model, **kw):
    return wattcast.predict_cluster(model, "DGX-H100", gpus=8, batch=8, seq=256, ep=4, micro_batch=1, zero=1,
                                    dtype="bf16", **kw)


def test_three_block_shortcut_only_when_every_layer_is_alike(monkeypatch):
    """All-sparse configs take the 3-block graph and give the full-depth graph's figures bit for bit; a config with
    dense layers among the sparse ones is built whole."""
    uniform = _raw("qwen3_30b_a3b", num_hidden_layers=6, _name_or_path="qwen3-moe-6l")
    opts = StepOptions(batch=1, seq=64, dtype="bf16")
    assert dist._build_rank_graph(uniform, load_hf_config(uniform), opts)[1] == 4  # block 1 stands for blocks 1-4
    assert dist._build_rank_graph(MIXED, load_hf_config(MIXED), opts)[1] == 1
    short, mixed = _cluster(uniform), _cluster(MIXED)
    assert mixed.meta["param_count"] == _graph(MIXED).param_count
    monkeypatch.setattr(dist, "_UNIFORM_FAMILIES", tuple(f for f in dist._UNIFORM_FAMILIES if f != "qwen3_moe"))
    full = _cluster(uniform)
    assert (short.memory_gb, short.flops, short.meta["param_count"]) == (full.memory_gb, full.flops, full.meta["param_count"])
    # times to the last bits: since stop 56 eager PyTorch's launch queue runs over the whole step's kernel sequence and
    # gives each repeated node the mean of its copies (simulate.single_device.queued_node_ms): the same sums, summed in
    # another order
    assert (short.step_time_ms, short.energy_j) == pytest.approx((full.step_time_ms, full.energy_j), rel=1e-12)


def test_expert_states_are_sharded_over_the_expert_data_parallel_group():
    """Mixtral's rule (tests/test_moe_memory.py): under the distributed optimizer the experts' master weights and
    moments are divided by expert-dp = dp / ep, the dense parameters' by dp."""
    cfg = load_hf_config("qwen1.5_moe_a2.7b")
    total = _graph("qwen1.5_moe_a2.7b", framework="megatron").param_count
    all_experts = cfg.n_layers * cfg.n_experts * 3 * cfg.hidden * cfg.count("moe_intermediate_size")
    dense = total - all_experts
    dp, ep = 8, 4
    r = wattcast.predict_cluster("qwen1.5_moe_a2.7b", "DGX-H100", gpus=dp, batch=dp, seq=256, ep=ep, micro_batch=1,
                                 zero=1, dtype="bf16", framework="megatron")
    expert = all_experts / ep
    assert r.memory["weights_gb"] * 1e9 == pytest.approx(2 * (expert + dense), rel=1e-9)
    assert r.memory["master_weights_gb"] * 1e9 == pytest.approx(4 * (expert / (dp // ep) + dense / dp), rel=1e-9)
    assert r.memory["optimizer_gb"] * 1e9 == pytest.approx(8 * (expert / (dp // ep) + dense / dp), rel=1e-9)


def test_search_over_a_small_cluster():
    r = wattcast.search("qwen1.5_moe_a2.7b", "DGX-H100", 8, 16, 1024, framework="megatron", dtype="bf16", workers=1,
                        tp=(1,), pp=(1,), zero=(1,), sp=(False,), recompute=("none",), interleave=(1,),
                        micro_batch=(1,))
    assert set(r.ranked["ep"]) == {1, 2, 4}  # powers of two dividing 60 experts
    ranked = r.ranked[r.ranked["fits"]]
    assert {2, 4} <= set(ranked["ep"])  # (ep 1: every rank holds all 14.3B parameters' states, over 80 GB)
    best = ranked.iloc[0]
    again = wattcast.predict_cluster("qwen1.5_moe_a2.7b", "DGX-H100", gpus=8, batch=16, seq=1024, dtype="bf16",
                                     framework="megatron", strategy=best["strategy"])
    assert again.step_time_ms == pytest.approx(best["step_time_ms"], rel=1e-9)


@pytest.mark.parametrize("changes,field", [
    (dict(num_experts_per_tok=61), "num_experts_per_tok"),
    (dict(moe_intermediate_size=None), "moe_intermediate_size"),
    (dict(shared_expert_intermediate_size=None), "shared_expert_intermediate_size"),
    (dict(shared_expert_intermediate_size=0), "shared_expert_intermediate_size"),
    (dict(shared_expert_intermediate_size="5632"), "shared_expert_intermediate_size"),
    (dict(mlp_only_layers=[24]), "mlp_only_layers"),
    (dict(mlp_only_layers=3), "mlp_only_layers"),
    (dict(mlp_only_layers=[1.5]), "mlp_only_layers"),
    (dict(mlp_only_layers=[-1]), "mlp_only_layers"),
    (dict(decoder_sparse_step=0), "decoder_sparse_step"),
    (dict(num_experts=-4), "num_experts"),
])
def test_bad_fields_are_named(changes, field):
    with pytest.raises(GraphError, match=field):
        load_hf_config(_raw("qwen1.5_moe_a2.7b", **changes))


def test_qwen3_moe_needs_no_shared_expert_size():
    cfg = load_hf_config("qwen3_30b_a3b")
    assert (cfg.family, cfg.n_experts, cfg.experts_per_token) == ("qwen3_moe", 128, 8)
    with pytest.raises(GraphError, match="num_experts_per_tok"):
        load_hf_config(_raw("qwen3_30b_a3b", num_experts_per_tok=129))


def test_dense_qwen2_under_megatron_keeps_its_qkv_bias():
    """Qwen2 (dense) is Megatron-Core's Llama recipe with --add-qkv-bias: the same parameters as Hugging Face's.
    Qwen2Attention hard-codes q/k/v ``bias=True`` (modeling_qwen2.py; Qwen2Config has no bias field), so an
    ``attention_bias: false`` in the file changes nothing (it removed the biases until the bias-parity change)."""
    cfg = {"model_type": "qwen2", "hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 16,
           "num_key_value_heads": 16, "intermediate_size": 2816, "vocab_size": 151936, "max_position_embeddings": 4096,
           "hidden_act": "silu"}
    counts = {fw: step_graph(cfg, StepOptions(batch=1, seq=256, dtype="bf16", mode="train", framework=fw)).meta["param_count"]
              for fw in ("hf", "megatron")}
    assert counts["hf"] == counts["megatron"]
    ignored = step_graph(dict(cfg, attention_bias=False), StepOptions(batch=1, seq=256, dtype="bf16", mode="train",
                                                                     framework="megatron")).meta["param_count"]
    assert ignored == counts["megatron"]
    llama = step_graph(dict(cfg, model_type="llama"), StepOptions(batch=1, seq=256, dtype="bf16", mode="train",
                                                                 framework="megatron")).meta["param_count"]
    assert counts["megatron"] - llama == 2 * (1024 + 2 * 1024)  # q, k, v biases of two layers
