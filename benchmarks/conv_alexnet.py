"""torchvision AlexNet's five convolutions on an A100: wattcast's kernel time against a real Kineto trace.

    python benchmarks/conv_alexnet.py [--trace PATH] [--device A100-SXM4-40GB]

The trace ($WATTCAST_DATA/traces/a100_alexnet.json.gz, PARAM's ``pytorch.model.alex_net`` forward on an
"NVIDIA A100-PG509-200", an A100 SXM4 40 GB board) runs the model in fp32 under PyTorch's default
``torch.backends.cudnn.allow_tf32 = True``: cuDNN ran conv1 (Cin 3) in FP32 (``cudnn_ampere_scudnn_128x64``), conv2 by
FFT, conv3-5 as TF32 implicit GEMMs (``sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_*``). Each
``aten::cudnn_convolution`` op's kernels are the ones its CUDA launches (``cuda_runtime`` events inside the op's time
span) start, matched by correlation id; the layout transforms cuDNN runs before its NHWC kernels
(``nchwToNhwcKernel``) and its offset table (``computeOffsetsKernel``) are shown apart (wattcast's conv kernels stand
for the convolution itself). The trace records no shapes: the convolutions are torchvision's AlexNet
(torchvision/models/alexnet.py: 3->64 k11 s4 p2, 64->192 k5 p2, 192->384 k3 p1, 384->256 k3 p1, 256->256 k3 p1 on a
224 x 224 input; the weight copies of the trace, 92,928 / 1,228,800 / 2,654,208 / 3,538,944 / 2,359,296 bytes, are
those filters in fp32) at PARAM's batch of 128 images.

wattcast's time for each is the forward conv node's GPU time (``gpu_ms``: the kernel, no host launch cost) in a
graph of the five convolutions costed as ``wattcast predict --dtype fp32`` costs an fp32 model
(``simulate.single_device.cost_nodes``), and the kernel models' rows for the same convolution in fp32 and tf32
(``wattcast kernels``). The script runs against older wattcast versions too (before stop 57: the fp32 step costed
every convolution as FP32). Since the implicit-GEMM memory correction (featurize/conv_gemm.py
``implicit_gemm_conv_ms``) conv3-5 are unchanged (compute-bound in both views) and conv2 (5x5: its 25x-unfolded input
makes the GEMM view memory-bound) moved from +30.6% to +11.4%; the trace ran conv2 by FFT.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

#: torchvision AlexNet's convolutions (Cin, Cout, kernel, stride, padding, input side) and PARAM's batch
ALEXNET_CONVS = ((3, 64, 11, 4, 2, 224), (64, 192, 5, 1, 2, 27), (192, 384, 3, 1, 1, 13), (384, 256, 3, 1, 1, 13),
                 (256, 256, 3, 1, 1, 13))
ALEXNET_BATCH = 128
#: cuDNN's helper kernels around a convolution that are not the convolution itself
_HELPER = re.compile(r"nchwToNhwc|nhwcToNchw|computeOffsets")


def measured_conv_us(path: str | Path) -> pd.DataFrame:
    """One row per ``aten::cudnn_convolution`` op of the trace: ``conv`` (1-5, in model order), ``iteration``,
    ``kernel_us`` (its convolution kernels), ``helper_us`` (layout transforms and offset tables) and ``kernels``."""
    with gzip.open(path, "rt") if str(path).endswith(".gz") else open(path) as f:
        ev = json.load(f)["traceEvents"]
    ops = sorted((e for e in ev if e.get("cat") == "cpu_op" and e.get("name") == "aten::cudnn_convolution"),
                 key=lambda e: e["ts"])
    if len(ops) % len(ALEXNET_CONVS):
        raise ValueError(f"{path}: {len(ops)} cudnn_convolution ops, not a whole number of AlexNet forwards")
    launches = [e for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})]
    l_ts = np.array([e["ts"] for e in launches], dtype=float)
    l_corr = np.array([e["args"]["correlation"] for e in launches])
    kernels = {e["args"].get("correlation"): e for e in ev if e.get("cat") == "kernel"}
    rows = []
    for i, op in enumerate(ops):
        inside = (l_ts >= op["ts"]) & (l_ts <= op["ts"] + op["dur"])
        ks = [kernels[c] for c in l_corr[inside] if c in kernels]
        main = [k for k in ks if not _HELPER.search(k["name"])]
        rows.append(dict(conv=i % len(ALEXNET_CONVS) + 1, iteration=i // len(ALEXNET_CONVS),
                         kernel_us=float(sum(k["dur"] for k in main)),
                         helper_us=float(sum(k["dur"] for k in ks) - sum(k["dur"] for k in main)),
                         kernels=" + ".join(k["name"].split("(")[0][:48] for k in main)))
    return pd.DataFrame(rows)


def predicted_conv_ms(device: str) -> pd.DataFrame:
    """Per AlexNet convolution: ``step_ms`` (its GPU time in an fp32 inference graph, as ``predict --dtype fp32``
    costs it; ``step_dtype`` the dtype it was costed in) and the kernel models' ``fp32_ms`` / ``tf32_ms`` rows."""
    from wattcast.data.catalog import resolve_device
    from wattcast.featurize.op_graph import GraphBuilder
    from wattcast.models.kernel_predictor import predict_kernels
    from wattcast.simulate.single_device import cost_nodes

    spec = resolve_device(device)
    b = GraphBuilder("fp32", train=False, name="alexnet_convs")
    for i, (cin, cout, k, s, p, side) in enumerate(ALEXNET_CONVS):
        b.conv2d(b.input((ALEXNET_BATCH, cin, side, side)), cout, k, stride=s, padding=p, name=f"conv{i + 1}")
    costed = cost_nodes(b.build(n_layers=0), spec)
    rows = pd.DataFrame([dict(op="conv", B=ALEXNET_BATCH, Input_Channel=cin, Output_Channel=cout, Kernel_Size=k,
                              Input_Size=side, Stride=s, Padding=p) for cin, cout, k, s, p, side in ALEXNET_CONVS])
    fp32 = predict_kernels(rows.assign(dtype="fp32"), spec)
    tf32 = predict_kernels(rows.assign(dtype="tf32"), spec)
    return pd.DataFrame({"conv": np.arange(1, len(ALEXNET_CONVS) + 1), "step_ms": costed["gpu_ms"].to_numpy(),
                         "step_dtype": costed["dtype"].to_numpy(), "fp32_ms": fp32["pred_latency_ms"].to_numpy(),
                         "tf32_ms": tf32["pred_latency_ms"].to_numpy(), "tf32_model": tf32["model"].to_numpy()})


def comparison(trace: str | Path, device: str) -> pd.DataFrame:
    """Measured (median over the trace's forwards) against predicted, signed % = predicted / measured - 1."""
    m = measured_conv_us(trace)
    meas = m.groupby("conv").agg(measured_us=("kernel_us", "median"), spread_pct=("kernel_us", lambda v: 100 * (v.max() / v.min() - 1)),
                                 helper_us=("helper_us", "median"), kernels=("kernels", "first")).reset_index()
    out = meas.merge(predicted_conv_ms(device), on="conv")
    for c in ("step_ms", "fp32_ms", "tf32_ms"):
        out[c.replace("_ms", "_err_pct")] = 100.0 * (out[c] * 1e3 / out["measured_us"] - 1.0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=None, help="the AlexNet trace (default $WATTCAST_DATA/traces/a100_alexnet.json.gz)")
    ap.add_argument("--device", default="A100-SXM4-40GB")
    a = ap.parse_args(argv)
    if a.trace is None:
        from wattcast.data.kernel_datasets import resolve_data_root

        a.trace = resolve_data_root() / "traces" / "a100_alexnet.json.gz"
    if not Path(a.trace).is_file():
        print(f"no trace at {a.trace}: nothing to compare", file=sys.stderr)
        return 1
    out = comparison(a.trace, a.device)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_colwidth", 60)
    print(out[["conv", "measured_us", "spread_pct", "helper_us", "step_dtype", "step_ms", "step_err_pct", "fp32_ms",
               "fp32_err_pct", "tf32_ms", "tf32_err_pct", "tf32_model"]].round(3).to_string(index=False))
    print(out[["conv", "kernels"]].to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
