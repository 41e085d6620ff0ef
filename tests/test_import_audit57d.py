"""Audit 57d's ONNX / torch.export import findings: a scatter into a new buffer has its data input's shape (#1); a ViT's
class-token concat keeps its token and counts its parameter (#2); a tied LM head saved with external data is
recognised by value (#5); ``--attention`` on an imported graph is reported as costed, honoured for a module's SDPA and
refused where the import cannot apply it (#6); an ONNX file asked for more positions than its learned table has is
refused (#7). The models are made here, with torch on the CPU (torch.onnx.export, legacy and dynamo exporters)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
nn = torch.nn

from wattcast.featurize.onnx import graph_from_onnx  # noqa: E402
from wattcast.featurize.op_graph import GraphError  # noqa: E402

DEVICE = "H100-SXM5-80GB"


def _export(m, args, path, *, dynamo: bool, **kw) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(m, args, str(path), opset_version=18, dynamo=True, **kw)
        else:
            torch.onnx.export(m, args, str(path), opset_version=17, dynamo=False, **kw)
    return str(path)


def _fwd(g):
    return g.nodes[g.nodes["phase"] == "forward"]


# ------------------------------------------------------------------ 1. scatter into a new buffer
class _ScatterPool(nn.Module):
    """x (B, 1024, 64) scatter_add-pooled into zeros (B, 16, 64), then Linear(64, 4096): the model's output is (B, 16,
    4096)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 4096)

    def forward(self, x, idx):
        pooled = torch.zeros(x.shape[0], 16, 64).scatter_add(1, idx, x)
        return self.fc(pooled)


@pytest.mark.parametrize("dynamo", [False, True])
def test_scatter_into_new_buffer_has_the_data_shape(tmp_path, dynamo):
    m = _ScatterPool().eval()
    x, idx = torch.randn(2, 1024, 64), torch.randint(0, 16, (2, 1024, 64))
    assert m(x, idx).shape == (2, 16, 4096)
    kw = {} if dynamo else dict(input_names=["x", "idx"], dynamic_axes={"x": {0: "batch"}, "idx": {0: "batch"}})
    path = _export(m, (x, idx), tmp_path / "scatter.onnx", dynamo=dynamo, **kw)
    g = graph_from_onnx(path, batch=2)
    n = _fwd(g)
    lin = n[n["kernel"] == "linear"].iloc[0]
    # the Linear after the pooling: M = 2 x 16 rows (until stop 57: 2 x 1,024, 64x the FLOPs)
    assert (lin["M"], lin["N"], lin["K"]) == (32, 64, 4096)
    assert lin["flops"] == pytest.approx(2 * 32 * 64 * 4096 + 32 * 4096)
    sc = n[n["name"].str.contains("catter")].iloc[0]
    # the scatter kernel itself moves its 2 x 1,024 x 64 updates
    assert sc["B"] * sc["H"] == 2 * 1024 * 64
    assert not g.meta.get("warnings") and not g.meta.get("fallback_ops")


def test_scatter_into_an_activation_keeps_the_data_shape():
    """ScatterND of (4, 1) updates rows into an activation (8, 32): the output is the data's (8, 32), the kernel a
    clone of the data (as before)."""
    from onnx import TensorProto, helper, numpy_helper

    F = TensorProto.FLOAT
    w = numpy_helper.from_array(np.ones((32, 16), np.float32), "W")
    ind = numpy_helper.from_array(np.array([[0], [2], [4], [6]], np.int64), "ind")
    g = helper.make_graph([helper.make_node("Relu", ["d"], ["r"], name="relu"),
                           helper.make_node("ScatterND", ["r", "ind", "u"], ["s"], name="scatter"),
                           helper.make_node("MatMul", ["s", "W"], ["y"], name="fc")],
                          "g", [helper.make_tensor_value_info("d", F, [8, 32]), helper.make_tensor_value_info("u", F, [4, 32])],
                          [helper.make_tensor_value_info("y", F, [8, 16])], [w, ind])
    gr = graph_from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    n = _fwd(gr)
    assert n.set_index("name").loc["fc", "M"] == 8
    assert n.set_index("name").loc["scatter", "B"] == 8


# ------------------------------------------------------------------ 2. class-token concat
class _ClsToken(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.fc = nn.Linear(d, d)

    def forward(self, x):  # x (B, N, d)
        return self.fc(torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1))


@pytest.mark.parametrize("d,dynamo", [(64, False), (768, False), (768, True)])
def test_class_token_concat_keeps_the_token_and_counts_it(tmp_path, d, dynamo):
    m = _ClsToken(d).eval()
    x = torch.randn(2, 16, d)
    kw = (dict(dynamic_shapes={"x": {0: torch.export.Dim("batch")}}) if dynamo
          else dict(input_names=["x"], dynamic_axes={"x": {0: "batch"}}))
    path = _export(m, (x,), tmp_path / "cls.onnx", dynamo=dynamo, **kw)
    g = graph_from_onnx(path, batch=4)
    n = _fwd(g)
    lin = n[n["kernel"] == "linear"].iloc[0]
    assert lin["M"] == 4 * 17  # the class token joins the 16 patches at any width (d=768: 16 until stop 57)
    assert g.param_count == sum(p.numel() for p in m.parameters()) == d * d + d + d  # the class token counted
    assert not g.meta.get("warnings")


def test_class_token_gets_a_gradient_in_training(tmp_path):
    m = _ClsToken(768).eval()
    path = _export(m, (torch.randn(2, 16, 768),), tmp_path / "cls.onnx", dynamo=False, input_names=["x"],
                   dynamic_axes={"x": {0: "batch"}})
    from wattcast.featurize.training_graph import training_graph

    t = training_graph(graph_from_onnx(path, batch=4, train=True))
    names = set(t.nodes["name"])
    cat = next(nm for nm in names if "Concat" in nm and not nm.endswith(".grad"))
    assert f"{cat}.grad" in names


# ------------------------------------------------------------------ 5. tied head with external data
class _TinyLM(nn.Module):
    def __init__(self, vocab=512, d=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.fc = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied

    def forward(self, ids):
        return self.head(torch.relu(self.fc(self.wte(ids))))


def _lm_files(tmp_path):
    m = _TinyLM().eval()
    emb = _export(m, (torch.randint(0, 512, (2, 8)),), tmp_path / "lm.onnx", dynamo=False, input_names=["ids"],
                  dynamic_axes={"ids": {0: "batch", 1: "seq"}})
    model = onnx.load(emb)
    ext_dir = tmp_path / "ext"
    ext_dir.mkdir()
    onnx.save_model(model, str(ext_dir / "lm.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="lm.onnx.data", size_threshold=0)
    return m, emb, str(ext_dir / "lm.onnx"), ext_dir / "lm.onnx.data"


def test_tied_head_recognised_with_external_data(tmp_path):
    m, emb, ext, data = _lm_files(tmp_path)
    want = sum(p.numel() for p in m.parameters())  # the tied table once
    assert graph_from_onnx(emb, batch=2, seq=8).param_count == want
    g = graph_from_onnx(ext, batch=2, seq=8)
    assert g.param_count == want  # until stop 57: the head counted again (+ 512 x 64)
    assert not any("tied" in w for w in g.meta.get("warnings") or [])


def test_tied_head_with_missing_external_data_is_flagged(tmp_path):
    m, _, ext, data = _lm_files(tmp_path)
    data.unlink()
    g = graph_from_onnx(ext, batch=2, seq=8)
    notes = [w for w in g.meta.get("warnings") or [] if w.startswith("tied weights not checked")]
    assert len(notes) == 1 and "lm.onnx.data" in notes[0] and "counted twice" in notes[0]


# ------------------------------------------------------------------ 7. seq beyond the learned position table
class _PosLM(nn.Module):
    def __init__(self, vocab=128, d=32, positions=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(positions, d)
        self.fc = nn.Linear(d, vocab)

    def forward(self, ids):
        pos = torch.arange(0, ids.shape[1], dtype=torch.long)
        return self.fc(self.wte(ids) + self.wpe(pos))


@pytest.mark.parametrize("dynamo", [False, True])
def test_seq_beyond_learned_positions_refused(tmp_path, dynamo):
    m = _PosLM().eval()
    ids = torch.randint(0, 128, (2, 16))
    kw = (dict(dynamic_shapes={"ids": {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("seq", max=64)}})
          if dynamo else dict(input_names=["ids"], dynamic_axes={"ids": {0: "batch", 1: "seq"}}))
    path = _export(m, (ids,), tmp_path / "pos.onnx", dynamo=dynamo, **kw)
    assert graph_from_onnx(path, batch=2, seq=64).meta["seq"] == 64  # the whole table: runs
    with pytest.raises(GraphError, match=r"seq 65 exceeds the model's 64 learned positions"):
        graph_from_onnx(path, batch=2, seq=65)
    with pytest.raises(GraphError, match=r"seq 100000 exceeds the model's 64 learned positions"):
        graph_from_onnx(path, batch=1, seq=100_000)  # a Range too long to fold: refused from its bounds


def test_seq_beyond_learned_positions_refused_by_the_cli(tmp_path):
    from typer.testing import CliRunner

    from wattcast.cli import app

    path = _export(_PosLM().eval(), (torch.randint(0, 128, (2, 16)),), tmp_path / "pos.onnx", dynamo=False,
                   input_names=["ids"], dynamic_axes={"ids": {0: "batch", 1: "seq"}})
    r = CliRunner().invoke(app, ["predict", "-m", path, "-d", DEVICE, "-b", "2", "-s", "128", "--mode", "inference"])
    assert r.exit_code == 2 and "exceeds the model's 64 learned positions" in " ".join(r.output.split())


# ------------------------------------------------------------------ 6. --attention on imported graphs
class _SdpaBlock(nn.Module):
    def __init__(self, vocab=256, d=64, heads=4):
        super().__init__()
        self.h = heads
        self.wte = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.wte(ids)
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


class _EagerBlock(_SdpaBlock):
    def forward(self, ids):
        x = self.wte(ids)
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (d // self.h) ** 0.5
        att = att.masked_fill(torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1), float("-inf")).softmax(-1)
        return self.out((att @ v).transpose(1, 2).reshape(b, s, d))


def _kernels(res):
    return set(res.nodes["op_class"].dropna()) | set(res.nodes["kernel"].dropna())


def test_module_sdpa_honours_attention():
    import wattcast

    m = _SdpaBlock()
    got = {a: wattcast.predict(m, DEVICE, batch=2, seq=128, mode="inference", attention=a)
           for a in ("eager", "flash", "flash1")}
    assert {"flash_attention", "fa2"} <= _kernels(got["flash"]) and {"flash_attention", "fa1"} <= _kernels(got["flash1"])
    assert "flash_attention" not in _kernels(got["eager"]) and "softmax" in _kernels(got["eager"])
    # until stop 57 attention="eager" costed the fused kernel and its settings said "eager"
    assert got["eager"].step_time_ms != got["flash"].step_time_ms
    assert [(got[a].meta["settings"]["attention"], got[a].meta["settings"]["flash_kernel"]) for a in got] == [
        ("eager", None), ("flash", "fa2"), ("flash1", "fa1")]
    fa = {a: got[a].nodes.loc[got[a].nodes["op_class"] == "flash_attention", "time_ms"].sum() for a in ("flash", "flash1")}
    assert fa["flash1"] > fa["flash"] > 0  # FlashAttention-1's kernel class is the slower one


def test_module_eager_core_reports_eager_and_refuses_flash1():
    import wattcast

    r = wattcast.predict(_EagerBlock(), DEVICE, batch=2, seq=128, mode="inference")
    assert (r.meta["settings"]["attention"], r.meta["settings"]["flash_kernel"]) == ("eager", None)
    with pytest.raises(GraphError, match=r"attention 'flash1' \(--attention\) cannot be applied"):
        wattcast.predict(_EagerBlock(), DEVICE, batch=2, seq=128, mode="inference", attention="flash1")


def test_onnx_attention_reported_as_costed_and_explicit_mismatch_refused(tmp_path):
    import wattcast
    from typer.testing import CliRunner

    from wattcast.cli import app

    path = _export(_EagerBlock().eval(), (torch.randint(0, 256, (2, 16)),), tmp_path / "att.onnx", dynamo=False,
                   input_names=["ids"], dynamic_axes={"ids": {0: "batch", 1: "seq"}})
    default = wattcast.predict(path, DEVICE, batch=2, seq=16, mode="inference")
    eager = wattcast.predict(path, DEVICE, batch=2, seq=16, mode="inference", attention="eager")
    # until stop 57 the default's settings said "flash" / "fa2" for the graph's softmax and bmm kernels
    assert (default.meta["settings"]["attention"], default.meta["settings"]["flash_kernel"]) == ("eager", None)
    assert eager.step_time_ms == default.step_time_ms and eager.meta["settings"]["attention"] == "eager"
    with pytest.raises(GraphError, match=r"attention 'flash1' \(--attention\) cannot be applied.*--attention eager"):
        wattcast.predict(path, DEVICE, batch=2, seq=16, mode="inference", attention="flash1")
    r = CliRunner().invoke(app, ["predict", "-m", path, "-d", DEVICE, "-b", "2", "-s", "16", "--mode", "inference",
                                 "--attention", "flash1"])
    assert r.exit_code == 2 and "--attention" in r.output
    r = CliRunner().invoke(app, ["predict", "-m", path, "-d", DEVICE, "-b", "2", "-s", "16", "--mode", "inference",
                                 "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["settings"]["attention"] == "eager"


def test_onnx_without_attention_reports_none(tmp_path):
    import wattcast

    path = _export(_ClsToken(64).eval(), (torch.randn(2, 16, 64),), tmp_path / "cls.onnx", dynamo=False,
                   input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    for a in ("flash", "eager"):  # no attention: nothing is costed otherwise, the settings say so
        r = wattcast.predict(path, DEVICE, batch=2, mode="inference", attention=a)
        assert r.meta["settings"]["attention"] is None and r.meta["settings"]["flash_kernel"] is None
