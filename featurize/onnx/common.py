"""What every part of the ONNX importer shares: element types, the value record, the builder hooks."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from wattcast.featurize.op_graph import GraphBuilder, GraphError, Tensor

# ONNX TensorProto element types
_FLOAT_TYPES = {1: "fp32", 10: "fp16", 16: "bf16", 11: "fp32"}  # FLOAT, FLOAT16, BFLOAT16, DOUBLE

_ELEM_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2, 17: 1, 18: 1, 19: 1, 20: 1}

_INT_NAMES = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool", 12: "uint32", 13: "uint64"}

#: the graph label of a narrow non-float element type. The builder sizes a tensor by its label (``Tensor.nbytes``:
#: ``DTYPE_BYTES``, 4 B for a label it does not know), so a bool mask labelled "bool" counted 4 B per element and a
#: GPT-2 (1, 1, S, S) causal mask looked too large to stay cache-resident under ``GraphBuilder.elementwise``'s
#: broadcast rule (``op_graph._CACHED_BROADCAST``). These are the labels the torch.export importer gives the same
#: torch dtypes (``torch_import/tables._OTHER_DTYPE_NAMES``: bool/uint8/int8 -> "fp8", int16 -> "fp16"), so one
#: mask costs the same through either importer.
_SIZED_NAMES = {2: "fp8", 3: "fp8", 9: "fp8", 4: "fp16", 5: "fp16"}

#: the label of a bool tensor (a mask, a comparison's output)
_MASK_DTYPE = _SIZED_NAMES[9]

_DEFAULT_DOMAINS = ("", "ai.onnx")


class InvalidModelError(GraphError):
    """The ONNX model itself is invalid (not merely beyond what the importer maps): e.g. a MatMul or Gemm whose
    inner dimensions, fixed in the file, differ. Refuses the model instead of costing the node by the roofline."""


class BoundDimsError(InvalidModelError):
    """The ONNX model cannot run at the dims its symbolic inputs were bound to (a MatMul / Gemm whose inner dims
    differ once they are bound, though the file does not fix them apart): refused naming the node, the shapes and
    the bound dims, not costed by the roofline as if it ran."""


@dataclass(frozen=True)
class _Static:
    """A value known before the run: initializers, constants, shapes, and anything computed from them only."""

    shape: tuple[int | None, ...] | None
    sources: frozenset  # float initializers it was computed from (parameter candidates)
    elem: int  # ONNX element type (0 = unknown)


class _Builder(GraphBuilder):
    """GraphBuilder plus the hooks an importer of arbitrary graphs needs (see the report; ``own_params`` is
    GraphBuilder's)."""

    def link(self, t: Tensor, inputs: Iterable[Tensor]) -> None:
        """Add data-dependency edges from ``inputs`` to the node that produced ``t``."""
        if t.node < 0:
            return
        ins = self._nodes[t.node].inputs
        for x in inputs:
            if x.node >= 0 and x.node not in ins and x.node != t.node:
                ins.append(x.node)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._use_journal: list[int] = []  # tensor ids in the order ``_add`` recorded a gradient use of them

    def _add(self, name, op_class, kernel, method, inputs, out_shape, *, grad_inputs=None, **kw):
        # journal the gradient uses ``GraphBuilder._add`` records (the same condition), so ``rollback`` can take
        # back exactly the uses of the kernels it forgets
        for t in inputs if grad_inputs is None else grad_inputs:
            if t.node >= 0 and t.tid >= 0 and t.tid not in self._no_grad:
                self._use_journal.append(t.tid)
        return super()._add(name, op_class, kernel, method, inputs, out_shape, grad_inputs=grad_inputs, **kw)

    def mark(self) -> tuple:
        return (len(self._nodes), len(self._tensor_bytes), self.param_count, self.param_bytes,
                len(self._use_journal))

    def rollback(self, mark: tuple) -> None:
        """Forget the kernels and tensors recorded since ``mark`` (a handler that failed half-way, a branch tried)."""
        n_nodes, n_tensors, self.param_count, self.param_bytes, n_uses = mark
        del self._nodes[n_nodes:]
        del self._out_bytes[n_nodes:]
        del self._tensor_bytes[n_tensors:]
        del self._tensor_node[n_tensors:]
        del self._tensor_shape[n_tensors:]
        del self._tensor_dtype[n_tensors:]
        journal = self._use_journal
        for tid in reversed(journal[n_uses:]):
            uses = self._grad_uses[tid]
            uses.pop()
            if not uses:
                del self._grad_uses[tid]
        del journal[n_uses:]
        if any(t >= n_tensors for t in self._no_grad):
            self._no_grad = {t for t in self._no_grad if t < n_tensors}

    def alias(self, shape: Sequence[int], dtype: str, node: int) -> Tensor:
        """A further output of the kernel ``node`` (or a stand-in of another shape for ``node``'s output)."""
        return self._tensor(shape, dtype, node)


def _numel_dims(dims) -> int:
    return int(math.prod(int(d) for d in dims)) if len(dims) else 1


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
