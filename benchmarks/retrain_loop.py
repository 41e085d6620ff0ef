#!/usr/bin/env python3
"""The retraining loop on real profiling data: import a device's trace, retrain, and see that device's error fall.

    python3 benchmarks/retrain_loop.py [--data PATH] [--trace FILE] [--mlruns DIR | --no-mlflow]

1. ``wattcast profile import`` the PyTorch-profiler trace (default: HolisticTraceAnalysis' A100 training trace,
   ``traces/a100_trace_diff_control.json.gz``; its GPU, an A100-SXM4-40GB, is in no training dataset);
2. split its mapped kernels by shape (every distinct (op, dtype, shape) goes to one half, so no shape is in
   both): the *fit* half becomes a user CSV, the *eval* half is only ever predicted;
3. train two bundles with the same (quick) recipe: **before** on the shared datasets alone, **after** on the
   shared datasets plus the fit half (``run_train_kernels(csv=...)``, what ``wattcast train kernels --data DIR``
   does with an imported folder);
4. predict with both: the eval half of the trace (MAPE and signed bias of the summed kernel time per op class),
   and the project's held-out GPUs (L4, A100 80GB PCIe; never trained on) to check nothing got worse there.

The quick recipe (``TrainConfig.quick``) keeps both trainings to minutes; the shipped bundle's figures are printed
beside them for reference. Logged to MLflow (experiment ``retrain-loop``) unless ``--no-mlflow``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from heldout_accuracy import heldout_predictions  # noqa: E402

from wattcast.data.catalog import resolve_device  # noqa: E402
from wattcast.data.kernel_datasets import resolve_data_root  # noqa: E402
from wattcast.data.profiles.importers import import_files  # noqa: E402
from wattcast.models.kernel_bundle import load_bundle  # noqa: E402
from wattcast.training.kernel_run import run_train_kernels  # noqa: E402
from wattcast.training.kernels import evaluate  # noqa: E402


def split_by_shape(rows: pd.DataFrame, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(fit, eval): each distinct op/dtype/shape wholly in one half (a stable hash of the key decides)."""
    key = pd.util.hash_pandas_object(rows[["OPName", "dtype", "B", "M", "N", "K", "H"]], index=False,
                                     hash_key=f"wattcast-split{seed:04d}"[:16]).to_numpy()
    h = key % 2
    return rows[h == 0].reset_index(drop=True), rows[h == 1].reset_index(drop=True)


def trace_errors(bundle_dir, rows: pd.DataFrame, label: str) -> pd.DataFrame:
    b = load_bundle(bundle_dir) if bundle_dir else load_bundle()
    dev = rows["Device"].iloc[0]
    canon = rows.rename(columns={"OPName": "op"})
    canon = canon.assign(device=dev, source="trace")
    pred = evaluate(b, canon, {dev: resolve_device(dev)})
    pred["err"] = pred["pred_latency_ms"] / pred["latency_ms"] - 1.0
    out = pred.groupby("report_family").agg(rows=("err", "size"), mape_pct=("ape", "mean"), bias_pct=("err", "mean"))
    out.loc["all"] = [len(pred), pred["ape"].mean(), pred["err"].mean()]
    out[["mape_pct", "bias_pct"]] *= 100
    return out.assign(bundle=label)


def heldout_errors(bundle_dir, data, label: str) -> pd.DataFrame:
    pred = heldout_predictions(data, str(bundle_dir) if bundle_dir else None)
    pred["err"] = pred["pred_latency_ms"] / pred["latency_ms"] - 1.0
    g = pred.groupby("device")
    return pd.DataFrame({"rows": g.size(), "mape_pct": 100 * g["ape"].mean(), "bias_pct": 100 * g["err"].mean(),
                         "bundle": label})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    ap.add_argument("--trace", default=None)
    ap.add_argument("--mlruns", default="mlruns")
    ap.add_argument("--no-mlflow", action="store_true")
    a = ap.parse_args()
    t0 = time.time()
    root = resolve_data_root(a.data)
    trace = Path(a.trace) if a.trace else root / "traces" / "a100_trace_diff_control.json.gz"
    pd.set_option("display.width", 200)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        import_files([trace]).write(tmp / "profile")
        k = pd.read_csv(tmp / "profile" / "kernels.csv")
        k = k[k["OPName"].fillna("").astype(str) != ""]
        fit, ev = split_by_shape(k)
        fit_csv = tmp / "fit.csv"
        fit.to_csv(fit_csv, index=False)
        print(f"{trace.name}: {len(k):,} mapped kernel rows on {k['Device'].iloc[0]}; fit half {len(fit):,}, "
              f"eval half {len(ev):,} (no shape in both)")
        arms = {}
        for label, csv in (("before", None), ("after", fit_csv)):
            out = tmp / label
            # force: each arm's bundle is read from its folder and compared here; since stop 54 a bundle trained into a
            # new folder is judged against the shipped one, and a quick recipe's is refused there
            r = run_train_kernels(data=a.data, csv=csv, out_dir=out, quick=True, use_mlflow=False, log=lambda m: None,
                                  force=True)
            arms[label] = out
            print(f"{label}: trained in {r.metrics.get('train_seconds', 0):.0f} s ({r.reason})")
        tr = pd.concat([trace_errors(None, ev, "shipped"), *(trace_errors(d, ev, lab) for lab, d in arms.items())])
        ho = pd.concat([heldout_errors(None, a.data, "shipped"),
                        *(heldout_errors(d, a.data, lab) for lab, d in arms.items())])
    print("\n== the trace's eval half (kernels never trained on), per op class ==")
    print(tr.reset_index().pivot(index="report_family", columns="bundle", values=["mape_pct", "bias_pct"]).round(1).to_string())
    print("\n== held-out GPUs (never trained on) ==")
    print(ho.reset_index().pivot(index="device", columns="bundle", values=["mape_pct", "bias_pct"]).round(1).to_string())
    b, f = tr[tr["bundle"] == "before"].loc["all"], tr[tr["bundle"] == "after"].loc["all"]
    print(f"\ntrace eval half: MAPE {b['mape_pct']:.1f}% -> {f['mape_pct']:.1f}%, bias {b['bias_pct']:+.1f}% -> "
          f"{f['bias_pct']:+.1f}% ({time.time() - t0:.0f} s)")
    if not a.no_mlflow:
        from wattcast.training.tracking import log_run

        metrics = {f"trace_{r.bundle}_{fam}_{m}": float(getattr(r, m)) for fam, r in tr.iterrows()
                   for m in ("mape_pct", "bias_pct")}
        metrics.update({f"heldout_{r.bundle}_{dev}_{m}": float(getattr(r, m)) for dev, r in ho.iterrows()
                        for m in ("mape_pct", "bias_pct")})
        run_id = log_run(a.mlruns, experiment="retrain-loop", params={"trace": trace.name, "recipe": "quick"},
                         metrics=metrics, tags={"kind": "retrain-loop"},
                         tables={"trace_eval": tr.reset_index(), "heldout": ho.reset_index()})
        print(f"MLflow run {run_id} (experiment retrain-loop)")


if __name__ == "__main__":
    main()
