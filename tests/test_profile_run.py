"""`wattcast profile run`: the sweep collector on the CPU timer backend (the GPU backend shares every step but the
timer, the energy counter and the spec query)."""

from __future__ import annotations

import itertools

import pytest

from conftest import flat, run_cli
from wattcast.data.profiles.tables import read_table

torch = pytest.importorskip("torch")

from wattcast.data.profiles.collector import CpuBackend, SweepOptions, measure, run_sweep, sweep_plan  # noqa: E402

FAST = SweepOptions(quick=True, warmup=1, repeats=2, inner=1, min_loop_ms=0.0, collectives=False)


def test_sweep_plan_covers_the_families():
    ops = {p.op for p in sweep_plan(SweepOptions(quick=True, dtypes=("fp16", "tf32")))}
    assert {"bmm", "linear", "add", "gelu", "ln", "rmsnorm", "softmax"} <= ops
    tf32 = [p for p in sweep_plan(SweepOptions(quick=True, dtypes=("tf32",)))]
    assert {p.op for p in tf32} == {"bmm", "linear"}  # TF32 only changes matmuls
    assert len(sweep_plan(SweepOptions())) > 10 * len(sweep_plan(SweepOptions(quick=True)))


def test_cpu_sweep_rows():
    # a median of three timed loops after two warm-ups: one scheduling spike on a loaded CI machine (1x64x64x64 once
    # read 1.70 ms against 0.34 ms for 4x128x256x128 with FAST's two loops, whose median is their mean) cannot order them
    robust = SweepOptions(quick=True, warmup=2, repeats=3, inner=1, min_loop_ms=0.0, collectives=False)
    prof, notes = run_sweep(CpuBackend(), robust)
    k = prof.table("kernels")
    assert notes["failed_points"] == 0 and len(k) == len(sweep_plan(robust))
    assert (k["latency_ms"] > 0).all() and set(k["dtype"]) == {"fp32"}
    big = k[(k["OPName"] == "bmm")].sort_values("M")
    assert big["latency_ms"].iloc[-1] > big["latency_ms"].iloc[0]  # 4x128x256x128 costs more than 1x64x64x64
    assert prof.table("power").empty  # no energy counter on the CPU


class EnergyBackend(CpuBackend):
    """The CPU timer with an energy counter advancing at a constant 250 W of wall time (what NVML reports)."""

    name = "fake-gpu"

    def __init__(self):
        super().__init__()
        import time

        self._t = time.perf_counter
        self.device_name = "NVIDIA A100-SXM4-40GB"

    def energy_mj(self):
        return self._t() * 1000.0 * 250.0  # mJ


def test_energy_counter_gives_average_power():
    be = EnergyBackend()
    x = torch.randn(64, 64)
    ms, watts = measure(be, lambda: x @ x, SweepOptions(warmup=1, repeats=2, inner=1, min_loop_ms=0.0, min_power_window_ms=20.0))
    assert ms > 0 and watts == pytest.approx(250.0, rel=0.05)
    prof, notes = run_sweep(be, SweepOptions(quick=True, warmup=1, repeats=1, inner=1, min_loop_ms=0.0,
                                             min_power_window_ms=5.0, collectives=False))
    p = prof.table("power")
    assert len(p) == notes["power_rows"] == notes["kernel_rows"]
    assert set(p["Device"]) == {"A100-SXM4-40GB"} and p["power_w"].between(200, 300).all()


def test_failed_points_are_kept_with_a_reason():
    class Failing(CpuBackend):
        calls = itertools.count()

        def time_ms(self, fn, iters):
            if next(self.calls) % 7 == 3:
                raise RuntimeError("CUDA error: out of memory\nmore")
            return super().time_ms(fn, iters)

    prof, notes = run_sweep(Failing(), FAST)
    k = prof.table("kernels")
    bad = k[k["reason"].fillna("") != ""]
    assert notes["failed_points"] == len(bad) > 0 and bad["reason"].str.contains("out of memory").all()
    assert bad["latency_ms"].isna().all()


def test_collectives_inside_a_distributed_job(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        prof, notes = run_sweep(CpuBackend(), SweepOptions(quick=True, warmup=1, repeats=1, inner=1, min_loop_ms=0.0))
    finally:
        dist.destroy_process_group()
    c = prof.table("collectives")
    ok = c[c["reason"].fillna("") == ""]
    assert "all_reduce" in set(ok["op"]) and (ok["time_us"] > 0).all() and set(ok["world_size"]) == {1}
    assert notes["collective_rows"] == len(c)


def test_profile_run_cli(tmp_path):
    out = tmp_path / "run"
    r = run_cli("profile", "run", "--backend", "cpu", "--quick", "--repeats", "1", "--output", str(out))
    assert r.returncode == 0, r.stderr
    k = read_table(out, "kernels")
    assert len(k) == len(sweep_plan(SweepOptions(quick=True))) and (out / "device.json").is_file()
    assert "CPU timer backend" in flat(r.stderr)
    r = run_cli("profile", "run", "--backend", "tpu", "--output", str(tmp_path / "x"))
    assert r.returncode == 2 and "--backend" in flat(r.stderr)
    r = run_cli("profile", "run", "--dtype", "fp64", "--output", str(tmp_path / "x"))
    assert r.returncode == 2 and "--dtype" in flat(r.stderr)
    if not torch.cuda.is_available():
        r = run_cli("profile", "run", "--backend", "cuda", "--output", str(tmp_path / "x"))
        assert r.returncode == 2 and "no CUDA GPU" in flat(r.stderr)


def test_profile_run_refuses_an_existing_folder_as_profile_import_does(tmp_path):
    """Audit stop 54 #1: `profile run -o DIR` replaced an import's kernels.csv and deleted its collectives.csv, and
    replaced a user's own kernels.csv / device.json, unsaid (it had no --overwrite)."""
    import json

    run = ("profile", "run", "--backend", "cpu", "--quick", "--repeats", "1", "--no-collectives")
    imp = tmp_path / "P1"
    imp.mkdir()
    (imp / "kernels.csv").write_text("imported\n")
    (imp / "collectives.csv").write_text("imported\n")
    (imp / "notes.txt").write_text("mine\n")
    (imp / "profile.json").write_text(json.dumps({"schema_version": 1, "tool": "wattcast", "files": [],
                                                 "rows": {"kernels": 1, "collectives": 1, "power": 0},
                                                 "written": ["collectives.csv", "kernels.csv"]}))
    r = run_cli(*run, "--output", str(imp))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--overwrite" in flat(r.stderr)
    assert "kernels.csv, collectives.csv, profile.json" in flat(r.stderr)
    assert (imp / "kernels.csv").read_text() == "imported\n" and (imp / "collectives.csv").exists()
    r = run_cli(*run, "--output", str(imp), "--overwrite")  # the import's own tables: replaced / removed
    assert r.returncode == 0, r.stderr
    assert len(read_table(imp, "kernels")) > 1 and not (imp / "collectives.csv").exists()
    assert json.loads((imp / "profile.json").read_text())["written"] == ["device.json", "kernels.csv"]
    assert (imp / "notes.txt").read_text() == "mine\n"
    r = run_cli(*run, "--output", str(imp), "--overwrite")  # a run over a run: its device.json is recorded
    assert r.returncode == 0, r.stderr

    user = tmp_path / "mydata"
    user.mkdir()
    (user / "kernels.csv").write_text("my 600 rows\n")
    (user / "device.json").write_text("{}")
    for extra in ((), ("--overwrite",)):
        r = run_cli(*run, "--output", str(user), *extra)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert "kernels.csv, device.json" in flat(r.stderr)
        assert (user / "kernels.csv").read_text() == "my 600 rows\n" and (user / "device.json").read_text() == "{}"
        assert not (user / "profile.json").exists()


def test_cuda_backend_code_path_with_fake_driver():
    """CudaBackend's timer, energy counter and spec query, run against stand-ins for torch.cuda and pynvml that
    behave as documented (events: elapsed_time in ms; NVML: energy in mJ, clocks in MHz, limits in mW)."""
    import time
    import types

    from wattcast.data.profiles.collector import CudaBackend

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.t = None

        def record(self):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return (end.t - self.t) * 1000.0

    class TorchProxy:
        def __getattr__(self, name):
            return getattr(torch, name)

    fake_torch = TorchProxy()
    fake_torch.cuda = types.SimpleNamespace(Event=Event, synchronize=lambda device=None: None)
    fake_torch.backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=False)))
    t0 = time.perf_counter()
    nvml = types.SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: int((time.perf_counter() - t0) * 1000 * 300),  # 300 W
        nvmlDeviceGetMaxClockInfo=lambda h, which: {1: 1410, 2: 1215}[which],
        nvmlDeviceGetMemoryBusWidth=lambda h: 5120,
        nvmlDeviceGetPowerManagementDefaultLimit=lambda h: 400000)
    be = object.__new__(CudaBackend)
    be.torch, be.device, be.index, be.nvml, be.handle = fake_torch, torch.device("cpu"), 0, nvml, object()
    be.props = types.SimpleNamespace(name="NVIDIA A100-SXM4-40GB", major=8, minor=0, multi_processor_count=108,
                                     total_memory=42505273344)
    be.device_name = be.props.name
    spec = be.spec()
    # A100 SXM4 40 GB datasheet: 19.5 TFLOP/s FP32, 1,555 GB/s, 400 W (NVIDIA A100 datasheet)
    assert spec["catalog_name"] == "A100-SXM4-40GB" and spec["tdp_w"] == 400.0
    assert spec["peak_fp32_tflops"] == pytest.approx(19.49, abs=0.01)
    assert spec["memory_bandwidth_gbps"] == pytest.approx(1555.2)
    prof, notes = run_sweep(be, SweepOptions(quick=True, dtypes=("fp32", "tf32"), warmup=1, repeats=1, inner=1,
                                             min_loop_ms=0.0, min_power_window_ms=5.0, collectives=False))
    k = prof.table("kernels")
    assert notes["failed_points"] == 0 and set(k["Device"]) == {"A100-SXM4-40GB"} and "tf32" in set(k["dtype"])
    assert be.torch.backends.cuda.matmul.allow_tf32 is False  # restored after the sweep
    assert prof.table("power")["power_w"].between(250, 350).all()
