"""The 90% band of a predicted step, calibrated on measured steps: ``python -m wattcast.validation.step_band``.

A kernel's band (``models/kernel_bundle.py``, from the leave-one-generation-out folds) says how far one kernel may be
off; a step's error is not their sum (their scatter averages out over thousands of kernels, the comonotone sum is
-20 .. +88% wide and covers everything). The step band here is measured on whole steps, per setting:

- ``single``: one GPU (NeuSight's single-GPU labels, FP32 eager, inference and training). Calibrated on the training
  GPUs' labels; checked on the project's held-out GPUs' labels (L4, A100 80GB PCIe), never fitted there;
- ``cluster``: a distributed training step. Calibrated on vTrain's single-node fitting half (the half the
  Megatron-DeepSpeed host costs were fitted on), vTrain's multi-node rows and the MPT fitting half's models (rows the
  source itself shows to be inconsistent, ``validation/source_anomalies.py``, left out); checked on vTrain's
  single-node evaluation half and the MPT evaluation half's models.

Each source weighs the same (a source of 720 rows does not outvote one of 100): the band is the 5% and 95% weighted
quantiles of log(measured / predicted). Written to ``models/artifacts/step_band.json`` (read by
:mod:`wattcast.simulate.step_band` at prediction time) with each source's rows and quantiles and the coverage on the
check rows, and logged to MLflow (experiment ``step-band``).

Every measured step here ran on one GPU generation's worth of hardware per setting (the labels: Pascal .. CDNA2; the
clusters: A100s only). A step on a generation outside those also carries the kernels' generation error
(:func:`wattcast.simulate.step_band.generation_log_width`), which no measured step checks.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.catalog import resolve_device
from wattcast.data.device_spec import generation_of
from wattcast.models.kernel_bundle import load_bundle
from wattcast.simulate.step_band import STEP_BAND_FILE, check_step_band, generation_log_width, mix_band_log
from wattcast.validation.distributed_validation import VTRAIN_RECOMPUTE, fit_split, load_vtrain, predict_vtrain
from wattcast.validation.e2e_labels import evaluate_labels
from wattcast.validation.mpt_validation import MPT_DEVICE, load_mpt, predict_mpt, split_mpt
from wattcast.validation.source_anomalies import anomaly_mask

#: quantiles of the band
QUANTILES = (0.05, 0.95)


def _ood_dicts(p: pd.DataFrame) -> list | None:
    """Per row of a cluster prediction table: the OOD term ``{"share", "low_log", "high_log"}`` from its
    ``step_breakdown.ood_band_columns`` (None without them)."""
    if "ood_time_share" not in p:
        return None
    return [{"share": s, "low_log": lo, "high_log": hi} if s > 0 else {}
            for s, lo, hi in zip(p["ood_time_share"].astype(float), p["ood_band_low_log"].astype(float),
                                 p["ood_band_high_log"].astype(float))]


def step_rows(data=None) -> pd.DataFrame:
    """Every measured step with its prediction: setting, source, role (``calibrate`` / ``check``), device,
    measured_ms, predicted_ms."""
    parts = []
    labels = evaluate_labels(data)
    labels = labels[labels["status"] == "ok"]
    parts.append(pd.DataFrame({"setting": "single", "source": np.where(labels["heldout"], "neusight-labels (held-out GPUs)",
                                                                     "neusight-labels (training GPUs)"),
                               "role": np.where(labels["heldout"], "check", "calibrate"), "device": labels["device"],
                               "measured_ms": labels["measured_ms"], "predicted_ms": labels["predicted_ms"],
                               "per_op": labels["per_op"], "tensor": False,
                               "ood_band": labels["ood_band"] if "ood_band" in labels else None}))
    fit, ev = fit_split(load_vtrain(data, "single"))
    multi = load_vtrain(data, "multi")
    multi = multi[~anomaly_mask(multi, "vtrain-multi")]
    mpt = load_mpt(data)
    mpt = mpt[~anomaly_mask(mpt, "mpt")]
    mpt_fit, mpt_ev = split_mpt(mpt)
    def single(d):
        return predict_vtrain(d, recompute=VTRAIN_RECOMPUTE["single"])

    for source, role, df, pred in (
            ("vtrain-single (fitting half)", "calibrate", fit, single),
            ("vtrain-multi", "calibrate", multi, lambda d: predict_vtrain(d, recompute=VTRAIN_RECOMPUTE["multi"])),
            ("mpt (fitting half)", "calibrate", mpt_fit, predict_mpt),
            ("vtrain-single (evaluation half)", "check", ev, single),
            ("mpt (evaluation half)", "check", mpt_ev, predict_mpt)):
        p = pred(df)
        p = p[p["status"] == "ok"]
        # vTrain's A100s are the DGX-A100 preset's (predict_vtrain's cluster)
        device = p["gpu"].map(MPT_DEVICE) if "gpu" in p else "A100-SXM4-80GB"
        parts.append(pd.DataFrame({"setting": "cluster", "source": source, "role": role, "device": device,
                                   "measured_ms": p["measured_ms"], "predicted_ms": p["predicted_ms"],
                                   "ood_band": _ood_dicts(p)}))
    out = pd.concat(parts, ignore_index=True)
    out["log_ratio"] = np.log(out["measured_ms"].astype(float) / out["predicted_ms"].astype(float))
    return out[np.isfinite(out["log_ratio"])].reset_index(drop=True)


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs) -> list[float]:
    """Quantiles of ``values`` with ``weights`` (midpoint interpolation of the weighted CDF)."""
    order = np.argsort(values)
    v, w = np.asarray(values, dtype=float)[order], np.asarray(weights, dtype=float)[order]
    cdf = (np.cumsum(w) - 0.5 * w) / w.sum()
    return [float(np.interp(q, cdf, v)) for q in qs]


def shipped_band_log(lo: np.ndarray, hi: np.ndarray, ood_bands) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the log band (``lo``, ``hi``: the measured-step band with the row's generation term) mixed with the
    row's OOD term (``ood_bands``: per row the ``{"share", "low_log", "high_log"}`` of
    :func:`~wattcast.simulate.step_band.ood_band_log`, or None/empty) as ``predict`` mixes it (``mix_band_log``)."""
    lo = np.asarray(lo, dtype=float) * np.ones(len(ood_bands) if ood_bands is not None else 1)
    hi = np.asarray(hi, dtype=float) * np.ones_like(lo)
    if ood_bands is None:
        return lo, hi
    lo_r, hi_r = lo.copy(), hi.copy()
    for i, ob in enumerate(ood_bands):
        if isinstance(ob, dict) and ob:
            lo_r[i], hi_r[i] = mix_band_log(float(lo[i]), float(hi[i]), ob)
    return lo_r, hi_r


def _mean_share(ood_bands) -> float:
    """The mean OOD time share over rows' OOD terms (0 for a row without one)."""
    return float(np.mean([float(ob.get("share", 0.0)) if isinstance(ob, dict) else 0.0 for ob in ood_bands]))


def calibrate(rows: pd.DataFrame, bundle=None) -> dict:
    """The calibration (see :func:`wattcast.simulate.step_band.check_step_band`) from :func:`step_rows`'s table; a
    check row on a generation outside the calibration's is scored with ``bundle``'s generation term added."""
    out = {"quantiles": list(QUANTILES), "settings": {}}
    for setting, d in rows.groupby("setting"):
        cal = d[d["role"] == "calibrate"]
        w = 1.0 / cal.groupby("source")["log_ratio"].transform("size").to_numpy()
        lo, hi = weighted_quantiles(cal["log_ratio"].to_numpy(), w, QUANTILES)
        gens = sorted({generation_of(resolve_device(dv)) for dv in cal["device"].unique()})
        # a row on a generation outside the calibration's carries the kernels' generation error too, as a prediction
        # does (simulate/step_band.py); rows without their op split (the clusters: all A100s) get none
        extra = np.zeros(len(d))
        if bundle is not None and "per_op" in d:
            for i, r in enumerate(d.itertuples(index=False)):
                if generation_of(resolve_device(r.device)) not in gens and isinstance(r.per_op, list):
                    extra[i] = generation_log_width(r.per_op, bundle, bool(r.tensor))
        lr = d["log_ratio"].to_numpy()
        # each row against the band `predict` ships for it: with its OOD kernels' share carrying their own band
        # (simulate/step_band.py mix_band_log), as predict applies it; until stop 58 scored without it
        lo_r, hi_r = shipped_band_log(lo - extra, hi + extra, d["ood_band"] if "ood_band" in d else None)
        inside = pd.Series((lr >= lo_r) & (lr <= hi_r), index=d.index)
        inside_unmixed = (lr >= lo - extra) & (lr <= hi + extra)
        is_chk = (d["role"] == "check").to_numpy()
        sources = {}
        for (src, role), s in d.groupby(["source", "role"]):
            q = np.quantile(s["log_ratio"], QUANTILES)
            sources[src] = {"role": role, "rows": int(len(s)), "q05_log": float(q[0]), "q95_log": float(q[1]),
                            "signed_mean_pct": float(100 * (np.exp(-s["log_ratio"]) - 1).mean()),
                            "coverage": float(inside[s.index].mean())}
        out["settings"][setting] = {"band_log": [lo, hi], "generations": gens, "calibration_rows": int(len(cal)),
                                    "check_rows": int(is_chk.sum()),
                                    "check_coverage": float(inside[is_chk].mean()) if is_chk.any() else None,
                                    # the same rows against the band without the OOD term (what check_coverage was
                                    # until stop 58), and the check rows' mean OOD share
                                    "check_coverage_without_ood": float(inside_unmixed[is_chk].mean()) if is_chk.any() else None,
                                    "check_ood_time_share": _mean_share(d["ood_band"][is_chk]) if "ood_band" in d and is_chk.any() else None,
                                    "sources": sources}
    return check_step_band(out, "step band")


def run_step_band(data=None, *, output=None, tracking_dir="mlruns", use_mlflow: bool = True) -> dict:
    """Calibrate the step band from the shared data: ``{"band": the calibration, "run_id": MLflow run or None}``;
    ``output``: also write it there (``python -m`` writes the shipped file)."""
    band = calibrate(step_rows(data), load_bundle())
    if output is not None:
        Path(output).write_text(json.dumps(band, indent=1, sort_keys=True) + "\n")
    run_id = None
    if use_mlflow:
        from wattcast.training.tracking import log_run

        metrics = {}
        for setting, s in band["settings"].items():
            metrics[f"{setting}_band_low_log"], metrics[f"{setting}_band_high_log"] = s["band_log"]
            if s["check_coverage"] is not None:
                metrics[f"{setting}_check_coverage"] = s["check_coverage"]
        # per-source summaries only: the measured rows belong to the datasets
        run_id = log_run(tracking_dir, experiment="step-band", params={"quantiles": str(QUANTILES)}, metrics=metrics,
                         tags={"kind": "step-band"}, tables={"step_band_sources": source_table(band)})
    return {"band": band, "run_id": run_id}


def setting_line(setting: str, s: dict) -> str:
    """One calibrated setting in a sentence: its band as %, generations and the share of not-fitted rows inside."""
    lo, hi = (100 * (np.exp(v) - 1) for v in s["band_log"])
    cov = "-" if s["check_coverage"] is None else f"{100 * s['check_coverage']:.1f}%"
    return (f"{setting}: measured within {lo:+.1f} .. {hi:+.1f}% of predicted (90%; generations "
            f"{', '.join(s['generations'])}); rows not fitted inside: {cov} of {s['check_rows']}")


def source_table(band: dict) -> pd.DataFrame:
    """One row per setting and source: role, rows, the 5%/95% quantiles as % (measured / predicted - 1), the signed
    mean error (predicted / measured - 1) and the share inside the setting's band."""
    return pd.DataFrame([dict(setting=st, source=src, role=v["role"], rows=v["rows"],
                              q05_pct=100 * (np.exp(v["q05_log"]) - 1), q95_pct=100 * (np.exp(v["q95_log"]) - 1),
                              signed_mean_pct=v["signed_mean_pct"], inside_pct=100 * v["coverage"])
                         for st, s in band["settings"].items() for src, v in s["sources"].items()])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    ap.add_argument("--output", default=str(STEP_BAND_FILE), help="where the band is written (the shipped file)")
    ap.add_argument("--mlruns", default="mlruns")
    ap.add_argument("--no-mlflow", action="store_true")
    a = ap.parse_args()
    t0 = time.time()
    res = run_step_band(a.data, output=a.output, tracking_dir=a.mlruns, use_mlflow=not a.no_mlflow)
    for setting, s in res["band"]["settings"].items():
        print(setting_line(setting, s))
    print(source_table(res["band"]).round(1).to_string(index=False))
    print(f"wrote {a.output} ({time.time() - t0:.0f} s)")
    if res["run_id"]:
        print(f"MLflow run {res['run_id']} (experiment step-band)")


if __name__ == "__main__":
    main()
