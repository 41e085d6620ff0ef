"""Search speed (issue 16): evaluated configurations/s, event-driven pipeline vs the fast path, 1 vs 2 workers, one run.

GPT-3 175B on 1,024 A100s (DGX-A100), global batch 1,536 x 2,048, over TP x PP x DP (every split that divides the job),
micro-batch 1-16, ZeRO 0-3, SP on/off, CP 1/2, recomputation none/full, 1-4 virtual stages and the 1F1B/GPipe
schedules. Three modes, each run once cold (first search in the process, or the workers' first) and then ``REPEATS``
times warm, alternating:

- ``event-driven``: every pipeline timed by the event-driven scheduler (``exact_pipeline=True``), one process;
- ``fast``: the default search (closed-form pipeline timing where it applies, the event loop elsewhere), one process;
- ``fast, 2 workers``: the same with ``workers=2``.

Each line prints the best warm time, configurations/s (rows evaluated, i.e. valid strategies; rejected ones are
counted apart) and the ratio against the event-driven line, by wall clock and CPU-bound (this process's CPU time
plus the busiest worker's, with psutil: what the search takes on otherwise idle cores; the wall clock moves with
whatever else runs, the load average is printed). The rows of the three modes are checked against each other
(top-10 identical, step times within 1%).

A mixture-of-experts line follows (``--skip-moe`` leaves it out): DeepSeek-V3 (61 layers, 3 dense then 58 MoE: its
rank graphs are built whole, 256 routed experts over the EP ranks, 0.5-3 s each, so a search's time is its rank graphs')
on 256 H100s (DGX-H100) under --framework megatron, batch 512 x 4,096, ZeRO 1, EP 8/16, TP 1-2, micro-batch 1-2,
recomputation none/full and the default ETP choices: one run, one process (cold: the graphs are what it measures),
wall clock and CPU time. Stop 52 (a loaded 2-core machine): this line 19.9 s CPU before sharing the forward graph
between the none/full recomputation siblings and keying the unsharded model totals once for ETP None and 1, 14.4 s
after; the CLI's whole space at --zero 1 --ep 8,16 (TP 1-8, micro-batch 1-16: 2,824 candidates) 106 s CPU before, 66 s
after, the same JSON byte for byte. Prints only. Run: ``python3 benchmarks/bench_search_speed.py [--repeats N] [--skip-moe]``.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import wattcast

MODEL, CLUSTER, GPUS, BATCH, SEQ = "gpt3_175b", "DGX-A100", 1024, 1536, 2048
SPACE = dict(zero=(0, 1, 2, 3), sp=(False, True), cp=(1, 2), recompute=("none", "full"), interleave=(1, 2, 3, 4),
             schedule=("1f1b", "gpipe"))
MOE_MODEL, MOE_CLUSTER, MOE_GPUS, MOE_BATCH, MOE_SEQ = "deepseek_v3", "DGX-H100", 256, 512, 4096
MOE_SPACE = dict(zero=(1,), ep=(8, 16), tp=(1, 2), micro_batch=(1, 2), recompute=("none", "full"))
MODES = {"event-driven": dict(exact_pipeline=True, workers=1), "fast": dict(exact_pipeline=False, workers=1),
         "fast, 2 workers": dict(exact_pipeline=False, workers=2)}


def _worker_cpu_s() -> list[float]:
    """CPU seconds each of the search's worker processes has used so far (psutil; [] without it)."""
    from wattcast.planning import search as search_mod

    try:
        import psutil
    except ImportError:  # pragma: no cover - optional
        return []
    out = []
    for pool in search_mod._POOLS:
        for pid in list(getattr(pool, "_processes", {}) or {}):
            try:
                t = psutil.Process(pid).cpu_times()
                out.append(t.user + t.system)
            except psutil.Error:
                out.append(0.0)
    return out


def _run(**kw):
    """(wall s, CPU-bound s, result): CPU-bound is this process's CPU time plus the busiest worker's, what the search
    takes on otherwise idle cores."""
    w0, c0, t0 = _worker_cpu_s(), time.process_time(), time.perf_counter()
    res = wattcast.search(MODEL, CLUSTER, GPUS, BATCH, SEQ, max_configs=1_000_000, **SPACE, **kw)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    w1 = _worker_cpu_s()
    busiest = max([b - (w0[i] if i < len(w0) else 0.0) for i, b in enumerate(w1)], default=0.0)
    return wall, cpu + (busiest if kw.get("workers", 1) > 1 else 0.0), res


def moe_line() -> None:
    """The mixture-of-experts search, once, in one process: wall clock and CPU time, configurations/s."""
    c0, t0 = time.process_time(), time.perf_counter()
    res = wattcast.search(MOE_MODEL, MOE_CLUSTER, MOE_GPUS, MOE_BATCH, MOE_SEQ, framework="megatron", workers=1,
                          max_configs=1_000_000, **MOE_SPACE)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n, n_rej = len(res.ranked), len(res.rejected)
    groups = res.ranked[["tp", "sp", "ep", "micro_batch", "recompute"]].drop_duplicates().shape[0]
    print(f"{MOE_MODEL} on {MOE_GPUS} x {MOE_CLUSTER} (megatron), batch {MOE_BATCH} x {MOE_SEQ}: {n + n_rej:,} "
          f"candidates, {n:,} evaluated ({int(res.ranked['fits'].sum()):,} fit), {n_rej:,} rejected; {groups} "
          f"(tp, sp, ep, mb, recompute) groups; load average " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    print(f"  one process, cold: {wall:6.2f} s wall, {cpu:6.2f} s CPU = {n / cpu:5.1f} configurations/s "
          f"({cpu / max(groups, 1):.2f} s CPU per group)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="warm runs per mode (the best is printed)")
    ap.add_argument("--skip-moe", action="store_true", help="leave out the mixture-of-experts (DeepSeek-V3) line")
    ap.add_argument("--moe-only", action="store_true", help="only the mixture-of-experts (DeepSeek-V3) line")
    args = ap.parse_args()
    if args.moe_only:
        moe_line()
        return
    cold, warm, cpu, out = {}, {m: [] for m in MODES}, {m: [] for m in MODES}, {}
    for m, kw in MODES.items():
        cold[m], _, out[m] = _run(**kw)
    for _ in range(args.repeats):
        for m, kw in MODES.items():
            dt, c, out[m] = _run(**kw)
            warm[m].append(dt)
            cpu[m].append(c)
    ref = out["event-driven"]
    n, n_rej = len(ref.ranked), len(ref.rejected)
    n_fit = int(ref.ranked["fits"].sum())
    print(f"{MODEL} on {GPUS} x {CLUSTER}, batch {BATCH} x {SEQ}: {n + n_rej:,} candidates, {n:,} valid configurations "
          f"evaluated ({n_fit:,} fit), {n_rej:,} rejected by a rule; {os.cpu_count()} CPUs, load average "
          + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    base, base_cpu = min(warm["event-driven"]), min(cpu["event-driven"])
    print("  wall clock (warm, best of %d):" % args.repeats)
    for m in MODES:
        b = min(warm[m])
        print(f"    {m:<16}: {b:6.2f} s = {n / b:7,.0f} configurations/s ({(n + n_rej) / b:7,.0f} candidates/s), "
              f"{base / b:4.2f}x the event-driven path; cold {cold[m]:.2f} s; warm runs "
              + ", ".join(f"{t:.2f}" for t in warm[m]))
    print("  CPU-bound (this process's CPU time + the busiest worker's: the wall time on otherwise idle cores):")
    for m in MODES:
        b = min(cpu[m])
        print(f"    {m:<16}: {b:6.2f} s = {n / b:7,.0f} configurations/s, {base_cpu / b:4.2f}x the event-driven path")
    for m in ("fast", "fast, 2 workers"):
        a, b = ref.ranked, out[m].ranked
        same_top = a["strategy"].head(10).tolist() == b["strategy"].head(10).tolist()
        j = a.merge(b, on="strategy", suffixes=("_e", "_f"))
        ok = j["step_time_ms_e"].notna()
        dev = float(np.max(np.abs(j.loc[ok, "step_time_ms_f"] / j.loc[ok, "step_time_ms_e"] - 1))) if ok.any() else 0.0
        print(f"  {m} vs event-driven: same rows {len(b) == n and len(j) == n}, top-10 identical {same_top}, "
              f"largest step-time difference {dev:.2%}")
    if not args.skip_moe:
        moe_line()


if __name__ == "__main__":
    main()
