"""Subgraphs recognised before emitting: decomposed LayerNorm / RMSNorm and Erf- and tanh-GELU collapse into one kernel,
the attention core is tagged, a MatMul and its bias Add become one linear kernel."""

from __future__ import annotations

import math

from wattcast.featurize.onnx.common import _DEFAULT_DOMAINS, _numel_dims


class _Patterns:
    """Pattern matching over the importer's nodes (a mixin of the importer)."""

    def _sole(self, name: str) -> int | None:
        """The only consumer of ``name`` (None if it has several, or is a graph output)."""
        c = self.consumers.get(name, [])
        if len(c) != 1 or name in self.graph_outputs:
            return None
        return c[0]


    def _other(self, k: int, name: str) -> str | None:
        ins = [i for i in self.nodes[k].input if i]
        if len(ins) != 2 or name not in ins:
            return None
        return ins[1] if ins[0] == name else ins[0]


    def _static_float(self, name: str | None) -> bool:
        return bool(name) and self._is_static(name) and self._is_float(name)


    def _match_patterns(self) -> None:
        taken: set[int] = set()
        for k, n in enumerate(self.nodes):
            if k in taken or n.domain not in _DEFAULT_DOMAINS:
                continue
            got = None
            if n.op_type == "ReduceMean":
                got = self._match_ln(k)
            if got is None and n.op_type in ("Pow", "Mul"):
                got = self._match_rms(k)
            if got is None and n.op_type in ("Div", "Mul"):
                got = self._match_gelu(k)
            if got is None and n.op_type == "Tanh":
                got = self._match_gelu_tanh(k)
            if got is not None:
                group, anchor, payload = got
                if group & taken:
                    continue
                taken |= group
                self.fused[anchor] = payload
                self.groups[anchor] = group
                self.skip |= group - {anchor}
        for k, n in enumerate(self.nodes):
            if n.op_type == "Softmax" and n.domain in _DEFAULT_DOMAINS and k not in taken:
                self._match_attention(k)
        for k, n in enumerate(self.nodes):  # MatMul + bias Add -> one linear kernel
            if n.op_type != "MatMul" or n.domain not in _DEFAULT_DOMAINS or k in taken or len(n.input) != 2:
                continue
            a, w = n.input
            if self._is_static(a) or not self._is_static(w) or not self._is_float(w):
                continue
            add = self._sole(n.output[0])
            if add is None or self.nodes[add].op_type != "Add" or add in taken:
                continue
            bias = self._other(add, n.output[0])
            wshape = self._shape(w)
            bshape = self._shape(bias) if bias else None
            if (wshape and len(wshape) == 2 and self._static_float(bias) and bshape is not None
                    and _numel_dims(bshape) == wshape[1] and bshape[-1:] == (wshape[1],)):
                self.bias_of[k] = add
                self.skip.add(add)
                taken |= {k, add}


    def _is_const_near(self, name: str, target: float, tol: float = 0.05) -> bool:
        v = self._scalar(name)
        return v is not None and abs(v - target) <= tol * max(1.0, abs(target))


    def _affine_tail(self, out: str, group: set[int]):
        """Optional ``* gamma (+ beta)`` after a normalisation: (final output, gamma, beta)."""
        found: dict[str, str] = {}
        for op in ("Mul", "Add"):  # the Add only after a Mul
            m = self._sole(out)
            if m is None or self.nodes[m].op_type != op:
                break
            other = self._other(m, out)
            if not (self._static_float(other) and _numel_dims(self._shape(other) or (2,)) > 1):
                break
            found[op], out = other, self.nodes[m].output[0]
            group.add(m)
        return out, found.get("Mul"), found.get("Add")


    def _match_norm_core(self, centred: str, sq_node: int, group: set[int]):
        """From the squaring node: ReduceMean -> Add(eps) -> Sqrt -> Div(centred, .) | Reciprocal -> Mul(centred, .)."""
        nodes = self.nodes
        r2 = self._sole(nodes[sq_node].output[0])
        if r2 is None or nodes[r2].op_type != "ReduceMean":
            return None
        ad = self._sole(nodes[r2].output[0])
        if ad is None or nodes[ad].op_type != "Add" or not self._is_static(self._other(ad, nodes[r2].output[0]) or ""):
            return None
        sq = self._sole(nodes[ad].output[0])
        if sq is None or nodes[sq].op_type != "Sqrt":
            return None
        s_out = nodes[sq].output[0]
        nx = self._sole(s_out)
        if nx is None:
            return None
        group |= {sq_node, r2, ad, sq}
        if nodes[nx].op_type == "Div" and nodes[nx].input[1] == s_out and self._centred(nodes[nx].input[0], centred, nx, group):
            group.add(nx)
            return nx
        if nodes[nx].op_type == "Reciprocal" or (nodes[nx].op_type == "Div" and list(nodes[nx].input[1:]) == [s_out]
                                                  and self._is_const_near(nodes[nx].input[0], 1.0, 1e-6)):
            mul = self._sole(nodes[nx].output[0])
            if mul is not None and nodes[mul].op_type == "Mul" and self._centred(self._other(mul, nodes[nx].output[0]), centred, mul, group):
                group |= {nx, mul}
                return mul
        return None


    def _centred(self, name: str | None, centred: str, user: int, group: set[int]) -> bool:
        """``name`` is the normalised input itself, or ``gamma * input`` used only by ``user`` (the
        ``weight * x * rsqrt(...)`` order of many RMSNorm implementations; gamma is then recorded)."""
        if name == centred:
            return True
        p = self.producer.get(name or "")
        if p is None or self.nodes[p].op_type != "Mul" or self._sole(name) != user:
            return False
        gamma = self._other(p, centred)
        if gamma is None or not self._static_float(gamma):
            return False
        group.add(p)
        self._pre_gamma[user] = gamma
        return True


    def _match_ln(self, k: int):
        nodes = self.nodes
        x = nodes[k].input[0]
        if self._is_static(x):
            return None
        mean = nodes[k].output[0]
        sub = self._sole(mean)
        if sub is None or nodes[sub].op_type != "Sub" or list(nodes[sub].input) != [x, mean]:
            return None
        d = nodes[sub].output[0]
        cons = self.consumers.get(d, [])
        if len(cons) != 2 or d in self.graph_outputs:
            return None
        sq = [c for c in cons if (nodes[c].op_type == "Pow" and nodes[c].input[0] == d and self._is_const_near(nodes[c].input[1], 2.0, 1e-6))
              or (nodes[c].op_type == "Mul" and list(nodes[c].input) == [d, d])]
        if len(sq) != 1:
            return None
        group = {k, sub}
        last = self._match_norm_core(d, sq[0], group)
        if last is None or set(cons) - group:
            return None
        out, gamma, beta = self._affine_tail(nodes[last].output[0], group)
        gamma = self._pre_gamma.pop(last, None) or gamma
        return group, k, ("layernorm", x, out, gamma, beta, False)


    def _match_rms(self, k: int):
        nodes = self.nodes
        n = nodes[k]
        x = n.input[0]
        if self._is_static(x):
            return None
        if n.op_type == "Pow" and not self._is_const_near(n.input[1], 2.0, 1e-6):
            return None
        if n.op_type == "Mul" and list(n.input) != [x, x]:
            return None
        group: set[int] = set()
        last = self._match_norm_core(x, k, group)
        if last is None:
            return None
        pre = self._pre_gamma.pop(last, None)
        out, gamma, beta = self._affine_tail(nodes[last].output[0], group) if pre is None else (nodes[last].output[0], pre, None)
        return group, min(group), ("layernorm", x, out, gamma, beta, True)


    def _match_gelu(self, k: int):
        """x/sqrt(2) (or x*0.7071) -> Erf -> +1 -> * x -> * 0.5 (any association of the two products)."""
        nodes = self.nodes
        n = nodes[k]
        if len(n.input) != 2:
            return None
        x, c = n.input
        if self._is_static(x) or not (
                (n.op_type == "Div" and self._is_const_near(c, math.sqrt(2.0), 0.01))
                or (n.op_type == "Mul" and self._is_const_near(c, math.sqrt(0.5), 0.01))):
            return None
        e = self._sole(n.output[0])
        if e is None or nodes[e].op_type != "Erf":
            return None
        a = self._sole(nodes[e].output[0])
        if a is None or nodes[a].op_type != "Add" or not self._is_const_near(self._other(a, nodes[e].output[0]) or "", 1.0, 1e-6):
            return None
        group = {k, e, a}
        out = self._gelu_tail(x, nodes[a].output[0], group)
        return None if out is None else (group, min(group), ("gelu", x, out))


    def _gelu_tail(self, x: str, a_out: str, group: set[int]) -> str | None:
        """``0.5 * x * a`` after the ``a = 1 + erf(.)`` / ``1 + tanh(.)`` of a GELU, in any association of the two
        products: the output name (its nodes added to ``group``), or None."""
        nodes = self.nodes
        m1 = self._sole(a_out)
        if m1 is None or nodes[m1].op_type != "Mul":
            return None
        other = self._other(m1, a_out)
        group.add(m1)
        if other == x:  # (x * a) * 0.5
            m2 = self._sole(nodes[m1].output[0])
            if m2 is None or nodes[m2].op_type != "Mul" or not self._is_const_near(self._other(m2, nodes[m1].output[0]) or "", 0.5, 1e-6):
                return None
            group.add(m2)
            return nodes[m2].output[0]
        if other is not None and self._is_const_near(other, 0.5, 1e-6):  # x * (a * 0.5)
            m2 = self._sole(nodes[m1].output[0])
            if m2 is None or nodes[m2].op_type != "Mul" or self._other(m2, nodes[m1].output[0]) != x:
                return None
            group.add(m2)
            return nodes[m2].output[0]
        if other is not None and other in self.producer:  # (x * 0.5) * a
            h = self.producer[other]
            if (nodes[h].op_type != "Mul" or self._sole(other) != m1 or self._other(h, x) is None
                    or not self._is_const_near(self._other(h, x), 0.5, 1e-6)):
                return None
            group.add(h)
            return nodes[m1].output[0]
        return None


    def _match_gelu_tanh(self, k: int):
        """The tanh approximation (``F.gelu(approximate="tanh")`` as the TorchScript exporter decomposes it, HF's
        ``NewGELUActivation``): ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``, anchored on the Tanh.
        ``x^3`` is ``Pow(x, 3)`` or ``x * (x * x)`` in either order; every constant may be either operand of its
        node; the tail is any association of the two products (as for the Erf form). Each intermediate value must
        have this pattern as its only consumer (``x`` may have others)."""
        nodes = self.nodes
        inner = nodes[k].input[0] if nodes[k].input else ""
        p = self.producer.get(inner)
        if p is None or self._sole(inner) != k or nodes[p].op_type != "Mul":
            return None
        scaled = [i for i in nodes[p].input if i and not self._is_const_near(i, math.sqrt(2.0 / math.pi), 0.01)]
        if len(scaled) != 1 or len(nodes[p].input) != 2:
            return None
        s = self.producer.get(scaled[0])
        if s is None or self._sole(scaled[0]) != p or nodes[s].op_type != "Add" or len(nodes[s].input) != 2:
            return None
        for x, cubic in (nodes[s].input, nodes[s].input[::-1]):
            group = self._gelu_cubic(x, cubic, s)
            if group is not None and not self._is_static(x):
                break
        else:
            return None
        a = self._sole(nodes[k].output[0])
        if a is None or nodes[a].op_type != "Add" or not self._is_const_near(self._other(a, nodes[k].output[0]) or "", 1.0, 1e-6):
            return None
        group |= {k, p, s, a}
        out = self._gelu_tail(x, nodes[a].output[0], group)
        return None if out is None else (group, min(group), ("gelu", x, out))


    def _gelu_cubic(self, x: str, cubic: str, user: int) -> set[int] | None:
        """The nodes of ``cubic = 0.044715 * x^3`` (used only by ``user``), or None."""
        nodes = self.nodes
        c = self.producer.get(cubic)
        if c is None or self._sole(cubic) != user or nodes[c].op_type != "Mul" or len(nodes[c].input) != 2:
            return None
        cube = [i for i in nodes[c].input if i and not self._is_const_near(i, 0.044715, 0.01)]
        if len(cube) != 1:
            return None
        q = self.producer.get(cube[0])
        if q is None or self._sole(cube[0]) != c:
            return None
        if nodes[q].op_type == "Pow":
            return {c, q} if list(nodes[q].input[:1]) == [x] and self._is_const_near(nodes[q].input[1], 3.0, 1e-6) else None
        if nodes[q].op_type != "Mul" or x not in nodes[q].input:
            return None
        sq = self._other(q, x)
        r = self.producer.get(sq or "")
        if r is None or self._sole(sq) != q or nodes[r].op_type != "Mul" or list(nodes[r].input) != [x, x]:
            return None
        return {c, q, r}


    def _match_attention(self, s: int) -> None:
        nodes = self.nodes
        chain = [s]
        masks = []
        v = nodes[s].input[0]
        qk = None
        for _ in range(8):
            p = self.producer.get(v)
            if p is None:
                return
            op = nodes[p].op_type
            if op == "MatMul":
                if all(not self._is_static(i) for i in nodes[p].input):
                    qk = p
                break
            if op not in ("Div", "Mul", "Add", "Where", "Cast", "Reshape", "Sub", "Identity"):
                return
            chain.append(p)
            if op in ("Add", "Where"):
                masks.append(p)
            acts = [i for i in nodes[p].input if i and not self._is_static(i)]
            if op == "Where":
                acts = [i for i in nodes[p].input[1:] if i and not self._is_static(i)]
            if len(acts) != 1:
                # a mask computed at run time: follow the branch that comes from a MatMul
                acts = [i for i in acts if self.producer.get(i) is not None and nodes[self.producer[i]].op_type != "Where"]
                acts = [i for i in acts if self._leads_to_matmul(i)]
                if len(acts) != 1:
                    return
            v = acts[0]
        if qk is None:
            return
        out = nodes[s].output[0]
        pv = None
        for _ in range(4):
            cons = self.consumers.get(out, [])
            if len(cons) != 1:
                return
            c = cons[0]
            op = nodes[c].op_type
            if op == "MatMul":
                if nodes[c].input[0] == out and not self._is_static(nodes[c].input[1]):
                    pv = c
                break
            if op not in ("Dropout", "Cast", "Reshape", "Identity", "Where"):
                return
            chain.append(c)
            out = nodes[c].output[0]
        if pv is None:
            return
        self.attn |= {qk, pv, *chain}
        self.mask_adds |= set(masks)
        # the mask operands: what the core's Add / Where nodes read besides the scores flowing from QK^T
        flow = {o for c in (qk, *chain) for o in nodes[c].output if o}
        operands = [i for c in chain if nodes[c].op_type in ("Add", "Where") for i in nodes[c].input if i and i not in flow]
        causal = self._mask_is_causal(operands)
        self.attn_pairs[qk] = self.attn_pairs[pv] = causal
        self.attn_pv.add(pv)


    def _leads_to_matmul(self, name: str, depth: int = 6) -> bool:
        for _ in range(depth):
            p = self.producer.get(name)
            if p is None:
                return False
            n = self.nodes[p]
            if n.op_type == "MatMul":
                return True
            acts = [i for i in n.input if i and not self._is_static(i)]
            if not acts:
                return False
            name = acts[0]
        return False


    #: ops a mask passes through on its way to the scores (slicing a stored mask, casting, broadcasting, inverting
    #: it, turning a bool mask into an additive one, combining it with another)
    _MASK_PASS = frozenset(("Slice", "Cast", "CastLike", "Unsqueeze", "Squeeze", "Expand", "Reshape", "Flatten", "Not",
                            "Sub", "Mul", "Add", "Neg", "Identity", "Equal", "Where", "And", "Or", "Xor", "Transpose",
                            "Tile", "Min", "Max", "Clip"))
    #: the comparisons that make a causal mask from two position indices (arange row vs column)
    _MASK_COMPARE = frozenset(("Less", "LessOrEqual", "Greater", "GreaterOrEqual"))


    def _mask_is_causal(self, names, limit: int = 64) -> bool:
        """Is the attention mask that ``names`` (the values a core's Add / Where nodes read besides the scores) apply
        causal, decided from its ancestry: it reaches a ``Trilu`` (diagonal -1, 0 or 1: ``tril(ones)`` or the
        ``triu(ones, 1)`` a ``masked_fill`` reads; another diagonal cuts a band, undecided), a constant whose last two
        dims hold a causal pattern (featurize/attention_mask.is_triangular_mask: a bool ``tril`` buffer, an exporter's
        folded ``bias[:, :, :T, :T] == 0``, an additive 0 / -inf table), or a ``Less`` / ``LessOrEqual`` / ``Greater``
        / ``GreaterOrEqual`` of two ``Range``-derived position indices with a (rows, cols) output (``kv_idx <=
        q_idx``, transformers' ``causal_mask_function`` as exported). Anything else -- no mask, a mask given as a
        graph input, an unknown op on the way -- is not causal (bidirectional), the count of a plain export."""
        from wattcast.featurize.attention_mask import is_triangular_mask

        seen: set[str] = set()
        todo = list(names)
        while todo and len(seen) < limit:
            nm = todo.pop()
            if nm in seen:
                continue
            seen.add(nm)
            c = self._const(nm)
            if nm in self.triangular or (c is not None and is_triangular_mask(c)):
                return True
            p = self.producer.get(nm)
            if p is None:
                continue
            n = self.nodes[p]
            if n.domain not in _DEFAULT_DOMAINS:
                continue
            if n.op_type == "Trilu":
                k = self._scalar(n.input[1]) if len(n.input) > 1 and n.input[1] else 0.0
                if k is not None and k in (-1.0, 0.0, 1.0):
                    return True
                continue
            if n.op_type in self._MASK_COMPARE:
                shape = self._shape(n.output[0])
                if (len(n.input) == 2 and shape is not None and len(shape) >= 2 and min(shape[-2:]) >= 2
                        and all(self._from_range(i) for i in n.input)):
                    return True
                continue
            if n.op_type in self._MASK_PASS:
                todo += [i for i in n.input if i]
        return False


    def _from_range(self, name: str, limit: int = 16) -> bool:
        """``name`` is computed from a ``Range`` (a position index, maybe offset, cast or reshaped)."""
        seen: set[str] = set()
        todo = [name]
        while todo and len(seen) < limit:
            nm = todo.pop()
            if nm in seen:
                continue
            seen.add(nm)
            p = self.producer.get(nm)
            if p is None:
                continue
            n = self.nodes[p]
            if n.op_type == "Range":
                return True
            if n.op_type in ("Unsqueeze", "Squeeze", "Reshape", "Expand", "Cast", "Add", "Sub", "Slice", "Identity",
                             "Gather", "Tile", "Transpose", "Flatten"):
                todo += [i for i in n.input[:1 if n.op_type not in ("Add", "Sub") else 2] if i]
        return False
