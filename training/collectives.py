"""`wattcast train collectives`: fit the learned correction of the collective alpha-beta model.

load (``wattcast.data.collective_datasets``) -> median time per (cluster, collective, nodes, GPUs per node,
size) over repeated runs -> target log(measured / auto alpha-beta) -> LightGBM -> leave-one-configuration-out
(a configuration = (collective, nodes, gpus_per_node)) MAPE per collective and scale, learned vs alpha-beta
alone -> evaluation (never training) on Polaris -> MLflow (experiment ``collectives``) -> gated write of
``models/artifacts/collective_{correction.txt,manifest.json}``.

Training rows: H100 rows whose site maps to a cluster preset (``DGX-H100``). Polaris has no licence: it is
evaluated only. The example-cluster00 rows (undocumented, ~3x slower fabric) have no preset and are left out.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.collective_datasets import PROFILE_LICENCE, load_profile_collectives, profile_counts_text
from wattcast.models.collectives import (
    CATEGORICAL,
    COLLECTIVES,
    FEATURES,
    MANIFEST,
    CollectiveModel,
    alpha_beta,
    collective_query,
    correction_features,
    install_collective_model,
    link_params,
    shipped_folder,
)

TRAIN_CLUSTERS = ("DGX-H100",)
#: Polaris setup evaluated primarily (5 = the best-tuned NCCL/libfabric settings)
POLARIS_SETUP = "5"
#: sizes below this were never measured on the H100 clusters: the correction is out of support there
H100_MIN_SIZE = 32 * 2**20
GATE_TOLERANCE_PCT = 1e-6
#: the gate on other data also refuses a model that is this much (relative) worse on either part of the rows
#: (the shipped dataset's, the imported profiles'), however much the other part gains
PART_TOLERANCE = 0.05
#: a part is checked when it has at least this many (config, size) rows
PART_MIN_ROWS = 5

LGBM_PARAMS = {
    "objective": "l2",
    "learning_rate": 0.05,
    "num_leaves": 8,
    "max_depth": 4,
    "min_data_in_leaf": 20,
    "min_data_per_group": 10,
    "cat_smooth": 1.0,
    "lambda_l2": 1.0,
    "feature_fraction": 1.0,
    "verbose": -1,
    "num_threads": 1,
    "seed": 0,
    "deterministic": True,
    "force_row_wise": True,
}
ROUNDS = 100
QUICK_ROUNDS = 40


# ------------------------------------------------------------------------------------------ table
def aggregate(df: pd.DataFrame) -> pd.DataFrame:
    """Median out-of-place time per (cluster, op, nodes, gpus_per_node, size_B) over repeated runs."""
    keys = ["cluster", "op", "nodes", "gpus_per_node", "size_B"]
    g = df.groupby(keys, sort=True)
    out = g["time_us"].agg(time_us="median", runs="size").reset_index()
    # a (config, size) with any imported profile row in it is part of the imported rows (gate and metrics per part)
    out["imported"] = (df["licence"].eq(PROFILE_LICENCE).groupby([df[k] for k in keys], sort=True).any().to_numpy()
                       if "licence" in df else False)
    out["world_size"] = out["nodes"] * out["gpus_per_node"]
    out["config"] = out["op"] + "@" + out["nodes"].astype(str) + "x" + out["gpus_per_node"].astype(str)
    out["scale"] = out["nodes"].astype(str) + "x" + out["gpus_per_node"].astype(str)
    return out


def baseline(frame: pd.DataFrame):
    """(AlphaBeta, feature matrix) for the rows of ``frame`` (any mix of clusters), rows in frame order."""
    n = len(frame)
    us, floor, X = np.empty(n), np.empty(n), np.empty((n, len(FEATURES)))
    for cl, idx in frame.groupby("cluster", sort=False).indices.items():
        sub = frame.iloc[idx]
        q = collective_query(sub["op"].to_numpy(), sub["size_B"].to_numpy(float), sub["world_size"].to_numpy(float),
                   sub["gpus_per_node"].to_numpy(float), cl)
        ab = alpha_beta(q, "auto")
        us[idx], floor[idx], X[idx] = ab.us, ab.floor_us, correction_features(ab)
    return us, floor, X


def _fingerprint(df: pd.DataFrame) -> str:
    h = pd.util.hash_pandas_object(df.reset_index(drop=True), index=False).to_numpy()
    return hashlib.sha256(h.tobytes()).hexdigest()[:16]


def _fit(X: np.ndarray, y: np.ndarray, w: np.ndarray, rounds: int):
    import lightgbm as lgb

    ds = lgb.Dataset(X, label=y, weight=w, feature_name=list(FEATURES),
                     categorical_feature=[FEATURES.index(c) for c in CATEGORICAL], free_raw_data=True,
                     params={"max_bin": 63, "min_data_in_bin": 1, "verbose": -1})
    return lgb.train(LGBM_PARAMS, ds, num_boost_round=rounds)


def _weights(frame: pd.DataFrame) -> np.ndarray:
    """Every configuration weighs the same, however many sizes it has."""
    cnt = frame.groupby("config")["config"].transform("size").to_numpy(float)
    return cnt.mean() / cnt


def _support(frame: pd.DataFrame) -> dict:
    lps = {cl: link_params(cl) for cl in frame["cluster"].unique()}
    tiers = sorted({(float(g > 1), float(nn > 1)) for g, nn in zip(frame["gpus_per_node"], frame["nodes"])})
    return {
        "ops": sorted(frame["op"].unique().tolist(), key=COLLECTIVES.index),
        "size_B": [float(frame["size_B"].min()), float(frame["size_B"].max())],
        "n_gpus": [float(frame["world_size"].min()), float(frame["world_size"].max())],
        "nodes": [float(frame["nodes"].min()), float(frame["nodes"].max())],
        "gpus_per_node": [float(frame["gpus_per_node"].min()), float(frame["gpus_per_node"].max())],
        "tiers": [list(t) for t in tiers],
        "links": [list(lp.link_vector()) for lp in lps.values()],
        "topologies": sorted({lp.topology for lp in lps.values()}),
        "clusters": sorted(lps),
        "configs": sorted(frame["config"].unique().tolist()),
    }


def _ape(pred, true) -> np.ndarray:
    return np.abs(np.asarray(pred) / np.asarray(true) - 1.0)


# ------------------------------------------------------------------------------------- evaluation
def loco(frame: pd.DataFrame, ab_us: np.ndarray, floor: np.ndarray, X: np.ndarray, rounds: int) -> np.ndarray:
    """Leave-one-configuration-out predictions (us) for every row of ``frame``."""
    y = np.log(frame["time_us"].to_numpy() / ab_us)
    w = _weights(frame)
    pred = np.empty(len(frame))
    for cfg, idx in frame.groupby("config", sort=True).indices.items():
        train = np.ones(len(frame), dtype=bool)
        train[idx] = False
        b = _fit(X[train], y[train], w[train], rounds)
        pred[idx] = np.maximum(ab_us[idx] * np.exp(b.predict(X[idx], num_threads=1)), floor[idx])
    return pred


def _table(frame: pd.DataFrame, cols: dict[str, str], by: list[str]) -> pd.DataFrame:
    g = frame.groupby(by, sort=False)
    out = g.size().rename("rows").to_frame()
    for name, col in cols.items():
        out[name] = g[col].mean() * 100
    return out.reset_index()


def _summary(frame: pd.DataFrame) -> pd.DataFrame:
    cols = {"loco_mape_pct": "ape_loco", "alpha_beta_mape_pct": "ape_ab", "in_sample_mape_pct": "ape_fit"}
    per = _table(frame, cols, ["op", "scale"]).rename(columns={"op": "collective"})
    per_op = _table(frame, cols, ["op"]).rename(columns={"op": "collective"}).assign(scale="all")
    per_scale = _table(frame, cols, ["scale"]).assign(collective="all")
    allrow = pd.DataFrame([{"collective": "all", "scale": "all", "rows": len(frame),
                            **{k: frame[v].mean() * 100 for k, v in cols.items()}}])
    order = {c: i for i, c in enumerate(COLLECTIVES + ("all",))}
    per = per.sort_values(["collective", "scale"], key=lambda s: s.map(order) if s.name == "collective" else s.map(_scale_key))
    out = pd.concat([per, per_op, per_scale, allrow], ignore_index=True)
    return out[["collective", "scale", "rows", "loco_mape_pct", "alpha_beta_mape_pct", "in_sample_mape_pct"]].round(2)


def _scale_key(s: str) -> int:
    try:
        a, b = s.split("x")
        return int(a) * 1000 + int(b)
    except ValueError:
        return 10**9


def evaluate_polaris(model: CollectiveModel, pol: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-row predictions, table per setup/op/nodes/size regime) of ``model`` on Polaris rows."""
    p = pol.copy()
    pred = model.predict(p["op"].to_numpy(), p["size_B"].to_numpy(float), p["world_size"].to_numpy(float),
                         p["gpus_per_node"].to_numpy(float), "Polaris")
    p["pred_us"], p["ab_us"], p["ood"] = pred.us, pred.alpha_beta_us, pred.ood
    p["ape_model"], p["ape_ab"] = _ape(p["pred_us"], p["time_us"]), _ape(p["ab_us"], p["time_us"])
    p["regime"] = np.where(p["size_B"] >= H100_MIN_SIZE, ">=32MiB", "<32MiB")
    cols = {"model_mape_pct": "ape_model", "alpha_beta_mape_pct": "ape_ab"}
    parts = [
        _table(p, cols, ["setup"]).assign(op="all", nodes="all", regime="all"),
        _table(p, cols, ["setup", "regime"]).assign(op="all", nodes="all"),
        _table(p, cols, ["setup", "op", "nodes"]).assign(regime="all"),
        _table(p, cols, ["setup", "op", "nodes", "regime"]),
    ]
    t = pd.concat(parts, ignore_index=True)[["setup", "op", "nodes", "regime", "rows", "model_mape_pct", "alpha_beta_mape_pct"]]
    t["nodes"] = t["nodes"].astype(str)
    return p, t.round(2)


def _plot(frame: pd.DataFrame, pol: pd.DataFrame | None, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = 3 if pol is not None and len(pol) else 2
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 5.2))
    panels = [("H100: learned, leave-one-config-out", frame, "pred_loco", "ape_loco"),
              ("H100: alpha-beta alone", frame, "ab_us", "ape_ab")]
    if n == 3:
        panels.append((f"Polaris setup {POLARIS_SETUP} (not trained on)", pol, "pred_us", "ape_model"))
    for ax, (title, d, col, ape) in zip(axes, panels):
        for op, gg in d.groupby("op"):
            ax.scatter(gg["time_us"], gg[col], s=9, alpha=0.7, label=f"{op} ({gg[ape].mean() * 100:.1f}%)")
        lo = max(1e-1, min(d["time_us"].min(), d[col].min()))
        hi = max(d["time_us"].max(), d[col].max())
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured time (us)")
        ax.set_ylabel("predicted time (us)")
        ax.set_title(f"{title}\nMAPE {d[ape].mean() * 100:.1f}%", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------- gate
def gate_decision(new: CollectiveModel, target: Path, frame: pd.DataFrame, new_metrics: dict, fingerprint: str,
                  force: bool = False):
    """(replace?, why, gate metrics). ``force``: replace whatever the gate says, the reason saying what it would have
    refused (training/gate_force.py ``verdict``). Same data as the old artifact's: compare leave-one-config-out MAPE (the
    held-out figure of each artifact's own training run); other data: compare both models on the current rows, overall
    and per part (the shipped dataset's rows, the imported profiles' rows): neither part may get worse by more than
    ``PART_TOLERANCE``. The old model is the target's live version (versioned or flat layout)."""
    from wattcast.models.collectives import resolve_collective_folder
    from wattcast.training.gate_force import verdict

    try:
        live = resolve_collective_folder(target)
        missing = None if (live / MANIFEST).is_file() else "no collective model at the target"
    except ValueError as e:  # a pointer to a missing version: there is no working model to keep
        missing = f"the existing collective model does not load ({e})"
    old = None
    if missing is None:
        try:
            old = CollectiveModel.load(target)
        except Exception as e:  # an unreadable old artifact is not a working model
            missing = f"the existing collective model does not load ({e})"
    if old is None:
        # a new --out: the working model is the shipped one, the model `predict` uses without --collectives (until
        # stop 54 a fresh folder was written unjudged: a x1000-slow fabric log became its model)
        from wattcast.training.gate_force import shipped_reference

        try:
            old = CollectiveModel.load(shipped_reference(target, shipped_folder()))
            if old.is_fallback:
                raise ValueError("no shipped model")
        except Exception:  # nothing to compare with (a stripped install, or the target is the shipped folder)
            return True, f"{missing}: {'writing the new one' if missing.startswith('no ') else 'replacing it'}", {}
    ok, why, m = _judge(new, old, frame, new_metrics, fingerprint)
    return (*verdict(ok, why, force, "collective model", "--collectives", against=missing), m)


def _judge(new: CollectiveModel, old: CollectiveModel, frame: pd.DataFrame, new_metrics: dict, fingerprint: str):
    """The gate proper (:func:`gate_decision`) with the working model ``old`` loaded."""
    m: dict[str, float] = {}
    old_loco = (old.manifest.get("metrics") or {}).get("loco_mape_pct")
    if old.manifest.get("dataset_fingerprint") == fingerprint and old_loco is not None:
        new_loco = new_metrics["loco_mape_pct"]
        m = {"gate_new_loco_mape_pct": new_loco, "gate_old_loco_mape_pct": float(old_loco)}
        what = f"leave-one-config-out MAPE {new_loco:.2f}% vs {float(old_loco):.2f}% (same data)"
        if new_loco > float(old_loco) + GATE_TOLERANCE_PCT:
            return False, f"kept the existing collective model: the new one validates worse ({what})", m
        return True, f"new collective model validates no worse ({what})", m
    args = (frame["op"].to_numpy(), frame["size_B"].to_numpy(float), frame["world_size"].to_numpy(float),
            frame["gpus_per_node"].to_numpy(float))
    try:
        apes = []
        for mod in (new, old):
            pred = np.empty(len(frame))
            for cl, idx in frame.groupby("cluster").indices.items():
                pred[idx] = mod.predict_us(*(a[idx] for a in args), cl)
            apes.append(_ape(pred, frame["time_us"]))
    except Exception as e:
        return True, f"the working collective model does not predict ({e}): replacing it", {}
    n_all, o_all = float(apes[0].mean() * 100), float(apes[1].mean() * 100)
    m = {"gate_new_mape_pct": n_all, "gate_old_mape_pct": o_all}
    imported = frame["imported"].to_numpy(bool) if "imported" in frame else np.zeros(len(frame), bool)
    worse = []
    for part, sel in (("shipped", ~imported), ("imported", imported)):
        if not sel.any():
            continue
        n_, o_ = float(apes[0][sel].mean() * 100), float(apes[1][sel].mean() * 100)
        m[f"gate_{part}_new_mape_pct"], m[f"gate_{part}_old_mape_pct"] = n_, o_
        if sel.sum() >= PART_MIN_ROWS and n_ > o_ * (1 + PART_TOLERANCE) + GATE_TOLERANCE_PCT:
            worse.append(f"{part} rows {n_:.2f}% vs {o_:.2f}%")
    what = f"{n_all:.2f}% vs {o_all:.2f}% MAPE on the {len(frame)} current rows (the old model was trained on other data)"
    if n_all > o_all + GATE_TOLERANCE_PCT:
        return False, f"kept the existing collective model: the new one validates worse ({what})", m
    if worse:
        return False, f"kept the existing collective model: the new one regresses {'; '.join(worse)} ({what})", m
    return True, f"new collective model validates no worse ({what})", m


# -------------------------------------------------------------------------------------------- run
def _refuse_heldout_clusters(imported: pd.DataFrame, profiles) -> None:
    """ValueError when imported rows were measured on a cluster of the project's held-out GPUs (L4, A100 80GB PCIe;
    by name or by the figures of the cluster's device spec: training/holdout.py): never trained on."""
    from wattcast.data.catalog import resolve_device
    from wattcast.data.cluster_spec import resolve_cluster
    from wattcast.training.holdout import heldout_twin

    for c in sorted(imported["cluster"].unique()):
        cl = resolve_cluster(c)
        try:
            twin = heldout_twin(resolve_device(cl.device))
        except Exception:  # a device the catalog cannot resolve: not a held-out catalog GPU
            twin = None
        if twin is not None:
            n = int((imported["cluster"] == c).sum())
            raise ValueError(
                f"--data {', '.join(map(str, profiles))}: {n:,} imported collective row(s) were measured on cluster "
                f"{cl.name}, whose GPU {cl.device} is {'' if twin == cl.device else f'(by its figures) '}the held-out "
                f"{twin}: the project's held-out GPUs (L4, A100 80GB PCIe) are never trained on. Nothing was trained "
                "or written")


def _placement_hint(counts: dict) -> str:
    """How to give the rows counted ``no placement`` their nodes / GPUs per node: a trace (or a log without
    ``# Rank`` lines) does not record them, ``profile import --gpus-per-node G [--nodes N]`` does."""
    from wattcast.data.profiles.importers import PLACEMENT_FLAGS

    if not counts.get("no_placement"):
        return ""
    return (f"; {counts['no_placement']:,} row(s) have no placement (nodes / gpus_per_node): re-import their files "
            f"with the profiled job's placement, `wattcast profile import FILE --output DIR {PLACEMENT_FLAGS}` (a trace "
            "does not record which node each rank ran on)")


def run_train_collectives(data=None, out_dir=None, tracking_dir="mlruns", use_mlflow: bool = True, quick: bool = False,
                          log=print, profiles=(), cluster=None, force: bool = False) -> dict:
    """Train, evaluate (leave-one-configuration-out on H100, alpha-beta alone, Polaris), log to MLflow and
    install the model as the target's new live version (models/collectives.py ``install_collective_model``) when it
    validates no worse than the existing one (or, at a new target, than the shipped one). ``force``: install it even
    when the gate refuses it (the reason says what it overrode), like ``train kernels --force``.

    ``profiles``: imported profile folders (``wattcast profile import`` / ``profile run``) whose ``collectives.csv``
    rows, measured on ``cluster`` (preset name or cluster file), join the training rows; rows that cannot be used are
    counted per reason (``result["imported"]``), and a ValueError says why when none can.

    Returns ``{"summary": DataFrame, "metrics": dict, "replaced": bool, "reason": str, "run_id": str|None,
    "tables": {name: DataFrame}, "out_dir": Path, "imported": counts or None}``."""
    from wattcast.data.collective_datasets import PROFILE_REASONS, load_collectives

    t0 = time.time()
    rounds = QUICK_ROUNDS if quick else ROUNDS
    profiles = [Path(p) for p in profiles or ()]
    imported, icounts = None, None
    if profiles:
        imported, icounts = load_profile_collectives(profiles, cluster)
        if icounts["used"] == 0:
            hint = ("; give the cluster they were measured on with --cluster NAME|FILE" if icounts["no_cluster"] else "")
            raise ValueError(f"--data {', '.join(map(str, profiles))}: no imported collective row can train the "
                             f"correction: {profile_counts_text(icounts)}{hint}{_placement_hint(icounts)}")
        _refuse_heldout_clusters(imported, profiles)
        log(f"collectives: {profile_counts_text(icounts)}, on cluster {imported['cluster'].iloc[0]}"
            f"{_placement_hint(icounts)}")
    elif cluster is not None:
        raise ValueError("--cluster names the cluster imported profile rows were measured on; give the profile "
                         "folder(s) with --data DIR (folders written by `wattcast profile import`)")
    raw = load_collectives(data)
    h100 = raw[raw["cluster"].isin(TRAIN_CLUSTERS) & (raw["licence"] != "") & raw["source"].str.contains("h100")]
    left_out = raw[raw["source"].str.contains("h100") & ~raw.index.isin(h100.index)]
    train_rows = h100 if imported is None else pd.concat([h100, imported], ignore_index=True)
    frame = aggregate(train_rows)
    if frame.empty:
        raise ValueError("no H100 collective rows with a cluster preset to train on")
    fp = _fingerprint(frame[["cluster", "op", "nodes", "gpus_per_node", "size_B", "time_us"]])
    log(f"collectives: {len(train_rows):,} runs -> {len(frame)} (config, size) medians in {frame['config'].nunique()} "
        f"configurations ({int(frame['imported'].sum())} with imported rows); left out {len(left_out):,} H100 rows "
        f"without a cluster preset ({', '.join(sorted(left_out['site'].unique())) or 'none'}); fingerprint {fp}")

    ab_us, floor, X = baseline(frame)
    frame["ab_us"], frame["floor_us"] = ab_us, floor
    frame["pred_loco"] = loco(frame, ab_us, floor, X, rounds)
    y = np.log(frame["time_us"].to_numpy() / ab_us)
    booster = _fit(X, y, _weights(frame), rounds)
    frame["pred_fit"] = np.maximum(ab_us * np.exp(booster.predict(X, num_threads=1)), floor)
    for k, c in (("ape_loco", "pred_loco"), ("ape_ab", "ab_us"), ("ape_fit", "pred_fit")):
        frame[k] = _ape(frame[c], frame["time_us"])
    summary = _summary(frame)

    metrics: dict[str, float] = {
        "loco_mape_pct": float(frame["ape_loco"].mean() * 100),
        "alpha_beta_mape_pct": float(frame["ape_ab"].mean() * 100),
        "in_sample_mape_pct": float(frame["ape_fit"].mean() * 100),
        "loco_config_mean_mape_pct": float(frame.groupby("config")["ape_loco"].mean().mean() * 100),
        "alpha_beta_config_mean_mape_pct": float(frame.groupby("config")["ape_ab"].mean().mean() * 100),
        "loco_max_config_mape_pct": float(frame.groupby("config")["ape_loco"].mean().max() * 100),
    }
    # against every run (not the medians): adds the run-to-run spread
    runs = train_rows.merge(frame[["cluster", "op", "nodes", "gpus_per_node", "size_B", "pred_loco", "ab_us"]],
                      on=["cluster", "op", "nodes", "gpus_per_node", "size_B"], how="left")
    metrics["loco_per_run_mape_pct"] = float(_ape(runs["pred_loco"], runs["time_us"]).mean() * 100)
    metrics["alpha_beta_per_run_mape_pct"] = float(_ape(runs["ab_us"], runs["time_us"]).mean() * 100)
    for _, r in summary.iterrows():
        if r["collective"] == "all" and r["scale"] == "all":
            continue
        key = f"{r['collective']}_{r['scale']}" if r["collective"] != "all" and r["scale"] != "all" else \
            (r["collective"] if r["scale"] == "all" else f"scale_{r['scale']}")
        metrics[f"loco_{key}_mape_pct"] = float(r["loco_mape_pct"])
        metrics[f"alpha_beta_{key}_mape_pct"] = float(r["alpha_beta_mape_pct"])

    imp = frame["imported"].to_numpy(bool)
    if imp.any():  # before/after on the user's own rows: held-out configuration, alpha-beta alone, in-sample
        metrics["loco_imported_mape_pct"] = float(frame.loc[imp, "ape_loco"].mean() * 100)
        metrics["alpha_beta_imported_mape_pct"] = float(frame.loc[imp, "ape_ab"].mean() * 100)
        metrics["in_sample_imported_mape_pct"] = float(frame.loc[imp, "ape_fit"].mean() * 100)
        metrics["loco_shipped_mape_pct"] = float(frame.loc[~imp, "ape_loco"].mean() * 100)
        metrics["imported_rows_used"] = float(icounts["used"])
        metrics["imported_rows_read"] = float(icounts["rows"])
        metrics["imported_medians"] = float(imp.sum())
        for k in PROFILE_REASONS:
            if icounts[k]:
                metrics[f"imported_left_out_{k}"] = float(icounts[k])

    trained_clusters = list(TRAIN_CLUSTERS)
    cluster_files = {}
    if imported is not None:
        from wattcast.data.cluster_spec import resolve_cluster

        for c in sorted(imported["cluster"].unique()):
            name = resolve_cluster(c).name
            if name != c:
                cluster_files[name] = c
            if name not in trained_clusters:
                trained_clusters.append(name)
    manifest = {
        "trained_on": {"clusters": trained_clusters, "source": "nccl-tests/h100 (xxrjun/nccl-tests-cluster)",
                       "licence": "Apache-2.0", "rows": int(len(h100)), "medians": int(len(frame)),
                       "configurations": int(frame["config"].nunique()),
                       **({"imported": {"profiles": [str(p) for p in profiles], "rows": int(icounts["used"]),
                                        "rows_read": int(icounts["rows"]), "medians": int(imp.sum()),
                                        "left_out": {k: int(icounts[k]) for k in PROFILE_REASONS if icounts[k]},
                                        "cluster_files": cluster_files,
                                        "licence": PROFILE_LICENCE}} if imported is not None else {})},
        "target": "log(measured out-of-place time / auto alpha-beta time)",
        "dataset_fingerprint": fp,
        "quick": bool(quick),
        "rounds": rounds,
        "lgbm_params": LGBM_PARAMS,
        "support": _support(frame),
    }
    model = CollectiveModel(booster, manifest)

    # Polaris: evaluation only (no licence); the shipped model never sees these rows
    tables: dict[str, pd.DataFrame] = {"loco_summary": summary}
    pol_rows = raw[raw["cluster"] == "Polaris"]
    pol_pred = None
    if len(pol_rows):
        pol_all, pol_table = evaluate_polaris(model, pol_rows)
        tables["polaris"] = pol_table
        pol_pred = pol_all[pol_all["setup"] == POLARIS_SETUP]
        for _, r in pol_table.iterrows():
            if r["setup"] == POLARIS_SETUP or (r["op"] == "all" and r["regime"] == "all"):
                key = "_".join(str(v) for v in (r["setup"], r["op"], r["nodes"], r["regime"]) if v != "all")
                key = key.replace(">=", "ge").replace("<", "lt")
                metrics[f"polaris_{key}_mape_pct"] = float(r["model_mape_pct"])
                metrics[f"polaris_{key}_alpha_beta_mape_pct"] = float(r["alpha_beta_mape_pct"])
    manifest["metrics"] = {k: float(v) for k, v in metrics.items() if k.startswith(("loco_mape", "alpha_beta_mape", "in_sample", "loco_config", "polaris_5_mape", "polaris_5_alpha"))}
    tables["loco_rows"] = frame.round(4)

    target = Path(out_dir) if out_dir else shipped_folder()
    replaced, reason, gate = gate_decision(model, target, frame, metrics, fp, force=force)
    metrics.update(gate)
    if replaced:
        model.manifest["metrics"] = manifest["metrics"]
        # a new version beside the old one, loaded and checked there, then one atomic pointer switch: a kill at any
        # moment leaves a working model live
        install_collective_model(model, target)
    else:  # kept apart for inspection, as train kernels/power keep theirs: <target>/collective_refused/<name>/
        from wattcast.models.collectives import REFUSED
        from wattcast.training.gate_force import keep_refused

        reason += keep_refused(lambda: install_collective_model(model, target, activate=False), target, REFUSED,
                               "collective model", "--collectives")
    metrics["train_seconds"] = time.time() - t0
    log(f"collectives: leave-one-config-out MAPE {metrics['loco_mape_pct']:.1f}% (alpha-beta alone "
        f"{metrics['alpha_beta_mape_pct']:.1f}%); {reason}")

    run_id = None
    if use_mlflow:
        from wattcast.training.tracking import log_run

        params = {
            "train_clusters": ",".join(TRAIN_CLUSTERS),
            "train_rows": len(train_rows),
            "train_medians": len(frame),
            "configurations": frame["config"].nunique(),
            "dataset_fingerprint": fp,
            "rounds": rounds,
            "quick": quick,
            "force": force,
            "polaris_setup": POLARIS_SETUP,
            "split": "leave-one-configuration-out (collective, nodes, gpus_per_node)",
            "profiles": ",".join(map(str, profiles)),
            "profile_cluster": "" if imported is None else ",".join(sorted(imported["cluster"].unique())),
            **{f"lgbm_{k}": v for k, v in LGBM_PARAMS.items()},
        }
        # per-row measurements (loco_rows) are the dataset's, not ours to publish
        run_id = log_run(tracking_dir, experiment="collectives", params=params, metrics=metrics,
                         tags={"replaced": str(replaced), "gate": reason, "polaris": "evaluation only (no licence)"},
                         tables={k: v for k, v in tables.items() if k != "loco_rows"},
                         figures=[lambda d: _plot(frame, pol_pred, d / "pred_vs_measured.png")],
                         documents={"collective_manifest.json": model.manifest})
    return {"summary": summary, "metrics": metrics, "replaced": replaced, "reason": reason, "run_id": run_id,
            "tables": tables, "out_dir": target, "imported": icounts}
