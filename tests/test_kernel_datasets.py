"""Tests of the unified kernel-latency loader (wattcast.data.kernel_datasets).

Real-data tests skip when the public datasets folder cannot be found; the error-path tests use
small CSVs written to tmp_path and always run.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wattcast.data import kernel_datasets as kd
from wattcast.data.kernel_datasets import (
    COLUMNS,
    DataNotFoundError,
    KernelDataError,
    load_kernels,
    load_label_nodes,
    load_user_kernels,
    resolve_data_root,
    split_heldout,
)

#: dense datasheet FP32 peaks in TFLOPS (AMD: FP32 on the matrix cores, which FP32 GEMMs use)
FP32_PEAK_TFLOPS = {
    "Tesla-P4": 5.5,
    "Tesla-P100-PCIe-16GB": 9.3,
    "Tesla-T4": 8.1,
    "V100-PCIe-32GB": 14.0,
    "A100-PCIe-40GB": 19.5,
    "A100-PCIe-80GB": 19.5,
    "L4": 30.3,
    "MI100": 46.1,
    "MI210": 45.3,
}


# ------------------------------------------------------------------------------------------ fixtures


# data_root: the session fixture in conftest.py (skips without the public datasets)


@pytest.fixture(scope="module")
def kernels(data_root) -> pd.DataFrame:
    return load_kernels(data_root)


@pytest.fixture(scope="module")
def l4_nodes(data_root) -> pd.DataFrame:
    return load_label_nodes(data_root, devices=["NVIDIA_L4"])


def _tflops(df: pd.DataFrame) -> pd.Series:
    return 2 * df.B * df.M * df.N * df.K / (df.latency_ms * 1e-3) / 1e12


# ------------------------------------------------------------------------------------------ real data


def test_columns_are_exactly_the_unified_schema(kernels):
    assert list(kernels.columns) == list(COLUMNS)
    for c in kd.SHAPE_COLUMNS + ("latency_ms",):
        assert kernels[c].dtype == np.float64, c


def test_every_source_has_rows(kernels):
    counts = kernels["source"].value_counts()
    for src in ("neusight/kernels", "neusight/kernels_test", "xla", "deepbench", "vidur", "llmcompass"):
        assert counts.get(src, 0) > 0, src


def test_devices_are_canonical(kernels):
    allowed = set(kd.CANONICAL_DEVICES) | {kd.UNKNOWN_A100_80GB}
    assert set(kernels["device"]) <= allowed
    # the LLMCompass A100 is the only ambiguous one
    assert set(kernels.loc[kernels.device == kd.UNKNOWN_A100_80GB, "source"]) == {"llmcompass"}


def test_latency_positive_and_dtypes_known(kernels):
    assert (kernels["latency_ms"] > 0).all()
    assert np.isfinite(kernels["latency_ms"]).all()
    assert set(kernels["dtype"]) <= set(kd.DTYPES)
    assert kernels.attrs["dropped"] == {} or all(v > 0 for v in kernels.attrs["dropped"].values())


def test_required_shape_columns_filled(kernels):
    gemm = kernels[kernels.op.isin(["bmm", "linear"])]
    assert gemm[["B", "M", "N", "K"]].gt(0).all().all()
    assert gemm["H"].isna().all()
    vec = kernels[~kernels.op.isin(["bmm", "linear", "conv"])]
    assert vec[["B", "H"]].gt(0).all().all()
    assert vec[["M", "N", "K"]].isna().all().all()
    conv = kernels[kernels.op == "conv"]
    assert len(conv) > 0
    assert conv[["Input_Channel", "Output_Channel", "Kernel_Size", "Input_Size", "Stride"]].gt(0).all().all()
    assert (conv["Padding"] >= 0).all()


def test_neusight_gemm_flops_below_fp32_peak(kernels):
    ns = kernels[kernels.source.str.startswith("neusight") & kernels.op.isin(["bmm", "linear"])]
    assert set(ns["dtype"]) == {"fp32"}
    best = _tflops(ns).groupby(ns["device"]).max()
    assert set(best.index) == set(FP32_PEAK_TFLOPS)
    for dev, tf in best.items():
        assert tf <= 1.05 * FP32_PEAK_TFLOPS[dev], (dev, tf)
        assert tf >= 0.3 * FP32_PEAK_TFLOPS[dev], (dev, tf)  # sweeps reach a good share of the peak


def test_tensor_core_sources_fit_their_peaks(kernels):
    db = kernels[kernels.source == "deepbench"]
    best = _tflops(db).groupby([db.device, db.dtype]).max()
    assert best[("Tesla-T4", "fp32")] <= 8.1 * 1.05
    assert best[("V100-SXM2-16GB", "fp32")] <= 15.7 * 1.05
    assert best[("V100-SXM2-16GB", "fp16")] > 3 * best[("V100-SXM2-16GB", "fp32")]
    xla = kernels[kernels.source == "xla"]
    best = _tflops(xla).groupby([xla.device, xla.dtype]).max()
    assert best[("B200", "tf32")] <= 1125 and best[("B200", "bf16")] <= 2250 and best[("B200", "fp8")] <= 4500
    assert ("MI355X", "fp32") not in best.index and ("MI355X", "tf32") not in best.index
    # one label per (device, dtype, shape)
    assert not xla.duplicated(["device", "dtype", "B", "M", "N", "K"]).any()
    assert not db.duplicated(["device", "dtype", "B", "M", "N", "K"]).any()


def test_gemm_contraction_convention(kernels):
    # DeepBench DeepSpeech: M=1760, N=16 (batch), K=1760 (contraction) -> bmm N=1760, K=16
    db = kernels[(kernels.source == "deepbench") & (kernels.M == 1760) & (kernels.K == 16)]
    assert len(db) > 0 and (db.N == 1760).all()
    # LLMCompass: (M, K) @ (K, N) with first row 64, 12288, 12288
    lc = kernels[(kernels.source == "llmcompass") & (kernels.op == "bmm")]
    assert (lc.B == 1).all() and {64.0, 8192.0} <= set(lc.M)


def test_kernels_test_deduplicated(kernels):
    kt = kernels[kernels.source == "neusight/kernels_test"]
    assert not kt.duplicated([c for c in COLUMNS if c != "origin"]).any()
    assert set(kt.op) >= {"bmm", "linear", "ln", "softmax", "add", "mulu", "gelu"}


def test_vidur_shapes(kernels):
    v = kernels[kernels.source == "vidur"]
    assert set(v.device) == {"A100-SXM4-80GB", "A40"}
    assert set(v.dtype) == {"fp16"}
    assert set(v.op) == {"linear", "rmsnorm", "ln", "add", "silu_mul", "gelu"}
    l3 = v[v.origin.str.contains("a100/meta-llama/Meta-Llama-3-8B/") & (v.op == "linear") & (v.M == 1024)]
    # n_embd 4096, 32 heads, 8 kv heads, head_dim 128, n_expanded 14336, gated
    shapes = {(n, k) for n, k in zip(l3.N, l3.K)}
    assert (4096, 6144) in shapes  # attn_pre_proj, TP=1
    assert (4096, 3072) in shapes  # attn_pre_proj, TP=2
    assert (4096, 2 * 14336) in shapes  # gated up-proj, TP=1
    assert (14336 / 4, 4096) in shapes  # down-proj, TP=4
    assert (4096 / 8, 4096) in shapes  # post-proj, TP=8
    phi = v[v.origin.str.contains("phi-2")]
    assert set(phi.op) == {"linear", "ln", "add", "gelu"}


def test_split_heldout_real(kernels):
    train, held = split_heldout(kernels)
    assert not set(train.device) & {"L4", "A100-PCIe-80GB", kd.UNKNOWN_A100_80GB}
    assert set(held.device) == {"L4", "A100-PCIe-80GB"}
    assert len(train) + len(held) == len(kernels) - (kernels.device == kd.UNKNOWN_A100_80GB).sum()
    _, held2 = split_heldout(kernels, ambiguous_to_heldout=True)
    assert kd.UNKNOWN_A100_80GB in set(held2.device)


def test_label_nodes_l4(l4_nodes):
    df = l4_nodes
    assert set(df.device) == {"L4"}
    assert set(df.source) == {"neusight/labels"}
    assert list(df.columns) == list(kd.LABEL_COLUMNS)
    ops = set(df.op)
    assert {"linear", "bmm", "ln", "softmax"} <= ops
    assert ops & {"add", "addu", "mul", "mulu", "divu", "powu", "tanh", "gelu", "relu"}
    assert ops <= set(kd.NEUSIGHT_OPS)
    assert (df.latency_ms > 0).all()
    assert (df.latency_ms == df.fw_latency_ms).all()
    assert set(df["mode"]) <= {"train", "inf"} and "train" in set(df["mode"])
    assert not df.origin.str.contains("-fusion|-dp4|-tp4|-pp4").any()
    assert isinstance(df.attrs["skipped_targets"], Counter)
    assert df.attrs["skipped_targets"]["module:Dropout"] > 0


def test_label_nodes_shapes_gpt2(l4_nodes):
    g = l4_nodes[l4_nodes.origin.str.endswith("gpt2_large-train-1024-1.csv")]
    # c_attn Conv1D via addmm: (1024, 1280) @ (1280, 3840)
    qkv = g[g.node == "addmm"].iloc[0]
    assert (qkv.op, qkv.B, qkv.M, qkv.N, qkv.K) == ("linear", 1, 1024, 1280, 3840)
    # q @ k^T: (1, 20, 1024, 64) @ (1, 20, 64, 1024)
    qk = g[g.node == "matmul"].iloc[0]
    assert (qk.op, qk.B, qk.M, qk.N, qk.K) == ("bmm", 20, 1024, 64, 1024)
    head = g[g.node == "lm_head"].iloc[0]
    assert (head.op, head.M, head.N, head.K) == ("linear", 1024, 1280, 50257)
    # 0.5 * x -> tensor-scalar
    assert g[g.node == "mul"].iloc[0].op == "mulu"
    ln = g[g.node == "transformer_h_0_ln_1"].iloc[0]
    assert (ln.op, ln.B, ln.H) == ("ln", 1024, 1280)
    # linear flops on L4 stay below its FP32 peak
    lin = l4_nodes[l4_nodes.op.isin(["linear", "bmm"])]
    assert _tflops(lin).max() <= 1.05 * FP32_PEAK_TFLOPS["L4"]


# ------------------------------------------------------------------------------------------ node mapping


def test_map_node_rules():
    m = kd._map_node
    assert m("addmm", [[3840], [1024, 1280], [1280, 3840]], (1024, 3840)) == dict(op="linear", B=1.0, M=1024.0, N=1280.0, K=3840.0)
    assert m("module:Linear", [[2, 512, 1024]], (2, 512, 4096)) == dict(op="linear", B=1.0, M=1024.0, N=1024.0, K=4096.0)
    assert m("bmm", [[64, 2048, 64], [64, 64, 2048]], (64, 2048, 2048)) == dict(op="bmm", B=64.0, M=2048.0, N=64.0, K=2048.0)
    assert m("matmul", [[2, 16, 512, 64], [2, 16, 64, 512]], (2, 16, 512, 512))["B"] == 32.0
    assert m("truediv", [[1, 20, 1024, 1024], [1]], (1, 20, 1024, 1024))["op"] == "divu"
    assert m("sub", [[2, 1, 1, 512]], (2, 1, 1, 512))["op"] == "addu"
    assert m("add", [[2, 16, 512, 512], [2, 1, 1, 512]], (2, 16, 512, 512)) == dict(op="add", B=16384.0, H=512.0)
    assert m("module:ReLU", [[4096, 8192]], (4096, 8192)) == dict(op="relu", B=4096.0, H=8192.0)
    assert m("module:Dropout", [[4, 8]], (4, 8)) is None
    assert m("module:NewGELUActivation", [[4, 8]], (4, 8)) is None
    assert m("view", [[4, 8]], (32,)) is None


# ------------------------------------------------------------------------------------------ errors


def test_data_not_found(tmp_path, monkeypatch):
    missing = tmp_path / "nope"
    with pytest.raises(DataNotFoundError, match="--data PATH"):
        resolve_data_root(missing)
    with pytest.raises(FileNotFoundError):
        load_kernels(missing)
    monkeypatch.setenv("WATTCAST_DATA", str(missing))
    with pytest.raises(DataNotFoundError, match="WATTCAST_DATA"):
        resolve_data_root()
    monkeypatch.setenv("WATTCAST_DATA", str(tmp_path))
    assert resolve_data_root() == tmp_path.resolve()


def _deepbench_root(tmp_path: Path, text: str) -> Path:
    root = tmp_path / "datasets"
    (root / "tensorcore").mkdir(parents=True)
    (root / "tensorcore" / "deepbench_train_gemm.csv").write_text(text)
    return root


_DB_HEADER = "gpu,sheet,precision,app,M,N,K,a_trans,b_trans,time_ms,tflops\n"


def test_missing_column_in_source_names_file_and_column(tmp_path):
    root = _deepbench_root(tmp_path, "gpu,sheet,precision,app,M,N,K,a_trans,b_trans,tflops\nV100,s,Float,x,8,8,8,N,N,1\n")
    with pytest.raises(KernelDataError, match=r"deepbench_train_gemm\.csv.*'time_ms'"):
        load_kernels(root, sources=["deepbench"])


def test_bad_source_rows_dropped_and_reported(tmp_path, caplog):
    root = _deepbench_root(tmp_path, _DB_HEADER
                           + "V100,s,Float,x,1760,16,1760,N,N,0.038,1\n"
                           + "V100,s,Float,x,1760,32,1760,N,N,-1,1\n"
                           + "V100,s,Float,x,1760,64,1760,N,N,,1\n"
                           + "V100,s,Float,x,1760,64,1760,T,N,0.05,1\n"
                           + "1080Ti,s,Float,x,1760,16,1760,N,N,0.04,1\n")
    with caplog.at_level(logging.INFO, logger="wattcast.data.kernel_datasets"):
        df = load_kernels(root, sources=["deepbench"])
    assert len(df) == 1
    row = df.iloc[0]
    assert (row["op"], row["dtype"], row["device"], row.B, row.M, row.N, row.K) == ("bmm", "fp32", "V100-SXM2-16GB", 1, 1760, 1760, 16)
    origin = "tensorcore/deepbench_train_gemm.csv"
    assert df.attrs["dropped"] == {origin: 2}
    assert df.attrs["excluded"] == {origin: 1}
    assert "dropped 2 row(s)" in caplog.text


def test_unknown_source_name(tmp_path):
    with pytest.raises(ValueError, match="unknown kernel source"):
        load_kernels(tmp_path, sources=["nope"])


def test_split_heldout_synthetic():
    df = pd.DataFrame({"device": ["L4", "Tesla-T4", "A100-PCIe-80GB", kd.UNKNOWN_A100_80GB, "MI210"], "x": range(5)})
    train, held = split_heldout(df)
    assert list(train.device) == ["Tesla-T4", "MI210"]
    assert list(held.device) == ["L4", "A100-PCIe-80GB"]
    _, held = split_heldout(df, ambiguous_to_heldout=True)
    assert list(held.device) == ["L4", "A100-PCIe-80GB", kd.UNKNOWN_A100_80GB]


# ------------------------------------------------------------------------------------------ user CSV


def test_user_kernels_ok(tmp_path):
    p = tmp_path / "mine.csv"
    p.write_text(
        "OPName,Latency (ms),Device,B,M,N,K,H,dtype\n"
        "bmm,0.5,my-gpu,2,64,128,256,,\n"
        "linear,1.5,my-gpu,1,64,128,256,,float16\n"
        "add,0.01,my-gpu,8,,,,1024,bf16\n"
    )
    df = load_user_kernels(p)
    assert list(df.columns) == list(COLUMNS)
    assert list(df.op) == ["bmm", "linear", "add"]
    assert list(df.dtype) == ["fp32", "fp16", "bf16"]
    assert set(df.source) == {"user"} and set(df.device) == {"my-gpu"}
    assert df.loc[2, "M"] != df.loc[2, "M"]  # NaN: add has no M
    assert np.isnan(df.loc[0, "H"])


def test_user_kernels_alternative_names_and_conv(tmp_path):
    p = tmp_path / "conv.csv"
    p.write_text(
        "op,latency_ms,Device,B,Input_Channel,Output_Channel,Kernel_Szie,Input_Size,Stride,Padding\n"
        "conv,2.7,T4,55,1701,569,3,5,1,0\n"
    )
    df = load_user_kernels(p)
    assert df.loc[0, "Kernel_Size"] == 3 and df.loc[0, "Padding"] == 0 and df.loc[0, "dtype"] == "fp32"


def test_user_kernels_missing_columns(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("OPName,Device,B,H\nadd,x,1,2\n")
    with pytest.raises(KernelDataError, match="Latency"):
        load_user_kernels(p)
    p.write_text("OPName,Latency,Device,B,M,N\nbmm,1,x,1,2,3\n")
    with pytest.raises(KernelDataError, match=r"'K' \(needed by bmm\)"):
        load_user_kernels(p)


def test_user_kernels_bad_rows(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text(
        "OPName,Latency,Device,B,H,M,N,K\n"
        "add,0.1,x,4,8,,,\n"          # line 2: fine
        "add,-0.1,x,4,8,,,\n"         # line 3: negative latency
        "add,0.1,x,four,8,,,\n"       # line 4: non-numeric shape
        "frobnicate,0.1,x,4,8,,,\n"   # line 5: unknown op
        "bmm,0.1,x,1,,2,3,\n"         # line 6: K empty
    )
    with pytest.raises(KernelDataError) as e:
        load_user_kernels(p)
    msg = str(e.value)
    assert "4 bad row(s)" in msg
    assert "line 3" in msg and "latency -0.1 must be > 0" in msg
    assert "line 4" in msg and "'four' is not a number" in msg
    assert "line 5" in msg and "unknown op 'frobnicate'" in msg
    assert "line 6" in msg and "K is empty" in msg
    assert "line 2:" not in msg


def test_user_kernels_shapes_follow_the_kernels_input_rules(tmp_path):
    # `wattcast train kernels --csv` refuses what `wattcast kernels` refuses: a fractional shape, one beyond 2**40
    p = tmp_path / "frac.csv"
    p.write_text(
        "OPName,Latency,Device,B,M,N,K,dtype\n"
        "linear,0.1,x,1,40.5,4096,4096,bf16\n"        # line 2: fractional M
        "linear,0.1,x,1,40,4096,4096,bf16\n"          # line 3: fine
        "linear,0.1,x,1,1e3,4096,4096,bf16\n"         # line 4: fine (a whole number written 1e3)
        "linear,0.1,x,1,40,4096,2e12,bf16\n"          # line 5: K beyond 2**40
        "linear,0.1,x,1,40,1,1099511627776,bf16\n"     # line 6: K = 2**40, the bound itself: fine
    )
    with pytest.raises(KernelDataError) as e:
        load_user_kernels(p)
    msg = str(e.value)
    assert "2 bad row(s)" in msg
    assert "line 2: M=40.5 must be a whole number" in msg
    assert "line 5: K=2e12 is beyond 2**40 = 1,099,511,627,776" in msg
    assert "line 3" not in msg and "line 4" not in msg and "line 6" not in msg
    # the same rows as `wattcast kernels` refuses them (models/kernel_predictor.py)
    import pandas as pd

    from wattcast.models.kernel_predictor import normalise_kernel_frame

    frame = pd.read_csv(p).rename(columns={"OPName": "op"})
    assert [bool(e) for e in normalise_kernel_frame(frame)[1]] == [True, False, False, True, False]


def test_user_kernels_lists_at_most_ten(tmp_path):
    p = tmp_path / "many.csv"
    p.write_text("OPName,Latency,Device,B,H\n" + "".join("add,0,x,1,1\n" for _ in range(15)))
    with pytest.raises(KernelDataError) as e:
        load_user_kernels(p)
    msg = str(e.value)
    assert "15 bad row(s)" in msg and "... and 5 more" in msg
    assert msg.count("  line ") == 10


def test_load_xla_fp8_combinations_keeps_every_fp8_pair_and_flags_the_kept_one(tmp_path):
    root = tmp_path / "datasets"
    (root / "tensorcore").mkdir(parents=True)
    head = "device,b,m,n,k,lhs_dtype,rhs_dtype,out_dtype,flops_per_s,tflops,derived_time_us\n"
    rows = ["gfx950,1,256,512,1024,f8e4m3fn,f8e4m3fn,bf16,2e14,200,0",
            "gfx950,1,256,512,1024,f8e4m3fn,f8e5m2,bf16,4e14,400,0",
            "gfx950,1,256,512,1024,f8e5m2,f8e4m3fn,f32,5e14,500,0",
            "gfx950,1,256,512,1024,bf16,bf16,bf16,1e14,100,0",  # not fp8: left out
            "sm_90,1,256,512,1024,f8e4m3fn,f8e4m3fn,bf16,3e14,300,0",  # withheld Hopper: left out
            "gfx999,1,256,512,1024,f8e4m3fn,f8e4m3fn,bf16,3e14,300,0"]  # no catalog device: left out
    (root / "tensorcore" / "xla_matmul_perf_table.csv").write_text(head + "\n".join(rows) + "\n")
    df = kd.load_xla_fp8_combinations(root, xla_tables=[])
    assert list(df["device"]) == ["MI355X"] * 3 and set(df["dtype"]) == {"fp8"} and set(df["source"]) == {"xla"}
    assert list(zip(df["lhs_dtype"], df["rhs_dtype"], df["out_dtype"])) == [
        ("f8e4m3fn", "f8e4m3fn", "bf16"), ("f8e4m3fn", "f8e5m2", "bf16"), ("f8e5m2", "f8e4m3fn", "f32")]
    assert list(df["kept"]) == [True, False, False]
    assert list(df["tflops"]) == pytest.approx([200.0, 400.0, 500.0])
    # the same shape mapping and latency as load_kernels (k the contraction -> N)
    assert list(df[["M", "N", "K"]].iloc[0]) == [256.0, 1024.0, 512.0]
    assert df["latency_ms"].iloc[0] == pytest.approx(2 * 256 * 512 * 1024 / 2e14 * 1e3)
    kept = load_kernels(root, sources=["xla"], xla_tables=[])
    kept = kept[kept["dtype"] == "fp8"]
    assert len(kept) == 1 and kept["latency_ms"].iloc[0] == pytest.approx(df["latency_ms"].iloc[0])


def test_xla_tables_read_once_give_what_reading_them_gives(tmp_path, monkeypatch):
    """read_xla_tables' tables (what benchmarks/leave_one_generation_out.py reads once for its GEMM rows and fp8
    combinations) load as the files do, and the files are not read again; paths and read tables both is an error."""
    root = tmp_path / "datasets"
    (root / "tensorcore").mkdir(parents=True)
    head = "device,b,m,n,k,lhs_dtype,rhs_dtype,out_dtype,flops_per_s,tflops,derived_time_us\n"
    rows = ["gfx950,1,256,512,1024,f8e4m3fn,f8e4m3fn,bf16,2e14,200,0",
            "gfx950,1,256,512,1024,f8e4m3fn,f8e5m2,bf16,4e14,400,0",
            "gfx950,1,256,512,1024,bf16,bf16,bf16,1e14,100,0"]
    (root / "tensorcore" / "xla_matmul_perf_table.csv").write_text(head + "\n".join(rows) + "\n")
    read = kd.read_xla_tables(root, xla_tables=[])
    monkeypatch.setattr(kd.pd, "read_csv", lambda *a, **k: pytest.fail("an XLA table was read again"))
    once = load_kernels(root, sources=["xla"], xla_read=read)
    combos = kd.load_xla_fp8_combinations(root, xla_read=read)
    monkeypatch.undo()
    pd.testing.assert_frame_equal(once, load_kernels(root, sources=["xla"], xla_tables=[]))
    assert once.attrs["xla_tables"] == []
    pd.testing.assert_frame_equal(combos, kd.load_xla_fp8_combinations(root, xla_tables=[]))
    with pytest.raises(ValueError, match="not both"):
        load_kernels(root, sources=["xla"], xla_tables=[], xla_read=read)
