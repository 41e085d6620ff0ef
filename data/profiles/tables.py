"""The measurement tables every profile importer (and the collector) writes, and their folder layout.

A profile folder (``wattcast profile import ... --output DIR`` / ``wattcast profile run --output DIR``) holds:

- ``kernels.csv``: one row per operator call measured on the GPU (the kernels it launched, summed), columns
  ``KERNEL_COLUMNS``. ``OPName`` is wattcast's op (``bmm``, ``linear``, ``add``, ``mulu``, ``softmax``, ``ln``, ...,
  see ``wattcast.data.kernel_ops``) with NeuSight's shape columns, or ``''`` when the row could not be mapped
  (``reason`` says why; such rows are kept and counted, never dropped). ``latency_ms`` is the measured GPU time.
- ``collectives.csv``: one row per collective call or nccl-tests size, ``COLLECTIVE_COLUMNS`` (``size_B`` as
  nccl-tests counts it: per-rank buffer for all_reduce/broadcast/send_recv, total buffer for all_gather,
  reduce_scatter and all_to_all).
- ``power.csv``: power samples, ``POWER_COLUMNS``.
- ``profile.json``: what was imported from where (``PROFILE_MARKER``), per-file row counts and unmapped reasons.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.checks import without_blank_rows

KERNEL_COLUMNS = ("OPName", "B", "M", "N", "K", "H", "dtype", "latency_ms", "Device", "device_name", "aten_op",
                  "kernel", "n_kernels", "reason", "source")
COLLECTIVE_COLUMNS = ("op", "size_B", "dtype", "world_size", "nodes", "gpus_per_node", "time_us", "algbw_GBs",
                      "busbw_GBs", "ip_time_us", "Device", "device_name", "reason", "source")
POWER_COLUMNS = ("timestamp", "Device", "device_name", "gpu_index", "power_w", "gpu_util_pct", "mem_util_pct",
                 "sm_clock_mhz", "temperature_c", "power_limit_w", "energy_j", "source")

_INT_COLUMNS = {"kernels": ("B", "M", "N", "K", "H", "n_kernels"), "collectives": ("world_size", "nodes", "gpus_per_node")}
TABLE_FILES = {"kernels": "kernels.csv", "collectives": "collectives.csv", "power": "power.csv"}
TABLE_COLUMNS = {"kernels": KERNEL_COLUMNS, "collectives": COLLECTIVE_COLUMNS, "power": POWER_COLUMNS}
PROFILE_MARKER = "profile.json"
SCHEMA_VERSION = 1


class ProfileImportError(ValueError):
    """A profiling file that cannot be read or mapped; the message names the file and what is missing."""


class NoTraceDeviceError(ProfileImportError):
    """A trace that records no GPU (no ``deviceProperties``) imported without a device: the message names the option
    that gives it, ``flag`` (``profile import``'s ``--device``; :meth:`naming` says another command's, e.g.
    ``validate trace``'s ``--trace-device``)."""

    def __init__(self, path, flag: str = "--device"):
        self.path, self.flag = path, flag
        super().__init__(f"{path}: the trace records no GPU (no 'deviceProperties'); give the device ({flag})")

    def naming(self, flag: str) -> "NoTraceDeviceError":
        """The same error, naming ``flag`` as the option that gives the device."""
        return NoTraceDeviceError(self.path, flag)


def empty(kind: str) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in TABLE_COLUMNS[kind]})


def conform(frame: pd.DataFrame, kind: str) -> pd.DataFrame:
    """``frame`` with exactly the table's columns in order (missing ones empty)."""
    out = frame.copy()
    for c in TABLE_COLUMNS[kind]:
        if c not in out:
            out[c] = np.nan if c not in ("OPName", "reason", "source", "Device", "device_name", "aten_op", "kernel", "dtype", "op") else ""
    for c in _INT_COLUMNS.get(kind, ()):
        out[c] = pd.to_numeric(out[c], errors="coerce").round().astype("Int64")
    return out[list(TABLE_COLUMNS[kind])]


class Profile:
    """The three tables of one import (or collector run) plus per-file notes."""

    def __init__(self) -> None:
        self.frames: dict[str, list[pd.DataFrame]] = {k: [] for k in TABLE_FILES}
        self.files: list[dict] = []

    def add(self, kind: str, frame: pd.DataFrame) -> None:
        if len(frame):
            self.frames[kind].append(conform(frame, kind))

    def table(self, kind: str) -> pd.DataFrame:
        fr = self.frames[kind]
        return pd.concat(fr, ignore_index=True) if fr else empty(kind)

    def write(self, folder: str | Path, *, remove_stale: bool = False) -> dict[str, Path]:
        """Write every non-empty table and ``profile.json``; returns the files written. A table this profile has no
        row of is removed from a folder an earlier profile wrote, or with ``remove_stale`` (``profile import
        --overwrite``): a stale one would contradict ``profile.json``. No other file is touched."""
        d = Path(folder)
        d.mkdir(parents=True, exist_ok=True)
        written = {}
        for kind, name in TABLE_FILES.items():
            t = self.table(kind)
            if len(t):
                tmp = d / (name + ".tmp")
                t.to_csv(tmp, index=False)
                tmp.replace(d / name)
                written[kind] = d / name
            elif (d / name).is_file() and (remove_stale or (d / PROFILE_MARKER).is_file()):
                (d / name).unlink()  # a folder an earlier profile wrote, or the caller's --overwrite: else it stays
        meta = {"schema_version": SCHEMA_VERSION, "tool": "wattcast", "files": self.files,
                "rows": {k: int(len(self.table(k))) for k in TABLE_FILES}}
        (d / PROFILE_MARKER).write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
        written["profile"] = d / PROFILE_MARKER
        return written


def owned_files(folder: str | Path) -> list[Path]:
    """The files of ``folder`` a profile write would replace or remove (its tables and ``profile.json``)."""
    d = Path(folder)
    return [d / n for n in (*TABLE_FILES.values(), PROFILE_MARKER) if (d / n).exists()]


def is_profile_dir(path: str | Path) -> bool:
    """A folder written by ``wattcast profile import`` / ``profile run`` (it holds ``profile.json``)."""
    p = Path(path)
    return p.is_dir() and (p / PROFILE_MARKER).is_file()


def read_table(folder: str | Path, kind: str) -> pd.DataFrame:
    """One table of a profile folder (empty with the right columns when the folder has none of that kind).

    Raises ProfileImportError naming the file when it is unreadable or lacks a column."""
    p = Path(folder) / TABLE_FILES[kind]
    if not p.is_file():
        return empty(kind)
    try:
        df = pd.read_csv(p, keep_default_na=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
        raise ProfileImportError(f"{p}: not a readable CSV ({e})") from None
    missing = [c for c in TABLE_COLUMNS[kind] if c not in df.columns]
    if missing:
        raise ProfileImportError(f"{p}: missing column(s) {', '.join(map(repr, missing))}")
    return without_blank_rows(df)
