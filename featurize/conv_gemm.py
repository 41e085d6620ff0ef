"""Convolutions as the implicit GEMMs cuDNN runs on tensor cores, and which convolutions run there.

A 2-D convolution's three kernels (forward, the gradient w.r.t. the input ``dgrad``, the gradient w.r.t. the weights
``wgrad``) are one GEMM each over the unfolded (im2col) view; cuDNN's tensor-core kernels compute that GEMM without
materialising the view (``sm80_xmma_fprop_implicit_gemm_*``, ``*_dgrad_*``, ``*_wgrad_*``; CUTLASS's
``conv2d_fprop`` / ``conv2d_dgrad`` / ``conv2d_wgrad``, include/cutlass/conv/conv2d_problem_size.h
``implicit_gemm_problem_size``). In wattcast's GEMM convention (``nn.Linear(N, K)`` on (B, M, N): M rows, N the
contraction, K the outputs) for a (B, Cin, S, S) input, Cout filters of k x k, stride s, output side O:

- forward: M = B x O^2, N = Cin x k^2, K = Cout (CUTLASS: GEMM-M = N*P*Q, GEMM-N = K, GEMM-K = C*R*S);
- dgrad:   M = B x ceil(S / s)^2, N = Cout x k^2, K = Cin. At stride 1 this is CUTLASS's GEMM-M = N*H*W with
  GEMM-K = K*R*S. A strided dgrad runs as s^2 stride-1 sub-problems (CUTLASS ``StrideSupport::kStrided``: each
  filter phase over the H/s x W/s input positions it reaches), whose taps add up to the k^2 of the filter: one GEMM of
  M = B x (S/s)^2 rows with the whole contraction, so its FLOPs are the forward's (B x O^2 = B x (S/s)^2 under "same"
  padding), not s^2 times them;
- wgrad:   M = Cout, N = B x O^2, K = Cin x k^2 (CUTLASS: GEMM-M = K, GEMM-N = C*R*S, GEMM-K = N*P*Q).

The three do the same FLOPs (2 x B x O^2 x Cin x Cout x k^2) and each is its own kernel.
"""

from __future__ import annotations

import numpy as np

#: the kernel-vocabulary ops of a convolution: the forward and its two backward kernels (data/kernel_ops.py). Their
#: shape columns are all the forward convolution's (B, Input_Channel, Output_Channel, Kernel_Size, Input_Size, Stride,
#: Padding); the op says which GEMM of it the kernel is (:func:`implicit_gemm_shape`)
CONV_KERNELS = ("conv", "conv_dgrad", "conv_wgrad")

#: the dtypes whose convolutions run on tensor cores as implicit GEMMs (where the device's spec has the dtype's peak)
TENSOR_CORE_CONV_DTYPES = ("tf32", "bf16", "fp16", "fp8")

#: a TF32 convolution runs on tensor cores only when its input channels are a multiple of this; else cuDNN runs it in
#: FP32 on the vector units. Measured: the A100 Kineto trace of torchvision AlexNet (fp32, PyTorch's default
#: ``torch.backends.cudnn.allow_tf32 = True``; $WATTCAST_DATA/traces/a100_alexnet.json.gz) runs conv3-5 (Cin 192, 384,
#: 256) as ``sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_*`` and conv1 (Cin = 3) as ``cudnn_ampere_scudnn_128x64_*``
#: (FP32 SIMT). Four fp32 elements are the 16-byte vector load an Ampere tensor-core kernel's operand tiles are copied
#: with (``cp.async`` of 16 B: CUTLASS's ``kAlignmentA/B`` for tf32, 128 bits / 32)
TF32_CONV_CHANNEL_MULTIPLE = 4

#: 16-bit (and fp8) convolutions whose channels are not a multiple of the 16-byte vector (8 bf16/fp16 elements, 16 fp8)
#: are PADDED to it and still run on tensor cores: "For packed NCHW data, when the channel dimension is not a multiple
#: of 8, then the cuDNN library will pad the tensors as needed to enable Tensor Core operations" (NVIDIA cuDNN Developer
#: Guide 8.x, "Tensor Core Operations" notes; automatic since cuDNN 7.3). The padded channels are zeros the MMAs still
#: multiply, so the GEMM is costed at the padded Cin / Cout (ResNet's stem: Cin 3 -> 8). No 16-bit measurement here
#: checks it (the shared traces run fp32); TF32 is not padded (the AlexNet trace above)
TC_CHANNEL_ALIGN_BYTES = 16


def conv_out_size(s, k, stride, pad) -> np.ndarray:
    """Output side of a square convolution (PyTorch's floor((S + 2p - k) / s) + 1)."""
    s, k, stride, pad = (np.asarray(v, dtype=float) for v in (s, k, stride, pad))
    return np.floor((s + 2 * pad - k) / np.where(stride > 0, stride, 1)) + 1


def tf32_conv_on_tensor_cores(cin) -> np.ndarray:
    """Per row: a TF32 convolution with ``cin`` input channels runs on tensor cores (:data:`TF32_CONV_CHANNEL_MULTIPLE`)."""
    c = np.asarray(cin, dtype=float)
    return np.isfinite(c) & (np.mod(c, TF32_CONV_CHANNEL_MULTIPLE) == 0)


def padded_channels(c, elem_bytes) -> np.ndarray:
    """Channels ``c`` as a tensor-core convolution of ``elem_bytes``-byte elements runs them: rounded up to the
    16-byte vector for 16-bit and 8-bit elements (:data:`TC_CHANNEL_ALIGN_BYTES`), as given for 4-byte (TF32) ones."""
    c = np.asarray(c, dtype=float)
    eb = np.asarray(elem_bytes, dtype=float)
    align = np.where(eb < 4, TC_CHANNEL_ALIGN_BYTES / np.maximum(eb, 1.0), 1.0)
    return np.ceil(c / align) * align


def implicit_gemm_shape(kind, B, cin, cout, k, s, stride, pad) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(M, N, K) of each row's implicit GEMM (module docstring): ``kind`` per row one of :data:`CONV_KERNELS`, the
    rest the forward convolution's shape (channels as the kernel runs them: :func:`padded_channels`)."""
    kind = np.asarray(kind, dtype=object)
    B, cin, cout, k, s, stride = (np.asarray(v, dtype=float) for v in (B, cin, cout, k, s, stride))
    o = conv_out_size(s, k, stride, pad)
    k2 = k * k
    fwd = (B * o * o, cin * k2, cout)
    side = np.ceil(s / np.where(stride > 0, stride, 1))
    dgrad = (B * side * side, cout * k2, cin)
    wgrad = (cout, B * o * o, cin * k2)
    is_d, is_w = kind == "conv_dgrad", kind == "conv_wgrad"
    return tuple(np.where(is_d, d, np.where(is_w, w, f)) for f, d, w in zip(fwd, dgrad, wgrad))


def pointwise_conv_rows(k, stride, pad) -> np.ndarray:
    """Per row: a 1 x 1 convolution of stride 1 and no padding, one GEMM over the input as it lies in memory (no
    im2col: :func:`pointwise_gemm_shape`)."""
    k, stride, pad = (np.asarray(v, dtype=float) for v in (k, stride, pad))
    return (k == 1) & (stride == 1) & (pad == 0)


def pointwise_gemm_shape(kind, B, cin, cout, s) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(B, M, N, K) of the batched GEMM an FP32 1 x 1, stride-1, unpadded convolution runs as (``kind`` per row one of
    :data:`CONV_KERNELS`; a (B, Cin, S, S) NCHW input, Cout filters). Per image the input is a (Cin x S^2) matrix and
    the filters a (Cout x Cin) one, so each kernel is one GEMM per image, a batch of B (wattcast's convention: M rows,
    N the contraction, K the outputs):

    - forward: M = S^2, N = Cin, K = Cout (Y_b = W X_b);
    - dgrad:   M = S^2, N = Cout, K = Cin (dX_b = W^T dY_b);
    - wgrad:   M = Cout, N = S^2, K = Cin (dW = sum_b dY_b X_b^T: one product per image, summed).

    This is the orientation cuDNN ran on a V100 (ResNet-50, batch 32, FP32; $WATTCAST_DATA/traces/v100_rank0.json.gz,
    benchmarks/resnet50_v100_trace.py), read from the cuBLAS kernels' grids (tile M x tile N, grid.z the batch):
    forward 64->256 at 56 ``volta_sgemm_64x64_nn`` grid (49, 4, 32) = (3136 / 64, 256 / 64, 32); 128->512 at 28
    ``volta_sgemm_32x128_nn`` (25, 4, 32) = (ceil(784 / 32), 512 / 128, 32); dgrad of 512->128 at 28
    ``volta_sgemm_32x128_nt`` (25, 4, 32) (Cin 512 out); wgrad of 1024->256 at 14 ``volta_sgemm_32x128_tn`` (8, 8, 32)
    = (256 / 32, 1024 / 128, 32). The three do the same FLOPs as the convolution (2 x B x S^2 x Cin x Cout)."""
    kind = np.asarray(kind, dtype=object)
    B, cin, cout, s = (np.asarray(v, dtype=float) for v in (B, cin, cout, s))
    hw = s * s
    is_d, is_w = kind == "conv_dgrad", kind == "conv_wgrad"
    m = np.where(is_w, cout, hw)
    n = np.where(is_d, cout, np.where(is_w, hw, cin))
    k = np.where(is_d | is_w, cin, cout)
    return B * np.ones_like(m), m, n, k


def cudnn_tf32_rows(kernel, dtype, method, cin) -> np.ndarray:
    """Per node of a step graph (its ``kernel``, ``dtype``, ``method`` and ``Input_Channel`` columns): an fp32
    convolution kernel PyTorch runs in TF32 on a GPU with TF32 tensor cores. ``torch.backends.cudnn.allow_tf32`` is
    True by default (torch 2.13: ``torch.backends.cudnn.conv.fp32_precision == "tf32"``; matmuls' ``allow_tf32`` is
    False), so an fp32 model's convolutions run TF32 while its matmuls stay FP32, except those whose input channels
    cuDNN's TF32 kernels do not take (:data:`TF32_CONV_CHANNEL_MULTIPLE`)."""
    return (np.isin(np.asarray(kernel, dtype=object), CONV_KERNELS) & (np.asarray(dtype, dtype=object) == "fp32")
            & (np.asarray(method, dtype=object) == "surrogate") & tf32_conv_on_tensor_cores(cin))


def implicit_gemm_conv_ms(t_gemm_ms, gemm_roof_ms, conv_roof_ms, own_roof_ms) -> np.ndarray:
    """A tensor-core convolution kernel's time from its implicit GEMM's (per row, any of :data:`CONV_KERNELS`):
    ``t_gemm_ms`` the GEMM model's time for the GEMM of :func:`implicit_gemm_shape`, ``gemm_roof_ms`` that GEMM's
    roofline (its operands' bytes: the unfolded im2col operand, k^2 x the activation, read from DRAM),
    ``conv_roof_ms`` the roofline of the convolution as the kernel runs it (the same FLOPs; its three real tensors'
    bytes, channels as padded), ``own_roof_ms`` the floor: the row's own roofline (unpadded channels; the caller
    passes the lower of it and ``gemm_roof_ms`` for a kernel that reads a strided subset of its input, a filter
    narrower than its stride, where the own roofline counts the whole tensor).

    t = t_gemm x min(1, conv_roof / gemm_roof), and never below ``own_roof_ms``.

    The GEMM view counts the unfolded operand (forward and wgrad: the input, B x Ho x Wo x Cin x k^2 elements; dgrad:
    the output gradient, Cout x k^2 per position) as DRAM traffic. The implicit-GEMM kernel never builds it: its
    iterators compute the im2col addresses and load each activation tile from the tensor itself, so the k^2 taps that
    reuse an element hit L2 / shared memory, and DRAM sees the activation, the filters and the output once each
    (CUTLASS media/docs/implicit_gemm_convolution.md: "the activation tensor ... is never explicitly formed";
    include/cutlass/conv/threadblock/conv2d_fprop_activation_tile_access_iterator_analytic.h computes the im2col
    offsets per tile). The rule keeps the GEMM model's efficiency (its time over its roofline: tile shape, waves,
    pipeline stalls it learned from tensor-core GEMMs) and puts it on the convolution's own roofline (Williams,
    Waterman, Patterson, "Roofline", CACM 52(4) 2009: time >= max(FLOPs / peak, bytes / bandwidth)). Consequences:

    - compute-bound in both views (AlexNet's conv3-5, TF32 on the A100: ratio 1), the time is the GEMM's unchanged;
    - memory-bound (few output channels, a 3x3 over large images), the time falls with the real bytes instead of
      staying at the unfolded operand's: a 128->4 3x3 bf16 conv of B = 64 at 64 x 64 on an A100-80GB read 604 MB
      unfolded (GEMM roofline 0.30 ms, GEMM model 0.517 ms, more than the 128->64 conv's 0.458) and 69 MB for real
      (roofline 0.034 ms);
    - never above the GEMM view's time (min(1, ...): a strided 1x1 conv's unfolded operand is smaller than its
      input), never below the floor (the last clamp: nothing outruns its roofline). The clamp can lift a strided
      dgrad above its GEMM view: that GEMM is one of the stride^2 sub-problems (module docstring) and counts a
      1 / stride^2 of the input gradient the kernel writes in full.

    Not measured here: no tensor-core conv trace but AlexNet's, whose conv3-5 are compute-bound in both views
    (unchanged) and whose conv2 (5x5, 64->192 at 27 x 27, B 128: the 25x-unfolded input makes its GEMM view
    memory-bound, ratio 0.85) moves from +30.6% to +11.4% against the trace, where cuDNN ran it by FFT, not as an
    implicit GEMM; so the memory-bound side rests on the roofline argument. All arrays broadcast; NaN propagates."""
    t, rg, rc, ro = (np.asarray(v, dtype=float) for v in (t_gemm_ms, gemm_roof_ms, conv_roof_ms, own_roof_ms))
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.minimum(1.0, np.where(rg > 0, rc / rg, 1.0))
    return np.maximum(t * scale, ro)
