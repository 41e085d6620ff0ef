"""Megatron-Core's MoE parallel folding: the experts' ranks (tp, ep, expert-dp, pp) fold over the attention's context-
and data-parallel ranks, so ep divides dp x cp, and the ep group is the ranks next after tp."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.data.cluster_spec import resolve_cluster
from wattcast.simulate.parallel import ParallelConfig, ParallelConfigError, layouts

KW = dict(gpus=64, batch=64, seq=16384, tp=2, pp=4, dp=4, cp=2, sp=True, zero=1, micro_batch=1, framework="megatron")


def test_ep_may_span_context_and_data_parallel_ranks():
    r = wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", ep=8, **KW)  # 8 divides dp x cp = 8, not dp = 4
    assert r.step_time_ms > 0 and r.to_dict()["exposed_comm_split_ms"]["ep"] > 0
    with pytest.raises(ParallelConfigError, match=r"dp x cp|\(2 x 2\)"):  # 8 does not divide dp x cp = 4
        wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", ep=8, **{**KW, "gpus": 32, "dp": 2, "batch": 32})

def test_the_ep_group_is_the_ranks_after_tp():
    lay = layouts(ParallelConfig(gpus=64, tp=2, pp=4, dp=4, cp=2, ep=4), resolve_cluster("DGX-H100"))
    ep = lay["ep"]
    assert ep.size == 4 and ep.nodes == 1  # 2 x 4 = 8 consecutive ranks: one 8-GPU node


def test_megatron_expert_and_tensor_parallelism_need_sequence_parallelism():
    """Megatron-Core asserts --sequence-parallel when expert and tensor parallelism are combined (its dispatcher
    sends the sequence shards); other frameworks' MoE layers are not held to it."""
    kw = dict(gpus=8, batch=8, seq=1024, tp=2, ep=4, micro_batch=1, framework="megatron")
    with pytest.raises(ParallelConfigError, match=r"needs sequence parallelism then \(--sp\)"):
        wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", **kw)
    assert wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", sp=True, **kw).parallel.sp


def test_distributed_optimizer_gathers_expert_parameters_over_the_expert_dp_group():
    """ZeRO-1's parameter all-gather after the step: dense parameters over the DP group, expert parameters over the
    expert-DP group that shards them (Megatron-Core keeps them in their own buffers); it was all over the DP group."""
    from wattcast.simulate.distributed import collective_ms, collective_model
    from wattcast.simulate.parallel import group_layout

    r = wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", gpus=32, batch=32, seq=1024, ep=8, micro_batch=1, zero=1,
                                 framework="megatron", overlap_param_gather=False)
    cl = resolve_cluster("DGX-H100")
    assert r.comm["layouts"]["dp"]["size"] == 32
    # the rank's expert parameters: 32 layers x (8 experts / ep 8) x 3 x 4096 x 14336; the rest is dense
    ex = 32 * 1 * 3 * 4096 * 14336
    total = r.per_device[0]["params"]
    dp_l = group_layout(32, 1, cl.gpus_per_node)
    edp = group_layout(4, 8, cl.gpus_per_node)
    cm = collective_model()
    want = (collective_ms(cm, ["all_gather"], [(total - ex) * 2], dp_l, cl)[0][0]
            + collective_ms(cm, ["all_gather"], [ex * 2], edp, cl)[0][0])
    assert r.comm["dp_param_gather_ms"] == pytest.approx(want, rel=1e-6)


def test_megatron_dispatcher_sorts_received_rows_by_local_expert_and_grouped_gemm_needs_no_cat():
    """Megatron-Core's all-to-all dispatcher re-sorts the rows it receives by local expert before the grouped GEMM
    and back before the combine (sort_chunks_by_idxs, with more than one local expert and ep > 1); the grouped GEMM
    writes its input gradient into one buffer (no split-cat of the experts' slices)."""
    from wattcast.featurize.workload import StepOptions, step_graph

    def names(ep, tp):
        g = step_graph("mixtral_8x7b", StepOptions(batch=1, seq=1024, dtype="bf16", attention="flash", tp=tp, sp=tp > 1,
                                                   ep=ep, framework="megatron", blocks=1))
        n = g.nodes
        return set(n.loc[n["layer"] == 0, "name"])

    two = names(2, 2)
    assert {"moe.sort_chunks", "moe.unsort_chunks", "moe.sort_chunks.grad", "moe.unsort_chunks.grad"} <= two
    assert not any(x.startswith("moe.") and x.endswith("grad_split_cat") for x in two)
    eight = names(8, 1)  # one local expert: nothing to sort
    assert not any("sort_chunks" in x for x in eight)
    assert not any(x.startswith("moe.") and x.endswith("grad_split_cat") for x in names(1, 1))
