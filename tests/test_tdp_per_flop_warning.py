"""Audit 55b #2: a hypothetical spec with only ``tdp_w`` lowered (an H100 at 350 W or 175 W) kept its step time and
reported 2-4x less energy, without a word: the power model predicts power as a fraction of TDP. A spec whose TDP per
dense 16-bit tensor TFLOP/s is below every catalog GPU's now carries a warning (single-device predict, cluster
predict, search once per run, the CLI), naming --power-limit-w as the way to model a power-capped GPU; stock catalog
GPUs never get it. The warning tests fail on the code before the fix."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml
from typer.testing import CliRunner

import wattcast
from wattcast.data.catalog import list_devices, resolve_device
from wattcast.data.cluster_spec import resolve_cluster
from wattcast.data.device_spec import (catalog_min_watts_per_tflops, spec_notes, tdp_per_flop_notes,
                                       watts_per_dense_tflops)

NOTE = "below every catalog GPU's"


def _h100(tdp_w):
    return dataclasses.replace(resolve_device("H100-SXM5-80GB"), tdp_w=tdp_w, name=f"H100-{tdp_w}W", aliases=())


def _ours(warnings):
    return [w for w in warnings if NOTE in w]


def test_the_least_watts_per_flop_is_the_catalogs():
    least, name = catalog_min_watts_per_tflops()
    ratios = {s.name: watts_per_dense_tflops(s) for s in list_devices() if s.tdp_w}
    assert least == min(ratios.values()) and ratios[name] == least
    assert name == "B200" and least == pytest.approx(1000 / 2250)  # B200 at stop 55: 1,000 W over 2,250 TFLOP/s
    p100 = resolve_device("Tesla-P100-PCIe-16GB")  # vector FP16 only (2x FP32): per FP32 TFLOP/s
    assert watts_per_dense_tflops(p100) == pytest.approx(p100.tdp_w / p100.peak_fp32_tflops)


@pytest.mark.parametrize("spec", list_devices(), ids=lambda s: s.name)
def test_no_catalog_gpu_warns(spec):
    assert tdp_per_flop_notes(spec) == [] and not _ours(spec_notes(spec))
    # the same figures under another name (a spec that is not the catalog's: every check runs) do not warn either
    assert not _ours(spec_notes(dataclasses.replace(spec, name=spec.name + "-copy", aliases=())))


@pytest.mark.parametrize("tdp_w, warns", [(700, False), (500, False), (350, True), (175, True)])
def test_predict_warns_on_a_tdp_per_flop_below_the_catalogs(tdp_w, warns):
    d = wattcast.predict("gpt2", _h100(tdp_w), batch=1, seq=256).to_dict()
    got = _ours(d["warnings"])
    assert len(got) == int(warns)
    if warns:
        msg = got[0]
        assert f"tdp_w ({tdp_w} W)" in msg and "B200" in msg and "power-limit-w" in msg
        assert "power and energy scale with the tdp_w given" in msg and "no design drawing so little per FLOP" in msg


def test_cluster_predict_and_search_warn_once(tmp_path):
    spec = _h100(350)
    c = wattcast.predict_cluster("gpt2", "dgx-h100", gpus=8, batch=64, seq=256, device=spec)
    assert len(_ours(c.to_dict()["warnings"])) == 1
    assert not _ours(wattcast.predict_cluster("gpt2", "dgx-h100", gpus=8, batch=64, seq=256).to_dict()["warnings"])
    path = tmp_path / "h350.yaml"
    path.write_text(yaml.safe_dump(spec.to_dict()))
    cl = dataclasses.replace(resolve_cluster("dgx-h100"), name="DGX-350W", aliases=(), device=str(path))
    res = wattcast.search("gpt2", cl, 8, 64, 256, tp=(1, 2), pp=1)
    assert len(res.ranked) > 1 and len(_ours(res.warnings)) == 1  # once per run, not per row


def test_cli_prints_it_and_json_lists_it(tmp_path):
    from wattcast.cli import app

    path = tmp_path / "h350.yaml"
    path.write_text(yaml.safe_dump(_h100(350).to_dict()))
    runner = CliRunner()
    r = runner.invoke(app, ["predict", "-m", "gpt2", "-d", str(path), "--seq", "256"])
    assert r.exit_code == 0 and NOTE in " ".join(r.stderr.split())
    r = runner.invoke(app, ["predict", "-m", "gpt2", "-d", str(path), "--seq", "256", "--json"])
    assert r.exit_code == 0 and len(_ours(json.loads(r.stdout)["warnings"])) == 1
