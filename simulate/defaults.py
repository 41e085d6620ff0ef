"""The one set of defaults every entry point uses: ``wattcast.predict``, ``wattcast.predict_cluster``,
``wattcast.search`` and the CLI's ``predict`` (one device or a cluster) and ``search``.

A strategy ``search`` ranks is predicted with the same precision, attention kernel, optimizer and framework when it is
pasted into ``predict --cluster`` (before, ``search`` assumed bf16 + flash attention, ``predict`` fp32 + eager and
``predict_cluster`` bf16 + eager, so a winning strategy could come back as out of memory).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunDefaults:
    #: mixed precision as today's training runs it (fp32 master weights and optimizer states)
    dtype: str = "bf16"
    #: fused attention (FlashAttention / SDPA), what PyTorch and Megatron use by default today
    attention: str = "flash"
    optimizer: str = "adamw"
    framework: str = "hf"


DEFAULTS = RunDefaults()
