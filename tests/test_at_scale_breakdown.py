"""Issue 15's at-scale tooling: the per-term step breakdown and the source-anomaly list with its evidence."""

from __future__ import annotations

import pandas as pd
import pytest

from wattcast.validation.source_anomalies import SOURCE_ANOMALIES, anomaly_evidence, anomaly_mask
from wattcast.validation.step_breakdown import TERM_COLUMNS, step_terms


def test_step_terms_cover_the_step():
    from wattcast.simulate.distributed import predict_distributed
    from wattcast.simulate.options import DistributedOptions
    from wattcast.simulate.parallel import ParallelConfig

    par = ParallelConfig(gpus=4, tp=2, pp=2, micro_batch=1)
    p = predict_distributed("gpt2", "NVLink-4GPU", par, DistributedOptions(batch=4, seq=256, dtype="bf16"))
    t = step_terms(p, iteration_ms=3.0)
    assert tuple(t) == TERM_COLUMNS
    assert t["n_micro"] == 4 and t["iteration_ms"] == 3.0
    assert t["gemm_ms"] > 0 and t["attention_ms"] > 0 and t["other_kernels_ms"] > 0 and t["bubble_ms"] > 0
    assert t["exposed_tp_ms"] > 0  # TP2 all-reduces are blocking
    listed = sum(v for k, v in t.items() if k not in ("n_micro", "launch_gap_ms", "other_ms"))
    assert listed + t["other_ms"] == pytest.approx(p.step_time_ms)


def _mpt_table():
    # a GPU-count sweep of one model (MFU 50, 50.5, 40, 50.2, 50) and a second one without anomalies
    rows = [dict(model="1b", gpu="a100_40gb", checkpointing=False, seq=2048, gpus=g, mfu_pct=m, micro_batch=8, grad_accum=1,
                 tokens_per_s_per_gpu=1000.0) for g, m in ((8, 50.0), (16, 50.5), (32, 40.0), (64, 50.2), (128, 50.0))]
    rows += [dict(model="3b", gpu="a100_40gb", checkpointing=False, seq=2048, gpus=g, mfu_pct=m, micro_batch=4, grad_accum=1,
                  tokens_per_s_per_gpu=500.0) for g, m in ((8, 55.0), (16, 54.0), (32, 54.5), (64, 54.0))]
    return pd.DataFrame(rows)


def test_anomaly_statistic_and_refusal(monkeypatch):
    from wattcast.validation import source_anomalies as sa

    only = tuple(a for a in SOURCE_ANOMALIES if a.row.get("gpus") == 32 and a.row.get("model") == "1b")
    assert len(only) == 1
    monkeypatch.setattr(sa, "SOURCE_ANOMALIES", only)
    df = _mpt_table()
    ev = anomaly_evidence(df, "mpt")
    assert len(ev) == 1 and ev.loc[0, "value"] == pytest.approx(40.0 - (50.5 + 50.2) / 2)
    assert ev.loc[0, "others_min"] == pytest.approx(54.0 - (55.0 + 54.5) / 2)
    assert anomaly_mask(df, "mpt").tolist() == [False, False, True] + [False] * 6
    # the row is no longer an outlier: the list must not hide it
    df.loc[2, "mfu_pct"] = 50.0
    with pytest.raises(ValueError, match="no longer an outlier"):
        anomaly_evidence(df, "mpt")
    # a listed row missing from the table is named
    with pytest.raises(ValueError, match="not in the table"):
        anomaly_evidence(df[df["gpus"] != 32], "mpt")


@pytest.mark.e2e
def test_listed_anomalies_hold_on_the_sources(data_root):
    from wattcast.validation.distributed_validation import load_vtrain
    from wattcast.validation.mpt_validation import load_mpt

    multi, mpt = load_vtrain(data_root, "multi"), load_mpt(data_root)
    ev = pd.concat([anomaly_evidence(multi, "vtrain-multi"), anomaly_evidence(mpt, "mpt")], ignore_index=True)
    assert len(ev) == len(SOURCE_ANOMALIES) and (ev["rows"] == 1).all()
    # each row lies outside the range of the same statistic over the rest of its source
    lo = ev["value"] < ev["others_min"]
    hi = ev["value"] > ev["others_max"]
    assert (lo | hi).all(), ev
    assert anomaly_mask(multi, "vtrain-multi").sum() == 1 and anomaly_mask(mpt, "mpt").sum() == 4


def test_knob_effects_ratio_and_miss():
    from wattcast.validation.step_breakdown import knob_effects

    rows = pd.DataFrame({"model": ["a", "a", "b", "b", "b"], "tp": [1, 2, 1, 2, 4], "status": ["ok"] * 4 + ["graph: x"],
                         "measured_ms": [100.0, 60.0, 200.0, 100.0, 1.0], "predicted_ms": [100.0, 50.0, 200.0, 100.0, 1.0]})
    t = knob_effects(rows, "tp", ["model"])
    assert t[["tp_from", "tp_to"]].values.tolist() == [[1, 2]]  # the failed TP4 row pairs with nothing
    r = t.iloc[0]
    assert r["pairs"] == 2 and r["measured_ratio"] == pytest.approx(0.55) and r["predicted_ratio"] == pytest.approx(0.5)
    assert r["miss"] == pytest.approx((0.5 / 0.6 + 1.0) / 2)
    with pytest.raises(ValueError, match=r"no column\(s\) \['seq'\]"):
        knob_effects(rows, "tp", ["seq"])


def test_repeat_floor_is_the_least_max_error_of_one_prediction_per_configuration():
    from wattcast.validation.step_breakdown import repeat_floor_pct

    f = repeat_floor_pct([100.0, 150.0, 120.0, 80.0], ["a", "a", "a", "b"])
    assert f.tolist() == pytest.approx([20.0, 20.0, 20.0, 0.0])  # (150 - 100) / (150 + 100); b measured once
    p = 2 * 100 * 150 / 250  # the prediction that reaches it: 120 misses 100 and 150 by 20% each
    assert max(abs(p / 100 - 1), abs(p / 150 - 1)) * 100 == pytest.approx(f[0])
    assert all(max(abs(q / 100 - 1), abs(q / 150 - 1)) * 100 >= f[0] - 1e-9 for q in (110, 119, 121, 130))
