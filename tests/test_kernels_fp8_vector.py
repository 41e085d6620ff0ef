"""kernels: an fp8 softmax / norm / elementwise row runs in bf16 under Transformer Engine's recipe (its GEMMs stay
fp8)."""

from __future__ import annotations


import pandas as pd
import pytest

import wattcast


def _rows(dtypes, op="add"):
    return pd.DataFrame({"OPName": [op] * len(dtypes), "dtype": list(dtypes), "B": [8192] * len(dtypes),
                         "H": [4096] * len(dtypes)})


# ------------------------------------------------------------------ 2. fp8 vector rows are bf16 kernels
@pytest.mark.parametrize("op", ["add", "softmax", "rmsnorm", "gelu"])
def test_fp8_vector_rows_are_predicted_as_bf16(op):
    out = wattcast.predict_kernels(_rows(["fp8", "bf16"], op), "H100-SXM5-80GB")
    t = out["pred_latency_ms"].to_numpy()
    assert t[0] == pytest.approx(t[1], rel=1e-12)
    assert out["roofline_ms"].iloc[0] == pytest.approx(out["roofline_ms"].iloc[1], rel=1e-12)
    assert out["dtype"].iloc[0] == "fp8"  # the row keeps the dtype it gave


def test_fp8_gemm_rows_stay_fp8():
    g = pd.DataFrame({"OPName": ["linear", "linear"], "dtype": ["fp8", "bf16"], "B": [1, 1], "M": [8192] * 2,
                      "N": [4096] * 2, "K": [4096] * 2})
    t = wattcast.predict_kernels(g, "H100-SXM5-80GB")["pred_latency_ms"].to_numpy()
    assert t[0] < 0.8 * t[1]
