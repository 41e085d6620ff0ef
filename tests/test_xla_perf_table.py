"""XLA's GemmPerfTable read from a textproto, a binary that embeds it, a wheel, or a CSV; joined to the kernel data."""

from __future__ import annotations

import zipfile

import numpy as np
import pandas as pd
import pytest

from wattcast.data.xla_perf_table import (XlaTableError, parse_gemm_perf_table, read_xla_gemm_table, table_texts,
                                          tables_from_env)

TEXT = """# proto-file: third_party/tensorflow/compiler/xla/xla_data.proto
# proto-message: xla.GemmPerfTable

entries {
  key: "sm_90"
  value {
    entries {
      b: 1
      m: 256
      n: 512
      k: 1024
      flops { key: "bf16xbf16->bf16" value: 100000000000000 }
      flops { key: "f32xf32->f32" value: 50000000000000 }
      flops { key: "f8e4m3fnxf8e4m3fn->bf16" value: 200000000000000 }
    }
    entries {
      b: 2
      m: 4096
      n: 4096
      k: 4096
      flops { key: "bf16xbf16->bf16" value: 800000000000000 }
    }
  }
}
entries {
  key: "sm_107"
  value {
    entries {
      b: 1
      m: 256
      n: 256
      k: 256
      flops { key: "bf16xbf16->bf16" value: 7000000000000 }
    }
  }
}
entries {
  key: "sm_100_B200"
  value {
    entries {
      b: 1
      m: 256
      n: 256
      k: 256
      flops { key: "bf16xbf16->bf16" value: 1 }
    }
  }
}
"""


def _binary_with(text: str) -> bytes:
    # a shared object's bytes around the embedded file: NULs and non-printable bytes on both sides
    return b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8 + text.encode() + b"\x00\x01\x02" + bytes(range(256)) * 4


def test_parse_gives_the_shared_csv_columns_and_the_time_each_flops_figure_implies():
    df = parse_gemm_perf_table(TEXT)
    assert list(df.columns) == ["device", "b", "m", "n", "k", "lhs_dtype", "rhs_dtype", "out_dtype", "flops_per_s",
                                "tflops", "derived_time_us"]
    assert len(df) == 6
    r = df[(df.device == "sm_90") & (df.b == 2)].iloc[0]
    assert (r.lhs_dtype, r.rhs_dtype, r.out_dtype) == ("bf16", "bf16", "bf16")
    assert r.derived_time_us == pytest.approx(2 * 2 * 4096 ** 3 / 8e14 * 1e6)
    fp8 = df[df.lhs_dtype == "f8e4m3fn"].iloc[0]
    assert (fp8.rhs_dtype, fp8.out_dtype) == ("f8e4m3fn", "bf16")


def test_the_table_is_found_in_a_binary_and_in_a_wheel(tmp_path):
    so = tmp_path / "xla_cuda_plugin.so"
    so.write_bytes(_binary_with(TEXT))
    assert len(table_texts(so)) == 1
    whl = tmp_path / "jax_plugin-0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("jax_plugins/xla_cuda13/xla_cuda_plugin.so", _binary_with(TEXT))
        z.writestr("jax_plugins/xla_cuda13/__init__.py", "")
    a, b = read_xla_gemm_table(so), read_xla_gemm_table(whl)
    pd.testing.assert_frame_equal(a, b)
    assert len(a) == 6
    out = tmp_path / "t.csv"
    a.to_csv(out, index=False)
    pd.testing.assert_frame_equal(read_xla_gemm_table(out), a)


def test_bad_files_are_refused_naming_what_is_missing(tmp_path):
    plain = tmp_path / "notes.txt"
    plain.write_text("hello")
    with pytest.raises(XlaTableError, match="not an XLA GEMM table"):
        read_xla_gemm_table(plain)
    empty_zip = tmp_path / "x.whl"
    with zipfile.ZipFile(empty_zip, "w") as z:
        z.writestr("a.so", b"\x00" * 100)
    with pytest.raises(XlaTableError, match="no xla.GemmPerfTable"):
        read_xla_gemm_table(empty_zip)
    broken = tmp_path / "broken.txtpb"
    broken.write_text(TEXT.replace("      k: 1024\n", ""))  # an entry without k
    with pytest.raises(XlaTableError, match="1 of 2 entries"):
        read_xla_gemm_table(broken)
    bad_csv = tmp_path / "bad.csv"
    pd.DataFrame({"device": ["sm_90"], "b": [1]}).to_csv(bad_csv, index=False)
    with pytest.raises(XlaTableError, match="missing column"):
        read_xla_gemm_table(bad_csv)
    with pytest.raises(XlaTableError, match="no such file"):
        read_xla_gemm_table(tmp_path / "absent.txtpb")


def test_env_variable_lists_paths(monkeypatch, tmp_path):
    monkeypatch.setenv("WATTCAST_XLA_TABLE", f"{tmp_path / 'a.csv'}:{tmp_path / 'b.whl'}")
    assert [p.name for p in tables_from_env()] == ["a.csv", "b.whl"]
    monkeypatch.setenv("WATTCAST_XLA_TABLE", "")
    assert tables_from_env() == []


def test_extra_rows_join_the_xla_source_with_the_documented_labels(data_root, tmp_path, monkeypatch):
    from wattcast.data.kernel_datasets import load_kernels

    f = tmp_path / "table.txtpb"
    f.write_text(TEXT.replace('key: "sm_90"', 'key: "gfx942"'))
    base = load_kernels(data_root, sources=["xla"], xla_tables=[])
    df = load_kernels(data_root, sources=["xla"], xla_tables=[f])
    new = df[df.origin == str(f)]
    # gfx942: bf16 -> bf16; f32 (precision unknown) and OCP fp8 (CDNA3 runs the fnuz variant) left out; sm_107 is no
    # catalog device; the B200 shape the shared CSV has keeps the shared row (the bogus 1 FLOP/s figure never arrives)
    assert sorted(zip(new.device, new.dtype)) == [("MI300X", "bf16"), ("MI300X", "bf16")]
    assert (new.source == "xla").all() and (new.op == "bmm").all()
    assert len(df) == len(base) + 2
    assert df.attrs["excluded"][str(f)] == 1 and df.attrs["xla_tables"] == [str(f)]
    r = new[(new.B == 2)].iloc[0]  # XLA's k is the contraction: bmm N = k, K = n
    assert (r.M, r.N, r.K) == (4096, 4096, 4096)
    assert r.latency_ms == pytest.approx(2 * 2 * 4096 ** 3 / 8e14 * 1e3)
    b200 = df[(df.device == "B200") & (df.dtype == "bf16") & (df.M == 256) & (df.N == 256) & (df.K == 256) & (df.B == 1)]
    assert len(b200) == 1 and np.isfinite(b200.latency_ms).all() and b200.latency_ms.iloc[0] < 1.0
    monkeypatch.setenv("WATTCAST_XLA_TABLE", str(f))
    assert len(load_kernels(data_root, sources=["xla"])) == len(df)


def test_profile_import_points_an_xla_table_to_the_training_flag(tmp_path):
    from wattcast.data.profiles.importers import detect_format
    from wattcast.data.profiles.tables import ProfileImportError

    f = tmp_path / "default_matmul_perf_table.txtpb"
    f.write_text(TEXT)
    with pytest.raises(ProfileImportError, match="--xla-table"):
        detect_format(f)


def test_withheld_hardware_is_not_recovered_from_an_extra_table(data_root, tmp_path):
    """The shared datasets keep the Hopper generation aside (datasets/README.md); the JAX wheel's table carries sm_90
    rows: they are left out and counted, never trained on."""
    from wattcast.data.kernel_datasets import WITHHELD_DEVICES, load_kernels

    assert "H100-SXM5-80GB" in WITHHELD_DEVICES
    f = tmp_path / "table.txtpb"
    f.write_text(TEXT)
    base = load_kernels(data_root, sources=["xla"], xla_tables=[])
    df = load_kernels(data_root, sources=["xla"], xla_tables=[f])
    assert not df["device"].isin(WITHHELD_DEVICES).any() and len(df) == len(base)
    # sm_90's four rows (bf16, f32 and fp8 of one shape, bf16 of another) withheld, sm_107's one unknown
    assert df.attrs["excluded"][str(f)] == 5 and df.attrs["withheld"] == {str(f): 4}
    assert base.attrs["withheld"] == {}
