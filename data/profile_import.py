"""Profiling files in, measurement tables out: PyTorch profiler (Kineto) Chrome traces and nccl-tests logs.

The tables are the ones the trainers and ``wattcast kernels`` read:

- kernel rows: ``OPName`` plus the op's NeuSight shape columns (``B, M, N, K`` for ``bmm``/``linear``, ``B, H`` for
  elementwise ops, ``ln``, ``softmax``), ``dtype``, ``Latency`` (ms, measured), ``Device``, and where they came from
  (``aten_op``, ``kernels``: GPU kernels summed into the row, ``source``); a GPU kernel whose launching op has no
  wattcast equivalent (or no recorded shapes) is kept as its own row with an empty ``OPName`` and its kernel name;
- collective rows: ``op`` (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send_recv), ``bytes`` (per
  rank as nccl-tests counts them), ``group_size``, ``time_ms``, ``Device``, ``source``.

Kineto traces (``.json`` or ``.json.gz``): every GPU ``kernel`` event is tied to the CPU launch (``cuda_runtime`` /
``cuda_driver``) with the same ``correlation`` id, and the launch to the innermost ``cpu_op`` on the same thread that
encloses it in time (the aten op that launched it: ``aten::mm``, ``aten::addmm``, ``aten::bmm``, elementwise ops,
``aten::native_layer_norm``, ``aten::_softmax``; their ``Input Dims``/``Input type`` give shapes and dtype, which
``torch.profiler(record_shapes=True)`` records). The device is ``deviceProperties[0].name`` resolved against the
catalog (``device`` argument otherwise). Malformed files raise :class:`ProfileImportError` naming the file.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


class ProfileImportError(ValueError):
    """A profiling file that cannot be read (the message names the file and what is wrong)."""


#: Kineto "Input type" -> wattcast dtype
TORCH_DTYPES = {"float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16", "double": "fp32",
                "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8"}
#: aten elementwise ops -> (two-tensor kernel, tensor-scalar kernel)
ELEMENTWISE = {"add": ("add", "addu"), "sub": ("sub", "subu"), "mul": ("mul", "mulu"), "div": ("div", "divu"),
               "pow": ("pow", "powu"), "rsub": ("sub", "subu")}
UNARY = {"relu": "relu", "gelu": "gelu", "tanh": "tanh", "silu": "silu", "sigmoid": "sigmoid", "exp": "exp",
         "neg": "neg", "sqrt": "sqrt", "rsqrt": "rsqrt", "threshold_backward": "mul", "gelu_backward": "mul",
         "sigmoid_backward": "mul", "tanh_backward": "mul", "silu_backward": "mul"}
COLLECTIVES = {"allreduce": "all_reduce", "all_reduce": "all_reduce", "allgather": "all_gather", "all_gather": "all_gather",
               "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter", "alltoall": "all_to_all",
               "all_to_all": "all_to_all", "broadcast": "broadcast", "sendrecv": "send_recv", "send": "send_recv",
               "recv": "send_recv"}
KERNEL_COLUMNS = ("OPName", "B", "M", "N", "K", "H", "dtype", "Latency", "Device", "aten_op", "kernels", "source")
COLLECTIVE_COLUMNS = ("op", "bytes", "group_size", "time_ms", "Device", "source")


def _open_json(path: Path) -> dict:
    try:
        raw = gzip.open(path, "rt", encoding="utf-8").read() if path.suffix == ".gz" else path.read_text(encoding="utf-8")
        return json.loads(raw)
    except FileNotFoundError:
        raise ProfileImportError(f"{path}: no such file") from None
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProfileImportError(f"{path}: not a readable (gzipped) JSON trace ({type(e).__name__}: {e})") from None


def _prod(xs) -> float:
    return float(math.prod(int(x) for x in xs)) if xs else 1.0


def _op_row(name: str, dims: list, types: list) -> dict | None:
    """The wattcast kernel row of one aten op with its recorded input dims, else None."""
    base = name.split("::")[-1].rstrip("_")
    dt = next((TORCH_DTYPES[t] for t in types if t in TORCH_DTYPES), None)
    if dt is None:
        return None
    tensors = [d for d, t in zip(dims, types) if d and t in TORCH_DTYPES]
    if base == "mm" and len(tensors) >= 2 and len(tensors[0]) == 2 and len(tensors[1]) == 2:
        (m, k), (_, n) = tensors[0], tensors[1]
        return dict(OPName="bmm", B=1, M=m, N=k, K=n, dtype=dt)
    if base == "addmm" and len(tensors) >= 3 and len(tensors[1]) == 2 and len(tensors[2]) == 2:
        (m, k), (_, n) = tensors[1], tensors[2]
        return dict(OPName="linear", B=1, M=m, N=k, K=n, dtype=dt)
    if base in ("bmm", "baddbmm") and len(tensors) >= 2:
        a, b = (tensors[0], tensors[1]) if base == "bmm" else (tensors[1], tensors[2]) if len(tensors) >= 3 else (None, None)
        if a is not None and len(a) == 3 and len(b) == 3:
            return dict(OPName="bmm", B=a[0], M=a[1], N=a[2], K=b[2], dtype=dt)
        return None
    first = tensors[0] if tensors else None
    if not first:
        return None
    rows, h = _prod(first[:-1]), int(first[-1])
    if base in ELEMENTWISE:
        two = len(tensors) >= 2 and _prod(tensors[1]) == _prod(first)
        return dict(OPName=ELEMENTWISE[base][0 if two else 1], B=rows, H=h, dtype=dt)
    if base in UNARY:
        return dict(OPName=UNARY[base], B=rows, H=h, dtype=dt)
    if base in ("native_layer_norm", "layer_norm"):
        return dict(OPName="ln", B=rows, H=h, dtype=dt)
    if base in ("_softmax", "softmax"):
        return dict(OPName="softmax", B=rows, H=h, dtype=dt)
    if base in ("copy", "clone", "contiguous") and len(tensors) >= 1:
        return dict(OPName="copy", B=rows, H=h, dtype=dt)
    return None


def _innermost_ops(ops: list[dict], launches: list[dict]) -> dict[int, dict]:
    """correlation id -> the innermost cpu_op enclosing its launch on the same thread."""
    by_tid: dict[Any, list[dict]] = {}
    for o in ops:
        by_tid.setdefault(o.get("tid"), []).append(o)
    out: dict[int, dict] = {}
    launch_by_tid: dict[Any, list[dict]] = {}
    for e in launches:
        launch_by_tid.setdefault(e.get("tid"), []).append(e)
    for tid, ls in launch_by_tid.items():
        cands = sorted(by_tid.get(tid, []), key=lambda o: (o["ts"], -o.get("dur", 0)))
        starts = np.array([o["ts"] for o in cands], dtype=float)
        ends = np.array([o["ts"] + o.get("dur", 0) for o in cands], dtype=float)
        for e in ls:
            t = float(e["ts"])
            i = int(np.searchsorted(starts, t, side="right")) - 1
            # walk back to the latest-starting op that still encloses the launch (ops nest)
            while i >= 0 and ends[i] < t:
                i -= 1
            if i >= 0:
                corr = e.get("args", {}).get("correlation")
                if corr is not None:
                    out[int(corr)] = cands[i]
    return out


def _device_of(trace: dict) -> str | None:
    props = trace.get("deviceProperties") or []
    return str(props[0].get("name")) if props and isinstance(props[0], dict) and props[0].get("name") else None


def resolve_trace_device(name: str | None) -> str | None:
    """A catalog device name for a trace's GPU name (``NVIDIA A100-PG509-200`` -> A100-SXM4-40GB, ...), else None."""
    if not name:
        return None
    from wattcast.data.catalog import resolve_device
    from wattcast.data.device_spec import DeviceSpecError

    key = re.sub(r"^(NVIDIA|AMD)\s+", "", name.strip(), flags=re.I)
    aliases = {"A100-PG509-200": "A100-SXM4-40GB", "Tesla V100-SXM2-32GB": "V100-SXM2-32GB"}
    for cand in (aliases.get(key), name, key):
        if not cand:
            continue
        try:
            return resolve_device(cand).name
        except (DeviceSpecError, ValueError, FileNotFoundError, KeyError):
            continue
    return None


def read_kineto(path: str | Path, *, device: str | None = None) -> dict[str, Any]:
    """``{"kernels": DataFrame, "collectives": DataFrame, "device": str | None, "gpu_name": str | None,
    "kernel_ms": float}`` from a PyTorch profiler trace (see the module docstring)."""
    path = Path(path)
    trace = _open_json(path)
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ProfileImportError(f"{path}: not a Chrome/Kineto trace (no 'traceEvents' list)")
    ev = [e for e in trace["traceEvents"] if isinstance(e, dict)]
    ops = [e for e in ev if e.get("cat") == "cpu_op" and e.get("ph") == "X" and "ts" in e]
    launches = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver") and "ts" in e]
    kernels = [e for e in ev if e.get("cat") == "kernel" and "dur" in e]
    if not kernels:
        raise ProfileImportError(f"{path}: the trace has no GPU kernel events (was it recorded with "
                                 "ProfilerActivity.CUDA?)")
    gpu_name = _device_of(trace)
    dev = device or resolve_trace_device(gpu_name)
    op_of = _innermost_ops(ops, launches)
    groups: dict[Any, dict] = {}
    coll_rows = []
    world = (trace.get("distributedInfo") or {}).get("world_size")
    for k in kernels:
        args = k.get("args", {})
        corr = args.get("correlation")
        op = op_of.get(int(corr)) if corr is not None else None
        kname = str(k.get("name", ""))
        lname = kname.lower()
        if "nccl" in lname:
            kind = next((v for key, v in COLLECTIVES.items() if key in lname.replace("_", "")), None)
            nbytes = np.nan
            if op is not None:
                a = op.get("args", {})
                nel, dtype_str = a.get("In msg nelems"), a.get("dtype")
                size = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4}.get(str(dtype_str), 4)
                if nel is not None:
                    nbytes = float(nel) * size
            coll_rows.append(dict(op=kind or "", bytes=nbytes, group_size=(op or {}).get("args", {}).get("Group size", world),
                                  time_ms=float(k["dur"]) / 1e3, Device=dev, source=path.name))
            continue
        key = ("op", id(op)) if op is not None else ("kernel", id(k))
        g = groups.setdefault(key, dict(op=op, ms=0.0, n=0, kname=kname))
        g["ms"] += float(k["dur"]) / 1e3
        g["n"] += 1
    rows = []
    for g in groups.values():
        op = g["op"]
        row = None
        if op is not None:
            a = op.get("args", {})
            dims, types = a.get("Input Dims"), a.get("Input type")
            if isinstance(dims, list) and isinstance(types, list):
                row = _op_row(str(op.get("name", "")), dims, types)
        base = dict(Latency=g["ms"], Device=dev, aten_op=str(op.get("name")) if op is not None else "",
                    kernels=int(g["n"]), source=path.name)
        if row is None:
            base.update(OPName="", kernel_name=g["kname"][:120])
        else:
            base.update(row)
        rows.append(base)
    kt = pd.DataFrame(rows)
    for c in KERNEL_COLUMNS:
        if c not in kt:
            kt[c] = np.nan if c in ("B", "M", "N", "K", "H") else ""
    ct = pd.DataFrame(coll_rows, columns=list(COLLECTIVE_COLUMNS))
    return dict(kernels=kt, collectives=ct, device=dev, gpu_name=gpu_name,
                kernel_ms=float(sum(float(k["dur"]) for k in kernels) / 1e3))


_NCCL_LINE = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)")
_NCCL_OP = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "reduce_scatter_perf": "reduce_scatter",
            "alltoall_perf": "all_to_all", "broadcast_perf": "broadcast", "sendrecv_perf": "send_recv"}


def read_nccl_tests(path: str | Path, *, device: str | None = None, op: str | None = None) -> pd.DataFrame:
    """Collective rows from an nccl-tests stdout log (the out-of-place time of every size line). The collective is
    taken from the binary name in the log's header (``# ... all_reduce_perf ...``) or ``op``; the group size from
    the ``#  Rank ...`` lines."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise ProfileImportError(f"{path}: no such file") from None
    kind = op
    if kind is None:
        kind = next((v for k, v in _NCCL_OP.items() if k in text), None)
    if kind is None:
        raise ProfileImportError(f"{path}: cannot tell which collective this nccl-tests log measured (name the binary, "
                                 "e.g. all_reduce_perf, in the log or pass op=)")
    ranks = len(re.findall(r"^#\s+Rank\s+\d+", text, flags=re.M)) or None
    rows = []
    for line in text.splitlines():
        m = _NCCL_LINE.match(line)
        if m:
            rows.append(dict(op=kind, bytes=float(m.group(1)), group_size=ranks, time_ms=float(m.group(6)) / 1e3,
                             Device=device, source=path.name))
    if not rows:
        raise ProfileImportError(f"{path}: no nccl-tests result lines (size count type redop root time algbw busbw ...)")
    return pd.DataFrame(rows, columns=list(COLLECTIVE_COLUMNS))
