"""How fast `wattcast.predict` is: building and costing a training step of big models on one device.

Targets (issue 3): GPT-3 175B (96 layers) built and predicted in under 1 s; the 2.7B GPT through ONNX.
Run: ``python benchmarks/bench_predict.py [--onnx]`` (``--onnx`` exports a 2.7B GPT-3-style model with
torch.onnx on the meta device first; slow, needs torch + onnxscript).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import wattcast
from wattcast.data.catalog import resolve_device
from wattcast.featurize.workload import StepOptions, cached_path_graph, step_graph
from wattcast.models.kernel_bundle import load_bundle
from wattcast.simulate.single_device import predict_graph


def _time(fn, repeat: int = 5) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--onnx", action="store_true", help="also time the 2.7B GPT through an ONNX export")
    args = ap.parse_args()
    spec = resolve_device("A100-SXM4-80GB")
    bundle = load_bundle()
    opts = StepOptions(batch=1, seq=2048, mode="train", dtype="bf16")
    for name in ("gpt3_175b", "gpt3_2.7b", "llama2_70b"):
        cached_path_graph.cache_clear()
        t0 = time.perf_counter()
        g = step_graph(name, opts)
        t_build = time.perf_counter() - t0
        t1 = time.perf_counter()
        r = predict_graph(g, spec, bundle)
        t_pred = time.perf_counter() - t1
        t_warm, _ = _time(lambda: wattcast.predict(name, spec, batch=1, seq=2048, dtype="bf16"))
        print(f"{name:12s} {len(g):6,d} kernels  cold: build {t_build * 1e3:7.1f} ms + predict {t_pred * 1e3:6.1f} ms "
              f"= {(t_build + t_pred) * 1e3:7.1f} ms   warm call {t_warm * 1e3:6.1f} ms   step {r.step_time_ms / 1e3:8.2f} s")
    # a search loop: batch x seq x dtype x recompute on one model
    t0 = time.perf_counter()
    n = 0
    for b in (1, 2, 4, 8):
        for s in (512, 1024, 2048):
            for dt in ("bf16", "fp32"):
                for rc in ("none", "full"):
                    wattcast.predict("gpt3_2.7b", spec, batch=b, seq=s, dtype=dt, recompute=rc)
                    n += 1
    dt_s = time.perf_counter() - t0
    print(f"search loop: {n} distinct configurations of gpt3_2.7b in {dt_s:.2f} s ({n / dt_s:.1f} configs/s, cold graphs)")
    if args.onnx:
        import torch

        from wattcast.featurize.onnx import graph_from_onnx

        sys_path = Path(__file__).resolve().parents[1] / "examples"
        import sys

        sys.path.insert(0, str(sys_path))
        from nanogpt import GPT, GPTConfig

        with torch.device("meta"):
            model = GPT(GPTConfig(n_layer=32, n_head=32, n_embd=2560, vocab_size=50257, block_size=2048))
        with tempfile.TemporaryDirectory() as tmp:
            f = Path(tmp) / "gpt3_2.7b.onnx"
            import onnx
            import onnx_ir

            t0 = time.perf_counter()
            # a meta-device model has no weight values: export the program, drop the (absent) initialiser
            # values and save; the weights remain declared by shape, which is all the importer reads
            prog = torch.onnx.export(model, (torch.zeros(1, 2048, dtype=torch.long, device="meta"),), dynamo=True,
                                     optimize=False)
            for v in prog.model.graph.initializers.values():
                v.const_value = None
            onnx.save(onnx_ir.serde.serialize_model(prog.model), str(f))
            t_export = time.perf_counter() - t0
            t0 = time.perf_counter()
            g = graph_from_onnx(f, batch=1, seq=2048)
            t_import = time.perf_counter() - t0
            t0 = time.perf_counter()
            r = predict_graph(g, spec, bundle)
            print(f"ONNX 2.7B: export {t_export:.1f} s (torch, not wattcast), import {t_import * 1e3:.0f} ms, "
                  f"predict {1e3 * (time.perf_counter() - t0):.0f} ms, {len(g):,} kernels, {g.param_count:,} params")


if __name__ == "__main__":
    main()
