"""The automatic pipeline split (no --pp-first/last-stage-layers, layers that do not divide the stages) balances the
stages' work with the embedding on the first stage and the output layer with the loss on the last counted at their
cost (parallel.balanced_stage_layers; issue 15). Until stop 51 it counted layers only and gave the one short stage to
the first stage: Llama 3 8B on 3 stages ran [10, 11, 11], the last stage also carrying the 128k-vocabulary head and
the loss (busy 1,678 / 1,840 / 2,239 ms, step 2,678 ms)."""
import pytest

import wattcast
from wattcast.simulate.parallel import ParallelConfigError, balanced_stage_layers, chunk_layers, stage_layers

KW = dict(gpus=6, batch=16, seq=8192, tp=1, pp=3, zero=1, micro_batch=1, framework="megatron", gpus_per_node=6)


def test_cost_balanced_split_rules():
    # a head of 2.4 layers: the short stage goes last, the first stage's near-free embedding beside a full share
    assert balanced_stage_layers(32, 3, (0.02, 2.4)) == [11, 12, 9]
    # no edge cost: the layer-count balance (ties keep stage_layers' split)
    assert balanced_stage_layers(32, 3, (0.0, 0.0)) == stage_layers(32, 3) == [10, 11, 11]
    # Megatron-LM's --account-for-embedding/loss-in-pipeline-split (each one layer): 126 + 2 on 16 stages
    assert balanced_stage_layers(126, 16, (1.0, 1.0)) == [7] + [8] * 14 + [7]
    # Llama 3 405B's head costs ~0.6 of a layer: Meta's 7, 8 x 14, 7 stays (a tie with 8 x 15, 6 goes to it)
    assert balanced_stage_layers(126, 16, (0.01, 0.6)) == [7] + [8] * 14 + [7]
    # a head heavier than a layer moves one more layer off the last stage
    assert balanced_stage_layers(126, 16, (0.01, 1.5)) == [8] * 15 + [6]
    # every stage keeps min_layers (the virtual stages under --interleave)
    assert min(balanced_stage_layers(10, 3, (0.0, 50.0), min_layers=2)) >= 2
    with pytest.raises(ValueError, match="edge_layers"):
        balanced_stage_layers(10, 3, (float("nan"), 1.0))


def test_dividing_and_user_given_splits_never_move():
    heavy = (0.0, 5.0)
    assert chunk_layers(32, 4, edge_layers=heavy) == [8] * 4
    assert chunk_layers(32, 4, 2, edge_layers=heavy) == [4] * 8
    assert chunk_layers(32, 3, first=10, last=11, edge_layers=heavy) == [10, 11, 11]
    assert chunk_layers(32, 3, first=10, edge_layers=heavy) == [10, 11, 11]
    assert chunk_layers(126, 16, 2, first=6, last=8, edge_layers=heavy) == chunk_layers(126, 16, 2, first=6, last=8)
    # DeepSpeed keeps its partitioner
    assert chunk_layers(14, 4, deepspeed=True, edge_layers=heavy) == [4, 3, 4, 3]
    # interleaved: stage totals are the cost-balanced ones, each split over its virtual stages
    c = chunk_layers(32, 3, 2, edge_layers=(0.02, 2.4))
    assert [c[s] + c[3 + s] for s in range(3)] == [11, 12, 9] and c == [5, 6, 5, 6, 6, 4]  # the embedding's and the loss's chunks the fewer
    with pytest.raises(ParallelConfigError, match="fewer than its 4 virtual stages"):
        chunk_layers(14, 4, 4, edge_layers=heavy)


def test_llama3_8b_on_three_stages_puts_the_short_stage_last():
    auto = wattcast.predict_cluster("llama3_8b", "DGX-H100", **KW)
    assert auto.meta["stage_layers"] == [11, 12, 9]
    old = wattcast.predict_cluster("llama3_8b", "DGX-H100", pp_first_stage_layers=10, pp_last_stage_layers=11, **KW)
    assert old.meta["stage_layers"] == [10, 11, 11]  # a user-given split is kept as given
    busy = [d["busy_ms"] for d in auto.per_device]
    old_busy = [d["busy_ms"] for d in old.per_device]
    assert max(busy) < max(old_busy)
    assert auto.step_time_ms < 0.95 * old.step_time_ms  # 2,466 against 2,678 ms at stop 51


def test_evenly_dividing_config_is_unchanged():
    r = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=16, seq=8192, tp=2, pp=4, zero=1,
                                 micro_batch=1, framework="megatron")
    assert r.meta["stage_layers"] == [8] * 4


def test_search_costs_the_same_automatic_split_as_predict():
    res = wattcast.search("llama3_8b", "DGX-H100", 6, 16, 8192, framework="megatron", gpus_per_node=6, tp=(1,),
                          pp=(3,), zero=(1,), micro_batch=(1,), max_configs=50, workers=1)
    rows = res.ranked[res.ranked["strategy"].str.contains("pp3")]
    assert len(rows) > 0
    for _, row in rows.head(3).iterrows():
        p = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=6, batch=16, seq=8192, framework="megatron",
                                     gpus_per_node=6, strategy=row["strategy"])
        assert p.meta["stage_layers"][-1] < p.meta["stage_layers"][0]
        assert p.step_time_ms == pytest.approx(row["step_time_ms"], rel=1e-12)
