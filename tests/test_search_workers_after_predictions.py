"""A search with workers > 1 after LightGBM predictions in the same process: the forked workers must not enter the
parent's OpenMP thread pool (GNU OpenMP's pool does not survive fork: a worker waited forever in booster.predict, and
the search with it). The workers predict single-threaded (models.kernel_surrogates.single_threaded_predictions)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import wattcast.planning.search as S
    S.PARALLEL_MIN_CANDIDATES = 1  # the pool even for a small search
    kw = dict(framework="hf", tp=(1, 2), pp=(1,), zero=(3,), micro_batch=(1, 2), sp=(False,), recompute=("none",))
    S.search("llama3_8b", "DGX-H100", 16, 32, 2048, workers=1, **kw)  # LightGBM runs in this process first
    S.search("llama3_8b", "DGX-H100", 16, 32, 2048, workers=2, **kw)
    kw = dict(framework="megatron", tp=(2,), pp=(1, 2), zero=(1,), micro_batch=(1,), sp=(True,), recompute=("none",))
    S.search("llama3_8b", "DGX-H100", 16, 32, 2048, workers=1, **kw)
    a = S.search("llama3_8b", "DGX-H100", 16, 32, 2048, workers=2, **kw)  # graphs the workers have not costed
    S.shutdown_workers()
    print("done", len(a.ranked))
""")


def test_a_pooled_search_after_predictions_in_the_parent_finishes():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().startswith("done")


def test_workers_predict_single_threaded_and_this_process_does_not():
    from wattcast.models import kernel_surrogates as ks

    assert ks.PREDICT_THREADS[0] == 0  # the caller's process: OpenMP's default
    old = ks.PREDICT_THREADS[0]
    try:
        ks.single_threaded_predictions()
        assert ks.PREDICT_THREADS[0] == 1
    finally:
        ks.PREDICT_THREADS[0] = old
