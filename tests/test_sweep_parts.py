"""Every part of a sweep folder has the full schema, a task without a result too, so the folder read as one table
(``pandas.read_parquet(OUT)``, pyarrow's dataset read, which takes one part's schema) keeps every column."""

from __future__ import annotations

import shutil

import pandas as pd
import pyarrow.parquet as pq

from wattcast.sweep import BOOL_COLUMNS, INT_COLUMNS, TEXT_COLUMNS, part_columns, read_sweep, run_sweep

SPEC = dict(models=["gpt2", "llama3_70b"], clusters=["DGX-A100"], gpus=[8], batch=8, seq=1024, max_configs=12, top=2,
            tokens=1e9, space=dict(tp=[1], pp=[1], zero=[0]))


def test_a_failed_task_read_first_keeps_every_column(tmp_path):
    out = run_sweep(SPEC, tmp_path / "s.parquet", workers=0).output
    df = read_sweep(out)
    assert set(df["status"]) == {"ok", "none fits"}
    assert list(df.columns) == part_columns(True)
    schemas = {str(pq.read_schema(p).remove_metadata()) for p in out.glob("part-*.parquet")}
    assert len(schemas) == 1  # one arrow schema for every part
    # the failed task's part sorting first (part names are hashes: force the order)
    first = tmp_path / "first"
    first.mkdir()
    for p in out.glob("part-*.parquet"):
        failed = (pd.read_parquet(p)["status"] != "ok").all()
        shutil.copy(p, first / (("part-0000" if failed else "part-ffff" + p.stem[-4:]) + ".parquet"))
    whole = pd.read_parquet(first)
    assert list(whole.columns) == part_columns(True) and len(whole) == len(df)  # was 9 of the 61 columns
    ok = whole[whole["status"] == "ok"]
    assert ok["step_time_ms"].gt(0).all() and ok["tp"].eq(1).all() and ok["fits"].all()
    bad = whole[whole["status"] != "ok"]
    assert bad["step_time_ms"].isna().all() and bad["tp"].isna().all()


def test_part_types_match_the_search():
    from wattcast import search

    r = search("gpt2", "DGX-A100", 8, 32, 512, tokens=1e9, max_configs=6).ranked
    for c in r.columns:
        kind = r[c].dtype.kind
        if c in INT_COLUMNS:
            assert kind in "iu", c
        elif c in BOOL_COLUMNS:
            assert kind == "b", c
        elif c in TEXT_COLUMNS:
            assert kind in "OT" or pd.api.types.is_string_dtype(r[c]), c
        else:
            assert kind == "f", c
    assert set(r.columns) - {"cluster"} <= set(part_columns(True))
