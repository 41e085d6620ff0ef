"""Event-driven pipeline scheduler: per device a compute stream and a communication stream.

Tasks are forward/backward passes of one micro-batch through one model chunk on one pipeline stage
(a stage holds ``interleave`` chunks with interleaved 1F1B). Every stage runs its tasks in the order its
schedule prescribes (GPipe, 1F1B or Megatron's interleaved 1F1B); a task starts when its stage is free and
its dependencies are met: a forward needs the previous virtual stage's forward of the same micro-batch
plus the activation's point-to-point transfer; a backward needs the next virtual stage's backward plus the
gradient's transfer (the last virtual stage needs its own forward). Data-parallel gradient buckets run on
the communication stream as the last backward pass of each stage produces them (DDP overlap; under interleaving
each model chunk's buckets once that chunk's last backward is done, Megatron-Core's per-chunk grad buffers: every
timing reports each chunk's last backward and first forward per stage); what is left when compute ends is exposed.

Cost is bounded: up to :data:`MAX_EXACT_MICRO` micro-batches a step is simulated task by task; beyond, the
schedule is simulated exactly for that many and its periodic steady state extrapolated linearly (see
:func:`simulate_pipeline`), so a global batch of 10^15 sequences costs what 4,096 micro-batches cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np


@dataclass
class Task:
    kind: str  # "F" or "B"
    micro: int
    chunk: int  # model chunk on this stage (0..interleave-1)
    stage: int
    start: float = 0.0
    end: float = 0.0


def schedule_order(stage: int, n_stages: int, n_micro: int, interleave: int = 1, kind: str = "1f1b") -> list[tuple[str, int, int]]:
    """The (kind, micro, chunk) sequence one stage executes."""
    P, M, V = n_stages, n_micro, interleave
    if kind == "gpipe":
        f = [("F", m, c) for c in range(V) for m in range(M)]
        b = [("B", m, c) for c in reversed(range(V)) for m in reversed(range(M))]
        return f + b
    if V == 1:
        warm = min(P - stage - 1, M)
        order = [("F", m, 0) for m in range(warm)]
        nf, nb = warm, 0
        while nb < M:
            if nf < M:
                order.append(("F", nf, 0))
                nf += 1
            order.append(("B", nb, 0))
            nb += 1
        return order
    # Megatron-LM interleaved 1F1B (forward_backward_pipelining_with_interleaving)
    total = M * V

    def fwd_id(k: int) -> tuple[int, int]:
        group = k // (P * V)
        chunk = (k % (P * V)) // P
        return group * P + k % P, chunk

    def bwd_id(k: int) -> tuple[int, int]:
        m, c = fwd_id(k)
        return m, V - 1 - c

    warm = min((P - stage - 1) * 2 + (V - 1) * P, total)
    order = [("F", *fwd_id(k)) for k in range(warm)]
    kf, kb = warm, 0
    while kb < total:
        if kf < total:
            order.append(("F", *fwd_id(kf)))
            kf += 1
        order.append(("B", *bwd_id(kb)))
        kb += 1
    return order


#: micro-batches of a step simulated task by task. A longer step is simulated exactly for (about) this many
#: micro-batches and the rest extrapolated from the steady state; every step up to here is exact.
MAX_EXACT_MICRO = 4096


@dataclass
class PipelineResult:
    tasks: list[Task]
    stage_end: np.ndarray  # when each stage's last compute task ends
    stage_busy: np.ndarray  # compute time each stage spent
    comm_events: list[tuple[int, str, float, float]] = field(default_factory=list)  # (stage, name, start, end)
    #: micro-batches of the step, and how many were simulated task by task (fewer: the rest was extrapolated)
    n_micro: int = 0
    simulated_micro: int = 0
    #: extrapolated steps: per stage, the time one more micro-batch adds in the steady state (ms)
    period_ms: np.ndarray | None = None
    #: extrapolated steps with tasks kept: per stage (stage, start, end, tasks not drawn), the stretch of the
    #: steady state between the drawn head and tail of the schedule
    trace_gaps: list[tuple[int, float, float, int]] = field(default_factory=list)
    #: per stage and model chunk (stages, interleave, 2): (start, end) of that chunk's last backward task on the stage
    #: (chunk 0's is the stage's last backward; under interleaving chunk c's comes earlier, the final backward tasks
    #: cycling through chunks v-1..0), ms
    last_backward_by_chunk: np.ndarray | None = field(default=None, repr=False)
    #: per stage and model chunk (stages, interleave): start of that chunk's first forward task on the stage, ms
    first_forward_by_chunk: np.ndarray | None = field(default=None, repr=False)
    #: schedule-specific figures (DualPipe: the report's Table 2 terms, simulate/dualpipe.py)
    extra: dict | None = field(default=None, repr=False)

    @property
    def extrapolated(self) -> bool:
        return self.simulated_micro < self.n_micro

    @property
    def last_backward_array(self) -> np.ndarray:
        """Per stage (stages, 2): (start, end) of its last backward task, chunk 0's (``last_backward_by_chunk``)."""
        return self.last_backward_by_chunk[:, 0]

    @property
    def last_backward(self) -> list[tuple[float, float]]:
        """:attr:`last_backward_array` as a list of (start, end) per stage."""
        return [tuple(x) for x in self.last_backward_array.tolist()]


@lru_cache(maxsize=256)
def _orders(n_stages: int, n_micro: int, interleave: int, kind: str) -> tuple[tuple[tuple[int, int, int, int], ...], ...]:
    """Per stage, its tasks as (is_backward, micro, chunk, virtual stage), cached per schedule shape."""
    P = n_stages
    return tuple(tuple((int(k == "B"), m, c, c * P + s) for k, m, c in schedule_order(s, P, n_micro, interleave, kind))
                 for s in range(P))


def edge_p2p_ms(p2p_ms, n_stages: int, interleave: int) -> tuple[np.ndarray, np.ndarray]:
    """(into_f, into_b), each per virtual stage v = chunk x P + stage: the transfer a forward on v waits for after
    v - 1's (into_f[v]) and a backward on v after v + 1's (into_b[v]). ``p2p_ms``: one figure for every edge, or per
    hop (``hop[s]``: between stage s and stage s + 1 mod P, both ways), so that each edge pays its own link (a hop
    inside a node over NVLink, one across nodes over the network; until stop 48 the non-blocking edges all paid the
    pipeline group's worst hop): the forward edge into v crosses hop (v - 1) mod P, the backward edge into v hop v mod
    P (interleaving's chunk boundary, stage P-1 to stage 0, is hop P - 1)."""
    P, V = int(n_stages), int(interleave)
    hop = np.asarray(p2p_ms, dtype=np.float64)
    v = np.arange(P * V)
    if hop.ndim == 0:
        return np.full(P * V, float(hop)), np.full(P * V, float(hop))
    if hop.shape != (P,):
        raise ValueError(f"p2p_ms: one figure or one per hop ({P}), got shape {hop.shape}")
    return hop[(v - 1) % P], hop[v % P]  # (fancy indexing: copies)


def simulate_pipeline(f_ms: np.ndarray, b_ms: np.ndarray, *, n_micro: int, interleave: int = 1, kind: str = "1f1b",
                      p2p_ms=0.0, keep_tasks: bool = True, max_exact_micro: int | None = None,
                      static: bool = False) -> PipelineResult:
    """``f_ms[v]``, ``b_ms[v]``: forward/backward time of one micro-batch on virtual stage v (v = chunk x P + stage).
    ``p2p_ms``: the transfer on every dependency edge between stages, one figure or one per hop (:func:`edge_p2p_ms`).
    ``keep_tasks=False`` skips the per-task records (only a trace needs them). ``static`` (without ``keep_tasks``):
    each exact part is timed by one pass over the tasks in the event loop's own order (:func:`_simulate_static`: the
    same figures, bit for bit; the event loop stays the reference).

    Up to ``max_exact_micro`` (default :data:`MAX_EXACT_MICRO`) micro-batches the schedule is simulated task by
    task. Beyond, time and memory would grow with the micro-batch count, so the schedule is simulated exactly
    for N and N - k micro-batches (N at most the limit, k about N/2: a multiple of every cycle length up to the
    stage count when that fits, and of the stage count under interleaving)
    and extrapolated: once the pipeline is in its steady state, every further micro-batch adds the same time
    (the bottleneck's period) to each stage, so ``end(n) = end(N) + (n - N) x (end(N) - end(N - k)) / k``, and
    likewise the busy time and the last backward pass. The tasks (``keep_tasks``) are then the head of the
    exact schedule and its tail moved to the end of the step (``trace_gaps`` marks what lies between)."""
    V = interleave
    limit = MAX_EXACT_MICRO if max_exact_micro is None else max_exact_micro
    exact_part = _simulate_static if static and not keep_tasks and _static_kernel is not None else _simulate_loop
    if n_micro <= limit:
        res = exact_part(f_ms, b_ms, n_micro=n_micro, interleave=V, kind=kind, p2p_ms=p2p_ms, keep_tasks=keep_tasks)
        res.n_micro = res.simulated_micro = n_micro
        return res
    P = len(f_ms) // V
    q = P if V > 1 else 1  # interleaved 1F1B runs micro-batches in groups of P (and needs whole groups)
    N = max(limit - limit % q, 2 * q)
    if N >= n_micro:
        res = exact_part(f_ms, b_ms, n_micro=n_micro, interleave=V, kind=kind, p2p_ms=p2p_ms, keep_tasks=keep_tasks)
        res.n_micro = res.simulated_micro = n_micro
        return res
    # the steady state can repeat over a few micro-batches rather than one (a critical dependency cycle through
    # several stages): measure over a whole number of such repeats where N leaves room for it
    rep = math.lcm(q, *range(1, P + 1))
    unit = rep if rep <= N // 2 else q
    k = max(q, (N // 2) - (N // 2) % unit)
    full = exact_part(f_ms, b_ms, n_micro=N, interleave=V, kind=kind, p2p_ms=p2p_ms, keep_tasks=keep_tasks)
    less = exact_part(f_ms, b_ms, n_micro=N - k, interleave=V, kind=kind, p2p_ms=p2p_ms, keep_tasks=False)
    extra = float(n_micro - N)
    period = (full.stage_end - less.stage_end) / k
    shift = extra * period
    busy = full.stage_busy + extra * (full.stage_busy - less.stage_busy) / k
    tasks, gaps = [], []
    if keep_tasks:
        tasks, gaps = _extrapolated_tasks(full.tasks, P, N, q, V, kind, n_micro, shift)
    # every chunk's last backward lies in the drain, moved by the stage's shift like the stage's last backward; the
    # first forwards are in the head of the schedule, which does not depend on how many micro-batches follow
    return PipelineResult(tasks, full.stage_end + shift, busy, n_micro=n_micro, simulated_micro=N,
                          period_ms=period, trace_gaps=gaps,
                          last_backward_by_chunk=full.last_backward_by_chunk + shift[:, None, None],
                          first_forward_by_chunk=full.first_forward_by_chunk)


def _extrapolated_tasks(tasks: list[Task], P: int, N: int, q: int, V: int, kind: str, n_micro: int,
                        shift: np.ndarray) -> tuple[list[Task], list[tuple[int, float, float, int]]]:
    """The tasks of an extrapolated step as far as they are drawn: per stage the first half of the exact N
    micro-batch schedule (the same tasks at the same times as in the whole step: they do not depend on how many
    micro-batches follow), and its last quarter (steady state and drain) moved by the stage's extrapolated
    ``shift``, with micro-batch numbers as in the whole step; between them a gap."""
    per_stage: list[list[Task]] = [[] for _ in range(P)]
    for t in tasks:
        per_stage[t.stage].append(t)
    o1, o2 = _orders(P, N, V, kind), _orders(P, N + q, V, kind)
    more = n_micro - N  # a tail task q micro-batches on in a step of N + q is this many on in the whole step
    out: list[Task] = []
    gaps: list[tuple[int, float, float, int]] = []
    for s in range(P):
        st = per_stage[s]
        n = len(st)
        head, tail0 = n // 2, n - n // 4
        out += st[:head]
        d = float(shift[s])
        a, b = o1[s], o2[s]
        for i in range(tail0, n):
            t = st[i]
            j = len(b) - (n - i)  # the same place counted from the end of a step of N + q micro-batches
            step = b[j][1] - a[i][1] if b[j][0] == a[i][0] and b[j][2] == a[i][2] else 0
            micro = t.micro + (more if step == q else 0)
            out.append(Task(t.kind, micro, t.chunk, s, t.start + d, t.end + d))
        if head and tail0 < n:
            total = 2 * V * n_micro
            gaps.append((s, st[head - 1].end, st[tail0].start + d, total - head - (n - tail0)))
    return out, gaps


@lru_cache(maxsize=256)
def _order_arrays(n_stages: int, n_micro: int, interleave: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """The schedule of :func:`_orders` as one (tasks, 4) int64 array (is_backward, micro, chunk, virtual stage), stage
    after stage, and each stage's offset into it (n_stages + 1)."""
    orders = _orders(n_stages, n_micro, interleave, kind)
    flat = np.array([t for o in orders for t in o], dtype=np.int64).reshape(-1, 4)
    offsets = np.zeros(n_stages + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(o) for o in orders])
    return flat, offsets


def _kernel_py(order, offsets, f, b, n_micro, pv, p2p_f, p2p_b, starts, ends, free, busy, last_bc, first_fc):
    """The event loop over arrays (``_simulate_loop``'s, task for task): fills ``starts``/``ends`` per task,
    ``free``/``busy`` per stage and, per stage and chunk, ``last_bc`` (stages, chunks, 2: the chunk's last
    backward's start and end) and ``first_fc`` (stages, chunks: its first forward's start; pass it filled with -1);
    ``p2p_f``/``p2p_b``: per virtual stage, the transfer into its forward / backward (:func:`edge_p2p_ms`); returns
    False if the schedule deadlocks. Compiled with numba when it is installed (the same code, ~100x faster); the plain
    Python function is the reference the tests compare with."""
    n_stages = offsets.shape[0] - 1
    done_f = np.full(n_micro * pv, -1.0)
    done_b = np.full(n_micro * pv, -1.0)
    pos = offsets[:-1].copy()
    remaining = offsets[n_stages]
    while remaining > 0:
        progressed = False
        for s in range(n_stages):
            i = pos[s]
            t_free = free[s]
            n = offsets[s + 1]
            n_done = 0
            while i < n:
                is_b = order[i, 0]
                m = order[i, 1]
                v = order[i, 3]
                idx = m * pv + v
                if is_b == 0:
                    if v > 0:
                        d = done_f[idx - 1]
                        if d < 0:
                            break
                        ready = d + p2p_f[v]
                    else:
                        ready = 0.0
                    dur = f[v]
                else:
                    own = done_f[idx]
                    if own < 0:
                        break
                    if v < pv - 1:
                        d = done_b[idx + 1]
                        if d < 0:
                            break
                        ready = d + p2p_b[v]
                    else:
                        ready = own
                    dur = b[v]
                start = t_free if t_free > ready else ready
                t_free = start + dur
                c = order[i, 2]
                if is_b == 1:
                    done_b[idx] = t_free
                    last_bc[s, c, 0] = start
                    last_bc[s, c, 1] = t_free
                else:
                    done_f[idx] = t_free
                    if first_fc[s, c] < 0:
                        first_fc[s, c] = start
                busy[s] += dur
                starts[i] = start
                ends[i] = t_free
                i += 1
                n_done += 1
            if n_done > 0:
                pos[s] = i
                free[s] = t_free
                remaining -= n_done
                progressed = True
        if not progressed:
            return False
    return True


try:  # numba compiles the event loop; without it (or if it fails to load) the Python loop runs
    import os as _os

    if _os.environ.get("WATTCAST_NO_NUMBA"):
        raise ImportError("WATTCAST_NO_NUMBA is set")
    from numba import njit as _njit

    _kernel = _njit(cache=True, nogil=True)(_kernel_py)
except Exception:  # pragma: no cover - depends on the environment
    _kernel = None


def _simulate_arrays(f_ms, b_ms, *, n_micro: int, interleave: int, kind: str, p2p_ms, keep_tasks: bool,
                     kernel=None) -> PipelineResult:
    """Every task of the schedule, event by event, over arrays (numba-compiled when available)."""
    V = interleave
    P = len(f_ms) // V
    order, offsets = _order_arrays(P, n_micro, V, kind)
    n = order.shape[0]
    starts, ends = np.zeros(n), np.zeros(n)
    free, busy = np.zeros(P), np.zeros(P)
    last_bc, first_fc = np.zeros((P, V, 2)), np.full((P, V), -1.0)
    run = kernel or _kernel or _kernel_py
    p2p_f, p2p_b = edge_p2p_ms(p2p_ms, P, V)
    ok = run(order, offsets, np.asarray(f_ms, dtype=np.float64), np.asarray(b_ms, dtype=np.float64), int(n_micro),
             int(P * V), p2p_f, p2p_b, starts, ends, free, busy, last_bc, first_fc)
    if not ok:  # pragma: no cover - the schedules above are deadlock-free
        raise RuntimeError("pipeline schedule deadlocked")
    tasks: list[Task] = []
    if keep_tasks:
        stage_of = np.repeat(np.arange(P), np.diff(offsets))
        tasks = [Task("B" if o[0] else "F", int(o[1]), int(o[2]), int(st), a, e)
                 for o, st, a, e in zip(order.tolist(), stage_of.tolist(), starts.tolist(), ends.tolist())]
    return PipelineResult(tasks, free, busy, last_backward_by_chunk=last_bc, first_forward_by_chunk=first_fc)


def _simulate_loop(f_ms: np.ndarray, b_ms: np.ndarray, *, n_micro: int, interleave: int = 1, kind: str = "1f1b",
                   p2p_ms=0.0, keep_tasks: bool = True) -> PipelineResult:
    """Every task of the schedule: the compiled array loop when numba is there, else the Python event loop."""
    if _kernel is not None:
        return _simulate_arrays(f_ms, b_ms, n_micro=n_micro, interleave=interleave, kind=kind, p2p_ms=p2p_ms,
                                keep_tasks=keep_tasks)
    return _simulate_events(f_ms, b_ms, n_micro=n_micro, interleave=interleave, kind=kind, p2p_ms=p2p_ms,
                            keep_tasks=keep_tasks)


#: the event loop's execution order does not depend on the task times (a task runs once the tasks it waits for have
#: run, whatever their times): recorded once per schedule shape, a step is then one pass over its tasks in that order
def _order_kernel_py(order, offsets, n_micro, pv, seq, dep, add_p2p):
    """The event loop of :func:`_kernel_py` without times: ``seq`` gets the order in which it runs the tasks (indices
    into ``order``), ``dep[i]`` the task ``i`` waits for besides its stage's previous one (-1: none), ``add_p2p[i]``
    whether that wait includes the point-to-point transfer. False if the schedule deadlocks."""
    n_stages = offsets.shape[0] - 1
    at_f = np.full(n_micro * pv, -1, dtype=np.int64)  # task index of (micro, virtual stage)'s forward, once run
    at_b = np.full(n_micro * pv, -1, dtype=np.int64)
    pos = offsets[:-1].copy()
    remaining = offsets[n_stages]
    k = 0
    while remaining > 0:
        progressed = False
        for s in range(n_stages):
            i = pos[s]
            n = offsets[s + 1]
            n_done = 0
            while i < n:
                is_b = order[i, 0]
                m = order[i, 1]
                v = order[i, 3]
                idx = m * pv + v
                if is_b == 0:
                    if v > 0:
                        d = at_f[idx - 1]
                        if d < 0:
                            break
                        dep[i] = d
                        add_p2p[i] = 1
                    else:
                        dep[i] = -1
                        add_p2p[i] = 0
                    at_f[idx] = i
                else:
                    own = at_f[idx]
                    if own < 0:
                        break
                    if v < pv - 1:
                        d = at_b[idx + 1]
                        if d < 0:
                            break
                        dep[i] = d
                        add_p2p[i] = 1
                    else:
                        dep[i] = own
                        add_p2p[i] = 0
                    at_b[idx] = i
                seq[k] = i
                k += 1
                i += 1
                n_done += 1
            if n_done > 0:
                pos[s] = i
                remaining -= n_done
                progressed = True
        if not progressed:
            return False
    return True


def _static_kernel_py(dep, add_p2p, stage, mark_at, dur_at, durs, p2p, ends, free, busy, marks):
    """One pass over the tasks in the event loop's order (task k is the k-th the loop runs): each starts when its stage
    is free and the task it waits for (``dep[k]``, an earlier k; -1 none; plus ``p2p[dur_at[k]]`` where ``add_p2p``:
    per virtual stage the transfer into its forward, then into its backward, as ``durs``) is done, as
    in :func:`_kernel_py`, with the same operations in the same order (the same floating-point figures).
    ``durs[dur_at[k]]``: the task's time (forwards first, then backwards). Fills ``ends`` per task,
    ``free``/``busy`` per stage, and ``marks[mark_at[k]]``, ``marks[mark_at[k] + 1]`` with the task's start
    and end where ``mark_at[k] >= 0`` (:func:`_static_plan`: each chunk's last backward and first forward on a
    stage)."""
    for k in range(dep.shape[0]):
        s = stage[k]
        d = dep[k]
        if d < 0:
            ready = 0.0
        elif add_p2p[k] != 0:
            ready = ends[d] + p2p[dur_at[k]]
        else:
            ready = ends[d]
        t_free = free[s]
        start = t_free if t_free > ready else ready
        j = dur_at[k]
        dur = durs[j]
        t_free = start + dur
        ends[k] = t_free
        free[s] = t_free
        busy[s] += dur
        m = mark_at[k]
        if m >= 0:
            marks[m] = start
            marks[m + 1] = t_free
    return True


if _kernel is not None:  # the same compiler as the event loop's (without it the event loop times every step)
    from numba import njit as _njit

    _order_kernel = _njit(cache=True, nogil=True)(_order_kernel_py)
    _static_kernel = _njit(cache=True, nogil=True)(_static_kernel_py)
else:  # pragma: no cover - depends on the environment
    _order_kernel = _static_kernel = None


@lru_cache(maxsize=512)
def _static_plan(n_stages: int, n_micro: int, interleave: int, kind: str) -> tuple:
    """(dep, add_p2p, stage, mark_at, dur_at) of a schedule shape, task k being the k-th the event loop runs
    (:func:`_order_kernel_py`); read-only arrays. ``mark_at[k]``: where :func:`_static_kernel_py` writes the task's
    start and end, ``2 (s x V + c)`` for chunk c's last backward on stage s, ``2 P V + 2 (s x V + c)`` for its first
    forward, -1 for every other task: the marks read as (stages, chunks, 2) twice over."""
    order, offsets = _order_arrays(n_stages, n_micro, interleave, kind)
    n = order.shape[0]
    pv = n_stages * interleave
    seq, dep, add = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int8)
    if not _order_kernel(order, offsets, int(n_micro), int(pv), seq, dep, add):  # pragma: no cover - deadlock-free
        raise RuntimeError("pipeline schedule deadlocked")
    at = np.empty(n, dtype=np.int64)  # task (index into order) -> its place in the run order
    at[seq] = np.arange(n)
    dep_k = dep[seq]
    dep_k = np.where(dep_k >= 0, at[np.maximum(dep_k, 0)], -1).astype(np.int32)
    stage_i = np.repeat(np.arange(n_stages, dtype=np.int64), np.diff(offsets))
    stage = stage_i.astype(np.int32)[seq]
    dur_at = (order[:, 3] + order[:, 0] * pv).astype(np.int32)[seq]  # forward v: durs[v], backward v: durs[pv + v]
    # each (stage, chunk)'s first forward and last backward, in the stage's own order (tasks are stage after stage)
    key = stage_i * interleave + order[:, 2]
    fwd, bwd = np.flatnonzero(order[:, 0] == 0), np.flatnonzero(order[:, 0] == 1)
    keys_f, first = np.unique(key[fwd], return_index=True)  # first occurrences, keys sorted
    keys_b, last = np.unique(key[bwd][::-1], return_index=True)  # last occurrences
    if len(keys_f) != pv or len(keys_b) != pv:  # pragma: no cover - every chunk of every stage runs a micro-batch
        raise RuntimeError("pipeline schedule without a task for some stage and chunk")
    first_f, last_b = fwd[first], bwd[len(bwd) - 1 - last]
    mark = np.full(n, -1, dtype=np.int32)
    mark[last_b] = 2 * np.arange(pv, dtype=np.int32)
    mark[first_f] = 2 * pv + 2 * np.arange(pv, dtype=np.int32)
    out = (dep_k, add[seq], stage, mark[seq], dur_at)
    for a in out:
        a.setflags(write=False)
    return out


def _simulate_static(f_ms, b_ms, *, n_micro: int, interleave: int = 1, kind: str = "1f1b", p2p_ms=0.0,
                     keep_tasks: bool = False) -> PipelineResult:
    """Every task of the schedule in one pass in the event loop's order (:func:`_static_plan`): the event loop's figures,
    bit for bit (tested), several times faster (compiled; no tasks kept)."""
    V = interleave
    P = len(f_ms) // V
    dep, add, stage, mark_at, dur_at = _static_plan(P, int(n_micro), V, kind)
    durs = np.concatenate((np.asarray(f_ms, dtype=np.float64), np.asarray(b_ms, dtype=np.float64)))
    ends = np.empty(dep.shape[0])
    free, busy = np.zeros(P), np.zeros(P)
    marks = np.empty((2, P, V, 2))  # each chunk's last backward, its first forward: (start, end)
    p2p = np.concatenate(edge_p2p_ms(p2p_ms, P, V))  # indexed as durs: into forwards, then into backwards
    _static_kernel(dep, add, stage, mark_at, dur_at, durs, p2p, ends, free, busy, marks.reshape(-1))
    return PipelineResult([], free, busy, last_backward_by_chunk=marks[0], first_forward_by_chunk=marks[1, :, :, 0])


def _simulate_events(f_ms: np.ndarray, b_ms: np.ndarray, *, n_micro: int, interleave: int = 1, kind: str = "1f1b",
                     p2p_ms=0.0, keep_tasks: bool = True) -> PipelineResult:
    """Every task of the schedule, event by event (the reference implementation)."""
    V = interleave
    P = len(f_ms) // V
    PV = P * V
    orders = _orders(P, n_micro, V, kind)
    f, b = [float(x) for x in f_ms], [float(x) for x in b_ms]
    p2p_f, p2p_b = (x.tolist() for x in edge_p2p_ms(p2p_ms, P, V))
    # end time of (micro m, virtual stage v) at index m * PV + v; -1 = not done yet
    done_f = [-1.0] * (n_micro * PV)
    done_b = [-1.0] * (n_micro * PV)
    free = [0.0] * P
    busy = [0.0] * P
    pos = [0] * P
    tasks: list[Task] = []
    remaining = sum(len(o) for o in orders)
    last_bc = np.zeros((P, V, 2))
    first_fc = np.full((P, V), -1.0)
    while remaining:
        progressed = False
        for s in range(P):
            order, i, t_free, n_done = orders[s], pos[s], free[s], 0
            n = len(order)
            while i < n:
                is_b, m, c, v = order[i]
                idx = m * PV + v
                if not is_b:
                    if v > 0:
                        d = done_f[idx - 1]
                        if d < 0:
                            break
                        ready = d + p2p_f[v]
                    else:
                        ready = 0.0
                    dur = f[v]
                else:
                    own = done_f[idx]
                    if own < 0:
                        break
                    if v < PV - 1:
                        d = done_b[idx + 1]
                        if d < 0:
                            break
                        ready = d + p2p_b[v]
                    else:
                        ready = own
                    dur = b[v]
                start = t_free if t_free > ready else ready
                t_free = start + dur
                if is_b:
                    done_b[idx] = t_free
                    last_bc[s, c] = (start, t_free)
                else:
                    done_f[idx] = t_free
                    if first_fc[s, c] < 0:
                        first_fc[s, c] = start
                busy[s] += dur
                if keep_tasks:
                    tasks.append(Task("B" if is_b else "F", m, c, s, start, t_free))
                i += 1
                n_done += 1
            if n_done:
                pos[s], free[s] = i, t_free
                remaining -= n_done
                progressed = True
        if not progressed:  # pragma: no cover - schedules above are deadlock-free
            raise RuntimeError("pipeline schedule deadlocked")
    return PipelineResult(tasks, np.array(free), np.array(busy), last_backward_by_chunk=last_bc,
                          first_forward_by_chunk=first_fc)


def bucket_spans(ready_ms: np.ndarray, dur_ms: np.ndarray, start_ms: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of buckets run FIFO on one communication stream (see :func:`overlap_buckets`), as arrays; 2-D
    arrays are one stream per row."""
    r = np.asarray(ready_ms, dtype=float)
    d = np.asarray(dur_ms, dtype=float)
    c = np.cumsum(d, axis=-1)
    end = c + np.maximum(np.maximum.accumulate(r - (c - d), axis=-1), start_ms) if d.shape[-1] else c
    return end - d, end


def overlap_buckets(ready_ms: np.ndarray, dur_ms: np.ndarray, start_ms: float = 0.0) -> tuple[float, list[tuple[float, float]]]:
    """Run buckets FIFO on one communication stream: each starts when it is ready and the stream is free.
    Returns (end time, [(start, end)...]). Vectorised: end_k = C_k + max(start, max_{j<=k}(ready_j - C_{j-1}))
    with C the running sum of durations."""
    r = np.asarray(ready_ms, dtype=float)
    d = np.asarray(dur_ms, dtype=float)
    if not len(d):
        return float(start_ms), []
    c = np.cumsum(d)
    end = c + np.maximum(np.maximum.accumulate(r - (c - d)), start_ms)
    return float(end[-1]), list(zip((end - d).tolist(), end.tolist()))
