"""`wattcast validate trace`: every kernel a PyTorch profiler trace measured, predicted by the kernel surrogates.

The trace is imported (``data/profile_import.py``: aten op -> GPU kernels through the launch correlation, shapes and
dtype from ``Input Dims``/``Input type``); every row with a wattcast op is predicted on ``device`` with
``wattcast.predict_kernels`` (what ``wattcast kernels`` prints for the same row) and compared with the GPU time its
kernels took. Rows without a wattcast op (NCCL, memcpy/memset, ops without recorded shapes) are counted, not compared.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.kernel_ops import REPORT_FAMILY
from wattcast.data.profile_import import read_kineto


def compare_trace(path: str | Path, device: str | None = None, *, tf32: bool = False) -> tuple[dict, pd.DataFrame]:
    """(summary, compared rows). The summary has the contract keys ``rows``, ``mape_pct``, ``bias_pct`` (signed mean
    error, %), ``by_op`` (per op class: rows, mape_pct, bias_pct), ``measured_busy_ms`` and ``predicted_busy_ms``
    (summed GPU time of the compared kernels), plus the trace's device and what was not compared. ``tf32``: FP32
    matrix products ran on TF32 tensor cores (``torch.backends.cuda.matmul.allow_tf32``, PyTorch's default before
    1.12; the trace records the tensors' dtype, not the math mode)."""
    from wattcast.data.catalog import resolve_device
    from wattcast.models.kernel_predictor import predict_kernels
    from wattcast.simulate.single_device import in_stream_kernel_ms

    imp = read_kineto(path, device=device)
    dev = device or imp["device"]
    if dev is None:
        raise ValueError(f"{path}: the trace's GPU ({imp['gpu_name'] or 'not recorded'}) is not in the catalog; "
                         "give --device (a catalog name or a spec file)")
    spec = resolve_device(dev)
    k = imp["kernels"]
    mapped = k[k["OPName"].astype(str) != ""].copy()
    if tf32:
        gemm = mapped["OPName"].isin(["bmm", "linear"]) & (mapped["dtype"] == "fp32")
        mapped.loc[gemm, "dtype"] = "tf32"
    if mapped.empty:
        raise ValueError(f"{path}: no kernel in this trace could be tied to an op with recorded shapes (record the "
                         "trace with torch.profiler(..., record_shapes=True))")
    pred = predict_kernels(mapped[["OPName", "B", "M", "N", "K", "H", "dtype"]].reset_index(drop=True), spec)
    mapped = mapped.reset_index(drop=True)
    # as a step costs them (FP32 without NeuSight's isolated-timing floor): what a running model's trace measures
    mapped["pred_ms"] = in_stream_kernel_ms(pred.assign(dtype=mapped["dtype"].to_numpy()), spec)
    mapped["isolated_pred_ms"] = pred["pred_latency_ms"].to_numpy(dtype=float)
    mapped["ood"] = pred["ood"].to_numpy(dtype=bool)
    ok = np.isfinite(mapped["pred_ms"].to_numpy())
    mapped = mapped[ok]
    mapped["op_class"] = mapped["OPName"].map(REPORT_FAMILY).fillna("other")
    mapped["err_pct"] = 100 * (mapped["pred_ms"] - mapped["Latency"]) / mapped["Latency"]

    def stats(g: pd.DataFrame) -> dict:
        e = g["err_pct"]
        return dict(rows=int(len(g)), mape_pct=float(e.abs().mean()), bias_pct=float(e.mean()))

    summary = dict(stats(mapped), by_op={c: stats(g) for c, g in mapped.groupby("op_class")},
                   measured_busy_ms=float(mapped["Latency"].sum()), predicted_busy_ms=float(mapped["pred_ms"].sum()),
                   device=spec.name, gpu_name=imp["gpu_name"], trace_kernel_ms=imp["kernel_ms"],
                   not_compared_rows=int(len(k) - len(mapped)), collective_kernels=int(len(imp["collectives"])),
                   ood_fraction=float(mapped["ood"].mean()) if len(mapped) else 0.0,
                   isolated_predicted_busy_ms=float(mapped["isolated_pred_ms"].sum()), tf32=bool(tf32))
    return summary, mapped
