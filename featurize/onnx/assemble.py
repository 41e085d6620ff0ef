"""Building the graph: the importer walks the prepared model once (O(nodes)), one handler per node, and
:func:`graph_from_onnx` ties reading, dim binding, shape inference and the walk together."""

from __future__ import annotations

import re
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from wattcast.data.kernel_ops import canonical_dtype
from wattcast.featurize.onnx.common import (_DEFAULT_DOMAINS, _FLOAT_TYPES, _INT_NAMES, _MASK_DTYPE, BoundDimsError, InvalidModelError, _Builder,
                                            _Static, _attr, _numel_dims, _sanitize)
from wattcast.featurize.onnx.control import ControlFlowError, _Control
from wattcast.featurize.onnx.load import (_batch_seq_axes, _bind_inputs, _declare_shape_only_weights, _fixed_batch_seq,
                                          _load, _refuse_control_flow, _symbolic_batch_seq, _topo_order,
                                          first_input_text)
from wattcast.featurize.onnx.ops import _Ops
from wattcast.featurize.onnx.params import _Params, _is_buffer, _tied_by_value
from wattcast.featurize.onnx.patterns import _Patterns
from wattcast.featurize.onnx.shapes import (_file_shapes, _infer, _Shapes, _small_constants, _strip_weights,
                                            _triangular_constants)
from wattcast.featurize.op_graph import GraphError, OpGraph, Tensor, unmapped_ops_warning

_LAYER_RE = re.compile(r"(?:^|[./_])(?:h|layers|layer|blocks|block)[._](\d+)(?=$|[./_])")

#: a handler meeting shapes it cannot cost raises one of these; the op is then costed by the roofline
_HANDLER_ERRORS = (GraphError, ValueError, IndexError, TypeError, KeyError, ZeroDivisionError)

#: constant-folded ops whose output still holds the values (a parameter) of its float inputs:
#: a transposed / reshaped / concatenated / scaled weight; not cos(positions * inv_freq)
_SOURCE_OPS = {"Identity", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Cast", "CastLike", "Concat",
               "Split", "Slice", "Gather", "Expand", "Tile", "Mul", "Div", "Add", "Sub", "Neg"}

#: control-flow ops costed through their subgraphs (control.py); an error in one refuses the model
_CONTROL_OPS = frozenset({"Loop", "If", "Scan"})

#: ONNX element type of a builder tensor's dtype (the body of a loop declares what flows into it)
_DTYPE_ELEM = {"fp32": 1, "tf32": 1, "fp16": 10, "bf16": 16, _MASK_DTYPE: 9, **{v: k for k, v in _INT_NAMES.items()}}


@dataclass
class _Shared:
    """What the importer of a model and the child importers of its control-flow bodies share."""

    #: the user's trip count for loops whose count is known only at run time (int), or per Loop node name (dict)
    trips: int | dict | None = None
    trips_used: set = field(default_factory=set)
    #: ``meta["control_flow"]``: one entry per control-flow node (path with iteration indices dropped)
    flow: dict = field(default_factory=dict)
    #: kernels added by unrolled bodies so far
    unrolled: int = 0
    #: (body, bound input kinds and shapes) -> (shape-inferred body model, its small constants)
    bodies: dict = field(default_factory=dict)
    #: the model as the file has it (weights stripped) when it has symbolic input dims, before they were bound; None
    #: when it has none (the bound model is the file's)
    unbound: Any = None
    #: the shapes of the file's values (``_Shapes._refuse_mismatched_inner``), worked out the first time one is asked
    declared: dict | None = None
    #: the symbolic input dims' names -> the values they were bound to (batch, seq, dims=)
    bound: dict = field(default_factory=dict)
    #: the attention kernels the graph holds, ``meta["attention_costed"]``: "eager" (a recognised MatMul -> Softmax ->
    #: MatMul core, costed as written), "flash" (an opset-23 ``Attention`` op, the fused kernel)
    attention_kinds: set = field(default_factory=set)

    @staticmethod
    def flow_key(path: str) -> str:
        return re.sub(r"\[\d+\]", "", path)


class _Importer(_Shapes, _Patterns, _Params, _Ops, _Control):
    """One walk over a prepared model: the state (values, shapes, claimed parameters, matched patterns)
    that the shape, pattern, parameter and op-handler mixins read and write, and the walk itself.

    A child importer (``parent`` given) walks a control-flow body into its parent's builder, sharing its parameter
    claims and flags; ``outer`` are the static values (constants, weights) the body reads from outside or is given."""

    def __init__(self, model, *, dtype: str | None, train: bool, name: str, tied: dict[str, str],
                 consts: dict[str, np.ndarray], parent: "_Importer | None" = None,
                 outer: dict[str, _Static] | None = None, prefix: str = "", shared: _Shared | None = None,
                 triangular: set[str] | frozenset = frozenset()):
        self.model = model
        #: constants holding a causal mask pattern (shapes._triangular_constants, read before the weights were stripped)
        self.triangular = frozenset(triangular)
        g = model.graph
        self.g = g
        self.prefix = prefix
        self.nodes = _topo_order(g)
        self.opset = parent.opset if parent is not None else max(
            (o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), default=13)
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
        if outer:
            self.inits.update(outer)
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
        # bookkeeping
        self.vals: dict[str, Tensor | _Static] = {}
        self.rg: dict[str, bool] = {}  # requires grad (on the parameter-gradient path)
        self.unknown_shapes = 0
        if parent is None:
            #: the file's own float type (its weights'): values of that type are costed at ``dtype``
            self.file_dtype = self._model_dtype()
            self.dtype = canonical_dtype(dtype) if dtype else self.file_dtype
            self.b = _Builder(self.dtype, train=train, name=name)
            self.counted: set[str] = set()
            self.claim_log: list[str] = []  # counted keys in claim order (to undo a failed handler)
            self.alias_key: dict[str, str] = {k: _sanitize(v) for k, v in tied.items()}
            self.unmapped: dict[str, int] = {}
            #: mapped ops costed by the roofline by design (a grouped / depthwise / non-square / transposed conv):
            #: named in ``unmapped_ops`` and its warning as the torch.export importer names them (audit 57f finding 5)
            self.roofline_mapped: dict[str, int] = {}
            self.fallback: dict[str, int] = {}
            self.warnings: list[str] = []
            self.shared = shared or _Shared()
            self._ref_cls: dict = {}
        else:  # a body: the parent's builder, claims and flags
            self.dtype, self.b, self.shared, self._ref_cls = parent.dtype, parent.b, parent.shared, parent._ref_cls
            self.file_dtype = parent.file_dtype
            self.counted, self.claim_log, self.alias_key = parent.counted, parent.claim_log, parent.alias_key
            self.unmapped, self.fallback, self.warnings = parent.unmapped, parent.fallback, parent.warnings
            self.roofline_mapped = parent.roofline_mapped
            parent.init_numel.update(self.init_numel)
            self.init_numel = parent.init_numel
        #: the file's own shapes (a dim is an int when the file fixes it), asked for only when a MatMul's bound inner
        #: dims differ; None in a control-flow body (its shapes are inferred per iteration)
        self.declared = self._declared_shapes if parent is None else None
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
        for n in self.nodes:  # constant shape arithmetic, so the pattern matchers see folded scalars
            if all(o in self.static_names for o in n.output if o):
                self._fold(n)
        self.skip: set[int] = set()
        self.fused: dict[int, tuple] = {}  # anchor node -> (kind, ...) of a collapsed subgraph
        self.groups: dict[int, set[int]] = {}  # anchor node -> the nodes it stands for
        self.attn: set[int] = set()
        #: the QK^T and PV MatMuls of a recognised attention core -> is its mask causal (patterns._match_attention)
        self.attn_pairs: dict[int, bool] = {}
        self.attn_pv: set[int] = set()  # the PV ones among them
        self.mask_adds: set[int] = set()
        self.bias_of: dict[int, int] = {}  # MatMul node -> fused bias Add node
        self.folded_casts: set[int] = set()  # Casts a Softmax already costed (ops._softmax: the exporters' upcast)
        self._pre_gamma: dict[int, str] = {}
        self._match_patterns()
        if self.attn_pairs:
            self.shared.attention_kinds.add("eager")
        if parent is None:
            self.layer_of, self.scope_of, self.n_layers = self._layers()
        else:  # a body runs where its control-flow node is
            self.layer_of, self.scope_of, self.n_layers = [self.b._layer] * len(self.nodes), [self.b._scope] * len(self.nodes), 0


    def _declared_shapes(self) -> dict[str, tuple]:
        """The shape of each value as the file fixes it: the bound model's when nothing was bound, else shape
        inference of the unbound one (symbolic dims stay names), once per model."""
        sh = self.shared
        if sh.declared is None:
            sh.declared = (_file_shapes(sh.unbound) if sh.unbound is not None
                           else {nm: shape for nm, (_, shape) in self.info.items() if shape is not None})
        return sh.declared


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
        self.walk()
        meta = dict(meta)
        no_model = dict(self.unmapped)
        for op, c in self.roofline_mapped.items():
            no_model[op] = no_model.get(op, 0) + c
        meta.update(source="onnx", n_layers=int(self.n_layers), unmapped_ops=dict(sorted(no_model.items())),
                    onnx_nodes=len(self.nodes), opset=int(self.opset),
                    attention_costed="+".join(sorted(self.shared.attention_kinds)) or None)
        if self.shared.flow:
            meta["control_flow"] = list(self.shared.flow.values())
        if self.fallback:
            meta["fallback_ops"] = dict(sorted(self.fallback.items()))
        if self.unknown_shapes:
            meta["unknown_shapes"] = int(self.unknown_shapes)
        # the unknown ops' warning first: it is what the JSON's ``warnings`` must name even past the first 20
        unmapped = [w for w in (unmapped_ops_warning(no_model),) if w]
        if self.unknown_shapes:  # a guessed shape is costed as if known by every op after it: never silently
            unmapped.append(f"{self.unknown_shapes} value shape(s) could be neither inferred nor computed and were "
                            "taken as their op's input shape (meta unknown_shapes); the ops after them may be costed "
                            "at the wrong size")
        if self.warnings or unmapped:
            meta["warnings"] = unmapped + self.warnings[:20]
        return self.b.build(**meta)


    def walk(self) -> None:
        """Emit every node (graph inputs and outer values already in ``vals``)."""
        for nm, s in self.inits.items():
            self.vals.setdefault(nm, s)
        for k, n in enumerate(self.nodes):
            if k in self.skip:
                continue
            lay, scope = self.layer_of[k], self.scope_of[k]
            # a recognised attention core's kernels count in model FLOPs as hf_blocks.eager_attention's: QK^T and PV at
            # the pairs the mask keeps (ops._matmul), the scale / mask / softmax / dropout between them not at all
            core = (self.b.tag("attn_core"), self.b.model_share(0.0)) if k in self.attn else ()
            with self.b.layer(lay, scope), ExitStack() as stack:
                for c in core:
                    stack.enter_context(c)
                self._emit(k, n)


    def _child(self, graph, env: dict[str, Any], consts: dict[str, np.ndarray], prefix: str,
               rg: dict[str, bool]) -> "_Importer":
        """An importer of the subgraph ``graph`` with its inputs and outer-scope names bound to ``env`` (Tensor:
        an activation of this walk; _Static: a constant or weight), ready to ``walk`` into this builder."""
        import onnx

        declared = {i.name: i.type.tensor_type.elem_type for i in graph.input if i.type.HasField("tensor_type")}
        sig = []
        for nm in sorted(env):
            v = env[nm]
            if isinstance(v, _Static):
                elem = v.elem or declared.get(nm) or 1
                shape = v.shape
            else:
                elem = declared.get(nm) or self._elem(nm) or _DTYPE_ELEM.get(v.dtype, 1)
                shape = v.shape
            sig.append((nm, isinstance(v, Tensor), int(elem), None if shape is None else tuple(shape)))
        key = (id(graph), tuple(sig))
        got = self.shared.bodies.get(key)
        if got is None:
            g = onnx.GraphProto()
            g.CopyFrom(graph)
            del g.input[:]
            del g.value_info[:]  # shapes inferred afresh from this iteration's inputs (a growing state changes them)
            for nm, _, elem, shape in sig:
                known = shape is not None and all(d is not None for d in shape)
                g.input.append(onnx.helper.make_tensor_value_info(nm, elem, list(shape) if known else None))
            body = onnx.helper.make_model(g, opset_imports=list(self.model.opset_import), ir_version=self.model.ir_version)
            _refuse_control_flow(body, prefix.rstrip("/") or "body")
            small = _small_constants(body)
            tri = _triangular_constants(body)
            _strip_weights(body)
            inferred, _ = _infer(body)
            got = (inferred, small, graph, tri)  # the graph is kept so its id stays unique while cached
            self.shared.bodies[key] = got
        inferred, small, tri = got[0], got[1], got[3]
        outer = {}
        for nm, _, elem, shape in sig:
            v = env[nm]
            if isinstance(v, _Static):
                outer[nm] = v if v.elem else _Static(v.shape, v.sources, elem)
        child = _Importer(inferred, dtype=self.dtype, train=self.b.train, name="", tied={}, consts={**small, **consts},
                          parent=self, outer=outer, prefix=prefix, triangular=self.triangular | tri)
        for nm, v in env.items():
            if isinstance(v, Tensor):
                child._set(nm, v, rg.get(nm, False))
        return child


    def _node_name(self, k: int, n) -> str:
        """A kernel's name: the node's, after the path of the bodies it runs in (``loop[3]/inner[0]/MatMul``)."""
        name = n.name or f"{n.op_type}_{k}"
        return self.prefix + name.lstrip("/") if self.prefix else name


    def _emit(self, k: int, n) -> None:
        if k in self.fused:
            mark, counted = self.b.mark(), len(self.claim_log)
            try:
                self._emit_fused(k, n, self._node_name(k, n), self.fused[k])
            except InvalidModelError:
                raise
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
        name = self._node_name(k, n)
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
        except (ControlFlowError, InvalidModelError):
            raise
        except _HANDLER_ERRORS as e:
            if n.op_type in _CONTROL_OPS:  # never one tiny op in place of a body
                raise ControlFlowError(f"node {name!r} ({n.op_type}): its subgraph cannot be costed: "
                                       f"{type(e).__name__}: {e}") from e
            self._refuse_unrunnable_at_bound_dims(n, name, e)
            self._undo(n, mark, counted, e, "costed by the roofline")
            self._emit_unknown(k, n, name, ins, unmapped=False)
            if k in self.bias_of:  # the bias Add fused into this MatMul
                add = self.nodes[self.bias_of[k]]
                self._emit_node(self.bias_of[k], add)


    def _refuse_unrunnable_at_bound_dims(self, n, name: str, e: Exception) -> None:
        """:class:`BoundDimsError` when a MatMul / Gemm's contraction dims differ in a model whose symbolic input dims
        were bound (the file does not fix them apart: ``_refuse_mismatched_inner`` passed) and no shape on the way was
        guessed: the graph cannot run at these dims. A legacy ``torch.onnx.export(..., dynamo=False)`` with
        ``dynamic_axes`` bakes the traced sizes into Reshape shape constants (a key length of 128 in a Concat), so the
        file runs at its export's dims only. Until stop 54 such a node was costed by the roofline with a warning and
        the step predicted (exit 0). After an op nothing maps (its output shape may be a guess) or a handler that
        already fell back, the roofline fallback stays: there the mismatch may be the guess's."""
        if (n.op_type not in ("MatMul", "Gemm", "FusedMatMul") or not isinstance(e, GraphError)
                or "contraction dims differ" not in str(e) or self.shared.unbound is None or self.unmapped
                or self.fallback or not self.shared.bound):
            return
        dims = ", ".join(f"{k}={v}" for k, v in self.shared.bound.items())
        raise BoundDimsError(f"{n.op_type} node {name!r} cannot run at the dims its inputs were bound to ({dims}): "
                             f"{str(e).removeprefix(f'{name}: ')}. The file's symbolic dims do not carry through its "
                             "graph (a legacy torch.onnx.export(..., dynamo=False) with dynamic_axes bakes the traced "
                             "sizes into Reshape shape constants); give the dims it was exported with (--batch/--seq/"
                             "--dim), or re-export it with torch.onnx.export(..., dynamo=True, dynamic_shapes=...)")

    def _index_range(self, name: str) -> tuple[int, int, bool] | None:
        """(smallest, largest, is it 0, 1, ..., n-1) of the constant index tensor ``name``: its folded values, or the
        bounds of the ``Range`` that makes it (too long to fold); None when unknown or empty."""
        c = self.consts.get(name)
        if c is not None and np.issubdtype(np.asarray(c).dtype, np.integer) and np.asarray(c).size:
            v = np.asarray(c).reshape(-1)
            return int(v.min()), int(v.max()), bool(np.array_equal(v, np.arange(v.size)))
        k = self.producer.get(name)
        if k is None or self.nodes[k].op_type != "Range" or len(self.nodes[k].input) < 3:
            return None
        start, limit, delta = (self._scalar(i) for i in self.nodes[k].input[:3])
        if start is None or limit is None or not delta:
            return None
        count = max(0, -(-(int(limit) - int(start)) // int(delta)))
        if not count:
            return None
        last = int(start) + (count - 1) * int(delta)
        return min(int(start), last), max(int(start), last), int(start) == 0 and int(delta) == 1

    def _refuse_gather_beyond_table(self, n, name: str) -> None:
        """:class:`BoundDimsError` (:class:`InvalidModelError` when no dim was bound) when a Gather of a weight table
        reads rows the table does not have: a learned position table of 1,024 rows gathered at ``Range(0, seq)`` with a
        sequence of 4,096 cannot run (PyTorch's embedding raises an index error), as a Hugging Face config with learned
        positions refuses a longer ``--seq`` (featurize/workload.py). Until stop 57 such a file was predicted at any
        sequence length, silently."""
        ins = [i for i in n.input]
        if len(ins) < 2 or not ins[0] or not ins[1] or ins[0] not in self.inits or not self.inits[ins[0]].sources:
            return
        shape = self._shape(ins[0])
        got = self._index_range(ins[1])
        if shape is None or not shape or got is None:
            return
        axis = int(_attr(n, "axis", 0)) % len(shape)
        rows = int(shape[axis])
        lo, hi, positions = got
        if -rows <= lo and hi < rows:
            return
        bound = self.shared.bound
        dims = ", ".join(f"{k}={v}" for k, v in bound.items())
        err = BoundDimsError if bound else InvalidModelError
        if positions and axis == 0 and len(shape) == 2:
            raise err(f"seq {hi + 1} exceeds the model's {rows} learned positions: node {name!r} gathers rows 0..{hi} "
                      f"of its {rows}-row position table {ins[0]!r}" + (f" (inputs bound to {dims})" if dims else "")
                      + f"; give --seq {rows} or less")
        raise err(f"node {name!r} (Gather) reads indices {lo}..{hi} of the {rows}-row table {ins[0]!r} (axis {axis})"
                  + (f" at the dims its inputs were bound to ({dims})" if dims else "")
                  + "; the model cannot run there")

    def _emit_static(self, n) -> None:
        ins = [i for i in n.input if i]
        if n.op_type == "Gather" and n.domain in _DEFAULT_DOMAINS:
            self._refuse_gather_beyond_table(n, self._node_name(0, n))
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
        for idx, o in enumerate(n.output):
            if o:
                shape = self._shape(o)
                if shape is None and o in self.consts:
                    shape = tuple(self.consts[o].shape)
                if shape is None:
                    # a constant too large to fold (a ViT's (1, 1, 768) class token Expanded to the batch: more than
                    # _small_constants' 64 elements) still has the shape its rule computes from its operands' shapes
                    # and folded shape values (``_SHAPE_RULES``); until stop 57 it was unknown, the Concat reading it
                    # fell back to its activation's shape and a ViT-B/16 lost its class token (196 positions, not 197)
                    shape = self._computed_shape(n, idx)
                self.vals[o] = _Static(shape, srcs if self._is_float(o) else frozenset(), self._elem(o))


def graph_from_onnx(path_or_model, *, batch: int | None = None, seq: int | None = None, dtype: str | None = None,
                    train: bool = False, dims: dict[str, int] | None = None,
                    loop_trip_count: int | dict[str, int] | None = None) -> OpGraph:
    """The forward operator graph of an ONNX model (a path, a ``ModelProto`` or its bytes).

    ``batch`` / ``seq`` bind symbolic input dims named like batch / sequence (see :data:`BATCH_DIM_NAMES`,
    :data:`SEQ_DIM_NAMES`); ``dims`` binds any other symbolic dim by name (or ``"input:axis"`` for an
    unnamed one). ``dtype`` overrides the dtype read from the model's float tensors; ``train`` turns on
    dropout kernels. Weight values are not needed (external-data files may be missing); those of an embedding table
    and the tensors of its shape are read when there, to recognise a tied LM head (``params._tied_by_value``).

    ``graph.meta`` has ``source="onnx"``, ``param_count``, ``n_layers``, ``unmapped_ops`` (op type ->
    count of the ops costed by the roofline because nothing maps them), ``dims`` (the bound symbolic
    dims), ``batch`` / ``seq`` (None when the model's dims are fixed: the option is then listed in
    ``ignored_options``; ``options_bound_by_dims`` names the symbolic dim of such an option that ``dims`` bound; the
    sequence of a 3-D input feeding a Conv is its length, axis 2), ``opset``, ``onnx_nodes`` and, when relevant,
    ``unknown_shapes`` (outputs whose shape had to be guessed), ``fallback_ops`` (mapped ops whose handler failed:
    roofline, with ``warnings``) and ``shape_only_weights``.

    Control flow (``Loop``, ``Scan``, ``If``) is costed through its subgraphs, unrolled (see ``control.py``):
    ``loop_trip_count`` gives the iterations of the loops whose count is known only at run time (an int for all of
    them, or ``{node name: count}``); ``meta["control_flow"]`` lists every control-flow node with its trip count and
    its source, or the ``If`` branch taken and why.
    Raises :class:`GraphError` for a missing, corrupt or truncated file, an unbound symbolic dim, or a loop
    whose trip count is unknown and not given.
    """
    trips = check_trip_count(loop_trip_count)
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
    tied, tied_notes = _tied_by_value(model, base.parent if base is not None else None)
    consts = _small_constants(model)
    triangular = _triangular_constants(model, base.parent if base is not None else None)
    _strip_weights(model)
    unbound = _unbound_copy(model)
    env, used = _bind_inputs(model, batch, seq, dims)
    inferred, err = _infer(model)
    name = Path(where).stem if base is not None else (model.graph.name or "onnx_model")
    if isinstance(trips, dict):
        _check_trip_names(trips, model, where)
    shared = _Shared(trips=trips, unbound=unbound, bound=dict(env))
    imp = _Importer(inferred, dtype=dtype, train=train, name=name, tied=tied, consts=consts, shared=shared,
                    triangular=triangular)
    imp.warnings.extend(tied_notes)
    fixed = _fixed_batch_seq(model)
    axes = _batch_seq_axes(unbound if unbound is not None else model)
    meta = dict(name=name, dims=env, producer=model.producer_name or "",
                batch=batch if "batch" in used else fixed["batch"], seq=seq if "seq" in used else fixed["seq"],
                input_axes=axes, first_input=first_input_text(unbound if unbound is not None else model))
    if base is not None:
        meta["path"] = str(base)
    if err:
        meta["shape_inference_error"] = err
    if shape_only:
        meta["shape_only_weights"] = shape_only  # declared in value_info only
    # an option the fixed dims cannot take (one equal to the exported size is simply met)
    # (a model with no sequence axis, an MLP's or an image model's, runs one position per sample: seq 1 is met)
    ignored = [f"{o}={v}" for o, v in (("batch", batch), ("seq", seq))
               if v is not None and o not in used and fixed[o] != int(v)
               and not (o == "seq" and axes["seq"] is None and int(v) == 1)]
    if ignored:
        meta["ignored_options"] = ignored  # the model's input dims are fixed, or bound by name (dims=)
        # an option whose dim is symbolic but was bound by ``dims`` (a name not read as batch / sequence): its name
        by_name = {o: p for o, p in (_symbolic_batch_seq(unbound) if unbound is not None else {}).items()
                   if any(i.startswith(f"{o}=") for i in ignored) and p in env}
        if by_name:
            meta["options_bound_by_dims"] = by_name
    try:
        graph = imp.run(meta)
    except ControlFlowError as e:
        raise ControlFlowError(f"{where}: {e}") from None
    except InvalidModelError as e:
        raise InvalidModelError(f"{where}: {e}") from None
    _check_trips_used(trips, shared, where)
    return graph


def _unbound_copy(model):
    """A copy of ``model`` before its symbolic input dims are bound (None when its inputs have none): what the file
    fixes, for telling an invalid model from dims bound inconsistently."""
    import onnx

    init_names = {t.name for t in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in init_names or not inp.type.HasField("tensor_type") or not inp.type.tensor_type.HasField("shape"):
            continue
        if any(not d.HasField("dim_value") for d in inp.type.tensor_type.shape.dim):
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            return copy
    return None


def check_trip_count(v) -> int | dict[str, int] | None:
    """``loop_trip_count`` checked: a whole number >= 0, or a dict of Loop node names to such numbers."""
    def count(x, what):
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer, float)) or (
                isinstance(x, float) and not x.is_integer()) or x < 0:
            raise GraphError(f"{what} (--loop-trip-count) must be a whole number >= 0, got {x!r}")
        return int(x)

    if v is None:
        return None
    if isinstance(v, dict):
        return {str(k): count(x, f"loop_trip_count[{k!r}]") for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        raise GraphError(f"loop_trip_count (--loop-trip-count) must be a whole number >= 0 or {{Loop node name: count}}, "
                         f"got {v!r}")
    return count(v, "loop_trip_count")


def _loop_names(graph) -> list[str]:
    """Names of the Loop nodes of ``graph`` and of its subgraphs."""
    from onnx import AttributeProto

    out = []
    for n in graph.node:
        if n.op_type == "Loop":
            out.append(n.name)
        for a in n.attribute:
            for sg in [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []:
                out += _loop_names(sg)
    return out


def _check_trip_names(trips: dict, model, where: str) -> None:
    """Every node a ``loop_trip_count`` dict names is a Loop of the model (by name, or its path through the bodies)."""
    loops = _loop_names(model.graph)
    unknown = sorted(k for k in trips if k.split("/")[-1] not in loops)
    if unknown:
        raise GraphError(f"{where}: loop_trip_count names {', '.join(map(repr, unknown))}, no Loop node of the model"
                         + (f" (its loops: {', '.join(sorted(set(loops)))})" if loops else " (it has no Loop)"))


def _check_trips_used(trips, shared: _Shared, where: str) -> None:
    """A trip count given for no loop is an error (the user meant a loop the model does not have as they think)."""
    if trips is None or isinstance(trips, dict):
        return
    loops = sorted(k for k, e in shared.flow.items() if e.get("op") == "Loop")
    if not shared.trips_used:
        raise GraphError(f"{where}: loop_trip_count (--loop-trip-count) {trips} was given, but no Loop of the model has a "
                         "trip count known only at run time or a condition that may end it"
                         + (f" (its loops: {', '.join(loops)}: constant trip counts)" if loops else " (it has no Loop)"))
