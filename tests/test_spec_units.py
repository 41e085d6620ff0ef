"""Device spec figures 1,000x off that used to load (found by fuzzing the spec files): memory bandwidth in TB/s, an L2
in GB, a process node in micrometres or picometres, a launch price in thousands of USD or in cents; a YAML number
written 3.43e3 (text to PyYAML) says how to write it; every shipped spec still loads."""

from __future__ import annotations

import pytest
import yaml

from conftest import REPO, flat
from wattcast.data.catalog import load_spec_file
from wattcast.data.checks import allow_exotic
from wattcast.data.cluster_spec import list_clusters, load_cluster_file
from wattcast.data.device_spec import DeviceSpecError, from_dict

DEVICES = REPO / "data" / "devices"
CLUSTERS = REPO / "data" / "clusters"
H100 = yaml.safe_load((DEVICES / "H100-SXM5-80GB.yaml").read_text())


def _device(**change) -> dict:
    return {**H100, **change}


def test_every_shipped_device_cluster_and_example_loads():
    for f in sorted(DEVICES.glob("*.yaml")):
        assert load_spec_file(f).name == f.stem
    assert load_spec_file(REPO / "examples" / "my_gpu.yaml").name == "RTX-4090"
    for f in sorted(CLUSTERS.glob("*.yaml")):
        load_cluster_file(f)
    assert len(list_clusters()) == len(list(CLUSTERS.glob("*.yaml")))


# ------------------------------------------------------------------ 1. memory bandwidth in TB/s
@pytest.mark.parametrize("tbps", [8, 5.3, 3.35, 20])
def test_memory_bandwidth_in_tb_per_s_is_refused(tbps):
    with pytest.raises(DeviceSpecError) as e:
        from_dict(_device(memory_bandwidth_gbps=tbps))
    msg = flat(str(e.value))
    assert "'memory_bandwidth_gbps'" in msg and "looks like TB/s" in msg and "--force" in msg
    with allow_exotic():
        assert from_dict(_device(memory_bandwidth_gbps=tbps)).memory_bandwidth_gbps == tbps


# ------------------------------------------------------------------ 5. process node
@pytest.mark.parametrize("nm, hint", [(0.004, "micrometres"), (4000, "picometres"), (0.5, "micrometres")])
def test_process_node_outside_its_range_is_refused(nm, hint):
    with pytest.raises(DeviceSpecError) as e:
        from_dict(_device(process_node_nm=nm))
    msg = flat(str(e.value))
    assert "'process_node_nm'" in msg and hint in msg


def test_real_process_nodes_load():
    for nm in (1.8, 3, 7, 16, 28, 250):
        from_dict(_device(process_node_nm=nm))


# ------------------------------------------------------------------ 6. launch price
@pytest.mark.parametrize("usd, hint", [(33.6, "thousands of USD"), (3_360_000, "cents"), (2, "thousands of USD")])
def test_launch_price_outside_its_range_is_refused(usd, hint):
    with pytest.raises(DeviceSpecError) as e:
        from_dict(_device(launch_price_usd=usd))
    msg = flat(str(e.value))
    assert "'launch_price_usd'" in msg and hint in msg


# ------------------------------------------------------------------ 8. L2 cache in GB
def test_l2_cache_in_gb_is_refused():
    with pytest.raises(DeviceSpecError) as e:
        from_dict(_device(l2_cache_mb=0.05))
    assert "'l2_cache_mb'" in str(e.value) and "looks like GB" in str(e.value)
    from_dict(_device(l2_cache_mb=0.25))  # a 256 KB L2, the smallest of any CUDA GPU


# ------------------------------------------------------------------ YAML numbers with an exponent
def test_yaml_exponent_without_a_sign_says_how_to_write_it(tmp_path):
    f = tmp_path / "gpu.yaml"
    f.write_text((DEVICES / "H100-SXM5-80GB.yaml").read_text().replace("memory_bandwidth_gbps: 3430",
                                                                         "memory_bandwidth_gbps: 3.43e3"))
    with pytest.raises(DeviceSpecError) as e:
        load_spec_file(f)
    msg = str(e.value)
    assert "'memory_bandwidth_gbps'" in msg and "write 3.43e+03 or 3430.0" in msg
    f.write_text(f.read_text().replace("3.43e3", "3.43e+3"))
    assert load_spec_file(f).memory_bandwidth_gbps == 3430.0
