"""End-to-end validation on NeuSight's model labels: predict every single-GPU label, compare, log.

A label ``labels/<device>/<model>-<train|inf>-<seq>-<batch>[-fusion].json`` is a Hugging Face model
(config in ``neusight/models/<model>.json``) in FP32 with eager attention on one GPU:
``train`` = forward + ``loss.backward()`` with the loss computed outside the timed region and no
optimizer step; ``inf`` = forward under no_grad; ``-fusion`` = ``torch.compile`` (inference).
The prediction for a train label is therefore forward (minus the loss kernel) + backward.

Held-out GPUs (L4, A100 80GB PCIe) are evaluated like the others but never used to choose anything.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.catalog import resolve_device
from wattcast.data.kernel_datasets import DEVICE_MAP, HELDOUT_DEVICES, resolve_data_root
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.models.kernel_bundle import load_bundle
from wattcast.simulate.single_device import DEFAULT_LAUNCH_OVERHEAD_MS, cost_nodes, group_totals
from wattcast.simulate.step_band import ood_band_log
from wattcast.validation.label_consistency import label_source_consistency
from wattcast.training.tracking import scatter_pred_vs_measured

LABEL = re.compile(r"^(?P<model>.+?)-(?P<mode>train|inf)-(?P<seq>\d+)-(?P<batch>\d+)(?:-(?P<opt>.+))?$")
#: NeuSight's published end-to-end mean errors on the project's held-out GPUs (the issue's baseline)
NEUSIGHT_E2E_MEAN_PCT = {"L4": 12.6, "A100-PCIe-80GB": 7.6}
GOAL_E2E_MEAN_PCT = {"L4": 6.0, "A100-PCIe-80GB": 4.0}
#: A training label whose measured forward takes more than this fraction of its measured backward carries time in
#: its forward that its kernels do not (the forward of a dense model does about half the backward's FLOPs, and the
#: dataset's own labels say so: every training label of MI100, V100, L4 and the four other MI210 ones measures
#: 0.48-0.60; A100 80GB PCIe's measure 0.49-0.52 on 3 labels and 0.72-0.94 on 7, MI210's gpt2-large b4 and gpt3-xl
#: 1.53 and 1.01, while their backward parts stay where the other labels' are). Decided from the measurements
#: alone -- the ratio of two measured numbers -- not from any prediction; such labels are still predicted and reported,
#: and the summary gives every device's figures both with all labels and with the consistent ones.
FW_OVER_BW_CONSISTENT_MAX = 0.7


@dataclass(frozen=True)
class Label:
    path: Path
    folder: str
    device: str | None
    model: str
    mode: str
    seq: int
    batch: int
    option: str
    measured_ms: float
    measured_fw_ms: float
    measured_bw_ms: float


def find_labels(root: str | Path | None = None) -> list[Label]:
    """Every single-GPU label JSON (distributed ``-dp4/-tp4/-pp4_1`` runs are issue 4's)."""
    base = resolve_data_root(root) / "neusight" / "labels"
    if not base.is_dir():
        raise FileNotFoundError(f"NeuSight labels folder not found: {base}")
    out = []
    for f in sorted(base.glob("*/*.json")):
        m = LABEL.match(f.stem)
        if m is None:
            continue
        opt = m.group("opt") or ""
        if opt not in ("", "fusion"):
            continue
        d = json.loads(f.read_text())
        out.append(Label(f, f.parent.name, DEVICE_MAP["neusight"].get(f.parent.name.replace("_", " ")), m.group("model"),
                         "train" if m.group("mode") == "train" else "inference", int(m.group("seq")), int(m.group("batch")),
                         opt, float(d["e2e_latency"]), float(d.get("fw_latency", np.nan)), float(d.get("bwall_latency", np.nan))))
    return out


def predict_label(label: Label, root: Path, bundle, launch_overhead_ms: float = DEFAULT_LAUNCH_OVERHEAD_MS) -> dict:
    cfg = root / "neusight" / "models" / f"{label.model}.json"
    row = dict(device=label.device, folder=label.folder, label=label.path.stem, model=label.model, mode=label.mode,
               seq=label.seq, batch=label.batch, fusion=label.option == "fusion", measured_ms=label.measured_ms,
               heldout=label.device in HELDOUT_DEVICES)
    if label.device is None:
        return dict(row, status="device not in catalog")
    if not cfg.is_file():
        return dict(row, status=f"no config {cfg.name} in neusight/models")
    opts = StepOptions(batch=label.batch, seq=label.seq, mode=label.mode, dtype="fp32", attention="eager",
                       compile=label.option == "fusion", optimizer="none",
                       # NeuSight's inference runs are a plain forward: the logits of every position
                       logits="all" if label.mode == "inference" else None)
    try:
        g = step_graph(cfg, opts)
    except GraphError as e:
        return dict(row, status=f"graph: {e}")
    costed = cost_nodes(g, resolve_device(label.device), bundle, launch_overhead_ms=launch_overhead_ms)
    ph = costed["phase"].to_numpy()
    t = costed["time_ms"].to_numpy()
    loss_fwd = (ph == "forward") & (costed["op_class"].to_numpy() == "loss")
    fw = float(t[(ph == "forward") & ~loss_fwd].sum())
    bw = float(t[ph == "backward"].sum())
    compared = ((ph == "forward") & ~loss_fwd) | (ph == "backward")
    pred = fw + bw
    return dict(row, status="ok", predicted_ms=pred, predicted_fw_ms=fw, predicted_bw_ms=bw,
                measured_fw_ms=label.measured_fw_ms, measured_bw_ms=label.measured_bw_ms,
                error_pct=100.0 * (pred - label.measured_ms) / label.measured_ms,
                ood_fraction=float(costed["ood"].mean()),
                # the step band's OOD term as `predict` computes it (simulate/single_device.py: ood_band_log of the
                # costed graph): validation/step_band.py scores each row against the band predict ships (stop 58)
                ood_band=ood_band_log(costed),
                # the compared time by op class: what the step band's generation term weighs (validation/step_band.py),
                # with each class's FLOPs as `predict` reports them (simulate/single_device.py summarise_costed: the
                # nodes' hardware FLOPs); until stop 54 zeros were passed and every entry read 'flops': 0.0
                per_op=group_totals(costed["op_class"].to_numpy()[compared], t[compared],
                                    costed["flops"].to_numpy(dtype=float)[compared], "op_class"))


def evaluate_labels(root: str | Path | None = None, *, bundle=None, launch_overhead_ms: float = DEFAULT_LAUNCH_OVERHEAD_MS,
                    devices: list[str] | None = None) -> pd.DataFrame:
    data_root = resolve_data_root(root)
    bundle = bundle or load_bundle()
    rows = []
    for lab in find_labels(data_root):
        if devices is not None and lab.device not in devices and lab.folder not in devices:
            continue
        rows.append(predict_label(lab, data_root, bundle, launch_overhead_ms))
    df = pd.DataFrame(rows)
    if "error_pct" in df:
        df["abs_error_pct"] = df["error_pct"].abs()
    return df


def forward_consistent(df: pd.DataFrame) -> pd.Series:
    """False for a training label whose measured forward/backward ratio is above :data:`FW_OVER_BW_CONSISTENT_MAX`
    (its forward measurement carries time the kernels do not); True for every other label."""
    fw = pd.to_numeric(df["measured_fw_ms"], errors="coerce")
    bw = pd.to_numeric(df["measured_bw_ms"], errors="coerce")
    train = (df["mode"] == "train") & (fw > 0) & (bw > 0)
    return ~(train & (fw / bw.where(bw > 0) > FW_OVER_BW_CONSISTENT_MAX))


def label_device(folder: str) -> str | None:
    """The catalog name of a NeuSight label folder (``NVIDIA_A100_80GB_PCIe`` -> ``A100-PCIe-80GB``), None if unknown."""
    return DEVICE_MAP["neusight"].get(folder.replace("_", " "))


def source_consistency(root: str | Path | None = None) -> pd.DataFrame:
    """Every label with a per-kernel CSV checked against its own kernel sums (``validation/label_consistency.py``);
    the threshold comes from the training GPUs' labels, held-out ones (``HELDOUT_DEVICES``) never set it."""
    base = resolve_data_root(root) / "neusight" / "labels"
    t = label_source_consistency(base, heldout=lambda folder: label_device(folder) in HELDOUT_DEVICES)
    if len(t):
        t.insert(1, "device", [label_device(f) for f in t["folder"]])
    return t


def attach_source_consistency(df: pd.DataFrame, consistency: pd.DataFrame) -> pd.DataFrame:
    """``df`` (``evaluate_labels``) with each label's ``kernel_fw_excess`` / ``kernel_bw_excess`` (measured phase over
    its own kernel sum, minus 1; NaN without a CSV) and ``source_anomaly`` (flagged by the check; False where the label
    has no per-kernel CSV to check it against)."""
    c = consistency[["folder", "stem", "fw_excess", "bw_excess", "flagged"]].rename(columns={
        "stem": "label", "fw_excess": "kernel_fw_excess", "bw_excess": "kernel_bw_excess", "flagged": "source_anomaly"})
    out = df.drop(columns=["kernel_fw_excess", "kernel_bw_excess", "source_anomaly"], errors="ignore").merge(
        c[["folder", "label", "kernel_fw_excess", "kernel_bw_excess", "source_anomaly"]], on=["folder", "label"], how="left")
    out["source_anomaly"] = out["source_anomaly"].fillna(False).astype(bool)
    return out


def summarise_labels(df: pd.DataFrame) -> pd.DataFrame:
    """Mean and max absolute error per device and mode (fusion runs apart), and per device over all labels
    (``all``) and over the labels whose forward is consistent with their backward (``all-fw-consistent``, see
    :data:`FW_OVER_BW_CONSISTENT_MAX`; the same as ``all`` where no label is inconsistent). With a ``source_anomaly``
    column (:func:`attach_source_consistency`) also over the labels not flagged by the per-kernel source check
    (``all-without-source-anomalies``)."""
    ok = df[df["status"] == "ok"].copy()
    ok["kind"] = np.where(ok["fusion"], "inference-compile", ok["mode"])
    agg = dict(labels=("abs_error_pct", "size"), mean_abs_error_pct=("abs_error_pct", "mean"),
               max_abs_error_pct=("abs_error_pct", "max"), mean_signed_error_pct=("error_pct", "mean"))
    g = ok.groupby(["device", "kind"]).agg(**agg)
    parts = [g]
    kinds = [("all", ok), ("all-fw-consistent", ok[forward_consistent(ok).to_numpy()])]
    if "source_anomaly" in ok:
        kinds.append(("all-without-source-anomalies", ok[~ok["source_anomaly"].to_numpy(dtype=bool)]))
    for kind, rows in kinds:
        a = rows.groupby("device").agg(**agg)
        a["kind"] = kind
        parts.append(a.reset_index().set_index(["device", "kind"]))
    out = pd.concat(parts).sort_index().reset_index()
    out["heldout"] = out["device"].isin(HELDOUT_DEVICES)
    return out


def summarise_train_split(df: pd.DataFrame) -> pd.DataFrame:
    """Training labels split into their measured parts: forward and backward errors per device, and the
    measured forward/backward time ratio next to the predicted one.

    The labels time forward and backward separately (``fw_latency``, ``bwall_latency``), so where a step's
    error comes from can be told apart. The forward of a dense model does about half the backward's work,
    so its measured fw/bw ratio should sit near the predicted one whatever the GPU; a ratio far above it
    means the forward measurement carries time the kernels do not (allocator, synchronisation), which no
    kernel model predicts."""
    ok = df[(df["status"] == "ok") & (df["mode"] == "train")]
    ok = ok[(ok["measured_fw_ms"] > 0) & (ok["measured_bw_ms"] > 0)]
    fw_err = 100.0 * (ok["predicted_fw_ms"] / ok["measured_fw_ms"] - 1.0)
    bw_err = 100.0 * (ok["predicted_bw_ms"] / ok["measured_bw_ms"] - 1.0)
    t = pd.DataFrame({"device": ok["device"], "fw": fw_err.abs(), "bw": bw_err.abs(), "step": ok["abs_error_pct"],
                      "m_ratio": ok["measured_fw_ms"] / ok["measured_bw_ms"], "p_ratio": ok["predicted_fw_ms"] / ok["predicted_bw_ms"],
                      "inconsistent": ~forward_consistent(ok)})
    out = t.groupby("device").agg(labels=("fw", "size"), fw_mean_abs_error_pct=("fw", "mean"), bw_mean_abs_error_pct=("bw", "mean"),
                                  step_mean_abs_error_pct=("step", "mean"), measured_fw_over_bw=("m_ratio", "median"),
                                  predicted_fw_over_bw=("p_ratio", "median"),
                                  fw_inconsistent=("inconsistent", "sum")).reset_index()
    out["heldout"] = out["device"].isin(HELDOUT_DEVICES)
    return out


def plot_labels(df: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = df[df["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(6.5, 6))
    for (held, mode), g in ok.groupby(["heldout", "mode"]):
        ax.scatter(g["measured_ms"], g["predicted_ms"], s=22, marker="o" if mode == "train" else "^",
                   label=f"{'held-out' if held else 'training GPUs'}, {mode}", alpha=0.8)
    scatter_pred_vs_measured(ax, [ok], 0.15, "measured step (ms)", "predicted step (ms)",
                             "NeuSight labels: end-to-end, one GPU (dotted: +/-15%)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
