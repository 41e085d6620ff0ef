"""The one set of defaults every entry point uses: ``wattcast.predict``, ``wattcast.predict_cluster``,
``wattcast.search`` and the CLI's ``predict`` (one device or a cluster) and ``search``.

A strategy ``search`` ranks is predicted with the same precision, attention kernel, optimizer and framework when it is
pasted into ``predict --cluster`` (before, ``search`` assumed bf16 + flash attention, ``predict`` fp32 + eager and
``predict_cluster`` bf16 + eager, so a winning strategy could come back as out of memory).
"""

from __future__ import annotations

from dataclasses import dataclass


class DefaultDtype(str):
    """The default precision, "bf16", told apart from a "bf16" the caller gave (by identity): on a GPU without BF16
    (V100, T4, P100) it stands for fp16, today's mixed precision there (:func:`step_dtype`); a bf16 given explicitly
    there is refused (``data.device_spec.unsupported_step_dtype``)."""

    __slots__ = ()


def resolve_dtype(dtype: str, spec) -> str:
    """``dtype`` for a step on ``spec``: the default bf16 becomes fp16 where the GPU has no BF16 peak, fp32 where it has
    no FP16 peak either (a Tesla P4, a spec file without 16-bit figures); anything else (a bf16 given too) as given, the
    same object."""
    if isinstance(dtype, DefaultDtype) and not getattr(spec, "peak_bf16_tflops", None):
        return "fp16" if getattr(spec, "peak_fp16_tflops", None) else "fp32"
    return dtype


def lacking_precision(resolved: str) -> str:
    """What a GPU lacks when the default precision resolved to ``resolved`` (:func:`resolve_dtype`): "BF16" (fp16),
    "BF16 or FP16" (fp32); for the notes the API and the CLI give."""
    return "BF16" if resolved == "fp16" else "BF16 or FP16"


def step_dtype(dtype: str, spec) -> str:
    """:func:`resolve_dtype`, with a Python warning when the default became fp16."""
    out = resolve_dtype(dtype, spec)
    if out is not dtype:
        import warnings

        warnings.warn(f"{spec.name} has no {lacking_precision(out)}: predicting {out}, the default precision there "
                      "(give dtype= to choose)", stacklevel=3)
    return out


@dataclass(frozen=True)
class RunDefaults:
    #: mixed precision as today's training runs it (fp32 master weights and optimizer states); fp16 on GPUs without
    #: BF16 (:class:`DefaultDtype`)
    dtype: str = DefaultDtype("bf16")
    #: fused attention (FlashAttention / SDPA), what PyTorch and Megatron use by default today
    attention: str = "flash"
    optimizer: str = "adamw"
    framework: str = "hf"


DEFAULTS = RunDefaults()


def shown_dtype(meta: dict, given: str | None = None) -> str | None:
    """The precision a step ran with, as the user names it: "fp8" for the FP8 recipe (whose graph keeps
    ``meta["dtype"] == "bf16"``, the dtype of everything but its FP8 GEMMs, with ``meta["precision"] == "fp8"``:
    ``featurize.workload``), else ``meta["dtype"]``, else ``given``. For the settings, titles and trace metadata."""
    if meta.get("precision") == "fp8":
        return "fp8"
    return meta.get("dtype", given)
