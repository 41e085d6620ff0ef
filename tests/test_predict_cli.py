"""`wattcast predict` (its JSON contract, tables, errors) and `wattcast validate labels` on the real labels."""

from __future__ import annotations

import json

import pytest

from conftest import flat, run_cli

#: the keys `wattcast predict --json` promises (other tools and tests rely on exactly these)
CONTRACT_KEYS = ("forward_ms", "backward_ms", "optimizer_ms", "step_time_ms", "memory_gb", "flops", "per_op",
                 "fallback_ops", "ood_fraction")


def test_predict_json_contract():
    r = run_cli("predict", "--model", "gpt2", "--device", "A100-SXM4-80GB", "--batch", "4", "--seq", "512", "--mode", "train",
                "--dtype", "bf16", "--attention", "flash", "--optimizer", "adamw", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for k in CONTRACT_KEYS:
        assert k in d, k
    assert d["step_time_ms"] == pytest.approx(d["forward_ms"] + d["backward_ms"] + d["optimizer_ms"])
    assert all({"op_class", "count", "time_ms"} <= set(p) for p in d["per_op"])
    assert d["fits"] is True and d["memory_gb"] > 0


def test_predict_inference_table_and_compile(tmp_path):
    trace = tmp_path / "trace.json"
    r = run_cli("predict", "--model", "bert_base", "--device", "T4", "--batch", "8", "--seq", "128", "--mode", "inference",
                "--compile", "--trace", trace)
    assert r.returncode == 0, r.stderr
    out = flat(r.stdout)
    assert "per op class" in out and "fused" in out
    assert json.loads(trace.read_text())["traceEvents"]


def test_predict_hf_config_file(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
                               "num_key_value_heads": 2, "intermediate_size": 1376, "vocab_size": 32000}))
    r = run_cli("predict", "--model", cfg, "--device", "L4", "--batch", "2", "--seq", "256", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"] == tmp_path.name


def test_predict_oom_is_reported_with_numbers():
    r = run_cli("predict", "--model", "llama2_7b", "--device", "L4", "--batch", "8", "--seq", "4096", "--dtype", "bf16")
    assert r.returncode == 3
    msg = flat(r.stderr)
    # the L4's 24 GB are 24 GiB (25.8e9 bytes), the capacity a prediction (in 1e9-byte GB) is compared with
    assert "does not fit" in msg and "25.8 GB (24 GiB)" in msg and "Traceback" not in msg


@pytest.mark.parametrize("args,needle", [
    (("--model", "no_such_model"), "not a file and not a built-in model"),
    (("--model", "gpt2", "--mode", "serve"), "unknown mode"),
    (("--model", "gpt2", "--dtype", "fp12"), "unknown dtype"),
    (("--model", "gpt2", "--device", "NoSuchGPU"), "NoSuchGPU"),
])
def test_predict_bad_input_is_a_clear_error(args, needle):
    full = list(args)
    if "--device" not in full:
        full += ["--device", "L4"]
    r = run_cli("predict", *full)
    assert r.returncode == 2
    assert needle in flat(r.stderr) and "Traceback" not in r.stderr


def test_predict_unknown_model_type(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "mamba", "hidden_size": 64}))
    r = run_cli("predict", "--model", cfg, "--device", "L4")
    assert r.returncode == 2 and "unknown model_type 'mamba'" in flat(r.stderr) and "Traceback" not in r.stderr


def test_predict_truncated_config(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "gpt2", "n_embd": 7')
    r = run_cli("predict", "--model", cfg, "--device", "L4")
    assert r.returncode == 2 and "cannot read as a JSON config" in flat(r.stderr)


# ------------------------------------------------------------------ the real labels
#: held-out end-to-end mean absolute error (%) reached by this version; fail if it gets worse. (Raised from
#: 7.0 / 20.5 when FP32 kernels began to be costed without the isolated-timing floor, a change chosen on the
#: training GPUs' labels, 7.7% -> 5.8% mean, that moved the held-out A100 80GB train labels to 11.5% and L4 to
#: 21.3%; reported as measured, not tuned back. Autograd's gradient accumulation in the training graphs, kept
#: on the training GPUs' train labels, 3.4% -> 3.1%, then gave 11.1 / 20.7. The GEMM family's refit at stop 34, for
#: the ceiling member's CDNA fix, moved the A100 80GB's 11.57 -> 11.62: reported, not tuned back.)
E2E_HELDOUT_BOUND_PCT = {"A100-PCIe-80GB": 11.7, "L4": 21.2}


@pytest.mark.e2e
def test_validate_labels_cli_and_heldout_regression(data_root, tmp_path):
    out = tmp_path / "labels.csv"
    r = run_cli("validate", "labels", "--no-mlflow", "--output", out, data=data_root, timeout=900)
    assert r.returncode == 0, r.stderr
    import pandas as pd

    from wattcast.validation.e2e_labels import summarise_labels

    df = pd.read_csv(out)
    ok = df[df["status"] == "ok"]
    # every single-GPU label with a config in the dataset is predicted (switch4 has none)
    assert len(ok) >= 90
    assert set(df.loc[df["status"] != "ok", "model"]) <= {"switch4"}
    s = summarise_labels(df).set_index(["device", "kind"])
    for dev, bound in E2E_HELDOUT_BOUND_PCT.items():
        assert s.loc[(dev, "all"), "mean_abs_error_pct"] <= bound, (dev, s.loc[(dev, "all")])
    assert "forward and backward apart" in r.stdout
    # the per-kernel source check: every label with a CSV carries its statistic, the reading beside the headline
    assert "without source anomalies" in r.stdout and "Source anomalies" in r.stdout
    assert int(df["source_anomaly"].sum()) == int((df["kernel_fw_excess"].notna() & df["source_anomaly"]).sum()) > 0
    assert (s.loc[("A100-PCIe-80GB", "all-without-source-anomalies"), "labels"]
            < s.loc[("A100-PCIe-80GB", "all"), "labels"])


def test_train_split_separates_forward_and_backward_errors():
    import pandas as pd

    from wattcast.validation.e2e_labels import summarise_train_split

    df = pd.DataFrame({
        "status": ["ok", "ok", "ok", "graph: x"], "mode": ["train", "train", "inf", "train"],
        "device": ["V100-PCIe-32GB", "V100-PCIe-32GB", "V100-PCIe-32GB", "L4"],
        # forward 20% slow on the first label, backward exact; the inference label and the failed one are ignored
        "predicted_fw_ms": [120.0, 50.0, 10.0, 1.0], "measured_fw_ms": [100.0, 50.0, 12.0, 1.0],
        "predicted_bw_ms": [200.0, 110.0, 0.0, 1.0], "measured_bw_ms": [200.0, 100.0, 0.0, 1.0],
        "abs_error_pct": [100 * 20 / 300, 100 * 10 / 150, 16.7, 0.0],
    })
    t = summarise_train_split(df).set_index("device")
    assert list(t.index) == ["V100-PCIe-32GB"]
    r = t.loc["V100-PCIe-32GB"]
    assert r["labels"] == 2
    assert r["fw_mean_abs_error_pct"] == pytest.approx(10.0)  # (20 + 0) / 2
    assert r["bw_mean_abs_error_pct"] == pytest.approx(5.0)  # (0 + 10) / 2
    assert r["measured_fw_over_bw"] == pytest.approx((0.5 + 0.5) / 2)
    assert r["predicted_fw_over_bw"] == pytest.approx((0.6 + 50 / 110) / 2)
    assert not r["heldout"]
    assert r["fw_inconsistent"] == 0


def test_labels_summary_leaves_out_forwards_inconsistent_with_their_backward():
    import pandas as pd

    from wattcast.validation.e2e_labels import FW_OVER_BW_CONSISTENT_MAX, forward_consistent, summarise_labels

    df = pd.DataFrame({
        "status": ["ok"] * 4, "mode": ["train", "train", "inf", "train"], "fusion": [False] * 4,
        "device": ["L4"] * 4,
        # the second label's measured forward is 0.9 of its backward: its forward carries time the kernels do not;
        # an inference label (no backward) and a label at exactly the limit stay
        "measured_fw_ms": [50.0, 90.0, 10.0, 100.0 * FW_OVER_BW_CONSISTENT_MAX],
        "measured_bw_ms": [100.0, 100.0, 0.0, 100.0],
        "error_pct": [2.0, -30.0, 4.0, -6.0],
    })
    df["abs_error_pct"] = df["error_pct"].abs()
    assert forward_consistent(df).tolist() == [True, False, True, True]
    s = summarise_labels(df).set_index(["device", "kind"])
    assert s.loc[("L4", "all"), "labels"] == 4
    assert s.loc[("L4", "all"), "mean_abs_error_pct"] == pytest.approx(42.0 / 4)
    c = s.loc[("L4", "all-fw-consistent")]
    assert c["labels"] == 3
    assert c["mean_abs_error_pct"] == pytest.approx(4.0)
    assert c["mean_signed_error_pct"] == pytest.approx(0.0)


def _tiny_onnx(path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 128])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                          "tiny", [x], [y], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_predict_onnx_file(tmp_path):
    f = tmp_path / "tiny.onnx"
    _tiny_onnx(f)
    r = run_cli("predict", "--model", f, "--device", "A10", "--batch", "4", "--seq", "256", "--mode", "train", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert {p["op_class"] for p in d["per_op"]} >= {"linear", "elementwise", "optimizer"}
    assert d["param_count"] == 64 * 128


def test_predict_truncated_onnx(tmp_path):
    f = tmp_path / "tiny.onnx"
    _tiny_onnx(f)
    f.write_bytes(f.read_bytes()[:60])
    r = run_cli("predict", "--model", f, "--device", "A10")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "not a readable ONNX model" in flat(r.stderr)


def test_tight_memory_is_flagged_not_hidden():
    # 34.1 GB predicted on a 32 GB (= 32 GiB = 34.4e9 bytes) card: inside the memory estimate's error, so the CLI says
    # so (and still answers). Batch 6: full recomputation keeps no dropout masks, AMP's gradients are fp32, the fp32
    # loss holds 10 bytes a logit beside them (batch 8 until stop 55, when it held 4: 33.6 GB)
    r = run_cli("predict", "--model", "gpt2_xl", "--device", "V100-PCIe-32GB", "--batch", "6", "--seq", "1024",
                "--mode", "train", "--dtype", "fp16", "--attention", "eager", "--recompute", "full", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert "memory is tight" in flat(r.stderr) and d["fits"] is True
    assert d["memory_flag"] == "tight" and d["memory_capacity_gb"] == pytest.approx(32 * 2**30 / 1e9)


def test_tight_refusal_is_one_verdict():
    # issue 15: 35.1 GB on a 32 GiB (34.4e9 bytes) card is 2% over, inside the memory estimate's error band: the refusal
    # (exit 3, as the README's contract says) says so itself, and the "memory is tight ... cannot tell" warning that
    # contradicted it is not printed as well (batch 7; 10 until stop 55, before the fp32 loss's 10 bytes a logit)
    args = ("predict", "--model", "gpt2_xl", "--device", "V100-PCIe-32GB", "--batch", "7", "--seq", "1024",
            "--mode", "train", "--dtype", "fp16", "--attention", "eager", "--recompute", "full")
    r = run_cli(*args)
    said = flat(r.stdout + r.stderr)
    assert r.returncode == 3 and "does not fit" in said and "Traceback" not in said
    assert "predicted 35.1 GB of 34.4 GB: over by 2.2%, inside the \u00b15% the memory estimate cannot resolve" in said
    assert "memory is tight" not in said and "cannot tell fitting" not in said
    # --allow-oom predicts it: no refusal, the tight warning stays
    r = run_cli(*args, "--allow-oom", "--json")
    assert r.returncode == 0 and "memory is tight" in flat(r.stderr)
    assert json.loads(r.stdout)["memory_flag"] == "tight"
    # plainly over (outside the band): today's refusal, without the band's wording
    r = run_cli(*args[:6], "16", *args[7:])
    said = flat(r.stdout + r.stderr)
    assert r.returncode == 3 and "does not fit" in said and "cannot resolve" not in said and "memory is tight" not in said


def test_tight_refusal_of_a_cluster_is_one_verdict():
    # issue 15's report: 405B on 16,384 H100s, stage 1 at 87.7 GB of 85.9 GB (2.1% over; 87.2 until stop 55, before a
    # stage carried its largest kernel's working set): refused (exit 3) saying it
    # is inside the band, with no contradicting "cannot tell" warning. Meta's 7, 8 x 14, 7 given: since stop 52 the
    # automatic split gives way to 7, 7, 8 x 14, which fits (test_automatic_pipeline_split)
    r = run_cli("predict", "-m", "llama3_405b", "--cluster", "DGX-H100", "--gpus", "16384", "--batch", "2048", "--seq",
                "8192", "--tp", "8", "--pp", "16", "--micro-batch", "1", "--sp", "--framework", "megatron", "--zero", "1",
                "--pp-first-stage-layers", "7", "--pp-last-stage-layers", "7")
    said = flat(r.stdout + r.stderr)
    assert r.returncode == 3 and "does not fit: stage 1 needs 87.7 GB" in said
    assert "predicted 87.7 GB of 85.9 GB: over by 2.1%, inside the \u00b15%" in said
    assert "cannot tell fitting" not in said and "memory is tight" not in said


def test_refusal_names_the_flags_that_make_it_fit():
    """Issue 15 (stop 52 audit): Llama 3 405B as Meta trained it (TP8 PP16, no recomputation) under Megatron-Core at
    ZeRO-1 is 1.3 GB over (stage 1: 8 layers x 15 micro-batches of activations, fp32 main gradients, TE's userbuffers);
    the refusal names the flags that each make it fit, re-predicted, and each does: --grad-reduce-in-bf16 (bf16 main
    gradients: 12.75 -> 6.38 GB, plus the 0.10 GB fp32 copy of the shard after the backward) and --no-tp-comm-overlap
    (no userbuffers: -3.29 GB, inside the tight band). Meta's own split (7, 8 x 14, 7) is given: the automatic one
    now picks a split that fits (tests/test_automatic_pipeline_split.py). Since stop 55 the stage carries its largest
    kernel's working set (0.5 GB: 80.9 / 83.9 GB before)."""
    args = ("predict", "-m", "llama3_405b", "--cluster", "DGX-H100", "--gpus", "16384", "--batch", "2048", "--seq",
            "8192", "--tp", "8", "--pp", "16", "--micro-batch", "1", "--sp", "--framework", "megatron", "--zero", "1",
            "--pp-first-stage-layers", "7", "--pp-last-stage-layers", "7")
    r = run_cli(*args)
    said = flat(r.stdout + r.stderr)
    assert r.returncode == 3
    assert ("pass --grad-reduce-in-bf16 (81.3 GB) or --no-tp-comm-overlap (84.4 GB, tight) (each fits alone, "
            "re-predicted); or use --zero") in said
    for flag, gb in (("--grad-reduce-in-bf16", 81.3), ("--no-tp-comm-overlap", 84.4)):
        r = run_cli(*args, flag, "--json")
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert d["fits"] and round(d["memory_gb"], 1) == gb


def test_memory_pressure_warns_about_step_time_not_fit():
    # 32.1 GB of 32 GiB (93%): fits, outside the tight band, but where measured eager training forwards slowed (batch
    # 4: full recomputation keeps no dropout masks, AMP's gradients are fp32, the fp32 loss holds 10 bytes a logit;
    # batch 6 until stop 55)
    r = run_cli("predict", "--model", "gpt2_xl", "--device", "V100-PCIe-32GB", "--batch", "4", "--seq", "1024",
                "--mode", "train", "--dtype", "fp16", "--attention", "eager", "--recompute", "full", "--json")
    assert r.returncode == 0, r.stderr
    err = flat(r.stderr)
    assert "memory pressure" in err and "memory is tight" not in err
    d = json.loads(r.stdout)
    assert d["fits"] is True and d["memory_flag"] == "pressure"
    # the same model in inference is far from capacity: no warning
    r = run_cli("predict", "--model", "gpt2_xl", "--device", "V100-PCIe-32GB", "--batch", "2", "--seq", "1024",
                "--mode", "inference", "--dtype", "fp16", "--json")
    assert r.returncode == 0 and "memory pressure" not in flat(r.stderr)
    assert json.loads(r.stdout)["memory_flag"] == ""


def test_memory_flag_bands():
    from wattcast.simulate.memory import memory_flag

    assert memory_flag(31.2, 32, eager_training=False) == "tight"  # within 5%, either side
    assert memory_flag(33.5, 32, eager_training=True) == "tight"
    assert memory_flag(29.1, 32, eager_training=True) == "pressure"  # 91%: fits, time may be low
    assert memory_flag(29.1, 32, eager_training=False) == ""  # measured on eager training only
    assert memory_flag(26.0, 32, eager_training=True) == "pressure"  # 81%: from 79% (the same 54.4e9 bytes on MI210)
    assert memory_flag(24.0, 32, eager_training=True) == ""  # 75%
    assert memory_flag(40.0, 32, eager_training=True) == ""  # plainly does not fit: the fit check says so
    assert memory_flag(10.0, 0.0, eager_training=True) == ""
