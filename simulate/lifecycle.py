"""Lifecycle TCO and emissions of one training run: energy, operational and embodied carbon, CapEx,
OpEx, goodput under failures, carbon per FLOP and the total-carbon-delay product.

Pure functions carry their units in their names; :func:`footprint` puts them together for one run
of ``gpus`` accelerators for ``hours`` and returns a :class:`RunFootprint`. Defaults and their sources
live in ``wattcast/data/carbon/*.yaml`` / ``.json`` (see :mod:`wattcast.data.carbon`); override any of
them with :class:`LifecycleAssumptions`.

Formulas (``h`` = effective hours, ``N`` = GPUs):

- accelerator power ``P``: the given all-in ``avg_power_w`` (Patterson et al.'s "system average power per
  accelerator, incl. memory, NIC, fans, host CPU": no node overhead added), or the power model's GPU
  power at the stated utilisation, or ``default_power_fraction_of_tdp x TDP`` (flagged); the last two
  add the node overhead: ``P_node = P x (1 + node_overhead_share)``;
- IT energy ``E_IT = N x P_node x h / 1000`` kWh; facility energy ``E = E_IT x PUE`` (``energy_mwh``);
- operational ``kgCO2e = E_IT x PUE x grid_kgco2e_per_kwh`` (location-based by default; market-based
  on request; an explicit intensity wins over a region);
- embodied per GPU (ACT-style): die ``area_cm2 x (CI_fab x EPA + GPA + MPA)/yield`` at the ACT node,
  + memory ``GB x DRAM-class kg/GB`` (HBM/GDDR as DRAM), + board PCB, + the server share (host CPUs,
  host DRAM, SSD, chassis steel/aluminium, boards, divided by GPUs per server); amortised with
  ``share = h / (lifetime_years x 8760 x lifetime_utilisation)``;
- CapEx = ``share x N x (accelerator + server + network USD per GPU)`` + ``facility_usd_per_kw x kW_provisioned
  x h / (facility_lifetime_years x 8760 x lifetime_utilisation)``, with ``kW_provisioned = N x TDP x
  (1 + node_overhead_share) / 1000``; OpEx = ``E_IT x PUE x electricity_usd_per_kwh``; TCO = CapEx + OpEx;
  cloud view (not in TCO) = ``GPU-hours x USD/GPU-hour``;
- goodput (Daly 2006, exponential failures, failures may also hit restarts): system MTBF ``M = MTBF_gpu / N``,
  checkpoint every ``tau`` (Young/Daly ``sqrt(2 C M)`` by default) taking ``C``, restart ``R``:
  ``goodput = tau / (M e^{R/M} (e^{(tau+C)/M} - 1))`` in (0, 1]; effective hours = failure-free hours / goodput;
- CCI = total kgCO2e per PFLOP (1e15 FLOP) of the run's useful FLOPs; tCDP = total kgCO2e x hours.

Per-device figures come from the spec object given. The name-keyed tables (cloud USD/GPU-hour, a
sibling's purchase price, a die-area fallback) are used only when the spec is the catalog's own device of
that name (same hardware figures, :func:`catalog_spec_matches`); a user spec that merely reuses a catalog
name gets none of them: the cloud price is unknown (``None``, flagged), the purchase price falls back to the
stated USD-per-TDP-watt rule and the die area to the stated default (both flagged).

Example::

    >>> from wattcast.simulate.lifecycle import footprint, LifecycleAssumptions
    >>> fp = footprint("v100", gpus=10_000, hours=355.2, avg_power_w=330, pue=1.1,
    ...                grid_kgco2e_per_kwh=0.429, apply_goodput=False)   # GPT-3, Patterson Table 4
    >>> round(fp.energy_mwh), round(fp.operational_tco2e)
    (1289, 553)
    >>> fp.run_dict().keys()  # the `run` object of `wattcast predict --json`
    dict_keys(['hours', 'gpu_hours', 'energy_mwh', 'operational_tco2e', 'embodied_tco2e', 'total_tco2e', 'capex_usd', 'opex_usd', 'tco_usd', 'goodput'])
    >>> fp2 = footprint("h100", 1024, 24 * 30, power_model=lambda u: 120 + 560 * u, utilisation=0.8,
    ...                 region="gcp:us-central1", flops=3e23)  # power from a model; goodput applied
"""

from __future__ import annotations

import math
import numbers
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any, Callable, Mapping, Union

from numpy import bool_ as np_bool

from wattcast.data.checks import implausible, is_count
from wattcast.data import carbon as _c
from wattcast.data.device_spec import DeviceSpec

__all__ = [
    "HOURS_PER_YEAR",
    "RUN_KEYS",
    "EmbodiedBreakdown",
    "LifecycleAssumptions",
    "RunFootprint",
    "amortisation_share",
    "capex_breakdown_usd",
    "capex_usd",
    "cci_kgco2e_per_pflop",
    "cloud_usd",
    "daly_interval_s",
    "embodied_kgco2e",
    "embodied_kgco2e_per_device",
    "facility_energy_kwh",
    "footprint",
    "format_footprint",
    "goodput",
    "it_energy_kwh",
    "node_power_w",
    "operational_kgco2e",
    "opex_usd",
    "system_mtbf_s",
    "tcdp_kgco2e_h",
    "young_daly_interval_s",
]

HOURS_PER_YEAR = 8760.0
#: the keys of the ``run`` object (``wattcast predict --json``); other tools rely on exactly these
RUN_KEYS = ("hours", "gpu_hours", "energy_mwh", "operational_tco2e", "embodied_tco2e", "total_tco2e",
            "capex_usd", "opex_usd", "tco_usd", "goodput")

PowerModel = Union[Callable[[float], float], float, int]


def _pos(name: str, v: float, *, zero_ok: bool = False) -> float:
    try:
        finite = not isinstance(v, bool) and isinstance(v, numbers.Real) and math.isfinite(v)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    if v < 0 or (v == 0 and not zero_ok):
        raise ValueError(f"{name} must be {'non-negative' if zero_ok else 'positive'}, got {v!r}")
    return float(v)


def _flag(name: str, v: Any) -> bool:
    """A yes/no setting: True or False (a string such as 'no' would read as True)."""
    if not isinstance(v, (bool, np_bool)):
        raise ValueError(f"{name} must be True or False, got {v!r}")
    return bool(v)


def _region(v: Any, name: str = "region") -> str:
    """A grid region: a non-empty string (an empty one would silently fall back to the world average)."""
    if not isinstance(v, str):
        raise _c.UnknownRegionError(f"{name} must be a string (country ISO3 code or name, cloud region such as "
                                    f"gcp:us-central1, or 'world'), got {v!r}")
    if not v.strip():
        raise _c.UnknownRegionError(f"empty region ({name}={v!r}); give a country ISO3 code, a cloud region or "
                                    "'world', or leave it out for the world average")
    return v


def _count(name: str, v: Any) -> int:
    """A whole number >= 1 (ints of any size, or whole floats)."""
    if not is_count(v, whole_floats=True):
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


def _utilisation(v: float) -> float:
    """A GPU compute utilisation: finite and in [0, 1] (0: the GPUs sit idle and draw idle power)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
        raise ValueError(f"utilisation (--utilisation) must be a finite number in [0, 1], got {v!r}")
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"utilisation (--utilisation) is a fraction of the compute peak, in [0, 1]; got {v!r}")
    return float(v)


#: LifecycleAssumptions fields that are yes/no settings
_FLAG_FIELDS = ("market_based", "include_server_embodied")

#: numeric keyword parameters of :func:`footprint` -> zero allowed
#: parameter -> (lowest, highest plausible value, what a too-small figure probably is, what a too-large one is, unit):
#: a figure outside is almost surely in another unit (a share given as a percent, g instead of kg, mW or the power
#: of all GPUs instead of one); refused unless --force (:func:`wattcast.data.checks.allow_exotic`).
PLAUSIBLE: dict[str, tuple[float, float, str, str, str]] = {
    "avg_power_w": (1.0, 10_000.0, "kilowatts", "milliwatts, or the power of all GPUs together", "watts per accelerator"),
    "hours": (0.0, 1e6, "-", "seconds or minutes (1e6 hours is 114 years)", "hours"),
    "lifetime_years": (0.25, 50.0, "another unit (1e-9 years is 0.03 s)", "months, days or hours", "years"),
    "node_overhead_share": (0.0, 2.0, "-", "a percent (50 means 0.5)", "a share of GPU power (0.3 = 30%)"),
    "pue": (1.0, 4.0, "-", "a percent (120 means 1.2)", "a ratio (facility / IT energy)"),
    "grid_kgco2e_per_kwh": (0.0, 2.0, "-", "grams per kWh (481 means 0.481)", "kgCO2e per kWh"),
    "electricity_usd_per_kwh": (0.0, 2.0, "-", "cents or USD per MWh", "USD per kWh"),
    "cloud_usd_per_gpu_hour": (0.0, 500.0, "-", "cents, or the price of a whole node or month", "USD per GPU-hour"),
}
#: the command-line option of each footprint parameter (named in messages)
_FLAGS = {"avg_power_w": "--avg-power-w", "hours": "--hours", "lifetime_years": "--lifetime-years",
          "node_overhead_share": "--node-overhead-share", "pue": "--pue", "grid_kgco2e_per_kwh": "--grid-kgco2e-per-kwh"}


def check_plausible(name: str, v: float | None, prefix: str = "") -> None:
    """ValueError when ``v`` is outside :data:`PLAUSIBLE` (unless allow_exotic / --force), naming the parameter."""
    if v is None or name not in PLAUSIBLE:
        return
    label = f"{prefix}{name}" + (f" ({_FLAGS[name]})" if name in _FLAGS and not prefix else "")
    msg = implausible(label, float(v), *PLAUSIBLE[name])
    if msg:
        raise ValueError(msg)


_FOOTPRINT_NUMBERS = {"pue": False, "grid_kgco2e_per_kwh": True, "lifetime_years": False,
                      "electricity_usd_per_kwh": True, "cloud_usd_per_gpu_hour": True, "node_overhead_share": True,
                      "flops": True}

#: DeviceSpec fields that only cite or name a figure; two specs that differ only in these are one device
_CITATION_FIELDS = ("aliases", "source", "sources", "schema_version", "launch_price_usd")


def catalog_spec_matches(spec: DeviceSpec) -> bool:
    """True when ``spec`` is the catalog's own device of its name: the same object, or the same hardware
    figures (citations, aliases and the launch price aside). Only then may figures kept in tables keyed by
    the catalog name (cloud price, a sibling's price, a die-area fallback) stand for ``spec``."""
    from wattcast.data.catalog import load_catalog

    ref = load_catalog().get(spec.name)
    if ref is None:
        return False
    if ref is spec:
        return True
    return all(getattr(ref, f.name) == getattr(spec, f.name) for f in fields(ref) if f.name not in _CITATION_FIELDS)


def _not_catalog_flag(spec: DeviceSpec, what: str) -> str:
    return (f"the spec named {spec.name!r} is not the catalog's {spec.name} (its figures differ): the catalog's "
            f"{what} for that name is not used")


# ============================================================================ energy and carbon
def node_power_w(accelerator_power_w: float, node_overhead_share: float) -> float:
    """Power per accelerator including its share of the node (host CPUs, NICs, fans): ``P x (1 + share)``."""
    return _pos("accelerator_power_w", accelerator_power_w, zero_ok=True) * (1.0 + _pos("node_overhead_share", node_overhead_share, zero_ok=True))


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


def opex_usd(energy_kwh: float, pue: float, electricity_usd_per_kwh: float) -> float:
    """Energy cost: IT energy (kWh, before PUE) x PUE x electricity price, in USD."""
    return facility_energy_kwh(energy_kwh, pue) * _pos("electricity_usd_per_kwh", electricity_usd_per_kwh, zero_ok=True)


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
        flags.append(f"die area of {spec.name} unknown; assumed {area:g} mm2")
        srcs["die_area_mm2"] = fb["source"]
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


# ================================================================================ goodput
def system_mtbf_s(mtbf_gpu_hours: float, gpus: int) -> float:
    """Mean time between failures of the whole job (independent failures): ``MTBF_gpu / N``, in seconds."""
    return _pos("mtbf_gpu_hours", mtbf_gpu_hours) * 3600.0 / _pos("gpus", gpus)


def young_daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young/Daly first-order optimal compute time between checkpoints: ``sqrt(2 C M)``, in seconds."""
    return math.sqrt(2.0 * _pos("checkpoint_s", checkpoint_s, zero_ok=True) * _pos("mtbf_s", mtbf_s))


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's (2006) higher-order optimum: ``sqrt(2CM)[1 + sqrt(C/2M)/3 + (C/2M)/9] - C`` for ``C < 2M``, else ``M``."""
    c = _pos("checkpoint_s", checkpoint_s, zero_ok=True)
    m = _pos("mtbf_s", mtbf_s)
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


def goodput(checkpoint_s: float, mtbf_s: float | None, restart_s: float = 0.0, interval_s: float | None = None) -> float:
    """Fraction of wall-clock time spent on useful (kept) work, in (0, 1].

    Daly's (2006) model with exponential failures of mean ``mtbf_s`` (failures may also hit a restart):
    each segment of ``interval_s`` useful seconds plus one checkpoint of ``checkpoint_s`` takes on average
    ``M e^{R/M} (e^{(tau+C)/M} - 1)`` seconds. ``interval_s=None`` uses :func:`young_daly_interval_s`.
    ``mtbf_s=None`` (no failures): ``tau / (tau + C)``, or 1 when no interval is given either.
    Raises ValueError when failures are so frequent that the job makes no progress.
    """
    c = _pos("checkpoint_s", checkpoint_s, zero_ok=True)
    r = _pos("restart_s", restart_s, zero_ok=True)
    if mtbf_s is None or math.isinf(mtbf_s):
        if interval_s is None:
            return 1.0
        tau = _pos("interval_s", interval_s)
        return tau / (tau + c)
    m = _pos("mtbf_s", mtbf_s)
    if interval_s is None:
        tau = young_daly_interval_s(c, m) if c > 0 else 0.0
        if tau == 0.0:  # free checkpoints: checkpoint continuously, lose only restarts
            return 1.0 / math.exp(r / m)
    else:
        tau = _pos("interval_s", interval_s)
    try:
        seg = m * math.exp(r / m) * math.expm1((tau + c) / m)
    except OverflowError:
        seg = math.inf
    g = tau / seg if seg > 0 else 0.0
    if not g > 1e-9:
        raise ValueError(
            f"no progress: system MTBF {m:.0f} s is too short for checkpoint {c:g} s + restart {r:g} s "
            f"(interval {tau:.0f} s); fewer GPUs, faster checkpoints or a higher MTBF are needed"
        )
    return min(g, 1.0)


# ================================================================================== costs
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


def cci_kgco2e_per_pflop(total_kgco2e: float, flops: float) -> float:
    """Carbon per unit of compute (CCI): total kgCO2e per PFLOP (1e15 floating-point operations)."""
    return _pos("total_kgco2e", total_kgco2e, zero_ok=True) / (_pos("flops", flops) / 1e15)


def tcdp_kgco2e_h(total_kgco2e: float, hours: float) -> float:
    """Total-carbon-delay product (tCDP): total kgCO2e x run time in hours (lower is better)."""
    return _pos("total_kgco2e", total_kgco2e, zero_ok=True) * _pos("hours", hours, zero_ok=True)


# ============================================================================ assumptions
def _d(name: str) -> Callable[[], float]:
    return lambda: _c.cost_defaults()[name].value


@dataclass(frozen=True)
class LifecycleAssumptions:
    """Inputs of the lifecycle calculator besides the run itself. Defaults come from
    ``wattcast/data/carbon/costs.yaml`` and ``embodied_factors.yaml``; each has a source there
    (:meth:`sources`). ``None`` means "not given" (region -> world average, flagged; cloud price -> table)."""

    pue: float = field(default_factory=_d("pue"))
    lifetime_years: float = field(default_factory=_d("lifetime_years"))
    #: fraction of the hardware's lifetime in productive use (amortisation); not the GPU's compute utilisation
    lifetime_utilisation: float = field(default_factory=_d("lifetime_utilisation"))
    electricity_usd_per_kwh: float = field(default_factory=_d("electricity_usd_per_kwh"))
    region: str | None = None
    grid_kgco2e_per_kwh: float | None = None  # explicit location- or market-based intensity; wins over region
    market_based: bool = False
    market_kgco2e_per_kwh: float | None = None  # market-based override used when market_based=True
    accelerator_price_usd: float | None = None  # None: the spec's launch price, else a stated fallback
    server_usd_per_gpu: float = field(default_factory=_d("server_usd_per_gpu"))
    network_usd_per_gpu: float = field(default_factory=_d("network_usd_per_gpu"))
    facility_usd_per_kw: float = field(default_factory=_d("facility_usd_per_kw"))
    facility_lifetime_years: float = field(default_factory=_d("facility_lifetime_years"))
    node_overhead_share: float = field(default_factory=_d("node_overhead_share"))
    default_power_fraction_of_tdp: float = field(default_factory=_d("default_power_fraction_of_tdp"))
    gpus_per_server: float = field(default_factory=lambda: _c.server_defaults()["gpus_per_server"].value)
    mtbf_gpu_hours: float | None = field(default_factory=_d("mtbf_gpu_hours"))  # None: no failures
    checkpoint_write_s: float = field(default_factory=_d("checkpoint_write_s"))
    checkpoint_interval_s: float | None = None  # None: Young/Daly optimum
    restart_min: float = field(default_factory=_d("restart_min"))
    cloud_usd_per_gpu_hour: float | None = None  # None: the table's price for the device, if any
    embodied_kgco2e_per_gpu: float | None = None  # None: ACT-style estimate (device + server share)
    include_server_embodied: bool = True

    def __post_init__(self) -> None:
        for f in _FLAG_FIELDS:
            _flag(f"LifecycleAssumptions.{f}", getattr(self, f))
        if self.region is not None:
            _region(self.region, "LifecycleAssumptions.region")
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or f.name in _FLAG_FIELDS or f.name == "region":
                continue
            _pos(f"LifecycleAssumptions.{f.name}", v, zero_ok=f.name in (
                "electricity_usd_per_kwh", "server_usd_per_gpu", "network_usd_per_gpu", "facility_usd_per_kw",
                "node_overhead_share", "checkpoint_write_s", "restart_min", "grid_kgco2e_per_kwh",
                "market_kgco2e_per_kwh", "accelerator_price_usd", "cloud_usd_per_gpu_hour", "embodied_kgco2e_per_gpu"))
        if self.pue < 1:
            raise ValueError(f"LifecycleAssumptions.pue must be >= 1, got {self.pue!r}")
        for f in PLAUSIBLE:
            if hasattr(self, f):
                check_plausible(f, getattr(self, f), "LifecycleAssumptions.")
        if self.lifetime_utilisation > 1:
            raise ValueError(f"LifecycleAssumptions.lifetime_utilisation must be in (0, 1], got {self.lifetime_utilisation!r}")
        if self.default_power_fraction_of_tdp > 1.5:
            raise ValueError("LifecycleAssumptions.default_power_fraction_of_tdp looks wrong (> 1.5 x TDP)")

    def sources(self) -> dict[str, str]:
        """Where each figure comes from: the table's source when it is the default, else 'given'."""
        defaults = _c.cost_defaults()
        out: dict[str, str] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            dflt = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
            if v != dflt:
                out[f.name] = "given"
            elif f.name in defaults:
                out[f.name] = defaults[f.name].source
            elif f.name == "gpus_per_server":
                out[f.name] = _c.server_defaults()["gpus_per_server"].source
        return out


# ================================================================================ results
@dataclass(frozen=True)
class RunFootprint:
    """One run's lifecycle footprint. The first ten fields are the ``run`` object (:data:`RUN_KEYS`)."""

    hours: float  # effective wall-clock hours (failure-free hours / goodput)
    gpu_hours: float
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
    gpus: int
    ideal_hours: float  # failure-free hours as given
    avg_power_w: float  # per accelerator, as given / modelled (before node overhead)
    node_power_w: float  # per accelerator, incl. node overhead (what energy uses)
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
        d["embodied_breakdown_kgco2e_per_gpu"] = dict(self.embodied_breakdown_kgco2e_per_gpu)
        d["capex_breakdown_usd"] = dict(self.capex_breakdown_usd)
        d["sources"] = dict(self.sources)
        return d


# ============================================================================== footprint
def _accelerator_price(spec: DeviceSpec, catalog_own: bool, flags: list[str]) -> "_c.Factor":
    """The spec's launch price; else the table's price for the catalog name (a sibling's cited price) only
    when ``spec`` is the catalog's own device; else the stated USD-per-TDP-watt rule (flagged)."""
    if getattr(spec, "launch_price_usd", None) or catalog_own or spec.name not in _c._costs()["accelerator_price_fallback"]:
        return _c.accelerator_price_usd(spec)
    flags.append(_not_catalog_flag(spec, "fallback purchase price"))
    per_w = _c.cost_defaults()["accelerator_usd_per_tdp_w"]
    if not spec.tdp_w:
        raise _c.CarbonDataError(
            f"device {spec.name!r} has no launch_price_usd and no tdp_w; pass accelerator_price_usd explicitly")
    return _c.Factor(per_w.value * float(spec.tdp_w), "USD",
                     f"no price for this {spec.name} spec: {per_w.value:g} USD/W x TDP {spec.tdp_w:g} W ({per_w.source})",
                     assumption=True)


def _resolve(device: str | DeviceSpec) -> DeviceSpec:
    if isinstance(device, DeviceSpec):
        return device
    from wattcast.data.catalog import resolve_device

    return resolve_device(device)


def footprint(device: str | DeviceSpec, gpus: int, hours: float, avg_power_w: float | None = None,
              power_model: PowerModel | None = None, utilisation: float | None = None,
              region: str | None = None, pue: float | None = None, grid_kgco2e_per_kwh: float | None = None,
              flops: float | None = None, *, market_based: bool | None = None, lifetime_years: float | None = None,
              electricity_usd_per_kwh: float | None = None, cloud_usd_per_gpu_hour: float | None = None,
              node_overhead_share: float | None = None, apply_goodput: bool = True,
              assumptions: LifecycleAssumptions | None = None) -> RunFootprint:
    """Lifecycle footprint of ``gpus`` x ``device`` running for ``hours``.

    - ``hours``: failure-free run time; with ``apply_goodput`` (default) the effective time is
      ``hours / goodput`` (failures, checkpoints, restarts). Pass ``apply_goodput=False`` when ``hours``
      is a measured wall-clock time (goodput is then reported as 1 and flagged).
    - Power per accelerator, first of: ``avg_power_w`` (all-in system average per accelerator, the
      Patterson convention: node overhead NOT added unless ``node_overhead_share`` is given);
      ``power_model`` (GPU power: a number, or a callable ``f(utilisation) -> W`` called with
      ``utilisation``; node overhead added); else ``default_power_fraction_of_tdp x TDP`` (flagged; node
      overhead added). ``utilisation`` is a fraction of the compute peak, finite and in [0, 1] (0 is
      meaningful: GPUs held but idle draw idle power); anything else is a ValueError naming it.
    - Grid: ``grid_kgco2e_per_kwh`` (explicit) > ``region`` (shipped table; location-based, or
      market-based with ``market_based=True``) > world average (flagged).
    - ``flops``: useful FLOPs of the run, for CCI. Named arguments override ``assumptions``.
    """
    # every parameter checked up front, so a message names what the caller gave (not an internal quantity)
    if assumptions is not None and not isinstance(assumptions, LifecycleAssumptions):
        raise ValueError(f"assumptions must be a LifecycleAssumptions, got {type(assumptions).__name__}")
    given = dict(pue=pue, grid_kgco2e_per_kwh=grid_kgco2e_per_kwh, lifetime_years=lifetime_years,
                 electricity_usd_per_kwh=electricity_usd_per_kwh, cloud_usd_per_gpu_hour=cloud_usd_per_gpu_hour,
                 node_overhead_share=node_overhead_share, flops=flops)
    for k, v in given.items():
        if v is not None:
            _pos(k, v, zero_ok=_FOOTPRINT_NUMBERS[k])
    if pue is not None and pue < 1:
        raise ValueError(f"pue must be >= 1 (facility energy / IT energy), got {pue!r}")
    if region is not None:
        _region(region)
    if market_based is not None:
        _flag("market_based", market_based)
    _flag("apply_goodput", apply_goodput)
    gpus = _count("gpus", gpus)
    ideal_h = _pos("hours", hours)
    if avg_power_w is not None:
        _pos("avg_power_w", avg_power_w)
    # (``hours`` is not range-checked here: footprint_from_step passes the computed hours of a long run; the
    # footprint command checks its --hours)
    for k, v in dict(given, avg_power_w=avg_power_w).items():
        check_plausible(k, v)
    a = assumptions or LifecycleAssumptions()
    over = {k: v for k, v in dict(pue=pue, region=region, grid_kgco2e_per_kwh=grid_kgco2e_per_kwh,
                                  market_based=market_based, lifetime_years=lifetime_years,
                                  electricity_usd_per_kwh=electricity_usd_per_kwh,
                                  cloud_usd_per_gpu_hour=cloud_usd_per_gpu_hour).items() if v is not None}
    if over:
        a = replace(a, **over)
    spec = _resolve(device)
    if utilisation is not None:  # a fraction of the compute peak, in [0, 1]; 0: GPUs held idle (idle power)
        utilisation = _utilisation(utilisation)
    flags: list[str] = []
    srcs: dict[str, str] = {}

    # ---- power per accelerator
    if avg_power_w is not None:
        p = _pos("avg_power_w", avg_power_w)
        share = 0.0 if node_overhead_share is None else node_overhead_share
        how = "given avg_power_w (all-in per accelerator" + ("; node overhead not added)" if share == 0 else f"; + {share:g} node overhead)")
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
    p_node = node_power_w(p, share)
    if share:
        srcs["node_overhead_share"] = (_c.cost_defaults()["node_overhead_share"].source
                                       if share == _c.cost_defaults()["node_overhead_share"].value else "given")

    # ---- goodput
    mtbf_s = None if a.mtbf_gpu_hours is None else system_mtbf_s(a.mtbf_gpu_hours, gpus)
    interval = a.checkpoint_interval_s
    if apply_goodput:
        if interval is None and mtbf_s is not None and a.checkpoint_write_s > 0:
            interval = young_daly_interval_s(a.checkpoint_write_s, mtbf_s)
        g = goodput(a.checkpoint_write_s, mtbf_s, a.restart_min * 60.0, interval)
        if a.mtbf_gpu_hours is None:
            flags.append("failures not modelled (mtbf_gpu_hours=None)")
    else:
        g = 1.0
        flags.append("goodput not applied: hours taken as measured wall-clock time")

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
        gpu_h = float(gpus) * eff_h
    except OverflowError:  # more GPUs than a float holds
        gpu_h = math.inf
    too_large("GPU-hours", gpu_h)

    # ---- energy and operational carbon
    too_large("IT energy (kWh)", gpu_h * p_node / 1000.0 * a.pue)
    e_it = it_energy_kwh(gpus, p_node, eff_h)
    if a.grid_kgco2e_per_kwh is not None:
        grid, basis, greg = a.grid_kgco2e_per_kwh, "explicit", a.region
        srcs["grid_kgco2e_per_kwh"] = "given"
        if a.region:
            flags.append(f"explicit grid intensity {grid:g} kgCO2e/kWh used instead of region {a.region!r}")
    elif a.market_based and a.market_kgco2e_per_kwh is not None:
        grid, basis, greg = a.market_kgco2e_per_kwh, "market", a.region
        srcs["grid_kgco2e_per_kwh"] = "given (market-based)"
    else:
        if a.region:
            gi = _c.grid_intensity(a.region, market_based=a.market_based)
        else:
            if a.market_based:
                raise _c.CarbonDataError("market_based needs a cloud region or an explicit market_kgco2e_per_kwh")
            gi = _c.world_grid_intensity()
            flags.append(f"no region or grid intensity given: world average {gi.kgco2e_per_kwh:g} kgCO2e/kWh")
        grid, basis, greg = gi.kgco2e_per_kwh, gi.basis, gi.region
        srcs["grid_kgco2e_per_kwh"] = gi.source
    op_kg = operational_kgco2e(e_it, a.pue, grid)

    # ---- embodied
    share_h = amortisation_share(eff_h, a.lifetime_years, a.lifetime_utilisation)
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
    emb_kg = embodied_kgco2e(per_gpu, gpus, eff_h, a.lifetime_years, a.lifetime_utilisation)
    if share_h > 1:
        flags.append(f"run uses {share_h:.2f} x the hardware's productive lifetime")

    # ---- costs
    catalog_own = catalog_spec_matches(spec)
    if a.accelerator_price_usd is not None:
        price, srcs["accelerator_price_usd"] = a.accelerator_price_usd, "given"
    else:
        pf = _accelerator_price(spec, catalog_own, flags)
        price, srcs["accelerator_price_usd"] = pf.value, pf.source
        if pf.assumption:
            flags.append(f"no launch price for {spec.name}: assumed USD {pf.value:,.0f}")
    tdp_kw = (spec.tdp_w or p) * (1.0 + a.node_overhead_share) / 1000.0
    capex = capex_breakdown_usd(price, gpus, eff_h, a.lifetime_years, a.lifetime_utilisation,
                                server_usd_per_gpu=a.server_usd_per_gpu, network_usd_per_gpu=a.network_usd_per_gpu,
                                facility_usd_per_kw=a.facility_usd_per_kw, facility_kw=gpus * tdp_kw,
                                facility_lifetime_years=a.facility_lifetime_years)
    cap = sum(capex.values())
    opx = opex_usd(e_it, a.pue, a.electricity_usd_per_kwh)
    if a.cloud_usd_per_gpu_hour is not None:
        cph: float | None = a.cloud_usd_per_gpu_hour
        srcs["cloud_usd_per_gpu_hour"] = "given"
    else:
        cf = _c.cloud_usd_per_gpu_hour(spec.name)
        if cf is not None and not catalog_own:
            flags.append(_not_catalog_flag(spec, f"cloud price (USD {cf.value:g}/GPU-h)")
                         + "; cloud view unknown: give cloud_usd_per_gpu_hour")
            cf = None
        cph = None if cf is None else cf.value
        if cf is not None:
            srcs["cloud_usd_per_gpu_hour"] = cf.source
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
        grid_kgco2e_per_kwh=grid, grid_basis=basis, grid_region=greg, electricity_usd_per_kwh=a.electricity_usd_per_kwh,
        embodied_kgco2e_per_gpu=per_gpu, embodied_breakdown_kgco2e_per_gpu=breakdown, amortisation_share=share_h,
        capex_breakdown_usd=capex, cloud_usd=None if cph is None else cloud_usd(gpu_h, cph), cloud_usd_per_gpu_hour=cph,
        checkpoint_interval_s=interval if apply_goodput else None,
        system_mtbf_h=None if mtbf_s is None else mtbf_s / 3600.0,
        flops=None if flops is None else float(flops),
        cci_kgco2e_per_pflop=cci,
        tcdp_kgco2e_h=tcdp_kgco2e_h(total_kg, eff_h), flags=tuple(flags), sources=srcs,
    )


def format_footprint(fp: RunFootprint) -> str:
    """A short human-readable summary (what ``wattcast footprint`` without ``--json`` can print)."""
    lines = [
        f"{fp.gpus} x {fp.device}: {fp.hours:,.1f} h ({fp.ideal_hours:,.1f} h failure-free, goodput {fp.goodput:.3f}), "
        f"{fp.gpu_hours:,.0f} GPU-h",
        f"power {fp.avg_power_w:,.0f} W/GPU -> {fp.node_power_w:,.0f} W incl. node [{fp.power_source}]",
        f"energy {fp.energy_mwh:,.2f} MWh (IT {fp.it_energy_mwh:,.2f} MWh x PUE {fp.pue:g})",
        f"grid {fp.grid_kgco2e_per_kwh:.3f} kgCO2e/kWh ({fp.grid_basis}{', ' + fp.grid_region if fp.grid_region else ''})",
        f"CO2e: operational {fp.operational_tco2e:,.2f} t + embodied {fp.embodied_tco2e:,.2f} t = {fp.total_tco2e:,.2f} t",
        f"cost: CapEx ${fp.capex_usd:,.0f} + OpEx ${fp.opex_usd:,.0f} = TCO ${fp.tco_usd:,.0f}"
        + (f"  (cloud on-demand view: ${fp.cloud_usd:,.0f} at ${fp.cloud_usd_per_gpu_hour:g}/GPU-h)" if fp.cloud_usd is not None else ""),
    ]
    if fp.cci_kgco2e_per_pflop is not None:
        lines.append(f"CCI {fp.cci_kgco2e_per_pflop:.3g} kgCO2e/PFLOP; tCDP {fp.tcdp_kgco2e_h:,.0f} kgCO2e*h")
    else:
        lines.append(f"tCDP {fp.tcdp_kgco2e_h:,.0f} kgCO2e*h")
    lines += [f"note: {f}" for f in fp.flags]
    return "\n".join(lines)


def footprint_from_step(device: str | DeviceSpec, gpus: int, *, step_time_ms: float, gpu_power_w: float, tokens: float,
                        tokens_per_step: float, flops_per_step: float | None = None, **kw) -> RunFootprint:
    """A training run of ``tokens`` tokens made of predicted steps: ``ceil(tokens / tokens_per_step)`` steps of
    ``step_time_ms`` at ``gpu_power_w`` per GPU (the power surrogate's GPU-only average; node overhead is
    added by :func:`footprint`). ``kw`` goes to :func:`footprint` (region, pue, lifetime_years, ...).
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
    return footprint(device, gpus, hours, power_model=float(gpu_power_w), flops=flops, **kw)


def run_of_prediction(prediction, *, tokens: float, tokens_per_step: float, device: str | DeviceSpec | None = None,
                      **kw) -> RunFootprint:
    """The run of ``tokens`` tokens made of ``prediction``'s steps (a StepPrediction or DistributedPrediction):
    its step time, average GPU power, GPU count and FLOPs per step; ``device`` (default: the prediction's) is the
    spec whose price and embodied carbon are used. ``kw``: region, pue, lifetime_years, grid_kgco2e_per_kwh, ...
    (None values are dropped). The CLI and the Python API both compute a run through this function."""
    kw = {k: v for k, v in kw.items() if v is not None}
    return footprint_from_step(device if device is not None else prediction.device, int(getattr(prediction, "gpus", 1)),
                               step_time_ms=prediction.step_time_ms, gpu_power_w=prediction.avg_power_w, tokens=tokens,
                               tokens_per_step=tokens_per_step, flops_per_step=prediction.flops, **kw)
