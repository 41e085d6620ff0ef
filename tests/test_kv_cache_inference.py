"""KV-cached inference steps (``kv_context``): the cache's bytes, decode attention over it, last-position logits and
FP8 serving weights."""

from __future__ import annotations

import json

import pytest

import wattcast
from conftest import run_cli
from wattcast.data.catalog import resolve_device
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph

A100 = "A100-SXM4-40GB"


def _decode(model="llama3_8b", device=A100, batch=1, context=512, **kw):
    return wattcast.predict(model, device, batch=batch, seq=1, mode="inference", kv_context=context, **kw)


def test_llama3_8b_kv_bytes_per_token_exact():
    """2 x 32 layers x 8 KV heads x 128 head dim x 2 B (bf16) = 131,072 B per token; the memory's own term is
    batch x (context + new tokens) of it."""
    r = _decode(batch=4, context=1000)
    assert r.meta["kv_bytes_per_token"] == 131_072
    assert r.memory.kv_cache_gb * 1e9 == pytest.approx(4 * 1001 * 131_072, rel=1e-12)
    assert r.to_dict()["memory"]["kv_cache_gb"] == r.memory.kv_cache_gb
    assert r.memory.total_gb == pytest.approx(r.memory.weights_gb + r.memory.transient_gb + r.memory.kv_cache_gb)


def test_gqa_cache_is_a_quarter_of_mha():
    """Llama 2 7B (MHA, 32 KV heads) caches 4x Llama 3 8B's (8 KV heads) per token: 524,288 B."""
    mha = _decode("llama2_7b", context=100)
    gqa = _decode("llama3_8b", context=100)
    assert mha.meta["kv_bytes_per_token"] == 2 * 32 * 32 * 128 * 2
    assert mha.meta["kv_bytes_per_token"] == 4 * gqa.meta["kv_bytes_per_token"]


def test_decode_time_grows_with_context_and_batch():
    # the GPU's step (no host cost: since stop 56 an eager step at 40 us a launch is host-bound here, below)
    base = _decode(batch=32, context=512, host_us=0).step_time_ms
    assert _decode(batch=32, context=4096, host_us=0).step_time_ms > base + 5.0  # 32 x 3,584 more tokens x 131 KB ~ 15 GB / 1.55 TB/s
    assert _decode(batch=128, context=512, host_us=0).step_time_ms > base
    # eager transformers' decode step at the default host cost: never below the GPU's, host-bound at batch 32
    eager = _decode(batch=32, context=4096)
    assert eager.step_time_ms >= _decode(batch=32, context=4096, host_us=0).step_time_ms
    assert eager.step_time_ms >= 0.040 * len(eager.nodes)
    # the attention kernels read the whole cache: their bytes are the cache's (plus q and out)
    n = _decode(batch=32, context=4096).nodes
    att = n[n["op_class"] == "flash_attention"]
    assert att["bytes"].sum() >= 32 * 4097 * 131_072


def test_batch1_decode_is_memory_bound_within_a_sane_factor():
    """Batch 1, context 4k on an A100 40 GB: weights 16.06 GB + KV 0.54 GB over 1,555 GB/s = 10.7 ms; the
    prediction is at least that and within 2.5x (HF eager adds ~700 small elementwise kernels)."""
    r = _decode(batch=1, context=4096, host_us=0)  # the GPU's step: no host cost
    floor_ms = (r.memory.weights_gb + r.memory.kv_cache_gb) / resolve_device(A100).memory_bandwidth_gbps * 1e3
    assert floor_ms <= r.step_time_ms <= 2.5 * floor_ms
    # eager transformers at the default host cost (since stop 56, 40 us a launch in an in-order queue): host-bound,
    # between the host's launches and those plus the GPU's step
    e = _decode(batch=1, context=4096)
    assert 0.040 * len(e.nodes) <= e.step_time_ms <= 0.040 * len(e.nodes) + r.step_time_ms


def test_fp8_inference_weights_held_at_one_byte():
    """FP8 serving holds the linear layers' weights in FP8: Llama 3 8B 6.98e9 linear parameters at 1 B plus the
    embedding and LM head (2 x 128,256 x 4,096) and norms at 2 B = 9.08 GB (16.06 GB in bf16)."""
    r = _decode(device="H100-SXM5-80GB", dtype="fp8", context=512)
    linear = 32 * (4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336)
    other = r.meta["param_count"] - linear
    assert r.memory.weights_gb * 1e9 == pytest.approx(linear * 1 + other * 2, rel=1e-12)
    assert not r.nodes["name"].str.contains("weight_cast").any()


def test_inference_logits_for_the_last_position_only():
    """Prefill of 32 x 8,192 tokens: the LM head runs on 32 rows (not 262,144: 67 GB of logits); logits='all'
    keeps the full head."""
    kw = dict(batch=32, seq=8192, mode="inference", attention="flash")
    g = step_graph("llama3_8b", StepOptions(**kw))
    head = g.nodes[g.nodes["name"] == "lm_head"].iloc[0]
    assert head["M"] == 32
    g_all = step_graph("llama3_8b", StepOptions(**kw, logits="all"))
    assert g_all.nodes[g_all.nodes["name"] == "lm_head"].iloc[0]["M"] == 32 * 8192
    # the largest working set is then the MLP's gate x up product (3 x 7.5 GB), not the 67 GB of logits
    r = wattcast.predict("llama3_8b", "H100-SXM5-80GB", **kw)
    assert r.memory.transient_gb < 25.0
    assert wattcast.predict("llama3_8b", "H100-SXM5-80GB", logits="all", **kw).memory.transient_gb > 67.0


def test_kv_context_errors_and_warning():
    with pytest.raises(GraphError, match="kv_context"):
        _decode(context=-1)
    with pytest.raises(GraphError, match="training step"):
        wattcast.predict("llama3_8b", A100, batch=1, seq=8, mode="train", kv_context=16)
    with pytest.raises(GraphError, match="Llama-architecture"):
        _decode("gpt2", context=16)
    with pytest.raises(GraphError, match="multi-latent"):
        step_graph("deepseek_v3", StepOptions(batch=1, seq=1, mode="inference", kv_context=16, blocks=0))
    # beyond max_position_embeddings (8,192): predicted with a warning (RoPE runs any length)
    r = _decode(context=9000)
    assert any("beyond max_position_embeddings" in w for w in r.meta["warnings"])


def test_cli_kv_context_json_keys_and_errors():
    base = ["predict", "-m", "llama3_8b", "-d", A100, "--batch", "8", "--seq", "1", "--mode", "inference"]
    r = run_cli(*base, "--kv-context", "512", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["kv_context"] == 512 and d["memory"]["kv_cache_gb"] == pytest.approx(8 * 513 * 131_072 / 1e9)
    assert d["tokens_per_s"] == pytest.approx(8 / (d["step_time_ms"] / 1e3))
    assert d["ms_per_token"] == pytest.approx(d["step_time_ms"])
    bad = run_cli("predict", "-m", "llama3_8b", "-d", A100, "--seq", "8", "--kv-context", "16")
    assert bad.returncode != 0 and "--kv-context" in bad.stderr
