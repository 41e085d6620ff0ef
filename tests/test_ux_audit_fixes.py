"""Stop 46 user audit: flags that changed nothing are refused, ``parallel.name`` writes the strategy's ppf/ppl tokens,
search rows and predict's JSON name the CP communication type, a single-device training step has an MFU, the exposed
communication split has its unattributed rest, and the Chrome trace draws the TP and EP collectives."""

from __future__ import annotations

import collections
import json

import pandas as pd
import pytest

import wattcast
from conftest import flat, run_cli
from wattcast.simulate.parallel import ParallelConfig, ParallelConfigError, check_overlap_p2p_flag
from wattcast.simulate.strategy import format_strategy, parse_strategy

PP = dict(gpus=8, tp=2, pp=2, batch=8, seq=512, micro_batch=1, framework="megatron")


# 1. flags accepted and silently ignored ---------------------------------------------------------------------------

@pytest.mark.parametrize("value, flag", [(False, "--no-overlap-p2p-communication"), (True, "--overlap-p2p-communication")])
def test_overlap_p2p_flag_without_interleave_is_refused_naming_it(value, flag):
    with pytest.raises(ValueError, match=f"{flag} .*needs --interleave 2 or more"):
        wattcast.predict_cluster("gpt2", "DGX-H100", overlap_p2p_comm=value, **PP)
    with pytest.raises(ParallelConfigError, match="Non-interleaved pipeline parallelism"):
        check_overlap_p2p_flag(value, 1)
    check_overlap_p2p_flag(None, 1)  # the framework's default is never refused
    check_overlap_p2p_flag(value, 2)


def test_overlap_p2p_flag_in_a_v1_strategy_is_refused_and_a_v1_string_never_writes_it():
    with pytest.raises(ValueError, match="--overlap-p2p-communication .*--interleave"):
        wattcast.predict_cluster("gpt2", "DGX-H100", seq=512, framework="megatron",
                                 strategy="tp2-pp2-dp2-cp1-ep1-mb1-ga4-zero0-v1-rcnone-1f1b-p2po")
    # a nop2po at v1 (what search --no-overlap wrote before stop 46) reads as the default: old strings stay readable
    kw = dict(seq=512, framework="megatron")
    old = wattcast.predict_cluster("gpt2", "DGX-H100", strategy="tp2-pp2-dp2-cp1-ep1-mb1-ga4-zero0-v1-rcnone-1f1b-nop2po", **kw)
    plain = wattcast.predict_cluster("gpt2", "DGX-H100", strategy="tp2-pp2-dp2-cp1-ep1-mb1-ga4-zero0-v1-rcnone-1f1b", **kw)
    assert old.step_time_ms == plain.step_time_ms
    cfg = ParallelConfig(gpus=8, tp=2, pp=2, dp=2, micro_batch=1, overlap_p2p_comm=False)
    assert "p2po" not in format_strategy(cfg, 8, "megatron")
    v2 = ParallelConfig(gpus=8, tp=2, pp=2, dp=2, micro_batch=1, interleave=2, overlap_p2p_comm=False)
    assert format_strategy(v2, 8, "megatron").endswith("-nop2po")


def test_cli_no_overlap_p2p_without_interleave_is_an_error():
    r = run_cli("predict", "-m", "gpt2", "--cluster", "DGX-H100", "--gpus", "8", "--tp", "2", "--pp", "2", "--batch", "8",
                "--micro-batch", "1", "--seq", "512", "--framework", "megatron", "--no-overlap-p2p-communication", "--json")
    assert r.returncode == 2 and "--no-overlap-p2p-communication" in flat(r.stderr) and "--interleave" in flat(r.stderr)


def test_search_overlap_p2p_goes_to_the_interleaved_candidates_only():
    kw = dict(framework="megatron", tp=(2,), pp=(2,), micro_batch=(1,), zero=(0,), sp=(False,), recompute=("none",))
    with pytest.raises(ValueError, match="--no-overlap-p2p-communication .*--interleave"):
        wattcast.search("gpt2", "DGX-H100", 8, 8, 512, overlaps={"overlap_p2p_comm": False}, interleave=(1,), **kw)
    res = wattcast.search("gpt2", "DGX-H100", 8, 8, 512, overlaps={"overlap_p2p_comm": False}, interleave=(1, 2), **kw)
    rows = res.ranked.set_index("interleave")["strategy"]
    assert not rows.loc[1].endswith("p2po") and rows.loc[2].endswith("-nop2po")
    for text in rows:  # every row's string predicts again (a v1 'nop2po' would be refused)
        assert wattcast.predict_cluster("gpt2", "DGX-H100", seq=512, framework="megatron", strategy=text).step_time_ms > 0


ZKW = dict(gpus=16, batch=32, seq=1024, micro_batch=2, attention="flash", dtype="bf16")


@pytest.mark.parametrize("value, flag", [(True, "--zero3-prefetch"), (False, "--no-zero3-prefetch")])
def test_zero3_prefetch_below_zero3_is_refused(value, flag):
    for zero, fw in ((1, "hf"), (0, "megatron"), (2, "megatron-deepspeed")):
        with pytest.raises(ValueError, match=f"{flag} .*needs --zero 3"):
            wattcast.predict_cluster("gpt2-medium", "DGX-A100", zero=zero, framework=fw, zero3_prefetch=value, **ZKW)
    # hf's ZeRO-2 is FSDP's SHARD_GRAD_OP: its per-unit collectives take it
    assert wattcast.predict_cluster("gpt2-medium", "DGX-A100", zero=2, zero3_prefetch=value, **ZKW).step_time_ms > 0


def test_zero3_prefetch_cli_and_search_refusals():
    r = run_cli("predict", "--model", "gpt2-medium", "--cluster", "DGX-A100", "--gpus", "16", "--batch", "32",
                "--micro-batch", "2", "--zero", "1", "--zero3-prefetch", "--json")
    assert r.returncode == 2 and "--zero3-prefetch" in flat(r.stderr) and "--zero 3" in flat(r.stderr)
    with pytest.raises(ValueError, match="zero choices \\(0, 1\\)"):
        wattcast.search("gpt2-medium", "DGX-A100", 16, 32, 1024, zero3_prefetch=True, max_configs=5)
    s = run_cli("search", "--model", "gpt2-medium", "--cluster", "DGX-A100", "--gpus", "16", "--batch", "32",
                "--zero3-prefetch", "--top", "1")
    assert s.returncode == 2 and "--zero3-prefetch" in flat(s.stderr)
    # search --zero (new) gives it ZeRO-3 candidates; its --json rows name the CP communication type
    ok = run_cli("search", "--model", "gpt2", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "8", "--zero", "3",
                 "--zero3-prefetch", "--workers", "1", "--max-configs", "20", "--json")
    assert ok.returncode == 0, ok.stderr
    rows = json.loads(ok.stdout)["ranked"]
    assert rows and {r["zero"] for r in rows} == {3}
    assert all(r["cp_comm_type"] == "p2p" and r["hierarchical_cp_sizes"] is None for r in rows)


# 2. parallel.name: the strategy string's tokens --------------------------------------------------------------------

@pytest.mark.parametrize("first, last, tail", [(6, None, "-ppf6"), (None, 5, "-ppl5"), (6, 5, "-ppf6-ppl5")])
def test_name_writes_the_strategys_first_and_last_stage_tokens(first, last, tail):
    cfg = ParallelConfig(gpus=128, tp=8, pp=16, dp=1, micro_batch=1, pp_first_layers=first, pp_last_layers=last)
    name = cfg.describe()
    assert name.endswith(tail) and "," not in name
    strategy = format_strategy(cfg, 16)
    assert strategy.endswith(tail)
    assert parse_strategy(strategy).pp_first_layers == first and parse_strategy(strategy).pp_last_layers == last


# 3. CP communication in search rows and predict's JSON; a single-device step's MFU -------------------------------

def test_search_rows_have_the_cp_comm_type_and_sizes():
    res = wattcast.search("llama3_8b", "DGX-H100", 8, 8, 8192, framework="megatron", tp=(1,), pp=(1,), cp=(1, 4),
                          micro_batch=(1,), zero=(1,), sp=(False,), recompute=("full",), interleave=(1,),
                          cp_comm_type=("p2p", "a2a+p2p"), hierarchical_cp_sizes=(2, 2))
    r = res.ranked
    assert {"cp_comm_type", "hierarchical_cp_sizes"} <= set(r.columns)
    got = {(int(cp), t, None if pd.isna(h) else h) for cp, t, h in zip(r["cp"], r["cp_comm_type"],
                                                                     r["hierarchical_cp_sizes"])}
    assert got == {(1, "p2p", None), (4, "p2p", None), (4, "a2a+p2p", "2,2")}
    for row in r.to_dict("records"):  # the columns say what the strategy's cpc token says
        assert ("cpca2a+p2p2x2" in row["strategy"]) == (row["cp_comm_type"] == "a2a+p2p")


def test_predict_json_always_names_the_cp_comm_type():
    d = wattcast.predict_cluster("gpt2", "DGX-H100", **PP).to_dict()
    assert d["parallel"]["cp_comm_type"] == "p2p" and "hierarchical_cp_sizes" not in d["parallel"]


def test_single_device_training_json_has_the_clusters_mfu():
    r = wattcast.predict("gpt2", "H100", batch=4, seq=1024)
    d = json.loads(json.dumps(r.to_dict()))
    # by hand: model FLOPs over step time x H100 SXM's dense BF16 peak (989.4 TFLOP/s, the catalog's datasheet figure)
    assert d["mfu"] == pytest.approx(d["flops"] / (d["step_time_ms"] / 1e3 * 989.4e12), rel=1e-12)
    assert 0.05 < d["mfu"] < 0.6
    one = wattcast.predict_cluster("gpt2", "DGX-H100", gpus=1, batch=4, seq=1024, micro_batch=4)
    assert one.flops == pytest.approx(r.flops, rel=1e-12)  # the same FLOP convention
    assert one.mfu == pytest.approx(one.flops / (one.step_time_ms / 1e3 * 989.4e12), rel=1e-12)
    assert "mfu" not in wattcast.predict("gpt2", "H100", batch=1, seq=128, mode="inference").to_dict()


# 4. + 5. the split's unattributed rest; TP and EP events in the trace ----------------------------------------------

def _events_by_stage(r, prefix: str) -> dict:
    out = collections.defaultdict(float)
    for e in r.events:
        if e["name"].startswith(prefix):
            assert e["stream"] == "comm"
            out[e["stage"]] += e["end_ms"] - e["start_ms"]
    return out


def test_tp_events_add_up_to_the_exposed_tp_of_a_one_stage_step_and_the_split_sums():
    r = wattcast.predict_cluster("gpt2", "DGX-H100", gpus=4, tp=4, batch=4, seq=1024, micro_batch=1,
                                 framework="megatron", trace=True)
    tp = _events_by_stage(r, "tp.all_reduce")
    d = r.to_dict()
    assert d["exposed_comm_split_ms"]["tp"] > 0
    # one stage, nothing to hide behind: freeing TP saves exactly what its events draw
    assert tp[0] == pytest.approx(d["exposed_comm_split_ms"]["tp"], rel=1e-9)
    assert tp[0] == pytest.approx(r.meta["n_micro"] * d["comm"]["task_comm_ms_per_micro_by_stage"]["tp"][0], rel=1e-12)
    assert sum(d["exposed_comm_split_ms"].values()) + d["exposed_comm_unattributed_ms"] == pytest.approx(
        d["exposed_comm_ms"], rel=1e-12)
    # the trace puts them on the tp track; the step is the same with the timeline as without it
    from wattcast.simulate.trace import TRACKS, distributed_trace_events

    assert {e["tid"] for e in distributed_trace_events(r) if e.get("ph") == "X" and e["name"].startswith("tp.")} == {
        TRACKS["tp"][0]}
    plain = wattcast.predict_cluster("gpt2", "DGX-H100", gpus=4, tp=4, batch=4, seq=1024, micro_batch=1,
                                     framework="megatron")
    assert plain.step_time_ms == r.step_time_ms and plain.energy_j == r.energy_j


def test_moe_trace_draws_ep_all_to_alls_per_stage_and_the_split_sums():
    r = wattcast.predict_cluster("mixtral_8x7b", "DGX-H100", gpus=32, tp=2, sp=True, pp=2, ep=8, batch=32, seq=4096,
                                 micro_batch=1, framework="megatron", recompute="full", interleave=2, trace=True)
    d = r.to_dict()
    n = r.meta["n_micro"]
    assert r.meta.get("schedule_extrapolated") is None
    for key, prefix in (("tp", "tp.all_gather+reduce_scatter"), ("ep", "ep.all_to_all")):
        got = _events_by_stage(r, prefix)
        want = d["comm"]["task_comm_ms_per_micro_by_stage"][key]
        assert len(got) == 2 and all(got[s] == pytest.approx(n * want[s], rel=1e-9) for s in (0, 1))
    assert d["exposed_comm_split_ms"]["ep"] > 0 and d["exposed_comm_unattributed_ms"] != 0.0
    assert sum(d["exposed_comm_split_ms"].values()) + d["exposed_comm_unattributed_ms"] == pytest.approx(
        d["exposed_comm_ms"], rel=1e-12)
