"""Replay the real Kineto traces' training steps through wattcast's eager-PyTorch launch queue
(``simulate.single_device.launch_queue_ms``) and the per-kernel max(GPU, h) it replaced, against the measured step.

Per trace in ``$WATTCAST_DATA/traces`` (PyTorch profiler exports, HTA's test data; SOURCE-hta.md) and per profiled step:

- the launches (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ...) joined to their GPU ops by correlation id, in host order;
- the measured step: the GPU span of the step's ops on the chosen stream(s) (first start -> last end);
- the host's time per launch: the step's host span (first -> last launch, every thread) less the time blocked (sync
  calls, and any runtime call beyond 50 us), over the launches;
- host syncs: ``cuda*Synchronize`` / ``hipMemcpyWithStream`` calls and device-to-host copies between two launches: the
  host waits for the stream there (``sync_before`` of the next launch).

Each step is replayed with the ops' measured GPU durations, at the trace's own host time per launch and at the shipped
default (``EAGER_HOST_LAUNCH_MS``, 40 us) and the old 6 us; the table is the median signed error per trace.
Run: python3 benchmarks/replay_launch_queue.py  (about a minute; the traces are ~100 MB of JSON)
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.kernel_datasets import resolve_data_root
from wattcast.simulate.single_device import EAGER_HOST_LAUNCH_MS, launch_queue_ms

#: trace -> (GPU, streams replayed): "main" the stream with most launches (the others run beside it: NCCL, copies),
#: "all" every stream (v100_rank0's DDP all-reduces sit in its one compute stream's order)
TRACES = {"a100_trace_diff_control": ("A100", "main"), "a100_nccl_data": ("A100", "main"), "v100_rank0": ("V100", "all"),
          "v100_df_index_resolver": ("V100", "main"), "a100_trace_diff_test": ("V100-16GB", "main")}
LAUNCH = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaLaunchCooperativeKernel",
          "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipMemcpyWithStream", "hipMemsetAsync", "hipMemcpyAsync"}
SYNC = re.compile(r"Synchronize|hipMemcpyWithStream")
#: a runtime call longer than this (us) is counted as blocked beyond it (a launch that waited on a full queue, an
#: allocation): not the host's own work per launch
BLOCKED_AFTER_US = 50.0


def _events(path: Path) -> pd.DataFrame:
    ev = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]
    df = pd.DataFrame({"cat": [e.get("cat") for e in ev], "name": [e.get("name") for e in ev],
                       "tid": [e.get("tid") for e in ev], "ts": [float(e.get("ts", 0)) for e in ev],
                       "dur": [float(e.get("dur", 0)) for e in ev],
                       "corr": [(e.get("args") or {}).get("correlation") for e in ev]})
    df["end"] = df.ts + df.dur
    return df


def _window(points, starts, ends) -> np.ndarray:
    """index of the (last-started) window holding each point, -1 for none"""
    o = np.argsort(starts)
    s, e = np.asarray(starts)[o], np.asarray(ends)[o]
    i = np.searchsorted(s, points, side="right") - 1
    ok = (i >= 0) & (points < e[np.clip(i, 0, None)])
    return np.where(ok, o[np.clip(i, 0, None)], -1)


def step_rows(path: Path, gpu_name: str, scope: str) -> list[dict]:
    df = _events(path)
    rt = df[df.cat.isin(["cuda_runtime", "cuda_driver"])]
    gpu = df[df.cat.isin(["kernel", "gpu_memcpy", "gpu_memset"])][["corr", "ts", "dur", "end", "name", "tid"]]
    gpu = gpu.rename(columns={"ts": "gts", "dur": "gdur", "end": "gend", "name": "gname", "tid": "stream"})
    la = rt[rt.name.isin(LAUNCH)].merge(gpu.dropna(subset=["corr"]), on="corr").sort_values("ts").reset_index(drop=True)
    ann = df[df.cat == "user_annotation"]
    win = ann[ann.name.str.startswith("ProfilerStep")]
    if not len(win):  # traces without profiler steps: their measured regions
        win = ann[ann.name.str.contains("measure|forward", regex=True)]
    k = _window(la.ts.values, win.ts.values, win.end.values)
    la["step"] = np.where(k >= 0, k, -1)
    la = la[la.step >= 0]
    sync_ts = np.sort(np.r_[rt[rt.name.str.contains(SYNC)].ts.values, la[la.gname.str.contains("DtoH")].ts.values])
    main = la.stream.value_counts().index[0]
    rows = []
    for st, a in la.groupby("step", sort=False):
        g = a if scope == "all" else a[a.stream == main]
        t = g.ts.values
        nxt = np.r_[t[1:], np.inf]
        after = (np.searchsorted(sync_ts, nxt) > np.searchsorted(sync_ts, t)) | g.gname.str.contains("DtoH").values
        sync_before = np.r_[False, after[:-1]]
        a0, a1 = a.ts.min(), a.ts.max()
        r = rt[(rt.ts >= a0) & (rt.ts < a1)]
        blocked = (r[r.name.str.contains(SYNC)].dur.sum()
                   + np.maximum(r[~r.name.str.contains(SYNC)].dur.values - BLOCKED_AFTER_US, 0).sum())
        h_us = (a1 - a0 - blocked) / len(g)
        measured = g.gend.max() - g.gts.min()
        gpu_us = g.gdur.values.astype(float)
        row = dict(trace=path.name.split(".")[0], gpu=gpu_name, step=int(st), launches=len(g), measured_ms=measured / 1e3,
                   host_us=h_us)
        for lab, h in (("own", h_us), ("default", EAGER_HOST_LAUNCH_MS * 1e3), ("old6", 6.0)):
            # the replayed span starts at the first kernel's start (after its own host time): as the measurement
            q = launch_queue_ms(gpu_us, h, sync_before).sum() - h
            row[f"queue_{lab}_pct"] = 100 * (q - measured) / measured
            row[f"max_{lab}_pct"] = 100 * (np.maximum(gpu_us, h).sum() - measured) / measured
        rows.append(row)
    return rows


def main() -> None:
    root = resolve_data_root(None) / "traces"
    rows = [r for name, (gpu, scope) in TRACES.items() for r in step_rows(root / f"{name}.json.gz", gpu, scope)]
    R = pd.DataFrame(rows)
    cols = [c for c in R.columns if c.endswith("_pct")]
    out = R.groupby(["trace", "gpu"]).agg(steps=("step", "size"), host_us=("host_us", "median"),
                                          measured_ms=("measured_ms", "median"), **{c: (c, "median") for c in cols})
    pd.set_option("display.width", 250)
    print("median signed % error per trace: the in-order launch queue and the per-kernel max, at the trace's own host "
          f"time per launch, the default {EAGER_HOST_LAUNCH_MS * 1e3:g} us and the old 6 us")
    print(out.round(1).to_string())


if __name__ == "__main__":
    main()
