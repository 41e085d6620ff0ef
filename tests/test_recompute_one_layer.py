"""Full recomputation re-makes one transformer layer at a time, never the LM head: Megatron-Core checkpoints the
transformer layers alone (megatron-core 0.16.1 transformer/transformer_block.py l. 446-560, ``_checkpointed_forward``);
the output layer and the loss run outside the block (models/gpt/gpt_model.py l. 685, 714) and keep their activations
as usual, on the last stage. Until stop 47 every stage added the largest layer of the graph, the head's fp32 logits
(2.1 GB for Llama 3 8B at TP 2, seq 8192), and uniform recomputation N times that."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.memory import activation_bytes_by_layer
from wattcast.simulate.stage_memory import inflight_chunks

KW = dict(gpus=8, batch=16, seq=2048, tp=2, pp=4, micro_batch=1, sp=True, zero=1, framework="megatron", dtype="bf16",
          attention="flash")
PER_STAGE = 8  # llama2_7b: 32 layers on 4 stages


def _step(recompute="full", n=None, method=None):
    return wattcast.predict_cluster("llama2_7b", "DGX-A100", recompute=recompute, recompute_num_layers=n,
                                    recompute_method=method, **KW)


def _layer_bytes():
    """(one transformer layer's full activations, its input), from the rank graph's saved tensors."""
    opts = dict(batch=1, seq=2048, mode="train", dtype="bf16", attention="flash", framework="megatron", tp=2, sp=True)
    none, _ = activation_bytes_by_layer(step_graph("llama2_7b", StepOptions(recompute="none", **opts), blocks=3))
    full, full_layers = activation_bytes_by_layer(step_graph("llama2_7b", StepOptions(recompute="full", **opts), blocks=3))
    assert full_layers[1] == pytest.approx(none[1], rel=1e-12)
    assert max(full_layers) < 3  # transformer layers only: no head (layer 3 of the short graph)
    return none[1], full[1]


def _acts(r):
    return [p["activations_gb"] * 1e9 for p in r.per_device]


@pytest.fixture(scope="module")
def steps():
    return {"none": _step("none"), "full": _step("full"), "block2": _step("full", 2, "block"),
            "uniform4": _step("full", 4, "uniform")}


def test_full_recomputation_adds_one_transformer_layer_on_every_stage(steps):
    layer, block_in = _layer_bytes()
    none, full = _acts(steps["none"]), _acts(steps["full"])
    for s in (0, 3):  # stage 0 (no head) and the last stage (the head's activations kept once, in both)
        k = inflight_chunks(s, pp=4, interleave=1, n_micro=16, schedule="1f1b")
        assert none[s] - full[s] == pytest.approx(k * PER_STAGE * (layer - block_in) - layer, rel=1e-6)


def test_block_recomputation_adds_one_layer_not_the_head(steps):
    layer, block_in = _layer_bytes()
    none, block = _acts(steps["none"]), _acts(steps["block2"])
    for s in (0, 3):
        k = inflight_chunks(s, pp=4, interleave=1, n_micro=16, schedule="1f1b")
        assert none[s] - block[s] == pytest.approx(k * 2 * (layer - block_in) - layer, rel=1e-6)


def test_uniform_recomputation_adds_one_group_of_transformer_layers(steps):
    """Megatron's uniform method checkpoints groups of N layers (transformer_block.py l. 495-509): each keeps its
    group's input, and the backward re-makes N layers' activations at once."""
    layer, block_in = _layer_bytes()
    full, uni = _acts(steps["full"]), _acts(steps["uniform4"])
    for s in (0, 3):
        k = inflight_chunks(s, pp=4, interleave=1, n_micro=16, schedule="1f1b")
        assert uni[s] - full[s] == pytest.approx(-k * block_in * PER_STAGE * 3 / 4 + 3 * layer, rel=1e-6)


def test_recomputation_time_reruns_the_transformer_layers_only(steps):
    """The re-run forward is the checkpointed layers' (featurize/training_graph.py: recompute nodes for 0 <= layer <
    n_layers under full): its FLOPs are the blocks' forward, not the head's."""
    none, full = steps["none"], steps["full"]
    extra = full.hfu * full.step_time_ms - none.hfu * none.step_time_ms  # the recomputed forwards' FLOPs x const
    fwd_blocks = none.mfu * none.step_time_ms / 3  # model FLOPs ~ 3x the forward's (head included)
    assert 0.8 * fwd_blocks < extra < fwd_blocks
