"""Grid carbon intensity, embodied-carbon factors and cost defaults for the lifecycle calculator.

Everything here reads small DERIVED tables shipped as package data in ``wattcast/data/carbon/``
(so the calculator works after ``pip install`` with no ``../shared``); ``carbon/ATTRIBUTION.md`` names
the upstream projects and licences. Each figure carries a source string; where no public number
exists the tables say "assumption" and why.

- ``grid_intensity.json``: location-based grid intensity (gCO2e/kWh) per country (ISO 3166-1 alpha-3,
  CodeCarbon's global energy mix = Our World in Data / Ember), per cloud region (CodeCarbon's
  ``cloud/impact.csv``: GCP from Google's region-carbon data at CodeCarbon HEAD; AWS/Azure regions from the
  2023-05-16 version, each re-derived from where it is (:data:`CLOUD_REGION_LOCATIONS`): its country's row outside
  the US and Canada, the 2023 province mix in Canada, the snapshot's eGRID figure in the US; source and year per
  row) and Nordic bidding zones (CodeCarbon, ENTSO-E).
  Regenerate with ``python -m wattcast.data.carbon --rebuild PATH/TO/shared/datasets``.
- ``embodied_factors.yaml``: ACT (facebookresearch/ACT, MIT) fab energy/GHG/material per cm2 per
  process node, DRAM/SSD per GB, materials per kg, PCB per m2 and layer; plus the stated server-share
  assumptions.
- ``costs.yaml``: the global electricity price default, server/network/facility CapEx, lifetime, PUE and
  reliability defaults.
- ``electricity_prices.yaml``: industrial / non-household electricity price per country, US state and Canadian
  province (EIA, Eurostat, national sources; FX rate stated where converted), and the state or country of each
  cloud region (:func:`electricity_price`).
- ``cloud_prices.yaml``: cloud list prices per GPU-hour, on-demand and 1-/3-year commitments, per device and
  provider (:func:`cloud_price`).

Units live in the names: ``*_kgco2e_per_kwh``, ``*_kgco2e_per_cm2``, ``*_usd_per_kwh`` ...
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Mapping

import yaml

from wattcast.data.checks import close_names

__all__ = [
    "PRICING_PLANS",
    "CarbonDataError",
    "CLOUD_REGION_LOCATIONS",
    "CloudPrice",
    "ElectricityPrice",
    "Factor",
    "GridIntensity",
    "UnknownRegionError",
    "accelerator_price_usd",
    "act_node_nm",
    "build_grid_table",
    "check_pricing",
    "cloud_price",
    "cloud_usd_per_gpu_hour",
    "cost_defaults",
    "electricity_price",
    "fab_kgco2e_per_cm2",
    "grid_intensity",
    "list_regions",
    "material_kgco2e_per_kg",
    "memory_kgco2e_per_gb",
    "pcb_kgco2e_per_m2",
    "province_mix_intensity",
    "server_defaults",
    "ssd_kgco2e_per_gb",
    "world_grid_intensity",
]


class CarbonDataError(ValueError):
    """A carbon/cost table is missing, malformed, or has no figure for what was asked."""


class UnknownRegionError(CarbonDataError):
    """A region name matches no country, cloud region or grid zone in the shipped table."""


@dataclass(frozen=True)
class Factor:
    """One figure with its unit, its citation, and whether it is a stated assumption."""

    value: float
    unit: str
    source: str
    assumption: bool = False

    def __float__(self) -> float:
        return float(self.value)


@dataclass(frozen=True)
class GridIntensity:
    """Grid carbon intensity for one region. ``basis``: location | market | explicit."""

    region: str
    name: str
    kgco2e_per_kwh: float
    basis: str
    source: str
    year: int | None = None
    #: said in a run's notes when the figure is not the region's own (a zone given its country's figure)
    note: str | None = None
    #: False when the figure is not a region's own: the world average, asked for as ``world`` or standing in for a
    #: country whose upstream figure is missing (:func:`missing_country_rows`). The one definition every output uses
    #: (``wattcast regions``, a run's ``grid_region_specific``; until stop 58 ``regions`` said True for ``world``
    #: while a search row said False, audit 58c finding 6)
    region_specific: bool = True
    #: a market-based figure (``basis`` market): the region's location-based figure (kgCO2e/kWh) and the provider's
    #: declared renewable-matching share it is derived from (CodeCarbon ``offsetRatio``, percent); None otherwise
    location_kgco2e_per_kwh: float | None = None
    offset_ratio_pct: float | None = None


# ------------------------------------------------------------------------------------ loading
def _pkg_text(name: str) -> str:
    try:
        return (files("wattcast.data") / "carbon" / name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CarbonDataError(
            f"package data wattcast/data/carbon/{name} is missing; reinstall wattcast "
            "(pyproject package-data must include 'carbon/*')"
        ) from None


@functools.lru_cache(maxsize=1)
def _grid() -> dict[str, Any]:
    return json.loads(_pkg_text("grid_intensity.json"))


@functools.lru_cache(maxsize=1)
def _iso_alpha2() -> dict[str, str]:
    """ISO 3166-1 alpha-2 -> alpha-3 for the grid table's countries (``iso3166_alpha2.json``, its source there)."""
    return json.loads(_pkg_text("iso3166_alpha2.json"))["alpha2"]


@functools.lru_cache(maxsize=1)
def _embodied() -> dict[str, Any]:
    return yaml.safe_load(_pkg_text("embodied_factors.yaml"))


@functools.lru_cache(maxsize=1)
def _costs() -> dict[str, Any]:
    return yaml.safe_load(_pkg_text("costs.yaml"))


def _key(s: str) -> str:
    return re.sub(r"[^a-z0-9:]", "", str(s).lower())


@functools.lru_cache(maxsize=1)
def _region_index() -> dict[str, tuple[str, str]]:
    """normalised label -> (table, key). Countries by ISO3, name and ISO 3166-1 alpha-2 code; cloud regions as 'provider:region'
    and bare 'region' when no other provider uses the same name; zones by code; 'world'."""
    g = _grid()
    idx: dict[str, tuple[str, str]] = {"world": ("world", "world")}
    for iso, row in g["countries"].items():
        idx[_key(iso)] = ("countries", iso)
        idx.setdefault(_key(row["name"]), ("countries", iso))
    for alias, iso in g.get("country_aliases", {}).items():
        idx.setdefault(_key(alias), ("countries", iso))
    for code in g["zones"]:
        idx.setdefault(_key(code), ("zones", code))
    for a2, iso in _iso_alpha2().items():  # FR -> FRA (after the zones: FI stays Finland's zone row)
        if iso in g["countries"]:
            idx.setdefault(_key(a2), ("countries", iso))
    bare: dict[str, list[str]] = {}
    for full, row in g["cloud_regions"].items():
        idx[_key(full)] = ("cloud_regions", full)
        for label in (row["region"], *row.get("aliases", [])):
            bare.setdefault(_key(label), []).append(full)
            idx.setdefault(_key(f"{row['provider']}:{label}"), ("cloud_regions", full))
    for k, fulls in bare.items():
        if len(fulls) == 1:
            idx.setdefault(k, ("cloud_regions", fulls[0]))
    return idx


def _exact_key(s: str) -> str:
    """A region label lower-cased with spaces and underscores as hyphens, punctuation kept: the key that tells
    AWS's ``us-east-1`` from GCP's ``us-east1`` (which :func:`_key` folds together)."""
    return re.sub(r"[\s_]+", "-", str(s).strip().lower())


@functools.lru_cache(maxsize=1)
def _bare_cloud_index() -> dict[str, list[str]]:
    """bare cloud region label as its provider writes it (``us-east-1``, ``us-east1``, ``westeurope``) ->
    every ``provider:region`` that uses exactly that label."""
    out: dict[str, list[str]] = {}
    for full, row in _grid()["cloud_regions"].items():
        for label in (row["region"], *row.get("aliases", [])):
            out.setdefault(_exact_key(label), []).append(full)
    return out


def _lookup(region: str) -> tuple[str, str] | None:
    """(table, key) of ``region``: a bare cloud region label matching exactly one provider's spelling wins
    (``us-east-1`` is AWS, ``us-east1`` GCP), then the normalised index."""
    fulls = _bare_cloud_index().get(_exact_key(region), [])
    if len(fulls) == 1:
        return "cloud_regions", fulls[0]
    return _region_index().get(_key(region))


def list_regions(kind: str | None = None) -> list[str]:
    """Canonical region names: ``kind`` in {None, 'country', 'cloud', 'zone'}."""
    g = _grid()
    out: list[str] = []
    if kind in (None, "country"):
        out += sorted(g["countries"])
    if kind in (None, "cloud"):
        out += sorted(g["cloud_regions"])
    if kind in (None, "zone"):
        out += sorted(g["zones"])
    if kind is None:
        out.append("world")
    if kind not in (None, "country", "cloud", "zone"):
        raise CarbonDataError(f"unknown region kind {kind!r}; expected country, cloud or zone")
    return out


def _suggest(region: str) -> str:
    idx = _region_index()
    k = _key(region)
    # cloud regions whose own label is the text as typed (a label several providers use) come first
    names = list(_bare_cloud_index().get(_exact_key(region), []))
    # then those whose label only differs in punctuation (``useast1``: AWS us-east-1 and GCP us-east1)
    names += [f for lab, fulls in _bare_cloud_index().items() if _key(lab) == k for f in fulls if f not in names]
    close = close_names(k, idx, n=5, cutoff=0.6)
    for c in close:
        table, key = idx[c]
        label = key if table != "countries" else f"{key} ({_grid()['countries'][key]['name']})"
        if label not in names:
            names.append(label)
    return ", ".join(names)


def grid_intensity(region: str, *, market_based: bool = False) -> GridIntensity:
    """Grid intensity of ``region`` in kgCO2e/kWh.

    ``region``: a country ISO 3166-1 alpha-3 or alpha-2 code or name (``"FRA"``, ``"FR"``, ``"France"``; ``"UK"``
    is an accepted alias; ``"FI"`` is Finland's grid zone row), a cloud region (``"gcp:us-central1"``, ``"aws:eu-west-1"``, ``"azure:westeurope"``,
    or the bare region name when only one provider uses it), a Nordic bidding zone (``"SE3"``), or
    ``"world"``. Location-based by default. ``market_based=True`` returns the table's market-based
    figure, which exists only for cloud regions (CodeCarbon's ``offsetRatio``: location x (1 - offsetRatio/100),
    a provider-declared renewable-matching proxy, not a published Scope-2 market-based factor); for
    other regions it raises and asks for an explicit market-based factor.
    """
    if region is None or str(region).strip() == "":
        raise UnknownRegionError("empty region; give a country ISO3 code, a cloud region or 'world'")
    hit = _lookup(region)
    if hit is None:
        near = _suggest(region)
        raise UnknownRegionError(
            f"unknown region {region!r}"
            + (f"; close matches: {near}" if near else "")
            + ". Regions are country ISO3 or ISO2 codes or names (e.g. USA, FR, France), cloud regions as provider:region "
            "(e.g. gcp:us-central1, aws:us-east-1, azure:westeurope), Nordic zones (SE1..SE4, NO1..NO5), or 'world'; "
            "or pass an explicit grid intensity (grid_kgco2e_per_kwh / --grid-kgco2e-per-kwh)."
        )
    table, key = hit
    g = _grid()
    row = g[table] if table == "world" else g[table][key]
    if table == "cloud_regions":
        src = row.get("source") or f"{g['sources'][row['snapshot']]}; upstream citation: {row['cite']}"
    else:
        src = row.get("source") or g["sources"][table]
    name = row.get("name") or key
    year = row.get("year")
    if market_based:
        m = row.get("market_gco2e_per_kwh")
        if m is None:
            raise CarbonDataError(
                f"no market-based grid intensity for region {key!r} in the shipped table (market-based figures "
                "exist only for cloud regions); give the market-based factor as grid_kgco2e_per_kwh "
                "(--grid-kgco2e-per-kwh; in Python also LifecycleAssumptions.market_kgco2e_per_kwh)"
            )
        return GridIntensity(key, name, float(m) / 1000.0, "market", f"{src}; {g['sources']['market']}", year,
                             location_kgco2e_per_kwh=float(row["gco2e_per_kwh"]) / 1000.0,
                             offset_ratio_pct=float(row.get("offset_ratio_pct") or 0.0))
    note = None
    if table == "zones" and row.get("placeholder"):
        note = (f"zone {key}: the shipped zone figure ({row['upstream_gco2e_per_kwh']:g} g/kWh, CodeCarbon "
                f"nordic_emissions.json) is a placeholder shared by several zones; {row['country']}'s country average "
                f"{row['gco2e_per_kwh']:g} g/kWh ({year}) is used instead (give --grid-kgco2e-per-kwh for the zone's own)")
    if table == "countries" and row.get("missing"):
        note = (f"region {key} ({name}): the shipped country figure ({row['upstream_gco2e_per_kwh']:g} g/kWh, CodeCarbon "
                f"global_energy_mix.json) is a missing value, not a measurement; the world average "
                f"{row['gco2e_per_kwh']:g} g/kWh is used instead (give --grid-kgco2e-per-kwh for the country's own)")
        return GridIntensity(key, name, float(row["gco2e_per_kwh"]) / 1000.0, "location", src, row.get("year"), note,
                             region_specific=False)
    return GridIntensity(key, name, float(row["gco2e_per_kwh"]) / 1000.0, "location", src, year, note,
                         region_specific=table != "world")


def world_grid_intensity() -> GridIntensity:
    """The default when no region or explicit intensity is given (world average, stated in the table)."""
    return grid_intensity("world")


# ------------------------------------------------------------------------------- embodied factors
def act_node_nm(process_node_nm: float | None) -> tuple[int, str]:
    """The ACT node used for a device node, and why: ACT tabulates 28/20/14/10/8/7/5/3 nm.

    Marketing-name families map to their base node (TSMC N4/4N -> 5, N6 -> 7, 12FFN -> 14, 16 -> 14);
    anything else maps to the nearest tabulated node.
    """
    e = _embodied()["fab"]
    nodes = sorted(int(n) for n in e["nodes"])
    if process_node_nm is None:
        d = int(e["default_node_nm"])
        return d, f"device has no process_node_nm; assumed {d} nm (stated default)"
    n = float(process_node_nm)
    fam = {int(k): int(v) for k, v in e["node_family"].items()}
    if n == int(n) and int(n) in fam:
        m = fam[int(n)]
        return m, (f"{n:g} nm -> ACT {m} nm" + (f" ({e['node_family_note']})" if m != int(n) else ""))
    m = min(nodes, key=lambda x: (abs(x - n), x))
    return m, f"{n:g} nm not tabulated by ACT; nearest ACT node {m} nm"


def fab_kgco2e_per_cm2(process_node_nm: float | None) -> Factor:
    """ACT logic model: carbon per cm2 of die = (CI_fab x EPA + GPA + MPA) / yield, in kgCO2e/cm2."""
    e = _embodied()["fab"]
    node, why = act_node_nm(process_node_nm)
    row = e["nodes"][str(node)] if str(node) in e["nodes"] else e["nodes"][node]
    ci = float(e["ci_fab_gco2e_per_kwh"]["value"])
    y = float(e["fab_yield"]["value"])
    gpa = (float(row["gpa_95_g_per_cm2"]) + float(row["gpa_99_g_per_cm2"])) / 2.0
    g_per_cm2 = (ci * float(row["epa_kwh_per_cm2"]) + gpa + float(row["mpa_g_per_cm2"])) / y
    src = (
        f"ACT logic model (CI_fab x EPA + GPA + MPA)/yield at {node} nm: EPA {row['epa_kwh_per_cm2']} kWh/cm2 "
        f"(ACT logic/epa.yaml), GPA {gpa:g} g/cm2 = mean of 95%/99% abatement (logic/gpa_95.yaml, gpa_99.yaml), "
        f"MPA {row['mpa_g_per_cm2']} g/cm2 (logic/materials.yaml), CI_fab {ci:g} g/kWh ({e['ci_fab_gco2e_per_kwh']['source']}), "
        f"yield {y:g} ({e['fab_yield']['source']}); {why}"
    )
    return Factor(g_per_cm2 / 1000.0, "kgCO2e/cm2", src, assumption=process_node_nm is None)


def memory_kgco2e_per_gb(memory_type: str | None) -> Factor:
    """Embodied carbon per GB of device memory. HBM and GDDR are treated as DRAM-class (ACT has no
    HBM/GDDR factor): the ACT DRAM factor of its most recent tabulated node."""
    m = _embodied()["memory"]
    t = (memory_type or "").strip().lower()
    fam = "dram"
    for prefix, f in m["type_prefix"].items():
        if t.startswith(prefix):
            fam = f
            break
    row = m["factors"][fam]
    note = row["source"]
    if memory_type is None:
        note += "; device has no memory_type, DRAM-class assumed"
    elif fam != "dram" or not t.startswith(("ddr", "lpddr")):
        note += f"; {memory_type} treated as DRAM-class ({m['hbm_note']})"
    return Factor(float(row["g_per_gb"]) / 1000.0, "kgCO2e/GB", note, assumption=True)


def ssd_kgco2e_per_gb() -> Factor:
    row = _embodied()["storage"]["ssd"]
    return Factor(float(row["g_per_gb"]) / 1000.0, "kgCO2e/GB", row["source"])


def material_kgco2e_per_kg(name: str) -> Factor:
    mats = _embodied()["materials"]
    if name not in mats:
        raise CarbonDataError(f"unknown material {name!r}; known: {', '.join(sorted(mats))}")
    row = mats[name]
    return Factor(float(row["kg_per_kg"]), "kgCO2e/kg", row["source"])


def pcb_kgco2e_per_m2(layers: int) -> Factor:
    """ACT PCB model: tabulated 2/4/6/8 layers; above that the per-layer slope (cpla) x layers."""
    p = _embodied()["pcb"]
    layers = int(layers)
    if layers <= 0:
        raise CarbonDataError(f"PCB layers must be positive, got {layers}")
    tab = {int(k): float(v) for k, v in p["kg_per_m2_by_layers"].items()}
    if layers in tab:
        return Factor(tab[layers], "kgCO2e/m2", f"ACT materials/pcb.yaml, {layers} layers")
    v = float(p["cpla_kg_per_m2_per_layer"]) * layers
    return Factor(v, "kgCO2e/m2", f"ACT materials/pcb.yaml cpla {p['cpla_kg_per_m2_per_layer']} kg/m2 per layer x {layers} layers")


def server_defaults() -> dict[str, Factor]:
    """The stated per-server bill of materials used for the host/server embodied share."""
    s = _embodied()["server"]
    return {k: Factor(float(v["value"]), v["unit"], v["source"], bool(v.get("assumption", False))) for k, v in s.items()}


# ------------------------------------------------------------------------------------- costs
def cost_defaults() -> dict[str, Factor]:
    """Every scalar default in costs.yaml (lifecycle, prices, reliability) as a Factor."""
    c = _costs()["defaults"]
    return {k: Factor(float(v["value"]), v["unit"], v["source"], bool(v.get("assumption", False))) for k, v in c.items()}


def accelerator_price_usd(spec) -> Factor:
    """Purchase price of one accelerator: the spec's ``launch_price_usd``; else a sibling's cited price
    from costs.yaml; else a stated USD-per-TDP-watt fallback (flagged as an assumption)."""
    if getattr(spec, "launch_price_usd", None):
        return Factor(float(spec.launch_price_usd), "USD", spec.source_of("launch_price_usd"))
    fb = _costs()["accelerator_price_fallback"]
    name = getattr(spec, "name", "")
    if name in fb:
        return Factor(float(fb[name]["usd"]), "USD", fb[name]["source"], assumption=True)
    per_w = cost_defaults()["accelerator_usd_per_tdp_w"]
    tdp = getattr(spec, "tdp_w", None)
    if not tdp:
        raise CarbonDataError(
            f"device {name!r} has no launch_price_usd and no tdp_w: add launch_price_usd (or tdp_w) to the spec "
            "file (in Python, LifecycleAssumptions(accelerator_price_usd=...) also works)"
        )
    return Factor(per_w.value * float(tdp), "USD",
                  f"no price for {name}: {per_w.value:g} USD/W x TDP {tdp:g} W ({per_w.source})", assumption=True)


#: cloud pricing plans (``--pricing``): pay as you go, 1-year and 3-year commitments (cloud_prices.yaml)
PRICING_PLANS = ("on-demand", "reserved-1y", "reserved-3y")


def check_pricing(pricing: str, name: str = "pricing (--pricing)") -> str:
    """A cloud pricing plan, normalised (``On_Demand`` -> ``on-demand``); anything else is a CarbonDataError naming
    ``name`` and listing the plans."""
    if isinstance(pricing, str):
        p = re.sub(r"[\s_]+", "-", pricing.strip().lower())
        if p in PRICING_PLANS:
            return p
    raise CarbonDataError(f"unknown {name} {pricing!r}; valid: {', '.join(PRICING_PLANS)}")


@functools.lru_cache(maxsize=1)
def _cloud_prices() -> dict[str, Any]:
    t = yaml.safe_load(_pkg_text("cloud_prices.yaml"))
    if tuple(t.get("plans", ())) != PRICING_PLANS:
        raise CarbonDataError(f"cloud_prices.yaml: plans must be {list(PRICING_PLANS)}, got {t.get('plans')!r}")
    return t


@dataclass(frozen=True)
class CloudPrice:
    """One cloud list price per GPU-hour: ``provider``'s ``instance`` under ``pricing``, listed in ``list_region``."""

    device: str
    provider: str
    instance: str
    pricing: str
    usd_per_gpu_hour: float
    list_region: str
    source: str
    approximate: bool = False
    #: the run's region (a cloud region) is the list region: the price is that region's own
    region_specific: bool = False


def _plan_is_approximate(offer: Mapping[str, Any], pricing: str, where: str) -> bool:
    """Whether ``offer``'s ``pricing`` figure is still unverified: ``approximate`` is a bool for the whole offer or
    the list of plans that are (the others were checked against a cited source, named in ``verified``)."""
    flag = offer.get("approximate", False)
    if isinstance(flag, bool):
        return flag
    if isinstance(flag, list) and all(p in PRICING_PLANS for p in flag):
        return pricing in flag
    raise CarbonDataError(f"cloud_prices.yaml: {where}.approximate must be true/false or a list of plans "
                          f"({', '.join(PRICING_PLANS)}), got {flag!r}")


def cloud_price(device_name: str | None, pricing: str = "on-demand", region: str | None = None,
                notes: list[str] | None = None) -> CloudPrice | None:
    """The cloud price per GPU-hour of a catalog device under ``pricing`` (:data:`PRICING_PLANS`): the offer of
    ``region``'s provider when ``region`` is a cloud region and that provider has an offer with this plan, else the
    device's default offer (AWS us-east-1); None when neither has a price. Why a price is not the region's own (or is
    missing) is appended to ``notes``."""
    pricing = check_pricing(pricing)
    notes = notes if notes is not None else []
    row = _cloud_prices()["devices"].get(device_name or "")
    if row is None:
        notes.append(f"no cloud price for {device_name or 'this device'} in the shipped table: cloud cost unknown; give "
                     "cloud_usd_per_gpu_hour (--cloud-usd-per-gpu-hour)")
        return None
    offers = row.get("offers", {})
    hit = _lookup(region) if region else None
    cloud_region = hit[1] if hit and hit[0] == "cloud_regions" else None
    provider = cloud_region.split(":", 1)[0] if cloud_region else None
    chosen = None
    if provider and pricing in offers.get(provider, {}).get("usd_per_gpu_hour", {}):
        chosen = provider
    else:
        dflt = row.get("default")
        if dflt and pricing in offers.get(dflt, {}).get("usd_per_gpu_hour", {}):
            chosen = dflt
            if provider and provider != dflt:
                notes.append(f"no {provider} {pricing} price for {device_name} in the shipped table: {dflt}'s "
                             f"{offers[dflt]['list_region']} price used for region {cloud_region}")
    if chosen is None:
        have = "; ".join(f"{prov} {', '.join(o.get('usd_per_gpu_hour', {}))}" for prov, o in offers.items())
        notes.append(f"no {pricing} cloud price for {device_name}" + (f" in {region}" if region else "")
                     + (f" (the table has {have}: give a region of that provider)" if have else "")
                     + ": cloud cost unknown; or give cloud_usd_per_gpu_hour (--cloud-usd-per-gpu-hour)")
        return None
    o = offers[chosen]
    specific = cloud_region is not None and cloud_region == o["list_region"]
    approximate = _plan_is_approximate(o, pricing, f"{device_name}.{chosen}")
    src = (f"{o['source']} ({pricing}, {o['instance']}, list region {o['list_region']}, {o['date']}"
           + (f"; {o['derived']}" if o.get("derived") else "")
           + ("; approximate: recorded without re-reading the price list, verify" if approximate else "") + ")")
    if region and not specific and provider in (chosen, None):
        notes.append(f"cloud price is {chosen}'s {o['list_region']} list price, not region-specific for {region}")
    return CloudPrice(device_name, chosen, o["instance"], pricing, float(o["usd_per_gpu_hour"][pricing]),
                      o["list_region"], src, approximate, specific)


def cloud_usd_per_gpu_hour(device_name: str | None, pricing: str = "on-demand", region: str | None = None) -> Factor | None:
    """Cloud price per GPU-hour for a catalog device (on-demand by default, :func:`cloud_price`), or None when the
    table has none."""
    if not device_name:
        return None
    cp = cloud_price(device_name, pricing, region)
    if cp is None:
        return None
    return Factor(cp.usd_per_gpu_hour, "USD/GPU-hour", cp.source, assumption=True)


# --------------------------------------------------------------------------- electricity prices
@functools.lru_cache(maxsize=1)
def _electricity() -> dict[str, Any]:
    return yaml.safe_load(_pkg_text("electricity_prices.yaml"))


@dataclass(frozen=True)
class ElectricityPrice:
    """The electricity price of a region (USD/kWh): ``location`` is the US state (``US-VA``), Canadian province
    (``CA-QC``) or country (ISO3) whose tariff it is; ``converted`` when typed in another currency."""

    region: str
    location: str
    name: str
    usd_per_kwh: float
    year: str
    source: str
    approximate: bool = False
    converted: bool = False


def _price_row(location: str) -> tuple[dict[str, Any], str] | None:
    t = _electricity()
    if location.startswith("US-"):
        row = t["states"].get(location[3:])
    elif location.startswith("CA-"):
        row = t["provinces"].get(location[3:])
    else:
        row = t["countries"].get(location)
        if row is not None and "name" not in row:
            row = dict(row, name=_grid()["countries"].get(location, {}).get("name", location))
    return None if row is None else (row, location)


def electricity_price(region: str) -> ElectricityPrice | None:
    """The shipped electricity price of ``region`` (a country, cloud region or grid zone as :func:`grid_intensity`
    takes): the row of its country, or of the state / province a cloud region sits in; None when the table has no
    row for it (the caller falls back to the global default and says so). An unknown region name raises
    :class:`UnknownRegionError` (the same message as :func:`grid_intensity`)."""
    hit = _lookup(region) if region is not None and str(region).strip() else None
    if hit is None:
        grid_intensity(region)  # raises, naming close matches
        return None
    table, key = hit
    t = _electricity()
    location = {"countries": key, "cloud_regions": t["cloud_regions"].get(key), "zones": t.get("zones", {}).get(key),
                "world": None}[table]
    if location is None:
        return None
    got = _price_row(location)
    if got is None:
        return None
    row, location = got
    src = f"{row['source']} ({row['name']}, {row['year']})"
    if table != "countries":
        src = f"{key} -> {location}: {src}"
    if "usd_per_kwh" in row:
        usd, converted = float(row["usd_per_kwh"]), False
    else:
        fx = t["fx_usd_per_unit"].get(row["currency"])
        if fx is None:
            raise CarbonDataError(f"electricity_prices.yaml: no FX rate for currency {row['currency']!r} ({location})")
        usd, converted = float(row["local_per_kwh"]) * float(fx["rate"]), True
        src += (f"; {row['local_per_kwh']:g} {row['currency']}/kWh converted at {fx['rate']:g} USD/{row['currency']} "
                f"({fx['period']}, {fx['source']}): approximate conversion")
    if row.get("approximate"):
        src += "; approximate: typed in without re-reading the release, verify"
    return ElectricityPrice(key, location, str(row["name"]), usd, str(row["year"]), src, bool(row.get("approximate")),
                            converted)


# ------------------------------------------------------------------------------ table builder
_CC = "specs/codecarbon"

_AWS_REGIONS_DOC = "AWS Regions and Availability Zones, docs.aws.amazon.com/global-infrastructure/latest/regions/aws-regions.html"
_AWS_CN_DOC = "AWS China regions, Beijing operated by Sinnet and Ningxia by NWCD, amazonaws.cn region list"
_AZURE_REGIONS_DOC = "Azure regions list with physical location per region, learn.microsoft.com/azure/reliability/regions-list"

#: Where each AWS/Azure region of CodeCarbon's 2023-05-16 snapshot is: ``provider:region`` -> (location, place, doc).
#: location is a country ISO3 (its grid row is the country's), ``CA-QC`` / ``CA-ON`` (province mix, 2023) or ``US-xx``
#: (the snapshot's eGRID figure is kept). The same codes as ``cloud_regions`` in electricity_prices.yaml (a test
#: checks they agree). A snapshot region missing here stops the rebuild, so no row keeps an old figure unnoticed.
CLOUD_REGION_LOCATIONS: dict[str, tuple[str, str, str]] = {
    "aws:ap-east-1": ("HKG", "Hong Kong", _AWS_REGIONS_DOC),
    "aws:ap-northeast-1": ("JPN", "Tokyo, Japan", _AWS_REGIONS_DOC),
    "aws:ap-northeast-2": ("KOR", "Seoul, South Korea", _AWS_REGIONS_DOC),
    "aws:ap-northeast-3": ("JPN", "Osaka, Japan", _AWS_REGIONS_DOC),
    "aws:ap-south-1": ("IND", "Mumbai, India", _AWS_REGIONS_DOC),
    "aws:ap-southeast-1": ("SGP", "Singapore", _AWS_REGIONS_DOC),
    "aws:ap-southeast-2": ("AUS", "Sydney, Australia", _AWS_REGIONS_DOC),
    "aws:ca-central-1": ("CA-QC", "Montreal, Quebec, Canada", _AWS_REGIONS_DOC),
    "aws:cn-north-1": ("CHN", "Beijing, China", _AWS_CN_DOC),
    "aws:cn-northwest-1": ("CHN", "Ningxia, China", _AWS_CN_DOC),
    "aws:eu-central-1": ("DEU", "Frankfurt, Germany", _AWS_REGIONS_DOC),
    "aws:eu-north-1": ("SWE", "Stockholm, Sweden", _AWS_REGIONS_DOC),
    "aws:eu-west-1": ("IRL", "Ireland", _AWS_REGIONS_DOC),
    "aws:eu-west-2": ("GBR", "London, United Kingdom", _AWS_REGIONS_DOC),
    "aws:eu-west-3": ("FRA", "Paris, France", _AWS_REGIONS_DOC),
    "aws:sa-east-1": ("BRA", "Sao Paulo, Brazil", _AWS_REGIONS_DOC),
    "aws:us-east-1": ("US-VA", "Northern Virginia, US", _AWS_REGIONS_DOC),
    "aws:us-east-2": ("US-OH", "Ohio, US", _AWS_REGIONS_DOC),
    "aws:us-gov-east-1": ("US-OH", "AWS GovCloud (US-East), Ohio, US", _AWS_REGIONS_DOC),
    "aws:us-gov-west-1": ("US-OR", "AWS GovCloud (US-West), Oregon, US", _AWS_REGIONS_DOC),
    "aws:us-west-1": ("US-CA", "Northern California, US", _AWS_REGIONS_DOC),
    "aws:us-west-2": ("US-OR", "Oregon, US", _AWS_REGIONS_DOC),
    "azure:australiacentral": ("AUS", "Canberra, Australia", _AZURE_REGIONS_DOC),
    "azure:australiacentral2": ("AUS", "Canberra, Australia", _AZURE_REGIONS_DOC),
    "azure:australiaeast": ("AUS", "New South Wales, Australia", _AZURE_REGIONS_DOC),
    "azure:australiasoutheast": ("AUS", "Victoria, Australia", _AZURE_REGIONS_DOC),
    "azure:brazilsouth": ("BRA", "Sao Paulo State, Brazil", _AZURE_REGIONS_DOC),
    "azure:canadacentral": ("CA-ON", "Toronto, Ontario, Canada", _AZURE_REGIONS_DOC),
    "azure:canadaeast": ("CA-QC", "Quebec City, Quebec, Canada", _AZURE_REGIONS_DOC),
    "azure:centralindia": ("IND", "Pune, India", _AZURE_REGIONS_DOC),
    "azure:centralus": ("US-IA", "Iowa, US", _AZURE_REGIONS_DOC),
    "azure:eastasia": ("HKG", "Hong Kong", _AZURE_REGIONS_DOC),
    "azure:eastus": ("US-VA", "Virginia, US", _AZURE_REGIONS_DOC),
    "azure:eastus2": ("US-VA", "Virginia, US", _AZURE_REGIONS_DOC),
    "azure:francecentral": ("FRA", "Paris, France", _AZURE_REGIONS_DOC),
    "azure:francesouth": ("FRA", "Marseille, France", _AZURE_REGIONS_DOC),
    "azure:japaneast": ("JPN", "Tokyo, Saitama, Japan", _AZURE_REGIONS_DOC),
    "azure:japanwest": ("JPN", "Osaka, Japan", _AZURE_REGIONS_DOC),
    "azure:koreacentral": ("KOR", "Seoul, South Korea", _AZURE_REGIONS_DOC),
    "azure:koreasouth": ("KOR", "Busan, South Korea", _AZURE_REGIONS_DOC),
    "azure:northcentralus": ("US-IL", "Illinois, US", _AZURE_REGIONS_DOC),
    "azure:northeurope": ("IRL", "Ireland", _AZURE_REGIONS_DOC),
    "azure:southafricanorth": ("ZAF", "Johannesburg, South Africa", _AZURE_REGIONS_DOC),
    "azure:southafricawest": ("ZAF", "Cape Town, South Africa", _AZURE_REGIONS_DOC),
    "azure:southcentralus": ("US-TX", "Texas, US", _AZURE_REGIONS_DOC),
    "azure:southeastasia": ("SGP", "Singapore", _AZURE_REGIONS_DOC),
    "azure:southindia": ("IND", "Chennai, India", _AZURE_REGIONS_DOC),
    "azure:uksouth": ("GBR", "London, United Kingdom", _AZURE_REGIONS_DOC),
    "azure:ukwest": ("GBR", "Cardiff, United Kingdom", _AZURE_REGIONS_DOC),
    "azure:westcentralus": ("US-WY", "Wyoming, US", _AZURE_REGIONS_DOC),
    "azure:westeurope": ("NLD", "Netherlands", _AZURE_REGIONS_DOC),
    "azure:westindia": ("IND", "Mumbai, India", _AZURE_REGIONS_DOC),
    "azure:westus": ("US-CA", "California, US", _AZURE_REGIONS_DOC),
    "azure:westus2": ("US-WA", "Washington, US", _AZURE_REGIONS_DOC),
}

_GCP_HEAD_SOURCE = "CodeCarbon codecarbon/data/cloud/impact.csv @b05965e (MIT): GCP regions, Google region-carbon data"

#: Canadian province codes of CLOUD_REGION_LOCATIONS -> the province's key in canada_energy_mix.json
_CA_PROVINCES = {"CA-QC": "quebec", "CA-ON": "ontario"}
#: canada_energy_mix.json source key -> carbon_intensity_per_source.json key (the sources that file has a factor for)
_MIX_FACTOR_KEYS = {"coal": "coal", "petroleum": "petroleum", "naturalGas": "natural_gas", "hydro": "hydroelectricity",
                    "nuclear": "nuclear", "solar": "solar", "wind": "wind"}


def province_mix_intensity(mix: Mapping[str, float], per_source: Mapping[str, Any]) -> tuple[float, dict[str, float]]:
    """Grid intensity (gCO2e/kWh) of a generation mix in percent (CodeCarbon's canada_energy_mix.json row) with the
    per-source intensities of carbon_intensity_per_source.json: sum(share x factor) / total. Returns the intensity and
    the share (percent) of the sources that file has no factor for (biomass, tidal, other), which count as zero."""
    total = float(mix["total"])
    if not total > 0:
        raise CarbonDataError(f"energy mix total must be positive, got {mix['total']!r}")
    g = sum(float(mix.get(k, 0.0)) * float(per_source[f]) for k, f in _MIX_FACTOR_KEYS.items()) / total
    unfactored = {k: float(v) for k, v in mix.items() if k not in _MIX_FACTOR_KEYS and k != "total" and float(v) > 0}
    return g, unfactored


def build_grid_table(data_root: str | Path) -> dict[str, Any]:
    """Re-derive ``grid_intensity.json`` from the public CodeCarbon files under ``data_root``.

    Keeps only what the calculator needs (intensity, year, names, offset ratio); values are unchanged
    from the source (gCO2e/kWh).
    """
    import csv

    root = Path(data_root)
    mix = json.loads((root / _CC / "private_infra_global_energy_mix.json").read_text(encoding="utf-8"))
    countries = {
        iso: {"name": r["country_name"], "gco2e_per_kwh": float(r["carbon_intensity"]), "year": int(r["year"])}
        for iso, r in sorted(mix.items())
        if r.get("carbon_intensity") is not None and math.isfinite(float(r["carbon_intensity"]))
    }
    countries.update(missing_country_rows(mix, countries))

    def rows(name: str) -> list[dict[str, str]]:
        with open(root / _CC / name, encoding="utf-8-sig", newline="") as fh:
            return list(csv.DictReader(fh))

    cloud: dict[str, dict[str, Any]] = {}

    def add(r: dict[str, str], snapshot: str) -> None:
        impact = float(r["impact"])
        ratio = float(r["offsetRatio"] or 0)
        full = f"{r['provider']}:{r['region']}"
        entry: dict[str, Any] = {
            "provider": r["provider"], "region": r["region"],
            "name": " ".join(x for x in (r.get("regionName") or "", r.get("city") or "", r.get("country_name") or "") if x).strip(),
            "gco2e_per_kwh": impact,
            "offset_ratio_pct": ratio,
            "market_gco2e_per_kwh": round(impact * (1.0 - ratio / 100.0), 6),
            "snapshot": snapshot,
            "cite": (r.get("source") or "none given").strip(),
        }
        if r["region"] == "me-cenrtal1":  # upstream typo kept as the key; the real name is an alias
            entry["aliases"] = ["me-central1"]
        cloud[full] = entry

    for r in rows("cloud_impact_gcp_HEAD.csv"):
        add(r, "gcp_head")
        cloud[f"{r['provider']}:{r['region']}"].update(
            source=f"{_GCP_HEAD_SOURCE}; upstream citation: {(r.get('source') or 'none given').strip()}; "
                   "data year not given upstream", year=None)
    per_source = json.loads((root / _CC / "private_infra_carbon_intensity_per_source.json").read_text(encoding="utf-8"))
    canada = json.loads((root / _CC / "private_infra_2023_canada_energy_mix.json").read_text(encoding="utf-8"))
    for r in rows("cloud_impact_gcp_aws_azure_2023-05-16_8277eb67.csv"):
        if r["provider"] in ("aws", "azure"):
            add(r, "aws_azure_2023")
            full = f"{r['provider']}:{r['region']}"
            if full not in CLOUD_REGION_LOCATIONS:
                raise CarbonDataError(f"{full}: no location in CLOUD_REGION_LOCATIONS (data/carbon.py); add where the "
                                      "region is (country ISO3, CA-xx or US-xx) with the provider's region doc")
            _relocate(cloud[full], *CLOUD_REGION_LOCATIONS[full], countries=countries, canada=canada,
                      per_source=per_source)
    nordic = json.loads((root / _CC / "private_infra_nordic_emissions.json").read_text(encoding="utf-8"))
    zones = zone_rows(nordic["data"], countries)
    world = _world_entry()
    return {
        "_about": "DERIVED table for wattcast: grid carbon intensity in gCO2e/kWh (location-based). "
                  "market_gco2e_per_kwh (cloud regions only) = gco2e_per_kwh x (1 - offset_ratio_pct/100), from "
                  "CodeCarbon's offsetRatio column. See ATTRIBUTION.md. Rebuild: python -m wattcast.data.carbon --rebuild DATA_ROOT",
        "sources": {
            "countries": "CodeCarbon codecarbon/data/private_infra/global_energy_mix.json @b05965e (MIT); "
                         "carbon_intensity per country from Our World in Data / Ember energy data, year per row",
            "gcp_head": _GCP_HEAD_SOURCE,
            "aws_azure_2023": "CodeCarbon codecarbon/data/cloud/impact.csv @8277eb6 (2023-05-16, MIT): AWS/Azure region "
                              "list, names and offset ratios (removed upstream later); its 2016-2019 intensities are "
                              "kept only for US regions, every other row takes its location's current figure (row 'source')",
            "canada_provinces": "CodeCarbon codecarbon/data/private_infra/2023/canada_energy_mix.json (MIT): 2023 "
                                "generation mix per province (percent), x carbon_intensity_per_source.json",
            "zones": f"CodeCarbon codecarbon/data/private_infra/nordic_emissions.json (MIT): {nordic['metadata']['source']}",
            "market": "market-based proxy = location x (1 - CodeCarbon offsetRatio/100): the provider's declared share "
                      "matched by renewable purchases/offsets, not a published Scope-2 market-based factor",
        },
        "world": world,
        "country_aliases": {"US": "USA", "UK": "GBR", "United States of America": "USA"},
        "countries": countries,
        "cloud_regions": dict(sorted(cloud.items())),
        "zones": zones,
    }


def missing_country_rows(mix: Mapping[str, Mapping[str, Any]], countries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The country rows whose upstream ``carbon_intensity`` (CodeCarbon global_energy_mix.json, ``mix``) is 0 while the
    same row records generation (``total_TWh`` > 0): a missing value, not a measurement, since every source has a
    nonzero lifecycle intensity (the fossil-free rows of the same file: ALB 24.3, BTN 23.3, COD 24.5, ISL 27.7, LSO 20,
    NPL 24.4, PRY 23.8 g/kWh; CAF, 0.15 TWh of hydro in 2022, reads 0.0). Such a row takes the world average (the
    figure used when no region is given, :func:`_world_entry`) and says so (``missing``, ``upstream_gco2e_per_kwh``,
    ``source``); the lookup flags it in a run's notes and the run is not region-specific. No figure is made up."""
    world = _world_entry()
    out: dict[str, Any] = {}
    for iso, row in countries.items():
        total = float(mix[iso].get("total_TWh") or 0.0)
        if row["gco2e_per_kwh"] == 0.0 and total > 0:
            out[iso] = dict(row, gco2e_per_kwh=float(world["gco2e_per_kwh"]), year=int(world["year"]), missing=True,
                            upstream_gco2e_per_kwh=0.0,
                            source=(f"world average {world['gco2e_per_kwh']:g} g/kWh ({world['source'].split(';')[0]}), "
                                    f"used for {iso}: CodeCarbon global_energy_mix.json gives {row['year']} "
                                    f"carbon_intensity 0 g/kWh with {total:g} TWh generated (a missing value: every "
                                    "fossil-free row of the file has 20-28 g/kWh)"))
    return out


#: the country (ISO 3166-1 alpha-3) of a bidding zone, by the ISO 3166-1 alpha-2 code its name starts with (Nord Pool's
#: zone codes: SE1-SE4 Sweden, NO1-NO5 Norway, FI Finland, DK1-DK2 Denmark)
ZONE_COUNTRIES = {"SE": "SWE", "NO": "NOR", "FI": "FIN", "DK": "DNK"}
#: a figure that this many zones or more share exactly is a placeholder, not a measurement: ENTSO-E averages of
#: different grids never coincide to the gram (CodeCarbon's nordic_emissions.json gives all nine SE and NO zones
#: 18.0 g/kWh, "static emission factors", while its own country rows say Sweden 40.7 and Norway 30.1)
ZONE_PLACEHOLDER_MIN = 3


def zone_country(code: str) -> str | None:
    """The ISO3 country of bidding zone ``code`` (:data:`ZONE_COUNTRIES`), or None."""
    return ZONE_COUNTRIES.get(re.sub(r"\d+$", "", str(code).upper()))


def zone_rows(upstream: Mapping[str, Mapping[str, Any]], countries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``zones`` of the grid table from CodeCarbon's nordic_emissions.json rows (``upstream``). A figure shared by
    :data:`ZONE_PLACEHOLDER_MIN` zones or more is a placeholder: those zones take their country's row (``countries``,
    the same table's country figures) and say so (``placeholder``, ``upstream_gco2e_per_kwh``, ``source``); the
    lookup flags it in a run's notes. A placeholder zone whose country has no row is an error."""
    shared = Counter(float(r["emission_factor"]) for r in upstream.values())
    out: dict[str, Any] = {}
    for code, r in upstream.items():
        g = float(r["emission_factor"])
        row: dict[str, Any] = {"name": ZONE_NAMES.get(code, r["description"]), "gco2e_per_kwh": g, "year": int(r["year"])}
        if shared[g] >= ZONE_PLACEHOLDER_MIN:
            iso = zone_country(code)
            if iso not in countries:
                raise CarbonDataError(f"zone {code}: placeholder figure {g:g} g/kWh and no country row to fall back to "
                                      f"(ZONE_COUNTRIES in data/carbon.py gives {iso!r})")
            c = countries[iso]
            row.update(gco2e_per_kwh=float(c["gco2e_per_kwh"]), year=int(c["year"]), country=iso, placeholder=True,
                       upstream_gco2e_per_kwh=g,
                       source=(f"country {iso} ({c['name']}) {c['year']}: CodeCarbon global_energy_mix.json (Our World "
                               f"in Data / Ember), used for zone {code}: CodeCarbon nordic_emissions.json gives "
                               f"{g:g} g/kWh to {shared[g]} zones alike (a placeholder, not a zone measurement)"))
        out[code] = row
    return out


#: Labels of the Nordic bidding zones that wattcast sets itself instead of CodeCarbon's descriptions, which swap SE3
#: and SE4 ("SE3 Southern Sweden", "SE4 Stockholm region"). Nord Pool's bidding zones (nordpoolgroup.com, "Bidding
#: areas"; Svenska kraftnät's elområden): SE1 Luleå, SE2 Sundsvall, SE3 Stockholm, SE4 Malmö (southern Sweden).
ZONE_NAMES = {
    "SE3": "Sweden Bidding Zone 3 (Stockholm region)",
    "SE4": "Sweden Bidding Zone 4 (Southern Sweden, Malmö)",
}


def _relocate(entry: dict[str, Any], location: str, place: str, doc: str, *, countries: Mapping[str, Any],
              canada: Mapping[str, Any], per_source: Mapping[str, Any]) -> None:
    """Give an AWS/Azure snapshot row the grid intensity of where the region is (in place): the country row outside
    the US and Canada, the 2023 province mix in Canada; US rows keep the snapshot's eGRID figure (the shared data
    has only eGRID 2016 per state, older than the snapshot). Adds location, source, year and the snapshot's figure."""
    snap = float(entry["gco2e_per_kwh"])
    where = f"{place} ({doc})"
    if location.startswith("US-"):
        g, year = snap, None
        src = (f"{location}: kept the CodeCarbon 2023-05-16 snapshot figure (eGRID subregion, edition not stated "
               f"upstream: {entry['cite']}); the shared data has only eGRID 2016 per state (older), none newer; "
               f"location {where}")
    elif location in _CA_PROVINCES:
        prov = _CA_PROVINCES[location]
        if prov not in canada:
            raise CarbonDataError(f"canada_energy_mix.json has no province {prov!r} (needed for {location})")
        g, unfactored = province_mix_intensity(canada[prov], per_source)
        g, year = round(g, 3), 2023
        src = (f"{location}: {prov.title()} 2023 generation mix (CodeCarbon private_infra/2023/canada_energy_mix.json) "
               f"x per-source intensities (CodeCarbon carbon_intensity_per_source.json: coal, petroleum, natural gas, "
               f"hydro, nuclear, solar, wind); no factor there for "
               + ", ".join(f"{k} {v:g}%" for k, v in sorted(unfactored.items()))
               + f" (counted as 0); snapshot had {snap:g} ({entry['cite']}); location {where}")
    else:
        if location not in countries:
            raise CarbonDataError(f"{entry['provider']}:{entry['region']}: country {location!r} has no row in "
                                  "global_energy_mix.json")
        c = countries[location]
        g, year = float(c["gco2e_per_kwh"]), int(c["year"])
        src = (f"country {location} ({c['name']}) {year}: CodeCarbon global_energy_mix.json (Our World in Data / Ember); "
               f"snapshot had {snap:g} ({entry['cite']}); location {where}")
    entry.update(gco2e_per_kwh=g,
                 market_gco2e_per_kwh=round(g * (1.0 - float(entry["offset_ratio_pct"]) / 100.0), 6),
                 location=location, year=year, source=src, snapshot_gco2e_per_kwh=snap)


def _world_entry() -> dict[str, Any]:
    return {
        "name": "World average",
        "gco2e_per_kwh": 481.0,
        "year": 2023,
        "source": "ACT act/models/carbon_intensity/location_2023.yaml 'world' 481 g/kWh (facebookresearch/ACT @abc9fbb, MIT); "
                  "default when no region or explicit intensity is given",
    }


def _dump(table: Mapping[str, Any]) -> str:
    """JSON with one table row per line (small, diff-friendly)."""
    parts = []
    for k, v in table.items():
        if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
            inner = ",\n".join(f"  {json.dumps(kk)}: {json.dumps(vv, ensure_ascii=False)}" for kk, vv in v.items())
            parts.append(f" {json.dumps(k)}: {{\n{inner}\n }}")
        else:
            parts.append(f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def _main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="Rebuild wattcast's derived grid-intensity table from the public data")
    ap.add_argument("--rebuild", metavar="DATA_ROOT", required=True, help="the shared/datasets folder")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "carbon" / "grid_intensity.json"))
    a = ap.parse_args(argv)
    table = build_grid_table(a.rebuild)
    Path(a.out).write_text(_dump(table), encoding="utf-8")
    print(f"wrote {a.out}: {len(table['countries'])} countries, {len(table['cloud_regions'])} cloud regions, "
          f"{len(table['zones'])} zones")


if __name__ == "__main__":
    _main()
