"""The inputs of the lifecycle calculator besides the run itself (:class:`LifecycleAssumptions`), and
:func:`assumptions_from_options`, which builds them from the loose options of the CLI and the Python API
(``--pue``, ``region=``, ...) with messages that name those options."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Annotated, Any, Callable

from numpy import bool_ as np_bool
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from wattcast.data import carbon as _c
from wattcast.data.spec_model import FIELD, first_location, first_problem, number, optional, plausible, problem, text
from wattcast.lifecycle.checks import _FLAGS, PLAUSIBLE, ZERO_ALLOWED


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
    #: market-based override, kgCO2e/kWh (the range of grid_kgco2e_per_kwh); needs market_based=True (else refused)
    market_kgco2e_per_kwh: float | None = None
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
        """Every field checked on :class:`LifecycleAssumptionsModel` (a ValueError naming
        ``LifecycleAssumptions.<field>``); the pricing plan is kept normalised (``On_Demand`` -> ``on-demand``)."""
        m = _validated({f.name: getattr(self, f.name) for f in fields(self)}, lambda f: f"LifecycleAssumptions.{f}")
        object.__setattr__(self, "pricing", m.pricing)
        if self.market_kgco2e_per_kwh is not None and not self.market_based:
            # used only with market_based=True: until stop 58 it was ignored without a word (audit 58c finding 1)
            raise ValueError(
                f"LifecycleAssumptions.market_kgco2e_per_kwh is {self.market_kgco2e_per_kwh!r} but market_based is "
                "False, so it would be ignored (the location-based figure used instead): pass market_based=True with "
                "it, or give the figure as grid_kgco2e_per_kwh")

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




# ------------------------------------------------------------------ validation (pydantic v2, as data/spec_model.py)
def _positive(zero: bool = False) -> AfterValidator:
    """A finite number, > 0 (>= 0 with ``zero``), kept as given."""
    return AfterValidator(optional(number(zero=zero, type_msg="must be a finite number, got {v!r}",
                                          value_msg=f"must be {'non-negative' if zero else 'positive'}, got {{v!r}}")))


def _range(name: str) -> tuple:
    """The plausible range of ``name`` (``checks.PLAUSIBLE``; units off by 1,000x), lifted by ``--force``; 0 passes
    for the figures of ``checks.ZERO_ALLOWED`` (free or carbon-free power)."""
    if name not in PLAUSIBLE:
        return ()
    return (AfterValidator(optional(plausible(*PLAUSIBLE[name], zero_ok=name in ZERO_ALLOWED))),)


def _figure(name: str, *, zero: bool = False, rule: Callable[[Any], Any] | None = None) -> Any:
    """A numeric assumption: finite and positive (non-negative with ``zero``), then ``rule`` (a hard bound), then its
    plausible range."""
    checks = (_positive(zero), *((AfterValidator(optional(rule)),) if rule else ()), *_range(name))
    return Annotated[(Any, *checks)]


def _at_least_one(v: Any) -> Any:
    if v < 1:
        raise problem("wc_value", f"{FIELD} must be >= 1 (facility energy / IT energy), got {v!r}")
    return v


def _fraction(v: Any) -> Any:
    if v > 1:
        raise problem("wc_value", f"{FIELD} must be in (0, 1], got {v!r}")
    return v


def _tdp_fraction(v: Any) -> Any:
    if v > 1.5:
        raise problem("wc_value", f"{FIELD} looks wrong (> 1.5 x TDP), got {v!r}")
    return v


def _yes_no(v: Any) -> Any:
    """True or False (a string such as 'no' would read as True)."""
    if not isinstance(v, (bool, np_bool)):
        raise problem("wc_type", f"{FIELD} must be True or False, got {v!r}")
    return v


def _grid_region(v: Any) -> Any:
    """A grid region: a non-empty string (an empty one would silently fall back to the world average)."""
    if not isinstance(v, str):
        raise problem("wc_type", f"{FIELD} must be a string (country ISO3 code or name, cloud region such as "
                                 f"gcp:us-central1, or 'world'), got {v!r}")
    if not v.strip():
        raise problem("wc_value", f"empty region ({FIELD}={v!r}); give a country ISO3 code, a cloud region or "
                                  "'world', or leave it out for the world average")
    return v


def _pricing_plan(v: Any) -> Any:
    """A cloud pricing plan (cloud_prices.yaml), normalised."""
    try:
        return _c.check_pricing(v, FIELD)
    except _c.CarbonDataError as e:
        raise problem("wc_value", str(e)) from None


_Flag = Annotated[Any, AfterValidator(optional(_yes_no))]


class LifecycleAssumptionsModel(BaseModel):
    """The validation model of :class:`LifecycleAssumptions` (its fields, units in their names, in the order problems
    are reported): types, positive finite figures, hard bounds (PUE >= 1, a utilisation share <= 1) and the plausible
    ranges of ``checks.PLAUSIBLE`` (a figure 1,000x off: a PUE of 50, a lifetime of 1e-9 years, a share given as a
    percent; lifted by :func:`wattcast.data.checks.allow_exotic` / ``--force``). Values are checked, never converted
    (but for the pricing plan's spelling). Every field defaults to None here: a partial set of values (the options a
    caller gave) is checked alone, the rest is what :class:`LifecycleAssumptions` already holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pue: _figure("pue", rule=_at_least_one) = None
    lifetime_years: _figure("lifetime_years") = None
    lifetime_utilisation: _figure("lifetime_utilisation", rule=_fraction) = None
    electricity_usd_per_kwh: _figure("electricity_usd_per_kwh", zero=True) = None
    region: Annotated[Any, AfterValidator(optional(_grid_region))] = None
    grid_kgco2e_per_kwh: _figure("grid_kgco2e_per_kwh", zero=True) = None
    market_based: _Flag = None
    market_kgco2e_per_kwh: _figure("market_kgco2e_per_kwh", zero=True) = None
    accelerator_price_usd: _figure("accelerator_price_usd", zero=True) = None
    server_usd_per_gpu: _figure("server_usd_per_gpu", zero=True) = None
    network_usd_per_gpu: _figure("network_usd_per_gpu", zero=True) = None
    facility_usd_per_kw: _figure("facility_usd_per_kw", zero=True) = None
    facility_lifetime_years: _figure("facility_lifetime_years") = None
    node_overhead_share: _figure("node_overhead_share", zero=True) = None
    default_power_fraction_of_tdp: _figure("default_power_fraction_of_tdp", rule=_tdp_fraction) = None
    gpus_per_server: _figure("gpus_per_server") = None
    mtbf_gpu_hours: _figure("mtbf_gpu_hours") = None
    checkpoint_write_s: _figure("checkpoint_write_s", zero=True) = None
    checkpoint_interval_s: _figure("checkpoint_interval_s") = None
    restart_min: _figure("restart_min", zero=True) = None
    cloud_usd_per_gpu_hour: _figure("cloud_usd_per_gpu_hour", zero=True) = None
    cloud_price_source: Annotated[Any, AfterValidator(optional(text(type_msg="must be a string, got {v!r}")))] = None
    pricing: Annotated[Any, AfterValidator(optional(_pricing_plan))] = None
    embodied_kgco2e_per_gpu: _figure("embodied_kgco2e_per_gpu", zero=True) = None
    include_server_embodied: _Flag = None


#: the error class of a bad value, by field (the ones a caller may catch specifically); else ValueError
_ERROR_OF = {"region": _c.UnknownRegionError, "pricing": _c.CarbonDataError}


def _validated(values: dict[str, Any], label: Callable[[str], str]) -> LifecycleAssumptionsModel:
    """``values`` checked on :class:`LifecycleAssumptionsModel`; the first problem (by kind, then field order) as a
    ValueError whose message names the field as ``label`` gives it."""
    try:
        return LifecycleAssumptionsModel.model_validate(values)
    except ValidationError as e:
        loc = first_location(e)
        raise _ERROR_OF.get(loc[0] if loc else None, ValueError)(first_problem(e, label=label)) from None


def _option_label(name: str) -> str:
    """An option as the CLI and the Python API's keywords name it: ``pue (--pue)``, else the bare keyword."""
    return f"{name} ({_FLAGS[name]})" if name in _FLAGS else "pricing (--pricing)" if name == "pricing" else name


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
    over = {k: v for k, v in dict(pue=pue, region=region, grid_kgco2e_per_kwh=grid_kgco2e_per_kwh,
                                  market_based=market_based, lifetime_years=lifetime_years,
                                  electricity_usd_per_kwh=electricity_usd_per_kwh,
                                  cloud_usd_per_gpu_hour=cloud_usd_per_gpu_hour, mtbf_gpu_hours=mtbf_gpu_hours,
                                  checkpoint_write_s=checkpoint_write_s, pricing=pricing,
                                  cloud_price_source=cloud_price_source).items() if v is not None}
    if over:  # the given options alone, on the same model: a message names the option as the caller gave it
        _validated(over, _option_label)
    a = assumptions or LifecycleAssumptions()
    return replace(a, **over) if over else a


def check_run_options(values: dict[str, Any], label: Callable[[str], str] = _option_label) -> None:
    """The options of :func:`assumptions_from_options` among ``values`` (others are left to their own checks), checked
    as it checks them; a ValueError names the option as ``label`` gives it (a sweep spec: its key)."""
    import inspect

    names = [p for p in inspect.signature(assumptions_from_options).parameters if p != "assumptions"]
    over = {k: v for k, v in values.items() if k in names and v is not None}
    if over:
        _validated(over, label)

