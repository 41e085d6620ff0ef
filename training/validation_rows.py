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
