"""validation.step_breakdown.layer_slopes: per-layer / per-micro-batch times pinned apart from the per-step terms."""

import itertools

import numpy as np
import pandas as pd
import pytest

from wattcast.validation.step_breakdown import layer_slopes


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
