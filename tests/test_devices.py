"""The shipped device catalog, device resolution and NeuSight device JSON import."""

from __future__ import annotations

import dataclasses
import json
from importlib.resources import files
from pathlib import Path

import pytest
import yaml

from conftest import USER_SPEC

from wattcast.data.catalog import (
    find_device,
    list_devices,
    load_catalog,
    load_spec_file,
    resolve_device,
    to_neusight_json,
)
from wattcast.data.device_spec import DeviceSpec, DeviceSpecError, from_dict, normalise_name
from wattcast.data.neusight_device import from_neusight_json, is_neusight_json

REQUIRED_NAMES = [
    "Tesla-P4", "Tesla-P100-PCIe-16GB", "Tesla-T4", "V100-PCIe-32GB", "V100-SXM2-16GB", "V100-SXM2-32GB",
    "A10", "A40", "A100-PCIe-40GB", "A100-PCIe-80GB", "A100-SXM4-40GB", "A100-SXM4-80GB", "L4", "L40S",
    "H100-PCIe-80GB", "H100-SXM5-80GB", "H200-SXM-141GB", "B200", "GB200", "B300", "GB300", "MI100", "MI210", "MI250", "MI250X",
    "MI300X", "MI355X", "Quadro-RTX-6000",
]

#: device strings in the NeuSight data -> catalog name
NEUSIGHT_NAMES = {
    "Tesla P4": "Tesla-P4",
    "Tesla P100-PCIE-16GB": "Tesla-P100-PCIe-16GB",
    "Tesla T4": "Tesla-T4",
    "Tesla V100-PCIE-32GB": "V100-PCIe-32GB",
    "NVIDIA A100-PCIE-40GB": "A100-PCIe-40GB",
    "NVIDIA A100 80GB PCIe": "A100-PCIe-80GB",
    "NVIDIA A100-SXM4-40GB": "A100-SXM4-40GB",
    "NVIDIA L4": "L4",
    "NVIDIA H100 80GB HBM3": "H100-SXM5-80GB",
    "AMD Instinct MI100": "MI100",
    "AMD Instinct MI210": "MI210",
    "AMD Instinct MI250": "MI250",
}

SHORT_FORMS = {
    "a100": "A100-SXM4-40GB",
    "h100": "H100-SXM5-80GB",
    "v100": "V100-SXM2-16GB",
    "t4": "Tesla-T4",
    "p100": "Tesla-P100-PCIe-16GB",
    "mi300x": "MI300X",
    "b200": "B200",
    "sm_100_B200": "B200",
    "gfx950": "MI355X",
    "a40": "A40",
    "a100-80gb-sxm": "A100-SXM4-80GB",
    "a100-80gb-pcie": "A100-PCIe-80GB",
    "h100-pcie": "H100-PCIe-80GB",
    "h200": "H200-SXM-141GB",
    "NVIDIA_A100-PCIE-40GB": "A100-PCIe-40GB",
    "Tesla_P4": "Tesla-P4",
    "AMD_Instinct_MI210": "MI210",
    "NVIDIA_H100_80GB_HBM3": "H100-SXM5-80GB",
}

def _data_root() -> Path:
    """The datasets folder as every command finds it ($WATTCAST_DATA first, then ../shared/datasets)."""
    from wattcast.data.kernel_datasets import DataNotFoundError, resolve_data_root

    try:
        return resolve_data_root()
    except DataNotFoundError:
        return Path("/nonexistent-wattcast-data")


NEUSIGHT_DIR = _data_root() / "neusight" / "devices"
NEUSIGHT_FILES = sorted(NEUSIGHT_DIR.glob("*.json")) if NEUSIGHT_DIR.is_dir() else []

DEVICE_FILES = sorted(
    (p for p in (files("wattcast.data") / "devices").iterdir() if p.name.endswith(".yaml")),
    key=lambda p: p.name,
)

_FIELDS = {f.name for f in dataclasses.fields(DeviceSpec)}


def _neusight_dir() -> Path:
    if not NEUSIGHT_FILES:
        pytest.skip(f"NeuSight device JSONs not found at {NEUSIGHT_DIR}")
    return NEUSIGHT_DIR


# ------------------------------------------------------------------ catalog files
def test_catalog_has_exactly_the_required_devices():
    assert sorted(load_catalog()) == sorted(REQUIRED_NAMES)
    assert len(DEVICE_FILES) == len(REQUIRED_NAMES)
    assert len(list_devices()) == len(REQUIRED_NAMES)


@pytest.mark.parametrize("name,row", [("GB200", "NVIDIA GB200"), ("B300", "NVIDIA B300 (Blackwell Ultra)"),
                                      ("GB300", "NVIDIA GB300 (Blackwell Ultra)")])
def test_blackwell_system_gpus_carry_epochs_figures(name, row, data_root):
    """GB200, B300 and GB300 are typed from the Epoch AI row they cite (dense peaks, memory, bandwidth, TDP)."""
    import pandas as pd

    path = data_root / "specs" / "epoch" / "ml_hardware.csv"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    r = pd.read_csv(path).set_index("Hardware name").loc[row]
    s = load_catalog()[name]
    assert row in s.source
    assert s.peak_bf16_tflops == pytest.approx(r["Tensor-FP16/BF16 performance (FLOP/s)"] / 1e12)
    assert s.peak_fp8_tflops == pytest.approx(r["FP8 performance (FLOP/s)"] / 1e12)
    assert s.peak_tf32_tflops == pytest.approx(r["TF32 (TensorFloat-32) performance (FLOP/s)"] / 1e12)
    assert s.memory_gb == pytest.approx(r["Memory (bytes)"] / 1e9)
    assert s.memory_bandwidth_gbps == pytest.approx(r["Memory bandwidth (byte/s)"] / 1e9)
    assert s.tdp_w == pytest.approx(r["TDP (W)"])
    # every figure NVIDIA does not publish is labelled derived or assumed next to it
    for f in ("boost_clock_mhz", "l2_cache_mb"):
        assert any(w in s.sources[f] for w in ("derived", "assumed", "as B200")), (name, f)


@pytest.mark.parametrize("entry", DEVICE_FILES, ids=lambda p: p.name)
def test_catalog_file_validates(entry):
    raw = yaml.safe_load(entry.read_text(encoding="utf-8"))
    assert isinstance(raw, dict)
    assert raw.get("schema_version") == 1
    spec = from_dict(raw)
    assert entry.name == f"{spec.name}.yaml"
    assert spec.vendor in ("nvidia", "amd")
    # every per-field citation is for a real field and says something
    for f, cite in spec.sources.items():
        assert f in _FIELDS, f"{entry.name}: sources names unknown field {f!r}"
        assert isinstance(cite, str) and len(cite) > 10
    assert len(spec.source) > 10
    # the fields the latency model relies on are all present
    for f in ("cores_per_sm", "tdp_w", "memory_type", "process_node_nm", "arch"):
        assert getattr(spec, f), f"{entry.name}: {f} missing"
    # no numeric field was typed as a string (YAML '1e3' pitfall)
    for f in ("peak_fp32_tflops", "memory_bandwidth_gbps", "l2_cache_mb", "boost_clock_mhz"):
        assert isinstance(raw[f], (int, float)), f


def test_catalog_peaks_are_sane():
    cat = load_catalog()
    for s in cat.values():
        for f in ("peak_tf32_tflops", "peak_bf16_tflops", "peak_fp8_tflops"):
            v = getattr(s, f)
            if v is not None:
                assert s.peak_fp16_tflops is not None, f"{s.name}: {f} without fp16"
        if s.peak_fp8_tflops:
            assert s.peak_fp8_tflops >= s.peak_fp16_tflops
        if s.vendor == "nvidia":
            assert s.peak_fp32_matrix_tflops is None
    # spot checks from the brief
    assert cat["MI100"].peak_fp32_matrix_tflops == 46.1 and cat["MI100"].peak_fp32_tflops == 23.1
    assert cat["MI210"].peak_fp32_matrix_tflops == 45.3 and cat["MI210"].peak_fp32_tflops == 22.6
    assert cat["Tesla-P4"].peak_fp16_tflops is None and not cat["Tesla-P4"].has_native("fp16")
    assert cat["Tesla-P100-PCIe-16GB"].peak_fp16_tflops == 19.05
    assert cat["Tesla-T4"].peak_fp16_tflops == 65 and cat["Tesla-T4"].peak_bf16_tflops is None
    assert cat["V100-PCIe-32GB"].peak_fp16_tflops == 112 and cat["V100-SXM2-16GB"].peak_fp16_tflops == 125
    assert cat["V100-SXM2-32GB"].peak_bf16_tflops is None
    assert cat["H100-SXM5-80GB"].peak_matrix_tflops("bf16") == 989.4
    assert cat["MI100"].peak_matrix_tflops("fp32") == 46.1


def test_aliases_are_unique_across_catalog():
    owner: dict[str, str] = {}
    for s in load_catalog().values():
        for label in (s.name, *s.aliases):
            key = normalise_name(label)
            assert owner.setdefault(key, s.name) == s.name, f"{label!r} names {owner[key]} and {s.name}"


def test_load_catalog_is_cached_but_returns_a_copy():
    a = load_catalog()
    a.pop("A10")
    b = load_catalog()
    assert "A10" in b
    assert b["L4"] is load_catalog()["L4"]


# ------------------------------------------------------------------ resolution
@pytest.mark.parametrize("name", REQUIRED_NAMES)
def test_every_required_name_resolves_case_insensitively(name):
    assert resolve_device(name).name == name
    assert resolve_device(name.lower()).name == name
    assert resolve_device(name.upper()).name == name
    assert resolve_device(f"  {name.replace('-', ' ')} ").name == name


@pytest.mark.parametrize("device,expected", sorted(NEUSIGHT_NAMES.items()))
def test_neusight_device_strings_resolve(device, expected):
    assert resolve_device(device).name == expected
    assert resolve_device(device.replace(" ", "_")).name == expected  # the NeuSight file stems
    assert resolve_device(device.lower()).name == expected


@pytest.mark.parametrize("alias,expected", sorted(SHORT_FORMS.items()))
def test_short_forms_resolve(alias, expected):
    assert resolve_device(alias).name == expected
    assert find_device(alias.upper()).name == expected


def test_resolve_accepts_a_spec_object():
    s = resolve_device("L4")
    assert resolve_device(s) is s


@pytest.mark.parametrize("query,expected", [("a100x", "A100-SXM4-40GB"), ("mi300", "MI300X"), ("l40", "L40S")])
def test_miss_lists_closest_names_and_mentions_paths(query, expected):
    with pytest.raises(DeviceSpecError) as ei:
        resolve_device(query)
    msg = str(ei.value)
    assert query in msg
    assert expected in msg
    assert "path" in msg
    listed = msg.split("Closest catalog devices:")[1].split(".")[0].split(",")
    assert 3 <= len(listed) <= 5


def test_find_device_miss_returns_none():
    assert find_device("Tesla K80") is None


def test_missing_spec_file_path_is_a_clear_error(tmp_path):
    with pytest.raises(DeviceSpecError, match="not found"):
        resolve_device(str(tmp_path / "nope.yaml"))
    with pytest.raises(DeviceSpecError, match="not found"):
        resolve_device(tmp_path / "nope.yaml")


# ------------------------------------------------------------------ user spec files
_USER_SPEC = USER_SPEC


def test_user_yaml_spec_for_unknown_gpu_resolves_from_path(tmp_path):
    p = tmp_path / "acme-x1.yaml"
    p.write_text(yaml.safe_dump(_USER_SPEC), encoding="utf-8")
    for arg in (p, str(p)):
        s = resolve_device(arg)
        assert s.name == "Acme-X1" and s.peak_bf16_tflops == 400.0
        assert s.peak_matrix_tflops("fp16") == 400.0  # falls back to bf16
    assert load_spec_file(p) == resolve_device(str(p))


def test_user_json_spec_resolves_from_path(tmp_path):
    p = tmp_path / "acme.json"
    p.write_text(json.dumps(_USER_SPEC), encoding="utf-8")
    assert resolve_device(str(p)).memory_gb == 96


def test_spec_file_errors_are_clear(tmp_path):
    not_mapping = tmp_path / "list.yaml"
    not_mapping.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(DeviceSpecError, match="mapping"):
        load_spec_file(not_mapping)

    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("name: [unclosed\n", encoding="utf-8")
    with pytest.raises(DeviceSpecError, match="not valid YAML"):
        load_spec_file(bad_yaml)

    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump({**_USER_SPEC, "peak_fp32_tflop": 1}), encoding="utf-8")
    with pytest.raises(DeviceSpecError, match="unknown field.*peak_fp32_tflop") as ei:
        load_spec_file(unknown)
    assert str(unknown) in str(ei.value)

    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(yaml.safe_dump({**_USER_SPEC, "memory_bandwidth_gbps": -1}), encoding="utf-8")
    with pytest.raises(DeviceSpecError, match="memory_bandwidth_gbps"):
        resolve_device(str(invalid))

    with pytest.raises(DeviceSpecError, match="not found"):
        load_spec_file(tmp_path / "absent.yaml")

    txt = tmp_path / "spec.txt"
    txt.write_text("name: x\n", encoding="utf-8")
    with pytest.raises(DeviceSpecError, match=r"\.yaml"):
        load_spec_file(txt)


# ------------------------------------------------------------------ validation names the field
def _base() -> dict:
    return dict(_USER_SPEC)


@pytest.mark.parametrize(
    "change,field",
    [
        ({"memory_bandwidth_gbps": -900}, "memory_bandwidth_gbps"),
        ({"peak_fp32_tflops": 0}, "peak_fp32_tflops"),
        ({"num_sms": "many"}, "num_sms"),
        ({"l2_cache_mb": float("nan")}, "l2_cache_mb"),
        ({"peak_fp32_tflops": None}, "peak_fp32_tflops"),
        ({"memory_gb": None}, "memory_gb"),
        ({"peak_fp16_tflops": 20.0}, "peak_fp16_tflops"),  # below FP32: a non-tensor figure
        ({"peak_fp8_tflops": 300.0, "peak_fp16_tflops": 400.0}, "peak_fp8_tflops"),
        ({"base_clock_mhz": 2500}, "base_clock_mhz"),
        ({"idle_power_w": 600}, "idle_power_w"),
        ({"num_sms": 100.5}, "num_sms"),
        ({"vendor": "acme"}, "vendor"),
        ({"schema_version": 2}, "schema_version"),
        ({"source": "", "sources": {}}, "source"),
        ({"vendor": "nvidia", "cores_per_sm": 64}, "peak_fp32_tflops"),  # 40 > 2*100*64*1.8 GHz = 23
    ],
)
def test_bad_values_raise_naming_the_field(change, field):
    with pytest.raises(DeviceSpecError, match=field):
        from_dict({**_base(), **change})


def test_missing_required_field_is_named():
    d = _base()
    del d["l2_cache_mb"]
    with pytest.raises(DeviceSpecError, match="l2_cache_mb"):
        from_dict(d)


def test_per_field_source_suffices():
    d = {k: v for k, v in _base().items() if k not in ("source", "tdp_w", "peak_bf16_tflops")}
    d["sources"] = {f: "sheet" for f in ("peak_fp32_tflops", "memory_gb", "memory_bandwidth_gbps",
                                          "num_sms", "boost_clock_mhz", "l2_cache_mb")}
    assert from_dict(d).source_of("num_sms") == "sheet"
    d["sources"].pop("num_sms")
    with pytest.raises(DeviceSpecError, match="num_sms"):
        from_dict(d)


# ------------------------------------------------------------------ NeuSight JSON
def test_all_thirteen_neusight_files_are_present():
    _neusight_dir()
    assert len(NEUSIGHT_FILES) == 13


@pytest.mark.parametrize("path", NEUSIGHT_FILES, ids=lambda p: p.name)
def test_neusight_json_imports(path):
    _neusight_dir()
    d = json.loads(path.read_text())
    assert is_neusight_json(d)
    spec = resolve_device(str(path))
    assert spec == load_spec_file(path)
    assert spec.memory_gb == d["Dev_Mem"]
    assert spec.memory_bandwidth_gbps == d["Mem_Bw"]
    assert spec.boost_clock_mhz == d["Freq"]
    assert spec.l2_cache_mb == d["L2Cache"]
    assert spec.source.startswith("NeuSight device JSON")
    if path.stem.endswith("_TP"):
        # a 2-GPU tensor-parallel pair described as one device
        assert spec.name == "NVIDIA H100 80GB HBM3 x2"
        assert spec.num_sms == 2 * d["Num_Sm"]
        assert spec.peak_fp16_tflops == pytest.approx(d["SingleFLOPs"] / 1000)
        assert spec.peak_fp32_tflops == pytest.approx(2 * 66.908, rel=1e-3)
        assert spec.tdp_w == 1400
        return
    assert spec.name == d["Device"]
    assert spec.num_sms == d["Num_Sm"]
    if "SingleFLOPsVEC" in d:
        assert spec.vendor == "amd"
        assert spec.peak_fp32_tflops == pytest.approx(d["SingleFLOPsVEC"] / 1000)
        assert spec.peak_fp32_matrix_tflops == pytest.approx(d["SingleFLOPsMM"] / 1000)
        assert spec.cores_per_sm == 16 * d["Core_Per_SM"]
    else:
        assert spec.vendor == "nvidia"
        assert spec.peak_fp32_tflops == pytest.approx(d["SingleFLOPs"] / 1000)
        assert spec.cores_per_sm == d["Core_Per_SM"]
    # fields NeuSight lacks are filled from the matching catalog entry, with a citation saying so
    cat = resolve_device(d["Device"])
    assert spec.aliases == (cat.name,)
    assert spec.tdp_w == cat.tdp_w and spec.peak_fp16_tflops == cat.peak_fp16_tflops
    assert "catalog entry" in spec.source_of("tdp_w")
    # export round-trips to the same JSON
    assert to_neusight_json(spec) == d


@pytest.mark.parametrize("path", [p for p in NEUSIGHT_FILES if not p.stem.endswith("_TP")], ids=lambda p: p.name)
def test_catalog_agrees_with_neusight_measured_setup(path):
    _neusight_dir()
    d = json.loads(path.read_text())
    cat = resolve_device(d["Device"])
    fp32 = d.get("SingleFLOPsVEC", d.get("SingleFLOPs")) / 1000
    assert cat.num_sms == d["Num_Sm"]
    assert cat.boost_clock_mhz == d["Freq"]
    assert cat.peak_fp32_tflops == pytest.approx(fp32)
    assert cat.memory_bandwidth_gbps == d["Mem_Bw"]
    assert cat.l2_cache_mb == d["L2Cache"]
    if "SingleFLOPsMM" in d:
        assert cat.peak_fp32_matrix_tflops == pytest.approx(d["SingleFLOPsMM"] / 1000)


def test_neusight_json_for_gpu_not_in_catalog_works_alone():
    d = {"Device": "NVIDIA GeForce RTX 4090", "Dev_Mem": 24, "Mem_Bw": 1008, "Num_Sm": 128,
         "Core_Per_SM": 128, "Freq": 2520, "SingleFLOPs": 82580, "L2Cache": 72}
    s = from_neusight_json(d)
    assert s.name == "NVIDIA GeForce RTX 4090" and s.vendor == "nvidia"
    assert s.peak_fp32_tflops == pytest.approx(82.58)
    assert s.peak_fp16_tflops is None and s.tdp_w is None and s.aliases == ()
    assert s.peak_matrix_tflops("fp16") == pytest.approx(82.58)
    assert to_neusight_json(s) == d


def test_neusight_amd_gpu_not_in_catalog():
    d = {"Device": "AMD Instinct MI308X", "Dev_Mem": 192, "Mem_Bw": 5300, "Num_Sm": 80,
         "Core_Per_SM": 4, "Freq": 2100, "SingleFLOPsMM": 43000, "SingleFLOPsVEC": 43000, "L2Cache": 8}
    s = from_neusight_json(d)
    assert s.vendor == "amd" and s.cores_per_sm == 64 and s.peak_fp32_matrix_tflops == 43.0
    assert to_neusight_json(s) == d


def test_neusight_catalog_fill_can_be_switched_off():
    d = {"Device": "NVIDIA L4", "Dev_Mem": 24, "Mem_Bw": 300, "Num_Sm": 60, "Core_Per_SM": 128,
         "Freq": 2040, "SingleFLOPs": 31334, "L2Cache": 48}
    assert from_neusight_json(d).peak_fp8_tflops == 242.5
    assert from_neusight_json(d, use_catalog=False).peak_fp8_tflops is None


@pytest.mark.parametrize("key", ["Device", "Dev_Mem", "Mem_Bw", "Num_Sm", "Freq", "L2Cache", "SingleFLOPs"])
def test_neusight_missing_key_is_named(key):
    d = {"Device": "Some GPU", "Dev_Mem": 24, "Mem_Bw": 300, "Num_Sm": 60, "Core_Per_SM": 128,
         "Freq": 2040, "SingleFLOPs": 31334, "L2Cache": 48}
    del d[key]
    with pytest.raises(DeviceSpecError, match=f"'{key}'"):
        from_neusight_json(d)


def test_neusight_bad_values_name_field_and_key(tmp_path):
    d = {"Device": "Some GPU", "Dev_Mem": 24, "Mem_Bw": -300, "Num_Sm": 60, "Core_Per_SM": 128,
         "Freq": 2040, "SingleFLOPs": 31334, "L2Cache": 48}
    with pytest.raises(DeviceSpecError, match="memory_bandwidth_gbps.*Mem_Bw"):
        from_neusight_json(d)
    with pytest.raises(DeviceSpecError, match="Freq"):
        from_neusight_json({**d, "Mem_Bw": 300, "Freq": "fast"})
    # an FP32 figure the SMs cannot reach, for a GPU the catalog cannot explain
    with pytest.raises(DeviceSpecError, match="peak_fp32_tflops"):
        from_neusight_json({**d, "Mem_Bw": 300, "SingleFLOPs": 900000})
    p = tmp_path / "gpu.json"
    p.write_text(json.dumps({**d, "Mem_Bw": 0}))
    with pytest.raises(DeviceSpecError, match=r"gpu\.json.*memory_bandwidth_gbps"):
        resolve_device(str(p))


def test_catalog_exports_to_neusight_format():
    for s in list_devices():
        out = to_neusight_json(s)
        assert is_neusight_json(out)
        back = from_neusight_json(out, use_catalog=False)
        assert back.num_sms == s.num_sms and back.peak_fp32_tflops == pytest.approx(s.peak_fp32_tflops)
        assert back.cores_per_sm == s.cores_per_sm
        if s.vendor == "amd":
            assert out["Core_Per_SM"] == 4 and "SingleFLOPsMM" in out
