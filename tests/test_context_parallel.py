"""Context parallelism (--cp): ring attention, its rules, its costs, and where it shows up."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattcast
from conftest import run_cli
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.parallel import ParallelConfigError
from wattcast.planning.search import candidate_configs

KW = dict(tp=8, micro_batch=1, sp=True, zero=1, recompute="selective", attention="flash", framework="megatron")


def _llama(cp: int, seq: int = 32768, gpus: int = 32):
    return wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=gpus, batch=4, seq=seq, cp=cp, **KW)


def test_attention_work_per_rank_is_one_cp_th_of_the_causal_attention():
    def flash_flops(cp: int) -> float:
        o = StepOptions(batch=1, seq=32768 // cp, mode="train", dtype="bf16", attention="flash", framework="megatron", cp=cp)
        n = step_graph("llama3_8b", o, blocks=3).nodes
        return float(n.loc[(n["op_class"] == "flash_attention") & (n["phase"] == "forward"), "flops"].sum())

    full = flash_flops(1)
    for cp in (2, 4, 8):
        assert flash_flops(cp) == pytest.approx(full / cp, rel=1e-9)


def test_activations_and_memory_shrink_with_cp_and_the_kv_exchange_is_costed():
    r1, r4 = _llama(1), _llama(4)
    assert r4.memory["activations_gb"] == pytest.approx(r1.memory["activations_gb"] / 4, rel=0.02)
    assert r4.fits and r4.to_dict()["parallel"]["cp"] == 4 and "cp4" in r4.parallel.describe()
    # K and V of one layer's local tokens: 2 x (32768 / 4) tokens x 8 KV heads / tp 8 x 128 x 2 bytes
    fwd_ms, bwd_ms = r4.comm["cp_kv_step_ms"]
    assert 0 < fwd_ms < bwd_ms
    # the same total work on the same GPUs: the step time changes by the exchange and the DP group, not 4x
    assert 0.8 < r4.step_time_ms / r1.step_time_ms < 1.3


def test_exchange_is_exposed_when_attention_blocks_are_short():
    """At 2K tokens per sequence split 8 ways each ring step's attention block is tiny and the KV transfer across
    nodes shows; at 128K it hides behind the attention."""
    short = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=64, batch=1, seq=2048, cp=8, **KW)
    long_ = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=64, batch=1, seq=131072, cp=8, **KW)
    assert short.comm["cp_exposed_ms_per_micro"] > 0
    assert long_.comm["cp_exposed_ms_per_micro"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("kw,msg", [
    (dict(seq=1004, cp=4), "divisible by 2 x cp"),
    (dict(seq=1040, cp=4), "rank's 260 tokens must be divisible by tp"),
    (dict(seq=4096, cp=4, attention="eager"), "use --attention flash"),
    (dict(seq=4096, cp=3), "multiple of tp x pp x cp"),
    (dict(seq=4096, cp=0), "--cp must be a positive integer"),
])
def test_cp_rules(kw, msg):
    args = dict(KW, **kw)
    seq, cp = args.pop("seq"), args.pop("cp")
    with pytest.raises(ParallelConfigError, match=msg):
        wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=32, batch=1, seq=seq, cp=cp, **args)


def test_cp_needs_a_causal_decoder():
    with pytest.raises(ParallelConfigError, match="causal decoder"):
        wattcast.predict_cluster("bert_base", "DGX-H100", gpus=8, batch=4, seq=512, cp=2, attention="flash",
                                 framework="megatron")


def test_search_includes_cp_for_long_sequences_and_cli_flags():
    long_ = candidate_configs("llama3_8b", "DGX-H100", 16, 16, 32768)
    assert {c.cp for c in long_} == {1, 2, 4, 8}
    assert all(c.tp * c.pp * c.cp * c.dp == 16 for c in long_)
    assert {c.cp for c in candidate_configs("llama3_8b", "DGX-H100", 16, 16, 4096)} == {1}
    r = run_cli("predict", "--model", "llama3_8b", "--cluster", "DGX-H100", "--gpus", "16", "--batch", "1", "--seq", "16384",
                "--tp", "8", "--cp", "2", "--sp", "--attention", "flash", "--dtype", "bf16", "--framework", "megatron", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["parallel"]["cp"] == 2 and d["parallel"]["dp"] == 1
    s = run_cli("search", "--model", "gpt2", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "8", "--seq", "1024",
                "--cp", "1", "--cp", "2", "--max-configs", "120", "--framework", "megatron", "--json")
    assert s.returncode == 0, s.stderr
    cps = {row["cp"] for row in json.loads(s.stdout)["ranked"]}
    assert cps <= {1, 2} and 2 in cps
    one = run_cli("predict", "--model", "gpt2", "--device", "H100-SXM5-80GB", "--cp", "2")
    assert one.returncode == 2 and "need --cluster" in one.stderr
    assert np.isfinite(d["step_time_ms"])


def test_ring_exchange_is_in_the_trace(tmp_path):
    out = tmp_path / "cp.json"
    r = run_cli("predict", "--model", "llama3_8b", "--cluster", "DGX-H100", "--gpus", "16", "--batch", "2", "--seq", "16384",
                "--tp", "4", "--cp", "2", "--pp", "2", "--micro-batch", "1", "--sp", "--attention", "flash", "--dtype", "bf16",
                "--framework", "megatron", "--trace", str(out))
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    ev = d["traceEvents"] if isinstance(d, dict) else d
    ring = [e for e in ev if str(e.get("name", "")).startswith("cp.ring_kv")]
    assert len(ring) == 2 * 2 * 2  # 2 stages x 2 micro-batches x (forward, backward)


def test_ring_step_host_floor_is_exposed_where_the_host_sets_the_pace():
    """``host_ms``'s fourth entry: each ring-attention step takes at least that long (Transformer Engine runs a step's
    P2P exchange, attention and corrections from Python). A tiny model's steps are host work, exposed per layer;
    128K-token blocks hide it behind the attention; no floor is the framework default; a bad floor is refused."""
    from wattcast.simulate.distributed import predict_distributed
    from wattcast.simulate.options import DistributedOptions
    from wattcast.simulate.parallel import ParallelConfig

    def run(seq: int, floor: float | None):
        par = ParallelConfig(gpus=64, tp=8, cp=8, dp=1, micro_batch=1, sp=True, zero=1, recompute="selective")
        host = None if floor is None else (0.006, 0.0, {}, floor)
        return predict_distributed("llama3_8b", "DGX-H100", par, DistributedOptions(
            batch=1, seq=seq, attention="flash", framework="megatron", host_ms=host))

    base, zero, floored = run(2048, None), run(2048, 0.0), run(2048, 5.0)
    assert zero.step_time_ms == pytest.approx(base.step_time_ms, rel=1e-12)
    assert floored.comm["cp_kv_step_ms"][0] == pytest.approx(5.0) and floored.comm["cp_kv_step_ms"][1] == pytest.approx(5.0)
    # 32 layers x 7 steps x 2 directions of at least (5 ms - the step's attention block), one micro-batch
    assert floored.comm["cp_exposed_ms_per_micro"] > 32 * 7 * 2 * 4.0
    assert floored.step_time_ms > base.step_time_ms + 32 * 7 * 2 * 4.0
    long_ = run(131072, 0.2)  # a step's attention block there: ~0.46 ms forward
    assert long_.comm["cp_exposed_ms_per_micro"] == pytest.approx(0.0, abs=1e-9)
    for bad in (-1.0, float("nan"), "x"):
        with pytest.raises(ValueError, match="ring-step floor"):
            run(2048, bad)


def test_ring_backward_runs_cp_steps_as_transformer_engine():
    """Transformer Engine 2.20.2 ``AttnFuncWithCPAndKVP2P.backward`` (context_parallel.py l. 2694-2730, waits
    l. 2952-2954) runs cp steps: step 0 sends K/V, the last dK/dV, the others both, each step's transfer beside that
    step's attention block. Until stop 48 the backward was cp - 1 steps each sending K/V and their gradients (the same
    bytes, one block fewer to hide behind). With every step floored at 5 ms (tiny 2K-token blocks) the backward's ring
    exposes cp steps, and the trace's ring events' transfers (args ``transfer_ms``) sum to layers x ((cp - 1) forward
    + cp backward + (cp - 1) recomputed forward) steps, their durations (what they add to the tasks, since stop 58)
    to the exposed part."""
    from wattcast.simulate.distributed import predict_distributed, ring_backward_steps
    from wattcast.simulate.options import DistributedOptions
    from wattcast.simulate.parallel import ParallelConfig

    assert [ring_backward_steps(n) for n in (1, 2, 4, 8)] == [(0, 0), (2, 0), (2, 2), (2, 6)]
    par = ParallelConfig(gpus=64, tp=8, cp=8, dp=1, micro_batch=1, sp=True, zero=1, recompute="selective")
    r = predict_distributed("llama3_8b", "DGX-H100", par, DistributedOptions(
        batch=1, seq=2048, attention="flash", framework="megatron", host_ms=(0.006, 0.0, {}, 5.0), trace=True))
    steps = 32 * (7 + 8 + 7)  # 32 layers, one micro-batch: forward, backward, recomputed forward
    # each step exposes 5 ms less its attention block (< 0.1 ms at 256 tokens a rank)
    assert steps * 4.9 < r.comm["cp_exposed_ms_per_micro"] <= steps * 5.0
    ring = [e for e in r.events if e["name"].startswith("cp.ring_kv")]
    assert sum(e["args"]["transfer_ms"] for e in ring) == pytest.approx(steps * 5.0, rel=1e-9)
    assert sum(e["end_ms"] - e["start_ms"] for e in ring) == pytest.approx(r.comm["cp_exposed_ms_per_micro"], rel=1e-9)


def test_recomputed_attention_runs_its_ring_again():
    """Selective (core_attn) or full recomputation re-runs the fused attention's forward in the backward, ring and
    all: its cp - 1 KV steps come back, each beside a block of the re-run forward. Until stop 36 the re-run's time hid
    the backward's own transfers and the recomputed ring was free (exposed CP time fell when recomputation was on)."""
    kw = dict(gpus=16, batch=1, seq=32768, tp=2, cp=8, sp=True, zero=1, micro_batch=1, framework="megatron")
    by = {rc: wattcast.predict_cluster("llama3_8b", "dgx_h100", recompute=rc, **kw) for rc in ("none", "selective")}
    cp = {rc: r.exposed_comm_split_ms["cp"] for rc, r in by.items()}
    assert cp["selective"] > cp["none"]
    step_f, step_b = by["none"].comm["cp_kv_step_ms"]
    assert step_b == pytest.approx(2 * step_f, rel=0.3)  # K, V and their gradients
    # at most one more forward ring per layer (the re-run's blocks hide part of it)
    assert cp["selective"] - cp["none"] <= 32 * 7 * step_f * 1.01


def test_model_flops_count_the_fused_attention_backward_at_twice_its_forward():
    """MFU's model FLOPs (Megatron-LM's and PaLM's convention): attention's backward is 2x its forward; the fused
    kernel's 2.5x (FlashAttention recomputes QK^T) is hardware work, in HFU only."""
    from wattcast.simulate.distributed import _model_totals

    g = step_graph("llama3_8b", StepOptions(batch=1, seq=4096, dtype="bf16", attention="flash", framework="megatron",
                                            blocks=2))
    n = g.nodes
    fa = n["op_class"] == "flash_attention"
    fwd = float(n.loc[fa & (n["phase"] == "forward"), "flops"].sum())
    bwd = float(n.loc[fa & (n["phase"] == "backward"), "flops"].sum())
    assert bwd == pytest.approx(2.5 * fwd)
    t = _model_totals(g, 1, 0)
    every = float(n.loc[n["phase"] != "optimizer", "flops"].sum())
    assert t["flops"] == pytest.approx(every - 0.5 * fwd) and t["flash_rc_flops"] == pytest.approx(0.5 * fwd)
    r = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=8, seq=4096, micro_batch=1, framework="megatron")
    assert r.hfu > r.mfu  # no recomputation asked for: the difference is FlashAttention's own


def test_ring_attention_merges_each_step_and_accumulates_its_gradients():
    """Transformer Engine's ring attention corrects the running output with each of the cp - 1 further steps (the
    softmax-LSE merge) and accumulates each step's dQ and passed dK/dV in backward: memory-bound kernels that grow with
    the rank's tokens and cp (none without context parallelism)."""
    def nodes(cp):
        g = step_graph("llama3_8b", StepOptions(batch=1, seq=32768 // cp, cp=cp, dtype="bf16", attention="flash",
                                                framework="megatron", blocks=1))
        n = g.nodes
        return n[n["layer"] == 0]

    n8 = nodes(8)
    corr = n8[n8["name"].str.contains("cp_out_correction|cp_dq_accumulate|cp_dkv_accumulate")]
    assert set(corr["phase"]) == {"forward", "backward"} and len(corr) == 3
    assert (corr["scale"] == 7.0).all()
    out = corr[corr["name"].str.endswith("cp_out_correction")].iloc[0]
    assert out["bytes"] == pytest.approx(7 * 3 * (32768 // 8) * 4096 * 2)  # (cp - 1) x 3 x tokens x hidden x 2 B
    assert not nodes(1)["name"].str.contains("cp_").any()


def test_search_tries_cp16_from_128k_tokens():
    from wattcast.planning.search import default_cps

    assert default_cps(8192) == (1, 2) and default_cps(32768) == (1, 2, 4, 8)  # cp 2 from 8,192 since stop 56
    assert default_cps(131072) == (1, 2, 4, 8, 16)  # Llama 3 405B's long-context stage: CP 16
    cands = candidate_configs("llama3_8b", "DGX-H100", 64, 64, 131072, tp=(4,), pp=(1,), micro_batch=(1,), zero=(1,),
                              sp=(True,), recompute=("none",), interleave=(1,))
    assert 16 in {c.cp for c in cands}
