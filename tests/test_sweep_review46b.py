"""Sweep fixes from the review of stop 46: the docstring's spec runs and a zero3_prefetch without a per-unit
candidate is refused up front naming the spec keys; a folder is judged per task (a spec extended with more tasks
reuses the parts it shares); a stale part is never swapped for an error part; SweepOutcome.failed_tasks lists what
the CLI's --json "failed" lists."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

import wattcast.sweep as sweep
from wattcast.sweep import (FOLDER_RECORD, SweepSpec, SweepSpecError, done_tasks, load_spec, read_sweep, run_sweep,
                            spec_digest, task_settings_digest)

from conftest import run_cli

SPEC = dict(models=["gpt2"], clusters=["DGX-A100"], gpus=[8], batch=16, seq=128, max_configs=4)


def _docstring_value(key: str):
    import yaml

    m = re.search(rf"^\s+{key}:\s*(.*?)\s*(#|$)", sweep.__doc__, re.M)
    assert m, key
    return yaml.safe_load(m.group(1))


def test_the_docstring_zero3_prefetch_example_runs_and_a_space_without_zero3_is_refused_up_front(tmp_path):
    ex = {k: _docstring_value(k) for k in ("framework", "space", "zero3_prefetch")}
    assert ex["zero3_prefetch"] is True and ex["framework"] == "hf"
    spec = dict(SPEC, **dict(ex, space=dict(ex["space"], tp=[1, 2])))
    df = read_sweep(run_sweep(spec, tmp_path / "ok", workers=0).output)
    assert (df["status"] == "ok").all(), df["error"].tolist()
    # zero [1] under hf has no per-unit collectives: refused at load, naming the spec's keys, not CLI flags
    with pytest.raises(SweepSpecError) as e:
        load_spec(dict(spec, space={"zero": [1]}))
    msg = str(e.value)
    assert "'zero3_prefetch'" in msg and "'space'" in msg and "--zero" not in msg
    with pytest.raises(SweepSpecError):
        run_sweep(dict(spec, space={"zero": [1]}), tmp_path / "bad", workers=0)
    assert not done_tasks(tmp_path / "bad")  # no part written for a spec that fails validation
    load_spec(dict(spec, space={"zero": [1, 2]}))  # FSDP's ZeRO-2 (hf) has them
    with pytest.raises(SweepSpecError, match="'zero3_prefetch'"):
        load_spec(dict(spec, framework="megatron", space={"zero": [1, 2]}))


def test_an_extended_spec_reuses_the_shared_tasks_parts(tmp_path):
    out = tmp_path / "o"
    run_sweep(SPEC, out, workers=0)
    first = done_tasks(out)
    r = run_sweep(dict(SPEC, gpus=[8, 16]), out, workers=0)
    assert (r.skipped, r.ran) == (1, 1) and first <= done_tasks(out) and len(done_tasks(out)) == 2
    # a spec that leaves a done task out is refused (its part is not deleted unasked)
    with pytest.raises(SweepSpecError, match="tasks this spec does not have .*gpt2 on 16 x DGX-A100"):
        run_sweep(SPEC, out, workers=0)
    assert len(done_tasks(out)) == 2
    record = json.loads((out / FOLDER_RECORD).read_text())
    assert {e["key"][2] for e in record["tasks"].values()} == {8, 16}


def test_a_changed_setting_is_refused_and_overwrite_recomputes_its_tasks(tmp_path):
    out = tmp_path / "o"
    run_sweep(SPEC, out, workers=0)
    before = done_tasks(out)
    with pytest.raises(SweepSpecError, match="other settings"):
        run_sweep(dict(SPEC, batch=32), out, workers=0)
    assert done_tasks(out) == before  # the old results kept
    r = run_sweep(dict(SPEC, batch=32), out, workers=0, overwrite=True)
    assert r.ran == 1 and done_tasks(out).isdisjoint(before) and len(done_tasks(out)) == 1
    df = read_sweep(out)
    assert len(df[df["rank"] <= 1]) == 1 and df["task_id"].iloc[0] not in before


def test_digests_hash_only_fields_that_differ_from_their_defaults():
    base = SweepSpec(models=("gpt2",), clusters=("DGX-A100",), gpus=(8,), batch=8, seq=1024)
    same = SweepSpec(models=("gpt2",), clusters=("DGX-A100",), gpus=(8,), batch=8, seq=1024, dtype="bf16",
                     footprint={}, data_load_ms=0.0)
    assert spec_digest(base) == spec_digest(same)
    assert spec_digest(base) != spec_digest(SweepSpec(models=("gpt2",), clusters=("DGX-A100",), gpus=(8,), batch=8,
                                                      seq=1024, dtype="fp16"))
    t = dict(model="gpt2", cluster="DGX-A100", gpus=8, region=None, task_id="x", batch=8, seq=1024, dtype="bf16",
             wattcast_code="a")
    assert task_settings_digest(t) == task_settings_digest({k: v for k, v in t.items() if k != "dtype"})
    assert task_settings_digest(t) == task_settings_digest(dict(t, wattcast_code="b", gpus=16, task_id="y"))
    assert task_settings_digest(t) != task_settings_digest(dict(t, batch=16))


def test_a_stale_ok_part_is_kept_when_its_replacement_is_an_error(tmp_path, monkeypatch):
    out = tmp_path / "o"
    run_sweep(SPEC, out, workers=0)
    old = done_tasks(out)
    monkeypatch.setattr(sweep, "_code_digest", lambda: "changedcode00000")

    def broken(task):
        return pd.DataFrame({"task_id": [task["task_id"]], "model": [task["model"]], "cluster": [task["cluster"]],
                             "gpus": [task["gpus"]], "region": [""], "rank": [0], "status": ["error"],
                             "error": ["boom"]})

    monkeypatch.setattr(sweep, "run_task", broken)
    r = run_sweep(SPEC, out, workers=0)
    assert done_tasks(out) == old  # the ok part stays; no error part beside it
    assert r.ran == 0 and len(r.failed_tasks) == 1 and "boom" in r.failed_tasks[0]["error"]
    assert "is kept" in r.failed_tasks[0]["error"]
    assert (read_sweep(out)["status"] == "ok").all()
    # a stale part that is itself an error is replaced by the new error part (the newer message)
    monkeypatch.setattr(sweep, "run_task", lambda task: broken(task).assign(error="first"))
    run_sweep(dict(SPEC, batch=32), out, workers=0, overwrite=True)
    monkeypatch.setattr(sweep, "_code_digest", lambda: "changedcode00001")
    monkeypatch.setattr(sweep, "run_task", broken)
    run_sweep(dict(SPEC, batch=32), out, workers=0)
    assert len(done_tasks(out)) == 1 and list(read_sweep(out)["error"]) == ["boom"]


def test_failed_tasks_are_the_cli_failed_entries(tmp_path):
    priced = dict(SPEC, clusters=["DGX-A100", "DGX-H100"], regions=["FR"], tokens=1e9, objective="cost")
    r = run_sweep(priced, tmp_path / "o", workers=0)
    keys = {"task_id", "model", "cluster", "gpus", "region", "status", "error"}
    assert [f["cluster"] for f in r.failed_tasks] == ["DGX-A100"] and set(r.failed_tasks[0]) == keys
    assert r.failed_tasks[0]["gpus"] == 8 and r.failed_tasks[0]["region"] == "FR"
    again = run_sweep(priced, tmp_path / "o", workers=0)  # a rerun skips it, and still says it failed
    assert again.skipped == 2 and again.failed_tasks == r.failed_tasks
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps(priced))
    c = run_cli("sweep", spec, "--output", tmp_path / "o", "--workers", "0", "--json", cwd=tmp_path)
    assert c.returncode == 1 and json.loads(c.stdout)["failed"] == r.failed_tasks
