"""ZeRO-3 / FSDP collectives beside the computation or in series with it (``zero3_prefetch``): the model, its framework
defaults, the flag on predict and search, and the split of the MPT table the hf default was chosen on."""

from __future__ import annotations

import json

import pytest

import wattcast
from conftest import flat, run_cli
from wattcast.simulate.distributed import FRAMEWORK_ZERO3_PREFETCH, zero3_prefetch

# 2 nodes of 8: FSDP's per-layer collectives cross the network
KW = dict(gpus=16, batch=32, seq=1024, micro_batch=2, zero=3, attention="flash", dtype="bf16")


def test_in_series_adds_the_collectives_prefetched_hides_them():
    pre = wattcast.predict_cluster("gpt2-medium", "DGX-A100", zero3_prefetch=True, **KW)
    ser = wattcast.predict_cluster("gpt2-medium", "DGX-A100", zero3_prefetch=False, **KW)
    assert pre.to_dict()["parallel"]["zero3_prefetch"] is True
    assert ser.to_dict()["parallel"]["zero3_prefetch"] is False
    assert ser.step_time_ms > pre.step_time_ms
    assert ser.exposed_comm_split_ms["dp"] > pre.exposed_comm_split_ms["dp"]
    gained = ser.step_time_ms - pre.step_time_ms
    # never more than the whole of the collectives (what is exposed in series is all of them)
    assert gained <= ser.exposed_comm_split_ms["dp"] + 1e-6
    # the hf framework's default is in series (measured on MosaicML's FSDP runs)
    default = wattcast.predict_cluster("gpt2-medium", "DGX-A100", **KW)
    assert default.step_time_ms == pytest.approx(ser.step_time_ms, rel=1e-12)
    assert FRAMEWORK_ZERO3_PREFETCH["hf"] is False


def test_in_series_exposes_all_of_collectives_longer_than_the_computation():
    """Not prefetched, the step pays computation + collectives even where the collectives are the longer (a small
    per-GPU share: 32 GPUs, 4 nodes); until stop 45 they hid the computation there (max(2 x compute, comm))."""
    kw = dict(gpus=32, batch=32, seq=1024, micro_batch=1, zero=3, framework="hf")
    d = wattcast.predict_cluster("llama3_8b", "dgx-h100", **kw).to_dict()
    z3 = d["comm"]["dp_zero3_ms_per_micro"]
    serial = d["forward_serial_ms"] + d["backward_serial_ms"]
    assert z3 > serial  # the regime the bug hid
    assert d["forward_ms"] + d["backward_ms"] == pytest.approx(serial + z3, rel=1e-3)  # + the batch's loading
    assert d["exposed_comm_split_ms"]["dp"] == pytest.approx(z3, rel=1e-9)


def test_only_zero3_is_affected_and_deepspeed_prefetches():
    kw = dict(KW, zero=1)
    # not a ZeRO-3 step: the flag would change nothing, so it is refused (until stop 46 it was ignored)
    for given in (True, False):
        with pytest.raises(ValueError, match="zero3-prefetch .*needs --zero 3"):
            wattcast.predict_cluster("gpt2-medium", "DGX-A100", zero3_prefetch=given, **kw)
    a = wattcast.predict_cluster("gpt2-medium", "DGX-A100", **kw)
    assert a.to_dict()["parallel"]["zero3_prefetch"] is None  # not a ZeRO-3 step: nothing to say
    ds = wattcast.predict_cluster("gpt2-medium", "DGX-A100", framework="megatron-deepspeed", **KW)
    ds_pre = wattcast.predict_cluster("gpt2-medium", "DGX-A100", framework="megatron-deepspeed", zero3_prefetch=True, **KW)
    assert ds.step_time_ms == ds_pre.step_time_ms and ds.to_dict()["parallel"]["zero3_prefetch"] is True


def test_a_bad_value_is_named():
    with pytest.raises(ValueError, match="zero3_prefetch must be True, False or None"):
        wattcast.predict_cluster("gpt2-medium", "DGX-A100", zero3_prefetch="yes", **KW)
    assert zero3_prefetch("hf", None) is False and zero3_prefetch("megatron", None) is True
    assert zero3_prefetch("hf", True) is True


def test_cli_flag_json_and_single_device_refusal():
    base = ["predict", "--model", "gpt2-medium", "--cluster", "DGX-A100", "--gpus", "16", "--batch", "32", "--seq", "1024",
            "--micro-batch", "2", "--zero", "3", "--attention", "flash", "--dtype", "bf16", "--json"]
    on, off = run_cli(*base, "--zero3-prefetch"), run_cli(*base)
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    a, b = json.loads(on.stdout), json.loads(off.stdout)
    assert a["parallel"]["zero3_prefetch"] is True and b["parallel"]["zero3_prefetch"] is False
    assert a["step_time_ms"] < b["step_time_ms"]
    bad = run_cli("predict", "--model", "gpt2", "--device", "A100-SXM4-80GB", "--no-zero3-prefetch")
    assert bad.returncode == 2 and "need --cluster" in flat(bad.stderr)


def test_search_takes_it_for_every_zero3_candidate():
    kw = dict(max_configs=40, zero=(3,), tp=(1,), pp=(1,))
    pre = wattcast.search("gpt2-medium", "DGX-A100", 16, 32, 1024, zero3_prefetch=True, **kw).ranked
    ser = wattcast.search("gpt2-medium", "DGX-A100", 16, 32, 1024, zero3_prefetch=False, **kw).ranked
    assert len(pre) and len(pre) == len(ser)
    m = pre.merge(ser, on="strategy", suffixes=("_pre", "_ser"))
    assert len(m) == len(pre) and (m["step_time_ms_ser"] > m["step_time_ms_pre"]).all()
    with pytest.raises(ValueError, match="zero3_prefetch"):
        wattcast.search("gpt2-medium", "DGX-A100", 16, 32, 1024, zero3_prefetch=1, **kw)


def test_mpt_split_is_by_whole_models(data_root):
    from wattcast.validation.mpt_validation import load_mpt, split_mpt

    df = load_mpt(data_root)
    fit, ev = split_mpt(df)
    assert set(fit["model"]).isdisjoint(ev["model"]) and len(fit) + len(ev) == len(df)
    assert set(fit["model"]) == {"125m", "760m", "3b", "13b", "70b"}


def test_the_trace_draws_the_zero3_collectives_on_the_communication_stream():
    ser = wattcast.predict_cluster("gpt2-medium", "DGX-A100", trace=True, **KW)
    z3 = [e for e in ser.events if e["name"].startswith("zero3.")]
    tasks = {(e["name"][0], e["start_ms"]): e for e in ser.events if e["stream"] == "compute" and e["name"][0] in "FB"}
    assert z3 and all(e["stream"] == "comm" for e in z3)
    assert {e["name"].rstrip("0123456789") for e in z3} == {"zero3.all_gather", "zero3.all_gather+reduce_scatter"}
    for e in z3:  # each starts with its task and, in series, ends inside it
        task = tasks["B" if "reduce_scatter" in e["name"] else "F", e["start_ms"]]
        assert e["end_ms"] <= task["end_ms"] + 1e-9
    one = wattcast.predict_cluster("gpt2-medium", "DGX-A100", trace=True, **dict(KW, zero=1))
    assert not any(e["name"].startswith("zero3.") for e in one.events)


def test_sweep_spec_takes_it_and_refuses_a_non_boolean():
    from wattcast.sweep import SweepSpecError, load_spec

    base = dict(models=["gpt2-medium"], clusters=["DGX-A100"], gpus=[16], batch=32, seq=1024, space={"zero": [1, 3]})
    plain = load_spec(base).tasks()[0]
    on = load_spec(dict(base, zero3_prefetch=True)).tasks()[0]
    assert "zero3_prefetch" not in plain and on["zero3_prefetch"] is True
    assert on["task_id"] != plain["task_id"]  # a changed setting is a new task, never a stale part
    with pytest.raises(SweepSpecError, match="'zero3_prefetch' must be true or false"):
        load_spec(dict(base, zero3_prefetch="yes"))
    # without a ZeRO-3 choice every task would end with status error: refused at load, naming the spec's keys
    with pytest.raises(SweepSpecError, match="'zero3_prefetch'.*'space'"):
        load_spec(dict(base, space={}, zero3_prefetch=True))


def test_zero3_reports_its_own_traffic_not_a_bucketed_sync_it_never_runs():
    """ZeRO-3 reduces each unit's gradients as its backward ends: no bucketed sync after the backward. comm.dp_sync_ms
    reported one anyway (Llama 3 405B on 512 H100s: 258,696 ms against a 32,762 ms step); it is 0 now and the
    unit-by-unit traffic has its own key, per micro-batch. The step is unchanged (the schedule never ran the buckets)."""
    import wattcast

    kw = dict(gpus=64, batch=64, seq=2048, tp=1, pp=1, micro_batch=1, framework="hf", recompute="full")
    z3 = wattcast.predict_cluster("llama3_8b", "DGX-H100", zero=3, **kw).to_dict()
    assert z3["comm"]["dp_sync_ms"] == 0.0 and z3["comm"]["dp_sync_ms_by_stage"] == [0.0]
    assert 0.0 < z3["comm"]["dp_zero3_ms_per_micro"] and z3["exposed_comm_split_ms"]["dp"] > 0.0
    z1 = wattcast.predict_cluster("llama3_8b", "DGX-H100", zero=1, **kw).to_dict()
    assert z1["comm"]["dp_sync_ms"] > 0.0 and "dp_zero3_ms_per_micro" not in z1["comm"]
