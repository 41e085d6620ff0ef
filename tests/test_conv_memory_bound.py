"""Tensor-core convolutions: the implicit GEMM's time on the convolution's own bytes, fewer filters never slower, TF32
never slower than FP32 (audit 57f finding 3; the unfolded-input note of featurize/conv_gemm.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from wattcast.data.catalog import resolve_device
from wattcast.data.kernel_ops import DTYPE_BYTES
from wattcast.featurize.conv_gemm import implicit_gemm_conv_ms, implicit_gemm_shape, padded_channels
from wattcast.featurize.kernel_features import featurize_kernels
from wattcast.models.kernel_predictor import CONV_COUT_LADDER, predict_kernels

#: the audit's rows: 3x3 convs from 128 channels, B = 64 at 64 x 64, Cout 4 .. 256 (and between the ladder's values)
COUTS = (1, 3, 4, 5, 8, 10, 16, 20, 32, 40, 64, 80, 100, 128, 200, 256)
KINDS = ("conv", "conv_dgrad", "conv_wgrad")


def _rows(dtype, op="conv", couts=COUTS, B=64, cin=128, k=3, s=64, stride=1, pad=1):
    return pd.DataFrame([dict(op=op, dtype=dtype, B=B, Input_Channel=cin, Output_Channel=c, Kernel_Size=k,
                              Input_Size=s, Stride=stride, Padding=pad) for c in couts])


def _unfolded_bound_ms(rows: pd.DataFrame, spec) -> np.ndarray:
    """The time to move the implicit GEMM's operands (the k^2-unfolded one included) through DRAM once, at the peak
    bandwidth: the GEMM view's memory roofline, the bound the audit found 0.517 ms above."""
    eb = np.array([float(DTYPE_BYTES[d]) for d in rows["dtype"]])
    m, n, k = implicit_gemm_shape(rows["op"].to_numpy(), rows["B"], padded_channels(rows["Input_Channel"], eb),
                                  padded_channels(rows["Output_Channel"], eb), rows["Kernel_Size"], rows["Input_Size"],
                                  rows["Stride"], rows["Padding"])
    gemm = pd.DataFrame(dict(op="bmm", dtype=rows["dtype"].to_numpy(), B=1.0, M=m, N=n, K=k))
    return featurize_kernels(gemm, spec)["t_mem_ms"].to_numpy()


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "tf32"])
@pytest.mark.parametrize("op", KINDS)
def test_fewer_output_channels_never_slower(dtype, op):
    """Finding 3: 128->4 cost 0.517 ms, more than 128->64 (0.458) and as much as 128->128 (0.501), bf16 on an A100."""
    out = predict_kernels(_rows(dtype, op), "A100-SXM4-80GB")
    t = out["pred_latency_ms"].to_numpy()
    assert out["model"].str.endswith("+implicit-gemm").all(), out["model"].unique()
    assert (np.diff(t) >= 0).all(), dict(zip(COUTS, t))


@pytest.mark.parametrize("device", ["A100-SXM4-80GB", "H100-SXM5-80GB", "L40S"])
def test_fewer_output_channels_never_slower_across_shapes(device):
    """Every tensor-core dtype and kernel, strided and not, 1x1 to 7x7: non-increasing as Cout falls, ladder or not."""
    couts = (1, 3, 4, 8, 12, 16, 24, 30, 48, 64, 72, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1000, 2048)
    spec = resolve_device(device)
    frames = [_rows(dt, op, couts, B=B, cin=cin, k=k, s=s, stride=st, pad=k // 2)
              for dt in ("bf16", "tf32") for op in KINDS for cin in (16, 256) for k, st in ((1, 1), (3, 1), (3, 2), (7, 2))
              for s, B in ((14, 64), (56, 8))]
    t = predict_kernels(pd.concat(frames, ignore_index=True), spec)["pred_latency_ms"].to_numpy().reshape(-1, len(couts))
    assert np.isfinite(t).all()
    drops = np.diff(t, axis=1) < 0
    assert not drops.any(), np.argwhere(drops)[:5]


@pytest.mark.parametrize("op", KINDS)
def test_memory_bound_conv_within_the_unfolded_bound_and_above_its_own_roofline(op):
    """Finding 3: 0.517 ms was above even reading the k^2-unfolded input (604 MB: 0.30 ms at 2.04 TB/s). Now below
    that bound wherever the GEMM view is memory-bound, and never below the convolution's own roofline."""
    spec = resolve_device("A100-SXM4-80GB")
    rows = _rows("bf16", op)
    out = predict_kernels(rows, spec)
    t, roof = out["pred_latency_ms"].to_numpy(), out["roofline_ms"].to_numpy()
    unfolded = _unfolded_bound_ms(rows, spec)
    flops_ms = featurize_kernels(rows.assign(op="conv"), spec)["flops"].to_numpy() / (spec.peak_bf16_tflops * 1e9)
    mem_bound = unfolded > 2.0 * flops_ms  # the unfolded operand's traffic dominates the GEMM view: Cout <= 64 or 80
    assert mem_bound.sum() >= 8
    if op != "conv_dgrad":  # dgrad's unfolded operand is the output gradient, Cout x k^2 a position: small here, so
        # its GEMM view hardly exceeds the real bytes, and its time is the GEMM model's (at most, test below)
        assert (t[mem_bound] <= unfolded[mem_bound]).all(), (t, unfolded)
    assert (t >= roof).all() and (out["pred_low_ms"].to_numpy() >= roof).all()
    # the 128->4 conv reads 69 MB: at most a few times its roofline, not 15x
    assert t[COUTS.index(4)] < 3.0 * roof[COUTS.index(4)]


@pytest.mark.parametrize("device", ["A100-SXM4-80GB", "H100-SXM5-80GB"])
def test_never_above_the_gemm_view(device):
    """On the ladder's Couts a tensor-core conv takes no longer than its implicit GEMM as the GEMM model costs it (the
    unfolded operand moved through DRAM: what the conv cost before the memory correction)."""
    spec = resolve_device(device)
    couts = (4, 16, 64, 96, 256, 512)
    rows = pd.concat([_rows(dt, op, couts, B=B, cin=cin, k=k, s=s, stride=st, pad=k // 2)
                      for dt in ("bf16", "tf32") for op in KINDS for cin in (16, 256)
                      for k, st in ((1, 1), (1, 2), (3, 1), (3, 2), (5, 1)) for s, B in ((14, 64), (56, 8))],
                     ignore_index=True)
    t = predict_kernels(rows, spec)["pred_latency_ms"].to_numpy()
    eb = np.array([float(DTYPE_BYTES[d]) for d in rows["dtype"]])
    m, n, k = implicit_gemm_shape(rows["op"].to_numpy(), rows["B"], padded_channels(rows["Input_Channel"], eb),
                                  padded_channels(rows["Output_Channel"], eb), rows["Kernel_Size"], rows["Input_Size"],
                                  rows["Stride"], rows["Padding"])
    gemm = predict_kernels(pd.DataFrame(dict(op="bmm", dtype=rows["dtype"].to_numpy(), B=1.0, M=m, N=n, K=k)), spec)
    # a strided dgrad's GEMM is one of its stride^2 sub-problems (featurize/conv_gemm.py): it writes a 1 / stride^2 of
    # the input gradient the kernel writes in full, so there the conv's own roofline can lie above the GEMM view
    strided_dgrad = (rows["op"] == "conv_dgrad").to_numpy() & (rows["Stride"] > 1).to_numpy()
    over = (t > gemm["pred_latency_ms"].to_numpy() * (1 + 1e-12)) & ~strided_dgrad
    assert not over.any(), rows[over].assign(t=t[over], gemm=gemm["pred_latency_ms"].to_numpy()[over]).head()


@pytest.mark.parametrize("device, batch", [("A100-SXM4-80GB", 32), ("L40S", 256), ("H100-SXM5-80GB", 32)])
def test_resnet_3x3_not_costed_on_the_unfolded_input(device, batch):
    """The conv helper's note: bf16 3x3 64->64 at 56 x 56 came out 0.104 ms on an A100 at B 32 (4.4x its compute
    roofline, above reading the 9x unfolded input once) and 1.77 ms on an L40S at B 256 (13% of peak)."""
    spec = resolve_device(device)
    rows = pd.concat([_rows("bf16", op, (64,), B=batch, cin=64, s=56) for op in KINDS], ignore_index=True)
    out = predict_kernels(rows, spec)
    t = out["pred_latency_ms"].to_numpy()
    assert (t <= _unfolded_bound_ms(rows, spec)).all()
    assert (t >= out["roofline_ms"].to_numpy()).all()


@pytest.mark.parametrize("op", KINDS)
def test_tf32_never_slower_than_fp32(op):
    """Finding 3: the tf32 128->4 row cost 1.087 ms against fp32's 0.778, so --no-cudnn-tf32 came out faster."""
    spec = resolve_device("A100-SXM4-80GB")
    t32 = predict_kernels(_rows("tf32", op), spec)
    f32 = predict_kernels(_rows("fp32", op), spec)
    assert (t32["pred_latency_ms"].to_numpy() <= f32["pred_latency_ms"].to_numpy()).all()


@pytest.mark.parametrize("device", ["A100-SXM4-80GB", "H100-SXM5-80GB", "L40S", "B200"])
def test_tf32_never_slower_than_physical_fp32_across_shapes(device):
    """On the ladder's Couts a tf32 conv on tensor cores takes no longer than the same conv in FP32 (cuDNN can run the
    FP32 kernel: _predict_conv_rows), or than FP32's roofline where the fp32 conv model fell below it (L40S's large
    convs: an FP32 time faster than the FP32 peak allows is not a kernel cuDNN could pick)."""
    spec = resolve_device(device)
    couts = (4, 16, 64, 128, 256, 512)
    base = pd.concat([_rows("tf32", op, couts, B=B, cin=cin, k=k, s=s, stride=st, pad=k // 2)
                      for op in KINDS for cin in (16, 128, 512) for k, st in ((1, 1), (3, 1), (5, 1), (7, 2))
                      for s, B in ((14, 64), (56, 8), (28, 64))], ignore_index=True)
    t32 = predict_kernels(base, spec)["pred_latency_ms"].to_numpy()
    f32 = predict_kernels(base.assign(dtype="fp32"), spec)
    bound = np.maximum(f32["pred_latency_ms"].to_numpy(), f32["roofline_ms"].to_numpy())
    assert (t32 <= bound * (1 + 1e-12)).all(), np.max(t32 / bound)


def test_fp32_kernel_taken_where_faster_is_labelled():
    """A tf32 row that takes its FP32 twin's time says so (``+fp32-simt``) and keeps its own roofline."""
    spec = resolve_device("L40S")
    rows = _rows("tf32", "conv_wgrad", (512,), B=64, cin=512, k=7, s=28, pad=3)
    out = predict_kernels(rows, spec)
    twin = predict_kernels(rows.assign(dtype="fp32"), spec)
    assert out["model"].iloc[0].endswith("+fp32-simt"), out["model"].iloc[0]
    assert out["pred_latency_ms"].iloc[0] == pytest.approx(max(twin["pred_latency_ms"].iloc[0], out["roofline_ms"].iloc[0]))
    assert out["roofline_ms"].iloc[0] < twin["roofline_ms"].iloc[0]  # TF32's peak, not FP32's


def test_compute_bound_convs_keep_the_gemm_time():
    """AlexNet's conv3-5 (TF32 on an A100, compute-bound in both views; benchmarks/conv_alexnet.py +8.7 / +8.7 /
    +5.2% against the trace) are exactly their implicit GEMM's time: the memory correction and the guards leave them."""
    spec = resolve_device("A100-SXM4-40GB")
    rows = pd.DataFrame([dict(op="conv", dtype="tf32", B=128, Input_Channel=ci, Output_Channel=co, Kernel_Size=3,
                              Input_Size=13, Stride=1, Padding=1) for ci, co in ((192, 384), (384, 256), (256, 256))])
    out = predict_kernels(rows, spec)
    m, n, k = implicit_gemm_shape(rows["op"].to_numpy(), rows["B"], rows["Input_Channel"], rows["Output_Channel"],
                                  rows["Kernel_Size"], rows["Input_Size"], rows["Stride"], rows["Padding"])
    gemm = predict_kernels(pd.DataFrame(dict(op="bmm", dtype="tf32", B=1.0, M=m, N=n, K=k)), spec)
    np.testing.assert_array_equal(out["pred_latency_ms"].to_numpy(), gemm["pred_latency_ms"].to_numpy())
    assert set(CONV_COUT_LADDER) >= {192.0, 256.0, 384.0}


def test_implicit_gemm_conv_ms_rule():
    """t = t_gemm x min(1, conv roofline / GEMM roofline), at least the row's own roofline."""
    t = implicit_gemm_conv_ms([0.5, 0.5, 0.5, 0.01, np.nan], [0.3, 0.2, 0.1, 0.3, 0.3], [0.03, 0.2, 0.2, 0.03, 0.03],
                              [0.03, 0.2, 0.2, 0.02, 0.03])
    np.testing.assert_allclose(t[:4], [0.05, 0.5, 0.5, 0.02])  # memory-bound / compute-bound / unfolded smaller / floor
    assert np.isnan(t[4])
