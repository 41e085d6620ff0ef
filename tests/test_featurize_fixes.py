"""Featurize defects, each pinned: DeepSeek's multi-head latent attention under the fused (flash) kernel, a malformed
``rope_scaling`` in a Hugging Face config, and an ONNX MatMul / Gemm whose inner dimensions the file fixes and that
do not match."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import REPO, flat, run_cli
from wattcast.featurize.hf_config import builtin_models, load_hf_config
from wattcast.featurize.op_graph import GraphBuilder, GraphError
from wattcast.featurize.workload import StepOptions, step_graph

DSV3_LAYERS, DSV3_DENSE = 61, 3  # deepseek-ai/DeepSeek-V3: 61 blocks, the first 3 dense, the other 58 MoE


def _graph(model, attention, **kw):
    return step_graph(model, StepOptions(**{"batch": 1, "seq": 16, "mode": "inference", "dtype": "bf16",
                                            "attention": attention, **kw}))


# ------------------------------------------------------------------ 1. MLA under flash attention
@pytest.mark.parametrize("model", builtin_models())
def test_every_builtin_has_the_same_parameters_and_gemms_under_eager_and_flash(model):
    """The attention kernel changes the attention core only: the projections (o_proj among them) and so the parameter
    count and the GEMM FLOPs are the same under eager, flash and flash1. DeepSeek-V3 is built with 5 of its 61 blocks
    (its three dense blocks and two MoE ones: every kind of block it has), the whole of it below; the Qwen3-MoE ones with
    3 blocks (all their blocks are alike: tests/test_qwen_moe.py counts them whole); gpt-oss-120b with 4 (two sliding-window
    and two full layers; tests/test_gpt_oss.py counts it whole)."""
    kw = ({"blocks": DSV3_DENSE + 2} if model == "deepseek_v3"
          else {"blocks": 3} if model in ("qwen3_30b_a3b", "qwen3_235b_a22b")
          else {"blocks": 4} if model == "gpt_oss_120b" else {})
    graphs = {a: _graph(model, a, **kw) for a in ("eager", "flash", "flash1")}
    counts = {a: g.param_count for a, g in graphs.items()}
    gemm = {a: float(g.nodes.loc[g.nodes["op_class"] == "linear", "flops"].sum()) for a, g in graphs.items()}
    assert counts["flash"] == counts["eager"] == counts["flash1"], counts
    assert gemm["flash"] == gemm["eager"] == gemm["flash1"], gemm


@pytest.mark.parametrize("attention", ["eager", "flash", "flash1"])
def test_deepseek_v3_has_671b_parameters_under_every_attention(attention):
    """The whole model's count from two short graphs (the MoE blocks are all alike: 4 blocks = 3 dense + 1 MoE, 5 = 3
    dense + 2 MoE), as the full 61-block graph gives it (671,026,404,352: the published 671B) but in a fraction of its
    build time. Before the fix flash and flash1 gave 674.6B (o_proj 24,576 x 7,168 instead of 16,384 x 7,168)."""
    p4 = _graph("deepseek_v3", attention, blocks=DSV3_DENSE + 1).param_count
    p5 = _graph("deepseek_v3", attention, blocks=DSV3_DENSE + 2).param_count
    whole = p5 + (DSV3_LAYERS - DSV3_DENSE - 2) * (p5 - p4)
    assert whole == 671_026_404_352
    assert whole / 671e9 == pytest.approx(1.0, rel=0.005)


@pytest.mark.parametrize("attention", ["flash", "flash1"])
def test_mla_fused_attention_outputs_the_value_head_dim(attention):
    """DeepSeek-V3: 128 heads, q/k head dim 128 + 64 = 192, v head dim 128, hidden 7,168. The fused kernel returns
    (B, h, S, v_head_dim), so o_proj is 16,384 x 7,168; its FLOPs are QK^T over 192 plus PV over 128 (half the square,
    causal) and it writes an output of the value head dim."""
    s, h, dqk, dv = 64, 128, 192, 128
    g = _graph("deepseek_v3", attention, seq=s, blocks=1)
    n = g.nodes
    o_proj = n[n["name"] == "self_attn.o_proj"].iloc[0]
    assert o_proj["param_count"] == h * dv * 7168
    assert o_proj["flops"] == 2 * s * h * dv * 7168
    fl = n[n["op_class"] == "flash_attention"].iloc[0]
    assert fl["flops"] == pytest.approx((2 * s * s * dqk + 2 * s * s * dv) * h * 0.5)
    assert fl["bytes"] == pytest.approx((2 * h * s * dqk + 2 * h * s * dv) * 2)  # q, k, v and the output, bf16


def test_flash_attention_output_takes_the_value_head_dim():
    b = GraphBuilder("bf16")
    q, k, v = b.input((2, 4, 32, 24)), b.input((2, 4, 32, 24)), b.input((2, 4, 32, 16))
    out = b.flash_attention(q, k, v, causal=True)
    assert out.shape == (2, 4, 32, 16)
    same = b.flash_attention(q, k, b.input((2, 4, 32, 24)), causal=False)
    assert same.shape == (2, 4, 32, 24)
    with pytest.raises(GraphError, match="head dims differ"):
        b.flash_attention(q, b.input((2, 4, 32, 16)), v, causal=True)


# ------------------------------------------------------------------ 2. rope_scaling
def _llama(**change):
    raw = json.loads((REPO / "featurize" / "hf_configs" / "llama3_8b.json").read_text())
    raw.update(num_hidden_layers=2, **change)
    return raw


LLAMA31_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}


@pytest.mark.parametrize("value, field, shown", [
    ({"rope_type": "linear", "factor": -2}, "rope_scaling.factor", "-2"),
    ({"rope_type": "linear", "factor": 0}, "rope_scaling.factor", "0"),
    ({"rope_type": "linear", "factor": "abc"}, "rope_scaling.factor", "'abc'"),
    ({"rope_type": "linear", "factor": True}, "rope_scaling.factor", "True"),
    ({"rope_type": "dynamic", "factor": [2.0]}, "rope_scaling.factor", "[2.0]"),
    ("abc", "rope_scaling", "'abc'"),
    ([{"factor": 2.0}], "rope_scaling", "[{'factor': 2.0}]"),
    (8.0, "rope_scaling", "8.0"),
    ({"rope_type": 3, "factor": 2.0}, "rope_scaling.rope_type", "3"),
])
def test_malformed_rope_scaling_is_a_value_error_naming_it(value, field, shown):
    with pytest.raises(ValueError) as e:
        load_hf_config(_llama(rope_scaling=value))
    assert isinstance(e.value, GraphError)
    msg = str(e.value)
    assert f"field '{field}'" in msg and msg.endswith(f"got {shown}"), msg


@pytest.mark.parametrize("value", [LLAMA31_SCALING, None, {"rope_type": "linear", "factor": 2},
                                   {"type": "longrope", "short_factor": [1.0], "long_factor": [4.0]}, {}])
def test_valid_rope_scaling_still_loads(value):
    cfg = load_hf_config(_llama(rope_scaling=value))
    assert cfg.raw.get("rope_scaling") == value
    g = step_graph(cfg.raw, StepOptions(batch=1, seq=64, mode="inference"))
    assert g.param_count > 0


def test_absent_rope_scaling_loads():
    raw = _llama()
    raw.pop("rope_scaling", None)
    assert "rope_scaling" not in load_hf_config(raw).raw


def test_cli_refuses_a_bad_rope_scaling_with_exit_2(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(_llama(rope_scaling={"rope_type": "linear", "factor": -2})))
    out = run_cli("predict", "--model", cfg, "--device", "H100")
    assert out.returncode == 2, out.stdout + out.stderr
    err = flat(out.stderr)
    assert "field 'rope_scaling.factor' must be a positive number" in err and "got -2" in err
    assert "Traceback" not in out.stderr


# ------------------------------------------------------------------ 3. ONNX MatMul / Gemm inner dimensions
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from wattcast.featurize.onnx import graph_from_onnx  # noqa: E402

F = TensorProto.FLOAT


def _init(name, *shape):
    return numpy_helper.from_array(np.ones(shape, dtype=np.float32), name)


def _vi(name, shape):
    return helper.make_tensor_value_info(name, F, shape)


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


BAD = {
    "activation @ weight": (
        _model([helper.make_node("MatMul", ["x", "W"], ["y"], name="/fc/MatMul")],
               [_vi("x", [4, 8, 16])], [_vi("y", [4, 8, 32])], [_init("W", 5, 32)]),
        "MatMul node '/fc/MatMul'", "A 'x' (4, 8, 16) @ B 'W' (5, 32): 16 != 5"),
    "two activations": (
        _model([helper.make_node("MatMul", ["a", "b"], ["y"], name="bmm")],
               [_vi("a", [4, 8, 16]), _vi("b", [4, 5, 3])], [_vi("y", [4, 8, 3])]),
        "MatMul node 'bmm'", "A 'a' (4, 8, 16) @ B 'b' (4, 5, 3): 16 != 5"),
    "gemm transB": (
        _model([helper.make_node("Gemm", ["a", "W", "c"], ["y"], transB=1, name="gemm")],
               [_vi("a", [8, 16])], [_vi("y", [8, 5])], [_init("W", 5, 32), _init("c", 5)]),
        "Gemm node 'gemm'", "A 'a' (8, 16) @ B 'W' (5, 32) (transB=1): 16 != 32"),
    "gemm of activations": (
        _model([helper.make_node("Gemm", ["a", "b"], ["y"], name="gemm2")],
               [_vi("a", [8, 16]), _vi("b", [7, 5])], [_vi("y", [8, 5])]),
        "Gemm node 'gemm2'", "A 'a' (8, 16) @ B 'b' (7, 5): 16 != 7"),
    "symbolic batch, fixed inner dims": (
        _model([helper.make_node("Relu", ["x"], ["h"], name="act"),
                helper.make_node("MatMul", ["h", "W"], ["y"], name="/fc/MatMul")],
               [_vi("x", ["batch", "seq", 16])], [_vi("y", ["batch", "seq", 32])], [_init("W", 24, 32)]),
        "MatMul node '/fc/MatMul'", "A 'h' (batch, seq, 16) @ B 'W' (24, 32): 16 != 24"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_matmul_with_mismatched_fixed_inner_dims_is_a_value_error(case):
    m, node, shapes = BAD[case]
    with pytest.raises(ValueError) as e:
        graph_from_onnx(m, batch=2, seq=4)
    assert isinstance(e.value, GraphError)
    msg = str(e.value)
    assert node in msg and shapes in msg and "inner dimensions do not match" in msg, msg


def test_symbolic_and_unknown_inner_dims_work_as_before():
    mm = [helper.make_node("MatMul", ["x", "W"], ["y"], name="/fc/MatMul")]
    # symbolic batch and sequence around fixed, matching inner dims
    ok = graph_from_onnx(_model(mm, [_vi("x", ["batch", "seq", 16])], [_vi("y", ["batch", "seq", 32])],
                                [_init("W", 16, 32)]), batch=2, seq=4)
    assert ok.nodes["flops"].sum() == 2 * 8 * 16 * 32 and "warnings" not in ok.meta
    # a symbolic inner dim: bound right it is a linear; bound wrong the file is not at fault, but the graph cannot run
    # at those dims: refused naming the node and the bound dims (until stop 54 flagged and costed by the roofline)
    sym = _model(mm, [_vi("x", ["batch", "seq", "hidden"])], [_vi("y", ["batch", "seq", 32])], [_init("W", 16, 32)])
    assert graph_from_onnx(sym, batch=2, seq=4, dims={"hidden": 16}).nodes["flops"].sum() == 2 * 8 * 16 * 32
    with pytest.raises(GraphError, match=r"'/fc/MatMul' cannot run at the dims its inputs were bound to .*hidden=20"):
        graph_from_onnx(sym, batch=2, seq=4, dims={"hidden": 20})
    # two symbolic dims the model contracts, bound to different values: likewise
    two = _model([helper.make_node("MatMul", ["a", "b"], ["y"], name="bmm")],
                 [_vi("a", ["batch", 8, "k1"]), _vi("b", ["batch", "k2", 3])], [_vi("y", ["batch", 8, 3])])
    with pytest.raises(GraphError, match=r"'bmm' cannot run at the dims .*k1=4, k2=5"):
        graph_from_onnx(two, batch=2, dims={"k1": 4, "k2": 5})
    assert graph_from_onnx(two, batch=2, dims={"k1": 4, "k2": 4}).meta.get("fallback_ops") is None
    # an operand whose shape the file does not give (a custom op's output): as before
    unknown = _model([helper.make_node("Foo", ["x"], ["h"], domain="custom", name="foo"),
                      helper.make_node("MatMul", ["h", "W"], ["y"], name="mm")],
                     [_vi("x", [4, 8, 16])], [_vi("y", [4, 8, 32])], [_init("W", 5, 32)])
    unknown.opset_import.append(helper.make_opsetid("custom", 1))
    assert graph_from_onnx(unknown).meta["fallback_ops"] == {"MatMul": 1}


def test_cli_refuses_an_invalid_onnx_matmul_with_exit_2(tmp_path):
    path = tmp_path / "bad.onnx"
    onnx.save(BAD["activation @ weight"][0], str(path))
    out = run_cli("predict", "--model", path, "--device", "H100", "--mode", "inference")
    assert out.returncode == 2, out.stdout + out.stderr
    err = flat(out.stderr)
    assert "MatMul node '/fc/MatMul': inner dimensions do not match" in err and "(4, 8, 16)" in err and "(5, 32)" in err
