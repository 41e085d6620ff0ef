"""Audit 58c (lifecycle / TCO / carbon, a finance and sustainability analyst's read): the market-based factor gets the
grid intensity's unit check and is refused without market_based; search carries predict's flags on the device's price
and embodied carbon and splits its TCO / CO2e; the CapEx inputs have plausible ranges; wattcast.footprint takes
apply_goodput= / power_model= and both footprint functions say whether goodput was applied; a market-based 0 is said
to be the provider's claim; grid_region_specific has one definition, in every output."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import wattcast
import wattcast.lifecycle as L
from wattcast.cli import app
from wattcast.data import carbon
from wattcast.lifecycle import LifecycleAssumptions, format_footprint, run_footprint
from wattcast.lifecycle.checks import PLAUSIBLE

runner = CliRunner()
H100 = "H100-SXM5-80GB"


def _cli(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert not (r.exception and not isinstance(r.exception, SystemExit)), f"traceback: {r.exception!r}"
    return r


# ------------------------------------------------------------------ 1. market_kgco2e_per_kwh: the grid field's checks
def test_market_factor_has_the_grid_factors_range():
    assert PLAUSIBLE["market_kgco2e_per_kwh"] is PLAUSIBLE["grid_kgco2e_per_kwh"]  # one range, one validator
    ok = run_footprint(H100, 8, 10, LifecycleAssumptions(market_based=True, market_kgco2e_per_kwh=0.4), avg_power_w=700)
    assert ok.grid_basis == "market" and ok.grid_kgco2e_per_kwh == 0.4
    for bad, unit in ((400, "grams per kWh"), (0.0004, "tonnes per kWh")):  # was: 400 taken, 1,000x the CO2e
        with pytest.raises(ValueError, match=rf"LifecycleAssumptions\.market_kgco2e_per_kwh is .*{unit}"):
            LifecycleAssumptions(market_based=True, market_kgco2e_per_kwh=bad)
    assert LifecycleAssumptions(market_based=True, market_kgco2e_per_kwh=0).market_kgco2e_per_kwh == 0
    with wattcast.allow_exotic():
        assert LifecycleAssumptions(market_based=True, market_kgco2e_per_kwh=3.0).market_kgco2e_per_kwh == 3.0


def test_market_factor_without_market_based_is_refused():
    # was: ignored without a flag (the world average charged instead)
    with pytest.raises(ValueError, match=r"market_kgco2e_per_kwh is 0\.5 but market_based is False.*market_based=True"):
        LifecycleAssumptions(market_kgco2e_per_kwh=0.5)
    a = LifecycleAssumptions(market_based=True, market_kgco2e_per_kwh=0.2, grid_kgco2e_per_kwh=0.3)
    fp = run_footprint(H100, 8, 10, a, avg_power_w=700)  # the explicit figure wins, and says what it replaced
    assert fp.grid_kgco2e_per_kwh == 0.3 and any("market_kgco2e_per_kwh 0.2" in f for f in fp.flags)


# ------------------------------------------------------------------ 3. the CapEx inputs' plausible ranges
@pytest.mark.parametrize("field,bad,hint", [
    ("facility_usd_per_kw", 10, "thousands of USD per kW"),  # the "USD 10M/MW" typed as thousands per kW
    ("facility_usd_per_kw", 1e9, "USD per MW"),
    ("server_usd_per_gpu", 50, "thousands of USD"),
    ("server_usd_per_gpu", 625_000, "cents"),
    ("network_usd_per_gpu", 4e7, "cents"),
    ("network_usd_per_gpu", 4, "thousands of USD"),
    ("lifetime_utilisation", 0.01, "compute utilisation"),
    ("facility_lifetime_years", 500, "months, days or hours"),
    ("gpus_per_server", 10_000, "GPUs of a cluster"),
])
def test_capex_inputs_out_of_range_are_refused_naming_field_and_unit(field, bad, hint):
    # was: all taken without a flag (facility 10 USD/kW -> facility_usd 0.01; utilisation 0.01 -> 80x the CapEx)
    with pytest.raises(ValueError, match=rf"LifecycleAssumptions\.{field} is .*{hint}.*--force"):
        LifecycleAssumptions(**{field: bad})
    with wattcast.allow_exotic():  # --force / allow_exotic takes a deliberately exotic value
        assert getattr(LifecycleAssumptions(**{field: bad}), field) == bad


def test_capex_defaults_and_zero_prices_pass():
    a = LifecycleAssumptions()
    for f in ("facility_usd_per_kw", "server_usd_per_gpu", "network_usd_per_gpu", "lifetime_utilisation",
              "facility_lifetime_years", "gpus_per_server"):
        lo, hi = PLAUSIBLE[f][:2]
        assert lo <= getattr(a, f) <= hi, f
    z = LifecycleAssumptions(server_usd_per_gpu=0, network_usd_per_gpu=0, facility_usd_per_kw=0)  # paid off: allowed
    fp = run_footprint(H100, 8, 10, z, avg_power_w=700)
    assert fp.capex_breakdown_usd["servers_usd"] == fp.capex_breakdown_usd["facility_usd"] == 0


# ------------------------------------------------------------------ 4. the two footprint functions
def test_wattcast_footprint_takes_apply_goodput_and_power_model():
    # was: TypeError "got multiple values for keyword argument 'apply_goodput'" / 'power_model'
    a = wattcast.footprint(H100, 1024, 720, region="DEU")
    assert a.goodput_applied is False and a.hours == 720 and a.goodput == 1.0
    assert wattcast.footprint(H100, 1024, 720, region="DEU", apply_goodput=False).hours == 720
    b = L.footprint(H100, 1024, 720, region="DEU", power_model=a.avg_power_w)
    assert b.goodput_applied is True and b.hours > 720
    c = wattcast.footprint(H100, 1024, 720, region="DEU", apply_goodput=True)
    assert c.goodput_applied is True and c.hours == pytest.approx(b.hours, rel=1e-12)
    assert c.total_tco2e == pytest.approx(b.total_tco2e, rel=1e-12)
    d = L.footprint(H100, 1024, 720, region="DEU", power_model=a.avg_power_w, apply_goodput=False)
    assert d.total_tco2e == pytest.approx(a.total_tco2e, rel=1e-12)  # the same hours, the same figures
    p = wattcast.footprint(H100, 8, 10, power_model=500)
    assert p.avg_power_w == 500 and "power model" in p.power_source
    with pytest.raises(ValueError, match="avg_power_w .* power_model"):
        wattcast.footprint(H100, 8, 10, avg_power_w=700, power_model=500)
    assert a.to_dict()["goodput_applied"] is False
    assert "goodput not applied" in format_footprint(a).splitlines()[0]


# ------------------------------------------------------------------ 5. a market-based 0 is the provider's claim
def test_market_based_zero_is_flagged_as_the_providers_claim():
    fp = wattcast.footprint(H100, 1024, 720, region="azure:eastus", market_based=True)
    assert fp.grid_kgco2e_per_kwh == 0 and fp.grid_basis == "market" and fp.grid_renewable_claim_zero
    note = [f for f in fp.flags if f.startswith("market-based grid intensity 0 for azure:eastus")]
    assert note and "not a grid factor" in note[0] and "offset ratio 100%" in note[0]
    assert fp.to_dict()["grid_renewable_claim_zero"] is True
    loc = wattcast.footprint(H100, 1024, 720, region="azure:eastus")
    assert not loc.grid_renewable_claim_zero and loc.grid_kgco2e_per_kwh > 0
    r = _cli("footprint", "-d", H100, "--gpus", 1024, "--hours", 720, "--region", "azure:eastus", "--market-based")
    out = " ".join(r.stdout.split())  # (the console wraps lines)
    assert r.exit_code == 0 and "renewable claim, not a grid factor: see note" in out
    assert "note: market-based grid intensity 0 for azure:eastus" in out
    j = json.loads(_cli("footprint", "-d", H100, "--gpus", 8, "--hours", 10, "--region", "azure:eastus",
                        "--market-based", "--json").stdout)
    assert j["grid_renewable_claim_zero"] is True


# ------------------------------------------------------------------ 6. grid_region_specific: one definition
def test_world_is_not_region_specific_everywhere():
    assert carbon.grid_intensity("world").region_specific is False  # was True ('regions' said true for world)
    assert carbon.grid_intensity("DEU").region_specific is True
    rows = json.loads(_cli("regions", "world", "--json").stdout)
    assert [r["grid_region_specific"] for r in rows] == [False]
    fp = wattcast.footprint(H100, 8, 10, region="world")
    assert fp.grid_region_specific is False and any(f.startswith("region 'world': world average") for f in fp.flags)
    assert wattcast.footprint(H100, 8, 10).grid_region_specific is False
    assert wattcast.footprint(H100, 8, 10, region="DEU").grid_region_specific is True
    assert wattcast.footprint(H100, 8, 10, grid_kgco2e_per_kwh=0.1).grid_region_specific is True
    # CAF: the world average stands in for a missing figure
    assert wattcast.footprint(H100, 8, 10, region="CAF").grid_region_specific is False
    j = json.loads(_cli("footprint", "-d", H100, "--gpus", 8, "--hours", 10, "--region", "world", "--json").stdout)
    assert j["grid_region_specific"] is False  # was: no such key
    p = wattcast.predict_cluster("gpt2", "DGX-H100", gpus=8, batch=64, seq=1024, tp=1, pp=1, micro_batch=8, zero=0,
                                 tokens=1e9, region="world")
    assert p.to_dict()["run_details"]["grid_region_specific"] is False


# ------------------------------------------------------------------ 2. search: predict's flags and the split
def test_search_says_the_device_flags_and_splits_tco_and_co2e():
    res = wattcast.search("llama3_8b", ["DGX-A100", "MI300X-8GPU"], 64, 512, 8192, tp=(2,), pp=(1,), micro_batch=(1,),
                          zero=(1,), recompute=("none",), sp=(True,), tokens=1e12, footprint_kw=dict(region="DEU"),
                          objective="tco")
    w = " | ".join(res.warnings)
    # was: warnings [] (predict flags both)
    assert "no launch price for A100-SXM4-80GB: assumed USD 15,000" in w and "A100-SXM4-40GB" in w
    assert "MI300X is a chiplet package" in w and "underestimate" in w
    assert sum("no launch price for A100-SXM4-80GB" in x for x in res.warnings) == 1  # once, not per row
    fit = res.ranked[res.ranked["fits"].astype(bool)]
    assert set(fit["device"]) == {"A100-SXM4-80GB", "MI300X"}
    for r in fit.to_dict("records"):
        assert r["run_tco_usd"] == pytest.approx(r["run_capex_usd"] + r["run_opex_usd"], rel=1e-12)
        assert r["run_tco2e"] == pytest.approx(r["run_operational_tco2e"] + r["run_embodied_tco2e"], rel=1e-12)
        p = wattcast.predict_cluster("llama3_8b", r["cluster"], gpus=64, seq=8192, strategy=r["strategy"], tokens=1e12,
                                     region="DEU")
        assert p.run.embodied_tco2e == pytest.approx(r["run_embodied_tco2e"], rel=1e-12)
        assert p.run.capex_usd == pytest.approx(r["run_capex_usd"], rel=1e-12)
        assert p.run.accelerator_price_usd == r["accelerator_price_usd"]
        assert p.run.embodied_kgco2e_per_gpu == pytest.approx(r["embodied_kgco2e_per_gpu"], rel=1e-12)
        assert r["accelerator_price_source"] == p.run.sources["accelerator_price_usd"]
    mi = fit[fit["device"] == "MI300X"].iloc[0]
    assert "10-15k" in mi["accelerator_price_source"] and mi["accelerator_price_usd"] == 15_000


def test_search_says_a_market_based_zero_once():
    res = wattcast.search("gpt2", "DGX-H100", 8, 64, 1024, tp=(1,), pp=(1,), micro_batch=(8,), zero=(0,),
                          recompute=("none",), tokens=1e9,
                          footprint_kw=dict(region="azure:eastus", market_based=True))
    notes = [x for x in res.warnings if x.startswith("market-based grid intensity 0 for azure:eastus")]
    assert len(notes) == 1
