"""Validation (not a fit): predicted time per output token of a KV-cached decode step against ML.ENERGY v2's measured
'Avg TPOT (s)' (vLLM on A100-SXM4-40GB; the v2 table has no H100 rows), single-GPU rows (TP 1, PP 1) of the models
whose architecture wattcast builds exactly.

Source: $WATTCAST_DATA/power/mlenergy/v2_a100_h100_configs.csv (SOURCE-mlenergy-inference-power.md: a flattening of
github.com/ml-energy/leaderboard-v2 at c3af7f31, Apache-2.0).

Per row: batch = round('Avg BS (reqs)'), context = the task's prompt tokens (training/power.py PROMPT_TOKENS: chat 256,
code 128) + half of 'Avg Output Tokens'; one decode step (seq 1) with ``kv_context`` = that context, bf16, flash
attention. "before" is the bare forward the tool ran until now (no KV cache, all-position logits as it was). Prints
MAPE and signed bias (mean of predicted / measured - 1) per setting: eager (Hugging Face's kernels, the default) and
``compile=True`` (fused elementwise chains: the nearest the tool has to vLLM's fused kernels and CUDA graphs).

    PYTHONPATH=... WATTCAST_DATA=... python benchmarks/bench_mlenergy_decode.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

import wattcast
from wattcast.training.power import PROMPT_TOKENS

_CONFIGS = Path(wattcast.__file__).resolve().parent.parent / "featurize" / "hf_configs"


def _cfg(name: str, **changes) -> dict:
    cfg = json.loads((_CONFIGS / f"{name}.json").read_text())
    cfg.update(changes)
    return cfg


#: the v2 models wattcast builds exactly: a built-in name, or a built-in config with the public config.json's
#: differences (Hugging Face Hub config.json of each model)
MODELS = {
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama3_8b",  # same shapes as Llama 3 8B
    "mistralai/Mistral-7B-Instruct-v0.3": _cfg("llama2_7b", num_key_value_heads=8, intermediate_size=14336,
                                               vocab_size=32768, max_position_embeddings=32768, rope_theta=1e6),
    "codellama/CodeLlama-7b-hf": _cfg("llama2_7b", vocab_size=32016, max_position_embeddings=16384, rope_theta=1e6),
    "microsoft/Phi-3-mini-4k-instruct": "phi3_mini",
    "google/gemma-2-9b-it": "gemma2_9b",
    "google/codegemma-1.1-2b": "gemma_2b",  # CodeGemma 2B is Gemma 2B's architecture
}


def rows() -> pd.DataFrame:
    root = Path(os.environ.get("WATTCAST_DATA", "/work/shared/datasets"))
    m = pd.read_csv(root / "power" / "mlenergy" / "v2_a100_h100_configs.csv")
    m = m[m["_task"].isin(list(PROMPT_TOKENS)) & m["Model"].isin(list(MODELS)) & (m["TP"] == 1) & (m["PP"] == 1)]
    m = m[m["Avg TPOT (s)"].notna()].copy()
    m["device"] = m["GPU"].map({"NVIDIA A100-SXM4-40GB": "A100-SXM4-40GB", "NVIDIA H100 80GB HBM3": "H100-SXM5-80GB"})
    m["batch"] = np.maximum(np.rint(m["Avg BS (reqs)"].to_numpy(dtype=float)), 1).astype(int)
    m["context"] = np.rint(m["_task"].map(PROMPT_TOKENS).to_numpy(dtype=float)
                           + m["Avg Output Tokens"].to_numpy(dtype=float) / 2).astype(int)
    return m.sort_values(["Model", "batch"]).reset_index(drop=True)


def predict_ms(model, device, batch, context, *, kv: bool, compile: bool) -> tuple[float, bool]:
    kw = dict(batch=int(batch), seq=1, mode="inference", dtype="bf16", attention="flash", compile=compile)
    if kv:
        r = wattcast.predict(model, device, kv_context=int(context), **kw)
    else:
        r = wattcast.predict(model, device, logits="all", **kw)
    return r.step_time_ms, r.fits


def main() -> None:
    m = rows()
    out = []
    for _, r in m.iterrows():
        model = MODELS[r["Model"]]
        row = dict(model=r["Model"].split("/")[-1], task=r["_task"].split("/")[-1], batch=r["batch"],
                   context=r["context"], measured_ms=1e3 * float(r["Avg TPOT (s)"]))
        for label, kv, comp in (("before", False, False), ("after", True, False),
                                ("before_compile", False, True), ("after_compile", True, True)):
            ms, fits = predict_ms(model, r["device"], r["batch"], r["context"], kv=kv, compile=comp)
            row[label + "_ms"] = ms
            if kv and not comp:
                row["fits"] = fits
        out.append(row)
    t = pd.DataFrame(out)
    pd.set_option("display.width", 200)
    print(t.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    print()
    for label in ("before", "after", "before_compile", "after_compile"):
        ratio = t[label + "_ms"] / t["measured_ms"]
        print(f"{label:15s} rows {len(t):3d}  MAPE {100 * float(np.mean(np.abs(ratio - 1))):5.1f}%  "
              f"signed bias {100 * float(np.mean(ratio - 1)):+6.1f}%")


if __name__ == "__main__":
    main()
