"""The one name-suggestion helper (data/checks.py) behind every "unknown name" message."""

from __future__ import annotations

import difflib

from wattcast.data.checks import close_names, did_you_mean


def test_plain_close_names_are_difflibs():
    names = ["models", "clusters", "gpus", "batch", "seq", "regions"]
    for q in ("gpu", "regoins", "bach", "zzzz", "model"):
        assert close_names(q, names, n=2, cutoff=0.6) == difflib.get_close_matches(q, names, n=2, cutoff=0.6)


def test_spellings_report_their_name_once_with_its_best_score():
    spellings = {"a100sxm440gb": "A100-SXM4-40GB", "a100": "A100-SXM4-40GB", "a10": "A10", "mi300x": "MI300X",
                 "mi100": "MI100"}
    got = close_names("mi300", spellings, n=5, cutoff=0.0, substring_bonus=0.5, report=spellings)
    assert got[0] == "MI300X" and len(got) == len(set(got)) == 4
    # without the substring bonus MI100 ("mi100" vs "mi300": 0.8) and MI300X (0.909) keep difflib's order
    assert close_names("mi300", spellings, n=2, cutoff=0.0, report=spellings) == ["MI300X", "MI100"]
    assert close_names("mi300", spellings, n=5, cutoff=0.95, report=spellings) == []


def test_did_you_mean_fills_the_template_or_says_nothing():
    assert did_you_mean("gpu", ["gpus", "batch"], " (did you mean {}?)", quote=True, n=1) == " (did you mean 'gpus'?)"
    assert did_you_mean("dgx_h10", ["dgx-h100", "dgx-a100"], n=3, cutoff=0.3) == "; did you mean dgx-h100, dgx-a100?"
    assert did_you_mean("zzzz", ["gpus", "batch"]) == ""
