"""Source-consistency check of NeuSight's end-to-end labels against their own per-kernel timings.

Every single-GPU label ``labels/<device>/<label>.json`` (measured ``fw_latency``, ``bwall_latency``) has a twin
``<label>.csv``: the same model as a torch.fx graph with one layer's nodes and the nodes outside the layers, each
timed alone by NeuSight (``fw_latency``; ``bw_latency`` + ``acc_latency`` for its backward and gradient
accumulation). The label's own kernel sum of a phase is

    sum over rows outside the layers + ``num_layer`` x sum over the layer-0 rows,

without host-only rows (no tensor output: ``size``, ``getattr``, python arithmetic on sizes; and the ops PyTorch
returns as views of their input, which launch no kernel -- "Tensor Views", https://pytorch.org/docs/stable/tensor_view.html).
The statistic is ``measured_phase_ms / kernel_sum_ms - 1`` (the *excess* of the measurement over its kernels).
No prediction enters it: it compares two of the source's own measurements.

Which side is evidence of a bad measurement: each row was timed in isolation, so it carries the timing floor of an
isolated kernel (tens of microseconds even for a tiny kernel) that back-to-back kernels in a model do not pay; a
small-batch label's kernel sum therefore runs *above* its measured phase (V100 BERT-large batch 2: -21% excess),
which is expected and says nothing against the label. A measured phase far *above* the sum of every kernel it ran
carries time no kernel accounts for (allocator, synchronisation, a busy host), which no kernel model can predict:
only that side is flagged (a one-sided rule).

The threshold is not typed in: :func:`excess_threshold` derives it from the training GPUs' labels alone (every phase
of every label with a CSV on a GPU that is not held out) as Tukey's far-out fence, Q3 + 3 x IQR of their excess
(J. W. Tukey, *Exploratory Data Analysis*, 1977, ch. 2: values beyond it are "far out"), so it adapts to the data and
never looks at a held-out GPU or at any prediction. Flagged labels are still predicted and reported; ``validate
labels`` prints every device's figures with all labels (the headline) and without the flagged ones beside them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

#: ops PyTorch returns as views of their input (no kernel launched), from https://pytorch.org/docs/stable/tensor_view.html;
#: ``getitem`` is basic slicing there (a tuple element of ``split`` when the result is a tensor)
VIEW_OPS = frozenset({"view", "view_as", "permute", "transpose", "t", "unsqueeze", "squeeze", "expand", "expand_as",
                      "split", "chunk", "narrow", "unbind", "getitem", "detach", "unflatten", "movedim", "swapaxes",
                      "as_strided", "diagonal", "select", "split_with_sizes", "size", "dim", "getattr"})
#: fx node kinds that are not operations
_NOT_OPS = ("placeholder", "output", "get_attr")
#: a row inside layer 0: its nn_module_stack names ``<...>.h.0`` (GPT-2, GPT-Neo), ``.layer.0`` (BERT),
#: ``.layers.0`` (OPT) or ``.block.0`` (T5/Switch) as a module of its own
_LAYER0 = r"\.(?:h|layer|layers|block)\.0'"
#: Tukey's far-out fence multiplier (Exploratory Data Analysis, 1977)
TUKEY_FAR_OUT_K = 3.0


def op_names(op: pd.Series, target: pd.Series) -> pd.Series:
    """The operation of each fx row: the method name (``call_method``), the function's name (``call_function``,
    from ``<built-in function getitem>`` / ``<function softmax at ...>``), ``module`` for ``call_module``."""
    t = target.astype(str)
    fn = t.str.extract(r"^<(?:built-in (?:function|method)|function) (\w+)", expand=False)
    return pd.Series(np.where(op == "call_module", "module", fn.fillna(t)), index=op.index)


def kernel_rows(nodes: pd.DataFrame) -> np.ndarray:
    """True for the rows of a label CSV that run a GPU kernel: an operation with a tensor output (a ``dtype``) that
    is not a view."""
    op = nodes["op"].astype(str)
    tensor_out = nodes["dtype"].fillna("").astype(str).str.strip().ne("").to_numpy()
    return (~op.isin(_NOT_OPS).to_numpy()) & tensor_out & ~op_names(op, nodes["target"]).isin(VIEW_OPS).to_numpy()


def label_kernel_sums(nodes: pd.DataFrame) -> pd.DataFrame:
    """Per label (``nodes['label']`` keys the rows of every CSV, ``nodes['num_layer']`` its layer count): the
    forward and backward kernel sums in ms, the layer-0 row count and the kernel-row count."""
    k = kernel_rows(nodes)
    in_layer = nodes["meta"].astype(str).str.contains(_LAYER0, regex=True).to_numpy()
    w = np.where(in_layer, nodes["num_layer"].to_numpy(dtype=float), 1.0) * k
    ms = {c: pd.to_numeric(nodes[c], errors="coerce").fillna(0.0).to_numpy() for c in ("fw_latency", "bw_latency", "acc_latency")}
    fw, bw = ms["fw_latency"], ms["bw_latency"] + ms["acc_latency"]
    t = pd.DataFrame({"label": nodes["label"].to_numpy(), "kernel_fw_ms": fw * w, "kernel_bw_ms": bw * w,
                      "layer_rows": in_layer & k, "kernel_rows": k})
    return t.groupby("label", sort=False).sum()


def kernel_excess(labels: pd.DataFrame, sums: pd.DataFrame) -> pd.DataFrame:
    """``labels`` (columns ``label``, ``num_layer``, ``measured_fw_ms``, ``measured_bw_ms``) joined with their kernel
    sums; ``fw_excess`` / ``bw_excess`` = measured / kernel sum - 1 (NaN where the label has no layer rows or
    ``num_layer`` is not positive, so one layer cannot be scaled, or where the phase was not measured)."""
    t = labels.join(sums, on="label")
    ok = (t["num_layer"] > 0) & (t["layer_rows"] > 0)
    for ph in ("fw", "bw"):
        m = pd.to_numeric(t[f"measured_{ph}_ms"], errors="coerce")
        s = t[f"kernel_{ph}_ms"]
        t[f"{ph}_excess"] = (m / s - 1.0).where(ok & (m > 0) & (s > 0))
    return t


def excess_threshold(excess: pd.DataFrame, heldout: np.ndarray) -> float:
    """Tukey's far-out fence of the training GPUs' excess (forward and backward pooled): Q3 + 3 IQR."""
    v = excess.loc[~np.asarray(heldout, bool), ["fw_excess", "bw_excess"]].to_numpy(dtype=float).ravel()
    v = v[np.isfinite(v)]
    if len(v) < 4:
        raise ValueError(f"need at least 4 training-GPU label phases to set the threshold, have {len(v)}")
    q1, q3 = np.percentile(v, [25.0, 75.0])
    return float(q3 + TUKEY_FAR_OUT_K * (q3 - q1))


def flag_excess(excess: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """``excess`` with ``flagged`` (a phase's measurement exceeds its own kernel sum by more than ``threshold``;
    one-sided: a kernel sum above the measurement is the isolated-timing floor, not a bad measurement) and
    ``max_excess`` (the larger of the two phases)."""
    e = excess[["fw_excess", "bw_excess"]].to_numpy(dtype=float)
    mx = np.where(np.isfinite(e), e, -np.inf).max(axis=1)
    return excess.assign(max_excess=np.where(np.isfinite(mx), mx, np.nan), flagged=mx > threshold, threshold=threshold)


def _forward_ms(label: dict, path: Path) -> float:
    """A label's measured forward (``fw_latency``; an inference label may give only ``e2e_latency``)."""
    for k in ("fw_latency", "e2e_latency"):
        if label.get(k) is not None:
            return float(label[k])
    raise ValueError(f"{path}: label without fw_latency or e2e_latency")


def read_label_tables(labels_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every ``<folder>/<label>.json`` with a ``.csv`` twin under ``labels_dir``: the label table (``label`` =
    ``folder/stem``, ``folder``, ``stem``, ``num_layer``, measured ms) and all their CSV rows keyed by ``label``."""
    need = ["op", "target", "meta", "fw_latency", "bw_latency", "acc_latency", "dtype"]
    labs, parts = [], []
    for j in sorted(Path(labels_dir).glob("*/*.json")):
        c = j.with_suffix(".csv")
        if not c.is_file():
            continue
        d = json.loads(j.read_text())
        key = f"{j.parent.name}/{j.stem}"
        bw = float(d.get("bwall_latency") or 0.0)
        labs.append(dict(label=key, folder=j.parent.name, stem=j.stem, num_layer=int(d.get("num_layer") or 0),
                         measured_fw_ms=_forward_ms(d, j), measured_bw_ms=bw if bw > 0 else np.nan))
        n = pd.read_csv(c, usecols=lambda col: col in need)
        missing = set(need) - set(n.columns)
        if missing:
            raise ValueError(f"{c}: per-kernel label CSV without column(s) {sorted(missing)}")
        parts.append(n.assign(label=key, num_layer=labs[-1]["num_layer"]))
    nodes = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=need + ["label", "num_layer"])
    return pd.DataFrame(labs), nodes


def label_source_consistency(labels_dir: str | Path, heldout: Callable[[str], bool]) -> pd.DataFrame:
    """One row per label with a per-kernel CSV: kernel sums, measured phases, their excess, the threshold (from the
    training GPUs, ``heldout(folder) -> bool`` tells them apart) and ``flagged``."""
    labs, nodes = read_label_tables(labels_dir)
    if labs.empty:
        return labs
    labs["heldout"] = [bool(heldout(f)) for f in labs["folder"]]
    ex = kernel_excess(labs, label_kernel_sums(nodes))
    return flag_excess(ex, excess_threshold(ex, ex["heldout"].to_numpy()))
