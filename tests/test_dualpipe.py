"""DeepSeek-V3's DualPipe schedule (simulate/dualpipe.py): the reference order replayed against the report's Table 2,
its memory (two chunks' parameters, pp + 1 micro-batches of activations) and its rules."""

import re

import numpy as np
import pytest

import wattcast
from wattcast.simulate.dualpipe import (DUALPIPE_EXACT_MICRO, _F, _FB, _RECV, _SEND, _W, dualpipe_bubble_ms,
                                        peak_activation_bytes, rank_order, rank_program, simulate_dualpipe)
from wattcast.simulate.parallel import ParallelConfigError
from wattcast.simulate.scheduler import simulate_pipeline
from wattcast.simulate.stage_memory import inflight_chunks_by_stage
from wattcast.simulate.strategy import parse_strategy


@pytest.mark.parametrize("P,M", [(8, 20), (4, 8), (16, 120)])
@pytest.mark.parametrize("F,B,W,FB", [(1.0, 2.0, 0.5, 3.0), (1.0, 2.0, 0.5, 2.4), (1.0, 2.0, 0.0, 3.0), (1.0, 2.0, 1.0, 3.0)])
def test_replayed_order_has_table2_bubble(P, M, F, B, W, FB):
    """The paper check. Equal stages (8 ranks and 20 micro-batches is the report's Fig. 5): the reference programs,
    replayed with their waits, leave the middle ranks (the most F&B pairs) the longest idle, at most Table 2's
    (P/2 - 1)(F&B + B - 3W) (B the full backward) and at least it less one forward (a forward waits for its own input
    only: the middle ranks' first pair split, step 3's W), and 1F1B's is (P-1)(F+B)."""
    f, b, w = np.full(P, F), np.full(P, B), np.full(P, W)
    r = simulate_dualpipe(f, b, w, n_micro=M, fb_ms=lambda sf, sb: FB)
    end = float(r.stage_end.max())
    idle = end - r.stage_busy
    t2 = float(dualpipe_bubble_ms(F, B, W, FB, P))
    assert t2 - F - 1e-9 <= float(idle.max()) <= t2 + 1e-9
    assert float(idle[P // 2]) == pytest.approx(float(idle.max()), abs=1e-9)
    # every rank runs M forwards and M backwards (F&B pairs included)
    assert np.all(r.stage_busy <= M * (F + B) + 1e-9)
    one = simulate_pipeline(f, b, n_micro=M, keep_tasks=False)
    assert float(one.stage_end.max()) - M * (F + B) == pytest.approx((P - 1) * (F + B))


def test_program_runs_the_order():
    """The replayed programs (communication included) compute in rank_order's order (the F|B pair as F then B)."""
    names = {_F: "F", _W: "W", _FB: "FB"}
    for P, M in ((2, 4), (4, 8), (8, 20), (16, 40)):
        for r in range(P):
            got = [names.get(o[0]) or ("Bi" if o[3] else "B") for o in rank_program(r, P, M) if o[0] >= _F]
            want = [x for t in rank_order(r, P, M) for x in (("F", "B") if t[0] == "F|B" else (t[0],))]
            assert got == want


def test_replay_follows_the_reference_waits():
    """pp4, 8 micro-batches, F 1, B 2, W 0.5 (the tasks' times and order are DualPipe.step's; the timing its waits,
    checked against an independent emulation of dualpipe 1.0.0's step() with rendezvous transfers): the middle rank's
    first step-4 forward does not wait for its pair's gradient (rank 1's F2 at 5.0, not 5.5), rank 0's step-3 W waits
    for the commit before it (the next forward's input and the gradient it sent, taken at 6.0), and with transfers a
    send holds its rank until the peer receives it."""
    P, M = 4, 8
    r = simulate_dualpipe(np.ones(P), np.full(P, 2.0), np.full(P, 0.5), n_micro=M, keep_tasks=True)
    tasks = {(t.stage, t.kind, t.micro): t for t in r.tasks}
    assert tasks[(1, "F", 2)].start == 5.0 and tasks[(2, "F", 6)].start == 5.0
    assert tasks[(0, "W", 4)].start == 6.0 and tasks[(3, "W", 0)].start == 6.0
    assert r.stage_end.tolist() == [27.0, 26.0, 26.0, 27.0]
    f = np.array([1.0, 1.2, 0.9, 1.1])
    r = simulate_dualpipe(f, 2 * f, 0.5 * f, n_micro=M, p2p_ms=0.3)
    assert r.stage_end == pytest.approx([31.95, 31.0, 31.0, 31.95], abs=1e-9)


def test_trace_tasks_name_their_micro_batches():
    """A W is named by the micro-batch whose zero-bubble backward queued it (FIFO), and every task knows the chunk it
    runs (stage r or P-1-r on rank r)."""
    P, M = 4, 8
    r = simulate_dualpipe(np.ones(P), np.full(P, 2.0), np.full(P, 0.5), n_micro=M, keep_tasks=True)
    for rank in range(P):
        own = [t for t in r.tasks if t.stage == rank]
        bi = [t.micro for t in own if t.kind == "B" and t.end - t.start == 1.5]  # the zero-bubble ones
        assert [t.micro for t in own if t.kind == "W"] == bi
        for t in own:
            assert t.model_stage == (rank if t.micro < M // 2 else P - 1 - rank)
            if t.kind == "FB":
                assert t.stage_b == P - 1 - t.model_stage and t.stage_b == (rank if t.micro_b < M // 2 else P - 1 - rank)


@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (8, 20)])
def test_replay_keeps_each_transfer_as_it_timed_it(P, M):
    """With keep_tasks the replay returns its point-to-point messages (extra["transfers"], for the trace): as many as
    the programs post sends and receives (one activation and one input gradient per micro-batch per stage boundary of
    its direction: 2 M (P - 1)), each from the later of its ends' posts to that plus p2p_ms, after the task that
    produced it and before the one that consumes it, the sender's next task waiting for it too; the timing is the
    replay's without tasks, bit for bit."""
    f = 1.0 + 0.1 * np.arange(P)
    f[-1] += 0.4  # a heavier last stage, as a model's head
    b, w, c = 2.1 * f, 0.6 * f, 0.3
    r = simulate_dualpipe(f, b, w, n_micro=M, p2p_ms=c, keep_tasks=True)
    plain = simulate_dualpipe(f, b, w, n_micro=M, p2p_ms=c)
    for x, y in ((r.stage_end, plain.stage_end), (r.stage_busy, plain.stage_busy),
                 (r.last_backward_by_chunk, plain.last_backward_by_chunk)):
        assert x.tolist() == y.tolist()
    assert plain.extra["transfers"] == []
    xs = r.extra["transfers"]
    progs = [rank_program(q, P, M) for q in range(P)]
    n_send = sum(o[0] == _SEND for p in progs for o in p)
    n_recv = sum(o[0] == _RECV for p in progs for o in p)
    assert len(xs) == n_send == n_recv == 2 * M * (P - 1)
    H = M // 2
    assert len({(x.kind, x.micro, x.src_stage) for x in xs}) == len(xs)
    by_rank = {q: sorted((t for t in r.tasks if t.stage == q), key=lambda t: t.start) for q in range(P)}

    def task(rank, kind, micro):  # the task of ``rank`` running the forward (kind 0) or backward (1) of ``micro``
        hit = [t for t in by_rank[rank] if (kind == 0 and t.kind in ("F", "FB") and t.micro == micro)
               or (kind == 1 and ((t.kind == "B" and t.micro == micro) or (t.kind == "FB" and t.micro_b == micro)))]
        assert len(hit) == 1, (rank, kind, micro)
        return hit[0]

    for x in xs:
        assert x.direction == int(x.micro >= H)
        assert x.dst_stage == x.src_stage + (1 if x.kind == 0 else -1)
        rank = (lambda s: s) if x.direction == 0 else (lambda s: P - 1 - s)
        assert (x.src_rank, x.dst_rank) == (rank(x.src_stage), rank(x.dst_stage))
        assert x.start_ms == max(x.send_posted_ms, x.recv_posted_ms) and x.end_ms == x.start_ms + c
        made, used = task(x.src_rank, x.kind, x.micro), task(x.dst_rank, x.kind, x.micro)
        stage_of = lambda t: t.stage_b if (x.kind == 1 and t.kind == "FB") else t.model_stage  # noqa: E731
        assert (stage_of(made), stage_of(used)) == (x.src_stage, x.dst_stage)
        assert made.end <= x.send_posted_ms and used.start >= x.end_ms
        # both ends' commits wait for it: each rank's next task after its post starts after the transfer
        for q, posted in ((x.src_rank, x.send_posted_ms), (x.dst_rank, x.recv_posted_ms)):
            nxt = [t.start for t in by_rank[q] if t.start >= posted]
            assert not nxt or nxt[0] >= x.end_ms


@pytest.mark.parametrize("P", [4, 8, 16])
@pytest.mark.parametrize("p2p", [0.0, 0.05, 0.5])
def test_extrapolated_steady_state_is_the_full_replay(P, p2p):
    """Beyond DUALPIPE_EXACT_MICRO micro-batches step 4 is extrapolated: equal to the full replay (equal stages, and
    stages as a model's: first and last heavier)."""
    prof = np.ones(P)
    prof[0], prof[-1] = 1.15, 1.3
    for f in (np.ones(P), prof):
        b, w = 2.1 * f, 0.6 * f
        for M in (2 * DUALPIPE_EXACT_MICRO + 4, 1000):
            a = simulate_dualpipe(f, b, w, n_micro=M, p2p_ms=p2p)
            e = simulate_dualpipe(f, b, w, n_micro=M, p2p_ms=p2p, max_exact_micro=10 ** 9)
            assert a.extrapolated and not e.extrapolated
            for x, y in ((a.stage_end, e.stage_end), (a.stage_busy, e.stage_busy),
                         (a.last_backward_by_chunk, e.last_backward_by_chunk),
                         (a.first_forward_by_chunk, e.first_forward_by_chunk)):
                assert np.allclose(x, y, rtol=1e-12, atol=1e-9)


def test_order_holds_pp_plus_one_micro_batches():
    """The reference order's peak of saved activations (a forward adds one, a full backward or a W frees it; an F&B
    pair's forward allocates before its backward frees) is pp + 1 on every rank, as Table 2 and the memory use."""
    for P, M in ((4, 8), (8, 20), (16, 120)):
        for r in range(P):
            n = peak = 0
            for t in rank_order(r, P, M):
                n += {"F": 1, "B": -1, "W": -1}.get(t[0], 0)
                if t[0] in ("FB", "F|B"):
                    peak = max(peak, n + 1)
                peak = max(peak, n)
            assert peak == P + 1
        assert list(inflight_chunks_by_stage(pp=P, interleave=1, n_micro=M, schedule="dualpipe")) == [P + 1] * P


KW = dict(gpus=8, batch=16, seq=512, pp=4, micro_batch=1, zero=1, framework="megatron")


def test_memory_two_chunks_and_pp_plus_one_activations():
    one = wattcast.predict_cluster("llama3_8b", "DGX-H100", schedule="1f1b", **KW)
    dual = wattcast.predict_cluster("llama3_8b", "DGX-H100", schedule="dualpipe", **KW)
    P = KW["pp"]
    a1 = {d["stage"]: d for d in one.per_device}
    per_chunk_act = [a1[s]["activations_gb"] / (P - s) for s in range(P)]  # 1F1B: pp - s in flight
    for d in dual.per_device:
        s, m = d["stage"], P - 1 - d["stage"]
        for k in ("weights_gb", "gradients_gb", "optimizer_gb"):
            assert d[k] == pytest.approx(a1[s][k] + a1[m][k], rel=1e-6)
        # the replayed order's peak with each chunk at its own size (stop 44; P + 1 of the two chunks' mean before,
        # which put the head's logits on rank 0 P + 1 times): the middle ranks' equal chunks read as before
        assert d["activations_gb"] == pytest.approx(peak_activation_bytes(per_chunk_act, KW["batch"] // (KW["gpus"] // P))[s], rel=1e-6)
        if 0 < s < P - 1:
            assert d["activations_gb"] == pytest.approx((P + 1) * (per_chunk_act[s] + per_chunk_act[m]) / 2, rel=1e-6)
    assert dual.memory["inflight_chunks"] == P + 1
    x = dual.to_dict()["dualpipe"]
    assert x["critical_rank"] in range(P) and len(x["bubble_ms_by_rank"]) == P and x["table2_bubble_ms"] > 0
    assert "dualpipe" not in one.to_dict() and "dualpipe" in dual.parallel.describe()


@pytest.mark.parametrize("change,match", [
    (dict(pp=2, gpus=6, batch=12), None),  # control: fits the rules
    (dict(pp=3, gpus=6, batch=12), "even pipeline size"),
    (dict(batch=14), "even number of micro-batches"),  # 7 micro-batches
    (dict(batch=12), "at least twice pp"),  # 6 < 2 x 4
    (dict(interleave=2), "cannot run with --schedule dualpipe"),
    (dict(framework="megatron-deepspeed"), "runs 1F1B only"),
])
def test_dualpipe_rules(change, match):
    kw = dict(KW, schedule="dualpipe", **change)
    if match is None:
        assert wattcast.predict_cluster("llama3_8b", "DGX-H100", **kw).step_time_ms > 0
        return
    with pytest.raises(ParallelConfigError, match=match):
        wattcast.predict_cluster("llama3_8b", "DGX-H100", **kw)


def test_strategy_token():
    assert parse_strategy("dp2-tp1-pp4-mb1-dualpipe").schedule == "dualpipe"


DP_KW = dict(gpus=16, batch=32, seq=2048, pp=4, micro_batch=1, zero=1, framework="megatron", schedule="dualpipe",
             overlap_grad_reduce=True)


def test_dp_reduction_waits_for_the_weight_gradients():
    """Each rank's gradients are done by its last W (or full backward): its buckets become ready during it, not
    during its last input-gradient backward; both ranks holding stage 0 (0 and P-1) bucket their gradients as
    Megatron-Core's first stage, the others reduce them as one message after it."""
    r = wattcast.predict_cluster("llama3_8b", "DGX-H100", trace=True, **DP_KW)
    P = DP_KW["pp"]
    n_buckets = []
    for s in range(P):
        ev = [e for e in r.events if e["stage"] == s]
        last_w = max((e for e in ev if e["name"].startswith("W")), key=lambda e: e["end_ms"])
        dp = [e for e in ev if e["name"].startswith("dp.") and "param" not in e["name"]]
        assert min(e["start_ms"] for e in dp) >= last_w["start_ms"] - 1e-9
        assert max(e["end_ms"] for e in dp) >= last_w["end_ms"] - 1e-9
        n_buckets.append(len(dp))
    assert n_buckets[0] == n_buckets[-1] > 1 and n_buckets[1:-1] == [1] * (P - 2)


def test_forward_and_backward_are_the_traced_tasks():
    """forward_ms: the F tasks and the forward part of the F&B pairs; backward_ms: the B (full or input-gradient), the
    W and the pairs' backward part: together every compute task of the trace (cp > 1: each task's rings, none on a W)."""
    for kw in (dict(gpus=8, batch=16, seq=2048, pp=4), dict(gpus=8, batch=16, seq=2048, pp=2, cp=2, tp=2)):
        r = wattcast.predict_cluster("llama3_8b", "DGX-H100", micro_batch=1, framework="megatron", schedule="dualpipe",
                                     trace=True, **kw)
        tot = dict(F=0.0, B=0.0, W=0.0, FB=0.0, FBf=0.0, FBb=0.0)
        starts = {}
        for e in r.events:
            if e["stream"] != "compute" or e["name"].startswith(("data_loading", "optimizer", "host.")):
                continue
            m = re.fullmatch(r"(FB|F|B|W)\d+(\+\d+)?", e["name"])
            assert m, e["name"]
            tot[m.group(1)] += e["end_ms"] - e["start_ms"]
            starts[(e["stage"], round(e["start_ms"], 9))] = m.group(1)
            if m.group(1) == "FB":
                tot["FBf"] += e["forward_part_ms"]
                tot["FBb"] += e["backward_part_ms"]
        assert tot["FB"] > 0 and tot["W"] > 0
        assert tot["FBf"] + tot["FBb"] == pytest.approx(tot["FB"], rel=1e-9)
        assert r.forward_ms == pytest.approx(tot["F"] + tot["FBf"], rel=1e-9)
        assert r.backward_ms == pytest.approx(tot["B"] + tot["W"] + tot["FBb"], rel=1e-9)
        if kw.get("cp"):
            rings = {}
            for e in r.events:
                if e["name"].startswith("cp.ring_kv"):
                    rings.setdefault((e["stage"], round(e["start_ms"], 9)), []).append(e)
            kinds = [starts.get((s, t)) for (s, t) in rings]
            assert "W" not in kinds and kinds.count("FB") > 0
            # an F&B pair runs its forward's ring, then its backward's
            pair = [k for k in rings if starts.get(k) == "FB"]
            assert all(len(rings[k]) == 1 for k in pair)
            follow = [e for e in r.events if e["name"].startswith("cp.ring_kv")
                      and any(abs(e["start_ms"] - rings[k][0]["end_ms"]) < 1e-9 and e["stage"] == k[0] for k in pair)]
            assert len(follow) == len(pair)


def test_data_loading_follows_the_chunk_not_the_rank():
    """Loading the micro-batch is the figure of the chunk a forward runs (rank 0's reverse-direction forwards run stage
    P-1, whose loading is the last stage's), and an F&B pair's forward loads too."""
    r = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=16, seq=2048, pp=4, micro_batch=1,
                                 framework="megatron", schedule="dualpipe", trace=True)
    M = r.meta["n_micro"]
    dur = {}
    for e in r.events:
        if e["name"].startswith("data_loading"):
            m = int(e["name"][len("data_loading"):])
            dur.setdefault((e["stage"], m < M // 2), set()).add(round(e["end_ms"] - e["start_ms"], 9))
    assert dur[(0, True)] == dur[(3, False)] and dur[(0, False)] == dur[(3, True)]  # stage 0's, stage 3's
    assert dur[(0, True)] != dur[(0, False)]
    names = [e["name"] for e in r.events if e["stage"] == 0 and e["stream"] == "compute"]
    after_pair = [names[i + 1] for i, n in enumerate(names[:-1]) if n.startswith("FB")]
    assert any(n.startswith("data_loading") for n in after_pair)


def test_dualpipe_leaves_the_backward_tp_collectives_exposed():
    """DualPipe runs the weight gradients apart (TE's delay_wgrad_compute: layernorm_linear.py l. 1068-1079), so the
    dgrad collective has no wgrad GEMM beside it in the backward: the asynchronous-TP saving is not taken there,
    while 1F1B takes it."""
    import numpy as np

    import wattcast.simulate.distributed as dist

    kw = dict(KW, gpus=16, tp=2)
    runs = {}
    orig = dist.async_tp_backward_save_ms
    for name, fn in (("save", orig), ("none", lambda names, *a, **k: np.zeros(len(names)))):
        dist.async_tp_backward_save_ms = fn
        dist._COSTED.clear()
        try:
            runs[name] = [wattcast.predict_cluster("llama3_8b", "DGX-H100", **kw, **s).step_time_ms
                          for s in ({"schedule": "dualpipe"}, {})]
        finally:
            dist.async_tp_backward_save_ms = orig
            dist._COSTED.clear()
    assert runs["save"][0] == pytest.approx(runs["none"][0], rel=1e-12)  # DualPipe: nothing hidden
    assert runs["save"][1] < runs["none"][1]  # 1F1B: the dgrad collectives beside the wgrad GEMMs
