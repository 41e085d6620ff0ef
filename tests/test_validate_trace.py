"""`wattcast validate trace`: the JSON contract, the arithmetic against the public predictor, bad input, and the
real PyTorch-profiler traces in ../shared/datasets/traces (e2e)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from conftest import flat, run_cli
from test_profile_import import TraceBuilder, _trace

CONTRACT = ("rows", "mape_pct", "bias_pct", "by_op", "measured_busy_ms", "predicted_busy_ms")


def test_validate_trace_json_contract_and_arithmetic(tmp_path):
    import wattcast
    from wattcast.data.profiles.kineto import import_kineto

    trace = _trace(tmp_path)
    r = run_cli("validate", "trace", str(trace), "--device", "A100-SXM4-40GB", "--json", "--output", str(tmp_path / "rows.csv"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in CONTRACT:
        assert key in out
    for cls, v in out["by_op"].items():
        assert {"rows", "mape_pct", "bias_pct"} <= set(v)
    # recompute from the importer + the public predictor
    k, _, _ = import_kineto(trace)
    k = k[k["OPName"] != ""].reset_index(drop=True)
    frame = k[["OPName", "B", "M", "N", "K", "H", "dtype"]].astype({c: float for c in "BMNKH"})
    pred = wattcast.predict_kernels(frame, "A100-SXM4-40GB")["pred_latency_ms"].to_numpy()
    meas = k["latency_ms"].to_numpy(float)
    rel = (pred - meas) / meas * 100
    assert out["rows"] == len(k) == 7
    assert out["mape_pct"] == pytest.approx(np.mean(np.abs(rel)))
    assert out["bias_pct"] == pytest.approx(np.mean(rel))
    assert out["measured_busy_ms"] == pytest.approx(meas.sum())
    assert out["predicted_busy_ms"] == pytest.approx(pred.sum())
    assert out["by_op"]["linear"]["rows"] == 1 and out["by_op"]["bmm"]["rows"] == 2
    assert out["unmapped_rows"] == 3 and sum(out["unmapped_reasons"].values()) == 3
    rows = pd.read_csv(tmp_path / "rows.csv")
    assert len(rows) == 7 and {"latency_ms", "pred_latency_ms", "error_pct", "op_class"} <= set(rows.columns)
    # the table form prints the per-class figures and the unmapped reasons
    r = run_cli("validate", "trace", str(trace), "--device", "a100")
    assert r.returncode == 0 and "linear" in r.stdout and "not compared" in flat(r.stdout)


def test_validate_trace_bad_input(tmp_path):
    b = TraceBuilder()
    b.op("aten::mm", None, None)  # recorded without shapes
    noshape = b.write(tmp_path / "noshape.json")
    r = run_cli("validate", "trace", str(noshape), "--device", "a100", "--json")
    assert r.returncode == 2 and "record_shapes" in flat(r.stderr) and "Traceback" not in r.stderr
    r = run_cli("validate", "trace", str(_trace(tmp_path)), "--device", "no-such-gpu")
    assert r.returncode == 2 and "--device" in flat(r.stderr)
    trunc = tmp_path / "t.json.gz"
    trunc.write_bytes(trunc.read_bytes()[:64])
    r = run_cli("validate", "trace", str(trunc), "--device", "a100")
    assert r.returncode == 2 and "truncated" in flat(r.stderr) and "Traceback" not in r.stderr


def test_trace_without_device_names_each_commands_flag(tmp_path):
    """A trace recording no GPU: validate trace asks for its own --trace-device (its --device is the GPU predicted on,
    already given), profile import for its --device; with --trace-device the validation runs."""
    b = TraceBuilder(devices=())
    b.doc.pop("deviceProperties")
    b.op("aten::mm", [[32, 64], [64, 16]], ["c10::Half", "c10::Half"], kernels=(("ampere_fp16_gemm", 8.0),))
    trace = b.write(tmp_path / "nodev.json", gz=False)
    r = run_cli("validate", "trace", str(trace), "--device", "A100-SXM4-40GB")
    msg = flat(r.stderr)
    assert r.returncode == 2 and "records no GPU" in msg and "(--trace-device)" in msg and "(--device)" not in msg, msg
    r = run_cli("profile", "import", str(trace), "--output", str(tmp_path / "prof"))
    assert r.returncode == 2 and "records no GPU" in flat(r.stderr) and "(--device)" in flat(r.stderr)
    r = run_cli("validate", "trace", str(trace), "--device", "A100-SXM4-40GB", "--trace-device", "A100-SXM4-40GB", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"] == 1


# ----------------------------------------------------------------------------- real traces
@pytest.mark.e2e
@pytest.mark.parametrize("name, device, trace_gpu", [
    ("a100_trace_diff_control.json.gz", "A100-SXM4-40GB", "NVIDIA A100-PG509-200"),
    # despite its name this HTA trace ran on V100s (deviceProperties)
    ("a100_trace_diff_test.json.gz", "V100-SXM2-16GB", "Tesla V100-SXM2-16GB"),
])
def test_validate_real_trace(traces, name, device, trace_gpu):
    r = run_cli("validate", "trace", str(traces / name), "--device", device, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["trace_devices"] == [trace_gpu] and out["trace_catalog_devices"] == [device]
    assert out["rows"] > 2500 and {"bmm", "linear", "elementwise", "layernorm"} <= set(out["by_op"])
    assert sum(v["rows"] for v in out["by_op"].values()) == out["rows"]
    assert out["rows"] + out["unmapped_rows"] == out["kernel_rows"]
    assert out["measured_busy_ms"] < out["trace_busy_ms"]
    assert out["trace_busy_ms"] == pytest.approx(out["compute_busy_ms"] + out["comm_busy_ms"])
    assert out["union_busy_ms"] <= out["trace_busy_ms"] + 1e-9
    assert all(np.isfinite(v["mape_pct"]) and np.isfinite(v["bias_pct"]) for v in out["by_op"].values())


@pytest.mark.e2e
def test_import_real_traces(traces, tmp_path):
    files = [traces / n for n in ("a100_nccl_data.json.gz", "v100_rank0.json.gz", "mi250_minitoy_train.json.gz")]
    r = run_cli("profile", "import", *map(str, files), "--output", str(tmp_path / "p"))
    assert r.returncode == 0, r.stderr
    from wattcast.data.profiles.tables import read_table

    c = read_table(tmp_path / "p", "collectives")
    ar = c[c["op"] == "all_reduce"]
    # record_param_comms of the NCCL trace: 'In msg nelems' x 4 B (Float), group of 2
    assert len(ar) and (ar["size_B"] % 4 == 0).all() and set(ar["world_size"].dropna()) == {2}
    text = flat(r.stderr)
    assert "record_shapes=True" in text  # the shape-less traces are reported, their rows kept unmapped
    # the MI250 trace names its GPU 'AMD Radeon Graphics': no catalog device, said, not guessed ...
    assert "AMD Radeon Graphics" in text and "not in the catalog" in text
    k = read_table(tmp_path / "p", "kernels")
    assert set(k.loc[k["source"].str.contains("mi250"), "Device"].fillna("")) == {""}
    # ... and --device names it
    r = run_cli("profile", "import", str(traces / "mi250_minitoy_train.json.gz"), "--output", str(tmp_path / "q"), "--device", "MI250")
    assert r.returncode == 0 and set(read_table(tmp_path / "q", "kernels")["Device"]) == {"MI250"}
    r = run_cli("validate", "trace", str(traces / "v100_rank0.json.gz"), "--device", "V100-SXM2-32GB", "--json")
    assert r.returncode == 2 and "record_shapes" in flat(r.stderr)


@pytest.mark.e2e
def test_in_step_comparison_takes_the_isolated_timing_floor_off(traces):
    """--in-step compares the kernel times a predicted step uses (FP32 without NeuSight's one-op-at-a-time floor):
    on the A100 trace's many microsecond kernels the isolated latencies over-predict several-fold, the in-step ones
    do not."""
    f = str(traces / "a100_trace_diff_control.json.gz")
    iso = json.loads(run_cli("validate", "trace", f, "--device", "A100-SXM4-40GB", "--json").stdout)
    r = run_cli("validate", "trace", f, "--device", "A100-SXM4-40GB", "--in-step", "--json")
    assert r.returncode == 0, r.stderr
    step = json.loads(r.stdout)
    assert step["rows"] == iso["rows"]
    assert step["predicted_busy_ms"] < iso["predicted_busy_ms"] and step["mape_pct"] < iso["mape_pct"] / 2


@pytest.mark.e2e
def test_in_step_elementwise_kernels_take_the_gpu_floor(traces):
    """In a step a microsecond kernel takes the GPU-side floor plus its roofline time (GPU_KERNEL_FLOOR_MS, fitted on
    half of the A100 trace): the in-step elementwise rows were -68% on both traces (costed at their roofline, ~ns),
    now within -30%; the V100 trace played no part in the fit."""
    for name, device in (("a100_trace_diff_control", "A100-SXM4-40GB"), ("a100_trace_diff_test", "V100-SXM2-16GB")):
        r = run_cli("validate", "trace", str(traces / f"{name}.json.gz"), "--device", device, "--in-step", "--json")
        assert r.returncode == 0, r.stderr
        ew = json.loads(r.stdout)["by_op"]["elementwise"]
        assert ew["bias_pct"] > -30 and ew["mape_pct"] < 35, (name, ew)


def test_validate_trace_busy_counts_nccl_kernels_overlap_and_steps(tmp_path):
    """trace_busy_ms is every kernel (the README's 'all kernels'), NCCL included; the split, the union of busy
    intervals (an NCCL kernel overlapping a GEMM on another stream counts once) and the ProfilerStep# spans."""
    b = TraceBuilder(world_size=2)
    b.op("aten::mm", [[32, 64], [64, 16]], ["float", "float"], kernels=(("gemm", 50.0),))
    b.op("c10d::allreduce_", None, None, kernels=(("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", 100.0),),
         parent=("record_param_comms", {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1000,
                                        "Out msg nelems": 1000, "Group size": 2}))
    ks = [e for e in b.events if e.get("cat") == "kernel"]
    gemm, nccl = ks[0], ks[1]
    nccl.update(ts=gemm["ts"] + 10, tid=21)  # another stream: [g+10, g+110) overlaps the GEMM [g, g+50)
    b.events += [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 900, "dur": 700},
                 {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1, "ts": 1600, "dur": 900},
                 {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#3", "pid": 0, "tid": 7, "ts": 1100, "dur": 123}]
    trace = b.write(tmp_path / "o.json.gz")
    r = run_cli("validate", "trace", str(trace), "--device", "a100", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["kernels"] == 2 and out["comm_kernels"] == 1
    assert out["compute_busy_ms"] == pytest.approx(0.050) and out["comm_busy_ms"] == pytest.approx(0.100)
    assert out["trace_busy_ms"] == pytest.approx(0.150)
    assert out["union_busy_ms"] == pytest.approx(0.110) and out["overlap_ms"] == pytest.approx(0.040)
    # the steps' GPU spans: #3 launched both kernels ([1110, 1220) us on the GPU), #4 nothing (dropped, counted);
    # the CPU-side spans 0.7 / 0.9 ms kept apart (until stop 47 they were the step times)
    assert out["steps"] == 1 and out["step_ms_min"] == pytest.approx(0.110) and out["steps_without_gpu"] == 1
    assert out["step_cpu_ms_min"] == pytest.approx(0.7) and out["step_cpu_ms_max"] == pytest.approx(0.9)
    assert out["unmapped_busy_ms"] == pytest.approx(out["compute_busy_ms"] - out["measured_busy_ms"])
    r = run_cli("validate", "trace", str(trace), "--device", "a100")
    assert r.returncode == 0 and "NCCL 0.100" in flat(r.stdout) and "union of busy intervals 0.110" in flat(r.stdout)


def test_union_of_intervals():
    from wattcast.data.profiles.busy import union_us

    assert union_us([0, 10, 5, 30], [10, 20, 8, 31]) == 21.0  # [0,20) + [30,31)
    assert union_us([], []) == 0.0
