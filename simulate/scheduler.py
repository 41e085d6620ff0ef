"""Event-driven pipeline scheduler: per device a compute stream and a communication stream.

Tasks are forward/backward passes of one micro-batch through one model chunk on one pipeline stage
(a stage holds ``interleave`` chunks with interleaved 1F1B). Every stage runs its tasks in the order its
schedule prescribes (GPipe, 1F1B or Megatron's interleaved 1F1B); a task starts when its stage is free and
its dependencies are met: a forward needs the previous virtual stage's forward of the same micro-batch
plus the activation's point-to-point transfer; a backward needs the next virtual stage's backward plus the
gradient's transfer (the last virtual stage needs its own forward). Data-parallel gradient buckets run on
the communication stream as the last backward pass of each stage produces them (DDP overlap); what is
left when compute ends is exposed.
"""

from __future__ import annotations

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


@dataclass
class PipelineResult:
    tasks: list[Task]
    stage_end: np.ndarray  # when each stage's last compute task ends
    stage_busy: np.ndarray  # compute time each stage spent
    last_backward: list[tuple[float, float]]  # per stage: (start, end) of its last backward task
    comm_events: list[tuple[int, str, float, float]] = field(default_factory=list)  # (stage, name, start, end)


@lru_cache(maxsize=256)
def _orders(n_stages: int, n_micro: int, interleave: int, kind: str) -> tuple[tuple[tuple[int, int, int, int], ...], ...]:
    """Per stage, its tasks as (is_backward, micro, chunk, virtual stage), cached per schedule shape."""
    P = n_stages
    return tuple(tuple((int(k == "B"), m, c, c * P + s) for k, m, c in schedule_order(s, P, n_micro, interleave, kind))
                 for s in range(P))


def simulate_pipeline(f_ms: np.ndarray, b_ms: np.ndarray, *, n_micro: int, interleave: int = 1, kind: str = "1f1b",
                      p2p_ms: float = 0.0, keep_tasks: bool = True) -> PipelineResult:
    """``f_ms[v]``, ``b_ms[v]``: forward/backward time of one micro-batch on virtual stage v (v = chunk x P + stage).
    ``keep_tasks=False`` skips the per-task records (only a trace needs them)."""
    V = interleave
    P = len(f_ms) // V
    PV = P * V
    orders = _orders(P, n_micro, V, kind)
    f, b = [float(x) for x in f_ms], [float(x) for x in b_ms]
    p2p = float(p2p_ms)
    # end time of (micro m, virtual stage v) at index m * PV + v; -1 = not done yet
    done_f = [-1.0] * (n_micro * PV)
    done_b = [-1.0] * (n_micro * PV)
    free = [0.0] * P
    busy = [0.0] * P
    pos = [0] * P
    tasks: list[Task] = []
    remaining = sum(len(o) for o in orders)
    last_b: list[tuple[float, float]] = [(0.0, 0.0)] * P
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
                        ready = d + p2p
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
                        ready = d + p2p
                    else:
                        ready = own
                    dur = b[v]
                start = t_free if t_free > ready else ready
                t_free = start + dur
                if is_b:
                    done_b[idx] = t_free
                    last_b[s] = (start, t_free)
                else:
                    done_f[idx] = t_free
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
    return PipelineResult(tasks, np.array(free), np.array(busy), last_b)


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
