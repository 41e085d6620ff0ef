"""Search over parallel strategies: enumerate valid configurations, evaluate, rank, Pareto front.

Evaluations share caches: one operator graph per distinct (micro-batch, tp, sp, ep, recompute), one
kernel prediction per distinct kernel and device, one collective prediction per distinct message.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from wattcast.data.catalog import resolve_device
from wattcast.data.checks import is_count, is_int
from wattcast.data.cluster_spec import resolve_cluster
from wattcast.simulate.defaults import DEFAULTS
from wattcast.simulate.distributed import MAX_GLOBAL_TOKENS, predict_distributed
from wattcast.simulate.lifecycle import footprint, footprint_from_step
from wattcast.simulate.parallel import ParallelConfig, ParallelConfigError


def _pow2_divisors(n: int, cap: int | None = None) -> list[int]:
    out, k = [], 1
    while k <= n and (cap is None or k <= cap):
        if n % k == 0:
            out.append(k)
        k *= 2
    return out


#: columns of ``SearchResult.ranked`` (and ``pareto``); a search with ``tokens`` adds :data:`RUN_COLUMNS`
COLUMNS = ("cluster", "device", "config", "tp", "pp", "dp", "cp", "micro_batch", "zero", "sp", "ep", "recompute", "interleave",
           "step_time_ms", "mfu", "tflops_per_gpu", "memory_gb", "fits", "exposed_comm_ms", "bubble_ms", "energy_j",
           "avg_power_w")
RUN_COLUMNS = ("run_hours", "run_energy_mwh", "run_tco_usd", "run_tco2e")
REJECTED_COLUMNS = ("cluster", "config", "rule")


@dataclass(frozen=True)
class SearchResult:
    ranked: pd.DataFrame  # every evaluated configuration, fitting ones first, by step time
    pareto: pd.DataFrame  # configurations no other beats on both step time and memory
    rejected: pd.DataFrame  # configurations that broke a rule, with the rule

    @property
    def best(self) -> dict | None:
        """The fastest configuration that fits in memory, as a row dict; None when none was evaluated or none
        fits (``ranked`` and ``pareto`` are then empty frames, or hold no fitting row)."""
        if self.ranked.empty or "fits" not in self.ranked:
            return None
        fit = self.ranked[self.ranked["fits"]]
        return None if fit.empty else fit.iloc[0].to_dict()


#: the search space: option -> default (None: chosen from the job, see :func:`candidate_configs`)
SPACE_DEFAULTS = dict(tp=None, pp=None, micro_batch=None, zero=(0, 1), sp=(False, True), recompute=("none", "selective"),
                      interleave=(1, 2), ep=(1,), cp=None)
#: sequences from this length on are also searched with context parallelism (cp 2, 4, 8) by default: below it the
#: per-rank attention blocks are too short to hide the ring's KV exchange, and activations rarely need splitting
CP_DEFAULT_MIN_SEQ = 16384


def _positive_int(name: str, v) -> int:
    if is_int(v):
        if v < 1:
            raise ValueError(f"{name} must be at least 1, got {v}")
        return int(v)
    raise ValueError(f"{name} must be a positive integer, got {v!r}")


def _choices(name: str, value) -> tuple | None:
    """One search-space option as a tuple of choices: a list/tuple/range/array or other iterable as given
    (duplicates dropped), a single value (a string too) as a one-element choice; None keeps the default.
    Each choice is checked (ValueError naming the option and the value)."""
    if name not in SPACE_DEFAULTS:
        raise ValueError(f"unknown search-space option {name!r}; valid: {', '.join(SPACE_DEFAULTS)}")
    if value is None:
        value = SPACE_DEFAULTS[name]
        if value is None:
            return None
    if isinstance(value, np.ndarray):
        vals = value.ravel().tolist()
    elif isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        vals = [value]
    else:
        vals = list(value)
    if not vals:
        raise ValueError(f"search-space option {name} has no choices (give at least one value)")
    out = []
    for v in vals:
        if name in ("tp", "pp", "micro_batch", "interleave", "ep", "cp"):
            if not is_count(v):
                raise ValueError(f"search-space option {name}: every choice must be a positive integer, got {v!r}")
            v = int(v)
        elif name == "zero":
            if not (is_int(v) and v in (0, 1, 2, 3)):
                raise ValueError(f"search-space option zero: every choice must be 0, 1, 2 or 3, got {v!r}")
            v = int(v)
        elif name == "sp":
            if not isinstance(v, (bool, np.bool_)):
                raise ValueError(f"search-space option sp: every choice must be True or False, got {v!r}")
            v = bool(v)
        elif name == "recompute":
            if not isinstance(v, str) or v.lower() not in ("none", "selective", "full"):
                raise ValueError(f"search-space option recompute: every choice must be none, selective or full, got {v!r}")
            v = v.lower()
        if v not in out:
            out.append(v)
    return tuple(out)


def candidate_configs(model, cluster, gpus: int, batch: int, seq: int, *, tp=None, pp=None, micro_batch=None, zero=(0, 1),
                      sp=(False, True), recompute=("none", "selective"), interleave=(1, 2), ep=(1,),
                      cp=None) -> list[ParallelConfig]:
    """Every strategy of the search space that divides the job. Each option takes a list of choices or one value;
    ``tp``, ``pp``, ``micro_batch`` None: powers of two that divide the job (TP within a node, micro-batches up to 16);
    ``cp`` None: 1, and 2, 4, 8 too from :data:`CP_DEFAULT_MIN_SEQ` tokens per sequence on."""
    tp, pp, micro_batch, zero, sp, recompute, interleave, ep, cp = (
        _choices(k, v) for k, v in (("tp", tp), ("pp", pp), ("micro_batch", micro_batch), ("zero", zero), ("sp", sp),
                                    ("recompute", recompute), ("interleave", interleave), ("ep", ep), ("cp", cp)))
    if cp is None:
        cp = (1, 2, 4, 8) if seq >= CP_DEFAULT_MIN_SEQ else (1,)
    cl = resolve_cluster(cluster)
    tps = list(tp) if tp is not None else _pow2_divisors(gpus, cl.gpus_per_node)
    out = []
    for t, c in itertools.product(tps, cp):
        if gpus % (t * c) or (c > 1 and seq % (2 * c)):
            continue
        pps = list(pp) if pp is not None else _pow2_divisors(gpus // (t * c))
        for p in pps:
            if gpus % (t * p * c):
                continue
            dp = gpus // (t * p * c)
            if batch % dp:
                continue
            mbs = list(micro_batch) if micro_batch is not None else _pow2_divisors(batch // dp, 16)
            for mb, z, s, rc, v, e in itertools.product(mbs, zero, sp, recompute, interleave, ep):
                if (s and t == 1) or (v > 1 and p == 1) or (z and dp * c == 1):
                    continue
                out.append(ParallelConfig(gpus=gpus, tp=t, pp=p, dp=dp, micro_batch=mb, zero=z, sp=s, ep=e, recompute=rc,
                                          interleave=v, cp=c))
    return out


def search(model, cluster, gpus: int, batch: int, seq: int, *, dtype: str = DEFAULTS.dtype, attention: str = DEFAULTS.attention,
           optimizer: str = "adamw", max_configs: int = 5000, progress=None, framework: str = "hf",
           tokens: float | None = None, footprint_kw: dict | None = None, overlaps: dict | None = None,
           **space) -> SearchResult:
    """Evaluate every valid strategy for ``model`` on ``gpus`` GPUs of ``cluster`` (global ``batch``).

    ``cluster``: one cluster (preset name, file or spec) or a list of them, to compare hardware: every row
    then names its cluster, and the ranking and Pareto front run across all of them. ``max_configs`` counts
    per cluster. Every row carries the step's energy (all GPUs, J) and average power per GPU. With
    ``tokens`` (a whole training run), fitting rows also get the run's lifecycle footprint
    (:func:`wattcast.simulate.lifecycle.footprint_from_step`; ``footprint_kw``: region, pue,
    lifetime_years, ...): ``run_hours``, ``run_energy_mwh``, ``run_tco_usd``, ``run_tco2e``.

    ``overlaps``: Megatron-Core's overlap flags for every candidate (``overlap_grad_reduce``, ``overlap_param_gather``,
    ``tp_comm_overlap``: True/False; left out, the framework's default).

    ``space``: the options of :data:`SPACE_DEFAULTS` (tp, pp, micro_batch, zero, sp, recompute, interleave, ep),
    each a list of choices or a single value. ``gpus``, ``batch``, ``seq`` and ``max_configs`` must be positive
    integers; these, an unknown option, a bad choice or an unknown ``footprint_kw`` key raise ValueError naming
    it. When nothing is evaluated (no strategy divides the job, or every one broke a rule: see ``rejected``),
    ``ranked`` and ``pareto`` are empty frames with the usual columns and ``best`` is None."""
    clusters = list(cluster) if isinstance(cluster, (list, tuple)) else [cluster]
    if not clusters:
        raise ValueError("no cluster to search")
    gpus, batch, seq, max_configs = (_positive_int(name, v) for name, v in (
        ("gpus", gpus), ("batch", batch), ("seq", seq), ("max_configs", max_configs)))
    if batch * seq > MAX_GLOBAL_TOKENS:
        raise ValueError(f"batch x seq = {batch:,} x {seq:,} = {batch * seq:,} tokens in one step is beyond what wattcast "
                         "models (2^63 - 1)")
    if str(attention).lower().startswith("flash") and space.get("recompute") is None:
        # fused attention keeps no S x S activations: selective recomputation would change nothing
        space = dict(space, recompute=("none", "full"))
    # an unknown option or a bad choice is named before anything is evaluated
    space = {k: _choices(k, v) for k, v in space.items()}
    _check_footprint_kw(footprint_kw)
    if tokens is not None:
        try:
            ok = float(tokens) > 0 and np.isfinite(float(tokens))
        except (TypeError, ValueError):
            ok = False
        if not ok or isinstance(tokens, bool):
            raise ValueError(f"tokens (run length in tokens) must be a finite number above 0, got {tokens!r}")
    elif footprint_kw:
        raise ValueError("footprint_kw describes a run: give tokens too")
    unknown = set(overlaps or {}) - {"overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap"}
    if unknown:
        raise ValueError(f"unknown overlaps option(s) {sorted(unknown)}; valid: overlap_grad_reduce, overlap_param_gather, "
                         "tp_comm_overlap")
    if footprint_kw and "region" in footprint_kw and not str(footprint_kw["region"] or "").strip():
        raise ValueError("empty region in footprint_kw; give a country, a cloud region or 'world', or leave it out")
    rows, bad = [], []
    for c in clusters:
        cl = resolve_cluster(c)
        spec = resolve_device(cl.device)  # the run's cost uses this spec's own figures
        cands = candidate_configs(model, cl, gpus, batch, seq, **space)
        if overlaps:
            cands = [replace(c, **overlaps) for c in cands]
        evaluated = 0
        for done, par in enumerate(cands, start=1):
            if evaluated >= max_configs:
                break
            try:  # an invalid strategy is rejected by its rules before any graph is built
                r = predict_distributed(model, cl, gpus=gpus, batch=batch, seq=seq, parallel=par, dtype=dtype,
                                        attention=attention, optimizer=optimizer, framework=framework, comm_split=False)
            except ParallelConfigError as e:
                bad.append(dict(cluster=cl.name, config=par.describe(), rule=str(e)))
                if progress:  # a rejected candidate is done too: the bar reaches its total
                    progress(done, len(cands))
                continue
            evaluated += 1
            if progress:
                progress(done, len(cands))
            row = dict(cluster=cl.name, device=r.device, config=r.parallel.describe(), tp=par.tp, pp=par.pp,
                       dp=r.parallel.dp, cp=par.cp, micro_batch=r.parallel.micro_batch, zero=par.zero, sp=par.sp, ep=par.ep,
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
        if progress and cands:  # stopped at max_configs: the rest is skipped, the bar ends full
            progress(len(cands), len(cands))
    rejected = pd.DataFrame(bad, columns=list(REJECTED_COLUMNS))
    if not rows:  # nothing evaluated: empty frames with the usual columns (``best`` is None)
        empty = pd.DataFrame(columns=list(COLUMNS + (RUN_COLUMNS if tokens else ())))
        return SearchResult(empty, empty.copy(), rejected)
    df = pd.DataFrame(rows)
    df = df.sort_values(["fits", "step_time_ms"], ascending=[False, True]).reset_index(drop=True)
    fit = df[df["fits"]].sort_values(["step_time_ms", "memory_gb"])
    front, best_mem = [], float("inf")
    for r in fit.itertuples(index=False):
        if r.memory_gb < best_mem:
            front.append(r._asdict())
            best_mem = r.memory_gb
    return SearchResult(df, pd.DataFrame(front, columns=df.columns), rejected)


#: parameters of :func:`wattcast.simulate.lifecycle.footprint` that a search sets itself
_FOOTPRINT_SET = ("device", "gpus", "hours", "power_model", "flops")


def _check_footprint_kw(kw) -> None:
    """``footprint_kw`` must map options of :func:`wattcast.simulate.lifecycle.footprint` (ValueError naming an
    unknown one and listing the valid ones)."""
    if kw is None:
        return
    if not isinstance(kw, dict):
        raise ValueError(f"footprint_kw must be a dict of footprint options (region, pue, ...), got {kw!r}")
    valid = [p for p in inspect.signature(footprint).parameters if p not in _FOOTPRINT_SET]
    unknown = [k for k in kw if k not in valid]
    if unknown:
        raise ValueError(f"unknown footprint_kw option {', '.join(map(repr, unknown))}; valid: {', '.join(valid)}")
