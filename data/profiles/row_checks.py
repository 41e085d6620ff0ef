"""The validity checks of a mapped kernel row, shared by the importers and the training reader of profile folders.

They are the checks a user kernel CSV passes (``wattcast.data.kernel_datasets.load_user_kernels``, which
``wattcast kernels`` also applies to its input via ``models/kernel_predictor.py normalise_kernel_frame``): a known op,
a dtype wattcast has a surrogate for (``DTYPE_BYTES``), each shape column the op uses a whole number >= 1 (>= 0 for
``Padding``) and at most ``MAX_SHAPE_DIM`` (2**40), and a measured time that is a finite number > 0 (``>= 0`` with
``zero_time_ok``: a Kineto trace's 1 us resolution records short kernels as 0; they stay mapped and are counted as
"no measured time" where a time is needed). A row that fails is never a training or validation row: the importers
keep it unmapped (``OPName`` '') with ``reason`` ``"invalid <what>: <detail>"``, and the training reader names its
line.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from wattcast.data.kernel_ops import DTYPE_BYTES, MAX_SHAPE_DIM, OP_FAMILY, bad_shape_values, canonical_dtype, required_columns

#: the reason prefixes (``reason_key`` counts a reason by its prefix, before ': ')
INVALID_OP = "invalid op"
INVALID_DTYPE = "invalid dtype"
INVALID_ROW_SHAPE = "invalid shape"
INVALID_TIME = "invalid measured time"


def kernel_row_problems(k: pd.DataFrame, *, zero_time_ok: bool) -> pd.Series:
    """Per row of kernel table ``k`` (``OPName``, shape columns, ``dtype``, ``latency_ms``), '' when it passes or is
    unmapped (``OPName`` ''), else every failed check as ``"invalid <what>: <detail>"`` joined by '; '."""
    out = pd.Series("", index=k.index, dtype=object)
    if k.empty:
        return out
    op = k["OPName"].fillna("").astype(str).str.strip().to_numpy(dtype=object)
    mapped = op != ""
    known = np.isin(op, list(OP_FAMILY))
    dt_raw = k["dtype"].fillna("").astype(str).str.strip() if "dtype" in k else pd.Series("", index=k.index)
    dt = dt_raw.where(dt_raw != "", "fp32").map(canonical_dtype).to_numpy(dtype=object)
    dt_ok = np.isin(dt, list(DTYPE_BYTES))
    lat = pd.to_numeric(k["latency_ms"], errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        lat_ok = np.isfinite(lat) & ((lat >= 0) if zero_time_ok else (lat > 0))
    shapes = {c: pd.to_numeric(k[c], errors="coerce").to_numpy(dtype=float) if c in k else np.full(len(k), np.nan)
              for c in {c for o in set(op[mapped & known]) for c in required_columns(o)}}
    shape_ok = np.ones(len(k), bool)
    for c, v in shapes.items():
        uses = np.array([o in OP_FAMILY and c in required_columns(o) for o in op], dtype=bool)
        with np.errstate(invalid="ignore"):
            shape_ok &= ~uses | (~bad_shape_values(v, c) & (v <= MAX_SHAPE_DIM))
    bad = mapped & (~known | ~dt_ok | ~lat_ok | ~shape_ok)
    for i in np.flatnonzero(bad):
        why = []
        if not known[i]:
            why.append(f"{INVALID_OP}: {op[i]!r} is not a wattcast op")
        if not dt_ok[i]:
            why.append(f"{INVALID_DTYPE}: {dt_raw.iloc[i]!r} is not one of {', '.join(DTYPE_BYTES)} (no surrogate "
                       "for integer / double kernels)")
        if known[i]:
            for c in required_columns(op[i]):
                v = shapes[c][i]
                if not np.isfinite(v):
                    why.append(f"{INVALID_ROW_SHAPE}: {c} is empty or not a number")
                elif bad_shape_values(np.array([v]), c)[0]:
                    why.append(f"{INVALID_ROW_SHAPE}: {c}={v:g} must be a whole number "
                               f"{'>= 0' if c == 'Padding' else '>= 1'}")
                elif v > MAX_SHAPE_DIM:
                    why.append(f"{INVALID_ROW_SHAPE}: {c}={v:.0f} is beyond 2**40 = {MAX_SHAPE_DIM:,} (no real tensor "
                               "dimension is)")
        if not lat_ok[i]:
            x = lat[i]
            why.append(f"{INVALID_TIME}: " + ("latency_ms is missing or not a number" if x != x
                                              else f"latency_ms {x:g} is infinite" if not np.isfinite(x)
                                              else f"latency_ms {x:g} is negative" if x < 0
                                              else "latency_ms 0 (a kernel cannot take no time)"))
        out.iloc[i] = "; ".join(why)
    return out


def unmap_invalid(kdf: pd.DataFrame, problems: pd.Series) -> pd.DataFrame:
    """``kdf`` with the rows ``problems`` names kept unmapped: ``OPName`` '' and ``reason`` the problem."""
    bad = problems != ""
    if bad.any():
        kdf = kdf.copy()
        kdf.loc[bad, "OPName"] = ""
        kdf.loc[bad, "reason"] = problems[bad]
    return kdf


def shown(items: list[str], limit: int = 5) -> str:
    """The first ``limit`` of ``items`` joined by '; ', then '; ... and N more'."""
    more = f"; ... and {len(items) - limit:,} more" if len(items) > limit else ""
    return "; ".join(items[:limit]) + more
