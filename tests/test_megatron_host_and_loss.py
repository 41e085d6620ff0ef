"""Megatron's fp32 cross-entropy kernel by kernel, and the host-bound floor of an 8-rank TP collective."""

from __future__ import annotations

import pytest

from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate import distributed as D
from wattcast.simulate.parallel import ParallelConfig

V, T = 50257, 2 * 256  # vocabulary, tokens of one micro-batch


def _gpt(h: int = 256, layers: int = 2) -> dict:
    return {"model_type": "gpt2", "n_embd": h, "n_head": 8, "n_layer": layers, "n_positions": 256, "vocab_size": V,
            "activation_function": "gelu", "_name_or_path": "tiny-gpt"}


def _loss_nodes(framework: str, dtype: str):
    g = step_graph(_gpt(), StepOptions(batch=2, seq=256, dtype=dtype, mode="train", framework=framework))
    n = g.nodes
    return n[n["name"].astype(str).str.match(r"loss(\.|$)")]  # not the optimizer's loss_scale.* kernels


def test_megatron_fp16_cross_entropy_runs_on_fp32_logits_kernel_by_kernel():
    loss = _loss_nodes("megatron-deepspeed", "fp16")
    names = list(loss["name"])
    # megatron/core/tensor_parallel/cross_entropy.py: logits.float(), max, sub_, exp, sum, div_; backward mul_, cast
    for k in ("loss.float", "loss.max", "loss.sub", "loss.exp", "loss.sum_exp", "loss", "loss.grad", "loss.float.grad"):
        assert k in names, names
    per_logit = loss["bytes"].sum() / (T * 50304)  # Megatron pads the vocabulary to a multiple of 128
    assert per_logit == pytest.approx(2 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 4 + 2, rel=1e-6)  # 52 B: cast, 5 passes, mul_, cast
    fp32 = loss[loss["name"].isin(["loss.sub", "loss.exp", "loss", "loss.grad"])]
    assert set(fp32["dtype"]) == {"fp32"}


@pytest.mark.parametrize("framework", ["megatron-deepspeed", "hf"])
def test_vocab_parallel_loss_statistics_send_no_gradient_into_the_logits(framework):
    """The three all-reduces of the vocabulary-parallel loss (max, target logit, sum of exponentials) are statistics
    inside one autograd Function: the logits get one gradient (softmax - onehot), not three more to accumulate (they
    added three logits-sized adds to every TP>1 backward)."""
    g = step_graph(_gpt(), StepOptions(batch=2, seq=256, dtype="fp16", mode="train", framework=framework, tp=2))
    names = g.nodes["name"].astype(str)
    assert names.str.match(r"loss\.all_reduce_(max|target|sum_exp)$").sum() == 3
    assert not names.str.startswith("lm_head.grad_accumulate").any(), list(names[names.str.contains("grad_accumulate")])


def test_megatron_pads_the_vocabulary_to_128_times_tp_and_hf_does_not():
    """Megatron-LM's _vocab_size_with_padding (--make-vocab-size-divisible-by 128, times the TP degree)."""
    def head_n(framework, tp):
        g = step_graph(_gpt(), StepOptions(batch=1, seq=256, dtype="bf16", mode="train", framework=framework, tp=tp))
        n = g.nodes
        return int(n.loc[(n["name"] == "lm_head") & (n["phase"] == "forward"), "K"].iloc[0])

    assert head_n("megatron", 1) == 50304 and head_n("megatron-deepspeed", 1) == 50304
    assert head_n("megatron", 8) == 51200 // 8  # each rank's share of the rows padded to a multiple of 1,024
    assert head_n("hf", 1) == V and head_n("hf", 8) == -(-V // 8)


def test_hf_cross_entropy_stays_one_fused_kernel_each_way():
    loss = _loss_nodes("hf", "fp16")
    assert sorted(loss["name"]) == ["loss", "loss.grad"]
    assert loss["bytes"].sum() / (T * V) == pytest.approx(2 * 2 + 4 * 2, rel=1e-6)


def test_collective_floor_by_group_size():
    f = D.collective_host_floor_ms
    table = D.FRAMEWORK_COLLECTIVE_HOST_MS["megatron-deepspeed"]
    assert f("megatron-deepspeed", 8) == table[8] > D.FRAMEWORK_HOST_MS["megatron-deepspeed"][0]
    assert f("megatron-deepspeed", 16) == table[8]  # the largest measured group size holds beyond it
    assert f("megatron-deepspeed", 4) == 0.0 and f("megatron-deepspeed", 1) == 0.0
    assert f("megatron", 8) == 0.0 and f("hf", 8) == 0.0  # no host-bound TP measurements for them


def _step_ms(tp: int, framework: str) -> float:
    par = ParallelConfig(gpus=tp, tp=tp, pp=1, dp=1, micro_batch=1)
    return D.predict_distributed(_gpt(h=512), "DGX-A100", gpus=tp, batch=1, seq=256, parallel=par, dtype="fp16",
                                 attention="eager", framework=framework).step_time_ms


def test_tp8_all_reduces_take_the_host_floor_only_for_megatron_deepspeed(monkeypatch):
    with_floor = {(tp, fw): _step_ms(tp, fw) for tp in (4, 8) for fw in ("megatron-deepspeed", "megatron")}
    floor = D.FRAMEWORK_COLLECTIVE_HOST_MS["megatron-deepspeed"][8]
    monkeypatch.setattr(D, "FRAMEWORK_COLLECTIVE_HOST_MS", {})
    monkeypatch.setattr(D, "_COSTED", {})  # costed rank graphs hold the floor they were costed with
    without = {k: _step_ms(*k) for k in with_floor}
    # 2 layers x 2 all-reduces forward and backward, + the embedding's and the loss's: each at least the floor
    assert with_floor[(8, "megatron-deepspeed")] - without[(8, "megatron-deepspeed")] > 8 * (floor - 0.1)
    for k in ((4, "megatron-deepspeed"), (4, "megatron"), (8, "megatron")):
        assert with_floor[k] == pytest.approx(without[k], rel=1e-12), k
