"""Megatron-LM's CI iteration times as a validation source (validation/megatron_ci.py), on the real table."""

from __future__ import annotations

import pandas as pd
import pytest

from wattcast.validation.megatron_ci import (CI_GPUS, CI_HOST_FIT, ci_parallel, ci_split, fit_ci_host, load_megatron_ci,
                                             predict_megatron_ci)


def test_loader_keeps_dense_gpt_tests_on_dgx_a100_and_counts_what_it_leaves_out(data_root):
    df, dropped = load_megatron_ci(data_root)
    assert len(df) > 100
    assert df["test_case"].str.startswith("gpt/").all()
    assert df["platform_env"].str.contains("a100").all()
    assert not df["test_case"].str.contains("_1node").any()
    assert (df["measured_ms"] > 0).all() and df["vocab"].eq(50257).all()
    assert dropped["not a GPT test"] > 0 and dropped["not a DGX A100 platform"] > 0
    raw = pd.read_csv(data_root / "endtoend" / "megatron_ci" / "megatron_ci_iteration_times.csv")
    assert len(df) + sum(dropped.values()) == len(raw)


def test_missing_column_is_named(tmp_path):
    d = tmp_path / "endtoend" / "megatron_ci"
    d.mkdir(parents=True)
    pd.DataFrame({"test_case": ["gpt/x"], "platform_env": ["dev_dgx_a100"]}).to_csv(d / "megatron_ci_iteration_times.csv",
                                                                                      index=False)
    with pytest.raises(ValueError, match="missing column"):
        load_megatron_ci(tmp_path)


def test_row_reading(data_root):
    df, _ = load_megatron_ci(data_root)
    r = df[(df["tp"] == 2) & (df["pp"] == 2) & (df["cp"] == 2)].iloc[0]
    par, dtype, attention = ci_parallel(r)
    assert par.gpus == CI_GPUS and par.dp == CI_GPUS // 8 and par.sp and attention == "flash" and dtype == "bf16"
    fit, ev = ci_split(df)
    assert not set(fit["test_case"]) & set(ev["test_case"]) and len(fit) + len(ev) == len(df)


def test_shipped_megatron_core_is_fast_here_and_the_fitted_host_costs_are_the_grids_best(data_root):
    df, _ = load_megatron_ci(data_root)
    shipped = predict_megatron_ci(df.drop_duplicates("test_case").head(6))
    assert (shipped.loc[shipped["status"] == "ok", "error_pct"] < -30).all()  # eager host costs: host-bound runs fast
    best = fit_ci_host(df).iloc[0]
    launch, iteration, coll, cp_step = CI_HOST_FIT
    # the shipped fit is the grid's best on the fitting half
    assert (best.launch_ms, best.iteration_ms, best.tp_collective_ms, best.cp_step_ms) == (launch, iteration,
                                                                                           coll.get(2, 0.0), cp_step)
