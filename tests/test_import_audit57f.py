"""Audit 57f's CNN import findings, on both import paths (torch.export and a training-mode ONNX export):

1. saved activations count one storage per tensor, as PyTorch keeps them: BatchNorm saves its input (torch.export
   saved nothing), a ReLU keeps its result, the tensor the next conv saves (counted twice before); the ground truth is
   eager PyTorch's ``saved_tensors_hooks`` counting unique storages on the CPU;
2. ``Resize`` (``F.interpolate``) has the output size its constant scales / sizes give, and a Resize whose size is
   unknown is flagged (the ops after it were silently costed at the input's size, a residual add then at 0 FLOPs);
4. training-mode BatchNorm is costed by the same kernel model on both paths (the LayerNorm family), inference-mode
   BatchNorm as a per-channel affine; GroupNorm from torch.export as ONNX's GroupNorm (the LayerNorm kernel);
5. an ONNX conv costed by the roofline is warned about, with the torch.export importer's wording.

The models are made here with torch on the CPU."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from onnx import TensorProto, helper  # noqa: E402

from wattcast.featurize.onnx import graph_from_onnx  # noqa: E402
from wattcast.featurize.op_graph import BACKWARD_RATIO_IN_STREAM  # noqa: E402
from wattcast.featurize.torch_import import graph_from_module  # noqa: E402
from wattcast.featurize.training_graph import training_graph  # noqa: E402
from wattcast.simulate.memory import estimate_memory  # noqa: E402

B, C, S = 2, 8, 16


def _onnx(m, x, path, *, training: bool = True) -> str:
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (x,), str(path), dynamo=False, training=mode, do_constant_folding=False,
                          input_names=["x"], dynamic_axes={"x": {0: "batch"}}, opset_version=17)
    return str(path)


def _graphs(m, x, tmp_path, *, train: bool = True):
    """(torch.export graph, ONNX graph) of module ``m`` at input ``x``, fp32."""
    m.train(train)
    g_exp = graph_from_module(m, (x,), dtype="fp32", train=train)
    g_onnx = graph_from_onnx(_onnx(m, x, tmp_path / "m.onnx", training=train), batch=x.shape[0], dtype="fp32",
                             train=train)
    return g_exp, g_onnx


def _fwd(g):
    return g.nodes[g.nodes["phase"] == "forward"]


def _eager_saved_bytes(m, x) -> int:
    """Bytes of the unique non-parameter storages eager PyTorch saves for backward (audit 57f eager_saved_tiny.py)."""
    params = {p.data_ptr() for p in m.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        if t.data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    m.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m(x)
    return sum(seen.values())


def _activation_bytes(g) -> float:
    tg = training_graph(g)
    tg.meta["mode"] = "train"
    return estimate_memory(tg).activations_gb * 1e9


def _conv(cin=C, cout=C):
    return nn.Conv2d(cin, cout, 3, padding=1, bias=False)


CHAINS = {
    "conv": lambda: nn.Sequential(_conv()),
    "conv_bn": lambda: nn.Sequential(_conv(), nn.BatchNorm2d(C)),
    "conv_bn_relu": lambda: nn.Sequential(_conv(), nn.BatchNorm2d(C), nn.ReLU()),
    "conv_relu_conv": lambda: nn.Sequential(_conv(), nn.ReLU(), _conv()),
    "conv_bn_relu_inplace_conv": lambda: nn.Sequential(_conv(), nn.BatchNorm2d(C), nn.ReLU(inplace=True), _conv()),
}


# ------------------------------------------------------------------ 1. saved activations
@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_saved_activations_match_eager_pytorch_on_both_paths(tmp_path, chain):
    torch.manual_seed(0)
    m = CHAINS[chain]()
    x = torch.randn(B, C, S, S)
    one = x.numel() * 4  # one (B, C, S, S) fp32 tensor
    eager = _eager_saved_bytes(m, x)
    g_exp, g_onnx = _graphs(m, x, tmp_path)
    # BatchNorm's per-channel save_mean / save_invstd are a few bytes on both sides: units of one tensor, to 0.05
    want = eager / one
    assert _activation_bytes(g_exp) / one == pytest.approx(want, abs=0.05), "torch.export"
    assert _activation_bytes(g_onnx) / one == pytest.approx(want, abs=0.05), "ONNX"


# ------------------------------------------------------------------ 4. BatchNorm / GroupNorm costing
def _bn_rows(g):
    f = _fwd(g)
    return f[f["name"].str.contains("batch_norm|BatchNormalization", case=False)]


def test_training_batchnorm_costed_alike_by_the_kernel_models(tmp_path):
    m = nn.Sequential(_conv(), nn.BatchNorm2d(C), nn.ReLU())
    x = torch.randn(4, C, S, S)
    g_exp, g_onnx = _graphs(m, x, tmp_path)
    n = 4 * C * S * S
    for g in (g_exp, g_onnx):
        bn = _bn_rows(g)
        assert len(bn) == 1, g.meta["source"]
        row = bn.iloc[0]
        # one LayerNorm-family kernel over all the elements (statistics and normalisation), no roofline
        assert (row["op_class"], row["kernel"], row["method"]) == ("layernorm", "ln", "surrogate"), g.meta["source"]
        assert row["B"] * row["H"] * row["scale"] == pytest.approx(n)
        assert row["param_count"] == 2 * C
        assert not g.meta.get("unmapped_ops"), g.meta["source"]
        bw = training_graph(g).nodes
        grad = bw[(bw["phase"] == "backward") & (bw["fwd_id"] == bn.index[0])]
        grad = grad[grad["kernel"] == "ln"]
        # the LayerNorm backward / forward ratio (fp32: the in-stream one)
        assert len(grad) == 1
        assert grad.iloc[0]["scale"] == pytest.approx(BACKWARD_RATIO_IN_STREAM["layernorm"] * row["scale"])
    a, o = _bn_rows(g_exp).iloc[0], _bn_rows(g_onnx).iloc[0]
    assert (a["B"], a["H"], a["flops"], a["bytes"]) == (o["B"], o["H"], o["flops"], o["bytes"])
    assert g_exp.param_count == g_onnx.param_count == 9 * C * C + 2 * C


def test_inference_batchnorm_is_a_per_channel_affine(tmp_path):
    m = nn.Sequential(_conv(), nn.BatchNorm2d(C))
    x = torch.randn(4, C, S, S)
    g_exp, g_onnx = _graphs(m, x, tmp_path, train=False)
    for g in (g_exp, g_onnx):
        bn = _bn_rows(g)
        assert len(bn) == 1 and bn.iloc[0]["op_class"] == "elementwise" and bn.iloc[0]["kernel"] in ("mul", "mulu")


def test_group_norm_from_torch_export_is_onnx_group_norm(tmp_path):
    groups = 4
    m = nn.Sequential(_conv(), nn.GroupNorm(groups, C), nn.SiLU())
    x = torch.randn(4, C, S, S)
    g_exp = graph_from_module(m.train(), (x,), dtype="fp32", train=True)
    assert not g_exp.meta["unmapped_ops"]
    ln = _fwd(g_exp)[_fwd(g_exp)["kernel"] == "ln"]
    assert len(ln) == 1 and (ln.iloc[0]["B"], ln.iloc[0]["H"]) == (4 * groups, C // groups * S * S)
    assert ln.iloc[0]["param_count"] == 2 * C
    # an ONNX GroupNormalization (opset 18) is the same kernel
    nodes = [helper.make_node("GroupNormalization", ["x", "g", "b"], ["y"], num_groups=groups, name="gn")]
    graph = helper.make_graph(nodes, "gn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, C, S, S])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, C, S, S])],
                              [helper.make_tensor("g", TensorProto.FLOAT, [C], np.ones(C)),
                               helper.make_tensor("b", TensorProto.FLOAT, [C], np.zeros(C))])
    g_onnx = graph_from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), dtype="fp32")
    o = _fwd(g_onnx)[_fwd(g_onnx)["kernel"] == "ln"].iloc[0]
    assert (o["B"], o["H"]) == (ln.iloc[0]["B"], ln.iloc[0]["H"])


# ------------------------------------------------------------------ 2. Resize
class _UpRes(nn.Module):
    """conv stride 2 -> F.interpolate(x2) -> conv, plus the input: the second conv and the add run at the input's size."""

    def __init__(self):
        super().__init__()
        self.down, self.up = nn.Conv2d(C, 2 * C, 3, 2, 1), nn.Conv2d(2 * C, C, 3, padding=1)

    def forward(self, x):
        return self.up(F.interpolate(self.down(x), scale_factor=2.0, mode="nearest")) + x


def test_interpolate_resize_has_its_scaled_size(tmp_path):
    m = _UpRes()
    x = torch.randn(4, C, S, S)
    g_exp, g_onnx = _graphs(m, x, tmp_path)
    conv_o = _fwd(g_onnx).set_index("name").loc["/up/Conv"]
    assert conv_o["Input_Size"] == S
    conv_e = _fwd(g_exp)[_fwd(g_exp)["kernel"] == "conv"].iloc[-1]
    assert conv_o["flops"] == conv_e["flops"] == 2.0 * 4 * C * S * S * 2 * C * 9
    add = _fwd(g_onnx).set_index("name").loc["/Add"]
    assert add["method"] == "surrogate" and add["flops"] == 4 * C * S * S
    assert not g_onnx.meta.get("warnings") and not g_onnx.meta.get("fallback_ops")


def _resize_model(opset: int, inputs: list[str], inits: list, x_shape=(2, 3, 8, 8), **attrs):
    nodes = [helper.make_node("Resize", inputs, ["y"], name="rs", mode="nearest", **attrs),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    graph = helper.make_graph(nodes, "rs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("case", ["sizes", "scales", "scales_axes", "sizes_not_larger"])
def test_resize_output_from_scales_or_sizes(case, monkeypatch):
    import onnx.shape_inference as si

    monkeypatch.setattr(si, "infer_shapes", lambda m, *a, **k: m)  # the importer's own rule, not ONNX inference
    f = TensorProto.FLOAT
    if case == "sizes":
        m = _resize_model(13, ["x", "", "", "sz"], [helper.make_tensor("sz", TensorProto.INT64, [4], [2, 3, 20, 12])])
        want = (2, 3, 20, 12)
    elif case == "scales":
        m = _resize_model(13, ["x", "", "sc"], [helper.make_tensor("sc", f, [4], [1, 1, 2.5, 0.5])])
        want = (2, 3, 20, 4)
    elif case == "scales_axes":
        m = _resize_model(18, ["x", "", "sc"], [helper.make_tensor("sc", f, [2], [3, 2])], axes=[2, 3])
        want = (2, 3, 24, 16)
    else:
        m = _resize_model(18, ["x", "", "", "sz"], [helper.make_tensor("sz", TensorProto.INT64, [2], [32, 16])],
                          axes=[2, 3], keep_aspect_ratio_policy="not_larger")
        want = (2, 3, 16, 16)
    g = graph_from_onnx(m, dtype="fp32")
    relu = _fwd(g).set_index("name").loc["relu"]
    assert relu["flops"] == np.prod(want)
    assert not g.meta.get("unknown_shapes") and not g.meta.get("warnings")


def test_resize_of_unknown_size_is_flagged(monkeypatch):
    import onnx.shape_inference as si

    monkeypatch.setattr(si, "infer_shapes", lambda m, *a, **k: m)
    # the scales computed from the input at run time (not a constant): the output size is unknown
    nodes = [helper.make_node("Relu", ["s"], ["sc"], name="scales"),
             helper.make_node("Resize", ["x", "", "sc"], ["y"], name="rs", mode="nearest")]
    graph = helper.make_graph(nodes, "rs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8]),
                                            helper.make_tensor_value_info("s", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    g = graph_from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), dtype="fp32")
    assert any("rs (Resize)" in w and "output size is unknown" in w for w in g.meta["warnings"])
    assert any("value shape(s) could be neither inferred nor computed" in w for w in g.meta["warnings"])


# ------------------------------------------------------------------ 5. roofline convs warned on both paths
def test_depthwise_conv_roofline_warned_on_both_paths(tmp_path):
    m = nn.Sequential(nn.Conv2d(C, C, 7, padding=3, groups=C), nn.Conv2d(C, C, 1))
    x = torch.randn(4, C, S, S)
    g_exp, g_onnx = _graphs(m, x, tmp_path)
    for g, op in ((g_exp, "aten.conv2d.default"), (g_onnx, "Conv")):
        assert g.meta["unmapped_ops"] == {op: 1}
        w = g.meta["warnings"][0]
        assert w.startswith("1 op(s) have no cost model and are costed by the roofline") and f"{op} x1" in w
        dw = _fwd(g)[_fwd(g)["method"] == "roofline"]
        assert len(dw) == 1 and dw.iloc[0]["op_class"] == "conv"
