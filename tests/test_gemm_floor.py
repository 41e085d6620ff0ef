"""The GEMM family's floor member (models/gemm_floor.py, training/gemm_floor.py): blend, bundle round trip, fit."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from wattcast.models.gemm_floor import FLOOR_BLEND_GFLOP, PREDICT_SOURCE, blend_weight, blended_log_ratio, check_floor_blend
from wattcast.models.kernel_bundle import BundleError, KernelBundle, load_bundle
from wattcast.models.kernel_predictor import predict_kernels


def test_blend_weight_is_zero_below_one_above_and_log_linear_between():
    g = np.array([0.01, 0.5, 1.0, 2.0, 100.0])
    w = blend_weight(g, 0.5, 2.0)
    assert w[0] == 0.0 and w[1] == 0.0 and w[3] == 1.0 and w[4] == 1.0
    assert w[2] == pytest.approx(0.5)  # 1 GFLOP is half way between 0.5 and 2 in log
    assert np.all(np.diff(blend_weight(np.geomspace(0.1, 10, 50), 0.5, 2.0)) >= 0)
    for lo, hi in ((0.0, 1.0), (2.0, 1.0), (1.0, 1.0)):
        with pytest.raises(ValueError, match="0 < lo < hi"):
            blend_weight(g, lo, hi)


def test_blended_log_ratio_ends_are_the_two_members():
    p_roof, p_floor = np.array([0.2, 0.2]), np.array([0.1, 0.1])
    t_roof, floor = np.array([0.01, 0.01]), 0.004
    out = blended_log_ratio(p_roof, p_floor, t_roof, floor, np.array([1.0, 0.0]))
    assert out[0] == pytest.approx(0.2)
    # the floor member alone: exp(0.1) x (roofline + floor), as a ratio to the roofline
    assert np.exp(out[1]) * 0.01 == pytest.approx(np.exp(0.1) * 0.014)
    # per-row floors broadcast
    out2 = blended_log_ratio(p_roof, p_floor, t_roof, np.array([0.004, 0.0]), np.array([0.0, 0.0]))
    assert out2[1] == pytest.approx(0.1)


@pytest.mark.parametrize("bad, match", [
    ({"floors_ms": {}, "source": "xla", "gflop": [0.5, 2]}, "positive floor"),
    ({"floors_ms": {"xla": -1.0}, "source": "xla", "gflop": [0.5, 2]}, "positive floor"),
    ({"floors_ms": {"xla": 0.004}, "source": "vidur", "gflop": [0.5, 2]}, "not one of"),
    ({"floors_ms": {"xla": 0.004}, "source": "xla", "gflop": [2]}, r"\[lo, hi\]"),
    ({"floors_ms": {"xla": 0.004}, "source": "xla", "gflop": [2, 0.5]}, "0 < lo < hi"),
])
def test_a_bad_floor_blend_entry_is_named(bad, match):
    with pytest.raises(ValueError, match=match):
        check_floor_blend(bad, "manifest")


def test_the_shipped_gemm_family_carries_the_floor_member():
    fm = load_bundle().families["gemm"]
    assert fm.floor_lgbm is not None
    assert fm.floor_blend["source"] == PREDICT_SOURCE
    assert tuple(fm.floor_blend["gflop"]) == FLOOR_BLEND_GFLOP
    # XLA's CUPTI kernel times: a floor of a few microseconds (fitted on the training rows)
    assert 0.001 < fm.floor_blend["floors_ms"][PREDICT_SOURCE] < 0.02


def _without_floor(bundle: KernelBundle, ceiling: bool = True) -> KernelBundle:
    """The bundle without the GEMM floor member (and, unless ``ceiling``, without the ceiling member either)."""
    fams = dict(bundle.families)
    fams["gemm"] = dataclasses.replace(fams["gemm"], floor_lgbm=None, floor_blend=None)
    if not ceiling:
        fams["gemm"] = dataclasses.replace(fams["gemm"], ceiling_lgbm=None, ceiling_member=None)
    return KernelBundle(fams, dict(bundle.meta))


def test_only_small_tensor_core_gemms_are_blended():
    b = load_bundle()
    rows = pd.DataFrame([
        dict(op="linear", dtype="bf16", B=1, M=256, N=256, K=256),      # 0.03 GFLOP: floor member alone
        dict(op="linear", dtype="bf16", B=1, M=1024, N=512, K=1024),    # 1.07 GFLOP: blended
        dict(op="linear", dtype="bf16", B=1, M=4096, N=4096, K=4096),   # 137 GFLOP: roofline member alone
        dict(op="linear", dtype="fp32", B=1, M=256, N=256, K=256),      # FP32: never blended
        dict(op="add", dtype="bf16", B=1, H=4096),
    ])
    out = predict_kernels(rows, "H100-SXM5-80GB", b)
    with_floor = out["pred_latency_ms"].to_numpy()
    assert [m.endswith("+floor") for m in out["model"]] == [True, True, False, False, False]
    # the large bf16 GEMM is the ceiling member's (an NVIDIA GPU), the blended one both members'
    assert list(out["model"][1:3]) == ["ceiling+floor", "ceiling"]
    alone = predict_kernels(rows, "H100-SXM5-80GB", _without_floor(b, ceiling=False))["pred_latency_ms"].to_numpy()
    assert with_floor[0] != pytest.approx(alone[0], rel=1e-6)
    assert with_floor[1] != pytest.approx(alone[1], rel=1e-6)
    assert with_floor[3:] == pytest.approx(alone[3:], rel=1e-12)


def test_the_blend_has_no_step_at_its_edges():
    """Predicted time is continuous in size across the blend range (no jump where a member takes over)."""
    b = load_bundle()
    lo, hi = FLOOR_BLEND_GFLOP
    ks = []
    for g in (lo, hi):  # M = N = 1024: K gives the GFLOP
        k = g * 1e9 / (2 * 1024 * 1024)
        ks += [int(np.floor(k)), int(np.ceil(k)) + 1]
    rows = pd.DataFrame([dict(op="linear", dtype="bf16", B=1, M=1024, N=1024, K=k) for k in ks])
    t = predict_kernels(rows, "B200", b)["pred_latency_ms"].to_numpy()
    assert t[1] / t[0] == pytest.approx(1.0, abs=0.02)
    assert t[3] / t[2] == pytest.approx(1.0, abs=0.02)


def test_the_floor_member_round_trips_and_its_file_is_checked(shipped_copy, tmp_path):
    b = KernelBundle.load(shipped_copy)
    out = tmp_path / "saved"
    b.save(out)
    again = KernelBundle.load(out)
    assert again.families["gemm"].floor_blend == b.families["gemm"].floor_blend
    man = json.loads((out / "kernel_manifest.json").read_text())
    fn = man["families"]["gemm"]["floor_blend"]["lgbm"]
    assert fn in man["files"]
    p = out / fn
    p.write_text(p.read_text()[:-200])  # truncated
    with pytest.raises(BundleError, match=fn):
        KernelBundle.load(out)


def test_a_manifest_whose_floor_blend_is_malformed_is_a_bundle_error(shipped_copy):
    path = shipped_copy / "kernel_manifest.json"
    man = json.loads(path.read_text())
    man["families"]["gemm"]["floor_blend"]["source"] = "nowhere"
    path.write_text(json.dumps(man))
    with pytest.raises(BundleError, match="floor_blend.source"):
        KernelBundle.load(shipped_copy)


def test_source_floors_are_fitted_from_the_data(data_root):
    """The per-source floors refit on a sample of the real tensor-core rows: XLA and Vidur measure kernel times on
    the GPU (a few microseconds), far below NeuSight's CUDA-event timings."""
    from wattcast.data.catalog import resolve_device
    from wattcast.data.kernel_datasets import load_kernels, split_heldout
    from wattcast.training.gemm_floor import fit_source_floors, matmul_ceiling

    df, _ = split_heldout(load_kernels(data_root))
    df = df[df["op"].isin(["bmm", "linear"]) & df["source"].isin(["xla", "vidur", "neusight/kernels"])]
    df = df.sample(frac=1.0, random_state=0).groupby("source").head(1500)
    specs = {d: resolve_device(d) for d in df["device"].unique()}
    floors = fit_source_floors(df.reset_index(drop=True), specs, matmul_ceiling(data_root, df, specs))
    assert set(floors) == {"xla", "vidur", "neusight/kernels"}
    assert 0.001 < floors["xla"] < 0.01 and 0.001 < floors["vidur"] < 0.01
    assert floors["neusight/kernels"] > 2 * floors["xla"]


def test_the_tile_wave_model_counts_an_fp8_gemm_output_in_bf16():
    """physical_inputs' memory traffic: fp8 operands (1 byte) and a bf16 output (2 bytes; N is the contraction,
    the output B x M x K)."""
    from wattcast.data.catalog import resolve_device
    from wattcast.training.gemm_floor import physical_inputs

    df = pd.DataFrame({"device": ["B200", "B200"], "dtype": ["fp8", "bf16"], "B": [2.0, 2.0], "M": [64.0, 64.0],
                       "N": [256.0, 256.0], "K": [1024.0, 1024.0], "source": ["xla", "xla"]})
    inp = physical_inputs(df, {"B200": resolve_device("B200")}, np.array([0.76, 0.78]))
    reads, out = 2 * (64 * 256 + 256 * 1024), 2 * 64 * 1024
    assert inp["mem_bytes"].tolist() == [reads * 1 + out * 2, (reads + out) * 2]
