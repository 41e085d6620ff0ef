"""Power-limited FP32 GEMMs: a GPU whose board power cannot feed its CUDA cores at boost clock runs them slower.

A dense FP32 (vector, no tensor cores) GEMM keeps every FP32 lane busy; the power it needs grows with the FLOP rate.
A board whose TDP per peak FP32 TFLOP/s is below what its process node needs to run the lanes at boost clock
sustains only the fraction its power buys (the clock drops toward base clock, as NVML reports on T4 and L4):

    sustained fraction = min(1, (TDP / peak FP32 TFLOP/s) / W_needed(node)),  W_needed(node) = W12 x (node / 12 nm)^alpha

``W12`` and ``alpha`` are fitted by :mod:`wattcast.training.power_derating` on the training GPUs' FP32 GEMMs >= 2
GFLOP (the 90th-percentile achieved fraction of peak per GPU): T4 (12 nm, 8.6 W per TFLOP/s) and P4 (16 nm, 13.2) are
power-limited, V100, P100 and A100 40 GB are not and bound the fit from the other side. The project's held-out GPUs
take no part in the fit. Tensor-core math uses far less energy per FLOP and has no power-limited training GPU: the cap
is applied to FP32 vector GEMMs only, and on NVIDIA GPUs only (the vendor it was fitted on: AMD's CDNA FP32 peaks
count packed/matrix FP32 and its GEMMs exceed the vector peak, so its W per TFLOP/s does not mean the same).
"""

from __future__ import annotations

import numpy as np

#: watts per peak FP32 TFLOP/s a 12 nm GPU needs to run its FP32 lanes at boost clock (fit: training/power_derating.py)
W_NEEDED_12NM = 14.5
#: process-node exponent of that need (energy per FLOP falls with the node; fit as above)
NODE_EXPONENT = 0.81
#: the best fraction of the FP32 peak a GEMM reaches on a GPU that is not power-limited (90th percentile of V100,
#: P100, A100 40 GB FP32 GEMMs >= 2 GFLOP; fit as above)
UNLIMITED_EFFICIENCY = 0.83


def w_needed_per_tflop(node_nm: float, w12: float = W_NEEDED_12NM, alpha: float = NODE_EXPONENT) -> float:
    """Board watts per peak FP32 TFLOP/s that running the lanes at boost clock takes on ``node_nm``."""
    return float(w12) * (float(node_nm) / 12.0) ** float(alpha)


def sustained_fp32_fraction(tdp_w: float | None, peak_fp32_tflops: float, node_nm: float | None, *,
                            w12: float = W_NEEDED_12NM, alpha: float = NODE_EXPONENT) -> float:
    """The fraction of the FP32 boost-clock peak a power-limited board sustains (1.0 when its TDP suffices or the
    spec lacks TDP or process node: no derating without the figures)."""
    if not tdp_w or not node_nm or not peak_fp32_tflops or peak_fp32_tflops <= 0:
        return 1.0
    return float(min(1.0, (float(tdp_w) / float(peak_fp32_tflops)) / w_needed_per_tflop(node_nm, w12, alpha)))


def spec_fp32_fraction(spec) -> float:
    """:func:`sustained_fp32_fraction` of a device spec (1.0 off NVIDIA, where the fit has no support)."""
    if str(getattr(spec, "vendor", "")).lower() != "nvidia":
        return 1.0
    return sustained_fp32_fraction(spec.tdp_w, spec.peak_fp32_tflops, spec.process_node_nm)


def fp32_gemm_floor_ms(flops: np.ndarray, peak_fp32_tflops: float, fraction: float) -> np.ndarray:
    """The fastest a dense FP32 GEMM of ``flops`` can run on a board sustaining ``fraction`` of its peak (ms)."""
    rate = float(peak_fp32_tflops) * 1e9 * UNLIMITED_EFFICIENCY * float(fraction)  # FLOP per ms
    return np.asarray(flops, dtype=float) / rate
