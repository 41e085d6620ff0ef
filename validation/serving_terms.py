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

from wattcast.training.serving_fit import MODELS, artifact, data_root, rows, split_fit


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    ap.add_argument("--fit-half", default="A", choices=["A", "B"])
    ap.add_argument("--out", default=None, help="write the artifact here (e.g. models/artifacts/serving_vllm.json)")
    a = ap.parse_args()
    root = data_root(a.data)
    t = gpu_terms(rows(root))
    res = split_fit(t, a.fit_half)
    print(f"fit on half {a.fit_half} ({', '.join(m.split('/')[-1] for m in res['fit_models'])}): "
          f"host = {res['host_fixed_ms']:.3f} ms + {1e3 * res['host_per_seq_ms']:.1f} us x batch")
    print("fitting half:\n" + res["fit"].round(2).to_string(index=False))
    print("evaluation half:\n" + res["evaluation"].round(2).to_string(index=False))
    if a.out:
        Path(a.out).write_text(json.dumps(artifact(res, t, root), indent=1) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
