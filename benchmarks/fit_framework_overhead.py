"""Fit Megatron-LM's host-side overheads (per kernel, per iteration) on half of vTrain's single-node rows.

The other half and every multi-node row are never used here; `wattcast validate distributed` reports on
them. Prints the grid and the chosen pair (to be typed into simulate/distributed.py FRAMEWORK_HOST_MS).
Run: python3 benchmarks/fit_framework_overhead.py [--rows 120]
"""

from __future__ import annotations

import argparse
import itertools

import pandas as pd

from wattcast.validation.distributed_validation import fit_split, load_vtrain, predict_vtrain


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=720, help="rows of the fitting half to use (speed)")
    ap.add_argument("--recompute", default="none", help="activation recomputation assumed in the runs")
    args = ap.parse_args()
    single = load_vtrain(which="single")
    fit, _ = fit_split(single)
    fit = fit.sample(n=min(args.rows, len(fit)), random_state=1)
    res = []
    for launch_ms, iter_ms in itertools.product((0.006, 0.025, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.11, 0.14),
                                                 (0.0, 5.0, 10.0, 20.0, 30.0)):
        p = predict_vtrain(fit, host_ms=(launch_ms, iter_ms), recompute=args.recompute)
        ok = p[p["status"] == "ok"]
        err = ok["error_pct"].abs()
        res.append(dict(recompute=args.recompute, launch_ms=launch_ms, iteration_ms=iter_ms, mean_abs_pct=err.mean(), median_abs_pct=err.median(),
                        signed_pct=ok["error_pct"].mean()))
        print(res[-1], flush=True)
    df = pd.DataFrame(res).sort_values("mean_abs_pct")
    print(df.round(2).to_string(index=False))
    best = df.iloc[0]
    print(f"chosen: per-kernel {best.launch_ms} ms, per-iteration {best.iteration_ms} ms "
          f"(fit-half mean abs error {best.mean_abs_pct:.1f}% on {len(fit)} rows)")


if __name__ == "__main__":
    main()
