"""The labels' source-consistency check: each measured phase against the sum of the label's own per-kernel timings."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from wattcast.validation.label_consistency import (TUKEY_FAR_OUT_K, excess_threshold, flag_excess, kernel_excess,
                                                   kernel_rows, label_kernel_sums)

_LAYER = "{'nn_module_stack': OrderedDict([('model.decoder', <class 'X'>), ('model.decoder.layers.0', <class 'L'>)])}"
_TOP = "{'nn_module_stack': OrderedDict([('lm_head', <class 'torch.nn.Linear'>)])}"


def _nodes(label: str) -> pd.DataFrame:
    """One synthetic label CSV: a layer-0 GEMM (1 ms fw, 2 ms bw), a layer-0 view and ``size`` (host-only, 0.5 ms
    each so that counting them would show), a layer-0 ``contiguous`` copy (0.25 ms, a kernel), an lm_head outside
    the layers (2 ms fw, 4 ms bw + 0.5 ms gradient accumulation), the graph's placeholder and output."""
    return pd.DataFrame({
        "op": ["placeholder", "call_module", "call_method", "call_method", "call_method", "call_module", "output"],
        "target": ["input_ids", "model.decoder.layers.0.fc1", "view", "size", "contiguous", "lm_head", "output"],
        "meta": ["{}", _LAYER, _LAYER, _LAYER, _LAYER, _TOP, "{}"],
        "fw_latency": [0.0, 1.0, 0.5, 0.5, 0.25, 2.0, 0.0],
        "bw_latency": [0.0, 2.0, 0.0, 0.0, 0.0, 4.0, 0.0],
        "acc_latency": [0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0],
        "dtype": ["torch.int64", "torch.float32", "torch.float32", np.nan, "torch.float32", "torch.float32", "torch.float32"],
        "label": label, "num_layer": 4,
    })


def test_kernel_rows_leave_out_host_only_and_view_rows():
    assert kernel_rows(_nodes("a")).tolist() == [False, True, False, False, True, True, False]


def test_kernel_sums_scale_one_layer_by_num_layer():
    s = label_kernel_sums(pd.concat([_nodes("a"), _nodes("b").assign(num_layer=2)], ignore_index=True))
    assert s.loc["a", "kernel_fw_ms"] == pytest.approx(4 * (1.0 + 0.25) + 2.0)
    assert s.loc["a", "kernel_bw_ms"] == pytest.approx(4 * 2.0 + 4.0 + 0.5)
    assert s.loc["b", "kernel_fw_ms"] == pytest.approx(2 * (1.0 + 0.25) + 2.0)
    assert s.loc["a", "layer_rows"] == 2


def test_flags_only_a_measurement_above_its_own_kernels():
    nodes = pd.concat([_nodes(k) for k in ("good", "slow_fw", "floor", "no_layers")], ignore_index=True)
    nodes.loc[nodes["label"] == "no_layers", "num_layer"] = 0
    fw_sum, bw_sum = 7.0, 12.5
    labels = pd.DataFrame({
        "label": ["good", "slow_fw", "floor", "no_layers"], "num_layer": [4, 4, 4, 0],
        # good: within 5%; slow_fw: forward measured 1.6x its kernels (backward fine); floor: every kernel timed alone
        # adds up to twice the measured forward (the isolated-timing floor, not a bad measurement); no_layers: one
        # layer cannot be scaled, no statistic
        "measured_fw_ms": [1.05 * fw_sum, 1.6 * fw_sum, 0.5 * fw_sum, 3 * fw_sum],
        "measured_bw_ms": [bw_sum, bw_sum, 0.5 * bw_sum, np.nan],
    })
    ex = kernel_excess(labels, label_kernel_sums(nodes)).set_index("label")
    assert ex.loc["good", "fw_excess"] == pytest.approx(0.05)
    assert ex.loc["slow_fw", "fw_excess"] == pytest.approx(0.6)
    assert ex.loc["slow_fw", "bw_excess"] == pytest.approx(0.0)
    assert ex.loc["floor", "fw_excess"] == pytest.approx(-0.5)
    assert np.isnan(ex.loc["no_layers", "fw_excess"])
    f = flag_excess(ex, threshold=0.2)
    assert f["flagged"].to_dict() == {"good": False, "slow_fw": True, "floor": False, "no_layers": False}
    # a two-sided rule would have flagged the floor-inflated label: the one-sided rule is what keeps it
    assert abs(ex.loc["floor", "fw_excess"]) > 0.2
    assert f.loc["slow_fw", "max_excess"] == pytest.approx(0.6)


def test_threshold_is_tukeys_far_out_fence_of_the_training_labels_only():
    rng = np.random.default_rng(0)
    train = rng.normal(0.0, 0.03, 40)
    ex = pd.DataFrame({"fw_excess": np.r_[train, 5.0, 9.0], "bw_excess": np.nan})
    held = np.r_[np.zeros(40, bool), True, True]
    q1, q3 = np.percentile(train, [25, 75])
    assert excess_threshold(ex, held) == pytest.approx(q3 + TUKEY_FAR_OUT_K * (q3 - q1))
    # the held-out rows never move it
    ex2 = ex.assign(fw_excess=np.r_[train, -3.0, 0.0])
    assert excess_threshold(ex2, held) == excess_threshold(ex, held)
    with pytest.raises(ValueError):
        excess_threshold(ex.iloc[:3], np.zeros(3, bool))


def test_labels_summary_without_source_anomalies():
    from wattcast.validation.e2e_labels import summarise_labels

    df = pd.DataFrame({
        "status": ["ok"] * 3, "mode": ["train"] * 3, "fusion": [False] * 3, "device": ["L4"] * 3,
        "measured_fw_ms": [50.0] * 3, "measured_bw_ms": [100.0] * 3,
        "error_pct": [2.0, -30.0, -4.0], "source_anomaly": [False, True, False],
    })
    df["abs_error_pct"] = df["error_pct"].abs()
    s = summarise_labels(df).set_index(["device", "kind"])
    assert s.loc[("L4", "all"), "labels"] == 3
    w = s.loc[("L4", "all-without-source-anomalies")]
    assert w["labels"] == 2
    assert w["mean_abs_error_pct"] == pytest.approx(3.0)
    assert w["mean_signed_error_pct"] == pytest.approx(-1.0)


def test_real_labels_flag_the_forward_anomalies(data_root):
    from wattcast.validation.e2e_labels import source_consistency

    if not (data_root / "neusight" / "labels" / "NVIDIA_A100_80GB_PCIe").is_dir():
        pytest.skip("NeuSight A100 80GB PCIe labels not available")
    t = source_consistency(data_root)
    flagged = {(r.device, r.stem) for r in t[t["flagged"]].itertuples()}
    assert {s for d, s in flagged if d == "A100-PCIe-80GB"} == {
        "bert_large-train-512-2", "bert_large-train-512-8", "gpt2_large-train-1024-1", "gpt3_27-train-2048-1",
        "opt_13-train-2048-2"}
    # the same artifact on two training-GPU labels; nothing else anywhere (not the small-batch labels whose
    # isolated kernels add up to more than the measurement, e.g. A100 40GB BERT inference at -34%)
    assert {s for d, s in flagged if d != "A100-PCIe-80GB"} == {"gpt2_large-train-1024-4", "gpt3_xl-train-2048-1"}
    assert {d for d, _ in flagged} == {"A100-PCIe-80GB", "MI210"}
    assert (t["fw_excess"] < -0.3).any()
    # every flag is on the forward: the backward of each label stays within the threshold
    assert (t.loc[t["flagged"], "bw_excess"] < t["threshold"].iloc[0]).all()


def test_a_label_needs_only_one_of_its_forward_fields(tmp_path):
    """``fw_latency`` alone (no ``e2e_latency``) is read; neither is a clear error naming the file."""
    from wattcast.validation.label_consistency import _forward_ms

    assert _forward_ms({"fw_latency": 3.0}, tmp_path / "a.json") == 3.0
    assert _forward_ms({"e2e_latency": 4.0}, tmp_path / "a.json") == 4.0
    with pytest.raises(ValueError, match="a.json"):
        _forward_ms({"bwall_latency": 1.0}, tmp_path / "a.json")
