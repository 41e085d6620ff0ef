"""`wattcast train kernels`: fit, select, evaluate, log and (if it validates) ship the kernel surrogates.

Protocol (held-out discipline):
- Held-out GPUs (default NVIDIA L4 and A100 80GB PCIe) are removed before anything is fitted. They
  are only predicted by the finished bundle, and their errors are reported; nothing is chosen by them.
- Per op family, leave-one-device-out (LODO) over the training GPUs picks the model (LightGBM, MLP
  or their mean) and calibrates the uncertainty band: it is the honest "unseen GPU" estimate that
  training is allowed to look at.
- A random 10% of the shared training GPUs' rows (plus 20% of a user's CSV, drawn per shape) is the validation split: the
  shipped bundle is fitted without it, reports in-distribution error on it, and must be no worse on
  it than the bundle it would replace.
"""

from __future__ import annotations

import hashlib
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from wattcast.data.catalog import load_catalog
from wattcast.data.device_spec import DeviceSpec
from wattcast.featurize.kernel_features import DEVICE_FEATURES, FEATURE_VERSION, FEATURES_BY_FAMILY, featurize_kernels
from wattcast.data.kernel_ops import REPORT_FAMILY
from wattcast.models.kernel_bundle import FamilyModel, KernelBundle
from wattcast.models.gemm_floor import PREDICT_SOURCE
from wattcast.models.kernel_surrogates import (CANDIDATES, CHOICES, LGBMSurrogate, MLPSurrogate, RooflineSurrogate,
                                              spec_monotone_constraints)
from wattcast.training.gemm_floor import (fit_ceiling_member, fit_floor_member, mamf_ceilings, mamf_ratio_any,
                                          per_vendor_sample)

#: NeuSight (ASPLOS'25) published out-of-distribution per-op errors, percent (the bar to halve)
NEUSIGHT_OOD_MAPE = {"bmm": 13.8, "linear": 13.9, "elementwise": 19.3, "softmax": 13.9, "layernorm": 56.7}

#: device descriptors each vector-op family keeps; more of them let the trees memorise the 7 training
#: GPUs, which LODO showed generalises worse (mean LODO APE 0.21 -> 0.16 for LayerNorm). Softmax takes the
#: memory technology (GDDR or HBM) instead of the ridge point (peak FLOP/s over bandwidth, which says nothing
#: about a memory-bound kernel): mean per-GPU LODO APE of the LightGBM + MLP ensemble 18.9 -> 16.4%, in
#: distribution 5.34 -> 5.29% (MLflow run cb16ca0e). The same swap for elementwise gave LODO 18.7 -> 13.8% but
#: in distribution 2.60 -> 3.42%, and the bundle gate refused it; with both descriptors (or the SM count
#: instead of the ridge point) its LODO was no better (21.4, 18.9%). LayerNorm keeps the ridge point (with
#: the memory technology its T4 fold went 14 -> 33%). Stop 30 measured the memory technology in place of its watts
#: per TFLOP: mean per-GPU LODO APE of the MLP 22.2 -> 16.1% (seed 0; 21.9 -> 18.0 seed 1; Vidur's A40 fold 47 ->
#: 19%), but in distribution 5.25 -> 5.27% and the bundle gate kept the working family (MLflow run aabb540f).
VECTOR_DEVICE_FEATURES = {
    "ln": ("dev_log_ridge", "dev_is_amd", "dev_log_w_per_tflop"),
    "softmax": ("dev_is_gddr", "dev_is_amd", "dev_log_w_per_tflop"),
    "elementwise": ("dev_log_ridge", "dev_is_amd", "dev_log_w_per_tflop"),
}
#: what the opt-in monotone recipe (``TrainConfig.spec_monotone``, ``wattcast train kernels --spec-monotone``) takes
#: out of every vector family's features. Stop 58 (issue 14, audit 57g): a streaming kernel is bound by DRAM, not by
#: the board's power limit (the power-limited case, FP32 GEMMs on a board whose TDP cannot feed its lanes, is
#: models/power_derating.py's explicit floor), and as a learned input the watts per TFLOP made the time depend on TDP
#: in both directions: B200 at 1.5x TDP ran rmsnorm 14.8% slower, at 0.75x softmax 7.4% faster. The MLP that
#: LayerNorm chooses cannot be held monotone by LightGBM's constraints (models/kernel_surrogates.py SPEC_MONOTONE), so
#: the input goes, not just its direction. Measured with those constraints (run 04409822, refused by the gate: 3.430
#: vs 3.235% on 21,830 validation rows; elementwise 2.60 -> 2.83, softmax 5.29 -> 5.46, LayerNorm 5.30 -> 5.28):
#: held-out L4 LayerNorm 68.2 -> 40.5%, softmax 142.0 -> 98.1%, elementwise 35.3 -> 32.8%, A100 80GB PCIe elementwise
#: 4.1 -> 5.3%. The family's LightGBM alone without the input: 2.41 -> 2.43% (unconstrained).
VECTOR_MONOTONE_DROPPED = ("dev_log_w_per_tflop",)


def family_features(family: str, spec_monotone: bool = False) -> list[str]:
    """The features ``family`` is fitted on; ``spec_monotone``: the opt-in monotone recipe's (the vector families
    without :data:`VECTOR_MONOTONE_DROPPED`)."""
    feats = list(FEATURES_BY_FAMILY[family])
    if family in VECTOR_DEVICE_FEATURES:
        feats = [f for f in feats if f not in DEVICE_FEATURES] + list(VECTOR_DEVICE_FEATURES[family])
        if spec_monotone:
            feats = [f for f in feats if f not in VECTOR_MONOTONE_DROPPED]
    return feats


#: families fitted with a floor member for their small tensor-core kernels (models/gemm_floor.py; leave one
#: generation out measured it for GEMMs only)
FLOOR_MEMBER_FAMILIES = ("gemm",)


@dataclass
class TrainConfig:
    holdout: tuple[str, ...] = ("L4", "A100-PCIe-80GB")
    # 31 leaves x 250 rounds halves predict time at the same LODO error (gemm 23.9% vs 23.6%) but validated
    # worse in-distribution (6.06% vs 5.72%), so the gate kept 63 x 400 (MLflow run 6d04abb8)
    lgbm_rounds: int = 400
    mlp_epochs: int = 20
    max_rows_per_fit: int = 80_000  # subsample cap per fit (LODO folds and final)
    lodo: bool = True
    val_fraction: float = 0.10
    seed: int = 0
    families: tuple[str, ...] = ("gemm", "conv", "elementwise", "ln", "softmax")
    # opt-in: every LightGBM fit monotone in the spec sheet (models/kernel_surrogates.py SPEC_MONOTONE: the main, floor
    # and ceiling members, and the generation calibration's refits, which read it from the manifest) and the vector
    # families without VECTOR_MONOTONE_DROPPED. Off by default: its retraining was refused by the gate (stop 58: vector
    # families 3.430 vs 3.235%, GEMM 7.976 vs 7.942%; README "Monotone in the spec sheet"), and the shipped bundle must
    # be what the default recipe refits
    spec_monotone: bool = False

    @classmethod
    def quick(cls, **kw) -> "TrainConfig":
        return cls(lgbm_rounds=60, mlp_epochs=3, max_rows_per_fit=8_000, **kw)


@dataclass
class TrainResult:
    bundle: KernelBundle
    metrics: dict[str, float]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    heldout_predictions: pd.DataFrame | None = None
    fingerprint: str = ""
    seconds: float = 0.0


def dataset_fingerprint(df: pd.DataFrame) -> str:
    h = pd.util.hash_pandas_object(df.reset_index(drop=True), index=False).to_numpy()
    return hashlib.sha256(h.tobytes()).hexdigest()[:16]


def ape(pred_ms: np.ndarray, true_ms: np.ndarray) -> np.ndarray:
    return np.abs(pred_ms / true_ms - 1.0)


def _fit_pair(X: pd.DataFrame, y: np.ndarray, feats: list[str], cfg: TrainConfig, rng, want_mlp: bool = True):
    idx = np.arange(len(X))
    if len(idx) > cfg.max_rows_per_fit:
        idx = rng.choice(idx, cfg.max_rows_per_fit, replace=False)
    lg = LGBMSurrogate(feats, num_boost_round=cfg.lgbm_rounds, params={"seed": cfg.seed},
                       spec_monotone=cfg.spec_monotone).fit(X.iloc[idx], y[idx])
    mlp = None
    if want_mlp and cfg.mlp_epochs > 0:
        from wattcast.training.kernel_mlp import fit_mlp

        mlp = fit_mlp(X.iloc[idx], y[idx], feats, epochs=cfg.mlp_epochs, seed=cfg.seed)
    return lg, mlp


def _lodo(X: pd.DataFrame, y: np.ndarray, devices: np.ndarray, feats: list[str], cfg: TrainConfig, rng, tick) -> pd.DataFrame:
    """Leave-one-device-out predictions of every candidate for every row (columns lgbm, mlp, ens: CANDIDATES)."""
    out = pd.DataFrame(index=X.index, columns=list(CANDIDATES), dtype=float)
    for d in pd.unique(devices):
        te = devices == d
        lg, mlp = _fit_pair(X[~te], y[~te], feats, cfg, rng)
        out.loc[te, "lgbm"] = lg.predict(X[te])
        out.loc[te, "mlp"] = mlp.predict(X[te]) if mlp is not None else np.nan
        tick()
    out["ens"] = out[["lgbm", "mlp"]].mean(axis=1)
    return out


def _choose(lodo: pd.DataFrame, y: np.ndarray, devices: np.ndarray) -> tuple[str, dict[str, float]]:
    """The candidate with the lowest mean-over-devices LODO APE."""
    scores = {}
    for c in CANDIDATES:
        p = lodo[c].to_numpy(dtype=float)
        if np.isnan(p).all():
            continue
        e = pd.Series(np.abs(np.exp(p - y) - 1.0)).groupby(devices).mean()
        scores[c] = float(e.mean())
    return min(scores, key=scores.get), scores


def _support(X: pd.DataFrame, feats: Sequence[str]) -> dict[str, tuple[float, float]]:
    sup = {}
    for f in feats:
        v = X[f].to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        if len(v) and f not in ("is_linear", "is_binary", "dev_is_amd", "dev_is_gddr", "is_tensor_dtype"):
            sup[f] = (float(v.min()), float(v.max()))
    return sup


def _fit_ceiling(train: pd.DataFrame, X_all: pd.DataFrame, m: np.ndarray, specs: dict[str, DeviceSpec],
                 feats: list[str], floors_ms: dict[str, float], cfg: TrainConfig, data_root
                 ) -> tuple[dict | None, dict | None]:
    """The GEMM family's ceiling member (training/gemm_floor.py ``fit_ceiling_member``) on the family's training rows
    ``m``, each vendor's subsampled to ``cfg.max_rows_per_fit``; the entry also lists the MAMF table's ceilings of
    catalog GPUs that no training row measures (a device outside training still takes its own). (None, None), said on
    stdout, when no vendor has enough tensor-core rows."""
    rng = np.random.default_rng([cfg.seed, zlib.crc32(b"ceiling member")])
    idx = per_vendor_sample(train["device"].to_numpy(), np.flatnonzero(m), specs, cfg.max_rows_per_fit, rng)
    rows, X = train.iloc[idx], X_all.iloc[idx]
    try:
        models, entry = fit_ceiling_member(rows, X, specs, feats, floors_ms, mamf_ratio_any(data_root, rows, specs),
                                           rounds=cfg.lgbm_rounds, seed=cfg.seed, spec_monotone=cfg.spec_monotone)
    except ValueError as e:  # too few tensor-core rows of any vendor (a small --csv with XLA rows): the roofline member
        print(f"GEMM ceiling member not fitted ({e}); tensor-core GEMMs keep the roofline member")
        return None, None
    for dev, per in mamf_ceilings(data_root, load_catalog()).items():
        entry["ceilings"].setdefault(dev, per)
    entry["ceilings"] = dict(sorted(entry["ceilings"].items()))
    return models, entry


#: a family with fewer training rows (validation split out) gets no surrogate in the bundle
MIN_FAMILY_ROWS = 50


def train_bundle(
    train: pd.DataFrame,
    specs: dict[str, DeviceSpec],
    cfg: TrainConfig,
    progress: Callable[[str, int], None] | None = None,
    extra_val: pd.DataFrame | None = None,
    data_root=None,
) -> tuple[KernelBundle, dict[str, pd.DataFrame], pd.DataFrame]:
    """Fit one model per family on ``train`` (no held-out GPU rows!). Returns bundle, LODO tables, val split.
    ``data_root``: the datasets folder whose MAMF table gives the GEMM floor member's matmul ceilings (else defaults)."""
    rng = np.random.default_rng(cfg.seed)
    held = set(cfg.holdout)
    leaked = sorted(set(train["device"]) & held)
    if leaked:
        raise ValueError(f"held-out GPU rows reached training: {leaked}")
    X_all = featurize_kernels(train, specs)
    y_all = np.log(train["latency_ms"].to_numpy(dtype=float) / X_all["t_roof_ms"].to_numpy())
    is_val = rng.random(len(train)) < cfg.val_fraction
    # a user's CSV rows were split already, per shape, in ``kernel_run.split_user_rows`` (its ``extra_val``): none of
    # its training rows is drawn again (the draw itself is unchanged, so the shared rows' split is the same)
    if "source" in train:
        is_val &= train["source"].to_numpy() != "user"
    val_parts = [train[is_val]]
    if extra_val is not None and len(extra_val):
        val_parts.append(extra_val)
    families: dict[str, FamilyModel] = {}
    # per family, the GPUs it was fitted on (a partial retraining, --family, unions these over the families it keeps)
    family_devices: dict[str, list[str]] = {}
    tables: dict[str, pd.DataFrame] = {}
    tick = (lambda: progress("fit", 1)) if progress else (lambda: None)
    for fam in cfg.families:
        m = (X_all["family"] == fam).to_numpy() & ~is_val
        if m.sum() < MIN_FAMILY_ROWS:  # no surrogate: its kernels are costed by the roofline (kernel_run warns)
            continue
        feats = family_features(fam, cfg.spec_monotone)
        X, y = X_all[m], y_all[m]
        devs = train["device"].to_numpy()[m]
        family_devices[fam] = sorted(set(devs))
        choice, scores, band = "lgbm", {}, (-0.3, 0.3)
        if cfg.lodo and len(pd.unique(devs)) >= 3:
            lodo = _lodo(X, y, devs, feats, cfg, rng, tick)
            choice, scores = _choose(lodo, y, devs)
            resid = y - lodo[choice].to_numpy(dtype=float)
            band = (float(np.quantile(resid, 0.05)), float(np.quantile(resid, 0.95)))
            t = pd.DataFrame(
                {
                    "device": devs,
                    "op": train["op"].to_numpy()[m],
                    "dtype": train["dtype"].to_numpy()[m],
                    "source": train["source"].to_numpy()[m],
                    **{f"ape_{c}": np.abs(np.exp(lodo[c].to_numpy(dtype=float) - y) - 1) for c in CANDIDATES},
                    "ape_roofline": np.abs(np.exp(-y) - 1),
                }
            )
            t.attrs["scores"] = scores
            t.attrs["choice"] = choice
            tables[fam] = t
        lg, mlp = _fit_pair(X, y, feats, cfg, rng, want_mlp=MLPSurrogate.name in CHOICES[choice] or cfg.mlp_epochs > 0)
        tick()
        families[fam] = FamilyModel(
            family=fam,
            features=feats,
            choice=choice,
            band_log=band,
            # every device descriptor's training range, used by the model or not: a GPU outside any of them is
            # flagged device-OOD (softmax reads no bandwidth feature, yet a 10x-bandwidth GPU is still unseen)
            support=_support(X, feats + [f for f in DEVICE_FEATURES if f not in feats]),
            fallback_offset=RooflineSurrogate().fit(X, y).offset,
            # the minimum, not a low quantile: a 0.1% quantile validated worse (5.73% vs 5.72%, MLflow run 5f43ad8b)
            latency_floor_ms=float(train["latency_ms"].to_numpy()[m].min()),
            latency_floor_by_dtype_ms={str(d): float(v) for d, v in
                                       train[m].groupby("dtype", observed=True)["latency_ms"].min().items()},
            lgbm=lg,
            mlp=mlp,
        )
        if fam in FLOOR_MEMBER_FAMILIES and "source" in train and (train["source"].to_numpy()[m] == PREDICT_SOURCE).any():
            # small tensor-core GEMMs against the measuring floor (models/gemm_floor.py), on the same subsample size;
            # a random stream of its own, so the families fitted after this one draw as they did without it
            idx = np.flatnonzero(m)
            if len(idx) > cfg.max_rows_per_fit:
                floor_rng = np.random.default_rng([cfg.seed, zlib.crc32(b"floor member")])
                idx = np.sort(floor_rng.choice(idx, cfg.max_rows_per_fit, replace=False))
            families[fam].floor_lgbm, families[fam].floor_blend = fit_floor_member(
                train.iloc[idx], X_all.iloc[idx], specs, feats, rounds=cfg.lgbm_rounds, seed=cfg.seed, root=data_root,
                spec_monotone=cfg.spec_monotone)
            tick()
            # tensor-core GEMMs from the blend's lower edge up: the ceiling member, vendor by vendor, on up to
            # max_rows_per_fit rows of each vendor (models/gemm_floor.py; a random stream of its own)
            families[fam].ceiling_lgbm, families[fam].ceiling_member = _fit_ceiling(
                train, X_all, m, specs, feats, families[fam].floor_blend["floors_ms"], cfg, data_root)
            tick()
    meta = {
        "train_devices": sorted(set(train.loc[~is_val, "device"])),
        "family_train_devices": family_devices,
        "holdout_devices": list(cfg.holdout),
        "lodo_scores": {f: t.attrs["scores"] for f, t in tables.items()},
        "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "feature_version": FEATURE_VERSION,
        # per family, the directions its LightGBM members were fitted monotone in (models/kernel_surrogates.py
        # SPEC_MONOTONE; empty without --spec-monotone, as in every bundle before stop 58: the trees are free in every
        # spec figure). The generation calibration refits each family as this says (training/generation_calibration.py)
        "spec_monotone": {f: ({k: c for k, c in zip(fm.features, spec_monotone_constraints(fm.features)) if c}
                              if cfg.spec_monotone else {}) for f, fm in families.items()},
    }
    return KernelBundle(families, meta), tables, pd.concat(val_parts)


def evaluate(bundle: KernelBundle, rows: pd.DataFrame, specs: dict[str, DeviceSpec]) -> pd.DataFrame:
    """Predict ``rows`` (unified table) device by device; adds pred/roofline/ape/signed_err columns."""
    from wattcast.models.kernel_predictor import predict_kernels

    parts = []
    for dev, g in rows.groupby("device", sort=False):
        p = predict_kernels(g, specs[dev], bundle=bundle)
        parts.append(p)
    out = pd.concat(parts) if parts else rows.assign(pred_latency_ms=[], roofline_ms=[])
    out["signed_err"] = out["pred_latency_ms"].to_numpy() / out["latency_ms"].to_numpy() - 1.0  # > 0: predicted slow
    out["ape"] = np.abs(out["signed_err"].to_numpy())
    out["ape_roofline"] = ape(out["roofline_ms"].to_numpy(), out["latency_ms"].to_numpy())
    out["report_family"] = out["op"].map(REPORT_FAMILY)
    out["inside_band"] = (out["latency_ms"] >= out["pred_low_ms"]) & (out["latency_ms"] <= out["pred_high_ms"])
    return out


def summarise(pred: pd.DataFrame, by: Iterable[str]) -> pd.DataFrame:
    g = pred.groupby(list(by))
    return pd.DataFrame(
        {
            "rows": g.size(),
            "mape_pct": g["ape"].mean() * 100,
            # signed mean (predicted / measured - 1): a model 10% slow on every row has MAPE 10 and bias +10
            "bias_pct": g["signed_err"].mean() * 100,
            "median_ape_pct": g["ape"].median() * 100,
            "roofline_mape_pct": g["ape_roofline"].mean() * 100,
            "band_coverage_pct": g["inside_band"].mean() * 100,
            "ood_pct": g["ood"].mean() * 100,
        }
    ).round(2)
