"""nccl-tests import: honest counts of skipped lines, a warning for a cut log, and rows whose time, size and
bandwidths disagree flagged (kept with a reason, never trained on)."""

from __future__ import annotations

from conftest import flat, run_cli

from wattcast.data.collective_ops import busbw_factor
from wattcast.data.profiles.nccl_tests import bandwidth_mismatch, import_nccl_tests

HEAD = "# nThread 1 nGpus 4 minBytes 33554432 maxBytes 268435456 step: 2(factor) warmup iters: 5 iters: 20\n" + "".join(
    f"#  Rank  {i} Group  0 Pid  {100 + i} on    node01 device  {i} [0x0{i}] NVIDIA A100-SXM4-80GB\n" for i in range(4)) + """\
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
    33554432       8388608     float     sum      -1    701.2   47.85   71.78      0    699.8   47.95   71.92      0
    67108864      16777216     float     sum      -1   1370.5   48.97   73.45      0   1368.1   49.05   73.58      0
"""
FOOT = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 73.55\n#\n"


def test_busbw_factor_and_mismatch():
    assert busbw_factor("all_reduce", 4) == 1.5 and busbw_factor("all_gather", 4) == 0.75
    assert busbw_factor("send_recv", 2) == 1.0
    assert bandwidth_mismatch("all_reduce", 268435456, 5399.7, 49.71, 74.57, 4) == ""
    assert "size / time = 4980" in bandwidth_mismatch("all_reduce", 268435456, 53.9, 49.71, 74.57, 4)
    assert "busbw" in bandwidth_mismatch("all_reduce", 268435456, 5399.7, 49.71, 49.71, 4)  # factor 1 printed for 4 ranks
    assert bandwidth_mismatch("all_reduce", 8, 25.1, 0.0, 0.0, 4) == ""  # below the print resolution


def test_inconsistent_row_is_flagged_not_dropped(tmp_path):
    log = tmp_path / "all_reduce_perf.log"
    log.write_text(HEAD + "   268435456      67108864     float     sum      -1   53.9     49.71   74.57      0   5401.2   49.70   74.55      0\n" + FOOT)
    c, notes = import_nccl_tests(log)
    assert len(c) == 3 and c["reason"].iloc[:2].eq("").all()
    assert c["reason"].iloc[2].startswith("time, size and bandwidth disagree")
    assert notes["unmapped_rows"] == 1 and "disagree" in notes["warning"]


def test_truncated_log_warns_and_skipped_lines_are_counted(tmp_path):
    cut = tmp_path / "all_reduce_perf.log"
    cut.write_text(HEAD + "   134217728      33554432     float     sum      -1   2711.0   49.5")
    c, notes = import_nccl_tests(cut)
    assert len(c) == 2 and notes["skipped_rows"] == 1
    assert "truncated" in notes["warning"] and "1 partial last row" in notes["warning"]
    whole = tmp_path / "whole" / "all_reduce_perf.log"
    whole.parent.mkdir()
    whole.write_text(HEAD + FOOT)
    assert "warning" not in import_nccl_tests(whole)[1]
    r = run_cli("profile", "import", str(cut), "--output", str(tmp_path / "p"))
    said = flat(r.stderr)
    assert r.returncode == 0 and "skipped lines 1 (not imported)" in said and "skipped: 1 x unreadable line" in said
    assert "truncated" in said
