"""Lifecycle TCO and emissions of one training run: energy, operational and embodied carbon, CapEx,
OpEx, goodput under failures, carbon per FLOP and the total-carbon-delay product.

Pure functions carry their units in their names, by concern: :mod:`.energy` (energy, operational and embodied
carbon, CCI, tCDP), :mod:`.cost` (CapEx, OpEx, cloud), :mod:`.goodput` (MTBF, Young/Daly checkpoints) and
:mod:`.assumptions` (:class:`LifecycleAssumptions`, the inputs besides the run itself). :mod:`.footprint` puts
them together for one run of ``gpus`` accelerators for ``hours`` (:func:`run_footprint`, which takes the
assumptions as one object; :func:`footprint`, the same with loose options) and returns a :class:`RunFootprint`. Defaults and their sources
live in ``wattcast/data/carbon/*.yaml`` / ``.json`` (see :mod:`wattcast.data.carbon`); override any of
them with :class:`LifecycleAssumptions`.

Formulas (``h`` = effective hours, ``N`` = GPUs):

- accelerator power ``P``: the given all-in ``avg_power_w`` (Patterson et al.'s "system average power per
  accelerator, incl. memory, NIC, fans, host CPU": no node overhead added), or the power model's GPU
  power at the stated utilisation, or ``default_power_fraction_of_tdp x TDP`` (flagged); the last two
  add the host's power per GPU, ``H = node_overhead_share x TDP`` (``host_power_w``: fixed per GPU slot, so a
  power limit or clock cap lowers ``P``, not ``H``): ``P_node = P + H``;
- spares (``gpus_per_node`` of each node's ``node_gpus`` used, e.g. 64 of an NVL72 rack's 72): the run holds
  ``N_held = N + S`` GPUs, ``S = ceil(N / gpus_per_node) x (node_gpus - gpus_per_node)`` of them idle at the board's
  idle power ``P_idle``; CapEx, embodied carbon, GPU-hours (the cloud view) and the provisioned kW count ``N_held``;
- IT energy ``E_IT = (N x P + S x P_idle + N_held x H) x h / 1000`` kWh (``it_energy_breakdown_mwh``: gpus,
  spare_gpus, hosts); facility energy ``E = E_IT x PUE`` (``energy_mwh``);
- operational ``kgCO2e = E_IT x PUE x grid_kgco2e_per_kwh`` (location-based by default; market-based
  on request; an explicit intensity wins over a region);
- embodied per GPU (ACT-style): die ``area_cm2 x (CI_fab x EPA + GPA + MPA)/yield`` at the ACT node,
  + memory ``GB x DRAM-class kg/GB`` (HBM/GDDR as DRAM), + board PCB, + the server share (host CPUs,
  host DRAM, SSD, chassis steel/aluminium, boards, divided by GPUs per server); amortised with
  ``share = h / (lifetime_years x 8760 x lifetime_utilisation)``;
- CapEx = ``share x N_held x (accelerator + server + network USD per GPU)`` + ``facility_usd_per_kw x kW_provisioned
  x h / (facility_lifetime_years x 8760 x lifetime_utilisation)``, with ``kW_provisioned = N_held x TDP x
  (1 + node_overhead_share) / 1000``; OpEx = ``E_IT x PUE x electricity_usd_per_kwh``; TCO = CapEx + OpEx;
  cloud view (not in TCO) = ``GPU-hours (N_held x h) x USD/GPU-hour``;
- goodput (Daly 2006, exponential failures, failures may also hit restarts): system MTBF ``M = MTBF_gpu / N``,
  checkpoint every ``tau`` (Young/Daly ``sqrt(2 C M)`` by default) taking ``C``, restart ``R``:
  ``goodput = tau / (M e^{R/M} (e^{(tau+C)/M} - 1))`` in (0, 1]; effective hours = failure-free hours / goodput;
- CCI = total kgCO2e per PFLOP (1e15 FLOP) of the run's useful FLOPs; tCDP = total kgCO2e x hours.

Per-device figures come from the spec object given. The name-keyed tables (cloud USD/GPU-hour, a
sibling's purchase price, a die-area fallback) are used only when the spec is the catalog's own device of
that name (same hardware figures, :func:`catalog_spec_matches`); a user spec that merely reuses a catalog
name gets none of them: the cloud price is unknown (``None``, flagged), the purchase price falls back to the
stated USD-per-TDP-watt rule and the die area to the stated default (both flagged).

Example::

    >>> from wattcast.lifecycle import footprint, LifecycleAssumptions
    >>> fp = footprint("v100", gpus=10_000, hours=355.2, avg_power_w=330, pue=1.1,
    ...                grid_kgco2e_per_kwh=0.429, apply_goodput=False)   # GPT-3, Patterson Table 4
    >>> round(fp.energy_mwh), round(fp.operational_tco2e)
    (1289, 553)
    >>> fp.run_dict().keys()  # the `run` object of `wattcast predict --json`
    dict_keys(['hours', 'gpu_hours', 'energy_mwh', 'operational_tco2e', 'embodied_tco2e', 'total_tco2e', 'capex_usd', 'opex_usd', 'tco_usd', 'goodput'])
    >>> fp2 = footprint("h100", 1024, 24 * 30, power_model=lambda u: 120 + 560 * u, utilisation=0.8,
    ...                 region="gcp:us-central1", flops=3e23)  # power from a model; goodput applied
"""

from __future__ import annotations

from wattcast.lifecycle.assumptions import LifecycleAssumptions, assumptions_from_options
from wattcast.lifecycle.checks import PLAUSIBLE, catalog_spec_matches, check_plausible
from wattcast.lifecycle.cost import capex_breakdown_usd, capex_usd, cloud_usd, opex_usd
from wattcast.lifecycle.energy import (HOURS_PER_YEAR, EmbodiedBreakdown, amortisation_share, cci_kgco2e_per_pflop,
                                       embodied_kgco2e, embodied_kgco2e_per_device, facility_energy_kwh,
                                       host_power_w, it_energy_kwh, node_power_w, operational_kgco2e,
                                       server_share_kgco2e_per_gpu, tcdp_kgco2e_h)
from wattcast.lifecycle.footprint import (RUN_KEYS, RunFootprint, footprint, footprint_from_step, format_footprint,
                                          run_footprint, run_of_prediction)
from wattcast.lifecycle.goodput import daly_interval_s, goodput, system_mtbf_s, young_daly_interval_s

__all__ = [
    "HOURS_PER_YEAR",
    "PLAUSIBLE",
    "RUN_KEYS",
    "EmbodiedBreakdown",
    "LifecycleAssumptions",
    "RunFootprint",
    "amortisation_share",
    "assumptions_from_options",
    "capex_breakdown_usd",
    "capex_usd",
    "catalog_spec_matches",
    "cci_kgco2e_per_pflop",
    "check_plausible",
    "cloud_usd",
    "daly_interval_s",
    "embodied_kgco2e",
    "embodied_kgco2e_per_device",
    "facility_energy_kwh",
    "footprint",
    "footprint_from_step",
    "format_footprint",
    "goodput",
    "host_power_w",
    "it_energy_kwh",
    "node_power_w",
    "operational_kgco2e",
    "opex_usd",
    "run_footprint",
    "run_of_prediction",
    "server_share_kgco2e_per_gpu",
    "system_mtbf_s",
    "tcdp_kgco2e_h",
    "young_daly_interval_s",
]
