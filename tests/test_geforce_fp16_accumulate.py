"""A GeForce FP16 peak is checked at the FP32-accumulate rate (``data.device_spec._GEFORCE_RATE_FACTOR``), as BF16,
TF32 and FP8 already were.

NVIDIA Ada GPU architecture whitepaper, Appendix A, GeForce RTX 4090 (128 SMs, 2,520 MHz): Peak FP16 Tensor TFLOPS with
FP16 accumulate 330.3 / with FP32 accumulate 165.2 (dense). PyTorch's FP16 GEMMs run with CUBLAS_COMPUTE_32F (torch 2.13
aten/src/ATen/cuda/CUDABlas.cpp) unless ``torch.backends.cuda.matmul.allow_fp16_accumulation`` is set. Before, an RTX
4090 spec with ``peak_fp16_tflops: 330.3`` loaded (one warning, "FP16 above BF16") and every FP16 GEMM bound by
compute was predicted against twice the rate PyTorch gets."""

from __future__ import annotations

import pytest

import wattcast
from conftest import EXAMPLES, flat, run_cli
from wattcast.data.catalog import load_spec_file
from wattcast.data.device_spec import DeviceSpecError, from_dict, is_geforce


def _rtx4090(**change) -> dict:
    d = load_spec_file(EXAMPLES / "my_gpu.yaml").to_dict()
    d.pop("schema_version", None)
    return {**d, **change}


def test_the_fp32_accumulate_fp16_figure_loads():
    s = from_dict(_rtx4090(peak_fp16_tflops=165.2))
    assert is_geforce(s) and s.peak_fp16_tflops == 165.2


def test_the_fp16_accumulate_fp16_figure_is_refused_naming_the_figure_to_give():
    with pytest.raises(DeviceSpecError) as e:
        from_dict(_rtx4090(peak_fp16_tflops=330.3))
    msg = str(e.value)
    assert "field 'peak_fp16_tflops' (330.3)" in msg and "FP16-accumulate figure" in msg
    assert "about 165.2 TFLOP/s here" in msg and "allow_fp16_accumulation" in msg
    with wattcast.allow_exotic():  # --force: a user who opts in to FP16 accumulation
        assert from_dict(_rtx4090(peak_fp16_tflops=330.3)).peak_fp16_tflops == 330.3


def test_a_workstation_board_of_the_same_chip_keeps_the_full_fp16_rate():
    # RTX 6000 Ada (AD102, 142 SMs, 2,505 MHz): 364.2 dense FP16/BF16 with FP32 accumulate (NVIDIA RTX 6000 Ada
    # datasheet): not a GeForce part, so its full-rate figure loads
    s = from_dict(_rtx4090(name="RTX 6000 Ada", aliases=[], num_sms=142, boost_clock_mhz=2505, peak_fp16_tflops=364.2,
                           peak_bf16_tflops=364.2, peak_tf32_tflops=182.1, peak_fp32_tflops=91.1, memory_gb=48,
                           tdp_w=300, memory_bandwidth_gbps=960))
    assert not is_geforce(s) and s.peak_fp16_tflops == 364.2


def test_predict_refuses_the_fp16_accumulate_figure_and_the_fp32_one_predicts(tmp_path):
    text = (EXAMPLES / "my_gpu.yaml").read_text()
    assert "\npeak_fp16_tflops: 165.2\n" in text
    bad = tmp_path / "rtx_330.yaml"
    bad.write_text(text.replace("\npeak_fp16_tflops: 165.2\n", "\npeak_fp16_tflops: 330.3\n"))
    r = run_cli("predict", "-m", "gpt2", "-d", bad, "-s", "1024", "--dtype", "fp16", "--mode", "inference", "--json")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "field 'peak_fp16_tflops' (330.3)" in flat(r.stderr) and "FP32 accumulate" in flat(r.stderr)
    r = run_cli("predict", "-m", "gpt2", "-d", EXAMPLES / "my_gpu.yaml", "-s", "1024", "--dtype", "fp16", "--mode",
                "inference", "--json")
    assert r.returncode == 0, r.stderr
