"""Is a constant attention mask causal? The importers (featurize/onnx/patterns.py, featurize/torch_import) decide
whether a matmul-written attention core is causal from its mask's ancestry; a mask that is a stored constant (a
registered ``torch.tril`` buffer, an exporter's folded ``bias[:, :, :T, :T] == 0``, an additive 0 / -inf table) is
read here. Causal attention's model FLOPs count half the S x S pairs (featurize/op_graph.attention_pair_share)."""

from __future__ import annotations

import numpy as np

#: the largest constant (elements) read for its pattern: a (1, 1, 8192, 8192) mask; a larger one stays undecided
#: (not causal), as the importers' other limits leave what they cannot see
MAX_MASK_ELEMENTS = 1 << 26


def is_triangular_mask(values) -> bool:
    """True when every (rows, cols) slice of ``values`` (its last two dims, both at least 2) holds one value on and
    below the diagonal and another strictly above it: a causal mask in any of its encodings (a bool or 0/1
    ``tril``, an additive 0 / -inf mask, an inverted ``triu(.., 1)`` mask for ``masked_fill``). The diagonal is the
    main one, or for a non-square slice also the bottom-right aligned one (queries at the end of a longer key
    sequence: query i sees keys up to i + cols - rows). Anything else (a band / sliding-window mask, padding, NaNs,
    too large to read) is False."""
    a = np.asarray(values)
    if a.ndim < 2 or a.size > MAX_MASK_ELEMENTS:
        return False
    r, c = int(a.shape[-2]), int(a.shape[-1])
    if min(r, c) < 2:
        return False
    x = a.reshape(-1, r, c)
    i = np.arange(r)[:, None]
    j = np.arange(c)[None, :]
    for off in sorted({0, c - r}):
        lower = j <= i + off
        if lower.all() or not lower.any():
            continue
        on, above = x[:, lower], x[:, ~lower]
        a0, b0 = on.flat[0], above.flat[0]
        if a0 != b0 and bool(np.all(on == a0)) and bool(np.all(above == b0)):
            return True
    return False
