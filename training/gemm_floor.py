"""The GEMM family's floor member (models/gemm_floor.py), fitted: each measuring source's timing floor, then trees.

Training time only. :func:`fit_source_floors` fits the spec-sheet tile/wave model below to the training rows: a timing
floor per measuring source (XLA's CUPTI kernel times, Vidur's profiles, DeepBench, LLMCompass, NeuSight's CUDA events)
plus a fixed cost per output tile (tensor cores, FP32 vector units), by robust least squares on log time.
:func:`fit_floor_member` then fits LightGBM on ``log(measured / (roofline + the row's source floor))`` over the GEMM
family's features. ``benchmarks/leave_one_generation_out.py`` runs the same functions per held-out generation.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from wattcast.data.device_spec import DeviceSpec, has_matrix_units
from wattcast.data.kernel_datasets import resolve_data_root
from wattcast.data.kernel_ops import DTYPE_BYTES, MATMUL_OUT_BYTES
from wattcast.models.gemm_floor import (FLOOR_BLEND_GFLOP, POOLED_MEMBER, PREDICT_SOURCE, blend_weight,
                                       blended_log_ratio, ceiling_log_ratio, ceiling_model, row_ceilings)
from wattcast.models.kernel_surrogates import LGBMSurrogate

# --- the spec-sheet tile/wave GEMM model ("physical" rows) ---
# A spec-sheet tensor-core GEMM time: output tiles in waves over the SMs, a per-tile fixed cost, a launch floor.
#
#     t_us = t0_us + max(waves x (tile main loop + tile_overhead), memory)
#     tile main loop = 2 tm tn K / (peak / SMs x ceiling)       (one tile's FLOPs at one SM's share of the peak)
#     waves          = ceil(B ceil(M / tm) ceil(N / tn) / SMs)   (NeuSight's wave quantisation)
#
# The tile is the one of :data:`TENSOR_TILES` (or :data:`VECTOR_TILES` for FP32 vector math) that finishes first,
# as a library's heuristic or autotuner would pick. ``ceiling`` is the device's best achievable fraction of its dense peak
# (the MAMF table where it lists the device); ``tile_overhead`` is a fixed number of clock cycles per tile (prologue that
# fills the pipeline, epilogue that writes the tile); ``t0_us`` is the timing floor of the measuring method (a CUPTI
# kernel time, CUDA events around a launch, a profiler range). Fitted on Blackwell's XLA table alone (t0, cycles per
# tile, ceiling) it explains B200 BF16 GEMMs >= 1 GFLOP within ~4% (ceiling 0.74; MAMF lists 0.776). What it found
# (2026-11-25): the fold's fit does not transfer, because the terms that matter are the measuring source's, not the
# GPU's: most XLA GEMMs >= 1 GFLOP take 6-30 us, of which ~5 us is the XLA/CUPTI floor (a 1 us error in it moves B200
# MAPE by 5-15 points), and the per-tile cost fitted on the other sources (Vidur's per-layer profiles: ~6,400 cycles)
# is ~50x the one B200's own XLA rows show (~135). No other NVIDIA GPU is measured through XLA in the visible data.

#: candidate CTA tiles (rows x cols of C) for tensor-core GEMMs: the sizes cuBLAS/CUTLASS/hipBLASLt pick for large
#: problems on Ampere..Blackwell and CDNA; smaller tiles for small problems
TENSOR_TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
#: FP32 SIMT GEMMs (no tensor cores): smaller tiles
VECTOR_TILES = ((128, 128), (128, 64), (64, 128), (64, 64), (32, 64), (64, 32), (32, 32))
#: the memory time's share of the peak bandwidth a streaming kernel reaches
MEMORY_EFFICIENCY = 0.85


def tile_wave_us(b, m, n, k, *, sms, peak_tflops, ceiling, tile_overhead_cycles, clock_mhz, t0_us, mem_bytes,
                 bandwidth_gbps, tensor=True) -> np.ndarray:
    """GEMM time in microseconds from the spec sheet (every argument broadcasts: arrays of rows or scalars)."""
    b, m, n, k = (np.asarray(v, dtype=float) for v in (b, m, n, k))
    sms = np.asarray(sms, dtype=float)
    per_sm_flops_us = np.asarray(peak_tflops, dtype=float) * 1e6 / sms * np.asarray(ceiling, dtype=float)  # FLOP/us
    over_us = np.asarray(tile_overhead_cycles, dtype=float) / np.asarray(clock_mhz, dtype=float)
    best = None
    for tm, tn in (TENSOR_TILES if tensor else VECTOR_TILES):
        tiles = b * np.ceil(m / tm) * np.ceil(n / tn)
        t = np.ceil(tiles / sms) * (2.0 * tm * tn * k / per_sm_flops_us + over_us)
        best = t if best is None else np.minimum(best, t)
    mem_us = np.asarray(mem_bytes, dtype=float) / (np.asarray(bandwidth_gbps, dtype=float) * 1e3 * MEMORY_EFFICIENCY)
    return np.asarray(t0_us, dtype=float) + np.maximum(best, mem_us)

#: matmul ceiling (fraction of the dense tensor peak) for a device and dtype the MAMF table does not list: the median
#: of its bf16 rows (0.74)
DEFAULT_CEILING = 0.74
#: MAMF table name per catalog device (best achievable matmul TFLOP/s; ml-engineering, CC BY-SA 4.0)
MAMF_NAME = {"A100-SXM4-80GB": "NVIDIA A100 SXM", "A100-80GB-unknown": "NVIDIA A100 SXM", "A100-PCIe-40GB": "NVIDIA A100 PCIe",
             "B200": "NVIDIA B200 SXM", "MI355X": "AMD MI355X", "H100-SXM5-80GB": "NVIDIA H100 SXM",
             "MI300X": "AMD MI300X", "B300": "NVIDIA B300 SXM", "GB200": "NVIDIA GB200 SXM"}


def mamf_ratio(root, devices: pd.Series, dtypes: pd.Series, specs: dict) -> np.ndarray:
    """Best achievable matmul TFLOP/s over the device's dense peak for the dtype, where the MAMF table has it."""
    t = pd.read_csv(resolve_data_root(root) / "tensorcore" / "mamf_max_achievable_matmul_tflops.csv")
    t["dtype"] = t["dtype"].map({"bf16": "bf16", "fp8_e4m3fn": "fp8"})
    best = {(r.accelerator, r.dtype): r.mamf_tflops for r in t.itertuples() if np.isfinite(r.mamf_tflops)}
    out = np.full(len(devices), np.nan)
    for i, (d, dt) in enumerate(zip(devices.to_numpy(), dtypes.to_numpy())):
        name = MAMF_NAME.get(d)
        key = (name, "bf16" if dt in ("bf16", "fp16") else dt)
        if name and key in best:
            out[i] = best[key] / specs[d].peak_matrix_tflops(dt)
    return out


def physical_inputs(df: pd.DataFrame, specs: dict, ceil: np.ndarray) -> dict:
    """Per-row spec-sheet inputs of :func:`tile_wave_us`."""
    dev = df["device"].to_numpy()
    dt = df["dtype"].to_numpy()
    spec = [specs[d] for d in dev]
    peak = np.array([s.peak_matrix_tflops(t) for s, t in zip(spec, dt)])
    nbytes = np.array([DTYPE_BYTES[t] for t in dt], dtype=float)
    out_bytes = np.array([MATMUL_OUT_BYTES[t] for t in dt], dtype=float)  # an fp8 GEMM writes bf16
    b, m, n, k = (df[c].fillna(1).to_numpy(dtype=float) for c in ("B", "M", "N", "K"))
    return dict(b=b, m=m, n=n, k=k, sms=np.array([s.num_sms for s in spec], dtype=float), peak_tflops=peak,
                ceiling=ceil, clock_mhz=np.array([s.boost_clock_mhz for s in spec], dtype=float),
                mem_bytes=b * (m * n + n * k) * nbytes + b * m * k * out_bytes,  # N is the contraction: output M x K
                bandwidth_gbps=np.array([s.memory_bandwidth_gbps for s in spec], dtype=float),
                tensor=(dt != "fp32"), source=df["source"].to_numpy())


def physical_us(inp: dict, t0_by_source: dict, over_tensor: float, over_vector: float,
                rows: np.ndarray | None = None) -> np.ndarray:
    sel = slice(None) if rows is None else rows
    a = {k: (v[sel] if isinstance(v, np.ndarray) else v) for k, v in inp.items()}
    t0 = source_floor(a["source"], t0_by_source)
    common = {k: a[k] for k in ("sms", "peak_tflops", "ceiling", "clock_mhz", "mem_bytes", "bandwidth_gbps")}
    tc = tile_wave_us(a["b"], a["m"], a["n"], a["k"], tile_overhead_cycles=over_tensor, t0_us=t0, tensor=True, **common)
    vc = tile_wave_us(a["b"], a["m"], a["n"], a["k"], tile_overhead_cycles=over_vector, t0_us=t0, tensor=False, **common)
    return np.where(a["tensor"], tc, vc)


def fit_physical(inp: dict, y_us: np.ndarray, rows: np.ndarray) -> tuple[dict, float, float]:
    """Launch floor per source and cycles per tile (tensor, vector) by robust least squares on log time."""
    from scipy.optimize import least_squares

    srcs = sorted(set(inp["source"][rows]))

    def unpack(p):
        return dict(zip(srcs, p[:len(srcs)])), p[-2], p[-1]

    def res(p):
        return np.log(physical_us(inp, *unpack(p), rows=rows)) - np.log(y_us[rows])

    p0 = np.r_[np.full(len(srcs), 5.0), 1500.0, 1500.0]
    sol = least_squares(res, p0, bounds=(np.r_[np.zeros(len(srcs)), 0, 0], np.r_[np.full(len(srcs), 100.0), 1e5, 1e5]),
                        loss="soft_l1", f_scale=0.1)
    return unpack(sol.x)


def mamf_ratio_any(root, df: pd.DataFrame, specs: dict) -> np.ndarray:
    """:func:`mamf_ratio` from the first of ``root``'s folders (``--data`` may name several) that has the MAMF table;
    all NaN without one."""
    roots = (list(root) or [None]) if isinstance(root, (list, tuple)) else [root]
    for r in roots:
        try:
            return mamf_ratio(r, df["device"], df["dtype"], specs)
        except OSError:  # no MAMF table there (DataNotFoundError is a FileNotFoundError)
            continue
    return np.full(len(df), np.nan)


def matmul_ceiling(root, df: pd.DataFrame, specs: dict) -> np.ndarray:
    """Per row: the MAMF table's best achievable fraction of the dense peak where it lists the device and dtype,
    :data:`DEFAULT_CEILING` for another tensor dtype, 1 for FP32 (vector peaks); without the table (``root`` None and
    no dataset found) the defaults."""
    return ceiling_from_ratio(mamf_ratio_any(root, df, specs), df["dtype"])


def ceiling_from_ratio(ratio: np.ndarray, dtypes) -> np.ndarray:
    """The matmul ceiling per row from :func:`mamf_ratio` (NaN where the table does not list the device and dtype):
    the ratio where known, :data:`DEFAULT_CEILING` for another tensor dtype, 1 for FP32 (vector peaks)."""
    ratio = np.asarray(ratio, dtype=float)
    return np.where(np.isfinite(ratio), ratio, np.where(np.asarray(dtypes) == "fp32", 1.0, DEFAULT_CEILING)).astype(float)


def fit_source_floors(df: pd.DataFrame, specs: dict[str, DeviceSpec], ceiling: np.ndarray) -> dict[str, float]:
    """The timing floor (ms) of each measuring source of ``df`` (GEMM rows with ``source``, ``latency_ms``)."""
    inp = physical_inputs(df, specs, ceiling)
    floors_us = fit_physical(inp, df["latency_ms"].to_numpy(dtype=float) * 1e3, np.arange(len(df)))[0]
    return {str(s): float(v) / 1e3 for s, v in floors_us.items()}


def source_floor(sources, floors: dict[str, float]) -> np.ndarray:
    """Each row's source floor, in the units of ``floors``; a source without a fitted floor takes the median floor
    (computed once, not per row: this runs in the fit's loop)."""
    median = float(np.median(list(floors.values())))
    return pd.Series(np.asarray(sources)).map(floors).fillna(median).to_numpy(dtype=float)


def floor_reference_ms(t_roof_ms: np.ndarray, sources, floors_ms: dict[str, float]) -> np.ndarray:
    """Roofline plus each row's source floor (a source without a fitted floor takes the median floor)."""
    return np.asarray(t_roof_ms, dtype=float) + source_floor(sources, floors_ms)


def fit_floor_member(rows: pd.DataFrame, X: pd.DataFrame, specs: dict[str, DeviceSpec], features: list[str], *,
                     rounds: int = 400, seed: int = 0, root=None, mamf: np.ndarray | None = None,
                     spec_monotone: bool = False) -> tuple[LGBMSurrogate, dict]:
    """(the floor member's LightGBM, the bundle's ``floor_blend`` entry) from the GEMM family's training ``rows``
    (with ``source``) and their features ``X``. ``mamf``: the rows' :func:`mamf_ratio_any` where the caller has it
    (else read from ``root``). ``spec_monotone``: the opt-in monotone recipe (models/kernel_surrogates.py
    SPEC_MONOTONE)."""
    ceiling = matmul_ceiling(root, rows, specs) if mamf is None else ceiling_from_ratio(mamf, rows["dtype"])
    floors = fit_source_floors(rows, specs, ceiling)
    if PREDICT_SOURCE not in floors:
        raise ValueError(f"the floor member predicts with {PREDICT_SOURCE!r}'s floor, but no training row comes from it "
                         f"(sources: {sorted(floors)})")
    ref = floor_reference_ms(X["t_roof_ms"].to_numpy(), rows["source"].to_numpy(), floors)
    y = np.log(rows["latency_ms"].to_numpy(dtype=float) / ref)
    lg = LGBMSurrogate(features, num_boost_round=rounds, params={"seed": seed}, spec_monotone=spec_monotone).fit(X, y)
    return lg, {"floors_ms": dict(sorted(floors.items())), "source": PREDICT_SOURCE, "gflop": list(FLOOR_BLEND_GFLOP)}


# --- the ceiling member (models/gemm_floor.py, "ceiling member"): vendor by vendor, against each device's ceiling ---

#: a training device's own ceiling where MAMF does not list it: this quantile of its measured efficiency (roofline time
#: over measured) in the dtype. Stop 31: A40 0.83 (Vidur), V100 0.94 and T4 0.97 (DeepBench) where the default says
#: 0.74; on A100 Vidur's own 0.80 against MAMF's 0.87 (the two sources disagree by as much on the same GPU)
CEILING_QUANTILE = 0.99


def ceiling_table(rows: pd.DataFrame, t_roof_ms: np.ndarray, mamf: np.ndarray) -> dict[str, dict[str, float]]:
    """{device: {tensor dtype: ceiling}} of the training ``rows``: MAMF's ratio (``mamf``, per row, NaN where the table
    does not list the device) where listed, else the device's :data:`CEILING_QUANTILE` of its measured efficiency."""
    tensor = (rows["dtype"] != "fp32").to_numpy()
    t = pd.DataFrame({"device": rows["device"].to_numpy(), "dtype": rows["dtype"].to_numpy(),
                      "eff": np.asarray(t_roof_ms, dtype=float) / rows["latency_ms"].to_numpy(dtype=float),
                      "mamf": np.asarray(mamf, dtype=float)})[tensor]
    out: dict[str, dict[str, float]] = {}
    for (dev, dt), g in t.groupby(["device", "dtype"]):
        m = g["mamf"].dropna()
        c = float(m.iloc[0]) if len(m) else float(g["eff"].quantile(CEILING_QUANTILE))
        out.setdefault(str(dev), {})[str(dt)] = round(min(max(c, 0.05), 1.0), 4)
    return out


def vendor_ceilings(table: dict[str, dict[str, float]], specs: dict[str, DeviceSpec]) -> dict[str, float]:
    """The ceiling a device outside ``table`` takes: the median over its vendor's devices in ``table`` that have matrix
    units (:func:`wattcast.data.device_spec.has_matrix_units`; a vector-rate 16-bit ceiling, the P100's 0.47, is no
    tensor-core matmul's), each device once (the median over its dtypes). Until stop 55 every (device, dtype) entry counted, vector-rate devices
    too: B200's three dtypes and the P100 took the shipped NVIDIA median to 0.804 (now 0.8635) and the Ampere fold's
    A40 to 0.769 (benchmarks/leave_one_generation_out.py, Vidur FP16 GEMMs >= 1 GFLOP: 21.3% MAPE / +19.2% bias, 9.0% /
    -2.1% with this rule). A vendor with no such device is left out (the default applies)."""
    by: dict[str, list[float]] = {}
    for dev, per in table.items():
        if per and has_matrix_units(specs[dev]):
            by.setdefault(specs[dev].vendor, []).append(float(np.median(list(per.values()))))
    return {v: round(float(np.median(c)), 4) for v, c in sorted(by.items())}


def per_vendor_sample(devices: np.ndarray, idx: np.ndarray, specs: dict[str, DeviceSpec], max_rows: int,
                      rng: np.random.Generator) -> np.ndarray:
    """The positions ``idx`` (into ``devices``) with each vendor's cut to at most ``max_rows`` (drawn in sorted vendor
    order), sorted: what the ceiling member is fitted on, so a vendor with few rows keeps all of them."""
    vendor = pd.Series(devices[idx]).map({d: specs[d].vendor for d in pd.unique(devices[idx])}).to_numpy()
    out = []
    for v in sorted(set(vendor)):
        iv = idx[vendor == v]
        if len(iv) > max_rows:
            iv = rng.choice(iv, max_rows, replace=False)
        out.append(iv)
    return np.sort(np.concatenate(out)) if out else np.zeros(0, dtype=np.intp)


#: vendors whose long-contraction FP32 GEMM rows the ceiling member leaves out (its own and the pooled one's), and the
#: contraction from which it does: CDNA's FP32 GEMMs lose 40-60% of their rate beyond a 16k contraction (NeuSight
#: linear rows, MI210 1.3 -> 0.8 and MI100 1.36 -> 0.53 x the vector peak; a kernel choice of the FP32 library) where
#: its FP16 ones do not (LLMCompass MI210, 8192 x 32768 x 32768 at 120 TFLOP/s as at 4096), and the trees carried that
#: FP32 collapse to MI300X/MI355X BF16 (4x slower at a 64k contraction: a Llama step's weight gradients). Leaving every
#: FP32 row out instead made the B200 fold's TF32/FP8 GEMMs >= 1 GFLOP 12-15% fast where they are within 9%
#: (leave-one-generation-out, stop 34), and AMD's in-range tensor rows validate worse without the shorter ones.
CEILING_FP32_LEFT_OUT = frozenset({"amd"})
CEILING_FP32_LEFT_OUT_FROM_K = 16384


def fit_ceiling_member(rows: pd.DataFrame, X: pd.DataFrame, specs: dict[str, DeviceSpec], features: list[str],
                       floors_ms: dict[str, float], mamf: np.ndarray, *, rounds: int = 400, seed: int = 0,
                       min_tensor_rows: int = 1000, spec_monotone: bool = False
                       ) -> tuple[dict[str, LGBMSurrogate], dict]:
    """({vendor: LightGBM}, the bundle's ``ceiling_member`` entry) from the GEMM family's training ``rows``.

    Per vendor with at least ``min_tensor_rows`` tensor-core rows, LightGBM on that vendor's rows alone learns
    ``log((measured - source floor) / (roofline / ceiling))``: the time beyond the measuring source's floor, relative
    to what the device's best achievable matmul takes (:func:`ceiling_table`; FP32 rows: ceiling 1, vector peak; a vendor in
    :data:`CEILING_FP32_LEFT_OUT` without its FP32 rows beyond :data:`CEILING_FP32_LEFT_OUT_FROM_K`);
    one more on every vendor's rows (key :data:`POOLED_MEMBER`) for a GPU of a vendor without its own. Each reads
    ``features`` (the entry's ``features``; the shipped bundle's are the family's). ``spec_monotone``: the opt-in
    monotone recipe (models/kernel_surrogates.py SPEC_MONOTONE)."""
    table = ceiling_table(rows, X["t_roof_ms"].to_numpy(), mamf)
    vendor_of = {d: specs[d].vendor for d in rows["device"].unique()}
    vendor = rows["device"].map(vendor_of).to_numpy()
    dt = rows["dtype"].to_numpy()
    ceil = np.array([1.0 if t == "fp32" else table[d][t] for d, t in zip(rows["device"].to_numpy(), dt)])
    ref = X["t_roof_ms"].to_numpy() / ceil
    floor = source_floor(rows["source"].to_numpy(), floors_ms)
    lat = rows["latency_ms"].to_numpy(dtype=float)
    y = np.log(np.maximum(lat - floor, 0.25 * ref) / ref)
    contraction = rows["N"].to_numpy(dtype=float)  # NeuSight naming: N is the contraction
    keep = ~((dt == "fp32") & np.isin(vendor, sorted(CEILING_FP32_LEFT_OUT)) & (contraction > CEILING_FP32_LEFT_OUT_FROM_K))
    models: dict[str, LGBMSurrogate] = {}
    for v in sorted(set(vendor)):
        m = vendor == v
        if (m & (dt != "fp32")).sum() < min_tensor_rows:
            continue
        m &= keep
        models[v] = LGBMSurrogate(features, num_boost_round=rounds, params={"seed": seed},
                                  spec_monotone=spec_monotone).fit(X[m], y[m])
    if not models:
        raise ValueError(f"no vendor has {min_tensor_rows} tensor-core GEMM rows to fit the ceiling member on")
    # every vendor's rows together: the member of a GPU whose vendor has none (models/gemm_floor.py POOLED_MEMBER)
    models[POOLED_MEMBER] = LGBMSurrogate(features, num_boost_round=rounds, params={"seed": seed},
                                          spec_monotone=spec_monotone).fit(X[keep], y[keep])
    entry = {"ceilings": {d: dict(sorted(p.items())) for d, p in sorted(table.items())},
             "vendor_ceilings": vendor_ceilings(table, specs), "default_ceiling": DEFAULT_CEILING,
             "floor_ms": float(floors_ms[PREDICT_SOURCE]), "features": list(features)}
    return models, entry


def mamf_ceilings(root, specs: dict[str, DeviceSpec]) -> dict[str, dict[str, float]]:
    """{device: {dtype: MAMF's best achievable over the dense peak}} for every catalog device of ``specs`` the MAMF
    table lists (bf16's figure stands for fp16): the ceilings a device outside training can still take."""
    devs = [d for d in specs if d in MAMF_NAME]
    if not devs:
        return {}
    pairs = pd.DataFrame([(d, t) for d in devs for t in ("bf16", "fp16", "fp8")], columns=["device", "dtype"])
    r = mamf_ratio_any(root, pairs, specs)
    out: dict[str, dict[str, float]] = {}
    for (d, t), c in zip(pairs.itertuples(index=False), r):
        if np.isfinite(c):
            out.setdefault(d, {})[t] = round(float(min(c, 1.0)), 4)
    return out


def members_log_ratio(p_roof: np.ndarray, X: pd.DataFrame, rows: pd.DataFrame, specs: dict[str, DeviceSpec],
                      floor_lg, floor_blend: dict, ceiling_models: dict, ceiling_entry: dict | None, mamf: np.ndarray,
                      *, ceiling_floor_ms=None, blend_floor_ms=None) -> np.ndarray:
    """The GEMM family's prediction, ``log(t / t_roof)``, from its fitted members on ``rows`` (``device``, ``dtype``),
    as ``models/kernel_predictor.py`` composes them, for GPUs inside or outside training: the roofline member's
    ``p_roof``; tensor-core rows from the floor blend's lower edge up taken by their vendor's ceiling member where
    ``ceiling_models`` has one (the device's ceiling from ``ceiling_entry``, else MAMF's ``mamf`` ratio for the row,
    else its vendor's median); the floor member blended in below the upper edge.

    ``ceiling_floor_ms`` / ``blend_floor_ms``: the floor each member adds (scalar or per row; default: the floor
    predictions use, as the shipped predictor does; a calibration scores a row against its own source's floor)."""
    roof = X["t_roof_ms"].to_numpy(dtype=float)
    w = blend_weight(X["flops"].to_numpy(dtype=float) / 1e9, *floor_blend["gflop"])
    tensor = X["is_tensor_dtype"].to_numpy() > 0.5
    predict_floor = floor_blend["floors_ms"][floor_blend["source"]]
    n = len(X)
    c_floor = np.broadcast_to(np.asarray(predict_floor if ceiling_floor_ms is None else ceiling_floor_ms, float), n)
    b_floor = np.broadcast_to(np.asarray(predict_floor if blend_floor_ms is None else blend_floor_ms, float), n)
    out = np.array(p_roof, dtype=float, copy=True)
    devices, dtypes = rows["device"].to_numpy(), rows["dtype"].to_numpy()
    big = tensor & (w > 0.0)
    for dev in pd.unique(devices[big]):
        vendor = specs[dev].vendor
        model = ceiling_model(ceiling_models, vendor)
        if ceiling_entry is None or model is None:
            continue
        sel = np.flatnonzero(big & (devices == dev))
        own = {str(t): round(min(float(c), 1.0), 4) for t, c in zip(dtypes[sel], mamf[sel]) if np.isfinite(c)}
        entry = dict(ceiling_entry, ceilings={dev: own, **ceiling_entry["ceilings"]})  # a training device keeps its own
        c = row_ceilings(dev, vendor, dtypes[sel], entry)
        out[sel] = ceiling_log_ratio(model.predict(X.iloc[sel]), roof[sel], c_floor[sel], c)
    small = np.flatnonzero(tensor & (w < 1.0))
    if len(small):
        out[small] = blended_log_ratio(out[small], floor_lg.predict(X.iloc[small]), roof[small], b_floor[small],
                                       w[small])
    return out
