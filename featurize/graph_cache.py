"""Caches of operator graphs bounded by what they hold (kernel rows), not by how many entries they have.

A step graph's size spans four orders of magnitude: a 3-block Llama rank graph has a few hundred rows, a whole
gpt-oss-120b graph with its 128 experts per layer more than 150,000 (some 100 MB, and 50 MB more once costed). A
cache bounded by its number of entries holds either too few small graphs or too many big ones (a strategy search of
gpt-oss-120b on 16 GPUs kept every rank graph it built: 6.9 GB after 800 of its 3,080 candidates, past 15 GB in the
end). :class:`RowsCache` evicts by the rows its values hold.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

#: kernel rows a graph cache holds at most (measured: ~0.65 KB a row for a graph, its nodes and the builder's per-node
#: lists; ~0.33 KB for a costed frame): whole graphs of the largest built-in models fit several times over, the 3-block
#: rank graphs of a dense model's whole strategy search (a few hundred rows each) a thousand times over
GRAPH_CACHE_ROWS = 1_000_000
_MISSING = object()


def graph_rows(value) -> int:
    """Kernel rows of an operator graph, a frame, or a tuple holding them (the largest: a tuple's members are views
    of one graph), 0 for anything else."""
    if isinstance(value, tuple):
        return max((graph_rows(v) for v in value), default=0)
    nodes = getattr(value, "nodes", value)
    return len(nodes) if hasattr(nodes, "columns") else 0


class RowsCache:
    """A least-recently-used mapping whose entries each weigh some rows (by default :func:`graph_rows` of the value):
    the oldest entries go once the total is above ``max_rows`` (None: :data:`GRAPH_CACHE_ROWS`) or the entries are more
    than ``max_entries`` (the newest entry always stays, however big). ``get`` marks an entry as used."""

    def __init__(self, max_rows: int | None = None, max_entries: int | None = None):
        self.max_rows = int(GRAPH_CACHE_ROWS if max_rows is None else max_rows)
        self.max_entries = max_entries
        self._data: OrderedDict = OrderedDict()  # key -> (value, rows)
        self.rows = 0
        self.hits = self.misses = self.evictions = 0
        self._lock = threading.RLock()  # a library user may predict from several threads

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key) -> bool:
        return key in self._data

    def get(self, key, default=None):
        with self._lock:  # a thread evicting between the lookup and move_to_end raised KeyError
            hit = self._data.get(key)
            if hit is None:
                self.misses += 1
                return default
            self.hits += 1
            self._data.move_to_end(key)
            return hit[0]

    def __setitem__(self, key, value) -> None:
        self.put(key, value)

    def put(self, key, value, rows: int | None = None):
        """Store ``value`` under ``key`` (``rows``: its weight; None: :func:`graph_rows`) and evict the oldest
        entries over the bounds. Returns ``value``."""
        rows = graph_rows(value) if rows is None else int(rows)
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self.rows -= old[1]
            self._data[key] = (value, rows)
            self.rows += rows
            while len(self._data) > 1 and (self.rows > self.max_rows
                                           or (self.max_entries is not None and len(self._data) > self.max_entries)):
                _, (_, r) = self._data.popitem(last=False)
                self.rows -= r
                self.evictions += 1
        return value

    def get_or_build(self, key, build):
        """The value under ``key``, built by ``build()`` and stored when missing (an error is not stored)."""
        hit = self.get(key, _MISSING)
        return self.put(key, build()) if hit is _MISSING else hit

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.rows = 0



def rows_cached(max_rows: int | None = None, max_entries: int | None = None):
    """``functools.lru_cache`` for functions returning operator graphs, bounded by :class:`RowsCache`'s rows (and
    ``max_entries``): positional, hashable arguments; ``cache_clear()`` and ``cache_info()`` as lru_cache's."""
    from functools import wraps

    def deco(fn):
        cache = RowsCache(max_rows, max_entries)

        @wraps(fn)
        def wrapper(*args):
            return cache.get_or_build(args, lambda: fn(*args))

        def cache_info() -> dict:
            return dict(hits=cache.hits, misses=cache.misses, currsize=len(cache), rows=cache.rows,
                        max_rows=cache.max_rows, maxsize=cache.max_entries, evictions=cache.evictions)

        wrapper.cache_clear, wrapper.cache_info, wrapper.cache = cache.clear, cache_info, cache
        return wrapper

    return deco


#: per-column values and masks derived from a frame's immutable string columns (:func:`column_derived`), by column
#: identity: a costed frame shares its graph's string columns (pyarrow arrays are immutable; a copy, a column added
#: or a row order kept share them), so a mask of kernel names is made once per graph, not on every predict
_COLUMNS = RowsCache(max_rows=256 * 2**20, max_entries=512)  # weighed in bytes here (:func:`_nbytes`): 256 MiB


def _arrow_column(series):
    """The immutable pyarrow array behind a pandas column (its ``str`` dtype's storage), else None."""
    arr = series.array
    return arr.__arrow_array__() if hasattr(arr, "_pa_array") else None


def _freeze(value):
    if isinstance(value, tuple):
        for v in value:
            _freeze(v)
    elif hasattr(value, "flags"):
        value.flags.writeable = False
    return value


def columns_derived(frame, cols: tuple[str, ...], what, fn):
    """``fn(*(frame[c].to_numpy() for c in cols))``, made once per set of immutable (pyarrow-backed) columns and
    ``what`` (a hashable label naming ``fn``: two functions never share one), else made every call. Array results are
    read-only (a caller writing to a shared mask would change every later frame's). The entry holds the columns, so
    their ids are not reused while cached; a column replaced or changed is another pyarrow array, another entry."""
    series = [frame[c] for c in cols]
    return _derived(series, what, lambda: fn(*(s.to_numpy() for s in series)))


def _derived(series, what, make):
    """``make()``, cached as :func:`columns_derived` caches (by the identity of the columns ``series`` and ``what``)."""
    pa_cols = tuple(_arrow_column(s) for s in series)
    if any(p is None for p in pa_cols):
        return make()
    key = (tuple(map(id, pa_cols)), what)
    hit = _COLUMNS.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], pa_cols)):
        return hit[1]
    value = _freeze(make())
    # weighed by what it holds (a mask is a byte a row): by the frame's rows, a predict's ~17 entries of one graph
    # over ~59k rows evicted each other on every call
    _COLUMNS.put(key, (pa_cols, value), rows=max(_nbytes(value), 1))
    return value


def _nbytes(value) -> int:
    """Bytes of the numpy arrays in ``value`` (nested tuples; a pandas Index's values), 8 a row for anything else."""
    if isinstance(value, tuple):
        return sum(_nbytes(v) for v in value)
    n = getattr(value, "nbytes", None)
    if n is not None:
        return int(n)
    return 8 * len(value) if hasattr(value, "__len__") else 8


def column_derived(frame, col: str, what, fn):
    """``fn(frame[col].to_numpy())``, made once per immutable string column (:func:`columns_derived`)."""
    return columns_derived(frame, (col,), what, fn)


def _identity(values):
    return values


def column_values(frame, col: str):
    """``frame[col].to_numpy()`` (read-only), made once per immutable string column (:func:`column_derived`)."""
    return column_derived(frame, col, "values", _identity)


def column_is(frame, col: str, value: str):
    """``frame[col].astype(str) == value`` as a numpy mask (read-only; a missing value is no value), made once per
    immutable string column."""
    def mask():
        import numpy as np
        import pandas as pd

        # a handful of distinct values over thousands of rows: each compared once, then a gather (the column's
        # factorisation made once for all the values asked of it)
        codes, uniq = _derived(series, "factorize_keep_na", lambda: pd.factorize(series[0].to_numpy(),
                                                                                   use_na_sentinel=False))
        return np.array([(u if isinstance(u, str) else "" if pd.isna(u) else str(u)) == value for u in uniq],
                        dtype=bool)[codes]

    series = [frame[col]]
    return _derived(series, ("is", value), mask)


def column_codes(frame, col: str, sort: bool = False):
    """``pd.factorize(frame[col].to_numpy(), sort=sort)`` (read-only), made once per immutable string column."""
    import pandas as pd

    return column_derived(frame, col, ("factorize", sort), lambda v: pd.factorize(v, sort=sort))


class GraphMemo:
    """Values derived from an operator graph, by the graph's identity, for as long as the graph lives: an entry holds
    the graph by a weak reference (it goes when the graph does, so an id is never reused while cached) and its
    ``pins`` (the graph's parts the value was made from, e.g. its nodes frame) strongly: a graph given another part is
    another entry. A graph is not changed in place once built (the step-graph caches here hold them so too). At most
    ``max_entries`` entries, least recently used out."""

    def __init__(self, max_entries: int = 64):
        self.max_entries = int(max_entries)
        self._data: OrderedDict = OrderedDict()  # id(graph) -> (weakref, pins, value)
        self.hits = self.misses = 0
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._data)

    def get_or_build(self, graph, pins: tuple, build):
        """The value for ``graph`` made from ``pins``, built by ``build()`` (and stored) when missing."""
        import weakref

        key = id(graph)
        with self._lock:
            hit = self._data.get(key)
            if hit is not None and hit[0]() is graph and len(hit[1]) == len(pins) and all(a is b for a, b in zip(hit[1], pins)):
                self.hits += 1
                self._data.move_to_end(key)
                return hit[2]
            self.misses += 1
        value = build()
        data, lock = self._data, self._lock

        def gone(ref, key=key, data=data, lock=lock):  # the graph is collected: its entry goes (unless another took its id)
            with lock:
                entry = data.get(key)
                if entry is not None and entry[0] is ref:
                    del data[key]

        with lock:
            data[key] = (weakref.ref(graph, gone), tuple(pins), value)
            data.move_to_end(key)
            while len(data) > self.max_entries:
                data.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
