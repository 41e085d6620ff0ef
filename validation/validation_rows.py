"""One loop for validation sets: predict every measured row, keep the measurement, record failures."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from wattcast.simulate.parallel import ParallelConfigError


def predict_rows(df: pd.DataFrame, predict: Callable[[tuple], tuple[float, dict]], *, progress=None) -> pd.DataFrame:
    """``predict(row) -> (predicted_ms, extra columns)`` for every row (a namedtuple with ``measured_ms``).

    Adds ``predicted_ms``, ``error_pct`` (signed, vs ``measured_ms``), the extra columns and ``status``
    ("ok", or the message of a configuration the rules or the model refused)."""
    out = []
    for i, r in enumerate(df.itertuples(index=False)):
        row = r._asdict()
        try:
            ms, extra = predict(r)
            row.update(predicted_ms=ms, error_pct=100 * (ms - r.measured_ms) / r.measured_ms, **extra, status="ok")
        except (ParallelConfigError, ValueError) as e:
            row.update(predicted_ms=np.nan, error_pct=np.nan, status=str(e))
        out.append(row)
        if progress:
            progress(i + 1, len(df))
    return pd.DataFrame(out)


def error_stats(pred: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per value of column ``by``, over the predicted rows (status "ok"): ``rows``, mean / median / max absolute
    % error, signed mean and the share within 10%."""
    ok = pred[pred["status"] == "ok"]
    err = ok["error_pct"]
    a = err.abs().groupby(ok[by])
    return pd.DataFrame({"rows": a.size(), "mean_abs_pct": a.mean(), "median_abs_pct": a.median(), "max_abs_pct": a.max(),
                         "mean_signed_pct": err.groupby(ok[by]).mean(),
                         "within_10pct": (err.abs() <= 10).groupby(ok[by]).mean()}).rename_axis(by).reset_index()
