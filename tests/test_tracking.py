"""MLflow logging: concurrent jobs on a fresh store, and every run tagged with the code's git commit."""

from __future__ import annotations

import subprocess
import sys

from conftest import cli_env

CODE = ("import sys; from wattcast.training.tracking import log_run; "
        "print(log_run(sys.argv[1], experiment='e', params={'a': 1}, metrics={'m': 1.0}, tags={'k': 'v'}))")


def test_three_concurrent_runs_on_a_fresh_store(tmp_path):
    store = tmp_path / "mlruns"
    ps = [subprocess.Popen([sys.executable, "-c", CODE, str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=cli_env(None)) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in ps]
    assert [p.returncode for p in ps] == [0, 0, 0], [o[1][-2000:] for o in outs]
    ids = {o[0].strip().splitlines()[-1] for o in outs}
    assert len(ids) == 3
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["e"])
    assert len(runs) == 3
    commit = runs["tags.mlflow.source.git.commit"].iloc[0]
    assert commit == "unknown" or len(commit) == 40
