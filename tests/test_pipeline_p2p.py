"""How pipeline transfers meet the computation, per framework (simulate/distributed.py ``p2p_blocking``):
Megatron's 1F1B and DeepSpeed's engine block the sender for each transfer (batched send/recv waited on; blocking
sends), Megatron-Core's interleaved schedule overlaps them, and DeepSpeed partitions what it sends over the TP group."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.simulate.parallel import ParallelConfigError

KW = dict(gpus=32, batch=64, seq=2048, tp=1, pp=4, micro_batch=1, dtype="bf16", attention="flash")


def _pp(framework, **kw):
    r = wattcast.predict_cluster("gpt3_2.7b", "DGX-A100", framework=framework, **dict(KW, **kw))
    return r, r.exposed_comm_split_ms["pp"], r.comm["p2p_ms"], r.comm["layouts"]


def test_megatron_1f1b_blocks_the_sender_every_micro_batch_and_hf_only_on_the_dependency():
    r, exposed, p2p, _ = _pp("megatron")
    n_micro = r.meta["n_micro"]
    assert p2p > 0 and n_micro == 8
    # the slowest stage spends its own transfers every micro-batch (forward and backward sends)
    assert exposed > n_micro * p2p
    r_hf, exposed_hf, p2p_hf, _ = _pp("hf")
    assert p2p_hf == pytest.approx(p2p)
    # fill and drain only: 2 (pp - 1) transfers, besides the tied embedding's once-a-step gradient all-reduce between
    # the first and the last stage (also in the "pp" class; tests/test_tied_embedding_pipeline.py)
    tied_ms = r_hf.comm["embedding_grad_allreduce_ms"]
    assert tied_ms > 0
    assert exposed_hf - tied_ms <= 2 * (4 - 1) * p2p * 1.01
    # Megatron-Core's interleaved schedule overlaps its transfers (--overlap-p2p-communication)
    _, exposed_v2, _, _ = _pp("megatron", interleave=2)
    assert exposed_v2 < exposed


def test_deepspeed_partitions_its_transfers_over_tp_and_has_no_interleaving():
    _, _, p2p_ds, _ = _pp("megatron-deepspeed", tp=2, dtype="fp16", attention="eager")
    _, _, p2p_mg, _ = _pp("megatron", tp=2, dtype="fp16", attention="eager")
    assert p2p_ds < p2p_mg  # 1/tp over the link, then an all-gather on NVLink
    with pytest.raises(ParallelConfigError, match="no interleaved schedule"):
        _pp("megatron-deepspeed", interleave=2, dtype="fp16", attention="eager")


def test_megatron_2021_scatter_gather_sends_one_tp_share_and_all_gathers_it():
    """Megatron-LM 2021's --scatter-gather-tensors-in-pipeline (on by default then; SC21 Sec. 4.1): each TP rank sends
    1/tp of the activation across nodes and the receiver all-gathers it over NVLink. Megatron-Core dropped it (the
    megatron default: the whole tensor from every TP rank); DeepSpeed's PartitionedTensor does it by default."""
    from wattcast.simulate.distributed import collective_ms, collective_model
    from wattcast.data.cluster_spec import resolve_cluster

    kw = dict(tp=8, gpus=64, dtype="fp16", attention="eager")
    whole, _, p2p_whole, lay = _pp("megatron", **kw)
    sg, _, p2p_sg, _ = _pp("megatron", scatter_gather_p2p=True, **kw)
    assert whole.meta["scatter_gather_p2p"] is False and sg.meta["scatter_gather_p2p"] is True
    assert sg.to_dict()["parallel"]["scatter_gather_p2p"] is True
    # the send of 1/8 of a (2048 x 2560) fp16 activation across nodes, then its all-gather over the TP group
    act = 1 * 2048 * 2560 * 2
    cl, cm = resolve_cluster("DGX-A100"), collective_model()
    from wattcast.simulate.parallel import GroupLayout

    send = collective_ms(cm, ["send_recv"], [act / 8], GroupLayout(2, 1, 2), cl)[0][0]
    gather = collective_ms(cm, ["all_gather"], [act], GroupLayout(8, 8, 1), cl)[0][0]
    assert p2p_sg == pytest.approx(send + gather, rel=1e-6)
    assert p2p_sg < 0.5 * p2p_whole and sg.step_time_ms < whole.step_time_ms
    # DeepSpeed's default is scatter/gather; turning it off sends the whole tensor like Megatron-Core
    _, _, p2p_ds, _ = _pp("megatron-deepspeed", **kw)
    _, _, p2p_ds_off, _ = _pp("megatron-deepspeed", scatter_gather_p2p=False, **kw)
    assert p2p_ds == pytest.approx(p2p_sg) and p2p_ds_off == pytest.approx(p2p_whole)


def test_scatter_gather_has_nothing_to_scatter_under_sequence_parallelism_or_tp1():
    """With SP the tensor crossing stages is already 1/tp of the sequence (Megatron-LM v3.0 _communicate skips
    scatter/gather under --sequence-parallel); with TP 1 there is nothing to split."""
    kw = dict(tp=8, gpus=64, dtype="bf16", attention="flash", sp=True)
    on, _, p2p_on, _ = _pp("megatron", scatter_gather_p2p=True, **kw)
    off, _, p2p_off, _ = _pp("megatron", **kw)
    assert p2p_on == pytest.approx(p2p_off) and on.meta["scatter_gather_p2p"] is False
    one, _, p2p_one, _ = _pp("megatron", scatter_gather_p2p=True)
    _, _, p2p_one_off, _ = _pp("megatron")
    assert p2p_one == pytest.approx(p2p_one_off) and one.meta["scatter_gather_p2p"] is False
    with pytest.raises(ValueError, match="scatter_gather_p2p"):
        _pp("megatron", scatter_gather_p2p="yes")


def test_search_passes_scatter_gather_to_every_candidate():
    from wattcast.planning.search import search

    kw = dict(dtype="fp16", attention="eager", framework="megatron", tp=(8,), pp=(4,), micro_batch=(1,), zero=(0,),
              sp=(False,), recompute=("full",), interleave=(1,))
    off = search("gpt3_2.7b", "DGX-A100", 64, 64, 2048, **kw).best
    on = search("gpt3_2.7b", "DGX-A100", 64, 64, 2048, scatter_gather_p2p=True, **kw).best
    assert on["step_time_ms"] < off["step_time_ms"]


def test_each_hop_costs_its_own_link():
    """Megatron's order puts stage s on ranks s x (tp cp dp) ..: with 4 ranks a stage on 8-GPU nodes, stages 0-1 share
    node 0 and 2-3 node 1, so only hop 1 -> 2 (and the interleaved wrap 3 -> 0) crosses nodes; the blocked sender
    pays NVLink for the others, not the network."""
    import numpy as np

    import wattcast.simulate.distributed as dist
    from wattcast.simulate.parallel import pp_hop_crosses_nodes

    assert pp_hop_crosses_nodes(2, 1, 2, 4, 8).tolist() == [False, True, False, True]
    assert pp_hop_crosses_nodes(8, 1, 1, 4, 8).all() and not pp_hop_crosses_nodes(1, 1, 1, 4, 8).any()
    assert pp_hop_crosses_nodes(2, 1, 3, 4, 8).all()  # 6 ranks a stage: every stage straddles a node boundary
    kw = dict(gpus=16, tp=2, pp=4, dp=2, batch=32, seq=2048, micro_batch=1, dtype="bf16", attention="flash")
    per_hop = wattcast.predict_cluster("gpt3_2.7b", "DGX-H100", framework="megatron", **kw)
    orig = dist.pp_hop_crosses_nodes
    try:
        dist.pp_hop_crosses_nodes = lambda tp, cp, dp, pp, g: np.ones(pp, dtype=bool)  # every hop across nodes
        all_inter = wattcast.predict_cluster("gpt3_2.7b", "DGX-H100", framework="megatron", **kw)
    finally:
        dist.pp_hop_crosses_nodes = orig
    assert per_hop.comm["p2p_ms"] == all_inter.comm["p2p_ms"]  # the reported (worst) hop
    assert per_hop.exposed_comm_split_ms["pp"] < 0.75 * all_inter.exposed_comm_split_ms["pp"]
    assert per_hop.step_time_ms < all_inter.step_time_ms


def test_overlap_p2p_comm_reported_off_without_interleaving():
    """Megatron-LM forces overlap_p2p_comm off without the interleaved schedule (arguments.py l. 976-978): the
    JSON says what runs, false at --interleave 1 and the default (true) with interleaving."""
    one, _, _, _ = _pp("megatron")
    assert one.parallel.overlap_p2p_comm is False and one.to_dict()["parallel"]["overlap_p2p_comm"] is False
    two, _, _, _ = _pp("megatron", interleave=2)
    assert two.parallel.overlap_p2p_comm is True


def test_non_blocking_edges_cost_their_own_hop():
    """Stop 48: the scheduler's dependency edges (Megatron-Core's interleaved schedule with overlap_p2p_comm, hf's
    1F1B) wait for their own hop's transfer, as the blocking path's senders since stop 47, not the pipeline's worst
    hop: Llama 3 8B, 16 H100, TP2 PP4 DP2 v2 (stages 0-1 on node 0, 2-3 on node 1: hops 0->1 and 2->3 NVLink)."""
    import numpy as np

    import wattcast.simulate.distributed as dist
    from wattcast.simulate import scheduler as sc
    from wattcast.simulate.pipeline_fast import time_pipeline

    f_in, b_in = sc.edge_p2p_ms(np.array([1.0, 2.0, 3.0]), 3, 2)
    assert f_in.tolist() == [3.0, 1.0, 2.0, 3.0, 1.0, 2.0]  # into v from v - 1: hop (v - 1) mod P
    assert b_in.tolist() == [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]  # into v from v + 1: hop v mod P
    rng = np.random.default_rng(48)
    f, b = rng.uniform(1, 2, 8), rng.uniform(2, 4, 8)
    hops = np.array([0.05, 0.9, 0.05, 0.9])
    ref = sc._simulate_events(f, b, n_micro=8, interleave=2, p2p_ms=hops, keep_tasks=False)
    for got in (sc.simulate_pipeline(f, b, n_micro=8, interleave=2, p2p_ms=hops, keep_tasks=False),
                sc.simulate_pipeline(f, b, n_micro=8, interleave=2, p2p_ms=hops, keep_tasks=False, static=True),
                time_pipeline(f, b, n_micro=8, interleave=2, p2p_ms=hops, exact=False)):
        assert np.array_equal(got.stage_end, ref.stage_end)  # the event loop's figures, bit for bit
    lo, hi = (sc.simulate_pipeline(f, b, n_micro=8, interleave=2, p2p_ms=x, keep_tasks=False).stage_end.max()
              for x in (0.05, 0.9))
    assert lo < ref.stage_end.max() < hi
    # a uniform hop array is the scalar
    same = sc.simulate_pipeline(f, b, n_micro=8, interleave=2, p2p_ms=np.full(4, 0.9), keep_tasks=False)
    assert np.array_equal(same.stage_end, sc.simulate_pipeline(f, b, n_micro=8, interleave=2, p2p_ms=0.9,
                                                               keep_tasks=False).stage_end)
    kw = dict(gpus=16, tp=2, pp=4, dp=2, batch=32, seq=8192, micro_batch=1, sp=True)
    for fw, extra in (("megatron", dict(interleave=2, zero=1)), ("hf", {})):
        per_hop = wattcast.predict_cluster("llama3_8b", "DGX-H100", framework=fw, **kw, **extra)
        orig = dist.pp_hop_crosses_nodes
        try:
            dist.pp_hop_crosses_nodes = lambda tp, cp, dp, pp, g: np.ones(pp, dtype=bool)  # every hop across nodes
            dist._COSTED.clear()
            all_inter = wattcast.predict_cluster("llama3_8b", "DGX-H100", framework=fw, **kw, **extra)
        finally:
            dist.pp_hop_crosses_nodes = orig
            dist._COSTED.clear()
        assert per_hop.comm["p2p_ms"] == all_inter.comm["p2p_ms"]  # the reported (worst) hop
        assert per_hop.exposed_comm_split_ms["pp"] < 0.6 * all_inter.exposed_comm_split_ms["pp"], fw
        assert per_hop.step_time_ms < all_inter.step_time_ms


def test_overlap_p2p_default_follows_the_interleave_in_one_place():
    """Stop 48 refactor: overlap_defaults says the p2p overlap is off at interleave 1 (Megatron-LM's arguments.py
    l. 976-979 forces it off there) and on with interleaving, so resolve_parallel and the strategy string's writer
    need no undo of their own; what they give is unchanged."""
    from wattcast.simulate.overlap import overlap_defaults
    from wattcast.simulate.parallel import ParallelConfig, resolve_parallel
    from wattcast.simulate.strategy import format_strategy

    assert overlap_defaults("megatron", tp=1, sp=False, zero=0, interleave=1)["overlap_p2p_comm"] is False
    assert overlap_defaults("megatron", tp=1, sp=False, zero=0, interleave=2)["overlap_p2p_comm"] is True
    assert overlap_defaults("megatron", tp=1, sp=False, zero=0)["overlap_p2p_comm"] is True  # interleave not known
    assert not overlap_defaults("hf", tp=1, sp=False, zero=0, interleave=2)["overlap_p2p_comm"]
    for v in (1, 2):
        cfg = resolve_parallel(ParallelConfig(gpus=8, pp=4, interleave=v), framework="megatron", batch=16,
                               n_layers=8)
        assert cfg.overlap_p2p_comm is (v > 1)
        assert "p2po" not in format_strategy(cfg, framework="megatron")


def test_the_parallel_name_carries_a_turned_off_p2p_overlap():
    """``parallel.name`` was the same with and without --no-overlap-p2p-communication (audit of issue 15: Llama 3 70B
    tp8 pp4 v2, 13,421.8 vs 13,539.3 ms, both ``...-ogr+opg+tpo``) while the strategy string wrote ``-nop2po``: the
    name now ends with the same token; the default (on at interleave > 1, off without it) writes nothing, as before."""
    from wattcast.simulate.distributed import predict_distributed
    from wattcast.simulate.options import DistributedOptions
    from wattcast.simulate.parallel import ParallelConfig

    base = dict(gpus=8, tp=2, pp=2, dp=2, micro_batch=1, interleave=2)
    assert ParallelConfig(**base).describe() == "dp2-tp2-pp2-v2-mb1"
    assert ParallelConfig(**base, overlap_p2p_comm=True).describe() == "dp2-tp2-pp2-v2-mb1"
    assert ParallelConfig(**base, overlap_p2p_comm=False).describe() == "dp2-tp2-pp2-v2-mb1-nop2po"
    assert ParallelConfig(**dict(base, interleave=1), overlap_p2p_comm=False).describe() == "dp2-tp2-pp2-mb1"
    o = DistributedOptions(batch=8, seq=128, framework="megatron")
    on = predict_distributed("gpt2", "dgx-a100", ParallelConfig(**base), o)
    off = predict_distributed("gpt2", "dgx-a100", ParallelConfig(**base, overlap_p2p_comm=False), o)
    assert on.to_dict()["parallel"]["name"] + "-nop2po" == off.to_dict()["parallel"]["name"]
