"""ResNet-50 training on a V100: wattcast's step against a real Kineto trace, term by term and conv layer by layer.

    python benchmarks/resnet50_v100_trace.py [--data PATH | --trace FILE] [--device V100-SXM2-32GB] [--no-mlflow]

The trace ($WATTCAST_DATA/traces/v100_rank0.json.gz; traces/SOURCE-hta.md: HolisticTraceAnalysis
tests/data/ns_resolution_trace, a ``torchx-pytorch_resnet_integration_test`` job on a "Tesla V100-SXM2-32GB", DDP with
world size 1, SGD) records no shapes. What it shows: torchvision's ResNet-50 (53 ``aten::cudnn_convolution`` and 53
``aten::cudnn_batch_norm`` a step; each BatchNorm's cuDNN per-channel kernel launches one block per channel, and the 53
channel counts read that way are torchvision's in its order conv1, then per bottleneck conv1 1x1, conv2 3x3 (the
stride), conv3 1x1, downsample 1x1 (torchvision/models/resnet.py ``Bottleneck.forward``)); batch 32 (the max-pool
kernel runs one thread per output element: 25,088 blocks x 256 threads = 32 x 64 x 56 x 56); FP32 (V100, no TF32).

Attribution (no heuristics on kernel names alone): every kernel carries the ``External id`` of the CPU op that launched
it (its ``cuda_runtime`` launch has the same correlation id; Kineto's ``ac2g`` flow links the two); the op's ancestors
(CPU ops and user annotations nested by time on the launching thread) give its category, the innermost that has one:
``aten::cudnn_convolution`` forward conv, ``aten::convolution_backward`` conv backward, ``aten::cudnn_batch_norm`` /
``aten::cudnn_batch_norm_backward`` BatchNorm, ``Optimizer.step#SGD.step`` optimizer, DDP's reducer ops (its gradient
scaling by 1 / world size and bucket copies, present though the world size is 1) DDP, pooling, fc / loss, and the
rest elementwise (ReLU, residual add, BatchNorm's ``num_batches_tracked`` add, their gradients). Inside one
``aten::convolution_backward`` cuDNN is called once for the input gradient, then once for the weight gradient (ATen's
cudnn ``convolution_backward``); each call opens with a ``cudaEventRecord`` on the launching thread, so the launches
are split at those records: the last group is the weight gradient (wgrad), an earlier one the input gradient (dgrad;
conv1 has none: its input needs no gradient). The split is checked against the kernel names (no ``wgrad`` /
``cudnn_train`` / ``reduce_wgrad`` kernel in a dgrad group, no ``dgrad_engine`` / ``cudnn_infer`` / Winograd forward
transform in a wgrad group). A backward conv is tied to its forward conv by the autograd ``Sequence number`` that
``aten::convolution`` and ``ConvolutionBackward0`` share (Kineto's ``fwdbwd`` flow). Steps: the steady
ProfilerStep#103-105 (a kernel is in the step whose time span holds its launch).

wattcast's side: ``wattcast.predict(ResNet50(), device, dtype="fp32", mode="train", example_inputs=(32x3x224x224,))``
(the default optimizer, AdamW + clipping; the SGD the trace ran is costed too for the optimizer row), its nodes' GPU
time (``gpu_ms``, no host launch cost) summed per term; per conv layer by module scope.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

TRACE = Path("traces") / "v100_rank0.json.gz"
STEADY_STEPS = ("ProfilerStep#103", "ProfilerStep#104", "ProfilerStep#105")
BATCH = 32
DEVICE = "V100-SXM2-32GB"

#: CPU ops / user annotations that decide a kernel's category (the innermost ancestor that is one of them wins)
CATEGORY_OF_OP = {
    "aten::cudnn_convolution": "conv_fwd",
    "aten::convolution_backward": "conv_bwd",
    "aten::cudnn_batch_norm": "bn_fw",
    "aten::cudnn_batch_norm_backward": "bn_bw",
    "aten::max_pool2d_with_indices": "pool",
    "aten::max_pool2d_with_indices_backward": "pool",
    "aten::adaptive_avg_pool2d": "pool",
    "MeanBackward1": "pool",
    "aten::linear": "fc_loss",
    "AddmmBackward0": "fc_loss",
    "aten::cross_entropy_loss": "fc_loss",
    "LogSoftmaxBackward0": "fc_loss",
    "DivBackward1": "fc_loss",
    "NegBackward0": "fc_loss",
    "SumBackward0": "fc_loss",
    "MulBackward0": "fc_loss",
    "torch::distributed::reducer::mul_out": "ddp",
    "torch.distributed.ddp.reducer::copy_bucket_to_grad": "ddp",
    "c10d::allreduce_": "ddp",
    "c10d::broadcast_": "ddp",
    "aten::flatten_dense_tensors": "ddp",
    "aten::unflatten_dense_tensors": "ddp",
    "DistributedDataParallel.forward": "ddp_forward",  # the buffers' broadcast before forward (innermost wins)
}
#: conv ops whose autograd Sequence number ties a backward conv to its forward one
_SEQ_OPS = ("aten::convolution", "ConvolutionBackward0")
_WGRAD_NAME = re.compile(r"wgrad|Wgrad|cudnn_train|reduce_wgrad")
_DGRAD_NAME = re.compile(r"dgrad_engine|cudnn_infer|winogradForward")
TERMS = ("conv_fwd", "conv_dgrad", "conv_wgrad", "bn_fw", "bn_bw", "elementwise_fwd", "elementwise_bwd", "pool",
         "fc_loss", "ddp", "optimizer")


def torchvision_convs() -> pd.DataFrame:
    """torchvision ResNet-50's 53 convolutions in its forward order (torchvision/models/resnet.py: conv1 7x7/2; per
    Bottleneck conv1 1x1, conv2 3x3 with the stage's stride (v1.5), conv3 1x1, then the first block's downsample 1x1):
    ``scope`` (the module path in this file's ResNet50), cin, cout, k, stride, side (input H = W), flops (fwd)."""
    rows = [("conv1", 3, 64, 7, 2, 224)]
    cin, side, i = 64, 56, 0
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            s = stride if b == 0 else 1
            rows += [(f"layers.{i}.c1", cin, width, 1, 1, side), (f"layers.{i}.c2", width, width, 3, s, side),
                     (f"layers.{i}.c3", width, 4 * width, 1, 1, side // s)]
            if b == 0:
                rows.append((f"layers.{i}.down.0", cin, 4 * width, 1, s, side))
            cin, side, i = 4 * width, side // s, i + 1
    t = pd.DataFrame(rows, columns=["scope", "cin", "cout", "k", "stride", "side"])
    out_side = (t.side + 2 * (t.k // 2) - t.k) // t.stride + 1
    t["flops"] = 2.0 * BATCH * t.cout * out_side ** 2 * t.cin * t.k ** 2
    t["shape"] = (t.k.astype(str) + "x" + t.k.astype(str) + " s" + t.stride.astype(str) + " " + t.cin.astype(str) + "->"
                  + t.cout.astype(str) + " @" + t.side.astype(str))
    return t


def load_trace(path: str | Path) -> dict:
    """The trace's events as frames: ``ops`` (cpu_op and user_annotation: name, tid, ts, end, ext, seq), ``runtime``
    (cuda_runtime: name, tid, ts, corr), ``kernels`` (name, ts, dur, corr, ext, grid0, block0), ``steps``
    (ProfilerStep annotations), ``memcpy_us`` per ProfilerStep (gpu_memcpy + gpu_memset, not kernels)."""
    path = Path(path)
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        doc = json.load(f)
    ev = [e for e in doc.get("traceEvents", []) if e.get("ph") == "X"]
    if not ev:
        raise ValueError(f"{path}: no complete ('X') events in traceEvents: not a Kineto trace")
    df = pd.DataFrame({"cat": [e.get("cat") for e in ev], "name": [e.get("name", "") for e in ev],
                       "tid": [e.get("tid") for e in ev], "ts": [float(e["ts"]) for e in ev],
                       "dur": [float(e.get("dur", 0.0)) for e in ev],
                       "ext": [e.get("args", {}).get("External id") for e in ev],
                       "seq": [e.get("args", {}).get("Sequence number") for e in ev],
                       "corr": [e.get("args", {}).get("correlation") for e in ev],
                       "grid0": [(e.get("args", {}).get("grid") or [np.nan])[0] for e in ev],
                       "block0": [(e.get("args", {}).get("block") or [np.nan])[0] for e in ev]})
    df["end"] = df.ts + df.dur
    ops = df[df.cat.isin(["cpu_op", "user_annotation"])].reset_index(drop=True)
    kernels = df[df.cat == "kernel"].reset_index(drop=True)
    if kernels.empty:
        raise ValueError(f"{path}: the trace has no kernel events")
    steps = ops[ops.name.str.startswith("ProfilerStep#")].set_index("name")
    copies = df[df.cat.isin(["gpu_memcpy", "gpu_memset"])]
    runtime = df[df.cat == "cuda_runtime"].reset_index(drop=True)
    dev = [d.get("name") for d in doc.get("deviceProperties", [])]
    return dict(ops=ops, runtime=runtime, kernels=kernels, steps=steps, copies=copies, devices=dev)


def _annotate_ops(ops: pd.DataFrame) -> pd.DataFrame:
    """Per op: ``category`` (innermost ancestor-or-self in CATEGORY_OF_OP, or inside ``Optimizer.step#``),
    ``conv_seq`` (innermost aten::convolution / ConvolutionBackward0 Sequence number) and ``conv_bwd_ext`` (the
    enclosing aten::convolution_backward's External id). Ops nest by time on their thread; one stack walk a thread
    (the nesting is sequential by nature)."""
    ops = ops.sort_values(["tid", "ts", "end"], ascending=[True, True, False]).reset_index(drop=True)
    own = ops.name.map(CATEGORY_OF_OP)
    own = own.where(~ops.name.str.startswith("Optimizer.step#"), "optimizer")
    cat, seq, cbw = [None] * len(ops), [None] * len(ops), [None] * len(ops)
    names, tids, ts, ends, seqs, exts = (ops.name.to_numpy(), ops.tid.to_numpy(), ops.ts.to_numpy(),
                                         ops.end.to_numpy(), ops.seq.to_numpy(), ops.ext.to_numpy())
    owns = own.to_numpy()
    stack: list[int] = []
    for i in range(len(ops)):
        while stack and (tids[stack[-1]] != tids[i] or ts[i] >= ends[stack[-1]]):
            stack.pop()
        p = stack[-1] if stack else None
        cat[i] = owns[i] if isinstance(owns[i], str) else (cat[p] if p is not None else None)
        seq[i] = seqs[i] if names[i] in _SEQ_OPS else (seq[p] if p is not None else None)
        cbw[i] = exts[i] if names[i] == "aten::convolution_backward" else (cbw[p] if p is not None else None)
        stack.append(i)
    return ops.assign(category=cat, conv_seq=seq, conv_bwd_ext=cbw)


def classify(trace: dict, steps=STEADY_STEPS) -> pd.DataFrame:
    """One row per kernel launched in ``steps``: step, name, dur_us, grid0, block0, op (launching CPU op), term (one of
    TERMS), layer (0-52, torchvision forward order, for conv kernels), cudnn_call (0-based within the op)."""
    ops = _annotate_ops(trace["ops"])
    missing = [s for s in steps if s not in trace["steps"].index]
    if missing:
        raise ValueError(f"the trace has no {', '.join(missing)} (its steps: {', '.join(trace['steps'].index)})")
    rt = trace["runtime"]
    k = trace["kernels"].merge(rt[["corr", "ts", "tid"]].rename(columns={"ts": "launch_ts", "tid": "launch_tid"}),
                               on="corr", how="left")
    if k.launch_ts.isna().any():
        raise ValueError(f"{int(k.launch_ts.isna().sum())} kernel(s) have no cuda_runtime launch with their correlation id")
    by_ext = ops.dropna(subset=["ext"]).drop_duplicates("ext").set_index("ext")
    k = k.join(by_ext[["name", "category", "conv_seq", "conv_bwd_ext", "tid"]].rename(
        columns={"name": "op", "tid": "op_tid"}), on="ext")
    if k.op.isna().any():
        raise ValueError(f"{int(k.op.isna().sum())} kernel(s) carry an External id no cpu_op has")
    st = trace["steps"].loc[list(steps)]
    k["step"] = None
    for name, s in st.iterrows():
        k.loc[(k.launch_ts >= s.ts) & (k.launch_ts <= s.end), "step"] = name
    k = k[k.step.notna()].sort_values("launch_ts").reset_index(drop=True)
    k = k.rename(columns={"dur": "dur_us"})

    # cuDNN calls inside each convolution_backward: count cudaEventRecord launches on the thread before each kernel
    rec = rt[rt.name == "cudaEventRecord"]
    k["cudnn_call"] = -1
    bwd = k.category == "conv_bwd"
    opsx = ops.set_index("ext")
    for ext, g in k[bwd].groupby("conv_bwd_ext"):
        o = opsx.loc[ext]
        r = rec[(rec.tid == o.tid) & (rec.ts >= o.ts) & (rec.ts <= o.end)].ts.to_numpy()
        k.loc[g.index, "cudnn_call"] = np.searchsorted(np.sort(r), g.launch_ts.to_numpy()) - 1
    last = k[bwd].groupby("conv_bwd_ext").cudnn_call.transform("max")
    term = k.category.fillna("elementwise").astype(object)
    term[bwd] = np.where(k.loc[bwd, "cudnn_call"] == last, "conv_wgrad", "conv_dgrad")
    ew = term.isin(["elementwise", "ddp_forward"])
    phase_bwd = k.launch_tid != trace["steps"].tid.iloc[0]  # the autograd engine's thread
    term[ew] = np.where(phase_bwd[ew], "elementwise_bwd", "elementwise_fwd")
    k["term"] = term
    bad = ((k.term == "conv_dgrad") & k.name.str.contains(_WGRAD_NAME)) | ((k.term == "conv_wgrad") & k.name.str.contains(_DGRAD_NAME))
    if bad.any():
        raise ValueError("cuDNN call split disagrees with the kernel names: "
                         + "; ".join(f"{r.term} {r.name[:60]}" for r in k[bad].itertuples()))

    # layer index: forward convs in launch order within the step; backward ones through the Sequence number
    fwd_ops = (k[k.term == "conv_fwd"].drop_duplicates("ext")[["step", "ext", "conv_seq", "launch_ts"]])
    fwd_ops["layer"] = fwd_ops.groupby("step").cumcount()
    k = k.merge(fwd_ops[["ext", "layer"]], on="ext", how="left")
    seq_layer = fwd_ops.dropna(subset=["conv_seq"]).set_index("conv_seq").layer
    cb = k.term.isin(["conv_dgrad", "conv_wgrad"])
    k.loc[cb, "layer"] = k.loc[cb, "conv_seq"].map(seq_layer)
    if k.loc[cb, "layer"].isna().any():
        raise ValueError("a conv backward kernel has no forward conv with its autograd Sequence number")
    return k


def structure(k: pd.DataFrame) -> dict:
    """The facts the trace shows per step (all steps must agree): kernels, kernel_ms, conv / BN counts, BN channels
    (grid x of the cuDNN per-channel BN forward kernel, in order), batch (from the max-pool kernel)."""
    out = {}
    for step, g in k.groupby("step"):
        bn = g[g.term == "bn_fw"]
        bn_main = bn[bn.name.str.contains("bn_fw")]
        pool = g[(g.term == "pool") & g.op.eq("aten::max_pool2d_with_indices")]
        out[step] = dict(kernels=len(g), kernel_ms=g.dur_us.sum() / 1e3, conv_fwd_ops=g[g.term == "conv_fwd"].ext.nunique(),
                         bn_fw_kernels=len(bn_main), bn_bw_kernels=int(g.name.str.contains("bn_bw").sum()),
                         bn_channels=bn_main.grid0.astype(int).tolist(),
                         maxpool_threads=int((pool.grid0 * pool.block0).sum()))
    return out


def measured_terms(k: pd.DataFrame) -> pd.DataFrame:
    """ms per term per steady step, and the mean / spread over the steps."""
    t = k.pivot_table(index="term", columns="step", values="dur_us", aggfunc="sum").reindex(TERMS).fillna(0.0) / 1e3
    n = k.pivot_table(index="term", columns="step", values="dur_us", aggfunc="count").reindex(TERMS).fillna(0)
    return pd.DataFrame({"kernels": n.median(axis=1).astype(int), "measured_ms": t.mean(axis=1),
                         "step_spread_pct": 100 * (t.max(axis=1) - t.min(axis=1)) / t.mean(axis=1).where(t.mean(axis=1) > 0)})


def measured_layers(k: pd.DataFrame) -> pd.DataFrame:
    """Per conv layer (torchvision order): fwd / dgrad / wgrad us (mean over the steps) and the main kernel of each."""
    c = k[k.term.isin(["conv_fwd", "conv_dgrad", "conv_wgrad"])]
    us = c.pivot_table(index="layer", columns=["term"], values="dur_us", aggfunc="sum") / len(c.step.unique())
    main = (c.sort_values("dur_us").groupby(["layer", "term"]).name.last()
            .map(lambda n: re.sub(r"\(.*|^void |<.*", "", n).replace("cudnn::", "").replace("winograd_nonfused::", "wino_nf::")[:44])
            .unstack())
    names = c.groupby(["layer", "term"]).name.agg(" ".join)
    algo = pd.Series(np.select([names.str.contains("winograd_nonfused"), names.str.contains("winograd"),
                                names.str.contains("dgrad_engine|wgrad_alg0"), names.str.contains("scudnn"),
                                names.str.contains("sgemm")],
                               ["winograd (nonfused: transforms + sgemm)", "winograd (fused)", "cudnn direct engine",
                                "implicit GEMM (scudnn)", "explicit sgemm"], "other"), index=names.index).unstack()
    out = pd.concat([us.add_suffix("_us"), main.add_suffix("_kernel"), algo.add_suffix("_algo")], axis=1)
    out.index = out.index.astype(int)
    return out


# --- wattcast ---------------------------------------------------------------------------------------------------
def resnet50():
    """torchvision-shaped ResNet-50 (25,557,032 parameters; the downsample costed the same, run first here)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Bottleneck(nn.Module):
        def __init__(s, cin, w, cout, stride):
            super().__init__()
            s.c1 = nn.Conv2d(cin, w, 1, bias=False); s.b1 = nn.BatchNorm2d(w)
            s.c2 = nn.Conv2d(w, w, 3, stride, 1, bias=False); s.b2 = nn.BatchNorm2d(w)
            s.c3 = nn.Conv2d(w, cout, 1, bias=False); s.b3 = nn.BatchNorm2d(cout)
            s.down = None
            if stride != 1 or cin != cout:
                s.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(s, x):
            i = x if s.down is None else s.down(x)
            y = F.relu(s.b1(s.c1(x))); y = F.relu(s.b2(s.c2(y))); y = s.b3(s.c3(y))
            return F.relu(y + i)

    class ResNet50(nn.Module):
        def __init__(s):
            super().__init__()
            s.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False); s.bn1 = nn.BatchNorm2d(64); s.pool = nn.MaxPool2d(3, 2, 1)
            L, cin = [], 64
            for w, n, st in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
                for i in range(n):
                    L.append(Bottleneck(cin, w, w * 4, st if i == 0 else 1)); cin = w * 4
            s.layers = nn.Sequential(*L); s.fc = nn.Linear(2048, 1000)

        def forward(s, x):
            x = s.pool(F.relu(s.bn1(s.conv1(x)))); x = s.layers(x)
            return s.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    return ResNet50()


def predict(device: str = DEVICE, **kw):
    import torch

    import wattcast

    return wattcast.predict(resnet50(), device, dtype="fp32", mode="train",
                            example_inputs=(torch.randn(BATCH, 3, 224, 224),), **kw)


def predicted_terms(p) -> pd.Series:
    """wattcast's GPU ms per term (TERMS) from the prediction's nodes."""
    n = p.nodes
    cls, ph = n.op_class, n.phase
    masks = {"conv_fwd": (cls == "conv") & (ph == "forward"), "conv_dgrad": n.kernel == "conv_dgrad",
             "conv_wgrad": n.kernel == "conv_wgrad", "bn_fw": (cls == "layernorm") & (ph == "forward"),
             "bn_bw": (cls == "layernorm") & (ph == "backward"),
             "elementwise_fwd": (cls == "elementwise") & (ph == "forward"),
             "elementwise_bwd": (cls == "elementwise") & (ph == "backward"),
             "pool": cls == "other", "fc_loss": cls.isin(["linear", "reduction"]), "optimizer": ph == "optimizer"}
    s = pd.Series({t: float(n.loc[masks[t], "gpu_ms"].sum()) if t in masks else 0.0 for t in TERMS})
    covered = np.logical_or.reduce(list(masks.values()))
    if not covered.all():
        raise ValueError(f"prediction nodes in no term: {sorted(set(n.loc[~covered, 'op_class']))}")
    return s


def comparison(trace_path: str | Path, device: str = DEVICE):
    """(terms table, per-layer table, structure, extras)."""
    tr = load_trace(trace_path)
    k = classify(tr)
    facts = structure(k)
    p = predict(device)
    p_sgd = predict(device, optimizer="sgd", optimizer_impl="foreach")
    m = measured_terms(k)
    m["predicted_ms"] = predicted_terms(p)
    m["signed_pct"] = 100 * (m.predicted_ms / m.measured_ms - 1)
    m.loc["optimizer", "predicted_sgd_ms"] = predicted_terms(p_sgd)["optimizer"]
    steps = tr["steps"].loc[list(STEADY_STEPS)]
    gpu_pred = float(p.nodes.gpu_ms.sum())
    conv = m.loc[["conv_fwd", "conv_dgrad", "conv_wgrad"], ["measured_ms", "predicted_ms"]].sum()
    whole = pd.DataFrame({"measured_ms": [conv.measured_ms, m.measured_ms.sum(), steps.dur.mean() / 1e3],
                          "predicted_ms": [conv.predicted_ms, gpu_pred, p.step_time_ms]},
                         index=["conv (fwd + dgrad + wgrad)", "kernel time (GPU)", "step (wall; predicted with host gaps)"])
    whole["signed_pct"] = 100 * (whole.predicted_ms / whole.measured_ms - 1)
    # per layer
    convs = torchvision_convs()
    lay = convs.join(measured_layers(k))
    nodes = p.nodes[p.nodes.op_class == "conv"]
    for term, mask in (("fwd", nodes.phase == "forward"), ("dgrad", nodes.kernel == "conv_dgrad"),
                       ("wgrad", nodes.kernel == "conv_wgrad")):
        pred_us = nodes[mask].groupby("scope").gpu_ms.sum() * 1e3
        lay[f"pred_{term}_us"] = lay.scope.map(pred_us)
        lay[f"{term}_pct"] = 100 * (lay[f"pred_{term}_us"] / lay[f"conv_{term}_us"] - 1)
    if lay[["pred_fwd_us", "pred_wgrad_us"]].isna().any().any():
        raise ValueError("a torchvision conv has no predicted node with its scope")
    lay["meas_fwd_tflops"] = lay.flops / lay.conv_fwd_us / 1e6
    lay["pred_fwd_tflops"] = lay.flops / lay.pred_fwd_us / 1e6
    # a 1x1 stride-1 conv is one GEMM (M = batch x H x W, N = Cout, K = Cin): wattcast's fp32 GEMM model's time for it
    one = lay[(lay.k == 1) & (lay.stride == 1)]
    from wattcast import predict_kernels

    gemm = predict_kernels(pd.DataFrame({"op": "linear", "B": 1, "M": BATCH * one.side ** 2, "N": one.cout, "K": one.cin}),
                           device, dtype="fp32")
    lay.loc[one.index, "pred_as_gemm_us"] = gemm.pred_latency_ms.to_numpy() * 1e3
    cp = tr["copies"].merge(tr["runtime"][["corr", "ts"]].rename(columns={"ts": "launch_ts"}), on="corr")
    copies_ms = float(np.mean([cp[(cp.launch_ts >= s.ts) & (cp.launch_ts <= s.end)].dur.sum()
                               for _, s in steps.iterrows()])) / 1e3
    return m, whole, lay, facts, dict(prediction=p, devices=tr["devices"], memcpy_ms=copies_ms, kernels=k)


def group_table(lay: pd.DataFrame) -> pd.DataFrame:
    """Conv time measured vs predicted per shape class (kernel, stride, role) and phase."""
    role = np.where(lay.scope.str.endswith("down.0"), "downsample", np.where(lay.scope == "conv1", "stem", "main"))
    g = lay.assign(cls=lay.k.astype(str) + "x" + lay.k.astype(str) + " s" + lay.stride.astype(str) + " " + role)
    rows = []
    for cls, x in g.groupby("cls"):
        for ph in ("fwd", "dgrad", "wgrad"):
            meas, pred = x[f"conv_{ph}_us"].sum() / 1e3, x[f"pred_{ph}_us"].where(x[f"conv_{ph}_us"].notna()).sum() / 1e3
            rows.append(dict(shape_class=cls, phase=ph, convs=int(x[f"conv_{ph}_us"].notna().sum()), measured_ms=meas,
                             predicted_ms=pred, diff_ms=pred - meas,
                             signed_pct=100 * (pred / meas - 1) if meas else np.nan))
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="the datasets folder (default: $WATTCAST_DATA, then ../shared/datasets)")
    ap.add_argument("--trace", default=None, help=f"the trace file (default DATA/{TRACE.as_posix()})")
    ap.add_argument("--device", default=DEVICE)
    ap.add_argument("--mlruns", default="mlruns")
    ap.add_argument("--no-mlflow", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.time()
    if a.trace is None:
        from wattcast.data.kernel_datasets import DataNotFoundError, resolve_data_root

        try:
            a.trace = resolve_data_root(a.data) / TRACE
        except DataNotFoundError as e:
            print(f"no datasets folder: {e}", file=sys.stderr)
            return 1
    if not Path(a.trace).is_file():
        print(f"no trace at {a.trace} (HolisticTraceAnalysis tests/data/ns_resolution_trace/rank-0...json.gz, see "
              f"traces/SOURCE-hta.md); give it with --trace FILE or the folder with --data PATH", file=sys.stderr)
        return 1
    terms, whole, lay, facts, extra = comparison(a.trace, a.device)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 40)
    pd.set_option("display.max_rows", 200)
    print(f"trace {a.trace}: {extra['devices'][0] if extra['devices'] else '?'}; steady steps {', '.join(STEADY_STEPS)}")
    for s, f in facts.items():
        print(f"  {s}: {f['kernels']} kernels, {f['kernel_ms']:.2f} ms kernel time, {f['conv_fwd_ops']} forward convs, "
              f"{f['bn_fw_kernels']} BN fw / {f['bn_bw_kernels']} BN bw kernels, max-pool threads {f['maxpool_threads']:,} "
              f"(= batch {f['maxpool_threads'] / (64 * 56 * 56):g} x 64 x 56 x 56)")
    chans = facts[STEADY_STEPS[0]]["bn_channels"]
    print(f"  BN channels in order match torchvision ResNet-50's conv outputs: {chans == torchvision_convs().cout.tolist()}; "
          f"memcpy/memset (not kernels) {extra['memcpy_ms']:.2f} ms a step")
    print("\nper term, ms a step (measured: mean over the 3 steady steps; predicted: wattcast GPU time of the nodes)")
    print(terms.round(2).to_string())
    print(whole.round(2).to_string())
    print("\nconv time by shape class and phase")
    gt = group_table(lay)
    print(gt.round(2).to_string(index=False))
    print("\nforward conv time by the algorithm cuDNN ran (read from the kernel names)")
    ga = lay.groupby("conv_fwd_algo").agg(convs=("scope", "size"), measured_ms=("conv_fwd_us", "sum"),
                                          predicted_ms=("pred_fwd_us", "sum"), meas_tflops=("meas_fwd_tflops", "median"),
                                          pred_tflops=("pred_fwd_tflops", "median"))
    ga[["measured_ms", "predicted_ms"]] /= 1e3
    ga["signed_pct"] = 100 * (ga.predicted_ms / ga.measured_ms - 1)
    print(ga.round(2).to_string())
    print("\nper conv layer (torchvision forward order), us; tflops = forward FLOPs / time (V100 FP32 peak 15.7)")
    cols = ["scope", "shape", "conv_fwd_us", "pred_fwd_us", "fwd_pct", "meas_fwd_tflops", "pred_fwd_tflops", "pred_as_gemm_us",
            "conv_dgrad_us", "pred_dgrad_us", "dgrad_pct", "conv_wgrad_us", "pred_wgrad_us", "wgrad_pct",
            "conv_fwd_algo", "conv_fwd_kernel", "conv_dgrad_kernel", "conv_wgrad_kernel"]
    print(lay[cols].round(1).to_string())
    print(f"({time.time() - t0:.0f} s)")
    if not a.no_mlflow:
        from wattcast.training.tracking import log_run

        metrics = {f"{t}_{c}": float(v) for t, r in terms.iterrows() for c, v in r.items()
                   if c in ("measured_ms", "predicted_ms", "signed_pct") and np.isfinite(v)}
        metrics.update({f"{key}_{c}": float(whole[c].iloc[i]) for i, key in enumerate(("conv", "kernel_time", "step"))
                        for c in ("measured_ms", "predicted_ms", "signed_pct")})
        run_id = log_run(a.mlruns, experiment="resnet50-v100-trace", params={"device": a.device, "trace": str(a.trace)},
                         metrics=metrics, tags={"kind": "trace-check"},
                         tables={"terms": terms.reset_index(), "whole": whole.reset_index(), "conv_layers": lay,
                                 "conv_shape_classes": gt, "conv_fwd_algorithms": ga.reset_index()})
        print(f"MLflow run {run_id} (experiment resnet50-v100-trace)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
