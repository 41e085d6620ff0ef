#!/usr/bin/env python3
"""Throughput of `predict_kernels` (and, with --train, the wall time of a quick retraining).

    python3 benchmarks/bench_kernels.py                      # 100,000 kernels on H100-SXM5-80GB
    python3 benchmarks/bench_kernels.py --rows 20000 --device L4
    python3 benchmarks/bench_kernels.py --train              # + `wattcast train kernels --quick --no-mlflow`
    python3 benchmarks/bench_kernels.py --train --mlruns mlruns   # + train_seconds of the runs logged there

The kernels are random but valid, mixed like a transformer: ~40% GEMM (bmm/linear, fp32/bf16/fp16),
~40% elementwise (add, addu, mul, mulu, gelu, relu, tanh, div), ~10% LayerNorm, ~10% softmax.
Each figure is the median of --repeats runs after one warm-up run. The prediction time is split into
its stages, timed alone on the same rows: normalising the input frame, featurize_kernels, and the
model part (per-family surrogate prediction + the out-of-distribution check).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

TARGET_ROWS_PER_S = 200_000
ELEMENTWISE = ("add", "addu", "mul", "mulu", "gelu", "relu", "tanh", "div")


def random_kernels(n: int, seed: int = 0) -> pd.DataFrame:
    """``n`` valid kernels in the `wattcast kernels` input schema (OPName, dtype, shape columns)."""
    rng = np.random.default_rng(seed)
    kind = rng.choice(["gemm", "elementwise", "ln", "softmax"], size=n, p=[0.4, 0.4, 0.1, 0.1])
    pow2 = lambda lo, hi, size: 2 ** rng.integers(lo, hi + 1, size=size)  # noqa: E731
    hidden = rng.choice([768, 1024, 1600, 2048, 4096, 5120, 8192], size=n)
    tokens = pow2(7, 15, n)  # 128 .. 32768 tokens
    op = np.where(kind == "gemm", rng.choice(["bmm", "linear"], size=n),
                  np.where(kind == "elementwise", rng.choice(ELEMENTWISE, size=n), kind))
    dtype = np.where(kind == "gemm", rng.choice(["fp32", "bf16", "fp16"], size=n, p=[0.5, 0.3, 0.2]), "fp32")
    is_bmm = op == "bmm"
    heads = rng.choice([12, 16, 32, 40, 64], size=n)
    head_dim = rng.choice([64, 128], size=n)
    seq = pow2(7, 12, n)
    df = pd.DataFrame({
        "OPName": op,
        "dtype": dtype,
        # bmm: attention (batch*heads, seq, head_dim) x (head_dim, seq); linear: (tokens, hidden) x (hidden, ff)
        "B": np.where(kind == "gemm", np.where(is_bmm, rng.integers(1, 9, size=n) * heads, 1), tokens).astype(float),
        "M": np.where(kind == "gemm", np.where(is_bmm, seq, tokens), np.nan),
        "N": np.where(kind == "gemm", np.where(is_bmm, head_dim, hidden), np.nan),
        "K": np.where(kind == "gemm", np.where(is_bmm, seq, hidden * rng.choice([1, 3, 4], size=n)), np.nan),
        "H": np.where(kind == "gemm", np.nan, np.where(kind == "softmax", seq, hidden * np.where(op == "gelu", 4, 1))),
    })
    return df


def timed(fn, repeats: int) -> tuple[float, object]:
    """Median wall seconds of ``repeats`` calls after one warm-up call; also the last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def bench_predict(rows: int, device: str, repeats: int) -> None:
    from wattcast.data.catalog import resolve_device
    from wattcast.featurize.kernel_features import featurize_kernels
    from wattcast.models.kernel_bundle import load_bundle
    from wattcast.models.kernel_predictor import normalise_kernel_frame, predict_kernels

    spec = resolve_device(device)
    bundle = load_bundle()
    frame = random_kernels(rows)
    mix = frame["OPName"].map(lambda o: "gemm" if o in ("bmm", "linear") else ("elementwise" if o in ELEMENTWISE else o))
    print(f"wattcast predict_kernels benchmark: {rows:,} kernels on {spec.name}; "
          f"{os.cpu_count()} CPU core(s) visible; median of {repeats} runs after 1 warm-up")
    print("  mix: " + ", ".join(f"{k} {v / rows:.0%}" for k, v in mix.value_counts().items()))

    t_total, out = timed(lambda: predict_kernels(frame, spec, bundle=bundle), repeats)
    assert len(out) == rows and (out["error"] == "").all(), out.loc[out["error"] != "", "error"].head().tolist()
    t_norm, (canon, _) = timed(lambda: normalise_kernel_frame(frame), repeats)
    t_feat, X = timed(lambda: featurize_kernels(canon, spec), repeats)

    fam = X["family"].to_numpy()
    groups = {f: X[fam == f] for f in pd.unique(fam)}

    def model_part():
        for f, Xf in groups.items():
            fm = bundle.families.get(f)
            if fm is not None:
                fm.predict_log_ratio(Xf)
                fm.ood_mask(Xf)

    def stage(method):
        def run():
            for f, Xf in groups.items():
                fm = bundle.families.get(f)
                if fm is not None:
                    getattr(fm, method)(Xf)
        return run

    t_model, _ = timed(model_part, repeats)
    t_pred, _ = timed(stage("predict_log_ratio"), repeats)
    t_ood, _ = timed(stage("ood_mask"), repeats)
    rate = rows / t_total
    rest = max(t_total - t_norm - t_feat - t_model, 0.0)
    print(f"\n  predict_kernels total   {t_total * 1e3:9.1f} ms   {rate:12,.0f} rows/s   "
          f"(target {TARGET_ROWS_PER_S:,} rows/s on 2 cores: {'met' if rate >= TARGET_ROWS_PER_S else 'NOT met'}, "
          f"{rate / TARGET_ROWS_PER_S:.2f}x)")
    print("  split (each stage timed alone on the same rows):")
    for name, t in (("normalise input frame", t_norm), ("featurize_kernels", t_feat),
                    ("model: surrogates + OOD", t_model), ("  surrogates alone", t_pred),
                    ("  OOD check alone", t_ood), ("assemble output (rest)", rest)):
        print(f"    {name:26s} {t * 1e3:9.1f} ms  {t / t_total:6.1%}   {rows / t if t > 0 else float('inf'):12,.0f} rows/s")
    print("  surrogates per family (chosen model; LightGBM and MLP timed alone):")
    for f, Xf in groups.items():
        fm = bundle.families.get(f)
        if fm is None:
            print(f"    {f:12s} roofline fallback  {len(Xf):9,d} rows")
            continue
        parts = []
        for name, m in (("lgbm", fm.lgbm), ("mlp", fm.mlp)):
            if m is not None and (fm.choice == name or fm.choice == "ens"):
                t_m, _ = timed(lambda: m.predict(Xf), repeats)
                parts.append(f"{name} {t_m * 1e3:7.1f} ms")
        print(f"    {f:12s} {fm.choice:5s} {len(Xf):9,d} rows   " + "   ".join(parts))
    print(f"  rows flagged out of distribution: {out['ood'].mean():.1%}")


def bench_train(mlruns: Path | None) -> None:
    print("\nwattcast train kernels --quick --no-mlflow (shared datasets):")
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true", HF_HUB_OFFLINE="1")
    with tempfile.TemporaryDirectory(prefix="wattcast-bench-") as td:
        cmd = [sys.executable, "-m", "wattcast.cli", "train", "kernels", "--quick", "--no-mlflow", "--out", str(Path(td) / "bundle")]
        t = time.perf_counter()
        r = subprocess.run(cmd, cwd=td, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
    status = "ok" if r.returncode == 0 else f"FAILED (exit {r.returncode})"
    print(f"  wall time {wall:.1f} s  [{status}]")
    if r.returncode != 0:
        print("  " + "\n  ".join((r.stderr or r.stdout).strip().splitlines()[-8:]))
    print("  The full (non --quick) training's wall time is logged by `wattcast train kernels` as the MLflow\n"
          "  metric `train_seconds` of its run (mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db).")
    if mlruns is None:
        return
    db = Path(mlruns) / "mlflow.db"
    if not db.is_file():
        print(f"  (no MLflow store at {db})")
        return
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{db.resolve()}")
    runs = mlflow.search_runs(search_all_experiments=True, order_by=["start_time DESC"], max_results=5)
    if "metrics.train_seconds" not in runs:
        print(f"  (no run with train_seconds in {db})")
        return
    print(f"  latest runs in {db}:")
    for _, r in runs.iterrows():
        rounds = r.get("params.cfg_lgbm_rounds", "?")
        print(f"    {r['run_id'][:8]}  {str(r['start_time'])[:19]}  train_seconds {r['metrics.train_seconds']:8.1f}  lgbm_rounds {rounds}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--device", default="H100-SXM5-80GB")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train", action="store_true", help="also time `wattcast train kernels --quick --no-mlflow`")
    ap.add_argument("--mlruns", type=Path, default=None, help="with --train: print train_seconds of the runs in this MLflow store")
    a = ap.parse_args()
    bench_predict(a.rows, a.device, a.repeats)
    if a.train:
        bench_train(a.mlruns)


if __name__ == "__main__":
    main()
