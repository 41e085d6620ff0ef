"""nccl-tests stdout (``all_reduce_perf -b 8 -e 1G -f 2 ...``) -> collective rows.

The result table (NVIDIA/nccl-tests, ``src/common.cu``; columns read from its header line, so versions with
and without ``redop``/``root`` columns both parse)::

    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
             8             2     float     sum      -1    10.53    0.00    0.00      0    10.33    0.00    0.00      0

The first ``time algbw busbw`` group is out-of-place, the second in-place (``N/A`` allowed). The collective comes
from the ``# Collective test starting: all_reduce_perf`` line, else the file name (``all_gather_perf.log``),
else ``collective=``; ranks, hosts and GPU name from the ``#  Rank  0 Group  0 Pid ... on HOST device 0 [..]
NAME`` lines (de-duplicated by rank number). A log holding several runs (``>> log`` in a loop) is read run by run:
each run, from its ``# Collective test starting`` / ``# nThread`` header on, has its own collective, ranks and table.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

import pandas as pd

from wattcast.data.collective_ops import busbw_factor, canonical_op
from wattcast.data.profiles.devices import catalog_name
from wattcast.data.profiles.tables import ProfileImportError

_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$")
_TEST = re.compile(r"Collective test starting:\s*(\S+)")
_NTHREAD = re.compile(r"^#\s*nThread\b")
_HEADER = re.compile(r"^#\s+size\s+count\s+type")
_DTYPES = {"float": "fp32", "half": "fp16", "bfloat16": "bf16", "double": "fp64", "int8": "int8", "uint8": "uint8",
           "int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}


_FOOTER = re.compile(r"^#\s*Avg bus bandwidth")
#: a row whose printed bandwidths disagree with its size / time beyond this fraction (or the print resolution,
#: 0.01 GB/s, x 1.5) is flagged: nccl-tests computes algbw = size / time and busbw = algbw x factor(op, n)
BW_TOLERANCE = 0.10
_BW_RESOLUTION_GBS = 0.015


def bandwidth_mismatch(op: str, size_B: float, time_us: float, algbw_GBs: float, busbw_GBs: float, ranks) -> str:
    """'' when the row's algbw = size / time and busbw = algbw x ``busbw_factor(op, ranks)`` (within
    ``BW_TOLERANCE``), else the reason naming the figures. A missing bandwidth (N/A) or rank count skips its check."""
    alg = size_B / time_us / 1e3  # B/us -> GB/s
    why = []
    if math.isfinite(algbw_GBs) and abs(algbw_GBs - alg) > max(BW_TOLERANCE * alg, _BW_RESOLUTION_GBS):
        why.append(f"algbw {algbw_GBs:g} GB/s but size / time = {alg:.4g}")
    if math.isfinite(busbw_GBs) and ranks == ranks and ranks and ranks > 0:
        bus = (algbw_GBs if math.isfinite(algbw_GBs) else alg) * busbw_factor(op, int(ranks))
        if abs(busbw_GBs - bus) > max(BW_TOLERANCE * bus, _BW_RESOLUTION_GBS):
            why.append(f"busbw {busbw_GBs:g} GB/s but algbw x {busbw_factor(op, int(ranks)):.3g} ({op}, {int(ranks)} ranks) = {bus:.4g}")
    if not why:
        return ""
    return (f"time, size and bandwidth disagree ({size_B:.0f} B in {time_us:g} us: {'; '.join(why)}): "
            "a corrupted or hand-edited row")


def looks_like_nccl_tests(text: str) -> bool:
    return bool(re.search(r"^#\s+size\s+count\s+type", text, re.M)) or "nccl-tests" in text[:2000] or "Avg bus bandwidth" in text


def _num(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return math.nan


def _runs(lines: list[str]) -> list[list[str]]:
    """The lines of each run of a log holding several (``... >> log`` in a loop): a run starts at its
    ``# Collective test starting`` or ``# nThread`` line (either order; one of each per run)."""
    runs: list[list[str]] = [[]]
    seen: set[str] = set()  # what the current run already holds: 'test', 'nthread', 'body'
    for ln in lines:
        kind = "test" if _TEST.search(ln) else "nthread" if _NTHREAD.match(ln) else None
        if kind is not None and (kind in seen or "body" in seen):
            runs.append([])
            seen = set()
        if kind is not None:
            seen.add(kind)
        elif _RANK.match(ln) or _HEADER.match(ln) or (ln.strip()[:1].isdigit()):
            seen.add("body")
        runs[-1].append(ln)
    return [r for r in runs if r]


def _run_op(run_lines: list[str], collective: str | None, p: Path) -> str:
    op = collective
    if op is None:
        m = next((m for m in map(_TEST.search, run_lines) if m), None)
        op = m.group(1) if m else None
    if op is None:
        m = re.search(r"(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|alltoall|broadcast|send_?recv)", p.name, re.I)
        op = m.group(1) if m else None
    if op is None:
        raise ProfileImportError(f"{p}: cannot tell which collective this nccl-tests log measured (no 'Collective test "
                                 "starting' line, no collective in the file name); give collective= / --collective")
    try:
        return canonical_op(op)
    except ValueError as e:
        raise ProfileImportError(f"{p}: {e}") from None


def import_nccl_tests(path: str | Path, collective: str | None = None, device: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Collective rows of every run in the log. Each run (``_runs``) is read on its own: its collective, its
    ``# Rank`` lines (de-duplicated by rank number: a repeated line is one rank), hosts and GPU name."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ProfileImportError(f"{p}: cannot read ({e.strerror or e})") from None
    lines = text.splitlines()
    if not any(_HEADER.match(ln) for ln in lines):
        raise ProfileImportError(f"{p}: no nccl-tests result table (header '# size count type ... time algbw busbw')")
    rows = []
    skipped: Counter = Counter()  # reason -> lines that are not a result row
    ops, all_names, all_hosts, world_sizes = [], set(), set(), []
    empty_runs = 0
    cut_runs: list[bool] = []  # runs without nccl-tests' closing '# Avg bus bandwidth' line (partial last row?)
    cols: list[str] | None = None  # a run without its own table header reads its rows with the previous one's
    for run in _runs(lines):
        header = next((ln for ln in run if _HEADER.match(ln)), None)
        if header is not None:
            cols = header.lstrip("#").split()
            if "time" not in cols or "busbw" not in cols:
                raise ProfileImportError(f"{p}: the nccl-tests header lacks 'time' / 'busbw' columns: {' '.join(cols)}")
        results = [ln for ln in run if ln.strip()[:1].isdigit()]
        if cols is None or not results:
            empty_runs += bool(any(_TEST.search(ln) or _NTHREAD.match(ln) for ln in run))
            continue
        first = cols.index("time")
        groups = [i for i, c in enumerate(cols) if c == "time"]
        wrong = [i for i, c in enumerate(cols) if c == "#wrong"]
        op = _run_op(run, collective, p)
        if not any(_FOOTER.match(ln) for ln in run):  # nccl-tests ends every run with '# Avg bus bandwidth'
            last = results[-1].strip().split()
            cut_runs.append(len(last) != len(cols))  # True: its last row is partial (and skipped below)
        ranks = {}  # rank number -> (host, GPU name); a repeated '# Rank N' line is the same rank
        for m in map(_RANK.match, run):
            if m:
                ranks.setdefault(int(m.group(1)), (m.group(2), m.group(3)))
        hosts = {h for h, _ in ranks.values()}
        names = sorted({n for _, n in ranks.values()})
        dname = device or (names[0] if names else "")
        ops.append(op)
        all_names.update(names)
        all_hosts.update(hosts)
        world_sizes.append(len(ranks))
        for ln in results:
            s = ln.strip()
            tok = s.split()
            if len(tok) != len(cols):  # a truncated (or run-together) line: not a result row
                skipped["unreadable line (truncated, or not the header's column count)"] += 1
                continue
            d = dict(zip(cols, tok))
            size, t_us = _num(d.get("size", "")), _num(tok[first])
            if not (math.isfinite(size) and math.isfinite(t_us)):
                skipped["no out-of-place time / size (N/A)"] += 1
                continue
            if size < 0 or t_us <= 0:
                skipped["invalid time or size (negative or zero)"] += 1
                continue
            ip = _num(tok[groups[1]]) if len(groups) > 1 and len(tok) > groups[1] else math.nan
            if not (ip > 0 and math.isfinite(ip)):
                ip = math.nan
            n_wrong = [_num(tok[i]) for i in wrong if i < len(tok)]
            # NCCL's own correctness check failed (#wrong > 0): the row is kept, flagged (reason) and never trained on
            reason = ("nccl-tests #wrong > 0: the collective returned wrong results" if any(w > 0 for w in n_wrong if w == w)
                      else "")
            algbw, busbw = _num(tok[first + 1]), _num(tok[first + 2])
            # kept, flagged (reason), never trained on: a row whose own figures contradict each other
            reason = reason or bandwidth_mismatch(op, size, t_us, algbw, busbw, len(ranks) or math.nan)
            rows.append({"op": op, "size_B": size, "dtype": _DTYPES.get(d.get("type", ""), d.get("type", "")),
                         "world_size": len(ranks) or math.nan, "nodes": len(hosts) or math.nan,
                         "gpus_per_node": (len(ranks) // len(hosts)) if hosts else math.nan, "time_us": t_us,
                         "algbw_GBs": algbw, "busbw_GBs": busbw, "ip_time_us": ip,
                         "device_name": dname, "Device": catalog_name(dname), "reason": reason,
                         "source": f"nccl-tests:{p.name}"})
    if not rows:
        raise ProfileImportError(f"{p}: the nccl-tests table has no result rows (truncated log?)")
    bad = sum(skipped.values())
    names = sorted(all_names)
    notes = {"file": str(p), "format": "nccl-tests", "collective": ops[0] if len(set(ops)) == 1 else ops,
             "device": names or ([device] if device else []), "collective_rows": len(rows), "unreadable_lines": bad,
             "ranks": world_sizes[0] if len(world_sizes) == 1 else world_sizes, "hosts": len(all_hosts)}
    if len(ops) > 1:
        notes["runs"] = len(ops)
    flagged = sum(1 for r in rows if r["reason"])
    reasons = dict(skipped)
    n_wrong_rows = sum(1 for r in rows if r["reason"].startswith("nccl-tests #wrong"))
    if n_wrong_rows:
        reasons["nccl-tests #wrong > 0 (kept, flagged)"] = n_wrong_rows
    n_bw = flagged - n_wrong_rows
    if n_bw:
        reasons["time, size and bandwidth disagree (kept, flagged)"] = n_bw
    notes["skipped_rows"] = bad
    notes["skipped_reasons"] = dict(skipped)
    notes["unmapped_rows"] = flagged
    notes["unmapped_reasons"] = reasons
    warnings = []
    if cut_runs:
        partial = sum(cut_runs)
        notes["truncated_runs"] = len(cut_runs)
        warnings.append(f"{len(cut_runs)} run(s) end without nccl-tests' '# Avg bus bandwidth' line: the log was cut "
                        "(truncated?)" + (f"; {partial} partial last row(s) skipped" if partial else ""))
    if n_bw:
        warnings.append(f"{n_bw} row(s) whose time, size and bandwidth disagree kept, flagged (reason), not trained on")
    if not all(world_sizes):
        warnings.append("no '# Rank N ... device' lines" + (" in a run" if len(world_sizes) > 1 else "")
                        + ": world size and GPU unknown")
    if empty_runs:
        warnings.append(f"{empty_runs} run(s) without result rows (truncated?) skipped")
    if warnings:
        notes["warning"] = "; ".join(warnings)
    return pd.DataFrame(rows), notes
