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
