"""Megatron-Core's communication overlaps: the partial-overlap model, the flags and their defaults, the exposed split."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattcast
from conftest import run_cli
from wattcast.simulate.distributed import predict_distributed
from wattcast.simulate.overlap import ep_overlap_layer_ms, overlap_defaults, overlapped_ms, sm_share, tp_overlap_layer_ms
from wattcast.simulate.parallel import ParallelConfig, ParallelConfigError


def test_overlapped_time_bounds_and_monotone():
    rng = np.random.default_rng(0)
    comp, comm = rng.uniform(0, 10, 200), rng.uniform(0, 10, 200)
    share = sm_share(16, 132)
    t = overlapped_ms(comp, comm, share=share)
    assert np.all(t >= np.maximum(comp, comm) - 1e-12)  # never faster than the longer of the two
    assert np.all(t <= comp + comm + 1e-12)  # never slower than running them one after the other
    # nothing to hide behind: fully exposed; no SM taken: the longer of the two
    assert overlapped_ms(0.0, 3.0, share=share) == pytest.approx(3.0)
    assert overlapped_ms(5.0, 3.0, share=0.0) == pytest.approx(5.0)
    # more computation never makes the pair faster, and what shows beyond the computation is at most the part of the
    # communication that outlasts it plus the SMs' share of the overlapped part
    c = np.linspace(0, 10, 50)
    t = overlapped_ms(c, 6.0, share=share)
    assert np.all(np.diff(t) >= -1e-12)
    assert np.all(t - c <= np.maximum(6.0 - c, 0.0) + share * 6.0 + 1e-12)
    # the chunk a pipelined collective cannot overlap is always paid
    assert tp_overlap_layer_ms(100.0, 8.0, tp=8, num_sms=132) >= 100.0 + 1.0


def test_defaults_follow_the_framework():
    assert overlap_defaults("megatron", tp=8, sp=True, zero=1) == dict(overlap_grad_reduce=True, overlap_param_gather=True,
                                                                      tp_comm_overlap=True,
                                                                      overlap_moe_expert_parallel_comm=False,
                                                                      overlap_p2p_comm=True, async_tp_comm=True)
    assert overlap_defaults("megatron", tp=1, sp=False, zero=0) == dict(overlap_grad_reduce=True, overlap_param_gather=False,
                                                                       tp_comm_overlap=False,
                                                                       overlap_moe_expert_parallel_comm=False,
                                                                       overlap_p2p_comm=True, async_tp_comm=False)
    for fw in ("hf", "megatron-deepspeed"):
        assert not any(overlap_defaults(fw, tp=8, sp=True, zero=1).values())


KW = dict(gpus=64, batch=64, seq=2048, tp=8, pp=2, micro_batch=1, sp=True, zero=1, recompute="selective", attention="flash",
          framework="megatron")
OFF = dict(overlap_grad_reduce=False, overlap_param_gather=False, tp_comm_overlap=False)


def test_overlaps_shorten_the_step_and_the_split_says_where():
    on = wattcast.predict_cluster("gpt3_13b", "DGX-H100", **KW)
    off = wattcast.predict_cluster("gpt3_13b", "DGX-H100", **KW, **OFF)
    assert on.parallel.overlap_grad_reduce and on.parallel.tp_comm_overlap and on.parallel.overlap_param_gather
    assert on.step_time_ms < off.step_time_ms
    assert on.exposed_comm_split_ms["tp"] < off.exposed_comm_split_ms["tp"]
    assert on.exposed_comm_split_ms["dp"] <= off.exposed_comm_split_ms["dp"]
    d = on.to_dict()
    assert set(d["exposed_comm_split_ms"]) >= {"tp", "dp", "pp", "cp"}
    assert d["parallel"]["tp_comm_overlap"] is True
    # each class alone never exposes more than all of them together
    assert max(on.exposed_comm_split_ms.values()) <= on.exposed_comm_ms + 1e-9
    # turning one overlap on alone helps, and never beats all three
    tp_only = wattcast.predict_cluster("gpt3_13b", "DGX-H100", **KW, **dict(OFF, tp_comm_overlap=True))
    assert on.step_time_ms <= tp_only.step_time_ms < off.step_time_ms


@pytest.mark.parametrize("kw,msg", [
    (dict(zero=0, overlap_param_gather=True), "needs --zero 1"),
    (dict(sp=False, tp_comm_overlap=True), "needs --tp > 1 and --sp"),
    (dict(framework="hf", overlap_grad_reduce=True), "Megatron-Core option"),
    (dict(overlap_grad_reduce="yes"), "must be true or false"),
    # Megatron-LM's validate_args: "Must use --overlap-param-gather with --overlap-grad-reduce"
    (dict(overlap_grad_reduce=False, overlap_param_gather=True), "--overlap-param-gather needs --overlap-grad-reduce"),
])
def test_overlap_rules(kw, msg):
    with pytest.raises(ParallelConfigError, match=msg):
        wattcast.predict_cluster("gpt3_13b", "DGX-H100", **dict(KW, **kw))


def test_cli_flags_and_json():
    base = ["predict", "--model", "gpt3_13b", "--cluster", "DGX-H100", "--gpus", "64", "--batch", "64", "--seq", "2048",
            "--tp", "8", "--pp", "2", "--micro-batch", "1", "--sp", "--zero", "1", "--attention", "flash", "--dtype", "bf16",
            "--framework", "megatron", "--json"]
    on = run_cli(*base)
    off = run_cli(*base, "--no-overlap-grad-reduce", "--no-overlap-param-gather", "--no-tp-comm-overlap")
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    a, b = json.loads(on.stdout), json.loads(off.stdout)
    assert a["parallel"]["overlap_grad_reduce"] and not b["parallel"]["overlap_grad_reduce"]
    assert a["step_time_ms"] < b["step_time_ms"]
    assert set(a["exposed_comm_split_ms"]) >= {"tp", "dp", "pp", "cp"}
    bad = run_cli(*[x for x in base if x != "--sp"], "--tp-comm-overlap")
    assert bad.returncode == 2 and "needs --tp > 1 and --sp" in bad.stderr


def test_search_cli_takes_the_framework_and_can_turn_the_overlaps_off():
    base = ["search", "--model", "gpt3_xl", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "16", "--seq", "2048",
            "--framework", "megatron", "--max-configs", "12", "--json"]
    on, off = run_cli(*base), run_cli(*base, "--no-overlap")
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    names_on = [r["config"] for r in json.loads(on.stdout)["ranked"]]
    names_off = [r["config"] for r in json.loads(off.stdout)["ranked"]]
    assert any("ogr" in n for n in names_on) and not any("ogr" in n for n in names_off)


def test_moe_all_to_all_overlap_model():
    """--overlap-moe-expert-parallel-comm: each of a layer's all-to-alls runs beside one sub-module of the paired
    micro-batch (Megatron-Core's schedule_layer_1f1b: B's combine backward | A's attention, A's dispatch | B's experts'
    backward, B's dispatch backward | A's experts, A's combine | B's attention backward); what stays exposed is split
    between forward and backward by their all-to-all time."""
    f, b = np.array([4.0, 4.0, 1.0, 0.0, 4.0]), np.array([8.0, 8.0, 2.0, 0.0, 8.0])
    af, ab = np.array([1.0, 0.0, 6.0, 2.0, 4.0]), np.array([2.0, 0.0, 6.0, 2.0, 4.0])
    mf, mb = np.array([2.0, 2.0, 0.5, 0.0, 3.9]), np.array([4.0, 4.0, 1.0, 0.0, 7.8])  # the experts' share
    df, db = af / 2, ab / 2  # dispatch and combine move the same rows
    ef, eb = ep_overlap_layer_ms(f, b, af, ab, num_sms=132, mlp_f_ms=mf, mlp_b_ms=mb, dispatch_f_ms=df, dispatch_b_ms=db)
    share = sm_share(16, 132)
    # every all-to-all shorter than its partner: only the SMs' share of the overlapped 3 ms shows
    assert ef[0] + eb[0] == pytest.approx(share * 3.0) and ef[0] == pytest.approx(eb[0] / 2)
    assert ef[1] == eb[1] == 0.0  # no all-to-all, nothing added
    # 12 ms of all-to-all beside 3 ms of computation: each pair takes its all-to-all's time, 9 more in all
    assert ef[2] + eb[2] == pytest.approx(9.0)
    assert ef[3] + eb[3] == pytest.approx(4.0)  # nothing to hide behind: all exposed
    # 8 ms of all-to-all beside 12 ms: pooled it would hide (share x 8), but the combine backward (2 ms) waits beside
    # A's 0.1 ms of attention and the combine (2 ms) beside B's 0.2 ms of attention backward
    pooled = share * 8.0
    paired = (2.0 - 0.1) + (2.0 - 0.2) + 2 * share * 2.0  # the dispatches hide behind the experts' 3.9 and 7.8 ms
    assert ef[4] + eb[4] == pytest.approx(paired) and paired > pooled + 3.0
    # never more than running them one after the other
    assert np.all(ef + eb <= af + ab + 1e-12)


MOE = {  # a small DeepSeek-V2-Lite-shaped MoE model (64 experts, top-6, 2 shared)
    "model_type": "deepseek_v2", "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16,
    "num_hidden_layers": 4, "intermediate_size": 2816, "moe_intermediate_size": 352, "n_routed_experts": 64,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "kv_lora_rank": 128,
    "q_lora_rank": None, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "vocab_size": 32000,
    "max_position_embeddings": 4096}


def test_moe_all_to_all_overlap_shortens_the_step():
    kw = dict(gpus=32, batch=64, seq=2048, ep=8, micro_batch=1, zero=1, framework="megatron")
    off = wattcast.predict_cluster(MOE, "DGX-H100", **kw)
    on = wattcast.predict_cluster(MOE, "DGX-H100", **kw, overlap_moe_expert_parallel_comm=True)
    assert not off.parallel.overlap_moe_expert_parallel_comm and on.parallel.overlap_moe_expert_parallel_comm
    assert off.exposed_comm_split_ms["ep"] > 0
    assert on.exposed_comm_split_ms["ep"] < off.exposed_comm_split_ms["ep"] and on.step_time_ms < off.step_time_ms
    assert on.to_dict()["parallel"]["overlap_moe_expert_parallel_comm"] is True and "a2a" in on.parallel.describe()
    with pytest.raises(ParallelConfigError, match="needs --ep > 1"):
        wattcast.predict_cluster(MOE, "DGX-H100", **dict(kw, ep=1), overlap_moe_expert_parallel_comm=True)
    with pytest.raises(ParallelConfigError, match="at least 2 micro-batches"):
        wattcast.predict_cluster(MOE, "DGX-H100", **dict(kw, batch=32), overlap_moe_expert_parallel_comm=True)
    with pytest.raises(ParallelConfigError, match="Megatron-Core option"):
        wattcast.predict_cluster(MOE, "DGX-H100", **dict(kw, framework="hf"), overlap_moe_expert_parallel_comm=True)
    # with a pipeline Megatron-Core pairs the micro-batches chunk by chunk: it needs the interleaved schedule
    with pytest.raises(ParallelConfigError, match="needs the interleaved schedule"):
        wattcast.predict_cluster("deepseek_v3", "DGX-H100", gpus=256, batch=512, seq=1024, pp=4, ep=64, micro_batch=1,
                                 zero=1, framework="megatron", overlap_moe_expert_parallel_comm=True)
    r = run_cli("predict", "--model", "deepseek_v3", "--cluster", "DGX-H100", "--gpus", "256", "--batch", "512",
                "--seq", "1024", "--pp", "4", "--interleave", "2", "--ep", "64", "--micro-batch", "1", "--zero", "1",
                "--framework", "megatron", "--overlap-moe-expert-parallel-comm", "--allow-oom", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["parallel"]["overlap_moe_expert_parallel_comm"] is True and d["parallel"]["name"].endswith("+a2a")


def test_zero3_gathers_unit_by_unit_and_not_after_the_step():
    """FSDP / ZeRO-3 gathers and reduce-scatters one wrapped block at a time in the forward and backward: a chunk of
    L blocks pays L collectives of a block's bytes (each with its latency, which grows with the group), one block's
    worth per pass waits for nothing, and nothing is gathered after the optimizer step (that is ZeRO-1/2's)."""
    from wattcast.data.cluster_spec import resolve_cluster
    from wattcast.simulate.distributed import _dp_times, collective_model
    from wattcast.simulate.parallel import ParallelConfig, layouts

    cl, cm = resolve_cluster("DGX-A100"), collective_model()
    params = np.array([7e8])

    def times(gpus, zero, units):
        par = ParallelConfig(gpus=gpus, dp=gpus, zero=zero, micro_batch=1)
        return _dp_times(par, layouts(par, cl), cl, cm, params, np.zeros(1), 2.0, 2.0, 1, 1, np.array([units]))

    one, per_block = times(128, 3, 1), times(128, 3, 24)
    assert per_block["z3_first_f_ms"][0] == pytest.approx(per_block["z3_f_ms"][0] / 24)
    assert per_block["z3_f_ms"][0] > 2 * one["z3_f_ms"][0]  # 24 x the latency of a 127-step ring
    assert per_block["z3_b_ms"][0] == pytest.approx(2 * per_block["z3_f_ms"][0], rel=0.01)  # gather + reduce-scatter
    assert per_block["gather_after_ms"][0] == 0.0
    assert times(128, 1, 24)["gather_after_ms"][0] > 0.0  # ZeRO-1 gathers the updated shards after the step
    # more ranks, more ring steps: the per-block collectives grow with the group
    assert times(128, 3, 24)["z3_f_ms"][0] > times(16, 3, 24)["z3_f_ms"][0]


def test_megatron_core_buckets_only_the_first_stages_first_chunk():
    """Megatron-Core's DistributedDataParallel splits the gradients into buckets on the first pipeline stage's first
    model chunk only ("Turn off bucketing if we are on a pipeline stage that is not the first", and Megatron-LM's
    disable_bucketing for chunks after the first): every other chunk reduces as one message. Other frameworks bucket
    every chunk."""
    from wattcast.data.cluster_spec import resolve_cluster
    from wattcast.simulate.distributed import _dp_times, collective_model
    from wattcast.simulate.parallel import ParallelConfig, layouts

    cl, cm = resolve_cluster("DGX-H100"), collective_model()
    par = ParallelConfig(gpus=64, tp=1, pp=2, dp=32, zero=1, interleave=2, micro_batch=1, overlap_grad_reduce=True)
    params = np.full(4, 2e8)  # chunks (v, stage): (0, 0), (0, 1), (1, 0), (1, 1)

    def counts(first_only):
        t = _dp_times(par, layouts(par, cl), cl, cm, params, np.zeros(4), 4.0, 2.0, 2, 2, np.ones(4, dtype=int),
                      40e6, bucketed_first_chunk_only=first_only)
        return [len(x) for x in t["bucket_ms"]], t["sync_ms"]

    (mc, mc_ms), (pt, pt_ms) = counts(True), counts(False)
    assert mc == [5, 1, 1, 1] and pt == [5, 5, 5, 5]
    # one message of the whole chunk: one ring's latency instead of five
    assert mc_ms[0] == pytest.approx(pt_ms[0]) and np.all(mc_ms[1:] < pt_ms[1:])


def test_megatron_core_buckets_grow_with_the_data_parallel_group():
    """Megatron-Core's DDP buckets: max(40M, 1M x dp) parameters with --overlap-grad-reduce, one bucket without; other
    frameworks keep PyTorch DDP's 25 MB. At a large DP size 25 MB buckets would pay a ring's latency per bucket
    (Llama 3 8B, ZeRO-1, 2,048 H100s: 19.8 s exposed)."""
    from dataclasses import replace

    from wattcast.simulate.distributed import dp_bucket_params
    from wattcast.simulate.parallel import ParallelConfig

    par = ParallelConfig(gpus=2048, tp=1, pp=1, dp=2048, zero=1, overlap_grad_reduce=True)
    assert dp_bucket_params("megatron", par, 2048, 4.0) == 2048e6
    assert dp_bucket_params("megatron", par, 8, 4.0) == 40e6
    assert dp_bucket_params("megatron", replace(par, overlap_grad_reduce=False), 2048, 4.0) == float("inf")
    assert dp_bucket_params("hf", replace(par, overlap_grad_reduce=False), 2048, 4.0) == 25e6 / 4.0
    from wattcast import predict_cluster

    steps = [predict_cluster("llama3_8b", "DGX-H100", gpus=n, batch=n, seq=4096, tp=1, zero=1, micro_batch=1,
                             recompute="full", framework="megatron") for n in (64, 2048)]
    assert steps[1].exposed_comm_ms < 0.2 * steps[1].step_time_ms
    assert steps[1].step_time_ms < 1.25 * steps[0].step_time_ms


def test_moe_overlap_leaves_the_unpaired_micro_batches_exposed():
    """Megatron-Core's batch-level overlap merges one micro-batch's forward with another's backward: the first forward
    and the last backward (a pipeline stage's warm-up and cool-down) have no partner, so their all-to-alls stay exposed:
    with 2 micro-batches half the tasks, with 8 an eighth."""
    def ep_per_micro(batch):
        kw = dict(gpus=32, batch=batch, seq=2048, ep=8, micro_batch=1, zero=1, framework="megatron")
        on = wattcast.predict_cluster(MOE, "DGX-H100", **kw, overlap_moe_expert_parallel_comm=True)
        off = wattcast.predict_cluster(MOE, "DGX-H100", **kw)
        n = on.meta["n_micro"]
        return on.exposed_comm_split_ms["ep"] / n, off.exposed_comm_split_ms["ep"] / n

    on2, off2 = ep_per_micro(64)
    on8, off8 = ep_per_micro(256)
    assert off2 == pytest.approx(off8, rel=0.05)  # without the overlap every micro-batch exposes the same
    assert on8 < on2 < off2


def _toy_interleaved(v: int, **kw):
    """GPT-2 on 2 stages x 2 data-parallel replicas, 4 micro-batches, Megatron-Core with --overlap-grad-reduce."""
    par = ParallelConfig(gpus=4, tp=1, pp=2, dp=2, micro_batch=1, interleave=v, overlap_grad_reduce=True,
                                  overlap_param_gather=False, tp_comm_overlap=False, **kw)
    # an NVSwitch node (the 4-GPU NVLink board is a mesh: a DP pair there shares one 100 GB/s link, too slow to hide)
    return predict_distributed("gpt2", "dgx-a100", gpus=4, batch=8, seq=1024, parallel=par,
                                        framework="megatron", trace=True, comm_split=True)


def test_interleaved_grad_reduce_starts_at_each_chunks_last_backward():
    """Megatron-Core's interleaved schedule launches a model chunk's gradient reduction when that chunk's last
    backward is done (per-chunk grad buffers; align_grad_reduce): chunk 1's buckets run while the stage is still busy
    with chunk 0's backwards and are hidden, chunk 0's follow the stage's final backward and are exposed. Until then
    every chunk's buckets were spread over the stage's final backward. Without interleaving nothing changes: the buckets
    are ready as the last backward produces them."""
    eps = 1e-9
    p = _toy_interleaved(2, zero=0)
    ev = p.events
    critical = {}
    for s in range(2):
        bw = [e for e in ev if e["stage"] == s and e["stream"] == "compute" and e["name"].startswith("B")]
        final = max(bw, key=lambda e: e["end_ms"])
        c1_last = max(e["end_ms"] for e in bw if e["name"].endswith(".c1"))
        dp = [e for e in ev if e["stage"] == s and e["stream"] == "comm" and e["name"].startswith("dp.all_reduce")]
        assert min(e["end_ms"] for e in dp) <= final["start_ms"] + eps  # some reduction is done before the final backward
        c1 = [e for e in dp if e["name"].endswith(".c1")]
        c0 = [e for e in dp if e["name"].endswith(".c0")]
        assert c1 and c0 and len(c1) + len(c0) == len(dp)
        assert min(e["start_ms"] for e in c1) >= c1_last - eps  # ready at chunk 1's own last backward ...
        assert max(e["end_ms"] for e in c1) <= final["start_ms"] + eps  # ... and done before the final one: hidden
        assert min(e["start_ms"] for e in c0) >= final["end_ms"] - eps  # chunk 0's after the final backward
        critical[s] = sum(e["end_ms"] - e["start_ms"] for e in c0)
    # what the DP reduction adds to the step: chunk 0's buckets on the stage that ends last (stage 0)
    assert p.exposed_comm_split_ms["dp"] == pytest.approx(critical[0], rel=1e-6)
    # no interleaving: the first stage's buckets are ready one by one during its last backward; a later stage's
    # gradients are one message after it (Megatron-Core buckets the first stage's first chunk only)
    p1 = _toy_interleaved(1, zero=0)
    for s in range(2):
        bw = [e for e in p1.events if e["stage"] == s and e["stream"] == "compute" and e["name"].startswith("B")]
        final = max(bw, key=lambda e: e["end_ms"])
        dp = [e for e in p1.events if e["stage"] == s and e["stream"] == "comm" and e["name"].startswith("dp.")]
        assert dp and all(e["name"].endswith("]") for e in dp)
        if s == 0:
            assert len(dp) > 1 and min(e["start_ms"] for e in dp) < final["end_ms"]
        else:
            assert len(dp) == 1 and dp[0]["start_ms"] >= final["end_ms"] - eps
        assert all(e["start_ms"] >= final["start_ms"] - eps for e in dp)


def test_interleaved_param_gather_waits_for_chunk_0_and_hides_the_rest():
    """--overlap-param-gather under interleaving (Megatron-Core's align_param_gather): the chunks' all-gathers queue on
    the data-parallel stream from the step's start; chunk 0's first forward waits for the whole of chunk 0's, chunk c's
    for chunks 0..c; the rest runs beside the computation (NCCL's SMs taken from it)."""
    from wattcast.simulate.distributed import interleaved_param_gather_ms

    share = 0.125
    ff = np.array([[0.0, 10.0], [2.0, 12.0]])  # stage 1's first forwards come 2 ms later: only the lead counts
    # chunk 1's gather ends (3 + 2 = 5 ms) before its first forward (3 + 10 ms): chunk 0's 3 ms wait, 2 ms hidden
    got = interleaved_param_gather_ms(np.array([[3.0, 2.0], [3.0, 2.0]]), ff, share)
    np.testing.assert_allclose(got, [3.0 + share * 2.0] * 2)
    # chunk 1's gather outlasts its lead: the stage waits until it is done (3 + 12 - 10 = 5 ms late), 10 ms beside
    got = interleaved_param_gather_ms(np.array([[3.0, 12.0]]), ff[:1], share)
    np.testing.assert_allclose(got, [5.0 + share * 10.0])
    # every stage dispatches at the step's start: stage 1 gathers during its 2 ms warm-up wait too, so its 3 ms chunk 0
    # makes it 1 ms late, not 3 (it was charged from its own first forward on); the first stage's 1 ms carries over
    got = interleaved_param_gather_ms(np.array([[1.0, 1.0], [3.0, 2.0]]), ff, share)
    np.testing.assert_allclose(got, [1.0 + share * 1.0, 1.0 + share * 4.0])
    # through the step (ZeRO-1): overlapped, the gather costs less than after the step, and some of it is still exposed
    par = dict(gpus=4, tp=1, pp=2, dp=2, micro_batch=1, interleave=2, zero=1, overlap_grad_reduce=True,
               tp_comm_overlap=False)
    step = {opg: predict_distributed("gpt2", "nvlink-4gpu", gpus=4, batch=8, seq=1024, framework="megatron",
                                              parallel=ParallelConfig(**par, overlap_param_gather=opg),
                                              comm_split=True) for opg in (False, True)}
    assert step[True].step_time_ms < step[False].step_time_ms
    assert step[True].exposed_comm_split_ms["dp"] > step[False].exposed_comm_split_ms["dp"] - step[False].comm[
        "dp_param_gather_ms"]


def test_later_stages_gather_their_parameters_in_one_piece_during_the_warm_up():
    """One model chunk a stage, --overlap-param-gather: the first stage gathers bucket by bucket (the first waited for,
    the rest beside its first forward); under Megatron-Core's bucketing a later stage gathers in one piece, from the
    step's start, and waits only for what outlasts its warm-up, but at least the first stage's delay."""
    from wattcast.simulate.distributed import param_gather_ms

    share, f, g, nb = 0.125, np.array([10.0, 10.0, 10.0]), np.array([8.0, 8.0, 30.0]), np.array([4.0, 4.0, 4.0])
    bucketed = param_gather_ms(f, g, nb, share)
    np.testing.assert_allclose(bucketed, [2.0 + share * 6.0] * 2 + [30.0 - 10.0])
    ff = np.array([0.0, 12.0, 24.0])  # the stages' first forwards in the step
    one_piece = param_gather_ms(f, g, nb, share, first_forward_ms=ff)
    np.testing.assert_allclose(one_piece, [bucketed[0], bucketed[0], 30.0 - 24.0])


def test_chunk_reductions_queue_in_the_order_their_chunks_finish():
    """chunk_reduce_spans_ms: chunk v-1's reduction first, each from its ready time or when the stream frees up; a chunk
    without buckets takes no time and holds nothing up."""
    from wattcast.simulate.distributed import chunk_reduce_spans_ms

    ms = np.array([[2.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    ready = np.array([[10.0, 6.0, 5.0], [10.0, 6.0, 5.0]])
    start, end = chunk_reduce_spans_ms(ms, ready)
    # stage 0: chunk 2 at 5-6, chunk 1 at 6-9, chunk 0 at 10-12; stage 1: chunk 1 has none
    np.testing.assert_allclose(start[0], [10.0, 6.0, 5.0])
    np.testing.assert_allclose(end[0], [12.0, 9.0, 6.0])
    np.testing.assert_allclose(start[1, [0, 2]], [10.0, 5.0])
    np.testing.assert_allclose(end[1, [0, 2]], [12.0, 6.0])
    # a long chunk 2 pushes the others back
    start, end = chunk_reduce_spans_ms(np.array([[2.0, 3.0, 8.0]]), ready[:1])
    np.testing.assert_allclose(end[0], [18.0, 16.0, 13.0])


def test_megatron_deepspeed_reduces_in_deepspeeds_buckets():
    """DeepSpeed's engine reduces gradients in 5e8-element buckets (reduce_bucket_size / allreduce_bucket_size
    defaults), not PyTorch DDP's 25 MB: GPT-3 2.7B with ZeRO-1 on 2,048 A100s was 2.6 s a step against 0.55 s without
    ZeRO (216 buckets, each paying a 2,047-step ring's latency)."""
    import wattcast
    from wattcast.simulate.distributed import dp_bucket_params
    from wattcast.simulate.parallel import ParallelConfig

    assert dp_bucket_params("megatron-deepspeed", ParallelConfig(gpus=8, dp=8, zero=1), 8, 2.0) == 5e8
    assert dp_bucket_params("hf", ParallelConfig(gpus=8, dp=8), 8, 4.0) == 25e6 / 4.0  # DDP's 25 MB
    kw = dict(gpus=2048, batch=4096, seq=2048, tp=1, pp=1, micro_batch=2, framework="megatron-deepspeed")
    z0, z1 = (wattcast.predict_cluster("gpt3_2.7b", "DGX-A100", zero=z, **kw) for z in (0, 1))
    assert z1.step_time_ms < 1.2 * z0.step_time_ms
    assert z1.to_dict()["comm"]["dp_sync_ms"] < 200.0


def test_param_gather_overlap_needs_the_grad_reduce_overlap_on_predict_and_search():
    """Megatron-LM refuses --overlap-param-gather without --overlap-grad-reduce (megatron/training/arguments.py
    validate_args); it was accepted and costed. Turning the grad-reduce overlap off alone takes the param-gather
    overlap's default with it (the step is unchanged: with one bucket there was nothing to hide)."""
    base = ["predict", "--model", "gpt3_xl", "--cluster", "DGX-H100", "--gpus", "16", "--batch", "32", "--seq", "2048",
            "--zero", "1", "--micro-batch", "1", "--framework", "megatron", "--json"]
    bad = run_cli(*base, "--no-overlap-grad-reduce", "--overlap-param-gather")
    assert bad.returncode == 2 and "--overlap-param-gather needs --overlap-grad-reduce" in bad.stderr
    alone = run_cli(*base, "--no-overlap-grad-reduce")
    assert alone.returncode == 0, alone.stderr
    p = json.loads(alone.stdout)["parallel"]
    assert p["overlap_grad_reduce"] is False and p["overlap_param_gather"] is False
    # a search given the pair skips every candidate as invalid instead of costing it or crashing
    res = wattcast.search("gpt3_xl", "DGX-H100", 8, 16, 2048, framework="megatron", max_configs=12, zero=[1],
                          overlaps=dict(overlap_grad_reduce=False, overlap_param_gather=True))
    assert len(res.ranked) == 0
    assert len(res.rejected) > 0
    assert res.rejected["rule"].str.contains("--overlap-param-gather needs --overlap-grad-reduce", regex=False).any()


GPT_PP = {"model_type": "gpt2", "n_embd": 4096, "n_head": 32, "n_layer": 8, "n_positions": 2048, "vocab_size": 51200,
          "activation_function": "gelu"}


def test_blocking_interleaved_transfers_cost_v_times_the_1f1b_ones():
    """Megatron-LM 2021's interleaved schedule (SC21's runs) waited on every transfer (overlap_p2p_comm off): with v
    chunks a micro-batch crosses v times as many stage boundaries, so the exposed pipeline transfers grow with v
    (SC21 Sec. 2.2.2); Megatron-Core's default overlaps them. Until stop 42 interleaving always overlapped them, so
    SC21's interleaved runs came out with fewer exposed transfers than their 1F1B ones (the 1T model: 0.95 s vs 2.69 s)."""
    kw = dict(gpus=16, tp=8, pp=2, batch=32, seq=2048, micro_batch=1, recompute="full", framework="megatron",
              overlap_grad_reduce=False, overlap_param_gather=False)
    one = wattcast.predict_cluster(GPT_PP, "DGX-A100", **kw, interleave=1)
    blocking = wattcast.predict_cluster(GPT_PP, "DGX-A100", **kw, interleave=2, overlap_p2p_comm=False)
    overlapped = wattcast.predict_cluster(GPT_PP, "DGX-A100", **kw, interleave=2)
    assert overlapped.parallel.overlap_p2p_comm is True and blocking.parallel.overlap_p2p_comm is False  # the default: on
    assert blocking.to_dict()["parallel"]["overlap_p2p_comm"] is False  # reported in --json beside the other overlaps
    pp = {k: r.exposed_comm_split_ms["pp"] for k, r in (("one", one), ("blocking", blocking), ("overlapped", overlapped))}
    assert pp["one"] > 0
    assert pp["blocking"] > 1.5 * pp["one"]  # ~2x the transfers on the critical path
    assert pp["overlapped"] < pp["blocking"] and overlapped.step_time_ms < blocking.step_time_ms
    # 1F1B's transfers block whatever the flag (Megatron-LM's send_forward_recv_backward): since stop 46 the flag is
    # refused there rather than ignored
    for given in (True, False):
        with pytest.raises(ParallelConfigError, match="needs --interleave 2 or more"):
            wattcast.predict_cluster(GPT_PP, "DGX-A100", **kw, interleave=1, overlap_p2p_comm=given)
    with pytest.raises(ParallelConfigError, match="Megatron-Core option"):
        wattcast.predict_cluster(GPT_PP, "DGX-A100", **dict(kw, framework="hf", overlap_grad_reduce=None,
                                                             overlap_param_gather=None), interleave=2,
                                 overlap_p2p_comm=True)


def test_column_parallel_backward_collectives_run_beside_the_wgrad_and_dgrad_gemms():
    """TE 2.20.2 layernorm_linear.py l. 787-790 / 904-910 / 1125-1130 (and Megatron-Core's local layers): the dgrad
    collective beside the module's wgrad GEMM, the SP input all-gather beside its dgrad GEMM; the row-parallel
    layer's output-gradient all-gather is waited for before its dgrad, so it stays exposed."""
    from wattcast.simulate.overlap import NCCL_SMS, async_tp_backward_save_ms
    rows = [  # name, phase, op_class, group, layer, ms
        ("mlp.exit.reduce_scatter.grad", "backward", "collective", "tp", 1, 0.2),
        ("mlp.fc2.dgrad", "backward", "linear", "", 1, 1.0),
        ("mlp.fc2.wgrad", "backward", "linear", "", 1, 1.0),
        ("mlp.act.grad", "backward", "elementwise", "", 1, 0.1),
        ("mlp.fc1.input_all_gather", "backward", "collective", "tp", 1, 0.3),
        ("mlp.fc1.dgrad", "backward", "linear", "", 1, 2.0),
        ("mlp.fc1.wgrad", "backward", "linear", "", 1, 0.5),
        ("mlp.enter.all_gather.grad", "backward", "collective", "tp", 1, 0.8),  # longer than its wgrad
        ("norm.grad", "backward", "layernorm", "", 1, 0.1),
        ("mlp.fc1.dgrad", "backward", "linear", "", 2, 0.1),  # another layer's same-named GEMM: not the partner
        ("attn.enter.grad", "forward", "collective", "tp", 1, 0.4),  # forward: never hidden here
    ]
    n, ph, oc, grp, lay, t = map(np.array, zip(*rows))
    save = async_tp_backward_save_ms(n, ph, oc, grp, lay, t.astype(float), num_sms=132)
    share = NCCL_SMS / 132
    assert save[0] == 0.0 and save[-1] == 0.0  # row-parallel gradient all-gather; forward collective
    assert save[4] == pytest.approx(0.3 - share * 0.3)  # all of it beside fc1's 2 ms dgrad, less the SMs it takes
    # 0.8 ms beside a 0.5 ms wgrad (slowed by the SMs taken, still done first): 0.3 ms exposed
    assert save[7] == pytest.approx(0.5)
    assert save[[1, 2, 3, 5, 6, 8, 9]].sum() == 0.0
    # no wgrad before it (nothing to hide behind): fully exposed
    assert async_tp_backward_save_ms(n[7:8], ph[7:8], oc[7:8], grp[7:8], lay[7:8], t[7:8].astype(float),
                                     num_sms=132)[0] == 0.0
    # a host-bound collective (its floor): the GEMM is issued once the call returns; only what lies above is hidden
    floored = async_tp_backward_save_ms(n, ph, oc, grp, lay, t.astype(float), num_sms=132, host_floor_ms=0.25)
    assert floored[4] == pytest.approx(0.05 - share * 0.05)
    assert floored[7] == pytest.approx(0.5 + 0.55 - max(0.5 * (1 + share), 0.55))
    assert async_tp_backward_save_ms(n, ph, oc, grp, lay, t.astype(float), num_sms=132, host_floor_ms=1.0).sum() == 0.0


def test_megatron_hides_backward_tp_collectives_without_tp_comm_overlap(monkeypatch):
    """Without --tp-comm-overlap Megatron-Core still starts the dgrad collectives asynchronously: the exposed TP time
    and the step are below what the graph's backward TP collectives cost in series."""
    import wattcast.simulate.distributed as dist
    kw = dict(gpus=2, batch=8, seq=1024, framework="megatron",
              parallel=ParallelConfig(gpus=2, tp=2, micro_batch=1, tp_comm_overlap=False))
    on = predict_distributed("gpt2", "DGX-H100", **kw)
    monkeypatch.setattr(dist, "async_tp_backward_save_ms", lambda names, *a, **k: np.zeros(len(names)))
    dist._COSTED.clear()
    series = predict_distributed("gpt2", "DGX-H100", **kw)
    dist._COSTED.clear()
    assert on.exposed_comm_split_ms["tp"] < series.exposed_comm_split_ms["tp"] - 0.05
    assert on.step_time_ms < series.step_time_ms


def test_megatron_core_ddp_last_bucket_is_the_embeddings():
    """Megatron-Core's _ParamAndGradBuffer fills buckets walking the parameters backwards and closes one at >= the
    bucket size (megatron-core 0.16.1 param_and_grad_buffer.py l. 711-743): the embedding, the first parameter, is in
    the bucketed chunk's last bucket, reduced as the backward ends; the others before it."""
    from wattcast.data.cluster_spec import resolve_cluster
    from wattcast.simulate.distributed import _dp_times, collective_model, mcore_ddp_bucket_numels
    from wattcast.simulate.parallel import ParallelConfig, layouts

    cl, cm = resolve_cluster("DGX-H100"), collective_model()
    par = ParallelConfig(gpus=64, tp=1, pp=2, dp=32, zero=1, micro_batch=1, overlap_grad_reduce=True)
    params = np.array([4e8, 3e8])  # stage 0 with a 100M-parameter embedding and 300M in 30M parameters
    bk = mcore_ddp_bucket_numels([1e8] + [3e7] * 10, 40e6)
    assert list(bk) == [6e7] * 5 + [1e8]  # pairs of 30M close at 60M; the embedding alone after the last pair
    t = _dp_times(par, layouts(par, cl), cl, cm, params, np.zeros(2), 4.0, 2.0, 2, 1, np.ones(2, dtype=int), 40e6,
                  bucketed_first_chunk_only=True, last_bucket_chunk=np.array([bk[-1], 0.0]), ddp_buckets_chunk={0: bk})
    b0 = t["bucket_ms"][0]
    assert len(b0) == 6 and np.allclose(b0[:-1], b0[0]) and b0[-1] > 1.2 * b0[0]  # 100M against 60M
    assert len(t["bucket_ms"][1]) == 1  # later stages: one message, as before
    # stop 48: the distributed optimizer gathers the parameters bucket by bucket (param_and_grad_buffer.py
    # l. 250-290): the first forward waits for the last bucket's own all-gather; the chunk's gather pays each
    # bucket's latency
    one = _dp_times(par, layouts(par, cl), cl, cm, params, np.zeros(2), 4.0, 2.0, 2, 1, np.ones(2, dtype=int), 40e6,
                    bucketed_first_chunk_only=True)
    assert t["gather_last_ms"][0] > 0 and t["gather_last_ms"][1] == 0
    assert t["gather_after_ms"][0] > one["gather_after_ms"][0] > t["gather_last_ms"][0]
    assert t["gather_after_ms"][1] == one["gather_after_ms"][1]


def test_megatron_core_ddp_buckets_walk_as_the_source():
    """Stop 48: the last bucket is the embedding plus what the bucket before it left open (not max(embedding, bucket
    size)); a shared embedding under the distributed optimizer closes that bucket and gets one of its own
    (param_and_grad_buffer.py l. 698-736); the distributed optimizer pads parameter starts to 64 elements and bucket
    ends to lcm(dp, 128) (l. 638-665)."""
    from wattcast.simulate.distributed import mcore_ddp_bucket_numels
    seq = [12800.0, 3840.0, 3840.0, 3840.0]  # embedding, then three parameters (multiples of 128)
    assert list(mcore_ddp_bucket_numels(seq, 6400)) == [7680.0, 16640.0]  # the embedding + the 3840 left open
    shared = [True, False, False, False]
    assert list(mcore_ddp_bucket_numels(seq, 6400, own_bucket=shared, dist_opt=True)) == [7680.0, 3840.0, 12800.0]
    # without the distributed optimizer a shared embedding is bucketed like any parameter (l. 707-708)
    assert list(mcore_ddp_bucket_numels(seq, 6400, own_bucket=shared)) == [7680.0, 16640.0]
    assert list(mcore_ddp_bucket_numels(seq, np.inf)) == [sum(seq)]  # no bucket size: one bucket
    # padding: a 100-element parameter starts at 64 after a 10-element one; the bucket ends at lcm(3, 128) = 384
    assert list(mcore_ddp_bucket_numels([100.0, 10.0], np.inf, dist_opt=True, dp=3)) == [384.0]


def test_dense_param_sequence_registers_the_output_projection_first():
    """Megatron-Core registers an attention's linear_proj before linear_qkv (attention.py l. 349, 1267), the input norm
    inside linear_qkv with Transformer Engine: a layer's parameters in named_parameters order."""
    from wattcast.simulate.distributed import dense_param_sequence
    names = ["input_layernorm", "self_attention.linear_qkv", "self_attention.linear_proj", "pre_mlp_layernorm",
             "mlp.linear_fc1", "mlp.linear_fc2"]
    got = dense_param_sequence(np.array(names), np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    assert list(got) == [3.0, 1.0, 2.0, 4.0, 5.0, 6.0]


def test_dense_param_sequence_knows_the_output_projection_by_role_not_by_one_name():
    """Review of stop 48: every Megatron-Core attention registers linear_proj first, whatever the graph calls it. A GPT
    layer's attn.c_proj goes before ln_1 (fused into linear_qkv with TE); multi-head latent attention (DeepSeek) keeps
    its input norm a TENorm built before the attention (gpt_layer_specs.py l. 248, transformer_layer.py l. 287 vs
    304), so o_proj goes right after it, and MLASelfAttention builds the query path before the key-value one
    (multi_latent_attention.py l. 393-483). Until then only names ending in linear_proj moved."""
    from wattcast.simulate.distributed import dense_param_sequence
    gpt = ["ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"]
    assert list(dense_param_sequence(np.array(gpt), np.arange(1.0, 7.0))) == [3.0, 1.0, 2.0, 4.0, 5.0, 6.0]
    mla = ["input_layernorm", "self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.q_a_layernorm.weight",
           "self_attn.q_b_proj", "self_attn.kv_a_layernorm.weight", "self_attn.kv_b_proj", "self_attn.o_proj",
           "post_attention_layernorm", "mlp.linear_fc1", "mlp.linear_fc2"]
    got = dense_param_sequence(np.array(mla), np.arange(1.0, 12.0))
    assert list(got) == [1.0, 8.0, 2.0, 4.0, 5.0, 3.0, 6.0, 7.0, 9.0, 10.0, 11.0]
    # a multi-token-prediction block after the head (same layer): its o_proj stays in its own block
    mtp = ["norm", "lm_head", "enorm", "hnorm", "eh_proj"] + mla
    got = dense_param_sequence(np.array(mtp), np.arange(1.0, 17.0))
    assert list(got) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 13.0, 7.0, 9.0, 10.0, 8.0, 11.0, 12.0, 14.0, 15.0, 16.0]
    # without q_lora_rank the query path is one q_proj
    q1 = ["input_layernorm", "self_attn.kv_a_proj_with_mqa", "self_attn.q_proj", "self_attn.kv_a_layernorm.weight",
          "self_attn.kv_b_proj", "self_attn.o_proj"]
    assert list(dense_param_sequence(np.array(q1), np.arange(1.0, 7.0))) == [1.0, 6.0, 3.0, 2.0, 4.0, 5.0]
    # the MLP's row-parallel projection is not the attention's
    assert list(dense_param_sequence(np.array(["mlp.c_fc", "mlp.c_proj"]), np.array([1.0, 2.0]))) == [1.0, 2.0]


def test_llama3_8b_last_ddp_bucket_holds_the_first_layers_attention(monkeypatch):
    """Llama 3 8B, 16 H100, TP2 PP4 DP2, distributed optimizer, 40M buckets: the first stage's last gradient bucket
    is the 262.7M embedding and the first layer's attention projections and norms left open by the bucket before it
    (21.0M; padded: 283.648M), not the embedding alone (until stop 48: max(embedding, bucket size) = 262.668M). GPT-3
    175B (tied embedding) on 1,024 A100s, TP8 PP16 v2: the word embedding's own 78.6M bucket, its learned position
    embedding, the first layer's input norm and attention output projection (attn.c_proj registered before
    linear_qkv) the 44.1M bucket before (until stop 48 both, 103.8M; until the stop 48 review c_proj stayed after
    c_attn: 25.2M)."""
    import wattcast.simulate.distributed as dist
    seen = {}
    orig = dist._dp_times

    def spy(*a, **k):
        seen.update(k)
        return orig(*a, **k)

    monkeypatch.setattr(dist, "_dp_times", spy)
    wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=16, batch=32, seq=8192, tp=2, pp=4, sp=True,
                             micro_batch=1, framework="megatron", zero=1, overlap_grad_reduce=True,
                             overlap_param_gather=True)
    last = float(seen["last_bucket_chunk"][0])
    assert last == 283648000.0  # 262,668,288 + 20,979,712 (qkv, proj, norm), padded to 128
    assert len(seen["ddp_buckets_chunk"][0]) == 16
    wattcast.predict_cluster("gpt3_175b", "DGX-A100", gpus=1024, batch=1536, seq=2048, tp=8, pp=16, interleave=2,
                             sp=True, micro_batch=1, framework="megatron", zero=1, overlap_grad_reduce=True,
                             overlap_param_gather=True)
    bk = seen["ddp_buckets_chunk"][0]
    assert list(bk[-3:]) == [56652288.0, 44077056.0, 78643200.0]  # ln_2 + c_attn; ln_1 + c_proj + wpe


def test_a_bias_gradient_does_not_cut_the_dgrad_collective_from_its_wgrad():
    """Stop 47 review: a biased linear's ``.bgrad`` row (a reduction between its wgrad and the module's entry
    gradient) stays in the run: the collective is hidden behind the wgrad as in an unbiased model."""
    from wattcast.simulate.overlap import async_tp_backward_save_ms
    rows = [("mlp.fc1.dgrad", "backward", "linear", "", 1, 2.0),
            ("mlp.fc1.wgrad", "backward", "linear", "", 1, 0.5),
            ("mlp.fc1.bgrad", "backward", "reduction", "", 1, 0.05),
            ("mlp.enter.all_gather.grad", "backward", "collective", "tp", 1, 0.8)]
    n, ph, oc, grp, lay, t = map(np.array, zip(*rows))
    save = async_tp_backward_save_ms(n, ph, oc, grp, lay, t.astype(float), num_sms=132)
    no_bias = [0, 1, 3]
    save_nb = async_tp_backward_save_ms(n[no_bias], ph[no_bias], oc[no_bias], grp[no_bias], lay[no_bias],
                                        t[no_bias].astype(float), num_sms=132)
    assert save[3] == pytest.approx(0.5) and save[3] == pytest.approx(save_nb[2])


def test_grad_reduce_overlap_loses_only_the_extra_buckets_ring_latency():
    """Issue 15: ``--overlap-grad-reduce`` predicts a slower step than without it in data-parallel-heavy steps with a
    short backward (stop 51's audit grid: 134 of 585, up to +20.5%). Audited against megatron-core 0.16.1, nothing in
    the model contradicts the source; the loss is the buckets' own collectives:

    - with the overlap Megatron-Core cuts the gradient buffer into max(40M, 1M x dp) parameter buckets
      (distributed_data_parallel.py l. 64-65), without it one bucket (l. 66-68: bucket_size None); every bucket group
      is its own reduce-scatter (param_and_grad_buffer.py l. 433-448) and, under the distributed optimizer, its own
      parameter all-gather after the step (l. 250-290, distrib_optimizer.py l. 2617-2619 without
      --overlap-param-gather);
    - the buckets are launched only in the last micro-batch's backward (schedules.py l. 634-675: the others run under
      no_sync; register_grad_ready l. 552-561), on one NCCL stream, one after the other;
    - a ring reduce-scatter / all-gather over dp ranks pays (dp - 1) latency steps whatever its size.

    So the overlap adds (buckets - 1) ring latencies to each of the two, and hides at most the last backward: here (Llama
    2 7B, TP2, DP 128 on DGX B200s, 2 micro-batches of 512 tokens) 22 x 0.635 ms = 14.0 ms each against an 8.8 ms last
    backward: 130.5 ms without the overlap, 150.1 ms with it, 144.5 ms with --overlap-param-gather too. With links of no latency bucketing costs nothing and the
    overlap never lengthens the step: a term charged on top of that (buckets counted per micro-batch, the SMs' share
    charged on exposed communication, a bucketed sync without the overlap) would fail here."""
    from dataclasses import replace

    from wattcast.data.cluster_spec import resolve_cluster

    b200 = resolve_cluster("DGX-B200")  # outside the learned collective correction's support: alpha-beta only
    free = replace(b200, intra=replace(b200.intra, latency_us=0.0), inter=replace(b200.inter, latency_us=0.0))
    kw = dict(gpus=256, batch=256, seq=512, tp=2, sp=True, zero=1, micro_batch=1, framework="megatron",
              tp_comm_overlap=False, trace=True)

    def runs(cl):
        return {(ogr, opg): wattcast.predict_cluster("llama2_7b", cl, **kw, overlap_grad_reduce=ogr,
                                                     overlap_param_gather=opg)
                for ogr, opg in ((False, False), (True, False), (True, True))}

    def reduce_scatters(p):
        return [e for e in p.events if e["stage"] == 0 and e["name"].startswith("dp.reduce_scatter[")]

    lat, nolat = runs(b200), runs(free)
    off, on = lat[False, False], lat[True, False]
    n_b = len(reduce_scatters(on))
    assert len(reduce_scatters(off)) == 1 and n_b == 23  # 3.37B parameters a rank (TP2) in buckets of >= 128M (DP 128)
    dp = off.parallel.dp
    ring_ms = (dp - 1) * b200.inter.latency_us / 1e3  # a reduce-scatter's / all-gather's latency over 16 nodes
    extra = (n_b - 1) * ring_ms
    assert on.comm["dp_sync_ms"] - off.comm["dp_sync_ms"] == pytest.approx(extra, rel=1e-3)
    assert on.comm["dp_param_gather_ms"] - off.comm["dp_param_gather_ms"] == pytest.approx(extra, rel=1e-3)
    # the last backward hides less than that: the overlap is slower, by less than the two latencies together
    assert off.step_time_ms < lat[True, True].step_time_ms < on.step_time_ms < off.step_time_ms + 2 * extra
    # the buckets outlast the backward: the step goes on when the last one ends (NCCL's SMs taken from the backward
    # cost nothing on top of communication that is exposed anyway)
    for p in (on, nolat[True, False]):
        rs_end = max(e["end_ms"] for e in reduce_scatters(p))
        opt = [e for e in p.events if e["stage"] == 0 and e["name"] == "optimizer"]
        assert opt and opt[0]["start_ms"] == pytest.approx(rs_end, rel=1e-9)
    # no latency: the buckets cost what one message costs, and the overlap only helps
    z_off = nolat[False, False]
    for key in ((True, False), (True, True)):
        z = nolat[key]
        assert z.comm["dp_sync_ms"] == pytest.approx(z_off.comm["dp_sync_ms"], rel=1e-4)
        assert z.comm["dp_param_gather_ms"] == pytest.approx(z_off.comm["dp_param_gather_ms"], rel=1e-4)
        assert z.step_time_ms < z_off.step_time_ms


@pytest.mark.parametrize("framework", ["hf", "megatron-deepspeed"])
@pytest.mark.parametrize("flag,own,other", [
    ("overlap_grad_reduce", "gradient buckets", "userbuffers"),
    ("overlap_param_gather", "distributed-optimizer parameters", "gradient buckets"),
    ("tp_comm_overlap", "Transformer Engine's userbuffers", "gradient buckets"),
    ("overlap_moe_expert_parallel_comm", "expert-parallel all-to-alls", "gradient buckets"),
    ("overlap_p2p_comm", "pipeline sends and receives", "gradient buckets"),
])
def test_each_megatron_only_overlap_flag_is_refused_with_its_own_reason(framework, flag, own, other):
    """Audit 54a finding 4: --tp-comm-overlap under megatron-deepspeed was refused with the grad-reduce text (gradient
    buckets); each flag now says what it overlaps."""
    from wattcast.simulate.parallel import new_config, resolve_parallel

    cfg = new_config(gpus=8, tp=2, pp=2, micro_batch=1, zero=1, sp=True, ep=1, **{flag: True})
    with pytest.raises(ParallelConfigError) as e:
        resolve_parallel(cfg, batch=16, n_layers=24, n_heads=16, framework=framework)
    msg = " ".join(str(e.value).split())
    assert msg.startswith(f"--{flag.replace('_', '-')} is a Megatron-Core option: use --framework megatron")
    assert own in msg and other not in msg


def test_hbm_traffic_per_byte_follows_the_ring_steps():
    """The per-rank DRAM traffic of NCCL's ring (simulate/overlap.py, derived per step) and of TE's userbuffers."""
    from wattcast.simulate.overlap import collective_hbm_bytes, nccl_hbm_bytes_per_byte, userbuffers_hbm_bytes_per_byte

    # all-reduce over 8: 1 + 2 x 6 + 3 (reduce-scatter) + 2 x 6 + 2 (all-gather) chunks read / written, 14 staged in
    assert float(nccl_hbm_bytes_per_byte("all_reduce", 8)) == pytest.approx((1 + 12 + 3 + 12 + 2 + 14) / 8)
    assert float(nccl_hbm_bytes_per_byte("all_gather", 8)) == pytest.approx(23 / 8)
    assert float(nccl_hbm_bytes_per_byte("reduce_scatter", 8)) == pytest.approx(23 / 8)
    assert float(nccl_hbm_bytes_per_byte("all_to_all", 8)) == pytest.approx(30 / 8)
    assert float(nccl_hbm_bytes_per_byte("all_reduce", 1)) == 0.0  # no group, no traffic
    # a ring all-reduce moves about 3x its bus bytes through DRAM (2(n-1)/n of the buffer crosses the links)
    assert float(nccl_hbm_bytes_per_byte("all_reduce", 64)) / (2 * 63 / 64) == pytest.approx(3.0, rel=0.02)
    # userbuffers' copy-engine ring exchange: read out and written into the next rank's buffer, tp - 1 chunks
    assert float(userbuffers_hbm_bytes_per_byte("all_gather", 8)) == pytest.approx(14 / 8)
    assert float(userbuffers_hbm_bytes_per_byte("reduce_scatter", 8)) == pytest.approx(9 / 8)
    assert float(collective_hbm_bytes({"all_gather": 8e6, "reduce_scatter": 8e6}, 8, userbuffers=True)) \
        == pytest.approx(8e6 * (14 + 9) / 8)


def test_memory_bandwidth_is_shared_both_ways():
    """A collective beside computation shares the DRAM bandwidth with it (issue 15: shared SMs and memory bandwidth
    slow both sides): a memory-bound task beside a large all-gather takes longer than with SM sharing alone, a
    GEMM-bound one barely changes, and the collective itself takes longer beside a task that saturates the DRAM."""
    from wattcast.simulate.overlap import collective_hbm_bytes, hbm_stretch

    share = sm_share(16, 132)
    bw_gbps = 3000.0
    compute_ms, comm_ms = 10.0, 8.0
    # an 8-way all-gather of 2 GB in 8 ms (~220 GB/s of bus bandwidth): 2.875 B of DRAM traffic a byte, ~720 GB/s
    ag_hbm = float(collective_hbm_bytes({"all_gather": 2e9}, 8))
    sm_only = overlapped_ms(compute_ms, comm_ms, share=share)
    # memory-bound: every kernel streams at the full bandwidth (3 GB/ms x 10 ms)
    mem = hbm_stretch(compute_ms, comm_ms, share=share, mem_ms=compute_ms, mem_bytes=bw_gbps * 1e6 * compute_ms,
                      comm_hbm_bytes=ag_hbm, hbm_gbps=bw_gbps)
    t_mem = overlapped_ms(compute_ms, comm_ms, share=share, stretch=mem)
    assert t_mem > sm_only + 0.5  # 1.24x on the 8 ms together vs the SMs' 1.12x
    assert t_mem == pytest.approx(compute_ms + (bw_gbps * 1e6 + ag_hbm / comm_ms) / (bw_gbps * 1e6) * comm_ms - comm_ms)
    # GEMM-bound: 300 GB/s of demand, which fits beside the all-gather's: the SMs' share alone
    gemm = hbm_stretch(compute_ms, comm_ms, share=share, other_bytes=300e6 * compute_ms, comm_hbm_bytes=ag_hbm,
                       hbm_gbps=bw_gbps)
    assert overlapped_ms(compute_ms, comm_ms, share=share, stretch=gemm) == pytest.approx(sm_only)
    # the communication's side: a collective longer than a DRAM-saturating task is exposed for longer than with SMs
    # alone (its overlapped part stretched by the same factor), and not beside a GEMM-bound one
    long_comm = 20.0
    sat = hbm_stretch(compute_ms, long_comm, share=share, mem_ms=compute_ms, mem_bytes=bw_gbps * 1e6 * compute_ms,
                      comm_hbm_bytes=ag_hbm * long_comm / comm_ms, hbm_gbps=bw_gbps)
    assert sat[1] > 1.2
    t_long = overlapped_ms(compute_ms, long_comm, share=share, stretch=sat)
    assert t_long == pytest.approx(long_comm + (sat[1] - 1.0) * compute_ms)
    assert t_long > overlapped_ms(compute_ms, long_comm, share=share) + 2.0
    gemm_long = hbm_stretch(compute_ms, long_comm, share=share, other_bytes=300e6 * compute_ms,
                            comm_hbm_bytes=ag_hbm * long_comm / comm_ms, hbm_gbps=bw_gbps)
    assert gemm_long[1] == pytest.approx(1.0)
    # no bandwidth given: the SMs alone, as before
    none = hbm_stretch(compute_ms, comm_ms, share=share, mem_ms=compute_ms, mem_bytes=1e12, comm_hbm_bytes=ag_hbm)
    assert overlapped_ms(compute_ms, comm_ms, share=share, stretch=none) == pytest.approx(sm_only)
    # vectorised: a mix of memory-bound and GEMM kernels lands between the two
    mixed = hbm_stretch(np.full(3, compute_ms), comm_ms, share=share, mem_ms=np.array([0.0, 5.0, 10.0]),
                        mem_bytes=bw_gbps * 1e6 * np.array([0.0, 5.0, 10.0]), other_bytes=300e6 * np.array([10.0, 5.0, 0.0]),
                        comm_hbm_bytes=ag_hbm, hbm_gbps=bw_gbps)
    t = overlapped_ms(np.full(3, compute_ms), comm_ms, share=share, stretch=mixed)
    assert t[0] < t[1] < t[2]


def test_data_parallel_overlap_pays_for_the_dram_it_shares(monkeypatch):
    """Megatron-Core's overlapped gradient buckets and parameter all-gathers, costed with the DRAM bandwidth they share
    with the backward and the forward, take longer than with NCCL's SMs alone (the backward's memory-bound kernels:
    norms, activations, casts)."""
    import wattcast.simulate.distributed as dist
    from wattcast.simulate import overlap

    kw = dict(gpus=16, batch=64, seq=4096, micro_batch=2, zero=1, framework="megatron", overlap_grad_reduce=True,
              overlap_param_gather=True)
    both = wattcast.predict_cluster("llama3_8b", "DGX-H100", **kw)
    monkeypatch.setattr(dist, "hbm_stretch", lambda c, r, *, share, **k: overlap.hbm_stretch(c, r, share=share))
    sm_only = wattcast.predict_cluster("llama3_8b", "DGX-H100", **kw)
    assert both.step_time_ms > sm_only.step_time_ms + 1.0
    assert both.step_time_ms < sm_only.step_time_ms * 1.05  # a share of the hidden traffic, not all of it


def test_userbuffers_sm_share_follows_te_defaults_per_method():
    """TE 2.20.2 initialize_ub's defaults (simulate/overlap.py UB_METHOD_SMS): the ring exchange (forward all-gathers,
    backward output-gradient all-gathers) holds 1 SM, the pipelined forward reduce-scatters and the backward's bulk
    overlaps 16; until stop 59 every userbuffers collective held 2."""
    from wattcast.simulate.overlap import UB_METHOD_SMS, ub_sm_share

    assert UB_METHOD_SMS == {"ring_exchange": 1, "pipeline": 16, "bulk": 16}
    n = 132
    assert float(ub_sm_share(8.0, n)) == pytest.approx(1 / n)  # nothing named: ring exchange
    assert float(ub_sm_share(8.0, n, {"pipeline": 8.0})) == pytest.approx(16 / n)
    # a forward: half ring-exchange all-gathers, half pipelined reduce-scatters, weighted by their time
    assert float(ub_sm_share(8.0, n, {"pipeline": 4.0})) == pytest.approx((4 * 1 + 4 * 16) / 8 / n)
    # a backward: a third ring exchange (proj / fc2 dgrad), two thirds bulk (qkv / fc1 re-gather and reduce-scatter)
    assert np.allclose(ub_sm_share(np.array([9.0, 0.0]), n, {"bulk": np.array([6.0, 0.0])}),
                       [(3 * 1 + 6 * 16) / 9 / n, 1 / n])
    with pytest.raises(ValueError, match="external"):
        ub_sm_share(8.0, n, {"external": 1.0})
    # a reduce-scatter pair slows its GEMM by 16 / num_sms over the span it runs beside it (first chunk exposed)
    gemm, coll, tp = 100.0, 8.0, 8
    rest = coll - coll / tp
    assert tp_overlap_layer_ms(gemm, coll, tp=tp, num_sms=n, method_ms={"pipeline": coll}) == pytest.approx(
        coll / tp + gemm + 16 / n * rest)
    # an all-gather pair (ring exchange, copy engines) by 1 / num_sms
    assert tp_overlap_layer_ms(gemm, coll, tp=tp, num_sms=n) == pytest.approx(coll / tp + gemm + 1 / n * rest)


def test_tp_comm_overlap_charges_each_userbuffers_method_its_sms(monkeypatch):
    """Wired where --tp-comm-overlap's pairs are costed (distributed._comm_parts): the rank view splits the TP
    collectives by TE's method (forward reduce-scatters pipeline, backward reduce-scatters and input re-gathers bulk),
    and with every method charged the ring exchange's 1 SM the exposed TP time is lower."""
    from wattcast.simulate import overlap

    kw = dict(gpus=32, batch=8, seq=4096, tp=8, sp=True, pp=4, micro_batch=1, zero=1, framework="megatron")
    te = wattcast.predict_cluster("llama3_8b", "DGX-H100", **kw)
    assert te.parallel.tp_comm_overlap
    monkeypatch.setitem(overlap.UB_METHOD_SMS, "pipeline", 1)
    monkeypatch.setitem(overlap.UB_METHOD_SMS, "bulk", 1)
    ring_only = wattcast.predict_cluster("llama3_8b", "DGX-H100", **kw)
    assert te.exposed_comm_split_ms["tp"] > ring_only.exposed_comm_split_ms["tp"] + 0.1
    assert te.step_time_ms > ring_only.step_time_ms
