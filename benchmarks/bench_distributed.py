"""How fast distributed predictions and strategy search are (issue 4's benchmark).

Targets: one prediction of GPT-3 175B on 1,024 A100s (TP8 PP16 DP8) under 100 ms warm; a strategy search
over at least 1,000 configurations of that case under 10 s on 2 cores.
Run: ``python3 benchmarks/bench_distributed.py``. Prints wall times and configurations per second.
"""

from __future__ import annotations

import statistics
import time

import wattcast

MODEL, CLUSTER, GPUS, BATCH, SEQ = "gpt3_175b", "DGX-A100", 1024, 1536, 2048


def main() -> None:
    kw = dict(gpus=GPUS, batch=BATCH, seq=SEQ, tp=8, pp=16, micro_batch=1, dtype="bf16", attention="flash",
              recompute="full")
    t0 = time.perf_counter()
    r = wattcast.predict_cluster(MODEL, CLUSTER, **kw)
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(10):
        t0 = time.perf_counter()
        wattcast.predict_cluster(MODEL, CLUSTER, **kw)
        warm.append(time.perf_counter() - t0)
    print(f"GPT-3 175B, {GPUS} x A100 (DGX-A100), TP8 PP16 DP8, global batch {BATCH}, seq {SEQ}, full recomputation:")
    print(f"  step {r.step_time_ms / 1e3:.2f} s, MFU {r.mfu:.3f}, {r.tflops_per_gpu:.1f} TFLOP/s per GPU, "
          f"{r.memory_gb:.1f} GB per GPU")
    print(f"  one prediction: cold {cold * 1e3:.0f} ms (imports, model loading, graph building), "
          f"warm median {statistics.median(warm) * 1e3:.1f} ms (target < 100 ms)")

    # every TP x PP x DP split with micro-batch 1..16, ZeRO 0-3, sequence parallelism, recomputation none/full,
    # 1-4 virtual stages; rule-breaking configurations are rejected before any graph is built
    space = dict(zero=(0, 1, 2, 3), interleave=(1, 2, 3, 4), recompute=("none", "full"))
    t0 = time.perf_counter()
    res = wattcast.search(MODEL, CLUSTER, GPUS, BATCH, SEQ, max_configs=100_000, **space)
    dt = time.perf_counter() - t0
    n = len(res.ranked)
    print(f"search: {n} valid configurations evaluated ({len(res.rejected)} rejected by the rules) in {dt:.2f} s "
          f"= {n / dt:.0f} configurations/s (target: >= 1,000 in < 10 s)")
    best = res.best
    if best:
        print(f"  best: {best['config']}  step {best['step_time_ms'] / 1e3:.2f} s  MFU {best['mfu']:.3f}  "
              f"{best['memory_gb']:.1f} GB; Pareto front {len(res.pareto)} configurations")
    t0 = time.perf_counter()
    res = wattcast.search(MODEL, CLUSTER, GPUS, BATCH, SEQ, max_configs=100_000, **space)
    dt = time.perf_counter() - t0
    print(f"  again with warm caches: {dt:.2f} s = {len(res.ranked) / dt:.0f} configurations/s")


if __name__ == "__main__":
    main()
