"""wattcast sweep prints its failed tasks in one loop: those whose part says status error first (with their place),
then those whose run raised or whose workers were lost, each in SweepOutcome.failed_tasks' order."""

from __future__ import annotations

from pathlib import Path

import wattcast.cli as cli
import wattcast.sweep as sweep
from wattcast.sweep import SweepOutcome

from conftest import flat


def test_errored_tasks_are_said_first_then_the_failed_ones(tmp_path, monkeypatch, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [gpt2]\nclusters: [DGX-A100]\ngpus: [8]\nbatch: 16\nseq: 128\n")
    failed = [dict(task_id="t1", model="gpt2", cluster="DGX-A100", gpus=8, region="", status="failed", error="lost"),
              dict(task_id="t2", model="gpt2", cluster="DGX-A100", gpus=16, region="FR", status="error", error="boom"),
              dict(task_id="t3", model="gpt2", cluster="DGX-H100", gpus=8, region="", status="error", error="bang")]
    monkeypatch.setattr(sweep, "run_sweep", lambda *a, **k: SweepOutcome(Path(tmp_path / "o"), 3, 0, 0, failed))
    # standalone_mode=False: click returns the typer.Exit code instead of exiting
    assert cli.app(["sweep", str(spec), "--output", str(tmp_path / "o")], standalone_mode=False) == 1
    lines = [ln for ln in flat(capsys.readouterr().err).split("task ") if ln.startswith("t")]
    assert lines[:3] == ["t2 (gpt2 on 16 x DGX-A100, FR) ended with status error: boom ",
                         "t3 (gpt2 on 8 x DGX-H100) ended with status error: bang ", "t1 failed: lost"]
