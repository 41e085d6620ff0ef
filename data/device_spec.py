"""The device spec schema (version 1): one accelerator described by its datasheet.

Units live in the field names. Every non-empty figure carries a citation: either the
spec-wide ``source`` or a per-field entry in ``sources``.

Every :class:`DeviceSpec` checks its own values when it is built (``__post_init__``), whatever builds it:
a spec file, NeuSight JSON import, the catalog, ``dataclasses.replace`` or user code. Missing required
fields, numbers that are not finite and positive (or are given as text), text fields that are not strings
(``name``, ``vendor``, ``arch``, ``interconnect``, ``memory_type``, ``source``), ``aliases`` that is not a
list of strings, ``sources`` that is not a mapping of strings, and inconsistent figures raise
:class:`DeviceSpecError` naming the field and the value. Numbers may be ints, floats or numpy scalars.
``validate`` (used by the file loaders) adds the citation rule: every figure needs a ``source``.

``tdp_w`` (and ``idle_power_w``) are optional in the schema: a spec without them loads, and kernel latency
(``wattcast.predict_kernels``) needs neither. The power model does need ``tdp_w``, and every step prediction
(``wattcast.predict``, ``predict_cluster``, ``search``) also reports the step's power and energy, so those, and
``wattcast.footprint`` without ``avg_power_w``, raise a clear :class:`DeviceSpecError` asking for ``tdp_w``
when it is missing. Give ``tdp_w`` for any device you want step, energy or footprint predictions for.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from wattcast.data.checks import exotic_allowed

SCHEMA_VERSION = 1

#: dtypes a kernel can run in, and the peak field each one uses for matrix (GEMM/conv) work.
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")

_REQUIRED = (
    "name",
    "peak_fp32_tflops",
    "memory_gb",
    "memory_bandwidth_gbps",
    "num_sms",
    "boost_clock_mhz",
    "l2_cache_mb",
)

_NUMERIC = (
    "peak_fp32_tflops",
    "peak_fp32_matrix_tflops",
    "peak_tf32_tflops",
    "peak_fp16_tflops",
    "peak_bf16_tflops",
    "peak_fp8_tflops",
    "memory_gb",
    "memory_bandwidth_gbps",
    "num_sms",
    "cores_per_sm",
    "base_clock_mhz",
    "boost_clock_mhz",
    "l2_cache_mb",
    "tdp_w",
    "idle_power_w",
    "interconnect_bandwidth_gbps",
    "process_node_nm",
    "die_area_mm2",
    "launch_price_usd",
)

#: fields that hold text (None allowed where the field is optional)
_TEXT = ("name", "vendor", "arch", "interconnect", "memory_type", "source")

VENDORS = ("nvidia", "amd", "intel", "other")


class DeviceSpecError(ValueError):
    """A device spec is missing a field, has an impossible value, or contradicts itself."""


class SpecRecord:
    """What device and cluster specs share: a flat dict without empty fields, and the source of each figure."""

    source: str
    sources: Mapping[str, str]
    aliases: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)  # type: ignore[call-overload]
        d["aliases"] = list(self.aliases)
        d["sources"] = dict(self.sources)
        return {k: v for k, v in d.items() if v not in (None, "", [], {})}

    def source_of(self, field_name: str) -> str:
        return self.sources.get(field_name) or self.source


@dataclass(frozen=True)
class DeviceSpec(SpecRecord):
    """One accelerator. Peaks are dense (no sparsity) datasheet figures."""

    name: str
    peak_fp32_tflops: float  # vector (CUDA-core / SIMD) FP32
    memory_gb: float
    memory_bandwidth_gbps: float  # GB/s, 1 GB = 1e9 bytes
    num_sms: int  # SMs (NVIDIA) or CUs (AMD)
    boost_clock_mhz: float
    l2_cache_mb: float  # last-level on-die cache (AMD MI300: Infinity Cache counted separately, not here)
    vendor: str = "nvidia"
    arch: str = ""
    aliases: tuple[str, ...] = ()
    peak_fp32_matrix_tflops: float | None = None  # FP32 on matrix units (AMD MFMA); None = same as vector
    peak_tf32_tflops: float | None = None
    peak_fp16_tflops: float | None = None  # tensor/matrix-core dense FP16
    peak_bf16_tflops: float | None = None
    peak_fp8_tflops: float | None = None
    cores_per_sm: int | None = None
    base_clock_mhz: float | None = None
    tdp_w: float | None = None  # optional here, but the power model (step energy, footprint) needs it
    idle_power_w: float | None = None
    interconnect: str | None = None  # e.g. "NVLink4", "PCIe4 x16"
    interconnect_bandwidth_gbps: float | None = None  # per GPU, total both directions, GB/s
    process_node_nm: float | None = None
    die_area_mm2: float | None = None
    launch_price_usd: float | None = None
    memory_type: str | None = None
    source: str = ""  # default citation for every figure
    sources: Mapping[str, str] = field(default_factory=dict)  # per-field citation overrides
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        # every construction path (files, NeuSight import, catalog, dataclasses.replace, user code) is checked
        if isinstance(self.aliases, list):
            object.__setattr__(self, "aliases", tuple(self.aliases))
        check_values(self)

    # ----------------------------------------------------------------- derived
    @property
    def key(self) -> str:
        return normalise_name(self.name)

    def peak_matrix_tflops(self, dtype: str) -> float:
        """Dense peak for GEMM/conv work in ``dtype``; falls back along fp8->fp16->tf32->fp32."""
        dtype = dtype.lower()
        if dtype not in DTYPES:
            raise DeviceSpecError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        fp32_mm = self.peak_fp32_matrix_tflops or self.peak_fp32_tflops
        chain = {
            "fp32": [fp32_mm],
            "tf32": [self.peak_tf32_tflops, fp32_mm],
            "bf16": [self.peak_bf16_tflops, self.peak_fp16_tflops, self.peak_tf32_tflops, fp32_mm],
            "fp16": [self.peak_fp16_tflops, self.peak_bf16_tflops, self.peak_tf32_tflops, fp32_mm],
            "fp8": [self.peak_fp8_tflops, self.peak_fp16_tflops, self.peak_bf16_tflops, fp32_mm],
        }[dtype]
        return float(next(v for v in chain if v))

    def has_native(self, dtype: str) -> bool:
        """True when the datasheet lists a dedicated peak for this dtype."""
        return {
            "fp32": True,
            "tf32": self.peak_tf32_tflops is not None,
            "fp16": self.peak_fp16_tflops is not None,
            "bf16": self.peak_bf16_tflops is not None,
            "fp8": self.peak_fp8_tflops is not None,
        }[dtype.lower()]



def normalise_name(name: str) -> str:
    """Case- and punctuation-insensitive key: 'NVIDIA A100-PCIE-40GB' -> 'nvidiaa100pcie40gb'."""
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def _where(spec: DeviceSpec) -> str:
    name = getattr(spec, "name", None)
    return f"device {name!r}" if isinstance(name, str) and name else "device spec"


def _is_number(v: Any) -> bool:
    """An int, float or numpy scalar number (not a bool, not text)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


#: field -> (lowest, highest plausible value, the unit a too-small figure is likely in, the unit a too-large one is):
#: figures 1,000x off, e.g. TDP in kW, memory in bytes, bandwidth in B/s or TB/s, a peak in FLOP/s, a clock in Hz.
#: The bounds hold well outside every datasheet of the catalog (P4's 75 W to MI355X's 1,400 W; 8-288 GB; 192 GB/s-8 TB/s).
_PLAUSIBLE = {
    "tdp_w": (5.0, 5000.0, "kW", "mW"),
    "idle_power_w": (0.5, 2000.0, "kW", "mW"),
    "memory_gb": (0.25, 5000.0, "TB", "bytes or MB"),
    "memory_bandwidth_gbps": (5.0, 200000.0, "TB/s", "B/s or MB/s"),
    "peak_fp32_tflops": (0.01, 20000.0, "PFLOP/s", "FLOP/s or GFLOP/s"),
    "peak_tf32_tflops": (0.01, 50000.0, "PFLOP/s", "FLOP/s or GFLOP/s"),
    "peak_fp16_tflops": (0.01, 100000.0, "PFLOP/s", "FLOP/s or GFLOP/s"),
    "peak_bf16_tflops": (0.01, 100000.0, "PFLOP/s", "FLOP/s or GFLOP/s"),
    "peak_fp8_tflops": (0.01, 200000.0, "PFLOP/s", "FLOP/s or GFLOP/s"),
    "boost_clock_mhz": (50.0, 10000.0, "GHz", "Hz or kHz"),
    "base_clock_mhz": (50.0, 10000.0, "GHz", "Hz or kHz"),
    "l2_cache_mb": (0.01, 10000.0, "GB", "bytes or KB"),
    "interconnect_bandwidth_gbps": (1.0, 20000.0, "TB/s", "B/s or MB/s"),
    "die_area_mm2": (10.0, 50000.0, "cm^2", "square micrometres"),  # to a wafer-scale chip (46,225 mm^2)
}
_UNIT = {"tdp_w": "watts", "idle_power_w": "watts", "memory_gb": "GB", "memory_bandwidth_gbps": "GB/s",
         "peak_fp32_tflops": "TFLOP/s", "peak_tf32_tflops": "TFLOP/s", "peak_fp16_tflops": "TFLOP/s",
         "peak_bf16_tflops": "TFLOP/s", "peak_fp8_tflops": "TFLOP/s", "boost_clock_mhz": "MHz", "base_clock_mhz": "MHz",
         "l2_cache_mb": "MB", "interconnect_bandwidth_gbps": "GB/s", "die_area_mm2": "mm^2"}


def check_values(spec: DeviceSpec) -> DeviceSpec:
    """Return ``spec`` or raise :class:`DeviceSpecError` naming the bad field and its value.

    Types (numbers, text, aliases, sources), required fields, positive finite figures and the consistency
    rules a datasheet never breaks. Runs on every construction (``DeviceSpec.__post_init__``); the
    citation rule is in :func:`validate`.
    """
    where = _where(spec)
    for f in _REQUIRED:
        v = getattr(spec, f)
        if v is None or (isinstance(v, str) and not v.strip()):
            raise DeviceSpecError(f"{where}: required field '{f}' is missing")
    for f in _TEXT:
        v = getattr(spec, f)
        if v is None and f not in ("name", "vendor", "arch", "source"):
            continue
        if not isinstance(v, str):
            raise DeviceSpecError(f"{where}: field '{f}' must be text (a string), got {v!r}")
    if not isinstance(spec.aliases, tuple):
        raise DeviceSpecError(f"{where}: field 'aliases' must be a list of strings, got {spec.aliases!r}")
    bad = [a for a in spec.aliases if not isinstance(a, str)]
    if bad:
        raise DeviceSpecError(f"{where}: field 'aliases' must be a list of strings, got {bad[0]!r} in {list(spec.aliases)!r}")
    if not isinstance(spec.sources, Mapping):
        raise DeviceSpecError(
            f"{where}: field 'sources' must be a mapping of field name -> citation (strings), got {spec.sources!r}"
        )
    bad = [(k, c) for k, c in spec.sources.items() if not (isinstance(k, str) and isinstance(c, str))]
    if bad:
        raise DeviceSpecError(
            f"{where}: field 'sources' must map field names to citation strings, got {bad[0][0]!r}: {bad[0][1]!r}"
        )
    for f in _NUMERIC:
        v = getattr(spec, f)
        if v is None:
            continue
        if not _is_number(v):
            raise DeviceSpecError(f"{where}: field '{f}' must be a number, got {v!r}")
        if not math.isfinite(v) or v <= 0:
            raise DeviceSpecError(f"{where}: field '{f}' must be a positive finite number, got {v!r}")
    if spec.vendor not in VENDORS:
        raise DeviceSpecError(f"{where}: field 'vendor' must be nvidia|amd|intel|other, got {spec.vendor!r}")
    # Figures 1,000x off (a unit mix-up) first: the consistency rules below would misname them.
    # ``--force`` (:func:`wattcast.data.checks.allow_exotic`) lets a deliberately exotic figure through.
    for f, (lo, hi, low_unit, high_unit) in (() if exotic_allowed() else _PLAUSIBLE.items()):
        v = getattr(spec, f)
        if v is None:
            continue
        if v > hi:
            raise DeviceSpecError(f"{where}: field '{f}' is {v:g}, over {hi:g}: it looks like {high_unit}; give it in "
                                  f"{_UNIT[f]} (or pass --force for a deliberately exotic value)")
        if v < lo:
            raise DeviceSpecError(f"{where}: field '{f}' is {v:g}, under {lo:g}: it looks like {low_unit}; give it in "
                                  f"{_UNIT[f]} (or pass --force for a deliberately exotic value)")
    # Consistency rules a datasheet never breaks.
    if spec.base_clock_mhz and spec.base_clock_mhz > spec.boost_clock_mhz * 1.001:
        raise DeviceSpecError(
            f"{where}: field 'base_clock_mhz' ({spec.base_clock_mhz}) exceeds boost_clock_mhz ({spec.boost_clock_mhz})"
        )
    for f in ("peak_tf32_tflops", "peak_fp16_tflops", "peak_bf16_tflops", "peak_fp8_tflops", "peak_fp32_matrix_tflops"):
        v = getattr(spec, f)
        if v is not None and v < spec.peak_fp32_tflops * 0.999 and f != "peak_fp32_matrix_tflops":
            # a reduced-precision matrix peak below vector FP32 means a typo (or a non-tensor figure)
            raise DeviceSpecError(
                f"{where}: field '{f}' ({v}) is below peak_fp32_tflops ({spec.peak_fp32_tflops}); "
                "reduced-precision peaks are dense tensor/matrix figures and are never slower than FP32"
            )
    for half in ("peak_fp16_tflops", "peak_bf16_tflops"):
        h = getattr(spec, half)
        if spec.peak_fp8_tflops and h and spec.peak_fp8_tflops < h * 0.999:
            raise DeviceSpecError(f"{where}: field 'peak_fp8_tflops' ({spec.peak_fp8_tflops}) is below {half} ({h}); FP8 "
                                  "tensor cores run at least at the 16-bit rate (dense figures for both)")
    if spec.idle_power_w and spec.tdp_w and spec.idle_power_w >= spec.tdp_w:
        raise DeviceSpecError(f"{where}: field 'idle_power_w' ({spec.idle_power_w}) must be below tdp_w ({spec.tdp_w})")
    if spec.cores_per_sm is not None and int(spec.cores_per_sm) != spec.cores_per_sm:
        raise DeviceSpecError(f"{where}: field 'cores_per_sm' must be an integer, got {spec.cores_per_sm!r}")
    if int(spec.num_sms) != spec.num_sms:
        raise DeviceSpecError(f"{where}: field 'num_sms' must be an integer, got {spec.num_sms!r}")
    # FP32 peak must be reachable by the cores: peak <= 2 * sms * cores * clock (+5% slack).
    if spec.cores_per_sm:
        bound = 2 * spec.num_sms * spec.cores_per_sm * spec.boost_clock_mhz * 1e6 / 1e12
        if spec.peak_fp32_tflops > bound * 1.05 and spec.vendor == "nvidia":
            raise DeviceSpecError(
                f"{where}: field 'peak_fp32_tflops' ({spec.peak_fp32_tflops}) exceeds "
                f"2 x num_sms x cores_per_sm x boost_clock = {bound:.1f} TFLOP/s"
            )
    if isinstance(spec.schema_version, bool) or spec.schema_version != SCHEMA_VERSION:
        raise DeviceSpecError(
            f"{where}: field 'schema_version' is {spec.schema_version!r}, this wattcast reads {SCHEMA_VERSION}"
        )
    return spec


def validate(spec: DeviceSpec) -> DeviceSpec:
    """Return ``spec`` unchanged or raise :class:`DeviceSpecError` naming the bad field.

    The value checks of :func:`check_values` (already run when ``spec`` was built) plus the citation rule of
    spec files: every figure needs ``source`` or ``sources.<field>``.
    """
    check_values(spec)
    where = _where(spec)
    for f in _NUMERIC:
        if getattr(spec, f) is not None and not spec.source_of(f):
            raise DeviceSpecError(f"{where}: field '{f}' has no source; give 'source' or 'sources.{f}'")
    return spec


_FIELDS = {f.name for f in dataclasses.fields(DeviceSpec)}


def from_dict(d: Mapping[str, Any]) -> DeviceSpec:
    """Build and validate a spec from a plain mapping (YAML/JSON in the own schema)."""
    unknown = sorted(set(d) - _FIELDS)
    if unknown:
        raise DeviceSpecError(
            f"device spec {d.get('name', '?')!r}: unknown field(s) {', '.join(unknown)}; "
            f"known fields: {', '.join(sorted(_FIELDS))}"
        )
    kw = dict(d)
    # empty (None, '') means none; anything but a list / mapping is passed on and refused by DeviceSpec,
    # naming the field (tuple('abc') would make three one-letter aliases)
    if "aliases" in kw:
        a = kw["aliases"]
        kw["aliases"] = () if a is None or a == "" else tuple(a) if isinstance(a, (list, tuple)) else a
    if "sources" in kw:
        src = kw["sources"]
        kw["sources"] = {} if src is None or src == "" else dict(src) if isinstance(src, Mapping) else src
    missing = [f for f in _REQUIRED if kw.get(f) is None or (isinstance(kw.get(f), str) and not kw[f].strip())]
    if missing:
        raise DeviceSpecError(f"device spec {d.get('name', '?')!r}: required field '{missing[0]}' is missing")
    return validate(DeviceSpec(**kw))
