"""Megatron-Core's all-gather token dispatcher (``--moe-token-dispatcher-type allgather``, MoEAllGatherTokenDispatcher,
megatron-core 0.16.1 megatron/core/transformer/moe/token_dispatcher.py l. 208-345) and the GPT graph's MoE layer under
--framework megatron. Each test fails on the code before the option existed (no such StepOptions field / CLI flag, a
GPT's ``num_experts`` ignored)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from wattcast.cli import app
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.distributed import predict_distributed
from wattcast.simulate.parallel import ParallelConfig

# a small GPT: hidden 64, FFN 4h = 256, 4 experts, top-2; batch 2 x seq 32 on tp 2 with sequence parallelism: each rank
# holds 2 x 32 / 2 = 32 tokens
H, FFN, E, TOPK, B, S, TP, EP = 64, 256, 4, 2, 2, 32, 2, 2
CFG = {"model_type": "gpt2", "n_embd": H, "n_head": 4, "n_layer": 1, "n_positions": S, "vocab_size": 128,
       "num_experts": E, "num_experts_per_tok": TOPK}


def _nodes(dispatcher: str, **kw):
    opts = dict(batch=B, seq=S, dtype="bf16", framework="megatron", tp=TP, sp=True, ep=EP, **kw)
    return step_graph(CFG, StepOptions(moe_token_dispatcher=dispatcher, **opts)).nodes


def test_allgather_collectives_follow_the_source_formulas():
    """Per rank t = 32 tokens, the tp_ep group g = etp x ep = 2 x 2 = 4, so 128 tokens gathered: the routing map
    128 x 4 bools = 512 B (no backward), the probabilities 128 x 4 x 2 B = 1,024 B, the hidden states 128 x 64 x 2 B =
    16,384 B (backward reduce-scatters of the same sizes), and the combine's reduce-scatter of the (128, 64) unpermuted
    tensor, 16,384 B (backward an all-gather). No all-to-all and no expert-TP gather of the all-to-all path."""
    n = _nodes("allgather")
    c = n[n["op_class"] == "collective"]
    moe = c[c["group"] == "tp_ep"].set_index("name")
    assert moe.loc["moe.dispatch.routing_map.all_gather", "bytes"] == 128 * E * 1
    assert moe.loc["moe.dispatch.probs.all_gather", "bytes"] == 128 * E * 2
    assert moe.loc["moe.dispatch.all_gather", "bytes"] == 128 * H * 2
    assert moe.loc["moe.combine.reduce_scatter", "kernel"] == "reduce_scatter"
    assert moe.loc["moe.combine.reduce_scatter", "bytes"] == 128 * H * 2
    assert moe.loc["moe.dispatch.all_gather.grad", "kernel"] == "reduce_scatter"
    assert moe.loc["moe.combine.reduce_scatter.grad", "kernel"] == "all_gather"
    assert "moe.dispatch.routing_map.all_gather.grad" not in moe.index  # under no_grad
    assert not (c["kernel"] == "all_to_all").any() and not (c["group"] == "etp").any()
    # the experts: 128 x top-2 / ep 2 = 128 rows on this rank, 64 per local expert, FC1 split over etp (256 / 2)
    fc1 = n[(n["phase"] == "forward") & n["name"].str.endswith("experts.0.linear_fc1")].iloc[0]
    assert sorted((int(fc1["M"]), int(fc1["N"]))) == sorted((64, FFN // TP)) or 64 in (fc1["M"], fc1["N"])


def test_alltoall_stays_the_default_and_differs():
    """The default graph is the all-to-all dispatcher's (every existing figure kept); the all-gather one differs."""
    a2a = _nodes("alltoall")
    assert (a2a["kernel"] == "all_to_all").any() and not (a2a["group"] == "tp_ep").any()
    assert StepOptions().moe_token_dispatcher == "alltoall"
    with pytest.raises(GraphError, match="unknown MoE token dispatcher"):
        StepOptions(moe_token_dispatcher="flex").validated()


def test_gpt_reads_num_experts_under_megatron_only():
    """A GPT config with experts builds Megatron-Core's MoE layer under --framework megatron (SequentialMLP GeLU
    experts, no dense MLP); the same config without experts stays the dense GPT on the Hugging Face path."""
    meg = step_graph(CFG, StepOptions(batch=B, seq=S, dtype="bf16", framework="megatron")).nodes
    assert meg["name"].str.contains("experts.3.linear_fc1").any() and not meg["name"].eq("mlp.c_fc").any()
    dense = {k: v for k, v in CFG.items() if k not in ("num_experts", "num_experts_per_tok")}
    hf = step_graph(dense, StepOptions(batch=B, seq=S, dtype="bf16")).nodes
    assert hf["name"].eq("mlp.c_fc").any() and not hf["name"].str.contains("experts").any()


@pytest.mark.parametrize("framework", ["hf", "megatron-deepspeed"])
@pytest.mark.parametrize("key", ["num_experts", "num_local_experts"])
def test_gpt_with_experts_outside_megatron_is_refused(framework, key):
    """Until stop 45b a GPT config's expert count under any framework but megatron was dropped without a word: the
    graph built the dense MLP and the prediction was the dense model's. Now a GraphError names the field and says only
    --framework megatron builds a GPT's experts (predict_distributed raises it too)."""
    cfg = {**{k: v for k, v in CFG.items() if k != "num_experts"}, key: E}
    with pytest.raises(GraphError, match=rf"field '{key}' \({E}\).*only --framework megatron builds a GPT's experts"):
        step_graph(cfg, StepOptions(batch=B, seq=S, dtype="bf16", framework=framework))
    if framework == "hf":
        par = ParallelConfig(gpus=2, tp=2, dp=1, sp=True, micro_batch=1)
        with pytest.raises(GraphError, match="only --framework megatron builds a GPT's experts"):
            predict_distributed(cfg, "DGX-A100", gpus=2, batch=2, seq=S, parallel=par, dtype="bf16", attention="eager",
                                framework=framework)


def test_predict_distributed_and_cli_take_the_dispatcher():
    par = ParallelConfig(gpus=8, tp=2, dp=4, ep=2, sp=True, micro_batch=1)
    kw = dict(gpus=8, batch=8, seq=S, parallel=par, dtype="bf16", attention="eager", framework="megatron")
    a2a = predict_distributed(CFG, "DGX-A100", **kw)
    ag = predict_distributed(CFG, "DGX-A100", moe_token_dispatcher="allgather", **kw)
    assert a2a.step_time_ms == predict_distributed(CFG, "DGX-A100", moe_token_dispatcher="alltoall", **kw).step_time_ms
    assert ag.step_time_ms != a2a.step_time_ms
    with pytest.raises(ValueError, match="framework megatron"):
        predict_distributed(CFG, "DGX-A100", moe_token_dispatcher="allgather", **{**kw, "framework": "hf"})
    run = CliRunner().invoke(app, ["predict", "-m", "mixtral_8x7b", "--cluster", "DGX-A100", "--gpus", "8", "--batch", "8",
                                   "--seq", "1024", "--tp", "2", "--sp", "--ep", "4", "--framework", "megatron",
                                   "--moe-token-dispatcher-type", "allgather", "--allow-oom", "--json"])
    assert run.exit_code == 0, run.output
    assert '"moe_token_dispatcher": "allgather"' in run.output


def test_step_terms_count_the_tp_ep_class_with_tp():
    """Under the all-gather dispatcher exposed_comm_split_ms has a ``tp_ep`` class (its all-gathers and reduce-scatters
    over the expert-TP x EP ranks); step_terms read only "tp" + "ep" and left it in other_ms (the MoE CI row: split
    tp_ep 52.5 ms, exposed_tp_ms 0.0, other_ms 50.3). It now counts in exposed_tp_ms, and a class no term counts is
    refused instead of vanishing."""
    from types import SimpleNamespace

    from wattcast.validation.step_breakdown import step_terms

    par = ParallelConfig(gpus=8, tp=2, dp=4, ep=2, sp=True, micro_batch=1)
    p = predict_distributed(CFG, "DGX-A100", gpus=8, batch=8, seq=S, parallel=par, dtype="bf16", attention="eager",
                            framework="megatron", moe_token_dispatcher="allgather")
    split = p.exposed_comm_split_ms
    assert split["tp_ep"] > 0
    t = step_terms(p)
    assert t["exposed_tp_ms"] == pytest.approx(split["tp"] + split["ep"] + split["tp_ep"])
    listed = sum(v for k, v in t.items() if k not in ("n_micro", "launch_gap_ms", "other_ms"))
    assert listed + t["other_ms"] == pytest.approx(p.step_time_ms)
    fake = SimpleNamespace(**{k: getattr(p, k) for k in ("meta", "parallel", "per_op", "comm", "bubble_ms",
                                                         "optimizer_ms", "step_time_ms")},
                           exposed_comm_split_ms={**split, "xyz": 1.0})
    with pytest.raises(ValueError, match="xyz"):
        step_terms(fake)


# megatron-core 0.16.1 transformer_config.py l. 1866-1869: the EP overlap is "supported with alltoall/flex token
# dispatcher"; before, the all-gather dispatcher took --overlap-moe-expert-parallel-comm and did nothing with it
# (Mixtral 8x7B on 16 H100s: 1774.99 ms either way, the JSON saying the overlap was on)
CFG4 = {**CFG, "n_layer": 4}


def test_ep_overlap_with_the_allgather_dispatcher_is_refused():
    from wattcast.simulate.parallel import ParallelConfigError

    par = ParallelConfig(gpus=8, tp=2, dp=4, ep=2, sp=True, micro_batch=1, overlap_moe_expert_parallel_comm=True)
    kw = dict(gpus=8, batch=8, seq=S, parallel=par, dtype="bf16", attention="eager", framework="megatron")
    assert predict_distributed(CFG, "DGX-A100", **kw).parallel.overlap_moe_expert_parallel_comm  # alltoall: taken
    with pytest.raises(ParallelConfigError, match="alltoall/flex token dispatcher"):
        predict_distributed(CFG, "DGX-A100", moe_token_dispatcher="allgather", **kw)
    run = CliRunner().invoke(app, ["predict", "-m", "mixtral_8x7b", "--cluster", "dgx-h100", "--gpus", "16", "--batch",
                                   "32", "--seq", "1024", "--tp", "2", "--sp", "--ep", "4", "--micro-batch", "1",
                                   "--framework", "megatron", "--moe-token-dispatcher-type", "allgather",
                                   "--overlap-moe-expert-parallel-comm", "--allow-oom", "--json"])
    assert run.exit_code != 0 and "alltoall/flex token dispatcher" in " ".join(run.output.split()), run.output


def test_search_skips_the_ep_overlap_under_the_allgather_dispatcher():
    """DualPipe turns the EP overlap on by default: under the all-gather dispatcher those candidates are rejected (the
    1F1B ones still ranked); the overlap asked of every candidate is refused before the search runs."""
    import wattcast

    kw = dict(framework="megatron", attention="eager", tp=2, sp=True, pp=2, ep=2, micro_batch=1, zero=0,
              recompute="none", interleave=1, schedule=("1f1b", "dualpipe"), moe_token_dispatcher="allgather")
    res = wattcast.search(CFG4, "DGX-A100", 8, 8, S, **kw)
    assert len(res.ranked) and set(res.ranked["schedule"]) == {"1f1b"}
    assert res.rejected["rule"].str.contains("alltoall/flex token dispatcher").any()
    with pytest.raises(ValueError, match="alltoall/flex token dispatcher"):
        wattcast.search(CFG4, "DGX-A100", 8, 8, S, **{**kw, "schedule": "1f1b"},
                        overlaps={"overlap_moe_expert_parallel_comm": True})
