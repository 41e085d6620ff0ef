"""``--tp-comm-overlap`` (Transformer Engine's userbuffers) works within one NVLink domain only (simulate/overlap.py):
a TP group that spans nodes (a cluster spec's node is its NVLink domain: 8 GPUs of a DGX H100, a 72-GPU NVL72 rack)
gets no overlap. Off by default there (with a note), an explicit ``--tp-comm-overlap`` refused naming the flag, a
search's positive flag left at that default; search rows, ``predict --cluster`` and ``predict_cluster`` agree. Until
stop 56 (audit 56c finding 1) the overlap hid 91% of Llama 3 405B's cross-node TP16 traffic on DGX H100 nodes and the
search ranked TP16 within 1% of the best TP8 row."""

from __future__ import annotations

import json

import pytest

import wattcast
from conftest import run_cli
from wattcast.data.cluster_spec import resolve_cluster, using_gpus_per_node
from wattcast.planning.search import candidate_overlaps
from wattcast.simulate.overlap import overlap_defaults
from wattcast.simulate.parallel import ParallelConfig, ParallelConfigError, new_config, resolve_parallel

# gpt3_2.7b: 32 heads, so tp 16 divides them; 16 GPUs of DGX H100 are two 8-GPU nodes
KW = dict(batch=16, seq=2048, micro_batch=1, sp=True, zero=1, attention="flash", framework="megatron")
NOTE = "--tp-comm-overlap is off for this layout"


def _resolve(cluster, gpus: int, tp: int, **kw):
    return resolve_parallel(new_config(gpus=gpus, tp=tp, pp=1, micro_batch=1, sp=True, zero=1, **kw), batch=gpus,
                            n_layers=32, n_heads=32, cluster=cluster, framework="megatron")


def test_the_default_follows_the_tp_groups_nodes():
    assert overlap_defaults("megatron", tp=8, sp=True, zero=1, tp_nodes=1)["tp_comm_overlap"] is True
    assert overlap_defaults("megatron", tp=16, sp=True, zero=1, tp_nodes=2)["tp_comm_overlap"] is False
    dgx = resolve_cluster("DGX-H100")
    assert _resolve(dgx, 16, 8).tp_comm_overlap is True  # one node
    assert _resolve(dgx, 16, 16).tp_comm_overlap is False  # two nodes over InfiniBand
    assert _resolve(dgx, 16, 16, tp_comm_overlap=False).tp_comm_overlap is False  # an explicit off is taken
    # GB200 NVL72: a node is the 72-GPU NVLink domain (the rack). tp 16 on two racks: ranks 64-79 straddle them, so the
    # group runs over the network (parallel.group_layout); 64 of each rack's GPUs keep every group inside one
    nvl = resolve_cluster("GB200-NVL72")
    assert _resolve(nvl, 144, 8).tp_comm_overlap is True
    assert _resolve(nvl, 144, 16).tp_comm_overlap is False
    assert _resolve(using_gpus_per_node(nvl, 64), 128, 16).tp_comm_overlap is True
    # no cluster (layout unknown): the framework's default as before
    assert resolve_parallel(new_config(gpus=16, tp=16, pp=1, micro_batch=1, sp=True, zero=1), batch=16, n_layers=32,
                            framework="megatron").tp_comm_overlap is True


def test_an_explicit_tp_comm_overlap_across_nodes_is_refused_naming_the_flag():
    with pytest.raises(ParallelConfigError, match=r"^--tp-comm-overlap: .*span 2 nodes.*NVLink domain.*--tp 8 or less"):
        _resolve(resolve_cluster("DGX-H100"), 16, 16, tp_comm_overlap=True)
    with pytest.raises(ParallelConfigError, match=r"--tp-comm-overlap: .*--gpus-per-node 64"):
        _resolve(resolve_cluster("GB200-NVL72"), 144, 16, tp_comm_overlap=True)
    with pytest.raises(ParallelConfigError, match="--tp-comm-overlap"):
        wattcast.predict_cluster("gpt3_2.7b", "DGX-H100", gpus=16, tp=16, pp=1, tp_comm_overlap=True, **KW)
    r = run_cli("predict", "--model", "gpt3_2.7b", "--cluster", "DGX-H100", "--gpus", "16", "--batch", "16", "--seq",
                "2048", "--tp", "16", "--pp", "1", "--micro-batch", "1", "--sp", "--zero", "1", "--framework", "megatron",
                "--tp-comm-overlap", "--json")
    assert r.returncode == 2 and "--tp-comm-overlap" in r.stderr and "NVLink domain" in r.stderr, r.stderr


def test_cross_node_tp_pays_its_traffic_and_says_why():
    default = wattcast.predict_cluster("gpt3_2.7b", "DGX-H100", gpus=16, tp=16, pp=1, **KW)
    off = wattcast.predict_cluster("gpt3_2.7b", "DGX-H100", gpus=16, tp=16, pp=1, tp_comm_overlap=False, **KW)
    assert default.parallel.tp_comm_overlap is False
    assert default.step_time_ms == off.step_time_ms  # until stop 56 the default hid most of it
    assert default.exposed_comm_split_ms["tp"] == off.exposed_comm_split_ms["tp"]
    assert any(w.startswith(NOTE) and "span 2 nodes" in w for w in default.meta["warnings"])
    # inside one node: the overlap is on, it shortens the step, no note
    in_node = wattcast.predict_cluster("gpt3_2.7b", "DGX-H100", gpus=16, tp=8, pp=1, **KW)
    in_node_off = wattcast.predict_cluster("gpt3_2.7b", "DGX-H100", gpus=16, tp=8, pp=1, tp_comm_overlap=False, **KW)
    assert in_node.parallel.tp_comm_overlap is True and in_node.step_time_ms < in_node_off.step_time_ms
    assert not any(w.startswith(NOTE) for w in in_node.meta.get("warnings", ()))
    # outside megatron there is no userbuffers overlap to turn off: no note
    hf = wattcast.predict_cluster("gpt3_2.7b", "DGX-H100", gpus=16, tp=16, pp=1, **dict(KW, framework="hf", zero=0))
    assert not any(w.startswith(NOTE) for w in hf.meta.get("warnings", ()))


def test_the_settings_record_says_it_is_off():
    r = run_cli("predict", "--model", "gpt3_2.7b", "--cluster", "DGX-H100", "--gpus", "16", "--seq", "2048",
                "--framework", "megatron", "--strategy", "tp16-pp1-dp1-cp1-ep1-mb1-ga16-zero1-v1-sp-rcnone-1f1b", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["parallel"]["tp_comm_overlap"] is False
    assert d["settings"]["strategy"].endswith("-notpo")
    assert any(w.startswith(NOTE) for w in d["warnings"])
    # (the node's 8 GPUs all send across nodes at once: inter_senders_per_node, the NICs they share)
    assert d["comm"]["layouts"]["tp"] == {"size": 16, "gpus_per_node": 8, "nodes": 2, "inter_senders_per_node": 8}


def test_candidate_overlaps_leaves_cross_node_tp_at_its_default():
    on = {"tp_comm_overlap": True}
    par = ParallelConfig(gpus=32, tp=16, sp=True)
    assert candidate_overlaps(par, on, 8)["tp_comm_overlap"] is None  # two 8-GPU nodes: the default, off
    assert candidate_overlaps(par, on, 16)["tp_comm_overlap"] is True  # one 16-GPU node
    assert candidate_overlaps(par, {"tp_comm_overlap": False}, 8)["tp_comm_overlap"] is False


@pytest.mark.parametrize("overlaps", [None, {"tp_comm_overlap": True}])
def test_search_rows_equal_predict_for_cross_node_tp(overlaps):
    res = wattcast.search("gpt3_2.7b", "DGX-H100", 32, 32, 2048, framework="megatron", tp=(8, 16), pp=(1,),
                          micro_batch=(1,), zero=(1,), sp=(True,), recompute=("none",), interleave=(1,),
                          overlaps=overlaps, workers=1)
    rows = res.ranked
    assert set(rows["tp"]) == {8, 16}, res.rejected  # a positive flag rejects no candidate
    for _, row in rows.iterrows():
        s = row["strategy"]
        assert ("notpo" in s) == (row["tp"] == 16), s  # off beyond the node, and the string says so
        p = wattcast.predict_cluster("gpt3_2.7b", "DGX-H100", seq=2048, framework="megatron", strategy=s)
        assert p.step_time_ms == pytest.approx(row["step_time_ms"], rel=1e-12), s
        assert p.parallel.tp_comm_overlap is (row["tp"] == 8)
        # the string without the token: the same default, the same step
        bare = wattcast.predict_cluster("gpt3_2.7b", "DGX-H100", seq=2048, framework="megatron",
                                        strategy=s.replace("-notpo", ""))
        assert bare.step_time_ms == p.step_time_ms
