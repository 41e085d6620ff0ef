"""The GPU terms of ML.ENERGY v2's decode rows that ``training/serving_fit.py`` fits the serving host on, and the
command that fits and writes ``models/artifacts/serving_vllm.json``.

training/ never imports the simulator (tests/test_layers.py); the fit needs wattcast's own prediction of each row's
GPU decode step and amortised prefill, so they are predicted here (validation/ sits above simulate/) and handed to
the fit as numbers.

    PYTHONPATH=... WATTCAST_DATA=... python -m wattcast.validation.serving_terms [--fit-half A] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from wattcast.training.serving_fit import (MODELS, TP_EVAL_MODELS, TP_ONLY_MODELS, artifact, data_root, fit_tp_sync,
                                           rows, split_fit, tp_rows)

#: the node of ML.ENERGY v2's A100 rows: an 8-GPU NVSwitch server ASSUMED (the data does not name it;
#: SOURCE-mlenergy-inference-power.md), the DGX A100 preset with the rows' A100-SXM4-40GB
TP_CLUSTER = "dgx-a100"


def gpu_terms(m: pd.DataFrame) -> pd.DataFrame:
    """Per row, what wattcast predicts without the host: the bare KV-cached decode step (``gpu_step_ms``) and the
    amortised prefill (``prefill_ms``), read from ``serving="vllm"``'s ``meta["serving"]`` (neither depends on the
    host constants), bf16, flash attention, eager kernels."""
    import wattcast

    out = []
    for r in m.itertuples():
        res = wattcast.predict(MODELS[r.Model], r.device, batch=int(r.batch), seq=1, mode="inference", dtype="bf16",
                               attention="flash", kv_context=int(r.context), serving="vllm",
                               prompt_tokens=int(r.prompt_tokens), output_tokens=int(r.output_tokens))
        s = res.meta["serving"]
        out.append((s["gpu_step_ms"], s["prefill_ms"], s["prefill_requests"], res.fits))
    t = pd.DataFrame(out, columns=["gpu_step_ms", "prefill_ms", "prefill_requests", "fits"], index=m.index)
    return pd.concat([m, t], axis=1)


def tp_terms(m: pd.DataFrame) -> pd.DataFrame:
    """Per TP row (``tp_rows``), the served iteration of one node's TP group WITHOUT the engine's TP cost
    (``pred_ms``: ms_per_token less ``meta["serving"]["tp_sync_ms"]``, which the fit replaces), its terms and
    ``n_layers``."""
    import wattcast

    out = []
    for r in m.itertuples():
        model = {**MODELS, **TP_ONLY_MODELS, **TP_EVAL_MODELS}[r.Model]
        res = wattcast.predict_cluster(model, TP_CLUSTER, device=r.device, gpus=int(r.tp), tp=int(r.tp),
                                       batch=int(r.batch), seq=1, dtype="bf16", attention="flash",
                                       kv_context=int(r.context), serving="vllm", prompt_tokens=int(r.prompt_tokens),
                                       output_tokens=int(r.output_tokens))
        s, tpi = res.meta["serving"], res.meta["tensor_parallel"]
        out.append((res.ms_per_token - s["tp_sync_ms"], s["gpu_step_ms"], tpi["collective_ms"], s["host_ms"],
                    s["prefill_ms"], s["tp_sync_ms"], res.ms_per_token, int(res.meta["n_layers"]), res.fits))
    t = pd.DataFrame(out, index=m.index, columns=["pred_ms", "gpu_step_ms", "collective_ms", "host_ms", "prefill_ms",
                                                  "tp_sync_ms", "served_ms", "n_layers", "fits"])
    return pd.concat([m, t], axis=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    ap.add_argument("--fit-half", default="A", choices=["A", "B"])
    ap.add_argument("--tp-fit-half", default="A", choices=["A", "B"])
    ap.add_argument("--out", default=None, help="write the artifact here (e.g. models/artifacts/serving_vllm.json)")
    a = ap.parse_args()
    root = data_root(a.data)
    t = gpu_terms(rows(root))
    res = split_fit(t, a.fit_half)
    print(f"fit on half {a.fit_half} ({', '.join(m.split('/')[-1] for m in res['fit_models'])}): "
          f"host = {res['host_fixed_ms']:.3f} ms + {1e3 * res['host_per_seq_ms']:.1f} us x batch")
    print("fitting half:\n" + res["fit"].round(2).to_string(index=False))
    print("evaluation half:\n" + res["evaluation"].round(2).to_string(index=False))
    tp = fit_tp_sync(tp_terms(tp_rows(root)), a.tp_fit_half)
    print(f"TP fit on half {a.tp_fit_half} ({', '.join(m.split('/')[-1] for m in tp['fit_models'])}): "
          f"tp_sync = {tp['tp_sync_ms_per_layer_log2_tp']:.4f} ms x layers x log2(tp)")
    for k in ("fit", "evaluation", "never_fitted"):
        if k in tp:
            print(f"TP {k}:\n" + tp[k].round(2).to_string(index=False))
    if a.out:
        Path(a.out).write_text(json.dumps(artifact(res, t, root, tp), indent=1) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
