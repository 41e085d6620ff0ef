"""Audit 58b (context parallelism): the search names the sequence rule of a dropped --cp value and lists its
candidates in ``rejected``; ring attention is timed as the per-step kernels Transformer Engine launches; the trace's
cp.* events last what they add to the task, as the tp.* events, with the whole transfer in their args."""

import numpy as np
import pytest

import wattcast

# ---------------------------------------------------------------- finding 1: search and the 2 x cp sequence rule


def test_search_blames_the_sequence_rule_and_lists_its_candidates():
    """seq 32,776 is not a multiple of 2 x 8: cp 8 fits the 8 GPUs (tp 1 x cp 8), so the layouts are not the reason.
    Until stop 58 candidate_configs skipped these candidates before any rule ran: cp 8 was said to fit "none of the
    job's layouts" and ``rejected`` had no cp 8 row (with cp 8 alone both frames were empty)."""
    kw = dict(gpus=8, batch=8, seq=32776, framework="megatron", tp=(1,), pp=(1,), zero=(0,), sp=(False,),
              recompute=("none",), micro_batch=(1,), workers=1)
    res = wattcast.search("llama3_8b", "DGX-H100", cp=(8, 1), **kw)
    (d,) = [x for x in res.dropped_values if x["option"] == "cp"]
    assert d["value"] == 8 and d["rejected"] >= 1
    assert d["rule"].startswith("sequence length (32776) must be divisible by 2 x cp (16)")
    cp8 = res.rejected[res.rejected["config"].str.contains("-cp8")]
    assert len(cp8) == d["rejected"] and cp8["rule"].str.startswith("sequence length (32776)").all()
    assert set(res.ranked["cp"]) == {1}
    alone = wattcast.search("llama3_8b", "DGX-H100", cp=(8,), **kw)
    assert alone.ranked.empty and len(alone.rejected) == d["rejected"]
    assert alone.rejected["rule"].str.contains("divisible by 2 x cp").all()


def test_default_cps_still_skip_a_sequence_they_do_not_divide():
    """The search's own cp choices (none asked for) keep only those the sequence splits for: nothing to reject."""
    from wattcast.planning.search import candidate_configs

    cands = candidate_configs("llama3_8b", "DGX-H100", 8, 8, 32776, tp=(1,), pp=(1,), zero=(0,), sp=(False,),
                              recompute=("none",), micro_batch=(1,), interleave=(1,))
    assert {c.cp for c in cands} == {1, 2, 4}  # 32,776 = 8 x 4,097: not 16


def test_a_value_only_a_skipped_combination_had_names_its_rule():
    """--sp with only tp 1 (sequence parallelism needs TP) was said to fit none of the job's layouts."""
    from wattcast.planning.search import NO_CANDIDATE_RULE

    res = wattcast.search("llama3_8b", "DGX-H100", 8, 8, 4096, framework="megatron", tp=(1,), pp=(1,), zero=(0,),
                          sp=(False, True), recompute=("none",), micro_batch=(1,), cp=(1,), workers=1)
    got = {(x["option"], x["value"]): x for x in res.dropped_values}
    assert got[("sp", True)]["rule"] != NO_CANDIDATE_RULE
    assert "needs tensor parallelism (--tp > 1)" in got[("sp", True)]["rule"]


# ---------------------------------------------------------------- finding 2: ring attention's per-step kernels


def test_ring_steps_cover_the_same_pairs_as_the_node():
    """TE's load-balanced causal ring: one causal s x s step, ring - 1 steps of s x s/2 (lower) or s/2 x s (upper);
    every step s^2 / 2 pairs, ring x s^2 / 2 in all = the node's 1/cp of the causal square (s x ring s x 0.5)."""
    from wattcast.featurize.context_parallel import ring_attention_steps

    s = np.array([2048.0, 4096.0, 1024.0])
    ring = np.array([32.0, 8.0, 2.0])
    for causal in (True, False):
        sq, skv, kept, count = ring_attention_steps(s, ring, np.full(3, causal))
        pairs = (sq * skv * kept * count).sum(axis=1)
        assert pairs == pytest.approx(s * s * ring * (0.5 if causal else 1.0), rel=1e-12)
        assert count.sum(axis=1) == pytest.approx(ring)
    sq, skv, kept, count = ring_attention_steps(s, ring, np.ones(3, dtype=bool))
    assert (sq[:, 0] == s).all() and (skv[:, 0] == s).all() and (kept[:, 0] == 0.5).all()  # the diagonal
    assert (skv[:, 1] == s / 2).all() and (sq[:, 2] == s / 2).all() and (kept[:, 1:] == 1.0).all()


def _flash(cp: int, seq: int = 65536):
    r = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=cp, batch=1, seq=seq, tp=1, cp=cp, dp=1,
                                 framework="megatron", zero=1, micro_batch=1)
    return r, next(o for o in r.to_dict()["per_op"] if o["op_class"] == "flash_attention")


def test_ring_attention_is_timed_per_step_with_the_same_flops():
    """Llama 3 8B at 64k: the attention FLOPs per rank stay the causal total / cp, but the time is the per-step
    kernels' (2,048-token blocks at cp 32), not one 2,048 x 65,536 kernel's: until stop 58 the rate was 642 TFLOP/s at
    every cp, as at cp 1 (644). Each step's kernel is an (s, s/2) or (s/2, s) block or the causal diagonal, whose last
    wave of thread blocks leaves SMs idle (models/attention.py)."""
    _, one = _flash(1)
    rates = {}
    for cp in (8, 32):
        _, fa = _flash(cp)
        assert fa["flops"] * cp == pytest.approx(one["flops"], rel=1e-12)
        rates[cp] = fa["flops"] / fa["time_ms"] / 1e9
    rate_one = one["flops"] / one["time_ms"] / 1e9
    assert all(r < rate_one - 10.0 for r in rates.values())  # 629 vs 644 TFLOP/s on an H100


def test_costed_node_is_the_sum_of_its_step_kernels():
    """The node's time is the steps' own through the attention model: one causal diagonal + (ring - 1) / 2 lower and
    upper blocks, forward and backward, each step reading 1/ring of the node's bytes."""
    from wattcast.data.catalog import resolve_device
    from wattcast.models.attention import flash_attention_ms
    from wattcast.simulate.single_device import _flash_ms, _flash_mma_scale, _peak_tflops
    from wattcast.models.attention import scalar_fp32_tflops
    from wattcast.models.kernel_bundle import load_bundle
    import pandas as pd

    spec, bundle = resolve_device("H100-SXM5-80GB"), load_bundle()
    s, ring, bh, d = 2048.0, 32.0, 32.0, 128.0
    for phase, ratio in (("forward", 1.0), ("backward", 2.5)):
        flops = 4.0 * bh * s * s * ring * d * 0.5 * ratio
        io = 1e8
        f = pd.DataFrame({"B": [bh], "M": [s], "N": [d], "K": [s * ring], "phase": [phase], "kernel": ["fa3"],
                          "recompute": [False]})
        dt = np.array(["bf16"])
        ms, lo, hi, diag = _flash_ms(f, np.array([flops]), np.array([io]), dt, spec, bundle, np.array([ring]))
        one, *_ = _flash_ms(f, np.array([flops]), np.array([io]), dt, spec, bundle)  # as one kernel
        # context parallelism runs under megatron: on H100 TE's cuDNN attention, the fa3 class
        kw = dict(kernel=np.array(["fa3"] * 3), phase=np.array([phase] * 3), bh=np.full(3, bh), head_dim=np.full(3, d),
                  io_bytes=np.full(3, io / ring), peak_tflops=np.repeat(_peak_tflops(dt, spec, "bf16"), 3),
                  fp32_tflops=scalar_fp32_tflops(spec.peak_fp32_tflops, spec.num_sms, spec.cores_per_sm,
                                                 spec.boost_clock_mhz),
                  memory_gbps=spec.memory_bandwidth_gbps, sms=spec.num_sms,
                  mma_scale=np.repeat(_flash_mma_scale(dt, spec, bundle), 3))
        step = flash_attention_ms(s_q=np.array([s, s, s / 2]), s_kv=np.array([s, s / 2, s]),
                                  kept=np.array([0.5, 1.0, 1.0]), **kw)
        want = step[0] + (ring - 1) / 2 * (step[1] + step[2])
        assert ms[0] == pytest.approx(want, rel=1e-12) and diag[0] == pytest.approx(step[0] / want, rel=1e-12)
        assert ms[0] > one[0]  # smaller blocks: the wave tail and the diagonal's whole blocks cost more


def test_ring_hiding_uses_the_step_kernels():
    """The KV transfer of each step hides behind that step's kernel: with every step floored at a transfer between
    the off-diagonal step and the diagonal one, only the diagonal's steps hide it all."""
    from wattcast.simulate.distributed import _ring_step_ms

    attn = np.array([10.0 + 7 * 2.0])  # diagonal 10 ms, seven off-diagonal steps of 2 ms
    diag, off = _ring_step_ms(attn, np.array([10.0]), 8)
    assert diag[0] == pytest.approx(10.0) and off[0] == pytest.approx(2.0)
    mean_diag, mean_off = _ring_step_ms(attn, np.array([0.0]), 8)  # no split known: the mean step
    assert mean_diag[0] == mean_off[0] == pytest.approx(24.0 / 8)


# ---------------------------------------------------------------- finding 3: the trace's cp events


def _cp_events(r):
    return [e for e in r.events if str(e["name"]).startswith("cp.")]


@pytest.mark.parametrize("comm", ["p2p", "a2a", "allgather"])
def test_cp_trace_events_last_what_they_add_to_the_task(comm):
    """Every cp.* event lasts what it adds to its task (exposed), as the tp.* events; the ring's whole transfer and
    its hidden part are in the args. Until stop 58 a p2p ring event lasted its whole (mostly hidden) transfer, an
    a2a / allgather one its exposed time: Llama 3 8B cp 8 drew 682 ms of ring events with 0 ms of exposed CP."""
    kw = {} if comm == "p2p" else dict(cp_comm_type=comm)
    r = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=2, seq=32768, tp=1, cp=8, dp=1,
                                 framework="megatron", zero=1, micro_batch=1, trace=True, **kw)
    ev = _cp_events(r)
    assert ev
    n = r.meta["n_micro"]
    dur = sum(e["end_ms"] - e["start_ms"] for e in ev)
    assert dur == pytest.approx(n * sum(r.comm["task_comm_ms_per_micro_by_stage"]["cp"]), rel=1e-9)
    for e in ev:
        a = e["args"]
        assert a["exposed_ms"] == pytest.approx(e["end_ms"] - e["start_ms"], abs=1e-9)
        assert a["transfer_ms"] == pytest.approx(a["exposed_ms"] + a["hidden_ms"], rel=1e-12)
        assert a["cp_comm_type"] == comm and a["direction"] in ("forward", "backward")
    if comm == "p2p":
        assert r.exposed_comm_split_ms["cp"] == pytest.approx(0.0, abs=1e-9)
        assert dur == pytest.approx(0.0, abs=1e-9)  # hidden in full: 0 ms events, the transfer in the args
        assert sum(e["args"]["hidden_ms"] for e in ev) > 100.0
        assert all(e["args"]["ring_ranks"] == 8 for e in ev)
    else:
        assert dur > 0 and all(e["args"]["hidden_ms"] == 0.0 for e in ev)
