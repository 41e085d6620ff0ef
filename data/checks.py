"""Type checks shared by every layer's input validation, so "a count" means one thing everywhere, the
plausibility ranges (figures 1,000x off) with their ``--force`` switch (:func:`allow_exotic`), and the name
suggestions of "unknown name" messages (:func:`close_names`, :func:`did_you_mean`), and YAML / JSON readers that
refuse a key given twice (:func:`yaml_load_unique`, :func:`json_loads_unique`)."""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import json
import math
import numbers
import re
from typing import Iterable, Mapping

import yaml


def is_int(v) -> bool:
    """A Python or numpy integer, not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_count(v, *, whole_floats: bool = False) -> bool:
    """A positive whole number: an integer (not a bool) >= 1; with ``whole_floats`` also a finite float with no
    fraction (4.0)."""
    if is_int(v):
        return v >= 1
    if whole_floats and isinstance(v, numbers.Real) and not isinstance(v, bool):
        return math.isfinite(v) and float(v).is_integer() and v >= 1
    return False


def real_in(v, lo: float, hi: float, *, lo_open: bool = False) -> float | None:
    """``v`` as a float when it is a finite number (anything ``float()`` takes, not a bool) in [``lo``, ``hi``]
    (``lo_open``: above ``lo``); None otherwise, for the caller to raise its own message."""
    if isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(f) or f > hi or f < lo or (lo_open and f == lo):
        return None
    return f


def nonneg_finite(v, what: str, unit: str = "ms") -> float:
    """``v`` as a float when it is finite and >= 0 (:func:`real_in` over [0, inf]); ValueError otherwise, saying
    "``what`` must be a finite number of ``unit`` >= 0, got ``v``" (host costs and load times in ms)."""
    f = real_in(v, 0.0, math.inf)
    if f is None:
        raise ValueError(f"{what} must be a finite number of {unit} >= 0, got {v!r}")
    return f


# ------------------------------------------------------------------ plausibility (units off by 1,000x)
_EXOTIC = contextvars.ContextVar("wattcast_allow_exotic", default=False)


@contextlib.contextmanager
def allow_exotic(on: bool = True):
    """Within this block, plausibility ranges (figures that look 1,000x off: a TDP in kW, memory in bytes, a share
    given as a percent) are not enforced; hard rules (positive, finite, consistent) still are. The CLI's ``--force``
    runs its command inside this block; in Python: ``with wattcast.allow_exotic(): ...``."""
    token = _EXOTIC.set(bool(on))
    try:
        yield
    finally:
        _EXOTIC.reset(token)


def exotic_allowed() -> bool:
    """True inside :func:`allow_exotic` (``--force``)."""
    return _EXOTIC.get()


def implausible(name: str, v: float, lo: float, hi: float, low_hint: str, high_hint: str, unit: str, *,
                zero_ok: bool = False) -> str | None:
    """A message when ``v`` lies outside [``lo``, ``hi``], naming ``name``, the likely unit mix-up and ``--force``;
    None when it is inside, or when :func:`allow_exotic` is on. ``low_hint`` / ``high_hint`` say what a too-small /
    too-large figure probably is ("kW", "a percent"). ``zero_ok``: exactly 0 passes too (a range above 0 whose
    figure may be none at all, e.g. free electricity)."""
    if exotic_allowed() or lo <= v <= hi or (zero_ok and v == 0):
        return None
    side, bound, hint = ("over", hi, high_hint) if v > hi else ("under", lo, low_hint)
    return (f"{name} is {v:g}, {side} {bound:g}: it looks like {hint}; give it in {unit} (plausible: "
            f"{'0, or ' if zero_ok else ''}{lo:g} to {hi:g}; or pass --force, in Python wattcast.allow_exotic(), for a "
            "deliberately exotic value)")


#: the ways a message offers ``--force`` / ``allow_exotic`` for an implausible figure (:func:`implausible`,
#: ``device_spec._FORCE``, the cluster and run checks): ", or pass --force (in Python wattcast.allow_exotic()) for
#: a deliberately exotic value", "; or pass --force, in Python ..., for a deliberately exotic run", ...
_FORCE_HINT = re.compile(r"(?P<lead>[;,.]?)\s*\b[Oo]r pass --force,?\s*\(?in Python wattcast\.allow_exotic\(\)\)?,?\s*"
                         r"for (?:a deliberately exotic (?:value|run)|a system that is really built so)")


def without_force_hint(message: str) -> str:
    """``message`` without its offer of ``--force`` (in Python ``wattcast.allow_exotic()``): for a command that has no
    such switch, such as ``wattcast sweep`` (a spec's figure is checked as ``search`` checks it, but the sweep's
    tasks run in other processes, where an ``allow_exotic`` block of the caller's does not reach)."""
    return _FORCE_HINT.sub(lambda m: "." if m.group("lead") == "." else "", str(message))


# ------------------------------------------------------------------ name suggestions
def close_names(name: str, candidates: Iterable[str], *, n: int = 3, cutoff: float = 0.6, substring_bonus: float = 0.0,
                report: Mapping[str, str] | None = None) -> list[str]:
    """Up to ``n`` of ``candidates`` closest to ``name``, best first, by difflib's similarity ratio (at least ``cutoff``).

    Plain (no ``report``, no ``substring_bonus``) this is :func:`difflib.get_close_matches`. ``report`` maps each
    candidate spelling (an alias, a normalised key) to the name to report: a name scores its best spelling, and ties
    go alphabetically. ``substring_bonus`` is added to the score of a spelling of two characters or more that contains
    ``name`` or is contained in it, so that ``mi300`` finds ``MI300X`` before ``MI100``."""
    if report is None and not substring_bonus:
        return difflib.get_close_matches(name, list(candidates), n=n, cutoff=cutoff)
    best: dict[str, float] = {}
    for spelling in candidates:
        score = difflib.SequenceMatcher(None, name, spelling).ratio()
        if substring_bonus and name and len(spelling) >= 2 and (name in spelling or spelling in name):
            score += substring_bonus
        shown = report[spelling] if report is not None else spelling
        best[shown] = max(best.get(shown, 0.0), score)
    return sorted((c for c in best if best[c] >= cutoff), key=lambda c: (-best[c], c))[:n]


def did_you_mean(name: str, candidates: Iterable[str], template: str = "; did you mean {}?", *, quote: bool = False,
                 **close) -> str:
    """The hint an "unknown ``name``" message carries: ``template`` with ``{}`` filled by the :func:`close_names` of
    ``name`` among ``candidates`` (keyword arguments ``close`` go to it), comma-separated and, with ``quote``, as
    ``repr``; "" when no candidate is close."""
    near = close_names(name, candidates, **close)
    if not near:
        return ""
    return template.format(", ".join(repr(c) if quote else c for c in near))


# ------------------------------------------------------------------ CSV headers
def duplicate_csv_columns(text: str) -> list[str]:
    """The column names the header of CSV ``text`` gives more than once, in header order (each once).

    pandas renames a repeated header ``B`` to ``B.1`` (``B.2`` ...), so a reader that looks for ``B`` silently takes
    the first and ignores the rest: this reads the header line itself (the first non-blank row, as pandas does, with
    the csv module's quoting) to catch it. Empty names (pandas' ``Unnamed: n``) are not reported."""
    import csv
    import io

    for row in csv.reader(io.StringIO(text, newline="")):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # a blank (or all-space) line before the header: pandas skips it too
        seen: set[str] = set()
        dup: list[str] = []
        for name in row:
            if name and name in seen and name not in dup:
                dup.append(name)
            seen.add(name)
        return dup
    return []


def without_blank_rows(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` without the rows whose every cell is empty (missing, or blank text): the ``,,,,`` lines a spreadsheet
    saves for an empty row, which pandas reads as rows (it skips only lines with no character at all). They hold no
    kernel or sample: kept, they would be counted (and reported) as rows of the file."""
    import pandas as pd

    if df.empty:
        return df
    blank = df.isna().to_numpy()
    for j, c in enumerate(df.columns):
        if not pd.api.types.is_numeric_dtype(df[c]):  # text (object, or pandas' str dtype): whitespace is empty too
            blank[:, j] |= (df[c].astype(str).str.strip() == "").to_numpy()
    keep = ~blank.all(axis=1)
    return df if keep.all() else df.loc[keep]


def csv_header_problem(text: str, where: str = "input") -> str | None:
    """The error message for CSV ``text`` whose header repeats a column (see :func:`duplicate_csv_columns`),
    naming ``where`` (the file) and the columns; None when every column is named once."""
    dup = duplicate_csv_columns(text)
    if not dup:
        return None
    renamed = ", ".join(f"{c!r} -> {c + '.1'!r}" for c in dup[:3])
    return (f"{where}: the header repeats column(s) {', '.join(map(repr, dup))}; pandas would rename the repeat "
            f"({renamed}) and it would be silently ignored: give each column once")


# ------------------------------------------------------------------ YAML / JSON keys
class DuplicateKeyError(ValueError):
    """A JSON object that gives one key twice (:func:`json_loads_unique`); the message names the key."""


def _unique_pairs(pairs: list) -> dict:
    seen: dict = {}
    for k, v in pairs:
        if k in seen:
            raise DuplicateKeyError(f"key {k!r} is given twice ({str(seen[k])[:40]} then {str(v)[:40]}); a JSON reader "
                                    "would silently keep the last value: give each key once")
        seen[k] = v
    return seen


def json_loads_unique(text: str | bytes):
    """``json.loads`` that refuses an object giving a key twice (plain ``json`` keeps the last value silently):
    :class:`DuplicateKeyError` naming the key. Other errors are ``json.JSONDecodeError`` as usual."""
    return json.loads(text, object_pairs_hook=_unique_pairs)


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose mappings refuse a key given twice (a ``ConstructorError``, so a ``yaml.YAMLError``,
    naming the key and both lines); merge keys (``<<``) keep their usual meaning."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: the base constructor reports it
                    continue
                if first is not key_node.start_mark:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found key {key!r} given twice (first on line {first.line + 1}); a YAML reader would "
                        "silently keep the last value: give each key once", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def yaml_load_unique(text: str):
    """``yaml.safe_load`` that refuses a mapping giving a key twice (``yaml.YAMLError`` naming the key and lines)."""
    return yaml.load(text, Loader=UniqueKeyLoader)
