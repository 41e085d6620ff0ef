"""`wattcast sweep` task ids hash what a cluster file (and a device spec file it names, and a model file) says, so an
edited file rerun into the same output folder reruns its tasks instead of reusing stale parts (and stale error rows);
presets and built-in names keep the ids they had."""

from __future__ import annotations

import json

import yaml

from conftest import REPO, write_preset_cluster

DEVICES = REPO / "data" / "devices"
CLUSTERS = REPO / "data" / "clusters"


# ------------------------------------------------------------------ 4. sweep task ids follow what a file says
def test_sweep_task_id_hashes_cluster_and_device_file_contents(tmp_path):
    from wattcast.sweep import load_spec

    (tmp_path / "gpu.yaml").write_text((DEVICES / "H100-SXM5-80GB.yaml").read_text())
    cl = write_preset_cluster(tmp_path / "cl.yaml", "gpu.yaml")
    spec = dict(models=["gpt2"], clusters=[str(cl), "DGX-A100"], gpus=[8], batch=8, seq=128)

    def ids():
        return [t["task_id"] for t in load_spec(spec).tasks()]

    first = ids()
    preset_task = load_spec(spec).tasks()[1]
    assert "cluster_figures" not in preset_task and "model_file" not in preset_task  # a preset's id is as it was
    cl.write_text(cl.read_text() + "# a comment changes nothing\n")
    assert ids() == first
    write_preset_cluster(cl, "gpu.yaml", nic=200)
    second = ids()
    assert second[0] != first[0] and second[1] == first[1]
    gpu = yaml.safe_load((tmp_path / "gpu.yaml").read_text())
    (tmp_path / "gpu.yaml").write_text(yaml.safe_dump({**gpu, "tdp_w": 650}))
    assert ids()[0] != second[0]  # the device spec file the cluster names counts too


def test_sweep_model_file_contents_are_in_the_task_id(tmp_path):
    from wattcast.sweep import load_spec

    cfg = json.loads((REPO / "featurize" / "hf_configs" / "gpt2.json").read_text())
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    spec = dict(models=[str(f)], clusters=["DGX-A100"], gpus=[8], batch=8, seq=128)
    a = load_spec(spec).tasks()[0]["task_id"]
    f.write_text(json.dumps({**cfg, "n_layer": cfg.get("n_layer", 12) + 1}))
    assert load_spec(spec).tasks()[0]["task_id"] != a


def test_sweep_reruns_a_task_whose_cluster_file_was_edited(tmp_path):
    from wattcast.sweep import read_sweep, run_sweep

    cl = write_preset_cluster(tmp_path / "cl.yaml", "A100-SXM4-80GB")
    spec = dict(models=["gpt2"], clusters=[str(cl)], gpus=[8], batch=8, seq=128, dtype="fp8", max_configs=4)
    out = tmp_path / "out.parquet"
    first = run_sweep(spec, out, workers=0)
    assert first.ran == 1 and read_sweep(out)["status"].iloc[0] == "no valid strategy"  # A100s have no FP8
    assert run_sweep(spec, out, workers=0).skipped == 1  # unchanged: resumed
    write_preset_cluster(cl, "H100-SXM5-80GB")  # the file now names a GPU with FP8
    again = run_sweep(spec, out, workers=0)
    assert again.ran == 1 and again.skipped == 0
    df = read_sweep(out)
    assert "ok" in set(df["status"])
