"""Bad input to strategy search and cluster predictions, and steps of very many micro-batches: a clear
ValueError (or ParallelConfigError / GraphError) naming the parameter and the value, never an unrelated
TypeError / KeyError / ZeroDivisionError / OverflowError, and never a hang or a step whose cost grows with the
number of micro-batches."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

import wattcast
from wattcast.featurize.op_graph import GraphError
from wattcast.simulate import scheduler
from wattcast.simulate.parallel import ParallelConfigError
from wattcast.simulate.scheduler import simulate_pipeline
from wattcast.planning.search import COLUMNS, REJECTED_COLUMNS, RUN_COLUMNS, SPACE_DEFAULTS

NAN, INF = float("nan"), float("inf")
MODEL, CLUSTER = "gpt2_medium", "DGX-A100"


def _search(**kw):
    args = dict(gpus=4, batch=8, seq=512, max_configs=3)
    args.update(kw)
    return wattcast.search("gpt2", "nvlink-4gpu", **args)


def _cluster(**kw):
    args = dict(gpus=8, batch=16, seq=512, tp=2, pp=2)
    args.update(kw)
    return wattcast.predict_cluster(MODEL, CLUSTER, **args)


# ------------------------------------------------------------------------ search: nothing evaluated
@pytest.mark.parametrize("tokens", [None, 1e9])
def test_search_with_nothing_evaluated_has_no_best_and_the_usual_columns(tokens):
    res = _search(tp=[3], tokens=tokens)  # 3 divides no 4-GPU job: no candidate at all
    assert res.best is None
    assert res.ranked.empty and res.pareto.empty
    want = list(COLUMNS + (RUN_COLUMNS if tokens else ()))
    assert list(res.ranked.columns) == want and list(res.pareto.columns) == want
    assert list(res.rejected.columns) == list(REJECTED_COLUMNS)


def test_search_where_every_strategy_breaks_a_rule_has_no_best():
    res = _search(gpus=8, batch=16, micro_batch=[3])  # no micro-batch of 3 divides a replica's batch
    assert res.best is None and res.ranked.empty
    assert list(res.ranked.columns) == list(COLUMNS)
    assert len(res.rejected) and list(res.rejected.columns) == list(REJECTED_COLUMNS)


def test_search_where_nothing_fits_has_an_empty_pareto_front_with_columns():
    res = wattcast.search("llama2_70b" if "llama2_70b" in wattcast.builtin_models() else "gpt2_xl", "nvlink-4gpu",
                          gpus=1, batch=1024, seq=1024, max_configs=1, zero=[0], recompute=["none"], micro_batch=[16])
    if res.ranked["fits"].any():  # pragma: no cover - every candidate here is far beyond one GPU's memory
        pytest.skip("a configuration fits")
    assert res.best is None
    assert res.pareto.empty and list(res.pareto.columns) == list(res.ranked.columns)


# ------------------------------------------------------------------------ search: counts
@pytest.mark.parametrize("name,value", [
    ("gpus", 2.5), ("batch", 16.5), ("gpus", "8"), ("seq", "512"), ("seq", INF), ("max_configs", None),
    ("gpus", NAN), ("gpus", True), ("batch", np.float64(8.0)), ("seq", 0), ("max_configs", -1), ("batch", None),
])
def test_search_counts_must_be_positive_integers(name, value):
    with pytest.raises(ValueError, match=rf"^{name} must be (a positive integer|at least 1)"):
        _search(**{name: value})


def test_search_refuses_zero_gpus_as_before():
    with pytest.raises(ValueError, match="gpus must be at least 1, got 0"):
        wattcast.search("gpt2", "DGX-H100", 0, 8, 1024)


def test_search_takes_numpy_integers():
    ref = _search()
    res = _search(gpus=np.int64(4), batch=np.int32(8), seq=np.int64(512), max_configs=np.int64(3))
    assert res.ranked["step_time_ms"].tolist() == ref.ranked["step_time_ms"].tolist()


def test_search_refuses_a_step_beyond_int64_tokens():
    with pytest.raises(ValueError, match="batch x seq"):
        _search(batch=2**62, seq=512)


# ------------------------------------------------------------------------ search: the search space
def test_search_space_takes_a_single_value_as_one_choice():
    one = _search(tp=2, pp=1, zero=0, sp=True, recompute="full", interleave=1, max_configs=50)
    listed = _search(tp=[2], pp=[1], zero=[0], sp=[True], recompute=["full"], interleave=[1], max_configs=50)
    assert len(one.ranked) >= 1
    assert one.ranked.equals(listed.ranked)
    assert set(one.ranked["tp"]) == {2} and set(one.ranked["recompute"]) == {"full"} and set(one.ranked["sp"]) == {True}


def test_search_space_takes_arrays_and_iterables():
    ref = _search(tp=[1, 2], pp=[1], max_configs=50)
    for tp in (np.array([1, 2]), (t for t in (1, 2)), range(1, 3), [np.int64(1), 2, 2]):
        assert _search(tp=tp, pp=np.int64(1), max_configs=50).ranked.equals(ref.ranked)


def test_search_space_none_keeps_the_default():
    ref = _search(max_configs=50)
    assert _search(recompute=None, zero=None, tp=None, max_configs=50).ranked.equals(ref.ranked)


@pytest.mark.parametrize("name,value", [
    ("tp", [0]), ("tp", 0), ("pp", [-2]), ("micro_batch", [2.5]), ("interleave", [True]), ("ep", ["2"]),
    ("zero", [5]), ("zero", [True]), ("sp", ["yes"]), ("recompute", ["some"]), ("tp", []),
])
def test_search_space_choices_are_checked(name, value):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        _search(**{name: value})


def test_search_space_unknown_option_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown search-space option 'foo'.*" + ".*".join(SPACE_DEFAULTS)):
        _search(foo=[1])


def test_search_footprint_kw_unknown_key_is_named_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown footprint_kw option 'bogus'.*region.*pue"):
        _search(tokens=1e9, footprint_kw=dict(bogus=1))
    with pytest.raises(ValueError, match="footprint_kw must be a dict"):
        _search(tokens=1e9, footprint_kw=[("region", "FR")])


def test_search_footprint_kw_valid_keys_still_work():
    res = _search(tokens=1e9, footprint_kw=dict(pue=1.2))
    assert res.best is not None and res.best["run_hours"] > 0


# ------------------------------------------------------------------------ predict_cluster: framework and seq
def test_framework_name_is_case_insensitive():
    upper, lower = _cluster(framework="Megatron"), _cluster(framework="megatron")
    assert upper.step_time_ms == lower.step_time_ms and upper.energy_j == lower.energy_j


def test_framework_is_normalised_before_its_rules():
    # Megatron-DeepSpeed's pipeline engine runs ZeRO-1 at most: the rule must see the framework however spelled
    with pytest.raises(ParallelConfigError, match="megatron-deepspeed runs pipelines with ZeRO stage 1"):
        _cluster(framework="Megatron-DeepSpeed", zero=2)


@pytest.mark.parametrize("fw", ["nope", None, 3])
def test_unknown_framework_is_named(fw):
    with pytest.raises(GraphError, match="unknown framework"):
        _cluster(framework=fw)


@pytest.mark.parametrize("seq", ["512", INF, NAN, 512.5, 0, -8, True])
def test_cluster_seq_must_be_a_positive_integer(seq):
    with pytest.raises(ParallelConfigError, match=r"--seq .*must be a positive integer"):
        _cluster(seq=seq)


def test_cluster_seq_none_is_the_default():
    """seq=None is predict_cluster's default since stop 54 (1,024, or an ONNX file's own dims: audit 54e #3), as
    leaving --seq out is; it was refused as not a positive integer."""
    assert _cluster(seq=None).step_time_ms == pytest.approx(_cluster(seq=1024).step_time_ms, rel=1e-12)


@pytest.mark.parametrize("seq", ["512", 512.5])
def test_cluster_seq_is_checked_before_sequence_parallel_rules(seq):
    with pytest.raises(ParallelConfigError, match="--seq"):
        _cluster(seq=seq, sp=True)


def test_cluster_seq_takes_numpy_integers():
    assert _cluster(seq=np.int64(512)).step_time_ms == _cluster(seq=512).step_time_ms


def test_cluster_step_beyond_int64_tokens_is_refused():
    with pytest.raises(ParallelConfigError, match="batch x seq"):
        _cluster(batch=10**17)
    with pytest.raises(ParallelConfigError, match="batch x seq"):
        _cluster(batch=np.int64(2**62))  # no silent int64 wrap-around


def test_cluster_micro_batch_beyond_the_costed_tokens_is_refused():
    # without pipeline parallelism a replica's whole batch is one micro-batch
    with pytest.raises(ParallelConfigError, match=r"micro-batch x seq .*--micro-batch"):
        _cluster(batch=2**40, tp=1, pp=1)


# ------------------------------------------------------------------------ many micro-batches
def test_huge_batch_costs_what_a_bounded_schedule_costs():
    t0 = time.perf_counter()
    r = _cluster(batch=10**15)  # 5e14 micro-batches: simulating them one by one never ends
    took = time.perf_counter() - t0
    assert took < 20, took
    ex = r.meta["schedule_extrapolated"]
    assert r.meta["n_micro"] == 5 * 10**14 and ex["simulated_micro"] == scheduler.MAX_EXACT_MICRO
    for v in (r.step_time_ms, r.energy_j, r.exposed_comm_ms, r.bubble_ms, r.mfu, r.memory_gb):
        assert math.isfinite(v) and v >= 0
    assert r.step_time_ms == pytest.approx(r.meta["n_micro"] * ex["period_ms"], rel=1e-6)
    # activations in flight do not grow with 1F1B micro-batches: the same memory as a small batch
    assert r.memory_gb == pytest.approx(_cluster(batch=64).memory_gb, rel=1e-12)


def test_steps_up_to_the_limit_are_simulated_exactly(monkeypatch):
    cfg = dict(gpus=8, batch=4096, seq=512, tp=1, pp=4, interleave=2, zero=1, trace=True)
    ref = _cluster(**cfg)  # 512 micro-batches
    assert "schedule_extrapolated" not in ref.meta and "trace_truncated" not in ref.meta
    monkeypatch.setattr(scheduler, "MAX_EXACT_MICRO", 10**9)
    same = _cluster(**cfg)
    assert same.to_dict() == ref.to_dict() and same.events == ref.events


CONFIGS = [
    dict(gpus=8, batch=8192, seq=512, tp=2, pp=2),
    dict(gpus=8, batch=8192, seq=512, tp=2, pp=2, schedule="gpipe"),
    dict(gpus=8, batch=4096, seq=512, tp=1, pp=4, interleave=2, zero=1),
    dict(gpus=8, batch=8192, seq=512, tp=1, pp=4, zero=3, micro_batch=1),
    dict(gpus=8, batch=16384, seq=512, tp=1, pp=2, zero=1, micro_batch=1, framework="megatron"),
    dict(gpus=8, batch=16384, seq=512, tp=1, pp=2, zero=2, micro_batch=1),
    dict(gpus=16, batch=8192, seq=512, tp=2, pp=4, interleave=3, zero=1, framework="megatron"),
    dict(gpus=16, batch=8192, seq=512, tp=2, pp=4, zero=1, framework="megatron-deepspeed"),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items() if k not in ("seq", "gpus")))
def test_extrapolated_step_matches_the_exact_simulation(monkeypatch, cfg):
    exact = _cluster(**cfg)  # 2,048 to 8,192 micro-batches: simulated task by task
    assert "schedule_extrapolated" not in exact.meta
    monkeypatch.setattr(scheduler, "MAX_EXACT_MICRO", 512)
    approx = _cluster(**cfg)
    assert approx.meta["schedule_extrapolated"]["simulated_micro"] <= 512
    for k in ("step_time_ms", "energy_j", "avg_power_w", "mfu", "memory_gb", "optimizer_ms"):
        assert getattr(approx, k) == pytest.approx(getattr(exact, k), rel=1e-3), k
    scale = exact.step_time_ms
    for k in ("bubble_ms", "exposed_comm_ms"):
        assert getattr(approx, k) == pytest.approx(getattr(exact, k), rel=1e-3, abs=1e-6 * scale), k
    for a, e in zip(approx.per_device, exact.per_device):
        for k in ("busy_ms", "finish_ms", "energy_j", "memory_gb", "activations_gb"):
            assert a[k] == pytest.approx(e[k], rel=1e-3), k


def test_extrapolated_trace_is_marked_and_ends_with_the_step(monkeypatch):
    cfg = dict(gpus=8, batch=2048, seq=512, tp=1, pp=4, interleave=2, trace=True)
    exact = _cluster(**cfg)
    monkeypatch.setattr(scheduler, "MAX_EXACT_MICRO", 64)
    r = _cluster(**cfg)
    assert "trace_truncated" in r.meta
    gaps = [e for e in r.events if e["name"].startswith("[")]
    assert len(gaps) == 4 and all("not drawn" in e["name"] for e in gaps)
    tasks = [e for e in r.events if e["stream"] == "compute" and e["name"][0] in "FB"]
    assert len(tasks) < len(exact.events) / 4
    assert max(e["end_ms"] for e in r.events) == pytest.approx(r.step_time_ms, rel=1e-9)
    # every drawn task is a task of the whole step, at (about) its time in the exact simulation
    at = {(e["stage"], e["name"]): e["start_ms"] for e in exact.events if e["stream"] == "compute"}
    for e in tasks:
        assert e["start_ms"] == pytest.approx(at[(e["stage"], e["name"])], rel=1e-3, abs=1e-6 * r.step_time_ms)


# ------------------------------------------------------------------------ the scheduler itself
def _random_pipelines(n: int):
    rng = np.random.default_rng(0)
    for _ in range(n):
        P = int(rng.choice([2, 3, 4, 8]))
        V = int(rng.choice([1, 1, 2, 3]))
        kind = "gpipe" if V == 1 and rng.random() < 0.3 else "1f1b"
        f = rng.uniform(0.5, 2.0, P * V)
        yield P, V, kind, f, f * rng.uniform(1.5, 2.5, P * V), float(rng.choice([0.0, 0.05, 0.5]))


@pytest.mark.parametrize("case", list(_random_pipelines(24)), ids=lambda c: f"P{c[0]}-V{c[1]}-{c[2]}-p2p{c[5]}")
def test_scheduler_extrapolation_matches_exact(case):
    P, V, kind, f, b, p2p = case
    q = P if V > 1 else 1
    n = 4096 // q * q
    exact = simulate_pipeline(f, b, n_micro=n, interleave=V, kind=kind, p2p_ms=p2p, max_exact_micro=n)
    approx = simulate_pipeline(f, b, n_micro=n, interleave=V, kind=kind, p2p_ms=p2p, max_exact_micro=512)
    assert not exact.extrapolated and approx.extrapolated and approx.simulated_micro <= 512
    np.testing.assert_allclose(approx.stage_end, exact.stage_end, rtol=1e-3)
    np.testing.assert_allclose(approx.stage_busy, exact.stage_busy, rtol=1e-9)
    np.testing.assert_allclose(np.array(approx.last_backward), np.array(exact.last_backward), rtol=1e-3)
    np.testing.assert_allclose(approx.last_backward_by_chunk, exact.last_backward_by_chunk, rtol=1e-3)
    np.testing.assert_array_equal(approx.first_forward_by_chunk, exact.first_forward_by_chunk)  # the head is exact
    # the drawn tasks: each a distinct task of the whole step near its exact time, in order on its stage
    at = {(t.kind, t.micro, t.chunk, t.stage): t.start for t in exact.tasks}
    keys = [(t.kind, t.micro, t.chunk, t.stage) for t in approx.tasks]
    assert len(set(keys)) == len(keys)
    span = float(exact.stage_end.max())
    for t, k in zip(approx.tasks, keys):
        assert abs(t.start - at[k]) <= 1e-3 * span
    drawn = np.bincount([t.stage for t in approx.tasks], minlength=P)
    assert sorted(g[0] for g in approx.trace_gaps) == list(range(P))
    assert all(g[3] + drawn[g[0]] == 2 * V * n for g in approx.trace_gaps)


def test_scheduler_below_the_limit_is_the_exact_simulation():
    f, b = np.array([1.0, 1.2, 0.9, 1.1]), np.array([2.0, 2.2, 1.9, 2.3])
    a = simulate_pipeline(f, b, n_micro=300, p2p_ms=0.1, max_exact_micro=300)
    c = simulate_pipeline(f, b, n_micro=300, p2p_ms=0.1)
    assert not a.extrapolated and a.simulated_micro == a.n_micro == 300
    assert a.stage_end.tolist() == c.stage_end.tolist() and a.stage_busy.tolist() == c.stage_busy.tolist()
    assert [(t.kind, t.micro, t.start, t.end) for t in a.tasks] == [(t.kind, t.micro, t.start, t.end) for t in c.tasks]


def test_scheduler_cost_does_not_grow_with_micro_batches():
    f, b = np.full(4, 1.0), np.full(4, 2.0)
    t0 = time.perf_counter()
    r = simulate_pipeline(f, b, n_micro=10**15, keep_tasks=True)  # no transfer: a period of f + b
    assert time.perf_counter() - t0 < 10
    assert r.extrapolated and r.stage_end.max() == pytest.approx(3.0 * 10**15, rel=1e-9)
    assert len(r.tasks) <= 2 * scheduler.MAX_EXACT_MICRO * 4
