"""``--objective energy`` without ``--tokens`` shows the column it ranks by (the step's energy, J); the sweep's best
rows (``summary``, so ``sweep --json``'s ``best``) carry ``energy_j``."""

import json

from typer.testing import CliRunner

from wattcast.cli import app

ARGS = ["search", "--model", "gpt2", "--cluster", "dgx-a100", "--gpus", "8", "--batch", "32", "--seq", "1024"]


def _json(out) -> dict:
    return json.loads(out.stdout[out.stdout.index("{"):])


def test_energy_objective_without_tokens_prints_the_step_energy_it_ranks_by():
    out = CliRunner().invoke(app, ARGS + ["--objective", "energy", "--top", "3"])
    assert out.exit_code == 0, out.output
    assert "step J" in out.output
    rows = _json(CliRunner().invoke(app, ARGS + ["--objective", "energy", "--json", "--top", "3"]))["ranked"]
    shown = [f"{r['energy_j']:,.0f}" for r in rows]
    assert all(s in out.output for s in shown)
    assert [r["energy_j"] for r in rows] == sorted(r["energy_j"] for r in rows)
    assert "step J" not in CliRunner().invoke(app, ARGS + ["--top", "3"]).output  # time: as before


def test_sweep_best_rows_carry_the_step_energy():
    import pandas as pd

    from wattcast.sweep import summary

    frame = pd.DataFrame([dict(model="gpt2", cluster="DGX-A100", gpus=8, region="", status="ok", strategy="s",
                               step_time_ms=1.0, energy_j=5.0, rank=1, error="")])
    assert summary(frame)["energy_j"].tolist() == [5.0]
