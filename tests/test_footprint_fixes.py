"""Fixes of the footprint / --tokens run reports: --region with --grid-kgco2e-per-kwh, the node-overhead and
--utilisation options with --avg-power-w, goodput of runs shorter than a checkpoint interval, the bounds of
--checkpoint-write-s and --tokens, messages of bad --hours, small runs printed with scaled units, and the labels of
the Swedish bidding zones."""

from __future__ import annotations

import json
import math

import pytest

import wattcast
from wattcast import lifecycle as lc
from wattcast.data import carbon
from wattcast.lifecycle import LifecycleAssumptions, footprint, footprint_from_step, format_footprint
from conftest import flat, run_cli

H100 = "H100-SXM5-80GB"


# ------------------------------------------------------------------ 1. --region with --grid-kgco2e-per-kwh
def test_footprint_region_and_explicit_grid_the_figure_wins():
    r = run_cli("footprint", "-d", H100, "--gpus", "8", "--hours", "10", "--region", "FRA",
                "--grid-kgco2e-per-kwh", "0.5", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["grid_kgco2e_per_kwh"] == 0.5 and d["grid_basis"] == "explicit"
    # the region still prices electricity, as predict --tokens and wattcast.footprint do
    api = wattcast.footprint(H100, 8, 10.0, region="FRA", grid_kgco2e_per_kwh=0.5)
    assert d["electricity_usd_per_kwh"] == pytest.approx(api.electricity_usd_per_kwh)
    assert d["electricity_region_specific"] == api.electricity_region_specific
    assert d["operational_tco2e"] == pytest.approx(api.operational_tco2e)


# ------------------------------------------------------------------ 2. --node-overhead-share, --utilisation
def test_given_power_with_node_overhead_reads_consistently():
    fp = footprint(H100, 1, 10.0, avg_power_w=700.0, node_overhead_share=0.3, apply_goodput=False)
    assert fp.node_power_w == pytest.approx(910.0)
    assert "all-in" not in fp.power_source and "+ 0.3 node overhead" in fp.power_source
    plain = footprint(H100, 1, 10.0, avg_power_w=700.0, apply_goodput=False)
    assert plain.node_power_w == pytest.approx(700.0) and "all-in" in plain.power_source
    flagged = footprint(H100, 1, 10.0, avg_power_w=700.0, utilisation=0.9, apply_goodput=False)
    assert any("utilisation 0.9 not used" in f for f in flagged.flags)


def test_footprint_cli_help_and_utilisation_with_avg_power():
    h = flat(run_cli("footprint", "--help").stdout)
    assert "0 with --avg-power-w" in h
    r = run_cli("footprint", "-d", H100, "--gpus", "1", "--hours", "10", "--avg-power-w", "700", "--utilisation", "0.9")
    assert r.returncode == 2 and "--utilisation" in flat(r.stderr) and "--avg-power-w" in flat(r.stderr)
    ok = run_cli("footprint", "-d", H100, "--gpus", "1", "--hours", "10", "--utilisation", "0.9", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["utilisation"] == 0.9


# ------------------------------------------------------------------ 3. goodput of short runs, bounds
def test_a_run_shorter_than_the_checkpoint_interval_writes_no_checkpoint():
    m = lc.system_mtbf_s(50_000, 1)
    tau = lc.young_daly_interval_s(60.0, m)
    short = 3600.0
    g = lc.goodput(60.0, m, 600.0, tau, run_s=short)
    # only the risk of the hour itself: no checkpoint of 60 s charged
    assert g == pytest.approx(short / (m * math.exp(600.0 / m) * math.expm1(short / m)))
    assert g > lc.goodput(60.0, m, 600.0, tau)  # the steady-state rate charges a checkpoint share
    # a long run converges to the rate
    assert lc.goodput(60.0, m, 600.0, tau, run_s=1e4 * tau) == pytest.approx(lc.goodput(60.0, m, 600.0, tau), rel=1e-3)
    # no failures: only the checkpoints written before the end
    assert lc.goodput(60.0, None, interval_s=540, run_s=500) == 1.0
    assert lc.goodput(60.0, None, interval_s=540, run_s=1080) == pytest.approx(1080 / 1140)


def test_huge_checkpoint_write_does_not_inflate_a_short_run():
    a = LifecycleAssumptions(checkpoint_write_s=80_000.0)
    fp = footprint(H100, 1, 1.1, avg_power_w=700.0, assumptions=a)
    assert fp.goodput > 0.99 and fp.hours < 1.2
    assert any("before its first checkpoint" in f for f in fp.flags)


def test_checkpoint_write_s_has_a_plausible_range():
    with pytest.raises(ValueError, match=r"checkpoint_write_s \(--checkpoint-write-s\) is 1e\+09"):
        footprint(H100, 1, 1.0, avg_power_w=700.0, checkpoint_write_s=1e9)
    r = run_cli("predict", "-m", "gpt2", "-d", H100, "--batch", "8", "--seq", "1024", "--tokens", "1e9",
                "--checkpoint-write-s", "1e9")
    assert r.returncode == 2 and "--checkpoint-write-s" in flat(r.stderr)


def test_tokens_bound_like_footprint_hours():
    r = run_cli("predict", "-m", "gpt2", "-d", H100, "--batch", "8", "--seq", "1024", "--tokens", "1e30")
    assert r.returncode == 2 and "--tokens" in flat(r.stderr) and "1e+06" in flat(r.stderr)


def test_tokens_fewer_than_one_step_are_said():
    fp = footprint_from_step(H100, 1, step_time_ms=100.0, gpu_power_w=500.0, tokens=100, tokens_per_step=8192)
    assert fp.ideal_hours == pytest.approx(100.0 / 3.6e6)
    assert any("fewer than one step" in f for f in fp.flags)
    assert "0.0 h" not in format_footprint(fp).splitlines()[0]


# ------------------------------------------------------------------ 4. messages
@pytest.mark.parametrize("hours, says", [("-5", "must be above 0 (hours), got -5"), ("0", "must be above 0 (hours), got 0"),
                                         ("nan", "must be a finite number")])
def test_bad_hours_message(hours, says):
    r = run_cli("footprint", "-d", H100, "--gpus", "1", "--hours", hours)
    msg = flat(r.stderr)
    assert r.returncode == 2 and "--hours" in msg and says in msg and "looks like -" not in msg


def test_messages_name_what_the_cli_accepts(tmp_path):
    with pytest.raises(carbon.CarbonDataError, match="--grid-kgco2e-per-kwh"):
        footprint(H100, 1, 1.0, avg_power_w=700.0, market_based=True)
    with pytest.raises(carbon.CarbonDataError, match="--grid-kgco2e-per-kwh"):
        footprint(H100, 1, 1.0, avg_power_w=700.0, market_based=True, region="FRA")
    from dataclasses import replace

    from wattcast.data.catalog import resolve_device

    bare = replace(resolve_device(H100), name="no-price-gpu", launch_price_usd=None, tdp_w=None)
    with pytest.raises(carbon.CarbonDataError, match="to the spec file") as e:
        footprint(bare, 1, 1.0, avg_power_w=700.0)
    assert "pass accelerator_price_usd explicitly" not in str(e.value)


# ------------------------------------------------------------------ 5. small runs are not printed as zero
def test_small_run_text_uses_scaled_units():
    fp = footprint(H100, 1, 11.0, apply_goodput=False)
    text = format_footprint(fp)
    assert "0.00 t" not in text and "0.01 MWh" not in text
    assert f"{fp.energy_mwh * 1000:.1f} kWh" in text and " kg" in text
    r = run_cli("footprint", "-d", H100, "--gpus", "1", "--hours", "11")
    out = flat(r.stdout)
    assert r.returncode == 0 and "kWh" in out and "kg" in out and "node overhead]" in out  # the [power source] shows


# ------------------------------------------------------------------ 6. Swedish bidding zones
def test_swedish_zone_labels_follow_nord_pool():
    assert "Stockholm" in carbon.grid_intensity("SE3").name
    assert "Southern Sweden" in carbon.grid_intensity("SE4").name
    r = run_cli("regions", "--kind", "zone", "--json")
    rows = {x["region"]: x["name"] for x in json.loads(r.stdout)}
    assert "Stockholm" in rows["SE3"] and "Southern" in rows["SE4"] and "Stockholm" not in rows["SE4"]
