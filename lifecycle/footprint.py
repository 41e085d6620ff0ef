"""The footprint of one run: :func:`run_footprint` puts the energy and carbon (:mod:`.energy`), cost
(:mod:`.cost`) and goodput (:mod:`.goodput`) formulas together for ``gpus`` accelerators for ``hours`` under one
:class:`~wattcast.lifecycle.assumptions.LifecycleAssumptions` and returns a :class:`RunFootprint`.
:func:`footprint` is the same calculation with the assumptions given as loose options (``pue=``, ``region=``, ...:
what ``wattcast.footprint`` and a search's ``footprint_kw`` pass); :func:`footprint_from_step` and
:func:`run_of_prediction` make a run of predicted steps."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Mapping, Union

from wattcast.data.device_spec import DeviceSpec
from wattcast.lifecycle.assumptions import LifecycleAssumptions, assumptions_from_options
from wattcast.data.checks import exotic_allowed
from wattcast.lifecycle.checks import (PLAUSIBLE, _count, _flag, _pos, _resolve, _utilisation, catalog_spec_matches,
                                      check_avg_power_for_device, check_plausible)
from wattcast.lifecycle.cost import (accelerator_price_usd_of, capex_breakdown_usd, cloud_usd, cloud_usd_per_gpu_hour_of,
                                     cluster_cloud_kw, electricity_usd_per_kwh_of, opex_usd)
from wattcast.lifecycle.energy import (accelerator_power_w, amortisation_share, cci_kgco2e_per_pflop, embodied_kgco2e,
                                       embodied_kgco2e_per_gpu_of, facility_energy_kwh, grid_kgco2e_per_kwh_of,
                                       host_power_w, operational_kgco2e, tcdp_kgco2e_h)
from wattcast.lifecycle.goodput import run_goodput

#: the keys of the ``run`` object (``wattcast predict --json``); other tools rely on exactly these
RUN_KEYS = ("hours", "gpu_hours", "energy_mwh", "operational_tco2e", "embodied_tco2e", "total_tco2e",
            "capex_usd", "opex_usd", "tco_usd", "goodput")

PowerModel = Union[Callable[[float], float], float, int]


# ================================================================================ results
@dataclass(frozen=True)
class RunFootprint:
    """One run's lifecycle footprint. The first ten fields are the ``run`` object (:data:`RUN_KEYS`)."""

    hours: float  # effective wall-clock hours (failure-free hours / goodput)
    gpu_hours: float  # GPUs held (the job's and the spares it leaves idle in its nodes) x hours: what a cloud bills
    energy_mwh: float  # facility energy (IT x PUE)
    operational_tco2e: float
    embodied_tco2e: float
    total_tco2e: float
    capex_usd: float
    opex_usd: float
    tco_usd: float
    goodput: float
    # ---- extras
    device: str
    gpus: int  # the GPUs the job computes on
    ideal_hours: float  # failure-free hours as given
    avg_power_w: float  # per accelerator, as given / modelled (before node overhead)
    node_power_w: float  # per busy accelerator, incl. its host share (avg_power_w + host_power_w)
    power_source: str
    utilisation: float | None
    it_energy_mwh: float
    pue: float
    grid_kgco2e_per_kwh: float
    grid_basis: str  # location | market | explicit
    grid_region: str | None
    electricity_usd_per_kwh: float
    embodied_kgco2e_per_gpu: float  # lifetime, not amortised
    embodied_breakdown_kgco2e_per_gpu: Mapping[str, float]
    amortisation_share: float
    capex_breakdown_usd: Mapping[str, float]
    cloud_usd: float | None
    cloud_usd_per_gpu_hour: float | None
    checkpoint_interval_s: float | None
    system_mtbf_h: float | None
    flops: float | None
    cci_kgco2e_per_pflop: float | None
    tcdp_kgco2e_h: float
    flags: tuple[str, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)
    #: the electricity price is the site's own: the region's row of the shipped table, or one the caller gave
    electricity_region_specific: bool = False
    #: cloud pricing plan of ``cloud_usd_per_gpu_hour`` (on-demand, reserved-1y, reserved-3y)
    pricing: str = "on-demand"
    #: host power per GPU slot (W): ``node_overhead_share x TDP`` (:func:`~wattcast.lifecycle.energy.host_power_w`),
    #: the same under a power limit or clock cap; 0 for a given all-in ``avg_power_w`` (the host is in it)
    host_power_w: float = 0.0
    #: nodes the job occupies (None: not stated; ``gpus_per_node`` / ``node_gpus`` not given)
    nodes: int | None = None
    #: GPUs of each node the job uses, and GPUs each node has (``--gpus-per-node 64`` of an NVL72 rack's 72)
    gpus_per_node: int | None = None
    node_gpus: int | None = None
    #: GPUs of the occupied nodes left idle (spares): bought, made and billed with the run, drawing idle power
    spare_gpus: int = 0
    #: GPUs held: ``gpus + spare_gpus`` (CapEx, embodied carbon, GPU-hours and the provisioned kW count these)
    gpus_held: int = 0
    #: board power of one idle spare GPU (W; its host share is in ``host_power_w``); 0 without spares
    spare_power_w: float = 0.0
    #: GPU-hours of the GPUs that compute (``gpus x hours``; ``gpu_hours`` adds the spares')
    busy_gpu_hours: float = 0.0
    #: IT energy (MWh, before PUE) by part: the busy GPUs, the idle spares, the hosts of every GPU held
    it_energy_breakdown_mwh: Mapping[str, float] = field(default_factory=dict)
    #: purchase price of one accelerator (USD; its source in ``sources['accelerator_price_usd']``)
    accelerator_price_usd: float = 0.0
    #: whether ``hours`` were taken as failure-free and divided by the goodput (failures, checkpoints, restarts:
    #: ``wattcast.lifecycle.footprint`` / ``run_footprint`` by default, and every run of predicted steps) or as measured
    #: wall-clock time, goodput 1 (``wattcast.footprint`` and ``wattcast footprint`` by default)
    goodput_applied: bool = True
    #: the grid intensity is the site's own (a given figure, or the region's row of the table); False for the world
    #: average (asked for, taken by default, or standing in for a missing country figure):
    #: ``wattcast.data.carbon.GridIntensity.region_specific``, as ``wattcast regions`` and a search row say it
    grid_region_specific: bool = False
    #: the grid intensity is a market-based 0 from the shipped table: the cloud provider's own claim of renewable
    #: matching (CodeCarbon offsetRatio 100%), not a grid factor (flagged in ``flags`` too)
    grid_renewable_claim_zero: bool = False
    #: the flags about the device's own figures (its embodied carbon, its purchase price: assumed or approximate), also
    #: in ``flags``; the same for every run of the device under the same assumptions (a search says them once)
    device_flags: tuple[str, ...] = ()

    @property
    def energy_kwh(self) -> float:
        return self.energy_mwh * 1000.0

    @property
    def energy_j(self) -> float:
        """Facility energy of the whole run in joules."""
        return self.energy_mwh * 3.6e9

    def run_dict(self) -> dict[str, float]:
        """Exactly the ``run`` keys of ``wattcast predict --json`` (:data:`RUN_KEYS`)."""
        return {k: float(getattr(self, k)) for k in RUN_KEYS}

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (tuples as lists, mappings as dicts)."""
        d = asdict(self)
        d["flags"] = list(self.flags)
        d["device_flags"] = list(self.device_flags)
        d["embodied_breakdown_kgco2e_per_gpu"] = dict(self.embodied_breakdown_kgco2e_per_gpu)
        d["capex_breakdown_usd"] = dict(self.capex_breakdown_usd)
        d["it_energy_breakdown_mwh"] = dict(self.it_energy_breakdown_mwh)
        d["sources"] = dict(self.sources)
        return d


# ============================================================================== footprint
def run_footprint(device: str | DeviceSpec, gpus: int, hours: float, assumptions: LifecycleAssumptions | None = None, *,
                  avg_power_w: float | None = None, power_model: PowerModel | None = None,
                  utilisation: float | None = None, node_overhead_share: float | None = None,
                  flops: float | None = None, apply_goodput: bool = True, gpus_per_node: int | None = None,
                  node_gpus: int | None = None) -> RunFootprint:
    """Lifecycle footprint of ``gpus`` x ``device`` running for ``hours`` under ``assumptions`` (default: the
    shipped defaults; build one from CLI-style options with :func:`assumptions_from_options`).

    - ``hours``: failure-free run time; with ``apply_goodput`` (default) the effective time is
      ``hours / goodput`` (failures, checkpoints, restarts). Pass ``apply_goodput=False`` when ``hours``
      is a measured wall-clock time (goodput is then reported as 1 and flagged).
    - Power per accelerator, first of: ``avg_power_w`` (all-in system average per accelerator, the
      Patterson convention: node overhead NOT added unless ``node_overhead_share`` is given);
      ``power_model`` (GPU power: a number, or a callable ``f(utilisation) -> W`` called with
      ``utilisation``; node overhead added); else ``default_power_fraction_of_tdp x TDP`` (flagged; node
      overhead added). ``utilisation`` is a fraction of the compute peak, finite and in [0, 1] (0 is
      meaningful: GPUs held but idle draw idle power); anything else is a ValueError naming it.
    - ``node_overhead_share``: the node overhead added to this run's power (None: none on a given
      ``avg_power_w``, ``assumptions.node_overhead_share`` on modelled power), as host power per GPU of
      ``share x TDP`` (:func:`~wattcast.lifecycle.energy.host_power_w`: a power cap lowers the GPU's draw, not the
      host's). The provisioned kW of the facility CapEx uses the given share, else ``assumptions.node_overhead_share``.
    - ``gpus_per_node`` and ``node_gpus`` (both or neither): the job uses ``gpus_per_node`` of each node's
      ``node_gpus`` GPUs (64 of an NVL72 rack's 72, the rest spares). It occupies ``ceil(gpus / gpus_per_node)``
      nodes, whose ``node_gpus - gpus_per_node`` spares each sit idle: they are charged with the run (CapEx,
      embodied carbon, GPU-hours and so the cloud view, the provisioned kW, and their idle power plus host power
      in the energy) and flagged.
    - Grid: ``assumptions.grid_kgco2e_per_kwh`` (explicit) > ``assumptions.region`` (shipped table;
      location-based, or market-based with ``market_based=True``) > world average (flagged).
    - ``flops``: useful FLOPs of the run, for CCI.
    """
    # every parameter checked up front, so a message names what the caller gave (not an internal quantity)
    if assumptions is not None and not isinstance(assumptions, LifecycleAssumptions):
        raise ValueError(f"assumptions must be a LifecycleAssumptions, got {type(assumptions).__name__}")
    # (named with their flags, as check_plausible names them: audit 54f)
    if node_overhead_share is not None:
        _pos("node_overhead_share (--node-overhead-share)", node_overhead_share, zero_ok=True)
    if flops is not None:
        _pos("flops", flops, zero_ok=True)
    _flag("apply_goodput", apply_goodput)
    gpus = _count("gpus", gpus)
    ideal_h = _pos("hours", hours)
    if avg_power_w is not None:
        _pos("avg_power_w (--avg-power-w)", avg_power_w)
    if (gpus_per_node is None) != (node_gpus is None):
        raise ValueError("gpus_per_node (--gpus-per-node) and node_gpus (--node-gpus) go together: the GPUs of each node "
                         "the job uses and the GPUs each node has (64 and 72 on an NVL72 rack with 8 spares)")
    if gpus_per_node is not None:
        gpus_per_node = _count("gpus_per_node (--gpus-per-node)", gpus_per_node)
        node_gpus = _count("node_gpus (--node-gpus)", node_gpus)
        if gpus_per_node > node_gpus:
            raise ValueError(f"gpus_per_node (--gpus-per-node) {gpus_per_node} is more than the node's {node_gpus} GPUs "
                             "(node_gpus, --node-gpus)")
    # (``hours`` is not range-checked here: footprint_from_step passes the computed hours of a long run; the
    # footprint command checks its --hours)
    for k, v in dict(node_overhead_share=node_overhead_share, flops=flops, avg_power_w=avg_power_w).items():
        check_plausible(k, v)
    a = assumptions or LifecycleAssumptions()
    spec = _resolve(device)
    if avg_power_w is not None:
        check_avg_power_for_device(avg_power_w, spec)
    if utilisation is not None:  # a fraction of the compute peak, in [0, 1]; 0: GPUs held idle (idle power)
        utilisation = _utilisation(utilisation)
    flags: list[str] = []
    srcs: dict[str, str] = {}

    # ---- power per accelerator
    p, share, how = accelerator_power_w(spec, a, flags, srcs, avg_power_w=avg_power_w, power_model=power_model,
                                        utilisation=utilisation, node_overhead_share=node_overhead_share)
    # the host's power per GPU slot: share x TDP, whatever the GPU draws (a cap lowers the GPU's power, not the host's)
    if spec.tdp_w:
        host_w = host_power_w(float(spec.tdp_w), share)
    else:
        host_w = p * share
        if share:
            flags.append(f"{spec.name} has no tdp_w: host power taken as {share:g} x the GPU's {p:g} W (not its TDP)")
    p_node = p + host_w

    # ---- the nodes held: the job's GPUs and the spares it leaves idle in them
    nodes = spare = None
    if gpus_per_node is not None:
        nodes = -(-gpus // gpus_per_node)
        spare = nodes * (node_gpus - gpus_per_node)
    spare = spare or 0
    held = gpus + spare
    spare_w = 0.0
    if spare:
        from wattcast.data.device_spec import device_idle_w

        if not spec.tdp_w and not getattr(spec, "idle_power_w", None):
            raise ValueError(f"device {spec.name!r} has neither idle_power_w nor tdp_w: the {spare} spare GPUs' idle "
                             "power is unknown; add idle_power_w to the spec")
        spare_w = float(device_idle_w(spec)[0])
        flags.append(f"{spare} spare GPUs charged: the job occupies {nodes} node(s) of {node_gpus} GPUs and uses "
                     f"{gpus_per_node} of each, so {held} GPUs are held (bought: CapEx; made: embodied carbon; billed: "
                     f"GPU-hours and the cloud view) and the {spare} idle ones draw {spare_w:.0f} W each"
                     + (f" + host {host_w:.0f} W" if host_w else "") + f" ({100.0 * spare / gpus:.1f}% above the "
                     f"job's {gpus} GPUs)")

    # ---- goodput
    g, interval, mtbf_s = run_goodput(a, gpus, apply_goodput, flags, run_s=ideal_h * 3600.0)

    def too_large(what: str, v: float) -> None:
        """Name the caller's hours / gpus / power when a product of them overflows (not an internal field)."""
        if not math.isfinite(v):
            raise ValueError(
                f"hours={hours!r}, gpus={gpus} and {p_node:g} W per GPU are too large together: the run's {what} "
                "overflows (not a finite number); check hours, gpus and avg_power_w / the power model")

    too_large("power per GPU incl. node overhead", p_node)
    eff_h = ideal_h / g
    too_large("effective hours", eff_h)
    try:
        busy_h = float(gpus) * eff_h
        gpu_h = float(held) * eff_h
    except OverflowError:  # more GPUs than a float holds
        busy_h = gpu_h = math.inf
    too_large("GPU-hours", gpu_h)

    # ---- energy and operational carbon: the busy GPUs, the idle spares, the host of every GPU held
    too_large("IT energy (kWh)", gpu_h * p_node / 1000.0 * a.pue)
    e_parts = {"gpus": busy_h * p / 1000.0, "spare_gpus": spare * eff_h * spare_w / 1000.0,
               "hosts": gpu_h * host_w / 1000.0}
    e_it = sum(e_parts.values())
    gc = grid_kgco2e_per_kwh_of(a, flags, srcs)
    grid, basis, greg = gc.kgco2e_per_kwh, gc.basis, gc.region
    op_kg = operational_kgco2e(e_it, a.pue, grid)

    # ---- embodied
    share_h = amortisation_share(eff_h, a.lifetime_years, a.lifetime_utilisation)
    n_before = len(flags)
    per_gpu, breakdown = embodied_kgco2e_per_gpu_of(spec, a, flags, srcs)
    device_flags = flags[n_before:]  # the device's own figures (embodied, then purchase price): a search says them once
    emb_kg = embodied_kgco2e(per_gpu, held, eff_h, a.lifetime_years, a.lifetime_utilisation)
    if share_h > 1:
        flags.append(f"run uses {share_h:.2f} x the hardware's productive lifetime")

    # ---- costs
    catalog_own = catalog_spec_matches(spec)
    n_before = len(flags)
    price = accelerator_price_usd_of(spec, a, catalog_own, flags, srcs)
    device_flags += flags[n_before:]
    # the facility is provisioned for the node's power: a given node overhead counts there too
    share_kw = a.node_overhead_share if node_overhead_share is None else node_overhead_share
    tdp_kw = (spec.tdp_w or p) * (1.0 + share_kw) / 1000.0
    capex = capex_breakdown_usd(price, held, eff_h, a.lifetime_years, a.lifetime_utilisation,
                                server_usd_per_gpu=a.server_usd_per_gpu, network_usd_per_gpu=a.network_usd_per_gpu,
                                facility_usd_per_kw=a.facility_usd_per_kw, facility_kw=held * tdp_kw,
                                facility_lifetime_years=a.facility_lifetime_years)
    cap = sum(capex.values())
    elec, elec_specific = electricity_usd_per_kwh_of(a, flags, srcs)
    opx = opex_usd(e_it, a.pue, elec)
    cph = cloud_usd_per_gpu_hour_of(spec, a, catalog_own, flags, srcs)
    srcs.update({k: v for k, v in a.sources().items() if k not in srcs and v})

    for what, v in (("operational CO2e", op_kg), ("embodied CO2e", emb_kg), ("CapEx", cap), ("OpEx", opx),
                    ("CapEx + OpEx", cap + opx), ("cloud cost", 0.0 if cph is None else gpu_h * cph)):
        too_large(what, v)
    total_kg = op_kg + emb_kg
    too_large("total CO2e", total_kg)
    too_large("carbon-delay product (kgCO2e x h)", total_kg * eff_h)
    cci = None if not flops else cci_kgco2e_per_pflop(total_kg, flops)
    if cci is not None and not math.isfinite(cci):
        raise ValueError(f"flops={flops!r} is too small for the run's {total_kg:g} kgCO2e: carbon per PFLOP overflows")
    return RunFootprint(
        hours=eff_h, gpu_hours=gpu_h, energy_mwh=facility_energy_kwh(e_it, a.pue) / 1000.0,
        operational_tco2e=op_kg / 1000.0, embodied_tco2e=emb_kg / 1000.0, total_tco2e=total_kg / 1000.0,
        capex_usd=cap, opex_usd=opx, tco_usd=cap + opx, goodput=g,
        device=spec.name, gpus=gpus, ideal_hours=ideal_h, avg_power_w=p, node_power_w=p_node, power_source=how,
        utilisation=None if utilisation is None else float(utilisation), it_energy_mwh=e_it / 1000.0, pue=a.pue,
        grid_kgco2e_per_kwh=grid, grid_basis=basis, grid_region=greg, electricity_usd_per_kwh=elec,
        embodied_kgco2e_per_gpu=per_gpu, embodied_breakdown_kgco2e_per_gpu=breakdown, amortisation_share=share_h,
        capex_breakdown_usd=capex, cloud_usd=None if cph is None else cloud_usd(gpu_h, cph), cloud_usd_per_gpu_hour=cph,
        checkpoint_interval_s=interval if apply_goodput else None,
        system_mtbf_h=None if mtbf_s is None else mtbf_s / 3600.0,
        flops=None if flops is None else float(flops),
        cci_kgco2e_per_pflop=cci,
        tcdp_kgco2e_h=tcdp_kgco2e_h(total_kg, eff_h), flags=tuple(flags), sources=srcs,
        electricity_region_specific=elec_specific, pricing=a.pricing, host_power_w=host_w, nodes=nodes,
        gpus_per_node=gpus_per_node, node_gpus=node_gpus, spare_gpus=spare, gpus_held=held, spare_power_w=spare_w,
        busy_gpu_hours=busy_h, it_energy_breakdown_mwh={k: v / 1000.0 for k, v in e_parts.items()},
        accelerator_price_usd=price, goodput_applied=bool(apply_goodput), grid_region_specific=gc.region_specific,
        grid_renewable_claim_zero=gc.renewable_claim_zero, device_flags=tuple(device_flags),
    )


def footprint(device: str | DeviceSpec, gpus: int, hours: float, avg_power_w: float | None = None,
              power_model: PowerModel | None = None, utilisation: float | None = None,
              region: str | None = None, pue: float | None = None, grid_kgco2e_per_kwh: float | None = None,
              flops: float | None = None, *, market_based: bool | None = None, lifetime_years: float | None = None,
              electricity_usd_per_kwh: float | None = None, cloud_usd_per_gpu_hour: float | None = None,
              node_overhead_share: float | None = None, apply_goodput: bool = True,
              assumptions: LifecycleAssumptions | None = None, mtbf_gpu_hours: float | None = None,
              checkpoint_write_s: float | None = None, pricing: str | None = None,
              cloud_price_source: str | None = None, gpus_per_node: int | None = None,
              node_gpus: int | None = None) -> RunFootprint:
    """:func:`run_footprint` with the assumptions given as options: ``region``, ``pue``, ``grid_kgco2e_per_kwh``,
    ``market_based``, ``lifetime_years``, ``electricity_usd_per_kwh``, ``cloud_usd_per_gpu_hour``, ``mtbf_gpu_hours``
    (mean time between failures of one GPU, hours), ``checkpoint_write_s``, ``pricing`` (cloud plan: on-demand,
    reserved-1y, reserved-3y) and ``cloud_price_source`` (where a given cloud price comes from, said in the output)
    replace those of ``assumptions`` (:func:`assumptions_from_options`; a bad one is a ValueError naming it); the other
    parameters are :func:`run_footprint`'s (``gpus_per_node`` / ``node_gpus``: the spares of the nodes held). With ``region`` and no ``electricity_usd_per_kwh``, OpEx uses the region's
    electricity price (``electricity_prices.yaml``; the global default, flagged, where the region has none).
    ``apply_goodput`` is True by default here: ``hours`` are failure-free and the run takes ``hours / goodput``
    (failures, checkpoints, restarts). :func:`wattcast.footprint` (and ``wattcast footprint``) defaults to False:
    ``hours`` measured, goodput 1. The same ``hours`` therefore give different figures unless ``apply_goodput`` is
    passed to one of them; the result's ``goodput_applied`` says which was done."""
    a = assumptions_from_options(assumptions, pue=pue, region=region, grid_kgco2e_per_kwh=grid_kgco2e_per_kwh,
                                 market_based=market_based, lifetime_years=lifetime_years,
                                 electricity_usd_per_kwh=electricity_usd_per_kwh,
                                 cloud_usd_per_gpu_hour=cloud_usd_per_gpu_hour, mtbf_gpu_hours=mtbf_gpu_hours,
                                 checkpoint_write_s=checkpoint_write_s, pricing=pricing,
                                 cloud_price_source=cloud_price_source)
    return run_footprint(device, gpus, hours, a, avg_power_w=avg_power_w, power_model=power_model,
                         utilisation=utilisation, node_overhead_share=node_overhead_share, flops=flops,
                         apply_goodput=apply_goodput, gpus_per_node=gpus_per_node, node_gpus=node_gpus)


def _num(v: float, decimals: int = 1) -> str:
    """``v`` with ``decimals`` decimals (thousands separated), or 3 significant digits where that would print a
    small non-zero figure as 0."""
    if v != 0 and abs(v) < 10 ** -decimals * 10:
        return f"{v:.3g}"
    return f"{v:,.{decimals}f}"


def _energy(mwh: float) -> str:
    """Energy in MWh, or in kWh below 1 MWh (a small run does not print as 0.00 MWh)."""
    return f"{_num(mwh, 2)} MWh" if mwh >= 1.0 else f"{_num(mwh * 1000.0)} kWh"


def _mass(t: float) -> str:
    """CO2e in tonnes, or in kg below 1 t."""
    return f"{_num(t, 2)} t" if t >= 1.0 else f"{_num(t * 1000.0)} kg"


def _usd(v: float) -> str:
    """Dollars, whole above $100, else with cents (a small run's OpEx is not $0)."""
    return f"${v:,.0f}" if v >= 100 else f"${_num(v, 2)}"


def format_footprint(fp: RunFootprint) -> str:
    """A short human-readable summary (what ``wattcast footprint`` without ``--json`` can print). Units scale with
    the run (kWh below 1 MWh, kg below 1 t, cents below $100) so a small run never prints as zero."""
    lines = [
        f"{fp.gpus} x {fp.device}: {_num(fp.hours)} h ("
        + (f"{_num(fp.ideal_hours)} h failure-free, goodput {fp.goodput:.3f}" if fp.goodput_applied else
           "measured wall-clock, goodput not applied") + "), "
        f"{_num(fp.gpu_hours, 0) if fp.gpu_hours >= 10 else _num(fp.gpu_hours, 2)} GPU-h",
        f"power {fp.avg_power_w:,.0f} W/GPU"
        + (f" + host {fp.host_power_w:,.0f} W" if fp.host_power_w else "")
        + f" -> {fp.node_power_w:,.0f} W incl. node [{fp.power_source}]",
        f"energy {_energy(fp.energy_mwh)} (IT {_energy(fp.it_energy_mwh)} x PUE {fp.pue:g})",
        f"grid {fp.grid_kgco2e_per_kwh:.3f} kgCO2e/kWh ({fp.grid_basis}{', ' + fp.grid_region if fp.grid_region else ''}"
        + ("; the provider's renewable claim, not a grid factor: see note" if fp.grid_renewable_claim_zero else "")
        + ("" if fp.grid_region_specific else "; NOT region-specific") + ")",
        f"CO2e: operational {_mass(fp.operational_tco2e)} + embodied {_mass(fp.embodied_tco2e)} = {_mass(fp.total_tco2e)}",
        f"cost: CapEx {_usd(fp.capex_usd)} + OpEx {_usd(fp.opex_usd)} = TCO {_usd(fp.tco_usd)}"
        + (f"  (cloud {fp.pricing} view: {_usd(fp.cloud_usd)} at ${fp.cloud_usd_per_gpu_hour:g}/GPU-h)" if fp.cloud_usd is not None else ""),
        f"electricity {fp.electricity_usd_per_kwh:g} USD/kWh ("
        f"{'site-specific' if fp.electricity_region_specific else 'NOT region-specific'}; "
        f"source: {fp.sources.get('electricity_usd_per_kwh', '')})",
    ]
    if fp.spare_gpus:
        lines.insert(1, f"held: {fp.nodes} node(s) x {fp.node_gpus} GPUs = {fp.gpus_held} GPUs, {fp.gpus_per_node} used "
                        f"per node: {fp.spare_gpus} idle spares at {fp.spare_power_w:,.0f} W each (charged with the run)")
    if fp.cloud_usd is not None:
        lines.append(f"cloud price source ({fp.pricing}): {fp.sources.get('cloud_usd_per_gpu_hour', '')}")
    if fp.cci_kgco2e_per_pflop is not None:
        lines.append(f"CCI {fp.cci_kgco2e_per_pflop:.3g} kgCO2e/PFLOP; tCDP {_num(fp.tcdp_kgco2e_h, 0)} kgCO2e*h")
    else:
        lines.append(f"tCDP {_num(fp.tcdp_kgco2e_h, 0)} kgCO2e*h")
    lines += [f"note: {f}" for f in fp.flags]
    return "\n".join(lines)


def footprint_from_step(device: str | DeviceSpec, gpus: int, *, step_time_ms: float, gpu_power_w: float, tokens: float,
                        tokens_per_step: float, flops_per_step: float | None = None,
                        assumptions: LifecycleAssumptions | None = None, **kw) -> RunFootprint:
    """A training run of ``tokens`` tokens made of predicted steps: ``ceil(tokens / tokens_per_step)`` steps of
    ``step_time_ms`` at ``gpu_power_w`` per GPU (the power surrogate's GPU-only average; node overhead is
    added by :func:`run_footprint`) under ``assumptions``. ``kw``: options of :func:`footprint` (region, pue,
    lifetime_years, node_overhead_share, ...), which replace those of ``assumptions``.
    ``tokens``, ``tokens_per_step``, ``step_time_ms`` and ``gpu_power_w`` must be finite and above 0 (ValueError
    naming the parameter)."""
    tokens = _pos("tokens (run length in tokens, --tokens)", tokens)
    tokens_per_step = _pos("tokens_per_step", tokens_per_step)
    step_time_ms = _pos("step_time_ms", step_time_ms)
    _pos("gpu_power_w", gpu_power_w)
    if flops_per_step is not None:
        flops_per_step = _pos("flops_per_step", flops_per_step, zero_ok=True)
    n = tokens / tokens_per_step
    if not math.isfinite(n):
        raise ValueError(f"tokens={tokens!r} over tokens_per_step={tokens_per_step!r} gives too many steps to represent")
    steps = math.ceil(n)
    hours = steps * step_time_ms / 3.6e6
    if not math.isfinite(hours):
        raise ValueError(f"{steps:g} steps (tokens={tokens!r} / tokens_per_step={tokens_per_step!r}) of "
                         f"step_time_ms={step_time_ms!r} overflow the run's hours; check tokens and step_time_ms")
    flops = flops_per_step * steps if flops_per_step else None
    if flops is not None and not math.isfinite(flops):
        raise ValueError(f"flops_per_step={flops_per_step!r} x {steps:g} steps overflows the run's FLOPs; "
                         "check tokens and flops_per_step")
    if not kw:
        fp = run_footprint(device, gpus, hours, assumptions, power_model=float(gpu_power_w), flops=flops)
    else:
        fp = footprint(device, gpus, hours, power_model=float(gpu_power_w), flops=flops, assumptions=assumptions, **kw)
    if n < 1:  # ceil above: a run shorter than one step is charged one whole step, and says so
        fp = replace(fp, flags=fp.flags + (f"tokens={tokens:g} is fewer than one step's {tokens_per_step:,.0f} tokens: "
                                           "the run is rounded up to one whole step",))
    return fp


def check_run_hours(tokens: float, tokens_per_step: float, step_time_ms: float) -> None:
    """The same bound on a run given in tokens as ``wattcast footprint`` puts on ``--hours`` (:data:`PLAUSIBLE`; lifted
    by --force / allow_exotic): a run of more than 1e6 failure-free hours (114 years) is refused, naming --tokens."""
    try:
        hours = math.ceil(float(tokens) / float(tokens_per_step)) * float(step_time_ms) / 3.6e6
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return  # footprint_from_step names the bad parameter
    lo, hi = PLAUSIBLE["hours"][:2]
    if math.isfinite(hours) and hours > hi and not exotic_allowed():
        raise ValueError(f"tokens (--tokens) is {tokens:g}: {math.ceil(tokens / tokens_per_step):.3g} steps of "
                         f"{step_time_ms:.4g} ms make {hours:.3g} failure-free hours, over {hi:g} (114 years); give the "
                         f"run's tokens (e.g. 1e12, not 1e30), or pass --force (in Python wattcast.allow_exotic()) for "
                         "a deliberately exotic run")


def run_of_prediction(prediction, *, tokens: float, tokens_per_step: float, device: str | DeviceSpec | None = None,
                      assumptions: LifecycleAssumptions | None = None, cluster=None, **kw) -> RunFootprint:
    """The run of ``tokens`` tokens made of ``prediction``'s steps (a StepPrediction or DistributedPrediction):
    its step time, average GPU power, GPU count and FLOPs per step; ``device`` (default: the prediction's) is the
    spec whose price and embodied carbon are used; ``assumptions`` the lifecycle inputs (the CLI builds them from
    its flags). ``kw``: options of :func:`footprint` (region, pue, lifetime_years, node_overhead_share, ...; None
    values are dropped) that replace those of ``assumptions``. ``cluster``: the ClusterSpec the prediction ran on; its
    own ``cloud_usd_per_gpu_hour`` (when it has one and none is given) prices the cloud view, and a cluster run on part
    of its nodes' GPUs (``--gpus-per-node``) charges the run its nodes' idle spares (:func:`~.cost.cluster_node_kw`). The CLI and the Python
    API both compute a run through this function."""
    kw = {k: v for k, v in kw.items() if v is not None}
    kw = cluster_cloud_kw(cluster, kw, assumptions)
    check_run_hours(tokens, tokens_per_step, prediction.step_time_ms)
    # an inference deployment writes no training checkpoints: a failure costs its restart, not the work since the last
    # checkpoint (until stop 54 a served run was charged Young/Daly checkpoints and lost work: +0.08% on a 2,524 h
    # decode run, audit 54f); a checkpoint time the caller gives is kept
    serving = getattr(prediction, "mode", "") == "inference" and kw.get("checkpoint_write_s") is None and (
        assumptions is None or assumptions.checkpoint_write_s == LifecycleAssumptions().checkpoint_write_s)
    if serving:
        kw["checkpoint_write_s"] = 0.0
    fp = footprint_from_step(device if device is not None else prediction.device, int(getattr(prediction, "gpus", 1)),
                               step_time_ms=prediction.step_time_ms, gpu_power_w=prediction.avg_power_w, tokens=tokens,
                               tokens_per_step=tokens_per_step, flops_per_step=prediction.flops, assumptions=assumptions,
                               **kw)
    if serving:
        fp = replace(fp, flags=fp.flags + ("inference run: no checkpoints written; a failure costs its restart only "
                                           "(give --checkpoint-write-s to charge checkpoints)",))
    return fp
