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
    for r in nodes[["name", "op_class", "phase", "layer", "kernel", "method", "time_ms", "gpu_ms", "flops", "bytes", "ood"]].itertuples(index=False):
        dur = float(r.time_ms) * 1e3
        events.append({"name": r.name, "cat": f"{r.phase},{r.op_class}", "ph": "X", "pid": 0, "tid": 0, "ts": round(t_us, 3),
                       "dur": round(dur, 3), "args": {"layer": int(r.layer), "kernel": r.kernel, "method": r.method,
                                                      "gpu_ms": float(r.gpu_ms), "flops": float(r.flops), "bytes": float(r.bytes),
                                                      "ood": bool(r.ood)}})
        t_us += dur
    return events


def write_chrome_trace(res, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"traceEvents": chrome_trace_events(res), "displayTimeUnit": "ms",
                               "otherData": {"model": res.meta.get("name"), "device": res.device, "mode": res.mode,
                                             "step_time_ms": res.step_time_ms}}))
    tmp.replace(path)
    return path
