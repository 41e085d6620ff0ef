"""One predicted training step split into the terms an at-scale error is traced to (the house rule of issue 15).

For a row whose error is large, the question is *which term* is wrong: the GEMMs, attention, the other kernels,
the exposed communication of one class (TP with the expert-parallel classes, DP/ZeRO, PP, CP), the pipeline bubble, the optimizer or the host
overheads. :func:`step_terms` flattens a :class:`~wattcast.simulate.distributed.DistributedPrediction` into those
columns (``*_ms``), so a validation table carries them next to the measurement and neighbouring rows that differ
in one knob can be compared term by term.

Kernel terms are per pipeline stage: the step's time per op class (``per_op``: the rank graph's kernels over every
micro-batch, the whole model at its TP degree), divided by the stages (the average stage; with an uneven split the
busiest stage is longer).
Communication terms are what the step would save if that class alone were free (``exposed_comm_split_ms``), so
they do not add up to the step exactly (overlaps); ``other_ms`` is the step minus every listed term, i.e. what
the terms leave unexplained (negative where overlapping terms are counted twice).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: op classes of the rank graph reported as "attention": the score and value batched GEMMs, softmax and the fused
#: kernels (eager attention's mask and dropout sit in elementwise / dropout with the other layers' ones)
ATTENTION_CLASSES = ("bmm", "softmax", "flash_attention")
#: op classes left out of the kernel terms: collectives, the optimizer and data loading are terms of their own
_NOT_COMPUTE = ("collective", "optimizer", "data_loading")
#: the exposed-communication classes of ``exposed_comm_split_ms`` (simulate/distributed.py) -> the step_terms column that
#: counts them: the tensor-parallel ring, the expert-parallel all-to-alls and the all-gather dispatcher's expert-TP x EP
#: group (``tp_ep``, --moe-token-dispatcher-type allgather) are the layer's own collectives, read together as "TP"
SPLIT_COLUMNS = {"tp": "exposed_tp_ms", "ep": "exposed_tp_ms", "tp_ep": "exposed_tp_ms", "dp": "exposed_dp_ms",
                 "pp": "exposed_pp_ms", "cp": "exposed_cp_ms"}
#: the columns step_terms returns, in print order
TERM_COLUMNS = ("n_micro", "gemm_ms", "attention_ms", "other_kernels_ms", "exposed_tp_ms", "exposed_dp_ms",
                "exposed_pp_ms", "exposed_cp_ms", "bubble_ms", "optimizer_ms", "launch_gap_ms", "data_loading_ms",
                "iteration_ms", "other_ms")


def ood_band_columns(p) -> dict:
    """The step band's OOD term of prediction ``p`` (a DistributedPrediction: its critical rank's OOD share and its
    kernels' band, log ends; 0 without OOD time) as three columns, what validation/step_band.py scores each row's
    shipped band with (stop 58)."""
    ob = p.meta.get("ood_band") or {}
    return {"ood_time_share": float(ob.get("share", 0.0)), "ood_band_low_log": float(ob.get("low_log", 0.0)),
            "ood_band_high_log": float(ob.get("high_log", 0.0))}


def step_terms(p, iteration_ms: float = 0.0) -> dict:
    """The per-term breakdown of prediction ``p`` (a DistributedPrediction), in ms of the step (see the module
    docstring). ``iteration_ms``: the framework's fixed per-iteration host cost the prediction used."""
    n_micro = int(p.meta.get("n_micro") or 1)
    stages = max(int(p.parallel.pp), 1)
    per_stage = n_micro / stages
    # per_op is the step's (every micro-batch, the optimizer phase sharded; until stop 56 one micro-batch's with the
    # whole optimizer phase, times n_micro here: an FP8 step's weight casts counted n_micro times)
    by_class = {o["op_class"]: float(o["time_ms"]) for o in p.per_op}
    gemm = by_class.get("linear", 0.0) / stages
    attn = sum(by_class.get(c, 0.0) for c in ATTENTION_CLASSES) / stages
    other = sum(v for k, v in by_class.items() if k not in ("linear", *ATTENTION_CLASSES, *_NOT_COMPUTE)) / stages
    split = p.exposed_comm_split_ms or {}
    unknown = sorted(set(split) - set(SPLIT_COLUMNS))
    if unknown:  # a class no column counts would land in other_ms unnoticed
        raise ValueError(f"step_terms: exposed_comm_split_ms has class(es) {unknown} that no term counts; add them to "
                         f"SPLIT_COLUMNS")
    exposed = {c: 0.0 for c in SPLIT_COLUMNS.values()}
    for k, v in split.items():
        exposed[SPLIT_COLUMNS[k]] += float(v)
    launch = float((p.comm.get("rank_overheads_ms") or {}).get("launch_gap_ms", 0.0)) * per_stage
    out = dict(n_micro=n_micro, gemm_ms=gemm, attention_ms=attn, other_kernels_ms=other,
               exposed_tp_ms=exposed["exposed_tp_ms"], exposed_dp_ms=exposed["exposed_dp_ms"],
               exposed_pp_ms=exposed["exposed_pp_ms"], exposed_cp_ms=exposed["exposed_cp_ms"], bubble_ms=float(p.bubble_ms), optimizer_ms=float(p.optimizer_ms),
               launch_gap_ms=launch, data_loading_ms=float((p.comm.get("data_loading") or {}).get("step_ms", 0.0)),
               iteration_ms=float(iteration_ms))
    listed = sum(v for k, v in out.items() if k not in ("n_micro", "launch_gap_ms"))  # launch gaps sit inside the kernels
    out["other_ms"] = float(p.step_time_ms) - listed
    return out


def knob_effects(rows: pd.DataFrame, knob: str, hold: list[str]) -> pd.DataFrame:
    """What one knob does to the measurement and to the prediction: for every pair of predicted rows (status "ok")
    that agree on every column of ``hold`` and differ in ``knob``, the step-time ratio measured and predicted; per
    (knob from, knob to), the pairs, the median of each ratio and ``miss`` = the median of predicted / measured ratio
    (1 when the prediction follows the knob; e.g. 0.7: the measurement grows 1/0.7 times more than predicted).
    Other columns that follow from the knob (DP when TP changes at a fixed GPU count) are left free."""
    missing = [c for c in [knob, *hold, "measured_ms", "predicted_ms"] if c not in rows.columns]
    if missing:
        raise ValueError(f"knob_effects: the rows have no column(s) {missing}")
    ok = rows[rows["status"] == "ok"][[knob, *hold, "measured_ms", "predicted_ms"]]
    m = ok.merge(ok, on=hold, suffixes=("_a", "_b"))
    m = m[m[f"{knob}_a"] < m[f"{knob}_b"]]
    if m.empty:
        return pd.DataFrame(columns=[f"{knob}_from", f"{knob}_to", "pairs", "measured_ratio", "predicted_ratio", "miss"])
    meas = m["measured_ms_b"] / m["measured_ms_a"]
    pred = m["predicted_ms_b"] / m["predicted_ms_a"]
    t = pd.DataFrame({f"{knob}_from": m[f"{knob}_a"], f"{knob}_to": m[f"{knob}_b"], "measured_ratio": meas,
                      "predicted_ratio": pred, "miss": pred / meas})
    g = t.groupby([f"{knob}_from", f"{knob}_to"])
    out = g.median()
    out.insert(0, "pairs", g.size())
    return out.reset_index()


def repeat_floor_pct(measured_ms, keys) -> pd.Series:
    """Per row, the smallest absolute % error any prediction that reads only the row's ``keys`` can have on it: rows
    with equal keys get one prediction, and the value that minimises the largest relative error over measurements
    ``m_min .. m_max`` (``2 m_min m_max / (m_min + m_max)``) still misses both ends by ``(m_max - m_min) /
    (m_max + m_min)``. 0 for a configuration measured once. The maximum over a source is a lower bound on its
    attainable max error (Megatron-LM's CI runs each test on several platforms: one configuration up to 1.66x apart
    among the rows at_scale predicts)."""
    m = pd.Series(measured_ms, dtype=float).reset_index(drop=True)
    k = pd.Series(list(keys), dtype=object)
    lo, hi = m.groupby(k).transform("min"), m.groupby(k).transform("max")
    return 100.0 * (hi - lo) / (hi + lo)


def layer_slopes(rows: pd.DataFrame, value: str = "measured_ms", by: tuple = ("hidden", "tp")) -> pd.DataFrame:
    """Per-layer and per-micro-batch times of single-stage (pp 1) training steps, by least squares.

    Within each group of ``by``, every row's ``value`` (ms) is read as ``n_micro x (a + b x layers) + c + d x layers``
    with ``a`` and ``b`` per micro-batch size (the time one micro-batch spends outside the layers and in each layer,
    forward and backward), ``c`` per (micro-batch size, DP degree) and ``d`` per DP degree (the optimizer, the
    gradient all-reduce and the other once-a-step costs, per step and per layer). vTrain's single-node rows follow
    this form to 1e-13 ms within a (hidden, TP, micro-batch, DP) cell (README, stop 48), so ``b`` is the per-layer
    time that rows with several layer counts and micro-batch counts pin apart from every per-step term. ``n_micro``
    is ``batch / (micro_batch x dp)`` when the rows do not carry it.

    Returns one row per (``by``, micro_batch): ``a_ms``, ``b_ms`` (NaN where the rows do not identify them, e.g. one
    micro-batch count and no other micro-batch size to share ``d`` with), ``rows`` and ``max_residual_ms`` (the
    group's largest |fit - value|: how well the form holds)."""
    need = [*by, "micro_batch", "dp", "pp", "layers", value] + ([] if "n_micro" in rows.columns else ["batch"])
    missing = [c for c in need if c not in rows.columns]
    if missing:
        raise ValueError(f"layer_slopes: the rows have no column(s) {missing}")
    if (rows["pp"] != 1).any():
        raise ValueError("layer_slopes: rows with pp > 1 (pipeline stages split the layers and add a bubble); pass "
                         "the pp 1 rows")
    df = rows.copy()
    if "n_micro" not in df.columns:
        df["n_micro"] = df["batch"] / (df["micro_batch"] * df["dp"])
    out = []
    for key, g in df.groupby(list(by)):
        n, L, y = (g[c].to_numpy(dtype=float) for c in ("n_micro", "layers", value))
        mbs, dps = np.sort(g["micro_batch"].unique()), np.sort(g["dp"].unique())
        cols, names = [], []
        for mb in mbs:
            s = (g["micro_batch"] == mb).to_numpy(dtype=float)
            cols += [s * n, s * n * L]
            names += [("a", mb), ("b", mb)]
            cols += [s * (g["dp"] == dp).to_numpy() for dp in np.sort(g.loc[g["micro_batch"] == mb, "dp"].unique())]
            names += [("c", mb)] * (len(cols) - len(names))
        cols += [(g["dp"] == dp).to_numpy() * L for dp in dps]
        names += [("d", None)] * len(dps)
        X = np.column_stack(cols).astype(float)
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        rank = np.linalg.matrix_rank(X)
        null = np.linalg.svd(X)[2][rank:]  # directions the rows leave free: a coefficient with weight there is not pinned
        free = (np.abs(null) > 1e-8).any(axis=0) if len(null) else np.zeros(X.shape[1], dtype=bool)
        resid = float(np.abs(X @ coef - y).max())
        key = key if isinstance(key, tuple) else (key,)
        for mb in mbs:
            ia, ib = names.index(("a", mb)), names.index(("b", mb))
            out.append({**dict(zip(by, key)), "micro_batch": mb, "rows": int((g["micro_batch"] == mb).sum()),
                        "a_ms": np.nan if free[ia] else float(coef[ia]), "b_ms": np.nan if free[ib] else float(coef[ib]),
                        "max_residual_ms": resid})
    return pd.DataFrame(out, columns=[*by, "micro_batch", "rows", "a_ms", "b_ms", "max_residual_ms"])


def tp_split_floor(slopes: pd.DataFrame, value: str = "a_ms", by: tuple = ("hidden", "micro_batch")) -> pd.DataFrame:
    """A model-free lower bound on a cost that one tensor-parallel degree has and a larger one does not.

    ``slopes``: one row per (``by``, ``tp``) with a time ``value`` (ms; e.g. :func:`layer_slopes`' ``a_ms``, one
    micro-batch outside the layers). Every term of such a time is split over the TP ranks (the vocabulary-parallel
    LM head, its cross-entropy, the embedding's gradient: a rank of degree ``t`` does ``t2 / t`` times the work of one
    of degree ``t2 > t``, on a bigger shard that runs at least as efficiently), or the same on every degree (the
    position embedding, the final norm, loading, host syncs), or present only when TP > 1 (the collectives, the
    vocabulary masks), so ``value(t) <= (t2 / t) x value(t2)`` unless degree ``t`` has a cost of its own. For each
    pair of degrees present in a ``by`` group, ``floor_ms`` = ``value(t) - (t2 / t) x value(t2)``: a positive figure
    is at least that much time that no term of those kinds accounts for (the TP-invariant terms only lower it, by
    ``(t2 / t - 1)`` times themselves). Returns ``by``, ``tp``, ``tp2``, ``value_tp``, ``value_tp2``, ``floor_ms``
    and ``floor_share`` (floor_ms / value(t))."""
    missing = [c for c in [*by, "tp", value] if c not in slopes.columns]
    if missing:
        raise ValueError(f"tp_split_floor: the rows have no column(s) {missing}")
    s = slopes[[*by, "tp", value]].dropna(subset=[value])
    if s.duplicated([*by, "tp"]).any():
        raise ValueError(f"tp_split_floor: more than one row per ({', '.join(by)}, tp); pass one {value} per cell")
    m = s.merge(s, on=list(by), suffixes=("", "2"))
    m = m[m["tp"] < m["tp2"]]
    out = m.rename(columns={value: "value_tp", f"{value}2": "value_tp2"})
    out["floor_ms"] = out["value_tp"] - out["tp2"] / out["tp"] * out["value_tp2"]
    out["floor_share"] = out["floor_ms"] / out["value_tp"]
    return out[[*by, "tp", "tp2", "value_tp", "value_tp2", "floor_ms", "floor_share"]].sort_values(
        [*by, "tp", "tp2"]).reset_index(drop=True)
