"""``with wattcast.allow_exotic(): run_sweep(...)``: the lifted plausibility ranges travel with every task, so a Dask
worker (whose threads never see the caller's context variable) runs the task as the caller would, not strict."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import wattcast
from wattcast.sweep import SweepSpecError, load_spec, read_sweep, run_sweep, run_task

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def slow_nic_cluster(tmp_path) -> Path:
    """DGX-H100 with its NICs given as 0.4 Gbit/s: a figure the strict checks read as Tbit/s and refuse."""
    d = yaml.safe_load((REPO / "data" / "clusters" / "dgx-h100.yaml").read_text())
    d.pop("aliases", None)
    d["name"], d["inter"]["nic_bandwidth_gbit_per_s"] = "slow-nic", 0.4
    p = tmp_path / "slow.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _spec(cluster: Path) -> dict:
    return dict(models=["gpt2"], clusters=[str(cluster)], gpus=[16], batch=32, seq=512, max_configs=12, top=1)


def test_strict_load_refuses_and_the_task_carries_the_setting(slow_nic_cluster):
    with pytest.raises(SweepSpecError, match="nic_bandwidth_gbit_per_s"):
        load_spec(_spec(slow_nic_cluster))
    with wattcast.allow_exotic():
        spec = load_spec(_spec(slow_nic_cluster))
    (strict,), (lifted,) = spec.tasks(), spec.tasks(allow_exotic=True)
    assert "allow_exotic" not in strict and lifted["allow_exotic"] is True
    assert strict["task_id"] != lifted["task_id"]  # a strict and a lifted run do not share parts
    # outside any allow_exotic block: the task's own setting decides (what a worker process sees)
    assert run_task(lifted)["status"].iloc[0] == "ok"
    bad = run_task(strict)
    assert bad["status"].iloc[0] == "error" and "nic_bandwidth_gbit_per_s" in bad["error"].iloc[0]


@pytest.mark.parametrize("workers", [0, 1])  # in this process, and a one-worker Dask LocalCluster on localhost
def test_allow_exotic_reaches_every_backend(slow_nic_cluster, tmp_path, workers):
    with wattcast.allow_exotic():
        r = run_sweep(_spec(slow_nic_cluster), tmp_path / f"w{workers}", workers=workers)
    df = read_sweep(r.output)
    assert not r.failed_tasks, r.failed_tasks
    assert df["status"].tolist() == ["ok"] and df["strategy"].iloc[0]
