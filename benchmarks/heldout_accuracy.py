#!/usr/bin/env python3
"""Held-out accuracy of a kernel surrogate bundle (default: the shipped one), recomputed from the data.

    python3 benchmarks/heldout_accuracy.py [--data PATH] [--models DIR]

Predicts every kernels_test row and every mapped label-CSV node of the held-out GPUs (NVIDIA L4,
A100 80GB PCIe) and prints MAPE per op family next to the plain roofline and NeuSight's published
out-of-distribution per-op errors (ASPLOS'25). Nothing is trained; nothing here is used for training.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    ap.add_argument("--models", default=None)
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
    print(f"\n{len(pred):,} held-out rows predicted in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
