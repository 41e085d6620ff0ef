"""Cost of a run: OpEx (energy at the electricity price), CapEx (accelerators, servers, network and the facility,
amortised) and the cloud view (on-demand or reserved); the electricity price of a region; the purchase price of a spec. Pure functions; units in their names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wattcast.data import carbon as _c
from wattcast.data.device_spec import DeviceSpec
from wattcast.lifecycle.checks import _not_catalog_flag, _pos
from wattcast.lifecycle.energy import amortisation_share, facility_energy_kwh

if TYPE_CHECKING:
    from wattcast.lifecycle.assumptions import LifecycleAssumptions


def opex_usd(energy_kwh: float, pue: float, electricity_usd_per_kwh: float) -> float:
    """Energy cost: IT energy (kWh, before PUE) x PUE x electricity price, in USD."""
    return facility_energy_kwh(energy_kwh, pue) * _pos("electricity_usd_per_kwh", electricity_usd_per_kwh, zero_ok=True)



def capex_breakdown_usd(accelerator_usd: float, gpus: int, run_hours: float, lifetime_years: float,
                        lifetime_utilisation: float = 1.0, *, server_usd_per_gpu: float = 0.0,
                        network_usd_per_gpu: float = 0.0, facility_usd_per_kw: float = 0.0,
                        facility_kw: float = 0.0, facility_lifetime_years: float = 15.0) -> dict[str, float]:
    """CapEx charged to a run, by item (USD): accelerators, servers and network amortised over
    ``lifetime_years``, the facility build-out (``facility_usd_per_kw x facility_kw``) over
    ``facility_lifetime_years``; both at ``lifetime_utilisation``."""
    share = amortisation_share(run_hours, lifetime_years, lifetime_utilisation)
    n = _pos("gpus", gpus)
    fac_share = amortisation_share(run_hours, facility_lifetime_years, lifetime_utilisation)
    return {
        "accelerators_usd": _pos("accelerator_usd", accelerator_usd, zero_ok=True) * n * share,
        "servers_usd": _pos("server_usd_per_gpu", server_usd_per_gpu, zero_ok=True) * n * share,
        "network_usd": _pos("network_usd_per_gpu", network_usd_per_gpu, zero_ok=True) * n * share,
        "facility_usd": (_pos("facility_usd_per_kw", facility_usd_per_kw, zero_ok=True)
                         * _pos("facility_kw", facility_kw, zero_ok=True) * fac_share),
    }


def capex_usd(accelerator_usd: float, gpus: int, run_hours: float, lifetime_years: float,
              lifetime_utilisation: float = 1.0, **kw: float) -> float:
    """Total CapEx charged to a run in USD (sum of :func:`capex_breakdown_usd`)."""
    return sum(capex_breakdown_usd(accelerator_usd, gpus, run_hours, lifetime_years, lifetime_utilisation, **kw).values())


def cloud_usd(gpu_hours: float, usd_per_gpu_hour: float) -> float:
    """The cloud alternative view: GPU-hours x on-demand price, in USD."""
    return _pos("gpu_hours", gpu_hours, zero_ok=True) * _pos("usd_per_gpu_hour", usd_per_gpu_hour, zero_ok=True)



def _accelerator_price(spec: DeviceSpec, catalog_own: bool, flags: list[str]) -> "_c.Factor":
    """The spec's launch price; else the table's price for the catalog name (a sibling's cited price) only
    when ``spec`` is the catalog's own device; else the stated USD-per-TDP-watt rule (flagged)."""
    if getattr(spec, "launch_price_usd", None) or catalog_own or spec.name not in _c._costs()["accelerator_price_fallback"]:
        return _c.accelerator_price_usd(spec)
    flags.append(_not_catalog_flag(spec, "fallback purchase price"))
    per_w = _c.cost_defaults()["accelerator_usd_per_tdp_w"]
    if not spec.tdp_w:
        raise _c.CarbonDataError(
            f"device {spec.name!r} has no launch_price_usd and no tdp_w: add launch_price_usd (or tdp_w) to the spec "
            "file (in Python, LifecycleAssumptions(accelerator_price_usd=...) also works)")
    return _c.Factor(per_w.value * float(spec.tdp_w), "USD",
                     f"no price for this {spec.name} spec: {per_w.value:g} USD/W x TDP {spec.tdp_w:g} W ({per_w.source})",
                     assumption=True)




def accelerator_price_usd_of(spec: DeviceSpec, a: "LifecycleAssumptions", catalog_own: bool, flags: list[str],
                             srcs: dict[str, str]) -> float:
    """Purchase price of one accelerator (USD): given in ``a``, else the spec's launch price or a stated fallback
    (:func:`_accelerator_price`; flagged when assumed). Appends to ``flags`` and ``srcs``."""
    if a.accelerator_price_usd is not None:
        price, srcs["accelerator_price_usd"] = a.accelerator_price_usd, "given"
    else:
        pf = _accelerator_price(spec, catalog_own, flags)
        price, srcs["accelerator_price_usd"] = pf.value, pf.source
        if pf.assumption:
            # with its source (a sibling's price, a rule of USD per W): a search says it once per device, where the
            # sources are not otherwise shown (audit 58c finding 2)
            flags.append(f"no launch price for {spec.name}: assumed USD {pf.value:,.0f} ({pf.source})")
    return price


def cloud_usd_per_gpu_hour_of(spec: DeviceSpec, a: "LifecycleAssumptions", catalog_own: bool, flags: list[str],
                              srcs: dict[str, str]) -> float | None:
    """Cloud price (USD per GPU-hour) under ``a.pricing`` (on-demand by default): given in ``a`` (its source
    ``a.cloud_price_source``, e.g. a cluster spec, else "given"), else the table's price for the catalog's own device
    of that name (the offer of ``a.region``'s provider when it has one, :func:`wattcast.data.carbon.cloud_price`), else
    None (unknown; flagged, also for a spec that merely reuses a catalog name). Appends to ``flags`` and ``srcs``."""
    if a.cloud_usd_per_gpu_hour is not None:
        cph: float | None = a.cloud_usd_per_gpu_hour
        srcs["cloud_usd_per_gpu_hour"] = a.cloud_price_source or "given"
        if a.pricing != "on-demand":
            flags.append(f"cloud price {cph:g} USD/GPU-h as given: pricing {a.pricing} does not change it")
    else:
        notes: list[str] = []
        cp = _c.cloud_price(spec.name, a.pricing, a.region, notes)
        if cp is not None and not catalog_own:
            flags.append(_not_catalog_flag(spec, f"cloud price (USD {cp.usd_per_gpu_hour:g}/GPU-h)")
                         + "; cloud view unknown: give cloud_usd_per_gpu_hour")
            cp = None
        elif catalog_own:
            flags.extend(notes)
        cph = None if cp is None else cp.usd_per_gpu_hour
        if cp is not None:
            srcs["cloud_usd_per_gpu_hour"] = cp.source
    return cph


def electricity_usd_per_kwh_of(a: "LifecycleAssumptions", flags: list[str], srcs: dict[str, str]) -> tuple[float, bool]:
    """The electricity price a run pays (USD/kWh) and whether it is the site's own: given in ``a`` (wins), else
    ``a.region``'s row of the shipped table (:func:`wattcast.data.carbon.electricity_price`), else the global default
    (not region-specific; flagged when a region was given but has no row). Appends to ``flags`` and ``srcs``."""
    if a.electricity_usd_per_kwh is not None:
        srcs["electricity_usd_per_kwh"] = "given"
        return a.electricity_usd_per_kwh, True
    dflt = _c.cost_defaults()["electricity_usd_per_kwh"]
    if a.region:
        ep = _c.electricity_price(a.region)
        if ep is not None:
            srcs["electricity_usd_per_kwh"] = ep.source
            return ep.usd_per_kwh, True
        flags.append(f"no electricity price for region {a.region!r} in the shipped table: global default "
                     f"{dflt.value:g} USD/kWh used (not region-specific; give electricity_usd_per_kwh / "
                     "--electricity-usd-per-kwh)")
        srcs["electricity_usd_per_kwh"] = f"fallback, no price for region {a.region}: {dflt.source}"
        return dflt.value, False
    srcs["electricity_usd_per_kwh"] = dflt.source
    return dflt.value, False


def cluster_node_kw(cluster, kw: dict) -> dict:
    """``kw`` (footprint options) with ``gpus_per_node`` / ``node_gpus`` put in when ``cluster`` is one run on part of
    its nodes' GPUs (``using_gpus_per_node``: ``--gpus-per-node 64`` of an NVL72 rack's 72, named "GB200-NVL72 (64 of 72
    GPUs per node)"), so the run is charged the spares of the nodes it holds; ``kw`` as it is otherwise, or when it
    gives them itself. ``cluster``: a ClusterSpec or None."""
    from wattcast.data.cluster_spec import _partial_node

    name = getattr(cluster, "name", None)
    part = None if name is None or kw.get("gpus_per_node") is not None or kw.get("node_gpus") is not None \
        else _partial_node(name)
    if part is None or part[1] != getattr(cluster, "gpus_per_node", None):
        return kw
    return dict(kw, gpus_per_node=part[1], node_gpus=part[2])


def cluster_cloud_kw(cluster, kw: dict, assumptions: "LifecycleAssumptions | None" = None) -> dict:
    """``kw`` (footprint options) with ``cluster``'s own ``cloud_usd_per_gpu_hour`` and its source put in, when the
    cluster spec carries one and neither ``kw`` nor ``assumptions`` gives a cloud price (an explicit price wins over
    the cluster's, the cluster's over the device table); and with the nodes' spares of a cluster run on part of its
    nodes' GPUs (:func:`cluster_node_kw`). ``cluster``: a ClusterSpec or None. (What a search and
    ``run_of_prediction`` pass a run of ``cluster`` through: the name is kept for them.)"""
    kw = cluster_node_kw(cluster, kw)
    price = getattr(cluster, "cloud_usd_per_gpu_hour", None)
    if price is None or kw.get("cloud_usd_per_gpu_hour") is not None or (
            assumptions is not None and assumptions.cloud_usd_per_gpu_hour is not None):
        return kw
    cite = dict(getattr(cluster, "sources", None) or {}).get("cloud_usd_per_gpu_hour")
    src = (f"cluster spec {cluster.name}: cloud_usd_per_gpu_hour {price:g} "
           f"({cite or 'the spec gives no source for it: sources.cloud_usd_per_gpu_hour'})")
    return dict(kw, cloud_usd_per_gpu_hour=float(price), cloud_price_source=src)
