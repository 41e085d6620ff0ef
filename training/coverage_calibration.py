"""Per-dtype device coverage of the matmul families: ``python -m wattcast.training.coverage_calibration``.

The generation calibration (training/generation_calibration.py) checks a GEMM row's device descriptors against the
training GPUs of its dtype *class* (tensor-core or FP32). Within the tensor-core class the rate descriptors differ by
dtype (a GPU's fp8 peak is twice its bf16 one), so a bf16 query was covered up to the fp8 peaks of the training GPUs:
audit 58d's B200 x 1.5 spec at 3,375 bf16 TFLOP/s, above every bf16 peak any GPU was measured at (MI355X 2,517), was
in distribution because fp8 rows stretched the tensor-core range to 8,230.

Here, per matmul family and tensor-core dtype (bf16 and fp16 as one: ``models/coverage.py`` ``DTYPE_GROUP``), the descriptors that depend on the dtype (the peak, the ridge point,
watts per TFLOP/s, FLOP per SM-clock: ``DTYPE_DESCRIPTORS``) get the range over the training GPUs with rows of that
dtype, and a margin: the farthest any GPU generation with rows of that dtype lay beyond the range of the other
generations' GPUs with rows of it (the extrapolation the leave-one-generation-out folds tested, as
``generation_calibration`` measures it, restricted to the dtype). Only dtypes measured on at least
:data:`MIN_GENERATIONS` generations get an entry (a margin needs a fold): the others keep the class check.

Written to ``models/artifacts/kernel_coverage.json`` (read by ``models/coverage.py``; it names the bundle's training
GPUs and applies only to a bundle trained on the same ones). Regenerate after retraining with this module's command
(``--xla-table`` the extra XLA tables the bundle was trained with, as ``generation_calibration``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.device_spec import generation_of
from wattcast.featurize.kernel_features import featurize_kernels
from wattcast.models.coverage import COVERAGE_FILE, COVERAGE_SCHEMA, DTYPE_DESCRIPTORS, DTYPE_FAMILIES, dtype_group

#: a dtype gets a per-dtype range only when GPUs of this many generations measured it (one fold at least)
MIN_GENERATIONS = 2


def dtype_coverage(train: pd.DataFrame, specs: dict) -> dict:
    """``{family: {dtype: {descriptor: {"range": [lo, hi], "margin": m, "generations": [...]}}}}`` over ``train``
    (training rows, no held-out GPU), for the tensor-core dtypes of :data:`DTYPE_FAMILIES`."""
    # the descriptors depend on (device, dtype, family) only: one row of each is enough
    one = train.drop_duplicates(["device", "dtype", "op"]).reset_index(drop=True)
    X = featurize_kernels(one, specs)
    X = X.assign(device=one["device"].to_numpy(), dtype=dtype_group(one["dtype"].astype(str).to_numpy()))
    X["generation"] = X["device"].map({d: generation_of(s) for d, s in specs.items()})
    out: dict = {}
    for fam in DTYPE_FAMILIES:
        F = X[(X["family"] == fam) & (X["is_tensor_dtype"] > 0.5)]
        for dt, D in F.groupby("dtype"):
            gens = sorted(D["generation"].unique())
            if len(gens) < MIN_GENERATIONS:
                continue
            entry = {}
            for f in DTYPE_DESCRIPTORS:
                if f not in D:
                    continue
                v = D[f].to_numpy(dtype=float)
                ok = np.isfinite(v)
                if not ok.any():
                    continue
                margin = 0.0
                for g in gens:
                    held = (D["generation"].to_numpy() == g) & ok
                    rest = ~held & ok
                    if not held.any() or not rest.any():
                        continue
                    margin = max(margin, float(v[rest].min() - v[held].min()), float(v[held].max() - v[rest].max()))
                entry[f] = {"range": [float(v[ok].min()), float(v[ok].max())], "margin": margin}
            out.setdefault(fam, {})[str(dt)] = dict(entry, generations=gens)
    return out


def build(data=None, holdout=("L4", "A100-PCIe-80GB"), xla_tables=None, models=None) -> dict:
    """The coverage file's content for the bundle in ``models`` (default: the shipped one), from the shared data."""
    from wattcast.data.catalog import resolve_device
    from wattcast.data.kernel_datasets import load_kernels, split_heldout
    from wattcast.models.kernel_bundle import load_bundle

    bundle = load_bundle(models)
    shared = load_kernels(data, xla_tables=xla_tables)
    train, _ = split_heldout(shared, holdout=holdout)
    devices = bundle.train_devices
    if devices:
        train = train[train["device"].isin(devices)]
    specs = {d: resolve_device(d) for d in train["device"].unique()}
    return {"schema": COVERAGE_SCHEMA, "train_devices": sorted(devices or specs),
            "command": "python -m wattcast.training.coverage_calibration [--xla-table FILE ...]",
            "min_generations": MIN_GENERATIONS, "families": dtype_coverage(train, specs)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    ap.add_argument("--models", default=None, help="the bundle folder (default: the shipped one)")
    ap.add_argument("--xla-table", action="append", default=None,
                    help="an extra XLA GEMM table the bundle was trained with (repeatable; default: $WATTCAST_XLA_TABLE)")
    ap.add_argument("--output", default=str(COVERAGE_FILE))
    a = ap.parse_args(argv)
    cov = build(a.data, xla_tables=a.xla_table, models=a.models)
    Path(a.output).write_text(json.dumps(cov, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for fam, by in cov["families"].items():
        for dt, e in by.items():
            parts = [f"{f[len('dev_log_'):] if f.startswith('dev_log_') else f} "
                     f"{np.exp(r['range'][0]):.3g}..{np.exp(r['range'][1]):.3g} +{r['margin']:.3f}"
                     for f, r in e.items() if isinstance(r, dict)]
            print(f"{fam} {dt} ({', '.join(e['generations'])}): " + "; ".join(parts))
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
