"""The pydantic v2 building blocks of wattcast's spec and config validation (device specs, cluster specs, Hugging
Face config fields): field types whose validators carry wattcast's rules and messages, and the translation of a
:class:`pydantic.ValidationError` into the one clear message a user sees.

Fields are typed ``Annotated[Any, <validators>]``: pydantic coerces nothing (``"2000"`` stays text and is refused,
an ``np.float32`` stays what it was, so every figure is the one given), and each validator raises a
:func:`problem` carrying a message in which :data:`FIELD` stands for the field's (dotted) name. When several
fields are wrong, the message reports the first by kind (an unknown field, then :data:`KINDS`: a missing field, a
wrong type, an out-of-range value, an implausible one, a broken rule between fields, a missing citation), then by
field order. Rules between fields (model validators) run only once every field is valid.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Iterable, Mapping

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from wattcast.data.checks import implausible

#: stands for "field '<dotted name>'" in a message; filled in by :func:`first_problem`
FIELD = "\x00field\x00"
#: stands for the bare dotted name (messages that read "n_layer must be ...")
NAME = "\x00name\x00"

#: error kinds, in the order a message reports them
KINDS = ("wc_missing", "wc_type", "wc_value", "wc_plausible", "wc_rule", "wc_citation")
_RANK = {k: i for i, k in enumerate(KINDS)}


def problem(kind: str, message: str) -> PydanticCustomError:
    """The error a validator raises: ``kind`` one of :data:`KINDS`, ``message`` with :data:`FIELD` for the field."""
    return PydanticCustomError(kind, "{message}", {"message": message})


def yaml_number_hint(v: Any) -> str:
    """The hint for a number that came out of YAML as text: PyYAML (YAML 1.1) reads an exponent number only with a dot
    in the mantissa and a sign in the exponent (``3.43e+3``), so ``3.43e3`` and ``9e11`` are strings. The hint spells
    the number both ways YAML takes (" (text: ...; write 3.43e+03 or 3430.0)"); "" for any other value."""
    if not isinstance(v, str) or "e" not in v.lower():
        return ""  # (quoted text such as "3430" is not this slip)
    try:
        x = float(v)
    except ValueError:
        return ""
    if not math.isfinite(x):
        return ""
    digits = next((p for p in range(1, 17) if float(f"{x:.{p}e}") == x), 16)
    return (f" (text: YAML reads a number with an exponent as a string unless its mantissa has a dot and its exponent "
            f"a sign; write {x:.{digits}e} or {x!r})")


def is_number(v: Any) -> bool:
    """An int, float or numpy scalar number (not a bool, not text)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


# ------------------------------------------------------------------ validators (use with AfterValidator)
def number(*, zero: bool = False, integer: bool = False, type_msg: str = "must be a number, got {v!r}{hint}",
           finite_msg: str | None = None, value_msg: str = "must be positive, got {v!r}",
           whole_msg: str = "must be a whole number, got {v!r}",
           hint: Callable[[Any], str] = lambda v: "") -> Callable[[Any], Any]:
    """A finite number > 0 (>= 0 with ``zero``), whole with ``integer``; the value is returned as given. A NaN or an
    infinity gets ``finite_msg`` (default: ``type_msg``)."""

    def check(v: Any) -> Any:
        if not is_number(v):
            raise problem("wc_type", f"{FIELD} " + type_msg.format(v=v, hint=hint(v)))
        try:
            finite = math.isfinite(v)
        except OverflowError:  # an int too large for a float
            finite = False
        if not finite:
            raise problem("wc_type", f"{FIELD} " + (finite_msg or type_msg).format(v=v, hint=hint(v)))
        if v < 0 or (v == 0 and not zero):
            raise problem("wc_value", f"{FIELD} " + value_msg.format(v=v))
        if integer and int(v) != v:
            raise problem("wc_value", f"{FIELD} " + whole_msg.format(v=v))
        return v

    return check


def plausible(lo: float, hi: float, low_hint: str, high_hint: str, unit: str, *,
              zero_ok: bool = False) -> Callable[[Any], Any]:
    """Within [``lo``, ``hi``] (or exactly 0 with ``zero_ok``) unless :func:`wattcast.data.checks.allow_exotic`
    (``--force``): outside, a figure is almost surely in another unit, and the message names the likely one
    (:func:`wattcast.data.checks.implausible`)."""

    def check(v: Any) -> Any:
        if v is not None:
            msg = implausible(FIELD, v, lo, hi, low_hint, high_hint, unit, zero_ok=zero_ok)
            if msg:
                raise problem("wc_plausible", msg)
        return v

    return check


def text(*, type_msg: str = "must be text (a string), got {v!r}") -> Callable[[Any], Any]:
    """A string (wrap in :func:`optional` to let None pass)."""

    def check(v: Any) -> Any:
        if not isinstance(v, str):
            raise problem("wc_type", f"{FIELD} " + type_msg.format(v=v, t=type(v).__name__))
        return v

    return check


def one_of(choices: Iterable[str], msg: str) -> Callable[[Any], Any]:
    """One of ``choices``; ``msg`` formats ``{v!r}`` and ``{choices}``."""
    allowed = tuple(choices)

    def check(v: Any) -> Any:
        if not isinstance(v, str) or v not in allowed:
            raise problem("wc_type", f"{FIELD} " + msg.format(v=v, choices=", ".join(allowed)))
        return v

    return check


def required(v: Any) -> Any:
    """Present: not None and not blank text."""
    if v is None or (isinstance(v, str) and not v.strip()):
        raise problem("wc_missing", f"required {FIELD} is missing")
    return v


def schema(version: int) -> Callable[[Any], Any]:
    """The schema version this wattcast reads."""

    def check(v: Any) -> Any:
        if isinstance(v, bool) or v != version:
            raise problem("wc_value", f"{FIELD} is {v!r}, this wattcast reads {version}")
        return v

    return check


def optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``check``, except that None (an absent optional field) passes."""
    return lambda v: v if v is None else check(v)


# ------------------------------------------------------------------ one message from a ValidationError
def _dotted(loc: tuple) -> str:
    """("intra", "kind") -> intra.kind; ("bandwidth", 0) -> bandwidth[0]"""
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) and out else (f".{p}" if out else str(p))
    return out


def _rank(err: Mapping[str, Any]) -> int:
    t = err["type"]
    if t in _RANK:
        return _RANK[t]
    if t in ("extra_forbidden", "invalid_key"):
        return -1  # an unknown field first: a misspelt name also makes a required one "missing"
    if t == "missing":
        return _RANK["wc_missing"]
    return _RANK["wc_type"]


def _first(errors: list) -> dict:
    return errors[min(range(len(errors)), key=lambda i: (_rank(errors[i]), i))]


def first_location(e: ValidationError) -> tuple:
    """The location (field path) of the problem :func:`first_problem` reports: e.g. to raise an error class that
    belongs to that field."""
    return tuple(_first(e.errors(include_url=False))["loc"])


def first_problem(e: ValidationError, *, missing: Callable[[str], str] = lambda f: f"required field '{f}' is missing",
                  known: Callable[[str], Iterable[str]] | None = None,
                  not_mapping: Callable[[str, Any], str] | None = None, at: tuple = (),
                  label: Callable[[str], str] = lambda f: f"field '{f}'") -> str:
    """The message of the first problem in ``e`` (by kind, then field order), with :data:`FIELD` filled in.

    Pydantic's own errors are worded in wattcast's terms: ``missing`` (a required field; all missing fields of one
    section in one message), ``extra_forbidden`` / ``invalid_key`` ("unknown field(s) ...; known: ..." with the
    names ``known(section)`` gives), ``model_type`` (a section that is not a mapping: ``not_mapping(field, value)``).
    ``at`` is put before every error's location (the key a lone value was read from). ``label`` turns the dotted
    field name into what :data:`FIELD` stands for (default ``field 'name'``; e.g. an option and its flag)."""
    errors = [dict(x, loc=(*at, *x["loc"])) for x in e.errors(include_url=False)]
    dotted = _dotted
    err = _first(errors)
    t, loc = err["type"], tuple(err["loc"])
    if t in _RANK:
        return err["ctx"]["message"].replace(FIELD, label(dotted(loc))).replace(NAME, dotted(loc))
    if t in ("extra_forbidden", "invalid_key"):
        section = loc[:-1]
        prefix = dotted(section) + "." if section else ""
        unknown = [f"{prefix}{x['loc'][-1]}" for x in errors if x["type"] in ("extra_forbidden", "invalid_key")
                   and tuple(x["loc"][:-1]) == section]  # a key, even a number, is a name here
        names = sorted(f"{prefix}{k}" for k in (known(dotted(section)) if known else ()))
        return f"unknown field(s) {', '.join(unknown)}" + (f"; known: {', '.join(names)}" if names else "")
    if t == "missing":
        section = loc[:-1]
        gone = [dotted(x["loc"]) for x in errors if x["type"] == "missing" and tuple(x["loc"][:-1]) == section]
        if section:
            return f"required field(s) {', '.join(gone)} missing"
        return missing(gone[0])
    if t in ("model_type", "dict_type") and not_mapping is not None:
        return not_mapping(dotted(loc), err["input"])
    return f"field '{dotted(loc)}': {err['msg']}, got {err.get('input')!r}"
