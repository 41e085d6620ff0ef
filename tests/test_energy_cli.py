"""Energy in predictions, power limits, `--tokens` runs and `wattcast footprint` (the issue-5 contracts)."""

from __future__ import annotations

import json

import pytest

import wattcast
from conftest import flat, run_cli

RUN_KEYS = ("hours", "gpu_hours", "energy_mwh", "operational_tco2e", "embodied_tco2e", "total_tco2e", "capex_usd",
            "opex_usd", "tco_usd", "goodput")


def test_step_energy_and_power_limit_move_time_and_power():
    free = wattcast.predict("gpt3_xl", "A100-SXM4-80GB", batch=4, seq=2048, dtype="bf16", attention="flash")
    capped = wattcast.predict("gpt3_xl", "A100-SXM4-80GB", batch=4, seq=2048, dtype="bf16", attention="flash", power_limit_w=200)
    spec_idle, tdp = 0.15 * 400, 400
    assert spec_idle < free.avg_power_w <= tdp
    assert free.energy_j == pytest.approx(free.avg_power_w * free.step_time_ms / 1e3)
    assert capped.avg_power_w <= 200 + 1e-6 and capped.step_time_ms > free.step_time_ms


def test_distributed_energy_counts_every_gpu():
    r = wattcast.predict_cluster("gpt2_medium", "dgx-a100", gpus=8, batch=16, seq=1024, dtype="bf16", attention="flash")
    assert r.energy_j == pytest.approx(r.avg_power_w * r.step_time_ms / 1e3 * 8, rel=1e-6)
    assert all(0 < d["avg_power_w"] <= 400 for d in r.per_device)


def test_predict_tokens_run_object():
    r = run_cli("predict", "--model", "gpt2", "--device", "H100-SXM5-80GB", "--batch", "8", "--seq", "1024", "--dtype", "bf16",
                "--tokens", "1e9", "--region", "FRA", "--pue", "1.1", "--lifetime-years", "4", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["energy_j"] > 0 and d["avg_power_w"] > 0
    run = d["run"]
    assert tuple(run) == RUN_KEYS
    steps = -(-1e9 // (8 * 1024))
    assert run["hours"] >= steps * d["step_time_ms"] / 3.6e6  # goodput can only lengthen it
    assert run["total_tco2e"] == pytest.approx(run["operational_tco2e"] + run["embodied_tco2e"])
    assert run["tco_usd"] == pytest.approx(run["capex_usd"] + run["opex_usd"])
    assert 0 < run["goodput"] <= 1


def test_run_options_need_tokens():
    r = run_cli("predict", "--model", "gpt2", "--device", "L4", "--region", "FRA")
    assert r.returncode == 2 and "give --tokens too" in flat(r.stderr)


def test_footprint_cli_reproduces_gpt3():
    """Patterson et al. 2021 Table 4, GPT-3: 10,000 V100 x 14.8 days, 330 W, PUE 1.1, 0.429 kg/kWh -> 1,287 MWh, 552 t."""
    r = run_cli("footprint", "--device", "V100-SXM2-32GB", "--gpus", "10000", "--hours", "355.2", "--avg-power-w", "330",
                "--pue", "1.1", "--grid-kgco2e-per-kwh", "0.429", "--json")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)["run"]
    assert run["energy_mwh"] == pytest.approx(1287, rel=0.02)
    assert run["operational_tco2e"] == pytest.approx(552.1, rel=0.02)


def test_footprint_cli_surrogate_power_and_bad_region():
    r = run_cli("footprint", "--device", "A100-SXM4-80GB", "--gpus", "8", "--hours", "10", "--region", "DEU", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["run"]["energy_mwh"] > 0
    r = run_cli("footprint", "--device", "A100-SXM4-80GB", "--gpus", "8", "--hours", "10", "--region", "Frnace")
    assert r.returncode == 2 and "France" in flat(r.stderr) and "Traceback" not in r.stderr


def test_clock_cap_slows_and_cools():
    free = wattcast.predict("gpt3_xl", "A100-SXM4-80GB", batch=2, seq=2048, dtype="bf16", attention="flash")
    capped = wattcast.predict("gpt3_xl", "A100-SXM4-80GB", batch=2, seq=2048, dtype="bf16", attention="flash", clock_cap_mhz=900)
    assert capped.step_time_ms > free.step_time_ms and capped.avg_power_w < free.avg_power_w
