"""A search's default pipeline sizes: every divisor of the job's GPUs over TP x CP, capped at the model's layers (until
stop 54 the powers of two only: a 48- or 96-GPU job never tried 3, 6 or 12 stages, and the auditor's Llama 3 70B on
48 H100s ranked tp8-pp2-dp3 v2 first at 6,745.6 ms where tp8-pp3-dp2 v2 takes 6,667.3 ms in less memory)."""

from __future__ import annotations

from wattcast.planning.search import _divisors, candidate_configs


def test_divisors_are_every_divisor_under_the_cap():
    assert _divisors(48) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 48]
    assert _divisors(96, 32) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    assert _divisors(7) == [1, 7]


def test_default_space_tries_stage_counts_that_are_not_powers_of_two():
    cands = candidate_configs("llama3_70b", "DGX-H100", 48, 96, 4096, tp=(8,), zero=(0, 1), sp=(True,),
                              recompute=("none",), interleave=(1,), cp=(1,))
    assert {c.pp for c in cands} == {1, 2, 3, 6}  # 48 / 8 = 6 GPUs over pp x dp


def test_default_stage_counts_stop_at_the_model_layers():
    """gpt2 (12 layers) on 64 GPUs at TP 1: 16, 32 and 64 stages would hold no layer; 12 does not divide 64."""
    cands = candidate_configs("gpt2", "DGX-H100", 64, 64, 1024, tp=(1,), zero=(0,), sp=(False,), recompute=("none",),
                              interleave=(1,), cp=(1,))
    assert {c.pp for c in cands} == {1, 2, 4, 8}


def test_search_refuses_a_run_beyond_the_predict_bound():
    """--tokens 1e30 (the auditor's) made a ranking of 1.1e19-day runs with status ok; predict --tokens refuses a run
    over 1e6 failure-free hours naming --tokens, and so does search now (on its fastest fitting row); allow_exotic
    lifts it as it lifts predict's."""
    import pytest

    import wattcast

    kw = dict(tp=(1,), pp=(1,), micro_batch=(1,), zero=(0,), sp=(False,), recompute=("none",), interleave=(1,), cp=(1,))
    with pytest.raises(ValueError, match=r"tokens \(--tokens\) is 1e\+30"):
        wattcast.search("gpt2", "DGX-H100", 8, 16, 1024, tokens=1e30, **kw)
    with wattcast.allow_exotic():
        res = wattcast.search("gpt2", "DGX-H100", 8, 16, 1024, tokens=1e30, **kw)
    assert res.ranked["run_days"].min() > 1e18
    assert wattcast.search("gpt2", "DGX-H100", 8, 16, 1024, tokens=1e9, **kw).ranked["run_days"].min() < 1


def test_the_run_bound_search_and_predict_share_is_public():
    """search checks its runs with lifecycle.footprint's public check_run_hours (until stop 55 it imported the
    private _check_run_hours across modules): the same bound, lifted by allow_exotic."""
    import pytest

    import wattcast
    from wattcast.lifecycle.footprint import check_run_hours

    check_run_hours(1e9, 16 * 1024, 100.0)  # 6,104 steps of 0.1 s: 0.17 h
    with pytest.raises(ValueError, match=r"tokens \(--tokens\) is 1e\+30: .* failure-free hours, over 1e\+06"):
        check_run_hours(1e30, 16 * 1024, 100.0)
    with wattcast.allow_exotic():
        check_run_hours(1e30, 16 * 1024, 100.0)
