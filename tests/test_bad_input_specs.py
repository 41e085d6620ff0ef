"""Bad input to device specs, kernel tables, the lifecycle footprint and the collectives loader: a clear
exception of the module's own type (ValueError subclasses) naming the field/parameter and the value, never an
unrelated TypeError/AttributeError/StopIteration and never a silent NaN/0/inf result."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from conftest import USER_SPEC
import yaml

import wattcast
from wattcast.data.catalog import load_spec_file, resolve_device
from wattcast.data.device_spec import DeviceSpec, DeviceSpecError, from_dict
from wattcast.lifecycle import LifecycleAssumptions, footprint, footprint_from_step

A100 = "A100-SXM4-80GB"

_USER_SPEC = USER_SPEC


@pytest.fixture(scope="module")
def a100() -> DeviceSpec:
    return resolve_device(A100)


# ------------------------------------------------------------ 1. every DeviceSpec validates itself
@pytest.mark.parametrize(
    "field,value",
    [
        ("memory_bandwidth_gbps", 0),
        ("memory_bandwidth_gbps", float("nan")),
        ("memory_bandwidth_gbps", "2000"),
        ("memory_bandwidth_gbps", -2000),
        ("peak_fp32_tflops", 0),
        ("l2_cache_mb", -40),
        ("boost_clock_mhz", -1410),
        ("tdp_w", float("inf")),
        ("num_sms", None),
        ("peak_fp16_tflops", 1.0),  # below FP32: inconsistent
        ("idle_power_w", 10_000),  # above TDP
    ],
)
def test_replace_with_a_bad_value_is_refused_naming_field_and_value(a100, field, value):
    with pytest.raises(DeviceSpecError, match=field) as e:
        dataclasses.replace(a100, **{field: value})
    if value is not None and field not in ("peak_fp16_tflops", "idle_power_w"):
        assert repr(value) in str(e.value) or str(value) in str(e.value)


def test_direct_construction_is_validated():
    kw = dict(_USER_SPEC)
    assert DeviceSpec(**kw).name == "Acme-X1"  # a valid spec builds (ints are fine)
    with pytest.raises(DeviceSpecError, match="memory_bandwidth_gbps.*-1"):
        DeviceSpec(**{**kw, "memory_bandwidth_gbps": -1})
    with pytest.raises(DeviceSpecError, match="peak_fp32_tflops"):
        DeviceSpec(**{**kw, "peak_fp32_tflops": 0.0})
    with pytest.raises(DeviceSpecError, match="'name'"):
        DeviceSpec(**{**kw, "name": ""})


def test_valid_constructions_keep_working(a100):
    kw = dict(_USER_SPEC)
    s = DeviceSpec(**{**kw, "memory_bandwidth_gbps": np.float64(2500.0), "l2_cache_mb": np.float32(64.0),
                      "num_sms": np.int64(100), "aliases": ["acme"]})
    assert s.memory_bandwidth_gbps == 2500 and s.num_sms == 100
    assert s.aliases == ("acme",)  # a list becomes a tuple
    faster = dataclasses.replace(a100, memory_bandwidth_gbps=3000)
    assert faster.memory_bandwidth_gbps == 3000
    # a spec without a citation can be built in code; only spec files must cite every figure
    assert DeviceSpec(**{**kw, "source": ""}).source == ""
    with pytest.raises(DeviceSpecError, match="source"):
        from_dict({**kw, "source": ""})


def test_zero_fp32_peak_never_reaches_the_predictor(a100):
    """Was StopIteration inside peak_matrix_tflops; now refused when the spec is built."""
    with pytest.raises(DeviceSpecError, match="peak_fp32_tflops"):
        wattcast.predict("gpt2", dataclasses.replace(a100, peak_fp32_tflops=0), batch=1, seq=128)


def test_text_bandwidth_never_reaches_footprint(a100):
    """Was a TypeError (can't multiply sequence by float) inside wattcast.footprint."""
    with pytest.raises(DeviceSpecError, match="memory_bandwidth_gbps.*'2000'"):
        wattcast.footprint(dataclasses.replace(a100, memory_bandwidth_gbps="2000"), 8, 100)


# ------------------------------------------------------------ 2. spec files: text, aliases, sources
@pytest.mark.parametrize(
    "change,field,shown",
    [
        ({"memory_type": 5}, "memory_type", "5"),
        ({"aliases": "abc"}, "aliases", "'abc'"),
        ({"sources": ["a"]}, "sources", "['a']"),
        ({"sources": {"tdp_w": 5}}, "sources", "'tdp_w': 5"),
        ({"name": 12345}, "name", "12345"),
        ({"arch": ["x"]}, "arch", "['x']"),
        ({"interconnect": 4}, "interconnect", "4"),
        ({"vendor": 1}, "vendor", "1"),
        ({"source": 3}, "source", "3"),
        ({"aliases": ["ok", 7]}, "aliases", "7"),
    ],
)
def test_spec_file_field_types_are_checked(tmp_path, change, field, shown):
    p = tmp_path / "gpu.yaml"
    p.write_text(yaml.safe_dump({**_USER_SPEC, **change}), encoding="utf-8")
    with pytest.raises(DeviceSpecError, match=f"'{field}'") as e:
        load_spec_file(p)
    assert str(p) in str(e.value)
    assert shown in str(e.value).split(f"'{field}'", 1)[1]


def test_spec_file_lists_and_mappings_still_load(tmp_path):
    p = tmp_path / "gpu.yaml"
    d = {**_USER_SPEC, "aliases": ["acme-x1-sxm"], "sources": {"tdp_w": "board spec"}, "memory_type": "HBM3"}
    p.write_text(yaml.safe_dump(d), encoding="utf-8")
    s = load_spec_file(p)
    assert s.aliases == ("acme-x1-sxm",) and s.source_of("tdp_w") == "board spec" and s.memory_type == "HBM3"
    d_none = {**_USER_SPEC, "aliases": None, "sources": None}
    assert from_dict(d_none).aliases == () and dict(from_dict(d_none).sources) == {}


def test_spec_without_tdp_predicts_kernels_and_says_tdp_is_needed_for_steps(tmp_path):
    """tdp_w stays optional in the schema: kernel latency needs no TDP; a step prediction (which reports the
    step's power and energy) refuses with a DeviceSpecError asking for tdp_w, not a TypeError or a NaN."""
    d = {k: v for k, v in _USER_SPEC.items() if k != "tdp_w"}
    p = tmp_path / "no-tdp.yaml"
    p.write_text(yaml.safe_dump(d), encoding="utf-8")
    spec = load_spec_file(p)
    assert spec.tdp_w is None
    frame = pd.DataFrame({"OPName": ["linear"], "B": [1], "M": [256], "N": [256], "K": [256]})
    out = wattcast.predict_kernels(frame, spec)
    assert np.isfinite(out["pred_latency_ms"]).all() and (out["pred_latency_ms"] > 0).all()
    with pytest.raises(DeviceSpecError, match="tdp_w"):
        wattcast.predict("gpt2", spec, batch=1, seq=128)


# ------------------------------------------------------------ 3. predict_kernels needs a DataFrame
@pytest.mark.parametrize("frame", [None, [], {"OPName": ["linear"]}, pd.Series({"OPName": "linear", "B": 1})],
                         ids=["None", "list", "dict", "Series"])
def test_predict_kernels_needs_a_dataframe(frame):
    with pytest.raises(ValueError, match=r"DataFrame.*'OPName' \(or 'op'\)") as e:
        wattcast.predict_kernels(frame, A100)
    assert type(frame).__name__ in str(e.value)


@pytest.mark.parametrize("columns,dup", [(["OPName", "B", "M", "N", "K", "K"], "'K'"),
                                         (["OPName", "OPName", "B", "M", "N", "K"], "'OPName'")])
def test_predict_kernels_names_duplicated_columns(columns, dup):
    row = ["linear" if c == "OPName" else 64 for c in columns]
    frame = pd.DataFrame([row], columns=columns)
    with pytest.raises(ValueError, match=f"duplicate column.*{dup}"):
        wattcast.predict_kernels(frame, A100)
    from wattcast.models.kernel_predictor import normalise_kernel_frame

    with pytest.raises(ValueError, match=f"duplicate column.*{dup}"):
        normalise_kernel_frame(frame)


def test_predict_kernels_still_reads_a_valid_frame():
    frame = pd.DataFrame({"OPName": ["linear"], "B": [1], "M": [64], "N": [64], "K": [64], "note": ["x"]})
    out = wattcast.predict_kernels(frame, A100)
    assert out["error"].iloc[0] == "" and out["pred_latency_ms"].iloc[0] > 0


# ------------------------------------------------------------ 4. footprint parameters
@pytest.mark.parametrize("name,value", [
    ("pue", "1.2"), ("lifetime_years", "5"), ("grid_kgco2e_per_kwh", "0.4"), ("node_overhead_share", "0.3"),
    ("electricity_usd_per_kwh", "0.1"), ("cloud_usd_per_gpu_hour", "2"), ("flops", "1e20"),
    ("pue", float("nan")), ("lifetime_years", 0), ("node_overhead_share", -0.1), ("pue", 0.8),
])
def test_footprint_numeric_parameters_are_checked_alike(name, value):
    with pytest.raises(ValueError, match=name) as e:
        footprint(A100, 8, 100.0, avg_power_w=400.0, apply_goodput=False, **{name: value})
    assert repr(value) in str(e.value)


def test_footprint_string_pue_through_the_api():
    with pytest.raises(ValueError, match=r"pue \(--pue\) must be a finite number, got '1\.2'"):
        wattcast.footprint(A100, 8, 100, pue="1.2")


@pytest.mark.parametrize("region", ["", "   "])
def test_footprint_empty_region_is_an_error(region):
    with pytest.raises(ValueError, match="empty region"):
        wattcast.footprint(A100, 8, 100, avg_power_w=400.0, region=region)


def test_footprint_region_and_flags_must_have_their_type():
    with pytest.raises(ValueError, match="region must be a string.*5"):
        footprint(A100, 8, 100.0, avg_power_w=400.0, region=5)
    with pytest.raises(ValueError, match="market_based must be True or False, got 'yes'"):
        footprint(A100, 8, 100.0, avg_power_w=400.0, market_based="yes")
    with pytest.raises(ValueError, match="apply_goodput must be True or False, got 'no'"):
        footprint(A100, 8, 100.0, avg_power_w=400.0, apply_goodput="no")
    with pytest.raises(ValueError, match="assumptions must be a LifecycleAssumptions"):
        footprint(A100, 8, 100.0, avg_power_w=400.0, assumptions={"pue": 1.1})


@pytest.mark.parametrize("kw,name", [({"pue": "1.2"}, "pue"), ({"region": ""}, "region"),
                                     ({"market_based": "no"}, "market_based"), ({"mtbf_gpu_hours": "5"}, "mtbf_gpu_hours")])
def test_assumptions_check_types(kw, name):
    with pytest.raises(ValueError, match=name):
        LifecycleAssumptions(**kw)


def test_footprint_overflow_names_the_users_parameters():
    with pytest.raises(ValueError, match=r"hours=1e\+308.*gpus=8") as e:
        wattcast.footprint(A100, 8, 1e308)
    assert "it_energy_kwh" not in str(e.value)
    with pytest.raises(ValueError, match="hours=.*gpus=.*W per GPU") as e:
        footprint(A100, 8, 100.0, power_model=lambda u: 1.5e308, utilisation=0.5)
    assert "it_energy_kwh" not in str(e.value)
    with pytest.raises(ValueError, match="hours=1e\\+200.*too large") as e:  # carbon-delay product overflows
        footprint(A100, 8, 1e200, avg_power_w=400.0, apply_goodput=False)
    with pytest.raises(ValueError, match="gpus"):
        footprint(A100, 10**400, 1.0, avg_power_w=400.0)
    with pytest.raises(ValueError, match="power_model\\(utilisation\\) must return a number of watts, got None"):
        footprint(A100, 8, 100.0, power_model=lambda u: None, utilisation=0.5)


def test_footprint_from_step_overflow_names_the_users_parameters():
    kw = dict(step_time_ms=100.0, gpu_power_w=400.0, tokens_per_step=1e3)
    with pytest.raises(ValueError, match="tokens=1e\\+300.*tokens_per_step"):
        footprint_from_step(A100, 8, **{**kw, "tokens": 1e300, "tokens_per_step": 1e-300})
    with pytest.raises(ValueError, match="step_time_ms"):
        footprint_from_step(A100, 8, **{**kw, "tokens": 1e300, "tokens_per_step": 1.0, "step_time_ms": 1e300})


def test_footprint_valid_inputs_unchanged():
    fp = footprint(A100, 8, 100.0, avg_power_w=400.0, apply_goodput=False, pue=np.float64(1.2), region="FRA",
                   market_based=False, flops=0)
    assert math.isfinite(fp.total_tco2e) and fp.pue == 1.2 and fp.grid_region
    assert footprint(A100, np.int64(8), 100, avg_power_w=400).gpus == 8


# ------------------------------------------------------------ 5. collectives data files
def test_empty_collectives_file_names_the_file(tmp_path):
    from wattcast.data.collective_datasets import CollectiveDataError, load_collectives

    d = tmp_path / "collectives"
    d.mkdir()
    (d / "nccl_h100_per_size.csv").write_text("")
    with pytest.raises(CollectiveDataError, match=r"nccl_h100_per_size\.csv: empty file"):
        load_collectives(tmp_path, sources=("h100",))
    (d / "nccl_h100_per_size.csv").write_text("cluster,mode,run,file,test,nodes,gpus_per_node,world_size,size_B,"
                                              "oop_time_us,oop_algbw_GBs,oop_busbw_GBs,ip_time_us\n")
    with pytest.raises(CollectiveDataError, match=r"nccl_h100_per_size\.csv: header only"):
        load_collectives(tmp_path, sources=("h100",))


def test_train_collectives_on_an_empty_file_names_it(tmp_path):
    from wattcast.data.collective_datasets import CollectiveDataError
    from wattcast.training.collectives import run_train_collectives

    d = tmp_path / "collectives"
    d.mkdir()
    (d / "nccl_h100_per_size.csv").write_text("")
    with pytest.raises(CollectiveDataError, match=r"nccl_h100_per_size\.csv"):
        run_train_collectives(data=tmp_path, out_dir=tmp_path / "o", use_mlflow=False, log=lambda *a: None)


@pytest.mark.parametrize("kw,msg", [
    (dict(tdp_w=0.7), "'tdp_w' is 0.7, under 5: it looks like kW; give it in watts"),
    (dict(memory_gb=80e9), "'memory_gb' is 8e\\+10, over 5000: it looks like bytes or MB; give it in GB"),
    (dict(memory_bandwidth_gbps=3.35e12), "looks like B/s or MB/s; give it in GB/s"),
    (dict(memory_bandwidth_gbps=3.35), "looks like TB/s; give it in GB/s"),
    (dict(peak_bf16_tflops=989e12), "'peak_bf16_tflops' is .*looks like FLOP/s or GFLOP/s"),
    (dict(boost_clock_mhz=1.98, base_clock_mhz=1.6), "'boost_clock_mhz' is 1.98, under 50: it looks like GHz"),
    (dict(peak_fp8_tflops=900.0), "'peak_fp8_tflops' \\(900.0\\) is below peak_fp16_tflops"),
    (dict(base_clock_mhz=2500.0), "'base_clock_mhz' \\(2500.0\\) exceeds boost_clock_mhz"),
])
def test_spec_units_and_inconsistent_figures_are_named(kw, msg):
    import dataclasses

    from wattcast.data.catalog import resolve_device
    from wattcast.data.device_spec import DeviceSpecError

    with pytest.raises(DeviceSpecError, match=msg):
        dataclasses.replace(resolve_device("H100-SXM5-80GB"), **kw)
