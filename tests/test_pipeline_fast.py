"""The closed-form pipeline timing against the event-driven scheduler (the reference), the search's exact_pipeline switch,
its workers (the same rows as one process) and its schedule option."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

import wattcast
from wattcast.simulate.pipeline_fast import closed_form_applies, fast_pipeline, time_pipeline
from wattcast.simulate.scheduler import simulate_pipeline

GRID = list(itertools.product([1, 2, 3, 4, 8, 16, 32], [1, 2, 4], [1, 2, 3, 4, 8, 16, 48, 192], ["1f1b", "gpipe"],
                              [0.0, 0.01, 0.05, 0.25], [(1.0, 2.0), (1.0, 1.0), (1.0, 3.0)]))


def test_closed_form_within_1pct_of_event_loop_where_it_applies():
    used = 0
    for P, V, M, kind, c, (fw, bw) in GRID:
        if V > 1 and (kind == "gpipe" or M % P or P == 1):
            continue
        f, b = np.full(P * V, fw / V), np.full(P * V, bw / V)
        if not closed_form_applies(f, b, V, c, kind):
            continue
        used += 1
        ex = simulate_pipeline(f, b, n_micro=M, interleave=V, kind=kind, p2p_ms=c, keep_tasks=False)
        fa = fast_pipeline(f, b, n_micro=M, interleave=V, kind=kind, p2p_ms=c)
        T = ex.stage_end.max()
        where = (P, V, M, kind, c, fw, bw)
        assert fa.stage_end.max() == pytest.approx(T, rel=0.01), where
        assert np.abs(fa.stage_end - ex.stage_end).max() <= 0.01 * T, where
        assert np.abs(np.array(fa.last_backward) - np.array(ex.last_backward)).max() <= 0.01 * T, where
        assert np.abs(fa.last_backward_by_chunk - ex.last_backward_by_chunk).max() <= 0.01 * T, where
        np.testing.assert_allclose(fa.first_forward_by_chunk, ex.first_forward_by_chunk, rtol=1e-12, atol=1e-12 * T,
                                   err_msg=str(where))
        np.testing.assert_allclose(fa.stage_busy, ex.stage_busy, rtol=1e-12)
    assert used > 300  # the grid exercises it: 1F1B, interleaved and GPipe


def test_textbook_forms():
    # uniform stages, no transfers: (M + P - 1)(f + b), interleaved (M V + P - 1)(f_c + b_c)
    r = fast_pipeline(np.full(4, 1.0), np.full(4, 2.0), n_micro=8)
    assert r.stage_end.max() == pytest.approx((8 + 4 - 1) * 3.0)
    r = fast_pipeline(np.full(8, 0.5), np.full(8, 1.0), n_micro=8, interleave=2)
    assert r.stage_end.max() == pytest.approx((8 * 2 + 4 - 1) * 1.5)
    r = fast_pipeline(np.full(4, 1.0), np.full(4, 2.0), n_micro=8, kind="gpipe", p2p_ms=0.1)
    assert r.stage_end.max() == pytest.approx((8 + 4 - 1) * 3.0 + 2 * 3 * 0.1)


def test_unequal_stages_use_the_event_loop():
    f = np.array([1.2, 1.0, 1.0, 1.4])
    b = 2 * f
    assert not closed_form_applies(f, b, 1, 0.0)
    got = time_pipeline(f, b, n_micro=16, exact=False)
    ref = simulate_pipeline(f, b, n_micro=16, keep_tasks=False)
    np.testing.assert_array_equal(got.stage_end, ref.stage_end)
    # and a long transfer on interleaved 1F1B (communication-bound) too
    assert not closed_form_applies(np.full(8, 0.25), np.full(8, 0.5), 2, 0.3)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="interleave"):
        fast_pipeline(np.ones(5), np.ones(5), n_micro=4, interleave=2)


JOB = dict(gpus=64, batch=256, seq=1024)


@pytest.fixture(scope="module")
def exact_and_fast():
    kw = dict(zero=(0, 1), interleave=(1, 2), recompute=("none", "full"), max_configs=100_000)
    exact = wattcast.search("gpt2-xl", "DGX-A100", **JOB, exact_pipeline=True, **kw)
    fast = wattcast.search("gpt2-xl", "DGX-A100", **JOB, **kw)
    return exact, fast


def test_search_fast_path_matches_exact_pipeline(exact_and_fast):
    exact, fast = exact_and_fast
    e, f = exact.ranked, fast.ranked
    assert len(e) == len(f) > 100
    assert e["strategy"].head(10).tolist() == f["strategy"].head(10).tolist()
    m = e.merge(f, on="strategy", suffixes=("_e", "_f"))
    ok = m["step_time_ms_e"].notna()
    np.testing.assert_allclose(m.loc[ok, "step_time_ms_f"], m.loc[ok, "step_time_ms_e"], rtol=0.01)


def test_workers_give_the_same_rows(exact_and_fast):
    _, one = exact_and_fast
    kw = dict(zero=(0, 1), interleave=(1, 2), recompute=("none", "full"), max_configs=100_000)
    import wattcast.planning.search as search_mod

    assert len(one.ranked) + len(one.rejected) >= search_mod.PARALLEL_MIN_CANDIDATES  # the split runs
    two = wattcast.search("gpt2-xl", "DGX-A100", **JOB, workers=2, **kw)
    pd.testing.assert_frame_equal(one.ranked, two.ranked)
    pd.testing.assert_frame_equal(one.rejected, two.rejected)
    pd.testing.assert_frame_equal(one.pareto, two.pareto)
    # cut at max_configs exactly where one process cuts
    a = wattcast.search("gpt2-xl", "DGX-A100", **JOB, zero=(0, 1), interleave=(1, 2), max_configs=37)
    b = wattcast.search("gpt2-xl", "DGX-A100", **JOB, zero=(0, 1), interleave=(1, 2), max_configs=37, workers=2)
    assert len(a.ranked) == 37
    pd.testing.assert_frame_equal(a.ranked, b.ranked)
    pd.testing.assert_frame_equal(a.rejected, b.rejected)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_workers_are_named(bad):
    with pytest.raises(ValueError, match="workers"):
        wattcast.search("gpt2-xl", "DGX-A100", **JOB, workers=bad)


@pytest.mark.parametrize("name", ["exact_pipeline", "prune_oom", "pareto"])
def test_switches_must_be_booleans(name):
    # "no" or 0 would otherwise read as a choice (a truthy string turned the reference pipeline on)
    with pytest.raises(ValueError, match=f"{name} must be True or False"):
        wattcast.search("gpt2-xl", "DGX-A100", **JOB, **{name: "no"})


def test_schedule_is_a_search_option():
    res = wattcast.search("gpt2-xl", "DGX-A100", **JOB, pp=(1, 4), tp=(1,), zero=(0,), interleave=(1, 2),
                          schedule=("1f1b", "gpipe"), max_configs=100_000)
    r = res.ranked
    g = r[r["schedule"] == "gpipe"]
    assert len(g) and (g["pp"] > 1).all() and (g["interleave"] == 1).all()  # GPipe only where it differs
    assert g["config"].str.contains("gpipe").all() and g["strategy"].str.contains("gpipe").all()
    # one stage: no GPipe duplicate of a 1F1B row
    assert not r.duplicated(["tp", "pp", "dp", "micro_batch", "zero", "sp", "recompute", "interleave"] + ["schedule"]).any()
    with pytest.raises(ValueError, match="schedule"):
        wattcast.search("gpt2-xl", "DGX-A100", **JOB, schedule="zigzag")
