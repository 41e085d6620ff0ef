"""Nsight Systems SQLite exports (``nsys export --type sqlite``) -> kernel and collective rows.

Tables read (nsys' documented export schema, "Exporter Data Model" in the Nsight Systems user guide):
``CUPTI_ACTIVITY_KIND_KERNEL`` (start, end [ns], deviceId, correlationId, globalPid, shortName/demangledName ->
``StringIds.id``), ``StringIds`` (id, value), ``NVTX_EVENTS`` (start, end, text or textId, globalTid; push/pop
and start/end ranges), ``CUPTI_ACTIVITY_KIND_RUNTIME`` (start, end, correlationId, globalTid: the launch), and
``TARGET_INFO_GPU`` (id, name) when present. nsys records no tensor shapes: a kernel's op comes from the
innermost NVTX range around its launch only when that range is named in wattcast's own kernel syntax
``OP[dtype] key=value ...`` (e.g. ``bmm[fp16] B=8 M=512 N=64 K=512``, as ``wattcast profile run`` and
``torch.cuda.nvtx.range`` users can emit); other kernels are kept as rows with ``OPName`` '' (counted).
NCCL kernels become collective rows (op from the kernel name; size from an NVTX range ``nccl:OP bytes=N
group=G`` when present).
"""

from __future__ import annotations

import bisect
import re
import sqlite3
from collections import defaultdict
from pathlib import Path

import pandas as pd

from wattcast.data.collective_ops import canonical_op
from wattcast.data.kernel_ops import OP_FAMILY, SHAPE_COLS, canonical_dtype
from wattcast.data.profiles.busy import busy_summary
from wattcast.data.profiles.devices import device_labels, override_warning
from wattcast.data.profiles.row_checks import INVALID_TIME, kernel_row_problems, shown, unmap_invalid
from wattcast.data.profiles.tables import ProfileImportError

_RANGE = re.compile(r"^\s*([A-Za-z_0-9]+)(?:\[([A-Za-z0-9_]+)\])?((?:\s+[A-Za-z_]+=\d+)*)\s*$")
_NCCL_RANGE = re.compile(r"^\s*nccl:([A-Za-z_]+)((?:\s+[A-Za-z_]+=\d+)*)\s*$")
_KV = re.compile(r"([A-Za-z_]+)=(\d+)")
_NCCL_OP = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", re.I)
REQUIRED = ("CUPTI_ACTIVITY_KIND_KERNEL", "StringIds")


def parse_range(text: str) -> tuple[str, dict, str] | None:
    """``'bmm[fp16] B=8 M=512 N=64 K=512'`` -> ('bmm', {...}, 'fp16'); None when not in that syntax."""
    m = _RANGE.match(str(text or ""))
    if not m:
        return None
    op = m.group(1).lower()
    if op not in OP_FAMILY:
        return None
    shape = {k: int(v) for k, v in _KV.findall(m.group(3) or "") if k in SHAPE_COLS}
    return op, shape, canonical_dtype(m.group(2) or "fp32")


def _tables(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")}


def _cols(con, table: str) -> set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def _busy(ks: pd.DataFrame) -> dict:
    """The busy figures of the kernels with a valid interval (end after start; a broken record adds no time)."""
    ok = ks[ks["end"] > ks["start"]]
    return busy_summary(ok["start"] / 1e3, (ok["end"] - ok["start"]) / 1e3, ok["deviceId"],
                        ok["name"].str.lower().str.contains("nccl"))


def import_nsys(path: str | Path, device: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    p = Path(path)
    try:
        con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        tables = _tables(con)
    except sqlite3.DatabaseError as e:
        raise ProfileImportError(f"{p}: not an SQLite database ({e})") from None
    try:
        missing = [t for t in REQUIRED if t not in tables]
        if missing:
            raise ProfileImportError(f"{p}: not an Nsight Systems export with GPU kernels: missing table(s) "
                                     f"{', '.join(missing)} (export with `nsys export --type sqlite` from a run "
                                     "with CUDA tracing)")
        kc = _cols(con, "CUPTI_ACTIVITY_KIND_KERNEL")
        need = [c for c in ("start", "end", "deviceId", "correlationId") if c not in kc]
        name_col = "demangledName" if "demangledName" in kc else "shortName" if "shortName" in kc else None
        if need or name_col is None:
            raise ProfileImportError(f"{p}: CUPTI_ACTIVITY_KIND_KERNEL lacks column(s) "
                                     f"{', '.join(need + ([] if name_col else ['shortName/demangledName']))}")
        strings = dict(con.execute("SELECT id, value FROM StringIds"))
        ks = pd.read_sql_query(f"SELECT start, end, deviceId, correlationId, {name_col} AS name_id FROM CUPTI_ACTIVITY_KIND_KERNEL", con)
        ks["name"] = ks["name_id"].map(strings).fillna("")
        gpu_names: dict[int, str] = {}
        if "TARGET_INFO_GPU" in tables and {"id", "name"} <= _cols(con, "TARGET_INFO_GPU"):
            gpu_names = {int(i): str(n) for i, n in con.execute("SELECT id, name FROM TARGET_INFO_GPU")}
        launches = pd.DataFrame()
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables and {"start", "correlationId", "globalTid"} <= _cols(con, "CUPTI_ACTIVITY_KIND_RUNTIME"):
            launches = pd.read_sql_query("SELECT correlationId, start AS launch, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME", con)
        ranges = pd.DataFrame()
        if "NVTX_EVENTS" in tables:
            nc = _cols(con, "NVTX_EVENTS")
            text = "COALESCE(text, '')" if "text" in nc else "''"
            tid = "textId" if "textId" in nc else "NULL"
            gt = "globalTid" if "globalTid" in nc else "0"
            ranges = pd.read_sql_query(f"SELECT start, end, {text} AS text, {tid} AS text_id, {gt} AS globalTid "
                                       "FROM NVTX_EVENTS WHERE end IS NOT NULL", con)
            ranges["text"] = [t if t else strings.get(i, "") if i == i and i is not None else ""
                              for t, i in zip(ranges["text"], ranges["text_id"])]
    except sqlite3.DatabaseError as e:
        raise ProfileImportError(f"{p}: cannot read the Nsight Systems export ({e})") from None
    finally:
        con.close()
    if ks.empty:
        raise ProfileImportError(f"{p}: the export holds no GPU kernels (CUPTI_ACTIVITY_KIND_KERNEL is empty)")
    if device is None and not gpu_names:
        raise ProfileImportError(f"{p}: the export records no GPU name (no TARGET_INFO_GPU table); give the device (--device)")

    # launch time and thread of each kernel (a kernel without a runtime record keeps its own start time)
    if len(launches):
        ks = ks.merge(launches, on="correlationId", how="left")
    else:
        ks["launch"], ks["globalTid"] = float("nan"), float("nan")
    by_tid: dict = defaultdict(list)
    for r in ranges.itertuples(index=False):
        by_tid[r.globalTid].append((r.start, r.end, r.text))
    index = {}
    for t, rs in by_tid.items():
        rs.sort(key=lambda x: (x[0], -x[1]))
        index[t] = ([x[0] for x in rs], rs)

    def innermost(tid, t):
        if tid not in index or t != t:
            return None
        starts, rs = index[tid]
        i = bisect.bisect_right(starts, t) - 1
        best = None
        while i >= 0:  # ranges nest per thread: the latest-starting range still open at t is the innermost
            if rs[i][1] >= t:
                best = (rs[i][0], rs[i][2])
                break
            i -= 1
        return best

    krows, crows = [], []
    calls: dict = {}
    unmapped: dict[str, int] = defaultdict(int)
    source = f"nsys:{p.name}"
    ks["row"] = range(1, len(ks) + 1)  # the kernel's row in CUPTI_ACTIVITY_KIND_KERNEL (read order), for messages
    for k in ks.itertuples(index=False):
        dname, dcat = device_labels(gpu_names.get(int(k.deviceId), ""), device)
        base = {"device_name": dname, "Device": dcat, "source": source}
        hit = innermost(k.globalTid, k.launch)
        text = hit[1] if hit else None
        if "nccl" in k.name.lower():
            m = _NCCL_OP.search(k.name)
            row = {**base, "time_us": (k.end - k.start) / 1000.0, "op": "", "size_B": float("nan"), "reason": ""}
            try:
                row["op"] = canonical_op(m.group(1)) if m else ""
            except ValueError:
                pass
            rm = _NCCL_RANGE.match(text or "")
            if rm:
                kv = dict(_KV.findall(rm.group(2) or ""))
                row["size_B"] = float(kv.get("bytes", "nan"))
                if "group" in kv:
                    row["world_size"] = int(kv["group"])
            if row["size_B"] != row["size_B"]:
                row["reason"] = "no 'nccl:OP bytes=N' NVTX range around the NCCL kernel: message size unknown"
            if not k.end > k.start:  # a broken record: never a training row
                row["reason"] = f"{INVALID_TIME}: the NCCL kernel ends at or before its start (kernel row {k.row})"
            crows.append(row)
            continue
        row = {**base, "latency_ms": (k.end - k.start) / 1e6, "n_kernels": 1, "kernel": k.name[:200], "aten_op": "",
               "_where": f"kernel row {k.row} (correlationId {k.correlationId}"
                         + (f", NVTX range {text!r})" if text else ")"),
               "_min_ns": k.end - k.start}
        parsed = parse_range(text) if text else None
        if parsed is None:
            why = ("kernel launched outside any NVTX range" if not text
                   else "NVTX range is not in wattcast's 'OP[dtype] B=.. M=..' syntax: shape unknown")
            row.update(OPName="", reason=why)
            unmapped[why] += 1
        else:
            op, shape, dtype = parsed
            row.update(OPName=op, dtype=dtype, reason="", **shape)
            key = (k.globalTid, hit[0])
            if key in calls:  # one row per NVTX-tagged op call: its kernels are summed, like the Kineto importer
                prev = calls[key]
                prev["latency_ms"] += row["latency_ms"]
                prev["n_kernels"] += 1
                prev["_min_ns"] = min(prev["_min_ns"], row["_min_ns"])
                continue
            calls[key] = row
        krows.append(row)
    kdf = pd.DataFrame(krows)
    cdf = pd.DataFrame(crows)
    invalid = []
    if len(kdf):  # the checks a user kernel CSV passes (row_checks); nsys times in ns: a kernel ending at or before
        # its start is a broken record, never 0 by resolution
        problems = kernel_row_problems(kdf, zero_time_ok=False)
        split = (kdf["OPName"] != "") & (problems == "") & (kdf["_min_ns"] <= 0)
        problems[split] = f"{INVALID_TIME}: a kernel of the call ends at or before its start"
        kdf = unmap_invalid(kdf, problems)
        for why in problems[problems != ""]:
            unmapped[why.split(": ", 1)[0]] += 1
        invalid = [f"{w}: {why}" for w, why in zip(kdf.loc[problems != "", "_where"], problems[problems != ""])]
        kdf = kdf.drop(columns=["_where", "_min_ns"])
    mapped = int((kdf["OPName"] != "").sum()) if len(kdf) else 0
    notes = {"file": str(p), "format": "nsys-sqlite", "device": sorted(set(gpu_names.values())) if device is None else [device],
             "kernels": len(ks), "kernel_rows": len(kdf), "mapped_rows": mapped, "unmapped_rows": len(kdf) - mapped,
             "collective_rows": len(cdf), "unmapped_reasons": dict(unmapped),
             "busy": _busy(ks)}
    if invalid:
        notes["invalid_rows"] = len(invalid)
        notes["warning"] = (f"{p}: {len(invalid):,} kernel row(s) kept unmapped as invalid (not trained or validated "
                            f"on): {shown(invalid)}")
    relabel = override_warning(gpu_names.values(), device)
    if relabel:
        notes["device_override"] = {"device": device, "recorded": sorted(set(gpu_names.values()))}
        notes["warning"] = "; ".join(filter(None, [notes.get("warning"), relabel]))
    return kdf, cdf, notes
