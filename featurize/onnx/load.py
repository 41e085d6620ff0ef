"""Reading an ONNX model and preparing it for the walk: the file, its symbolic input dims, weights declared
only by shape, control flow it refuses, and an execution order of its nodes."""

from __future__ import annotations

import ast
import operator
import re
from collections import deque
from pathlib import Path

from wattcast.featurize.op_graph import GraphError

#: symbolic input dims bound to ``batch`` / ``seq`` (compared lower-case)
BATCH_DIM_NAMES = frozenset({"batch", "batch_size", "batchsize", "bs", "n", "b", "batch_dim", "dynamic_batch"})

SEQ_DIM_NAMES = frozenset({"sequence", "seq", "seq_len", "seqlen", "seq_length", "sequence_length", "s", "t",
                           "num_tokens", "tokens"})


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
    known = onnx.defs.onnx_opset_version()
    newer = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx") and o.version > known]
    if newer:  # ops of a future opset may mean what this onnx package's do not: refuse rather than guess
        raise GraphError(f"{where} imports ONNX opset {max(newer)}, newer than the {known} this onnx package "
                         f"({onnx.__version__}) knows (a corrupt header, or a model from a newer exporter)")
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


#: ops whose first input is channels-first, (N, C, spatial...): a 3-D input they read is (batch, channels, length)
CHANNELS_FIRST_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"})


def _batch_seq_dims(model) -> dict:
    """The dims (``TensorShapeProto.Dimension``, or None) of the batch and the sequence in the first input: axis 0 is
    the batch; axis 1 is the sequence when the input is 2-D integer token ids or 3-D (batch, sequence, hidden)
    activations, axis 2 when the 3-D input feeds a 1-D convolution (ONNX's Conv reads (batch, channels, length):
    axis 1 is its channels)."""
    init_names = {t.name for t in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in init_names or not inp.type.HasField("tensor_type") or not inp.type.tensor_type.HasField("shape"):
            continue
        tt = inp.type.tensor_type
        d = list(tt.shape.dim)
        ints = tt.elem_type in (6, 7)  # INT32, INT64 (see _INT_NAMES)
        seq = None
        if ints and len(d) == 2:
            seq = d[1]
        elif not ints and len(d) == 3:
            conv = any(n.op_type in CHANNELS_FIRST_OPS and n.input and n.input[0] == inp.name for n in model.graph.node)
            seq = d[2] if conv else d[1]
        return {"batch": d[0] if d else None, "seq": seq}
    return {"batch": None, "seq": None}


def _batch_seq_axes(model) -> dict[str, str | None]:
    """What the first input has of a batch and a sequence axis (:func:`_batch_seq_dims`): ``"fixed"`` (a number in
    the file), ``"symbolic"`` (a named dim), or None (no such axis: an MLP's (batch, features) or an image's
    (batch, channels, height, width) input has no sequence axis)."""
    return {k: None if d is None else ("fixed" if d.HasField("dim_value") else "symbolic")
            for k, d in _batch_seq_dims(model).items()}


def onnx_own_seq(path) -> tuple[str | None, int | None]:
    """(the kind of an ONNX file's sequence axis: ``"fixed"``, ``"symbolic"`` or None for none, its fixed length or
    None), read from the file's first input without building its graph (a cluster step's default ``seq``)."""
    model, _, _ = _load(path)
    d = _batch_seq_dims(model)["seq"]
    if d is None:
        return None, None
    return ("fixed", int(d.dim_value)) if d.HasField("dim_value") else ("symbolic", None)


def first_input_text(model) -> str:
    """The first graph input that is not a weight, as ``name of shape (d0, d1, ...)`` (symbolic dims by name), for
    messages (parentheses, as PyTorch writes shapes; the CLI prints messages literally, not as rich markup)."""
    init_names = {t.name for t in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in init_names or not inp.type.HasField("tensor_type") or not inp.type.tensor_type.HasField("shape"):
            continue
        dims = [d.dim_param if d.HasField("dim_param") else str(d.dim_value) if d.HasField("dim_value") else "?"
                for d in inp.type.tensor_type.shape.dim]
        return f"{inp.name} of shape ({', '.join(dims)})"
    return "(none)"


def _fixed_batch_seq(model) -> dict[str, int | None]:
    """Batch and sequence length of a graph exported with fixed input dims (:func:`_batch_seq_dims`; None where
    that dim is not fixed)."""
    return {k: d.dim_value if d is not None and d.HasField("dim_value") else None
            for k, d in _batch_seq_dims(model).items()}


def _symbolic_batch_seq(model) -> dict[str, str]:
    """The symbolic names of the batch and sequence dims (:func:`_batch_seq_dims`) of a model whose inputs are not
    bound yet, for those that have one."""
    return {k: d.dim_param for k, d in _batch_seq_dims(model).items() if d is not None and d.HasField("dim_param")}


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
                if d.dim_value <= 0 and inp.name in used_names:  # an empty tensor: no step to cost
                    raise GraphError(f"input {inp.name!r} dim {axis} is fixed at {d.dim_value} in the model (an empty "
                                     f"tensor): nothing to predict; re-export it with a positive or symbolic dim")
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


def _refuse_control_flow(model, where: str) -> None:
    """GraphError naming the first node that runs a subgraph the importer cannot cost: anything but the default
    domain's ``Loop``, ``If`` and ``Scan`` (costed through their bodies, see ``control.py``), e.g. a contrib
    ``BeamSearch``. Counted as a single tiny op its body would never be (1,000 iterations of a MatMul as 0.007 ms)."""
    from collections import Counter

    from onnx import AttributeProto

    for k, n in enumerate(model.graph.node):
        if n.op_type in ("Loop", "If", "Scan") and n.domain in ("", "ai.onnx"):
            continue
        bodies = [a.g for a in n.attribute if a.type == AttributeProto.GRAPH]
        bodies += [g for a in n.attribute if a.type == AttributeProto.GRAPHS for g in a.graphs]
        if not bodies:
            continue
        ops = Counter(x.op_type for g in bodies for x in g.node)
        body = ", ".join(f"{c} {op}" for op, c in ops.most_common(5)) or "no ops"
        raise GraphError(
            f"{where}: node {n.name or f'#{k}'!r} ({n.domain + '.' if n.domain else ''}{n.op_type}) runs a body subgraph "
            f"({body}); wattcast costs the subgraphs of ONNX Loop, If and Scan only and refuses the model rather than "
            "count the node as one tiny op. Export it with the standard control-flow ops, or give a Hugging Face config")
