"""Predict kernel latencies for a table of kernels on one device (the `wattcast kernels` engine)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.device_spec import DeviceSpec
from wattcast.featurize.kernel_features import featurize_kernels
from wattcast.featurize.kernel_ops import OP_FAMILY, canonical_dtype, required_columns, DTYPE_BYTES
from wattcast.models.kernel_bundle import OOD_BAND_FACTOR, KernelBundle, load_bundle

#: columns the output adds (the contract of `wattcast kernels`), then wattcast's extras
PRED_COLUMNS = ("pred_latency_ms", "pred_low_ms", "pred_high_ms", "ood")
EXTRA_COLUMNS = ("roofline_ms", "model", "ood_reason", "error")

_COLUMN_ALIASES = {"OPName": "op", "Kernel_Szie": "Kernel_Size"}


def _resolve(device: DeviceSpec | str | Path) -> DeviceSpec:
    if isinstance(device, DeviceSpec):
        return device
    from wattcast.data.catalog import resolve_device

    return resolve_device(device)


def normalise_kernel_frame(frame: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Canonical ``op``/``dtype``/shape columns plus a per-row error message ('' = row is fine)."""
    df = frame.rename(columns={k: v for k, v in _COLUMN_ALIASES.items() if k in frame and v not in frame})
    if "op" not in df:
        raise ValueError("input has no 'OPName' (or 'op') column")
    n = len(df)
    op = df["op"].astype(str).str.strip().str.lower()
    if "dtype" in df:
        raw = df["dtype"]
        blank = raw.isna().to_numpy() | (raw.astype(str).str.strip() == "").to_numpy()
        dtype = pd.Series(np.where(blank, "fp32", raw.astype(str).to_numpy()), index=df.index).map(canonical_dtype)
    else:
        dtype = pd.Series("fp32", index=df.index)
    err = np.full(n, "", dtype=object)
    known = op.isin(list(OP_FAMILY)).to_numpy()
    err[~known] = [f"unknown op {o!r}" for o in op[~known]]
    bad_dtype = ~dtype.isin(list(DTYPE_BYTES)).to_numpy() & (err == "")
    err[bad_dtype] = [f"unknown dtype {d!r}" for d in dtype[bad_dtype]]
    out = pd.DataFrame({"op": op.to_numpy(), "dtype": dtype.to_numpy()}, index=df.index)
    for ops in pd.unique(op[known]):
        cols = required_columns(ops)
        rows = (op == ops).to_numpy() & (err == "")
        for c in cols:
            if c not in df:
                err[rows] = f"missing column {c!r} for op {ops!r}"
                break
            v = pd.to_numeric(df.loc[rows, c], errors="coerce").to_numpy(dtype=float)
            with np.errstate(invalid="ignore"):
                bad = ~np.isfinite(v) | (v < (0 if c == "Padding" else 1)) | (v != np.round(v))
            if bad.any():
                idx = np.flatnonzero(rows)[bad]
                err[idx] = [f"bad value {df[c].iloc[i]!r} in column {c!r} (need a whole number >= {0 if c == 'Padding' else 1})" for i in idx]
                rows = rows & (err == "")
    for c in ("B", "M", "N", "K", "H", "Input_Channel", "Output_Channel", "Kernel_Size", "Input_Size", "Stride", "Padding"):
        if c in df:
            out[c] = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float)
    # a convolution whose kernel does not fit the padded input has no output: say so, do not predict it
    conv = (out["op"] == "conv").to_numpy() & (err == "")
    if conv.any():
        size = out["Input_Size"].to_numpy() + 2 * out["Padding"].to_numpy() - out["Kernel_Size"].to_numpy()
        bad = conv & (size < 0)
        err[bad] = "conv kernel larger than the padded input (Kernel_Size > Input_Size + 2 x Padding): no output"
    return out, err


def predict_kernels(
    frame: pd.DataFrame,
    device: DeviceSpec | str | Path,
    bundle: KernelBundle | str | Path | None = None,
) -> pd.DataFrame:
    """Every input row, plus ``pred_latency_ms``, ``pred_low_ms``, ``pred_high_ms``, ``ood`` and extras.

    Rows that cannot be predicted (unknown op, missing/invalid shape) keep NaN predictions and say why
    in ``error``; the rest of the frame is still predicted.
    """
    spec = _resolve(device)
    if bundle is None or isinstance(bundle, (str, Path)):
        bundle = load_bundle(str(bundle) if bundle else None)
    canon, err = normalise_kernel_frame(frame)
    n = len(canon)
    pred = np.full(n, np.nan)
    low = np.full(n, np.nan)
    high = np.full(n, np.nan)
    roof = np.full(n, np.nan)
    ood = np.zeros(n, dtype=bool)
    model = np.full(n, "", dtype=object)
    reason = np.full(n, "", dtype=object)
    ok = err == ""
    if ok.any():
        sub = canon[ok]
        X = featurize_kernels(sub, spec)
        fam = X["family"].to_numpy()
        t_roof = X["t_roof_ms"].to_numpy()
        lr = np.zeros(len(sub))
        lo = np.zeros(len(sub))
        hi = np.zeros(len(sub))
        o = np.zeros(len(sub), dtype=bool)
        mname = np.full(len(sub), "", dtype=object)
        why = np.full(len(sub), "", dtype=object)
        for f in pd.unique(fam):
            m = fam == f
            fm = bundle.families.get(f)
            if fm is None:
                lr[m], lo[m], hi[m] = 0.0, -np.log(2.0), np.log(2.0)
                o[m] = True
                mname[m] = "roofline-fallback"
                why[m] = f"no surrogate for family {f!r}"
                continue
            Xf = X[m]
            p, spread = fm.predict_log_ratio(Xf)
            shape_ood, dev_ood = fm.ood_mask(Xf)
            oo = shape_ood | dev_ood
            widen = np.where(oo, OOD_BAND_FACTOR, 1.0)
            lr[m] = p
            lo[m] = p + fm.band_log[0] * widen - spread
            hi[m] = p + fm.band_log[1] * widen + spread
            o[m] = oo
            mname[m] = fm.choice if fm.choice != "roofline" else "roofline-fallback"
            why[m] = np.where(shape_ood & dev_ood, "shape+device", np.where(shape_ood, "shape", np.where(dev_ood, "device", "")))
        pred[ok] = t_roof * np.exp(lr)
        low[ok] = t_roof * np.exp(np.minimum(lo, lr))
        high[ok] = t_roof * np.exp(np.maximum(hi, lr))
        roof[ok] = t_roof
        ood[ok] = o
        model[ok] = mname
        reason[ok] = why
    out = frame.copy()
    out["pred_latency_ms"] = pred
    out["pred_low_ms"] = low
    out["pred_high_ms"] = high
    out["ood"] = ood
    out["roofline_ms"] = roof
    out["model"] = model
    out["ood_reason"] = reason
    out["error"] = err
    return out
