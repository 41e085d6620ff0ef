"""Audit 58a (FP8, a Transformer Engine / Megatron-Core user):

- F1: an FP8 step on a generation where no FP8 step was measured (Hopper, Ada, CDNA) warns and its band carries the
  FP8 GEMM kernels' leave-one-generation-out error on the linear layers' share (simulate/step_band.py);
- F2: a single-device FP8 step whose launch gaps hide the FP8 GEMMs' GPU-time saving says so, with its bf16 twin's
  figures (``fp8_vs_bf16``);
- F3: a search records ``fp8_recipe`` / ``fp8_param_gather`` (rows, ``settings``, JSON, CSV), and a row replays;
- F4: the single-device Chrome trace's ``otherData`` names the FP8 recipe.
"""

from __future__ import annotations

import csv
import json
import math

import pytest

import wattcast
from conftest import run_cli
from wattcast.data.catalog import resolve_device
from wattcast.models.kernel_bundle import load_bundle
from wattcast.simulate.trace import write_chrome_trace

CL = dict(gpus=8, batch=16, seq=2048, tp=2, pp=1, micro_batch=1, zero=1, sp=True, framework="megatron")


def _linear_share(per_op):
    total = sum(o["time_ms"] for o in per_op)
    return sum(o["time_ms"] for o in per_op if o["op_class"] == "linear") / total


def test_fp8_on_hopper_warns_and_widens_the_band_by_the_fp8_kernel_error():
    from wattcast.simulate.step_band import FP8_KERNEL_LOGO, step_band

    p = wattcast.predict_cluster("llama3_8b", "DGX-H100", dtype="fp8", **CL)
    warn = [w for w in p.meta["warnings"] if w.startswith("FP8 on Hopper")]
    assert len(warn) == 1 and "12.4% MAPE" in warn[0] and "no FP8 training step on Hopper" in warn[0]
    band = p.step_band
    assert "FP8 GEMMs' error" in band["basis"]
    # the band is the one without the FP8 term widened by log(1 + 12.4%) x the linear layers' share, each side
    spec = resolve_device("H100-SXM5-80GB")
    bare = step_band(p.step_time_ms, "cluster", spec, p.per_op, load_bundle(), tensor=True, ood=None, fp8=False)
    assert p.step_band["ood_time_share"] == 0.0  # no OOD term here: the two differ by the FP8 term alone
    extra = _linear_share(p.per_op) * math.log1p(FP8_KERNEL_LOGO["nvidia"]["mape_pct"] / 100)
    assert extra > 0.03  # the linear layers hold most of an 8B step's time
    assert math.log(band["high_ms"] / bare["high_ms"]) == pytest.approx(extra, rel=1e-9)
    assert math.log(bare["low_ms"] / band["low_ms"]) == pytest.approx(extra, rel=1e-9)
    # the same step in bf16: no FP8 warning or term
    b = wattcast.predict_cluster("llama3_8b", "DGX-H100", dtype="bf16", **CL)
    assert not any(w.startswith("FP8 on") for w in b.meta.get("warnings") or [])
    assert "FP8" not in b.step_band["basis"]


def test_fp8_on_blackwell_where_fp8_steps_were_measured_has_no_fp8_term():
    from wattcast.simulate.step_band import fp8_kernel_log

    assert fp8_kernel_log(resolve_device("B200"), True) == 0.0
    assert fp8_kernel_log(resolve_device("H100-SXM5-80GB"), False) == 0.0
    assert fp8_kernel_log(resolve_device("MI300X"), True) == pytest.approx(math.log1p(0.307))
    p = wattcast.predict("llama3_8b", "B200", dtype="fp8", seq=2048)
    assert "FP8 GEMMs' error" not in p.step_band["basis"]
    assert not any(w.startswith("FP8 on") for w in p.meta.get("warnings") or [])
    h = wattcast.predict("llama3_8b", "H100-SXM5-80GB", dtype="fp8", seq=2048)
    assert "FP8 GEMMs' error" in h.step_band["basis"]
    assert any(w.startswith("FP8 on Hopper") for w in h.meta["warnings"])


def test_search_records_the_fp8_options_and_a_row_replays_with_them(tmp_path):
    space = dict(tp=(2,), pp=(1,), micro_batch=(1,), cp=(1,), zero=(0, 1), sp=(True,), recompute=("none",))
    kw = dict(dtype="fp8", framework="megatron", fp8_recipe="tensorwise", fp8_param_gather=True)
    s = wattcast.search("llama3_8b", "DGX-H100", 8, 16, 2048, **kw, **space)
    assert s.settings["fp8_recipe"] == "tensorwise" and s.settings["fp8_param_gather"] is True
    r = s.ranked
    assert (r["fp8_recipe"] == "tensorwise").all()
    assert list(r["fp8_param_gather"]) == [z >= 1 for z in r["zero"]]  # the distributed optimizer's only
    assert any(w.startswith("FP8 on Hopper") for w in s.warnings)
    for row in r[r["scheduled"]].itertuples():
        p = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=16, seq=2048, dtype="fp8",
                                     framework="megatron", strategy=row.strategy, fp8_recipe=row.fp8_recipe,
                                     fp8_param_gather=row.fp8_param_gather)
        assert p.step_time_ms == row.step_time_ms and p.memory_gb == row.memory_gb
        assert p.step_band["low_ms"] == pytest.approx(row.step_time_band_low_ms, rel=1e-12)
        assert p.step_band["high_ms"] == pytest.approx(row.step_time_band_high_ms, rel=1e-12)
    # the CLI's JSON settings and CSV columns
    args = ("search", "-m", "llama3_8b", "--cluster", "DGX-H100", "--gpus", "8", "-b", "16", "--seq", "2048",
            "--dtype", "fp8", "--framework", "megatron", "--tp", "2", "--pp", "1", "--micro-batch", "1", "--cp", "1",
            "--zero", "1", "--fp8-recipe", "tensorwise", "--fp8-param-gather")
    out = run_cli(*args, "--json")
    assert out.returncode == 0, out.stderr
    js = json.loads(out.stdout)
    assert js["settings"]["fp8_recipe"] == "tensorwise" and js["settings"]["fp8_param_gather"] is True
    assert all(x["fp8_recipe"] == "tensorwise" and x["fp8_param_gather"] is True for x in js["ranked"])
    path = tmp_path / "s.csv"
    out = run_cli(*args, "--output", path)
    assert out.returncode == 0, out.stderr
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert rows and all(x["fp8_recipe"] == "tensorwise" and x["fp8_param_gather"] == "True" for x in rows)


def test_single_device_trace_names_the_fp8_recipe(tmp_path):
    for recipe in ("delayed", "tensorwise"):
        p = wattcast.predict("llama3_8b", "H100-SXM5-80GB", dtype="fp8", seq=2048, fp8_recipe=recipe)
        other = json.loads(write_chrome_trace(p, tmp_path / f"{recipe}.json").read_text())["otherData"]
        assert other["fp8_recipe"] == recipe and other["dtype"] == "fp8"
        assert {k: other[k] for k in ("model", "device", "mode", "step_time_ms")} == dict(
            model="llama3_8b", device="H100-SXM5-80GB", mode="train", step_time_ms=p.step_time_ms)
    b = wattcast.predict("llama3_8b", "H100-SXM5-80GB", seq=2048)
    other = json.loads(write_chrome_trace(b, tmp_path / "bf16.json").read_text())["otherData"]
    assert "fp8_recipe" not in other and other["dtype"] == "bf16"


def test_host_bound_fp8_step_says_its_gain_is_lost_to_launch_gaps():
    p = wattcast.predict("llama3_8b", "B200", dtype="fp8", seq=2048)
    b = wattcast.predict("llama3_8b", "B200", dtype="bf16", seq=2048)
    c = p.to_dict()["fp8_vs_bf16"]
    # the twin is the bf16 prediction itself
    assert c["bf16_step_ms"] == b.step_time_ms and c["fp8_step_ms"] == p.step_time_ms
    assert c["bf16_launch_gap_ms"] == b.overheads["launch_gap_ms"]
    assert c["fp8_launch_gap_ms"] == p.overheads["launch_gap_ms"]
    # 32 layers x 7 linears x (input cast, gradient cast, weight cast)
    assert c["fp8_cast_launches"] == 32 * 7 * 3 and c["host_us"] == 40.0
    # slower in FP8 at 2,048 tokens, faster on GPU time alone: the note says so with the figures
    assert c["fp8_step_ms"] > c["bf16_step_ms"] and c["fp8_gpu_ms"] < c["bf16_gpu_ms"]
    note = [w for w in p.meta["warnings"] if w.startswith("FP8 is host-bound")]
    assert len(note) == 1 and f"{c['fp8_launch_gap_ms']:.1f} ms in FP8" in note[0] and "672 cast launches" in note[0]
    # 8 x 4,096 tokens: the GPU work per launch hides the host, no note
    big = wattcast.predict("llama3_8b", "B200", dtype="fp8", seq=4096, batch=8)
    assert big.to_dict()["fp8_vs_bf16"]["fp8_step_ms"] < big.to_dict()["fp8_vs_bf16"]["bf16_step_ms"]
    assert not any(w.startswith("FP8 is host-bound") for w in big.meta.get("warnings") or [])
    # a bf16 step has no comparison
    assert "fp8_vs_bf16" not in b.to_dict()
