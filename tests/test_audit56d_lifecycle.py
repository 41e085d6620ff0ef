"""Audit 56d findings 2-4 (the lifecycle calculator): the host's power does not follow a GPU power cap; every
Blackwell / Blackwell Ultra package is two dies; the idle spares of the nodes a ``--gpus-per-node`` job holds are
charged with the run (CapEx, embodied carbon, GPU-hours, energy) and said so, alike in predict, footprint, search and
the Python API."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

import wattcast
from wattcast.cli import app
from wattcast.data.catalog import resolve_device
from wattcast.lifecycle import embodied_kgco2e_per_device, footprint, footprint_from_step, host_power_w

runner = CliRunner()


# ------------------------------------------------------------------ finding 2: host power is not scaled by a cap
def test_host_power_is_a_fixed_share_of_tdp_not_of_the_gpus_draw():
    busy = footprint("H100-SXM5-80GB", 8, 10.0, power_model=553.0, apply_goodput=False)
    capped = footprint("H100-SXM5-80GB", 8, 10.0, power_model=200.0, apply_goodput=False)
    assert busy.host_power_w == capped.host_power_w == pytest.approx(0.3 * 700) == host_power_w(700.0, 0.3)
    assert capped.node_power_w == pytest.approx(200.0 + 210.0)  # was 200 x 1.3 = 260: the host fell with the cap
    hosts = capped.it_energy_breakdown_mwh["hosts"]
    assert hosts == pytest.approx(8 * 210.0 * 10.0 / 1e6) == busy.it_energy_breakdown_mwh["hosts"]
    assert sum(capped.it_energy_breakdown_mwh.values()) == pytest.approx(capped.it_energy_mwh)


def test_a_power_limit_lowers_the_gpus_power_in_a_predicted_run_but_not_the_hosts():
    kw = dict(gpus=8, tp=2, batch=16, seq=512, tokens=1e8)
    free = wattcast.predict_cluster("gpt2", "DGX-H100", **kw)
    capped = wattcast.predict_cluster("gpt2", "DGX-H100", power_limit_w=250, **kw)
    assert capped.run.avg_power_w < free.run.avg_power_w
    assert capped.run.host_power_w == free.run.host_power_w == pytest.approx(210.0)
    for r in (free.run, capped.run):
        assert r.node_power_w == pytest.approx(r.avg_power_w + 210.0)
        assert r.it_energy_breakdown_mwh["hosts"] == pytest.approx(8 * 210.0 * r.hours / 1e6)
    d = capped.to_dict()["run_details"]  # its own term in the JSON
    assert d["host_power_w"] == pytest.approx(210.0) and set(d["it_energy_breakdown_mwh"]) == {"gpus", "spare_gpus", "hosts"}


def test_a_given_all_in_power_adds_no_host():
    fp = footprint("V100-SXM2-32GB", 10, 5.0, avg_power_w=330.0, apply_goodput=False)
    assert fp.host_power_w == 0.0 and fp.node_power_w == pytest.approx(330.0)


# ------------------------------------------------------------------ finding 3: two-die Blackwell packages
@pytest.mark.parametrize("name", ["GB200", "B300", "GB300"])
def test_every_blackwell_package_is_charged_two_dies(name):
    b200 = embodied_kgco2e_per_device(resolve_device("B200"))
    eb = embodied_kgco2e_per_device(resolve_device(name))
    assert eb.die_area_mm2 == b200.die_area_mm2 == 1600.0  # was the 800 mm2 one-die default
    assert eb.die_kgco2e == pytest.approx(b200.die_kgco2e)
    assert "dies" in eb.sources["die_area_mm2"]


def test_a_user_spec_reusing_a_blackwell_name_gets_the_default_area_not_the_catalogs():
    spec = replace(resolve_device("GB300"), memory_gb=100.0)
    eb = embodied_kgco2e_per_device(spec)
    assert eb.die_area_mm2 == 800.0 and any("not the catalog's" in f for f in eb.flags)


def test_chiplet_packages_whose_area_leaves_out_the_io_dies_say_so():
    for name in ("MI300X", "MI355X"):
        eb = embodied_kgco2e_per_device(resolve_device(name))
        assert any("I/O dies" in f and "underestimate" in f for f in eb.flags), name
    assert not any("I/O dies" in f for f in embodied_kgco2e_per_device(resolve_device("MI250X")).flags)


# ------------------------------------------------------------------ finding 4: idle spares of the nodes held
def test_spares_are_charged_bought_made_billed_and_idle():
    base = footprint("GB200", 128, 10.0, power_model=900.0, apply_goodput=False)
    fp = footprint("GB200", 128, 10.0, power_model=900.0, apply_goodput=False, gpus_per_node=64, node_gpus=72)
    assert (fp.nodes, fp.gpus_held, fp.spare_gpus, fp.gpus) == (2, 144, 16, 128)
    assert fp.gpu_hours == pytest.approx(144 * 10.0) and fp.busy_gpu_hours == pytest.approx(base.gpu_hours)
    for k, v in fp.capex_breakdown_usd.items():  # accelerators, servers, network and the provisioned kW
        assert v == pytest.approx(base.capex_breakdown_usd[k] * 144 / 128), k
    assert fp.embodied_tco2e == pytest.approx(base.embodied_tco2e * 144 / 128)
    from wattcast.models.power import idle_power_w

    idle = idle_power_w(resolve_device("GB200"))
    assert fp.spare_power_w == pytest.approx(idle)
    extra_mwh = 16 * (idle + fp.host_power_w) * 10.0 / 1e6
    assert fp.it_energy_mwh == pytest.approx(base.it_energy_mwh + extra_mwh)
    assert fp.it_energy_breakdown_mwh["spare_gpus"] == pytest.approx(16 * idle * 10.0 / 1e6)
    assert fp.cloud_usd is None or fp.cloud_usd == pytest.approx(base.cloud_usd * 144 / 128)
    assert any(f.startswith("16 spare GPUs charged") for f in fp.flags)
    assert not base.spare_gpus and base.gpus_held == 128 and base.nodes is None


def test_spare_options_go_together_and_are_checked():
    with pytest.raises(ValueError, match="go together"):
        footprint("GB200", 128, 10.0, gpus_per_node=64)
    with pytest.raises(ValueError, match="more than the node's 72"):
        footprint("GB200", 128, 10.0, gpus_per_node=80, node_gpus=72)
    with pytest.raises(ValueError, match="node_gpus"):
        footprint("GB200", 128, 10.0, gpus_per_node=64, node_gpus=0)
    full = footprint("GB200", 144, 10.0, gpus_per_node=72, node_gpus=72)  # whole nodes: nothing idle
    assert full.spare_gpus == 0 and full.nodes == 2 and not any("spare" in f for f in full.flags)


def test_predict_cluster_with_gpus_per_node_charges_the_racks_spares_and_warns():
    res = wattcast.predict_cluster("gpt2", "GB200-NVL72", gpus=128, gpus_per_node=64, tp=1, batch=128, seq=1024,
                                   tokens=1e9)
    r = res.run
    assert (r.nodes, r.gpus_per_node, r.node_gpus, r.spare_gpus, r.gpus_held) == (2, 64, 72, 16, 144)
    assert r.gpu_hours == pytest.approx(144 * r.hours)
    assert any(w.startswith("16 spare GPUs charged") for w in res.meta["warnings"])
    d = res.to_dict()
    assert d["run"]["gpu_hours"] == pytest.approx(144 * d["run"]["hours"])
    assert d["run_details"]["spare_gpus"] == 16 and d["run_details"]["nodes"] == 2
    # the same run from the calculator given the same step and nodes
    same = footprint_from_step("GB200", 128, step_time_ms=res.step_time_ms, gpu_power_w=res.avg_power_w, tokens=1e9,
                               tokens_per_step=128 * 1024, flops_per_step=res.flops, gpus_per_node=64, node_gpus=72)
    assert same.run_dict() == pytest.approx(r.run_dict())


def test_search_rows_charge_the_spares_as_predict_does():
    s = wattcast.search("gpt2", "GB200-NVL72", 128, 128, 1024, gpus_per_node=64, tokens=1e9, max_configs=2)
    row = s.ranked.iloc[0]
    assert row["run_gpu_hours"] == pytest.approx(144 * row["run_hours"])
    res = wattcast.predict_cluster("gpt2", row["cluster"], gpus=128, strategy=row["strategy"], seq=1024, tokens=1e9)
    assert res.run.tco_usd == pytest.approx(row["run_tco_usd"]) and res.run.spare_gpus == 16
    assert res.run.energy_mwh == pytest.approx(row["run_energy_mwh"])


def test_footprint_command_takes_the_nodes():
    r = runner.invoke(app, ["footprint", "--device", "GB200", "--gpus", "128", "--hours", "10", "--gpus-per-node", "64",
                            "--node-gpus", "72", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert (d["spare_gpus"], d["gpus_held"], d["nodes"]) == (16, 144, 2)
    assert d["run"]["gpu_hours"] == pytest.approx(144 * d["hours"])
    text = runner.invoke(app, ["footprint", "--device", "GB200", "--gpus", "128", "--hours", "10", "--gpus-per-node",
                               "64", "--node-gpus", "72"])
    assert text.exit_code == 0 and "16 idle spares" in text.output and "+ host 360 W" in text.output
    bad = runner.invoke(app, ["footprint", "--device", "GB200", "--gpus", "128", "--hours", "10", "--node-gpus", "72"])
    assert bad.exit_code != 0 and "--gpus-per-node" in bad.output
