"""The import audit (stop 47): a trace's measured step time is the GPU span of each ProfilerStep's work (not the
CPU-side span, which runs ahead of the GPU), steps without GPU work are dropped and said, and the trace's memcpy /
memset events are counted by kind instead of dropped unsaid."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from wattcast.data.profiles.busy import copy_kind, merge_busy, step_gpu_spans_ms
from wattcast.data.profiles.kineto import import_kineto

from conftest import flat, run_cli


def _trace(data_root: Path, name: str) -> Path:
    f = data_root / "traces" / f"{name}.json.gz"
    if not f.is_file():
        pytest.skip(f"{f} not present")
    return f


def test_step_gpu_spans_follow_the_launch_not_the_gpu_clock():
    # step 0 [0, 10] launches events at 1 and 9 that run 50-60 and 60-75; step 1 [20, 30] launches nothing;
    # an event launched at 15 (between steps) and one without a launch site belong to no step
    spans = step_gpu_spans_ms([0, 20], [10, 30], [1, 1], [1, 9, 15, np.nan], [1, 1, 1, None],
                              [50e3, 60e3, 80e3, 0], [60e3, 75e3, 90e3, 1e6])
    assert spans[0] == pytest.approx(25.0) and np.isnan(spans[1])
    # another process's launches are not this step's
    assert np.isnan(step_gpu_spans_ms([0], [10], [1], [5], [2], [0], [1e3])[0])


def test_copy_kinds():
    assert copy_kind("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy") == "HtoD"
    assert copy_kind("Memcpy DtoD (Device -> Device)", "gpu_memcpy") == "DtoD"
    assert copy_kind("Memset (Device)", "gpu_memset") == "memset"


def test_v100_steps_are_gpu_spans_and_cpu_spans_kept_apart(data_root):
    b = import_kineto(_trace(data_root, "v100_rank0"))[2]["busy"]
    # CPU spans 35.12, 72.08, 95.70, 95.55, 95.70 ms; each step's GPU work spans 95.4-97.7 ms
    assert np.round(b["steps_cpu_ms"], 2).tolist() == [35.12, 72.08, 95.7, 95.55, 95.7]
    assert len(b["steps_ms"]) == 5 and min(b["steps_ms"]) > 95.3 and max(b["steps_ms"]) < 97.8


def test_a_step_without_gpu_work_is_dropped_with_a_note(data_root):
    notes = import_kineto(_trace(data_root, "mi250_minitoy_train"))[2]
    assert len(notes["busy"]["steps_cpu_ms"]) == 2 and len(notes["busy"]["steps_ms"]) == 1
    assert notes["busy"]["steps_without_gpu"] == 1 and "ProfilerStep#2" in notes["warning"]


def test_control_trace_copies_and_steps(data_root):
    b = import_kineto(_trace(data_root, "a100_trace_diff_control"))[2]["busy"]
    assert b["copy_events"] == 882 and b["copy_ms"] == pytest.approx(54.75, abs=0.01)
    assert b["copies"]["HtoD"]["events"] == 150 and b["copies"]["HtoD"]["ms"] == pytest.approx(50.66, abs=0.01)
    assert b["copies"]["memset"]["events"] == 654
    # GPU spans (kernels, memcpy, memset of each step) vs the CPU spans 75.47-81.12 ms
    assert min(b["steps_ms"]) == pytest.approx(75.10, abs=0.01) and max(b["steps_ms"]) == pytest.approx(80.58, abs=0.01)
    assert max(b["steps_cpu_ms"]) == pytest.approx(81.12, abs=0.01)
    m = merge_busy([b, b])
    assert m["copy_events"] == 1764 and len(m["steps_ms"]) == 12 and len(m["steps_cpu_ms"]) == 12


def test_import_summary_and_profile_json_count_copies(data_root, tmp_path):
    f = _trace(data_root, "a100_alexnet")
    r = run_cli("profile", "import", f, "--output", tmp_path / "o", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "19 memcpy/memset events, 55.51 ms" in flat(r.stderr) and "HtoD 16 x" in r.stderr
    doc = json.loads((tmp_path / "o" / "profile.json").read_text())
    busy = json.dumps(doc)
    assert '"copy_events": 19' in busy and '"steps_cpu_ms"' in busy


def test_validate_trace_reports_gpu_step_spans(data_root, tmp_path):
    f = _trace(data_root, "a100_trace_diff_control")
    r = run_cli("validate", "trace", f, "--device", "A100-SXM4-40GB", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["step_ms_min"] == pytest.approx(75.10, abs=0.01) and s["step_cpu_ms_min"] == pytest.approx(75.47, abs=0.01)
    assert s["copy_events"] == 882 and s["steps_without_gpu"] == 0
