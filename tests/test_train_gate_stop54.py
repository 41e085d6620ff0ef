"""Stop 54 audit, retraining: every trainer keeps the held-out GPUs out (by name or by figures; --holdout adds to them),
a new --out is judged against the shipped model, a user CSV that contradicts the working kernel bundle (every latency
x20) is refused, and `train power --data` leaves out samples no board can draw, naming them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import flat, run_cli

L4_YAML = Path(__file__).resolve().parents[1] / "data" / "devices" / "L4.yaml"

NCCL_PCIE_LOG = """\
# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  1000 on node000 device  0 [0x00] NVIDIA A100 80GB PCIe
#  Rank  1 Group  0 Pid  1001 on node000 device  1 [0x01] NVIDIA A100 80GB PCIe
#  Rank  2 Group  0 Pid  1002 on node000 device  2 [0x02] NVIDIA A100 80GB PCIe
#  Rank  3 Group  0 Pid  1003 on node000 device  3 [0x03] NVIDIA A100 80GB PCIe
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           256     float     sum      -1       20.06    0.05    0.08      0       20.06    0.05    0.08      0
        4096          1024     float     sum      -1       20.25    0.20    0.30      0       20.25    0.20    0.30      0
       16384          4096     float     sum      -1       20.98    0.78    1.17      0       20.98    0.78    1.17      0
       65536         16384     float     sum      -1       23.93    2.74    4.11      0       23.93    2.74    4.11      0
      262144         65536     float     sum      -1       35.73    7.34   11.01      0       35.73    7.34   11.01      0
     1048576        262144     float     sum      -1       82.91   12.65   18.97      0       82.91   12.65   18.97      0
     4194304       1048576     float     sum      -1      271.66   15.44   23.16      0      271.66   15.44   23.16      0
    16777216       4194304     float     sum      -1     1026.63   16.34   24.51      0     1026.63   16.34   24.51      0
    67108864      16777216     float     sum      -1     4046.53   16.58   24.88      0     4046.53   16.58   24.88      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 50.0
#
"""


def _renamed_l4(tmp_path: Path) -> Path:
    """A spec file with the L4's figures under another name and no aliases."""
    lines = []
    for line in L4_YAML.read_text().splitlines():
        if line.startswith("name:"):
            line = "name: MyL4"
        elif line.startswith("aliases:"):
            line = "aliases: []"
        lines.append(line)
    p = tmp_path / "myl4.yaml"
    p.write_text("\n".join(lines) + "\n")
    return p


def _l4_rows(data_root: Path, n: int = 300) -> pd.DataFrame:
    f = data_root / "neusight" / "kernels_test" / "bmm.csv"
    if not f.is_file():
        pytest.skip(f"{f} not present")
    d = pd.read_csv(f)
    return d[d["Device"] == "NVIDIA L4"][["OPName", "Latency", "Device", "B", "M", "N", "K"]].head(n)


# ------------------------------------------------------------------------------------------- held out: kernels
def test_kernels_never_train_on_a_renamed_copy_of_a_held_out_gpu(data_root, tmp_path):
    from wattcast.training.kernel_run import run_train_kernels

    spec = _renamed_l4(tmp_path)
    csv = tmp_path / "l4_my.csv"
    _l4_rows(data_root).assign(Device="MyL4").to_csv(csv, index=False)
    said: list[str] = []
    with pytest.raises(ValueError, match="no training rows"):
        run_train_kernels(csv=csv, only_csv=True, spec_files=(str(spec),), quick=True, out_dir=tmp_path / "k",
                          use_mlflow=False, log=said.append)
    said = flat(" ".join(said))
    assert "--spec MyL4 has the hardware figures of the held-out GPU L4" in said and "evaluation only" in said
    assert not (tmp_path / "k").exists()


def test_holdout_adds_to_the_default_held_out_gpus(data_root, tmp_path):
    from wattcast.training.kernel_run import run_train_kernels

    csv = tmp_path / "l4.csv"
    _l4_rows(data_root).to_csv(csv, index=False)
    said: list[str] = []
    with pytest.raises(ValueError, match="no training rows"):  # until stop 54: 240 L4 rows trained, "held out: T4"
        run_train_kernels(csv=csv, only_csv=True, holdout=("Tesla-T4",), quick=True, out_dir=tmp_path / "k",
                          use_mlflow=False, log=said.append)
    assert "on held-out GPUs ['L4']" in " ".join(said)
    r = run_cli("train", "kernels", "--help")
    assert "adds to the default held-out GPUs" in flat(r.stdout)


# ------------------------------------------------------------------------------------------- held out: power
def _power_folder(tmp_path: Path, name: str, device: str, power_w) -> Path:
    n = len(power_w)
    d = pd.DataFrame({"timestamp": [f"t{i}" for i in range(n)], "Device": device, "device_name": device,
                      "gpu_index": 0, "power_w": power_w, "gpu_util_pct": 90, "mem_util_pct": 40,
                      "sm_clock_mhz": 1410, "temperature_c": 60, "power_limit_w": 400, "energy_j": "", "source": "x",
                      "flops": [1e14 * (i % 5 + 1) for i in range(n)], "bytes": 1e11, "time_ms": 1000.0,
                      "dtype": "bf16"})
    f = tmp_path / name
    f.mkdir()
    d.to_csv(f / "power.csv", index=False)
    (f / "profile.json").write_text(json.dumps({"schema_version": 1, "tool": "wattcast", "files": [],
                                                "rows": {"kernels": 0, "collectives": 0, "power": n}}))
    return f


def test_power_leaves_out_impossible_samples_naming_the_rows(tmp_path):
    from wattcast.training.power import load_profile_power, profile_power_text

    # 3000 W on a 400 W A100 (the importer's 1.5x TDP rule), 5 W and 0.25 W under load (below half its idle power)
    f = _power_folder(tmp_path, "p", "A100-SXM4-40GB", [3000.0, 5.0, 0.25] + [250.0] * 7)
    rows, counts = load_profile_power([f])
    assert counts["used"] == 7 and counts["impossible_power"] == 3 and len(rows) == 7
    text = flat(profile_power_text(counts))
    assert f"{f / 'power.csv'} data row 1: power_w 3000 W above 1.5x the A100-SXM4-40GB TDP 400 W" in text
    assert "data row 3: power_w 0.25 W below 0.5x its idle power" in text
    # every sample impossible: refused, naming them; nothing written
    bad = _power_folder(tmp_path, "gp", "A100-SXM4-40GB", [3000.0 if i % 2 else 5.0 for i in range(20)])
    r = run_cli("train", "power", "--data", bad, "--out", tmp_path / "out", "--no-mlflow")
    msg = flat(r.stderr)
    assert r.returncode == 2 and "Traceback" not in r.stderr, msg
    assert "0 of 20 imported power samples used" in msg and "data row 2: power_w 3000 W above 1.5x" in msg
    assert not (tmp_path / "out").exists()


def test_power_never_trains_on_held_out_gpus(tmp_path):
    from wattcast.training.power import load_profile_power

    f = _power_folder(tmp_path, "p", "L4", [60.0] * 10)
    rows, counts = load_profile_power([f])
    assert counts["used"] == 0 and counts["heldout_device"] == 10 and not len(rows)
    assert "L4, never trained on" in counts_text(counts)


def counts_text(counts) -> str:
    from wattcast.training.power import profile_power_text

    return flat(profile_power_text(counts))


def test_power_into_a_new_folder_is_judged_against_the_shipped_model(data_root, tmp_path):
    if not (data_root / "power").is_dir():
        pytest.skip("shared/datasets/power not available")
    # plausible watts, wrong physics: 70 W at 1e14-5e14 FLOP/s on a 400 W A100 (each within the sanity limits)
    f = _power_folder(tmp_path, "p", "A100-SXM4-40GB", [70.0] * 60)
    out = tmp_path / "fresh"
    r = run_cli("train", "power", "--data", data_root, "--data", f, "--out", out, "--no-mlflow")
    msg = flat(r.stdout + r.stderr)
    assert r.returncode == 1, msg  # until stop 54: "no power model at the target: writing the new one", exit 0
    assert "compared with the shipped one" in msg and "regresses shipped rows" in msg
    assert "rerun with --force" in msg
    from wattcast.models import power as mp

    # nothing made current, but the refused model is kept apart for inspection, as train kernels/collectives keep
    # theirs (until stop 55 it was dropped): <out>/power_refused/<name>/, named with the flag that predicts with it
    assert not (out / mp.POINTER).exists() and not (out / mp.VERSIONS).exists()
    kept = list((out / mp.REFUSED).iterdir())
    assert len(kept) == 1 and f"kept, not current, in {kept[0]}" in msg and f"--power-model {kept[0]}" in msg
    assert mp.PowerModel.load(kept[0]).form  # a whole, loadable model
    assert not out.joinpath(mp.MANIFEST).exists()
    # --force installs it anyway, saying what the gate would have refused
    r = run_cli("train", "power", "--data", data_root, "--data", f, "--out", out, "--no-mlflow", "--force")
    msg = flat(r.stdout + r.stderr)
    assert r.returncode == 0 and "made current by --force although the gate would have" in msg, msg
    # what happened, not the refusal pasted in (until stop 57: "...: not made current ...; rerun with --force ...")
    assert "rerun with --force" not in msg and "not made current" not in msg, msg
    assert mp.resolve_power_folder(out).parent == out / mp.VERSIONS


# ------------------------------------------------------------------------------------- collectives
def test_collectives_never_train_on_held_out_gpus(data_root, tmp_path):
    log = tmp_path / "all_reduce_pcie.log"
    log.write_text(NCCL_PCIE_LOG)
    prof = tmp_path / "prof"
    r = run_cli("profile", "import", log, "-o", prof)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "coll"
    r = run_cli("train", "collectives", "--data", data_root, "--data", prof, "--cluster", "PCIe-4GPU", "--quick",
                "--out", out, "--no-mlflow")
    msg = flat(r.stderr)
    assert r.returncode == 2 and "Traceback" not in r.stderr, msg
    assert "cluster PCIe-4GPU, whose GPU A100-PCIe-80GB is the held-out A100-PCIe-80GB" in msg
    assert not out.exists()


def test_a_collective_model_into_a_new_folder_is_judged_against_the_shipped_one(data_root, tmp_path):
    from wattcast.data.collective_datasets import load_collectives
    from wattcast.models import collectives as mc
    from wattcast.models.collectives import CollectiveModel
    from wattcast.training.collectives import TRAIN_CLUSTERS, aggregate, gate_decision

    raw = load_collectives(data_root, sources=("h100",))
    frame = aggregate(raw[raw["cluster"].isin(TRAIN_CLUSTERS)])

    class Slow:  # every prediction 30x the alpha-beta time (a slow-fabric log fitted)
        def feature_name(self):
            return list(mc.FEATURES)

        def predict(self, X, num_threads=0):
            return np.full(len(X), np.log(30.0))

    shipped = CollectiveModel.load(mc.shipped_folder())
    slow = CollectiveModel(Slow(), dict(shipped.manifest))
    ok, why, m = gate_decision(slow, tmp_path / "fresh", frame, {"loco_mape_pct": 1.0}, "another-fingerprint")
    assert not ok and "compared with the shipped one" in why and "validates worse" in why, why
    assert m["gate_new_mape_pct"] > m["gate_old_mape_pct"]
    ok, why, _ = gate_decision(shipped, tmp_path / "fresh", frame, {"loco_mape_pct": 1.0}, "another-fingerprint")
    assert ok, why


# ------------------------------------------------------------------------------------------ kernels
@pytest.fixture(scope="module")
def t4_bmm(data_root) -> pd.DataFrame:
    f = data_root / "neusight" / "kernels_test" / "bmm.csv"
    if not f.is_file():
        pytest.skip(f"{f} not present")
    d = pd.read_csv(f)
    return d[d["Device"] == "Tesla T4"][["OPName", "Latency", "Device", "B", "M", "N", "K"]].head(300)


def _user_frame(d: pd.DataFrame, tmp_path: Path, name: str) -> tuple[pd.DataFrame, dict]:
    from wattcast.data.catalog import resolve_device
    from wattcast.data.kernel_datasets import load_user_kernels
    from wattcast.training.kernel_run import _canonical_devices

    p = tmp_path / name
    d.to_csv(p, index=False)
    user = _canonical_devices(load_user_kernels(p), {})
    return user, {"Tesla-T4": resolve_device("Tesla-T4")}


def test_a_csv_that_contradicts_the_working_bundle_is_refused(t4_bmm, tmp_path):
    """The audit's x20 CSV passed the gate of a mixed run; against a new folder nothing judged it. The working bundle
    (here the shipped one: the target is empty) predicts the CSV's rows ~20x too fast: refused, naming the CSV and
    the median ratio, whatever the aggregate says."""
    from wattcast.models.kernel_bundle import KernelBundle, shipped_folder
    from wattcast.training.kernel_run import gate_decision

    shipped = KernelBundle.load(shipped_folder())
    x20, specs = _user_frame(t4_bmm.assign(Latency=t4_bmm["Latency"] * 20), tmp_path, "t4_x20.csv")
    val = x20.iloc[:60]
    ok, why, m = gate_decision(shipped, tmp_path / "fresh", val, specs, user_only=True, user_rows=x20,
                               origin="t4_x20.csv")
    why = flat(why)
    assert not ok, why
    assert "compared with the shipped one" in why and "t4_x20.csv contradicts it" in why
    assert 15 < m["gate_user_median_ratio"] < 25 and m["gate_user_band_high"] < 3
    assert "--force" in why
    assert gate_decision(shipped, tmp_path / "fresh", val, specs, user_only=True, user_rows=x20, force=True)[0]
    # the honest rows agree with it (their median ratio inside the band): passed, and said
    honest, _ = _user_frame(t4_bmm, tmp_path, "t4.csv")
    ok, why, m = gate_decision(shipped, tmp_path / "fresh", honest.iloc[:60], specs, user_only=True,
                               user_rows=honest, origin="t4.csv")
    assert ok and "t4.csv agrees with the working bundle" in flat(why), why
    assert m["gate_user_band_low"] <= m["gate_user_median_ratio"] <= m["gate_user_band_high"]


def test_a_kernel_bundle_into_a_new_folder_is_judged_against_the_shipped_one(t4_bmm, tmp_path):
    """Until stop 54 "no working bundle at the target: writing the new one": a bundle with no fitted model became
    the default of an empty --out."""
    from wattcast.models.kernel_bundle import KernelBundle
    from wattcast.training.kernel_run import gate_decision

    user, specs = _user_frame(t4_bmm, tmp_path, "t4.csv")
    ok, why, _ = gate_decision(KernelBundle({}, {}), tmp_path / "fresh", user.iloc[:60], specs, user_only=True)
    why = flat(why)
    assert not ok and "compared with the shipped one" in why and "no fitted model" in why, why
    assert "CURRENT is left as it was" in why
