"""A LightGBM regression forest as flat arrays, evaluated by a numba-compiled loop (bit-identical to ``Booster.predict``).

:class:`CompiledForest` reads the booster's own text model (the same 17-digit numbers LightGBM parses, so the same
doubles) and walks every tree for each row, adding the trees' leaf values in tree order from 0.0 exactly as LightGBM's
``GBDT::PredictRaw`` does, with LightGBM's handling of missing values (``Tree::NumericalDecision``) and of values
within 1e-35 of zero (its dense-row reader drops them: the trees see 0.0). What makes it faster than
``Booster.predict`` (about 0.3x its CPU time on the shipped bundle and the benchmark's distinct kernels):

- rows are sorted by one feature and cut into chunks of similar rows; each chunk walks a copy of the forest
  specialised to its features' ranges: a split all its rows take the same way is decided once, so on one device
  (whose descriptors are constants) the trees the chunk walks are about half as deep;
- a block of rows goes through one tree together (the tree stays in L1 cache and the rows' walks overlap instead of
  waiting on each branch), each node one 16-byte record (threshold; feature and both children packed in an int64);
- chunks alternate over two threads (the loop releases the GIL).

Rows with a NaN, and forests with zero-as-missing splits, take the plain per-row walk. None of this changes a row's
sum (tests/test_lgbm_forest.py checks equality with LightGBM on every shipped family). Only what that covers compiles:
numerical splits, one tree per iteration, no linear trees, an objective whose output is the raw score
(``regression``/L2 and the like); for anything else :func:`compile_forest` returns None and the caller keeps
``Booster.predict``, as it does without numba. ``WATTCAST_NO_NUMBA`` (any value) turns the compiled path off, as for
the pipeline scheduler.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

#: LightGBM's kZeroThreshold: |x| <= this is zero (dense rows drop such values; MissingType::Zero tests it)
_ZERO = 1e-35
#: decision_type bits (LightGBM tree.h): categorical split, default-left, missing type in bits 2-3 (0 none, 1 zero, 2 NaN)
_CATEGORICAL_MASK = 1
_DEFAULT_LEFT_MASK = 2
#: objectives whose prediction is the raw score (ConvertOutput is the identity)
_RAW_OBJECTIVES = frozenset(("regression", "regression_l2", "l2", "mean_squared_error", "mse", "l2_root",
                             "root_mean_squared_error", "rmse", "regression_l1", "l1", "mean_absolute_error", "mae",
                             "huber", "fair", "quantile"))
#: packed node record: feature in bits 0-8, left child in bits 9-35, right child in bits 36-62 (leaves are nodes too)
_FEAT_BITS, _CHILD_BITS = 9, 27
#: rows a block walks through one tree together
_BLOCK_ROWS = 32
#: rows per chunk of similar rows (sorted by one feature) that gets its own specialised forest
_CHUNK_ROWS = 4096


def _walk_rows_py(A, feat, thr, miss, dleft, left, right, leaf, roots, out):  # pragma: no cover - compiled below
    """The reference walk, row by row: out[i] = the sum over trees (in order, from 0.0) of the leaf row ``A[i]``
    reaches. ``roots[t]`` is tree t's first node or ~leaf (a one-leaf tree); children >= 0 are nodes, < 0 ~leaf."""
    n = A.shape[0]
    for i in range(n):
        s = 0.0
        for t in range(roots.shape[0]):
            node = roots[t]
            while node >= 0:
                x = A[i, feat[node]]
                if x != x:  # NaN: the default side when the split learned one for NaN, else LightGBM reads 0.0
                    if miss[node] == 2:
                        node = left[node] if dleft[node] else right[node]
                        continue
                    x = 0.0
                if miss[node] == 1 and -_ZERO <= x <= _ZERO:  # zero as missing: the default side
                    node = left[node] if dleft[node] else right[node]
                    continue
                node = left[node] if x <= thr[node] else right[node]
            s += leaf[~node]
        out[i] = s


def _walk_blocks_py(A, nodes, roots, depth, n_inner, out):  # pragma: no cover - compiled below
    """The same sums for rows without NaN (and with no value within 1e-35 of zero but 0.0 itself) on a forest without
    zero-as-missing splits, a block of rows per tree: ``nodes`` holds per node (threshold or, for a leaf, its value;
    the packed int64 record of feature, left, right); leaves (index >= ``n_inner``) point to themselves, so a block
    steps ``depth[t]`` times through tree t, stopping early once every row of the block is at a leaf."""
    meta = nodes.view(np.int64)
    n = A.shape[0]
    fmask = (1 << _FEAT_BITS) - 1
    cmask = (1 << _CHILD_BITS) - 1
    cur = np.empty(_BLOCK_ROWS, np.int64)
    acc = np.empty(_BLOCK_ROWS)
    for i0 in range(0, n, _BLOCK_ROWS):
        m = min(_BLOCK_ROWS, n - i0)
        for r in range(m):
            acc[r] = 0.0
        for t in range(roots.shape[0]):
            r0 = roots[t]
            for r in range(m):
                cur[r] = r0
            for _ in range(depth[t]):
                inner = 0
                for r in range(m):
                    nd = cur[r]
                    mt = meta[2 * nd + 1]
                    if A[i0 + r, mt & fmask] <= nodes[2 * nd]:
                        c = (mt >> _FEAT_BITS) & cmask
                    else:
                        c = mt >> (_FEAT_BITS + _CHILD_BITS)
                    cur[r] = c
                    inner += c < n_inner
                if inner == 0:
                    break
            for r in range(m):
                acc[r] += nodes[2 * cur[r]]
        for r in range(m):
            out[i0 + r] = acc[r]


try:
    if os.environ.get("WATTCAST_NO_NUMBA"):
        raise ImportError("WATTCAST_NO_NUMBA is set")
    from numba import njit as _njit

    _walk_rows = _njit(cache=True, nogil=True)(_walk_rows_py)
    _walk_blocks = _njit(cache=True, nogil=True)(_walk_blocks_py)
except Exception:  # pragma: no cover - depends on the environment
    _walk_rows = _walk_blocks = None


@dataclass
class CompiledForest:
    """One LightGBM regression forest as flat node arrays (see the module docstring); ``predict(A)`` equals
    ``booster.predict(A)`` bit for bit on an (n, n_features) float64 array."""

    n_features: int
    # per inner node (LightGBM's own layout, global indices): feature, threshold (left when x <= it), missing type,
    # missing goes left, children (node >= 0 or ~leaf); per leaf its value; per tree its first node (or ~leaf)
    feat: np.ndarray
    thr: np.ndarray
    miss: np.ndarray
    dleft: np.ndarray
    left: np.ndarray
    right: np.ndarray
    leaf: np.ndarray
    roots: np.ndarray
    # the block walk's layout: inner nodes then leaves as nodes (see _walk_blocks_py); None if it does not apply
    nodes: np.ndarray | None
    block_roots: np.ndarray | None
    depth: np.ndarray | None
    #: the feature rows are sorted by before they are chunked: the one the most splits test
    sort_feature: int = 0

    def _layout_for(self, A: np.ndarray):
        """The block walk's (nodes, roots, depth) for the rows ``A`` (none with NaN), specialised to the range of each
        feature over them: a split every row takes the same way (threshold at or above the feature's largest value,
        or below its smallest) is decided once instead of per row."""
        if len(A) < 2:
            return self.nodes, self.block_roots, self.depth
        return _specialise(self, np.min(A, axis=0), np.max(A, axis=0))

    def _walk_chunks(self, S: np.ndarray, out: np.ndarray, chunks) -> None:
        for s, e in chunks:
            _walk_blocks(S[s:e], *self._layout_for(S[s:e]), len(self.feat), out[s:e])

    def predict(self, A: np.ndarray, order_by: int | None = None) -> np.ndarray:
        """The forest's sum per row of the (n, n_features) array ``A``. Rows without NaN are sorted by feature
        ``order_by`` (default: the feature most splits test) and walked in chunks of similar rows, each chunk
        through the forest specialised to its features' ranges (see :meth:`_layout_for`), on two threads when there
        are several chunks; rows with NaN take the per-row walk. Neither changes a row's sum."""
        A = np.asarray(A, dtype=np.float64)
        if A.ndim != 2 or A.shape[1] != self.n_features:
            raise ValueError(f"compiled forest needs an (n, {self.n_features}) array, got shape {A.shape}")
        tiny = (np.abs(A) <= _ZERO) & (A != 0.0)
        if tiny.any():  # LightGBM's dense-row reader reads these as 0.0
            A = np.where(tiny, 0.0, A)
        A = np.ascontiguousarray(A)
        n = len(A)
        out = np.empty(n)
        nan_rows = np.isnan(A).any(axis=1) if self.nodes is not None else np.ones(n, dtype=bool)
        if nan_rows.any():
            bad = np.flatnonzero(nan_rows)
            part = np.empty(len(bad))
            _walk_rows(np.ascontiguousarray(A[bad]), self.feat, self.thr, self.miss, self.dleft, self.left,
                       self.right, self.leaf, self.roots, part)
            out[bad] = part
            if len(bad) == n:
                return out
            ok = np.flatnonzero(~nan_rows)
            A = A[ok]
        else:
            ok = None
        key = self.sort_feature if order_by is None else int(order_by)
        order = np.argsort(A[:, key], kind="stable") if len(A) > _CHUNK_ROWS else None
        S = A if order is None else A[order]
        res = np.empty(len(S))
        chunks = [(s, min(s + _CHUNK_ROWS, len(S))) for s in range(0, len(S), _CHUNK_ROWS)]
        if len(chunks) > 1 and (os.cpu_count() or 1) >= 2:
            # every other chunk on a second thread (the walk releases the GIL): rows are independent
            with ThreadPoolExecutor(max_workers=1) as ex:
                fut = ex.submit(self._walk_chunks, S, res, chunks[1::2])
                self._walk_chunks(S, res, chunks[0::2])
                fut.result()
        else:
            self._walk_chunks(S, res, chunks)
        if order is not None:
            res[order] = res.copy()
        if ok is None:
            return res
        out[ok] = res
        return out


def _unpack(nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(feature, left, right, threshold-or-leaf-value) of every record of a block layout."""
    meta = nodes.view(np.int64)[1::2]
    cmask = (1 << _CHILD_BITS) - 1
    return meta & ((1 << _FEAT_BITS) - 1), (meta >> _FEAT_BITS) & cmask, meta >> (_FEAT_BITS + _CHILD_BITS), nodes[0::2]


def _pack(fe: np.ndarray, lc: np.ndarray, rc: np.ndarray, thr: np.ndarray) -> np.ndarray:
    nodes = np.empty(2 * len(thr))
    nodes[0::2] = thr
    nodes.view(np.int64)[1::2] = fe | (lc << _FEAT_BITS) | (rc << (_FEAT_BITS + _CHILD_BITS))
    return nodes


def _tree_depths(lc: np.ndarray, rc: np.ndarray, roots: np.ndarray, n_inner: int) -> np.ndarray:
    """Per tree, the steps from its root until every path is at a leaf (all trees level by level at once)."""
    depth = np.zeros(len(roots), dtype=np.int64)
    front, tree, d = roots, np.arange(len(roots)), 0
    while True:
        inner = front < n_inner
        front, tree = front[inner], tree[inner]
        if not len(front):
            return depth
        d += 1
        depth[tree] = d
        front, tree = np.concatenate([lc[front], rc[front]]), np.concatenate([tree, tree])


def _specialise(f: CompiledForest, lo: np.ndarray, hi: np.ndarray):
    """The block layout with every split decided that all rows whose features lie in [``lo``, ``hi``] take the same
    way: left when the feature's ``hi <= threshold``, right when its ``lo > threshold`` (LightGBM's test for a value
    that is not missing: the block walk only sees rows without NaN, and forests with zero-as-missing splits have no
    block layout). Links to a decided node go to the child its rows take, transitively."""
    n_inner = len(f.feat)
    fe, lc, rc, thr = _unpack(f.nodes)
    total = len(thr)
    with np.errstate(invalid="ignore"):
        left, right = hi[fe] <= thr, lo[fe] > thr  # NaN bounds decide nothing
    left[n_inner:] = right[n_inner:] = False  # leaves stay
    to = np.where(left, lc, np.where(right, rc, np.arange(total)))
    while True:  # follow decided nodes to the first undecided node or leaf (pointer jumping)
        nxt = to[to]
        if np.array_equal(nxt, to):
            break
        to = nxt
    lc2, rc2, roots = to[lc], to[rc], to[f.block_roots]
    return _pack(fe, lc2, rc2, thr), roots, _tree_depths(lc2, rc2, roots, n_inner)


def _floats(s: str) -> np.ndarray:
    return np.array(s.split(), dtype=np.float64)


def _ints(s: str) -> np.ndarray:
    return np.array(s.split(), dtype=np.int64)


def compile_forest(booster, model_text: str | None = None) -> CompiledForest | None:
    """``booster`` (a ``lightgbm.Booster``) as a :class:`CompiledForest`, or None when numba is unavailable or the
    model uses something the compiled loop does not reproduce (categorical splits, linear trees, several trees per
    iteration, an objective that transforms the score, a best iteration short of the last tree). ``model_text``: the
    booster's text model when the caller has it (the file it was loaded from), else ``booster.model_to_string()``."""
    if _walk_rows is None:
        return None
    text = model_text if model_text is not None else booster.model_to_string(num_iteration=-1)
    head, _, rest = text.partition("\nTree=")
    head_lines = head.splitlines()
    hdr = dict(line.split("=", 1) for line in head_lines if "=" in line)
    objective = hdr.get("objective", "").split()
    if not objective or objective[0] not in _RAW_OBJECTIVES or "sqrt" in objective[1:]:
        return None
    if int(hdr.get("num_tree_per_iteration", "1")) != 1 or "average_output" in head_lines:
        return None
    n_features = int(hdr["max_feature_idx"]) + 1
    blocks = ("Tree=" + rest).split("end of trees", 1)[0].split("\nTree=")
    best = getattr(booster, "best_iteration", 0) or 0
    if best > 0 and best != len(blocks) or booster.num_trees() != len(blocks):
        return None
    feat, thr, miss, dleft, left, right, leaf, roots = [], [], [], [], [], [], [], []
    n_nodes = n_leaves = 0
    for block in blocks:
        kv = dict(line.split("=", 1) for line in block.strip().splitlines()[1:] if "=" in line)
        if kv.get("is_linear", "0") != "0" or kv.get("num_cat", "0") != "0":
            return None
        nl = int(kv["num_leaves"])
        if nl == 1:
            roots.append(~n_leaves)
        else:
            dt = _ints(kv["decision_type"])
            if (dt & _CATEGORICAL_MASK).any():
                return None
            l_, r_ = _ints(kv["left_child"]), _ints(kv["right_child"])
            # to global indices: nodes shift by the nodes before this tree, leaves (~leaf) by the leaves before it
            left.append(np.where(l_ >= 0, l_ + n_nodes, ~(~l_ + n_leaves)))
            right.append(np.where(r_ >= 0, r_ + n_nodes, ~(~r_ + n_leaves)))
            feat.append(_ints(kv["split_feature"]))
            thr.append(_floats(kv["threshold"]))
            miss.append(((dt >> 2) & 3).astype(np.int8))
            dleft.append((dt & _DEFAULT_LEFT_MASK) > 0)
            roots.append(n_nodes)
            n_nodes += nl - 1
        leaf.append(_floats(kv["leaf_value"])[:nl])
        n_leaves += nl

    def cat(xs, dt):
        return np.ascontiguousarray(np.concatenate(xs) if xs else np.zeros(0, dtype=dt), dtype=dt)

    f = CompiledForest(n_features=n_features, feat=cat(feat, np.int64), thr=cat(thr, np.float64),
                       miss=cat(miss, np.int8), dleft=cat(dleft, np.bool_), left=cat(left, np.int64),
                       right=cat(right, np.int64), leaf=cat(leaf, np.float64), roots=np.array(roots, dtype=np.int64),
                       nodes=None, block_roots=None, depth=None)
    if len(f.leaf) != n_leaves or (f.feat.size and (f.feat.min() < 0 or f.feat.max() >= n_features)):
        return None
    _add_block_layout(f)
    return f


def _add_block_layout(f: CompiledForest) -> None:
    """The block walk's node records and per-tree depths (left out when the forest has zero-as-missing splits or
    does not fit the packed record)."""
    n_inner, n_leaf = len(f.feat), len(f.leaf)
    total = n_inner + n_leaf
    if (f.miss == 1).any() or f.n_features > (1 << _FEAT_BITS) or total > (1 << _CHILD_BITS):
        return
    to_node = lambda c: np.where(c >= 0, c, n_inner + ~c)  # noqa: E731 - ~leaf -> the leaf's node index
    lc = np.concatenate([to_node(f.left), np.arange(n_inner, total)])
    rc = np.concatenate([to_node(f.right), np.arange(n_inner, total)])
    fe = np.concatenate([f.feat, np.zeros(n_leaf, dtype=np.int64)])
    roots = to_node(f.roots).astype(np.int64)
    f.nodes = _pack(fe, lc, rc, np.concatenate([f.thr, f.leaf]))
    f.block_roots, f.depth = roots, _tree_depths(lc, rc, roots, n_inner)
    f.sort_feature = int(np.argmax(np.bincount(f.feat, minlength=f.n_features))) if n_inner else 0
