"""Closed-form pipeline step timing (GPipe, 1F1B, interleaved 1F1B): what a search uses instead of the event loop.

The event-driven scheduler (:mod:`wattcast.simulate.scheduler`) stays the reference; this module gives the same
:class:`~wattcast.simulate.scheduler.PipelineResult` fields a step needs (per stage: end of its last compute task,
busy time, its last backward pass) from O(stages) numpy arithmetic, whatever the micro-batch count. Tests compare
the two over a grid (``tests/test_pipeline_fast.py``: step times within 1%, the same top-10 of a search).

Notation: P stages, V virtual stages (chunks) per stage, M micro-batches, ``f[v]``/``b[v]`` the forward/backward time
of one micro-batch on virtual stage v = chunk x P + stage, c the point-to-point transfer, t_s = sum over stage s's
chunks of f + b (one micro-batch's work on stage s).

- Uniform stages reduce to the textbook forms: 1F1B (M + P - 1)(f + b) (Narayanan et al. SC21 Sec. 2.2.1), interleaved
  (M V + P - 1)(f_c + b_c) with f_c = f / V, i.e. a bubble of (P - 1)/V stage-micro-batches (Sec. 2.2.2), GPipe
  (M + P - 1)(f + b), each plus 2 (P V - 1) c for the transfers on the critical path.
- Non-uniform stages (embedding and head on the outer ones, DeepSpeed's uneven split): the step is one micro-batch's
  latency plus M - 1 steady-state periods. The period is a max-plus cycle mean: 1F1B keeps P - s micro-batches in
  flight from stage s on, so the cycle through stages s..P-1 bounds it at (sum_{k>=s} t_k + 2 (P - 1 - s) c)/(P - s),
  and every stage alone at t_s; GPipe runs all forwards then all backwards, max f + max b; interleaved 1F1B the
  busiest stage, max t_s, plus the (P - 1)/V bubble at the mean stage.
- Drain: each stage's last task is the backward of chunk 0, which waits for the next stage's:
  end_s = end_{s+1} + c + b_s, so end_s = T - sum_{k<s} (b_k + c) with T the step (stage 0 ends last). Likewise
  per model chunk (interleaved): chunk c's last backward on stage s is the last micro-batch's on virtual stage
  v = c P + s and ends at T - sum_{u<v} (b_u + c); its first forward is the first micro-batch's and starts at
  sum_{u<v} (f_u + c) (every first forward is a warm-up forward). Both equal the event loop's on the test grid.

Where it is used (:func:`closed_form_applies`): stages with equal forward and equal backward times (the textbook
case, within 1% on the test grid), for interleaved 1F1B while the transfer takes no longer than a forward chunk, for
1F1B while it takes at most 2.5% of a stage's forward + backward (beyond, with a few micro-batches per stage, the
transfer-bound cycles are bounded rather than exact: up to 8% off at P = 2, M = 3). Stages that differ (every real split: the embedding and the head sit on the outer stages) are timed by the
event loop: the bounds above were measured against it over a GPT-3 175B search's 5,376 pipelines and were up to 9%
off (1F1B, 64 stages of one or two layers: the steady state is set by longer cycles than the ones bounded here).
Those are timed by one compiled pass over the tasks in the order the event loop runs them (recorded once per
(stages, micro-batches, interleave, schedule): the order does not depend on the times), which gives the event loop's
figures bit for bit at about 3 ns a task (the event loop: 6-10 ns, and more with many stages and micro-batches, where
its round-robin scan dominates); ``exact`` keeps the event loop itself, the reference.
"""

from __future__ import annotations

import numpy as np

from wattcast.simulate.scheduler import PipelineResult, simulate_pipeline


def closed_form_applies(f_ms, b_ms, interleave: int, p2p_ms: float, kind: str = "1f1b") -> bool:
    """Whether :func:`fast_pipeline` times this pipeline within its tolerance (see the module docstring): equal
    stages; for interleaved 1F1B a transfer no longer than a forward chunk, for 1F1B at most 2.5% of a stage's
    forward + backward."""
    f = np.asarray(f_ms, dtype=float)
    b = np.asarray(b_ms, dtype=float)
    if not len(f) or f[0] <= 0 or b[0] <= 0:
        return False
    if float(f.max()) - float(f.min()) > 2e-9 * float(f[0]):  # some stage is off f[0] by more than 1e-9: at once
        return False
    uniform = bool(np.all(np.abs(f - f[0]) <= 1e-9 * f[0]) and np.all(np.abs(b - b[0]) <= 1e-9 * b[0]))
    if not uniform:
        return False
    if kind == "gpipe":
        return True
    if int(interleave) > 1:
        return float(p2p_ms) <= float(f[0])
    # 1F1B: its transfer-bound cycles are bounded, not exact, for a few micro-batches per stage; within 1% while the
    # transfer is at most 2.5% of a stage's forward + backward (measured over the test grid)
    return float(p2p_ms) <= 0.025 * float(f[0] + b[0])


def time_pipeline(f_ms, b_ms, *, n_micro: int, interleave: int = 1, kind: str = "1f1b", p2p_ms=0.0,
                  keep_tasks: bool = False, exact: bool = True, w_ms=None) -> PipelineResult:
    """The pipeline's timing: the event-driven scheduler (``exact``, or tasks kept for a trace), else the closed form
    :func:`fast_pipeline` where it applies, else the scheduler's one pass over the tasks in the event loop's order
    (``static``: the event loop's figures, bit for bit, several times faster). ``kind="dualpipe"``: DeepSeek-V3's
    DualPipe replayed task by task (:func:`wattcast.simulate.dualpipe.simulate_dualpipe`; ``w_ms`` the
    weight-gradient part of each stage's backward). ``p2p_ms``: one transfer for every edge, or one per hop
    (:func:`~wattcast.simulate.scheduler.edge_p2p_ms`): hops that differ take the scheduler (the closed form and
    DualPipe's replay take one figure: DualPipe its worst hop)."""
    hop = np.asarray(p2p_ms, dtype=float)
    if hop.ndim and (kind == "dualpipe" or np.all(hop == hop.flat[0])):
        p2p_ms = float(hop.max()) if hop.size else 0.0
    elif hop.ndim:  # hops that differ: the scheduler's exact or static pass
        return simulate_pipeline(f_ms, b_ms, n_micro=n_micro, interleave=interleave, kind=kind, p2p_ms=hop,
                                 keep_tasks=keep_tasks, static=not (exact or keep_tasks))
    if kind == "dualpipe":
        from wattcast.simulate.dualpipe import simulate_dualpipe

        return simulate_dualpipe(f_ms, b_ms, w_ms, n_micro=n_micro, p2p_ms=p2p_ms, keep_tasks=keep_tasks)
    if exact or keep_tasks:
        return simulate_pipeline(f_ms, b_ms, n_micro=n_micro, interleave=interleave, kind=kind, p2p_ms=p2p_ms,
                                 keep_tasks=keep_tasks)
    if not closed_form_applies(f_ms, b_ms, interleave, p2p_ms, kind):
        return simulate_pipeline(f_ms, b_ms, n_micro=n_micro, interleave=interleave, kind=kind, p2p_ms=p2p_ms,
                                 keep_tasks=False, static=True)
    return fast_pipeline(f_ms, b_ms, n_micro=n_micro, interleave=interleave, kind=kind, p2p_ms=p2p_ms)


def fast_pipeline(f_ms, b_ms, *, n_micro: int, interleave: int = 1, kind: str = "1f1b",
                  p2p_ms: float = 0.0) -> PipelineResult:
    """The step's per-stage timing in closed form (module docstring). Same arguments as
    :func:`~wattcast.simulate.scheduler.simulate_pipeline` (no tasks are kept)."""
    f = np.asarray(f_ms, dtype=float)
    b = np.asarray(b_ms, dtype=float)
    V, M, c = int(interleave), int(n_micro), float(p2p_ms)
    P = len(f) // V
    if P < 1 or len(f) != P * V or len(b) != len(f) or M < 1:
        raise ValueError(f"fast_pipeline: {len(f)} forward and {len(b)} backward times for interleave {V}, "
                         f"{M} micro-batches")
    fs, bs = f.reshape(V, P).sum(axis=0), b.reshape(V, P).sum(axis=0)
    t = fs + bs  # one micro-batch's work per stage
    busy = M * t
    # chunk c's first forward on stage s: the first micro-batch's chain up to virtual stage v = c P + s; its last
    # backward: the drain's chain down to v (sums over virtual stages u < v; x.reshape(V, P).T is x at c P + s)
    first_f = _before(f + c)[:-1].reshape(V, P).T
    b_before = _before(b + c)
    if P == 1:  # no pipeline: the stage runs its tasks back to back
        end = busy.copy()
        return PipelineResult([], end, busy, n_micro=M, simulated_micro=M,
                              last_backward_by_chunk=_last_backward_by_chunk(float(end[0]), b, b_before, P, V),
                              first_forward_by_chunk=first_f)
    hops = 2.0 * (P * V - 1) * c
    if kind == "gpipe":
        step = float(f.sum() + b.sum()) + hops + (M - 1) * float(fs.max() + bs.max())
    elif V == 1:
        # cycles through stages s..P-1 hold P - s micro-batches: reversed cumulative sums give every bound at once
        tail = np.cumsum(t[::-1])[::-1]
        inflight = np.arange(P, 0, -1, dtype=float)
        cycle = (tail + 2.0 * (inflight - 1.0) * c) / inflight
        # a stage that takes in every micro-batch before its first backward (P - s >= M) closes no cycle
        busy_cycles = cycle[inflight < M]
        period = max(float(t.max()), float(busy_cycles.max()) if len(busy_cycles) else 0.0)
        step = float(t.sum()) + hops + (M - 1) * period
        if period > float(t.max()):  # transfer-bound: the first micro-batch's cycle is shorter by 2c/P
            step -= 2.0 * c / P
    else:
        step = M * float(t.max()) + (P - 1) * float(t.mean()) / V + hops
    # drain: stage s ends when chunk 0's backward, behind the next stage's, is done
    last_bc = _last_backward_by_chunk(step, b, b_before, P, V)
    end = last_bc[:, 0, 1].copy()  # step - sum_{k<s} (b_k + c)
    return PipelineResult([], end, busy, n_micro=M, simulated_micro=M, last_backward_by_chunk=last_bc,
                          first_forward_by_chunk=first_f)


def _before(x: np.ndarray) -> np.ndarray:
    """Sums of ``x`` before each index (0 first), len(x) + 1 of them."""
    out = np.empty(len(x) + 1)
    out[0] = 0.0
    np.cumsum(x, out=out[1:])
    return out


def _last_backward_by_chunk(step_ms: float, b: np.ndarray, b_before: np.ndarray, P: int, V: int) -> np.ndarray:
    """(stages, chunks, 2): (start, end) of each chunk's last backward on each stage, the drain of the module
    docstring over virtual stages: chunk c on stage s ends at ``step - sum_{u < cP+s} (b_u + c)`` (``b_before``)."""
    out = np.empty((P, V, 2))
    end = out[..., 1]
    np.subtract(step_ms, b_before[:-1].reshape(V, P).T, out=end)
    np.subtract(end, b.reshape(V, P).T, out=out[..., 0])
    return out
