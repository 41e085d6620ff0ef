"""The parameters the pipeline stages hold add up to the model's (user audit: Llama 3 8B on one H100 under the default
``hf`` framework reported weights_gb 16.059990 = 8,029,995,008 x 2 B while param_count was 8,030,261,248: the 65
eager RMSNorms' weights, 65 x 4096, were counted in the graph's total but sat on no kernel node, so no stage held
them, nor stepped them in the optimizer)."""

from __future__ import annotations

import pytest

import wattcast

H, L, VOCAB = 1024, 4, 32000
LLAMA = {"model_type": "llama", "hidden_size": H, "num_attention_heads": 16, "num_key_value_heads": 4,
         "num_hidden_layers": L, "intermediate_size": 2816, "vocab_size": VOCAB, "max_position_embeddings": 4096,
         "tie_word_embeddings": False, "_name_or_path": "llama-small-norms-test"}
#: vocabulary 50176 = 196 x 256: no padding at TP 2 (Megatron pads to a multiple of 128 x tp)
GPT2 = {"model_type": "gpt2", "n_embd": H, "n_head": 16, "n_layer": L, "n_positions": 2048, "vocab_size": 50176,
        "activation_function": "gelu_new", "tie_word_embeddings": False, "_name_or_path": "gpt2-small-norms-test"}


def _full_params(cfg: dict) -> int:
    """The model's parameters, counted from its config (HF's module shapes), untied head."""
    if cfg["model_type"] == "llama":
        kv = H // 16 * 4
        attn = H * H + 2 * H * kv + H * H
        mlp = 3 * H * 2816
        return VOCAB * H * 2 + L * (attn + mlp + 2 * H) + H  # 2 RMSNorm weights a block + the final norm
    ln = 2 * H  # LayerNorm: weight + bias
    block = (3 * H * H + 3 * H) + (H * H + H) + (4 * H * H + 4 * H) + (4 * H * H + H) + 2 * ln
    return 50176 * H * 2 + 2048 * H + L * block + ln


def _replicated(cfg: dict) -> int:
    """Parameters every TP rank holds whole: the norms (and GPT-2's row-parallel biases, c_proj's and mlp.c_proj's)."""
    if cfg["model_type"] == "llama":
        return (2 * L + 1) * H
    return L * (2 * 2 * H + 2 * H) + 2 * H + 2048 * H  # norms, row-parallel biases, position embedding


@pytest.mark.parametrize("framework", ["hf", "megatron"])
@pytest.mark.parametrize("cfg", [LLAMA, GPT2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("pp", [1, 2])
def test_stage_params_sum_to_the_models(cfg, pp, framework):
    r = wattcast.predict_cluster(cfg, "DGX-H100", gpus=pp, tp=1, pp=pp, batch=2 * pp, micro_batch=1, seq=512,
                                 framework=framework, attention="eager")
    assert r.meta["param_count"] == _full_params(cfg)
    assert sum(d["params"] for d in r.per_device) == r.meta["param_count"]
    # the memory follows: bf16 weights at 2 B a parameter on each stage
    for d in r.per_device:
        assert d["weights_gb"] - d["master_weights_gb"] == pytest.approx(d["params"] * 2 / 1e9, rel=1e-12)


@pytest.mark.parametrize("framework", ["hf", "megatron"])
@pytest.mark.parametrize("cfg", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_tp_ranks_hold_their_shard_and_every_replicated_norm(cfg, framework):
    tp = 2
    r = wattcast.predict_cluster(cfg, "DGX-H100", gpus=2 * tp, tp=tp, pp=2, batch=4, micro_batch=1, seq=512,
                                 framework=framework, attention="eager")
    rep = _replicated(cfg)
    assert sum(d["params"] for d in r.per_device) == pytest.approx((_full_params(cfg) - rep) / tp + rep, rel=1e-12)


def test_single_device_and_cluster_weights_agree_on_llama():
    """The audit's check: one GPU, the cluster path's weights equal param_count x 2 B, as single-device predict's."""
    r = wattcast.predict_cluster(LLAMA, "DGX-H100", gpus=1, batch=2, micro_batch=2, seq=512, attention="eager")
    assert r.to_dict()["memory"]["weights_gb"] == pytest.approx(r.meta["param_count"] * 2 / 1e9, rel=1e-12)
