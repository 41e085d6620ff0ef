"""The attention cores of the ``torch.export`` importer written out in matmuls (``q @ k.transpose(-2, -1)``, scale,
mask, softmax, dropout, ``@ v``): which nodes form one, and whether its mask is causal, so that its kernels count in
model FLOPs as Hugging Face eager attention's do (featurize/hf_blocks.eager_attention): QK^T and PV at the pairs the
mask keeps (featurize/op_graph.attention_pair_share: causal self-attention half), the scale / mask / softmax /
dropout kernels between them not at all (hardware FLOPs only), so MFU does not depend on how the attention was
written. The ONNX importer decides the same way (featurize/onnx/patterns._mask_is_causal)."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch
import torch.fx

from wattcast.featurize.attention_mask import MAX_MASK_ELEMENTS, is_triangular_mask
from wattcast.featurize.torch_import.shapes import _bind
from wattcast.featurize.torch_import.tables import (_ATTN_PROPAGATE, _COPIES, _NO_KERNEL, _RESHAPES, _SOFTMAX, _VIEWS,
                                                    _packet)

#: the products that open (Q K^T) and close (P V) a core
_CORE_GEMMS = frozenset(("matmul", "bmm", "einsum", "baddbmm"))
#: ops a mask passes through on its way to the scores (slicing a stored mask, casting, broadcasting, inverting it,
#: turning a bool mask into an additive one, combining it with another)
_MASK_PASS = _VIEWS | _RESHAPES | _COPIES | frozenset((
    "contiguous", "to", "type_as", "eq", "ne", "logical_not", "bitwise_not", "logical_and", "bitwise_and",
    "logical_or", "bitwise_or", "mul", "sub", "rsub", "add", "neg", "where", "masked_fill", "minimum", "maximum",
    "clamp", "clamp_min", "clamp_max"))
#: the comparisons that make a causal mask from two position indices (arange row vs column)
_MASK_COMPARE = frozenset(("lt", "le", "gt", "ge", "less", "less_equal", "greater", "greater_equal"))
#: ops a position index passes through (an offset, a cast, a reshape)
_INDEX_PASS = _VIEWS | _RESHAPES | frozenset(("add", "sub", "rsub", "to", "_to_copy", "clone", "contiguous",
                                              "type_as", "repeat", "expand"))
#: the most nodes a core's chain between its two products may hold
_MAX_CHAIN = 48


def triangular_tensor(t: Any) -> bool:
    """A real (not meta, not fake) tensor whose last two dims hold a causal mask pattern
    (featurize/attention_mask.is_triangular_mask)."""
    if not isinstance(t, torch.Tensor) or t.device.type == "meta" or t.dim() < 2 or min(t.shape[-2:]) < 2:
        return False
    if t.numel() > MAX_MASK_ELEMENTS or isinstance(t, torch._subclasses.FakeTensor):
        return False
    x = t.detach().cpu()
    if x.dtype not in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                       torch.float32, torch.float64):
        x = x.float()  # bf16, fp8: no numpy dtype
    return is_triangular_mask(np.asarray(x.numpy()))


class _AttentionCores:
    """Attention-core matching (a mixin of the importer: reads ``self.mask_nodes``, ``self.bound_to``,
    ``self.is_param``)."""

    def match_core(self, qk: torch.fx.Node) -> tuple[list[torch.fx.Node], torch.fx.Node, bool] | None:
        """(the nodes between ``qk`` and the product with V, that product, is the mask causal) when ``qk``'s uses run
        through elementwise / softmax / dropout / view ops -- a softmax among them -- into one activation-by-activation
        product and nowhere else; else None (the core is left as it was tagged, its kernels counted whole)."""
        chain: list[torch.fx.Node] = []
        pv = None
        seen = {qk}
        todo = [qk]
        softmax = False
        while todo:
            cur = todo.pop()
            for u in cur.users:
                if u in seen:
                    continue
                if u.op != "call_function":
                    return None  # the scores or probabilities are an output (attention weights returned)
                if u.target is operator.getitem:
                    seen.add(u)
                    chain.append(u)
                    todo.append(u)
                    continue
                pkt = _packet(u.target)
                if pkt in _NO_KERNEL:
                    continue
                if pkt in _CORE_GEMMS:
                    ops = [o for o in u.all_input_nodes if o is not cur]
                    if pv not in (None, u) or len(ops) != 1 or self.is_param(ops[0]) or pkt == "baddbmm":
                        return None
                    pv = u
                    continue
                if pkt not in _ATTN_PROPAGATE and pkt not in _SOFTMAX:
                    return None
                seen.add(u)
                chain.append(u)
                todo.append(u)
                softmax |= pkt in _SOFTMAX
                if len(chain) > _MAX_CHAIN:
                    return None
        if pv is None or not softmax:
            return None
        inside = {qk, *chain}
        operands = [i for c in chain if _packet(c.target) in ("masked_fill", "where", "add", "sub")
                    for i in c.all_input_nodes if i not in inside]
        return chain, pv, self.mask_is_causal(operands)

    def mask_is_causal(self, nodes: list[torch.fx.Node], limit: int = 64) -> bool:
        """Is the mask ``nodes`` (what a core's masking ops read besides the scores) causal, decided from its
        ancestry: it reaches ``tril`` / ``triu`` (diagonal -1, 0 or 1; another diagonal cuts a band, undecided), a
        buffer or constant whose last two dims hold a causal pattern (a registered ``torch.tril`` buffer sliced
        ``[:, :, :T, :T]``; read from the module's real buffers, the export itself runs on meta), or a comparison of
        two ``arange``-derived indices with a (rows, cols) output (``arange(T)[:, None] >= arange(T)``, transformers'
        ``mask_cond < (mask_cond + 1).view(-1, 1)``). Anything else (no mask, a mask given as an input, an op not
        followed) is not causal: bidirectional, the count of a plain walk."""
        seen: set[torch.fx.Node] = set()
        todo = list(nodes)
        while todo and len(seen) < limit:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            if n in self.mask_nodes:
                return True
            if n.op == "placeholder" and n in self.bound_to:  # a sub-graph's argument: the caller's value
                todo.append(self.bound_to[n])
                continue
            if n.op != "call_function":
                continue
            if n.target is operator.getitem:
                todo += n.all_input_nodes
                continue
            pkt = _packet(n.target)
            if pkt in ("tril", "triu"):
                diag = _bind(n).get("diagonal", 0)
                if isinstance(diag, int) and diag in (-1, 0, 1):
                    return True
                continue
            if pkt in _MASK_COMPARE:
                val = n.meta.get("val")
                ins = [a for a in n.args[:2] if isinstance(a, torch.fx.Node)]
                if (isinstance(val, torch.Tensor) and val.dim() >= 2 and min(val.shape[-2:]) >= 2 and len(ins) == 2
                        and all(self._from_arange(a) for a in ins)):
                    return True
                continue
            if pkt in _MASK_PASS:
                todo += n.all_input_nodes
        return False

    def _from_arange(self, node: torch.fx.Node, limit: int = 16) -> bool:
        """``node`` is computed from an ``arange`` (a position index, maybe offset, cast or reshaped)."""
        seen: set[torch.fx.Node] = set()
        todo = [node]
        while todo and len(seen) < limit:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            if n.op == "placeholder" and n in self.bound_to:
                todo.append(self.bound_to[n])
                continue
            if n.op != "call_function":
                continue
            pkt = _packet(n.target)
            if pkt == "arange":
                return True
            if n.target is operator.getitem or pkt in _INDEX_PASS:
                todo += n.all_input_nodes
        return False
