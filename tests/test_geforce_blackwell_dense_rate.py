"""The spec checks' dense tensor rate per SM per clock (``data.device_spec``) on two kinds of spec that escaped them:

- an ``arch`` of plain "Blackwell" (no chip code) took data-centre Blackwell's 8,192 dense 16-bit FLOP/SM/clock, so an
  RTX 5090 spec written that way loaded its sparse column; the evidence (GDDR7 memory or an RTX / GeForce name:
  consumer GB20x, 1,024, NVIDIA RTX Blackwell whitepaper Appendix A; HBM or a B200 name: data centre, 8,192, B200
  datasheet) now resolves it, and a spec with none gets a warning;
- a GeForce part runs BF16 and TF32 (FP32 accumulate) at half the FP16-accumulate rate (NVIDIA Ada whitepaper
  Appendix A, RTX 4090: FP16 330.3 with FP16 accumulate / 165.2 with FP32, BF16 165.2, TF32 82.6 dense), so a BF16
  figure at the FP16-accumulate rate (the sparse BF16 column) loaded; it is now refused, the dense one still loads."""

from __future__ import annotations

from pathlib import Path

import pytest

import wattcast
from wattcast.data.catalog import load_spec_file
from wattcast.data.device_spec import (DeviceSpecError, architecture_of, blackwell_segment, from_dict, is_geforce,
                                       spec_notes)
from wattcast.featurize.fp8_recipes import compute_capability

REPO = Path(__file__).resolve().parents[1]
SPARSE = "this looks like the sparse (2:4 structured sparsity) figure"

# NVIDIA RTX Blackwell GPU architecture whitepaper, Appendix A, GeForce RTX 5090: 170 SMs, 2,407 MHz boost; dense FP16
# 419 (FP16 accumulate) / 209.5 (FP32 accumulate), BF16 209.5, TF32 104.8, FP8 419 (FP32 accumulate); 2x sparse
RTX5090 = dict(name="RTX-5090", vendor="nvidia", arch="Blackwell", peak_fp32_tflops=104.8, peak_tf32_tflops=104.8,
               peak_fp16_tflops=209.5, peak_bf16_tflops=209.5, peak_fp8_tflops=419.0, memory_gb=32,
               memory_type="GDDR7", memory_bandwidth_gbps=1792, num_sms=170, cores_per_sm=128, base_clock_mhz=2017,
               boost_clock_mhz=2407, l2_cache_mb=96, tdp_w=575, aliases=[],
               source="NVIDIA RTX Blackwell GPU architecture whitepaper, Appendix A, GeForce RTX 5090 column")
SPARSE_5090 = dict(peak_fp16_tflops=838.0, peak_bf16_tflops=838.0, peak_tf32_tflops=419.0, peak_fp8_tflops=1676.0)


def _spec(d, **change):
    return from_dict({k: v for k, v in {**d, **change}.items() if v is not None})


# ------------------------------------------------------------------ plain "Blackwell"
@pytest.mark.parametrize("evidence", [dict(), dict(memory_type=None, name="GeForce RTX 5090"),
                                      dict(memory_type=None, name="my-card", aliases=["RTX 5090"])])
def test_a_chipless_blackwell_with_consumer_evidence_gets_gb20x_rate(evidence):
    d = {**RTX5090, **evidence}
    assert blackwell_segment(_spec(d)) == "consumer"
    assert architecture_of(_spec(d))[1] == 1024.0
    with pytest.raises(DeviceSpecError, match=r"field 'peak_fp16_tflops' \(838\).*GB20x.*sparse"):
        _spec(d, **SPARSE_5090)  # loaded before: checked against data-centre Blackwell's 8,192


def test_a_chipless_blackwell_on_hbm_is_data_centre():
    # the catalog B200 (its cited dense 2,250 TFLOP/s FP16/BF16 = 148 SMs x 8,192 x 1,856 MHz; HBM3e) with a
    # chip-less arch and a name that says nothing
    from wattcast.data.catalog import resolve_device

    b200 = {**resolve_device("B200").to_dict(), "arch": "Blackwell", "name": "my-accelerator", "aliases": []}
    b200.pop("schema_version", None)
    assert b200["memory_type"].lower().startswith("hbm")
    s = _spec(b200)
    assert blackwell_segment(s) == "datacentre" and architecture_of(s)[1] == 8192.0
    assert spec_notes(s) == [] or not any("names no chip" in n for n in spec_notes(s))
    assert compute_capability(s) == (10, 0)


def test_a_chipless_blackwell_without_evidence_loads_with_a_warning():
    d = {**RTX5090, "memory_type": None, "name": "mystery-blackwell", **SPARSE_5090}
    s = _spec(d)  # as data-centre Blackwell: loads
    notes = [n for n in spec_notes(s) if "names no chip" in n]
    assert len(notes) == 1 and "GB20x" in notes[0] and SPARSE in notes[0], spec_notes(s)
    dense = _spec({**RTX5090, "memory_type": None, "name": "mystery-blackwell"})
    assert not any("names no chip" in n for n in spec_notes(dense))  # dense figures fit either: no warning


def test_gddr7_makes_a_chipless_blackwell_a_consumer_compute_capability():
    assert compute_capability(_spec({**RTX5090, "name": "card-x"})) == (12, 0)  # GDDR7, no RTX in the name


# ------------------------------------------------------------------ GeForce BF16 / TF32 at half rate
# NVIDIA Ada GPU architecture whitepaper, Appendix A, GeForce RTX 4090 (128 SMs, 2,520 MHz)
def _rtx4090(**change):
    d = load_spec_file(REPO / "examples" / "my_gpu.yaml").to_dict()
    d.pop("schema_version", None)
    return {**d, **change}


def test_the_example_rtx4090_spec_is_geforce_and_types_the_fp32_accumulate_dense_figures():
    s = from_dict(_rtx4090())
    assert is_geforce(s) and s.peak_bf16_tflops == 165.2 and s.peak_tf32_tflops == 82.6 and s.peak_fp16_tflops == 165.2
    assert not any(SPARSE in n for n in spec_notes(s))


@pytest.mark.parametrize("field, v", [("peak_bf16_tflops", 330.3), ("peak_tf32_tflops", 165.2)])
def test_a_geforce_bf16_or_tf32_at_the_fp16_accumulate_rate_is_refused(field, v):
    with pytest.raises(DeviceSpecError, match=rf"field '{field}' \({v:g}\).*GeForce part.*{SPARSE[:20]}"):
        from_dict(_rtx4090(**{field: v}))
    with wattcast.allow_exotic():
        assert getattr(from_dict(_rtx4090(**{field: v})), field) == v


def test_the_fp16_accumulate_fp16_figure_loads_under_force_and_workstation_ada_keeps_the_full_rate():
    # a real dense figure, but not the rate PyTorch's FP32-accumulate FP16 GEMMs get: refused since stop 57
    # (tests/test_geforce_fp16_accumulate.py), loaded under --force
    with pytest.raises(DeviceSpecError, match="FP16-accumulate figure"):
        from_dict(_rtx4090(peak_fp16_tflops=330.3))
    with wattcast.allow_exotic():
        assert from_dict(_rtx4090(peak_fp16_tflops=330.3)).peak_fp16_tflops == 330.3
    # RTX 6000 Ada (a workstation board, 142 SMs at 2,505 MHz): BF16 at the full rate (NVIDIA RTX 6000 Ada datasheet:
    # 364.2 dense FP16/BF16 with FP32 accumulate)
    ws = _rtx4090(name="RTX 6000 Ada", aliases=[], num_sms=142, boost_clock_mhz=2505, peak_bf16_tflops=364.2,
                  peak_fp16_tflops=364.2, peak_tf32_tflops=182.1, peak_fp32_tflops=91.1)
    assert not is_geforce(from_dict(ws)) and from_dict(ws).peak_bf16_tflops == 364.2


def test_gb20x_spelt_with_an_x_is_consumer_blackwell_not_gb10():
    assert compute_capability(_spec({**RTX5090, "arch": "Blackwell (GB20x)"})) == (12, 0)  # was (12, 1): GB10's
