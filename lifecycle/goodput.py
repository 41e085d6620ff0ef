"""Goodput under failures: system MTBF, Young/Daly checkpoint intervals and Daly's (2006) fraction of wall-clock
time spent on kept work. Pure functions; units in their names."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from wattcast.lifecycle.checks import _pos

if TYPE_CHECKING:
    from wattcast.lifecycle.assumptions import LifecycleAssumptions


def system_mtbf_s(mtbf_gpu_hours: float, gpus: int) -> float:
    """Mean time between failures of the whole job (independent failures): ``MTBF_gpu / N``, in seconds."""
    return _pos("mtbf_gpu_hours", mtbf_gpu_hours) * 3600.0 / _pos("gpus", gpus)


def young_daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young/Daly first-order optimal compute time between checkpoints: ``sqrt(2 C M)``, in seconds."""
    return math.sqrt(2.0 * _pos("checkpoint_s", checkpoint_s, zero_ok=True) * _pos("mtbf_s", mtbf_s))


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's (2006) higher-order optimum: ``sqrt(2CM)[1 + sqrt(C/2M)/3 + (C/2M)/9] - C`` for ``C < 2M``, else ``M``."""
    c = _pos("checkpoint_s", checkpoint_s, zero_ok=True)
    m = _pos("mtbf_s", mtbf_s)
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


def _segment_s(work_s: float, m: float, r: float) -> float:
    """Daly's expected wall-clock seconds of ``work_s`` uninterrupted seconds (work + its checkpoint) under
    exponential failures of mean ``m`` with restart ``r``: ``M e^{R/M} (e^{work/M} - 1)``."""
    try:
        return m * math.exp(r / m) * math.expm1(work_s / m)
    except OverflowError:
        return math.inf


def goodput(checkpoint_s: float, mtbf_s: float | None, restart_s: float = 0.0, interval_s: float | None = None,
            run_s: float | None = None) -> float:
    """Fraction of wall-clock time spent on useful (kept) work, in (0, 1].

    Daly's (2006) model with exponential failures of mean ``mtbf_s`` (failures may also hit a restart):
    each segment of ``interval_s`` useful seconds plus one checkpoint of ``checkpoint_s`` takes on average
    ``M e^{R/M} (e^{(tau+C)/M} - 1)`` seconds. ``interval_s=None`` uses :func:`young_daly_interval_s`.
    ``mtbf_s=None`` (no failures): ``tau / (tau + C)``, or 1 when no interval is given either.

    ``run_s`` (failure-free seconds of the whole run; None: the steady-state rate above): the run writes only the
    checkpoints it reaches, ``ceil(run_s / tau) - 1`` of them (none at the end), and its last segment of at most
    ``tau`` seconds carries no checkpoint; a run shorter than one interval writes none and only risks its own length.
    Raises ValueError when failures are so frequent that the job makes no progress.
    """
    c = _pos("checkpoint_s", checkpoint_s, zero_ok=True)
    r = _pos("restart_s", restart_s, zero_ok=True)
    t = None if run_s is None else _pos("run_s", run_s)
    if mtbf_s is None or math.isinf(mtbf_s):
        if interval_s is None:
            return 1.0
        tau = _pos("interval_s", interval_s)
        if t is not None:
            k = math.ceil(t / tau) - 1  # checkpoints written before the run ends
            return t / (t + k * c) if k > 0 else 1.0
        return tau / (tau + c)
    m = _pos("mtbf_s", mtbf_s)
    if interval_s is None:
        tau = young_daly_interval_s(c, m) if c > 0 else 0.0
        if tau == 0.0:  # free checkpoints: checkpoint continuously, lose only restarts
            return 1.0 / math.exp(r / m)
    else:
        tau = _pos("interval_s", interval_s)
    if t is not None and t <= tau:  # the run ends before its first checkpoint: no checkpoint is written
        seg = _segment_s(t, m, r)
        g = t / seg if seg > 0 else 0.0
    elif t is not None:  # k full segments (work + checkpoint), then the last one (work only)
        k = math.ceil(t / tau) - 1
        last = t - k * tau
        wall = k * _segment_s(tau + c, m, r) + _segment_s(last, m, r)
        g = t / wall if wall > 0 else 0.0
    else:
        seg = _segment_s(tau + c, m, r)
        g = tau / seg if seg > 0 else 0.0
    if not g > 1e-9:
        raise ValueError(
            f"no progress: system MTBF {m:.0f} s is too short for checkpoint {c:g} s + restart {r:g} s "
            f"(interval {tau:.0f} s); fewer GPUs, faster checkpoints or a higher MTBF are needed"
        )
    return min(g, 1.0)




def run_goodput(a: "LifecycleAssumptions", gpus: int, apply_goodput: bool,
                flags: list[str], run_s: float | None = None) -> tuple[float, float | None, float | None]:
    """A run's goodput under ``a`` (MTBF per GPU, checkpoint write time and interval, restart time) on ``gpus``
    GPUs, the checkpoint interval used (s; Young/Daly when ``a`` gives none) and the system MTBF (s, None without
    failures). ``run_s``: the run's failure-free seconds (only the checkpoints it reaches are charged, see
    :func:`goodput`; None: the steady-state rate). ``apply_goodput=False``: hours are measured wall-clock time,
    goodput 1 (flagged in ``flags``)."""
    mtbf_s = None if a.mtbf_gpu_hours is None else system_mtbf_s(a.mtbf_gpu_hours, gpus)
    interval = a.checkpoint_interval_s
    if apply_goodput:
        if interval is None and mtbf_s is not None and a.checkpoint_write_s > 0:
            interval = young_daly_interval_s(a.checkpoint_write_s, mtbf_s)
        g = goodput(a.checkpoint_write_s, mtbf_s, a.restart_min * 60.0, interval, run_s=run_s)
        if run_s is not None and interval is not None and run_s <= interval and a.checkpoint_write_s > 0:
            flags.append(f"run ({run_s / 3600.0:.3g} h failure-free) ends before its first checkpoint (interval "
                         f"{interval / 3600.0:.3g} h): no checkpoint charged")
        if a.mtbf_gpu_hours is None:
            flags.append("failures not modelled (mtbf_gpu_hours=None)")
    else:
        g = 1.0
        flags.append("goodput not applied: hours taken as measured wall-clock time")
    return g, interval, mtbf_s
