"""Megatron-LM's CI iteration times as a validation source (validation/megatron_ci.py), on the real table."""

from __future__ import annotations

import pandas as pd
import pytest

from wattcast.validation.megatron_ci import (CI_GPUS, CI_HOST_FIT, ci_fit_rows, ci_fsdp, ci_model_key, ci_parallel, ci_split,
                                             ci_unmodelled, fit_ci_host, load_megatron_ci, predict_megatron_ci)


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


def _test(df, name):
    return df[df["test_case"] == f"gpt/gpt3_mcore_{name}"]


def test_split_puts_every_configuration_on_one_side(data_root):
    """Tests whose names differ only in what the prediction does not read predict the same: a test-name split put 40
    of the evaluation half's 60 rows beside a fitting-half twin."""
    df, _ = load_megatron_ci(data_root)
    fit, ev = ci_split(df)
    keys = [{ci_model_key(r) for r in half.itertuples(index=False)} for half in (fit, ev)]
    assert not keys[0] & keys[1] and len(fit) + len(ev) == len(df) and len(keys[0]) >= 5 and len(keys[1]) >= 5
    # e.g. the same TP1 x PP4 x VP model with and without a decoupled learning rate, resumed or not
    twins = ["te_tp1_pp4_vp1", "te_tp1_pp4_vp1_decoupled_lr", "te_tp1_pp4_vp1_resume_torch_dist"]
    assert len({ci_model_key(next(_test(df, t).itertuples(index=False))) for t in twins}) == 1
    assert len({_test(df, t).index[0] in fit.index for t in twins}) == 1


def test_fsdp_test_reads_as_zero3(data_root):
    """``fsdp_dtensor`` is the Megatron-FSDP checkpoint format (megatron/training/arguments.py allows it only with
    --use-megatron-fsdp, default sharding optim_grads_params = ZeRO-3); until stop 43 the test read as ZeRO-1."""
    df, _ = load_megatron_ci(data_root)
    assert ci_fsdp("gpt/gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor") and not ci_fsdp("gpt/gpt3_mcore_te_tp2_pp2")
    assert ci_parallel(next(_test(df, "te_tp2_zp_z3_resume_fsdp_dtensor").itertuples(index=False)))[0].zero == 3
    assert ci_parallel(next(_test(df, "te_tp2_pp1_multi_dist_optimizer_instances").itertuples(index=False)))[0].zero == 1


def test_sequence_parallel_at_tp1_is_off_as_megatron_runs_it(data_root):
    """Megatron-LM drops --sequence-parallel at TP 1 ("Disabling sequence parallelism because tensor model parallelism
    is disabled"); until stop 43 these rows were refused (--sp needs --tp > 1)."""
    df, _ = load_megatron_ci(data_root)
    rows = pd.concat([_test(df, "te_tp1_pp4_sequence_parallel"), _test(df, "te_tp1_pp2_cp4_a2a_p2p_nondeterministic")])
    assert len(rows) == 4 and rows["sp"].map(lambda v: v is True or v == "True").all()
    assert not any(ci_parallel(r)[0].sp for r in rows.itertuples(index=False))
    p = predict_megatron_ci(rows.drop_duplicates("test_case"))
    assert (p["status"] == "ok").all()
    assert ci_parallel(next(_test(df, "te_tp2_pp2_cp2").itertuples(index=False)))[0].sp  # TP 2 keeps it


def test_deterministic_flash_attention_rows_are_marked_and_not_fitted(data_root):
    """Deterministic mode on TE's flash attention is not modelled: its context-parallel tests run 20-25% slower than
    their nondeterministic twins on the same configuration; they are marked and the host fit leaves them out."""
    df, _ = load_megatron_ci(data_root)
    group = pd.concat([_test(df, t) for t in ("te_tp2_pp2_cp2", "te_tp2_pp2_cp2_nondeterministic", "te_tp2_pp2")])
    marks = {r.test_case.split("mcore_")[1]: ci_unmodelled(r) for r in group.itertuples(index=False)}
    assert marks["te_tp2_pp2_cp2"] and not marks["te_tp2_pp2_cp2_nondeterministic"] and not marks["te_tp2_pp2"]
    twins = group[group["platform_env"] == "dev_dgx_a100"].set_index("test_case")["measured_ms"]
    assert twins["gpt/gpt3_mcore_te_tp2_pp2_cp2"] > 1.2 * twins["gpt/gpt3_mcore_te_tp2_pp2_cp2_nondeterministic"]
    assert set(ci_fit_rows(group)["test_case"]) == {"gpt/gpt3_mcore_te_tp2_pp2_cp2_nondeterministic",
                                                    "gpt/gpt3_mcore_te_tp2_pp2"}
