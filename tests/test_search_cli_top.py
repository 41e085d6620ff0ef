"""``search --json`` keeps ``--top`` rows in ``ranked`` (it printed every ranked row; ``ranked_total`` counts them)."""

import json

from typer.testing import CliRunner

from wattcast.cli import app

ARGS = ["search", "--model", "gpt2", "--cluster", "dgx-a100", "--gpus", "8", "--batch", "32", "--seq", "1024"]


def _json(out) -> dict:
    return json.loads(out.stdout[out.stdout.index("{"):])


def test_json_honours_top_and_counts_the_rest():
    full = _json(CliRunner().invoke(app, ARGS + ["--json", "--top", "1000000"]))
    top = _json(CliRunner().invoke(app, ARGS + ["--json", "--top", "3"]))
    assert len(top["ranked"]) == 3 and top["ranked"] == full["ranked"][:3]
    assert top["ranked_total"] == full["ranked_total"] == len(full["ranked"]) > 3
    assert top["rejected"] == full["rejected"]  # still every candidate


def test_json_without_top_keeps_every_row():
    every = _json(CliRunner().invoke(app, ARGS + ["--json"]))
    assert len(every["ranked"]) == every["ranked_total"] > 10
