"""DeepSeek-V3's DualPipe pipeline schedule (DeepSeek-AI 2024, arXiv 2412.19437, Sec. 3.2.1, Fig. 5, Table 2).

DualPipe feeds micro-batches from both ends of the pipeline: half of a step's ``M`` micro-batches enter at rank 0 and
run through stages 0..P-1 ("forward direction"), half enter at rank P-1 ("reverse direction"). Rank ``r`` therefore
holds two model chunks, stage ``r`` and stage ``P-1-r`` (two copies of the model's parameters in the pipeline group:
2x parameters per rank, Table 2), and overlaps the forward of one chunk with the backward of the other (an "F&B"
pair: each one's all-to-alls and point-to-point transfers beside the other's computation, Fig. 4). The backward of
some chunks is split zero-bubble style (Qi et al. 2023) into the input-gradient part, sent on at once, and the
weight-gradient part W, run later.

Table 2 (with the report's notation: F a forward chunk, B a *full* backward chunk, W its weight-gradient part, F&B an
overlapped forward + backward pair), bubble / parameters / activations per rank:

- 1F1B: (P-1)(F+B), 1x, P micro-batches;
- ZB1P: (P-1)(F+B-2W), 1x, P;
- DualPipe: (P/2-1)(F&B+B-3W), 2x, P+1.

(B is the full backward: with it, ZB1P's (P-1)(F+B-2W) is Qi et al.'s ZB-H1 bubble (p-1)(F+B_input-W).)

The order each rank runs is the reference implementation's (``dualpipe`` 1.0.0 on PyPI, ``dualpipe/dualpipe.py``
``DualPipe.step``, steps 1-8), replayed here task by task with each task waiting for its input from the neighbouring
rank (plus the point-to-point transfer, sent asynchronously: ``comm.py`` isend/irecv) and for the rank to be free:
:func:`simulate_dualpipe`. The reference asserts an even rank count and an even micro-batch count of at least twice
the ranks (``num_chunks >= num_ranks * 2``); :func:`check_dualpipe` raises the same rules.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from wattcast.simulate.scheduler import PipelineResult, Task


class DualPipeError(ValueError):
    """A DualPipe configuration the reference implementation refuses."""


def check_dualpipe(pp: int, n_micro: int, interleave: int = 1) -> None:
    """The reference's assertions (``DualPipe.step``: ``num_ranks % 2 == 0``, ``num_chunks % 2 == 0 and num_chunks >=
    num_ranks * 2``) and one of this model's: no virtual stages (DualPipe's two chunks per rank are its own)."""
    if interleave != 1:
        raise DualPipeError(f"--schedule dualpipe holds two model chunks per rank of its own (stage i and stage pp-1-i): "
                            f"it cannot run with --interleave {interleave}; use --interleave 1")
    if pp < 2 or pp % 2:
        raise DualPipeError(f"--schedule dualpipe needs an even pipeline size (--pp 2, 4, ...; the reference asserts "
                            f"num_ranks % 2 == 0), got pp {pp}")
    if n_micro % 2 or n_micro < 2 * pp:
        raise DualPipeError(f"--schedule dualpipe needs an even number of micro-batches, at least twice pp ({2 * pp}; "
                            f"the reference asserts num_chunks % 2 == 0 and num_chunks >= num_ranks * 2), got {n_micro}")


def dualpipe_bubble_ms(f_ms, b_ms, w_ms, fb_ms, pp: int):
    """Table 2's DualPipe bubble, (P/2 - 1)(F&B + B - 3W) (B the full backward, W its weight-gradient part)."""
    return (pp / 2 - 1) * (np.asarray(fb_ms, dtype=float) + np.asarray(b_ms, dtype=float) - 3 * np.asarray(w_ms, dtype=float))


def mirrored(x: np.ndarray) -> np.ndarray:
    """Per rank, the sum over its two chunks (stage r and stage P-1-r) of a per-stage array: what the rank holds."""
    x = np.asarray(x, dtype=float)
    return x + x[::-1]


@lru_cache(maxsize=64)
def rank_order(rank: int, pp: int, n_micro: int) -> tuple[tuple, ...]:
    """The tasks rank ``rank`` runs, in order, as ``DualPipe.step`` issues them: tuples ``(op, phase[, phase_b])`` with
    op "F" (forward of ``phase``), "B" (full backward, input gradient sent at its end), "Bi" (input-gradient backward,
    sent at once, its W queued), "W" (the oldest queued weight-gradient part, FIFO as ``WeightGradStore``), "FB" (an
    overlapped pair: forward of ``phase``, backward of ``phase_b``) and "F|B" (the middle ranks' first pair, which the
    reference runs one after the other, "to further reduce bubble size")."""
    P, M = pp, n_micro
    half = P // 2
    h = min(rank, P - 1 - rank)
    middle = h == half - 1
    out = [("F", 0)] * ((half - h - 1) * 2)  # step 1: nF0
    out += [("F", 0), ("F", 1)] * (h + 1)  # step 2: nF0F1
    out += [("Bi", 1), ("W",), ("F", 1)] * (half - h - 1)  # step 3: nB1W1F1
    for i in range(M // 2 - P + h + 1):  # step 4 (main): nF0B1F1B0
        out.append(("F|B", 0, 1) if i == 0 and middle else ("FB", 0, 1))
        out.append(("FB", 1, 0))
    out += [("B", 1), ("FB", 1, 0)] * (half - h - 1)  # step 5: nB1F1B0
    zb = False
    for i in range(h + 1):  # step 6: nB1B0, the second half zero-bubble
        if i == (h + 1) // 2 and h % 2 == 1:
            zb = True
        out.append(("Bi" if zb else "B", 1))
        if i == (h + 1) // 2 and h % 2 == 0:
            zb = True
        out.append(("Bi" if zb else "B", 0))
    out += [("W",), ("Bi", 0)] * (half - h - 1)  # step 7: nWB0
    out += [("W",)] * (h + 1)  # step 8: nW
    return tuple(out)


def peak_activation_bytes(act_by_stage, n_micro: int) -> np.ndarray:
    """Per rank, the peak of its saved activations over the reference order (:func:`rank_order`), each chunk at its
    own size: a forward of phase 0 adds one micro-batch of the shallower of its stages' activations (min(r, P-1-r):
    the reference flips the phases on the second half's ranks, ``phase ^= is_in_second_half``), of phase 1 the
    deeper's; a full
    backward frees its own; an input-gradient backward keeps them until its W (the FIFO ``WeightGradStore``); an F&B
    pair's forward allocates before its backward frees. The count at the peak is P + 1 on every rank (Table 2), but
    its mix differs: ranks 0 and P-1 hold mostly the first stage's (the micro-batches entering there wait longest), few
    of the last stage's (whose backward starts at once). With equal chunks this is (P + 1) x a chunk."""
    a_s = np.asarray(act_by_stage, dtype=float)
    P = len(a_s)
    out = np.zeros(P)
    for r in range(P):
        a = (float(a_s[min(r, P - 1 - r)]), float(a_s[max(r, P - 1 - r)]))
        cur = peak = 0.0
        queued: list[int] = []
        for t in rank_order(r, P, n_micro):
            op = t[0]
            if op == "F":
                cur += a[t[1]]
            elif op == "B":
                cur -= a[t[1]]
            elif op == "Bi":
                queued.append(t[1])
            elif op == "W":
                cur -= a[queued.pop(0)]
            else:  # "FB" / "F|B": the forward's activations exist before the backward's are freed
                cur += a[t[1]]
                peak = max(peak, cur)
                cur -= a[t[2]]
            peak = max(peak, cur)
        out[r] = peak
    return out


def paired_share(pp: int, n_micro: int) -> np.ndarray:
    """Per rank, the share of its forward (and of its backward) tasks that run in an overlapped F&B pair."""
    pairs = np.array([sum(t[0] == "FB" for t in rank_order(r, pp, n_micro)) for r in range(pp)], dtype=float)
    return pairs / n_micro


def simulate_dualpipe(f_ms, b_ms, w_ms=None, *, n_micro: int, p2p_ms: float = 0.0, fb_ms=None,
                      keep_tasks: bool = False) -> PipelineResult:
    """Replay DualPipe's order task by task (module docstring). ``f_ms[s]``, ``b_ms[s]``: one micro-batch's forward and
    full backward on stage s; ``w_ms[s]``: the weight-gradient part of ``b_ms[s]`` (0: no split); ``fb_ms``: a function
    ``(stage_f, stage_b) -> ms`` of an overlapped pair (default ``f + b``: the caller put the overlap's saving into
    the chunk times); ``p2p_ms``: each transfer, on the dependency edge (sent asynchronously).

    Returns per rank: the end of its last task (``stage_end``), its busy time, its last backward (as chunk 0, shape
    (P, 1, 2)) and first forward (P, 1); tasks (kind "F", "B", "W", "FB"; micro-batches of the reverse direction
    numbered from M/2) if ``keep_tasks``."""
    f = np.asarray(f_ms, dtype=float)
    b = np.asarray(b_ms, dtype=float)
    w = np.zeros_like(b) if w_ms is None else np.minimum(np.asarray(w_ms, dtype=float), b)
    P, M, c = len(f), int(n_micro), float(p2p_ms)
    check_dualpipe(P, M)
    pair = fb_ms if fb_ms is not None else (lambda sf, sb: f[sf] + b[sb])
    half = P // 2
    # direction of each phase on each rank (0: entering at rank 0) and the stage it runs there
    direction = [(0, 1) if r < half else (1, 0) for r in range(P)]
    # the stage a direction runs on rank r: r entering at rank 0, P-1-r entering at rank P-1 (its stage 0 is there)
    stage = [tuple(r if d == 0 else P - 1 - r for d in direction[r]) for r in range(P)]

    # completion times: forward output of (direction, stage, micro), input gradient of (direction, stage, micro)
    INF = np.inf
    f_done = np.full((2, P, M // 2), INF)
    g_done = np.full((2, P, M // 2), INF)
    orders = [rank_order(r, P, M) for r in range(P)]
    pos = [0] * P
    free = np.zeros(P)
    busy = np.zeros(P)
    nf = [[0, 0] for _ in range(P)]  # forwards issued per phase
    nb = [[0, 0] for _ in range(P)]
    wq: list[list[tuple[int, int]]] = [[] for _ in range(P)]  # queued W: (stage, micro)
    first_f = np.full(P, INF)
    last_b = np.zeros((P, 2))
    tasks: list[Task] = []

    def f_ready(r: int, p: int) -> float:
        d, s, k = direction[r][p], stage[r][p], nf[r][p]
        return 0.0 if s == 0 else f_done[d, s - 1, k] + c

    def b_ready(r: int, p: int) -> float:
        d, s, k = direction[r][p], stage[r][p], nb[r][p]
        own = f_done[d, s, k]  # its own forward (the loss on the last stage)
        return own if s == P - 1 else max(own, g_done[d, s + 1, k] + c)

    def micro_id(r: int, p: int, k: int) -> int:
        return k + (M // 2 if direction[r][p] else 0)

    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(P):
            while pos[r] < len(orders[r]):
                t = orders[r][pos[r]]
                op = t[0]
                if op == "F":
                    ready = f_ready(r, t[1])
                elif op in ("B", "Bi"):
                    ready = b_ready(r, t[1])
                elif op == "W":
                    ready = 0.0
                else:
                    ready = max(f_ready(r, t[1]), b_ready(r, t[2]))
                if ready == INF:
                    break
                start = max(free[r], ready)
                if op == "F":
                    p = t[1]
                    d, s, k = direction[r][p], stage[r][p], nf[r][p]
                    end = start + f[s]
                    f_done[d, s, k] = end
                    nf[r][p] += 1
                    first_f[r] = min(first_f[r], start)
                    spans = [("F", micro_id(r, p, k), start, end)]
                elif op in ("B", "Bi"):
                    p = t[1]
                    d, s, k = direction[r][p], stage[r][p], nb[r][p]
                    if op == "B":
                        end = start + b[s]
                        g_done[d, s, k] = end
                    else:
                        end = start + b[s] - w[s]
                        g_done[d, s, k] = end
                        wq[r].append((s, k))
                    nb[r][p] += 1
                    last_b[r] = (start, end)
                    spans = [("B", micro_id(r, p, k), start, end)]
                elif op == "W":
                    s, k = wq[r].pop(0)
                    end = start + w[s]
                    spans = [("W", k, start, end)]
                else:
                    pf, pb = t[1], t[2]
                    df, sf, kf = direction[r][pf], stage[r][pf], nf[r][pf]
                    db, sb, kb = direction[r][pb], stage[r][pb], nb[r][pb]
                    if op == "FB":
                        end = start + float(pair(sf, sb))
                        f_done[df, sf, kf] = g_done[db, sb, kb] = end
                        spans = [("FB", micro_id(r, pf, kf), start, end)]
                    else:  # "F|B": the forward, then the backward
                        mid = start + f[sf]
                        f_done[df, sf, kf] = mid
                        end = mid + b[sb]
                        g_done[db, sb, kb] = end
                        spans = [("F", micro_id(r, pf, kf), start, mid), ("B", micro_id(r, pb, kb), mid, end)]
                    nf[r][pf] += 1
                    nb[r][pb] += 1
                    last_b[r] = (start, end)
                busy[r] += end - start
                free[r] = end
                if keep_tasks:
                    tasks += [Task(kind=kd, micro=m, chunk=0, stage=r, start=a, end=e) for kd, m, a, e in spans]
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("simulate_dualpipe: the order deadlocked (a dependency no rank can meet)")
    # Table 2's terms per rank: the means of its two chunks' forward, full backward and weight-gradient part, and an
    # F&B pair as timed here
    fr, br, wr = mirrored(f) / 2, mirrored(b) / 2, mirrored(w) / 2
    fbr = np.array([float(pair(r, P - 1 - r)) + float(pair(P - 1 - r, r)) for r in range(P)]) / 2
    extra = dict(f_ms=fr, b_ms=br, w_ms=wr, fb_ms=fbr, table2_bubble_ms=dualpipe_bubble_ms(fr, br, wr, fbr, P),
                 paired_share=paired_share(P, M))
    return PipelineResult(tasks, free.copy(), busy, n_micro=M, simulated_micro=M,
                          last_backward_by_chunk=last_b[:, None, :], first_forward_by_chunk=first_f[:, None],
                          extra=extra)


def dualpipe_summary(pipe: PipelineResult) -> dict:
    """The JSON's ``meta["dualpipe"]``: per rank its busy time, its idle time until the pipeline's last task ends (the
    bubble as replayed) and Table 2's bubble from the same F, B, W and F&B; the critical rank's (the busiest)."""
    end = float(pipe.stage_end.max())
    idle = end - pipe.stage_busy
    x = pipe.extra or {}
    crit = int(np.argmax(pipe.stage_busy))
    out = dict(pipeline_ms=end, busy_ms_by_rank=pipe.stage_busy.tolist(), bubble_ms_by_rank=idle.tolist(),
               critical_rank=crit, bubble_ms=float(idle[crit]), max_bubble_ms=float(idle.max()))
    if x:
        out.update(table2_bubble_ms=float(x["table2_bubble_ms"][crit]),
                   **{k: float(x[k][crit]) for k in ("f_ms", "b_ms", "w_ms", "fb_ms", "paired_share")},
                   note="Table 2 of the DeepSeek-V3 report: bubble (pp/2 - 1)(F&B + B - 3W), B the full backward, W its "
                        "weight-gradient part, is the longest idle of equal stages (the middle ranks', max_bubble_ms); bubble_ms is the "
                        "replayed order's idle time on the busiest rank (critical_rank), with its mean F, B, W, F&B here")
    return out
