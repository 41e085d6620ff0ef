"""Energy and carbon of a run: IT and facility energy, operational emissions, ACT-style embodied carbon of an
accelerator and its server share, amortisation over the hardware's productive lifetime, carbon per compute (CCI)
and the total-carbon-delay product. Pure functions; units in their names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from wattcast.data import carbon as _c
from wattcast.data.device_spec import DeviceSpec
from wattcast.lifecycle.checks import _not_catalog_flag, _pos, catalog_spec_matches

if TYPE_CHECKING:
    from wattcast.lifecycle.assumptions import LifecycleAssumptions

HOURS_PER_YEAR = 8760.0


def host_power_w(tdp_w: float, node_overhead_share: float) -> float:
    """Power of the host around one accelerator (its share of the node's CPUs, DRAM, NICs, fans, PSU losses), in W:
    ``node_overhead_share x TDP``, a fixed figure per GPU slot of the node. It does not follow the GPU's own draw: a
    power limit or clock cap (``--power-limit-w``, ``--clock-cap-mhz``) or a light load lowers the GPU's power, not
    the host's. Sized as the cited source sizes it (``costs.yaml`` ``node_overhead_share``): against the GPUs' TDP of
    a DGX H100 (10.2 kW nameplate for 8 x 700 W GPUs: at most 0.8 x TDP of non-GPU power at full load). Until stop 56
    the host was ``share x`` the GPU's predicted power, so a 200 W cap on an H100 also cut its host from 166 to 60 W
    (audit 56d, finding 2)."""
    return _pos("tdp_w", tdp_w) * _pos("node_overhead_share", node_overhead_share, zero_ok=True)


def node_power_w(accelerator_power_w: float, node_overhead_share: float, tdp_w: float | None = None) -> float:
    """Power per accelerator including its share of the node (host CPUs, NICs, fans), in W: ``P + share x TDP``
    (:func:`host_power_w`) when the GPU's ``tdp_w`` is given; without it, ``P x (1 + share)`` (the host sized on the
    given power, which is then taken as the GPU's full-load power)."""
    p = _pos("accelerator_power_w", accelerator_power_w, zero_ok=True)
    share = _pos("node_overhead_share", node_overhead_share, zero_ok=True)
    return p + (host_power_w(tdp_w, share) if tdp_w is not None else p * share)


def it_energy_kwh(gpus: int, power_w_per_gpu: float, hours: float) -> float:
    """IT energy (before PUE) of ``gpus`` drawing ``power_w_per_gpu`` each for ``hours``, in kWh."""
    return _pos("gpus", gpus) * _pos("power_w_per_gpu", power_w_per_gpu, zero_ok=True) * _pos("hours", hours, zero_ok=True) / 1000.0


def facility_energy_kwh(it_energy_kwh: float, pue: float) -> float:
    """Facility energy: IT energy x PUE, in kWh."""
    if _pos("pue", pue) < 1.0:
        raise ValueError(f"pue must be >= 1, got {pue!r}")
    return _pos("it_energy_kwh", it_energy_kwh, zero_ok=True) * pue


def operational_kgco2e(energy_kwh: float, pue: float, grid_kgco2e_per_kwh: float) -> float:
    """Operational emissions: IT energy (kWh, before PUE) x PUE x grid intensity (kgCO2e/kWh), in kgCO2e."""
    return facility_energy_kwh(energy_kwh, pue) * _pos("grid_kgco2e_per_kwh", grid_kgco2e_per_kwh, zero_ok=True)



def amortisation_share(run_hours: float, lifetime_years: float, lifetime_utilisation: float = 1.0) -> float:
    """The share of a piece of hardware a run uses: ``run_hours / (lifetime_years x 8760 x lifetime_utilisation)``.

    ``lifetime_utilisation`` is the fraction of the lifetime the hardware does productive work; idle time
    is charged to the runs that do happen. Above 1 when the run outlasts the productive lifetime.
    """
    u = _pos("lifetime_utilisation", lifetime_utilisation)
    if u > 1:
        raise ValueError(f"lifetime_utilisation must be in (0, 1], got {u!r}")
    return _pos("run_hours", run_hours, zero_ok=True) / (_pos("lifetime_years", lifetime_years) * HOURS_PER_YEAR * u)


@dataclass(frozen=True)
class EmbodiedBreakdown:
    """Lifetime embodied carbon of one accelerator and its share of the server, kgCO2e (not amortised)."""

    die_kgco2e: float
    memory_kgco2e: float
    board_kgco2e: float
    server_share_kgco2e: float
    die_area_mm2: float
    act_node_nm: int
    flags: tuple[str, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def device_kgco2e(self) -> float:
        return self.die_kgco2e + self.memory_kgco2e + self.board_kgco2e

    @property
    def total_kgco2e(self) -> float:
        return self.device_kgco2e + self.server_share_kgco2e

    def to_dict(self) -> dict[str, Any]:
        return {"die_kgco2e": self.die_kgco2e, "memory_kgco2e": self.memory_kgco2e, "board_kgco2e": self.board_kgco2e,
                "server_share_kgco2e": self.server_share_kgco2e, "total_kgco2e": self.total_kgco2e,
                "die_area_mm2": self.die_area_mm2, "act_node_nm": self.act_node_nm}


def server_share_kgco2e_per_gpu(gpus_per_server: float | None = None) -> tuple[float, dict[str, str]]:
    """Embodied kgCO2e of the host server per accelerator (stated DGX H100-class bill of materials)."""
    s = _c.server_defaults()
    n = _pos("gpus_per_server", gpus_per_server if gpus_per_server is not None else s["gpus_per_server"].value)
    cpu = s["host_cpu_die_area_mm2"].value / 100.0 * _c.fab_kgco2e_per_cm2(s["host_cpu_node_nm"].value).value
    dram = s["host_dram_gb"].value * _c.memory_kgco2e_per_gb("DDR5").value
    ssd = s["ssd_gb"].value * _c.ssd_kgco2e_per_gb().value
    steel = s["steel_kg"].value * _c.material_kgco2e_per_kg("steel").value
    alu = s["aluminium_kg"].value * _c.material_kgco2e_per_kg("aluminium").value
    pcb = s["pcb_m2"].value * _c.pcb_kgco2e_per_m2(int(s["pcb_layers"].value)).value
    total = cpu + dram + ssd + steel + alu + pcb
    srcs = {f"server.{k}": f.source for k, f in s.items()}
    srcs["server.kgco2e_per_server"] = (f"host CPU {cpu:.0f} + host DRAM {dram:.0f} + SSD {ssd:.0f} + steel {steel:.0f} "
                                        f"+ aluminium {alu:.0f} + PCB {pcb:.1f} = {total:.0f} kgCO2e per server / {n:g} GPUs")
    return total / n, srcs


def embodied_kgco2e_per_device(spec: DeviceSpec, *, include_server: bool = True,
                               gpus_per_server: float | None = None) -> EmbodiedBreakdown:
    """ACT-style lifetime embodied carbon of one accelerator (+ its server share), in kgCO2e.

    Die: ``die_area_mm2 / 100 x fab_kgco2e_per_cm2(node)``; memory: ``memory_gb x DRAM-class kg/GB``
    (HBM/GDDR treated as DRAM-class, stated); board: accelerator PCB; server share: see
    :func:`server_share_kgco2e_per_gpu`. Packaging (CoWoS), HBM stacking, assembly are not counted.
    Without a die area, the table's per-device fallback applies only to the catalog's own spec of that name
    (:func:`catalog_spec_matches`), else the stated default; either way flagged.
    """
    flags: list[str] = []
    srcs: dict[str, str] = {}
    emb = _c._embodied()["fab"]
    area = getattr(spec, "die_area_mm2", None)
    if area:
        srcs["die_area_mm2"] = spec.source_of("die_area_mm2")
    else:
        named = emb["die_area_fallback_mm2"].get(spec.name)
        if named is not None and not catalog_spec_matches(spec):
            flags.append(_not_catalog_flag(spec, "die-area fallback"))
            named = None
        fb = named or emb["die_area_default_mm2"]
        area = float(fb["value"])
        flags.append(f"die area of {spec.name} unknown; assumed {area:g} mm2"
                     + (" (its package's dies together)" if named is not None else ""))
        srcs["die_area_mm2"] = fb["source"]
    note = (emb.get("die_area_notes") or {}).get(spec.name)
    if note and catalog_spec_matches(spec):  # a chiplet package whose area source is ambiguous: said, not silent
        flags.append(note)
    fab = _c.fab_kgco2e_per_cm2(spec.process_node_nm)
    if spec.process_node_nm is None:
        flags.append("process node unknown; ACT default node assumed")
    node, _ = _c.act_node_nm(spec.process_node_nm)
    die = area / 100.0 * fab.value
    srcs["die_kgco2e"] = f"{area:g} mm2 x {fab.value:.3f} kgCO2e/cm2; {fab.source}"
    mem_f = _c.memory_kgco2e_per_gb(spec.memory_type)
    mem = float(spec.memory_gb) * mem_f.value
    srcs["memory_kgco2e"] = f"{spec.memory_gb:g} GB x {mem_f.value:g} kgCO2e/GB; {mem_f.source}"
    s = _c.server_defaults()
    pcb_f = _c.pcb_kgco2e_per_m2(int(s["accelerator_board_layers"].value))
    board = s["accelerator_board_m2"].value * pcb_f.value
    srcs["board_kgco2e"] = f"{s['accelerator_board_m2'].source}; {s['accelerator_board_layers'].source}; {pcb_f.source}"
    server = 0.0
    if include_server:
        server, ss = server_share_kgco2e_per_gpu(gpus_per_server)
        srcs.update(ss)
    srcs["excluded"] = emb["excluded"]
    return EmbodiedBreakdown(die, mem, board, server, float(area), int(node), tuple(flags), srcs)


def embodied_kgco2e(per_device_kgco2e: float, gpus: int, run_hours: float, lifetime_years: float,
                    lifetime_utilisation: float = 1.0) -> float:
    """Embodied carbon charged to a run: ``per_device x gpus x amortisation_share``, in kgCO2e."""
    return (_pos("per_device_kgco2e", per_device_kgco2e, zero_ok=True) * _pos("gpus", gpus)
            * amortisation_share(run_hours, lifetime_years, lifetime_utilisation))


def cci_kgco2e_per_pflop(total_kgco2e: float, flops: float) -> float:
    """Carbon per unit of compute (CCI): total kgCO2e per PFLOP (1e15 floating-point operations)."""
    return _pos("total_kgco2e", total_kgco2e, zero_ok=True) / (_pos("flops", flops) / 1e15)


def tcdp_kgco2e_h(total_kgco2e: float, hours: float) -> float:
    """Total-carbon-delay product (tCDP): total kgCO2e x run time in hours (lower is better)."""
    return _pos("total_kgco2e", total_kgco2e, zero_ok=True) * _pos("hours", hours, zero_ok=True)



def accelerator_power_w(spec: DeviceSpec, a: "LifecycleAssumptions", flags: list[str], srcs: dict[str, str], *,
                        avg_power_w: float | None = None, power_model=None, utilisation: float | None = None,
                        node_overhead_share: float | None = None) -> tuple[float, float, str]:
    """Power per accelerator before node overhead (W), the node-overhead share added to it (as host power per GPU of
    ``share x TDP``: :func:`host_power_w`), and how it was found:
    the given all-in ``avg_power_w`` (no overhead unless ``node_overhead_share`` is given), else ``power_model`` (W,
    or a callable of ``utilisation``), else ``a.default_power_fraction_of_tdp x TDP`` (flagged); the last two add
    ``node_overhead_share`` (default ``a.node_overhead_share``). Appends to ``flags`` and ``srcs``."""
    if avg_power_w is not None:
        p = _pos("avg_power_w", avg_power_w)
        share = 0.0 if node_overhead_share is None else node_overhead_share
        # all-in (the Patterson convention) only when no overhead is added on top; a given share makes it GPU power
        how = ("given avg_power_w (all-in per accelerator; node overhead not added)" if share == 0 else
               f"given avg_power_w (per accelerator, taken as GPU-only) + {share:g} node overhead (given)")
        if utilisation is not None:
            flags.append(f"utilisation {utilisation:g} not used: avg_power_w is given (utilisation only sets the power "
                         "model's load)")
    elif power_model is not None:
        if callable(power_model):
            if utilisation is None:
                raise ValueError("power_model is a callable: give the utilisation to evaluate it at")
            w = power_model(float(utilisation))
            try:
                w = float(w)
            except (TypeError, ValueError):
                raise ValueError(f"power_model(utilisation) must return a number of watts, got {w!r}") from None
            p = _pos("power_model(utilisation)", w)
        else:
            p = _pos("power_model", power_model)
        share = a.node_overhead_share if node_overhead_share is None else node_overhead_share
        how = f"power model (GPU power{'' if utilisation is None else f' at utilisation {utilisation:g}'}) + {share:g} node overhead"
    else:
        if not spec.tdp_w:
            raise ValueError(f"device {spec.name!r} has no tdp_w: give avg_power_w or power_model")
        p = a.default_power_fraction_of_tdp * spec.tdp_w
        share = a.node_overhead_share if node_overhead_share is None else node_overhead_share
        how = f"{a.default_power_fraction_of_tdp:g} x TDP {spec.tdp_w:g} W (no power given) + {share:g} node overhead"
        flags.append(f"no average power or power model given: assumed {a.default_power_fraction_of_tdp:g} x TDP = {p:g} W per GPU")
        srcs["default_power_fraction_of_tdp"] = _c.cost_defaults()["default_power_fraction_of_tdp"].source
    if share:
        srcs["node_overhead_share"] = (_c.cost_defaults()["node_overhead_share"].source
                                       if share == _c.cost_defaults()["node_overhead_share"].value else "given")
    return p, share, how


@dataclass(frozen=True)
class GridCharge:
    """The grid intensity a run is charged (:func:`grid_kgco2e_per_kwh_of`)."""

    kgco2e_per_kwh: float
    basis: str  # explicit | market | location
    region: str | None
    #: the site's own figure: a given one (explicit or market-based), or the table's row of the region; False for the
    #: world average (asked for as 'world', taken by default, or standing in for a country's missing figure):
    #: :attr:`wattcast.data.carbon.GridIntensity.region_specific`, the one definition every output uses
    region_specific: bool
    #: a market-based 0 from the shipped table: the provider's own claim of renewable matching (CodeCarbon offsetRatio
    #: 100%), not a grid factor; said in the run's flags
    renewable_claim_zero: bool = False


def market_proxy_note(region: str, gi: "_c.GridIntensity") -> str:
    """What a market-based figure from the shipped table is (its ``source`` says it too, but only in the JSON): the
    provider's declared renewable matching applied to the location figure, not a published Scope-2 factor; a 0 is
    said as such (until stop 58 an Azure region's 0.0 kg printed without a note: audit 58c finding 5)."""
    loc, ratio = gi.location_kgco2e_per_kwh, gi.offset_ratio_pct
    how = (f"location-based {loc:g} kgCO2e/kWh x (1 - offset ratio {ratio:g}%): CodeCarbon's offsetRatio, the "
           "provider's declared share matched by renewable purchases/offsets")
    if gi.kgco2e_per_kwh == 0:
        return (f"market-based grid intensity 0 for {region} is the provider's own renewable-matching claim, not a grid "
                f"factor ({how}; not a published Scope-2 market-based factor): operational CO2e 0 rests on that claim; "
                "drop --market-based (market_based) for the grid's figure")
    return (f"market-based grid intensity {gi.kgco2e_per_kwh:g} kgCO2e/kWh for {region} is a proxy: {how}; not a "
            "published Scope-2 market-based factor")


def grid_kgco2e_per_kwh_of(a: "LifecycleAssumptions", flags: list[str], srcs: dict[str, str]) -> GridCharge:
    """The grid intensity a run is charged (kgCO2e/kWh), its basis (explicit | market | location), region and whether
    it is the region's own: ``a.grid_kgco2e_per_kwh`` > a market-based override > ``a.region``'s table entry > the
    world average (flagged). Appends to ``flags`` and ``srcs``."""
    claim_zero = False
    if a.grid_kgco2e_per_kwh is not None:
        grid, basis, greg, own = a.grid_kgco2e_per_kwh, "explicit", a.region, True
        srcs["grid_kgco2e_per_kwh"] = "given"
        if a.region:
            flags.append(f"explicit grid intensity {grid:g} kgCO2e/kWh used instead of region {a.region!r}")
        if a.market_based and a.market_kgco2e_per_kwh is not None:
            flags.append(f"explicit grid intensity {grid:g} kgCO2e/kWh used instead of the market-based "
                         f"market_kgco2e_per_kwh {a.market_kgco2e_per_kwh:g}")
    elif a.market_based and a.market_kgco2e_per_kwh is not None:
        grid, basis, greg, own = a.market_kgco2e_per_kwh, "market", a.region, True
        srcs["grid_kgco2e_per_kwh"] = "given (market-based)"
    else:
        if a.region:
            gi = _c.grid_intensity(a.region, market_based=a.market_based)
            if gi.region == "world":  # asked for by name: said as when no region is given
                flags.append(f"region 'world': world average {gi.kgco2e_per_kwh:g} kgCO2e/kWh (not region-specific)")
        else:
            if a.market_based:
                raise _c.CarbonDataError(
                    "market_based (--market-based) needs a region with a market-based figure (a cloud region, e.g. "
                    "--region gcp:us-central1), or give the market-based factor itself as grid_kgco2e_per_kwh "
                    "(--grid-kgco2e-per-kwh; in Python also LifecycleAssumptions.market_kgco2e_per_kwh)")
            gi = _c.world_grid_intensity()
            flags.append(f"no region or grid intensity given: world average {gi.kgco2e_per_kwh:g} kgCO2e/kWh")
        grid, basis, greg, own = gi.kgco2e_per_kwh, gi.basis, gi.region, gi.region_specific
        srcs["grid_kgco2e_per_kwh"] = gi.source
        if gi.note:  # a zone given its country's figure: said, not silent
            flags.append(gi.note)
        if gi.basis == "market" and gi.location_kgco2e_per_kwh is not None:
            claim_zero = gi.kgco2e_per_kwh == 0
            flags.append(market_proxy_note(gi.region, gi))
    return GridCharge(grid, basis, greg, bool(own), claim_zero)


def embodied_kgco2e_per_gpu_of(spec: DeviceSpec, a: "LifecycleAssumptions", flags: list[str],
                               srcs: dict[str, str]) -> tuple[float, dict[str, float]]:
    """Lifetime embodied kgCO2e per accelerator (given in ``a``, else :func:`embodied_kgco2e_per_device`) and its
    breakdown. Appends to ``flags`` and ``srcs``."""
    if a.embodied_kgco2e_per_gpu is not None:
        per_gpu = a.embodied_kgco2e_per_gpu
        breakdown: dict[str, float] = {"total_kgco2e": per_gpu}
        srcs["embodied_kgco2e_per_gpu"] = "given"
    else:
        eb = embodied_kgco2e_per_device(spec, include_server=a.include_server_embodied, gpus_per_server=a.gpus_per_server)
        per_gpu = eb.total_kgco2e
        breakdown = eb.to_dict()
        flags.extend(eb.flags)
        srcs.update({f"embodied.{k}": v for k, v in eb.sources.items()})
    return per_gpu, breakdown
