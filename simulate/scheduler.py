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


def simulate_pipeline(f_ms: np.ndarray, b_ms: np.ndarray, *, n_micro: int, interleave: int = 1, kind: str = "1f1b",
                      p2p_ms: float = 0.0) -> PipelineResult:
    """``f_ms[v]``, ``b_ms[v]``: forward/backward time of one micro-batch on virtual stage v (v = chunk x P + stage)."""
    V = interleave
    P = len(f_ms) // V
    orders = [schedule_order(s, P, n_micro, V, kind) for s in range(P)]
    done: dict[tuple[str, int, int], float] = {}  # (kind, micro, virtual stage) -> end time
    free = np.zeros(P)
    busy = np.zeros(P)
    pos = [0] * P
    tasks: list[Task] = []
    remaining = sum(len(o) for o in orders)
    last_b: list[tuple[float, float]] = [(0.0, 0.0)] * P
    while remaining:
        progressed = False
        for s in range(P):
            while pos[s] < len(orders[s]):
                kind_, m, c = orders[s][pos[s]]
                v = c * P + s
                if kind_ == "F":
                    dep = ("F", m, v - 1) if v > 0 else None
                    extra = p2p_ms if v > 0 else 0.0
                    dur = f_ms[v]
                else:
                    dep = ("B", m, v + 1) if v < P * V - 1 else ("F", m, v)
                    extra = p2p_ms if v < P * V - 1 else 0.0
                    dur = b_ms[v]
                if dep is not None and dep not in done:
                    break
                ready = (done[dep] + extra) if dep is not None else 0.0
                if kind_ == "B" and ("F", m, v) not in done:
                    break
                start = max(free[s], ready)
                end = start + dur
                done[(kind_, m, v)] = end
                free[s] = end
                busy[s] += dur
                tasks.append(Task(kind_, m, c, s, start, end))
                if kind_ == "B":
                    last_b[s] = (start, end)
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - schedules above are deadlock-free
            raise RuntimeError("pipeline schedule deadlocked")
    return PipelineResult(tasks, free.copy(), busy, last_b)


def overlap_buckets(ready_ms: np.ndarray, dur_ms: np.ndarray, start_ms: float = 0.0) -> tuple[float, list[tuple[float, float]]]:
    """Run buckets FIFO on one communication stream: each starts when it is ready and the stream is free.
    Returns (end time, [(start, end)...])."""
    t = start_ms
    spans = []
    for r, d in zip(ready_ms, dur_ms):
        s = max(t, r)
        t = s + d
        spans.append((s, t))
    return t, spans
