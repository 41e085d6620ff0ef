"""Control flow: ``Loop``, ``Scan`` and ``If`` costed through their subgraphs (a mixin of the importer).

A body is unrolled: each iteration walks the body graph with a child importer that records into the same builder,
so every iteration's kernels (with their backward rules, saved activations and data-dependency edges) are in the
step as they would run, the loop-carried state flowing from one iteration to the next with its real shapes. The
iteration number and the condition are constants in each iteration, so shape arithmetic on them folds, and a nested
loop whose trip count depends on the outer iteration gets it.

- ``Loop``: the trip count is the constant ``M`` input, or the one the user gives (``loop_trip_count``) for a loop
  whose count is known only at run time, or whose condition may end it before ``M`` (a ``while`` loop: exporters
  write ``M`` = INT64_MAX there); without one the model is refused naming the node and the option. A ``M`` taken as
  an upper bound is flagged in ``meta["warnings"]``. Scan outputs are concatenated after the last iteration (one copy
  kernel, as ONNX Runtime does).
- ``Scan``: the body once per slice of the scanned inputs (the sequence length), the slices are views.
- ``If``: a condition known before the run picks its branch; otherwise both branches are walked and the more
  expensive one (a nominal roofline of its kernels, see :func:`_nominal_s`) is kept, flagged in ``meta["warnings"]``.

Every control-flow node costed is listed in ``meta["control_flow"]``. Unrolling is capped at
:data:`MAX_UNROLLED_KERNELS` kernels per model; beyond, the model is refused with the count.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from wattcast.featurize.onnx.common import _Static, _attr
from wattcast.featurize.op_graph import GraphError, Tensor

#: kernels the unrolled bodies of one model may add (a 1,000-iteration loop of a 100-kernel body is 100,000)
MAX_UNROLLED_KERNELS = 250_000

#: the nominal device an ``If`` with a run-time condition compares its branches on: FLOP/s, bytes/s, s per kernel
_NOMINAL_FLOPS = 100e12
_NOMINAL_BYTES = 2e12
_NOMINAL_LAUNCH_S = 5e-6

_OPTION = "--loop-trip-count N (loop_trip_count=N in Python)"


class ControlFlowError(GraphError):
    """A control-flow node that cannot be costed (unknown trip count, too many kernels, an unsupported form)."""


def _nominal_s(values: list[dict], backward: list[list[dict]] | None) -> float:
    """Seconds of ``values`` (builder node rows) on a nominal device: per kernel max(FLOPs / 100 TFLOP/s,
    bytes / 2 TB/s) plus 5 us; their backward rules too when given (a training step)."""
    rows = list(values) + [r for rules in (backward or ()) for r in rules]
    return float(sum(max(r.get("flops", 0.0) / _NOMINAL_FLOPS, r.get("bytes", 0.0) / _NOMINAL_BYTES) + _NOMINAL_LAUNCH_S
                     for r in rows))


def _subgraph_names(graph) -> tuple[set[str], set[str]]:
    """(names the graph and its nested subgraphs use, names they define)."""
    from onnx import AttributeProto

    used: set[str] = set()
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {
        t.values.name for t in graph.sparse_initializer}
    for n in graph.node:
        used.update(i for i in n.input if i)
        defined.update(o for o in n.output if o)
        for a in n.attribute:
            subs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
            for sg in subs:
                u, d = _subgraph_names(sg)
                used |= u - d
    used.update(o.name for o in graph.output)
    return used, defined


def free_names(graph) -> list[str]:
    """The outer-scope names a subgraph (or its nested subgraphs) reads, in a stable order."""
    used, defined = _subgraph_names(graph)
    return sorted(used - defined)


def _const_true(graph, name: str) -> bool:
    """Whether ``name`` is, within ``graph``, the constant True (an initializer, a Constant node)."""
    from onnx import numpy_helper

    for t in graph.initializer:
        if t.name == name:
            v = numpy_helper.to_array(t)
            return v.size == 1 and bool(v.reshape(-1)[0])
    for n in graph.node:
        if n.op_type == "Constant" and name in n.output:
            for a in n.attribute:
                if a.name == "value" and a.HasField("t"):
                    v = numpy_helper.to_array(a.t)
                    return v.size == 1 and bool(v.reshape(-1)[0])
    return False


def body_may_stop(body) -> bool:
    """Whether a Loop body's condition output may turn False (a ``while`` loop), read from the body's nodes."""
    if len(body.output) < 1 or len(body.input) < 2:
        return True
    out, cond_in = body.output[0].name, body.input[1].name
    seen = set()
    while out not in seen:
        seen.add(out)
        if out == cond_in or _const_true(body, out):
            return False
        prod = [n for n in body.node if out in n.output]
        if len(prod) != 1 or prod[0].op_type != "Identity" or not prod[0].input:
            return True
        out = prod[0].input[0]
    return True


class _Control:
    """The Loop / Scan / If handlers (a mixin of the importer)."""

    # ------------------------------------------------------------------ plumbing
    def _where(self, n, name: str) -> str:
        """The node as messages name it: its path through the bodies, iteration indices dropped (one message for
        every iteration)."""
        return f"node {self.shared.flow_key(name)!r} ({n.op_type})"

    def _record(self, name: str, entry: dict) -> None:
        """One line of ``meta["control_flow"]`` per control-flow node (a node inside a body: how often it ran)."""
        key = self.shared.flow_key(name)  # ``name`` carries the path of the bodies it is in
        rec = self.shared.flow.get(key)
        if rec is None:
            entry = dict(node=key, **entry, runs=1)
            self.shared.flow[key] = entry
        else:
            rec["runs"] += 1
            for f in ("iterations", "kernels"):
                if f in entry:
                    rec[f] = rec.get(f, 0) + entry[f]
            if "trip_count" in entry and entry["trip_count"] not in np.atleast_1d(rec["trip_count"]):
                # a nested loop whose count follows the outer iteration: every count it ran with
                rec["trip_count"] = sorted({*np.atleast_1d(rec["trip_count"]).tolist(), entry["trip_count"]})

    def _warn(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)

    def _running(self, name: str) -> Any:
        """The value of ``name`` as a loop's carried state or scanned input: a float constant without a known value
        (a zero initial state stored as an initializer) becomes an activation, since the body's ops on it run at run
        time (the importer folds only what a runtime folds: a Loop is never folded); small known constants
        (counters, shapes) stay folded, so trip counts and shapes computed from them are known."""
        v = self._binding(name)
        if isinstance(v, _Static) and name not in self.consts and self._is_float(name):
            return self._tensor(name)
        return v

    def _binding(self, name: str) -> Any:
        """The value of an outer-scope name a body reads."""
        v = self.vals.get(name)
        if v is None:
            if name in self.inits:
                return self.inits[name]
            raise ControlFlowError(f"the body reads {name!r}, which is not defined before it")
        if isinstance(v, list):
            raise ControlFlowError(f"the body reads the sequence {name!r}; ONNX sequences in control flow are not costed")
        return v

    def _run_body(self, graph, bound: dict[str, Any], consts: dict[str, np.ndarray], prefix: str,
                  rg: dict[str, bool]) -> tuple[list, dict[str, np.ndarray], Any]:
        """Walk ``graph`` once with its inputs bound to ``bound`` (Tensor or _Static by input name); its outer-scope
        names are this importer's values. Returns the output values, the constant values among them, the child."""
        env = dict(bound)
        for nm in free_names(graph):
            if nm not in env:
                env[nm] = self._binding(nm)
                if nm in self.consts:
                    consts.setdefault(nm, self.consts[nm])
                rg.setdefault(nm, self.rg.get(nm, False))
        child = self._child(graph, env, consts, prefix, rg)
        child.walk()
        self.unknown_shapes += child.unknown_shapes
        outs = []
        for o in graph.output:
            v = child.vals.get(o.name)
            if v is None:
                v = child.inits.get(o.name)
            if v is None or isinstance(v, list):
                raise ControlFlowError(f"body output {o.name!r} is {'a sequence' if v is not None else 'never computed'}")
            outs.append(v)
        out_consts = {o.name: child.consts[o.name] for o in graph.output if o.name in child.consts}
        return outs, out_consts, child

    def _budget(self, n, name: str, added: int, planned: int | None = None) -> None:
        """Refuse a model whose unrolled bodies would exceed :data:`MAX_UNROLLED_KERNELS` (an iteration that adds no
        kernel -- shape arithmetic, a counter -- counts as one: each is a walk of its body)."""
        self.shared.unrolled += max(added, 1)
        total = self.shared.unrolled if planned is None else planned
        if total > MAX_UNROLLED_KERNELS:
            raise ControlFlowError(
                f"{self._where(n, name)} unrolls to {total:,} kernels, beyond the {MAX_UNROLLED_KERNELS:,} wattcast "
                f"costs in one model; export fewer iterations, or for a loop whose count is not a constant give a smaller "
                "one with --loop-trip-count N (loop_trip_count=N in Python)")

    # ------------------------------------------------------------------ Loop
    def _trip_count(self, n, name: str, ins: list[str], body) -> tuple[int, str]:
        """The iterations of a Loop and where the number comes from."""
        m_nm = ins[0] if ins else ""
        c_nm = ins[1] if len(ins) > 1 else ""
        m = None
        if m_nm:
            c = self._const(m_nm)
            if c is not None and c.size == 1 and c.dtype.kind in "iu":
                m = int(c.reshape(-1)[0])
        cond0: bool | None = True
        if c_nm:
            c = self._const(c_nm)
            cond0 = bool(c.reshape(-1)[0]) if c is not None and c.size == 1 else None
        if cond0 is False:
            return 0, "constant condition False"
        may_stop = cond0 is None or body_may_stop(body)
        given = self.shared.trips
        if isinstance(given, dict):
            for nm in (self.shared.flow_key(name), n.name):
                if nm in given:
                    self.shared.trips_used.add(nm)
                    return int(given[nm]), "given"
            given = None
        if m is not None and not may_stop:
            return max(m, 0), "constant"
        if given is not None:
            self.shared.trips_used.add(name)
            return (int(given) if m is None else min(int(given), max(m, 0))), "given"
        if m is not None and m > MAX_UNROLLED_KERNELS:  # a while loop's M (exporters write INT64_MAX): no count
            raise ControlFlowError(
                f"{self._where(n, name)} runs a body subgraph until its condition stops it (its trip count input, "
                f"{m:,}, is only a bound); wattcast costs the body once per iteration and needs the count: pass {_OPTION}")
        if m is not None:
            self._warn(f"{self._where(n, name)}: costed at its constant trip count {m:,}, an upper bound: its condition "
                       f"may end it sooner; give the count it runs with {_OPTION}")
            return max(m, 0), "constant (upper bound)"
        why = "it has no trip count input: its condition decides when it stops" if not m_nm else \
            f"its trip count {m_nm!r} is computed at run time"
        raise ControlFlowError(
            f"{self._where(n, name)} runs a body subgraph a number of times known only at run time ({why}); "
            f"wattcast costs the body once per iteration and needs the count: pass {_OPTION}")

    def _loop(self, k, n, name, ins):
        body = _attr(n, "body")
        n_carried = len(ins) - 2 if len(ins) >= 2 else 0
        carried = ins[2:]
        if len(body.input) != n_carried + 2 or len(body.output) < n_carried + 1:
            raise ControlFlowError(f"{self._where(n, name)}: its body takes {len(body.input)} inputs and gives "
                                   f"{len(body.output)} outputs for {n_carried} loop-carried values")
        trips, source = self._trip_count(n, name, ins, body)
        n_scan = len(body.output) - 1 - n_carried
        state = [self._running(nm) for nm in carried]
        state_consts = {j: self.consts[nm] for j, nm in enumerate(carried) if nm in self.consts}
        state_rg = [self.rg.get(nm, False) for nm in carried]
        scans: list[list] = [[] for _ in range(n_scan)]
        iter_nm, cond_nm = body.input[0].name, body.input[1].name
        start = len(self.b._nodes)
        for i in range(trips):
            before = len(self.b._nodes)
            bound: dict[str, Any] = {iter_nm: _Static((), frozenset(), 7), cond_nm: _Static((), frozenset(), 9)}
            consts = {iter_nm: np.array(i, dtype=np.int64), cond_nm: np.array(True)}
            rg: dict[str, bool] = {iter_nm: False, cond_nm: False}
            for j, v in enumerate(state):
                nm = body.input[2 + j].name
                bound[nm] = v
                rg[nm] = state_rg[j]
                if j in state_consts:
                    consts[nm] = state_consts[j]
            outs, out_consts, child = self._run_body(body, bound, consts, f"{name}[{i}]/", rg)
            state = outs[1:1 + n_carried]
            state_consts = {j: out_consts[o.name] for j, o in enumerate(body.output[1:1 + n_carried]) if o.name in out_consts}
            state_rg = [child.rg.get(o.name, False) for o in body.output[1:1 + n_carried]]
            for j, v in enumerate(outs[1 + n_carried:]):
                scans[j].append((v, child.rg.get(body.output[1 + n_carried + j].name, False)))
            added = len(self.b._nodes) - before
            self._budget(n, name, added, self.shared.unrolled + max(added, 1) * trips if i == 0 else None)
        for o, v, r in zip(n.output[:n_carried], state, state_rg):
            if o:
                self._bind_out(o, v, r)
        for j, o in enumerate(n.output[n_carried:n_carried + n_scan]):
            if o:
                self._stack(f"{name}.concat_{j}", o, scans[j], trips, axis=0, copy=True)
        self._record(name, dict(op="Loop", trip_count=int(trips), trip_count_source=source, iterations=int(trips),
                                kernels=len(self.b._nodes) - start))

    def _bind_out(self, o: str, v, rg: bool) -> None:
        if isinstance(v, Tensor):
            self._set(o, v, rg)
        else:
            self.vals[o] = _Static(v.shape, v.sources, v.elem)

    def _stack(self, name: str, o: str, parts: list, count: int, *, axis: int, copy: bool) -> None:
        """The output ``o`` stacking one value per iteration along ``axis`` (a Loop concatenates them: one copy
        kernel; a Scan writes each in place)."""
        if not parts:
            self.vals[o] = _Static(self._shape(o) or (0,), frozenset(), self._elem(o))
            return
        first = parts[0][0]
        shape = tuple(first.shape) if first.shape is not None else None
        if shape is None or any(p.shape != first.shape for p, _ in parts):
            raise ControlFlowError(f"{o!r} stacks values of different shapes ({first.shape}, ...)")
        axis = axis % (len(shape) + 1)
        out_shape = (*shape[:axis], count, *shape[axis:])
        tensors = [p for p, _ in parts if isinstance(p, Tensor)]
        if not tensors:
            self.vals[o] = _Static(out_shape, frozenset(), first.elem)
            return
        rg = any(r for _, r in parts)
        last = tensors[-1]
        whole = self.b.alias(out_shape, last.dtype, last.node)
        if copy:
            whole = self.b.copy(whole, name=name, grad=rg)
        self.b.link(whole, tensors[:-1])
        self._set(o, whole, rg)

    # ------------------------------------------------------------------ Scan
    def _scan(self, k, n, name, ins):
        if self.opset < 9:
            raise ControlFlowError(f"{self._where(n, name)}: Scan before opset 9 (with a batch axis) is not costed")
        body = _attr(n, "body")
        n_in = int(_attr(n, "num_scan_inputs"))
        n_state = len(ins) - n_in
        n_out = len(body.output) - n_state
        in_axes = list(_attr(n, "scan_input_axes", None) or [0] * n_in)
        out_axes = list(_attr(n, "scan_output_axes", None) or [0] * n_out)
        state = [self._running(nm) for nm in ins[:n_state]]
        state_rg = [self.rg.get(nm, False) for nm in ins[:n_state]]
        state_consts = {j: self.consts[nm] for j, nm in enumerate(ins[:n_state]) if nm in self.consts}
        xs = [self._running(nm) for nm in ins[n_state:]]
        lengths = set()
        slices = []
        for nm, x, ax in zip(ins[n_state:], xs, in_axes):
            s = x.shape
            if s is None or any(d is None for d in s):
                raise ControlFlowError(f"{self._where(n, name)}: the shape of scanned input {nm!r} is unknown")
            ax = ax % len(s)
            lengths.add(int(s[ax]))
            slices.append((tuple(d for i, d in enumerate(s) if i != ax), x))
        if len(lengths) != 1:
            raise ControlFlowError(f"{self._where(n, name)}: the scanned inputs differ in length ({sorted(lengths)})")
        trips = lengths.pop()
        scans: list[list] = [[] for _ in range(n_out)]
        start = len(self.b._nodes)
        for i in range(trips):
            before = len(self.b._nodes)
            bound: dict[str, Any] = {}
            consts: dict[str, np.ndarray] = {}
            rg: dict[str, bool] = {}
            for j, v in enumerate(state):
                nm = body.input[j].name
                bound[nm], rg[nm] = v, state_rg[j]
                if j in state_consts:
                    consts[nm] = state_consts[j]
            for j, ((shape, x), src) in enumerate(zip(slices, ins[n_state:])):
                nm = body.input[n_state + j].name
                if isinstance(x, Tensor):
                    bound[nm] = self.b.alias(shape, x.dtype, x.node)  # a view of the slice: no kernel
                else:
                    bound[nm] = _Static(shape, x.sources, x.elem)
                rg[nm] = self.rg.get(src, False)
            outs, out_consts, child = self._run_body(body, bound, consts, f"{name}[{i}]/", rg)
            state = outs[:n_state]
            state_consts = {j: out_consts[o.name] for j, o in enumerate(body.output[:n_state]) if o.name in out_consts}
            state_rg = [child.rg.get(o.name, False) for o in body.output[:n_state]]
            for j, v in enumerate(outs[n_state:]):
                scans[j].append((v, child.rg.get(body.output[n_state + j].name, False)))
            added = len(self.b._nodes) - before
            self._budget(n, name, added, self.shared.unrolled + max(added, 1) * trips if i == 0 else None)
        for o, v, r in zip(n.output[:n_state], state, state_rg):
            if o:
                self._bind_out(o, v, r)
        for j, o in enumerate(n.output[n_state:n_state + n_out]):
            if o:
                self._stack(f"{name}.scan_{j}", o, scans[j], trips, axis=out_axes[j] if j < len(out_axes) else 0,
                            copy=False)
        self._record(name, dict(op="Scan", trip_count=int(trips), trip_count_source="sequence length",
                                iterations=int(trips), kernels=len(self.b._nodes) - start))

    # ------------------------------------------------------------------ If
    def _if(self, k, n, name, ins):
        then_g, else_g = _attr(n, "then_branch"), _attr(n, "else_branch")
        c = self._const(ins[0]) if ins and ins[0] else None
        start = len(self.b._nodes)
        if c is not None and c.size == 1:
            pick = "then_branch" if bool(c.reshape(-1)[0]) else "else_branch"
            outs, rgs = self._branch(then_g if pick == "then_branch" else else_g, name, pick)
            self._bind_if(n, outs, rgs)
            self._record(name, dict(op="If", branch=pick, chosen_by="constant condition",
                                    kernels=len(self.b._nodes) - start))
            return
        # the condition is known only at run time: walk both, keep the more expensive
        tried = {}
        for pick, g in (("then_branch", then_g), ("else_branch", else_g)):
            saved = self._save_state()
            outs, rgs = self._branch(g, name, pick)
            rows = [nd.values for nd in self.b._nodes[saved["mark"][0]:]]
            bw = [nd.backward for nd in self.b._nodes[saved["mark"][0]:]] if self.b.train else None
            tried[pick] = (_nominal_s(rows, bw), len(rows))
            if pick == "then_branch":
                self._restore_state(saved)
        if tried["then_branch"][0] > tried["else_branch"][0]:  # the else branch is in the builder: take it out
            self._restore_state(saved)
            outs, rgs = self._branch(then_g, name, "then_branch")
            pick = "then_branch"
        else:
            pick = "else_branch"
        self._bind_if(n, outs, rgs)
        other = "else_branch" if pick == "then_branch" else "then_branch"
        self._warn(f"{self._where(n, name)}: its condition is known only at run time; costed its more expensive branch "
                   f"({pick}, {tried[pick][1]} kernels, {tried[pick][0] * 1e3:.4g} ms on a nominal device, against "
                   f"{other}'s {tried[other][1]} kernels, {tried[other][0] * 1e3:.4g} ms)")
        self._record(name, dict(op="If", branch=pick, chosen_by="more expensive (condition known at run time)",
                                kernels=len(self.b._nodes) - start))

    def _branch(self, g, name: str, pick: str):
        if len(g.input):
            raise ControlFlowError(f"If {name!r}: its {pick} declares inputs (a branch takes none)")
        outs, _, child = self._run_body(g, {}, {}, f"{name}.{pick.split('_')[0]}/", {})
        return outs, [child.rg.get(o.name, False) for o in g.output]

    def _bind_if(self, n, outs: list, rgs: list) -> None:
        if len(outs) != len([o for o in n.output]):
            raise ControlFlowError(f"If {n.name!r}: its branch gives {len(outs)} outputs for {len(n.output)}")
        for o, v, r in zip(n.output, outs, rgs):
            if o:
                self._bind_out(o, v, r)

    def _save_state(self) -> dict:
        """What walking a branch changes outside the builder (to try a branch and take it back)."""
        return dict(mark=self.b.mark(), claims=len(self.claim_log), unmapped=dict(self.unmapped),
                    roofline_mapped=dict(self.roofline_mapped),
                    fallback=dict(self.fallback), warnings=list(self.warnings), flow=copy.deepcopy(self.shared.flow),
                    unrolled=self.shared.unrolled, unknown=self.unknown_shapes)

    def _restore_state(self, s: dict) -> None:
        self.b.rollback(s["mark"])
        for key in self.claim_log[s["claims"]:]:
            self.counted.discard(key)
        del self.claim_log[s["claims"]:]
        for attr in ("unmapped", "roofline_mapped", "fallback"):
            d = getattr(self, attr)
            d.clear()
            d.update(s[attr])
        self.warnings[:] = s["warnings"]
        self.shared.flow.clear()
        self.shared.flow.update(s["flow"])
        self.shared.unrolled = s["unrolled"]
        self.unknown_shapes = s["unknown"]
