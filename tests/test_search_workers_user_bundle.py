"""A pooled search (workers > 1) given a user's model folder: each forked worker loads that folder's LightGBM models
itself in an OpenMP parallel loop (``Booster(model_str=...)`` parses its trees so), and GNU libgomp's state does not
survive fork: the worker hung forever in
``models/collectives.py`` load (audit 57c: ``wattcast search ... --models DIR`` and ``WATTCAST_MODELS=DIR`` never
returned; ``--workers 1`` took 14 s). The worker initializer (models.kernel_surrogates.single_threaded_predictions) now
caps LightGBM at one thread (``LGBM_SetMaxThreads``), model loading included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys
    import wattcast
    import wattcast.planning.search as S
    S.PARALLEL_MIN_CANDIDATES = 1  # the pool even for a small search
    folder = sys.argv[1]
    kw = dict(framework="hf", tp=(1, 2), pp=(1,), zero=(1,), micro_batch=(1, 2), sp=(False,), recompute=("none",))
    a = S.search("gpt2", "DGX-A100", 8, 16, 1024, workers=2, models=folder, **kw)
    b = S.search("gpt2", "DGX-A100", 8, 16, 1024, workers=1, models=folder, **kw)
    S.shutdown_workers()
    same = list(a.ranked["strategy"]) == list(b.ranked["strategy"]) and \\
        (a.ranked["step_time_ms"].to_numpy() == b.ranked["step_time_ms"].to_numpy()).all()
    print("done", len(a.ranked), same)
""")


def test_a_pooled_search_with_a_user_model_folder_finishes_and_matches_one_process(tmp_path):
    from wattcast.models.kernel_bundle import shipped_folder

    folder = tmp_path / "bundle"
    shutil.copytree(shipped_folder(), folder)
    assert (folder / "collective_manifest.json").is_file()  # the workers load its LightGBM collective model
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(folder)], capture_output=True, text=True, timeout=90,
                       env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.strip().splitlines()[-1].split()
    assert out[0] == "done" and int(out[1]) > 0 and out[2] == "True", r.stdout
