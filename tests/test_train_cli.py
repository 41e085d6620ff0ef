"""End-to-end `wattcast train kernels` on the real data: bundle files, held-out discipline, MLflow, the gate.

The shared-data training (``--quick``, ~45 s on 2 cores) runs once, in a background subprocess that
conftest starts as soon as collection selects this module, so the other tests run beside it.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wattcast.models.kernel_bundle import resolve_bundle_folder

from conftest import CONTRACT_COLUMNS, BackgroundTraining, flat, run_cli

pytestmark = pytest.mark.e2e

HELDOUT = ("L4", "A100-PCIe-80GB")
PICKLES = (".pkl", ".pickle", ".joblib")


@pytest.fixture(scope="module", autouse=True)
def training(request, tmp_path_factory, data_root) -> BackgroundTraining:
    """The background training started by conftest at collection time (or now, if it was not)."""
    t = getattr(request.config, "_wattcast_training", None)
    if t is None:
        t = BackgroundTraining(tmp_path_factory.mktemp("train"), data_root)
        request.config._wattcast_training = t
    return t


@pytest.fixture(scope="module")
def trained(training) -> BackgroundTraining:
    r = training.result()
    assert r.returncode == 0, r.stdout[-4000:]
    assert "Traceback" not in r.stdout, r.stdout[-4000:]
    return training


def _hashes(folder: Path) -> dict[str, str]:
    live = resolve_bundle_folder(folder)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(live.iterdir()) if p.is_file()}


def _live(folder: Path) -> Path:
    """The folder of a retrained bundle's live version (versions/<CURRENT>)."""
    return resolve_bundle_folder(folder)


# ------------------------------------------------------------------------------ user CSV
@pytest.fixture(scope="module")
def user_csv(tmp_path_factory, data_root) -> Path:
    """~400 measured T4 kernels (bmm, add, ln) in the documented user schema."""
    base = data_root / "neusight" / "kernels"
    parts = []
    for op, cols, n in (("bmm", ["B", "M", "N", "K"], 140), ("add", ["B", "H"], 130), ("ln", ["B", "H"], 130)):
        f = base / op / "Tesla_T4.csv"
        if not f.is_file():
            pytest.skip(f"{f} not present")
        d = pd.read_csv(f)
        parts.append(d.sample(n, random_state=0)[["OPName", "Latency", "Device", *cols]])
    user = pd.concat(parts, ignore_index=True)[["OPName", "Latency", "Device", "B", "M", "N", "K", "H"]]
    assert len(user) == 400
    path = tmp_path_factory.mktemp("user") / "t4_kernels.csv"
    user.to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def user_bundle(tmp_path_factory, user_csv) -> Path:
    out = tmp_path_factory.mktemp("user_train") / "bundle2"
    # the tests' working bundle: a new --out is judged against the shipped bundle (since stop 54), which this T4-only
    # bundle (no conv, softmax) does not match, so it is installed with --force
    r = run_cli("train", "kernels", "--csv", user_csv, "--only-csv", "--quick", "--out", out, "--no-mlflow", "--force",
                cwd=out.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "made current by --force although the gate would have" in flat(r.stdout), flat(r.stdout)
    assert "rerun with --force" not in flat(r.stdout) and "not made current" not in flat(r.stdout), flat(r.stdout)
    assert "Traceback" not in r.stderr
    return out


def test_user_csv_training_writes_a_bundle(user_bundle, user_csv, tmp_path):
    names = {p.name for p in _live(user_bundle).iterdir()}
    assert "kernel_manifest.json" in names
    assert {"kernel_gemm.lgbm.txt", "kernel_elementwise.lgbm.txt", "kernel_ln.lgbm.txt"} <= names
    assert not [n for n in names if n.endswith(PICKLES)]
    manifest = json.loads((_live(user_bundle) / "kernel_manifest.json").read_text())
    assert manifest["train_devices"] == ["Tesla-T4"]
    # the new bundle predicts (its families; the others fall back to the roofline)
    r = run_cli("kernels", "--device", "Tesla-T4", "--input", user_csv, "--models", user_bundle)
    assert r.returncode == 0, r.stderr
    out = pd.read_csv(io.StringIO(r.stdout))
    assert len(out) == 400 and all(c in out for c in CONTRACT_COLUMNS)
    assert np.isfinite(out["pred_latency_ms"]).all()


def test_retraining_one_family_keeps_the_others_byte_for_byte(user_bundle, user_csv, tmp_path):
    import shutil

    out = tmp_path / "partial"
    shutil.copytree(_live(user_bundle), out)
    # as if its GEMM family had been trained with an extra XLA table: a retraining that keeps GEMM keeps that record
    m = json.loads((out / "kernel_manifest.json").read_text())
    (out / "kernel_manifest.json").write_text(json.dumps(dict(m, xla_tables=["xla_gemm_table.csv"])))
    before = _hashes(out)
    base_metrics = m["metrics"]
    r = run_cli("train", "kernels", "--csv", user_csv, "--only-csv", "--quick", "--family", "ln", "--out", out, "--no-mlflow",
                cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    said = flat(r.stdout + r.stderr)
    assert "retrained ln; kept " in said and "gemm" in said.split("retrained ln; kept ")[1][:40]
    after = _hashes(out)
    for name in ("kernel_gemm.lgbm.txt", "kernel_elementwise.lgbm.txt"):
        assert after[name] == before[name], name
    manifest = json.loads((_live(out) / "kernel_manifest.json").read_text())
    assert manifest["retrained_families"] == ["ln"]
    assert manifest["xla_tables"] == ["xla_gemm_table.csv"]
    # a kept family's in-distribution figure is the one of the run that fitted it, not one on this run's split
    assert manifest["metrics"]["indist_elementwise_mape_pct"] == base_metrics["indist_elementwise_mape_pct"]
    assert set(manifest["families"]) == {"gemm", "elementwise", "ln"}


def test_spec_monotone_is_opt_in_and_recorded_per_family(user_bundle, user_csv, tmp_path):
    """The default recipe fits free trees (the manifest's ``spec_monotone`` empty per family, LayerNorm reads the watts
    per TFLOP); ``--spec-monotone`` fits the retrained family's LightGBM with the constraints, without that feature,
    and the manifest says so for it alone (a kept family keeps its own, empty, record)."""
    live = _live(user_bundle)
    manifest = json.loads((live / "kernel_manifest.json").read_text())
    assert manifest["spec_monotone"] == {f: {} for f in manifest["families"]}
    assert "dev_log_w_per_tflop" in manifest["families"]["ln"]["features"]
    assert all("[monotone_constraints: ]" in p.read_text() for p in live.glob("*.lgbm.txt"))  # LightGBM's "none"
    out = tmp_path / "mono"
    shutil.copytree(live, out)
    r = run_cli("train", "kernels", "--csv", user_csv, "--only-csv", "--quick", "--family", "ln", "--spec-monotone",
                "--out", out, "--no-mlflow", "--force", cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    mono = json.loads((_live(out) / "kernel_manifest.json").read_text())
    assert mono["spec_monotone"]["ln"] == {"log_t_mem_ms": -1, "log_ws_over_l2": 1, "row_wave_eff": -1,
                                           "log_numel_per_sm": 1, "log_rows_per_sm": 1, "log_elem_waves": 1}
    assert mono["spec_monotone"]["gemm"] == {} and mono["spec_monotone"]["elementwise"] == {}
    assert "dev_log_w_per_tflop" not in mono["families"]["ln"]["features"]
    assert "[monotone_constraints_method: advanced]" in (_live(out) / "kernel_ln.lgbm.txt").read_text()
    assert "[monotone_constraints: ]" in (_live(out) / "kernel_gemm.lgbm.txt").read_text()


def test_retraining_one_family_needs_a_bundle_and_a_known_family(user_csv, tmp_path):
    # a new --out takes the other families from the shipped bundle (since stop 54; README "A `--family` run into a new
    # `--out` takes the other families from the shipped bundle"; until then it was refused)
    r = run_cli("train", "kernels", "--csv", user_csv, "--only-csv", "--quick", "--family", "ln", "--out", tmp_path / "none",
                "--no-mlflow", cwd=tmp_path)
    assert "Traceback" not in r.stderr
    assert "no bundle at" in flat(r.stdout + r.stderr) and "the other families are taken from the shipped bundle" in flat(
        r.stdout + r.stderr)
    # a bundle folder whose CURRENT names a missing version is broken, not empty: nothing to take the families from
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "CURRENT").write_text("v-missing\n")
    r = run_cli("train", "kernels", "--csv", user_csv, "--only-csv", "--quick", "--family", "ln", "--out", broken,
                "--no-mlflow", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "train every family first" in flat(r.stderr)
    r = run_cli("train", "kernels", "--csv", user_csv, "--only-csv", "--quick", "--family", "attention", "--out",
                tmp_path / "none", "--no-mlflow", cwd=tmp_path)
    assert r.returncode != 0 and "unknown op family ['attention']" in flat(r.stderr)


def test_corrupted_csv_does_not_replace_the_bundle(user_bundle, user_csv, tmp_path):
    target = tmp_path / "bundle2"
    shutil.copytree(user_bundle, target)
    before = _hashes(target)
    bad = pd.read_csv(user_csv)
    bad["Latency"] = bad["Latency"] * 50
    bad_csv = tmp_path / "corrupted.csv"
    bad.to_csv(bad_csv, index=False)
    r = run_cli("train", "kernels", "--csv", bad_csv, "--only-csv", "--quick", "--out", target, "--no-mlflow", cwd=tmp_path)
    assert "Traceback" not in r.stderr
    assert r.returncode != 0, flat(r.stdout)
    # since stop 50 refused before training by the unit check (median ~100x+ the roofline); before, by the gate's
    # shared-data veto ("kept the existing bundle")
    assert "Latency is read in milliseconds" in flat(r.stdout + r.stderr)
    assert _hashes(target) == before


def _train_rejected(bad: pd.DataFrame, tmp_path) -> str:
    """Train on ``bad`` alone: it must fail cleanly and write no bundle; returns stderr (flattened)."""
    path = tmp_path / "bad.csv"
    bad.to_csv(path, index=False)
    r = run_cli("train", "kernels", "--csv", path, "--only-csv", "--quick", "--out", tmp_path / "b", "--no-mlflow", cwd=tmp_path)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "b" / "CURRENT").exists() and not (tmp_path / "b" / "kernel_manifest.json").exists()
    return flat(r.stderr)


def test_csv_without_latency_column_fails_naming_it(user_csv, tmp_path):
    msg = _train_rejected(pd.read_csv(user_csv).drop(columns=["Latency"]), tmp_path)
    assert "'Latency'" in msg and "missing column" in msg


def test_csv_with_negative_latency_names_the_row(user_csv, tmp_path):
    bad = pd.read_csv(user_csv)
    bad.loc[7, "Latency"] = -0.5
    msg = _train_rejected(bad, tmp_path)
    assert "line 9" in msg  # header is line 1, so data row 7 (0-based) is line 9
    assert "-0.5" in msg


def test_csv_on_a_gpu_outside_the_catalog_needs_and_takes_a_spec(user_csv, my_gpu_yaml, tmp_path):
    df = pd.read_csv(user_csv).assign(Device="RTX-4090")
    path = tmp_path / "rtx.csv"
    df.to_csv(path, index=False)
    r = run_cli("train", "kernels", "--csv", path, "--only-csv", "--quick", "--out", tmp_path / "b", "--no-mlflow", cwd=tmp_path)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert "--spec" in flat(r.stderr) and "RTX-4090" in flat(r.stderr)
    # (--force: a new --out is judged against the shipped bundle, whose conv and softmax this CSV lacks; the spec is
    # what this test is about)
    r = run_cli("train", "kernels", "--csv", path, "--only-csv", "--spec", my_gpu_yaml, "--quick", "--out", tmp_path / "b",
                "--no-mlflow", "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((_live(tmp_path / "b") / "kernel_manifest.json").read_text())["train_devices"] == ["RTX-4090"]


def test_only_csv_without_csv_fails_cleanly(tmp_path):
    r = run_cli("train", "kernels", "--only-csv", "--quick", "--out", tmp_path / "b", "--no-mlflow", cwd=tmp_path)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert "--csv" in flat(r.stderr)


# ------------------------------------------------------------------------------ shared-data training
def test_training_writes_a_pickle_free_bundle(trained):
    names = {p.name for p in _live(trained.bundle).iterdir()}
    assert "kernel_manifest.json" in names
    assert "kernel_mlp.safetensors" in names
    lgbm = sorted(n for n in names if n.endswith(".lgbm.txt"))
    assert {"kernel_gemm.lgbm.txt", "kernel_elementwise.lgbm.txt", "kernel_ln.lgbm.txt", "kernel_softmax.lgbm.txt"} <= set(lgbm)
    for n in lgbm:
        assert (_live(trained.bundle) / n).read_text()[:4] == "tree"  # LightGBM text format
    pickles = [p for p in trained.base.rglob("*") if p.suffix.lower() in PICKLES]
    assert not pickles, pickles


def test_an_extra_xla_table_trains_its_gpu_and_is_named_in_the_manifest(trained):
    manifest = json.loads((_live(trained.bundle) / "kernel_manifest.json").read_text())
    assert manifest["xla_tables"] == [trained.xla_table.name]
    said = flat(trained.result().stdout)
    assert f"extra XLA GEMM tables: {trained.xla_table}" in said
    # its sm_90 row is withheld hardware: said, and not trained on
    assert "left out 1 rows on hardware the shared datasets withhold" in said
    assert "MI300X" in manifest["train_devices"] and "H100-SXM5-80GB" not in manifest["train_devices"]


def test_a_bad_xla_table_is_refused_before_training(tmp_path):
    r = run_cli("train", "kernels", "--quick", "--out", tmp_path / "b", "--no-mlflow", "--xla-table", tmp_path / "none.whl",
                cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "--xla-table" in flat(r.stderr) and "does not exist" in flat(r.stderr)
    notes = tmp_path / "notes.txt"
    notes.write_text("not a table")
    r = run_cli("train", "kernels", "--quick", "--out", tmp_path / "b", "--no-mlflow", "--xla-table", notes, cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "not an XLA GEMM table" in flat(r.stderr)
    assert not list((tmp_path / "b").rglob("kernel_manifest.json"))


def test_manifest_excludes_the_heldout_gpus(trained):
    manifest = json.loads((_live(trained.bundle) / "kernel_manifest.json").read_text())
    train_devices = set(manifest["train_devices"])
    assert len(train_devices) >= 5
    for h in HELDOUT:
        assert h not in train_devices
    assert set(HELDOUT) <= set(manifest["holdout_devices"])
    assert {"gemm", "elementwise", "ln", "softmax"} <= set(manifest["families"])


def test_mlflow_run_has_heldout_metrics_and_plots(trained, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    # the store keeps artifact paths relative to its parent folder (where it was written from)
    monkeypatch.chdir(trained.base)
    db = trained.mlruns / "mlflow.db"
    assert db.is_file()
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(search_all_experiments=True)
    assert len(runs) >= 1
    run = runs.iloc[0]
    heldout = [c for c in runs.columns if c.startswith("metrics.heldout_")]
    assert heldout, list(runs.columns)
    assert any(h in c for c in heldout for h in HELDOUT)
    vals = run[heldout].astype(float)
    assert np.isfinite(vals.dropna()).all() and vals.notna().any()
    assert "metrics.train_seconds" in runs.columns and run["metrics.train_seconds"] > 0
    from mlflow.tracking import MlflowClient

    arts = {a.path for a in MlflowClient().list_artifacts(run["run_id"])}
    pngs = {a for a in arts if a.endswith(".png")}
    for h in HELDOUT:
        assert any(h in p for p in pngs), (h, sorted(arts))


def test_predicting_with_the_trained_bundle(trained, examples_csv, tmp_path):
    out_csv = tmp_path / "out.csv"
    r = run_cli("kernels", "--device", "L4", "--input", examples_csv, "--models", trained.bundle, "--output", out_csv)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    out = pd.read_csv(out_csv)
    inp = pd.read_csv(examples_csv)
    assert len(out) == len(inp)
    assert list(out.columns[: len(inp.columns)]) == list(inp.columns)
    assert all(c in out for c in CONTRACT_COLUMNS)
    p = out["pred_latency_ms"].to_numpy(dtype=float)
    assert np.isfinite(p).all() and (p > 0).all()
    assert (out["pred_low_ms"] <= out["pred_latency_ms"]).all() and (out["pred_latency_ms"] <= out["pred_high_ms"]).all()


def test_a_partial_retraining_lists_the_gpus_its_families_were_trained_on():
    from wattcast.models.kernel_bundle import KernelBundle
    from wattcast.training.kernel_run import _merge_families

    base = KernelBundle({"gemm": "g0", "ln": "l0"},
                        {"train_devices": ["A", "H"], "family_train_devices": {"gemm": ["A", "H"], "ln": ["A"]}})
    new = KernelBundle({"gemm": "g1"}, {"train_devices": ["A"], "family_train_devices": {"gemm": ["A"]}})
    merged = _merge_families(base, new)
    # the GPU only the old GEMM family was trained on leaves with it
    assert merged.train_devices == ["A"] and merged.meta["family_train_devices"] == {"ln": ["A"], "gemm": ["A"]}
    assert merged.families == {"gemm": "g1", "ln": "l0"}
    # a base without the per-family record keeps its whole list
    old = KernelBundle({"gemm": "g0", "ln": "l0"}, {"train_devices": ["A", "H"]})
    assert _merge_families(old, new).train_devices == ["A", "H"]
