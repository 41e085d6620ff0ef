"""The GPU-side fixed time of a kernel (``simulate.single_device.GPU_KERNEL_FLOOR_MS``): a kernel in a step's stream
takes at least its roofline time plus it, however few bytes it moves (the A100 trace's CUPTI durations: 3 us for every
elementwise kernel up to 100 KB), separate from the host launch cost a node already pays (max of the two)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from wattcast import predict_kernels
from wattcast.data.catalog import resolve_device
from wattcast.featurize.workload import step_graph
from wattcast.simulate.single_device import (DEFAULT_LAUNCH_OVERHEAD_MS, GPU_KERNEL_FLOOR_MS, cost_nodes,
                                             in_stream_kernel_ms, stream_ms)

SPEC = "A100-SXM4-40GB"


def _pred(frame: pd.DataFrame) -> pd.DataFrame:
    return predict_kernels(frame, resolve_device(SPEC)).assign(dtype=frame["dtype"].to_numpy())


def test_in_stream_kernel_time_never_below_floor_plus_roofline():
    """A 100-element FP32 add (the trace's measures 3 us) was costed at its roofline, ~1 ns; now floor + roofline.
    A large kernel whose own time is above that keeps it."""
    frame = pd.DataFrame({"OPName": ["add", "add", "relu", "linear"], "dtype": ["fp32", "fp32", "fp32", "tf32"],
                          "B": [1, 1024, 4096, 8192], "H": [100, 4096, 8192, np.nan],
                          "M": [np.nan, np.nan, np.nan, 8192], "N": [np.nan, np.nan, np.nan, 8192],
                          "K": [np.nan, np.nan, np.nan, 8192]})
    pred = _pred(frame)
    roof = pred["roofline_ms"].to_numpy(float)
    got = in_stream_kernel_ms(pred, resolve_device(SPEC))
    assert GPU_KERNEL_FLOOR_MS == pytest.approx(0.003)
    assert got[0] == pytest.approx(roof[0] + GPU_KERNEL_FLOOR_MS) and got[0] >= 0.003
    assert np.all(got >= roof + GPU_KERNEL_FLOOR_MS - 1e-12)
    without = in_stream_kernel_ms(pred, resolve_device(SPEC), gpu_floor_ms=0.0)
    assert without[0] == pytest.approx(roof[0])  # the old in-step time: the roofline alone
    assert got[3] == without[3]  # an 8192^3 GEMM is far above floor + roofline


def test_stream_ms_takes_timing_floor_off_fp32_then_adds_gpu_floor():
    lat = np.array([0.020, 0.020, 0.500, np.nan])
    roof = np.array([0.001, 0.001, 0.100, 0.001])
    timing = np.array([0.015, 0.0, 0.015, 0.015])
    got = stream_ms(lat, roof, timing, 2.0, 0.003)
    # FP32: (0.020 - 0.015) * 2 = 0.010 > 0.001 * 2 + 0.003; other dtype: as learned; large: own time; NaN stays NaN
    np.testing.assert_allclose(got[:3], [0.010, 0.040, 0.970])
    assert np.isnan(got[3])
    assert stream_ms(np.array([0.016]), np.array([0.002]), np.array([0.015]), 1.0, 0.003)[0] == pytest.approx(0.005)


def test_step_nodes_gpu_time_gains_at_most_the_floor_and_host_floor_still_hides_tiny_ones():
    g = step_graph("gpt2", mode="train", batch=2, seq=128, dtype="fp32")
    spec = resolve_device(SPEC)
    new = cost_nodes(g, spec)
    old = cost_nodes(g, spec, gpu_floor_ms=0.0)
    d = new["gpu_ms"].to_numpy() - old["gpu_ms"].to_numpy()
    assert np.all(d >= -1e-12) and np.all(d <= GPU_KERNEL_FLOOR_MS + 1e-12)
    assert (d > 1e-6).sum() > 50  # the roofline-bound FP32 elementwise kernels
    learned = new["method"].isin(["surrogate", "proxy"]).to_numpy()
    assert np.all(new["gpu_ms"].to_numpy()[learned] >= GPU_KERNEL_FLOOR_MS - 1e-12)
    # the Megatron presets' composition, a node takes max(GPU time, host floor): where both GPU times are under the host
    # floor, nothing moves
    mx_new, mx_old = (cost_nodes(g, spec, host_model="max", launch_overhead_ms=0.006, **kw) for kw in ({}, {"gpu_floor_ms": 0.0}))
    hidden = new["gpu_ms"].to_numpy() <= 0.006
    np.testing.assert_array_equal(mx_new["time_ms"].to_numpy()[hidden], mx_old["time_ms"].to_numpy()[hidden])
    assert mx_new["time_ms"].sum() > mx_old["time_ms"].sum()
    # eager PyTorch's launch queue (since stop 56; DEFAULT_LAUNCH_OVERHEAD_MS per launch): the step grows, by at most
    # the GPU time added (a kernel issued late hides what its predecessor gained)
    assert DEFAULT_LAUNCH_OVERHEAD_MS == 0.040
    grown = new["time_ms"].sum() - old["time_ms"].sum()
    assert 0 < grown <= d.sum() + 1e-9
