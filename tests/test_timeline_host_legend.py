"""--plot's legend names every kind of bar it draws: the host row (``host.iteration``, the framework's per-iteration
host time, and ``data_loading<N>``, the data loader's time, on the compute stream) was drawn in its own colour with no
legend entry."""

from __future__ import annotations

import matplotlib.pyplot as plt

from wattcast.simulate.distributed import predict_distributed
from wattcast.simulate.options import DistributedOptions
from wattcast.simulate.parallel import ParallelConfig
from wattcast.simulate.trace import TIMELINE_COLOURS, _timeline_kind, timeline_figure


def _legend(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_host_events_have_a_legend_entry():
    r = predict_distributed("gpt2", "dgx-a100", ParallelConfig(gpus=8, tp=2, pp=2, dp=2, micro_batch=2, zero=1),
                            DistributedOptions(batch=16, seq=256, trace=True, data_load_ms=5.0, framework="megatron"))
    kinds = {_timeline_kind(e) for e in r.events}
    assert "host" in kinds  # the step has host bars to draw
    fig = timeline_figure(r)
    try:
        labels = _legend(fig)
        assert any(t.startswith("host") for t in labels), labels
        # every colour drawn is in the legend: one Patch per kind, its face colour the bars'
        handles = fig.axes[0].get_legend().legend_handles
        faces = {tuple(round(c, 4) for c in h.get_facecolor()) for h in handles}
        from matplotlib.colors import to_rgba

        for k in kinds:
            assert tuple(round(c, 4) for c in to_rgba(TIMELINE_COLOURS[k])) in faces, k
    finally:
        plt.close(fig)
