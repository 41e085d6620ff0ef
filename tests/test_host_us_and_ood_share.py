"""Audit 57b items 3 and 4.

3. ``settings["host_us"]`` is always the host cost per kernel launch the step was costed with (given or the default:
   40 us eager PyTorch, 6 us under --compile or --serving, a cluster framework preset's own), and the table's
   launch-gaps row says it; before, the key was there only when --host-us was passed.
4. The OOD warning says "N% of the predicted kernel time"; it read the OOD kernels' share of the step time, host
   launch gaps included, so a host-bound eager decode step hid mostly-OOD kernels (Llama 3 8B decode on an H100: 35%
   at 40 us a launch, no warning; 66% at 6 us, the same kernels). It now reads their share of the kernels' GPU time
   (``ood_kernel_time_fraction``); ``ood_time_fraction`` and the step band keep the step-time share."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import wattcast
from wattcast.cli import app
from wattcast.simulate.step_band import OOD_WARN_SHARE

runner = CliRunner()


def _cli_json(*args) -> dict:
    r = runner.invoke(app, ["predict", *map(str, args), "--json"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_settings_host_us_is_the_default_taken():
    base = dict(batch=1, seq=32)
    assert wattcast.predict("gpt2", "A100-SXM4-80GB", **base).meta["settings"]["host_us"] == 40.0
    assert wattcast.predict("gpt2", "A100-SXM4-80GB", compile=True, **base).meta["settings"]["host_us"] == 6.0
    assert wattcast.predict("gpt2", "A100-SXM4-80GB", host_us=100, **base).meta["settings"]["host_us"] == 100.0
    served = wattcast.predict("llama3_8b", "H100-SXM5-80GB", mode="inference", batch=4, seq=1, kv_context=511,
                              serving="vllm", prompt_tokens=128, output_tokens=128)
    assert served.to_dict()["settings"]["host_us"] == 6.0


def test_settings_host_us_on_a_cluster_and_a_served_tp_group():
    for fw, us in (("hf", 40.0), ("megatron", 6.0), ("megatron-deepspeed", 72.5)):
        r = wattcast.predict_cluster("gpt2", "DGX-H100", gpus=2, tp=2, batch=2, seq=128, framework=fw)
        assert r.to_dict()["settings"]["host_us"] == us, fw
    r = wattcast.predict_cluster("gpt2", "DGX-H100", gpus=2, tp=2, batch=2, seq=128, host_us=20)
    assert r.to_dict()["settings"]["host_us"] == 20.0
    tp = dict(gpus=2, tp=2, batch=1, seq=1, kv_context=255)
    assert wattcast.predict_cluster("llama3_8b", "DGX-H100", **tp).to_dict()["settings"]["host_us"] == 40.0
    assert wattcast.predict_cluster("llama3_8b", "DGX-H100", host_us=12, **tp).to_dict()["settings"]["host_us"] == 12.0


def test_cli_json_and_table_state_the_host_cost():
    args = ("--model", "gpt2", "--device", "A100-SXM4-80GB", "--batch", "1", "--seq", "32")
    assert _cli_json(*args)["settings"]["host_us"] == 40.0
    assert _cli_json(*args, "--compile")["settings"]["host_us"] == 6.0
    r = runner.invoke(app, ["predict", *args], env={"COLUMNS": "400"})  # the row unwrapped
    assert r.exit_code == 0, r.stderr
    assert "launch gaps (inside the rows above): host 40 us a launch, eager PyTorch's launch queue" in r.stdout
    r = runner.invoke(app, ["predict", *args, "--compile"], env={"COLUMNS": "400"})
    assert "host 6 us a launch, torch.compile's launch queue" in r.stdout


@pytest.fixture(scope="module")
def decode():
    """Llama 3 8B bf16 decode (batch 1, 2,047 cached tokens) on an H100, eager at 40 us a launch and at 6 us."""
    kw = dict(mode="inference", batch=1, seq=1, kv_context=2047)
    return (wattcast.predict("llama3_8b", "H100-SXM5-80GB", **kw),
            wattcast.predict("llama3_8b", "H100-SXM5-80GB", host_us=6, **kw))


def test_ood_warning_reads_the_kernel_time_share_whatever_the_host(decode):
    slow, fast = decode
    for r in decode:
        n = r.nodes
        gpu = n["gpu_ms"].to_numpy(dtype=float)
        ood = n["ood"].to_numpy(dtype=bool)
        assert r.ood_kernel_time_fraction == pytest.approx(gpu[ood].sum() / gpu.sum(), rel=1e-12)
        # ood_time_fraction keeps its meaning: the share of the costed step time, launch gaps included
        t = n["time_ms"].to_numpy(dtype=float)
        assert r.ood_time_fraction == pytest.approx(t[ood].sum() / t.sum(), rel=1e-12)
    # the same kernels, the same GPU times: the same kernel-time share, whatever the host cost
    assert slow.ood_kernel_time_fraction == pytest.approx(fast.ood_kernel_time_fraction, rel=1e-9)
    assert slow.ood_time_fraction < OOD_WARN_SHARE < slow.ood_kernel_time_fraction  # the audit's hidden case
    for r in decode:
        warn = [w for w in r.meta["warnings"] if "out of distribution" in w]
        pct = f"{100 * r.ood_kernel_time_fraction:.0f}% of the predicted kernel time (GPU time, host launch gaps aside)"
        assert len(warn) == 1 and warn[0].startswith(pct)
        d = r.to_dict()
        assert d["ood_kernel_time_fraction"] == r.ood_kernel_time_fraction
        # the step band still mixes in the step-time share (its input unchanged)
        assert d["step_time_band"]["ood_time_share"] == pytest.approx(r.ood_time_fraction, rel=1e-12)
        assert f"{100 * r.ood_time_fraction:.0f}% of the predicted time (host launch gaps included) is out of " \
            "distribution" in d["step_time_band"]["basis"]
