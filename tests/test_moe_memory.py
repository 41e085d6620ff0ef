"""Model states of a mixture of experts: expert parameters are sharded over the expert-data-parallel group.

Megatron-Core keeps the expert parameters in their own grad/param buffers and distributed optimizer over
``get_expert_data_parallel_group()``: world / (etp x ep x pp) ranks, dp x cp / ep here (the graph splits each expert
over the TP ranks like a dense MLP, so etp = tp). The fp32 master weights and Adam moments (ZeRO-1 / distributed
optimizer), the gradients too (ZeRO-2) and the weights too (ZeRO-3 / FSDP) of an expert parameter are therefore
divided by dp x cp / ep, the dense parameters' by dp x cp. With ep = 1 the two groups are one and nothing changes;
a dense model has no expert parameters and nothing changes either.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from wattcast.simulate.distributed import StepSummary, predict_distributed, schedule_context, schedule_step
from wattcast.simulate.options import DistributedOptions
from wattcast.simulate.parallel import ParallelConfig
from wattcast.simulate.stage_memory import model_state_bytes, stage_memory_gb, stage_state_parts, stage_total_gb

# Mixtral 8x7B (hidden 4096, 32 layers, 32 heads / 8 KV heads of 128, 8 experts of FFN 14336, vocab 32000), counted
# here from its config, not from the graph: on one rank with tp 1 and ep 8 every layer holds one expert
H, L, FFN, KV, VOCAB, EXPERTS = 4096, 32, 14336, 8 * 128, 32000, 8
EXPERT_PARAMS_PER_LAYER = 3 * H * FFN  # gate, up, down projections of one expert


def mixtral_rank_params(ep: int, tp: int = 1) -> tuple[float, float]:
    """(expert, dense) parameters one rank holds (first and only stage: embedding, head and final norm with it)."""
    expert = L * (EXPERTS // ep) * EXPERT_PARAMS_PER_LAYER / tp
    # TP splits the projections, the embedding and the head; the norms and the router are whole on every rank
    vocab = -(-VOCAB // (128 * tp)) * 128 * tp  # Megatron pads the vocabulary to a multiple of 128 x tp
    dense = L * (2 * H * H + 2 * H * KV) / tp + L * (2 * H + H * EXPERTS) + 2 * vocab * H / tp + H
    return expert, dense


def _mixtral(zero: int, *, dp: int = 32, ep: int = 8, tp: int = 1, framework: str = "megatron"):
    # Megatron-Core runs MoE with TP only with sequence parallelism
    par = ParallelConfig(gpus=tp * dp, tp=tp, pp=1, dp=dp, ep=ep, micro_batch=1, zero=zero, sp=tp > 1)
    return predict_distributed("mixtral_8x7b", "DGX-H100", par,
                               DistributedOptions(batch=2 * dp, seq=4096, dtype="bf16", framework=framework))


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_mixtral_ep8_dp32_expert_states_over_the_expert_data_parallel_group(zero):
    """The repro: Mixtral 8x7B, tp1 pp1 dp32 ep8 (expert-DP group 32 / 8 = 4) on H100s. Under the distributed optimizer
    the master weights and moments take 12 B x experts / 4 + 12 B x dense / 32 (17.5 GB, not 2.7 GB): it does not
    fit in 80 GB. ZeRO-2 shards the gradients, ZeRO-3 the weights too, over the same two groups."""
    r = _mixtral(zero)
    m = r.memory
    expert, dense = mixtral_rank_params(ep=8)
    edp, dp = 32 // 8, 32

    def shard(b: float, sharded: bool) -> float:
        return b * (expert / edp + dense / dp) if sharded else b * (expert + dense)

    assert m["weights_gb"] * 1e9 == pytest.approx(shard(2, zero >= 3), rel=1e-6)
    assert m["master_weights_gb"] * 1e9 == pytest.approx(shard(4, True), rel=1e-6)
    assert m["optimizer_gb"] * 1e9 == pytest.approx(shard(8, True), rel=1e-6)
    assert m["gradients_gb"] * 1e9 == pytest.approx(shard(4, zero >= 2), rel=1e-6)
    if zero == 1:
        assert (m["master_weights_gb"] + m["optimizer_gb"]) == pytest.approx(17.51, abs=0.01)
        # 94.86 until stop 46: cuDNN's attention output (H100) was counted twice, 32 layers x 2sbh = 1.07 GB more;
        # 93.79 until stop 55, before the stage carried its largest kernel's working set (the output layer's 0.70 GB)
        assert not r.fits and r.memory_gb == pytest.approx(94.49, abs=0.01)


def test_fsdp_shards_expert_weights_over_the_expert_data_parallel_group():
    """PyTorch FSDP with expert parallelism (framework hf, ZeRO-3): the expert weights are sharded over the ranks that
    hold the same experts as well."""
    m = _mixtral(3, framework="hf").memory
    expert, dense = mixtral_rank_params(ep=8)
    # (the eager graph's RMSNorms, elementwise kernels, hold no counted weight: 0.27M of 1.6G dense parameters less)
    # FSDP's one persistent parameter is its fp32 sharded flat parameter, stepped by the optimizer: no master copy
    # (simulate/stage_memory.py weight_and_master_bytes; 2 B here and a 4 B master until stop 41)
    assert m["weights_gb"] * 1e9 == pytest.approx(4 * (expert / 4 + dense / 32), rel=1e-5)
    assert m["master_weights_gb"] == 0.0
    assert m["optimizer_gb"] * 1e9 == pytest.approx(8 * (expert / 4 + dense / 32), rel=1e-5)
    assert m["gradients_gb"] * 1e9 == pytest.approx(4 * (expert / 4 + dense / 32), rel=1e-5)


@pytest.mark.parametrize("zero", [1, 3])
def test_moe_without_expert_parallelism_is_sharded_over_the_whole_dp_group(zero):
    """EP = 1: every DP rank holds every expert, the expert-DP group is the DP group: 12 B/param / dp as before."""
    r = _mixtral(zero, dp=4, ep=1, tp=8)
    m = r.memory
    rank_params = m["weights_gb"] * 1e9 * (4 if zero >= 3 else 1) / 2
    expert, dense = mixtral_rank_params(ep=1, tp=8)
    assert rank_params == pytest.approx(expert + dense, rel=1e-6)
    # the same floating-point figures as the formula without experts
    st = model_state_bytes(rank_params, dtype_bytes=2, optimizer="adamw", zero=zero, dp=4)
    assert m["master_weights_gb"] * 1e9 == pytest.approx(st["master_weights_bytes"], rel=1e-12)
    assert m["optimizer_gb"] * 1e9 == pytest.approx(st["optimizer_bytes"], rel=1e-12)
    assert m["master_weights_gb"] * 1e9 == pytest.approx(4 * rank_params / 4, rel=1e-12)


def test_dense_model_states_unchanged():
    """A dense model has no expert parameters: 6 + 12/dp B/param under the distributed optimizer, as before."""
    par = ParallelConfig(gpus=16, tp=2, pp=1, dp=8, micro_batch=1, zero=1)
    r = predict_distributed("llama2_7b", "DGX-H100", par, DistributedOptions(batch=16, seq=2048, dtype="bf16",
                                                                             framework="megatron"))
    m = r.memory
    params = m["weights_gb"] * 1e9 / 2
    assert m["master_weights_gb"] * 1e9 == pytest.approx(4 * params / 8, rel=1e-12)
    assert m["optimizer_gb"] * 1e9 == pytest.approx(8 * params / 8, rel=1e-12)
    assert m["gradients_gb"] * 1e9 == pytest.approx(4 * params, rel=1e-12)


def test_no_experts_or_one_group_gives_the_same_figures_bit_for_bit():
    """Without expert parameters, or with the expert-DP group equal to the DP group, the state bytes are the figures
    of the formula without experts, exactly."""
    params = np.array([1.3e9, 2.7e9, 0.9e9])
    for zero, fp8 in itertools.product((0, 1, 2, 3), (0.0, 0.37)):
        kw = dict(params=params, dtype_bytes=2, grad_bytes=4, held_grad_bytes=4.0, optimizer="adamw", zero=zero, dp=16,
                  framework="megatron", block_params=1e8, fp8_param_fraction=fp8)
        base = stage_state_parts(**kw)
        for extra in (dict(expert_params=np.zeros(3), expert_dp=2), dict(expert_params=params * 0.7, expert_dp=16),
                      dict(expert_params=params * 0.7)):
            got = stage_state_parts(**kw, **extra)
            for a, b in zip(got, base):
                np.testing.assert_array_equal(a, b)
        st = model_state_bytes(1e9, dtype_bytes=2, optimizer="adamw", zero=zero, dp=8)
        assert model_state_bytes(1e9, dtype_bytes=2, optimizer="adamw", zero=zero, dp=8, expert_params=0.0,
                                 expert_dp=2) == st
        assert model_state_bytes(1e9, dtype_bytes=2, optimizer="adamw", zero=zero, dp=8, expert_params=6e8,
                                 expert_dp=8) == st


def test_model_state_bytes_by_group():
    """Megatron's distributed optimizer per parameter: 6 + 12/dp B dense, 6 + 12/edp B expert."""
    st = model_state_bytes(1e9, dtype_bytes=2, optimizer="adamw", zero=1, dp=32, expert_params=7e8, expert_dp=4)
    assert sum(st.values()) == pytest.approx(6e9 + 12 * 3e8 / 32 + 12 * 7e8 / 4)
    st3 = model_state_bytes(1e9, dtype_bytes=2, optimizer="adamw", zero=3, dp=32, expert_params=7e8, expert_dp=4)
    assert sum(st3.values()) == pytest.approx(18 * 3e8 / 32 + 18 * 7e8 / 4)


def test_stage_total_equals_the_term_by_term_total_with_experts():
    """The search's total alone (stage_total_gb) gives the term-by-term figures bit for bit with experts too."""
    rng = np.random.default_rng(5)
    for fw, db, zero, dp, edp, opt, fp8 in itertools.product(("hf", "megatron", "megatron-deepspeed"), (2, 4),
                                                              (0, 1, 2, 3), (8, 32), (1, 4), ("adamw", "sgd"),
                                                              (0.0, 0.37)):
        P = int(rng.integers(1, 9))
        params = rng.uniform(1e6, 3e9, P)
        kw = dict(params=params, act_bytes_per_chunk=rng.uniform(0, 5e9, P), inflight=rng.integers(1, 9, P),
                  full_recompute_extra_bytes=float(rng.uniform(0, 1e9)), dtype_bytes=db, grad_bytes=4,
                  held_grad_bytes=float(rng.choice([2.0, 4.0, 6.0])), optimizer=opt, zero=zero, dp=dp, framework=fw,
                  block_params=float(rng.uniform(1e6, 1e9)), fp8_param_fraction=fp8,
                  expert_params=params * rng.uniform(0, 0.9, P), expert_dp=edp)
        np.testing.assert_array_equal(stage_total_gb(**kw), stage_memory_gb(**kw)["total_gb"])


@pytest.mark.parametrize("zero", [0, 1])
def test_search_summary_memory_equals_the_prediction_for_experts(zero):
    """A search's StepSummary (the memoised state parts) and the full prediction agree for an EP model."""
    par = ParallelConfig(gpus=32, tp=1, pp=1, dp=32, ep=8, micro_batch=1, zero=zero)
    ctx = schedule_context("mixtral_8x7b", "DGX-H100", par, DistributedOptions(
        batch=64, seq=4096, dtype="bf16", framework="megatron", comm_split=False, prune_oom=True, exact_pipeline=False))
    full = schedule_step(replace(ctx, detail=False, memo={}))
    s = schedule_step(replace(ctx, detail=False, summary=True, memo={}))
    assert isinstance(s, StepSummary)
    assert s.memory_gb == full.memory_gb and s.fits == full.fits is False


def test_the_optimizer_step_of_expert_parameters_is_sharded_over_the_expert_data_parallel_group():
    """Under ZeRO-1 each rank steps its shard: the dense parameters' 1/dp and the expert parameters' 1/(dp/ep) (the time
    and the energy follow); with ep 1 the whole DP group shards both."""
    expert, dense = mixtral_rank_params(8)
    frac = expert / (expert + dense)
    z0, z1 = _mixtral(0), _mixtral(1)
    # dp 32, ep 8: the expert share goes over 4 ranks, the dense one over 32
    assert z1.optimizer_ms == pytest.approx(z0.optimizer_ms * ((1 - frac) / 32 + frac / 4), rel=0.03)
    one0, one1 = _mixtral(0, ep=1, dp=8), _mixtral(1, ep=1, dp=8)
    assert one1.optimizer_ms == pytest.approx(one0.optimizer_ms / 8, rel=1e-9)
