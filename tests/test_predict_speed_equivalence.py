"""The fast prediction path gives the same outputs as the plain one it replaced.

`predict_kernels` predicts each distinct kernel once, builds one feature matrix per family, runs the
MLP in row blocks on one BLAS thread and builds text columns from codes. ``_reference_predict`` below is
the plain row-by-row version (the implementation before those changes, kept here verbatim in spirit):
every non-MLP output must match it exactly; the float32 MLP's result for a row depends on the batch
it is computed in (BLAS blocking and threading change the rounding of its logit by an ulp), so the
predicted times may differ by ~1e-6 relative (measured max 9.6e-7 on 25 catalog devices).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from wattcast.data.catalog import resolve_device
from wattcast.featurize.kernel_features import DEVICE_FEATURES, featurize_kernels
from wattcast.data.kernel_ops import DTYPE_BYTES, MAX_SHAPE_DIM, MAX_TENSOR_BYTES, OP_FAMILY, canonical_dtype, required_columns
from wattcast.models.kernel_bundle import OOD_BAND_FACTOR, SUPPORT_SLACK, load_bundle
from wattcast.models import kernel_predictor as kp
from wattcast.models.kernel_predictor import normalise_kernel_frame, predict_kernels, unknown_dtype_error, unknown_op_error
from wattcast.models.kernel_surrogates import EFF_MAX
from wattcast.models.power_derating import fp32_gemm_floor_ms, spec_fp32_fraction

#: float32 MLP rounding (an ulp of the logit, batch dependent); the measured maximum is 9.6e-7
MLP_RTOL = 1e-5
TIME_COLUMNS = ("pred_latency_ms", "pred_low_ms", "pred_high_ms")
EXACT_COLUMNS = ("ood", "roofline_ms", "model", "ood_reason", "error")


# ------------------------------------------------------------------------------ the plain version
def _reference_normalise(frame: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    df = frame.rename(columns={k: v for k, v in {"OPName": "op", "Kernel_Szie": "Kernel_Size"}.items() if k in frame and v not in frame})
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
    err[~known] = [unknown_op_error(o) for o in op[~known]]
    bad_dtype = ~dtype.isin(list(DTYPE_BYTES)).to_numpy() & (err == "")
    err[bad_dtype] = [unknown_dtype_error(d) for d in dtype[bad_dtype]]
    out = pd.DataFrame({"op": op.to_numpy(), "dtype": dtype.to_numpy()}, index=df.index)
    for ops in pd.unique(op[known]):
        rows = (op == ops).to_numpy() & (err == "")
        for c in required_columns(ops):
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
            for i in np.flatnonzero(rows):  # a shape value beyond 2**40: a typo, refused
                if pd.to_numeric(df[c].iloc[i], errors="coerce") > MAX_SHAPE_DIM:
                    err[i] = (f"implausible value {df[c].iloc[i]!r} in column {c!r}: beyond 2**40 = {MAX_SHAPE_DIM:,} "
                              "(no real tensor dimension is; a typo or another unit?)")
            rows = rows & (err == "")
    for c in ("B", "M", "N", "K", "H", "Input_Channel", "Output_Channel", "Kernel_Size", "Input_Size", "Stride", "Padding"):
        if c in df:
            out[c] = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float)
    for i in np.flatnonzero(err == ""):  # every operand and the result within 1e15 bytes, the first beyond it named
        r = {c: float(out[c].iloc[i]) if c in out else np.nan for c in ("B", "M", "N", "K", "H", "Input_Channel",
                                                                         "Output_Channel", "Kernel_Size", "Input_Size",
                                                                         "Stride", "Padding")}
        fam = OP_FAMILY[op.iloc[i]]
        if fam == "gemm":
            tensors = [("B x M x N", r["B"] * r["M"] * r["N"]), ("B x N x K", r["B"] * r["N"] * r["K"]),
                       ("B x M x K", r["B"] * r["M"] * r["K"])]
        elif fam == "conv":
            o = np.floor((r["Input_Size"] + 2 * r["Padding"] - r["Kernel_Size"]) / (r["Stride"] if r["Stride"] > 0 else 1)) + 1
            tensors = [("B x Input_Channel x Input_Size^2", r["B"] * r["Input_Channel"] * r["Input_Size"] ** 2),
                       ("Output_Channel x Input_Channel x Kernel_Size^2", r["Output_Channel"] * r["Input_Channel"] * r["Kernel_Size"] ** 2),
                       ("B x Output_Channel x output size^2", r["B"] * r["Output_Channel"] * o ** 2)]
        else:
            tensors = [("B x H", r["B"] * r["H"])]
        for what, elems in tensors:
            b = elems * DTYPE_BYTES[dtype.iloc[i]]
            if b > MAX_TENSOR_BYTES:
                err[i] = (f"implausible shape: the {what} tensor holds {b:.3g} bytes, beyond {MAX_TENSOR_BYTES:.0e} "
                          "(1 PB, thousands of times any GPU's memory); check those columns")
                break
    conv = (out["op"] == "conv").to_numpy() & (err == "")
    if conv.any():
        size = out["Input_Size"].to_numpy() + 2 * out["Padding"].to_numpy() - out["Kernel_Size"].to_numpy()
        err[conv & (size < 0)] = "conv kernel larger than the padded input (Kernel_Size > Input_Size + 2 x Padding): no output"
    return out, err


def _reference_mlp(mlp, X: pd.DataFrame) -> np.ndarray:
    z = X[mlp.features].to_numpy(dtype=np.float64)
    z = np.where(np.isnan(z), mlp.fill, z)
    if mlp.clip:
        z = np.clip(z, mlp.lo, mlp.hi)
    z = ((z - mlp.mean) / mlp.std).astype(np.float32)
    for i, (wt, b) in enumerate(mlp.layers):
        z = z @ wt
        z += b
        if i < len(mlp.layers) - 1:
            z *= 1.0 / (1.0 + np.exp(-np.clip(z, -60.0, 60.0)))
    z = z[:, 0].astype(np.float64)
    return -(np.log(EFF_MAX) - np.logaddexp(0.0, -z))


def _reference_family(fm, X: pd.DataFrame, family: str):
    preds = []
    if fm.lgbm is not None and fm.choice in ("lgbm", "ens"):
        preds.append(fm.lgbm.booster.predict(X[fm.features].to_numpy(dtype=np.float64), num_threads=0))
    if fm.mlp is not None and fm.choice in ("mlp", "ens"):
        preds.append(_reference_mlp(fm.mlp, X))
    if not preds:
        p, spread = np.full(len(X), fm.fallback_offset), np.zeros(len(X))
    else:
        stack = np.vstack(preds)
        p = stack.mean(axis=0)
        spread = np.abs(stack[0] - stack[-1]) / 2 if len(stack) > 1 else np.zeros(len(X))
    shape_ood = np.zeros(len(X), dtype=bool)
    dev_ood = np.zeros(len(X), dtype=bool)
    # a device descriptor beyond coverage widens the band by its log distance beyond it (models/coverage.py, stop 58):
    # a rate (bandwidth, peaks) above it the high end only, below it the low end only; watts per TFLOP/s the other way
    # round; clock and base/boost in the log of their ratio to the edge; vendor and memory type by log 2; the rest both
    ext_lo, ext_hi = np.zeros(len(X)), np.zeros(len(X))

    def widen_by(i, f, v, lo_c, hi_c):
        if f in ("dev_is_amd", "dev_is_gddr"):
            below = above = np.log(2.0) if (v < lo_c or v > hi_c) else 0.0
        elif f in ("dev_clock_ghz", "dev_base_over_boost"):
            below = np.log(lo_c / v) if v < lo_c else 0.0
            above = np.log(v / hi_c) if v > hi_c else 0.0
        else:
            below = lo_c - v if v < lo_c else 0.0
            above = v - hi_c if v > hi_c else 0.0
        if f in ("dev_log_bw_gbps", "dev_log_peak_tflops", "dev_log_peak_vec_tflops"):
            side_lo, side_hi = below, above
        elif f == "dev_log_w_per_tflop":
            side_lo, side_hi = above, below
        else:
            side_lo = side_hi = max(below, above)
        ext_lo[i] = max(ext_lo[i], side_lo)
        ext_hi[i] = max(ext_hi[i], side_hi)
    # leave-one-generation-out calibration: device ranges widened by the folds' extrapolation, and for the matmul
    # families checked per dtype class as well (tensor-core rows against the tensor-core training rows, FP32 rows
    # against the FP32 ones); only the device descriptors the family's models read are checked (the vector families
    # less the arithmetic-rate ones: peaks, FLOP per SM-clock; models/kernel_bundle.py checked_device_descriptors)
    matmul = family in ("gemm", "conv")
    logo = fm.logo or {}
    margin = logo.get("margin") or {}
    for f, (lo, hi) in fm.support.items():
        if f not in X or (f in DEVICE_FEATURES and f not in fm.checked_descriptors):
            continue
        v = X[f].to_numpy(dtype=float)
        slack = SUPPORT_SLACK * max(hi - lo, 1e-9) + (margin.get(f, 0.0) if f in DEVICE_FEATURES else 0.0)
        out = (v < lo - slack) | (v > hi + slack)
        if f in DEVICE_FEATURES:
            dev_ood |= out
            for i in np.flatnonzero(out):
                widen_by(i, f, v[i], lo - slack, hi + slack)
        else:
            shape_ood |= out
    tensor = X["is_tensor_dtype"].to_numpy() > 0.5
    for i in range(len(X) if matmul else 0):
        ranges = (logo.get("support_by_dtype_class") or {}).get("tensor" if tensor[i] else "vector", {})
        for f, (lo, hi) in ranges.items():
            if f not in fm.checked_descriptors:
                continue
            v = float(X[f].iloc[i])
            slack = SUPPORT_SLACK * max(hi - lo, 1e-9) + margin.get(f, 0.0)
            if v < lo - slack or v > hi + slack:
                dev_ood[i] = True
                widen_by(i, f, v, lo - slack, hi + slack)
    return p, spread, shape_ood, dev_ood, ext_lo, ext_hi


def _reference_predict(frame: pd.DataFrame, spec, bundle) -> pd.DataFrame:
    """Row by row: a tensor-core ``linear`` (any dtype but fp32) predicted as the bmm of its GEMM (B = 1, B x M rows)
    (an fp32 ``linear`` with B > 1 as the fp32 linear of its B x M rows, since stop 54)
    by :func:`_reference_gemm_predict`, plus its bias epilogue -- B x M x K adds at the row's matrix rate or K bias
    elements at its DRAM bandwidth, whichever is longer -- with its own roofline (stop 52); every other row as
    :func:`_reference_gemm_predict` predicts it."""
    global MAX_SHAPE_DIM
    canon, err = _reference_normalise(frame)
    folded = [i for i in range(len(canon)) if err[i] == "" and canon["op"].iloc[i] == "linear"
              and (canon["dtype"].iloc[i] != "fp32" or float(canon["B"].iloc[i]) != 1)]
    lin = [i for i in folded if canon["dtype"].iloc[i] != "fp32"]
    if not folded:
        return _reference_gemm_predict(frame, spec, bundle)
    g = frame.copy()
    cols = list(g.columns)
    opcol = "op" if "op" in g else "OPName"
    for i in folded:  # an fp32 linear keeps its op, with its B x M rows in M (stop 54)
        b, m = float(canon["B"].iloc[i]), float(canon["M"].iloc[i])
        if i in lin:
            g.iloc[i, cols.index(opcol)] = "bmm"
        g.iloc[i, cols.index("B")] = 1
        g.iloc[i, cols.index("M")] = b * m
    out = _reference_gemm_predict(g, spec, bundle)
    # a GEMM of more than 2**40 rows (B x M of a valid linear) is no input typo: predicted, not refused
    big = [i for i in folded if float(canon["B"].iloc[i]) * float(canon["M"].iloc[i]) > MAX_SHAPE_DIM]
    if big:
        saved, MAX_SHAPE_DIM = MAX_SHAPE_DIM, np.inf
        try:
            res = _reference_gemm_predict(g.iloc[big], spec, bundle)
        finally:
            MAX_SHAPE_DIM = saved
        for c in res.columns.difference(cols, sort=False):
            out.iloc[big, list(out.columns).index(c)] = res[c].to_numpy()
    out[cols] = frame[cols]  # the input's own columns
    if not lin:
        return out
    own = _reference_core(frame.iloc[lin], spec, bundle)["roofline_ms"].to_numpy()
    X = featurize_kernels(canon.iloc[lin], spec)
    roof = out["roofline_ms"].to_numpy(dtype=float).copy()
    times = {c: out[c].to_numpy(dtype=float).copy() for c in ("pred_latency_ms", "pred_low_ms", "pred_high_ms")}
    for j, i in enumerate(lin):
        r = canon.iloc[i]
        flops_per_ms = float(X["flops"].iloc[j]) / float(X["t_compute_ms"].iloc[j])
        bytes_per_ms = float(X["bytes"].iloc[j]) / float(X["t_mem_ms"].iloc[j])
        epilogue = max(r["B"] * r["M"] * r["K"] / flops_per_ms, r["K"] * DTYPE_BYTES[r["dtype"]] / bytes_per_ms)
        for c in times:
            times[c][i] += epilogue
        roof[i] = own[j]
    for c, v in times.items():
        out[c] = v
    out["roofline_ms"] = roof
    return out


def _reference_gemm_predict(frame: pd.DataFrame, spec, bundle) -> pd.DataFrame:
    """Row by row: a tensor-core GEMM's contraction N below one k-tile (128 bytes: 64 bf16/fp16, 128 fp8, 32 tf32
    elements) predicted at the k-tile (its own roofline kept); then, for tensor-core linear layers (linear, or bmm with
    B = 1) with N <= 512, "a longer contraction never takes less time": the same row at N = k-tile x 1, 2, 4, ... from
    the one at or below N up to 512, each as :func:`_reference_m_guarded` predicts it, a running minimum from the top,
    interpolated log-linearly in N between the two around N (band scaled alike)."""
    canon, err = _reference_normalise(frame)
    padded = frame.copy()
    tiles = np.zeros(len(canon))
    raised = []
    for i in range(len(canon)):
        r = canon.iloc[i]
        if err[i] == "" and OP_FAMILY.get(r["op"]) == "elementwise" and float(r["H"]) > 28672:
            # a row wider than the data measure, predicted from its element count as rows of 16,384 (stop 47)
            cols = list(padded.columns)
            padded.iloc[i, cols.index("B")] = float(r["B"]) * float(r["H"]) / 16384
            padded.iloc[i, cols.index("H")] = 16384.0
        if err[i] == "" and OP_FAMILY.get(r["op"]) == "gemm" and r["dtype"] != "fp32":
            tiles[i] = 128 / DTYPE_BYTES[r["dtype"]]
            if float(r["N"]) < tiles[i]:
                padded.iloc[i, list(padded.columns).index("N")] = tiles[i]
                raised.append(i)
    res = _reference_m_guarded(padded, spec, bundle)
    out = frame.copy()  # the input's own columns, unpadded
    for c in res.columns.difference(frame.columns, sort=False):
        out[c] = res[c].to_numpy()
    if raised:
        roof = out["roofline_ms"].to_numpy(dtype=float).copy()
        roof[raised] = _reference_core(frame.iloc[raised], spec, bundle)["roofline_ms"].to_numpy()
        out["roofline_ms"] = roof
    pcanon, _ = _reference_normalise(padded)
    t = out["pred_latency_ms"].to_numpy(dtype=float)
    scale = np.ones(len(t))
    for i in range(len(pcanon)):
        r = pcanon.iloc[i]
        lin = r["op"] == "linear" or (r["op"] == "bmm" and float(r["B"]) == 1)
        if not (err[i] == "" and lin and r["dtype"] != "fp32" and float(r["N"]) <= 512):
            continue
        n, tile = float(r["N"]), tiles[i]
        j0 = int(np.floor(np.log2(n / tile) + 1e-12))
        grid = [dict(r, N=tile * 2.0 ** j) for j in range(j0, int(np.log2(512 / tile)) + 1)]
        g = _reference_m_guarded(pd.DataFrame(grid), spec, bundle)["pred_latency_ms"].to_numpy()
        run = [min(g[k:]) for k in range(len(g))]  # running minimum from the top
        w = min(max(np.log2(n / tile) - j0, 0.0), 1.0)
        hi = min(1, len(run) - 1)
        scale[i] = np.exp((1 - w) * np.log(run[0]) + w * np.log(run[hi])) / t[i]
    for c in ("pred_latency_ms", "pred_low_ms", "pred_high_ms"):
        out[c] = out[c].to_numpy(dtype=float) * scale
    ok = err == ""
    if ok.any():  # an interpolated time at or above the (padded) kernel's physical floor (stop 46)
        _at_floor(out, pcanon, ok, spec)
        # (stop 51) a tensor-core GEMM's band low end, last, on a GPU with a measured matmul ceiling of its own: no
        # faster than its work at 1.09 x that ceiling; never above the prediction
        cm = bundle.families["gemm"].ceiling_member
        own = cm["ceilings"].get(kp._ceiling_name(spec, cm), {}) if cm else {}
        X = featurize_kernels(pcanon[ok], spec)
        low, t = out["pred_low_ms"].to_numpy(dtype=float).copy(), out["pred_latency_ms"].to_numpy(dtype=float)
        for j, i in enumerate(np.flatnonzero(ok)):
            r = pcanon.iloc[i]
            if OP_FAMILY.get(r["op"]) != "gemm":
                continue
            clip = 0.0
            c = own.get(r["dtype"], own.get({"bf16": "fp16", "fp16": "bf16"}.get(r["dtype"], ""))) if r["dtype"] != "fp32" else None
            if c:
                clip = max(clip, X["t_compute_ms"].iloc[j] / min(c * 1.09, 1.0))
            low[i] = max(low[i], min(clip, t[i]))
        out["pred_low_ms"] = low
    return out


def _reference_m_guarded(frame: pd.DataFrame, spec, bundle) -> pd.DataFrame:
    """The plain prediction, then "more rows never take less time", row by row, for tensor-core linear layers (linear,
    or bmm with B = 1) with 1 <= M < 4096: the same row at M = 2**lo, 2**(lo + 1), ... up to 4096 (2**lo the power of
    two at or below M), a running minimum from the top (stop 52; a running maximum from M = 1 before), interpolated
    log-linearly in M between the two around M (band scaled alike)."""
    out = _reference_core(frame, spec, bundle)
    canon, err = _reference_normalise(frame)
    probes, owners = [], []
    for i in range(len(canon)):
        r = canon.iloc[i]
        lin = r["op"] == "linear" or (r["op"] == "bmm" and float(r["B"]) == 1)
        if err[i] == "" and lin and r["dtype"] != "fp32" and 1 <= float(r["M"]) < 4096:
            m = 2.0 ** np.floor(np.log2(float(r["M"])) + 1e-12)
            while m <= 4096:
                probes.append(dict(r, M=float(m)))
                owners.append(i)
                m *= 2
    if probes:
        pp = _reference_core(pd.DataFrame(probes), spec, bundle)["pred_latency_ms"].to_numpy()
        t = out["pred_latency_ms"].to_numpy(dtype=float).copy()
        scale = np.ones(len(t))
        for i in sorted(set(owners)):
            g = [pp[j] for j in range(len(owners)) if owners[j] == i]
            run = [min(g[k:]) for k in range(len(g))]  # running minimum from M = 4096 down
            m = float(canon.iloc[i]["M"])
            lo = np.floor(np.log2(m) + 1e-12)
            w = min(max(np.log2(m) - lo, 0.0), 1.0)
            hi = min(1, len(run) - 1)
            scale[i] = np.exp((1 - w) * np.log(run[0]) + w * np.log(run[hi])) / t[i]
        for c in ("pred_latency_ms", "pred_low_ms", "pred_high_ms"):
            out[c] = out[c].to_numpy(dtype=float) * scale
        # then, as after each guard, the time and the band's low end at or above the row's physical floor
        _at_floor(out, canon, err == "", spec)
    return out


def _at_floor(out: pd.DataFrame, canon: pd.DataFrame, ok: np.ndarray, spec) -> None:
    """In place: the valid rows' (``ok``) time and band low end at or above their physical floor, the high end at or
    above the time (what the predictor does after each guard)."""
    fl = featurize_kernels(canon[ok], spec)["t_floor_ms"].to_numpy()
    for c in ("pred_latency_ms", "pred_low_ms"):
        v = out[c].to_numpy(dtype=float).copy()
        v[ok] = np.maximum(v[ok], fl)
        out[c] = v
    out["pred_high_ms"] = np.maximum(out["pred_high_ms"].to_numpy(dtype=float), out["pred_latency_ms"].to_numpy())


def _reference_core(frame: pd.DataFrame, spec, bundle) -> pd.DataFrame:
    canon, err = _reference_normalise(frame)
    n = len(canon)
    pred, low, high, roof = (np.full(n, np.nan) for _ in range(4))
    ood = np.zeros(n, dtype=bool)
    model = np.full(n, "", dtype=object)
    reason = np.full(n, "", dtype=object)
    ok = err == ""
    if ok.any():
        X = featurize_kernels(canon[ok], spec)
        fam = X["family"].to_numpy()
        t_roof = X["t_roof_ms"].to_numpy()
        k = len(X)
        lr, lo, hi = np.zeros(k), np.zeros(k), np.zeros(k)
        o = np.zeros(k, dtype=bool)
        mname = np.full(k, "", dtype=object)
        why = np.full(k, "", dtype=object)
        for f in pd.unique(fam):
            m = fam == f
            fm = bundle.families.get(f)
            if fm is None:
                lr[m], lo[m], hi[m] = 0.0, -np.log(2.0), np.log(2.0)
                o[m] = True
                mname[m] = "roofline-fallback"
                why[m] = f"no surrogate for family {f!r}"
                continue
            p, spread, shape_ood, dev_ood, ext_lo, ext_hi = _reference_family(fm, X[m], f)
            floor_rows = np.zeros(int(m.sum()), dtype=bool)
            ceiling_rows = np.zeros(int(m.sum()), dtype=bool)
            ceiling = (fm.ceiling_lgbm or {}).get(spec.vendor, (fm.ceiling_lgbm or {}).get("pooled"))
            if fm.floor_lgbm is not None and fm.floor_blend and ceiling is not None:
                # tensor-core GEMMs the blend gives the roofline member any weight: the vendor's ceiling member (else
                # the pooled one), floor + exp(c) x roofline / ceiling (the device's own ceiling in the dtype or its
                # 16-bit twin, else its vendor's median, else the default)
                Xm = X[m]
                cm = fm.ceiling_member
                lo_g, hi_g = fm.floor_blend["gflop"]
                c = ceiling.booster.predict(Xm[ceiling.features].to_numpy(dtype=np.float64), num_threads=0)
                own = cm["ceilings"].get(spec.name, {})
                dts = canon[ok]["dtype"].to_numpy()[m]
                for i in range(len(Xm)):
                    if Xm["is_tensor_dtype"].iloc[i] > 0.5 and float(Xm["flops"].iloc[i]) / 1e9 > lo_g:
                        twin = {"bf16": "fp16", "fp16": "bf16"}.get(dts[i], "")
                        ceil = own.get(dts[i], own.get(twin, cm["vendor_ceilings"].get(spec.vendor, cm["default_ceiling"])))
                        tr = t_roof[m][i]
                        p[i] = np.log((cm["floor_ms"] + np.exp(c[i]) * tr / ceil) / tr)
                        ceiling_rows[i] = True
            if fm.floor_lgbm is not None and fm.floor_blend:
                # small tensor-core GEMMs: the floor member's exp(q) x (roofline + floor) blended in by size, in log
                # space, with weight (log GFLOP - log lo) / (log hi - log lo) clipped to [0, 1] for the roofline member
                Xm = X[m]
                lo_g, hi_g = fm.floor_blend["gflop"]
                floor_ms_src = fm.floor_blend["floors_ms"][fm.floor_blend["source"]]
                q = fm.floor_lgbm.booster.predict(Xm[fm.features].to_numpy(dtype=np.float64), num_threads=0)
                for i in range(len(Xm)):
                    g = float(Xm["flops"].iloc[i]) / 1e9
                    w = min(max((np.log(g) - np.log(lo_g)) / (np.log(hi_g) - np.log(lo_g)), 0.0), 1.0)
                    if Xm["is_tensor_dtype"].iloc[i] > 0.5 and w < 1.0:
                        tr = t_roof[m][i]
                        p[i] = w * p[i] + (1.0 - w) * (q[i] + np.log((tr + floor_ms_src) / tr))
                        floor_rows[i] = True
            oo = shape_ood | dev_ood
            widen = np.where(shape_ood, OOD_BAND_FACTOR, 1.0)  # a shape beyond training; a device: by distance
            band = fm.logo["band_log"] if fm.logo else fm.band_log  # the generation-calibrated band where there is one
            by_class = (fm.logo or {}).get("band_log_by_class") or {}
            tensor_rows = X["is_tensor_dtype"].to_numpy()[m] > 0.5
            band = [np.array([by_class[("tensor" if t else "vector")][j] if ("tensor" if t else "vector") in by_class
                              else band[j] for t in tensor_rows]) for j in (0, 1)]  # the row's dtype class's band
            ext_lo = np.minimum(ext_lo, (OOD_BAND_FACTOR - 1.0) * np.abs(band[0]))  # capped at the flat factor's
            ext_hi = np.minimum(ext_hi, (OOD_BAND_FACTOR - 1.0) * np.abs(band[1]))
            lo_m = p + band[0] * widen - spread - ext_lo
            if fm.latency_floor_ms > 0:  # the measured floor of the row's dtype, applied row by row here
                dts = canon[ok]["dtype"].to_numpy()[m]
                floor_ms = fm.floor_ms([str(d) for d in dts])
                floor = np.log(floor_ms / t_roof[m])
                p, lo_m = np.maximum(p, floor), np.maximum(lo_m, floor)
            if f == "gemm":  # a power-limited board: FP32 GEMMs no faster than the FP32 rate its TDP sustains
                frac = spec_fp32_fraction(spec)
                fp32 = canon[ok]["dtype"].to_numpy()[m] == "fp32"
                if frac < 1.0 and fp32.any():
                    lim = np.log(fp32_gemm_floor_ms(X["flops"].to_numpy()[m], spec.peak_fp32_tflops, frac) / t_roof[m])
                    shift = np.where(fp32, np.maximum(lim - p, 0.0), 0.0)
                    p, lo_m = p + shift, lo_m + shift
            lr[m] = p
            lo[m] = lo_m
            hi[m] = p + band[1] * widen + spread + ext_hi
            o[m] = oo
            mname[m] = np.where(ceiling_rows & floor_rows, "ceiling+floor", np.where(
                ceiling_rows, "ceiling", np.where(floor_rows, f"{fm.choice}+floor",
                                                  fm.choice if fm.choice != "roofline" else "roofline-fallback")))
            why[m] = np.where(shape_ood & dev_ood, "shape+device", np.where(shape_ood, "shape", np.where(dev_ood, "device", "")))
        # neither the prediction nor the band's low end below the kernel's physical floor (stop 46)
        with np.errstate(divide="ignore"):
            fl = np.log(np.where(X["t_floor_ms"].to_numpy() > 0, X["t_floor_ms"].to_numpy(), 0.0) / t_roof)
        lr, lo = np.maximum(lr, fl), np.maximum(lo, fl)
        pred[ok] = t_roof * np.exp(lr)
        low[ok] = t_roof * np.exp(np.minimum(lo, lr))
        high[ok] = t_roof * np.exp(np.maximum(hi, lr))
        roof[ok] = t_roof
        ood[ok] = o
        model[ok] = mname
        reason[ok] = why
    out = frame.copy()
    for c, v in (("pred_latency_ms", pred), ("pred_low_ms", low), ("pred_high_ms", high), ("ood", ood),
                 ("roofline_ms", roof), ("model", model), ("ood_reason", reason), ("error", err)):
        out[c] = v
    return out


# ------------------------------------------------------------------------------ test frames
BAD_ROWS = pd.DataFrame([
    {"OPName": "frobnicate", "B": 8, "H": 128},
    {"OPName": "add", "B": -1, "H": 4},
    {"OPName": "add", "B": 64, "H": 2.5},
    {"OPName": "bmm", "B": 4, "H": 1024},
    {"OPName": "linear", "dtype": "fp64", "B": 1, "M": 64, "N": 64, "K": 64},
    {"OPName": "conv", "B": 1, "Input_Channel": 3, "Output_Channel": 8, "Kernel_Size": 7, "Input_Size": 2, "Stride": 1, "Padding": 0},
])


def _mixed_frame(examples: pd.DataFrame) -> pd.DataFrame:
    """Repeated kernels, kernels far outside the training range, row errors, an extra column, odd index."""
    rng = np.random.default_rng(7)
    n = 1500
    kind = rng.choice(["bmm", "linear", "add", "gelu", "mulu", "ln", "softmax"], size=n)
    gemm = np.isin(kind, ["bmm", "linear"])
    size = lambda: np.round(2.0 ** rng.integers(0, 21, size=n) * rng.choice([1, 3], size=n))  # noqa: E731
    many = pd.DataFrame({
        "OPName": kind,
        "dtype": np.where(gemm, rng.choice(["fp32", "bf16", "float16", " FP16 "], size=n), rng.choice(["fp32", "", None], size=n)),
        "B": size(),
        "M": np.where(gemm, size(), np.nan),
        "N": np.where(gemm, size(), np.nan),
        "K": np.where(gemm, size(), np.nan),
        "H": np.where(gemm, np.nan, size()),
    })
    many = pd.concat([many, many.iloc[:1000]], ignore_index=True)  # exact repeats: predicted once
    df = pd.concat([examples, BAD_ROWS, many, examples], ignore_index=True)
    df["note"] = "x"
    df.index = np.arange(len(df))[::-1] * 3 + 5
    return df


@pytest.fixture(scope="module")
def frames(examples_csv) -> dict[str, pd.DataFrame]:
    ex = pd.read_csv(examples_csv)
    return {
        "examples": ex,  # all distinct: no dedupe
        "examples with errors": pd.concat([BAD_ROWS, ex], ignore_index=True),
        "mixed": _mixed_frame(ex),  # deduped
        "all errors": ex.assign(OPName="nope").iloc[:3],
        "empty": ex.iloc[:0],
    }


def _assert_equivalent(got: pd.DataFrame, ref: pd.DataFrame) -> None:
    assert list(got.columns) == list(ref.columns)
    pd.testing.assert_series_equal(got.dtypes, ref.dtypes)
    assert got.index.equals(ref.index)
    inputs = [c for c in ref.columns if c not in TIME_COLUMNS + EXACT_COLUMNS]
    pd.testing.assert_frame_equal(got[inputs], ref[inputs])
    for c in EXACT_COLUMNS:
        g = got[c]
        if c == "ood_reason":  # its leading value; the named descriptors after it (audit 14) are tested on their own
            g = g.where(g.isna(), g.astype(str).str.split(" (", n=1, regex=False).str[0])
        np.testing.assert_array_equal(g.to_numpy(), ref[c].to_numpy(), err_msg=c)
    for c in TIME_COLUMNS:
        np.testing.assert_allclose(got[c].to_numpy(), ref[c].to_numpy(), rtol=MLP_RTOL, atol=0, equal_nan=True, err_msg=c)


def _without_bf16_gemms(out: pd.DataFrame, frame: pd.DataFrame, spec) -> pd.DataFrame:
    """The reference with its valid bf16 GEMM / conv rows refused on a GPU without BF16 that has a 16-bit path (V100,
    T4: ``predict --dtype bf16`` refuses them alike; stop 48), row by row: no prediction, ``error`` says why."""
    if spec.peak_bf16_tflops or not spec.peak_fp16_tflops:
        return out
    canon, err = _reference_normalise(frame)
    out = out.copy()
    for i in range(len(canon)):
        r = canon.iloc[i]
        if err[i] == "" and r["dtype"] == "bf16" and OP_FAMILY.get(r["op"]) in kp.MATMUL_FAMILIES:
            for c in ("pred_latency_ms", "pred_low_ms", "pred_high_ms", "roofline_ms"):
                out.iloc[i, list(out.columns).index(c)] = np.nan
            for c, v in (("ood", False), ("model", ""), ("ood_reason", ""), ("error", kp.unbf16_gemm_error(spec))):
                out.iloc[i, list(out.columns).index(c)] = v
    return out


# ------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("device", ["H100-SXM5-80GB", "Tesla-T4", "MI300X"])
def test_fast_path_matches_the_plain_one(frames, device):
    spec = resolve_device(device)
    bundle = load_bundle()
    for name, df in frames.items():
        got = predict_kernels(df, spec, bundle=bundle)
        ref = _without_bf16_gemms(_reference_predict(df, spec, bundle), df, spec)
        _assert_equivalent(got, ref)
        if name == "mixed":  # the frame exercises what it should
            assert got["ood"].any() and (~got["ood"]).any()
            implausible = got["error"].str.startswith("implausible")  # its largest GEMMs (B = M = K = 3 x 2**20)
            no_bf16 = got["error"].str.contains("no peak_bf16_tflops", regex=False)  # a GPU without BF16 (stop 48)
            assert implausible.any() and (got["error"][~implausible & ~no_bf16] != "").sum() == 6
            canon, err = normalise_kernel_frame(df)
            assert kp._distinct_rows(canon[err == ""]) is not None


def test_normalise_matches_the_plain_one(frames):
    odd = pd.DataFrame({
        "OPName": ["linear", " BMM ", None, "add", "Softmax", np.nan, "ln", "gelu"],
        "dtype": ["float32", " half ", np.nan, "", "bfloat16", "fp32", "fp64", "torch.float16"],
        "B": ["1", 2, 3, "4.5", 8, 1, 2, "x"],
        "M": [64, 64] + [None] * 6, "N": [64, 64] + [None] * 6, "K": [64, 64] + [None] * 6,
        "H": [None, None, 5, 6, 7, 8, 9, 10],
    })
    for df in [*frames.values(), odd, odd.drop(columns=["dtype"]), frames["examples"].astype(object)]:
        canon, err = normalise_kernel_frame(df)
        ref_canon, ref_err = _reference_normalise(df)
        pd.testing.assert_frame_equal(canon, ref_canon)
        assert err.dtype == ref_err.dtype and list(err) == list(ref_err)


def test_repeated_kernels_get_identical_predictions(frames):
    df = frames["examples"]
    once = predict_kernels(df, "L4")
    many = predict_kernels(pd.concat([df] * 5, ignore_index=True), "L4")
    for k in range(5):
        part = many.iloc[k * len(df) : (k + 1) * len(df)].reset_index(drop=True)
        for c in TIME_COLUMNS + EXACT_COLUMNS:
            np.testing.assert_array_equal(part[c].to_numpy(), many.iloc[: len(df)][c].to_numpy(), err_msg=c)
        for c in TIME_COLUMNS:
            np.testing.assert_allclose(part[c].to_numpy(), once[c].to_numpy(), rtol=MLP_RTOL, err_msg=c)


def test_mlp_forward_leaves_blas_threads_as_they_were(frames):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    before = [d["num_threads"] for d in threadpoolctl.threadpool_info() if d["user_api"] == "blas"]
    predict_kernels(frames["examples"], "A100-SXM4-40GB")
    after = [d["num_threads"] for d in threadpoolctl.threadpool_info() if d["user_api"] == "blas"]
    assert before == after


def test_mlp_weights_round_trip_unchanged():
    bundle = load_bundle()
    fm = next(f for f in bundle.families.values() if f.mlp is not None)
    rebuilt = type(fm.mlp)(fm.mlp.features, fm.mlp.weights())
    for k, v in fm.mlp.weights().items():
        np.testing.assert_array_equal(rebuilt.weights()[k], v, err_msg=k)
