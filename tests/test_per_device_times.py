"""``per_device[].busy_ms`` and ``finish_ms`` (README, the JSON's ``per_device``): ``finish_ms`` is a time from the step's
start, when the stage has run its last backward and its gradient synchronisation and starts its optimizer step (the
trace's ``optimizer`` event starts there); ``busy_ms`` is a duration, the stage's forward and backward tasks (the
trace's F / B events) plus that optimizer step, without waits. So ``finish_ms`` < ``busy_ms`` when the optimizer step
is longer than the stage's waits (user audit: 346.9 vs 355.9 ms): one GPU has no waits, finish = busy - optimizer."""

from __future__ import annotations

import pytest

import wattcast


def _stage_events(r, s: int):
    return [e for e in r.events if e["stage"] == s and e.get("stream") == "compute"]


def test_one_gpu_finish_is_busy_without_the_optimizer():
    r = wattcast.predict_cluster("gpt2", "DGX-A100", gpus=1, batch=8, seq=512, micro_batch=4)
    d = r.per_device[0]
    assert d["finish_ms"] < d["busy_ms"]
    assert d["finish_ms"] + r.optimizer_ms == pytest.approx(d["busy_ms"], rel=1e-12)


@pytest.mark.parametrize("framework", ["megatron", "hf"])
def test_pipeline_stages_busy_is_tasks_plus_optimizer_and_finish_is_the_optimizers_start(framework):
    r = wattcast.predict_cluster("gpt2", "DGX-A100", gpus=4, pp=2, batch=16, seq=512, micro_batch=2,
                                 framework=framework, zero=1 if framework == "megatron" else 0, trace=True)
    for s, d in enumerate(r.per_device):
        ev = _stage_events(r, s)
        tasks = [e for e in ev if e["name"][0] in "FBW" and not e["name"].startswith("[")]
        # the optimizer phase in pieces between its barriers across the stages (the global norm's all-reduce)
        opt = sorted((e for e in ev if e["name"] == "optimizer"), key=lambda e: e["start_ms"])
        assert len(opt) == 1 + len(r.comm.get("optimizer_barriers", []))
        assert opt[0]["start_ms"] == pytest.approx(d["finish_ms"], rel=1e-12)
        assert d["finish_ms"] >= max(e["end_ms"] for e in tasks)
        opt_ms = sum(e["end_ms"] - e["start_ms"] for e in opt)
        busy = sum(e["end_ms"] - e["start_ms"] for e in tasks) + opt_ms
        assert d["busy_ms"] == pytest.approx(busy, rel=1e-9)
        assert d["finish_ms"] + opt_ms <= opt[-1]["end_ms"] * (1 + 1e-12) <= r.step_time_ms * (1 + 1e-12)
