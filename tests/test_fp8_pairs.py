"""benchmarks/fp8_pairs.py: which measured fp8 rows a shape's prediction is compared with (synthetic table; the
benchmark itself predicts through the shipped bundle and is not run here)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from conftest import load_script

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "fp8_pairs.py"


@pytest.fixture(scope="module")
def fp8_pairs():
    return load_script(BENCH, "fp8_pairs")


def _table(root: Path) -> None:
    # one gfx942 and one gfx950 shape: bf16, and fp8 inputs with three outputs, the trained (-> bf16) the slowest
    rows = []
    for dev, e4 in (("gfx942", "f8e4m3fnuz"), ("gfx950", "f8e4m3fn")):
        rows += [(dev, "bf16", "bf16", "bf16", 20.0), (dev, e4, e4, "bf16", 10.0), (dev, e4, e4, "f32", 6.0),
                 (dev, e4, e4, e4, 5.0)]
    d = pd.DataFrame(rows, columns=["device", "lhs_dtype", "rhs_dtype", "out_dtype", "derived_time_us"])
    d = d.assign(b=1, m=1024, n=1024, k=1024)
    (root / "tensorcore").mkdir(parents=True)
    d.to_csv(root / "tensorcore" / "xla_matmul_perf_table.csv", index=False)


def test_pairs_take_the_trained_bf16_output_rows(fp8_pairs, tmp_path):
    _table(tmp_path)
    p = fp8_pairs.pairs(tmp_path, xla_tables=[])
    assert sorted(p.device) == ["gfx942", "gfx950"]
    # the e4m3 x e4m3 -> bf16 rows (XLA_DTYPES' fp8 label, what the model trains on and wattcast's fp8 GEMM writes),
    # not the fastest of the outputs
    assert (p.derived_time_us_fp8 == 10.0).all()
    assert (p.derived_time_us_bf16 == 20.0).all()


def test_fastest_output_keeps_the_old_selection(fp8_pairs, tmp_path):
    _table(tmp_path)
    p = fp8_pairs.pairs(tmp_path, xla_tables=[], fastest_output=True)
    assert (p.derived_time_us_fp8 == 5.0).all()
