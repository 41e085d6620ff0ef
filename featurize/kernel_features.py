"""Per-kernel features: work, traffic, roofline times, tile/wave shape, cache fit, device descriptors.

Everything is vectorised over rows. ``featurize_kernels(frame, device)`` takes the unified kernel
table (op, dtype, NeuSight shape columns) and either one :class:`DeviceSpec` for every row or a
mapping from the frame's ``device`` column to specs.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from wattcast.data.catalog_match import twin_base_clock
from wattcast.data.device_spec import DeviceSpec
from wattcast.data.kernel_ops import (
    BINARY_OPS,
    DTYPE_BYTES,
    FLOPS_PER_ELEMENT,
    MATMUL_OUT_BYTES,
    OP_FAMILY,
    SHAPE_COLS,
)

#: GEMM tile shapes (rows x cols of the output) that cuBLAS/rocBLAS kernels commonly use
TILES = ((32, 32), (64, 64), (128, 64), (128, 128), (256, 128))

#: bytes moved per SM per clock between L2 and the SMs; a proxy for L2 bandwidth, which datasheets omit
_L2_BYTES_PER_SM_CLOCK = 64.0

#: AMD CDNA 3 and 4 GPUs put a 256 MB Infinity Cache (memory-attached last-level cache) between their L2 and HBM
#: (AMD CDNA 3 architecture white paper: "256 MB AMD Infinity Cache" on MI300X; CDNA 4 white paper: 256 MB on
#: MI350X/MI355X), which a spec's ``l2_cache_mb`` does not count (data/devices/MI300X.yaml says so). The physical floor
#: (:func:`physical_floor_ms`) lets every AMD GPU keep that much of a working set out of DRAM: an MI250X (no Infinity
#: Cache) gets a lower floor than it could, never a higher one.
AMD_LAST_LEVEL_CACHE_MB = 256.0

#: the version of the kernel features this featurizer computes (:func:`featurize_kernels` with data.kernel_ops), stamped
#: in a trained bundle's manifest (``feature_version``, training/kernels.py) and checked at load (models/kernel_bundle.py
#: warns when a bundle's differs or is absent): bump it with any change that alters the features of the same kernel
#: row. 2: an fp8 GEMM's output counted at 2 bytes (data.kernel_ops.MATMUL_OUT_BYTES, commit 8fbd5de); bundles
#: without the stamp were trained before versions were recorded (1 and earlier). Not bumped at stop 51 for a missing
#: base clock taken from the compute twin (:func:`_base_clock_mhz`): no GPU the shipped bundle trained on (or any
#: shared-data GPU but the withheld H200) gains one, so its rows featurize as before (tests/test_base_clock_twin.py)
FEATURE_VERSION = 2

DEVICE_FEATURES = (
    "dev_log_sms",
    "dev_log_bw_gbps",
    "dev_log_peak_vec_tflops",
    "dev_log_peak_tflops",
    "dev_log_l2_mb",
    "dev_clock_ghz",
    "dev_is_amd",
    "dev_log_ridge",
    "dev_log_l2bw_over_dram",
    "dev_log_flops_per_sm_clock",
    "dev_base_over_boost",
    "dev_log_w_per_tflop",
    "dev_log_mem_gb",
)

_BASE = (
    "log_flops",
    "log_bytes",
    "log_intensity",
    "log_intensity_over_ridge",
    "log_t_compute_ms",
    "log_t_mem_ms",
    "log_t_roof_ms",
    "log_ws_over_l2",
    "dtype_bytes",
    "is_tensor_dtype",
)

GEMM_FEATURES = _BASE + DEVICE_FEATURES + (
    "log_B", "log_M", "log_N", "log_K", "log_out_elems", "log_M_over_K", "log_N_over_MK",
    "is_linear",
    *[f"wave_eff_{a}x{b}" for a, b in TILES],
    *[f"log_waves_{a}x{b}" for a, b in TILES],
    "log_tiles_128x128_per_sm",
    "log_k_iters_per_tile",
)

CONV_FEATURES = GEMM_FEATURES + ("log_kernel_size", "log_stride", "log_out_size", "log_in_channels")

VEC_FEATURES = _BASE + DEVICE_FEATURES + (
    "log_B", "log_H", "log_numel", "log_numel_per_sm", "log_rows_per_sm", "row_wave_eff",
    "log_row_bytes", "is_binary", "flops_per_element", "log_elem_waves",
)

FEATURES_BY_FAMILY = {
    "gemm": GEMM_FEATURES,
    "conv": CONV_FEATURES,
    "elementwise": VEC_FEATURES,
    "ln": VEC_FEATURES,
    "softmax": VEC_FEATURES,
}


def _log(x) -> np.ndarray:
    return np.log(np.maximum(np.asarray(x, dtype=float), 1e-30))


def device_table(specs: Mapping[str, DeviceSpec]) -> pd.DataFrame:
    """One row per device with the numbers features need (index = device key given)."""
    rows = {}
    for key, s in specs.items():
        rows[key] = {
            "sms": float(s.num_sms),
            "bw_gbps": float(s.memory_bandwidth_gbps),
            "peak_vec_tflops": float(s.peak_fp32_tflops),
            "l2_mb": float(s.l2_cache_mb),
            "clock_mhz": float(s.boost_clock_mhz),
            "is_amd": float(s.vendor == "amd"),
            # the cache a working set can stay in instead of DRAM (physical_floor_ms)
            "llc_mb": max(float(s.l2_cache_mb), AMD_LAST_LEVEL_CACHE_MB if s.vendor == "amd" else 0.0),
            # NaN when the sheet lacks them: LightGBM routes NaN, the MLP imputes; a missing base clock is first
            # taken from the catalog devices with the same compute silicon (data.catalog_match.twin_base_clock:
            # the H200 the H100 SXM5's), which no training GPU has (its training features are as they were)
            "base_clock_mhz": _base_clock_mhz(s),
            "tdp_w": float(s.tdp_w) if s.tdp_w else np.nan,
            "mem_gb": float(s.memory_gb),
            "is_gddr": _is_gddr(s.memory_type),
            **{f"peak_{d}": s.peak_matrix_tflops(d) for d in DTYPE_BYTES},
            **{f"native_{d}": float(s.has_native(d)) for d in DTYPE_BYTES},
        }
    return pd.DataFrame.from_dict(rows, orient="index")


def _base_clock_mhz(s: DeviceSpec) -> float:
    """The spec's base clock (MHz), else its compute twin's (:func:`wattcast.data.catalog_match.twin_base_clock`;
    the spec's warnings say so: data.device_spec.base_clock_notes), else NaN."""
    if s.base_clock_mhz:
        return float(s.base_clock_mhz)
    twin = twin_base_clock(s)
    return twin[0] if twin else np.nan


def _is_gddr(memory_type: str | None) -> float:
    """1 for GDDR memory, 0 for HBM (or other stacked/on-package memory), NaN when the sheet does not say.

    Streaming kernels reach a different fraction of the datasheet bandwidth on the two: ~75-80% on the GDDR5/6
    training GPUs (P4, T4) for elementwise, softmax and LayerNorm alike, 85-93% on HBM2 V100/A100."""
    if not memory_type:
        return np.nan
    return 1.0 if "GDDR" in memory_type.upper() else 0.0


def _wave_eff(tiles: np.ndarray, sms: np.ndarray) -> np.ndarray:
    waves = np.ceil(tiles / sms)
    return tiles / np.maximum(waves * sms, 1.0)


def featurize_kernels(frame: pd.DataFrame, device: DeviceSpec | Mapping[str, DeviceSpec]) -> pd.DataFrame:
    """Return a feature frame aligned with ``frame`` (same index).

    ``frame`` needs ``op``, ``dtype`` and the shape columns of its ops (missing ones are NaN).
    Besides the model features it carries ``family``, ``flops``, ``bytes`` and ``t_roof_ms``
    (the roofline time: max of compute and memory time) used as the prediction baseline.
    """
    n = len(frame)
    # look-ups run once per distinct op/dtype (pd.factorize hashes), not once per row
    op_codes, op_names = pd.factorize(frame["op"].astype(str))
    op_names = np.asarray(op_names, dtype=object)
    unknown = [o for o in op_names if o not in OP_FAMILY]
    if unknown:
        raise ValueError(f"unknown op(s) {sorted(unknown)}; known: {sorted(OP_FAMILY)}")
    fam = np.array([OP_FAMILY[o] for o in op_names], dtype=object)[op_codes]
    if "dtype" in frame:
        dt_codes, dt_names = pd.factorize(frame["dtype"].astype(str))
        dt_names = np.asarray(dt_names, dtype=object)
    else:
        dt_codes, dt_names = np.zeros(n, dtype=int), np.array(["fp32"], dtype=object)
    bad_dt = [d for d in dt_names if d not in DTYPE_BYTES]
    if bad_dt:
        raise ValueError(f"unknown dtype(s) {sorted(bad_dt)}; known: {sorted(DTYPE_BYTES)}")
    dtype = dt_names[dt_codes] if n else np.array([], dtype=object)

    def per_op(table: dict, default: float) -> np.ndarray:
        return np.array([float(table.get(o, default)) for o in op_names], dtype=float)[op_codes] if n else np.zeros(0)

    if isinstance(device, DeviceSpec):
        table = device_table({device.name: device})
        dev_idx = np.zeros(n, dtype=int)
    else:
        table = device_table(device)
        names = frame["device"].astype(str)
        missing = sorted(set(names) - set(table.index))
        if missing:
            raise ValueError(f"no device spec for {missing}")
        dev_idx = table.index.get_indexer(names)
    D = {c: table[c].to_numpy()[dev_idx] for c in table.columns}

    g = {c: (frame[c].to_numpy(dtype=float) if c in frame else np.full(n, np.nan)) for c in SHAPE_COLS}
    ebytes = np.array([float(DTYPE_BYTES[d]) for d in dt_names])[dt_codes] if n else np.zeros(0)
    obytes = np.array([float(MATMUL_OUT_BYTES[d]) for d in dt_names])[dt_codes] if n else np.zeros(0)  # matmul output

    peak_mat = np.zeros(n)
    native = np.zeros(n)
    for i, d in enumerate(dt_names):
        m = dt_codes == i
        peak_mat[m] = D[f"peak_{d}"][m]
        native[m] = D[f"native_{d}"][m]
    sms, bw, peak_vec, l2_mb, clock = D["sms"], D["bw_gbps"], D["peak_vec_tflops"], D["l2_mb"], D["clock_mhz"]

    is_gemm = fam == "gemm"
    is_conv = fam == "conv"
    is_vec = ~(is_gemm | is_conv)
    is_linear = per_op({"linear": 1.0}, 0.0) > 0

    # ---- GEMM view (conv as implicit GEMM: rows = B*out^2, contraction = Cin*k^2, cols = Cout)
    B, M, N, K, H = g["B"], g["M"], g["N"], g["K"], g["H"]
    cin, cout, ks, s_in, stride, pad = (g[c] for c in ("Input_Channel", "Output_Channel", "Kernel_Size", "Input_Size", "Stride", "Padding"))
    out_size = np.floor((s_in + 2 * pad - ks) / np.where(stride > 0, stride, 1)) + 1
    gB = np.where(is_conv, 1.0, B)
    gM = np.where(is_conv, B * out_size**2, M)
    gN = np.where(is_conv, cin * ks**2, N)
    gK = np.where(is_conv, cout, K)

    flops = np.zeros(n)
    bytes_ = np.zeros(n)
    mm = is_gemm | is_conv
    flops[mm] = 2.0 * (gB * gM * gN * gK)[mm] + np.where(is_linear, B * M * K, 0.0)[mm]
    gemm_bytes = (B * M * N + np.where(is_linear, N * K + K, B * N * K)) * ebytes + B * M * K * obytes
    conv_bytes = (B * cin * s_in**2 + cout * cin * ks**2) * ebytes + B * cout * out_size**2 * obytes
    bytes_[is_gemm] = gemm_bytes[is_gemm]
    bytes_[is_conv] = conv_bytes[is_conv]
    numel = B * H
    fpe = per_op(FLOPS_PER_ELEMENT, 1.0)
    is_binary = per_op(dict.fromkeys(BINARY_OPS, 1.0), 0.0) > 0
    flops[is_vec] = (numel * fpe)[is_vec]
    # silu_mul reads a (B, 2H) gate+up tensor: the same 3 x B x H traffic as a binary op
    vec_bytes = numel * ebytes * np.where(is_binary, 3.0, 2.0) + np.where(per_op({"ln": 1.0, "rmsnorm": 1.0}, 0.0) > 0, 2 * H * ebytes, 0.0)
    bytes_[is_vec] = vec_bytes[is_vec]

    peak_flops = np.where(mm, peak_mat, peak_vec) * 1e12
    t_compute_ms = flops / peak_flops * 1e3
    t_mem_ms = bytes_ / (bw * 1e9) * 1e3
    t_roof_ms = np.maximum(t_compute_ms, t_mem_ms)
    ridge = peak_flops / (bw * 1e9)
    intensity = flops / np.maximum(bytes_, 1.0)
    l2bw_gbps = sms * clock * 1e6 * _L2_BYTES_PER_SM_CLOCK / 1e9

    F: dict[str, np.ndarray] = {
        "log_flops": _log(flops + 1),
        "log_bytes": _log(bytes_),
        "log_intensity": _log(intensity),
        "log_intensity_over_ridge": _log(intensity / ridge),
        "log_t_compute_ms": _log(t_compute_ms),
        "log_t_mem_ms": _log(t_mem_ms),
        "log_t_roof_ms": _log(t_roof_ms),
        "log_ws_over_l2": _log(bytes_ / (l2_mb * 1e6)),
        "dtype_bytes": ebytes,
        "is_tensor_dtype": ((dtype != "fp32") & (native > 0)).astype(float),
        "dev_log_sms": _log(sms),
        "dev_log_bw_gbps": _log(bw),
        "dev_log_peak_vec_tflops": _log(peak_vec),
        "dev_log_peak_tflops": _log(peak_flops / 1e12),
        "dev_log_l2_mb": _log(l2_mb),
        "dev_clock_ghz": clock / 1e3,
        "dev_is_amd": D["is_amd"],
        "dev_log_ridge": _log(ridge),
        "dev_log_l2bw_over_dram": _log(l2bw_gbps / bw),
        "dev_log_flops_per_sm_clock": _log(peak_flops / (sms * clock * 1e6)),
        # power-starved designs (low base clock, few watts per TFLOP) sustain far less than boost peak
        "dev_base_over_boost": D["base_clock_mhz"] / clock,
        "dev_log_w_per_tflop": np.log(D["tdp_w"] / (peak_flops / 1e12)),
        "dev_log_mem_gb": _log(D["mem_gb"]),
        "dev_is_gddr": D["is_gddr"],
        "log_B": _log(np.where(is_conv, B, np.where(is_vec, B, gB))),
        "log_M": _log(gM),
        "log_N": _log(gN),
        "log_K": _log(gK),
        "log_H": _log(H),
        "log_out_elems": _log(gB * gM * gK),
        "log_M_over_K": _log(gM / gK),
        "log_N_over_MK": _log(gN / np.sqrt(gM * gK)),
        "is_linear": is_linear.astype(float),
        "log_kernel_size": _log(ks),
        "log_stride": _log(stride),
        "log_out_size": _log(out_size),
        "log_in_channels": _log(cin),
    }
    for a, b in TILES:
        tiles = gB * np.ceil(gM / a) * np.ceil(gK / b)
        F[f"wave_eff_{a}x{b}"] = _wave_eff(tiles, sms)
        F[f"log_waves_{a}x{b}"] = _log(tiles / sms)
    F["log_tiles_128x128_per_sm"] = _log(gB * np.ceil(gM / 128) * np.ceil(gK / 128) / sms)
    F["log_k_iters_per_tile"] = _log(np.ceil(gN / 32))

    # vector ops: elementwise kernels stride over numel; ln/softmax give one row (or a few) per block
    F["log_numel"] = _log(numel)
    F["log_numel_per_sm"] = _log(numel / sms)
    F["log_rows_per_sm"] = _log(B / sms)
    F["row_wave_eff"] = _wave_eff(np.maximum(B, 1.0), sms)
    F["log_row_bytes"] = _log(H * ebytes)
    F["is_binary"] = is_binary.astype(float)
    F["flops_per_element"] = fpe
    F["log_elem_waves"] = _log(np.ceil(numel / 512.0) / (sms * 16.0))

    out = pd.DataFrame(F, index=frame.index)
    out["family"] = fam
    out["flops"] = flops
    out["bytes"] = bytes_
    out["t_compute_ms"] = t_compute_ms
    out["t_mem_ms"] = t_mem_ms
    out["t_roof_ms"] = t_roof_ms
    dense_flops = np.where(is_gemm, 2.0 * gB * gM * gN * gK, 0.0)
    # the least a kernel reads and writes: a GEMM its operands (and bias) and its output; a conv its weights and its
    # output (a stride beyond the kernel skips input pixels, and Winograd/FFT need not do the GEMM view's FLOPs); a
    # vector op its output alone: its inputs may be broadcast views (NeuSight's label graphs run an add at 349 GB/s on
    # the 300 GB/s L4 counted with two full inputs, and OPT-13B's mask `sub` (a scalar op on an expanded mask) 4-14%
    # faster than reading and writing a full tensor on T4 and V100 allows)
    read_bytes = np.where(is_gemm, gemm_bytes - B * M * K * obytes, np.where(is_conv, cout * cin * ks**2 * ebytes, 0.0))
    write_bytes = np.where(is_conv, B * cout * out_size**2 * obytes, np.where(is_gemm, B * M * K * obytes, numel * ebytes))
    out["t_floor_ms"] = physical_floor_ms(dense_flops, peak_mat * 1e12, read_bytes, write_bytes, D["llc_mb"] * 1e6,
                                          bw * 1e9)
    return out


def physical_floor_ms(dense_flops, peak_flops_s, read_bytes, write_bytes, cache_bytes, dram_bytes_s) -> np.ndarray:
    """The time no kernel can beat (ms): its matrix work at the dtype's dense peak, or the bytes that cannot have
    stayed in the last-level cache crossing DRAM at the datasheet bandwidth, whichever is longer.

    ``dense_flops`` is a GEMM's 2 x B x M x N x K (0 for other kernels: a conv may run Winograd/FFT with fewer
    multiplications, and a vector op's FLOPs per element are a convention, not a count of instructions).
    ``read_bytes`` / ``write_bytes`` are the least the kernel reads and writes. However warm the cache, at most
    ``cache_bytes`` of what it reads can be resident when it starts, and at most ``cache_bytes`` of what it writes can
    still be held dirty when it ends, so at least ``read - cache`` and ``write - cache`` bytes cross DRAM. That is
    conservative against the usual "a working set beyond the cache streams all of it" (a kernel timed back to back
    finds operands resident: L4's label nodes run elementwise kernels faster than their DRAM roofline, README), and
    the bound has no step at the cache size."""
    compute_ms = np.asarray(dense_flops, dtype=float) / peak_flops_s * 1e3
    dram_bytes = (np.maximum(np.asarray(read_bytes, dtype=float) - cache_bytes, 0.0)
                  + np.maximum(np.asarray(write_bytes, dtype=float) - cache_bytes, 0.0))
    return np.maximum(compute_ms, dram_bytes / dram_bytes_s * 1e3)
