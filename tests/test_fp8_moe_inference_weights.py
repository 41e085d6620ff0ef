"""FP8 inference of a mixture of experts holds every expert's linear weights in FP8 (1 B a parameter), whichever
experts a step routes: an FP8 checkpoint stores them all so (vLLM's ``Fp8MoEMethod`` creates ``w13_weight`` /
``w2_weight`` for all ``num_experts`` in float8_e4m3fn), and the weights a step holds do not depend on its batch.
Embedding, output layer, norms, routers and biases stay in bf16 (2 B), as the recipe keeps them
(``simulate.memory.inference_weight_bytes``).

Audit 57b: the weights counted in FP8 only the experts the step's graph ran (each node capped at one N x K matrix),
the idle ones at bf16: Mixtral 8x7B FP8 at batch 1 held 80.79 GB (46.97 from batch 64), served by vLLM 86.43 GB at
any batch (the fused grouped node's 8 experts capped at one), and a batch-8 Mixtral FP8 served on one H100 was refused
as OOM (87.6 GB predicted). The expected figures here are counted from the models' configs, not from the graph."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.simulate.stage_memory import capacity_gb

# Mixtral 8x7B (featurize/hf_configs/mixtral_8x7b.json): hidden 4096, 32 layers, 32 heads / 8 KV heads of 128,
# 8 experts of FFN 14336 (top 2), vocab 32000, untied; no biases
MX_H, MX_L, MX_KV, MX_FFN, MX_E, MX_V = 4096, 32, 8 * 128, 14336, 8, 32000


def mixtral_weight_bytes(tp: int = 1) -> float:
    """One rank's weights: q/k/v/o and every expert's gate/up/down in FP8 (1 B), split over ``tp`` (heads, KV heads
    and the experts' FFN dim); the vocabulary-parallel embedding and head in bf16 split over ``tp``; the routers and
    RMSNorm weights in bf16, whole on every rank."""
    fp8 = MX_L * (2 * MX_H * MX_H + 2 * MX_H * MX_KV + MX_E * 3 * MX_H * MX_FFN) / tp
    bf16 = 2 * MX_V * MX_H / tp + MX_L * (MX_H * MX_E + 2 * MX_H) + MX_H
    return fp8 * 1 + bf16 * 2


def test_mixtral_hand_count_is_the_audits():
    assert mixtral_weight_bytes() == 46_966_251_520  # ~46.97 GB (bf16: 93.4 GB)


@pytest.mark.parametrize("batch", [1, 2, 8, 64])
def test_mixtral_fp8_kv_cached_step_holds_every_expert_in_fp8_at_any_batch(batch):
    r = wattcast.predict("mixtral_8x7b", "MI300X", mode="inference", batch=batch, seq=1, kv_context=1023, dtype="fp8")
    assert r.memory.weights_gb * 1e9 == pytest.approx(mixtral_weight_bytes(), rel=1e-12)  # was 80.79 GB at batch 1


def test_mixtral_fp8_served_by_vllm_fits_one_h100():
    """The fused MoE node (vLLM's grouped GEMM over the active experts, the idle ones as its parameters) holds every
    expert in FP8 too: the batch-8 iteration fits one H100 (it was refused: 87.6 GB predicted, weights 86.4)."""
    r = wattcast.predict("mixtral_8x7b", "H100-SXM5-80GB", mode="inference", batch=8, seq=1, kv_context=1023,
                         dtype="fp8", serving="vllm", prompt_tokens=512, output_tokens=512)
    assert r.memory.weights_gb * 1e9 == pytest.approx(mixtral_weight_bytes(), rel=1e-12)
    assert r.memory_gb < capacity_gb(80.0)


def test_mixtral_fp8_tp2_weights_per_gpu():
    r = wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", gpus=2, tp=2, batch=8, seq=1,
                                 kv_context=4095, dtype="fp8")
    assert r.memory.weights_gb * 1e9 == pytest.approx(mixtral_weight_bytes(tp=2), rel=1e-12)  # was 43.21 GB


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_qwen3_30b_a3b_fp8_holds_its_128_experts_in_fp8(batch):
    # Qwen3-30B-A3B: hidden 2048, 48 layers, 32 heads / 4 KV heads of 128, 128 experts of FFN 768 (top 8), vocab
    # 151936 untied, q_norm / k_norm of head_dim; no biases
    h, L, q, kv, e, ffn, v, hd = 2048, 48, 32 * 128, 4 * 128, 128, 768, 151936, 128
    fp8 = L * (h * q + 2 * h * kv + q * h + e * 3 * h * ffn)
    bf16 = 2 * v * h + L * (h * e + 2 * h + 2 * hd) + h
    r = wattcast.predict("qwen3_30b_a3b", "H100-SXM5-80GB", mode="inference", batch=batch, seq=1, kv_context=1023,
                         dtype="fp8")
    assert r.meta["param_count"] == fp8 + bf16
    # 31.17 GB (58.35 at batch 1, 31.62 at batch 64 with 2 of 128 experts idle before)
    assert r.memory.weights_gb * 1e9 == pytest.approx(fp8 + 2 * bf16, rel=1e-12)


@pytest.mark.parametrize("batch", [1, 64])
def test_gpt_oss_fp8_biased_experts_weights_in_fp8_biases_in_bf16(batch):
    """gpt-oss-20b's experts (Hugging Face loop) and attention projections carry biases: a node's parameters are whole
    copies of weight + bias, the weights in FP8, the biases in bf16."""
    h, L, e, ffn, v = 2880, 24, 32, 2880, 201088
    q, kv = 64 * 64, 8 * 64
    fp8 = L * (h * q + 2 * h * kv + q * h + e * (h * 2 * ffn + ffn * h))
    bias = L * (q + 2 * kv + h + e * (2 * ffn + h))
    other = L * (h * e + e + 64 + 2 * h) + 2 * v * h + h  # router + its bias, attention sinks, norms; embedding, head
    r = wattcast.predict("gpt_oss_20b", "H100-SXM5-80GB", mode="inference", batch=batch, seq=1, kv_context=1023,
                         dtype="fp8")
    assert r.meta["param_count"] == fp8 + bias + other
    assert r.memory.weights_gb * 1e9 == pytest.approx(fp8 + 2 * (bias + other), rel=1e-12)  # 22.08 GB


def test_dense_fp8_inference_weights_unchanged():
    """A dense model (every linear runs every step): Llama 3 8B FP8 holds 9.08 GB (README), as before."""
    r = wattcast.predict("llama3_8b", "H100-SXM5-80GB", mode="inference", batch=1, seq=1, kv_context=1023, dtype="fp8")
    h, L, q, kv, ffn, v = 4096, 32, 4096, 1024, 14336, 128256
    fp8 = L * (2 * h * q + 2 * h * kv + 3 * h * ffn)
    bf16 = 2 * v * h + L * 2 * h + h
    assert r.memory.weights_gb * 1e9 == pytest.approx(fp8 + 2 * bf16, rel=1e-12)
