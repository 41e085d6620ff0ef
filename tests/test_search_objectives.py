"""Search answers a run's questions: with tokens, every fitting row has its time to train, cloud cost, energy and CO2e
(the same figures predict_cluster(..., tokens=) gives), ranked by an objective, filtered by constraints, cut to the
Pareto front over time x cost x CO2e, written to JSON/CSV/Parquet and plotted; where each price and intensity comes
from is in the output; bad names are refused before anything is evaluated."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import wattcast
from conftest import flat
from wattcast.cli import app
from wattcast.planning import search as search_mod
from wattcast.planning.search import OBJECTIVES, RUN_COLUMNS, pareto_mask

runner = CliRunner()
MODEL, CLUSTER = "gpt2_medium", "DGX-H100"
JOB = dict(gpus=8, batch=16, seq=1024, max_configs=40)
TOKENS = 2e10


def run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert not (r.exception and not isinstance(r.exception, SystemExit)), f"traceback: {r.exception!r}"
    return r


CLI = ("search", "-m", MODEL, "--cluster", CLUSTER, "--gpus", "8", "--batch", "16", "--seq", "1024", "--max-configs", "40")


@pytest.fixture(scope="module")
def runs():
    return wattcast.search(MODEL, CLUSTER, tokens=TOKENS, footprint_kw=dict(region="aws:us-east-1"), **JOB)


def _fit(df):
    return df[df["fits"].astype(bool)]


# ------------------------------------------------------------------------------------------------ the run columns
def test_run_figures_per_fitting_row_match_predict_cluster(runs):
    df = runs.ranked
    assert set(RUN_COLUMNS) <= set(df.columns)
    fit = _fit(df)
    assert len(fit) > 5
    assert np.allclose(fit["run_days"], fit["run_hours"] / 24)
    assert np.allclose(fit["run_cloud_usd"], fit["run_gpu_hours"] * fit["cloud_usd_per_gpu_hour"])
    for r in fit.head(3).to_dict("records"):
        p = wattcast.predict_cluster(MODEL, CLUSTER, seq=1024, strategy=r["strategy"], tokens=TOKENS, region="aws:us-east-1")
        run_ = p.run
        assert run_.hours == pytest.approx(r["run_hours"], rel=1e-12)
        assert run_.cloud_usd == pytest.approx(r["run_cloud_usd"], rel=1e-12)
        assert run_.total_tco2e == pytest.approx(r["run_tco2e"], rel=1e-12)
        assert run_.energy_mwh == pytest.approx(r["run_energy_mwh"], rel=1e-12)
        assert run_.tco_usd == pytest.approx(r["run_tco_usd"], rel=1e-12)


def test_sources_and_region_flags_are_explicit(runs):
    fit = _fit(runs.ranked)
    r = fit.iloc[0]
    assert r["grid_region"] == "aws:us-east-1" and bool(r["grid_region_specific"]) and "CodeCarbon" in r["grid_source"]
    # the region's own electricity price (its state's row of the shipped table), and the output says where from
    assert bool(r["electricity_region_specific"]) and "US-VA" in r["electricity_source"] and "EIA" in r["electricity_source"]
    assert r["cloud_pricing"] == "on-demand"
    assert "us-east-1" in r["cloud_price_source"] and r["cloud_usd_per_gpu_hour"] > 0
    world = wattcast.search(MODEL, CLUSTER, tokens=TOKENS, **dict(JOB, max_configs=3))
    w = _fit(world.ranked).iloc[0]
    assert not bool(w["grid_region_specific"]) and w["grid_region"] == "world"
    # no region: the global default electricity price, said as not region-specific
    assert not bool(w["electricity_region_specific"]) and "not region-specific" in w["electricity_source"]
    assert w["electricity_usd_per_kwh"] == 0.08
    given = wattcast.search(MODEL, CLUSTER, tokens=TOKENS, footprint_kw=dict(electricity_usd_per_kwh=0.2,
                                                                            grid_kgco2e_per_kwh=0.05),
                            **dict(JOB, max_configs=3))
    g = _fit(given.ranked).iloc[0]
    assert bool(g["electricity_region_specific"]) and g["electricity_source"] == "given" and g["electricity_usd_per_kwh"] == 0.2
    assert bool(g["grid_region_specific"]) and g["grid_basis"] == "explicit" and g["grid_kgco2e_per_kwh"] == 0.05


def test_pue_changes_energy_in_proportion():
    a = wattcast.search(MODEL, CLUSTER, tokens=TOKENS, footprint_kw=dict(pue=1.2), **dict(JOB, max_configs=3))
    b = wattcast.search(MODEL, CLUSTER, tokens=TOKENS, footprint_kw=dict(pue=1.5), **dict(JOB, max_configs=3))
    ra, rb = _fit(a.ranked).iloc[0], _fit(b.ranked).iloc[0]
    assert ra["strategy"] == rb["strategy"] and rb["run_energy_mwh"] / ra["run_energy_mwh"] == pytest.approx(1.25)
    assert rb["pue"] == 1.5


# ------------------------------------------------------------------------------------------------ objectives
@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_objective_ranks_the_fitting_rows(objective):
    res = wattcast.search(MODEL, CLUSTER, tokens=TOKENS, objective=objective, **JOB)
    df = res.ranked
    n = int(df["fits"].sum())
    assert df["fits"].iloc[:n].all() and not df["fits"].iloc[n:].any()  # fitting rows first
    col = OBJECTIVES[objective]
    assert df[col].iloc[:n].is_monotonic_increasing
    assert res.best["strategy"] == df.iloc[0]["strategy"]


def test_objectives_order_differently_when_they_disagree(runs):
    fit = _fit(runs.ranked)
    by_time = fit.sort_values("step_time_ms", kind="mergesort")["strategy"].tolist()
    by_co2 = fit.sort_values("run_tco2e", kind="mergesort")["strategy"].tolist()
    co2 = wattcast.search(MODEL, CLUSTER, tokens=TOKENS, footprint_kw=dict(region="aws:us-east-1"), objective="co2e", **JOB)
    assert _fit(co2.ranked)["strategy"].tolist()[:5] == by_co2[:5]
    if by_time[:5] != by_co2[:5]:  # power differs between strategies, so CO2e need not follow time
        assert _fit(co2.ranked)["strategy"].tolist()[:5] != by_time[:5]


def test_energy_objective_without_tokens_ranks_by_step_energy():
    res = wattcast.search(MODEL, CLUSTER, objective="energy", **JOB)
    fit = _fit(res.ranked)
    assert fit["energy_j"].is_monotonic_increasing


@pytest.mark.parametrize("kw, msg", [
    (dict(objective="cost"), "give tokens"), (dict(objective="co2e"), "give tokens"), (dict(max_usd=1e6), "max_usd"),
    (dict(deadline_days=3), "deadline_days"), (dict(pareto=True), "pareto"), (dict(objective="speed"), "objective must be"),
    (dict(tokens=1e9, max_usd=-1), "max_usd must be"), (dict(tokens=1e9, deadline_days=float("nan")), "deadline_days"),
    (dict(tokens=1e9, max_tco2e="x"), "max_tco2e"), (dict(tokens=1e9, pareto="yes"), "pareto must be"),
])
def test_bad_goals_are_named_before_evaluating(kw, msg, monkeypatch):
    monkeypatch.setattr(search_mod, "schedule_context", _no_evaluation)  # where a search starts evaluating
    monkeypatch.setattr(search_mod, "schedule_step", _no_evaluation)
    with pytest.raises(ValueError, match=msg):
        wattcast.search(MODEL, CLUSTER, **JOB, **kw)


def _no_evaluation(*a, **k):  # pragma: no cover - only called when a check is missing
    raise AssertionError("a configuration was evaluated before the bad input was refused")


# ------------------------------------------------------------------------------------------------ constraints
def test_constraints_keep_only_rows_within_them(runs):
    fit = _fit(runs.ranked)
    usd = float(fit["run_cloud_usd"].median())
    days = float(fit["run_days"].quantile(0.75))
    co2 = float(fit["run_tco2e"].quantile(0.6))
    res = wattcast.search(MODEL, CLUSTER, tokens=TOKENS, footprint_kw=dict(region="aws:us-east-1"), max_usd=usd,
                          deadline_days=days, max_tco2e=co2, **JOB)
    kept = res.ranked
    assert len(kept) and kept["fits"].all()
    assert (kept["run_cloud_usd"] <= usd).all() and (kept["run_days"] <= days).all() and (kept["run_tco2e"] <= co2).all()
    want = fit[(fit["run_cloud_usd"] <= usd) & (fit["run_days"] <= days) & (fit["run_tco2e"] <= co2)]
    assert set(kept["strategy"]) == set(want["strategy"])
    ex = res.excluded
    assert len(ex) + len(kept) == len(runs.ranked)
    assert set(ex["excluded_by"]) <= {"max_usd", "deadline_days", "max_tco2e", "memory"}
    assert (ex.loc[ex["excluded_by"] == "max_usd", "run_cloud_usd"] > usd).all()
    assert (ex.loc[ex["excluded_by"] == "memory", "fits"] == False).all()  # noqa: E712


def test_pareto_front_is_non_dominated_and_complete(runs):
    res = wattcast.search(MODEL, CLUSTER, tokens=TOKENS, pareto=True, footprint_kw=dict(region="aws:us-east-1"), **JOB)
    front = res.ranked
    assert len(front) >= 1 and front["run_pareto"].all()
    pts = _fit(runs.ranked)[["run_days", "run_cloud_usd", "run_tco2e"]].to_numpy()
    for p in front[["run_days", "run_cloud_usd", "run_tco2e"]].to_numpy():
        assert not ((pts <= p).all(axis=1) & (pts < p).any(axis=1)).any()
    # every non-dominated fitting row is on it
    nd = [i for i, p in enumerate(pts) if not ((pts <= p).all(axis=1) & (pts < p).any(axis=1)).any()]
    assert len(nd) == len(front)


def test_pareto_mask_against_brute_force():
    rng = np.random.default_rng(3)
    df = pd.DataFrame(rng.random((300, 3)), columns=["run_days", "run_cloud_usd", "run_tco2e"])
    df.iloc[10:20] = df.iloc[0:10].to_numpy()  # ties: identical points are both on the front or both off it
    df.iloc[20:40, 0] = df.iloc[40:60, 0].to_numpy()  # ties in one coordinate
    df["fits"] = rng.random(300) > 0.2
    df.loc[5, "run_cloud_usd"] = np.nan
    got = pareto_mask(df)
    pts, ok = df[["run_days", "run_cloud_usd", "run_tco2e"]].to_numpy(), df["fits"].to_numpy() & ~df.isna().any(axis=1).to_numpy()
    want = np.zeros(len(df), dtype=bool)
    for i in np.flatnonzero(ok):
        others = pts[ok]
        want[i] = not ((others <= pts[i]).all(axis=1) & (others < pts[i]).any(axis=1)).any()
    assert (got == want).all() and got.sum() > 1 and not got[5]


def test_the_front_runs_across_clusters():
    """Two GPU types at one given cloud price: one front over both clusters' rows (a row of either may be on it)."""
    kw = dict(tokens=TOKENS, footprint_kw=dict(cloud_usd_per_gpu_hour=2.0), **dict(JOB, max_configs=30))
    every = wattcast.search(MODEL, ["DGX-H100", "DGX-A100"], **kw)
    front = wattcast.search(MODEL, ["DGX-H100", "DGX-A100"], pareto=True, **kw).ranked
    assert set(_fit(every.ranked)["cluster"]) == {"DGX-H100", "DGX-A100"}
    cols = ["run_days", "run_cloud_usd", "run_tco2e"]
    pts = _fit(every.ranked)[cols].to_numpy()
    assert len(front) >= 1 and front["run_pareto"].all()
    for p in front[cols].to_numpy():
        assert not ((pts <= p).all(axis=1) & (pts < p).any(axis=1)).any()
    on = _fit(every.ranked)[_fit(every.ranked)["run_pareto"]]
    assert sorted(on["strategy"] + on["cluster"]) == sorted(front["strategy"] + front["cluster"])


def test_cost_needs_a_cloud_price_and_says_how_to_give_one(monkeypatch):
    monkeypatch.setattr(search_mod, "schedule_context", _no_evaluation)  # where a search starts evaluating
    monkeypatch.setattr(search_mod, "schedule_step", _no_evaluation)
    with pytest.raises(ValueError, match=r"no on-demand price for A100-SXM4-80GB.*cloud_usd_per_gpu_hour"):
        wattcast.search(MODEL, ["DGX-H100", "DGX-A100"], tokens=TOKENS, objective="cost", **JOB)


# ------------------------------------------------------------------------------------------------ names checked first
@pytest.mark.parametrize("what, kw, msg", [
    ("region", dict(tokens=TOKENS, footprint_kw=dict(region="us-eastt-1")), "us-eastt-1"),
    ("cluster", dict(cluster=["DGX-H100", "DGX-H1000"]), "unknown cluster 'DGX-H1000'"),
    ("model", dict(model="llama3_8bb"), "llama3_8bb"),
])
def test_unknown_names_are_refused_before_any_evaluation(what, kw, msg, monkeypatch):
    monkeypatch.setattr(search_mod, "schedule_context", _no_evaluation)  # where a search starts evaluating
    monkeypatch.setattr(search_mod, "schedule_step", _no_evaluation)
    args = dict(model=MODEL, cluster=CLUSTER)
    args.update(kw)
    with pytest.raises(Exception, match=msg) as e:
        wattcast.search(args.pop("model"), args.pop("cluster"), **JOB, **args)
    assert not isinstance(e.value, AssertionError)


def test_cli_refuses_unknown_names_with_exit_2():
    r = run(*CLI, "--tokens", "1e10", "--region", "atlantis")
    assert r.exit_code == 2 and "atlantis" in flat(r.stderr)
    r = run(*CLI, "--cluster", "nosuch")
    assert r.exit_code == 2 and "unknown cluster 'nosuch'" in flat(r.stderr)


# ------------------------------------------------------------------------------------------------ CLI: goals and output
def test_cli_run_options_need_tokens():
    for extra in (["--pue", "1.3"], ["--lifetime-years", "4"], ["--grid-kgco2e-per-kwh", "0.1"], ["--max-usd", "10"],
                  ["--deadline-days", "2"], ["--max-tco2e", "1"], ["--pareto"], ["--objective", "cost"],
                  ["--cloud-usd-per-gpu-hour", "2"]):
        r = run(*CLI, *extra)
        assert r.exit_code == 2 and "--tokens" in flat(r.stderr) and extra[0] in flat(r.stderr), extra


def test_cli_objective_constraints_and_json(tmp_path):
    r = run(*CLI, "--tokens", "2e10", "--region", "aws:us-east-1", "--objective", "co2e", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    fit = [x for x in d["ranked"] if x["fits"]]
    co2 = [x["run_tco2e"] for x in fit]
    assert co2 == sorted(co2) and all(x["strategy"] for x in fit)
    assert all(x["run_cloud_usd"] is None for x in d["ranked"] if not x["fits"])  # null, not NaN: valid JSON
    cap = sorted(x["run_cloud_usd"] for x in fit)[len(fit) // 2]
    r = run(*CLI, "--tokens", "2e10", "--region", "aws:us-east-1", "--max-usd", str(cap), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["ranked"] and all(x["run_cloud_usd"] <= cap for x in d["ranked"]) and d["excluded"]
    r = run(*CLI, "--tokens", "2e10", "--max-usd", "1", "--deadline-days", "100")
    assert r.exit_code == 1 and "no configuration meets the constraints" in flat(r.stderr)
    assert "--max-usd 1: the best fitting configuration needs $" in flat(r.stderr)
    assert "--deadline-days" not in flat(r.stderr).split("constraints")[1]  # 100 days is met: not blamed


def test_cli_table_says_where_prices_come_from_and_keeps_the_front():
    r = run(*CLI, "--tokens", "2e10", "--region", "aws:us-east-1", "--pareto", "--pue", "1.1", "--lifetime-years", "4")
    assert r.exit_code == 0, r.output
    out = flat(r.stdout)
    assert "Pareto front: run time x cloud cost x CO2e" in out and "cloud $" in out and "days" in out
    assert "electricity 0.089 USD/kWh (site-specific; source: aws:us-east-1 -> US-VA" in out
    assert "aws:us-east-1 (location, site-specific" in out and "USD/GPU-h, on-demand" in out
    assert "PUE 1.1" in out and "left out:" in out


@pytest.mark.parametrize("suffix", [".json", ".csv", ".parquet"])
def test_cli_output_by_suffix_and_no_overwrite(tmp_path, suffix):
    out = tmp_path / f"rows{suffix}"
    r = run(*CLI, "--tokens", "2e10", "--output", out)
    assert r.exit_code == 0, r.output
    df = (pd.read_json(out) if suffix == ".json" else pd.read_csv(out) if suffix == ".csv" else pd.read_parquet(out))
    assert {"strategy", "run_days", "run_cloud_usd", "run_tco2e", "electricity_source"} <= set(df.columns)
    assert len(df) > 5
    before = out.read_bytes()
    r = run(*CLI, "--tokens", "2e10", "--output", out)
    assert r.exit_code == 2 and "refusing to overwrite" in flat(r.stderr) and out.read_bytes() == before
    r = run(*CLI, "--tokens", "2e10", "--output", out, "--overwrite", "--objective", "energy")
    assert r.exit_code == 0, r.output


def test_cli_output_suffix_and_plot(tmp_path):
    r = run(*CLI, "--output", tmp_path / "rows.xlsx")
    assert r.exit_code == 2 and ".json, .csv, .parquet" in flat(r.stderr)
    png = tmp_path / "front.png"
    r = run(*CLI, "--tokens", "2e10", "--plot", png)
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    r = run(*CLI, "--tokens", "2e10", "--plot", tmp_path / "front.svg")
    assert r.exit_code == 2 and "--plot" in flat(r.stderr)


# ------------------------------------------------------------------------------------------------ memory first
@pytest.fixture(scope="module")
def pruned_and_full():
    job = dict(gpus=4, batch=16, seq=2048, zero=(0, 1, 2, 3))
    return (wattcast.search("gpt3_2.7b", "nvlink-4gpu", **job),
            wattcast.search("gpt3_2.7b", "nvlink-4gpu", prune_oom=False, **job))


def test_memory_first_pruning_keeps_the_top_10_and_every_fitting_row(pruned_and_full):
    pruned, full = pruned_and_full
    assert len(pruned.ranked) == len(full.ranked) and not pruned.ranked["fits"].all()  # some do not fit: pruned
    fp, ff = _fit(pruned.ranked), _fit(full.ranked)
    assert fp["strategy"].head(10).tolist() == ff["strategy"].head(10).tolist()
    cols = ["strategy", "step_time_ms", "mfu", "memory_gb", "energy_j", "avg_power_w", "exposed_comm_ms", "bubble_ms"]
    pd.testing.assert_frame_equal(fp[cols].reset_index(drop=True), ff[cols].reset_index(drop=True))
    assert pruned.best == full.best
    pd.testing.assert_frame_equal(pruned.pareto[cols].reset_index(drop=True), full.pareto[cols].reset_index(drop=True))


def test_pruned_rows_have_their_memory_and_no_made_up_times(pruned_and_full):
    pruned, full = pruned_and_full
    oom = pruned.ranked[~pruned.ranked["fits"]]
    assert len(oom) and not oom["scheduled"].any() and pruned.ranked.loc[pruned.ranked["fits"], "scheduled"].all()
    assert oom[["step_time_ms", "mfu", "energy_j", "avg_power_w", "tflops_per_gpu"]].isna().all().all()
    mem = full.ranked.set_index("strategy")["memory_gb"]
    assert np.array_equal(oom["memory_gb"].to_numpy(), mem.loc[oom["strategy"]].to_numpy())
    assert full.ranked["scheduled"].all() and full.ranked["step_time_ms"].notna().all()


def test_cli_search_json_has_null_times_for_pruned_rows_and_simulate_oom_fills_them():
    args = ("search", "-m", "gpt3_2.7b", "--cluster", "nvlink-4gpu", "--gpus", "4", "--batch", "16", "--seq", "2048",
            "--max-configs", "60", "--json")
    d = json.loads(run(*args).stdout)
    oom = [x for x in d["ranked"] if not x["fits"]]
    assert oom and all(x["step_time_ms"] is None and x["scheduled"] is False for x in oom)
    d = json.loads(run(*args, "--simulate-oom").stdout)
    assert all(x["step_time_ms"] > 0 and x["scheduled"] for x in d["ranked"])


def test_search_looks_up_the_model_file_once_not_per_candidate(monkeypatch, tmp_path):
    from wattcast.featurize import hf_config, workload

    calls = {"config": 0, "graph": 0}
    loc_c, loc_g = hf_config._locate_config, workload._locate_model_file

    def count_c(m):
        calls["config"] += 1
        return loc_c(m)

    def count_g(m):
        calls["graph"] += 1
        return loc_g(m)

    monkeypatch.setattr(hf_config, "_locate_config", count_c)
    monkeypatch.setattr(workload, "_locate_model_file", count_g)
    res = wattcast.search("gpt2", "nvlink-4gpu", 4, 8, 512, max_configs=30)
    assert len(res.ranked) + len(res.rejected) >= 20
    assert calls["config"] <= 2 and calls["graph"] <= 1  # once before the loop (checks), once inside the pinned block
    # outside a search nothing is pinned: an edited config file is read again
    f = tmp_path / "config.json"
    cfg = dict(model_type="gpt2", n_layer=2, n_head=4, n_embd=256, vocab_size=1000, n_positions=512)
    f.write_text(json.dumps(cfg))
    a = hf_config.load_hf_config(str(f))
    f.write_text(json.dumps(dict(cfg, n_layer=3)))
    import os

    os.utime(f, (1e9, 1e9))  # a different modification time for sure
    assert hf_config.load_hf_config(str(f)).n_layers == a.n_layers + 1
    with hf_config.pinned_files():
        first = hf_config.load_hf_config(str(f))
        f.write_text(json.dumps(dict(cfg, n_layer=5)))
        os.utime(f, (2e9, 2e9))
        assert hf_config.load_hf_config(str(f)) == first  # pinned: looked up once inside the block
    assert hf_config.load_hf_config(str(f)).n_layers == 5


# ------------------------------------------------------------------------------------------------ audit 54
def test_cli_plot_refuses_an_existing_file_without_overwrite(tmp_path):
    """--plot, as --output (and predict --plot): an existing file is refused before any work, kept as it was."""
    png = tmp_path / "p.png"
    png.write_text("precious")
    r = run(*CLI, "--tokens", "1e9", "--plot", png)
    assert r.exit_code == 2 and f"--plot {png} already exists; refusing to overwrite it" in flat(r.stderr)
    assert png.read_text() == "precious"
    r = run(*CLI, "--tokens", "1e9", "--plot", png, "--overwrite")
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sig_figures_never_read_as_zero():
    from wattcast.cli import _sig

    assert [_sig(v) for v in (6.9e-5, 0.0078, 0.5, 1.234, 56.74, 12345.6, 0.0)] == [
        "6.9e-05", "0.0078", "0.5", "1.23", "56.7", "12,346", "0"]


def test_cli_unmet_constraint_and_table_show_small_needs_in_significant_figures():
    """A 1e9-token gpt2_medium run needs a fraction of a day and of a tonne: the message says how much (not 0.0), and
    the table's days / MWh / tCO2e columns show each row's own figure (not 0.00)."""
    r = run(*CLI, "--tokens", "1e9", "--deadline-days", "1e-6", "--max-tco2e", "1e-6")
    assert r.exit_code == 1, r.output
    msg = flat(r.stderr)
    d = json.loads(run(*CLI, "--tokens", "1e9", "--json").stdout)
    fit = [x for x in d["ranked"] if x["fits"]]
    from wattcast.cli import _sig

    days, co2 = min(x["run_days"] for x in fit), min(x["run_tco2e"] for x in fit)
    assert 0 < days < 0.05 and 0 < co2 < 0.005  # rounded to 0.0 days / 0.00 tCO2e by the old formats
    assert f"--deadline-days 1e-06: the best fitting configuration needs {_sig(days)} days" in msg
    assert f"--max-tco2e 1e-06: the best fitting configuration needs {_sig(co2)} tCO2e" in msg
    assert "needs 0.0 days" not in msg and "needs 0.00 tCO2e" not in msg
    out = flat(run(*CLI, "--tokens", "1e9").stdout)
    best = d["ranked"][0]
    for k in ("run_days", "run_energy_mwh", "run_tco2e"):
        assert best[k] > 0 and _sig(best[k]) in out and _sig(best[k]) not in ("0", "0.00"), k


def test_a_cluster_given_twice_is_searched_once_and_said():
    """--cluster DGX-H100 --cluster dgx-h100: one cluster (the rows of a single search, not each twice), a warning."""
    one = wattcast.search(MODEL, CLUSTER, **JOB)
    two = wattcast.search(MODEL, [CLUSTER, "dgx-h100"], **JOB)
    assert len(two.ranked) == len(one.ranked) and two.clusters == one.clusters == [CLUSTER]
    assert list(two.ranked["strategy"]) == list(one.ranked["strategy"])
    assert any("'dgx-h100' is DGX-H100 again" in w and "searched once" in w for w in two.warnings)
    r = run(*CLI, "--cluster", "dgx-h100", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["ranked_total"] == len(one.ranked) and len({x["strategy"] for x in d["ranked"]}) == len(d["ranked"])
