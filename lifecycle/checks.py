"""Checks shared by the lifecycle calculator: the run's own numbers (gpus, hours, power, utilisation) are validated
here with a message that names them (and their command-line flag), figures outside a plausible range
(:data:`PLAUSIBLE`) are refused as probably in another unit, and :func:`catalog_spec_matches` (from
:mod:`wattcast.data.catalog_match`, shared with the kernel surrogates) decides when name-keyed
tables may stand for a device spec. The assumptions (``LifecycleAssumptions``) are validated by a pydantic model
(``lifecycle/assumptions.py``) with the same ranges."""

from __future__ import annotations

import math
import numbers
from typing import Any

from numpy import bool_ as np_bool

from wattcast.data.catalog_match import catalog_spec_matches  # noqa: F401  (re-exported: lifecycle's name-keyed tables)
from wattcast.data.checks import implausible, is_count
from wattcast.data.device_spec import PLAUSIBLE as _DEVICE_PLAUSIBLE, DeviceSpec


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


#: parameter -> (lowest, highest plausible value, what a too-small figure probably is, what a too-large one is, unit):
#: a figure outside is almost surely in another unit (a share given as a percent, g instead of kg, mW or the power
#: of all GPUs instead of one); refused unless --force (:func:`wattcast.data.checks.allow_exotic`).
PLAUSIBLE: dict[str, tuple[float, float, str, str, str]] = {
    "avg_power_w": (1.0, 10_000.0, "kilowatts", "milliwatts, or the power of all GPUs together", "watts per accelerator"),
    "hours": (0.0, 1e6, "-", "seconds or minutes (1e6 hours is 114 years)", "hours"),
    "lifetime_years": (0.25, 50.0, "another unit (1e-9 years is 0.03 s)", "months, days or hours", "years"),
    "node_overhead_share": (0.0, 2.0, "-", "a percent (50 means 0.5)", "a share of the GPU's TDP (0.3 = 30%)"),
    "pue": (1.0, 4.0, "-", "a percent (120 means 1.2)", "a ratio (facility / IT energy)"),
    # 0 is allowed (:data:`ZERO_ALLOWED`: a run on carbon-free or free power); above it, the cleanest grids give ~0.01
    # kg/kWh and the cheapest power ~0.02 USD/kWh, so a figure under 1e-3 is one in the unit 1,000x larger
    "grid_kgco2e_per_kwh": (1e-3, 2.0, "tonnes per kWh (0.0004 t means 0.4 kg)", "grams per kWh (481 means 0.481)",
                            "kgCO2e per kWh"),
    "electricity_usd_per_kwh": (1e-3, 2.0, "USD per Wh (0.0001 USD/Wh means 0.1 USD/kWh)", "cents or USD per MWh",
                                "USD per kWh"),
    # the dearest list price in cloud_prices.yaml is 12.29 USD/GPU-h (Azure ND96isr H100 v5, 98.32 USD/h / 8 GPUs;
    # AWS p5.48xlarge's pre-June-2025 list was the same 98.32 / 8), the cheapest 0.526 (AWS g4dn.xlarge, one T4): 30
    # leaves 2.4x room for dearer parts, while a price in cents (350 for 3.50 USD) or of a whole 8-GPU H100 node
    # (55-98 USD/h) is refused (an 8 x A100 node's 22 USD/h is not: it overlaps real per-GPU prices)
    "cloud_usd_per_gpu_hour": (0.0, 30.0, "-", "cents, or the price of a whole node or month", "USD per GPU-hour"),
    # a purchase price has the range of a device spec's launch_price_usd (data/device_spec.py PLAUSIBLE: 33.6 is
    # thousands, 33.6e6 cents); 0 allowed (hardware already paid off)
    "accelerator_price_usd": _DEVICE_PLAUSIBLE["launch_price_usd"],
    # lifetime embodied carbon of one accelerator with its server share: the shipped ACT-style estimates are
    # 104-161 kg (device alone 5-63 kg, data/carbon/embodied_factors.yaml); Luccioni et al. 2022 (BLOOM, arXiv
    # 2211.02001) take 150 kg per GPU and 2,500 kg per 8-GPU node. Under 1 kg is tonnes; over 10,000 kg (4 whole
    # BLOOM nodes on one GPU) is grams or a whole cluster's. 0 allowed (embodied left out)
    # ---- the amortised CapEx inputs (audit 58c finding 3: until stop 58 a price in thousands, a 500-year facility or
    # a 1% productive life were taken silently). Defaults in data/carbon/costs.yaml.
    # server (less its GPUs) per GPU slot: default 6,250 (~USD 50,000 per 8-GPU HGX-class server); a whole DGX H100
    # with its 8 GPUs is ~USD 300-400k, ~50k per GPU, so 100,000 per GPU is over any server's slot: a price in cents or
    # a whole server's; under 100 is thousands (6.25 for 6,250) or a server price per thousand GPUs
    "server_usd_per_gpu": (100.0, 100_000.0, "thousands of USD (6.25 means 6,250)",
                           "cents, or the price of a whole server rather than its share per GPU", "USD per GPU"),
    # NIC, switch ports and optics per GPU: default 4,000 (one 400G NIC and its fabric share); a whole 51.2 Tb/s
    # switch is ~USD 20-50k, so 100,000 per GPU is a switch's or fabric's price or cents; under 10 is thousands
    "network_usd_per_gpu": (10.0, 100_000.0, "thousands of USD (4 means 4,000)",
                            "cents, or the price of a whole switch or fabric rather than its share per GPU",
                            "USD per GPU"),
    # facility build-out per kW of IT load: default 10,000 (the quoted USD 7-12M per MW); 1,000-100,000 leaves ~10x
    # either side of that range, while 10 (the "USD 10M/MW" typed as thousands per kW, or USD per W) and 1e7 (USD per
    # MW) are refused
    "facility_usd_per_kw": (1_000.0, 100_000.0, "thousands of USD per kW or USD per W (10 means 10,000 USD/kW)",
                            "USD per MW (1e7 means 10,000 USD/kW), or cents", "USD per kW of provisioned IT load"),
    # the facility shell, power and cooling: default 15 years; the same range as the hardware's lifetime_years
    "facility_lifetime_years": (0.25, 50.0, "another unit (1e-9 years is 0.03 s)", "months, days or hours", "years"),
    # share of the hardware's life in productive use: default 0.8 (costs.yaml, an assumption); at 0.05 each run pays
    # 16x the default's amortised CapEx and embodied carbon: a lower figure is a share divided by 100 twice (0.008
    # for 80%) or the GPU's compute utilisation (MFU, --utilisation) rather than its lifetime in use (a judgment
    # bound, not a published one; --force takes it). (0, 1] is a hard rule besides (a percent, 80, is refused there)
    "lifetime_utilisation": (0.05, 1.0, "a share divided by 100 twice (0.008 for 80%), or the GPU's compute "
                             "utilisation rather than the share of its lifetime in productive use", "a percent (80 means 0.8)",
                             "a fraction of the hardware's lifetime hours"),
    # accelerators per server for the server's embodied share: default 8 (DGX H100 datasheet); a GB200 NVL72 rack,
    # one NVLink domain of 72 GPUs, is the most one "server" holds; 10,000 is a cluster's GPUs
    "gpus_per_server": (1.0, 72.0, "-", "the GPUs of a cluster or of several racks, not of one server",
                        "accelerators per server"),
    "embodied_kgco2e_per_gpu": (1.0, 10_000.0, "tonnes (0.15 t means 150 kg)",
                                "grams (150000 g means 150 kg), or the embodied carbon of a whole server or cluster",
                                "kgCO2e per accelerator"),
    # a synchronous write of even a multi-TB checkpoint takes minutes (Llama 3 405B: seconds to minutes); a day is far
    # beyond any real one and would make the Young/Daly interval meaningless
    "checkpoint_write_s": (0.0, 86_400.0, "-", "milliseconds (60000 means 60 s), or not one write (1 day = 86400 s)",
                           "seconds per checkpoint write"),
}
# a market-based factor is the same quantity in the same unit as the grid intensity: the same range, checked by the same
# validator (until stop 58 it had none, so 400, g/kWh given as kg, charged 1,000x the CO2e: audit 58c finding 1)
PLAUSIBLE["market_kgco2e_per_kwh"] = PLAUSIBLE["grid_kgco2e_per_kwh"]
#: parameters whose lower bound is exclusive: a run of 0 hours has no footprint (``footprint`` refuses it too)
_ABOVE_ZERO = frozenset({"hours"})
#: parameters whose plausible range starts above 0 but that may be exactly 0 (carbon-free or free electricity)
ZERO_ALLOWED = frozenset({"grid_kgco2e_per_kwh", "market_kgco2e_per_kwh", "electricity_usd_per_kwh",
                          "accelerator_price_usd", "embodied_kgco2e_per_gpu", "server_usd_per_gpu",
                          "network_usd_per_gpu", "facility_usd_per_kw"})
#: the command-line option of each footprint parameter (named in messages)
_FLAGS = {"avg_power_w": "--avg-power-w", "hours": "--hours", "lifetime_years": "--lifetime-years",
          "node_overhead_share": "--node-overhead-share", "pue": "--pue", "grid_kgco2e_per_kwh": "--grid-kgco2e-per-kwh",
          "electricity_usd_per_kwh": "--electricity-usd-per-kwh", "cloud_usd_per_gpu_hour": "--cloud-usd-per-gpu-hour",
          "checkpoint_write_s": "--checkpoint-write-s", "mtbf_gpu_hours": "--mtbf-gpu-hours", "tokens": "--tokens"}


def check_plausible(name: str, v: float | None) -> None:
    """ValueError when ``v`` is outside :data:`PLAUSIBLE` (unless allow_exotic / --force), naming the parameter and
    its flag. (The fields of ``LifecycleAssumptions`` get the same ranges from its pydantic model.)"""
    if v is None or name not in PLAUSIBLE:
        return
    label = name + (f" ({_FLAGS[name]})" if name in _FLAGS else "")
    lo, hi, low_hint, _, unit = PLAUSIBLE[name]
    try:
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{label} must be a finite number of {unit}, got {v!r}") from None
    if not math.isfinite(x):  # (NaN compares false with both bounds: it must not read as "under" one of them)
        raise ValueError(f"{label} must be a finite number of {unit}, got {v!r}")
    if name in _ABOVE_ZERO and x <= 0:  # a run of no time: one message for 0 and below (the calculator's own)
        raise ValueError(f"{label} must be above 0 ({unit}), got {x:g}")
    if x < lo and low_hint == "-":  # no unit mix-up to suggest: below a hard floor (a negative figure)
        raise ValueError(f"{label} must not be below {lo:g} ({unit}), got {x:g}")
    if name in ZERO_ALLOWED and x < 0:  # (0 is allowed: free or carbon-free power) below it a hard floor, no unit slip
        raise ValueError(f"{label} must not be below 0 ({unit}), got {x:g}")
    msg = implausible(label, x, *PLAUSIBLE[name], zero_ok=name in ZERO_ALLOWED)
    if msg:
        raise ValueError(msg)


#: the most a measured all-in power per accelerator (``--avg-power-w``: the GPU plus its share of the node) may be:
#: ``AVG_POWER_TDP_MULTIPLE`` x the device's TDP + ``AVG_POWER_HOST_ALLOWANCE_W``. The heaviest node share cited here is
#: the DGX H100's: 10.2 kW nameplate over 8 x 700 W GPUs (NVIDIA DGX H100 datasheet; costs.yaml node_overhead_share)
#: = 1,275 W, 1.82 x TDP per GPU; the multiple covers it, the allowance a small card alone in a server (one 70 W T4
#: under a ~300-500 W host). An H100 at 3,000 W (4.3 x TDP) is the power of several GPUs or of a node, not of one.
AVG_POWER_TDP_MULTIPLE = 2.0
AVG_POWER_HOST_ALLOWANCE_W = 500.0


def check_avg_power_for_device(avg_power_w: float, spec: DeviceSpec) -> None:
    """ValueError when a given all-in power per accelerator exceeds what one ``spec`` and its share of a node can draw
    (:data:`AVG_POWER_TDP_MULTIPLE` x TDP + :data:`AVG_POWER_HOST_ALLOWANCE_W`; unless allow_exotic / --force).
    A spec without ``tdp_w`` is not checked here (the generic range of :data:`PLAUSIBLE` still applies)."""
    if not spec.tdp_w:
        return
    tdp = float(spec.tdp_w)
    hi = AVG_POWER_TDP_MULTIPLE * tdp + AVG_POWER_HOST_ALLOWANCE_W
    msg = implausible(f"avg_power_w ({_FLAGS['avg_power_w']})", float(avg_power_w), PLAUSIBLE["avg_power_w"][0], hi,
                      PLAUSIBLE["avg_power_w"][2],
                      f"the power of several GPUs or of a whole node ({float(avg_power_w) / tdp:.1f} x the "
                      f"{spec.name}'s {tdp:g} W TDP; one GPU with its share of a node draws at most "
                      f"{AVG_POWER_TDP_MULTIPLE:g} x TDP + {AVG_POWER_HOST_ALLOWANCE_W:g} W)",
                      "watts per accelerator")
    if msg:
        raise ValueError(msg)


def _not_catalog_flag(spec: DeviceSpec, what: str) -> str:
    return (f"the spec named {spec.name!r} is not the catalog's {spec.name} (its figures differ): the catalog's "
            f"{what} for that name is not used")


def _resolve(device: str | DeviceSpec) -> DeviceSpec:
    if isinstance(device, DeviceSpec):
        return device
    from wattcast.data.catalog import resolve_device

    return resolve_device(device)

