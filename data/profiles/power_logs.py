"""Power logs -> power samples.

- ``nvidia-smi --query-gpu=timestamp,name,index,power.draw,utilization.gpu,... --format=csv[,nounits] -l 1``:
  header names as nvidia-smi prints them (``power.draw [W]``, ``utilization.gpu [%]``, ``clocks.sm [MHz]``...),
  values with or without units (``245.31 W``, ``87 %``). ``timestamp`` and ``power.draw`` are required;
  ``name`` gives the device (else ``--device``). ``[N/A]`` cells become empty.
- DCGM ``dcgmi dmon -e 155,203,204,100,150`` output (whitespace columns ``#Entity ID POWER GPUTL MCUTL SMCLK TMPTR``,
  one line per GPU per sample; field ids: 155 power usage W, 203 GPU util %, 204 memory-copy util %, 100 SM clock
  MHz, 150 GPU temperature C; DCGM field reference, ``dcgm_fields.h``). DCGM prints no
  timestamp: samples are numbered per GPU (``timestamp`` = sample index). The device must be given (--device).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.profiles.devices import catalog_name
from wattcast.data.profiles.tables import ProfileImportError

_SMI = {"timestamp": "timestamp", "name": "device_name", "index": "gpu_index", "power.draw": "power_w",
        "power.draw.instant": "power_w", "power.draw.average": "power_w", "utilization.gpu": "gpu_util_pct",
        "utilization.memory": "mem_util_pct", "clocks.sm": "sm_clock_mhz", "clocks.current.sm": "sm_clock_mhz",
        "temperature.gpu": "temperature_c", "power.limit": "power_limit_w", "enforced.power.limit": "power_limit_w"}
#: when a CSV has several source columns of one target, the one used (first in this order; an exact duplicate
#: header: its first occurrence); the others are ignored and listed in the notes (``ignored_columns``):
#: ``power.draw`` is what nvidia-smi documents and most logs query (on Ampere+ it is the 1 s average, the same as
#: ``power.draw.average``), then ``power.draw.average`` (smoothed, like DCGM's field 155), then the instantaneous
#: ``power.draw.instant``; ``enforced.power.limit`` (the cap the GPU actually runs under) before the software
#: ``power.limit``; ``clocks.sm`` before its alias ``clocks.current.sm``.
_SMI_PREFERENCE = ("power.draw", "power.draw.average", "power.draw.instant", "enforced.power.limit", "power.limit",
                   "clocks.sm", "clocks.current.sm")
_DCGM = {"POWER": "power_w", "PWR": "power_w", "GPUTL": "gpu_util_pct", "MCUTL": "mem_util_pct", "SMCLK": "sm_clock_mhz",
         "TMPTR": "temperature_c", "TOTEC": "energy_j"}  # TOTEC: field 156, total energy since boot in mJ


def looks_like_smi(text: str) -> bool:
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    return "power.draw" in first and "," in first


def _strip_units(col: pd.Series) -> pd.Series:
    s = col.astype(str).str.strip().str.replace(r"\s*(W|%|MHz|C|mJ|J)$", "", regex=True)
    return pd.to_numeric(s.where(~s.str.contains(r"N/A|Not Supported", regex=True)), errors="coerce")


def import_nvidia_smi(path: str | Path, device: str | None = None) -> tuple[pd.DataFrame, dict]:
    p = Path(path)
    try:
        raw = pd.read_csv(p, skipinitialspace=True, dtype=str)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
        raise ProfileImportError(f"{p}: not a readable nvidia-smi CSV ({e})") from None
    # the nvidia-smi field of each column that wattcast reads (unit suffix off; pandas marks duplicates '.1')
    known = {pos: key for pos, c in enumerate(raw.columns)
             if (key := re.sub(r"\s*\[.*\]\s*$", "", re.sub(r"\.\d+$", "", str(c).strip()))) in _SMI}
    chosen: dict[str, tuple[int, int]] = {}  # target -> (preference rank, column position)
    for pos, key in known.items():
        rank = (_SMI_PREFERENCE.index(key) if key in _SMI_PREFERENCE else 0, pos)
        if _SMI[key] not in chosen or rank < chosen[_SMI[key]]:
            chosen[_SMI[key]] = rank
    df = pd.DataFrame({t: raw.iloc[:, pos] for t, (_, pos) in chosen.items()}, index=raw.index)
    used = {pos for _, pos in chosen.values()}
    ignored = [str(raw.columns[pos]) for pos in known if pos not in used]
    missing = [c for c, m in (("timestamp", "timestamp"), ("power.draw", "power_w")) if m not in df.columns]
    if missing:
        raise ProfileImportError(f"{p}: nvidia-smi CSV lacks column(s) {', '.join(missing)} "
                                 "(log with --query-gpu=timestamp,name,index,power.draw,utilization.gpu --format=csv)")
    if "device_name" not in df and device is None:
        raise ProfileImportError(f"{p}: no 'name' column: give the device (--device) or add name to --query-gpu")
    out = pd.DataFrame({"timestamp": df["timestamp"].astype(str).str.strip()})
    for c in ("gpu_index", "power_w", "gpu_util_pct", "mem_util_pct", "sm_clock_mhz", "temperature_c", "power_limit_w", "energy_j"):
        out[c] = _strip_units(df[c]) if c in df else np.nan
    names = df["device_name"].astype(str).str.strip() if device is None else pd.Series([device] * len(df))
    out["device_name"] = names.to_numpy()
    out["Device"] = [catalog_name(n) for n in out["device_name"]]
    out["source"] = f"nvidia-smi:{p.name}"
    bad = int(out["power_w"].isna().sum())
    out = out[out["power_w"].notna()].reset_index(drop=True)
    if out.empty:
        raise ProfileImportError(f"{p}: no sample with a numeric power.draw")
    notes = {"file": str(p), "format": "nvidia-smi", "power_rows": len(out), "rows_without_power": bad,
             "device": sorted(set(out["device_name"]))}
    if ignored:
        notes["ignored_columns"] = ignored
    return out, notes


def import_dcgm(path: str | Path, device: str | None = None) -> tuple[pd.DataFrame, dict]:
    p = Path(path)
    if device is None:
        raise ProfileImportError(f"{p}: DCGM dmon logs do not name the GPU model; give the device (--device)")
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ProfileImportError(f"{p}: cannot read ({e.strerror or e})") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    head = next((ln for ln in lines if re.match(r"^#?\s*Entity", ln)), None)
    if head is None:
        raise ProfileImportError(f"{p}: no DCGM header ('#Entity ID POWER GPUTL ...')")
    sep = "," if "," in head else None
    cols = [c.strip() for c in head.lstrip("#").split(sep)] if sep else head.lstrip("#").split()
    if sep is None and cols[:2] == ["Entity", "ID"]:
        cols = ["Entity", *cols[2:]]  # '#Entity  ID' is one column holding 'GPU 0'
    if not any(c in _DCGM and _DCGM[c] == "power_w" for c in cols):
        raise ProfileImportError(f"{p}: DCGM log lacks a POWER column (dmon -e 155)")
    rows, bad = [], 0
    for ln in lines:
        if ln.lstrip().startswith("#") or ln.strip().startswith("ID"):
            continue
        tok = [t.strip() for t in ln.split(",")] if sep else ln.split()
        if sep is None and len(tok) >= 2 and tok[0] == "GPU":
            tok = [f"GPU {tok[1]}", *tok[2:]]
        if len(tok) != len(cols):
            bad += 1
            continue
        rows.append(dict(zip(cols, tok)))
    if not rows:
        raise ProfileImportError(f"{p}: the DCGM log has no sample lines")
    df = pd.DataFrame(rows)
    out = pd.DataFrame({"gpu_index": pd.to_numeric(df[cols[0]].str.extract(r"(\d+)")[0], errors="coerce")})
    for c in cols[1:]:
        if c in _DCGM:
            out[_DCGM[c]] = _strip_units(df[c])
    if "energy_j" in out:
        out["energy_j"] = out["energy_j"] / 1000.0  # mJ -> J
    out["timestamp"] = out.groupby("gpu_index").cumcount()
    out["device_name"] = device
    out["Device"] = catalog_name(device)
    out["source"] = f"dcgm:{p.name}"
    n0 = len(out)
    out = out[out["power_w"].notna()].reset_index(drop=True)
    if out.empty:
        raise ProfileImportError(f"{p}: no DCGM sample with a numeric POWER value")
    return out, {"file": str(p), "format": "dcgm", "power_rows": len(out), "rows_without_power": n0 - len(out) + bad,
                 "device": [device]}


def sniff(text: str) -> str | None:
    if looks_like_smi(text):
        return "nvidia-smi"
    if re.search(r"^#?\s*Entity", text, re.M):
        return "dcgm"
    return None
