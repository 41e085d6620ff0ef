"""Per-kernel power features: what the latency model knows, put against the roofline and the datasheet.

``kernel_power_features(flops, bytes_, time_ms, dtype, spec)`` is vectorised over kernels (numpy arrays
or scalars; ``dtype`` a string or an array of strings) and returns one row per kernel:

* ``compute_util`` = flops / (time x dtype matrix peak), ``memory_util`` = bytes / (time x DRAM bandwidth),
  both clipped to [0, 1.2] (above 1 only through cache reuse or a peak the datasheet understates);
  a kernel with no time (the zero-time markers of tensor parallelism) gets 0 for both;
* ``roofline_util`` = max of the two (how busy the busier unit is);
* ``dtype_bytes`` and ``tensor`` (the dtype runs on matrix units: fp16/bf16/fp8/tf32 with a native peak);
* device descriptors: ``tdp_w``, ``idle_w`` (the spec's ``idle_power_w``, or :data:`IDLE_FRACTION_OF_TDP`
  x TDP when the datasheet gives none; ``idle_is_default`` says which), ``boost_clock_mhz``,
  ``base_clock_mhz`` (boost when missing), ``process_node_nm`` (NaN when missing).

Unknown dtype names (int8, bool...) are costed against the FP32 peak with 4 bytes, as the roofline
fallback of ``simulate.single_device`` does.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from wattcast.data.device_spec import IDLE_FRACTION_OF_TDP, DeviceSpec, DeviceSpecError, device_idle_w, device_tdp_w  # noqa: F401 (re-exported)
from wattcast.data.kernel_ops import DTYPE_BYTES

#: clip for utilisations: > 1 is possible only through cache reuse or an understated peak
UTIL_CLIP = 1.2
#: dtypes that run on matrix (tensor) units when the device lists a native peak for them
TENSOR_DTYPES = ("fp16", "bf16", "fp8", "tf32")

FEATURE_COLUMNS = (
    "compute_util",
    "memory_util",
    "roofline_util",
    "dtype_bytes",
    "tensor",
    "tdp_w",
    "idle_w",
    "idle_is_default",
    "boost_clock_mhz",
    "base_clock_mhz",
    "process_node_nm",
)


def _dtype_array(dtype, n: int) -> np.ndarray:
    if isinstance(dtype, str) or dtype is None:
        return np.full(n, str(dtype or "fp32").lower(), dtype=object)
    arr = np.asarray(dtype, dtype=object).reshape(-1)
    if arr.size == 1 and n != 1:
        return np.full(n, str(arr[0]).lower(), dtype=object)
    if arr.size != n:
        raise ValueError(f"dtype has {arr.size} entries for {n} kernels")
    codes, uniq = pd.factorize(arr, use_na_sentinel=False)
    if not all(isinstance(u, str) for u in uniq):  # a missing or non-string dtype: each row's own str()
        return np.array([str(d).lower() for d in arr], dtype=object)
    # a handful of distinct dtypes over thousands of kernels: lower-cased once each, then a gather
    return np.array([u.lower() for u in uniq], dtype=object)[codes]


def kernel_power_features(flops, bytes_, time_ms, dtype, spec: DeviceSpec) -> pd.DataFrame:
    """One row of power features per kernel (see the module docstring)."""
    flops = np.atleast_1d(np.asarray(flops, dtype=float)).reshape(-1)
    n = flops.size
    bytes_ = np.broadcast_to(np.asarray(bytes_, dtype=float).reshape(-1) if np.ndim(bytes_) else float(bytes_), (n,))
    time_ms = np.broadcast_to(np.asarray(time_ms, dtype=float).reshape(-1) if np.ndim(time_ms) else float(time_ms), (n,))
    dt = _dtype_array(dtype, n)
    codes, uniq_dt = pd.factorize(dt) if n else (np.zeros(0, np.intp), [])
    known = np.array([d in DTYPE_BYTES for d in uniq_dt], dtype=bool)[codes] if n else np.zeros(0, bool)
    canon = np.where(known, dt, "fp32")

    # one peak per distinct dtype (a handful), then a gather: no Python loop over kernels
    uniq, inv = np.unique(canon.astype(str), return_inverse=True) if n else (np.array([], str), np.zeros(0, int))
    peak_u = np.array([spec.peak_matrix_tflops(u) * 1e12 for u in uniq], dtype=float)
    tensor_u = np.array([u in TENSOR_DTYPES and spec.has_native(u) for u in uniq], dtype=bool)
    bytes_u = np.array([float(DTYPE_BYTES[u]) for u in uniq], dtype=float)
    peak = peak_u[inv] if n else np.zeros(0)

    t_s = time_ms * 1e-3
    ok = np.isfinite(t_s) & (t_s > 0)
    safe_t = np.where(ok, t_s, 1.0)
    bw = float(spec.memory_bandwidth_gbps) * 1e9
    cu = np.where(ok, np.nan_to_num(flops, nan=0.0) / (safe_t * peak), 0.0)
    mu = np.where(ok, np.nan_to_num(bytes_, nan=0.0) / (safe_t * bw), 0.0)
    cu = np.clip(cu, 0.0, UTIL_CLIP)
    mu = np.clip(mu, 0.0, UTIL_CLIP)

    tdp = device_tdp_w(spec)
    idle, idle_default = device_idle_w(spec)
    return pd.DataFrame({
        "compute_util": cu,
        "memory_util": mu,
        "roofline_util": np.maximum(cu, mu),
        "dtype_bytes": bytes_u[inv] if n else np.zeros(0),
        "tensor": tensor_u[inv] if n else np.zeros(0, bool),
        "tdp_w": np.full(n, tdp),
        "idle_w": np.full(n, idle),
        "idle_is_default": np.full(n, idle_default),
        "boost_clock_mhz": np.full(n, float(spec.boost_clock_mhz)),
        "base_clock_mhz": np.full(n, float(spec.base_clock_mhz or spec.boost_clock_mhz)),
        "process_node_nm": np.full(n, float(spec.process_node_nm) if spec.process_node_nm else np.nan),
    })
