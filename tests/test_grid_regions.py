"""AWS/Azure grid intensity from where each region is (issue 16): the country row outside the US and Canada, the 2023
province mix in Canada, the 2023-05 snapshot's eGRID figure in the US; every row says its source and year."""

from __future__ import annotations

import json
from importlib.resources import files

import pytest
import yaml
from typer.testing import CliRunner

from wattcast.cli import app
from wattcast.data import carbon

runner = CliRunner()


def _table() -> dict:
    return json.loads((files("wattcast.data") / "carbon" / "grid_intensity.json").read_text(encoding="utf-8"))


def _aws_azure() -> dict:
    return {k: r for k, r in _table()["cloud_regions"].items() if r["provider"] in ("aws", "azure")}


@pytest.mark.parametrize("region, iso", [("aws:eu-central-1", "DEU"), ("aws:eu-west-1", "IRL"), ("aws:eu-west-2", "GBR"),
                                         ("azure:uksouth", "GBR"), ("azure:westeurope", "NLD"), ("eu-central-1", "DEU"),
                                         ("aws:ap-east-1", "HKG"), ("azure:japaneast", "JPN")])
def test_a_non_us_region_has_its_countrys_intensity(region, iso):
    g, c = carbon.grid_intensity(region), carbon.grid_intensity(iso)
    assert g.kgco2e_per_kwh == c.kgco2e_per_kwh and g.year == c.year and g.basis == "location"
    assert f"country {iso}" in g.source and "Our World in Data / Ember" in g.source and "snapshot had" in g.source


def test_the_old_frankfurt_london_dublin_figures_are_gone():
    # were 615 / 623 / 617 gCO2/kWh (2016-2019 sources in CodeCarbon's 2023-05-16 snapshot); now the 2023 country rows
    assert carbon.grid_intensity("aws:eu-central-1").kgco2e_per_kwh == pytest.approx(0.38095)
    assert carbon.grid_intensity("azure:uksouth").kgco2e_per_kwh == pytest.approx(0.237589)
    assert carbon.grid_intensity("aws:eu-west-1").kgco2e_per_kwh == pytest.approx(0.290805)
    rows = _aws_azure()
    assert (rows["aws:eu-central-1"]["snapshot_gco2e_per_kwh"], rows["azure:uksouth"]["snapshot_gco2e_per_kwh"]) == (615, 623)


def test_every_aws_azure_row_has_location_source_year_and_keeps_its_keys():
    rows = _aws_azure()
    assert len(rows) == 54 and set(rows) == set(carbon.CLOUD_REGION_LOCATIONS)
    countries = _table()["countries"]
    keys = {"provider", "region", "name", "gco2e_per_kwh", "offset_ratio_pct", "market_gco2e_per_kwh", "snapshot", "cite",
            "location", "year", "source", "snapshot_gco2e_per_kwh"}
    kinds = {"country": 0, "province": 0, "us": 0}
    for full, r in rows.items():
        assert set(r) == keys, full
        assert r["location"] == carbon.CLOUD_REGION_LOCATIONS[full][0]
        loc = r["location"]
        if loc.startswith("US-"):
            kinds["us"] += 1  # kept: the shared data has nothing newer than the snapshot for US states
            assert r["gco2e_per_kwh"] == r["snapshot_gco2e_per_kwh"] and r["year"] is None
            assert "kept the CodeCarbon 2023-05-16 snapshot figure" in r["source"]
        elif loc.startswith("CA-"):
            kinds["province"] += 1
            assert r["year"] == 2023 and "2023 generation mix" in r["source"]
        else:
            kinds["country"] += 1
            assert r["gco2e_per_kwh"] == countries[loc]["gco2e_per_kwh"] and r["year"] == countries[loc]["year"]
        # the market-based proxy follows the new location figure with the provider's offset ratio
        assert r["market_gco2e_per_kwh"] == pytest.approx(r["gco2e_per_kwh"] * (1 - r["offset_ratio_pct"] / 100))
    assert kinds == {"country": 37, "province": 3, "us": 14}
    for full, r in _table()["cloud_regions"].items():  # GCP rows say their source too (year not given upstream)
        assert r["source"] and "year" in r, full


def test_region_locations_agree_with_the_electricity_price_map():
    prices = yaml.safe_load((files("wattcast.data") / "carbon" / "electricity_prices.yaml").read_text())["cloud_regions"]
    both = [k for k in carbon.CLOUD_REGION_LOCATIONS if k in prices]
    assert len(both) >= 50
    assert {k: carbon.CLOUD_REGION_LOCATIONS[k][0] for k in both} == {k: prices[k] for k in both}


def test_province_mix_intensity_by_hand():
    per_source = {"coal": 1000, "petroleum": 800, "natural_gas": 700, "hydroelectricity": 20, "nuclear": 30,
                  "solar": 40, "wind": 10}
    mix = {"naturalGas": 10.0, "hydro": 60.0, "nuclear": 20.0, "wind": 5.0, "biomass": 5.0, "tidal": 0.0, "total": 100.0}
    g, unfactored = carbon.province_mix_intensity(mix, per_source)
    assert g == pytest.approx((10 * 700 + 60 * 20 + 20 * 30 + 5 * 10) / 100.0)
    assert unfactored == {"biomass": 5.0}
    # a mix whose total is not 100 (rounding upstream) is divided by its total
    g2, _ = carbon.province_mix_intensity({"naturalGas": 1.0, "total": 50.0}, per_source)
    assert g2 == pytest.approx(14.0)
    with pytest.raises(carbon.CarbonDataError, match="total"):
        carbon.province_mix_intensity({"hydro": 1.0, "total": 0}, per_source)


def test_canadian_regions_come_from_the_2023_province_mix(data_root):
    cc = data_root / "specs" / "codecarbon"
    mix = json.loads((cc / "private_infra_2023_canada_energy_mix.json").read_text())
    per_source = json.loads((cc / "private_infra_carbon_intensity_per_source.json").read_text())
    qc = carbon.province_mix_intensity(mix["quebec"], per_source)[0]
    on = carbon.province_mix_intensity(mix["ontario"], per_source)[0]
    for region, want in (("aws:ca-central-1", qc), ("azure:canadaeast", qc), ("azure:canadacentral", on)):
        g = carbon.grid_intensity(region)
        assert g.kgco2e_per_kwh == pytest.approx(want / 1000, abs=1e-6) and g.year == 2023, region
    assert 0.02 < qc / 1000 < 0.04 and 0.07 < on / 1000 < 0.11  # hydro Quebec, nuclear + gas Ontario


def test_rebuild_refuses_a_snapshot_region_with_no_location(data_root, monkeypatch):
    locs = dict(carbon.CLOUD_REGION_LOCATIONS)
    del locs["azure:westeurope"]
    monkeypatch.setattr(carbon, "CLOUD_REGION_LOCATIONS", locs)
    with pytest.raises(carbon.CarbonDataError, match="azure:westeurope: no location in CLOUD_REGION_LOCATIONS"):
        carbon.build_grid_table(data_root)


def test_cli_regions_and_footprint_with_a_european_cloud_region():
    r = runner.invoke(app, ["regions", "eu-central-1", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [x["region"] for x in rows] == ["aws:eu-central-1"]
    assert rows[0]["kgco2e_per_kwh"] == carbon.grid_intensity("DEU").kgco2e_per_kwh and rows[0]["year"] == 2023
    assert rows[0]["grid_source"].startswith("country DEU (Germany) 2023")
    r = runner.invoke(app, ["footprint", "-d", "h100", "--gpus", "8", "--hours", "10", "--avg-power-w", "500",
                            "--region", "aws:eu-central-1", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["grid_region"] == "aws:eu-central-1" and d["grid_kgco2e_per_kwh"] == pytest.approx(0.38095)
    assert "country DEU (Germany) 2023" in d["sources"]["grid_kgco2e_per_kwh"]
    r_de = runner.invoke(app, ["footprint", "-d", "h100", "--gpus", "8", "--hours", "10", "--avg-power-w", "500",
                               "--region", "DEU", "--json"])
    assert json.loads(r_de.stdout)["operational_tco2e"] == pytest.approx(d["operational_tco2e"], rel=1e-12)


def test_a_country_whose_upstream_figure_is_missing_takes_the_world_average_flagged():
    """CodeCarbon's CAF row reads carbon_intensity 0.0 with 0.15 TWh of hydro generated, a missing value (every other
    fossil-free row is 20-28 g/kWh): the world average stands in, said in the run's notes, not region-specific; no other
    country reads 0."""
    countries = _table()["countries"]
    assert [k for k, r in countries.items() if r["gco2e_per_kwh"] == 0] == []
    row = countries["CAF"]
    assert row["missing"] is True and row["upstream_gco2e_per_kwh"] == 0.0
    g, world = carbon.grid_intensity("CAF"), carbon.world_grid_intensity()
    assert g.kgco2e_per_kwh == world.kgco2e_per_kwh == 0.481 and not g.region_specific
    assert "missing value" in g.note and "--grid-kgco2e-per-kwh" in g.note
    assert carbon.grid_intensity("COD").region_specific and carbon.grid_intensity("COD").note is None
    import wattcast

    fp = wattcast.footprint("H100-SXM5-80GB", 8, 10.0, region="CAF")
    assert fp.operational_tco2e > 0 and fp.grid_kgco2e_per_kwh == 0.481 and any("CAF" in f and "missing value" in f for f in fp.flags)
    r = runner.invoke(app, ["regions", "CAF", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)[0]["grid_region_specific"] is False


def test_rebuild_marks_the_missing_country_figure(data_root):
    table = carbon.build_grid_table(data_root)
    assert table["countries"] == _table()["countries"]  # the shipped rows are the rebuild's
    assert table["countries"]["CAF"]["missing"] and table["countries"]["CAF"]["gco2e_per_kwh"] == 481.0
