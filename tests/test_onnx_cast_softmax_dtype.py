"""The ONNX importer costs Casts and Softmax at the element types the graph gives them, as the torch.export importer
costs ``softmax(w, -1, dtype=torch.float32).to(w.dtype)`` (tests/test_torch_import.py): a Cast writes its target
float type, a Softmax on an fp32 tensor in a bf16 model is the fp32 kernel, and the exporters' Softmax -> Cast(FLOAT)
(torch/onnx/symbolic_opset13.py ``softmax``) is the upcast softmax aten runs."""
from __future__ import annotations

import io

import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP, helper  # noqa: E402

from wattcast.featurize.onnx import graph_from_onnx  # noqa: E402
from wattcast.featurize.training_graph import training_graph  # noqa: E402

SHAPE = [2, 4, 8, 16]
N = 2 * 4 * 8 * 16
ELEM = {"bf16": TP.BFLOAT16, "fp16": TP.FLOAT16, "fp32": TP.FLOAT}


def _model(nodes, elem, out_elem=None):
    """The graph ``nodes`` from ``w`` to ``p``, with a weight of type ``elem`` (the file's float type is its weights')."""
    weight = helper.make_tensor("weight", elem, [64, 64], [0] * 64 * 64)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("w", elem, SHAPE)],
                          [helper.make_tensor_value_info("p", out_elem or elem, SHAPE)], [weight])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _rows(g, phase="forward"):
    f = g.nodes[g.nodes["phase"] == phase]
    return list(zip(f["name"], f["dtype"], f["bytes"] / N))


def _upcast_around(elem):
    """Cast(FLOAT) -> Softmax -> Cast back, as a float16 converter's block list (Softmax kept in fp32) writes it."""
    return _model([helper.make_node("Cast", ["w"], ["w32"], to=TP.FLOAT, name="up"),
                   helper.make_node("Softmax", ["w32"], ["p32"], axis=-1, name="softmax"),
                   helper.make_node("Cast", ["p32"], ["p"], to=elem, name="down")], elem)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_cast_to_float_before_softmax_is_costed_at_fp32(dtype):
    """A bf16/fp16 model: the cast writes 4-byte elements (2 + 4 B an element), the softmax runs in fp32 (4 + 4 B),
    the cast back writes 2-byte ones (4 + 2 B); the softmax's backward reads gradient and output in fp32 (12 B).
    The importer costed all three at the model's 2 B (4 B an element each) before."""
    m = _upcast_around(ELEM[dtype])
    assert _rows(graph_from_onnx(m)) == [("up", "fp32", 6.0), ("softmax", "fp32", 8.0), ("down", "fp32", 6.0)]
    bw = training_graph(graph_from_onnx(m, train=True)).nodes
    assert bw.set_index("name").loc["softmax.grad", ["dtype", "bytes"]].tolist() == ["fp32", 12.0 * N]


@pytest.mark.parametrize("dtype,rows", [
    ("bf16", [("softmax.to_fp32", "fp32", 6.0), ("softmax", "fp32", 8.0), ("down", "fp32", 6.0)]),
    ("fp16", [("softmax", "fp32", 6.0), ("down", "fp32", 6.0)]),  # CUDA's half_to_float softmax
])
def test_exporters_softmax_then_cast_is_the_upcast_softmax(dtype, rows):
    """``torch.onnx.export`` writes ``softmax(w, -1, dtype=torch.float32)`` as Softmax then Cast(FLOAT): costed as
    aten runs the call (as the torch.export importer does), the Cast to FLOAT being the softmax's own output."""
    m = _model([helper.make_node("Softmax", ["w"], ["s"], axis=-1, name="softmax"),
                helper.make_node("Cast", ["s"], ["s32"], to=TP.FLOAT, name="upcast"),
                helper.make_node("Cast", ["s32"], ["p"], to=ELEM[dtype], name="down")], ELEM[dtype])
    assert _rows(graph_from_onnx(m)) == rows


def test_fp32_region_elementwise_and_non_float_casts():
    """An elementwise op between the casts computes and writes fp32 (8 B an element for a scalar multiply); a cast to
    a non-float type keeps the model's width (4 B read, 2 B written, labelled as the wider side as
    GraphBuilder.copy labels a cast); a cast to the type the tensor has is free."""
    bf = TP.BFLOAT16
    m = _model([helper.make_node("Cast", ["w"], ["w32"], to=TP.FLOAT, name="up"),
                helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TP.FLOAT, [], [0.125])),
                helper.make_node("Mul", ["w32", "c"], ["x32"], name="scale"),
                helper.make_node("Cast", ["x32"], ["x32b"], to=TP.FLOAT, name="same"),
                helper.make_node("Softmax", ["x32b"], ["p32"], axis=-1, name="softmax"),
                helper.make_node("Cast", ["p32"], ["p"], to=TP.INT32, name="to_int")], bf, TP.INT32)
    assert _rows(graph_from_onnx(m)) == [("up", "fp32", 6.0), ("scale", "fp32", 8.0), ("softmax", "fp32", 8.0),
                                         ("to_int", "fp32", 6.0)]  # fp32 read, bf16-wide write


def test_the_files_own_float_type_is_the_costed_dtype():
    """An fp32 file costed as bf16 (``dtype=``) has no fp32 region: its softmax and its Cast(FLOAT) are bf16 / free."""
    m = _model([helper.make_node("Cast", ["w"], ["w32"], to=TP.FLOAT, name="same"),
                helper.make_node("Softmax", ["w32"], ["p"], axis=-1, name="softmax")], TP.FLOAT)
    assert _rows(graph_from_onnx(m, dtype="bf16")) == [("softmax", "bf16", 4.0)]
    # a bf16 file's fp32 upcast costed as fp32 is the fp32 model's softmax between two fp32 copies
    assert _rows(graph_from_onnx(_upcast_around(TP.BFLOAT16), dtype="fp32")) == [
        ("up", "fp32", 8.0), ("softmax", "fp32", 8.0), ("down", "fp32", 8.0)]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_torch_onnx_export_costs_the_upcast_softmax_as_torch_export(dtype):
    """``softmax(w, -1, dtype=torch.float32).to(w.dtype)`` through ``torch.onnx.export(dynamo=False)`` gives the
    kernels, dtypes and bytes the torch.export importer gives the module (cast 6, softmax 8, cast 6 B an element in
    bf16; half_to_float softmax 6, cast 6 in fp16)."""
    torch = pytest.importorskip("torch")
    from wattcast.featurize.torch_import import graph_from_module

    class Upcast(torch.nn.Module):
        def forward(self, w):
            return torch.softmax(w, -1, dtype=torch.float32).to(w.dtype)

    x = torch.zeros(*SHAPE, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
    buf = io.BytesIO()
    torch.onnx.export(Upcast(), (x,), buf, dynamo=False, opset_version=17)
    rows = {}
    for src, g in (("onnx", graph_from_onnx(onnx.load_from_string(buf.getvalue()))),
                   ("torch", graph_from_module(Upcast(), (x,), dtype=dtype))):
        f = g.nodes[g.nodes["phase"] == "forward"]
        rows[src] = list(zip(f["kernel"], f["dtype"], f["bytes"]))
    assert rows["onnx"] == rows["torch"]
    assert [b / N for *_, b in rows["onnx"]] == ([6, 8, 6] if dtype == "bf16" else [6, 6])


def test_cast_back_after_a_collapsed_rmsnorm_reads_fp32():
    """HF's RMSNorm (``x.float()`` ... ``.to(dtype)``) collapses into one norm kernel at the model's width; the cast
    back still reads the fp32 value the graph gives it (4 B read, 2 B written) and the cast up writes 4 B."""
    bf = TP.BFLOAT16
    m = _model([helper.make_node("Cast", ["w"], ["w32"], to=TP.FLOAT, name="up"),
                helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", TP.FLOAT, [], [2.0])),
                helper.make_node("Constant", [], ["eps"], value=helper.make_tensor("eps", TP.FLOAT, [], [1e-6])),
                helper.make_node("Pow", ["w32", "two"], ["sq"], name="pow"),
                helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1], keepdims=1, name="mean"),
                helper.make_node("Add", ["var", "eps"], ["ve"], name="add"),
                helper.make_node("Sqrt", ["ve"], ["sd"], name="sqrt"),
                helper.make_node("Div", ["w32", "sd"], ["n32"], name="div"),
                helper.make_node("Cast", ["n32"], ["p"], to=bf, name="down")], bf)
    rows = _rows(graph_from_onnx(m))
    assert [r[0] for r in rows] == ["up", "pow.rmsnorm", "down"]
    assert rows[0] == ("up", "fp32", 6.0) and rows[2] == ("down", "fp32", 6.0)
