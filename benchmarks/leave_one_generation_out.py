#!/usr/bin/env python3
"""Tensor-core GEMMs on a GPU generation the model never saw: leave one generation out, on visible data only.

    python3 benchmarks/leave_one_generation_out.py [--data PATH] [--fp32-sample 0.25] [--xla-table FILE ...]
        [--models bundle,bundle/floor,...] [--spec-monotone] [--mlruns DIR | --no-mlflow]

Folds (every device of the generation leaves training together):
- Blackwell: train without B200, predict B200 (XLA's table: bf16, fp8, tf32);
- Ampere: train without every Ampere GPU (the A100s: SXM4-80GB Vidur profiles, LLMCompass's A100, NeuSight's
  A100-PCIe-40GB FP32; and the A40, Vidur's other GPU), predict their FP16 Vidur and LLMCompass GEMMs. Until stop 53
  the A40 (Ampere, GA102) stayed in training, so the fold kept a sibling of the same generation measured by the same
  source, unlike the shipped band's folds (training/generation_calibration.py: the spec's ``arch``). Vidur then has no
  training row left: its held-out rows are predicted with the predictor's own floor (``PREDICT_SOURCE``), as any GPU
  a user asks about is;
- CDNA: train without MI100/MI210/MI300X/MI355X, predict MI210 (LLMCompass FP16), MI355X (XLA: bf16, fp16, fp8) and,
  with an extra XLA table, MI300X;
There is no Hopper fold: the shared datasets withhold the Hopper generation, and an extra table's H100 rows are left
out (``data.kernel_datasets.WITHHELD_DEVICES``).
The project's held-out GPUs (L4, A100 80GB PCIe) are never in training.

Five models per fold, all LightGBM on log(measured / roofline) like the shipped GEMM family:
- ``bundle``: the shipped GEMM family's features (shape, roofline, wave/tile and every device descriptor);
- ``bundle+source``: the same plus the measuring source (XLA's CUPTI kernel time, Vidur's per-layer profiles,
  LLMCompass, DeepBench, NeuSight's CUDA events) as a per-source term, predicted with the source of the rows it is
  compared against;
- ``bundle/ceiling``: the bundle's features, the target taken relative to the device's matmul ceiling (the MAMF
  table's best achievable over dense peak where it lists the device and dtype, :data:`DEFAULT_CEILING` for other
  tensor dtypes, 1 for FP32): the trees learn efficiency relative to what the device can reach; ``bundle+mamf``: the
  bundle's features plus that ratio as a feature (NaN where MAMF does not list the device), the target unchanged;
- ``bundle/floor``: the bundle's features, the target relative to the roofline plus the measuring source's floor
  (the physical fit's per-source floor, training generations only), predicted with the compared rows' source;
  ``bundle/additive``: the same floor added, not multiplied (``t = floor + ratio x roofline``, the trees learning the
  ratio of what a kernel takes beyond its source's floor); ``bundle/additive-vendor``: the floor per source *and
  vendor* (XLA's CUPTI times on CUDA and on ROCm are fitted apart; a pair the training generations lack takes the
  source's floor on the other vendor); ``bundle/additive-vendor/ceiling``: that, with the roofline divided by the
  device's matmul ceiling (as in ``bundle/ceiling``);
- ``bundle+floor-blend/ceiling-member``: the shipped GEMM family's recipe since stop 31 (``models/gemm_floor.py``):
  ``bundle+floor-blend`` with the ceiling member (``training/gemm_floor.py`` ``fit_ceiling_member``: per vendor,
  the source floor added, efficiency relative to the device's matmul ceiling, MAMF's or the device's own 99th
  percentile) in the roofline member's place for tensor-core rows, the vendor's member or (since stop 32, the CDNA
  fold) the pooled one fitted on every training vendor's rows; a held-out device takes MAMF's ceiling where the table
  lists it, else its vendor's median (``vendor_ceilings``: over the vendor's training devices with matrix units,
  each once), else the default; ``.../no-op-name``: the same with the ceiling member not
  reading ``is_linear`` (measured at stop 32, not adopted: the retrained family validated worse in distribution);
- ``bundle+floor-blend``: the GEMM family's recipe until stop 30: ``bundle`` and
  ``bundle/floor`` blended in log space by size (``bundle/floor`` alone below 0.5 GFLOP, ``bundle`` alone from 2 GFLOP,
  log-linear between), tensor-core rows only (all the folds predict), each with its own source's floor;
- ``normalised``: features that describe the kernel relative to its device only (intensity over the ridge point,
  wave quantisation and waves per SM for plausible tiles, tiles per SM, K depth, working set over L2, dtype), the
  power derating (W per peak TFLOP/s, base over boost clock), vendor, the MAMF ceiling (NaN where absent) and the
  source; ``normalised/ceiling`` with the ceiling-relative target.
- ``bundle/vendor-split/additive/ceiling`` (stop 31): ``bundle/additive`` with the roofline divided by the matmul
  ceiling, fitted on the held-out device's vendor's rows alone where training has that vendor's tensor-core GEMMs
  (the trees otherwise place a new NVIDIA part next to the AMD part of like peak and bandwidth: every descriptor of
  B200 sits nearest MI355X); ``.../observed-ceiling``: the same with a training device that MAMF does not list
  taking the 99th percentile of its own measured efficiency as its ceiling (A40 0.83, V100 0.94 where the default
  says 0.74); ``bundle+floor-blend/vendor-split``: the shipped recipe on the vendor's rows alone.
- ``physical``: the spec-sheet tile/wave model of ``training/gemm_floor.py`` (floor per source and cycles per tile fitted on the training
  generations; ceiling from MAMF or the default); ``physical+trees`` / ``physical+normalised``: LightGBM on what it
  leaves, with the bundle's or the normalised features. ``--models`` picks a subset.

Per held-out device and dtype: rows, MAPE and signed mean error for GEMMs >= 1 GFLOP and smaller ones. Goal (kernels
issue): >= 1 GFLOP within 10% MAPE and |bias| <= 5% on every held-out generation; small GEMMs within 20%.
NeuSight's FP32 rows are subsampled (``--fp32-sample``) to keep the six fits to minutes; said in the output.

fp8 format combinations (a diagnostic, shipped recipe only): a device's fp8 cells are one XLA (lhs, rhs, out)
combination (``data.kernel_datasets.XLA_DTYPES``: e4m3 x e4m3 -> bf16, the fnuz variants on gfx942), i.e. on ROCm
XLA's same-format kernel path. The fold's model (trained exactly as above, never on these rows) also predicts every
other fp8 combination of a held-out device the tables carry (``load_xla_fp8_combinations``); the script prints MAPE
and signed bias >= 1 GFLOP per combination, its best measured TFLOPS over the dense FP8 peak, and how many of its rows
measure above that peak (physically impossible; nothing is dropped). Measured (wheel table, shipped recipe): MI355X
same-format e4m3 x e4m3 -> bf16 best 1,938 TFLOPS = 0.39 of 5,033 (31.3 / -26.6); the mixed e4m3 x e5m2 and e5m2 x
e4m3 -> bf16 reach 0.90 and 1.04 (one reading above peak) but only at the few largest shapes (median 0.09 of peak,
as same-format), and read 31.6 / -17.9 and 31.8 / -17.2: the same-format cap explains the >= 64 GFLOP bucket (-45%
vs -30 / -16%), not the cell's bias (16-64 GFLOP is -46% in every combination). MI300X's combinations all peak at
0.69-0.73 (mixed fnuz -> fp8 e4m3 out 0.47-0.52) and read -14 to -20% (those two -48%); B200's three are equal
(0.73; 14.7 / -8.1 to -8.3). Those figures are from before stop 47's GEMM refit. Re-measured at stop 59 (shared tables,
no --xla-table, so no MI300X; ``--models bundle+floor-blend/ceiling-member --no-mlflow``): MI355X same-format
e4m3 x e4m3 -> bf16 30.7 / -24.3 (best 0.39 of peak), the mixed ones -> bf16 31.8 / -15.4 and 31.9 / -14.8; B200's
three 12.4-12.7 / -3.4 to -3.5 (0.73).

By roofline side (:func:`bound_table`, shipped recipe, GEMMs >= 1 GFLOP; stop 51, issue 14). The spec figures are the
datasheets' (MI300X 1,307 / 2,615 dense BF16 / FP8 at 2,100 MHz, MI355X 2,517 / 5,033 at 2,400 MHz, MI210 181 at
1,700 MHz, B200 2,250 / 4,500 / 1,125) and the sustained clock under the power cap is in MAMF's ceilings where it lists
the part (MI300X bf16 0.511, MI355X 0.622, B200 0.776 / fp8 0.763); what misses is not a peak:
- memory-bound GEMMs (skinny outputs): XLA's AMD kernels reach a third of the datasheet bandwidth at 64-256 MB working
  sets (MI300X 1.4-1.7 of 5.3 TB/s, MI355X 2.3-2.9 of 8.0; LLMCompass's MI210 0.55 of 1.64), B200 two thirds (4.4-5.3
  of 7.7), the A100's LLMCompass rows four fifths: a kernel library's property, learnt from NVIDIA rows when every
  AMD part is held out (MI355X -24 to -36% there, B200 bf16 +38 to +41%);
- the ceiling member divides the whole roofline by the matmul ceiling, the DRAM time too. Dividing only the compute
  time (``max(t_compute / ceiling, t_mem)``, measured as a counterfactual) takes B200 bf16 from 12.9 / +5.4 to
  9.8 / -3.0 and tf32 to 12.5 / -3.2, but fp8 to 12.4 / -8.8 and every CDNA cell 2-10 points further negative
  (MI355X bf16 -10.4 -> -16.6): the low ceilings of the AMD parts had been standing in for their kernels' low
  bandwidth, so it is not adopted;
- CDNA compute-bound GEMMs of 16-64 GFLOP reach less of the ceiling than NVIDIA's (MI355X 0.30 of peak where the
  pooled member says 0.39; MI300X 0.32 vs 0.34; at >= 64 GFLOP 0.49 vs 0.54 and 0.41 vs 0.42): 256-304 CUs to fill,
  beyond every training GPU's SM count;
- fp8 on CDNA takes the default ceiling 0.74 (MAMF lists no MI300X or MI355X fp8): MI300X's XLA fp8 reaches 0.72 of
  its FNUZ peak (so the default is right there; its -15% is in 1-4 GFLOP memory-bound rows at 0.05 of peak vs 0.09
  predicted), MI355X's same-format OCP path 0.39 (-44 to -50% compute-bound, as above);
- MI210 (not in MAMF: default 0.74, measured plateau 0.665): >= 64 GFLOP within -4%; the bias is six skinny or
  short-contraction rows of 1-64 GFLOP at -32 to -43% (0.55 TB/s of 1.64);
- A100: Vidur's and LLMCompass's A100 disagree on the same chip (Vidur's best 0.80 of peak, LLMCompass's 0.94, MAMF's
  0.869), so the fold's split between them is the sources', not a device term (-7 / +5 when written; Vidur -2.8,
  LLMCompass +8.3 since stop 53's Ampere fold, re-measured at stop 59).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from wattcast.data.catalog import resolve_device
from wattcast.data.kernel_datasets import COLUMNS, load_kernels, load_xla_fp8_combinations, read_xla_tables
from wattcast.featurize.kernel_features import featurize_kernels
from wattcast.models.gemm_floor import FLOOR_BLEND_GFLOP, PREDICT_SOURCE, blend_weight, blended_log_ratio
from wattcast.training.gemm_floor import (ceiling_from_ratio, fit_ceiling_member, fit_physical, floor_reference_ms,
                                          mamf_ratio, members_log_ratio, physical_inputs, physical_us)
from wattcast.training.kernels import TrainConfig, family_features

# The spec-sheet tile/wave GEMM model ("physical" rows) and its per-source floor fit live in training/gemm_floor.py
# (the shipped GEMM family's floor member is fitted with them; the formula and what it found are documented there).

HELD_OUT = ("L4", "A100-PCIe-80GB")
FOLDS = {
    "Blackwell (B200)": ("B200",),
    "Ampere (A100, A40)": ("A100-SXM4-80GB", "A100-80GB-unknown", "A100-PCIe-40GB", "A40"),
    "CDNA (MI100/MI210/MI300X/MI355X)": ("MI100", "MI210", "MI300X", "MI355X"),
}
SOURCES = ("xla", "vidur", "llmcompass", "deepbench", "neusight/kernels", "neusight/kernels_test")
NORMALISED = ("log_intensity_over_ridge", "log_ws_over_l2", "dtype_bytes", "is_tensor_dtype", "is_linear",
              "wave_eff_32x32", "wave_eff_64x64", "wave_eff_128x64", "wave_eff_128x128", "wave_eff_256x128",
              "log_waves_32x32", "log_waves_64x64", "log_waves_128x64", "log_waves_128x128", "log_waves_256x128",
              "log_tiles_128x128_per_sm", "log_k_iters_per_tile", "log_M_over_K", "log_N_over_MK",
              "log_t_roof_ms", "dev_log_w_per_tflop", "dev_base_over_boost", "dev_is_amd")


#: the shipped GEMM family's recipe: its cells are logged as MLflow metrics (every variant's are in the ``logo`` table)
SHIPPED_MODEL = "bundle+floor-blend/ceiling-member"


def model_key(model: str) -> str:
    """A variant's name as an MLflow metric key part."""
    return model.replace("+", "_plus_").replace("/", "_over_")


def metric_key(r, k: str) -> str:
    """The MLflow metric key of one error-table row's ``k`` (``mape_pct`` / ``bias_pct``)."""
    return (f"{model_key(r.model)}_{r.device}_{r.dtype}_{r.source.replace('/', '_')}_"
            f"{'big' if r.size.startswith('>=') else 'small'}_{k}")


def fp8_metric_key(r, k: str) -> str:
    """The MLflow metric key of one :func:`fp8_combination_table` row's ``k``: :func:`metric_key`'s naming with the
    (lhs, rhs, out) combination after ``fp8`` (``..._MI355X_fp8_f8e4m3fn_f8e5m2_bf16_xla_big_mape_pct``)."""
    return f"{model_key(r.model)}_{r.device}_fp8_{r.lhs}_{r.rhs}_{r.out}_xla_big_{k}"


def gemm_rows(root, fp32_sample: float, seed: int = 0, xla_read=None) -> pd.DataFrame:
    """The GEMM rows (``bmm``, ``linear``) of every source but the held-out GPUs', fp32 ones sampled at
    ``fp32_sample``; ``xla_read``: the XLA tables as ``read_xla_tables`` read them (default: read now)."""
    df = load_kernels(root, xla_read=xla_read)
    if df.attrs.get("xla_tables"):
        print("extra XLA tables:", ", ".join(df.attrs["xla_tables"]))
    df = df[df["op"].isin(["bmm", "linear"]) & ~df["device"].isin(HELD_OUT)]
    fp32 = df["dtype"] == "fp32"
    keep = ~fp32 | (np.random.default_rng(seed).random(len(df)) < fp32_sample)
    return df[keep].reset_index(drop=True)


def features(df: pd.DataFrame, root) -> tuple[pd.DataFrame, np.ndarray, dict]:
    specs = {d: resolve_device(d if d != "A100-80GB-unknown" else "A100-SXM4-80GB") for d in df["device"].unique()}
    X = featurize_kernels(df, specs)
    y = np.log(df["latency_ms"].to_numpy(dtype=float) / X["t_roof_ms"].to_numpy())
    X["mamf_ratio"] = mamf_ratio(root, df["device"], df["dtype"], specs)
    for s in SOURCES:
        X[f"src_{s}"] = (df["source"].to_numpy() == s).astype(float)
    return X, y, specs


def additive_vendor_ms(df: pd.DataFrame, X: pd.DataFrame, specs: dict, inp: dict, train: np.ndarray,
                       test: np.ndarray, feats: list, cfg: TrainConfig, ceiling: bool = False) -> np.ndarray:
    """``t = floor(source, vendor) + ratio x roofline`` (``/ ceiling`` with ``ceiling``) for the ``test`` rows: the
    floors from the physical fit (``inp``: :func:`physical_inputs` of ``df``) with the source keyed by vendor (training
    rows only), the ratio by the trees."""
    vendor = np.array([specs[d].vendor for d in df["device"]])
    inp = dict(inp, source=np.array([f"{s}@{v}" for s, v in zip(df["source"].to_numpy(), vendor)], dtype=object))
    ceil = inp["ceiling"]
    y_us = df["latency_ms"].to_numpy(dtype=float) * 1e3
    floors = fit_physical(inp, y_us, train)[0]
    by_source: dict = {}
    for key, v in floors.items():
        by_source.setdefault(key.split("@")[0], []).append(v)
    # a source the fold never saw: the predictor's (PREDICT_SOURCE's) floor, as fold_floors_ms gives the other models
    fallback = float(np.mean(by_source[PREDICT_SOURCE])) if PREDICT_SOURCE in by_source else float(np.median(list(floors.values())))
    floor_ms = np.array([floors.get(k, np.mean(by_source.get(k.split("@")[0], [fallback]))) for k in inp["source"]]) / 1e3
    ref = X["t_roof_ms"].to_numpy() / (ceil if ceiling else 1.0)
    lat = df["latency_ms"].to_numpy(dtype=float)
    ya = np.log(np.maximum(lat - floor_ms, 0.25 * ref) / ref)
    return floor_ms[test] + np.exp(fit_predict(X[train], ya[train], X[test], feats, cfg)) * ref[test]


def vendor_train(train: np.ndarray, vendor: np.ndarray, tensor: np.ndarray, held_vendor: str,
                 min_rows: int = 1000) -> np.ndarray:
    """The training rows of ``held_vendor`` alone when training keeps at least ``min_rows`` of its tensor-core GEMMs,
    else every training row (the CDNA fold leaves no AMD part to learn from)."""
    same = train & (vendor == held_vendor)
    return same if (same & tensor).sum() >= min_rows else train


def observed_ceiling(df: pd.DataFrame, X: pd.DataFrame, train: np.ndarray, quantile: float = 0.99) -> np.ndarray:
    """The matmul ceiling per row: MAMF's where it lists the device and dtype, else a *training* device's own
    ``quantile`` of measured efficiency (roofline time over measured) in that dtype, else :func:`ceiling_from_ratio`'s
    default. A held-out device never contributes its own measurements."""
    eff = X["t_roof_ms"].to_numpy() / df["latency_ms"].to_numpy(dtype=float)
    tensor = (df["dtype"] != "fp32").to_numpy()
    q = (pd.DataFrame({"device": df["device"].to_numpy(), "dtype": df["dtype"].to_numpy(), "eff": eff})[train & tensor]
         .groupby(["device", "dtype"])["eff"].quantile(quantile))
    mamf = X["mamf_ratio"].to_numpy()
    ratio = np.array([m if np.isfinite(m) else q.get(k, np.nan)
                      for m, k in zip(mamf, zip(df["device"].to_numpy(), df["dtype"].to_numpy()))], dtype=float)
    return ceiling_from_ratio(ratio, df["dtype"].to_numpy())


def fold_floors_ms(fitted_ms: dict[str, float], sources) -> dict[str, float]:
    """Each measuring source's floor in a fold: the fitted one (training generations only), and for a source no
    training row of the fold measured (Vidur's only GPUs are Ampere's A100 and A40) the floor the predictor uses for
    every row (``PREDICT_SOURCE``'s: a kernel's GPU time, as a training step's kernels take), not the other sources'
    median (31.8 us, NeuSight's CUDA-event floors, against Vidur's own 3.7 us): the timing method of a source the fold
    never saw is the product's, as for any GPU a user asks about."""
    if PREDICT_SOURCE not in fitted_ms:
        raise ValueError(f"the fold's training rows have no {PREDICT_SOURCE!r} (the predictor's source) floor to give "
                         f"an unseen source (fitted: {sorted(fitted_ms)})")
    out = dict(fitted_ms)
    out.update({s: fitted_ms[PREDICT_SOURCE] for s in set(map(str, sources)) - set(fitted_ms)})
    return out


def gemm_gflop(df: pd.DataFrame) -> np.ndarray:
    """Each GEMM row's GFLOP (2 B M N K / 1e9; B = 1 where absent)."""
    return 2.0 * df["B"].fillna(1).to_numpy() * df["M"].to_numpy() * df["N"].to_numpy() * df["K"].to_numpy() / 1e9


class Fitted:
    """LightGBM fitted on ``Xtr[feats]``; ``predict(X)`` reads the same columns of ``X``."""

    def __init__(self, Xtr, ytr, feats, cfg: TrainConfig):
        import lightgbm as lgb

        self.feats = list(feats)
        self.model = lgb.LGBMRegressor(n_estimators=cfg.lgbm_rounds, num_leaves=63, learning_rate=0.05,
                                       min_child_samples=20, subsample=0.8, subsample_freq=1, colsample_bytree=0.8,
                                       verbose=-1, n_jobs=2, random_state=0, deterministic=True,
                                       force_col_wise=True).fit(Xtr[self.feats], ytr)

    def predict(self, X) -> np.ndarray:
        return self.model.predict(X[self.feats])


def fit_predict(Xtr, ytr, Xte, feats, cfg: TrainConfig) -> np.ndarray:
    return Fitted(Xtr, ytr, feats, cfg).predict(Xte)


def error_table(df: pd.DataFrame, pred_ms: np.ndarray, fold: str, model: str) -> pd.DataFrame:
    err = 100 * (pred_ms - df["latency_ms"].to_numpy()) / df["latency_ms"].to_numpy()
    gflop = gemm_gflop(df)
    t = pd.DataFrame({"fold": fold, "model": model, "device": df["device"].to_numpy(), "dtype": df["dtype"].to_numpy(),
                      "source": df["source"].to_numpy(), "size": np.where(gflop >= 1.0, ">= 1 GFLOP", "< 1 GFLOP"),
                      "err": err})
    g = t.groupby(["fold", "model", "device", "source", "dtype", "size"])["err"]
    return pd.DataFrame({"rows": g.size(), "mape_pct": g.apply(lambda e: e.abs().mean()),
                         "bias_pct": g.mean()}).reset_index()


#: GFLOP edges of the size buckets of :func:`size_table` (the shipped recipe's error by GEMM size)
SIZE_EDGES_GFLOP = (0.0, 1.0, 4.0, 16.0, 64.0, np.inf)


def size_table(df: pd.DataFrame, pred_ms: np.ndarray, fold: str, model: str) -> pd.DataFrame:
    """MAPE and signed bias per GEMM size bucket (GFLOP), device and dtype: where a fold's error sits. A bias that
    changes sign with size says a term of the model is wrong, which one mean over all sizes cannot show."""
    err = 100 * (pred_ms - df["latency_ms"].to_numpy()) / df["latency_ms"].to_numpy()
    gflop = gemm_gflop(df)
    t = pd.DataFrame({"fold": fold, "model": model, "device": df["device"].to_numpy(), "dtype": df["dtype"].to_numpy(),
                      "gflop": pd.cut(gflop, SIZE_EDGES_GFLOP, right=False), "err": err,
                      "measured_us": df["latency_ms"].to_numpy() * 1e3})
    g = t.groupby(["fold", "model", "device", "dtype", "gflop"], observed=True)  # buckets in size order
    out = pd.DataFrame({"rows": g.size(), "mape_pct": g["err"].apply(lambda e: e.abs().mean()),
                        "bias_pct": g["err"].mean(), "median_measured_us": g["measured_us"].median()}).reset_index()
    return out.assign(gflop=out["gflop"].astype(str))


def bound_table(df: pd.DataFrame, pred_ms: np.ndarray, t_compute_ms: np.ndarray, t_mem_ms: np.ndarray, fold: str,
                model: str, min_gflop: float = 1.0) -> pd.DataFrame:
    """Per device, dtype and roofline side (``compute``: the dense-peak time exceeds the DRAM time, else ``memory``),
    rows >= ``min_gflop`` GFLOP: MAPE and signed bias of ``pred_ms``, and what the model and the measurement say the
    kernel reached as medians: the fraction of the dense peak (``t_compute_ms`` over the time) and the fraction of the
    datasheet bandwidth (``t_mem_ms`` over the time). A bias on one side alone points at that side's term (the matmul
    ceiling, or the bandwidth a GEMM reaches), which one mean over both cannot show."""
    lat = df["latency_ms"].to_numpy(dtype=float)
    pred = np.asarray(pred_ms, dtype=float)
    tc, tm = np.asarray(t_compute_ms, dtype=float), np.asarray(t_mem_ms, dtype=float)
    big = gemm_gflop(df) >= min_gflop
    t = pd.DataFrame({"device": df["device"].to_numpy(), "dtype": df["dtype"].to_numpy(),
                      "bound": np.where(tm > tc, "memory", "compute"), "err": 100 * (pred - lat) / lat,
                      "peak_frac_measured": tc / lat, "peak_frac_predicted": tc / pred,
                      "bw_frac_measured": tm / lat, "bw_frac_predicted": tm / pred})[big]
    g = t.groupby(["device", "dtype", "bound"])
    out = pd.DataFrame({"rows": g.size(), "mape_pct": g["err"].apply(lambda e: e.abs().mean()),
                        "bias_pct": g["err"].mean()})
    for c in ("peak_frac_measured", "peak_frac_predicted", "bw_frac_measured", "bw_frac_predicted"):
        out[c] = g[c].median()
    return out.reset_index().assign(fold=fold, model=model)[["fold", "model", "device", "dtype", "bound", "rows",
                                                             "mape_pct", "bias_pct", "peak_frac_measured",
                                                             "peak_frac_predicted", "bw_frac_measured",
                                                             "bw_frac_predicted"]]


def fp8_combination_table(rows: pd.DataFrame, pred_ms: np.ndarray, peak_tflops: np.ndarray, fold: str,
                          model: str, min_gflop: float = 1.0) -> pd.DataFrame:
    """Per device and XLA fp8 (lhs, rhs, out) combination: rows >= ``min_gflop`` GFLOP, their MAPE and signed mean
    error of ``pred_ms``, the combination's best measured TFLOPS (every size) over the device's dense FP8 peak
    (``peak_tflops``, per row) and how many of its rows measure above that peak (physically impossible readings).
    ``rows``: ``device``, ``lhs_dtype``, ``rhs_dtype``, ``out_dtype``, ``kept`` (the combination the fold's fp8 cell
    is made of), ``tflops``, ``latency_ms`` and the shape (``B``, ``M``, ``N``, ``K``)."""
    big = gemm_gflop(rows) >= min_gflop
    lat = rows["latency_ms"].to_numpy(dtype=float)
    err = 100 * (np.asarray(pred_ms, dtype=float) - lat) / lat
    tflops = rows["tflops"].to_numpy(dtype=float)
    peak = np.asarray(peak_tflops, dtype=float)
    t = pd.DataFrame({"device": rows["device"].to_numpy(), "lhs": rows["lhs_dtype"].to_numpy(),
                      "rhs": rows["rhs_dtype"].to_numpy(), "out": rows["out_dtype"].to_numpy(),
                      "kept": rows["kept"].to_numpy(dtype=bool), "big": big, "abs_err": np.where(big, np.abs(err), np.nan),
                      "err": np.where(big, err, np.nan), "tflops": tflops, "over_peak": tflops > peak,
                      "frac": tflops / peak})
    g = t.groupby(["device", "lhs", "rhs", "out"], sort=True)
    out = pd.DataFrame({"kept": g["kept"].any(), "rows": g["big"].sum().astype(int), "mape_pct": g["abs_err"].mean(),
                        "bias_pct": g["err"].mean(), "best_tflops": g["tflops"].max(),
                        "best_over_peak": g["frac"].max(), "rows_over_peak": g["over_peak"].sum().astype(int)})
    return out.reset_index().assign(fold=fold, model=model)[
        ["fold", "model", "device", "lhs", "rhs", "out", "kept", "rows", "mape_pct", "bias_pct", "best_tflops",
         "best_over_peak", "rows_over_peak"]]


def fp8_combination_rows(root, xla_read, devices) -> pd.DataFrame:
    """:func:`load_xla_fp8_combinations` of the XLA tables ``xla_read`` (``read_xla_tables``) on ``devices`` that
    carry more than one fp8 (lhs, rhs, out) combination."""
    c = load_xla_fp8_combinations(root, xla_read=xla_read)
    c = c[c["device"].isin(devices)]
    n = c.groupby("device")[["lhs_dtype", "rhs_dtype", "out_dtype"]].apply(lambda d: len(d.drop_duplicates()))
    return c[c["device"].isin(n[n > 1].index)].reset_index(drop=True)


def run(root=None, fp32_sample: float = 0.25, models: tuple | None = None, sizes: list | None = None,
        xla_tables=None, fp8_combos: list | None = None, bounds: list | None = None,
        spec_monotone: bool = False) -> pd.DataFrame:
    """Every fold's error table; ``sizes`` (a list), when given, receives the shipped recipe's (``bundle``)
    :func:`size_table` per fold; ``fp8_combos`` (a list), when given, the shipped recipe's
    :func:`fp8_combination_table` per fold (every XLA fp8 format combination of a held-out device predicted by the
    fold's model, which never trains on them); ``bounds`` (a list), when given, the shipped recipe's
    :func:`bound_table` per fold. A fold with no tensor-dtype rows to predict is skipped. ``spec_monotone``: the ceiling
    member fitted with the opt-in monotone recipe (training/kernels.py ``TrainConfig.spec_monotone``; this script's
    own trees, :class:`Fitted`, are free either way)."""
    xla_read = read_xla_tables(root, xla_tables)  # once: the GEMM rows and the fp8 combinations both read them
    df = gemm_rows(root, fp32_sample, xla_read=xla_read)
    X, y, specs = features(df, root)
    combos = fp8_combination_rows(root, xla_read, set(df["device"])) if fp8_combos is not None else None
    if combos is not None and len(combos):
        Xc = features(combos[list(COLUMNS)], root)[0]
    cfg = TrainConfig()
    bundle_feats = family_features("gemm")
    norm_feats = list(NORMALISED) + ["mamf_ratio"] + [f"src_{s}" for s in SOURCES]
    # the device's matmul ceiling (MAMF's best over peak; DEFAULT_CEILING for a tensor dtype it does not list,
    # 1 for FP32 vector peaks): efficiency relative to it is what the trees learn in the "ceiling" variants; it, the
    # tile/wave model's inputs and the GEMMs' sizes are the same in every fold
    ceil = ceiling_from_ratio(X["mamf_ratio"].to_numpy(), df["dtype"].to_numpy())
    log_c = np.log(ceil)
    inp = physical_inputs(df, specs, ceil)
    y_us = df["latency_ms"].to_numpy(dtype=float) * 1e3
    gflop = gemm_gflop(df)
    out = []
    for fold, devices in FOLDS.items():
        test = df["device"].isin(devices).to_numpy() & (df["dtype"] != "fp32").to_numpy()
        train = ~df["device"].isin(devices).to_numpy()
        if not test.any():
            print(f"{fold}: no tensor-dtype GEMM rows to predict (skipped)")
            continue
        src_feats = [f"src_{s}" for s in SOURCES]
        for model, feats, shift in (("bundle", bundle_feats, False), ("bundle+source", bundle_feats + src_feats, False),
                                    ("bundle/ceiling", bundle_feats, True), ("normalised", norm_feats, False),
                                    ("normalised/ceiling", norm_feats, True),
                                    ("bundle+mamf", bundle_feats + ["mamf_ratio"], False)):
            if models and model not in models:
                continue
            t0 = time.time()
            yt = y + log_c if shift else y
            p = fit_predict(X[train], yt[train], X[test], feats, cfg) - (log_c[test] if shift else 0.0)
            pred_ms = np.exp(p) * X.loc[test, "t_roof_ms"].to_numpy()
            tab = error_table(df[test], pred_ms, fold, model)
            if sizes is not None and model == "bundle":
                sizes.append(size_table(df[test], pred_ms, fold, model))
            tab["fit_s"] = time.time() - t0
            out.append(tab)
        # the spec-sheet tile/wave model (models/gemm_physics.py): its floor per source and cycles per tile fitted on
        # the training generations, the ceiling from MAMF (or the default); then trees on what it leaves
        if models and not any(m.startswith("physical") or m.startswith("bundle/additive") or "vendor-split" in m
                              or m in ("bundle/floor", "bundle+floor-blend") or "ceiling-member" in m
                              for m in models):
            continue
        t0 = time.time()
        params = fit_physical(inp, y_us, train)
        # a source the fold never saw takes the predictor's floor here too (fold_floors_ms), as in every model below
        params = (fold_floors_ms(params[0], df["source"]), *params[1:])
        phys = physical_us(inp, *params)
        print(fold, "physical params", {k: round(float(v), 2) for k, v in params[0].items()}, round(float(params[1])),
              round(float(params[2])))
        tab = error_table(df[test], phys[test] / 1e3, fold, "physical")
        tab["fit_s"] = time.time() - t0
        out.append(tab)
        # the roofline plus the measuring source's floor (the physical fit's t0 per source, training generations
        # only) as the trees' reference: at small sizes a kernel costs the floor, not a multiple of the roofline, so
        # a ratio learnt on slower GPUs does not shrink a new GPU's small GEMMs below what they can take
        # (the floor of a source the fit never saw: the predictor's, PREDICT_SOURCE's)
        floors_ms = {s: v / 1e3 for s, v in params[0].items()}
        ref_ms = floor_reference_ms(X["t_roof_ms"].to_numpy(), df["source"].to_numpy(), floors_ms)
        floor_ms = ref_ms - X["t_roof_ms"].to_numpy()
        p_floor, floor_model = None, None
        if not models or "bundle/floor" in models or "bundle+floor-blend" in models:
            t0 = time.time()
            yf = np.log(df["latency_ms"].to_numpy(dtype=float) / ref_ms)
            floor_model = Fitted(X[train], yf[train], bundle_feats, cfg)
            p_floor = floor_model.predict(X[test])
            floor_fit_s = time.time() - t0
        if not models or "bundle/floor" in models:
            tab = error_table(df[test], np.exp(p_floor) * ref_ms[test], fold, "bundle/floor")
            if sizes is not None:
                sizes.append(size_table(df[test], np.exp(p_floor) * ref_ms[test], fold, "bundle/floor"))
            tab["fit_s"] = floor_fit_s
            out.append(tab)
        # the shipped recipe (models/gemm_floor.py): the roofline member and the floor member blended by size, each
        # compared row predicted with its own source's floor
        if not models or "bundle+floor-blend" in models:
            t0 = time.time()
            p_roof = fit_predict(X[train], y[train], X[test], bundle_feats, cfg)
            roof = X["t_roof_ms"].to_numpy()[test]
            lr = blended_log_ratio(p_roof, p_floor, roof, floor_ms[test], blend_weight(gflop[test], *FLOOR_BLEND_GFLOP))
            tab = error_table(df[test], np.exp(lr) * roof, fold, "bundle+floor-blend")
            if sizes is not None:
                sizes.append(size_table(df[test], np.exp(lr) * roof, fold, "bundle+floor-blend"))
            tab["fit_s"] = time.time() - t0 + floor_fit_s
            out.append(tab)
        # the floor added, not multiplied: t = floor + ratio x roofline, the trees learning the ratio of what the
        # kernel takes beyond its source's floor (a GPU-side ratio that should not grow a faster GPU's floor)
        if not models or "bundle/additive" in models:
            t0 = time.time()
            roof = X["t_roof_ms"].to_numpy()
            lat = df["latency_ms"].to_numpy(dtype=float)
            ya = np.log(np.maximum(lat - floor_ms, 0.25 * roof) / roof)
            p = fit_predict(X[train], ya[train], X[test], bundle_feats, cfg)
            pred = floor_ms[test] + np.exp(p) * roof[test]
            tab = error_table(df[test], pred, fold, "bundle/additive")
            if sizes is not None:
                sizes.append(size_table(df[test], pred, fold, "bundle/additive"))
            tab["fit_s"] = time.time() - t0
            out.append(tab)
        for model in ("bundle/additive-vendor", "bundle/additive-vendor/ceiling"):
            if models and model not in models:
                continue
            t0 = time.time()
            pred = additive_vendor_ms(df, X, specs, inp, train, test, bundle_feats, cfg,
                                      ceiling=model.endswith("/ceiling"))
            tab = error_table(df[test], pred, fold, model)
            if sizes is not None:
                sizes.append(size_table(df[test], pred, fold, model))
            tab["fit_s"] = time.time() - t0
            out.append(tab)
        # the held-out vendor's rows alone (where training has its tensor-core GEMMs), per held-out vendor
        vendor = np.array([specs[d].vendor for d in df["device"]])
        tensor = (df["dtype"] != "fp32").to_numpy()
        lat = df["latency_ms"].to_numpy(dtype=float)
        roof_all = X["t_roof_ms"].to_numpy()
        # the shipped recipe since stop 31: the floor member blended by size with the ceiling member
        # (training/gemm_floor.py fit_ceiling_member: per vendor and pooled, additive floor, observed ceiling) in the
        # roofline member's place, composed as the predictor does (members_log_ratio); a held-out device takes MAMF's
        # ceiling where listed, else its vendor's median
        # ".../no-op-name": the ceiling member without ``is_linear`` (an NVIDIA part's tensor-core training rows are all
        # ``linear``, XLA's all ``bmm``: the flag tells the trees the source). Stop 32, not adopted: the retrained
        # family validated 7.58% vs 7.56% in distribution (MLflow af45449a; README "Leave one generation out")
        p_roof, roof_fit = None, None
        for model, c_feats in (("bundle+floor-blend/ceiling-member", bundle_feats),
                               ("bundle+floor-blend/ceiling-member/no-op-name",
                                [f for f in bundle_feats if f != "is_linear"])):
            if models and model not in models:
                continue
            t0 = time.time()
            cm, entry = fit_ceiling_member(df[train].reset_index(drop=True), X[train].reset_index(drop=True), specs,
                                           c_feats, floors_ms, X["mamf_ratio"].to_numpy()[train], rounds=cfg.lgbm_rounds,
                                           spec_monotone=spec_monotone)
            floor_model = floor_model or Fitted(X[train], np.log(lat / ref_ms)[train], bundle_feats, cfg)
            roof_fit = roof_fit or Fitted(X[train], y[train], bundle_feats, cfg)
            p_roof = roof_fit.predict(X[test]) if p_roof is None else p_roof
            blend = {"floors_ms": floors_ms, "source": PREDICT_SOURCE, "gflop": list(FLOOR_BLEND_GFLOP)}
            pred = np.full(len(df), np.nan)
            pred[test] = np.exp(members_log_ratio(p_roof, X[test], df[test], specs, floor_model, blend, cm, entry,
                                                  X["mamf_ratio"].to_numpy()[test], ceiling_floor_ms=entry["floor_ms"],
                                                  blend_floor_ms=floor_ms[test])) * roof_all[test]
            tab = error_table(df[test], pred[test], fold, model)
            if sizes is not None:
                sizes.append(size_table(df[test], pred[test], fold, model))
            tab["fit_s"] = time.time() - t0
            out.append(tab)
            if model == SHIPPED_MODEL and bounds is not None:
                bounds.append(bound_table(df[test], pred[test], X["t_compute_ms"].to_numpy()[test],
                                          X["t_mem_ms"].to_numpy()[test], fold, model))
            # every XLA fp8 format combination of the fold's held-out devices, predicted (never trained on) by the
            # same members: which fp8 kernel path the fold's fp8 cells measure
            sel = combos["device"].isin(devices).to_numpy() if combos is not None and len(combos) else None
            if model == SHIPPED_MODEL and sel is not None and sel.any():
                rc, xc = combos[sel], Xc[sel]
                roof_c = xc["t_roof_ms"].to_numpy()
                floor_c = floor_reference_ms(roof_c, rc["source"].to_numpy(), floors_ms) - roof_c
                pc = np.exp(members_log_ratio(roof_fit.predict(xc), xc, rc, specs, floor_model, blend, cm, entry,
                                              xc["mamf_ratio"].to_numpy(), ceiling_floor_ms=entry["floor_ms"],
                                              blend_floor_ms=floor_c)) * roof_c
                peak = np.array([specs[d].peak_fp8_tflops for d in rc["device"]], dtype=float)
                fp8_combos.append(fp8_combination_table(rc, pc, peak, fold, model))
        for model in ("bundle/vendor-split/additive/ceiling", "bundle/vendor-split/additive/observed-ceiling",
                      "bundle+floor-blend/vendor-split"):
            if models and model not in models:
                continue
            t0 = time.time()
            c = observed_ceiling(df, X, train) if model.endswith("observed-ceiling") else ceil
            pred = np.full(len(df), np.nan)
            for v in np.unique(vendor[test]):
                te = test & (vendor == v)
                tr = vendor_train(train, vendor, tensor, v)
                if model.startswith("bundle+floor-blend"):
                    pr = fit_predict(X[tr], y[tr], X[te], bundle_feats, cfg)
                    pf = fit_predict(X[tr], np.log(lat / ref_ms)[tr], X[te], bundle_feats, cfg)
                    lr = blended_log_ratio(pr, pf, roof_all[te], floor_ms[te], blend_weight(gflop[te], *FLOOR_BLEND_GFLOP))
                    pred[te] = np.exp(lr) * roof_all[te]
                else:
                    ref = roof_all / c
                    ya = np.log(np.maximum(lat - floor_ms, 0.25 * ref) / ref)
                    pred[te] = floor_ms[te] + np.exp(fit_predict(X[tr], ya[tr], X[te], bundle_feats, cfg)) * ref[te]
            tab = error_table(df[test], pred[test], fold, model)
            if sizes is not None:
                sizes.append(size_table(df[test], pred[test], fold, model))
            tab["fit_s"] = time.time() - t0
            out.append(tab)
        yp = np.log(y_us / phys)
        Xp = X.assign(log_phys_us=np.log(phys))
        for model, feats in (("physical+trees", bundle_feats + src_feats + ["log_phys_us"]),
                             ("physical+normalised", norm_feats + ["log_phys_us"])):
            if models and model not in models:
                continue
            t0 = time.time()
            p = fit_predict(Xp[train], yp[train], Xp[test], feats, cfg)
            tab = error_table(df[test], np.exp(p) * phys[test] / 1e3, fold, model)
            tab["fit_s"] = time.time() - t0
            out.append(tab)
    return pd.concat(out, ignore_index=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    ap.add_argument("--fp32-sample", type=float, default=0.25)
    ap.add_argument("--mlruns", default="mlruns")
    ap.add_argument("--no-mlflow", action="store_true")
    ap.add_argument("--models", default=None, help="comma-separated subset of the models to fit (default: all)")
    ap.add_argument("--xla-table", action="append", default=None,
                    help="an extra XLA GEMM table (data/xla_perf_table.py; repeatable; default: $WATTCAST_XLA_TABLE)")
    ap.add_argument("--spec-monotone", action="store_true", help="fit the ceiling member with the opt-in monotone "
                    "recipe (wattcast train kernels --spec-monotone)")
    a = ap.parse_args()
    t0 = time.time()
    sizes: list = []
    fp8_combos: list = []
    bounds: list = []
    t = run(a.data, a.fp32_sample, tuple(a.models.split(",")) if a.models else None, sizes=sizes, xla_tables=a.xla_table,
            fp8_combos=fp8_combos, bounds=bounds, spec_monotone=a.spec_monotone)
    pd.set_option("display.width", 220)
    print(t.drop(columns=["fit_s"]).round(1).to_string(index=False))
    by_size = pd.concat(sizes, ignore_index=True) if sizes else pd.DataFrame()
    if len(by_size):
        print("\nthe shipped recipe (bundle) by GEMM size, GFLOP (signed bias per bucket):")
        print(by_size.round(1).to_string(index=False))
    by_fp8 = pd.concat(fp8_combos, ignore_index=True) if fp8_combos else pd.DataFrame()
    if len(by_fp8):
        print("\nthe shipped recipe on every XLA fp8 (lhs, rhs, out) combination of a held-out device (the fold's model;"
              " kept = the\ncombination the fp8 cells above are made of, the others predicted only; MAPE / bias on"
              " rows >= 1 GFLOP;\nbest measured TFLOPS at any size over the dense FP8 peak; rows_over_peak: readings"
              " above the peak, physically impossible):")
        print(by_fp8.drop(columns=["model"]).round({"mape_pct": 1, "bias_pct": 1, "best_tflops": 0,
                                                     "best_over_peak": 2}).to_string(index=False))
    by_bound = pd.concat(bounds, ignore_index=True) if bounds else pd.DataFrame()
    if len(by_bound):
        print("\nthe shipped recipe by roofline side, GEMMs >= 1 GFLOP (medians of the fraction of the dense peak and of"
              " the\ndatasheet bandwidth that the measurement and the prediction reach):")
        print(by_bound.drop(columns=["model"]).round({"mape_pct": 1, "bias_pct": 1, "peak_frac_measured": 3,
                                                      "peak_frac_predicted": 3, "bw_frac_measured": 3,
                                                      "bw_frac_predicted": 3}).to_string(index=False))
    big = t[t["size"] == ">= 1 GFLOP"]
    goal = big.assign(met=(big.mape_pct <= 10) & (big.bias_pct.abs() <= 5)).groupby("model")["met"].agg(["sum", "count"])
    print(f"\nrows >= 1 GFLOP meeting 10% MAPE and |bias| <= 5% (per device x dtype x source):\n{goal.to_string()}")
    print(f"(NeuSight FP32 rows sampled at {a.fp32_sample:.0%}; {time.time() - t0:.0f} s)")
    if not a.no_mlflow:
        from wattcast.training.tracking import log_run

        # metrics for the shipped recipe's cells and every model's goal count; every model's cells are in the run's
        # ``logo`` table (one metric per variant and cell made the tracking database grow by ~0.5 MB a run)
        shipped = t[t["model"] == SHIPPED_MODEL]
        metrics = {metric_key(r, k): float(getattr(r, k)) for r in shipped.itertuples() for k in ("mape_pct", "bias_pct")}
        metrics.update({f"goal_cells_met_{model_key(m)}": float(g["sum"]) for m, g in goal.iterrows()})
        metrics.update({fp8_metric_key(r, k): float(getattr(r, k)) for r in by_fp8.itertuples()
                        for k in ("mape_pct", "bias_pct", "best_over_peak", "rows_over_peak")
                        if np.isfinite(getattr(r, k))})
        run_id = log_run(a.mlruns, experiment="kernel-logo",
                         params={"fp32_sample": a.fp32_sample, "spec_monotone": a.spec_monotone}, metrics=metrics,
                         tags={"kind": "leave-one-generation-out"},
                         tables={"logo": t, "logo_bundle_by_size": by_size, "logo_fp8_combinations": by_fp8,
                                 "logo_by_bound": by_bound})
        print(f"MLflow run {run_id} (experiment kernel-logo)")


if __name__ == "__main__":
    main()
