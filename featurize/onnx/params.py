"""Parameter counting: which float initializers are parameters, each counted once, with tied weights (an LM head
reusing the embedding table) recognised from the torch.onnx metadata or by comparing values."""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import numpy as np

from wattcast.featurize.onnx.common import _FLOAT_TYPES, _Static, _sanitize


def _is_buffer(t) -> bool:
    """A ``torch.export`` buffer or constant (not a parameter), per the exporter's metadata."""
    return any(p.key.endswith("InputSpec.kind") and p.value in ("BUFFER", "CONSTANT_TENSOR", "CUSTOM_OBJ")
               for p in t.metadata_props)


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


class _Params:
    """Claiming parameters for the kernels that use them (a mixin of the importer)."""

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
