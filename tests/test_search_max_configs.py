"""``max_configs`` never cuts a search silently: the valid candidates it leaves out are counted in ``warnings`` (so in
``--json`` and under the table), an asked-for value left with no ranked row is named in ``dropped_values``, and the
evaluated share is spread over the whole enumeration (before, the search stopped in candidate order: tp, cp and pp
nest outermost, so GPT-3 175B on 1,024 A100s at the default 5,000 ranked no tp 8 strategy and missed the best, 19,528
ms, by 1.7%, without a word)."""

import json

import numpy as np
import pandas as pd
from typer.testing import CliRunner

import wattcast
from wattcast.cli import app
from wattcast.planning.search import evaluation_order

JOB = ("gpt2", "dgx-a100", 8, 32, 1024)
SPACE = dict(tp=(1, 2, 4), workers=1)


def _evaluated(res) -> int:
    """Candidates a search evaluated: its ranked rows and the ZeRO >= 1 rows over one data-parallel rank it folded into
    their ZeRO-0 twins (since stop 56: until then such candidates were skipped)."""
    return len(res.ranked) + res.folded_rows


def test_a_capped_search_says_how_many_valid_candidates_it_left_out():
    full = wattcast.search(*JOB, **SPACE)
    capped = wattcast.search(*JOB, max_configs=40, **SPACE)
    assert full.folded_rows > 0  # the job has layouts of one data-parallel rank (tp x pp = 8)
    assert _evaluated(capped) == 40 < _evaluated(full)
    valid = _evaluated(full)
    notes = [w for w in capped.warnings if "max_configs=40" in w]
    assert notes == [f"DGX-A100: {valid - 40:,} of {valid:,} valid candidates not evaluated "
                     f"(max_configs=40): the best strategy may be among them; raise --max-configs (max_configs=) to at "
                     f"least {valid:,}"]
    assert not [w for w in full.warnings if "max_configs" in w]
    # every candidate is either ranked, rejected (a rule it breaks, checked for the skipped ones too) or counted
    assert len(capped.rejected) == len(full.rejected)


def test_the_cap_keeps_every_tp_degree_not_the_first_in_enumeration_order():
    capped = wattcast.search(*JOB, max_configs=40, **SPACE)
    assert set(capped.ranked["tp"]) == {1, 2, 4}
    assert set(capped.ranked["pp"]) == set(wattcast.search(*JOB, **SPACE).ranked["pp"])


def test_an_asked_value_left_out_by_the_cap_is_a_dropped_value():
    res = wattcast.search(*JOB, max_configs=1, **SPACE)
    assert len(res.ranked) == 1
    gone = {d["value"]: d for d in res.dropped_values if d["option"] == "tp"}
    missing = {1, 2, 4} - set(res.ranked["tp"])
    assert set(gone) == missing and missing
    for d in gone.values():
        assert d["not_evaluated"] > 0 and d["rule"].startswith("not evaluated: the search stopped at max_configs=1")


def test_a_cap_that_does_not_bind_changes_nothing():
    full = wattcast.search(*JOB, **SPACE)
    # more candidates than the cap (the rejected ones), but every valid one is evaluated: the same frames, same order
    assert len(full.ranked) + len(full.rejected) > len(full.ranked)
    same = wattcast.search(*JOB, max_configs=_evaluated(full), **SPACE)
    pd.testing.assert_frame_equal(full.ranked, same.ranked)
    pd.testing.assert_frame_equal(full.rejected.sort_values(list(full.rejected.columns)).reset_index(drop=True),
                                  same.rejected.sort_values(list(same.rejected.columns)).reset_index(drop=True))
    assert not [w for w in same.warnings if "max_configs" in w]


def test_evaluation_order_is_the_candidate_order_under_the_cap_and_spread_over_it_beyond():
    assert list(evaluation_order(10, 10)) == list(range(10))
    order = evaluation_order(1000, 100)
    assert sorted(order) == list(range(1000))
    first = np.sort(order[:100])
    assert first.max() - first.min() > 900 and np.diff(first).max() <= 20  # no stretch of the enumeration left out


def test_cli_json_and_table_carry_the_cap_warning():
    args = ["search", "--model", "gpt2", "--cluster", "dgx-a100", "--gpus", "8", "--batch", "32", "--seq", "1024",
            "--max-configs", "40"]
    out = CliRunner().invoke(app, args + ["--json"])
    assert out.exit_code == 0, out.output
    body = json.loads(out.stdout[out.stdout.index("{"):])
    assert any("valid candidates not evaluated (max_configs=40)" in w for w in body["warnings"])
    table = CliRunner().invoke(app, args)
    assert "valid candidates not evaluated (max_configs=40)" in table.output


def test_the_default_cap_covers_the_search_speed_benchmark_space():
    import inspect

    from wattcast.planning.search import search

    # benchmarks/bench_search_speed.py's GPT-3 175B space has 9,736 valid candidates: the old default (5,000) cut it
    assert inspect.signature(search).parameters["max_configs"].default == 20000
    out = CliRunner().invoke(app, ["search", "--help"])
    assert "20000" in out.output


def test_a_sweep_record_carries_the_cap_warning(tmp_path):
    from wattcast.sweep import read_sweep, run_sweep, search_keys

    spec = dict(models=["gpt2"], clusters=["DGX-A100"], gpus=[8], batch=32, seq=1024, max_configs=40,
                space=dict(tp=[1, 2, 4]))
    df = read_sweep(run_sweep(spec, tmp_path / "s.parquet", workers=0).output)
    notes = search_keys(df["warnings"].iloc[0])
    assert any("valid candidates not evaluated (max_configs=40)" in w for w in notes)


def test_workers_cut_a_capped_search_as_one_process_does(monkeypatch):
    import wattcast.planning.search as search_mod

    monkeypatch.setattr(search_mod, "PARALLEL_MIN_CANDIDATES", 1)
    one = wattcast.search(*JOB, max_configs=40, **SPACE)
    two = wattcast.search(*JOB, max_configs=40, tp=(1, 2, 4), workers=2)
    search_mod.shutdown_workers()
    pd.testing.assert_frame_equal(one.ranked, two.ranked)
    assert one.warnings == two.warnings and one.dropped_values == two.dropped_values
