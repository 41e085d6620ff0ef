"""Megatron-LM's CI iteration times as a validation source (validation/megatron_ci.py), on the real table."""

from __future__ import annotations

import pandas as pd
import pytest

from wattcast.simulate.parallel import ParallelConfig
from wattcast.validation.megatron_ci import (CI_GPUS, CI_HOST_FIT, ci_config, ci_fit_rows, ci_fsdp, ci_model_key, ci_parallel, ci_split,
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


def test_split_keeps_each_configuration_on_its_side_when_another_comes_or_goes(data_root, monkeypatch):
    """A configuration's side comes from its own key: dropping any one configuration moves no other test (a seeded
    permutation of all keys moved 23 of 48), nor does a new ParallelConfig field left at its default."""
    import dataclasses as dc

    import wattcast.validation.megatron_ci as m

    df, _ = load_megatron_ci(data_root)
    fit_tests = set(ci_split(df)[0]["test_case"])
    keys = df.apply(lambda r: ci_model_key(r), axis=1)
    for k in keys.unique()[:6]:
        rest = df[keys != k]
        assert set(ci_split(rest)[0]["test_case"]) == fit_tests & set(rest["test_case"])

    @dc.dataclass(frozen=True)
    class Wider(ParallelConfig):
        a_later_option: bool = False

    real = m.ci_parallel
    monkeypatch.setattr(m, "ci_parallel", lambda r: (Wider(**dc.asdict(real(r)[0])), *real(r)[1:]))
    assert set(ci_split(df)[0]["test_case"]) == fit_tests


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


def _row(df, name):
    return next(_test(df, name).itertuples(index=False))


def test_data_parallel_overlaps_are_read_from_the_name_and_off_otherwise(data_root):
    """--overlap-grad-reduce / --overlap-param-gather are Megatron-LM ``store_true`` flags (default off, megatron-core
    0.19.2 arguments.py): on where the test's name says so, off elsewhere; --tp-comm-overlap, named by no test, off.
    Until stop 43 every row took the pretraining recipes' defaults (grad reduce on, param gather on with ZeRO-1, TP
    overlap on with TP + SP)."""
    df, _ = load_megatron_ci(data_root)
    par = {t: ci_parallel(_row(df, t))[0] for t in ("te_tp2_pp2", "te_tp1_pp4_vp1_dist_optimizer_overlap_grad_reduce",
                                                     "te_tp4_pp1_dist_optimizer_overlap_grad_reduce_param_gather",
                                                     "te_tp2_pp2_cp2_nondeterministic")}
    assert par["te_tp2_pp2"].overlap_grad_reduce is False and par["te_tp2_pp2"].overlap_param_gather is False
    ogr = par["te_tp1_pp4_vp1_dist_optimizer_overlap_grad_reduce"]
    assert ogr.overlap_grad_reduce is True and ogr.overlap_param_gather is False
    opg = par["te_tp4_pp1_dist_optimizer_overlap_grad_reduce_param_gather"]
    assert opg.overlap_grad_reduce is True and opg.overlap_param_gather is True
    cp = par["te_tp2_pp2_cp2_nondeterministic"]
    assert cp.sp and cp.tp == 2 and cp.tp_comm_overlap is False
    # TP + SP without the TP overlap exposes the TP collectives the recipes' default hid
    r = _test(df, "te_tp2_pp2_cp2_nondeterministic").head(1)
    p = predict_megatron_ci(r, host_ms=CI_HOST_FIT).iloc[0]
    assert p["status"] == "ok" and p["exposed_tp_ms"] > 0


def _renamed(rows, name):
    return rows.assign(test_case=f"gpt/gpt3_mcore_{name}")


def test_qk_layernorm_and_disabled_linear_biases_change_the_graph(data_root):
    """--qk-layernorm (TransformerConfig.qk_layernorm, default False) adds a LayerNorm over each head's query and key;
    --disable-bias-linear (add_bias_linear, default True) drops the linear layers' biases. Until stop 43 both tests
    were costed as the base model."""
    df, _ = load_megatron_ci(data_root)
    qk = _test(df, "te_tp4_pp1_qk_layernorm_test_mode").head(1)
    assert ci_config(next(qk.itertuples(index=False)))["qk_layernorm"] is True
    base = _renamed(qk, "te_tp4_pp1")
    p_qk, p_base = (predict_megatron_ci(x, host_ms=CI_HOST_FIT).iloc[0] for x in (qk, base))
    assert p_qk["predicted_ms"] > p_base["predicted_ms"]
    nb = _test(df, "te_tp1_pp4_disable_bias_linear").head(1)
    assert ci_config(next(nb.itertuples(index=False)))["add_bias_linear"] is False
    p_nb, p_b = (predict_megatron_ci(x, host_ms=CI_HOST_FIT).iloc[0] for x in (nb, _renamed(nb, "te_tp1_pp4")))
    assert p_nb["predicted_ms"] < p_b["predicted_ms"]


def test_gpt2_graph_qk_layernorm_and_bias_options():
    """The GPT graph adds a LayerNorm over each head's query and key per layer under ``qk_layernorm`` and loses the
    linear layers' biases without ``add_bias_linear``."""
    from wattcast.featurize.workload import StepOptions, step_graph

    def graph(**extra):
        return step_graph({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 32,
                           "vocab_size": 128, **extra}, StepOptions(batch=2, seq=32, dtype="bf16", framework="megatron"))

    base, qk, nb = graph(), graph(qk_layernorm=True), graph(add_bias_linear=False)
    names = lambda g: list(g.nodes["name"])  # noqa: E731
    assert names(qk).count("attn.q_layernorm") >= 2 and names(qk).count("attn.k_layernorm") >= 2
    assert "attn.q_layernorm" not in names(base)
    qn = qk.nodes[qk.nodes["name"] == "attn.q_layernorm"].iloc[0]
    assert qn["op_class"] == "layernorm" and qn["param_count"] == 2 * 16  # weight and bias over each head's 16 dims
    assert qk.param_count == base.param_count + 2 * 2 * 2 * 16  # 2 layers x (q, k) x (weight, bias) x head dim
    assert nb.param_count == base.param_count - 2 * (3 * 64 + 64 + 256 + 64)  # qkv, proj, fc1 (ffn 4h), fc2 biases


def test_settings_the_prediction_cannot_represent_are_marked_and_not_fitted(data_root):
    """Each name token (or column) the simulator cannot represent is marked, not costed silently as the base model,
    and the host fit leaves it out; settings that only change checkpointing, data loading or learning rates are not."""
    df, _ = load_megatron_ci(data_root)
    marked = ["te_tp4_pp1_qk_layernorm_test_mode", "te_tp1_pp4_vp1_uneven_pipeline",
              "te_tp1_pp4_vp1_dist_optimizer_overlap_grad_reduce_param_gather_overlap_optimizer",
              "te_tp2_pp1_multi_dist_optimizer_instances",
              "te_tp2_pp2_defer_embedding_wgrad_compute", "te_tp1_pp4_vp1_tunable_overlap",
              "te_tp1_pp4_vp2_account_for_embedding_loss_in_pipeline_split"]
    read = ["te_tp2_pp2", "te_tp1_pp4_vp1_resume_torch_dist", "te_tp1_pp4_vp1_decoupled_lr", "te_tp2_pp2_no_mmap_bin_files",
            "te_tp1_pp4_disable_bias_linear", "te_tp1_pp4_vp1_dist_optimizer_overlap_grad_reduce_param_gather",
            "te_tp1_pp2_rope_embeddings", "te_tp1_pp2_rope_embeddings_interleaved_no_fusion",
            "te_tp1_pp2_cp4_a2a_p2p_nondeterministic"]  # read as --cp-comm-type a2a+p2p since stop 45
    assert all(ci_unmodelled(_row(df, t)) for t in marked)
    assert not any(ci_unmodelled(_row(df, t)) for t in read)
    rows = pd.concat([_test(df, t) for t in marked + read])
    assert set(ci_fit_rows(rows)["test_case"]) == {f"gpt/gpt3_mcore_{t}" for t in read}


def _gpt_graph(**extra):
    from wattcast.featurize.workload import StepOptions, step_graph
    framework = extra.pop("framework", "megatron")
    return step_graph({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 32,
                       "vocab_size": 128, **extra}, StepOptions(batch=2, seq=32, dtype="bf16", framework=framework))


def test_gpt2_graph_rotary_position_embeddings():
    """``position_embedding_type: rope`` (Megatron's --position-embedding-type rope): no learned position table (its
    n_positions x hidden parameters go, with their gradient and optimizer state), RoPE on q and k in every layer,
    forward and backward; fused (apply_rope_fusion, Megatron-LM's default) one kernel on each of q and k and one on
    each gradient, unfused Megatron-Core's elementwise chain."""
    from wattcast.featurize.op_graph import GraphError

    base, fused = _gpt_graph(), _gpt_graph(position_embedding_type="rope")
    unfused = _gpt_graph(position_embedding_type="rope", apply_rope_fusion=False)
    assert fused.param_count == base.param_count - 32 * 64 == unfused.param_count
    assert not fused.nodes["name"].str.startswith("wpe").any() and base.nodes["name"].str.startswith("wpe").any()
    assert _gpt_graph(position_embedding_type="learned_absolute").param_count == base.param_count

    def rope_kernels(g, phase):
        n = g.nodes
        return n[(n["phase"] == phase) & n["name"].str.contains(r"\.rope\.")]

    assert rope_kernels(base, "forward").empty
    f_fw, f_bw = rope_kernels(fused, "forward"), rope_kernels(fused, "backward")
    assert len(f_fw) == len(f_bw) == 2 * 2  # 2 layers x (q, k)
    assert set(f_fw["layer"]) == {0, 1} and set(f_bw["layer"]) == {0, 1}
    u_fw, u_bw = rope_kernels(unfused, "forward"), rope_kernels(unfused, "backward")
    assert len(u_fw) > len(f_fw) and len(u_bw) > len(f_bw)
    assert u_fw["name"].str.endswith(".neg").sum() == 4 and u_fw["name"].str.endswith(".cat_pass").sum() == 4
    # the step's optimizer state follows the parameters: the optimizer rows move fewer bytes
    opt = lambda g: g.nodes.loc[g.nodes["phase"] == "optimizer", "bytes"].sum()  # noqa: E731
    assert opt(fused) < opt(base)
    # Hugging Face's path: transformers' eager rotary kernels
    assert len(rope_kernels(_gpt_graph(position_embedding_type="rope", framework="hf"), "forward")) == 2 * 2 * 5
    with pytest.raises(GraphError, match="position_embedding_type"):
        _gpt_graph(position_embedding_type="alibi")


def test_ci_loader_reads_the_position_embedding_column(data_root):
    """The rope tests (``position-embedding-type`` rope) are costed with rotary embeddings, fused unless the name says
    ``no_fusion``, and no longer marked; rows without the column keep their config. Until stop 43c they were costed as
    learned positions and marked."""
    df, _ = load_megatron_ci(data_root)
    rope, nofuse = (_test(df, t).head(1) for t in ("te_tp1_pp2_rope_embeddings",
                                                   "te_tp1_pp2_rope_embeddings_interleaved_no_fusion"))
    cfg_r, cfg_n = (ci_config(next(x.itertuples(index=False))) for x in (rope, nofuse))
    assert cfg_r["position_embedding_type"] == cfg_n["position_embedding_type"] == "rope"
    assert cfg_r["apply_rope_fusion"] is True and cfg_n["apply_rope_fusion"] is False
    assert "position_embedding_type" not in ci_config(_row(df, "te_tp2_pp2"))
    assert not ci_unmodelled(next(rope.itertuples(index=False)))
    assert "position-embedding-type none" in ci_unmodelled(next(rope.assign(position_embedding="none").itertuples(index=False)))
    learned = rope.assign(position_embedding=float("nan"))
    assert "position_embedding_type" not in ci_config(next(learned.itertuples(index=False)))
    p_r, p_n, p_l = (predict_megatron_ci(x, host_ms=CI_HOST_FIT).iloc[0]["predicted_ms"] for x in (rope, nofuse, learned))
    assert p_n > p_r and p_r != p_l


def test_moe_tests_are_read_with_the_dense_conventions(data_root):
    """The 50 DGX A100 rows of the 12 regular ``moe/gpt3_mcore_*`` tests: 8 GPUs, dp = 8 / (tp x pp x cp), EP and the
    expert TP (the name's ``etpN``, else tp) folded over tp x cp x dp, top-k from its column, FFN 4h where empty; the
    table's ``tp2_pp2_ep2_etp2`` test runs tensor-model-parallel-size 4 (its column; see the README)."""
    from wattcast.simulate.parallel import expert_dp
    from wattcast.validation.megatron_ci import ci_etp, load_megatron_ci_moe

    moe, dropped = load_megatron_ci_moe(data_root)
    assert len(moe) == 50 and moe["test_case"].nunique() == 12
    assert moe["test_case"].str.startswith("moe/gpt3_mcore_").all() and not moe["test_case"].str.contains("_1node").any()
    assert dropped["not a regular or release run"] == 29 and dropped["not a DGX A100 platform"] == 20
    assert (moe["ffn"] == 4 * 512).all()
    first = lambda name: moe[moe["test_case"] == name].iloc[0]  # noqa: E731
    r = first("moe/gpt3_mcore_te_tp2_pp1_te_8experts2parallel_dist_optimizer")
    par = ci_parallel(r)[0]
    assert (par.gpus, par.tp, par.pp, par.cp, par.dp, par.ep, ci_etp(r), r.n_experts, r.topk) == (8, 2, 1, 1, 4, 2, 2, 8, 1)
    assert expert_dp(par) == 2  # tp 2 x dp 4 / (etp 2 x ep 2)
    assert first("moe/gpt3_mcore_te_tp2_pp1_te_8experts2parallel_top2router").topk == 2
    r = first("moe/gpt3_mcore_tp2_pp2_ep2_etp2_te_4experts2parallel")
    par = ci_parallel(r)[0]
    assert (par.tp, par.pp, par.dp, par.ep, par.etp) == (4, 2, 1, 2, 2)
    r = first("moe/gpt3_mcore_cp2_pp2_ep2_te_4experts2parallel_nondeterministic")
    par = ci_parallel(r)[0]
    assert (par.tp, par.cp, par.pp, par.dp, par.ep, ci_etp(r)) == (1, 2, 2, 2, 2, 1)
    assert ci_config(r)["num_experts"] == 4 and ci_config(r)["num_experts_per_tok"] == 1
    # the dense reading is unchanged: no MoE row there
    assert not load_megatron_ci(data_root)[0]["test_case"].str.startswith("moe/").any()


def test_moe_settings_the_table_cannot_settle_are_marked(data_root):
    """Grouped GEMMs (TEGroupedMLP) are marked, as is deterministic mode on TE flash attention; the rest are not."""
    from wattcast.validation.megatron_ci import load_megatron_ci_moe

    moe = load_megatron_ci_moe(data_root)[0]
    why = {r.test_case: ci_unmodelled(r) for r in moe.itertuples(index=False)}
    assert "--moe-grouped-gemm" in why["moe/gpt3_mcore_te_tp2_pp1_te_8experts2parallel_overlap_grad_reduce_param_gather_groupedGEMM"]
    assert "deterministic mode" in why["moe/gpt3_mcore_tp2_cp2_pp2_ep2_te_4experts2parallel"]
    assert why["moe/gpt3_mcore_cp2_pp2_ep2_te_4experts2parallel_nondeterministic"] == ""
    assert sum(bool(w) for w in why.values()) == 3


def test_moe_bare_op_cost_lands_on_the_moe_layers_bare_ops_only():
    """The MoE per-op host cost applies to the MoE layer's bare torch ops (tag ``moe``: router, permute, the expert
    loop's elementwise ops and collectives), not to its experts' TE linears nor to any op outside the layer; without
    it every node keeps the per-kernel cost as a scalar (the dense graphs' costing unchanged)."""
    import numpy as np

    from wattcast.simulate.distributed import moe_bare_op_mask, node_launch_ms

    nodes = pd.DataFrame({
        "name": ["moe.gate", "moe.permute", "experts.0.linear_fc1", "experts.0.linear_fc1.dgrad", "experts.0.gelu",
                 "moe.dispatch.all_gather", "mlp.c_fc", "attn.c_attn", "ln_2"],
        "scope": ["transformer.h.1", "transformer.h.1", "moe.experts.0", "moe.experts.0", "moe.experts.0",
                  "transformer.h.1", "transformer.h.0", "transformer.h.1", "transformer.h.1"],
        "op_class": ["linear", "memory", "linear", "linear", "elementwise", "collective", "linear", "linear", "norm"],
        "tag": ["moe", "moe", "moe", "moe", "moe,moe_act", "moe", "mlp", "", None]})
    assert moe_bare_op_mask(nodes).tolist() == [True, True, False, False, True, True, False, False, False]
    assert np.array_equal(node_launch_ms(nodes, 0.1, 0.05), [0.05, 0.05, 0.1, 0.1, 0.05, 0.05, 0.1, 0.1, 0.1])
    assert node_launch_ms(nodes, 0.1, None) == 0.1


def test_moe_bare_op_mask_leaves_the_shared_experts_te_linears_out():
    """Fails on the code before stop 46's review fix (the shared experts' linear_fc1 / linear_fc2, forward and
    backward, took the MoE bare-op cost). Megatron-Core builds SharedExpertMLP on the backend's column/row-parallel
    linears (megatron-core 0.16.1 models/gpt/moe_module_specs.py l. 42-60: TE modules under the TE spec); only its
    gate is a bare ``torch.nn.functional.linear`` on a parameter (transformer/moe/shared_experts.py l. 57, 129)."""
    from wattcast.featurize.workload import StepOptions, step_graph
    from wattcast.simulate.distributed import moe_bare_op_mask

    g = step_graph("qwen1.5_moe_a2.7b", StepOptions(batch=1, seq=256, mode="train", dtype="bf16", blocks=2,
                                                     framework="megatron"))
    n = g.nodes
    mask = pd.Series(moe_bare_op_mask(n), index=n.index)
    names = n["name"].astype(str)
    fc = names.str.match(r"mlp\.shared_experts\.linear_fc[12](\.dgrad|\.wgrad)?$")
    gate = names.str.match(r"mlp\.shared_experts\.gate(\.dgrad|\.wgrad)?$")
    assert fc.sum() == 2 * 2 * 3 and gate.sum() == 2 * 3  # two layers, forward + dgrad + wgrad
    assert not mask[fc].any() and mask[gate].all()
    assert mask[names == "moe.gate"].all()  # the router's gating linear stays a bare op


def test_moe_op_host_cost_moves_moe_rows_only_and_was_fitted_on_the_moe_fitting_half(data_root):
    """A dense row predicts bit-identically with or without the MoE bare-op cost; a MoE row predicts as before at the
    per-kernel cost and faster at the fitted one. CI_MOE_OP_HOST_MS is the grid's best on the MoE tests' fitting half,
    inside the grid, and no MoE test is on both sides."""
    from wattcast.validation.megatron_ci import (_MOE_OP_GRID, CI_MOE_OP_HOST_MS, ci_moe_host_ms, fit_ci_moe_host,
                                                 load_megatron_ci_moe)

    dense = load_megatron_ci(data_root)[0].drop_duplicates("test_case").head(2)
    base, with_moe = (predict_megatron_ci(dense, host_ms=h) for h in (CI_HOST_FIT, ci_moe_host_ms()))
    assert base["predicted_ms"].tolist() == with_moe["predicted_ms"].tolist()
    moe = load_megatron_ci_moe(data_root)[0]
    row = moe[moe["test_case"].str.endswith("tp2_pp2_ep2_te_4experts2parallel")].head(1)
    kw = dict(moe_token_dispatcher="allgather")
    old, same, fitted = (predict_megatron_ci(row, host_ms=h, **kw).iloc[0]
                         for h in (CI_HOST_FIT, ci_moe_host_ms(CI_HOST_FIT[0]), ci_moe_host_ms()))
    assert old["predicted_ms"] == same["predicted_ms"]
    assert fitted["predicted_ms"] < old["predicted_ms"] and fitted["launch_gap_ms"] < old["launch_gap_ms"]
    assert "MoE per-op host cost" in predict_megatron_ci(row, host_ms=ci_moe_host_ms(-1.0), **kw)["status"].iloc[0]
    fit, ev = ci_split(moe)
    assert not set(fit["test_case"]) & set(ev["test_case"])
    best = fit_ci_moe_host(moe).iloc[0]
    assert best.moe_op_ms == CI_MOE_OP_HOST_MS and min(_MOE_OP_GRID) < CI_MOE_OP_HOST_MS < max(_MOE_OP_GRID)


def test_moe_tests_at_expert_tp_above_one_run_without_linear_biases(data_root):
    """Megatron-Core refuses linear biases in a MoE model unless the expert TP is 1 ("Bias in Moe is only supported
    when ETP==1", megatron-core 0.16.1 transformer_config.py l. 1588-1591), and the expert TP defaults to the TP: the
    MoE tests at expert TP 2 ran with --disable-bias-linear whatever their names say, the expert-TP-1 ones as named.
    Until stop 47 every MoE test was costed with biases (each local expert's bias add, bias scale and add and their
    gradients: the expert-TP-2 tests +12% on the fitting half, +13% on the evaluation half). The split's sides stay
    as they were drawn (the side key reads the biases from the name alone)."""
    from wattcast.validation.megatron_ci import _SIDE_KEY_OMITS, ci_bias_linear, ci_moe_host_ms, load_megatron_ci_moe

    moe = load_megatron_ci_moe(data_root)[0]
    first = lambda name: next(moe[moe["test_case"] == f"moe/gpt3_mcore_{name}"].itertuples(index=False))  # noqa: E731
    etp2 = first("te_tp2_pp1_te_8experts2parallel_top2router")
    etp1 = first("te_tp2_pp1_te_8experts_etp1_ep4")
    assert (etp2.etp, etp1.etp) == (2, 1)
    assert ci_config(etp2)["add_bias_linear"] is False and ci_config(etp1)["add_bias_linear"] is True
    assert ci_config(first("cp2_pp2_ep2_te_4experts2parallel_nondeterministic"))["add_bias_linear"] is True
    # a dense test's biases as its name says; an explicit --disable-bias-linear stays off at expert TP 1
    assert ci_bias_linear("gpt/x") is True and ci_bias_linear("gpt/x_disable_bias_linear", 1) is False
    # the side key is the pre-stop-47 reading: the halves are the ones CI_MOE_OP_HOST_MS was fitted and reported on
    assert ci_config(etp2, moe_bias_rule=False)["add_bias_linear"] is True
    assert "'add_bias_linear', True" in ci_model_key(etp2, omit=_SIDE_KEY_OMITS)
    fit = set(ci_split(moe)[0]["test_case"].str.replace("moe/gpt3_mcore_", ""))
    assert fit == {"cp2_pp2_ep2_te_4experts2parallel_nondeterministic",
                   "cp2_pp2_ep2_te_4experts2parallel_nondeterministic_dp_last",
                   "te_tp2_pp1_te_8experts2parallel_top2router", "te_tp2_pp1_te_8experts_etp1_ep4",
                   "tp2_cp2_pp2_ep2_te_4experts2parallel", "tp2_cp2_pp2_ep2_te_4experts2parallel_dp_last"}
    # the expert-TP-2 row loses its bias ops (fewer bare MoE ops: a shorter launch gap), the expert-TP-1 row is as was
    kw = dict(host_ms=ci_moe_host_ms(), moe_token_dispatcher="allgather")
    p = predict_megatron_ci(pd.DataFrame([etp2._asdict()]), **kw).iloc[0]
    assert p["launch_gap_ms"] < 190.0  # 200.0 with the biases (CI_MOE_OP_HOST_MS 0.0625)
    assert predict_megatron_ci(pd.DataFrame([etp1._asdict()]), **kw)["launch_gap_ms"].iloc[0] == pytest.approx(143.0, abs=0.1)  # 143.4 before stop 49's GPU kernel floor
