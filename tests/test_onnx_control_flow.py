"""ONNX control flow costed through its subgraphs: Loop (constant, given and unknown trip counts, nested), Scan, If."""

from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from wattcast.featurize.onnx import graph_from_onnx  # noqa: E402
from wattcast.featurize.onnx.control import MAX_UNROLLED_KERNELS  # noqa: E402
from wattcast.featurize.op_graph import GraphError  # noqa: E402
from wattcast.featurize.training_graph import training_graph  # noqa: E402

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
vi = helper.make_tensor_value_info


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    return m


def _w(name="W", n=64):
    return numpy_helper.from_array(np.ones((n, n), np.float32), name)


def _i64(name, v):
    return numpy_helper.from_array(np.array(v, dtype=np.int64), name)


def _matmul_loop(trips: int | None, *, n=64, cond: str = "identity", scan_out=False):
    """``x <- x @ W`` in a Loop of ``trips`` iterations (None: M is a graph input). ``cond``: the body's condition
    output is its input (``identity``) or computed (``computed``: a while loop)."""
    nodes = [helper.make_node("MatMul", ["x_in", "W"], ["x_out"])]
    if cond == "identity":
        nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    else:
        nodes += [helper.make_node("ReduceSum", ["x_out"], ["tot"], keepdims=0),
                  helper.make_node("Less", ["tot", "limit"], ["c_out"])]
    outs = [vi("c_out", BOOL, []), vi("x_out", F, [n, n])]
    if scan_out:
        nodes.append(helper.make_node("Relu", ["x_out"], ["s_out"]))
        outs.append(vi("s_out", F, [n, n]))
    body = helper.make_graph(nodes, "body", [vi("i", I64, []), vi("c_in", BOOL, []), vi("x_in", F, [n, n])], outs)
    inits = [numpy_helper.from_array(np.array(True), "cond"), _w(n=n), numpy_helper.from_array(np.array(1e9, np.float32), "limit")]
    inputs = [vi("x", F, [n, n])]
    if trips is None:
        inputs.append(vi("M", I64, []))
    else:
        inits.append(_i64("M", trips))
    louts = ["y"] + (["ys"] if scan_out else [])
    graph_outs = [vi("y", F, [n, n])] + ([vi("ys", F, [trips, n, n])] if scan_out else [])
    return _model([helper.make_node("Loop", ["M", "cond", "x"], louts, body=body, name="repeat_matmul")], inputs,
                  graph_outs, inits)


def _one_matmul(n=64):
    return _model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [vi("x", F, [n, n])], [vi("y", F, [n, n])],
                  [_w(n=n)])


def test_loop_of_n_matmuls_costs_n_times_one_matmul(tmp_path):
    import wattcast

    one = graph_from_onnx(_one_matmul())
    for trips in (1, 7, 1000):
        g = graph_from_onnx(_matmul_loop(trips))
        assert len(g.nodes) == trips and (g.nodes["op_class"] == "linear").all()
        assert g.nodes["flops"].sum() == trips * one.nodes["flops"].sum()
        assert g.nodes["bytes"].sum() == trips * one.nodes["bytes"].sum()
        assert g.param_count == one.param_count == 64 * 64  # the weight is counted once, not per iteration
        assert len(g.edges) == trips - 1  # each iteration waits for the previous one's state
        (cf,) = g.meta["control_flow"]
        assert cf == dict(node="repeat_matmul", op="Loop", trip_count=trips, trip_count_source="constant",
                          iterations=trips, kernels=trips, runs=1)
    # predicted: 1,000 iterations are 1,000 x one MatMul (the issue: 0.007 ms for the whole loop)
    f1, f1000 = tmp_path / "one.onnx", tmp_path / "loop.onnx"
    onnx.save(_one_matmul(), str(f1))
    onnx.save(_matmul_loop(1000), str(f1000))
    # the GPU's time (host_us=0): additive; with eager PyTorch's host cost (since stop 56 a launch queue at 40 us) the
    # 1,000 tiny MatMuls are host-bound: 1,000 launches and the last kernel
    p1 = wattcast.predict(str(f1), "h100", mode="inference", host_us=0)
    p1000 = wattcast.predict(str(f1000), "h100", mode="inference", host_us=0)
    assert p1000.forward_ms == pytest.approx(1000 * p1.forward_ms, rel=1e-6)
    e1000 = wattcast.predict(str(f1000), "h100", mode="inference")
    assert e1000.forward_ms == pytest.approx(1000 * 0.040 + p1.forward_ms, rel=1e-6)
    # training: every iteration's MatMul has its backward (dgrad after the first, wgrad always)
    t1 = training_graph(graph_from_onnx(_one_matmul(), train=True))
    t5 = training_graph(graph_from_onnx(_matmul_loop(5), train=True))
    bw1, bw5 = (t.nodes[t.nodes["phase"] == "backward"] for t in (t1, t5))
    assert bw1["name"].str.endswith("wgrad").sum() == 1 and bw5["name"].str.endswith("wgrad").sum() == 5
    assert bw5["name"].str.endswith("dgrad").sum() == 4  # the loop's input x needs no gradient; the carried state does
    tr1 = wattcast.predict(str(f1), "h100")
    tr1000 = wattcast.predict(str(f1000), "h100")
    assert tr1000.backward_ms > 1000 * tr1.backward_ms


def test_loop_scan_outputs_are_concatenated_once():
    g = graph_from_onnx(_matmul_loop(3, scan_out=True))
    assert list(g.nodes["op_class"]) == ["linear", "elementwise"] * 3 + ["memory"]
    cat = g.nodes.iloc[-1]
    assert cat["name"] == "repeat_matmul.concat_0" and cat["bytes"] == 2 * 3 * 64 * 64 * 4
    assert {int(s) for s, d in g.edges if d == 6} == {1, 3, 5}  # it waits for every iteration's slice


def test_unknown_trip_count_is_refused_naming_the_option_and_given_count_is_used(tmp_path):
    with pytest.raises(GraphError, match=r"node 'repeat_matmul' \(Loop\).*known only at run time.*--loop-trip-count N"):
        graph_from_onnx(_matmul_loop(None))
    g = graph_from_onnx(_matmul_loop(None), loop_trip_count=12)
    assert len(g.nodes) == 12 and g.meta["control_flow"][0]["trip_count_source"] == "given"
    assert len(graph_from_onnx(_matmul_loop(None), loop_trip_count={"repeat_matmul": 4}).nodes) == 4
    assert len(graph_from_onnx(_matmul_loop(None), loop_trip_count=0).nodes) == 0
    # a count for a model that needs none, for a node it does not have, or not a count: errors naming the option
    with pytest.raises(GraphError, match="loop_trip_count.*no Loop of the model.*repeat_matmul: constant"):
        graph_from_onnx(_matmul_loop(3), loop_trip_count=5)
    with pytest.raises(GraphError, match="'nope', no Loop node"):
        graph_from_onnx(_matmul_loop(None), loop_trip_count={"nope": 2})
    for bad in (-1, 2.5, True, "3"):
        with pytest.raises(GraphError, match=r"loop_trip_count \(--loop-trip-count\) must be a whole number"):
            graph_from_onnx(_matmul_loop(None), loop_trip_count=bad)
    import wattcast

    f0 = tmp_path / "dyn0.onnx"
    onnx.save(_matmul_loop(None), str(f0))
    for bad in ([3], {"repeat_matmul": [3]}, -2):  # through the Python API (hashed for the graph cache): the same errors
        with pytest.raises(GraphError, match=r"loop_trip_count.*must be a whole number"):
            wattcast.predict(str(f0), "h100", mode="inference", loop_trip_count=bad)
    assert wattcast.predict(str(f0), "h100", mode="inference", loop_trip_count={"repeat_matmul": 2}).forward_ms > 0
    # the CLI flag
    from conftest import flat, run_cli

    f = tmp_path / "dyn.onnx"
    onnx.save(_matmul_loop(None), str(f))
    r = run_cli("predict", "-m", f, "-d", "h100", "--mode", "inference", "--json")
    assert r.returncode == 2 and "--loop-trip-count" in flat(r.stderr) and "Traceback" not in r.stderr
    r = run_cli("predict", "-m", f, "-d", "h100", "--mode", "inference", "--json", "--loop-trip-count", "20",
                "--host-us", "0")  # the GPU's time: additive (a launch queue's host time is not, above)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    f1 = tmp_path / "one.onnx"
    onnx.save(_one_matmul(), str(f1))
    one = json.loads(run_cli("predict", "-m", f1, "-d", "h100", "--mode", "inference", "--json", "--host-us", "0").stdout)
    assert out["forward_ms"] == pytest.approx(20 * one["forward_ms"], rel=1e-3)
    r = run_cli("predict", "-m", "gpt2", "-d", "h100", "--loop-trip-count", "3")
    assert r.returncode == 2 and "--loop-trip-count" in flat(r.stderr) and "ONNX" in flat(r.stderr)


def _token_models(tmp_path):
    """One ``x @ W`` and the same MatMul in a Loop whose count is a graph input, on ``x`` of shape (batch, seq, 64) with
    symbolic batch and seq (what a cluster prediction binds to its micro-batch and sequence)."""
    x = ["batch", "seq", 64]
    w = _w()
    one = _model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [vi("x", F, x)], [vi("y", F, x)], [w])
    body = helper.make_graph([helper.make_node("MatMul", ["x_in", "W"], ["x_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
                             "body", [vi("i", I64, []), vi("c_in", BOOL, []), vi("x_in", F, x)],
                             [vi("c_out", BOOL, []), vi("x_out", F, x)])
    loop = _model([helper.make_node("Loop", ["M", "cond", "x"], ["y"], body=body, name="repeat_matmul")],
                  [vi("x", F, x), vi("M", I64, [])], [vi("y", F, x)], [numpy_helper.from_array(np.array(True), "cond"), w])
    paths = tmp_path / "one_tokens.onnx", tmp_path / "loop_tokens.onnx"
    for m, f in zip((one, loop), paths):
        onnx.save(m, str(f))
    return paths


def test_loop_trip_count_works_on_a_cluster_too(tmp_path):
    """--loop-trip-count with --cluster (it was refused): 1,000 MatMuls in a Loop cost 1,000x one MatMul on a cluster,
    through the Python API, the request object and the CLI."""
    import wattcast
    from conftest import flat, run_cli

    f1, fl = _token_models(tmp_path)
    kw = dict(gpus=2, batch=8, seq=128, host_us=0)  # the GPU's time: additive (a launch queue's host time is not)
    one = wattcast.predict_cluster(str(f1), "DGX-A100", **kw)
    loop = wattcast.predict_cluster(str(fl), "DGX-A100", loop_trip_count=1000, **kw)
    assert one.forward_ms > 0 and loop.forward_ms == pytest.approx(1000 * one.forward_ms, rel=1e-6)
    # every iteration has its backward: a wgrad each, and a dgrad for the carried state after the first: 1,999
    # launches, host-bound at eager PyTorch's host cost (40 us each), within the GPU's time of them
    assert 1000 * one.backward_ms < loop.backward_ms < 2100 * one.backward_ms
    loop_e = wattcast.predict_cluster(str(fl), "DGX-A100", loop_trip_count=1000, **dict(kw, host_us=None))
    assert 1998 * 0.040 <= loop_e.backward_ms <= 1999 * 0.040 + loop.backward_ms  # (the first overlaps the forward's tail)
    assert loop.step_time_ms > 500 * one.step_time_ms and loop.meta["control_flow"][0]["trip_count"] == 1000
    assert wattcast.predict_cluster(str(fl), "DGX-A100", loop_trip_count={"repeat_matmul": 10}, **kw).forward_ms \
        == pytest.approx(10 * one.forward_ms, rel=1e-6)
    req = wattcast.PredictRequest(str(fl), cluster="DGX-A100", batch=8, seq=128, parallel=wattcast.ParallelOptions(gpus=2),
                                  loop_trip_count=(("repeat_matmul", 1000),), host_us=0)
    assert req.predict().forward_ms == loop.forward_ms
    with pytest.raises(GraphError, match=r"repeat_matmul.*known only at run time.*--loop-trip-count"):
        wattcast.predict_cluster(str(fl), "DGX-A100", **kw)
    with pytest.raises(GraphError, match=r"loop_trip_count \(--loop-trip-count\) applies to ONNX"):
        wattcast.predict_cluster("gpt2", "DGX-A100", loop_trip_count=3, **kw)
    for bad in ([3], {"repeat_matmul": [3]}, -2):  # the single-device checks, before any cache key is hashed
        with pytest.raises(GraphError, match=r"loop_trip_count.*must be a whole number"):
            wattcast.predict_cluster(str(fl), "DGX-A100", loop_trip_count=bad, **kw)
    args = ("predict", "-m", fl, "--cluster", "DGX-A100", "--gpus", "2", "--batch", "8", "--seq", "128", "--json",
            "--host-us", "0")
    r = run_cli(*args, "--loop-trip-count", "1000")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["forward_ms"] == pytest.approx(loop.forward_ms, rel=1e-12)
    r = run_cli(*args)
    assert r.returncode == 2 and "--loop-trip-count" in flat(r.stderr) and "Traceback" not in r.stderr


def test_while_loop_takes_the_given_count_or_flags_its_bound():
    # the body computes its condition: M is only an upper bound
    g = graph_from_onnx(_matmul_loop(50, cond="computed"))
    assert (g.nodes["op_class"] == "linear").sum() == 50
    assert g.meta["control_flow"][0]["trip_count_source"] == "constant (upper bound)"
    assert any("upper bound" in w and "--loop-trip-count" in w for w in g.meta["warnings"])
    g = graph_from_onnx(_matmul_loop(50, cond="computed"), loop_trip_count=8)
    assert (g.nodes["op_class"] == "linear").sum() == 8 and "warnings" not in g.meta
    with pytest.raises(GraphError, match="known only at run time"):
        graph_from_onnx(_matmul_loop(None, cond="computed"))


def test_a_loop_beyond_the_unrolling_limit_is_refused_at_once():
    with pytest.raises(GraphError, match=rf"unrolls to 1,000,000,000 kernels, beyond the {MAX_UNROLLED_KERNELS:,}"):
        graph_from_onnx(_matmul_loop(10**9))


def test_nested_loop_inner_count_follows_the_outer_iteration():
    """outer: 3 iterations; inner: M = i + 1 MatMuls (1 + 2 + 3 = 6), then a Relu per outer iteration."""
    inner = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "W"], ["h_out"]), helper.make_node("Identity", ["c2"], ["c2o"])], "inner",
        [vi("j", I64, []), vi("c2", BOOL, []), vi("h_in", F, [8, 32])], [vi("c2o", BOOL, []), vi("h_out", F, [8, 32])])
    outer = helper.make_graph(
        [helper.make_node("Add", ["i", "one"], ["m_in"]),
         helper.make_node("Loop", ["m_in", "", "x_in"], ["x_mid"], body=inner, name="inner_loop"),
         helper.make_node("Relu", ["x_mid"], ["x_out"]), helper.make_node("Identity", ["c"], ["co"])], "outer",
        [vi("i", I64, []), vi("c", BOOL, []), vi("x_in", F, [8, 32])], [vi("co", BOOL, []), vi("x_out", F, [8, 32])])
    m = _model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=outer, name="outer_loop")], [vi("x", F, [8, 32])],
               [vi("y", F, [8, 32])], [_i64("M", 3), _i64("one", 1), _w(n=32)])
    g = graph_from_onnx(m)
    n = g.nodes
    assert list(n["op_class"]) == ["linear", "elementwise", "linear", "linear", "elementwise",
                                   "linear", "linear", "linear", "elementwise"]
    assert n.iloc[6]["name"] == "outer_loop[2]/inner_loop[1]/MatMul_0"
    assert n.loc[n["op_class"] == "linear", "flops"].sum() == 6 * 2 * 8 * 32 * 32
    assert g.param_count == 32 * 32
    flow = {e["node"]: e for e in g.meta["control_flow"]}
    assert flow["outer_loop"]["trip_count"] == 3 and flow["outer_loop"]["kernels"] == 9
    assert flow["outer_loop/inner_loop"]["trip_count"] == [1, 2, 3] and flow["outer_loop/inner_loop"]["runs"] == 3
    assert flow["outer_loop/inner_loop"]["iterations"] == 6


def _if_model(cond_value: bool | None):
    then_b = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["t"]), helper.make_node("Tanh", ["t"], ["t2"])],
                               "then", [], [vi("t2", F, [64, 64])])
    else_b = helper.make_graph([helper.make_node("Relu", ["x"], ["e"])], "else", [], [vi("e", F, [64, 64])])
    inputs = [vi("x", F, [64, 64])]
    inits = [_w()]
    if cond_value is None:
        inputs.append(vi("c", BOOL, []))
    else:
        inits.append(numpy_helper.from_array(np.array(cond_value), "c"))
    return _model([helper.make_node("If", ["c"], ["y"], then_branch=then_b, else_branch=else_b, name="branchy"),
                   helper.make_node("Sigmoid", ["y"], ["z"], name="after")], inputs, [vi("z", F, [64, 64])], inits)


def test_if_costs_the_branch_taken_or_the_more_expensive_one_flagged():
    g = graph_from_onnx(_if_model(False))
    assert list(g.nodes["name"]) == ["branchy.else/Relu_0", "after"] and g.param_count == 0
    assert g.meta["control_flow"][0]["chosen_by"] == "constant condition" and "warnings" not in g.meta
    g = graph_from_onnx(_if_model(True))
    assert list(g.nodes["op_class"]) == ["linear", "elementwise", "elementwise"] and g.param_count == 64 * 64
    # run-time condition: the MatMul branch costs more; the Relu branch tried first leaves nothing behind
    for train in (False, True):
        g = graph_from_onnx(_if_model(None), train=train)
        assert list(g.nodes["name"]) == ["branchy.then/MatMul_0", "branchy.then/Tanh_1", "after"]
        assert g.param_count == 64 * 64 and len(g.edges) == 2
        (cf,) = g.meta["control_flow"]
        assert cf["branch"] == "then_branch" and cf["chosen_by"].startswith("more expensive")
        assert any("branchy" in w and "more expensive branch" in w for w in g.meta["warnings"])
        tg = training_graph(g)
        assert (tg.nodes["phase"] == "backward").sum() > 0
    # with the branches swapped the else branch is the expensive one
    m = _if_model(None)
    node = m.graph.node[0]
    a, b = node.attribute
    a.name, b.name = b.name, a.name
    g = graph_from_onnx(m)
    assert g.meta["control_flow"][0]["branch"] == "else_branch" and g.nodes.iloc[0]["name"] == "branchy.else/MatMul_0"


def test_scan_costs_its_body_once_per_slice():
    body = helper.make_graph([helper.make_node("MatMul", ["xt", "W"], ["h"]), helper.make_node("Add", ["s", "h"], ["s2"]),
                              helper.make_node("Tanh", ["s2"], ["o"])], "rnn_body",
                             [vi("s", F, [2, 32]), vi("xt", F, [2, 32])], [vi("s2", F, [2, 32]), vi("o", F, [2, 32])])
    m = _model([helper.make_node("Scan", ["s0", "xs"], ["sf", "ys"], body=body, num_scan_inputs=1, scan_input_axes=[1],
                                 scan_output_axes=[1], name="rnn")],
               [vi("s0", F, [2, 32]), vi("xs", F, [2, 7, 32])], [vi("sf", F, [2, 32]), vi("ys", F, [2, 7, 32])], [_w(n=32)])
    g = graph_from_onnx(m, train=True)
    assert g.nodes["op_class"].value_counts().to_dict() == {"elementwise": 14, "linear": 7}
    assert g.nodes.loc[g.nodes["op_class"] == "linear", ["M", "N", "K"]].drop_duplicates().values.tolist() == [[2, 32, 32]]
    assert g.param_count == 32 * 32
    (cf,) = g.meta["control_flow"]
    assert cf["op"] == "Scan" and cf["trip_count"] == 7 and cf["trip_count_source"] == "sequence length"


def test_other_subgraph_ops_are_still_refused():
    body = helper.make_graph([helper.make_node("Relu", ["a"], ["b"])], "b", [vi("a", F, [4])], [vi("b", F, [4])])
    m = helper.make_model(helper.make_graph(
        [helper.make_node("BeamSearch", ["x"], ["y"], domain="com.microsoft", decoder=body, name="beam")], "g",
        [vi("x", F, [4])], [vi("y", F, [4])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(GraphError, match=r"node 'beam' \(com.microsoft.BeamSearch\) runs a body subgraph"):
        graph_from_onnx(m)


def test_torchscript_loops_exported_by_torch_onnx(tmp_path):
    """A scripted ``for i in range(n)`` (trip count an input) and a ``while`` (M = INT64_MAX, computed condition)."""
    torch = pytest.importorskip("torch")

    class For(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 32)

        def forward(self, x, n: int):
            for _ in range(n):
                x = torch.tanh(self.lin(x))
            return x

    class While(For):
        def forward(self, x):
            while x.sum() < 100:
                x = self.lin(x) + 1
            return x

    for cls, args, names in ((For, (torch.randn(4, 32), 10), ["x", "n"]), (While, (torch.randn(4, 32),), ["x"])):
        f = tmp_path / f"{cls.__name__}.onnx"
        try:
            torch.onnx.export(torch.jit.script(cls()), args, str(f), dynamo=False, input_names=names)
        except Exception as e:  # noqa: BLE001 - an exporter without TorchScript support
            pytest.skip(f"torch.onnx (TorchScript) export unavailable: {e}")
        with pytest.raises(GraphError, match=r"\(Loop\) runs a body subgraph .*--loop-trip-count N"):
            graph_from_onnx(f)
        g = graph_from_onnx(f, loop_trip_count=10)
        lin = g.nodes[g.nodes["op_class"] == "linear"]
        assert len(lin) == 10 and lin["flops"].nunique() == 1 and g.param_count == 32 * 32 + 32
        assert lin["name"].iloc[3] == "/Loop[3]/lin/Gemm"


def test_a_constant_initial_state_still_runs_and_a_loop_without_kernels_is_bounded():
    # the loop's state starts as an initializer (a zero state): its MatMuls run at run time, one per iteration
    m = _matmul_loop(4)
    m.graph.initializer.append(numpy_helper.from_array(np.zeros((64, 64), np.float32), "h0"))
    m.graph.node[0].input[2] = "h0"
    del m.graph.input[:]
    g = graph_from_onnx(m)
    assert (g.nodes["op_class"] == "linear").sum() == 4
    # a counter loop (no kernels at all) of a billion iterations is refused, not walked for hours
    body = helper.make_graph([helper.make_node("Add", ["n_in", "one"], ["n_out"]), helper.make_node("Identity", ["c"], ["co"])],
                             "count", [vi("i", I64, []), vi("c", BOOL, []), vi("n_in", I64, [])],
                             [vi("co", BOOL, []), vi("n_out", I64, [])])
    m = _model([helper.make_node("Loop", ["M", "", "zero"], ["n"], body=body, name="counter"),
                helper.make_node("Relu", ["x"], ["y"])], [vi("x", F, [4])], [vi("y", F, [4]), vi("n", I64, [])],
               [_i64("M", 10**9), _i64("one", 1), _i64("zero", 0)])
    with pytest.raises(GraphError, match="node 'counter' \\(Loop\\) unrolls to 1,000,000,000"):
        graph_from_onnx(m)
    m.graph.initializer[0].CopyFrom(_i64("M", 5))
    g = graph_from_onnx(m)
    assert list(g.nodes["kernel"]) == ["relu"] and g.meta["control_flow"][0]["kernels"] == 0


def test_an_if_inside_a_loop_is_flagged_once():
    then_b = helper.make_graph([helper.make_node("MatMul", ["x_in", "W"], ["t"])], "then", [], [vi("t", F, [64, 64])])
    else_b = helper.make_graph([helper.make_node("Relu", ["x_in"], ["e"])], "else", [], [vi("e", F, [64, 64])])
    body = helper.make_graph(
        [helper.make_node("ReduceSum", ["x_in"], ["s"], keepdims=0), helper.make_node("Less", ["s", "limit"], ["pick"]),
         helper.make_node("If", ["pick"], ["x_out"], then_branch=then_b, else_branch=else_b, name="branchy"),
         helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [vi("i", I64, []), vi("c_in", BOOL, []), vi("x_in", F, [64, 64])], [vi("c_out", BOOL, []), vi("x_out", F, [64, 64])])
    m = _model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body, name="outer")], [vi("x", F, [64, 64])],
               [vi("y", F, [64, 64])], [_i64("M", 6), _w(), numpy_helper.from_array(np.array(1.0, np.float32), "limit")])
    g = graph_from_onnx(m)
    assert (g.nodes["op_class"] == "linear").sum() == 6 and g.param_count == 64 * 64
    assert len([w for w in g.meta["warnings"] if "branchy" in w]) == 1 and "'outer/branchy' (If)" in g.meta["warnings"][0]
    flow = {e["node"]: e for e in g.meta["control_flow"]}
    assert flow["outer/branchy"]["runs"] == 6 and flow["outer/branchy"]["branch"] == "then_branch"


def test_a_growing_loop_state_is_costed_at_each_iteration_s_shape():
    """A KV-cache-like state grows by a row per iteration: each iteration's MatMul has its own M (2, 3, 4, 5)."""
    body = helper.make_graph([helper.make_node("Concat", ["x_in", "row"], ["x_out"], axis=0),
                              helper.make_node("MatMul", ["x_out", "W"], ["h"]),
                              helper.make_node("ReduceSum", ["h"], ["s"], keepdims=0),
                              helper.make_node("Identity", ["c"], ["co"])], "grow_body",
                             [vi("i", I64, []), vi("c", BOOL, []), vi("x_in", F, ["n", 8])],
                             [vi("co", BOOL, []), vi("x_out", F, ["n2", 8]), vi("s", F, [])])
    m = _model([helper.make_node("Loop", ["M", "", "x"], ["y", "sums"], body=body, name="grow")],
               [vi("x", F, [1, 8]), vi("row", F, [1, 8])], [vi("y", F, ["rows", 8]), vi("sums", F, ["k"])], [_i64("M", 4), _w(n=8)])
    g = graph_from_onnx(m)
    lin = g.nodes[g.nodes["op_class"] == "linear"]
    assert lin["M"].tolist() == [2, 3, 4, 5] and "unknown_shapes" not in g.meta and "fallback_ops" not in g.meta
    assert g.nodes.iloc[-1]["name"] == "grow.concat_0" and g.nodes.iloc[-1]["bytes"] == 2 * 4 * 4  # 4 fp32 sums
