"""Import an ONNX model as a forward :class:`~wattcast.featurize.op_graph.OpGraph`.

:func:`graph_from_onnx` walks the ONNX graph once (O(nodes)) and records one
:class:`~wattcast.featurize.op_graph.GraphBuilder` call per kernel, so
:func:`wattcast.featurize.training_graph.training_graph` can derive the training step from the result.

Only shapes are needed, never weight values: the file is read with ``load_external_data=False`` (weights
in a missing external-data file are fine), symbolic input dims are bound from ``batch``/``seq``/``dims``
and ``onnx.shape_inference`` fills in every intermediate shape (what it misses -- shape arithmetic it
cannot propagate -- is folded here with the ONNX reference ops on the small constant tensors).

Mapping (ONNX op -> builder call):

- MatMul with an initializer operand -> ``linear`` (a following ``Add`` of a 1-D initializer is fused as
  its bias); MatMul of two activations -> ``matmul``; Gemm -> ``linear`` (``transB``, bias = ``C``);
- Conv: 2-D, square input and kernel, one group, symmetric padding, no dilation -> ``conv2d``; any
  other Conv / ConvTranspose -> ``opaque`` conv roofline with its real FLOPs;
- elementwise ops -> ``elementwise`` with the nearest vocabulary kernel (Add/Sub/Mul/Div/Pow, Relu, Tanh,
  Sigmoid, Exp, Sqrt, Neg, Gelu/FastGelu/BiasGelu; Reciprocal -> ``divu``; Erf, Sin, Cos -> ``tanh``;
  Where/Max/Min -> ``where``/``maximum``/``minimum`` (costed as ``add``); comparisons -> ``sub``, no
  gradient); an Erf-based GELU subgraph (x/sqrt2 -> Erf -> +1 -> *x -> *0.5) collapses into one ``gelu``;
  Cast -> ``copy`` when it changes the dtype, free otherwise;
- LayerNormalization / SimplifiedLayerNormalization / RMSNormalization (and the decomposed
  ReduceMean-Sub-Pow-ReduceMean-Add-Sqrt-Div[-Mul-Add] LayerNorm and Pow-ReduceMean-Add-Sqrt-Div|Mul
  RMSNorm patterns) -> ``layernorm``; Softmax / LogSoftmax -> ``softmax``;
- Gather of an initializer -> ``embedding``; Gather of activations -> ``copy`` of the gathered size;
- Transpose, Concat, Slice, Split, Expand, Tile, Pad, ... -> ``copy``; Reshape, Squeeze, Unsqueeze,
  Flatten, Identity -> free views; Shape, Constant, ConstantOfShape and anything computed from constants
  only -> no kernel (an inference runtime folds them);
- ReduceMean / ReduceSum / ReduceMax ..., pooling, ArgMax, TopK, CumSum -> ``reduction``;
  BatchNormalization -> one per-channel ``mul``; Group/InstanceNormalization -> ``layernorm`` over the
  group; Dropout -> ``dropout`` (train mode only); Einsum -> ``opaque`` with its FLOPs;
- com.microsoft fused ops: SkipLayerNormalization / SkipSimplifiedLayerNormalization -> ``add`` +
  ``layernorm``; FusedMatMul -> ``linear``/``matmul``; FastGelu, BiasGelu, QuickGelu, BiasAdd -> ``elementwise``;
- the attention core (MatMul -> (Div|Mul) -> (Add|Where mask) -> Softmax -> (Dropout) -> MatMul) is
  tagged ``attn_core``; an opset-23 ``Attention`` op -> ``flash_attention``;
- control flow (``Loop``, ``If``, ``Scan``: any node with a subgraph) -> :class:`GraphError` naming the node, its
  trip count and its body: its subgraph is not costed, and one tiny op in its place would be a silently wrong step;
- any other op -> ``opaque`` (0 FLOPs, bytes from its input/output shapes: costed by the roofline and
  flagged) and counted in ``graph.meta["unmapped_ops"]``.

Parameters are the float initializers an op uses as weights (GEMM/conv/embedding/norm weights, biases
and other vectors added or multiplied into activations), each counted once: tied weights (an LM head
reusing the embedding table, also when the exporter stored it as a transposed copy) are recognised from
the ``torch.onnx`` node metadata or, when the weight values are in the file, by comparing the values.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from wattcast.data.kernel_ops import DTYPE_BYTES, canonical_dtype
from wattcast.featurize.op_graph import GraphBuilder, GraphError, OpGraph, Tensor

__all__ = ["graph_from_onnx", "BATCH_DIM_NAMES", "SEQ_DIM_NAMES"]

#: symbolic input dims bound to ``batch`` / ``seq`` (compared lower-case)
BATCH_DIM_NAMES = frozenset({"batch", "batch_size", "batchsize", "bs", "n", "b", "batch_dim", "dynamic_batch"})
SEQ_DIM_NAMES = frozenset({"sequence", "seq", "seq_len", "seqlen", "seq_length", "sequence_length", "s", "t",
                           "num_tokens", "tokens"})

# ONNX TensorProto element types
_FLOAT_TYPES = {1: "fp32", 10: "fp16", 16: "bf16", 11: "fp32"}  # FLOAT, FLOAT16, BFLOAT16, DOUBLE
_ELEM_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2, 17: 1, 18: 1, 19: 1, 20: 1}
_INT_NAMES = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool", 12: "uint32", 13: "uint64"}

_LAYER_RE = re.compile(r"(?:^|[./_])(?:h|layers|layer|blocks|block)[._](\d+)(?=$|[./_])")

#: elementwise ONNX ops -> builder elementwise op (vocabulary of wattcast.data.kernel_ops, costed there)
_UNARY = {
    "Relu": "relu", "LeakyRelu": "relu", "Abs": "relu", "Sign": "relu", "Floor": "relu", "Ceil": "relu",
    "Round": "relu", "Clip": "relu", "ThresholdedRelu": "relu", "Shrink": "relu",
    "Tanh": "tanh", "Erf": "tanh", "Sin": "tanh", "Cos": "tanh", "Tan": "tanh", "Atan": "tanh", "Asin": "tanh",
    "Acos": "tanh", "Sinh": "tanh", "Cosh": "tanh",
    "Sigmoid": "sigmoid", "HardSigmoid": "sigmoid", "Exp": "exp", "Log": "exp", "Elu": "exp", "Selu": "exp",
    "Celu": "exp", "Softplus": "exp", "Mish": "silu", "HardSwish": "silu", "Swish": "silu",
    "Sqrt": "sqrt", "Reciprocal": "divu", "Softsign": "divu", "Neg": "neg",
    "Gelu": "gelu", "FastGelu": "gelu", "BiasGelu": "gelu", "QuickGelu": "gelu",
    "IsNaN": "relu", "IsInf": "relu", "Not": "relu",
}
_BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Mod": "div", "PRelu": "mul",
    "Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add", "BiasAdd": "add",
    "Where": "where",
    "Equal": "sub", "Less": "sub", "Greater": "sub", "LessOrEqual": "sub", "GreaterOrEqual": "sub",
    "And": "mul", "Or": "add", "Xor": "add", "BitwiseAnd": "mul", "BitwiseOr": "add", "BitwiseXor": "add",
}
_BOOL_OUT = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "IsNaN", "IsInf"}
#: ops whose float initializer operand is a learned parameter (bias, scale, position table, slope)
_PARAM_ARITH = {"Add", "Sub", "Mul", "Div", "PRelu", "BiasAdd", "FastGelu", "BiasGelu"}
_VIEW_OPS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}
_COPY_OPS = {"Transpose", "Concat", "Slice", "Split", "Expand", "Tile", "Pad", "GatherElements", "GatherND",
             "ScatterND", "ScatterElements", "Scatter", "Resize", "Upsample", "DepthToSpace", "SpaceToDepth",
             "Trilu", "OneHot", "ReverseSequence", "Compress", "CenterCropPad"}
_REDUCE_OPS = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
               "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin", "CumSum", "TopK",
               "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool"}
_NO_GRAD = {"ArgMax", "ArgMin"}
#: ops with outputs known once all shapes are bound (no kernel at inference time)
_ALWAYS_STATIC = {"Shape", "Size", "Constant"}
#: ops that must never be treated as constant-foldable even without activation inputs
_NEVER_STATIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                 "Bernoulli", "If", "Loop", "Scan"}
_DEFAULT_DOMAINS = ("", "ai.onnx")
#: a handler meeting shapes it cannot cost raises one of these; the op is then costed by the roofline
_HANDLER_ERRORS = (GraphError, ValueError, IndexError, TypeError, KeyError, ZeroDivisionError)
#: largest constant (elements) the importer computes while folding shape arithmetic
_FOLD_LIMIT = 1 << 16
#: constant-folded ops whose output still holds the values (a parameter) of its float inputs:
#: a transposed / reshaped / concatenated / scaled weight; not cos(positions * inv_freq)
_SOURCE_OPS = {"Identity", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Cast", "CastLike", "Concat",
               "Split", "Slice", "Gather", "Expand", "Tile", "Mul", "Div", "Add", "Sub", "Neg"}


@dataclass(frozen=True)
class _Static:
    """A value known before the run: initializers, constants, shapes, and anything computed from them only."""

    shape: tuple[int | None, ...] | None
    sources: frozenset  # float initializers it was computed from (parameter candidates)
    elem: int  # ONNX element type (0 = unknown)


class _Builder(GraphBuilder):
    """GraphBuilder plus the three hooks an importer of arbitrary graphs needs (see the report)."""

    def own_params(self, t: Tensor, n: int) -> None:
        """Attribute ``n`` (possibly negative) more parameters to the node that produced ``t``."""
        if n == 0:
            return
        if t.node < 0:
            raise GraphError("parameters must belong to a kernel")
        self._nodes[t.node].values["param_count"] += int(n)
        self.add_params(n)

    def link(self, t: Tensor, inputs: Iterable[Tensor]) -> None:
        """Add data-dependency edges from ``inputs`` to the node that produced ``t``."""
        if t.node < 0:
            return
        ins = self._nodes[t.node].inputs
        for x in inputs:
            if x.node >= 0 and x.node not in ins and x.node != t.node:
                ins.append(x.node)

    def mark(self) -> tuple:
        return len(self._nodes), len(self._tensor_bytes), self.param_count, self.param_bytes

    def rollback(self, mark: tuple) -> None:
        """Forget the kernels recorded since ``mark`` (a handler that failed half-way)."""
        n_nodes, n_tensors, self.param_count, self.param_bytes = mark
        del self._nodes[n_nodes:]
        del self._tensor_bytes[n_tensors:]

    def alias(self, shape: Sequence[int], dtype: str, node: int) -> Tensor:
        """A further output of the kernel ``node`` (or a stand-in of another shape for ``node``'s output)."""
        return self._tensor(shape, dtype, node)


# ---------------------------------------------------------------------------------------------- loading
def _load(path_or_model):
    import onnx

    if isinstance(path_or_model, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(path_or_model)
        where = "model"
        base = None
    elif isinstance(path_or_model, (bytes, bytearray)):
        model = onnx.ModelProto()
        try:
            model.ParseFromString(bytes(path_or_model))
        except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError / RuntimeWarning subclasses
            raise GraphError(f"the bytes given are not an ONNX model ({type(e).__name__})") from None
        where = "bytes"
        base = None
    else:
        p = Path(path_or_model)
        if not p.exists():
            raise GraphError(f"ONNX file not found: {p}")
        if p.is_dir():
            raise GraphError(f"{p} is a directory; pass the path of the .onnx file")
        try:
            model = onnx.load(str(p), load_external_data=False)
        except Exception as e:  # noqa: BLE001
            raise GraphError(f"{p} is not a readable ONNX model (corrupt or truncated file?): "
                             f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}".rstrip(": ")) from None
        where = str(p)
        base = p
    if model.ir_version <= 0 or not model.HasField("graph") or not len(model.opset_import):
        raise GraphError(f"{where} is not an ONNX model (no graph / IR version / opset: corrupt or truncated file?)")
    return model, where, base


def _dim_expr(expr: str, env: dict[str, int]) -> int | None:
    """Evaluate a symbolic dim like ``2*s0`` or ``seq + 1`` once its names are bound (else None)."""
    if expr in env:
        return env[expr]
    if not re.fullmatch(r"[\w\s+\-*/()]+", expr):
        return None
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return None
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Div: operator.floordiv}

    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name):
            if n.id not in env:
                raise KeyError(n.id)
            return env[n.id]
        if isinstance(n, ast.BinOp) and type(n.op) in ops:
            return ops[type(n.op)](ev(n.left), ev(n.right))
        raise KeyError(type(n).__name__)

    try:
        v = int(ev(tree))
    except (KeyError, ZeroDivisionError):
        return None
    return v if v >= 0 else None


def _fixed_batch_seq(model) -> dict[str, int | None]:
    """Batch and sequence length of a graph exported with fixed input dims, where the first input says them:
    its fixed axis 0 is the batch; axis 1 is the sequence when the input is 2-D integer token ids or 3-D
    (batch, sequence, hidden) activations."""
    init_names = {t.name for t in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in init_names or not inp.type.HasField("tensor_type") or not inp.type.tensor_type.HasField("shape"):
            continue
        tt = inp.type.tensor_type
        d = [x.dim_value if x.HasField("dim_value") else None for x in tt.shape.dim]
        ints = tt.elem_type in (6, 7)  # INT32, INT64 (see _INT_NAMES)
        return {"batch": d[0] if d else None, "seq": d[1] if (ints and len(d) == 2) or (not ints and len(d) == 3) else None}
    return {"batch": None, "seq": None}


def _bind_inputs(model, batch: int | None, seq: int | None, dims: dict[str, int] | None) -> tuple[dict[str, int], set[str]]:
    """Give every symbolic graph-input dim a value (in place): the name -> value bindings, options used."""
    dims = dict(dims or {})
    init_names = {t.name for t in model.graph.initializer}
    env: dict[str, int] = {}
    used: set[str] = set()
    used_names = {i for n in model.graph.node for i in n.input}
    for inp in model.graph.input:
        if inp.name in init_names or not inp.type.HasField("tensor_type"):
            continue
        tt = inp.type.tensor_type
        if not tt.HasField("shape"):
            if inp.name in used_names:
                raise GraphError(f"input {inp.name!r} has no shape in the model (unknown rank); "
                                 f"re-export the model with input shapes")
            continue
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                continue
            p = d.dim_param if d.HasField("dim_param") else ""
            key = f"{inp.name}:{axis}"
            low = p.strip().lower()
            if p and p in env:
                v = env[p]
            elif p and p in dims:
                v = dims[p]
            elif key in dims:
                v = dims[key]
            elif p and low in BATCH_DIM_NAMES:
                if batch is None:
                    raise GraphError(f"input {inp.name!r} dim {axis} is the symbolic batch dim {p!r}; pass batch=... (--batch)")
                v = batch
                used.add("batch")
            elif p and low in SEQ_DIM_NAMES:
                if seq is None:
                    raise GraphError(f"input {inp.name!r} dim {axis} is the symbolic sequence dim {p!r}; pass seq=... (--seq)")
                v = seq
                used.add("seq")
            elif p and _dim_expr(p, env) is not None:
                v = _dim_expr(p, env)
            else:
                what = f"symbolic dim {p!r}" if p else "an unnamed dynamic dim"
                hint = (f"dims={{{p!r}: ...}} (--dim {p}=VALUE)" if p else f"dims={{{key!r}: ...}} (--dim {key}=VALUE)")
                raise GraphError(f"input {inp.name!r} dim {axis} is {what} with no value; pass {hint}")
            v = int(v)
            if v <= 0:
                raise GraphError(f"input {inp.name!r} dim {axis} ({p or key}) must be positive, got {v}")
            if p:
                env[p] = v
            d.Clear()
            d.dim_value = v
    # the same names in value_info / outputs (custom ops keep the exporter's shapes)
    for vi in [*model.graph.value_info, *model.graph.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param"):
                    v = _dim_expr(d.dim_param, env)
                    if v is not None:
                        d.Clear()
                        d.dim_value = v
    return env, used


def _declare_shape_only_weights(model) -> int:
    """Weights a file names only in ``value_info`` (e.g. a meta-device export): declare them as empty
    initializers with their dims, so the rest of the importer treats them as any weight. Returns how many."""
    from onnx import TensorProto

    g = model.graph
    known = {o for n in g.node for o in n.output} | {i.name for i in g.input} | {t.name for t in g.initializer} | {
        t.values.name for t in g.sparse_initializer}
    vi = {v.name: v for v in g.value_info}
    added = 0
    for n in g.node:
        for i in n.input:
            if not i or i in known or i not in vi:
                continue
            tt = vi[i].type.tensor_type
            if not tt.HasField("shape") or not all(d.HasField("dim_value") for d in tt.shape.dim):
                continue
            t = TensorProto(name=i, data_type=tt.elem_type, dims=[d.dim_value for d in tt.shape.dim])
            for p in vi[i].metadata_props:
                t.metadata_props.add(key=p.key, value=p.value)
            g.initializer.append(t)
            known.add(i)
            added += 1
    return added


def _is_buffer(t) -> bool:
    """A ``torch.export`` buffer or constant (not a parameter), per the exporter's metadata."""
    return any(p.key.endswith("InputSpec.kind") and p.value in ("BUFFER", "CONSTANT_TENSOR", "CUSTOM_OBJ")
               for p in t.metadata_props)


def _numel_dims(dims) -> int:
    return int(math.prod(int(d) for d in dims)) if len(dims) else 1


def _tied_by_value(model) -> dict[str, str]:
    """Initializers whose values equal an embedding table (or its transpose): ``copy -> table`` names.

    Only initializers of the table's (transposed) shape are compared, and only when the values are in the
    file, so this costs one pass over the few candidate tensors.
    """
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}

    def has_data(t):
        return t.data_location != 1 and (len(t.raw_data) or len(t.float_data) or len(t.int32_data))

    tables = []
    for n in model.graph.node:
        if n.op_type == "Gather" and n.input and n.input[0] in inits:
            t = inits[n.input[0]]
            if len(t.dims) == 2 and t.data_type in _FLOAT_TYPES and has_data(t):
                tables.append(t)
    out: dict[str, str] = {}
    for tab in {t.name: t for t in tables}.values():
        v, d = tab.dims
        cands = [t for t in model.graph.initializer if t.name != tab.name and t.data_type == tab.data_type
                 and list(t.dims) in ([d, v], [v, d]) and has_data(t)]
        if not cands:
            continue
        try:
            a = numpy_helper.to_array(tab)
        except Exception:  # noqa: BLE001
            continue
        for c in cands:
            try:
                b = numpy_helper.to_array(c)
            except Exception:  # noqa: BLE001
                continue
            if (b.shape == a.shape and np.array_equal(a, b)) or (b.shape == a.T.shape and np.array_equal(a.T, b)):
                out[c.name] = tab.name
    return out


def _small_constants(model) -> dict[str, np.ndarray]:
    """Values of small initializers and Constant nodes (scalars, exponents, dropout ratios, shapes)."""
    from onnx import numpy_helper

    vals: dict[str, np.ndarray] = {}
    for t in model.graph.initializer:
        if _numel_dims(t.dims) <= 64 and t.data_location != 1:
            try:
                vals[t.name] = numpy_helper.to_array(t)
            except Exception:  # noqa: BLE001 - missing data: value unknown
                pass
    for n in model.graph.node:
        if n.op_type == "Constant" and n.domain in _DEFAULT_DOMAINS and n.output:
            for a in n.attribute:
                try:
                    if a.name == "value" and _numel_dims(a.t.dims) <= 64:
                        vals[n.output[0]] = numpy_helper.to_array(a.t)
                    elif a.name == "value_float":
                        vals[n.output[0]] = np.array(a.f, dtype=np.float32)
                    elif a.name == "value_floats":
                        vals[n.output[0]] = np.array(list(a.floats), dtype=np.float32)
                    elif a.name == "value_int":
                        vals[n.output[0]] = np.array(a.i, dtype=np.int64)
                    elif a.name == "value_ints":
                        vals[n.output[0]] = np.array(list(a.ints), dtype=np.int64)
                except Exception:  # noqa: BLE001
                    pass
    return vals


def _strip_weights(model) -> None:
    """Drop large float initializer values (shape inference needs dims only)."""
    for t in model.graph.initializer:
        if t.data_type in _FLOAT_TYPES and _numel_dims(t.dims) > 64:
            for f in ("raw_data", "float_data", "double_data", "int32_data"):
                t.ClearField(f)
            t.data_location = 0
            del t.external_data[:]


def _infer(model):
    import onnx

    for kw in (dict(data_prop=True), dict()):
        try:
            return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, **kw), None
        except Exception as e:  # noqa: BLE001 - inference is best effort; importer falls back per op
            err = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return model, err


def _topo_order(graph) -> list:
    """The nodes in a valid execution order (ONNX requires it; some exporters do not comply)."""
    nodes = list(graph.node)
    known = {t.name for t in graph.initializer} | {t.name for t in graph.sparse_initializer} | {i.name for i in graph.input}
    have = set(known)
    ok = True
    for n in nodes:
        if any(i and i not in have for i in n.input):
            ok = False
            break
        have.update(o for o in n.output if o)
    if ok:
        return nodes
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    indeg = [0] * len(nodes)
    users: list[list[int]] = [[] for _ in nodes]
    for k, n in enumerate(nodes):
        for i in {i for i in n.input if i}:
            if i in producer:
                indeg[k] += 1
                users[producer[i]].append(k)
            elif i not in known:
                raise GraphError(f"malformed ONNX graph: input {i!r} of node {n.name or n.op_type!r} is produced by no node, "
                                 f"initializer or graph input (truncated file?)")
    ready = deque(k for k in range(len(nodes)) if indeg[k] == 0)
    order = []
    while ready:
        k = ready.popleft()
        order.append(k)
        for u in users[k]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    if len(order) != len(nodes):
        raise GraphError("malformed ONNX graph: the nodes form a cycle")
    return [nodes[k] for k in order]


def _sanitize(name: str) -> str:
    """The ``torch.export`` placeholder of a parameter name (``h.0.attn.weight`` -> ``p_h_0_attn_weight``)."""
    return "p_" + re.sub(r"[^0-9A-Za-z_]", "_", name)


def _attr(node, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            import onnx

            v = onnx.helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return default


# ---------------------------------------------------------------------------------------------- importer
class _Importer:
    def __init__(self, model, *, dtype: str | None, train: bool, name: str, tied: dict[str, str],
                 consts: dict[str, np.ndarray]):
        self.model = model
        g = model.graph
        self.g = g
        self.nodes = _topo_order(g)
        self.opset = max((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), default=13)
        self.consts = consts
        # initializers: shapes, element types
        self.inits: dict[str, _Static] = {}
        self.init_numel: dict[str, int] = {}
        for t in g.initializer:
            nm = t.name
            shape = tuple(int(d) for d in t.dims)
            isf = t.data_type in _FLOAT_TYPES and not _is_buffer(t)
            self.inits[nm] = _Static(shape, frozenset({nm}) if isf else frozenset(), t.data_type)
            self.init_numel[nm] = _numel_dims(shape)
        for s in g.sparse_initializer:
            shape = tuple(int(d) for d in s.dims)
            nm = s.values.name
            isf = s.values.data_type in _FLOAT_TYPES
            self.inits[nm] = _Static(shape, frozenset({nm}) if isf else frozenset(), s.values.data_type)
            self.init_numel[nm] = _numel_dims(shape)
        # shapes and element types of every value
        self.info: dict[str, tuple[int, tuple | None]] = {}
        for vi in [*g.input, *g.value_info, *g.output]:
            if vi.type.HasField("tensor_type"):
                tt = vi.type.tensor_type
                shape = None
                if tt.HasField("shape"):
                    shape = tuple(int(d.dim_value) if d.HasField("dim_value") else None for d in tt.shape.dim)
                self.info[vi.name] = (tt.elem_type, shape)
        for nm, s in self.inits.items():
            self.info[nm] = (s.elem, s.shape)
        self.dtype = canonical_dtype(dtype) if dtype else self._model_dtype()
        self.b = _Builder(self.dtype, train=train, name=name)
        # bookkeeping
        self.vals: dict[str, Tensor | _Static] = {}
        self.rg: dict[str, bool] = {}  # requires grad (on the parameter-gradient path)
        self.counted: set[str] = set()
        self.claim_log: list[str] = []  # counted keys in claim order (to undo a failed handler)
        self.alias_key: dict[str, str] = {k: _sanitize(v) for k, v in tied.items()}
        self.unmapped: dict[str, int] = {}
        self.fallback: dict[str, int] = {}
        self.warnings: list[str] = []
        self.unknown_shapes = 0
        self.static_names: set[str] = set()
        self.consumers: dict[str, list[int]] = {}
        self.producer: dict[str, int] = {}
        self.graph_outputs = {o.name for o in g.output}
        for k, n in enumerate(self.nodes):
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(k)
            for o in n.output:
                if o:
                    self.producer[o] = k
        self._mark_static()
        self._ref_cls: dict = {}
        for n in self.nodes:  # constant shape arithmetic, so the pattern matchers see folded scalars
            if all(o in self.static_names for o in n.output if o):
                self._fold(n)
        self.skip: set[int] = set()
        self.fused: dict[int, tuple] = {}  # anchor node -> (kind, ...) of a collapsed subgraph
        self.groups: dict[int, set[int]] = {}  # anchor node -> the nodes it stands for
        self.attn: set[int] = set()
        self.mask_adds: set[int] = set()
        self.bias_of: dict[int, int] = {}  # MatMul node -> fused bias Add node
        self._pre_gamma: dict[int, str] = {}
        self._match_patterns()
        self.layer_of, self.scope_of, self.n_layers = self._layers()

    # ------------------------------------------------------------------ model facts
    def _model_dtype(self) -> str:
        weight: dict[str, int] = {}
        for nm, s in self.inits.items():
            if s.elem in _FLOAT_TYPES and s.elem != 11:
                weight[_FLOAT_TYPES[s.elem]] = weight.get(_FLOAT_TYPES[s.elem], 0) + self.init_numel[nm]
        if not weight:
            for nm, (elem, _) in self.info.items():
                if elem in _FLOAT_TYPES and elem != 11:
                    weight[_FLOAT_TYPES[elem]] = weight.get(_FLOAT_TYPES[elem], 0) + 1
        return max(weight, key=weight.get) if weight else "fp32"

    def _is_static(self, name: str) -> bool:
        return name in self.static_names

    def _mark_static(self) -> None:
        st = set(self.inits)
        for n in self.nodes:
            default = n.domain in _DEFAULT_DOMAINS
            ins = [i for i in n.input if i]
            if default and (n.op_type in _ALWAYS_STATIC or (ins and n.op_type not in _NEVER_STATIC and all(i in st for i in ins))):
                st.update(o for o in n.output if o)
        self.static_names = st

    def _shape(self, name: str) -> tuple[int, ...] | None:
        """The fully known shape of a value, else None."""
        v = self.vals.get(name)
        if isinstance(v, Tensor):
            return v.shape
        if isinstance(v, _Static) and v.shape is not None and all(d is not None for d in v.shape):
            return tuple(v.shape)
        s = self.info.get(name, (0, None))[1]
        if s is not None and all(d is not None for d in s):
            return tuple(s)
        return None

    def _elem(self, name: str) -> int:
        v = self.vals.get(name)
        if isinstance(v, _Static) and v.elem:
            return v.elem
        return self.info.get(name, (0, None))[0]

    def _is_float(self, name: str) -> bool:
        e = self._elem(name)
        return e in _FLOAT_TYPES or e == 0

    def _tdtype(self, elem: int) -> str:
        if elem in _FLOAT_TYPES or elem == 0:
            return self.dtype
        return _INT_NAMES.get(elem, "int64")

    def _ebytes(self, elem: int) -> int:
        if elem in _FLOAT_TYPES or elem == 0:
            return DTYPE_BYTES[self.dtype]
        return _ELEM_BYTES.get(elem, 4)

    def _const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name) if name else None

    def _scalar(self, name: str, default: float | None = None) -> float | None:
        c = self._const(name)
        if c is not None and c.size == 1:
            return float(c.reshape(()))
        return default

    # ------------------------------------------------------------------ pattern matching (before emitting)
    def _sole(self, name: str) -> int | None:
        """The only consumer of ``name`` (None if it has several, or is a graph output)."""
        c = self.consumers.get(name, [])
        if len(c) != 1 or name in self.graph_outputs:
            return None
        return c[0]

    def _other(self, k: int, name: str) -> str | None:
        ins = [i for i in self.nodes[k].input if i]
        if len(ins) != 2 or name not in ins:
            return None
        return ins[1] if ins[0] == name else ins[0]

    def _static_float(self, name: str | None) -> bool:
        return bool(name) and self._is_static(name) and self._is_float(name)

    def _match_patterns(self) -> None:
        taken: set[int] = set()
        for k, n in enumerate(self.nodes):
            if k in taken or n.domain not in _DEFAULT_DOMAINS:
                continue
            got = None
            if n.op_type == "ReduceMean":
                got = self._match_ln(k)
            if got is None and n.op_type in ("Pow", "Mul"):
                got = self._match_rms(k)
            if got is None and n.op_type in ("Div", "Mul"):
                got = self._match_gelu(k)
            if got is not None:
                group, anchor, payload = got
                if group & taken:
                    continue
                taken |= group
                self.fused[anchor] = payload
                self.groups[anchor] = group
                self.skip |= group - {anchor}
        for k, n in enumerate(self.nodes):
            if n.op_type == "Softmax" and n.domain in _DEFAULT_DOMAINS and k not in taken:
                self._match_attention(k)
        for k, n in enumerate(self.nodes):  # MatMul + bias Add -> one linear kernel
            if n.op_type != "MatMul" or n.domain not in _DEFAULT_DOMAINS or k in taken or len(n.input) != 2:
                continue
            a, w = n.input
            if self._is_static(a) or not self._is_static(w) or not self._is_float(w):
                continue
            add = self._sole(n.output[0])
            if add is None or self.nodes[add].op_type != "Add" or add in taken:
                continue
            bias = self._other(add, n.output[0])
            wshape = self._shape(w)
            bshape = self._shape(bias) if bias else None
            if (wshape and len(wshape) == 2 and self._static_float(bias) and bshape is not None
                    and _numel_dims(bshape) == wshape[1] and bshape[-1:] == (wshape[1],)):
                self.bias_of[k] = add
                self.skip.add(add)
                taken |= {k, add}

    def _is_const_near(self, name: str, target: float, tol: float = 0.05) -> bool:
        v = self._scalar(name)
        return v is not None and abs(v - target) <= tol * max(1.0, abs(target))

    def _affine_tail(self, out: str, group: set[int]):
        """Optional ``* gamma (+ beta)`` after a normalisation: (final output, gamma, beta)."""
        found: dict[str, str] = {}
        for op in ("Mul", "Add"):  # the Add only after a Mul
            m = self._sole(out)
            if m is None or self.nodes[m].op_type != op:
                break
            other = self._other(m, out)
            if not (self._static_float(other) and _numel_dims(self._shape(other) or (2,)) > 1):
                break
            found[op], out = other, self.nodes[m].output[0]
            group.add(m)
        return out, found.get("Mul"), found.get("Add")

    def _match_norm_core(self, centred: str, sq_node: int, group: set[int]):
        """From the squaring node: ReduceMean -> Add(eps) -> Sqrt -> Div(centred, .) | Reciprocal -> Mul(centred, .)."""
        nodes = self.nodes
        r2 = self._sole(nodes[sq_node].output[0])
        if r2 is None or nodes[r2].op_type != "ReduceMean":
            return None
        ad = self._sole(nodes[r2].output[0])
        if ad is None or nodes[ad].op_type != "Add" or not self._is_static(self._other(ad, nodes[r2].output[0]) or ""):
            return None
        sq = self._sole(nodes[ad].output[0])
        if sq is None or nodes[sq].op_type != "Sqrt":
            return None
        s_out = nodes[sq].output[0]
        nx = self._sole(s_out)
        if nx is None:
            return None
        group |= {sq_node, r2, ad, sq}
        if nodes[nx].op_type == "Div" and nodes[nx].input[1] == s_out and self._centred(nodes[nx].input[0], centred, nx, group):
            group.add(nx)
            return nx
        if nodes[nx].op_type == "Reciprocal" or (nodes[nx].op_type == "Div" and list(nodes[nx].input[1:]) == [s_out]
                                                  and self._is_const_near(nodes[nx].input[0], 1.0, 1e-6)):
            mul = self._sole(nodes[nx].output[0])
            if mul is not None and nodes[mul].op_type == "Mul" and self._centred(self._other(mul, nodes[nx].output[0]), centred, mul, group):
                group |= {nx, mul}
                return mul
        return None

    def _centred(self, name: str | None, centred: str, user: int, group: set[int]) -> bool:
        """``name`` is the normalised input itself, or ``gamma * input`` used only by ``user`` (the
        ``weight * x * rsqrt(...)`` order of many RMSNorm implementations; gamma is then recorded)."""
        if name == centred:
            return True
        p = self.producer.get(name or "")
        if p is None or self.nodes[p].op_type != "Mul" or self._sole(name) != user:
            return False
        gamma = self._other(p, centred)
        if gamma is None or not self._static_float(gamma):
            return False
        group.add(p)
        self._pre_gamma[user] = gamma
        return True

    def _match_ln(self, k: int):
        nodes = self.nodes
        x = nodes[k].input[0]
        if self._is_static(x):
            return None
        mean = nodes[k].output[0]
        sub = self._sole(mean)
        if sub is None or nodes[sub].op_type != "Sub" or list(nodes[sub].input) != [x, mean]:
            return None
        d = nodes[sub].output[0]
        cons = self.consumers.get(d, [])
        if len(cons) != 2 or d in self.graph_outputs:
            return None
        sq = [c for c in cons if (nodes[c].op_type == "Pow" and nodes[c].input[0] == d and self._is_const_near(nodes[c].input[1], 2.0, 1e-6))
              or (nodes[c].op_type == "Mul" and list(nodes[c].input) == [d, d])]
        if len(sq) != 1:
            return None
        group = {k, sub}
        last = self._match_norm_core(d, sq[0], group)
        if last is None or set(cons) - group:
            return None
        out, gamma, beta = self._affine_tail(nodes[last].output[0], group)
        gamma = self._pre_gamma.pop(last, None) or gamma
        return group, k, ("layernorm", x, out, gamma, beta, False)

    def _match_rms(self, k: int):
        nodes = self.nodes
        n = nodes[k]
        x = n.input[0]
        if self._is_static(x):
            return None
        if n.op_type == "Pow" and not self._is_const_near(n.input[1], 2.0, 1e-6):
            return None
        if n.op_type == "Mul" and list(n.input) != [x, x]:
            return None
        group: set[int] = set()
        last = self._match_norm_core(x, k, group)
        if last is None:
            return None
        pre = self._pre_gamma.pop(last, None)
        out, gamma, beta = self._affine_tail(nodes[last].output[0], group) if pre is None else (nodes[last].output[0], pre, None)
        return group, min(group), ("layernorm", x, out, gamma, beta, True)

    def _match_gelu(self, k: int):
        """x/sqrt(2) (or x*0.7071) -> Erf -> +1 -> * x -> * 0.5 (any association of the two products)."""
        nodes = self.nodes
        n = nodes[k]
        if len(n.input) != 2:
            return None
        x, c = n.input
        if self._is_static(x) or not (
                (n.op_type == "Div" and self._is_const_near(c, math.sqrt(2.0), 0.01))
                or (n.op_type == "Mul" and self._is_const_near(c, math.sqrt(0.5), 0.01))):
            return None
        e = self._sole(n.output[0])
        if e is None or nodes[e].op_type != "Erf":
            return None
        a = self._sole(nodes[e].output[0])
        if a is None or nodes[a].op_type != "Add" or not self._is_const_near(self._other(a, nodes[e].output[0]) or "", 1.0, 1e-6):
            return None
        a_out = nodes[a].output[0]
        m1 = self._sole(a_out)
        if m1 is None or nodes[m1].op_type != "Mul":
            return None
        other = self._other(m1, a_out)
        group = {k, e, a, m1}
        if other == x:  # (x * (1+erf)) * 0.5
            m2 = self._sole(nodes[m1].output[0])
            if m2 is None or nodes[m2].op_type != "Mul" or not self._is_const_near(self._other(m2, nodes[m1].output[0]) or "", 0.5, 1e-6):
                return None
            group.add(m2)
            out = nodes[m2].output[0]
        elif other is not None and self._is_const_near(other, 0.5, 1e-6):  # x * ((1+erf) * 0.5)
            m2 = self._sole(nodes[m1].output[0])
            if m2 is None or nodes[m2].op_type != "Mul" or self._other(m2, nodes[m1].output[0]) != x:
                return None
            group.add(m2)
            out = nodes[m2].output[0]
        elif other is not None and other in self.producer:  # (x * 0.5) * (1+erf)
            h = self.producer[other]
            if (nodes[h].op_type != "Mul" or self._sole(other) != m1 or self._other(h, x) is None
                    or not self._is_const_near(self._other(h, x), 0.5, 1e-6)):
                return None
            group.add(h)
            out = nodes[m1].output[0]
        else:
            return None
        return group, min(group), ("gelu", x, out)

    def _match_attention(self, s: int) -> None:
        nodes = self.nodes
        chain = [s]
        masks = []
        v = nodes[s].input[0]
        qk = None
        for _ in range(8):
            p = self.producer.get(v)
            if p is None:
                return
            op = nodes[p].op_type
            if op == "MatMul":
                if all(not self._is_static(i) for i in nodes[p].input):
                    qk = p
                break
            if op not in ("Div", "Mul", "Add", "Where", "Cast", "Reshape", "Sub", "Identity"):
                return
            chain.append(p)
            if op in ("Add", "Where"):
                masks.append(p)
            acts = [i for i in nodes[p].input if i and not self._is_static(i)]
            if op == "Where":
                acts = [i for i in nodes[p].input[1:] if i and not self._is_static(i)]
            if len(acts) != 1:
                # a mask computed at run time: follow the branch that comes from a MatMul
                acts = [i for i in acts if self.producer.get(i) is not None and nodes[self.producer[i]].op_type != "Where"]
                acts = [i for i in acts if self._leads_to_matmul(i)]
                if len(acts) != 1:
                    return
            v = acts[0]
        if qk is None:
            return
        out = nodes[s].output[0]
        pv = None
        for _ in range(4):
            cons = self.consumers.get(out, [])
            if len(cons) != 1:
                return
            c = cons[0]
            op = nodes[c].op_type
            if op == "MatMul":
                if nodes[c].input[0] == out and not self._is_static(nodes[c].input[1]):
                    pv = c
                break
            if op not in ("Dropout", "Cast", "Reshape", "Identity", "Where"):
                return
            chain.append(c)
            out = nodes[c].output[0]
        if pv is None:
            return
        self.attn |= {qk, pv, *chain}
        self.mask_adds |= set(masks)

    def _leads_to_matmul(self, name: str, depth: int = 6) -> bool:
        for _ in range(depth):
            p = self.producer.get(name)
            if p is None:
                return False
            n = self.nodes[p]
            if n.op_type == "MatMul":
                return True
            acts = [i for i in n.input if i and not self._is_static(i)]
            if not acts:
                return False
            name = acts[0]
        return False

    # ------------------------------------------------------------------ layers and scopes
    @staticmethod
    def _node_path(n) -> str:
        """Module path of a node: from torch.onnx metadata (``namespace``) or the ``/a/b.3/op`` node name."""
        for p in n.metadata_props:
            if p.key == "namespace" and p.value:
                mods = []
                for part in p.value.split("/")[:-1]:  # the last component is the aten op
                    path = part.split(":", 1)[0].strip()
                    if path:
                        mods.append(path)
                if mods:
                    return mods[-1]
        name = n.name or ""
        if "/" in name:
            parts = [x for x in name.strip("/").split("/")[:-1] if x]
            return ".".join(parts)
        return name if _LAYER_RE.search(name) else ""

    def _layers(self):
        raw: list[int | None] = []
        scopes: list[str] = []
        for n in self.nodes:
            path = self._node_path(n)
            m = _LAYER_RE.search(path)
            raw.append(int(m.group(1)) if m else None)
            scopes.append(path)
        idx = [k for k, r in enumerate(raw) if r is not None]
        if not idx:
            return [-1] * len(raw), scopes, 0
        n_layers = max(r for r in raw if r is not None) + 1
        first, last = idx[0], idx[-1]
        out = []
        cur = -1
        for k, r in enumerate(raw):
            if r is not None:
                cur = r
            elif k < first:
                cur = -1
            elif k > last:
                cur = n_layers
            elif not scopes[k] and k:  # an unnamed op inside a block: the scope of the op before it
                scopes[k] = scopes[k - 1]
            out.append(cur)
        return out, scopes, n_layers

    # ------------------------------------------------------------------ parameters
    def _fx_params(self, n) -> list[str]:
        for p in n.metadata_props:
            if p.key == "pkg.torch.onnx.fx_node":
                return re.findall(r"%(p_\w+)", p.value)
        return []

    def _key(self, init: str, fx: list[str], local: set[str]) -> str:
        if init in self.alias_key:
            return self.alias_key[init]
        s = _sanitize(init)
        if fx and s not in fx:
            cands = [p for p in dict.fromkeys(fx) if p not in {_sanitize(i) for i in local}]
            if len(cands) == 1:
                return cands[0]
        return s

    def _claim(self, names: Iterable[str | None], nodes: Sequence[int], *, weight: bool = True) -> int:
        """Parameters (not yet counted) among the float initializers ``names`` were computed from."""
        fx: list[str] = []
        local: set[str] = set()
        for k in nodes:
            fx += self._fx_params(self.nodes[k])
            local |= {i for i in self.nodes[k].input if i}
        total = 0
        for nm in names:
            if not nm:
                continue
            v = self.vals.get(nm)
            srcs = v.sources if isinstance(v, _Static) else frozenset()
            for src in sorted(srcs):
                numel = self.init_numel.get(src, 0)
                if numel <= 1 and not weight:
                    continue
                key = self._key(src, fx, local)
                if key in self.counted:
                    continue
                self.counted.add(key)
                self.claim_log.append(key)
                total += numel
        return total

    # ------------------------------------------------------------------ values
    def _tensor(self, name: str) -> Tensor:
        """The activation tensor of ``name`` (a static value becomes a graph-input tensor)."""
        v = self.vals.get(name)
        if isinstance(v, Tensor):
            return v
        shape = self._shape(name)
        if shape is None:
            shape = (1,)
            self.unknown_shapes += 1
        t = self.b.input(shape, self._tdtype(self._elem(name)))
        return t

    def _set(self, name: str, t: Tensor, rg: bool) -> None:
        self.vals[name] = t
        self.rg[name] = rg

    def _out_shape(self, name: str, default: Sequence[int] | None, computed: Sequence[int] | None = None) -> tuple[int, ...]:
        """The inferred shape of ``name``, else the one computed here, else ``default`` (a guess, counted)."""
        s = self._shape(name)
        if s is not None:
            return s
        if computed is not None:
            return tuple(int(d) for d in computed)
        self.unknown_shapes += 1
        return tuple(default) if default is not None else (1,)

    # ------------------------------------------------------------------ what ONNX shape inference missed
    def _ref_op(self, n):
        from onnx.reference.ops import load_op

        key = (n.domain, n.op_type)
        if key not in self._ref_cls:
            try:
                self._ref_cls[key] = load_op(n.domain, n.op_type, self.opset if n.domain in _DEFAULT_DOMAINS else 1)
            except Exception:  # noqa: BLE001 - no reference implementation
                self._ref_cls[key] = None
        cls = self._ref_cls[key]
        if cls is None:
            return None
        run_params = {"opsets": {"": self.opset}, "verbose": 0, "new_ops": None, "log": lambda *a: None,
                      "evaluator_cls": None}
        return cls(n, run_params)

    def _fold(self, n) -> None:
        """Values of a static node (shape arithmetic: Shape, Gather, Concat, ...) with the ONNX reference ops."""
        op = n.op_type
        outs = list(n.output)
        if not outs or not outs[0] or op == "Constant" or outs[0] in self.consts:
            return
        if op in ("Shape", "Size"):
            s = self._shape(n.input[0])
            if s is not None:
                if op == "Size":
                    self.consts[outs[0]] = np.array(_numel_dims(s), np.int64)
                else:
                    self.consts[outs[0]] = np.array(s, np.int64)[_attr(n, "start", 0):_attr(n, "end", None)]
            return
        args = []
        for i in n.input:
            if not i:
                args.append(None)
                continue
            c = self.consts.get(i)
            if c is None:
                return
            args.append(c)
        while args and args[-1] is None:
            args.pop()
        if self._fold_size(n, args) > _FOLD_LIMIT:
            return
        try:
            ref = self._ref_op(n)
            res = ref.run(*args) if ref is not None else ()
        except Exception:  # noqa: BLE001 - best effort
            return
        for o, r in zip(outs, res):
            if o and isinstance(r, np.ndarray) and r.size <= _FOLD_LIMIT:
                self.consts[o] = r

    def _fold_size(self, n, args: list) -> float:
        """An upper bound on the elements a folded node would create (no 1e9-element masks in memory)."""
        known = self._shape(n.output[0])
        if known is not None:
            return _numel_dims(known)
        op = n.op_type
        try:
            if op == "ConstantOfShape":
                return float(np.prod(args[0].astype(np.float64)))
            if op == "Range":
                return abs(float(args[1]) - float(args[0])) / max(abs(float(args[2])), 1e-12)
            if op == "Expand":
                return float(np.prod(np.broadcast_shapes(args[0].shape, tuple(int(v) for v in args[1]))))
            if op == "Tile":
                return float(args[0].size * np.prod(args[1].astype(np.float64)))
            if op in ("Resize", "Upsample", "OneHot", "EyeLike", "Pad"):
                return math.inf
            sizes = [a for a in args if a is not None]
            if op in _BINARY or op in _UNARY:
                return float(np.prod(np.broadcast_shapes(*[a.shape for a in sizes]), dtype=np.float64))
            if op in ("Gather", "GatherElements", "GatherND"):
                return float(np.prod([a.size for a in sizes], dtype=np.float64))
            return float(sum(a.size for a in sizes))  # Concat, Slice, Reshape, Shape, Cast, ...
        except Exception:  # noqa: BLE001
            return math.inf

    def _computed_shape(self, n, index: int = 0) -> tuple[int, ...] | None:
        """Output shape of a shape-manipulating op from its input shapes and constant operands."""
        op = n.op_type
        ins = list(n.input)

        def val(i):
            c = self._const(ins[i]) if len(ins) > i and ins[i] else None
            return None if c is None else [int(v) for v in np.asarray(c).reshape(-1)]

        s0 = self._shape(ins[0]) if ins and ins[0] else None
        if s0 is None:
            return None
        r = len(s0)
        try:
            if op == "Reshape":
                shape = val(1)
                if shape is None:
                    return None
                shape = [s0[i] if v == 0 and i < r and not _attr(n, "allowzero", 0) else v for i, v in enumerate(shape)]
                if shape.count(-1) == 1:
                    shape[shape.index(-1)] = _numel_dims(s0) // max(1, _numel_dims([v for v in shape if v != -1]))
                return tuple(shape) if _numel_dims(shape) == _numel_dims(s0) and min(shape, default=0) >= 0 else None
            if op == "Flatten":
                ax = int(_attr(n, "axis", 1)) % (r + 1)
                return (_numel_dims(s0[:ax]), _numel_dims(s0[ax:]))
            if op in ("Squeeze", "Unsqueeze"):
                axes = _attr(n, "axes", None)
                axes = list(axes) if axes is not None else val(1)
                if op == "Unsqueeze":
                    out_r = r + len(axes)
                    axes = {a % out_r for a in axes}
                    it = iter(s0)
                    return tuple(1 if i in axes else next(it) for i in range(out_r))
                axes = {a % r for a in axes} if axes else {i for i, d in enumerate(s0) if d == 1}
                return tuple(d for i, d in enumerate(s0) if i not in axes)
            if op == "Expand":
                return tuple(np.broadcast_shapes(s0, tuple(val(1))))
            if op == "Tile":
                return tuple(d * t for d, t in zip(s0, val(1)))
            if op == "Concat":
                shapes = [self._shape(i) for i in ins if i]
                ax = int(_attr(n, "axis", 0)) % r
                return (*s0[:ax], sum(s[ax] for s in shapes), *s0[ax + 1:])
            if op in ("Gather", "GatherElements"):
                idx = self._shape(ins[1])
                ax = int(_attr(n, "axis", 0)) % r
                return tuple(idx) if op == "GatherElements" else (*s0[:ax], *idx, *s0[ax + 1:])
            if op == "Slice":
                if self.opset < 10:
                    starts, ends, axes, steps = _attr(n, "starts"), _attr(n, "ends"), _attr(n, "axes", None), None
                else:
                    starts, ends, axes, steps = val(1), val(2), val(3), val(4)
                axes = list(axes) if axes is not None else list(range(len(starts)))
                steps = steps or [1] * len(starts)
                sl = [slice(None)] * r
                for a, b0, e, st in zip(axes, starts, ends, steps):
                    sl[a % r] = slice(b0, e, st)
                dummy = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), s0, (0,) * r, writeable=False)
                return dummy[tuple(sl)].shape
            if op == "Split":
                ax = int(_attr(n, "axis", 0)) % r
                sizes = list(_attr(n, "split", None) or val(1) or [])
                if not sizes:
                    parts = len([o for o in n.output])
                    each = -(-s0[ax] // parts)
                    sizes = [min(each, s0[ax] - i * each) for i in range(parts)]
                return (*s0[:ax], sizes[index], *s0[ax + 1:])
            if op == "Pad":
                pads = list(_attr(n, "pads", None) or val(1))
                axes = val(3) if len(ins) > 3 and ins[3] else list(range(r))
                out = list(s0)
                for j, a in enumerate(axes):
                    out[a % r] += pads[j] + pads[j + len(axes)]
                return tuple(out)
            if op in _REDUCE_OPS and op.startswith(("Reduce", "Arg")):
                keep = int(_attr(n, "keepdims", 1))
                if op.startswith("Arg"):
                    axes = [int(_attr(n, "axis", 0))]
                else:
                    axes = _attr(n, "axes", None)
                    axes = list(axes) if axes is not None else val(1)
                if not axes:
                    if _attr(n, "noop_with_empty_axes", 0):
                        return tuple(s0)
                    axes = list(range(r))
                axes = {a % r for a in axes}
                return tuple((1 if i in axes else d) for i, d in enumerate(s0) if keep or i not in axes)
            if op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
                return (*s0[:2], *([1] * (r - 2)))
        except (TypeError, ValueError, IndexError, StopIteration, ZeroDivisionError):
            return None
        return None

    def _view(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        shape = tuple(int(d) for d in shape)
        if shape == x.shape:
            return x
        if _numel_dims(shape) == x.numel:
            return self.b.view(x, shape)
        return self.b.alias(shape, x.dtype, x.node)  # inconsistent shapes: keep the dependency, not the bytes

    def _register_rest(self, n, first: Tensor | None, rg: bool) -> None:
        """Outputs of ``n`` not yet defined: further outputs of the same kernel."""
        for o in n.output:
            if o and o not in self.vals:
                shape = self._out_shape(o, first.shape if first is not None else None)
                elem = self._elem(o)
                if first is None:
                    self.vals[o] = _Static(shape, frozenset(), elem)
                else:
                    self._set(o, self.b.alias(shape, self._tdtype(elem), first.node), rg)

    # ------------------------------------------------------------------ the walk
    def run(self, meta: dict) -> OpGraph:
        g = self.g
        for inp in g.input:
            if inp.name in self.inits:
                continue
            shape = self._shape(inp.name)
            if shape is None:
                shape = (1,)
                self.unknown_shapes += 1
            self._set(inp.name, self.b.input(shape, self._tdtype(self._elem(inp.name))), False)
        for nm, s in self.inits.items():
            self.vals[nm] = s
        for k, n in enumerate(self.nodes):
            if k in self.skip:
                continue
            lay, scope = self.layer_of[k], self.scope_of[k]
            with self.b.layer(lay, scope), (self.b.tag("attn_core") if k in self.attn else nullcontext()):
                self._emit(k, n)
        meta = dict(meta)
        meta.update(source="onnx", n_layers=int(self.n_layers), unmapped_ops=dict(sorted(self.unmapped.items())),
                    onnx_nodes=len(self.nodes), opset=int(self.opset))
        if self.fallback:
            meta["fallback_ops"] = dict(sorted(self.fallback.items()))
        if self.unknown_shapes:
            meta["unknown_shapes"] = int(self.unknown_shapes)
        if self.warnings:
            meta["warnings"] = self.warnings[:20]
        return self.b.build(**meta)

    def _emit(self, k: int, n) -> None:
        if k in self.fused:
            mark, counted = self.b.mark(), len(self.claim_log)
            try:
                self._emit_fused(k, n, n.name or f"{n.op_type}_{k}", self.fused[k])
            except _HANDLER_ERRORS as e:  # emit the subgraph op by op instead
                self._undo(n, mark, counted, e, "emitted op by op")
                for j in sorted(self.groups[k]):
                    self._emit_node(j, self.nodes[j])
            return
        self._emit_node(k, n)

    def _undo(self, n, mark: tuple, counted: int, e: Exception, what: str) -> None:
        """Forget what a failed handler recorded (kernels, claimed parameters, values) and say so."""
        self.fallback[n.op_type] = self.fallback.get(n.op_type, 0) + 1
        if len(self.warnings) < 20:
            self.warnings.append(f"{n.name or n.op_type} ({n.op_type}): {type(e).__name__}: {e}; {what}")
        for o in n.output:
            self.vals.pop(o, None)
        for key in self.claim_log[counted:]:
            self.counted.discard(key)
        del self.claim_log[counted:]
        self.b.rollback(mark)

    def _emit_node(self, k: int, n) -> None:
        """One ONNX node through its handler; the roofline when nothing maps it or its handler fails."""
        name = n.name or f"{n.op_type}_{k}"
        ins = list(n.input)
        outs = [o for o in n.output if o]
        if outs and all(o in self.static_names for o in outs):
            self._emit_static(n)
            return
        handler = self._handler(n.op_type, n) if n.domain in _DEFAULT_DOMAINS or n.domain == "com.microsoft" else None
        if handler is None:
            self._emit_unknown(k, n, name, ins, unmapped=True)
            return
        mark, counted = self.b.mark(), len(self.claim_log)
        try:
            handler(k, n, name, ins)
        except _HANDLER_ERRORS as e:
            self._undo(n, mark, counted, e, "costed by the roofline")
            self._emit_unknown(k, n, name, ins, unmapped=False)
            if k in self.bias_of:  # the bias Add fused into this MatMul
                add = self.nodes[self.bias_of[k]]
                self._emit_node(self.bias_of[k], add)

    def _handler(self, op: str, n):
        if op in ("MatMul", "FusedMatMul"):
            return self._matmul
        if op == "Gemm":
            return self._gemm
        if op in ("Conv", "ConvTranspose"):
            return self._conv
        if op in ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
                  "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "GroupNormalization",
                  "InstanceNormalization", "MeanVarianceNormalization"):
            return self._norm
        if op == "BatchNormalization":
            return self._batchnorm
        if op in ("Softmax", "LogSoftmax"):
            return self._softmax
        if op == "Gather":
            return self._gather
        if op in _VIEW_OPS:
            return self._view_op
        if op in _COPY_OPS:
            return self._copy_op
        if op in _REDUCE_OPS:
            return self._reduce
        if op == "Dropout":
            return self._dropout
        if op == "Cast" or op == "CastLike":
            return self._cast
        if op in _UNARY or op in _BINARY:
            return self._elementwise
        if op == "Attention" and n.domain in _DEFAULT_DOMAINS:
            return self._attention
        if op == "Einsum":
            return self._einsum
        if op == "SplitToSequence":
            return self._split_to_sequence
        if op == "SequenceAt":
            return self._sequence_at
        return None

    def _emit_static(self, n) -> None:
        ins = [i for i in n.input if i]
        srcs: frozenset = frozenset()
        if n.op_type == "Identity" and ins and ins[0] in self.inits and self.inits[ins[0]].sources:
            # torch.onnx (TorchScript) stores parameters with equal values once and re-creates each
            # parameter name with an Identity: a distinct parameter
            o = n.output[0]
            self.init_numel[o] = self.init_numel[ins[0]]
            srcs = frozenset({o})
        elif n.op_type in _SOURCE_OPS:
            for i in ins:
                v = self.vals.get(i)
                if isinstance(v, _Static):
                    srcs |= v.sources
        self._fold(n)
        for o in n.output:
            if o:
                shape = self._shape(o)
                if shape is None and o in self.consts:
                    shape = tuple(self.consts[o].shape)
                self.vals[o] = _Static(shape, srcs if self._is_float(o) else frozenset(), self._elem(o))

    # ------------------------------------------------------------------ handlers
    def _rg(self, *names: str) -> bool:
        return any(self.rg.get(nm, False) for nm in names if nm)

    def _matmul(self, k, n, name, ins):
        a_nm, b_nm = ins[0], ins[1]
        sa, sb = self._is_static(a_nm), self._is_static(b_nm)
        out_nm = n.output[0]
        ta, tb = _attr(n, "transA", 0), _attr(n, "transB", 0)  # FusedMatMul
        if sb and not sa and not ta and not tb and self._is_float(b_nm) and len(self._shape(b_nm) or ()) == 2:
            x = self._tensor(a_nm)
            wshape = self._shape(b_nm)
            if x.shape[-1:] != wshape[:1]:
                raise GraphError(f"contraction dims differ: {x.shape} @ {wshape}")
            squeeze = len(x.shape) == 1
            if squeeze:
                x = self._view(x, (1, x.shape[0]))
            add = self.bias_of.get(k)
            bias_nm = self._other(add, out_nm) if add is not None else None
            group = [k] + ([add] if add is not None else [])
            params = self._claim([b_nm], group)
            bias_params = self._claim([bias_nm], group) if bias_nm else 0
            kout = wshape[1]
            y = self.b.linear(x, kout, bias=bias_nm is not None, name=name, weight_params=params == x.shape[-1] * kout,
                              needs_input_grad=self._rg(a_nm))
            counted = (x.shape[-1] * kout if params == x.shape[-1] * kout else 0) + (kout if bias_nm else 0)
            self.b.own_params(y, params + bias_params - counted)
            final = self.nodes[add].output[0] if add is not None else out_nm
            y_shape = y.shape[1:] if squeeze else y.shape
            y = self._view(y, self._out_shape(final, y_shape, y_shape))
            self._set(final, y, True)
            return
        a, b = self._tensor(a_nm), self._tensor(b_nm)
        if ta and len(a.shape) >= 2:
            a = self._view(a, (*a.shape[:-2], a.shape[-1], a.shape[-2]))
        if tb and len(b.shape) >= 2:
            b = self._view(b, (*b.shape[:-2], b.shape[-1], b.shape[-2]))
        a_vec, b_vec = len(a.shape) == 1, len(b.shape) == 1
        if a_vec:
            a = self._view(a, (1, a.shape[0]))
        if b_vec:
            b = self._view(b, (b.shape[0], 1))
        y = self.b.matmul(a, b, name=name)
        p = self._claim([a_nm if sa else None, b_nm if sb else None], [k])
        if p:
            self.b.own_params(y, p)
        y_shape = tuple(d for i, d in enumerate(y.shape)
                        if not ((a_vec and i == len(y.shape) - 2) or (b_vec and i == len(y.shape) - 1)))
        self._set(out_nm, self._view(y, self._out_shape(out_nm, y_shape, y_shape)), self._rg(a_nm, b_nm) or p > 0)

    def _gemm(self, k, n, name, ins):
        a_nm, b_nm = ins[0], ins[1]
        c_nm = ins[2] if len(ins) > 2 and ins[2] else None
        ta, tb = _attr(n, "transA", 0), _attr(n, "transB", 0)
        out_nm = n.output[0]
        a = self._tensor(a_nm)
        if len(a.shape) != 2:
            raise GraphError(f"Gemm needs 2-D A, got {a.shape}")
        if ta:
            a = self._view(a, (a.shape[1], a.shape[0]))
        if self._is_static(b_nm) and not self._is_static(a_nm) and self._is_float(b_nm):
            bshape = self._shape(b_nm)
            if bshape is None or len(bshape) != 2:
                raise GraphError(f"Gemm needs a 2-D B, got {bshape}")
            kin, kout = (bshape[1], bshape[0]) if tb else bshape
            if a.shape[1] != kin:
                raise GraphError(f"contraction dims differ: {a.shape} @ {bshape} (transB={tb})")
            cshape = self._shape(c_nm) if c_nm else None
            fused_bias = (c_nm is not None and self._static_float(c_nm) and cshape is not None
                          and _numel_dims(cshape) == kout and cshape[-1:] == (kout,))
            params = self._claim([b_nm], [k])
            bias_params = self._claim([c_nm], [k]) if fused_bias else 0
            y = self.b.linear(a, kout, bias=fused_bias, name=name, weight_params=params == kin * kout,
                              needs_input_grad=self._rg(a_nm))
            counted = (kin * kout if params == kin * kout else 0) + (kout if fused_bias else 0)
            self.b.own_params(y, params + bias_params - counted)
            rg = True
        else:
            bt = self._tensor(b_nm)
            if tb:
                bt = self._view(bt, (bt.shape[1], bt.shape[0]))
            y = self.b.matmul(a, bt, name=name)
            p = self._claim([nm for nm in (a_nm, b_nm) if self._is_static(nm)], [k])
            if p:
                self.b.own_params(y, p)
            rg = self._rg(a_nm, b_nm) or p > 0
            fused_bias = False
        if c_nm is not None and not fused_bias:
            c = self._bias_operand(c_nm)
            y2 = self.b.elementwise("add", y, c, name=f"{name}.bias", grad=True)
            p = self._claim([c_nm], [k], weight=False) if self._is_static(c_nm) else 0
            if p:
                self.b.own_params(y2, p)
            y = y2
        self._set(out_nm, self._view(y, self._out_shape(out_nm, y.shape, y.shape)), rg)

    def _bias_operand(self, nm: str) -> Tensor | float:
        if self._is_static(nm):
            s = self._shape(nm)
            if s is not None and _numel_dims(s) <= 1:
                return self._scalar(nm, 1.0)
        return self._tensor(nm)

    def _conv(self, k, n, name, ins):
        x_nm, w_nm = ins[0], ins[1]
        b_nm = ins[2] if len(ins) > 2 and ins[2] else None
        out_nm = n.output[0]
        x = self._tensor(x_nm)
        wshape = self._shape(w_nm)
        if wshape is None:
            raise GraphError("conv weight shape unknown")
        group = int(_attr(n, "group", 1))
        ks = list(wshape[2:])
        strides = list(_attr(n, "strides", [1] * len(ks)))
        dil = list(_attr(n, "dilations", [1] * len(ks)))
        pads = list(_attr(n, "pads", [0] * (2 * len(ks))))
        auto = _attr(n, "auto_pad", "NOTSET")
        computed = None
        if n.op_type == "Conv" and len(x.shape) == len(ks) + 2:
            sp = x.shape[2:]
            if auto in ("SAME_UPPER", "SAME_LOWER"):
                o = [-(-d // st) for d, st in zip(sp, strides)]
            elif auto == "VALID":
                o = [(d - dl * (kk - 1) - 1) // st + 1 for d, kk, st, dl in zip(sp, ks, strides, dil)]
            else:
                nd = len(ks)
                o = [(d + pads[i] + pads[i + nd] - dil[i] * (ks[i] - 1) - 1) // strides[i] + 1 for i, d in enumerate(sp)]
            computed = (x.shape[0], int(wshape[0]), *o)
        out_shape = self._out_shape(out_nm, None, computed)
        wparams = self._claim([w_nm], [k]) if self._is_static(w_nm) else 0
        bparams = self._claim([b_nm], [k]) if b_nm and self._is_static(b_nm) else 0
        rg = True
        y = None
        if (n.op_type == "Conv" and len(ks) == 2 and len(x.shape) == 4 and group == 1 and ks[0] == ks[1]
                and x.shape[2] == x.shape[3] and len(set(strides)) == 1 and set(dil) == {1}
                and self._is_static(w_nm) and len(out_shape) == 4):
            s = x.shape[2]
            pad = None
            if auto in ("NOTSET", "") and len(set(pads)) == 1:
                pad = pads[0]
            elif auto == "VALID":
                pad = 0
            elif auto in ("SAME_UPPER", "SAME_LOWER"):
                total = (out_shape[2] - 1) * strides[0] + ks[0] - s
                if total >= 0 and total % 2 == 0:
                    pad = total // 2
            if pad is not None and (s + 2 * pad - ks[0]) // strides[0] + 1 == out_shape[2] == out_shape[3]:
                y = self.b.conv2d(x, int(wshape[0]), int(ks[0]), stride=int(strides[0]), padding=int(pad), bias=False, name=name)
                self.b.own_params(y, wparams - int(wshape[0] * x.shape[1] * ks[0] * ks[0]))
        if y is None:  # any other convolution: the roofline with its real FLOPs
            out_n = _numel_dims(out_shape)
            if n.op_type == "Conv":
                flops = 2.0 * out_n * _numel_dims(wshape[1:])
            else:  # ConvTranspose: every input element is scattered through the kernel
                flops = 2.0 * x.numel * _numel_dims(wshape[1:])
            db = self.b.dbytes
            y = self.b.opaque(name, [x], out_shape, flops=flops, bytes_=(x.numel + _numel_dims(wshape) + out_n) * db,
                              op_class="conv")
            self.b.own_params(y, wparams)
        if b_nm:
            bias = self._tensor(b_nm)
            bias = self._view(bias, (bias.numel, *([1] * (len(y.shape) - 2))))  # per output channel
            yb = self.b.elementwise("add", y, bias, name=f"{name}.bias")
            self.b.own_params(yb, bparams)
            y = yb
        self._set(out_nm, self._view(y, self._out_shape(out_nm, y.shape, y.shape)), rg)

    def _norm(self, k, n, name, ins):
        op = n.op_type
        x_nm = ins[0]
        x = self._tensor(x_nm)
        rg = True
        if op in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"):
            # com.microsoft: (input, skip, gamma, beta?, bias?) / (input, skip, gamma, bias?)
            skip = self._tensor(ins[1])
            opt = [*ins[2:], "", "", ""]
            gamma = opt[0] or None
            if op == "SkipLayerNormalization":
                beta, bias = opt[1] or None, opt[2] or None
            else:
                beta, bias = None, opt[1] or None
            x = self.b.elementwise("add", x, skip, name=f"{name}.skip")
            if bias:
                x = self.b.elementwise("add", x, self._tensor(bias), name=f"{name}.bias")
                self.b.own_params(x, self._claim([bias], [k]))
            if len(n.output) > 3 and n.output[3]:
                self._set(n.output[3], x, True)
            rms = op == "SkipSimplifiedLayerNormalization"
            axis = -1
        elif op in ("GroupNormalization", "InstanceNormalization", "MeanVarianceNormalization"):
            gamma = ins[1] if len(ins) > 1 else None
            beta = ins[2] if len(ins) > 2 else None
            rms = False
            if op == "GroupNormalization":
                groups = int(_attr(n, "num_groups", 1))
                lead = x.shape[0] * groups
            elif op == "InstanceNormalization":
                lead = x.shape[0] * (x.shape[1] if len(x.shape) > 1 else 1)
            else:
                axes = _attr(n, "axes", [0, 2, 3])
                lead = x.numel // max(1, _numel_dims([x.shape[a] for a in axes if a < len(x.shape)]))
            axis = None
            h = x.numel // max(1, lead)
            xv = self._view(x, (lead, h))
        else:
            gamma = ins[1] if len(ins) > 1 and ins[1] else None
            beta = ins[2] if len(ins) > 2 and ins[2] and op == "LayerNormalization" else None
            rms = op != "LayerNormalization"
            axis = int(_attr(n, "axis", -1))
        if axis is not None:
            ax = axis % len(x.shape) if x.shape else 0
            h = _numel_dims(x.shape[ax:])
            xv = self._view(x, (x.numel // max(1, h), h)) if ax != len(x.shape) - 1 else x
        y = self._layernorm(k, xv, name, gamma, beta, rms)
        y = self._view(y, x.shape)
        self._set(n.output[0], y, rg)
        self._register_rest(n, y, rg)

    def _layernorm(self, k, x: Tensor, name: str, gamma, beta, rms: bool) -> Tensor:
        has_bias = bool(beta) and not rms
        y = self.b.layernorm(x, name=name, bias=has_bias, rms=rms)
        h = int(x.shape[-1])
        counted = h * (1 if rms or not has_bias else 2)
        claimed = self._claim([gamma, beta if beta else None], [k])
        self.b.own_params(y, claimed - counted)
        return y

    def _emit_fused(self, k, n, name, payload) -> None:
        kind = payload[0]
        if kind == "layernorm":
            _, x_nm, out_nm, gamma, beta, rms = payload
            y = self._layernorm(k, self._tensor(x_nm), f"{name}.{'rmsnorm' if rms else 'layernorm'}", gamma, beta, rms)
            self._set(out_nm, y, True)
        elif kind == "gelu":
            _, x_nm, out_nm = payload
            y = self.b.elementwise("gelu", self._tensor(x_nm), name=f"{name}.gelu", grad=self._rg(x_nm))
            self._set(out_nm, y, self._rg(x_nm))

    def _batchnorm(self, k, n, name, ins):
        x = self._tensor(ins[0])
        c = x.shape[1] if len(x.shape) > 1 else 1
        scale = self.b.input((c, *([1] * (len(x.shape) - 2))))
        y = self.b.elementwise("mul", x, scale, name=name)
        self.b.own_params(y, self._claim([ins[1], ins[2] if len(ins) > 2 else None], [k]))
        self._set(n.output[0], y, True)
        self._register_rest(n, y, True)

    def _softmax(self, k, n, name, ins):
        x = self._tensor(ins[0])
        rank = len(x.shape)
        axis = int(_attr(n, "axis", -1 if self.opset >= 13 else 1))
        ax = axis % rank if rank else 0
        h = _numel_dims(x.shape[ax:]) if self.opset < 13 else (x.shape[ax] if rank else 1)
        xv = x if (rank and ax == rank - 1) else self._view(x, (x.numel // max(1, h), h))
        y = self._view(self.b.softmax(xv, name=name), x.shape)
        self._set(n.output[0], y, self._rg(ins[0]))

    def _gather(self, k, n, name, ins):
        data_nm, idx_nm = ins[0], ins[1]
        out_nm = n.output[0]
        axis = int(_attr(n, "axis", 0))
        dshape = self._shape(data_nm)
        if self._is_static(data_nm) and axis == 0 and dshape and self._is_float(data_nm):
            ids = self._tensor(idx_nm)
            vocab, dim = int(dshape[0]), _numel_dims(dshape[1:])
            p = self._claim([data_nm], [k])
            y = self.b.embedding(ids, vocab, dim, name=name, params=p == vocab * dim)
            self.b.own_params(y, p - (vocab * dim if p == vocab * dim else 0))
            y_shape = (*ids.shape, *dshape[1:])
            self._set(out_nm, self._view(y, self._out_shape(out_nm, y_shape, y_shape)), True)
            return
        self._copy_op(k, n, name, ins)

    def _view_op(self, k, n, name, ins):
        x = self._tensor(ins[0])
        out_nm = n.output[0]
        shape = self._out_shape(out_nm, x.shape, self._computed_shape(n))
        self._set(out_nm, self._view(x, shape), self._rg(ins[0]))

    def _copy_op(self, k, n, name, ins):
        op = n.op_type
        acts = [i for i in ins if i and not self._is_static(i)]
        if not acts:  # e.g. a Concat of constants in a custom region
            acts = [i for i in ins if i]
        tensors = [self._tensor(i) for i in acts]
        src = tensors[0]
        rg = self._rg(*acts)
        outs = [o for o in n.output if o]
        if op == "Transpose":
            perm = _attr(n, "perm", list(range(len(src.shape)))[::-1])
            shape = tuple(src.shape[p] for p in perm)
            moved = [p for p in perm if src.shape[p] != 1]
            if moved == sorted(moved):  # only size-1 dims move: a free view
                self._set(outs[0], self._view(src, shape), rg)
                return
            y = self.b.copy(src, shape, name=name, grad=rg)
            self._set(outs[0], y, rg)
            return
        if op == "Split":  # one kernel writes every part
            y = self.b.copy(src, name=name, grad=rg)
            for i, o in enumerate(n.output):
                if o:
                    self._set(o, self.b.alias(self._out_shape(o, src.shape, self._computed_shape(n, i)), y.dtype, y.node), rg)
            return
        if op in ("ScatterND", "ScatterElements", "Scatter"):
            shape = src.shape
        else:
            shape = self._out_shape(outs[0], src.shape, self._computed_shape(n))
        stand_in = self.b.alias(shape, src.dtype, src.node) if _numel_dims(shape) != src.numel else self._view(src, shape)
        y = self.b.copy(stand_in, name=name, grad=rg)
        self.b.link(y, tensors[1:])
        self._set(outs[0], y, rg)
        self._register_rest(n, y, rg)

    def _split_to_sequence(self, k, n, name, ins):
        """``torch.split`` in an unoptimised export: one kernel writing the parts, kept as a list."""
        x = self._tensor(ins[0])
        r = len(x.shape)
        ax = int(_attr(n, "axis", 0)) % r
        keep = int(_attr(n, "keepdims", 1))
        split = self._const(ins[1]) if len(ins) > 1 and ins[1] else None
        d = x.shape[ax]
        if split is None:
            sizes = [1] * d
        elif split.ndim == 0:
            each = int(split)
            sizes = [min(each, d - i) for i in range(0, d, each)]
        else:
            sizes = [int(v) for v in split]
        rg = self._rg(ins[0])
        y = self.b.copy(x, name=name, grad=rg)
        parts = []
        for sz in sizes:
            shape = (*x.shape[:ax], sz, *x.shape[ax + 1:]) if (keep or split is not None) else (*x.shape[:ax], *x.shape[ax + 1:])
            parts.append(self.b.alias(shape, y.dtype, y.node))
        self.vals[n.output[0]] = parts  # type: ignore[assignment]
        self.rg[n.output[0]] = rg

    def _sequence_at(self, k, n, name, ins):
        parts = self.vals.get(ins[0])
        pos = self._scalar(ins[1]) if len(ins) > 1 else None
        if not isinstance(parts, list) or pos is None:
            raise GraphError("SequenceAt of an unknown sequence or position")
        self._set(n.output[0], parts[int(pos)], self.rg.get(ins[0], False))

    def _reduce(self, k, n, name, ins):
        x = self._tensor(ins[0])
        out_nm = n.output[0]
        out_shape = self._out_shape(out_nm, (1,), self._computed_shape(n))
        rg = self._rg(ins[0]) and n.op_type not in _NO_GRAD
        y = self.b.reduction(x, out_shape, name=name, grad=rg)
        self._set(out_nm, y, rg)
        self._register_rest(n, y, False)

    def _dropout(self, k, n, name, ins):
        x = self._tensor(ins[0])
        p = _attr(n, "ratio", None)
        if p is None:
            p = self._scalar(ins[1], 0.5) if len(ins) > 1 and ins[1] else 0.5
        y = self.b.dropout(x, float(p), name=name)
        self._set(n.output[0], y, self._rg(ins[0]))
        if len(n.output) > 1 and n.output[1]:
            shape = self._out_shape(n.output[1], x.shape, x.shape)
            if y is not x:
                self._set(n.output[1], self.b.alias(shape, "bool", y.node), False)
            else:
                self.vals[n.output[1]] = _Static(shape, frozenset(), 9)

    def _cast(self, k, n, name, ins):
        x = self._tensor(ins[0])
        to = _attr(n, "to", None)
        src_e = self._elem(ins[0])
        out_nm = n.output[0]
        if n.op_type == "CastLike" and len(ins) > 1:
            to = self._elem(ins[1])
        same = to == src_e or (to in _FLOAT_TYPES and src_e in _FLOAT_TYPES and _FLOAT_TYPES.get(to) == _FLOAT_TYPES.get(src_e)
                               and to != 11 and src_e != 11) or to is None
        rg = self._rg(ins[0]) and to in _FLOAT_TYPES
        if same:
            self._set(out_nm, x, rg)
            return
        self._set(out_nm, self.b.copy(x, name=name, grad=rg), rg)

    def _elementwise(self, k, n, name, ins):
        op = n.op_type
        kernel = _UNARY.get(op) or _BINARY[op]
        operands: list[Tensor | float] = []
        acts: list[str] = []
        statics: list[str] = []
        for i, nm in enumerate(ins):
            if not nm:
                continue
            if op == "Clip" and i > 0:
                continue  # bounds
            if op in ("Pow",) and i == 1 and self._is_static(nm):
                operands.append(self._scalar(nm, 2.0) if _numel_dims(self._shape(nm) or (1,)) <= 1 else self._tensor(nm))
                continue
            if self._is_static(nm):
                s = self._shape(nm)
                statics.append(nm)
                if s is not None and _numel_dims(s) <= 1:
                    operands.append(self._scalar(nm, 1.0))
                else:
                    operands.append(self._tensor(nm))
            else:
                acts.append(nm)
                operands.append(self._tensor(nm))
        if op in _UNARY and kernel != "gelu":
            operands = [t for t in operands if isinstance(t, Tensor)][:1] or operands[:1]
        elif kernel == "gelu":  # FastGelu / BiasGelu: x (+ bias) -> gelu, the bias read as an operand
            operands = [t for t in operands if isinstance(t, Tensor)]
        if not any(isinstance(t, Tensor) for t in operands):
            operands = [self._tensor(ins[0])]
        params = 0
        if op in _PARAM_ARITH and k not in self.mask_adds:
            if op in ("Mul", "Div"):  # a learned scale is a vector; a 2-D table multiplied in (rotary cos/sin) is not
                statics = [nm for nm in statics if sum(d != 1 for d in (self._shape(nm) or (2, 2))) <= 1]
            params = self._claim(statics, [k], weight=False)
        rg = (self._rg(*acts) or params > 0) and op not in _BOOL_OUT
        out_nm = n.output[0]
        out_dtype = "bool" if op in _BOOL_OUT else None
        if kernel == "gelu" and len(operands) > 1:
            operands = operands[:2]
        y = self.b.elementwise(kernel, *operands, name=name, grad=rg, out_dtype=out_dtype)
        if params:
            self.b.own_params(y, params)
        self._set(out_nm, self._view(y, self._out_shape(out_nm, y.shape, y.shape)), rg)

    def _attention(self, k, n, name, ins):
        q, kk, v = (self._tensor(i) for i in ins[:3])
        causal = bool(_attr(n, "is_causal", 0))
        if len(q.shape) == 3:
            hq = int(_attr(n, "q_num_heads", 0) or 0)
            hk = int(_attr(n, "kv_num_heads", 0) or hq)
            if not hq:
                raise GraphError("3-D Attention without q_num_heads")
            b, s, dq = q.shape
            q = self._view(q, (b, hq, s, dq // hq))
            kk = self._view(kk, (kk.shape[0], hk, kk.shape[1], kk.shape[2] // hk))
            v = self._view(v, (v.shape[0], hk, v.shape[1], v.shape[2] // hk))
        with self.b.tag("attn_core"):
            y = self.b.flash_attention(q, kk, v, causal=causal, name=name)
        out_nm = n.output[0]
        y = self._view(y, self._out_shape(out_nm, y.shape))
        self.b.link(y, [self._tensor(i) for i in ins[3:] if i and not self._is_static(i)])
        self._set(out_nm, y, self._rg(*ins[:3]))
        self._register_rest(n, y, False)

    def _einsum(self, k, n, name, ins):
        eq = str(_attr(n, "equation", "")).replace(" ", "")
        tensors = [self._tensor(i) for i in ins if i]
        lhs = eq.split("->")[0].split(",")
        sizes: dict[str, int] = {}
        for t, sub in zip(tensors, lhs):
            if "." in sub or len(sub) != len(t.shape):
                raise GraphError(f"Einsum {eq!r}: cannot size the indices")
            for c, d in zip(sub, t.shape):
                sizes[c] = max(sizes.get(c, 1), int(d))
        flops = 2.0 * _numel_dims(list(sizes.values()))
        out_nm = n.output[0]
        y = self.b.opaque(name, tensors, self._out_shape(out_nm, tensors[0].shape), flops=flops, op_class="bmm")
        p = self._claim([i for i in ins if i and self._is_static(i)], [k])
        if p:
            self.b.own_params(y, p)
        self._set(out_nm, y, self._rg(*ins) or p > 0)

    def _emit_unknown(self, k, n, name, ins, *, unmapped: bool) -> None:
        op = n.op_type
        if unmapped:
            self.unmapped[op] = self.unmapped.get(op, 0) + 1
        present = [i for i in ins if i]
        tensors = [self._tensor(i) for i in present if not self._is_static(i)]
        in_bytes = sum(_numel_dims(self._shape(i) or (1,)) * self._ebytes(self._elem(i)) for i in present)
        outs = [o for o in n.output if o]
        default = tensors[0].shape if tensors else None
        out_shapes = [self._out_shape(o, default) for o in outs] or [(1,)]
        out_bytes = sum(_numel_dims(s) * self._ebytes(self._elem(o)) for s, o in zip(out_shapes, outs))
        rg = self._rg(*present)
        y = self.b.opaque(name, tensors, out_shapes[0], flops=0.0, bytes_=float(in_bytes + out_bytes), grad=rg)
        p = self._claim([i for i in present if self._is_static(i)], [k], weight=False)
        if p:
            self.b.own_params(y, p)
        for o, s in zip(outs, out_shapes):
            t = y if o == outs[0] else self.b.alias(s, self._tdtype(self._elem(o)), y.node)
            self._set(o, t, rg or p > 0)


def _constant_int(model, name: str) -> int | None:
    """The value of a scalar integer initializer or Constant output ``name`` (a Loop's trip count), else None."""
    from onnx import numpy_helper

    if not name:
        return None
    for t in model.graph.initializer:
        if t.name == name:
            v = numpy_helper.to_array(t)
            return int(v.reshape(-1)[0]) if v.size == 1 and v.dtype.kind in "iu" else None
    for n in model.graph.node:
        if n.op_type == "Constant" and name in n.output:
            for a in n.attribute:
                if a.name == "value" and a.HasField("t"):
                    v = numpy_helper.to_array(a.t)
                    return int(v.reshape(-1)[0]) if v.size == 1 and v.dtype.kind in "iu" else None
                if a.name == "value_int":
                    return int(a.i)
    return None


def _refuse_control_flow(model, where: str) -> None:
    """GraphError naming the first node that runs a subgraph (Loop, If, Scan, ...): the importer walks one graph and
    would cost the node as a single tiny op, its body never (1,000 iterations of a MatMul as 0.007 ms)."""
    from collections import Counter

    from onnx import AttributeProto

    for k, n in enumerate(model.graph.node):
        bodies = [a.g for a in n.attribute if a.type == AttributeProto.GRAPH]
        bodies += [g for a in n.attribute if a.type == AttributeProto.GRAPHS for g in a.graphs]
        if not bodies:
            continue
        ops = Counter(x.op_type for g in bodies for x in g.node)
        body = ", ".join(f"{c} {op}" for op, c in ops.most_common(5)) or "no ops"
        what = {"If": "runs one of two branch subgraphs", "Scan": "runs its body once per scanned slice"}.get(
            n.op_type, "runs a body subgraph")
        trips = ""
        if n.op_type == "Loop":
            m = _constant_int(model, n.input[0] if n.input else "")
            trips = f" {m:,} times (constant trip count)" if m is not None else " a number of times known only at run time"
        raise GraphError(
            f"{where}: node {n.name or f'#{k}'!r} ({n.op_type}) {what}{trips} ({body}); wattcast does not cost ONNX "
            "control flow and refuses the model rather than count the node as one tiny op. Export with the loop "
            "unrolled and the branch taken (torch.onnx.export traces Python loops and ifs that way; avoid "
            "torch.jit.script), or give a Hugging Face config")


def graph_from_onnx(path_or_model, *, batch: int | None = None, seq: int | None = None, dtype: str | None = None,
                    train: bool = False, dims: dict[str, int] | None = None) -> OpGraph:
    """The forward operator graph of an ONNX model (a path, a ``ModelProto`` or its bytes).

    ``batch`` / ``seq`` bind symbolic input dims named like batch / sequence (see :data:`BATCH_DIM_NAMES`,
    :data:`SEQ_DIM_NAMES`); ``dims`` binds any other symbolic dim by name (or ``"input:axis"`` for an
    unnamed one). ``dtype`` overrides the dtype read from the model's float tensors; ``train`` turns on
    dropout kernels. Weight values are never needed: external-data files may be missing.

    ``graph.meta`` has ``source="onnx"``, ``param_count``, ``n_layers``, ``unmapped_ops`` (op type ->
    count of the ops costed by the roofline because nothing maps them), ``dims`` (the bound symbolic
    dims), ``batch`` / ``seq`` (None when the model's dims are fixed: the option is then listed in
    ``ignored_options``), ``opset``, ``onnx_nodes`` and, when relevant, ``unknown_shapes`` (outputs whose
    shape had to be guessed), ``fallback_ops`` (mapped ops whose handler failed: roofline, with
    ``warnings``) and ``shape_only_weights``.
    Raises :class:`GraphError` for a missing, corrupt or truncated file or an unbound symbolic dim.
    """
    if batch is not None and int(batch) <= 0:
        raise GraphError(f"batch must be positive, got {batch}")
    if seq is not None and int(seq) <= 0:
        raise GraphError(f"seq must be positive, got {seq}")
    model, where, base = _load(path_or_model)
    if not len(model.graph.node):
        raise GraphError(f"{where}: the ONNX graph has no nodes (nothing runs, so there is no step to predict); "
                         "was the model exported empty or stripped?")
    _refuse_control_flow(model, where)
    shape_only = _declare_shape_only_weights(model)
    tied = _tied_by_value(model)
    consts = _small_constants(model)
    _strip_weights(model)
    env, used = _bind_inputs(model, batch, seq, dims)
    inferred, err = _infer(model)
    name = Path(where).stem if base is not None else (model.graph.name or "onnx_model")
    imp = _Importer(inferred, dtype=dtype, train=train, name=name, tied=tied, consts=consts)
    fixed = _fixed_batch_seq(model)
    meta = dict(name=name, dims=env, producer=model.producer_name or "",
                batch=batch if "batch" in used else fixed["batch"], seq=seq if "seq" in used else fixed["seq"])
    if base is not None:
        meta["path"] = str(base)
    if err:
        meta["shape_inference_error"] = err
    if shape_only:
        meta["shape_only_weights"] = shape_only  # declared in value_info only
    # an option the fixed dims cannot take (one equal to the exported size is simply met)
    ignored = [f"{o}={v}" for o, v in (("batch", batch), ("seq", seq))
               if v is not None and o not in used and fixed[o] != int(v)]
    if ignored:
        meta["ignored_options"] = ignored  # the model's input dims are fixed
    return imp.run(meta)
