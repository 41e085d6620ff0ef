"""Chrome trace JSON (opens in Perfetto / chrome://tracing) of a predicted step: one track per stream."""

from __future__ import annotations

import json
from pathlib import Path


def chrome_trace_events(res) -> list[dict]:
    """Complete ('X') events, microseconds, kernels back to back on the compute stream in graph order."""
    nodes = res.nodes
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"{res.device}"}},
              {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "compute"}}]
    t_us = 0.0
    data_ms = float((res.meta.get("data_loading") or {}).get("step_ms", 0.0))
    if data_ms > 0:  # the batch's loading and copy come before the step's first kernel
        events.append({"name": "data_loading", "cat": "data", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0,
                       "dur": round(data_ms * 1e3, 3), "args": res.meta["data_loading"]["per_micro"]["single"]})
        t_us = data_ms * 1e3
    has_power = "power_w" in nodes
    cols = ["name", "op_class", "phase", "layer", "kernel", "method", "time_ms", "gpu_ms", "flops", "bytes", "ood"]
    power = nodes["power_w"].to_numpy(dtype=float) if has_power else None
    last_w = None
    for i, r in enumerate(nodes[cols].itertuples(index=False)):
        dur = float(r.time_ms) * 1e3
        events.append({"name": r.name, "cat": f"{r.phase},{r.op_class}", "ph": "X", "pid": 0, "tid": 0, "ts": round(t_us, 3),
                       "dur": round(dur, 3), "args": {"layer": int(r.layer), "kernel": r.kernel, "method": r.method,
                                                      "gpu_ms": float(r.gpu_ms), "flops": float(r.flops), "bytes": float(r.bytes),
                                                      "ood": bool(r.ood)}})
        if has_power and dur > 0:
            w = round(float(power[i]), 1)
            if w != last_w:  # a counter track: board power while each kernel runs
                events.append({"name": "power", "ph": "C", "pid": 0, "ts": round(t_us, 3), "args": {"board_w": w}})
                last_w = w
        t_us += dur
    return events


def _write_trace(path: str | Path, events: list[dict], other: dict) -> Path:
    """Write a Chrome trace atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}))
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)  # no half-written file left behind
        raise
    return path


def write_chrome_trace(res, path: str | Path) -> Path:
    return _write_trace(path, chrome_trace_events(res), {"model": res.meta.get("name"), "device": res.device,
                                                         "mode": res.mode, "step_time_ms": res.step_time_ms})


def distributed_trace_events(res) -> list[dict]:
    """Chrome trace of a distributed step: one process per pipeline stage, compute and comm threads."""
    ev = []
    stages = sorted({e["stage"] for e in res.events})
    for s in stages:
        ev.append({"name": "process_name", "ph": "M", "pid": s, "args": {"name": f"stage {s} ({res.device})"}})
        ev.append({"name": "thread_name", "ph": "M", "pid": s, "tid": 0, "args": {"name": "compute"}})
        ev.append({"name": "thread_name", "ph": "M", "pid": s, "tid": 1, "args": {"name": "comm"}})
    for e in res.events:
        ev.append({"name": e["name"], "ph": "X", "pid": e["stage"], "tid": 0 if e["stream"] == "compute" else 1,
                   "ts": round(e["start_ms"] * 1e3, 3), "dur": round((e["end_ms"] - e["start_ms"]) * 1e3, 3),
                   "cat": e["stream"]})
    # power counter per stage: compute tasks at the stage's busy power, waits at communication power
    for d in res.per_device:
        s = d["stage"]
        busy_w, idle_w = d.get("busy_power_w"), d.get("wait_power_w")
        if busy_w is None:
            continue
        spans = sorted((e["start_ms"], e["end_ms"]) for e in res.events if e["stage"] == s and e["stream"] == "compute")
        t = 0.0
        for a, b in spans:
            if a > t:
                ev.append({"name": "power", "ph": "C", "pid": s, "ts": round(t * 1e3, 3), "args": {"board_w": round(idle_w, 1)}})
            ev.append({"name": "power", "ph": "C", "pid": s, "ts": round(a * 1e3, 3), "args": {"board_w": round(busy_w, 1)}})
            t = b
        ev.append({"name": "power", "ph": "C", "pid": s, "ts": round(t * 1e3, 3), "args": {"board_w": round(idle_w, 1)}})
    return ev


def write_distributed_trace(res, path: str | Path) -> Path:
    return _write_trace(path, distributed_trace_events(res), {"model": res.model, "cluster": res.cluster,
                                                              "parallel": res.parallel.describe(), "step_time_ms": res.step_time_ms,
                                                              "truncated": res.meta.get("trace_truncated"),
                                                              "moe_load": res.meta.get("moe_load", 1.0)})


#: timeline colours: compute tasks by kind, communication by parallel group, and the exposed part of communication
TIMELINE_COLOURS = {"forward": "#4C72B0", "backward": "#DD8452", "optimizer": "#55A868", "not drawn": "#DDDDDD",
                    "dp": "#8172B3", "cp": "#64B5CD", "comm": "#999999", "exposed": "#C44E52"}


def _timeline_kind(e: dict) -> str:
    """The legend entry of one event."""
    name = str(e["name"])
    if e["stream"] == "compute":
        if name.startswith("F"):
            return "forward"
        if name.startswith("B"):
            return "backward"
        if name == "optimizer":
            return "optimizer"
        return "not drawn" if name.startswith("[") else "optimizer"
    group = name.split(".", 1)[0]
    return group if group in ("dp", "cp") else "comm"


def exposed_comm_intervals(res) -> list[tuple[int, float, float]]:
    """(stage, start_ms, end_ms) of the communication on the comm stream during which the stage's compute stream is
    idle: what the step waits for. (TP and pipeline send/recv time is inside the F/B tasks and is not among these;
    ``res.exposed_comm_split_ms`` has every class.)"""
    out = []
    for s in sorted({e["stage"] for e in res.events}):
        busy = sorted((e["start_ms"], e["end_ms"]) for e in res.events if e["stage"] == s and e["stream"] == "compute")
        merged: list[list[float]] = []
        for a, b in busy:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        comm = sorted((e["start_ms"], e["end_ms"]) for e in res.events if e["stage"] == s and e["stream"] == "comm")
        for a, b in comm:
            t = a
            for c, d in merged:  # subtract the compute spans from [a, b)
                if d <= t or c >= b:
                    continue
                if c > t:
                    out.append((s, t, c))
                t = max(t, d)
                if t >= b:
                    break
            if t < b:
                out.append((s, t, b))
    # overlapping comm events of one stage would count the same gap twice: merge per stage
    merged_out: list[tuple[int, float, float]] = []
    for s, a, b in sorted(out):
        if merged_out and merged_out[-1][0] == s and a <= merged_out[-1][2]:
            merged_out[-1] = (s, merged_out[-1][1], max(merged_out[-1][2], b))
        elif b > a:
            merged_out.append((s, a, b))
    return merged_out


def timeline_figure(res):
    """The matplotlib figure of :func:`plot_timeline` (for tests and notebooks)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    stages = sorted({e["stage"] for e in res.events}) or [0]
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.55 * len(stages) * 2))
    used = []
    for e in res.events:
        y = e["stage"] * 2 + (0 if e["stream"] == "compute" else 1)
        kind = _timeline_kind(e)
        used.append(kind)
        ax.broken_barh([(e["start_ms"], e["end_ms"] - e["start_ms"])], (y - 0.4, 0.8), facecolors=TIMELINE_COLOURS[kind],
                       edgecolors="white", linewidth=0.3)
    exposed = exposed_comm_intervals(res)
    for s, a, b in exposed:  # over the comm row, hatched: the compute stream waits for it
        ax.broken_barh([(a, b - a)], (s * 2 + 1 - 0.4, 0.8), facecolors="none", edgecolors=TIMELINE_COLOURS["exposed"],
                       hatch="////", linewidth=0.8)
        ax.broken_barh([(a, b - a)], (s * 2 + 0.35, 0.1), facecolors=TIMELINE_COLOURS["exposed"])
    ax.set_yticks([s * 2 + k for s in stages for k in (0, 1)], [f"stage {s} {n}" for s in stages for n in ("compute", "comm")])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    labels = {"forward": "forward", "backward": "backward", "optimizer": "optimizer", "not drawn": "steady state (not drawn)",
              "dp": "data-parallel comm (gradient reduce / param gather)", "cp": "context-parallel ring KV exchange",
              "comm": "other comm"}
    handles = [Patch(facecolor=TIMELINE_COLOURS[k], label=v) for k, v in labels.items() if k in used]
    handles.append(Patch(facecolor="none", edgecolor=TIMELINE_COLOURS["exposed"], hatch="////",
                         label="exposed comm (the compute stream waits)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.1 / max(len(stages), 1)), ncol=3,
              fontsize=8, frameon=False)
    split = ", ".join(f"{k} {v:.1f}" for k, v in (res.exposed_comm_split_ms or {}).items() if v > 0) or "none"
    ax.set_title(f"{res.model} on {res.gpus} x {res.device} ({res.parallel.describe()}): step {res.step_time_ms:.1f} ms, "
                 f"bubble {res.bubble_ms:.1f} ms, exposed comm {res.exposed_comm_ms:.1f} ms\n"
                 f"exposed comm by class (ms): {split}; TP and pipeline transfers run inside the F/B tasks", fontsize=9)
    return fig


def plot_timeline(res, path: str | Path) -> Path:
    """A PNG of the per-stage timeline (forward, backward, optimizer on compute; DP buckets on comm), with a legend,
    the exposed communication hatched in red and the exposed time of every class in the title."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fig = timeline_figure(res)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
