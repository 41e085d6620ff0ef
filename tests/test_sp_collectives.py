"""Sequence parallelism's TP collectives per layer as Megatron-LM / Transformer Engine run them.

Forward: an all-gather before the QKV and FC1 GEMMs, a reduce-scatter after the projection and FC2. Backward: the
reverse of each (reduce-scatter of the input gradient, all-gather of the output gradient) plus the re-gather of the
saved input shard for the weight gradient (LinearWithGradAccumulationAndAsyncCommunication): 4 forward, 6 backward.
Under FP8 (TE) the inputs and the output gradients are gathered as FP8 (1 B), the reductions stay in bf16."""

from __future__ import annotations

import pytest

from wattcast.featurize.op_graph import GraphBuilder
from wattcast.featurize.training_graph import training_graph
from wattcast.featurize.workload import StepOptions, step_graph

TP = 8


def _layer_collectives(model: str, dtype: str):
    g = step_graph(model, StepOptions(batch=1, seq=2048, dtype=dtype, attention="flash", tp=TP, sp=True,
                                      framework="megatron", blocks=1))
    n = g.nodes
    return n[(n["op_class"] == "collective") & (n["layer"] == 0) & (n["bytes"] > 0)]


@pytest.mark.parametrize("model", ["gpt3_175b", "llama3_70b"])
def test_megatron_sp_layer_has_four_forward_and_six_backward_tp_collectives(model):
    c = _layer_collectives(model, "bf16")
    counts = c.groupby(["phase", "kernel"]).size().to_dict()
    assert counts == {("forward", "all_gather"): 2, ("forward", "reduce_scatter"): 2,
                      ("backward", "all_gather"): 4, ("backward", "reduce_scatter"): 2}
    # every one moves the full (gathered) activation of its layer: s x b x h x 2 B
    h = 12288 if model == "gpt3_175b" else 8192
    assert set(c["bytes"]) == {2048 * h * 2.0}
    assert c["name"].str.endswith(".input_all_gather").sum() == 2  # the weight gradient's re-gathers


@pytest.mark.parametrize("model", ["gpt3_175b", "llama3_70b"])
def test_fp8_gathers_move_one_byte_and_reductions_stay_bf16(model):
    bf, f8 = _layer_collectives(model, "bf16"), _layer_collectives(model, "fp8")
    assert len(bf) == len(f8) == 10
    full = float(bf["bytes"].iloc[0])
    for (phase, kernel), grp in f8.groupby(["phase", "kernel"]):
        expected = full / 2 if kernel == "all_gather" else full
        assert (grp["bytes"] == expected).all(), (phase, kernel, grp["bytes"].tolist())


def _tiny(dtype: str, *, extra_reader: bool):
    b = GraphBuilder("bf16", train=True, tp=2, sp=True, gemm_dtype="fp8" if dtype == "fp8" else None)
    x = b.input((1, 8, 64))
    with b.layer(0):
        y = b.tp_enter(x, name="enter")
        q = b.linear(y, 64, bias=False, name="q", parallel="col")
        k = b.linear(y, 64, bias=False, name="k", parallel="col")  # the same gathered input: one re-gather in all
        z = b.elementwise("mul", q, k, name="qk")
        if extra_reader:  # a bf16 op reading the gathered tensor: the gather must move the model's dtype
            z = b.elementwise("add", z, b.linear(y, 64, bias=False, name="bf16", parallel="col", fp8=False), name="mix")
        b.tp_exit(b.linear(z, 64, bias=False, name="out", parallel="row"), name="exit")
    return training_graph(b.build(), optimizer="none").nodes


def test_one_regather_per_gathered_tensor_and_fp8_only_when_every_reader_is_fp8():
    n = _tiny("bf16", extra_reader=False)
    col = n[n["op_class"] == "collective"]
    assert col["name"].str.endswith(".input_all_gather").sum() == 1
    gathered = 1 * 16 * 64  # elements after the gather over tp=2
    assert float(col.loc[col["name"] == "enter.all_gather", "bytes"].iloc[0]) == gathered * 2
    f8 = _tiny("fp8", extra_reader=False)
    c8 = f8[f8["op_class"] == "collective"]
    assert float(c8.loc[c8["name"] == "enter.all_gather", "bytes"].iloc[0]) == gathered * 1
    assert float(c8.loc[c8["name"].str.endswith(".input_all_gather"), "bytes"].iloc[0]) == gathered * 1
    mixed = _tiny("fp8", extra_reader=True)
    cm = mixed[mixed["op_class"] == "collective"]
    assert float(cm.loc[cm["name"] == "enter.all_gather", "bytes"].iloc[0]) == gathered * 2


def test_moe_dispatcher_gathers_in_bf16_under_fp8():
    """Megatron-Core's MoE combine (the reduce-scatter after the experts) gathers its gradient in bf16 even though the
    experts' last GEMMs run in FP8: only a row-parallel linear's own output gradient is gathered as FP8."""
    g = step_graph("mixtral_8x7b", StepOptions(batch=1, seq=1024, dtype="fp8", attention="flash", tp=4, sp=True,
                                               framework="megatron", blocks=1))
    n = g.nodes
    rs = n[(n["name"] == "moe.exit.reduce_scatter.grad") & (n["layer"] == 0)]
    fwd = n[(n["name"] == "moe.exit.reduce_scatter") & (n["layer"] == 0)]
    assert len(rs) == 1 and float(rs["bytes"].iloc[0]) == float(fwd["bytes"].iloc[0])
