"""The 90% band of a predicted step (``step_time_band_ms``), from measured steps.

``models/artifacts/step_band.json`` holds, per setting (``single``: one GPU; ``cluster``: a distributed training step),
the 5% and 95% quantiles of log(measured / predicted) over whole measured steps and the GPU generations they ran on
(made by ``python -m wattcast.validation.step_band``, which says how it was calibrated and checked). A step on a
generation outside those also carries the kernels' generation error, which no measured step covers:
:func:`generation_log_width`, each op family's largest signed bias over its leave-one-generation-out folds (the kernel
bundle's ``logo.folds``; the dtype class's where the folds give one), weighted by the family's share of the step.
Signed, not absolute per-kernel error: over a step the per-kernel scatter averages out, a generation's bias does not.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

from wattcast.data.device_spec import DeviceSpec, generation_of

#: the shipped calibration
STEP_BAND_FILE = Path(str(files("wattcast.models") / "artifacts" / "step_band.json"))
#: a per-op class of a step's ``per_op`` -> the kernel family whose generation folds describe its error
OP_CLASS_FAMILY = {"linear": "gemm", "bmm": "gemm", "flash_attention": "gemm", "elementwise": "elementwise",
                   "layernorm": "ln", "softmax": "softmax", "loss": "softmax", "conv": "conv"}
#: a dtype class needs this many of its rows in a fold for the fold's class bias to count (as the kernel band's)
MIN_CLASS_ROWS = 100


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


def generation_log_width(per_op: list[dict], bundle, tensor: bool) -> float:
    """The kernels' generation error of a step (log units): each family's :func:`_family_bias_log` times its share of
    ``per_op``'s time (op_class, time_ms: a single-GPU step's, or a cluster rank's whole model for one micro-batch;
    classes outside :data:`OP_CLASS_FAMILY`, such as collectives, add nothing but count in the total)."""
    total = sum(float(o.get("time_ms", 0.0)) for o in per_op or [])
    if not math.isfinite(total) or total <= 0:
        return 0.0
    by_family: dict[str, float] = {}
    for o in per_op or []:
        fam = OP_CLASS_FAMILY.get(str(o.get("op_class")))
        if fam is not None:
            by_family[fam] = by_family.get(fam, 0.0) + float(o.get("time_ms", 0.0))
    return sum(t / total * _family_bias_log(bundle, fam, tensor) for fam, t in by_family.items())


def step_band(step_ms: float, setting: str, spec: DeviceSpec, per_op: list[dict], bundle, *, tensor: bool) -> dict:
    """``{"low_ms", "high_ms", "basis", "generation"}`` for a predicted step of ``step_ms`` (empty without a
    calibration for ``setting`` or a finite step). ``tensor``: the step's GEMMs run on tensor cores (not FP32)."""
    cal = load_step_band()
    s = (cal or {}).get("settings", {}).get(setting)
    if s is None or not math.isfinite(step_ms) or step_ms <= 0:
        return {}
    lo, hi = s["band_log"]
    gen = generation_of(spec)
    basis = f"measured {setting} steps ({', '.join(s['generations'])})"
    if gen not in s["generations"]:
        extra = generation_log_width(per_op, bundle, tensor)
        lo, hi = lo - extra, hi + extra
        basis += f" + the kernels' generation error ({gen} is not among them: +/-{100 * (math.exp(extra) - 1):.1f}%)"
    return {"low_ms": step_ms * math.exp(lo), "high_ms": step_ms * math.exp(hi), "basis": basis, "generation": gen}


def band_keys(band: dict) -> dict:
    """A prediction's JSON keys for its band: ``step_time_band_ms`` [low, high] and ``step_time_band`` (with the
    basis); None for both where the step has no band."""
    if not band:
        return {"step_time_band_ms": None, "step_time_band": None}
    return {"step_time_band_ms": [band["low_ms"], band["high_ms"]], "step_time_band": dict(band)}
