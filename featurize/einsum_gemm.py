"""A two-operand einsum as the GEMM it is, shared by the torch.export and the ONNX importers so that both cost the
same contraction the same way (README: "An ONNX export costs what the same module costs through torch.export")."""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence


class EinsumGemm(NamedTuple):
    """The index groups of a two-operand einsum multiplied out: batch (in both inputs and the output), m (first
    input and output), n (contracted), k (second input and output)."""

    batch: int
    m: int
    n: int
    k: int
    batched: bool  # some index is a batch index (in both inputs and the output)


def einsum_gemm(equation: str, shape_a: Sequence[int], shape_b: Sequence[int]) -> EinsumGemm | None:
    """``equation`` (explicit ``->`` form, two operands of shapes ``shape_a`` and ``shape_b``) as a (batched) GEMM,
    or None when it is not one: ellipses, implicit output, repeated indices (diagonals, traces), an index summed
    within one operand, an output index in neither input, or operand ranks that differ from the subscripts."""
    eq = str(equation).replace(" ", "")
    if "..." in eq or "->" not in eq:
        return None
    lhs, out_idx = eq.split("->")
    parts = lhs.split(",")
    if len(parts) != 2:
        return None
    ia, ib = parts
    sa, sb = [int(d) for d in shape_a], [int(d) for d in shape_b]
    if len(ia) != len(sa) or len(ib) != len(sb) or len(set(ia)) != len(ia) or len(set(ib)) != len(ib):
        return None
    if len(set(out_idx)) != len(out_idx) or any(i not in ia and i not in ib for i in out_idx):
        return None
    if any(i not in ib and i not in out_idx for i in ia) or any(i not in ia and i not in out_idx for i in ib):
        return None  # an index summed within one operand
    size = {**dict(zip(ia, sa)), **dict(zip(ib, sb))}
    prod = lambda idx: math.prod(size[i] for i in idx)  # noqa: E731
    batch = [i for i in ia if i in ib and i in out_idx]
    m_idx = [i for i in ia if i not in ib]
    n_idx = [i for i in ia if i in ib and i not in out_idx]
    k_idx = [i for i in ib if i not in ia]
    return EinsumGemm(prod(batch), prod(m_idx), prod(n_idx), prod(k_idx), bool(batch))
