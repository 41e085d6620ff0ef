"""Per-stage memory terms a helper's audit found wrong against first-principles counts and Megatron-LM's schedules
(stop 35): FP8 weight copies per stage, the MoE experts' input under sequence parallelism, and interleaved 1F1B with
exactly pp micro-batches."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.memory import activation_bytes_by_layer
from wattcast.simulate.stage_memory import inflight_chunks, inflight_chunks_by_stage

L3_70B_LINEAR = 8192 * (8192 + 2 * 1024) + 8192 * 8192 + 3 * 8192 * 28672  # q, k, v, o and the SwiGLU MLP of a layer


def test_fp8_weight_copies_are_counted_per_stage_from_its_own_layers():
    """Transformer Engine keeps an FP8 weight and its transpose (2 B) of every FP8 GEMM parameter: for Llama 3 70B at
    TP8 a 20-layer stage holds 2 x 20 x (linear parameters / 8) more than in bf16. The share was taken from the short
    rank graph, whose embedding and head weighed far more than in the model (2.35 GB instead of 4.28)."""
    kw = dict(gpus=64, batch=16, seq=8192, tp=8, pp=4, dp=2, sp=True, recompute="selective", zero=1, micro_batch=1,
              framework="megatron")
    fp8, bf16 = (wattcast.predict_cluster("llama3_70b", "DGX-H100", dtype=d, **kw).per_device for d in ("fp8", "bf16"))
    expected_gb = 2 * 20 * L3_70B_LINEAR / 8 / 1e9
    for a, b in zip(fp8, bf16):
        assert a["weights_gb"] - b["weights_gb"] == pytest.approx(expected_gb, rel=1e-3)


@pytest.mark.parametrize("tp, ep, expected_mb", [(1, 8, 990.1), (2, 4, 528.6), (4, 2, 297.9), (8, 8, 182.5)])
def test_moe_experts_keep_the_gathered_rows_under_sequence_parallelism(tp, ep, expected_mb):
    """Megatron-Core's all-to-all dispatcher gathers the sequence shards itself (gather_from_sequence_parallel_region);
    the grouped GEMM keeps the gathered k x s x b x h rows, not the shard (Mixtral, seq 4,096, selective: 2 + 2 + 2.5
    + 2 + 2 + 2 sbh/t, the router's fp32 probabilities, k x sbh x 2 B of gathered input, k x sb x 3 ffn/t x 2 B), plus
    the rotated q and k the checkpointed core attention holds beside the fused QKV output, 2 + 2 kv/a = 2.5 sbh/t
    (megatron-core 0.16.1 attention.py l. 1097-1116, 1457-1462, tensor_parallel/random.py l. 528; not counted until
    stop 47: tests/test_megatron_memory.py rope_checkpoint_qkv_units)."""
    g = step_graph("mixtral_8x7b", StepOptions(batch=1, seq=4096, mode="train", dtype="bf16", attention="flash",
                                               recompute="selective", framework="megatron", tp=tp, sp=tp > 1, ep=ep,
                                               blocks=3))
    rope_qk_mb = 2.5 * 4096 * 4096 / tp / 1e6
    assert activation_bytes_by_layer(g)[0][1] / 1e6 == pytest.approx(expected_mb + rope_qk_mb, rel=2e-3)


def test_interleaved_1f1b_with_pp_micro_batches_runs_every_forward_first():
    """Megatron-LM's interleaved schedule with num_microbatches == pp warms up with every micro-batch
    (all_warmup_microbatches): each stage holds n_micro x v chunks, the last one too."""
    assert list(inflight_chunks_by_stage(pp=4, interleave=2, n_micro=4, schedule="1f1b")) == [8, 8, 8, 8]
    assert inflight_chunks(3, pp=4, interleave=2, n_micro=4, schedule="1f1b") == 8
    assert list(inflight_chunks_by_stage(pp=4, interleave=2, n_micro=8, schedule="1f1b")) == [11, 9, 7, 5]
    r = wattcast.predict_cluster("llama3_70b", "DGX-H100", gpus=32, batch=4, seq=4096, tp=8, pp=4, dp=1, sp=True,
                                 interleave=2, recompute="selective", micro_batch=1, framework="megatron")
    assert r.to_dict()["memory"]["stage"] == 3  # the head's stage, holding every chunk, is the fullest


def test_interleaved_stages_count_each_chunk_as_often_as_megatron_has_it_in_flight():
    """Megatron-LM's interleaved order (forward j runs chunk (j mod pp v) div pp): with equal chunks the peak is the
    in-flight count times a chunk; the last stage's head chunk (its fp32 logits) is in flight once at the peak, not as
    often as the mean chunk (it was counted at the mean: +6-34% on that stage)."""
    import numpy as np

    from wattcast.simulate.stage_memory import interleaved_peak_bytes

    equal = np.ones((2, 4))
    assert list(interleaved_peak_bytes(equal, n_micro=8)) == list(inflight_chunks_by_stage(pp=4, interleave=2, n_micro=8,
                                                                                         schedule="1f1b"))
    assert list(interleaved_peak_bytes(equal, n_micro=4)) == [8, 8, 8, 8]  # every forward first
    head = equal.copy()
    head[1, 3] = 3.0  # the last stage's second chunk holds the head
    assert interleaved_peak_bytes(head, n_micro=8)[3] == 4 * 1.0 + 1 * 3.0  # 4 first-chunk forwards, the head's once


def test_the_fp8_weight_cast_is_not_sharded_by_zero():
    """ZeRO shards the optimizer step over the DP ranks; Transformer Engine's FP8 re-cast of the updated weights (4 B
    per FP8-GEMM parameter) runs on every rank's whole weights: Llama 3 8B on 8 H100s adds 8 x the per-rank share
    (it was divided by dp: +1.1 ms instead of +9.0)."""
    kw = dict(gpus=8, batch=32, seq=8192, tp=1, dp=8, zero=1, micro_batch=1, framework="megatron")
    fp8, bf16 = (wattcast.predict_cluster("llama3_8b", "DGX-H100", dtype=d, **kw).to_dict()["optimizer_ms"]
                 for d in ("fp8", "bf16"))
    assert 8.0 < fp8 - bf16 < 10.0  # 32 layers' casts of 0.28 ms each


def test_bf16_moments_halve_the_optimizer_states_and_its_traffic():
    """--optimizer adamw-bf16 (Megatron-Core's precision-aware optimizer with bf16 moments): 4 B of states a parameter
    (Megatron's 6 + 12/d becomes 6 + 8/d B/param under the distributed optimizer), 24 B moved by the step."""
    from wattcast.featurize.training_graph import OPTIMIZER_BYTES_PER_PARAM, optimizer_state_bytes
    from wattcast.simulate.stage_memory import model_state_bytes

    assert optimizer_state_bytes("adamw") == 8 and optimizer_state_bytes("adamw-bf16") == 4
    assert OPTIMIZER_BYTES_PER_PARAM[("adamw", True)] - OPTIMIZER_BYTES_PER_PARAM[("adamw-bf16", True)] == 8
    p, d = 1e9, 8
    for opt, per_param in (("adamw", 6 + 12 / d), ("adamw-bf16", 6 + 8 / d)):
        st = model_state_bytes(p, dtype_bytes=2, optimizer=opt, zero=1, dp=d)
        assert sum(st.values()) / p == pytest.approx(per_param)
    kw = dict(gpus=8, batch=8, seq=1024, tp=1, pp=1, micro_batch=1, zero=1, framework="megatron")
    a = wattcast.predict_cluster("llama3_8b", "dgx_h100", optimizer="adamw", **kw)
    b = wattcast.predict_cluster("llama3_8b", "dgx_h100", optimizer="adamw-bf16", **kw)
    assert b.memory["optimizer_gb"] == pytest.approx(a.memory["optimizer_gb"] / 2)
    assert b.memory["master_weights_gb"] == pytest.approx(a.memory["master_weights_gb"])
    assert b.optimizer_ms < a.optimizer_ms


def test_search_takes_the_optimizer_and_names_an_unknown_one():
    from conftest import run_cli

    ok = run_cli("search", "--model", "gpt2", "--cluster", "dgx-h100", "--gpus", "2", "--batch", "4", "--seq", "256",
                 "--optimizer", "adamw-bf16", "--json", "--top", "1")
    assert ok.returncode == 0, ok.stderr
    bad = run_cli("search", "--model", "gpt2", "--cluster", "dgx-h100", "--gpus", "2", "--batch", "4", "--seq", "256",
                  "--optimizer", "lion")
    assert bad.returncode != 0 and "unknown optimizer 'lion'" in bad.stdout + bad.stderr


@pytest.mark.parametrize("dtype, buffer_bytes", [("bf16", 12 * 2), ("fp8", 8 * 1 + 4 * 2)])
def test_tp_comm_overlap_holds_transformer_engines_userbuffers(dtype, buffer_bytes):
    """--tp-comm-overlap allocates Transformer Engine's userbuffers (initialize_ub): 12 buffers of (seq x micro-batch
    / cp, hidden), the 8 all-gather ones at 1 B under FP8, and two more cuBLAS workspaces for its streams. Llama 3 70B,
    seq 8,192, hidden 8,192: 1.61 GB in bf16 (the auditor's estimate 0.7-1.3 GB at 4-8k tokens); they were not
    counted at all. The search's memory (the summary path) carries them too."""
    from wattcast.simulate.stage_memory import CUBLAS_WORKSPACE_BYTES

    kw = dict(gpus=64, batch=16, seq=8192, tp=8, pp=4, dp=2, sp=True, recompute="selective", zero=1, micro_batch=1,
              framework="megatron", dtype=dtype)
    on, off = (wattcast.predict_cluster("llama3_70b", "DGX-H100", tp_comm_overlap=o, **kw).to_dict()["memory"]
               for o in (True, False))
    expected = (8192 * 8192 * buffer_bytes + 2 * CUBLAS_WORKSPACE_BYTES) / 1e9
    assert on["buffers_gb"] - off["buffers_gb"] == pytest.approx(expected, rel=1e-9)
    assert on["total_gb"] - off["total_gb"] == pytest.approx(expected, rel=1e-9)
    # context parallelism shortens the buffers' rows (Megatron-LM passes seq x micro-batch / cp)
    cp2 = dict(kw, gpus=128, cp=2)
    on2, off2 = (wattcast.predict_cluster("llama3_70b", "DGX-H100", tp_comm_overlap=o, **cp2).to_dict()["memory"]
                 for o in (True, False))
    assert on2["buffers_gb"] - off2["buffers_gb"] == pytest.approx((4096 * 8192 * buffer_bytes
                                                                    + 2 * CUBLAS_WORKSPACE_BYTES) / 1e9, rel=1e-9)


def test_search_memory_counts_the_userbuffers_as_predict_does():
    """A search's memory figure (the summary path) is the same total as predict's for a TP-overlap strategy."""
    from wattcast.planning.search import search

    res = search("llama3_8b", "DGX-H100", 8, 8, 4096, dtype="bf16", framework="megatron", tp=(4,), pp=(1,),
                 micro_batch=(1,), zero=(1,), sp=(True,), recompute=("selective",), interleave=(1,),
                 overlaps=dict(tp_comm_overlap=True))
    best = res.best
    p = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=8, seq=4096, tp=4, pp=1, dp=2, sp=True,
                                 recompute="selective", zero=1, micro_batch=1, framework="megatron", dtype="bf16",
                                 tp_comm_overlap=True)
    assert best["memory_gb"] == pytest.approx(p.to_dict()["memory"]["total_gb"], rel=1e-9)


def _peak_one_stage_at_a_time(chunk_bytes, n_micro):
    """interleaved_peak_bytes as it was written until stop 41: Megatron-LM's order replayed stage by stage."""
    import numpy as np

    v, pp = chunk_bytes.shape
    total = n_micro * v
    j = np.arange(total)
    fwd_chunk = (j % (pp * v)) // pp
    warm = inflight_chunks_by_stage(pp=pp, interleave=v, n_micro=n_micro, schedule="1f1b") - 1
    out = np.zeros(pp)
    for s in range(pp):
        a = chunk_bytes[:, s]
        cum_f = np.cumsum(a[fwd_chunk])
        cum_b = np.concatenate([[0.0], np.cumsum(a[v - 1 - fwd_chunk])])
        out[s] = float(np.max(cum_f - cum_b[np.maximum(j - int(min(warm[s], total - 1)), 0)]))
    return out


@pytest.mark.parametrize("v,pp,n_micro", [(2, 2, 2), (2, 4, 8), (3, 8, 24), (4, 16, 96), (5, 4, 1536), (4, 64, 64)])
def test_interleaved_peak_all_stages_at_once_is_bit_identical(v, pp, n_micro):
    # every stage's cumulative sums in one array (stop 41, search speed): the same additions in the same order, so the
    # same floats as the stage-by-stage replay, unequal chunks included
    import numpy as np

    from wattcast.simulate.stage_memory import interleaved_peak_bytes

    chunk_bytes = np.random.default_rng(v * 1000 + pp).random((v, pp)) * 3.7e9
    got = interleaved_peak_bytes(chunk_bytes, n_micro=n_micro)
    assert got.shape == (pp,) and got.tobytes() == _peak_one_stage_at_a_time(chunk_bytes, n_micro).tobytes()


@pytest.mark.parametrize("framework", ["hf", "megatron"])
@pytest.mark.parametrize("zero", [0, 1, 3])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_peak_terms_sum_to_the_total(framework, zero, recompute):
    """Issue 15 (stop 52 audit): ``memory``'s terms are both peaks' (the passes' and after the last backward's), so they
    do not add up to ``total_gb``; ``peak_phase`` names the peak and ``peak_terms_gb`` holds its terms, which do."""
    from wattcast.simulate.stage_memory import PEAK_TERMS

    m = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=8, seq=1024, zero=zero, framework=framework,
                                 micro_batch=1, recompute=recompute).to_dict()["memory"]
    during = m["activations_gb"] + m["buffers_gb"] + m["unsharded_gradients_gb"]
    phase = "backward" if during >= m["post_backward_buffers_gb"] else "after_backward"
    assert m["peak_phase"] == phase
    assert tuple(m["peak_terms_gb"]) == PEAK_TERMS[phase]
    assert all(m["peak_terms_gb"][k] == m[k] for k in PEAK_TERMS[phase])
    assert sum(m["peak_terms_gb"].values()) == pytest.approx(m["total_gb"], rel=1e-12)
    if (framework, zero, recompute) == ("hf", 3, "full"):
        # FSDP with few activations: the end of the backward (root unit and first block's gradients in reduction)
        assert phase == "after_backward"


def test_peak_terms_of_the_zero3_audit_case():
    """The audit's case: Llama 3 70B, FSDP (hf ZeRO-3), full recomputation, 64 H100s: 58.2 GB of terms, 43.28 GB
    total, the passes' peak (states 17.64 + activations 8.39 + transient 5.25 + buffers 8.16 + unsharded gradients
    3.84; 52.9 / 38.02 GB until stop 55, before a stage carried its largest kernel's working set, here the loss's
    10 bytes a logit of 4,096 x 128,256)."""
    m = wattcast.predict_cluster("llama3_70b", "DGX-H100", gpus=64, batch=64, seq=4096, zero=3, framework="hf",
                                 micro_batch=1, recompute="full").to_dict()["memory"]
    every = sum(v for k, v in m.items() if k.endswith("_gb") and k not in ("total_gb", "peak_terms_gb"))
    assert every == pytest.approx(58.2, abs=0.05) and m["total_gb"] == pytest.approx(43.28, abs=0.005)
    assert m["peak_phase"] == "backward"
    assert sum(m["peak_terms_gb"].values()) == pytest.approx(m["total_gb"], rel=1e-12)
