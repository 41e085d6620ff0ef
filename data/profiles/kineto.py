"""PyTorch profiler (Kineto) Chrome traces (``.json`` / ``.json.gz``) -> kernel and collective rows.

How a GPU kernel finds the operator that launched it: the kernel event's ``args.correlation`` is the id of the
``ac2g`` (or older ``async_cpu_to_gpu``) flow whose start event sits on the launching CPU thread at the launch
time, and of the ``cuda_runtime`` launch event (``cudaLaunchKernel``...) with the same correlation. The operator
is the innermost ``cpu_op`` on that thread whose [ts, ts+dur] holds the launch. All kernels of one operator call
(e.g. a GEMM plus its split-K reduction) form one row whose ``latency_ms`` is the sum of their ``dur``
(microseconds in the trace). Kernels with no launch or no enclosing ``cpu_op`` are kept as their own rows with
``OPName`` '', except kernels launched outside every cpu_op but inside a user annotation (``record_function``
ranges such as apex's ``Optimizer.step#FusedAdam.step``; ``ProfilerStep#`` and ``nccl:*`` excepted), which are
grouped per call of the innermost such annotation, its name in ``aten_op``. NCCL kernels become collective rows:
the collective is the enclosing ``record_param_comms``' ``Collective name``, else the enclosing ``nccl:*``
annotation PyTorch opens around each c10d call (an ``all_to_all`` runs as grouped send/recv, so its kernel is
``ncclKernel_SendRecv``), else the kernel name; the size is ``record_param_comms``' ``In/Out msg nelems`` x
``dtype``, else that annotation's ``Input Dims`` x ``Input type`` where those are the size nccl-tests counts
(``_ANNOTATION_OPS``); the group size is ``Group size``, else the process group's ``pg_size`` in
``distributedInfo.pg_config``, else ``distributedInfo.world_size``. A trace does not record which node each rank ran
on: ``nodes`` / ``gpus_per_node`` are left empty here and filled from ``profile import --nodes / --gpus-per-node``
(``importers.place_collectives``, which reads the group's global ranks, ``_ranks``, kept in an extra column that the
written table drops). The device name comes from the trace's ``deviceProperties`` (matched to the catalog by
name/alias). Format reference: HolisticTraceAnalysis' parser (facebookresearch/HolisticTraceAnalysis,
``hta/common/trace_parser.py``) and the traces in ../shared/datasets/traces.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
import zlib
from collections import defaultdict
from pathlib import Path

import math

import numpy as np
import pandas as pd

from wattcast.data.checks import real_in
from wattcast.data.collective_ops import COLLECTIVES, canonical_op
from wattcast.data.profiles.aten_map import map_aten
from wattcast.data.profiles.devices import device_labels, override_warning
from wattcast.data.profiles.row_checks import kernel_row_problems, shown, unmap_invalid
from wattcast.data.profiles.tables import NoTraceDeviceError, ProfileImportError

_LAUNCH_CATS = ("cuda_runtime", "cuda_driver", "hip_runtime")
_FLOW_CATS = ("ac2g", "async_cpu_to_gpu")
#: GEMM kernels that run FP32 inputs on tensor cores in TF32 (cuBLAS/CUTLASS names: s1688 = fp32 via 16x8x8 mma)
_TF32_KERNEL = re.compile(r"tensorop_s1688|tf32|xmma_gemm_f32f32_tf32", re.I)
#: why a kernel has no operator: its correlation has no launch event (dropped by the profiler, or a CUDA graph
#: replay), or it was launched outside every recorded cpu_op
_UNLINKED = {"no launch": "kernel with no launch event in the trace (correlation not found)",
             "outside ops": "kernel launched outside any cpu_op"}
_NCCL_OP = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", re.I)
#: why a kernel row has no operator although a user annotation holds its launch (``reason_key`` counts it by this)
_IN_ANNOTATION = "kernel launched outside any cpu_op, inside user annotation"
#: dtype names a trace gives a collective -> wattcast's names (nccl-tests' vocabulary, ``nccl_tests._DTYPES``).
#: ``record_param_comms``' ``dtype`` is a c10::ScalarType name (c10/core/ScalarType.h: Char = int8, Byte = uint8);
#: an annotation's ``Input type`` the profiler's C++ type name (caffe2::TypeMeta::name: 'float', 'c10::Half',
#: 'long int', printed 'long' by older profilers, 'signed char', 'unsigned char', ...)
_COMM_DTYPES = {
    "Float": "fp32", "Half": "fp16", "BFloat16": "bf16", "Double": "fp64", "Long": "int64", "Int": "int32",
    "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool", "Float8_e4m3fn": "fp8", "Float8_e5m2": "fp8",
    "float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16", "double": "fp64", "long int": "int64",
    "long": "int64", "int": "int32", "short int": "int16", "short": "int16", "signed char": "int8",
    "unsigned char": "uint8", "bool": "bool", "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8",
}
_COMM_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
                     "uint8": 1, "bool": 1, "fp8": 1}
#: PyTorch's profiling titles of c10d NCCL calls (the ``nccl:<title>`` user annotation) -> (collective, whether the
#: annotation's inputs are the size nccl-tests counts for it). ProcessGroupNCCL opens the annotation through
#: ``Work(rank, opType, profilingTitle, inputTensors)`` (torch/csrc/distributed/c10d/Work.hpp; ProcessGroupNCCL.hpp
#: ``allreduce_impl(tensor, profilingTitle = "nccl:all_reduce")``), which records the call's input tensors as its
#: ``Input Dims`` / ``Input type``. all_reduce / broadcast: the one buffer every rank holds = nccl-tests' size.
#: all_to_all (ProcessGroupNCCL::alltoall_base -> torch/csrc/cuda/nccl.cpp ``all2all_single_equal_split``: inside
#: ncclGroupStart/End an ncclSend + ncclRecv of input.numel() / size elements per peer, hence the SendRecv kernel):
#: the rank's whole send buffer, which is nccl-tests' all_to_all size too (src/alltoall.cu
#: ``AlltoAllGetCollByteCount``: sendcount = (count / nranks) x nranks). send / recv: the one tensor = nccl-tests'
#: send_recv size. all_gather's inputs are one rank's shard (nccl-tests counts the gathered total) and the list form
#: of reduce_scatter is not one flat buffer: their size is taken only from record_param_comms.
_ANNOTATION_OPS = {
    "all_reduce": ("all_reduce", True), "all_reduce_coalesced": ("all_reduce", True),
    "all_reduce_barrier": ("all_reduce", True), "broadcast": ("broadcast", True), "_broadcast_oop": ("broadcast", True),
    "all_to_all": ("all_to_all", True), "send": ("send_recv", True), "recv": ("send_recv", True),
    "all_gather": ("all_gather", False), "_all_gather_base": ("all_gather", False),
    "all_gather_into_tensor_coalesced": ("all_gather", False), "reduce_scatter": ("reduce_scatter", False),
    "_reduce_scatter_base": ("reduce_scatter", False), "reduce_scatter_tensor_coalesced": ("reduce_scatter", False),
}


def comm_dtype(name) -> tuple[str, int | None]:
    """(wattcast dtype name, bytes per element) of a trace's collective dtype name; (name, None) when unknown."""
    n = str(name or "").strip()
    d = _COMM_DTYPES.get(n, n if n in _COMM_DTYPE_BYTES else None)
    return (d, _COMM_DTYPE_BYTES[d]) if d else (n, None)


def reason_key(reason: str) -> str:
    """The kind of an unmapped-row reason, without the op name (for counts)."""
    if reason.startswith("no wattcast op class"):
        return "no wattcast op class"
    if reason.endswith("is not an aten op"):
        return "not an aten op (custom / framework op)"
    if reason.startswith("aten::") and ": " in reason:
        return reason.split(": ", 1)[1]
    if reason.startswith("invalid ") and ": " in reason:  # row_checks: 'invalid dtype: 'int8' is not ...'
        return reason.split(": ", 1)[0]
    if reason.startswith(_IN_ANNOTATION):
        return "kernel launched outside any cpu_op, inside a user annotation (no op class)"
    return reason


def load_trace(path: str | Path) -> dict:
    """The trace document; ProfileImportError for a truncated gzip, invalid JSON or a non-trace document."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw.decode("utf-8"))
    except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as e:
        raise ProfileImportError(f"{p}: cannot read the trace: truncated or damaged gzip ({e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProfileImportError(f"{p}: not a JSON trace (truncated or damaged?): {e}") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ProfileImportError(f"{p}: no 'traceEvents' list: not a PyTorch profiler / Chrome trace")
    return doc


def trace_devices(doc: dict) -> dict[int, str]:
    """GPU id -> name from ``deviceProperties``."""
    out = {}
    for d in doc.get("deviceProperties") or []:
        if isinstance(d, dict) and "name" in d:
            try:
                out[int(d.get("id", len(out)))] = str(d["name"])
            except (TypeError, ValueError):
                continue
    return out


_CHECKED_CATS = ("kernel", "cpu_op", *_LAUNCH_CATS, *_FLOW_CATS)
INVALID_DURATION = "invalid duration (a kernel 'dur' that is missing, negative, non-numeric or infinite)"
INVALID_SHAPE = "invalid shape (a negative dimension in 'Input Dims')"


def _event_label(i: int, e: dict) -> str:
    return f"event #{i} ({e.get('cat')} {str(e.get('name', ''))[:60]!r})"


def _drop_duplicates(events: list[dict]) -> tuple[list[dict], int]:
    """``events`` without exact duplicates (every field equal: a trace merged or written twice) of the categories
    the importer reads; a kept duplicate kernel would add its time to its operator twice. Returns the count dropped."""
    seen: set[str] = set()
    out = []
    for e in events:
        if e.get("cat") in _CHECKED_CATS:
            key = json.dumps(e, sort_keys=True, default=str)
            if key in seen:
                continue
            seen.add(key)
        out.append(e)
    return out, len(events) - len(out)


def _check_events(events: list[dict], p: Path) -> None:
    """Malformed fields of the events the importer reads are one clear ProfileImportError naming the event (never a
    traceback): ``args`` that is not an object, a ``ts`` that is not a finite number, a ``name`` that is not a
    string, a cpu_op ``dur`` that is not a finite number >= 0. Timestamps are made floats in place. A kernel's
    ``dur`` is checked per row instead (``INVALID_DURATION``: the row is kept unmapped, counted)."""
    for i, e in enumerate(events):
        cat = e.get("cat")
        if cat not in _CHECKED_CATS:
            continue
        a = e.get("args")
        if a is not None and not isinstance(a, dict):
            raise ProfileImportError(f"{p}: {_event_label(i, e)}: 'args' is {type(a).__name__}, not an object "
                                     "(damaged trace?)")
        if "name" in e and not isinstance(e["name"], str):
            raise ProfileImportError(f"{p}: {_event_label(i, e)}: 'name' is not a string (damaged trace?)")
        if cat == "kernel" or cat == "cpu_op" or "ts" in e:
            ts = real_in(e.get("ts"), -math.inf, math.inf)
            if ts is None:
                raise ProfileImportError(f"{p}: {_event_label(i, e)}: 'ts' {e.get('ts')!r} is not a finite number "
                                         "(damaged trace?)")
            e["ts"] = ts
        if cat == "cpu_op" and "dur" in e:
            d = real_in(e.get("dur"), 0.0, math.inf)
            if d is None:
                raise ProfileImportError(f"{p}: {_event_label(i, e)}: 'dur' {e.get('dur')!r} is not a finite "
                                         "number >= 0 (damaged trace?)")
            e["dur"] = d


def _kernel_dur(k: dict) -> float | None:
    """A kernel's ``dur`` (us) when it is a real measurement (finite, >= 0), else None."""
    return real_in(k.get("dur"), 0.0, math.inf)


def _launch_sites(events) -> dict[int, tuple]:
    """correlation id -> (pid, tid, ts) of the CPU-side launch (flow start, else the runtime event)."""
    sites: dict[int, tuple] = {}
    for e in events:
        cat = e.get("cat")
        if cat in _LAUNCH_CATS and e.get("ph") == "X":
            c = (e.get("args") or {}).get("correlation")
            if c is not None:
                sites.setdefault(int(c), (e.get("pid"), e.get("tid"), float(e.get("ts", 0))))
    for e in events:  # the flow start is the documented link; it wins when present
        if e.get("cat") in _FLOW_CATS and e.get("ph") == "s" and "id" in e:
            try:
                sites[int(e["id"])] = (e.get("pid"), e.get("tid"), float(e.get("ts", 0)))
            except (TypeError, ValueError):
                continue
    return sites


class _ThreadOps:
    """The cpu_ops of one thread, for 'innermost op holding time t' queries (ops nest properly per thread)."""

    def __init__(self, ops: list[dict]) -> None:
        self.ops = sorted(ops, key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        self.starts = [float(e["ts"]) for e in self.ops]
        # parent index of each op (stack sweep)
        self.parent = [-1] * len(self.ops)
        stack: list[int] = []
        for i, e in enumerate(self.ops):
            t = self.starts[i]
            while stack and self._end(stack[-1]) < t:
                stack.pop()
            self.parent[i] = stack[-1] if stack else -1
            stack.append(i)

    def _end(self, i: int) -> float:
        e = self.ops[i]
        return float(e["ts"]) + float(e.get("dur", 0))

    def innermost(self, t: float) -> int:
        i = bisect.bisect_right(self.starts, t) - 1
        while i >= 0 and self._end(i) < t:
            i = self.parent[i]
        return i

    def chain(self, i: int):
        while i >= 0:
            yield i
            i = self.parent[i]


def _pg_entry(info: dict, name) -> dict:
    """The ``distributedInfo.pg_config`` entry of process group ``name`` ({} when the trace has none)."""
    pgs = info.get("pg_config") if isinstance(info.get("pg_config"), list) else []
    return next((g for g in pgs if isinstance(g, dict) and name is not None and str(g.get("pg_name")) == str(name)), {})


def _rank_list(v) -> list[int] | None:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return None
    ok = isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
    return sorted(set(v)) if ok and len(set(v)) == len(v) else None


def _group_ranks(a: dict, info: dict, world: int) -> list[int] | None:
    """The global ranks of a collective's process group: ``record_param_comms``' ``Process Group Ranks``, else its
    ``Global rank start`` / ``stride`` with ``Group size``, else the group's ``ranks`` in ``distributedInfo.pg_config``;
    None when none gives ``world`` ranks."""
    ranks = _rank_list(a.get("Process Group Ranks"))
    if ranks is None:
        start, stride = a.get("Global rank start"), a.get("Global rank stride")
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stride)) and start >= 0 and stride >= 1:
            ranks = list(range(start, start + stride * world, stride))
    if ranks is None:
        ranks = _rank_list(_pg_entry(info, a.get("Process Group Name")).get("ranks"))
    return ranks if ranks is not None and len(ranks) == world else None


def _annotation_size(a: dict) -> tuple[float, str, str]:
    """(bytes, dtype, '') of an ``nccl:*`` annotation's input tensors (``Input Dims`` x ``Input type``, summed), or
    (nan, dtype or '', why) when they do not give it."""
    dims, types = a.get("Input Dims"), a.get("Input type")
    if not isinstance(dims, list) or not dims:
        return math.nan, "", "has no 'Input Dims' (recorded without record_shapes=True)"
    if not isinstance(types, list) or len(types) != len(dims):
        return math.nan, "", "has no 'Input type' for each of its 'Input Dims'"
    total, dts = 0, set()
    for d, t in zip(dims, types):
        if not (isinstance(d, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d)):
            return math.nan, "", f"has an input {str(d)[:40]} that is not a tensor shape"
        dt, eb = comm_dtype(t)
        if eb is None:
            return math.nan, dt, f"has an input of type {t!r} wattcast does not know the size of"
        total += math.prod(d) * eb
        dts.add(dt)
    return float(total), (dts.pop() if len(dts) == 1 else "mixed"), ""


def _nccl_annotation(nccl_anns: dict, site: tuple | None) -> dict | None:
    """The ``nccl:*`` user annotation on the launching thread that holds the launch (c10d calls do not nest)."""
    if site is None or (site[0], site[1]) not in nccl_anns:
        return None
    starts, evs = nccl_anns[(site[0], site[1])]
    i = bisect.bisect_right(starts, site[2]) - 1
    return evs[i] if i >= 0 and starts[i] + evs[i]["dur"] >= site[2] else None


def _user_annotations(events) -> tuple[dict, dict]:
    """Per launching thread, (the user annotations kernels outside every cpu_op are attributed to, as _ThreadOps:
    ``ProfilerStep#`` spans and ``nccl:*`` calls left out), and (starts, events) of its ``nccl:*`` annotations sorted
    by start. Annotations without a finite ``ts`` / ``dur`` >= 0 are not used."""
    spans: dict[tuple, list] = defaultdict(list)
    nccl: dict[tuple, list] = defaultdict(list)
    for e in events:
        if e.get("cat") != "user_annotation" or e.get("ph") != "X":
            continue
        ts, dur = real_in(e.get("ts"), -math.inf, math.inf), real_in(e.get("dur"), 0.0, math.inf)
        name = e.get("name")
        if ts is None or dur is None or not isinstance(name, str):
            continue
        span = dict(e, ts=ts, dur=dur)
        if name.startswith("nccl:"):
            nccl[(e.get("pid"), e.get("tid"))].append(span)
        elif not name.startswith("ProfilerStep#"):
            spans[(e.get("pid"), e.get("tid"))].append(span)
    nccl_sorted = {}
    for k, v in nccl.items():
        v.sort(key=lambda e: e["ts"])
        nccl_sorted[k] = ([e["ts"] for e in v], v)
    return {k: _ThreadOps(v) for k, v in spans.items()}, nccl_sorted


def _nccl_row(kernels, ops: _ThreadOps | None, idx: int, doc: dict, device_name: str, source: str,
              device_cat: str, ann: dict | None = None) -> dict:
    """One collective row of the NCCL kernels of one call (module docstring: op, size and group size, in order of
    precedence). ``ann``: the ``nccl:*`` annotation around the launch. ``_ranks``: the group's global ranks, for
    ``importers.place_collectives`` (not a table column)."""
    k0 = kernels[0]
    durs = [_kernel_dur(k) for k in kernels]
    time_us = sum(durs) if None not in durs else float("nan")
    row = {"time_us": time_us, "device_name": device_name, "Device": device_cat, "source": source,
           "op": "", "size_B": float("nan"), "dtype": "", "world_size": float("nan"), "reason": "", "_ranks": None}
    why_op = ""
    m = _NCCL_OP.search(k0.get("name", ""))
    if m:
        try:
            row["op"] = canonical_op(m.group(1))
        except ValueError:
            why_op = f"unknown NCCL kernel {m.group(1)!r}"
    title, ann_sizes = "", False
    if ann is not None:  # the c10d call around the launch names the collective better than its kernel
        title = str(ann.get("name", ""))[len("nccl:"):]
        op, ann_sizes = _ANNOTATION_OPS.get(title, (None, False))
        if op is None:
            try:
                op = canonical_op(title)
            except ValueError:
                op = None
        row["op"], why_op = (op, "") if op else ("", f"nccl:{title} is not one of the modelled collectives "
                                                  f"({', '.join(COLLECTIVES)})")
    comm = None
    if ops is not None and idx >= 0:
        comm = next((ops.ops[j] for j in ops.chain(idx) if ops.ops[j].get("name") == "record_param_comms"), None)
    info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    a = (comm.get("args") or {}) if comm is not None else {}
    if a.get("Collective name"):
        try:
            row["op"], why_op = canonical_op(a["Collective name"]), ""
        except ValueError:
            pass
    size_why = []
    if comm is not None:
        n = max(int(a.get("In msg nelems") or 0), int(a.get("Out msg nelems") or 0))
        dt_raw = a.get("dtype")
        eb = None
        if dt_raw:
            row["dtype"], eb = comm_dtype(dt_raw)
        if eb and n:
            row["size_B"] = n * eb
        elif dt_raw and n:
            size_why.append(f"record_param_comms' dtype {dt_raw!r} is not one wattcast knows the size of")
        else:
            size_why.append("record_param_comms has no message size / dtype")
    else:
        size_why.append("no record_param_comms op around the NCCL kernel")
    if row["size_B"] != row["size_B"]:
        if ann is None:
            size_why.append("no nccl:* annotation around it either")
        elif not ann_sizes:
            size_why.append(f"the nccl:{title} annotation's inputs are not the size nccl-tests counts"
                            if title in _ANNOTATION_OPS else f"nccl:{title} has no size convention wattcast knows")
        else:
            size, dt, why = _annotation_size(ann.get("args") or {})
            if why:
                size_why.append(f"its nccl:{title} annotation {why}")
            else:
                row["size_B"], row["dtype"] = size, dt
        if row["size_B"] != row["size_B"]:
            row["reason"] = "; ".join(size_why) + ": message size unknown"
    pg = _pg_entry(info, a.get("Process Group Name"))
    if a.get("Group size"):
        row["world_size"] = int(a["Group size"])
    elif pg.get("pg_size"):
        row["world_size"] = int(pg["pg_size"])
    elif info.get("world_size"):
        row["world_size"] = int(info["world_size"])
    if row["world_size"] == row["world_size"]:
        row["_ranks"] = _group_ranks(a, info, int(row["world_size"]))
    if not row["op"]:
        row["reason"] = why_op or f"cannot tell the collective of kernel {k0.get('name', '')[:60]!r}"
    if None in durs:
        row["reason"] = INVALID_DURATION
    return row


def _busy(kernels: list[dict], events: list[dict], sites: dict[int, tuple]) -> dict:
    """Compute / NCCL / union GPU busy time of the kernel events, the GPU memory operations by kind, and per
    ``ProfilerStep#`` its CPU span and its GPU span (the GPU events launched inside it; ``profiles.busy``)."""
    import numpy as np

    from wattcast.data.profiles.busy import busy_summary, copy_summary, step_gpu_spans_ms

    dur = [_kernel_dur(k) for k in kernels]
    steps = sorted((e for e in events
                    if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
                    and not str(e.get("cat", "")).startswith("gpu_")  # the CPU-side span (gpu_user_annotation is a copy)
                    and real_in(e.get("dur"), 0.0, math.inf) is not None and real_in(e.get("ts"), -math.inf, math.inf) is not None),
                   key=lambda e: float(e["ts"]))
    copies = [e for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset") and e.get("ph") == "X"]
    gpu = [*kernels, *copies]
    ts = [real_in(k.get("ts"), -math.inf, math.inf) for k in kernels]
    copy_dur = [real_in(e.get("dur"), 0.0, math.inf) for e in copies]
    g0 = np.array([*ts, *(real_in(e.get("ts"), -math.inf, math.inf) for e in copies)], float)
    gd = np.array([*dur, *copy_dur], float)
    site = [sites.get(int(c)) if (c := (e.get("args") or {}).get("correlation")) is not None else None for e in gpu]
    s0 = np.array([float(e["ts"]) for e in steps], float)
    gpu_ms = step_gpu_spans_ms(s0, s0 + np.array([float(e["dur"]) for e in steps], float), [e.get("pid") for e in steps],
                               [x[2] if x else np.nan for x in site], [x[0] if x else None for x in site], g0, g0 + gd)
    out = busy_summary([t if t is not None else float("nan") for t in ts],
                       [d if d is not None else float("nan") for d in dur],
                       [(k.get("args") or {}).get("device", 0) for k in kernels],
                       ["nccl" in k.get("name", "").lower() for k in kernels],
                       [float(x) for x in gpu_ms[np.isfinite(gpu_ms)]],
                       steps_cpu_ms=[float(e["dur"]) / 1e3 for e in steps],
                       copies=copy_summary([e.get("name", "") for e in copies], [e.get("cat") for e in copies],
                                           copy_dur))
    out["steps_without_gpu"] = int((~np.isfinite(gpu_ms)).sum())
    out["steps_without_gpu_names"] = [e.get("name") for e, m in zip(steps, gpu_ms) if not np.isfinite(m)]
    return out


def import_kineto(path: str | Path, device: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(kernel rows, collective rows, notes) of one trace. ``device`` overrides the trace's device name.

    A malformed field (``_check_events``; else any field of an unexpected type) is a ProfileImportError naming the
    file, never a traceback."""
    try:
        return _import_kineto(Path(path), device)
    except ProfileImportError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as e:
        raise ProfileImportError(f"{path}: a trace event has a malformed field ({type(e).__name__}: {e}); "
                                 "damaged trace?") from None


def _import_kineto(p: Path, device: str | None) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    doc = load_trace(p)
    events, duplicates = _drop_duplicates([e for e in doc["traceEvents"] if isinstance(e, dict)])
    _check_events(events, p)
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    source = f"kineto:{p.name}"
    if not kernels:
        cpu_only = any(e.get("cat") == "cpu_op" for e in events)
        raise ProfileImportError(
            f"{p}: no GPU kernel events ('cat': 'kernel') in the trace"
            + (": a CPU-only profile (profile with ProfilerActivity.CUDA)" if cpu_only else ""))
    devs = trace_devices(doc)
    if device is None and not devs:
        raise NoTraceDeviceError(p)  # names --device (profile import's); validate trace names its --trace-device
    threads: dict[tuple, list] = defaultdict(list)
    has_dims = False
    for e in events:
        if e.get("cat") == "cpu_op" and e.get("ph") == "X" and "ts" in e:
            threads[(e.get("pid"), e.get("tid"))].append(e)
            has_dims = has_dims or "Input Dims" in (e.get("args") or {})
    thread_ops = {k: _ThreadOps(v) for k, v in threads.items()}
    thread_anns, nccl_anns = _user_annotations(events)
    sites = _launch_sites(events)

    # (thread, op index) | ("annotation", thread, annotation index) | ("no launch" | "outside ops", n) -> kernels
    groups: dict[tuple, list] = defaultdict(list)
    group_site: dict[tuple, tuple] = {}
    for n, k in enumerate(kernels):
        c = (k.get("args") or {}).get("correlation")
        site = sites.get(int(c)) if c is not None else None
        if site is None:
            groups[("no launch", n)].append(k)
            continue
        thread = (site[0], site[1])
        ops = thread_ops.get(thread)
        i = ops.innermost(site[2]) if ops is not None else -1
        if i >= 0:
            key = (thread, i)
        else:  # no cpu_op: the innermost user annotation (record_function range) around the launch, if any
            anns = thread_anns.get(thread)
            j = anns.innermost(site[2]) if anns is not None and "nccl" not in k.get("name", "").lower() else -1
            key = ("annotation", thread, j) if j >= 0 else ("outside ops", n)
        groups[key].append(k)
        group_site.setdefault(key, site)

    krows, crows = [], []
    reasons: dict[str, int] = defaultdict(int)
    absent: dict[int, int] = defaultdict(int)  # device index not in deviceProperties -> rows labelled unknown
    for key, ks in groups.items():
        ks.sort(key=lambda k: float(k.get("ts", 0)))
        did = (ks[0].get("args") or {}).get("device")
        if did is not None and int(did) not in devs:
            recorded = ""  # unknown GPU: never another device's name (its rows are not trained on: empty Device)
            if device is None:
                absent[int(did)] += 1
        else:
            recorded = devs.get(int(did) if did is not None else 0) or next(iter(devs.values()), "")
        dname, dcat = device_labels(recorded, device)
        ops = thread_ops.get(key[0]) if key[0] not in (*_UNLINKED, "annotation") else None
        idx = key[1] if ops is not None else -1
        if any("nccl" in k.get("name", "").lower() for k in ks):
            crows.append(_nccl_row(ks, ops, idx, doc, dname, source, dcat,
                                   _nccl_annotation(nccl_anns, group_site.get(key))))
            continue
        durs = [_kernel_dur(k) for k in ks]
        lat_ms = sum(durs) / 1000.0 if None not in durs else float("nan")
        longest = max(ks, key=lambda k: _kernel_dur(k) or 0.0)
        row = {"latency_ms": lat_ms, "n_kernels": len(ks), "kernel": longest.get("name", "")[:200],
               "device_name": dname, "Device": dcat, "source": source}
        if key[0] == "annotation":
            name = str(thread_anns[key[1]].ops[key[2]].get("name", ""))
            row.update(OPName="", aten_op=name, reason=f"{_IN_ANNOTATION} {name[:80]!r}: no wattcast op class")
        elif ops is None:
            row.update(OPName="", aten_op="", reason=_UNLINKED[key[0]])
        else:
            op = ops.ops[idx]
            a = op.get("args") or {}
            name, shape, dtype, why = map_aten(op.get("name", ""), a.get("Input Dims"), a.get("Input type"),
                                               a.get("Concrete Inputs"))
            if name in ("bmm", "linear") and dtype == "fp32" and any(_TF32_KERNEL.search(k.get("name", "")) for k in ks):
                dtype = "tf32"
            row.update(OPName=name, aten_op=op.get("name", ""), dtype=dtype, reason=why, **shape)
            if name and not why and any(real_in(v, 0.0, math.inf) is None for v in shape.values() if v is not None):
                row.update(OPName="", reason=INVALID_SHAPE)
        if None in durs:  # an impossible measurement is never a training / validation row
            row.update(OPName="", reason=INVALID_DURATION)
        if row["reason"]:
            reasons[reason_key(row["reason"])] += 1
        krows.append(row)
    kdf = pd.DataFrame(krows)
    cdf = pd.DataFrame(crows)
    invalid = []
    if len(kdf):  # the checks a user kernel CSV passes (row_checks; a 0 us kernel is the trace's resolution)
        problems = kernel_row_problems(kdf, zero_time_ok=True)
        kdf = unmap_invalid(kdf, problems)
        bad = problems != ""
        for why in problems[bad]:
            reasons[reason_key(why)] += 1
        invalid = [f"kernel row {i + 1} ({a or '?'} -> kernel {str(kn)[:60]!r}): {why}"
                   for i, a, kn, why in zip(np.flatnonzero(bad), kdf.loc[bad, "aten_op"], kdf.loc[bad, "kernel"],
                                            problems[bad])]
    mapped = int((kdf["OPName"] != "").sum()) if len(kdf) else 0
    notes = {"file": str(p), "format": "kineto", "device": sorted(set(devs.values())) if device is None else [device],
             "kernels": len(kernels), "kernel_rows": len(kdf), "mapped_rows": mapped, "unmapped_rows": len(kdf) - mapped,
             "collective_rows": len(cdf), "has_shapes": has_dims, "unmapped_reasons": dict(reasons),
             "busy": _busy(kernels, events, sites)}
    info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    if info:  # what the trace says of its job (it names no node: the placement comes from profile import's flags)
        pgs = [{"name": g.get("pg_name"), "size": g.get("pg_size")} for g in info.get("pg_config") or []
               if isinstance(g, dict)]
        notes["distributed"] = {k: info[k] for k in ("backend", "rank", "world_size") if k in info}
        if pgs:
            notes["distributed"]["process_groups"] = pgs
    warnings = []
    if not has_dims:
        warnings.append("the trace has no operator shapes ('Input Dims'): profile with record_shapes=True; "
                        "every kernel row is kept unmapped")
    if invalid:
        notes["invalid_rows"] = len(invalid)
        warnings.append(f"{p}: {len(invalid):,} kernel row(s) kept unmapped as invalid (not trained or validated on): "
                        f"{shown(invalid)}")
    if duplicates:
        notes["duplicate_events"] = duplicates
        warnings.append(f"{duplicates:,} exact duplicate event(s) dropped (a trace merged or written twice?)")
    if absent:
        notes["unknown_device_rows"] = sum(absent.values())
        warnings.append(f"kernel(s) on device index {', '.join(map(str, sorted(absent)))} absent from the trace's "
                        f"deviceProperties (ids {', '.join(map(str, sorted(devs)))}): {sum(absent.values()):,} "
                        "row(s) labelled with an unknown GPU (empty Device); give --device to name it")
    relabel = override_warning(devs.values(), device)
    if relabel:
        notes["device_override"] = {"device": device, "recorded": sorted(set(devs.values()))}
        warnings.append(relabel)
    idle = notes["busy"].pop("steps_without_gpu_names")
    if idle:
        warnings.append(f"{len(idle)} ProfilerStep# span(s) launched no GPU work ({', '.join(map(str, idle[:4]))}"
                        f"{', ...' if len(idle) > 4 else ''}): left out of the measured step times")
    if warnings:
        notes["warning"] = "; ".join(warnings)
    return kdf, cdf, notes
