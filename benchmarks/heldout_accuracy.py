#!/usr/bin/env python3
"""Held-out accuracy of a kernel surrogate bundle (default: the shipped one), recomputed from the data.

    python3 benchmarks/heldout_accuracy.py [--data PATH] [--models DIR] [--mlruns DIR | --no-mlflow]

Predicts every kernels_test row and every mapped label-CSV node of the held-out GPUs (NVIDIA L4,
A100 80GB PCIe) and prints MAPE per op family next to the plain roofline and NeuSight's published
out-of-distribution per-op errors (ASPLOS'25). Nothing is trained; nothing here is used for training.

And the 90% band's honest check (issue 14): per device and op family, the share of measured rows inside
[pred_low_ms, pred_high_ms] (``band_coverage_pct``), split into rows flagged OOD and not, the band's median
width (high / low) against the measured 5-95% spread of measured / predicted, logged to MLflow (experiment
``heldout-band``). Nothing is chosen on these figures (the held-out rule): they report how the band calibrated on
leave-one-generation-out residuals, and widened beyond coverage by models/coverage.py, holds on GPUs never trained on.
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

from wattcast.data.catalog import resolve_device
from wattcast.data.kernel_datasets import HELDOUT_DEVICES, load_kernels, load_label_nodes
from wattcast.models.kernel_bundle import load_bundle
from wattcast.training.kernels import NEUSIGHT_OOD_MAPE, evaluate, summarise


def heldout_predictions(data=None, models=None) -> pd.DataFrame:
    """Every kernels_test row and mapped label-CSV node of the held-out GPUs, predicted by the bundle."""
    bundle = load_bundle(models)
    kern = load_kernels(data)
    rows = pd.concat(
        [kern[kern["device"].isin(HELDOUT_DEVICES)], load_label_nodes(data, devices=list(HELDOUT_DEVICES))],
        ignore_index=True,
    )
    specs = {d: resolve_device(d) for d in rows["device"].unique()}
    leaked = set(bundle.train_devices) & set(HELDOUT_DEVICES)
    print(f"bundle trained on {len(bundle.train_devices)} GPUs; held-out GPUs in its training set: {sorted(leaked) or 'none'}")
    return evaluate(bundle, rows, specs)


def band_table(pred: pd.DataFrame, by=("device", "report_family")) -> pd.DataFrame:
    """Per group: rows, the band's coverage (all rows; OOD rows; the rest), OOD share, the band's median high / low
    and median low and high as multiples of the prediction, and the measured / predicted 5% and 95% quantiles."""
    import numpy as np

    p = pred.assign(lo_x=pred["pred_low_ms"] / pred["pred_latency_ms"], hi_x=pred["pred_high_ms"] / pred["pred_latency_ms"],
                    ratio=pred["latency_ms"] / pred["pred_latency_ms"])
    rows = []
    for key, g in p.groupby(list(by)):
        o = g["ood"].astype(bool)
        rows.append({**dict(zip(by, key)), "rows": len(g), "coverage_pct": 100 * g["inside_band"].mean(),
                     "coverage_ood_pct": 100 * g["inside_band"][o].mean() if o.any() else np.nan,
                     "coverage_in_pct": 100 * g["inside_band"][~o].mean() if (~o).any() else np.nan,
                     "ood_pct": 100 * o.mean(), "band_width_x": float((g["hi_x"] / g["lo_x"]).median()),
                     "band_low_x": float(g["lo_x"].median()), "band_high_x": float(g["hi_x"].median()),
                     "measured_q05_x": float(g["ratio"].quantile(0.05)), "measured_q95_x": float(g["ratio"].quantile(0.95))})
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    ap.add_argument("--models", default=None)
    ap.add_argument("--mlruns", default="mlruns")
    ap.add_argument("--no-mlflow", action="store_true")
    a = ap.parse_args()
    t0 = time.time()
    pred = heldout_predictions(a.data, a.models)
    pd.set_option("display.width", 200)
    for title, by in (("by source", ["device", "source", "report_family"]), ("all held-out rows", ["device", "report_family"])):
        t = summarise(pred, by)
        if title == "all held-out rows":
            t["neusight_published_pct"] = [NEUSIGHT_OOD_MAPE.get(f) for *_, f in t.index]
        print(f"\n== held-out MAPE, {title} ==")
        print(t.to_string())
    bt = band_table(pred)
    print("\n== the 90% band on the held-out GPUs (coverage: measured inside [low, high]; x: of the prediction) ==")
    print(bt.round(2).to_string(index=False))
    print(f"\n{len(pred):,} held-out rows predicted in {time.time() - t0:.1f} s")
    if not a.no_mlflow:
        from wattcast.training.tracking import log_run

        metrics = {f"heldout_{r.device}_{r.report_family}_{m}": float(getattr(r, m)) for r in bt.itertuples()
                   for m in ("coverage_pct", "ood_pct", "band_width_x") if pd.notna(getattr(r, m))}
        run_id = log_run(a.mlruns, experiment="heldout-band", params={"models": str(a.models or "shipped")},
                         metrics=metrics, tags={"kind": "heldout-band"}, tables={"heldout_band": bt})
        print(f"MLflow run {run_id} (experiment heldout-band)")


if __name__ == "__main__":
    main()
