#!/usr/bin/env python3
"""Power limits against the shipped measurements: time and energy ratios vs the cap, before / after the clock law.

    python benchmarks/power_limits.py [--data PATH] [--rows-csv FILE] [--quick]

Compares two power models that differ only in the clock law (``models/power.py``): the shipped one (``power``:
dynamic power ~ clock^alpha, alpha fitted on Perseus's A100 SXM sweeps) and its twin with the ``knee`` law (a voltage
floor below the knee clock, power ~ clock there; fitted on the same sweeps here; evaluated, not shipped). Everything
else (the power surrogate g, u_ref, the kernel times) is the same, so the difference is the clock law's.

Measurements (``shared/datasets/power``; see the SOURCE files there):

* **Zeus** (NSDI'23; V100 PCIe, Quadro RTX 6000, P100 PCIe; training GPUs of the power surrogate, not used in the clock
  law's fit): BERT-base / SQuAD v1.1, sequence 384, FP32, every batch size and power limit measured (median over
  optimisers). Predicted with the full single-device pipeline (``wattcast.predict('bert_base', dev, batch, seq=384,
  dtype='fp32', attention='eager')``: the 2021 Hugging Face BERT ran eager attention), each limit's ratio to the
  prediction without a limit; measured ratios to the run at the top limit.
* **Perseus** (SOSP'24) ``zeus_baseline/A100_zeus_global.csv``: 4-stage pipeline training on 4x A100 80GB PCIe (the
  artifact README's "A100-80G PCIe") under per-GPU limits 300-175 W. **Held-out hardware**: the project never fits
  or selects on A100 80GB PCIe; evaluated only. gpt3-xl through ``wattcast.predict_cluster`` (the audit's command:
  ``--cluster PCIe-4GPU --gpus 4 --pp 4 --micro-batch 8 --batch 1024 --seq 2048 --dtype fp16``); the other four
  models (no built-in twin) are not predicted here.

Then the replay (``training/power.py`` ``limit_response``, what ``wattcast train power`` logs): each measured uncapped
run's time and average power put through the clock law under each limit (Zeus: ResNet-50 and BERT / SQuAD, compute
utilisation from their FLOPs; the held-out A100 PCIe: all five Perseus models, at compute utilisation 1, an upper
bound on the slowdown since the step's is not known), for both laws.

Reported per GPU: MAPE and signed bias (predicted / measured - 1) of the time ratio and the energy ratio over the
capped rows, at deep limits (at most half the TDP) and at moderate ones, and the limit of least energy (measured vs
predicted, the uncapped run included). ``--quick``: the largest and the smallest Zeus batch only.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ZEUS = {"V100-PCIe-32GB": "v100", "Quadro-RTX-6000": "rtx6000", "Tesla-P100-PCIe-16GB": "p100"}
A100_PCIE = dict(model="gpt3_xl", cluster="PCIe-4GPU", gpus=4, pp=4, micro_batch=8, batch=1024, seq=2048, dtype="fp16")


def _data_root(arg: str | None) -> Path:
    from wattcast.data.kernel_datasets import resolve_data_root

    return resolve_data_root(arg) / "power"


def model_folders(tmp: Path, knee_clock_ratio: float, voltage_slope: float) -> dict[str, str]:
    """{'shipped (power law)': folder, 'knee law': folder}: the shipped model as it is, and its twin with the knee law
    at the given parameters."""
    from wattcast.models.power import load_power_model

    shipped = load_power_model()
    if shipped.fallback:
        sys.exit("no shipped power model (models/artifacts/power_manifest.json)")
    out = {}
    for name, law in (("shipped (power law)", shipped.clock_law), ("knee law", "knee")):
        folder = tmp / name.split()[0]
        dataclasses.replace(shipped, clock_law=law, knee_clock_ratio=knee_clock_ratio,
                            voltage_slope=voltage_slope).save(folder)
        out[name] = str(folder)
    return out


def zeus_measured(root: Path, quick: bool) -> pd.DataFrame:
    rows = []
    for dev, key in ZEUS.items():
        z = pd.read_csv(root / "zeus" / f"summary_power_{key}.csv")
        z = (z[(z["dataset"] == "squad") & (z["network"] == "bert_base_uncased")]
             .groupby(["batch_size", "power_limit"], as_index=False)[["time_per_epoch", "average_power"]].median())
        top = z["power_limit"].max()
        batches = sorted(z["batch_size"].unique())
        if quick:
            batches = [batches[0], batches[-1]]
        for b in batches:
            w = z[z["batch_size"] == b]
            t = w[w["power_limit"] == top]
            if t.empty:
                continue
            t0, p0 = float(t["time_per_epoch"].iloc[0]), float(t["average_power"].iloc[0])
            for r in w.itertuples(index=False):
                rows.append({"source": "zeus", "device": dev, "workload": f"bert_base/squad/bs{int(b)}",
                             "batch": int(b), "limit_w": float(r.power_limit), "top_w": float(top),
                             "t_ratio_meas": r.time_per_epoch / t0, "e_ratio_meas": r.time_per_epoch * r.average_power / (t0 * p0)})
    return pd.DataFrame(rows)


def a100_pcie_measured(root: Path) -> pd.DataFrame:
    a = pd.read_csv(root / "perseus" / "zeus_baseline" / "A100_zeus_global.csv")
    a = a[a["model_name"] == "gpt3-xl"]
    top = a["power_limit_0"].max()
    t = a[a["power_limit_0"] == top].iloc[0]
    return pd.DataFrame({"source": "perseus (held out)", "device": "A100-PCIe-80GB", "workload": "gpt3-xl/pp4",
                         "batch": 1024, "limit_w": a["power_limit_0"].astype(float), "top_w": float(top),
                         "t_ratio_meas": a["time"] / t["time"], "e_ratio_meas": a["energy"] / t["energy"]})


def predict_ratios(meas: pd.DataFrame, folder: str) -> pd.DataFrame:
    """Predicted time and energy ratios (capped / uncapped) for every measured row, with the power model in ``folder``."""
    import wattcast

    out = meas.copy()
    tp, ep = np.full(len(out), np.nan), np.full(len(out), np.nan)
    for (src, dev, b), idx in out.groupby(["source", "device", "batch"]).groups.items():
        def run(limit):
            if src == "zeus":
                r = wattcast.predict("bert_base", dev, batch=int(b), seq=384, dtype="fp32", attention="eager",
                                     power_limit_w=limit, power_model=folder)
            else:
                kw = dict(A100_PCIE)
                r = wattcast.predict_cluster(kw.pop("model"), kw.pop("cluster"), power_limit_w=limit, power_model=folder, **kw)
            return r.step_time_ms, r.energy_j

        t0, e0 = run(None)
        for i in idx:
            lim = float(out.at[i, "limit_w"])
            try:
                t1, e1 = run(lim) if lim < float(out.at[i, "top_w"]) else (t0, e0)
            except ValueError as e:  # a limit no modelled clock meets: refused, reported as such
                print(f"  {dev} bs{b} at {lim:g} W refused: {str(e)[:120]}", file=sys.stderr)
                continue
            tp[i], ep[i] = t1 / t0, e1 / e0
    out["t_ratio_pred"], out["e_ratio_pred"] = tp, ep
    return out


def summarise(d: pd.DataFrame, tdp: dict[str, float]) -> pd.DataFrame:
    rows = []
    d = d.copy()
    d["t_err"] = d["t_ratio_pred"] / d["t_ratio_meas"] - 1
    d["e_err"] = d["e_ratio_pred"] / d["e_ratio_meas"] - 1
    for (model, dev), g in d.groupby(["model", "device"], sort=False):
        capped = g[g["limit_w"] < g["top_w"]]
        deep = capped["limit_w"] <= 0.5 * tdp[dev]
        emin = []
        for _, w in g.groupby("workload"):
            ok = w.dropna(subset=["e_ratio_pred"])
            emin.append((float(w.loc[w["e_ratio_meas"].idxmin(), "limit_w"]),
                         float(ok.loc[ok["e_ratio_pred"].idxmin(), "limit_w"]) if len(ok) else np.nan))
        emin = np.array(emin)

        def stat(sel, col):
            v = capped.loc[sel, col].dropna()
            return (v.abs().mean() * 100, v.mean() * 100) if len(v) else (np.nan, np.nan)

        r = {"model": model, "device": dev, "capped_rows": len(capped), "refused": int(capped["t_ratio_pred"].isna().sum())}
        for part, sel in (("all", np.ones(len(capped), bool)), ("deep", deep.to_numpy()), ("moderate", ~deep.to_numpy())):
            r[f"t_mape_{part}"], r[f"t_bias_{part}"] = stat(sel, "t_err")
            r[f"e_mape_{part}"], r[f"e_bias_{part}"] = stat(sel, "e_err")
        r["emin_meas_w"] = float(np.median(emin[:, 0]))
        r["emin_pred_w"] = float(np.nanmedian(emin[:, 1]))
        r["emin_match_share"] = float(np.mean(emin[:, 0] == emin[:, 1]))
        rows.append(r)
    return pd.DataFrame(rows)


def curve(d: pd.DataFrame, dev: str, batch: int) -> pd.DataFrame:
    """Measured and predicted ratios vs the limit for one workload, one column per model."""
    g = d[(d["device"] == dev) & (d["batch"] == batch)]
    m = g[g["model"] == g["model"].iloc[0]].set_index("limit_w")[["t_ratio_meas", "e_ratio_meas"]]
    for model, w in g.groupby("model", sort=False):
        w = w.set_index("limit_w")
        m[f"t {model}"], m[f"e {model}"] = w["t_ratio_pred"], w["e_ratio_pred"]
    return m.sort_index(ascending=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="the shared datasets folder (default: WATTCAST_DATA)")
    ap.add_argument("--rows-csv", default=None, help="write every row (measured and predicted ratios) to this CSV")
    ap.add_argument("--quick", action="store_true", help="the largest and smallest Zeus batch only")
    a = ap.parse_args()
    root = _data_root(a.data)
    from wattcast.data.catalog import resolve_device
    from wattcast.models.power import load_power_model
    from wattcast.training.power import build_rows, fit_clock_response, limit_response

    t_start = time.time()
    sweep = build_rows(root)["perseus_sweep"]  # the rows again below, for the replay
    clock = fit_clock_response(sweep)
    shipped = load_power_model()
    print(f"clock law fit on Perseus A100 SXM stage sweeps ({clock['sweep_rows']} rows, {clock['sweep_clock_min_mhz']:.0f}-1410 MHz): "
          f"knee {clock['knee_clock_ratio']:.3f} x boost, voltage slope {clock['voltage_slope']:.3f}: power MAPE "
          f"{clock['sweep_knee_power_mape_pct']:.2f}%, signed {clock['sweep_knee_power_signed_pct']:+.2f}% "
          f"(below 0.7 x boost {clock['sweep_knee_power_mape_below_0.7_pct']:.2f}%); "
          f"power law clock^{clock['alpha']:.2f}: {clock['sweep_power_mape_pct']:.2f}%, signed "
          f"{clock['sweep_power_signed_pct']:+.2f}% ({clock['sweep_power_law_mape_below_0.7_pct']:.2f}%). In-sample: "
          f"fitted on these rows. Shipped: the {shipped.clock_law} law")
    meas = pd.concat([zeus_measured(root, a.quick), a100_pcie_measured(root)], ignore_index=True)
    tdp = {d: float(resolve_device(d).tdp_w) for d in meas["device"].unique()}
    parts = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, folder in model_folders(Path(tmp), clock["knee_clock_ratio"], clock["voltage_slope"]).items():
            p = predict_ratios(meas, folder)
            p.insert(0, "model", name)
            parts.append(p)
    d = pd.concat(parts, ignore_index=True)
    s = summarise(d, tdp)
    with pd.option_context("display.width", 250, "display.max_columns", 40, "display.float_format", "{:,.2f}".format):
        print("\nTime / energy ratio vs the cap: MAPE and signed bias (%) over capped rows; deep = limit <= 0.5 x TDP")
        print(s.to_string(index=False))
        for dev, b in (("V100-PCIe-32GB", 32), ("Quadro-RTX-6000", 32), ("A100-PCIe-80GB", 1024)):
            if ((d["device"] == dev) & (d["batch"] == b)).any():
                print(f"\n{dev} {'BERT-base SQuAD batch 32' if b == 32 else 'gpt3-xl 4-stage pipeline (held out)'}:")
                print(curve(d, dev, b).to_string())
    rows = build_rows(root)
    reps = []
    for name, law in (("shipped (power law)", shipped.clock_law), ("knee law", "knee")):
        m = dataclasses.replace(shipped, clock_law=law, knee_clock_ratio=clock["knee_clock_ratio"],
                                voltage_slope=clock["voltage_slope"])
        _, summ, _ = limit_response(m, rows.get("zeus", pd.DataFrame()), rows.get("a100_pcie_limits"))
        summ.insert(0, "model", name)
        reps.append(summ)
    cols = ["model", "source", "device", "heldout", "capped_rows", "capped_time_mape_pct", "capped_time_bias_pct",
            "capped_energy_ratio_mape_pct", "capped_energy_ratio_bias_pct", "emin_limit_offset_w",
            "meas_slowdown_pct", "pred_slowdown_pct"]
    with pd.option_context("display.width", 250, "display.max_columns", 40, "display.float_format", "{:,.2f}".format):
        print("\nReplay of the measured uncapped runs (training/power.py limit_response; A100 PCIe at compute utilisation 1):")
        print(pd.concat(reps, ignore_index=True)[cols].to_string(index=False))
    if a.rows_csv:
        d.to_csv(a.rows_csv, index=False)
    print(f"\n{len(d)} rows in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    main()
