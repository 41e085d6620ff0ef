"""Fit Megatron-LM's host-side overheads (per kernel, per iteration) on half of vTrain's single-node rows.

The other half and every multi-node row are never used here; `wattcast validate distributed` reports on
them. Prints the grid and the chosen pair (to be typed into simulate/distributed.py FRAMEWORK_HOST_MS).
``--collective``: instead, the host-bound floor of a TP8 collective (FRAMEWORK_COLLECTIVE_HOST_MS) with the per-kernel
and per-iteration costs as shipped; the mean absolute error per TP degree is printed for each candidate.
Run: python3 benchmarks/fit_framework_overhead.py [--rows 120] [--collective]
"""

from __future__ import annotations

import argparse
import itertools

import pandas as pd

from wattcast.simulate.distributed import FRAMEWORK_HOST_MS
from wattcast.validation.distributed_validation import fit_split, load_vtrain, predict_vtrain


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=720, help="rows of the fitting half to use (speed)")
    ap.add_argument("--recompute", default="none", help="activation recomputation assumed in the runs")
    ap.add_argument("--collective", action="store_true", help="fit the TP8 collective floor instead")
    args = ap.parse_args()
    if args.collective:
        fit_collective_floor(args.rows, args.recompute)
        return
    fit = _fitting_rows(args.rows)
    res = []
    for launch_ms, iter_ms in itertools.product((0.006, 0.025, 0.05, 0.06, 0.065, 0.0675, 0.07, 0.0725, 0.075, 0.0775,
                                                  0.08, 0.09, 0.1, 0.11, 0.14),
                                                 (0.0, 2.5, 5.0, 10.0, 20.0, 30.0)):
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


def _fitting_rows(rows: int) -> pd.DataFrame:
    """``rows`` rows (seeded) of vTrain's single-node fitting half."""
    fit, _ = fit_split(load_vtrain(which="single"))
    return fit.sample(n=min(rows, len(fit)), random_state=1)


def fit_collective_floor(rows: int, recompute: str) -> None:
    """Grid over the host-bound floor of one 8-rank TP collective (megatron-deepspeed), on the fitting half: the
    shipped per-kernel and per-iteration costs with each candidate floor as ``host_ms``'s collective table."""
    fit = _fitting_rows(rows)
    launch_ms, iteration_ms = FRAMEWORK_HOST_MS["megatron-deepspeed"]
    res = []
    for floor_ms in (0.0, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.6):
        p = predict_vtrain(fit, recompute=recompute, host_ms=(launch_ms, iteration_ms, {8: floor_ms} if floor_ms else {}))
        ok = p[p["status"] == "ok"]
        err = ok["error_pct"]
        by_tp = ok.groupby("tp")["error_pct"].agg(lambda e: f"{e.abs().mean():.1f}/{e.mean():+.1f}")
        res.append(dict(tp8_floor_ms=floor_ms, mean_abs_pct=err.abs().mean(), over_15=int((err.abs() > 15).sum()),
                        signed_pct=err.mean(), **{f"tp{int(k)} abs/signed": v for k, v in by_tp.items()}))
        print(res[-1], flush=True)
    df = pd.DataFrame(res).sort_values(["mean_abs_pct", "over_15"])
    print(df.round(2).to_string(index=False))
    print(f"chosen: TP8 collective floor {df.iloc[0].tp8_floor_ms} ms (fit-half mean abs error "
          f"{df.iloc[0].mean_abs_pct:.2f}% on {len(fit)} rows)")


if __name__ == "__main__":
    main()
