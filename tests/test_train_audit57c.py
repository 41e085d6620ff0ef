"""Audit 57c, `wattcast train` with a user's own data:

- an imported profile folder (`train kernels --data DIR`) is named, with its own lines, by the physics check, the
  unit check, the consistency gate and MLflow's `user_csv` param (they named a deleted temporary merged CSV, whose
  line numbers point at other rows of the folder's kernels.csv);
- a `--force` install says what happened, without the refusal's "not made current" and "rerun with --force";
- `--holdout NAME` accepts a GPU of the same command's `--spec` files by its name or an alias.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import flat, run_cli

REPO = Path(__file__).resolve().parents[1]
MY_GPU = REPO / "examples" / "my_gpu.yaml"  # RTX-4090, aliases "NVIDIA GeForce RTX 4090", "GeForce RTX 4090", "rtx4090"
TRACE = "a100_trace_diff_control.json.gz"


def _import(traces: Path, out: Path, *extra: str) -> Path:
    r = run_cli("profile", "import", traces / TRACE, *extra, "--output", out)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def prof_a100(traces, tmp_path_factory) -> Path:
    """The trace imported as measured (A100-SXM4-40GB): 5,214 mapped rows among 7,398 (the unmapped ones in between,
    so a row's line in kernels.csv is not its line in a file of the mapped rows alone)."""
    return _import(traces, tmp_path_factory.mktemp("imp") / "prof_a100")


@pytest.fixture(scope="module")
def prof_l4(traces, tmp_path_factory) -> Path:
    """The same A100 timings labelled L4 (`--device L4`): ~200 rows faster than the L4 can run them."""
    return _import(traces, tmp_path_factory.mktemp("imp") / "prof_l4", "--device", "L4")


def _said_rows(msg: str) -> list[tuple[str | None, int, str, dict, str]]:
    """(file or None, line, op, shape, dtype) of each row the physics refusal lists."""
    out = []
    for m in re.finditer(r"(?:(\S+\.csv) )?line (\d+): (\w+) ((?:[A-Z]=\d+ ?)+) (\w+) on ", msg):
        shape = {k: int(v) for k, v in (kv.split("=") for kv in m.group(4).split())}
        out.append((m.group(1), int(m.group(2)), m.group(3), shape, m.group(5)))
    return out


def _row_at(folder: Path, line: int) -> pd.Series:
    from wattcast.data.profiles.tables import read_table

    k = read_table(folder, "kernels")
    return k.loc[line - 2]  # the header is line 1


def _assert_is_that_row(row: pd.Series, op: str, shape: dict, dtype: str) -> None:
    assert row["OPName"] == op and row["dtype"] == dtype, (row.to_dict(), op, shape, dtype)
    for k, v in shape.items():
        assert int(row[k]) == v, (row.to_dict(), op, shape)


# ------------------------------------------------------------------------------ 2. imported folders named by their lines
def test_the_physics_check_names_the_folders_kernels_csv_and_its_lines(prof_l4, tmp_path):
    r = run_cli("train", "kernels", "--data", prof_l4, "--only-csv", "--quick", "--family", "gemm",
                "--out", tmp_path / "k", "--no-mlflow")
    msg = flat(r.stderr)
    assert r.returncode == 2 and "Traceback" not in r.stderr, msg
    assert "wattcast-imported" not in msg and "imported_kernels.csv" not in msg, msg
    assert f"error: {prof_l4}/kernels.csv: " in msg and "are faster than the GPU's spec allows" in msg, msg
    said = _said_rows(msg)
    assert len(said) == 10, msg
    for file, line, op, shape, dtype in said:  # each named line of the folder's file is the row described
        assert file is None  # one file: the message's start names it
        _assert_is_that_row(_row_at(prof_l4, line), op, shape, dtype)
    # the audit's first row: line 53 of kernels.csv (the temporary file's line 41 is an `add` row there)
    assert said[0][1] == 53 and _row_at(prof_l4, 41)["OPName"] == "add"
    assert not (tmp_path / "k").exists()


def test_a_csv_given_with_a_folder_keeps_its_own_lines(prof_l4, tmp_path):
    """--csv and a folder together: each row is named by its own file and line (the CSV's blank line counted)."""
    own = tmp_path / "own.csv"
    own.write_text("OPName,Latency,Device,B,M,N,K,H\n"
                   "bmm,1.0,L4,8,256,256,256,\n"
                   "\n"
                   "bmm,0.0001,L4,8,4096,4096,4096,\n")  # line 4: 1.1e18 FLOP/s
    r = run_cli("train", "kernels", "--data", prof_l4, "--csv", own, "--only-csv", "--quick", "--family", "gemm",
                "--out", tmp_path / "k", "--no-mlflow")
    msg = flat(r.stderr)
    assert r.returncode == 2 and "Traceback" not in r.stderr, msg
    assert "wattcast-imported" not in msg and "imported_kernels.csv" not in msg, msg
    assert f"error: {own}, {prof_l4}/kernels.csv: " in msg, msg
    said = _said_rows(msg)
    assert said[0][:3] == (str(own), 4, "bmm") and said[0][3] == {"B": 8, "M": 4096, "N": 4096, "K": 4096}, said[0]
    for file, line, op, shape, dtype in said[1:]:
        assert file == f"{prof_l4}/kernels.csv"
        _assert_is_that_row(_row_at(prof_l4, line), op, shape, dtype)


def test_the_unit_check_names_the_folders_kernels_csv(prof_a100, tmp_path):
    import shutil

    us = tmp_path / "prof_us"
    shutil.copytree(prof_a100, us)
    k = pd.read_csv(us / "kernels.csv", keep_default_na=False, dtype=str)
    lat = pd.to_numeric(k["latency_ms"], errors="coerce")
    k["latency_ms"] = np.where(lat.notna(), (lat * 1000).map(repr), k["latency_ms"])  # microseconds read as ms
    k.to_csv(us / "kernels.csv", index=False)
    r = run_cli("train", "kernels", "--data", us, "--only-csv", "--quick", "--family", "gemm",
                "--out", tmp_path / "k", "--no-mlflow")
    msg = flat(r.stderr)
    assert r.returncode == 2 and "Traceback" not in r.stderr, msg
    assert f"error: {us}/kernels.csv: the latencies look like microseconds" in msg, msg
    assert "wattcast-imported" not in msg


def test_the_consistency_gate_and_mlflow_name_the_folder(prof_a100, tmp_path):
    """The A100 trace's kernels run ~0.36x what the shipped bundle predicts (short kernels of a real step, not the
    isolated timings it learned): refused by the consistency gate, which names the folder's file."""
    runs = tmp_path / "mlruns"
    r = run_cli("train", "kernels", "--data", prof_a100, "--only-csv", "--quick", "--family", "gemm",
                "--out", tmp_path / "k", "--mlruns", runs, cwd=tmp_path)
    out = flat(r.stdout)
    assert r.returncode == 1 and "Traceback" not in r.stderr, out + r.stderr
    assert f"{prof_a100}/kernels.csv contradicts it: the median measured / predicted of its 5,214 rows" in out, out
    assert "wattcast-imported" not in out + r.stderr
    assert out.count("rerun with --force to make it current anyway") == 1, out
    con = sqlite3.connect(runs / "mlflow.db")
    try:
        params = dict(con.execute("select key, value from params").fetchall())
    finally:
        con.close()
    assert params["user_csv"] == f"{prof_a100}/kernels.csv"


def test_the_rows_of_profile_folders_carry_their_file_and_line(prof_a100):
    from wattcast.data.profiles.tables import read_table
    from wattcast.data.profiles.training_input import kernel_training_rows

    rows, counts = kernel_training_rows([prof_a100])
    assert len(rows.attrs["files"]) == len(rows.attrs["lines"]) == len(rows) == counts["used"]
    assert set(rows.attrs["files"]) == {str(prof_a100 / "kernels.csv")}
    k = read_table(prof_a100, "kernels")
    back = k.loc[np.asarray(rows.attrs["lines"]) - 2, ["OPName", "B", "M", "latency_ms"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(back, rows[["OPName", "B", "M", "latency_ms"]].reset_index(drop=True),
                                  check_dtype=False)


# ------------------------------------------------------------------------------------- 3. the --force message
FORCED = "made current by --force although the gate would have"
REFUSAL_ONLY = ("rerun with --force", "not made current", "CURRENT is left as it was", "still has no live model")


def _t4_bmm_rows(data_root, n: int) -> pd.DataFrame:
    """The first ``n`` Tesla T4 rows of NeuSight's bmm test kernels (skips when the data is absent)."""
    f = data_root / "neusight" / "kernels_test" / "bmm.csv"
    if not f.is_file():
        pytest.skip(f"{f} not present")
    d = pd.read_csv(f)
    return d[d["Device"] == "Tesla T4"][["OPName", "Latency", "Device", "B", "M", "N", "K"]].head(n)


@pytest.fixture(scope="module")
def t4_rows(data_root, tmp_path_factory):
    from wattcast.data.catalog import resolve_device
    from wattcast.data.kernel_datasets import load_user_kernels
    from wattcast.training.kernel_run import _canonical_devices

    d = _t4_bmm_rows(data_root, 100)
    p = tmp_path_factory.mktemp("t4") / "t4.csv"
    d.to_csv(p, index=False)
    return _canonical_devices(load_user_kernels(p), {}), {"Tesla-T4": resolve_device("Tesla-T4")}


def test_a_forced_kernel_bundle_says_it_was_made_current_and_why_the_gate_refused(t4_rows, tmp_path):
    from wattcast.models.kernel_bundle import KernelBundle, shipped_folder
    from wattcast.training.kernel_run import gate_decision

    user, specs = t4_rows
    empty = KernelBundle({}, {})  # no fitted family: refused against any working bundle
    # a new --out: judged against the shipped bundle
    ok, why, _ = gate_decision(empty, tmp_path / "fresh", user.iloc[:60], specs, user_only=True)
    why = flat(why)
    assert not ok and "not made current (the target's CURRENT is left as it was)" in why, why
    assert why.endswith("rerun with --force to make it current anyway") and why.count("--force") == 1, why
    ok, why, _ = gate_decision(empty, tmp_path / "fresh", user.iloc[:60], specs, user_only=True, force=True)
    why = flat(why)
    assert ok and why.startswith(f"{FORCED} refused it: no working bundle at the target, so the new bundle was "
                                 "compared with the shipped one"), why
    assert "and the new one has no fitted model" in why, why
    assert not [s for s in REFUSAL_ONLY if s in why], why
    # a target with a working bundle (the shipped folder itself: gate_decision writes nothing)
    ok, why, _ = gate_decision(empty, shipped_folder(), user.iloc[:60], specs, user_only=True)
    assert not ok and flat(why).startswith("kept the existing bundle: the new one has no fitted model"), why
    assert flat(why).endswith("rerun with --force to make it current anyway")
    ok, why, _ = gate_decision(empty, shipped_folder(), user.iloc[:60], specs, user_only=True, force=True)
    why = flat(why)
    assert ok and why.startswith(f"{FORCED} kept the existing bundle: the new one has no fitted model"), why
    assert not [s for s in REFUSAL_ONLY if s in why], why


def test_a_forced_collective_model_says_it_was_made_current_and_why_the_gate_refused(data_root, tmp_path):
    from wattcast.data.collective_datasets import load_collectives
    from wattcast.models import collectives as mc
    from wattcast.models.collectives import CollectiveModel
    from wattcast.training.collectives import TRAIN_CLUSTERS, aggregate, gate_decision

    raw = load_collectives(data_root, sources=("h100",))
    frame = aggregate(raw[raw["cluster"].isin(TRAIN_CLUSTERS)])

    class Slow:  # every prediction 30x the alpha-beta time
        def feature_name(self):
            return list(mc.FEATURES)

        def predict(self, X, num_threads=0):
            return np.full(len(X), np.log(30.0))

    slow = CollectiveModel(Slow(), dict(CollectiveModel.load(mc.shipped_folder()).manifest))
    ok, why, _ = gate_decision(slow, tmp_path / "fresh", frame, {"loco_mape_pct": 1.0}, "another-fingerprint")
    assert not ok and "not made current (the target still has no live model)" in why, why
    assert why.endswith("rerun with --force to make it current anyway") and why.count("--force") == 1, why
    ok, why, _ = gate_decision(slow, tmp_path / "fresh", frame, {"loco_mape_pct": 1.0}, "another-fingerprint",
                               force=True)
    assert ok and why.startswith(f"{FORCED} refused it: no collective model at the target, so the new model was "
                                 "compared with the shipped one"), why
    assert "and the new one validates worse" in why
    assert not [s for s in REFUSAL_ONLY if s in why], why
    ok, why, _ = gate_decision(slow, mc.shipped_folder(), frame, {"loco_mape_pct": 1.0}, "another-fingerprint",
                               force=True)
    assert ok and why.startswith(f"{FORCED} kept the existing collective model: the new one validates worse"), why
    assert not [s for s in REFUSAL_ONLY if s in why], why


def test_verdict_wording():
    from wattcast.training.gate_force import FORCE_HINT, verdict

    refusal = "kept the existing power model: the new one fits worse (9.00% vs 3.00%)"
    assert verdict(False, refusal, False, "power model", "--power-model") == (False, f"{refusal}; {FORCE_HINT}")
    assert verdict(False, refusal, True, "power model", "--power-model") == (
        True, "made current by --force although the gate would have kept the existing power model: the new one fits "
              "worse (9.00% vs 3.00%)")
    ok, why = verdict(False, refusal, True, "power model", "--power-model", against="no power model at the target")
    assert ok and why == ("made current by --force although the gate would have refused it: no power model at the "
                          "target, so the new model was compared with the shipped one (the model `predict` uses "
                          "without --power-model), and the new one fits worse (9.00% vs 3.00%)")
    assert verdict(True, "new power model validates no worse (x)", True, "power model", "--power-model") == (
        True, "new power model validates no worse (x)")


# ------------------------------------------------------------------------------- 4. --holdout of a --spec GPU
def test_holdout_names_a_spec_gpu_of_the_same_command(data_root, tmp_path):
    d = _t4_bmm_rows(data_root, 40)
    csv = tmp_path / "rtx.csv"
    d.assign(Device="RTX-4090").to_csv(csv, index=False)  # T4 timings: slower than a 4090 can run them, not faster
    for name in ("RTX-4090", "GeForce RTX 4090", "rtx4090", str(MY_GPU)):  # the name, two aliases, the spec path
        r = run_cli("train", "kernels", "--csv", csv, "--only-csv", "--spec", MY_GPU, "--holdout", name, "--quick",
                    "--out", tmp_path / "k", "--no-mlflow")
        msg = flat(r.stderr)
        assert "unknown device" not in msg, (name, msg)
        # every row is on the held-out GPU: evaluation only, so nothing is left to train on
        assert "40 rows of the user CSV are on held-out GPUs ['RTX-4090']: used for evaluation only" in msg, (name, msg)
        assert r.returncode == 2 and "no training rows" in msg and "Traceback" not in r.stderr, (name, msg)
    # a name neither the catalog nor the --spec files know: refused, listing the --spec GPUs
    r = run_cli("train", "kernels", "--csv", csv, "--only-csv", "--spec", MY_GPU, "--holdout", "RTX-4091", "--quick",
                "--out", tmp_path / "k", "--no-mlflow")
    msg = flat(r.stderr)
    assert r.returncode == 2 and "--holdout: unknown device 'RTX-4091'" in msg, msg
    assert "Nor is it a GPU of this run's --spec files: 'RTX-4090'" in msg, msg
    assert not (tmp_path / "k").exists()


def test_holdout_names_never_let_a_spec_take_a_default_held_out_gpus_place(tmp_path):
    from wattcast.data.catalog import resolve_device
    from wattcast.training.holdout import holdout_name, with_default_holdout

    text = MY_GPU.read_text().replace('aliases: ["NVIDIA GeForce RTX 4090"', 'aliases: ["L4", "NVIDIA GeForce RTX 4090"')
    assert text != MY_GPU.read_text()
    (tmp_path / "g.yaml").write_text(text)
    spec = resolve_device(str(tmp_path / "g.yaml"))
    assert holdout_name("rtx 4090", [spec]) == "RTX-4090" and holdout_name("T4", [spec]) == "Tesla-T4"
    # the defaults stay the catalog's L4 and A100 80GB PCIe; a --holdout of the spec's alias names the spec
    assert with_default_holdout((), [spec]) == ("L4", "A100-PCIe-80GB")
    assert with_default_holdout(("L4",), [spec]) == ("L4", "A100-PCIe-80GB", "RTX-4090")
