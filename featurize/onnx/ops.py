"""ONNX op -> builder call: the mapping tables (data) and one handler per kind of op.

A handler ``(k, n, name, ins)`` records the kernels of node ``n`` and sets its outputs; one that meets shapes it
cannot cost raises (see ``assemble._HANDLER_ERRORS``) and the op is then costed by the roofline instead.
"""

from __future__ import annotations

from wattcast.data.kernel_ops import DTYPE_BYTES
from wattcast.featurize.onnx.common import _DEFAULT_DOMAINS, _FLOAT_TYPES, _MASK_DTYPE, _Static, _attr, _numel_dims
from wattcast.featurize.einsum_gemm import einsum_gemm
from wattcast.featurize.op_graph import GraphError, Tensor, attention_pair_share

#: elementwise ONNX ops -> builder elementwise op (vocabulary of wattcast.data.kernel_ops, costed there)
_UNARY = {
    "Relu": "relu", "LeakyRelu": "relu", "Abs": "relu", "Sign": "relu", "Floor": "relu", "Ceil": "relu",
    "Round": "relu", "Clip": "relu", "ThresholdedRelu": "relu", "Shrink": "relu",
    "Tanh": "tanh", "Erf": "tanh", "Sin": "tanh", "Cos": "tanh", "Tan": "tanh", "Atan": "tanh", "Asin": "tanh",
    "Acos": "tanh", "Sinh": "tanh", "Cosh": "tanh",
    "Sigmoid": "sigmoid", "HardSigmoid": "sigmoid", "Exp": "exp", "Log": "exp", "Elu": "exp", "Selu": "exp",
    "Celu": "exp", "Softplus": "exp", "Mish": "silu", "HardSwish": "silu", "Swish": "silu",
    "Sqrt": "sqrt", "Reciprocal": "divu", "Softsign": "divu", "Neg": "neg",
    "Gelu": "gelu", "FastGelu": "gelu", "BiasGelu": "gelu", "QuickGelu": "gelu",
    "IsNaN": "relu", "IsInf": "relu", "Not": "relu",
}

_BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Mod": "div", "PRelu": "mul",
    "Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add", "BiasAdd": "add",
    "Where": "where",
    "Equal": "sub", "Less": "sub", "Greater": "sub", "LessOrEqual": "sub", "GreaterOrEqual": "sub",
    "And": "mul", "Or": "add", "Xor": "add", "BitwiseAnd": "mul", "BitwiseOr": "add", "BitwiseXor": "add",
}

#: graph labels of float tensors, as op_graph._FLOAT_DTYPES (a Softmax or Cast in another of them than the model's is
#: costed at its width)
_FLOAT_LABELS = ("fp32", "bf16", "fp16")

_BOOL_OUT = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "IsNaN", "IsInf"}

#: ops whose float initializer operand is a learned parameter (bias, scale, position table, slope)
_PARAM_ARITH = {"Add", "Sub", "Mul", "Div", "PRelu", "BiasAdd", "FastGelu", "BiasGelu"}

_VIEW_OPS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}

_COPY_OPS = {"Transpose", "Concat", "Slice", "Split", "Expand", "Tile", "Pad", "GatherElements", "GatherND",
             "ScatterND", "ScatterElements", "Scatter", "Resize", "Upsample", "DepthToSpace", "SpaceToDepth",
             "Trilu", "OneHot", "ReverseSequence", "Compress", "CenterCropPad"}

#: scatter ops: the output is the ``data`` input's shape (``_Ops._scatter``)
_SCATTER_OPS = frozenset({"ScatterND", "ScatterElements", "Scatter"})

_REDUCE_OPS = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
               "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin", "CumSum", "TopK",
               "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool"}

_NO_GRAD = {"ArgMax", "ArgMin"}

#: ops normalised over the last axes / over groups of channels
_NORM_OPS = ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "SkipLayerNormalization",
             "SkipSimplifiedLayerNormalization", "GroupNormalization", "InstanceNormalization",
             "MeanVarianceNormalization")


def _first_wins(*groups: tuple) -> dict[str, str]:
    """``{op: handler}`` from ``(ops, handler)`` groups; an op in several groups keeps the first one's handler."""
    table: dict[str, str] = {}
    for ops, handler in groups:
        for op in ops:
            table.setdefault(op, handler)
    return table


#: ONNX op (default domain or com.microsoft) -> name of the handler method that maps it; any other op is costed
#: by the roofline and counted as unmapped
_HANDLERS = _first_wins(
    (("MatMul", "FusedMatMul"), "_matmul"),
    (("Gemm",), "_gemm"),
    (("Conv", "ConvTranspose"), "_conv"),
    (_NORM_OPS, "_norm"),
    (("BatchNormalization",), "_batchnorm"),
    (("Softmax", "LogSoftmax"), "_softmax"),
    (("Gather",), "_gather"),
    (_VIEW_OPS, "_view_op"),
    (_COPY_OPS, "_copy_op"),
    (_REDUCE_OPS, "_reduce"),
    (("Dropout",), "_dropout"),
    (("Cast", "CastLike"), "_cast"),
    ((*_UNARY, *_BINARY), "_elementwise"),
    (("Attention",), "_attention"),
    (("Einsum",), "_einsum"),
    (("SplitToSequence",), "_split_to_sequence"),
    (("SequenceAt",), "_sequence_at"),
    (("Loop",), "_loop"),
    (("Scan",), "_scan"),
    (("If",), "_if"),
)
#: ops mapped only in the default domain (com.microsoft's ``Attention`` takes other inputs; control flow: control.py)
_DEFAULT_DOMAIN_ONLY = frozenset({"Attention", "Loop", "Scan", "If"})


class _Ops:
    """The per-op handlers (a mixin of the importer)."""

    def _handler(self, op: str, n):
        """The bound handler of ``op`` (None when nothing maps it)."""
        if op in _DEFAULT_DOMAIN_ONLY and n.domain not in _DEFAULT_DOMAINS:
            return None
        handler = _HANDLERS.get(op)
        return getattr(self, handler) if handler else None

    def _rg(self, *names: str) -> bool:
        return any(self.rg.get(nm, False) for nm in names if nm)


    def _matmul(self, k, n, name, ins):
        a_nm, b_nm = ins[0], ins[1]
        sa, sb = self._is_static(a_nm), self._is_static(b_nm)
        out_nm = n.output[0]
        ta, tb = _attr(n, "transA", 0), _attr(n, "transB", 0)  # FusedMatMul
        self._refuse_mismatched_inner(n, name, a_nm, b_nm, ta, tb)
        if sb and not sa and not ta and not tb and self._is_float(b_nm) and len(self._shape(b_nm) or ()) == 2:
            x = self._tensor(a_nm)
            wshape = self._shape(b_nm)
            if x.shape[-1:] != wshape[:1]:
                raise GraphError(f"contraction dims differ: {x.shape} @ {wshape}")
            squeeze = len(x.shape) == 1
            if squeeze:
                x = self._view(x, (1, x.shape[0]))
            add = self.bias_of.get(k)
            bias_nm = self._other(add, out_nm) if add is not None else None
            group = [k] + ([add] if add is not None else [])
            params = self._claim([b_nm], group)
            bias_params = self._claim([bias_nm], group) if bias_nm else 0
            kout = wshape[1]
            y = self.b.linear(x, kout, bias=bias_nm is not None, name=name, weight_params=params == x.shape[-1] * kout,
                              needs_input_grad=self._rg(a_nm))
            counted = (x.shape[-1] * kout if params == x.shape[-1] * kout else 0) + (kout if bias_nm else 0)
            self.b.own_params(y, params + bias_params - counted)
            final = self.nodes[add].output[0] if add is not None else out_nm
            y_shape = y.shape[1:] if squeeze else y.shape
            y = self._view(y, self._out_shape(final, y_shape, y_shape))
            self._set(final, y, True)
            return
        a, b = self._tensor(a_nm), self._tensor(b_nm)
        if ta and len(a.shape) >= 2:
            a = self._view(a, (*a.shape[:-2], a.shape[-1], a.shape[-2]))
        if tb and len(b.shape) >= 2:
            b = self._view(b, (*b.shape[:-2], b.shape[-1], b.shape[-2]))
        a_vec, b_vec = len(a.shape) == 1, len(b.shape) == 1
        if a_vec:
            a = self._view(a, (1, a.shape[0]))
        if b_vec:
            b = self._view(b, (b.shape[0], 1))
        if k in self.attn_pairs:  # an attention core's QK^T (b: K^T, (.., d, S_kv)) or PV (a: the (.., S, S_kv) probs)
            s, skv = a.shape[-2], (a.shape[-1] if k in self.attn_pv else b.shape[-1])
            with self.b.model_share(attention_pair_share(int(s), int(skv), causal=self.attn_pairs[k])):
                y = self.b.matmul(a, b, name=name)
        else:
            y = self.b.matmul(a, b, name=name)
        p = self._claim([a_nm if sa else None, b_nm if sb else None], [k])
        if p:
            self.b.own_params(y, p)
        y_shape = tuple(d for i, d in enumerate(y.shape)
                        if not ((a_vec and i == len(y.shape) - 2) or (b_vec and i == len(y.shape) - 1)))
        self._set(out_nm, self._view(y, self._out_shape(out_nm, y_shape, y_shape)), self._rg(a_nm, b_nm) or p > 0)


    def _gemm(self, k, n, name, ins):
        a_nm, b_nm = ins[0], ins[1]
        c_nm = ins[2] if len(ins) > 2 and ins[2] else None
        ta, tb = _attr(n, "transA", 0), _attr(n, "transB", 0)
        out_nm = n.output[0]
        self._refuse_mismatched_inner(n, name, a_nm, b_nm, ta, tb)
        a = self._tensor(a_nm)
        if len(a.shape) != 2:
            raise GraphError(f"Gemm needs 2-D A, got {a.shape}")
        if ta:
            a = self._view(a, (a.shape[1], a.shape[0]))
        if self._is_static(b_nm) and not self._is_static(a_nm) and self._is_float(b_nm):
            bshape = self._shape(b_nm)
            if bshape is None or len(bshape) != 2:
                raise GraphError(f"Gemm needs a 2-D B, got {bshape}")
            kin, kout = (bshape[1], bshape[0]) if tb else bshape
            if a.shape[1] != kin:
                raise GraphError(f"contraction dims differ: {a.shape} @ {bshape} (transB={tb})")
            cshape = self._shape(c_nm) if c_nm else None
            fused_bias = (c_nm is not None and self._static_float(c_nm) and cshape is not None
                          and _numel_dims(cshape) == kout and cshape[-1:] == (kout,))
            params = self._claim([b_nm], [k])
            bias_params = self._claim([c_nm], [k]) if fused_bias else 0
            y = self.b.linear(a, kout, bias=fused_bias, name=name, weight_params=params == kin * kout,
                              needs_input_grad=self._rg(a_nm))
            counted = (kin * kout if params == kin * kout else 0) + (kout if fused_bias else 0)
            self.b.own_params(y, params + bias_params - counted)
            rg = True
        else:
            bt = self._tensor(b_nm)
            if tb:
                bt = self._view(bt, (bt.shape[1], bt.shape[0]))
            y = self.b.matmul(a, bt, name=name)
            p = self._claim([nm for nm in (a_nm, b_nm) if self._is_static(nm)], [k])
            if p:
                self.b.own_params(y, p)
            rg = self._rg(a_nm, b_nm) or p > 0
            fused_bias = False
        if c_nm is not None and not fused_bias:
            c = self._bias_operand(c_nm)
            y2 = self.b.elementwise("add", y, c, name=f"{name}.bias", grad=True)
            p = self._claim([c_nm], [k], weight=False) if self._is_static(c_nm) else 0
            if p:
                self.b.own_params(y2, p)
            y = y2
        self._set(out_nm, self._view(y, self._out_shape(out_nm, y.shape, y.shape)), rg)


    def _bias_operand(self, nm: str) -> Tensor | float:
        if self._is_static(nm):
            s = self._shape(nm)
            if s is not None and _numel_dims(s) <= 1:
                return self._scalar(nm, 1.0)
        return self._tensor(nm)


    def _conv(self, k, n, name, ins):
        x_nm, w_nm = ins[0], ins[1]
        b_nm = ins[2] if len(ins) > 2 and ins[2] else None
        out_nm = n.output[0]
        x = self._tensor(x_nm)
        wshape = self._shape(w_nm)
        if wshape is None:
            raise GraphError("conv weight shape unknown")
        group = int(_attr(n, "group", 1))
        ks = list(wshape[2:])
        strides = list(_attr(n, "strides", [1] * len(ks)))
        dil = list(_attr(n, "dilations", [1] * len(ks)))
        pads = list(_attr(n, "pads", [0] * (2 * len(ks))))
        auto = _attr(n, "auto_pad", "NOTSET")
        computed = None
        if n.op_type == "Conv" and len(x.shape) == len(ks) + 2:
            sp = x.shape[2:]
            if auto in ("SAME_UPPER", "SAME_LOWER"):
                o = [-(-d // st) for d, st in zip(sp, strides)]
            elif auto == "VALID":
                o = [(d - dl * (kk - 1) - 1) // st + 1 for d, kk, st, dl in zip(sp, ks, strides, dil)]
            else:
                nd = len(ks)
                o = [(d + pads[i] + pads[i + nd] - dil[i] * (ks[i] - 1) - 1) // strides[i] + 1 for i, d in enumerate(sp)]
            computed = (x.shape[0], int(wshape[0]), *o)
        out_shape = self._out_shape(out_nm, None, computed)
        wparams = self._claim([w_nm], [k]) if self._is_static(w_nm) else 0
        bparams = self._claim([b_nm], [k]) if b_nm and self._is_static(b_nm) else 0
        rg = True
        y = None
        roofline = False
        if (n.op_type == "Conv" and len(ks) == 2 and len(x.shape) == 4 and group == 1 and ks[0] == ks[1]
                and x.shape[2] == x.shape[3] and len(set(strides)) == 1 and set(dil) == {1}
                and self._is_static(w_nm) and len(out_shape) == 4):
            s = x.shape[2]
            pad = None
            if auto in ("NOTSET", "") and len(set(pads)) == 1:
                pad = pads[0]
            elif auto == "VALID":
                pad = 0
            elif auto in ("SAME_UPPER", "SAME_LOWER"):
                total = (out_shape[2] - 1) * strides[0] + ks[0] - s
                if total >= 0 and total % 2 == 0:
                    pad = total // 2
            if pad is not None and (s + 2 * pad - ks[0]) // strides[0] + 1 == out_shape[2] == out_shape[3]:
                y = self.b.conv2d(x, int(wshape[0]), int(ks[0]), stride=int(strides[0]), padding=int(pad), bias=False, name=name)
                self.b.own_params(y, wparams - int(wshape[0] * x.shape[1] * ks[0] * ks[0]))
        if y is None:  # any other convolution: the roofline with its real FLOPs
            out_n = _numel_dims(out_shape)
            if n.op_type == "Conv":
                flops = 2.0 * out_n * _numel_dims(wshape[1:])
            else:  # ConvTranspose: every input element is scattered through the kernel
                flops = 2.0 * x.numel * _numel_dims(wshape[1:])
            db = self.b.dbytes
            y = self.b.opaque(name, [x], out_shape, flops=flops, bytes_=(x.numel + _numel_dims(wshape) + out_n) * db,
                              op_class="conv", op_type=n.op_type)
            self.b.own_params(y, wparams)
            roofline = True
        if b_nm:
            bias = self._tensor(b_nm)
            bias = self._view(bias, (bias.numel, *([1] * (len(y.shape) - 2))))  # per output channel
            yb = self.b.elementwise("add", y, bias, name=f"{name}.bias")
            self.b.own_params(yb, bparams)
            y = yb
        self._set(out_nm, self._view(y, self._out_shape(out_nm, y.shape, y.shape)), rg)
        if roofline:  # counted once the handler can no longer fail (a failed one is counted in ``fallback``)
            self.roofline_mapped[n.op_type] = self.roofline_mapped.get(n.op_type, 0) + 1


    def _norm(self, k, n, name, ins):
        op = n.op_type
        x_nm = ins[0]
        x = self._tensor(x_nm)
        rg = True
        if op in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"):
            # com.microsoft: (input, skip, gamma, beta?, bias?) / (input, skip, gamma, bias?)
            skip = self._tensor(ins[1])
            opt = [*ins[2:], "", "", ""]
            gamma = opt[0] or None
            if op == "SkipLayerNormalization":
                beta, bias = opt[1] or None, opt[2] or None
            else:
                beta, bias = None, opt[1] or None
            x = self.b.elementwise("add", x, skip, name=f"{name}.skip")
            if bias:
                x = self.b.elementwise("add", x, self._tensor(bias), name=f"{name}.bias")
                self.b.own_params(x, self._claim([bias], [k]))
            if len(n.output) > 3 and n.output[3]:
                self._set(n.output[3], x, True)
            rms = op == "SkipSimplifiedLayerNormalization"
            axis = -1
        elif op in ("GroupNormalization", "InstanceNormalization", "MeanVarianceNormalization"):
            gamma = ins[1] if len(ins) > 1 else None
            beta = ins[2] if len(ins) > 2 else None
            rms = False
            if op == "GroupNormalization":
                groups = int(_attr(n, "num_groups", 1))
                lead = x.shape[0] * groups
            elif op == "InstanceNormalization":
                lead = x.shape[0] * (x.shape[1] if len(x.shape) > 1 else 1)
            else:
                axes = _attr(n, "axes", [0, 2, 3])
                lead = x.numel // max(1, _numel_dims([x.shape[a] for a in axes if a < len(x.shape)]))
            axis = None
            h = x.numel // max(1, lead)
            xv = self._view(x, (lead, h))
        else:
            gamma = ins[1] if len(ins) > 1 and ins[1] else None
            beta = ins[2] if len(ins) > 2 and ins[2] and op == "LayerNormalization" else None
            rms = op != "LayerNormalization"
            axis = int(_attr(n, "axis", -1))
        if axis is not None:
            ax = axis % len(x.shape) if x.shape else 0
            h = _numel_dims(x.shape[ax:])
            xv = self._view(x, (x.numel // max(1, h), h)) if ax != len(x.shape) - 1 else x
        y = self._layernorm(k, xv, name, gamma, beta, rms)
        y = self._view(y, x.shape)
        self._set(n.output[0], y, rg)
        self._register_rest(n, y, rg)


    def _layernorm(self, k, x: Tensor, name: str, gamma, beta, rms: bool) -> Tensor:
        has_bias = bool(beta) and not rms
        y = self.b.layernorm(x, name=name, bias=has_bias, rms=rms)
        h = int(x.shape[-1])
        counted = h * (1 if rms or not has_bias else 2)
        claimed = self._claim([gamma, beta if beta else None], [k])
        self.b.own_params(y, claimed - counted)
        return y


    def _emit_fused(self, k, n, name, payload) -> None:
        kind = payload[0]
        if kind == "layernorm":
            _, x_nm, out_nm, gamma, beta, rms = payload
            y = self._layernorm(k, self._tensor(x_nm), f"{name}.{'rmsnorm' if rms else 'layernorm'}", gamma, beta, rms)
            self._set(out_nm, y, True)
        elif kind == "gelu":
            _, x_nm, out_nm = payload
            y = self.b.elementwise("gelu", self._tensor(x_nm), name=f"{name}.gelu", grad=self._rg(x_nm))
            self._set(out_nm, y, self._rg(x_nm))


    def _batchnorm(self, k, n, name, ins):
        """BatchNormalization (X, scale, B, input_mean, input_var): in training mode (``training_mode=1``, opset 14+;
        before opset 14 the running-statistics outputs mark it: torch.onnx's ``TrainingMode.TRAINING`` export) the batch
        statistics and the normalization, else the per-channel affine of the running statistics
        (GraphBuilder.batchnorm, costed as the torch.export importer costs ``aten.batch_norm``)."""
        x = self._tensor(ins[0])
        outs = [o for o in n.output[1:] if o]
        training = bool(_attr(n, "training_mode", 0)) or (self.opset < 14 and bool(outs))
        y = self.b.batchnorm(x, name=name, affine=True, batch_stats=training)
        c = int(x.shape[1]) if len(x.shape) > 1 else 1
        self.b.own_params(y, self._claim([ins[1], ins[2] if len(ins) > 2 else None], [k]) - 2 * c)
        self._set(n.output[0], y, True)
        for o in outs:  # running_mean / running_var (and, before opset 14, saved_mean / saved_var): per channel
            self._set(o, self.b.alias((c,), y.dtype, y.node), False)


    def _softmax(self, k, n, name, ins):
        """Softmax in its tensor's dtype (an fp32 input in a bf16 model: the fp32 kernel, 8 B an element), as the
        torch.export importer costs ``softmax(x, dim, dtype)`` (torch_import/ops._softmax). The exporters write
        ``softmax(x, -1, dtype=torch.float32)`` as a Softmax in ``x``'s dtype followed by a Cast to FLOAT
        (torch/onnx/symbolic_opset13.py ``softmax``: ``g.op("Softmax", ...)`` then ``g.op("Cast", ...)``; the dynamo
        exporter unoptimised writes the same), so a Softmax whose only use is a Cast to a wider float is costed as the
        softmax aten runs for that call (:meth:`_upcast_cast`) and the Cast is its output, not another kernel."""
        x = self._tensor(ins[0])
        rank = len(x.shape)
        axis = int(_attr(n, "axis", -1 if self.opset >= 13 else 1))
        ax = axis % rank if rank else 0
        h = _numel_dims(x.shape[ax:]) if self.opset < 13 else (x.shape[ax] if rank else 1)
        xv = x if (rank and ax == rank - 1) else self._view(x, (x.numel // max(1, h), h))
        up, out = self._upcast_cast(n, x) if n.op_type == "Softmax" else (None, x.dtype)
        if up is not None and not (x.dtype == "fp16" and out == "fp32"):
            # aten softmax(input, dim, dtype) (aten/src/ATen/native/SoftMax.cpp): ``input.toType(dtype)`` then the
            # softmax, except CUDA's one half_to_float kernel for fp16 -> fp32
            xv = self.b.copy(xv, name=f"{name}.to_{out}", grad=self._rg(ins[0]), out_dtype=out)
        out_dtype = out if out in _FLOAT_LABELS and out != self.dtype else None
        y = self._view(self.b.softmax(xv, name=name, out_dtype=out_dtype), x.shape)
        self._set(n.output[0], y, self._rg(ins[0]))
        if up is not None:
            self.folded_casts.add(up)


    def _upcast_cast(self, n, x: Tensor) -> tuple[int | None, str]:
        """(the Cast that is the only use of Softmax ``n``'s output and widens its float input ``x``, e.g. to FLOAT
        from a bf16 / fp16 tensor: the exporters' ``softmax(x, dim, dtype=torch.float32)``; its graph dtype), or
        (None, ``x``'s dtype) when there is none."""
        c = self._sole(n.output[0])
        if c is None or self.nodes[c].op_type != "Cast" or self.nodes[c].domain not in _DEFAULT_DOMAINS:
            return None, x.dtype
        to = self._tdtype(int(_attr(self.nodes[c], "to", 0)))
        wider = DTYPE_BYTES.get(to, 0) > DTYPE_BYTES.get(x.dtype, 4)
        return (c, to) if wider and x.dtype in _FLOAT_LABELS and to in _FLOAT_LABELS else (None, x.dtype)


    def _gather(self, k, n, name, ins):
        data_nm, idx_nm = ins[0], ins[1]
        out_nm = n.output[0]
        axis = int(_attr(n, "axis", 0))
        dshape = self._shape(data_nm)
        if self._is_static(data_nm) and axis == 0 and dshape and self._is_float(data_nm):
            ids = self._tensor(idx_nm)
            vocab, dim = int(dshape[0]), _numel_dims(dshape[1:])
            p = self._claim([data_nm], [k])
            y = self.b.embedding(ids, vocab, dim, name=name, params=p == vocab * dim)
            self.b.own_params(y, p - (vocab * dim if p == vocab * dim else 0))
            y_shape = (*ids.shape, *dshape[1:])
            self._set(out_nm, self._view(y, self._out_shape(out_nm, y_shape, y_shape)), True)
            return
        self._copy_op(k, n, name, ins)


    def _view_op(self, k, n, name, ins):
        x = self._tensor(ins[0])
        out_nm = n.output[0]
        shape = self._out_shape(out_nm, x.shape, self._computed_shape(n))
        self._set(out_nm, self._view(x, shape), self._rg(ins[0]))


    def _copy_op(self, k, n, name, ins):
        op = n.op_type
        acts = [i for i in ins if i and not self._is_static(i)]
        if not acts:  # e.g. a Concat of constants in a custom region
            acts = [i for i in ins if i]
        tensors = [self._tensor(i) for i in acts]
        src = tensors[0]
        rg = self._rg(*acts)
        outs = [o for o in n.output if o]
        if op == "Transpose":
            perm = _attr(n, "perm", list(range(len(src.shape)))[::-1])
            shape = tuple(src.shape[p] for p in perm)
            moved = [p for p in perm if src.shape[p] != 1]
            if moved == sorted(moved):  # only size-1 dims move: a free view
                self._set(outs[0], self._view(src, shape), rg)
                return
            y = self.b.copy(src, shape, name=name, grad=rg)
            self._set(outs[0], y, rg)
            return
        if op == "Split" and all(self._read_in_place(o) for o in outs):
            # torch.split is a view (aten::split -> narrow): parts read only by copies (a head Transpose) and linears
            # are never materialised. Each part keeps the source's tensor id, as the torch.export importer's views
            # do, so their gradients are assembled by one cat (GraphBuilder's grad_split_cat)
            for i, o in enumerate(n.output):
                if o:
                    shape = tuple(self._out_shape(o, src.shape, self._computed_shape(n, i)))
                    self._set(o, Tensor(shape, src.dtype, src.node, src.tid), rg)
            return
        if op == "Split":  # one kernel writes every part
            y = self.b.copy(src, name=name, grad=rg)
            for i, o in enumerate(n.output):
                if o:
                    self._set(o, self.b.alias(self._out_shape(o, src.shape, self._computed_shape(n, i)), y.dtype, y.node), rg)
            return
        if op in _SCATTER_OPS:
            self._scatter(n, name, ins, rg)
            return
        if op in ("Resize", "Upsample") and self._shape(outs[0]) is None and self._computed_shape(n) is None:
            # the input's shape would be a guess: every op after it costed at the wrong size (audit 57f finding 2)
            raise GraphError(f"{op}: its output size is unknown (neither shape inference nor its constant scales / "
                             "sizes give it); the ops after it are costed at its input's size")
        # a static float tensor a copy moves is a parameter (a ViT's class token in ``cat([cls.expand(B, -1, -1), x])``,
        # counted as elementwise ops count a position table they add: ``_PARAM_ARITH``); its gradient flows through
        # here. Only the data moved: every input of a Concat, the first of the others (not Resize's scales, OneHot's
        # values, Pad's fill value)
        moved = ins if op == "Concat" else ins[:1]
        params = self._claim([i for i in moved if i and self._is_static(i)], [k], weight=False)
        rg = rg or params > 0
        shape = self._out_shape(outs[0], src.shape, self._computed_shape(n))
        stand_in = self.b.alias(shape, src.dtype, src.node) if _numel_dims(shape) != src.numel else self._view(src, shape)
        y = self.b.copy(stand_in, name=name, grad=rg)
        if params:
            self.b.own_params(y, params)
        self.b.link(y, tensors[1:])
        self._set(outs[0], y, rg)
        self._register_rest(n, y, rg)


    def _scatter(self, n, name, ins, rg: bool) -> None:
        """ScatterElements / ScatterND / Scatter (``data``, ``indices``, ``updates``): the output has the shape of
        ``data`` (ONNX operator spec: "output ... of the same shape as data"), whatever the updates' shape. The kernel
        moves the larger of the two: a clone of an activation ``data`` (ONNX scatter is out of place, as
        ``torch.scatter``), or the updates written into a new buffer (``torch.zeros(...).scatter_add(d, idx, x)``:
        pooling, an MoE combine; the zeros are a constant, no kernel at inference). Until stop 57 the output took the
        shape of the first non-constant input -- the updates (or indices) when ``data`` is a constant -- and every op
        after such a scatter was costed at the updates' size (64x the FLOPs of the Linear after a 1,024 -> 16 pooling)."""
        data_nm = ins[0]
        out_nm = n.output[0]
        data_shape = self._shape(out_nm) or self._shape(data_nm)
        if data_shape is None:
            raise GraphError(f"{n.op_type}: the shape of its data input {data_nm!r} is unknown")
        upd_nm = ins[2] if len(ins) > 2 and ins[2] else ""
        if not self._is_static(data_nm):
            moved = self._tensor(data_nm)
        elif upd_nm and not self._is_static(upd_nm):
            moved = self._tensor(upd_nm)
        else:  # constant data and updates (activation indices): the output written
            moved = self.b.input(data_shape, self._tdtype(self._elem(data_nm)), requires_grad=False)
        if _numel_dims(data_shape) > moved.numel:  # the updates written into a larger new buffer: its size is written
            moved = self.b.alias(data_shape, moved.dtype, moved.node)
        y = self.b.copy(moved, name=name, grad=rg)
        self.b.link(y, [self._tensor(i) for i in ins if i and not self._is_static(i)])
        out = y if tuple(y.shape) == tuple(data_shape) else self.b.alias(data_shape, y.dtype, y.node)
        self._set(out_nm, out, rg)


    def _read_in_place(self, name: str, depth: int = 4) -> bool:
        """Every use of ``name`` (through free views) reads it where it lies, strided: a Transpose (a copy kernel
        reading its strided input) or the activation of a MatMul with a 2-D weight (a linear: the GEMM takes the row
        stride). A graph output, or any other use, needs the value materialised."""
        if name in self.graph_outputs or depth == 0:
            return False
        uses = self.consumers.get(name, [])
        for c in uses:
            n = self.nodes[c]
            if n.domain not in _DEFAULT_DOMAINS:
                return False
            if n.op_type in _VIEW_OPS:
                if not self._read_in_place(n.output[0], depth - 1):
                    return False
            elif n.op_type == "MatMul":
                w = n.input[1] if len(n.input) > 1 else ""
                if n.input[0] != name or not self._is_static(w) or len(self._shape(w) or ()) != 2:
                    return False
            elif n.op_type != "Transpose":
                return False
        return bool(uses)


    def _split_to_sequence(self, k, n, name, ins):
        """``torch.split`` in an unoptimised export: one kernel writing the parts, kept as a list."""
        x = self._tensor(ins[0])
        r = len(x.shape)
        ax = int(_attr(n, "axis", 0)) % r
        keep = int(_attr(n, "keepdims", 1))
        split = self._const(ins[1]) if len(ins) > 1 and ins[1] else None
        d = x.shape[ax]
        if split is None:
            sizes = [1] * d
        elif split.ndim == 0:
            each = int(split)
            sizes = [min(each, d - i) for i in range(0, d, each)]
        else:
            sizes = [int(v) for v in split]
        rg = self._rg(ins[0])
        y = self.b.copy(x, name=name, grad=rg)
        parts = []
        for sz in sizes:
            shape = (*x.shape[:ax], sz, *x.shape[ax + 1:]) if (keep or split is not None) else (*x.shape[:ax], *x.shape[ax + 1:])
            parts.append(self.b.alias(shape, y.dtype, y.node))
        self.vals[n.output[0]] = parts  # type: ignore[assignment]
        self.rg[n.output[0]] = rg


    def _sequence_at(self, k, n, name, ins):
        parts = self.vals.get(ins[0])
        pos = self._scalar(ins[1]) if len(ins) > 1 else None
        if not isinstance(parts, list) or pos is None:
            raise GraphError("SequenceAt of an unknown sequence or position")
        self._set(n.output[0], parts[int(pos)], self.rg.get(ins[0], False))


    def _reduce(self, k, n, name, ins):
        x = self._tensor(ins[0])
        out_nm = n.output[0]
        out_shape = self._out_shape(out_nm, (1,), self._computed_shape(n))
        rg = self._rg(ins[0]) and n.op_type not in _NO_GRAD
        y = self.b.reduction(x, out_shape, name=name, grad=rg, out_dtype=self._float_out(self._elem(out_nm)))
        self._set(out_nm, y, rg)
        self._register_rest(n, y, False)


    def _dropout(self, k, n, name, ins):
        x = self._tensor(ins[0])
        p = _attr(n, "ratio", None)
        if p is None:
            p = self._scalar(ins[1], 0.5) if len(ins) > 1 and ins[1] else 0.5
        y = self.b.dropout(x, float(p), name=name)
        self._set(n.output[0], y, self._rg(ins[0]))
        if len(n.output) > 1 and n.output[1]:
            shape = self._out_shape(n.output[1], x.shape, x.shape)
            if y is not x:
                self._set(n.output[1], self.b.alias(shape, _MASK_DTYPE, y.node), False)
            else:
                self.vals[n.output[1]] = _Static(shape, frozenset(), 9)


    def _cast(self, k, n, name, ins):
        """A Cast that changes the element type is a copy kernel writing its target float dtype (FLOAT from bf16: 2 B
        read, 4 B written), as the torch.export importer's casts (GraphBuilder.copy's ``out_dtype``); a non-float
        target keeps the model's width. A Cast to the type its input has, or one a Softmax costed (``folded_casts``),
        is free. (The first importer also called a Cast free when source and target had the same graph label, double
        excepted; with DOUBLE the only float type sharing a label, that clause only ever held for equal types.)"""
        x = self._tensor(ins[0])
        to = _attr(n, "to", None)
        src_e = self._elem(ins[0])
        out_nm = n.output[0]
        if n.op_type == "CastLike" and len(ins) > 1:
            to = self._elem(ins[1])
        rg = self._rg(ins[0]) and to in _FLOAT_TYPES
        if to is None or to == src_e or k in self.folded_casts:
            self._set(out_nm, x, rg)
            return
        src = self._tdtype(src_e)
        if src_e in _FLOAT_TYPES and src != x.dtype and x.dtype in _FLOAT_LABELS:
            # read at the type the graph gives the input: a kernel costed at the model's width that the graph runs in
            # fp32 (a collapsed RMSNorm's fp32 region, a MatMul of fp32 rotary tables) is read 4 B an element by the
            # cast back, as a view of another dtype (torch_import's ``alias``) relabels the same memory
            x = Tensor(x.shape, src, x.node, x.tid)
        self._set(out_nm, self.b.copy(x, name=name, grad=rg, out_dtype=self._float_out(to)), rg)


    def _elementwise(self, k, n, name, ins):
        op = n.op_type
        kernel = _UNARY.get(op) or _BINARY[op]
        operands: list[Tensor | float] = []
        acts: list[str] = []
        statics: list[str] = []
        for i, nm in enumerate(ins):
            if not nm:
                continue
            if op == "Clip" and i > 0:
                continue  # bounds
            if op in ("Pow",) and i == 1 and self._is_static(nm):
                operands.append(self._scalar(nm, 2.0) if _numel_dims(self._shape(nm) or (1,)) <= 1 else self._tensor(nm))
                continue
            if self._is_static(nm):
                s = self._shape(nm)
                statics.append(nm)
                if s is not None and _numel_dims(s) <= 1:
                    operands.append(self._scalar(nm, 1.0))
                else:
                    operands.append(self._tensor(nm))
            else:
                acts.append(nm)
                operands.append(self._tensor(nm))
        if op in _UNARY and kernel != "gelu":
            operands = [t for t in operands if isinstance(t, Tensor)][:1] or operands[:1]
        elif kernel == "gelu":  # FastGelu / BiasGelu: x (+ bias) -> gelu, the bias read as an operand
            operands = [t for t in operands if isinstance(t, Tensor)]
        if not any(isinstance(t, Tensor) for t in operands):
            operands = [self._tensor(ins[0])]
        params = 0
        if op in _PARAM_ARITH and k not in self.mask_adds:
            if op in ("Mul", "Div"):  # a learned scale is a vector; a 2-D table multiplied in (rotary cos/sin) is not
                statics = [nm for nm in statics if sum(d != 1 for d in (self._shape(nm) or (2, 2))) <= 1]
            params = self._claim(statics, [k], weight=False)
        rg = (self._rg(*acts) or params > 0) and op not in _BOOL_OUT
        out_nm = n.output[0]
        # a float output of another type than the model's (an fp32 region between Casts) is computed and written in
        # that type, as the torch.export importer's elementwise ops (out_dtype from the traced dtype)
        out_dtype = _MASK_DTYPE if op in _BOOL_OUT else self._float_out(self._elem(out_nm))
        if kernel == "gelu" and len(operands) > 1:
            operands = operands[:2]
        y = self.b.elementwise(kernel, *operands, name=name, grad=rg, out_dtype=out_dtype)
        if op == "Relu":  # keeps its result for backward, the tensor the next op (a conv) saves too
            self.b.saves_result(y)
        if params:
            self.b.own_params(y, params)
        self._set(out_nm, self._view(y, self._out_shape(out_nm, y.shape, y.shape)), rg)


    def _attention(self, k, n, name, ins):
        q, kk, v = (self._tensor(i) for i in ins[:3])
        causal = bool(_attr(n, "is_causal", 0))
        if len(q.shape) == 3:
            hq = int(_attr(n, "q_num_heads", 0) or 0)
            hk = int(_attr(n, "kv_num_heads", 0) or hq)
            if not hq:
                raise GraphError("3-D Attention without q_num_heads")
            b, s, dq = q.shape
            q = self._view(q, (b, hq, s, dq // hq))
            kk = self._view(kk, (kk.shape[0], hk, kk.shape[1], kk.shape[2] // hk))
            v = self._view(v, (v.shape[0], hk, v.shape[1], v.shape[2] // hk))
        with self.b.tag("attn_core"):
            y = self.b.flash_attention(q, kk, v, causal=causal, name=name)
        self.shared.attention_kinds.add("flash")
        out_nm = n.output[0]
        y = self._view(y, self._out_shape(out_nm, y.shape))
        self.b.link(y, [self._tensor(i) for i in ins[3:] if i and not self._is_static(i)])
        self._set(out_nm, y, self._rg(*ins[:3]))
        self._register_rest(n, y, False)


    def _einsum(self, k, n, name, ins):
        """A two-operand einsum that is a (batched) GEMM is costed as the torch.export importer costs it
        (:func:`einsum_gemm`: a bias-free linear for activation x float initializer without batch indices, else a
        matmul); any other einsum by the roofline, flagged."""
        eq = str(_attr(n, "equation", "")).replace(" ", "")
        present = [i for i in ins if i]
        if len(present) == 2 and self._einsum_gemm(k, n, name, eq, *present):
            return
        tensors = [self._tensor(i) for i in ins if i]
        lhs = eq.split("->")[0].split(",")
        sizes: dict[str, int] = {}
        for t, sub in zip(tensors, lhs):
            if "." in sub or len(sub) != len(t.shape):
                raise GraphError(f"Einsum {eq!r}: cannot size the indices")
            for c, d in zip(sub, t.shape):
                sizes[c] = max(sizes.get(c, 1), int(d))
        flops = 2.0 * _numel_dims(list(sizes.values()))
        out_nm = n.output[0]
        y = self.b.opaque(name, tensors, self._out_shape(out_nm, tensors[0].shape), flops=flops, op_class="bmm")
        p = self._claim([i for i in ins if i and self._is_static(i)], [k])
        if p:
            self.b.own_params(y, p)
        self._set(out_nm, y, self._rg(*ins) or p > 0)


    def _einsum_gemm(self, k, n, name, eq, a_nm, b_nm) -> bool:
        """Record the einsum ``a_nm, b_nm -> n.output[0]`` as its GEMM; False (nothing recorded) when it is not one."""
        sa, sb = self._shape(a_nm), self._shape(b_nm)
        g = einsum_gemm(eq, sa, sb) if sa is not None and sb is not None else None
        if g is None:
            return False
        x, w = self._tensor(a_nm), self._tensor(b_nm)
        out_nm = n.output[0]
        if self._is_static(b_nm) and not self._is_static(a_nm) and self._is_float(b_nm) and not g.batched:
            params = self._claim([b_nm], [k])  # activation x weight: a bias-free linear
            y = self.b.linear(Tensor((g.m, g.n), x.dtype, x.node, x.tid), g.k, bias=False, name=name,
                              weight_params=params == g.n * g.k, needs_input_grad=self._rg(a_nm))
            self.b.own_params(y, params - (g.n * g.k if params == g.n * g.k else 0))
            rg = True
        else:
            y = self.b.matmul(Tensor((g.batch, g.m, g.n), x.dtype, x.node, x.tid),
                              Tensor((g.batch, g.n, g.k), w.dtype, w.node, w.tid), name=name)
            p = self._claim([nm for nm in (a_nm, b_nm) if self._is_static(nm)], [k])
            if p:
                self.b.own_params(y, p)
            rg = self._rg(a_nm, b_nm) or p > 0
        self._set(out_nm, self._view(y, self._out_shape(out_nm, y.shape, y.shape)), rg)
        return True


    def _emit_unknown(self, k, n, name, ins, *, unmapped: bool) -> None:
        op = n.op_type
        if unmapped:
            self.unmapped[op] = self.unmapped.get(op, 0) + 1
        present = [i for i in ins if i]
        tensors = [self._tensor(i) for i in present if not self._is_static(i)]
        in_bytes = sum(_numel_dims(self._shape(i) or (1,)) * self._ebytes(self._elem(i)) for i in present)
        outs = [o for o in n.output if o]
        default = tensors[0].shape if tensors else None
        out_shapes = [self._out_shape(o, default) for o in outs] or [(1,)]
        out_bytes = sum(_numel_dims(s) * self._ebytes(self._elem(o)) for s, o in zip(out_shapes, outs))
        rg = self._rg(*present)
        y = self.b.opaque(name, tensors, out_shapes[0], flops=0.0, bytes_=float(in_bytes + out_bytes), grad=rg, op_type=op)
        p = self._claim([i for i in present if self._is_static(i)], [k], weight=False)
        if p:
            self.b.own_params(y, p)
        for o, s in zip(outs, out_shapes):
            t = y if o == outs[0] else self.b.alias(s, self._tdtype(self._elem(o)), y.node)
            self._set(o, t, rg or p > 0)
