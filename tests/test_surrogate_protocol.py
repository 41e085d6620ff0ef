"""One Surrogate protocol and one registry for the kernel latency surrogates (models/kernel_surrogates.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from wattcast.models.kernel_bundle import MANIFEST, BundleError, FamilyModel, KernelBundle, load_bundle
from wattcast.models.kernel_surrogates import (CANDIDATES, CHOICES, SURROGATES, LGBMSurrogate, MLPSurrogate,
                                               RooflineSurrogate, Surrogate, choice_members, surrogate_class)


def _tiny_mlp(features):
    k = len(features)
    rng = np.random.default_rng(0)
    w = {"mean": np.zeros(k), "std": np.ones(k), "fill": np.zeros(k), "w0": rng.normal(size=(4, k)), "b0": np.zeros(4),
         "w1": rng.normal(size=(1, 4)), "b1": np.zeros(1)}
    return MLPSurrogate(features, w)


def test_every_registered_surrogate_follows_the_protocol_under_its_name():
    assert set(SURROGATES) == {"roofline", "lgbm", "mlp"}
    feats = ["a", "b"]
    X = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [0.5, np.nan, 1.5]})
    made = {"roofline": RooflineSurrogate(0.25), "lgbm": None, "mlp": _tiny_mlp(feats)}
    lg = LGBMSurrogate(feats, params={"min_data_in_leaf": 1, "num_threads": 1}, num_boost_round=3)
    made["lgbm"] = lg.fit(pd.concat([X] * 10, ignore_index=True), np.linspace(-1, 1, 30))
    for name, m in made.items():
        assert isinstance(m, Surrogate) and surrogate_class(name) is type(m) and m.name == name
        by_frame = m.predict(X)
        assert by_frame.shape == (3,) and np.isfinite(by_frame).all()
        np.testing.assert_array_equal(by_frame, m.predict_matrix(X[feats].to_numpy(dtype=np.float64)))


def test_choices_name_the_surrogates_they_run():
    assert CANDIDATES == ("lgbm", "mlp", "ens")
    assert CHOICES["ens"] == ("lgbm", "mlp") and CHOICES["roofline"] == ()
    assert all(set(m) <= set(SURROGATES) for m in CHOICES.values())
    with pytest.raises(ValueError, match=r"unknown kernel model choice 'lgmb' \(did you mean 'lgbm'\?\); known: lgbm, mlp, ens, "
                                         r"roofline"):
        choice_members("lgmb")
    with pytest.raises(ValueError, match="unknown kernel surrogate 'xgboost'; known: roofline, lgbm, mlp"):
        surrogate_class("xgboost")


def test_a_family_runs_the_members_of_its_choice():
    bundle = load_bundle()
    seen = set()
    for fm in bundle.families.values():
        seen.add(fm.choice)
        assert [m.name for m in fm.members()] == list(CHOICES[fm.choice])
        A = np.full((5, len(fm.features)), np.nan)
        A[:, :] = np.linspace(1.0, 1e6, 5)[:, None]
        p, spread = fm.predict_log_ratio_matrix(A)
        preds = [m.predict_matrix(A) for m in fm.members()]
        np.testing.assert_array_equal(p, sum(preds) / len(preds))
        assert (spread >= 0).all() and (spread > 0).any() == (len(preds) == 2 and not np.array_equal(*preds))
    assert "ens" in seen
    # without its learned models a family falls back to the roofline offset
    fm = next(iter(bundle.families.values()))
    bare = FamilyModel(fm.family, fm.features, fm.choice, fm.band_log, fm.support, fallback_offset=0.3)
    p, spread = bare.predict_log_ratio_matrix(np.zeros((2, len(fm.features))))
    assert p.tolist() == [0.3, 0.3] and spread.tolist() == [0.0, 0.0]


def test_an_unknown_choice_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match="unknown kernel model choice 'ensemble'"):
        FamilyModel("gemm", ["a"], "ensemble", (-0.1, 0.1), {"a": (0.0, 1.0)}, 0.0)
    KernelBundle({"gemm": FamilyModel("gemm", ["a"], "roofline", (-0.1, 0.1), {"a": (0.0, 1.0)}, 0.0)}).save(tmp_path)
    m = json.loads((tmp_path / MANIFEST).read_text())
    assert KernelBundle.load(tmp_path).families["gemm"].members() == []
    m["families"]["gemm"]["choice"] = "ensemble"
    (tmp_path / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(BundleError, match=r"kernel_manifest.json: family 'gemm': 'choice': unknown kernel model choice "
                                          r"'ensemble'; known: lgbm, mlp, ens, roofline"):
        KernelBundle.load(tmp_path)


def test_mlp_row_prediction_does_not_depend_on_the_rest_of_the_batch():
    """A row's MLP prediction is bit-identical whatever it is predicted with (batch size, position): a kernel's cached
    prediction (simulate.single_device) is then the same whichever job predicted it first. Before, ragged BLAS
    remainders rounded ~1% of rows differently (audit 42: a cp=4 step after an fp8 step moved 1e-10)."""
    bundle = load_bundle(None)
    rng = np.random.default_rng(1)
    for family in ("gemm", "elementwise"):
        mlp = [m for m in bundle.families[family].members() if m.name == "mlp"]
        if not mlp:
            pytest.skip("the shipped bundle has no MLP member")
        m = mlp[0]
        pool = rng.uniform(m.lo, m.hi, (3000, len(m.features)))
        targets = pool[:20]
        alone = np.array([m.predict_matrix(targets[i : i + 1])[0] for i in range(len(targets))])
        for n in [*range(2, 70), 127, 129, 255, 257, 2047, 2049, 2111]:
            A = pool[rng.integers(20, len(pool), n)].copy()
            pos = rng.choice(n, min(n, 20), replace=False)
            which = rng.integers(0, len(targets), len(pos))
            A[pos] = targets[which]
            np.testing.assert_array_equal(m.predict_matrix(A)[pos], alone[which], err_msg=f"{family}, {n} rows")
