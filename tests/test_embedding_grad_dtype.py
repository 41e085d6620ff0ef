"""An embedding's weight gradient in a training step (audit 56b #6): ``embedding_dense_backward`` zero-fills its
``grad_weight`` with a fill kernel (an elementwise kernel, not a copy), and under PyTorch AMP (``hf`` in fp16/bf16:
fp32 parameters) that gradient is fp32, the width the clip and loss-scale passes of the same step read."""

from __future__ import annotations

import pytest

from wattcast.featurize.training_graph import (AMP_GRAD_BYTES, CLIP_BYTES_PER_PARAM, LOSS_SCALE_BYTES_PER_PARAM,
                                                training_graph)
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.single_device import op_part_labels

VOCAB, DIM, POSITIONS = 50257, 768, 1024  # GPT-2's wte and wpe
BATCH, SEQ = 2, 128


def _rows(dtype: str, framework: str = "hf"):
    g = step_graph("gpt2", StepOptions(batch=BATCH, seq=SEQ, mode="train", dtype=dtype, attention="flash",
                                       framework=framework))
    n = g.nodes.set_index("name")
    return g, n


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_amp_embedding_weight_gradient_is_fp32_like_the_clip_and_unscale_passes(dtype):
    g, n = _rows(dtype)
    # the clip (3 passes) and unscale (read + write) passes read 4-byte gradients; so do the embeddings' fills now
    assert CLIP_BYTES_PER_PARAM / 3 == LOSS_SCALE_BYTES_PER_PARAM / 2 == AMP_GRAD_BYTES == 4
    assert n.loc["wte.grad_zero", "bytes"] == VOCAB * DIM * 4  # was VOCAB * DIM * 2 (2-byte gradient)
    assert n.loc["wpe.grad_zero", "bytes"] == POSITIONS * DIM * 4
    assert n.loc["wte.grad_zero", "dtype"] == "fp32"
    # the scatter-add reads the incoming gradient at the activations' 2 B and adds into the fp32 grad_weight
    t = BATCH * SEQ
    assert n.loc["wte.grad", "bytes"] == t * DIM * 2 + t * DIM * 4 + t * 2
    if dtype == "fp16":
        assert g.nodes["name"].str.startswith("loss_scale.unscale").any()


def test_fp32_and_megatron_steps_keep_their_gradient_width():
    _, fp32 = _rows("fp32")
    assert fp32.loc["wte.grad_zero", "bytes"] == VOCAB * DIM * 4
    assert fp32.loc["wte.grad", "bytes"] == (2 * BATCH * SEQ * DIM + BATCH * SEQ) * 4
    # Megatron-LM holds the model in bf16: param.grad is bf16 (its fp32 main_grad is a buffer of its own); the
    # vocabulary is padded to a multiple of 128 (50,304 rows)
    _, meg = _rows("bf16", "megatron")
    assert meg.loc["wte.grad_zero", "bytes"] == 50304 * DIM * 2
    assert meg.loc["wte.grad_zero", "dtype"] == "bf16"


@pytest.mark.parametrize("dtype,framework", [("fp16", "hf"), ("fp32", "hf"), ("bf16", "megatron")])
def test_the_zero_fill_is_an_elementwise_kernel_not_a_memcpy(dtype, framework):
    g, _ = _rows(dtype, framework)
    nodes = g.nodes
    fill = nodes["name"].str.endswith(".grad_zero").to_numpy()
    assert fill.sum() == 2
    assert (nodes.loc[fill, "op_class"] == "elementwise").all()  # at::zeros: aten::fill_'s FillFunctor kernel
    assert (op_part_labels(nodes)[fill] == "").all()  # was "memcpy" (op_class "memory")


def test_a_forward_graph_without_amp_framework_is_unchanged_by_the_rule():
    # the rule reads the framework given to training_graph, not the forward graph's
    fwd = step_graph("gpt2", StepOptions(batch=BATCH, seq=SEQ, mode="inference", dtype="bf16"))
    hf = training_graph(fwd, framework="hf").nodes.set_index("name")
    ds = training_graph(fwd, framework="megatron-deepspeed").nodes.set_index("name")
    assert hf.loc["wte.grad_zero", "bytes"] == 2 * ds.loc["wte.grad_zero", "bytes"] == VOCAB * DIM * 4
