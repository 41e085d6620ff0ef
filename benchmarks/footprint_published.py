#!/usr/bin/env python3
"""Reproduce the published training footprints (Patterson et al. 2021 Table 4, LaMDA) from each row's
own inputs with wattcast's lifecycle functions, and print energy / tCO2e errors.

    python3 benchmarks/footprint_published.py [--data PATH]

``--data``: the shared datasets folder or the CSV itself (default: WATTCAST_DATA or ../shared/datasets).
"""

from __future__ import annotations

import argparse

import pandas as pd

from wattcast.validation.footprint_validation import TOLERANCE_PCT, validate_published


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    a = ap.parse_args()
    t = validate_published(a.data)
    cols = ["model", "hardware", "n_accelerators", "hours", "avg_power_w_per_accel", "pue", "grid_kgco2e_per_kwh",
            "energy_mwh_published", "energy_mwh_pred", "energy_err_pct",
            "operational_tco2e_published", "operational_tco2e_pred", "operational_err_pct",
            "net_grid_kgco2e_per_kwh", "total_tco2e_published", "total_tco2e_pred", "total_err_pct",
            "footprint_energy_mwh", "status"]
    show = t[[c for c in cols if c in t.columns]].copy()
    show["model"] = show["model"].astype(str).str.slice(0, 28)
    with pd.option_context("display.width", 250, "display.max_columns", 40, "display.float_format", "{:,.3f}".format):
        print(show.to_string(index=False))
    scored = t[~t["status"].astype(str).str.startswith("skipped")]
    for c in ("energy_err_pct", "operational_err_pct", "total_err_pct"):
        print(f"max |{c}| = {scored[c].abs().max():.2f}%  (mean |error| {scored[c].abs().mean():.2f}%, signed "
              f"{scored[c].mean():+.2f}%: + = predicted above published)")
    print(f"{(scored['status'] == 'ok').sum()}/{len(scored)} rows within {TOLERANCE_PCT:g}%; "
          f"{len(t) - len(scored)} skipped")
    # the same runs with wattcast's own power model instead of the published average power
    from wattcast.data.catalog import find_device
    from wattcast.simulate.energy import DEFAULT_FOOTPRINT_UTILISATION, gpu_power_at_w
    from wattcast.lifecycle import LifecycleAssumptions, node_power_w

    share = LifecycleAssumptions().node_overhead_share
    print(f"\nwattcast's own power model (GPU power at utilisation {DEFAULT_FOOTPRINT_UTILISATION} + host "
          f"{share} x TDP, as the calculator adds it):")
    for r in t.itertuples(index=False):
        hw = str(r.hardware)
        spec = find_device("V100-SXM2-32GB" if hw.strip().upper() == "V100" else hw)
        if spec is None:
            print(f"  {str(r.model)[:28]:28s} {hw:8s}: not in the device catalog (TPUs are not modelled)")
            continue
        own = node_power_w(gpu_power_at_w(spec, DEFAULT_FOOTPRINT_UTILISATION), share, spec.tdp_w)
        err = 100 * (own - r.avg_power_w_per_accel) / r.avg_power_w_per_accel
        print(f"  {str(r.model)[:28]:28s} {hw:8s}: {own:.0f} W per accelerator all-in vs published {r.avg_power_w_per_accel:.0f} W "
              f"({err:+.1f}%; energy and operational CO2e scale by the same factor)")


if __name__ == "__main__":
    main()
