"""Megatron-Core's --cross-entropy-loss-fusion: the native jit-fused loss (megatron/core/fusions/fused_cross_entropy.py)
and Transformer Engine's Triton kernels (cross_entropy_fusion_impl "te"), kernel by kernel, with what they save; the
framework default (on for megatron, as Megatron-Bridge's recipes run it), the CI tests that name it, and the flags."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph

V_PAD, T = 50304, 2 * 256  # Megatron's padded GPT-2 vocabulary at TP 1, tokens of one micro-batch


def _gpt(layers: int = 2) -> dict:
    return {"model_type": "gpt2", "n_embd": 256, "n_head": 8, "n_layer": layers, "n_positions": 256,
            "vocab_size": 50257, "activation_function": "gelu", "_name_or_path": "tiny-gpt-ce"}


def _graph(**kw):
    kw = dict(dict(batch=2, seq=256, dtype="bf16", mode="train", framework="megatron"), **kw)
    return step_graph(_gpt(), StepOptions(**kw))


def _loss(g):
    n = g.nodes
    return n[n["name"].astype(str).str.match(r"loss(\.|$)") & (n["op_class"] != "collective")]


def _saved_bytes(g, names) -> float:
    """Bytes the named forward nodes keep for backward."""
    n = g.nodes
    idx = n.index[(n["phase"] == "forward") & n["name"].isin(names)]
    tb = g.saved["tensor_bytes"] if "tensor_bytes" in g.saved else None
    by_node = g.saved["by_node"]
    assert tb is not None
    return float(sum(tb[t] for i in idx for t in by_node[i]))


def test_native_fusion_is_four_kernels_and_32_bytes_a_logit_and_keeps_fp32_probabilities():
    unfused, fused = _graph(cross_entropy_loss_fusion=False), _graph(cross_entropy_loss_fusion=True)
    lf = _loss(fused)
    # calculate_logits_max, calculate_predicted_logits, calculate_cross_entropy_loss; backward calculate_gradients
    assert sorted(lf["name"]) == sorted(["loss.calculate_logits_max", "loss.calculate_predicted_logits", "loss",
                                         "loss.calculate_gradients"])
    per_logit = lf["bytes"].sum() / (T * V_PAD)
    assert per_logit == pytest.approx(2 + 4 + 8 + 8 + 4 + 4 + 2, rel=1e-3)  # 32 B (the unfused path: 52)
    assert _loss(unfused)["bytes"].sum() / (T * V_PAD) == pytest.approx(52, rel=1e-6)
    # both keep the fp32 softmax for backward (ctx.save_for_backward(exp_logits, ...)): 4 B a logit
    assert _saved_bytes(fused, ["loss"]) == pytest.approx(4 * T * V_PAD, rel=1e-6)
    assert _saved_bytes(unfused, ["loss"]) == pytest.approx(4 * T * V_PAD, rel=1e-6)


def test_te_fusion_is_two_kernels_of_8_bytes_a_logit_and_saves_a_bf16_copy():
    g = _graph(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    lt = _loss(g)
    assert sorted(lt["name"]) == ["loss", "loss.cross_entropy_backward_kernel"]
    assert lt["bytes"].sum() / (T * V_PAD) == pytest.approx(8, rel=1e-3)
    # the logits' bf16 copy (2 B a logit) and two fp32 statistics a row
    assert _saved_bytes(g, ["loss"]) == pytest.approx(2 * T * V_PAD + 8 * T, rel=1e-6)


def test_tensor_parallel_statistics_per_implementation():
    def colls(**kw):
        n = _graph(tp=2, **kw).nodes
        c = n[(n["op_class"] == "collective") & n["name"].astype(str).str.startswith("loss.")]
        return sorted(zip(c["name"], c["kernel"], c["bytes"]))

    assert [k for _, k, _ in colls(cross_entropy_loss_fusion=False)] == ["all_reduce"] * 3
    # the fused path batches the target logit and the sum of exponentials into one all-reduce
    assert colls(cross_entropy_loss_fusion=True) == [("loss.all_reduce_max", "all_reduce", 4.0 * T),
                                                     ("loss.all_reduce_target_sum_exp", "all_reduce", 8.0 * T)]
    # TE: one all_gather_into_tensor of four fp32 a row from each of the 2 ranks
    assert colls(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te") == [
        ("loss.all_gather_stats", "all_gather", 16.0 * T * 2)]


def test_default_is_on_for_megatron_only_and_refused_elsewhere():
    assert StepOptions(framework="megatron").validated().cross_entropy_loss_fusion is True
    assert StepOptions(framework="megatron-deepspeed").validated().cross_entropy_loss_fusion is False
    assert StepOptions(framework="hf").validated().cross_entropy_loss_fusion is False
    assert "loss.calculate_logits_max" in set(_graph().nodes["name"])
    assert "loss.float" in set(_graph(framework="megatron-deepspeed").nodes["name"])
    for fw in ("hf", "megatron-deepspeed"):
        with pytest.raises(GraphError, match="cross-entropy-loss-fusion"):
            StepOptions(framework=fw, cross_entropy_loss_fusion=True).validated()
    with pytest.raises(GraphError, match="cross_entropy_fusion_impl"):
        StepOptions(framework="megatron", cross_entropy_fusion_impl="liger").validated()


def test_megatron_ci_reads_the_fusion_from_the_test_name():
    from wattcast.validation.megatron_ci import ci_ce_fusion, load_megatron_ci, predict_megatron_ci

    assert ci_ce_fusion("gpt/gpt3_mcore_te_tp2_pp2_cross_entropy_loss_fusion")
    assert not ci_ce_fusion("gpt/gpt3_mcore_te_tp2_pp2")
    df, _ = load_megatron_ci()
    rows = df[df["test_case"].isin(["gpt/gpt3_mcore_te_tp2_pp2", "gpt/gpt3_mcore_te_tp2_pp2_cross_entropy_loss_fusion"])
              & (df["platform_env"] == "dev_dgx_a100")]
    assert len(rows) == 2
    p = predict_megatron_ci(rows).set_index("test_case")["predicted_ms"]
    # the same model and strategy: the fused test predicts faster (measured 166.7 vs 215.5 ms on dev_dgx_a100)
    assert p["gpt/gpt3_mcore_te_tp2_pp2_cross_entropy_loss_fusion"] < p["gpt/gpt3_mcore_te_tp2_pp2"]


def test_predict_cluster_and_cli_take_the_flags():
    import wattcast
    from wattcast.cli import app

    kw = dict(gpus=2, batch=4, seq=256, tp=1, micro_batch=1, dtype="bf16", attention="flash", framework="megatron")
    off = wattcast.predict_cluster(_gpt(), "DGX-A100", cross_entropy_loss_fusion=False, **kw)
    on = wattcast.predict_cluster(_gpt(), "DGX-A100", **kw)
    te = wattcast.predict_cluster(_gpt(), "DGX-A100", cross_entropy_fusion_impl="te", **kw)
    assert te.step_time_ms < on.step_time_ms < off.step_time_ms
    assert te.memory_gb < on.memory_gb
    runner = CliRunner()
    bad = runner.invoke(app, ["predict", "-m", "gpt2", "--cross-entropy-loss-fusion"])
    assert bad.exit_code != 0 and "--cross-entropy-loss-fusion" in bad.output
    args = ["predict", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "2", "--batch", "4", "--seq", "256",
            "--dtype", "bf16", "--attention", "flash", "--framework", "megatron", "--json"]
    a = runner.invoke(app, args + ["--no-cross-entropy-loss-fusion"])
    b = runner.invoke(app, args)
    assert a.exit_code == 0 and b.exit_code == 0, b.output
    assert json.loads(b.stdout)["step_time_ms"] < json.loads(a.stdout)["step_time_ms"]
