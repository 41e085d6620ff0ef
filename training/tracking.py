"""MLflow logging shared by every training and validation job: one run in the repository's local store.

The store is ``sqlite:///<tracking_dir>/mlflow.db`` with artifacts under ``<tracking_dir>/artifacts``; each
job names its experiment. Tables, figures and JSON documents are written to a temporary folder and logged
as artifacts (summaries and plots only: per-row measurements belong to the datasets).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

#: a figure writer: given a folder, writes one or more PNGs into it and returns their path(s)
FigureWriter = Callable[[Path], "Path | list[Path]"]


def log_run(tracking_dir: str | Path, *, experiment: str, params: Mapping[str, Any], metrics: Mapping[str, float],
            tags: Mapping[str, str], tables: Mapping[str, pd.DataFrame | None] | None = None,
            figures: Sequence[FigureWriter] = (), documents: Mapping[str, Any] | None = None,
            table_index: bool = False) -> str:
    """Log one run; returns its id. ``tables`` -> ``<name>.csv`` (empty or None ones skipped; ``table_index``
    keeps the frame index), ``documents`` -> ``<name>`` as JSON, ``figures`` -> whatever each writer saves."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    import mlflow

    tracking_dir = Path(tracking_dir)
    tracking_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as td:
        folder = Path(td)
        arts: list[Path] = []
        for name, t in (tables or {}).items():
            if t is None or t.empty:
                continue
            p = folder / f"{name}.csv"
            t.to_csv(p, index=table_index)
            arts.append(p)
        for write in figures:
            out = write(folder)
            arts += out if isinstance(out, list) else [out]
        for name, doc in (documents or {}).items():
            p = folder / name
            p.write_text(json.dumps(doc, indent=1, default=str))
            arts.append(p)
        mlflow.set_tracking_uri(f"sqlite:///{tracking_dir.resolve() / 'mlflow.db'}")
        # one process at a time creates the store (MLflow's schema migration on a fresh sqlite file) and the
        # experiment: concurrent jobs on a new store otherwise race and crash
        with _store_lock(tracking_dir):
            exp = mlflow.get_experiment_by_name(experiment)
            if exp is None:
                exp_id = mlflow.create_experiment(experiment, artifact_location=(tracking_dir.resolve() / "artifacts").as_uri())
            else:
                exp_id = exp.experiment_id
        with mlflow.start_run(experiment_id=exp_id) as run:
            mlflow.log_params(dict(params))
            # the code that produced the run (MLflow's own tag name for it)
            mlflow.set_tags({"mlflow.source.git.commit": git_commit(), **dict(tags)})
            clean = {k.replace("%", "pct").replace(" ", "_"): float(v) for k, v in metrics.items()
                     if v is not None and np.isfinite(v)}
            mlflow.log_metrics(clean)
            for a in arts:
                mlflow.log_artifact(str(a))
            run_id = run.info.run_id
    relativise_artifact_paths(tracking_dir)
    return run_id


def git_commit(short: bool = False) -> str:
    """The checked-out commit of the repository this code runs from (``unknown`` outside a git checkout);
    ``short``: git's abbreviated hash."""
    import subprocess

    try:
        r = subprocess.run(["git", "rev-parse", *(["--short"] if short else []), "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                           text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class _store_lock:
    """An exclusive file lock on ``<tracking_dir>/.mlflow.lock`` (fcntl; released on exit)."""

    def __init__(self, tracking_dir: Path) -> None:
        self.path = Path(tracking_dir) / ".mlflow.lock"

    def __enter__(self):
        import fcntl

        self.f = open(self.path, "a+")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        import fcntl

        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def relativise_artifact_paths(tracking_dir: Path) -> None:
    """Store artifact locations relative to the tracking folder's parent (the repository root), so the
    committed store opens with ``mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db`` from any clone.
    Only when that parent is the working directory (where the relative paths will be read from)."""
    import sqlite3

    tracking_dir = Path(tracking_dir).resolve()
    if tracking_dir.parent != Path.cwd().resolve():
        return  # relative paths would resolve against the wrong folder: keep them absolute
    prefix = tracking_dir.as_uri()
    rel = tracking_dir.name
    con = sqlite3.connect(str(tracking_dir / "mlflow.db"))
    try:
        for table, col in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
            for absolute in (prefix, str(tracking_dir)):
                con.execute(f"UPDATE {table} SET {col} = REPLACE({col}, ?, ?) WHERE {col} LIKE ?", (absolute, rel, absolute + "%"))
        con.commit()
    finally:
        con.close()


def scatter_pred_vs_measured(ax, lim_frames: Sequence[pd.DataFrame], band: float, xlabel: str, ylabel: str, title: str) -> None:
    """Log-log predicted-vs-measured axes: identity line, +/- ``band`` dotted lines, limits from the frames'
    ``measured_ms``/``predicted_ms``. The caller scatters its points first."""
    both = pd.concat([f[["measured_ms", "predicted_ms"]] for f in lim_frames])
    lim = [both.min().min() * 0.8, both.max().max() * 1.25]
    ax.plot(lim, lim, "k-", lw=0.8)
    for f in (1 - band, 1 + band):
        ax.plot(lim, [lim[0] * f, lim[1] * f], "k:", lw=0.6)
    ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize=8)
