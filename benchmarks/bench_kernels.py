#!/usr/bin/env python3
"""Throughput of `predict_kernels` (and, with --train, the wall time of a quick retraining).

    python3 benchmarks/bench_kernels.py                      # 100,000 kernels on H100-SXM5-80GB
    python3 benchmarks/bench_kernels.py --rows 20000 --device L4
    python3 benchmarks/bench_kernels.py --distinct           # worst case: (nearly) every kernel different
    python3 benchmarks/bench_kernels.py --train              # + `wattcast train kernels --quick --no-mlflow`
    python3 benchmarks/bench_kernels.py --train --mlruns mlruns   # + train_seconds of the runs logged there

The kernels are random but valid, mixed like a transformer: ~40% GEMM (bmm/linear, fp32/bf16/fp16),
~40% elementwise (add, addu, mul, mulu, gelu, relu, tanh, div), ~10% LayerNorm, ~10% softmax.
Shapes come from a few common sizes, so like a real model trace the table repeats kernels (about 2%
of the rows are distinct); --distinct draws shapes from wide ranges instead, so nearly every row is a
different kernel: `predict_kernels` featurises and predicts each distinct kernel once, so this is its
worst case. Each figure is the median of --repeats runs after one warm-up run. The prediction time is
split into its stages, timed alone on the same rows: finding the distinct input rows (identical in every
column read), normalising those, finding the distinct kernels among them, featurize_kernels and the model
part (per-family surrogate prediction, each distinct feature row once, + the out-of-distribution check) on
the rows that are predicted, and the rest (copying predictions to repeated rows, assembling the output frame). The CPU time of the whole call (all threads) and the load
average are printed too: on a shared machine the wall times move with other work, CPU seconds much less.
LightGBM families predict through the compiled forest (models/lgbm_forest.py, bit-identical to LightGBM)
from models.kernel_surrogates.COMPILED_MIN_ROWS rows; the per-family lines time both it and LightGBM's own
Booster.predict. WATTCAST_NO_NUMBA=1 measures the plain LightGBM path.
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

#: the kernels issue's goals, rows/s on 2 cores: >= 1 M rows/s on a transformer-like table (repeated shapes) and
#: >= 100 k rows/s when (nearly) every kernel differs (--distinct); until stop 59 one 200,000 target served both
TARGET_ROWS_PER_S = {"repeated": 1_000_000, "distinct": 100_000}
ELEMENTWISE = ("add", "addu", "mul", "mulu", "gelu", "relu", "tanh", "div")


def random_kernels(n: int, seed: int = 0, distinct: bool = False) -> pd.DataFrame:
    """``n`` valid kernels in the `wattcast kernels` input schema (OPName, dtype, shape columns).

    With ``distinct``, sizes are drawn from wide ranges rather than a few common values, so (nearly)
    every row is a different kernel.
    """
    rng = np.random.default_rng(seed)
    kind = rng.choice(["gemm", "elementwise", "ln", "softmax"], size=n, p=[0.4, 0.4, 0.1, 0.1])
    pow2 = lambda lo, hi, size: 2 ** rng.integers(lo, hi + 1, size=size)  # noqa: E731
    if distinct:  # same ranges, any whole number in them
        pow2 = lambda lo, hi, size: rng.integers(2**lo, 2**hi + 1, size=size)  # noqa: E731
    hidden = rng.choice([768, 1024, 1600, 2048, 4096, 5120, 8192], size=n)
    if distinct:
        hidden = rng.integers(768 // 64, 8192 // 64 + 1, size=n) * 64
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


def timed(fn, repeats: int, clock=time.perf_counter) -> tuple[float, object]:
    """Median seconds (wall, or ``clock``) of ``repeats`` calls after one warm-up call; also the last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        t = clock()
        out = fn()
        times.append(clock() - t)
    return statistics.median(times), out


def load_avg() -> str:
    """The 1- and 5-minute load averages (a busy machine slows every figure here), or '?' where unknown."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "?"
    return f"{one:.2f} / {five:.2f}"


def bench_predict(rows: int, device: str, repeats: int, distinct: bool = False) -> None:
    from wattcast.data.catalog import resolve_device
    from wattcast.featurize.kernel_features import featurize_kernels
    from wattcast.models import kernel_predictor as kp
    from wattcast.models.kernel_bundle import load_bundle
    from wattcast.models.kernel_predictor import normalise_kernel_frame, predict_kernels
    from wattcast.models.kernel_surrogates import distinct_matrix_rows

    spec = resolve_device(device)
    bundle = load_bundle()
    frame = random_kernels(rows, distinct=distinct)
    mix = frame["OPName"].map(lambda o: "gemm" if o in ("bmm", "linear") else ("elementwise" if o in ELEMENTWISE else o))
    print(f"wattcast predict_kernels benchmark: {rows:,} kernels on {spec.name}; "
          f"{os.cpu_count()} CPU core(s) visible; median of {repeats} runs after 1 warm-up; load average (1/5 min) {load_avg()}")
    print("  mix: " + ", ".join(f"{k} {v / rows:.0%}" for k, v in mix.value_counts().items()))

    t_total, out = timed(lambda: predict_kernels(frame, spec, bundle=bundle), repeats)
    # CPU seconds of the process (all its threads): less sensitive than wall time to other work on the machine
    cpu_total, _ = timed(lambda: predict_kernels(frame, spec, bundle=bundle), repeats, clock=time.process_time)
    assert len(out) == rows and (out["error"] == "").all(), out.loc[out["error"] != "", "error"].head().tolist()
    # the rows predict_kernels normalises: one per distinct input row (or all when nearly all differ)
    t_input, in_groups = timed(lambda: kp._distinct_input_rows(frame), repeats)
    inputs = frame if in_groups is None else frame.iloc[in_groups[0]]
    t_norm, (canon, _) = timed(lambda: normalise_kernel_frame(inputs), repeats)
    t_group, groups = timed(lambda: kp._distinct_rows(canon, 1.0 if in_groups is not None else kp._DEDUP_MAX_DISTINCT),
                            repeats)
    # the rows predict_kernels featurises and predicts: one per distinct kernel (or all when nearly all differ)
    pred_rows = canon if groups is None else canon.iloc[groups[0]]
    n_distinct = len(pred_rows)
    print(f"  distinct kernels: {n_distinct:,} of {rows:,} rows ({n_distinct / rows:.1%})"
          + ("" if in_groups is not None or groups is not None else "; predicted row by row (too few repeats to dedupe)"))
    t_feat, X = timed(lambda: featurize_kernels(pred_rows, spec), repeats)
    t_model, _ = timed(lambda: kp._predict_features(X, bundle, pred_rows["dtype"], device=spec), repeats)

    fam = X["family"].to_numpy()
    mats = {}
    for f in pd.unique(fam):
        fm = bundle.families.get(f)
        if fm is not None:
            r = np.flatnonzero(fam == f)
            cols = kp._family_columns(fm, X)
            A = kp._family_matrix(X, cols, r)
            mats[f] = (fm, A[:, : len(fm.features)], A, cols)

    def surrogates():
        for fm, A, _, _ in mats.values():
            fm.predict_log_ratio_matrix(A)

    def ood():
        for fm, _, V, sup in mats.values():
            fm.ood_mask_matrix(V, sup)

    t_pred, _ = timed(surrogates, repeats)
    t_ood, _ = timed(ood, repeats)
    rate = rows / t_total
    rest = max(t_total - t_input - t_norm - t_group - t_feat - t_model, 0.0)
    kind = "distinct" if distinct else "repeated"
    target = TARGET_ROWS_PER_S[kind]
    cpu_rate = rows / cpu_total
    print(f"\n  predict_kernels total   {t_total * 1e3:9.1f} ms   {rate:12,.0f} rows/s   "
          f"(the kernels issue's target for {kind} shapes: {target:,} rows/s on 2 cores: by wall clock "
          f"{'met' if rate >= target else 'NOT met'}, {rate / target:.2f}x)")
    print(f"  predict_kernels CPU time {cpu_total * 1e3:9.1f} ms   {cpu_rate:12,.0f} rows per CPU second (all threads; "
          f"{cpu_rate / target:.2f}x the target per CPU second, which other jobs on the machine move less)")
    print(f"  split (each stage timed alone; rows/s counts all {rows:,} input rows):")
    for name, t in (("find distinct input rows", t_input), ("normalise those rows", t_norm),
                    ("find distinct kernels", t_group),
                    ("featurize_kernels", t_feat), ("model: surrogates + OOD", t_model),
                    ("  surrogates alone", t_pred), ("  OOD check alone", t_ood), ("assemble output (rest)", rest)):
        print(f"    {name:26s} {t * 1e3:9.1f} ms  {t / t_total:6.1%}   {rows / t if t > 0 else float('inf'):12,.0f} rows/s")
    print("  surrogates per family on the predicted rows' distinct feature rows (chosen model; LightGBM and MLP timed alone; lgbm = the path\n"
          "  predict_kernels takes, the compiled forest from models.kernel_surrogates.COMPILED_MIN_ROWS rows, booster =\n"
          "  LightGBM's own Booster.predict on all cores):")
    for f in pd.unique(fam):
        if f not in mats:
            print(f"    {f:12s} roofline fallback  {int((fam == f).sum()):9,d} rows")
            continue
        fm, A, _, _ = mats[f]
        n_rows = len(A)
        same = distinct_matrix_rows(np.ascontiguousarray(A))  # the members predict each distinct feature row once
        A = np.ascontiguousarray(A if same is None else A[same[0]])
        parts = []
        for name, m in (("lgbm", fm.lgbm), ("mlp", fm.mlp)):
            if m is not None and (fm.choice == name or fm.choice == "ens"):
                t_m, _ = timed(lambda: m.predict_matrix(A), repeats)
                parts.append(f"{name} {t_m * 1e3:7.1f} ms")
                if name == "lgbm":
                    t_b, _ = timed(lambda: m.booster.predict(A, num_threads=0), repeats)
                    parts.append(f"(booster {t_b * 1e3:7.1f} ms)")
        print(f"    {f:12s} {fm.choice:5s} {n_rows:9,d} rows ({len(A):,d} distinct feature rows)   " + "   ".join(parts))
    print(f"  rows flagged out of distribution: {out['ood'].mean():.1%}")
    print(f"  load average (1/5 min) at the end: {load_avg()}")


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
    ap.add_argument("--distinct", action="store_true", help="(nearly) every kernel different: the worst case")
    ap.add_argument("--train", action="store_true", help="also time `wattcast train kernels --quick --no-mlflow`")
    ap.add_argument("--mlruns", type=Path, default=None, help="with --train: print train_seconds of the runs in this MLflow store")
    a = ap.parse_args()
    bench_predict(a.rows, a.device, a.repeats, a.distinct)
    if a.train:
        bench_train(a.mlruns)


if __name__ == "__main__":
    main()
