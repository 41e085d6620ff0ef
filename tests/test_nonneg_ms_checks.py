"""The three "finite and >= 0 ms" validators share one check (``data.checks.nonneg_finite``) and keep their messages."""

from __future__ import annotations

import math

import pytest

from wattcast.data.checks import nonneg_finite
from wattcast.simulate.data_loading import check_load_ms
from wattcast.simulate.distributed import check_cp_step_floor_ms, check_moe_op_host_ms


def test_one_shared_check_keeps_each_callers_message():
    """Fails on the code before stop 46's review fix (no shared ``nonneg_finite``: three copies of the check)."""
    assert nonneg_finite(0, "x") == 0.0 and nonneg_finite("2.5", "x") == 2.5
    for bad in (-1e-9, math.inf, math.nan, True, "ms", None):
        with pytest.raises(ValueError, match=r"^x must be a finite number of s >= 0, got "):
            nonneg_finite(bad, "x", "s")
    assert check_moe_op_host_ms(None) is None and check_moe_op_host_ms(0.05) == 0.05
    assert check_cp_step_floor_ms(0) == 0.0 and check_load_ms(3) == 3.0
    for fn, msg in ((check_moe_op_host_ms, "host_ms's MoE per-op host cost must be a finite number of ms >= 0, got -1"),
                    (check_cp_step_floor_ms, "host_ms's ring-step floor must be a finite number of ms >= 0, got -1"),
                    (check_load_ms,
                     "data_load_ms (--data-load-ms) must be a finite number of milliseconds >= 0, got -1")):
        with pytest.raises(ValueError) as e:
            fn(-1)
        assert str(e.value) == msg
