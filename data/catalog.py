"""The shipped device catalog and device resolution.

``load_catalog()`` reads every ``devices/*.yaml`` packaged with ``wattcast.data`` (one device per
file, own schema). ``resolve_device(x)`` turns what a user typed into a :class:`DeviceSpec`:

* an existing ``.yaml`` / ``.yml`` / ``.json`` file: loaded with :func:`load_spec_file` (own schema,
  or NeuSight's device JSON, recognised by its ``Device`` / ``SingleFLOPs`` / ``SingleFLOPsMM`` keys);
* otherwise a name, matched case- and punctuation-insensitively (:func:`normalise_name`) against
  every catalog name and alias: ``"a100"``, ``"NVIDIA A100-PCIE-40GB"``, ``"Tesla_T4"``, ``"gfx950"``...

Short forms point at one device each; where a family has several, the bare name means the flagship
original: ``a100`` -> A100-SXM4-40GB, ``h100`` -> H100-SXM5-80GB, ``v100`` -> V100-SXM2-16GB,
``p100`` -> Tesla-P100-PCIe-16GB. Use the longer aliases (``a100-80gb-pcie``...) for the others.
"""

from __future__ import annotations

import functools
import json
import math
from importlib.resources import files
from pathlib import Path
from typing import Any, Mapping

import yaml

from wattcast.data.checks import DuplicateKeyError, did_you_mean, json_loads_unique, yaml_load_unique
from wattcast.data.device_spec import DeviceSpec, DeviceSpecError, from_dict, normalise_name
from wattcast.data.neusight_device import AMD_LANES_PER_SIMD, from_neusight_json, is_neusight_json

SPEC_SUFFIXES = (".yaml", ".yml", ".json")

__all__ = [
    "find_device",
    "list_devices",
    "load_catalog",
    "load_spec_file",
    "resolve_device",
    "to_neusight_json",
]


# --------------------------------------------------------------------------- catalog
@functools.lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, DeviceSpec], dict[str, str]]:
    """(name -> spec, normalised name/alias -> name); raises on a bad or ambiguous shipped file."""
    folder = files("wattcast.data") / "devices"
    specs: dict[str, DeviceSpec] = {}
    index: dict[str, str] = {}
    entries = sorted((p for p in folder.iterdir() if p.name.endswith(".yaml")), key=lambda p: p.name)
    for entry in entries:
        where = f"catalog file devices/{entry.name}"
        try:
            raw = yaml_load_unique(entry.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise DeviceSpecError(f"{where}: not valid YAML: {e}") from None
        if not isinstance(raw, Mapping):
            raise DeviceSpecError(f"{where}: expected a mapping of spec fields")
        try:
            spec = from_dict(raw)
        except DeviceSpecError as e:
            raise DeviceSpecError(f"{where}: {e}") from None
        if entry.name[: -len(".yaml")] != spec.name:
            raise DeviceSpecError(f"{where}: file name must be the device name {spec.name!r} + '.yaml'")
        if spec.name in specs:
            raise DeviceSpecError(f"{where}: duplicate device name {spec.name!r}")
        specs[spec.name] = spec
        for label in (spec.name, *spec.aliases):
            key = normalise_name(label)
            if not key:
                raise DeviceSpecError(f"{where}: empty alias {label!r}")
            other = index.get(key)
            if other is not None and other != spec.name:
                raise DeviceSpecError(f"{where}: alias {label!r} already names {other!r}")
            index[key] = spec.name
    return specs, index


def load_catalog() -> dict[str, DeviceSpec]:
    """Every shipped device, keyed by canonical name (a fresh dict each call; specs are frozen)."""
    return dict(_catalog()[0])


def list_devices() -> list[DeviceSpec]:
    """Every shipped device, sorted by vendor then name."""
    return sorted(_catalog()[0].values(), key=lambda s: (s.vendor, s.name.lower()))


def find_device(name: str) -> DeviceSpec | None:
    """Catalog lookup by name or alias (case/punctuation-insensitive); ``None`` on a miss."""
    specs, index = _catalog()
    hit = index.get(normalise_name(name))
    return specs[hit] if hit else None


def _closest_hint(name: str, n: int = 5) -> str:
    """The hint " Closest catalog devices: ...", with the ``n`` catalog names closest to ``name`` (best difflib ratio
    over each device's name and aliases; substring hits such as "mi300" in "mi300x" beat edit distance)."""
    _, index = _catalog()
    return did_you_mean(normalise_name(name), index, " Closest catalog devices: {}.", n=n, cutoff=0.0,
                        substring_bonus=0.5, report=index)


# --------------------------------------------------------------------------- files
def load_spec_file(path: str | Path) -> DeviceSpec:
    """Load one device from a YAML or JSON file.

    Own schema (the fields of :class:`DeviceSpec`), or NeuSight's device JSON (recognised by its
    ``Device`` / ``SingleFLOPs`` / ``SingleFLOPsMM`` keys, see :mod:`wattcast.data.neusight_device`).
    Raises :class:`DeviceSpecError` naming the file for a missing file, a parse error, a
    non-mapping document, unknown fields or a failed validation (see :mod:`wattcast.data.device_spec`).
    ``tdp_w`` is optional: without it kernel latency works, but step predictions (which report power and
    energy) and footprints without a given power refuse the spec, asking for ``tdp_w``.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise DeviceSpecError(f"device spec file not found: {p}")
    if not p.is_file():
        raise DeviceSpecError(f"device spec path is not a file: {p}")
    suffix = p.suffix.lower()
    if suffix not in SPEC_SUFFIXES:
        raise DeviceSpecError(f"{p}: device spec files must be {', '.join(SPEC_SUFFIXES)}, got {suffix or 'no suffix'!r}")
    text = p.read_text(encoding="utf-8")
    try:
        raw: Any = json_loads_unique(text) if suffix == ".json" else yaml_load_unique(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        kind = "JSON" if suffix == ".json" else "YAML"
        raise DeviceSpecError(f"{p}: not valid {kind}: {e}") from None
    except DuplicateKeyError as e:
        raise DeviceSpecError(f"{p}: {e}") from None
    if not isinstance(raw, Mapping):
        raise DeviceSpecError(
            f"{p}: a device spec must be a mapping of fields (name, peak_fp32_tflops, ...), "
            f"got {type(raw).__name__}"
        )
    try:
        if is_neusight_json(raw):
            return from_neusight_json(raw, origin=p.name)
        return from_dict(raw)
    except DeviceSpecError as e:
        raise DeviceSpecError(f"{p}: {e}") from None
    except TypeError as e:  # e.g. a field given as a list where a scalar is expected
        raise DeviceSpecError(f"{p}: {e}") from None


# --------------------------------------------------------------------------- resolve
def resolve_device(name_or_path: str | Path | DeviceSpec) -> DeviceSpec:
    """A catalog name/alias, or a path to a spec file -> :class:`DeviceSpec` (see module doc)."""
    if isinstance(name_or_path, DeviceSpec):
        return name_or_path
    if isinstance(name_or_path, Path):
        return load_spec_file(name_or_path)
    text = str(name_or_path).strip()
    if not text:
        raise DeviceSpecError("empty device name; give a catalog name (see `list_devices()`) or a spec file path")
    p = Path(text).expanduser()
    if p.suffix.lower() in SPEC_SUFFIXES and p.is_file():
        return load_spec_file(p)
    spec = find_device(text)
    if spec is not None:
        return spec
    if p.suffix.lower() in SPEC_SUFFIXES:
        raise DeviceSpecError(f"device spec file not found: {p}")
    hint = _closest_hint(text)
    raise DeviceSpecError(
        f"unknown device {text!r}.{hint} "
        "A path to a device spec file (.yaml/.yml/.json, own schema or NeuSight JSON) also works: the README's "
        "'Device specs' lists its fields, and the repository's examples/my_gpu.yaml is one to copy (an RTX 4090, "
        "figures cited)."
    )


# --------------------------------------------------------------------------- export
def _num(x: float) -> float | int:
    return int(x) if math.isfinite(x) and float(x) == int(x) else float(x)


def to_neusight_json(spec: DeviceSpec) -> dict[str, Any]:
    """Export ``spec`` in NeuSight's device JSON format (FP32 figures only; see neusight_device).

    ``SingleFLOPs*`` are GFLOP/s, ``Freq`` the boost clock in MHz. AMD specs give
    ``SingleFLOPsMM`` / ``SingleFLOPsVEC`` and ``Core_Per_SM`` as SIMD units per CU, as NeuSight does.
    """
    cores = spec.cores_per_sm
    if not cores:
        cores = round(spec.peak_fp32_tflops * 1e6 / (2 * spec.num_sms * spec.boost_clock_mhz)) or 1
    out: dict[str, Any] = {
        "Device": spec.name,
        "Dev_Mem": _num(spec.memory_gb),
        "Mem_Bw": _num(spec.memory_bandwidth_gbps),
        "Num_Sm": int(spec.num_sms),
        "Core_Per_SM": int(cores),
        "Freq": _num(spec.boost_clock_mhz),
    }
    if spec.vendor == "amd":
        if cores % AMD_LANES_PER_SIMD == 0:
            out["Core_Per_SM"] = int(cores) // AMD_LANES_PER_SIMD
        mm = spec.peak_fp32_matrix_tflops or spec.peak_fp32_tflops
        out["SingleFLOPsMM"] = _num(round(mm * 1000, 3))
        out["SingleFLOPsVEC"] = _num(round(spec.peak_fp32_tflops * 1000, 3))
    else:
        out["SingleFLOPs"] = _num(round(spec.peak_fp32_tflops * 1000, 3))
    out["L2Cache"] = _num(spec.l2_cache_mb)
    return out
