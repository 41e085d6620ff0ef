"""Type checks shared by every layer's input validation, so "a count" means one thing everywhere, and the
plausibility ranges (figures 1,000x off) with their ``--force`` switch (:func:`allow_exotic`)."""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers


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


def implausible(name: str, v: float, lo: float, hi: float, low_hint: str, high_hint: str, unit: str) -> str | None:
    """A message when ``v`` lies outside [``lo``, ``hi``], naming ``name``, the likely unit mix-up and ``--force``;
    None when it is inside, or when :func:`allow_exotic` is on. ``low_hint`` / ``high_hint`` say what a too-small /
    too-large figure probably is ("kW", "a percent")."""
    if exotic_allowed() or lo <= v <= hi:
        return None
    side, bound, hint = ("over", hi, high_hint) if v > hi else ("under", lo, low_hint)
    return (f"{name} is {v:g}, {side} the plausible {bound:g}: it looks like {hint}; give it in {unit} "
            f"(or pass --force, in Python wattcast.allow_exotic(), for a deliberately exotic value)")
