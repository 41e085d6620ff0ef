"""Fixes of the profile importers / `profile import` / `validate trace` (bad folders, bad fields, bad measurements)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from conftest import flat, run_cli
from wattcast.data.profiles.kineto import INVALID_DURATION, INVALID_SHAPE, import_kineto
from wattcast.data.profiles.nccl_tests import import_nccl_tests
from wattcast.data.profiles.power_logs import import_nvidia_smi
from wattcast.data.profiles.tables import ProfileImportError, read_table
from wattcast.validation.trace_validation import json_safe

DEV = [{"id": 0, "name": "NVIDIA A100-SXM4-40GB"}]


def _trace(tmp_path, name="t.json", dims=((64, 128), (128, 32)), kdur=50, cpu_args=None, kts=1010, extra=()):
    cpu = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1000, "dur": 20,
           "args": cpu_args if cpu_args is not None else {"Input Dims": [list(d) for d in dims],
                                                          "Input type": ["float", "float"]}}
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1005, "dur": 3,
              "args": {"correlation": 5}}
    kern = {"ph": "X", "cat": "kernel", "name": "ampere_sgemm", "pid": 0, "tid": 7, "ts": kts,
            "args": {"correlation": 5, "device": 0}}
    if kdur is not None:
        kern["dur"] = kdur
    p = tmp_path / name
    p.write_text(json.dumps({"traceEvents": [cpu, launch, kern, *extra], "deviceProperties": DEV}))
    return p


NCCL_TESTS_NCCL_HEAD = """# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20
#  Rank  0 Group  0 Pid  12345 on    node01 device  0 [0x07] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  12346 on    node01 device  1 [0x0f] NVIDIA H100 80GB HBM3
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""


# ----------------------------------------------------------------------------- 1. profile import into an existing folder
def test_profile_import_refuses_existing_tables_and_overwrite_is_consistent(tmp_path):
    trace = _trace(tmp_path)
    user = tmp_path / "U"
    user.mkdir()
    (user / "kernels.csv").write_text("precious\n")
    (user / "notes.txt").write_text("mine\n")
    r = run_cli("profile", "import", str(trace), "-o", str(user))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--overwrite" in flat(r.stderr)
    assert (user / "kernels.csv").read_text() == "precious\n" and not (user / "profile.json").exists()
    # --overwrite never replaces or deletes a table no profile.json records (the user's own): refused, named
    (user / "collectives.csv").write_text("stale\n")
    r = run_cli("profile", "import", str(trace), "-o", str(user), "--overwrite")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "kernels.csv, collectives.csv" in flat(r.stderr) and "no profile.json" in flat(r.stderr)
    assert (user / "kernels.csv").read_text() == "precious\n" and (user / "collectives.csv").read_text() == "stale\n"
    # a folder an import wrote: --overwrite replaces its tables and removes the stale ones it recorded, nothing else
    imp = tmp_path / "I"
    log = tmp_path / "all_reduce_perf.log"
    log.write_text(NCCL_TESTS_NCCL_HEAD.replace("nGpus 1", "nGpus 2")
                   + "     1048576        262144     float     sum      -1    100.0   10.49   10.49      0    100.0   10.49   10.49      0\n"
                   + "# Avg bus bandwidth    : 10.49\n")
    r = run_cli("profile", "import", str(trace), str(log), "-o", str(imp))
    assert r.returncode == 0, r.stderr
    assert json.loads((imp / "profile.json").read_text())["written"] == ["collectives.csv", "kernels.csv"]
    (imp / "notes.txt").write_text("mine\n")
    r = run_cli("profile", "import", str(trace), "-o", str(imp), "--overwrite")
    assert r.returncode == 0, r.stderr
    meta = json.loads((imp / "profile.json").read_text())
    assert meta["rows"]["collectives"] == 0 and not (imp / "collectives.csv").exists()
    assert meta["written"] == ["kernels.csv"]
    assert len(read_table(imp, "kernels")) == 1 and (imp / "notes.txt").read_text() == "mine\n"
    r = run_cli("profile", "import", str(trace), "-o", str(imp))  # profile.json alone is enough to refuse
    assert r.returncode == 2 and "already holds" in flat(r.stderr)


def test_profile_import_overwrite_keeps_a_power_csv_no_import_wrote(tmp_path):
    """Audit stop 54 #7: `--overwrite` into a folder holding only the user's power.csv deleted it."""
    trace = _trace(tmp_path)
    ud = tmp_path / "ud2"
    ud.mkdir()
    (ud / "power.csv").write_text("my,data\n")
    r = run_cli("profile", "import", str(trace), "-o", str(ud), "--overwrite")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "power.csv" in flat(r.stderr) and "no profile.json" in flat(r.stderr)
    assert (ud / "power.csv").read_text() == "my,data\n" and not (ud / "kernels.csv").exists()
    # a power.csv added to an import's folder: its profile.json does not record it -> refused as well
    imp = tmp_path / "I"
    assert run_cli("profile", "import", str(trace), "-o", str(imp)).returncode == 0
    (imp / "power.csv").write_text("my,data\n")
    r = run_cli("profile", "import", str(trace), "-o", str(imp), "--overwrite")
    assert r.returncode == 2 and "power.csv" in flat(r.stderr) and "records only kernels.csv" in flat(r.stderr)
    assert (imp / "power.csv").read_text() == "my,data\n"


def test_overwrite_reads_the_record_of_an_older_profile_json(tmp_path):
    """A profile.json written before the 'written' record: the tables its 'rows' count are the import's."""
    from wattcast.data.profiles.tables import recorded_files

    trace = _trace(tmp_path)
    imp = tmp_path / "I"
    (imp).mkdir()
    pd.DataFrame({"x": [1]}).to_csv(imp / "collectives.csv", index=False)
    (imp / "kernels.csv").write_text("old\n")
    (imp / "profile.json").write_text(json.dumps({"schema_version": 1, "tool": "wattcast", "files": [],
                                                  "rows": {"kernels": 3, "collectives": 1, "power": 0}}))
    assert recorded_files(imp) == {"kernels.csv", "collectives.csv"}
    r = run_cli("profile", "import", str(trace), "-o", str(imp), "--overwrite")
    assert r.returncode == 0, r.stderr
    assert not (imp / "collectives.csv").exists() and len(read_table(imp, "kernels")) == 1
    (imp / "profile.json").write_text("{not json")  # a profile.json wattcast did not write: nothing is replaced
    r = run_cli("profile", "import", str(trace), "-o", str(imp), "--overwrite")
    assert r.returncode == 2 and "not one wattcast wrote" in flat(r.stderr)


# ----------------------------------------------------------------------------- 2. nvidia-smi duplicate targets
@pytest.mark.parametrize("header,values,power,limit,clock", [
    ("power.draw [W], power.limit [W], enforced.power.limit [W]", "300.00 W, 450.00 W, 400.00 W", 300.0, 400.0, None),
    ("power.draw.average [W], power.draw.instant [W]", "300.00 W, 310.00 W", 300.0, None, None),
    ("power.draw.instant [W], power.draw [W]", "310.00 W, 300.00 W", 300.0, None, None),
    ("power.draw [W], power.draw [W]", "300.00 W, 999.00 W", 300.0, None, None),
    ("power.draw [W], clocks.current.sm [MHz], clocks.sm [MHz]", "300 W, 1000 MHz, 1400 MHz", 300.0, None, 1400.0),
])
def test_nvidia_smi_picks_one_column_per_target(tmp_path, header, values, power, limit, clock):
    f = tmp_path / "smi.csv"
    f.write_text(f"timestamp, name, index, {header}\n2024/05/01 12:00:00.000, NVIDIA A100-SXM4-80GB, 0, {values}\n")
    w, notes = import_nvidia_smi(f)
    assert w["power_w"].tolist() == [power] and notes["ignored_columns"]
    if limit is not None:
        assert w["power_limit_w"].tolist() == [limit]
    if clock is not None:
        assert w["sm_clock_mhz"].tolist() == [clock]


# ----------------------------------------------------------------------------- 3. malformed Kineto fields
def test_kineto_malformed_fields_are_import_errors(tmp_path):
    with pytest.raises(ProfileImportError, match="event #0.*'args'"):
        import_kineto(_trace(tmp_path, cpu_args="oops"))
    with pytest.raises(ProfileImportError, match="event #2.*'ts' 'abc'"):
        import_kineto(_trace(tmp_path, kts="abc"))
    r = run_cli("profile", "import", str(_trace(tmp_path, kts="abc")), "-o", str(tmp_path / "o"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "ampere_sgemm" in flat(r.stderr)


# ----------------------------------------------------------------------------- 4. impossible measurements
@pytest.mark.parametrize("kw,why", [({"kdur": -50}, INVALID_DURATION), ({"kdur": None}, INVALID_DURATION),
                                    ({"kdur": float("inf")}, INVALID_DURATION), ({"kdur": "abc"}, INVALID_DURATION),
                                    ({"dims": ((-64, 128), (128, 32))}, INVALID_SHAPE)])
def test_kineto_impossible_measurements_are_unmapped(tmp_path, kw, why):
    k, _, notes = import_kineto(_trace(tmp_path, **kw))
    assert k["OPName"].tolist() == [""] and k["reason"].tolist() == [why]
    assert notes["mapped_rows"] == 0 and notes["unmapped_reasons"] == {why: 1}
    lat = k["latency_ms"].iloc[0]
    assert (lat != lat) or lat >= 0


def test_validate_trace_without_comparable_rows_is_exit_2(tmp_path):
    r = run_cli("validate", "trace", str(_trace(tmp_path, kdur=-50)), "-d", "A100-SXM4-40GB", "--json")
    assert r.returncode == 2 and "invalid duration" in flat(r.stderr) and "Traceback" not in r.stderr


def test_json_safe_is_strict_json():
    doc = json_safe({"a": float("nan"), "b": [float("inf"), 1.5], "c": {"d": -math.inf}})
    assert json.loads(json.dumps(doc, allow_nan=False)) == {"a": None, "b": [None, 1.5], "c": {"d": None}}


# ----------------------------------------------------------------------------- 5. nccl-tests bad rows
def test_nccl_tests_flags_and_counts_bad_rows(tmp_path):
    log = tmp_path / "all_reduce_perf.log"
    log.write_text(NCCL_TESTS_NCCL_HEAD + """\
           8             2     float     sum      -1    25.10    0.00    0.00     12    24.80    0.00    0.00      3
        1024           256     float     sum      -1    26.30    0.04    0.04      0    26.00    0.04    0.04      0
        2048           512     float     sum      -1   -26.30    0.04    0.06      0    26.00    0.04    0.06      0
        4096          1024     float     sum      -1      N/A     N/A     N/A      0    26.00    0.04    0.06      0
     1048576        262144     float     sum      -1    60.50   17.33
""")
    c, notes = import_nccl_tests(log)
    assert c["size_B"].tolist() == [8, 1024]
    assert c["reason"].iloc[0].startswith("nccl-tests #wrong > 0") and c["reason"].iloc[1] == ""
    assert notes["unreadable_lines"] == 3 and sum(notes["unmapped_reasons"].values()) == 4
    assert (c["time_us"] > 0).all()


# ----------------------------------------------------------------------------- audit stop 54 #5: invalid nsys rows
def _nsys(path, ranges_kernels):
    """A minimal Nsight Systems export: one NVTX range per kernel (text, kernel start, kernel end in ns)."""
    import sqlite3

    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
            correlationId INTEGER, globalPid INTEGER, shortName INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, globalTid INTEGER,
            correlationId INTEGER);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER, text TEXT, globalTid INTEGER,
            textId INTEGER);
        CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT);
        INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA A100-SXM4-40GB');
        INSERT INTO StringIds VALUES (1, 'ampere_gemm');
    """)
    for i, (text, start, end) in enumerate(ranges_kernels):
        t0 = 1_000_000 * (i + 1)
        con.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, 7, NULL)", (t0 - 10_000, t0, text))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 7, ?)", (t0 - 5_000, t0 - 4_000, 100 + i))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?, 1, 1)", (t0 + start, t0 + end, 100 + i))
    con.commit()
    con.close()
    return path


BAD_NSYS = [("bmm[fp32] B=1 M=64 N=64 K=64", 0, 20_000),          # valid: 0.02 ms
            ("bmm[fp32] B=1 M=4096 N=4096 K=4096", 2_000_000, 0),  # end before start: -2 ms
            ("bmm[fp32] B=1 M=64 N=64 K=64", 5_000, 5_000),        # end == start
            ("bmm[int8] B=1 M=64 N=64 K=64", 0, 2_000),
            ("bmm[xyz] B=1 M=64 N=64 K=64", 0, 2_000),
            ("bmm[fp16] B=0 M=99999999999999 N=64 K=64", 0, 2_000)]


def test_nsys_import_keeps_invalid_rows_unmapped_naming_them(tmp_path):
    from wattcast.data.profiles.nsys import import_nsys

    db = _nsys(tmp_path / "bad.sqlite", BAD_NSYS)
    k, _, notes = import_nsys(db)
    assert k["OPName"].tolist() == ["bmm", "", "", "", "", ""] and notes["mapped_rows"] == 1
    reasons = k["reason"].tolist()
    assert "latency_ms -2 is negative" in reasons[1] and "latency_ms 0" in reasons[2]
    assert "invalid dtype: 'int8'" in reasons[3] and "invalid dtype: 'xyz'" in reasons[4]
    assert "B=0" in reasons[5] and "beyond 2**40" in reasons[5]
    assert notes["unmapped_reasons"] == {"invalid measured time": 2, "invalid dtype": 2, "invalid shape": 1}
    assert notes["invalid_rows"] == 5 and str(db) in notes["warning"] and "kernel row 4 (correlationId 103" in notes["warning"]
    # busy time counts only the valid intervals (a -2 ms kernel adds none)
    assert notes["busy"]["compute_busy_ms"] == pytest.approx(0.02 + 3 * 0.002)
    r = run_cli("profile", "import", str(db), "-o", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert "bmm[int8]" in flat(r.stderr) and "1 kernel rows mapped" in flat(r.stderr)  # the range text, not eaten as markup
    # validate trace: a -2 ms duration is an invalid measurement, never "measured time 0"
    neg = _nsys(tmp_path / "neg.sqlite", BAD_NSYS[1:3])
    r = run_cli("validate", "trace", str(neg), "-d", "A100-SXM4-40GB")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "2 x invalid measured time" in flat(r.stderr) and "measured time 0" not in flat(r.stderr)


def test_kineto_zero_size_operand_is_kept_unmapped(tmp_path):
    """An aten::mm on an empty tensor (M = 0) failed the trainer's check (B/M > 0) as a mapped row."""
    k, _, notes = import_kineto(_trace(tmp_path, dims=((0, 128), (128, 32))))
    assert k["OPName"].tolist() == [""] and k["reason"].iloc[0].startswith("invalid shape: M=0")
    assert notes["unmapped_reasons"] == {"invalid shape": 1} and "kernel row 1 (aten::mm" in notes["warning"]


def test_training_rows_name_the_folder_and_line_of_an_invalid_row(tmp_path):
    """A mapped row an older importer wrote (dtype int8) named a deleted temporary file and its line at train time."""
    from wattcast.data.profiles.training_input import kernel_training_rows

    trace = _trace(tmp_path)
    mixed = tmp_path / "mixed"
    assert run_cli("profile", "import", str(trace), "-o", str(mixed)).returncode == 0
    k = read_table(mixed, "kernels")
    bad = k.iloc[[0]].assign(dtype="int8")
    pd.concat([k, k, bad], ignore_index=True).to_csv(mixed / "kernels.csv", index=False)
    with pytest.raises(ProfileImportError, match=r"mixed/kernels.csv: 1 mapped kernel row\(s\).*line 4: invalid dtype: 'int8'"):
        kernel_training_rows([mixed])
    r = run_cli("train", "kernels", "--data", str(mixed), "--only-csv", "--quick", "--out", str(tmp_path / "k"),
                "--no-mlflow")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{mixed}/kernels.csv" in flat(r.stderr) and "line 4" in flat(r.stderr)
    assert "wattcast-imported" not in r.stderr


def test_a_power_csv_without_profile_json_says_what_the_folder_needs(tmp_path):
    from wattcast.data.profiles.training_input import split_data_args

    d = tmp_path / "gp"
    d.mkdir()
    (d / "power.csv").write_text("timestamp,power_w\nt0,300\n")
    with pytest.raises(ProfileImportError, match="holds power.csv but no profile.json"):
        split_data_args([d])
    r = run_cli("train", "power", "--data", str(d), "--out", str(tmp_path / "o"), "--no-mlflow")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no profile.json" in flat(r.stderr) and "wattcast profile import" in flat(r.stderr)
    assert split_data_args([tmp_path / "empty_root"]) == (tmp_path / "empty_root", [])  # no tables: a dataset root
