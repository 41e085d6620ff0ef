"""Shapes and values of the ``torch.export`` importer: FakeTensor shapes, a call's arguments by schema name, and the
graph Tensors (views, stand-ins, tuples of outputs) that the importer keeps for each FX node."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from wattcast.featurize.op_graph import Tensor
from wattcast.featurize.torch_import.tables import _dtype_name


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


class _Values:
    """The graph Tensor of each FX node and the shape bookkeeping around it (a mixin of the importer: reads
    ``self.b``, ``self.vals`` and ``self.float_dtype``)."""

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

    def _view_like(self, x: Tensor, val: Any) -> Any:
        if _is_tensor(val):
            return self.alias(x, val)
        return type(val)(self.alias(x, v) for v in val)

    @staticmethod
    def _unsq(x: Tensor) -> Tensor:
        return Tensor((1, *x.shape), x.dtype, x.node, x.tid)

    def _fix(self, out: Tensor, val: Any) -> Tensor:
        shape = _shape(val)
        return out if out.shape == shape else Tensor(shape, out.dtype, out.node, out.tid)
