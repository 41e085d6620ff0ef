"""--dtype fp8 keeps every model's output layer in bf16, recognised by what it is (the projection onto the vocabulary,
its weight shaped like the token embedding; the head feeding a loss), not by the name ``lm_head``: BERT's tied
``cls.predictions.decoder`` and Switch's ``lm_head`` ran as FP8 GEMMs until stop 51 (issue 14)."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.featurize.op_graph import GraphBuilder, GraphError
from wattcast.featurize.workload import StepOptions, step_graph


def _linears(model: str, **kw):
    opts = StepOptions(batch=2, seq=128, dtype="fp8", **{"mode": "train", **kw})
    n = step_graph(model, opts).nodes
    return n[n["op_class"] == "linear"]


@pytest.mark.parametrize("model, head, kw", [
    ("bert_base", "cls.predictions.decoder", {}),  # tied to word_embeddings, 768 -> 30,522
    ("bert_base", "cls.predictions.decoder", {"tp": 2}),  # column-parallel over the padded vocabulary
    ("bert_base", "cls.seq_relationship", {}),  # the NSP head, feeding loss.nsp
    ("bert_base", "classifier", {"mode": "inference"}),
    ("switch_base_8", "lm_head", {}),
    ("gpt2", "lm_head", {}),
    ("llama3_8b", "lm_head", {"tp": 2}),
])
def test_output_layer_gemms_stay_bf16(model, head, kw):
    lin = _linears(model, **kw)
    rows = lin[lin["name"].str.startswith(head)]
    assert len(rows) == (1 if kw.get("mode") == "inference" else 3)  # forward, dgrad, wgrad
    assert (rows["dtype"] == "bf16").all(), rows[["name", "dtype"]]
    # and no cast kernel for it
    n = step_graph(model, StepOptions(batch=2, seq=128, dtype="fp8", **{"mode": "train", **kw})).nodes
    assert not n["name"].str.startswith(f"{head}.fp8_cast").any()
    assert not n["name"].str.startswith(f"{head}.grad_fp8_cast").any()
    # the transformer layers' GEMMs are still FP8
    assert (lin["dtype"] == "fp8").sum() > 0


def test_switch_router_stays_bf16():
    lin = _linears("switch_base_8")
    router = lin[lin["name"].str.contains("router")]
    assert len(router) > 0 and (router["dtype"] != "fp8").all()


def test_rule_is_the_weight_shape_not_the_name():
    b = GraphBuilder("bf16", train=True, gemm_dtype="fp8")
    ids = b.input((2, 64), "fp32")
    x = b.embedding(ids, 1024, 256, name="tok", word=True)
    h = b.linear(x, 256, name="proj")  # a hidden linear: FP8
    out = b.linear(h, 1024, name="anything", weight_params=False)  # (1024 x 256): the embedding's shape
    g = b.build()
    d = dict(zip(g.nodes["name"], g.nodes["dtype"]))
    assert d["proj"] == "fp8" and d["anything"] == "bf16"
    assert out.shape == (2, 64, 1024)
    # a vocabulary-wide linear from another width is not the embedding's shape: FP8
    b2 = GraphBuilder("bf16", train=True, gemm_dtype="fp8")
    y = b2.embedding(b2.input((2, 64), "fp32"), 1024, 256, name="tok", word=True)
    b2.linear(b2.linear(y, 512, name="up"), 1024, name="wide")
    g2 = b2.build()
    d2 = dict(zip(g2.nodes["name"], g2.nodes["dtype"]))
    assert d2["wide"] == "fp8"


def test_a_loss_fed_by_an_fp8_gemm_is_refused():
    b = GraphBuilder("bf16", train=True, gemm_dtype="fp8")
    x = b.input((2, 64, 256))
    logits = b.linear(x, 4, name="head")  # no token embedding to recognise it by: left FP8 by its generator
    with pytest.raises(GraphError, match="'head', an FP8 GEMM"):
        b.cross_entropy(logits, name="loss")


def test_bert_fp8_step_prices_the_decoder_in_bf16():
    """The decoder's three GEMMs cost their bf16 time under --dtype fp8 (L40S, batch 32 x 512)."""
    kw = dict(batch=32, seq=512, attention="eager")
    bf = wattcast.predict("bert_base", "L40S", dtype="bf16", **kw)
    f8 = wattcast.predict("bert_base", "L40S", dtype="fp8", **kw)
    def t(r):
        n = r.nodes[r.nodes["name"].str.startswith("cls.predictions.decoder")]
        return dict(zip(n["name"], n["time_ms"]))
    tb, tf = t(bf), t(f8)
    assert set(tb) == set(tf) and len(tb) == 4  # forward, dgrad, wgrad, bgrad: no casts
    for k in tb:
        assert tf[k] == pytest.approx(tb[k], rel=1e-9), k
