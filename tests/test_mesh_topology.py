"""The in-node tier's topology (``intra.topology``: switch | full_mesh): on a full mesh a group of g of a node's G GPUs
reaches only its peers' links, (g-1)/(G-1) of the per-GPU bandwidth, and a point-to-point transfer one link, 1/(G-1)."""

from __future__ import annotations

import dataclasses

import pytest

from wattcast.data.cluster_spec import (ClusterSpecError, cluster_from_dict, from_astra_network, resolve_cluster,
                                        using_gpus_per_node)
from wattcast.models.collectives import alpha_beta, bus_factor, collective_query, load_collective_model

from conftest import preset_cluster

MB64 = 64 * 2**20


def _ab(op, size, n, g, cluster):
    return alpha_beta(collective_query(op, [float(size)], n, g, cluster))


def _as_switch(c):
    return dataclasses.replace(c, intra=dataclasses.replace(c.intra, topology="switch"))


def test_mi300x_preset_is_a_full_mesh_and_a_pair_shares_one_link():
    """MI300X platform: 7 xGMI links x 64 GB/s each way, one per peer (AMD platform data sheet). A TP2 all-gather of
    64 MiB moves S/2 per GPU over the pair's one link: >= 33.5 MB / 64 GB/s = 0.52 ms (the old model: 0.08 ms)."""
    c = resolve_cluster("mi300x-8gpu")
    assert c.intra.topology == "full_mesh"
    link_gb_per_s = c.intra.bandwidth_gb_per_s / (c.gpus_per_node - 1)
    assert link_gb_per_s == pytest.approx(64.0)
    for g, links in ((2, 1), (4, 3), (8, 7)):
        ab = _ab("all_gather", MB64, g, g, c)
        wire_us = bus_factor("all_gather", g) * MB64 / (links * link_gb_per_s * 1e3)
        assert float(ab.intra_wire_us[0]) == pytest.approx(wire_us, rel=1e-9)
    pred = load_collective_model().predict("all_gather", [float(MB64)], 2, 2, "mi300x-8gpu")
    assert float(pred.us[0]) >= MB64 / 2 / (link_gb_per_s * 1e3)


def test_pair_on_a_mesh_takes_g_minus_1_times_the_switch_time_at_the_same_per_gpu_bandwidth():
    mesh = resolve_cluster("mi300x-8gpu")
    switch = _as_switch(mesh)
    for op in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all"):
        for g, ratio in ((2, 7.0), (4, 7.0 / 3.0), (8, 1.0)):
            wm = float(_ab(op, MB64, g, g, mesh).intra_wire_us[0])
            ws = float(_ab(op, MB64, g, g, switch).intra_wire_us[0])
            assert wm == pytest.approx(ratio * ws, rel=1e-9), (op, g)


def test_point_to_point_on_a_mesh_uses_one_link_whatever_the_group():
    c = resolve_cluster("mi300x-8gpu")
    link_b_per_us = c.intra.bandwidth_gb_per_s / (c.gpus_per_node - 1) * 1e3
    for n in (2, 4, 8):
        ab = _ab("send_recv", MB64, n, n, c)
        assert float(ab.intra_wire_us[0]) == pytest.approx(MB64 / link_b_per_us, rel=1e-9)
    # across nodes the same-node pairs of a 16-GPU ring use one link too (and the cross-node pair one NIC)
    ab = _ab("send_recv", MB64, 16, 8, c)
    assert float(ab.intra_wire_us[0]) == pytest.approx(MB64 / link_b_per_us, rel=1e-9)


def test_nvswitch_cluster_is_unchanged_any_group_gets_the_whole_bandwidth():
    c = resolve_cluster("dgx-h100")
    assert c.intra.topology == "switch"
    bw = c.intra.bandwidth_gb_per_s * 1e3
    for g in (2, 4, 8):
        ab = _ab("all_gather", MB64, g, g, c)
        assert float(ab.intra_wire_us[0]) == pytest.approx(bus_factor("all_gather", g) * MB64 / bw, rel=1e-12)
        assert float(_ab("send_recv", MB64, g, g, c).intra_wire_us[0]) == pytest.approx(MB64 / bw, rel=1e-12)


def test_four_gpu_nvlink_presets_are_meshes_so_pipeline_p2p_gets_one_pair_of_links():
    """HGX A100 4-GPU (NVLink-4GPU, Polaris): no NVSwitch, 4 NVLink3 links per pair = 100 GB/s each way."""
    for name in ("nvlink-4gpu", "polaris"):
        c = resolve_cluster(name)
        assert c.intra.topology == "full_mesh"
        ab = _ab("send_recv", MB64, 2, 2, c)
        assert float(ab.intra_wire_us[0]) == pytest.approx(MB64 / 100e3, rel=1e-9)
        # the whole node's collective is as before (every link busy)
        full = _ab("all_reduce", MB64, 4, 4, c)
        assert float(full.intra_wire_us[0]) == pytest.approx(
            float(_ab("all_reduce", MB64, 4, 4, _as_switch(c)).intra_wire_us[0]), rel=1e-12)


def test_topology_defaults_by_kind_and_old_files_load_unchanged():
    d = preset_cluster("mi300x-8gpu")
    del d["intra"]["topology"], d["sources"]["intra.topology"]
    assert cluster_from_dict(d).intra.topology == "full_mesh"  # xgmi on an 8-GPU MI300X platform
    assert cluster_from_dict({**d, "device": "MI250X"}).intra.topology == "switch"  # not an MI300X-class platform
    h = preset_cluster("dgx-h100")
    assert "topology" not in h["intra"] and cluster_from_dict(h).intra.topology == "switch"
    for name in ("dgx-1-v100", "pcie-4gpu", "dgx-a100"):  # not full meshes (DGX-1: hybrid cube-mesh): as before
        assert resolve_cluster(name).intra.topology == "switch"
    bad = preset_cluster("dgx-h100")
    bad["intra"]["topology"] = "torus"
    with pytest.raises(ClusterSpecError, match="intra.topology.*switch, full_mesh"):
        cluster_from_dict(bad)


def test_mesh_node_partly_used_keeps_only_the_links_between_used_gpus():
    c = resolve_cluster("mi300x-8gpu")
    half = using_gpus_per_node(c, 4)
    assert half.intra.topology == "full_mesh" and half.intra.bandwidth_gb_per_s == pytest.approx(3 * 64.0)
    for op, g in (("all_gather", 2), ("all_gather", 4), ("send_recv", 2)):
        assert float(_ab(op, MB64, g, g, half).us[0]) == pytest.approx(float(_ab(op, MB64, g, g, c).us[0]), rel=1e-9)


def test_astra_fully_connected_is_a_mesh_of_per_link_bandwidth():
    """ASTRA-sim's bandwidth is per link: FullyConnected 8 NPUs at 64 GB/s = 7 links per NPU, a pair shares one."""
    c = from_astra_network({"topology": ["FullyConnected"], "npus_count": [8], "bandwidth": [64.0], "latency": [1000.0]},
                           device="MI300X")
    assert c.intra.topology == "full_mesh" and c.intra.bandwidth_gb_per_s == pytest.approx(448.0)
    assert float(_ab("send_recv", MB64, 2, 2, c).intra_wire_us[0]) == pytest.approx(MB64 / 64e3, rel=1e-9)
    s = from_astra_network({"topology": ["Switch"], "npus_count": [8], "bandwidth": [450.0], "latency": [1000.0]},
                           device="H100-SXM5-80GB")
    assert s.intra.topology == "switch" and s.intra.bandwidth_gb_per_s == 450.0


def test_learned_correction_is_not_applied_to_a_mesh_with_switch_link_figures():
    """The correction was fitted on a switch fabric (DGX-H100): the same link figures as a full mesh are out of support."""
    m = load_collective_model()
    if m.is_fallback:
        pytest.skip("no shipped collective correction")
    h = resolve_cluster("dgx-h100")
    mesh = dataclasses.replace(h, intra=dataclasses.replace(h.intra, kind="nvlink", topology="full_mesh"))
    assert not m.predict("all_gather", [float(MB64)], 8, 8, h).ood[0]
    p = m.predict("all_gather", [float(MB64)], 8, 8, mesh)
    assert "cluster" in p.ood_reason[0] and float(p.us[0]) == pytest.approx(float(p.alpha_beta_us[0]))


def test_tp2_step_on_a_mesh_is_slower_than_on_a_switch_with_the_same_bandwidth():
    """End to end: the TP2 collectives of a step on MI300X pay the pair's one link."""
    import wattcast

    cfg = {"model_type": "gpt2", "n_embd": 2048, "n_head": 16, "n_layer": 4, "n_positions": 2048, "vocab_size": 1000}
    mesh = resolve_cluster("mi300x-8gpu")
    kw = dict(gpus=8, batch=8, seq=2048, tp=2, micro_batch=1, framework="megatron")
    t_mesh = wattcast.predict_cluster(cfg, mesh, **kw)
    t_switch = wattcast.predict_cluster(cfg, _as_switch(mesh), **kw)
    assert t_mesh.exposed_comm_ms > 2.0 * t_switch.exposed_comm_ms
    assert t_mesh.step_time_ms > t_switch.step_time_ms


# ------------------------------------------------------------------ groups that do not tile the nodes
def test_a_group_across_two_racks_is_costed_on_its_worst_members():
    """All groups of a kind reduce at once and the step waits for the slowest: ep 16 on 144 GPUs of 72-GPU NVL72
    racks has one group (ranks 64-79) with 8 GPUs on each rack; tp 6 on 8-GPU nodes has groups with 2 on one node.
    They were costed as the first group, inside one node (search ranked the ep16 first, its all-to-all on NVLink)."""
    from wattcast.simulate.parallel import ParallelConfig, group_layout, layouts, worst_members_per_node
    from wattcast.data.cluster_spec import resolve_cluster

    assert worst_members_per_node(16, 1, 72, 144) == 8
    assert worst_members_per_node(16, 1, 72, 64) == 16  # 64 GPUs of one rack: the group fits
    assert worst_members_per_node(6, 1, 8, 48) == 2
    g = group_layout(16, 1, 72, 144)
    assert (g.size, g.gpus_per_node, g.nodes) == (16, 8, 2)
    lay = layouts(ParallelConfig(gpus=144, tp=1, dp=144, ep=16), resolve_cluster("gb200-nvl72"))
    assert (lay["ep"].gpus_per_node, lay["ep"].nodes) == (8, 2)
    # every power-of-two layout on 8-GPU nodes is as before: members per node g // stride
    for size in (2, 4, 8, 16, 64):
        for stride in (1, 2, 4, 8, 16):
            want = 1 if stride >= 8 else min(size, 8 // stride)
            assert worst_members_per_node(size, stride, 8, size * stride * 4) == want


def test_search_does_not_rank_a_group_split_across_racks_first():
    import wattcast

    res = wattcast.search("qwen3_30b_a3b", "GB200-NVL72", 144, 288, 4096, framework="megatron", tp=(1,), pp=(1,),
                          ep=(8, 16), micro_batch=(2,), zero=(1,), recompute=("none",), interleave=(1,))
    r = res.ranked
    assert r.iloc[0]["strategy"].split("-")[4] == "ep8"
    ep16 = r[r["strategy"].str.contains("-ep16-")]
    assert len(ep16) and (ep16["step_time_ms"] > 1.5 * r.iloc[0]["step_time_ms"]).all()
