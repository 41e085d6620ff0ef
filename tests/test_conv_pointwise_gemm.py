"""FP32 1x1 stride-1 unpadded convolutions (forward, dgrad, wgrad) costed as the batched GEMMs cuDNN runs them as
(featurize/conv_gemm.py ``pointwise_gemm_shape``, models/kernel_predictor.py ``_route_convs``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from wattcast.featurize.conv_gemm import pointwise_gemm_shape
from wattcast.models.kernel_predictor import FORWARD_SHAPE_SUFFIX, POINTWISE_GEMM_SUFFIX, predict_kernels

OPS = ("conv", "conv_dgrad", "conv_wgrad")


def _conv_row(op="conv", dtype="fp32", B=32, cin=64, cout=256, k=1, s=56, stride=1, pad=0):
    return dict(op=op, dtype=dtype, B=B, Input_Channel=cin, Output_Channel=cout, Kernel_Size=k, Input_Size=s,
                Stride=stride, Padding=pad)


def test_pointwise_gemm_shape_is_the_trace_orientation_and_the_conv_flops():
    """The V100 ResNet-50 trace's cuBLAS grids: 64->256 at 56 forward ``volta_sgemm_64x64_nn`` (49, 4, 32), i.e.
    M = 56^2 rows, Cout = 256 outputs, batch 32; wgrad of 1024->256 at 14 ``volta_sgemm_32x128_tn`` (8, 8, 32):
    M = Cout 256, outputs Cin 1024."""
    B, m, n, k = pointwise_gemm_shape(np.array(OPS, dtype=object), 32, 64, 256, 56)
    assert list(B) == [32] * 3
    assert list(zip(m, n, k)) == [(3136, 64, 256), (3136, 256, 64), (256, 3136, 64)]
    assert np.all(2 * B * m * n * k == 2.0 * 32 * 56 * 56 * 64 * 256)
    _, m, n, k = pointwise_gemm_shape(np.array(["conv_wgrad"], dtype=object), 32, 1024, 256, 14)
    assert (m[0], k[0]) == (256, 1024) and np.ceil(m[0] / 32) == 8 and np.ceil(k[0] / 128) == 8


@pytest.mark.parametrize("device", ["V100-SXM2-32GB", "A100-SXM4-80GB", "T4"])
@pytest.mark.parametrize("cin,cout,s", [(64, 256, 56), (1024, 256, 14), (2048, 512, 7)])
def test_fp32_1x1_conv_rows_are_the_gemm_models_prediction(device, cin, cout, s):
    rows = pd.DataFrame([_conv_row(op=o, cin=cin, cout=cout, s=s) for o in OPS])
    out = predict_kernels(rows, device)
    B, m, n, k = pointwise_gemm_shape(rows["op"].to_numpy(dtype=object), 32, cin, cout, s)
    gemm = predict_kernels(pd.DataFrame({"op": "bmm", "dtype": "fp32", "B": B, "M": m, "N": n, "K": k}), device)
    assert out["model"].str.endswith(POINTWISE_GEMM_SUFFIX).all()
    assert np.array_equal(out["pred_latency_ms"].to_numpy(), gemm["pred_latency_ms"].to_numpy())
    assert np.array_equal(out["pred_high_ms"].to_numpy(), gemm["pred_high_ms"].to_numpy())
    assert (out["roofline_ms"] < out["pred_latency_ms"]).all()  # the conv's own roofline, below the GEMM's time


def test_other_fp32_convs_keep_the_conv_surrogate():
    """3x3 (cuDNN's Winograd on the V100 trace), a strided 1x1 and a padded 1x1 stay with the conv surrogate."""
    rows = pd.DataFrame([_conv_row(op=o, k=3, pad=1) for o in OPS] + [_conv_row(stride=2), _conv_row(pad=1)])
    out = predict_kernels(rows, "V100-SXM2-32GB")
    assert not out["model"].str.contains(POINTWISE_GEMM_SUFFIX, regex=False).any()
    assert out["model"].iloc[1].endswith(FORWARD_SHAPE_SUFFIX)


def test_tensor_core_1x1_convs_stay_implicit_gemms():
    out = predict_kernels(pd.DataFrame([_conv_row(dtype="fp16")]), "V100-SXM2-32GB")
    assert out["model"].iloc[0].endswith("+implicit-gemm")
    out = predict_kernels(pd.DataFrame([_conv_row(dtype="bf16")]), "A100-SXM4-80GB")
    assert out["model"].iloc[0].endswith("+implicit-gemm")
