"""A tied LM head under pipeline parallelism (simulate/distributed.py ``tied_copy_params_by_chunk``,
``tied_grad_sync_ms``): the last stage holds its own copy of the word-embedding matrix (Megatron-Core's
``LanguageModule.setup_embeddings_and_output_layer``; DeepSpeed's ``TiedLayerSpec``), with its weights, gradients and
optimizer states, and every step the first and the last stage all-reduce its gradient (Megatron-Core's
``finalize_model_grads`` -> ``_allreduce_embedding_grads``, after the DP sync; DeepSpeed's ``_exec_reduce_tied_grads``,
before it). Without a pipeline the head reads the embedding's weight: nothing changes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from wattcast.data.cluster_spec import resolve_cluster
from wattcast.simulate.distributed import (collective_model, collective_ms, schedule_context, schedule_step,
                                           tied_copy_params_by_chunk, tied_grad_bytes, tied_grad_sync_ms)
from wattcast.simulate.options import DistributedOptions
from wattcast.simulate.parallel import GroupLayout, ParallelConfig, embedding_group_layout
from wattcast.simulate.trace import TRACKS, distributed_trace_events

H, L, V_PADDED, T = 12288, 96, 51200, 8
GPT3 = {"model_type": "gpt2", "n_embd": H, "n_head": 96, "n_layer": L, "n_positions": 2048, "vocab_size": 51200,
        "activation_function": "gelu", "_name_or_path": "gpt3_175b_tied_test"}
#: the copy on one TP rank: (padded vocab / tp) x hidden
COPY = V_PADDED // T * H


def _small(tied: bool = True) -> dict:
    return {"model_type": "gpt2", "n_embd": 1024, "n_head": 16, "n_layer": 8, "n_positions": 2048, "vocab_size": 50257,
            "activation_function": "gelu", "tie_word_embeddings": tied, "_name_or_path": f"gpt-small-tied-{tied}"}


def _ctx(model, par, **opts):
    o = dict(batch=par.dp * par.pp * 2, seq=2048, dtype="bf16", attention="eager", framework="megatron")
    o.update(opts)
    return schedule_context(model, "DGX-A100", par, DistributedOptions(**o))


def _without_copy(ctx):
    """The same step with the graph's tied-head record removed: what wattcast predicted before the copy was counted."""
    meta = {k: v for k, v in ctx.g.meta.items() if k != "tied_output_params"}
    return dataclasses.replace(ctx, g=dataclasses.replace(ctx.g, meta=meta))


def _states(d: dict) -> float:
    return (d["weights_gb"] + d["gradients_gb"] + d["optimizer_gb"]) * 1e9


def test_graph_records_the_tied_heads_parameters_per_rank():
    ctx = _ctx(GPT3, ParallelConfig(gpus=128, tp=T, pp=8, dp=2, micro_batch=1, sp=True, recompute="selective", zero=1))
    assert ctx.g.meta["tied_output_params"] == COPY == 78_643_200
    untied = _ctx(_small(False), ParallelConfig(gpus=8, tp=2, pp=2, dp=2, micro_batch=1))
    assert "tied_output_params" not in untied.g.meta


def test_last_stage_holds_the_copy_with_its_states_under_the_distributed_optimizer():
    """GPT-3 175B, TP8 PP8 DP2, bf16, distributed optimizer: the last stage holds L/p layers, the final LayerNorm (2h)
    and the copy; its model states grow by the copy x (2 + 4 + 12/d) bytes (bf16 weight, fp32 main grad, fp32 master
    and Adam moments sharded over d: Megatron's 6 + 12/d). The audit's 0.58 GB is 78.6M x 7.5 B = 0.59 GB."""
    dp = 2
    r = schedule_step(_ctx(GPT3, ParallelConfig(gpus=T * 8 * dp, tp=T, pp=8, dp=dp, micro_batch=1, sp=True,
                                                recompute="selective", zero=1)))
    mid, last = r.per_device[1], r.per_device[-1]
    assert last["params"] - mid["params"] == COPY + 2 * H
    per_param = 2 + 4 + 12 / dp
    assert _states(last) - _states(mid) == pytest.approx((COPY + 2 * H) * per_param, rel=1e-9)
    assert r.comm["tied_embedding_copy_params"] == COPY
    # the audit's configuration: d = 8 -> 7.5 B a parameter
    assert COPY * (2 + 4 + 12 / 8) / 1e9 == pytest.approx(0.59, abs=0.005)


def test_last_stage_states_without_the_distributed_optimizer_are_18_bytes_a_parameter():
    ctx = _ctx(GPT3, ParallelConfig(gpus=T * 8 * 2, tp=T, pp=8, dp=2, micro_batch=1, sp=True, recompute="selective"))
    r, before = schedule_step(ctx), schedule_step(_without_copy(ctx))
    assert _states(r.per_device[-1]) - _states(before.per_device[-1]) == pytest.approx(COPY * 18, rel=1e-9)
    assert r.per_device[-1]["memory_gb"] - before.per_device[-1]["memory_gb"] == pytest.approx(COPY * 18 / 1e9, rel=1e-9)
    # the other stages do not move
    for a, b in zip(r.per_device[:-1], before.per_device[:-1]):
        assert a["memory_gb"] == b["memory_gb"] and a["params"] == b["params"]


def test_embedding_gradient_all_reduce_size_placement_and_step():
    """A 2-rank all-reduce of (padded vocab / tp) x hidden fp32 main-grad elements (Megatron under bf16) between the
    first and the last stage (rank distance tp x dp x (pp - 1): across nodes here), after the DP sync, on the critical
    path: the step grows by it, and the exposed "pp" class carries it."""
    par = ParallelConfig(gpus=T * 8 * 2, tp=T, pp=8, dp=2, micro_batch=1, sp=True, recompute="selective", zero=1)
    ctx = _ctx(GPT3, par)
    r, before = schedule_step(ctx), schedule_step(_without_copy(ctx))
    nbytes = COPY * 4
    assert r.comm["embedding_grad_allreduce_bytes"] == nbytes
    cl = resolve_cluster("DGX-A100")
    want = float(collective_ms(collective_model(), ["all_reduce"], [nbytes], GroupLayout(2, 1, 2), cl)[0][0])
    assert r.comm["embedding_grad_allreduce_ms"] == pytest.approx(want, rel=1e-12)
    assert 5.0 < want < 30.0  # ~315 MB over one 200 Gb/s NIC per GPU: about 12 ms
    # the tie also makes the first stage's word embedding a shared one, in a gradient bucket of its own under the
    # distributed optimizer (param_and_grad_buffer.py l. 698-721; stop 48): the last bucket, exposed after the
    # backward, is the 78.6M table alone. Untied, the walk closes the bucket before it at the same place: the
    # position embedding, the first layer's attn.c_proj and input norm (registered before c_attn, attention.py
    # l. 349 vs 1267) are 44.1M >= 40M, so the DP time does not move (until the stop 48 review c_proj stayed after
    # c_attn: the 25.2M left open joined the untied table, and the tie saved a little DP)
    dp_delta = r.exposed_comm_split_ms["dp"] - before.exposed_comm_split_ms["dp"]
    assert dp_delta == pytest.approx(0.0, abs=1e-9)
    assert r.step_time_ms - before.step_time_ms == pytest.approx(want + dp_delta, abs=0.01)
    assert r.exposed_comm_split_ms["pp"] - before.exposed_comm_split_ms["pp"] == pytest.approx(want, abs=1e-6)


def test_pp1_is_unchanged_to_the_bit():
    ctx = _ctx(_small(), ParallelConfig(gpus=8, tp=2, pp=1, dp=4, micro_batch=1, zero=1))
    assert ctx.g.meta["tied_output_params"] > 0
    a, b = schedule_step(ctx), schedule_step(_without_copy(ctx))
    assert a.step_time_ms == b.step_time_ms and a.memory_gb == b.memory_gb and a.energy_j == b.energy_j
    assert a.per_device == b.per_device and a.exposed_comm_split_ms == b.exposed_comm_split_ms
    assert not any("embedding_grad" in k for k in a.comm)


def test_untied_head_under_a_pipeline_is_unchanged():
    r = schedule_step(_ctx(_small(False), ParallelConfig(gpus=8, tp=2, pp=2, dp=2, micro_batch=1)))
    assert not any("embedding_grad" in k or "tied" in k for k in r.comm)


def test_interleaved_copy_sits_on_the_last_stages_last_chunk():
    assert tied_copy_params_by_chunk(5.0, pp=4, n_chunks=8).tolist() == [0.0] * 7 + [5.0]
    assert tied_copy_params_by_chunk(5.0, pp=1, n_chunks=1).tolist() == [0.0]
    ctx = _ctx(_small(), ParallelConfig(gpus=8, tp=2, pp=2, dp=2, micro_batch=1, interleave=2), batch=16)
    r, before = schedule_step(ctx), schedule_step(_without_copy(ctx))
    copy = ctx.g.meta["tied_output_params"]
    assert copy == 50432 // 2 * 1024  # 50,257 padded to a multiple of 128 x tp = 256
    assert r.per_device[-1]["params"] - before.per_device[-1]["params"] == copy
    assert r.per_device[0]["params"] == before.per_device[0]["params"]


def test_embedding_group_placement():
    # the whole job on one node: both ends of every pair there (group_layout's g // stride would say 2 nodes for 0 and 6)
    assert embedding_group_layout(2, 1, 1, 4, 8) == GroupLayout(2, 2, 1)
    assert embedding_group_layout(1, 1, 2, 2, 8) == GroupLayout(2, 2, 1)
    # across nodes, with the node's first-stage ranks that send across at once (all 8 of a node; ranks 0-3 of node 0)
    assert embedding_group_layout(8, 1, 8, 16, 8) == GroupLayout(2, 1, 2, 8)
    assert embedding_group_layout(2, 1, 2, 4, 8) == GroupLayout(2, 1, 2, 4)  # pair (3, 15) crosses
    assert embedding_group_layout(8, 1, 8, 1, 8).size == 1


def test_sync_is_a_barrier_between_first_and_last_stage():
    ends, start = tied_grad_sync_ms(np.array([10.0, 12.0, 7.0]), 2.0)
    assert start == 10.0 and ends.tolist() == [12.0, 12.0, 12.0]
    ends, start = tied_grad_sync_ms(np.array([10.0, 30.0, 11.0, 4.0]), 1.5)
    assert start == 10.0 and ends.tolist() == [11.5, 30.0, 11.0, 11.5]


def test_gradient_bytes_per_framework():
    assert tied_grad_bytes("megatron", "bf16") == 4  # fp32 main_grad (--accumulate-allreduce-grads-in-fp32)
    assert tied_grad_bytes("megatron", "fp16") == 2
    assert tied_grad_bytes("megatron-deepspeed", "bf16") == 4  # BF16_Optimizer's _hp_grad
    assert tied_grad_bytes("megatron-deepspeed", "fp16") == 2
    assert tied_grad_bytes("hf", "bf16") == 4


@pytest.mark.parametrize("framework,before_dp", [("megatron", False), ("megatron-deepspeed", True)])
def test_trace_draws_the_all_reduce_in_framework_order(framework, before_dp):
    """Megatron-Core: DP sync, then the embedding all-reduce; DeepSpeed's TrainSchedule: ReduceTiedGrads, then
    ReduceGrads. Drawn on the pp track of the first and the last stage."""
    dtype = "bf16" if framework == "megatron" else "fp16"
    r = schedule_step(_ctx(_small(), ParallelConfig(gpus=16, tp=2, pp=4, dp=2, micro_batch=1), dtype=dtype, trace=True,
                           batch=16, framework=framework))
    ar = [e for e in r.events if e["name"] == "pp.embedding_grad_all_reduce"]
    assert sorted(e["stage"] for e in ar) == [0, 3]
    assert ar[0]["end_ms"] - ar[0]["start_ms"] == pytest.approx(r.comm["embedding_grad_allreduce_ms"])
    # the Chrome trace draws it on each stage's pp track
    chrome = [e for e in distributed_trace_events(r) if e.get("name") == "pp.embedding_grad_all_reduce"]
    assert sorted(e["pid"] for e in chrome) == [0, 3] and {e["tid"] for e in chrome} == {TRACKS["pp"][0]}
    for s in (0, 3):
        mine = next(e for e in ar if e["stage"] == s)
        dp = [e for e in r.events if e["stage"] == s and e["name"].startswith("dp.")]
        assert dp
        if before_dp:
            assert mine["end_ms"] <= min(e["start_ms"] for e in dp) + 1e-9
        else:
            assert mine["start_ms"] >= max(e["end_ms"] for e in dp) - 1e-9


def test_hf_pipeline_of_a_tied_model_pays_the_copy_too():
    """PyTorch has no tied-weight sync of its own across pipeline stages; a tied model trained in a pipeline must hold
    the copy on the last stage and all-reduce its (fp32, AMP) gradient, or it is the untied model."""
    r = schedule_step(_ctx(_small(), ParallelConfig(gpus=8, tp=2, pp=2, dp=2, micro_batch=1), framework="hf"))
    assert r.comm["embedding_grad_allreduce_bytes"] == r.comm["tied_embedding_copy_params"] * 4


@pytest.mark.parametrize("model, vocab, hidden", [("bert_base", 30522, 768), ("switch_base_8", 32128, 768)])
def test_bert_and_t5_tied_heads_under_a_pipeline_pay_the_copy(model, vocab, hidden):
    """BERT's MLM decoder and T5/Switch's LM head are tied to the word embedding too (they paid nothing: a helper's
    review): the last stage holds the copy and all-reduces its gradient with the first."""
    import wattcast

    r = wattcast.predict_cluster(model, "DGX-H100", gpus=4, batch=16, seq=512, pp=2, micro_batch=1)
    assert r.comm["tied_embedding_copy_params"] == vocab * hidden
    assert r.comm["embedding_grad_allreduce_ms"] > 0


def test_zero2_all_reduces_the_whole_tied_gradient():
    """ZeRO-2/3 partition each stage's flat parameters: the two stages' shards of the table do not line up, so the
    whole gradient is all-reduced (it was divided by the DP size)."""
    import wattcast

    kw = dict(gpus=16, batch=16, seq=512, pp=2, micro_batch=1, framework="hf")
    one, two = (wattcast.predict_cluster("gpt2", "DGX-H100", zero=z, **kw) for z in (1, 2))
    assert two.comm["embedding_grad_allreduce_bytes"] == one.comm["embedding_grad_allreduce_bytes"]
