"""Sweep spec keys for Megatron-Core's fused cross-entropy loss (``cross_entropy_loss_fusion``,
``cross_entropy_fusion_impl``) reach each task's search and its id; task ids hash the manifests of the shipped models
and wattcast's version, so a sweep resumed after an upgrade recomputes instead of keeping rows under the same ids."""

from __future__ import annotations

import re
import shutil

import pytest

import wattcast
from wattcast.sweep import SweepSpecError, load_spec, read_sweep, run_sweep

SPACE = dict(tp=[2], pp=[1], zero=[1], sp=[True], micro_batch=[1], recompute=["none"], interleave=[1])
SPEC = dict(models=["llama3_8b"], clusters=["DGX-H100"], gpus=[8], batch=16, seq=2048, framework="megatron",
            max_configs=5, top=1, space=SPACE)


def test_cross_entropy_fusion_reaches_the_rows_as_search_gives_them(tmp_path):
    """A plain Megatron-LM (unfused) sweep is costed unfused: another step time than the fused default, the one
    wattcast.search gives with the same setting; both keys are in the task and its id only when given."""
    rows = {}
    for fusion in (False, True):
        df = read_sweep(run_sweep(dict(SPEC, cross_entropy_loss_fusion=fusion), tmp_path / f"o{fusion}",
                                  workers=0).output)
        assert df["status"].iloc[0] == "ok", df["error"].iloc[0]
        rows[fusion] = df["step_time_ms"].iloc[0]
        ref = wattcast.search("llama3_8b", "DGX-H100", 8, 16, 2048, framework="megatron", max_configs=5,
                              cross_entropy_loss_fusion=fusion, **SPACE)
        assert rows[fusion] == pytest.approx(ref.ranked["step_time_ms"].iloc[0], rel=1e-12)
    assert rows[False] != pytest.approx(rows[True], rel=1e-6)

    te = read_sweep(run_sweep(dict(SPEC, cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te"),
                              tmp_path / "te", workers=0).output)
    ref = wattcast.search("llama3_8b", "DGX-H100", 8, 16, 2048, framework="megatron", max_configs=5,
                          cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te", **SPACE)
    assert te["step_time_ms"].iloc[0] == pytest.approx(ref.ranked["step_time_ms"].iloc[0], rel=1e-12)

    plain = load_spec(SPEC).tasks()[0]
    off = load_spec(dict(SPEC, cross_entropy_loss_fusion=False)).tasks()[0]
    impl = load_spec(dict(SPEC, cross_entropy_fusion_impl="TE")).tasks()[0]
    assert "cross_entropy_loss_fusion" not in plain and "cross_entropy_fusion_impl" not in plain
    assert off["cross_entropy_loss_fusion"] is False and impl["cross_entropy_fusion_impl"] == "te"
    assert len({plain["task_id"], off["task_id"], impl["task_id"]}) == 3


@pytest.mark.parametrize("patch, needle", [
    (dict(cross_entropy_loss_fusion="yes"), "'cross_entropy_loss_fusion' must be true or false"),
    (dict(cross_entropy_fusion_impl="apex"), "'cross_entropy_fusion_impl': cross_entropy_fusion_impl must be one of"),
    (dict(cross_entropy_loss_fusion=True, framework="hf"), "'cross_entropy_loss_fusion': --cross-entropy-loss-fusion "
                                                            "is Megatron-Core's"),
    (dict(cross_entropy_loss_fusion=True, framework="megatron-deepspeed"),
     "'cross_entropy_loss_fusion': --cross-entropy-loss-fusion is Megatron-Core's"),
])
def test_bad_cross_entropy_fusion_values_are_refused(patch, needle):
    with pytest.raises(SweepSpecError, match=needle):
        load_spec(dict(SPEC, **patch))


def test_task_id_changes_with_the_shipped_manifests(tmp_path, monkeypatch):
    """A shipped model whose manifest changed (a retrained kernel bundle, shipped by an upgrade) changes every id."""
    import wattcast.sweep as sweep

    before = load_spec(SPEC).tasks()[0]
    shipped = sweep._shipped_folder("models")
    copy = tmp_path / "artifacts"
    shutil.copytree(shipped, copy, ignore=shutil.ignore_patterns("*.lgbm.txt", "*.safetensors"))
    real = sweep._shipped_folder
    monkeypatch.setattr(sweep, "_shipped_folder", lambda k: str(copy) if k == "models" else real(k))
    assert load_spec(SPEC).tasks()[0]["task_id"] == before["task_id"]  # the same bytes: the same id
    manifest = copy / "kernel_manifest.json"
    manifest.write_text(manifest.read_text().replace('"schema"', '"schema" ', 1))
    after = load_spec(SPEC).tasks()[0]
    assert after["task_id"] != before["task_id"]
    assert after["model_manifests"]["models"] != before["model_manifests"]["models"]
    assert after["model_manifests"]["collectives"] == before["model_manifests"]["collectives"]


def test_task_id_changes_with_the_version(monkeypatch):
    before = load_spec(SPEC).tasks()[0]
    assert before["wattcast_version"] == wattcast.__version__
    monkeypatch.setattr(wattcast, "__version__", wattcast.__version__ + ".post1")
    assert load_spec(SPEC).tasks()[0]["task_id"] != before["task_id"]


def test_task_id_changes_with_the_code(monkeypatch):
    """A formula changed in code (no model file, the version unchanged: it stays 0.1.0) also changes the ids."""
    import wattcast.sweep as sw

    before = load_spec(SPEC).tasks()[0]
    assert len(before["wattcast_code"]) == 16
    monkeypatch.setattr(sw, "_code_digest", lambda: "0" * 16)
    assert load_spec(SPEC).tasks()[0]["task_id"] != before["task_id"]


def test_a_rerun_after_a_model_change_recomputes(tmp_path, monkeypatch):
    """Resuming into the same folder after the shipped models changed runs the task again (a new part), while an
    unchanged rerun resumes."""
    import wattcast.sweep as sweep

    out = tmp_path / "o"
    assert run_sweep(SPEC, out, workers=0).skipped == 0
    assert run_sweep(SPEC, out, workers=0).skipped == 1
    parts = set(out.glob("part-*.parquet"))
    assert len(parts) == 1
    real = sweep._manifest_digests
    monkeypatch.setattr(sweep, "_manifest_digests", lambda f: {**real(f), "models": "retrained0000000"})
    assert run_sweep(SPEC, out, workers=0).skipped == 0
    # the recomputed part replaced the stale one: one part (one row set) per task
    after = set(out.glob("part-*.parquet"))
    assert len(after) == 1 and after != parts


def test_fp8_recipe_is_a_sweep_key_that_reaches_the_search(tmp_path):
    """``fp8_recipe`` (as --fp8-recipe) is accepted, checked as search checks it and passed to each task's search."""
    spec = dict(models=["gpt2"], clusters=["DGX-H100"], gpus=[8], batch=8, seq=1024, framework="megatron",
                dtype="fp8", max_configs=2, top=1, space=dict(SPACE, zero=[1]))
    task = load_spec(dict(spec, fp8_recipe="tensorwise")).tasks()[0]
    assert task["fp8_recipe"] == "tensorwise"
    assert "fp8_recipe" not in load_spec(spec).tasks()[0]
    with pytest.raises(SweepSpecError, match="fp8_recipe.*needs --dtype fp8"):
        load_spec(dict(spec, dtype="bf16", fp8_recipe="tensorwise"))
    with pytest.raises(SweepSpecError, match="fp8_recipe.*unknown --fp8-recipe"):
        load_spec(dict(spec, fp8_recipe="nvfp4"))
    df = read_sweep(run_sweep(dict(spec, fp8_recipe="tensorwise"), tmp_path / "o", workers=0).output)
    assert df["status"].iloc[0] == "ok", df["error"].iloc[0]
    ref = wattcast.search("gpt2", "DGX-H100", 8, 8, 1024, framework="megatron", dtype="fp8", max_configs=2,
                          fp8_recipe="tensorwise", **dict(SPACE, zero=[1]))
    assert df["step_time_ms"].iloc[0] == pytest.approx(ref.ranked["step_time_ms"].iloc[0], rel=1e-12)


def test_overlaps_is_a_sweep_key_that_reaches_the_search(tmp_path):
    """Megatron-Core's overlap flags for every strategy of a sweep (audit 51: a sweep could set none of them): the
    rows are search's with the same overlaps=; the key is in the task and its id only when given."""
    off = dict(tp_comm_overlap=False, overlap_grad_reduce=False)
    df = read_sweep(run_sweep(dict(SPEC, overlaps=off), tmp_path / "off", workers=0).output)
    assert df["status"].iloc[0] == "ok", df["error"].iloc[0]
    ref = wattcast.search("llama3_8b", "DGX-H100", 8, 16, 2048, framework="megatron", max_configs=5, overlaps=off,
                          **SPACE)
    on = wattcast.search("llama3_8b", "DGX-H100", 8, 16, 2048, framework="megatron", max_configs=5, **SPACE)
    assert df["step_time_ms"].iloc[0] == pytest.approx(ref.ranked["step_time_ms"].iloc[0], rel=1e-12)
    assert ref.ranked["step_time_ms"].iloc[0] != pytest.approx(on.ranked["step_time_ms"].iloc[0], rel=1e-6)
    plain, given = load_spec(SPEC).tasks()[0], load_spec(dict(SPEC, overlaps=off)).tasks()[0]
    assert "overlaps" not in plain and given["overlaps"] == off and plain["task_id"] != given["task_id"]


@pytest.mark.parametrize("overlaps,needle", [
    (["tp_comm_overlap"], "'overlaps' must be a mapping"),
    ({"tp_overlap": False}, "unknown flag(s) tp_overlap; known: overlap_grad_reduce"),
    ({"tp_comm_overlap": "no"}, "each flag must be true or false"),
])
def test_bad_overlaps_are_refused(overlaps, needle):
    with pytest.raises(SweepSpecError, match=re.escape(needle)):
        load_spec(dict(SPEC, overlaps=overlaps))


def test_search_names_the_overlaps_option_for_an_overlap_flag():
    """wattcast.search(tp_comm_overlap=False) is not a search-space option: the error says where it goes."""
    with pytest.raises(ValueError, match=re.escape("give it in overlaps={'tp_comm_overlap': True or False}")):
        wattcast.search("llama3_8b", "DGX-H100", 8, 16, 2048, framework="megatron", max_configs=5,
                        tp_comm_overlap=False)


# ------------------------------------------------------------------------------------------------ audit 54
@pytest.mark.parametrize("patch, needle", [
    (dict(tokens=1e9, cloud_usd_per_gpu_hour=350), "'cloud_usd_per_gpu_hour' is 350, over 30"),
    (dict(tokens=1e9, footprint=dict(pue=0.5)), "'footprint.pue' must be >= 1"),
    (dict(tokens=1e9, footprint=dict(cloud_usd_per_gpu_hour=350)), "'footprint.cloud_usd_per_gpu_hour' is 350"),
    (dict(tokens=1e9, footprint=dict(lifetime_years=-1)), "'footprint.lifetime_years'"),
])
def test_run_option_values_are_spec_errors_naming_the_key(tmp_path, patch, needle):
    """A bad run option is refused when the spec is read (naming its key), as search refuses it: no task runs."""
    with pytest.raises(SweepSpecError, match=re.escape(needle)):
        load_spec(dict(SPEC, **patch))
    with pytest.raises(SweepSpecError):
        run_sweep(dict(SPEC, **patch), tmp_path / "out", workers=0)
    assert not (tmp_path / "out").exists()
    assert load_spec(dict(SPEC, tokens=1e9, cloud_usd_per_gpu_hour=3.5, footprint=dict(pue=1.1))).footprint == dict(
        cloud_usd_per_gpu_hour=3.5, pue=1.1)


def test_a_value_given_twice_is_one_task_and_said():
    """gpus: [8, 8], a preset in two spellings, a region as ISO2 and ISO3: one task each, first spelling kept (its
    task id unchanged), and a note per repeat."""
    spec = load_spec(dict(SPEC, gpus=[8, 8], clusters=["DGX-H100", "dgx-h100"], tokens=1e9, regions=["FR", "FRA"]))
    assert spec.gpus == (8,) and spec.clusters == ("DGX-H100",) and spec.regions == ("FR",)
    assert len(spec.tasks()) == 1
    assert spec.tasks()[0]["task_id"] == load_spec(dict(SPEC, tokens=1e9, regions=["FR"])).tasks()[0]["task_id"]
    assert len(spec.notes) == 3 and all("run once" in n for n in spec.notes)
    assert any("'dgx-h100' repeats 'DGX-H100'" in n for n in spec.notes)
    assert load_spec(SPEC).notes == ()


def test_output_folder_with_other_files_is_refused_and_overwrite_keeps_them(tmp_path):
    """A folder holding a file the sweep did not write is refused, naming it; --overwrite writes beside it and removes
    only the parts its record says a sweep wrote, never a user's part-mine.parquet."""
    out = tmp_path / "uo"
    out.mkdir()
    (out / "notes.txt").write_text("x")
    with pytest.raises(SweepSpecError, match="notes.txt"):
        run_sweep(SPEC, out, workers=0)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    (out / "part-mine.parquet").write_text("mine")
    run_sweep(SPEC, out, workers=0, overwrite=True)
    run_sweep(SPEC, out, workers=0, overwrite=True)
    assert (out / "part-mine.parquet").read_text() == "mine" and (out / "notes.txt").read_text() == "x"
    assert len(read_sweep(out)) == 1


def test_implausible_value_errors_do_not_offer_a_force_the_sweep_lacks(tmp_path):
    """Audit 54c: a spec's implausible figure said "pass --force", which `wattcast sweep` does not take. The sweep's
    message names the key and the plausible range without it (search's still offers --force, which search has)."""
    import yaml

    from conftest import flat, run_cli
    from wattcast.sweep import _in_sweep_terms

    with pytest.raises(SweepSpecError) as e:
        load_spec(dict(SPEC, tokens=1e9, cloud_usd_per_gpu_hour=350))
    assert "'cloud_usd_per_gpu_hour' is 350, over 30" in str(e.value) and "(plausible: 0 to 30)" in str(e.value)
    assert "--force" not in str(e.value) and "allow_exotic" not in str(e.value)
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(dict(SPEC, tokens=1e9, footprint=dict(cloud_usd_per_gpu_hour=350))))
    r = run_cli("sweep", spec, "--output", tmp_path / "o", "--workers", "0")
    assert r.returncode == 2 and "'footprint.cloud_usd_per_gpu_hour' is 350" in flat(r.stderr)
    assert "--force" not in r.stderr
    s = run_cli("search", "-m", "gpt2", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "16", "--tokens", "1e9",
                "--cloud-usd-per-gpu-hour", "350")
    assert s.returncode == 2 and "pass --force" in flat(s.stderr)  # search has the switch
    # a task's own error (a search's run-length check) is said in the sweep's terms too
    msg = ("tokens (--tokens) is 1e+30: ... over 1e+06 (114 years); give the run's tokens (e.g. 1e12, not 1e30), or pass "
           "--force (in Python wattcast.allow_exotic()) for a deliberately exotic run")
    assert _in_sweep_terms(msg).endswith("give the run's tokens (e.g. 1e12, not 1e30)")


def test_overwrite_names_the_part_files_it_removes(tmp_path):
    """Audit 54c: `wattcast sweep --overwrite` deleted the folder's parts without a word. It now names each removed
    file (on stderr; run_sweep's on_removed and the outcome's removed_parts), and a run without --overwrite removes
    nothing and says nothing."""
    import json

    import yaml

    from conftest import flat, run_cli

    spec = dict(SPEC, gpus=[8, 16])
    out = tmp_path / "o"
    first = run_sweep(spec, out, workers=0)
    parts = sorted(p.name for p in out.glob("part-*.parquet"))
    assert len(parts) == 2 and first.removed_parts == []
    told = []
    again = run_sweep(spec, out, workers=0, overwrite=True, on_removed=lambda o, names: told.append((o, names)))
    assert told == [(out, parts)] and again.removed_parts == parts and again.ran == 2
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = run_cli("sweep", path, "--output", out, "--workers", "0", "--overwrite", "--json")
    assert r.returncode == 0, r.stderr
    err = flat(r.stderr)
    assert f"--overwrite removed 2 part files of an earlier sweep from {out}:" in err
    assert all(str(out / p) in err for p in parts)
    assert json.loads(r.stdout)["removed_parts"] == parts
    r = run_cli("sweep", path, "--output", out, "--workers", "0", "--json")
    assert r.returncode == 0 and "removed" not in r.stderr and json.loads(r.stdout)["removed_parts"] == []
