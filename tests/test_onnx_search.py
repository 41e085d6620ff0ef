"""Audit 55b #4: ``search`` of an ONNX model. Before, it refused every ONNX file ("search varies tensor parallelism")
before reading the space, even with ``--tp 1``, though ``predict_cluster`` predicts the same file with dp / pp / zero.
Now a space with tp 1 (and cp / ep 1) is searched over data and pipeline parallelism (stages over the graph's own
layers), ZeRO, micro-batches and recomputation, and each row is ``predict_cluster``'s figures for its strategy; any
other tp, cp or ep is refused naming the flag. Each test fails on the code before the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import wattcast

onnx = pytest.importorskip("onnx")

N_LAYERS = 4


def _layered_onnx(path, d=256, n_layers=N_LAYERS):
    """A residual MLP of ``n_layers`` blocks named /layers.i/... (the importer's layer marks), x: [batch, seq, d]."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, x = [], [], "x"
    for i in range(n_layers):
        p = f"/layers.{i}"
        inits += [numpy_helper.from_array(np.zeros((d, 4 * d), np.float32), f"w1_{i}"),
                  numpy_helper.from_array(np.zeros((4 * d, d), np.float32), f"w2_{i}")]
        nodes += [helper.make_node("MatMul", [x, f"w1_{i}"], [f"h{i}"], name=f"{p}/fc1/MatMul"),
                  helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"{p}/act/Relu"),
                  helper.make_node("MatMul", [f"r{i}", f"w2_{i}"], [f"o{i}"], name=f"{p}/fc2/MatMul"),
                  helper.make_node("Add", [x, f"o{i}"], [f"y{i}"], name=f"{p}/Add")]
        x = f"y{i}"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", d])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", "seq", d])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return _layered_onnx(tmp_path_factory.mktemp("onnx_search") / "mlp.onnx")


JOB = dict(cluster="dgx-h100", gpus=8, batch=64, seq=256)


def test_search_of_an_onnx_model_with_tp_1_is_predict_clusters_figures(model):
    res = wattcast.search(model, JOB["cluster"], JOB["gpus"], JOB["batch"], JOB["seq"], tp=1,
                          recompute=("none", "full"))
    ranked = res.ranked
    assert len(ranked) > 10 and ranked["fits"].all()
    assert set(ranked["tp"]) == {1} and set(ranked["cp"]) == {1} and set(ranked["ep"]) == {1}
    # data and pipeline parallelism, ZeRO, micro-batches and recomputation are all searched
    assert {1, 2, 4} <= set(ranked["pp"]) and set(ranked["zero"]) == {0, 1} and ranked["micro_batch"].nunique() > 2
    assert set(ranked["recompute"]) == {"none", "full"} and (ranked["interleave"] > 1).any()
    # the stages are over the graph's own 4 layers: pp 8 (8 GPUs) is no candidate, pp 4 with 2 virtual stages breaks
    # the layer rule
    assert ranked["pp"].max() == N_LAYERS
    assert (res.rejected["rule"].str.contains(r"layers \(4\) must be at least pp x interleave")).any()
    for r in ranked.itertuples():  # every row, the best included: predict_cluster's figures for its strategy
        p = wattcast.predict_cluster(model, JOB["cluster"], gpus=JOB["gpus"], batch=JOB["batch"], seq=JOB["seq"],
                                     strategy=r.strategy)
        d = p.to_dict()
        assert p.step_time_ms == pytest.approx(r.step_time_ms, rel=1e-12), r.strategy
        assert p.memory_gb == pytest.approx(r.memory_gb, rel=1e-12), r.strategy
        assert d["energy_j"] == pytest.approx(r.energy_j, rel=1e-9), r.strategy
        assert bool(p.fits) == bool(r.fits)


@pytest.mark.parametrize("space, flags", [
    ({}, ["--tp 1"]),  # the default space varies tp: tp 1 is asked for explicitly, not assumed
    (dict(tp=(1, 2)), ["--tp 1"]),
    (dict(tp=1, cp=2), ["--cp 1"]),
    (dict(tp=2, ep=(1, 2)), ["--tp 1", "--ep 1"]),
])
def test_search_of_an_onnx_model_names_the_flags_it_needs(model, space, flags):
    with pytest.raises(ValueError) as e:
        wattcast.search(model, JOB["cluster"], JOB["gpus"], JOB["batch"], JOB["seq"], **space)
    msg = str(e.value)
    assert "ONNX" in msg and all(f in msg for f in flags), msg
    assert ("--cp" in msg) == ("cp" in space) and ("--ep" in msg) == ("ep" in space)


def test_cli_search_of_an_onnx_model_with_tp_1(model):
    from wattcast.cli import app

    runner = CliRunner()
    args = ["search", "--model", model, "--cluster", JOB["cluster"], "--gpus", JOB["gpus"], "--batch", JOB["batch"],
            "--seq", JOB["seq"]]
    r = runner.invoke(app, [str(a) for a in args + ["--tp", "1", "--json", "--top", "1"]])
    assert r.exit_code == 0, r.output
    best = json.loads(r.stdout)["ranked"][0]
    p = wattcast.predict_cluster(model, JOB["cluster"], gpus=JOB["gpus"], batch=JOB["batch"], seq=JOB["seq"],
                                 strategy=best["strategy"])
    assert p.step_time_ms == pytest.approx(best["step_time_ms"], rel=1e-12)
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 2 and "--tp 1" in " ".join(r.stderr.split())
