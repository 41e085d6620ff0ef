"""Profiling files in (Kineto traces, nccl-tests logs), measurement tables out; `wattcast validate trace`."""

from __future__ import annotations

import gzip
import json

import pytest

from conftest import run_cli
from wattcast.data.profile_import import ProfileImportError, read_kineto, read_nccl_tests


def _trace(tmp_path, events, name="t.json", props=True):
    d = {"traceEvents": events}
    if props:
        d["deviceProperties"] = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}]
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def _op(name, ts, dur, dims, types, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"Input Dims": dims, "Input type": types}}


def _launch(ts, corr, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid, "ts": ts, "dur": 2,
            "args": {"correlation": corr}}


def _kernel(name, ts, dur, corr):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": {"correlation": corr}}


def test_kineto_ops_map_to_their_kernels_with_shapes(tmp_path):
    ev = [
        _op("aten::linear", 0, 100, [[8, 512], [256, 512], [256]], ["c10::BFloat16"] * 3),
        _op("aten::addmm", 10, 80, [[256], [8, 512], [512, 256], [], []], ["c10::BFloat16"] * 3 + ["Scalar"] * 2),
        _launch(20, 11), _launch(30, 12),  # a split-K GEMM: two kernels, one row
        _op("aten::mul", 200, 30, [[4, 1024], [4, 1024]], ["float", "float"]),
        _launch(210, 13),
        _op("aten::softmax", 300, 30, [[64, 2048]], ["c10::Half"]),
        _launch(305, 14),
        _launch(400, 15),  # launched outside any op
        _kernel("sm90_xmma_gemm_bf16", 1000, 20, 11), _kernel("splitk_reduce", 1020, 5, 12),
        _kernel("vectorized_elementwise_kernel", 1100, 4, 13), _kernel("softmax_warp_forward", 1200, 6, 14),
        _kernel("some_kernel", 1300, 3, 15), _kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 1400, 50, 99),
    ]
    r = read_kineto(_trace(tmp_path, ev))
    assert r["device"] == "H100-SXM5-80GB" and r["kernel_ms"] == pytest.approx(0.088)
    k = r["kernels"].set_index("aten_op", drop=False)
    gemm = k.loc["aten::addmm"]
    assert (gemm.OPName, gemm.B, gemm.M, gemm.N, gemm.K, gemm["dtype"]) == ("linear", 1, 8, 512, 256, "bf16")
    assert gemm.Latency == pytest.approx(0.025) and gemm.kernels == 2  # both kernels of the op, summed
    mul = k.loc["aten::mul"]
    assert (mul.OPName, mul.B, mul.H, mul["dtype"]) == ("mul", 4, 1024, "fp32")
    sm = k.loc["aten::softmax"]
    assert (sm.OPName, sm.B, sm.H, sm["dtype"]) == ("softmax", 64, 2048, "fp16")
    orphan = r["kernels"][r["kernels"]["aten_op"] == ""]
    assert len(orphan) == 1 and orphan.iloc[0]["OPName"] == "" and orphan.iloc[0]["Latency"] == pytest.approx(0.003)
    c = r["collectives"]
    assert list(c["op"]) == ["all_reduce"] and c["time_ms"].iloc[0] == pytest.approx(0.05)


@pytest.mark.parametrize("content,msg", [
    (b"\x1f\x8b\x08\x00garbage", "not a readable"),
    (json.dumps({"traceEvents": "x"}).encode(), "no 'traceEvents' list"),
    (json.dumps({"traceEvents": [{"cat": "cpu_op", "ph": "X", "ts": 0, "dur": 1, "name": "a"}]}).encode(), "no GPU kernel"),
])
def test_bad_traces_are_named(tmp_path, content, msg):
    p = tmp_path / ("bad.json.gz" if content.startswith(b"\x1f") else "bad.json")
    p.write_bytes(content)
    with pytest.raises(ProfileImportError, match=msg):
        read_kineto(p)


def test_truncated_gzip_trace(tmp_path):
    p = tmp_path / "cut.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": [' * 50)[:40])
    with pytest.raises(ProfileImportError, match="cut.json.gz"):
        read_kineto(p)
    r = run_cli("validate", "trace", str(p), "--device", "H100-SXM5-80GB", "--json")
    assert r.returncode == 2 and "cut.json.gz" in r.stderr and "Traceback" not in r.stderr


NCCL_LOG = """# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20
# Using devices
#  Rank  0 Group  0 Pid  1 on node1 device  0 [0x07] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  2 on node1 device  1 [0x0a] NVIDIA H100 80GB HBM3
# ./build/all_reduce_perf -b 8 -e 128M -f 2 -g 1
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576        262144     float     sum      -1    20.10   52.17   52.17      0    19.80   52.96   52.96      0
   134217728      33554432     float     sum      -1   400.5  335.13  335.13      0   399.1  336.30  336.30      0
# Avg bus bandwidth    : 193.65
"""


def test_nccl_tests_log(tmp_path):
    p = tmp_path / "ar.txt"
    p.write_text(NCCL_LOG)
    t = read_nccl_tests(p)
    assert list(t["op"]) == ["all_reduce", "all_reduce"] and list(t["bytes"]) == [1048576, 134217728]
    assert t["time_ms"].tolist() == pytest.approx([0.0201, 0.4005]) and set(t["group_size"]) == {2}
    bad = tmp_path / "empty.txt"
    bad.write_text("# all_reduce_perf\nnothing here\n")
    with pytest.raises(ProfileImportError, match="no nccl-tests result lines"):
        read_nccl_tests(bad)


def test_profile_import_cli(tmp_path):
    ev = [_op("aten::mm", 0, 50, [[128, 256], [256, 64]], ["float", "float"]), _launch(10, 1),
          _kernel("gemm", 100, 9, 1), _kernel("orphan", 200, 2, 77)]
    trace = _trace(tmp_path, ev)
    log = tmp_path / "ar.log"
    log.write_text(NCCL_LOG)
    out = tmp_path / "tables"
    r = run_cli("profile", "import", str(trace), str(log), "--output", str(out))
    assert r.returncode == 0, r.stderr
    import pandas as pd

    k = pd.read_csv(out / "kernels.csv")
    assert list(k["OPName"]) == ["bmm"] and (k.M[0], k.N[0], k.K[0]) == (128, 256, 64) and k.Latency[0] == pytest.approx(0.009)
    assert len(pd.read_csv(out / "unmatched_kernels.csv")) == 1 and len(pd.read_csv(out / "collectives.csv")) == 2
    # the imported table is what `wattcast kernels` reads
    p = run_cli("kernels", "--device", "H100-SXM5-80GB", "--input", str(out / "kernels.csv"), "--output", str(tmp_path / "p.csv"))
    assert p.returncode == 0, p.stderr


@pytest.mark.e2e
def test_validate_trace_on_a_real_a100_trace(data_root):
    f = data_root / "traces" / "a100_trace_diff_control.json.gz"
    r = run_cli("validate", "trace", str(f), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for key in ("rows", "mape_pct", "bias_pct", "by_op", "measured_busy_ms", "predicted_busy_ms"):
        assert key in d
    assert d["device"] == "A100-SXM4-40GB" and d["rows"] > 5000
    assert {"bmm", "linear", "elementwise", "layernorm"} <= set(d["by_op"])
    for st in d["by_op"].values():
        assert set(st) == {"rows", "mape_pct", "bias_pct"}
    assert d["measured_busy_ms"] > 100 and d["predicted_busy_ms"] > 0
    # the GPU named in the trace is not in the catalog for the MI250 trace: --device is needed
    m = run_cli("validate", "trace", str(data_root / "traces" / "mi250_minitoy_train.json.gz"))
    assert m.returncode == 2 and "give --device" in m.stderr
    m = run_cli("validate", "trace", str(data_root / "traces" / "mi250_minitoy_train.json.gz"), "--device", "MI250", "--json")
    assert m.returncode == 0 and json.loads(m.stdout)["rows"] == 5
