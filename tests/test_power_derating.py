"""The power-limited FP32 GEMM cap: the formula, its fit on the training GPUs and its use by the kernel predictor."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from wattcast.data.catalog import resolve_device
from wattcast.models import power_derating as pdr
from wattcast.models.kernel_predictor import predict_kernels


def test_fraction_formula():
    # a board with exactly the watts its node needs runs at boost clock; half of them, half the rate
    need = pdr.w_needed_per_tflop(12)
    assert pdr.sustained_fp32_fraction(need * 10, 10, 12) == pytest.approx(1.0)
    assert pdr.sustained_fp32_fraction(need * 5, 10, 12) == pytest.approx(0.5)
    # a newer node needs fewer watts per TFLOP/s
    assert pdr.w_needed_per_tflop(4) < pdr.w_needed_per_tflop(7) < pdr.w_needed_per_tflop(16)
    # no TDP or node: no derating (no figure invented)
    assert pdr.sustained_fp32_fraction(None, 30, 4) == 1.0
    assert pdr.sustained_fp32_fraction(72, 30, None) == 1.0


def test_which_gpus_are_power_limited():
    frac = {d: pdr.sustained_fp32_fraction(s.tdp_w, s.peak_fp32_tflops, s.process_node_nm)
            for d in ("L4", "Tesla-T4", "V100-PCIe-32GB", "H100-SXM5-80GB", "A100-PCIe-80GB", "B200")
            for s in [resolve_device(d)]}
    assert frac["L4"] < 0.5 and frac["Tesla-T4"] < 0.7
    assert frac["V100-PCIe-32GB"] == frac["H100-SXM5-80GB"] == frac["A100-PCIe-80GB"] == frac["B200"] == 1.0
    # off NVIDIA the fit has no support: no cap, whatever the W per TFLOP/s says
    mi300x = resolve_device("MI300X")
    assert pdr.sustained_fp32_fraction(mi300x.tdp_w, mi300x.peak_fp32_tflops, mi300x.process_node_nm) < 1.0
    assert pdr.spec_fp32_fraction(mi300x) == 1.0 and pdr.spec_fp32_fraction(resolve_device("L4")) < 0.5


def test_shipped_constants_are_the_fit(data_root):
    from wattcast.training.power_derating import HELD_OUT, fit, gpu_efficiency

    eff = gpu_efficiency(data_root)
    assert not set(eff["device"]) & set(HELD_OUT)  # the held-out GPUs take no part
    w12, alpha, e = fit(eff)
    assert (w12, alpha, e) == pytest.approx((pdr.W_NEEDED_12NM, pdr.NODE_EXPONENT, pdr.UNLIMITED_EFFICIENCY), abs=0.011)


def test_predictor_caps_fp32_gemms_on_a_power_limited_board():
    big = pd.DataFrame({"op": ["linear", "linear", "bmm"], "dtype": ["fp32", "fp16", "fp32"],
                        "B": [1, 1, 8], "M": [8192, 8192, 2048], "N": [8192, 8192, 2048],
                        "K": [8192, 8192, 2048]})
    l4 = resolve_device("L4")
    out = predict_kernels(big, l4)
    frac = pdr.sustained_fp32_fraction(l4.tdp_w, l4.peak_fp32_tflops, l4.process_node_nm)
    flops = 2.0 * big["B"].fillna(1) * big["M"] * big["N"] * big["K"]
    floor = pdr.fp32_gemm_floor_ms(flops.to_numpy(), l4.peak_fp32_tflops, frac)
    fp32 = (big["dtype"] == "fp32").to_numpy()
    assert (out["pred_latency_ms"].to_numpy()[fp32] >= floor[fp32] * (1 - 1e-9)).all()
    assert (out["pred_low_ms"] <= out["pred_latency_ms"]).all() and (out["pred_latency_ms"] <= out["pred_high_ms"]).all()
    # the same GEMMs on a board whose TDP suffices are not touched by the cap
    v100 = predict_kernels(big, "V100-PCIe-32GB")
    v = resolve_device("V100-PCIe-32GB")
    assert (v100["pred_latency_ms"].to_numpy()[fp32] < pdr.fp32_gemm_floor_ms(flops.to_numpy(), v.peak_fp32_tflops, 0.5)[fp32]).all()
