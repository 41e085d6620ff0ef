"""`wattcast sweep`: spec checks, Parquet parts as tasks finish, resume, Dask with a killed worker, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

from wattcast.sweep import SweepSpecError, done_tasks, load_spec, read_sweep, run_sweep, summary

SPEC = dict(models=["gpt2"], clusters=["DGX-A100", "DGX-H100"], gpus=[8, 16], batch=32, seq=512, max_configs=12, top=2)


def _strip(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=["task_seconds"]).reset_index(drop=True)


@pytest.mark.parametrize("patch,needle", [
    (dict(gpu=[8]), "unknown key(s) 'gpu' (did you mean 'gpus'?)"),
    (dict(gpus=[]), "'gpus' is an empty list"),
    (dict(gpus=[8, 0]), "'gpus' must be a positive whole number, got 0"),
    (dict(batch=2.5), "'batch' must be a positive whole number"),
    (dict(regions=["aws:us-east-1"]), "give 'tokens'"),
    (dict(tokens=1e9, regions=["atlantis-1"]), "region 'atlantis-1'"),
    (dict(clusters=["DGX-Z900"]), "cluster 'DGX-Z900'"),
    (dict(models=["gpt2", "no_such_model"]), "model 'no_such_model'"),
    (dict(space=dict(tpp=[1])), "unknown search option(s) ['tpp']"),
    (dict(objective="speed"), "'objective' must be"),
    (dict(attention="flash9"), "unknown attention"),
    (dict(moe_routing=dict(imbalance=1.2)), "unknown MoE routing option"),
    (dict(moe_routing=dict(moe_load_imbalance=0.5)), "from 1"),
    (dict(gpus_per_node=16), "nodes have 8 GPUs"),
    (dict(gpus_per_node=0), "'gpus_per_node' must be a positive whole number"),
    # a bad element of the search space: the spec's error at load, naming the option and the element (until stop 55
    # every task ran and ended with status error)
    (dict(space=dict(tp=[2, "x"])), "'space': search-space option tp: every choice must be a positive integer, got 'x'"),
    (dict(space=dict(micro_batch=[1, -2])), "option micro_batch: every choice must be a positive integer, got -2"),
    (dict(space=dict(zero=[1, 4])), "option zero: every choice must be 0, 1, 2 or 3, got 4"),
    (dict(space=dict(cp_comm_type=["a2a+p2p"])), "cp_comm_type a2a+p2p needs hierarchical_cp_sizes"),
])
def test_bad_specs_are_refused_before_anything_runs(tmp_path, patch, needle):
    out = tmp_path / "out.parquet"
    with pytest.raises(SweepSpecError) as e:
        run_sweep({**SPEC, **patch}, out, workers=0)
    assert needle in str(e.value)
    assert not out.exists()


def test_a_key_given_twice_in_a_sweep_yaml_is_refused(tmp_path):
    f = tmp_path / "sweep.yaml"
    f.write_text("models: [gpt2]\nclusters: [DGX-H100]\ngpus: [8]\nbatch: 16\nseq: 512\nbatch: 64\n")
    with pytest.raises(SweepSpecError, match="'batch' given twice"):
        load_spec(f)


def test_a_bad_space_element_in_a_yaml_spec_is_a_spec_error_before_any_task(tmp_path):
    from conftest import flat, run_cli

    f = tmp_path / "sweep.yaml"
    f.write_text("models: [gpt2]\nclusters: [DGX-H100]\ngpus: [8]\nbatch: 32\nseq: 512\nspace:\n  micro_batch: [1, -2]\n")
    r = run_cli("sweep", f, "--workers", "0", "--output", tmp_path / "out")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"error: {f}: 'space': search-space option micro_batch: every choice must be a positive integer, got -2" \
        in flat(r.stderr)
    assert not (tmp_path / "out").exists()


def test_missing_key_is_named():
    spec = dict(SPEC)
    spec.pop("seq")
    with pytest.raises(SweepSpecError, match="missing key 'seq'"):
        load_spec(spec)


def test_tasks_write_parts_and_a_rerun_resumes(tmp_path):
    out = tmp_path / "s.parquet"
    seen = []
    r = run_sweep(SPEC, out, workers=0, progress=lambda d, t: seen.append((d, t)))
    assert (r.total, r.skipped, r.ran) == (4, 0, 4) and seen[-1] == (4, 4)
    df = read_sweep(out)
    assert set(df["status"]) == {"ok"} and df.groupby("task_id").size().max() <= 2
    assert len(done_tasks(out)) == 4 and pd.read_parquet(out).shape[0] == len(df)  # the folder reads as one table
    best = summary(df)
    assert len(best) == 4 and (best["step_time_ms"] > 0).all() and best["strategy"].str.startswith("tp").all()
    # a rerun skips everything; a lost part is recomputed, and the same
    r2 = run_sweep(SPEC, out, workers=0)
    assert (r2.skipped, r2.ran) == (4, 0)
    victim = sorted(out.glob("part-*.parquet"))[0]
    victim.unlink()
    r3 = run_sweep(SPEC, out, workers=0)
    assert (r3.skipped, r3.ran) == (3, 1)
    pd.testing.assert_frame_equal(_strip(read_sweep(out)), _strip(df))
    # a changed setting is refused (the old results are kept; rows never mix: one part per task) unless overwritten,
    # which removes the old parts and recomputes every task; so is a spec that leaves out a done task
    with pytest.raises(SweepSpecError, match="other settings.*--overwrite"):
        run_sweep({**SPEC, "seq": 256}, out, workers=0)
    assert len(done_tasks(out)) == 4
    r4 = run_sweep({**SPEC, "seq": 256}, out, workers=0, overwrite=True)
    assert r4.skipped == 0 and r4.ran == 4 and len(done_tasks(out)) == 4
    assert set(read_sweep(out)["task_id"]).isdisjoint(df["task_id"])
    fewer = {**SPEC, "seq": 256, "gpus": SPEC["gpus"][:1]}
    with pytest.raises(SweepSpecError, match="tasks this spec does not have.*--overwrite"):
        run_sweep(fewer, out, workers=0)
    assert len(done_tasks(out)) == 4
    r5 = run_sweep(fewer, out, workers=0, overwrite=True)
    assert r5.skipped == 0 and len(done_tasks(out)) == r5.total


def test_a_task_that_fits_nowhere_is_a_row_saying_so(tmp_path):
    r = run_sweep(dict(SPEC, models=["llama3_70b"], clusters=["DGX-A100"], gpus=[8], batch=8, seq=4096,
                       space=dict(tp=[1], pp=[1], zero=[0])), tmp_path / "o", workers=0)
    df = read_sweep(r.output)
    assert len(df) == 1 and df["status"].iloc[0] == "none fits" and "none fits" in df["error"].iloc[0]
    assert "none fits in memory" in summary(df)["error"].iloc[0]  # the best-row summary (and --json) carries the reason


def test_dask_sweep_survives_a_killed_worker(tmp_path):
    pytest.importorskip("dask.distributed")
    spec = dict(SPEC, gpus=[8, 16, 32])
    ref = read_sweep(run_sweep(spec, tmp_path / "ref", workers=0).output)
    out = tmp_path / "dask"
    killed = {}

    def hook(client):
        def kill_one():
            deadline = time.time() + 120
            while time.time() < deadline and not done_tasks(out):  # once the first task has finished
                time.sleep(0.05)
            pids = client.run(os.getpid)
            pid = sorted(pids.values())[0]
            os.kill(pid, signal.SIGKILL)
            killed["pid"] = pid

        threading.Thread(target=kill_one, daemon=True).start()

    r = run_sweep(spec, out, workers=2, client_hook=hook)
    assert killed, "no worker was killed"
    assert r.failed_tasks == [] and r.ran == 6
    pd.testing.assert_frame_equal(_strip(read_sweep(out)), _strip(ref))


def test_cli_sweep_prints_the_best_row_per_task(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("models: [gpt2]\nclusters: [DGX-H100]\ngpus: [8]\nbatch: 16\nseq: 256\nmax_configs: 6\n")
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "wattcast.cli", "sweep", str(spec), "--output", str(tmp_path / "o"),
                        "--workers", "0", "--json"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["tasks"] == 1 and doc["ran"] == 1 and doc["best"][0]["status"] == "ok"
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [gpt2]\nclusters: [DGX-H100]\ngpus: [8]\nbatch: 16\nseq: 256\nworkerz: 3\n")
    r = subprocess.run([sys.executable, "-m", "wattcast.cli", "sweep", str(bad), "--output", str(tmp_path / "o2")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "workerz" in r.stderr and not (tmp_path / "o2").exists()


def test_task_homes_group_a_model_on_one_worker_and_balance():
    from wattcast.sweep import task_homes

    tasks = [dict(task_id=f"{m}-{c}-{g}", model=m, cluster=c, gpus=g)
             for m in ("a", "b") for c in ("x", "y") for g in (8, 16)]
    home = task_homes(tasks, ["w1", "w2"])
    by_model = {m: {home[t["task_id"]][0] for t in tasks if t["model"] == m} for m in ("a", "b")}
    assert by_model["a"] != by_model["b"] and all(len(v) == 1 for v in by_model.values())
    # one model, two workers: split by cluster so both workers have work
    one = [t for t in tasks if t["model"] == "a"]
    h1 = task_homes(one, ["w1", "w2"])
    assert {h1[t["task_id"]][0] for t in one} == {"w1", "w2"}
    assert len({h1[t["task_id"]][0] for t in one if t["cluster"] == "x"}) == 1
    # a single worker: no preferences at all
    assert task_homes(tasks, ["w1"]) == {}


# ---- the Ray backend (optional extra): the error without Ray always runs; real runs only where Ray is installed ----

def test_ray_backend_without_ray_names_the_extra(tmp_path, monkeypatch):
    from wattcast.sweep import SweepBackendError

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where it is not installed
    out = tmp_path / "r.parquet"
    with pytest.raises(SweepBackendError, match=r'pip install "wattcast\[ray\]"'):
        run_sweep(SPEC, out, backend="ray")
    assert not out.exists()
    # the command line says the same, exit 2, before anything runs
    spec = tmp_path / "spec.yaml"
    spec.write_text("models: [gpt2]\nclusters: [DGX-H100]\ngpus: [8]\nbatch: 16\nseq: 256\nmax_configs: 6\n")
    code = "import sys; sys.modules['ray'] = None; from wattcast.cli import app; app()"
    r = subprocess.run([sys.executable, "-c", code, "sweep", str(spec), "--output", str(out), "--backend", "ray"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and 'pip install "wattcast[ray]"' in r.stderr.replace("\n", " "), r.stderr
    assert not out.exists()


@pytest.mark.parametrize("kw,needle", [
    (dict(backend="spark"), "backend must be one of dask, ray, got 'spark'"),
    (dict(backend="ray", scheduler="tcp://127.0.0.1:8786"), "give ray_address"),
    (dict(backend="ray", workers=0), "workers=0 runs the tasks in this process"),
    (dict(ray_address="auto"), "ray_address (--ray-address) needs backend 'ray'"),
])
def test_backend_options_that_do_not_go_together_are_refused(tmp_path, kw, needle):
    from wattcast.sweep import SweepBackendError

    out = tmp_path / "o"
    with pytest.raises(SweepBackendError) as e:
        run_sweep(SPEC, out, **kw)
    assert needle in str(e.value) and not out.exists()


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=40)
    yield ray
    ray.shutdown()


def test_ray_sweep_matches_in_process_resumes_and_survives_a_killed_actor(tmp_path, local_ray):
    spec = dict(SPEC, gpus=[8, 16, 32])
    ref = read_sweep(run_sweep(spec, tmp_path / "ref", workers=0).output)
    out = tmp_path / "ray"
    seen, killed = [], {}

    def hook(actors):
        pids = local_ray.get([a.pid.remote() for a in actors])
        assert len(set(pids)) == len(actors) == 2  # one process per actor, on the Ray this test started

        def kill_one():
            deadline = time.time() + 120
            while time.time() < deadline and not done_tasks(out):  # once the first task has finished
                time.sleep(0.05)
            os.kill(pids[0], signal.SIGKILL)
            killed["pid"] = pids[0]

        threading.Thread(target=kill_one, daemon=True).start()

    r = run_sweep(spec, out, backend="ray", workers=2, client_hook=hook, progress=lambda d, t: seen.append((d, t)))
    assert killed, "no actor was killed"
    assert r.failed_tasks == [] and (r.total, r.skipped, r.ran) == (6, 0, 6) and seen[-1] == (6, 6)
    assert local_ray.is_initialized()  # a Ray it found is left running for its owner
    pd.testing.assert_frame_equal(_strip(read_sweep(out)), _strip(ref))
    # resume: skip identical to the other backends
    assert (run_sweep(spec, out, backend="ray").skipped, run_sweep(spec, out, workers=0).skipped) == (6, 6)
    sorted(out.glob("part-*.parquet"))[-1].unlink()
    r2 = run_sweep(spec, out, backend="ray")
    assert (r2.skipped, r2.ran) == (5, 1)
    pd.testing.assert_frame_equal(_strip(read_sweep(out)), _strip(ref))


def test_dask_sweep_on_one_worker_matches_in_process(tmp_path):
    """A one-worker Dask sweep gives the in-process table."""
    pytest.importorskip("dask.distributed")
    spec = dict(SPEC, clusters=["DGX-H100"])
    ref = read_sweep(run_sweep(spec, tmp_path / "ref", workers=0).output)
    r = run_sweep(spec, tmp_path / "one", workers=1)
    assert r.failed_tasks == [] and r.ran == 2
    pd.testing.assert_frame_equal(_strip(read_sweep(r.output)), _strip(ref))


def test_ray_address_that_nothing_answers_is_named(tmp_path):
    import socket

    pytest.importorskip("ray")
    from wattcast.sweep import SweepBackendError

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "o"
    with pytest.raises(SweepBackendError, match=rf"ray_address \(--ray-address\) '127.0.0.1:{port}': nothing answers"):
        run_sweep(SPEC, out, backend="ray", ray_address=f"127.0.0.1:{port}")
    assert not out.exists()


def test_ray_address_cannot_switch_a_ray_already_up(tmp_path, local_ray):
    from wattcast.sweep import SweepBackendError

    with pytest.raises(SweepBackendError, match=r"'auto': Ray is already initialised in this process"):
        run_sweep(SPEC, tmp_path / "o", backend="ray", ray_address="auto")
    assert not (tmp_path / "o").exists() and local_ray.is_initialized()


def test_routing_and_gpus_per_node_reach_every_task_and_change_its_id(tmp_path):
    """moe_routing and gpus_per_node go to each task's search (the same rows as the search API) and into the task id;
    a spec without them keeps the ids it always had."""
    import wattcast

    base = dict(models=["mixtral_8x7b"], clusters=["DGX-H100"], gpus=[16], batch=32, seq=2048, framework="megatron",
                max_configs=40, top=1, space=dict(tp=[2], pp=[1], ep=[8], zero=[1], sp=[True], micro_batch=[1],
                                                   recompute=["none"], interleave=[1]))
    spec = dict(base, moe_routing=dict(moe_load_imbalance=1.3), gpus_per_node=4)
    assert load_spec(spec).tasks()[0]["task_id"] != load_spec(base).tasks()[0]["task_id"]
    assert "moe_routing" not in load_spec(base).tasks()[0]
    df = read_sweep(run_sweep(spec, tmp_path / "o", workers=0).output)
    ref = wattcast.search("mixtral_8x7b", "DGX-H100", 16, 32, 2048, framework="megatron", gpus_per_node=4,
                          moe_routing=dict(moe_load_imbalance=1.3), **base["space"])
    assert df["status"].iloc[0] == "ok"
    assert df["step_time_ms"].iloc[0] == pytest.approx(ref.ranked["step_time_ms"].iloc[0], rel=1e-12)
