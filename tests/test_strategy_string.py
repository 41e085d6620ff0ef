"""Strategy strings (simulate/strategy.py): they round-trip, search prints one per row, and predicting a search row's
string (CLI --strategy or the Python API's strategy=) gives exactly that row's step time and memory."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import replace

import pytest
from typer.testing import CliRunner

import wattcast
from conftest import flat
from wattcast.cli import app
from wattcast.simulate.parallel import ParallelConfig, ParallelConfigError, resolve_parallel
from wattcast.simulate.strategy import Strategy, StrategyError, format_strategy, parse_strategy, strategy_values

runner = CliRunner()


def run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert not (r.exception and not isinstance(r.exception, SystemExit)), f"traceback: {r.exception!r}"
    return r


def _resolved(framework="hf", **kw):
    return resolve_parallel(ParallelConfig(**kw), batch=64, n_layers=24, n_heads=16, ffn=4096, seq=2048,
                            framework=framework)


# ------------------------------------------------------------------------------------------ the string itself
CASES = [dict(gpus=8, tp=2, pp=2, micro_batch=2), dict(gpus=16, tp=2, pp=4, micro_batch=1, interleave=2, zero=1, sp=True),
         dict(gpus=8, tp=1, pp=2, micro_batch=4, schedule="gpipe", recompute="full"),
         dict(gpus=16, tp=2, pp=1, cp=2, micro_batch=1, zero=3, recompute="selective", sp=True),
         dict(gpus=8, tp=1, pp=4, micro_batch=1, pp_first_layers=5, pp_last_layers=5)]


@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("framework", ["hf", "megatron"])
def test_format_then_parse_gives_the_same_configuration(kw, framework):
    if framework == "megatron" and kw.get("zero", 0) > 1 and kw.get("pp", 1) > 1:
        pytest.skip("megatron runs pipelines with ZeRO-1 at most")
    if framework == "hf" and kw.get("cp", 1) > 1:
        pytest.skip("hf refuses context parallelism (parallel.HF_CP_MESSAGE; tests/test_hf_context_parallel_refused.py)")
    cfg = _resolved(framework, **kw)
    text = format_strategy(cfg, 64, framework)
    st = parse_strategy(text)
    assert st.global_batch == 64 and st.gpus == cfg.gpus
    back = resolve_parallel(st.parallel_config(), batch=64, n_layers=24, n_heads=16, ffn=4096, seq=2048, framework=framework)
    assert back == cfg
    assert format_strategy(back, 64, framework) == text  # canonical: the same string again


@pytest.mark.parametrize("flags", list(itertools.product([False, True], repeat=3)))
def test_overlap_flags_round_trip_under_megatron(flags):
    ogr, opg, tpo = flags
    kw = dict(gpus=8, tp=2, pp=1, micro_batch=1, zero=1, sp=True)  # every overlap allowed; megatron's defaults: all on
    if opg and not ogr:  # Megatron-LM's validate_args: 'Must use --overlap-param-gather with --overlap-grad-reduce'
        with pytest.raises(ParallelConfigError, match="overlap-grad-reduce"):
            _resolved("megatron", overlap_grad_reduce=ogr, overlap_param_gather=opg, tp_comm_overlap=tpo, **kw)
        return
    cfg = _resolved("megatron", overlap_grad_reduce=ogr, overlap_param_gather=opg, tp_comm_overlap=tpo, **kw)
    text = format_strategy(cfg, 64, "megatron")
    back = resolve_parallel(parse_strategy(text).parallel_config(), batch=64, n_layers=24, n_heads=16, ffn=4096, seq=2048,
                            framework="megatron")
    assert (back.overlap_grad_reduce, back.overlap_param_gather, back.tp_comm_overlap) == flags
    # the framework's default is written as nothing; a deviation as a token
    assert ("noogr" in text.split("-")) == (not ogr) and ("ogr" in text.split("-")) is False


def test_hf_rows_carry_no_overlap_tokens_and_tokens_may_come_in_any_order():
    cfg = _resolved(gpus=8, tp=2, pp=2, micro_batch=2, zero=1)
    text = format_strategy(cfg, 64)
    assert text == "tp2-pp2-dp2-cp1-ep1-mb2-ga16-zero1-v1-rcnone-1f1b"
    shuffled = "-".join(reversed(text.split("-")))
    assert parse_strategy(shuffled) == parse_strategy(text)
    assert parse_strategy("TP2-pp2-dp2-mb2") == Strategy(tp=2, pp=2, dp=2, micro_batch=2)  # defaults for the rest


@pytest.mark.parametrize("text, bad", [
    ("tp2-pp1-dp4-mb1-zero5", "zero5"), ("tp2-pp1-dp4-mb1-foo", "foo"), ("tp2-pp1-dp4-mbx", "mbx"),
    ("tp0-pp1-dp4-mb1", "tp0"), ("tp2-pp1-dp4-mb1-rcpartial", "rcpartial"), ("tp2-pp1-dp4-mb1-", "bad token ''"),
    ("tp2-pp1-dp4-mb1-v0", "v0"), ("tp2-pp1-dp4-mb1-tp4", "tp4"), ("tp2-pp1-dp4-mb1-ogr-noogr", "noogr"),
])
def test_malformed_strings_name_the_bad_token(text, bad):
    with pytest.raises(StrategyError, match=re.escape(bad)):
        parse_strategy(text)


def test_missing_required_tokens_are_named():
    with pytest.raises(StrategyError, match=r"lacks dp<N>, mb<N>"):
        parse_strategy("tp2-pp1")
    for v in ("", "   ", None, 3):
        with pytest.raises(StrategyError, match="non-empty string"):
            parse_strategy(v)


def test_format_needs_a_resolved_configuration_and_a_dividing_batch():
    with pytest.raises(StrategyError, match="resolve it first"):
        format_strategy(ParallelConfig(gpus=8, tp=2))
    with pytest.raises(StrategyError, match="not a multiple"):
        format_strategy(_resolved(gpus=8, tp=2, pp=1, micro_batch=2), 63)


def test_values_merge_agreeing_options_and_name_conflicting_ones():
    v = strategy_values("tp2-pp1-dp4-mb2-ga4-sp", dict(tp=2, batch=32, sp=True))
    assert v["gpus"] == 8 and v["batch"] == 32 and v["sp"] is True
    with pytest.raises(StrategyError, match=r"--tp 4 conflicts .* sets tp = 2"):
        strategy_values("tp2-pp1-dp4-mb2", dict(tp=4), label=lambda k: "--" + k)
    with pytest.raises(StrategyError, match=r"batch 16 conflicts .* dp x mb x ga = 32"):
        strategy_values("tp2-pp1-dp4-mb2-ga4", dict(batch=16))
    with pytest.raises(StrategyError, match=r"sp False conflicts"):
        strategy_values("tp2-pp1-dp4-mb2-sp", dict(sp=False))
    # an overlap the string leaves to the framework may be given
    assert strategy_values("tp2-pp1-dp4-mb2", dict(overlap_grad_reduce=True))["overlap_grad_reduce"] is True


# ------------------------------------------------------------------------------ search -> predict, exactly
SEARCH = dict(gpus=8, batch=16, seq=1024, max_configs=40)


@pytest.fixture(scope="module")
def searched():
    return wattcast.search("gpt2_medium", "DGX-H100", **SEARCH)


def test_every_search_row_has_a_strategy_that_parses_to_its_columns(searched):
    df = searched.ranked
    assert len(df) > 10 and df["strategy"].is_unique
    for r in df.to_dict("records"):
        st = parse_strategy(r["strategy"])
        assert (st.tp, st.pp, st.dp, st.cp, st.micro_batch, st.zero, st.sp, st.recompute, st.interleave) == (
            r["tp"], r["pp"], r["dp"], r["cp"], r["micro_batch"], r["zero"], r["sp"], r["recompute"], r["interleave"])
        assert st.global_batch == SEARCH["batch"] and st.gpus == SEARCH["gpus"] and st.grad_accum == r["grad_accum"]


def test_predict_cluster_with_a_search_rows_strategy_gives_exactly_its_figures(searched):
    rows = searched.ranked.head(4).to_dict("records") + searched.ranked.tail(2).to_dict("records")
    for r in rows:
        p = wattcast.predict_cluster("gpt2_medium", "DGX-H100", seq=SEARCH["seq"], strategy=r["strategy"])
        # time and energy to the last bits but one: the search's summary schedule and predict_cluster's detailed one
        # round the last bit differently on some rows (tp4-pp1-dp2-mb1 of this job: 94.00181402378487 against
        # ...489; there at f2d9290 too, on rows this test did not sample until the stop-56 default candidate set);
        # anything beyond 1e-12 is a real disagreement
        assert p.step_time_ms == pytest.approx(r["step_time_ms"], rel=1e-12, abs=0) and p.memory_gb == r["memory_gb"], r["strategy"]
        assert p.energy_j == pytest.approx(r["energy_j"], rel=1e-12, abs=0) and p.fits == r["fits"]
        assert p.parallel.describe() == r["config"]


def test_predict_cluster_strategy_conflicts_and_missing_sizes_are_named(searched):
    s = searched.best["strategy"]
    st = parse_strategy(s)
    with pytest.raises(ValueError, match=rf"tp {st.tp * 2} conflicts"):
        wattcast.predict_cluster("gpt2_medium", "DGX-H100", seq=1024, strategy=s, tp=st.tp * 2)
    with pytest.raises(ValueError, match="gpus 4 conflicts"):
        wattcast.predict_cluster("gpt2_medium", "DGX-H100", seq=1024, strategy=s, gpus=4)
    with pytest.raises(TypeError, match="needs batch="):
        wattcast.predict_cluster("gpt2_medium", "DGX-H100", seq=1024, strategy="tp1-pp1-dp8-mb1")
    same = wattcast.predict_cluster("gpt2_medium", "DGX-H100", seq=1024, strategy=s, gpus=8, batch=16, tp=st.tp)
    assert same.step_time_ms == searched.best["step_time_ms"]
    with pytest.raises(TypeError, match="needs gpus="):
        wattcast.predict_cluster("gpt2_medium", "DGX-H100", batch=8)


@pytest.mark.parametrize("framework, extra", [("hf", []), ("megatron", ["--no-overlap"]), ("megatron", [])])
def test_cli_search_then_predict_strategy_gives_the_same_step(framework, extra):
    r = run("search", "-m", "gpt2_medium", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "16", "--seq", "1024",
            "--max-configs", "30", "--framework", framework, *extra, "--json")
    assert r.exit_code == 0, r.output
    ranked = json.loads(r.stdout)["ranked"]
    assert all(isinstance(x["strategy"], str) for x in ranked)
    if extra:
        assert any("noogr" in x["strategy"] for x in ranked)  # the overlaps megatron would have on are written off
    for row in ranked[:3]:
        p = run("predict", "-m", "gpt2_medium", "--cluster", "DGX-H100", "--seq", "1024", "--framework", framework,
                "--strategy", row["strategy"], "--json", "--allow-oom")
        assert p.exit_code == 0, p.output
        d = json.loads(p.stdout)
        assert d["step_time_ms"] == row["step_time_ms"] and d["memory_gb"] == row["memory_gb"]
        assert d["parallel"]["name"] == row["config"]


def test_cli_search_table_prints_the_strategy():
    r = run("search", "-m", "gpt2", "--cluster", "nvlink-4gpu", "--gpus", "4", "--batch", "8", "--seq", "512",
            "--max-configs", "5", "--top", "3")
    assert r.exit_code == 0, r.output
    assert "strategy" in r.stdout and "-rcnone-1f1b" in r.stdout


def test_cli_predict_strategy_errors():
    base = ("predict", "-m", "gpt2", "--cluster", "nvlink-4gpu", "--seq", "512")
    r = run(*base, "--strategy", "tp2-pp1-dp2-mb1-ga4-zero9")
    assert r.exit_code == 2 and "bad token 'zero9'" in flat(r.stderr)
    r = run(*base, "--strategy", "tp2-pp1-dp2-mb1-ga4", "--tp", "1")
    assert r.exit_code == 2 and "--tp 1 conflicts" in flat(r.stderr)
    r = run(*base, "--strategy", "tp2-pp1-dp2-mb1-ga4", "--pp", "2")
    assert r.exit_code == 2 and "--pp 2 conflicts" in flat(r.stderr)
    r = run(*base, "--strategy", "tp2-pp1-dp2-mb1-ga4", "--batch", "4")
    assert r.exit_code == 2 and "--batch 4 conflicts" in flat(r.stderr) and "dp x mb x ga = 8" in flat(r.stderr)
    r = run(*base, "--strategy", "tp2-pp1-dp2-mb1-ga4", "--sp")
    assert r.exit_code == 2 and "--sp True conflicts" in flat(r.stderr)
    r = run(*base, "--strategy", "tp2-pp1-dp2-mb1")
    assert r.exit_code == 2 and "needs --batch" in flat(r.stderr)
    r = run("predict", "-m", "gpt2", "-d", "H100", "--strategy", "tp2-pp1-dp2-mb1-ga4")
    assert r.exit_code == 2 and "needs --cluster" in flat(r.stderr)
    # agreeing flags are fine, and the default-valued flags nobody typed do not conflict
    ok = run(*base, "--strategy", "tp2-pp1-dp2-mb1-ga4", "--tp", "2", "--batch", "8", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["parallel"]["tp"] == 2


def test_strategy_dataclass_replace_keeps_fields():
    st = parse_strategy("tp2-pp2-dp2-mb1-ga8-v2-zero1-rcfull-ppf3")
    assert replace(st, tp=4).gpus == 16 and st.pp_first_layers == 3 and st.recompute == "full" and st.interleave == 2


def test_rows_name_the_settings_a_strategy_string_does_not_carry():
    res = wattcast.search("gpt3_xl", "DGX-H100", 8, 8, 1024, dtype="fp8", framework="Megatron", max_configs=4)
    r = res.ranked.iloc[0]
    assert (r["dtype"], r["attention"], r["framework"]) == ("fp8", "flash", "megatron")
    p = wattcast.predict_cluster("gpt3_xl", "DGX-H100", seq=1024, strategy=r["strategy"], dtype=r["dtype"],
                                 attention=r["attention"], framework=r["framework"])
    # the same figures; after the whole suite's caches the two paths may sum in another order (a 1-ulp difference was
    # seen at stop 40: 26.125168831552507 vs 26.12516883155251 ms), so equal to 1e-12, not bit for bit
    assert p.step_time_ms == pytest.approx(r["step_time_ms"], rel=1e-12, abs=0)
    assert p.memory_gb == pytest.approx(r["memory_gb"], rel=1e-12, abs=0)


def test_blocking_pipeline_transfers_round_trip_as_nop2po():
    cfg = _resolved("megatron", gpus=16, tp=2, pp=4, micro_batch=1, interleave=2, overlap_p2p_comm=False)
    text = format_strategy(cfg, 64, "megatron")
    assert "nop2po" in text.split("-")
    back = resolve_parallel(parse_strategy(text).parallel_config(), batch=64, n_layers=24, n_heads=16, ffn=4096, seq=2048,
                            framework="megatron")
    assert back.overlap_p2p_comm is False and back == cfg
    # megatron's default (on) is written as nothing
    assert "p2po" not in format_strategy(_resolved("megatron", gpus=16, tp=2, pp=4, micro_batch=1, interleave=2), 64,
                                         "megatron")
