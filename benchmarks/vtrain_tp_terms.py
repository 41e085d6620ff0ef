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

``--outside``: the per-micro-batch time outside the layers instead (``meas_a`` against its prediction), per cell the
predicted GPU time of each part (the shipped graph's nodes, without host costs): the embedding and position embedding
forward (``emb_f``) and backward with the vocabulary x hidden gradient's zeroing (``emb_b``), the final LayerNorm
(``ln_f``), the LM head GEMM forward (``lm_f``) and its two backward GEMMs (``lm_dg``, ``lm_wg``; tied to the word
embedding, vocabulary padded to 128 x TP), the logits' fp16 -> fp32 cast and its backward (``cast``), the
vocabulary-parallel cross-entropy's kernels (``ce``: max, subtract, exp, sum, divide, the gradient's multiply) and the
TP collectives outside the layers (``tp_coll``: the embedding's all-reduce, the LM head input gradient's, the loss's
three scalar ones); ``ship_a`` (the shipped prediction, host costs and loading included); ``bound`` (the LM head's
FLOPs at the A100's dense fp16 peak plus every other part's bytes at its HBM peak: no run of those kernels is
faster); ``meas/bound``. Then ``tp_split_floor`` of the measured ``a`` (``validation/step_breakdown``: a(t) - (t2 /
t) a(t2), the least time degree t spends on something no split or TP-invariant term accounts for) and, per TP, the
least-squares factors on the predicted LM head GEMMs and cross-entropy (cast included) that the measured ``a`` implies.
Stop 59 (the fitting half): hidden 2,048 micro-batch 4 measures 35.6 ms at TP1 and 8.65 at TP2, so against TP2 TP1
spends at least 18.3 ms (51%) on something that is neither split over the ranks nor the same on both degrees (hidden
2,048: 2.8 / 7.9 / 18.3 ms at micro-batch 1 / 2 / 4; hidden 1,024: -0.3 / 2.6 / 5.9), but against TP4 at most 3.8 ms
(one cell; the other five -5.1..0.0); measured / bound at micro-batch 4 is 2.43 / 1.16 / 2.07 (hidden 2,048, TP1 / 2 /
4): TP2 is the degree near the floor. Per TP the factors read LM head x2.87 and cross-entropy x0.13 at TP1, x0.51 /
x0.78 at TP2, x1.15 / x1.11 at TP4: no one factor fits two degrees, and Megatron-DeepSpeed has no TP1-only cost
outside the layers (README "vTrain's TP rows: the per-micro-batch term outside the layers").

Run: python3 benchmarks/vtrain_tp_terms.py [--half fit|eval] [--outside]
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import pandas as pd

from wattcast.models.collectives import busbw_gb_per_s, load_collective_model
from wattcast.simulate import distributed as dist
from wattcast.simulate.distributed import FRAMEWORK_HOST_MS, predict_distributed
from wattcast.simulate.options import DistributedOptions
from wattcast.simulate.parallel import ParallelConfig
from wattcast.validation.distributed_validation import _vtrain_config, fit_split, load_vtrain, predict_vtrain
from wattcast.validation.step_breakdown import layer_slopes, tp_split_floor

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


#: the parts outside the layers, by graph node name (featurize/hf_blocks.py: vocab_embedding, lm_head_and_loss;
#: GraphBuilder.cross_entropy's loss.* nodes; the training graph's .grad / .dgrad / .wgrad / .grad_zero nodes)
OUTSIDE_PARTS = ("emb_f", "emb_b", "ln_f", "lm_f", "lm_dg", "lm_wg", "cast", "ce", "tp_coll")


def outside_part(name: str, op_class: str) -> str | None:
    """The OUTSIDE_PARTS label of one rank-graph node (None: a layer's node or the optimizer's)."""
    if op_class == "collective":
        return "tp_coll" if name.startswith(("wte", "lm_head", "loss")) else None
    if name.startswith("lm_head"):
        return {"lm_head": "lm_f", "lm_head.dgrad": "lm_dg", "lm_head.wgrad": "lm_wg"}.get(name)
    if name.startswith("loss"):
        return "cast" if name.startswith("loss.float") else "ce"
    if name.startswith("ln_f"):
        return "ln_f"
    if name.startswith(("wte", "wpe", "embed")):
        return "emb_b" if "grad" in name else "emb_f"
    return None


def _outside_costed(hidden: int, heads: int, seq: int, tp: int, micro_batch: int) -> tuple[pd.DataFrame, object]:
    """(the costed rank graph of one micro-batch, the device spec) of a vTrain cell as predict_vtrain builds it: read
    from simulate.distributed's costed-graph cache (a diagnostic: the prediction keeps per-node times nowhere else)."""
    dist._COSTED.clear()
    predict_distributed(_vtrain_config(hidden, heads, 12, seq), CLUSTER,
                        ParallelConfig(gpus=tp, tp=tp, pp=1, dp=1, micro_batch=micro_batch),
                        DistributedOptions(batch=micro_batch, seq=seq, dtype="fp16", attention="eager", optimizer="adamw",
                                           framework=FRAMEWORK))
    (pins, costed, _view, _bw), = [v[0] for v in dist._COSTED._data.values()]
    return costed, pins[1]


def outside_terms(rows: pd.DataFrame) -> pd.DataFrame:
    """The per-cell table of ``--outside`` (module docstring) for vTrain single-node ``rows`` (pp 1 rows are used)."""
    rows = rows[rows["pp"] == 1]
    key = ["hidden", "tp", "micro_batch"]
    meas = layer_slopes(rows).rename(columns={"a_ms": "meas_a"})[key + ["meas_a"]]
    cells = rows.drop_duplicates(key)[["hidden", "heads", "seq", "tp", "micro_batch"]]
    shipped = _slopes(predict_vtrain(_grid(cells)), "predicted_ms").rename(columns={"a_ms": "ship_a"})[key + ["ship_a"]]
    out = []
    for r in cells.sort_values(key).itertuples():
        c, spec = _outside_costed(int(r.hidden), int(r.heads), int(r.seq), int(r.tp), int(r.micro_batch))
        part = pd.Series([outside_part(n, k) for n, k in zip(c["name"], c["op_class"])], index=c.index, dtype=object)
        c = c[part.notna()].assign(part=part.dropna())
        gpu = c.groupby("part")["gpu_ms"].sum()
        lm = c["part"].isin(["lm_f", "lm_dg", "lm_wg"]).to_numpy()
        kernels = ~lm & (c["part"] != "tp_coll").to_numpy()
        bound = (c.loc[lm, "flops"].sum() / (spec.peak_fp16_tflops * 1e9)
                 + c.loc[kernels, "bytes"].sum() / (spec.memory_bandwidth_gbps * 1e6))
        out.append(dict(hidden=int(r.hidden), tp=int(r.tp), micro_batch=int(r.micro_batch),
                        **{p: float(gpu.get(p, 0.0)) for p in OUTSIDE_PARTS}, gpu_a=float(gpu.sum()), bound=float(bound)))
    t = meas.merge(pd.DataFrame(out), on=key).merge(shipped, on=key)
    t["meas/bound"] = t["meas_a"] / t["bound"]
    t["ship_%"] = 100.0 * (t["ship_a"] / t["meas_a"] - 1.0)
    return t[key + ["meas_a", "ship_a", "ship_%", *OUTSIDE_PARTS, "gpu_a", "bound", "meas/bound"]]


def outside_factors(t: pd.DataFrame) -> pd.DataFrame:
    """Per TP degree, least squares of the measured ``a`` on the predicted LM head GEMMs, the cross-entropy (its fp32
    cast included) and a constant, after the other parts' predicted GPU time: the factors each would need."""
    out = []
    for tp, g in t.dropna(subset=["meas_a"]).groupby("tp"):
        lm = g[["lm_f", "lm_dg", "lm_wg"]].sum(axis=1).to_numpy()
        ce = g[["cast", "ce"]].sum(axis=1).to_numpy()
        y = g["meas_a"].to_numpy() - (g["gpu_a"].to_numpy() - lm - ce)
        X = np.column_stack([lm, ce, np.ones(len(g))])
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        out.append(dict(tp=tp, cells=len(g), lm_head_x=coef[0], ce_x=coef[1], const_ms=coef[2],
                        max_resid_ms=float(np.abs(X @ coef - y).max())))
    return pd.DataFrame(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--half", choices=("fit", "eval"), default="fit",
                    help="vTrain single-node half (fit_split): fit (default) or eval")
    ap.add_argument("--outside", action="store_true",
                    help="the per-micro-batch time outside the layers, part by part (module docstring)")
    args = ap.parse_args()
    fit, ev = fit_split(load_vtrain(which="single"))
    if args.outside:
        t = outside_terms(fit if args.half == "fit" else ev)
        with pd.option_context("display.width", 250, "display.max_columns", 40):
            print(t.round(3).to_string(index=False))
            meas = t.dropna(subset=["meas_a"]).rename(columns={"meas_a": "a_ms"})
            print("\ntp_split_floor of the measured a (ms): value(tp) - tp2 / tp x value(tp2)")
            print(tp_split_floor(meas).round(3).to_string(index=False))
            print("\nfactors on the predicted LM head GEMMs and cross-entropy the measured a implies, per TP")
            print(outside_factors(t).round(3).to_string(index=False))
        return
    t = tp_terms(fit if args.half == "fit" else ev)
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        print(t.round(3).to_string(index=False))
        gb = t[(t["gpu_b"] > t["host_b"]) & t["meas_b"].notna()]
        print("\nGPU-bound cells (gpu_b > host_b): excess = measured - GPU terms, per layer per micro-batch (ms)")
        print(gb.groupby("tp").agg(cells=("excess", "size"), excess_min=("excess", "min"), excess_max=("excess", "max"),
                                   ship_pct_mean=("ship_%", "mean")).round(2).to_string())


if __name__ == "__main__":
    main()
