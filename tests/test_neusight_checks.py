"""NeuSight device JSON read wrongly before (found by fuzzing): an L2 in GB, a SingleFLOPs above what one catalog GPU's
SMs can do (was reread as its FP16 tensor peak), SingleFLOPs and SingleFLOPsVEC together (one was dropped, the vendor
flipped to AMD), AMD keys under an NVIDIA name."""

from __future__ import annotations

import pytest

from conftest import flat
from wattcast.data.device_spec import DeviceSpecError
from wattcast.data.neusight_device import from_neusight_json

L4_JSON = {"Device": "NVIDIA L4", "Dev_Mem": 24, "Mem_Bw": 300, "Num_Sm": 60, "Core_Per_SM": 128, "Freq": 2040,
           "SingleFLOPs": 31334, "L2Cache": 48}
MI210_JSON = {"Device": "AMD Instinct MI210", "Dev_Mem": 64, "Mem_Bw": 1640, "Num_Sm": 104, "Core_Per_SM": 4,
              "Freq": 1700, "SingleFLOPsMM": 45300, "SingleFLOPsVEC": 22600, "L2Cache": 16}


def test_l2_cache_in_gb_is_refused_naming_the_neusight_key():
    with pytest.raises(DeviceSpecError) as e:
        from_neusight_json({**L4_JSON, "L2Cache": 0.048})
    assert "looks like GB" in str(e.value) and "NeuSight key 'L2Cache'" in str(e.value)


# ------------------------------------------------------------------ 9. NeuSight SingleFLOPs above the SMs' FP32
@pytest.mark.parametrize("factor", [2, 8])
def test_neusight_fp32_above_the_sms_on_one_gpu_is_refused(factor):
    with pytest.raises(DeviceSpecError) as e:
        from_neusight_json({**L4_JSON, "SingleFLOPs": 31334 * factor})
    msg = flat(str(e.value))
    assert "exceeds 2 x Num_Sm x Core_Per_SM x Freq" in msg and "SingleFLOPs" in msg


def test_neusight_tensor_parallel_pair_still_reads_as_a_group():
    tp = {"Device": "NVIDIA H100 80GB HBM3", "Dev_Mem": 160, "Mem_Bw": 6860, "Num_Sm": 132, "Core_Per_SM": 128,
          "Freq": 1980, "SingleFLOPs": 1979000, "L2Cache": 100}
    s = from_neusight_json(tp)
    assert s.name == "NVIDIA H100 80GB HBM3 x2" and s.peak_fp16_tflops == 1979.0 and s.num_sms == 264


# ------------------------------------------------------------------ 10. NeuSight keys for one field, vendor
def test_neusight_two_keys_for_one_field_are_refused():
    with pytest.raises(DeviceSpecError) as e:
        from_neusight_json({**L4_JSON, "SingleFLOPsVEC": 15667})
    msg = str(e.value)
    assert "'SingleFLOPs' and 'SingleFLOPsVEC'" in msg and "peak_fp32_tflops" in msg


def test_neusight_amd_keys_on_an_nvidia_name_are_refused_not_read_as_amd():
    d = {k: v for k, v in L4_JSON.items() if k != "SingleFLOPs"}
    with pytest.raises(DeviceSpecError) as e:
        from_neusight_json({**d, "SingleFLOPsVEC": 31334})
    assert "AMD key" in str(e.value) and "NVIDIA L4" in str(e.value)
    amd = from_neusight_json(MI210_JSON)
    assert amd.vendor == "amd" and amd.cores_per_sm == 64
