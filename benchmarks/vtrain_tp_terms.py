"""Which term of vTrain's GPU-bound TP rows is short: measured per-layer times against the predicted terms.

vTrain's single-node rows (A100 SXM DGX, fp16, Megatron-DeepSpeed; ``load_vtrain``) are, within a (hidden, TP,
micro-batch, DP) cell, ``n_micro x (a + b x layers) + c + d x layers`` (README, stop 48), so the rows with several
layer and micro-batch counts pin each cell's per-layer time ``b`` (one micro-batch through one layer, forward and
backward) and per-micro-batch time ``a`` (outside the layers) apart from the per-step terms
(``validation/step_breakdown.layer_slopes``). This prints, per (hidden, TP, micro-batch) cell of the chosen half
(pp 1 rows):

- ``meas_b``: the measured per-layer time; ``ship_b`` / ``ship_%``: the shipped prediction's (per-kernel
  max(GPU, host)) and its error;
- the per-layer GPU terms with no host cost (``host_ms`` 0, no collective floor): ``gemm``, ``attn``, ``other``
  (the other kernels), ``tp_ar`` (the four TP all-reduces: Megatron without sequence parallelism all-reduces the
  attention and MLP outputs forward and their input gradients backward, ``micro_batch x seq x hidden x 2`` bytes
  each) and their sum ``gpu_b``; ``host_b``: the kernels a layer launches times the shipped per-kernel host cost;
- ``excess`` = meas_b - gpu_b, and what one all-reduce would take if the excess were all in the four all-reduces
  (``ar_ms``: the collective model's time + excess / 4) with the bus bandwidth that implies (``ar_busbw``; the
  collective model's own in ``cm_busbw``);
- ``meas_a`` / ``ship_a``: the per-micro-batch time outside the layers.

Then, over the GPU-bound cells (gpu_b > host_b), the excess by TP degree. Stop 59 (the fitting half): the excess is
~0 at TP1 (the GPU terms 1-6% long), 0.75-1.3 ms at TP2, 1.3-1.8 at TP4 (and 2.3 at TP8 micro-batch 4, a cell the
host-floor test calls host-bound), flat from
micro-batch 4 to 8 (so from 16 to 32 MB all-reduces) and the same at hidden 1,024 micro-batch 8 as at 2,048
micro-batch 4 (both 16 MB): a fixed cost per layer and micro-batch that grows with the TP group, not a bandwidth.
Read as the all-reduces it would be 46-99 GB/s bus bandwidth at 16-32 MB and flat in size, which no NVSwitch
all-reduce is; see README "vTrain's TP rows: the per-layer term".

Run: python3 benchmarks/vtrain_tp_terms.py [--half fit|eval]
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import pandas as pd

from wattcast.models.collectives import busbw_gb_per_s, load_collective_model
from wattcast.simulate.distributed import FRAMEWORK_HOST_MS
from wattcast.validation.distributed_validation import fit_split, load_vtrain, predict_vtrain
from wattcast.validation.step_breakdown import layer_slopes

FRAMEWORK = "megatron-deepspeed"
CLUSTER = "DGX-A100"
#: TP all-reduces per layer per micro-batch in Megatron without sequence parallelism (megatron/core/tensor_parallel
#: layers: RowParallelLinear's forward all-reduce after attention's output projection and the MLP's fc2, and
#: ColumnParallelLinear's backward all-reduce of the QKV and fc1 input gradients)
TP_ALL_REDUCES = 4
#: a host cost per kernel large enough that max(GPU, host) is the host on every kernel of these layers: the
#: prediction's per-layer time at it, over it, is the kernels a layer launches
_COUNT_HOST_MS = 1000.0
_TERMS = ("gemm_ms", "attention_ms", "other_kernels_ms", "exposed_tp_ms", "predicted_ms")


def _grid(cells: pd.DataFrame) -> pd.DataFrame:
    """Synthetic single-stage rows of every cell (dp 1, 12 / 24 layers, 1 / 2 micro-batches): what layer_slopes
    needs to pin a and b of a prediction."""
    rows = [dict(gpus=int(r.tp), batch=int(r.micro_batch) * nm, micro_batch=int(r.micro_batch), hidden=int(r.hidden),
                 heads=int(r.heads), layers=L, seq=int(r.seq), tp=int(r.tp), dp=1, pp=1, measured_ms=1.0)
            for r in cells.itertuples() for L, nm in itertools.product((12, 24), (1, 2))]
    return pd.DataFrame(rows)


def _slopes(pred: pd.DataFrame, value: str) -> pd.DataFrame:
    s = layer_slopes(pred[pred["status"] == "ok"], value=value, by=("hidden", "tp"))
    return s[["hidden", "tp", "micro_batch", "a_ms", "b_ms"]]


def tp_terms(rows: pd.DataFrame) -> pd.DataFrame:
    """The per-cell table the module docstring describes, for vTrain single-node ``rows`` (pp 1 rows are used)."""
    rows = rows[rows["pp"] == 1]
    meas = layer_slopes(rows).rename(columns={"a_ms": "meas_a", "b_ms": "meas_b"})
    cells = rows.drop_duplicates(["hidden", "tp", "micro_batch"])[["hidden", "heads", "seq", "tp", "micro_batch"]]
    grid = _grid(cells)
    key = ["hidden", "tp", "micro_batch"]
    out = meas[key + ["rows", "meas_b", "meas_a"]]
    shipped = _slopes(predict_vtrain(grid), "predicted_ms").rename(columns={"a_ms": "ship_a", "b_ms": "ship_b"})
    gpu_pred = predict_vtrain(grid, host_ms=(0.0, 0.0, {}))
    for t, name in zip(_TERMS, ("gemm", "attn", "other", "tp_ar", "gpu_b")):
        out = out.merge(_slopes(gpu_pred, t)[key + ["b_ms"]].rename(columns={"b_ms": name}), on=key)
    count = _slopes(predict_vtrain(grid, host_ms=(_COUNT_HOST_MS, 0.0, {})), "predicted_ms")
    launch_ms = FRAMEWORK_HOST_MS[FRAMEWORK][0]
    out = out.merge(shipped, on=key).merge(
        count.assign(host_b=np.round(count["b_ms"] / _COUNT_HOST_MS) * launch_ms)[key + ["host_b"]], on=key)
    out["ship_%"] = 100.0 * (out["ship_b"] / out["meas_b"] - 1.0)
    out["excess"] = out["meas_b"] - out["gpu_b"]
    seq = cells.set_index(key)["seq"].reindex(pd.MultiIndex.from_frame(out[key])).to_numpy()
    size = out["micro_batch"].to_numpy() * seq * out["hidden"].to_numpy() * 2.0  # fp16 activations
    tp = out["tp"].to_numpy()
    cm = load_collective_model()
    cm_us = np.array([float(cm.predict_us("all_reduce", s, n, n, CLUSTER)) if n > 1 else 0.0 for s, n in zip(size, tp)])
    out["ar_mb"] = size / 2**20
    out["cm_busbw"] = np.where(tp > 1, busbw_gb_per_s("all_reduce", size, tp, np.maximum(cm_us, 1e-9)), np.nan)
    ar_ms = cm_us / 1e3 + out["excess"].to_numpy() / TP_ALL_REDUCES
    out["ar_ms"] = np.where(tp > 1, ar_ms, np.nan)
    out["ar_busbw"] = np.where((tp > 1) & (ar_ms > 0), busbw_gb_per_s("all_reduce", size, tp, np.maximum(ar_ms, 1e-9) * 1e3),
                               np.nan)
    return out[key + ["rows", "meas_b", "ship_b", "ship_%", "gemm", "attn", "other", "tp_ar", "gpu_b", "host_b", "excess",
                      "ar_mb", "cm_busbw", "ar_ms", "ar_busbw", "meas_a", "ship_a"]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--half", choices=("fit", "eval"), default="fit",
                    help="vTrain single-node half (fit_split): fit (default) or eval")
    args = ap.parse_args()
    fit, ev = fit_split(load_vtrain(which="single"))
    t = tp_terms(fit if args.half == "fit" else ev)
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        print(t.round(3).to_string(index=False))
        gb = t[(t["gpu_b"] > t["host_b"]) & t["meas_b"].notna()]
        print("\nGPU-bound cells (gpu_b > host_b): excess = measured - GPU terms, per layer per micro-batch (ms)")
        print(gb.groupby("tp").agg(cells=("excess", "size"), excess_min=("excess", "min"), excess_max=("excess", "max"),
                                   ship_pct_mean=("ship_%", "mean")).round(2).to_string())


if __name__ == "__main__":
    main()
