"""Power logs -> power samples.

- ``nvidia-smi --query-gpu=timestamp,name,index,power.draw,utilization.gpu,... --format=csv[,nounits] -l 1``:
  header names as nvidia-smi prints them (``power.draw [W]``, ``utilization.gpu [%]``, ``clocks.sm [MHz]``...),
  values with or without units (``245.31 W``, ``87 %``). ``timestamp`` and ``power.draw`` are required;
  ``name`` gives the device (else ``--device``). ``[N/A]`` cells become empty.
- DCGM ``dcgmi dmon -e 155,203,204,100,150`` output (whitespace columns ``#Entity ID POWER GPUTL MCUTL SMCLK TMPTR``,
  one line per GPU per sample; field ids: 155 power usage W, 203 GPU util %, 204 memory-copy util %, 100 SM clock
  MHz, 150 GPU temperature C; DCGM field reference, ``dcgm_fields.h``). DCGM prints no
  timestamp: samples are numbered per GPU (``timestamp`` = sample index). The device must be given (--device).

A sample with an impossible value (``power_w`` negative, non-finite or above ``TDP_FACTOR`` x the catalog TDP, else
``MAX_POWER_W``; a utilization outside 0-100 %) is dropped like a sample without power, counted per column in the
notes' ``unmapped_reasons``, with a ``warning`` naming the first one's row, column and value.
"""

from __future__ import annotations

import math
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


#: a sample above this power is not a measurement (a unit mix-up, a corrupt cell): 1.5x the device's TDP when the
#: catalog knows it, else ``MAX_POWER_W``
TDP_FACTOR = 1.5
MAX_POWER_W = 5000.0
#: ``unmapped_reasons`` key of the samples dropped for an impossible value, per column
IMPOSSIBLE = {"power_w": "power_w negative, non-finite or above the device's limit (dropped)",
              "gpu_util_pct": "gpu_util_pct outside 0-100 % (dropped)",
              "mem_util_pct": "mem_util_pct outside 0-100 % (dropped)"}


def _power_cap(device: str) -> tuple[float, str]:
    from wattcast.data.catalog import find_device

    spec = find_device(device) if device else None
    if spec is not None and spec.tdp_w:
        return TDP_FACTOR * float(spec.tdp_w), f"{TDP_FACTOR:g}x the {spec.name} TDP {spec.tdp_w:g} W"
    return MAX_POWER_W, f"{MAX_POWER_W:g} W (device TDP unknown)"


def _drop_impossible(out: pd.DataFrame, where: list[str], p: Path, notes: dict) -> pd.DataFrame:
    """``out`` without the samples holding a physically impossible value (the module drops bad rows, counted): a
    ``power_w`` below 0, non-finite or above ``_power_cap``, a utilization outside [0, 100] or non-finite. Empty
    cells (NaN) are not impossible (they are counted as rows without power). The count goes to the notes'
    ``unmapped_reasons`` and a ``warning`` naming the first offending column, row and value."""
    caps = {d: _power_cap(d) for d in set(out["Device"])}
    cap = out["Device"].map(lambda d: caps[d][0]).astype(float)
    pw = out["power_w"].astype(float)
    checks = [(pw.notna() & ~(np.isfinite(pw) & (pw >= 0) & (pw <= cap)), "power_w")]
    for c in ("gpu_util_pct", "mem_util_pct"):
        if c in out:
            v = out[c].astype(float)
            checks.append((v.notna() & ~(np.isfinite(v) & (v >= 0) & (v <= 100)), c))
    bad = pd.Series(False, index=out.index)
    for m, _ in checks:
        bad |= m
    first = None
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        row = out.iloc[i]
        c = next(c for m, c in checks if m.iloc[i])
        v = float(row[c])
        if c == "power_w":
            why = "is negative" if v < 0 else "is not finite" if not math.isfinite(v) else \
                f"is above {caps[row['Device']][1]}"
            first = f"{where[i]}: column power_w value {v:g} W {why}"
        else:
            first = f"{where[i]}: column {c} value {v:g} % is outside 0-100 %"
    n = int(bad.sum())
    if n:
        reasons = notes.setdefault("unmapped_reasons", {})
        for m, c in checks:
            if m.any():
                reasons[IMPOSSIBLE[c]] = int(m.sum())
        notes["impossible_samples"] = n
        msg = f"{n:,} sample(s) with an impossible value dropped (first: {first})"
        notes["warning"] = f"{notes['warning']}; {msg}" if notes.get("warning") else msg
        out = out[~bad]
        if out["power_w"].notna().sum() == 0:
            raise ProfileImportError(f"{p}: no usable power sample: {first}")
    return out


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
    notes: dict = {}
    if out["power_w"].notna().any():
        out = _drop_impossible(out, [f"data row {i + 1}" for i in range(len(out))], p, notes)
    bad = int(out["power_w"].isna().sum())
    out = out[out["power_w"].notna()].reset_index(drop=True)
    if out.empty:
        raise ProfileImportError(f"{p}: no sample with a numeric power.draw")
    notes = {"file": str(p), "format": "nvidia-smi", "power_rows": len(out), "rows_without_power": bad,
             "device": sorted(set(out["device_name"])), **notes}
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
    numbered = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    lines = [ln for _, ln in numbered]
    head = next((ln for ln in lines if re.match(r"^#?\s*Entity", ln)), None)
    if head is None:
        raise ProfileImportError(f"{p}: no DCGM header ('#Entity ID POWER GPUTL ...')")
    sep = "," if "," in head else None
    cols = [c.strip() for c in head.lstrip("#").split(sep)] if sep else head.lstrip("#").split()
    if sep is None and cols[:2] == ["Entity", "ID"]:
        cols = ["Entity", *cols[2:]]  # '#Entity  ID' is one column holding 'GPU 0'
    if not any(c in _DCGM and _DCGM[c] == "power_w" for c in cols):
        raise ProfileImportError(f"{p}: DCGM log lacks a POWER column (dmon -e 155)")
    rows, bad, where = [], 0, []
    for n, ln in numbered:
        if ln.lstrip().startswith("#") or ln.strip().startswith("ID"):
            continue
        tok = [t.strip() for t in ln.split(",")] if sep else ln.split()
        if sep is None and len(tok) >= 2 and tok[0] == "GPU":
            tok = [f"GPU {tok[1]}", *tok[2:]]
        if len(tok) != len(cols):
            bad += 1
            continue
        rows.append(dict(zip(cols, tok)))
        where.append(f"line {n}")
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
    notes: dict = {}
    if out["power_w"].notna().any():
        out = _drop_impossible(out, where, p, notes)
    n0 = len(out)
    out = out[out["power_w"].notna()].reset_index(drop=True)
    if out.empty:
        raise ProfileImportError(f"{p}: no DCGM sample with a numeric POWER value")
    return out, {"file": str(p), "format": "dcgm", "power_rows": len(out), "rows_without_power": n0 - len(out) + bad,
                 "device": [device], **notes}


def sniff(text: str) -> str | None:
    if looks_like_smi(text):
        return "nvidia-smi"
    if re.search(r"^#?\s*Entity", text, re.M):
        return "dcgm"
    return None
