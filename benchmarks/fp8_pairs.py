#!/usr/bin/env python3
"""FP8 GEMMs against the visible FP8/BF16 pairs: the XLA matmul table measures the same shapes in bf16 and in fp8
(E4M3 x E4M3) on B200 and gfx950 (MI355X class); with an extra XLA table (``--xla-table`` / ``$WATTCAST_XLA_TABLE``,
``data/xla_perf_table.py``) also on gfx942 (MI300X class, E4M3 FNUZ). An extra table's H100 rows are left out: the
shared datasets withhold the Hopper generation (``data.kernel_datasets.WITHHELD_DEVICES``).

    python3 benchmarks/fp8_pairs.py [--data PATH] [--xla-table FILE ...]

Each device's fp8 rows are the (lhs, rhs, out) combination the training data labels ``fp8``
(``data.kernel_datasets.XLA_DTYPES``: e4m3 x e4m3 -> **bf16**, FNUZ on gfx942), the kernel wattcast's fp8 GEMM is (its
output counted at 2 bytes, ``data.kernel_ops.MATMUL_OUT_BYTES``; Transformer Engine's FP8 GEMMs write bf16). Until
stop 50 the benchmark took each shape's fastest of the three outputs the tables time (bf16, f32, fp8), a minimum over
three readings of other kernels: on gfx942 they differ by a median 1.16x and up to 2.6x on the same shape (4.3
GFLOP, 2048 x 512 x 2048: 20.3 / 12.6 / 7.9 us), which read MI300X's >= 1 GFLOP fp8 at 24.3% / +22.2% where the
bf16-output rows read 7.9% / +0.6%. ``--fastest-output`` keeps that selection.

For every shape measured in both, the shipped kernel surrogates predict both dtypes (``wattcast.predict_kernels``,
as ``wattcast kernels`` does) and the benchmark prints, per device and size band (GFLOP per GEMM): rows, MAPE and
signed mean error of the fp8 time, and the measured vs predicted fp8-over-bf16 speed-up. The surrogates were
trained with these devices' rows (the held-out-generation figures are ``leave_one_generation_out.py``'s): this
measures whether the dtype step the graphs rely on (the recipe's GEMMs in fp8, the rest in bf16) is right.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from wattcast.data.kernel_datasets import resolve_data_root
from wattcast.models.kernel_predictor import predict_kernels

DEVICES = {"sm_100_B200": "B200", "gfx950": "MI355X", "gfx942": "MI300X"}
#: each device's E4M3 type (CDNA3 has the FNUZ variant)
FP8 = {"sm_100_B200": "f8e4m3fn", "gfx950": "f8e4m3fn", "gfx942": "f8e4m3fnuz"}
BANDS = [(0.0, 0.1, "< 0.1 GFLOP"), (0.1, 1.0, "0.1-1 GFLOP"), (1.0, np.inf, ">= 1 GFLOP")]


def pairs(root, xla_tables=None, fastest_output: bool = False) -> pd.DataFrame:
    """The shapes each device measures in bf16 (bf16 x bf16 -> bf16) and in fp8: the fp8 combination
    ``XLA_DTYPES`` labels ``fp8`` (e4m3 x e4m3 -> bf16), or with ``fastest_output`` each shape's fastest output dtype
    of the same-format e4m3 inputs (the selection until stop 50)."""
    from wattcast.data.kernel_datasets import XLA_DTYPES
    from wattcast.data.xla_perf_table import read_xla_gemm_table, tables_from_env

    keys = ["device", "b", "m", "n", "k", "lhs_dtype", "rhs_dtype", "out_dtype"]
    d = pd.read_csv(resolve_data_root(root) / "tensorcore" / "xla_matmul_perf_table.csv")
    for path in (tables_from_env() if xla_tables is None else xla_tables):
        d = pd.concat([d, read_xla_gemm_table(path)], ignore_index=True).drop_duplicates(keys, keep="first")
    d = d[d.device.isin(list(DEVICES))]
    bf = d[(d.lhs_dtype == "bf16") & (d.rhs_dtype == "bf16") & (d.out_dtype == "bf16")]
    e4 = d.device.map(FP8)
    if fastest_output:
        f8 = d[(d.lhs_dtype == e4) & (d.rhs_dtype == e4)]
        f8 = f8.sort_values("derived_time_us").drop_duplicates(["device", "b", "m", "n", "k"])  # fastest output dtype
    else:
        combo = list(zip(d.lhs_dtype.astype(str), d.rhs_dtype.astype(str), d.out_dtype.astype(str)))
        label = [XLA_DTYPES.get(dev, {}).get(c) for dev, c in zip(d.device.astype(str), combo)]
        f8 = d[np.asarray([lab == "fp8" for lab in label], dtype=bool)]
    keys = ["device", "b", "m", "n", "k"]
    return bf[keys + ["derived_time_us"]].merge(f8[keys + ["derived_time_us"]], on=keys, suffixes=("_bf16", "_fp8"))


def predict(p: pd.DataFrame) -> pd.DataFrame:
    out = []
    for dev, name in DEVICES.items():
        sub = p[p.device == dev].copy()
        if sub.empty:
            continue
        # XLA's dot (b, m, k) x (b, k, n): wattcast's bmm is (B, M, N) x (B, N, K) with N the contraction
        frame = pd.DataFrame({"OPName": "bmm", "B": sub.b, "M": sub.m, "N": sub.k, "K": sub.n})
        for dt in ("bf16", "fp8"):
            r = predict_kernels(frame.assign(dtype=dt), name)
            sub[f"pred_ms_{dt}"] = r["pred_latency_ms"].to_numpy()
        sub["gflop"] = 2.0 * sub.b * sub.m * sub.n * sub.k / 1e9
        out.append(sub.assign(name=name))
    return pd.concat(out, ignore_index=True)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for name, g in df.groupby("name"):
        for lo, hi, band in BANDS:
            s = g[(g.gflop >= lo) & (g.gflop < hi)]
            if s.empty:
                continue
            meas = s.derived_time_us_fp8 / 1e3
            err = 100 * (s.pred_ms_fp8 - meas) / meas
            rows.append(dict(device=name, band=band, rows=len(s), fp8_mape_pct=float(err.abs().mean()),
                             fp8_signed_pct=float(err.mean()),
                             measured_speedup=float((s.derived_time_us_bf16 / s.derived_time_us_fp8).median()),
                             predicted_speedup=float((s.pred_ms_bf16 / s.pred_ms_fp8).median())))
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    ap.add_argument("--xla-table", action="append", default=None, help="an extra XLA GEMM table (repeatable)")
    ap.add_argument("--fastest-output", action="store_true",
                    help="each shape's fastest fp8 output dtype (bf16, f32 or fp8) instead of the trained e4m3 x e4m3 "
                         "-> bf16 rows (the selection until stop 50)")
    a = ap.parse_args()
    t = summary(predict(pairs(a.data, a.xla_table, fastest_output=a.fastest_output)))
    pd.set_option("display.width", 200)
    print(t.round(2).to_string(index=False))


if __name__ == "__main__":
    main()
