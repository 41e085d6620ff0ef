"""What the output names: the FP8 recipe's dtype, kernels --dtype, the step's named overheads in per_op, an unknown
ONNX op in warnings and fallback_ops, a search's model warnings and the clusters it has no strategy for."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattcast
from conftest import flat, run_cli


# ------------------------------------------------------------------ 1. --dtype fp8 is reported as fp8
def test_fp8_step_reports_fp8_in_settings_title_and_trace(tmp_path):
    from wattcast.simulate.trace import write_chrome_trace, write_distributed_trace

    one = wattcast.predict("llama3_8b", "H100-SXM5-80GB", batch=1, seq=256, dtype="fp8")
    assert one.meta["dtype"] == "bf16" and one.meta["precision"] == "fp8"  # the graph's own meaning is kept
    assert one.to_dict()["settings"]["dtype"] == "fp8"
    write_chrome_trace(one, tmp_path / "one.json")
    assert json.loads((tmp_path / "one.json").read_text())["otherData"]["dtype"] == "fp8"
    bf = wattcast.predict("llama3_8b", "H100-SXM5-80GB", batch=1, seq=256, dtype="bf16")
    assert bf.to_dict()["settings"]["dtype"] == "bf16"
    cl = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=8, seq=512, tp=2, sp=True, zero=1,
                                  dtype="fp8", framework="megatron")
    assert cl.to_dict()["settings"]["dtype"] == "fp8"
    write_distributed_trace(cl, tmp_path / "cl.json")
    assert json.loads((tmp_path / "cl.json").read_text())["otherData"]["dtype"] == "fp8"
    r = run_cli("predict", "-m", "llama3_8b", "-d", "H100-SXM5-80GB", "--batch", "1", "--seq", "256", "--dtype", "fp8",
                "--allow-oom")
    assert r.returncode == 0, r.stderr
    assert "(train, fp8, batch 1 x seq 256)" in r.stdout


# ------------------------------------------------------------------ 2. kernels --dtype
def _csv(tmp_path, text: str):
    p = tmp_path / f"k{len(list(tmp_path.glob('k*.csv')))}.csv"
    p.write_text(text)
    return p


def _rows(stdout: str):
    import io

    import pandas as pd

    return pd.read_csv(io.StringIO(stdout), dtype=str, keep_default_na=False)


def test_kernels_dtype_fills_rows_without_one(tmp_path):
    bare = _csv(tmp_path, "OPName,B,M,N,K\nlinear,1,2048,4096,4096\n")
    r = run_cli("kernels", "-d", "H100-SXM5-80GB", "-i", bare, "--dtype", "fp8")
    assert r.returncode == 0, r.stderr
    got = _rows(r.stdout)
    assert list(got["dtype"]) == ["fp8"]
    own = run_cli("kernels", "-d", "H100-SXM5-80GB", "-i",
                  _csv(tmp_path, "OPName,B,M,N,K,dtype\nlinear,1,2048,4096,4096,fp8\n"))
    assert got["pred_latency_ms"].iloc[0] == _rows(own.stdout)["pred_latency_ms"].iloc[0]
    plain = run_cli("kernels", "-d", "H100-SXM5-80GB", "-i", bare)  # without --dtype: fp32, as before
    assert float(_rows(plain.stdout)["pred_latency_ms"].iloc[0]) > float(got["pred_latency_ms"].iloc[0])
    # an empty cell takes --dtype, an alias of the same dtype agrees with it
    mixed = _csv(tmp_path, "OPName,B,M,N,K,dtype\nlinear,1,2048,4096,4096,\nlinear,1,2048,4096,4096,float8_e4m3fn\n")
    r = run_cli("kernels", "-d", "H100-SXM5-80GB", "-i", mixed, "--dtype", "fp8")
    assert r.returncode == 0, r.stderr
    assert list(_rows(r.stdout)["dtype"]) == ["fp8", "float8_e4m3fn"]


def test_kernels_dtype_conflict_and_missing_fp8_peak_are_errors(tmp_path):
    own = _csv(tmp_path, "OPName,B,M,N,K,dtype\nlinear,1,2048,4096,4096,bf16\n")
    r = run_cli("kernels", "-d", "H100-SXM5-80GB", "-i", own, "--dtype", "fp8")
    assert r.returncode == 2 and "--dtype fp8 conflicts" in flat(r.stderr) and "data row 1: bf16" in flat(r.stderr)
    bare = _csv(tmp_path, "OPName,B,M,N,K\nlinear,1,2048,4096,4096\n")
    r = run_cli("kernels", "-d", "A100-SXM4-80GB", "-i", bare, "--dtype", "fp8")
    assert r.returncode == 2 and "peak_fp8_tflops" in flat(r.stderr) and not r.stdout
    r = run_cli("kernels", "-d", "H100-SXM5-80GB", "-i", bare, "--dtype", "int4")
    assert r.returncode == 2 and "unknown dtype 'int4'" in flat(r.stderr)


def test_predict_kernels_takes_the_cli_dtype_and_models(tmp_path):
    # wattcast.predict_kernels(dtype=, models=) as `wattcast kernels --dtype --models`
    import pandas as pd

    from wattcast.models.selection import ModelFolderError

    bare = _csv(tmp_path, "OPName,B,M,N,K\nlinear,1,2048,4096,4096\n")
    cli = _rows(run_cli("kernels", "-d", "H100-SXM5-80GB", "-i", bare, "--dtype", "fp8").stdout)
    api = wattcast.predict_kernels(pd.DataFrame({"OPName": ["linear"], "B": [1], "M": [2048], "N": [4096], "K": [4096]}),
                                   "H100-SXM5-80GB", dtype="fp8")
    assert list(api["dtype"]) == ["fp8"] and api["pred_latency_ms"].iloc[0] == float(cli["pred_latency_ms"].iloc[0])
    # a missing cell (None, NaN, "") takes the dtype; an alias agrees; another dtype is an error naming the row
    frame = pd.DataFrame({"OPName": ["linear"] * 3, "B": [1] * 3, "M": [2048] * 3, "N": [4096] * 3, "K": [4096] * 3,
                          "dtype": [None, "", "float8_e4m3fn"]})
    got = wattcast.predict_kernels(frame, "H100-SXM5-80GB", dtype="fp8")
    assert list(got["dtype"]) == ["fp8", "fp8", "float8_e4m3fn"] and (got["error"] == "").all()
    assert got["pred_latency_ms"].nunique() == 1
    with pytest.raises(ValueError, match=r"dtype= fp8 conflicts .*data row 1: bf16"):
        wattcast.predict_kernels(frame.assign(dtype="bf16"), "H100-SXM5-80GB", dtype="fp8")
    with pytest.raises(ValueError, match="peak_fp8_tflops"):
        wattcast.predict_kernels(frame, "A100-SXM4-80GB", dtype="fp8")
    with pytest.raises(ValueError, match="dtype=: unknown dtype 'int4'"):
        wattcast.predict_kernels(frame, "H100-SXM5-80GB", dtype="int4")
    # models=: a kernel bundle folder, checked first as predict(models=) checks it
    with pytest.raises(ModelFolderError, match="models= .*no such folder"):
        wattcast.predict_kernels(frame, "H100-SXM5-80GB", models=tmp_path / "nope")
    from wattcast.models import kernel_predictor

    shipped = wattcast.predict_kernels(frame, "H100-SXM5-80GB", dtype="fp8",
                                       models=kernel_predictor.__file__.rsplit("/", 1)[0] + "/artifacts")
    pd.testing.assert_frame_equal(shipped, got)


def test_dir_lists_no_imported_helpers():
    names = set(dir(wattcast))
    assert not names & {"os", "annotations"}
    assert {"predict", "predict_kernels", "__version__", "DEFAULTS"} <= names
    from wattcast import predict, predict_kernels  # noqa: F401  (imports unchanged)


# ------------------------------------------------------------------ 3. the step's overheads by name in per_op
def test_per_op_names_the_step_overheads_and_still_sums_to_the_step():
    res = wattcast.predict("gpt2", "A100-SXM4-80GB", batch=8, dtype="fp16", grad_accumulation=True)
    d = res.to_dict()
    assert sum(r["time_ms"] for r in d["per_op"]) == pytest.approx(d["step_time_ms"], rel=1e-9)
    by = {r["op_class"]: r for r in d["per_op"]}
    opt = {p["name"]: p["time_ms"] for p in by["optimizer"]["parts"]}
    assert list(opt) == ["optimizer_step", "clip_grad_norm", "loss_scaling"]
    assert sum(opt.values()) == pytest.approx(by["optimizer"]["time_ms"], rel=1e-9)
    ov = d["overheads"]
    for name in opt:
        assert opt[name] == pytest.approx(ov[f"{name}_ms"], rel=1e-9) and opt[name] > 0
    parts = {p["name"]: p["time_ms"] for r in d["per_op"] for p in r.get("parts", [])}
    assert parts["memcpy"] == pytest.approx(ov["memcpy_ms"]) and parts["grad_accumulation"] == pytest.approx(
        ov["grad_accumulation_ms"])
    assert sum(r["launch_gap_ms"] for r in d["per_op"]) == pytest.approx(ov["launch_gap_ms"])
    assert by["data_loading"]["time_ms"] == pytest.approx(ov["data_loading_ms"])
    r = run_cli("predict", "-m", "gpt2", "-d", "A100-SXM4-80GB", "--batch", "8", "--dtype", "fp16")
    assert r.returncode == 0, r.stderr
    for label in ("of which optimizer step", "of which clip_grad_norm", "of which loss scaling", "of which memcpy",
                  "launch gaps (inside the rows above)", "data_loading"):
        assert label in r.stdout, label


# ------------------------------------------------------------------ 4. an unknown ONNX op in warnings and fallback_ops
def _unknown_op_model(path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 64])
    nodes = [helper.make_node("FrobnicateXYZ", ["x"], ["y"], domain="com.example", name="frob"),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    g = helper.make_graph(nodes, "g", [x], [z], value_info=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(m, str(path))
    return path


def test_unknown_onnx_op_is_a_json_warning_and_named_in_fallback_ops(tmp_path):
    path = _unknown_op_model(tmp_path / "frob.onnx")
    r = run_cli("predict", "-m", path, "-d", "A100-SXM4-80GB", "--json")
    assert r.returncode == 0, r.stderr  # a flagged fallback, not an error
    out = json.loads(r.stdout)
    assert any("FrobnicateXYZ x1" in w and "no cost model" in w for w in out["warnings"]), out["warnings"]
    frob = [f for f in out["fallback_ops"] if f.get("op_type") == "FrobnicateXYZ"]
    assert len(frob) == 1 and frob[0]["method"] == "roofline" and frob[0]["count"] == 1  # its forward (no gradient flows)
    assert flat(r.stderr).count("FrobnicateXYZ x1") == 1  # said once on stderr
    t = run_cli("predict", "-m", path, "-d", "A100-SXM4-80GB")
    assert "other FrobnicateXYZ (roofline" in flat(t.stdout)


# ------------------------------------------------------------------ 5./6. search: model warnings, clusters left out
def test_search_carries_the_models_position_warning():
    res = wattcast.search("llama3_8b", "DGX-H100", gpus=8, batch=8, seq=16384, max_configs=1, workers=1)
    ref = wattcast.predict("llama3_8b", "H100-SXM5-80GB", batch=1, seq=16384)
    pos = [w for w in ref.meta["warnings"] if "max_position_embeddings" in w]
    assert pos and res.warnings[:1] == pos
    assert not any("max_position_embeddings" in w for w in
                   wattcast.search("llama3_8b", "DGX-H100", gpus=8, batch=8, seq=4096, max_configs=1,
                                   workers=1).warnings)


def test_search_cli_names_a_cluster_without_strategies_and_the_models_warning():
    args = ("search", "-m", "llama3_8b", "--cluster", "DGX-A100", "--cluster", "DGX-H100", "--gpus", "16", "--batch",
            "16", "--seq", "16384", "--dtype", "fp8", "--max-configs", "12", "--workers", "1")
    t = run_cli(*args)
    assert t.returncode == 0, t.stderr
    out = flat(t.stdout)
    assert "note: cluster DGX-A100 has no valid strategy:" in out and "peak_fp8_tflops" in out
    assert "note: llama3_8b: seq 16,384 is beyond max_position_embeddings" in out
    j = run_cli(*args, "--json")
    d = json.loads(j.stdout)
    assert list(d["unranked_clusters"]) == ["DGX-A100"] and "peak_fp8_tflops" in d["unranked_clusters"]["DGX-A100"]
    assert any("max_position_embeddings" in w for w in d["warnings"])
    assert np.all([r["cluster"] == "DGX-H100" for r in d["ranked"]])
