"""The 90% band of a predicted step (``step_time_band_ms``), from measured steps.

``models/artifacts/step_band.json`` holds, per setting (``single``: one GPU; ``cluster``: a distributed training step),
the 5% and 95% quantiles of log(measured / predicted) over whole measured steps and the GPU generations they ran on
(made by ``python -m wattcast.validation.step_band``, which says how it was calibrated and checked). A step on a
generation outside those also carries the kernels' generation error, which no measured step covers:
:func:`generation_log_width`, each op family's largest signed bias over its leave-one-generation-out folds (the kernel
bundle's ``logo.folds``; the dtype class's where the folds give one), weighted by the family's share of the step.
Signed, not absolute per-kernel error: over a step the per-kernel scatter averages out, a generation's bias does not.
No measured step is FP8 (and the only FP8 steps in the data, Megatron-LM CI's small GB200 models, are not validated):
an FP8 step on a generation outside :data:`FP8_STEP_GENERATIONS` also carries the FP8 GEMM kernels' own
leave-one-generation-out error on its linear layers' share (:func:`fp8_kernel_log`) and warns
(:func:`fp8_step_warning`; audit 58a: an H100 FP8 step at an MFU above 1 against the BF16 peak had the bf16
generation term alone and no warning).

Both of those describe kernels the leave-one-generation-out test covers. A kernel flagged ``ood`` is outside it (a
device descriptor beyond the training range widened by the farthest any fold extrapolated it, or a shape beyond
training: ``models/kernel_bundle.py``), and no measurement says how far off it is. Its time carries its own band
instead (:func:`ood_band_log`): the band ``wattcast kernels`` gives it (its family's leave-one-generation-out band,
widened by its distance beyond what the folds covered, ``models/coverage.py``: a stated assumption no fold measures),
summed over the OOD kernels without averaging (beyond coverage the error is the generation's, shared by its kernels,
not scatter). Until stop 58 the un-widened family band stood in for it, so the step band of kernels 10x beyond every
measured GPU was a catalog GPU's.
The two are mixed by time share (:func:`mix_band_log`): the band equals the measured-step band with no OOD time, the
OOD kernels' band with all of it, and widens monotonically in between; past :data:`OOD_WARN_SHARE` a prediction warns.

A cluster step (``simulate/distributed.py`` ``critical_rank_ood``) takes the same term from its critical rank, the
pipeline stage that ends the step: that rank's OOD kernels (the forward and backward of every micro-batch, its share
of the optimizer step) over its whole costed graph time, collectives in the graph (TP, SP, EP, CP) included at their
costed time. Collectives flagged outside the collective model's training support (``models/collectives.py``) are not
kernels the leave-one-generation-out test covers: their share is reported (``ood_collective_time_share``) and they keep
the measured band. Their per-kernel band (``models/artifacts/collective_band.json``, ``training/collective_band.py``)
comes from one unseen system (ALCF Polaris, alpha-beta alone) and is not mixed into the step band.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.device_spec import DeviceSpec, generation_of

#: the shipped calibration
STEP_BAND_FILE = Path(str(files("wattcast.models") / "artifacts" / "step_band.json"))
#: a per-op class of a step's ``per_op`` -> the kernel family whose generation folds describe its error
OP_CLASS_FAMILY = {"linear": "gemm", "bmm": "gemm", "flash_attention": "gemm", "elementwise": "elementwise",
                   "layernorm": "ln", "softmax": "softmax", "loss": "softmax", "conv": "conv"}
#: a dtype class needs this many of its rows in a fold for the fold's class bias to count (as the kernel band's)
MIN_CLASS_ROWS = 100
#: a prediction warns when more than this share of its kernel time is out of distribution (issue 14: "say, 50%")
OOD_WARN_SHARE = 0.5


def check_step_band(entry: dict, where: str) -> dict:
    """A step-band entry, checked: ``settings`` maps ``single`` / ``cluster`` to ``band_log`` [low <= 0 <= high,
    finite] and ``generations`` (a list of names)."""
    settings = entry.get("settings") if isinstance(entry, dict) else None
    if not isinstance(settings, dict) or not settings:
        raise ValueError(f"{where}: 'settings' must map a setting (single, cluster) to its band")
    for name, s in settings.items():
        band = s.get("band_log") if isinstance(s, dict) else None
        if (not isinstance(band, (list, tuple)) or len(band) != 2 or not all(isinstance(v, (int, float)) and math.isfinite(v)
                                                                            for v in band) or not band[0] <= 0 <= band[1]):
            raise ValueError(f"{where}: settings.{name}.band_log must be [low <= 0, high >= 0] (log measured / predicted)")
        if not isinstance(s.get("generations"), list):
            raise ValueError(f"{where}: settings.{name}.generations must be a list of GPU generations")
    return entry


@lru_cache(maxsize=4)
def load_step_band(path: str = str(STEP_BAND_FILE)) -> dict | None:
    """The calibration file (checked), or None where there is none (a step then carries no band)."""
    p = Path(path)
    if not p.is_file():
        return None
    return check_step_band(json.loads(p.read_text()), str(p))


def _family_bias_log(bundle, family: str, tensor: bool) -> float:
    """log(1 + the family's largest |signed bias| over its generation folds), the dtype class's where available."""
    fm = bundle.families.get(family) if bundle is not None else None
    folds = ((fm.logo or {}).get("folds") or {}) if fm is not None else {}
    cls = "tensor" if tensor else "vector"
    worst = 0.0
    for f in folds.values():
        by = (f.get("by_class") or {}).get(cls)
        if by and by.get("rows", 0) >= MIN_CLASS_ROWS and by.get("bias_pct") is not None:
            b = float(by["bias_pct"])
        elif not f.get("by_class") and f.get("bias_pct") is not None:
            b = float(f["bias_pct"])
        else:
            continue
        worst = max(worst, abs(b))
    return math.log1p(worst / 100.0)


#: GPU generations with a measured FP8 training step in the shared data: Megatron-LM's CI only, its GB200 platforms
#: (``endtoend/megatron_ci/megatron_ci_iteration_times.csv``: 9 rows with ``fp8-format`` set, all ``dev_dgx_gb200*``;
#: small models, not among the validated rows either). No FP8 step was measured on any other generation (Hopper, Ada,
#: CDNA3/4): there an FP8 step carries :data:`FP8_KERNEL_LOGO`'s error and :func:`fp8_step_warning`
FP8_STEP_GENERATIONS = ("Blackwell",)
#: generations whose FP8 GEMMs are in the kernel model's training data (``data/kernel_datasets.py`` XLA_DTYPES: B200
#: sm_100 and MI355X gfx950 in the shared tables; MI300X gfx942 only from an extra table; Hopper withheld)
FP8_KERNEL_GENERATIONS = ("Blackwell", "CDNA4")
#: the FP8 GEMM kernels' leave-one-generation-out error per vendor (the shipped GEMM recipe, the fold that holds the
#: generation out; ``benchmarks/leave_one_generation_out.py``, MLflow experiment kernel-logo, run ab07755c, logged at
#: stop 53 (commit 5f58b3c) and read into this constant at stop 58, re-measured at stop 59 with the same figures;
#: metrics ``bundle_plus_floor-blend_over_ceiling-member_{device}_fp8_xla_big_{mape,bias}_pct``, GEMMs >= 1 GFLOP; bias
#: = predicted / measured - 1, so negative is predicted too fast). One fold per vendor: NVIDIA's only FP8 kernels are
#: B200's (XLA); AMD's held-out FP8 cell in the default run is MI355X's. The kernel bundle keeps no per-dtype fold
#: figures (``logo.folds`` are per dtype class), hence the constants; refresh them with the benchmark
FP8_KERNEL_LOGO = {
    "nvidia": {"fold": "B200 held out: Blackwell fold, XLA e4m3 GEMMs >= 1 GFLOP", "mape_pct": 12.4, "bias_pct": -3.4},
    "amd": {"fold": "MI355X held out: CDNA fold, XLA e4m3 GEMMs >= 1 GFLOP", "mape_pct": 30.7, "bias_pct": -24.3},
}


def fp8_kernel_logo(spec: DeviceSpec) -> dict | None:
    """The :data:`FP8_KERNEL_LOGO` entry an FP8 step on ``spec`` carries (its vendor's, the widest for another
    vendor), or None where FP8 steps were measured on its generation (:data:`FP8_STEP_GENERATIONS`)."""
    if generation_of(spec) in FP8_STEP_GENERATIONS:
        return None
    return FP8_KERNEL_LOGO.get(str(spec.vendor).lower()) or max(FP8_KERNEL_LOGO.values(), key=lambda v: v["mape_pct"])


def fp8_kernel_log(spec: DeviceSpec, fp8: bool) -> float:
    """The FP8 term's log width per unit of FP8 GEMM time (0 for a step that is not FP8 or on a generation of
    :data:`FP8_STEP_GENERATIONS`): log(1 + the vendor fold's FP8 MAPE). The MAPE, not the signed bias the generation
    term takes (:func:`_family_bias_log`): one fold is one sample of how far a new generation's FP8 GEMMs are off as a
    whole (B200 -3.4%, MI355X -24.3%); the next generation's is not known from it, and the per-kernel MAPE bounds the
    fold's |bias|."""
    logo = fp8_kernel_logo(spec) if fp8 else None
    return math.log1p(logo["mape_pct"] / 100.0) if logo else 0.0


def fp8_step_warning(spec: DeviceSpec, fp8: bool) -> str | None:
    """The warning of an FP8 step on a generation without a measured FP8 step (:data:`FP8_STEP_GENERATIONS`), else
    None."""
    logo = fp8_kernel_logo(spec) if fp8 else None
    if logo is None:
        return None
    gen = generation_of(spec)
    kernels = ("its FP8 GEMM kernels were measured (XLA) but no whole FP8 step" if gen in FP8_KERNEL_GENERATIONS else
               f"no {gen} FP8 kernel is in the training data either: the FP8 GEMM times extrapolate the kernel model "
               "from other generations")
    return (f"FP8 on {gen}: no FP8 training step on {gen} was measured (the only FP8 steps in the data are "
            f"Megatron-LM CI's small GB200 models); {kernels}. The kernel model's FP8 error on a held-out generation is "
            f"{logo['mape_pct']:.1f}% MAPE / {logo['bias_pct']:+.1f}% signed ({logo['fold']}); the step band carries it "
            f"on the linear layers' share of the time (step_time_band.basis)")


def _family_times(per_op: list[dict]) -> tuple[float, dict[str, float]]:
    """(all of ``per_op``'s time, its time by kernel family of :data:`OP_CLASS_FAMILY`)."""
    total = sum(float(o.get("time_ms", 0.0)) for o in per_op or [])
    by_family: dict[str, float] = {}
    for o in per_op or []:
        fam = OP_CLASS_FAMILY.get(str(o.get("op_class")))
        if fam is not None:
            by_family[fam] = by_family.get(fam, 0.0) + float(o.get("time_ms", 0.0))
    return total, by_family


def generation_log_width(per_op: list[dict], bundle, tensor: bool, *, generation: bool = True,
                         fp8_log: float = 0.0) -> float:
    """The kernels' generation error of a step (log units): each family's :func:`_family_bias_log` times its share of
    ``per_op``'s time (op_class, time_ms: a single-GPU step's, or a cluster rank's whole model for one micro-batch;
    classes outside :data:`OP_CLASS_FAMILY`, such as collectives, add nothing but count in the total); ``generation``
    False: that term left out. Plus ``fp8_log`` (:func:`fp8_kernel_log`) times the ``linear`` class's share: an FP8
    step's GEMMs on a generation without a measured FP8 step (the LM head, bf16 under an FP8 recipe, is in that class
    too: a few percent of the linear time)."""
    num, total = generation_terms(per_op, bundle, tensor, generation=generation, fp8_log=fp8_log)
    return num / total if math.isfinite(total) and total > 0 else 0.0


def generation_terms(per_op: list[dict], bundle, tensor: bool, *, generation: bool = True,
                     fp8_log: float = 0.0) -> tuple[float, float]:
    """(sum over kernel families of their time x :func:`_family_bias_log` (0 with ``generation`` False), plus the
    ``linear`` class's time x ``fp8_log``; all of ``per_op``'s time): the :func:`generation_log_width` of ``per_op``
    with ``extra_ms`` more time outside the families (a cluster step's data loading) is the first over (the second +
    extra_ms), for many ``extra_ms`` at once (:func:`cluster_band_columns`)."""
    total, by_family = _family_times(per_op)
    num = sum(t * _family_bias_log(bundle, fam, tensor) for fam, t in by_family.items()) if generation else 0.0
    if fp8_log:
        num += fp8_log * sum(float(o.get("time_ms", 0.0)) for o in per_op or [] if o.get("op_class") == "linear")
    return num, total


def outside_calibration(setting: str, spec: DeviceSpec) -> bool:
    """Whether a step of ``setting`` on ``spec`` carries the kernels' generation error (:func:`generation_log_width`):
    its GPU generation is not among the measured steps' (False without a calibration for ``setting``)."""
    s = (load_step_band() or {}).get("settings", {}).get(setting)
    return s is not None and generation_of(spec) not in s["generations"]


def ood_kernel_band_log(costed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ood, low_log, high_log) per row of a costed graph (columns as :func:`ood_band_log` reads them): ``ood`` the rows
    flagged out of distribution with a finite positive time, and each such row's log band (0 on the other rows): its
    own ``low_ms`` / ``high_ms`` over ``time_ms``, the band ``wattcast kernels`` shows for it (the leave-one-generation-out
    band widened by its distance beyond coverage, ``models/coverage.py``, or for a shape beyond training by
    ``OOD_BAND_FACTOR``). Until stop 58 the family's un-widened leave-one-generation-out band replaced it, so a step of
    kernels 10x beyond every measured GPU got the band of a catalog GPU (audit 58d); its ``bundle`` argument, unread
    since, went at stop 59. Read it before a power limit stretches ``time_ms``."""
    t = costed["time_ms"].to_numpy(dtype=float)
    n = len(t)
    ood = costed["ood"].to_numpy(dtype=bool) & np.isfinite(t) & (t > 0)
    lo_all, hi_all = np.zeros(n), np.zeros(n)
    if not ood.any():
        return ood, lo_all, hi_all
    idx = np.flatnonzero(ood)
    tt = t[idx]
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = np.log(costed["low_ms"].to_numpy(dtype=float)[idx] / tt)
        hi = np.log(costed["high_ms"].to_numpy(dtype=float)[idx] / tt)
    lo_all[idx] = np.where(np.isfinite(lo), np.minimum(lo, 0.0), 0.0)
    hi_all[idx] = np.where(np.isfinite(hi), np.maximum(hi, 0.0), 0.0)
    return ood, lo_all, hi_all


def ood_from_sums(total_ms: float, ood_ms: float, ood_low_ms: float, ood_high_ms: float) -> dict:
    """``{"share", "low_log", "high_log"}`` from summed times: all the kernel time ``total_ms``, the OOD kernels'
    ``ood_ms`` and the same kernels' times at their band's edges (sum of time x exp(low_log), time x exp(high_log));
    empty without OOD time."""
    if not (math.isfinite(total_ms) and total_ms > 0 and math.isfinite(ood_ms) and ood_ms > 0):
        return {}
    return {"share": ood_ms / total_ms, "low_log": math.log(ood_low_ms / ood_ms),
            "high_log": math.log(ood_high_ms / ood_ms)}


def ood_band_log(costed) -> dict:
    """``{"share", "low_log", "high_log"}`` of a costed graph's out-of-distribution kernels (``ood``; ``op_class``,
    ``dtype``, ``time_ms``, ``low_ms``, ``high_ms`` as :func:`wattcast.simulate.single_device.cost_nodes` gives them):
    their share of the kernel time and the log of their time-weighted band, each kernel with its own ``low_ms`` /
    ``high_ms`` (:func:`ood_kernel_band_log`: the band ``wattcast kernels`` shows).
    Empty without OOD time."""
    t = costed["time_ms"].to_numpy(dtype=float)
    ok = np.isfinite(t) & (t > 0)
    ood, lo, hi = ood_kernel_band_log(costed)
    tt = t[ood]
    return ood_from_sums(float(t[ok].sum()), float(tt.sum()), float((tt * np.exp(lo[ood])).sum()),
                         float((tt * np.exp(hi[ood])).sum()))


def mix_band_log(lo: float, hi: float, ood: dict | None) -> tuple[float, float]:
    """The (low, high) log band of a step whose in-distribution time carries [``lo``, ``hi``] and whose OOD share
    ``ood["share"]`` carries the OOD kernels' band (at least as wide: never narrower than ``lo``/``hi``), mixed in
    time ratio: (1 - s) exp(lo) + s exp(lo_ood). Non-increasing low and non-decreasing high in the share."""
    if not ood or ood.get("share", 0.0) <= 0:
        return lo, hi
    low, high = _mixed_log(lo, hi, float(ood["share"]), float(ood["low_log"]), float(ood["high_log"]))
    return float(low), float(high)


def _mixed_log(lo, hi, share, lo_ood, hi_ood):
    """:func:`mix_band_log`'s mixture for a positive ``share`` (scalars or arrays): the OOD band never narrower than
    [``lo``, ``hi``], mixed in time ratio."""
    s = np.clip(share, 0.0, 1.0)
    lo_o, hi_o = np.minimum(lo_ood, lo), np.maximum(hi_ood, hi)
    return np.log((1 - s) * np.exp(lo) + s * np.exp(lo_o)), np.log((1 - s) * np.exp(hi) + s * np.exp(hi_o))


#: what :func:`ood_warning`'s share is of: one device's OOD kernels' share of the kernels' GPU time
#: (``StepPrediction.ood_kernel_time_fraction``); a cluster step's (and a search row's) share of its critical rank's
#: costed time, collectives and host launch gaps included (``distributed.critical_rank_ood``, the band's input)
OOD_OF_KERNEL_TIME = "the predicted kernel time (GPU time, host launch gaps aside)"
OOD_OF_RANK_TIME = "the critical rank's predicted time (host launch gaps included)"


def ood_warning(share: float, of: str = OOD_OF_RANK_TIME) -> str | None:
    """The warning of a prediction whose OOD share of ``of`` (:data:`OOD_OF_KERNEL_TIME` on one device,
    :data:`OOD_OF_RANK_TIME` on a cluster) is above :data:`OOD_WARN_SHARE`, else None. Until stop 57 it said "kernel
    time" for a share of the step time, host launch gaps included, so a host-bound step hid mostly-OOD kernels (Llama 3
    8B decode on an H100: 35% at eager PyTorch's 40 us a launch, no warning; 66% at 6 us, the same kernels)."""
    if not math.isfinite(share) or share <= OOD_WARN_SHARE:
        return None
    return (f"{100 * share:.0f}% of {of} is out of distribution: those kernels' GPU descriptors or "
            "shapes lie beyond what the leave-one-generation-out test covered (no held-out generation was predicted "
            "that far from its training GPUs), so their times are extrapolations; the step band is widened for them "
            "(step_time_band.ood_time_share)")


def basis_text(setting: str, generations: list, gen: str, extra_log: float | None, share: float, ood_low_log: float,
               ood_high_log: float) -> str:
    """The ``basis`` sentence of a step band (:func:`step_band`; a search row's ``step_time_band_basis``): the measured
    steps' generations, the kernels' generation term ``extra_log`` (None: ``gen`` is among the calibrated ones) and
    the OOD share of the time with its kernels' band (log ends)."""
    basis = f"measured {setting} steps ({', '.join(generations)})"
    if extra_log is not None:
        basis += f" + the kernels' generation error ({gen} is not among them: +/-{100 * (math.exp(extra_log) - 1):.1f}%)"
    if share > 0:
        basis += (f"; {100 * share:.0f}% of the predicted time (host launch gaps included) is out of distribution and "
                  f"carries those kernels' own band "
                  f"({100 * (math.exp(ood_low_log) - 1):+.0f} .. {100 * (math.exp(ood_high_log) - 1):+.0f}%)")
    return basis


def fp8_basis_text(gen: str, logo: dict, fp8_extra_log: float) -> str:
    """The FP8 clause :func:`step_band` appends to its ``basis`` (and a search row's ``step_time_band_basis``) for an
    FP8 step on a generation without a measured FP8 step: ``logo`` its :func:`fp8_kernel_logo`, ``fp8_extra_log`` the
    FP8 term's log width on the step (:func:`generation_log_width` with ``generation=False``)."""
    return (f" + the FP8 GEMMs' error on a generation never measured in FP8 (no FP8 step on {gen}; "
            f"{logo['mape_pct']:.1f}% MAPE, {logo['fold']}, on the linear layers' share of the time: "
            f"+/-{100 * (math.exp(fp8_extra_log) - 1):.1f}%)")


def search_basis_columns(generation: np.ndarray, generation_log: np.ndarray, ok: np.ndarray, share: np.ndarray,
                         ood_lo_log: np.ndarray, ood_hi_log: np.ndarray, setting: str = "cluster", *,
                         fp8_logo: np.ndarray | None = None, fp8_log: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """``step_time_band_basis`` and ``step_time_band_generation`` per search row (what ``predict_cluster``'s
    ``step_time_band`` says as ``basis`` / ``generation`` for the same strategy): :func:`basis_text` of each row
    (``ok``: a scheduled step; None elsewhere, and everywhere without a calibration for ``setting``), with
    :func:`fp8_basis_text` where the row's ``fp8_logo`` (its :func:`fp8_kernel_logo` for an FP8 step, else None) is
    set, ``fp8_log`` its FP8 term's log width (``generation_log`` the generation term alone). Until stop 59 a row had no
    FP8 clause and its generation figure held the FP8 term too (Llama 3 8B FP8 TP8 on DGX-H100: +/-5.9% against
    predict_cluster's +/-3.0% and an FP8 +/-2.9%; the band was the same)."""
    s = (load_step_band() or {}).get("settings", {}).get(setting)
    n = len(generation)
    basis = np.full(n, None, dtype=object)
    if s is not None:
        for i in np.flatnonzero(ok):
            g = str(generation[i])
            sh = float(share[i]) if math.isfinite(float(share[i])) else 0.0
            basis[i] = basis_text(setting, s["generations"], g, None if g in s["generations"] else float(generation_log[i]),
                                  sh, float(ood_lo_log[i]) if sh > 0 else 0.0, float(ood_hi_log[i]) if sh > 0 else 0.0)
            logo = fp8_logo[i] if fp8_logo is not None else None
            if logo:
                basis[i] += fp8_basis_text(g, logo, float(fp8_log[i]))
    return {"step_time_band_basis": basis,
            "step_time_band_generation": np.where(ok, np.asarray(generation, dtype=object), None)}


def step_band(step_ms: float, setting: str, spec: DeviceSpec, per_op: list[dict], bundle, *, tensor: bool,
              ood: dict | None = None, fp8: bool = False) -> dict:
    """``{"low_ms", "high_ms", "basis", "generation", "ood_time_share", "ood_collective_time_share"}`` for a predicted
    step of ``step_ms`` (empty without a calibration for ``setting`` or a finite step). ``tensor``: the step's GEMMs
    run on tensor cores (not FP32). ``ood``: :func:`ood_band_log` of the step's kernels (a cluster step's: its critical
    rank's, ``simulate/distributed.py``; their share of the time carries their own band, :func:`mix_band_log`); None:
    no OOD term. ``ood["collective_share"]``: the share of that time in collectives outside the collective model's
    training support, reported only: no leave-one-generation-out test covers the collective model (its per-kernel
    band, ``collective_band.json``, rests on one unseen system), so they keep the measured step band, like any
    collective. ``fp8``: an FP8 recipe's step; on a generation without a measured FP8 step its linear layers' share
    carries the FP8 kernels' leave-one-generation-out error too (:func:`fp8_kernel_log`), whatever the generation term
    (no calibrated generation runs FP8)."""
    cal = load_step_band()
    s = (cal or {}).get("settings", {}).get(setting)
    if s is None or not math.isfinite(step_ms) or step_ms <= 0:
        return {}
    lo, hi = s["band_log"]
    gen = generation_of(spec)
    extra = None
    if gen not in s["generations"]:
        extra = generation_log_width(per_op, bundle, tensor)
        lo, hi = lo - extra, hi + extra
    fp8_text = ""
    fp8_log = fp8_kernel_log(spec, fp8)
    if fp8_log > 0:
        fp8_extra = generation_log_width(per_op, bundle, tensor, generation=False, fp8_log=fp8_log)
        lo, hi = lo - fp8_extra, hi + fp8_extra
        fp8_text = fp8_basis_text(gen, fp8_kernel_logo(spec), fp8_extra)
    share = float(ood.get("share", 0.0)) if ood else 0.0
    if share > 0:
        lo, hi = mix_band_log(lo, hi, ood)
    basis = basis_text(setting, s["generations"], gen, extra, share, *((ood["low_log"], ood["high_log"]) if share > 0
                                                                        else (0.0, 0.0))) + fp8_text
    # reported, not in the basis: the band is not built from it (the collectives' own band rests on one unseen system)
    coll = float(ood.get("collective_share", 0.0)) if ood else 0.0
    return {"low_ms": step_ms * math.exp(lo), "high_ms": step_ms * math.exp(hi), "basis": basis, "generation": gen,
            "ood_time_share": share, "ood_collective_time_share": coll}


def cluster_band_columns(step_ms, generation_log, total_ms, ood_ms, ood_low_ms, ood_high_ms,
                         ood_collective_ms, setting: str = "cluster") -> dict[str, np.ndarray]:
    """:func:`step_band` over many steps at once (a search's rows), arrays in, arrays out: ``step_time_band_low_ms``,
    ``step_time_band_high_ms``, ``ood_time_share`` and ``ood_collective_time_share``, the figures :func:`step_band`
    gives each step. Per step: ``generation_log`` the generation term (:func:`generation_log_width`; 0 where
    :func:`outside_calibration` is False), and its critical rank's sums as
    ``simulate.distributed.critical_rank_ood_sums`` gives them (kernel, OOD kernel, OOD at the band's low and high
    edge, OOD collective ms; all 0 without OOD time). A step that is not finite and positive (an unscheduled one, NaN)
    has a NaN band and NaN shares; no calibration for ``setting``: NaN bands."""
    step = np.asarray(step_ms, dtype=float)
    total, ood, ood_lo, ood_hi, coll = (np.asarray(v, dtype=float) for v in (total_ms, ood_ms, ood_low_ms, ood_high_ms,
                                                                            ood_collective_ms))
    ok = np.isfinite(step) & (step > 0)
    has_total = np.isfinite(total) & (total > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        has_ood = has_total & np.isfinite(ood) & (ood > 0)  # ood_from_sums: empty without OOD time
        share = np.where(has_ood, ood / total, 0.0)
        coll_share = np.where(has_total, coll / total, 0.0)
        lo_o, hi_o = np.log(ood_lo / ood), np.log(ood_hi / ood)
    s = (load_step_band() or {}).get("settings", {}).get(setting)
    low = high = np.full(step.shape, np.nan)
    if s is not None:
        extra = np.asarray(generation_log, dtype=float)
        lo, hi = s["band_log"][0] - extra, s["band_log"][1] + extra
        # mix_band_log where the step has OOD time
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            lo_m, hi_m = _mixed_log(lo, hi, share, lo_o, hi_o)
            lo, hi = np.where(share > 0, lo_m, lo), np.where(share > 0, hi_m, hi)
            low, high = np.where(ok, step * np.exp(lo), np.nan), np.where(ok, step * np.exp(hi), np.nan)
    return {"step_time_band_low_ms": low, "step_time_band_high_ms": high,
            "ood_time_share": np.where(ok, share, np.nan), "ood_collective_time_share": np.where(ok, coll_share, np.nan)}


def band_keys(band: dict) -> dict:
    """A prediction's JSON keys for its band: ``step_time_band_ms`` [low, high] and ``step_time_band`` (with the
    basis); None for both where the step has no band."""
    if not band:
        return {"step_time_band_ms": None, "step_time_band": None}
    return {"step_time_band_ms": [band["low_ms"], band["high_ms"]], "step_time_band": dict(band)}
