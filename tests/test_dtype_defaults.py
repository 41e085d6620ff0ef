"""Precision names and defaults across entry points (a fuzzing pass at stop 37): the cluster path takes the dtype
spellings the single-device path takes (BF16, bfloat16, half: it raised a KeyError), bf16 on a GPU without BF16 is
refused naming the field (it was costed as a fast fp16), the CLI's default is fp16 on such a GPU (with a note), and a
search row carries its sequence length, with the same default as predict's (search's CLI used 2,048)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import wattcast
from wattcast.cli import app
from wattcast.featurize.op_graph import GraphError
from wattcast.simulate.parallel import ParallelConfigError

KW = dict(gpus=8, batch=16, seq=512)


@pytest.mark.parametrize("alias, canonical", [("BF16", "bf16"), ("bfloat16", "bf16"), ("half", "fp16"),
                                              ("FP32", "fp32")])
def test_cluster_predictions_take_dtype_aliases(alias, canonical):
    a = wattcast.predict_cluster("gpt2", "DGX-H100", dtype=alias, **KW)
    b = wattcast.predict_cluster("gpt2", "DGX-H100", dtype=canonical, **KW)
    assert a.step_time_ms == b.step_time_ms


def test_unknown_dtype_is_named():
    with pytest.raises(GraphError, match="unknown dtype 'int8'"):
        wattcast.predict_cluster("gpt2", "DGX-H100", dtype="int8", **KW)


def test_bf16_needs_a_bf16_peak():
    with pytest.raises(ValueError, match="peak_bf16_tflops.*use --dtype fp16"):
        wattcast.predict("bert_base", "V100-SXM2-32GB", batch=8, seq=128, dtype="bf16")
    with pytest.raises(ParallelConfigError, match="peak_bf16_tflops"):
        wattcast.predict_cluster("gpt2", "DGX-1-V100", dtype="bf16", **KW)
    with pytest.raises(ParallelConfigError, match="else --dtype fp16"):  # fp8's message no longer points to bf16 alone
        wattcast.predict_cluster("gpt2", "DGX-1-V100", dtype="fp8", **KW)
    assert wattcast.predict("bert_base", "V100-SXM2-32GB", batch=8, seq=128, dtype="fp16").step_time_ms > 0


def test_cli_default_precision_follows_the_gpu():
    runner = CliRunner()
    r = runner.invoke(app, ["predict", "-m", "bert_base", "-d", "T4", "-b", "8", "-s", "128", "--mode", "inference",
                            "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["settings"]["dtype"] == "fp16" and "has no BF16" in r.stderr.replace("\n", " ")
    r = runner.invoke(app, ["predict", "-m", "bert_base", "-d", "H100-SXM5-80GB", "-b", "8", "-s", "128", "--mode",
                            "inference", "--json"])
    assert json.loads(r.stdout)["settings"]["dtype"] == "bf16" and "has no BF16" not in r.stderr


def test_search_rows_carry_seq_and_default_to_predicts():
    runner = CliRunner()
    r = runner.invoke(app, ["search", "-m", "gpt2", "--cluster", "DGX-H100", "--gpus", "8", "-b", "16", "--workers", "1",
                            "--json", "--top", "3"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["ranked"][0]
    assert row["seq"] == 1024
    p = runner.invoke(app, ["predict", "-m", "gpt2", "--cluster", "DGX-H100", "--strategy", row["strategy"], "--json"])
    assert p.exit_code == 0, p.output
    assert json.loads(p.stdout)["step_time_ms"] == pytest.approx(row["step_time_ms"], rel=1e-9)


def test_the_python_defaults_follow_the_gpu_too():
    """The API's default precision (bf16) is fp16 on a GPU without BF16, with a warning; a bf16 given explicitly is
    refused; a search's rows name the precision they were predicted in."""
    with pytest.warns(UserWarning, match="has no BF16"):
        r = wattcast.predict("gpt2", "T4", batch=1, seq=128, mode="inference")
    assert r.meta["dtype"] == "fp16"
    with pytest.warns(UserWarning, match="has no BF16"):
        c = wattcast.predict_cluster("gpt2", "DGX-1-V100", **KW)
    assert c.step_time_ms == wattcast.predict_cluster("gpt2", "DGX-1-V100", dtype="fp16", **KW).step_time_ms
    with pytest.warns(UserWarning):
        rows = wattcast.search("gpt2", "DGX-1-V100", gpus=8, batch=16, seq=512, workers=1, tp=(1,), pp=(1,)).ranked
    assert set(rows["dtype"]) == {"fp16"}
    assert wattcast.predict_cluster("gpt2", "DGX-H100", **KW).meta["dtype"] == "bf16"


def test_a_gpu_without_16_bit_arithmetic_defaults_to_fp32_and_refuses_fp16():
    """The Tesla P4's spec has no FP16 (or BF16) rate: the default precision there is fp32 (warned; the CLI notes it),
    an explicit fp16 is refused naming peak_fp16_tflops (its linear layers fell back to a roofline before)."""
    with pytest.warns(UserWarning, match="has no BF16 or FP16: predicting fp32"):
        r = wattcast.predict("bert_base", "P4", batch=1, seq=128, mode="inference")
    assert r.meta["dtype"] == "fp32" and not [f for f in r.fallback_ops if f["op_class"] == "linear"]
    with pytest.raises(ValueError, match="peak_fp16_tflops.*use --dtype fp32"):
        wattcast.predict("bert_base", "P4", batch=1, seq=128, mode="inference", dtype="fp16")
    r = CliRunner().invoke(app, ["predict", "-m", "bert_base", "-d", "P4", "-b", "1", "-s", "128", "--mode", "inference",
                                 "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["settings"]["dtype"] == "fp32" and "has no BF16 or FP16" in r.stderr.replace("\n", " ")


def test_tf32_needs_tf32_tensor_cores():
    """On a V100 PyTorch's TF32 setting does nothing: tf32 is refused naming peak_tf32_tflops (it was predicted 19%
    slower than fp32, the tf32 GEMMs keeping a timing floor fp32 rows drop); a tf32 GEMM row of `kernels` gets a row
    error, a tf32 softmax row is fp32's."""
    import pandas as pd

    with pytest.raises(ValueError, match="peak_tf32_tflops.*use --dtype fp32"):
        wattcast.predict("gpt2", "V100-SXM2-32GB", batch=1, seq=128, dtype="tf32")
    out = wattcast.predict_kernels(pd.DataFrame([dict(OPName="linear", dtype="tf32", B=1, M=512, N=512, K=512),
                                                 dict(OPName="softmax", dtype="tf32", B=64, H=512),
                                                 dict(OPName="softmax", dtype="fp32", B=64, H=512)]), "V100-SXM2-32GB")
    assert "peak_tf32_tflops" in out["error"][0] and out["pred_latency_ms"].isna()[0]
    assert out["pred_latency_ms"][1] == out["pred_latency_ms"][2]
    assert wattcast.predict("gpt2", "A100-SXM4-80GB", batch=1, seq=128, dtype="tf32").step_time_ms > 0


def test_megatron_swiglu_needs_a_silu_config():
    """Megatron-Core's --swiglu gates with SiLU: a Llama-family config with another hidden_act is refused under
    --framework megatron (a typo like 'swishy' was accepted silently; the hf path refused it)."""
    import copy

    from pathlib import Path

    import wattcast.featurize

    cfg = json.loads((Path(wattcast.featurize.__file__).parent / "hf_configs" / "llama3_8b.json").read_text())
    bad = copy.deepcopy(cfg)
    bad["hidden_act"] = "swishy"
    # (refused when the config is read, naming the field, whatever the framework: stop 54)
    with pytest.raises(GraphError, match="hidden_act' is 'swishy'"):
        wattcast.predict_cluster(bad, "DGX-H100", framework="megatron", **KW)
    cfg.pop("hidden_act", None)  # not given: Llama's SiLU
    assert wattcast.predict_cluster(cfg, "DGX-H100", framework="megatron", **KW).step_time_ms > 0
