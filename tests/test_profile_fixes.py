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
