"""The kernel vocabulary: op names, their family, and the shape columns each one needs.

Shape convention (NeuSight's, used everywhere in wattcast):
- ``bmm``    B, M, N, K: torch.bmm of (B, M, N) by (B, N, K); N is the contraction dim, output (B, M, K).
- ``linear`` B, M, N, K: nn.Linear(N, K, bias=True) on (B, M, N); N is the contraction dim.
- elementwise ops, ``ln``, ``rmsnorm``, ``softmax``: a (B, H) tensor (normalisation over H).
- ``conv``   B, Input_Channel, Output_Channel, Kernel_Size, Input_Size, Stride, Padding:
  nn.Conv2d without bias on a (B, C, S, S) input.
- ``conv_dgrad`` / ``conv_wgrad``: that convolution's backward kernels (the gradient w.r.t. its input / its weights),
  given by the forward convolution's shape columns (featurize/conv_gemm.py: the implicit GEMM each one runs).
"""

from __future__ import annotations

import numpy as np

GEMM_COLS = ("B", "M", "N", "K")
VEC_COLS = ("B", "H")
CONV_COLS = ("B", "Input_Channel", "Output_Channel", "Kernel_Size", "Input_Size", "Stride", "Padding")
SHAPE_COLS = ("B", "M", "N", "K", "H", "Input_Channel", "Output_Channel", "Kernel_Size", "Input_Size", "Stride", "Padding")

#: tensor-tensor elementwise ops (read two inputs, write one)
BINARY_OPS = ("add", "sub", "mul", "div", "pow", "silu_mul")
#: one-input elementwise ops (``u`` = with a Python scalar)
UNARY_OPS = ("addu", "subu", "mulu", "divu", "powu", "relu", "gelu", "tanh", "silu", "exp", "sigmoid", "neg", "sqrt", "rsqrt", "copy")
ELEMENTWISE_OPS = BINARY_OPS + UNARY_OPS

#: op -> family; a family has one surrogate
OP_FAMILY: dict[str, str] = {
    "bmm": "gemm",
    "matmul": "gemm",
    "linear": "gemm",
    "conv": "conv",
    "conv_dgrad": "conv",
    "conv_wgrad": "conv",
    "ln": "ln",
    "rmsnorm": "ln",
    "softmax": "softmax",
    **{op: "elementwise" for op in ELEMENTWISE_OPS},
}

FAMILIES = ("gemm", "conv", "elementwise", "ln", "softmax")

#: other spellings of OPName a user CSV may carry (lower-cased) -> the vocabulary's name
OP_ALIASES: dict[str, str] = {"layernorm": "ln", "layer_norm": "ln", "rms_norm": "rmsnorm", "conv2d": "conv"}

#: ops of the vocabulary with no measured kernel in any training source, predicted as the measured op
#: that moves the same bytes with similar arithmetic (the learned models have never seen them, so their
#: own category would be an extrapolation): a copy reads and writes one tensor like a scalar add; the
#: transcendental unaries (exp, sigmoid, silu, sqrt, rsqrt) are costed as tanh
MEASURED_AS: dict[str, str] = {
    "matmul": "bmm", "sub": "add", "subu": "addu", "copy": "addu", "neg": "mulu",
    "silu": "tanh", "exp": "tanh", "sigmoid": "tanh", "sqrt": "tanh", "rsqrt": "tanh",
}

#: the families the issue reports on (BMM and linear are reported apart though one model serves both)
REPORT_FAMILY: dict[str, str] = {
    "bmm": "bmm",
    "matmul": "bmm",
    "linear": "linear",
    "conv": "conv",
    "conv_dgrad": "conv",
    "conv_wgrad": "conv",
    "ln": "layernorm",
    "rmsnorm": "layernorm",
    "softmax": "softmax",
    **{op: "elementwise" for op in ELEMENTWISE_OPS},
}

#: approximate arithmetic per output element, for vector ops (FLOP/element)
FLOPS_PER_ELEMENT: dict[str, float] = {
    "add": 1, "sub": 1, "mul": 1, "div": 1, "pow": 10, "silu_mul": 6,
    "addu": 1, "subu": 1, "mulu": 1, "divu": 1, "powu": 10, "relu": 1, "gelu": 14, "tanh": 8,
    "silu": 5, "exp": 4, "sigmoid": 5, "neg": 1, "sqrt": 2, "rsqrt": 2, "copy": 0,
    "ln": 8, "rmsnorm": 5, "softmax": 5,
}

#: fused-attention implementation classes (their cost model: models/attention.py): "fa2" FlashAttention-2 (PyTorch
#: SDPA's flash backend, flash-attn 2.x; off its native instruction on Hopper / data-centre Blackwell), "fa1"
#: FlashAttention-1 and the 2022-23 Triton kernels, "fa3" the generation's own fused kernel (FlashAttention-3 / cuDNN
#: fused attention, what Transformer Engine and vLLM run on Hopper)
FLASH_KERNELS = ("fa2", "fa1", "fa3")

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}

#: bytes per element a matmul (GEMM, conv) WRITES: an fp8 matmul reads fp8 operands and writes bf16. The fp8 rows the
#: GEMM family learns from are XLA's e4m3 x e4m3 -> bf16 (``data.kernel_datasets.XLA_DTYPES``; ROCm/xla
#: xla/service/gpu/model/default_matmul_perf_table.txtpb), and an fp8 training step's GEMMs write bf16 activations
#: (NVIDIA Transformer Engine docs, "Using FP8 with Transformer Engine": FP8 GEMM inputs, higher-precision outputs)
MATMUL_OUT_BYTES: dict[str, int] = {**DTYPE_BYTES, "fp8": 2}

#: the families whose kernels run on matrix units, where TF32 is a mode of its own; every other family runs a tf32
#: kernel's fp32 data on the vector units as fp32 (``wattcast kernels`` predicts such a row as fp32, as ``predict``
#: builds it)
MATMUL_FAMILIES = frozenset({"gemm", "conv"})

#: the largest shape value (any shape column) a kernel row may carry: 2**40 (1.1e12) is beyond every real dimension
#: (a 2**32-token step over a 256k vocabulary is 1.1e15 elements in two dims, each far below it); larger is a typo or
#: a unit slip, and would cost a kernel for longer than the universe is old
MAX_SHAPE_DIM = 2**40
#: the largest tensor (an operand or the result, bytes) of a kernel row: 1e15 bytes (1 PB) is thousands of times the
#: memory of any GPU
MAX_TENSOR_BYTES = 1e15

DTYPE_ALIASES: dict[str, str] = {
    "float32": "fp32", "float": "fp32", "f32": "fp32", "torch.float32": "fp32",
    "tensorfloat32": "tf32",
    "float16": "fp16", "half": "fp16", "f16": "fp16", "torch.float16": "fp16",
    "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "float8": "fp8", "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "f8e4m3fn": "fp8", "f8e5m2": "fp8", "f8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "e4m3": "fp8", "e5m2": "fp8",
}


def required_columns(op: str) -> tuple[str, ...]:
    fam = OP_FAMILY[op]
    if fam == "gemm":
        return GEMM_COLS
    if fam == "conv":
        return CONV_COLS
    return VEC_COLS


def min_shape_value(column: str) -> int:
    """The smallest value a shape column may hold: 0 for ``Padding`` (an unpadded convolution), 1 for every other
    (a dimension, a count, a stride)."""
    return 0 if column == "Padding" else 1


def bad_shape_values(v: np.ndarray, column: str) -> np.ndarray:
    """Where shape column ``column``'s values ``v`` (floats) are not a whole number >= :func:`min_shape_value`: NaN,
    infinite, too small or fractional (the implausibly large, beyond :data:`MAX_SHAPE_DIM`, are checked apart)."""
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(v) | (v < min_shape_value(column)) | (v != np.round(v))


def canonical_dtype(d: str) -> str:
    s = str(d).strip().lower()
    return DTYPE_ALIASES.get(s, s)
