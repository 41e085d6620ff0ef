"""The sequence length of an ONNX model whose input feeds a 1-D convolution: ONNX's Conv reads (batch, channels,
length), so the sequence is axis 2 of that input, not axis 1 as for (batch, sequence, hidden) activations. A symbolic
length is bound from ``seq`` and the conv's FLOPs follow it; a fixed one is the step's sequence (``meta["seq"]``, the
tokens per step) and the only ``seq`` the file accepts."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from wattcast.featurize.onnx import graph_from_onnx  # noqa: E402
from wattcast.featurize.op_graph import GraphError  # noqa: E402
from wattcast.featurize.workload import StepOptions, step_graph  # noqa: E402

B, C_IN, C_OUT, K, L = 2, 16, 32, 3, 64


def _conv1d(path, dims, *, transformer_layout: bool = False):
    """x (dims) -> Conv1d(C_IN -> C_OUT, kernel K, padding 1) -> y; with ``transformer_layout`` x is (batch, seq,
    hidden) and is transposed into the conv, as a model whose embedding feeds a Conv1d does."""
    w = numpy_helper.from_array(np.zeros((C_OUT, C_IN, K), np.float32), "W")
    nodes, src = [], "x"
    if transformer_layout:
        nodes.append(helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1], name="to_channels_first"))
        src = "xt"
    nodes.append(helper.make_node("Conv", [src, "W"], ["y"], kernel_shape=[K], pads=[1, 1], name="conv1d"))
    out_len = dims[1] if transformer_layout else dims[2]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dims[0], C_OUT, out_len])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def _conv_flops(g) -> float:
    n = g.nodes
    return float(n.loc[(n["name"] == "conv1d") & (n["phase"] == "forward"), "flops"].sum())


def _opts(**kw) -> StepOptions:
    """Options with batch and seq not given unless ``kw`` gives them (as the CLI passes them)."""
    return StepOptions(**{"batch": None, "seq": None, "mode": "inference", "dtype": "fp32", **kw})


def test_fixed_length_is_the_sequence_not_the_channels(tmp_path):
    path = _conv1d(tmp_path / "conv_fixed.onnx", [B, C_IN, L])
    g = graph_from_onnx(path)
    assert (g.meta["batch"], g.meta["seq"]) == (B, L)  # was (2, 16): the channels taken for the sequence
    # the exported length is met; any other is refused, naming the file's own
    assert step_graph(path, _opts(seq=L)).meta["seq"] == L
    with pytest.raises(GraphError, match=rf"fixed \(batch {B}, seq {L}\), so seq {C_IN} cannot be applied"):
        step_graph(path, _opts(seq=C_IN))


def test_fixed_transformer_layout_still_reads_axis_1(tmp_path):
    path = _conv1d(tmp_path / "tokens_fixed.onnx", [B, L, C_IN], transformer_layout=True)
    assert (graph_from_onnx(path).meta["batch"], graph_from_onnx(path).meta["seq"]) == (B, L)


@pytest.mark.parametrize("seq", [64, 256])
def test_symbolic_length_is_bound_from_seq_and_the_conv_follows_it(tmp_path, seq):
    path = _conv1d(tmp_path / "conv_dyn.onnx", ["batch", C_IN, "seq"])
    g = step_graph(path, _opts(batch=B, seq=seq))
    assert g.meta["seq"] == seq and g.meta["dims"] == {"batch": B, "seq": seq}
    assert _conv_flops(g) == 2 * B * C_OUT * seq * C_IN * K


def test_a_length_bound_by_dim_and_a_different_seq_is_a_clash_not_fixed_dims(tmp_path):
    path = _conv1d(tmp_path / "conv_len.onnx", ["batch", C_IN, "length"])  # a name not read as the sequence
    assert step_graph(path, _opts(batch=B, dims={"length": 128})).meta["seq"] == 128
    assert step_graph(path, _opts(batch=B, seq=128, dims={"length": 128})).meta["seq"] == 128
    with pytest.raises(GraphError, match=r"seq 100 contradicts --dim length=128: the symbolic dim 'length' is the "
                                         r"file's sequence axis"):
        step_graph(path, _opts(batch=B, seq=100, dims={"length": 128}))


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic-seq", "fixed"])
def test_torch_exported_conv1d(tmp_path, dynamic):
    torch = pytest.importorskip("torch")
    conv = torch.nn.Conv1d(C_IN, C_OUT, K, padding=1).eval()
    path = tmp_path / "conv.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(conv, (torch.randn(B, C_IN, L),), str(path), dynamo=False, input_names=["x"],
                          **({"dynamic_axes": {"x": {0: "batch", 2: "seq"}}} if dynamic else {}))
    seq = 3 * L if dynamic else L
    g = step_graph(str(path), _opts(batch=B, seq=seq))
    assert g.meta["seq"] == seq
    flops = g.nodes.loc[(g.nodes["op_class"] == "conv") & (g.nodes["phase"] == "forward"), "flops"].sum()
    assert flops == 2 * B * C_OUT * seq * C_IN * K
