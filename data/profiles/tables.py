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
- ``device.json`` (``profile run`` only): the measured GPU's spec.
- ``profile.json``: what was imported from where (``PROFILE_MARKER``), per-file row counts and unmapped reasons, and
  the files the import / run wrote (``written``): ``--overwrite`` replaces or removes only those, never a user's own.
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

    def write(self, folder: str | Path, *, extra: dict[str, str] | None = None) -> dict[str, Path]:
        """Write every non-empty table, the ``extra`` files (name -> text, e.g. ``profile run``'s ``device.json``) and
        ``profile.json``, which records the files written (``"written"``); returns the files written.

        A file the folder's earlier ``profile.json`` records as written by wattcast and that this profile does not
        write again is removed (a stale table would contradict the new ``profile.json``). No other file is touched:
        call :func:`check_output_folder` first, which refuses a folder holding tables no record accounts for."""
        d = Path(folder)
        d.mkdir(parents=True, exist_ok=True)
        previous = recorded_files(d) or set()
        written = {}
        for kind, name in TABLE_FILES.items():
            t = self.table(kind)
            if len(t):
                tmp = d / (name + ".tmp")
                t.to_csv(tmp, index=False)
                tmp.replace(d / name)
                written[kind] = d / name
        for name, text in (extra or {}).items():
            (d / name).write_text(text, encoding="utf-8")
            written[name] = d / name
        names = sorted(p.name for p in written.values())
        for name in sorted(previous - set(names)):
            if (d / name).is_file():
                (d / name).unlink()  # written by the earlier import / run (its profile.json says so), now stale
        meta = {"schema_version": SCHEMA_VERSION, "tool": "wattcast", "files": self.files,
                "rows": {k: int(len(self.table(k))) for k in TABLE_FILES}, "written": names}
        (d / PROFILE_MARKER).write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
        written["profile"] = d / PROFILE_MARKER
        return written


#: ``profile run``'s description of the measured GPU, written next to the tables
DEVICE_FILE = "device.json"
#: every file a profile import or run may write besides ``profile.json``
PROFILE_FILES = (*TABLE_FILES.values(), DEVICE_FILE)


def recorded_files(folder: str | Path) -> set[str] | None:
    """The names of the files an earlier ``profile import`` / ``profile run`` wrote into ``folder``, from its
    ``profile.json``: the ``"written"`` list, or for a ``profile.json`` older than that list, the tables with rows
    (``"rows"``; that version wrote exactly those) plus ``device.json`` when a ``profile run`` (``format``
    ``collector``) wrote it. None when the folder has no readable wattcast ``profile.json``."""
    p = Path(folder) / PROFILE_MARKER
    if not p.is_file():
        return None
    try:
        meta = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("tool") != "wattcast":
        return None
    if isinstance(meta.get("written"), list):
        return {str(n) for n in meta["written"] if str(n) in PROFILE_FILES}
    rows = meta.get("rows") if isinstance(meta.get("rows"), dict) else {}
    out = {TABLE_FILES[k] for k, n in rows.items() if k in TABLE_FILES and isinstance(n, (int, float)) and n > 0}
    if any(isinstance(f, dict) and f.get("format") == "collector" for f in meta.get("files") or []):
        out.add(DEVICE_FILE)
    return out


def owned_files(folder: str | Path, names=(*TABLE_FILES.values(), PROFILE_MARKER)) -> list[Path]:
    """The files of ``folder`` among ``names`` (default: its tables and ``profile.json``) that exist."""
    d = Path(folder)
    return [d / n for n in names if (d / n).exists()]


def check_output_folder(folder: str | Path, *, overwrite: bool, writes=()) -> None:
    """Refuse (ProfileImportError, naming the files) an ``--output`` folder a profile import / run would change
    unsaid: without ``overwrite`` one that holds tables, ``profile.json`` or a file of ``writes`` (e.g.
    ``device.json``); with ``overwrite`` one holding such a file that no earlier wattcast import / run wrote (its
    ``profile.json`` does not record it, or there is no ``profile.json``): a user's own table is never replaced or
    deleted."""
    d = Path(folder)
    if not d.is_dir():
        return
    names = tuple(dict.fromkeys((*TABLE_FILES.values(), *writes, PROFILE_MARKER)))
    existing = owned_files(d, names)
    if not existing:
        return
    listed = ", ".join(p.name for p in existing)
    if not overwrite:
        raise ProfileImportError(f"--output {d} already holds {listed}; pass --overwrite to replace them (only files "
                                 "an earlier `wattcast profile import` / `profile run` wrote, as its profile.json "
                                 "records), or give another folder")
    record = recorded_files(d)
    if record is None and (d / PROFILE_MARKER).exists():
        raise ProfileImportError(f"--output {d}: its {PROFILE_MARKER} is not one wattcast wrote (unreadable, or no "
                                 "'tool': 'wattcast'), so nothing says which of its files an import wrote; refusing "
                                 f"to replace {listed} even with --overwrite: move them away or give another folder")
    foreign = [p.name for p in existing if p.name != PROFILE_MARKER and p.name not in (record or set())]
    if foreign:
        why = (f"its {PROFILE_MARKER} records only {', '.join(sorted(record)) or 'no file'}" if record is not None
               else f"there is no {PROFILE_MARKER} recording what an import wrote")
        raise ProfileImportError(f"--output {d} holds {', '.join(foreign)} that no earlier `wattcast profile import` / "
                                 f"`profile run` wrote ({why}); refusing to replace or delete "
                                 f"{'it' if len(foreign) == 1 else 'them'} even with --overwrite: move "
                                 f"{'it' if len(foreign) == 1 else 'them'} away or give another folder")


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
        df = pd.read_csv(p, keep_default_na=True, skip_blank_lines=False)  # the index keeps each row's line
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
        raise ProfileImportError(f"{p}: not a readable CSV ({e})") from None
    missing = [c for c in TABLE_COLUMNS[kind] if c not in df.columns]
    if missing:
        raise ProfileImportError(f"{p}: missing column(s) {', '.join(map(repr, missing))}")
    return without_blank_rows(df)
