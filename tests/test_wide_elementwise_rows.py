"""An elementwise row wider than the training data measures (a flattened 1-D tensor: B = 1, H = 268 M) is predicted
from its element count in a measured row shape (models/kernel_predictor.py ``_fold_wide_rows``): NeuSight's
measurements of one (device, op, dtype, count) at different (B, H) splits agree within 3.4% from 4 M elements up.
Before, H100 bf16 add 1 x 268,435,456 came out 1.76 ms against 0.51 ms at 16,384 x 16,384, unflagged."""

from __future__ import annotations

import pandas as pd
import pytest

from wattcast.models.kernel_predictor import FOLD_ROW_H, WIDE_ROW_MAX_H, _fold_wide_rows, predict_kernels


def _pred(rows, device="H100"):
    f = pd.DataFrame(rows, columns=["OPName", "B", "H", "dtype"])
    return predict_kernels(f, device)["pred_latency_ms"].to_numpy()


@pytest.mark.parametrize("device", ["H100", "A100-SXM4-80GB"])
def test_flat_row_costs_what_the_same_count_costs_in_a_measured_shape(device):
    flat, square, tall = _pred([("add", 1, 2 ** 28, "bf16"), ("add", 2 ** 14, 2 ** 14, "bf16"),
                                ("add", 2 ** 16, 2 ** 12, "bf16")], device)
    assert flat == pytest.approx(square, rel=1e-9)
    assert flat < 1.1 * tall  # within the measured split-independence, not 3.4x


def test_only_wide_elementwise_rows_are_refolded():
    canon = pd.DataFrame({"op": ["add", "add", "softmax", "mulu"], "dtype": "bf16",
                          "B": [1.0, 8.0, 1.0, 16.0], "H": [2.0 ** 28, float(WIDE_ROW_MAX_H), 2.0 ** 20, 2.0 ** 26]})
    out = _fold_wide_rows(canon)
    assert list(out["H"]) == [FOLD_ROW_H, WIDE_ROW_MAX_H, 2.0 ** 20, FOLD_ROW_H]  # softmax reduces over its row
    assert (out["B"] * out["H"]).tolist() == (canon["B"] * canon["H"]).tolist()
    assert canon["H"].iloc[0] == 2.0 ** 28  # the input frame untouched


def test_output_keeps_the_rows_own_shape():
    f = pd.DataFrame({"OPName": ["add"], "B": [1], "H": [2 ** 28], "dtype": ["bf16"]})
    out = predict_kernels(f, "H100")
    assert out["B"].iloc[0] == 1 and out["H"].iloc[0] == 2 ** 28
