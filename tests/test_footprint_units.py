"""Footprint options 1,000x too small (a grid intensity in t/kWh, an electricity price in USD/Wh) are refused naming
the unit; 0 (carbon-free or free power) is still allowed."""

from __future__ import annotations

import pytest

import wattcast
from conftest import flat
from wattcast.data.checks import allow_exotic


# ------------------------------------------------------------------ 13. footprint prices and grid in 1,000x units
@pytest.mark.parametrize("option, value, hint", [
    ("grid_kgco2e_per_kwh", 0.0004, "tonnes per kWh"),
    ("electricity_usd_per_kwh", 0.0001, "USD per Wh"),
])
def test_footprint_figures_a_thousand_times_too_small_are_refused_zero_is_not(option, value, hint):
    with pytest.raises(ValueError) as e:
        wattcast.footprint("H100", 8, 10.0, **{option: value})
    assert option in str(e.value) and hint in str(e.value)
    zero = wattcast.footprint("H100", 8, 10.0, **{option: 0.0})
    assert zero is not None
    with allow_exotic():
        wattcast.footprint("H100", 8, 10.0, **{option: value})


def test_footprint_cli_refuses_grid_in_tonnes(cli):
    r = cli("footprint", "--device", "H100", "--gpus", "8", "--hours", "10", "--grid-kgco2e-per-kwh", "0.0004")
    assert r.returncode != 0 and "tonnes per kWh" in flat(r.stderr + r.stdout)
    r = cli("footprint", "--device", "H100", "--gpus", "8", "--hours", "10", "--electricity-usd-per-kwh", "0")
    assert r.returncode == 0, r.stderr
