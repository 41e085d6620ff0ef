"""Power and energy of a predicted step: per-kernel power from the power surrogate, idle power elsewhere.

Per kernel: the power model's board power at the kernel's achieved compute and memory utilisation
(:mod:`wattcast.featurize.power_features`, :mod:`wattcast.models.power`) over its GPU time; the rest of
the kernel's slot (host launch gaps) draws idle power; collectives draw the model's communication power
(and so do waits inside a distributed step, see :mod:`wattcast.simulate.distributed`); a collective hidden under
computation adds only its dynamic power to the computation's, the sum capped by a power limit
(:func:`overlap_power`). A power limit (``power_limit_w``) lowers the clock where a kernel
would exceed it: its time grows (compute-bound kernels most) and its power drops to the limit.

Bad settings are refused with a ValueError naming the parameter (:func:`wattcast.models.power.check_power_settings`):
a limit or clock cap that is not a finite number above 0, a clock cap below the lowest modelled clock, and a
power limit below what the step's most power-hungry kernel draws at that lowest clock (no clock meets it, and
the step would be reported above its own limit).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from wattcast.data.device_spec import DeviceSpec


def _power_model(power_model=None):
    if power_model is not None:
        return power_model
    from wattcast.models.power import load_power_model

    return load_power_model()


def kernel_power(costed: pd.DataFrame, spec: DeviceSpec, power_model=None, *, power_limit_w: float | None = None,
                 clock_cap_mhz: float | None = None):
    """(gpu_ms after the limit, watts, ood) per kernel row of a costed graph (collectives get comm power).

    Raises ValueError for a bad ``power_limit_w`` / ``clock_cap_mhz`` (see the module docstring), including a
    limit below what these kernels draw at the lowest modelled clock."""
    return _kernel_power(costed, spec, power_model, power_limit_w=power_limit_w, clock_cap_mhz=clock_cap_mhz)[:3]


def _kernel_power(costed: pd.DataFrame, spec: DeviceSpec, power_model=None, *, power_limit_w: float | None = None,
                  clock_cap_mhz: float | None = None):
    """:func:`kernel_power`'s figures and each row's compute utilisation at the boost clock (0 for collectives)."""
    from wattcast.featurize.graph_cache import column_is, column_values
    from wattcast.featurize.power_features import kernel_power_features
    from wattcast.models.power import apply_power_limit, check_power_limit_attainable, check_power_settings, comm_power_w

    power_limit_w, clock_cap_mhz = check_power_settings(power_limit_w, clock_cap_mhz, spec)
    pm = _power_model(power_model)
    gpu = costed["gpu_ms"].to_numpy(dtype=float)
    flops = costed["flops"].to_numpy(dtype=float)
    bytes_ = costed["bytes"].to_numpy(dtype=float)
    dtype = column_values(costed, "dtype")
    coll = column_is(costed, "op_class", "collective")
    feats = kernel_power_features(flops, bytes_, np.maximum(gpu, 1e-6), dtype, spec)
    w, _lo, _hi, ood = pm.predict_w(feats)
    w = np.asarray(w, dtype=float)
    ood = np.asarray(ood, dtype=bool)
    cu = feats["compute_util"].to_numpy(dtype=float) if "compute_util" in feats else np.zeros(len(gpu))
    if power_limit_w is not None or clock_cap_mhz is not None:
        if power_limit_w is not None:
            check_power_limit_attainable(power_limit_w, w[~coll], spec, cu[~coll], model=pm)
        gpu, w = apply_power_limit(gpu, w, power_limit_w, spec, cu, model=pm, clock_cap_mhz=clock_cap_mhz)
        gpu = np.asarray(gpu, dtype=float)
        w = np.asarray(w, dtype=float)
    w = np.where(coll, comm_power_w(spec, power_limit_w, clock_cap_mhz, pm), w)  # the cap lowers it too (see there)
    return gpu, w, ood, np.where(coll, 0.0, cu)


def apply_power(costed: pd.DataFrame, spec: DeviceSpec, power_model=None, *, power_limit_w: float | None = None,
                clock_cap_mhz: float | None = None) -> pd.DataFrame:
    """The costed kernels with ``power_w`` (board power while the kernel runs) and, under a power limit,
    stretched ``gpu_ms``/``time_ms``; ``power_ood`` flags kernels outside the power model's support;
    ``compute_util`` is each kernel's compute utilisation at the boost clock (what sets how its time answers a
    lower clock: :func:`wattcast.models.power.apply_clock`)."""
    from wattcast.simulate.single_device import frame_copy

    gpu, w, ood, cu = _kernel_power(costed, spec, power_model, power_limit_w=power_limit_w,
                                    clock_cap_mhz=clock_cap_mhz)
    out = frame_copy(costed)
    old = out["gpu_ms"].to_numpy(dtype=float)
    slot = out["time_ms"].to_numpy(dtype=float)
    out["time_ms"] = np.where(slot > 0, slot + np.maximum(gpu - old, 0.0), 0.0)
    out["gpu_ms"] = gpu
    out["power_w"] = w
    out["power_ood"] = ood
    out["compute_util"] = cu
    return out


def overlap_cap_w(spec: DeviceSpec, power_limit_w: float | None = None) -> float:
    """The board's cap on computation plus a collective beside it (:func:`overlap_power`): the power limit, else (or
    above it) the TDP, the board's default limit."""
    from wattcast.featurize.power_features import device_tdp_w

    tdp = device_tdp_w(spec)
    return tdp if power_limit_w is None else min(float(power_limit_w), tdp)


def overlap_power(hidden_ms, compute_w, compute_util, comm_w: float, spec: DeviceSpec, power_model=None, *,
                  power_limit_w: float | None = None):
    """(stretch_ms, extra_j) of communication hidden under computation: for spans of ``hidden_ms`` (arrays or scalars)
    in which a collective runs beside computation drawing ``compute_w`` (W, at its clock after the per-kernel limit)
    with ``compute_util`` (its compute utilisation at the boost clock).

    While both run the board draws the computation's power plus the collective's *dynamic* power
    (``comm_w - idle``; ``comm_w`` is :func:`wattcast.models.power.comm_power_w`): the idle (static) part is paid once,
    by the computation. ``extra_j`` is what the span adds to the computation's own energy (``compute_w x hidden_ms``,
    counted with the kernels). The board's total is capped by its power limit, ``power_limit_w`` or, without one (or
    above it), the TDP (a board's default power limit: no kernel is predicted above it, and computation plus a
    collective cannot be either; :func:`overlap_cap_w`): where ``compute_w + comm_w - idle`` exceeds it the span is one
    load for :func:`wattcast.models.power.apply_power_limit` (the clock drops until the sum fits: the computation's
    compute-bound share slows by the clock ratio, the link-bound collective does not), and ``stretch_ms`` is the time the computation gains. Stated approximation: the clock is applied on top of
    the per-kernel limit's (power composes exactly, the time of a kernel slowed twice slightly less than at the product
    of the two ratios). Vectorised."""
    from wattcast.models.power import apply_power_limit, idle_power_w

    h = np.asarray(hidden_ms, dtype=float)
    pc = np.broadcast_to(np.asarray(compute_w, dtype=float), h.shape)
    dyn = max(float(comm_w) - idle_power_w(spec), 0.0)
    load = pc + dyn
    stretch = np.zeros(h.shape)
    extra = dyn * h / 1e3
    cap_w = overlap_cap_w(spec, power_limit_w)
    over = (h > 0) & (load > cap_w)
    if over.any():
        cu = np.broadcast_to(np.asarray(compute_util, dtype=float), h.shape)
        t2, p2 = apply_power_limit(h[over], load[over], cap_w, spec, cu[over], model=_power_model(power_model))
        stretch[over] = t2 - h[over]
        extra[over] = (p2 * t2 - pc[over] * h[over]) / 1e3
    return stretch, extra


def stream_power_w(spec: DeviceSpec, stream_gbps: float, power_model=None) -> float:
    """Board power while a streaming elementwise pass (one FLOP per 4-byte element read) runs at ``stream_gbps``."""
    from wattcast.featurize.power_features import kernel_power_features

    pm = _power_model(power_model)
    key = (id(spec), id(pm), float(stream_gbps))
    hit = _STREAM_POWER.get(key)
    if hit is not None and hit[0] is spec and hit[1] is pm:  # both held, so their ids are not reused
        return hit[2]
    bytes_ = np.array([stream_gbps * 1e9 * 1e-3])  # what 1 ms moves
    feats = kernel_power_features(bytes_ / 8.0, bytes_, np.array([1.0]), np.array(["fp32"]), spec)
    w = float(np.asarray(pm.predict_w(feats)[0], dtype=float)[0])
    if len(_STREAM_POWER) > 256:
        _STREAM_POWER.clear()
    _STREAM_POWER[key] = (spec, pm, w)
    return w


_STREAM_POWER: dict = {}


def energy_of(costed: pd.DataFrame, spec: DeviceSpec) -> tuple[float, float, float]:
    """(kernel J, idle J, comm J) of one pass over costed kernels carrying ``power_w`` (see apply_power)."""
    from wattcast.models.power import idle_power_w

    gpu = costed["gpu_ms"].to_numpy(dtype=float)
    slot = costed["time_ms"].to_numpy(dtype=float)
    w = costed["power_w"].to_numpy(dtype=float)
    coll = costed["op_class"].to_numpy() == "collective"
    k_j = float(np.sum(np.where(coll, 0.0, w * gpu)) / 1e3)
    c_j = float(np.sum(np.where(coll, w * gpu, 0.0)) / 1e3)
    i_j = float(np.sum(np.maximum(slot - gpu, 0.0)) * idle_power_w(spec) / 1e3)
    return k_j, i_j, c_j


#: utilisation at which `wattcast footprint` evaluates the power surrogate when no average power is given:
#: a large-model training step's GPU time is dominated by GEMMs near this compute utilisation (MFU of
#: well-tuned LLM training is 0.35-0.55: Megatron-LM SC21, Llama 3); memory-bandwidth utilisation is
#: taken as half of it
DEFAULT_FOOTPRINT_UTILISATION = 0.5


def gpu_power_at_w(spec: DeviceSpec, utilisation: float, power_model=None, dtype: str = "bf16") -> float:
    """The power surrogate's board power for a GPU held at ``utilisation`` of its compute peak.

    ``utilisation`` is a fraction of the peak: finite and in [0, 1] (0 gives the idle power; a GPU cannot
    run above its peak), else a ValueError naming it."""
    from wattcast.featurize.power_features import kernel_power_features

    if isinstance(utilisation, (bool, np.bool_)) or not isinstance(utilisation, (int, float, np.integer, np.floating)) \
            or not np.isfinite(utilisation) or not 0.0 <= float(utilisation) <= 1.0:
        raise ValueError(f"utilisation (--utilisation) is a fraction of the compute peak: a finite number in [0, 1], "
                         f"got {utilisation!r}")
    utilisation = float(utilisation)
    pm = _power_model(power_model)
    peak = spec.peak_matrix_tflops(dtype) * 1e12
    time_ms = 1.0
    flops = np.array([utilisation * peak * time_ms / 1e3])
    bytes_ = np.array([0.5 * utilisation * spec.memory_bandwidth_gbps * 1e9 * time_ms / 1e3])
    feats = kernel_power_features(flops, bytes_, np.array([time_ms]), np.array([dtype]), spec)
    w, _lo, _hi, _ood = pm.predict_w(feats)
    return float(np.asarray(w, dtype=float)[0])
