"""Tensor-parallel KV-cached inference on one node (``predict_cluster(..., kv_context=)``, simulate/tp_inference.py):
TP 1 is the single-GPU path, TP 2 has two all-reduces per layer of the right bytes and the logits gather, the KV cache
per GPU splits (or stays one replicated head per rank, as vLLM's QKVParallelLinear), and what is not modelled is a
clear error."""

from __future__ import annotations

import json
import math

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
    # half the weights read per GPU: the GPU's step (host_us=0); at eager PyTorch's host cost (40 us a launch since stop
    # 56) this decode step is host-bound and TP2's all-reduces are launches more
    assert _tp(2, host_us=0).step_time_ms < _tp(1, host_us=0).step_time_ms
    assert res.step_time_ms >= _tp(2, host_us=0).step_time_ms


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


# ------------------------------------------------------------------ the TP engine cost of a served group (tp_sync)
def test_served_tp_group_adds_the_fitted_tp_cost_per_layer_and_log2_tp():
    """TP > 1 served: the iteration is GPU step + host + prefill + k x layers x log2(TP) (ML.ENERGY v2's TP2 rows are
    no faster than TP1; before, nothing was added and TP2 came out 8-16 ms short), shown in the JSON and per op."""
    from wattcast.simulate.serving import serving_constants

    k = serving_constants("vllm")["tp_sync_ms_per_layer_log2_tp"]
    assert k > 0
    for tp in (2, 8):
        res = _tp(tp, **SERVE)
        s = res.meta["serving"]
        want = k * 32 * math.log2(tp)  # llama2_7b: 32 layers
        assert s["tp_sync_ms"] == pytest.approx(want, rel=1e-12)
        assert res.step_time_ms == pytest.approx(s["gpu_step_ms"] + s["host_ms"] + s["prefill_ms"] + want, rel=1e-12)
        assert res.overheads["serving_tp_sync_ms"] == s["tp_sync_ms"]
        assert [o["time_ms"] for o in res.per_op if o["op_class"] == "serving_tp_sync"] == [s["tp_sync_ms"]]
        assert res.to_dict()["serving"]["tp_provenance"]["fit_models"]
    # the bare TP decode step (no serving) has no engine and so no TP engine cost
    assert "serving_tp_sync_ms" not in _tp(2).overheads


@pytest.mark.parametrize("serve", [{}, SERVE])
def test_tp1_served_iteration_has_no_tp_cost(serve):
    one = _tp(1, **serve)
    assert not any(o["op_class"] == "serving_tp_sync" for o in one.per_op)
    assert "serving_tp_sync_ms" not in one.overheads and "tp_sync_ms" not in (one.meta.get("serving") or {})
    if serve:
        s = one.meta["serving"]
        assert one.step_time_ms == s["gpu_step_ms"] + s["host_ms"] + s["prefill_ms"]


def test_tp_cost_artifact_checks(monkeypatch):
    from wattcast.simulate import serving as sv

    good = sv.serving_constants("vllm")
    monkeypatch.setattr(sv, "serving_constants", lambda e: {k: v for k, v in good.items()
                                                             if k != "tp_sync_ms_per_layer_log2_tp"})
    with pytest.raises(ValueError, match="no tensor-parallel constant"):
        _tp(2, **SERVE)
    assert _tp(1, **SERVE).step_time_ms > 0  # the single-GPU iteration does not need it


def test_tp_cost_must_be_a_finite_non_negative_number(tmp_path, monkeypatch):
    from wattcast.simulate import serving as sv

    doc = json.loads(sv.serving_artifact_path("vllm").read_text())
    doc["tp_sync_ms_per_layer_log2_tp"] = -0.1
    p = tmp_path / "serving_vllm.json"
    p.write_text(json.dumps(doc))
    monkeypatch.setattr(sv, "serving_artifact_path", lambda e: p)
    sv.serving_constants.cache_clear()
    try:
        with pytest.raises(ValueError, match="tp_sync_ms_per_layer_log2_tp must be a finite number >= 0"):
            sv.serving_constants("vllm")
    finally:
        sv.serving_constants.cache_clear()


def test_tp_fit_recovers_a_known_constant_from_the_fitting_half_only():
    """fit_tp_sync on synthetic rows made with k = 0.2 ms gives it back; the other half's rows (made with another k)
    do not move it."""
    import numpy as np
    import pandas as pd

    from wattcast.training import serving_fit as sf

    A, B = sf.TP_HALVES["A"], sf.TP_HALVES["B"]
    t = pd.DataFrame(dict(Model=[A[0], A[0], A[1], A[1], B[0], B[1]], tp=[2, 2, 8, 8, 2, 8],
                          n_layers=[32, 32, 80, 80, 42, 80], pred_ms=[30.0, 60.0, 60.0, 200.0, 40.0, 70.0]))
    t["half"] = ["A"] * 4 + ["B"] * 2
    t["measured_ms"] = t["pred_ms"] + np.where(t["half"] == "A", 0.2, 0.9) * t["n_layers"] * np.log2(t["tp"])
    r = sf.fit_tp_sync(t, "A")
    assert r["tp_sync_ms_per_layer_log2_tp"] == pytest.approx(0.2, rel=1e-12)
    fit_all = r["fit"].set_index("group").loc["all"]
    assert fit_all["mape_pct"] == pytest.approx(0.0, abs=1e-9) and fit_all["before_signed_pct"] < 0
    assert r["evaluation"].set_index("group").loc["all", "signed_pct"] < 0  # B's larger cost is under-predicted


def test_shipped_tp_constant_provenance_splits_by_model():
    from wattcast.simulate.serving import serving_constants
    from wattcast.training import serving_fit as sf

    p = serving_constants("vllm")["tp_provenance"]
    assert p["fit_models"] == list(sf.TP_HALVES["A"]) and p["evaluation_models"] == list(sf.TP_HALVES["B"])
    assert not set(p["fit_models"]) & (set(p["evaluation_models"]) | set(p["never_fitted_models"]))
