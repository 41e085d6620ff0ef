"""Blank rows of NeuSight-format kernel CSVs (a spreadsheet saves an empty row as ',,,,'; pandas reads it as a row of
empty cells): not counted as rows of the file, and a bad row is named by its own line of the file the user gave."""

from __future__ import annotations

import pandas as pd

from conftest import flat, run_cli
from test_profile_import import _trace
from wattcast.data.profiles.importers import import_files
from wattcast.data.profiles.training_input import kernel_training_rows

HEADER = "OPName,B,M,N,K,Latency,Device,dtype"
OWN_CSV = "\n".join([HEADER,
                     "linear,1,64,64,64,0.01,H100-SXM5-80GB,bf16",
                     "",
                     "linear,1,128,64,64,0.02,H100-SXM5-80GB,bf16",
                     ",,,,,,,",
                     "linear,1,x,64,64,0.02,H100-SXM5-80GB,bf16",  # line 6 of the file
                     " , ,,,,,,", ""])


def _profile_with_blank_rows(tmp_path):
    prof = tmp_path / "p"
    import_files([_trace(tmp_path)]).write(prof)
    lines = (prof / "kernels.csv").read_text().splitlines()
    empty_row = "," * lines[0].count(",")
    lines[3:3] = [empty_row, "", " " + empty_row]
    (prof / "kernels.csv").write_text("\n".join(lines + [empty_row]) + "\n")
    return prof


def test_profile_kernel_rows_are_counted_without_blank_rows(tmp_path):
    rows, counts = kernel_training_rows([_profile_with_blank_rows(tmp_path)])
    assert counts == {"rows": 10, "used": 7, "unmapped": 3, "no_time": 0, "unknown_device": 0}
    assert len(rows) == 7


def test_train_kernels_names_a_bad_row_of_its_csv_by_that_file_and_line(tmp_path):
    prof = _profile_with_blank_rows(tmp_path)
    own = tmp_path / "own.csv"
    own.write_text(OWN_CSV)
    r = run_cli("train", "kernels", "--data", str(prof), "--csv", str(own), "--only-csv", "--no-mlflow",
                "--out", str(tmp_path / "bundle"))
    err = flat(r.stderr)
    assert r.returncode != 0
    assert "7 of 10 kernel rows used (left out: 3 unmapped)" in err
    assert f"{own}: 1 bad row(s): line 6: M='x' is not a number" in err, err
    assert "imported_kernels.csv" not in err


def test_kernels_command_does_not_count_blank_rows(tmp_path):
    own = tmp_path / "own.csv"
    own.write_text(OWN_CSV)
    r = run_cli("kernels", "--device", "H100-SXM5-80GB", "--input", str(own), "--output", str(tmp_path / "out.csv"))
    assert r.returncode == 0, r.stderr
    out = pd.read_csv(tmp_path / "out.csv", dtype=str, keep_default_na=False)
    assert list(out["M"]) == ["64", "128", "x"]
    err = flat(r.stderr)
    assert "2 kernels predicted" in err and "1 rows with errors" in err, err
    only_blank = tmp_path / "blank.csv"
    only_blank.write_text(HEADER + "\n,,,,,,,\n")
    r = run_cli("kernels", "--device", "H100-SXM5-80GB", "--input", str(only_blank))
    assert r.returncode == 1 and "has a header but no kernel rows" in flat(r.stderr)
