"""Search over parallel strategies: enumerate valid configurations, evaluate, rank, Pareto front.

Evaluations share caches: one operator graph per distinct (micro-batch, tp, sp, ep, recompute), one
kernel prediction per distinct kernel and device, one collective prediction per distinct message.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pandas as pd

from wattcast.data.catalog import resolve_device
from wattcast.data.cluster_spec import resolve_cluster
from wattcast.simulate.distributed import predict_distributed
from wattcast.simulate.lifecycle import footprint_from_step
from wattcast.simulate.parallel import ParallelConfig, ParallelConfigError


def _pow2_divisors(n: int, cap: int | None = None) -> list[int]:
    out, k = [], 1
    while k <= n and (cap is None or k <= cap):
        if n % k == 0:
            out.append(k)
        k *= 2
    return out


@dataclass(frozen=True)
class SearchResult:
    ranked: pd.DataFrame  # every evaluated configuration, fitting ones first, by step time
    pareto: pd.DataFrame  # configurations no other beats on both step time and memory
    rejected: pd.DataFrame  # configurations that broke a rule, with the rule

    @property
    def best(self) -> dict | None:
        fit = self.ranked[self.ranked["fits"]]
        return None if fit.empty else fit.iloc[0].to_dict()


def candidate_configs(model, cluster, gpus: int, batch: int, seq: int, *, tp=None, pp=None, micro_batch=None, zero=(0, 1),
                      sp=(False, True), recompute=("none", "selective"), interleave=(1, 2), ep=(1,)) -> list[ParallelConfig]:
    cl = resolve_cluster(cluster)
    tps = list(tp) if tp is not None else _pow2_divisors(gpus, cl.gpus_per_node)
    out = []
    for t in tps:
        if gpus % t:
            continue
        pps = list(pp) if pp is not None else _pow2_divisors(gpus // t)
        for p in pps:
            if gpus % (t * p):
                continue
            dp = gpus // (t * p)
            if batch % dp:
                continue
            mbs = list(micro_batch) if micro_batch is not None else _pow2_divisors(batch // dp, 16)
            for mb, z, s, rc, v, e in itertools.product(mbs, zero, sp, recompute, interleave, ep):
                if (s and t == 1) or (v > 1 and p == 1) or (z and dp == 1):
                    continue
                out.append(ParallelConfig(gpus=gpus, tp=t, pp=p, dp=dp, micro_batch=mb, zero=z, sp=s, ep=e, recompute=rc,
                                          interleave=v))
    return out


def search(model, cluster, gpus: int, batch: int, seq: int, *, dtype: str = "bf16", attention: str = "flash",
           optimizer: str = "adamw", max_configs: int = 5000, progress=None, framework: str = "hf",
           tokens: float | None = None, footprint_kw: dict | None = None, **space) -> SearchResult:
    """Evaluate every valid strategy for ``model`` on ``gpus`` GPUs of ``cluster`` (global ``batch``).

    ``cluster``: one cluster (preset name, file or spec) or a list of them, to compare hardware: every row
    then names its cluster, and the ranking and Pareto front run across all of them. ``max_configs`` counts
    per cluster. Every row carries the step's energy (all GPUs, J) and average power per GPU. With
    ``tokens`` (a whole training run), fitting rows also get the run's lifecycle footprint
    (:func:`wattcast.simulate.lifecycle.footprint_from_step`; ``footprint_kw``: region, pue,
    lifetime_years, ...): ``run_hours``, ``run_energy_mwh``, ``run_tco_usd``, ``run_tco2e``."""
    clusters = list(cluster) if isinstance(cluster, (list, tuple)) else [cluster]
    if not clusters:
        raise ValueError("no cluster to search")
    for name, v in (("gpus", gpus), ("batch", batch), ("seq", seq), ("max_configs", max_configs)):
        if int(v) < 1:
            raise ValueError(f"{name} must be at least 1, got {v}")
    if attention == "flash" and "recompute" not in space:
        # fused attention keeps no S x S activations: selective recomputation would change nothing
        space = dict(space, recompute=("none", "full"))
    rows, bad = [], []
    for c in clusters:
        cl = resolve_cluster(c)
        spec = resolve_device(cl.device)  # the run's cost uses this spec's own figures
        cands = candidate_configs(model, cl, gpus, batch, seq, **space)
        evaluated = 0
        for par in cands:
            if evaluated >= max_configs:
                break
            try:  # an invalid strategy is rejected by its rules before any graph is built
                r = predict_distributed(model, cl, gpus=gpus, batch=batch, seq=seq, parallel=par, dtype=dtype,
                                        attention=attention, optimizer=optimizer, framework=framework)
            except ParallelConfigError as e:
                bad.append(dict(cluster=cl.name, config=par.describe(), rule=str(e)))
                continue
            evaluated += 1
            if progress:
                progress(evaluated, len(cands))
            row = dict(cluster=cl.name, device=r.device, config=r.parallel.describe(), tp=par.tp, pp=par.pp,
                       dp=r.parallel.dp, micro_batch=r.parallel.micro_batch, zero=par.zero, sp=par.sp, ep=par.ep,
                       recompute=par.recompute, interleave=par.interleave, step_time_ms=r.step_time_ms, mfu=r.mfu,
                       tflops_per_gpu=r.tflops_per_gpu, memory_gb=r.memory_gb, fits=r.fits,
                       exposed_comm_ms=r.exposed_comm_ms, bubble_ms=r.bubble_ms, energy_j=r.energy_j,
                       avg_power_w=r.avg_power_w)
            if tokens and r.fits:
                fp = footprint_from_step(spec, gpus, step_time_ms=r.step_time_ms, gpu_power_w=r.avg_power_w,
                                         tokens=float(tokens), tokens_per_step=batch * seq, flops_per_step=r.flops,
                                         **(footprint_kw or {}))
                row.update(run_hours=fp.hours, run_energy_mwh=fp.energy_mwh, run_tco_usd=fp.tco_usd,
                           run_tco2e=fp.total_tco2e)
            rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return SearchResult(df, df, pd.DataFrame(bad))
    df = df.sort_values(["fits", "step_time_ms"], ascending=[False, True]).reset_index(drop=True)
    fit = df[df["fits"]].sort_values(["step_time_ms", "memory_gb"])
    front, best_mem = [], float("inf")
    for r in fit.itertuples(index=False):
        if r.memory_gb < best_mem:
            front.append(r._asdict())
            best_mem = r.memory_gb
    return SearchResult(df, pd.DataFrame(front), pd.DataFrame(bad))
