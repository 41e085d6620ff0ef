"""GPU busy time of a trace from its kernel intervals: compute kernels, communication (NCCL) kernels, and the union.

The sum of kernel durations counts twice the time two streams run kernels at once (a data-parallel trace overlaps
its NCCL all-reduce with backward compute on another stream); the union of the [start, end) intervals, per GPU, is
the time that GPU had at least one kernel running. ``steps_ms`` are the wall-clock spans of the trace's
``ProfilerStep#N`` annotations (``torch.profiler.profile.step()`` records one per step; PyTorch
``torch/profiler/profiler.py``, ``record_function("ProfilerStep#" + str(self.step_num))``).
"""

from __future__ import annotations

import numpy as np


def union_us(start_us: np.ndarray, end_us: np.ndarray) -> float:
    """Length of the union of the intervals [start, end) (same unit in, same out); vectorised sweep."""
    s = np.asarray(start_us, float)
    e = np.asarray(end_us, float)
    if not len(s):
        return 0.0
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)  # furthest end seen so far
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]  # a gap before this interval opens a new busy segment
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return float(np.sum(reach[last] - s[first]))


def busy_summary(start_us, dur_us, device, is_comm, steps_ms=()) -> dict:
    """Busy figures (ms) of kernels given by start / duration (us), GPU index and an is-communication flag.

    Kernels with a missing or negative duration are left out (the importers mark them unmapped)."""
    start = np.asarray(start_us, float)
    dur = np.asarray(dur_us, float)
    dev = np.asarray(device, object)
    comm = np.asarray(is_comm, bool)
    ok = np.isfinite(start) & np.isfinite(dur) & (dur >= 0)
    start, dur, dev, comm = start[ok], dur[ok], dev[ok], comm[ok]
    union = sum(union_us(start[dev == d], start[dev == d] + dur[dev == d]) for d in set(dev.tolist()))
    steps = [float(x) for x in steps_ms]
    return {"compute_kernels": int((~comm).sum()), "comm_kernels": int(comm.sum()),
            "compute_busy_ms": float(dur[~comm].sum()) / 1e3, "comm_busy_ms": float(dur[comm].sum()) / 1e3,
            "union_busy_ms": union / 1e3, "steps_ms": steps}


def merge_busy(parts: list[dict]) -> dict | None:
    """The busy figures of several files (sums; steps concatenated); None when no file had them."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    out = {k: sum(p[k] for p in parts) for k in ("compute_kernels", "comm_kernels", "compute_busy_ms", "comm_busy_ms",
                                                  "union_busy_ms")}
    out["steps_ms"] = [s for p in parts for s in p.get("steps_ms", [])]
    return out
