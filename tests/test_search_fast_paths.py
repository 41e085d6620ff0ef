"""The search's fast paths give the figures of the full ones, bit for bit: the memory total alone
(stage_total_gb) against the term-by-term stage memory, a search's StepSummary against the DistributedPrediction of
the same schedule context, and the cheap config copies against dataclasses.replace."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from wattcast.simulate.distributed import StepSummary, schedule_step, schedule_context
from wattcast.simulate.parallel import ParallelConfig, layouts, new_config, with_fields
from wattcast.simulate.stage_memory import stage_memory_gb, stage_total_gb


def test_stage_total_equals_the_term_by_term_total():
    rng = np.random.default_rng(0)
    n = 0
    for fw, db, zero, dp, opt, fp8 in itertools.product(("hf", "megatron", "megatron-deepspeed"), (2, 4), (0, 1, 2, 3),
                                                         (1, 3, 8), ("adamw", "sgd"), (0.0, 0.37)):
        P = int(rng.integers(1, 9))
        kw = dict(params=rng.uniform(1e6, 3e9, P), act_bytes_per_chunk=rng.uniform(0, 5e9, P),
                  inflight=rng.integers(1, 9, P), full_recompute_extra_bytes=float(rng.uniform(0, 1e9)), dtype_bytes=db,
                  grad_bytes=4, held_grad_bytes=float(rng.choice([2.0, 4.0, 6.0])), optimizer=opt, zero=zero, dp=dp,
                  framework=fw, block_params=float(rng.uniform(1e6, 1e9)), fp8_param_fraction=fp8,
                  root_params=rng.uniform(0, 1e9, P),
                  # Megatron-FSDP optim_grads' gradient buckets (one per stage, or Megatron-LM's bucket size)
                  grad_bucket_params=float(rng.choice([np.inf, 4e7, 2.048e9])))
        np.testing.assert_array_equal(stage_total_gb(**kw), stage_memory_gb(**kw)["total_gb"])
        n += 1
    assert n == 3 * 2 * 4 * 3 * 2 * 2


def test_config_copies_equal_replace():
    base = ParallelConfig(gpus=64, tp=4, pp=2, zero=1, sp=True, recompute="full")
    a = with_fields(base, dp=8, micro_batch=2, overlap_grad_reduce=False)
    b = replace(base, dp=8, micro_batch=2, overlap_grad_reduce=False)
    assert a == b and hash(a) == hash(b) and a.describe() == b.describe()
    assert base.dp is None  # the original is untouched
    assert new_config(gpus=8, tp=2, interleave=2) == ParallelConfig(gpus=8, tp=2, interleave=2)
    with pytest.raises(Exception):  # still frozen
        a.tp = 3


def test_layouts_are_cached_but_each_call_gets_its_own_dict():
    from wattcast.data.cluster_spec import resolve_cluster

    cl = resolve_cluster("DGX-A100")
    p = ParallelConfig(gpus=64, tp=4, pp=2, dp=8)
    a, b = layouts(p, cl), layouts(p, cl)
    assert a == b and a is not b
    a["dp"] = None
    assert layouts(p, cl)["dp"].size == 8


@pytest.mark.parametrize("par", [
    ParallelConfig(gpus=64, tp=8, pp=4, zero=1, micro_batch=1),
    ParallelConfig(gpus=64, tp=4, pp=4, zero=0, interleave=2, micro_batch=2, sp=True),
    ParallelConfig(gpus=64, tp=2, pp=8, zero=0, micro_batch=1, schedule="gpipe", recompute="full"),
    ParallelConfig(gpus=64, tp=8, pp=1, zero=3, micro_batch=1),
    ParallelConfig(gpus=64, tp=8, pp=2, zero=2, micro_batch=4),
    ParallelConfig(gpus=64, tp=4, pp=4, zero=1, micro_batch=1, recompute="full", recompute_num_layers=3),
    ParallelConfig(gpus=64, tp=4, pp=4, zero=1, micro_batch=1, recompute="full", recompute_num_layers=2,
                   recompute_method="uniform"),
    ParallelConfig(gpus=64, tp=1, pp=1, zero=0, micro_batch=4),  # does not fit: pruned
])
def test_step_summary_equals_the_prediction(par):
    kw = dict(gpus=64, batch=256, seq=2048, parallel=par, dtype="bf16", attention="flash", comm_split=False,
              prune_oom=True, exact_pipeline=False)
    ctx = schedule_context("gpt3_13b", "DGX-A100", **kw)
    full = schedule_step(replace(ctx, detail=False, memo={}))
    s = schedule_step(replace(ctx, detail=False, summary=True, memo={}))
    assert isinstance(s, StepSummary)
    band_terms = ("ood_sums", "rank_per_op", "data_loading_ms", "n_micro", "optimizer_per_op")  # checked below
    for name in StepSummary._fields:
        if name in band_terms:
            continue
        want = full.meta.get("scheduled", True) if name == "scheduled" else getattr(full, name)
        got = getattr(s, name)
        assert got == want or (isinstance(want, float) and math.isnan(want) and math.isnan(got)), name
    assert s.memory_flag == full.memory_flag
    assert s.scheduled == (par.tp > 1)
    if s.scheduled:  # the band's terms: the critical rank's OOD share, the op totals the generation term weighs
        total, ood_ms = (s.ood_sums or (0.0, 0.0))[:2]
        assert (ood_ms / total if ood_ms > 0 else 0.0) == full.step_band["ood_time_share"]
        # the prediction's per_op: one micro-batch's forward, backward and loading n_micro times, the optimizer once
        assert s.n_micro == full.meta["n_micro"]
        assert ((sum(o["time_ms"] for o in s.rank_per_op) + s.data_loading_ms) * s.n_micro
                + sum(o["time_ms"] for o in s.optimizer_per_op)
                == pytest.approx(sum(o["time_ms"] for o in full.per_op), rel=1e-12))
        assert {o["op_class"]: o["time_ms"] for o in s.optimizer_per_op}["optimizer"] == pytest.approx(
            {o["op_class"]: o["time_ms"] for o in full.per_op}["optimizer"], rel=1e-12)


@pytest.mark.parametrize("limit", [None, 24])
def test_static_pass_equals_the_event_loop_bit_for_bit(monkeypatch, limit):
    """The one-pass timing in the event loop's order (the search's default where the closed form does not apply) gives
    the event loop's figures exactly, 1F1B, GPipe and interleaved, with transfers, and when the steady state is
    extrapolated (``limit``: micro-batches simulated task by task)."""
    from wattcast.simulate import scheduler as sc
    from wattcast.simulate.pipeline_fast import closed_form_applies, time_pipeline

    if sc._static_kernel is None:
        pytest.skip("numba is not installed: the event loop times every step")
    if limit is not None:
        monkeypatch.setattr(sc, "MAX_EXACT_MICRO", limit)
    rng = np.random.default_rng(11)
    n_static = 0
    for _ in range(120):
        P = int(rng.integers(1, 13))
        V = int(rng.choice([1, 2, 3, 4])) if P > 1 else 1
        kind = "1f1b" if V > 1 else str(rng.choice(["1f1b", "gpipe"]))
        m = P * int(rng.integers(1, 12)) if V > 1 else int(rng.integers(1, 80))
        f, b = rng.uniform(0.5, 3, P * V), rng.uniform(1, 6, P * V)
        p2p = float(rng.choice([0.0, rng.uniform(0, 0.5)]))
        ref = sc.simulate_pipeline(f, b, n_micro=m, interleave=V, kind=kind, p2p_ms=p2p, keep_tasks=False)
        py = sc._simulate_events(f, b, n_micro=m, interleave=V, kind=kind, p2p_ms=p2p, keep_tasks=False)
        got = sc.simulate_pipeline(f, b, n_micro=m, interleave=V, kind=kind, p2p_ms=p2p, keep_tasks=False, static=True)
        where = (P, V, m, kind, p2p)
        if not closed_form_applies(f, b, V, p2p, kind):  # what the search's default times with the one pass
            routed = time_pipeline(f, b, n_micro=m, interleave=V, kind=kind, p2p_ms=p2p, exact=False)
            np.testing.assert_array_equal(routed.stage_end, got.stage_end, err_msg=str(where))
        np.testing.assert_array_equal(got.stage_end, ref.stage_end, err_msg=str(where))
        np.testing.assert_array_equal(got.stage_busy, ref.stage_busy, err_msg=str(where))
        assert got.last_backward == ref.last_backward, where
        np.testing.assert_array_equal(got.last_backward_by_chunk, ref.last_backward_by_chunk, err_msg=str(where))
        np.testing.assert_array_equal(got.first_forward_by_chunk, ref.first_forward_by_chunk, err_msg=str(where))
        if limit is None or m <= limit:
            np.testing.assert_array_equal(got.last_backward_by_chunk, py.last_backward_by_chunk, err_msg=str(where))
            np.testing.assert_array_equal(got.first_forward_by_chunk, py.first_forward_by_chunk, err_msg=str(where))
        if limit is None or m <= limit:
            np.testing.assert_array_equal(got.stage_end, py.stage_end, err_msg=str(where))
        if got.last_backward_array is not None:
            np.testing.assert_array_equal(got.last_backward_array, np.array(ref.last_backward))
        else:
            assert got.extrapolated
        n_static += not got.extrapolated
    assert n_static > 20


def test_worker_homes_are_sticky_and_rebalanced_once_on_measured_cost():
    from wattcast.planning import search as S

    S._HOMES.pop("job-x", None)
    groups = {("g", i): [(j, None) for j in range(10 + i)] for i in range(8)}

    def homes(parts):
        return {k: w for w, mine in enumerate(parts) for g in mine for k in groups if groups[k] is g}

    first = homes(S._assign_groups("job-x", groups, 2))
    assert homes(S._assign_groups("job-x", groups, 2)) == first  # the same worker per group, search after search
    assert set(first.values()) == {0, 1}
    # measured: group 7 costs as much as all the others together -> one rebalance puts it alone
    S._HOMES["job-x"]["cost"].update({k: (7.0 if k == ("g", 7) else 1.0) for k in groups})
    second = homes(S._assign_groups("job-x", groups, 2))
    alone = second[("g", 7)]
    assert all(w != alone for k, w in second.items() if k != ("g", 7))
    S._HOMES["job-x"]["cost"].update({k: 1.0 for k in groups})  # new measurements do not move groups again
    assert homes(S._assign_groups("job-x", groups, 2)) == second
    S._HOMES.pop("job-x", None)
