"""Fit the GPU-side fixed time of a kernel (simulate/single_device.py GPU_KERNEL_FLOOR_MS) on a profiler trace.

The A100 trace (../shared/datasets/traces/a100_trace_diff_control.json.gz, an A100-SXM4-40GB) is split by shape
(benchmarks/retrain_loop.py split_by_shape: no shape in both halves); the floor is chosen on the fitting half only,
as the one (grid 0-6 us, 0.25 us steps) whose in-step kernel times (simulate.single_device.in_stream_kernel_ms:
max(own time, roofline + floor)) have the lowest MAPE over its elementwise rows. The other half and the V100 trace
(a100_trace_diff_test.json.gz, a Tesla V100-SXM2-16GB despite its name) are only reported. Also printed: the smallest
CUPTI durations per op class, and a least-squares line measured = a + bytes / bandwidth over the fitting half's
elementwise rows (what the floor-plus-roofline form assumes). Prints the grid and the chosen floor (to be typed into
GPU_KERNEL_FLOOR_MS).
Run: python3 benchmarks/fit_gpu_kernel_floor.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from retrain_loop import split_by_shape  # noqa: E402

from wattcast import predict_kernels  # noqa: E402
from wattcast.data.catalog import resolve_device  # noqa: E402
from wattcast.data.kernel_datasets import resolve_data_root  # noqa: E402
from wattcast.data.kernel_ops import REPORT_FAMILY  # noqa: E402
from wattcast.data.profiles.importers import import_files  # noqa: E402
from wattcast.featurize.kernel_features import featurize_kernels  # noqa: E402
from wattcast.models.kernel_predictor import normalise_kernel_frame  # noqa: E402
from wattcast.simulate.single_device import GPU_KERNEL_FLOOR_MS, in_stream_kernel_ms  # noqa: E402
from wattcast.validation.trace_validation import kernel_input_frame  # noqa: E402

TRACES = {"fit": ("a100_trace_diff_control.json.gz", "A100-SXM4-40GB"),
          "check": ("a100_trace_diff_test.json.gz", "V100-SXM2-16GB")}
GRID_US = np.arange(0.0, 6.0 + 1e-9, 0.25)


def trace_rows(name: str, device: str) -> pd.DataFrame:
    """The trace's mapped kernel rows with a measured time, their isolated prediction (``pred``), roofline and bytes."""
    prof = import_files([resolve_data_root() / "traces" / name])
    k = prof.table("kernels")
    lat = pd.to_numeric(k["latency_ms"], errors="coerce")
    rows = k[(k["OPName"].fillna("").astype(str) != "") & (lat > 0)].reset_index(drop=True)
    frame = kernel_input_frame(rows)
    spec = resolve_device(device)
    pred = predict_kernels(frame, spec).assign(dtype=frame["dtype"].to_numpy())
    ok = (pred["error"].fillna("") == "").to_numpy()
    canon, _ = normalise_kernel_frame(frame)
    out = rows.assign(op_class=rows["OPName"].map(REPORT_FAMILY).fillna("other"),
                      meas_ms=pd.to_numeric(rows["latency_ms"]).astype(float),
                      bytes=featurize_kernels(canon, spec)["bytes"].to_numpy(),
                      pred_latency_ms=pred["pred_latency_ms"].to_numpy(), roofline_ms=pred["roofline_ms"].to_numpy(),
                      device=device)
    return out[ok].reset_index(drop=True)


def in_step_ms(rows: pd.DataFrame, floor_ms: float) -> np.ndarray:
    """The in-step kernel times of ``rows`` (one device) with a GPU-side floor of ``floor_ms``."""
    return in_stream_kernel_ms(rows, resolve_device(rows["device"].iloc[0]), gpu_floor_ms=floor_ms)


def errors(rows: pd.DataFrame, pred_ms: np.ndarray) -> str:
    e = (pred_ms - rows["meas_ms"].to_numpy()) / rows["meas_ms"].to_numpy() * 100
    parts = [f"all {np.mean(np.abs(e)):.1f} / {np.mean(e):+.1f}"]
    for c, g in rows.groupby("op_class").groups.items():
        parts.append(f"{c} {np.mean(np.abs(e[g])):.1f} / {np.mean(e[g]):+.1f}")
    return ", ".join(parts)


def main() -> None:
    a = trace_rows(*TRACES["fit"])
    v = trace_rows(*TRACES["check"])
    fit, ev = split_by_shape(a)
    print(f"A100 trace: {len(a):,} rows, fitting half {len(fit):,}, evaluation half {len(ev):,}; V100 trace {len(v):,}")
    for name, r in (("A100", a), ("V100", v)):
        q = r.groupby("op_class")["meas_ms"].quantile([0.0, 0.05, 0.25, 0.5]).unstack() * 1e3
        print(f"\n{name}: measured us, quantiles 0 / 5 / 25 / 50 % per op class\n{q.round(1).to_string()}")
    ew = fit[fit["op_class"] == "elementwise"]
    slope, a_us = np.polyfit(ew["bytes"].to_numpy(), ew["meas_ms"].to_numpy() * 1e3, 1)
    print(f"\nfitting half, elementwise: measured = {a_us:.2f} us + bytes / {1e-3 / slope:.0f} GB/s "
          f"(spec {resolve_device(TRACES['fit'][1]).memory_bandwidth_gbps:.0f} GB/s)")
    grid = []
    for f_us in GRID_US:
        e = (in_step_ms(ew, f_us / 1e3) - ew["meas_ms"].to_numpy()) / ew["meas_ms"].to_numpy()
        grid.append((f_us, np.mean(np.abs(e)) * 100, np.mean(e) * 100))
    g = pd.DataFrame(grid, columns=["floor_us", "mape_pct", "bias_pct"])
    print("\ngrid (fitting half, elementwise rows):\n" + g.round(2).to_string(index=False))
    best = float(g.loc[g["mape_pct"].idxmin(), "floor_us"])
    print(f"\nchosen: {best} us (shipped GPU_KERNEL_FLOOR_MS = {GPU_KERNEL_FLOOR_MS * 1e3:g} us)")
    for label, r in (("A100 fitting half", fit), ("A100 evaluation half", ev), ("V100 trace", v)):
        for f_us in (0.0, best):
            print(f"{label}, floor {f_us} us: MAPE / signed %: {errors(r, in_step_ms(r, f_us / 1e3))}")


if __name__ == "__main__":
    main()
