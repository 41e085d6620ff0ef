#!/usr/bin/env python3
"""Sweep speed: the same sweep on a Dask LocalCluster (or a local Ray) with 1 worker and with 2 (and in-process), printed.

    python3 benchmarks/bench_sweep.py [--gpus 8 16 32 64] [--max-configs 60] [--models gpt2 llama3_8b] [--batch 256]
                                      [--backend dask|ray|both]

``--backend ray`` needs the optional extra (``pip install "wattcast[ray]"``); each Ray run starts and stops its own
local Ray (``ray.init`` with 1 or 2 CPUs, one actor per CPU), so its time includes that start-up.

GPT-2 and Llama 3 8B on DGX-A100 and DGX-H100 at each GPU count: one strategy search per task. Each run writes to a
fresh folder; the Dask and Ray runs include starting the cluster (workers import wattcast and build their graphs once);
'first done at' shows that start-up plus one task, and 'after the first' the rate once running.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from wattcast.sweep import run_sweep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--max-configs", type=int, default=60)
    ap.add_argument("--models", nargs="+", default=["gpt2", "llama3_8b"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--backend", choices=["dask", "ray", "both"], default="dask",
                    help="dask (default), ray (needs the ray extra) or both; in-process always runs as the reference")
    a = ap.parse_args()
    spec = dict(models=a.models, clusters=["DGX-A100", "DGX-H100"], gpus=a.gpus, batch=a.batch, seq=2048,
                max_configs=a.max_configs)
    backends = ["dask", "ray"] if a.backend == "both" else [a.backend]
    runs = [("in-process", "dask", 0)] + [(f"{b}, {w} worker{'s' if w > 1 else ''}", b, w) for b in backends for w in (1, 2)]
    times = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, backend, workers in runs:
            t0 = time.time()
            stamps: list = []  # when each task finished, from the start (the first includes the backend's start-up)
            r = run_sweep(spec, Path(tmp) / label.replace(" ", "_").replace(",", ""), workers=workers, backend=backend,
                          progress=lambda d, n: stamps.append(time.time() - t0) if d else None)
            times[label] = time.time() - t0
            if r.failed_tasks:
                raise SystemExit(f"{label}: {len(r.failed_tasks)} task(s) failed: {r.failed_tasks[:3]}")
            after = (f"; after the first: {(r.ran - 1) / (stamps[-1] - stamps[0]):.2f} tasks/s"
                     if r.ran > 1 and stamps[-1] > stamps[0] else "")
            print(f"{label:16s} {r.ran} tasks in {times[label]:6.1f} s ({r.ran / times[label]:.2f} tasks/s; first done at "
                  f"{stamps[0]:.1f} s{after})", flush=True)
    for b in backends:
        print(f"{b}: speed-up, 2 workers vs 1: {times[f'{b}, 1 worker'] / times[f'{b}, 2 workers']:.2f}x")


if __name__ == "__main__":
    main()
