"""GPU busy time of a trace from its kernel intervals: compute kernels, communication (NCCL) kernels, and the union.

The sum of kernel durations counts twice the time two streams run kernels at once (a data-parallel trace overlaps
its NCCL all-reduce with backward compute on another stream); the union of the [start, end) intervals, per GPU, is
the time that GPU had at least one kernel running (kernels only: memory copies / sets are counted apart, in
``copies``). ``steps_cpu_ms`` are the CPU-side wall spans of the trace's ``ProfilerStep#N`` annotations
(``torch.profiler.profile.step()`` records one per step; PyTorch ``torch/profiler/profiler.py``,
``record_function("ProfilerStep#" + str(self.step_num))``); ``steps_ms`` are their GPU spans: first start to last
end of the GPU events (kernels, memcpy, memset) launched inside each step. The CPU runs ahead of the GPU (v100_rank0:
CPU spans 35.1, 72.1, 95.7 ms for steps whose kernels span 95.4-97.7 ms), so the CPU span is not the step time; a
step that launched no GPU work has no GPU span and is left out of ``steps_ms`` (``steps_without_gpu``).
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


def step_gpu_spans_ms(step_start_us, step_end_us, step_pid, launch_us, launch_pid, gpu_start_us, gpu_end_us) -> np.ndarray:
    """Per step, the GPU span (ms) of the GPU events launched inside it: max end - min start of the events whose
    CPU launch time lies in [step start, step end] of the same process; NaN for a step that launched none.

    Steps of one process do not overlap (one ``ProfilerStep#`` at a time); events without a launch site (NaN
    ``launch_us``) belong to no step."""
    s0 = np.asarray(step_start_us, float)
    s1 = np.asarray(step_end_us, float)
    spid = np.asarray(step_pid, object)
    lt = np.asarray(launch_us, float)
    lpid = np.asarray(launch_pid, object)
    g0 = np.asarray(gpu_start_us, float)
    g1 = np.asarray(gpu_end_us, float)
    lo = np.full(len(s0), np.inf)
    hi = np.full(len(s0), -np.inf)
    ok = np.isfinite(lt) & np.isfinite(g0) & np.isfinite(g1)
    for pid in set(spid.tolist()):
        steps = np.flatnonzero(spid == pid)
        steps = steps[np.argsort(s0[steps], kind="stable")]
        ev = np.flatnonzero(ok & (lpid == pid))
        j = np.searchsorted(s0[steps], lt[ev], side="right") - 1  # the last step starting at or before the launch
        inside = (j >= 0) & (lt[ev] <= s1[steps[np.maximum(j, 0)]])
        owner, ev = steps[j[inside]], ev[inside]
        np.minimum.at(lo, owner, g0[ev])
        np.maximum.at(hi, owner, g1[ev])
    span = (hi - lo) / 1e3
    return np.where(np.isfinite(span), span, np.nan)


#: kinds of GPU memory operations (Kineto names them "Memcpy HtoD (Pageable -> Device)", "Memset (Device)"; PyTorch
#: libkineto ``src/CuptiActivity.cpp``, ``memcpyKindString`` / ``GpuActivity<CUpti_ActivityMemset>::name``)
COPY_KINDS = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "memset", "other")


def copy_kind(name: str, cat: str) -> str:
    """The kind of a gpu_memcpy / gpu_memset event from its category and name."""
    if cat == "gpu_memset" or str(name).startswith("Memset"):
        return "memset"
    for k in COPY_KINDS[:5]:
        if f"Memcpy {k}" in str(name):
            return k
    return "other"


def copy_summary(names, cats, dur_us) -> dict:
    """{kind: {"events": n, "ms": total}} of the GPU memory operations (kinds in :data:`COPY_KINDS`, present ones)."""
    out: dict[str, dict] = {}
    for n, c, d in zip(names, cats, dur_us):
        _add_copies(out, copy_kind(n, c), 1, float(d) / 1e3 if d is not None and np.isfinite(d) else 0.0)
    return out


def _add_copies(into: dict, kind: str, events: int, ms: float) -> None:
    """Add ``events`` operations of ``ms`` to ``into[kind]`` (a :func:`copy_summary` dict)."""
    o = into.setdefault(kind, {"events": 0, "ms": 0.0})
    o["events"] += events
    o["ms"] += ms


def _copy_totals(copies: dict) -> dict:
    """The busy keys of a :func:`copy_summary` dict: itself, its event count and its ms."""
    return {"copies": copies, "copy_events": int(sum(v["events"] for v in copies.values())),
            "copy_ms": float(sum(v["ms"] for v in copies.values()))}


def busy_summary(start_us, dur_us, device, is_comm, steps_ms=(), steps_cpu_ms=None, copies=None) -> dict:
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
    out = {"compute_kernels": int((~comm).sum()), "comm_kernels": int(comm.sum()),
           "compute_busy_ms": float(dur[~comm].sum()) / 1e3, "comm_busy_ms": float(dur[comm].sum()) / 1e3,
           "union_busy_ms": union / 1e3, "steps_ms": steps}
    if steps_cpu_ms is not None:
        out["steps_cpu_ms"] = [float(x) for x in steps_cpu_ms]
    if copies is not None:
        out.update(_copy_totals(copies))
    return out


def merge_busy(parts: list[dict]) -> dict | None:
    """The busy figures of several files (sums; steps concatenated); None when no file had them."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    out = {k: sum(p[k] for p in parts) for k in ("compute_kernels", "comm_kernels", "compute_busy_ms", "comm_busy_ms",
                                                  "union_busy_ms")}
    out["steps_ms"] = [s for p in parts for s in p.get("steps_ms", [])]
    if any("steps_cpu_ms" in p for p in parts):
        out["steps_cpu_ms"] = [s for p in parts for s in p.get("steps_cpu_ms", [])]
    out["steps_without_gpu"] = sum(p.get("steps_without_gpu", 0) for p in parts)
    if any("copies" in p for p in parts):
        copies: dict[str, dict] = {}
        for p in parts:
            for k, v in (p.get("copies") or {}).items():
                _add_copies(copies, k, v["events"], v["ms"])
        out.update(_copy_totals(copies))
    return out
