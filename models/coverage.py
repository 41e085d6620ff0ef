"""How far a kernel row's GPU lies beyond what the leave-one-generation-out test covered, and how that widens its band.

A family's device-OOD check (``models/kernel_bundle.py`` ``FamilyModel.ood_mask_matrix`` and, for the matmul families,
``dtype_class_support_checks``) flags a row whose device descriptor lies outside the training GPUs' range widened by
the farthest any leave-one-generation-out fold extrapolated that descriptor (``logo.margin``,
``training/generation_calibration.py``). Inside that covered range the band is the folds' own 5-95% residual band.

Until stop 58 an OOD row's band was that band times a flat ``OOD_BAND_FACTOR`` (2): a GPU one hundredth of a log unit
beyond coverage got the same doubling as one ten times beyond it, so the band jumped by a third on a descriptor change
that moved no prediction (audit 58d: a B200 x 1.5 spec's fp8 GEMMs at 1000 W were OOD on watts per TFLOP/s 0.148
against the covered 0.149, the band's top fell 35% at 1010 W with an identical prediction), and a GPU far beyond
coverage got no wider a band than one at its edge.

Here the widening grows with the distance instead: :func:`device_excess_log` is, per row, the largest distance (in
log units of the descriptor's own quantity) by which a checked device descriptor lies beyond the covered range, and
the row's log band becomes ``[low - excess, high + excess]`` (:data:`EXCESS_ELASTICITY` x the excess, on the side
the roofline says the error can go for a rate, :func:`_band_sides`, on both sides for the other descriptors). Zero
at the coverage edge, so the band is continuous in every descriptor.

Why a slope of one (a stated ASSUMPTION, bounded by the roofline, not fitted): the surrogates predict log(measured /
roofline time), and the roofline time t = max(FLOP / peak, bytes / bandwidth) already moves one for one with the
peak and the bandwidth (its elasticity to either is between -1 and 0). A tree ensemble is constant beyond its
training range (LightGBM predicts the leaf of the last split), so beyond coverage the predicted ratio is frozen at its
edge value while the true kernel time's elasticity to the rate still lies between 0 and 1: the frozen ratio can be off
by at most the log distance beyond the edge, in either direction (the kernel gains nothing from the faster part:
the ratio grows by that distance; it gains as the roofline says: the ratio stays). For the descriptors that are no
rate (SM count, L2 size, clock, watts per TFLOP/s) unit elasticity is the same assumption without that bound. The
folds do not measure it: none extrapolated beyond its own margin by construction.

The distance's widening is capped at the flat factor's (``models/kernel_predictor.py``: at most ``OOD_BAND_FACTOR - 1``
times the row's own fold band on each side): uncapped, catalog B200 (its vector kernels 0.77 log units beyond the
bandwidth the folds covered) read a step band of +129% and a 10x spec +927%, and the folds show no error growing with
extrapolation (README, issue 14) to support any of it. So the band is continuous at the edge and grows to the old x2.

A shape-OOD row (a shape feature beyond the training rows) keeps the flat ``OOD_BAND_FACTOR``: nothing here measures
shape extrapolation either, and no shape descriptor has a roofline bound.

Per dtype (:func:`dtype_support_checks`): a tensor-core GEMM row's dtype-dependent descriptors (its peak, ridge point,
watts per TFLOP/s, FLOP per SM-clock) are also checked against the training GPUs that measured that dtype, widened by
the farthest a generation measuring it lay beyond the others (``models/artifacts/kernel_coverage.json``, made by
``python -m wattcast.training.coverage_calibration``): until stop 58 a bf16 query was covered up to the fp8 peaks.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

import numpy as np
import pandas as pd

#: log(measured / predicted) may move by this many log units per log unit a device descriptor lies beyond what the
#: leave-one-generation-out folds covered (see the module docstring: the roofline's elasticity bound, an ASSUMPTION)
EXCESS_ELASTICITY = 1.0
#: device descriptors in linear units (the others are logs, ``dev_log_*``): their distance is taken as the log of the
#: ratio of the value to the covered edge. Binary ones (vendor, memory type) have no distance: a row outside their
#: range gets :data:`BINARY_EXCESS_LOG`.
LINEAR_DESCRIPTORS = frozenset({"dev_clock_ghz", "dev_base_over_boost"})
BINARY_DESCRIPTORS = frozenset({"dev_is_amd", "dev_is_gddr"})
#: the excess of a row outside a binary descriptor's range (a vendor or memory type no training GPU had): log 2, the
#: flat widening every OOD row had before (``OOD_BAND_FACTOR``-sized on a band of +-0.5 log), kept as the stated guess
BINARY_EXCESS_LOG = float(np.log(2.0))


#: the descriptors whose side of the band a distance beyond coverage widens follows from the roofline (see the module
#: docstring): a rate above the covered range (a faster part) can only leave the kernel slower than the frozen ratio
#: says (it gains at most what the roofline gives it), so only the band's high end widens; below it, only the low end.
#: Watts per TFLOP/s alike: a board with less power per FLOP than any covered one runs at most proportionally slower
#: (dynamic power ~ f V^2 falls at least as fast as the clock f: elasticity <= 1), never faster; more power, at most
#: proportionally faster. Every other descriptor (SM count, L2, clock, ridge point: no monotone roofline reading)
#: widens both ends.
RATE_ABOVE_SLOWER = frozenset({"dev_log_bw_gbps", "dev_log_peak_tflops", "dev_log_peak_vec_tflops"})
POWER_BELOW_SLOWER = frozenset({"dev_log_w_per_tflop"})


#: the per-dtype coverage file (training/coverage_calibration.py) and its schema
COVERAGE_FILE = Path(str(files("wattcast.models") / "artifacts" / "kernel_coverage.json"))
COVERAGE_SCHEMA = 1
#: the matmul families whose tensor-core rows are checked per dtype, and the descriptors that depend on the dtype
DTYPE_FAMILIES = ("gemm", "conv")
DTYPE_DESCRIPTORS = ("dev_log_peak_tflops", "dev_log_ridge", "dev_log_w_per_tflop", "dev_log_flops_per_sm_clock")
#: dtypes that run at the same tensor-core rate on every GPU share one coverage entry (an A100's bf16 GEMMs are its
#: fp16 ones: the training sources measured the A100 in fp16, B200 / MI300X / MI355X in bf16)
DTYPE_GROUP = {"bf16": "16-bit", "fp16": "16-bit"}


def dtype_group(dtypes) -> np.ndarray:
    """The coverage key of each dtype (:data:`DTYPE_GROUP`, else the dtype itself)."""
    return pd.Series(np.asarray(dtypes, dtype=object)).map(lambda d: DTYPE_GROUP.get(str(d), str(d))).to_numpy(dtype=object)


@lru_cache(maxsize=4)
def _read_coverage(path: str) -> dict | None:
    p = Path(path)
    if not p.is_file():
        return None
    cov = json.loads(p.read_text(encoding="utf-8"))
    if not isinstance(cov, dict) or cov.get("schema") != COVERAGE_SCHEMA or not isinstance(cov.get("families"), dict):
        raise ValueError(f"{p}: not a kernel coverage file of schema {COVERAGE_SCHEMA} (regenerate it: "
                         "python -m wattcast.training.coverage_calibration)")
    return cov


def dtype_coverage_for(bundle, path: str | Path = COVERAGE_FILE) -> dict | None:
    """The per-dtype coverage (``families``) for ``bundle``: the file's, when it was made for the bundle's training
    GPUs (a bundle retrained on others, or without the file: None, the class check alone)."""
    cov = _read_coverage(str(path))
    if cov is None or sorted(cov.get("train_devices") or []) != sorted(getattr(bundle, "train_devices", []) or []):
        return None
    return cov["families"]


def dtype_support_checks(cov: dict | None, family: str, X: pd.DataFrame, rows, dtypes: np.ndarray, checked) -> list:
    """Per (dtype, descriptor) of ``cov`` (:func:`dtype_coverage_for`) for ``family``'s tensor-core rows ``rows`` of
    ``X`` whose dtype (``dtypes``, per row of ``rows``) has an entry: (dtype, descriptor, rows outside the range
    widened by the slack and the dtype's margin, the values, the widened range's ends), as
    ``FamilyModel.dtype_class_support_checks`` gives them. Only descriptors in ``checked`` (the family's)."""
    from wattcast.models.kernel_bundle import SUPPORT_SLACK

    by = (cov or {}).get(family) or {}
    if not by or "is_tensor_dtype" not in X:
        return []
    idx = slice(None) if rows is None else rows
    tensor = X["is_tensor_dtype"].to_numpy()[idx] > 0.5
    dts = dtype_group(dtypes)
    out = []
    for dt, entry in by.items():
        sel = tensor & (dts == dt)
        if not sel.any():
            continue
        for f, r in entry.items():
            if not isinstance(r, dict) or f not in X or f not in checked:
                continue
            lo, hi = r["range"]
            pad = SUPPORT_SLACK * max(hi - lo, 1e-9) + float(r["margin"])
            v = X[f].to_numpy(dtype=float)[idx]
            out.append((dt, f, sel & ((v < lo - pad) | (v > hi + pad)), v, float(lo - pad), float(hi + pad)))
    return out


def _excess_one(f: str, v: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Per value of descriptor ``f``: how far below ``lo`` and above ``hi`` it lies, in log units (0 inside; NaN -> 0)."""
    if f in BINARY_DESCRIPTORS:
        out = np.where((v < lo) | (v > hi), BINARY_EXCESS_LOG, 0.0)
        return out, out
    with np.errstate(divide="ignore", invalid="ignore"):
        if f in LINEAR_DESCRIPTORS:
            below = np.where(v < lo, np.log(np.maximum(lo, 1e-12) / np.maximum(v, 1e-12)), 0.0)
            above = np.where(v > hi, np.log(np.maximum(v, 1e-12) / np.maximum(hi, 1e-12)), 0.0)
        else:
            below = np.where(v < lo, lo - v, 0.0)
            above = np.where(v > hi, v - hi, 0.0)
    return np.where(np.isfinite(below), below, 0.0), np.where(np.isfinite(above), above, 0.0)


def _band_sides(f: str, below: np.ndarray, above: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(widening of the band's low end, of its high end) from descriptor ``f``'s distances below / above coverage."""
    if f in RATE_ABOVE_SLOWER:
        return below, above
    if f in POWER_BELOW_SLOWER:
        return above, below
    both = np.maximum(below, above)
    return both, both


def device_excess_log(fm, A: np.ndarray, cols: list[str], X: pd.DataFrame, rows, matmul: bool,
                      extra_checks=()) -> tuple[np.ndarray, np.ndarray]:
    """(low-end, high-end) widening per row of a family's rows (``A``: its feature matrix with columns ``cols``;
    ``X``/``rows``: the featurised rows the dtype-class checks read), log units: over the device descriptors the
    family's OOD check looks at, the largest distance beyond the covered range (the pooled range and, for matmul
    families, the row's dtype class's: the bounds the check uses, so a row is device-OOD exactly where one of the two
    is > 0, up to a descriptor whose range is empty), on the side(s) of the band :func:`_band_sides` gives it, times
    :data:`EXCESS_ELASTICITY`. ``extra_checks``: :func:`dtype_support_checks`'s, counted alike."""
    n = len(A)
    lo_w, hi_w = np.zeros(n), np.zeros(n)
    where = {c: j for j, c in enumerate(cols)}

    def add(f, below, above):
        lo_f, hi_f = _band_sides(f, below, above)
        np.maximum(lo_w, lo_f, out=lo_w)
        np.maximum(hi_w, hi_f, out=hi_w)

    for i, f in enumerate(fm._sup_names):
        if not fm._sup_dev[i] or fm._sup_skip[i] or f not in where:
            continue
        add(f, *_excess_one(f, A[:, where[f]], float(fm._sup_lo[i]), float(fm._sup_hi[i])))
    if matmul:
        for _cls, f, bad, v, lo, hi in [*fm.dtype_class_support_checks(X, rows), *extra_checks]:
            if bad.any():
                below, above = _excess_one(f, v, lo, hi)
                add(f, np.where(bad, below, 0.0), np.where(bad, above, 0.0))
    return EXCESS_ELASTICITY * lo_w, EXCESS_ELASTICITY * hi_w
