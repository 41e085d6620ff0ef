"""search(memory_headroom_gb=) / --memory-headroom-gb: a candidate fits only below the capacity less a margin (audit of
issue 15: the rows nearest the memory limit are predicted too fast, README's published fastest-fitting readings)."""
import json

import numpy as np
import pytest

import wattcast

ARGS = ("gpt2", "DGX-A100", 8, 64, 1024)
KW = dict(max_configs=40, tokens=1e9)


@pytest.fixture(scope="module")
def base():
    return wattcast.search(*ARGS, **KW)


def test_a_headroom_turns_the_rows_nearest_the_limit_into_non_fitting_ones(base):
    df = base.ranked
    fit = df[df["fits"]]
    assert len(fit) >= 2 and fit["memory_gb"].nunique() >= 2
    cap = float(fit["memory_capacity_gb"].iloc[0])
    # a margin between the two largest fitting footprints: the largest no longer fits, the rest still do
    top = np.sort(fit["memory_gb"].unique())[-2:]
    headroom = cap - float(top.mean())
    res = wattcast.search(*ARGS, memory_headroom_gb=headroom, **KW)
    got = res.ranked.set_index("strategy")
    want = df.set_index("strategy")
    over = want["fits"] & (want["memory_gb"] > cap - headroom)
    assert over.any() and (want["fits"] & ~over).any()
    assert not got.loc[over[over].index, "fits"].any()  # the same rows, no longer fitting
    assert got.loc[over[over].index, "run_days"].isna().all()  # no run figures, as any row that does not fit
    keep = (want["fits"] & ~over)[lambda s: s].index
    assert got.loc[keep, "fits"].all()
    assert np.allclose(got.loc[keep, "step_time_ms"], want.loc[keep, "step_time_ms"])  # figures unchanged
    assert res.best["memory_gb"] <= cap - headroom


def test_zero_headroom_changes_nothing_and_bad_values_are_refused(base):
    res = wattcast.search(*ARGS, memory_headroom_gb=0, **KW)
    assert res.ranked[["strategy", "fits", "step_time_ms"]].equals(base.ranked[["strategy", "fits", "step_time_ms"]])
    for bad in (-1, float("nan"), "x", True):
        with pytest.raises(ValueError, match="memory_headroom_gb"):
            wattcast.search(*ARGS, memory_headroom_gb=bad, max_configs=2)


def test_the_cli_takes_it_and_reports_it_in_the_settings():
    from conftest import run_cli

    out = run_cli("search", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", "-b", "64", "-s", "1024",
                  "--max-configs", "10", "--memory-headroom-gb", "79", "--json")
    assert out.returncode in (0, 3), out.stderr
    d = json.loads(out.stdout)
    # since stop 58 the settings also hold the step options no strategy string records (audit 58a; compile: 58e)
    assert d["settings"] == {"memory_headroom_gb": 79.0, "fp8_recipe": None, "fp8_param_gather": False,
                             "grad_accum_dtype": None, "fsdp_reduce_dtype": None, "compile": False}
    cap = d["ranked"][0]["memory_capacity_gb"]
    assert all(r["memory_gb"] <= cap - 79 for r in d["ranked"] if r["fits"])


def test_the_sweep_spec_key_reaches_the_search_and_the_task_id_only_when_given(tmp_path):
    from wattcast.sweep import SweepSpecError, load_spec, read_sweep, run_sweep

    spec = dict(models=["gpt2"], clusters=["DGX-A100"], gpus=[8], batch=64, seq=1024, max_configs=40, top=1)
    plain, margin = load_spec(spec).tasks()[0], load_spec(dict(spec, memory_headroom_gb=79.5)).tasks()[0]
    assert "memory_headroom_gb" not in plain and margin["memory_headroom_gb"] == 79.5
    assert plain["task_id"] != margin["task_id"]
    with pytest.raises(SweepSpecError, match="memory_headroom_gb"):
        load_spec(dict(spec, memory_headroom_gb=-1))
    best = wattcast.search(*ARGS, max_configs=40).best
    headroom = round(best["memory_capacity_gb"] - best["memory_gb"] + 0.1, 3)  # the unmargined best no longer fits
    ref = wattcast.search(*ARGS, max_configs=40, memory_headroom_gb=headroom).best
    assert ref is not None and ref["strategy"] != best["strategy"]
    df = read_sweep(run_sweep(dict(spec, memory_headroom_gb=headroom), tmp_path / "s", workers=0).output)
    assert df["status"].iloc[0] == "ok", df["error"].iloc[0]
    assert df["strategy"].iloc[0] == ref["strategy"]


def test_a_headroom_that_leaves_nothing_says_so_not_out_of_memory():
    """Every gpt2 strategy fits an 80 GB A100 in a few GB: with a headroom of 85.5 GB none is left, and the error
    names the headroom (it said the configurations do not fit in memory)."""
    from conftest import flat, run_cli

    out = run_cli("search", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", "-b", "64", "-s", "1024",
                  "--max-configs", "10", "--memory-headroom-gb", "85.5")
    assert out.returncode == 3, out.stderr
    msg = flat(out.stderr)
    assert "capacity less --memory-headroom-gb 85.5" in msg and "smaller --memory-headroom-gb" in msg, msg
