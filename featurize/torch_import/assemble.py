"""Graph assembly of the ``torch.export`` importer: the walk over the exported FX graph (placeholders, parameters and
who owns them, layers and scopes, ``no_grad``/autocast regions, the attention-core tag, roofline fallbacks) and the
public entry points that export a module on the meta device and build its :class:`OpGraph`."""

from __future__ import annotations

import copy
import operator
import re
import time
from collections import Counter
from contextlib import nullcontext
from typing import Any, Iterable

import torch
import torch.fx

from wattcast.data.kernel_ops import canonical_dtype
from wattcast.featurize.op_graph import GraphBuilder, GraphError, OpGraph, attention_pair_share, unmapped_ops_warning
from wattcast.featurize.torch_import.attention import _AttentionCores, triangular_tensor
from wattcast.featurize.torch_import.ops import _attach_params, _Ops
from wattcast.featurize.torch_import.shapes import _bind, _is_tensor, _shape, _tensors_in, _Values
from wattcast.featurize.torch_import.tables import _ATTN_PROPAGATE, _CONV, _SDPA, _TORCH_DTYPE_NAMES, _op_label, _packet

_LAYER_RE = re.compile(r"(?:^|\.)(?:h|layers|layer|blocks|block)\.(\d+)(?:\.|$)")


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


def _drop_backward(builder: GraphBuilder, first: int) -> None:
    """Nodes from ``first`` on are off the gradient path (no_grad, frozen weights, buffers): no backward
    kernels and no saved activations (GraphBuilder's GEMMs always record theirs)."""
    for n in builder._nodes[first:]:  # noqa: SLF001
        n.backward = []
        n.saves = []


class _Importer(_Values, _Ops, _AttentionCores):
    """Walks one exported program into a GraphBuilder: the FX walk, parameters, layers and fallbacks; the
    per-op mapping is ``ops._Ops`` (by ``tables.RULES``), the values and shapes ``shapes._Values``."""

    def __init__(self, ep: "torch.export.ExportedProgram", builder: GraphBuilder, float_dtype: torch.dtype | None,
                 triangular: set[str] | frozenset = frozenset(), attention: str | None = None) -> None:
        self.gm = ep.graph_module
        #: how ``scaled_dot_product_attention`` is costed: "eager" (bmm + softmax + bmm, ops._eager_sdpa), "flash" /
        #: "flash1" (the fused kernel of that class); None: "flash"
        self.attention = attention
        #: the attention kernels the graph holds ("eager": a softmax between two activation products, written out or
        #: an SDPA under attention="eager"; "flash" / "flash1": a fused SDPA), ``meta["attention_costed"]``
        self.attention_kinds: set[str] = set()
        self.b = builder
        self.float_dtype = float_dtype
        self.param_names = dict(ep.graph_signature.inputs_to_parameters)  # placeholder -> fqn (buffers: no grad)
        self.vals: dict[torch.fx.Node, Any] = {}
        self.grad: dict[torch.fx.Node, bool] = {}
        self.root: dict[torch.fx.Node, str] = {}  # node -> parameter fqn (the parameter or a view of it)
        self.attn_open: set[torch.fx.Node] = set()
        #: the nodes of the matmul-written attention cores matched (attention.match_core) -> their model_share: QK^T
        #: and PV at the pairs the mask keeps, the ops between them 0
        self.core_share: dict[torch.fx.Node, float] = {}
        #: buffer / constant placeholders holding a causal mask pattern (``triangular``: their fully qualified names)
        sig = ep.graph_signature
        stored = {**sig.inputs_to_buffers, **dict(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {})}
        self.mask_nodes: set[torch.fx.Node] = {n for n in ep.graph_module.graph.nodes
                                               if n.op == "placeholder" and stored.get(n.name) in triangular}
        self.bound_to: dict[torch.fx.Node, torch.fx.Node] = {}  # a sub-graph's placeholder -> the caller's argument
        self.claimed: set[str] = set()
        self.param_numel: dict[str, int] = {}
        self.unmapped: Counter = Counter()
        self.approximated: Counter = Counter()
        self.fallback_reasons: dict[str, str] = {}
        self.layer_of: dict[torch.fx.Node, int] = {}
        self.n_layers = 0
        self._grad_enabled = True

    # ------------------------------------------------------------ parameters
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
                        self.bound_to[node] = src
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
                    if triangular_tensor(obj):
                        self.mask_nodes.add(node)
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
                    self.open_core(node, val)
        elif open_in and pkt in _ATTN_PROPAGATE:
            tag = "attn_core"
            self.attn_open.add(node)
        self.grad[node] = self.needs_grad(inputs)
        first_new = len(self.b._nodes)  # noqa: SLF001
        share = self.core_share.get(node)
        with self.b.layer(layer, _module_path(node)), self.b.tag(tag), \
                (self.b.model_share(share) if share is not None else nullcontext()):
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

    def open_core(self, qk: torch.fx.Node, val: Any) -> None:
        """A Q K^T product opens an attention core: when the core is matched (attention.match_core), its kernels count
        in model FLOPs as hf_blocks.eager_attention's: QK^T and PV at the pairs the mask keeps (the (.., S, S_kv)
        scores' attention_pair_share), the ops between them 0."""
        core = self.match_core(qk) if _is_tensor(val) and val.dim() >= 2 else None
        if core is None:
            return
        chain, pv, causal = core
        self.attention_kinds.add("eager")
        s, skv = int(val.shape[-2]), int(val.shape[-1])
        self.core_share.update({n: 0.0 for n in chain})
        self.core_share[qk] = self.core_share[pv] = attention_pair_share(s, skv, causal=causal)

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
                              bytes_=float(total), op_class=op_class, grad=grad, op_type=label)
        res = self._like(val, first)
        for a in node.all_input_nodes:  # parameters of an unmapped op are its own
            if a in self.root:
                _attach_params(self.b, first, self.claim(a))
        return res


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
                                name: str = "model", param_count: int | None = None,
                                triangular_buffers: Iterable[str] | None = None, attention: str | None = None,
                                flash_kernel: str = "fa2", **meta) -> OpGraph:
    """The forward :class:`OpGraph` of an already exported program (see the module docstring for the mapping).

    ``param_count`` (default: the parameters of the program's signature, each once) is what
    ``meta["param_count"]`` reports; parameters no op owns are counted there and in
    ``meta["unattributed_params"]``. ``triangular_buffers``: fully qualified names of buffers / constants holding a
    causal mask (:func:`graph_from_module` reads them off the module's real buffers, the program being traced on
    meta); the program's own real buffers and constants are read too.
    ``attention``: how ``scaled_dot_product_attention`` is costed, "eager" (bmm + softmax + bmm), "flash", "flash1" or
    "flash3" (the fused kernel of that class: FlashAttention-2 / -1 / -3; "flash" takes ``flash_kernel``,
    data/kernel_ops.FLASH_KERNELS, as featurize/workload.StepOptions keeps "flash1" / "flash3" as "flash" with kernel
    "fa1" / "fa3"); None: "flash". An attention written out in matmuls is
    costed as written whatever it says. ``meta["attention_costed"]`` names what the graph holds: "eager", "flash",
    "flash1", both joined by "+" (an SDPA and a written-out core), or None (no attention found).
    """
    if attention is not None and attention not in _ATTENTION_KERNELS:
        raise GraphError(f"unknown attention {attention!r}; use eager, flash, flash1 or flash3")
    sig = ep.graph_signature
    stored = set(sig.inputs_to_buffers.values()) | set((getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {}).values())
    own = {**{k: v for k, v in ep.state_dict.items() if k in stored}, **{k: v for k, v in ep.constants.items() if k in stored}}
    triangular = set(triangular_buffers or ()) | {k for k, v in own.items() if triangular_tensor(v)}
    placeholders = {n.name: n for n in ep.graph_module.graph.nodes if n.op == "placeholder"}
    sizes: Counter = Counter()
    for ph, fqn in sig.inputs_to_parameters.items():
        v = placeholders[ph].meta.get("val") if ph in placeholders else None
        if _is_tensor(v) and v.dtype.is_floating_point:
            sizes[v.dtype] += v.numel()
    float_dtype = sizes.most_common(1)[0][0] if sizes else None
    if param_count is None:
        param_count = sum(int(placeholders[ph].meta["val"].numel()) for ph in sig.inputs_to_parameters if ph in placeholders)
    builder = GraphBuilder(_resolve_dtype(dtype, float_dtype), train=train, name=name,
                           flash_kernel={"flash1": "fa1", "flash3": "fa3"}.get(attention, flash_kernel))
    imp = _Importer(ep, builder, float_dtype, triangular=triangular, attention=attention)
    imp.run()
    unattributed = int(param_count) - builder.param_count
    if unattributed:
        builder.add_params(unattributed)  # parameters no op owns (unused in forward, or a shared bias)
    warn = [w for w in (unmapped_ops_warning(dict(imp.unmapped)),) if w]
    if warn:
        meta = dict(meta, warnings=[*warn, *(meta.get("warnings") or [])])
    g = builder.build(source="torch.export", n_layers=imp.n_layers, unmapped_ops=dict(imp.unmapped),
                      approximated_ops=dict(imp.approximated), unmapped_reasons=dict(imp.fallback_reasons),
                      unattributed_params=unattributed, fx_nodes=len(ep.graph_module.graph.nodes),
                      attention_costed="+".join(sorted(imp.attention_kinds)) or None, **meta)
    return g


#: ``attention`` values of the importer
_ATTENTION_KERNELS = ("eager", "flash", "flash1", "flash3")


def _first_layer(module: torch.nn.Module) -> tuple[str, torch.nn.Module] | None:
    """(name, module) of ``module``'s first layer: the first submodule, in registration order, with parameters of its
    own (a language model's token embedding: nanoGPT's ``wte``, Hugging Face's ``embed_tokens``); None without any."""
    return next(((n, m) for n, m in module.named_modules() if next(m.parameters(recurse=False), None) is not None),
                None)


def _check_takes_token_ids(module: torch.nn.Module) -> None:
    """Raise :class:`GraphError` unless ``module``'s first layer is an embedding (``nn.Embedding`` /
    ``nn.EmbeddingBag``, subclasses included): only then are token ids its input. Any other module (an MLP starting
    with ``nn.Linear``, a CNN) would be traced on integer ids it never takes: its inputs must be given."""
    first = _first_layer(module)
    if first is not None and isinstance(first[1], (torch.nn.Embedding, torch.nn.EmbeddingBag)):
        return
    what = ("has no parameters" if first is None else
            f"starts with {first[0] or 'itself'} ({type(first[1]).__name__}), not an embedding")
    raise GraphError(f"{type(module).__name__} {what}: token ids of shape (batch, seq) are the default input only of a "
                     "module whose first layer is an nn.Embedding; give example_inputs (its forward's inputs, tensors of "
                     "the right shapes and dtypes, e.g. example_inputs=(torch.randn(batch, features),))")


def graph_from_module(module: torch.nn.Module, example_inputs: tuple | None = None, *, batch: int | None = None,
                      seq: int | None = None, dtype: str | None = None, train: bool = False,
                      kwargs: dict | None = None, attention: str | None = None, flash_kernel: str = "fa2") -> OpGraph:
    """The forward operator graph of ``module``, traced by ``torch.export`` on the meta device.

    ``example_inputs``: the positional inputs of ``forward`` (any device: only shapes and dtypes are used);
    when omitted, token ids ``(batch, seq)`` of dtype long, for a module whose first layer is an embedding (else
    :class:`GraphError` asks for them: :func:`_check_takes_token_ids`). ``kwargs``: keyword inputs. ``dtype``: the
    precision to cost (``fp32``/``tf32``/``fp16``/``bf16``/``fp8``; default: the parameters' dtype).
    ``train``: export in training mode (dropout active) for a training step. The module is not modified:
    a module with real weights is copied onto meta structure-only (no weight memory). ``attention``: how
    ``F.scaled_dot_product_attention`` is costed and ``flash_kernel`` its fused kernel class
    (:func:`graph_from_exported_program`). Raises
    :class:`GraphError` when the module cannot be exported.
    """
    if not isinstance(module, torch.nn.Module):
        raise GraphError(f"graph_from_module needs a torch.nn.Module, got {type(module).__name__}")
    if attention is not None and attention not in _ATTENTION_KERNELS:
        raise GraphError(f"unknown attention {attention!r}; use eager, flash, flash1 or flash3")
    if example_inputs is None:
        if batch is None or seq is None:
            raise GraphError("give example_inputs, or batch and seq for token-id inputs of shape (batch, seq)")
        if int(batch) <= 0 or int(seq) <= 0:
            raise GraphError(f"batch and seq must be positive, got batch={batch} seq={seq}")
        _check_takes_token_ids(module)
        example_inputs = (torch.zeros(int(batch), int(seq), dtype=torch.long, device="meta"),)
    elif not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,) if not isinstance(example_inputs, list) else tuple(example_inputs)
    float_dtype = _module_float_dtype(module)
    cost_dtype = _resolve_dtype(dtype, float_dtype)
    param_count = sum(p.numel() for p in module.parameters())
    # causal masks stored as buffers (nanoGPT's ``bias``): their values, which the meta copy drops
    triangular = {fqn for fqn, buf in module.named_buffers() if triangular_tensor(buf)}
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
                                    param_count=param_count, triangular_buffers=triangular, attention=attention,
                                    flash_kernel=flash_kernel,
                                    export_seconds=round(export_s, 3), **shape_meta)
    g.meta["import_seconds"] = round(time.perf_counter() - t1, 3)
    return g
