"""Memory-first pruning in strategy search (issue 16): configurations/s with and without it, same run.

GPT-3 175B on 1,024 A100s (DGX-A100), global batch 1,536 x 2,048, over every TP x PP x DP split with micro-batch
1-16, ZeRO 0-3, SP, recomputation none/full and 1-4 virtual stages (bench_distributed.py's space). With pruning
(the default), a strategy that does not fit is not scheduled; the fitting rows, their order and figures are the
same (checked here and in tests/test_search_objectives.py). Caches are warmed by one search first; then the two
modes alternate ``REPEATS`` times and the best time of each is printed. Prints only.
Run: ``python3 benchmarks/bench_search_pruning.py``.
"""

from __future__ import annotations

import time

import numpy as np

import wattcast

MODEL, CLUSTER, GPUS, BATCH, SEQ = "gpt3_175b", "DGX-A100", 1024, 1536, 2048
SPACE = dict(zero=(0, 1, 2, 3), interleave=(1, 2, 3, 4), recompute=("none", "full"))
REPEATS = 3


def _run(prune: bool):
    t0 = time.perf_counter()
    res = wattcast.search(MODEL, CLUSTER, GPUS, BATCH, SEQ, max_configs=100_000, prune_oom=prune, **SPACE)
    return time.perf_counter() - t0, res


def main() -> None:
    t_cold, _ = _run(True)
    times = {False: [], True: []}
    out = {}
    for _ in range(REPEATS):
        for prune in (False, True):
            dt, res = _run(prune)
            times[prune].append(dt)
            out[prune] = res.ranked
    full, pruned = out[False], out[True]
    n = len(full)
    fit_f, fit_p = full[full["fits"]], pruned[pruned["fits"]]
    same_top = fit_f["strategy"].head(10).tolist() == fit_p["strategy"].head(10).tolist()
    same_fit = (fit_f["strategy"].tolist() == fit_p["strategy"].tolist()
                and np.array_equal(fit_f["step_time_ms"].to_numpy(), fit_p["step_time_ms"].to_numpy()))
    print(f"{MODEL} on {GPUS} x {CLUSTER}, batch {BATCH} x {SEQ}: {n} valid configurations, {len(fit_f)} fit "
          f"({100 * (1 - len(fit_f) / n):.0f}% do not); first (cold) search {t_cold:.2f} s")
    b_f, b_p = min(times[False]), min(times[True])
    print(f"  every step simulated : {b_f:.2f} s = {n / b_f:,.0f} configurations/s (best of {REPEATS}; "
          + ", ".join(f"{t:.2f}" for t in times[False]) + ")")
    print(f"  memory-first pruning : {b_p:.2f} s = {n / b_p:,.0f} configurations/s (best of {REPEATS}; "
          + ", ".join(f"{t:.2f}" for t in times[True]) + ")")
    print(f"  speed-up {b_f / b_p:.2f}x; top-10 unchanged: {same_top}; every fitting row identical: {same_fit}")


if __name__ == "__main__":
    main()
