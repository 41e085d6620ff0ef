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
