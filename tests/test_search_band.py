"""Search rows carry the step's 90% band and its out-of-distribution shares (``step_time_band_low_ms``,
``step_time_band_high_ms``, ``ood_time_share``, ``ood_collective_time_share``): the figures ``predict_cluster`` gives
the same strategy (``step_band``), made over all rows at once (``step_band.cluster_band_columns``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

import wattcast
from wattcast.cli import app
from wattcast.data.catalog import resolve_device
from wattcast.planning.search import BAND_COLUMNS, COLUMNS
from wattcast.simulate import step_band as sb

BAND_KEYS = dict(step_time_band_low_ms="low_ms", step_time_band_high_ms="high_ms", ood_time_share="ood_time_share",
                 ood_collective_time_share="ood_collective_time_share")


def _same_band(row: dict, model: str, cluster: str, seq: int, **kw) -> dict:
    """``row``'s band columns equal ``predict_cluster``'s band of its strategy (to rounding); that band."""
    p = wattcast.predict_cluster(model, cluster, seq=seq, strategy=row["strategy"], **kw)
    assert row["step_time_ms"] == pytest.approx(p.step_time_ms, rel=1e-12)
    for col, key in BAND_KEYS.items():
        assert row[col] == pytest.approx(p.step_band[key], rel=1e-9, abs=1e-15), col
    return p.step_band


def test_the_top_row_reports_predict_clusters_band():
    # H100 (Hopper, off the measured cluster steps' Ampere: the generation term) with OOD kernel time on the top row
    res = wattcast.search("gpt2_medium", "DGX-H100", gpus=8, batch=16, seq=1024, max_configs=40, workers=1)
    assert set(BAND_COLUMNS) <= set(res.ranked.columns) and list(res.ranked.columns[:len(COLUMNS)]) == list(COLUMNS)
    top = res.ranked.iloc[0].to_dict()
    band = _same_band(top, "gpt2_medium", "DGX-H100", 1024)
    assert top["ood_time_share"] > 0 and "generation error" in band["basis"]  # both widening terms exercised
    assert top["step_time_band_low_ms"] < top["step_time_ms"] < top["step_time_band_high_ms"]
    assert res.best["step_time_band_high_ms"] == top["step_time_band_high_ms"]


def test_pipelined_block_recomputed_and_loading_rows_report_predict_clusters_band():
    """Pipeline stages (the critical rank's OOD term), block recomputation (its blended op totals) and data loading (in
    the generation term's total time), on A100s (no generation term) and H100s."""
    res = wattcast.search("llama3_8b", "DGX-H100", gpus=16, batch=64, seq=2048, max_configs=40, recompute_num_layers=(2,),
                          data_load_ms=3.0, workers=1)
    df = res.ranked[res.ranked["scheduled"].astype(bool)]
    picks = [df[df["pp"] > 1].iloc[0], df[df["strategy"].str.contains("rcfull")].iloc[0], df.iloc[0]]
    for r in picks:
        _same_band(r.to_dict(), "llama3_8b", "DGX-H100", 2048, data_load_ms=3.0)
    a100 = wattcast.search("gpt2_medium", "DGX-A100", gpus=16, batch=32, seq=1024, max_configs=20, pp=(2,), workers=1)
    _same_band(a100.ranked.iloc[0].to_dict(), "gpt2_medium", "DGX-A100", 1024)


def test_an_unscheduled_row_has_no_band():
    res = wattcast.search("llama3_8b", "DGX-A100", gpus=8, batch=8, seq=2048, max_configs=30, tp=(1,), workers=1)
    out = res.ranked[~res.ranked["scheduled"].astype(bool)]
    assert len(out) and out[list(BAND_COLUMNS)].isna().all().all()


def test_band_columns_equal_the_scalar_step_band():
    """The vectorised band, step by step, is :func:`step_band` of :func:`ood_from_sums` (the critical rank's term)."""
    spec = resolve_device("H100-SXM5-80GB")
    gen = 0.04
    cases = [  # step ms, kernel ms, OOD ms, its low / high edge ms, OOD collective ms
        (100.0, 90.0, 0.0, 0.0, 0.0, 0.0), (100.0, 90.0, 30.0, 20.0, 45.0, 0.0), (50.0, 40.0, 40.0, 30.0, 60.0, 2.0),
        (80.0, 70.0, 0.0, 0.0, 0.0, 7.0), (100.0, 90.0, 1.0, 1.2, 1.5, 0.0)]  # an OOD band above 1 on both edges
    arr = np.array(cases).T
    got = sb.cluster_band_columns(arr[0], np.full(len(cases), gen), *arr[1:])
    for i, (step, total, ood, lo, hi, coll) in enumerate(cases):
        o = sb.ood_from_sums(total, ood, lo, hi)
        if coll:
            o = dict(o, collective_share=coll / total)
        per_op = [dict(op_class="linear", time_ms=1.0)]  # the generation term given directly: patch it in
        want = _scalar_band(step, spec, per_op, gen, o)
        for col, key in BAND_KEYS.items():
            assert got[col][i] == pytest.approx(want[key], rel=1e-12, abs=1e-15), (i, col)
    nan = sb.cluster_band_columns([math.nan], [0.0], [math.nan], [math.nan], [math.nan], [math.nan], [math.nan])
    assert all(np.isnan(v[0]) for v in nan.values())


def _scalar_band(step, spec, per_op, gen, ood):
    from unittest import mock

    with mock.patch.object(sb, "generation_log_width", lambda *a, **k: gen):
        return sb.step_band(step, "cluster", spec, per_op, None, tensor=True, ood=ood)


def test_search_json_rows_carry_the_band():
    r = CliRunner().invoke(app, ["search", "-m", "gpt2_medium", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "16",
                                 "--seq", "1024", "--max-configs", "6", "--workers", "1", "--json"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["ranked"][0]
    assert set(BAND_COLUMNS) <= set(row)
    assert row["step_time_band_low_ms"] < row["step_time_ms"] < row["step_time_band_high_ms"]


def test_a_search_whose_strategies_are_mostly_out_of_distribution_says_so_once_per_cluster():
    """``predict_cluster`` warns past ``OOD_WARN_SHARE``; a search over those strategies said nothing (the share was
    only a column). Now one warning per cluster, with the count of strategies past it and the largest share."""
    res = wattcast.search("gpt2_medium", ["DGX-B200", "DGX-H100"], gpus=8, batch=16, seq=1024, max_configs=6, workers=1)
    shares = res.ranked.groupby("cluster")["ood_time_share"].max()
    assert shares["DGX-B200"] > sb.OOD_WARN_SHARE >= shares["DGX-H100"]
    ood = [w for w in res.warnings if "out of distribution" in w]
    n = int((res.ranked[res.ranked["cluster"] == "DGX-B200"]["ood_time_share"] > sb.OOD_WARN_SHARE).sum())
    assert ood == [f"DGX-B200: {n} of {int((res.ranked['cluster'] == 'DGX-B200').sum())} strategies: "
                   + sb.ood_warning(shares["DGX-B200"])]
    top = res.ranked[res.ranked["cluster"] == "DGX-B200"].iloc[0]
    p = wattcast.predict_cluster("gpt2_medium", "DGX-B200", seq=1024, strategy=top["strategy"])
    assert any("out of distribution" in w for w in p.meta["warnings"])
