"""Device spec checks against physics and the catalog: tensor peaks above what their architecture does densely per SM
per clock (a datasheet's sparse column), memory bandwidth per FLOP outside the catalog's range (Gb/s for GB/s),
``cores_per_sm`` on AMD, idle power against TDP, and the notes a prediction carries for figures a spec leaves out
(no ``idle_power_w``: 0.15 x TDP; no ``tdp_w``: the kernel surrogate's TDP input missing)."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
import yaml

import wattcast
from conftest import REPO, flat, run_cli
from wattcast.data.catalog import list_devices, load_spec_file, resolve_device
from wattcast.data.device_spec import DeviceSpecError, from_dict

DEVICES = REPO / "data" / "devices"
H100 = yaml.safe_load((DEVICES / "H100-SXM5-80GB.yaml").read_text())
MI300X = yaml.safe_load((DEVICES / "MI300X.yaml").read_text())
TENSOR = {"peak_fp16_tflops": 1.0, "peak_bf16_tflops": 1.0, "peak_tf32_tflops": 0.5, "peak_fp8_tflops": 2.0}
SPARSE = "this looks like the sparse (2:4 structured sparsity) figure: use the dense one"


def _doubled(d: dict, **change) -> dict:
    """``d`` with every tensor peak it gives doubled (the "with sparsity" column of its datasheet)."""
    return {**d, **{f: 2 * d[f] for f in TENSOR if d.get(f)}, "aliases": [], **change}


def _h300(**change) -> dict:
    """The audit's invented H300 (160 SMs at 2,200 MHz, 1,400 TFLOP/s BF16, 6,000 GB/s, 900 W)."""
    d = dict(name="H300", vendor="nvidia", arch="Imaginary", peak_fp32_tflops=90.0, peak_tf32_tflops=700.0,
             peak_fp16_tflops=1400.0, peak_bf16_tflops=1400.0, peak_fp8_tflops=2800.0, memory_gb=192,
             memory_bandwidth_gbps=6000, num_sms=160, cores_per_sm=128, boost_clock_mhz=2200, l2_cache_mb=80,
             tdp_w=900, idle_power_w=90, source="invented test device")
    return {k: v for k, v in {**d, **change}.items() if v is not None}


# ------------------------------------------------------------------ the table agrees with the catalog
def test_every_catalog_device_validates_and_sits_at_its_architectures_dense_rate():
    from wattcast.data.device_spec import DENSE_RATE_MARGIN, architecture_of, spec_notes

    specs = list_devices()
    assert len(specs) == len(list(DEVICES.glob("*.yaml")))
    for s in specs:
        load_spec_file(DEVICES / f"{s.name}.yaml")  # validates (citations too)
        # the H200's base clock is its compute twin's (the H100 SXM5's), said: test_base_clock_twin.py
        assert [n for n in spec_notes(s) if "base_clock_mhz" not in n] == [], s.name
        arch = architecture_of(s.arch)
        assert arch is not None, s.name  # every catalog device is keyed
        for f, k in TENSOR.items():
            v = getattr(s, f)
            if not v or (s.name == "MI100" and f == "peak_bf16_tflops"):  # CDNA1 runs BF16 at half the FP16 rate
                continue
            per = v * 1e12 / (s.num_sms * s.boost_clock_mhz * 1e6) / k
            assert 0.9 <= per / arch[1] <= 1.01 < DENSE_RATE_MARGIN, (s.name, f, per, arch)


# ------------------------------------------------------------------ 1. sparse tensor peaks
@pytest.mark.parametrize("base, twin", [(H100, "H100-SXM5-80GB"), (MI300X, "MI300X")])
def test_every_tensor_peak_from_the_sparse_column_is_refused_naming_the_catalog_twin(base, twin):
    d = _doubled(base, name="sparse-sheet")
    with pytest.raises(DeviceSpecError) as e:
        from_dict(d)
    msg = str(e.value)
    assert "field 'peak_" in msg and SPARSE in msg and f"exactly 2x {twin}'s dense figure" in msg, msg
    with wattcast.allow_exotic():  # --force: used as given
        assert from_dict(d).peak_bf16_tflops == 2 * base["peak_bf16_tflops"]


@pytest.mark.parametrize("field", list(TENSOR))
def test_one_sparse_peak_on_a_known_architecture_is_refused(field):
    with pytest.raises(DeviceSpecError, match=rf"field '{field}' .*Hopper GH100.*{SPARSE.replace('(', '.').replace(')', '.')}"):
        from_dict({**H100, "aliases": [], "name": "x", **({field: 2 * H100[field]} if field != "peak_tf32_tflops"
                                                          else {field: H100["peak_bf16_tflops"]})})


def test_unknown_architecture_is_warned_against_the_fastest_known_one():
    from wattcast.data.device_spec import spec_notes

    # H100's peaks on 40 SMs: 12,500 FLOP per SM per clock, over 1.5 x Blackwell's 8,192
    spec = from_dict({**H100, "aliases": [], "name": "few-sms", "arch": "Imaginary", "num_sms": 40,
                      "peak_fp32_tflops": 20.0})
    notes = spec_notes(spec)
    assert any("peak_fp16_tflops" in n and "most any known architecture" in n and SPARSE in n for n in notes), notes
    res = wattcast.predict("gpt2", spec, batch=1, seq=128)
    assert any("most any known architecture" in w for w in res.meta["warnings"])
    # every peak 2x the catalog H100's on its SMs, clock and bandwidth, but no architecture to key on: said
    twin = from_dict(_doubled(H100, name="twin", arch="Imaginary"))
    assert any("exactly 2x H100-SXM5-80GB's dense figure" in n for n in spec_notes(twin)), spec_notes(twin)
    assert not any(SPARSE in n for n in spec_notes(from_dict(_h300())))


# ------------------------------------------------------------------ 2. bandwidth in Gb/s
def test_bandwidth_ratio_range_is_the_catalogs():
    from wattcast.data.device_spec import (_TENSOR_OVER_FP32_MIN, BYTES_PER_KFLOP_16BIT, BYTES_PER_KFLOP_FP32)

    r16, r32 = [], []
    for s in list_devices():
        half = max(s.peak_fp16_tflops or 0, s.peak_bf16_tflops or 0)
        r32.append(s.memory_bandwidth_gbps / s.peak_fp32_tflops)
        if half >= _TENSOR_OVER_FP32_MIN * s.peak_fp32_tflops:
            r16.append(s.memory_bandwidth_gbps / half)
    assert (min(r16), max(r16)) == pytest.approx(BYTES_PER_KFLOP_16BIT, abs=0.01)
    assert (min(r32), max(r32)) == pytest.approx(BYTES_PER_KFLOP_FP32, abs=0.1)


def test_bandwidth_in_gbit_per_s_is_refused():
    with pytest.raises(DeviceSpecError, match=r"field 'memory_bandwidth_gbps' \(48000\).*Gb/s\? divide by 8"):
        from_dict(_h300(memory_bandwidth_gbps=48000))
    assert from_dict(_h300(memory_bandwidth_gbps=20000, peak_fp16_tflops=2500, peak_bf16_tflops=2500,
                           peak_tf32_tflops=1250, peak_fp8_tflops=5000)).memory_bandwidth_gbps == 20000  # HBM4-class
    with wattcast.allow_exotic():
        assert from_dict(_h300(memory_bandwidth_gbps=48000)).memory_bandwidth_gbps == 48000


def test_every_catalog_device_with_its_bandwidth_in_gbit_per_s_is_refused_or_noted_but_the_p4():
    from wattcast.data.device_spec import spec_notes

    caught, noted = [], []
    for s in list_devices():
        d = {**s.to_dict(), "name": s.name + "-gbit", "aliases": [], "memory_bandwidth_gbps": 8 * s.memory_bandwidth_gbps}
        try:
            spec = from_dict(d)
        except DeviceSpecError as e:
            assert "Gb/s? divide by 8" in str(e), str(e)
            caught.append(s.name)
            continue
        if any("Gb/s (divide by 8" in n for n in spec_notes(spec)):
            noted.append(s.name)  # FP32 ratio inside the catalog's (as a cut-down H20 would be): a note, not refused
    # the Tesla P4 (no tensor cores, 33.7 bytes per FP32 kFLOP): 270 in Gb/s, inside 3x the FP32 range's 104.6
    assert sorted(set(s.name for s in list_devices()) - set(caught) - set(noted)) == ["Tesla-P4"]
    assert len(caught) > len(noted)


def test_a_cut_down_tensor_part_like_the_h20_loads_with_a_note():
    from wattcast.data.device_spec import spec_notes

    # NVIDIA H20 (datasheet: 4.0 TB/s HBM3, 148 TFLOP/s dense BF16, 44 TFLOP/s FP32): 27 bytes per 16-bit kFLOP, 3x the
    # catalog's most, but 91 per FP32 kFLOP, inside it (refused until the final review of stop 46)
    h20 = from_dict(_h300(name="H20", memory_bandwidth_gbps=4000, peak_fp32_tflops=44, peak_tf32_tflops=74,
                          peak_fp16_tflops=148, peak_bf16_tflops=148, peak_fp8_tflops=296))
    assert any("H20" in n and "cut-down tensor compute" in n for n in spec_notes(h20))


# ------------------------------------------------------------------ 3. cores_per_sm on AMD
@pytest.mark.parametrize("cores", [1, 4, 16, 128, 1000])
def test_amd_cores_per_cu_other_than_64_are_refused(cores):
    d = {**MI300X, "aliases": [], "name": "MI300X-copy", "cores_per_sm": cores}
    with pytest.raises(DeviceSpecError, match=rf"field 'cores_per_sm' \({cores}\) must be 64 on AMD"):
        from_dict(d)
    assert from_dict({**d, "cores_per_sm": 64}).cores_per_sm == 64


# ------------------------------------------------------------------ 4. idle power
@pytest.mark.parametrize("idle", [1, 2, 850])
def test_idle_power_far_from_the_measured_share_of_tdp_is_refused(idle):
    with pytest.raises(DeviceSpecError, match=rf"field 'idle_power_w' \({idle}\) is .* x tdp_w \(900\)"):
        from_dict(_h300(idle_power_w=idle))
    with wattcast.allow_exotic():
        assert from_dict(_h300(idle_power_w=idle)).idle_power_w == idle


def test_idle_power_inside_the_range_loads():
    from wattcast.data.device_spec import IDLE_OVER_TDP

    lo, hi = IDLE_OVER_TDP
    assert lo < 0.13 and hi > 0.27  # the measured 0.13-0.27 x TDP (featurize.power_features), with a margin
    for idle in (45, 90, 243, 500):
        assert from_dict(_h300(idle_power_w=idle)).idle_power_w == idle


def test_the_idle_power_default_is_said_in_the_prediction():
    spec = from_dict(_h300(idle_power_w=None))
    res = wattcast.predict("gpt2", spec, batch=1, seq=128)
    assert any("no idle_power_w; 0.15 x tdp_w = 135 W is assumed" in w for w in res.meta["warnings"]), res.meta["warnings"]
    given = wattcast.predict("gpt2", from_dict(_h300()), batch=1, seq=128)
    assert not any("idle_power_w" in w for w in given.meta["warnings"])
    h100 = wattcast.predict("gpt2", "H100-SXM5-80GB", batch=1, seq=128)  # catalog: documented, not warned
    assert not any("idle_power_w" in w for w in h100.meta.get("warnings") or [])


# ------------------------------------------------------------------ 5. no tdp_w
def test_a_missing_tdp_is_said_with_kernel_predictions(tmp_path):
    frame = pd.DataFrame({"OPName": ["linear"], "dtype": ["bf16"], "B": [1], "M": [4096], "N": [4096], "K": [4096]})
    out = wattcast.predict_kernels(frame, from_dict(_h300(tdp_w=None, idle_power_w=None)))
    assert any("no tdp_w" in w and "kernel-time surrogate" in w for w in out.attrs["warnings"]), out.attrs
    assert out.attrs["warnings"] == [w for w in out.attrs["warnings"] if "idle_power_w" not in w]
    # a spec that gives every figure is not warned (without base_clock_mhz it is: test_base_clock_twin.py)
    assert wattcast.predict_kernels(frame, from_dict(_h300(base_clock_mhz=1800))).attrs["warnings"] == []
    spec = tmp_path / "notdp.yaml"
    spec.write_text(yaml.safe_dump(_h300(tdp_w=None, idle_power_w=None)))
    frame.to_csv(tmp_path / "k.csv", index=False)
    r = run_cli("kernels", "--input", str(tmp_path / "k.csv"), "--device", str(spec))
    assert r.returncode == 0, r.stderr
    assert "the spec gives no tdp_w" in flat(r.stderr)
    d = run_cli("devices", str(spec))
    assert d.returncode == 0 and "the spec gives no tdp_w" in flat(d.stderr), d.stderr
