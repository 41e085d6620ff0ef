"""A trained set of kernel surrogates (one per op family) and the manifest that describes it.

On disk (``models/artifacts/`` for the shipped bundle, any folder for a retrained one):
- ``kernel_manifest.json``: schema version, per-family feature list, the chosen model
  (``lgbm`` | ``mlp`` | ``ens``), band quantiles, training support ranges, fallback offset, metrics;
- ``kernel_<family>.lgbm.txt``: LightGBM text models;
- ``kernel_mlp.safetensors``: MLP weights, keys ``<family>/<array>``.
Nothing is pickled.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wattcast.featurize.kernel_features import DEVICE_FEATURES, TILES
from wattcast.models.gemm_floor import check_ceiling_member, check_floor_blend
from wattcast.models.kernel_surrogates import (LGBMSurrogate, MLPSurrogate, RooflineSurrogate, Surrogate, choice_members,
                                               distinct_matrix_rows)
from wattcast.models.manifest import check_model_file, read_manifest, sha256_file
from wattcast.models.versioned import Layout, install_version, resolve_live

MANIFEST = "kernel_manifest.json"
MLP_FILE = "kernel_mlp.safetensors"
#: a retrained bundle folder: ``versions/<name>/`` holds each bundle written, ``CURRENT`` names the live one (switched
#: with one atomic rename, so a crash at any moment leaves the previous bundle live); a folder without ``CURRENT``
#: (the shipped ``models/artifacts/``, older bundles) is itself the bundle
POINTER = "CURRENT"
VERSIONS = "versions"
#: bundles the gate refused: ``refused/<name>/``, apart from ``versions`` (whose pruning they never count against)
REFUSED = "refused"


class BundleError(ValueError):
    """A kernel bundle that cannot be used (missing, damaged or tampered files): the message names the file."""




#: where retrained bundles keep their versions (models/versioned.py)
LAYOUT = Layout(pointer=POINTER, versions=VERSIONS, what="bundle", refused=REFUSED)


def resolve_bundle_folder(folder: str | Path) -> Path:
    """The folder holding the live bundle: ``folder/versions/<CURRENT>`` when ``folder`` has a pointer, else ``folder``."""
    return resolve_live(folder, LAYOUT, BundleError)


def _check_file(folder: Path, fn: str, manifest: dict) -> Path:
    """``folder/fn`` after checking it against the manifest's sha256 (bundles written since hashes exist) or, for
    an older manifest, that a LightGBM text model is complete: a damaged file is a BundleError naming it, never a
    crash inside LightGBM's parser."""
    try:
        return check_model_file(folder / fn, (manifest.get("files") or {}).get(fn), what="kernel surrogate")
    except ValueError as e:
        raise BundleError(str(e)) from None
BUNDLE_SCHEMA = 1
#: widen the band (in log space) for rows whose shape is beyond training (since stop 58 a device beyond coverage is
#: widened by its distance instead, models/coverage.py): a stated ASSUMPTION, not a calibration (issue 14). An
#: OOD row lies beyond the farthest any leave-one-generation-out fold extrapolated (``margin``,
#: training/generation_calibration.py), so no fold measured its error, and the folds do not say the error grows with
#: extrapolation up to there: the 14 family folds whose held-out generation lay >= 0.2 (log units) beyond their training
#: GPUs on some descriptor average 20.8% MAPE, the 16 within 0.2 21.1% (shipped kernel_manifest.json ``logo.folds``:
#: ``excess``, ``mape_pct``). Nothing here supports 2 or any other factor; it stays a visible widening of the unmeasured.
OOD_BAND_FACTOR = 2.0
#: tolerance on support ranges, as a fraction of the range
SUPPORT_SLACK = 0.02


#: the device quantities each model feature is computed from (``featurize.kernel_features.featurize_kernels``: the
#: ``F[...]`` entries; ``peak`` is the row's own rate, the dtype's matrix peak for a GEMM/conv row and the vector FP32
#: peak for every other; tests/test_ood_read_descriptors.py checks the table against the featurizer by moving each
#: spec figure alone). A feature not listed reads no device quantity (the shape's own: log_flops, log_B, ...).
FEATURE_DEVICE_INPUTS: dict[str, frozenset] = {
    "log_intensity_over_ridge": frozenset({"peak", "bw"}),
    "log_t_compute_ms": frozenset({"peak"}),
    "log_t_mem_ms": frozenset({"bw"}),
    "log_t_roof_ms": frozenset({"peak", "bw"}),
    "log_ws_over_l2": frozenset({"l2"}),
    "is_tensor_dtype": frozenset({"native"}),
    "dev_log_sms": frozenset({"sms"}),
    "dev_log_bw_gbps": frozenset({"bw"}),
    "dev_log_peak_vec_tflops": frozenset({"peak_vec"}),
    "dev_log_peak_tflops": frozenset({"peak"}),
    "dev_log_l2_mb": frozenset({"l2"}),
    "dev_clock_ghz": frozenset({"clock"}),
    "dev_is_amd": frozenset({"vendor"}),
    "dev_log_ridge": frozenset({"peak", "bw"}),
    "dev_log_l2bw_over_dram": frozenset({"sms", "clock", "bw"}),
    "dev_log_flops_per_sm_clock": frozenset({"peak", "sms", "clock"}),
    "dev_base_over_boost": frozenset({"base_clock", "clock"}),
    "dev_log_w_per_tflop": frozenset({"tdp", "peak"}),
    "dev_log_mem_gb": frozenset({"mem_gb"}),
    "dev_is_gddr": frozenset({"memory_type"}),
    **{f: frozenset({"sms"}) for f in ("log_tiles_128x128_per_sm", "log_numel_per_sm", "log_rows_per_sm",
                                        "row_wave_eff", "log_elem_waves")},
    **{f"{k}_{a}x{b}": frozenset({"sms"}) for k in ("wave_eff", "log_waves") for a, b in TILES},
}


def read_device_descriptors(features) -> frozenset:
    """The device descriptors (:data:`DEVICE_FEATURES`) a model reading ``features`` reads: those whose every input
    quantity (:data:`FEATURE_DEVICE_INPUTS`) enters one of ``features``, so that a model input moves with it. The
    elementwise and LayerNorm models take only three ``dev_`` features (ridge point, vendor, watts per TFLOP/s) but
    read the bandwidth through ``log_t_mem_ms``, the SM count through ``log_numel_per_sm``, the L2 through
    ``log_ws_over_l2`` and the vector rate through ``log_t_compute_ms`` (each recoverable from those and ``log_bytes``
    / ``log_numel`` / ``log_flops``); they read no memory capacity, clock or base clock, so neither those nor the
    descriptors built on the clock (FLOP per SM-clock, L2 over DRAM bandwidth, base over boost) are theirs. A GEMM
    model takes every descriptor itself."""
    feats = list(features)
    read = frozenset().union(*(FEATURE_DEVICE_INPUTS.get(f, frozenset()) for f in feats))
    return frozenset(f for f in DEVICE_FEATURES if FEATURE_DEVICE_INPUTS[f] <= read)


#: the arithmetic-rate descriptors, left out of the device-OOD check of a family whose models take none of them as a
#: feature (the vector families: elementwise, norms, softmax). A judgement kept from commit 8de09a4, not a
#: derivation: those models do read the rate (:func:`read_device_descriptors`; an H100 spec at 37.4 FP32 TFLOP/s instead of 67 moves
#: their log ratios by 16% median, 74% at most, over 42 Llama-shaped kernels), but only through features checked
#: themselves (ridge point and watts per TFLOP/s as device features, ``log_t_compute_ms`` as a shape feature), and
#: their kernels stream memory far below the ridge point: bandwidth, what their time scales with, stays checked. With
#: the rate checked, an H100's FP32 peak (67 TFLOP/s, beyond the 55 its folds covered) flags every vector kernel of a
#: Llama 3 8B bf16 step (OOD time 3% -> 57%, band -13..+29% -> -20..+40%; no other catalog GPU's flags move).
RATE_DESCRIPTORS = frozenset({"dev_log_peak_tflops", "dev_log_peak_vec_tflops", "dev_log_flops_per_sm_clock"})


def checked_device_descriptors(features) -> frozenset:
    """The device descriptors the device-OOD check of a family whose models read ``features`` looks at: those its
    models read (:func:`read_device_descriptors`), less :data:`RATE_DESCRIPTORS` where no model takes one as a
    feature."""
    read = read_device_descriptors(features)
    return read if RATE_DESCRIPTORS & set(features) else read - RATE_DESCRIPTORS


@dataclass
class FamilyModel:
    family: str
    features: list[str]
    choice: str  # lgbm | mlp | ens | roofline
    band_log: tuple[float, float]  # quantiles of log(measured / predicted) on unseen devices
    support: dict[str, tuple[float, float]]  # feature -> (min, max) over training rows
    fallback_offset: float
    latency_floor_ms: float = 0.0  # the fastest latency measured for this family in training
    lgbm: LGBMSurrogate | None = None
    mlp: MLPSurrogate | None = None
    #: the same per dtype: the sources were timed differently (NeuSight's FP32 kernels one op at a time with
    #: CUDA events, never under ~0.01 ms; the tensor-core sources' FP16 kernels down to 1 us), so a dtype's
    #: floor is the fastest kernel measured in it; dtypes not listed fall back to ``latency_floor_ms``
    latency_floor_by_dtype_ms: dict[str, float] = field(default_factory=dict)
    #: leave-one-generation-out calibration (training/generation_calibration.py): ``band_log`` (replaces the LODO
    #: band), ``margin`` (per device descriptor, the extrapolation beyond the training range the folds covered:
    #: device-OOD starts beyond it), ``folds`` (per held-out generation: rows, MAPE, signed bias); None = not run
    logo: dict | None = None
    #: small tensor-core GEMMs (models/gemm_floor.py): LightGBM on log(measured / (roofline + the measuring source's
    #: floor)), blended in below ``floor_blend["gflop"][1]`` GFLOP; ``floor_blend`` = {"floors_ms": {source: ms},
    #: "source": the floor predictions use, "gflop": [lo, hi]}. None (older bundles, other families): not blended
    floor_lgbm: LGBMSurrogate | None = None
    floor_blend: dict | None = None
    #: tensor-core GEMMs from the floor blend's lower edge up (models/gemm_floor.py, "ceiling member"): one LightGBM per
    #: vendor on log((measured - source floor) / (roofline / the device's matmul ceiling)), predicted in the roofline
    #: member's place for a device of that vendor; ``ceiling_member`` = {"ceilings": {device: {dtype: c}},
    #: "vendor_ceilings": {vendor: c}, "default_ceiling": c, "floor_ms": the floor predictions use}. None: not used
    ceiling_lgbm: dict[str, LGBMSurrogate] | None = None
    ceiling_member: dict | None = None

    @property
    def calibrated_band_log(self) -> tuple[float, float]:
        """The band a prediction carries: the leave-one-generation-out one where calibrated, else the LODO one."""
        if self.logo and self.logo.get("band_log"):
            lo, hi = self.logo["band_log"]
            return float(lo), float(hi)
        return self.band_log

    def band_log_rows(self, tensor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) log band per row: the calibration's own band of the row's dtype class (``tensor``: tensor-core
        rows; the rest FP32/vector) where it has one, else :attr:`calibrated_band_log`."""
        lo, hi = self.calibrated_band_log
        by = (self.logo or {}).get("band_log_by_class") or {}
        tensor = np.asarray(tensor, dtype=bool)
        lo_r, hi_r = np.full(len(tensor), lo), np.full(len(tensor), hi)
        for cls, sel in (("tensor", tensor), ("vector", ~tensor)):
            if cls in by and sel.any():
                lo_r[sel], hi_r[sel] = float(by[cls][0]), float(by[cls][1])
        return lo_r, hi_r

    def floor_ms(self, dtype_names: list[str]) -> np.ndarray:
        """The latency floor (ms) for each of ``dtype_names`` (TF32 tensors are FP32 in memory: a family never
        measured in TF32, such as elementwise, takes the FP32 floor)."""
        fl = self.latency_floor_by_dtype_ms

        def one(d: str) -> float:
            if d in fl:
                return fl[d]
            if d == "tf32" and "fp32" in fl:
                return fl["fp32"]
            return self.latency_floor_ms

        return np.array([one(d) for d in dtype_names], dtype=float)

    def members(self) -> list[Surrogate]:
        """The fitted surrogates ``choice`` runs, in :data:`~wattcast.models.kernel_surrogates.CHOICES` order (one not
        in the bundle is left out; none left means the roofline fallback)."""
        fitted = {LGBMSurrogate.name: self.lgbm, MLPSurrogate.name: self.mlp}
        return [fitted[m] for m in choice_members(self.choice) if fitted.get(m) is not None]

    def predict_log_ratio_matrix(self, A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(log ratio, ensemble spread >= 0) for an (n, len(features)) float64 array, columns = ``features``."""
        n = len(A)
        members = self.members()
        if not members:
            return RooflineSurrogate(self.fallback_offset).predict_matrix(A), np.zeros(n)
        A = np.ascontiguousarray(A, dtype=np.float64)  # one copy for both models (LightGBM wants C order)
        # identical feature rows (kernels that differ only where no feature looks) are predicted once, for both members
        groups = distinct_matrix_rows(A)
        if groups is None:
            preds = [m.predict_matrix(A) for m in members]
        else:
            rep, inverse = groups
            A = np.ascontiguousarray(A[rep])
            preds = [np.asarray(m.predict_matrix(A))[inverse] for m in members]
        if len(preds) == 1:
            return np.asarray(preds[0], dtype=np.float64), np.zeros(n)
        # the mean and half-difference of the two, as np.vstack(...).mean(axis=0) computed them
        p_lgbm, p_mlp = preds
        return (p_lgbm + p_mlp) / 2, np.abs(p_lgbm - p_mlp) / 2

    def __post_init__(self) -> None:
        choice_members(self.choice)  # an unknown choice is a ValueError naming the known ones, not a silent roofline
        # support bounds as arrays, once: lo - slack, hi + slack, and which are device features
        names = list(self.support)
        spans = [self.support[f] for f in names]
        slack = np.array([SUPPORT_SLACK * max(b - a, 1e-9) for a, b in spans])
        # a device descriptor is out of distribution only beyond the extrapolation leave-one-generation-out covered
        # (an L4's watts per TFLOP/s, below every fold, is not covered), and only a descriptor the family's models
        # read (read_device_descriptors): until stop 56 every one was checked, and an H100 spec with 200 GB of memory
        # or a 2.1 GHz boost clock flagged every vector kernel of a Llama 3 8B step (OOD time 3% -> 57%, band
        # -13..+29% -> -20..+40%) whose predictions had not moved in the last digit
        margin = (self.logo or {}).get("margin") or {}
        slack = slack + np.array([float(margin.get(f, 0.0)) if f in DEVICE_FEATURES else 0.0 for f in names])
        self._sup_names = names
        self._sup_lo = np.array([a for a, _ in spans]) - slack
        self._sup_hi = np.array([b for _, b in spans]) + slack
        self._sup_dev = np.array([f in DEVICE_FEATURES for f in names], dtype=bool)
        # the device descriptors the family's models read (its members' features included; the vector families less
        # the arithmetic rate, RATE_DESCRIPTORS): the only ones its device-OOD check, and ood_reason, look at
        member_feats = list((self.ceiling_member or {}).get("features") or [])
        self.checked_descriptors = checked_device_descriptors(list(self.features) + member_feats)
        self._sup_skip = np.array([f in DEVICE_FEATURES and f not in self.checked_descriptors for f in names],
                                  dtype=bool)

    def dtype_class_device_ood(self, X: pd.DataFrame, rows=None) -> np.ndarray:
        """Device-OOD per dtype class: tensor-core rows (``is_tensor_dtype``) against the devices' descriptors over
        the family's tensor-core training rows, FP32 rows against its FP32 rows (each range widened by the
        generation margin). A GPU can be inside the family's pooled range and outside its own class's: an L4's
        watts per FP32 TFLOP/s (2.4) is below every FP32 training GPU's (8 and up), though bf16 rows go lower."""
        n = len(X) if rows is None else len(rows)
        out = np.zeros(n, dtype=bool)
        for _, _, bad, _, _, _ in self.dtype_class_support_checks(X, rows):
            out |= bad
        return out

    def dtype_class_support_checks(self, X: pd.DataFrame, rows=None):
        """Per (dtype class, descriptor) of :meth:`dtype_class_device_ood`: (class, descriptor, rows outside its widened
        range (NaN compares False), the descriptor's values, the range's low and high ends), for the rows ``rows``."""
        by = (self.logo or {}).get("support_by_dtype_class") or {}
        if not by or "is_tensor_dtype" not in X:
            return
        idx = slice(None) if rows is None else rows
        margin = (self.logo or {}).get("margin") or {}
        tensor = X["is_tensor_dtype"].to_numpy()[idx] > 0.5
        for cls, sel in (("tensor", tensor), ("vector", ~tensor)):
            if not sel.any() or cls not in by:
                continue
            for f, (lo, hi) in by[cls].items():
                if f not in X or f not in self.checked_descriptors:
                    continue
                pad = SUPPORT_SLACK * max(hi - lo, 1e-9) + float(margin.get(f, 0.0))
                v = X[f].to_numpy(dtype=float)[idx]
                yield cls, f, sel & ((v < lo - pad) | (v > hi + pad)), v, float(lo - pad), float(hi + pad)

    def support_columns(self, available) -> list[str]:
        """The support features found among ``available`` (in support order): the columns ood_mask checks."""
        return [f for f in self.support if f in available]

    def ood_mask_matrix(self, V: np.ndarray, cols: list[str], skip: frozenset = frozenset()) -> tuple[np.ndarray, np.ndarray]:
        """(shape_ood, device_ood) for an (n, len(cols)) float64 array whose columns are the features ``cols``:
        a feature outside the training support (NaN never is; columns without a support range, and ``skip``, are
        ignored)."""
        n = len(V)
        where = {c: j for j, c in enumerate(cols)}
        shape_ood = np.zeros(n, dtype=bool)
        dev_ood = np.zeros(n, dtype=bool)
        below = np.empty(n, dtype=bool)
        above = np.empty(n, dtype=bool)
        for i, f in enumerate(self._sup_names):
            if f not in where or f in skip or self._sup_skip[i]:
                continue
            v = V[:, where[f]]
            np.less(v, self._sup_lo[i], out=below)  # NaN compares False: never out of support
            np.greater(v, self._sup_hi[i], out=above)
            acc = dev_ood if self._sup_dev[i] else shape_ood
            acc |= below
            acc |= above
        return shape_ood, dev_ood


@dataclass
class KernelBundle:
    families: dict[str, FamilyModel]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def train_devices(self) -> list[str]:
        return list(self.meta.get("train_devices", []))

    def save(self, folder: Path) -> None:
        from safetensors.numpy import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        fams = {}
        tensors: dict[str, np.ndarray] = {}
        for name, fm in self.families.items():
            entry = {
                "features": fm.features,
                "choice": fm.choice,
                "band_log": list(fm.band_log),
                "support": {k: list(v) for k, v in fm.support.items()},
                "fallback_offset": fm.fallback_offset,
                "latency_floor_ms": fm.latency_floor_ms,
                "latency_floor_by_dtype_ms": dict(sorted(fm.latency_floor_by_dtype_ms.items())),
                "lgbm": None,
                "mlp": fm.mlp is not None,
                **({"logo": fm.logo} if fm.logo else {}),
            }
            if fm.lgbm is not None:
                fn = f"kernel_{name}.lgbm.txt"
                fm.lgbm.save(folder / fn)
                entry["lgbm"] = fn
            if fm.floor_lgbm is not None and fm.floor_blend:
                fn = f"kernel_{name}_floor.lgbm.txt"
                fm.floor_lgbm.save(folder / fn)
                entry["floor_blend"] = {**fm.floor_blend, "lgbm": fn}
            if fm.ceiling_lgbm and fm.ceiling_member:
                names = {}
                for vendor, model in sorted(fm.ceiling_lgbm.items()):
                    names[vendor] = f"kernel_{name}_ceiling_{vendor}.lgbm.txt"
                    model.save(folder / names[vendor])
                entry["ceiling_member"] = {**fm.ceiling_member, "lgbm": names}
            if fm.mlp is not None:
                for k, v in fm.mlp.weights().items():
                    tensors[f"{name}/{k}"] = v
            fams[name] = entry
        if tensors:
            save_file(tensors, str(folder / MLP_FILE))
        written = sorted({e["lgbm"] for e in fams.values() if e["lgbm"]} | _floor_files(fams) | ({MLP_FILE} if tensors else set()))
        manifest = {"schema": BUNDLE_SCHEMA, "families": fams, **self.meta,
                    "files": {fn: sha256_file(folder / fn) for fn in written}}
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))

    @classmethod
    def load(cls, folder: Path) -> "KernelBundle":
        folder = resolve_bundle_folder(folder)
        manifest = read_manifest(folder, MANIFEST, "kernel surrogate", BUNDLE_SCHEMA)
        if not isinstance(manifest.get("families"), dict):
            raise BundleError(f"{folder / MANIFEST}: no 'families' mapping")
        tensors: dict[str, np.ndarray] = {}
        if any(e.get("mlp") for e in manifest["families"].values()) or (folder / MLP_FILE).is_file():
            from safetensors import SafetensorError
            from safetensors.numpy import load_file

            path = _check_file(folder, MLP_FILE, manifest)
            try:
                tensors = load_file(str(path))
            except (SafetensorError, OSError, ValueError) as e:
                raise BundleError(f"kernel surrogate file {path} is not a readable safetensors file ({e})") from None
        fams = {}
        for name, e in manifest["families"].items():
            try:
                choice_members(e.get("choice"))
            except ValueError as err:
                raise BundleError(f"{folder / MANIFEST}: family {name!r}: 'choice': {err}") from None
            lg = LGBMSurrogate.load(_check_file(folder, e["lgbm"], manifest), e["features"]) if e.get("lgbm") else None
            mlp = None
            if e.get("mlp"):
                w = {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith(name + "/")}
                mlp = MLPSurrogate(e["features"], w)
            floor_lgbm, floor_blend = None, None
            where = f"{folder / MANIFEST}: family {name!r}"
            if e.get("floor_blend"):
                floor_blend = _checked(check_floor_blend, e["floor_blend"], where)
                fn = e["floor_blend"].get("lgbm")
                if not fn:
                    raise BundleError(f"{folder / MANIFEST}: family {name!r}: 'floor_blend' names no 'lgbm' file")
                floor_lgbm = LGBMSurrogate.load(_check_file(folder, fn, manifest), e["features"])
            ceiling_lgbm, ceiling_member = None, None
            if e.get("ceiling_member"):
                ceiling_member = _checked(check_ceiling_member, e["ceiling_member"], where)
                c_feats = ceiling_member.get("features", e["features"])
                unknown = sorted(set(c_feats) - set(e["features"]))
                if unknown:
                    raise BundleError(f"{where}: 'ceiling_member.features' {unknown} are not the family's features")
                ceiling_lgbm = {v: LGBMSurrogate.load(_check_file(folder, fn, manifest), c_feats)
                                for v, fn in ceiling_member["lgbm"].items()}
            fams[name] = FamilyModel(
                family=name,
                features=list(e["features"]),
                choice=e["choice"],
                band_log=tuple(e["band_log"]),
                support={k: tuple(v) for k, v in e["support"].items()},
                fallback_offset=float(e["fallback_offset"]),
                latency_floor_ms=float(e.get("latency_floor_ms", 0.0)),
                latency_floor_by_dtype_ms={k: float(v) for k, v in e.get("latency_floor_by_dtype_ms", {}).items()},
                lgbm=lg,
                mlp=mlp,
                logo=e.get("logo") or None,
                floor_lgbm=floor_lgbm,
                floor_blend=floor_blend,
                ceiling_lgbm=ceiling_lgbm,
                ceiling_member=ceiling_member,
            )
        meta = {k: v for k, v in manifest.items() if k not in ("schema", "families")}
        return cls(fams, meta)


def _checked(check, entry, where: str) -> dict:
    """``check(entry, where)`` (a member entry's validator), its ValueError raised as a :class:`BundleError`."""
    try:
        return check(entry, where)
    except ValueError as err:
        raise BundleError(str(err)) from None


def _floor_files(families: dict) -> set[str]:
    """The floor and ceiling members' LightGBM files a manifest's ``families`` name."""
    floor = {e["floor_blend"]["lgbm"] for e in families.values() if (e.get("floor_blend") or {}).get("lgbm")}
    ceiling = {fn for e in families.values() for fn in ((e.get("ceiling_member") or {}).get("lgbm") or {}).values()}
    return floor | ceiling


def shipped_folder() -> Path:
    return Path(str(files("wattcast.models") / "artifacts"))


def load_bundle(folder: str | None = None) -> KernelBundle:
    """The bundle in ``folder`` (its live version); without one, the running entry point's ``models=`` / ``--models``,
    else ``$WATTCAST_MODELS``, else the shipped bundle (models/selection.py). Cached per live version, so a bundle
    switched in by a retraining is picked up."""
    if not folder:
        from wattcast.models.selection import active_folder

        folder = active_folder("models")
    return _load_live(str(resolve_bundle_folder(Path(folder) if folder else shipped_folder())))


@lru_cache(maxsize=8)
def _load_live(live: str) -> KernelBundle:
    bundle = KernelBundle.load(Path(live))
    warn_feature_version(bundle, live)
    return bundle


#: bundle folders already warned about their feature version (once per folder and process)
_FEATURE_VERSION_WARNED: set[str] = set()


def feature_version_message(bundle: KernelBundle, where: str) -> str | None:
    """Why ``bundle`` (loaded from ``where``) may see other features than it was trained on: its manifest's
    ``feature_version`` differs from the featurizer's (featurize/kernel_features.FEATURE_VERSION) or is absent; None
    when they match."""
    from wattcast.featurize.kernel_features import FEATURE_VERSION

    got = bundle.meta.get("feature_version")
    if got == FEATURE_VERSION:
        return None
    stamp = "no feature_version (trained before versions were recorded)" if got is None else f"feature_version {got}"
    return (f"kernel bundle {where}: {stamp}, this featurizer computes version {FEATURE_VERSION}; its surrogates are "
            f"fed features that may differ from those they were trained on: retrain it (wattcast train kernels)")


def warn_feature_version(bundle: KernelBundle, where: str) -> None:
    """:func:`feature_version_message` as a UserWarning, once per bundle folder."""
    msg = feature_version_message(bundle, where)
    if msg and where not in _FEATURE_VERSION_WARNED:
        _FEATURE_VERSION_WARNED.add(where)
        warnings.warn(msg, UserWarning, stacklevel=3)


load_bundle.cache_clear = _load_live.cache_clear  # type: ignore[attr-defined]  (callers clear it after a swap)


#: versions a bundle folder keeps besides the live one and the one before it
KEEP_OLD_VERSIONS = 3


def install_bundle(bundle: "KernelBundle", target: str | Path, activate: bool = True) -> Path:
    """Write ``bundle`` as a new version under ``target/versions/``, check it loads (every file against its hash), and
    make it live by writing ``target/CURRENT`` with one atomic rename, under a lock (concurrent trainings serialise
    their switches). A crash before the rename leaves the previous bundle live and at most a ``.tmp-*`` folder;
    one after it, the new one. A flat bundle already in ``target`` (the shipped layout) stays where it is and is
    simply no longer read. Returns the new version's folder (models/versioned.py ``install_version``). ``activate=False``:
    written and checked in ``target/refused/<name>/`` (the newest three kept), ``CURRENT`` and ``versions/`` unchanged (a
    bundle the gate did not accept)."""
    final = install_version(target, LAYOUT, bundle.save, KernelBundle.load, keep=KEEP_OLD_VERSIONS, activate=activate)
    load_bundle.cache_clear()
    return final


def add_hashes(folder: str | Path) -> dict:
    """Write the sha256 of every model file a bundle's manifest names into it (for bundles written before hashes
    were): ``python -c "from wattcast.models.kernel_bundle import add_hashes; add_hashes('DIR')"``."""
    folder = resolve_bundle_folder(folder)
    path = Path(folder) / MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    names = {e["lgbm"] for e in manifest["families"].values() if e.get("lgbm")} | _floor_files(manifest["families"])
    if (Path(folder) / MLP_FILE).is_file():
        names.add(MLP_FILE)
    manifest["files"] = {fn: sha256_file(Path(folder) / fn) for fn in sorted(names)}
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest["files"]
