"""predict_kernels: the `wattcast kernels` contract, sanity of the shipped bundle, devices, OOD, bundle I/O.

The shipped bundle is a placeholder that will be retrained: nothing here depends on its accuracy,
only on properties any sensible bundle has (ordering of clearly different kernels and devices).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

import wattcast
from conftest import CONTRACT_COLUMNS
from wattcast.data.catalog import resolve_device
from wattcast.models.kernel_bundle import KernelBundle, load_bundle, shipped_folder
from wattcast.models.kernel_predictor import predict_kernels

NEUSIGHT_L4 = "neusight/devices/NVIDIA_L4.json"


@pytest.fixture(scope="module")
def examples(examples_csv) -> pd.DataFrame:
    return pd.read_csv(examples_csv)


def _gemm(op="bmm", dtype="fp32", **shape) -> dict:
    return {"OPName": op, "dtype": dtype, **shape}


def _pred(rows: list[dict], device: str) -> np.ndarray:
    out = predict_kernels(pd.DataFrame(rows), device)
    assert (out["error"] == "").all(), out["error"].tolist()
    return out["pred_latency_ms"].to_numpy()


def _check_contract(out: pd.DataFrame, inp: pd.DataFrame) -> None:
    assert len(out) == len(inp)
    assert list(out.columns[: len(inp.columns)]) == list(inp.columns)
    pd.testing.assert_frame_equal(out[list(inp.columns)], inp)
    for c in CONTRACT_COLUMNS:
        assert c in out.columns
    ok = out["error"] == ""
    p, lo, hi = (out.loc[ok, c].to_numpy(dtype=float) for c in ("pred_latency_ms", "pred_low_ms", "pred_high_ms"))
    assert np.isfinite(p).all() and (p > 0).all()
    assert (lo <= p).all() and (p <= hi).all()
    assert (lo > 0).all()
    assert out["ood"].dtype == bool


# ------------------------------------------------------------------------------ the contract
@pytest.mark.parametrize("device", ["H100-SXM5-80GB", "h100-sxm5-80gb", "Tesla-T4", "MI300X", "L4"])
def test_examples_predict_every_row(examples, device):
    out = predict_kernels(examples, device)
    _check_contract(out, examples)
    # a GPU without BF16 (the T4) refuses the bf16 GEMMs, as predict --dtype bf16 refuses it (stop 48)
    no_bf16 = out["error"].str.contains("no peak_bf16_tflops", regex=False)
    gemm = examples["OPName"].isin(["linear", "bmm", "conv"]) & (examples["dtype"] == "bf16")
    assert (no_bf16 == (gemm & (device == "Tesla-T4"))).all()
    assert (out["error"][~no_bf16] == "").all(), out.loc[out["error"] != "", "error"].tolist()


def test_examples_cover_the_documented_ops_and_dtypes(examples):
    ops = set(examples["OPName"])
    assert {"bmm", "linear", "add", "addu", "gelu", "ln", "softmax", "conv"} <= ops
    assert {"bf16", "fp16", "fp32"} <= set(examples["dtype"])
    assert "Kernel_Size" in examples.columns and "Kernel_Szie" not in examples.columns
    assert 15 <= len(examples) <= 30


def test_input_frame_is_not_modified_and_index_is_kept(examples):
    df = examples.copy()
    df.index = np.arange(1000, 1000 + len(df))
    before = df.copy()
    out = predict_kernels(df, "A100-SXM4-40GB")
    pd.testing.assert_frame_equal(df, before)
    assert list(out.index) == list(df.index)


def test_dtype_defaults_to_fp32(examples):
    fp32 = examples[examples["dtype"] == "fp32"].reset_index(drop=True)
    without = fp32.drop(columns=["dtype"])
    blank = fp32.assign(dtype=np.nan)
    a = predict_kernels(fp32, "A100-SXM4-40GB")["pred_latency_ms"].to_numpy()
    b = predict_kernels(without, "A100-SXM4-40GB")["pred_latency_ms"].to_numpy()
    c = predict_kernels(blank, "A100-SXM4-40GB")["pred_latency_ms"].to_numpy()
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


def test_neusight_kernel_szie_spelling_is_accepted(examples):
    conv = examples[examples["OPName"] == "conv"].dropna(axis=1, how="all").reset_index(drop=True)
    typo = conv.rename(columns={"Kernel_Size": "Kernel_Szie"})
    a = predict_kernels(conv, "V100-PCIe-32GB")
    b = predict_kernels(typo, "V100-PCIe-32GB")
    assert (b["error"] == "").all()
    assert list(b.columns[: len(typo.columns)]) == list(typo.columns)  # the user's spelling is kept
    np.testing.assert_array_equal(a["pred_latency_ms"], b["pred_latency_ms"])


# ------------------------------------------------------------------------------ sanity of the numbers
def test_four_times_larger_gemm_is_slower():
    base = dict(M=2048, N=2048, K=2048)
    small, big_b, big_mk = _pred([_gemm(B=1, **base), _gemm(B=4, **base), _gemm(B=1, M=4096, N=2048, K=4096)], "A100-SXM4-40GB")
    assert big_b > small
    assert big_mk > small
    small_l, big_l = _pred([_gemm("linear", B=1, M=4096, N=4096, K=4096), _gemm("linear", B=1, M=16384, N=4096, K=4096)], "L40S")
    assert big_l > small_l


def test_same_gemm_is_faster_on_h100_than_on_t4():
    rows = [_gemm(B=1, M=4096, N=4096, K=4096), _gemm("linear", B=1, M=8192, N=4096, K=4096)]
    h100 = _pred(rows, "H100-SXM5-80GB")
    t4 = _pred(rows, "Tesla-T4")
    assert (h100 < t4).all()
    assert (t4 / h100 > 3).all()  # ~8x the FP32 peak, ~10x the bandwidth


def test_bf16_gemm_is_faster_than_fp32_on_a100():
    shape = dict(B=1, M=8192, N=8192, K=8192)
    fp32, bf16 = _pred([_gemm(dtype="fp32", **shape), _gemm(dtype="bf16", **shape)], "A100-SXM4-40GB")
    assert bf16 < fp32
    assert fp32 / bf16 > 2  # the tensor-core peak is 16x the FP32 one


# ------------------------------------------------------------------------------ row-level errors
def test_unknown_op_is_a_row_error(examples):
    bad = pd.concat([examples.iloc[:3], pd.DataFrame([{"OPName": "frobnicate", "B": 8, "H": 128}]), examples.iloc[3:6]],
                    ignore_index=True)
    out = predict_kernels(bad, "H100-SXM5-80GB")
    assert len(out) == len(bad)
    row = out.iloc[3]
    assert "frobnicate" in row["error"] and "unknown op" in row["error"]
    assert np.isnan(row["pred_latency_ms"]) and np.isnan(row["pred_low_ms"]) and np.isnan(row["pred_high_ms"])
    others = out.drop(index=3)
    assert (others["error"] == "").all()
    assert np.isfinite(others["pred_latency_ms"]).all()
    # the other rows get the same numbers as without the bad row
    clean = predict_kernels(pd.concat([examples.iloc[:3], examples.iloc[3:6]], ignore_index=True), "H100-SXM5-80GB")
    np.testing.assert_allclose(others["pred_latency_ms"].to_numpy(), clean["pred_latency_ms"].to_numpy())


def test_missing_shape_column_is_a_row_error_naming_it():
    df = pd.DataFrame([{"OPName": "add", "B": 64, "H": 1024}, {"OPName": "bmm", "B": 4, "H": 1024}, {"OPName": "ln", "B": 64, "H": 1024}])
    out = predict_kernels(df, "A100-SXM4-40GB")
    assert out.loc[0, "error"] == "" and out.loc[2, "error"] == ""
    assert "'M'" in out.loc[1, "error"] and "bmm" in out.loc[1, "error"]
    assert np.isnan(out.loc[1, "pred_latency_ms"])
    assert np.isfinite(out.loc[[0, 2], "pred_latency_ms"]).all()


def test_invalid_shape_value_is_a_row_error():
    df = pd.DataFrame([{"OPName": "add", "B": 64, "H": 1024}, {"OPName": "add", "B": -1, "H": 1024}, {"OPName": "add", "B": 64, "H": "x"}])
    out = predict_kernels(df, "A100-SXM4-40GB")
    assert out.loc[0, "error"] == ""
    assert "'B'" in out.loc[1, "error"]
    assert "'H'" in out.loc[2, "error"]
    assert out.loc[[1, 2], "pred_latency_ms"].isna().all()


def test_conv_with_a_kernel_larger_than_the_padded_input_is_a_row_error():
    ok = dict(OPName="conv", B=1, Input_Channel=3, Output_Channel=8, Kernel_Size=3, Input_Size=8, Stride=1, Padding=1)
    bad = dict(ok, Kernel_Size=7, Input_Size=2, Padding=0)
    out = predict_kernels(pd.DataFrame([ok, bad]), "A100-SXM4-40GB")
    assert out.loc[0, "error"] == ""
    assert out.loc[1, "error"] != ""
    assert np.isnan(out.loc[1, "pred_latency_ms"])


def test_unknown_dtype_is_a_row_error():
    df = pd.DataFrame([_gemm(B=1, M=64, N=64, K=64), _gemm(dtype="fp64", B=1, M=64, N=64, K=64)])
    out = predict_kernels(df, "A100-SXM4-40GB")
    assert out.loc[0, "error"] == ""
    assert "fp64" in out.loc[1, "error"]
    assert np.isnan(out.loc[1, "pred_latency_ms"])


# ------------------------------------------------------------------------------ devices
def test_neusight_json_device_file(examples, data_root):
    path = data_root / NEUSIGHT_L4
    if not path.is_file():
        pytest.skip(f"{path} not present")
    fp32 = examples[examples["dtype"] == "fp32"].reset_index(drop=True)
    for dev in (path, str(path)):
        out = predict_kernels(fp32, dev)
        _check_contract(out, fp32)
        assert (out["error"] == "").all()
    # NeuSight's JSON holds the same FP32 figures as the catalog's L4: same roofline
    cat = predict_kernels(fp32, "L4")
    np.testing.assert_allclose(out["roofline_ms"], cat["roofline_ms"], rtol=1e-3)


def test_own_schema_yaml_device_file(examples, my_gpu_yaml):
    spec = resolve_device(str(my_gpu_yaml))
    assert spec.name == "RTX-4090"
    from wattcast.data.catalog import find_device

    assert find_device(spec.name) is None  # not a catalog device: the file is the only way in
    for dev in (my_gpu_yaml, str(my_gpu_yaml), spec):
        out = predict_kernels(examples, dev)
        _check_contract(out, examples)
        assert (out["error"] == "").all()


def test_giant_gemm_is_out_of_distribution():
    n = 131072
    out = predict_kernels(pd.DataFrame([_gemm(B=1, M=n, N=n, K=n), _gemm(B=1, M=1024, N=1024, K=1024)]), "H100-SXM5-80GB")
    assert bool(out.loc[0, "ood"]) is True
    assert "shape" in out.loc[0, "ood_reason"]
    assert np.isfinite(out.loc[0, "pred_latency_ms"]) and out.loc[0, "pred_latency_ms"] > 0
    assert out.loc[0, "pred_low_ms"] <= out.loc[0, "pred_latency_ms"] <= out.loc[0, "pred_high_ms"]


def test_made_up_device_with_ten_times_the_bandwidth_is_out_of_distribution(examples):
    from wattcast.data.catalog import list_devices

    h100 = resolve_device("H100-SXM5-80GB")
    top_bw = max(s.memory_bandwidth_gbps for s in list_devices())
    with wattcast.allow_exotic():  # 80.9 bytes per 16-bit kFLOP, 8.9x the catalog's most: deliberately exotic
        fantasy = dataclasses.replace(h100, name="Fantasy-GPU", aliases=(), memory_bandwidth_gbps=10 * top_bw)
    out = predict_kernels(examples, fantasy)
    assert (out["error"] == "").all()
    assert out["ood"].all()
    assert out["ood_reason"].str.contains("device").all()
    _check_contract(out, examples)


# ------------------------------------------------------------------------------ API and bundle
def test_top_level_api_matches_the_models_function(examples):
    a = wattcast.predict_kernels(examples, "H100-SXM5-80GB")
    b = predict_kernels(examples, "H100-SXM5-80GB")
    pd.testing.assert_frame_equal(a, b)


def test_bundle_round_trip_predicts_identically(examples, tmp_path):
    shipped = KernelBundle.load(shipped_folder())
    shipped.save(tmp_path / "copy")
    files = sorted(p.name for p in (tmp_path / "copy").iterdir())
    assert "kernel_manifest.json" in files
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".joblib"))]
    again = KernelBundle.load(tmp_path / "copy")
    assert sorted(again.families) == sorted(shipped.families)
    assert again.train_devices == shipped.train_devices
    for dev in ("H100-SXM5-80GB", "MI300X"):
        a = predict_kernels(examples, dev, bundle=shipped)
        b = predict_kernels(examples, dev, bundle=again)
        c = predict_kernels(examples, dev, bundle=str(tmp_path / "copy"))
        d = predict_kernels(examples, dev)  # default: the shipped bundle
        pd.testing.assert_frame_equal(a, b)
        pd.testing.assert_frame_equal(a, c)
        pd.testing.assert_frame_equal(a, d)
    load_bundle.cache_clear()


def test_shipped_bundle_is_trained_without_the_heldout_gpus():
    meta = load_bundle().meta
    held = set(meta.get("holdout_devices", []))
    assert {"L4", "A100-PCIe-80GB"} <= held
    assert not held & set(meta["train_devices"])


def test_tiny_kernels_are_not_predicted_below_the_fastest_measured_kernel():
    """A one-element op: the learned ratio does not extrapolate, the measured floor holds."""
    bundle = load_bundle()
    floor = bundle.families["elementwise"].latency_floor_ms
    assert floor > 0, "the shipped bundle carries a latency floor per family"
    frame = pd.DataFrame({"OPName": ["mulu", "add", "divu"], "B": [1, 1, 1], "H": [1, 4, 1]})
    # FP32 kernels (NeuSight's one-op-at-a-time timings) keep the FP32 floor, above the all-dtype one
    fp32_floor = bundle.families["elementwise"].latency_floor_by_dtype_ms.get("fp32", floor)
    assert fp32_floor >= floor
    for dev in ("L4", "H100-SXM5-80GB", "Tesla-T4"):
        out = wattcast.predict_kernels(frame, dev)
        assert (out["pred_latency_ms"] >= fp32_floor * (1 - 1e-9)).all()
        # TF32 elementwise tensors are FP32 in memory: the FP32 floor
        tf32 = wattcast.predict_kernels(frame.assign(dtype="tf32"), dev)
        assert (tf32["pred_latency_ms"] >= fp32_floor * (1 - 1e-9)).all()
        half = wattcast.predict_kernels(frame.assign(dtype="fp16"), dev)
        assert (half["pred_latency_ms"] >= bundle.families["elementwise"].floor_ms(["fp16"])[0] * (1 - 1e-9)).all()
        assert (out["pred_low_ms"] <= out["pred_latency_ms"]).all()
        assert (out["pred_latency_ms"] <= out["pred_high_ms"]).all()


@pytest.mark.parametrize("device", ["B200", "GB200", "H100-SXM5-80GB", "MI300X", "MI355X"])
def test_tensor_core_linear_never_gets_faster_with_a_longer_contraction(device):
    """A linear layer's contraction (``N``: nn.Linear(N, K), LoRA-B's rank) below the MMA k-tile is padded to it, and
    above it a longer one never takes less time: the floor/ceiling hand-over made B200 fp8 4096 x 45 x 4096 23.3 us
    against 13.8 at 72, GB200 fp8 7168 x 45 x 2048 24.1 against 15.8, B200 bf16 at 32 17.2 against 14.8 at 144."""
    ns = sorted({*range(8, 160), *range(160, 513, 7), 512})
    dts = [d for d in ("bf16", "fp16", "fp8", "tf32") if not (d == "tf32" and device == "MI355X")]
    rows = [dict(OPName=op, dtype=dt, B=1, M=m, N=n, K=k) for op in ("linear", "bmm") for dt in dts
            for m, k in ((4096, 4096), (7168, 2048), (16, 4096), (16384, 1024)) for n in ns]
    out = predict_kernels(pd.DataFrame(rows), device)
    assert (out["error"] == "").all()
    for _, g in out.groupby(["OPName", "dtype", "M", "K"]):
        t = g.sort_values("N")["pred_latency_ms"].to_numpy()
        assert (np.diff(t) >= -1e-9 * t[1:]).all(), t  # (rounding of the rescaled grid)
        assert (g["pred_low_ms"] <= g["pred_latency_ms"]).all() and (g["pred_high_ms"] >= g["pred_latency_ms"]).all()
    # below one k-tile (128 bytes of the contraction) the time is the k-tile's; the roofline stays the row's own
    lin = out[(out["OPName"] == "linear") & (out["M"] == 4096) & (out["K"] == 4096)].set_index(["dtype", "N"])
    for dt, tile in (("bf16", 64), ("fp8", 128), ("tf32", 32)):
        if dt in dts:
            assert lin.loc[(dt, 8), "pred_latency_ms"] == pytest.approx(lin.loc[(dt, tile), "pred_latency_ms"], rel=1e-12)
            assert lin.loc[(dt, 8), "roofline_ms"] < lin.loc[(dt, tile), "roofline_ms"]


@pytest.mark.parametrize("device", ["B200", "MI300X", "A100-SXM4-80GB"])
def test_fp32_gemms_are_not_touched_by_the_contraction_guard(device):
    """FP32 GEMMs (NeuSight's data: the held-out figures) keep their model's prediction at any contraction."""
    import wattcast.models.kernel_predictor as kp

    rows = pd.DataFrame([dict(OPName=op, dtype="fp32", B=b, M=m, N=n, K=k) for op, b in (("linear", 1), ("bmm", 1),
                         ("bmm", 8)) for m, k in ((4096, 4096), (64, 1024)) for n in (8, 16, 45, 64, 100, 512)])
    both = predict_kernels(rows, device)
    saved = kp.K_TILE_BYTES, kp.MONOTONE_MAX_N
    kp.K_TILE_BYTES, kp.MONOTONE_MAX_N = 0, 0
    try:
        plain = predict_kernels(rows, device)
    finally:
        kp.K_TILE_BYTES, kp.MONOTONE_MAX_N = saved
    pd.testing.assert_frame_equal(both, plain)


@pytest.mark.parametrize("device", ["L4", "MI300X", "B200", "H100-SXM5-80GB"])
def test_small_tensor_core_gemms_never_get_faster_with_more_rows(device):
    """Weight-bound GEMMs with few rows (decode, a few tokens per expert): up to 4,096 rows the predicted time never
    falls as M grows (the floor/ceiling hand-over made M = 16 -> 64 on an L4 17% faster, MI300X 491 -> 492 16%), for
    linear rows and the single matmuls (bmm, B = 1) a step graph costs its projections as."""
    import pandas as pd

    from wattcast.models.kernel_predictor import predict_kernels

    ms = sorted({*range(1, 64), *range(64, 4097, 37), *(2 ** i for i in range(13)), 768, 769, 640, 641})
    rows = [dict(OPName=op, dtype=dt, B=1, M=m, N=n, K=k) for op in ("linear", "bmm") for dt in ("bf16", "fp8")
            for n, k in ((4096, 4096), (7168, 2048), (2880, 5760), (4096, 14336)) for m in ms]
    out = predict_kernels(pd.DataFrame(rows), device)
    out = out[out["error"] == ""]  # (fp8 rows on a GPU without FP8 get an error)
    for _, g in out.groupby(["OPName", "dtype", "N", "K"]):
        t = g.sort_values("M")["pred_latency_ms"].to_numpy()
        assert (np.diff(t) >= -1e-12).all(), t
        assert (g["pred_low_ms"] <= g["pred_latency_ms"]).all() and (g["pred_high_ms"] >= g["pred_latency_ms"]).all()
    # FP32 rows and rows beyond M = 4096 are predicted as before (the guard does not reach them)
    big = pd.DataFrame([dict(OPName="linear", dtype="bf16", B=1, M=8192, N=4096, K=4096),
                        dict(OPName="linear", dtype="fp32", B=1, M=64, N=4096, K=4096)])
    import wattcast.models.kernel_predictor as kp
    both = predict_kernels(big, device)["pred_latency_ms"].to_numpy()
    kp_max, kp.MONOTONE_MAX_M = kp.MONOTONE_MAX_M, 0
    try:
        plain = predict_kernels(big, device)["pred_latency_ms"].to_numpy()
    finally:
        kp.MONOTONE_MAX_M = kp_max
    np.testing.assert_array_equal(both, plain)


def _floor_ms(rows: pd.DataFrame, device: str) -> np.ndarray:
    """The physical floor written out from the spec sheet (not from featurize): a GEMM's 2BMNK at the dtype's dense
    peak, or what it reads beyond the last-level cache plus what it writes beyond it at DRAM bandwidth (a vector op:
    its output alone, its inputs may be broadcast)."""
    spec = resolve_device(device)
    ebytes = rows["dtype"].map({"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}).to_numpy()
    gemm = rows["OPName"].isin(["linear", "bmm"]).to_numpy()
    B, M, N, K, H = (rows[c].to_numpy(dtype=float) for c in ("B", "M", "N", "K", "H"))
    flops = np.where(gemm, 2 * B * M * N * K, 0.0)
    peak = np.array([spec.peak_matrix_tflops(d) for d in rows["dtype"]]) * 1e12
    reads = np.where(gemm, (B * M * N + N * K + K) * ebytes, 0.0)
    writes = np.where(gemm, B * M * K, B * H) * ebytes
    cache = max(spec.l2_cache_mb, 256.0 if spec.vendor == "amd" else 0.0) * 1e6
    dram = np.maximum(reads - cache, 0.0) + np.maximum(writes - cache, 0.0)
    return np.maximum(flops / peak * 1e3, dram / (spec.memory_bandwidth_gbps * 1e9) * 1e3)


@pytest.mark.parametrize("device", ["A100-SXM4-80GB", "H100-SXM5-80GB", "MI300X", "L4"])
def test_band_and_prediction_never_below_the_physical_floor(device):
    """No kernel beats its GEMM work at the dense peak nor streams more than the cache holds faster than DRAM: the
    band's low end sat below that on up to half of a user's grid (A100-SXM4-80GB fp32 16384 x 1024 x 4096 linear:
    2.74 ms against 7.06 ms of FP32 work; H100 fp32 add of 262144 x 16384, 16 GB: 11.97 against 15.0 ms)."""
    rows = pd.DataFrame([
        dict(OPName="linear", dtype="fp32", B=1, M=16384, N=1024, K=4096, H=np.nan),
        dict(OPName="linear", dtype="bf16", B=1, M=16384, N=8192, K=8192, H=np.nan),
        dict(OPName="bmm", dtype="fp32", B=64, M=2048, N=128, K=2048, H=np.nan),
        dict(OPName="linear", dtype="bf16", B=1, M=4, N=8192, K=28672, H=np.nan),
        dict(OPName="add", dtype="fp32", B=262144, M=np.nan, N=np.nan, K=np.nan, H=16384),
        dict(OPName="add", dtype="bf16", B=65536, M=np.nan, N=np.nan, K=np.nan, H=8192),
    ])
    out = predict_kernels(rows, device)
    assert (out["error"] == "").all()
    floor = _floor_ms(rows, device)
    assert (floor > 0).all()
    assert (out["pred_low_ms"].to_numpy() >= floor * (1 - 1e-9)).all(), (out["pred_low_ms"].tolist(), floor.tolist())
    assert (out["pred_latency_ms"].to_numpy() >= floor * (1 - 1e-9)).all()
    assert (out["pred_high_ms"] >= out["pred_latency_ms"]).all() and (out["pred_low_ms"] <= out["pred_latency_ms"]).all()


def test_offcatalog_prediction_never_below_the_physical_floor(tmp_path):
    """An imaginary spec off the catalog (48 TB/s, 80 MB of L2) got fp32 elementwise band low ends below the time its
    output alone (what an elementwise kernel writes whatever it reads) takes to cross DRAM."""
    path = tmp_path / "h300.yaml"
    path.write_text("""schema_version: 1
name: H300
vendor: nvidia
arch: Imaginary
peak_fp32_tflops: 90.0
peak_tf32_tflops: 700.0
peak_fp16_tflops: 1400.0
peak_bf16_tflops: 1400.0
peak_fp8_tflops: 2800.0
memory_gb: 192
memory_bandwidth_gbps: 48000
num_sms: 160
cores_per_sm: 128
base_clock_mhz: 1500
boost_clock_mhz: 2200
l2_cache_mb: 80
tdp_w: 900
idle_power_w: 90
source: "a test device, figures invented"
""")
    rows = pd.DataFrame([dict(OPName=op, dtype="fp32", B=b, H=h) for op in ("add", "mul", "div", "addu", "relu")
                         for b, h in ((65536, 8192), (262144, 16384))])
    with wattcast.allow_exotic():  # 48 TB/s over 90 FP32 TFLOP/s is refused as a likely Gb/s figure without it
        out = predict_kernels(rows, str(path))
    assert (out["error"] == "").all(), out["error"].tolist()
    written = rows["B"].to_numpy(float) * rows["H"].to_numpy(float) * 4.0
    floor = np.maximum(written - 80e6, 0) / 48000e9 * 1e3
    assert (out["pred_latency_ms"].to_numpy() >= floor * (1 - 1e-9)).all(), (out["pred_latency_ms"].tolist(), floor)
    assert (out["pred_low_ms"].to_numpy() >= floor * (1 - 1e-9)).all()


def _large_tensor_gemms(dtypes=("bf16", "fp16", "fp8")) -> pd.DataFrame:
    """Compute-bound tensor-core GEMMs with M >= 2048 (the auditor's grid of issue 14): linear (M guarded up to 4096)
    and batched."""
    sizes = (512, 2048, 4096, 8192, 16384)
    return pd.DataFrame([dict(OPName=op, dtype=dt, B=4 if op == "bmm" else 1, M=m, N=n, K=k)
                         for op in ("linear", "bmm") for dt in dtypes for m in (2048, 4096, 8192, 16384)
                         for n in sizes for k in sizes])


@pytest.mark.parametrize("device,dtype,ceiling", [
    # the bundle's GEMM ceiling member: MAMF's best achievable matmul over the dense peak (A100 SXM 271.2 of 312 TFLOP/s,
    # MI355X 1,565 of 2,517, B200 fp8 3,432.5 of 4,500), or a training device's 99th percentile (MI300X fp8, A40)
    ("A100-SXM4-80GB", "bf16", 0.8692), ("A100-SXM4-40GB", "fp16", 0.8692),  # the 40 GB takes its chip's (compute twin)
    ("MI355X", "bf16", 0.6219), ("MI300X", "fp8", 0.6941), ("B200", "fp8", 0.7628), ("A40", "fp16", 0.8326)])
def test_band_low_end_no_faster_than_the_devices_measured_matmul_ceiling(device, dtype, ceiling):
    """Issue 14: the 90% band's low end of large tensor-core GEMMs sat at the dense peak (A100 bf16 1.00 of it on 169 of
    200 rows, MI355X bf16 0.96 where MAMF measured 0.62 of the catalog's peak, MI300X fp8 1.00): 5% of the probability
    on a speed nobody measured. It is held at the device's measured ceiling x CEILING_CLIP_SLACK (1.09: LLMCompass's
    A100 rows reach 1.08 x MAMF's); the prediction itself does not move and stays inside the band."""
    rows = _large_tensor_gemms((dtype,))
    spec = resolve_device(device)
    out = predict_kernels(rows, spec)
    assert (out["error"] == "").all()
    assert dict(load_bundle().families["gemm"].ceiling_member["ceilings"][
        "A100-SXM4-80GB" if device == "A100-SXM4-40GB" else device]).get(dtype, ceiling) == ceiling
    b, m, n, k = (rows[c].to_numpy(dtype=float) for c in ("B", "M", "N", "K"))
    t_peak_ms = 2 * b * m * n * k / (spec.peak_matrix_tflops(dtype) * 1e12) * 1e3
    low, point = out["pred_low_ms"].to_numpy(), out["pred_latency_ms"].to_numpy()
    # at most the ceiling x 1.09 of the dense peak, or the prediction itself where that is faster still
    fastest = np.minimum(t_peak_ms / min(ceiling * 1.09, 1.0), point)
    assert (low >= fastest * (1 - 1e-9)).all(), float((t_peak_ms / low).max())
    assert (low <= point).all() and (out["pred_high_ms"] >= point).all()
    # and the band still has width below the prediction where the ceiling leaves room
    assert (low < point).mean() > 0.5


def test_gemm_band_low_end_of_a_gpu_without_a_measured_ceiling_is_not_clipped_at_a_vendor_median():
    """A GPU whose ceiling is its vendor's median (H100: the datasets withhold Hopper, MAMF's table has no H100 row) is
    not clipped there: the median is no measurement of that GPU, and some of its large bf16 GEMMs keep a low end
    faster than the median ceiling (the learned band), at or below the dense peak."""
    rows = _large_tensor_gemms(("bf16",))
    spec = resolve_device("H100-SXM5-80GB")
    out = predict_kernels(rows, spec)
    b, m, n, k = (rows[c].to_numpy(dtype=float) for c in ("B", "M", "N", "K"))
    eff = 2 * b * m * n * k / (spec.peak_bf16_tflops * 1e12) * 1e3 / out["pred_low_ms"].to_numpy()
    median = load_bundle().families["gemm"].ceiling_member["vendor_ceilings"]["nvidia"]
    assert (eff > median * 1.09).any() and (eff <= 1 + 1e-9).all()
