#!/usr/bin/env python3
"""Wall time of importing a 2.7B-parameter nanoGPT with ``graph_from_module`` (torch.export on meta).

    python3 benchmarks/bench_torch_export.py                     # GPT 2.7B (32 x 2560, vocab 50257), B=8 S=2048
    python3 benchmarks/bench_torch_export.py --attention sdpa --batch 1 --seq 1024
    python3 benchmarks/bench_torch_export.py --layers 12 --embd 768 --heads 12   # GPT-2 small

Prints the time to build the model on the meta device, the ``torch.export`` time, the time to walk the
exported graph into an OpGraph, the FX/graph node counts, the parameter count, forward FLOPs and any
unmapped ops. No weights are allocated: the model is built under ``torch.device("meta")``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from nanogpt import GPT, GPTConfig  # noqa: E402

from wattcast.featurize.torch_import import graph_from_module  # noqa: E402
from wattcast.featurize.training_graph import training_graph  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--embd", type=int, default=2560)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--block", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--attention", choices=("eager", "sdpa"), default="eager")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--train", action="store_true", help="export in training mode and derive the training graph")
    args = ap.parse_args()

    cfg = GPTConfig(n_layer=args.layers, n_head=args.heads, n_embd=args.embd, vocab_size=args.vocab,
                    block_size=args.block, attention=args.attention)
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = GPT(cfg)
    build_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    g = graph_from_module(model, batch=args.batch, seq=args.seq, dtype=args.dtype, train=args.train)
    total_s = time.perf_counter() - t1
    fwd = g.nodes
    print(f"model: nanoGPT {args.layers} x {args.embd} ({args.heads} heads), vocab {args.vocab}, attention={args.attention}")
    print(f"parameters: {g.param_count:,} ({g.param_count / 1e9:.2f}B); batch {args.batch} x seq {args.seq}, {g.meta['dtype']}")
    print(f"build on meta:       {build_s:7.2f} s")
    print(f"torch.export:        {g.meta['export_seconds']:7.2f} s")
    print(f"graph walk:          {g.meta['import_seconds']:7.2f} s")
    print(f"graph_from_module:   {total_s:7.2f} s  (export + walk)")
    by_class = {k: int(v) for k, v in fwd["op_class"].value_counts().items()}
    print(f"FX nodes: {g.meta['fx_nodes']}, kernels: {len(fwd)} forward {by_class}")
    print(f"forward FLOPs: {fwd['flops'].sum():.4g}; unmapped ops: {g.meta['unmapped_ops'] or 'none'}; "
          f"approximated: {g.meta['approximated_ops'] or 'none'}")
    if args.train:
        t2 = time.perf_counter()
        tg = training_graph(g, recompute="selective")
        print(f"training_graph:      {time.perf_counter() - t2:7.2f} s  ({len(tg.nodes)} kernels)")


if __name__ == "__main__":
    main()
