"""The same model through three importers: config generator, torch.export and ONNX agree on FLOPs and parameters."""

from __future__ import annotations

import sys

import pytest

from conftest import EXAMPLES

torch = pytest.importorskip("torch")

DIMS = dict(n_layer=2, n_head=4, n_embd=256, vocab_size=1000, block_size=128)
BATCH, SEQ = 2, 128


@pytest.fixture(scope="module")
def nanogpt():
    sys.path.insert(0, str(EXAMPLES))
    try:
        from nanogpt import GPT, GPTConfig
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    return GPT(GPTConfig(**DIMS, dropout=0.0, bias=True, attention="eager")).eval()


@pytest.fixture(scope="module")
def graphs(nanogpt, tmp_path_factory):
    from wattcast.featurize.onnx import graph_from_onnx
    from wattcast.featurize.torch_import import graph_from_module
    from wattcast.featurize.workload import StepOptions, step_graph

    cfg = {"model_type": "gpt2", "n_layer": DIMS["n_layer"], "n_head": DIMS["n_head"], "n_embd": DIMS["n_embd"],
           "vocab_size": DIMS["vocab_size"], "n_positions": DIMS["block_size"], "activation_function": "gelu"}
    g_cfg = step_graph(cfg, StepOptions(batch=BATCH, seq=SEQ, mode="inference", logits="all"))  # a plain forward, as the exports compute it
    g_torch = graph_from_module(nanogpt, batch=BATCH, seq=SEQ)
    f = tmp_path_factory.mktemp("onnx") / "nanogpt.onnx"
    idx = torch.zeros(BATCH, SEQ, dtype=torch.long)
    try:
        torch.onnx.export(nanogpt, (idx,), str(f), dynamo=True)
    except Exception:  # pragma: no cover - exporter trouble is not what this test is about
        torch.onnx.export(nanogpt, (idx,), str(f), dynamo=False)
    g_onnx = graph_from_onnx(f, batch=BATCH, seq=SEQ)
    return {"config": g_cfg, "torch.export": g_torch, "onnx": g_onnx}


def _gemm_flops(g):
    n = g.nodes
    return float(n.loc[n["op_class"].isin(["linear", "bmm", "flash_attention"]), "flops"].sum())


def test_parameter_counts_agree(graphs, nanogpt):
    exact = sum(p.numel() for p in nanogpt.parameters())
    for name, g in graphs.items():
        assert abs(g.param_count - exact) / exact < 0.01, (name, g.param_count, exact)


def test_flops_agree_within_one_percent(graphs):
    ref = _gemm_flops(graphs["config"])
    for name, g in graphs.items():
        assert abs(_gemm_flops(g) - ref) / ref < 0.01, (name, _gemm_flops(g), ref)
    # total FLOPs (GEMMs dominate; vector ops are counted per element by every importer)
    tot = {k: float(g.nodes["flops"].sum()) for k, g in graphs.items()}
    for name, v in tot.items():
        assert abs(v - tot["config"]) / tot["config"] < 0.02, (name, tot)


def test_flops_match_closed_form(graphs):
    d, L, V = DIMS["n_embd"], DIMS["n_layer"], DIMS["vocab_size"]
    T = BATCH * SEQ
    closed = 2 * (12 * d * d * L) * T + 4 * BATCH * SEQ * SEQ * d * L + 2 * T * d * V
    assert abs(_gemm_flops(graphs["config"]) - closed) / closed < 0.02
