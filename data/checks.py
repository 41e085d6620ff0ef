"""Type checks shared by every layer's input validation, so "a count" means one thing everywhere."""

from __future__ import annotations

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
