"""Issue 15: the Chrome trace draws the pipeline's send/recv where the schedule puts them (until then the pp track held
only the tied embedding's gradient all-reduce though ``exposed_comm_split_ms["pp"]`` charged the transfers), and the
tasks carry their place in the schedule as args."""

import json
import re

import pytest

import wattcast
from wattcast.simulate.trace import TRACKS, distributed_trace_events, write_distributed_trace

KW = dict(gpus=8, tp=2, pp=2, batch=16, seq=1024, micro_batch=2, trace=True, framework="megatron")


def _pp(ev):
    return [e for e in ev if e.get("ph") == "X" and str(e["name"]).startswith(("pp.send_activations", "pp.send_input_grad"))]


def test_blocking_1f1b_sends_end_each_sending_task_on_the_senders_pp_track(tmp_path):
    # Megatron's 1F1B waits on each send: the transfer is the last p2p_ms of the sender's task (its own hop: both
    # stages on one node here, so p2p_ms itself)
    r = wattcast.predict_cluster("gpt2", "dgx-h100", **KW)
    n_micro, p2p_ms = r.meta["n_micro"], r.comm["p2p_ms"]
    assert p2p_ms > 0 and r.exposed_comm_split_ms["pp"] > 0
    ev = distributed_trace_events(r)
    pp = _pp(ev)
    fwd = [e for e in pp if e["name"].startswith("pp.send_activations")]
    bwd = [e for e in pp if e["name"].startswith("pp.send_input_grad")]
    assert len(fwd) == len(bwd) == n_micro  # stage 0 sends each micro-batch on, stage 1 each gradient back
    assert {e["pid"] for e in fwd} == {0} and {e["pid"] for e in bwd} == {1}
    assert {e["tid"] for e in pp} == {TRACKS["pp"][0]}
    tasks = {(e["pid"], e["name"]): e for e in ev if e.get("ph") == "X" and e["cat"] == "compute"}
    for e in pp:
        a = e["args"]
        assert a["blocking"] is True and a["bytes"] > 0 and e["dur"] == pytest.approx(p2p_ms * 1e3, abs=2e-3)
        task = tasks[(e["pid"], ("F" if e["name"].startswith("pp.send_activations") else "B") + str(a["micro_batch"]))]
        assert e["ts"] + e["dur"] == pytest.approx(task["ts"] + task["dur"], abs=2e-3)  # inside, at its end
        assert (a["from_stage"], a["to_stage"]) == ((0, 1) if e["pid"] == 0 else (1, 0))
    # the tasks say where they sit: stage, micro-batch, chunk, layers
    f0 = tasks[(1, "F0")]["args"]
    assert f0["stage"] == 1 and f0["micro_batch"] == 0 and f0["chunk"] == 0 and f0["virtual_stage"] == 1
    lo, hi = (int(x) for x in f0["layers"].split("-"))
    assert lo == r.meta["stage_layers"][0] and hi == sum(r.meta["stage_layers"]) - 1
    # valid Chrome JSON, the existing names kept
    p = write_distributed_trace(r, tmp_path / "t.json")
    d = json.loads(p.read_text())
    assert len(_pp(d["traceEvents"])) == 2 * n_micro
    assert {"F0", "B0"} <= {e["name"] for e in d["traceEvents"]}
    assert d["otherData"]["exposed_comm_split_ms"]["pp"] == pytest.approx(r.exposed_comm_split_ms["pp"])


def test_overlapped_interleaved_sends_run_after_the_task_on_the_receivers_track():
    # Megatron-Core's interleaved schedule overlaps its transfers (overlap_p2p_comm): each runs on the dependency edge
    # after the sending task, the receiver waits for it: drawn on the receiver's pp track, from the sender's end
    r = wattcast.predict_cluster("gpt2", "dgx-h100", interleave=2, **KW)
    n_micro, p2p_ms = r.meta["n_micro"], r.comm["p2p_ms"]
    ev = distributed_trace_events(r)
    pp = _pp(ev)
    # 2 stages x 2 chunks = 4 virtual stages: 3 forward and 3 backward edges per micro-batch
    assert len(pp) == 2 * 3 * n_micro
    tasks = {(e["pid"], e["name"]): e for e in ev if e.get("ph") == "X" and e["cat"] == "compute"}
    for e in pp:
        a = e["args"]
        assert a["blocking"] is False and e["pid"] == a["to_stage"] != a["from_stage"]
        kind = "F" if e["name"].startswith("pp.send_activations") else "B"
        task = tasks[(a["from_stage"], f"{kind}{a['micro_batch']}.c{a['chunk']}")]
        assert e["ts"] == pytest.approx(task["ts"] + task["dur"], abs=2e-3)
        assert e["dur"] == pytest.approx(p2p_ms * 1e3, abs=2e-3)


def test_dualpipe_transfers_on_the_receivers_track_between_the_tasks(tmp_path):
    # DualPipe (simulate/dualpipe.py): each message its replay timed, from the later of its two ends' posts to its
    # completion, on the receiver's pp track: one activation and one input gradient per micro-batch per stage boundary
    # (each micro-batch crosses the P - 1 boundaries of its direction), after the task that produced it and before the
    # one that consumes it; the step is the same with and without the trace
    kw = dict(gpus=8, batch=16, seq=2048, pp=4, micro_batch=1, framework="megatron", schedule="dualpipe")
    r = wattcast.predict_cluster("llama3_8b", "DGX-H100", trace=True, **kw)
    assert r.step_time_ms == wattcast.predict_cluster("llama3_8b", "DGX-H100", **kw).step_time_ms
    P, M, p2p_ms = kw["pp"], r.meta["n_micro"], r.comm["p2p_ms"]
    assert p2p_ms > 0
    p = write_distributed_trace(r, tmp_path / "t.json")
    ev = json.loads(p.read_text())["traceEvents"]
    pp = _pp(ev)
    assert len(pp) == 2 * M * (P - 1)
    assert len({(e["name"].split("pp.send_")[1].rstrip("0123456789"), e["args"]["micro_batch"], e["args"]["from_stage"])
                for e in pp}) == len(pp)
    tasks = [e for e in ev if e.get("ph") == "X" and e["cat"] == "compute"
             and re.fullmatch(r"(FB|F|B|W)\d+(\+\d+)?", e["name"])]

    def task(rank, fwd, micro):  # the forward (or backward) of ``micro`` on ``rank``: F / B, or its part of an F&B pair
        hit = [e for e in tasks if e["pid"] == rank and (
            (fwd and re.fullmatch(rf"F{micro}|FB{micro}\+\d+", e["name"]))
            or (not fwd and re.fullmatch(rf"B{micro}|FB\d+\+{micro}", e["name"])))]
        assert len(hit) == 1, (rank, fwd, micro, [e["name"] for e in hit])
        return hit[0]

    for e in pp:
        a = e["args"]
        fwd = e["name"].startswith("pp.send_activations")
        assert a["blocking"] is False and e["pid"] == a["to_stage"] != a["from_stage"]
        # the pp track, or an extra lane of it (tid 100 + 10 x its tid + lane) where two transfers partly overlap
        assert (e["tid"] if e["tid"] < 100 else (e["tid"] - 100) // 10) == TRACKS["pp"][0]
        assert a["bytes"] > 0 and a["chunk"] == a["direction"] == int(a["micro_batch"] >= M // 2)
        assert a["to_model_stage"] == a["from_model_stage"] + (1 if fwd else -1)
        assert e["dur"] == pytest.approx(p2p_ms * 1e3, abs=2e-3)
        assert e["ts"] == pytest.approx(max(a["send_posted_ms"], a["recv_posted_ms"]) * 1e3, abs=2e-3)
        made, used = task(a["from_stage"], fwd, a["micro_batch"]), task(a["to_stage"], fwd, a["micro_batch"])
        assert made["ts"] + made["dur"] <= e["ts"] + 2e-3 and e["ts"] + e["dur"] <= used["ts"] + 2e-3
    # one thread's events are sequential or nested, never partly overlapping (trace.py's lanes)
    by = {}
    for e in ev:
        if e.get("ph") == "X":
            by.setdefault((e["pid"], e["tid"]), []).append((round(e["ts"] * 1e3), round((e["ts"] + e["dur"]) * 1e3)))
    for spans in by.values():
        stack = []
        for a, b in sorted(spans, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1] <= a:
                stack.pop()
            assert not stack or b <= stack[-1]
            stack.append(b)
