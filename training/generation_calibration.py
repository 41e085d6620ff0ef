"""What "out of distribution" means for a kernel surrogate, and how wide its band is: leave one generation out.

A GPU a user asks about is usually a generation the training data lacks. The leave-one-*device*-out test that picks
each family's model keeps a sibling of the held-out GPU in training (another A100, another V100), so its residuals
say little about a new generation, and a range check on every device descriptor flagged almost every kernel of an
H100 step as OOD (its bandwidth is above any training GPU's) with a band twice as wide, covering everything.

Here, per op family, every GPU generation of the training set (the first word of the spec's ``arch``: Pascal, Volta,
Turing, Ampere, Blackwell, CDNA, CDNA2, CDNA4, ...) leaves training in turn; the family's LightGBM recipe is fitted
on the rest and predicts it. Two things are kept in the bundle:

- ``band_log``: the 5% and 95% quantiles of log(measured / predicted) over those folds, each generation weighted
  equally: the band a prediction on a new generation carries. A fold scores only the held-out rows whose measuring
  source (NeuSight's CUDA events, Vidur's profiles, XLA's, ...) the fold's training rows still have: a source only one
  generation measured (Vidur's FP16 RMSNorm and SiLU-and-mul kernels, all on A100 and A40) would otherwise test a
  transfer from one timing method to another, which no prediction faces (the shipped model has those rows). The fold
  says how many rows it left out (``rows_new_source``);
- ``margin``: per device descriptor, how far (in the feature's own units, mostly logs) the held-out generations
  lay beyond the range of the GPUs they were predicted from. The test covered that much extrapolation, so a new
  GPU is device-OOD only beyond the training range widened by it. An H100 (bandwidth 1.6x the training maximum)
  sits inside what the Ampere fold covered (an A100 against Volta's 0.9 TB/s); a GPU far beyond every fold is
  still flagged, and its band is widened.

- ``band_log_by_class``: the same quantiles per dtype class (``tensor``: tensor-core dtypes; ``vector``: FP32), from
  the folds with at least :data:`MIN_CLASS_ROWS` rows of the class; a row carries its class's band. A new generation's
  tensor-core GEMMs and its FP32 ones are predicted by different members and miss differently.

The folds refit LightGBM only (the shipped family may be a LightGBM + MLP mean): the band is that of the recipe,
not of the exact shipped trees, and says so in the manifest (``logo.model``). For the GEMM family the floor member
and the ceiling member (``models/gemm_floor.py``) are refitted per fold as well and composed as the predictor
composes them (``training/gemm_floor.py`` ``members_log_ratio``), each held-out row against its own measuring
source's floor: until stop 32 only the roofline member was refitted, so the band described a recipe no longer used
for tensor-core GEMMs (the Blackwell fold read 38% / +32 there, 12% / -6 with the members).
"""

from __future__ import annotations

import zlib
from typing import Callable

import numpy as np
import pandas as pd

from wattcast.data.device_spec import DeviceSpec, generation_of
from wattcast.featurize.kernel_features import DEVICE_FEATURES, featurize_kernels
from wattcast.models.kernel_bundle import KernelBundle
from wattcast.training.gemm_floor import (fit_ceiling_member, fit_floor_member, mamf_ratio_any, members_log_ratio,
                                          per_vendor_sample, source_floor)

#: quantiles of the calibrated band
BAND_QUANTILES = (0.05, 0.95)
#: rows drawn per held-out generation for the pooled quantiles (every generation weighs the same)
ROWS_PER_FOLD = 4000
#: a dtype class (tensor-core, FP32) gets a band of its own from the folds with at least this many of its rows
MIN_CLASS_ROWS = 100


def calibrate_generations(train: pd.DataFrame, specs: dict[str, DeviceSpec], bundle: KernelBundle, *,
                          rounds: int = 200, max_rows: int = 40_000, seed: int = 0,
                          tick: Callable[[], None] | None = None, families=None, root=None) -> dict[str, dict]:
    """Leave-one-generation-out over ``train`` (no held-out GPU rows) for each family of ``bundle`` (or of
    ``families``). ``root``: the datasets folder whose MAMF table gives the GEMM ceiling member its ceilings.

    Returns ``{family: {"band_log": [lo, hi], "band_log_by_class": {"tensor"|"vector": [lo, hi]}, "margin":
    {feature: units}, "folds": {generation: {...}}, "model": ...}}``; families with fewer than two generations get no
    entry (their LODO band stays)."""
    from wattcast.models.kernel_surrogates import LGBMSurrogate

    X_all = featurize_kernels(train, specs)
    y_all = np.log(train["latency_ms"].to_numpy(dtype=float) / X_all["t_roof_ms"].to_numpy(dtype=float))
    gen_of = {d: generation_of(s) for d, s in specs.items()}
    gens_all = train["device"].map(gen_of).to_numpy()
    src_all = (train["source"].astype(str).to_numpy() if "source" in train else np.full(len(train), "", dtype=object))
    out: dict[str, dict] = {}
    for fam, fm in bundle.families.items():
        if families is not None and fam not in families:
            continue
        m = (X_all["family"] == fam).to_numpy() & np.isfinite(y_all)
        if m.sum() < 50 or fm.lgbm is None:
            continue
        X, y, gens, srcs = X_all[m], y_all[m], gens_all[m], src_all[m]
        # refitted as the family was fitted: monotone in the spec sheet where its manifest says so (the opt-in recipe,
        # training/kernels.py TrainConfig.spec_monotone), so the band is that of the trees it predicts with
        mono = fitted_monotone(bundle, fam)
        rows = train[m]
        # the GEMM family's floor and ceiling members (models/gemm_floor.py) are refitted per fold too: the band is
        # that of the recipe the bundle predicts with
        members = fam == "gemm" and fm.floor_lgbm is not None and bool(fm.floor_blend)
        mamf = mamf_ratio_any(root, rows, specs) if members else None
        tensor = X["is_tensor_dtype"].to_numpy() > 0.5 if "is_tensor_dtype" in X else np.zeros(len(X), dtype=bool)
        # a stream of its own per family: a family's calibration does not depend on which others run before it
        rng = np.random.default_rng([seed, zlib.crc32(fam.encode())])
        rng_class = np.random.default_rng([seed, zlib.crc32(fam.encode()), 1])  # the class bands' draws: rng's stay
        rng_members = np.random.default_rng([seed, zlib.crc32(fam.encode()), 2])  # the ceiling member's subsample
        dev_feats = [f for f in fm.support if f in DEVICE_FEATURES and f in X]
        names = pd.unique(gens)
        if len(names) < 2:
            continue
        pooled, folds = [], {}
        fold_resid: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # per fold: (residuals, tensor-class rows)
        pooled_class: dict[str, list[np.ndarray]] = {"tensor": [], "vector": []}
        margin = {f: 0.0 for f in dev_feats}
        for g in names:
            held = gens == g
            # scored: the held-out rows of a source the training rows still have (see the module docstring)
            te = held & np.isin(srcs, pd.unique(srcs[~held]))
            tr_idx = np.flatnonzero(~held)
            if len(tr_idx) < 50 or not te.any():
                continue
            if len(tr_idx) > max_rows:
                tr_idx = rng.choice(tr_idx, max_rows, replace=False)
            lg = LGBMSurrogate(fm.features, num_boost_round=rounds, params={"seed": seed},
                               spec_monotone=mono).fit(X.iloc[tr_idx], y[tr_idx])
            p = lg.predict(X[te])
            composed = _gemm_members(p, rows, X, specs, fm, tr_idx, te, mamf, rounds=rounds, seed=seed,
                                     spec_monotone=mono,
                                     ceiling_idx=per_vendor_sample(rows["device"].to_numpy(), np.flatnonzero(~held),
                                                                   specs, max_rows, rng_members)) if members else None
            p = p if composed is None else composed
            r = y[te] - p
            err = np.exp(-r) - 1.0  # predicted / measured - 1
            excess = {}
            for f in dev_feats:
                tr_v = X[f].to_numpy(dtype=float)[~held]
                te_v = X[f].to_numpy(dtype=float)[te]
                tr_v, te_v = tr_v[np.isfinite(tr_v)], te_v[np.isfinite(te_v)]
                if not len(tr_v) or not len(te_v):
                    continue
                e = float(max(tr_v.min() - te_v.min(), te_v.max() - tr_v.max(), 0.0))
                excess[f] = e
                margin[f] = max(margin[f], e)
            te_tensor = tensor[te]
            folds[str(g)] = {"rows": int(te.sum()), "rows_new_source": int((held & ~te).sum()),
                             "mape_pct": float(100 * np.abs(err).mean()),
                             "bias_pct": float(100 * err.mean()), "excess": excess,
                             **({"members": composed is not None} if members else {}),
                             "by_class": {cls: {"rows": int(sel.sum()), "mape_pct": float(100 * np.abs(err[sel]).mean()),
                                                "bias_pct": float(100 * err[sel].mean())}
                                          for cls, sel in (("tensor", te_tensor), ("vector", ~te_tensor)) if sel.any()}}
            fold_resid[str(g)] = (r, te_tensor)
            pooled.append(_equal_weight(r, rng))
            for cls, sel in (("tensor", te_tensor), ("vector", ~te_tensor)):
                if sel.sum() >= MIN_CLASS_ROWS:
                    pooled_class[cls].append(_equal_weight(r[sel], rng_class))
            if tick:
                tick()
        if len(folds) < 2:
            continue
        resid = np.concatenate(pooled)
        band_all = _band(resid)
        band_cls = {cls: _band(np.concatenate(v)) for cls, v in pooled_class.items() if len(v) >= 2}
        _fold_coverage(folds, fold_resid, band_all, band_cls)
        by_class = {}
        for cls, sel in (("tensor", tensor), ("vector", ~tensor)):
            if sel.any():
                by_class[cls] = {f: [float(np.nanmin(X[f].to_numpy(dtype=float)[sel])),
                                     float(np.nanmax(X[f].to_numpy(dtype=float)[sel]))]
                                 for f in dev_feats if np.isfinite(X[f].to_numpy(dtype=float)[sel]).any()}
        out[fam] = {"support_by_dtype_class": by_class, "band_log": band_all,
                    # a class's own band where at least two generations measured it (tensor-core GEMMs of a new
                    # generation and FP32 ones are predicted by different members and miss differently)
                    "band_log_by_class": band_cls,
                    "margin": margin, "folds": folds,
                    "model": f"LightGBM refit per fold ({rounds} rounds, at most {max_rows:,} rows), the family's features"
                             + ("; the floor and ceiling members refitted with it" if members else "")}
    return out


def fitted_monotone(bundle: KernelBundle, family: str) -> bool:
    """Whether ``family`` of ``bundle`` was fitted monotone in the spec sheet: its manifest ``spec_monotone`` record
    (training/kernels.py ``train_bundle``) lists a direction; bundles before stop 58 have no record (free trees)."""
    return bool((bundle.meta.get("spec_monotone") or {}).get(family))


def _fold_coverage(folds: dict, fold_resid: dict, band_all: list[float], band_cls: dict) -> None:
    """Into each fold's entry: ``coverage_pct``, the share of its held-out rows whose log(measured / predicted) lies
    inside the band a row of its class carries (``band_log_by_class``'s where the class has one, else ``band_log``:
    ``FamilyModel.band_log_rows``), and ``band_width_log`` (the mean high - low of those bands); ``by_class`` the same
    per dtype class. Pooled with every generation weighing the same, 90% by construction; per fold it says which
    generations the band under- or over-covers (issue 14: the band's coverage on the leave-one-generation-out test,
    never recorded until stop 58)."""
    for g, (r, tensor) in fold_resid.items():
        lo = np.full(len(r), band_all[0])
        hi = np.full(len(r), band_all[1])
        for cls, sel in (("tensor", tensor), ("vector", ~tensor)):
            if cls in band_cls:
                lo[sel], hi[sel] = band_cls[cls]
        inside = (r >= lo) & (r <= hi)
        folds[g]["coverage_pct"] = float(100 * inside.mean())
        folds[g]["band_width_log"] = float((hi - lo).mean())
        for cls, sel in (("tensor", tensor), ("vector", ~tensor)):
            if sel.any() and cls in folds[g].get("by_class", {}):
                folds[g]["by_class"][cls]["coverage_pct"] = float(100 * inside[sel].mean())


def _band(resid: np.ndarray) -> list[float]:
    """The :data:`BAND_QUANTILES` of pooled log(measured / predicted) residuals."""
    return [float(np.quantile(resid, BAND_QUANTILES[0])), float(np.quantile(resid, BAND_QUANTILES[1]))]


def _equal_weight(r: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """:data:`ROWS_PER_FOLD` of a fold's residuals (drawn without replacement, or resampled up from a small fold):
    every generation weighs the same in the pooled quantiles."""
    return rng.choice(r, ROWS_PER_FOLD, replace=len(r) < ROWS_PER_FOLD)


def _gemm_members(p_roof: np.ndarray, rows: pd.DataFrame, X: pd.DataFrame, specs: dict[str, DeviceSpec], fm,
                  tr_idx: np.ndarray, te: np.ndarray, mamf: np.ndarray, *, rounds: int, seed: int,
                  ceiling_idx: np.ndarray | None = None, spec_monotone: bool = False) -> np.ndarray | None:
    """The GEMM family's prediction for a fold's held-out rows ``te`` with the floor member and (where the bundle has
    one) the ceiling member refitted on the fold's training rows ``tr_idx`` (training/gemm_floor.py); each row scored
    against its own measuring source's floor (the source the fold's training rows also have). ``ceiling_idx``: the
    rows the ceiling member is fitted on (as in training, each vendor's cut separately, so a vendor with few rows keeps
    them all; default ``tr_idx``). None where the fold leaves no row of the source the floor member predicts with (the
    fold then scores the roofline member, and its ``members`` says False)."""
    tr_rows, tr_X = rows.iloc[tr_idx], X.iloc[tr_idx]
    try:
        floor_lg, blend = fit_floor_member(tr_rows, tr_X, specs, fm.features, rounds=rounds, seed=seed,
                                           mamf=mamf[tr_idx], spec_monotone=spec_monotone)
    except ValueError:  # the fold's training rows lack the source predictions take the floor of: the roofline member
        return None
    cms, entry = {}, None
    if fm.ceiling_lgbm:
        try:
            c_idx = tr_idx if ceiling_idx is None else ceiling_idx
            cms, entry = fit_ceiling_member(rows.iloc[c_idx], X.iloc[c_idx], specs, fm.features, blend["floors_ms"],
                                            mamf[c_idx], rounds=rounds, seed=seed, spec_monotone=spec_monotone)
        except ValueError:  # no vendor left with enough tensor-core rows: the roofline member, as predictions do
            cms, entry = {}, None
    own_floor = source_floor(rows["source"].to_numpy()[te], blend["floors_ms"])
    return members_log_ratio(p_roof, X[te], rows[te], specs, floor_lg, blend, cms, entry, mamf[te],
                             ceiling_floor_ms=own_floor, blend_floor_ms=own_floor)


def calibration_table(cal: dict[str, dict]) -> pd.DataFrame:
    """One row per (family, held-out generation): rows, MAPE and signed bias of the fold, and the band; where the
    family has a band per dtype class, the fold's tensor-core rows' figures and the tensor-core band too."""
    rows = []
    pct = lambda v: 100 * (np.exp(v) - 1)  # noqa: E731 (a log band end as measured relative to predicted, in %)
    for fam, c in cal.items():
        tensor_band = (c.get("band_log_by_class") or {}).get("tensor")
        for g, f in c["folds"].items():
            r = {"family": fam, "generation": g, "rows": f["rows"], "rows_new_source": f.get("rows_new_source", 0),
                 "mape_pct": f["mape_pct"], "bias_pct": f["bias_pct"],
                 # the share of the fold's held-out rows inside their band (NaN: calibrated before stop 58)
                 "coverage_pct": f.get("coverage_pct", np.nan),
                 "band_low_pct": pct(c["band_log"][0]), "band_high_pct": pct(c["band_log"][1])}
            if tensor_band:
                t = (f.get("by_class") or {}).get("tensor", {})
                r.update({"tensor_rows": t.get("rows", 0), "tensor_mape_pct": t.get("mape_pct", np.nan),
                          "tensor_bias_pct": t.get("bias_pct", np.nan), "tensor_band_low_pct": pct(tensor_band[0]),
                          "tensor_band_high_pct": pct(tensor_band[1])})
            rows.append(r)
    return pd.DataFrame(rows)


def attach_calibration(bundle: KernelBundle, cal: dict[str, dict]) -> KernelBundle:
    """``bundle`` with each calibrated family's ``logo`` set (the support check and band then use it)."""
    from dataclasses import replace

    fams = {f: (replace(fm, logo=cal[f]) if f in cal else fm) for f, fm in bundle.families.items()}
    return KernelBundle(fams, dict(bundle.meta, generation_calibration=_calibration_meta(cal)))


def _calibration_meta(cal: dict[str, dict]) -> dict:
    """What the manifest says of a calibration as a whole."""
    return {"band_quantiles": list(BAND_QUANTILES), "families": sorted(cal)}


def calibrate_folder(folder, data=None, holdout: tuple[str, ...] = ("L4", "A100-PCIe-80GB"), *, families=None,
                     xla_tables=None, **kw) -> pd.DataFrame:
    """Calibrate the bundle in ``folder`` (its live version) on the shared training rows and write the result into its
    manifest (one atomic replace; the model files and their hashes are untouched). Returns the per-fold table.

    ``families``: only these (the others' calibration stays as it is). ``xla_tables``: the extra XLA GEMM tables the
    bundle was trained with (default: ``WATTCAST_XLA_TABLE``'s); recalibrating the GEMM family of a bundle whose
    manifest names such tables without them is refused (its folds would lose those GPUs' rows)."""
    import json
    import os
    from pathlib import Path

    from wattcast.data.catalog import resolve_device
    from wattcast.data.kernel_datasets import load_kernels, split_heldout
    from wattcast.models.kernel_bundle import MANIFEST, resolve_bundle_folder

    live = resolve_bundle_folder(Path(folder))
    bundle = KernelBundle.load(live)
    names = list(bundle.families) if families is None else list(families)
    unknown = sorted(set(names) - set(bundle.families))
    if unknown:
        raise ValueError(f"no family {unknown} in the bundle at {live}; it has {', '.join(bundle.families)}")
    shared = load_kernels(data, xla_tables=xla_tables)
    needed = list(bundle.meta.get("xla_tables") or [])
    got = [Path(p).name for p in (shared.attrs.get("xla_tables") or [])]
    if "gemm" in names and sorted(needed) != sorted(got):
        raise ValueError(f"the bundle at {live} was trained with the extra XLA table(s) {needed or 'none'} and this "
                         f"calibration has {got or 'none'}: give the same (--xla-table), or leave the GEMM family out "
                         "(--family NAME for the others)")
    train, _ = split_heldout(shared, holdout=holdout)
    train = train[train["device"].isin(bundle.train_devices)] if bundle.train_devices else train
    specs = {d: resolve_device(d) for d in train["device"].unique()}
    cal = calibrate_generations(train, specs, bundle, families=names, root=data, **kw)
    path = live / MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    for fam, c in cal.items():
        manifest["families"][fam]["logo"] = c
    kept = {f: e["logo"] for f, e in manifest["families"].items() if e.get("logo") and f not in cal}
    manifest["generation_calibration"] = _calibration_meta({**kept, **cal})
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
    return calibration_table(cal)


def folder_calibration_table(folder) -> pd.DataFrame:
    """The calibration a bundle folder's manifest holds, as :func:`calibration_table` prints it."""
    from pathlib import Path

    from wattcast.models.kernel_bundle import KernelBundle, resolve_bundle_folder

    b = KernelBundle.load(resolve_bundle_folder(Path(folder)))
    return calibration_table({f: fm.logo for f, fm in b.families.items() if fm.logo})


def main(argv=None) -> None:
    """python -m wattcast.training.generation_calibration [FOLDER] [--show] [--family NAME ...] [--xla-table FILE ...]
    [--mlruns DIR | --no-mlflow]: recalibrate a bundle folder in place (default: the shipped one; ``--family``: only
    those families; ``--xla-table``: the extra XLA GEMM tables it was trained with), or ``--show`` what its manifest
    holds; log it to MLflow (experiment ``kernel-generation-calibration``)."""
    import argparse

    from wattcast.models.kernel_bundle import shipped_folder

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("folder", nargs="?", default=None)
    ap.add_argument("--show", action="store_true", help="print (and log) the manifest's calibration, do not recompute")
    ap.add_argument("--family", action="append", default=None, help="recalibrate only this family (repeatable)")
    ap.add_argument("--xla-table", action="append", default=None, help="an extra XLA GEMM table the bundle was trained "
                    "with (repeatable; default: $WATTCAST_XLA_TABLE)")
    ap.add_argument("--mlruns", default="mlruns")
    ap.add_argument("--no-mlflow", action="store_true")
    a = ap.parse_args(argv)
    folder = a.folder or shipped_folder()
    t = folder_calibration_table(folder) if a.show else calibrate_folder(folder, families=a.family,
                                                                           xla_tables=a.xla_table)
    pd.set_option("display.width", 200)
    print(t.round(2).to_string(index=False))
    if not a.no_mlflow and len(t):
        from wattcast.training.tracking import log_run

        metrics = {f"logo_{r.family}_{r.generation}_{m}": float(getattr(r, m)) for r in t.itertuples()
                   for m in ("mape_pct", "bias_pct", "coverage_pct") if np.isfinite(float(getattr(r, m)))}
        metrics.update({f"band_{fam}_{end}_pct": float(g[f"band_{end}_pct"].iloc[0])
                        for fam, g in t.groupby("family") for end in ("low", "high")})
        if "tensor_band_low_pct" in t:
            metrics.update({f"band_{fam}_tensor_{end}_pct": float(g[f"tensor_band_{end}_pct"].iloc[0])
                            for fam, g in t.dropna(subset=["tensor_band_low_pct"]).groupby("family")
                            for end in ("low", "high")})
        run_id = log_run(a.mlruns, experiment="kernel-generation-calibration",
                         params={"folder": str(folder), "recomputed": str(not a.show)}, metrics=metrics,
                         tags={"kind": "generation-calibration"}, tables={"generation_calibration": t})
        print(f"MLflow run {run_id} (experiment kernel-generation-calibration)")


if __name__ == "__main__":
    main()
