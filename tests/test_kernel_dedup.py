"""The deduping paths of `predict_kernels` give every row the numbers it would get on its own, bit for bit.

`predict_kernels` groups the raw input rows that are identical in every column it reads (``_distinct_input_rows``),
normalises and predicts one row per group and copies the outputs to the group; the surrogates predict each distinct
feature row once (``distinct_matrix_rows``: two kernels can differ only where no feature looks). These tests compare
with the same call with both dedupes switched off (the path before them), bitwise, on tables with repeats, errors,
other spellings, -0.0 and missing cells; and check that the dedupes do run (what makes the repeated-shape path fast).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from wattcast.data.catalog import resolve_device
from wattcast.models import kernel_bundle as kb
from wattcast.models import kernel_predictor as kp
from wattcast.models import kernel_surrogates as ks
from wattcast.models.kernel_bundle import load_bundle
from wattcast.models.kernel_predictor import predict_kernels


def _kernels(n: int, seed: int) -> pd.DataFrame:
    """Valid and invalid kernels in the input schema: other spellings of ops and dtypes, missing cells (None and NaN),
    -0.0 next to 0.0, bad and implausible values, GEMMs the small-M and contraction guards probe."""
    rng = np.random.default_rng(seed)
    ops = np.array(["linear", "Linear", " bmm ", "layernorm", "ln", "softmax", "gelu", "add", "mul", "conv2d", "bogus",
                    None, np.nan], dtype=object)
    dtypes = np.array(["fp32", "bf16", "fp16", "tf32", "", None, "BF16", "int3"], dtype=object)
    df = pd.DataFrame({
        "OPName": rng.choice(ops, size=n),
        "dtype": rng.choice(dtypes, size=n),
        "B": rng.choice([1.0, 2.0, 16.0, -0.0, 0.0, 2.5, np.nan], size=n, p=[0.5, 0.1, 0.2, 0.05, 0.05, 0.05, 0.05]),
        "M": rng.choice([1.0, 3.0, 64.0, 100.0, 777.0, 4096.0, 2.0**45], size=n),
        "N": rng.choice([8.0, 45.0, 128.0, 768.0, 4096.0], size=n),
        "K": rng.choice([64.0, 768.0, 3072.0], size=n),
        "H": rng.choice([768.0, 4096.0, np.nan], size=n),
        "Input_Channel": rng.choice([3.0, 64.0], size=n), "Output_Channel": 64.0,
        "Kernel_Size": rng.choice([1.0, 3.0, 300.0], size=n), "Input_Size": 32.0, "Stride": 1.0,
        "Padding": rng.choice([0.0, -0.0, 1.0], size=n),
        "note": np.arange(n),  # a column wattcast does not read: differs on every row, dedupes all the same
    })
    for c in ("OPName", "dtype"):  # object columns, None and NaN kept apart (a DataFrame made of them infers str)
        df[c] = pd.Series(_objects(rng.choice(ops if c == "OPName" else dtypes, size=n)), dtype=object)
    assert (df.dtypes[["OPName", "dtype"]] == object).all()
    return df


def _objects(values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def _distinct_kernels(n: int, seed: int) -> pd.DataFrame:
    """:func:`_kernels` without two rows that are one kernel (another spelling, -0.0 for 0.0, the column not read)."""
    df = _kernels(n, seed)
    canon, err = kp.normalise_kernel_frame(df)
    return df[~canon.assign(err=err).duplicated().to_numpy()].reset_index(drop=True)


def _without_dedupe(monkeypatch, frame, spec, bundle) -> pd.DataFrame:
    """``predict_kernels`` as before the dedupes: every input row normalised, every feature row predicted."""
    with monkeypatch.context() as m:
        m.setattr(kp, "_distinct_input_rows", lambda frame: None)
        m.setattr(ks, "distinct_matrix_rows", lambda A: None)
        m.setattr(kb, "distinct_matrix_rows", lambda A: None)
        return predict_kernels(frame, spec, bundle=bundle)


def _assert_bitwise_equal(got: pd.DataFrame, ref: pd.DataFrame) -> None:
    assert list(got.columns) == list(ref.columns) and got.index.equals(ref.index)
    pd.testing.assert_series_equal(got.dtypes, ref.dtypes)
    for c in ref.columns:
        a, b = got[c].to_numpy(), ref[c].to_numpy()
        if a.dtype.kind == "f":
            np.testing.assert_array_equal(a.view(np.int64), b.view(np.int64), err_msg=c)
        else:
            assert pd.Series(a).equals(pd.Series(b)), c


@pytest.fixture(scope="module")
def bundle():
    return load_bundle()


@pytest.mark.parametrize("device", ["H100-SXM5-80GB", "Tesla-T4"])
def test_repeated_rows_get_the_distinct_rows_predictions(monkeypatch, bundle, device):
    spec = resolve_device(device)
    distinct = _distinct_kernels(300, seed=1)
    rng = np.random.default_rng(2)
    # the distinct rows first, in order, then repeats: the table's kernels are predicted in the order they are alone
    pick = np.r_[np.arange(len(distinct)), rng.integers(0, len(distinct), size=3000)]
    table = distinct.iloc[pick].assign(note=np.arange(len(pick)))
    table.index = rng.permutation(len(pick)) * 7  # an index of its own, kept
    got = predict_kernels(table, spec, bundle=bundle)
    assert got["error"].eq("").any() and got["error"].ne("").any()  # both kinds of row are exercised
    _assert_bitwise_equal(got, _without_dedupe(monkeypatch, table, spec, bundle))
    # each row: its distinct row's outputs, predicted without repeats and without dedupe
    alone = _without_dedupe(monkeypatch, distinct, spec, bundle)
    cols = list(kp.PRED_COLUMNS + kp.EXTRA_COLUMNS)
    _assert_bitwise_equal(got[cols], alone[cols].iloc[pick].set_axis(table.index))


def test_outputs_follow_their_rows_in_any_order(monkeypatch, bundle):
    spec = resolve_device("H100-SXM5-80GB")
    table = _kernels(200, seed=3)
    rng = np.random.default_rng(4)
    table = table.iloc[rng.integers(0, len(table), size=2000)].reset_index(drop=True)
    got = predict_kernels(table, spec, bundle=bundle)
    perm = rng.permutation(len(table))
    shuffled = predict_kernels(table.iloc[perm], spec, bundle=bundle)
    _assert_bitwise_equal(shuffled, _without_dedupe(monkeypatch, table.iloc[perm], spec, bundle))
    ref = got.iloc[perm]
    times = ["pred_latency_ms", "pred_low_ms", "pred_high_ms"]
    _assert_bitwise_equal(shuffled.drop(columns=times), ref.drop(columns=times))
    # the small-M and contraction guards' running max/min (``_apply_grid``) take each row's grid on its own: a guarded
    # row's time is the same bits in any order (it moved by ~3e-14 when each grid was offset by its batch position)
    _assert_bitwise_equal(shuffled[times], ref[times])


def _guarded_gemms(n: int, seed: int) -> pd.DataFrame:
    """Tensor-core linear-layer rows (``linear`` and single ``bmm``) that the small-M guard (1 < M <= 4096) and the
    contraction guard (N < 512) probe, most of them both, with some unguarded GEMMs and other kernels between them."""
    rng = np.random.default_rng(seed)
    kind = rng.choice(["both", "small_m", "short_k", "other"], size=n, p=[0.4, 0.2, 0.2, 0.2])
    small_m = rng.integers(2, 4097, size=n).astype(float)
    short_k = rng.integers(1, 512, size=n).astype(float)
    return pd.DataFrame({
        "OPName": np.where(kind == "other", rng.choice(["linear", "add", "softmax"], size=n),
                           rng.choice(["linear", "bmm"], size=n)),
        "dtype": rng.choice(["bf16", "fp16", "fp8"], size=n),
        "B": 1.0,
        "M": np.where(np.isin(kind, ["both", "small_m"]), small_m, rng.integers(4097, 65537, size=n)),
        "N": np.where(np.isin(kind, ["both", "short_k"]), short_k, rng.integers(512, 16385, size=n)),
        "K": rng.integers(64, 16385, size=n).astype(float),
        "H": rng.choice([1024.0, 4096.0], size=n),
    })


@pytest.mark.parametrize("device", ["H100-SXM5-80GB", "MI300X"])
def test_guarded_gemm_time_is_the_same_bits_in_any_batch(bundle, device):
    """A guarded GEMM's time (its grid's running max/min, interpolated) depends on its own row only: the same bits
    in a shuffled table, and predicted alone, as in the table."""
    spec = resolve_device(device)
    table = _guarded_gemms(3000, seed=11)
    canon, _ = kp.normalise_kernel_frame(table)
    m_probes, n_probes = kp._m_grid_probes(canon)[2], kp._n_grid_probes(kp._pad_contraction(canon)[0])[2]
    assert len(m_probes) > 1500 and len(n_probes) > 1500  # the guards probe most rows
    got = predict_kernels(table, spec, bundle=bundle)
    assert (got["error"] == "").all()
    perm = np.random.default_rng(12).permutation(len(table))
    shuffled = predict_kernels(table.iloc[perm], spec, bundle=bundle)
    _assert_bitwise_equal(shuffled, got.iloc[perm])
    for i in np.intersect1d(m_probes, n_probes)[:25]:
        _assert_bitwise_equal(predict_kernels(table.iloc[[i]], spec, bundle=bundle), got.iloc[[i]])


def test_missing_and_signed_zero_cells_keep_their_own_messages(monkeypatch, bundle):
    """None and NaN ops, -0.0 and 0.0 sizes are different cells (an error can print them): grouped only with their
    own kind."""
    spec = resolve_device("H100-SXM5-80GB")
    one = pd.DataFrame({"OPName": pd.Series(_objects([None, np.nan, "linear", "linear", "linear", "linear"]), dtype=object),
                        "dtype": "fp32", "B": 1.0, "M": [64.0, 64.0, -0.0, 0.0, 64.0, 64.0], "N": 64.0, "K": 64.0,
                        "H": pd.Series(_objects([None, None, None, None, None, np.nan]), dtype=object)})
    assert one["OPName"].dtype == object and one["H"].dtype == object
    table = pd.concat([one] * 10, ignore_index=True)
    rep, inverse = kp._distinct_input_rows(table)  # the dedupe runs here, and keeps the six rows apart
    assert list(inverse[:12]) == [0, 1, 2, 3, 4, 5] * 2
    got = predict_kernels(table, spec, bundle=bundle)
    err = got["error"].to_numpy()
    assert "-0.0" in err[2] and "-0.0" not in err[3] and "0.0" in err[3]
    assert (err.reshape(10, 6) == err[:6]).all()
    _assert_bitwise_equal(got, _without_dedupe(monkeypatch, table, spec, bundle))


def test_mixed_object_columns_are_not_grouped():
    """1, 1.0 and True are equal keys to a hash table but different cells: such a column turns the dedupe off."""
    df = pd.DataFrame({"OPName": ["add"] * 6, "B": pd.array([1, 1.0, True] * 2, dtype=object), "H": 8.0})
    assert kp._distinct_input_rows(df) is None
    assert kp._distinct_input_rows(df.astype({"B": float})) is not None


def test_table_with_few_repeated_kernels_predicts_as_before(monkeypatch, bundle):
    """Many repeats of invalid rows but hardly any of valid ones: the rows the table predicts (its valid rows with
    their repeats) are not the distinct ones, so the whole table takes the path without the input dedupe."""
    spec = resolve_device("H100-SXM5-80GB")
    valid = _kernels(400, seed=5)
    valid = valid.assign(OPName="linear", dtype="bf16", B=1.0)
    valid = valid.iloc[np.r_[np.arange(400), np.arange(20)]]  # 20 repeats
    bad = valid.iloc[:1].assign(OPName="bogus")
    table = pd.concat([valid, pd.concat([bad] * 2000)], ignore_index=True)
    calls = []
    real = kp._kernel_columns

    def spy(frame, *a, **k):
        out = real(frame, *a, **k)
        calls.append((len(frame), k.get("counts") is not None, out is None))
        return out

    monkeypatch.setattr(kp, "_kernel_columns", spy)
    got = predict_kernels(table, spec, bundle=bundle)
    assert calls[0][1:] == (True, True) and calls[1] == (len(table), False, False), calls
    monkeypatch.undo()
    _assert_bitwise_equal(got, _without_dedupe(monkeypatch, table, spec, bundle))


def test_repeated_table_is_normalised_and_predicted_once_per_kernel(monkeypatch, bundle):
    """What makes a table of repeated shapes fast: normalising sees its distinct rows, LightGBM no row twice."""
    spec = resolve_device("H100-SXM5-80GB")
    table = pd.concat([_kernels(150, seed=6).drop(columns="note")] * 40, ignore_index=True)
    seen, lgbm_rows = [], []
    real_norm, real_lgbm = kp.normalise_kernel_frame, ks.LGBMSurrogate.predict_matrix

    def norm(frame, *a, **k):
        seen.append(len(frame))
        return real_norm(frame, *a, **k)

    def lgbm(self, A):
        lgbm_rows.append((len(A), len(np.unique(A, axis=0))))
        return real_lgbm(self, A)

    monkeypatch.setattr(kp, "normalise_kernel_frame", norm)
    monkeypatch.setattr(ks.LGBMSurrogate, "predict_matrix", lgbm)
    predict_kernels(table, spec, bundle=bundle)
    assert seen and max(seen) <= 150
    assert lgbm_rows and all(n == u for n, u in lgbm_rows), lgbm_rows


def test_distinct_matrix_rows_is_exact():
    A = np.array([[1.0, 2.0], [1.0, 2.0], [0.0, np.nan], [-0.0, np.nan], [0.0, np.nan], [3.0, 4.0]])
    rep, inverse = ks.distinct_matrix_rows(A)
    assert list(inverse) == [0, 0, 1, 2, 1, 3]  # -0.0 is not 0.0; NaN equals the same NaN
    assert np.array_equal(A[rep][inverse], A, equal_nan=True)
    assert ks.distinct_matrix_rows(A[[0, 2, 3, 5]]) is None  # nothing repeats
    calls = []
    out = ks.predict_distinct(lambda M: calls.append(len(M)) or M.sum(axis=1), A)
    assert calls == [4] and np.array_equal(out, A.sum(axis=1), equal_nan=True)
