"""Parallel strategies: the configuration, its validity rules, and where each parallel group sits.

A job of ``gpus`` GPUs runs ``dp x tp x pp`` model replicas/shards (Megatron-LM's rank order: tensor
parallel ranks adjacent, then data parallel, then pipeline stages), optionally with sequence parallelism
(``sp``, within the TP group), expert parallelism (``ep`` ranks of the DP group share the experts), ZeRO
stage 0-3 (FSDP = ZeRO-3) over the DP group, micro-batching (``micro_batch`` sequences per micro-batch,
``batch / (dp x micro_batch)`` micro-batches per step = gradient accumulation), activation recomputation,
and pipeline schedules GPipe, 1F1B, interleaved 1F1B (``interleave`` virtual stages per GPU) and DeepSeek-V3's
DualPipe (:mod:`wattcast.simulate.dualpipe`).

Framework rules (:data:`PIPELINE_ZERO_MAX`): Megatron-LM's distributed optimizer shards optimizer state
only (ZeRO-1), and DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 only, so ``megatron`` and
``megatron-deepspeed`` refuse pipeline parallelism with ZeRO 2 or 3.
"""

from __future__ import annotations

import itertools

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from wattcast.data.checks import exotic_allowed, is_count, is_int
from wattcast.data.cluster_spec import ClusterSpec
from wattcast.featurize.context_parallel import cp_ring_size
from wattcast.featurize.recompute import RecomputeError, recompute_setting
from wattcast.simulate.overlap import (ANY_FRAMEWORK_FLAGS, MEGATRON_ONLY_REASONS, overlap_defaults,
                                      tp_overlap_domain_reason)

SCHEDULES = ("1f1b", "gpipe", "dualpipe")
#: highest ZeRO stage a framework runs together with pipeline parallelism (pp > 1); frameworks not listed
#: have no such limit here. DeepSpeed: ``PipelineEngine`` asserts ZeRO stage < 2 (gradient partitioning
#: needs the whole backward pass of a stage, which a pipeline interleaves); Megatron-LM: its distributed
#: optimizer is ZeRO-1 (no gradient or parameter sharding)
PIPELINE_ZERO_MAX = {"megatron": 1, "megatron-deepspeed": 1}


class ParallelConfigError(ValueError):
    """A parallel configuration breaks a rule (the message says which)."""


@dataclass(frozen=True)
class ParallelConfig:
    gpus: int = 1
    tp: int = 1
    pp: int = 1
    dp: int | None = None
    micro_batch: int | None = None
    zero: int = 0
    sp: bool = False
    ep: int = 1
    recompute: str = "none"
    interleave: int = 1
    schedule: str = "1f1b"
    #: DDP gradient bucket (PyTorch default 25 MB)
    bucket_mb: float = 25.0
    #: transformer layers of the first / last pipeline stage (Megatron-Core's ``decoder_first_pipeline_num_layers`` /
    #: ``decoder_last_pipeline_num_layers``); the other stages split the rest evenly. None: see ``stage_layers``
    pp_first_layers: int | None = None
    pp_last_layers: int | None = None
    #: context parallelism: the sequence split over ``cp`` ranks (ring attention); world = dp x tp x pp x cp
    cp: int = 1
    #: how context parallelism communicates (Megatron-Core's ``--cp-comm-type``, Transformer Engine's
    #: ``attn_forward_func_with_cp``): "p2p" (the KV ring, ``AttnFuncWithCPAndKVP2P``), "a2a" (DeepSpeed-Ulysses
    #: all-to-alls of Q/K/V and the output, ``AttnFuncWithCPAndQKVOA2A``), "allgather" (K/V all-gathered,
    #: ``AttnFuncWithCPAndKVAllGather``; TE's "all_gather") or "a2a+p2p" (a2a in an inner group, the ring across the
    #: outer one; sizes in ``hierarchical_cp_sizes``)
    cp_comm_type: str = "p2p"
    #: a2a+p2p: (inner a2a size, outer ring size), product cp (Megatron-LM ``--hierarchical-context-parallel-sizes``)
    hierarchical_cp_sizes: tuple[int, int] | None = None
    #: the routed experts' tensor-parallel degree (Megatron-Core's ``--expert-tensor-parallel-size``, MoE parallel
    #: folding: the expert layers' ranks are etp x ep x expert-dp x pp over the same GPUs as the attention's tp x cp x dp
    #: x pp); None: tp (Megatron-Core's default)
    etp: int | None = None
    #: Megatron-Core's overlaps (``--overlap-grad-reduce``, ``--overlap-param-gather``, ``--tp-comm-overlap``); None:
    #: the framework's default (``simulate.overlap.overlap_defaults``), filled in by ``resolve_parallel``
    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool | None = None
    tp_comm_overlap: bool | None = None
    #: Megatron-Core's ``--overlap-moe-expert-parallel-comm``: each micro-batch's expert-parallel all-to-alls run beside
    #: another micro-batch's computation (``simulate.overlap.ep_overlap_layer_ms``); None: the framework's default (off)
    overlap_moe_expert_parallel_comm: bool | None = None
    #: Megatron-Core's ``overlap_p2p_comm`` (Megatron-LM ``--no-overlap-p2p-communication`` turns it off): the interleaved
    #: schedule's point-to-point transfers run beside the computation; off, each transfer blocks both ends (as in
    #: Megatron-LM 2021, SC21). No effect without interleaving (1F1B's transfers block either way). None: the default
    overlap_p2p_comm: bool | None = None
    #: the column-parallel linears' backward TP collective started asynchronously beside their weight-gradient GEMM
    #: (Megatron-Core / TE always; Megatron-LM's ``--no-async-tensor-model-parallel-allreduce`` and Megatron-LM 2021's
    #: synchronous all-reduce: off; simulate/overlap.py). Needs tp > 1 (an explicit True at tp 1, or under DualPipe, is
    #: refused by ``resolve_parallel``); no effect under ``tp_comm_overlap``. None: the framework's default
    async_tp_comm: bool | None = None
    #: Megatron's block recomputation (``--recompute-method block --recompute-num-layers N``) with ``recompute="full"``:
    #: only the first N transformer layers of each model chunk are recomputed, the others keep their activations;
    #: None: every layer (``--recompute-method uniform`` with one layer per group)
    recompute_num_layers: int | None = None
    #: with ``recompute_num_layers``: Megatron's ``--recompute-method`` ("block": the first N layers of each chunk;
    #: "uniform": every layer, the input of each group of N kept and N layers re-made at once in the backward).
    #: None: not given (``resolve_parallel`` makes it "block" when ``recompute_num_layers`` is set); given, it needs
    #: ``recompute="full"`` (Megatron's rule: selective recomputation has no method)
    recompute_method: str | None = None

    @property
    def recompute_layers(self) -> int | None:
        """The recomputed-layer count that applies: ``recompute_num_layers`` under full recomputation, else None."""
        return self.recompute_num_layers if self.recompute == "full" else None

    def n_micro(self, batch: int) -> int:
        return batch // (self.dp * self.micro_batch)

    def describe(self) -> str:
        parts = [f"dp{self.dp}", f"tp{self.tp}", f"pp{self.pp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
            if self.cp_comm_type != "p2p":  # the strategy string's token (simulate/strategy.py): cpca2a, cpcag, ...
                parts.append("cpc" + cp_comm_suffix(self.cp_comm_type, self.hierarchical_cp_sizes))
        if self.sp:
            parts.append("sp")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp is not None and self.etp != self.tp:
            parts.append(f"etp{self.etp}")
        if self.zero:
            parts.append(f"zero{self.zero}")
        if self.interleave > 1:
            parts.append(f"v{self.interleave}")
        parts.append(f"mb{self.micro_batch}")
        if self.schedule != "1f1b":
            parts.append(self.schedule)
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}{recompute_layers_suffix(self.recompute_layers, self.recompute_method)}")
        over = [k for k, v in (("ogr", self.overlap_grad_reduce), ("opg", self.overlap_param_gather),
                                ("tpo", self.tp_comm_overlap), ("a2a", self.overlap_moe_expert_parallel_comm)) if v]
        if over:
            parts.append("+".join(over))
        if self.interleave > 1 and self.overlap_p2p_comm is False:
            # the interleaved schedule's p2p overlap is on by default (overlap_defaults): only its absence is written,
            # the strategy string's token (simulate/strategy.py: nop2po); every other name stays as it was
            parts.append("nop2po")
        # the first / last stage's layers as the strategy string writes them (simulate/strategy.py): ppf<N>, ppl<N>
        parts += pp_stage_tokens(self.pp_first_layers, self.pp_last_layers)
        return "-".join(parts)


#: Megatron-Core's ``--cp-comm-type`` choices (TE's "all_gather" is written "allgather", as the task's CLI names it)
CP_COMM_TYPES = ("p2p", "a2a", "allgather", "a2a+p2p")
#: the strategy-name token of the CP communication types that have a one-word token (simulate/strategy.py reads it back)
CP_COMM_TOKENS = {"a2a": "a2a", "allgather": "ag"}


def pp_stage_tokens(first: int | None, last: int | None) -> list[str]:
    """The tokens of the first / last pipeline stage's transformer layers, only those set: ``ppf<N>`` (first),
    ``ppl<N>`` (last). The strategy string (simulate/strategy.py) and ``ParallelConfig.describe`` both write them so
    (until stop 46 ``describe`` wrote ``ppl<first>,<last>``, its ``ppl`` the strategy's ``ppf``)."""
    return ([] if first is None else [f"ppf{first}"]) + ([] if last is None else [f"ppl{last}"])


def check_overlap_p2p_flag(given, interleave) -> None:
    """An explicit ``--overlap-p2p-communication`` / ``--no-overlap-p2p-communication`` (``overlap_p2p_comm`` True /
    False; None, the framework's default, is never refused) needs the interleaved schedule (``interleave`` >= 2): only
    it overlaps its point-to-point transfers, 1F1B's block either way. Megatron-Core 0.16.1
    ``pipeline_parallel/schedules.py`` ``forward_backward_pipelining_without_interleaving``: ``if
    config.overlap_p2p_comm: raise ValueError("Non-interleaved pipeline parallelism does not support overlapping p2p
    communication")``; refused here as ``--interleave`` without ``--pp``, not ignored (ParallelConfigError)."""
    if given is None or not is_int(interleave) or int(interleave) > 1:  # a bad interleave: the parallel rules name it
        return
    flag = "--overlap-p2p-communication" if given else "--no-overlap-p2p-communication"
    raise ParallelConfigError(
        f"{flag} says whether the interleaved schedule's pipeline transfers run beside the computation: it needs "
        f"--interleave 2 or more (and --pp > 1); with interleave {interleave} the 1F1B schedule's transfers block either "
        f"way (Megatron-Core's non-interleaved schedule: \"Non-interleaved pipeline parallelism does not support "
        f"overlapping p2p communication\"), so the flag would change nothing")


def cp_comm_suffix(comm_type: str, sizes) -> str:
    """How a strategy name writes the CP communication: "" (the ring), ``a2a``, ``ag``, ``a2a+p2p<A>x<B>``."""
    if comm_type == "p2p":
        return ""
    if comm_type == "a2a+p2p":
        return f"a2a+p2p{sizes[0]}x{sizes[1]}" if sizes else "a2a+p2p"
    return CP_COMM_TOKENS[comm_type]


def cp_group_sizes(cfg: ParallelConfig) -> tuple[int, int]:
    """(all-to-all group size, KV-ring size) of a checked config: p2p (1, cp), a2a (cp, 1), a2a+p2p its hierarchical
    sizes, allgather (1, 1) (no ring, no all-to-all). Inner group innermost (consecutive CP ranks), as Megatron-Core's
    ``parallel_state.create_hierarchical_groups`` builds ``--hierarchical-context-parallel-sizes``."""
    t = cfg.cp_comm_type
    if cfg.cp <= 1 or t == "p2p":
        return 1, cfg.cp
    a2a = cfg.cp if t == "a2a" else int(cfg.hierarchical_cp_sizes[0]) if t == "a2a+p2p" else 1
    return a2a, cp_ring_size(t, cfg.cp, a2a)


def cp_sizes_pair(value) -> tuple[int, int] | None:
    """``--hierarchical-cp-sizes`` read as (A, B): the text "A,B" (blanks around each number allowed) or a pair of
    positive integers (or of digit strings); None when it is not one (each caller raises its own message)."""
    if isinstance(value, str):
        parts = [x.strip() for x in value.split(",")]
    else:
        try:
            parts = list(value)
        except TypeError:  # not a pair: one number, None, ...
            return None
    if len(parts) != 2 or not all(is_count(x) or (isinstance(x, str) and x.isdecimal() and int(x) >= 1) for x in parts):
        return None
    return int(parts[0]), int(parts[1])


def check_cp_comm(comm_type, sizes, cp: int) -> tuple[str, tuple[int, int] | None]:
    """(comm type, sizes) checked: a known ``--cp-comm-type``; ``--hierarchical-cp-sizes`` given with a2a+p2p only, two
    positive integers whose product is cp (Megatron-LM's arguments.py asserts the product; TE's
    ``attn_forward_func_with_cp`` needs ``cp_group = [a2a_cp_group, p2p_cp_group]``). ParallelConfigError otherwise."""
    t = str(comm_type).lower().replace("all_gather", "allgather")
    if t not in CP_COMM_TYPES:
        raise ParallelConfigError(f"--cp-comm-type must be one of {', '.join(CP_COMM_TYPES)}, got {comm_type!r}")
    if sizes is None:
        if t == "a2a+p2p":
            raise ParallelConfigError("--cp-comm-type a2a+p2p needs --hierarchical-cp-sizes A,B (the inner all-to-all "
                                      "group and the outer ring, A x B = cp)")
        return t, None
    if t != "a2a+p2p":
        raise ParallelConfigError(f"--hierarchical-cp-sizes applies to --cp-comm-type a2a+p2p only, not {t}")
    pair = cp_sizes_pair(sizes)
    if pair is None:
        raise ParallelConfigError(f"--hierarchical-cp-sizes must be two positive integers A,B, got {sizes!r}")
    a, b = pair
    if a * b != cp:
        raise ParallelConfigError(f"--hierarchical-cp-sizes {a},{b}: their product ({a * b}) must equal cp ({cp})")
    return t, (a, b)


def recompute_layers_suffix(num_layers: int | None, method: str) -> str:
    """How a strategy name writes the recomputed-layer count: "" (every layer), ``N`` (block method), ``uN`` (uniform)."""
    return "" if num_layers is None else f"{'u' if method == 'uniform' else ''}{num_layers}"


def stage_flags_text(first: int | None, last: int | None) -> str:
    """The given ``--pp-first-stage-layers`` / ``--pp-last-stage-layers`` as flags ("--pp-first-stage-layers 5"), the
    head of the rule a split they cannot build breaks (predict's error, a search candidate's ``rejected`` rule)."""
    return " ".join(f"{flag} {int(v)}" for flag, v in (("--pp-first-stage-layers", first),
                                                       ("--pp-last-stage-layers", last)) if v is not None)


def stage_layers(n_layers: int, n_chunks: int, *, first: int | None = None, last: int | None = None,
                 deepspeed: bool = False) -> list[int]:
    """Transformer layers of each model chunk (stage, or virtual stage under interleaving), in pipeline order.

    - ``first``/``last`` given (Megatron-Core's ``decoder_first/last_pipeline_num_layers``): those on the first and
      last stage, the rest split evenly over the stages between (they must divide, Megatron's rule);
    - layers divisible by the chunks: equal;
    - otherwise Megatron/PyTorch (``deepspeed`` False): balanced, the stages differing by one layer at most, and the
      stages with one layer fewer are the first and the last (they also hold the embedding and the output layer
      with the loss), then inwards: Llama 3 405B's 126 layers on 16 stages are 7, 8 x 14, 7, as Meta ran it (Dubey
      et al. 2024 Sec. 3.3.2: "we reduce one Transformer layer each from the first and the last stages");
    - DeepSpeed's partitioner (``deepspeed``): layer ``i`` on chunk ``i x chunks // layers``, sizes differing by one.
    """
    if first is not None or last is not None:
        f = 0 if first is None else int(first)
        lst = 0 if last is None else int(last)
        for flag, v in (("--pp-first-stage-layers", first), ("--pp-last-stage-layers", last)):
            if v is not None and int(v) > n_layers:
                raise ParallelConfigError(f"{flag} {int(v)} exceeds the model's {n_layers} transformer layers")
        mid = n_layers - f - lst
        inner = n_chunks - (first is not None) - (last is not None)
        if first is not None and last is not None and mid < 0:
            raise ParallelConfigError(
                f"--pp-first-stage-layers {f} and --pp-last-stage-layers {lst} together ({f + lst}) exceed the model's "
                f"{n_layers} transformer layers")
        if inner <= 0:
            if mid != 0:
                raise ParallelConfigError(
                    f"--pp-first-stage-layers/--pp-last-stage-layers ({f} + {lst}) must add up to the "
                    f"model's {n_layers} layers when they name every stage")
            return [f] if n_chunks == 1 else [f, lst]
        given = " and ".join([f"{f} on the first stage"] * (first is not None) + [f"{lst} on the last stage"] * (last is not None))
        others = f"the other {inner} stage{'s' if inner > 1 else ''}"
        if mid < inner:
            raise ParallelConfigError(
                f"{stage_flags_text(first, last)}: the model's {n_layers} transformer layers with {given} leave {mid} "
                f"for {others}: every stage needs at least one layer")
        if mid % inner:
            raise ParallelConfigError(
                f"{stage_flags_text(first, last)}: the model's {n_layers} transformer layers with {given} leave {mid} "
                f"for {others}: they must divide evenly (Megatron-Core's rule)")
        counts = [mid // inner] * inner
        return ([f] if first is not None else []) + counts + ([lst] if last is not None else [])
    q, r = divmod(n_layers, n_chunks)
    if r == 0:
        return [q] * n_chunks
    if deepspeed:
        import numpy as np

        return np.bincount((np.arange(n_layers) * n_chunks) // n_layers, minlength=n_chunks).tolist()
    counts = [q + 1] * n_chunks
    # n_chunks - r chunks get q: the outermost first (first, last, second, second-to-last, ...)
    order = [i for pair in zip(range(n_chunks), range(n_chunks - 1, -1, -1)) for i in pair]
    taken: list[int] = []
    for i in order:
        if len(taken) == n_chunks - r:
            break
        if i not in taken:
            taken.append(i)
            counts[i] = q
    return counts


def _edge_costs(edge_layers: tuple[float, float]) -> tuple[float, float]:
    """(embedding, output layer + loss) in layer-equivalents, checked finite and >= 0."""
    e, h = (float(x) for x in edge_layers)
    if not (np.isfinite(e) and np.isfinite(h) and e >= 0 and h >= 0):
        raise ValueError(f"edge_layers must be finite and >= 0, got {edge_layers!r}")
    return e, h


def _split_candidates(n_layers: int, P: int, edge_layers: tuple[float, float], min_layers: int):
    """Every automatic split of :func:`balanced_stage_layers` as (first stage's layers, last stage's, the stages
    between's together, the slowest stage's work in layers: inf where a stage would hold fewer than ``min_layers``),
    one entry per (first, last) pair."""
    e, h = _edge_costs(edge_layers)
    a = np.arange(min_layers, n_layers + 1)
    first, last = (x.ravel() for x in np.meshgrid(a, a, indexing="ij"))
    mid = n_layers - first - last
    inner = P - 2
    if inner == 0:
        ok = mid == 0
        mid_max = np.zeros_like(mid)
    else:
        ok = mid >= inner * min_layers
        mid_max = -(-mid // inner)
    cost = np.maximum(np.maximum(first + e, last + h), mid_max).astype(float)
    return first, last, mid, np.where(ok, cost, np.inf)


def balanced_stage_layers(n_layers: int, n_stages: int, edge_layers: tuple[float, float], *,
                          min_layers: int = 1) -> list[int]:
    """The automatic split when the layers do not divide the stages, balanced on cost: the transformer layers of each
    stage minimizing the slowest stage's work, the first stage also running the embedding and the last the output
    layer with the loss.

    ``edge_layers`` = (embedding, output layer + loss) in layer-equivalents: their forward + backward time of one
    micro-batch over a transformer layer's (``simulate.distributed.edge_layer_equivalents``, from the costed graph).
    Megatron-LM's own ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split`` count
    each as exactly one layer (Megatron-Core 0.16.1 transformer/transformer_config.py l. 1435-1478: layers + 2 must
    divide the stages; transformer/transformer_block.py l. 140-200 and transformer/transformer_layer.py l. 154-190,
    ``get_transformer_layer_offset``: the first stage's share less one for the embedding, the last's less one for the
    loss); here each counts what it costs, which for a 128k-vocabulary head is
    more than one layer (Llama 3 8B, TP1: the head and the loss cost 2.4 layers) and for the embedding lookup nearly
    nothing. Every stage holds at least ``min_layers`` (the virtual stages under ``--interleave``). The stages between
    the first and the last have no extra work, so they split their layers evenly (the old rule's order); the first and
    the last stage's counts are searched. Ties (an equal slowest stage, compared to 1e-9 layer) go to the split nearest
    the layer-count balance of :func:`stage_layers` (Llama 3 405B on 16 stages keeps 7, 8 x 14, 7: its head costs 0.6
    of a layer), then to fewer layers on the earlier stages (1F1B keeps more micro-batches in flight there).
    Time only: a split that does not fit the device memory is replaced by :func:`memory_fitting_split`'s (the
    caller, ``simulate.distributed.schedule_step``, holds the memory model)."""
    P = int(n_stages)
    _edge_costs(edge_layers)
    even = stage_layers(n_layers, P)
    if P == 1 or n_layers % P == 0:
        return even
    first, last, mid, cost = _split_candidates(n_layers, P, edge_layers, min_layers)
    inner = P - 2
    best = cost.min()
    if not np.isfinite(best):  # no split holds min_layers a stage: the caller's check names the rule
        return even
    ties = np.flatnonzero(cost <= best + 1e-9)

    def split(i: int) -> list[int]:
        return [int(first[i])] + (stage_layers(int(mid[i]), inner) if inner else []) + [int(last[i])]

    return min((split(i) for i in ties), key=lambda c: (sum(abs(x - y) for x, y in zip(c, even)), c))


def _held(level: float, ub: np.ndarray, edge: np.ndarray) -> np.ndarray:
    """Each stage's layers at a slowest-stage work of ``level``: as many as fit under it (to 1e-9 layer), at most
    ``ub``."""
    return np.minimum(ub, np.floor(level - edge + 1e-9)).astype(int)


def memory_fitting_split(n_layers: int, n_stages: int, edge_layers: tuple[float, float], stage_fits,
                         tried: list[int], tried_fits: np.ndarray, *, min_layers: int = 1) -> list[int] | None:
    """The automatic split when :func:`balanced_stage_layers`' (``tried``, its stages fitting the device memory or not
    in ``tried_fits``) does not fit: the split of the least slowest-stage work, over every split of the layers into
    per-stage counts of at least ``min_layers``, whose every stage fits by ``stage_fits(counts)`` -> a bool per stage
    (the caller's memory model); None when none fits (the caller keeps ``tried`` and refuses it naming the memory).

    Under 1F1B the first stage holds the most micro-batches in flight (pp of them), so the layer moved onto it by the
    time balance can push it over the memory a layer-count split fits in (Llama 3 8B on 3 H100 stages, TP1, ZeRO-0:
    11, 12, 9 needs 91.1 GB on stage 0, 10, 11, 11 fits in 83.7). A stage's memory grows with its own layers and does
    not depend on the other stages' counts (its parameters, gradients, optimizer states and in-flight activations are
    its layers'; exact for alike layers, an assumption for a stack of dense then MoE layers, whose stages' contents
    shift with the other stages' counts), so a stage that does not fit with ``c`` layers fits with at most ``c - 1``:
    an upper bound per stage, learned from each probe.

    Water-filling under those caps: stage s's work is its layers plus its edge (the embedding on the first stage, the
    output layer with the loss on the last, in layer-equivalents, as :func:`balanced_stage_layers` counts them); the
    least level T at which every stage taking min(cap, floor(T - edge)) layers holds the model's layers is the least
    slowest-stage work any split within the caps can have. Each stage takes that many; the surplus over the model's
    layers comes off the stages whose work is T, one layer each, the first stage on (fewer stages at the slowest work;
    1F1B keeps the most micro-batches in flight on the earliest stages, so the layers stay on the later ones), any
    stage's after those (one a stage a pass, the first stage on; the tie-break: any of these splits has the slowest
    work T, T being the least level).
    The split is probed; a stage over lowers its cap to one layer fewer than it was given, every stage fitting returns
    the split. Each probe lowers a cap below the split it probed, so no split is probed twice and the loop ends; it
    stops when the caps cannot hold the layers (no probe at all when every stage of ``tried`` is over). Under the
    alike-layer assumption the caps only exclude splits that do not fit, so the split returned has the least
    slowest-stage work of all the splits whose every stage fits (until stop 53 only the splits with the first and the
    last stage's counts searched and the stages between split evenly were tried: DeepSeek-V3 on 16 stages, whose early
    stages need fewer layers and whose last stage carries the head, got a slower split)."""
    P = int(n_stages)
    n_layers, min_layers = int(n_layers), int(min_layers)
    emb, head = _edge_costs(edge_layers)
    edge = np.zeros(P)
    edge[0] += emb
    edge[-1] += head  # one stage (nothing to split): both edges on it
    counts, fits = np.asarray(tried, dtype=int), np.asarray(tried_fits, dtype=bool)
    if P * min_layers > n_layers:  # no split holds min_layers a stage
        return None if (~fits).any() else counts.tolist()
    ub = np.full(P, n_layers)
    while True:
        over = ~fits
        if not over.any():
            return counts.tolist()
        ub = np.where(over, np.minimum(ub, counts - 1), ub)
        if ub.sum() < n_layers or ub.min() < min_layers:
            return None
        # the levels where a stage's count steps up: c + edge for c in min_layers..cap; the least one holding the layers
        # (every stage at min_layers at least: the level starts at the largest min_layers + edge)
        levels = np.unique(np.concatenate([np.arange(min_layers, u + 1) + e for u, e in zip(ub, edge)]))
        levels = levels[levels >= (min_layers + edge).max() - 1e-9]
        lo, hi = 0, len(levels) - 1  # the caps hold the layers: the highest level does; bisect for the least
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _held(levels[mid], ub, edge).sum() >= n_layers else (mid + 1, hi)
        counts = _held(levels[lo], ub, edge)
        # the surplus off the stages whose work is the level first (one layer fewer each: fewer stages at the slowest
        # work), then off any stage; one layer a stage a pass, the first stage on; none below min_layers (the layers
        # hold min_layers a stage: it ends)
        at_level = np.abs(counts + edge - levels[lo]) <= 1e-9
        surplus = int(counts.sum()) - n_layers
        for pool in itertools.chain([np.flatnonzero(at_level)], itertools.repeat(range(P))):
            if not surplus:
                break
            for s in pool:
                if surplus and counts[s] > min_layers:
                    counts[s] -= 1
                    surplus -= 1
        fits = np.asarray(stage_fits(counts.tolist()), dtype=bool)


def _runs(counts: list[int]) -> str:
    """Layer counts written by runs: [3, 4, 4, 4, 3] as "3, 4 x 3, 3"."""
    out = []
    for value, group in itertools.groupby(counts):
        n = len(list(group))
        out.append(f"{value} x {n}" if n > 2 else ", ".join([str(value)] * n))
    return ", ".join(out)


def account_split_chunks(n_layers: int, n_chunks: int) -> list[int] | None:
    """Transformer layers of each model chunk under Megatron-Core's ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split`` (Megatron-Core 0.16.1 transformer_config.py l. 1435-1478 and
    transformer_block.py l. 140-200: the embedding and the loss each count as one layer, layers + 2 divide evenly over
    the chunks, the first chunk's share less the embedding, the last's less the loss);
    None when layers + 2 do not divide (Megatron-Core refuses that) or a chunk would have no layer."""
    per, r = divmod(n_layers + 2, n_chunks)
    if r or per < 2 or n_chunks < 2:
        return None
    return [per - 1] + [per] * (n_chunks - 2) + [per - 1]


def _automatic_split_hint(n_layers: int, pp: int, interleave: int, deepspeed: bool) -> str:
    """What the automatic split (no --pp-first/last-stage-layers) builds for this model, and how Megatron-Core says it:
    the tail of the refusal of first/last stage layers that do not divide by the virtual stages."""
    try:
        auto = chunk_layers(n_layers, pp, interleave, deepspeed=deepspeed)
    except ParallelConfigError:
        return ""
    stages = [sum(auto[v * pp + s] for v in range(interleave)) for s in range(pp)]
    if len(set(auto)) == 1:
        how = "Megatron-Core's default even split (no flag)"
    elif account_split_chunks(n_layers, pp * interleave) == auto:
        how = ("Megatron-Core builds this split with --account-for-embedding-in-pipeline-split "
               "--account-for-loss-in-pipeline-split (the embedding and the loss each counted as a layer), or with "
               "--pipeline-model-parallel-layout")
    else:
        how = "Megatron-Core builds this split with --pipeline-model-parallel-layout"
    return (f". Leave out --pp-first-stage-layers/--pp-last-stage-layers: wattcast's automatic split of the model's "
            f"{n_layers} layers gives stages [{_runs(stages)}] as {pp * interleave} virtual-stage chunks "
            f"[{_runs(auto)}] in pipeline order (stage 0's virtual stages "
            f"{' + '.join(str(auto[v * pp]) for v in range(interleave))}, stage {pp - 1}'s "
            f"{' + '.join(str(auto[v * pp + pp - 1]) for v in range(interleave))}); {how}")


def chunk_layers(n_layers: int, pp: int, interleave: int = 1, *, first: int | None = None, last: int | None = None,
                 deepspeed: bool = False, edge_layers: tuple[float, float] | None = None,
                 stages: list[int] | tuple[int, ...] | None = None) -> list[int]:
    """Transformer layers of each model chunk in pipeline order (chunk ``v x pp + s`` is virtual stage ``v`` of stage
    ``s``, Megatron's interleaved assignment).

    - ``interleave`` 1: the stages of :func:`stage_layers`;
    - layers divisible by ``pp x interleave`` (and no ``first``/``last``): equal chunks (Megatron's rule);
    - ``first``/``last`` given: the stages of :func:`stage_layers`, each split evenly over its ``interleave`` virtual
      stages; each stage's layers must divide by ``interleave`` (Megatron-Core's check on
      ``decoder_first/last_pipeline_num_layers`` under a virtual pipeline);
    - otherwise the balanced stages of :func:`stage_layers` (Llama 3 405B's 126 layers on 16 stages: 7, 8 x 14, 7), each
      stage's layers over its virtual stages differing by one at most, the chunk holding the embedding (first stage,
      first virtual stage) and the one holding the loss (last stage, last virtual stage) taking the fewer; Megatron-Core
      runs such a split with ``--pipeline-model-parallel-layout``;
    - ``edge_layers`` (embedding, output layer + loss) in layer-equivalents, given: where the layers do not divide the
      stages and neither ``first`` nor ``last`` is given (and not ``deepspeed``), the stages are
      :func:`balanced_stage_layers`' cost-balanced split instead of the layer-count balance (each stage at least
      ``interleave`` layers), then split over the virtual stages as above. Layers that divide the stages, and given
      first/last counts, are never moved;
    - ``stages`` given: the automatic split's stage totals the caller chose instead (:func:`memory_fitting_split`, when
      the cost-balanced one does not fit the device memory), split over the virtual stages as above.
    """
    explicit = first is not None or last is not None
    cost_split = edge_layers is not None and not explicit and not deepspeed and pp > 1 and n_layers % pp != 0
    if stages is not None:
        if explicit or deepspeed or len(stages) != pp or sum(stages) != n_layers:
            raise ValueError(f"stages {list(stages)!r}: an automatic split of {n_layers} layers over {pp} stages, "
                             "not with --pp-first/last-stage-layers or DeepSpeed's partitioner")
        stages = [int(n) for n in stages]
        if interleave == 1:
            return stages
    elif interleave == 1:
        if cost_split:
            return balanced_stage_layers(n_layers, pp, edge_layers)
        return stage_layers(n_layers, pp, first=first, last=last, deepspeed=deepspeed)
    elif not explicit and n_layers % (pp * interleave) == 0:
        return [n_layers // (pp * interleave)] * (pp * interleave)
    elif cost_split:
        stages = balanced_stage_layers(n_layers, pp, edge_layers, min_layers=interleave)
    else:
        stages = stage_layers(n_layers, pp, first=first, last=last, deepspeed=deepspeed)
    if explicit:
        bad = [(i, n) for i, n in enumerate(stages) if n % interleave]
        if bad:
            i, n = bad[0]
            raise ParallelConfigError(
                f"{stage_flags_text(first, last)}: with --interleave {interleave}, every stage's layers must divide by "
                f"it (Megatron-Core 0.16.1's rule: "
                f"num_layers_in_first/last_pipeline_stage divide by the virtual pipeline size): stage {i} has {n} (layers per "
                f"stage: {stages}){_automatic_split_hint(n_layers, pp, interleave, deepspeed)}")
    if min(stages) < interleave:
        raise ParallelConfigError(
            f"a stage has {min(stages)} layer(s), fewer than its {interleave} virtual stages (--interleave)")
    per = []
    for s, n in enumerate(stages):
        q, r = divmod(n, interleave)
        split = [q] * interleave
        extra = range(interleave - r, interleave) if s == 0 else range(r)  # the embedding's and the loss's chunks take fewer
        for v in extra:
            split[v] += 1
        per.append(split)
    return [per[s][v] for v in range(interleave) for s in range(pp)]


def pipeline_layout_string(counts: list[int] | tuple[int, ...]) -> str:
    """Megatron-Core's ``--pipeline-model-parallel-layout`` for the transformer layers of each model chunk ``counts``
    (in pipeline order, chunk ``v x pp + s`` virtual stage ``v`` of stage ``s``: the layout's own order,
    Megatron-Core 0.16.1 transformer/pipeline_parallel_layer_layout.py l. 47-53 reads chunk
    ``vpp_rank * pp + pp_rank``): "|" between chunks, "E" (the embedding) before the first chunk's layers, "L" (the
    output layer with the loss) after the last's, "t*n" for n transformer layers and "(...|)*k" for k equal chunks in
    a row between, the syntax of its ``parse_str_to_list`` (l. 283-330). 32 layers as chunks 5, 6, 5, 6, 6, 4:
    "Et*5|t*6|t*5|(t*6|)*2t*4L". The layout sets every chunk's count (transformer/transformer_block.py l. 88-93:
    with a layout ``get_num_layers_to_build`` returns its count, no divisibility rule), so Megatron-Core builds any
    split with it."""
    def body(n: int) -> str:
        return "" if n == 0 else "t" if n == 1 else f"t*{n}"

    c = [int(x) for x in counts]
    if len(c) == 1:
        return f"E{body(c[0])}L"
    pieces = [f"E{body(c[0])}|"]
    for value, group in itertools.groupby(c[1:-1]):
        k = len(list(group))
        pieces.append(f"({body(value)}|)*{k}" if k > 1 else f"{body(value)}|")
    pieces.append(f"{body(c[-1])}L")
    return "".join(pieces)


def first_last_flags_for(counts: list[int] | tuple[int, ...], n_layers: int, pp: int,
                         interleave: int = 1) -> tuple[int | None, int | None] | None:
    """(--pp-first-stage-layers, --pp-last-stage-layers) that build the chunks ``counts`` (:func:`chunk_layers`' order)
    with Megatron-Core's ``decoder_first/last_pipeline_num_layers`` (None for a flag not needed), the fewest flags
    first; None when no such flags build it (the stages between would not be equal, or a stage's layers would not
    divide by ``interleave``: transformer/transformer_block.py l. 119-135 and l. 175)."""
    c = [int(x) for x in counts]
    if pp < 2 or len(c) != pp * interleave:
        return None
    stages = [sum(c[v * pp + s] for v in range(interleave)) for s in range(pp)]
    for first, last in ((stages[0], None), (None, stages[-1]), (stages[0], stages[-1])):
        try:
            if chunk_layers(n_layers, pp, interleave, first=first, last=last) == c:
                return first, last
        except ParallelConfigError:
            pass
    return None


def pipeline_split_report(counts: list[int] | tuple[int, ...], n_layers: int, pp: int, interleave: int = 1, *,
                          framework: str = "megatron", explicit: bool = False,
                          dualpipe: bool = False) -> tuple[str | None, list[str]]:
    """(``parallel.pipeline_layout``, warnings) of a pipeline split ``counts`` (:func:`chunk_layers`' chunks).

    ``pipeline_layout``: under ``framework`` megatron (not DualPipe, which Megatron-Core does not run), where the
    chunks are not all equal, the ``--pipeline-model-parallel-layout`` that builds them
    (:func:`pipeline_layout_string`); None for Megatron-Core's default even split, no pipeline, or another framework.

    warnings: one, where the split is wattcast's automatic one (no ``explicit`` first/last stage layers) and uneven:
    the split itself, and under megatron the flags that make Megatron-Core build it: without a split flag it asserts
    ``num_layers % pipeline_model_parallel_size == 0`` and, under a virtual pipeline, each stage's layers divide by
    ``interleave`` (Megatron-Core 0.16.1 transformer/transformer_block.py l. 155-157 and l. 174-176); the
    --pp-first/last-stage-layers that build it when some do (:func:`first_last_flags_for`), else the layout."""
    c = [int(x) for x in counts]
    if pp < 2 or len(set(c)) < 2:
        return None, []
    megatron = framework == "megatron" and not dualpipe
    layout = pipeline_layout_string(c) if megatron else None
    if explicit:
        return layout, []
    stages = [sum(c[v * pp + s] for v in range(interleave)) for s in range(pp)] if len(c) == pp * interleave else c
    chunks = (f" as {len(c)} virtual-stage chunks [{_runs(c)}] in pipeline order (stage 0's "
              f"{' + '.join(str(c[v * pp]) for v in range(interleave))}, stage {pp - 1}'s "
              f"{' + '.join(str(c[v * pp + pp - 1]) for v in range(interleave))})"
              if interleave > 1 and len(c) == pp * interleave else "")
    what = f"the {pp} stages" + (f" x {interleave} virtual stages (--interleave)" if interleave > 1 else "")
    head = (f"automatic pipeline split: the model's {n_layers} transformer layers do not divide {what} evenly: "
            f"stages [{_runs(stages)}]{chunks}")
    if not megatron:
        how = ("DeepSpeed's PipelineModule partitioning, layer i on chunk i x chunks // layers"
               if framework == "megatron-deepspeed" else
               "wattcast's automatic split: the stages' work balanced, the first stage also running the embedding and "
               "the last the output layer with the loss, within the memory")
        flags = ("" if framework == "megatron-deepspeed" else  # refused there: DeepSpeed partitions the stages
                 "; --pp-first-stage-layers/--pp-last-stage-layers set the first and the last stage's layers")
        return layout, [f"{head} ({how}{flags})"]
    why = (f"num_layers % pipeline_model_parallel_size == 0 ({n_layers} % {pp})" if n_layers % pp else
           f"each stage's layers % the virtual pipeline size == 0 ({n_layers // pp} % {interleave})")
    flags = first_last_flags_for(c, n_layers, pp, interleave)
    account = (" or Megatron-LM's --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split"
               if account_split_chunks(n_layers, pp * interleave) == c else "")
    if flags is not None:
        ours = " ".join(f"--pp-{w}-stage-layers {n}" for w, n in zip(("first", "last"), flags) if n is not None)
        theirs = " ".join(f"--decoder-{w}-pipeline-num-layers {n}" for w, n in zip(("first", "last"), flags)
                          if n is not None)
        build = (f"give {ours} (Megatron-LM's {theirs}){account} or Megatron-LM's "
                 f"--pipeline-model-parallel-layout \"{layout}\"")
    else:
        build = (f"--pp-first-stage-layers/--pp-last-stage-layers cannot build it; Megatron-LM's "
                 f"--pipeline-model-parallel-layout \"{layout}\"{account} does (parallel.pipeline_layout)")
    return layout, [f"{head}. Megatron-Core 0.16.1 builds it only with a split flag (without one it asserts {why}, "
                    f"transformer/transformer_block.py get_num_layers_to_build): {build}"]


def _check_etp(cfg: ParallelConfig, *, dp: int, n_experts: int | None, fw: str | None) -> None:
    """Megatron-Core's rules for ``--expert-tensor-parallel-size`` (MoE parallel folding,
    ``parallel_state.initialize_model_parallel``: the expert ranks etp x ep x expert-dp fold over tp x cp x dp)."""
    etp = cfg.etp
    if not is_count(etp):
        raise ParallelConfigError(f"--expert-tensor-parallel-size must be a positive integer, got {etp!r}")
    if not n_experts:
        raise ParallelConfigError(f"--expert-tensor-parallel-size {etp} needs a mixture-of-experts model "
                                  "(this one has no experts)")
    if fw is not None and fw != "megatron":
        raise ParallelConfigError(f"--expert-tensor-parallel-size is Megatron-Core's (MoE parallel folding): use "
                                  f"--framework megatron, not {fw}")
    if not ((cfg.tp * cfg.cp * dp) % (etp * cfg.ep) == 0):
        raise ParallelConfigError(
            f"expert tensor x expert parallelism ({etp} x {cfg.ep}) must divide tp x cp x dp ({cfg.tp} x {cfg.cp} x {dp}): "
            "Megatron-Core folds the expert ranks over the attention's")


def check_pp_stage_layers(first, last) -> None:
    """``--pp-first-stage-layers`` / ``--pp-last-stage-layers`` (``pp_first_layers`` / ``pp_last_layers``) each None or
    a whole number of layers >= 1 (every pipeline stage holds at least one transformer layer): a ParallelConfigError
    naming the flag otherwise. Whether the counts fit the model and the (pp, interleave) is :func:`chunk_layers`'."""
    for flag, v in (("--pp-first-stage-layers", first), ("--pp-last-stage-layers", last)):
        if not (v is None or ((type(v) is int or is_int(v)) and v >= 1)):
            raise ParallelConfigError(
                f"{flag} must be a whole number of layers, at least 1 (every pipeline stage holds at least one "
                f"transformer layer), got {v!r}")


def resolve_parallel(cfg: ParallelConfig, *, batch: int, n_layers: int, n_heads: int | None = None,
                     n_kv_heads: int | None = None, ffn: int | None = None, n_experts: int | None = None,
                     seq: int | None = None, cluster: ClusterSpec | None = None,
                     uneven_stages: bool = False, framework: str | None = None,
                     moe_token_dispatcher: str = "alltoall") -> ParallelConfig:
    """Fill in ``dp`` and ``micro_batch`` and check every rule; raise ParallelConfigError naming the rule.
    ``uneven_stages``: the framework may give pipeline stages different numbers of layers (DeepSpeed's
    pipeline partitioner does; Megatron-LM needs layers divisible by stages); at least one layer each.
    ``framework`` (hf, megatron, megatron-deepspeed): checks the framework's own limits
    (:data:`PIPELINE_ZERO_MAX`); when it is not given, ``uneven_stages`` stands for DeepSpeed's pipeline
    engine (the only one that partitions unevenly) and its limit applies. ``moe_token_dispatcher``: Megatron-Core's
    ``--moe-token-dispatcher-type`` (the EP all-to-all overlap needs alltoall).

    Counts (tp, pp, dp and micro_batch when given, ep, interleave, then gpus) must be positive integers:
    a 0 or negative degree is named as given, before the job size that was computed from it."""
    # each rule: ``if not (rule): raise ParallelConfigError(message)``; a message is only formatted when its rule is
    # broken (a search checks tens of thousands of candidates)
    d = cfg.__dict__
    if not all((type(v) is int and v >= 1) for v in (d["tp"], d["pp"], d["ep"], d["interleave"], d["cp"], d["gpus"])
               + tuple(d[k] for k in ("dp", "micro_batch") if d[k] is not None)):
        # the common case (plain ints) is checked at once above; here each count in turn, named
        for name in ("tp", "pp", "dp", "micro_batch", "ep", "interleave", "cp", "gpus"):
            v = getattr(cfg, name)
            if v is None and name in ("dp", "micro_batch"):
                continue
            if not ((type(v) is int and v >= 1) or is_count(v)):
                raise ParallelConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
    if not ((type(batch) is int and batch >= 1) or is_count(batch)):
        raise ParallelConfigError(f"--batch (global batch in sequences) must be a positive integer, got {batch!r}")
    fw = framework if framework is not None else ("megatron-deepspeed" if uneven_stages else None)
    if fw == "megatron-deepspeed":
        _check_megatron_deepspeed_flags(cfg)
    mp = cfg.tp * cfg.pp * cfg.cp
    if not (cfg.gpus % mp == 0):
        mp_txt = (f"tp x pp ({cfg.tp} x {cfg.pp} = {mp})" if cfg.cp == 1
                  else f"tp x pp x cp ({cfg.tp} x {cfg.pp} x {cfg.cp} = {mp})")
        raise ParallelConfigError(f"gpus ({cfg.gpus}) must be a multiple of {mp_txt}")
    if fw == "hf" and cfg.cp > 1:  # after the job's layout rule, as a layout that cannot be is the first thing to say
        raise ParallelConfigError(HF_CP_MESSAGE.format(cp=cfg.cp))
    dp = cfg.dp if cfg.dp is not None else cfg.gpus // mp
    if not (dp >= 1 and dp * mp == cfg.gpus):
        raise ParallelConfigError(
            f"dp x tp x pp{' x cp' if cfg.cp > 1 else ''} must equal gpus: {dp} x {cfg.tp} x {cfg.pp}"
            f"{f' x {cfg.cp}' if cfg.cp > 1 else ''} = {dp * mp} != {cfg.gpus}")
    cp_fields = {}
    if cfg.cp_comm_type != "p2p" or cfg.hierarchical_cp_sizes is not None:
        t, sizes = check_cp_comm(cfg.cp_comm_type, cfg.hierarchical_cp_sizes, cfg.cp)
        if t != "p2p" and not cfg.cp > 1:  # as --interleave without --pp, --sp without --tp: refused, not ignored
            raise ParallelConfigError(f"--cp-comm-type {t} says how context parallelism communicates: it needs --cp > 1 "
                                      f"(cp {cfg.cp} runs no context-parallel communication)")
        cp_fields = dict(cp_comm_type=t, hierarchical_cp_sizes=sizes)
    if cfg.cp > 1:
        if not (seq is None or seq % (2 * cfg.cp) == 0):
            raise ParallelConfigError(
                f"sequence length ({seq}) must be divisible by 2 x cp ({2 * cfg.cp}): context parallelism splits each sequence "
                f"into 2 x cp chunks, two per rank, to balance the causal mask")
        a2a = cp_group_sizes(with_fields(cfg, **cp_fields))[0]
        t = cp_fields.get("cp_comm_type", "p2p")
        # TE AttnFuncWithCPAndQKVOA2A.forward (and the a2a part of AttnFuncWithCPAndKVP2P): "requires num_heads %
        # cp_size == 0 for Q, K, V" (the heads of one TP rank, scattered over the a2a group)
        for what, h in (("attention heads", n_heads), ("key/value heads", n_kv_heads if n_kv_heads else n_heads)):
            if a2a > 1 and h is not None and (h % cfg.tp or (h // cfg.tp) % a2a):
                raise ParallelConfigError(
                    f"--cp-comm-type {t}: {what} per tensor-parallel rank ({h} / tp {cfg.tp}) must be divisible by the "
                    f"all-to-all size ({a2a}): the all-to-all scatters the heads")
        if cfg.sp and seq is not None and (seq // cfg.cp) % cfg.tp:
            raise ParallelConfigError(
                f"each context-parallel rank's {seq // cfg.cp if seq else '?'} tokens must be divisible by tp ({cfg.tp}) for "
                f"sequence parallelism")
    mb = cfg.micro_batch if cfg.micro_batch is not None else max(1, batch // dp) if cfg.pp == 1 else 1
    if not (mb >= 1):
        raise ParallelConfigError(f"--micro-batch must be positive, got {mb}")
    if not (batch % (dp * mb) == 0):
        raise ParallelConfigError(
            f"global batch ({batch}) must be divisible by dp x micro-batch ({dp} x {mb} = {dp * mb})")
    n_micro = batch // (dp * mb)
    if n_heads is not None:
        if not (n_heads % cfg.tp == 0):
            raise ParallelConfigError(f"attention heads ({n_heads}) must be divisible by tp ({cfg.tp})")
    if n_kv_heads is not None and cfg.tp > 1 and n_kv_heads % cfg.tp:
        # Megatron-Core takes TP a multiple of the key/value groups too: each rank all-gathers linear_qkv's output and
        # takes one group (megatron-core 0.16.1 transformer_config.py l. 939-945, attention.py l. 289-296, 1398-1415;
        # featurize/hf_models.py llama_megatron); the other frameworks' paths split the heads
        if framework != "megatron":
            raise ParallelConfigError(f"key/value heads ({n_kv_heads}) must be divisible by tp ({cfg.tp})")
        if cfg.tp % n_kv_heads:
            raise ParallelConfigError(
                f"key/value heads ({n_kv_heads}) must be a multiple or a divisor of tp ({cfg.tp}): Megatron-Core's "
                f"num_query_groups rule (transformer_config.py l. 939-945)")
    if ffn is not None:
        if not (ffn % cfg.tp == 0):
            raise ParallelConfigError(f"FFN size ({ffn}) must be divisible by tp ({cfg.tp})")
    if not (n_layers >= cfg.pp * cfg.interleave or cfg.pp * cfg.interleave == 1):
        raise ParallelConfigError(
            f"layers ({n_layers}) must be at least pp x interleave ({cfg.pp} x {cfg.interleave} = {cfg.pp * cfg.interleave})")
    explicit = cfg.pp_first_layers is not None or cfg.pp_last_layers is not None
    check_pp_stage_layers(cfg.pp_first_layers, cfg.pp_last_layers)
    if explicit:
        if not (cfg.pp > 1):
            raise ParallelConfigError(
                "--pp-first-stage-layers/--pp-last-stage-layers need pipeline parallelism (--pp > 1)")
        chunk_layers(n_layers, cfg.pp, cfg.interleave, first=cfg.pp_first_layers, last=cfg.pp_last_layers)  # raises
    elif n_layers % (cfg.pp * cfg.interleave) and cfg.interleave > 1:
        chunk_layers(n_layers, cfg.pp, cfg.interleave, deepspeed=uneven_stages)  # raises naming the rule
    if not (cfg.interleave == 1 or cfg.pp > 1):
        raise ParallelConfigError("--interleave needs pipeline parallelism (--pp > 1)")
    if not (cfg.schedule in SCHEDULES):
        raise ParallelConfigError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {cfg.schedule!r}")
    if not (cfg.interleave == 1 or cfg.schedule == "1f1b"):
        raise ParallelConfigError(
            f"--interleave {cfg.interleave} (virtual pipeline stages) is interleaved 1F1B: it cannot run with --schedule "
            f"{cfg.schedule}; use --schedule 1f1b or --interleave 1")
    if cfg.schedule == "dualpipe":
        _check_dualpipe(cfg, n_micro, fw)
    if cfg.interleave > 1:
        if not (n_micro % cfg.pp == 0):
            raise ParallelConfigError(
                f"interleaved 1F1B needs the number of micro-batches ({n_micro}) to be a multiple of pp ({cfg.pp})")
    if cfg.sp and cfg.tp <= 1:
        raise ParallelConfigError("--sp (sequence parallelism) needs tensor parallelism (--tp > 1)")
    if cfg.sp and seq is not None:
        if not (seq % cfg.tp == 0):
            raise ParallelConfigError(
                f"sequence length ({seq}) must be divisible by tp ({cfg.tp}) for sequence parallelism")
    if not ((type(cfg.zero) is int or is_int(cfg.zero)) and cfg.zero in (0, 1, 2, 3)):
        raise ParallelConfigError(f"--zero must be 0, 1, 2 or 3, got {cfg.zero!r}")
    zmax = PIPELINE_ZERO_MAX.get(fw)
    if zmax is not None and cfg.pp > 1:
        if not (cfg.zero <= zmax):
            raise ParallelConfigError(
                f"pipeline parallelism (pp {cfg.pp}) with ZeRO stage {cfg.zero}: {fw} runs pipelines with ZeRO stage "
                f"{zmax} at most (DeepSpeed's pipeline engine supports ZeRO-1; Megatron-LM's distributed optimizer is "
                f"ZeRO-1); use --zero {zmax} or lower, or --pp 1")
    if cfg.ep > 1:
        if not (n_experts is not None):
            raise ParallelConfigError(f"--ep {cfg.ep} needs a mixture-of-experts model (this one has no experts)")
        if not (n_experts % cfg.ep == 0):
            raise ParallelConfigError(f"experts ({n_experts}) must be divisible by ep ({cfg.ep})")
        # Megatron-Core's MoE parallel folding: the experts' ranks (etp, ep, expert-dp, pp) fold over the attention's
        # (tp, cp, dp, pp), so ep divides dp x cp (not dp alone) when the experts keep the attention's tp
        if cfg.etp is None and not ((dp * cfg.cp) % cfg.ep == 0):
            raise ParallelConfigError(f"ep ({cfg.ep}) must divide the data-parallel x context-parallel size "
                                      f"({dp} x {cfg.cp})")
    if cfg.etp is not None:
        _check_etp(cfg, dp=dp, n_experts=n_experts, fw=fw)
    if fw == "megatron" and n_experts and cfg.tp > 1 and not cfg.sp:
        # Megatron-LM's validate_args: "When using MoE and tensor parallelism, sequence parallelism must be used"
        raise ParallelConfigError(f"mixture of experts with tensor parallelism (tp {cfg.tp}): Megatron-Core needs sequence "
                                  f"parallelism then (--sp)")
    try:
        recompute = recompute_setting(cfg.recompute)
    except RecomputeError as e:
        raise ParallelConfigError(f"--recompute: {e}") from None
    rn = cfg.recompute_num_layers
    if rn is not None:
        if not is_count(rn):
            raise ParallelConfigError(f"--recompute-num-layers must be a whole number of layers >= 1, got {rn!r}")
        if cfg.recompute != "full":
            raise ParallelConfigError(
                f"--recompute-num-layers {rn} is Megatron's block or uniform recomputation of whole layers: it needs "
                f"--recompute full (got {cfg.recompute}); selective recomputation applies to every layer")
    method = cfg.recompute_method
    if method is not None:
        if method not in ("block", "uniform"):
            raise ParallelConfigError(f"--recompute-method must be block or uniform, got {method!r}")
        if cfg.recompute != "full":
            raise ParallelConfigError(
                f"--recompute-method {method} says which layers Megatron's full recomputation recomputes: it needs "
                f"--recompute full (got {cfg.recompute})"
                + ("; selective recomputation applies to every layer and takes no method (Megatron refuses it too)"
                   if recompute.startswith("selective") else ""))
    if method == "uniform" and rn is None:
        raise ParallelConfigError("--recompute-method uniform groups --recompute-num-layers layers: give that too")
    if method is None and rn is not None:
        method = "block"  # Megatron's block method unless told otherwise
    if cluster is not None:
        check_job_size(cfg.gpus, cluster)
    fw_name = framework or ("megatron-deepspeed" if uneven_stages else "hf")
    # the nodes (NVLink domains) the worst TP group spans: Transformer Engine's userbuffers (--tp-comm-overlap) work
    # within one (simulate/overlap.py); no cluster: not known, one
    tp_nodes = (group_layout(cfg.tp, 1, cluster.gpus_per_node, cfg.gpus).nodes
                if cluster is not None and cfg.tp > 1 else 1)
    defaults = overlap_defaults(fw_name, tp=cfg.tp, sp=cfg.sp, zero=cfg.zero, interleave=cfg.interleave,
                                schedule=cfg.schedule, tp_nodes=tp_nodes)
    flags = {}
    for name, default in defaults.items():
        v = d[name]
        if v is None:
            flags[name] = default
            continue
        if not isinstance(v, bool):
            raise ParallelConfigError(f"--{name.replace('_', '-')} must be true or false, got {v!r}")
        if v and fw_name != "megatron" and name not in ANY_FRAMEWORK_FLAGS:
            raise ParallelConfigError(
                f"--{name.replace('_', '-')} is a Megatron-Core option: use --framework megatron "
                f"({MEGATRON_ONLY_REASONS[name]})")
        flags[name] = v
    if cfg.overlap_param_gather and cfg.zero < 1:
        raise ParallelConfigError(
            "--overlap-param-gather overlaps the distributed optimizer's parameter all-gather: it needs --zero 1 or more")
    if d["overlap_param_gather"] is None and not flags["overlap_grad_reduce"]:
        flags["overlap_param_gather"] = False  # its default follows the grad-reduce overlap (the rule below)
    if flags["overlap_param_gather"] and not flags["overlap_grad_reduce"]:
        # Megatron-LM megatron/training/arguments.py validate_args: ``assert args.overlap_grad_reduce, 'Must use
        # --overlap-param-gather with --overlap-grad-reduce'`` (Megatron-Core 0.16.1's DistributedDataParallelConfig
        # does not check it itself: without overlap_grad_reduce its buffers are one bucket, bucket_size infinite,
        # distributed_data_parallel.py, so there would be nothing to gather bucket by bucket)
        raise ParallelConfigError(
            "--overlap-param-gather needs --overlap-grad-reduce (Megatron-LM's validate_args: \"Must use "
            "--overlap-param-gather with --overlap-grad-reduce\")")
    if cfg.overlap_moe_expert_parallel_comm and not cfg.ep > 1:
        raise ParallelConfigError(
            "--overlap-moe-expert-parallel-comm overlaps the expert-parallel all-to-alls: it needs --ep > 1")
    if fw == "megatron-deepspeed" and cfg.interleave > 1:
        raise ParallelConfigError(f"--interleave {cfg.interleave}: DeepSpeed's pipeline engine (megatron-deepspeed) runs "
                                  f"1F1B, it has no interleaved schedule")
    if cfg.schedule == "dualpipe" and cfg.ep > 1 and d["overlap_moe_expert_parallel_comm"] is None:
        # DualPipe's F&B pairs run each chunk's all-to-alls beside the other chunk's computation by construction
        # (DeepSeek-V3 report Sec. 3.2.1, Fig. 4): the pairing is on unless turned off
        flags["overlap_moe_expert_parallel_comm"] = True
        cfg = with_fields(cfg, overlap_moe_expert_parallel_comm=True)
    if cfg.overlap_moe_expert_parallel_comm and str(moe_token_dispatcher).lower() not in ("alltoall", "flex"):
        # megatron-core 0.16.1 transformer_config.py l. 1866-1869: ``assert self.moe_token_dispatcher_type in
        # ['alltoall', 'flex'], 'overlap_moe_expert_parallel_comm is supported with alltoall/flex token dispatcher'``
        raise ParallelConfigError(
            f"--overlap-moe-expert-parallel-comm with --moe-token-dispatcher-type {moe_token_dispatcher}: Megatron-Core "
            f"refuses it (transformer_config.py: \"overlap_moe_expert_parallel_comm is supported with alltoall/flex token "
            f"dispatcher\")" + ("; --schedule dualpipe turns it on by default, give --no-overlap-moe-expert-parallel-comm"
                                 if d["overlap_moe_expert_parallel_comm"] is None else ""))
    if cfg.overlap_moe_expert_parallel_comm and cfg.pp > 1 and cfg.interleave < 2 and cfg.schedule != "dualpipe":
        raise ParallelConfigError(
            f"--overlap-moe-expert-parallel-comm pairs one micro-batch's forward with another's backward chunk by chunk: "
            f"with pipeline parallelism (pp {cfg.pp}) Megatron-Core needs the interleaved schedule (--interleave 2 or "
            f"more; its virtual pipeline)")
    if cfg.overlap_moe_expert_parallel_comm and not n_micro >= 2:
        raise ParallelConfigError(
            f"--overlap-moe-expert-parallel-comm runs one micro-batch's all-to-alls beside another micro-batch's "
            f"computation: it needs at least 2 micro-batches per step (this step has {n_micro})")
    if cfg.tp_comm_overlap and not (cfg.tp > 1 and cfg.sp):
        raise ParallelConfigError(
            "--tp-comm-overlap pipelines the sequence-parallel all-gathers and reduce-scatters with their GEMMs: it needs "
            "--tp > 1 and --sp")
    if cfg.tp_comm_overlap and tp_nodes > 1:
        # as the rules above: an overlap the layout cannot run is refused when asked for (its default is off here)
        why, fix = tp_overlap_domain_hint(cfg.tp, tp_nodes, cluster)
        raise ParallelConfigError(f"--tp-comm-overlap: {why}. Leave the flag out (off by default for this layout) or "
                                  f"give --no-tp-comm-overlap; {fix}")
    if cfg.async_tp_comm and not (cfg.tp > 1 and cfg.schedule != "dualpipe"):
        # as --tp-comm-overlap without a TP group: a True that would change nothing is refused (False is accepted
        # anywhere: it is the default there, and --no-overlap / Megatron-LM 2021's runs turn every overlap off)
        raise ParallelConfigError(
            "--async-tp-comm runs the column-parallel linears' backward TP collective beside their weight-gradient GEMM: "
            + (f"it needs --tp > 1 (got {cfg.tp})" if cfg.tp <= 1 else
               "not under --schedule dualpipe, whose weight gradients run apart (Transformer Engine's "
               "delay_wgrad_compute), so the flag would change nothing there"))
    if cfg.interleave == 1 and flags.get("overlap_p2p_comm"):
        # an explicit True at interleave 1 (the default is off there: overlap_defaults): Megatron-LM forces it off
        # without the interleaved schedule (megatron/training/arguments.py l. 976-979, 0.19.2 wheel), so report what
        # runs (until stop 47 the JSON said true at --interleave 1; the step never used it). The API and CLI refuse
        # the explicit flag there first (check_overlap_p2p_flag); a ParallelConfig given directly reaches this
        flags["overlap_p2p_comm"] = False
    return with_fields(cfg, dp=dp, micro_batch=mb, recompute=recompute, recompute_method=method, **flags, **cp_fields)


#: ``--cp`` > 1 under ``--framework hf``, refused (until stop 50 it silently costed Megatron-Core's context parallelism,
#: Transformer Engine's ring ``AttnFuncWithCPAndKVP2P``, for a Hugging Face step). Hugging Face's context parallelism
#: is another mechanism: Accelerate's ``ParallelismConfig(cp_size=...)`` (accelerate 1.15.0 ``parallelism_config.py``
#: l. 51-54, ``cp_backend`` "torch (FSDP2)"; ``accelerator.py`` ``_prepare_cp`` l. 1659-1666 and
#: ``maybe_context_parallel``: "currently supported with FSDP2", otherwise it has no effect) wraps PyTorch's
#: ``torch.distributed.tensor.experimental.context_parallel``, which dispatches SDPA only
#: (``aten._scaled_dot_product_{flash,efficient,cudnn}_attention``, torch 2.13 ``_context_parallel/_attention.py``
#: l. 918-923). Its rotation, Accelerate's ``cp_comm_strategy`` (``utils/dataclasses.py`` l. 2230-2245, default
#: "allgather"), all-gathers the whole K/V once per attention (``_AllGatherRotater``, waited for before the second block:
#: hidden behind one block, not one ring step per block as TE's p2p), again in the backward, and rotates dK/dV with an
#: all-to-all permute every step (``dkv_rotater``, l. 520); only its head-tail load balance matches TE's. wattcast
#: models none of that.
HF_CP_MESSAGE = ("--cp {cp} (context parallelism) is costed as Megatron-Core runs it (Transformer Engine's ring "
                 "attention): use --framework megatron, or --cp 1. Hugging Face's context parallelism (Accelerate's "
                 "ParallelismConfig cp_size over torch.distributed.tensor.experimental.context_parallel: FSDP2 and "
                 "SDPA only, K/V all-gathered by default) is not modelled")


def _check_megatron_deepspeed_flags(cfg: ParallelConfig) -> None:
    """Megatron-Core options Megatron-DeepSpeed does not have, refused as the --overlap-* flags are for the frameworks
    without them: ring context parallelism (``--cp`` > 1: Megatron-DeepSpeed's long-sequence option is
    DeepSpeed-Ulysses, ``--ds-sequence-parallel-size``, which wattcast does not model) and Megatron-Core's
    ``decoder_first/last_pipeline_num_layers`` (``--pp-first-stage-layers`` / ``--pp-last-stage-layers``: DeepSpeed's
    ``PipelineModule`` partitions the stages by its ``partition_method``, :func:`stage_layers`' ``deepspeed`` split)."""
    if cfg.cp > 1:
        raise ParallelConfigError(
            f"--cp {cfg.cp} (ring context parallelism) is a Megatron-Core option: --framework megatron-deepspeed has "
            f"none (its long-sequence option is DeepSpeed-Ulysses, --ds-sequence-parallel-size, not modelled); use "
            f"--framework megatron, or --cp 1")
    for flag, v in (("--pp-first-stage-layers", cfg.pp_first_layers), ("--pp-last-stage-layers", cfg.pp_last_layers)):
        if v is not None:
            raise ParallelConfigError(
                f"{flag} {v!r} is a Megatron-Core option (decoder_first/last_pipeline_num_layers): --framework "
                f"megatron-deepspeed partitions the pipeline stages with DeepSpeed's PipelineModule (partition_method; "
                f"layers that do not divide are split by its partitioner, sizes differing by one); use --framework "
                f"megatron, or leave it out")


def _check_dualpipe(cfg: ParallelConfig, n_micro: int, framework: str | None) -> None:
    """DualPipe's rules (:func:`wattcast.simulate.dualpipe.check_dualpipe`: even pp, an even micro-batch count of at
    least 2 pp, no virtual stages) and this model's: DeepSpeed's pipeline engine has no DualPipe, and ZeRO-2/3 with it
    is not modelled (DeepSeek-V3 ran ZeRO-1)."""
    from wattcast.simulate.dualpipe import DualPipeError, check_dualpipe

    if framework == "megatron-deepspeed":
        raise ParallelConfigError("--schedule dualpipe: DeepSpeed's pipeline engine (megatron-deepspeed) runs 1F1B only")
    if cfg.zero >= 2:
        raise ParallelConfigError(f"--schedule dualpipe with --zero {cfg.zero} is not modelled (DeepSeek-V3 ran ZeRO-1): "
                                  f"use --zero 0 or 1")
    try:
        check_dualpipe(cfg.pp, n_micro, cfg.interleave)
    except DualPipeError as e:
        raise ParallelConfigError(str(e)) from None


def check_job_size(gpus: int, cluster: ClusterSpec) -> None:
    """The rules of the job's size on ``cluster``, which no parallel strategy changes (ParallelConfigError naming the
    rule): a job beyond one node needs a cross-node tier, whole nodes (unless exotic figures are allowed) and at most
    the cluster's ``max_nodes``."""
    if gpus <= cluster.gpus_per_node:
        return
    if not (cluster.inter is not None):
        raise ParallelConfigError(
            f"{gpus} GPUs need more than one node, but cluster {cluster.name} has no cross-node tier")
    nodes = -(-gpus // cluster.gpus_per_node)
    # a partly filled node would put some parallel groups across a node boundary that the group layouts
    # (whole nodes, Megatron rank order) do not see: a silently wrong communication time
    if not (gpus % cluster.gpus_per_node == 0 or exotic_allowed()):
        raise ParallelConfigError(
            f"{gpus} GPUs do not fill whole nodes of cluster {cluster.name} (gpus_per_node "
            f"{cluster.gpus_per_node}: {gpus // cluster.gpus_per_node} full node(s) and "
            f"{gpus % cluster.gpus_per_node} GPU(s) more); a job spanning nodes needs a multiple of gpus_per_node "
            f"({cluster.gpus_per_node * (nodes - 1)} or {cluster.gpus_per_node * nodes} GPUs), --gpus-per-node to use part "
            "of every node, or check gpus_per_node in the cluster spec (--force models the partial node as a whole "
            "one)")
    if not (cluster.max_nodes is None or nodes <= cluster.max_nodes):
        raise ParallelConfigError(
            f"{gpus} GPUs need {nodes} nodes; cluster {cluster.name} has {cluster.max_nodes}")


def with_fields(cfg: ParallelConfig, **changes) -> ParallelConfig:
    """``dataclasses.replace(cfg, **changes)`` without re-running ``__init__`` (a search makes tens of thousands): the
    same frozen object, its fields copied and ``changes`` set. ``changes`` must name fields of ParallelConfig."""
    out = object.__new__(ParallelConfig)
    d = out.__dict__
    d.update(cfg.__dict__)
    d.update(changes)
    return out


def new_config(**fields) -> ParallelConfig:
    """``ParallelConfig(**fields)`` built the way :func:`with_fields` builds (a search enumerates tens of thousands)."""
    return with_fields(_DEFAULT_CONFIG, **fields)


_DEFAULT_CONFIG = ParallelConfig()


@dataclass(frozen=True)
class GroupLayout:
    """Where the members of one parallel group sit: how many GPUs, how many share a node, how many nodes; and
    ``concurrent``: how many GPUs of a node drive inter-node traffic at once with the group's collectives (its own
    members there and the other groups of its kind beside them: :func:`inter_senders_per_node`), the collective
    model's ``concurrent_per_node`` (models/collectives.py: the NICs a node's GPUs share). None: the group alone, a
    group inside one node, or a layout built without the job's other groups."""

    size: int
    gpus_per_node: int
    nodes: int
    concurrent: int | None = None


def group_layout(size: int, stride: int, gpus_per_node: int, world: int | None = None) -> GroupLayout:
    """Members ``stride`` ranks apart (Megatron order: tp stride 1, dp stride tp, pp stride tp x dp), on a job of
    ``world`` ranks (None: as many as the pattern takes to repeat).

    All groups of a kind run their collectives at once and the step waits for the slowest, so the layout is the worst
    group's: the fewest members any group has on one node (:func:`worst_members_per_node`; a group of 16 on 72-GPU
    NVL72 racks, ranks 64-79, has 8 on each of two racks; tp 6 on 8-GPU nodes, ranks 6-11, has 2 on one node), and the
    nodes that many per node take. Where the groups tile the nodes (every power-of-two layout on 8-GPU nodes) that is
    ``g // stride`` members per node, as before stop 40; until then a group that did not tile was costed as the first
    group, inside one node (search ranked an ep16 on two NVL72 racks first, its all-to-all over NVLink)."""
    if size <= 1:
        return GroupLayout(1, 1, 1)
    per = worst_members_per_node(size, stride, gpus_per_node, world)
    nodes = -(-size // per)
    return GroupLayout(size, per, nodes, inter_senders_per_node(size, stride, gpus_per_node, world) if nodes > 1 else None)


def _group_nodes(size: int, stride: int, g: int, world: int | None) -> np.ndarray:
    """The node of each member of every group of ``size`` members ``stride`` ranks apart on ``g``-GPU nodes, over one
    period of the rank pattern (lcm(size x stride, g) ranks, at most the job's ``world``): (groups, members)."""
    block = size * stride
    period = block * g // math.gcd(block, g)
    if world is not None:
        period = min(period, max(int(world) // block, 1) * block)
    starts = (np.arange(period // block)[:, None] * block + np.arange(stride)[None, :]).ravel()
    return (starts[:, None] + stride * np.arange(size)[None, :]) // g


@lru_cache(maxsize=4096)
def inter_senders_per_node(size: int, stride: int, gpus_per_node: int, world: int | None = None) -> int:
    """The most ranks of one node whose group (``size`` members ``stride`` ranks apart, Megatron's order as
    :func:`worst_members_per_node`) spans nodes: the GPUs of a node that drive inter-node traffic at once when every
    group of the kind runs its collective together (a step's DP reduce-scatters, EP all-to-alls, CP exchanges; the
    step waits for the slowest). A TP8 job's DP groups on 8-GPU nodes have one member per node, and all 8 ranks of
    the node are in one: 8, where the group alone would be 1. 0 when no group spans nodes."""
    if size <= 1:
        return 0
    nodes = _group_nodes(size, stride, max(int(gpus_per_node), 1), world)  # (groups, members), ascending along a row
    spans = nodes[:, 0] != nodes[:, -1]
    if not spans.any():
        return 0
    return int(np.bincount(nodes[spans].ravel()).max())


@lru_cache(maxsize=4096)
def worst_members_per_node(size: int, stride: int, gpus_per_node: int, world: int | None = None) -> int:
    """The fewest members of one group on one node, over every group of ``size`` members ``stride`` ranks apart on
    nodes of ``gpus_per_node`` (Megatron's order: group k of a block of ``size x stride`` ranks starts at offset k,
    blocks follow one another) in a job of ``world`` ranks. The rank pattern repeats every lcm(size x stride,
    gpus_per_node) ranks: at most one period is enumerated (64 GPUs of a 72-GPU rack: one block, on one node)."""
    g = max(int(gpus_per_node), 1)
    if stride >= g:
        return 1
    nodes = _group_nodes(size, stride, g, world)  # (groups, members)
    # members per node of each group: runs of equal node ids (sorted along a row)
    first = np.ones(nodes.shape, dtype=bool)
    first[:, 1:] = nodes[:, 1:] != nodes[:, :-1]
    idx = np.flatnonzero(first.ravel())
    counts = np.diff(np.append(idx, nodes.size))
    return max(1, int(counts.min()))


_NO_GROUP, _PAIR_ONE_NODE, _PAIR_TWO_NODES = GroupLayout(1, 1, 1), GroupLayout(2, 2, 1), GroupLayout(2, 1, 2)


def pair_layout_across(senders_per_node: int) -> GroupLayout:
    """A pair on two nodes (a pipeline hop, an embedding group) with ``senders_per_node`` ranks of each node
    sending across at once (``GroupLayout.concurrent``; 1: the pair alone, ``_PAIR_TWO_NODES``)."""
    k = max(int(senders_per_node), 1)
    return _PAIR_TWO_NODES if k == 1 else GroupLayout(2, 1, 2, k)


def pp_senders_per_node(tp: int, cp: int, dp: int, pp: int, gpus_per_node: int) -> int:
    """The most ranks of one node that send across nodes at once at a pipeline stage boundary: a stage's ``a = tp x
    cp x dp`` ranks all send to the next stage together (each to its peer ``a`` ranks on, Megatron's order), so a
    node holding ``m`` ranks of a stage whose hop crosses has ``m`` senders: min(a, G) on G-GPU nodes when stages
    tile them (TP2 DP4 on 8 GPUs: 8). Counted per hop and node from the rank layout (the hops that cross:
    :func:`pp_hop_crosses_nodes`); 1 when no hop crosses."""
    a = max(int(tp) * int(cp) * int(dp), 1)
    g = max(int(gpus_per_node), 1)
    P = max(int(pp), 1)
    s = np.arange(P)[:, None]
    i = np.arange(a)[None, :]
    src = (s * a + i) // g
    dst = (((s + 1) % P) * a + i) // g
    cross = src != dst
    if not cross.any():
        return 1
    return max(1, int(np.bincount(src[cross].ravel()).max()))


def embedding_group_layout(tp: int, cp: int, dp: int, pp: int, gpus_per_node: int) -> GroupLayout:
    """Where Megatron's embedding groups sit: the first and the last pipeline stage's rank of each (TP, CP, DP) rank,
    ``tp x cp x dp x (pp - 1)`` ranks apart in Megatron's order (``parallel_state.initialize_model_parallel``:
    ``embedding_ranks = [ranks[0], ranks[-1]]`` of each pipeline group). Size 2 with a pipeline, else no group.

    Every pair reduces at once and the step waits for the slowest, so one pair across nodes puts the group across
    nodes. Pair ``(r, r + stride)`` for ``r`` < ``a = tp x cp x dp`` shares a node only if ``r mod g + stride < g``;
    all of them do exactly when ``a x pp`` (the whole job) fits on one node. (:func:`group_layout`'s count of members
    per node, ``g // stride``, would put ranks 0 and 6 of one 8-GPU node on two nodes.)

    Across nodes, every first-stage rank of a node whose pair crosses sends at once (``GroupLayout.concurrent``)."""
    if pp <= 1:
        return _NO_GROUP
    if tp * cp * dp * pp <= gpus_per_node:
        return _PAIR_ONE_NODE
    a, g = tp * cp * dp, max(int(gpus_per_node), 1)
    r = np.arange(a)
    cross = r // g != (r + a * (pp - 1)) // g
    return pair_layout_across(int(np.bincount(r[cross] // g).max()))



def pp_hop_crosses_nodes(tp: int, cp: int, dp: int, pp: int, gpus_per_node: int) -> np.ndarray:
    """Whether each pipeline hop joins ranks on two nodes: entry ``s`` is the hop from stage ``s`` to stage
    ``s + 1`` (the last, stage ``pp - 1`` back to stage 0, the interleaved schedule's wrap to the next model chunk).
    Megatron's order puts stage ``s``'s ranks at ``s x a`` .. ``(s + 1) x a - 1`` (``a = tp x cp x dp``; pp outermost,
    ``parallel_state.initialize_model_parallel``) and each rank exchanges with the one ``a`` ranks on; every pair
    sends at once and the step waits for the slowest, so a hop crosses when any of its ``a`` pairs does."""
    a = max(int(tp) * int(cp) * int(dp), 1)
    g = max(int(gpus_per_node), 1)
    s = np.arange(max(int(pp), 1))[:, None]
    i = np.arange(a)[None, :]
    return ((s * a + i) // g != (((s + 1) % max(int(pp), 1)) * a + i) // g).any(axis=1)

#: the :func:`layouts` entries of context parallelism's sub-groups (its all-to-all group and its KV ring, inside the
#: "cp" group): what the CP communication runs over, not listed with the job's groups (a prediction's ``layouts``)
CP_SUBGROUPS = ("cp_a2a", "cp_ring")


def layouts(cfg: ParallelConfig, cluster: ClusterSpec) -> dict[str, GroupLayout]:
    """Where each parallel group of ``cfg`` sits on ``cluster`` (a new dict; the layouts are shared, immutable)."""
    return node_layouts(cfg, cluster.gpus_per_node)


def node_layouts(cfg: ParallelConfig, gpus_per_node: int) -> dict[str, GroupLayout]:
    """:func:`layouts` on nodes of ``gpus_per_node`` GPUs (all a layout reads of a cluster)."""
    return dict(_layouts(cfg.tp, cfg.cp, cfg.dp or 1, cfg.ep, cfg.pp, gpus_per_node, expert_tp(cfg),
                         *cp_group_sizes(cfg)))


def straddling_group_notes(cfg: ParallelConfig, gpus_per_node: int) -> list[str]:
    """Warnings for the tensor-, context- and expert-parallel groups that span nodes although their ranks (``size x
    stride`` consecutive ones in Megatron's order: tp stride 1, cp stride tp, ep stride etp) would fit in one node:
    the node size is not a multiple of that span, so some groups straddle two nodes and their collectives run over
    the network (tp 16 on 72-GPU NVL72 racks: ranks 64-79 on two racks, :func:`group_layout`). A node size that is a
    multiple of the span (``--gpus-per-node``, e.g. 64 of a rack's 72) keeps every group in one node."""
    g = max(int(gpus_per_node), 1)
    lay = node_layouts(cfg, g)
    etp = expert_tp(cfg)
    out = []
    for key, flag, size, stride in (("tp", "--tp", cfg.tp, 1), ("cp", "--cp", cfg.cp, cfg.tp), ("ep", "--ep", cfg.ep, etp)):
        span = int(size) * int(stride)
        if size > 1 and span <= g and lay[key].nodes > 1:
            what = f"{flag} {size}" if stride == 1 else f"{flag} {size} x its stride {stride}"
            out.append(f"some {key} groups straddle two nodes although {span} consecutive ranks ({what}) fit in one "
                       f"node of {g} GPUs ({g} is not a multiple of {span}): their collectives cross the network "
                       f"(costed as {lay[key].gpus_per_node} per node); --gpus-per-node {g - g % span} "
                       f"(a multiple of {span}) keeps every group in one node")
    return out


def tp_overlap_domain_hint(tp: int, tp_nodes: int, cluster: ClusterSpec) -> tuple[str, str]:
    """Why TP groups of ``tp`` ranks over ``tp_nodes`` nodes of ``cluster`` get no ``--tp-comm-overlap``
    (simulate/overlap.py), and what keeps them in one NVLink domain: a smaller ``--tp``, or ``--gpus-per-node`` for a
    group that straddles two nodes although it would fit in one."""
    g = max(int(cluster.gpus_per_node), 1)
    fix = (f"--tp {g} or less keeps each TP group in one node" if tp > g else
           f"--gpus-per-node {g - g % tp} (a multiple of {tp}) keeps every TP group in one node")
    return tp_overlap_domain_reason(tp, tp_nodes, g, cluster.name), fix


def tp_overlap_notes(cfg: ParallelConfig, cluster: ClusterSpec, framework: str | None) -> list[str]:
    """The note a prediction carries when ``cfg``'s TP groups span nodes (NVLink domains) under ``--framework megatron``
    with sequence parallelism, where ``--tp-comm-overlap`` would be on in one node: it is off there
    (:func:`resolve_parallel`, simulate/overlap.py). Nothing otherwise."""
    if framework != "megatron" or cfg.tp <= 1 or not cfg.sp or cfg.tp_comm_overlap:
        return []
    nodes = group_layout(cfg.tp, 1, cluster.gpus_per_node, cfg.gpus).nodes
    if nodes <= 1:
        return []
    why, fix = tp_overlap_domain_hint(cfg.tp, nodes, cluster)
    return [f"--tp-comm-overlap is off for this layout (the default for TP groups beyond one NVLink domain since stop "
            f"56): {why}. Its TP all-gathers and reduce-scatters are costed over the network, exposed but for what "
            f"--async-tp-comm hides in the backward; {fix}"]


def expert_tp(cfg: ParallelConfig) -> int:
    """The routed experts' tensor-parallel degree (``etp``, or ``tp`` when not given)."""
    return cfg.tp if cfg.etp is None else int(cfg.etp)


def expert_dp(cfg: ParallelConfig) -> int:
    """Ranks holding the same expert shard (Megatron-Core's expert-data-parallel size): tp x cp x dp / (etp x ep)."""
    return max(cfg.tp * cfg.cp * (cfg.dp or 1) // (expert_tp(cfg) * cfg.ep), 1)


@lru_cache(maxsize=4096)
def _layouts(tp: int, cp: int, dp: int, ep: int, pp: int, g: int, etp: int, cp_a2a: int,
             cp_ring: int) -> tuple[tuple[str, GroupLayout], ...]:
    w = tp * cp * dp * pp
    return (
        ("tp", group_layout(tp, 1, g, w)),
        # Megatron's order: tp, cp, dp, pp. Gradients are reduced (and ZeRO shards) over the data-parallel ranks
        # together with the context-parallel ones, which hold the same weights: the "dp" group is dp x cp
        ("cp", group_layout(cp, tp, g, w)),
        # the CP all-to-all group (``cp_group_sizes``: a2a's whole CP group, a2a+p2p's inner one, consecutive CP ranks)
        # and the KV ring outside it (p2p's whole CP group; a2a+p2p's outer one, its ranks a2a x tp apart)
        ("cp_a2a", group_layout(cp_a2a, tp, g, w)),
        ("cp_ring", group_layout(cp_ring, tp * cp_a2a, g, w)),
        ("dp", group_layout(dp * cp, tp, g, w)),
        # experts (Megatron-Core's MoE parallel folding: etp, ep, expert-dp, pp over the same ranks as tp, cp, dp, pp):
        # the experts' tensor-parallel ranks innermost, the ep ranks next
        ("etp", group_layout(etp, 1, g, w)),
        ("ep", group_layout(ep, etp, g, w)),
        ("pp", group_layout(pp, tp * cp * dp, g, w)),
        # the all-gather dispatcher's group (Megatron-Core's ``tp_ep``: the expert-TP and expert-parallel ranks
        # together, etp innermost; megatron-core 0.16.1 token_dispatcher.py l. 72, 256-278)
        ("tp_ep", group_layout(etp * ep, 1, g, w)),
    )
