"""Convolutions on tensor cores as implicit GEMMs, their backward kernels, and PyTorch's TF32 default for fp32 convs
(featurize/conv_gemm.py, models/kernel_predictor.py ``_route_convs``, simulate/single_device.py ``with_cudnn_tf32``;
audit 57d findings 3 and 4)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from wattcast.data.catalog import resolve_device
from wattcast.featurize.conv_gemm import conv_out_size, implicit_gemm_shape, padded_channels
from wattcast.featurize.op_graph import GraphBuilder
from wattcast.featurize.training_graph import training_graph
from wattcast.models.kernel_predictor import (FORWARD_SHAPE_SUFFIX, FP32_SIMT_SUFFIX, IMPLICIT_GEMM_SUFFIX,
                                              predict_kernels)
from wattcast.simulate.single_device import cost_nodes, in_stream_kernel_ms, predict_graph


def _conv_row(op="conv", dtype="bf16", B=32, cin=64, cout=64, k=3, s=56, stride=1, pad=1):
    return dict(op=op, dtype=dtype, B=B, Input_Channel=cin, Output_Channel=cout, Kernel_Size=k, Input_Size=s,
                Stride=stride, Padding=pad)


def _resnet_like(dtype: str, batch: int = 32, train: bool = True):
    """A stem and two bottleneck blocks of ResNet-50's first stage (1x1 64->64, 3x3 64->64, 1x1 64->256, ...)."""
    b = GraphBuilder(dtype, train=train, name="resnet_like")
    x = b.input((batch, 3, 224, 224))
    x = b.conv2d(x, 64, 7, stride=2, padding=3, name="stem")
    x = b.conv2d(x, 64, 3, stride=2, padding=1, name="pool_as_conv")  # 56 x 56
    for i in range(2):
        with b.layer(i):
            y = b.conv2d(x, 64, 1, name=f"b{i}.conv1")
            y = b.elementwise("relu", y, name=f"b{i}.relu1")
            y = b.conv2d(y, 64, 3, padding=1, name=f"b{i}.conv2")
            y = b.elementwise("relu", y, name=f"b{i}.relu2")
            y = b.conv2d(y, 256, 1, name=f"b{i}.conv3")
            x = b.conv2d(y, 64, 1, name=f"b{i}.proj") if i == 0 else b.conv2d(y, 64, 1, name=f"b{i}.down")
    g = b.build(n_layers=2)
    return training_graph(g, optimizer="none") if train else g


def test_bf16_cnn_backward_is_slower_than_forward_on_a100():
    """Finding 3: dgrad and wgrad each do the forward's FLOPs, so a CNN's backward takes longer than its forward (it
    came out faster: both were costed by the roofline at the dense peak)."""
    res = predict_graph(_resnet_like("bf16"), resolve_device("A100-SXM4-80GB"))
    assert res.backward_ms > 1.3 * res.forward_ms, (res.forward_ms, res.backward_ms)
    bw = res.nodes[(res.nodes["phase"] == "backward") & (res.nodes["op_class"] == "conv")]
    assert len(bw) and (bw["method"] == "surrogate").all()
    assert set(bw["kernel"]) == {"conv_dgrad", "conv_wgrad"}
    # no dgrad for the convolution on the images (the graph input needs no gradient)
    assert not (bw["name"] == "stem.dgrad").any() and (bw["name"] == "stem.wgrad").any()


@pytest.mark.parametrize("device", ["A100-SXM4-80GB", "L40S", "H100-SXM5-80GB"])
def test_1x1_conv_not_slower_than_3x3_on_the_same_tensors(device):
    """Finding 4: a 1x1 conv reads and writes the 3x3's tensors with a ninth of its FLOPs."""
    rows = pd.DataFrame([_conv_row(k=1, pad=0), _conv_row(k=3, pad=1)])
    out = predict_kernels(rows, device)
    t1, t3 = out["pred_latency_ms"].to_numpy()
    assert t1 <= t3, (t1, t3)
    assert out["model"].str.endswith(IMPLICIT_GEMM_SUFFIX).all()


def test_implicit_gemm_shapes_do_the_forward_flops():
    kinds = np.array(["conv", "conv_dgrad", "conv_wgrad"] * 3, dtype=object)
    shapes = np.repeat(np.array([(32, 64, 128, 3, 56, 1, 1), (32, 64, 128, 3, 56, 2, 1), (32, 3, 64, 7, 224, 2, 3)],
                                dtype=float), 3, axis=0)
    B, cin, cout, k, s, st, p = shapes.T
    m, n, kk = implicit_gemm_shape(kinds, B, cin, cout, k, s, st, p)
    o = conv_out_size(s, k, st, p)
    flops = 2 * m * n * kk
    assert np.allclose(flops, 2 * B * o * o * cin * cout * k * k)
    # the forward's GEMM is (B x O^2, Cin k^2, Cout), the wgrad's (Cout, B x O^2, Cin k^2); a stride-1 dgrad's rows are
    # the input's pixels, B x S^2
    assert (m[0], n[0], kk[0]) == (32 * 56 * 56, 64 * 9, 128)
    assert (m[1], n[1], kk[1]) == (32 * 56 * 56, 128 * 9, 64)
    assert (m[2], n[2], kk[2]) == (128, 32 * 56 * 56, 64 * 9)
    assert padded_channels(np.array([3, 8, 64]), 2).tolist() == [8, 8, 64]
    assert padded_channels(np.array([3, 64]), 4).tolist() == [3, 64]


def test_fp32_convs_run_tf32_on_a100_and_fp32_on_v100():
    """PyTorch's default cudnn.allow_tf32: an fp32 model's convolutions (forward and backward) are TF32 implicit
    GEMMs on a GPU with TF32 tensor cores, FP32 convolutions on a V100; the step says what it costed."""
    g = _resnet_like("fp32", batch=8)
    a100 = cost_nodes(g, resolve_device("A100-SXM4-40GB"))
    conv = a100[a100["kernel"].isin(["conv", "conv_dgrad", "conv_wgrad"])]
    stem = conv["name"].str.startswith("stem")
    assert (conv.loc[~stem, "dtype"] == "tf32").all()
    assert (conv.loc[stem, "dtype"] == "fp32").all()  # Cin = 3: cuDNN's TF32 kernels do not take it
    v100 = cost_nodes(g, resolve_device("V100-SXM2-16GB"))
    assert (v100.loc[v100["kernel"].isin(["conv", "conv_dgrad", "conv_wgrad"]), "dtype"] == "fp32").all()
    assert (v100.loc[v100["op_class"] == "conv", "method"] == "surrogate").all()
    res = predict_graph(g, resolve_device("A100-SXM4-40GB"))
    # its MFU is quoted against the TF32 peak its convolutions ran at (the FP32 one gave MFUs above 1)
    assert res.peak_matrix_flops == resolve_device("A100-SXM4-40GB").peak_tf32_tflops * 1e12
    res = res.to_dict()
    n_conv = len(conv)
    assert res["conv_math"] == dict(cudnn_tf32=True, tf32_conv_kernels=n_conv - 2, fp32_conv_kernels=2)
    assert "conv_math" not in predict_graph(g, resolve_device("V100-SXM2-16GB")).to_dict()
    # A100's TF32 convolutions are several times faster than its FP32 ones
    a100_fp32 = cost_nodes(_no_tf32(g), resolve_device("A100-SXM4-40GB"))
    assert (a100_fp32.loc[a100_fp32["op_class"] == "conv", "dtype"] == "fp32").all()
    assert a100["gpu_ms"].sum() < 0.5 * a100_fp32["gpu_ms"].sum()
    off = predict_graph(_no_tf32(g), resolve_device("A100-SXM4-40GB")).to_dict()
    assert off["conv_math"] == dict(cudnn_tf32=False, tf32_conv_kernels=0, fp32_conv_kernels=n_conv)


def test_step_options_cudnn_tf32_off_keeps_a_torch_models_convs_fp32():
    """``StepOptions(cudnn_tf32=False)`` (``torch.backends.cudnn.allow_tf32 = False``) through the torch.export path."""
    torch = pytest.importorskip("torch")
    from wattcast.featurize.workload import StepOptions, step_graph

    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 1))
    x = torch.zeros(4, 16, 32, 32)
    spec = resolve_device("A100-SXM4-80GB")
    times = {}
    for on in (True, False):
        g = step_graph(model, StepOptions(batch=None, seq=None, mode="train", dtype="fp32", cudnn_tf32=on),
                       example_inputs=(x,))
        assert g.meta.get("cudnn_tf32", True) is on
        costed = cost_nodes(g, spec)
        conv = costed[costed["op_class"] == "conv"]
        assert len(conv) >= 5 and (conv["dtype"] == ("tf32" if on else "fp32")).all()
        times[on] = conv["gpu_ms"].sum()
    assert times[True] < times[False]
    with pytest.raises(Exception, match="cudnn_tf32"):
        StepOptions(cudnn_tf32="no").validated()


def _no_tf32(g):
    from dataclasses import replace

    return replace(g, meta=dict(g.meta, cudnn_tf32=False))


def test_tf32_conv_with_three_input_channels_runs_fp32():
    """AlexNet's conv1 (Cin = 3) ran SIMT FP32 under TF32 on the A100 trace: a tf32 row of it is the fp32 row."""
    row = _conv_row(dtype="tf32", B=128, cin=3, cout=64, k=11, s=224, stride=4, pad=2)
    out = predict_kernels(pd.DataFrame([row, dict(row, dtype="fp32")]), "A100-SXM4-40GB")
    assert out["model"].iloc[0].endswith(FP32_SIMT_SUFFIX)
    assert out["pred_latency_ms"].iloc[0] == out["pred_latency_ms"].iloc[1]
    b = GraphBuilder("tf32", train=True)
    b.conv2d(b.input((8, 3, 32, 32)), 16, 3, padding=1, name="c")
    g = training_graph(b.build(n_layers=0), optimizer="none")
    assert (g.nodes.loc[g.nodes["op_class"] == "conv", "dtype"] == "fp32").all()


def test_16bit_conv_channels_padded_to_eight():
    """cuDNN pads a 16-bit convolution's channels to a multiple of 8 for its tensor-core kernels: a Cin = 3 stem
    costs what the Cin = 8 one does."""
    rows = pd.DataFrame([_conv_row(cin=3, k=7, s=224, stride=2, pad=3), _conv_row(cin=8, k=7, s=224, stride=2, pad=3)])
    out = predict_kernels(rows, "A100-SXM4-80GB")
    assert out["pred_latency_ms"].iloc[0] == out["pred_latency_ms"].iloc[1]
    assert out["roofline_ms"].iloc[0] < out["roofline_ms"].iloc[1]  # the row's own roofline, unpadded


def test_fp32_backward_kernels_are_the_forward_conv_surrogate_row():
    rows = pd.DataFrame([_conv_row(op=o, dtype="fp32") for o in ("conv", "conv_dgrad", "conv_wgrad")])
    out = predict_kernels(rows, "V100-SXM2-16GB")
    assert out["pred_latency_ms"].nunique() == 1
    assert out["model"].iloc[1].endswith(FORWARD_SHAPE_SUFFIX) and out["model"].iloc[2].endswith(FORWARD_SHAPE_SUFFIX)


@pytest.mark.parametrize("device,dtype", [("A100-SXM4-80GB", "bf16"), ("A100-SXM4-40GB", "fp32"),
                                          ("V100-SXM2-16GB", "fp32")])
def test_kernels_rows_and_predict_agree(device, dtype):
    """The rows ``wattcast kernels`` predicts for a conv (forward, dgrad, wgrad, in the dtype the step costs it in)
    are what ``predict`` costs its nodes at."""
    spec = resolve_device(device)
    b = GraphBuilder(dtype, train=True)
    x = b.elementwise("relu", b.input((16, 64, 28, 28)), name="pre")  # a conv whose input needs a gradient
    b.conv2d(x, 128, 3, padding=1, name="c")
    costed = cost_nodes(training_graph(b.build(n_layers=0), optimizer="none"), spec)
    conv = costed[costed["op_class"] == "conv"].sort_values("kernel")
    assert list(conv["kernel"]) == ["conv", "conv_dgrad", "conv_wgrad"]
    rows = pd.DataFrame([_conv_row(op=k, dtype=d, B=16, cin=64, cout=128, k=3, s=28)
                         for k, d in zip(conv["kernel"], conv["dtype"])])
    pred = predict_kernels(rows, spec)
    assert np.allclose(in_stream_kernel_ms(pred, spec), conv["gpu_ms"].to_numpy(), rtol=1e-9)


def test_cli_kernels_conv_rows_say_how_they_were_costed(tmp_path):
    """`wattcast kernels` reads the backward conv ops and names the implicit GEMM in ``model``; its forward bf16 row is
    what predict costs the node at (the test above)."""
    from conftest import run_cli

    csv, out_csv = tmp_path / "k.csv", tmp_path / "out.csv"
    pd.DataFrame([_conv_row(op=o) for o in ("conv", "conv_dgrad", "conv_wgrad")]).to_csv(csv, index=False)
    r = run_cli("kernels", "-d", "A100-SXM4-80GB", "-i", csv, "-o", out_csv)
    assert r.returncode == 0, r.stderr
    out = pd.read_csv(out_csv)
    assert out["model"].str.endswith(IMPLICIT_GEMM_SUFFIX).all()
    assert np.allclose(out["pred_latency_ms"], predict_kernels(pd.read_csv(csv), "A100-SXM4-80GB")["pred_latency_ms"])


def test_alexnet_trace_convs(data_root):
    """The A100 AlexNet trace (fp32 model, PyTorch's default TF32 convolutions): conv1 (FP32 SIMT) and conv3-5 (TF32
    implicit GEMMs) within 15% as ``predict --dtype fp32`` costs them (they were +395-467% for conv3-5, costed as
    FP32); conv2 ran FFT, which the implicit GEMM bounds from above (+31%)."""
    import importlib.util
    from pathlib import Path

    trace = data_root / "traces" / "a100_alexnet.json.gz"
    if not trace.is_file():
        pytest.skip("traces/a100_alexnet.json.gz not available")
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "conv_alexnet.py"
    spec = importlib.util.spec_from_file_location("conv_alexnet", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.comparison(trace, "A100-SXM4-40GB")
    print(out[["conv", "measured_us", "step_dtype", "step_ms", "step_err_pct"]].round(2).to_string(index=False))
    err = out.set_index("conv")["step_err_pct"]
    assert list(out["step_dtype"]) == ["fp32", "tf32", "tf32", "tf32", "tf32"]
    assert (err[[1, 3, 4, 5]].abs() < 15).all(), err
    assert 0 < err[2] < 50


def _onnx_cnn(path):
    """A two-conv ONNX CNN (16 -> 32 3x3, 32 -> 32 1x1 on 32 x 32 images)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.zeros(s, dtype=np.float32), n) for n, s in (("W1", (32, 16, 3, 3)),
                                                                                   ("W2", (32, 32, 1, 1)))]
    g = helper.make_graph([helper.make_node("Conv", ["x", "W1"], ["h"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="c1"),
                           helper.make_node("Relu", ["h"], ["r"], name="relu"),
                           helper.make_node("Conv", ["r", "W2"], ["y"], kernel_shape=[1, 1], name="c2")], "cnn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32, 32, 32])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_cli_no_cudnn_tf32(tmp_path):
    """`predict --no-cudnn-tf32` (torch.backends.cudnn.allow_tf32 = False) keeps an fp32 CNN's convs FP32; the default
    runs them TF32 on an A100; the JSON's conv_math says which; a cluster step refuses the flag."""
    import json

    from conftest import run_cli

    m = _onnx_cnn(tmp_path / "cnn.onnx")
    out = {}
    for flag in ("--cudnn-tf32", "--no-cudnn-tf32"):
        r = run_cli("predict", "-m", m, "-d", "A100-SXM4-80GB", "-b", "16", "--dtype", "fp32", flag, "--json")
        assert r.returncode == 0, r.stderr
        out[flag] = json.loads(r.stdout)
    # c1: forward + wgrad (its input is the images), c2: forward + dgrad + wgrad
    assert out["--cudnn-tf32"]["conv_math"] == dict(cudnn_tf32=True, tf32_conv_kernels=5, fp32_conv_kernels=0)
    assert out["--no-cudnn-tf32"]["conv_math"] == dict(cudnn_tf32=False, tf32_conv_kernels=0, fp32_conv_kernels=5)
    assert out["--cudnn-tf32"]["step_time_ms"] < out["--no-cudnn-tf32"]["step_time_ms"]
    r = run_cli("predict", "-m", m, "--cluster", "DGX-A100", "--gpus", "8", "-b", "16", "--dtype", "fp32",
                "--no-cudnn-tf32")
    assert r.returncode != 0 and "--no-cudnn-tf32" in r.stderr + r.stdout
