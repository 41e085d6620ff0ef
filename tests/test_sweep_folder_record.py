"""A sweep's output folder records its tasks: a spec without a task done there is refused (or overwritten on request),
a rerun that recomputes (other code or models) replaces its stale parts, other settings are refused; a price a task needs can be given in the spec; a task that ended
with status error fails the CLI run and is listed under "failed"."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import wattcast.sweep as sweep
from wattcast.sweep import FOLDER_RECORD, SweepSpecError, done_tasks, load_spec, read_sweep, run_sweep, summary

from conftest import flat, run_cli

SPEC = dict(models=["gpt2"], clusters=["DGX-A100"], gpus=[8], batch=16, seq=128, max_configs=4)
#: a cost objective in a region where the shipped table has no A100 price (the audit's sw3 tasks)
PRICED = dict(SPEC, regions=["FR"], tokens=1e9, objective="cost")


def _rank1_per_key(df: pd.DataFrame) -> int:
    return int(df[df["rank"] <= 1].groupby(["model", "cluster", "gpus", "region"]).size().max())


def test_a_spec_without_a_done_task_is_refused_and_overwrite_replaces(tmp_path):
    out = tmp_path / "o"
    run_sweep(dict(SPEC, gpus=[8, 16]), out, workers=0)
    assert (out / FOLDER_RECORD).is_file() and len(done_tasks(out)) == 2
    # judged per task (stop 46b): a spec that leaves out a task done here is refused, naming it
    with pytest.raises(SweepSpecError, match="tasks this spec does not have"):
        run_sweep(dict(SPEC, batch=32), out, workers=0)
    assert len(done_tasks(out)) == 2  # nothing removed without the flag
    run_sweep(dict(SPEC, batch=32), out, workers=0, overwrite=True)
    df = read_sweep(out)
    assert len(done_tasks(out)) == 1 and _rank1_per_key(df) == 1
    # the same tasks with another setting: refused (the spec changed; its results are kept), --overwrite replaces
    with pytest.raises(SweepSpecError, match="other settings"):
        run_sweep(SPEC, out, workers=0)
    assert len(done_tasks(out)) == 1
    r = run_sweep(SPEC, out, workers=0, overwrite=True)
    assert r.ran == 1 and len(done_tasks(out)) == 1 and _rank1_per_key(read_sweep(out)) == 1


def test_a_folder_without_a_record_holding_other_parts_is_refused(tmp_path):
    out = tmp_path / "o"
    run_sweep(dict(SPEC, gpus=[8, 16]), out, workers=0)
    (out / FOLDER_RECORD).unlink()  # as written by a wattcast before the record
    assert run_sweep(dict(SPEC, gpus=[8, 16]), out, workers=0).skipped == 2  # its own parts: resumed (and recorded)
    (out / FOLDER_RECORD).unlink()
    with pytest.raises(SweepSpecError, match="no record of the spec"):
        run_sweep(SPEC, out, workers=0)


def test_a_rerun_after_a_code_change_replaces_the_stale_parts(tmp_path, monkeypatch):
    out = tmp_path / "o"
    spec = dict(SPEC, gpus=[8, 16])
    run_sweep(spec, out, workers=0)
    before = done_tasks(out)
    monkeypatch.setattr(sweep, "_code_digest", lambda: "changedcode00000")
    r = run_sweep(spec, out, workers=0)
    assert r.ran == 2
    after = done_tasks(out)
    assert len(after) == 2 and after.isdisjoint(before)
    df = read_sweep(out)
    assert _rank1_per_key(df) == 1 and df["task_id"].nunique() == 2
    assert json.loads((out / FOLDER_RECORD).read_text())["wattcast_code"] == "changedcode00000"


def test_cloud_price_is_a_sweep_key(tmp_path):
    df = read_sweep(run_sweep(PRICED, tmp_path / "a", workers=0).output)
    assert (df["status"] == "error").all()
    assert "in a sweep spec: the key cloud_usd_per_gpu_hour" in df["error"].iloc[0]
    best = summary(read_sweep(run_sweep(dict(PRICED, cloud_usd_per_gpu_hour=2.5), tmp_path / "b", workers=0).output))
    assert (best["status"] == "ok").all() and (best["run_cloud_usd"] > 0).all()
    # the same through the footprint mapping; and refused without tokens, or with a region in it
    assert load_spec(dict(PRICED, footprint={"cloud_usd_per_gpu_hour": 2.5})).footprint == {"cloud_usd_per_gpu_hour": 2.5}
    with pytest.raises(SweepSpecError, match="give 'tokens'"):
        load_spec(dict(SPEC, cloud_usd_per_gpu_hour=2.5))
    with pytest.raises(SweepSpecError, match="in 'regions'"):
        load_spec(dict(PRICED, footprint={"region": "DE"}))
    with pytest.raises(SweepSpecError, match="unknown footprint_kw option"):
        load_spec(dict(PRICED, footprint={"utilization": 0.5}))


def test_cli_json_lists_error_tasks_and_exits_1(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [gpt2]\nclusters: [DGX-A100, DGX-H100]\ngpus: [8]\nbatch: 16\nseq: 128\nmax_configs: 4\n"
                    "regions: [FR]\ntokens: 1e9\nobjective: cost\n")
    r = run_cli("sweep", spec, "--output", tmp_path / "o", "--workers", "0", "--json", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    failed = out["failed"]
    assert [f["cluster"] for f in failed] == ["DGX-A100"] and failed[0]["status"] == "error"
    assert "cloud_usd_per_gpu_hour" in failed[0]["error"]
    assert "ended with status error" in flat(r.stderr)
    assert "exit 0 when every task has a result" in flat(run_cli("sweep", "--help").stdout).lower().replace("\u2502", "")


def test_a_folder_without_per_task_records_is_not_replaced_unasked(tmp_path):
    out = tmp_path / "o"
    run_sweep(dict(SPEC, batch=16), out, workers=0)
    before = done_tasks(out)
    (out / FOLDER_RECORD).unlink()  # as written before the record: its settings cannot be told from a changed spec
    with pytest.raises(SweepSpecError, match="other settings"):
        run_sweep(dict(SPEC, batch=32), out, workers=0)
    assert done_tasks(out) == before  # the old results kept


def test_a_resume_reads_the_earlier_errors_from_the_record_not_the_parts(tmp_path, monkeypatch):
    out = tmp_path / "o"
    spec = dict(SPEC, gpus=[8, 16])

    def half_broken(task):  # the 16-GPU task ends with status error, in two rows
        rows = 2 if int(task["gpus"]) == 16 else 1
        return pd.DataFrame({"task_id": [task["task_id"]] * rows, "model": [task["model"]] * rows,
                             "cluster": [task["cluster"]] * rows, "gpus": [task["gpus"]] * rows, "region": [""] * rows,
                             "rank": list(range(rows)), "status": ["error" if rows == 2 else "ok"] * rows,
                             "error": ["boom", "bang"] if rows == 2 else [""]})

    monkeypatch.setattr(sweep, "run_task", half_broken)
    first = run_sweep(spec, out, workers=0)
    entries = json.loads((out / FOLDER_RECORD).read_text())["tasks"]
    assert sorted((e["key"][2], e["part"]["error_rows"], tuple(e["part"]["errors"])) for e in entries.values()) == [
        (8, 0, ()), (16, 2, ("boom", "bang"))]
    opened = []
    real = pd.read_parquet
    monkeypatch.setattr(pd, "read_parquet", lambda *a, **k: opened.append(a) or real(*a, **k))
    again = run_sweep(spec, out, workers=0)
    assert again.skipped == 2 and not opened  # the parts are not opened on resume
    assert again.failed_tasks == first.failed_tasks and [f["error"] for f in again.failed_tasks] == ["boom"]
    # a folder written before the record kept the parts' statuses: read from the parts, the same errors
    record = json.loads((out / FOLDER_RECORD).read_text())
    for e in record["tasks"].values():
        e.pop("part")
    (out / FOLDER_RECORD).write_text(json.dumps(record))
    old = run_sweep(spec, out, workers=0)
    assert len(opened) == 2 and old.failed_tasks == first.failed_tasks
