"""The Chrome trace's power counter charges what the prediction's energy charges (audit 54f #1, #2): a served decode
iteration's trace draws the engine's host, prefill and TP-sync time after the GPU step (it stopped at the GPU step:
29.08 ms iteration drawn to 16.2 ms, 5.73 J of 7.63 J), and a cluster trace's counter stays under the power limit while
the DP all-reduce runs beside the last backward (303.7 W under a 300 W limit)."""

from __future__ import annotations

import numpy as np
import pytest

import wattcast
from wattcast.simulate.trace import chrome_trace_events, distributed_trace_events

SERVE = dict(serving="vllm", prompt_tokens=512, output_tokens=512)


def _counter(ev, pid=0):
    return sorted((e["ts"], e["args"]["board_w"]) for e in ev if e["ph"] == "C" and e["name"] == "power" and e["pid"] == pid)


def _integral_j(c, end_us):
    """A step function's integral (J): each sample held until the next, the last to ``end_us``."""
    return sum(w * ((c[i + 1][0] if i + 1 < len(c) else end_us) - t) for i, (t, w) in enumerate(c)) / 1e6


def _end_us(ev):
    return max(e["ts"] + e["dur"] for e in ev if e["ph"] == "X")


def _check_served_trace(res, want_parts):
    ev = chrome_trace_events(res)
    end = _end_us(ev)
    assert end == pytest.approx(res.step_time_ms * 1e3, abs=2e-3)  # to the nanosecond rounding
    assert _integral_j(_counter(ev), end) == pytest.approx(res.energy_j, rel=1e-4)
    drawn = {e["name"]: e["dur"] / 1e3 for e in ev if e["ph"] == "X" and e.get("cat") == "serving"}
    per_op = {o["op_class"]: o["time_ms"] for o in res.per_op if o["op_class"].startswith("serving_")}
    assert set(drawn) == set(want_parts) == set(per_op)
    for k, ms in per_op.items():
        assert drawn[k] == pytest.approx(ms, abs=2e-6)
    # the engine's parts have their own named track
    assert any(e["ph"] == "M" and e.get("tid") == 1 and "serving engine" in e["args"]["name"] for e in ev)
    # the host draws idle power (the last sample is no kernel's power held to the end)
    host = next(e for e in ev if e.get("name") == "serving_host")
    at_host = [w for t, w in _counter(ev) if t <= host["ts"]][-1]
    assert at_host == pytest.approx(res.meta["idle_power_w"], abs=1e-3)


@pytest.mark.parametrize("batch", [32, 128])
def test_served_single_device_trace_ends_at_the_iteration_and_integrates_to_energy(batch):
    res = wattcast.predict("llama3_8b", "H100-SXM5-80GB", mode="inference", batch=batch, seq=1, kv_context=1024, **SERVE)
    _check_served_trace(res, {"serving_host", "serving_prefill"})


def test_served_tp2_trace_draws_the_tp_sync_and_integrates_to_energy():
    res = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=2, tp=2, batch=32, seq=1,
                                   kv_context=1024, **SERVE)
    _check_served_trace(res, {"serving_host", "serving_prefill", "serving_tp_sync"})


def test_unserved_decode_trace_is_unchanged():
    res = wattcast.predict("llama3_8b", "H100-SXM5-80GB", mode="inference", batch=32, seq=1, kv_context=1024)
    ev = chrome_trace_events(res)
    assert not any(e.get("cat") == "serving" for e in ev)
    assert _integral_j(_counter(ev), _end_us(ev)) == pytest.approx(res.energy_j, rel=1e-4)


def test_cluster_trace_counter_stays_under_the_power_limit_and_integrates_to_energy():
    # the auditor's case: 303.67 W for 40.6 ms (B7 beside dp.all_reduce) under a 300 W limit
    r = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=16, tp=4, pp=1, dp=4, batch=32, seq=2048, micro_batch=1,
                                 framework="megatron", power_limit_w=300.0, trace=True)
    ev = distributed_trace_events(r)
    for d in r.per_device:
        c = _counter(ev, d["stage"])
        assert max(w for _, w in c) <= 300.0
        assert d["overlap_cap_w"] == 300.0 and d["hidden_comm_extra_j"] > 0
        assert _integral_j(c, r.step_time_ms * 1e3) == pytest.approx(d["energy_j"], rel=1e-5)


def test_capped_moves_the_excess_onto_the_tasks_headroom():
    from wattcast.simulate.trace import _capped

    times = np.array([0, 10, 20, 30, 40], dtype=np.int64)
    levels = np.array([200.0, 310.0, 250.0, 100.0, 100.0])  # a task, the overlap over the cap, a task, the wait, end
    out = _capped(times, levels, 300.0, [(0, 30)])
    assert out.max() <= 300.0 and out[1] == 300.0
    assert np.sum(out[:-1] * np.diff(times)) == pytest.approx(np.sum(levels[:-1] * np.diff(times)))
    assert out[3] == 100.0  # the wait, outside the tasks, keeps its power
    assert out[0] - 200.0 == pytest.approx(2 * (out[2] - 250.0))  # in proportion to the headroom (100 W vs 50 W)
    assert np.array_equal(_capped(times, np.minimum(levels, 300.0), 300.0, [(0, 30)]), np.minimum(levels, 300.0))
