"""Hugging Face config fields with impossible or implausible values: refused when the config is loaded, with the
field named, instead of a silently wrong (or astronomic) prediction; every shipped config still loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import wattcast
from wattcast.featurize import hf_config
from wattcast.featurize.hf_config import builtin_models, load_hf_config
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph

CONFIGS = Path(wattcast.featurize.__file__).resolve().parent / "hf_configs"
#: hf_config.MAX_WIDTH (spelt out: these tests run against code without it too)
MAX_WIDTH = 2**20


def _raw(name: str, **changes) -> dict:
    raw = json.loads((CONFIGS / f"{name}.json").read_text())
    for k, v in changes.items():
        if v is None:
            raw.pop(k, None)
        else:
            raw[k] = v
    return raw


@pytest.mark.parametrize("name", builtin_models())
def test_every_shipped_config_loads(name):
    cfg = load_hf_config(name)
    assert cfg.hidden > 0 and cfg.n_layers > 0 and cfg.vocab > 0
    if cfg.n_experts:
        assert 1 <= cfg.experts_per_token <= cfg.n_experts


# ------------------------------------------------------------------ item 1: MoE widths and counts
@pytest.mark.parametrize("name,key,value", [
    ("qwen3_30b_a3b", "moe_intermediate_size", 10**12),
    ("qwen3_235b_a22b", "moe_intermediate_size", MAX_WIDTH + 1),
    ("qwen1.5_moe_a2.7b", "moe_intermediate_size", 10**9),
    ("qwen1.5_moe_a2.7b", "shared_expert_intermediate_size", 10**12),
    ("deepseek_v3", "moe_intermediate_size", 10**12),
    ("deepseek_v3", "n_shared_experts", 10**9),
])
def test_implausible_moe_sizes_are_refused_naming_the_field(name, key, value):
    with pytest.raises(GraphError, match=f"field '{key}' is {value:,}: over"):
        load_hf_config(_raw(name, **{key: value}))


@pytest.mark.parametrize("key,value,message", [
    ("moe_intermediate_size", 0, "must be a positive integer"),
    ("moe_intermediate_size", -1, "must be a positive integer"),
    ("moe_intermediate_size", "2048", "must be an integer"),
    ("n_shared_experts", -1, "must be an integer >= 0"),
])
def test_deepseek_moe_fields_are_checked_when_the_config_loads(key, value, message):
    # (these were read only when the graph was built: a config that could never be built loaded fine)
    with pytest.raises(GraphError, match=f"field '{key}' {message}"):
        load_hf_config(_raw("deepseek_v3", **{key: value}))


def test_deepseek_shared_experts_width_is_bounded():
    # 512 shared experts of 2,048 each run as one 1,048,576-wide SwiGLU: at the bound; one more expert is over it
    assert load_hf_config(_raw("deepseek_v3", n_shared_experts=MAX_WIDTH // 2048)).raw["n_shared_experts"] == 512
    with pytest.raises(GraphError, match=r"field 'n_shared_experts' \(513\) x moe_intermediate_size"):
        load_hf_config(_raw("deepseek_v3", n_shared_experts=MAX_WIDTH // 2048 + 1))


def test_moe_width_at_the_bound_still_builds():
    assert getattr(hf_config, "MAX_WIDTH", None) == MAX_WIDTH
    raw = _raw("qwen3_30b_a3b", moe_intermediate_size=MAX_WIDTH)
    assert load_hf_config(raw).count("moe_intermediate_size") == MAX_WIDTH
    g = step_graph(raw, StepOptions(batch=1, seq=8, mode="inference", dtype="bf16", blocks=1))
    assert g.param_count > 128 * 3 * 2048 * MAX_WIDTH  # the experts' weights at that width


# ------------------------------------------------------------------ item 4: other impossible or implausible fields
@pytest.mark.parametrize("name,changes,message", [
    # dense widths and the vocabulary: no bound before (costed as astronomic steps)
    ("llama3_8b", dict(hidden_size=2**40, head_dim=128), "hidden_size is 1,099,511,627,776: over 1,048,576"),
    ("llama3_8b", dict(intermediate_size=10**12), "intermediate_size is 1,000,000,000,000: over 1,048,576"),
    ("gpt_oss_20b", dict(intermediate_size=10**9), "intermediate_size is 1,000,000,000: over"),
    ("switch_base_8", dict(d_ff=10**12), "d_ff is 1,000,000,000,000: over"),
    ("llama3_8b", dict(head_dim=10**9), "head_dim is 1,000,000,000: over"),
    ("llama3_8b", dict(vocab_size=2**50), "vocab_size is 1,125,899,906,842,624: over 16,777,216"),
    ("llama3_8b", dict(num_attention_heads=2**14, num_key_value_heads=8, head_dim=128),
     r"field 'num_attention_heads' \(16,384\) x head size 128 is 2,097,152"),
    ("mpt_7b", dict(expansion_ratio=10**6), r"field 'expansion_ratio' \(1e\+06\) x d_model"),
    # DeepSeek's attention sizes and router groups: read only by the graph (or never) before
    ("deepseek_v3", dict(qk_nope_head_dim=10**12), "field 'qk_nope_head_dim' is 1,000,000,000,000: over"),
    ("deepseek_v3", dict(kv_lora_rank=0), "field 'kv_lora_rank' must be a positive integer"),
    ("deepseek_v3", dict(q_lora_rank=-3), "field 'q_lora_rank' must be a positive integer"),
    ("deepseek_v3", dict(v_head_dim="128"), "field 'v_head_dim' must be an integer"),  # was int("128") at load
    ("deepseek_v3", dict(v_head_dim=0), "field 'v_head_dim' must be a positive integer"),  # was read as 0 or 128
    ("deepseek_v3", dict(moe_layer_freq=0), "field 'moe_layer_freq' must be a positive integer"),
    ("deepseek_v3", dict(first_k_dense_replace=-1), "field 'first_k_dense_replace' must be an integer >= 0"),
    ("deepseek_v3", dict(n_group=0), "field 'n_group' must be a positive integer"),
    ("deepseek_v3", dict(n_group=7), r"field 'n_group' \(7\) must divide n_routed_experts \(256\)"),
    ("deepseek_v3", dict(topk_group=9), r"field 'topk_group' \(9\) must be between 1 and n_group \(8\)"),
])
def test_impossible_or_implausible_fields_are_refused_naming_them(name, changes, message):
    with pytest.raises(GraphError, match=message):
        load_hf_config(_raw(name, **changes))


@pytest.mark.parametrize("name,changes,message", [
    ("bert_base", dict(type_vocab_size=10**9), "field 'type_vocab_size' is 1,000,000,000: over 16,777,216"),
    ("opt_1.3b", dict(word_embed_proj_dim=10**9), "field 'word_embed_proj_dim' is 1,000,000,000: over"),
])
def test_implausible_fields_the_graph_reads_are_refused_naming_them(name, changes, message):
    with pytest.raises(GraphError, match=message):
        step_graph(_raw(name, **changes), StepOptions(batch=1, seq=8, mode="inference", dtype="bf16", blocks=1))


@pytest.mark.parametrize("name,key", [
    ("gpt2", "head_dim"), ("gpt2", "kv_channels"), ("opt_1.3b", "head_dim"), ("bloom_560m", "head_dim"),
    ("pythia_160m", "head_dim"), ("falcon_7b", "head_dim"), ("mpt_7b", "head_dim"), ("bert_base", "head_dim"),
])
def test_a_head_size_the_family_does_not_read_must_match_hidden_over_heads(name, key):
    """These families' attention (as transformers builds it) splits the hidden size evenly over the heads; a head size
    field that disagrees was used by the graph builder with shapes that did not add up (a silently wrong graph, or an
    error about a view's element count)."""
    cfg = load_hf_config(name)
    even = cfg.hidden // cfg.n_heads
    assert load_hf_config(_raw(name, **{key: even})).head_dim == even  # the value it has anyway: fine
    with pytest.raises(GraphError, match=rf"field '{key}' is {even + 4}, but .* {even} each"):
        load_hf_config(_raw(name, **{key: even + 4}))


def test_families_that_read_head_dim_keep_it():
    cfg = load_hf_config(_raw("llama3_8b", head_dim=100))  # (Gemma-style: heads x head_dim need not be the hidden size)
    assert cfg.head_dim == 100


@pytest.mark.parametrize("name,changes,keys", [
    ("gpt2", dict(n_embd=770), ("n_embd", "n_head")),
    ("gpt2", dict(n_embd=770, head_dim=64), ("n_embd", "n_head")),  # a head size given does not excuse it
    ("llama3_8b", dict(num_key_value_heads=3), ("num_attention_heads", "num_key_value_heads")),
    ("llama3_8b", dict(num_key_value_heads=64), ("num_attention_heads", "num_key_value_heads")),
    ("mpt_7b", dict(attn_config={"attn_type": "grouped_query_attention", "kv_n_heads": 5}),
     ("n_heads", "attn_config.kv_n_heads")),
])
def test_head_divisibility_errors_name_the_fields(name, changes, keys):
    with pytest.raises(GraphError) as e:
        load_hf_config(_raw(name, **changes))
    assert all(f"({k})" in str(e.value) for k in keys), str(e.value)


@pytest.mark.parametrize("changes,message", [
    (dict(num_attention_heads=0), "num_attention_heads must be a positive integer"),
    (dict(num_attention_heads=-4), "num_attention_heads must be a positive integer"),
    (dict(num_key_value_heads=0), "num_key_value_heads must be a positive integer"),
    (dict(head_dim=0), "head_dim must be a positive integer"),
    (dict(vocab_size=0), "vocab_size must be a positive integer"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": -1}), "field 'rope_scaling.factor' must be a positive number"),
    (dict(rope_scaling="linear"), "field 'rope_scaling' must be a JSON object"),
    (dict(rope_scaling={"rope_type": 3, "factor": 2.0}), "field 'rope_scaling.rope_type' must be a scaling scheme"),
    (dict(rope_theta=0), "field 'rope_theta' must be a positive number"),
])
def test_already_refused_values_stay_refused(changes, message):
    """(Pins: these were refused, naming the field, before this change too.)"""
    with pytest.raises(GraphError, match=message):
        load_hf_config(_raw("llama3_8b", **changes))


def test_widths_at_the_bound_still_load():
    raw = _raw("llama3_8b", hidden_size=MAX_WIDTH, intermediate_size=MAX_WIDTH, head_dim=128, vocab_size=2**24)
    cfg = load_hf_config(raw)
    assert (cfg.hidden, cfg.ffn, cfg.vocab) == (MAX_WIDTH, MAX_WIDTH, 2**24)


def test_topk_group_without_n_group_is_left_to_transformers_default():
    raw = _raw("deepseek_v3", n_group=None, topk_group=4)  # DeepseekV3Config's default n_group is 8
    assert load_hf_config(raw).n_experts == 256
