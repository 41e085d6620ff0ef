"""Cluster spec checks found by fuzzing: latencies in nanoseconds, NICs in Tbit/s (and cross-node bandwidth far below
the in-node one), ClusterSpec objects built in Python (never validated before), a relative device path read from the
cluster file's folder, ASTRA-sim files with unknown keys or topologies."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import wattcast
from conftest import REPO, flat, preset_cluster, write_preset_cluster
from wattcast.data.catalog import resolve_device
from wattcast.data.checks import allow_exotic
from wattcast.data.cluster_spec import (ClusterSpec, ClusterSpecError, InterNode, IntraNode, cluster_from_dict,
                                        from_astra_network, resolve_cluster)

DEVICES = REPO / "data" / "devices"
CLUSTERS = REPO / "data" / "clusters"


# ------------------------------------------------------------------ 2. cluster latencies in nanoseconds
@pytest.mark.parametrize("field", ["inter__latency_us", "intra__latency_us"])
@pytest.mark.parametrize("ns", [5000, 1500, 500])
def test_latency_in_nanoseconds_is_refused(field, ns):
    with pytest.raises(ClusterSpecError) as e:
        cluster_from_dict(preset_cluster(**{field: ns}))
    msg = flat(str(e.value))
    assert f"'{field.replace('__', '.')}'" in msg and "nanoseconds" in msg and "--force" in msg
    with allow_exotic():
        cluster_from_dict(preset_cluster(**{field: ns}))


def test_latencies_of_real_fabrics_load():
    for us in (0, 1.5, 5, 30, 100):
        cluster_from_dict(preset_cluster(inter__latency_us=us, intra__latency_us=us))


def test_readme_states_the_latency_bound():
    text = flat((REPO / "README.md").read_text())
    assert "latencies up to 100 us" in text and "1-10 ms" not in text


# ------------------------------------------------------------------ 3. NIC bandwidth in Tbit/s
@pytest.mark.parametrize("tbit", [0.4, 0.8, 0.2])
def test_nic_bandwidth_in_tbit_per_s_is_refused(tbit):
    with pytest.raises(ClusterSpecError) as e:
        cluster_from_dict(preset_cluster(inter__nic_bandwidth_gbit_per_s=tbit))
    msg = flat(str(e.value))
    assert "'inter.nic_bandwidth_gbit_per_s'" in msg and "Tbit/s" in msg


def test_cross_node_bandwidth_far_below_in_node_is_refused():
    # one 1.6 "Gbit/s" NIC (1.6 Tbit/s meant) for 8 GPUs of 900 GB/s NVSwitch: 45,000x below
    d = preset_cluster("dgx-b200", inter__nics_per_node=1, inter__nic_bandwidth_gbit_per_s=1.6)
    with pytest.raises(ClusterSpecError) as e:
        cluster_from_dict(d)
    msg = flat(str(e.value))
    assert "cross-node bandwidth per GPU" in msg and "below the in-node bandwidth" in msg and "Tbit/s" in msg
    with allow_exotic():
        cluster_from_dict(d)
    # a slow but real network: 8 NVSwitch GPUs on one 10 GbE NIC (~2,000x)
    cluster_from_dict(preset_cluster("dgx-a100", inter__nics_per_node=1, inter__nic_bandwidth_gbit_per_s=10))


# ------------------------------------------------------------------ 7. clusters built in Python are validated
@pytest.mark.parametrize("change, field", [
    (lambda c: dataclasses.replace(c, inter=dataclasses.replace(c.inter, nic_bandwidth_gbit_per_s=float("nan"))),
     "inter.nic_bandwidth_gbit_per_s"),
    (lambda c: dataclasses.replace(c, gpus_per_node=0), "gpus_per_node"),
    (lambda c: dataclasses.replace(c, intra=dataclasses.replace(c.intra, latency_us=-100.0)), "intra.latency_us"),
    (lambda c: dataclasses.replace(c, inter=dataclasses.replace(c.inter, oversubscription=0.5)), "inter.oversubscription"),
    (lambda c: dataclasses.replace(c, intra=dataclasses.replace(c.intra, kind="infiniband")), "intra.kind"),
    (lambda c: dataclasses.replace(c, device=None), "device"),
])
def test_a_cluster_built_in_python_is_checked(change, field):
    c = resolve_cluster("DGX-H100")
    with pytest.raises(ClusterSpecError) as e:
        change(c)
    assert f"'{field}'" in str(e.value)


def test_a_valid_cluster_built_in_python_needs_no_citation_and_keeps_its_figures():
    c = ClusterSpec(name="mine", device="H100-SXM5-80GB", gpus_per_node=8.0,
                    intra=IntraNode(kind="nvswitch", bandwidth_gb_per_s=450, latency_us=3),
                    inter=InterNode(kind="infiniband", nics_per_node=8, nic_bandwidth_gbit_per_s=400, latency_us=5))
    assert c.gpus_per_node == 8 and type(c.gpus_per_node) is int
    assert c.intra.bandwidth_gb_per_s == 450 and c.inter.nic_bandwidth_gbit_per_s == 400
    preset = resolve_cluster("DGX-H100")
    assert dataclasses.replace(preset) == preset


def test_a_nan_nic_bandwidth_never_reaches_a_prediction():
    c = resolve_cluster("DGX-H100")
    with pytest.raises(ClusterSpecError, match="finite"):
        wattcast.predict_cluster("gpt2", dataclasses.replace(
            c, inter=dataclasses.replace(c.inter, nic_bandwidth_gbit_per_s=float("nan"))), gpus=16, batch=16)


# ------------------------------------------------------------------ 11. relative device path in a cluster file
def test_relative_device_path_is_read_from_the_cluster_files_folder(tmp_path, monkeypatch):
    sub, other = tmp_path / "sub", tmp_path / "other"
    sub.mkdir()
    other.mkdir()
    (sub / "mydev.yaml").write_text((DEVICES / "A100-SXM4-80GB.yaml").read_text())
    (other / "mydev.yaml").write_text((DEVICES / "H100-SXM5-80GB.yaml").read_text())  # a decoy in the cwd
    write_preset_cluster(sub / "cl.yaml", "mydev.yaml")
    monkeypatch.chdir(other)
    c = resolve_cluster("../sub/cl.yaml")
    assert Path(c.device) == (sub / "mydev.yaml").resolve()
    assert resolve_device(c.device).name == "A100-SXM4-80GB"
    assert wattcast.predict_cluster("gpt2", "../sub/cl.yaml", gpus=8, batch=8, seq=128).device == "A100-SXM4-80GB"


def test_relative_device_path_missing_beside_the_cluster_file_is_refused(tmp_path, monkeypatch):
    sub = tmp_path / "sub"
    sub.mkdir()
    write_preset_cluster(sub / "cl.yaml", "mydev.yaml")
    (tmp_path / "mydev.yaml").write_text((DEVICES / "H100-SXM5-80GB.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ClusterSpecError) as e:
        resolve_cluster("sub/cl.yaml")
    msg = str(e.value)
    assert "'device'" in msg and "cluster file's folder" in msg and "current directory" in msg
    write_preset_cluster(sub / "cl.yaml", "H100-SXM5-80GB")  # a catalog name is still a catalog name
    assert resolve_cluster("sub/cl.yaml").device == "H100-SXM5-80GB"


# ------------------------------------------------------------------ 15. ASTRA-sim keys and topologies
ASTRA = {"topology": ["Switch", "Switch"], "npus_count": [8, 2], "bandwidth": [450.0, 50.0], "latency": [3000.0, 5000.0],
         "device": "H100-SXM5-80GB"}


@pytest.mark.parametrize("change, needle", [
    (dict(bandwith=[1, 1]), "unknown field(s) bandwith"),
    (dict(nics_per_node=1), "unknown field(s) nics_per_node"),
    (dict(topology=["Banana", "Switch"]), "unknown topology 'Banana'"),
    (dict(topology=["Switch", "Rnig"]), "did you mean Ring?"),
])
def test_astra_sim_unknown_keys_and_topologies_are_refused(change, needle):
    with pytest.raises(ClusterSpecError) as e:
        from_astra_network({**ASTRA, **change})
    assert needle in str(e.value)


def test_astra_sim_files_with_known_keys_load():
    c = from_astra_network({**ASTRA, "topology": ["fullyconnected", "Ring"], "name": "mine"})
    assert c.name == "mine" and c.intra.kind == "nvlink" and c.intra.topology == "full_mesh" and c.max_nodes == 2


# ------------------------------------------------------------------ a NIC in Tbit/s, one NIC per GPU
@pytest.mark.parametrize("preset, tbit", [("dgx-b200", 1.6), ("gb200-nvl72", 1.6), ("dgx-h100", 1.6),
                                         ("dgx-b300", 3.2)])
def test_one_nic_per_gpu_given_in_tbit_per_s_is_refused(preset, tbit):
    # 1.6 "Gbit/s" per NIC, one per GPU, beside 900 GB/s NVSwitch: 4,500x below, under the per-GPU 10,000x
    d = preset_cluster(preset, inter__nic_bandwidth_gbit_per_s=tbit)
    with pytest.raises(ClusterSpecError) as e:
        cluster_from_dict(d)
    msg = flat(str(e.value))
    assert "inter.nic_bandwidth_gbit_per_s" in msg and "Tbit/s" in msg and "below a GPU's in-node bandwidth" in msg
    assert "--force" in msg
    with allow_exotic():
        assert cluster_from_dict(d).inter.nic_bandwidth_gbit_per_s == tbit


def test_slow_real_nics_still_load():
    # 10 GbE beside NVLink 5 (720x per NIC), one or eight per node; 1 GbE beside V100's NVLink 2 (1,200x); PCIe boxes
    for nics in (1, 8):
        cluster_from_dict(preset_cluster("dgx-b200", inter__nics_per_node=nics, inter__nic_bandwidth_gbit_per_s=10))
    cluster_from_dict(preset_cluster("dgx-1-v100", inter__nic_bandwidth_gbit_per_s=1))
    cluster_from_dict(preset_cluster("pcie-4gpu", inter__nic_bandwidth_gbit_per_s=1))
    for f in sorted(CLUSTERS.glob("*.yaml")):  # every preset loads as shipped
        resolve_cluster(f)


# ------------------------------------------------------------------ ASTRA-sim latencies in microseconds
@pytest.mark.parametrize("latency, bad", [([0.5, 5000.0], "latency[0]"), ([3000.0, 0.7], "latency[1]"),
                                          ([0.003, 0.005], "latency[0]")])
def test_astra_sim_latency_under_a_nanosecond_is_refused_as_microseconds(latency, bad):
    with pytest.raises(ClusterSpecError) as e:
        from_astra_network({**ASTRA, "latency": latency})
    msg = flat(str(e.value))
    assert f"'{bad}'" in msg and "microseconds" in msg and "nanoseconds" in msg and "--force" in msg
    with allow_exotic():
        from_astra_network({**ASTRA, "latency": latency})


def test_astra_sim_latencies_of_real_links_load():
    for ns in ([0.0, 0.0], [1.0, 20.0], [500.0, 5000.0], [100_000.0, 100_000.0]):
        c = from_astra_network({**ASTRA, "latency": ns})
        assert c.intra.latency_us == ns[0] / 1e3 and c.inter.latency_us == ns[1] / 1e3
    with pytest.raises(ClusterSpecError, match=r"'latency\[0\]' is 500000, over 100000"):
        from_astra_network({**ASTRA, "latency": [500_000.0, 5000.0]})


# ------------------------------------------------------------------ audit 55e: in-node bandwidth given in TB/s
def _nvl72_rack(tmp_path: Path, intra_gb_per_s: float, nics: int = 72, nic_gbit: float = 800) -> Path:
    """audit55e's rubin-nvl72.yaml: 72 GPUs of a hypothetical spec (B200 with interconnect_bandwidth_gbps 3600) on one
    NVSwitch, one NIC each (the audit's bad7.yaml: intra 1.8, NVLink's 1.8 TB/s typed as GB/s)."""
    dev = (DEVICES / "B200.yaml").read_text().replace("name: B200", "name: Rubin-like", 1)
    dev = "\n".join(ln for ln in dev.splitlines() if not ln.startswith("aliases"))
    dev = dev.replace("interconnect_bandwidth_gbps: 1800", "interconnect_bandwidth_gbps: 3600")
    assert "interconnect_bandwidth_gbps: 3600" in dev
    (tmp_path / "rubin.yaml").write_text(dev + "\n")
    d = preset_cluster("gb200-nvl72", device="rubin.yaml", intra__bandwidth_gb_per_s=intra_gb_per_s,
                       inter__nics_per_node=nics, inter__nic_bandwidth_gbit_per_s=nic_gbit)
    d["name"] = "Rubin-NVL72"
    import yaml
    f = tmp_path / "rack.yaml"
    f.write_text(yaml.safe_dump(d))
    return f


def test_in_node_bandwidth_in_tb_per_s_is_refused_against_the_device_interconnect(tmp_path):
    f = _nvl72_rack(tmp_path, 1.8, nic_gbit=10)  # bad7.yaml: accepted before (a step 100x too slow)
    with pytest.raises(ClusterSpecError) as e:
        resolve_cluster(f)
    msg = flat(str(e.value))
    assert "'intra.bandwidth_gb_per_s'" in msg and "interconnect_bandwidth_gbps" in msg and "TB/s" in msg
    assert "1.8 GB/s" in msg and "3600 GB/s" in msg and "2,000x" in msg and "--force" in msg
    with allow_exotic():
        assert resolve_cluster(f).intra.bandwidth_gb_per_s == 1.8
    assert resolve_cluster(_nvl72_rack(tmp_path, 1800, nic_gbit=10)).intra.bandwidth_gb_per_s == 1800
    assert resolve_cluster(_nvl72_rack(tmp_path, 36.0, nic_gbit=10)).intra.bandwidth_gb_per_s == 36.0  # 1/100: kept
    with pytest.raises(ClusterSpecError, match="interconnect_bandwidth_gbps"):
        resolve_cluster(_nvl72_rack(tmp_path, 35.0, nic_gbit=10))


def test_a_catalog_device_put_on_a_slow_in_node_tier_is_refused():
    # device= override: the check runs against the new GPU (B200 NVLink 5, 1800 GB/s, on 9 GB/s: 200x)
    with pytest.raises(ClusterSpecError, match="intra.bandwidth_gb_per_s"):
        cluster_from_dict(preset_cluster("pcie-4gpu", intra__bandwidth_gb_per_s=9.0), device="B200")
    cluster_from_dict(preset_cluster("pcie-4gpu", intra__bandwidth_gb_per_s=9.0))  # its own A100 PCIe (64): 7x


def test_one_nic_far_faster_than_the_in_node_tier_is_refused(tmp_path):
    # 72 GPUs sharing one 800G NIC (1.4 GB/s per GPU: under the in-node 1.8, so the per-GPU rule passes), the NIC
    # itself 56x the in-node figure; on a GPU with no interconnect figure the device check cannot see it
    d = preset_cluster("gb200-nvl72", device="MI300X", intra__bandwidth_gb_per_s=1.8, inter__nics_per_node=1,
                       inter__nic_bandwidth_gbit_per_s=800)
    d["intra"].pop("topology", None)
    with pytest.raises(ClusterSpecError) as e:
        cluster_from_dict(d)
    msg = flat(str(e.value))
    assert "'intra.bandwidth_gb_per_s'" in msg and "one NIC's bandwidth" in msg and "56x" in msg and "TB/s" in msg
    with allow_exotic():
        cluster_from_dict(d)


@pytest.mark.parametrize("preset", sorted(p.stem for p in CLUSTERS.glob("*.yaml")))
def test_every_preset_loads_with_every_catalog_device(preset):
    """No shipped cluster is refused by the in-node checks, on its own GPU or any catalog GPU put on it (the widest
    pairing: a B200's 1800 GB/s interconnect on PCIe-4GPU's 25 GB/s, 72x, under the 100x)."""
    from wattcast.data.catalog import list_devices
    from wattcast.data.cluster_spec import load_cluster_file

    c = load_cluster_file(CLUSTERS / f"{preset}.yaml")
    for spec in list_devices():
        assert resolve_cluster(c, device=spec.name).device == spec.name
