"""Retraining can never break a working kernel bundle: versioned folders, one atomic pointer switch, hashes checked
before any model file is parsed, clear errors for damaged files (never a LightGBM abort), concurrent switches."""

from __future__ import annotations

import json
import shutil
import threading

import numpy as np
import pandas as pd
import pytest

from conftest import run_cli
from wattcast.models import kernel_bundle as kb
from wattcast.models.kernel_bundle import BundleError, KernelBundle, install_bundle, resolve_bundle_folder

ROWS = pd.DataFrame({"OPName": ["bmm", "add"], "B": [4, 64], "M": [512, np.nan], "N": [512, np.nan],
                     "K": [512, np.nan], "H": [np.nan, 4096]})


@pytest.fixture()
def shipped_copy(tmp_path):
    """The shipped bundle in a folder of its own (flat layout, with hashes)."""
    d = tmp_path / "bundle"
    shutil.copytree(kb.shipped_folder(), d, ignore=shutil.ignore_patterns("collective*", "power*"))
    return d


def test_install_switches_with_a_pointer_and_keeps_the_previous(shipped_copy):
    b = KernelBundle.load(shipped_copy)
    v1 = install_bundle(b, shipped_copy)
    assert resolve_bundle_folder(shipped_copy) == v1 and (shipped_copy / "CURRENT").read_text().strip() == v1.name
    v2 = install_bundle(b, shipped_copy)
    assert resolve_bundle_folder(shipped_copy) == v2 and v1.is_dir()  # the previous version is kept
    manifest = json.loads((v2 / "kernel_manifest.json").read_text())
    assert set(manifest["files"]) >= {"kernel_gemm.lgbm.txt", "kernel_mlp.safetensors"}
    assert len(KernelBundle.load(shipped_copy).families) == len(b.families)


def test_a_crash_while_writing_leaves_the_old_bundle_live(shipped_copy, monkeypatch):
    b = KernelBundle.load(shipped_copy)
    v1 = install_bundle(b, shipped_copy)
    before = (shipped_copy / "CURRENT").read_text()
    real_save = KernelBundle.save

    def half_save(self, folder):
        real_save(self, folder)
        next(iter(sorted(folder.glob("*.lgbm.txt")))).write_text("tree\nversion=v4\n")  # a model file cut short
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(KernelBundle, "save", half_save)
    with pytest.raises(KeyboardInterrupt):
        install_bundle(b, shipped_copy)
    monkeypatch.setattr(KernelBundle, "save", real_save)
    assert (shipped_copy / "CURRENT").read_text() == before and resolve_bundle_folder(shipped_copy) == v1
    assert len(KernelBundle.load(shipped_copy).families) == len(b.families)


def test_a_damaged_or_changed_model_file_is_named(shipped_copy):
    gemm = shipped_copy / "kernel_gemm.lgbm.txt"
    text = gemm.read_text()
    gemm.write_text(text[: len(text) // 3])
    with pytest.raises(BundleError, match="kernel_gemm.lgbm.txt is damaged or was changed"):
        KernelBundle.load(shipped_copy)
    gemm.write_text(text.replace("tree_sizes", "tree_sizes", 1) + "\n")  # one byte more
    with pytest.raises(BundleError, match="sha256"):
        KernelBundle.load(shipped_copy)


def test_older_manifests_without_hashes_still_catch_truncated_models(shipped_copy):
    m = json.loads((shipped_copy / "kernel_manifest.json").read_text())
    m.pop("files")
    (shipped_copy / "kernel_manifest.json").write_text(json.dumps(m))
    KernelBundle.load(shipped_copy)  # intact files load without hashes
    gemm = shipped_copy / "kernel_gemm.lgbm.txt"
    gemm.write_text(gemm.read_text()[:5000])
    with pytest.raises(BundleError, match="not a complete LightGBM text model"):
        KernelBundle.load(shipped_copy)


def test_truncated_safetensors_is_a_clear_error(shipped_copy):
    m = json.loads((shipped_copy / "kernel_manifest.json").read_text())
    m.pop("files")  # no hash to catch it first: the safetensors reader must
    (shipped_copy / "kernel_manifest.json").write_text(json.dumps(m))
    st = shipped_copy / "kernel_mlp.safetensors"
    st.write_bytes(st.read_bytes()[:100])
    with pytest.raises(BundleError, match="kernel_mlp.safetensors is not a readable safetensors file"):
        KernelBundle.load(shipped_copy)


def test_cli_with_a_damaged_bundle_exits_cleanly_not_with_an_abort(shipped_copy, tmp_path):
    m = json.loads((shipped_copy / "kernel_manifest.json").read_text())
    m.pop("files")
    (shipped_copy / "kernel_manifest.json").write_text(json.dumps(m))
    gemm = shipped_copy / "kernel_gemm.lgbm.txt"
    gemm.write_text(gemm.read_text()[:3000])  # LightGBM's own parser would abort the process on this
    csv = tmp_path / "k.csv"
    ROWS.to_csv(csv, index=False)
    r = run_cli("kernels", "--device", "H100-SXM5-80GB", "--input", str(csv), "--models", str(shipped_copy))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "kernel_gemm.lgbm.txt" in r.stderr and "Traceback" not in r.stderr


def test_concurrent_switches_leave_one_valid_live_bundle(shipped_copy):
    b = KernelBundle.load(shipped_copy)
    errors = []

    def go():
        try:
            install_bundle(b, shipped_copy)
        except Exception as e:  # pragma: no cover - the assertion below reports it
            errors.append(e)

    threads = [threading.Thread(target=go) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    live = resolve_bundle_folder(shipped_copy)
    assert live.parent.name == "versions" and len(KernelBundle.load(shipped_copy).families) == len(b.families)
    assert not list((shipped_copy / "versions").glob(".tmp-*"))


def test_a_pointer_to_a_missing_version_is_named(shipped_copy):
    (shipped_copy / "CURRENT").write_text("20990101T000000-deadbeef\n")
    with pytest.raises(BundleError, match="names bundle version '20990101T000000-deadbeef'"):
        KernelBundle.load(shipped_copy)


def test_collective_and_power_models_are_checked_before_lightgbm_parses_them(tmp_path):
    from wattcast.models.collectives import CollectiveModel, shipped_folder

    d = tmp_path / "coll"
    d.mkdir()
    for f in ("collective_correction.txt", "collective_manifest.json"):
        shutil.copy(shipped_folder() / f, d / f)
    CollectiveModel.load(d)
    m = d / "collective_correction.txt"
    m.write_text(m.read_text()[:2000])
    with pytest.raises(ValueError, match="collective_correction.txt is damaged or was changed"):
        CollectiveModel.load(d)
    j = json.loads((d / "collective_manifest.json").read_text())
    j.pop("model_sha256")
    (d / "collective_manifest.json").write_text(json.dumps(j))
    with pytest.raises(ValueError, match="not a complete LightGBM text model"):
        CollectiveModel.load(d)


def _load_warnings(folder) -> list[str]:
    import warnings

    kb.load_bundle.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kb.load_bundle(str(folder))
        kb.load_bundle.cache_clear()
        kb.load_bundle(str(folder))  # loaded again: warned once per folder
    return [str(w.message) for w in caught if "feature_version" in str(w.message)]


@pytest.mark.parametrize("stamp", [None, 1])
def test_a_bundle_of_another_or_no_feature_version_warns_once(shipped_copy, stamp):
    """A bundle trained before a featurizer change (the fp8 GEMM's output bytes, feature version 2) is fed other
    features than it learned on: loading it warns, once."""
    path = shipped_copy / "kernel_manifest.json"
    manifest = json.loads(path.read_text())
    manifest.pop("feature_version", None)
    if stamp is not None:
        manifest["feature_version"] = stamp
    path.write_text(json.dumps(manifest))
    kb._FEATURE_VERSION_WARNED.discard(str(shipped_copy))
    msgs = _load_warnings(shipped_copy)
    assert len(msgs) == 1 and ("no feature_version" in msgs[0] if stamp is None else "feature_version 1" in msgs[0])


def test_the_shipped_bundle_carries_the_current_feature_version():
    from wattcast.featurize.kernel_features import FEATURE_VERSION

    manifest = json.loads((kb.shipped_folder() / "kernel_manifest.json").read_text())
    assert manifest["feature_version"] == FEATURE_VERSION
    assert _load_warnings(kb.shipped_folder()) == []


def test_a_partial_retrain_keeps_the_older_stamp_of_the_families_it_kept(shipped_copy):
    from wattcast.featurize.kernel_features import FEATURE_VERSION
    from wattcast.training.kernel_run import _merge_families

    base = KernelBundle.load(shipped_copy)
    old = KernelBundle(base.families, {k: v for k, v in base.meta.items() if k != "feature_version"})
    one = next(iter(base.families))
    new = KernelBundle({one: base.families[one]}, {"feature_version": FEATURE_VERSION})
    assert "feature_version" not in _merge_families(old, new).meta
    assert _merge_families(base, new).meta["feature_version"] == FEATURE_VERSION
