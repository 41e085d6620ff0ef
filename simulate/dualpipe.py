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

The program each rank runs is the reference implementation's (``dualpipe`` 1.0.0 on PyPI, ``dualpipe/dualpipe.py``
``DualPipe.step``, steps 1-8), its point-to-point operations included (:func:`rank_program`), replayed with the
reference's waits (:func:`simulate_dualpipe`): a computation starts after the commit before it, which posts the
queued sends and receives (``batch_isend_irecv``) and waits for all of them (``req.wait()``), a transfer being done
when both its ends are posted plus its time. So an F&B pair waits for both its inputs, the middle ranks' first
forward only for its own, a W for what was queued before it (step 3: the next forward's input), and a rank for the
receiver of what it sends. The reference asserts an even rank count and an even micro-batch count of at least twice
the ranks (``num_chunks >= num_ranks * 2``); :func:`check_dualpipe` raises the same rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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


@dataclass
class DualTask(Task):
    """A replayed DualPipe task. ``stage`` is the rank that runs it (the trace's track), ``chunk`` 0;
    ``model_stage`` the pipeline stage whose chunk it runs (stage r or P-1-r on rank r); an F&B pair (kind "FB") is
    the forward of ``micro`` on ``model_stage`` and the backward of ``micro_b`` on ``stage_b``."""
    model_stage: int = 0
    micro_b: int = -1
    stage_b: int = -1


@dataclass(frozen=True)
class DualTransfer:
    """One point-to-point message of a replayed DualPipe step (:func:`rank_program`, :func:`_replay`): ``kind`` 0 a
    forward's activations on to the next stage, 1 a backward's input gradient back to the previous one; ``direction``
    0 for the micro-batches entering at rank 0 (stage s on rank s), 1 for those entering at rank P-1 (stage s on rank
    P-1-s): it is also the chunk both ends run it on (0 the rank's stage r, 1 its stage P-1-r); ``micro`` the
    micro-batch (reverse-direction ones numbered from M/2, as the tasks); ``src_rank`` / ``dst_rank`` the ranks,
    ``src_stage`` / ``dst_stage`` the pipeline stages; ``send_posted_ms`` / ``recv_posted_ms`` when each end's commit
    posted it (``batch_isend_irecv``), ``start_ms`` the later of the two, ``end_ms`` its completion (``start_ms`` +
    the transfer): both ends' commits wait for it (``req.wait()`` on sends and receives)."""
    kind: int
    direction: int
    micro: int
    src_rank: int
    dst_rank: int
    src_stage: int
    dst_stage: int
    send_posted_ms: float
    recv_posted_ms: float
    start_ms: float
    end_ms: float


# the operations of a rank's program (rank_program): post a send / a receive, commit and wait, compute
_SEND, _RECV, _COMMIT, _F, _B, _W, _FB = range(7)


def _transfer(msg: int, pp: int, n_micro: int, sent_ms: float, recvd_ms: float, c: float) -> DualTransfer:
    """The :class:`DualTransfer` of message ``msg`` (:func:`rank_program`'s numbering) posted at ``sent_ms`` by its
    sender and ``recvd_ms`` by its receiver, lasting ``c``. The k-th message of a (kind, direction, sending stage) is
    its k-th micro-batch of that direction: each stage runs a direction's forwards (and its backwards) in micro-batch
    order and sends once after each (a test checks it against the tasks)."""
    P, H = pp, n_micro // 2
    k = msg % H
    kind, rest = divmod(msg // H, 2 * P)
    d, s_src = divmod(rest, P)
    s_dst = s_src + 1 if kind == 0 else s_src - 1
    rank = (lambda s: s) if d == 0 else (lambda s: P - 1 - s)
    start = max(sent_ms, recvd_ms)
    return DualTransfer(kind, d, k + H * d, rank(s_src), rank(s_dst), s_src, s_dst, sent_ms, recvd_ms, start, start + c)


@lru_cache(maxsize=64)
def rank_program(rank: int, pp: int, n_micro: int) -> tuple[tuple, ...]:
    """Rank ``rank``'s program as ``DualPipe.step`` issues it, communication included: ``(_SEND, msg)`` /
    ``(_RECV, msg)`` queue a point-to-point operation (``comm.append_isend`` / ``append_irecv``), ``(_COMMIT,)`` posts
    the queued ones and waits for all of them (``_commit_and_wait_comm``: ``batch_isend_irecv``, ``req.wait()`` on
    every request, sends included), then a computation: ``(_F, stage, micro)``, ``(_B, stage, micro, zero_bubble)``,
    ``(_W, stage, micro)`` (``WeightGradStore.pop``, FIFO), ``(_FB, stage_f, micro_f, stage_b, micro_b)``.
    The calls follow ``step()`` line by line: ``_forward_chunk`` / ``_backward_chunk`` receive, commit, compute, send;
    ``_forward_backward_chunk`` receives both inputs, commits, computes, sends both; ``_weight_chunk`` commits (so a W
    waits for what was queued before it: step 3's receive of the next forward's input) then pops; the middle ranks'
    first step-4 pair is a forward (its input received in step 2), then the backward after its own receive, the sends
    deferred (``send=False``) to after it; a final commit. A message is ``((kind x 2 + direction) x P + sending
    stage) x M/2 + index`` (kind 0 activation, 1 input gradient); micro-batches of the reverse direction (entering at
    rank P-1) are numbered from M/2."""
    P, M = pp, n_micro
    H, half = M // 2, P // 2
    h = min(rank, P - 1 - rank)
    second = int(rank >= half)
    middle = h == half - 1
    ops: list[tuple] = []
    nf, nb, nsf, nsb, nrf, nrb = ([0, 0] for _ in range(6))
    wq: list[tuple[int, int]] = []

    def stage(d: int) -> int:  # the stage direction d runs on this rank
        return rank if d == 0 else P - 1 - rank

    def msg(kind: int, d: int, s_src: int, k: int) -> int:
        return ((kind * 2 + d) * P + s_src) * H + k

    def recv_f(p: int) -> None:
        d = p ^ second
        if stage(d) > 0:
            ops.append((_RECV, msg(0, d, stage(d) - 1, nrf[d])))
            nrf[d] += 1

    def send_f(p: int) -> None:
        d = p ^ second
        if stage(d) < P - 1:
            ops.append((_SEND, msg(0, d, stage(d), nsf[d])))
            nsf[d] += 1

    def recv_b(p: int) -> None:
        d = p ^ second
        if stage(d) < P - 1:
            ops.append((_RECV, msg(1, d, stage(d) + 1, nrb[d])))
            nrb[d] += 1

    def send_b(p: int) -> None:
        d = p ^ second
        if stage(d) > 0:
            ops.append((_SEND, msg(1, d, stage(d), nsb[d])))
            nsb[d] += 1

    def commit() -> None:
        ops.append((_COMMIT,))

    def f_comp(p: int) -> tuple[int, int]:
        d = p ^ second
        k, nf[d] = nf[d], nf[d] + 1
        return stage(d), k + H * d

    def b_comp(p: int) -> tuple[int, int]:
        d = p ^ second
        k, nb[d] = nb[d], nb[d] + 1
        return stage(d), k + H * d

    def forward_chunk(p: int, recv: bool = True, send: bool = True) -> None:
        if recv:
            recv_f(p)
        commit()
        ops.append((_F, *f_comp(p)))
        if send:
            send_f(p)

    def backward_chunk(p: int, zb: bool = False, recv: bool = True, send: bool = True) -> None:
        if recv:
            recv_b(p)
        commit()
        s, m = b_comp(p)
        ops.append((_B, s, m, int(zb)))
        if zb:
            wq.append((s, m))
        if send:
            send_b(p)

    def forward_backward_chunk(p0: int, p1: int, recv0: bool = True) -> None:
        if recv0:
            recv_f(p0)
        recv_b(p1)
        commit()
        ops.append((_FB, *f_comp(p0), *b_comp(p1)))
        send_f(p0)
        send_b(p1)

    def weight_chunk() -> None:
        commit()
        ops.append((_W, *wq.pop(0)))

    for _ in range((half - h - 1) * 2):  # step 1: nF0
        forward_chunk(0)
    recv_f(0)  # step 2: nF0F1
    for i in range(h + 1):
        forward_chunk(0, recv=False, send=middle)
        recv_f(0)
        forward_chunk(1, send=(not middle) or i < h)
        if not middle:
            send_f(0)
    for _ in range(half - h - 1):  # step 3: nB1W1F1
        backward_chunk(1, zb=True)
        recv_f(1)
        weight_chunk()
        forward_chunk(1, recv=False)
    for i in range(H - P + h + 1):  # step 4 (main): nF0B1F1B0
        if i == 0 and middle:  # not overlapped, "to further reduce bubble size"
            forward_chunk(0, recv=False, send=False)
            send_f(1)
            backward_chunk(1, send=False)
            send_f(0)
            send_b(1)
        else:
            forward_backward_chunk(0, 1, recv0=i > 0)
        forward_backward_chunk(1, 0)
    for _ in range(half - h - 1):  # step 5: nB1F1B0
        backward_chunk(1)
        forward_backward_chunk(1, 0)
    zb = False
    for i in range(h + 1):  # step 6: nB1B0, the second half zero-bubble
        if i == (h + 1) // 2 and h % 2 == 1:
            zb = True
        backward_chunk(1, zb=zb)
        if i == (h + 1) // 2 and h % 2 == 0:
            zb = True
        backward_chunk(0, zb=zb)
    for _ in range(half - h - 1):  # step 7: nWB0
        weight_chunk()
        backward_chunk(0, zb=True)
    for _ in range(h + 1):  # step 8: nW
        weight_chunk()
    commit()
    return tuple(ops)


def _replay(f: list, b: list, w: list, pair, P: int, M: int, c: float, keep: bool) -> tuple:
    """Time the ranks' programs (:func:`rank_program`): each computation starts when the rank's previous operation is
    done; a commit posts its queued sends and receives at the rank's current time and waits for every one of them, each
    done ``c`` after both its ends are posted (NCCL's point-to-point transfers rendezvous: a send completes when its
    peer's receive runs, the activations being far above NCCL's staging buffer). Returns per rank its end, busy time,
    first forward start, (start, end) of its last task that produces weight gradients, and, if ``keep``, the tasks and
    the transfers (:class:`DualTransfer`, by message number: read off the post times the replay kept)."""
    progs = [rank_program(r, P, M) for r in range(P)]
    INF = math.inf
    n_msg = 4 * P * (M // 2)
    sent, recvd = [INF] * n_msg, [INF] * n_msg  # post times
    t, pc, busy = [0.0] * P, [0] * P, [0.0] * P
    pend: list[list[tuple]] = [[] for _ in range(P)]
    posted = [False] * P
    first_f, last_g = [INF] * P, [(0.0, 0.0)] * P
    tasks: list[DualTask] = []
    left = P
    while left:
        moved = False
        for r in range(P):
            prog, i, n = progs[r], pc[r], len(progs[r])
            if i >= n:
                continue
            tr, pd = t[r], pend[r]
            while i < n:
                op = prog[i]
                code = op[0]
                if code <= _RECV:
                    pd.append(op)
                    i += 1
                    continue
                if code == _COMMIT:
                    if pd:
                        if not posted[r]:
                            for o in pd:
                                (sent if o[0] == _SEND else recvd)[o[1]] = tr
                            posted[r] = True
                        done = tr
                        for o in pd:
                            other = recvd[o[1]] if o[0] == _SEND else sent[o[1]]
                            if other == INF:  # the peer has not posted it yet
                                done = -1.0
                                break
                            done = max(done, max(other, tr) + c)
                        if done < 0:
                            break
                        tr = done
                        pd.clear()
                        posted[r] = False
                    i += 1
                    continue
                a = tr
                if code == _F:
                    s, m = op[1], op[2]
                    tr = a + f[s]
                    first_f[r] = min(first_f[r], a)
                    if keep:
                        tasks.append(DualTask("F", m, 0, r, a, tr, model_stage=s))
                elif code == _B:
                    s, m, zb = op[1], op[2], op[3]
                    tr = a + (b[s] - w[s] if zb else b[s])
                    if not zb or w[s] <= 0:  # a full backward (or nothing split off) produces the weight gradients
                        last_g[r] = (a, tr)
                    if keep:
                        tasks.append(DualTask("B", m, 0, r, a, tr, model_stage=s))
                elif code == _W:
                    s, m = op[1], op[2]
                    tr = a + w[s]
                    if w[s] > 0:
                        last_g[r] = (a, tr)
                    if keep:
                        tasks.append(DualTask("W", m, 0, r, a, tr, model_stage=s))
                else:
                    sf, mf, sb, mb = op[1], op[2], op[3], op[4]
                    tr = a + pair(sf, sb)
                    first_f[r] = min(first_f[r], a)
                    last_g[r] = (a, tr)
                    if keep:
                        tasks.append(DualTask("FB", mf, 0, r, a, tr, model_stage=sf, micro_b=mb, stage_b=sb))
                busy[r] += tr - a
                i += 1
            if i > pc[r]:
                moved = True
            pc[r], t[r] = i, tr
            if i >= n:
                left -= 1
        if not moved:
            raise RuntimeError("simulate_dualpipe: the programs deadlocked (a transfer no rank posts)")
    # every message both ends posted (the last stage sends no activations, the first no gradient: never posted); each
    # is done c after the later post, as the commits above took it
    transfers = [_transfer(m, P, M, sent[m], recvd[m], c) for m in range(n_msg) if sent[m] < INF] if keep else []
    return np.array(t), np.array(busy), np.array(first_f), np.array(last_g, dtype=float), tasks, transfers


#: micro-batches replayed task by task; beyond, step 4's steady state is extrapolated (simulate_dualpipe)
DUALPIPE_EXACT_MICRO = 64


def simulate_dualpipe(f_ms, b_ms, w_ms=None, *, n_micro: int, p2p_ms: float = 0.0, fb_ms=None,
                      keep_tasks: bool = False, max_exact_micro: int | None = None) -> PipelineResult:
    """Replay DualPipe's programs (module docstring, :func:`rank_program`, :func:`_replay`). ``f_ms[s]``,
    ``b_ms[s]``: one micro-batch's forward and full backward on stage s; ``w_ms[s]``: the weight-gradient part of
    ``b_ms[s]`` (0: no split); ``fb_ms``: a function ``(stage_f, stage_b) -> ms`` of an overlapped pair (default
    ``f + b``: the caller put the overlap's saving into the chunk times); ``p2p_ms``: each transfer.

    Beyond ``max_exact_micro`` micro-batches (default :data:`DUALPIPE_EXACT_MICRO`, at least 2 pp + 8) and without
    ``keep_tasks``, step 4 (one F&B pair of each direction per two micro-batches, on every rank) is extrapolated: the
    replay at m, m + 2, 2m and 2m + 2 micro-batches (m the limit); where the step-4 iteration's increment at m is the
    one at 2m and carries m's figures onto 2m's exactly (the steady state: every figure moves by one period per
    iteration) the figures at M are m's plus (M - m) / 2 increments, else the whole step is replayed. Exact against
    the full replay on the test grid (tests/test_dualpipe.py).

    Returns per rank: its end (``stage_end``), its busy time, the (start, end) of its last task producing weight
    gradients (a W, a full backward or an F&B pair; ``last_backward_by_chunk``, shape (P, 1, 2)) and its first forward
    (P, 1); tasks (:class:`DualTask`, kinds "F", "B", "W", "FB") and, in ``extra["transfers"]``, the point-to-point
    messages (:class:`DualTransfer`: its ends, micro-batch, post and completion times) if ``keep_tasks`` (else
    empty)."""
    f = np.asarray(f_ms, dtype=float)
    b = np.asarray(b_ms, dtype=float)
    w = np.zeros_like(b) if w_ms is None else np.minimum(np.asarray(w_ms, dtype=float), b)
    P, M, c = len(f), int(n_micro), float(p2p_ms)
    check_dualpipe(P, M)
    fl, bl, wl = f.tolist(), b.tolist(), w.tolist()
    pair = (lambda sf, sb: float(fb_ms(sf, sb))) if fb_ms is not None else (lambda sf, sb: fl[sf] + bl[sb])
    limit = max(DUALPIPE_EXACT_MICRO if max_exact_micro is None else int(max_exact_micro), 2 * P + 8)
    limit += limit % 2
    period = None
    sim_m = M
    if keep_tasks or M <= 2 * limit + 2:
        end, busy, first_f, last_g, tasks, transfers = _replay(fl, bl, wl, pair, P, M, c, keep_tasks)
    else:
        runs = [_replay(fl, bl, wl, pair, P, m, c, False) for m in (limit, limit + 2, 2 * limit, 2 * limit + 2)]
        vec = [np.concatenate([x[0], x[1], x[3].ravel()]) for x in runs]
        d = vec[1] - vec[0]
        tol = 1e-9 * max(float(np.abs(vec[-1]).max()), 1.0)
        if (np.allclose(vec[3] - vec[2], d, rtol=0.0, atol=tol)
                and np.allclose(vec[2], vec[0] + (limit // 2) * d, rtol=0.0, atol=tol)
                and np.array_equal(runs[0][2], runs[-1][2])):
            x = vec[0] + (M - limit) // 2 * d
            end, busy, last_g = x[:P], x[P:2 * P], x[2 * P:].reshape(P, 2)
            first_f, tasks, transfers = runs[0][2], [], []
            period, sim_m = d[:P] / 2, 2 * limit + 2
        else:
            end, busy, first_f, last_g, tasks, transfers = _replay(fl, bl, wl, pair, P, M, c, False)
    # Table 2's terms per rank: the means of its two chunks' forward, full backward and weight-gradient part, and an
    # F&B pair as timed here
    fr, br, wr = mirrored(f) / 2, mirrored(b) / 2, mirrored(w) / 2
    fbr = np.array([pair(r, P - 1 - r) + pair(P - 1 - r, r) for r in range(P)]) / 2
    extra = dict(f_ms=fr, b_ms=br, w_ms=wr, fb_ms=fbr, table2_bubble_ms=dualpipe_bubble_ms(fr, br, wr, fbr, P),
                 paired_share=paired_share(P, M), transfers=transfers)
    return PipelineResult(tasks, end, busy, n_micro=M, simulated_micro=sim_m, period_ms=period,
                          last_backward_by_chunk=last_g[:, None, :], first_forward_by_chunk=first_f[:, None],
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
