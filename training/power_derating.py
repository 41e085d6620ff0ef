"""Fit the power-limited FP32 GEMM cap (:mod:`wattcast.models.power_derating`) on the training GPUs.

    python -m wattcast.training.power_derating [--data PATH]

Per training GPU with FP32 GEMMs (NeuSight's tables; DeepBench's V100): the 90th percentile of achieved FLOP/s over the
FP32 peak for GEMMs >= 2 GFLOP. GPUs whose TDP per TFLOP/s is at least W_needed(node) run at the unlimited efficiency
(their mean); the others at unlimited x (W/TFLOP / W_needed(node)). ``W12`` and ``alpha`` minimise the squared log error
over all of them. AMD's CDNA GPUs are left out (their FP32 GEMMs run on matrix cores above the vector peak), and so
are the project's held-out GPUs (L4, A100 80GB PCIe).
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from wattcast.data.kernel_datasets import HELDOUT_DEVICES as HELD_OUT

MIN_FLOPS = 2e9


def gpu_efficiency(root=None) -> pd.DataFrame:
    """One row per training GPU: node, TDP per FP32 TFLOP/s and the p90 achieved fraction of the FP32 peak."""
    from wattcast.data.catalog import resolve_device
    from wattcast.data.kernel_datasets import load_kernels

    df = load_kernels(root)
    g = df[df["op"].isin(["bmm", "linear"]) & (df["dtype"] == "fp32") & ~df["device"].isin(HELD_OUT)].copy()
    g["flops"] = 2.0 * g["B"].fillna(1) * g["M"] * g["N"] * g["K"]
    g = g[g["flops"] >= MIN_FLOPS]
    rows = []
    for dev, x in g.groupby("device"):
        s = resolve_device(dev)
        if s.vendor != "nvidia" or not s.tdp_w or not s.process_node_nm:
            continue
        eff = x["flops"] / (x["latency_ms"] * 1e-3) / 1e12 / s.peak_fp32_tflops
        rows.append(dict(device=dev, node_nm=float(s.process_node_nm), w_per_tflop=s.tdp_w / s.peak_fp32_tflops,
                         rows=len(x), p90=float(eff.quantile(0.9))))
    return pd.DataFrame(rows)


def fit(eff: pd.DataFrame) -> tuple[float, float, float]:
    """(W12, alpha, unlimited efficiency) by a grid search on the squared log error of the p90 efficiencies."""
    best = None
    for w12 in np.arange(8.0, 40.0, 0.1):
        for alpha in np.arange(0.0, 2.0, 0.01):
            need = w12 * (eff["node_nm"] / 12.0) ** alpha
            frac = np.minimum(1.0, eff["w_per_tflop"] / need)
            unl = eff.loc[frac >= 1.0, "p90"]
            if unl.empty:
                continue
            e = float(np.exp(np.log(unl).mean()))
            err = float(((np.log(e * frac) - np.log(eff["p90"])) ** 2).sum())
            if best is None or err < best[0] - 1e-12:
                best = (err, round(float(w12), 1), round(float(alpha), 2), round(e, 2))
    return best[1], best[2], best[3]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    a = ap.parse_args()
    eff = gpu_efficiency(a.data)
    w12, alpha, e = fit(eff)
    need = w12 * (eff["node_nm"] / 12.0) ** alpha
    eff["fraction"] = np.minimum(1.0, eff["w_per_tflop"] / need)
    eff["fit_p90"] = e * eff["fraction"]
    print(eff.round(3).to_string(index=False))
    print(f"W_NEEDED_12NM = {w12}  NODE_EXPONENT = {alpha}  UNLIMITED_EFFICIENCY = {e}")


if __name__ == "__main__":
    main()
