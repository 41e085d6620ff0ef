"""``wattcast validate trace``: predict every imported kernel row of a profile on a device, compare with its
measured GPU time.

Errors are per row: APE = |pred - meas| / meas, signed = (pred - meas) / meas (positive = over-prediction), both
in %; ``mape_pct`` / ``bias_pct`` are their means over the compared rows, per op class (``REPORT_FAMILY``:
bmm, linear, elementwise, softmax, layernorm, conv) in ``by_op``. ``measured_busy_ms`` / ``predicted_busy_ms`` are
sums of GPU kernel time over the compared rows (the rows both sides cover); the trace's total kernel time
(``trace_busy_ms``: every kernel, compute and NCCL, summed), its split (``compute_busy_ms``, ``comm_busy_ms``), the union
of busy intervals (``union_busy_ms``), the ProfilerStep# wall spans and the compute part that could not be compared
(``unmapped_busy_ms``) are reported next to them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.kernel_ops import REPORT_FAMILY
from wattcast.data.profiles.importers import import_files
from wattcast.data.profiles.kineto import reason_key
from wattcast.data.profiles.row_checks import INVALID_TIME
from wattcast.data.profiles.tables import NoTraceDeviceError, ProfileImportError


def _stats(meas: np.ndarray, pred: np.ndarray) -> dict:
    rel = (pred - meas) / meas * 100.0
    return {"rows": int(len(meas)), "mape_pct": float(np.mean(np.abs(rel))) if len(meas) else float("nan"),
            "bias_pct": float(np.mean(rel)) if len(meas) else float("nan"),
            "median_ape_pct": float(np.median(np.abs(rel))) if len(meas) else float("nan"),
            "measured_ms": float(meas.sum()), "predicted_ms": float(pred.sum())}


def kernel_input_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """The ``predict_kernels`` input of imported kernel rows: op, shape (numeric) and dtype columns."""
    frame = rows[["OPName", "B", "M", "N", "K", "H", "dtype"]].copy()
    for c in ("B", "M", "N", "K", "H"):
        frame[c] = pd.to_numeric(frame[c], errors="coerce")
    return frame


def validate_trace(paths, device, bundle=None, trace_device: str | None = None,
                   in_step: bool = False) -> tuple[dict, pd.DataFrame]:
    """(summary dict, per-row table) for the kernel rows of ``paths`` predicted on ``device``. ``in_step``: compare
    the kernel times a step is costed with (FP32 kernels without NeuSight's isolated-timing floor; no kernel below its
    roofline time plus the GPU-side kernel floor: ``simulate.single_device.in_stream_kernel_ms``) instead of the
    surrogates' isolated-kernel latency."""
    from wattcast import predict_kernels
    from wattcast.data.catalog import resolve_device

    spec = resolve_device(device)
    try:
        prof = import_files([Path(p) for p in paths], device=trace_device)
    except NoTraceDeviceError as e:  # this command gives the trace's GPU by --trace-device (trace_device=), not --device
        raise e.naming("--trace-device") from None
    k = prof.table("kernels")
    if k.empty:
        raise ProfileImportError(f"{', '.join(map(str, paths))}: no GPU kernel rows to compare "
                                 "(a collectives-only or power-only file?)")
    mapped = k["OPName"].fillna("").astype(str) != ""
    lat = pd.to_numeric(k["latency_ms"], errors="coerce")
    lat = lat.where(lat >= 0)  # a negative time (a broken record, kept unmapped) adds no busy time
    positive = lat > 0
    rows = k[mapped & positive].reset_index(drop=True)
    reasons = Counter(reason_key(str(r)) for r in k.loc[~mapped, "reason"].fillna(""))
    zero = mapped & (lat == 0)
    if zero.any():  # a Kineto trace's 1 us resolution records the shortest kernels as 0
        reasons["measured time 0 (below the profiler's 1 us resolution)"] += int(zero.sum())
    broken = mapped & ~(lat >= 0)  # the importers keep such rows unmapped; a negative time is never "0"
    if broken.any():
        reasons[f"{INVALID_TIME} (latency_ms negative or missing)"] += int(broken.sum())
    if rows.empty:
        why = "; ".join(f"{n} x {r}" for r, n in reasons.most_common(3))
        raise ProfileImportError(f"{', '.join(map(str, paths))}: none of the {len(k)} kernel rows maps to a wattcast op "
                                 f"with shapes ({why})")
    frame = kernel_input_frame(rows)
    pred = predict_kernels(frame, spec) if bundle is None else _predict_with(frame, spec, bundle)
    out = rows.copy()
    out["pred_latency_ms"] = pred["pred_latency_ms"].to_numpy()
    if in_step:
        from wattcast.models.kernel_bundle import load_bundle
        from wattcast.simulate.single_device import in_stream_kernel_ms

        b = load_bundle(bundle) if bundle is not None else None
        out["pred_latency_ms"] = in_stream_kernel_ms(pred.assign(dtype=frame["dtype"].to_numpy()), spec, b)
    out["ood"] = pred["ood"].to_numpy()
    out["error"] = pred["error"].to_numpy()
    ok = out["error"].fillna("") == ""
    for e in out.loc[~ok, "error"]:
        reasons[f"not predictable: {e}"] += 1
    cmp_ = out[ok].copy()
    if cmp_.empty:
        why = "; ".join(f"{n} x {r}" for r, n in reasons.most_common(3))
        raise ProfileImportError(f"{', '.join(map(str, paths))}: none of the {len(k)} kernel rows can be compared on "
                                 f"{spec.name} ({why})")
    cmp_["op_class"] = cmp_["OPName"].map(REPORT_FAMILY).fillna("other")
    cmp_["error_pct"] = (cmp_["pred_latency_ms"] - cmp_["latency_ms"]) / cmp_["latency_ms"] * 100.0
    meas, prd = cmp_["latency_ms"].to_numpy(float), cmp_["pred_latency_ms"].to_numpy(float)
    total = _stats(meas, prd)
    by_op = {}
    for cls, g in cmp_.groupby("op_class", sort=True):
        by_op[cls] = _stats(g["latency_ms"].to_numpy(float), g["pred_latency_ms"].to_numpy(float))
    by_kernel_op = {}
    for op, g in cmp_.groupby("OPName", sort=True):
        s = _stats(g["latency_ms"].to_numpy(float), g["pred_latency_ms"].to_numpy(float))
        by_kernel_op[op] = {k2: s[k2] for k2 in ("rows", "mape_pct", "bias_pct")}
    trace_devs = sorted({str(d) for d in k["device_name"].fillna("") if str(d)})
    summary = {
        "rows": total["rows"], "mape_pct": total["mape_pct"], "bias_pct": total["bias_pct"],
        "by_op": {c: {k2: v[k2] for k2 in ("rows", "mape_pct", "bias_pct", "median_ape_pct", "measured_ms", "predicted_ms")}
                  for c, v in by_op.items()},
        "measured_busy_ms": total["measured_ms"], "predicted_busy_ms": total["predicted_ms"],
        "median_ape_pct": total["median_ape_pct"], "by_kernel_op": by_kernel_op,
        "device": spec.name, "trace_devices": trace_devs,
        "trace_catalog_devices": sorted({str(d) for d in k["Device"].fillna("") if str(d)}),
        "files": [str(p) for p in paths], "kernel_rows": int(len(k)),
        **_busy_keys(prof, k, lat),
        "unmapped_rows": int(len(k) - total["rows"]),
        "unmapped_busy_ms": float(lat.fillna(0).sum() - total["measured_ms"]),
        "unmapped_reasons": dict(reasons.most_common()),
        "ood_rows": int(cmp_["ood"].astype(bool).sum()),
        "dtypes": {str(d): int(n) for d, n in cmp_["dtype"].value_counts().items()},
    }
    return summary, cmp_


def _busy_keys(prof, k: pd.DataFrame, lat: pd.Series) -> dict:
    """``kernels`` / ``trace_busy_ms``: every GPU kernel of the trace, compute and NCCL (summed durations), with the
    split: ``compute_busy_ms`` (the kernel rows), ``comm_busy_ms`` (NCCL kernels), ``union_busy_ms`` (time a GPU had
    at least one kernel running: streams overlap, so it is below the sum; kernels only), the ``ProfilerStep#`` GPU
    spans (``step_ms_*``: the GPU events each step launched; ``step_cpu_ms_*``: the CPU-side spans) and the GPU memory
    operations (``copy_events`` / ``copy_ms``, by kind in ``copies``)."""
    from wattcast.data.profiles.busy import merge_busy

    b = merge_busy([f.get("busy") for f in prof.files])
    c = prof.table("collectives")
    compute_ms = float(lat.fillna(0).sum())
    out = {"kernels": int(pd.to_numeric(k["n_kernels"], errors="coerce").fillna(1).sum()),
           "compute_busy_ms": compute_ms, "comm_busy_ms": float(pd.to_numeric(c["time_us"], errors="coerce").fillna(0).sum()) / 1e3,
           "comm_kernels": int(len(c)), "union_busy_ms": None, "overlap_ms": None, "steps": 0, "step_ms_mean": None,
           "step_ms_min": None, "step_ms_max": None}
    if b:
        out.update(kernels=b["compute_kernels"] + b["comm_kernels"], compute_busy_ms=b["compute_busy_ms"],
                   comm_busy_ms=b["comm_busy_ms"], comm_kernels=b["comm_kernels"], union_busy_ms=b["union_busy_ms"],
                   # the union is never above the sum: a negative difference is float rounding (-3.5e-07 ms on
                   # mi250_minitoy_train), clipped at 0
                   overlap_ms=max(0.0, b["compute_busy_ms"] + b["comm_busy_ms"] - b["union_busy_ms"]))
        if b["steps_ms"]:
            st = np.asarray(b["steps_ms"], float)
            out.update(steps=int(len(st)), step_ms_mean=float(st.mean()), step_ms_min=float(st.min()),
                       step_ms_max=float(st.max()))
        if b.get("steps_cpu_ms"):
            sc = np.asarray(b["steps_cpu_ms"], float)
            out.update(step_cpu_ms_min=float(sc.min()), step_cpu_ms_max=float(sc.max()))
        out["steps_without_gpu"] = int(b.get("steps_without_gpu", 0))
        if "copies" in b:
            out.update(copy_events=int(b["copy_events"]), copy_ms=float(b["copy_ms"]), copies=b["copies"])
    out["trace_busy_ms"] = out["compute_busy_ms"] + out["comm_busy_ms"]
    return out


def json_safe(obj):
    """``obj`` with every NaN / infinite float as None (strict JSON: ``null``), numpy scalars as Python numbers."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    return obj


def _predict_with(frame, spec, bundle):
    from wattcast.models.kernel_predictor import predict_kernels as _pk

    return _pk(frame, spec, bundle=bundle)
