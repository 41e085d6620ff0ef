"""Read NeuSight's device JSON format into a :class:`DeviceSpec` (and describe the mapping).

NeuSight (Lee et al., ASPLOS 2025) describes a GPU with a flat JSON object::

    {"Device": "NVIDIA L4", "Dev_Mem": 24, "Mem_Bw": 300, "Num_Sm": 60, "Core_Per_SM": 128,
     "Freq": 2040, "SingleFLOPs": 31334, "L2Cache": 48}

Units: ``Dev_Mem`` GB, ``Mem_Bw`` GB/s, ``Freq`` MHz, ``SingleFLOPs`` GFLOP/s FP32, ``L2Cache`` MB.
AMD files give ``SingleFLOPsVEC`` (vector FP32) and ``SingleFLOPsMM`` (FP32 on the matrix cores)
instead of ``SingleFLOPs``, and count ``Core_Per_SM`` in SIMD units (4 per CU) rather than FP32
lanes; the spec stores lanes (4 SIMD16 units = 64), and :func:`to_neusight_json` converts back.

NeuSight files carry FP32 figures only. When the JSON's ``Device`` names a catalog entry, the
file's numbers win and the fields NeuSight lacks (tensor-core peaks, TDP, clocks, interconnect ...)
are filled from the catalog entry, each with a ``sources`` note saying so. A GPU that is not in the
catalog loads from the JSON alone.

Besides NeuSight's keys, a file may give the own schema's optional fields NeuSight lacks (``OWN_KEYS``: ``tdp_w``,
``idle_power_w``, tensor peaks, ``base_clock_mhz``, ...), under their own-schema names and units; they win over the
catalog's. Any other key is refused naming it, and so is a figure given as text (``"Mem_Bw": "3352"``), as in the
own schema.

One NeuSight file, ``NVIDIA_H100_80GB_HBM3_TP.json``, describes a 2-GPU tensor-parallel pair as one
device: memory, bandwidth and L2 are doubled, ``Num_Sm`` is not, and ``SingleFLOPs`` (1979 TFLOP/s)
is the pair's dense FP16 tensor peak, not FP32. Such a file is recognised because its FP32 figure
cannot be reached by ``2 x Num_Sm x Core_Per_SM x Freq``; with a catalog match the group size ``k``
is ``Dev_Mem`` over the catalog's memory, the spec becomes ``"<Device> x<k>"`` with ``k x`` the SMs,
and ``SingleFLOPs`` is read as the group's FP16 tensor peak.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from wattcast.data.checks import did_you_mean
from wattcast.data.device_spec import DeviceSpec, DeviceSpecError, validate
from wattcast.data.spec_model import is_number

#: NeuSight key -> DeviceSpec field (AMD keys included)
KEY_TO_FIELD = {
    "Device": "name",
    "Dev_Mem": "memory_gb",
    "Mem_Bw": "memory_bandwidth_gbps",
    "Num_Sm": "num_sms",
    "Core_Per_SM": "cores_per_sm",
    "Freq": "boost_clock_mhz",
    "SingleFLOPs": "peak_fp32_tflops",
    "SingleFLOPsVEC": "peak_fp32_tflops",
    "SingleFLOPsMM": "peak_fp32_matrix_tflops",
    "L2Cache": "l2_cache_mb",
}

#: keys a NeuSight file must have (besides an FP32 figure: SingleFLOPs, or SingleFLOPsVEC on AMD)
_REQUIRED_KEYS = ("Device", "Dev_Mem", "Mem_Bw", "Num_Sm", "Freq", "L2Cache")

#: keys that identify a mapping as NeuSight's format
_MARKER_KEYS = ("Device", "SingleFLOPs", "SingleFLOPsMM", "SingleFLOPsVEC")

#: FP32 lanes per SIMD unit on AMD CDNA (a CU has 4 SIMD16 units)
AMD_LANES_PER_SIMD = 16

#: catalog fields NeuSight lacks, filled from a matching catalog entry
_FILL_FROM_CATALOG = (
    "arch",
    "peak_fp32_matrix_tflops",
    "peak_tf32_tflops",
    "peak_fp16_tflops",
    "peak_bf16_tflops",
    "peak_fp8_tflops",
    "cores_per_sm",
    "base_clock_mhz",
    "tdp_w",
    "idle_power_w",
    "interconnect",
    "interconnect_bandwidth_gbps",
    "process_node_nm",
    "die_area_mm2",
    "launch_price_usd",
    "memory_type",
)

#: own-schema fields a NeuSight file may give too (NeuSight has no key for them); they win over the catalog's
OWN_KEYS = tuple(f for f in _FILL_FROM_CATALOG if f not in KEY_TO_FIELD.values())

#: of those, the ones that add up over the GPUs of a multi-GPU group (scaled by k)
_EXTENSIVE = {
    "peak_fp32_matrix_tflops",
    "peak_tf32_tflops",
    "peak_fp16_tflops",
    "peak_bf16_tflops",
    "peak_fp8_tflops",
    "tdp_w",
    "idle_power_w",
    "die_area_mm2",
    "launch_price_usd",
}


def is_neusight_json(d: Any) -> bool:
    """True when ``d`` looks like a NeuSight device JSON (has ``Device`` / ``SingleFLOPs*`` keys)."""
    return isinstance(d, Mapping) and any(k in d for k in _MARKER_KEYS)


#: a Device name that says NVIDIA (NeuSight's files write "NVIDIA L4", "Tesla T4", ...)
_NVIDIA_NAME = re.compile(r"nvidia|tesla|geforce|quadro|\brtx", re.I)
#: NeuSight's AMD-only keys
_AMD_KEYS = ("SingleFLOPsVEC", "SingleFLOPsMM")


def _vendor_from_name(name: str, d: Mapping[str, Any], where: str = "NeuSight device JSON") -> str:
    """The vendor a NeuSight file describes: its name first (an NVIDIA name is NVIDIA's whatever keys the file has: a
    file naming an NVIDIA GPU with AMD's keys is refused), then AMD's keys (``SingleFLOPsVEC`` / ``SingleFLOPsMM``)."""
    low = name.lower()
    amd_keys = [k for k in _AMD_KEYS if k in d]
    if _NVIDIA_NAME.search(name) and not re.search(r"\bamd\b|instinct|radeon", low):
        if amd_keys:
            raise DeviceSpecError(f"{where}: {' and '.join(amd_keys)} {'are' if len(amd_keys) > 1 else 'is'} NeuSight's "
                                  f"AMD key{'s' if len(amd_keys) > 1 else ''} (vector / matrix-core FP32, Core_Per_SM in "
                                  f"SIMD units), but the device is named {name!r}: an NVIDIA GPU gives its FP32 rate as "
                                  "SingleFLOPs")
        return "nvidia"
    if re.search(r"\bamd\b|instinct|radeon", low) or amd_keys:
        return "amd"
    if "intel" in low or "gaudi" in low:
        return "intel"
    return "nvidia"


def _same_field_keys(d: Mapping[str, Any], where: str) -> None:
    """Refuse two keys that map to one field (``SingleFLOPs`` and ``SingleFLOPsVEC`` are both the vector FP32 peak):
    one would be silently dropped."""
    by_field: dict[str, list[str]] = {}
    for k in d:
        if k in KEY_TO_FIELD:
            by_field.setdefault(KEY_TO_FIELD[k], []).append(k)
    for f, keys in by_field.items():
        if len(keys) > 1:
            vals = ", ".join(f"{k} {d[k]!r}" for k in keys)
            raise DeviceSpecError(f"{where}: keys {' and '.join(repr(k) for k in keys)} both give {f} ({vals}); give "
                                  "one (SingleFLOPs on NVIDIA, SingleFLOPsVEC with SingleFLOPsMM on AMD)")


def _number(d: Mapping[str, Any], key: str, where: str) -> float:
    v = d[key]
    if not is_number(v):  # text ("3352"), a bool, a list...: refused as the own schema does, never converted
        raise DeviceSpecError(f"{where}: NeuSight key '{key}' (-> {KEY_TO_FIELD[key]}) must be a number, got {v!r}")
    return float(v)


def _unknown_keys(d: Mapping[str, Any], where: str) -> None:
    """Refuse keys that are neither NeuSight's nor an own-schema field a NeuSight file may carry (``OWN_KEYS``)."""
    known = (*KEY_TO_FIELD, *OWN_KEYS)
    unknown = [k for k in d if k not in known]
    if unknown:
        hints = [f"{k!r}" + did_you_mean(str(k), known, " (did you mean {}?)", quote=True, n=1) for k in unknown]
        raise DeviceSpecError(f"{where}: unknown key(s) {', '.join(hints)}; NeuSight keys: {', '.join(KEY_TO_FIELD)}; "
                              f"own-schema fields also accepted: {', '.join(OWN_KEYS)}")


def _intish(x: float) -> float | int:
    return int(x) if math.isfinite(x) and x == int(x) else x


def _catalog_entry(name: str) -> DeviceSpec | None:
    from wattcast.data.catalog import find_device  # lazy: catalog imports this module

    return find_device(name)


def from_neusight_json(
    d: Mapping[str, Any], *, use_catalog: bool = True, origin: str | None = None
) -> DeviceSpec:
    """Map a NeuSight device JSON to a validated :class:`DeviceSpec`.

    ``use_catalog``: fill the fields NeuSight lacks from the catalog entry the ``Device`` name
    resolves to (if any). ``origin``: a file name to mention in messages and citations.
    """
    if not isinstance(d, Mapping):
        raise DeviceSpecError(f"NeuSight device JSON must be an object, got {type(d).__name__}")
    name = str(d.get("Device", "") or "").strip()
    where = f"NeuSight device JSON {name or origin or '?'!r}" + (f" ({origin})" if origin and name else "")
    _unknown_keys(d, where)
    _same_field_keys(d, where)
    for key in _REQUIRED_KEYS:
        if key not in d or d[key] in (None, ""):
            raise DeviceSpecError(f"{where}: missing NeuSight key '{key}' (-> {KEY_TO_FIELD[key]})")
    vendor = _vendor_from_name(name, d, where)
    if "SingleFLOPsVEC" in d:
        fp32_key = "SingleFLOPsVEC"
    elif "SingleFLOPs" in d:
        fp32_key = "SingleFLOPs"
    else:
        want = "SingleFLOPsVEC' (or 'SingleFLOPs" if vendor == "amd" else "SingleFLOPs"
        raise DeviceSpecError(f"{where}: missing NeuSight key '{want}' (-> peak_fp32_tflops)")

    cite = f"NeuSight device JSON {name}" + (f" ({origin})" if origin else "")
    sources: dict[str, str] = {}
    kw: dict[str, Any] = {
        "name": name,
        "vendor": vendor,
        "memory_gb": _intish(_number(d, "Dev_Mem", where)),
        "memory_bandwidth_gbps": _intish(_number(d, "Mem_Bw", where)),
        "num_sms": _intish(_number(d, "Num_Sm", where)),
        "boost_clock_mhz": _intish(_number(d, "Freq", where)),
        "l2_cache_mb": _intish(_number(d, "L2Cache", where)),
        "peak_fp32_tflops": _number(d, fp32_key, where) / 1000.0,
    }
    sources["peak_fp32_tflops"] = f"{cite}: {fp32_key} {d[fp32_key]} GFLOP/s / 1000"
    if "SingleFLOPsMM" in d:
        kw["peak_fp32_matrix_tflops"] = _number(d, "SingleFLOPsMM", where) / 1000.0
        sources["peak_fp32_matrix_tflops"] = f"{cite}: SingleFLOPsMM {d['SingleFLOPsMM']} GFLOP/s / 1000"
    if d.get("Core_Per_SM") not in (None, ""):
        cores = _number(d, "Core_Per_SM", where)
        if vendor == "amd" and 0 < cores <= 8:
            # NeuSight counts SIMD units per CU on AMD; the spec counts FP32 lanes
            sources["cores_per_sm"] = f"{cite}: Core_Per_SM {d['Core_Per_SM']} SIMD units x {AMD_LANES_PER_SIMD} lanes"
            cores *= AMD_LANES_PER_SIMD
        kw["cores_per_sm"] = _intish(cores)

    cat = _catalog_entry(name) if (use_catalog and name) else None
    group = 1
    cores = kw.get("cores_per_sm")
    if cat is not None and vendor == "nvidia" and cores and kw["num_sms"] > 0 and kw["boost_clock_mhz"] > 0:
        bound = 2 * kw["num_sms"] * cores * kw["boost_clock_mhz"] / 1e6
        if kw["peak_fp32_tflops"] > bound * 1.05:
            # not an FP32 rate these SMs can reach: a multi-GPU group whose figure is the FP16 tensor peak
            group = max(1, round(kw["memory_gb"] / cat.memory_gb)) if cat.memory_gb else 1
            if group == 1:  # one GPU's memory: not a group, so no reading of the figure is sure; refused
                raise DeviceSpecError(
                    f"{where}: {fp32_key} {d[fp32_key]} GFLOP/s exceeds 2 x Num_Sm x Core_Per_SM x Freq = "
                    f"{bound * 1000:,.0f} GFLOP/s ({kw['num_sms']} x {cores} x {kw['boost_clock_mhz']} MHz x 2), the "
                    f"most FP32 these SMs can do; Dev_Mem {d['Dev_Mem']} GB is one {cat.name}'s "
                    f"({cat.memory_gb:g} GB), so it is no multi-GPU group either (whose SingleFLOPs is the group's FP16 "
                    f"tensor peak). Give the FP32 rate in GFLOP/s (the catalog's {cat.name}: "
                    f"{cat.peak_fp32_tflops * 1000:,.0f}), or check Num_Sm, Core_Per_SM and Freq")
            fp16 = kw["peak_fp32_tflops"]
            kw["num_sms"] = int(kw["num_sms"]) * group
            kw["peak_fp32_tflops"] = round(cat.peak_fp32_tflops * group, 3)
            kw["peak_fp16_tflops"] = fp16
            sources["peak_fp16_tflops"] = (
                f"{cite}: {fp32_key} {d[fp32_key]} GFLOP/s exceeds 2 x Num_Sm x Core_Per_SM x Freq, "
                f"read as the dense FP16 tensor peak of {group} GPU(s)"
            )
            sources["peak_fp32_tflops"] = f"catalog entry {cat.name} x {group}: {cat.source_of('peak_fp32_tflops')}"
            if group > 1:
                kw["name"] = f"{name} x{group}"
                sources["num_sms"] = f"{cite}: Num_Sm {d['Num_Sm']} per GPU x {group} GPUs (Dev_Mem / catalog memory)"

    for f in OWN_KEYS:  # given in the file under the own schema's name: as given (validated with the spec)
        if f in d and d[f] is not None:
            kw[f] = d[f]
            sources[f] = f"{cite}: {f} (own-schema field in the file)"

    if cat is not None:
        for f in _FILL_FROM_CATALOG:
            v = getattr(cat, f)
            if v is None or v == "" or kw.get(f) is not None:
                continue
            if f == "base_clock_mhz" and v > kw["boost_clock_mhz"]:
                continue  # the file's clock wins; a catalog base above it would contradict it
            if group > 1 and f in _EXTENSIVE:
                v = v * group
            kw[f] = v
            if f not in ("arch", "interconnect", "memory_type"):
                scale = f" x {group}" if group > 1 and f in _EXTENSIVE else ""
                sources[f] = f"catalog entry {cat.name}{scale} (not in NeuSight JSON): {cat.source_of(f)}"
        kw["aliases"] = (cat.name,) if group == 1 else ()
        if group > 1:
            kw["arch"] = f"{cat.arch}, {group}-GPU tensor-parallel group".strip(", ")

    kw["source"] = cite
    kw["sources"] = sources
    try:
        return validate(DeviceSpec(**kw))
    except DeviceSpecError as e:
        msg = str(e)
        for key, field_name in KEY_TO_FIELD.items():
            if f"'{field_name}'" in msg and key in d:
                if key.startswith("SingleFLOPs"):  # NeuSight's FLOP/s keys are GFLOP/s: the fix is in the file's unit
                    msg = msg.replace("Give it in TFLOP/s", f"Give {key} in GFLOP/s (NeuSight's unit)")
                msg += f" [NeuSight key '{key}']"
                break
        raise DeviceSpecError(f"{msg} (from {where})") from None
