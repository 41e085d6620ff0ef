"""The op-mapping tables of the ``torch.export`` importer: ATen overload packet -> the wattcast kernel kind that
costs it (the dtype labels, the op families, and :data:`RULES`, packet -> the handler of ``ops.py`` that records its
kernels). Data only, plus the small functions that name a call's target."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

_TORCH_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _TORCH_DTYPE_NAMES[getattr(torch, _name)] = "fp8"
#: non-float dtypes: the label the graph carries (1-byte masks as ``fp8``, like the builder's dropout mask)
_OTHER_DTYPE_NAMES = {torch.bool: "fp8", torch.uint8: "fp8", torch.int8: "fp8", torch.int16: "fp16",
                      torch.int32: "int32", torch.int64: "int64", torch.float64: "fp64"}

# ---------------------------------------------------------------- op tables (ATen overload packet names)
_VIEWS = frozenset((
    "view", "_unsafe_view", "expand", "expand_as", "unsqueeze", "squeeze", "permute", "transpose", "t",
    "slice", "select", "alias", "detach", "narrow", "view_as", "unflatten", "movedim", "moveaxis",
    "swapaxes", "swapdims", "as_strided", "diagonal", "_reshape_alias", "lift_fresh", "lift_fresh_copy",
    "numpy_T", "mT", "mH", "adjoint", "real", "imag", "view_as_real", "view_as_complex", "unfold",
    "_alias", "split", "split_with_sizes", "chunk", "unbind", "tensor_split", "hsplit", "vsplit",
))
_RESHAPES = frozenset(("reshape", "reshape_as", "flatten"))
_CREATION = frozenset((
    "arange", "zeros", "ones", "full", "empty", "empty_strided", "scalar_tensor", "zeros_like", "ones_like",
    "full_like", "empty_like", "rand", "randn", "randint", "rand_like", "randn_like", "randint_like",
    "new_zeros", "new_ones", "new_full", "new_empty", "new_empty_strided", "eye", "linspace", "logspace",
    "tensor", "randperm", "normal", "bernoulli", "uniform", "exponential", "random", "geometric", "cauchy",
    "log_normal",
))
_COPIES = frozenset(("clone", "_to_copy", "copy", "repeat", "repeat_interleave", "constant_pad_nd", "pad",
                     "roll", "flip", "tile", "cat", "concat", "concatenate", "stack",
                     "hstack", "vstack"))
_MULTI_INPUT_COPIES = frozenset(("cat", "concat", "concatenate", "stack", "hstack", "vstack"))
_REDUCTIONS = frozenset(("mean", "sum", "amax", "amin", "argmax", "argmin", "var", "std", "var_mean",
                         "std_mean", "prod", "logsumexp", "norm", "linalg_vector_norm", "any", "all",
                         "count_nonzero", "nansum", "nanmean", "aminmax"))
#: packet -> builder elementwise op (in the kernel vocabulary, or one the builder knows how to cost)
_ELEMENTWISE = {
    "add": "add", "sub": "sub", "subtract": "sub", "rsub": "sub", "mul": "mul", "multiply": "mul",
    "div": "div", "divide": "div", "true_divide": "div", "pow": "pow", "float_power": "pow",
    "gelu": "gelu", "relu": "relu", "tanh": "tanh", "silu": "silu", "sigmoid": "sigmoid", "exp": "exp",
    "neg": "neg", "negative": "neg", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "where": "where", "masked_fill": "masked_fill", "maximum": "maximum", "minimum": "minimum",
    "fmax": "maximum", "fmin": "minimum",
}
#: ops outside the vocabulary, costed as a vocabulary kernel moving the same bytes (counted as approximated)
_APPROX_CHEAP_UNARY = frozenset(("abs", "clamp", "clamp_min", "clamp_max", "clip", "square", "floor", "ceil",
                                 "round", "trunc", "frac", "sign", "sgn", "nan_to_num", "hardtanh", "relu6",
                                 "hardsigmoid", "hardswish", "leaky_relu", "threshold", "positive", "fill",
                                 "zero"))
_APPROX_TRANSCENDENTAL = frozenset(("cos", "sin", "tan", "acos", "asin", "atan", "cosh", "sinh", "log", "log2",
                                    "log10", "log1p", "expm1", "exp2", "erf", "erfc", "erfinv", "reciprocal",
                                    "softplus", "mish", "elu", "selu", "celu", "logit", "glu", "sinc",
                                    "log_sigmoid", "log_sigmoid_forward", "prelu", "_prelu_kernel"))
_APPROX_BINARY = frozenset(("atan2", "remainder", "fmod", "floor_divide", "lerp", "addcmul", "addcdiv",
                            "hypot", "xlogy", "copysign", "heaviside", "bitwise_left_shift",
                            "bitwise_right_shift"))
_COMPARISONS = frozenset(("eq", "ne", "lt", "le", "gt", "ge", "greater", "less", "greater_equal",
                          "less_equal", "not_equal", "logical_and", "logical_or", "logical_xor",
                          "logical_not", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
                          "isnan", "isinf", "isfinite", "isclose", "signbit", "isneginf", "isposinf"))
_GATHERS = frozenset(("index", "_unsafe_index", "gather", "index_select", "take_along_dim", "take", "masked_select"))
_REGRESSION_LOSSES = frozenset(("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                                "binary_cross_entropy_with_logits", "soft_margin_loss", "kl_div"))
_NLL = frozenset(("nll_loss", "nll_loss_nd", "nll_loss_forward", "nll_loss2d", "nll_loss2d_forward"))
_SOFTMAX = frozenset(("softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax"))
_SDPA = frozenset(("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                   "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu",
                   "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
                   "_scaled_dot_product_fused_attention_overrideable"))
_DROPOUT = frozenset(("dropout", "native_dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"))
_CONV = frozenset(("convolution", "_convolution", "conv2d", "conv1d", "conv3d", "conv_transpose1d",
                   "conv_transpose2d", "conv_transpose3d"))
_LAYERNORM = frozenset(("layer_norm", "native_layer_norm"))
_RMSNORM = frozenset(("rms_norm", "_fused_rms_norm"))
#: batch norm (ops._batch_norm): ``batch_norm`` as torch.export keeps it, and the forms a decomposition leaves
_BATCHNORM = frozenset(("batch_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                        "_native_batch_norm_legit_no_training", "_batch_norm_with_update",
                        "_batch_norm_with_update_functional", "_batch_norm_no_update", "cudnn_batch_norm"))
#: batch norm overloads that always use the batch statistics / never do (the others read their ``training`` argument)
_BATCHNORM_TRAINING = frozenset(("_batch_norm_with_update", "_batch_norm_with_update_functional"))
_BATCHNORM_INFERENCE = frozenset(("_native_batch_norm_legit_no_training", "_batch_norm_no_update"))
_GROUPNORM = frozenset(("group_norm", "native_group_norm"))
#: ops whose output stays inside the attention core when an input is in it (Q K^T ... P V)
_ATTN_PROPAGATE = (frozenset(_ELEMENTWISE) | _SOFTMAX | _DROPOUT | _VIEWS | _RESHAPES | _COPIES
                   | _APPROX_CHEAP_UNARY | _APPROX_TRANSCENDENTAL | frozenset(("contiguous", "to", "type_as")))
_GEMMS = frozenset(("linear", "addmm", "mm", "matmul", "bmm", "baddbmm", "einsum"))
_NO_KERNEL = frozenset(("_assert_tensor_metadata", "_assert_scalar", "sym_size", "sym_stride", "sym_numel",
                        "sym_storage_offset", "_assert_async", "sym_constrain_range", "sym_constrain_range_for_size",
                        "_functional_assert_async", "_functional_sym_constrain_range", "set_", "resize_",
                        "_local_scalar_dense", "item", "dim", "size", "stride", "numel"))


def _first_wins(*groups: tuple) -> dict[str, str]:
    """``{packet: handler}`` from ``(packets, handler)`` groups in priority order; a packet in several groups keeps
    the first group's handler."""
    table: dict[str, str] = {}
    for ops, handler in groups:
        for op in ops:
            table.setdefault(op, handler)
    return table


#: ATen overload packet -> the ``_Ops`` handler that maps it (in priority order: ``_to_copy`` is a cast before it
#: is a copy, ``cat`` a multi-input copy, ``copy`` a write into its destination). A packet not here is costed by the
#: roofline and counted in ``meta["unmapped_ops"]``. ``tril``/``triu`` (a mask off the gradient path: no kernel)
#: and ``max``/``min`` (a reduction, or the elementwise ``.other`` overload) decide in their handler.
RULES = _first_wins(
    (_VIEWS, "_view"),
    ((*_RESHAPES, "contiguous"), "_reshape"),
    (("to", "type_as", "_to_copy"), "_cast"),
    (_CREATION, "_creation"),
    (("tril", "triu"), "_triangular"),
    (_GEMMS, "_gemm"),
    (("embedding",), "_embedding"),
    ((*_LAYERNORM, *_RMSNORM), "_norm"),
    (_BATCHNORM, "_batch_norm"),
    (_GROUPNORM, "_group_norm"),
    (_SOFTMAX, "_softmax"),
    (_SDPA, "_attention"),
    (("cross_entropy_loss",), "_cross_entropy"),
    (_NLL, "_nll"),
    (_REGRESSION_LOSSES, "_regression_loss"),
    (_DROPOUT, "_dropout"),
    ((*_ELEMENTWISE, *_COMPARISONS, *_APPROX_CHEAP_UNARY, *_APPROX_TRANSCENDENTAL, *_APPROX_BINARY), "_elementwise"),
    (_MULTI_INPUT_COPIES, "_concat"),
    (("copy",), "_copy_into"),
    (_COPIES, "_copy"),
    (_GATHERS, "_gather"),
    (_REDUCTIONS, "_reduction"),
    (("max", "min"), "_max_min"),
    (_CONV, "_conv"),
)


def _dtype_name(d: torch.dtype) -> str | None:
    return _TORCH_DTYPE_NAMES.get(d) or _OTHER_DTYPE_NAMES.get(d)


def _packet(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        name = target.overloadpacket.__name__
    elif isinstance(target, torch._ops.OpOverloadPacket):
        name = target.__name__
    else:
        name = getattr(target, "__name__", str(target))
    # in-place variants (add_, copy_, masked_fill_) map like the op; dunders stay as they are
    return name[:-1] if name.endswith("_") and not name.endswith("__") and len(name) > 1 else name


def _op_label(target: Any) -> str:
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    return getattr(target, "__name__", str(target))


def _overload(node: torch.fx.Node) -> str:
    return getattr(node.target, "_overloadname", "")
