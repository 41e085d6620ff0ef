"""A search row's ``cluster`` under ``gpus_per_node`` ("DGX-H100 (4 of 8 GPUs per node)") is a cluster name
``predict_cluster`` and ``resolve_cluster`` take: the row's cluster and strategy give its figures (it was refused as an
unknown cluster)."""

import pytest

import wattcast
from wattcast.data.cluster_spec import ClusterSpecError, resolve_cluster, using_gpus_per_node


def test_the_partial_node_name_resolves_to_the_same_cluster():
    c = using_gpus_per_node(resolve_cluster("dgx-h100"), 4)
    assert c.name == "DGX-H100 (4 of 8 GPUs per node)"
    assert resolve_cluster(c.name) == c


def test_a_search_row_round_trips_through_predict_cluster():
    res = wattcast.search("gpt2", "dgx-h100", 8, 16, 1024, gpus_per_node=4, workers=1, tp=(2,), pp=(1,),
                          zero=(0,), sp=(False,), recompute=("none",), interleave=(1,), micro_batch=(4,))
    row = res.ranked.iloc[0]
    assert row.cluster == "DGX-H100 (4 of 8 GPUs per node)"
    r = wattcast.predict_cluster("gpt2", row.cluster, strategy=row.strategy, seq=1024)
    assert r.step_time_ms == pytest.approx(row.step_time_ms, rel=1e-9)


def test_a_partial_node_name_with_the_wrong_node_size_is_refused():
    with pytest.raises(ClusterSpecError, match="nodes have 8 GPUs, not 16"):
        resolve_cluster("DGX-H100 (4 of 16 GPUs per node)")
