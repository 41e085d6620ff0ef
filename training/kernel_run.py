"""The whole `wattcast train kernels` job: load -> train -> evaluate held-out -> MLflow -> gated write."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from wattcast.data.catalog import resolve_device
from wattcast.data.device_spec import DeviceSpec, DeviceSpecError
from wattcast.data.kernel_ops import OP_FAMILY
from wattcast.models.kernel_bundle import KernelBundle, shipped_folder
from wattcast.training.generation_calibration import attach_calibration, calibrate_generations, calibration_table
from wattcast.training.holdout import heldout_twin, with_default_holdout
from wattcast.training.kernels import (
    MIN_FAMILY_ROWS,
    NEUSIGHT_OOD_MAPE,
    TrainConfig,
    dataset_fingerprint,
    evaluate,
    summarise,
    train_bundle,
)
from wattcast.training.tracking import log_run

#: the gate: the new bundle must be no worse than the old on all validation rows together, and may not
#: regress any one part (shared reference rows, the user's rows) by more than this fraction
PART_TOLERANCE = 0.05
#: "no worse" on all validation rows, noise-aware (since stop 48): the new bundle is refused when its MAPE exceeds the
#: old one's by more than this many standard errors of the paired difference. Both bundles predict the same rows, so
#: the per-row difference of absolute percentage errors is paired, and its mean's standard error is the spread of that
#: mean over bootstrap resamples of the rows (Efron & Tibshirani, An Introduction to the Bootstrap, 1993, ch. 6:
#: bootstrap standard error; ch. 15 for paired two-sample comparisons). 2 SE is the one-sided ~2.3% level of a normal
#: mean difference. Until stop 48 any increase refused: stop 47's GEMM refit (fp8 outputs at 2 bytes) read 7.886 vs
#: 7.884% on 20,255 rows, +0.002 +- 0.010 points, and was refused by that 0.002
GATE_NOISE_SE = 2.0
#: bootstrap resamples of the validation rows, and the seed that makes the gate's decision reproducible
GATE_BOOTSTRAP_RESAMPLES = 1000
GATE_BOOTSTRAP_SEED = 0
#: fewest validation rows a part (shared, the user's) needs to be judged on its own; an --only-csv run with fewer of
#: the user's held-out rows is not validated, so not made live (a 60-row CSV holds out ~11: a 0-fit bundle at 87.6%
#: MAPE on them replaced one at 16.1%, judged on 20,000 shared rows the flag leaves out)
MIN_GATE_ROWS = 20
#: shared rows drawn as the reference an --only-csv run's own rows cannot vouch for (of the GPUs and families it fitted)
REFERENCE_ROWS = 20_000
#: an --only-csv bundle that more than doubles the working one's MAPE on the shared measurements of its own GPUs and
#: families is refused whatever its own rows say: a unit or scale error (latencies x50 in the CSV) moves it ~40x, while
#: retraining on a few hundred rows moves it by tens of percent (duplicates alone: 17.35 -> 11.74%, split_user_rows)
REFERENCE_VETO_RATIO = 2.0
#: the physics check of a user CSV (``check_user_physics``), before anything is trained. A row faster than its
#: physical floor (``featurize.kernel_features.physical_floor_ms``: its GEMM work at the spec's dense peak, or the bytes
#: that cannot have stayed in the last-level cache crossing DRAM at the datasheet bandwidth) by more than this margin
#: is impossible on that spec. Measured on the shared datasets' 437,937 rows of the catalog's training GPUs (NeuSight
#: kernels and kernels_test, Vidur, XLA, DeepBench, LLMCompass; the held-out L4 and A100-PCIe-80GB left out): none is
#: below its floor, the closest 1.001x above it (NeuSight kernels_test, V100-PCIe-32GB). The 10% is a judgement, not a
#: fit: it leaves room for timer granularity and for clocks above the one a datasheet peak assumes (NVIDIA gives a
#: GeForce card's "Boost Clock" as a typical clock under load, which GPU Boost may exceed); the audit's H100 timings
#: labelled as an RTX 5090 run 2.8x faster than its 209.5 TFLOP/s bf16 dense peak
FLOOR_TOLERANCE = 0.10
#: the unit check: the median of measured / roofline over the rows whose roofline is at least UNIT_MIN_ROOF_MS (smaller
#: kernels are launch-bound: NeuSight's 1-10 us rows reach a median of 79.7x per GPU and family) must not exceed
#: UNIT_RATIO_LIMIT. On those shared rows with a roofline >= 0.01 ms (333,576) the per-source medians are
#: 1.37-3.79x and the largest median of any (source, GPU, op, dtype) group of the 212 is 5.29x (LLMCompass MI210
#: fp16 softmax); the largest single row 124.8x (NeuSight). A CSV in microseconds multiplies every ratio by 1000
#: (the audit's 200 H100 bf16 linear rows: median 1,800x). 100 is ~19x the worst real group's median and ~10x
#: below a x1000 unit error of a kernel at its roofline
UNIT_MIN_ROOF_MS = 0.01
UNIT_RATIO_LIMIT = 100.0
#: fewest such rows the unit check judges (a median of fewer could be one outlier row: the largest real one is 124.8x)
UNIT_MIN_ROWS = 5
#: the consistency check of a user CSV with the working bundle (``user_consistency``): the median over the CSV's rows
#: of measured / predicted (the working bundle, which never saw them) must lie inside the median of the rows' own
#: 90% bands (``pred_low_ms`` / ``pred_high_ms``: the 5-95% quantiles of measured / predicted on GPUs left out of
#: training, ``models.kernel_bundle``), else the CSV contradicts the model by more than the model's own error on unseen
#: hardware: a scale error (every latency x20: median 20x, the shipped GEMM band 0.65-1.71x) or the wrong device.
#: For honest rows a per-row band holds 90% of them, so their median falls outside it only when the model is
#: systematically off for that GPU by more than its stated band (then --force). At least this many rows are judged
#: (a median of 5 rows leaves a 90% band only if 3 of them leave it on one side: ~0.1% for honest rows)
CONSISTENCY_MIN_ROWS = 5
#: the share of a user CSV's measurement points (not rows: see ``split_user_rows``) held out as its validation split
USER_VAL_FRACTION = 0.2
#: two measurements of one point further apart than this factor contradict each other (``duplicate_counts``)
CONFLICT_RATIO = 2.0


def _point_key(rows: pd.DataFrame) -> list[str]:
    """The columns that name one measurement point: op, shape, dtype and GPU."""
    from wattcast.data.kernel_datasets import SHAPE_COLUMNS

    return ["op", "dtype", "device", *[c for c in SHAPE_COLUMNS if c in rows.columns]]


def split_user_rows(user: pd.DataFrame, fraction: float = USER_VAL_FRACTION, seed: int = 1) -> np.ndarray:
    """Validation mask of a user's rows drawn per measurement point (same op + shape + dtype + device): every
    repeat of a shape lands on the same side, so a shape measured twice cannot be trained on and validated on
    (a per-row draw did: duplicating the same 200 rows took the in-distribution error from 17.35% to 11.74%)."""
    if not len(user):
        return np.zeros(0, bool)
    gid = user.groupby(_point_key(user), dropna=False, sort=True).ngroup().to_numpy()
    return (np.random.default_rng(seed).random(int(gid.max()) + 1) < fraction)[gid]


def duplicate_counts(user: pd.DataFrame, ratio: float = CONFLICT_RATIO) -> dict:
    """Rows repeating another row exactly (same point and latency), and points measured more than once whose
    latencies are more than ``ratio`` apart (groups, rows)."""
    key = _point_key(user)
    exact = int(user.duplicated(key + ["latency_ms"]).sum())
    g = user.groupby(key, dropna=False, sort=False)["latency_ms"]
    lo, hi, n = g.transform("min"), g.transform("max"), g.transform("size")
    bad = (n > 1) & (hi > lo * ratio)
    groups = int(user.loc[bad, key].drop_duplicates().shape[0]) if bad.any() else 0
    return {"exact_rows": exact, "conflict_groups": groups, "conflict_rows": int(bad.sum())}


@dataclass
class RunOutcome:
    replaced: bool
    reason: str
    out_dir: Path
    metrics: dict
    tables: dict
    run_id: str | None


def _specs_for(devices, extra_specs: dict[str, DeviceSpec]) -> dict[str, DeviceSpec]:
    specs = {}
    unknown = []
    for d in sorted(set(devices)):
        if d in extra_specs:
            specs[d] = extra_specs[d]
            continue
        try:
            specs[d] = resolve_device(d)
        except DeviceSpecError:
            unknown.append(d)
    if unknown:
        raise DeviceSpecError(
            f"no device spec for {unknown}: use catalog names or aliases in the CSV's Device column, "
            "or pass a spec file per device with --spec FILE (its name must match the Device column)"
        )
    return specs


def _canonical_devices(df: pd.DataFrame, extra_specs: dict[str, DeviceSpec]) -> pd.DataFrame:
    """Map the Device column of user data to catalog names (spec files keep their own names)."""
    names = {}
    for d in pd.unique(df["device"]):
        if d in extra_specs:
            names[d] = d
            continue
        try:
            names[d] = resolve_device(d).name
        except DeviceSpecError:
            names[d] = d
    return df.assign(device=df["device"].map(names))


def _row_shape(r) -> str:
    """``B=.. M=.. ..`` of the shape columns a row's op uses (the others are NaN)."""
    from wattcast.data.kernel_datasets import SHAPE_COLUMNS

    return " ".join(f"{c}={int(getattr(r, c))}" for c in SHAPE_COLUMNS if pd.notna(getattr(r, c, np.nan)))


def check_user_physics(user: pd.DataFrame, specs: dict[str, DeviceSpec], origin: str = "the CSV",
                       lines: np.ndarray | None = None, files: np.ndarray | None = None) -> None:
    """Refuse (ValueError) a user CSV whose latencies the GPUs' specs make impossible, before anything is trained:

    - rows faster than their physical floor by more than :data:`FLOOR_TOLERANCE` (a GEMM above the dtype's dense
      peak, or more bytes through DRAM than the datasheet bandwidth allows): named by line, op, shape, dtype, GPU and
      the rate they imply against the spec's. The whole CSV is refused, not those rows dropped: a wrong device or
      spec (or a sparse peak) is wrong for the rows it does not catch too, and training on them gives wrong numbers
      unflagged.
    - latencies in microseconds (or another unit): the median measured / roofline over rows with a roofline of at
      least :data:`UNIT_MIN_ROOF_MS` (at least :data:`UNIT_MIN_ROWS` of them) above :data:`UNIT_RATIO_LIMIT`.

    ``lines``: each row's line in the file (``load_user_kernels``'s ``attrs["lines"]``), else row number + 2.
    ``files``: each row's file, when the rows come from more than one (``train kernels --data PROFILE_DIR`` with
    ``--csv``, or several folders): a row is then named by its file and line."""
    from wattcast.featurize.kernel_features import featurize_kernels

    if not len(user):
        return
    F = featurize_kernels(user, specs)
    lat = user["latency_ms"].to_numpy(dtype=float)
    floor = F["t_floor_ms"].to_numpy(dtype=float)
    roof = F["t_roof_ms"].to_numpy(dtype=float)
    lines = np.asarray(lines) if lines is not None and len(lines) == len(user) else np.arange(len(user)) + 2
    files = np.asarray(files, dtype=object) if files is not None and len(files) == len(user) else None
    if files is not None and len(set(files)) < 2:
        files = None  # one file: ``origin`` names it
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = lat / roof
        fast = np.isfinite(floor) & (floor > 0) & (lat * (1 + FLOOR_TOLERANCE) < floor)
    big = np.isfinite(ratio) & (roof >= UNIT_MIN_ROOF_MS)
    med = float(np.median(ratio[big])) if big.sum() >= UNIT_MIN_ROWS else None
    if med is not None and med > UNIT_RATIO_LIMIT:
        # x1000 puts a real median (1.4-5.3x) at 1,400-5,300x; between the limit and that, some other scale error
        unit = ("look like microseconds, not milliseconds" if med > 3 * UNIT_RATIO_LIMIT else
                "are too slow for milliseconds (another unit, or a scale error?)")
        raise ValueError(
            f"{origin}: the latencies {unit}: over the {int(big.sum()):,} rows whose "
            f"roofline (the spec's peak FLOP/s and memory bandwidth) is at least {UNIT_MIN_ROOF_MS:g} ms, the median "
            f"measured latency is {med:,.0f}x the roofline (the shared datasets' measurements: medians 1.4-5.3x; "
            f"refused above {UNIT_RATIO_LIMIT:g}x). Latency is read in milliseconds (the `Latency` / `latency_ms` / "
            "`Latency (ms)` column): divide it by 1000 if it is in microseconds (and check the Device column and "
            "--spec figures). Nothing was trained or written")
    if fast.any():
        idx = np.flatnonzero(fast)
        idx = idx[np.argsort(lat[idx] / floor[idx], kind="stable")]  # the most impossible first
        rows = user.iloc[idx]
        flops = np.where((F["family"].to_numpy() == "gemm")[idx],
                         (2.0 * rows["B"] * rows["M"] * rows["N"] * rows["K"]).to_numpy(dtype=float), 0.0)  # dense
        peak_tflops = np.exp(F["dev_log_peak_tflops"].to_numpy(dtype=float)[idx])
        bw_gbps = np.exp(F["dev_log_bw_gbps"].to_numpy(dtype=float)[idx])
        said = []
        for j, r in enumerate(rows.head(10).itertuples(index=False)):
            i = idx[j]
            # the bound that sets the floor: the dense GEMM work at the peak, else the DRAM bytes at the bandwidth
            if flops[j] / (peak_tflops[j] * 1e9) >= floor[i] * (1 - 1e-9):
                rate = (f"{flops[j] / lat[i] / 1e9:,.1f} TFLOP/s vs the spec's {peak_tflops[j]:,.1f} {r.dtype} "
                        "dense peak")
            else:
                rate = (f"{floor[i] / lat[i] * bw_gbps[j]:,.0f} GB/s through DRAM (the bytes that cannot stay in the "
                        f"cache) vs the spec's {bw_gbps[j]:,.0f} GB/s")
            where = f"line {int(lines[i])}" if files is None else f"{files[i]} line {int(lines[i])}"
            said.append(f"  {where}: {r.op} {_row_shape(r)} {r.dtype} on {r.device}: {lat[i]:.6g} ms, "
                        f"below the physical floor {floor[i]:.6g} ms ({rate})")
        more = f"\n  ... and {len(idx) - 10:,} more" if len(idx) > 10 else ""
        devs = sorted(set(rows["device"]))
        seconds = (f" The median row is {med:.3g}x its roofline: latencies in seconds instead of milliseconds?"
                   if med is not None and med < 1 / UNIT_RATIO_LIMIT else "")
        raise ValueError(
            f"{origin}: {len(idx):,} of {len(user):,} row(s) are faster than the GPU's spec allows (more than "
            f"{FLOOR_TOLERANCE:.0%} below the physical floor: the GEMM work at the dtype's dense peak, or the bytes "
            f"beyond the cache at the memory bandwidth), so they cannot have been measured on {', '.join(devs)} as "
            f"specified:\n" + "\n".join(said) + more
            + f"\n(the fastest is {floor[idx[0]] / lat[idx[0]]:.2f}x faster than its floor)\nLikely causes: the Device "
            "column names the wrong GPU (timings from a faster one), a --spec file with wrong figures (a sparse-matrix "
            "peak, 2x the dense one, or a bandwidth too low), or the wrong dtype." + seconds
            + " Nothing was trained or written")


def _plot_heldout(pred: pd.DataFrame, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for dev, g in pred.groupby("device"):
        fig, ax = plt.subplots(figsize=(6, 6))
        for fam, gg in g.groupby("report_family"):
            ax.scatter(gg["latency_ms"], gg["pred_latency_ms"], s=6, alpha=0.5, label=f"{fam} ({gg['ape'].mean()*100:.1f}%)")
        lo = max(1e-4, min(g["latency_ms"].min(), g["pred_latency_ms"].min()))
        hi = max(g["latency_ms"].max(), g["pred_latency_ms"].max())
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured latency (ms)")
        ax.set_ylabel("predicted latency (ms)")
        ax.set_title(f"{dev} (held out): MAPE {g['ape'].mean()*100:.1f}%")
        ax.legend(fontsize=8)
        p = folder / f"heldout_{dev}.png"
        fig.savefig(p, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(p)
    return paths


def run_train_kernels(
    data: str | Path | None = None,
    csv: str | Path | None = None,
    only_csv: bool = False,
    holdout: tuple[str, ...] = ("L4", "A100-PCIe-80GB"),
    out_dir: str | Path | None = None,
    spec_files: tuple[str, ...] = (),
    quick: bool = False,
    tracking_dir: str | Path = "mlruns",
    use_mlflow: bool = True,
    progress: Callable[[str, int], None] | None = None,
    log: Callable[[str], None] = print,
    xla_tables: tuple[str, ...] | None = None,
    families: tuple[str, ...] | None = None,
    force: bool = False,
    csv_origin: pd.DataFrame | None = None,
    spec_monotone: bool = False,
) -> RunOutcome:
    """Train, evaluate and (if it validates) install a kernel bundle. ``xla_tables``: extra XLA GEMM tables for the
    shared ``xla`` source (``data/xla_perf_table.py``; default: ``$WATTCAST_XLA_TABLE``), recorded in the manifest.
    ``families``: retrain only these op families and take every other one, unchanged, from the working bundle at
    the target (new data that touches one family does not redraw the others' fits); the gate then compares the
    merged bundle with the working one as usual. ``force``: make the new bundle live even when the gate refuses it.
    ``csv_origin``: when ``csv`` is a temporary merge of other files (``wattcast train kernels --data PROFILE_DIR``:
    the folders' kernels.csv, and --csv), where each of its rows came from: indexed by the row's line in ``csv``, the
    ``file`` and ``line`` there. The checks' messages, the gate's and MLflow's ``user_csv`` then name those files and
    lines, not ``csv`` (which is deleted after the run). ``spec_monotone``: the opt-in recipe monotone in the spec sheet
    (training/kernels.py ``TrainConfig.spec_monotone``; the shipped bundle is fitted without)."""
    from wattcast.data.kernel_datasets import (
        WITHHELD_DEVICES,
        DataNotFoundError,
        load_kernels,
        load_label_nodes,
        load_user_kernels,
        split_heldout,
    )

    t0 = time.time()
    origin = str(csv) if csv is not None else None  # what messages and MLflow call the user's rows
    extra_specs = {}
    for f in spec_files:
        s = resolve_device(f)
        extra_specs[s.name] = s
    # the project's held-out GPUs always: --holdout adds to them, never replaces them (a --spec GPU by its name too)
    holdout = with_default_holdout(holdout, extra_specs.values())
    cfg = (TrainConfig.quick if quick else TrainConfig)(holdout=tuple(holdout), spec_monotone=spec_monotone)
    target = Path(out_dir) if out_dir else shipped_folder()
    base_bundle = None
    if families:
        unknown = sorted(set(families) - set(cfg.families))
        if unknown:
            raise ValueError(f"unknown op famil{'ies' if len(unknown) > 1 else 'y'} {unknown}; choose from {list(cfg.families)}")
        base_bundle, base_from_target = _working_bundle(target, log)
        # the default order kept: the first family draws from the seed exactly as in a full run
        cfg = replace(cfg, families=tuple(f for f in cfg.families if f in families))
    # a spec file with a held-out GPU's figures under another name is that GPU: its rows are evaluated, not trained on
    held_names = set(holdout)
    for name, s in extra_specs.items():
        twin = heldout_twin(s, holdout)
        if twin is not None and name not in held_names:
            held_names.add(name)
            log(f"--spec {name} has the hardware figures of the held-out GPU {twin} (never trained on): its rows are "
                "used for evaluation only")

    frames, heldout_parts = [], []
    user_val = None
    user_rows = None
    shared = None
    extra_xla: list[str] = []
    if not only_csv:
        shared = load_kernels(data, xla_tables=xla_tables)  # raises DataNotFoundError with a clear message
        extra_xla = list(shared.attrs.get("xla_tables") or [])
        if extra_xla:
            log(f"extra XLA GEMM tables: {', '.join(extra_xla)}")
        withheld_rows = shared.attrs.get("withheld") or {}
        if withheld_rows:
            log(f"left out {sum(withheld_rows.values()):,} rows on hardware the shared datasets withhold "
                f"({', '.join(WITHHELD_DEVICES)}; not trained on): {', '.join(withheld_rows)}")
        train_shared, held_shared = split_heldout(shared, holdout=holdout)
        frames.append(train_shared)
        heldout_parts.append(held_shared)
        try:
            nodes = load_label_nodes(data, devices=list(holdout))
            heldout_parts.append(nodes[nodes["device"].isin(holdout)])
        except DataNotFoundError:
            pass
    if csv is not None:
        loaded = load_user_kernels(csv)
        lines = loaded.attrs.pop("lines", None)
        files = None
        if csv_origin is not None:  # the user's own files and lines, not the merged temporary file's
            origin = ", ".join(dict.fromkeys(csv_origin["file"]))
            if lines is not None:
                where = csv_origin.loc[lines]
                files, lines = where["file"].to_numpy(object), where["line"].to_numpy()
        user = _canonical_devices(loaded, extra_specs)
        # impossible latencies (faster than the spec's physics) and a unit error are refused before any training
        check_user_physics(user, _specs_for(user["device"], extra_specs), origin=origin, lines=lines, files=files)
        held_user = user[user["device"].isin(held_names)]
        user = user[~user["device"].isin(held_names)]
        user_rows = user
        if len(held_user):
            log(f"{len(held_user)} rows of the user CSV are on held-out GPUs {sorted(set(held_user['device']))}: used for evaluation only")
            heldout_parts.append(held_user)
        dup = duplicate_counts(user)
        if dup["exact_rows"]:
            log(f"warning: {dup['exact_rows']:,} row(s) of the CSV repeat another row exactly (same op, shape, dtype, "
                "GPU and latency): kept, they weigh their shapes more in the fit")
        if dup["conflict_groups"]:
            log(f"warning: {dup['conflict_groups']:,} shape(s) of the CSV ({dup['conflict_rows']:,} rows) were measured "
                f"more than once with latencies over {CONFLICT_RATIO:g}x apart: check those measurements")
        vmask = split_user_rows(user)
        user_val = user[vmask]
        frames.append(user[~vmask])
        log(f"your CSV: {len(user) - int(vmask.sum()):,} rows trained on, {int(vmask.sum()):,} held out for validation "
            f"({USER_VAL_FRACTION:.0%} of its {user.groupby(_point_key(user), dropna=False).ngroups:,} distinct shapes; "
            "every repeat of a shape on one side)")
    train = pd.concat(frames, ignore_index=True)
    if len(train) == 0:
        raise ValueError("no training rows")
    specs = _specs_for(pd.concat([train, *heldout_parts, *( [user_val] if user_val is not None else [])])["device"], extra_specs)
    fp = dataset_fingerprint(train[["op", "dtype", "B", "M", "N", "K", "H", "device", "latency_ms"]])
    log(f"training rows: {len(train):,} on {train['device'].nunique()} GPUs; held out: {', '.join(holdout)}; fingerprint {fp}")

    bundle, lodo_tables, val = train_bundle(train, specs, cfg, progress=progress, extra_val=user_val,
                                            data_root=None if only_csv else data)
    # leave one generation out: the band a new generation's prediction carries and where device-OOD starts
    cal = calibrate_generations(train, specs, bundle, rounds=max(cfg.lgbm_rounds // 2, 30),
                                max_rows=max(cfg.max_rows_per_fit // 2, 4000), seed=cfg.seed,
                                root=None if only_csv else data, tick=(lambda: progress("calibrate", 1)) if progress else None)
    bundle = attach_calibration(bundle, cal)
    run_devices = list(bundle.meta["train_devices"])  # the GPUs this run trained (not the kept families' GPUs)
    if base_bundle is not None:
        bundle = _merge_families(base_bundle, bundle)
        log(f"retrained {', '.join(cfg.families)}; kept {', '.join(f for f in bundle.families if f not in cfg.families) or 'nothing'}"
            f" from {target if base_from_target else 'the shipped bundle'}")
        # this run's validation split is drawn over every row; the kept families were fitted on their own run's split,
        # so some of these "validation" rows trained them: validate (and gate) on the retrained families' rows only
        val = _of_families(val, cfg.families)
    missing = missing_families(bundle)
    if missing:
        bundle.meta["roofline_families"] = missing
        log(f"warning: the new bundle has no surrogate for {', '.join(missing)} (no training rows, or fewer than "
            f"{MIN_FAMILY_ROWS}): with it, those kernels are costed by the roofline alone (model 'roofline-fallback', "
            f"flagged ood), not by a fitted model. To keep the working bundle's fits for them, retrain only yours: "
            f"--family {' --family '.join(sorted(bundle.families)) or 'NAME'}")
    bundle.meta["dataset_fingerprint"] = fp
    # provenance of rows that are not in the shared datasets (file names; the data is not shipped). XLA rows are GEMMs:
    # a partial retraining that keeps the GEMM family keeps its record
    if base_bundle is None or "gemm" in cfg.families:
        bundle.meta["xla_tables"] = [Path(p).name for p in extra_xla]
    bundle.meta["config"] = {k: v for k, v in cfg.__dict__.items()}

    metrics: dict[str, float] = {}
    tables: dict[str, pd.DataFrame] = {}
    # in-distribution: the validation split of the training GPUs
    val_pred = evaluate(bundle, val, specs)
    tables["in_distribution"] = summarise(val_pred, ["report_family"])
    metrics["val_mape_pct"] = float(val_pred["ape"].mean() * 100)
    for fam, r in tables["in_distribution"].iterrows():
        metrics[f"indist_{fam}_mape_pct"] = r["mape_pct"]
    if base_bundle is not None:  # the kept families' figures from the run that fitted them
        for k, v in (base_bundle.meta.get("metrics") or {}).items():
            if k.startswith("indist_") and k not in metrics:
                metrics[k] = v
    # LODO (unseen training GPU) per family, and the tensor-core GEMM LODO per device
    lodo_rows = []
    for fam, t in lodo_tables.items():
        ch = t.attrs["choice"]
        for (dev, dt), g in t.groupby(["device", "dtype"]):
            lodo_rows.append({"family": fam, "device": dev, "dtype": dt, "rows": len(g), "model": ch,
                              "mape_pct": g[f"ape_{ch}"].mean() * 100, "roofline_mape_pct": g["ape_roofline"].mean() * 100})
        metrics[f"lodo_{fam}_mape_pct"] = float(t.groupby("device")[f"ape_{ch}"].mean().mean() * 100)
    if lodo_rows:
        tables["lodo"] = pd.DataFrame(lodo_rows).round(2)
        tc = tables["lodo"][(tables["lodo"]["family"] == "gemm") & (tables["lodo"]["dtype"] != "fp32")]
        tables["tensorcore_lodo"] = tc
        for _, r in tc.iterrows():
            metrics[f"tc_lodo_{r['device']}_{r['dtype']}_mape_pct"] = r["mape_pct"]
    cal_t = calibration_table(cal)
    if len(cal_t):
        tables["generation_calibration"] = cal_t.round(2)
        for r in cal_t.itertuples():
            metrics[f"logo_{r.family}_{r.generation}_mape_pct"] = r.mape_pct
            metrics[f"logo_{r.family}_{r.generation}_bias_pct"] = r.bias_pct
    # held-out GPUs: the honest number
    held = pd.concat(heldout_parts, ignore_index=True) if heldout_parts else pd.DataFrame()
    held_pred = None
    if len(held):
        held_pred = evaluate(bundle, held, specs)
        tables["heldout"] = summarise(held_pred, ["device", "source", "report_family"])
        by_fam = summarise(held_pred, ["device", "report_family"])
        by_fam["neusight_published_pct"] = [NEUSIGHT_OOD_MAPE.get(f, np.nan) for _, f in by_fam.index]
        tables["heldout_by_family"] = by_fam
        for (dev, fam), r in by_fam.iterrows():
            metrics[f"heldout_{dev}_{fam}_mape_pct"] = r["mape_pct"]
            metrics[f"heldout_{dev}_{fam}_roofline_mape_pct"] = r["roofline_mape_pct"]
        metrics["heldout_mape_pct"] = float(held_pred["ape"].mean() * 100)

    # the gate: replace only if the new bundle validates no worse on the same validation rows (an --only-csv run:
    # the user's own held-out rows, the flag leaves the shared datasets out)
    reference = None
    if only_csv:  # the shared rows of the GPUs and families this CSV fitted: they can veto it, never pass it
        reference = _own_reference(data, holdout, xla_tables, bundle, cfg.families, devices=run_devices)
    elif user_rows is not None and len(user_rows):
        # a mixed run: the shared rows of the CSV's own GPUs and families veto too (the aggregate over every GPU and
        # family hid a x20 CSV: its T4 GEMMs are ~1% of the shared validation rows)
        reference = _own_reference(data, holdout, xla_tables, bundle, cfg.families,
                                   devices=sorted(set(user_rows["device"])), shared=shared)
    replaced, reason, gate = gate_decision(bundle, target, val, specs, val_pred, user_only=only_csv, force=force,
                                           reference=reference, user_rows=user_rows, origin=origin)
    metrics.update(gate)
    bundle.meta["metrics"] = {k: round(float(v), 3) for k, v in metrics.items()}
    # a new version beside the old one, checked, then one atomic pointer switch (models.kernel_bundle.install_bundle):
    # a kill at any moment leaves a working bundle live. One the gate refused is kept apart, in <target>/refused/
    # (never among the rollback versions), not made live
    from wattcast.models.kernel_bundle import install_bundle

    if replaced:
        install_bundle(bundle, target, activate=True)
    else:
        reason += _keep_refused(bundle, target)
    seconds = time.time() - t0
    metrics["train_seconds"] = seconds

    run_id = None
    if use_mlflow:
        params = {
            "holdout": ",".join(holdout),
            "train_rows": len(train),
            "train_devices": ",".join(run_devices),  # this run's GPUs: a --family run's kept families are not its own
            "dataset_fingerprint": fp,
            "user_csv": origin or "",
            "xla_tables": ",".join(Path(p).name for p in extra_xla),
            **{f"cfg_{k}": v for k, v in cfg.__dict__.items()},
            **{f"choice_{f}": fm.choice for f, fm in bundle.families.items()},
        }
        run_id = log_run(tracking_dir, experiment="kernel-surrogates", params=params, metrics=metrics,
                         tags={"replaced": str(replaced), "gate": reason}, tables=tables, table_index=True,
                         figures=[lambda d: _plot_heldout(held_pred, d)] if held_pred is not None else [],
                         documents={"manifest_meta.json": bundle.meta})
    return RunOutcome(replaced, reason, target, metrics, tables, run_id)


def _keep_refused(bundle: KernelBundle, target: Path) -> str:
    """Keep a bundle the gate refused in ``target/refused/<name>/`` and say where (a ``--models`` path); when that
    folder cannot be written (a read-only install) say so: the working bundle stays live either way."""
    from wattcast.models.kernel_bundle import REFUSED, install_bundle
    from wattcast.training.gate_force import keep_refused

    return keep_refused(lambda: install_bundle(bundle, target, activate=False), target, REFUSED, "bundle", "--models")


def missing_families(bundle: KernelBundle) -> list[str]:
    """The op families (``TrainConfig.families``) ``bundle`` has no surrogate for: predicted by the roofline alone."""
    return [f for f in TrainConfig().families if f not in bundle.families]


def _of_families(rows: pd.DataFrame, families) -> pd.DataFrame:
    """The rows of ``rows`` whose op belongs to one of ``families``."""
    return rows[rows["op"].map(OP_FAMILY).isin(families).to_numpy()]


def _working_bundle(target: Path, log: Callable[[str], None] = print) -> tuple[KernelBundle, bool]:
    """(bundle, taken from ``target``?): the bundle live at ``target``, whose families a partial retraining keeps; a target with no bundle at all (a new
    --out) takes them from the shipped bundle, the working one of a user without --models; ValueError when the
    target's bundle does not load."""
    from wattcast.models.kernel_bundle import resolve_bundle_folder

    try:
        empty = not (resolve_bundle_folder(target) / "kernel_manifest.json").is_file()
    except ValueError:  # a pointer to a missing version: a broken bundle, not an empty folder
        empty = False
    shipped = _shipped_bundle(target) if empty else None
    if shipped is not None:
        log(f"--family: no bundle at {target}: the other families are taken from the shipped bundle")
        return shipped, False
    try:
        return KernelBundle.load(target), True
    except Exception as e:  # a missing folder, a missing version, a bad hash: nothing to take families from
        raise ValueError(f"--family retrains part of a bundle and takes the other families from the working one at "
                         f"{target}, which does not load ({e}); train every family first") from None


def _merge_families(base: KernelBundle, new: KernelBundle) -> KernelBundle:
    """``base`` with ``new``'s families in place of its own; the manifest says which were retrained."""
    meta = dict(base.meta)
    meta.update({k: v for k, v in new.meta.items()
                 if k not in ("train_devices", "family_train_devices", "lodo_scores", "generation_calibration",
                              "spec_monotone")})
    # the monotone directions of each family as it was fitted: a kept family keeps its own (none before stop 58)
    mono = {f: v for f, v in (base.meta.get("spec_monotone") or {}).items() if f in base.families and f not in new.families}
    meta["spec_monotone"] = {**mono, **(new.meta.get("spec_monotone") or {})}
    # the GPUs the bundle's families were trained on: a retrained family's old GPUs go with it (a kept family's are
    # known per family when the base recorded them; a base without the record keeps its whole list)
    old_by_fam, new_by_fam = base.meta.get("family_train_devices"), new.meta.get("family_train_devices") or {}
    if old_by_fam is not None:
        by_fam = {f: v for f, v in old_by_fam.items() if f in base.families and f not in new.families} | new_by_fam
        meta["family_train_devices"] = by_fam
        meta["train_devices"] = sorted(set().union(*by_fam.values()))
    else:
        meta["train_devices"] = sorted(set(base.train_devices) | set(new.train_devices))
    meta["lodo_scores"] = {**base.meta.get("lodo_scores", {}), **new.meta.get("lodo_scores", {})}
    cal_old, cal_new = base.meta.get("generation_calibration") or {}, new.meta.get("generation_calibration") or {}
    cal = {**cal_old, **cal_new}
    cal["families"] = sorted(set(cal_old.get("families", [])) | set(cal_new.get("families", [])))
    meta["generation_calibration"] = cal
    meta["retrained_families"] = sorted(new.families)
    # the kept families were fitted on the base's features: a base of another (or no) feature version keeps its stamp
    # (so a load still warns) unless every family it had was retrained
    if set(base.families) - set(new.families) and base.meta.get("feature_version") != new.meta.get("feature_version"):
        meta.pop("feature_version", None)
        if base.meta.get("feature_version") is not None:
            meta["feature_version"] = base.meta["feature_version"]
    return KernelBundle({**base.families, **new.families}, meta)


def _reference_rows(data, holdout, xla_tables=None, devices=None, families=None,
                    shared: pd.DataFrame | None = None) -> pd.DataFrame | None:
    """Up to :data:`REFERENCE_ROWS` shared training-GPU rows (never held-out GPUs) of ``devices`` and ``families``
    (None: all), drawn after that filter (a draw over every GPU first left 6 rows of a V100-SXM2's 154), or None
    without the data or any such row."""
    from wattcast.data.kernel_datasets import DataNotFoundError, load_kernels, split_heldout

    if shared is None:
        try:
            shared = load_kernels(data, xla_tables=xla_tables)
        except DataNotFoundError:
            return None
    train, _ = split_heldout(shared, holdout=holdout)
    if devices is not None:
        train = train[train["device"].isin(list(devices))]
    if families is not None:
        train = _of_families(train, families)
    n = min(REFERENCE_ROWS, len(train))
    return train.sample(n=n, random_state=2) if n else None


def _own_reference(data, holdout, xla_tables, bundle: KernelBundle, families, devices,
                   shared: pd.DataFrame | None = None) -> pd.DataFrame | None:
    """The shared reference rows of the GPUs this run trained on (``devices``; an --only-csv run: the CSV's GPUs), of the ``families`` it fitted (what its CSV claims to describe), or None. After a
    --family merge ``bundle.train_devices`` also lists the kept families' GPUs, so the caller passes the run's own.

    Both bundles are scored on these rows; the working bundle's validation split is not recorded in its manifest, so
    they are not restricted to it. When the working bundle was trained on the shared data it fitted about 90% of these
    rows (``TrainConfig.val_fraction`` 0.10 held out), so its MAPE here is optimistic and the ratio new / working is
    biased upward: the veto errs towards refusing (a sound bundle within 2x of an in-sample fit still passes)."""
    if not bundle.families:
        return None
    fams = [f for f in families if f in bundle.families]
    return _reference_rows(data, holdout, xla_tables, devices=devices, families=fams, shared=shared)


def gate_decision(bundle: KernelBundle, target: Path, val: pd.DataFrame, specs, new_pred: pd.DataFrame | None = None,
                  user_only: bool = False, force: bool = False, reference: pd.DataFrame | None = None,
                  user_rows: pd.DataFrame | None = None, origin: str | None = None):
    """(replace?, why, metrics). Parts: 'user' rows (source == 'user') and 'shared' rows (the rest).

    The working bundle is the one live at ``target``; a target without one (a new ``--out``) is compared with the
    shipped bundle, the one ``predict`` uses without ``--models`` (until stop 54 such a run was written unjudged: a CSV
    with every latency x20 became the default of a fresh folder).

    ``user_only`` (an --only-csv run): judged on the user's held-out rows alone; fewer than :data:`MIN_GATE_ROWS` of
    them cannot validate it, so it is not made live. A bundle with no fitted family never replaces one with fitted
    families, nor one that drops a family the working one has fitted. ``reference``: shared measurements of the new
    bundle's own GPUs and families (of the CSV's GPUs in a mixed run); a new bundle that more than
    :data:`REFERENCE_VETO_RATIO` x the working one's MAPE on them is refused (a corrupted CSV validates on itself).
    ``user_rows``: the user's (non-held-out) rows, all of them, which the working bundle never saw: their median
    measured / predicted must lie inside the working bundle's 90% band (:data:`CONSISTENCY_MIN_ROWS`), named by
    ``origin``. ``force`` makes the new bundle live whatever the gate says (the reason says what it overrode)."""
    from wattcast.models.kernel_bundle import resolve_bundle_folder
    from wattcast.training.gate_force import verdict

    against = None  # None: the target's working bundle; else how the fallback was chosen
    try:
        live = resolve_bundle_folder(target)
        missing = None if (live / "kernel_manifest.json").is_file() else "no working bundle at the target"
    except ValueError as e:  # a pointer to a missing version: there is no working bundle to keep
        missing = f"the existing bundle does not load ({e})"
    if missing is None:
        try:
            old = KernelBundle.load(target)
            old_pred = evaluate(old, val, specs) if len(val) else None
        except Exception as e:  # an unreadable or incompatible old bundle is not a working model
            missing = f"the existing bundle does not load or predict ({e})"
    if missing is not None:
        old = _shipped_bundle(target)
        if old is None:
            action = "writing the new one" if missing.startswith("no working") else "replacing it"
            return _without_working(missing, action, val, user_only, force)
        against = missing
        try:
            old_pred = evaluate(old, val, specs) if len(val) else None
        except Exception as e:  # the shipped bundle cannot predict these rows: nothing to compare with
            return _without_working(f"{missing}, and the shipped bundle cannot predict the validation rows ({e})",
                                    "writing the new one", val, user_only, force)
    ok, why, m = _judge(bundle, old, val, old_pred, new_pred, specs, user_only)
    if ok and user_rows is not None:
        ok, why = _consistency_gate(old, user_rows, specs, origin, m, why)
    n_ref = 0 if reference is None else len(reference)
    if ok and user_only and n_ref < MIN_GATE_ROWS:
        why += (f"; the shared-data veto was not applied: {n_ref} shared-dataset row(s) of the same GPUs and families "
                f"(fewer than {MIN_GATE_ROWS})")
    if ok and n_ref >= MIN_GATE_ROWS:
        own = (f"on your own rows ({m['gate_new_mape_pct']:.2f}% vs {m['gate_old_mape_pct']:.2f}% MAPE"
               + (f" on {int(m['gate_user_rows']):,} held-out rows of your CSV)" if user_only else
                  f" on {int(m['gate_rows']):,} validation rows, yours and the shared ones)"))
        try:
            # the reference rows are shared-dataset rows: catalog GPUs, their specs loaded here (the run's specs
            # cover only its own rows' GPUs)
            ref_specs = {**_specs_for(set(reference["device"]) - set(specs), {}), **specs}
            o_, n_ = (float(evaluate(b, reference, ref_specs)["ape"].mean()) for b in (old, bundle))
        except Exception as e:  # a veto that cannot run cannot pass the bundle: refused (--force overrides)
            o_ = n_ = None
            ok, why = False, (f"kept the existing bundle: it validates no worse {own}, but the "
                              f"shared-data veto could not be run: its {n_ref:,} reference rows could not be predicted "
                              f"({type(e).__name__}: {e})")
        if o_ is not None:
            m["gate_reference_new_mape_pct"], m["gate_reference_old_mape_pct"] = n_ * 100, o_ * 100
            m["gate_reference_rows"] = float(len(reference))
            note = (f"{n_*100:.2f}% vs {o_*100:.2f}% MAPE on {len(reference):,} shared-dataset rows of the same GPUs "
                    "and families")
            if n_ > o_ * REFERENCE_VETO_RATIO:
                ok, why = False, (f"kept the existing bundle: it validates no worse {own}, but it is over "
                                  f"{REFERENCE_VETO_RATIO:g}x worse on the shared measurements of the same GPUs and "
                                  f"families ({note}): check the CSV's latency units and devices")
            else:
                why += f"; no veto from the shared data: {note}"
    ok, why = verdict(ok, why, force, "bundle", "--models", against=against, noun="bundle",
                      unchanged="the target's CURRENT is left as it was")
    return ok, why, m


def _shipped_bundle(target: Path) -> KernelBundle | None:
    """The shipped bundle, the working one of a user with no --models folder, when ``target`` is another folder and
    it loads; else None."""
    try:
        shipped = shipped_folder()
        if Path(target).resolve() == Path(shipped).resolve():
            return None
        return KernelBundle.load(shipped)
    except Exception:  # no shipped bundle (a stripped install): nothing to compare with
        return None


def user_consistency(old: KernelBundle, user_rows: pd.DataFrame, specs) -> dict | None:
    """{'rows', 'median_ratio', 'band_low', 'band_high'} of the user's rows under the working bundle ``old``: the
    median of measured / predicted and the medians of the rows' 90% band (low / predicted, high / predicted), or
    None with fewer than :data:`CONSISTENCY_MIN_ROWS` rows."""
    if user_rows is None or len(user_rows) < CONSISTENCY_MIN_ROWS:
        return None
    p = evaluate(old, user_rows, specs)
    pred = p["pred_latency_ms"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = p["latency_ms"].to_numpy(float) / pred
        lo = p["pred_low_ms"].to_numpy(float) / pred
        hi = p["pred_high_ms"].to_numpy(float) / pred
    ok = np.isfinite(r) & np.isfinite(lo) & np.isfinite(hi) & (r > 0)
    if ok.sum() < CONSISTENCY_MIN_ROWS:
        return None
    return {"rows": int(ok.sum()), "median_ratio": float(np.median(r[ok])), "band_low": float(np.median(lo[ok])),
            "band_high": float(np.median(hi[ok]))}


def _consistency_gate(old: KernelBundle, user_rows: pd.DataFrame, specs, origin, m: dict, why: str):
    """(ok, why) after :func:`user_consistency`: refused when the median measured / predicted of the user's rows lies
    outside the working bundle's 90% band; metrics ``gate_user_median_ratio`` / ``gate_user_band_*`` into ``m``."""
    try:
        c = user_consistency(old, user_rows, specs)
    except Exception as e:  # a check that cannot run cannot pass the bundle (--force overrides)
        return False, (f"kept the existing bundle: the working bundle could not predict the rows of "
                       f"{origin or 'your CSV'} to check them ({type(e).__name__}: {e})")
    if c is None:
        return True, why
    m["gate_user_median_ratio"], m["gate_user_band_low"], m["gate_user_band_high"] = (
        c["median_ratio"], c["band_low"], c["band_high"])
    said = (f"the median measured / predicted of its {c['rows']:,} rows is {c['median_ratio']:.3g}x (the working "
            f"bundle's 90% band: {c['band_low']:.2f}-{c['band_high']:.2f}x)")
    if c["band_low"] <= c["median_ratio"] <= c["band_high"]:
        return True, f"{why}; {origin or 'your CSV'} agrees with the working bundle: {said}"
    side = "slower" if c["median_ratio"] > c["band_high"] else "faster"
    return False, (f"kept the existing bundle: {origin or 'your CSV'} contradicts it: {said}, so its typical row is "
                   f"{side} than the working bundle allows for any GPU it was not trained on. A scale or unit error "
                   f"(latencies in another unit, or multiplied), the wrong Device column or --spec, or a GPU the "
                   f"working bundle mispredicts by more than its band; check the measurements (the gate otherwise "
                   f"read: {why})")


def _without_working(what: str, action: str, val: pd.DataFrame, user_only: bool, force: bool):
    """The gate when there is no working bundle to compare with (``what``): the new one is made current, except an
    --only-csv run with fewer than :data:`MIN_GATE_ROWS` of the user's held-out rows, which nothing has validated
    (the audit: a 19-row CSV became the default of an empty --out): kept apart, not current, unless ``force``."""
    from wattcast.training.gate_force import FORCE_HINT

    n_user = int((val["source"].to_numpy() == "user").sum()) if len(val) else 0
    m = {"gate_rows": float(len(val)), "gate_user_rows": float(n_user)}
    if not (user_only and n_user < MIN_GATE_ROWS):
        return True, f"{what}: {action}", {}
    why = (f"only {n_user} row(s) of your CSV were held out for validation, too few (< {MIN_GATE_ROWS}) to validate "
           f"the new bundle (an --only-csv run is judged on your rows alone; about "
           f"{MIN_GATE_ROWS / USER_VAL_FRACTION:.0f} distinct shapes are needed)")
    if force:
        return True, f"made current by --force although nothing validated it ({what}; {why})", m
    return False, (f"not made current: {why}, and there is no working bundle to compare it with ({what}); the "
                   f"target's CURRENT is left as it was; {FORCE_HINT}"), m


def paired_bootstrap(new_ape: np.ndarray, old_ape: np.ndarray, resamples: int = GATE_BOOTSTRAP_RESAMPLES,
                     seed: int = GATE_BOOTSTRAP_SEED) -> tuple[float, float]:
    """(mean of new - old per row, its bootstrap standard error), in the inputs' units: the rows are resampled with
    replacement ``resamples`` times, the pair of a row kept together (:data:`GATE_NOISE_SE`)."""
    d = np.asarray(new_ape, dtype=float) - np.asarray(old_ape, dtype=float)
    n = len(d)
    if n < 2:
        return (float(d.mean()) if n else 0.0), 0.0
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    step = max(1, 2_000_000 // n)  # resamples per draw: at most ~2 M row indices in memory at once
    for lo in range(0, resamples, step):
        idx = rng.integers(0, n, size=(min(step, resamples - lo), n))
        means[lo:lo + len(idx)] = d[idx].mean(axis=1)
    return float(d.mean()), float(means.std(ddof=1))


def _judge(bundle, old, val, old_pred, new_pred, specs, user_only: bool):
    """The gate proper (``gate_decision``), with the working bundle ``old`` loaded and predicted on ``val``."""
    part = np.where(val["source"].to_numpy() == "user", "user", "shared")
    n_user, n_shared = int((part == "user").sum()), int((part == "shared").sum())
    if user_only:
        used = f"{n_user:,} held-out rows of your CSV (an --only-csv run is judged on your rows alone)"
    elif n_user:
        used = f"{len(val):,} validation rows: {n_shared:,} shared-dataset rows and {n_user:,} held-out rows of your CSV"
    else:
        used = f"{len(val):,} validation rows of the shared datasets"
    refused = []
    dropped = sorted(set(old.families) - set(bundle.families))
    if not bundle.families and old.families:
        refused.append(f"the new one has no fitted model (every family below {MIN_FAMILY_ROWS} training rows: all its "
                       f"kernels would be costed by the roofline alone) and the working one has "
                       f"{', '.join(sorted(old.families))}")
    elif dropped:  # a CSV of GEMMs alone would turn the working bundle's other fits into the roofline, unjudged
        refused.append(f"the new one has no surrogate for {', '.join(dropped)}, which the working one has fitted "
                       f"(those kernels would fall back to the roofline); to keep them, retrain only yours: "
                       f"--family {' --family '.join(sorted(bundle.families))}")
    if user_only and n_user < MIN_GATE_ROWS:
        refused.append(f"only {n_user} row(s) of your CSV were held out for validation, too few (< {MIN_GATE_ROWS}) to "
                       f"show the new bundle is no worse on your data (an --only-csv run is judged on your rows alone; "
                       f"about {MIN_GATE_ROWS / USER_VAL_FRACTION:.0f} distinct shapes are needed)")
    if not len(val) and not user_only:  # nothing to compare the two bundles on (a --family whose rows are all gone)
        fams = bundle.meta.get("retrained_families") or sorted(bundle.families) or ["any"]
        refused.append(f"no validation rows for famil{'ies' if len(fams) > 1 else 'y'} {', '.join(fams)}, so the new "
                       "bundle cannot be shown no worse")
    if refused:
        return False, f"kept the existing bundle: {'; '.join(refused)}", {
            "gate_rows": float(len(val)), "gate_user_rows": float(n_user), "gate_shared_rows": float(n_shared)}
    new_pred = new_pred if new_pred is not None and len(new_pred) == len(val) else evaluate(bundle, val, specs)
    new_ape = new_pred["ape"].to_numpy()
    old_ape = old_pred["ape"].to_numpy()
    diff, se = paired_bootstrap(new_ape, old_ape)
    m = {"gate_new_mape_pct": float(np.mean(new_ape) * 100), "gate_old_mape_pct": float(np.mean(old_ape) * 100),
         "gate_rows": float(len(val)), "gate_user_rows": float(n_user), "gate_shared_rows": float(n_shared),
         "gate_paired_diff_pct_points": diff * 100, "gate_paired_se_pct_points": se * 100}
    worse, skipped = [], []
    for p in ("shared", "user"):
        sel = part == p
        if sel.sum() < MIN_GATE_ROWS:
            if sel.any():
                skipped.append(f"your {int(sel.sum())} held-out row(s) are too few (< {MIN_GATE_ROWS}) to be judged "
                               "on their own: counted in the total only" if p == "user" else
                               f"the {int(sel.sum())} shared row(s) are too few to be judged on their own")
            continue
        n_, o_ = float(np.mean(new_ape[sel])), float(np.mean(old_ape[sel]))
        m[f"gate_{p}_new_mape_pct"], m[f"gate_{p}_old_mape_pct"] = n_ * 100, o_ * 100
        if n_ > o_ * (1 + PART_TOLERANCE):
            worse.append(f"{p} rows {n_*100:.2f}% vs {o_*100:.2f}%")
    summary = (f"{m['gate_new_mape_pct']:.3f}% vs {m['gate_old_mape_pct']:.3f}% MAPE on {used}; paired difference "
               f"{diff * 100:+.3f} +- {se * 100:.3f} points (bootstrap standard error)")
    if skipped:
        summary += "; " + "; ".join(skipped)
    if diff > GATE_NOISE_SE * se:
        return False, (f"kept the existing bundle: the new one validates worse, by more than {GATE_NOISE_SE:g} "
                       f"standard errors ({summary})"), m
    if worse:
        return False, f"kept the existing bundle: the new one regresses {'; '.join(worse)} ({summary})", m
    if diff > 0:
        return True, (f"new bundle validates no worse within noise: worse by at most {GATE_NOISE_SE:g} standard "
                      f"errors ({summary})"), m
    return True, f"new bundle validates no worse ({summary})", m
