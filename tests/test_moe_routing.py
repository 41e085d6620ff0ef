"""Mixture-of-experts routing as it loads the busiest expert-parallel rank: imbalance, capacity factor, padding."""

from __future__ import annotations

import pytest

import wattcast
from conftest import run_cli
from wattcast.simulate.moe_routing import MoERoutingError, moe_load_factor
from wattcast.simulate.parallel import ParallelConfigError

KW = dict(gpus=16, batch=32, seq=2048, tp=2, pp=1, ep=8, micro_batch=1, sp=True, zero=1, framework="megatron",
          dtype="bf16", attention="flash")


def _step(**kw):
    return wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", **dict(KW, **kw))


def test_load_factor_rules():
    assert moe_load_factor() == 1.0
    assert moe_load_factor(imbalance=1.3, ep=8) == pytest.approx(1.3)
    assert moe_load_factor(imbalance=1.3, ep=1) == 1.0  # one rank holds every expert: every routed token, always
    assert moe_load_factor(imbalance=1.3, capacity_factor=1.1, ep=8) == pytest.approx(1.1)  # dropped beyond capacity
    assert moe_load_factor(imbalance=1.05, capacity_factor=1.1, ep=8) == pytest.approx(1.05)
    assert moe_load_factor(capacity_factor=1.25, pad_to_capacity=True, ep=1) == pytest.approx(1.25)  # padded everywhere
    for kw, msg in ((dict(imbalance=0.9), "from 1"), (dict(imbalance=float("nan")), "from 1"),
                    (dict(imbalance=True), "from 1"), (dict(capacity_factor=0.0), "above 0"),
                    (dict(pad_to_capacity=True), "needs --moe-expert-capacity-factor"),
                    (dict(capacity_factor=1.0, pad_to_capacity="yes"), "true or false")):
        with pytest.raises(MoERoutingError, match=msg):
            moe_load_factor(ep=8, **kw)


def test_a_busier_rank_is_slower_and_fuller_and_model_flops_stay():
    base, busy = _step(), _step(moe_load_imbalance=1.3)
    assert busy.step_time_ms > base.step_time_ms * 1.1  # the experts are most of Mixtral's FLOPs
    assert busy.memory["activations_gb"] > base.memory["activations_gb"]
    assert busy.exposed_comm_split_ms["ep"] > base.exposed_comm_split_ms["ep"]  # it also sends and receives more
    # MFU counts the model's (balanced) FLOPs: the same FLOPs in a longer step
    assert busy.mfu * busy.step_time_ms == pytest.approx(base.mfu * base.step_time_ms, rel=1e-9)
    # and the cluster as a whole runs the same FLOPs: what the busiest rank does more, the others do less
    assert busy.hfu * busy.step_time_ms == pytest.approx(base.hfu * base.step_time_ms, rel=1e-9)
    # dropping beyond capacity caps the busiest rank; capacity 1.0 with any imbalance is the balanced step
    capped = _step(moe_load_imbalance=1.3, moe_capacity_factor=1.1)
    assert base.step_time_ms < capped.step_time_ms < busy.step_time_ms
    assert _step(moe_load_imbalance=1.3, moe_capacity_factor=1.0).step_time_ms == pytest.approx(base.step_time_ms)
    # padding costs the capacity on every rank, balanced or not; without expert parallelism imbalance changes nothing
    assert _step(moe_capacity_factor=1.25, moe_pad_to_capacity=True).step_time_ms > base.step_time_ms
    no_ep = dict(ep=1, gpus=16)
    assert _step(moe_load_imbalance=1.3, **no_ep).step_time_ms == pytest.approx(_step(**no_ep).step_time_ms)


def test_routing_options_need_an_moe_model_and_a_cluster():
    with pytest.raises(ParallelConfigError, match="need a mixture-of-experts model"):
        wattcast.predict_cluster("gpt2", "DGX-H100", gpus=8, batch=16, moe_load_imbalance=1.2)
    with pytest.raises(ParallelConfigError, match="needs --moe-expert-capacity-factor"):
        _step(moe_pad_to_capacity=True)
    r = run_cli("predict", "--model", "mixtral_8x7b", "--device", "H100-SXM5-80GB", "--moe-load-imbalance", "1.2")
    assert r.returncode != 0 and "need --cluster" in r.stderr
    with pytest.raises(ValueError, match="unknown MoE routing option"):
        wattcast.search("mixtral_8x7b", "DGX-H100", 16, 32, 2048, moe_routing=dict(imbalance=1.2))
    with pytest.raises(ValueError, match="from 1"):
        wattcast.search("mixtral_8x7b", "DGX-H100", 16, 32, 2048, moe_routing=dict(moe_load_imbalance=0.5))


def test_cli_flags_reach_the_step():
    args = ["predict", "--model", "mixtral_8x7b", "--cluster", "DGX-H100", "--gpus", "16", "--batch", "32", "--seq", "2048",
            "--tp", "2", "--ep", "8", "--sp", "--zero", "1", "--micro-batch", "1", "--framework", "megatron", "--json"]
    import json

    base = json.loads(run_cli(*args).stdout)["step_time_ms"]
    r = run_cli(*args, "--moe-load-imbalance", "1.3")
    assert r.returncode == 0, r.stderr
    # a CLI process against this one: memoised collective predictions batched differently may differ in the last bits
    assert json.loads(r.stdout)["step_time_ms"] == pytest.approx(_step(moe_load_imbalance=1.3).step_time_ms, rel=1e-6)
    assert json.loads(r.stdout)["step_time_ms"] > base
    table = run_cli(*[a for a in args if a != "--json"], "--moe-load-imbalance", "1.3", "--moe-expert-capacity-factor", "1.1")
    assert table.returncode == 0 and "1.10x their balanced share" in table.stdout


def test_the_trace_and_json_say_the_load(tmp_path):
    import json

    from wattcast.simulate.trace import write_distributed_trace

    p = _step(moe_load_imbalance=1.3, trace=True)
    assert p.meta["moe_load"] == pytest.approx(1.3)
    out = write_distributed_trace(p, tmp_path / "t.json")
    assert json.loads(out.read_text())["otherData"]["moe_load"] == pytest.approx(1.3)
