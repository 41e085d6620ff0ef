"""A device's memory given in TB or MB (audit 54b, finding 3): the single-figure range of ``memory_gb`` (0.25-5,000
GB) let B300's 270 GB typed as 0.27 TB through, and a 4 GB card typed as 4096 MB; the time to read the whole memory
once at the memory bandwidth (``memory_gb / memory_bandwidth_gbps``) catches both against the catalog's range. Every
catalog device, shipped spec, example and NeuSight device file still loads through the same check."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from conftest import EXAMPLES, REPO, flat, run_cli
from wattcast.data.catalog import list_devices, load_spec_file, resolve_device
from wattcast.data.checks import allow_exotic
from wattcast.data.device_spec import (MEMORY_READ_MS, MEMORY_READ_MS_ACCEPTED, DeviceSpecError, _memory_read_problem,
                                       from_dict)


def _read_ms(d) -> float:
    return d["memory_gb"] / d["memory_bandwidth_gbps"] * 1000.0


def test_the_catalog_range_is_what_wattcast_devices_json_gives():
    r = run_cli("devices", "--json")
    assert r.returncode == 0, r.stderr
    devs = json.loads(r.stdout)
    assert len(devs) == len(list_devices()) >= 28
    ms = {d["name"]: _read_ms(d) for d in devs}
    lo, hi = min(ms, key=ms.get), max(ms, key=ms.get)
    assert (lo, hi) == ("V100-SXM2-16GB", "L4")
    assert MEMORY_READ_MS == pytest.approx((ms[lo], ms[hi]), abs=0.01)  # 17.78 ms, 80.0 ms
    a_lo, a_hi = MEMORY_READ_MS_ACCEPTED
    assert ms[lo] / a_lo > 10 and a_hi / ms[hi] > 10  # a wide margin each way
    assert max(ms.values()) / 1000 < a_lo / 10 and min(ms.values()) * 1000 > a_hi * 5  # every TB / MB typo far out


def test_every_catalog_device_shipped_spec_example_and_neusight_file_loads(data_root):
    specs = list_devices()
    files = [*sorted((REPO / "data" / "devices").glob("*.yaml")), *sorted(EXAMPLES.glob("*.yaml")),
             *sorted((data_root / "neusight" / "devices").glob("*.json"))]
    assert len(files) >= 28 + 1 + 13
    specs += [load_spec_file(f) for f in files]
    for s in specs:
        assert _memory_read_problem(s) is None, s.name
        assert from_dict({**s.to_dict(), "name": s.name + "-copy", "aliases": []}).memory_gb == s.memory_gb


# the auditor's TB figures: B300 270 GB, GB300 287.5 GB, MI355X 288 GB, MI325X 256 GB (6 TB/s: MI300X's CUs and clock)
@pytest.mark.parametrize("device,tb,bw", [("B300", 0.27, None), ("GB300", 0.2875, None), ("MI355X", 0.288, None),
                                          ("MI300X", 0.256, 6000.0)])
def test_memory_in_tb_is_refused_naming_the_unit(device, tb, bw):
    s = resolve_device(device)
    d = {**s.to_dict(), "name": "mine", "aliases": [], "memory_gb": tb}
    if bw:
        d["memory_bandwidth_gbps"] = bw
    with pytest.raises(DeviceSpecError) as e:
        from_dict(d)
    msg = flat(str(e.value))
    assert f"field 'memory_gb' ({tb:g}) is read whole in" in msg
    assert f"was it given in TB? Give it in GB ({tb:g} TB is {tb * 1000:g} GB)" in msg and "--force" in msg
    with allow_exotic():
        assert from_dict(d).memory_gb == tb


@pytest.mark.parametrize("device,mb", [("Tesla-T4", 4096), ("Tesla-P4", 4096), ("V100-SXM2-16GB", 4000)])
def test_small_memory_in_mb_is_refused_naming_the_unit(device, mb):
    with pytest.raises(DeviceSpecError) as e:
        dataclasses.replace(resolve_device(device), name="mine", aliases=(), memory_gb=mb)
    msg = flat(str(e.value))
    assert f"field 'memory_gb' ({mb:g}) is read whole in" in msg and "was it given in MB (or MiB)?" in msg
    with allow_exotic():
        assert dataclasses.replace(resolve_device(device), name="mine", aliases=(), memory_gb=mb).memory_gb == mb


def test_the_auditors_files_are_refused_through_the_cli(tmp_path):
    b300 = {**resolve_device("B300").to_dict(), "name": "B300-tb", "aliases": [], "memory_gb": 0.27}
    p = tmp_path / "b300_tb.yaml"
    p.write_text(yaml.safe_dump(b300))
    r = run_cli("devices", p)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "'memory_gb' (0.27)" in flat(r.stdout + r.stderr) and "given in TB" in flat(r.stdout + r.stderr)
    small = {**yaml.safe_load((EXAMPLES / "my_gpu.yaml").read_text()), "memory_gb": 4096}  # a 4 GB card in MB
    q = tmp_path / "small_mb.yaml"
    q.write_text(yaml.safe_dump(small))
    r = run_cli("devices", q)
    assert r.returncode == 2 and "given in MB (or MiB)? Give it in GB (4096 MB is 4.096 GB" in flat(r.stdout + r.stderr)
    assert run_cli("devices", q, "--force").returncode == 0

