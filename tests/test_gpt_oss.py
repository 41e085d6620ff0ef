"""OpenAI gpt-oss configs (``gpt_oss``): the graph ``transformers``' GptOssForCausalLM runs (attention sinks, sliding
and full layers, a biased router with top-k before the softmax, the clamped SwiGLU experts with biases), checked on the
published sizes, on one device and on a cluster, its refusal under Megatron and its bad inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import wattcast
import wattcast.simulate.distributed as dist
from wattcast.featurize.hf_config import HFConfig, builtin_models, load_hf_config
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph

CONFIGS = Path(wattcast.featurize.__file__).resolve().parent / "hf_configs"


def _raw(name: str, **changes) -> dict:
    return {k: v for k, v in {**json.loads((CONFIGS / f"{name}.json").read_text()), **changes}.items() if v is not None}


def _graph(model, **kw):
    return step_graph(model, StepOptions(**{"batch": 1, "seq": 16, "mode": "inference", "dtype": "bf16", **kw}))


def _forward(g, layer: int):
    n = g.nodes
    return n[(n["layer"] == layer) & (n["phase"] == "forward")]


@pytest.mark.parametrize("name,total_b,active_b", [("gpt_oss_120b", 116.8, 5.1), ("gpt_oss_20b", 20.9, 3.6)])
def test_parameter_counts_match_the_model_card(name, total_b, active_b):
    """Total parameters, and the active ones as OpenAI's model card counts them (116.83B / 5.13B, 20.91B / 3.61B):
    per token, 4 of the routed experts of every layer (their weights and biases), the attention (q/k/v/o with biases,
    sinks), routers, norms and the unembedding (LM head); not the other experts and not the token embedding table
    (a lookup of one row)."""
    assert name in builtin_models()
    cfg = load_hf_config(name)
    g = _graph(name)  # the whole model: its layers are not alike (sliding and full), so no 3-block count
    n = g.nodes
    experts = n.loc[(n["phase"] == "forward") & n["scope"].astype(str).str.contains(r"experts\."), "param_count"].sum()
    total = g.param_count
    active = total - experts * (1 - cfg.experts_per_token / cfg.n_experts) - cfg.vocab * cfg.hidden
    print(f"{name}: {total / 1e9:.3f}B total, {active / 1e9:.3f}B active")
    assert total / 1e9 == pytest.approx(total_b, rel=0.02)
    assert active / 1e9 == pytest.approx(active_b, rel=0.02)
    per_expert = 2880 * 5760 + 5760 + 2880 * 2880 + 2880  # gate_up_proj, its bias, down_proj, its bias
    assert experts == cfg.n_layers * cfg.n_experts * per_expert


def test_sinks_in_eager_attention_and_none_in_flash():
    s = 256
    eager = _forward(_graph("gpt_oss_20b", blocks=2, seq=s), 0)
    names = list(eager["name"].astype(str))
    for x in ("attn.sinks_cat", "attn.sinks_max", "attn.sinks_sub_max"):
        assert x in names, x
    assert names.index("attn.mask") < names.index("attn.sinks_cat") < names.index("attn.softmax") < names.index("attn.pv")
    sm = eager[eager["name"] == "attn.softmax"].iloc[0]
    assert (sm["B"], sm["H"]) == (64 * s, s + 1)  # the softmax over the scores and the sink column
    # gpt-oss's softmax runs in the logits' dtype (transformers 5.24.0 gpt_oss l. 250): no cast before or after it
    # (stop 48's merge briefly reused the sink shape as the softmax's dtype and cast the probabilities back)
    assert not {"attn.softmax_half", "attn.softmax_float", "attn.softmax.to_fp32", "attn.softmax.to_dtype"} & set(names)
    pv = eager[eager["name"] == "attn.pv"].iloc[0]
    assert pv["N"] == s  # the sink column dropped (a view) before PV
    flash_g = _graph("gpt_oss_20b", blocks=2, seq=s, attention="flash")
    flash = _forward(flash_g, 0)
    assert not flash["name"].astype(str).str.startswith("attn.sinks").any()
    assert list(flash["op_class"]).count("flash_attention") == 1
    # the sinks are parameters under either kernel: 64 per layer
    assert flash_g.param_count == _graph("gpt_oss_20b", blocks=2, seq=s).param_count
    attn = eager[eager["name"].astype(str).str.startswith("self_attn.")]["param_count"].sum()
    assert attn == (2880 * 4096 + 4096) + 2 * (2880 * 512 + 512) + (4096 * 2880 + 2880)  # q, k, v, o with biases


def test_sliding_window_on_the_even_layers_full_attention_on_the_odd():
    s, w = 4096, 128
    g = _graph("gpt_oss_20b", blocks=4, seq=s, attention="flash")
    fl = g.nodes[(g.nodes["op_class"] == "flash_attention") & (g.nodes["phase"] == "forward")].set_index("layer")["flops"]
    band = (w * s - w * (w - 1) / 2) / (s * s / 2)  # the window's share of the causal square
    assert fl.loc[0] == fl.loc[2] and fl.loc[1] == fl.loc[3]
    assert fl.loc[0] / fl.loc[1] == pytest.approx(band, rel=1e-9)
    # an explicit layer_types list wins over the default
    flipped = _raw("gpt_oss_20b", num_hidden_layers=4,
                   layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"])
    f2 = step_graph(flipped, StepOptions(batch=1, seq=s, mode="inference", dtype="bf16", attention="flash")).nodes
    f2 = f2[f2["op_class"] == "flash_attention"].set_index("layer")["flops"]
    assert [f2.loc[i] == fl.loc[1] for i in range(4)] == [True, False, False, True]
    # eager attention computes the full S x S scores on the sliding layers too (the window is in the mask)
    e = _graph("gpt_oss_20b", blocks=2, seq=512).nodes
    qk = e[e["name"] == "attn.qk"].set_index("layer")["flops"]
    assert qk.loc[0] == qk.loc[1]


def test_an_explicit_null_sliding_window_is_full_attention():
    """GptOssAttention passes ``config.sliding_window`` to its sliding layers: null there is no window (the default 128
    applies only when the field is absent)."""
    s = 4096
    base = json.loads((CONFIGS / "gpt_oss_20b.json").read_text())
    cfg = dict(base, num_hidden_layers=2, sliding_window=None)
    fl = step_graph(cfg, StepOptions(batch=1, seq=s, mode="inference", dtype="bf16", attention="flash")).nodes
    fl = fl[fl["op_class"] == "flash_attention"].set_index("layer")["flops"]
    assert fl.loc[0] == fl.loc[1]  # the sliding layer attends over every key like the full one


def test_router_has_a_bias_and_takes_the_top_k_before_the_softmax():
    s = 64
    f = _forward(_graph("gpt_oss_20b", blocks=1, seq=s), 0)
    names = list(f["name"].astype(str))
    router = f[f["name"] == "moe.router"].iloc[0]
    assert router["param_count"] == 2880 * 32 + 32  # Linear(hidden, num_local_experts) with its bias
    assert names.index("moe.router") < names.index("moe.topk") < names.index("moe.router_softmax")
    sm = f[f["name"] == "moe.router_softmax"].iloc[0]
    assert (sm["B"], sm["H"]) == (s, 4)  # over the k chosen logits of each token
    assert "moe.normalise" not in names and "moe.gate" not in names
    # Mixtral: softmax over every expert, then the top-k, then the renormalisation
    mx = list(_forward(_graph("mixtral_8x7b", blocks=1, seq=s), 0)["name"].astype(str))
    assert mx.index("moe.router_softmax") < mx.index("moe.topk") < mx.index("moe.normalise")
    # the top-k values carry the gradient back to the router in training
    t = step_graph("gpt_oss_20b", StepOptions(batch=1, seq=s, mode="train", dtype="bf16", blocks=1)).nodes
    assert (t["name"] == "moe.topk.grad").any()


def test_the_clamped_swiglu_experts_kernels():
    """GptOssExperts' loop for one expert: gather, gate_up GEMM + bias add, clamp (gate), clamp (up), gate * alpha,
    sigmoid, gate * sigmoid, up + 1, (up + 1) * glu, down GEMM + bias add."""
    f = _forward(_graph("gpt_oss_20b", blocks=1, seq=64), 0)
    e0 = f[f["scope"].astype(str) == "moe.experts.0"]
    assert [x.removeprefix("experts.0.") for x in e0["name"].astype(str)] == [
        "index", "gate_up_proj", "gate_up_proj_bias", "clamp_gate", "clamp_up", "alpha", "sigmoid", "glu",
        "up_plus_one", "gated", "down_proj", "down_proj_bias"]
    act = e0.iloc[3:10]
    assert (act["op_class"] == "elementwise").all() and (act["H"] == 2880).all()  # on each expert's intermediate width
    assert act["tag"].astype(str).str.contains("moe_act").all()
    gu, down = e0.iloc[1], e0.iloc[10]
    assert (gu["N"], gu["K"], down["N"], down["K"]) == (2880, 5760, 2880, 2880)
    assert list(e0["param_count"]) == [0, 2880 * 5760, 5760, 0, 0, 0, 0, 0, 0, 0, 2880 * 2880, 2880]
    assert sum(f["scope"].astype(str).str.fullmatch(r"moe\.experts\.\d+") & (f["name"].astype(str).str.endswith(".gated"))) == 32


def test_predict_on_one_h100():
    p = wattcast.predict("gpt_oss_20b", "H100-SXM5-80GB", batch=1, seq=1024)
    assert math.isfinite(p.step_time_ms) and p.step_time_ms > 0
    assert math.isfinite(p.energy_j) and p.energy_j > 0


def test_predict_cluster_with_expert_parallelism():
    kw = dict(gpus=8, batch=8, seq=1024, micro_batch=1, zero=1, dtype="bf16")
    r4 = wattcast.predict_cluster("gpt_oss_20b", "DGX-H100", ep=4, **kw)
    r8 = wattcast.predict_cluster("gpt_oss_20b", "DGX-H100", ep=8, **kw)
    for r in (r4, r8):
        assert math.isfinite(r.step_time_ms) and r.step_time_ms > 0 and r.fits
        assert r.meta["param_count"] == 20_914_757_184
    assert r8.memory["weights_gb"] < r4.memory["weights_gb"]  # the experts spread over more ranks
    skewed = wattcast.predict_cluster("gpt_oss_20b", "DGX-H100", ep=4, moe_load_imbalance=1.5, **kw)
    assert skewed.step_time_ms > r4.step_time_ms
    # the experts split over tp like the dense layers (the Hugging Face path has no separate expert TP degree)
    tp2 = wattcast.predict_cluster("gpt_oss_20b", "DGX-H100", ep=4, tp=2, **kw)
    assert math.isfinite(tp2.step_time_ms) and tp2.memory["weights_gb"] < r4.memory["weights_gb"]


def test_search_over_expert_parallelism():
    r = wattcast.search("gpt_oss_20b", "DGX-H100", 8, 8, 512, dtype="bf16", workers=1, tp=(1,), pp=(1,), zero=(1,),
                        sp=(False,), recompute=("none",), interleave=(1,), micro_batch=(1,))
    assert set(r.ranked["ep"]) == {1, 2, 4, 8}
    best = r.ranked[r.ranked["fits"]].iloc[0]
    assert best["ep"] > 1  # ep 1: every rank holds all 20.9B parameters' states, over 80 GB
    again = wattcast.predict_cluster("gpt_oss_20b", "DGX-H100", gpus=8, batch=8, seq=512, dtype="bf16",
                                     strategy=best["strategy"])
    assert again.step_time_ms == pytest.approx(best["step_time_ms"], rel=1e-9)


@pytest.mark.parametrize("framework", ["megatron", "megatron-deepspeed"])
def test_megatron_is_refused(framework):
    with pytest.raises(GraphError, match="Hugging Face path only"):
        _graph("gpt_oss_20b", blocks=1, framework=framework)
    with pytest.raises(Exception, match="Hugging Face path only"):
        wattcast.predict_cluster("gpt_oss_20b", "DGX-H100", gpus=8, batch=8, seq=256, ep=4, micro_batch=1, zero=1,
                                 dtype="bf16", framework=framework)


@pytest.mark.parametrize("changes,field", [
    (dict(num_experts_per_tok=33), "num_experts_per_tok"),
    (dict(num_experts_per_tok=0), "num_experts_per_tok"),
    (dict(experts_per_token=2), "experts_per_token"),
    (dict(num_local_experts=0), "num_local_experts"),
    (dict(layer_types=["sliding_attention", "full_attention"]), "layer_types"),
    (dict(layer_types=["sliding_attention", "global"] * 12), "layer_types"),
    (dict(layer_types="sliding_attention"), "layer_types"),
    (dict(sliding_window=0), "sliding_window"),
    (dict(sliding_window=-128), "sliding_window"),
    (dict(sliding_window="128"), "sliding_window"),
    (dict(attention_bias="yes"), "attention_bias"),
])
def test_bad_fields_are_named(changes, field):
    with pytest.raises(GraphError, match=field):
        load_hf_config(_raw("gpt_oss_20b", **changes))


def test_fields_left_out_take_gpt_oss_config_defaults():
    """GptOssConfig's defaults, not the generic ones: head_dim 64 (hidden / heads would be 45), each expert's width
    2,880 (not 4 x hidden), 128 experts, top-4, window 128, attention biases on."""
    bare = _raw("gpt_oss_120b", head_dim=None, intermediate_size=None, num_local_experts=None, num_experts_per_tok=None,
                experts_per_token=None, sliding_window=None, attention_bias=None)
    cfg = load_hf_config(bare)
    assert (cfg.head_dim, cfg.ffn, cfg.n_experts, cfg.experts_per_token) == (64, 2880, 128, 4)
    assert _graph(bare, blocks=2, seq=256, attention="flash").param_count == \
        _graph("gpt_oss_120b", blocks=2, seq=256, attention="flash").param_count
    assert load_hf_config(_raw("gpt_oss_120b", num_experts=128, num_local_experts=None)).n_experts == 128  # HF's alias


def _cluster(model, **kw):
    return wattcast.predict_cluster(model, "DGX-H100", gpus=8, batch=8, seq=512, ep=4, micro_batch=1, zero=1,
                                    dtype="bf16", attention="flash", **kw)


def test_short_graph_one_period_at_a_time_when_layers_alternate(monkeypatch):
    """Alternating sliding and full layers (the default) take the short graph one period (2 blocks) at a time; a config
    whose layers are all full takes the 3-block graph. Both give the full-depth graph's figures (to 1e-9; the sums over
    repeated blocks are taken in another order). Forcing the 3-block shortcut on the alternating config would repeat
    one kind of layer for both: other figures."""
    alternating = _raw("gpt_oss_20b", num_hidden_layers=6, _name_or_path="gpt-oss-6l")
    odd = _raw("gpt_oss_20b", num_hidden_layers=7, _name_or_path="gpt-oss-7l")  # ends on a sliding layer: 2-block tail
    uniform = _raw("gpt_oss_20b", num_hidden_layers=6, layer_types=["full_attention"] * 6,
                   _name_or_path="gpt-oss-6l-full")
    opts = StepOptions(batch=1, seq=512, dtype="bf16", attention="flash")
    assert not load_hf_config(alternating).layers_alike and load_hf_config(uniform).layers_alike
    g, n_rep, _, period = dist._build_rank_graph(alternating, load_hf_config(alternating), opts)
    assert (g.meta["n_layers"], n_rep, period) == (4, 2, 2)  # blocks 1-2 stand for blocks 1-4
    g, n_rep, _, period = dist._build_rank_graph(odd, load_hf_config(odd), opts)
    assert (g.meta["n_layers"], n_rep, period) == (5, 2, 2)  # blocks 1-2 for 1-4, blocks 3-4 are blocks 5-6
    assert dist._build_rank_graph(uniform, load_hf_config(uniform), opts)[1::2] == (4, 1)  # block 1 for blocks 1-4
    keys = ("step_time_ms", "memory_gb", "energy_j", "flops", "forward_ms", "backward_ms", "optimizer_ms", "bubble_ms",
            "exposed_comm_ms", "mfu")
    short = {}
    for name, cfg, kw in (("alt", alternating, {}), ("odd", odd, dict(pp=2, recompute="full", recompute_num_layers=2)),
                          ("uniform", uniform, {})):
        short[name] = _cluster(cfg, **kw)
        dist._COSTED.clear()
        monkeypatch.setattr(dist, "_UNIFORM_FAMILIES", tuple(f for f in dist._UNIFORM_FAMILIES if f != "gpt_oss"))
        full = _cluster(cfg, **kw)
        monkeypatch.undo()
        dist._COSTED.clear()
        assert short[name].meta["param_count"] == full.meta["param_count"] == _graph(cfg).param_count
        for k in keys:
            assert getattr(short[name], k) == pytest.approx(getattr(full, k), rel=1e-9), (name, k)
        mem = [[s["memory_gb"] for s in r.per_device] for r in (short[name], full)]
        assert mem[0] == pytest.approx(mem[1], rel=1e-9)
    monkeypatch.setattr(HFConfig, "layers_alike", property(lambda self: True))
    forced = _cluster(alternating)
    assert forced.flops != short["alt"].flops  # what the 3-block shortcut would get wrong
    monkeypatch.undo()
    dist._COSTED.clear()


def test_periodic_plan():
    s, f = "sliding", "full"
    assert dist._periodic_plan((s, f) * 18) == (4, 2, 17)  # gpt-oss-120b: block 0, blocks 1-2 x 17, block 35
    assert dist._periodic_plan((s, f) * 12) == (4, 2, 11)  # gpt-oss-20b
    assert dist._periodic_plan((s, f) * 12 + (s,)) == (5, 2, 11)  # ends on a sliding layer: blocks 3-4 are 23-24
    assert dist._periodic_plan((s,) * 10) == (3, 1, 8)  # the 3-block graph
    assert dist._periodic_plan((s, s, f) * 4) == (6, 3, 3)  # 12 = 1 + 3 x 3 + 2
    assert dist._periodic_plan((s, f) * 2 + (s,)) is None  # 5 blocks: the short graph would have 5
    assert dist._periodic_plan((s, f, f, s, s, f)) is None  # no period
