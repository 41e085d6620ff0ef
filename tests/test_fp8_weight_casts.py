"""Audit 58a finding 5: Transformer Engine casts each FP8 module's weight with its own kernel in the first micro-batch's
forward (TE 2.20.2 pytorch/module/linear.py l. 575-585 ``quantize_weight``; layernorm_linear.py l. 352-357,
layernorm_mlp.py l. 505-538; base.py l. 792-880), so a step launches one weight cast per module weight: 7 a layer on
the Hugging Face path (q, k, v, o, gate, up, down), 4 under Megatron-Core (QKV, proj, fc1, fc2). Until stop 58 the
graph had one cast per layer carrying all of its bytes, and current scaling's weight amax had no scale kernel."""

from __future__ import annotations

import pytest

from wattcast.featurize.fp8_recipes import CURRENT_SCALE_KERNEL_BYTES, weight_copy_bytes_per_param
from wattcast.featurize.workload import StepOptions, step_graph


def _graph(framework: str, recipe: str = "delayed"):
    return step_graph("llama3_8b", StepOptions(batch=1, seq=1024, mode="train", dtype="fp8", attention="flash",
                                               fp8_recipe=recipe, framework=framework), blocks=3)


@pytest.mark.parametrize("framework, per_layer", [("hf", 7), ("megatron", 4)])
def test_one_weight_cast_per_module_weight_with_the_same_bytes(framework, per_layer):
    n = _graph(framework).nodes
    w = n[(n["phase"] == "forward") & (n["dtype"] == "fp8") & (n["param_count"] > 0)]
    casts = n[n["name"].str.startswith("fp8_weight_cast")]
    for lay, ws in w.groupby("layer"):
        c = casts[casts["layer"] == lay]
        assert len(ws) == per_layer and len(c) == per_layer
        # each module's cast reads its bf16 weight (2 B) and writes the FP8 copy and its transpose (2 B)
        assert sorted(c["bytes"]) == sorted(ws["param_count"].astype(float) * (2 + weight_copy_bytes_per_param("delayed")))
        assert set(c["name"]) == {f"fp8_weight_cast[{lay}].{m}" for m in ws["name"]}
    # the bytes over the step are the layer casts' of before: 4 B per FP8 parameter
    assert casts["bytes"].sum() == pytest.approx(4.0 * w["param_count"].sum(), rel=1e-12)


def test_tensorwise_weight_amax_has_its_scale_kernel():
    n = _graph("megatron", "tensorwise").nodes
    opt = n[(n["phase"] == "optimizer") & (n["op_class"] == "fp8_cast")]
    casts = opt[opt["name"].str.startswith("fp8_weight_cast")]
    scale = opt[opt["name"].str.endswith(".scale")]
    amax = opt[opt["name"].str.startswith("fp8_weight_amax") & ~opt["name"].str.endswith(".scale")]
    # per weight: amax, then nvte_compute_scale_from_amax (12 B), then the cast (csrc/quantizer.cpp quantize_impl)
    assert len(casts) == len(amax) == len(scale) > 0
    assert (scale["bytes"] == CURRENT_SCALE_KERNEL_BYTES).all()
    names = opt["name"].tolist()
    for c in casts["name"]:
        module = c.removeprefix("fp8_weight_cast")
        i = names.index(c)
        assert names[i - 2: i] == [f"fp8_weight_amax{module}", f"fp8_weight_amax{module}.scale"]
