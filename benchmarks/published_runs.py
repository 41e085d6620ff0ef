"""Large published training runs, predicted end to end: throughput, time and energy vs what was published.

1. Megatron-LM weak scaling (Narayanan et al. SC21 / Megatron-LM README, `published/training_throughput.csv`):
   GPT 1.7B-1T on 32-3,072 A100-80GB (DGX A100), FP16, activation recomputation, TP/PP/DP as published;
   the published TFLOP/s per GPU count recomputation (hardware FLOPs), so they are compared with
   wattcast's HFU x peak. Unpublished details are assumptions, stated: micro-batch 1, no interleaving,
   heads = hidden / 128 where missing, vocabulary 51,200, Megatron's fused kernels.
2. GPT-3 175B (Patterson et al. 2021 Table 4): 10,000 V100 for 14.8 days (355.2 h), 1,287 MWh at PUE 1.1,
   330 W per GPU all-in. Predicted with an assumed Megatron-style layout on DGX-1 (V100) nodes: TP 8, PP 16,
   DP 78 (9,984 GPUs), global batch 1,560 x 2,048 tokens (GPT-3's 3.2 M tokens), 300 B tokens, FP16.

Run: python3 benchmarks/published_runs.py [--data PATH] [--rows N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from wattcast.data.kernel_datasets import resolve_data_root
from wattcast.simulate.distributed import predict_distributed
from wattcast.simulate.lifecycle import footprint_from_step
from wattcast.simulate.parallel import ParallelConfig


def megatron_weak_scaling(root, rows: int | None = None) -> pd.DataFrame:
    df = pd.read_csv(resolve_data_root(root) / "published" / "training_throughput.csv")
    df = df[df["model"].astype(str).str.contains("Megatron weak scaling") & (df["measured_metric"] == "tflops_per_gpu")]
    if rows:
        df = df.head(rows)
    out = []
    for r in df.itertuples(index=False):
        h, L = int(r.hidden), int(r.n_layers)
        heads = int(r.n_heads) if np.isfinite(r.n_heads) else h // 128
        cfg = {"model_type": "gpt2", "n_embd": h, "n_head": heads, "n_layer": L, "n_positions": int(r.seq_len),
               "vocab_size": int(r.vocab), "activation_function": "gelu", "_name_or_path": str(r.model)}
        par = ParallelConfig(gpus=int(r.n_gpus), tp=int(r.tp), pp=int(r.pp), dp=int(r.dp), micro_batch=1, recompute="full")
        t0 = time.time()
        p = predict_distributed(cfg, "DGX-A100", gpus=int(r.n_gpus), batch=int(r.global_batch), seq=int(r.seq_len), parallel=par,
                                dtype="fp16", attention="eager", framework="megatron")
        hw_tflops = p.hfu * 312.0  # A100 dense FP16 peak (the catalog's figure)
        out.append(dict(model=r.model, gpus=int(r.n_gpus), tp=int(r.tp), pp=int(r.pp), dp=int(r.dp),
                        measured_tflops_per_gpu=float(r.measured_value), predicted_tflops_per_gpu=hw_tflops,
                        error_pct=100 * (hw_tflops - r.measured_value) / r.measured_value, step_s=p.step_time_ms / 1e3,
                        memory_gb=p.memory_gb, fits=p.fits, seconds=time.time() - t0))
    return pd.DataFrame(out)


def gpt3_v100() -> dict:
    cfg = "gpt3_175b"
    gpus, batch, seq = 9984, 1560, 2048
    par = ParallelConfig(gpus=gpus, tp=8, pp=16, dp=78, micro_batch=1, recompute="full")
    p = predict_distributed(cfg, "DGX-1-V100", gpus=gpus, batch=batch, seq=seq, parallel=par, dtype="fp16",
                            attention="eager", framework="megatron")
    fp = footprint_from_step(p.device, gpus, step_time_ms=p.step_time_ms, gpu_power_w=p.avg_power_w, tokens=300e9,
                             tokens_per_step=batch * seq, flops_per_step=p.flops, pue=1.1, grid_kgco2e_per_kwh=0.429)
    return dict(step_s=p.step_time_ms / 1e3, mfu=p.mfu, avg_gpu_power_w=p.avg_power_w, hours=fp.hours,
                published_hours=355.2, energy_mwh=fp.energy_mwh, published_energy_mwh=1287.0,
                operational_tco2e=fp.operational_tco2e, published_tco2e=552.1, memory_gb=p.memory_gb, fits=p.fits)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=None)
    ap.add_argument("--rows", type=int, default=None)
    a = ap.parse_args()
    w = megatron_weak_scaling(a.data, a.rows)
    with pd.option_context("display.width", 200, "display.float_format", "{:,.1f}".format):
        print(w.to_string(index=False))
    print(f"Megatron weak scaling: mean |error| {w['error_pct'].abs().mean():.1f}%, max {w['error_pct'].abs().max():.1f}%")
    g = gpt3_v100()
    print("\nGPT-3 175B on ~10,000 V100 (assumed layout TP8 PP16 DP78):")
    for k, v in g.items():
        print(f"  {k}: {v:,.2f}" if isinstance(v, float) else f"  {k}: {v}")
    print(f"  time {100 * (g['hours'] - g['published_hours']) / g['published_hours']:+.1f}% vs published, "
          f"energy {100 * (g['energy_mwh'] - g['published_energy_mwh']) / g['published_energy_mwh']:+.1f}%")


if __name__ == "__main__":
    main()
