"""LifecycleAssumptions (and the loose options that build it) validated by one pydantic v2 model: every field, the
plausible ranges naming the likely unit, --force for the deliberately exotic, the error classes callers catch, and
the defaults unchanged."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import wattcast
from wattcast.data import carbon as _c
from wattcast.lifecycle import LifecycleAssumptions, assumptions_from_options
from wattcast.lifecycle.assumptions import LifecycleAssumptionsModel


def test_the_model_holds_every_field_in_order_and_the_hand_written_checks_are_gone():
    from pydantic import BaseModel

    from wattcast.lifecycle import assumptions, checks

    assert issubclass(LifecycleAssumptionsModel, BaseModel)
    assert list(LifecycleAssumptionsModel.model_fields) == [f.name for f in dataclasses.fields(LifecycleAssumptions)]
    for module, gone in ((checks, "_region"), (checks, "_FLAG_FIELDS"), (checks, "_FOOTPRINT_NUMBERS"),
                         (assumptions, "_pos"), (assumptions, "check_plausible")):
        assert not hasattr(module, gone), f"{module.__name__}.{gone} is back: one copy of each rule"


def test_defaults_are_the_tables_and_pass_the_model():
    a = LifecycleAssumptions()
    d = _c.cost_defaults()
    for k in ("pue", "lifetime_years", "lifetime_utilisation", "server_usd_per_gpu", "network_usd_per_gpu",
              "facility_usd_per_kw", "facility_lifetime_years", "node_overhead_share", "default_power_fraction_of_tdp",
              "mtbf_gpu_hours", "checkpoint_write_s", "restart_min"):
        assert getattr(a, k) == d[k].value, k
    assert a.gpus_per_server == _c.server_defaults()["gpus_per_server"].value
    assert (a.region, a.pricing, a.market_based, a.electricity_usd_per_kwh) == (None, "on-demand", False, None)
    LifecycleAssumptionsModel.model_validate(dataclasses.asdict(a))


@pytest.mark.parametrize("kw, match", [
    (dict(pue=50), r"LifecycleAssumptions\.pue is 50, over 4: it looks like a percent.*--force"),
    (dict(lifetime_years=1e-9), r"LifecycleAssumptions\.lifetime_years is 1e-09, under 0\.25.*years"),
    (dict(node_overhead_share=30), r"LifecycleAssumptions\.node_overhead_share is 30.*a percent"),
    (dict(grid_kgco2e_per_kwh=481), r"grid_kgco2e_per_kwh is 481.*grams per kWh"),
    (dict(electricity_usd_per_kwh=12), r"electricity_usd_per_kwh is 12.*cents"),
    (dict(pue=0.9), r"LifecycleAssumptions\.pue must be >= 1"),
    (dict(lifetime_utilisation=1.2), r"lifetime_utilisation must be in \(0, 1\], got 1\.2"),
    (dict(default_power_fraction_of_tdp=2.0), r"default_power_fraction_of_tdp looks wrong"),
    (dict(pue="1.2"), r"LifecycleAssumptions\.pue must be a finite number, got '1\.2'"),
    (dict(pue=float("nan")), r"pue must be a finite number, got nan"),
    (dict(lifetime_years=10**400), r"lifetime_years must be a finite number"),  # not an OverflowError
    (dict(mtbf_gpu_hours=0), r"mtbf_gpu_hours must be positive, got 0"),
    (dict(restart_min=-1), r"restart_min must be non-negative, got -1"),
    (dict(market_based="no"), r"market_based must be True or False, got 'no'"),
    (dict(include_server_embodied=1), r"include_server_embodied must be True or False, got 1"),
    (dict(cloud_price_source=3), r"cloud_price_source must be a string, got 3"),
])
def test_bad_or_implausible_fields_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        LifecycleAssumptions(**kw)


def test_error_classes_and_option_labels():
    with pytest.raises(_c.UnknownRegionError, match=r"empty region \(LifecycleAssumptions\.region=''\)"):
        LifecycleAssumptions(region="")
    with pytest.raises(_c.UnknownRegionError, match=r"region must be a string.*got 5"):
        assumptions_from_options(region=5)
    with pytest.raises(_c.CarbonDataError, match=r"unknown pricing \(--pricing\) 'spot'; valid: on-demand"):
        assumptions_from_options(pricing="spot")
    # the loose options are named as the caller gave them, with their flag
    with pytest.raises(ValueError, match=r"pue \(--pue\) is 50, over 4"):
        assumptions_from_options(pue=50)
    with pytest.raises(ValueError, match=r"lifetime_years \(--lifetime-years\) is 1e-09"):
        wattcast.footprint("h100", 8, 10.0, avg_power_w=500.0, lifetime_years=1e-9)
    with pytest.raises(ValueError, match=r"avg_power_w \(--avg-power-w\) is 1e\+09.*all GPUs together"):
        wattcast.footprint("h100", 8, 10.0, avg_power_w=1e9)


def test_values_are_kept_as_given_and_force_lets_the_exotic_through():
    a = LifecycleAssumptions(market_based=np.bool_(True), pue=np.float32(1.25), pricing="Reserved_1y", region="FRA")
    assert isinstance(a.pue, np.float32) and a.market_based and a.pricing == "reserved-1y"
    with wattcast.allow_exotic():
        assert LifecycleAssumptions(pue=50).pue == 50
        assert assumptions_from_options(lifetime_years=1e-9).lifetime_years == 1e-9
        with pytest.raises(ValueError, match="pue must be >= 1"):  # hard rules stay
            LifecycleAssumptions(pue=0.5)
    base = wattcast.footprint("h100", 8, 10.0, avg_power_w=500.0)
    with wattcast.allow_exotic():
        hot = wattcast.footprint("h100", 8, 10.0, avg_power_w=500.0, pue=12.0)
    assert hot.energy_kwh == pytest.approx(base.energy_kwh * 12.0 / base.pue)


def test_footprint_cli_pue_needs_force():
    from conftest import flat, run_cli

    base = ("footprint", "-d", "h100", "--gpus", "8", "--hours", "10", "--json")
    r = run_cli(*base, "--pue", "50")
    assert r.returncode == 2 and "--pue" in flat(r.stderr) and "percent" in flat(r.stderr) and "Traceback" not in r.stderr
    r = run_cli(*base, "--pue", "50", "--force")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pue"] == 50
