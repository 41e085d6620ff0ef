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


def _tied_by_value(model, base_dir=None) -> tuple[dict[str, str], list[str]]:
    """Initializers whose values equal an embedding table (or its transpose): (``copy -> table`` names, warnings).

    Only initializers of the table's (transposed) shape are compared, so this costs one pass over the few candidate
    tensors. Values in an external-data file (every model over 2 GB has them there) are read with onnx's own loader
    (``onnx.external_data_helper.load_external_data_for_tensor``: raw bytes at the tensor's offset and length, the
    location checked to stay in ``base_dir``, the model's folder; nothing is unpickled). Until stop 57 they were
    skipped, so a tied LM head saved with external data was counted twice (a 12-layer GPT-2: 163,037,184 parameters for
    124,439,808). A candidate pair whose values are not there (a missing or truncated data file, a model given as
    bytes) cannot be compared: the warning says so, and both tensors are counted.
    """
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}

    def has_values(t):
        return t.data_location == 1 or len(t.raw_data) or len(t.float_data) or len(t.int32_data)

    tables = []
    for n in model.graph.node:
        if n.op_type == "Gather" and n.input and n.input[0] in inits:
            t = inits[n.input[0]]
            if len(t.dims) == 2 and t.data_type in _FLOAT_TYPES and has_values(t):
                tables.append(t)
    out: dict[str, str] = {}
    missing: dict[str, str] = {}  # tensor name -> why its values could not be read

    def values(t):
        if t.data_location != 1:
            return numpy_helper.to_array(t)
        if base_dir is None:
            missing[t.name] = "the model was not given as a file, so its external-data file cannot be found"
            return None
        from onnx import TensorProto
        from onnx.external_data_helper import load_external_data_for_tensor

        loaded = TensorProto()
        loaded.CopyFrom(t)
        try:
            load_external_data_for_tensor(loaded, str(base_dir))
            return numpy_helper.to_array(loaded)
        except Exception as e:  # noqa: BLE001 - missing, truncated or outside the folder: not comparable
            where = next((x.value for x in t.external_data if x.key == "location"), "?")
            missing[t.name] = f"its external-data file {where!r} is missing or unreadable ({type(e).__name__})"
            return None

    for tab in {t.name: t for t in tables}.values():
        v, d = tab.dims
        cands = [t for t in model.graph.initializer if t.name != tab.name and t.data_type == tab.data_type
                 and list(t.dims) in ([d, v], [v, d]) and has_values(t)]
        if not cands:
            continue
        try:
            a = values(tab)
        except Exception:  # noqa: BLE001
            continue
        if a is None:
            continue
        for c in cands:
            try:
                b = values(c)
            except Exception:  # noqa: BLE001
                continue
            if b is None:
                continue
            if (b.shape == a.shape and np.array_equal(a, b)) or (b.shape == a.T.shape and np.array_equal(a.T, b)):
                out[c.name] = tab.name
    if not missing:
        return out, []
    names = ", ".join(repr(nm) for nm in list(missing)[:4]) + (", ..." if len(missing) > 4 else "")
    return out, [f"tied weights not checked: the values of {names} (an embedding table and a tensor of its shape) "
                 f"could not be read: {next(iter(missing.values()))}; if the LM head reuses the embedding table it is "
                 "counted twice in param_count, the weights' memory and the optimizer step (keep the external-data "
                 "file beside the .onnx file)"]


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
