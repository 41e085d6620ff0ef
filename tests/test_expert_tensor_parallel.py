"""Megatron-Core's --expert-tensor-parallel-size (etp): the routed experts' own tensor-parallel degree, folded with ep
over the attention's tp x cp x dp ranks (MoE parallel folding). Each test fails without the option: the experts were
split over the attention's tp, their dispatcher gathered over the TP group, and ep had to divide dp x cp."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import wattcast
from wattcast.cli import app
from wattcast.data.cluster_spec import resolve_cluster
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.parallel import ParallelConfig, ParallelConfigError, expert_dp, layouts
from wattcast.simulate.strategy import format_strategy, parse_strategy

H, FFN, EXPERTS, LAYERS = 4096, 14336, 8, 32  # Mixtral 8x7B (featurize/hf_configs/mixtral_8x7b.json)
KW = dict(gpus=8, batch=8, seq=2048, tp=4, sp=True, micro_batch=1, zero=1, dtype="bf16", attention="flash",
          framework="megatron")


def _layer0(**opts):
    g = step_graph("mixtral_8x7b", StepOptions(batch=1, seq=2048, dtype="bf16", attention="flash", framework="megatron",
                                               blocks=1, **opts))
    n = g.nodes
    return n[n["layer"] == 0]


def test_experts_split_over_etp_and_gather_over_the_etp_group():
    """tp 4 with etp 1: each expert's FC1 is whole (2 x ffn wide, not / 4) and the dispatcher neither gathers nor
    scatters (no collective on the etp group); etp 2: FC1 is 2 x ffn / 2 and the gather runs over the etp group."""
    one = _layer0(tp=4, sp=True, ep=2, etp=1)
    fc1 = one[one["name"].str.endswith("experts.0.linear_fc1")].iloc[0]
    assert (fc1["K"], fc1["N"]) == (2 * FFN, H) or (fc1["N"], fc1["K"]) == (H, 2 * FFN)
    assert not (one["group"] == "etp").any()
    two = _layer0(tp=4, sp=True, ep=2, etp=2)
    fc1 = two[two["name"].str.endswith("experts.0.linear_fc1")].iloc[0]
    assert 2 * FFN // 2 in (fc1["K"], fc1["N"])
    assert set(two.loc[two["name"].str.startswith("moe.enter"), "group"]) == {"etp"}
    # the attention's collectives stay on the TP group
    assert (two["group"] == "tp").any()


def test_default_etp_is_tp_with_the_dispatcher_on_its_own_group():
    """Without etp the experts keep the attention's tp (Megatron-Core's default): same GEMM shapes and bytes as etp =
    tp; the dispatcher's gather is named for the expert group (it is not a TE linear layer's collective)."""
    a, b = _layer0(tp=2, sp=True, ep=2), _layer0(tp=2, sp=True, ep=2, etp=2)
    cols = ["name", "M", "N", "K", "bytes", "group"]
    assert a[cols].fillna(0).values.tolist() == b[cols].fillna(0).values.tolist()
    assert set(a.loc[a["name"].str.startswith("moe.enter"), "group"]) == {"etp"}


def test_etp_one_holds_whole_experts_and_lets_ep_span_the_tp_ranks():
    """tp 4 x dp 2 with ep 8 and etp 1: ep 8 does not divide dp x cp = 2 (refused without etp), but etp x ep = 8
    divides tp x cp x dp = 8; each rank holds one whole expert per layer (the same expert parameters as etp 4 x ep 2),
    its ep group is the node's 8 consecutive ranks and the expert-DP group is one rank."""
    with pytest.raises(ParallelConfigError, match=r"ep \(8\) must divide"):
        wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", ep=8, **KW)
    r1 = wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", ep=8, etp=1, **KW)
    r4 = wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", ep=2, etp=4, **KW)
    assert r1.per_device[0]["params"] == pytest.approx(r4.per_device[0]["params"], rel=1e-9)
    assert r1.comm["layouts"]["ep"] == {"size": 8, "gpus_per_node": 8, "nodes": 1}
    assert r1.comm["layouts"]["etp"]["size"] == 1
    assert expert_dp(r1.parallel) == 1 and expert_dp(r4.parallel) == 1
    assert r1.to_dict()["parallel"]["etp"] == 1 and r4.to_dict()["parallel"]["etp"] == 4
    # the experts' TP collectives are gone; the attention's remain
    assert r1.exposed_comm_split_ms["tp"] < r4.exposed_comm_split_ms["tp"]


def test_expert_groups_fold_etp_innermost():
    lay = layouts(ParallelConfig(gpus=16, tp=4, dp=4, ep=4, etp=2), resolve_cluster("DGX-H100"))
    assert lay["etp"].size == 2 and lay["ep"].size == 4
    assert lay["ep"].gpus_per_node == 4  # stride 2: 4 members over 8 consecutive ranks of one node
    assert expert_dp(ParallelConfig(gpus=16, tp=4, dp=4, ep=4, etp=2)) == 2  # 4 x 4 / (2 x 4)


def test_etp_defaults_to_tp_bit_for_bit():
    a = wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", ep=2, **KW)
    b = wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", ep=2, etp=4, **KW)
    assert a.step_time_ms == b.step_time_ms and a.memory_gb == b.memory_gb


@pytest.mark.parametrize("change, match", [
    (dict(model="llama3_8b"), "needs a mixture-of-experts model"),
    (dict(framework="hf"), "use --framework megatron"),
    (dict(etp=3), r"must divide tp x cp x dp"),
    (dict(etp=0), "must be a positive integer"),
    (dict(sp=False, ep=1), "needs sequence parallelism"),
])
def test_etp_rules(change, match):
    kw = dict(KW, ep=2, etp=1)
    model = change.pop("model", "mixtral_8x7b")
    kw.update(change)
    with pytest.raises(ParallelConfigError, match=match):
        wattcast.predict_cluster(model, "DGX-H100", **kw)


def test_strategy_string_carries_etp_when_it_differs_from_tp():
    r = wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", ep=8, etp=1, **KW)
    s = format_strategy(r.parallel, KW["batch"], "megatron")
    assert s.endswith("-etp1") and parse_strategy(s).parallel_config().etp == 1
    again = wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", strategy=s, dtype="bf16", attention="flash",
                                     framework="megatron", seq=KW["seq"])
    assert again.step_time_ms == r.step_time_ms
    same = wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", ep=2, etp=4, **KW)
    assert "etp" not in format_strategy(same.parallel, KW["batch"], "megatron")


def test_cli_predict_and_search_take_expert_tensor_parallel_size():
    runner = CliRunner()
    common = ["-m", "mixtral_8x7b", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "8", "--seq", "2048",
              "--dtype", "bf16", "--attention", "flash", "--framework", "megatron"]
    res = runner.invoke(app, ["predict", *common, "--tp", "4", "--sp", "--ep", "8", "--micro-batch", "1", "--zero", "1",
                              "--expert-tensor-parallel-size", "1", "--allow-oom", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["parallel"]["etp"] == 1
    bad = runner.invoke(app, ["predict", "-m", "mixtral_8x7b", "--etp", "1"])
    assert bad.exit_code != 0 and "--expert-tensor-parallel-size" in bad.output.replace("\n", "")
    big = [x if x != "8" else "16" for x in common]  # 16 GPUs, batch 16: some candidates fit
    res = runner.invoke(app, ["search", *big, "--ep", "8", "--etp", "1", "--workers", "1", "--json", "--top", "50"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["ranked"]
    assert rows and {r["etp"] for r in rows} == {1} and all(r["ep"] == 8 for r in rows)
    assert any(r["tp"] > 1 and r["strategy"].endswith("etp1") for r in rows)


def test_search_rows_with_different_etp_are_their_own_predictions():
    """Candidates that differ only in etp build different rank graphs: each search row is exactly what predict says
    for its strategy string (they shared one schedule context before the evaluator's key held etp)."""
    res = wattcast.search("mixtral_8x7b", "DGX-H100", gpus=16, batch=16, seq=2048, dtype="bf16", attention="flash",
                          framework="megatron", tp=(4,), pp=(1,), ep=(4,), etp=(1, 2, 4), sp=(True,), zero=(1,),
                          recompute=("full",), micro_batch=(1,), interleave=(1,), workers=1, prune_oom=False)
    rows = res.ranked
    assert sorted(rows["etp"]) == [1, 2, 4]
    times = {}
    for _, r in rows.iterrows():
        p = wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", strategy=r["strategy"], seq=2048, dtype="bf16",
                                     attention="flash", framework="megatron")
        assert p.step_time_ms == pytest.approx(r["step_time_ms"], rel=1e-9)
        times[r["etp"]] = r["step_time_ms"]
    assert len(set(times.values())) == 3


def test_expert_gradients_reduce_over_expert_dp_when_dp_is_one():
    """tp 8 x dp 1 with ep 2 and etp 1: the attention has no data parallelism, but each expert shard sits on
    expert-dp = 8 / 2 = 4 ranks: its gradients are reduced (and, under ZeRO-1, its parameters gathered) over them.
    With ep 8 (expert-dp 1) there is nothing to reduce."""
    kw = dict(gpus=8, batch=8, seq=2048, tp=8, sp=True, etp=1, zero=1, micro_batch=1, dtype="bf16", attention="flash",
              framework="megatron", recompute="full")
    lone = wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", ep=8, **kw)
    shared = wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", ep=2, **kw)
    assert expert_dp(shared.parallel) == 4 and expert_dp(lone.parallel) == 1
    assert lone.comm["dp_sync_ms"] == 0.0 and lone.comm["dp_param_gather_ms"] == 0.0
    assert shared.comm["dp_sync_ms"] > 0 and shared.comm["dp_param_gather_ms"] > 0
    assert shared.exposed_comm_split_ms["dp"] > 0


def test_search_tries_etp_one_by_default_for_moe_under_megatron():
    kw = dict(gpus=16, batch=16, seq=2048, dtype="bf16", attention="flash", tp=(4,), pp=(1,), ep=(4,), sp=(True,),
              zero=(1,), recompute=("full",), micro_batch=(1,), interleave=(1,), workers=1, prune_oom=False)
    mega = wattcast.search("mixtral_8x7b", "DGX-H100", framework="megatron", **kw).ranked
    assert sorted(mega["etp"]) == [1, 4]
    hf = wattcast.search("mixtral_8x7b", "DGX-H100", framework="hf", **{**kw, "sp": (False,)}).ranked
    assert list(hf["etp"]) == [4]
    dense = wattcast.search("llama3_8b", "DGX-H100", framework="megatron", **{**kw, "ep": (1,)}).ranked
    assert dense["etp"].isna().all() and len(dense) == 1
