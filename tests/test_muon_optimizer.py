"""``--optimizer muon``: Muon on the transformer blocks' 2-D weights, AdamW on the rest, as Megatron-Core 0.16.1
(optimizer/muon.py, layer_wise_optimizer.py) and torch 2.13's torch.optim.Muon (hf) run it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import wattcast
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.training_graph import (MUON_UPDATE_BYTES_PER_PARAM, muon_matrices, muon_ns_flops,
                                                optimizer_state_bytes, training_graph)
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.parallel import ParallelConfigError


def _fwd(model="gpt2", **kw):
    return step_graph(model, StepOptions(batch=1, seq=128, mode="inference", dtype="bf16", **kw))


def test_newton_schulz_flops_of_one_matrix_by_hand():
    """5 steps x (A = X X^T: 2 m^2 n; B = bA + cAA: 2 m^3; X = aX + BX: 2 m^2 n) on the (m, n) matrix, m <= n."""
    m, n = 1024, 4096
    want = 5 * (4 * m * m * n + 2 * m ** 3)
    assert muon_ns_flops(m, n) == want == muon_ns_flops(n, m)  # the transposed matrix runs the same iteration


def test_graph_rows_are_fifteen_gemms_per_matrix_and_name_the_step():
    fwd = _fwd()
    g = training_graph(fwd, optimizer="muon", framework="hf")
    n = g.nodes
    ns = n[n["op_class"] == "muon_newton_schulz"]
    assert set(ns["kernel"]) == {"bmm"} and set(ns["method"]) == {"surrogate"}
    assert set(ns["dtype"]) == {"bf16"}  # torch.optim.Muon: grad.bfloat16() (optim/_muon.py l. 55)
    # gpt2's 4 matrices per layer (c_attn 768x2304, c_proj 768x768, c_fc 768x3072, mlp.c_proj 3072x768)
    lay0 = ns[ns["layer"] == 0]
    shapes = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
    assert lay0["scale"].sum() == pytest.approx(15 * len(shapes))  # 3 GEMMs x 5 steps per matrix
    assert lay0["flops"].sum() == pytest.approx(sum(muon_ns_flops(a, b) for a, b in shapes))
    upd = n[n["name"] == "muon_update[0]"]
    assert len(upd) == 1 and upd["op_class"].iloc[0] == "muon_update"
    p_muon = sum(a * b for a, b in shapes)
    assert upd["bytes"].iloc[0] == pytest.approx(MUON_UPDATE_BYTES_PER_PARAM[("hf", True)] * p_muon)
    # the embeddings, the norms and the biases: AdamW
    assert (n["name"] == "adamw.step[-1]").any() and (n["name"] == "adamw.step[0]").any()
    assert g.meta["muon_param_count"] == pytest.approx(12 * p_muon)
    # Megatron-Core runs the iteration on fp32 momentum under fp32_matmul_prec "medium": TF32 on CUDA
    gm = training_graph(_fwd(framework="megatron"), optimizer="muon", framework="megatron")
    assert set(gm.nodes.loc[gm.nodes["op_class"] == "muon_newton_schulz", "dtype"]) == {"tf32"}


def test_megatron_splits_linear_qkv_into_query_key_value():
    """muon_split_qkv (optimizer_config.py l. 263, default True): Llama 3 8B's linear_qkv (6144 x 4096) is
    orthogonalised as Q 4096 x 4096, K and V 1024 x 4096 each (32 query heads, 8 groups, head dim 128)."""
    mats = muon_matrices(_fwd("llama3_8b", framework="megatron"), "megatron")
    qkv = mats[(mats["layer"] == 0) & mats["name"].str.endswith("linear_qkv")]
    assert sorted(qkv["rows"].tolist()) == [1024.0, 1024.0, 4096.0]
    assert set(qkv["cols"]) == {4096.0}
    assert qkv["params"].sum() == 6144 * 4096


def test_blockwise_tp_runs_newton_schulz_on_each_shard():
    """muon_tp_mode "blockwise" (optimizer_config.py l. 278, the default): every TP rank orthogonalises its own
    shard (muon.py l. 131: no partition_dim), so the per-rank FLOPs are those of the shard shapes."""
    one = muon_matrices(_fwd("llama3_8b", framework="megatron"), "megatron")
    two = muon_matrices(_fwd("llama3_8b", framework="megatron", tp=2), "megatron")
    fc1_1 = one[(one["layer"] == 0) & (one["name"] == "mlp.linear_fc1")].iloc[0]
    fc1_2 = two[(two["layer"] == 0) & (two["name"] == "mlp.linear_fc1")].iloc[0]
    assert (fc1_1["rows"], fc1_1["cols"]) == (28672, 4096) and (fc1_2["rows"], fc1_2["cols"]) == (14336, 4096)
    fc2_2 = two[(two["layer"] == 0) & (two["name"] == "mlp.linear_fc2")].iloc[0]
    assert (fc2_2["rows"], fc2_2["cols"]) == (4096, 7168)  # row-parallel: the input features split
    g2 = training_graph(_fwd("llama3_8b", framework="megatron", tp=2), optimizer="muon", framework="megatron")
    ns = g2.nodes[(g2.nodes["op_class"] == "muon_newton_schulz") & (g2.nodes["layer"] == 0)]
    lay = two[two["layer"] == 0]
    assert ns["flops"].sum() == pytest.approx(float((muon_ns_flops(lay["rows"], lay["cols"]) * lay["count"]).sum()))


def test_state_bytes_per_parameter():
    """One fp32 momentum per Muon parameter (muon.py l. 208-212), AdamW's two moments for the rest."""
    assert optimizer_state_bytes("muon", 1.0) == 4
    assert optimizer_state_bytes("muon", 0.0) == 8
    assert optimizer_state_bytes("muon", 0.75) == pytest.approx(0.75 * 4 + 0.25 * 8)
    with pytest.raises(GraphError, match="muon_fraction"):
        optimizer_state_bytes("muon")
    from wattcast.simulate.memory import estimate_memory

    fwd = _fwd()
    g = training_graph(fwd, optimizer="muon", framework="hf")
    adam = estimate_memory(training_graph(fwd, optimizer="adamw"))
    mem = estimate_memory(g)
    p, pm = float(g.meta["param_count"]), float(g.meta["muon_param_count"])
    assert mem.optimizer_gb == pytest.approx((4 * pm + 8 * (p - pm)) / 1e9)
    assert mem.weights_gb == pytest.approx(adam.weights_gb) and mem.gradients_gb == pytest.approx(adam.gradients_gb)


def test_layer_wise_ping_pong_split():
    """LayerWiseDistributedOptimizer's example (layer_wise_optimizer.py l. 94-96): 4 ranks and p0-p9 sorted by size
    give [[p0, p7, p8], [p1, p6, p9], [p2, p5], [p3, p4]]: with equal weights the busiest rank steps 3 of 10."""
    from wattcast.simulate.distributed import layer_wise_shares

    t = pd.DataFrame({"layer": 0, "numel": np.arange(1, 11, dtype=float), "ns_flops": 0.0, "step_bytes": 1.0})
    assert layer_wise_shares(t, np.zeros(10, dtype=int), 1, 4, 1.0, 1.0)[0] == pytest.approx(3 / 10)
    # weighed by size 1..10: ranks hold 1 + 8 + 9, 2 + 7 + 10, 3 + 6, 4 + 5 of 55; the busiest is rank 1
    t["step_bytes"] = t["numel"]
    assert layer_wise_shares(t, np.zeros(10, dtype=int), 1, 4, 1.0, 1.0)[0] == pytest.approx(19 / 55)


def test_megatron_zero1_is_the_layer_wise_optimizer():
    kw = dict(gpus=8, batch=8, seq=256, tp=1, dp=8, framework="megatron")
    z0 = wattcast.predict_cluster("gpt2", "DGX-H100", zero=0, optimizer="muon", **kw)
    z1 = wattcast.predict_cluster("gpt2", "DGX-H100", zero=1, optimizer="muon", **kw)
    a1 = wattcast.predict_cluster("gpt2", "DGX-H100", zero=1, optimizer="adamw", **kw)
    # each rank steps its share of whole tensors: at least an eighth of the whole step, well under all of it
    assert z0.optimizer_ms / 8 <= z1.optimizer_ms < z0.optimizer_ms / 2
    assert z1.optimizer_ms > a1.optimizer_ms
    # its states sharded over DP by whole tensors: under all of them, but (gpt2's embedding is 31 % of the model, its
    # rank keeps it whole with AdamW's two moments) over the distributed optimizer's even 1 / 8 of AdamW's
    m0, m1 = z0.to_dict()["memory"], z1.to_dict()["memory"]
    assert m1["optimizer_gb"] < m0["optimizer_gb"]
    assert m1["optimizer_gb"] > a1.to_dict()["memory"]["optimizer_gb"]
    assert z1.parallel.overlap_param_gather is False  # its all-gather runs inside the step


@pytest.mark.parametrize("framework,zero,extra,match", [
    ("hf", 1, {}, "torch.optim.Muon"),
    ("megatron", 2, {}, "zero 2/3"),
    ("megatron", 1, {"overlap_param_gather": True}, "inside its step"),
])
def test_unmodelled_combinations_are_refused(framework, zero, extra, match):
    with pytest.raises(ParallelConfigError, match=match):
        wattcast.predict_cluster("gpt2", "DGX-H100", gpus=8, batch=8, seq=256, tp=1, dp=8, zero=zero,
                                 framework=framework, optimizer="muon", **extra)


def test_refusals_of_the_graph():
    with pytest.raises(GraphError, match="megatron-deepspeed"):
        training_graph(_fwd(), optimizer="muon", framework="megatron-deepspeed")
    with pytest.raises(GraphError, match="foreach"):
        StepOptions(optimizer="muon", optimizer_impl="foreach").validated()


def test_predict_names_the_muon_rows_and_adamw_is_unchanged():
    kw = dict(batch=1, seq=128, dtype="bf16")
    adam = wattcast.predict("gpt2", "H100-SXM5-80GB", **kw)
    muon = wattcast.predict("gpt2", "H100-SXM5-80GB", optimizer="muon", **kw)
    classes = {r["op_class"] for r in muon.to_dict()["per_op"]}
    assert {"muon_newton_schulz", "muon_update"} <= classes
    assert muon.overheads["optimizer_step_ms"] > adam.overheads["optimizer_step_ms"]
    assert muon.to_dict()["settings"]["optimizer"] == "muon"


def _megatron_shard_params(numel, dp):
    """LayerWiseDistributedOptimizer.shard_params (layer_wise_optimizer.py l. 92-136) as written there: sort by numel,
    deal ping-pong over 0..dp-1, dp-1..0; each rank's list of indices."""
    loop = list(range(dp)) + list(range(dp))[::-1]
    ranks = [[] for _ in range(dp)]
    for j, i in enumerate(sorted(range(len(numel)), key=lambda k: numel[k])):
        ranks[loop[j % len(loop)]].append(i)
    return ranks


def test_layer_wise_state_shares_of_the_busiest_rank():
    """Sizes 1..10 on 4 ranks: [[1, 8, 9], [2, 7, 10], [3, 6], [4, 5]] hold 18, 19, 9, 9 of 55: the busiest rank's
    master weights and states are 19 / 55 of the stage's, not 1 / 4."""
    from wattcast.simulate.distributed import layer_wise_state_shares

    t = pd.DataFrame({"layer": 0, "numel": np.arange(1, 11, dtype=float), "ns_flops": 0.0, "step_bytes": 1.0,
                      "muon": False})
    m, o = layer_wise_state_shares(t, np.zeros(10, dtype=int), 1, 4, 4.0)
    assert m[0] == pytest.approx(19 / 55) and o[0] == pytest.approx(19 / 55)
    # a Muon tensor keeps 4 B of state, an AdamW one 8 (each 4 B of master): with the 10 as Muon, rank 1 holds
    # (2 + 7) x 12 + 10 x 8 = 188 B, rank 0 (1 + 8 + 9) x 12 = 216 B: rank 0 is now the busiest
    t["muon"] = t["numel"] == 10
    m, o = layer_wise_state_shares(t, np.zeros(10, dtype=int), 1, 4, 4.0)
    per = [sum(t["numel"][i] * (4 + (4 if t["muon"][i] else 8)) for i in r) for r in _megatron_shard_params(t["numel"], 4)]
    busy = _megatron_shard_params(t["numel"], 4)[int(np.argmax(per))]
    assert busy == [0, 7, 8] and m[0] == pytest.approx(18 / 55)
    assert m[0] == pytest.approx(sum(t["numel"][i] for i in busy) / 55)
    opt = t["numel"] * np.where(t["muon"], 4, 8)
    assert o[0] == pytest.approx(sum(opt[i] for i in busy) / opt.sum())


def test_layer_wise_memory_is_the_busiest_ranks_whole_tensors():
    """Under the layer-wise optimizer a rank keeps the master weights and states of its whole tensors: gpt2's 50257 x
    768 embedding alone is over an eighth of the model, so at dp 8 the busiest rank holds more than 1 / 8 (until this
    fix the memory took ZeRO-1's even 1 / dp)."""
    from wattcast.featurize.training_graph import optimizer_param_tensors

    kw = dict(gpus=8, batch=8, seq=256, tp=1, dp=8, zero=1, framework="megatron", optimizer="muon")
    mem = wattcast.predict_cluster("gpt2", "DGX-H100", **kw).to_dict()["memory"]
    g = step_graph("gpt2", StepOptions(batch=1, seq=256, mode="train", dtype="bf16", framework="megatron",
                                       optimizer="muon"))
    t = optimizer_param_tensors(g)
    numel, muon = t["numel"].tolist(), t["muon"].tolist()
    ranks = _megatron_shard_params(numel, 8)
    state = [sum(numel[i] * (4 + (4 if muon[i] else 8)) for i in r) for r in ranks]
    busy = ranks[int(np.argmax(state))]
    assert mem["master_weights_gb"] == pytest.approx(sum(4 * numel[i] for i in busy) / 1e9, rel=1e-6)
    assert mem["optimizer_gb"] == pytest.approx(sum(numel[i] * (4 if muon[i] else 8) for i in busy) / 1e9, rel=1e-6)
    assert mem["master_weights_gb"] > 1.2 * 4 * sum(numel) / 8 / 1e9  # well over the even split


def test_search_checks_each_candidate_against_muons_rules():
    """A search shares one schedule context per group of candidates (whatever their ZeRO stage): Muon's refusals are
    checked per candidate, so no ZeRO-2 row under megatron (until this fix 22 of them were ranked)."""
    r = wattcast.search("gpt2", "DGX-H100", gpus=8, batch=8, seq=256, framework="megatron", optimizer="muon",
                        zero=[0, 2], max_configs=500)
    assert len(r.ranked) and set(r.ranked["zero"]) == {0}
    assert r.rejected["rule"].str.contains("zero 2/3").any()


def test_unsplittable_qkv_is_a_graph_warning():
    """TP 16 over Llama 3 8B's 8 key/value groups: each rank's linear_qkv shard (384 rows) is less than one query
    group (512 + 128 + 128), which Megatron-Core's QKV split cannot view (muon.py l. 143-148): costed unsplit, said in
    the graph's warnings; TP 8 splits cleanly, no warning."""
    def graph(tp):
        return training_graph(_fwd("llama3_8b", framework="megatron", tp=tp), optimizer="muon", framework="megatron")
    w16 = [w for w in graph(16).meta.get("warnings", []) if "linear_qkv" in w]
    assert len(w16) == 1 and "384 rows" in w16[0] and "muon_split_qkv" in w16[0]
    assert not [w for w in graph(8).meta.get("warnings", []) if "linear_qkv" in w]


def test_optimizer_param_tensors_needs_a_muon_graph():
    from wattcast.featurize.training_graph import optimizer_param_tensors

    with pytest.raises(GraphError, match="optimizer muon"):
        optimizer_param_tensors(training_graph(_fwd(), optimizer="adamw"))
    g = training_graph(_fwd(), optimizer="muon", framework="hf")
    t = optimizer_param_tensors(g)
    assert t.loc[t["muon"], "numel"].sum() == pytest.approx(g.meta["muon_param_count"])
    assert t["numel"].sum() == pytest.approx(g.meta["param_count"])


def test_stage_muon_fraction_follows_the_layer_placement(monkeypatch):
    """Llama 3 8B, tp 2, pp 4: the embedding's and the output layer's stages have a lower Muon share than the middle
    ones, and --pp-first-stage-layers 2 lowers the first stage's (2 layers of 109.05 M Muon parameters per rank beside
    the 262.7 M embedding shard: 0.4536)."""
    import wattcast.simulate.distributed as D

    seen = []
    orig = D.stage_memory_gb

    def spy(**kw):
        seen.append(np.asarray(kw["muon_fraction"], dtype=float).copy())
        return orig(**kw)

    monkeypatch.setattr(D, "stage_memory_gb", spy)
    kw = dict(gpus=8, batch=16, seq=512, tp=2, pp=4, dp=1, zero=0, framework="megatron", optimizer="muon")
    wattcast.predict_cluster("llama3_8b", "DGX-H100", **kw)
    even = seen[-1]
    wattcast.predict_cluster("llama3_8b", "DGX-H100", pp_first_stage_layers=2, **kw)
    first2 = seen[-1]
    assert even[0] < even[1] and even[3] < even[2] and even[1] > 0.999
    assert first2[0] == pytest.approx(0.4536, abs=1e-3) and first2[0] < even[0]


def test_search_rows_match_predict_under_the_layer_wise_optimizer():
    """A search's schedule contexts drop the graph's rows (ScheduleContext.without_kernels): the layer-wise split reads
    the view's tensors, so a searched row has predict_cluster's step time and memory (until this fix the search fell
    back to an even 1 / dp for both)."""
    kw = dict(gpus=8, batch=8, seq=256, framework="megatron", optimizer="muon")
    r = wattcast.search("gpt2", "DGX-H100", zero=[1], tp=[1], pp=[1], max_configs=50, **kw)
    for row in r.ranked.head(3).to_dict("records"):
        p = wattcast.predict_cluster("gpt2", "DGX-H100", strategy=row["strategy"], **kw)
        assert row["memory_gb"] == pytest.approx(p.memory_gb, rel=1e-9)
        assert row["step_time_ms"] == pytest.approx(p.step_time_ms, rel=1e-9)
