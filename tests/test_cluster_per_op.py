"""A cluster step's ``per_op`` is what the ranks run over the step, its optimizer phase sharded as ``optimizer_ms`` is
(audit 56b finding 3), and the cluster Chrome trace splits the optimizer event into its parts (finding 7).

Which optimizer parts shard (each rank's kernels over its shard; the step's time model scales them all by the rank's
share, ``opt_share``, and this checks ``per_op`` and the trace follow it):

- Megatron-Core's distributed optimizer (``--framework megatron --zero 1``; megatron-core 0.16.1): the inner optimizer
  holds the rank's shard of the main parameters, so the step is over the shard; ``prepare_grads`` copies only the
  shard's gradients (``distrib_optimizer.py`` ``_copy_model_grads_to_main_grads`` l. 2386-2420) and unscales them with
  the inf/NaN check over the shard (``_collect_main_grad_data_for_unscaling`` l. 2300-2316 feeding
  ``optimizer.py`` ``_unscale_main_grads_and_check_for_nan`` l. 496-522, ``found_inf`` all-reduced over the
  optimizer's ranks, l. 512-516, ``get_grad_stats_parallel_group`` ``distrib_optimizer.py`` l. 620-626);
  ``clip_grad_norm`` takes the norm of the shard's gradients (``get_main_grads_for_grad_norm`` over
  ``get_parameters()``, the inner optimizer's params, ``optimizer.py`` l. 128-162, 203-221), all-reduces it
  (``clip_grads.py`` ``get_grad_norm_fp32`` l. 124-133) and scales the shard.
- DeepSpeed 0.19.8 ZeRO-1/2 (``megatron-deepspeed``): the overflow check over the partition's gradients
  (``zero/stage_1_and_2.py`` ``has_overflow_partitioned_grads_serial`` l. 3229-3235, all-reduced l. 3237-3246), the norm
  over the partition (``scaled_global_norm`` -> ``get_grad_norm_direct`` l. 2648-2700, all-reduced over the DP group
  l. 2693), one multiply that unscales and clips the partition (``unscale_and_clip_grads`` l. 3193-3220), the step on it.
  ``BF16_Optimizer`` (bf16 at ZeRO-0/1) is the exception: its norm and clipping run over the whole gradient
  (``bf16_optimizer.py`` l. 384-433, 547-591), only its step over the partition
  (``distributed.bf16_optimizer_step_bytes``), so its ``clip_grad_norm`` part does not shrink with DP.
- PyTorch FSDP (``hf``, ZeRO-2/3; torch 2.13): ``FullyShardedDataParallel.clip_grad_norm_`` takes the local norm of the
  sharded flat gradients, all-reduces it and scales them (``fully_sharded_data_parallel.py`` l. 1074-1205);
  ``ShardedGradScaler.unscale_`` unscales the local shards and all-reduces ``found_inf``
  (``sharded_grad_scaler.py`` l. 178-225, 235-281); the optimizer holds the flat shards.

Not modelled (step times unchanged): the all-reduce of the norm and of ``found_inf`` (one scalar each, a collective's
latency), and that a launch-bound step does not shrink with the shard (the time model scales the launch gaps too).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattcast
from wattcast.simulate.trace import distributed_trace_events

from conftest import run_cli

AUDIT = dict(gpus=8, dp=8, batch=64, seq=1024, micro_batch=8, dtype="fp16")  # audit 56b finding 3's command


def _by(res) -> dict:
    return {o["op_class"]: o for o in res.per_op}


def _parts(row: dict) -> dict:
    return {p["name"]: p for p in row.get("parts", [])}


def _check_sums(res):
    """per_op adds up to the step's serial forward and backward, its loading and every stage's optimizer step; each
    stage's parts to its optimizer step, the busiest's to optimizer_ms; the optimizer row's parts to the row."""
    d = res.to_dict()
    by_stage = d["comm"]["optimizer_ms_by_stage"]
    # every micro-batch's loading on the stages that read it
    data = sum(o["time_ms"] for o in d["per_op"] if o["op_class"] == "data_loading")
    assert data == pytest.approx(d["comm"]["rank_overheads_ms"]["data_loading_ms"] * res.meta["n_micro"], rel=1e-12)
    assert sum(o["time_ms"] for o in d["per_op"]) == pytest.approx(
        d["forward_serial_ms"] + d["backward_serial_ms"] + data + sum(by_stage), rel=1e-12)
    assert max(by_stage) == pytest.approx(d["optimizer_ms"], rel=1e-12)
    parts = d["comm"]["optimizer_parts_ms_by_stage"]
    assert np.sum(list(parts.values()), axis=0) == pytest.approx(by_stage, rel=1e-12)
    opt = _by(res)["optimizer"]
    assert sum(p["time_ms"] for p in opt["parts"]) == pytest.approx(opt["time_ms"], rel=1e-12)
    # the optimizer-phase classes of per_op hold every stage's optimizer step (fp8 casts: their forward and backward
    # ones too, so the test reads the classes that run in the optimizer phase only)
    opt_classes = [o for o in d["per_op"] if o["op_class"] in ("optimizer", "muon_newton_schulz", "muon_update")]
    if not any(o["op_class"] == "fp8_cast" for o in d["per_op"]):
        assert sum(o["time_ms"] for o in opt_classes) == pytest.approx(sum(by_stage), rel=1e-12)
    return d


def test_the_audit_step_per_op_is_sharded_under_zero_and_adds_up_to_the_step():
    z0 = wattcast.predict_cluster("gpt2", "DGX-A100", zero=0, **AUDIT)
    z1 = wattcast.predict_cluster("gpt2", "DGX-A100", zero=1, **AUDIT)
    for res in (z0, z1):
        _check_sums(res)
        # one stage, one micro-batch: the serial sums are the scheduled ones (no TP, nothing overlapped)
        assert sum(o["time_ms"] for o in res.per_op) == pytest.approx(
            res.forward_ms + res.backward_ms + res.optimizer_ms, rel=1e-9)
        assert _by(res)["optimizer"]["time_ms"] == pytest.approx(res.optimizer_ms, rel=1e-12)
    # ZeRO-1 over 8 ranks: the step, the clipping and the unscaling each an eighth, the kernels the same
    o0, o1 = _by(z0)["optimizer"], _by(z1)["optimizer"]
    assert z1.optimizer_ms == pytest.approx(z0.optimizer_ms / 8, rel=1e-12)  # the time model (unchanged)
    assert o1["time_ms"] == pytest.approx(o0["time_ms"] / 8, rel=1e-12) and o1["count"] == o0["count"]
    assert o1["flops"] == pytest.approx(o0["flops"] / 8, rel=1e-12)
    assert o1["launch_gap_ms"] == pytest.approx(o0["launch_gap_ms"] / 8, rel=1e-12)
    p0, p1 = _parts(o0), _parts(o1)
    assert list(p1) == ["optimizer_step", "clip_grad_norm", "loss_scaling"] and p1["optimizer_step"]["impl"] == "fused"
    for name in p0:
        assert p1[name]["time_ms"] == pytest.approx(p0[name]["time_ms"] / 8, rel=1e-12)
    # the rest of per_op is ZeRO's business only through the step: unchanged
    for k, row in _by(z0).items():
        if k != "optimizer":
            assert _by(z1)[k] == row
    # the rank graph's own overheads stay what they say they are: before sharding
    assert z1.comm["rank_overheads_ms"]["optimizer_step_ms"] == pytest.approx(p0["optimizer_step"]["time_ms"])


def test_per_op_is_the_steps_over_micro_batches_and_stages():
    one = wattcast.predict_cluster("gpt2", "DGX-A100", zero=1, **AUDIT)
    two = wattcast.predict_cluster("gpt2", "DGX-A100", zero=1, **dict(AUDIT, batch=128))  # 2 micro-batches
    assert two.meta["n_micro"] == 2
    _check_sums(two)
    b1, b2 = _by(one), _by(two)
    assert b2["linear"]["time_ms"] == pytest.approx(2 * b1["linear"]["time_ms"], rel=1e-12)
    assert b2["linear"]["count"] == 2 * b1["linear"]["count"]
    assert b2["optimizer"] == b1["optimizer"]  # once per step
    pp = wattcast.predict_cluster("gpt2_medium", "DGX-A100", gpus=8, tp=2, pp=2, batch=32, seq=1024, micro_batch=2,
                                  dtype="bf16", zero=1, sp=True, recompute="selective")
    d = _check_sums(pp)
    # two stages: per_op's optimizer holds both stages' sharded steps (optimizer_ms is the busiest one's)
    assert len(d["comm"]["optimizer_ms_by_stage"]) == 2
    assert _by(pp)["optimizer"]["time_ms"] == pytest.approx(sum(d["comm"]["optimizer_ms_by_stage"]), rel=1e-12)
    assert _by(pp)["optimizer"]["time_ms"] > pp.optimizer_ms


@pytest.mark.parametrize("framework,dtype,extra", [
    ("megatron", "fp16", "main_grad_cast"),  # Megatron-Core's distributed optimizer; fp16 main gradients cast to fp32
    ("megatron", "bf16", None),
    ("hf", "fp16", None),  # --zero 3 below: PyTorch FSDP, ShardedGradScaler
])
def test_each_part_shards_with_the_distributed_optimizer_and_fsdp(framework, dtype, extra):
    kw = dict(gpus=8, batch=32, seq=512, micro_batch=2, dtype=dtype, framework=framework,
              **(dict(pp=2) if framework == "megatron" else {}))
    z = 1 if framework == "megatron" else 3
    plain = wattcast.predict_cluster("gpt2_medium", "DGX-A100", zero=0, **kw)
    shard = wattcast.predict_cluster("gpt2_medium", "DGX-A100", zero=z, **kw)
    _check_sums(plain)
    _check_sums(shard)
    dp = shard.parallel.dp
    p0, p1 = _parts(_by(plain)["optimizer"]), _parts(_by(shard)["optimizer"])
    names = {"optimizer_step", "clip_grad_norm"} | ({"loss_scaling"} if dtype == "fp16" else set())
    assert names <= set(p1)
    for name in names:  # the step, the clipping and the fp16 unscaling each over the rank's shard
        assert p1[name]["time_ms"] == pytest.approx(p0[name]["time_ms"] / dp, rel=1e-9), name
        assert p1[name]["count"] == p0[name]["count"]
    if extra:  # Megatron-Core's cast of the shard's half-precision main gradients: in the step, a part of its own
        assert p1[extra]["time_ms"] > 0 and p1[extra]["count"] == 0
        assert shard.comm["optimizer_parts_ms_by_stage"]["main_grad_cast"][0] == pytest.approx(
            p1[extra]["time_ms"] / 2, rel=0.05)


def test_bf16_optimizer_clips_the_whole_gradient_and_steps_the_partition():
    """DeepSpeed's BF16_Optimizer (megatron-deepspeed, bf16, ZeRO-0): its norm and clipping stay the whole stage's as
    DP grows, its step shrinks; its buffer passes (the casts around the all-reduce, the zeroing) are a part of their own."""
    kw = dict(seq=512, micro_batch=2, dtype="bf16", framework="megatron-deepspeed", zero=0, pp=2)
    dp2 = wattcast.predict_cluster("gpt2_medium", "DGX-A100", gpus=4, batch=16, **kw)
    dp4 = wattcast.predict_cluster("gpt2_medium", "DGX-A100", gpus=8, batch=32, **kw)
    for res in (dp2, dp4):
        _check_sums(res)
    a, b = _parts(_by(dp2)["optimizer"]), _parts(_by(dp4)["optimizer"])
    assert set(b) == {"optimizer_step", "clip_grad_norm", "grad_buffer"}
    # (not exactly the same: the pass takes out the graph's sharded clipping row as 12 B/param at the streaming rate,
    # while the row itself was costed by the kernel model, a few % apart)
    assert b["clip_grad_norm"]["time_ms"] == pytest.approx(a["clip_grad_norm"]["time_ms"], rel=0.05)
    assert b["optimizer_step"]["time_ms"] == pytest.approx(a["optimizer_step"]["time_ms"] / 2, rel=1e-9)
    # ZeRO-1 shards the same: the clipping would halve were it over the partition
    assert b["clip_grad_norm"]["time_ms"] > 0.9 * a["clip_grad_norm"]["time_ms"]


def test_search_summary_and_predict_cluster_agree_on_per_op():
    from dataclasses import replace

    from wattcast.simulate.distributed import StepSummary, schedule_context, schedule_step
    from wattcast.simulate.parallel import ParallelConfig

    par = ParallelConfig(gpus=16, tp=2, pp=2, zero=1, micro_batch=1)
    ctx = schedule_context("gpt2_medium", "DGX-A100", gpus=16, batch=32, seq=1024, parallel=par, dtype="fp16",
                           attention="flash", comm_split=False, prune_oom=True, exact_pipeline=False)
    full = schedule_step(replace(ctx, detail=False, memo={}))
    s = schedule_step(replace(ctx, detail=False, summary=True, memo={}))
    assert isinstance(s, StepSummary) and s.n_micro == full.meta["n_micro"] == 8  # 32 / (dp 4 x 1)
    opt = {o["op_class"]: o for o in s.optimizer_per_op}["optimizer"]
    want = _by(full)["optimizer"]
    assert opt["time_ms"] == pytest.approx(want["time_ms"], rel=1e-12) and opt["count"] == want["count"]
    assert want["time_ms"] == pytest.approx(sum(full.comm["optimizer_ms_by_stage"]), rel=1e-12)


def test_the_cluster_trace_splits_the_optimizer_into_its_parts(tmp_path):
    res = wattcast.predict_cluster("gpt2_medium", "DGX-A100", gpus=8, pp=2, batch=16, seq=512, micro_batch=2,
                                   dtype="fp16", zero=1, trace=True)
    ev = distributed_trace_events(res)
    # two stages: the phase in two pieces, cut at the global norm's all-reduce (the local norm, a third of the
    # clipping's bytes, before it; the scale and the step after it)
    assert res.comm["optimizer_barriers"] == ["grad_norm"]
    want = res.comm["optimizer_parts_ms_by_stage"]
    for s in (0, 1):
        opt = sorted((e for e in ev if e.get("ph") == "X" and e["pid"] == s and e["name"] == "optimizer"),
                     key=lambda e: e["ts"])
        assert len(opt) == 2
        names, got = [], {}
        for o in opt:
            kids = [e for e in ev if e.get("ph") == "X" and e["pid"] == s and e["tid"] == o["tid"]
                    and o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"] + 1e-9 and e is not o]
            assert kids[0]["ts"] == o["ts"]
            assert kids[-1]["ts"] + kids[-1]["dur"] == pytest.approx(o["ts"] + o["dur"], abs=1e-6)
            assert sum(k["dur"] for k in kids) == pytest.approx(o["dur"], abs=1e-3)  # back to back, to the nanosecond
            for k in kids:
                names.append(k["name"])
                got[k["name"]] = got.get(k["name"], 0.0) + k["dur"] / 1e3
                assert o["args"][f"{k['name']}_ms"] == pytest.approx(k["dur"] / 1e3, abs=2e-6)
        assert names == ["loss_scale.unscale", "clip_grad_norm", "clip_grad_norm", "adamw.step"]
        for name, ms in got.items():
            assert ms == pytest.approx(want[name][s], abs=4e-6)
        assert sum(o["dur"] for o in opt) / 1e3 == pytest.approx(res.comm["optimizer_ms_by_stage"][s], abs=4e-6)
        ar = [e for e in ev if e.get("ph") == "X" and e["pid"] == s and e["name"] == "pp.grad_norm_all_reduce"]
        assert len(ar) == 1 and opt[0]["ts"] + opt[0]["dur"] <= ar[0]["ts"] + 1e-3
        assert ar[0]["ts"] + ar[0]["dur"] == pytest.approx(opt[1]["ts"], abs=1e-3)
    # the CLI writes the same (fp32: no loss scaling), and the step's table names the parts
    path = tmp_path / "c.json"
    r = run_cli("predict", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", "--dp", "8", "-b", "64", "-s", "1024",
                "--micro-batch", "8", "--dtype", "fp32", "--zero", "1", "--trace", path)
    assert r.returncode == 0, r.stderr
    names = [e["name"] for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert names.count("optimizer") == 1 and names.count("adamw.step") == 1 and names.count("clip_grad_norm") == 1
    assert "loss_scale.unscale" not in names
    assert "of which optimizer step (fused)" in r.stdout and "of which clip_grad_norm" in r.stdout


def test_the_cli_json_per_op_is_the_python_apis():
    r = run_cli("predict", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", "--dp", "8", "-b", "64", "-s", "1024",
                "--micro-batch", "8", "--dtype", "fp16", "--zero", "1", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    api = wattcast.predict_cluster("gpt2", "DGX-A100", zero=1, **AUDIT).to_dict()
    assert d["per_op"] == json.loads(json.dumps(api["per_op"]))
    assert sum(o["time_ms"] for o in d["per_op"]) == pytest.approx(
        d["forward_ms"] + d["backward_ms"] + d["optimizer_ms"], rel=1e-9)
