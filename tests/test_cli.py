"""End-to-end `wattcast kernels` and `wattcast devices`: the real command line in a subprocess."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from conftest import CONTRACT_COLUMNS, flat, run_cli

pytestmark = pytest.mark.e2e


def _errors(out: pd.DataFrame) -> pd.Series:
    """The 'error' column as text ('' = fine); pandas reads an all-empty column as float NaN."""
    e = out["error"].astype(object)
    return e.where(e.notna(), "").astype(str)


def _check_output(out: pd.DataFrame, inp: pd.DataFrame) -> None:
    assert len(out) == len(inp)
    assert list(out.columns[: len(inp.columns)]) == list(inp.columns)
    for c in CONTRACT_COLUMNS:
        assert c in out.columns
    ok = _errors(out) == ""
    p = out.loc[ok, "pred_latency_ms"].to_numpy(dtype=float)
    assert np.isfinite(p).all() and (p > 0).all()
    assert (out.loc[ok, "pred_low_ms"] <= out.loc[ok, "pred_latency_ms"]).all()
    assert (out.loc[ok, "pred_latency_ms"] <= out.loc[ok, "pred_high_ms"]).all()
    assert set(out["ood"].astype(str)) <= {"True", "False"}
    # the original columns come back with the same values
    for c in inp.columns:
        a, b = inp[c], out[c]
        if pd.api.types.is_numeric_dtype(a):
            np.testing.assert_allclose(a.to_numpy(dtype=float), b.to_numpy(dtype=float), equal_nan=True)
        else:
            assert a.fillna("").astype(str).tolist() == b.fillna("").astype(str).tolist()


def test_kernels_to_output_file(tmp_path, examples_csv):
    out_csv = tmp_path / "out.csv"
    r = run_cli("kernels", "--device", "h100-sxm5-80gb", "--input", examples_csv, "--output", out_csv)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    out = pd.read_csv(out_csv)
    _check_output(out, pd.read_csv(examples_csv))
    assert (_errors(out) == "").all()
    assert "H100-SXM5-80GB" in flat(r.stderr)  # the summary names the resolved device
    assert r.stdout.strip() == ""  # the CSV went to the file, not to stdout


def test_kernels_to_stdout(examples_csv):
    r = run_cli("kernels", "-d", "A100", "-i", examples_csv)
    assert r.returncode == 0, r.stderr
    out = pd.read_csv(io.StringIO(r.stdout))
    _check_output(out, pd.read_csv(examples_csv))
    assert "kernels predicted" in flat(r.stderr)


def test_kernels_with_spec_files(tmp_path, examples_csv, my_gpu_yaml, data_root):
    r = run_cli("kernels", "--device", my_gpu_yaml, "--input", examples_csv)
    assert r.returncode == 0, r.stderr
    _check_output(pd.read_csv(io.StringIO(r.stdout)), pd.read_csv(examples_csv))
    assert "RTX-4090" in flat(r.stderr)
    js = data_root / "neusight" / "devices" / "NVIDIA_L4.json"
    if js.is_file():
        r = run_cli("kernels", "--device", js, "--input", examples_csv)
        assert r.returncode == 0, r.stderr
        _check_output(pd.read_csv(io.StringIO(r.stdout)), pd.read_csv(examples_csv))


def test_unknown_op_row_is_reported_in_its_row(tmp_path, examples_csv):
    inp = pd.read_csv(examples_csv)
    bad = pd.concat([inp.iloc[:4], pd.DataFrame([{"OPName": "frobnicate", "dtype": "fp32", "B": 4, "H": 64}]), inp.iloc[4:]],
                    ignore_index=True)
    path = tmp_path / "bad.csv"
    bad.to_csv(path, index=False)
    r = run_cli("kernels", "--device", "L4", "--input", path, "--output", tmp_path / "out.csv")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    out = pd.read_csv(tmp_path / "out.csv")
    assert len(out) == len(bad)
    err = _errors(out)
    assert "frobnicate" in err.iloc[4]
    assert np.isnan(out["pred_latency_ms"].iloc[4])
    assert (err.drop(index=4) == "").all()
    assert np.isfinite(out["pred_latency_ms"].drop(index=4)).all()
    assert "1 rows with errors" in flat(r.stderr)


def test_unknown_device_fails_with_suggestions(examples_csv):
    r = run_cli("kernels", "--device", "H100-SMX5", "--input", examples_csv)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    msg = flat(r.stderr)
    assert "unknown device" in msg
    assert "Closest catalog devices" in msg and "H100-SXM5-80GB" in msg
    assert "examples/my_gpu.yaml" in msg  # a GPU the catalog lacks: where a spec to copy is
    assert r.stdout.strip() == ""


def test_typo_device_gets_the_right_suggestion(examples_csv):
    r = run_cli("kernels", "--device", "mi30x", "--input", examples_csv)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert "MI300X" in flat(r.stderr)


def test_missing_spec_file_fails_cleanly(tmp_path, examples_csv):
    r = run_cli("kernels", "--device", tmp_path / "nope.yaml", "--input", examples_csv)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert "nope.yaml" in flat(r.stderr)


def test_missing_input_file_fails_with_a_clear_message(tmp_path):
    missing = tmp_path / "does_not_exist.csv"
    r = run_cli("kernels", "--device", "H100-SXM5-80GB", "--input", missing)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    msg = flat(r.stderr)
    assert "does_not_exist.csv" in msg and "does not exist" in msg


def test_input_without_opname_fails_cleanly(tmp_path):
    path = tmp_path / "noop.csv"
    pd.DataFrame({"B": [1], "H": [2]}).to_csv(path, index=False)
    r = run_cli("kernels", "--device", "H100-SXM5-80GB", "--input", path)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert "OPName" in flat(r.stderr)


def test_devices_lists_the_catalog():
    r = run_cli("devices")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    for name in ("L4", "MI300X", "H100-SXM5-80GB", "Tesla-T4"):
        assert name in text


def test_devices_shows_one_spec_with_sources(my_gpu_yaml):
    r = run_cli("devices", "mi300x")
    assert r.returncode == 0, r.stderr
    assert "MI300X" in r.stdout and "memory_bandwidth_gbps" in r.stdout
    r = run_cli("devices", my_gpu_yaml)
    assert r.returncode == 0, r.stderr
    assert "RTX-4090" in r.stdout and "whitepaper" in r.stdout
    r = run_cli("devices", "no-such-gpu")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert "unknown device" in flat(r.stderr)


# ------------------------------------------------------------------------------ real data
def test_neusight_linear_rows_of_a_training_gpu(tmp_path, data_root):
    src = data_root / "neusight" / "kernels_test" / "linear.csv"
    if not src.is_file():
        pytest.skip(f"{src} not present")
    raw = pd.read_csv(src)
    t4 = raw[raw["Device"] == "Tesla T4"].head(300).reset_index(drop=True)
    assert len(t4) == 300
    path = tmp_path / "t4_linear.csv"
    t4.to_csv(path, index=False)
    r = run_cli("kernels", "--device", "Tesla T4", "--input", path, "--output", tmp_path / "pred.csv")
    assert r.returncode == 0, r.stderr
    out = pd.read_csv(tmp_path / "pred.csv")
    assert len(out) == 300
    assert list(out.columns[: len(t4.columns)]) == list(t4.columns)  # NeuSight's own columns come back
    assert (_errors(out) == "").all()
    ape = np.abs(out["pred_latency_ms"] / out["Latency"] - 1.0)
    mape = float(ape.mean() * 100)
    assert np.isfinite(mape)
    assert mape < 100, f"MAPE {mape:.1f}% on NeuSight T4 linear rows"


def test_regions_lists_and_filters():
    import json as _json

    r = run_cli("regions", "us-east-1", "--json")
    assert r.returncode == 0, r.stderr
    rows = _json.loads(r.stdout)
    assert [x["region"] for x in rows] == ["aws:us-east-1"]
    assert 0.1 < rows[0]["kgco2e_per_kwh"] < 1.0
    every = _json.loads(run_cli("regions", "--kind", "cloud", "--json").stdout)
    assert len(every) > 50 and all(":" in x["region"] for x in every)
    miss = run_cli("regions", "atlantis")
    assert miss.returncode == 1 and "no region matches" in miss.stderr
    bad = run_cli("regions", "--kind", "planet")
    assert bad.returncode == 2 and "unknown region kind" in bad.stderr
