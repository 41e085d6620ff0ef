"""Small tensor-core GEMMs against the measuring floor: the GEMM family's second LightGBM member, blended in by size.

The GEMM family's trees learn ``log(measured / roofline)``. Below ~1 GFLOP a kernel's time is mostly a fixed floor
(launch, prologue/epilogue, the timing method's own overhead), not a multiple of the roofline, so a ratio learnt on
slower GPUs does not shrink to a new GPU's small GEMMs: leave one generation out, the shipped recipe had small GEMMs
within 20% on 4 of 14 held-out device x dtype cells (B200 -31%, H100 +63%, A100 Vidur +76%). A second LightGBM learns
``log(measured / (roofline + floor))`` with ``floor`` the measuring source's timing floor (fitted per source on the
training rows with the spec-sheet tile/wave model, ``training/gemm_floor.py``); it reaches 9 of 14 cells, while the
first stays better on large GEMMs. The two are blended in log space by the GEMM's size: the floor member alone below
``gflop[0]``, the roofline member alone from ``gflop[1]``, log-linear in GFLOP between (no step in predicted time).
Measured with ``benchmarks/leave_one_generation_out.py`` (``bundle+floor-blend``, the shipped recipe's LightGBM).

At prediction time the floor is the one of ``source``: XLA's, a CUPTI kernel time -- what a kernel of a training
step takes on the GPU (the scheduler adds the host's launch cost where the CPU cannot keep up). Only tensor-core
dtypes are blended: FP32 GEMMs were measured by one kind of source (NeuSight's CUDA events) and keep the first member.
A blended row's ``model`` column reads ``<choice>+floor``. Its band is the tensor-core band of the generation
calibration, which refits the floor and ceiling members per fold with the roofline member (since stop 32).
"""

from __future__ import annotations

import functools

import numpy as np

#: GFLOP below which the floor member alone predicts, and from which the roofline member alone does (log-linear blend)
FLOOR_BLEND_GFLOP = (0.5, 2.0)
#: the measuring source whose floor a prediction uses: a CUPTI kernel time, as a training step's kernels take
PREDICT_SOURCE = "xla"


def blend_weight(gflop: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Weight of the roofline member per row: 0 at or below ``lo`` GFLOP, 1 at or above ``hi``, log-linear between."""
    if not 0 < lo < hi:
        raise ValueError(f"floor blend range must satisfy 0 < lo < hi GFLOP, got ({lo}, {hi})")
    g = np.maximum(np.asarray(gflop, dtype=float), 1e-30)
    return np.clip((np.log(g) - np.log(lo)) / (np.log(hi) - np.log(lo)), 0.0, 1.0)


def blended_log_ratio(p_roof: np.ndarray, p_floor: np.ndarray, t_roof_ms: np.ndarray, floor_ms, w: np.ndarray
                      ) -> np.ndarray:
    """``log(t / t_roof)`` of the blend: ``w`` x the roofline member's log ratio + (1 - ``w``) x the floor member's
    prediction ``exp(p_floor) x (t_roof + floor)`` as a log ratio to the roofline (``floor_ms`` a scalar or per row)."""
    t_roof_ms = np.asarray(t_roof_ms, dtype=float)
    p_f = np.asarray(p_floor, dtype=float) + np.log((t_roof_ms + np.asarray(floor_ms, dtype=float)) / t_roof_ms)
    return w * np.asarray(p_roof, dtype=float) + (1.0 - w) * p_f


def ceiling_log_ratio(p_ceiling: np.ndarray, t_roof_ms: np.ndarray, floor_ms, ceiling) -> np.ndarray:
    """``log(t / t_roof)`` of the ceiling member's prediction ``t = floor + exp(p_ceiling) x t_roof / ceiling``: the
    measuring floor plus the learned multiple of what the device's best achievable matmul takes."""
    t_roof_ms = np.asarray(t_roof_ms, dtype=float)
    t = np.asarray(floor_ms, dtype=float) + np.exp(np.asarray(p_ceiling, dtype=float)) * t_roof_ms / np.asarray(ceiling, dtype=float)
    return np.log(t / t_roof_ms)


#: the ceiling member's key for its LightGBM fitted on every vendor's rows: the member of a GPU whose vendor has none of
#: its own (leave one generation out with every AMD part held out, the NVIDIA-trained member predicts CDNA's large
#: bf16/fp16 GEMMs >= 1 GFLOP from MAMF's ceilings 4-14% fast where the roofline member was 21-29% fast)
POOLED_MEMBER = "pooled"


def ceiling_model(models: dict | None, vendor: str):
    """The ceiling member's LightGBM for a GPU of ``vendor``: its vendor's, else the pooled one, else None."""
    if not models:
        return None
    return models.get(vendor, models.get(POOLED_MEMBER))


#: a 16-bit dtype a device was measured in stands for the other one (the same tensor-core rate and kernels: Vidur
#: profiled the A100 in fp16, llm-foundry trains it in bf16; MAMF lists bf16 only)
SIXTEEN_BIT_TWIN = {"bf16": "fp16", "fp16": "bf16"}


def own_dtype_ceiling(own: dict, dtype: str, default: float) -> float:
    """A device's own matmul ceiling (``own``: a ``ceiling_member`` ``ceilings`` entry, dtype -> ceiling) in ``dtype``
    or its 16-bit twin (:data:`SIXTEEN_BIT_TWIN`), else ``default``."""
    return own.get(dtype, own.get(SIXTEEN_BIT_TWIN.get(dtype, ""), default))


def _table_key(ceilings: dict) -> tuple:
    """A hashable copy of a ``ceilings`` table (device -> dtype -> ceiling), the cache key of :func:`_listed_groups`."""
    return tuple(sorted((d, tuple(sorted(p.items()))) for d, p in ceilings.items()))


@functools.lru_cache(maxsize=64)
def _listed_groups(table: tuple, vendor: str, arch: str) -> tuple[tuple, tuple]:
    """(the same-die group, the same-generation group) of a spec of ``vendor`` and ``arch`` among the ceilings
    ``table`` lists: each a tuple of (the device's dtype -> ceiling, the median over its dtypes) for the listed devices
    (read from the catalog by name: the table's keys are catalog names) of that vendor with matrix units
    (:func:`wattcast.data.device_spec.has_matrix_units`, as the vendor median counts them) whose spec ``arch`` equals
    ``arch`` / whose generation (:func:`wattcast.data.device_spec.generation_of`, the first word of ``arch``) is
    ``arch``'s. Computed once per (table, vendor, arch)."""
    from wattcast.data.catalog import load_catalog
    from wattcast.data.device_spec import generation_of, has_matrix_units

    cat = load_catalog()
    gen = arch.split()[0]
    die, same_gen = [], []
    for dev, per in table:
        spec = cat.get(dev)
        if not per or spec is None or spec.vendor != vendor or not has_matrix_units(spec):
            continue
        item = (dict(per), float(np.median([c for _, c in per])))
        if str(spec.arch or "").strip() == arch:
            die.append(item)
        if spec.arch and generation_of(spec) == gen:
            same_gen.append(item)
    return tuple(die), tuple(same_gen)


def _group_ceiling(group: tuple, dtype: str) -> float:
    """The median over ``group``'s devices (:func:`_listed_groups`) of each one's ceiling in ``dtype`` or its 16-bit
    twin, else its median over its dtypes: each device counts once."""
    return float(np.median([own_dtype_ceiling(own, dtype, med) for own, med in group]))


def row_ceilings(device: str, vendor: str, dtypes: np.ndarray, entry: dict, arch: str = "") -> np.ndarray:
    """Each row's matmul ceiling for ``device`` from a bundle's ``ceiling_member`` entry: the device's own (a training
    device, or one the MAMF table lists) in the dtype or its 16-bit twin; else, for a spec of ``arch`` (its spec's
    ``arch`` string, "Blackwell (GB100)"), the median over the listed devices of the same die (the same ``arch``:
    B200 and GB200) of their ceilings in the dtype (each device's median over its dtypes where it lists none); else
    the same over the listed devices of its generation (the first word of ``arch``, "Blackwell": B200, GB200, B300);
    else its vendor's median; else the default. Only listed devices of ``vendor`` with matrix units count
    (:func:`_listed_groups`).

    Leaving each listed NVIDIA/AMD device out of the shipped table in turn (stop 55, 22 device x dtype ceilings):
    the same die's median is 0.046 off the device's own (9 cells, 4 devices) where the vendor's is 0.070, the
    generation's 0.031 (13 cells, 6 devices) where the vendor's is 0.064; all cells 0.061 against 0.077 (MI210,
    MI300X, MI355X, T4, V100 have no listed sibling and keep the vendor's). Until then a B200 spec with only its
    ``tdp_w`` changed (no longer B200 by its figures) took NVIDIA's 0.8635 for B200's 0.776: its bf16 8192^3 GEMM 11%
    faster, a copy with every tensor peak doubled 2.2-2.3x faster."""
    own = entry["ceilings"].get(device, {})
    other = entry["vendor_ceilings"].get(vendor, entry["default_ceiling"])
    names, codes = np.unique(np.asarray(dtypes, dtype=object).astype(str), return_inverse=True)  # a few dtypes, many rows
    arch = str(arch or "").strip()
    die, same_gen = _listed_groups(_table_key(entry["ceilings"]), vendor, arch) if arch and not own else ((), ())
    group = die or same_gen
    if group:
        per_name = np.array([own_dtype_ceiling(own, d, _group_ceiling(group, d)) for d in names], dtype=float)
    else:
        per_name = np.array([own_dtype_ceiling(own, d, other) for d in names], dtype=float)
    return per_name[codes.reshape(-1)]


def check_ceiling_member(spec: dict, where: str) -> dict:
    """A bundle's ``ceiling_member`` entry, checked (ceilings in (0, 1], floor > 0, one LightGBM file per vendor in
    ``lgbm``, optional ``features``: the members' own feature list). Raises ValueError naming ``where`` and the bad
    key."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: 'ceiling_member' must be a mapping")

    def ok(c) -> bool:
        return isinstance(c, (int, float)) and np.isfinite(c) and 0 < c <= 1

    ceilings = spec.get("ceilings")
    if not isinstance(ceilings, dict) or not all(isinstance(p, dict) and all(ok(c) for c in p.values())
                                                 for p in ceilings.values()):
        raise ValueError(f"{where}: 'ceiling_member.ceilings' must map device -> dtype -> a ceiling in (0, 1]")
    vc = spec.get("vendor_ceilings")
    if not isinstance(vc, dict) or not all(ok(c) for c in vc.values()) or not ok(spec.get("default_ceiling")):
        raise ValueError(f"{where}: 'ceiling_member.vendor_ceilings' / 'default_ceiling' must be ceilings in (0, 1]")
    f = spec.get("floor_ms")
    if not (isinstance(f, (int, float)) and np.isfinite(f) and f > 0):
        raise ValueError(f"{where}: 'ceiling_member.floor_ms' must be a positive floor in ms")
    lg = spec.get("lgbm")
    if not isinstance(lg, dict) or not lg or not all(isinstance(v, str) for v in lg.values()):
        raise ValueError(f"{where}: 'ceiling_member.lgbm' must map each vendor to its LightGBM file")
    feats = spec.get("features")
    if feats is not None and (not isinstance(feats, list) or not feats or not all(isinstance(x, str) for x in feats)):
        raise ValueError(f"{where}: 'ceiling_member.features' must be a list of feature names")
    out = {"ceilings": {str(d): {str(t): float(c) for t, c in p.items()} for d, p in ceilings.items()},
           "vendor_ceilings": {str(k): float(v) for k, v in vc.items()}, "default_ceiling": float(spec["default_ceiling"]),
           "floor_ms": float(f), "lgbm": {str(k): str(v) for k, v in lg.items()}}
    if feats is not None:  # bundles of stop 31 read the family's features
        out["features"] = list(feats)
    return out


def check_floor_blend(spec: dict, where: str) -> dict:
    """A bundle's ``floor_blend`` entry, checked: ``floors_ms`` (source -> ms, each > 0), ``source`` among them and
    ``gflop`` [lo, hi] with 0 < lo < hi. Raises ValueError naming ``where`` and the bad key."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: 'floor_blend' must be a mapping")
    floors = spec.get("floors_ms")
    if not isinstance(floors, dict) or not floors or not all(
            isinstance(v, (int, float)) and np.isfinite(v) and v > 0 for v in floors.values()):
        raise ValueError(f"{where}: 'floor_blend.floors_ms' must map each source to a positive floor in ms")
    if spec.get("source") not in floors:
        raise ValueError(f"{where}: 'floor_blend.source' {spec.get('source')!r} is not one of {sorted(floors)}")
    g = spec.get("gflop")
    if not (isinstance(g, (list, tuple)) and len(g) == 2):
        raise ValueError(f"{where}: 'floor_blend.gflop' must be [lo, hi]")
    blend_weight(np.ones(1), float(g[0]), float(g[1]))  # 0 < lo < hi
    return {"floors_ms": {str(k): float(v) for k, v in floors.items()}, "source": str(spec["source"]),
            "gflop": [float(g[0]), float(g[1])]}
