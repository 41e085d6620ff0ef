"""Lifecycle inputs in the wrong unit (an audit of the power / cost paths): a cloud price in cents or for a whole
node, an all-in power per GPU several times the device's TDP, a purchase price in thousands of USD, an embodied
carbon in grams; each refused naming the figure and the likely unit, and taken as given under --force /
allow_exotic, like the other ranges of ``lifecycle/checks.py`` PLAUSIBLE."""

from __future__ import annotations

import json
import math
import re

import pytest

from conftest import flat, preset_cluster, run_cli

from wattcast.data.checks import allow_exotic
from wattcast.data.cluster_spec import ClusterSpecError, cluster_from_dict
from wattcast.lifecycle import LifecycleAssumptions, footprint

FP = ("footprint", "-d", "H100-SXM5-80GB", "--gpus", "8", "--hours", "10", "--json")


# ------------------------------------------------------------------ cloud price per GPU-hour
def test_cloud_price_in_cents_or_per_node_is_refused_on_the_cli():
    """350 USD/GPU-h made a 28,000 USD cloud view of 80 GPU-hours; the dearest list price shipped is 12.29."""
    r = run_cli(*FP, "--cloud-usd-per-gpu-hour", "350")
    err = flat(r.stderr)
    assert r.returncode == 2 and "--cloud-usd-per-gpu-hour" in err and "cents" in err and "--force" in err, r.stderr
    r = run_cli(*FP, "--cloud-usd-per-gpu-hour", "350", "--force")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cloud_usd"] == pytest.approx(80 * 350)
    # a real list price passes (Azure ND96isr H100 v5, 98.32 USD/h / 8 GPUs)
    r = run_cli(*FP, "--cloud-usd-per-gpu-hour", "12.29")
    assert r.returncode == 0 and json.loads(r.stdout)["cloud_usd"] == pytest.approx(80 * 12.29)


def test_cloud_price_of_a_whole_node_is_refused_in_python_and_in_a_cluster_spec():
    with pytest.raises(ValueError, match=r"cloud_usd_per_gpu_hour \(--cloud-usd-per-gpu-hour\) is 98.32.*whole node"):
        footprint("H100-SXM5-80GB", 8, 10.0, cloud_usd_per_gpu_hour=98.32)
    with pytest.raises(ClusterSpecError, match=r"cloud_usd_per_gpu_hour.*98.32.*whole node"):
        cluster_from_dict(preset_cluster("dgx-h100", cloud_usd_per_gpu_hour=98.32))
    with allow_exotic():
        assert cluster_from_dict(preset_cluster("dgx-h100", cloud_usd_per_gpu_hour=98.32)).cloud_usd_per_gpu_hour == 98.32


# ------------------------------------------------------------------ all-in power per accelerator vs the device's TDP
def test_avg_power_several_times_the_tdp_is_refused():
    """3,000 W on a 700 W H100 (4.3 x TDP) passed the generic 1-10,000 W range; one H100 with its share of a DGX
    H100 (10.2 kW / 8) draws 1,275 W."""
    r = run_cli(*FP, "--avg-power-w", "3000")
    err = flat(r.stderr)
    assert r.returncode == 2 and "--avg-power-w" in err and "4.3 x" in err and "whole node" in err and "--force" in err
    r = run_cli(*FP, "--avg-power-w", "3000", "--force")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["avg_power_w"] == 3000
    # the DGX H100 nameplate share per GPU passes; so does a small card alone in a server (T4 + a 300 W host)
    assert footprint("H100-SXM5-80GB", 8, 10.0, avg_power_w=1275.0).avg_power_w == 1275.0
    assert footprint("Tesla-T4", 1, 10.0, avg_power_w=370.0).avg_power_w == 370.0
    with pytest.raises(ValueError, match=r"avg_power_w \(--avg-power-w\) is 1000.*Tesla-T4"):
        footprint("Tesla-T4", 1, 10.0, avg_power_w=1000.0)


# ------------------------------------------------------------------ purchase price and embodied carbon (Python only)
@pytest.mark.parametrize("field, value, hint", [
    ("accelerator_price_usd", 33.6, "thousands of USD"),  # an H100's 33,600 USD typed in thousands
    ("accelerator_price_usd", 33.6e6, "cents"),
    ("embodied_kgco2e_per_gpu", 150_000, "grams"),  # Luccioni et al. 2022's 150 kg per GPU in g
    ("embodied_kgco2e_per_gpu", 0.15, "tonnes"),
])
def test_price_and_embodied_in_another_unit_are_refused(field, value, hint):
    with pytest.raises(ValueError, match=rf"LifecycleAssumptions.{field} is {re.escape(f'{value:g}')}.*{hint}.*allow_exotic"):
        LifecycleAssumptions(**{field: value})
    with allow_exotic():
        fp = footprint("H100-SXM5-80GB", 8, 10.0, assumptions=LifecycleAssumptions(**{field: value}))
    assert math.isfinite(fp.total_tco2e) and fp.sources[field] == "given"


def test_price_and_embodied_in_range_or_zero_pass():
    ok = LifecycleAssumptions(accelerator_price_usd=33_600, embodied_kgco2e_per_gpu=150)
    fp = footprint("H100-SXM5-80GB", 8, 10.0, avg_power_w=700.0, assumptions=ok)
    assert fp.embodied_kgco2e_per_gpu == 150
    free = footprint("H100-SXM5-80GB", 8, 10.0, avg_power_w=700.0,
                     assumptions=LifecycleAssumptions(accelerator_price_usd=0, embodied_kgco2e_per_gpu=0))
    assert free.embodied_tco2e == 0 and free.capex_breakdown_usd["accelerators_usd"] == 0


# ------------------------------------------------------------------ grid zones with a placeholder figure
def test_nordic_zones_do_not_silently_undercut_their_country():
    """CodeCarbon gives all nine SE and NO zones 18 g/kWh; the country rows say Sweden 40.7, Norway 30.1. A zone with
    a placeholder figure takes its country's and the run says so."""
    from wattcast.data import carbon

    for zone, iso in (("SE1", "SWE"), ("SE3", "SWE"), ("SE4", "SWE"), ("NO1", "NOR"), ("NO5", "NOR")):
        gi, country = carbon.grid_intensity(zone), carbon.grid_intensity(iso)
        assert gi.kgco2e_per_kwh == country.kgco2e_per_kwh and gi.region == zone
        assert "placeholder" in gi.note and iso in gi.note and "placeholder" in gi.source
    fp = footprint("H100-SXM5-80GB", 8, 10.0, avg_power_w=700.0, region="SE3")
    assert fp.grid_kgco2e_per_kwh == pytest.approx(0.040695)
    assert any("zone SE3" in f and "placeholder" in f and "SWE" in f for f in fp.flags)
    # Finland's zone has its own figure (72 g/kWh, not shared): kept, no note
    fi = carbon.grid_intensity("FI")
    assert fi.kgco2e_per_kwh == pytest.approx(0.072) and fi.note is None


def test_zone_rows_find_placeholders_by_shared_figures():
    from wattcast.data.carbon import zone_rows

    countries = {"SWE": {"name": "Sweden", "gco2e_per_kwh": 40.0, "year": 2023},
                 "NOR": {"name": "Norway", "gco2e_per_kwh": 30.0, "year": 2023}}
    up = {c: {"emission_factor": 18.0, "description": c, "year": 2024} for c in ("SE1", "SE2", "NO1")}
    up["NO2"] = {"emission_factor": 25.0, "description": "NO2", "year": 2024}
    rows = zone_rows(up, countries)
    assert rows["SE2"]["gco2e_per_kwh"] == 40.0 and rows["NO1"]["gco2e_per_kwh"] == 30.0 and rows["NO1"]["placeholder"]
    assert rows["NO2"] == {"name": "NO2", "gco2e_per_kwh": 25.0, "year": 2024}


# ------------------------------------------------------------------ ISO 3166-1 alpha-2 region codes
def test_iso2_country_codes_are_mapped_to_the_iso3_rows():
    """--region FR was refused (the table is keyed by ISO3 FRA); alpha-2 codes now mean their country."""
    from wattcast.data import carbon

    for a2, a3 in (("FR", "FRA"), ("de", "DEU"), ("IN", "IND"), ("SE", "SWE"), ("NO", "NOR"), ("GB", "GBR")):
        gi = carbon.grid_intensity(a2)
        assert gi.region == a3 and gi.kgco2e_per_kwh == carbon.grid_intensity(a3).kgco2e_per_kwh
    assert carbon.electricity_price("DE").location == "DEU"
    assert carbon.grid_intensity("FI").region == "FI"  # Finland's zone row (its own 72 g/kWh) as before
    r = run_cli(*FP, "--avg-power-w", "700", "--region", "FR")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["grid_region"] == "FRA" and d["grid_kgco2e_per_kwh"] == pytest.approx(0.056039)
    with pytest.raises(carbon.UnknownRegionError, match=r"ISO3 or ISO2 codes"):
        carbon.grid_intensity("XQ")
