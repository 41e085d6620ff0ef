"""Audit 54a finding 3: a distributed Chrome trace's ``otherData`` did not record settings that change the step (the
framework, seq, global batch, micro-batch, FP8 recipe, gradient dtype, FP8 parameter gather, the cross-entropy fusion,
the optimizer, the attention). They are now there, as ``predict --cluster --json``'s ``settings`` gives them, beside
every key the trace had before (unchanged)."""

import json

from conftest import run_cli

ARGS = ("predict", "-m", "gpt2", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "16", "--seq", "1024",
        "--tp", "2", "--pp", "2", "--micro-batch", "2", "--sp", "--framework", "megatron", "--zero", "1",
        "--dtype", "fp8", "--fp8-recipe", "tensorwise", "--grad-reduce-in-bf16", "--fp8-param-gather",
        "--no-cross-entropy-loss-fusion", "--optimizer", "adamw-bf16", "--attention", "flash")


def test_trace_other_data_records_the_step_settings(tmp_path):
    trace = tmp_path / "t.json"
    r = run_cli(*ARGS, "--trace", trace, "--json")
    assert r.returncode == 0, r.stderr
    other = json.loads(trace.read_text())["otherData"]
    given = dict(framework="megatron", seq=1024, batch=16, micro_batch=2, dtype="fp8", fp8_recipe="tensorwise",
                 grad_accum_dtype="bf16", fp8_param_gather=True, cross_entropy_loss_fusion=False,
                 optimizer="adamw-bf16", attention="flash")
    assert {k: other.get(k) for k in given} == given
    assert other["cross_entropy_fusion_impl"] == "native"
    settings = json.loads(r.stdout)["settings"]  # the same values predict --json gives
    for k in ("framework", "seq", "batch", "micro_batch", "fp8_recipe", "grad_accum_dtype", "fp8_param_gather",
              "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "optimizer", "optimizer_impl", "attention"):
        assert other[k] == settings[k], k
    # the keys it had before, unchanged
    assert other["model"] == "gpt2" and other["cluster"] == "DGX-H100"
    assert other["parallel"].startswith("dp2-tp2-pp2") and other["step_time_ms"] > 0
    assert set(other["overlaps"]) >= {"overlap_grad_reduce", "tp_comm_overlap"}
    assert {"exposed_comm_split_ms", "truncated", "moe_load"} <= set(other)


def test_trace_without_fp8_has_no_recipe_and_says_the_defaults(tmp_path):
    trace = tmp_path / "t.json"
    r = run_cli("predict", "-m", "gpt2", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "16", "--seq", "512",
                "--tp", "2", "--micro-batch", "1", "--trace", trace)
    assert r.returncode == 0, r.stderr
    other = json.loads(trace.read_text())["otherData"]
    assert "fp8_recipe" not in other and other["dtype"] == "bf16"
    assert (other["framework"], other["seq"], other["batch"], other["micro_batch"]) == ("hf", 512, 16, 1)
    assert other["optimizer"] == "adamw" and other["fp8_param_gather"] is False
