"""Kernel features: FLOP/byte counts by hand, the roofline, wave quantisation, errors and alignment."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from wattcast.data.catalog import resolve_device
from wattcast.featurize.kernel_features import FEATURES_BY_FAMILY, TILES, featurize_kernels


@pytest.fixture(scope="module")
def a100():
    return resolve_device("A100-SXM4-40GB")


@pytest.fixture(scope="module")
def t4():
    return resolve_device("Tesla-T4")


def _frame(rows: list[dict], index=None) -> pd.DataFrame:
    df = pd.DataFrame(rows, index=index)
    if "dtype" not in df:
        df["dtype"] = "fp32"
    df["dtype"] = df["dtype"].fillna("fp32")
    return df


def _one(row: dict, device) -> pd.Series:
    return featurize_kernels(_frame([row]), device).iloc[0]


# ------------------------------------------------------------------------------ work and traffic
def test_bmm_flops_and_bytes(a100):
    # torch.bmm of (B, M, N) by (B, N, K): N is the contraction dim
    B, M, N, K = 2, 3, 4, 5
    f = _one(dict(op="bmm", B=B, M=M, N=N, K=K), a100)
    assert f["flops"] == 2 * B * M * N * K == 240
    # A (B,M,N) + B (B,N,K) + C (B,M,K), 4 bytes each
    assert f["bytes"] == (B * M * N + B * N * K + B * M * K) * 4 == 376
    assert f["family"] == "gemm"


def test_linear_flops_and_bytes_include_bias(a100):
    # nn.Linear(N, K, bias=True) on (B, M, N): weight (N, K) is shared by the batch, bias adds M*K FLOPs
    B, M, N, K = 1, 8, 16, 32
    f = _one(dict(op="linear", B=B, M=M, N=N, K=K), a100)
    assert f["flops"] == 2 * M * N * K + M * K == 8448
    assert f["bytes"] == (M * N + N * K + K + M * K) * 4 == 3712


def test_linear_half_precision_halves_bytes_not_flops(a100):
    row = dict(op="linear", B=1, M=8, N=16, K=32)
    f32 = _one({**row, "dtype": "fp32"}, a100)
    f16 = _one({**row, "dtype": "bf16"}, a100)
    assert f16["flops"] == f32["flops"]
    assert f16["bytes"] == f32["bytes"] / 2
    assert f16["dtype_bytes"] == 2 and f32["dtype_bytes"] == 4


def test_fp8_gemm_reads_fp8_and_writes_bf16():
    # an fp8 GEMM reads 1-byte operands and writes a bf16 output (XLA's e4m3 x e4m3 -> bf16 rows, Transformer
    # Engine's FP8 GEMMs): the output is counted at 2 bytes, so a short contraction is not taken for half its traffic
    b200 = resolve_device("B200")
    B, M, N, K = 1, 4096, 256, 4096
    f8 = _one(dict(op="bmm", B=B, M=M, N=N, K=K, dtype="fp8"), b200)
    f16 = _one(dict(op="bmm", B=B, M=M, N=N, K=K, dtype="bf16"), b200)
    assert f8["bytes"] == (B * M * N + B * N * K) * 1 + B * M * K * 2
    assert f8["t_mem_ms"] == pytest.approx(f8["bytes"] / (b200.memory_bandwidth_gbps * 1e9) * 1e3)
    assert f8["t_roof_ms"] > f16["t_roof_ms"] / 2  # memory-bound here: the bf16 output does not halve
    lin = _one(dict(op="linear", B=1, M=8, N=16, K=32, dtype="fp8"), b200)
    assert lin["bytes"] == (8 * 16 + 16 * 32 + 32) * 1 + 8 * 32 * 2


def test_conv_output_size_flops_and_bytes(a100):
    # nn.Conv2d(3, 8, 3, stride=2, padding=1) without bias on a (2, 3, 32, 32) input
    B, cin, cout, k, s, stride, pad = 2, 3, 8, 3, 32, 2, 1
    out = math.floor((s + 2 * pad - k) / stride) + 1
    assert out == 16
    f = _one(dict(op="conv", B=B, Input_Channel=cin, Output_Channel=cout, Kernel_Size=k, Input_Size=s, Stride=stride, Padding=pad), a100)
    assert f["family"] == "conv"
    assert f["flops"] == 2 * (B * out * out) * (cin * k * k) * cout == 221_184
    assert f["bytes"] == (B * cin * s * s + cout * cin * k * k + B * cout * out * out) * 4 == 41_824
    assert f["log_out_size"] == pytest.approx(math.log(out))


def test_conv_output_size_floors(a100):
    # (7 + 0 - 3) / 2 + 1 = 3 exactly; (8 + 0 - 3) / 2 = 2.5 -> floor 2 -> 3 as well
    for s in (7, 8):
        f = _one(dict(op="conv", B=1, Input_Channel=1, Output_Channel=1, Kernel_Size=3, Input_Size=s, Stride=2, Padding=0), a100)
        assert f["log_out_size"] == pytest.approx(math.log(3))
        assert f["flops"] == 2 * 9 * 9 * 1


def test_binary_elementwise_moves_three_tensors(a100):
    B, H = 4, 1000
    f = _one(dict(op="add", B=B, H=H), a100)
    assert f["flops"] == B * H
    assert f["bytes"] == 3 * B * H * 4  # two inputs + one output
    assert f["is_binary"] == 1.0
    assert f["family"] == "elementwise"


def test_unary_elementwise_moves_two_tensors(a100):
    B, H = 4, 1000
    f = _one(dict(op="addu", B=B, H=H), a100)
    assert f["flops"] == B * H
    assert f["bytes"] == 2 * B * H * 4  # one input + one output (the scalar is free)
    assert f["is_binary"] == 0.0


def test_layernorm_counts(a100):
    B, H = 4, 1000
    f = _one(dict(op="ln", B=B, H=H), a100)
    assert f["family"] == "ln"
    assert f["flops"] == 8 * B * H
    # x in, y out, plus the (H,) weight and bias
    assert f["bytes"] == (2 * B * H + 2 * H) * 4 == 40_000


# ------------------------------------------------------------------------------ roofline
def test_roofline_uses_the_dtype_peak_and_takes_the_max(a100):
    assert a100.peak_matrix_tflops("fp32") == pytest.approx(19.5, rel=0.01)
    assert a100.peak_matrix_tflops("bf16") == pytest.approx(312)
    n = 8192
    X = featurize_kernels(
        _frame([dict(op="bmm", B=1, M=n, N=n, K=n, dtype="fp32"), dict(op="bmm", B=1, M=n, N=n, K=n, dtype="bf16"),
                dict(op="add", B=4096, H=4096, dtype="fp32")]),
        a100,
    )
    flops = 2.0 * n**3
    fp32, bf16, add = X.iloc[0], X.iloc[1], X.iloc[2]
    assert fp32["t_compute_ms"] == pytest.approx(flops / (a100.peak_matrix_tflops("fp32") * 1e12) * 1e3)
    assert bf16["t_compute_ms"] == pytest.approx(flops / 312e12 * 1e3)
    assert fp32["t_mem_ms"] == pytest.approx(3 * n * n * 4 / (a100.memory_bandwidth_gbps * 1e9) * 1e3)
    assert bf16["t_mem_ms"] == pytest.approx(fp32["t_mem_ms"] / 2)
    # the ratio of the compute times is the ratio of the peaks: 312 / 19.5 = 16x
    assert fp32["t_compute_ms"] / bf16["t_compute_ms"] == pytest.approx(312 / a100.peak_matrix_tflops("fp32"))
    # a large GEMM is compute-bound, an add memory-bound; t_roof is always the max of the two
    np.testing.assert_allclose(X["t_roof_ms"], np.maximum(X["t_compute_ms"], X["t_mem_ms"]))
    assert fp32["t_roof_ms"] == fp32["t_compute_ms"] and fp32["t_roof_ms"] > fp32["t_mem_ms"]
    assert add["t_roof_ms"] == add["t_mem_ms"] and add["t_mem_ms"] > add["t_compute_ms"]
    # vector ops run on the FP32 vector peak regardless of tensor cores
    assert add["t_compute_ms"] == pytest.approx(4096 * 4096 / (a100.peak_fp32_tflops * 1e12) * 1e3)
    assert X["log_t_roof_ms"].to_numpy() == pytest.approx(np.log(X["t_roof_ms"].to_numpy()))


def test_dtype_without_a_native_peak_falls_back(t4):
    # the T4 lists no BF16 peak: bf16 falls back to its FP16 tensor peak and is not marked "native"
    assert not t4.has_native("bf16")
    X = featurize_kernels(_frame([dict(op="bmm", B=1, M=4096, N=4096, K=4096, dtype=d) for d in ("fp16", "bf16")]), t4)
    assert X.iloc[0]["t_compute_ms"] == pytest.approx(X.iloc[1]["t_compute_ms"])
    assert X.iloc[0]["is_tensor_dtype"] == 1.0
    assert X.iloc[1]["is_tensor_dtype"] == 0.0


# ------------------------------------------------------------------------------ waves
def test_wave_efficiency_known_tile_count(a100):
    assert a100.num_sms == 108
    # 109 output tiles of 128x128 on 108 SMs: two waves, the second one nearly empty
    X = featurize_kernels(
        _frame([dict(op="bmm", B=1, M=128 * 109, N=256, K=128), dict(op="bmm", B=2, M=128 * 54, N=256, K=128),
                dict(op="bmm", B=1, M=1024, N=64, K=1024)]),
        a100,
    )
    r = X.iloc[0]
    assert r["wave_eff_128x128"] == pytest.approx(109 / 216)
    assert r["log_waves_128x128"] == pytest.approx(math.log(109 / 108))
    # 64x64 tiles: 218 x 2 = 436 tiles -> 5 waves of 108
    assert r["wave_eff_64x64"] == pytest.approx(436 / 540)
    # B multiplies the tile count: 2 x 54 = 108 tiles fill exactly one wave
    assert X.iloc[1]["wave_eff_128x128"] == pytest.approx(1.0)
    # 1024x1024 output: 64 tiles of 128x128 (one partial wave), 32 of 256x128
    assert X.iloc[2]["wave_eff_128x128"] == pytest.approx(64 / 108)
    assert X.iloc[2]["wave_eff_256x128"] == pytest.approx(32 / 108)
    for a, b in TILES:
        assert ((X[f"wave_eff_{a}x{b}"] > 0) & (X[f"wave_eff_{a}x{b}"] <= 1)).all()


# ------------------------------------------------------------------------------ errors
def test_unknown_op_raises_value_error(a100):
    with pytest.raises(ValueError, match="unknown op"):
        featurize_kernels(_frame([dict(op="bmm", B=1, M=2, N=2, K=2), dict(op="frobnicate", B=1, H=4)]), a100)


def test_unknown_dtype_raises_value_error(a100):
    with pytest.raises(ValueError, match="unknown dtype"):
        featurize_kernels(_frame([dict(op="bmm", B=1, M=2, N=2, K=2, dtype="fp64")]), a100)


def test_missing_device_in_mapping_raises(a100):
    df = _frame([dict(op="add", B=1, H=4, device="A100-SXM4-40GB"), dict(op="add", B=1, H=4, device="nowhere")])
    with pytest.raises(ValueError, match="nowhere"):
        featurize_kernels(df, {"A100-SXM4-40GB": a100})


# ------------------------------------------------------------------------------ frame layout
MIXED = [
    dict(op="bmm", B=96, M=1024, N=64, K=1024),
    dict(op="linear", B=1, M=8192, N=768, K=3072, dtype="bf16"),
    dict(op="conv", B=32, Input_Channel=64, Output_Channel=64, Kernel_Size=3, Input_Size=56, Stride=1, Padding=1),
    dict(op="add", B=8192, H=768),
    dict(op="gelu", B=8192, H=3072),
    dict(op="ln", B=8192, H=768),
    dict(op="softmax", B=98304, H=1024),
]


def test_feature_frame_is_aligned_with_the_input_index(a100):
    idx = [70, 3, 11, 5, 42, 0, 9]
    df = _frame(MIXED, index=idx)
    X = featurize_kernels(df, a100)
    assert list(X.index) == idx
    assert list(X["family"]) == ["gemm", "gemm", "conv", "elementwise", "elementwise", "ln", "softmax"]
    # a shuffled frame gives the same features per index label
    Xs = featurize_kernels(df.iloc[::-1], a100)
    pd.testing.assert_frame_equal(Xs.loc[idx], X)
    # every model feature of each row's family is present and finite for a fully specified device
    for fam, feats in FEATURES_BY_FAMILY.items():
        sub = X[X["family"] == fam]
        if len(sub):
            vals = sub[list(feats)].to_numpy(dtype=float)
            assert np.isfinite(vals).all(), fam


def test_mapping_of_devices_mode_matches_single_device_mode(a100, t4):
    df = _frame(MIXED * 2)
    df["device"] = ["A100-SXM4-40GB"] * len(MIXED) + ["Tesla-T4"] * len(MIXED)
    df.index = np.arange(100, 100 + len(df))
    X = featurize_kernels(df, {"A100-SXM4-40GB": a100, "Tesla-T4": t4})
    assert list(X.index) == list(df.index)
    Xa = featurize_kernels(df.iloc[: len(MIXED)], a100)
    Xt = featurize_kernels(df.iloc[len(MIXED):], t4)
    pd.testing.assert_frame_equal(X, pd.concat([Xa, Xt]))
    # the same kernel is slower in roofline terms on the T4
    assert (X["t_roof_ms"].to_numpy()[len(MIXED):] > X["t_roof_ms"].to_numpy()[: len(MIXED)]).all()


def test_memory_technology_feature(a100, t4):
    from dataclasses import replace

    row = {"op": "softmax", "B": 64, "H": 1024}
    assert _one(row, t4)["dev_is_gddr"] == 1.0  # GDDR6
    assert _one(row, a100)["dev_is_gddr"] == 0.0  # HBM2
    # a sheet that does not say: NaN (LightGBM routes it, the MLP imputes), never a guess
    assert np.isnan(_one(row, replace(a100, memory_type=None))["dev_is_gddr"])
