"""The inputs of the lifecycle calculator besides the run itself (:class:`LifecycleAssumptions`), and
:func:`assumptions_from_options`, which builds them from the loose options of the CLI and the Python API
(``--pue``, ``region=``, ...) with messages that name those options."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Callable

from wattcast.data import carbon as _c
from wattcast.lifecycle.checks import (_FLAG_FIELDS, _FOOTPRINT_NUMBERS, PLAUSIBLE, _flag, _pos, _region,
                                       check_plausible)


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
    #: None: the region's price (``electricity_prices.yaml``), else the global default (costs.yaml); given: wins
    electricity_usd_per_kwh: float | None = None
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
    #: where a given ``cloud_usd_per_gpu_hour`` comes from (e.g. a cluster spec), said in the output; None: "given"
    cloud_price_source: str | None = None
    #: cloud pricing plan of the table's price: on-demand, reserved-1y or reserved-3y (cloud_prices.yaml)
    pricing: str = "on-demand"
    embodied_kgco2e_per_gpu: float | None = None  # None: ACT-style estimate (device + server share)
    include_server_embodied: bool = True

    def __post_init__(self) -> None:
        for f in _FLAG_FIELDS:
            _flag(f"LifecycleAssumptions.{f}", getattr(self, f))
        if self.region is not None:
            _region(self.region, "LifecycleAssumptions.region")
        object.__setattr__(self, "pricing", _c.check_pricing(self.pricing, "LifecycleAssumptions.pricing"))
        if self.cloud_price_source is not None and not isinstance(self.cloud_price_source, str):
            raise ValueError(f"LifecycleAssumptions.cloud_price_source must be a string, got {self.cloud_price_source!r}")
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or f.name in _FLAG_FIELDS or f.name in ("region", "pricing", "cloud_price_source"):
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
            if f.name == "cloud_price_source":  # names the source of cloud_usd_per_gpu_hour, not a figure
                continue
            v = getattr(self, f.name)
            dflt = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
            if v != dflt:
                out[f.name] = "given" if f.name != "cloud_usd_per_gpu_hour" or not self.cloud_price_source \
                    else self.cloud_price_source
            elif f.name in defaults:
                out[f.name] = defaults[f.name].source
            elif f.name == "gpus_per_server":
                out[f.name] = _c.server_defaults()["gpus_per_server"].source
        return out




def assumptions_from_options(assumptions: LifecycleAssumptions | None = None, *, pue: float | None = None,
                             region: str | None = None, grid_kgco2e_per_kwh: float | None = None,
                             market_based: bool | None = None, lifetime_years: float | None = None,
                             electricity_usd_per_kwh: float | None = None,
                             cloud_usd_per_gpu_hour: float | None = None, mtbf_gpu_hours: float | None = None,
                             checkpoint_write_s: float | None = None, pricing: str | None = None,
                             cloud_price_source: str | None = None) -> LifecycleAssumptions:
    """``assumptions`` (default: the shipped defaults) with the options that are not None put in its place: the
    object the CLI flags (``--pue``, ``--region``, ...) and the Python API's keywords describe. Each option is checked
    first, so a ValueError names the option as the caller gave it (``pue (--pue)``), not a field of the object."""
    if assumptions is not None and not isinstance(assumptions, LifecycleAssumptions):
        raise ValueError(f"assumptions must be a LifecycleAssumptions, got {type(assumptions).__name__}")
    given = dict(pue=pue, grid_kgco2e_per_kwh=grid_kgco2e_per_kwh, lifetime_years=lifetime_years,
                 electricity_usd_per_kwh=electricity_usd_per_kwh, cloud_usd_per_gpu_hour=cloud_usd_per_gpu_hour,
                 mtbf_gpu_hours=mtbf_gpu_hours, checkpoint_write_s=checkpoint_write_s)
    for k, v in given.items():
        if v is not None:
            _pos(k, v, zero_ok=_FOOTPRINT_NUMBERS[k])
    if pue is not None and pue < 1:
        raise ValueError(f"pue must be >= 1 (facility energy / IT energy), got {pue!r}")
    if region is not None:
        _region(region)
    if market_based is not None:
        _flag("market_based", market_based)
    if pricing is not None:
        pricing = _c.check_pricing(pricing)
    if cloud_price_source is not None and not isinstance(cloud_price_source, str):
        raise ValueError(f"cloud_price_source must be a string, got {cloud_price_source!r}")
    for k, v in given.items():
        check_plausible(k, v)
    a = assumptions or LifecycleAssumptions()
    over = {k: v for k, v in dict(given, region=region, market_based=market_based, pricing=pricing,
                                  cloud_price_source=cloud_price_source).items() if v is not None}
    return replace(a, **over) if over else a
