"""The import audit (stop 47): --device that disagrees with the trace's GPU is warned about and the recorded name is
kept in device_name; the same input given twice is imported once; every unmapped reason is accounted for."""

from __future__ import annotations

import pandas as pd

from conftest import flat, run_cli
from test_profile_import import TraceBuilder


def _small_trace(path):
    b = TraceBuilder()
    b.op("aten::mm", [[32, 64], [64, 16]], ["float", "float"], kernels=(("gemm", 50.0),))
    return b.write(path)


def test_device_override_that_disagrees_is_warned_and_recorded_name_kept(tmp_path):
    trace = _small_trace(tmp_path / "a100.json.gz")
    r = run_cli("profile", "import", trace, "--device", "L4", "--output", tmp_path / "o", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "--device L4 disagrees with the GPU the file records" in flat(r.stderr)
    k = pd.read_csv(tmp_path / "o" / "kernels.csv")
    assert set(k["Device"]) == {"L4"} and "L4" not in set(k["device_name"]) and k["device_name"].str.contains("A100").all()
    # the same GPU named by an alias: no warning
    r = run_cli("profile", "import", trace, "--device", "A100-SXM4-40GB", "--output", tmp_path / "o2", cwd=tmp_path)
    assert r.returncode == 0 and "disagrees" not in r.stderr


def test_the_same_input_twice_is_imported_once(tmp_path):
    trace = _small_trace(tmp_path / "t.json.gz")
    copy = tmp_path / "copy.json.gz"
    copy.write_bytes(trace.read_bytes())
    r = run_cli("profile", "import", trace, trace, copy, "--output", tmp_path / "o", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    said = flat(r.stderr)
    assert "the same file as" in said and "the same content as" in said and "skipped" in said
    once = run_cli("profile", "import", trace, "--output", tmp_path / "o1", cwd=tmp_path)
    assert once.returncode == 0
    assert len(pd.read_csv(tmp_path / "o" / "kernels.csv")) == len(pd.read_csv(tmp_path / "o1" / "kernels.csv"))


def test_import_summary_accounts_for_every_unmapped_reason(tmp_path):
    b = TraceBuilder()
    types = ["int", "long int", "double", "bool", "unsigned char", "signed char", "short int", "c10::complex<float>"]
    for t in types:  # eight input dtypes with no surrogate: eight distinct reasons
        b.op("aten::add", [[4, 4], [4, 4]], [t, t], kernels=(("k", 5.0),))
    b.op("aten::add", [[4, 4], [4, 4]], ["int", "int"], kernels=(("k", 5.0),))
    r = run_cli("profile", "import", b.write(tmp_path / "t.json.gz"), "--output", tmp_path / "o", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    said = flat(r.stderr)
    listed = said.count("unmapped: ")
    assert listed == 6 and "... and " in said
    import json
    import re

    reasons = json.loads((tmp_path / "o" / "profile.json").read_text())["files"][0]["unmapped_reasons"]
    m = re.search(r"\.\.\. and (\d+) more reason\(s\) \((\d+) rows", said)
    assert m, said
    shown = sorted(reasons.values(), reverse=True)
    assert int(m.group(1)) == len(reasons) - 6 and int(m.group(2)) == sum(shown[6:])
