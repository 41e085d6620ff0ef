"""The torch.export importer: a nanoGPT (eager and SDPA attention) on the meta device, parameter and FLOP
accounting, the training graph derived from it, flagged unmapped ops and export failures."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from conftest import EXAMPLES, load_script  # noqa: E402

from wattcast.featurize.op_graph import GraphError  # noqa: E402
from wattcast.featurize.torch_import import graph_from_module  # noqa: E402
from wattcast.featurize.training_graph import training_graph  # noqa: E402


def _load_nanogpt():
    return load_script(EXAMPLES / "nanogpt.py", "wattcast_example_nanogpt")


nanogpt = _load_nanogpt()
B, S = 2, 64
GEMM = ("linear", "bmm", "flash_attention")


def _config(attention: str, **kw):
    base = dict(n_layer=2, n_head=4, n_embd=256, vocab_size=512, block_size=64, attention=attention)
    base.update(kw)
    return nanogpt.GPTConfig(**base)


def _meta_gpt(attention: str, **kw):
    with torch.device("meta"):
        return nanogpt.GPT(_config(attention, **kw))


@pytest.fixture(scope="module", params=["eager", "sdpa"])
def traced(request):
    model = _meta_gpt(request.param)
    return request.param, model, graph_from_module(model, batch=B, seq=S)


def test_param_count_layers_and_meta(traced):
    attention, model, g = traced
    cfg = model.config
    assert g.param_count == sum(p.numel() for p in model.parameters())  # the tied LM head counted once
    assert g.meta["source"] == "torch.export" and g.meta["n_layers"] == cfg.n_layer
    assert g.meta["unmapped_ops"] == {}
    assert g.meta["dtype"] == "fp32" and g.meta["batch"] == B and g.meta["seq"] == S
    nodes = g.nodes
    assert int(nodes["param_count"].sum()) == g.param_count  # every parameter owned by a node
    emb = nodes[nodes["op_class"] == "embedding"]
    assert len(emb) == 2 and set(emb["layer"]) == {-1}
    assert int(emb["param_count"].sum()) == (cfg.vocab_size + cfg.block_size) * cfg.n_embd
    head = nodes[nodes["scope"] == "lm_head"]
    assert len(head) == 1 and head["param_count"].iloc[0] == 0  # tied to the token embedding
    assert head["layer"].iloc[0] == cfg.n_layer and head["K"].iloc[0] == cfg.vocab_size
    assert set(nodes.loc[nodes["scope"] == "transformer.ln_f", "layer"]) == {cfg.n_layer}
    blocks = nodes[nodes["scope"].str.startswith("transformer.h.")]
    assert sorted(set(blocks["layer"])) == list(range(cfg.n_layer))
    assert (blocks["scope"].str.extract(r"transformer\.h\.(\d+)")[0].astype(int) == blocks["layer"]).all()
    # 4 linears per block + the LM head, all as linear kernels with their shapes
    lin = nodes[nodes["op_class"] == "linear"]
    assert len(lin) == 4 * cfg.n_layer + 1
    assert set(lin["M"]) == {B * S}
    if attention == "eager":
        core = nodes[nodes["tag"] == "attn_core"]
        # per layer: Q K^T, scale, masked_fill, softmax, P V (dropout 0 adds no kernel)
        first_layer = core["name"].str.replace(r"_\d+$", "", regex=True)[:5]
        assert list(first_layer) == ["matmul", "mul", "masked_fill", "softmax", "matmul"]
        assert len(core) == 5 * cfg.n_layer
        assert (nodes["op_class"] == "bmm").sum() == 2 * cfg.n_layer
    else:
        fa = nodes[nodes["op_class"] == "flash_attention"]
        assert len(fa) == cfg.n_layer and (fa["tag"] == "attn_core").all()
        assert (nodes["op_class"] == "bmm").sum() == 0 and (nodes["op_class"] == "softmax").sum() == 0


def test_forward_flops_match_the_transformer_formula(traced):
    """Forward FLOPs = 2 * non-embedding params * tokens        (every weight: one multiply-add per token)
                     + 4 * B * S^2 * n_embd * n_layer           (attention: Q K^T and P V, 2 * B * S^2 * n_embd each)
                     + 2 * tokens * n_embd * vocab              (the tied LM head)
    non-embedding params = all parameters - token and position embeddings (biases and LayerNorms included).
    Fused causal attention (SDPA) computes only the lower triangle: its attention term is half."""
    attention, model, g = traced
    cfg = model.config
    tokens = B * S
    non_embedding = model.get_num_params(non_embedding=True)
    attn = 4 * B * S * S * cfg.n_embd * cfg.n_layer * (0.5 if attention == "sdpa" else 1.0)
    expected = 2 * non_embedding * tokens + attn + 2 * tokens * cfg.n_embd * cfg.vocab_size
    total = g.nodes["flops"].sum()
    assert abs(total / expected - 1) < 0.02, (total, expected)
    gemm = g.nodes.loc[g.nodes["op_class"].isin(GEMM), "flops"].sum()
    assert gemm / total > 0.97  # elementwise, LN, softmax are a small remainder


def test_training_graph_backward_is_twice_the_gemms(traced):
    attention, model, g = traced
    tg = training_graph(g)
    fwd, bw = tg.phase("forward"), tg.phase("backward")
    assert len(fwd) == len(g)
    fwd_gemm = fwd.loc[fwd["op_class"].isin(("linear", "bmm")), "flops"].sum()
    flash = fwd.loc[fwd["op_class"] == "flash_attention", "flops"].sum()
    expected = 2 * fwd_gemm + 2.5 * flash  # dX and dW per GEMM; FlashAttention-2 backward is 2.5x its forward
    assert abs(bw["flops"].sum() / expected - 1) < 0.05
    assert tg.meta["optimizer_param_count"] == g.param_count
    # the causal mask (a comparison on a buffer) and positions are off the gradient path
    assert not bw["name"].str.startswith("eq").any()
    sel = training_graph(g, recompute="selective")
    rec = sel.nodes[sel.nodes["recompute"]]
    assert len(rec) == (g.nodes["tag"] == "attn_core").sum() and len(rec) > 0


def test_dropout_only_in_training():
    model = _meta_gpt("eager", dropout=0.1)
    model.transformer.drop.eval()  # a mixed mode: restored module by module
    g_eval = graph_from_module(model, batch=1, seq=16)
    g_train = graph_from_module(model, batch=1, seq=16, train=True)
    assert (g_eval.nodes["op_class"] == "dropout").sum() == 0
    # embedding dropout, attention dropout, 2 residual dropouts per block
    assert (g_train.nodes["op_class"] == "dropout").sum() == 1 + 3 * model.config.n_layer
    assert model.training and not model.transformer.drop.training  # the caller's modes are restored


def test_loss_kwargs_and_dtype():
    model = _meta_gpt("sdpa")
    ids = torch.zeros(2, 16, dtype=torch.long)  # a CPU tensor: only its shape and dtype are used
    g = graph_from_module(model, (ids,), kwargs={"targets": torch.ones(2, 16, dtype=torch.long)}, dtype="bf16")
    loss = g.nodes[g.nodes["op_class"] == "loss"]
    assert len(loss) == 1 and loss["H"].iloc[0] == model.config.vocab_size and loss["B"].iloc[0] == 32
    assert g.meta["dtype"] == "bf16" and set(g.nodes["dtype"]) == {"bf16"}
    with torch.device("meta"):
        half = nanogpt.GPT(_config("sdpa")).to(torch.float16)
    assert graph_from_module(half, batch=1, seq=8).meta["dtype"] == "fp16"


def test_real_weights_are_not_moved():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    g = graph_from_module(model, (torch.randn(3, 16),))
    assert model[0].weight.device.type == "cpu" and model[0].weight.abs().sum() > 0
    assert g.param_count == sum(p.numel() for p in model.parameters())
    assert list(g.nodes["op_class"]) == ["linear", "elementwise", "layernorm", "linear"]
    assert g.meta["n_layers"] == 0 and set(g.nodes["layer"]) == {-1}


class _Unknown(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x):
        with torch.no_grad():
            frozen = self.proj(x)
        values, _ = torch.sort(x, dim=-1)
        return (self.proj(x) * self.scale + torch.cumsum(x, dim=-1) + values + frozen).mean()


def test_unknown_ops_are_flagged_not_dropped():
    model = _Unknown()
    g = graph_from_module(model, (torch.randn(4, 8),))
    assert g.meta["unmapped_ops"] == {"aten.cumsum.default": 1, "aten.sort.default": 1}
    opaque = g.nodes[g.nodes["method"] == "roofline"]
    assert sorted(opaque["name"]) == ["cumsum", "sort"]
    assert (opaque["bytes"] > 0).all()
    # the parameter used by an elementwise op is owned by it; every parameter is counted once
    assert g.param_count == 8 * 8 + 8 + 8 == int(g.nodes["param_count"].sum())
    # the no_grad linear has no backward kernels; the other one has dW, db but no dX (x needs no grad)
    bw = training_graph(g).phase("backward")
    lin = g.nodes.index[g.nodes["op_class"] == "linear"]
    assert len(lin) == 2
    assert (bw["fwd_id"] == lin[0]).sum() == 0
    assert sorted(bw.loc[bw["fwd_id"] == lin[1], "name"].str.split(".").str[-1]) == ["bgrad", "wgrad"]


def test_convolutions():
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 8, (3, 1)))
    g = graph_from_module(model, (torch.randn(2, 3, 16, 16),))
    conv = g.nodes[g.nodes["op_class"] == "conv"]
    assert list(conv["method"]) == ["surrogate", "roofline"]  # the (3, 1) kernel is not square: flagged
    assert conv["Input_Size"].iloc[0] == 16 and conv["Kernel_Size"].iloc[0] == 3
    assert conv["flops"].iloc[1] == 2 * (2 * 8 * 14 * 16) * 16 * 3
    assert g.meta["unmapped_ops"] == {"aten.conv2d.default": 1}
    assert g.param_count == sum(p.numel() for p in model.parameters()) == int(g.nodes["param_count"].sum())


class _LlamaStyle(nn.Module):
    """RMSNorm, an einsum projection, grouped-query SDPA, a SiLU-gated MLP, inside ``layers.N``."""

    def __init__(self, d: int = 64, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.h, self.kv, self.hd = heads, kv_heads, d // heads
        self.norm = nn.RMSNorm(d)
        self.wq = nn.Parameter(torch.empty(d, d))
        self.kv_proj = nn.Linear(d, 2 * kv_heads * self.hd, bias=False)
        self.gate = nn.Linear(d, 2 * d, bias=False)
        self.up = nn.Linear(d, 2 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        h = self.norm(x)
        q = torch.einsum("btd,de->bte", h, self.wq).view(b, t, self.h, self.hd).transpose(1, 2)
        k, v = self.kv_proj(h).view(b, t, 2, self.kv, self.hd).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + y.transpose(1, 2).reshape(b, t, d)
        return x + self.down(F.silu(self.gate(x)) * self.up(x))


class _LlamaStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_LlamaStyle(), _LlamaStyle()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_llama_style_ops_are_mapped():
    with torch.device("meta"):
        model = _LlamaStack()
    g = graph_from_module(model, (torch.zeros(2, 16, 64, device="meta"),), dtype="bf16")
    assert g.meta["unmapped_ops"] == {} and g.meta["n_layers"] == 2
    nodes = g.nodes
    assert g.param_count == sum(p.numel() for p in model.parameters()) == int(nodes["param_count"].sum())
    assert (nodes["kernel"] == "rmsnorm").sum() == 2
    q = nodes[nodes["name"].str.startswith("einsum")]
    assert list(q["op_class"]) == ["linear"] * 2 and list(q["param_count"]) == [64 * 64] * 2
    fa = nodes[nodes["op_class"] == "flash_attention"]
    # (B * heads, S, head_dim, S_kv); causal: half of 4 * B * heads * S * S_kv * head_dim
    assert list(fa[["B", "M", "N", "K"]].iloc[0]) == [8, 16, 16, 16]
    assert fa["flops"].iloc[0] == 2 * 2 * 4 * 16 * 16 * 16
    assert set(nodes.loc[nodes["op_class"] == "elementwise", "kernel"]) >= {"silu", "mul", "add"}


class _DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # a branch on a tensor value: not exportable
            return x * 2
        return x


def test_export_failure_is_a_graph_error():
    with pytest.raises(GraphError, match=r"torch\.export could not trace _DataDependent.*data-dependent"):
        graph_from_module(_DataDependent(), (torch.randn(3),))
    with pytest.raises(GraphError, match="batch and seq"):
        graph_from_module(_meta_gpt("eager"))
    with pytest.raises(GraphError, match="nn.Module"):
        graph_from_module(lambda x: x, batch=1, seq=1)


def test_op_table_names_a_handler_for_every_packet_and_keeps_the_priorities():
    """tables.RULES (ATen packet -> handler) is the whole mapping: every handler exists, and a packet in two families
    keeps the first (``_to_copy`` is a cast, ``cat`` a multi-input copy, ``copy`` a write into its destination)."""
    from wattcast.featurize.torch_import.assemble import _Importer
    from wattcast.featurize.torch_import.tables import _COPIES, _ELEMENTWISE, _GEMMS, _VIEWS, RULES

    assert all(callable(getattr(_Importer, h, None)) for h in set(RULES.values()))
    assert (RULES["_to_copy"], RULES["cat"], RULES["copy"], RULES["clone"]) == ("_cast", "_concat", "_copy_into", "_copy")
    assert all(RULES[p] == "_view" for p in _VIEWS) and all(RULES[p] == "_gemm" for p in _GEMMS)
    assert all(RULES[p] == "_elementwise" for p in _ELEMENTWISE) and set(_COPIES) <= set(RULES)
    assert RULES["max"] == "_max_min" and RULES["tril"] == "_triangular" and "sort" not in RULES


def test_token_ids_only_for_a_module_that_starts_with_an_embedding():
    """Without example_inputs a module is fed token ids (batch, seq) only when its first layer is an embedding: a
    Linear MLP was traced on integer ids (and "predicted") before; now it is refused, asking for example_inputs."""
    import wattcast

    mlp = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 10))
    for call in (lambda: wattcast.predict(mlp, "A100-SXM4-80GB"),
                 lambda: graph_from_module(mlp, batch=1, seq=1024)):
        with pytest.raises(GraphError, match=r"Sequential starts with 0 \(Linear\), not an embedding.*example_inputs"):
            call()
    with pytest.raises(GraphError, match="has no parameters.*example_inputs"):
        graph_from_module(nn.ReLU(), batch=1, seq=8)
    # with its inputs given it is traced on them
    r = wattcast.predict(mlp, "A100-SXM4-80GB", example_inputs=(torch.randn(8, 1024, device="meta"),))
    assert r.step_time_ms > 0 and r.meta["batch"] == 8
    # a module whose first layer is an embedding still takes token ids by default (nanoGPT: wte)
    tiny = nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 100))
    assert graph_from_module(tiny, batch=2, seq=16).meta["seq"] == 16
    assert wattcast.predict(_meta_gpt("eager"), "A100-SXM4-80GB", batch=1, seq=64).step_time_ms > 0


class _TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(256, 1024), nn.Linear(1024, 256)

    def forward(self, x):
        return self.b(F.gelu(self.a(x)))


def test_an_exported_program_is_predicted_as_the_module_it_unlifts_to():
    """wattcast.predict(ExportedProgram) said "cannot build a graph from a ExportedProgram"; it now runs ep.module() on
    the inputs it was exported with: the same step as the eager module on those inputs."""
    import wattcast

    x = torch.randn(4, 64, 256)
    ep = torch.export.export(_TwoLinears(), (x,))
    got = wattcast.predict(ep, "H100-SXM5-80GB").to_dict()
    want = wattcast.predict(_TwoLinears(), "H100-SXM5-80GB", example_inputs=(x,)).to_dict()
    assert got["step_time_ms"] == pytest.approx(want["step_time_ms"], rel=1e-12)
    assert got["param_count"] == want["param_count"] == 256 * 1024 * 2 + 1024 + 256


def test_a_saved_torch_model_file_is_refused_saying_how_to_load_it_without_unpickling(tmp_path, monkeypatch):
    """`wattcast predict -m m.pt2` said "cannot read as a JSON config: 'utf-8' codec can't decode byte 0xac"; now it
    names the file kind and what to do, without ever loading it (torch.load / torch.export.load are not called)."""
    import wattcast

    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(_TwoLinears(), (torch.randn(2, 8, 256),)), str(path))

    def refuse(*a, **k):
        raise AssertionError("a model file given by path must not be unpickled")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(torch.export, "load", refuse)
    with pytest.raises(GraphError) as e:
        wattcast.predict(str(path), "H100-SXM5-80GB")
    msg = str(e.value)
    assert "saved PyTorch model" in msg and "torch.export.load" in msg and "utf-8" not in msg


class _UpcastSoftmax(nn.Module):
    def forward(self, w):
        return torch.softmax(w, -1, dtype=torch.float32).to(w.dtype)


@pytest.mark.parametrize("dtype,names,bytes_per_el", [
    ("bf16", ["softmax.to_fp32", "softmax", "to"], [6, 8, 6]),  # cast, fp32 softmax, cast back
    ("fp16", ["softmax", "to"], [6, 6]),  # CUDA's half_to_float softmax, cast back
])
def test_softmax_dtype_argument_and_casts_are_costed_at_their_widths(dtype, names, bytes_per_el):
    """``softmax(w, -1, dtype=torch.float32).to(w.dtype)`` imports as the config path builds transformers' upcast
    (hf_blocks.softmax_upcast): the softmax in fp32 and each cast at the bytes it reads and writes."""
    x = torch.zeros(2, 4, 8, 16, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
    f = graph_from_module(_UpcastSoftmax(), (x,), dtype=dtype).nodes
    f = f[f["phase"] == "forward"]
    n = x.numel()
    assert list(f["name"]) == names
    assert list(f["bytes"]) == [b * n for b in bytes_per_el]
    assert set(f["dtype"]) == {"fp32"}
