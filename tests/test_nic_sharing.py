"""Concurrent collectives of several groups on one node share its NICs (models/collectives.py ``concurrent_per_node``,
simulate/parallel.py ``GroupLayout.concurrent``): with fewer NICs than GPUs (DGX-1 V100: 4 for 8; Polaris: 2 for 4;
a PCIe server: 1) the node's GPUs that send across nodes at once split them; a group alone (nccl-tests) does not,
nor does a node with a NIC per GPU (DGX A100 / H100 / B200)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from wattcast.data.cluster_spec import resolve_cluster
from wattcast.models.collectives import alpha_beta, collective_query, load_collective_model
from wattcast.simulate.distributed import collective_ms
from wattcast.simulate.parallel import (GroupLayout, ParallelConfig, embedding_group_layout, group_layout, layouts,
                                        pair_layout_across, pp_senders_per_node)

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
SIZES = 2.0 ** np.arange(20, 33)


def _with_nics(cluster: str, nics: int):
    c = resolve_cluster(cluster)
    return dataclasses.replace(c, inter=dataclasses.replace(c.inter, nics_per_node=nics), name=f"{c.name}-{nics}nic")


def _inter_us(op, size, n, g, cluster, concurrent=None):
    return alpha_beta(collective_query(op, [size], n, g, cluster, concurrent)).inter_wire_us[0]


def test_tp8_dp_allreduce_of_8_concurrent_groups_takes_twice_the_inter_time_on_4_nics():
    """TP8 on 8-GPU nodes: every DP group has one member per node and all 8 of the node's DP groups all-reduce at
    once; DGX-1's 4 NICs give each half a NIC, a copy of the node with 8 NICs a whole one."""
    v100, v100_8 = resolve_cluster("dgx-1-v100"), _with_nics("dgx-1-v100", 8)
    lay = group_layout(8, 8, 8, 64)  # dp 8 at stride tp 8 on 8-GPU nodes
    assert lay == GroupLayout(8, 1, 8, 8)
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        four = _inter_us(op, 2**30, 8, 1, v100, lay.concurrent)
        eight = _inter_us(op, 2**30, 8, 1, v100_8, lay.concurrent)
        assert four == pytest.approx(2 * eight, rel=1e-12)
    cm = load_collective_model()
    t4 = collective_ms(cm, ["all_reduce"], [2**30], lay, v100)[0][0]
    t8 = collective_ms(cm, ["all_reduce"], [2**30], lay, v100_8)[0][0]
    assert t4 == pytest.approx(2 * t8, rel=0.01)  # bandwidth-bound: the latency is < 0.1% of 1 GiB's time


def test_a_single_group_keeps_the_nics_to_itself():
    """nccl-tests runs one group: no concurrency given is the group's own members per node, as before (one member
    per node gets a whole NIC on DGX-1 as on an 8-NIC node; 8 members share the node's 4)."""
    v100, v100_8 = resolve_cluster("dgx-1-v100"), _with_nics("dgx-1-v100", 8)
    m = load_collective_model()
    for op in OPS:
        for n, g in ((8, 1), (16, 8), (32, 4), (2, 1)):
            np.testing.assert_array_equal(m.predict_us(op, SIZES, n, g, v100),
                                          m.predict_us(op, SIZES, n, g, v100, concurrent_per_node=g))
        assert _inter_us(op, 2**30, 8, 1, v100) == _inter_us(op, 2**30, 8, 1, v100_8)
    ar16 = _inter_us("all_reduce", 2**30, 16, 8, v100)
    assert ar16 == pytest.approx(2 * _inter_us("all_reduce", 2**30, 16, 8, v100_8), rel=1e-12)


def test_pipeline_send_of_8_concurrent_flows_on_one_nic_takes_8x_one_flow():
    """TP2 x DP4 stages on 8-GPU nodes: all 8 ranks of a node at a stage boundary send at once; on one NIC each
    transfer gets an eighth of it (a whole one alone)."""
    one_nic = _with_nics("dgx-1-v100", 1)
    k = pp_senders_per_node(2, 1, 4, 4, 8)
    assert k == 8
    pair = pair_layout_across(k)
    assert pair == GroupLayout(2, 1, 2, 8)
    alone = _inter_us("send_recv", 2**26, 2, 1, one_nic)
    assert _inter_us("send_recv", 2**26, 2, 1, one_nic, pair.concurrent) == pytest.approx(8 * alone, rel=1e-12)
    # 8 flows on 4 NICs: 2x; on 8 NICs: a whole NIC each, as one flow alone
    assert _inter_us("send_recv", 2**26, 2, 1, "dgx-1-v100", 8) == pytest.approx(2 * alone, rel=1e-12)
    assert _inter_us("send_recv", 2**26, 2, 1, _with_nics("dgx-1-v100", 8), 8) == pytest.approx(alone, rel=1e-12)
    # a stage smaller than a node: only the last stage's ranks on the node cross (TP2, pp 8: 2); TP8: the node's 8
    assert pp_senders_per_node(2, 1, 1, 8, 8) == 2 and pp_senders_per_node(8, 1, 1, 4, 8) == 8
    assert pair_layout_across(1) == GroupLayout(2, 1, 2)


def test_rail_optimised_nodes_are_unchanged_bit_for_bit():
    """A NIC per GPU (DGX-H100, the collective correction's training cluster, and every at_scale source's): any
    concurrency gives every GPU a whole NIC, so predictions (the learned correction's features included) are identical."""
    m = load_collective_model()
    for op in OPS:
        for n, g in ((16, 8), (16, 1), (32, 4), (80, 8), (2, 1), (8, 8)):
            base = m.predict(op, SIZES, n, g, "DGX-H100")
            for c in range(g, 9):
                p = m.predict(op, SIZES, n, g, "DGX-H100", concurrent_per_node=c)
                np.testing.assert_array_equal(p.us, base.us)
                np.testing.assert_array_equal(p.ood_mask, base.ood_mask)


def test_group_layouts_count_the_nodes_concurrent_senders():
    cfg = ParallelConfig(gpus=64, tp=8, pp=2, dp=4)
    lay = layouts(cfg, resolve_cluster("dgx-1-v100"))
    assert lay["tp"].concurrent is None  # inside a node: no inter-node traffic
    assert lay["dp"] == GroupLayout(4, 1, 4, 8)
    # TP2 DP8 on 8-GPU nodes: each DP group has 4 members per node, the node's 8 ranks in two groups
    assert group_layout(8, 2, 8, 16) == GroupLayout(8, 4, 2, 8)
    # Polaris (4 GPUs): TP4 DP groups have 1 member per node, 4 of them a node
    assert group_layout(4, 4, 4, 16) == GroupLayout(4, 1, 4, 4)
    # the embedding pairs: all first-stage ranks of a node send across at once
    assert embedding_group_layout(8, 1, 8, 16, 8) == GroupLayout(2, 1, 2, 8)
    assert embedding_group_layout(2, 1, 2, 4, 8) == GroupLayout(2, 1, 2, 4)
    assert embedding_group_layout(2, 1, 1, 4, 8) == GroupLayout(2, 2, 1)


def test_bad_concurrency_is_refused_naming_it():
    with pytest.raises(ValueError, match="concurrent_per_node"):
        collective_query("all_reduce", [2**20], 16, 8, "dgx-1-v100", 4)  # fewer than the group's own 8
    with pytest.raises(ValueError, match="concurrent_per_node"):
        collective_query("all_reduce", [2**20], 16, 1, "dgx-1-v100", 9)  # more than the node's GPUs
    with pytest.raises(ValueError, match="concurrent_per_node"):
        collective_query("all_reduce", [2**20], 16, 1, "dgx-1-v100", 2.5)


def test_a_tp8_job_on_dgx1_syncs_its_gradients_slower_than_on_8_nics():
    """End to end: a TP8 x DP4 step on DGX-1 V100 nodes; the 8 DP groups of a node share its 4 NICs. Before, each
    DP member was charged a whole NIC, so the 4-NIC and the 8-NIC node predicted the same step."""
    import wattcast

    kw = dict(gpus=32, batch=32, seq=1024, tp=8, pp=1, micro_batch=1, dtype="fp16", attention="eager",
              framework="megatron")
    r4 = wattcast.predict_cluster("gpt3_xl", "dgx-1-v100", **kw)
    r8 = wattcast.predict_cluster("gpt3_xl", _with_nics("dgx-1-v100", 8), **kw)
    assert r4.comm["layouts"]["dp"]["inter_senders_per_node"] == 8
    assert r4.comm["dp_sync_ms"] == pytest.approx(2 * r8.comm["dp_sync_ms"], rel=0.05)
    assert r4.step_time_ms > r8.step_time_ms
