"""Collective rows of PyTorch profiler (Kineto) traces: the collective and size from the `nccl:*` annotation PyTorch
opens around each c10d call (an all_to_all runs as grouped send/recv: its kernel is `ncclKernel_SendRecv`), dtype
names, the placement `profile import --gpus-per-node / --nodes` gives the rows (a trace does not record it; until
stop 56 no trace row could train `train collectives`), kernels attributed to their user annotation, and
`validate trace`'s overlap clipped at 0. Synthetic traces, plus the real HTA traces in ../shared/datasets/traces."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from conftest import flat, run_cli
from test_profile_import import TraceBuilder
from wattcast.data.profiles.importers import job_placement, place_collectives
from wattcast.data.profiles.kineto import comm_dtype, import_kineto
from wattcast.data.profiles.tables import ProfileImportError, read_table

SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)"
ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"


def _annotate(b: TraceBuilder, name: str, args: dict) -> None:
    """A user annotation around the last op's launches (the record_param_comms -> nccl:* nesting of the real traces)."""
    op = [e for e in b.events if e.get("cat") == "cpu_op"][-1]
    b.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": op["ts"] + 1,
                     "dur": op["dur"] - 2, "args": args})


def _comm(b: TraceBuilder, kernel: str, annotation: str | None, ann_args: dict, rpc_args: dict | None = None):
    b.op("record_param_comms", None, None, kernels=((kernel, 100.0),), args=rpc_args or {})
    if annotation:
        _annotate(b, annotation, ann_args)


def _a2a_trace(tmp_path, world_size=8):
    b = TraceBuilder(world_size=world_size)
    # PyTorch's all_to_all: grouped ncclSend/ncclRecv (a SendRecv kernel) inside nccl:all_to_all; this PyTorch version
    # writes no 'Collective name' / sizes into record_param_comms (a100_trace_diff_control)
    _comm(b, SENDRECV, "nccl:all_to_all", {"Input Dims": [[8, 1024, 16]], "Input type": ["float"]})
    _comm(b, SENDRECV, "nccl:all_to_all", {"Input Dims": [[1000]], "Input type": ["int"]})
    _comm(b, ALLREDUCE, "nccl:all_reduce", {"Input Dims": [[4096]], "Input type": ["c10::BFloat16"]})
    _comm(b, ALLREDUCE, "nccl:all_reduce", {})  # recorded without shapes: no size, said why
    _comm(b, "ncclKernel_AllGather_RING_LL_Sum_float(ncclWorkElem)", "nccl:_all_gather_base",
          {"Input Dims": [[64]], "Input type": ["float"]})  # a shard: not nccl-tests' all_gather size
    _comm(b, SENDRECV, "nccl:gather", {"Input Dims": [[64]], "Input type": ["float"]})  # not a modelled collective
    _comm(b, SENDRECV, None, {})  # no annotation: the kernel name, as before
    return b.write(tmp_path / "a2a.json.gz")


def test_all_to_all_takes_its_op_and_size_from_the_nccl_annotation(tmp_path):
    _, c, _ = import_kineto(_a2a_trace(tmp_path))
    rows = c.to_dict("records")
    assert [r["op"] for r in rows] == ["all_to_all", "all_to_all", "all_reduce", "all_reduce", "all_gather", "",
                                       "send_recv"]
    # all_to_all: the rank's whole send buffer (nccl-tests' all_to_all size); all_reduce: the per-rank buffer
    assert [r["size_B"] for r in rows[:3]] == [8 * 1024 * 16 * 4, 1000 * 4, 4096 * 2]
    assert [r["dtype"] for r in rows[:3]] == ["fp32", "int32", "bf16"]
    assert [r["reason"] for r in rows[:3]] == ["", "", ""]
    assert "annotation has no 'Input Dims'" in rows[3]["reason"] and "message size unknown" in rows[3]["reason"]
    assert np.isnan(rows[4]["size_B"]) and "not the size nccl-tests counts" in rows[4]["reason"]
    assert "nccl:gather is not one of the modelled collectives" in rows[5]["reason"]
    assert "no nccl:* annotation" in rows[6]["reason"]
    assert set(c["world_size"]) == {8}  # distributedInfo.world_size, as before


def test_record_param_comms_sizes_win_and_dtypes_are_normalised(tmp_path):
    b = TraceBuilder(world_size=2)
    rpc = {"Collective name": "broadcast", "dtype": "Long", "In msg nelems": 53, "Out msg nelems": 53, "Group size": 2}
    _comm(b, "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclWorkElem)", "nccl:broadcast", {}, rpc)
    _comm(b, "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclWorkElem)", "nccl:broadcast",
          {"Input Dims": [[7]], "Input type": ["float"]}, dict(rpc, dtype="Byte", **{"In msg nelems": 10}))
    _, c, _ = import_kineto(b.write(tmp_path / "b.json"))
    assert list(c["dtype"]) == ["int64", "uint8"]  # until stop 56 'Long' was written as is
    assert list(c["size_B"]) == [53 * 8, 53 * 1]  # record_param_comms' nelems x dtype, not the annotation's
    assert comm_dtype("Float") == ("fp32", 4) and comm_dtype("long int") == ("int64", 8)
    assert comm_dtype("c10::Half") == ("fp16", 2) and comm_dtype("Weird") == ("Weird", None)


def test_kernels_outside_every_cpu_op_are_grouped_by_their_user_annotation(tmp_path):
    b = TraceBuilder()
    b.op("aten::mm", [[32, 64], [64, 16]], ["float", "float"], kernels=(("gemm", 50.0),))
    # apex FusedAdam: multi_tensor_apply kernels launched from C++ inside Optimizer.step#FusedAdam.step, no cpu_op
    t0 = b.t
    b.op("aten::mm", None, None, kernels=(("multi_tensor_apply_kernel<AdamFunctor>", 30.0),) * 3)
    fused = [e for e in b.events if e.get("cat") == "cpu_op"][-1]
    b.events.remove(fused)  # the launches stay, with no cpu_op around them
    b.events += [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1, "ts": 0,
                  "dur": 1e6},
                 {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#FusedAdam.step", "pid": 1, "tid": 1,
                  "ts": t0, "dur": fused["dur"]}]
    b.op("aten::mm", None, None, kernels=(("stray", 5.0),))  # inside ProfilerStep# only: not an annotation call
    stray = [e for e in b.events if e.get("cat") == "cpu_op"][-1]
    b.events.remove(stray)
    k, _, notes = import_kineto(b.write(tmp_path / "adam.json"))
    adam = k[k["aten_op"] == "Optimizer.step#FusedAdam.step"]
    assert len(adam) == 1 and adam["n_kernels"].iloc[0] == 3 and adam["latency_ms"].iloc[0] == pytest.approx(0.090)
    assert adam["OPName"].iloc[0] == "" and "inside user annotation" in adam["reason"].iloc[0]
    assert "kernel launched outside any cpu_op" in set(k["reason"])  # the stray one: no annotation but the step
    assert notes["unmapped_reasons"]["kernel launched outside any cpu_op, inside a user annotation (no op class)"] == 1
    assert len(k) == 3 and notes["kernels"] == 5


# ----------------------------------------------------------------------------------------------- placement
def test_place_collectives_rules():
    c = pd.DataFrame({"op": ["all_reduce"] * 6, "world_size": [8, 2, 4, 2, 3, np.nan],
                      "_ranks": [None, [0, 1], [0, 1, 4, 5], None, [0, 1, 4], None]})
    out, n = place_collectives(c, 2, 4)
    # the whole job 2x4; ranks [0, 1] on node 0 -> 1x2; [0, 1, 4, 5] -> 2x2 (rank r on node r // 4); a sub-group
    # without ranks and one with unequal ranks per node stay unplaced; no group size -> the whole job
    assert list(out["nodes"].fillna(-1)) == [2, 1, 2, -1, -1, 2]
    assert list(out["gpus_per_node"].fillna(-1)) == [4, 2, 2, -1, -1, 4]
    assert out["world_size"].iloc[5] == 8
    assert n["placed"] == 4 and n["from_ranks"] == 2 and sum(n["unplaced"].values()) == 2
    assert any("unequal ranks per node" in k for k in n["unplaced"])
    # one node: every group is 1 x its size
    one, _ = place_collectives(pd.DataFrame({"op": ["broadcast"] * 2, "world_size": [2, 4]}), 1, 4)
    assert list(one["nodes"]) == [1, 1] and list(one["gpus_per_node"]) == [2, 4]
    # a file's own placement is kept
    own, m = place_collectives(pd.DataFrame({"op": ["all_reduce"], "world_size": [16], "nodes": [2],
                                             "gpus_per_node": [8]}), 1, 4)
    assert (own["nodes"].iloc[0], own["gpus_per_node"].iloc[0], m["kept"]) == (2, 8, 1)


def test_job_placement_checks_the_flags_against_the_trace():
    assert job_placement("t", None, 4, 8) == (2, 4) and job_placement("t", 2, None, 8) == (2, 4)
    assert job_placement("t", 1, 2, 2) == (1, 2) and job_placement("t", None, 4, None) == (None, 4)
    with pytest.raises(ProfileImportError, match=r"--nodes 2 x --gpus-per-node 2 = 4 ranks.*world size of 2"):
        job_placement("t", 2, 2, 2)
    with pytest.raises(ProfileImportError, match="not a multiple"):
        job_placement("t", None, 8, 2)
    with pytest.raises(ProfileImportError, match="--gpus-per-node too"):
        job_placement("t", 2, None, None)


def test_profile_import_places_trace_rows_and_train_collectives_names_the_flag(tmp_path):
    b = TraceBuilder(world_size=2)
    rpc = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 2**20, "Out msg nelems": 2**20,
           "Group size": 2, "Process Group Ranks": "[0, 1]"}
    for _ in range(3):
        _comm(b, ALLREDUCE, "nccl:all_reduce", {}, rpc)
    trace = b.write(tmp_path / "ar.json.gz")
    # without the flags: no placement, said at import, and train collectives names the flags that give it
    r = run_cli("profile", "import", trace, "--output", tmp_path / "p0")
    assert r.returncode == 0, r.stderr
    assert "3 collective row(s) have no nodes / gpus_per_node" in flat(r.stderr) and "--gpus-per-node" in flat(r.stderr)
    assert read_table(tmp_path / "p0", "collectives")["nodes"].isna().all()
    r = run_cli("train", "collectives", "--data", tmp_path / "p0", "--cluster", "NVLink-4GPU", "--quick", "--no-mlflow",
                "--out", tmp_path / "m")
    msg = flat(r.stderr)
    assert r.returncode == 2 and "3 no placement" in msg and "profile import FILE --output DIR --gpus-per-node G" in msg
    # with --gpus-per-node: placed 1x2 from the group's ranks, recorded in the rows and profile.json
    r = run_cli("profile", "import", trace, "--output", tmp_path / "p1", "--gpus-per-node", "2")
    assert r.returncode == 0, r.stderr
    assert "placement from --gpus-per-node 2: job of 1 node(s) x 2 GPUs" in flat(r.stderr)
    c = read_table(tmp_path / "p1", "collectives")
    assert list(c["nodes"]) == [1] * 3 and list(c["gpus_per_node"]) == [2] * 3 and "_ranks" not in c
    pl = json.loads((tmp_path / "p1" / "profile.json").read_text())["files"][0]["placement"]
    assert pl["placed"] == 3 and pl["from_ranks"] == 3 and "derived" in pl
    from wattcast.data.collective_datasets import load_profile_collectives

    used, counts = load_profile_collectives([tmp_path / "p1"], "NVLink-4GPU")
    assert counts["used"] == 3 and counts["no_placement"] == 0 and set(used["gpus_per_node"]) == {2}
    # flags that contradict the trace, or a count below 1: exit 2 naming them, nothing written
    r = run_cli("profile", "import", trace, "--output", tmp_path / "p2", "--nodes", "2", "--gpus-per-node", "2")
    assert r.returncode == 2 and "--nodes 2 x --gpus-per-node 2 = 4 ranks" in flat(r.stderr)
    assert not (tmp_path / "p2" / "collectives.csv").exists()
    r = run_cli("profile", "import", trace, "--output", tmp_path / "p3", "--gpus-per-node", "0")
    assert r.returncode == 2 and "--gpus-per-node must be at least 1" in flat(r.stderr)


def test_overlap_is_never_negative(monkeypatch):
    """union - sum by float rounding (mi250_minitoy_train read -3.5e-07 ms) is clipped at 0."""
    from wattcast.data.profiles import busy
    from wattcast.validation.trace_validation import _busy_keys

    fake = {"compute_kernels": 1, "comm_kernels": 0, "compute_busy_ms": 0.11088099999999997, "comm_busy_ms": 0.0,
            "union_busy_ms": 0.11088134765625, "steps_ms": []}
    monkeypatch.setattr(busy, "merge_busy", lambda files: fake)
    k = pd.DataFrame({"n_kernels": [1]})
    prof = type("P", (), {"files": [{}], "table": lambda self, kind: pd.DataFrame({"time_us": []})})()
    assert _busy_keys(prof, k, pd.Series([0.11088099999999997]))["overlap_ms"] == 0.0


# ----------------------------------------------------------------------------------------------- real traces
@pytest.mark.e2e
def test_real_all_to_alls_and_fused_adam(traces):
    """a100_trace_diff_control: every ncclKernel_SendRecv sits in an nccl:all_to_all annotation (42, counted by
    hand with gzip + json: 3,865,189,408 B in all, 130.655 ms); the 18 all-reduces 1,200,223,224 B; apex FusedAdam's
    48 kernels are 6 rows of 8 (one per step, 7.642 ms)."""
    k, c, _ = import_kineto(traces / "a100_trace_diff_control.json.gz")
    g = c.groupby("op").agg(n=("op", "size"), b=("size_B", "sum"), t=("time_us", "sum"))
    assert g.to_dict("index") == {"all_reduce": {"n": 18, "b": 1200223224.0, "t": 32880.0},
                                  "all_to_all": {"n": 42, "b": 3865189408.0, "t": 130655.0}}
    assert (c["reason"] == "").all() and set(c["dtype"]) == {"fp32", "int32"}
    adam = k[k["aten_op"] == "Optimizer.step#FusedAdam.step"]
    assert len(adam) == 6 and set(adam["n_kernels"]) == {8} and adam["latency_ms"].sum() == pytest.approx(7.642)


@pytest.mark.e2e
def test_real_nccl_trace_trains_collectives_once_placed(traces, tmp_path):
    """a100_nccl_data (2 ranks, one node): imported with --gpus-per-node 2 its 21 NCCL rows are usable (until stop 56
    'left out: 21 no placement'); `Long` is int64; the MI250 trace's overlap is 0, not -3.5e-07."""
    prof = tmp_path / "p"
    r = run_cli("profile", "import", traces / "a100_nccl_data.json.gz", "--output", prof, "--gpus-per-node", "2")
    assert r.returncode == 0, r.stderr
    c = read_table(prof, "collectives")
    assert len(c) == 21 and set(c["nodes"]) == {1} and set(c["gpus_per_node"]) == {2}
    assert set(c["dtype"]) == {"fp32", "int64"}
    r = run_cli("train", "collectives", "--data", prof, "--cluster", "NVLink-4GPU", "--quick", "--no-mlflow",
                "--out", tmp_path / "m")
    assert r.returncode in (0, 1), r.stderr  # 1: the gate kept the shipped model (said); never "no usable row"
    assert "21 of 21 imported collective rows used" in flat(r.stderr)
    r = run_cli("validate", "trace", traces / "mi250_minitoy_train.json.gz", "--device", "MI250", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["overlap_ms"] == 0.0
