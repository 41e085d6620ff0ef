"""MFU does not depend on how a model's attention was written: the ONNX and torch.export importers count a
matmul-written attention core's model FLOPs as the Hugging Face path's eager attention does (hf_blocks.eager_attention):
QK^T and PV at the pairs the mask keeps (featurize/op_graph.attention_pair_share: causal self-attention half), the
scale / mask / softmax / dropout kernels between them not at all. Until this change both importers counted the full
S x S products and the softmax side: nanoGPT (2 layers, d 256, S 128) read 1.0168e9 forward model FLOPs through ONNX
and torch.export against 0.9814e9 through its config (+3.6%). Causality is decided from the mask's ancestry (a
``Trilu`` / ``tril``, a constant with a triangular pattern, a comparison of two position ``arange``s); a mask it cannot
decide, or none, counts the products whole. The kernels' FLOPs and every time are as before."""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pytest

from conftest import EXAMPLES

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from wattcast.featurize.attention_mask import is_triangular_mask  # noqa: E402
from wattcast.featurize.onnx import graph_from_onnx  # noqa: E402
from wattcast.featurize.op_graph import OpGraph  # noqa: E402
from wattcast.featurize.torch_import import graph_from_module  # noqa: E402
from wattcast.featurize.training_graph import training_graph  # noqa: E402
from wattcast.featurize.workload import StepOptions, step_graph  # noqa: E402
from wattcast.simulate.single_device import model_flops  # noqa: E402

DIMS = dict(n_layer=2, n_head=4, n_embd=256, vocab_size=1000, block_size=128)
BATCH, SEQ = 2, 128


def _nanogpt():
    sys.path.insert(0, str(EXAMPLES))
    try:
        from nanogpt import GPT, GPTConfig
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    return GPT(GPTConfig(**DIMS, dropout=0.0, bias=True, attention="eager")).eval()


def _export(module, path, args, dynamo):
    torch.onnx.export(module, args, str(path), dynamo=dynamo)
    return path


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """nanoGPT's causal eager attention (``masked_fill(bias[:, :, :T, :T] == 0, -inf)`` with a registered ``tril``
    buffer) through its config, torch.export and both ONNX exporters (the dynamo one folds the mask into a bool
    initializer in an external-data file; the TorchScript one keeps ``Slice`` + ``Equal`` of the buffer)."""
    m = _nanogpt()
    d = tmp_path_factory.mktemp("onnx")
    idx = torch.zeros(BATCH, SEQ, dtype=torch.long)
    cfg = {"model_type": "gpt2", "n_layer": DIMS["n_layer"], "n_head": DIMS["n_head"], "n_embd": DIMS["n_embd"],
           "vocab_size": DIMS["vocab_size"], "n_positions": DIMS["block_size"], "activation_function": "gelu"}
    return {"config": step_graph(cfg, StepOptions(batch=BATCH, seq=SEQ, mode="inference", logits="all")),
            "torch.export": graph_from_module(m, batch=BATCH, seq=SEQ),
            "onnx-dynamo": graph_from_onnx(_export(m, d / "dyn.onnx", (idx,), True), batch=BATCH, seq=SEQ),
            "onnx-torchscript": graph_from_onnx(_export(m, d / "ts.onnx", (idx,), False), batch=BATCH, seq=SEQ)}


def _core(g: OpGraph):
    n = g.nodes
    core = n[n["tag"] == "attn_core"]
    return core[core["op_class"] == "bmm"], core[core["op_class"] != "bmm"]


@pytest.mark.parametrize("name", ["torch.export", "onnx-dynamo", "onnx-torchscript"])
def test_imported_causal_attention_counts_the_config_paths_model_flops(graphs, name):
    g, ref = graphs[name], graphs["config"]
    d, L = DIMS["n_embd"], DIMS["n_layer"]
    products, side = _core(g)
    assert len(products) == 2 * L and (products["model_share"] == 0.5).all()
    assert len(side) >= 2 * L and (side["model_share"] == 0.0).all()  # scale, mask, softmax
    # QK^T and PV over the causal half: 2 x 2 B S^2 d / 2 a layer (Megatron-LM's count)
    assert float((products["flops"] * products["model_share"]).sum()) == 2 * BATCH * SEQ**2 * d * L
    mine, theirs = model_flops(g.nodes)[0], model_flops(ref.nodes)[0]
    assert mine == pytest.approx(theirs, rel=0.01), (name, mine, theirs)  # the old count: +3.6%
    # hardware FLOPs are the kernels', unchanged: the model's plus what they leave out
    assert sum(model_flops(g.nodes)) == pytest.approx(float(g.nodes["flops"].sum()), rel=1e-12)


@pytest.mark.parametrize("name", ["torch.export", "onnx-torchscript"])
def test_training_step_keeps_the_shares_in_backward(graphs, name):
    g = training_graph(graphs[name])
    n = g.nodes
    products = n[(n["tag"] == "attn_core") & (n["op_class"] == "bmm") & (n["phase"] != "optimizer")]
    assert (products["model_share"] == 0.5).all() and (products["phase"] == "backward").sum() == 4 * DIMS["n_layer"]
    # forward and the two gradient products of each: 3 x the forward count
    assert float((products["flops"] * products["model_share"]).sum()) == 3 * 2 * BATCH * SEQ**2 * DIMS["n_embd"] * DIMS["n_layer"]


def test_step_time_does_not_read_the_share(graphs):
    """The share enters model FLOPs (MFU) alone: the same graph with every share at 1 costs the same step."""
    from wattcast.data.catalog import resolve_device
    from wattcast.simulate.single_device import predict_graph

    g = training_graph(graphs["onnx-dynamo"])
    spec = resolve_device("H100-SXM")
    whole = replace(g, nodes=g.nodes.assign(model_share=1.0))
    a, b = predict_graph(g, spec), predict_graph(whole, spec)
    assert a.step_time_ms == b.step_time_ms and a.energy_j == b.energy_j
    assert a.flops < b.flops and a.mfu < b.mfu


# ---------------------------------------------------------------- small modules, both importers

class _Attn(torch.nn.Module):
    """One self-attention written out in matmuls; ``mask`` says how (or whether) it is causal."""

    def __init__(self, mask: str, s: int = 16, d: int = 32, h: int = 2):
        super().__init__()
        self.mask, self.h = mask, h
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        if mask == "additive_buffer":  # 0 on and below the diagonal, -inf above
            self.register_buffer("bias", torch.full((s, s), float("-inf")).triu(1))
        elif mask == "band_buffer":  # a sliding window of 4: not causal by this test (undecided)
            self.register_buffer("bias", (torch.ones(s, s).tril() - torch.ones(s, s).tril(-4)).bool())

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (d // self.h) ** -0.5
        if self.mask == "tril":
            att = att.masked_fill(torch.tril(torch.ones(s, s, device=x.device)) == 0, float("-inf"))
        elif self.mask == "triu_inverted":
            att = att.masked_fill(torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        elif self.mask == "arange":
            i = torch.arange(s, device=x.device)
            att = att.masked_fill(i[None, :] > i[:, None], float("-inf"))
        elif self.mask == "additive_buffer":
            att = att + self.bias[:s, :s]
        elif self.mask == "band_buffer":
            att = att.masked_fill(~self.bias[:s, :s], float("-inf"))
        y = torch.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


CAUSAL = ["tril", "triu_inverted", "arange", "additive_buffer"]


def _products_share(g: OpGraph) -> list[float]:
    products, side = _core(g)
    assert len(products) == 2 and (side["model_share"] == 0.0).all() and len(side) >= 2
    return sorted(set(products["model_share"]))


@pytest.mark.parametrize("mask", [*CAUSAL, "none", "band_buffer"])
def test_torch_export_decides_causality_from_the_mask(mask):
    x = torch.randn(2, 16, 32)
    g = graph_from_module(_Attn(mask).eval(), (x,))
    assert _products_share(g) == ([0.5] if mask in CAUSAL else [1.0])


@pytest.mark.parametrize("mask", ["additive_buffer", "band_buffer"])
def test_exported_program_reads_its_own_real_buffers(mask):
    """``graph_from_exported_program`` on a program exported with real weights reads its buffers' values itself."""
    from wattcast.featurize.torch_import import graph_from_exported_program

    ep = torch.export.export(_Attn(mask).eval(), (torch.randn(2, 16, 32),), strict=False)
    assert _products_share(graph_from_exported_program(ep)) == ([0.5] if mask in CAUSAL else [1.0])


@pytest.mark.parametrize("dynamo", [True, False])
@pytest.mark.parametrize("mask", [*CAUSAL, "none", "band_buffer"])
def test_onnx_export_decides_causality_from_the_mask(mask, dynamo, tmp_path):
    x = torch.randn(2, 16, 32)
    g = graph_from_onnx(_export(_Attn(mask).eval(), tmp_path / "a.onnx", (x,), dynamo))
    assert _products_share(g) == ([0.5] if mask in CAUSAL else [1.0])


# ---------------------------------------------------------------- hand-written ONNX masks

F, B_ = TensorProto.FLOAT, TensorProto.BOOL
S = 8


def _core_model(mask_nodes, mask_name, inits=(), inputs=()):
    """scores = Q K^T * 0.25; Where(mask, -inf, scores) (or Add(scores, mask) for a float mask); softmax; @ V."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]), helper.make_node("Mul", ["qk", "quarter"], ["sc"]),
             *mask_nodes]
    float_mask = mask_name.startswith("add:")
    if float_mask:
        nodes.append(helper.make_node("Add", ["sc", mask_name[4:]], ["masked"]))
    else:
        nodes.append(helper.make_node("Where", [mask_name, "ninf", "sc"], ["masked"]))
    nodes += [helper.make_node("Softmax", ["masked"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    shape = [2, 2, S, 16]
    ins = [helper.make_tensor_value_info(n, F, shape) for n in ("q", "k", "v")] + list(inputs)
    inits = [numpy_helper.from_array(np.array(0.25, np.float32), "quarter"),
             numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf"), *inits]
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", F, shape)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _i64(name, v):
    return numpy_helper.from_array(np.array(v, np.int64), name)


def _onnx_masks():
    ones = numpy_helper.from_array(np.ones((S, S), bool), "ones")
    yield "trilu_not", True, _core_model([helper.make_node("Trilu", ["ones"], ["tril"], upper=0),
                                          helper.make_node("Not", ["tril"], ["m"])], "m", [ones])
    yield "triu_k1", True, _core_model([helper.make_node("Trilu", ["ones", "one"], ["m"], upper=1)], "m",
                                       [ones, _i64("one", 1)])
    yield "trilu_band_k-4", False, _core_model([helper.make_node("Trilu", ["ones", "diag"], ["m"], upper=0)], "m",
                                               [ones, _i64("diag", -4)])
    # arange row vs column: Range(0, S) unsqueezed both ways, Greater
    yield "range_greater", True, _core_model([
        helper.make_node("Range", ["zero", "s", "one"], ["r"]),
        helper.make_node("Unsqueeze", ["r", "ax0"], ["row"]), helper.make_node("Unsqueeze", ["r", "ax1"], ["col"]),
        helper.make_node("Greater", ["row", "col"], ["m"])], "m",
        [_i64("zero", 0), _i64("s", S), _i64("one", 1), _i64("ax0", [0]), _i64("ax1", [1])])
    # the same comparison of a Range with a constant: a 1-D threshold, not a triangle
    yield "range_vs_constant", False, _core_model([
        helper.make_node("Range", ["zero", "s", "one"], ["r"]), helper.make_node("Greater", ["r", "three"], ["m"])],
        "m", [_i64("zero", 0), _i64("s", S), _i64("one", 1), _i64("three", 3)])
    additive = np.triu(np.full((1, 1, S, S), -np.inf, np.float32), 1)
    yield "additive_initializer", True, _core_model([], "add:am", [numpy_helper.from_array(additive, "am")])
    yield "bool_tril_initializer_sliced", True, _core_model([
        helper.make_node("Slice", ["big", "st", "en", "axes"], ["sl"]), helper.make_node("Equal", ["sl", "zf"], ["m"])],
        "m", [numpy_helper.from_array(np.tril(np.ones((1, 1, 2 * S, 2 * S), np.float32)), "big"),
              _i64("st", [0, 0]), _i64("en", [S, S]), _i64("axes", [2, 3]),
              numpy_helper.from_array(np.array(0.0, np.float32), "zf")])
    yield "mask_input", False, _core_model([], "m", inputs=[helper.make_tensor_value_info("m", B_, [1, 1, S, S])])
    yield "no_mask", False, _core_model([], "add:zero_bias", [numpy_helper.from_array(np.zeros((1, 1, S, S), np.float32),
                                                                                       "zero_bias")])


@pytest.mark.parametrize("name,causal,model", list(_onnx_masks()), ids=[m[0] for m in _onnx_masks()])
def test_onnx_mask_ancestry(name, causal, model):
    g = graph_from_onnx(model)
    assert _products_share(g) == ([0.5] if causal else [1.0]), name


def test_external_data_mask_is_read_from_its_file(tmp_path):
    """The dynamo exporter writes every initializer to ``<model>.onnx.data``: a mask there is read from its bytes; the
    same model without its data file is undecided (counted whole), not an error."""
    big = np.tril(np.ones((S, S), bool))
    model = _core_model([helper.make_node("Not", ["tril"], ["m"])], "m", [numpy_helper.from_array(big, "tril")])
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="m.onnx.data",
                    size_threshold=0)
    assert _products_share(graph_from_onnx(path)) == [0.5]
    (tmp_path / "m.onnx.data").unlink()
    assert _products_share(graph_from_onnx(path)) == [1.0]


@pytest.mark.parametrize("values,expected", [
    (np.tril(np.ones((4, 4), bool)), True),
    (np.triu(np.ones((1, 2, 4, 4), np.int64), 1), True),  # inverted (masked_fill's), leading dims
    (np.triu(np.full((4, 4), -np.inf, np.float32), 1), True),  # additive
    (np.tril(np.ones((3, 5), bool), 2), True),  # bottom-right aligned: 2 cached keys
    (np.tril(np.ones((4, 4), bool), -1), False),  # strictly below: the diagonal masked
    (np.ones((4, 4), bool), False),
    (np.tril(np.ones((4, 4))) - np.tril(np.ones((4, 4)), -2), False),  # a band
    (np.stack([np.tril(np.ones((4, 4))), np.ones((4, 4))]), False),  # one slice is not
    (np.tril(np.ones((1, 4))), False),
])
def test_triangular_pattern(values, expected):
    assert is_triangular_mask(values) is expected
