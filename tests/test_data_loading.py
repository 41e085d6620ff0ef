"""Data loading in a training step (``simulate/data_loading.py``): the loader's exposed host time, the batch's copy
to the GPU, Megatron's TP broadcast and derived kernels; the options on predict, search and the sweep spec."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

import wattcast
from conftest import run_cli
from wattcast.simulate.data_loading import (BATCH_LAYOUT, H2D_GBPS, H2D_LATENCY_MS, h2d_copy_ms, loader_exposed_ms,
                                            resolve_workers, stage_copy)

KW = dict(gpus=1, batch=8, seq=512, attention="flash", dtype="bf16")


def test_h2d_constants_are_the_profiles_fit(data_root):
    """Refit the pinned host-to-device copies of the real A100 profile: the module's constants are that fit."""
    d = json.load(gzip.open(data_root / "traces" / "a100_trace_diff_control.json.gz"))
    m = [e for e in d["traceEvents"] if e.get("cat") == "gpu_memcpy" and "HtoD" in e["name"]]
    b = np.array([e["args"]["bytes"] for e in m], dtype=float)
    t_us = np.array([e["dur"] for e in m], dtype=float)
    assert len(m) == 150
    (lat_us, us_per_byte), *_ = np.linalg.lstsq(np.c_[np.ones_like(b), b], t_us, rcond=None)
    assert lat_us / 1e3 == pytest.approx(H2D_LATENCY_MS, rel=0.02)
    assert 1 / us_per_byte / 1e3 == pytest.approx(H2D_GBPS, rel=0.02)


def test_parts():
    assert h2d_copy_ms(0, 0) == 0.0
    assert h2d_copy_ms(8.6e9, 2) == pytest.approx(2 * H2D_LATENCY_MS + 1e3)
    # no workers: the whole load in series; workers hide it behind the step's computation until they fall behind
    assert loader_exposed_ms(5.0, 0, 100.0) == 5.0
    assert loader_exposed_ms(5.0, 2, 1.0) == pytest.approx(1.5)
    assert loader_exposed_ms(5.0, 2, 10.0) == 0.0
    assert resolve_workers("hf", None) == 0 and resolve_workers("megatron", None) == 2
    for bad in (-1, 1.5, True, "two"):
        with pytest.raises((ValueError, TypeError), match="data_workers"):
            resolve_workers("hf", bad)
    # what each framework moves per micro-batch
    nb, copies, sizes, kern = stage_copy("hf", 4, 1024, "single")
    assert (nb, copies, sizes, kern) == (4 * 1024 * 24.0, 3, [], 0)
    nb, copies, sizes, kern = stage_copy("megatron-deepspeed", 4, 1024, "first")
    assert nb == 4 * 1025 * 8.0 and copies == 1 and len(sizes) == 2 and sizes[-1] == nb and kern == 8
    nb, copies, sizes, kern = stage_copy("megatron", 2, 2048, "single")
    assert nb == 2 * 2048 * 28.0 and copies == 4 and len(sizes) == 4 and sum(sizes) == pytest.approx(nb)
    assert set(BATCH_LAYOUT) == {"hf", "megatron", "megatron-deepspeed"}


def test_loader_time_in_series_without_workers():
    base = wattcast.predict_cluster("gpt2", "DGX-A100", micro_batch=2, **KW)
    slow = wattcast.predict_cluster("gpt2", "DGX-A100", micro_batch=2, data_load_ms=3.0, **KW)
    # hf: no workers by default, so every one of the 4 micro-batches waits the 3 ms
    assert slow.step_time_ms - base.step_time_ms == pytest.approx(4 * 3.0, rel=1e-9)
    from wattcast.data.catalog import resolve_device
    from wattcast.models.power import idle_power_w

    # the GPU idles while it waits for the batch
    assert slow.energy_j - base.energy_j == pytest.approx(idle_power_w(resolve_device(slow.device)) * 12.0 / 1e3)
    dl = slow.to_dict()["data_loading"]
    assert dl["workers"] == 0 and dl["load_ms"] == 3.0
    assert dl["per_micro"]["single"]["loader_ms"] == 3.0
    assert dl["step_ms"] == pytest.approx(4 * dl["per_micro"]["single"]["total_ms"])
    assert slow.comm["rank_overheads_ms"]["data_loading_ms"] == pytest.approx(dl["per_micro"]["single"]["total_ms"])
    # per_op is the step's: every micro-batch's loading (one stage: the step's figure)
    row = [o for o in slow.per_op if o["op_class"] == "data_loading"]
    assert len(row) == 1 and row[0]["time_ms"] == pytest.approx(dl["step_ms"])
    # the copy itself is there without any loader time: 3 int64 tensors of 2 x 512 tokens
    h2d = base.to_dict()["data_loading"]["per_micro"]["single"]["h2d_ms"]
    assert h2d == pytest.approx(h2d_copy_ms(2 * 512 * 24.0, 3))


def test_workers_hide_a_loader_that_keeps_up():
    kw = dict(KW, micro_batch=2)
    base = wattcast.predict_cluster("gpt2", "DGX-A100", data_workers=2, **kw)
    fast = wattcast.predict_cluster("gpt2", "DGX-A100", data_workers=2, data_load_ms=0.5, **kw)
    assert fast.step_time_ms == base.step_time_ms  # 0.25 ms per worker, far below a micro-batch's computation
    huge = wattcast.predict_cluster("gpt2", "DGX-A100", data_workers=2, data_load_ms=2000.0, **kw)
    loader = huge.to_dict()["data_loading"]["per_micro"]["single"]["loader_ms"]
    assert 0 < loader < 1000.0  # what 2 workers cannot hide: 1,000 ms each minus the computation per micro-batch


def test_megatron_broadcasts_the_batch_over_tp():
    kw = dict(gpus=2, batch=8, seq=512, micro_batch=2, attention="eager", dtype="fp16", framework="megatron-deepspeed")
    tp2 = wattcast.predict_cluster("gpt2", "DGX-A100", tp=2, **kw).to_dict()["data_loading"]["per_micro"]["single"]
    dp2 = wattcast.predict_cluster("gpt2", "DGX-A100", tp=1, **kw).to_dict()["data_loading"]["per_micro"]["single"]
    assert tp2["broadcasts"] == 2 and tp2["broadcast_ms"] > 0
    assert dp2["broadcasts"] == 0 and dp2["broadcast_ms"] == 0
    assert tp2["kernels"] == 8 and tp2["kernels_ms"] > 0


def test_pipeline_first_and_last_stage_read_the_batch():
    r = wattcast.predict_cluster("gpt2", "DGX-A100", gpus=2, pp=2, batch=8, seq=512, micro_batch=2, framework="megatron",
                                 trace=True)
    dl = r.to_dict()["data_loading"]["per_micro"]
    assert set(dl) == {"first", "last"} and dl["first"]["stage"] == 0 and dl["last"]["stage"] == 1
    names = [e["name"] for e in r.events if e["name"].startswith("data_loading")]
    assert len(names) == 2 * 4  # every forward that reads the batch, 4 micro-batches on each of 2 stages


def test_bad_values_are_refused():
    for bad in (-1.0, float("nan"), float("inf"), "x"):
        with pytest.raises(ValueError, match="data_load_ms"):
            wattcast.predict_cluster("gpt2", "DGX-A100", data_load_ms=bad, **KW)
    with pytest.raises(ValueError, match="data_workers"):
        wattcast.predict_cluster("gpt2", "DGX-A100", data_workers=-2, **KW)
    with pytest.raises(ValueError, match="data_load_ms"):
        wattcast.search("gpt2", "DGX-A100", 8, 8, 512, data_load_ms=-1)
    with pytest.raises(ValueError, match="data_load_ms"):
        wattcast.predict("gpt2", "A100", data_load_ms=-1)


def test_one_device():
    base = wattcast.predict("gpt2", "A100", batch=4, seq=512)
    dl = base.to_dict()["data_loading"]["per_micro"]["single"]
    # the HF Trainer's batch: input ids, attention mask and labels, int64
    assert dl["copies"] == 3 and dl["bytes"] == 4 * 512 * 8 * 3 and dl["loader_ms"] == 0.0
    assert base.overheads["data_loading_ms"] == pytest.approx(h2d_copy_ms(4 * 512 * 24.0, 3))
    # at the start of the forward pass: the step is still forward + backward + optimizer
    assert base.step_time_ms == pytest.approx(base.forward_ms + base.backward_ms + base.optimizer_ms)
    assert sum(o["time_ms"] for o in base.per_op) == pytest.approx(base.step_time_ms)
    slow = wattcast.predict("gpt2", "A100", batch=4, seq=512, data_load_ms=5.0)
    assert slow.step_time_ms - base.step_time_ms == pytest.approx(5.0)  # no workers: in series
    assert slow.energy_j > base.energy_j
    hidden = wattcast.predict("gpt2", "A100", batch=4, seq=512, data_load_ms=5.0, data_workers=4)
    assert hidden.step_time_ms == pytest.approx(base.step_time_ms)
    inf = wattcast.predict("gpt2", "A100", batch=4, seq=512, mode="inference").to_dict()["data_loading"]
    assert inf["per_micro"]["single"]["copies"] == 2  # no labels
    from wattcast.request import PredictRequest

    req = PredictRequest("gpt2", device="A100", batch=4, seq=512, data_load_ms=5.0).predict()
    assert req.step_time_ms == pytest.approx(slow.step_time_ms)
    from wattcast.simulate.trace import chrome_trace_events

    ev = [e for e in chrome_trace_events(slow) if e["ph"] == "X"]
    assert ev[0]["name"] == "data_loading" and ev[0]["dur"] == pytest.approx(dl["total_ms"] * 1e3 + 5e3, abs=1e-3)
    assert ev[-1]["ts"] + ev[-1]["dur"] == pytest.approx(slow.step_time_ms * 1e3, rel=1e-6)


def test_search_and_sweep_spec_take_it():
    a = wattcast.search("gpt2", "DGX-A100", 8, 16, 512, tp=[1], pp=[1], micro_batch=[2], zero=[0])
    b = wattcast.search("gpt2", "DGX-A100", 8, 16, 512, tp=[1], pp=[1], micro_batch=[2], zero=[0], data_load_ms=4.0)
    assert b.best["step_time_ms"] > a.best["step_time_ms"] + 4.0 - 1e-6
    from wattcast.sweep import SweepSpecError, load_spec as parse_spec

    base = dict(models=["gpt2"], clusters=["DGX-A100"], gpus=[8], batch=16, seq=512)
    spec = parse_spec(dict(base, data_load_ms=2.5, data_workers=4))
    t = spec.tasks()[0]
    assert t["data_load_ms"] == 2.5 and t["data_workers"] == 4
    assert "data_load_ms" not in parse_spec(base).tasks()[0]  # ids of sweeps without it stay what they were
    with pytest.raises(SweepSpecError, match="data_workers"):
        parse_spec(dict(base, data_workers=-1))


def test_cli_flags():
    r = run_cli("predict", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "1", "--batch", "8", "--seq", "512",
                "--micro-batch", "2", "--data-load-ms", "3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["data_loading"]["per_micro"]["single"]["loader_ms"] == 3.0
    r = run_cli("predict", "-m", "gpt2", "--device", "A100", "--data-load-ms", "3", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["data_loading"]["per_micro"]["single"]["loader_ms"] == 3.0
    r = run_cli("predict", "-m", "gpt2", "--device", "A100", "--data-workers", "-1")
    assert r.returncode != 0 and "data_workers" in (r.stdout + r.stderr)


def test_cluster_forward_ms_includes_loading_drawn_inside_the_f_events():
    """On a cluster the loading of a micro-batch is part of the forward task that reads it: ``forward_ms`` is the sum
    of the trace's F events, and each ``data_loadingN`` event is drawn inside its F event (nested, not beside it), so
    a slower loader (no workers: in series) grows ``forward_ms`` and the F events by the data_loading events' time.
    (User audit: the 70B trace's F events summed to forward_ms with data_loadingN as separate events; they overlap.)"""
    kw = dict(gpus=2, pp=2, batch=8, seq=512, micro_batch=2, framework="hf", data_workers=0, trace=True)
    base = wattcast.predict_cluster("gpt2", "DGX-A100", **kw)
    slow = wattcast.predict_cluster("gpt2", "DGX-A100", data_load_ms=3.0, **kw)
    for r in (base, slow):
        f = [e for e in r.events if e["name"].startswith("F")]
        dl = [e for e in r.events if e["name"].startswith("data_loading")]
        assert sum(e["end_ms"] - e["start_ms"] for e in f) == pytest.approx(r.forward_ms, rel=1e-9)
        assert len(dl) == 2 * 4 and all(
            any(x["stage"] == d["stage"] and x["start_ms"] <= d["start_ms"] and d["end_ms"] <= x["end_ms"] for x in f)
            for d in dl)
    load = [sum(e["end_ms"] - e["start_ms"] for e in r.events if e["name"].startswith("data_loading"))
            for r in (base, slow)]
    assert load[1] - load[0] == pytest.approx(3.0 * 2 * 4)  # 3 ms on each of 4 micro-batches' 2 reading forwards
    assert slow.forward_ms - base.forward_ms == pytest.approx(load[1] - load[0], rel=1e-9)
