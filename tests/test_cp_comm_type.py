"""Context parallelism's --cp-comm-type (p2p, a2a, allgather, a2a+p2p): the collectives' bytes from Transformer
Engine's context_parallel.py formulas, the rules, consistency with the ring, the CLI/API/strategy round trip, the trace
and the Megatron-LM CI reading."""

from types import SimpleNamespace

import pytest

from wattcast.simulate.distributed import cp_collectives, cp_tensor_bytes, predict_distributed
from wattcast.simulate.options import DistributedOptions
from wattcast.simulate.parallel import ParallelConfig, ParallelConfigError, resolve_parallel
from wattcast.simulate.strategy import format_strategy, parse_strategy

#: a small GQA config: 16 query heads, 4 key/value heads of 64 (not a built-in: the bytes are computed by hand)
HF = SimpleNamespace(family="llama", n_heads=16, n_kv_heads=4, head_dim=64)
LLAMA = "llama3-8b"
OPTS = dict(batch=8, seq=32768, attention="flash", framework="megatron")


def _predict(**kw):
    par = ParallelConfig(gpus=8, tp=2, cp=4, micro_batch=1, **kw)
    return predict_distributed(LLAMA, "dgx-h100", par, DistributedOptions(**OPTS, comm_split=True))


def test_collective_bytes_follow_transformer_engine():
    # micro-batch 2, 512 tokens per CP rank, tp 2 (8 query heads, 2 kv heads per rank), bf16 (2 B)
    q, k, v, o = cp_tensor_bytes(HF, micro_batch=2, seq_rank=512, tp=2, dtype_bytes=2)
    assert (q, k, v, o) == (2 * 512 * 8 * 64 * 2, 2 * 512 * 2 * 64 * 2, 2 * 512 * 2 * 64 * 2, 2 * 512 * 8 * 64 * 2)
    assert q == 1_048_576 and k == 262_144
    # AttnFuncWithCPAndQKVOA2A: forward all_to_all_single of q, k, v then out; backward of dout then dq, dk, dv
    f, b = cp_collectives("a2a", 4, (q, k, v, o))
    assert f == [("all_to_all", 1_048_576), ("all_to_all", 262_144), ("all_to_all", 262_144), ("all_to_all", 1_048_576)]
    assert b == [("all_to_all", 1_048_576), ("all_to_all", 1_048_576), ("all_to_all", 262_144), ("all_to_all", 262_144)]
    assert cp_collectives("a2a+p2p", 4, (q, k, v, o)) == (f, b)
    # AttnFuncWithCPAndKVAllGather: K and V gathered (cp x 262,144 B each) forward and again backward, dK/dV
    # reduce-scattered from the gathered size
    f, b = cp_collectives("allgather", 4, (q, k, v, o))
    assert f == [("all_gather", 1_048_576), ("all_gather", 1_048_576)]
    assert b == f + [("reduce_scatter", 1_048_576), ("reduce_scatter", 1_048_576)]
    assert cp_collectives("p2p", 4, (q, k, v, o)) == ([], [])


@pytest.mark.parametrize("kw, match", [
    (dict(cp_comm_type="a2a+p2p"), "needs --hierarchical-cp-sizes"),
    (dict(cp_comm_type="a2a+p2p", hierarchical_cp_sizes=(2, 3)), r"product \(6\) must equal cp \(4\)"),
    (dict(cp_comm_type="p2p", hierarchical_cp_sizes=(2, 2)), "a2a\\+p2p only"),
    (dict(cp_comm_type="ring"), "must be one of"),
    (dict(cp_comm_type="a2a"), r"key/value heads per tensor-parallel rank \(4 / tp 2\)"),
])
def test_rule_errors(kw, match):
    with pytest.raises(ParallelConfigError, match=match):
        resolve_parallel(ParallelConfig(gpus=8, tp=2, cp=4, **kw), batch=8, n_layers=2, n_heads=32, n_kv_heads=4,
                         seq=4096)


def test_a2a_heads_rule_passes_when_divisible_and_allgather_normalised():
    r = resolve_parallel(ParallelConfig(gpus=8, tp=1, cp=4, cp_comm_type="a2a"), batch=8, n_layers=2, n_heads=32,
                         n_kv_heads=8, seq=4096)
    assert r.cp_comm_type == "a2a"
    r = resolve_parallel(ParallelConfig(gpus=8, tp=1, cp=4, cp_comm_type="all_gather"), batch=8, n_layers=2, seq=4096)
    assert r.cp_comm_type == "allgather"  # TE's spelling read as the CLI's


def test_a2a_p2p_with_inner_size_one_is_the_ring_and_outer_one_is_a2a():
    """TE attn_forward_func_with_cp: an a2a group of 1 runs p2p, a p2p group of 1 runs a2a."""
    ring, hier = _predict(), _predict(cp_comm_type="a2a+p2p", hierarchical_cp_sizes=(1, 4))
    assert hier.step_time_ms == ring.step_time_ms
    assert hier.exposed_comm_split_ms["cp"] == ring.exposed_comm_split_ms["cp"]
    # and its memory too (issue 15: the a2a's separate output copy was charged though no all-to-all runs)
    assert hier.memory_gb == ring.memory_gb
    assert [r["activations_gb"] for r in hier.per_device] == [r["activations_gb"] for r in ring.per_device]
    # llama3-8b has 8 kv heads: 4 per TP rank, divisible by 4
    a2a, hier = _predict(cp_comm_type="a2a"), _predict(cp_comm_type="a2a+p2p", hierarchical_cp_sizes=(4, 1))
    assert hier.step_time_ms == pytest.approx(a2a.step_time_ms, rel=1e-9)
    # a ring of 1 still runs the all-to-all: the output it saves is not the one it returns, as a2a's
    assert hier.memory_gb == pytest.approx(a2a.memory_gb, rel=1e-12) and hier.memory_gb > ring.memory_gb


def test_comm_types_land_in_the_cp_split_and_the_trace():
    ring = _predict()
    for kw, event in ((dict(cp_comm_type="a2a"), "cp.a2a_qkvo"), (dict(cp_comm_type="allgather"), "cp.allgather_kv"),
                      (dict(cp_comm_type="a2a+p2p", hierarchical_cp_sizes=(2, 2)), "cp.a2a_qkvo")):
        p = _predict(**kw)
        fwd, bwd = p.comm["cp_collective_ms"]
        assert fwd > 0 and bwd > 0 and p.comm["cp_comm_type"] == kw["cp_comm_type"]
        # the a2a / allgather collectives are exposed (TE waits for them before the attention): the cp split grows
        assert p.exposed_comm_split_ms["cp"] > ring.exposed_comm_split_ms["cp"]
        assert p.exposed_comm_split_ms["tp"] == pytest.approx(ring.exposed_comm_split_ms["tp"])
        t = predict_distributed(LLAMA, "dgx-h100", ParallelConfig(gpus=8, tp=2, cp=4, micro_batch=1, **kw),
                                DistributedOptions(**OPTS, trace=True))
        names = {e["name"].rstrip("0123456789") for e in t.events if e["stream"] == "comm"}
        assert event in names
        assert ("cp.ring_kv" in names) == (kw["cp_comm_type"] == "a2a+p2p")
    # the a2a+p2p ring has 2 ranks: one KV step each way instead of cp - 1 = 3
    hier = _predict(cp_comm_type="a2a+p2p", hierarchical_cp_sizes=(2, 2))
    assert hier.comm["cp_kv_step_ms"][0] > 0


def test_strategy_string_round_trips():
    for kw, tok in ((dict(cp_comm_type="a2a"), "cpca2a"), (dict(cp_comm_type="allgather"), "cpcag"),
                    (dict(cp_comm_type="a2a+p2p", hierarchical_cp_sizes=(2, 2)), "cpca2a+p2p2x2")):
        cfg = ParallelConfig(gpus=8, tp=2, cp=4, dp=1, micro_batch=1, **kw)
        s = format_strategy(cfg)
        assert s.endswith(tok)
        back = parse_strategy(s).parallel_config()
        assert (back.cp_comm_type, back.hierarchical_cp_sizes) == (kw["cp_comm_type"], kw.get("hierarchical_cp_sizes"))
    assert "cpc" not in format_strategy(ParallelConfig(gpus=8, tp=2, cp=4, dp=1, micro_batch=1))


def test_search_and_predict_cli_round_trip(tmp_path):
    import json

    from typer.testing import CliRunner

    from wattcast.cli import app

    run = CliRunner()
    res = run.invoke(app, ["search", "-m", LLAMA, "--cluster", "dgx-h100", "--gpus", "8", "--batch", "8", "--seq",
                           "32768", "--attention", "flash", "--framework", "megatron", "--cp", "4",
                           "--cp-comm-type", "a2a+p2p", "--cp-comm-type", "allgather", "--hierarchical-cp-sizes", "2,2",
                           "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout[res.stdout.index("{"):])["ranked"]
    strategies = {r["strategy"].rsplit("-", 1)[-1] for r in rows}
    assert strategies == {"cpca2a+p2p2x2", "cpcag"}
    # the config column (ParallelConfig.describe) carries the strategy's own cpc token (it wrote cp4a2a+p2p2x2 / cp4ag)
    for r in rows:
        assert [t for t in r["config"].split("-") if t.startswith("cp")] == ["cp4", r["strategy"].rsplit("-", 1)[-1]]
    row = next(r for r in rows if r["strategy"].endswith("cpca2a+p2p2x2"))
    res = run.invoke(app, ["predict", "-m", LLAMA, "--cluster", "dgx-h100", "--seq", "32768", "--attention", "flash",
                           "--framework", "megatron", "--strategy", row["strategy"], "--allow-oom", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout[res.stdout.index("{"):])
    assert d["step_time_ms"] == pytest.approx(row["step_time_ms"], rel=1e-9)
    assert d["parallel"]["cp_comm_type"] == "a2a+p2p" and d["parallel"]["hierarchical_cp_sizes"] == [2, 2]
    res = run.invoke(app, ["predict", "-m", LLAMA, "--cluster", "dgx-h100", "--gpus", "8", "--tp", "2", "--cp", "4",
                           "--seq", "32768", "--batch", "8", "--attention", "flash", "--cp-comm-type", "a2a+p2p",
                           "--hierarchical-cp-sizes", "2,2,2"])
    assert res.exit_code != 0 and "two positive integers" in res.output


def test_api_predict_cluster_takes_the_options():
    import wattcast

    p = wattcast.predict_cluster(LLAMA, "dgx-h100", gpus=8, tp=2, cp=4, micro_batch=1, **OPTS,
                                 cp_comm_type="a2a+p2p", hierarchical_cp_sizes=(2, 2))
    assert p.parallel.cp_comm_type == "a2a+p2p" and p.parallel.hierarchical_cp_sizes == (2, 2)


def test_megatron_ci_reads_a2a_p2p(data_root):
    from wattcast.validation.megatron_ci import ci_parallel, ci_unmodelled, load_megatron_ci

    df, _ = load_megatron_ci(data_root)
    r = next(df[df.test_case.str.contains("cp4_a2a_p2p_nondeterministic")].itertuples(index=False))
    par = ci_parallel(r)[0]
    assert (par.cp_comm_type, par.hierarchical_cp_sizes) == ("a2a+p2p", (2, 2))
    assert ci_unmodelled(r) == ""


@pytest.mark.parametrize("flags", [["--cp-comm-type", "a2a"], ["--hierarchical-cp-sizes", "2,2"]])
def test_single_device_predict_refuses_the_cp_flags(flags):
    """Until stop 45c a single-device predict (no --cluster) took --cp-comm-type / --hierarchical-cp-sizes and ignored
    them; they are refused as the other cluster-only flags are."""
    from typer.testing import CliRunner

    from wattcast.cli import app

    res = CliRunner().invoke(app, ["predict", "-m", "gpt2", "--device", "H100-SXM", "--batch", "1", "--seq", "128",
                                   *flags])
    assert res.exit_code != 0 and "need --cluster" in " ".join(res.output.split()), res.output


@pytest.mark.parametrize("kw", [dict(cp_comm_type="a2a"), dict(cp_comm_type="allgather"),
                                dict(cp_comm_type="a2a+p2p", hierarchical_cp_sizes=(1, 1))])
def test_comm_type_at_cp_one_is_refused(kw):
    """A cp 1 job kept the comm type (JSON parallel.cp_comm_type "a2a", nothing costed); resolve_parallel refuses it,
    as --interleave without --pp and --sp without --tp; the ring (p2p) stays accepted."""
    with pytest.raises(ParallelConfigError, match=r"needs --cp > 1"):
        resolve_parallel(ParallelConfig(gpus=8, tp=2, **kw), batch=8, n_layers=2, n_heads=32, n_kv_heads=8, seq=4096)
    r = resolve_parallel(ParallelConfig(gpus=8, tp=2, cp_comm_type="p2p"), batch=8, n_layers=2, seq=4096)
    assert r.cp_comm_type == "p2p"


def test_config_column_parses_for_each_cp_type():
    """ParallelConfig.describe() (the search table's ``config`` column, the JSON's parallel name) wrote cp4a2a / cp4ag /
    cp4a2a+p2p2x2, which parse_strategy refused (and "a2a" read as the EP-overlap token); it now writes the strategy
    string's cpc tokens, so the column parses back to the same CP communication."""
    for kw in (dict(), dict(cp_comm_type="a2a"), dict(cp_comm_type="allgather"),
               dict(cp_comm_type="a2a+p2p", hierarchical_cp_sizes=(2, 2))):
        cfg = ParallelConfig(gpus=16, tp=2, cp=4, dp=2, micro_batch=1, sp=True, zero=1, **kw)
        back = parse_strategy(cfg.describe()).parallel_config()
        assert (back.tp, back.dp, back.cp, back.sp, back.zero) == (2, 2, 4, True, 1)
        assert (back.cp_comm_type, back.hierarchical_cp_sizes) == (kw.get("cp_comm_type", "p2p"),
                                                                   kw.get("hierarchical_cp_sizes"))
        assert back.overlap_moe_expert_parallel_comm is None


#: a small Mistral-style config whose every layer has a 512-key sliding window
WINDOWED = {"model_type": "mistral", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 8,
            "num_hidden_layers": 2, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 8192,
            "sliding_window": 512}


def _windowed(cfg, **kw):
    par = ParallelConfig(gpus=4, tp=1, cp=4, micro_batch=1, **kw)
    return predict_distributed(cfg, "dgx-h100", par, DistributedOptions(batch=1, seq=4096, attention="flash",
                                                                        framework="megatron"))


def test_sliding_window_under_cp_follows_transformer_engine():
    """Transformer Engine 2.20.2 (context_parallel.py l. 5688-5694) runs a sliding window under CP with a2a and
    all_gather only (a2a+p2p with a ring of 1 is a2a). Before, every comm type took the window and ignored it (the
    attention costed as full causal); now p2p / a2a+p2p with a ring are refused, and a2a / allgather cost the window."""
    for kw in (dict(), dict(cp_comm_type="a2a+p2p", hierarchical_cp_sizes=(2, 2))):
        with pytest.raises(ParallelConfigError, match="sliding window.*a2a or allgather only"):
            _windowed(WINDOWED, **kw)
    full = {**WINDOWED, "sliding_window": None}
    assert _windowed(full).step_time_ms > 0  # no window: the ring stays accepted
    for kw in (dict(cp_comm_type="a2a"), dict(cp_comm_type="allgather"),
               dict(cp_comm_type="a2a+p2p", hierarchical_cp_sizes=(4, 1))):
        w, f = _windowed(WINDOWED, **kw), _windowed(full, **kw)
        att = [{o["op_class"]: o["flops"] for o in p.per_op}["flash_attention"] for p in (w, f)]
        # 512 of 4096 keys: the windowed pairs (512 x 4096 - 512 x 511 / 2) over the causal half of 4096^2
        assert att[0] / att[1] == pytest.approx((512 * 4096 - 512 * 511 / 2) / (0.5 * 4096**2))


def test_cp_track_and_legend_are_named_by_the_comm_type():
    """The trace's cp track and the timeline plot's legend say what the --cp-comm-type runs (until stop 48 both said
    "ring KV exchange" for a2a and allgather too); p2p keeps its track name exactly (other tools read it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from wattcast.simulate.trace import TRACKS, distributed_trace_events, timeline_figure

    want = {"p2p": ("comm: cp (ring KV exchange)", "context-parallel ring KV exchange"),
            "a2a": ("comm: cp (all-to-all of Q, K, V, output)", "context-parallel all-to-all (Q, K, V, output)"),
            "allgather": ("comm: cp (KV all-gather, dK/dV reduce-scatter)",
                          "context-parallel KV all-gather / dK, dV reduce-scatter"),
            "a2a+p2p": ("comm: cp (all-to-all of Q, K, V, output; ring KV exchange)",
                        "context-parallel all-to-all + ring KV exchange")}
    for ct, (track, legend) in want.items():
        kw = dict(cp_comm_type=ct, hierarchical_cp_sizes=(2, 2)) if ct == "a2a+p2p" else dict(cp_comm_type=ct)
        res = predict_distributed(LLAMA, "dgx-h100", ParallelConfig(gpus=8, tp=2, cp=4, micro_batch=1, **kw),
                                  DistributedOptions(batch=1, seq=8192, attention="flash", framework="megatron",
                                                     trace=True))
        names = {e["args"]["name"] for e in distributed_trace_events(res)
                 if e.get("name") == "thread_name" and e["tid"] == TRACKS["cp"][0]}
        assert names == {track}
        fig = timeline_figure(res)
        texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        plt.close(fig)
        assert legend in texts and sum("context-parallel" in t for t in texts) == 1
