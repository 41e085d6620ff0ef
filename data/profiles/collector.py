"""``wattcast profile run``: measure this machine's GPU on a sweep of kernel (and collective) shapes.

One code path, two timer backends:

- ``CudaBackend`` (a CUDA GPU is present): CUDA events around each timed loop (``torch.cuda.Event(enable_timing=
  True)``, elapsed_time in ms), NVML energy counters (``nvmlDeviceGetTotalEnergyConsumption``, mJ, Volta and
  newer; NVML API reference) read before and after each loop -> average power per sweep point; the device spec
  (name, SMs, memory, clocks, bus width -> bandwidth, default power limit) read from the driver.
- ``CpuBackend``: the same sweep with ``time.perf_counter_ns`` on the CPU (used by the tests, and to check a sweep
  plan without a GPU); no energy.

Every sweep point: ``warmup`` untimed calls, then ``repeats`` timed loops of ``inner`` calls; the row's
``latency_ms`` is the median per-call time. Collectives are swept only inside an initialised
``torch.distributed`` job (run under ``torchrun``); the collective row's ``size_B`` follows nccl-tests.
Rows go into the same tables as the importers (``wattcast.data.profiles.tables``).
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from dataclasses import dataclass, field

import pandas as pd

from wattcast.data.collective_ops import busbw_factor
from wattcast.data.kernel_ops import DTYPE_BYTES
from wattcast.data.profiles.devices import catalog_name
from wattcast.data.profiles.tables import Profile, ProfileImportError

_TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: FP32 lanes per SM by compute capability (CUDA C Programming Guide, "Arithmetic Instructions" throughput table)
_FP32_LANES = {(6, 0): 64, (6, 1): 128, (7, 0): 64, (7, 2): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128,
               (8, 9): 128, (9, 0): 128, (10, 0): 128, (12, 0): 128}


@dataclass
class SweepOptions:
    dtypes: tuple[str, ...] = ("fp32",)
    quick: bool = False
    warmup: int = 3
    repeats: int = 5
    inner: int = 10
    collectives: bool = True
    #: each timed loop runs at least this long (inner calls are raised to reach it), so launch gaps and the
    #: timer's resolution stay small against the measured time
    min_loop_ms: float = 1.0
    #: average power is reported only when the timed loops of a point last this long in total: NVML's energy
    #: counter advances in steps of a few ms to tens of ms depending on the GPU
    min_power_window_ms: float = 200.0


@dataclass
class SweepPoint:
    op: str
    shape: dict
    dtype: str


def sweep_plan(opts: SweepOptions) -> list[SweepPoint]:
    """GEMM (bmm, linear), elementwise, LayerNorm/RMSNorm and softmax shapes per dtype (small set with ``quick``)."""
    gemm = [(1, 64, 64, 64), (4, 128, 256, 128)] if opts.quick else [
        (b, m, n, k) for b in (1, 8) for m in (256, 1024, 4096) for n in (256, 1024, 4096) for k in (256, 1024, 4096)]
    vec = [(64, 256), (256, 1024)] if opts.quick else [(b, h) for b in (256, 1024, 8192) for h in (512, 1024, 4096, 8192)]
    ew = ("add", "mul", "addu", "gelu", "relu") if opts.quick else ("add", "mul", "div", "addu", "mulu", "gelu", "relu", "tanh", "silu", "copy")
    pts = []
    for dt in opts.dtypes:
        for b, m, n, k in gemm:
            pts.append(SweepPoint("bmm", {"B": b, "M": m, "N": n, "K": k}, dt))
            pts.append(SweepPoint("linear", {"B": b, "M": m, "N": n, "K": k}, dt))
        if dt == "tf32":
            continue  # TF32 changes matmuls only
        for b, h in vec:
            for op in (*ew, "ln", "rmsnorm", "softmax"):
                pts.append(SweepPoint(op, {"B": b, "H": h}, dt))
    return pts


class CpuBackend:
    name = "cpu"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.device = torch.device("cpu")
        self.device_name = "cpu"

    def sync(self) -> None:
        pass

    def time_ms(self, fn, iters: int) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            fn()
        return (time.perf_counter_ns() - t0) / 1e6

    def energy_mj(self) -> float | None:
        return None

    def spec(self) -> dict:
        return {"name": "cpu", "backend": "cpu"}

    def set_tf32(self, on: bool) -> None:
        pass


class CudaBackend:
    name = "cuda"

    def __init__(self, index: int = 0) -> None:
        import torch

        if not torch.cuda.is_available():
            raise ProfileImportError("no CUDA GPU visible to torch (torch.cuda.is_available() is False); "
                                     "use --backend cpu to check the sweep on the CPU")
        self.torch = torch
        self.device = torch.device("cuda", index)
        self.index = index
        self.props = torch.cuda.get_device_properties(index)
        self.device_name = self.props.name
        self.nvml = None
        try:  # optional extra: pip install 'wattcast[gpu]' (nvidia-ml-py)
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # no NVML library / no permission: times are still measured
            self.nvml = None

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def time_ms(self, fn, iters: int) -> float:
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    def energy_mj(self) -> float | None:
        if self.nvml is None:
            return None
        try:
            return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception:  # pre-Volta GPUs have no energy counter
            return None

    def set_tf32(self, on: bool) -> None:
        self.torch.backends.cuda.matmul.allow_tf32 = on

    def spec(self) -> dict:
        """The device spec fields the driver knows (peaks from the per-SM lane table; others need the datasheet)."""
        p = self.props
        cc = (p.major, p.minor)
        out = {"name": p.name, "backend": "cuda", "num_sms": p.multi_processor_count,
               "memory_gb": round(p.total_memory / 1e9, 2), "compute_capability": f"{p.major}.{p.minor}",
               "catalog_name": catalog_name(p.name)}
        if self.nvml is not None:
            n = self.nvml
            try:
                sm_mhz = n.nvmlDeviceGetMaxClockInfo(self.handle, n.NVML_CLOCK_SM)
                mem_mhz = n.nvmlDeviceGetMaxClockInfo(self.handle, n.NVML_CLOCK_MEM)
                bus = n.nvmlDeviceGetMemoryBusWidth(self.handle)
                out["boost_clock_mhz"] = sm_mhz
                # DDR: two transfers per memory clock (NVML reports the memory clock of HBM/GDDR interfaces)
                out["memory_bandwidth_gbps"] = round(2 * mem_mhz * 1e6 * bus / 8 / 1e9, 1)
                out["tdp_w"] = n.nvmlDeviceGetPowerManagementDefaultLimit(self.handle) / 1000.0
                lanes = _FP32_LANES.get(cc)
                if lanes:
                    out["cores_per_sm"] = lanes
                    out["peak_fp32_tflops"] = round(2 * lanes * p.multi_processor_count * sm_mhz * 1e6 / 1e12, 3)
            except Exception as e:  # a field the driver does not expose: say so in the spec
                out["driver_note"] = f"NVML query failed: {e}"
        return out


def make_backend(kind: str = "auto"):
    if kind not in ("auto", "cpu", "cuda"):
        raise ProfileImportError(f"--backend must be auto, cpu or cuda, got {kind!r}")
    try:
        import torch
    except ImportError:
        raise ProfileImportError("the collector needs PyTorch: pip install 'wattcast[train]'") from None
    if kind == "cpu" or (kind == "auto" and not torch.cuda.is_available()):
        return CpuBackend()
    return CudaBackend()


def _op_fn(torch, pt: SweepPoint, dev):
    """(callable running the op once, bytes it moves) on fresh tensors of the point's shape and dtype."""
    dt = getattr(torch, _TORCH_DTYPES[pt.dtype])
    s = pt.shape
    if pt.op in ("bmm", "linear"):
        b, m, n, k = s["B"], s["M"], s["N"], s["K"]
        x = torch.randn(b, m, n, device=dev, dtype=dt)
        if pt.op == "bmm":
            y = torch.randn(b, n, k, device=dev, dtype=dt)
            return lambda: torch.bmm(x, y)
        w = torch.randn(k, n, device=dev, dtype=dt)
        bias = torch.randn(k, device=dev, dtype=dt)
        return lambda: torch.nn.functional.linear(x, w, bias)
    b, h = s["B"], s["H"]
    x = torch.randn(b, h, device=dev, dtype=dt)
    y = torch.randn(b, h, device=dev, dtype=dt)
    w = torch.ones(h, device=dev, dtype=dt)
    fns = {"add": lambda: x + y, "mul": lambda: x * y, "div": lambda: x / y, "sub": lambda: x - y,
           "addu": lambda: x + 1.5, "mulu": lambda: x * 1.5, "gelu": lambda: torch.nn.functional.gelu(x),
           "relu": lambda: torch.relu(x), "tanh": lambda: torch.tanh(x), "silu": lambda: torch.nn.functional.silu(x),
           "copy": lambda: y.copy_(x), "softmax": lambda: torch.softmax(x, -1),
           "ln": lambda: torch.nn.functional.layer_norm(x, (h,), w, w),
           "rmsnorm": lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w}
    if pt.op not in fns:
        raise ProfileImportError(f"the collector has no kernel for op {pt.op!r}")
    return fns[pt.op]


def measure(backend, fn, opts: SweepOptions) -> tuple[float, float | None]:
    """(median ms per call, average power W over the timed loops or None)."""
    for _ in range(max(opts.warmup, 1)):
        fn()
    backend.sync()
    one = backend.time_ms(fn, 1)
    inner = max(opts.inner, math.ceil(opts.min_loop_ms / one) if one > 0 else opts.inner)
    e0 = backend.energy_mj()
    t0 = time.perf_counter()
    loops = [backend.time_ms(fn, inner) / inner for _ in range(opts.repeats)]
    # with an energy counter, keep timing until the window is long enough for it to resolve the average power
    while e0 is not None and (time.perf_counter() - t0) * 1000.0 < opts.min_power_window_ms:
        loops.append(backend.time_ms(fn, inner) / inner)
    backend.sync()
    e1 = backend.energy_mj()
    wall_ms = (time.perf_counter() - t0) * 1000.0
    power = (e1 - e0) / wall_ms if e0 is not None and e1 is not None and wall_ms >= opts.min_power_window_ms else None  # mJ/ms = W
    return statistics.median(loops), power


def _collective_rows(backend, opts: SweepOptions, device_name: str) -> list[dict]:
    torch = backend.torch
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return []
    world = dist.get_world_size()
    sizes = [1 << 10, 1 << 20] if opts.quick else [1 << p for p in range(10, 31, 2)]
    rows = []
    for dt in opts.dtypes:
        if dt == "tf32":
            continue
        tdt = getattr(torch, _TORCH_DTYPES[dt])
        eb = DTYPE_BYTES[dt]
        for size in sizes:
            n = max(size // eb, world)
            n -= n % world
            buf = torch.ones(n, device=backend.device, dtype=tdt)
            out = torch.empty(n, device=backend.device, dtype=tdt)
            shard = torch.empty(n // world, device=backend.device, dtype=tdt)
            cases = {"all_reduce": lambda: dist.all_reduce(buf),
                     "all_gather": lambda: dist.all_gather_into_tensor(out, shard),
                     "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, out)}
            for op, fn in cases.items():
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", FutureWarning)
                        ms, _ = measure(backend, fn, opts)
                except (RuntimeError, AttributeError) as e:  # a backend without this collective (gloo)
                    rows.append({"op": op, "size_B": n * eb, "reason": f"not run: {str(e).splitlines()[0][:120]}"})
                    continue
                algbw = n * eb / (ms * 1e-3) / 1e9  # GB/s
                factor = busbw_factor(op, world)  # nccl-tests' (all_reduce, all_gather, reduce_scatter here)
                rows.append({"op": op, "size_B": n * eb, "dtype": dt, "world_size": world, "time_us": ms * 1000.0,
                             "algbw_GBs": algbw, "busbw_GBs": algbw * factor,
                             "device_name": device_name, "Device": catalog_name(device_name), "reason": "",
                             "source": f"collector:{backend.name}"})
    return rows


def run_sweep(backend, opts: SweepOptions, progress=None) -> tuple[Profile, dict]:
    torch = backend.torch
    plan = sweep_plan(opts)
    dname = backend.device_name
    dev_cat = catalog_name(dname)
    krows, prows = [], []
    failed = 0
    for i, pt in enumerate(plan):
        try:
            backend.set_tf32(pt.dtype == "tf32")
            fn = _op_fn(torch, pt, backend.device)
            ms, watts = measure(backend, fn, opts)
        except (RuntimeError, TypeError) as e:  # a dtype/op this device or build cannot run: kept, with the reason
            krows.append({"OPName": pt.op, **pt.shape, "dtype": pt.dtype, "latency_ms": math.nan, "Device": dev_cat,
                          "device_name": dname, "reason": f"not measured: {str(e).splitlines()[0][:160]}",
                          "source": f"collector:{backend.name}"})
            failed += 1
            continue
        krows.append({"OPName": pt.op, **pt.shape, "dtype": pt.dtype, "latency_ms": ms, "Device": dev_cat,
                      "device_name": dname, "n_kernels": 1, "aten_op": "", "kernel": "", "reason": "",
                      "source": f"collector:{backend.name}"})
        if watts is not None:
            prows.append({"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), "Device": dev_cat, "device_name": dname,
                          "gpu_index": getattr(backend, "index", 0), "power_w": watts, "gpu_util_pct": math.nan,
                          "source": f"collector:{backend.name}:{pt.op}[{pt.dtype}]"})
        if progress:
            progress(i + 1, len(plan))
        del fn
    backend.set_tf32(False)
    prof = Profile()
    prof.add("kernels", pd.DataFrame(krows))
    prof.add("power", pd.DataFrame(prows))
    crows = _collective_rows(backend, opts, dname) if opts.collectives else []
    prof.add("collectives", pd.DataFrame(crows))
    notes = {"format": "collector", "backend": backend.name, "device": [dname], "spec": backend.spec(),
             "kernel_rows": len(krows), "failed_points": failed, "collective_rows": len(crows),
             "power_rows": len(prows), "options": opts.__dict__}
    prof.files.append(notes)
    return prof, notes
