"""A GeForce FP8 peak is checked at the FP32-accumulate rate (``data.device_spec._GEFORCE_RATE_FACTOR``), as BF16 and
TF32 already were.

NVIDIA Ada GPU architecture whitepaper, Appendix A, GeForce RTX 4090 (128 SMs, 2,520 MHz): Peak FP8 Tensor TFLOPS with
FP16 accumulate 660.6 / with FP32 accumulate 330.3 (dense; 1,321.2 / 660.6 sparse). NVIDIA RTX Blackwell GPU
architecture whitepaper, Appendix A, GeForce RTX 5090 (170 SMs, 2,407 MHz): 838 / 419 dense. PyTorch and Transformer
Engine FP8 GEMMs accumulate in FP32. Before, an RTX 4090 spec with the FP16-accumulate 660.6 loaded with a warning
that blamed sparsity, and Llama 3 8B fp8 inference came out 133.0 ms instead of 187.6 ms (audit 56a, finding 1)."""

from __future__ import annotations

import pytest
import yaml

import wattcast
from conftest import EXAMPLES, REPO, flat, run_cli
from wattcast.data.catalog import load_catalog, load_spec_file
from wattcast.data.device_spec import DeviceSpecError, from_dict, is_geforce, peak_ratio_notes, spec_notes

SPARSE = "this looks like the sparse (2:4 structured sparsity) figure"
DEVICES = REPO / "data" / "devices"


def _rtx4090(**change) -> dict:
    d = load_spec_file(EXAMPLES / "my_gpu.yaml").to_dict()
    d.pop("schema_version", None)
    return {**d, **change}


# NVIDIA RTX Blackwell GPU architecture whitepaper, Appendix A, GeForce RTX 5090: dense FP16 419 (FP16 accumulate) /
# 209.5 (FP32 accumulate), BF16 209.5, TF32 104.8, FP8 838 (FP16 accumulate) / 419 (FP32 accumulate)
RTX5090 = dict(name="GeForce RTX 5090", vendor="nvidia", arch="Blackwell (GB202)", peak_fp32_tflops=104.8,
               peak_tf32_tflops=104.8, peak_fp16_tflops=209.5, peak_bf16_tflops=209.5, peak_fp8_tflops=419.0,
               memory_gb=32, memory_type="GDDR7", memory_bandwidth_gbps=1792, num_sms=170, cores_per_sm=128,
               base_clock_mhz=2017, boost_clock_mhz=2407, l2_cache_mb=96, tdp_w=575,
               source="NVIDIA RTX Blackwell GPU architecture whitepaper, Appendix A, GeForce RTX 5090 column")


def test_the_fp32_accumulate_fp8_figure_loads_without_a_warning():
    s = from_dict(_rtx4090(peak_fp8_tflops=330.3))
    assert is_geforce(s) and s.peak_fp8_tflops == 330.3
    assert not any("peak_fp8_tflops" in n or SPARSE in n for n in spec_notes(s)), spec_notes(s)


def test_the_fp16_accumulate_fp8_figure_is_refused_naming_the_field_and_the_accumulate_rate():
    with pytest.raises(DeviceSpecError) as e:
        from_dict(_rtx4090(peak_fp8_tflops=660.6))
    msg = str(e.value)
    assert "field 'peak_fp8_tflops' (660.6)" in msg
    assert "FP16-accumulate figure" in msg and "FP32 accumulate" in msg
    assert "about 330.3 TFLOP/s here" in msg  # the figure to give instead, from this spec's SMs and clock
    with wattcast.allow_exotic():  # --force keeps it, as every plausibility refusal
        assert from_dict(_rtx4090(peak_fp8_tflops=660.6)).peak_fp8_tflops == 660.6


def test_the_sparse_fp8_figure_is_refused_naming_sparsity():
    with pytest.raises(DeviceSpecError, match=r"field 'peak_fp8_tflops' \(1321\.2\) is 4x.*GeForce part.*"
                                              + SPARSE.replace("(", r"\(").replace(")", r"\)")):
        from_dict(_rtx4090(peak_fp8_tflops=1321.2))


def test_rtx5090_fp8_at_each_rate():
    assert from_dict(RTX5090).peak_fp8_tflops == 419.0
    with pytest.raises(DeviceSpecError, match=r"field 'peak_fp8_tflops' \(838\).*FP16-accumulate figure.*about 419"):
        from_dict({**RTX5090, "peak_fp8_tflops": 838.0})
    with pytest.raises(DeviceSpecError, match=r"field 'peak_fp8_tflops' \(1676\) is 4x.*sparse"):
        from_dict({**RTX5090, "peak_fp8_tflops": 1676.0})


def test_workstation_ada_keeps_the_full_fp8_rate():
    # NVIDIA RTX 6000 Ada datasheet: 142 SMs at 2,505 MHz, 364.2 dense FP16/BF16 with FP32 accumulate, FP8 728.5
    # dense (1,457 sparse): not a GeForce, so its FP8 runs at twice the 16-bit rate with FP32 accumulate
    ws = _rtx4090(name="RTX 6000 Ada", aliases=[], num_sms=142, boost_clock_mhz=2505, peak_bf16_tflops=364.2,
                  peak_fp16_tflops=364.2, peak_tf32_tflops=182.1, peak_fp32_tflops=91.1, peak_fp8_tflops=728.5)
    s = from_dict(ws)
    assert not is_geforce(s) and s.peak_fp8_tflops == 728.5 and peak_ratio_notes(s) == []


def test_fp8_is_compared_with_bf16_on_a_geforce_that_gives_the_fp16_accumulate_fp16_figure():
    # FP16 330.3 (FP16 accumulate: loads under --force only, tests/test_geforce_fp16_accumulate.py), BF16 165.2, FP8
    # 330.3: FP8 was compared with the larger 16-bit peak (FP16's 330.3, 1x) and got "is one of them a sparse figure?"
    with wattcast.allow_exotic():
        s = from_dict(_rtx4090(peak_fp16_tflops=330.3, peak_fp8_tflops=330.3))
    assert not any("peak_fp8_tflops" in n for n in peak_ratio_notes(s)), peak_ratio_notes(s)
    # and a GeForce FP8 at 4x BF16 under --force is still flagged
    with wattcast.allow_exotic():
        s = from_dict(_rtx4090(peak_fp8_tflops=660.6))
    assert any("peak_fp8_tflops (660.6) is 4x peak_bf16_tflops" in n for n in peak_ratio_notes(s))


def test_every_catalog_device_loads_and_keeps_its_fp8_peak():
    files = sorted(DEVICES.glob("*.yaml"))
    catalog = load_catalog()
    assert len(files) == len(catalog) >= 28
    for f in files:
        raw = yaml.safe_load(f.read_text())
        s = load_spec_file(f)  # every rule, citations included
        assert s.peak_fp8_tflops == raw.get("peak_fp8_tflops"), f.name
        assert not any("peak_fp8_tflops" in n for n in peak_ratio_notes(s)), f.name
    assert {n for n, s in catalog.items() if s.peak_fp8_tflops} >= {"H100-SXM5-80GB", "L40S", "L4", "B200", "MI300X"}


def test_predict_fp8_on_the_geforce_spec(tmp_path):
    text = (EXAMPLES / "my_gpu.yaml").read_text()
    assert "\npeak_bf16_tflops: 165.2\n" in text
    ok, bad = tmp_path / "rtx_330.yaml", tmp_path / "rtx_660.yaml"
    ok.write_text(text.replace("\npeak_bf16_tflops: 165.2\n", "\npeak_bf16_tflops: 165.2\npeak_fp8_tflops: 330.3\n"))
    bad.write_text(text.replace("\npeak_bf16_tflops: 165.2\n", "\npeak_bf16_tflops: 165.2\npeak_fp8_tflops: 660.6\n"))
    r = run_cli("predict", "-m", "gpt2", "-d", bad, "-s", "1024", "--dtype", "fp8", "--mode", "inference", "--json")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "field 'peak_fp8_tflops' (660.6)" in flat(r.stderr) and "FP32 accumulate" in flat(r.stderr)
    r = run_cli("predict", "-m", "gpt2", "-d", ok, "-s", "1024", "--dtype", "fp8", "--mode", "inference", "--json")
    assert r.returncode == 0, r.stderr
