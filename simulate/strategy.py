"""A parallel strategy as one string that round-trips: ``wattcast search`` prints it per row, and
``wattcast predict --cluster ... --strategy STR`` (``wattcast.predict_cluster(..., strategy=STR)``) takes it back.

Grammar: tokens joined by ``-``, in any order on input (the canonical order below on output)::

    tp2-pp4-dp8-cp1-ep1-mb1-ga16-zero1-v2-sp-rcfull-1f1b

- counts ``tp<N>``, ``pp<N>``, ``dp<N>``, ``cp<N>``, ``ep<N>``, ``mb<N>`` (sequences per micro-batch), ``ga<N>``
  (micro-batches per step = gradient accumulation; with ``dp`` and ``mb`` it fixes the global batch
  ``dp x mb x ga``), ``zero<0-3>``, ``v<N>`` (virtual pipeline stages per GPU, interleaved 1F1B);
- ``sp`` (sequence parallelism on; absent: off);
- ``rcnone`` / ``rcselective`` / ``rcfull`` (activation recomputation); ``rcfull<N>``: Megatron's block recomputation
  of the first N layers of each model chunk (``--recompute-num-layers N``), ``rcfullu<N>``: its uniform method (every
  layer, the input of each group of N kept);
- ``1f1b`` / ``gpipe`` / ``dualpipe`` (pipeline schedule);
- Megatron-Core's overlaps as deviations from the framework's default (``simulate.overlap.overlap_defaults``):
  ``ogr`` / ``noogr`` (grad reduce), ``opg`` / ``noopg`` (param gather), ``tpo`` / ``notpo`` (TP comm), ``a2a`` /
  ``noa2a`` (MoE expert-parallel all-to-alls), ``p2po`` / ``nop2po`` (the interleaved schedule's point-to-point
  transfers), ``atp`` / ``noatp`` (the column-parallel linears' backward TP collective beside their weight-gradient
  GEMM, ``--async-tp-comm``: on by default under megatron with tp > 1); absent:
  the framework's default, so a string predicted under the same ``--framework`` resolves the same flags. ``tpo``'s
  default is read without the cluster (on under megatron with tp > 1 and ``sp``): a TP group beyond one node (NVLink
  domain) runs without it (``parallel.resolve_parallel``, since stop 56), which is written ``notpo``, so a search row
  says so and its string means the same on any cluster (predicted, the token is an explicit off: the same step);
- ``ppf<N>`` / ``ppl<N>``: transformer layers of the first / last pipeline stage (only when set);
- ``etp<N>``: the routed experts' tensor-parallel degree (Megatron-Core's ``--expert-tensor-parallel-size``; only when
  set, absent: tp);
- ``cpca2a`` / ``cpcag`` / ``cpca2a+p2p<A>x<B>``: context parallelism's ``--cp-comm-type`` a2a / allgather / a2a+p2p
  with ``--hierarchical-cp-sizes A,B`` (only when not the ring, p2p).

``tp``, ``pp``, ``dp`` and ``mb`` are required; the others default to 1, ZeRO 0, no SP, no recomputation, 1F1B and
the framework's overlaps. The GPU count is ``tp x pp x dp x cp``. Precision, attention kernel and framework are not
part of a strategy: search runs every candidate with the same ones (``simulate/defaults.py``), and they are
given to ``predict`` the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from wattcast.featurize.recompute import RECOMPUTE, RecomputeError, recompute_setting
from wattcast.simulate.parallel import (CP_COMM_TOKENS, SCHEDULES, ParallelConfig, cp_comm_suffix, pp_stage_tokens,
                                       recompute_layers_suffix)

__all__ = ["Strategy", "StrategyError", "format_strategy", "parse_strategy"]

_COUNTS = ("tp", "pp", "dp", "cp", "ep", "mb", "ga", "zero", "v", "ppf", "ppl", "etp")
_REQUIRED = ("tp", "pp", "dp", "mb")
_OVERLAPS = {"ogr": "overlap_grad_reduce", "opg": "overlap_param_gather", "tpo": "tp_comm_overlap",
             "a2a": "overlap_moe_expert_parallel_comm", "p2po": "overlap_p2p_comm", "atp": "async_tp_comm"}
_RC_BLOCK = re.compile(r"^rcfull(u?)(\d+)$")
#: context parallelism's communication type (module docstring): cpca2a, cpcag, cpca2a+p2p<A>x<B>
_CP_COMM = re.compile(r"^cpc(a2a\+p2p(\d+)x(\d+)|a2a|ag)$")
_NUM = re.compile(r"^(tp|pp|dp|cp|ep|etp|mb|ga|zero|v|ppf|ppl)(\d+)$")


class StrategyError(ValueError):
    """A strategy string that cannot be read (the message names the bad token)."""


@dataclass(frozen=True)
class Strategy:
    """A parsed strategy string (see the module docstring)."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    cp: int = 1
    ep: int = 1
    grad_accum: int | None = None  # micro-batches per step; None: not given (the global batch then comes from --batch)
    zero: int = 0
    interleave: int = 1
    sp: bool = False
    recompute: str = "none"
    schedule: str = "1f1b"
    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool | None = None
    tp_comm_overlap: bool | None = None
    overlap_moe_expert_parallel_comm: bool | None = None
    overlap_p2p_comm: bool | None = None
    async_tp_comm: bool | None = None
    pp_first_layers: int | None = None
    pp_last_layers: int | None = None
    recompute_num_layers: int | None = None
    recompute_method: str = "block"
    etp: int | None = None
    cp_comm_type: str = "p2p"
    hierarchical_cp_sizes: tuple | None = None

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def global_batch(self) -> int | None:
        """Sequences per step (``dp x mb x ga``), or None when ``ga`` was not given."""
        return None if self.grad_accum is None else self.dp * self.micro_batch * self.grad_accum

    def parallel_config(self) -> ParallelConfig:
        """The :class:`ParallelConfig` this strategy names (its overlaps None where the framework default applies)."""
        return ParallelConfig(gpus=self.gpus, tp=self.tp, pp=self.pp, dp=self.dp, micro_batch=self.micro_batch, zero=self.zero,
                              sp=self.sp, ep=self.ep, recompute=self.recompute, interleave=self.interleave,
                              schedule=self.schedule, pp_first_layers=self.pp_first_layers,
                              pp_last_layers=self.pp_last_layers, cp=self.cp,
                              overlap_grad_reduce=self.overlap_grad_reduce,
                              overlap_param_gather=self.overlap_param_gather, tp_comm_overlap=self.tp_comm_overlap,
                              overlap_moe_expert_parallel_comm=self.overlap_moe_expert_parallel_comm,
                              overlap_p2p_comm=self.overlap_p2p_comm, async_tp_comm=self.async_tp_comm,
                              recompute_num_layers=self.recompute_num_layers, etp=self.etp,
                              cp_comm_type=self.cp_comm_type, hierarchical_cp_sizes=self.hierarchical_cp_sizes,
                              # the method only with a layer count (rcfull<N> / rcfullu<N>): given alone, it needs full
                              recompute_method=self.recompute_method if self.recompute_num_layers is not None else None)


def format_strategy(cfg: ParallelConfig, batch: int | None = None, framework: str = "hf") -> str:
    """The canonical strategy string of ``cfg``: ``dp`` and ``micro_batch`` must be known (a configuration resolved by
    :func:`wattcast.simulate.parallel.resolve_parallel`, as every search row's is). ``batch`` (global, sequences) adds
    ``ga`` = micro-batches per step. Overlap flags are written where they differ from ``framework``'s default, taken
    without the cluster (module docstring: a TP group beyond one node has ``notpo`` written)."""
    from wattcast.simulate.overlap import overlap_defaults
    from wattcast.featurize.workload import canonical_framework

    if cfg.dp is None or cfg.micro_batch is None:
        raise StrategyError("format_strategy needs a configuration with dp and micro_batch set (resolve it first)")
    ga = None
    if batch is not None:
        per = cfg.dp * cfg.micro_batch
        if batch % per:
            raise StrategyError(f"global batch {batch} is not a multiple of dp x micro-batch ({cfg.dp} x {cfg.micro_batch})")
        ga = batch // per
    # overlaps are written only where they differ from the framework's default
    # (at interleave 1 the p2p overlap's default is off, what resolve_parallel leaves there: no p2po / nop2po token,
    # which predict would refuse)
    defaults = overlap_defaults(canonical_framework(framework), tp=cfg.tp, sp=cfg.sp, zero=cfg.zero,
                                interleave=cfg.interleave, schedule=cfg.schedule)
    overlaps = {name: (None if getattr(cfg, name) is None or bool(getattr(cfg, name)) == defaults[name]
                       else bool(getattr(cfg, name))) for name in _OVERLAPS.values()}
    return format_given(Strategy(tp=cfg.tp, pp=cfg.pp, dp=cfg.dp, micro_batch=cfg.micro_batch, cp=cfg.cp, ep=cfg.ep,
                                 grad_accum=ga, zero=cfg.zero, interleave=cfg.interleave, sp=bool(cfg.sp),
                                 recompute=cfg.recompute, schedule=cfg.schedule, pp_first_layers=cfg.pp_first_layers,
                                 pp_last_layers=cfg.pp_last_layers,
                                 recompute_num_layers=cfg.recompute_layers,
                                 recompute_method=cfg.recompute_method,
                                 etp=None if cfg.etp is None or cfg.etp == cfg.tp else cfg.etp,
                                 cp_comm_type=cfg.cp_comm_type if cfg.cp > 1 else "p2p",
                                 hierarchical_cp_sizes=cfg.hierarchical_cp_sizes if cfg.cp > 1 else None,
                                 **overlaps))


def parse_strategy(text: str) -> Strategy:
    """Read a strategy string (see the module docstring); a :class:`StrategyError` names a bad, repeated or
    conflicting token, or a required one that is missing."""
    if not isinstance(text, str) or not text.strip():
        raise StrategyError(f"strategy must be a non-empty string like 'tp2-pp1-dp4-mb1', got {text!r}")
    seen: dict[str, str] = {}  # field -> the token that set it
    kw: dict = {}

    def put(field: str, value, tok: str) -> None:
        if field in seen:
            raise StrategyError(f"strategy {text!r}: token {tok!r} sets {field} again (already set by {seen[field]!r})")
        seen[field] = tok
        kw[field] = value

    for tok in text.strip().split("-"):
        t = tok.strip().lower()
        m = _NUM.match(t)
        if m:
            name, n = m.group(1), int(m.group(2))
            if name == "zero":
                if n > 3:
                    raise StrategyError(f"strategy {text!r}: bad token {tok!r}: ZeRO stage must be 0, 1, 2 or 3")
            elif n < 1 and name in ("ppf", "ppl"):
                raise StrategyError(f"strategy {text!r}: bad token {tok!r}: a pipeline stage holds at least 1 layer")
            elif n < 1:
                raise StrategyError(f"strategy {text!r}: bad token {tok!r}: {name} must be at least 1")
            put(name, n, tok)
        elif t == "sp":
            put("sp", True, tok)
        elif t.startswith("rc") and (t[2:] in RECOMPUTE or t[2:].startswith("selective:")):
            try:
                put("recompute", recompute_setting(t[2:]), tok)
            except RecomputeError as e:
                raise StrategyError(f"strategy {text!r}: bad token {tok!r}: {e}") from None
        elif m := _RC_BLOCK.match(t):
            uniform, n = m.group(1), int(m.group(2))
            if n < 1:
                raise StrategyError(f"strategy {text!r}: bad token {tok!r}: recomputed layers must be at least 1")
            put("recompute", "full", tok)
            kw["recompute_num_layers"] = n
            kw["recompute_method"] = "uniform" if uniform else "block"
        elif m := _CP_COMM.match(t):
            put("cp_comm_type", {v: k for k, v in CP_COMM_TOKENS.items()}.get(m.group(1), "a2a+p2p"), tok)
            if m.group(1).startswith("a2a+p2p"):
                kw["hierarchical_cp_sizes"] = (int(m.group(2)), int(m.group(3)))
        elif t in SCHEDULES:
            put("schedule", t, tok)
        elif t in _OVERLAPS or (t.startswith("no") and t[2:] in _OVERLAPS):
            key = t[2:] if t.startswith("no") else t
            put(_OVERLAPS[key], not t.startswith("no"), tok)
        else:
            raise StrategyError(
                f"strategy {text!r}: bad token {tok!r}; tokens are tp<N> pp<N> dp<N> cp<N> ep<N> mb<N> ga<N> zero<0-3> "
                f"v<N> ppf<N> ppl<N> etp<N>, sp, rc{{none,selective,full}}, rcfull<N>, rcfullu<N>, {'/'.join(SCHEDULES)}, "
                f"{'/'.join(_OVERLAPS)} (or no<flag>), joined by '-'")
    missing = [k for k in _REQUIRED if k not in kw]
    if missing:
        raise StrategyError(f"strategy {text!r} lacks {', '.join(f'{k}<N>' for k in missing)} (required: tp, pp, dp, mb)")
    s = Strategy(tp=kw["tp"], pp=kw["pp"], dp=kw["dp"], micro_batch=kw["mb"])
    rename = dict(cp="cp", ep="ep", ga="grad_accum", zero="zero", v="interleave", ppf="pp_first_layers",
                  ppl="pp_last_layers")
    extra = {rename.get(k, k): v for k, v in kw.items() if k not in _REQUIRED}
    return replace(s, **extra)


def strategy_values(strategy: str | Strategy, given: dict, label=lambda name: name) -> dict:
    """The parallel options a strategy sets, merged with the ones the caller gave explicitly (``given``: option ->
    value, only those actually given). Keys: gpus, batch, tp, pp, dp, micro_batch, cp, ep, zero, sp, interleave,
    recompute, schedule, overlap_grad_reduce, overlap_param_gather, tp_comm_overlap, overlap_moe_expert_parallel_comm,
    overlap_p2p_comm, async_tp_comm, pp_first_layers, pp_last_layers, recompute_num_layers, recompute_method, etp
    (batch only when the strategy has ``ga`` or it was given). A given value that differs from the strategy's is a
    StrategyError naming the option (``label(key)``: its name as the caller knows it) and both values."""
    st = strategy if isinstance(strategy, Strategy) else parse_strategy(strategy)
    own = dict(gpus=st.gpus, batch=st.global_batch, tp=st.tp, pp=st.pp, dp=st.dp, micro_batch=st.micro_batch, cp=st.cp,
               ep=st.ep, zero=st.zero, sp=st.sp, interleave=st.interleave, recompute=st.recompute, schedule=st.schedule,
               overlap_grad_reduce=st.overlap_grad_reduce, overlap_param_gather=st.overlap_param_gather,
               tp_comm_overlap=st.tp_comm_overlap, overlap_moe_expert_parallel_comm=st.overlap_moe_expert_parallel_comm,
               # a nop2po at v1 (no virtual pipeline) says what 1F1B does anyway: read as the default, not as the
               # explicit flag predict refuses there (search --no-overlap wrote it into v1 strings until stop 46)
               overlap_p2p_comm=(None if st.overlap_p2p_comm is False and (st.interleave or 1) <= 1
                                 else st.overlap_p2p_comm),
               async_tp_comm=st.async_tp_comm, pp_first_layers=st.pp_first_layers, pp_last_layers=st.pp_last_layers,
               recompute_num_layers=st.recompute_num_layers,
               recompute_method=st.recompute_method if st.recompute_num_layers is not None else None, etp=st.etp,
               # the ring (no cpc token) leaves --cp-comm-type open, as the other defaults a string does not write
               cp_comm_type=None if st.cp_comm_type == "p2p" else st.cp_comm_type,
               hierarchical_cp_sizes=st.hierarchical_cp_sizes)
    unknown = sorted(set(given) - set(own))
    if unknown:
        raise StrategyError(f"unknown strategy option(s) {unknown}")
    out = dict(own)
    for k, v in given.items():
        mine = own[k]
        if mine is None:  # the strategy leaves it open (the framework's overlap default, no ga, even stages)
            out[k] = v
            continue
        same = (str(v).lower() == str(mine).lower()) if isinstance(mine, str) else (
            type(v) is not str and not (isinstance(mine, bool) != isinstance(v, bool)) and v == mine)
        if not same:
            what = {"gpus": f"tp x pp x dp x cp = {mine}", "batch": f"dp x mb x ga = {mine}"}.get(k, repr(mine))
            raise StrategyError(f"{label(k)} {v!r} conflicts with the strategy {format_given(st)!r}, which sets "
                                f"{k} = {what}; leave {label(k)} out or change the strategy")
    if out["batch"] is None:
        out.pop("batch")
    # recompute_method stays None when neither the strategy (no layer count) nor the caller names one: Megatron's block
    # method then applies to a layer count (resolve_parallel), and a method given without full recomputation is refused
    return out


def format_given(st: Strategy) -> str:
    """``st`` written back as a string (canonical order; overlaps as given)."""
    parts = [f"tp{st.tp}", f"pp{st.pp}", f"dp{st.dp}", f"cp{st.cp}", f"ep{st.ep}", f"mb{st.micro_batch}"]
    if st.grad_accum is not None:
        parts.append(f"ga{st.grad_accum}")
    parts += [f"zero{st.zero}", f"v{st.interleave}"] + (["sp"] if st.sp else []) + [f"rc{st.recompute}{recompute_layers_suffix(st.recompute_num_layers, st.recompute_method)}", st.schedule]
    for tok, name in _OVERLAPS.items():
        v = getattr(st, name)
        if v is not None:
            parts.append(tok if v else f"no{tok}")
    parts += pp_stage_tokens(st.pp_first_layers, st.pp_last_layers)
    if st.etp is not None:
        parts.append(f"etp{st.etp}")
    if st.cp_comm_type != "p2p":
        parts.append("cpc" + cp_comm_suffix(st.cp_comm_type, st.hierarchical_cp_sizes))
    return "-".join(parts)
