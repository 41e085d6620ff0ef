"""DeepSeek-V3's DualPipe schedule (simulate/dualpipe.py): the reference order replayed against the report's Table 2,
its memory (two chunks' parameters, pp + 1 micro-batches of activations) and its rules."""

import numpy as np
import pytest

import wattcast
from wattcast.simulate.dualpipe import dualpipe_bubble_ms, peak_activation_bytes, rank_order, simulate_dualpipe
from wattcast.simulate.parallel import ParallelConfigError
from wattcast.simulate.scheduler import simulate_pipeline
from wattcast.simulate.stage_memory import inflight_chunks_by_stage
from wattcast.simulate.strategy import parse_strategy


@pytest.mark.parametrize("P,M", [(8, 20), (4, 8), (16, 120)])
@pytest.mark.parametrize("F,B,W,FB", [(1.0, 2.0, 0.5, 3.0), (1.0, 2.0, 0.5, 2.4), (1.0, 2.0, 0.0, 3.0), (1.0, 2.0, 1.0, 3.0)])
def test_replayed_order_has_table2_bubble(P, M, F, B, W, FB):
    """Equal stages (8 ranks and 20 micro-batches is the report's Fig. 5): the reference order, replayed, leaves the
    middle ranks (the most F&B pairs: the longest idle) idle for exactly (P/2 - 1)(F&B + B - 3W) (Table 2; B the full
    backward), and 1F1B's for (P-1)(F+B)."""
    f, b, w = np.full(P, F), np.full(P, B), np.full(P, W)
    r = simulate_dualpipe(f, b, w, n_micro=M, fb_ms=lambda sf, sb: FB)
    end = float(r.stage_end.max())
    idle = end - r.stage_busy
    assert float(idle.max()) == pytest.approx(dualpipe_bubble_ms(F, B, W, FB, P), abs=1e-9)
    assert float(idle[P // 2]) == pytest.approx(float(idle.max()), abs=1e-9)
    # every rank runs M forwards and M backwards (F&B pairs included)
    assert np.all(r.stage_busy <= M * (F + B) + 1e-9)
    one = simulate_pipeline(f, b, n_micro=M, keep_tasks=False)
    assert float(one.stage_end.max()) - M * (F + B) == pytest.approx((P - 1) * (F + B))


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
