#!/usr/bin/env python3
"""Every accuracy goal of the kernel, workload and distributed issues next to the figure measured now.

    python3 benchmarks/accuracy_goals.py [--data PATH]

Recomputes each figure from the data with the shipped surrogates (nothing is trained or tuned here) and prints
one table: issue, what is measured, the goal, the measured figure, its signed mean (``signed_pct``: predicted over
measured - 1, %, averaged over the rows; a model 10% slow on every row reads MAPE 10, signed +10) and whether the
goal is met. About 30-90 s with the machine's load (34 s at load 2 and 82 s at load 3, stop 59).

- Kernels (issue 2): MAPE per op family on the held-out GPUs' kernels_test rows and label-CSV nodes; goal half
  of NeuSight's published out-of-distribution error for that family (``heldout_accuracy.py``).
- Workloads (issue 3): mean and max absolute error of the held-out GPUs' single-GPU NeuSight labels
  (``wattcast validate labels``); goal under 6% (L4) and 4% (A100 80GB PCIe), no label over 15%.
- Distributed (issue 4): NeuSight's 4-GPU labels (each under 5%), vTrain single-node evaluation half and
  multi-node (mean under 8%), published large runs (each under 10%; ``published_runs.py``).
"""

from __future__ import annotations

import argparse
import sys
import time

import pandas as pd

from heldout_accuracy import heldout_predictions
from published_runs import bloom_176b, gpt3_megatron_a100, megatron_weak_scaling
from wattcast.validation.distributed_validation import run_validate_distributed
from wattcast.validation.e2e_labels import GOAL_E2E_MEAN_PCT
from wattcast.validation.e2e_run import run_validate_labels
from wattcast.training.kernels import NEUSIGHT_OOD_MAPE, summarise

#: the workload issue's ceiling on any one held-out label
E2E_MAX_LABEL_PCT = 15.0
NEUSIGHT_4GPU_GOAL_PCT = 5.0
VTRAIN_GOAL_PCT = 8.0
PUBLISHED_GOAL_PCT = 10.0


def kernel_goals(data) -> list[dict]:
    t = summarise(heldout_predictions(data), ["device", "report_family"])
    out = []
    for (device, fam), r in t.iterrows():
        if fam in NEUSIGHT_OOD_MAPE:
            out.append(dict(issue=2, measure=f"{device} {fam} kernel MAPE %", goal=NEUSIGHT_OOD_MAPE[fam] / 2,
                            measured=float(r["mape_pct"]), signed_pct=float(r["bias_pct"])))
    return out


def label_goals(data) -> list[dict]:
    s = run_validate_labels(data, use_mlflow=False)["summary"]
    out = []
    for device, goal in GOAL_E2E_MEAN_PCT.items():
        r = s[(s["device"] == device) & (s["kind"] == "all")].iloc[0]
        out.append(dict(issue=3, measure=f"{device} labels mean |error| % ({int(r['labels'])})", goal=goal,
                        measured=float(r["mean_abs_error_pct"]), signed_pct=float(r["mean_signed_error_pct"])))
        out.append(dict(issue=3, measure=f"{device} labels max |error| %", goal=E2E_MAX_LABEL_PCT,
                        measured=float(r["max_abs_error_pct"])))
        c = s[(s["device"] == device) & (s["kind"] == "all-fw-consistent")].iloc[0]
        if int(c["labels"]) != int(r["labels"]):
            out.append(dict(issue=3, measure=f"{device} labels mean |error| %, forward consistent with backward "
                                             f"({int(c['labels'])} of {int(r['labels'])})", goal=goal,
                            measured=float(c["mean_abs_error_pct"]), signed_pct=float(c["mean_signed_error_pct"])))
    return out


def weak_scaling_goals(w: pd.DataFrame) -> list[dict]:
    """The SC21 weak-scaling runs' goal rows (each under 10%), on the step time as every row here: ``signed_pct`` is
    predicted / measured step time - 1 (``published_runs.megatron_weak_scaling``'s ``step_error_pct``), not the
    TFLOP/s error the table publishes (+: predicted faster; until stop 59 this row showed that, with the other sign
    and a smaller max: 11.27 / -3.79 where the step time reads 12.70 / +4.16)."""
    out = []
    for col, name in (("step_error_pct", "micro-batch 1"), ("tuned_step_error_pct", "fastest fitting micro-batch")):
        e = w[col].astype(float)
        out.append(dict(issue=4, measure=f"Megatron weak scaling, {name}: max step time |error| % ({len(w)} runs)",
                        goal=PUBLISHED_GOAL_PCT, measured=float(e.abs().max()), signed_pct=float(e.mean())))
    return out


def distributed_goals(data) -> list[dict]:
    v = run_validate_distributed(data, use_mlflow=False)
    out = [dict(issue=4, measure=f"NeuSight 4-GPU {r.strategy} |error| %", goal=NEUSIGHT_4GPU_GOAL_PCT,
                measured=abs(float(r.error_pct)), signed_pct=float(r.error_pct))
           for r in v["neusight"].itertuples(index=False)]
    for name, key in (("vTrain single node (evaluation half)", "summary_single"), ("vTrain multi node", "summary_multi")):
        out.append(dict(issue=4, measure=f"{name} mean |error| %", goal=VTRAIN_GOAL_PCT, measured=v[key]["mean_abs_pct"],
                        signed_pct=v[key].get("mean_signed_pct", float("nan"))))
    out += weak_scaling_goals(megatron_weak_scaling(data))
    for run in (gpt3_megatron_a100(), bloom_176b()):
        err_pct = 100 * (run["predicted"] - run["measured"]) / run["measured"]
        out.append(dict(issue=4, measure=f"{run['run']} step time |error| %", goal=PUBLISHED_GOAL_PCT,
                        measured=abs(err_pct), signed_pct=err_pct))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    a = ap.parse_args()
    t0 = time.time()
    rows = []
    # three stages of 5-30 s each: say which one runs (stderr, so the table on stdout stays clean)
    for name, stage in (("held-out kernels", kernel_goals), ("single-GPU labels", label_goals),
                        ("distributed and published runs", distributed_goals)):
        print(f"[{time.time() - t0:5.0f} s] {name} ...", file=sys.stderr, flush=True)
        rows += stage(a.data)
    t = pd.DataFrame(rows)
    t["met"] = t["measured"] < t["goal"]
    pd.set_option("display.width", 200)
    print(t.round(2).to_string(index=False))
    for issue, g in t.groupby("issue"):
        print(f"issue {issue}: {int(g['met'].sum())} of {len(g)} goals met")
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
