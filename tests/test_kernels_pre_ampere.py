"""GPUs without BF16 (V100, T4, P4): kernels' fp8 refusal suggests what the GPU runs, and bf16 GEMMs are refused as
predict refuses bf16 there."""

from __future__ import annotations


import pandas as pd
import pytest

import wattcast
from conftest import run_cli
from wattcast.data.catalog import resolve_device
from wattcast.data.device_spec import unsupported_step_dtype


# ------------------------------------------------------------------ 4. GPUs without BF16
@pytest.mark.parametrize("device,want", [("V100-SXM2-32GB", "use fp16"), ("Tesla-T4", "use fp16"),
                                         ("A100-SXM4-80GB", "use bf16")])
def test_kernels_fp8_refusal_suggests_what_the_gpu_runs(tmp_path, device, want):
    p = tmp_path / "k.csv"
    p.write_text("OPName,B,M,N,K\nlinear,1,64,64,64\n")
    r = run_cli("kernels", "-i", str(p), "--device", device, "--dtype", "fp8")
    assert r.returncode != 0
    assert want in " ".join((r.stdout + r.stderr).split())


@pytest.mark.parametrize("device", ["V100-SXM2-32GB", "Tesla-T4", "Tesla-P4"])
def test_bf16_gemms_refused_where_predict_refuses_bf16(device):
    spec = resolve_device(device)
    assert "peak_bf16_tflops" in unsupported_step_dtype(spec, "bf16")
    g = pd.DataFrame({"OPName": ["linear", "linear", "add"], "dtype": ["bf16", "fp16", "bf16"], "B": [1, 1, 8192],
                      "M": [8192, 8192, None], "N": [4096, 4096, None], "K": [4096, 4096, None],
                      "H": [None, None, 4096]})
    out = wattcast.predict_kernels(g, device)
    assert "peak_bf16_tflops" in out["error"].iloc[0] and pd.isna(out["pred_latency_ms"].iloc[0])
    assert out["error"].iloc[2] == "" and out["pred_latency_ms"].iloc[2] > 0  # a vector row reads no matrix peak
