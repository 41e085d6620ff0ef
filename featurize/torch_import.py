"""Import a PyTorch ``nn.Module`` as an operator graph, via ``torch.export`` on the meta device.

:func:`graph_from_module` puts the module on the meta device (no weight memory: a module whose
parameters are real is copied structure-only, the caller's module is left as it is), exports it with
``torch.export.export(..., strict=False)`` on meta example inputs and walks the exported ATen graph
(``ep.graph_module.graph``; no ``run_decompositions``), calling the :class:`GraphBuilder` method of each
op with the shapes and dtypes of the FakeTensors in ``node.meta["val"]``. A 2.7B-parameter GPT traces in
about two seconds (``benchmarks/bench_torch_export.py``).

Op mapping (ATen op packet names; in-place ``op_`` variants map like ``op``):

- GEMMs: ``linear``, ``addmm``, ``mm`` and ``matmul`` with a parameter operand (the parameter
  placeholders of ``ep.graph_signature``, also through views such as ``t``) -> ``linear`` (its
  parameters counted once: a tied weight used again, e.g. the LM head sharing the token embedding, gets
  ``weight_params=False``); ``bmm``, ``matmul`` of two activations, ``baddbmm`` -> ``matmul``; a
  two-operand ``einsum`` -> ``linear`` (activation x parameter) or ``matmul`` by its index groups;
  ``embedding`` -> ``embedding``; ``convolution``/``conv2d`` -> ``conv2d`` when square (else opaque).
- ``layer_norm``/``native_layer_norm`` -> ``layernorm``; ``rms_norm`` -> ``layernorm(rms=True)``;
  ``softmax``/``_softmax``/``_safe_softmax``/``log_softmax`` -> ``softmax``;
  ``scaled_dot_product_attention`` and its ``_flash``/``_efficient``/``_cudnn``/``_for_cpu`` kernels ->
  ``flash_attention`` (``is_causal`` from the call); ``cross_entropy_loss`` -> ``cross_entropy``.
- elementwise: ``add sub rsub mul div pow gelu relu tanh silu sigmoid exp neg sqrt rsqrt`` (tensor or
  scalar kernel by operand), ``where masked_fill maximum minimum``; ``dropout``/``native_dropout``
  (training only). Ops outside the kernel vocabulary that move the same bytes are *approximated* by a
  vocabulary kernel and counted in ``meta["approximated_ops"]``: comparisons and logical/bitwise ops
  (costed as ``add``, 1-byte output, no gradient), cheap unary ops (``abs clamp square floor`` ..., as
  ``relu``), transcendental ones (``cos sin log erf reciprocal`` ..., as ``exp``), gathers (``index``,
  ``gather``, ``index_select``: a copy of the output), regression losses (``mse_loss`` ...:
  ``sub`` + reduction), ``nll_loss`` (a reduction over the target).
- free views (no kernel): ``view reshape``\\ (of a contiguous tensor) ``expand unsqueeze squeeze permute
  transpose t slice select split chunk unbind alias detach narrow flatten unflatten``...; ``contiguous``
  of a contiguous tensor and ``to``/``type_as`` without a dtype change are free too.
- ``copy``: ``clone``, ``contiguous`` (of a strided tensor), ``_to_copy``/``to`` (a cast), ``cat``,
  ``stack``, ``copy_``, ``repeat``, ``pad``, ``roll``, ``flip``...
- ``reduction``: ``mean sum amax amin max min argmax argmin var std prod logsumexp norm``...
- tensor creation (``arange zeros ones full empty *_like rand* scalar_tensor``; ``tril``/``triu`` off the
  gradient path): no kernel.
- ``torch.no_grad``/autocast regions (``wrap_with_set_grad_enabled``/``wrap_with_autocast``) are walked
  into.
- anything else with tensor outputs (``cumsum``, ``sort``, ``topk``, ``scatter``, batch/group norm, ...)
  -> ``opaque`` (roofline, flagged) and counted in ``meta["unmapped_ops"]`` (``{"aten.sort.default": 1}``);
  a mapped op whose arguments the mapping cannot handle falls back the same way. Nothing is dropped.

Gradients: parameters require grad; inputs and buffers do not; an op requires grad when one of its tensor
inputs does, so mask and position computations get no backward kernels.

Layers: the module path of ``node.meta["nn_module_stack"]`` is the node's ``scope``; a numeric path
component after ``h``/``layers``/``layer``/``blocks``/``block`` is its layer. Ops before the first block
are layer -1, after the last ``n_layers``. The attention core (the activation-by-activation GEMM
``Q K^T``, everything elementwise from it up to the GEMM with ``V``; a fused attention) is tagged
``attn_core`` for selective recomputation.
"""

from __future__ import annotations

import copy
import math
import operator
import re
import time
from collections import Counter
from typing import Any

import torch
import torch.fx

from wattcast.data.kernel_ops import canonical_dtype
from wattcast.featurize.op_graph import GraphBuilder, GraphError, OpGraph, Tensor

__all__ = ["graph_from_module", "graph_from_exported_program"]

_TORCH_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _TORCH_DTYPE_NAMES[getattr(torch, _name)] = "fp8"
#: non-float dtypes: the label the graph carries (1-byte masks as ``fp8``, like the builder's dropout mask)
_OTHER_DTYPE_NAMES = {torch.bool: "fp8", torch.uint8: "fp8", torch.int8: "fp8", torch.int16: "fp16",
                      torch.int32: "int32", torch.int64: "int64", torch.float64: "fp64"}

_LAYER_RE = re.compile(r"(?:^|\.)(?:h|layers|layer|blocks|block)\.(\d+)(?:\.|$)")

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
#: ops whose output stays inside the attention core when an input is in it (Q K^T ... P V)
_ATTN_PROPAGATE = (frozenset(_ELEMENTWISE) | _SOFTMAX | _DROPOUT | _VIEWS | _RESHAPES | _COPIES
                   | _APPROX_CHEAP_UNARY | _APPROX_TRANSCENDENTAL | frozenset(("contiguous", "to", "type_as")))
_GEMMS = frozenset(("linear", "addmm", "mm", "matmul", "bmm", "baddbmm", "einsum"))
_NO_KERNEL = frozenset(("_assert_tensor_metadata", "_assert_scalar", "sym_size", "sym_stride", "sym_numel",
                        "sym_storage_offset", "_assert_async", "sym_constrain_range", "sym_constrain_range_for_size",
                        "_functional_assert_async", "_functional_sym_constrain_range", "set_", "resize_",
                        "_local_scalar_dense", "item", "dim", "size", "stride", "numel"))


def _dtype_name(d: torch.dtype) -> str | None:
    return _TORCH_DTYPE_NAMES.get(d) or _OTHER_DTYPE_NAMES.get(d)


def _shape(val: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in val.shape)


def _is_tensor(val: Any) -> bool:
    return isinstance(val, torch.Tensor)


def _tensors_in(val: Any) -> list:
    if _is_tensor(val):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _tensors_in(v)]
    return []


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path = str(list(stack.values())[-1][0])
    path = re.sub(r"^L\['self'\]\.?", "", path)
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    path = re.sub(r"\[['\"]?([^\]'\"]+)['\"]?\]", r".\1", path)
    return path.strip(".")


def _raw_layer(path: str) -> int | None:
    m = _LAYER_RE.search(path)
    return int(m.group(1)) if m else None


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


def _bind(node: torch.fx.Node) -> dict:
    """The node's arguments by schema name (positional and keyword), defaults filled in."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is None:
        out = {i: a for i, a in enumerate(node.args)}
        out.update(node.kwargs)
        return out
    out = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            out[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            out[arg.name] = None
    return out


def _attach_params(builder: GraphBuilder, tensor: Tensor, n: int) -> None:
    """Count ``n`` parameters on the node that produced ``tensor`` (GraphBuilder has no public way)."""
    if n == 0:
        return
    builder.add_params(n)
    if tensor.node >= 0:
        builder._nodes[tensor.node].values["param_count"] += int(n)  # noqa: SLF001


def _drop_backward(builder: GraphBuilder, first: int) -> None:
    """Nodes from ``first`` on are off the gradient path (no_grad, frozen weights, buffers): no backward
    kernels and no saved activations (GraphBuilder's GEMMs always record theirs)."""
    for n in builder._nodes[first:]:  # noqa: SLF001
        n.backward = []
        n.saves = []


def _add_edges(builder: GraphBuilder, tensor: Tensor, inputs: list[Tensor]) -> None:
    """Extra data-dependency edges into the node that produced ``tensor`` (multi-input copies)."""
    if tensor.node < 0:
        return
    node = builder._nodes[tensor.node]  # noqa: SLF001
    for t in inputs:
        if t.node >= 0 and t.node not in node.inputs:
            node.inputs.append(t.node)


class _Importer:
    """Walks one exported program into a GraphBuilder."""

    def __init__(self, ep: "torch.export.ExportedProgram", builder: GraphBuilder, float_dtype: torch.dtype | None) -> None:
        self.gm = ep.graph_module
        self.b = builder
        self.float_dtype = float_dtype
        self.param_names = dict(ep.graph_signature.inputs_to_parameters)  # placeholder -> fqn (buffers: no grad)
        self.vals: dict[torch.fx.Node, Any] = {}
        self.grad: dict[torch.fx.Node, bool] = {}
        self.root: dict[torch.fx.Node, str] = {}  # node -> parameter fqn (the parameter or a view of it)
        self.attn_open: set[torch.fx.Node] = set()
        self.claimed: set[str] = set()
        self.param_numel: dict[str, int] = {}
        self.unmapped: Counter = Counter()
        self.approximated: Counter = Counter()
        self.fallback_reasons: dict[str, str] = {}
        self.layer_of: dict[torch.fx.Node, int] = {}
        self.n_layers = 0
        self._grad_enabled = True

    # ------------------------------------------------------------ helpers
    def dt(self, d: torch.dtype) -> str:
        """The graph dtype label of a traced dtype: the model's float dtype is the costed ``dtype``."""
        if d == self.float_dtype or d.is_complex:
            return self.b.dtype
        return _dtype_name(d) or self.b.dtype

    def value(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return self.vals.get(a)
        if isinstance(a, (list, tuple)):
            return type(a)(self.value(x) for x in a)
        return a

    def tensor_inputs(self, node: torch.fx.Node) -> list[torch.fx.Node]:
        return [a for a in node.all_input_nodes if isinstance(self.vals.get(a), (Tensor, list, tuple))]

    def as_tensor(self, val: Any) -> Tensor:
        """A graph Tensor for a FakeTensor that no kernel produced (input, parameter, buffer, constant)."""
        return self.b.input(_shape(val), self.dt(val.dtype))

    def alias(self, x: Tensor, val: Any) -> Tensor:
        """A view: the same memory (node, tensor id) under the shape of ``val``."""
        return Tensor(_shape(val), self.dt(val.dtype), x.node, x.tid)

    def claim(self, a: Any) -> int:
        """Parameters an op takes ownership of: the numel of ``a``'s parameter, the first time it is used."""
        if not isinstance(a, torch.fx.Node):
            return 0
        fqn = self.root.get(a)
        if fqn is None or fqn in self.claimed:
            return 0
        self.claimed.add(fqn)
        return self.param_numel[fqn]

    def is_param(self, a: Any) -> bool:
        return isinstance(a, torch.fx.Node) and a in self.root

    def needs_grad(self, args: list) -> bool:
        return self._grad_enabled and any(self.grad.get(a, False) for a in args if isinstance(a, torch.fx.Node))

    # ------------------------------------------------------------ layers
    def assign_layers(self, graph: torch.fx.Graph) -> None:
        calls = [n for n in graph.nodes if n.op == "call_function"]
        raw = [_raw_layer(_module_path(n)) for n in calls]
        found = [i for i, r in enumerate(raw) if r is not None]
        if not found:
            self.n_layers = 0
            for n in calls:
                self.layer_of[n] = -1
            return
        self.n_layers = max(raw[i] for i in found) + 1
        first, last = found[0], found[-1]
        current = -1
        for i, (n, r) in enumerate(zip(calls, raw)):
            if r is not None:
                current = r
            elif i < first:
                current = -1
            elif i > last:
                current = self.n_layers
            self.layer_of[n] = current

    # ------------------------------------------------------------ walk
    def run(self) -> None:
        graph = self.gm.graph
        self.assign_layers(graph)
        self.walk(graph, None, parent_layer=-1)

    def walk(self, graph: torch.fx.Graph, args: list | None, parent_layer: int, gm: torch.nn.Module | None = None) -> Any:
        gm = gm if gm is not None else self.gm
        placeholders = iter(args) if args is not None else None
        for node in graph.nodes:
            if node.op == "placeholder":
                if placeholders is not None:  # a sub-graph: bind the caller's argument
                    src = next(placeholders, None)
                    if isinstance(src, torch.fx.Node):
                        self.vals[node] = self.vals.get(src)
                        self.grad[node] = self.grad.get(src, False)
                        if src in self.root:
                            self.root[node] = self.root[src]
                        if src in self.attn_open:
                            self.attn_open.add(node)
                    else:
                        self.vals[node] = src
                    continue
                self.placeholder(node)
            elif node.op == "get_attr":
                obj = getattr(gm, str(node.target), None)
                if _is_tensor(obj):
                    self.vals[node] = self.as_tensor(obj)
                    self.grad[node] = False
                else:
                    self.vals[node] = obj
            elif node.op == "call_function":
                layer = self.layer_of.get(node)
                if layer is None:
                    r = _raw_layer(_module_path(node))
                    layer = r if r is not None else parent_layer
                self.call(node, layer, gm)
            elif node.op == "output":
                return self.value(node.args[0])
            else:  # call_module / call_method do not occur in exported programs
                self.fallback(node, f"unsupported FX node kind {node.op}")
        return None

    def placeholder(self, node: torch.fx.Node) -> None:
        val = node.meta.get("val")
        if not _is_tensor(val):
            self.vals[node] = val
            self.grad[node] = False
            return
        self.vals[node] = self.as_tensor(val)
        fqn = self.param_names.get(node.name)
        if fqn is not None:
            self.root[node] = fqn
            self.param_numel[fqn] = val.numel()
            self.grad[node] = bool(getattr(val, "requires_grad", True))
        else:
            self.grad[node] = False

    def call(self, node: torch.fx.Node, layer: int, gm: torch.nn.Module) -> None:
        target = node.target
        if target is operator.getitem:
            seq, idx = node.args
            src = self.vals.get(seq)
            self.vals[node] = src[idx] if isinstance(src, (list, tuple)) and idx < len(src) else None
            self.grad[node] = self.grad.get(seq, False)
            if seq in self.attn_open:
                self.attn_open.add(node)
            if seq in self.root:
                self.root[node] = self.root[seq]
            return
        pkt = _packet(target)
        val = node.meta.get("val")
        if pkt in ("wrap_with_set_grad_enabled", "wrap_with_autocast"):
            self.subgraph(node, pkt, layer)
            return
        if not _tensors_in(val) and pkt not in ("copy",):
            self.vals[node] = val  # symbolic sizes, assertions: no kernel
            self.grad[node] = False
            return
        inputs = self.tensor_inputs(node)
        open_in = any(a in self.attn_open for a in inputs)
        tag = ""
        if pkt in _SDPA:
            tag = "attn_core"
        elif pkt in ("matmul", "bmm", "baddbmm", "einsum"):
            a = _bind(node)
            if pkt == "einsum":
                ops = list(a.get("tensors") or [])
            else:
                ops = [a.get("batch1"), a.get("batch2")] if pkt == "baddbmm" else [a.get("self"), a.get("other", a.get("mat2"))]
            ops = [o for o in ops if isinstance(o, torch.fx.Node)]
            act_act = len(ops) == 2 and not any(self.is_param(o) for o in ops)
            if act_act and (open_in or all(self.grad.get(o, False) for o in ops)):
                tag = "attn_core"  # Q K^T opens the core, P V closes it
                if not open_in:
                    self.attn_open.add(node)
        elif open_in and pkt in _ATTN_PROPAGATE:
            tag = "attn_core"
            self.attn_open.add(node)
        self.grad[node] = self.needs_grad(inputs)
        first_new = len(self.b._nodes)  # noqa: SLF001
        with self.b.layer(layer, _module_path(node)), self.b.tag(tag):
            try:
                out = self.map(node, pkt, val)
            except (GraphError, TypeError, ValueError, IndexError, KeyError, AttributeError) as e:
                out = self.fallback(node, f"{type(e).__name__}: {e}")
            if out is NotImplemented:
                out = self.fallback(node, "no mapping")
        self.vals[node] = out
        if not self.grad[node]:
            _drop_backward(self.b, first_new)
        if node not in self.root:  # a cast of a parameter leaves it to the op that consumes the cast
            self.claim_leftover(node, out)

    def subgraph(self, node: torch.fx.Node, pkt: str, layer: int) -> None:
        a = list(node.args)
        if pkt == "wrap_with_set_grad_enabled":
            enabled, sub, rest = bool(a[0]), a[1], a[2:]
        else:  # wrap_with_autocast(device_type, dtype, enabled, cache_enabled, submod, *args)
            enabled, sub, rest = self._grad_enabled, a[4], a[5:]
        gm = self.vals.get(sub) if isinstance(sub, torch.fx.Node) else sub
        if not isinstance(gm, torch.fx.GraphModule):
            self.vals[node] = self.fallback(node, "sub-graph not found")
            return
        old = self._grad_enabled
        self._grad_enabled = enabled and old
        try:
            out = self.walk(gm.graph, rest, parent_layer=layer, gm=gm)
        finally:
            self._grad_enabled = old
        self.vals[node] = out
        self.grad[node] = self._grad_enabled and enabled and self.needs_grad([x for x in rest if isinstance(x, torch.fx.Node)])

    def claim_leftover(self, node: torch.fx.Node, out: Any) -> None:
        """A parameter consumed by an op that does not own parameters (``x * self.scale``): count it there."""
        first = next(iter(self._flat(out)), None)
        if first is None or first.node < 0:
            return
        for a in node.all_input_nodes:
            if a in self.root and self.root[a] not in self.claimed:
                _attach_params(self.b, first, self.claim(a))

    def fallback(self, node: torch.fx.Node, reason: str) -> Any:
        """An op with no surrogate: one opaque (roofline) node, flagged in ``unmapped_ops``."""
        label = _op_label(node.target)
        self.unmapped[label] += 1
        self.fallback_reasons.setdefault(label, reason)
        val = node.meta.get("val")
        outs = _tensors_in(val)
        ins = [t for a in node.all_input_nodes for t in self._flat(self.vals.get(a))]
        if not outs:
            return None
        out_bytes = sum(o.numel() * max(1, o.element_size()) for o in outs)
        total = sum(t.nbytes for t in ins) + out_bytes
        grad = self.needs_grad(node.all_input_nodes)
        op_class = "conv" if _packet(node.target) in _CONV else "other"
        first = self.b.opaque(node.name, ins, _shape(outs[0]), flops=float(sum(o.numel() for o in outs)),
                              bytes_=float(total), op_class=op_class, grad=grad)
        res = self._like(val, first)
        for a in node.all_input_nodes:  # parameters of an unmapped op are its own
            if a in self.root:
                _attach_params(self.b, first, self.claim(a))
        return res

    def _flat(self, v: Any) -> list[Tensor]:
        if isinstance(v, Tensor):
            return [v]
        if isinstance(v, (list, tuple)):
            return [t for x in v for t in self._flat(x)]
        return []

    def _like(self, val: Any, first: Tensor) -> Any:
        """Outputs shaped like ``val`` (a tensor or a tuple of them), all produced by ``first``'s node."""
        if _is_tensor(val):
            return Tensor(_shape(val), self.dt(val.dtype), first.node, first.tid)
        if isinstance(val, (list, tuple)):
            return type(val)(self._like(v, first) if (_is_tensor(v) or isinstance(v, (list, tuple))) else v for v in val)
        return val

    # ------------------------------------------------------------ the mapping
    def map(self, node: torch.fx.Node, pkt: str, val: Any) -> Any:
        b = self.b
        a = _bind(node)
        V = self.value
        grad = self.grad[node]
        name = node.name

        if pkt in _VIEWS:
            x = V(node.args[0])
            if isinstance(x, (list, tuple)):
                x = x[0]
            if node.args and node.args[0] in self.root:
                self.root[node] = self.root[node.args[0]]
            return self._view_like(x, val)
        if pkt in _RESHAPES or pkt == "contiguous":
            src = node.args[0]
            x = V(src)
            if src in self.root:
                self.root[node] = self.root[src]
            sval = src.meta.get("val")
            contiguous = _is_tensor(sval) and sval.is_contiguous()
            if pkt == "contiguous":
                # the memory format asked for (channels_last...) decides; contiguous of a contiguous tensor is free
                fmt = a.get("memory_format")
                if contiguous and fmt in (None, torch.contiguous_format):
                    return self.alias(x, val)
                return b.copy(x, _shape(val), name=name, grad=grad)
            if contiguous or _shape(sval) == _shape(val):
                return self.alias(x, val)
            return b.copy(x, _shape(val), name=name, grad=grad)
        if pkt in ("to", "type_as") or pkt == "_to_copy":
            src = node.args[0]
            x = V(src)
            sval = src.meta.get("val")
            if src in self.root:  # a (cast) parameter: the GEMM consuming it still owns the weight
                self.root[node] = self.root[src]
            if pkt != "_to_copy" and _is_tensor(sval) and sval.dtype == val.dtype and sval.device == val.device:
                return self.alias(x, val)
            return b.copy(x, _shape(val), name=name, grad=grad)
        if pkt in _CREATION or (pkt in ("tril", "triu") and not grad):
            self.grad[node] = False
            return self.as_tensor(val)
        if pkt in ("tril", "triu"):
            return b.copy(V(node.args[0]), name=name, grad=grad)

        if pkt in _GEMMS:
            return self._gemm(node, pkt, a, val, name)
        if pkt == "embedding":
            w, ids = a["weight"], V(a["indices"])
            vocab, dim = (int(s) for s in w.meta["val"].shape)
            n = self.claim(w)
            return b.embedding(ids, vocab, dim, name=name, params=n > 0)
        if pkt in _LAYERNORM or pkt in _RMSNORM:
            x = V(a["input"])
            rms = pkt in _RMSNORM
            w, bias = a.get("weight"), a.get("bias")
            owned = self.claim(w) + self.claim(bias)
            out = b.layernorm(x, name=name, bias=bias is not None, rms=rms)
            counted = int(x.shape[-1]) * (1 if rms or bias is None else 2)
            _attach_params(b, out, owned - counted)  # the builder assumed an affine LN over the last dim
            return self._like(val, out) if isinstance(val, (list, tuple)) else out
        if pkt in _SOFTMAX:
            x = V(a.get("self", node.args[0]))
            return b.softmax(x, name=name)
        if pkt in _SDPA:
            return self._attention(node, pkt, a, val, name)
        if pkt == "cross_entropy_loss":
            x = V(a["self"])
            if len(x.shape) > 2:  # (N, C, d1...): the class dim is dim 1
                c = int(x.shape[1])
                x = Tensor((x.numel // c, c), x.dtype, x.node, x.tid)
            return b.cross_entropy(x, name=name)
        if pkt in _NLL:
            x, t = V(a["self"]), V(a["target"])
            self.approximated[_op_label(node.target)] += 1
            picked = Tensor(t.shape, x.dtype, x.node, x.tid)  # reads one log-probability per target
            return self._like(val, b.reduction(picked, _shape(_tensors_in(val)[0]), name=name, grad=grad))
        if pkt in _REGRESSION_LOSSES:
            x, y = V(a["self"]), V(a.get("target"))
            self.approximated[_op_label(node.target)] += 1
            diff = b.elementwise("sub", x, y if isinstance(y, Tensor) else 0.0, name=f"{name}.diff", grad=grad)
            if int(a.get("reduction", 1) or 0) == 0:
                return diff
            return b.reduction(diff, (), name=name, grad=grad)

        if pkt in _DROPOUT:
            x = V(a.get("input", a.get("self")))
            p = float(a.get("p", 0.0) or 0.0)
            active = bool(a.get("train", True))
            out = b.dropout(x, p, name=name) if active else x
            if isinstance(val, (list, tuple)):  # native_dropout: (output, mask)
                return (out, Tensor(x.shape, "fp8", out.node, out.tid))
            return out

        if pkt in _ELEMENTWISE or pkt in _COMPARISONS or pkt in _APPROX_CHEAP_UNARY or pkt in _APPROX_TRANSCENDENTAL \
                or pkt in _APPROX_BINARY:
            return self._elementwise(node, pkt, val, name, grad)

        if pkt in _MULTI_INPUT_COPIES:
            parts = [t for t in self._flat(V(node.args[0]))]
            if not parts:
                return self.as_tensor(val)
            out_shape = _shape(val)
            carrier = Tensor(out_shape, parts[0].dtype, parts[0].node, parts[0].tid)
            out = b.copy(carrier, out_shape, name=name, grad=grad)
            _add_edges(b, out, parts)
            return out
        if pkt == "copy":  # copy_(self, src): write src into self
            dst, src = V(node.args[0]), V(node.args[1])
            src = src if isinstance(src, Tensor) else dst
            out = b.copy(Tensor(dst.shape, src.dtype, src.node, src.tid), name=name, grad=grad)
            _add_edges(b, out, [dst])
            return out
        if pkt in _COPIES:
            x = V(node.args[0])
            out_shape = _shape(val)
            carrier = Tensor(out_shape, x.dtype, x.node, x.tid)
            return b.copy(carrier, out_shape, name=name, grad=grad)
        if pkt in _GATHERS:
            x = V(node.args[0])
            self.approximated[_op_label(node.target)] += 1
            out_shape = _shape(val)
            idx = [t for t in self._flat(V(list(node.args[1:]))) if isinstance(t, Tensor)]
            out = b.copy(Tensor(out_shape, x.dtype, x.node, x.tid), out_shape, name=name, grad=grad)
            _add_edges(b, out, idx)
            return out

        if pkt in _REDUCTIONS or (pkt in ("max", "min") and _overload(node) not in ("other", "out")):
            x = V(node.args[0])
            outs = _tensors_in(val)
            differentiable = pkt not in ("argmax", "argmin", "any", "all", "count_nonzero")
            first = b.reduction(x, _shape(outs[0]), name=name, grad=grad and differentiable)
            return self._like(val, first)
        if pkt in ("max", "min"):  # max.other / min.other: elementwise
            return self._elementwise(node, "maximum", val, name, grad)

        if pkt in _CONV:
            return self._conv(node, pkt, a, val, name)
        return NotImplemented

    def _view_like(self, x: Tensor, val: Any) -> Any:
        if _is_tensor(val):
            return self.alias(x, val)
        return type(val)(self.alias(x, v) for v in val)

    def _elementwise(self, node: torch.fx.Node, pkt: str, val: Any, name: str, grad: bool) -> Tensor:
        b = self.b
        operands: list = []
        for arg in list(node.args) + list(node.kwargs.values()):
            v = self.value(arg)
            if isinstance(v, Tensor):
                operands.append(v)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                operands.append(float(v))
        tensors = [t for t in operands if isinstance(t, Tensor)]
        out_dtype = self.dt(val.dtype)
        out_dtype = None if out_dtype == b.dtype else out_dtype
        if pkt in _ELEMENTWISE:
            op = _ELEMENTWISE[pkt]
        elif pkt == "maximum":
            op = "maximum"
        else:
            self.approximated[_op_label(node.target)] += 1
            if pkt in _COMPARISONS:
                self.grad[node] = grad = False
                op = "maximum" if len([t for t in tensors if t.numel > 1]) >= 2 else "subu"
            elif pkt in _APPROX_CHEAP_UNARY:
                op = "relu"
            elif pkt in _APPROX_TRANSCENDENTAL:
                op = "exp"
            else:
                op = "maximum"
        if op in ("relu", "gelu", "tanh", "silu", "sigmoid", "exp", "neg", "sqrt", "rsqrt", "subu"):
            operands = tensors[:1]  # unary kernels: one tensor (extra scalars are hyper-parameters)
        elif op in ("add", "sub", "mul", "div", "pow"):
            operands = operands[:2]  # drop ``alpha``/``rounding_mode``
        if not tensors:
            return self.as_tensor(val)
        out = b.elementwise(op, *operands, name=name, out_dtype=out_dtype, grad=grad)
        if out.shape != _shape(val):
            out = Tensor(_shape(val), out.dtype, out.node, out.tid)
        return out

    def _gemm(self, node: torch.fx.Node, pkt: str, a: dict, val: Any, name: str) -> Tensor:
        b = self.b
        V = self.value
        out_shape = _shape(val)
        if pkt == "linear":
            x, w, bias = a["input"], a["weight"], a.get("bias")
            if self.is_param(w):
                n_w = self.claim(w)
                n_b = self.claim(bias) if bias is not None else 0
                out = b.linear(V(x), int(w.meta["val"].shape[0]), bias=bias is not None, name=name,
                               weight_params=n_w > 0, needs_input_grad=self.grad.get(x, False))
                if bias is not None and n_b == 0:  # a shared bias already counted elsewhere
                    _attach_params(b, out, -int(out_shape[-1]))
                return self._fix(out, val)
            xt, wt = V(x), V(w)  # a weight that is no parameter (a buffer, a computed tensor): x @ w^T
            xt = xt if len(xt.shape) >= 2 else self._unsq(xt)
            out = b.matmul(xt, Tensor((wt.shape[1], wt.shape[0]), wt.dtype, wt.node, wt.tid), name=name)
            if bias is not None:
                out = b.elementwise("add", out, V(bias), name=f"{name}.bias", grad=self.grad[node])
            return self._fix(out, val)
        if pkt in ("addmm", "mm"):
            x, w = (a["mat1"], a["mat2"]) if pkt == "addmm" else (a["self"], a["mat2"])
            bias = a.get("self") if pkt == "addmm" else None
            if self.is_param(w):
                n_w = self.claim(w)
                n_b = self.claim(bias) if bias is not None else 0
                has_bias = bias is not None and self.is_param(bias)
                out = b.linear(V(x), int(out_shape[-1]), bias=has_bias, name=name, weight_params=n_w > 0,
                               needs_input_grad=self.grad.get(x, False))
                if has_bias and n_b == 0:
                    _attach_params(b, out, -int(out_shape[-1]))
                if bias is not None and not has_bias:
                    out = b.elementwise("add", out, V(bias), name=f"{name}.bias", grad=self.grad[node])
                return self._fix(out, val)
            out = b.matmul(V(x), V(w), name=name)
            if bias is not None:
                out = b.elementwise("add", out, V(bias), name=f"{name}.bias", grad=self.grad[node])
            return self._fix(out, val)
        if pkt == "matmul":
            x, w = a["self"], a["other"]
            if self.is_param(w) and len(w.meta["val"].shape) == 2:
                n_w = self.claim(w)
                return self._fix(b.linear(V(x) if len(V(x).shape) else self._unsq(V(x)), int(w.meta["val"].shape[-1]),
                                          bias=False, name=name, weight_params=n_w > 0,
                                          needs_input_grad=self.grad.get(x, False)), val)
        if pkt in ("matmul", "bmm"):
            x, w = (a["self"], a["other"]) if pkt == "matmul" else (a["self"], a["mat2"])
            xa, wb = V(x), V(w)
            if len(xa.shape) == 1:
                xa = Tensor((1, xa.shape[0]), xa.dtype, xa.node, xa.tid)
            if len(wb.shape) == 1:
                wb = Tensor((wb.shape[0], 1), wb.dtype, wb.node, wb.tid)
            return self._fix(b.matmul(xa, wb, name=name), val)
        if pkt == "baddbmm":
            out = b.matmul(V(a["batch1"]), V(a["batch2"]), name=name)
            if float(a.get("beta", 1) or 0) != 0:
                out = b.elementwise("add", out, V(a["self"]), name=f"{name}.add", grad=self.grad[node])
            return self._fix(out, val)
        if pkt == "einsum":
            return self._einsum(node, a, val, name)
        return NotImplemented

    def _einsum(self, node: torch.fx.Node, a: dict, val: Any, name: str) -> Any:
        """A two-operand einsum as the GEMM it is: batch (in both inputs and the output), M (first input
        and output), N (contracted), K (second input and output) index groups."""
        eq = str(a["equation"]).replace(" ", "")
        ops = list(a["tensors"])
        if len(ops) != 2 or "..." in eq or "->" not in eq:
            return NotImplemented
        lhs, out_idx = eq.split("->")
        ia, ib = lhs.split(",")
        sa, sb = _shape(ops[0].meta["val"]), _shape(ops[1].meta["val"])
        if len(ia) != len(sa) or len(ib) != len(sb) or len(set(ia)) != len(ia) or len(set(ib)) != len(ib):
            return NotImplemented  # repeated indices (diagonals, traces): not a GEMM
        size = {**dict(zip(ia, sa)), **dict(zip(ib, sb))}
        if any(i not in ib and i not in out_idx for i in ia) or any(i not in ia and i not in out_idx for i in ib):
            return NotImplemented  # an index summed within one operand
        prod = lambda idx: math.prod(size[i] for i in idx)  # noqa: E731
        batch = [i for i in ia if i in ib and i in out_idx]
        m_idx = [i for i in ia if i not in ib]
        n_idx = [i for i in ia if i in ib and i not in out_idx]
        k_idx = [i for i in ib if i not in ia]
        bsz, m, n, k = prod(batch), prod(m_idx), prod(n_idx), prod(k_idx)
        x, w = self.value(ops[0]), self.value(ops[1])
        if self.is_param(ops[1]) and not batch:  # activation x weight: a bias-free linear
            n_w = self.claim(ops[1])
            out = self.b.linear(Tensor((m, n), x.dtype, x.node, x.tid), k, bias=False, name=name,
                                weight_params=n_w > 0, needs_input_grad=self.grad.get(ops[0], False))
        else:
            out = self.b.matmul(Tensor((bsz, m, n), x.dtype, x.node, x.tid), Tensor((bsz, n, k), w.dtype, w.node, w.tid),
                                name=name)
        return self._fix(out, val)

    @staticmethod
    def _unsq(x: Tensor) -> Tensor:
        return Tensor((1, *x.shape), x.dtype, x.node, x.tid)

    def _fix(self, out: Tensor, val: Any) -> Tensor:
        shape = _shape(val)
        return out if out.shape == shape else Tensor(shape, out.dtype, out.node, out.tid)

    def _attention(self, node: torch.fx.Node, pkt: str, a: dict, val: Any, name: str) -> Any:
        V = self.value
        q, k, v = V(a["query"]), V(a["key"]), V(a["value"])
        causal = bool(a.get("is_causal", False))

        def four(t: Tensor) -> Tensor:
            if len(t.shape) == 4:
                return t
            if len(t.shape) < 2:
                raise GraphError(f"{name}: attention operand of shape {t.shape}")
            lead = math.prod(t.shape[:-2]) if len(t.shape) > 2 else 1
            return Tensor((1, lead, *t.shape[-2:]), t.dtype, t.node, t.tid)

        out = self.b.flash_attention(four(q), four(k), four(v), causal=causal, name=name)
        first = _tensors_in(val)[0]
        out = Tensor(_shape(first), out.dtype, out.node, out.tid)
        if isinstance(val, (list, tuple)):  # (output, logsumexp, ...): all from the fused kernel
            return type(val)((out if i == 0 else (self._like(x, out) if _is_tensor(x) else x)) for i, x in enumerate(val))
        return out

    def _conv(self, node: torch.fx.Node, pkt: str, a: dict, val: Any, name: str) -> Any:
        x_node, w_node = a["input"], a["weight"]
        bias = a.get("bias")
        x, xv, wv = self.value(x_node), x_node.meta["val"], w_node.meta["val"]
        ks = [int(s) for s in wv.shape[2:]]

        def ints(v: Any, default: int) -> list[int]:
            if v is None:
                return [default] * len(ks)
            v = [int(i) for i in v] if isinstance(v, (list, tuple)) else [int(v)]
            return v * len(ks) if len(v) == 1 else v

        stride, dilation = ints(a.get("stride"), 1), ints(a.get("dilation"), 1)
        padding = a.get("padding")
        if isinstance(padding, str):
            padding = [0] * len(ks) if padding == "valid" else [(k - 1) // 2 for k in ks]
        padding = ints(padding, 0)
        groups = int(a.get("groups", 1) or 1)
        transposed = bool(a.get("transposed", False)) or "transpose" in pkt
        out_shape = _shape(val)
        square = (xv.dim() == 4 and xv.shape[2] == xv.shape[3] and len(ks) == 2 and len(set(ks)) == 1
                  and len(set(stride)) == 1 and len(set(padding)) == 1 and set(dilation) == {1} and groups == 1
                  and not transposed and out_shape[2] == out_shape[3]
                  and out_shape[2] == (int(xv.shape[2]) + 2 * padding[0] - ks[0]) // stride[0] + 1)
        if not square:  # the conv surrogate knows square 2-D convolutions only: roofline, flagged
            self.unmapped[_op_label(node.target)] += 1
            self.fallback_reasons.setdefault(_op_label(node.target), "not a square, dense, non-transposed 2-D convolution")
            c_in = int(wv.shape[0] if transposed else wv.shape[1])
            out_n = math.prod(out_shape)
            flops = 2.0 * (math.prod(_shape(xv)) * int(wv.shape[1]) if transposed else out_n * c_in) * math.prod(ks)
            ins = [t for t in (x, self.value(w_node), self.value(bias)) if isinstance(t, Tensor)]
            out = self.b.opaque(name, ins, out_shape, flops=flops, op_class="conv", grad=self.grad[node])
            _attach_params(self.b, out, self.claim(w_node) + self.claim(bias))
            return out
        out = self.b.conv2d(x, int(wv.shape[0]), ks[0], stride=stride[0], padding=padding[0], bias=bias is not None, name=name)
        # conv2d counted the weight on the conv node and the bias on its bias-add node; own what is really
        # ours (a weight shared with another op was claimed there already)
        n_w, n_b = self.claim(w_node), self.claim(bias)
        conv_node = out.node if bias is None else self.b._nodes[out.node].inputs[0]  # noqa: SLF001 (conv -> bias add)
        conv_t = Tensor(out.shape, out.dtype, conv_node, out.tid)
        _attach_params(self.b, conv_t, n_w - int(wv.numel()))
        if bias is not None:
            _attach_params(self.b, out, n_b - int(wv.shape[0]))
        return out


def _overload(node: torch.fx.Node) -> str:
    return getattr(node.target, "_overloadname", "")


# ---------------------------------------------------------------- public API
def _module_float_dtype(module: torch.nn.Module) -> torch.dtype | None:
    sizes: Counter = Counter()
    for p in module.parameters():
        if p.dtype.is_floating_point:
            sizes[p.dtype] += p.numel()
    return sizes.most_common(1)[0][0] if sizes else None


def _resolve_dtype(dtype: str | None, float_dtype: torch.dtype | None) -> str:
    if dtype is not None:
        return canonical_dtype(dtype)
    if float_dtype is None:
        return "fp32"
    name = _TORCH_DTYPE_NAMES.get(float_dtype)
    if name is None:
        raise GraphError(f"parameters are {float_dtype}, which the kernel models do not cover; pass dtype= "
                         "(fp32, tf32, fp16, bf16 or fp8) to cost the model in another precision")
    return name


def _on_meta(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` itself when all its parameters and buffers are on meta, else a structure-only meta copy."""
    tensors = list(module.parameters()) + list(module.buffers())
    if all(t.device.type == "meta" for t in tensors):
        return module
    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for buf in module.buffers():
        memo[id(buf)] = torch.empty_like(buf, device="meta")
    try:
        return copy.deepcopy(module, memo)
    except Exception as e:  # noqa: BLE001 - any failure to copy means: build it on meta yourself
        raise GraphError(f"could not copy {type(module).__name__} onto the meta device ({type(e).__name__}: {e}); "
                         "build the model under `with torch.device('meta'):` and pass that instead") from e


def _to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x if x.device.type == "meta" else torch.empty_like(x, device="meta")
    if isinstance(x, tuple):
        return tuple(_to_meta(v) for v in x)
    if isinstance(x, list):
        return [_to_meta(v) for v in x]
    if isinstance(x, dict):
        return {k: _to_meta(v) for k, v in x.items()}
    return x


def _export_error(module: torch.nn.Module, e: Exception) -> GraphError:
    msg = str(e).strip().splitlines()
    head = next((line for line in msg if line.strip()), "")
    if len(head) > 400:
        head = head[:400] + "..."
    return GraphError(
        f"torch.export could not trace {type(module).__name__} on the meta device: {type(e).__name__}: {head}. "
        "Export needs a forward pass without data-dependent Python control flow (branches on tensor values, "
        ".item(), .tolist(), .nonzero() sizes) and ops with meta kernels; rewrite such code with torch.where/"
        "torch.cond, or check example_inputs (shapes, dtypes) and kwargs."
    )


def graph_from_exported_program(ep: "torch.export.ExportedProgram", *, dtype: str | None = None, train: bool = False,
                                name: str = "model", param_count: int | None = None, **meta) -> OpGraph:
    """The forward :class:`OpGraph` of an already exported program (see the module docstring for the mapping).

    ``param_count`` (default: the parameters of the program's signature, each once) is what
    ``meta["param_count"]`` reports; parameters no op owns are counted there and in
    ``meta["unattributed_params"]``.
    """
    sig = ep.graph_signature
    placeholders = {n.name: n for n in ep.graph_module.graph.nodes if n.op == "placeholder"}
    sizes: Counter = Counter()
    for ph, fqn in sig.inputs_to_parameters.items():
        v = placeholders[ph].meta.get("val") if ph in placeholders else None
        if _is_tensor(v) and v.dtype.is_floating_point:
            sizes[v.dtype] += v.numel()
    float_dtype = sizes.most_common(1)[0][0] if sizes else None
    if param_count is None:
        param_count = sum(int(placeholders[ph].meta["val"].numel()) for ph in sig.inputs_to_parameters if ph in placeholders)
    builder = GraphBuilder(_resolve_dtype(dtype, float_dtype), train=train, name=name)
    imp = _Importer(ep, builder, float_dtype)
    imp.run()
    unattributed = int(param_count) - builder.param_count
    if unattributed:
        builder.add_params(unattributed)  # parameters no op owns (unused in forward, or a shared bias)
    g = builder.build(source="torch.export", n_layers=imp.n_layers, unmapped_ops=dict(imp.unmapped),
                      approximated_ops=dict(imp.approximated), unmapped_reasons=dict(imp.fallback_reasons),
                      unattributed_params=unattributed, fx_nodes=len(ep.graph_module.graph.nodes), **meta)
    return g


def graph_from_module(module: torch.nn.Module, example_inputs: tuple | None = None, *, batch: int | None = None,
                      seq: int | None = None, dtype: str | None = None, train: bool = False,
                      kwargs: dict | None = None) -> OpGraph:
    """The forward operator graph of ``module``, traced by ``torch.export`` on the meta device.

    ``example_inputs``: the positional inputs of ``forward`` (any device: only shapes and dtypes are used);
    when omitted, token ids ``(batch, seq)`` of dtype long. ``kwargs``: keyword inputs. ``dtype``: the
    precision to cost (``fp32``/``tf32``/``fp16``/``bf16``/``fp8``; default: the parameters' dtype).
    ``train``: export in training mode (dropout active) for a training step. The module is not modified:
    a module with real weights is copied onto meta structure-only (no weight memory). Raises
    :class:`GraphError` when the module cannot be exported.
    """
    if not isinstance(module, torch.nn.Module):
        raise GraphError(f"graph_from_module needs a torch.nn.Module, got {type(module).__name__}")
    if example_inputs is None:
        if batch is None or seq is None:
            raise GraphError("give example_inputs, or batch and seq for token-id inputs of shape (batch, seq)")
        if int(batch) <= 0 or int(seq) <= 0:
            raise GraphError(f"batch and seq must be positive, got batch={batch} seq={seq}")
        example_inputs = (torch.zeros(int(batch), int(seq), dtype=torch.long, device="meta"),)
    elif not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,) if not isinstance(example_inputs, list) else tuple(example_inputs)
    float_dtype = _module_float_dtype(module)
    cost_dtype = _resolve_dtype(dtype, float_dtype)
    param_count = sum(p.numel() for p in module.parameters())
    meta_module = _on_meta(module)
    args = _to_meta(example_inputs)
    kw = _to_meta(dict(kwargs or {}))
    modes = [(m, m.training) for m in meta_module.modules()]
    meta_module.train(bool(train))
    t0 = time.perf_counter()
    try:
        ep = torch.export.export(meta_module, args, kwargs=kw, strict=False)
    except GraphError:
        raise
    except Exception as e:  # noqa: BLE001 - torch.export raises many kinds; all mean "cannot trace"
        raise _export_error(module, e) from e
    finally:
        for m, mode in modes:  # the caller's modes, module by module
            m.training = mode
    export_s = time.perf_counter() - t0
    first = next((x for x in args if isinstance(x, torch.Tensor)), None)
    shape_meta: dict = {}
    if first is not None and first.dim() >= 1:
        shape_meta["batch"] = int(first.shape[0])
        if first.dim() == 2 and not first.dtype.is_floating_point:  # token ids
            shape_meta["seq"] = int(first.shape[1])
    if batch is not None:
        shape_meta["batch"] = int(batch)
    if seq is not None:
        shape_meta["seq"] = int(seq)
    t1 = time.perf_counter()
    g = graph_from_exported_program(ep, dtype=cost_dtype, train=train, name=type(module).__name__,
                                    param_count=param_count, export_seconds=round(export_s, 3), **shape_meta)
    g.meta["import_seconds"] = round(time.perf_counter() - t1, 3)
    return g
