"""wattcast footprint names the flag of a non-positive or non-finite --avg-power-w / --node-overhead-share, as every
other option's message does (audit 54f: 'avg_power_w must be positive' named no flag)."""

from __future__ import annotations

import math

import pytest

from wattcast.lifecycle.footprint import footprint


@pytest.mark.parametrize("kw, flag", [(dict(avg_power_w=0.0), "--avg-power-w"), (dict(avg_power_w=math.nan), "--avg-power-w"),
                                      (dict(avg_power_w=-5.0), "--avg-power-w"),
                                      (dict(node_overhead_share=-0.1), "--node-overhead-share"),
                                      (dict(node_overhead_share=math.nan), "--node-overhead-share")])
def test_bad_power_figures_name_their_flag(kw, flag):
    with pytest.raises(ValueError, match=f"\\({flag}\\) must be"):
        footprint("H100-SXM5-80GB", 8, 10.0, **kw)


def test_an_inference_run_is_charged_no_checkpoints():
    """A served (inference) run writes no training checkpoints: its goodput loses only restarts (audit 54f: a decode run
    was charged Young/Daly checkpoints and the work since the last one, +0.08% on every run figure, unflagged); a
    checkpoint time given explicitly is still charged; a training run is unchanged."""
    import wattcast

    kw = dict(batch=32, seq=1, kv_context=1024, mode="inference", tokens=1e10)
    served = wattcast.predict("llama3_8b", "H100-SXM5-80GB", **kw)
    charged = wattcast.predict("llama3_8b", "H100-SXM5-80GB", checkpoint_write_s=60.0, **kw)
    assert served.run.checkpoint_interval_s is None
    assert any("no checkpoints written" in f for f in served.run.flags)
    assert served.run.goodput > charged.run.goodput and served.run.hours < charged.run.hours
    assert served.run.goodput > 0.9999
    train = wattcast.predict("gpt2", "H100-SXM5-80GB", tokens=1e12)
    assert not any("no checkpoints written" in f for f in train.run.flags) and train.run.checkpoint_interval_s
