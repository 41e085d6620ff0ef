"""FP8 in an inference step (no backward): Transformer Engine 2.20.2 quantizes a linear layer's input and weight
row-wise only when grad is disabled (``pytorch/module/linear.py`` l. 399 and l. 524-531: ``columnwise =
backward_needs_input = is_grad_enabled and ...``; l. 563-571 for the weight; ``module/base.py`` l. 1847 for FP8
parameters made under no_grad), every recipe: no transpose (delayed, tensorwise) and no column-wise copy or scales
(mxfp8, blockwise; ``csrc/quantizer.cpp`` allocates them only ``if (columnwise_usage)``). Training is unchanged."""

from __future__ import annotations

import pytest

from wattcast.featurize.fp8_recipes import (activation_cast_copies, blockwise_scale_bytes, cast_scale_bytes,
                                            inference_weight_bytes_per_param, mxfp8_scale_bytes)
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.memory import estimate_memory

RECIPES = ["delayed", "tensorwise", "mxfp8", "blockwise"]


def _graph(recipe, mode, transpose=True):
    return step_graph("llama3_8b", StepOptions(batch=1, seq=1024, mode=mode, dtype="fp8", attention="flash",
                                               fp8_recipe=recipe, fp8_transpose=transpose), blocks=2)


def _rowwise_scales(recipe, m, k):
    # TE 2.20 csrc/quantizer.cpp get_scale_shape, row-wise: MXFP8 {roundup(M,128), roundup(K/32,4)} x 1 B;
    # FP8 block 1x128 {ceil(K/128), roundup(M,4)} x 4 B; per-tensor recipes: one scale, not counted
    if recipe == "mxfp8":
        return mxfp8_scale_bytes(m, k, columnwise=False)
    if recipe == "blockwise":
        return blockwise_scale_bytes(m, k, columnwise=False)
    return 0


def _casts(g):
    n = g.nodes
    lin = n[(n["phase"] == "forward") & (n["dtype"] == "fp8") & (n["op_class"] == "linear")]
    casts = n[(n["phase"] == "forward") & (n["op_class"] == "fp8_cast")].set_index(["layer", "name"])["bytes"]
    return lin, casts


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("transpose", [True, False])
def test_inference_casts_write_the_rowwise_copy_alone(recipe, transpose):
    lin, casts = _casts(_graph(recipe, "inference", transpose))
    assert len(lin) >= 14  # 7 FP8 GEMMs a block, 2 blocks
    for layer, name, m, k in lin[["layer", "name", "M", "N"]].itertuples(index=False):
        m, k = int(m), int(k)
        # read bf16 (2 B), write the row-wise FP8 data (1 B) and its row-wise scales; no transpose / column-wise copy,
        # on Hopper (transpose) and data-centre Blackwell alike (the old code wrote m * k * 4 + both scales on H100)
        assert casts[(layer, f"{name}.fp8_cast")] == m * k * 3 + _rowwise_scales(recipe, m, k)
        if recipe == "tensorwise":  # current scaling still reads the input for its amax first
            assert casts[(layer, f"{name}.fp8_amax")] == m * k * 2


def test_llama3_8b_inference_cast_bytes_by_hand():
    # q_proj of one 1 x 1024 sequence: input (1024, 4096), bf16 -> FP8 row-wise
    _, casts = _casts(_graph("mxfp8", "inference"))
    q = casts[(0, "self_attn.q_proj.fp8_cast")]
    # 1024 x 4096 x (2 + 1) B + E8M0 scales roundup(1024, 128) x roundup(4096 / 32, 4) = 1024 x 128 x 1 B
    assert q == 1024 * 4096 * 3 + 1024 * 128


@pytest.mark.parametrize("recipe", RECIPES)
def test_training_casts_unchanged(recipe):
    lin, casts = _casts(_graph(recipe, "train"))
    for layer, name, m, k in lin[["layer", "name", "M", "N"]].itertuples(index=False):
        m, k = int(m), int(k)
        both = cast_scale_bytes(recipe, m, k)  # row-wise + column-wise scales
        assert both == _rowwise_scales(recipe, m, k) + {"mxfp8": mxfp8_scale_bytes, "blockwise": blockwise_scale_bytes
                                                        }.get(recipe, lambda *a, **k: 0)(m, k, columnwise=True)
        assert casts[(layer, f"{name}.fp8_cast")] == m * k * 4 + both
    assert activation_cast_copies(recipe, transpose=True, train=True) == 2
    assert activation_cast_copies(recipe, transpose=False, train=True) == (1 if recipe in ("delayed", "tensorwise") else 2)


@pytest.mark.parametrize("recipe", RECIPES)
def test_inference_holds_the_rowwise_fp8_weight_and_its_scales(recipe):
    g = _graph(recipe, "inference")
    n = g.nodes
    lin = n[(n["phase"] == "forward") & (n["dtype"] == "fp8") & (n["op_class"] == "linear")]
    fp8_w = float((lin["N"] * lin["K"]).sum())  # Llama's projections have no bias
    rest = float(g.meta["param_count"]) - fp8_w
    # row-wise data 1 B + row-wise scales: mxfp8 1 B per 32, blockwise (128x128) 4 B per 128^2; no transpose
    per_param = {"mxfp8": 1 + 1 / 32, "blockwise": 1 + 4 / 128**2}.get(recipe, 1.0)
    assert inference_weight_bytes_per_param(recipe) == per_param
    assert estimate_memory(g).weights_gb == pytest.approx((rest * 2 + fp8_w * per_param) / 1e9, rel=1e-12)
    assert estimate_memory(g).activations_gb == 0.0


def test_served_tp_group_graph_casts_rowwise():
    # the graph of one rank of a served TP group (predict_cluster with kv_context) goes through the same linear
    g = step_graph("llama3_8b", StepOptions(batch=4, seq=256, mode="inference", dtype="fp8", attention="flash",
                                            kv_context=0, tp=2, framework="hf"))
    lin, casts = _casts(g)
    for layer, name, m, k in lin[["layer", "name", "M", "N"]].itertuples(index=False):
        assert casts[(layer, f"{name}.fp8_cast")] == int(m) * int(k) * 3
