"""The device spec schema (version 1): one accelerator described by its datasheet.

Units live in the field names. Every non-empty figure carries a citation: either the
spec-wide ``source`` or a per-field entry in ``sources``. ``validate`` rejects missing,
negative or inconsistent values with a message that names the field.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

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
    tdp_w: float | None = None
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


def validate(spec: DeviceSpec) -> DeviceSpec:
    """Return ``spec`` unchanged or raise :class:`DeviceSpecError` naming the bad field."""
    where = f"device {spec.name!r}" if spec.name else "device spec"
    for f in _REQUIRED:
        v = getattr(spec, f)
        if v is None or v == "":
            raise DeviceSpecError(f"{where}: required field '{f}' is missing")
    for f in _NUMERIC:
        v = getattr(spec, f)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise DeviceSpecError(f"{where}: field '{f}' must be a number, got {v!r}")
        if not math.isfinite(v) or v <= 0:
            raise DeviceSpecError(f"{where}: field '{f}' must be a positive finite number, got {v!r}")
        if not spec.source_of(f):
            raise DeviceSpecError(f"{where}: field '{f}' has no source; give 'source' or 'sources.{f}'")
    if spec.vendor not in ("nvidia", "amd", "intel", "other"):
        raise DeviceSpecError(f"{where}: field 'vendor' must be nvidia|amd|intel|other, got {spec.vendor!r}")
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
    if spec.peak_fp8_tflops and spec.peak_fp16_tflops and spec.peak_fp8_tflops < spec.peak_fp16_tflops * 0.999:
        raise DeviceSpecError(f"{where}: field 'peak_fp8_tflops' is below peak_fp16_tflops")
    if spec.idle_power_w and spec.tdp_w and spec.idle_power_w >= spec.tdp_w:
        raise DeviceSpecError(f"{where}: field 'idle_power_w' ({spec.idle_power_w}) must be below tdp_w ({spec.tdp_w})")
    if spec.cores_per_sm is not None and int(spec.cores_per_sm) != spec.cores_per_sm:
        raise DeviceSpecError(f"{where}: field 'cores_per_sm' must be an integer")
    if int(spec.num_sms) != spec.num_sms:
        raise DeviceSpecError(f"{where}: field 'num_sms' must be an integer")
    # FP32 peak must be reachable by the cores: peak <= 2 * sms * cores * clock (+5% slack).
    if spec.cores_per_sm:
        bound = 2 * spec.num_sms * spec.cores_per_sm * spec.boost_clock_mhz * 1e6 / 1e12
        if spec.peak_fp32_tflops > bound * 1.05 and spec.vendor == "nvidia":
            raise DeviceSpecError(
                f"{where}: field 'peak_fp32_tflops' ({spec.peak_fp32_tflops}) exceeds "
                f"2 x num_sms x cores_per_sm x boost_clock = {bound:.1f} TFLOP/s"
            )
    if spec.schema_version != SCHEMA_VERSION:
        raise DeviceSpecError(f"{where}: field 'schema_version' is {spec.schema_version}, this wattcast reads {SCHEMA_VERSION}")
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
    if "aliases" in kw:
        kw["aliases"] = tuple(kw["aliases"] or ())
    if "sources" in kw:
        kw["sources"] = dict(kw["sources"] or {})
    missing = [f for f in _REQUIRED if kw.get(f) in (None, "")]
    if missing:
        raise DeviceSpecError(f"device spec {d.get('name', '?')!r}: required field '{missing[0]}' is missing")
    return validate(DeviceSpec(**kw))
