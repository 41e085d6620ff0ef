"""A pipeline's optimizer step waits for every stage: the global-norm all-reduce (and fp16's found-inf check) is a
barrier across the stages (audit 59b finding 1; simulate/distributed.py optimizer_barriers)."""
import numpy as np
import pytest

import wattcast
from wattcast.simulate.distributed import (CLIP_NORM_SHARE, barrier_optimizer_ms, optimizer_barriers,
                                           optimizer_segments)


def test_which_steps_wait_at_a_barrier():
    # Megatron-Core: the norm's all-reduce (clip_grad 1.0 by default); fp16 adds the found-inf all-reduce before it
    assert optimizer_barriers("megatron", "bf16", True, False, 4) == ("grad_norm",)
    assert optimizer_barriers("megatron", "fp16", True, False, 4) == ("found_inf", "grad_norm")
    assert optimizer_barriers("megatron", "fp16", False, False, 4) == ("found_inf",)
    assert optimizer_barriers("megatron", "bf16", False, False, 4) == ()
    # DeepSpeed's BF16_Optimizer takes the global norm every step, clipping or not
    assert optimizer_barriers("megatron-deepspeed", "bf16", False, True, 2) == ("grad_norm",)
    assert optimizer_barriers("hf", "bf16", True, False, 2) == ("grad_norm",)
    assert optimizer_barriers("hf", "fp16", True, False, 2) == ("grad_norm",)
    # no pipeline (every rank of a stage's groups does the same work), no optimizer: nothing to wait for
    assert optimizer_barriers("megatron", "fp16", True, False, 1) == ()
    assert optimizer_barriers("megatron", "bf16", True, False, 4, "none") == ()


def test_a_barrier_starts_when_the_last_stage_reaches_it():
    finish = np.array([10.0, 8.0, 5.0])
    end, starts, spans = barrier_optimizer_ms(finish, [np.array([1.0, 1.0, 1.0]), np.array([2.0, 3.0, 7.0])], [0.5])
    assert spans == [(11.0, 11.5)]
    assert starts[0].tolist() == finish.tolist() and starts[1].tolist() == [11.5] * 3
    assert end.tolist() == [13.5, 14.5, 18.5]  # the heavy last stage steps after stage 0's backward, not during it
    one, _, none = barrier_optimizer_ms(finish, [np.array([1.0, 2.0, 9.0])], [])
    assert one.tolist() == [11.0, 10.0, 14.0] and none == []


def test_the_phase_cut_at_its_barriers_adds_up_to_the_optimizer_step():
    parts = {"optimizer|optimizer_step": np.array([[6.0, 9.0]]), "optimizer|clip_grad_norm": np.array([[3.0, 6.0]]),
             "optimizer|loss_scaling": np.array([[1.0, 2.0]]), "optimizer|main_grad_cast": np.array([[0.5, 0.5]])}
    total = np.array([10.5, 17.5])
    segs, ms = optimizer_segments(parts, total, ("found_inf", "grad_norm"), CLIP_NORM_SHARE)
    assert [[k for k, _ in s] for s in segs] == [["optimizer|main_grad_cast", "optimizer|loss_scaling"],
                                                 ["optimizer|clip_grad_norm"],
                                                 ["optimizer|clip_grad_norm", "optimizer|optimizer_step"]]
    assert ms[0].tolist() == [1.5, 2.5] and ms[1].tolist() == [1.0, 2.0]  # the norm reads 4 of the clipping's 12 B
    assert (ms[0] + ms[1] + ms[2]).tolist() == total.tolist()
    segs, ms = optimizer_segments(parts, total, ("grad_norm",), CLIP_NORM_SHARE)
    assert len(segs) == 2 and ms[0].tolist() == [2.5, 4.5] and ms[1].tolist() == [8.0, 13.0]
    segs, ms = optimizer_segments(parts, total, (), CLIP_NORM_SHARE)
    assert len(segs) == 1 and ms[0] is not None and ms[0].tolist() == total.tolist()


@pytest.fixture(scope="module")
def uneven():
    # Llama 3 8B (no tied embedding to pair the first and last stage) on 4 stages of 2, 8, 8, 14 layers: the last
    # stage's optimizer step is the longest, and its backward ends long before stage 0's (1F1B drains from the end)
    return wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, tp=2, pp=4, batch=16, micro_batch=1, seq=2048,
                                    zero=0, framework="megatron", pp_first_stage_layers=2, pp_last_stage_layers=14,
                                    trace=True)


def test_no_stage_steps_before_every_stage_has_taken_its_norm(uneven):
    r = uneven
    finish = np.array([d["finish_ms"] for d in r.per_device])
    opt = np.array(r.comm["optimizer_ms_by_stage"])
    assert r.comm["optimizer_barriers"] == ["grad_norm"]
    last_b = max(e["end_ms"] for e in r.events if e["name"].startswith("B"))
    for s in range(4):
        steps = [e for e in r.events if e["stage"] == s and e["name"] == "optimizer"
                 and any(p[0] == "adamw.step" for p in e["parts"])]
        assert len(steps) == 1 and steps[0]["start_ms"] >= last_b  # the step after every stage's last backward
        ar = [e for e in r.events if e["stage"] == s and e["name"] == "pp.grad_norm_all_reduce"]
        assert len(ar) == 1 and ar[0]["end_ms"] == pytest.approx(steps[0]["start_ms"], abs=1e-9)
        pieces = sum(e["end_ms"] - e["start_ms"] for e in r.events if e["stage"] == s and e["name"] == "optimizer")
        assert pieces == pytest.approx(opt[s], rel=1e-9)  # cut in two, the phase is the same work
    # the step: the last stage to reach the barrier, the all-reduce, then the longest clip-and-step (no ZeRO gather)
    parts = r.comm["optimizer_parts_ms_by_stage"]
    norm = np.array(parts["clip_grad_norm"]) * CLIP_NORM_SHARE
    post = opt - norm
    want = float((finish + norm).max()) + r.comm["optimizer_barrier_all_reduce_ms"] + float(post.max())
    host = max((e["end_ms"] - e["start_ms"] for e in r.events if e["name"] == "host.iteration"), default=0.0)
    assert r.step_time_ms == pytest.approx(want + host, rel=1e-12)
    # before: the heavy last stage's step ran beside stage 0's backward, the step was some stage's finish + its own
    assert r.step_time_ms > float((finish + opt).max()) + host + 1.0
    assert r.comm["optimizer_barrier_wait_ms_by_stage"][0] < r.comm["optimizer_barrier_wait_ms_by_stage"][3]


def test_without_a_pipeline_nothing_waits():
    r = wattcast.predict_cluster("gpt2", "DGX-A100", gpus=4, tp=2, batch=16, seq=512, micro_batch=2,
                                 framework="megatron", trace=True)
    assert "optimizer_barriers" not in r.comm
    assert [e["name"] for e in r.events].count("optimizer") == 1
    assert not any(e["name"].endswith("norm_all_reduce") for e in r.events)
