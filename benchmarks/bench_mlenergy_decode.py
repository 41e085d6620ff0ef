"""Validation of time per output token (TPOT) against ML.ENERGY v2's measured 'Avg TPOT (s)' (vLLM on
A100-SXM4-40GB; the v2 table has no H100 rows), single-GPU rows (TP 1, PP 1) of the models whose architecture wattcast
builds exactly.

Source: $WATTCAST_DATA/power/mlenergy/v2_a100_h100_configs.csv (SOURCE-mlenergy-inference-power.md: a flattening of
github.com/ml-energy/leaderboard-v2 at c3af7f31, Apache-2.0). Rows, models and the split by model:
training/serving_fit.py.

Per row: batch = round('Avg BS (reqs)'), context = the task's prompt tokens (training/power.py PROMPT_TOKENS: chat 256,
code 128) + half of 'Avg Output Tokens'; one decode step (seq 1) with ``kv_context`` = that context, bf16, flash
attention. Columns: "before" is the bare forward (no KV cache, all-position logits); "after" the KV-cached GPU step
(nothing fitted); ``_compile`` the same with ``compile=True``; "serving" the step as a vLLM iteration
(``serving="vllm"``: the shipped host constants, fitted on half A's models only, + the amortised prefill of
'Avg Output Tokens'). Then both splits of the host fit (fit on one half of the models, evaluate on the other), with
MAPE and signed bias (mean of predicted / measured - 1) per model of the evaluation half. Logged to MLflow
(experiment ``mlenergy-decode``) unless ``--no-mlflow``.

Then the tensor-parallel rows (TP 2, 4 and 8, PP 1; training/serving_fit.py ``tp_rows``: the TP rows of the models
above, of ``TP_ONLY_MODELS`` and of ``TP_EVAL_MODELS``) with the SHIPPED host constants (no refit of the host) and the
TP engine cost (``tp_sync``, fitted on ``TP_HALVES`` A; ``nosync`` is the group without it; both splits of that fit are
printed, with the models of neither half, evaluation only): "before" is what wattcast did
with them before tensor-parallel serving: nothing (``predict_cluster`` took no ``kv_context``, ``predict --cluster``
refused ``--kv-context``; ``tp1`` shows the one-GPU step, TP ignored, for reference), "after" one node's TP group (``predict_cluster(..., cluster=TP_CLUSTER, device=the row's GPU,
gpus=tp, tp=tp, kv_context=, serving="vllm")``, simulate/tp_inference.py). MAPE and signed bias per model and TP.
``--tp-only`` runs that part alone.

    PYTHONPATH=... WATTCAST_DATA=... python benchmarks/bench_mlenergy_decode.py [--no-mlflow] [--tp-only]
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

import wattcast
from wattcast.simulate.serving import serving_constants
from wattcast.training.serving_fit import (HALVES, MODELS, TP_EVAL_MODELS, TP_HALVES, TP_ONLY_MODELS,  # noqa: F401
                                           errors, fit_tp_sync, rows, split_fit, tp_rows)
from wattcast.validation.serving_terms import TP_CLUSTER, gpu_terms, tp_terms

def predict_ms(model, device, batch, context, *, kv: bool, compile: bool) -> tuple[float, bool]:
    kw = dict(batch=int(batch), seq=1, mode="inference", dtype="bf16", attention="flash", compile=compile)
    if kv:
        r = wattcast.predict(model, device, kv_context=int(context), **kw)
    else:
        r = wattcast.predict(model, device, logits="all", **kw)
    return r.step_time_ms, r.fits


def tp_table() -> pd.DataFrame:
    """Per TP row: measured, the one-GPU serving step (tp1_ms, for reference: the rows' TP ignored), the served TP
    group's iteration (after_ms) with its terms."""
    out = []
    for r in tp_rows().itertuples():
        model = {**MODELS, **TP_ONLY_MODELS, **TP_EVAL_MODELS}[r.Model]
        kw = dict(batch=int(r.batch), seq=1, dtype="bf16", attention="flash", kv_context=int(r.context),
                  serving="vllm", prompt_tokens=int(r.prompt_tokens), output_tokens=int(r.output_tokens))
        one = wattcast.predict(model, r.device, mode="inference", **kw)
        res = wattcast.predict_cluster(model, TP_CLUSTER, device=r.device, gpus=int(r.tp), tp=int(r.tp), **kw)
        tpi, sv = res.meta["tensor_parallel"], res.meta["serving"]
        out.append(dict(model=r.Model.split("/")[-1], tp=int(r.tp), batch=int(r.batch), context=int(r.context),
                        output=int(r.output_tokens), measured_ms=r.measured_ms, tp1_ms=one.ms_per_token,
                        gpu_ms=sv["gpu_step_ms"], coll_ms=tpi["collective_ms"], host_ms=sv["exposed_host_ms"],
                        prefill_ms=sv["prefill_ms"], tp_sync_ms=sv["tp_sync_ms"],
                        nosync_ms=res.ms_per_token - sv["tp_sync_ms"], after_ms=res.ms_per_token,
                        half=r.half, mem_gb=res.memory_gb, fits=res.fits, Model=r.Model, n_layers=int(res.meta["n_layers"]),
                        measured=r.measured_ms))
    return pd.DataFrame(out)


def tp_summary(t: pd.DataFrame) -> pd.DataFrame:
    """MAPE and signed bias (%) of tp1_ms, nosync_ms (the TP group without the fitted TP engine cost) and after_ms per
    model and TP, over the TP fit's evaluation half (``TP_HALVES`` B: the shipped constant is fitted on A), over the
    models of neither half (``TP_EVAL_MODELS``) and over the 28 rows of the four TP models of both halves."""
    rows_ = []
    both = t[t["half"] != "eval"]
    for key, g in [*t.groupby(["model", "tp"]), (("evaluation half B", "-"), t[t["half"] == "B"]),
                   (("never fitted", "-"), t[t["half"] == "eval"]), (("all", "-"), both)]:
        d = dict(model=key[0], tp=key[1], rows=len(g))
        for label in ("tp1", "nosync", "after"):
            ratio = g[label + "_ms"] / g["measured_ms"] - 1
            d[f"{label}_mape_pct"] = 100 * float(np.mean(np.abs(ratio)))
            d[f"{label}_signed_pct"] = 100 * float(np.mean(ratio))
        rows_.append(d)
    return pd.DataFrame(rows_)


def print_tp(c: dict) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    t = tp_table()
    pd.set_option("display.width", 250)
    print(f"tensor-parallel rows (before: refused, no figure; evaluation only; shipped host constants {c['host_fixed_ms']:.3f} ms + "
          f"{1e3 * c['host_per_seq_ms']:.1f} us x batch, no refit; cluster {TP_CLUSTER} with the rows' GPU; TP engine cost {c['tp_sync_ms_per_layer_log2_tp']:.4f} ms x layers x "
          f"log2(tp), fitted on TP half A {', '.join(x.split('/')[-1] for x in TP_HALVES['A'])}):")
    print(t.drop(columns=["Model", "n_layers", "measured"]).to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    s = tp_summary(t)
    print(s.round(2).to_string(index=False))
    print()
    fits = {}
    for h in sorted(TP_HALVES):  # both splits of the TP engine cost (training/serving_fit.py fit_tp_sync), by model
        f = fit_tp_sync(t.assign(pred_ms=t["nosync_ms"], measured_ms=t["measured"]), h)
        fits[h] = f
        print(f"TP split: fit on half {h} ({', '.join(x.split('/')[-1] for x in f['fit_models'])}): "
              f"{f['tp_sync_ms_per_layer_log2_tp']:.4f} ms x layers x log2(tp); evaluation (other half), before -> after:")
        print(f["evaluation"].round(2).to_string(index=False))
        print("never fitted (TP_EVAL_MODELS, configs typed from memory):")
        print(f["never_fitted"].round(2).to_string(index=False))
        print()
    return t, s, fits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mlruns", default="mlruns")
    ap.add_argument("--no-mlflow", action="store_true")
    ap.add_argument("--tp-only", action="store_true", help="the tensor-parallel rows only (no MLflow run)")
    a = ap.parse_args()
    if a.tp_only:
        print_tp(serving_constants("vllm"))
        return
    m = rows()
    terms = gpu_terms(m)
    c = serving_constants("vllm")
    out = []
    for r in terms.itertuples():
        model = MODELS[r.Model]
        row = dict(model=r.Model.split("/")[-1], half=r.half, prompt=r.prompt_tokens, output=r.output_tokens, batch=r.batch,
                   context=r.context, measured_ms=r.measured_ms)
        for label, kv, comp in (("before", False, False), ("after", True, False),
                                ("before_compile", False, True), ("after_compile", True, True)):
            ms, fits = predict_ms(model, r.device, r.batch, r.context, kv=kv, compile=comp)
            row[label + "_ms"] = ms
            if kv and not comp:
                row["fits"] = fits
        res = wattcast.predict(model, r.device, batch=int(r.batch), seq=1, mode="inference", dtype="bf16",
                               attention="flash", kv_context=int(r.context), serving="vllm",
                               prompt_tokens=int(r.prompt_tokens), output_tokens=int(r.output_tokens))
        row.update(prefill_ms=res.overheads["serving_prefill_ms"], host_ms=res.overheads["serving_host_ms"],
                   serving_ms=res.ms_per_token)
        out.append(row)
    t = pd.DataFrame(out)
    pd.set_option("display.width", 250)
    print(t.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    print()
    summary = []
    for label in ("before", "after", "before_compile", "after_compile", "serving"):
        ratio = t[label + "_ms"] / t["measured_ms"]
        summary.append(dict(setting=label, rows=len(t), mape_pct=100 * float(np.mean(np.abs(ratio - 1))),
                            signed_pct=100 * float(np.mean(ratio - 1))))
        print(f"{label:15s} rows {len(t):3d}  MAPE {summary[-1]['mape_pct']:5.1f}%  "
              f"signed bias {summary[-1]['signed_pct']:+6.1f}%")
    print(f"(serving: shipped constants host = {c['host_fixed_ms']:.3f} ms + {1e3 * c['host_per_seq_ms']:.1f} us x "
          f"batch, fitted on {', '.join(x.split('/')[-1] for x in c['provenance']['fit_models'])}; "
          f"models/artifacts/serving_vllm.json; its fitting half's rows are in the line above)")
    print()
    metrics = {f"{s['setting']}_{k}": s[k] for s in summary for k in ("mape_pct", "signed_pct")}
    tables = {"rows": t, "summary": pd.DataFrame(summary)}
    for h in sorted(HALVES):
        sp = split_fit(terms, h)
        other = [x for x in HALVES if x != h][0]
        print(f"split: fit on half {h} ({', '.join(x.split('/')[-1] for x in sp['fit_models'])}): host = "
              f"{sp['host_fixed_ms']:.3f} ms + {1e3 * sp['host_per_seq_ms']:.1f} us per sequence x batch "
              f"(training/serving_fit.py fit_host); evaluation half {other}, after -> serving:")
        ev_rows = terms[terms["half"] == other]
        before = errors(ev_rows, t.loc[terms["half"] == other, "after_ms"]).rename(
            columns={"mape_pct": "after_mape_pct", "signed_pct": "after_signed_pct"})
        ev = before.merge(sp["evaluation"], on=["group", "rows"])
        print(ev.round(2).to_string(index=False))
        print()
        all_ = ev.set_index("group").loc["all"]
        metrics.update({f"fit_{h}_host_fixed_ms": sp["host_fixed_ms"], f"fit_{h}_host_per_seq_us": 1e3 * sp["host_per_seq_ms"],
                        f"fit_{h}_eval_mape_pct": float(all_["mape_pct"]), f"fit_{h}_eval_signed_pct": float(all_["signed_pct"])})
        tables[f"fit_{h}_evaluation"] = ev
    tp_t, tp_s, tp_fits = print_tp(c)
    tables.update(tp_rows=tp_t, tp_summary=tp_s)
    tp_all = tp_s.set_index("model").loc["all"]
    metrics.update(tp_after_mape_pct=float(tp_all["after_mape_pct"]), tp_after_signed_pct=float(tp_all["after_signed_pct"]))
    for h, f in tp_fits.items():
        ev = f["evaluation"].set_index("group").loc["all"]
        metrics.update({f"tp_fit_{h}_ms_per_layer_log2_tp": f["tp_sync_ms_per_layer_log2_tp"],
                        f"tp_fit_{h}_eval_mape_pct": float(ev["mape_pct"]), f"tp_fit_{h}_eval_signed_pct": float(ev["signed_pct"])})
        tables[f"tp_fit_{h}_evaluation"] = f["evaluation"]
    if not a.no_mlflow:
        from wattcast.training.tracking import log_run

        run_id = log_run(a.mlruns, experiment="mlenergy-decode", params={"engine": "vllm", "device": "A100-SXM4-40GB"},
                         metrics=metrics, tags={"kind": "validation"}, tables=tables,
                         documents={"serving_vllm.json": c})
        print(f"MLflow run {run_id} (experiment mlenergy-decode)")


if __name__ == "__main__":
    main()
