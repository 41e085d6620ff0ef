"""The compiled LightGBM forest (models/lgbm_forest.py) predicts exactly what ``Booster.predict`` does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import load_script
from wattcast.data.catalog import resolve_device
from wattcast.featurize.kernel_features import featurize_kernels
from wattcast.models import kernel_predictor as kp
from wattcast.models import kernel_surrogates as ks
from wattcast.models import lgbm_forest
from wattcast.models.kernel_bundle import load_bundle

pytestmark = pytest.mark.skipif(lgbm_forest._walk_rows is None, reason="numba is not available")


def _bench_generator():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kernels.py"
    return load_script(path, "bench_kernels_for_tests").random_kernels


@pytest.fixture(scope="module")
def family_matrices():
    """Per family of the shipped bundle: (family model, its feature matrix) on 6,000 distinct benchmark kernels."""
    frame = _bench_generator()(6000, seed=3, distinct=True)
    canon, err = kp.normalise_kernel_frame(frame)
    assert (err == "").all()
    X = featurize_kernels(canon, resolve_device("H100-SXM5-80GB"))
    bundle = load_bundle()
    fam = X["family"].to_numpy()
    out = {}
    for f in pd.unique(fam):
        fm = bundle.families[f]
        assert fm.lgbm is not None
        A = np.ascontiguousarray(kp._family_matrix(X, list(fm.features), np.flatnonzero(fam == f)))
        out[f] = (fm, A)
    return out


def _with_awkward_values(A: np.ndarray, seed: int = 0) -> np.ndarray:
    """``A`` with some NaN, zeros, values within 1e-35 of zero (LightGBM reads them as 0.0) and infinities."""
    rng = np.random.default_rng(seed)
    B = A.copy()
    B[rng.random(B.shape) < 0.01] = np.nan
    B[rng.random(B.shape) < 0.03] = 0.0
    tiny = rng.random(B.shape) < 0.02
    B[tiny] = 1e-36 * rng.choice([-1.0, 1.0], size=int(tiny.sum()))
    B[::7, 3] = np.inf
    B[::11, 4] = -np.inf
    return B


@pytest.mark.parametrize("chunk_rows", [lgbm_forest._CHUNK_ROWS, 300])
def test_compiled_forest_is_bit_identical_to_lightgbm_on_every_shipped_family(family_matrices, chunk_rows, monkeypatch):
    """Also with rows sorted and walked in chunks of 300 on two threads, each chunk its own specialised forest."""
    monkeypatch.setattr(lgbm_forest, "_CHUNK_ROWS", chunk_rows)
    assert set(family_matrices) == {"gemm", "elementwise", "ln", "softmax"}
    for f, (fm, A) in family_matrices.items():
        forest = lgbm_forest.compile_forest(fm.lgbm.booster)
        assert forest is not None and forest.nodes is not None, f
        for M in (A, _with_awkward_values(A), A[:1], A[:0], A[:301]):
            ref = fm.lgbm.booster.predict(M, num_threads=0)
            np.testing.assert_array_equal(forest.predict(M), ref, err_msg=f)
            np.testing.assert_array_equal(forest.predict(M, order_by=M.shape[1] - 1), ref, err_msg=f)
        # the surrogate's own forest (built from the text file the bundle was loaded from) is the same forest
        from_file = fm.lgbm.compiled_forest()
        np.testing.assert_array_equal(from_file.thr, forest.thr)
        np.testing.assert_array_equal(from_file.leaf, forest.leaf)
        np.testing.assert_array_equal(from_file.nodes.view(np.int64), forest.nodes.view(np.int64))


def test_forest_specialised_to_the_rows_feature_ranges_is_bit_identical(family_matrices):
    """Splits every row takes the same way (one device's descriptors, thresholds beyond the rows' range) are decided
    once: much shallower trees, the same sums, including rows at the range's ends and rows with NaN."""
    for f, (fm, A) in family_matrices.items():
        forest = lgbm_forest.compile_forest(fm.lgbm.booster)
        plain = (forest.nodes, forest.block_roots, forest.depth)
        nodes, roots, depth = forest._layout_for(A)
        assert depth.sum() < 0.8 * forest.depth.sum(), f
        ref = fm.lgbm.booster.predict(A, num_threads=0)
        for layout in (plain, (nodes, roots, depth)):
            out = np.empty(len(A))
            lgbm_forest._walk_blocks(A, *layout, len(forest.feat), out)
            np.testing.assert_array_equal(out, ref, err_msg=f)
        # rows whose values sit exactly on split thresholds (the range ends are thresholds), other devices' values
        rng = np.random.default_rng(4)
        B = A[:3000].copy()
        fe = forest.feat[rng.integers(0, len(forest.feat), size=B.size)].reshape(B.shape)
        on = rng.random(B.shape) < 0.3
        cols = np.broadcast_to(np.arange(B.shape[1]), B.shape)
        thr = forest.thr[rng.integers(0, len(forest.thr), size=B.size)].reshape(B.shape)
        B[on & (fe == cols)] = thr[on & (fe == cols)]
        B[::5] = np.where(rng.random(B[::5].shape) < 0.5, B[::5] * 1.5, B[::5])
        B[::13, 2] = np.nan
        for M in (B, B[:1], B[:2], np.repeat(B[:1], 50, axis=0)):
            np.testing.assert_array_equal(forest.predict(M), fm.lgbm.booster.predict(M, num_threads=0), err_msg=f)


def test_surrogate_uses_the_compiled_forest_for_large_matrices(family_matrices, monkeypatch):
    fm, A = family_matrices["gemm"]
    ref = fm.lgbm.booster.predict(A, num_threads=0)
    monkeypatch.setattr(ks, "COMPILED_MIN_ROWS", 1)
    monkeypatch.setattr(ks, "COMPILE_AFTER_ROWS", 0)
    calls = []
    assert isinstance(fm.lgbm.compiled_forest(), lgbm_forest.CompiledForest)
    orig = lgbm_forest.CompiledForest.predict
    monkeypatch.setattr(lgbm_forest.CompiledForest, "predict",
                        lambda self, M, order_by=None: (calls.append((len(M), order_by)), orig(self, M, order_by))[1])
    got = fm.lgbm.predict_matrix(A)
    assert calls == [(len(A), fm.features.index("log_t_roof_ms"))]
    np.testing.assert_array_equal(got, ref)


def test_lightgbm_predicts_until_the_process_has_paid_for_compiling(monkeypatch):
    """A surrogate compiles its forest only once large matrices worth COMPILE_AFTER_ROWS rows went through LightGBM."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(3000, 4))
    sur = ks.LGBMSurrogate(["a", "b", "c", "d"], num_boost_round=20).fit(pd.DataFrame(X, columns=list("abcd")), X[:, 0])
    monkeypatch.setattr(ks, "COMPILED_MIN_ROWS", 1000)
    monkeypatch.setattr(ks, "COMPILE_AFTER_ROWS", 2500)
    monkeypatch.setattr(ks, "_lgbm_large_rows", [0])
    ref = sur.booster.predict(X)
    np.testing.assert_array_equal(sur.predict_matrix(X[:999]), ref[:999])  # small: LightGBM, not counted
    assert sur._forest is None and ks._lgbm_large_rows == [0]
    np.testing.assert_array_equal(sur.predict_matrix(X[:2000]), ref[:2000])  # large: LightGBM, counted
    assert sur._forest is None and ks._lgbm_large_rows == [2000]
    np.testing.assert_array_equal(sur.predict_matrix(X[:2000]), ref[:2000])
    assert sur._forest is None and ks._lgbm_large_rows == [4000]
    np.testing.assert_array_equal(sur.predict_matrix(X), ref)  # paid for: compiled from now on
    assert isinstance(sur._forest, lgbm_forest.CompiledForest) and ks._lgbm_large_rows == [4000]


def test_predict_kernels_is_unchanged_by_the_compiled_forest(monkeypatch):
    """The whole output (predictions, bands, OOD) with every LightGBM call compiled equals the plain LightGBM one."""
    frame = _bench_generator()(4000, seed=5, distinct=True)
    spec = resolve_device("L4")  # a power-limited board: the FP32 GEMM cap is in the path too
    bundle = load_bundle()
    monkeypatch.setattr(ks, "COMPILED_MIN_ROWS", 10**12)
    plain = kp.predict_kernels(frame, spec, bundle=bundle)
    monkeypatch.setattr(ks, "COMPILED_MIN_ROWS", 1)
    monkeypatch.setattr(ks, "COMPILE_AFTER_ROWS", 0)
    monkeypatch.setattr(lgbm_forest, "_CHUNK_ROWS", 256)  # sorted chunks, two threads
    compiled = kp.predict_kernels(frame, spec, bundle=bundle)
    # the families whose chosen model runs LightGBM (ln's is the MLP; no conv rows here) went through the forest
    used = [f for f in ("gemm", "elementwise", "ln", "softmax") if bundle.families[f].choice in ("lgbm", "ens")]
    assert {"gemm", "elementwise"} <= set(used)
    assert all(isinstance(bundle.families[f].lgbm._forest, lgbm_forest.CompiledForest) for f in used)
    pd.testing.assert_frame_equal(compiled, plain, check_exact=True)


def _train(X, y, **params):
    import lightgbm as lgb

    p = {"objective": "l2", "verbose": -1, "num_threads": 1, "min_data_in_leaf": 5, "seed": 0, **params}
    return lgb.train(p, lgb.Dataset(X, label=y), num_boost_round=30)


def test_missing_value_rules_match_lightgbm():
    """NaN-as-missing and zero-as-missing splits (default side learned), NaN on splits without a missing side."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 5))
    X[rng.random(X.shape) < 0.15] = np.nan
    X[rng.random(X.shape) < 0.15] = 0.0
    y = np.nan_to_num(X[:, 0]) * 2 + np.isnan(X[:, 1]) * 3 - (X[:, 2] == 0) * 2 + rng.normal(size=3000) * 0.1
    Xq = _with_awkward_values(rng.normal(size=(4000, 5)), seed=1)
    for params in ({}, {"zero_as_missing": True}, {"use_missing": False}):
        booster = _train(X, y, **params)
        forest = lgbm_forest.compile_forest(booster)
        assert forest is not None
        if params.get("zero_as_missing"):
            assert (forest.miss == 1).any() and forest.nodes is None  # zero-as-missing: the per-row walk only
        else:
            assert forest.nodes is not None
        np.testing.assert_array_equal(forest.predict(Xq), booster.predict(Xq, num_threads=1), err_msg=str(params))


def test_models_the_compiled_walk_does_not_reproduce_stay_with_lightgbm():
    import lightgbm as lgb

    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 3))
    y = X[:, 0] + rng.normal(size=600) * 0.1
    assert lgbm_forest.compile_forest(_train(X, (y > 0).astype(float), objective="binary")) is None  # sigmoid output
    X[:, 1] = rng.integers(0, 8, size=600)
    y = y + 5.0 * np.isin(X[:, 1], (1, 3, 6))
    booster = lgb.train({"objective": "l2", "verbose": -1, "min_data_in_leaf": 5, "min_data_per_group": 5,
                         "cat_smooth": 1, "num_threads": 1},
                        lgb.Dataset(X, label=y, categorical_feature=[1]), num_boost_round=10)
    assert any(ln.startswith("num_cat=") and ln != "num_cat=0" for ln in booster.model_to_string().splitlines())
    assert lgbm_forest.compile_forest(booster) is None  # categorical splits


def test_wrong_width_is_a_clear_error(family_matrices):
    fm, A = family_matrices["ln"]
    forest = lgbm_forest.compile_forest(fm.lgbm.booster)
    with pytest.raises(ValueError, match=r"\(n, 23\) array"):
        forest.predict(A[:, :-1])
