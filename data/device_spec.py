"""The device spec schema (version 1): one accelerator described by its datasheet.

Units live in the field names. Every non-empty figure carries a citation: either the
spec-wide ``source`` or a per-field entry in ``sources``.

Validation is a pydantic v2 model, :class:`DeviceSpecModel` (its validators in :mod:`wattcast.data.spec_model`).
Every :class:`DeviceSpec` checks its own values on it when it is built (``__post_init__``), whatever builds it:
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
import functools
import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Mapping

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo,
                      model_validator)

from wattcast.data.checks import exotic_allowed
from wattcast.data.spec_model import (FIELD, first_problem, number, one_of, optional, plausible, problem, required, schema,
                                      text, yaml_number_hint)

SCHEMA_VERSION = 1

#: dtypes a kernel can run in, and the peak field each one uses for matrix (GEMM/conv) work.
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


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
        m = _check(_values(self))
        object.__setattr__(self, "aliases", m.aliases)  # a list becomes a tuple, None none
        object.__setattr__(self, "sources", m.sources)

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



#: architectures without FP8 tensor cores (FP8 came with Hopper and Ada on NVIDIA, CDNA3 on AMD: the NVIDIA Hopper and Ada
#: architecture whitepapers, AMD's CDNA3 white paper), matched in a spec's ``arch`` (the catalog's "Ampere (GA100)",
#: "CDNA2 (gfx90a)"...; a tensor-parallel group's arch starts with its GPU's)
#: (NVIDIA: Kepler to Ampere and their chips GK/GM/GP/GV/TU/GA1xx; AMD: CDNA1/2, gfx908/gfx90a, and Vega's gfx906; not
#: "CDNA 3"/"CDNA4", which have FP8)
_NO_FP8_ARCH = re.compile(r"\b(kepler|maxwell|pascal|volta|turing|ampere|g[kmp]\d{3}|gv10\d|tu1\d\d|ga10\d)\b"
                          r"|\bcdna(?![\s\-_]*[3-9])[\s\-_]*[12]?\b|\bgfx90[68a]\b", re.IGNORECASE)


def arch_without_fp8(arch: str) -> bool:
    """True when a spec's ``arch`` names an architecture without FP8 tensor cores (:data:`_NO_FP8_ARCH`)."""
    return bool(_NO_FP8_ARCH.search(str(arch or "")))


#: architectures without BF16 tensor cores or ALUs (BF16 came with NVIDIA's Ampere, the NVIDIA A100 Tensor Core GPU
#: architecture whitepaper, and AMD's CDNA1, the AMD CDNA architecture whitepaper), matched in a spec's ``arch``
_NO_BF16_ARCH = re.compile(r"\b(kepler|maxwell|pascal|volta|turing|g[kmp]\d{3}|gv10\d|tu1\d\d|gfx906)\b", re.IGNORECASE)


def bf16_missing_why(spec: "DeviceSpec") -> str:
    """Why ``spec`` has no ``peak_bf16_tflops``, for a refusal: its architecture has no BF16 (V100, T4, P100 and
    other pre-Ampere GPUs run bf16 without it, far slower than fp16), or the spec file simply lacks the field (an
    Ampere-or-later GPU's own spec, or one whose ``arch`` names no architecture)."""
    arch = str(spec.arch or "").strip()
    if _NO_BF16_ARCH.search(arch):
        return (f"{arch} has no BF16 tensor cores: V100, T4, P100 and other pre-Ampere GPUs run bf16 without them, far "
                "slower than fp16, which nothing here models")
    has = f"{arch} has BF16 tensor cores" if arch else "the spec names no arch"
    return (f"{has}; the spec lacks the field peak_bf16_tflops: add the datasheet's dense BF16 tensor peak (Ampere, "
            "CDNA and later GPUs have one; pre-Ampere GPUs run bf16 far slower than fp16, which nothing here models)")


def fp8_missing_why(spec: "DeviceSpec") -> str:
    """Why ``spec`` has no ``peak_fp8_tflops``, for a refusal: its architecture has no FP8 (the catalog's A100, V100,
    MI250 and older), or the spec file simply lacks the field (an Ada or Hopper GPU's own spec may: it has FP8)."""
    if arch_without_fp8(spec.arch):
        return f"{spec.arch} has no FP8 tensor cores: A100, V100, MI250 and older"
    return ("the spec lacks the field peak_fp8_tflops: add the datasheet's dense FP8 tensor peak if the GPU has FP8 "
            "(Hopper, Ada, Blackwell, CDNA3 and later)")


def unsupported_step_dtype(spec: "DeviceSpec", dtype: str) -> str | None:
    """Why ``spec`` cannot run a training or inference step in ``dtype`` (None when it can): BF16 needs BF16 tensor
    cores or ALUs (``peak_bf16_tflops``: Ampere, CDNA2 and later; PyTorch runs bf16 on a V100 or T4 without them,
    far slower than fp16, which nothing here models), FP16 an FP16 rate (``peak_fp16_tflops``), an FP8 recipe FP8 tensor
    cores (``peak_fp8_tflops``) and BF16 ones for everything but its GEMMs (``peak_bf16_tflops``)."""
    d = str(dtype).lower()
    if d == "bf16" and not spec.peak_bf16_tflops:
        return (f"--dtype bf16 needs BF16 support, but {spec.name}'s spec has no peak_bf16_tflops "
                f"({bf16_missing_why(spec)}); use --dtype fp16")
    if d == "tf32" and not spec.peak_tf32_tflops:
        return (f"--dtype tf32 runs the GEMMs on TF32 tensor cores, but {spec.name}'s spec has no peak_tf32_tflops (TF32 "
                "is Ampere's and later: on a V100, T4 or P100 PyTorch's TF32 setting does nothing); use --dtype fp32")
    if d == "fp16" and not spec.peak_fp16_tflops:
        return (f"--dtype fp16 needs FP16 arithmetic, but {spec.name}'s spec has no peak_fp16_tflops (the Tesla P4 and "
                "other GPUs without a usable FP16 rate; a spec file may just lack the figure: add it); use --dtype fp32")
    if d == "fp8" and not spec.peak_fp8_tflops:
        return (f"--dtype fp8 runs the GEMMs on FP8 tensor cores, but {spec.name}'s spec has no peak_fp8_tflops "
                f"({fp8_missing_why(spec)}); use --dtype bf16"
                + ("" if spec.peak_bf16_tflops else " where the GPU has it, else --dtype fp16"))
    if d == "fp8" and not spec.peak_bf16_tflops:
        # Transformer Engine's recipe runs only the linear layers' GEMMs in FP8: attention, norms, elementwise ops, the
        # embedding, the LM head and the weights' master copy run in bf16 (featurize/workload.py ``_hf_forward``)
        return (f"--dtype fp8 runs every op but the linear layers' GEMMs in bf16 (Transformer Engine's FP8 recipe), but "
                f"{spec.name}'s spec has no peak_bf16_tflops: add the datasheet's dense BF16 tensor peak (every GPU "
                "with FP8 tensor cores has BF16 ones)" + ("" if spec.peak_fp16_tflops else "; it has no 16-bit peak at all"))
    return None


#: the ratio of a dense FP8 tensor peak to the dense 16-bit one on every NVIDIA and AMD generation with FP8 (Hopper, Ada,
#: Blackwell, CDNA3/4: 2x); outside this band one of the two is probably a sparse (2:4 structured sparsity, 2x) figure
FP8_OVER_16BIT = (1.5, 2.5)
#: the ratio of the dense 16-bit tensor peak to the dense TF32 one on every NVIDIA generation with TF32 (2x)
HALF_OVER_TF32_NVIDIA = (1.5, 2.5)
#: FP16 over BF16: equal on every NVIDIA generation with BF16 (Ampere on); AMD's CDNA1 (MI100) runs BF16 at half the
#: FP16 rate, so that direction is checked on NVIDIA only. BF16 above FP16 is on no GPU.
HALF_OVER_BF16_NVIDIA_MAX = 1.5
BF16_OVER_FP16_MAX = 1.5


def peak_ratio_notes(spec: DeviceSpec) -> list[str]:
    """Warnings (for a prediction's ``warnings``) when ``spec``'s tensor peaks are not in the ratios datasheets give
    them, the sign of one sparse figure (2:4 structured sparsity doubles a datasheet peak) among dense ones: FP8 not
    about 2x the 16-bit peak (NVIDIA and AMD, BF16 on a GeForce part; Intel's Gaudi 3 runs FP8 at the BF16 rate),
    BF16 above FP16, FP16 above BF16 on NVIDIA, the 16-bit peak not about 2x TF32 on NVIDIA. The figures are used as
    given (no refusal: an exotic device may really be so); every catalog device gets none."""
    notes: list[str] = []
    dense = "datasheets list dense and sparse (2:4 structured sparsity, 2x) tensor peaks; give the dense ones"
    fp8, fp16, bf16, tf32 = spec.peak_fp8_tflops, spec.peak_fp16_tflops, spec.peak_bf16_tflops, spec.peak_tf32_tflops
    half_name, half = max((("peak_fp16_tflops", fp16), ("peak_bf16_tflops", bf16)), key=lambda kv: kv[1] or 0)
    # on a GeForce part FP8 (FP32 accumulate) is 2x BF16, the FP32-accumulate 16-bit rate, while an FP16 figure at its
    # FP16-accumulate rate (2x BF16; refused unless --force, :data:`_GEFORCE_RATE_FACTOR`) may be loaded: FP8 is
    # compared with BF16 there
    ref_name, ref = ("peak_bf16_tflops", bf16) if bf16 and is_geforce(spec) else (half_name, half)
    if fp8 and ref and spec.vendor in ("nvidia", "amd"):
        lo, hi = FP8_OVER_16BIT
        r = fp8 / ref
        if not lo <= r <= hi:
            notes.append(f"{spec.name}: peak_fp8_tflops ({fp8:g}) is {r:.2g}x {ref_name} ({ref:g}), where every "
                         f"{'AMD' if spec.vendor == 'amd' else 'NVIDIA'} GPU with FP8 gives 2x: is one of them a sparse "
                         f"figure? {dense} (used as given)")
    if fp8 and not bf16:  # the FP8 recipe's non-GEMM ops run in bf16 (unsupported_step_dtype refuses the step)
        notes.append(f"{spec.name}: peak_fp8_tflops ({fp8:g}) without peak_bf16_tflops: an fp8 step runs every op but "
                     "its linear GEMMs in bf16 and is refused on this spec; add the datasheet's dense BF16 peak")
    if fp16 and bf16:
        if bf16 > fp16 * BF16_OVER_FP16_MAX:
            notes.append(f"{spec.name}: peak_bf16_tflops ({bf16:g}) is {bf16 / fp16:.2g}x peak_fp16_tflops ({fp16:g}), "
                         f"where no GPU runs BF16 faster than FP16: is the BF16 figure a sparse one? {dense} (used as "
                         "given)")
        elif spec.vendor == "nvidia" and fp16 > bf16 * HALF_OVER_BF16_NVIDIA_MAX:
            notes.append(f"{spec.name}: peak_fp16_tflops ({fp16:g}) is {fp16 / bf16:.2g}x peak_bf16_tflops ({bf16:g}), "
                         f"where every NVIDIA GPU with BF16 runs both at one rate: is the FP16 figure a sparse one? "
                         f"{dense} (used as given)")
    if tf32 and half and spec.vendor == "nvidia":
        lo, hi = HALF_OVER_TF32_NVIDIA
        r = half / tf32
        if not lo <= r <= hi:
            notes.append(f"{spec.name}: {half_name} ({half:g}) is {r:.2g}x peak_tf32_tflops ({tf32:g}), where every "
                         f"NVIDIA GPU with TF32 gives 2x: is one of them a sparse figure? {dense} (used as given)")
    return notes


def generation_of(spec: DeviceSpec) -> str:
    """A GPU's generation: the first word of its spec's ``arch`` (``Ampere (GA100)`` -> ``Ampere``), else its name."""
    arch = str(spec.arch or "").strip()
    return arch.split()[0] if arch else spec.name


def normalise_name(name: str) -> str:
    """Case- and punctuation-insensitive key: 'NVIDIA A100-PCIE-40GB' -> 'nvidiaa100pcie40gb'."""
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


#: field -> (lowest, highest plausible value, the unit a too-small figure is likely in, the unit a too-large one is,
#: the unit to give it in): figures 1,000x off, e.g. TDP in kW, memory in bytes, bandwidth in B/s or TB/s, a peak in
#: FLOP/s, a clock in Hz. The bounds hold well outside every datasheet of the catalog (P4's 75 W to MI355X's 1,400 W;
#: 8-288 GB; 192 GB/s-8 TB/s; L2 2-126 MB; 3-16 nm; launch prices 2,800-33,600 USD), and they are tight enough at
#: the bottom that a figure given in the unit 1,000x larger is caught: a bandwidth of 8 (B200's TB/s) is under 50 GB/s,
#: an L2 of 0.05 (GB) under 0.25 MB (a 256 KB L2, the smallest of any CUDA GPU), a price of 33.6 (thousands of USD)
#: under 50 USD. A slower device (an embedded GPU's 25-60 GB/s) needs --force. The memory floor alone does not catch
#: the largest GPUs' TB figures (B300's 0.27, MI355X's 0.288), nor the ceiling a small card's MB figure (4096 for 4 GB):
#: :data:`MEMORY_READ_MS_ACCEPTED` checks the memory against the bandwidth.
PLAUSIBLE: dict[str, tuple[float, float, str, str, str]] = {
    "tdp_w": (5.0, 5000.0, "kW", "mW", "watts"),
    "idle_power_w": (0.5, 2000.0, "kW", "mW", "watts"),
    "memory_gb": (0.25, 5000.0, "TB", "bytes or MB", "GB"),
    "memory_bandwidth_gbps": (50.0, 200000.0, "TB/s", "B/s or MB/s", "GB/s"),
    "peak_fp32_tflops": (0.01, 20000.0, "PFLOP/s", "FLOP/s or GFLOP/s", "TFLOP/s"),
    "peak_fp32_matrix_tflops": (0.01, 50000.0, "PFLOP/s", "FLOP/s or GFLOP/s", "TFLOP/s"),
    "peak_tf32_tflops": (0.01, 50000.0, "PFLOP/s", "FLOP/s or GFLOP/s", "TFLOP/s"),
    "peak_fp16_tflops": (0.01, 100000.0, "PFLOP/s", "FLOP/s or GFLOP/s", "TFLOP/s"),
    "peak_bf16_tflops": (0.01, 100000.0, "PFLOP/s", "FLOP/s or GFLOP/s", "TFLOP/s"),
    "peak_fp8_tflops": (0.01, 200000.0, "PFLOP/s", "FLOP/s or GFLOP/s", "TFLOP/s"),
    "boost_clock_mhz": (50.0, 10000.0, "GHz", "Hz or kHz", "MHz"),
    "base_clock_mhz": (50.0, 10000.0, "GHz", "Hz or kHz", "MHz"),
    "l2_cache_mb": (0.25, 10000.0, "GB", "bytes or KB", "MB"),
    "interconnect_bandwidth_gbps": (1.0, 20000.0, "TB/s", "B/s or MB/s", "GB/s"),
    "die_area_mm2": (10.0, 50000.0, "cm^2", "square micrometres", "mm^2"),  # to a wafer-scale chip (46,225 mm^2)
    # 1.4-1.8 nm class (Intel 18A, TSMC A16) to the 250 nm of the first GPUs; 0.004 is 4 nm in micrometres
    "process_node_nm": (1.0, 250.0, "micrometres (0.004 means 4 nm)", "picometres or angstroms", "nm"),
    # the price of one accelerator when launched (CapEx and TCO): 33.6 is an H100's 33,600 USD in thousands
    "launch_price_usd": (50.0, 1_000_000.0, "thousands of USD (33.6 means 33,600)", "cents", "USD per accelerator"),
}

#: the FP32 FLOP per SM (CU on AMD) per clock an FP32 peak may imply, (lowest, highest): ``peak_fp32_tflops`` and
#: ``peak_fp32_matrix_tflops`` are checked against ``num_sms`` x ``boost_clock_mhz``. Every catalog GPU gives 128
#: (Pascal, Volta, Turing, A100; CDNA1/2 vector FP32) or 256 (Ampere GA10x, Ada, Hopper, Blackwell; CDNA1/2 matrix FP32,
#: CDNA3/4 vector and matrix FP32 with dual issue); the range leaves a 4x margin each way, so a peak 1,000x off (given in
#: PFLOP/s or GFLOP/s, a NeuSight ``SingleFLOPs`` in TFLOP/s) falls far outside it. Lifted by ``--force`` like
#: :data:`PLAUSIBLE`.
FP32_FLOP_PER_SM_CLOCK: tuple[float, float] = (32.0, 1024.0)

#: the highest ratio of a reduced-precision tensor/matrix peak (or the FP32 matrix peak) to the vector FP32 peak: the
#: catalog's highest is 62.5 (GB300 FP8 5,000 over 80 TFLOP/s), its lowest 1.9 (L4 TF32); a tensor peak given in
#: GFLOP/s is 1,000x or more. Lifted by ``--force`` like :data:`PLAUSIBLE`. (A peak below FP32 is a hard rule.)
TENSOR_OVER_FP32_MAX = 500.0

#: the figures :data:`TENSOR_OVER_FP32_MAX` bounds
_OVER_FP32 = ("peak_fp32_matrix_tflops", "peak_tf32_tflops", "peak_fp16_tflops", "peak_bf16_tflops", "peak_fp8_tflops")

#: the dense peaks a tensor peak is never below (the rules of :class:`DeviceSpecModel`): FP8 at least the 16-bit
#: rate, the 16-bit rate at least TF32's
_WIDER: dict[str, tuple[str, ...]] = {"peak_fp8_tflops": ("peak_fp16_tflops", "peak_bf16_tflops"),
                                      "peak_fp16_tflops": ("peak_tf32_tflops",), "peak_bf16_tflops": ("peak_tf32_tflops",)}


def _pflops_reading(values: Any, f: str, v: float) -> bool:
    """Whether tensor peak ``v`` (field ``f``, below the FP32 peak) reads as a plausible figure 1,000x up, i.e. it
    was given in PFLOP/s (as NVIDIA's Hopper and Blackwell datasheets print them: H100 FP8 "1,979 TFLOPS" is 1.979
    PFLOP/s, B200 FP8 "4.5 PFLOPS"): ``v`` x 1,000 is inside the field's :data:`PLAUSIBLE` range, at or above the FP32
    peak and every next-wider dtype's peak given (:data:`_WIDER`; one itself below FP32 does not count) and at most
    :data:`TENSOR_OVER_FP32_MAX` x the FP32 peak."""
    x, fp32 = v * 1000.0, float(values.peak_fp32_tflops)
    lo, hi = PLAUSIBLE[f][:2]
    wider = [float(w) for w in (getattr(values, g) for g in _WIDER.get(f, ())) if w is not None and w >= fp32 * 0.999]
    return lo <= x <= hi and fp32 * 0.999 <= x <= fp32 * TENSOR_OVER_FP32_MAX and all(x >= w * 0.999 for w in wider)


_FORCE = "or pass --force (in Python wattcast.allow_exotic()) for a deliberately exotic value"


def _times(x: float) -> str:
    """How many times off, as said in a message: "about 1,000x" for a power of ten of 1,000 or more, else "16x"."""
    p = round(math.log10(x)) if x > 0 else 0
    return f"about {10 ** p:,}x" if p >= 3 else f"{x:.0f}x"


def _fp32_per_sm_problem(f: str, v: float, sms: float, mhz: float) -> str | None:
    """A message when FP32 peak ``v`` (field ``f``) implies a rate per SM and clock outside
    :data:`FP32_FLOP_PER_SM_CLOCK` on ``sms`` SMs at ``mhz``; None inside it or under ``--force``."""
    lo, hi = FP32_FLOP_PER_SM_CLOCK
    per = v * 1e12 / (sms * mhz * 1e6)
    if exotic_allowed() or lo <= per <= hi:
        return None
    typical = math.sqrt(128 * 256)  # between the 128 and 256 of every catalog GPU
    low = per < lo
    off = typical / per if low else per / typical
    far = round(math.log10(off)) >= 3
    if low:
        hint = ("was it given in PFLOP/s (or, in a NeuSight file, SingleFLOPs in TFLOP/s instead of GFLOP/s)?" if far
                else "does num_sms count cores rather than SMs (CUs on AMD)?")
    else:
        hint = ("was it given in GFLOP/s?" if far
                else "is it a tensor-core or sparse figure, or does num_sms count fewer units than the SMs (CUs on AMD)?")
    band = f"{lo * sms * mhz / 1e6:.3g} to {hi * sms * mhz / 1e6:.3g} TFLOP/s"
    return (f"field '{f}' ({v:g}) is {_times(off)} {'below' if low else 'above'} what {sms:g} SMs at {mhz:g} MHz give: "
            f"{per:.3g} FP32 FLOP per SM per clock, where GPUs do {lo:g} to {hi:g} ({band} here); {hint} Give it in "
            f"TFLOP/s and check num_sms and boost_clock_mhz, {_FORCE}")


#: Dense (no sparsity) 16-bit (FP16/BF16) tensor/matrix FLOP per SM (CU on AMD) per clock of each architecture, from
#: the vendor whitepapers, in the order the ``arch`` field is matched (case-insensitive regex; chip codes before the
#: generation name). Each agrees with the catalog's own cited dense peak / (num_sms x boost_clock_mhz): within 0.92-1.0x
#: of it (the catalog's boost clocks are a little above the clocks NVIDIA rates its tensor peaks at, e.g. H100's 1,830
#: MHz); ``tests/test_spec_dense_rate.py`` checks every catalog device against its row. TF32 runs at half this rate, FP8
#: at twice it (every generation with them; on a GeForce part, FP32 accumulate: :data:`_GEFORCE_RATE_FACTOR`).
TENSOR_16BIT_FLOP_PER_SM_CLOCK: tuple[tuple[str, str, float, str], ...] = (
    # (regex on arch, architecture, dense 16-bit FLOP/SM/clock, source)
    (r"\bgp100\b", "Pascal GP100", 256.0, "NVIDIA Tesla P100 whitepaper: FP16 at 2x the FP32 rate (64 FP32 cores/SM x 2 FLOP x 2); catalog P100 247"),
    (r"\bpascal\b", "Pascal (GP100's, the fastest FP16 of the generation)", 256.0, "NVIDIA Tesla P100 whitepaper (GP104, the Tesla P4's chip, has no usable FP16 rate: the catalog P4 gives none)"),
    (r"\bgv100\b|\bvolta\b", "Volta GV100", 1024.0, "NVIDIA Tesla V100 GPU architecture whitepaper: 8 tensor cores/SM x 64 FP16 FMA/clock = 1,024 FLOP; catalog V100 1,021-1,022"),
    (r"\btu10\d\b|\bturing\b", "Turing TU10x", 1024.0, "NVIDIA Turing GPU architecture whitepaper: 8 tensor cores/SM x 64 FP16 FMA/clock; catalog T4 1,022, Quadro RTX 6000 1,024"),
    (r"\bga100\b", "Ampere GA100", 2048.0, "NVIDIA A100 Tensor Core GPU architecture whitepaper: 1,024 dense FP16 FMA/clock/SM = 2,048 FLOP; catalog A100 2,049"),
    (r"\bga10[2-7]\b", "Ampere GA10x", 1024.0, "NVIDIA Ampere GA102 GPU architecture whitepaper: 4 tensor cores/SM x 128 dense FP16 FMA/clock; catalog A10, A40 1,024"),
    (r"\bampere\b", "Ampere (chip not given: GA100's)", 2048.0, "NVIDIA A100 Tensor Core GPU architecture whitepaper (the larger of GA100 and GA10x)"),
    (r"\bad10\d\b|\bada\b", "Ada Lovelace AD10x", 1024.0, "NVIDIA Ada GPU architecture whitepaper: 4 tensor cores/SM x 128 dense FP16 FMA/clock; catalog L4 989, L40S 1,012"),
    (r"\bgh100\b|\bhopper\b", "Hopper GH100", 4096.0, "NVIDIA H100 Tensor Core GPU architecture whitepaper: 2x A100's dense MMA rate per SM clock-for-clock = 4,096 FLOP (989.4 TFLOP/s = 132 SMs x 1,830 MHz x 4,096); catalog H100/H200 3,779-3,786"),
    (r"\bgb20[\dx]\b", "consumer/workstation Blackwell GB20x (RTX 50xx, sm_120)", 1024.0, "NVIDIA RTX Blackwell GPU architecture whitepaper, Appendix A: GeForce RTX 5090 419 dense FP16 tensor TFLOP/s (FP16 accumulate; 209.5 with FP32 accumulate, GeForce's half rate) = 170 SMs x 2,407 MHz x 1,024: Ada's rate per SM, not data-centre Blackwell's 8,192"),
    (r"\bgb1\d\d\b|\bblackwell\b", "Blackwell GB100/GB110", 8192.0, "NVIDIA Blackwell architecture technical brief: 2x Hopper's dense 16-bit tensor rate per SM (B200 2,250 TFLOP/s dense = 148 SMs x 8,192 x 1,856 MHz); catalog B200/B300/GB200/GB300 7,735-7,738"),
    (r"cdna\s*4|\bgfx950\b", "CDNA4 (gfx950)", 4096.0, "AMD CDNA 4 architecture whitepaper: 2x CDNA3's dense FP16/BF16 matrix rate per CU; catalog MI355X 4,096"),
    (r"cdna\s*3|\bgfx94[012]\b", "CDNA3 (gfx942)", 2048.0, "AMD CDNA 3 architecture whitepaper: 2,048 dense FP16/BF16 matrix FLOP/clock/CU; catalog MI300X 2,048"),
    (r"cdna\s*2|\bgfx90a\b", "CDNA2 (gfx90a)", 1024.0, "AMD CDNA 2 architecture whitepaper: 1,024 FP16/BF16 matrix FLOP/clock/CU; catalog MI210/MI250/MI250X 1,024"),
    (r"cdna\s*1\b|\bgfx908\b", "CDNA1 (gfx908)", 1024.0, "AMD CDNA architecture whitepaper (MI100): 1,024 FP16 matrix FLOP/clock/CU (BF16 512); catalog MI100 1,024"),
)

#: a tensor peak whose implied dense rate per SM per clock is more than this over its architecture's
#: (:data:`TENSOR_16BIT_FLOP_PER_SM_CLOCK`) is refused: every catalog device is within 1.0x of its row, a datasheet's
#: sparse (2:4 structured sparsity) column is 2x
DENSE_RATE_MARGIN = 1.5

#: the tensor peak fields and the multiple of the dense 16-bit rate each runs at (TF32 half, FP8 twice: every
#: generation with them, see :data:`HALF_OVER_TF32_NVIDIA`, :data:`FP8_OVER_16BIT`)
_TENSOR_RATE_FACTOR = {"peak_fp16_tflops": 1.0, "peak_bf16_tflops": 1.0, "peak_tf32_tflops": 0.5, "peak_fp8_tflops": 2.0}

_SPARSE = "this looks like the sparse (2:4 structured sparsity) figure: use the dense one"

#: GeForce (consumer) NVIDIA parts run BF16 and TF32 tensor math (FP32 accumulate, the only accumulation those dtypes
#: have) at half the FP16-accumulate rate the 16-bit row of :data:`TENSOR_16BIT_FLOP_PER_SM_CLOCK` gives for GA10x, Ada
#: and GB20x: NVIDIA Ada GPU architecture whitepaper, Appendix A, GeForce RTX 4090: Peak FP16 Tensor TFLOPS with FP16
#: accumulate 330.3 / with FP32 accumulate 165.2, Peak BF16 Tensor 165.2, Peak TF32 Tensor 82.6 (dense; 2x sparse);
#: NVIDIA RTX Blackwell GPU architecture whitepaper, Appendix A, GeForce RTX 5090: FP16 with FP16 accumulate 419, with
#: FP32 accumulate 209.5, BF16 209.5, TF32 104.8 (dense); NVIDIA Ampere GA102 whitepaper, Appendix A, GeForce RTX 3090:
#: FP16 (FP16 acc.) 142 / BF16 71 / TF32 35.6. FP8 (Ada and GB20x; GA10x has none, ``arch_without_fp8``) likewise: Ada
#: whitepaper, Appendix A, RTX 4090: Peak FP8 Tensor TFLOPS with FP16 accumulate 660.6 / with FP32 accumulate 330.3
#: (dense; 1,321.2 / 660.6 sparse); RTX Blackwell whitepaper, Appendix A, RTX 5090: 838 / 419 (dense). PyTorch's
#: ``torch._scaled_mm`` and Transformer Engine's FP8 GEMMs accumulate in FP32 (cuBLAS documentation, cublasLtMatmul: FP8
#: A/B types are supported with computeType CUBLAS_COMPUTE_32F only), so the FP32-accumulate figure is the one a GeForce
#: FP8 peak must give: FP8 is checked at 1x the FP16-accumulate 16-bit rate there, 2x elsewhere
#: (:data:`_FP16_ACCUMULATE_FIGURE` names the FP16-accumulate figure in the refusal). The professional and data-centre
#: boards of the same chips (RTX 6000 Ada, L40S, L4, A10, A40, RTX PRO Blackwell) run them at the full rate. FP16 is
#: checked at the FP32-accumulate rate too: PyTorch's FP16 GEMMs run with computeType CUBLAS_COMPUTE_32F (torch 2.13,
#: aten/src/ATen/cuda/CUDABlas.cpp, gemm<at::Half>: ``CUBLAS_COMPUTE_32F`` unless the opt-in
#: ``torch.backends.cuda.matmul.allow_fp16_accumulation`` is set, default False; ``allow_fp16_reduced_precision_
#: reduction`` only lets split-K reduce in FP16), so the FP16-accumulate figure (RTX 4090's 330.3) would predict FP16
#: GEMMs 2x fast; it is refused naming the figure to give (``--force`` lifts it for a user who opts in). The spec has
#: no FP4 field, so no FP4 rate is checked.
_GEFORCE_RATE_FACTOR = {**_TENSOR_RATE_FACTOR, "peak_fp16_tflops": 0.5, "peak_bf16_tflops": 0.5,
                        "peak_tf32_tflops": 0.25, "peak_fp8_tflops": 1.0}
#: the tensor peak fields a GeForce datasheet also lists with FP16 accumulate, at twice their FP32-accumulate rate, and
#: the multiple of the dense 16-bit (FP16-accumulate) rate that figure runs at: a GeForce figure that fits it is named
#: as the FP16-accumulate figure, not only as a sparse one (RTX 4090 FP8: 660.6 is both the FP16-accumulate dense and
#: the FP32-accumulate sparse figure; FP16: 330.3 is the FP16-accumulate dense figure, 2x the 165.2 PyTorch runs)
_FP16_ACCUMULATE_FIGURE = {"peak_fp16_tflops": 1.0, "peak_fp8_tflops": 2.0}
#: what the refusal of a GeForce FP16-accumulate figure cites, per field: (the datasheet pairs, why FP32 accumulate)
_FP16_ACCUMULATE_CITE = {
    "peak_fp8_tflops": ("FP8", "Ada whitepaper, Appendix A, RTX 4090: FP8 660.6 with FP16 accumulate, 330.3 with FP32 "
                        "accumulate, dense; RTX Blackwell whitepaper, Appendix A, RTX 5090: 838 / 419",
                        "PyTorch and Transformer Engine FP8 GEMMs accumulate in FP32"),
    "peak_fp16_tflops": ("FP16", "Ada whitepaper, Appendix A, RTX 4090: FP16 330.3 with FP16 accumulate, 165.2 with "
                         "FP32 accumulate, dense; RTX Blackwell whitepaper, Appendix A, RTX 5090: 419 / 209.5; GA102 "
                         "whitepaper, RTX 3090: 142 / 71",
                         "PyTorch's FP16 GEMMs accumulate in FP32 (cuBLAS CUBLAS_COMPUTE_32F unless "
                         "torch.backends.cuda.matmul.allow_fp16_accumulation is set; --force if you set it)"),
}

#: a GeForce product name: "GeForce", or RTX followed by a GeForce model number x0[5-9]0 of the 20 to 50 series
#: (RTX 3090, rtx4090, RTX-5090 Ti); not the workstation RTX 4000/5000/6000 (Ada), RTX A6000 or Quadro RTX 6000
_GEFORCE_NAME = re.compile(r"geforce|\brtx[\s_-]*[2-5]0[5-9]0")


def _names_of(values: Any) -> list[str]:
    """The spec's name and aliases, lower-case."""
    return [str(n).lower() for n in (getattr(values, "name", None), *(getattr(values, "aliases", None) or ())) if n]


def is_geforce(values: Any) -> bool:
    """An NVIDIA GeForce (consumer) part by its name or an alias (:data:`_GEFORCE_NAME`)."""
    return str(getattr(values, "vendor", "nvidia") or "").lower() == "nvidia" and any(
        _GEFORCE_NAME.search(n) for n in _names_of(values))


#: a Blackwell ``arch`` naming its chip: GB1xx (data centre), GB20x (consumer / workstation), GB10 (DGX Spark)
_BLACKWELL_CHIP = re.compile(r"\bgb(1\d\d|20[\dx]|10)\b")


def blackwell_segment(values: Any) -> str | None:
    """For a spec whose ``arch`` says Blackwell without its chip (:data:`_BLACKWELL_CHIP`): "consumer" (GB20x: RTX 50xx,
    RTX PRO Blackwell) when the evidence says so, a GDDR memory (GDDR7: NVIDIA RTX Blackwell whitepaper; no data-centre
    Blackwell has GDDR) or an RTX / GeForce name; "datacentre" (GB100/GB110) on HBM memory (B200/B300 datasheets:
    HBM3e) or a B100/B200/B300/GB200/GB300 name; None when neither (or both) is in evidence, or ``arch`` is not a
    chip-less Blackwell."""
    arch = str(getattr(values, "arch", "") or "").lower()
    if not re.search(r"\bblackwell\b", arch) or _BLACKWELL_CHIP.search(arch):
        return None
    mem = str(getattr(values, "memory_type", "") or "").lower()
    names = _names_of(values)
    consumer = mem.startswith("gddr") or any("rtx" in n or "geforce" in n for n in names)
    datacentre = mem.startswith("hbm") or any(re.search(r"\bg?b[123]00\b|^g?b[123]00", n) for n in names)
    if consumer != datacentre:
        return "consumer" if consumer else "datacentre"
    return None


def architecture_of(arch: Any) -> tuple[str, float, str] | None:
    """(architecture, dense 16-bit tensor FLOP per SM per clock, source) for a spec's ``arch`` text (or a spec: then a
    chip-less ``Blackwell`` is resolved by :func:`blackwell_segment`'s evidence), from
    :data:`TENSOR_16BIT_FLOP_PER_SM_CLOCK`; None when no row matches (an unknown or invented architecture)."""
    text = arch if isinstance(arch, str) or arch is None else getattr(arch, "arch", "")
    if not isinstance(arch, str) and arch is not None and blackwell_segment(arch) == "consumer":
        text = f"{text} (gb20x)"  # the evidence names the chip family the arch text left out
    a = str(text or "").strip().lower()
    for pattern, name, rate, cite in TENSOR_16BIT_FLOP_PER_SM_CLOCK:
        if re.search(pattern, a):
            return name, rate, cite
    return None


def _rate_factors(values: Any) -> dict[str, float]:
    """Each tensor peak field's multiple of the dense 16-bit rate on ``values``' device (:data:`_GEFORCE_RATE_FACTOR`
    on a GeForce part, else :data:`_TENSOR_RATE_FACTOR`)."""
    return _GEFORCE_RATE_FACTOR if is_geforce(values) else _TENSOR_RATE_FACTOR


def _dense_rates(values: Any) -> list[tuple[str, float, float]]:
    """(field, peak, implied dense 16-bit-equivalent FLOP per SM per clock) of each tensor peak given."""
    sms, mhz = values.num_sms, values.boost_clock_mhz
    out = []
    for f, k in _rate_factors(values).items():
        v = getattr(values, f)
        if v:
            out.append((f, float(v), float(v) * 1e12 / (float(sms) * float(mhz) * 1e6) / k))
    return out


def _over_rate(values: Any, rate: float) -> tuple[str, float, float, float] | None:
    """(field, peak, implied dense FLOP per SM per clock, the field's rate factor) of the first tensor peak of
    ``values`` implying more than ``rate`` x :data:`DENSE_RATE_MARGIN` (:func:`_dense_rates`), else None."""
    for f, v, per in _dense_rates(values):
        if per > rate * DENSE_RATE_MARGIN:
            return f, v, per, _rate_factors(values)[f]
    return None


def _catalog_twin_note(values: Any) -> str:
    """" (its SMs, clock and bandwidth are ... every tensor peak is exactly 2x <catalog device>'s ...)" when a catalog device has the spec's SMs, boost clock
    and memory bandwidth (within 1%) and every tensor peak the spec gives is 2x (within 2%) that device's; else ""."""
    try:
        from wattcast.data.catalog import load_catalog
        catalog = load_catalog()
    except Exception:  # noqa: BLE001 - the catalog is loading (its own devices never get here) or unreadable
        return ""
    given = [(f, getattr(values, f)) for f in _TENSOR_RATE_FACTOR if getattr(values, f)]
    if not given:
        return ""
    close = lambda a, b, tol: bool(a) and bool(b) and abs(float(a) / float(b) - 1.0) <= tol  # noqa: E731
    for c in catalog.values():
        if not (int(c.num_sms) == int(values.num_sms) and close(values.boost_clock_mhz, c.boost_clock_mhz, 0.01)
                and close(values.memory_bandwidth_gbps, c.memory_bandwidth_gbps, 0.01)):
            continue
        if all(close(v, 2.0 * (getattr(c, f) or 0.0), 0.02) for f, v in given):
            return (f" (its SMs, clock and bandwidth are catalog device {c.name}'s, and every tensor peak given is "
                    f"exactly 2x {c.name}'s dense figure: the datasheet's sparse column)")
    return ""


def _dense_rate_problem(values: Any) -> str | None:
    """A message when a tensor peak implies more dense FLOP per SM per clock than the spec's architecture
    (:func:`architecture_of`) can do, by over :data:`DENSE_RATE_MARGIN`; None otherwise, for an unknown architecture
    (see :func:`dense_rate_notes`) or under ``--force``."""
    arch = architecture_of(values)
    if arch is None or exotic_allowed():
        return None
    name, rate, cite = arch
    over = _over_rate(values, rate)
    if over is None:
        return None
    f, v, per, k = over
    halved = is_geforce(values) and k != _TENSOR_RATE_FACTOR[f]
    here = f"{rate * k * float(values.num_sms) * float(values.boost_clock_mhz) / 1e6:.4g}"  # TFLOP/s at the dense rate
    acc16 = _FP16_ACCUMULATE_FIGURE.get(f) if halved else None
    if acc16 and per * k / acc16 <= rate * DENSE_RATE_MARGIN:
        # a GeForce FP8 / FP16 figure at the FP16-accumulate dense rate (also the FP32-accumulate sparse one)
        dtype, pairs, why = _FP16_ACCUMULATE_CITE[f]
        return (f"field '{f}' ({v:g}) is {per / rate:.2g}x the FP32-accumulate rate {name} runs densely on a GeForce "
                f"part: {v:g} TFLOP/s on {values.num_sms:g} SMs at {values.boost_clock_mhz:g} MHz is {per * k:,.0f} "
                f"FLOP per SM per clock, where a GeForce {name} does {rate * k:,.0f} dense with FP32 accumulate and "
                f"{rate * acc16:,.0f} with FP16 accumulate: this looks like the datasheet's FP16-accumulate figure "
                f"(or its FP32-accumulate sparse one). {why}, which a GeForce part runs at half the FP16-accumulate "
                f"{dtype} rate ({pairs}): give the dense FP32-accumulate figure (about {here} TFLOP/s here). Check "
                f"num_sms and boost_clock_mhz too, {_FORCE}")
    geforce = (" (a GeForce part: FP16, BF16, TF32 and FP8 with FP32 accumulate at half the FP16-accumulate rate, e.g. "
               "the Ada whitepaper's RTX 4090: FP16 165.2 with FP32 accumulate (330.3 with FP16 accumulate), BF16 "
               "165.2, TF32 82.6, FP8 330.3 with FP32 accumulate (660.6 with FP16 accumulate) dense; about "
               f"{here} TFLOP/s here)" if halved else "")
    return (f"field '{f}' ({v:g}) is {per / rate:.2g}x what {name} can do densely: {v:g} TFLOP/s on "
            f"{values.num_sms:g} SMs (CUs) at {values.boost_clock_mhz:g} MHz is {per * k:,.0f} FLOP per SM per "
            f"clock, where {name} does {rate * k:,.0f} dense{geforce} ({cite}); {_SPARSE}"
            f"{_catalog_twin_note(values)}. Check num_sms and boost_clock_mhz too, {_FORCE}")


def _ambiguous_blackwell_note(spec: Any) -> str | None:
    """A warning for an ``arch`` of plain "Blackwell" (no chip code) whose figures the evidence
    (:func:`blackwell_segment`) cannot place and whose tensor peaks would be refused as consumer Blackwell's
    (GB20x, 1,024 dense 16-bit FLOP per SM per clock) while they pass as data-centre Blackwell's (8,192): checked
    against the data-centre rate, and said so."""
    arch = str(getattr(spec, "arch", "") or "").lower()
    if not re.search(r"\bblackwell\b", arch) or _BLACKWELL_CHIP.search(arch) or blackwell_segment(spec) is not None:
        return None
    consumer = architecture_of("blackwell (gb20x)")
    over = _over_rate(spec, consumer[1])
    if over is None:
        return None
    f, v, per, k = over
    return (f"{spec.name}: arch {spec.arch!r} names no chip, and neither memory_type (GDDR7: consumer; HBM: data "
            f"centre) nor the name (RTX / GeForce; B200 / B300 / GB200 / GB300) says which Blackwell it is: its tensor "
            f"peaks were checked against data-centre Blackwell (GB100/GB110, 8,192 dense 16-bit FLOP per SM per clock); "
            f"if it is a consumer or workstation part (GB20x: RTX 50xx, RTX PRO), {f} ({v:g}) is {per * k:,.0f} FLOP "
            f"per SM per clock, {per / consumer[1]:.2g}x GB20x's {consumer[1] * k:,.0f} dense: {_SPARSE}. Write the "
            "chip in arch (e.g. 'Blackwell (GB202)' or 'Blackwell (GB100)') or give memory_type (used as given)")


def dense_rate_notes(spec: "DeviceSpec") -> list[str]:
    """Warnings (for a prediction's ``warnings``) when ``spec``'s ``arch`` names no known architecture (so no dense
    rate check ran) and a tensor peak implies more dense FLOP per SM per clock than any known architecture does (the
    largest row of :data:`TENSOR_16BIT_FLOP_PER_SM_CLOCK`) by over :data:`DENSE_RATE_MARGIN`, or when the spec is a
    catalog device's twin (SMs, clock, bandwidth) with every tensor peak exactly 2x its (:func:`_catalog_twin_note`);
    none otherwise."""
    twin = _catalog_twin_note(spec)
    if architecture_of(spec) is not None:
        ambiguous = _ambiguous_blackwell_note(spec)
        return ([f"{spec.name}: {_SPARSE}{twin}; used as given"] if twin else []) + ([ambiguous] if ambiguous else [])
    top_name, top = max(((n, r) for _, n, r, _ in TENSOR_16BIT_FLOP_PER_SM_CLOCK), key=lambda nr: nr[1])
    over = _over_rate(spec, top)
    if over is not None:
        f, v, per, k = over
        return [f"{spec.name}: {f} ({v:g}) implies {per * k:,.0f} FLOP per SM per clock on {spec.num_sms:g} SMs at "
                f"{spec.boost_clock_mhz:g} MHz, {per / top:.2g}x the most any known architecture does densely "
                f"({top_name}: {top * k:,.0f}); {_SPARSE}, or check num_sms and boost_clock_mhz "
                f"(arch {spec.arch!r} names no known architecture, so it is used as given){twin}"]
    return [f"{spec.name}: {_SPARSE}{twin}; used as given"] if twin else []


#: bytes of DRAM bandwidth per dense FLOP (GB/s over TFLOP/s, i.e. bytes per 1,000 FLOP) of the catalog, (lowest,
#: highest): against the dense 16-bit tensor peak on devices with tensor/matrix units (a 16-bit peak at least
#: :data:`_TENSOR_OVER_FP32_MIN` x the vector FP32 one; 2.39 L40S to 9.06 MI210/MI250), against the vector FP32 peak
#: on every device (9.4 L40S to 104.6 A100 SXM4 80GB). ``tests/test_spec_dense_rate.py`` recomputes both from the
#: catalog. A bandwidth given in Gb/s is 8x the GB/s figure.
BYTES_PER_KFLOP_16BIT = (2.39, 9.06)
BYTES_PER_KFLOP_FP32 = (9.4, 104.6)
#: how far outside the catalog's range a ratio may go before the spec is refused (lifted by ``--force``): 2x over the
#: 16-bit range (9.06 -> 18.1; every catalog tensor device's Gb/s figure, 8x, is 19.1 or more) and 3x over the FP32
#: one (104.6 -> 314, room for HBM4 parts whose FP32 lags); 3x below both (no catalog figure is a bandwidth too low
#: by a unit factor the PLAUSIBLE range lets through). Over the 16-bit range with the FP32 ratio inside the catalog's,
#: a cut-down-compute inference part (NVIDIA H20: about 4,000 GB/s over 148 TFLOP/s BF16, 27) loads with a note
#: (bandwidth_ratio_notes) instead of being refused.
BANDWIDTH_RATIO_MARGIN_16BIT = 2.0
BANDWIDTH_RATIO_MARGIN_FP32 = 3.0
#: a 16-bit peak this many times the vector FP32 one is a tensor/matrix-unit figure (catalog: 3.9x L4 upward; P100's
#: vector FP16 is 2x)
_TENSOR_OVER_FP32_MIN = 3.0


def has_matrix_units(spec: "DeviceSpec") -> bool:
    """Whether ``spec``'s dense 16-bit peak (the larger of FP16 and BF16) is a tensor / matrix-unit rate, at least
    :data:`_TENSOR_OVER_FP32_MIN` x its vector FP32 peak. Vector 16-bit math issues at most two FP16 ops per FP32 lane
    (packed half2): P100 19.05 vs 9.52 TFLOP/s (2.0x); matrix units 3.9x and up (L4 121 vs 31.3 and L40S 362 vs 91.6,
    Ada's dual-issue FP32; A10 / A40 4.0x; V100 / T4 8x; CDNA 8-16x; A100 16x; B200 30x). Of the catalog it excludes the
    P100 and the P4 (no 16-bit peak)."""
    fp32 = float(spec.peak_fp32_tflops or 0.0)
    half = max(float(spec.peak_fp16_tflops or 0.0), float(spec.peak_bf16_tflops or 0.0))
    return fp32 > 0 and half >= _TENSOR_OVER_FP32_MIN * fp32


def _cut_down_tensor(bw: float, half: float, fp32: float) -> bool:
    """A part with tensor/matrix units (16-bit peak at least :data:`_TENSOR_OVER_FP32_MIN` x the FP32 one) whose
    bandwidth per dense 16-bit FLOP is beyond the catalog's most by more than the margin while per FP32 FLOP it is
    inside the catalog: cut-down tensor compute (NVIDIA's H20) or a Gb/s figure; noted, not refused."""
    return (fp32 > 0 and half >= _TENSOR_OVER_FP32_MIN * fp32
            and bw / half > BYTES_PER_KFLOP_16BIT[1] * BANDWIDTH_RATIO_MARGIN_16BIT and bw / fp32 <= BYTES_PER_KFLOP_FP32[1])


def _bandwidth_ratio_problem(values: Any) -> str | None:
    """A message when ``memory_bandwidth_gbps`` per dense FLOP lies outside the catalog's range by more than the
    margins (:data:`BYTES_PER_KFLOP_16BIT`, :data:`BYTES_PER_KFLOP_FP32`); None inside it or under ``--force``."""
    if exotic_allowed():
        return None
    bw, fp32 = float(values.memory_bandwidth_gbps), float(values.peak_fp32_tflops)
    half = max(float(values.peak_fp16_tflops or 0), float(values.peak_bf16_tflops or 0))
    checks = [("peak_fp32_tflops", fp32, BYTES_PER_KFLOP_FP32, BANDWIDTH_RATIO_MARGIN_FP32)]
    if half >= _TENSOR_OVER_FP32_MIN * fp32:
        checks.insert(0, ("the dense 16-bit tensor peak", half, BYTES_PER_KFLOP_16BIT, BANDWIDTH_RATIO_MARGIN_16BIT))
    for what, peak, (lo, hi), margin in checks:
        r = bw / peak
        if what != "peak_fp32_tflops" and _cut_down_tensor(bw, half, fp32):
            continue  # per FP32 FLOP inside the catalog: a cut-down tensor part (H20) is plausible, a note says so
        if r > hi * margin:
            return (f"field 'memory_bandwidth_gbps' ({bw:g}) is {r:.3g} bytes per 1,000 FLOP of {what} ({peak:g} "
                    f"TFLOP/s), {r / hi:.2g}x the most of any catalog device ({lo:g} to {hi:g}; refused beyond "
                    f"{margin:g}x): was it given in Gb/s? divide by 8 (memory_bandwidth_gbps is GB/s, bytes), {_FORCE}")
        if r < lo / margin:
            return (f"field 'memory_bandwidth_gbps' ({bw:g}) is {r:.3g} bytes per 1,000 FLOP of {what} ({peak:g} "
                    f"TFLOP/s), {lo / r:.2g}x below the least of any catalog device ({lo:g} to {hi:g}; refused beyond "
                    f"{margin:g}x): is it a per-stack or per-channel figure, or {what} a sparse one? Give the board's "
                    f"total in GB/s, {_FORCE}")
    return None


#: the time to read the whole memory once at the memory bandwidth, ``memory_gb / memory_bandwidth_gbps`` in ms, of the
#: catalog, (lowest, highest): 17.78 ms (V100-SXM2-16GB, 16 GB at 900 GB/s) to 80.0 ms (L4, 24 GB at 300 GB/s);
#: ``tests/test_spec_memory_units.py`` recomputes both from ``wattcast devices --json``. Capacity grows with bandwidth
#: (HBM stacks add both), so a memory given in TB (B300's 270 GB as 0.27) reads 1,000x too fast and one in MB (a 4 GB
#: card as 4096) 1,000x too slow.
MEMORY_READ_MS = (17.78, 80.0)
#: the accepted range of :data:`MEMORY_READ_MS` (refused outside it, lifted by ``--force``): 1 ms (17.8x under the
#: catalog's least; a TB figure of any catalog device reads in 0.08 ms or less, 12.5x under it) to 2,000 ms (25x over
#: the catalog's most, room for unified LPDDR memory: NVIDIA GB10 / DGX Spark, 128 GB at 273 GB/s, reads in 469 ms; an
#: MB figure of any catalog device reads in 17.8 s or more, 8.9x over it)
MEMORY_READ_MS_ACCEPTED = (1.0, 2000.0)


def _memory_read_problem(values: Any) -> str | None:
    """A message when ``memory_gb`` read once at ``memory_bandwidth_gbps`` takes a time outside
    :data:`MEMORY_READ_MS_ACCEPTED`, naming the unit the memory was likely given in: TB under it, MB over it (inside
    the single-figure ranges of :data:`PLAUSIBLE`, 1,000x the other way always lands in the accepted range: 0.25 GB at
    200,000 GB/s reads in 1.25 us, 5,000 GB at 50 GB/s in 100 s); None inside it or under ``--force``."""
    if exotic_allowed():
        return None
    mem, bw = float(values.memory_gb), float(values.memory_bandwidth_gbps)
    ms, (lo, hi), (clo, chi) = mem / bw * 1000.0, MEMORY_READ_MS_ACCEPTED, MEMORY_READ_MS
    if lo <= ms <= hi:
        return None
    low = ms < lo
    hint = (f"was it given in TB? Give it in GB ({mem:g} TB is {mem * 1000:g} GB)" if low else
            f"was it given in MB (or MiB)? Give it in GB ({mem:g} MB is {mem / 1000:g} GB, {mem:g} MiB "
            f"{mem / 1024:g} GiB)")
    where = f"{lo / ms:.3g}x under" if low else f"{ms / hi:.3g}x over"
    return (f"field 'memory_gb' ({mem:g}) is read whole in {ms:.3g} ms at memory_bandwidth_gbps ({bw:g}), {where} the "
            f"{lo:g}-{hi:g} ms accepted (the catalog's {clo:g} ms V100-SXM2-16GB to {chi:g} ms L4): {hint}, {_FORCE}")


#: AMD stream processors (lanes) per CU on every CDNA (and GCN/RDNA) GPU: 4 SIMD units x 16 lanes (AMD CDNA 3
#: architecture whitepaper: "each CU ... four SIMD units", 16-wide; the CDNA 1/2 whitepapers the same; MI300X's 19,456
#: stream processors over 304 CUs = 64)
AMD_STREAM_PROCESSORS_PER_CU = 64

#: Idle board power as a fraction of TDP, used when a spec has no ``idle_power_w``. None of the shipped
#: specs lists one. Measured floor in the shared power data (Zeus NSDI'23 traces, NCF/MovieLens-1M
#: training, whose tiny model leaves the GPU waiting on the host nearly all the time, at the top power
#: limit): V100 PCIe 36-40 W of 250 W, P100 PCIe 34-35 W of 250 W, Quadro RTX 6000 55-69 W of 260 W,
#: i.e. 0.13-0.27 x TDP with a median of about 0.15. These are upper bounds on true idle (a training
#: loop is running); a datacenter board with nothing running sits a little lower.
IDLE_FRACTION_OF_TDP = 0.15
#: idle board power over TDP, (lowest, highest) accepted: the shipped specs list no idle power; the measured floors
#: behind :data:`IDLE_FRACTION_OF_TDP` (Zeus NSDI'23 traces: V100 PCIe, P100 PCIe,
#: Quadro RTX 6000) run 0.13-0.27 x TDP; the range leaves room below for the deep power-gated idle of large consumer
#: and workstation boards (an RTX 4090 idles near 12 W of 450, 0.027; down to 0.01 accepted) and 2.5x above. Lifted
#: by ``--force``.
IDLE_OVER_TDP = (0.01, 0.27 * 2.5)


def device_tdp_w(spec: DeviceSpec) -> float:
    """The spec's TDP; a clear error when the spec has none (power is scaled by it)."""
    if not spec.tdp_w:
        raise DeviceSpecError(
            f"device {spec.name!r}: power prediction needs 'tdp_w' (board power limit, W); add it to the spec file"
        )
    return float(spec.tdp_w)


def device_idle_w(spec: DeviceSpec) -> tuple[float, bool]:
    """(idle board power in W, True when it is the :data:`IDLE_FRACTION_OF_TDP` default)."""
    tdp = device_tdp_w(spec)
    if spec.idle_power_w:
        return float(min(spec.idle_power_w, tdp)), False
    return IDLE_FRACTION_OF_TDP * tdp, True


def fallback_notes(spec: "DeviceSpec", *, power: bool = True) -> list[str]:
    """Notes (for a prediction's ``warnings``) on the figures a spec leaves out that the models replace: no
    ``tdp_w`` (the kernel-time surrogate's watts-per-TFLOP input is then missing, which changes kernel times, and power
    cannot be predicted), no ``idle_power_w`` (0.15 x TDP is used: ``IDLE_FRACTION_OF_TDP``; only with ``power``, the
    predictions that have a power figure). Catalog devices (none of which lists an idle power) get none: their
    defaults are documented in README."""
    return [] if _is_catalog_device(spec) else _fallback_notes(spec, power)


def _fallback_notes(spec: "DeviceSpec", power: bool) -> list[str]:
    """:func:`fallback_notes` of a spec already known not to be a catalog device's."""
    if not spec.tdp_w:
        return [f"{spec.name}: the spec gives no tdp_w; the kernel-time surrogate takes TDP as an input (watts per "
                "TFLOP), so kernel times are predicted with it missing and may differ from the same GPU's with it; "
                "power and energy need it: give tdp_w"]
    if power and not spec.idle_power_w:
        return [f"{spec.name}: the spec gives no idle_power_w; {IDLE_FRACTION_OF_TDP:g} x tdp_w = "
                f"{IDLE_FRACTION_OF_TDP * float(spec.tdp_w):g} W is assumed (idle and communication power, energy): "
                "give idle_power_w if the datasheet or nvidia-smi has it"]
    return []


def base_clock_notes(spec: "DeviceSpec", *, catalog: bool | None = None) -> list[str]:
    """A note (for a prediction's ``warnings``) when ``spec`` gives no ``base_clock_mhz``, which the kernel-time
    surrogate reads as the base/boost clock ratio (featurize/kernel_features.py ``dev_base_over_boost``; FP32 GEMMs
    most: an H100 SXM5, A100 SXM4 or V100 SXM2 spec without it, and no twin to take it from, predicts FP32 GEMMs of
    1024^3 to 16384^3 3-8% slower, measured at stop 51):

    - the clock taken from the catalog devices with the same compute silicon
      (:func:`wattcast.data.catalog_match.twin_base_clock`), catalog device or not (the H200 takes the H100 SXM5's);
    - else, for a spec that is not a catalog device's (``catalog``: known already, else looked up), that it is
      predicted as unknown, as the training GPUs without one (B200, MI300X): give it. A catalog device without one
      (B200, MI300X) is predicted as its training rows were featurized, and gets none.
    """
    if spec.base_clock_mhz:
        return []
    from wattcast.data.catalog_match import twin_base_clock

    twin = twin_base_clock(spec)
    if twin is not None:
        mhz, names = twin
        return [f"{spec.name}: the spec gives no base_clock_mhz; {mhz:g} MHz is taken from {' and '.join(names)}, the "
                f"catalog device{'s' if len(names) > 1 else ''} with the same compute silicon (SMs, {spec.boost_clock_mhz:g} "
                "MHz boost clock, TDP and peaks): the kernel-time surrogate reads the base/boost clock ratio (FP32 GEMMs "
                "most); give base_clock_mhz if the datasheet lists a different one"]
    if catalog is None:
        catalog = _is_catalog_device(spec)
    if catalog:
        return []
    return [f"{spec.name}: the spec gives no base_clock_mhz and no catalog device with the same compute silicon lists "
            "one; the kernel-time surrogate reads the base/boost clock ratio (FP32 GEMMs most: an H100, A100 or V100 "
            "spec without it predicts FP32 GEMMs of 1024^3 to 16384^3 3-8% slower), so kernel times are predicted "
            "with it unknown (as for the training GPUs without one: B200, MI300X) and may differ from the same GPU's "
            "with it: give base_clock_mhz from the datasheet"]


def _is_catalog_device(spec: "DeviceSpec") -> bool:
    try:
        from wattcast.data.catalog import find_device
        c = find_device(spec.name)
    except Exception:  # noqa: BLE001 - catalog loading or unreadable
        return False
    return c is not None and c.to_dict() == spec.to_dict()


def bandwidth_ratio_notes(spec: "DeviceSpec") -> list[str]:
    """A note where the bandwidth per dense 16-bit tensor FLOP is beyond the catalog's most by more than the margin
    while per FP32 FLOP it is inside the catalog (not refused: NVIDIA's H20, 4,000 GB/s over 148 TFLOP/s BF16, is
    such a part; a Gb/s figure of a part with tensor cores usually lands there too, so the note names both)."""
    bw, fp32 = float(spec.memory_bandwidth_gbps), float(spec.peak_fp32_tflops or 0)
    half = max(float(spec.peak_fp16_tflops or 0), float(spec.peak_bf16_tflops or 0))
    if not _cut_down_tensor(bw, half, fp32):
        return []
    r, hi = bw / half, BYTES_PER_KFLOP_16BIT[1]
    return [f"{spec.name}: memory_bandwidth_gbps ({bw:g}) is {r:.3g} bytes per 1,000 FLOP of the dense 16-bit tensor "
            f"peak ({half:g} TFLOP/s), {r / hi:.2g}x the most of any catalog device: a part with cut-down tensor "
            f"compute (as NVIDIA's H20), or a bandwidth given in Gb/s (divide by 8; the field is GB/s)"]


def watts_per_dense_tflops(spec: "DeviceSpec") -> float | None:
    """``tdp_w`` per TFLOP/s of the dense 16-bit tensor peak (the larger of FP16 and BF16), or of the vector FP32 peak
    where the 16-bit figure is no tensor/matrix-unit one (below :data:`_TENSOR_OVER_FP32_MIN` x FP32: P100's vector
    FP16, or none: P4); None without ``tdp_w``."""
    if not spec.tdp_w:
        return None
    half = max(float(spec.peak_fp16_tflops or 0), float(spec.peak_bf16_tflops or 0))
    return float(spec.tdp_w) / (half if has_matrix_units(spec) else float(spec.peak_fp32_tflops))


@functools.lru_cache(maxsize=1)
def catalog_min_watts_per_tflops() -> tuple[float, str]:
    """(the least :func:`watts_per_dense_tflops` of any catalog device (data/devices/*.yaml), its device): computed
    from the shipped files on first use (B200 at stop 55: 1,000 W over 2,250 TFLOP/s BF16, 0.444)."""
    from wattcast.data.catalog import list_devices

    return min((w, s.name) for s in list_devices() if (w := watts_per_dense_tflops(s)) is not None)


def tdp_per_flop_notes(spec: "DeviceSpec") -> list[str]:
    """A note when ``spec``'s TDP per dense TFLOP/s (:func:`watts_per_dense_tflops`) is below every catalog device's
    (:func:`catalog_min_watts_per_tflops`). The power model (models/power.py) predicts power as idle + (TDP - idle) x
    a learned fraction, and it has seen no design drawing so little per FLOP: a spec with only ``tdp_w`` lowered (an
    H100 at 350 W) keeps its step time and gets power and energy scaled down with the TDP (2x less at half the TDP,
    audit 55b #2), where the same GPU power-capped at 350 W runs slower and saves about a third (``power_limit_w``
    lowers the clocks: models/power.py apply_power). Catalog devices never get it (at or above the least by
    construction)."""
    w = watts_per_dense_tflops(spec)
    if w is None:
        return []
    least, name = catalog_min_watts_per_tflops()
    if w >= least:
        return []
    return [f"{spec.name}: tdp_w ({float(spec.tdp_w):g} W) is {w:.3g} W per dense TFLOP/s, below every catalog GPU's "
            f"(the least is {name}'s, {least:.3g}): the power model has seen no design drawing so little per FLOP, and "
            "it models power as a fraction of TDP, so power and energy scale with the tdp_w given (the step time "
            "hardly moves) and may be far too low; a power-capped GPU is modelled with --power-limit-w "
            "(power_limit_w=) on its full-TDP spec, which lowers its clocks"]


def spec_notes(spec: "DeviceSpec", *, power: bool = True) -> list[str]:
    """Every spec warning a prediction carries: :func:`peak_ratio_notes`, :func:`dense_rate_notes`,
    :func:`fallback_notes` (``power``: the idle-power default too; kernel latency has no power figure),
    :func:`base_clock_notes` (a catalog device's too: the H200's base clock from the H100 SXM5), and with ``power``
    :func:`tdp_per_flop_notes` (a TDP per FLOP below the catalog's: power and energy scale with it)."""
    if _is_catalog_device(spec):  # every catalog entry passes the figure checks (tests): only its peak ratios
        return [*peak_ratio_notes(spec), *base_clock_notes(spec, catalog=True)]  # and a base clock from its twin
    return [*peak_ratio_notes(spec), *dense_rate_notes(spec), *bandwidth_ratio_notes(spec),
            *_fallback_notes(spec, power), *(tdp_per_flop_notes(spec) if power else ()),
            *base_clock_notes(spec, catalog=False)]  # the catalog looked up once


def _aliases(v: Any) -> Any:
    v = () if v is None or v == "" else tuple(v) if isinstance(v, list) else v  # tuple('abc'): three aliases
    if not isinstance(v, tuple):
        raise problem("wc_type", f"{FIELD} must be a list of strings, got {v!r}")
    bad = [a for a in v if not isinstance(a, str)]
    if bad:
        raise problem("wc_type", f"{FIELD} must be a list of strings, got {bad[0]!r} in {list(v)!r}")
    return v


def _sources(v: Any) -> Any:
    v = {} if v is None or v == "" else v
    if not isinstance(v, Mapping):
        raise problem("wc_type", f"{FIELD} must be a mapping of field name -> citation (strings), got {v!r}")
    bad = [(k, c) for k, c in v.items() if not (isinstance(k, str) and isinstance(c, str))]
    if bad:
        raise problem("wc_type", f"{FIELD} must map field names to citation strings, got {bad[0][0]!r}: {bad[0][1]!r}")
    return dict(v)


_POSITIVE = number(value_msg="must be a positive finite number, got {v!r}", finite_msg="must be a positive finite number, got {v!r}",
                   hint=yaml_number_hint)
_WHOLE = number(value_msg="must be a positive finite number, got {v!r}", finite_msg="must be a positive finite number, got {v!r}",
                integer=True, whole_msg="must be an integer, got {v!r}", hint=yaml_number_hint)


def _figure(name: str, *, needed: bool = False, whole: bool = False) -> Any:
    """The type of a numeric spec field: a positive finite number (whole with ``whole``), inside its plausible range
    (:data:`PLAUSIBLE`) when it has one."""
    checks = [AfterValidator(required)] if needed else []
    checks.append(AfterValidator(optional(_WHOLE if whole else _POSITIVE)))
    if name in PLAUSIBLE:
        checks.append(AfterValidator(plausible(*PLAUSIBLE[name])))
    return Annotated[(Any, *checks)]


_TEXT = AfterValidator(text())
_Text = Annotated[Any, _TEXT]
_OptionalText = Annotated[Any, AfterValidator(optional(text()))]


class DeviceSpecModel(BaseModel):
    """The validation model of a device spec (the fields of :class:`DeviceSpec`, in the order problems are
    reported): types, required fields, positive finite figures, plausible ranges (units off by 1,000x: each figure
    alone, FP32 peaks against SMs x clock, tensor peaks against FP32, memory against bandwidth; lifted by
    :func:`wattcast.data.checks.allow_exotic` / ``--force``) and the consistency rules a datasheet never breaks.
    Validated with ``context={"cite": True}`` it also asks every figure for a citation (the rule of spec files).
    Values are checked, never converted: a :class:`DeviceSpec` holds what it was given."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[Any, AfterValidator(required), _TEXT]
    vendor: Annotated[Any, _TEXT, AfterValidator(one_of(VENDORS, "must be nvidia|amd|intel|other, got {v!r}"))] = "nvidia"
    arch: _Text = ""
    interconnect: _OptionalText = None
    memory_type: _OptionalText = None
    source: _Text = ""
    aliases: Annotated[Any, BeforeValidator(_aliases)] = ()
    sources: Annotated[Any, BeforeValidator(_sources)] = {}
    tdp_w: _figure("tdp_w") = None
    idle_power_w: _figure("idle_power_w") = None
    memory_gb: _figure("memory_gb", needed=True)
    memory_bandwidth_gbps: _figure("memory_bandwidth_gbps", needed=True)
    peak_fp32_tflops: _figure("peak_fp32_tflops", needed=True)
    peak_fp32_matrix_tflops: _figure("peak_fp32_matrix_tflops") = None
    peak_tf32_tflops: _figure("peak_tf32_tflops") = None
    peak_fp16_tflops: _figure("peak_fp16_tflops") = None
    peak_bf16_tflops: _figure("peak_bf16_tflops") = None
    peak_fp8_tflops: _figure("peak_fp8_tflops") = None
    boost_clock_mhz: _figure("boost_clock_mhz", needed=True)
    base_clock_mhz: _figure("base_clock_mhz") = None
    l2_cache_mb: _figure("l2_cache_mb", needed=True)
    interconnect_bandwidth_gbps: _figure("interconnect_bandwidth_gbps") = None
    die_area_mm2: _figure("die_area_mm2") = None
    num_sms: _figure("num_sms", needed=True, whole=True)
    cores_per_sm: _figure("cores_per_sm", whole=True) = None
    process_node_nm: _figure("process_node_nm") = None
    launch_price_usd: _figure("launch_price_usd") = None
    schema_version: Annotated[Any, AfterValidator(schema(SCHEMA_VERSION))] = SCHEMA_VERSION

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> "DeviceSpecModel":
        """The rules between fields a datasheet never breaks, then (spec files) the citation of every figure."""
        s = self
        # FP32 peaks the SMs cannot give at the clock: a unit 1,000x off (before the rules below, which it would trip)
        for f in ("peak_fp32_tflops", "peak_fp32_matrix_tflops"):
            v = getattr(s, f)
            msg = v is not None and _fp32_per_sm_problem(f, v, s.num_sms, s.boost_clock_mhz)
            if msg:
                raise problem("wc_plausible", msg)
        # tensor peaks 1,000x above FP32 (one of the two in another unit)
        for f in _OVER_FP32:
            v = getattr(s, f)
            if v is not None and v > s.peak_fp32_tflops * TENSOR_OVER_FP32_MAX and not exotic_allowed():
                raise problem("wc_plausible", f"field '{f}' ({v:g}) is {v / s.peak_fp32_tflops:,.0f}x "
                              f"peak_fp32_tflops ({s.peak_fp32_tflops:g}), over the {TENSOR_OVER_FP32_MAX:g}x of any "
                              f"GPU (the catalog's most: 62x, Blackwell FP8): was it given in GFLOP/s, or "
                              f"peak_fp32_tflops in PFLOP/s? Give both in TFLOP/s, {_FORCE}")
        if s.base_clock_mhz and s.base_clock_mhz > s.boost_clock_mhz * 1.001:
            raise problem("wc_rule", f"field 'base_clock_mhz' ({s.base_clock_mhz}) exceeds boost_clock_mhz "
                                     f"({s.boost_clock_mhz})")
        for f in _OVER_FP32:
            v = getattr(s, f)
            if v is not None and v < s.peak_fp32_tflops * 0.999:
                # a reduced-precision matrix peak below vector FP32 means a typo (or a non-tensor figure)
                unit = (f" ({s.peak_fp32_tflops / v:,.0f}x below: was it given in PFLOP/s?)"
                        if _pflops_reading(s, f, v) else "")
                raise problem("wc_rule", f"field '{f}' ({v}) is below peak_fp32_tflops ({s.peak_fp32_tflops}){unit}; "
                              "reduced-precision and FP32 matrix peaks are dense tensor/matrix figures and are never "
                              "slower than vector FP32")
        for half in ("peak_fp16_tflops", "peak_bf16_tflops"):
            h = getattr(s, half)
            if s.peak_fp8_tflops and h and s.peak_fp8_tflops < h * 0.999:
                raise problem("wc_rule", f"field 'peak_fp8_tflops' ({s.peak_fp8_tflops}) is below {half} ({h}); FP8 "
                              "tensor cores run at least at the 16-bit rate (dense figures for both)")
            if s.peak_tf32_tflops and h and s.peak_tf32_tflops > h * 1.001:
                raise problem("wc_rule", f"field 'peak_tf32_tflops' ({s.peak_tf32_tflops}) is above {half} ({h}); TF32 "
                              "tensor cores run at most at the 16-bit rate (half of it on every NVIDIA generation; "
                              "dense figures for both)")
        if s.peak_fp8_tflops and arch_without_fp8(s.arch):
            # a typed-in FP8 figure would give the GEMMs of an fp8 step an FP8 speed-up the GPU cannot deliver
            raise problem("wc_rule", f"field 'peak_fp8_tflops' ({s.peak_fp8_tflops:g}) is given, but arch {s.arch!r} has "
                          "no FP8 tensor cores (FP8 tensor cores arrived with NVIDIA Hopper / Ada and AMD CDNA3; e.g. A100, V100, "
                          "T4 and MI250 have none): drop peak_fp8_tflops, or correct arch")
        if s.idle_power_w and s.tdp_w and s.idle_power_w >= s.tdp_w:
            raise problem("wc_rule", f"field 'idle_power_w' ({s.idle_power_w}) must be below tdp_w ({s.tdp_w})")
        if s.idle_power_w and s.tdp_w and not exotic_allowed():
            lo, hi = IDLE_OVER_TDP
            frac = s.idle_power_w / s.tdp_w
            if not lo <= frac <= hi:
                raise problem("wc_plausible", f"field 'idle_power_w' ({s.idle_power_w:g}) is {frac:.3g} x tdp_w "
                              f"({s.tdp_w:g}), outside the {lo:.3g}-{hi:.3g} a GPU board idles at (measured 0.13-0.27 "
                              f"x TDP, with a margin): give the board's power with nothing running, in watts, {_FORCE}")
        # tensor peaks above what the architecture does densely: a datasheet's sparse column
        msg = _dense_rate_problem(s)
        if msg:
            raise problem("wc_plausible", msg)
        msg = _bandwidth_ratio_problem(s)
        if msg:
            raise problem("wc_plausible", msg)
        msg = _memory_read_problem(s)  # memory in TB or MB (after the bandwidth's own checks: it is the reference)
        if msg:
            raise problem("wc_plausible", msg)
        if s.cores_per_sm and s.vendor == "amd" and s.cores_per_sm != AMD_STREAM_PROCESSORS_PER_CU and not exotic_allowed():
            raise problem("wc_plausible", f"field 'cores_per_sm' ({s.cores_per_sm}) must be "
                          f"{AMD_STREAM_PROCESSORS_PER_CU} on AMD: stream processors per CU (4 SIMD units x 16 lanes, "
                          "AMD CDNA 3 architecture whitepaper), not SIMD units or wavefront slots; num_sms counts the "
                          f"CUs. {_FORCE[0].upper()}{_FORCE[1:]}")
        # FP32 peak must be reachable by the cores: peak <= 2 * sms * cores * clock (+5% slack).
        if s.cores_per_sm and s.vendor == "nvidia":
            bound = 2 * s.num_sms * s.cores_per_sm * s.boost_clock_mhz * 1e6 / 1e12
            if s.peak_fp32_tflops > bound * 1.05:
                raise problem("wc_rule", f"field 'peak_fp32_tflops' ({s.peak_fp32_tflops}) exceeds "
                                         f"2 x num_sms x cores_per_sm x boost_clock = {bound:.1f} TFLOP/s")
        if info.context and info.context.get("cite"):
            for f in _NUMERIC:
                if getattr(s, f) is not None and not (s.sources.get(f) or s.source):
                    raise problem("wc_citation", f"field '{f}' has no source; give 'source' or 'sources.{f}'")
        return s


def _check(values: Mapping[str, Any], *, cite: bool = False) -> DeviceSpecModel:
    """Validate ``values`` (a spec's fields) on :class:`DeviceSpecModel`; :class:`DeviceSpecError` naming the first
    problem's field and value (and the device)."""
    try:
        return DeviceSpecModel.model_validate(values, context={"cite": cite})
    except ValidationError as e:
        name = values.get("name")
        where = f"device {name!r}" if isinstance(name, str) and name else "device spec"
        raise DeviceSpecError(f"{where}: {first_problem(e, known=lambda section: sorted(_FIELDS))}") from None


def _values(spec: DeviceSpec) -> dict[str, Any]:
    return {f: getattr(spec, f) for f in _FIELDS}


def validate(spec: DeviceSpec) -> DeviceSpec:
    """Return ``spec`` unchanged or raise :class:`DeviceSpecError` naming the bad field.

    The value checks every :class:`DeviceSpec` passes when it is built, plus the citation rule of spec files:
    every figure needs ``source`` or ``sources.<field>``.
    """
    _check(_values(spec), cite=True)
    return spec


_FIELDS = {f.name for f in dataclasses.fields(DeviceSpec)}


def from_dict(d: Mapping[str, Any]) -> DeviceSpec:
    """Build and validate a spec from a plain mapping (YAML/JSON in the own schema), citations included."""
    m = _check(d, cite=True)  # unknown and missing fields too, before the dataclass sees them
    # the model's aliases and sources: a list read as a tuple, an empty entry (None, '') as none
    return DeviceSpec(**{**d, "aliases": m.aliases, "sources": m.sources})
