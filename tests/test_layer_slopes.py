"""validation.step_breakdown.layer_slopes: per-layer / per-micro-batch times pinned apart from the per-step terms."""

import itertools

import numpy as np
import pandas as pd
import pytest

from wattcast.validation.step_breakdown import layer_slopes, tp_split_floor


def _rows(a, b, c, d, mbs=(1, 2), dps=(1, 2), layers=(12, 16, 24), n_micros=(1, 2, 4)):
    rows = []
    for mb, dp, L, n in itertools.product(mbs, dps, layers, n_micros):
        rows.append(dict(hidden=1024, tp=2, micro_batch=mb, dp=dp, pp=1, layers=L, batch=n * mb * dp,
                         measured_ms=n * (a[mb] + b[mb] * L) + c[(mb, dp)] + d[dp] * L))
    return pd.DataFrame(rows)


def test_recovers_per_layer_and_per_micro_batch_times():
    a, b = {1: 3.1, 2: 4.7}, {1: 2.9, 2: 3.6}
    c = {(1, 1): 0.5, (1, 2): 1.2, (2, 1): 0.7, (2, 2): 1.9}
    d = {1: 0.13, 2: 0.21}
    s = layer_slopes(_rows(a, b, c, d)).set_index("micro_batch")
    assert s["b_ms"].to_dict() == pytest.approx(b, abs=1e-9)
    assert s["a_ms"].to_dict() == pytest.approx(a, abs=1e-9)
    assert (s["max_residual_ms"] < 1e-9).all() and (s["rows"] == 18).all()


def test_one_micro_batch_count_leaves_b_free_unless_d_is_shared():
    a, b = {1: 3.0, 8: 9.0}, {1: 3.0, 8: 7.0}
    c = {(1, 1): 0.5, (8, 1): 0.6}
    d = {1: 0.2}
    alone = _rows(a, b, c, d, mbs=(8,), dps=(1,), n_micros=(2,))
    s = layer_slopes(alone)
    assert s["b_ms"].isna().all() and s["a_ms"].isna().all()  # 2 b + d and a are not separable from one n_micro
    # with another micro-batch size sharing d (the same DP degree), b is pinned; a still is not
    both = pd.concat([alone, _rows(a, b, c, d, mbs=(1,), dps=(1,))])
    s = layer_slopes(both).set_index("micro_batch")
    assert s.loc[8, "b_ms"] == pytest.approx(7.0, abs=1e-9) and np.isnan(s.loc[8, "a_ms"])


def test_refuses_pipelined_rows_and_missing_columns():
    r = _rows({1: 1.0, 2: 1.0}, {1: 1.0, 2: 1.0}, dict.fromkeys(itertools.product((1, 2), (1, 2)), 0.0), {1: 0.0, 2: 0.0})
    with pytest.raises(ValueError, match="pp > 1"):
        layer_slopes(r.assign(pp=2))
    with pytest.raises(ValueError, match="layers"):
        layer_slopes(r.drop(columns="layers"))


def _cells(split_ms, same_ms, only_tp1_ms, tps=(1, 2, 4)):
    """a_ms per (hidden, micro_batch, tp): a term split over the ranks, one the same on every degree, one at TP1 only."""
    return pd.DataFrame([dict(hidden=h, micro_batch=mb, tp=t, a_ms=split_ms * mb / t + same_ms + (only_tp1_ms * mb if t == 1 else 0.0))
                         for h in (1024,) for mb in (1, 4) for t in tps])


def test_tp_split_floor_bounds_a_cost_of_one_degree_only():
    # split and TP-invariant terms alone: never a positive floor
    f = tp_split_floor(_cells(8.0, 0.5, 0.0))
    assert (f["floor_ms"] <= 1e-12).all()
    # a TP1-only cost: the floor is at most it, and equals it when nothing is TP-invariant
    f = tp_split_floor(_cells(8.0, 0.5, 3.0)).set_index(["micro_batch", "tp", "tp2"])
    assert f.loc[(4, 1, 2), "floor_ms"] == pytest.approx(12.0 - 0.5, abs=1e-12)
    assert f.loc[(4, 2, 4), "floor_ms"] == pytest.approx(-0.5, abs=1e-12)  # TP2 has no cost of its own
    f0 = tp_split_floor(_cells(8.0, 0.0, 3.0)).set_index(["micro_batch", "tp", "tp2"])
    assert f0.loc[(1, 1, 2), "floor_ms"] == pytest.approx(3.0, abs=1e-12)
    assert f0.loc[(1, 1, 4), "floor_share"] == pytest.approx(3.0 / 11.0, abs=1e-12)


def test_tp_split_floor_refuses_duplicate_cells_and_missing_columns():
    c = _cells(1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="more than one row"):
        tp_split_floor(pd.concat([c, c]))
    with pytest.raises(ValueError, match="a_ms"):
        tp_split_floor(c.drop(columns="a_ms"))
