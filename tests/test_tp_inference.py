"""Tensor-parallel KV-cached inference on one node (``predict_cluster(..., kv_context=)``, simulate/tp_inference.py):
TP 1 is the single-GPU path, TP 2 has two all-reduces per layer of the right bytes and the logits gather, the KV cache
per GPU splits (or stays one replicated head per rank, as vLLM's QKVParallelLinear), and what is not modelled is a
clear error."""

from __future__ import annotations

import json

import pytest

import wattcast
from conftest import flat, run_cli
from wattcast.featurize.hf_config import load_hf_config
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph

A100 = "A100-SXM4-40GB"
MODEL = "llama2_7b"  # 32 heads, 32 KV heads, hidden 4,096, 32 layers
KW = dict(batch=16, seq=1, dtype="bf16", attention="flash", kv_context=256)
SERVE = dict(serving="vllm", prompt_tokens=128, output_tokens=100)


def _tp(tp, model=MODEL, **kw):
    return wattcast.predict_cluster(model, "dgx-a100", device=A100, gpus=tp, tp=tp, **{**KW, **kw})


@pytest.mark.parametrize("serve", [{}, SERVE])
def test_tp1_is_the_single_gpu_path_bit_for_bit(serve):
    one = wattcast.predict(MODEL, A100, mode="inference", **KW, **serve)
    tp1 = _tp(1, **serve)
    assert tp1.step_time_ms == one.step_time_ms and tp1.memory_gb == one.memory_gb
    assert tp1.energy_j == one.energy_j and tp1.flops == one.flops
    assert [(o["op_class"], o["time_ms"]) for o in tp1.per_op] == [(o["op_class"], o["time_ms"]) for o in one.per_op]
    assert tp1.meta["tensor_parallel"]["collectives"] == {}


def test_tp2_decode_has_two_all_reduces_per_layer_and_a_logits_gather():
    cfg = load_hf_config(MODEL)
    res = _tp(2)
    c = res.meta["tensor_parallel"]["collectives"]
    # two per layer (after o_proj, after down_proj) + the vocabulary-parallel embedding's, each batch x hidden x bf16
    assert c["all_reduce"]["count"] == 2 * cfg.n_layers + 1
    assert c["all_reduce"]["bytes"] == [KW["batch"] * cfg.hidden * 2.0]
    # the last position's logits of every sequence, gathered: batch x vocabulary x bf16
    assert c["all_gather"] == dict(count=1, bytes=[KW["batch"] * cfg.vocab * 2.0], total_bytes=KW["batch"] * cfg.vocab * 2.0)
    assert res.meta["tensor_parallel"]["collective_ms"] > 0
    coll = [o for o in res.per_op if o["op_class"] == "collective"]
    assert coll and sum(o["time_ms"] for o in coll) == pytest.approx(res.meta["tensor_parallel"]["collective_ms"])
    assert res.step_time_ms < _tp(1).step_time_ms  # half the weights read per GPU


def test_kv_cache_and_weights_per_gpu_halve_at_tp2():
    one, two = _tp(1), _tp(2)
    assert two.memory.kv_cache_gb == pytest.approx(one.memory.kv_cache_gb / 2, rel=1e-12)
    assert two.memory.weights_gb == pytest.approx(one.memory.weights_gb / 2, rel=1e-3)  # norms stay whole


def _kv_bytes(cfg: dict, tp: int) -> float:
    g = step_graph(cfg, StepOptions(batch=4, seq=1, mode="inference", dtype="bf16", attention="flash", tp=tp,
                                    kv_context=64))
    return g.meta["kv_cache_bytes"]


def test_fewer_kv_heads_than_ranks_are_replicated_as_vllm_does():
    cfg = dict(model_type="llama", hidden_size=1024, num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=2,
               intermediate_size=2048, vocab_size=32000)
    one, four = _kv_bytes(cfg, 1), _kv_bytes(cfg, 4)
    assert four == pytest.approx(one / 2)  # one of the two KV heads per rank, not half a head
    with pytest.raises(GraphError, match="replicates KV heads"):
        _kv_bytes(dict(cfg, hidden_size=1536, num_attention_heads=12, num_key_value_heads=3), 4)
    with pytest.raises(GraphError, match="divisible by tensor parallelism"):
        _kv_bytes(dict(cfg, num_key_value_heads=16), 3)  # 16 heads over 3 ranks


@pytest.mark.parametrize("kw, msg", [
    (dict(tp=16, gpus=16), "more than one node"),
    (dict(tp=2, gpus=4, pp=2), "pipeline-parallel serving is not modelled"),
    (dict(tp=2, gpus=4), "gpus (4) must equal tp (2)"),
    (dict(tp=2, gpus=2, zero=1), "zero=1 is not modelled"),
    (dict(tp=2, gpus=2, framework="megatron"), "--framework hf"),
])
def test_what_is_not_modelled_is_a_clear_error(kw, msg):
    with pytest.raises(ValueError) as e:
        wattcast.predict_cluster(MODEL, "dgx-a100", device=A100, **{**KW, **kw})
    assert msg in str(e.value)


def test_serving_options_on_a_cluster_need_kv_context():
    with pytest.raises(ValueError, match="give kv_context"):
        wattcast.predict_cluster(MODEL, "dgx-a100", gpus=2, tp=2, batch=16, seq=1, serving="vllm")


def test_cli_tp_serving_and_oom():
    ok = run_cli("predict", "--model", MODEL, "--cluster", "dgx-a100", "--device", A100, "--gpus", "2", "--tp", "2",
                 "--mode", "inference", "--batch", "16", "--seq", "1", "--kv-context", "256", "--dtype", "bf16",
                 "--attention", "flash", "--serving", "vllm", "--prompt-tokens", "128", "--output-tokens", "100",
                 "--json")
    assert ok.returncode == 0, ok.stderr
    d = json.loads(ok.stdout)
    assert d["settings"]["tp"] == 2 and d["serving"]["engine"] == "vllm"
    text = run_cli("predict", "--model", MODEL, "--cluster", "dgx-a100", "--device", A100, "--gpus", "2", "--tp", "2",
                   "--mode", "inference", "--batch", "16", "--seq", "1", "--kv-context", "256")
    assert text.returncode == 0 and "tensor parallel: 2 GPUs" in flat(text.stdout) and "65 all-reduces" in flat(text.stdout)
    # Llama 2 70B's bf16 weights (~69 GB per GPU at TP 2) do not fit a 40 GB A100: the single-device OOM exit
    oom = run_cli("predict", "--model", "llama2_70b", "--cluster", "dgx-a100", "--device", A100, "--gpus", "2", "--tp",
                  "2", "--mode", "inference", "--batch", "1", "--seq", "1", "--kv-context", "128", "--dtype", "bf16")
    assert oom.returncode == 3 and "does not fit" in flat(oom.stdout + oom.stderr)
    bad = run_cli("predict", "--model", MODEL, "--cluster", "dgx-a100", "--gpus", "2", "--tp", "2", "--mode",
                  "inference", "--batch", "16", "--seq", "1", "--serving", "vllm")
    assert bad.returncode != 0 and "give --kv-context" in flat(bad.stdout + bad.stderr)
