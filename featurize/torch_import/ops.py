"""The handlers of the ``torch.export`` importer: one per kind of ATen op (see ``tables.RULES``), each recording the
op's kernels through the builder and returning the graph Tensor(s) of its output (a mixin of the importer).

A handler ``(node, pkt, a, val, name, grad)`` gets the FX node, its overload packet, its arguments by schema name,
its FakeTensor output, its kernel name and whether it needs a gradient; it returns ``NotImplemented`` for arguments
it does not map (the op is then costed by the roofline), or raises (the same, with the reason).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any

import torch
import torch.fx

from wattcast.featurize.einsum_gemm import einsum_gemm
from wattcast.featurize.op_graph import GraphBuilder, GraphError, Tensor
from wattcast.featurize.torch_import.shapes import _bind, _is_tensor, _shape, _tensors_in
from wattcast.featurize.torch_import.tables import (_APPROX_CHEAP_UNARY, _APPROX_TRANSCENDENTAL, _BATCHNORM_INFERENCE,
                                                   _BATCHNORM_TRAINING, _COMPARISONS, _ELEMENTWISE, _RMSNORM, RULES,
                                                   _op_label, _overload)


def _attach_params(builder: GraphBuilder, tensor: Tensor, n: int) -> None:
    """Count ``n`` parameters on the node that produced ``tensor`` (GraphBuilder has no public way)."""
    if n == 0:
        return
    builder.add_params(n)
    if tensor.node >= 0:
        builder._nodes[tensor.node].values["param_count"] += int(n)  # noqa: SLF001


def _add_edges(builder: GraphBuilder, tensor: Tensor, inputs: list[Tensor]) -> None:
    """Extra data-dependency edges into the node that produced ``tensor`` (multi-input copies)."""
    if tensor.node < 0:
        return
    node = builder._nodes[tensor.node]  # noqa: SLF001
    for t in inputs:
        if t.node >= 0 and t.node not in node.inputs:
            node.inputs.append(t.node)


class _Ops:
    """ATen op -> builder calls (a mixin of the importer: reads and writes its ``vals``, ``grad``, ``root`` and
    parameter claims)."""

    def map(self, node: torch.fx.Node, pkt: str, val: Any) -> Any:
        """Record ``node``'s kernels through the handler :data:`RULES` names for ``pkt`` (NotImplemented: none)."""
        a = _bind(node)
        handler = RULES.get(pkt)
        if handler is None:
            return NotImplemented
        return getattr(self, handler)(node, pkt, a, val, node.name, self.grad[node])

    # ------------------------------------------------------------ free views, reshapes, casts, creation
    def _view(self, node, pkt, a, val, name, grad):
        x = self.value(node.args[0])
        if isinstance(x, (list, tuple)):
            x = x[0]
        if node.args and node.args[0] in self.root:
            self.root[node] = self.root[node.args[0]]
        return self._view_like(x, val)

    def _reshape(self, node, pkt, a, val, name, grad):
        src = node.args[0]
        x = self.value(src)
        if src in self.root:
            self.root[node] = self.root[src]
        sval = src.meta.get("val")
        contiguous = _is_tensor(sval) and sval.is_contiguous()
        if pkt == "contiguous":
            # the memory format asked for (channels_last...) decides; contiguous of a contiguous tensor is free
            fmt = a.get("memory_format")
            if contiguous and fmt in (None, torch.contiguous_format):
                return self.alias(x, val)
            return self.b.copy(x, _shape(val), name=name, grad=grad)
        if contiguous or _shape(sval) == _shape(val):
            return self.alias(x, val)
        return self.b.copy(x, _shape(val), name=name, grad=grad)

    def _cast(self, node, pkt, a, val, name, grad):
        src = node.args[0]
        x = self.value(src)
        sval = src.meta.get("val")
        if src in self.root:  # a (cast) parameter: the GEMM consuming it still owns the weight
            self.root[node] = self.root[src]
        if pkt != "_to_copy" and _is_tensor(sval) and sval.dtype == val.dtype and sval.device == val.device:
            return self.alias(x, val)
        # a cast writes its target dtype (``.to(torch.bfloat16)`` of an fp32 tensor: 4 B read, 2 B written), as the
        # config graphs' casts (GraphBuilder.copy's out_dtype); non-float targets keep the model's width
        return self.b.copy(x, _shape(val), name=name, grad=grad, out_dtype=self._float_out(val))

    def _float_out(self, val) -> str | None:
        """The graph dtype of a float output ``val`` where it is not the model's (an fp32 softmax or cast in a bf16
        model), else None."""
        if not (_is_tensor(val) and val.dtype.is_floating_point):
            return None
        d = self.dt(val.dtype)
        return None if d == self.b.dtype else d

    def _creation(self, node, pkt, a, val, name, grad):
        self.grad[node] = False
        return self.as_tensor(val)

    def _triangular(self, node, pkt, a, val, name, grad):
        """``tril``/``triu``: a mask built off the gradient path is created, no kernel; else a copy."""
        if not grad:
            return self._creation(node, pkt, a, val, name, grad)
        return self.b.copy(self.value(node.args[0]), name=name, grad=grad)

    # ------------------------------------------------------------ parameterised layers, attention, losses
    def _embedding(self, node, pkt, a, val, name, grad):
        w, ids = a["weight"], self.value(a["indices"])
        vocab, dim = (int(s) for s in w.meta["val"].shape)
        n = self.claim(w)
        return self.b.embedding(ids, vocab, dim, name=name, params=n > 0)

    def _norm(self, node, pkt, a, val, name, grad):
        b = self.b
        x = self.value(a["input"])
        rms = pkt in _RMSNORM
        w, bias = a.get("weight"), a.get("bias")
        owned = self.claim(w) + self.claim(bias)
        out = b.layernorm(x, name=name, bias=bias is not None, rms=rms)
        counted = int(x.shape[-1]) * (1 if rms or bias is None else 2)
        _attach_params(b, out, owned - counted)  # the builder assumed an affine LN over the last dim
        return self._like(val, out) if isinstance(val, (list, tuple)) else out

    def _batch_norm(self, node, pkt, a, val, name, grad):
        """``batch_norm(input, weight, bias, running_mean, running_var, training, ...)`` and its decomposed forms:
        the batch statistics and the normalization in training mode, the per-channel affine of the running statistics
        otherwise (GraphBuilder.batchnorm; the ONNX importer's BatchNormalization is costed the same way). Until stop
        57 it was unmapped: the roofline at peak bandwidth, nothing saved (audit 57f findings 1, 4)."""
        x = self.value(a["input"])
        if len(x.shape) < 2:
            return NotImplemented
        if pkt in _BATCHNORM_TRAINING:
            training = True
        elif pkt in _BATCHNORM_INFERENCE:
            training = False
        else:
            training = bool(a.get("training", True))
        w, bias = a.get("weight"), a.get("bias")
        owned = self.claim(w) + self.claim(bias)
        affine = w is not None or bias is not None
        out = self.b.batchnorm(x, name=name, affine=affine, batch_stats=training)
        _attach_params(self.b, out, owned - (2 * int(x.shape[1]) if affine else 0))
        return self._like(val, out) if isinstance(val, (list, tuple)) else out

    def _group_norm(self, node, pkt, a, val, name, grad):
        """``group_norm(input, num_groups, weight, bias, eps)`` / ``native_group_norm(input, weight, bias, N, C, HxW,
        group, eps)``: the LayerNorm kernel over each sample's group of channels, (N * G, C / G * H * W), as the ONNX
        importer costs GroupNormalization (onnx/ops._norm); its per-channel affine is folded in, as there. Until stop 57
        it was unmapped (the roofline)."""
        x = self.value(a["input"])
        groups = int(a.get("num_groups", a.get("group", 0)) or 0)
        if len(x.shape) < 2 or groups <= 0 or int(x.shape[1]) % groups:
            return NotImplemented
        lead = int(x.shape[0]) * groups
        w, bias = a.get("weight"), a.get("bias")
        owned = self.claim(w) + self.claim(bias)
        xv = Tensor((lead, x.numel // lead), x.dtype, x.node, x.tid)
        out = self.b.layernorm(xv, name=name, bias=bias is not None)
        _attach_params(self.b, out, owned - int(xv.shape[-1]) * (2 if bias is not None else 1))
        out = Tensor(x.shape, out.dtype, out.node, out.tid)
        return self._like(val, out) if isinstance(val, (list, tuple)) else out

    def _softmax(self, node, pkt, a, val, name, grad):
        """``softmax(x, dim, dtype=...)`` / ``_softmax(x, dim, half_to_float)``: in the output's dtype (read off the
        FakeTensor ``val``, which the ``dtype`` / ``half_to_float`` argument sets) as aten runs it
        (aten/src/ATen/native/SoftMax.cpp ``softmax(input, dim, dtype)``): an fp16 input to an fp32 softmax is one
        ``half_to_float`` kernel (CUDA), any other change of dtype a cast (``input.toType(dtype)``) and then the
        softmax in that dtype, as hf_blocks.softmax_upcast builds transformers' upcast."""
        x = self.value(a.get("self", node.args[0]))
        out = self._float_out(val)
        if out and out != x.dtype and not (x.dtype == "fp16" and out == "fp32"):
            x = self.b.copy(x, name=f"{name}.to_{out}", grad=grad, out_dtype=out)
        return self.b.softmax(x, name=name, out_dtype=out)

    def _cross_entropy(self, node, pkt, a, val, name, grad):
        x = self.value(a["self"])
        if len(x.shape) > 2:  # (N, C, d1...): the class dim is dim 1
            c = int(x.shape[1])
            x = Tensor((x.numel // c, c), x.dtype, x.node, x.tid)
        return self.b.cross_entropy(x, name=name)

    def _nll(self, node, pkt, a, val, name, grad):
        x, t = self.value(a["self"]), self.value(a["target"])
        self.approximated[_op_label(node.target)] += 1
        picked = Tensor(t.shape, x.dtype, x.node, x.tid)  # reads one log-probability per target
        return self._like(val, self.b.reduction(picked, _shape(_tensors_in(val)[0]), name=name, grad=grad))

    def _regression_loss(self, node, pkt, a, val, name, grad):
        b = self.b
        x, y = self.value(a["self"]), self.value(a.get("target"))
        self.approximated[_op_label(node.target)] += 1
        diff = b.elementwise("sub", x, y if isinstance(y, Tensor) else 0.0, name=f"{name}.diff", grad=grad)
        if int(a.get("reduction", 1) or 0) == 0:
            return diff
        return b.reduction(diff, (), name=name, grad=grad)

    def _dropout(self, node, pkt, a, val, name, grad):
        x = self.value(a.get("input", a.get("self")))
        p = float(a.get("p", 0.0) or 0.0)
        active = bool(a.get("train", True))
        out = self.b.dropout(x, p, name=name) if active else x
        if isinstance(val, (list, tuple)):  # native_dropout: (output, mask)
            return (out, Tensor(x.shape, "fp8", out.node, out.tid))
        return out

    # ------------------------------------------------------------ copies, gathers, reductions
    def _concat(self, node, pkt, a, val, name, grad):
        parts = [t for t in self._flat(self.value(node.args[0]))]
        if not parts:
            return self.as_tensor(val)
        out_shape = _shape(val)
        carrier = Tensor(out_shape, parts[0].dtype, parts[0].node, parts[0].tid)
        out = self.b.copy(carrier, out_shape, name=name, grad=grad)
        _add_edges(self.b, out, parts)
        return out

    def _copy_into(self, node, pkt, a, val, name, grad):
        """``copy_(self, src)``: write src into self."""
        dst, src = self.value(node.args[0]), self.value(node.args[1])
        src = src if isinstance(src, Tensor) else dst
        out = self.b.copy(Tensor(dst.shape, src.dtype, src.node, src.tid), name=name, grad=grad)
        _add_edges(self.b, out, [dst])
        return out

    def _copy(self, node, pkt, a, val, name, grad):
        x = self.value(node.args[0])
        out_shape = _shape(val)
        carrier = Tensor(out_shape, x.dtype, x.node, x.tid)
        return self.b.copy(carrier, out_shape, name=name, grad=grad)

    def _gather(self, node, pkt, a, val, name, grad):
        x = self.value(node.args[0])
        self.approximated[_op_label(node.target)] += 1
        out_shape = _shape(val)
        idx = [t for t in self._flat(self.value(list(node.args[1:]))) if isinstance(t, Tensor)]
        out = self.b.copy(Tensor(out_shape, x.dtype, x.node, x.tid), out_shape, name=name, grad=grad)
        _add_edges(self.b, out, idx)
        return out

    def _reduction(self, node, pkt, a, val, name, grad):
        x = self.value(node.args[0])
        outs = _tensors_in(val)
        differentiable = pkt not in ("argmax", "argmin", "any", "all", "count_nonzero")
        first = self.b.reduction(x, _shape(outs[0]), name=name, grad=grad and differentiable)
        return self._like(val, first)

    def _max_min(self, node, pkt, a, val, name, grad):
        """``max``/``min``: a reduction, except the two-tensor ``.other`` (and ``.out``) overloads: elementwise."""
        if _overload(node) not in ("other", "out"):
            return self._reduction(node, pkt, a, val, name, grad)
        return self._elementwise(node, "maximum", a, val, name, grad)

    def _elementwise(self, node: torch.fx.Node, pkt: str, a: dict, val: Any, name: str, grad: bool) -> Tensor:
        """Elementwise ops, and the ops outside the vocabulary costed as a vocabulary kernel (counted as approximated)."""
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
        if pkt == "relu":  # keeps its result for backward, the tensor the next op (a conv) saves too
            b.saves_result(out)
        if out.shape != _shape(val):
            out = Tensor(_shape(val), out.dtype, out.node, out.tid)
        return out

    def _gemm(self, node: torch.fx.Node, pkt: str, a: dict, val: Any, name: str, grad: bool) -> Tensor:
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
                # an attention core's Q K^T plus a position bias (BLOOM's ALiBi): the add is no model FLOP
                # (hf_blocks.eager_attention's ``attn.position_bias``), the product counts at its core's share
                with (b.model_share(0.0) if node in self.core_share else nullcontext()):
                    out = b.elementwise("add", out, V(a["self"]), name=f"{name}.add", grad=self.grad[node])
            return self._fix(out, val)
        if pkt == "einsum":
            return self._einsum(node, a, val, name)
        return NotImplemented

    def _einsum(self, node: torch.fx.Node, a: dict, val: Any, name: str) -> Any:
        """A two-operand einsum as the GEMM it is: batch (in both inputs and the output), M (first input
        and output), N (contracted), K (second input and output) index groups."""
        ops = list(a["tensors"])
        if len(ops) != 2:
            return NotImplemented
        g = einsum_gemm(str(a["equation"]), _shape(ops[0].meta["val"]), _shape(ops[1].meta["val"]))
        if g is None:
            return NotImplemented  # not a GEMM (diagonals, traces, in-operand sums, ellipses)
        bsz, m, n, k = g.batch, g.m, g.n, g.k
        x, w = self.value(ops[0]), self.value(ops[1])
        if self.is_param(ops[1]) and not g.batched:  # activation x weight: a bias-free linear
            n_w = self.claim(ops[1])
            out = self.b.linear(Tensor((m, n), x.dtype, x.node, x.tid), k, bias=False, name=name,
                                weight_params=n_w > 0, needs_input_grad=self.grad.get(ops[0], False))
        else:
            out = self.b.matmul(Tensor((bsz, m, n), x.dtype, x.node, x.tid), Tensor((bsz, n, k), w.dtype, w.node, w.tid),
                                name=name)
        return self._fix(out, val)

    def _attention(self, node: torch.fx.Node, pkt: str, a: dict, val: Any, name: str, grad: bool) -> Any:
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

        if self.attention == "eager":
            out = self._eager_sdpa(four(q), four(k), four(v), a, causal, name)
        else:
            out = self.b.flash_attention(four(q), four(k), four(v), causal=causal, name=name)
        self.attention_kinds.add("eager" if self.attention == "eager" else
                                 {"fa1": "flash1", "fa3": "flash3"}.get(self.b.flash_kernel, "flash"))
        first = _tensors_in(val)[0]
        out = Tensor(_shape(first), out.dtype, out.node, out.tid)
        if isinstance(val, (list, tuple)):  # (output, logsumexp, ...): all from the fused kernel
            return type(val)((out if i == 0 else (self._like(x, out) if _is_tensor(x) else x)) for i, x in enumerate(val))
        return out

    def _eager_sdpa(self, q: Tensor, k: Tensor, v: Tensor, a: dict, causal: bool, name: str) -> Tensor:
        """``scaled_dot_product_attention`` costed as eager attention (``attention="eager"``: bmm + softmax + bmm, as
        a Hugging Face config's eager attention, featurize/hf_blocks.eager_attention): Q K^T, the scale on the scores,
        the mask (``is_causal``: a bool (S, S_kv) ``where``, as the math backend's tril mask; an ``attn_mask``: ``where``
        when bool, else added), softmax, dropout (``dropout_p``, training), P V. Grouped-query keys and values
        (``enable_gqa``) are repeated to the query heads first (a copy each, transformers' ``repeat_kv``)."""
        from wattcast.featurize.hf_blocks import eager_attention

        bs, hq, s, d = q.shape
        if k.shape[1] != hq:
            if k.shape[1] == 0 or hq % k.shape[1]:
                raise GraphError(f"{name}: {hq} query heads over {k.shape[1]} key/value heads")
            k = self.b.copy(k, (k.shape[0], hq, *k.shape[2:]), name=f"{name}.repeat_k", expand=True)
            v = self.b.copy(v, (v.shape[0], hq, *v.shape[2:]), name=f"{name}.repeat_v", expand=True)
        mask, mask_shape = "none", None
        m = a.get("attn_mask")
        mv = m.meta.get("val") if isinstance(m, torch.fx.Node) else None
        if _is_tensor(mv):
            mask, mask_shape = ("where" if mv.dtype == torch.bool else "add"), _shape(mv)
        elif causal:
            mask, mask_shape = "where", (s, k.shape[2])
        p = float(a.get("dropout_p", 0.0) or 0.0) if self.b.train else 0.0
        return eager_attention(self.b, q, k, v, causal=causal, scale="scores_mul", mask=mask, dropout_p=p,
                               mask_shape=mask_shape)

    def _conv(self, node: torch.fx.Node, pkt: str, a: dict, val: Any, name: str, grad: bool) -> Any:
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
            out = self.b.opaque(name, ins, out_shape, flops=flops, op_class="conv", grad=self.grad[node],
                                op_type=_op_label(node.target))
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
