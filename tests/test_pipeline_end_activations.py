"""A pipeline stage's activations at the pipeline's ends (audit 57a, issue 2).

A saved tensor counts in the layer of the op that keeps it (simulate/memory.py ``kept_tensors``): a layer's output is
kept by the next layer's input norm, so a stage holds the input it received and not the output it sent, which
Megatron-LM frees once sent (megatron-core 0.19.2 ``megatron/training/argument_utils.py`` l. 305
``kw_args['deallocate_pipeline_outputs'] = True``; ``megatron/core/pipeline_parallel/schedules.py`` l. 166
``deallocate_output_tensor``: "Pseudo-deallocate ... right after the output tensor has been sent to the next pipeline
stage"). Until stop 57 a tensor counted in its maker's layer: the first stage also held its last layer's output
(+2·s·b·h/t per micro-batch in flight) and the last stage missed the input its first norm keeps (-2·s·b·h/t).

Checked against Megatron-LM's ``theoretical_memory_usage.compute_activation_memory`` (megatron-core 0.19.2
``megatron/training/theoretical_memory_usage.py`` l. 308-380; Korthikanti et al. 2022 Table 2), which is written for
the first stage: per layer s·b·h(18 + 4·ffn/h)/t = 34·s·b·h/t (GPT, SP + selective), times L (L/p layers x p
micro-batches in flight), plus the embedding's dropout mask s·b·h·p/t (l. 333-339) and nothing else of the size of a
hidden state; its "inputs to output layer and CE loss" 4·s·b·h(1 + V/h)/t (l. 368-376) is the last stage's head. (Its
int64 token ids, 8·s·b·p/t, 33 kB here, are not in the rank graph.)
"""

from __future__ import annotations

import pytest

from wattcast.simulate.distributed import predict_distributed
from wattcast.simulate.options import DistributedOptions
from wattcast.simulate.parallel import ParallelConfig

S, B = 2048, 1
# GPT-3 175B (Korthikanti Table 3's shape; vocabulary already a multiple of 128 x t, so unpadded)
H, A, L, V = 12288, 96, 96, 51200
T, P = 8, 16
GPT3 = {"model_type": "gpt2", "n_embd": H, "n_head": A, "n_layer": L, "n_positions": S, "vocab_size": V,
        "activation_function": "gelu", "resid_pdrop": 0.1, "attn_pdrop": 0.1, "embd_pdrop": 0.1,
        "_name_or_path": "gpt3_175b_pipeline_ends"}
U = S * B * H / T  # s·b·h/t: one hidden state's elements on a TP rank under SP (x dtype bytes in the formulas)


def _gpt3_stages(recompute: str) -> list[float]:
    par = ParallelConfig(gpus=T * P, tp=T, pp=P, dp=1, micro_batch=B, sp=True, recompute=recompute, zero=1)
    r = predict_distributed(GPT3, "DGX-H100", par, DistributedOptions(batch=P, seq=S, dtype="bf16", attention="flash",
                                                                      framework="megatron"))
    return [p["activations_gb"] * 1e9 for p in r.per_device]


def test_gpt3_first_middle_last_stage_match_megatrons_formula():
    """SP + selective, 6 layers a stage, 16 micro-batches: stage 0 holds 16 in flight, stage k 16 - k."""
    acts = _gpt3_stages("selective")
    per_layer = 34 * U  # theoretical_memory_usage l. 317-319 with ffn = 4h
    dropout_mask = U  # l. 333-339: the embedding's dropout mask, 1 B an element, per micro-batch in flight
    head = 4 * U * (1 + V / H)  # l. 368-376: final norm's and output layer's inputs (2 + 2) and the fp32 logits
    assert acts[0] == pytest.approx(L * per_layer + P * dropout_mask, rel=1e-9)  # 10.318 GB (10.419 before)
    for k in (1, 7, 14):  # middle stages: exact before and after
        assert acts[k] == pytest.approx(6 * (P - k) * per_layer, rel=1e-9)
    assert acts[-1] == pytest.approx(6 * per_layer + head, rel=1e-9)  # 0.7067 GB (0.7004 before)


def test_gpt3_full_recomputation_keeps_each_layers_input_once():
    """Full recomputation: each layer keeps its input, 2·s·b·h/t (Korthikanti Sec. 5), the first stage's first layer
    the embedding's output (once: until stop 57 also in the embedding's layer), the last stage's head the last layer's
    output (until stop 57 nowhere); plus one layer re-made in the backward (34·s·b·h/t and flash's fp32
    log-sum-exp)."""
    acts = _gpt3_stages("full")
    remade = 34 * U + (A // T) * S * B * 4
    assert acts[0] == pytest.approx(L * 2 * U + P * U + remade, rel=1e-9)  # 0.761 GB (0.862 before)
    assert acts[1] == pytest.approx(6 * 15 * 2 * U + remade, rel=1e-9)
    assert acts[-1] == pytest.approx(6 * 2 * U + 4 * U * (1 + V / H) + remade, rel=1e-9)


def test_llama3_405b_meta_split_first_and_last_stage():
    """Llama 3 405B, 8,192 tokens, TP8 PP16 SP, Meta's split 7, 8 x 14, 7 (the audit's command): a Megatron-Core
    layer keeps 31.75·s·b·h/t plus the fp32 log-sum-exp (README; 0.5332 GB), no embedding dropout; the last stage's
    head 4·s·b·h(1 + V/h)/t with the vocabulary padded to 129,024 (a multiple of 128 x t)."""
    s, h, t, heads, vocab = 8192, 16384, 8, 128, 129024
    par = ParallelConfig(gpus=2048, tp=t, pp=16, dp=16, micro_batch=1, sp=True, recompute="none", zero=1,
                         pp_first_layers=7, pp_last_layers=7)
    r = predict_distributed("llama3_405b", "DGX-H100", par, DistributedOptions(batch=256, seq=s, dtype="bf16",
                                                                              attention="flash", framework="megatron"))
    acts = [p["activations_gb"] * 1e9 for p in r.per_device]
    u = s * h / t
    layer = 31.75 * u + (heads // t) * s * 4
    assert acts[0] == pytest.approx(7 * 16 * layer, rel=1e-9)  # 59.72 GB (60.26 before)
    assert acts[1] == pytest.approx(8 * 15 * layer, rel=1e-9)  # 63.98 GB, unchanged
    assert acts[-1] == pytest.approx(7 * layer + 4 * u * (1 + vocab / h), rel=1e-9)  # 4.328 GB (4.294 before)
