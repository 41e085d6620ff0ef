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
