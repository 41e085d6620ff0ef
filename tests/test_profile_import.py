"""Profile importers: PyTorch profiler (Kineto) traces, Nsight Systems SQLite, nccl-tests, nvidia-smi and DCGM logs."""

from __future__ import annotations

import gzip
import json
import sqlite3

import pandas as pd
import pytest

from conftest import flat, run_cli
from wattcast.data.profiles.aten_map import map_aten
from wattcast.data.profiles.importers import detect_format, import_files
from wattcast.data.profiles.kineto import import_kineto
from wattcast.data.profiles.nccl_tests import import_nccl_tests
from wattcast.data.profiles.nsys import import_nsys, parse_range
from wattcast.data.profiles.power_logs import import_dcgm, import_nvidia_smi
from wattcast.data.profiles.tables import ProfileImportError, is_profile_dir, read_table
from wattcast.data.profiles.training_input import kernel_training_rows, split_data_args

A100 = {"id": 0, "name": "NVIDIA A100-PG509-200", "totalGlobalMem": 42505273344, "numSms": 108, "computeMajor": 8}


class TraceBuilder:
    """A small Kineto trace: cpu_ops on one thread, each launching kernels through cuda_runtime + ac2g flows."""

    def __init__(self, devices=(A100,), world_size=None):
        self.events = []
        self.t = 1000.0
        self.corr = 1
        self.doc = {"schemaVersion": 1, "deviceProperties": list(devices)}
        if world_size:
            self.doc["distributedInfo"] = {"backend": "nccl", "rank": 0, "world_size": world_size}

    def op(self, name, dims=None, types=None, kernels=(("kern", 10.0),), args=None, parent=None):
        """A cpu_op (optionally nested in ``parent`` = (name, args)) launching ``kernels`` [(name, dur_us)]."""
        start = self.t
        a = dict(args or {})
        if dims is not None:
            a["Input Dims"], a["Input type"] = dims, types
        dur = 50.0 * (len(kernels) + 1)
        if parent:
            self.events.append({"ph": "X", "cat": "cpu_op", "name": parent[0], "pid": 1, "tid": 1, "ts": start - 1,
                                "dur": dur + 2, "args": parent[1]})
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": start, "dur": dur, "args": a})
        for i, (kname, kdur) in enumerate(kernels):
            ts = start + 10 + 40 * i
            c = self.corr
            self.corr += 1
            self.events += [
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts, "dur": 5,
                 "args": {"correlation": c}},
                {"ph": "s", "cat": "ac2g", "id": c, "pid": 1, "tid": 1, "ts": ts, "name": "ac2g"},
                {"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": 7, "ts": ts + 100, "dur": kdur,
                 "args": {"device": 0, "stream": 7, "correlation": c}},
                {"ph": "f", "cat": "ac2g", "id": c, "pid": 0, "tid": 7, "ts": ts + 100, "name": "ac2g", "bp": "e"},
            ]
        self.t = start + dur + 100

    def orphan_kernel(self, name="orphan", dur=7.0):
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": self.t, "dur": dur,
                            "args": {"device": 0, "correlation": 999999}})

    def write(self, path, gz=True):
        doc = dict(self.doc, traceEvents=self.events)
        data = json.dumps(doc).encode()
        path.write_bytes(gzip.compress(data) if gz else data)
        return path


def _trace(tmp_path, gz=True):
    b = TraceBuilder(world_size=4)
    # addmm: bias first, then x [64, 128] @ w^T [128, 256]; GEMM + split-K reduction kernels are summed
    b.op("aten::addmm", [[256], [64, 128], [128, 256], [], []], ["float", "float", "float", "Scalar", "Scalar"],
         kernels=(("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>", 20.0), ("splitKreduce_kernel", 4.0)))
    # mm of a transposed operand: Input Dims are logical sizes [32, 64] x [64, 16]
    b.op("aten::mm", [[32, 64], [64, 16]], ["c10::Half", "c10::Half"], kernels=(("ampere_fp16_gemm", 8.0),))
    b.op("aten::bmm", [[8, 128, 64], [8, 64, 128]], ["c10::BFloat16", "c10::BFloat16"], kernels=(("bmm_kernel", 30.0),))
    b.op("aten::native_layer_norm", [[4, 16, 512], [], [512], [512], []], ["float", "", "float", "float", "Scalar"])
    b.op("aten::_softmax", [[2, 8, 128, 128], [], []], ["float", "Scalar", "Scalar"])
    b.op("aten::add", [[4, 1024], [], []], ["float", "Scalar", "Scalar"])  # tensor + scalar -> addu
    b.op("aten::mul", [[4, 1024], [1024]], ["float", "float"])  # broadcast -> (4, 1024)
    b.op("aten::embedding_dense_backward", [[10, 8]], ["float"])  # no op class: kept, unmapped
    b.op("aten::add", [[4, 1024], [4, 1024], []], ["double", "double", "Scalar"])  # dtype without a surrogate
    b.op("c10d::allreduce_", None, None, kernels=(("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", 100.0),),
         parent=("record_param_comms", {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1000,
                                        "Out msg nelems": 1000, "Group size": 4}))
    b.orphan_kernel()
    return b.write(tmp_path / ("t.json.gz" if gz else "t.json"), gz=gz)


# ----------------------------------------------------------------------------- aten mapping
def test_aten_gemm_shapes_and_bias_first():
    assert map_aten("aten::addmm", [[256], [64, 128], [128, 256], [], []], ["float"] * 3 + ["Scalar"] * 2)[:3] == \
        ("linear", {"B": 1, "M": 64, "N": 128, "K": 256}, "fp32")
    # a 2-D bias [M, out] is still the first operand, not a matrix of the product
    assert map_aten("aten::addmm", [[64, 256], [64, 128], [128, 256], [], []], ["float"] * 3 + ["Scalar"] * 2)[1] == \
        {"B": 1, "M": 64, "N": 128, "K": 256}
    assert map_aten("aten::mm", [[32, 64], [64, 16]], ["float", "float"])[:2] == ("bmm", {"B": 1, "M": 32, "N": 64, "K": 16})
    assert map_aten("aten::linear", [[2, 10, 128], [256, 128], [256]], ["float"] * 3)[:2] == \
        ("linear", {"B": 1, "M": 20, "N": 128, "K": 256})
    assert map_aten("aten::matmul", [[4, 10, 64], [4, 64, 32]], ["float"] * 2)[:2] == ("bmm", {"B": 4, "M": 10, "N": 64, "K": 32})
    op, _, _, why = map_aten("aten::mm", [[32, 64], [32, 16]], ["float", "float"])
    assert op == "" and "not a matrix product" in why


def test_aten_vector_ops_and_reasons():
    assert map_aten("aten::gelu", [[8, 128, 768], []], ["c10::BFloat16", ""])[:3] == ("gelu", {"B": 1024, "H": 768}, "bf16")
    assert map_aten("aten::mul_", [[8, 64], []], ["float", "Scalar"])[0] == "mulu"
    assert map_aten("aten::copy_", [[3, 5], [3, 5], []], ["float", "float", "Scalar"])[0] == "copy"
    assert map_aten("aten::native_layer_norm", [[6, 4, 32], [], [32], [32], []], ["float", "", "float", "float", "Scalar"])[1] == {"B": 24, "H": 32}
    assert map_aten("aten::cat", [[[2, 3], [2, 3]], []], ["TensorList", "Scalar"])[3].startswith("no wattcast op class")
    assert "record_shapes" in map_aten("aten::mm", None, None)[3]
    assert "backward" in map_aten("aten::gelu_backward", [[4, 4], [4, 4]], ["float", "float"])[3]
    assert "'long'" in map_aten("aten::add", [[4], [4]], ["long", "long"])[3]


# ----------------------------------------------------------------------------- Kineto
@pytest.mark.parametrize("gz", [True, False])
def test_kineto_rows(tmp_path, gz):
    k, c, notes = import_kineto(_trace(tmp_path, gz))
    mapped = k[k["OPName"] != ""].reset_index(drop=True)
    assert list(mapped["OPName"]) == ["linear", "bmm", "bmm", "ln", "softmax", "addu", "mul"]
    lin = mapped.iloc[0]
    assert (lin["M"], lin["N"], lin["K"], lin["n_kernels"]) == (64, 128, 256, 2)
    assert lin["latency_ms"] == pytest.approx(0.024)  # 20 + 4 us, both kernels of the call
    assert lin["dtype"] == "tf32"  # FP32 inputs on a TF32 tensor-core kernel (s1688gemm)
    assert list(mapped["dtype"][1:3]) == ["fp16", "bf16"]
    sm = mapped.iloc[4]
    assert (sm["B"], sm["H"]) == (2 * 8 * 128, 128)
    assert set(k["Device"]) == {"A100-SXM4-40GB"} and set(k["device_name"]) == {"NVIDIA A100-PG509-200"}
    # unmapped rows are kept and counted, never dropped: embedding backward, double add, the orphan kernel
    assert notes["kernel_rows"] == len(k) == 10 and notes["unmapped_rows"] == 3
    assert "kernel with no launch event in the trace (correlation not found)" in notes["unmapped_reasons"]
    (row,) = c.to_dict("records")
    assert (row["op"], row["size_B"], row["world_size"], row["time_us"]) == ("all_reduce", 4000, 4, 100.0)


def test_kineto_bad_inputs(tmp_path):
    good = _trace(tmp_path).read_bytes()
    (tmp_path / "trunc.json.gz").write_bytes(good[: len(good) // 2])
    with pytest.raises(ProfileImportError, match="truncated or damaged gzip"):
        import_kineto(tmp_path / "trunc.json.gz")
    (tmp_path / "half.json").write_text('{"traceEvents": [{"ph": "X"')
    with pytest.raises(ProfileImportError, match="not a JSON trace"):
        import_kineto(tmp_path / "half.json")
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(ProfileImportError, match="traceEvents"):
        import_kineto(tmp_path / "other.json")
    cpu = TraceBuilder()
    cpu.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2, "args": {}})
    with pytest.raises(ProfileImportError, match="CPU-only"):
        import_kineto(cpu.write(tmp_path / "cpu.json"))
    nodev = TraceBuilder(devices=())
    nodev.op("aten::mm", [[2, 2], [2, 2]], ["float", "float"])
    with pytest.raises(ProfileImportError, match="--device"):
        import_kineto(nodev.write(tmp_path / "nodev.json"))
    # with --device the same trace imports
    k, _, _ = import_kineto(tmp_path / "nodev.json", device="V100-SXM2-16GB")
    assert set(k["Device"]) == {"V100-SXM2-16GB"}


def test_kineto_unknown_gpu_keeps_name(tmp_path):
    b = TraceBuilder(devices=({"id": 0, "name": "Mystery GPU 9000"},))
    b.op("aten::mm", [[2, 2], [2, 2]], ["float", "float"])
    k, _, _ = import_kineto(b.write(tmp_path / "m.json"))
    assert list(k["Device"]) == [""] and list(k["device_name"]) == ["Mystery GPU 9000"]


def test_profile_import_cli(tmp_path):
    trace = _trace(tmp_path)
    out = tmp_path / "prof"
    r = run_cli("profile", "import", str(trace), "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert is_profile_dir(out)
    k = read_table(out, "kernels")
    assert len(k) == 10 and (k["OPName"].fillna("") == "").sum() == 3
    assert len(read_table(out, "collectives")) == 1
    meta = json.loads((out / "profile.json").read_text())
    assert meta["rows"]["kernels"] == 10 and meta["files"][0]["format"] == "kineto"
    assert "3 kept unmapped" in flat(r.stderr)
    # bad input: a truncated file is exit 2 with the file named, never a traceback
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(trace.read_bytes()[:100])
    r = run_cli("profile", "import", str(bad), "--output", str(tmp_path / "p2"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "bad.json.gz" in flat(r.stderr)
    r = run_cli("profile", "import", str(tmp_path / "nope.json"), "--output", str(tmp_path / "p3"))
    assert r.returncode == 2 and "does not exist" in flat(r.stderr)
    (tmp_path / "x.txt").write_text("hello\n")
    r = run_cli("profile", "import", str(tmp_path / "x.txt"), "--output", str(tmp_path / "p4"))
    assert r.returncode == 2 and "not a format wattcast imports" in flat(r.stderr)


# ----------------------------------------------------------------------------- Nsight Systems
def _nsys_db(path, with_gpu_table=True):
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
            contextId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER,
            shortName INTEGER, gridX INTEGER, blockX INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER,
            globalTid INTEGER, correlationId INTEGER, nameId INTEGER);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
            category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER);
    """)
    if with_gpu_table:
        con.execute("CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT, busLocation TEXT)")
        con.execute("INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H100 80GB HBM3', '0000:1b:00.0')")
    strings = {1: "sm90_xmma_gemm_bf16bf16", 2: "splitKreduce_kernel", 3: "elementwise_kernel", 4: "unnamed_kernel",
               5: "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", 6: "gelu[bf16] B=8 H=4096", 7: "cudaLaunchKernel"}
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", strings.items())
    tid = 77
    # NVTX ranges (eventType 59 = push/pop range): a GEMM with two kernels, an elementwise op (text via textId),
    # a range in another syntax, and an nccl range with the message size
    con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId) VALUES (?, ?, 59, ?, ?, ?)", [
        (1000, 5000, "bmm[bf16] B=4 M=512 N=64 K=512", tid, None), (6000, 8000, None, tid, 6),
        (9000, 10000, "my forward", tid, None), (11000, 12000, "nccl:all_gather bytes=1048576 group=8", tid, None)])
    kernels = [  # (start, end, correlationId, name id, launch time)
        (2000, 2600, 1, 1, 1100), (2600, 2700, 2, 2, 1200), (7000, 7400, 3, 3, 6100), (9500, 9800, 4, 4, 9100),
        (20000, 20100, 5, 4, 19000), (11500, 11900, 6, 5, 11100)]
    for s, e, c, n, launch in kernels:
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, correlationId, globalPid, demangledName, shortName) "
                    "VALUES (?, ?, 0, ?, 1, ?, ?)", (s, e, c, n, n))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, 7)", (launch, launch + 50, tid, c))
    con.commit()
    con.close()
    return path


def test_nsys_sqlite(tmp_path):
    db = _nsys_db(tmp_path / "run.sqlite")
    assert detect_format(db) == "nsys"
    k, c, notes = import_nsys(db)
    mapped = k[k["OPName"] != ""]
    assert list(mapped["OPName"]) == ["bmm", "gelu"]
    bmm = mapped.iloc[0]
    assert (bmm["B"], bmm["M"], bmm["N"], bmm["K"], bmm["dtype"], bmm["n_kernels"]) == (4, 512, 64, 512, "bf16", 2)
    assert bmm["latency_ms"] == pytest.approx(0.0007)  # (600 + 100) ns
    assert mapped.iloc[1]["H"] == 4096
    assert notes["unmapped_rows"] == 2 and set(k["Device"]) == {"H100-SXM5-80GB"}
    (row,) = c.to_dict("records")
    assert (row["op"], row["size_B"], row["world_size"], row["time_us"]) == ("all_gather", 1048576, 8, 0.4)
    assert parse_range("ln[fp16] B=2 H=8") == ("ln", {"B": 2, "H": 8}, "fp16") and parse_range("forward") is None


def test_nsys_bad_inputs(tmp_path):
    with pytest.raises(ProfileImportError, match="--device"):
        import_nsys(_nsys_db(tmp_path / "a.sqlite", with_gpu_table=False))
    con = sqlite3.connect(tmp_path / "b.sqlite")
    con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    con.close()
    with pytest.raises(ProfileImportError, match="CUPTI_ACTIVITY_KIND_KERNEL"):
        import_nsys(tmp_path / "b.sqlite")
    (tmp_path / "r.nsys-rep").write_bytes(b"\x00binary")
    with pytest.raises(ProfileImportError, match="nsys export --type sqlite"):
        detect_format(tmp_path / "r.nsys-rep")


# ----------------------------------------------------------------------------- nccl-tests
NCCL_LOG = """\
# nThread 1 nGpus 1 minBytes 1024 maxBytes 8388608 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  41012 on   gpu-node01 device  0 [0x07] NVIDIA A100-SXM4-80GB
#  Rank  1 Group  0 Pid  41013 on   gpu-node01 device  1 [0x0b] NVIDIA A100-SXM4-80GB
#  Rank  2 Group  0 Pid  52001 on   gpu-node02 device  0 [0x07] NVIDIA A100-SXM4-80GB
#  Rank  3 Group  0 Pid  52002 on   gpu-node02 device  1 [0x0b] NVIDIA A100-SXM4-80GB
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           256     float     sum      -1    28.41    0.04    0.05      0    27.90    0.04    0.06      0
       16384          4096     float     sum      -1    31.02    0.53    0.79      0    30.75    0.53    0.80      0
      262144         65536     float     sum      -1    52.60    4.98    7.48      0    51.97    5.04    7.57      0
     4194304       1048576     float     sum      -1    310.5   13.51   20.26      0    309.8   13.54   20.31      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 7.15
"""


def test_nccl_tests(tmp_path):
    log = tmp_path / "all_reduce_perf.log"
    log.write_text(NCCL_LOG)
    assert detect_format(log) == "nccl-tests"
    c, notes = import_nccl_tests(log)
    assert len(c) == 4 and set(c["op"]) == {"all_reduce"}
    last = c.iloc[-1]
    assert (last["size_B"], last["time_us"], last["busbw_GBs"], last["ip_time_us"]) == (4194304, 310.5, 20.26, 309.8)
    assert (last["world_size"], last["nodes"], last["gpus_per_node"], last["Device"]) == (4, 2, 2, "A100-SXM4-80GB")
    # the collective from the 'Collective test starting' line wins over the file name; unnamed logs need --collective
    named = tmp_path / "log.txt"
    named.write_text("# Collective test starting: all_gather_perf\n" + NCCL_LOG)
    assert set(import_nccl_tests(named)[0]["op"]) == {"all_gather"}
    anon = tmp_path / "out.txt"
    anon.write_text(NCCL_LOG)
    with pytest.raises(ProfileImportError, match="collective"):
        import_nccl_tests(anon)
    assert set(import_nccl_tests(anon, collective="reducescatter")[0]["op"]) == {"reduce_scatter"}
    trunc = tmp_path / "all_reduce_trunc.log"
    trunc.write_text(NCCL_LOG.split("#        (B)")[0])
    with pytest.raises(ProfileImportError, match="no result rows"):
        import_nccl_tests(trunc)


# ----------------------------------------------------------------------------- power logs
SMI = """timestamp, name, index, power.draw [W], utilization.gpu [%], clocks.sm [MHz], power.limit [W]
2025/01/10 12:00:00.123, NVIDIA H100 80GB HBM3, 0, 412.35 W, 97 %, 1980 MHz, 700.00 W
2025/01/10 12:00:01.123, NVIDIA H100 80GB HBM3, 0, [N/A], 97 %, 1980 MHz, 700.00 W
2025/01/10 12:00:01.124, NVIDIA H100 80GB HBM3, 1, 120.10 W, 3 %, 345 MHz, 700.00 W
"""

DCGM = """#Entity   ID    POWER   GPUTL   MCUTL   SMCLK   TMPTR
ID                   W       %       %     MHZ       C
GPU 0            301.2      95      60    1410      61
GPU 1             62.4       0       0     210      32
GPU 0            305.9      96      61    1410      62
GPU 1              N/A       0       0     210      32
"""


def test_nvidia_smi(tmp_path):
    f = tmp_path / "smi.csv"
    f.write_text(SMI)
    assert detect_format(f) == "nvidia-smi"
    w, notes = import_nvidia_smi(f)
    assert list(w["power_w"]) == [412.35, 120.10] and notes["rows_without_power"] == 1
    assert list(w["gpu_util_pct"]) == [97, 3] and set(w["Device"]) == {"H100-SXM5-80GB"}
    assert list(w["power_limit_w"]) == [700.0, 700.0]
    g = tmp_path / "nopower.csv"
    g.write_text("timestamp, name, utilization.gpu [%]\n2025/01/10, H100, 3 %\n")
    with pytest.raises(ProfileImportError, match="power.draw"):
        import_nvidia_smi(g)


def test_dcgm(tmp_path):
    f = tmp_path / "dmon.txt"
    f.write_text(DCGM)
    assert detect_format(f) == "dcgm"
    with pytest.raises(ProfileImportError, match="--device"):
        import_dcgm(f)
    w, notes = import_dcgm(f, device="A100-SXM4-40GB")
    assert list(w["power_w"]) == [301.2, 62.4, 305.9] and notes["rows_without_power"] == 1
    assert list(w["gpu_index"]) == [0, 1, 0] and list(w["timestamp"]) == [0, 0, 1]
    assert list(w["sm_clock_mhz"]) == [1410, 210, 1410]


def test_import_many_files_into_one_folder(tmp_path):
    (tmp_path / "all_reduce_perf.txt").write_text(NCCL_LOG)
    (tmp_path / "smi.csv").write_text(SMI)
    prof = import_files([_trace(tmp_path), tmp_path / "all_reduce_perf.txt", tmp_path / "smi.csv"])
    written = prof.write(tmp_path / "out")
    assert set(written) == {"kernels", "collectives", "power", "profile"}
    assert len(read_table(tmp_path / "out", "collectives")) == 5 and len(read_table(tmp_path / "out", "power")) == 2


# ----------------------------------------------------------------------------- training input (reading side)
def test_training_rows_from_profile_folders(tmp_path):
    prof = import_files([_trace(tmp_path)])
    prof.write(tmp_path / "p")
    rows, counts = kernel_training_rows([tmp_path / "p"])
    assert counts == {"rows": 10, "used": 7, "unmapped": 3, "no_time": 0, "unknown_device": 0}
    assert list(rows.columns) == ["OPName", "B", "M", "N", "K", "H", "dtype", "latency_ms", "Device"]
    # the user-CSV loader the trainer uses reads them
    from wattcast.data.kernel_datasets import load_user_kernels

    rows.to_csv(tmp_path / "u.csv", index=False)
    u = load_user_kernels(tmp_path / "u.csv")
    assert len(u) == 7 and set(u["device"]) == {"A100-SXM4-40GB"}
    assert split_data_args([tmp_path / "p", tmp_path]) == (tmp_path, [tmp_path / "p"])
    with pytest.raises(ProfileImportError, match="one dataset root"):
        split_data_args([tmp_path, tmp_path / "p" / ".."])
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "profile.json").write_text("{}")
    (bad / "kernels.csv").write_text("OPName,B\nbmm,1\n")
    with pytest.raises(ProfileImportError, match="missing column"):
        kernel_training_rows([bad])


def test_train_kernels_rejects_bad_data_folders(tmp_path):
    r = run_cli("train", "kernels", "--data", str(tmp_path / "missing"), "--no-mlflow")
    assert r.returncode == 2 and "does not exist" in flat(r.stderr)
    empty = tmp_path / "p"
    import_files([_trace(tmp_path)]).write(empty)
    pd.DataFrame({"OPName": ["", ""]}).assign(**{c: "" for c in ("B", "M", "N", "K", "H", "dtype", "latency_ms", "Device",
                                                                  "device_name", "aten_op", "kernel", "n_kernels", "reason", "source")}
                                              ).to_csv(empty / "kernels.csv", index=False)
    r = run_cli("train", "kernels", "--data", str(empty), "--no-mlflow", "--only-csv")
    assert r.returncode == 2 and "no kernel row with a wattcast op" in flat(r.stderr)


def test_import_with_a_spec_file_device(tmp_path, my_gpu_yaml):
    from wattcast.data.catalog import resolve_device

    b = TraceBuilder(devices=())
    b.op("aten::mm", [[64, 64], [64, 64]], ["float", "float"])
    trace = b.write(tmp_path / "t.json")
    r = run_cli("profile", "import", str(trace), "--output", str(tmp_path / "p"), "--device", str(my_gpu_yaml))
    assert r.returncode == 0, r.stderr
    name = resolve_device(my_gpu_yaml).name
    k = read_table(tmp_path / "p", "kernels")
    assert set(k["Device"]) == {name} and set(k["device_name"]) == {name}
    r = run_cli("profile", "import", str(trace), "--output", str(tmp_path / "q"), "--device", "no-such-gpu")
    assert r.returncode == 2 and "--device" in flat(r.stderr)
