"""Warnings a prediction carries for a device spec that loads but looks wrong: tensor peaks out of the ratios
datasheets give them (a sparse figure among dense ones), and a GPU put on a cluster whose in-node fabric is faster
than the GPU's own interconnect. The numbers are never changed; no shipped device or preset gets a warning."""

from __future__ import annotations

import pytest
import yaml

import wattcast
from conftest import REPO
from wattcast.data.catalog import load_spec_file, resolve_device
from wattcast.data.cluster_spec import load_cluster_file
from wattcast.data.device_spec import from_dict

DEVICES = REPO / "data" / "devices"
CLUSTERS = REPO / "data" / "clusters"
H100 = yaml.safe_load((DEVICES / "H100-SXM5-80GB.yaml").read_text())


def _device(**change) -> dict:
    return {**H100, **change}


def peak_ratio_notes(spec):
    from wattcast.data.device_spec import peak_ratio_notes as notes  # (imported here: each test fails on its own)

    return notes(spec)


def device_link_notes(cluster, spec):
    from wattcast.data.cluster_spec import device_link_notes as notes

    return notes(cluster, spec)


def test_no_shipped_device_or_preset_is_warned():
    for f in sorted(DEVICES.glob("*.yaml")):
        spec = load_spec_file(f)
        assert peak_ratio_notes(spec) == [], f.name
    assert load_spec_file(REPO / "examples" / "my_gpu.yaml").name == "RTX-4090"
    assert peak_ratio_notes(load_spec_file(REPO / "examples" / "my_gpu.yaml")) == []
    for f in sorted(CLUSTERS.glob("*.yaml")):
        c = load_cluster_file(f)
        assert device_link_notes(c, resolve_device(c.device)) == [], f.name


# ------------------------------------------------------------------ 12. sparse tensor peaks flagged
@pytest.mark.parametrize("change, needle", [
    (dict(peak_fp8_tflops=989.4), "peak_fp8_tflops (989.4) is 1x"),  # FP8 given as the dense 16-bit figure's equal
    (dict(peak_fp8_tflops=3957.8), "peak_fp8_tflops (3957.8) is 4x"),  # FP8 sparse among dense 16-bit peaks
    (dict(peak_bf16_tflops=494.7, peak_tf32_tflops=247.35), "peak_fp16_tflops (989.4) is 2x peak_bf16_tflops"),
    (dict(peak_tf32_tflops=989.4), "is 1x peak_tf32_tflops"),
])
def test_tensor_peaks_out_of_their_datasheet_ratios_are_warned_in_the_prediction(change, needle):
    # an architecture the dense-rate table does not know (Hopper's refuses a doubled peak: test_spec_dense_rate.py)
    spec = from_dict(_device(arch="Imaginary", **change))
    notes = peak_ratio_notes(spec)
    assert any(needle in n and "sparse" in n for n in notes), notes
    res = wattcast.predict("gpt2", spec, batch=1, seq=128)
    assert any(needle in w for w in res.meta["warnings"])
    clean = wattcast.predict("gpt2", "H100-SXM5-80GB", batch=1, seq=128)
    assert not any("sparse" in w for w in clean.meta.get("warnings") or [])


def test_bf16_at_half_fp16_on_amd_cdna1_is_not_warned():
    mi100 = resolve_device("MI100")
    assert mi100.peak_fp16_tflops == 2 * mi100.peak_bf16_tflops and peak_ratio_notes(mi100) == []


def test_fp8_at_the_bf16_rate_is_not_warned_for_other_vendors():
    spec = from_dict(_device(name="Gaudi-like", vendor="intel", aliases=[], peak_fp8_tflops=989.4))
    assert peak_ratio_notes(spec) == []


# ------------------------------------------------------------------ 14. a GPU slower than its cluster's fabric
def test_device_slower_than_the_in_node_fabric_is_warned_without_changing_numbers():
    res = wattcast.predict_cluster("gpt2", "DGX-H100", device="L4", gpus=16, batch=16, seq=128)
    assert any("exceeds what L4's own interconnect" in w for w in res.meta["warnings"])
    from wattcast.simulate.distributed import predict_distributed

    ref = predict_distributed("gpt2", "DGX-H100", gpus=16, batch=16, seq=128, device="L4")
    assert res.step_time_ms == ref.step_time_ms and res.energy_j == ref.energy_j
    own = wattcast.predict_cluster("gpt2", "DGX-H100", gpus=16, batch=16, seq=128)
    assert not own.meta.get("warnings")


# ------------------------------------------------------------------ a search carries them once
#: the search's note that max_configs left valid candidates out (these tests keep the cap small for speed)
_CAPPED = "valid candidates not evaluated (max_configs="


def test_search_carries_the_spec_warnings_once(tmp_path):
    from conftest import write_preset_cluster

    l4 = write_preset_cluster(tmp_path / "l4.yaml", "L4")
    res = wattcast.search("gpt2", str(l4), gpus=16, batch=16, seq=128, max_configs=3)
    ref = wattcast.predict_cluster("gpt2", str(l4), gpus=16, batch=16, seq=128)
    # the prediction's own OOD-time note depends on the strategy (its kernels' time share); search's are per cluster
    per_cluster = [w for w in ref.meta["warnings"] if "out of distribution" not in w]
    # (and, since stop 44, the search's own note that the L4's strategies are mostly out of distribution, once)
    # (and, since stop 47, the note that max_configs=3 left valid candidates out, once)
    spec_notes = [w for w in res.warnings if "out of distribution" not in w and _CAPPED not in w]
    assert spec_notes == per_cluster and len(spec_notes) == 1 and len(res.warnings) == 3
    assert "exceeds what L4's own interconnect" in spec_notes[0]
    # a sparse-looking peak on the GPU of two clusters: said once for the GPU, the fabric note once per cluster
    (tmp_path / "sparse.yaml").write_text(yaml.safe_dump(_device(name="H100-sparse-fp8", aliases=[], arch="Imaginary",
                                                                 peak_fp8_tflops=3957.8)))
    one = write_preset_cluster(tmp_path / "a.yaml", str(tmp_path / "sparse.yaml"))
    two = write_preset_cluster(tmp_path / "b.yaml", str(tmp_path / "sparse.yaml"))
    both = wattcast.search("gpt2", [str(one), str(two)], gpus=16, batch=16, seq=128, max_configs=2)
    assert sum("peak_fp8_tflops (3957.8) is 4x" in w for w in both.warnings) == 1, both.warnings
    assert [w for w in wattcast.search("gpt2", "DGX-H100", gpus=16, batch=16, seq=128, max_configs=2).warnings
            if _CAPPED not in w] == []


def test_search_cli_prints_the_spec_warnings_and_puts_them_in_its_json(tmp_path):
    import json

    from conftest import flat, run_cli, write_preset_cluster

    l4 = write_preset_cluster(tmp_path / "l4.yaml", "L4")
    args = ("search", "--model", "gpt2", "--cluster", str(l4), "--gpus", "16", "--batch", "16", "--seq", "128",
            "--max-configs", "3", "--workers", "1")
    r = run_cli(*args, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # (the OOD note: stop 44; max_configs' cut: stop 47)
    spec_notes = [w for w in out["warnings"] if "out of distribution" not in w and _CAPPED not in w]
    assert len(spec_notes) == 1 and "exceeds what L4's own interconnect" in spec_notes[0]
    assert flat(r.stderr).count("warning: cluster DGX-H100's in-node bandwidth") == 1
    t = run_cli(*args)
    assert t.returncode == 0 and flat(t.stderr).count("exceeds what L4's own interconnect") == 1
    clean = run_cli("search", "--model", "gpt2", "--cluster", "DGX-H100", "--gpus", "16", "--batch", "16", "--seq",
                    "128", "--max-configs", "3", "--workers", "1", "--json")
    assert [w for w in json.loads(clean.stdout)["warnings"] if _CAPPED not in w] == []
    assert "warning: cluster" not in clean.stderr
