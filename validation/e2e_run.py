"""`wattcast validate labels`: end-to-end and per-operator errors on the NeuSight labels, logged to MLflow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.catalog import resolve_device
from wattcast.data.kernel_datasets import HELDOUT_DEVICES, load_label_nodes, resolve_data_root
from wattcast.featurize.op_graph import GraphBuilder
from wattcast.featurize.training_graph import training_graph
from wattcast.models.kernel_bundle import load_bundle
from wattcast.simulate.single_device import cost_nodes
from wattcast.validation.e2e_labels import (GOAL_E2E_MEAN_PCT, NEUSIGHT_E2E_MEAN_PCT, attach_source_consistency, evaluate_labels,
                                           plot_labels, source_consistency, summarise_labels, summarise_train_split)

_CLASS = {"linear": "linear", "bmm": "bmm", "ln": "layernorm", "softmax": "softmax"}


def label_node_errors(root: str | Path | None = None, bundle=None) -> pd.DataFrame:
    """Every mapped label-CSV node predicted alone (forward, and backward where measured), per device.

    The forward prediction of a node is the kernel the graph builder emits for it; the backward is the
    sum of the backward kernels the same builder method attaches (the rules ``training_graph`` uses), so
    this measures the per-operator pieces the end-to-end prediction is made of.
    """
    bundle = bundle or load_bundle()
    nodes = load_label_nodes(root)
    out = []
    for device, grp in nodes.groupby("device"):
        b = GraphBuilder("fp32", train=True)
        keep = []
        for r in grp.itertuples(index=False):
            op = r.op
            if op == "linear":
                b.linear(b.input((int(r.M), int(r.N))), int(r.K), name="linear")
            elif op == "bmm":
                b.matmul(b.input((int(r.B), int(r.M), int(r.N))), b.input((int(r.B), int(r.N), int(r.K))), name="bmm")
            elif op == "ln":
                b.layernorm(b.input((int(r.B), int(r.H))), name="ln")
            elif op == "softmax":
                b.softmax(b.input((int(r.B), int(r.H))), name="softmax")
            elif op in ("add", "sub", "mul", "div", "pow"):
                b.elementwise(op, b.input((int(r.B), int(r.H))), b.input((int(r.B), int(r.H))), name=op)
            elif op.endswith("u") and op[:-1] in ("add", "sub", "mul", "div", "pow"):
                b.elementwise(op[:-1], b.input((int(r.B), int(r.H))), 2.0, name=op)
            elif op in ("tanh", "gelu", "relu"):
                b.elementwise(op, b.input((int(r.B), int(r.H))), name=op)
            else:
                continue
            keep.append(r)
        if not keep:
            continue
        g = training_graph(b.build(n_layers=0), optimizer="none")
        costed = cost_nodes(g, resolve_device(device), bundle)
        fwd = costed[costed["phase"] == "forward"]
        bwd = costed[costed["phase"] == "backward"].groupby("fwd_id")["time_ms"].sum()
        kept = pd.DataFrame([k._asdict() for k in keep])
        kept["pred_fw_ms"] = fwd["time_ms"].to_numpy()
        kept["pred_bw_ms"] = bwd.reindex(np.arange(len(kept)), fill_value=0.0).to_numpy()
        out.append(kept)
    df = pd.concat(out, ignore_index=True)
    df["op_class"] = [_CLASS.get(o, "elementwise") for o in df["op"]]
    df["heldout"] = df["device"].isin(HELDOUT_DEVICES)
    return df


def summarise_node_errors(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (device, cls), g in df.groupby(["device", "op_class"]):
        fw = g[g["fw_latency_ms"] > 0]
        bw = g[(g["mode"] == "train") & (g["bw_latency_ms"] > 0)]
        rows.append(dict(device=device, op_class=cls, heldout=device in HELDOUT_DEVICES, nodes=len(fw),
                         fw_mape_pct=float((100 * (fw["pred_fw_ms"] - fw["fw_latency_ms"]).abs() / fw["fw_latency_ms"]).mean()) if len(fw) else np.nan,
                         fw_time_error_pct=float(100 * (fw["pred_fw_ms"].sum() - fw["fw_latency_ms"].sum()) / fw["fw_latency_ms"].sum()) if len(fw) else np.nan,
                         bw_nodes=len(bw),
                         bw_mape_pct=float((100 * (bw["pred_bw_ms"] - bw["bw_latency_ms"]).abs() / bw["bw_latency_ms"]).mean()) if len(bw) else np.nan,
                         bw_time_error_pct=float(100 * (bw["pred_bw_ms"].sum() - bw["bw_latency_ms"].sum()) / bw["bw_latency_ms"].sum()) if len(bw) else np.nan))
    return pd.DataFrame(rows)


def run_validate_labels(data: str | Path | None = None, *, tracking_dir: str | Path = "mlruns", use_mlflow: bool = True,
                        output: str | Path | None = None) -> dict:
    root = resolve_data_root(data)
    bundle = load_bundle()
    labels = evaluate_labels(root, bundle=bundle)
    consistency = source_consistency(root)
    if len(consistency):
        labels = attach_source_consistency(labels, consistency)
    summary = summarise_labels(labels)
    flagged = (consistency[consistency["flagged"]][["device", "folder", "stem", "fw_excess", "bw_excess", "threshold"]]
               .rename(columns={"stem": "label"}).reset_index(drop=True) if len(consistency) else consistency)
    split = summarise_train_split(labels)
    nodes = label_node_errors(root, bundle)
    node_summary = summarise_node_errors(nodes)
    if output:
        labels.to_csv(output, index=False)
    metrics: dict[str, float] = {}
    for r in summary.itertuples(index=False):
        key = f"{r.device}.{r.kind}".replace(" ", "_")
        metrics[f"e2e_mean_abs_pct.{key}"] = float(r.mean_abs_error_pct)
        metrics[f"e2e_max_abs_pct.{key}"] = float(r.max_abs_error_pct)
        metrics[f"e2e_mean_signed_pct.{key}"] = float(r.mean_signed_error_pct)
    if len(consistency):
        metrics["source_anomaly_excess_threshold"] = float(consistency["threshold"].iloc[0])
        for device, g in consistency.groupby("device"):
            metrics[f"source_anomalies.{device}".replace(" ", "_")] = float(g["flagged"].sum())
    for r in split.itertuples(index=False):
        metrics[f"train_fw_mean_abs_pct.{r.device}"] = float(r.fw_mean_abs_error_pct)
        metrics[f"train_bw_mean_abs_pct.{r.device}"] = float(r.bw_mean_abs_error_pct)
    for r in node_summary.itertuples(index=False):
        if np.isfinite(r.fw_mape_pct):
            metrics[f"node_fw_mape_pct.{r.device}.{r.op_class}"] = float(r.fw_mape_pct)
        if np.isfinite(r.bw_mape_pct):
            metrics[f"node_bw_mape_pct.{r.device}.{r.op_class}"] = float(r.bw_mape_pct)
    run_id = None
    if use_mlflow:
        from wattcast.training.tracking import log_run

        params = {"labels": int((labels["status"] == "ok").sum()), "heldout": ",".join(HELDOUT_DEVICES),
                  "bundle": str(bundle.meta.get("mlflow_run", bundle.meta.get("trained_at", ""))),
                  "neusight_e2e_mean_pct": str(NEUSIGHT_E2E_MEAN_PCT), "goal_e2e_mean_pct": str(GOAL_E2E_MEAN_PCT)}
        # summaries only: per-label measurements belong to the dataset (use --output for a local CSV)
        run_id = log_run(tracking_dir, experiment="e2e-labels", params=params, metrics=metrics, tags={"kind": "e2e-labels"},
                         tables={"labels_summary": summary, "train_forward_backward": split, "label_source_anomalies": flagged,
                                 "label_nodes_by_op_class": node_summary},
                         figures=[lambda d: plot_labels(labels, d / "labels_predicted_vs_measured.png")])
    return dict(labels=labels, summary=summary, train_split=split, nodes=nodes, node_summary=node_summary, metrics=metrics,
                source_consistency=consistency, source_anomalies=flagged, run_id=run_id)
