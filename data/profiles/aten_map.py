"""aten operator (with the profiler's ``Input Dims`` / ``Input type``) -> wattcast op, NeuSight shape, dtype.

Shape convention: ``wattcast.data.kernel_ops`` (bmm/linear B,M,N,K with N the contraction dim; vector ops B,H
with H the last / normalised dim). ``Input Dims`` are logical sizes, so a transposed operand (``x.t()``) already
shows its transposed shape: ``aten::mm`` of [M,K] by [K,N] is always (M x K)(K x N), whatever the strides.
"""

from __future__ import annotations

import math

#: profiler ``Input type`` strings -> wattcast dtype (None = a dtype no surrogate covers)
TORCH_DTYPES = {
    "float": "fp32", "c10::float": "fp32", "float32": "fp32", "torch.float32": "fp32", "Float": "fp32",
    "c10::Half": "fp16", "Half": "fp16", "half": "fp16", "float16": "fp16", "torch.float16": "fp16",
    "c10::BFloat16": "bf16", "BFloat16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "Float8_e4m3fn": "fp8", "Float8_e5m2": "fp8",
}
#: bytes per element of the dtypes collectives carry (record_param_comms ``dtype``)
ELEM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "double": 8, "Double": 8, "Long": 8, "Int": 4,
              "Byte": 1, "Char": 1, "Bool": 1, "int8_t": 1, "uint8_t": 1, "int": 4, "long": 8, "float": 4}

_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "pow": "pow"}
_UNARY = {"relu": "relu", "gelu": "gelu", "tanh": "tanh", "sigmoid": "sigmoid", "silu": "silu", "exp": "exp",
          "neg": "neg", "sqrt": "sqrt", "rsqrt": "rsqrt", "clamp_min": "relu", "threshold": "relu"}
GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear")


def _base(name: str) -> str:
    """``aten::add_`` -> ``add`` (namespace and in-place underscore removed)."""
    n = name.split("::", 1)[-1]
    return n[:-1] if n.endswith("_") and not n.endswith("__") else n


def _numel(dims) -> int:
    return int(math.prod(int(d) for d in dims)) if dims else 1


def _is_tensor(dims, typ) -> bool:
    """A tensor operand: a non-empty list of ints (a TensorList is a list of lists and is skipped)."""
    return (isinstance(dims, list) and len(dims) > 0 and typ not in ("Scalar", "ScalarList", "", "TensorList", "GenericList")
            and all(isinstance(d, int) and not isinstance(d, bool) for d in dims))


def _broadcast(shapes: list[list[int]]) -> list[int] | None:
    nd = max(len(s) for s in shapes)
    out = []
    for i in range(1, nd + 1):
        ds = {s[-i] for s in shapes if len(s) >= i and s[-i] != 1}
        if len(ds) > 1:
            return None
        out.append(ds.pop() if ds else 1)
    return out[::-1]


def _vec(dims: list[int], h: int | None = None) -> dict:
    h = int(dims[-1]) if h is None else int(h)
    n = _numel(dims)
    return {"B": n // h if h else 0, "H": h}


def map_aten(name: str, dims, types, concrete=None) -> tuple[str, dict, str, str]:
    """(OPName, shape columns, dtype, reason). OPName '' with a reason when the op cannot be mapped."""
    if not name.startswith("aten::"):
        return "", {}, "", f"{name!r} is not an aten op"
    if dims is None:
        return "", {}, "", "no Input Dims (trace recorded without record_shapes=True)"
    types = list(types or [""] * len(dims))
    types += [""] * (len(dims) - len(types))
    base = _base(name)
    tensors = [(list(map(int, d)), t) for d, t in zip(dims, types) if _is_tensor(d, t)]
    dts = [TORCH_DTYPES.get(t) for _, t in tensors]
    dtype = next((d for d in dts if d), None)
    if tensors and dtype is None:
        return "", {}, "", f"{name}: input type {tensors[0][1]!r} has no surrogate (fp32/tf32/fp16/bf16/fp8 only)"
    if base.endswith("_backward") or "backward" in base:
        return "", {}, dtype or "", f"{name}: backward op has no wattcast op class"
    if base in GEMM_OPS:
        return _gemm(name, base, dims, tensors, dtype)
    if base in ("_softmax", "softmax", "_log_softmax", "log_softmax"):
        if not tensors:
            return "", {}, "", f"{name}: no tensor input"
        x = tensors[0][0]
        dim = -1
        if concrete and len(concrete) > 1 and str(concrete[1]).lstrip("-").isdigit():
            dim = int(concrete[1])
        return "softmax", _vec(x, x[dim] if x else 1), dtype, ""
    if base in ("native_layer_norm", "layer_norm"):
        if not tensors:
            return "", {}, "", f"{name}: no tensor input"
        x = tensors[0][0]
        w = tensors[1][0] if len(tensors) > 1 else [x[-1]]
        return "ln", _vec(x, _numel(w)), dtype, ""
    if base in ("_fused_rms_norm", "rms_norm"):
        if not tensors:
            return "", {}, "", f"{name}: no tensor input"
        x = tensors[0][0]
        w = tensors[1][0] if len(tensors) > 1 else [x[-1]]
        return "rmsnorm", _vec(x, _numel(w)), dtype, ""
    if base == "copy":
        if not tensors:
            return "", {}, "", f"{name}: no tensor input"
        return "copy", _vec(tensors[0][0] or [1]), dtype, ""
    if base in _BINARY:
        if not tensors:
            return "", {}, "", f"{name}: no tensor input"
        shapes = [t[0] for t in tensors[:2]]
        if len(tensors) >= 2 and all(len(s) for s in shapes):
            out = _broadcast(shapes)
            if out is None:
                return "", {}, dtype, f"{name}: input dims {shapes} do not broadcast"
            return _BINARY[base], _vec(out), dtype, ""
        big = max(shapes, key=_numel)
        return _BINARY[base] + "u", _vec(big or [1]), dtype, ""
    if base in _UNARY:
        if not tensors:
            return "", {}, "", f"{name}: no tensor input"
        return _UNARY[base], _vec(tensors[0][0] or [1]), dtype, ""
    return "", {}, dtype or "", f"no wattcast op class for {name}"


def _gemm(name, base, dims, tensors, dtype):
    shp = [t[0] for t in tensors]
    bad = ("", {}, dtype, f"{name}: operand dims {shp} are not a matrix product")
    if base == "mm":
        if len(shp) < 2 or len(shp[0]) != 2 or len(shp[1]) != 2 or shp[0][1] != shp[1][0]:
            return bad
        (m, k), (_, n) = shp[0], shp[1]
        return "bmm", {"B": 1, "M": m, "N": k, "K": n}, dtype, ""
    if base == "addmm":  # (bias, mat1, mat2, beta, alpha): the bias comes first
        if len(shp) < 3 or len(shp[1]) != 2 or len(shp[2]) != 2 or shp[1][1] != shp[2][0]:
            return bad
        (m, k), (_, n) = shp[1], shp[2]
        return "linear", {"B": 1, "M": m, "N": k, "K": n}, dtype, ""
    if base in ("bmm", "baddbmm"):
        a, b = (shp[0], shp[1]) if base == "bmm" else (shp[1], shp[2]) if len(shp) >= 3 else ([], [])
        if len(a) != 3 or len(b) != 3 or a[2] != b[1] or a[0] != b[0]:
            return bad
        return "bmm", {"B": a[0], "M": a[1], "N": a[2], "K": b[2]}, dtype, ""
    if base == "linear":  # (input, weight[out,in], bias?)
        if len(shp) < 2 or len(shp[1]) != 2 or not shp[0] or shp[0][-1] != shp[1][1]:
            return bad
        x, w = shp[0], shp[1]
        op = "linear" if len(shp) >= 3 else "bmm"
        return op, {"B": 1, "M": _numel(x[:-1]), "N": x[-1], "K": w[0]}, dtype, ""
    # matmul: 2-D x 2-D, or batched 3-D x 3-D / 3-D x 2-D
    if len(shp) < 2:
        return bad
    a, b = shp[0], shp[1]
    if len(a) >= 2 and len(b) == 2 and a[-1] == b[0]:
        return "bmm", {"B": 1, "M": _numel(a[:-1]), "N": a[-1], "K": b[1]}, dtype, ""
    if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        return "bmm", {"B": a[0], "M": a[1], "N": a[2], "K": b[2]}, dtype, ""
    return bad
