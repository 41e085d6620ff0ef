"""Reproduce published training footprints from each row's own inputs.

``published/training_footprints.csv`` (Patterson et al. 2021, arXiv 2104.10350, Table 4; LaMDA,
Thoppilan et al. 2022, arXiv 2201.08239, section 10) gives per run: accelerator count and hours, the
measured system average power per accelerator (incl. memory, NIC, fans, host CPU), PUE, the grid's
kgCO2e/kWh, and the published energy (MWh) and tCO2e.

For every row the lifecycle calculator's own functions compute

    energy_mwh  = accelerator_hours x avg_power_w x PUE / 1e6          (it_energy_kwh, facility_energy_kwh)
    op_tco2e    = energy x grid_kgco2e_per_kwh                          (operational_kgco2e)
    net_tco2e   = energy x net kg/kWh, where the notes give Patterson's "net" factor (the market-based view
                  after carbon-free-energy purchases): GShard 0.177, Switch 0.33; equal to gross elsewhere

and compares them with the published energy, gross tCO2e (``operational_tco2e``) and net tCO2e
(``total_tco2e``). Rows whose device is in the catalog (GPT-3 on V100) are also run end to end through
:func:`wattcast.lifecycle.footprint` (measured hours, so ``apply_goodput=False``) as a cross-check.
A row with a missing input is reported with status ``skipped: ...`` and not scored.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from wattcast.lifecycle import facility_energy_kwh, footprint, it_energy_kwh, operational_kgco2e

PUBLISHED_CSV = Path("published") / "training_footprints.csv"
TOLERANCE_PCT = 2.0
_INPUTS = ("n_accelerators", "accelerator_hours", "avg_power_w_per_accel", "pue", "grid_kgco2e_per_kwh")
_NET = re.compile(r"net uses net kg/kWh\s*([0-9]*\.?[0-9]+)")


def load_published(data=None) -> pd.DataFrame:
    """The published table: ``data`` is a DataFrame, the CSV path, or a data root (default: resolve_data_root())."""
    if isinstance(data, pd.DataFrame):
        return data.copy()
    if data is not None and Path(data).is_file():
        return pd.read_csv(data)
    from wattcast.data.kernel_datasets import resolve_data_root

    return pd.read_csv(resolve_data_root(data) / PUBLISHED_CSV)


def _num(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _err(pred: float | None, pub: float | None) -> float | None:
    if pred is None or pub is None or pub == 0:
        return None
    return 100.0 * (pred - pub) / pub


def validate_published(data=None) -> pd.DataFrame:
    """One row per published run: inputs, reproduced vs published energy and tCO2e, error %, status."""
    df = load_published(data)
    out = []
    for _, r in df.iterrows():
        rec: dict = {"model": r.get("model"), "hardware": r.get("hardware"), "source": str(r.get("source", ""))[:40]}
        vals = {k: _num(r.get(k)) for k in _INPUTS}
        missing = [k for k, v in vals.items() if v is None or v <= 0]
        rec.update({k: vals[k] for k in _INPUTS})
        pub_e, pub_op, pub_tot = _num(r.get("energy_mwh")), _num(r.get("operational_tco2e")), _num(r.get("total_tco2e"))
        rec.update(energy_mwh_published=pub_e, operational_tco2e_published=pub_op, total_tco2e_published=pub_tot)
        if missing:
            rec["status"] = f"skipped: missing input {', '.join(missing)}"
            out.append(rec)
            continue
        n, acc_h, p, pue, grid = (vals[k] for k in _INPUTS)
        hours = acc_h / n
        e_it = it_energy_kwh(n, p, hours)
        energy = facility_energy_kwh(e_it, pue) / 1000.0
        op = operational_kgco2e(e_it, pue, grid) / 1000.0
        m = _NET.search(str(r.get("notes", "")))
        net_grid = float(m.group(1)) if m else grid
        net = operational_kgco2e(e_it, pue, net_grid) / 1000.0
        rec.update(hours=hours, net_grid_kgco2e_per_kwh=net_grid,
                   energy_mwh_pred=energy, operational_tco2e_pred=op, total_tco2e_pred=net,
                   energy_err_pct=_err(energy, pub_e), operational_err_pct=_err(op, pub_op), total_err_pct=_err(net, pub_tot))
        # end-to-end cross-check through footprint() when the device is in the catalog
        try:
            fp = footprint(str(r.get("hardware")), int(round(n)), hours, avg_power_w=p, pue=pue,
                           grid_kgco2e_per_kwh=grid, apply_goodput=False)
            rec.update(footprint_device=fp.device, footprint_energy_mwh=fp.energy_mwh,
                       footprint_operational_tco2e=fp.operational_tco2e)
        except Exception as e:  # TPUs are not in the device catalog
            rec.update(footprint_device=None, footprint_energy_mwh=None, footprint_operational_tco2e=None,
                       footprint_note=f"{type(e).__name__}: {str(e)[:60]}")
        errs = [abs(x) for x in (rec["energy_err_pct"], rec["operational_err_pct"], rec["total_err_pct"]) if x is not None]
        rec["status"] = "ok" if errs and max(errs) <= TOLERANCE_PCT else f"outside {TOLERANCE_PCT:g}%"
        out.append(rec)
    return pd.DataFrame(out)
