"""The cold path's faster frame plumbing builds the very frames pandas' row-by-row paths built."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from wattcast.featurize.op_graph import NODE_COLUMNS, Tensor, _frame_of_rows
from wattcast.featurize.training_graph import _column_values
from wattcast.featurize.workload import StepOptions, step_graph


@pytest.fixture(scope="module")
def graph():
    return step_graph("gpt2", StepOptions(batch=2, seq=128, mode="train", dtype="bf16", recompute="full"))


def test_frame_of_rows_is_pandas_frame_of_records(graph):
    rows = graph.nodes.to_dict("records")
    want = pd.DataFrame(rows, columns=list(NODE_COLUMNS))
    got = _frame_of_rows(rows, list(NODE_COLUMNS))
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert list(got.dtypes) == list(want.dtypes)


def test_frame_of_rows_missing_column_and_empty_fall_back_to_pandas():
    rows = [{"name": "a", "flops": 1.0}, {"name": "b"}]
    pd.testing.assert_frame_equal(_frame_of_rows(rows, ["name", "flops"]), pd.DataFrame(rows, columns=["name", "flops"]))
    pd.testing.assert_frame_equal(_frame_of_rows([], ["name", "flops"]), pd.DataFrame([], columns=["name", "flops"]))


def test_column_values_are_the_records_values(graph):
    frame = graph.nodes.copy()
    frame.loc[3, "tag"] = None  # a missing string: NaN either way
    recs = frame.to_dict("records")
    cols = _column_values(frame)
    for c in frame.columns:
        want = [r[c] for r in recs]
        assert [type(v) for v in cols[c]] == [type(v) for v in want], c
        assert pd.Series(cols[c], dtype=object).equals(pd.Series(want, dtype=object)), c
    obj = frame.astype({"layer": object})  # an object column: the records path
    assert _column_values(obj)["layer"] == [r["layer"] for r in obj.to_dict("records")]


def test_tensor_sizes_cached_without_changing_the_dataclass():
    t = Tensor((2, 3, np.int64(4)), "bf16", 5, 7)
    assert (t.numel, t.nbytes) == (24, 48) and type(t.numel) is int
    assert t == Tensor((2, 3, 4), "bf16", 5, 7) and hash(t) == hash(Tensor((2, 3, 4), "bf16", 5, 7))
    assert [f.name for f in dataclasses.fields(Tensor)] == ["shape", "dtype", "node", "tid"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.numel = 1


def test_column_is_factorises_a_column_once_for_all_values(graph):
    """Each value asked of a column (phase forward/backward/optimizer, ...) reuses one factorisation of it; the masks
    are those of comparing every row."""
    from wattcast.featurize import graph_cache

    frame = graph.nodes
    calls = []
    real = graph_cache._derived

    def spy(series, what, make):
        return real(series, what, (lambda: (calls.append(what), make())[1]))

    graph_cache._derived = spy
    try:
        for value in ("forward", "backward", "optimizer"):
            got = graph_cache.column_is(frame, "phase", value)
            assert np.array_equal(got, (frame["phase"].astype(str) == value).to_numpy())
    finally:
        graph_cache._derived = real
    assert calls.count("factorize_keep_na") <= 1
