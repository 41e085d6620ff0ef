"""Communication that Megatron-Core overlaps with computation, and what the overlap costs: pure functions.

Six overlaps, each a flag (``--overlap-grad-reduce``, ``--overlap-param-gather``, ``--tp-comm-overlap``,
``--overlap-moe-expert-parallel-comm``, ``--overlap-p2p-communication``, ``--async-tp-comm``) and a
``ParallelConfig`` field; ``None`` takes the framework's default (:func:`overlap_defaults`). The fifth is the
interleaved schedule's point-to-point transfers running beside the next chunk's computation (Megatron-Core's
``overlap_p2p_comm``); off, every transfer blocks both ends, as Megatron-LM's 2021 schedules did
(``p2p_communication._communicate``: ``batch_isend_irecv``, a ``wait()`` on every request, then
``torch.cuda.synchronize()``), and interleaving ``v`` chunks then costs ``v`` times the transfers of 1F1B on the
critical path (Narayanan et al. SC21 Sec. 2.2.2: "the amount of communication also increases by v").

The sixth, ``async_tp_comm``, is the column-parallel linears' backward TP collective started asynchronously beside
their weight-gradient GEMM (and, under sequence parallelism, the input re-gather beside the input-gradient GEMM):
Megatron-Core / Transformer Engine always do it (``LinearWithGradAccumulationAndAsyncCommunication``; the line
references are in :func:`async_tp_backward_save_ms`), Megatron-LM added it late in 2021 as
``--async-tensor-model-parallel-allreduce`` (``LinearWithGradAccumulationAndAsyncAllreduce``, megatron/mpu/layers.py;
later on by default, ``--no-async-tensor-model-parallel-allreduce`` turning it off). Off, the backward's TP
collectives run in series with the GEMMs, as in Megatron-LM 2019-2021 (the SC21 weak-scaling runs, the GPT-3 175B
example): ColumnParallelLinear's input gradient was all-reduced synchronously by ``copy_to_tensor_model_parallel_region``'s
backward (the ``f`` operator of Shoeybi et al. 2019, Fig. 3). It only matters with ``tp`` > 1 and without
``--tp-comm-overlap`` (whose userbuffers pipeline the same collectives), and not under DualPipe (its weight gradients
run apart). Off by default under ``hf`` (and ``megatron-deepspeed``: :func:`overlap_defaults`); given there, the step
is costed as if its column-parallel linears did the same (a what-if: how PyTorch's own tensor parallelism orders
these collectives is not modelled).

Partial, not total: a collective that runs beside a compute kernel takes streaming multiprocessors from it (NCCL runs
its collectives as CUDA kernels on ``channels`` CTAs, one SM each), so the overlapped computation slows down by the
share of SMs the collective holds while they run together, and a collective longer than the computation it hides
behind is exposed for the rest. Pipelined TP overlap (Transformer Engine's userbuffers) splits each collective into
``tp`` chunks: the first chunk (all-gather) or the last (reduce-scatter) waits for, or is waited on by, its GEMM.
Since stop 59 (audit 59b finding 3) the two also share the device's DRAM bandwidth, both ways (:func:`hbm_stretch`):
a collective reads and writes HBM as it moves its chunks (per byte of message: :func:`nccl_hbm_bytes_per_byte`,
derived from NCCL's ring steps; :func:`userbuffers_hbm_bytes_per_byte` for TE's copy-engine ring exchange), and so do
the kernels it runs beside (the costed graph's bytes over their time, memory-bound kernels split from the rest by the
spec sheet's roofline); where the two demands together exceed the achievable bandwidth (the learned stream bandwidth,
``single_device.stream_bandwidth_gbps``, that the optimizer-phase passes are costed at), both slow down in proportion
until the bytes fit: the computation's memory-bound kernels (and any other whose demand with the collective's exceeds
it) by total demand / bandwidth, at least by the SMs' share, and the collective over the span it runs beside them,
which lengthens what of it is exposed. A GEMM-bound span (demand a tenth of the bandwidth) is left to the SMs' share; a
memory-bound one beside an NVLink all-reduce (about 3 x its bus bandwidth of DRAM traffic: > 1 TB/s) is not. Called
wherever a collective is costed beside computation: ``--tp-comm-overlap`` (the layer's GEMMs), the MoE all-to-all
pairs, ZeRO-3 prefetch and ZeRO-2's per-micro-batch reductions (the chunk's forward / backward), the gradient
buckets beside the last backward and the overlapped parameter all-gathers (the stage's backward / forward; interleaved,
the computation's side only). Not (yet) the context-parallel ring's KV transfers (costed as what outlasts each ring
step's attention kernel, compute-bound flash attention, no SM share either) nor ``--async-tp-comm``'s collective beside
the wgrad / dgrad GEMM (GEMM-bound: the SMs' share).

Assumptions (stated, not fitted): NCCL's collectives hold 16 SMs while they run (NCCL's default of at least 16
channels on NVLink/NVSwitch systems, ``NCCL_MIN_NCHANNELS``; Megatron-LM leaves it at the default); Transformer
Engine's userbuffers hold the SMs TE 2.20.2's ``initialize_ub`` defaults give each overlap method
(:data:`UB_METHOD_SMS`, ``pytorch/module/base.py`` l. 350-360 and 384; Megatron-LM passes no ``ub_cfgs`` unless
``--tp-comm-overlap-cfg``): the ring exchange 1 (copy engines move the chunks: the forward all-gathers of the QKV /
FC1 input and the backward all-gathers of the proj / FC2 output gradient), the pipelined forward reduce-scatters after
proj / FC2 16, the backward's bulk overlaps (the QKV / FC1 input re-gather beside their dgrad GEMM, the dgrad
reduce-scatter beside their wgrad GEMM) 16; each direction's pairs are pooled (its GEMMs against its collectives), each
collective's SMs weighted by its time (:func:`ub_sm_share`). Until stop 59 every userbuffers collective held 2 SMs
(optimistic for the pipelined and bulk ones): the audit's Llama 3 70B TP8 stage-1 task 88.66 -> 91.13 ms. Stated
simplifications: TE launches the pipeline / bulk GEMMs on the SMs less ``num_sm`` for their whole length
(``set_sm_margin``, l. 386), here only over the span the collective runs beside them; and the exposed chunk is a
``1 / tp`` of the collectives whatever their method (TE's ``num_splits``, l. 387: ``tp`` for the ring exchange, 4 for
the pipeline; the bulk overlaps pipeline nothing and expose nothing of their own). DRAM: a collective's traffic per
byte of message is its algorithm's (NCCL's ring with the Simple protocol through staging buffers for every NCCL
collective, tree and NVLS included; TE's ring exchange / userbuffers reduce-scatter for the TP ones), a kernel's is
the bytes the graph counts (each tensor read or written once: a GEMM's tile re-reads that miss L2 are not counted),
each kernel class demands its bytes over its time while the collective runs beside it in proportion to the classes'
time, and the bandwidth is shared in proportion to demand (each side slowed by the same factor). Stated
simplifications, no constant fitted: the stretched collective is not let overlap more of the computation (second
order), the gradient buckets' traffic is the dense DP group's ring (an expert-DP group's size is not told apart), and
the interleaved parameter gathers slow the computation by the DRAM factor but are not stretched themselves.

One NVLink domain only (since stop 56): Transformer Engine's userbuffers map the TP group's buffers into each other's
address space and move the chunks with copy engines / multicast stores, so the whole TP group must sit in one NVLink
domain (the GPUs one NVSwitch fabric joins: a DGX/HGX node, or a multi-node NVLink rack such as GB200 NVL72). TE 2.20.2
``pytorch/module/base.py`` ``initialize_ub`` l. 220-225 needs CUDA multicast ("does not support comm+GEMM overlap with
CUDA Multicast. Launch app with UB_SKIPMC=1 to try CUDA IPC instead"): multicast objects span the GPUs of one NVLink
fabric, CUDA IPC handles the GPUs of one host; l. 305-321 build one "TP domain" per TP group, and the case of a single
one is commented "TP model on single NVLink domain"; ``jax/cpp_extensions/gemm.py`` l. 320-321: "the Userbuffers
backend, which uses CUDA multicast APIs and async memcpy on symmetric memory pointers". Megatron-LM passes only
``tp_size`` (megatron/training/initialize.py ``_initialize_tp_communicators``, megatron-core 0.19.2 wheel l. 187, 233-239)
and has no path over the network. wattcast's cluster specs make a "node" the NVLink domain (``gpus_per_node`` 72 for
the NVL72 racks, data/clusters/gb200-nvl72.yaml), so a TP group over more than one node gets no ``--tp-comm-overlap``:
its default is off there (:func:`overlap_defaults`' ``tp_nodes``) and an explicit one is refused
(``parallel.resolve_parallel``), as an overlap other impossible layouts refuse. Until stop 56 the overlap was costed
for such groups too (TP 16 on 8-GPU DGX H100 nodes hid 91% of its InfiniBand TP traffic).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: the overlap flags, as ``ParallelConfig`` fields and API keywords (the CLI flags are these with dashes)
OVERLAP_FLAGS = ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "overlap_moe_expert_parallel_comm",
                 "overlap_p2p_comm", "async_tp_comm")
#: the overlap flags an explicit True is accepted for under a framework other than megatron (the others are Megatron-Core
#: options, refused there by ``parallel.resolve_parallel`` and ``planning.search``): the asynchronous TP backward
#: collective, which Megatron-DeepSpeed's own layers have too (module docstring, :func:`overlap_defaults`)
ANY_FRAMEWORK_FLAGS = ("async_tp_comm",)
#: why each of the other flags is refused under --framework hf / megatron-deepspeed (``parallel.resolve_parallel``):
#: its own reason (until stop 54 every flag gave the gradient-bucket one, which says nothing of TP or pipeline overlap)
MEGATRON_ONLY_REASONS = {
    "overlap_grad_reduce": "PyTorch DDP/FSDP overlap gradient buckets with backward already; DeepSpeed's engine "
                           "reduces after backward",
    "overlap_param_gather": "it all-gathers Megatron-Core's distributed-optimizer parameters during the next forward; "
                            "PyTorch FSDP's parameter prefetch is --zero3-prefetch, and DeepSpeed's ZeRO optimizer "
                            "all-gathers the updated parameters in its step",
    "tp_comm_overlap": "it pipelines the TP all-gathers/reduce-scatters with their GEMMs through Transformer Engine's "
                       "userbuffers, as Megatron-Core's --tp-comm-overlap runs them (costed under --framework megatron "
                       "only); the backward TP collective beside the weight-gradient GEMM is --async-tp-comm, taken "
                       "under every framework",
    "overlap_moe_expert_parallel_comm": "it runs the expert-parallel all-to-alls beside computation as Megatron-Core's "
                                        "--overlap-moe-expert-parallel-comm does (costed under --framework megatron "
                                        "only)",
    "overlap_p2p_comm": "it runs the interleaved schedule's pipeline sends and receives beside the next chunk's "
                        "computation, Megatron-Core's overlap_p2p_comm (costed under --framework megatron only; "
                        "DeepSpeed's pipeline engine has no interleaved schedule)",
}
#: SMs an NCCL collective occupies while it runs (NCCL's default minimum channel count on NVSwitch systems)
NCCL_SMS = 16
#: SMs Transformer Engine's userbuffers hold while a TP collective runs beside its GEMM, per overlap method, as TE
#: 2.20.2 ``pytorch/module/base.py`` ``initialize_ub`` sets them by default: ``get_default_config`` (l. 375-393),
#: ``"num_sm": 1 if method == "ring_exchange" else 16`` (l. 384), ``"cga_size": 1 if ... else 2`` (l. 385),
#: ``"set_sm_margin": not method == "ring_exchange"`` (l. 386: the GEMM is launched on the SMs less ``num_sm``),
#: ``"use_ce": True`` (l. 390: the ring exchange's chunks move by copy engine, its one SM signals); the methods by GEMM
#: (l. 350-360): ``ring_exchange`` for qkv_fprop / fc1_fprop (the forward all-gathers) and proj_dgrad / fc2_dgrad (the
#: backward all-gathers of the output gradient), ``pipeline`` for proj_fprop / fc2_fprop (the forward
#: reduce-scatters), ``bulk`` for qkv_dgrad / fc1_dgrad (the sequence-parallel input re-gather beside the dgrad GEMM)
#: and qkv_wgrad / fc1_wgrad (the dgrad's reduce-scatter beside the wgrad GEMM), ``external`` for proj_wgrad /
#: fc2_wgrad (no collective of their own). Megatron-LM passes ``ub_cfgs={}`` unless ``--tp-comm-overlap-cfg`` names a
#: YAML file (megatron/training/initialize.py ``_initialize_tp_communicators`` l. 204-208 and 233-239, megatron-core
#: 0.19.2 wheel; arguments.py l. 2743: default None), so TE's defaults stand; megatron-core 0.16.1's
#: ``ModelParallelConfig`` (model_parallel_config.py l. 186-238) turns the bulk dgrad / wgrad overlaps and the
#: AG / RS overlaps on by default (``tp_comm_bulk_wgrad``, ``tp_comm_bulk_dgrad``, ``tp_comm_overlap_ag``,
#: ``tp_comm_overlap_rs`` True; ``tp_comm_overlap_rs_dgrad`` False: the dgrad reduce-scatter stays bulk).
UB_METHOD_SMS = {"ring_exchange": 1, "pipeline": 16, "bulk": 16}
#: (until stop 59 one ``UB_SMS`` = 2 for every userbuffers collective: optimistic for the pipelined reduce-scatters and
#: the bulk overlaps)


def overlap_defaults(framework: str, *, tp: int, sp: bool, zero: int, interleave: int | None = None,
                     schedule: str | None = None, tp_nodes: int = 1) -> dict[str, bool]:
    """What a framework overlaps when not told: Megatron-Core's GPT/Llama recipes (Megatron-LM ``examples/llama``,
    NeMo's ``llama3_*`` pretraining recipes) run the distributed optimizer with ``--overlap-grad-reduce
    --overlap-param-gather`` and, with TP and sequence parallelism, ``--tp-comm-overlap``; PyTorch DDP/FSDP overlap
    gradient buckets with backward by construction (handled by the scheduler), and DeepSpeed's engine reduces after
    backward (``overlap_comm`` off in its default config): none of the three for them. ``interleave``: the virtual
    pipeline size (None: not known, the interleaved schedule's default), which decides ``overlap_p2p_comm``;
    ``schedule`` the pipeline schedule (None: not known, 1F1B), which decides ``async_tp_comm`` under DualPipe;
    ``tp_nodes``: the nodes (NVLink domains) the worst TP group spans (``parallel.group_layout``; 1: not known, or one),
    beyond one no ``tp_comm_overlap`` (module docstring: userbuffers work within one NVLink domain)."""
    off = dict.fromkeys(OVERLAP_FLAGS, False)
    if framework == "megatron":
        # overlap_p2p_comm: Megatron-LM megatron/training/arguments.py ``--no-overlap-p2p-communication``
        # (action store_false, dest overlap_p2p_comm: on unless turned off), forced off without the interleaved
        # schedule (arguments.py l. 976-979, megatron-core 0.19.2 wheel: "Overlap P2P communication is disabled if not
        # using the interleaved schedule"): on with interleave >= 2 only (until stop 48 True here, undone at
        # interleave 1 by resolve_parallel and the strategy string's writer)
        # async_tp_comm: Megatron-Core's linear layers always start the backward TP collective asynchronously
        # (async_tp_backward_save_ms), so on wherever there is a TP group; off under DualPipe, whose weight-gradient
        # GEMMs run apart (TE's delay_wgrad_compute: nothing of the module is left beside the collective), and at tp 1
        return dict(off, overlap_grad_reduce=True, overlap_param_gather=zero >= 1,
                    tp_comm_overlap=tp > 1 and bool(sp) and int(tp_nodes) <= 1,
                    overlap_p2p_comm=interleave is None or int(interleave) > 1,
                    async_tp_comm=tp > 1 and schedule != "dualpipe")
    # megatron-deepspeed: async_tp_comm off. Megatron-DeepSpeed's own code has the asynchronous all-reduce (arguments.py
    # --no-async-tensor-model-parallel-allreduce); vTrain's single-node fitting half is better without it (measured with
    # it on and the host costs refitted: mean 5.87 -> 6.13%), so its default stays off (an explicit True is accepted)
    return off


def tp_overlap_domain_reason(tp: int, tp_nodes: int, gpus_per_node: int, cluster: str) -> str:
    """Why ``--tp-comm-overlap`` is not run for TP groups of ``tp`` ranks over ``tp_nodes`` nodes of ``gpus_per_node``
    GPUs (module docstring: userbuffers within one NVLink domain): the shared part of the note and of the refusal."""
    who = "the TP groups" if tp > gpus_per_node else "some TP groups"  # else: groups straddling a node boundary
    return (f"{who} (tp {tp}) span {tp_nodes} nodes of cluster {cluster} ({gpus_per_node} GPUs per node, its "
            f"NVLink domain): Transformer Engine's userbuffers, which --tp-comm-overlap runs, exchange the chunks "
            f"through CUDA IPC / NVLink multicast within one NVLink domain only")


def sm_share(sms_taken: float, num_sms: int) -> float:
    """Fraction of a GPU's SMs a concurrent collective takes from the compute stream."""
    return float(min(max(sms_taken, 0.0) / max(num_sms, 1), 1.0))


# Per-rank HBM traffic (bytes read + written in the rank's own DRAM) per byte of a collective's nccl-tests size, NCCL's
# ring algorithm, Simple protocol, over the P2P transport (each hop's chunk written into a staging buffer and read
# out of it once: by the sender into the receiver's FIFO, or, with P2P read, the receiver reading the sender's): a
# function of the op and the group size n. Derived step by step from NCCL's ring primitives (src/device/
# all_reduce.h ``runRing``, all_gather.h, reduce_scatter.h; prims_simple.h: ``send``, ``recvReduceSend``,
# ``directRecvReduceCopySend``, ``directRecvCopySend``, ``directRecv``), chunk c = S / n, counted on every rank alike:
#
# - all_reduce (S the per-rank buffer): step 0 reads its input chunk (1c); n - 2 recvReduceSend steps read the
#   received chunk and the input (2c each); the last reduce step reads both and writes the output (3c); n - 2
#   recvCopySend steps and the final recv read the staged chunk and write the output (2c each); the 2(n - 1) chunks
#   its predecessor stages in it are written (2(n - 1) c): (6n - 4) / n per byte (5.5 at n 8, -> 6);
# - all_gather (S the gathered buffer): its own chunk copied to the output (read + write, 2c), n - 1 received chunks
#   staged in (1c), read and written to the output (2c): (3n - 1) / n;
# - reduce_scatter (S the input): its input chunk read and sent (1c), n - 2 recvReduceSend (2c), the last reads both
#   and writes its output chunk (3c), n - 1 chunks staged in (1c): (3n - 1) / n;
# - all_to_all (NCCL's grouped send / recv, S the whole buffer): n - 1 chunks read and sent, n - 1 staged in, read
#   and written to the output, its own chunk copied: (4n - 2) / n;
# - send_recv / broadcast (S per rank): read, staged, read, written: 4.
#
# Stated simplifications: the ring's traffic for every algorithm (tree all-reduce moves the same per byte at each
# chain hop; NVLS all-reduce, where NVSwitch reduces, moves less: about 2 per byte), the network transports' NIC
# reads and writes of the staging buffers counted as the P2P ones (their rates are far below HBM's anyway), L2
# hits ignored (a collective's chunks stream through, 512 KiB a channel step).
def nccl_hbm_bytes_per_byte(op, n):
    """HBM bytes a rank reads and writes per byte of nccl-tests size of collective ``op`` over ``n`` ranks, vectorised
    over ``n`` (the comment above: NCCL's ring, Simple protocol, derived per step); 0 for ``n`` <= 1."""
    nn = np.maximum(np.asarray(n, dtype=float), 1.0)
    f = {"all_reduce": (6.0 * nn - 4.0) / nn, "all_gather": (3.0 * nn - 1.0) / nn,
         "reduce_scatter": (3.0 * nn - 1.0) / nn, "all_to_all": (4.0 * nn - 2.0) / nn}.get(str(op), 4.0 + 0.0 * nn)
    return np.where(nn > 1.0, f, 0.0)


def userbuffers_hbm_bytes_per_byte(op, tp):
    """HBM bytes per byte of a TP collective's nccl-tests size as Transformer Engine's userbuffers run it under
    ``--tp-comm-overlap`` (TE 2.20.2 ``pytorch/module/base.py`` ``initialize_ub`` l. 350-390: the all-gathers
    ``ring_exchange`` with ``use_ce`` (copy engines), the forward reduce-scatters ``pipeline``, the backward ones
    ``bulk``): a ring-exchange all-gather forwards ``tp`` - 1 chunks of S / tp, each read out of the local buffer and
    written into the next rank's (2 (tp - 1) / tp; the GEMM's own reads of the chunks are in its bytes); a userbuffers
    reduce-scatter reads every rank's GEMM output chunk over NVLink from where it was written (each rank's buffer read
    once in all, S) and writes the reduced chunk (S / tp): (tp + 1) / tp; an all-reduce both."""
    t = np.maximum(np.asarray(tp, dtype=float), 1.0)
    ag, rs = 2.0 * (t - 1.0) / t, (t + 1.0) / t
    f = {"all_gather": ag, "reduce_scatter": rs}.get(str(op), ag + rs)
    return np.where(t > 1.0, f, 0.0)


def collective_hbm_bytes(bytes_by_op: dict, n, *, userbuffers: bool = False):
    """HBM bytes a rank's collectives move, from their nccl-tests sizes per op (``bytes_by_op``: op -> bytes, arrays
    or scalars) over ``n`` ranks: NCCL's ring (:func:`nccl_hbm_bytes_per_byte`) or TE's userbuffers
    (:func:`userbuffers_hbm_bytes_per_byte`)."""
    per = userbuffers_hbm_bytes_per_byte if userbuffers else nccl_hbm_bytes_per_byte
    return sum((per(op, n) * np.asarray(b, dtype=float) for op, b in bytes_by_op.items()), 0.0)


def hbm_stretch(compute_ms, comm_ms, *, share: float, mem_ms=0.0, mem_bytes=0.0, other_bytes=0.0, comm_hbm_bytes=0.0,
                hbm_gbps=None):
    """(compute factor, communication factor) of a computation run beside a collective (arrays or scalars): what each
    ms of the two that overlap costs, for :func:`overlapped_ms`' ``stretch``.

    Both read and write the device's DRAM. The computation's demand comes from its costed kernels: ``mem_ms`` of its
    ``compute_ms`` is memory-bound kernels (the roofline's: bytes / bandwidth above FLOPs / peak), which move
    ``mem_bytes``, the rest moves ``other_bytes``; the collective's is ``comm_hbm_bytes`` over ``comm_ms``
    (:func:`collective_hbm_bytes`). Where the two demands together exceed ``hbm_gbps`` (the achievable DRAM bandwidth),
    both slow down in proportion, so that the bytes fit: by (demand of the kernels + the collective's) / bandwidth,
    the collective's side on its whole overlap (it sees the computation's mix of kernels: memory-bound for ``mem_ms`` /
    ``compute_ms`` of it), the computation's memory-bound kernels alike and its others too should their demand with
    the collective's exceed the bandwidth (a GEMM's rarely does); every kernel is slowed at least by ``share``, the SMs
    the collective holds (:func:`sm_share`). ``hbm_gbps`` None (or not finite): SMs alone, (1 + share, 1).

    Stated simplifications: a kernel class's demand is its bytes over its time (the bytes the graph counts: each
    tensor once), the collective overlaps the computation's kernel classes in proportion to their time, and the stretch is
    charged on the span the two share as costed before it (the stretched collective overlapping more of the
    computation is not iterated: a second-order term)."""
    c = np.asarray(compute_ms, dtype=float)
    r = np.asarray(comm_ms, dtype=float)
    if hbm_gbps is None or not np.isfinite(hbm_gbps) or hbm_gbps <= 0:
        return 1.0 + share + 0.0 * c, np.ones(np.broadcast(c, r).shape)
    bw = float(hbm_gbps) * 1e6  # bytes per ms
    mem = np.clip(np.asarray(mem_ms, dtype=float), 0.0, np.maximum(c, 0.0))
    oth = np.maximum(c - mem, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        f_mem = np.where(c > 0, mem / c, 0.0)
        d_mem = np.minimum(np.where(mem > 0, np.asarray(mem_bytes, dtype=float) / mem, 0.0), bw)
        d_oth = np.minimum(np.where(oth > 0, np.asarray(other_bytes, dtype=float) / oth, 0.0), bw)
        d_comm = np.minimum(np.where(r > 0, np.asarray(comm_hbm_bytes, dtype=float) / r, 0.0), bw)
    s_mem = np.maximum((d_mem + d_comm) / bw, 1.0)
    s_oth = np.maximum((d_oth + d_comm) / bw, 1.0)
    compute = f_mem * np.maximum(1.0 + share, s_mem) + (1.0 - f_mem) * np.maximum(1.0 + share, s_oth)
    comm = f_mem * s_mem + (1.0 - f_mem) * s_oth
    return compute, comm


def overlapped_ms(compute_ms, comm_ms, *, share: float, first_chunk_ms=0.0, stretch=None):
    """Wall time of ``compute_ms`` of computation with ``comm_ms`` of communication run beside it (arrays or scalars).

    While both run the computation is slowed by ``share`` (the SMs the collective holds): the overlapped span
    ``min(compute, comm)`` costs ``share`` x itself more; communication beyond the computation is exposed; and
    ``first_chunk_ms`` (a pipelined collective's chunk that cannot overlap) is always exposed. ``stretch``: (compute
    factor, communication factor) of the overlapped span (:func:`hbm_stretch`: the SMs and the DRAM bandwidth the
    two share; None: (1 + share, 1), the SMs alone): the computation's side costs ``factor - 1`` x the span more, and
    so does the communication's. Never less than ``max(compute, comm)``, and equal to ``compute + comm`` when there is
    nothing to hide behind."""
    compute = np.asarray(compute_ms, dtype=float)
    comm = np.asarray(comm_ms, dtype=float)
    first = np.minimum(np.asarray(first_chunk_ms, dtype=float), comm)
    rest = comm - first
    together = np.minimum(compute, rest)
    if stretch is None:
        t = first + np.maximum(compute + share * together, rest)
    else:
        fc, fr = stretch
        t = first + np.maximum(compute + (np.asarray(fc, dtype=float) - 1.0) * together,
                               rest + (np.asarray(fr, dtype=float) - 1.0) * together)
    return t if t.ndim else float(t)


def ub_sm_share(coll_ms, num_sms: int, method_ms: dict | None = None):
    """The share of SMs the userbuffers collectives ``coll_ms`` hold from the GEMMs they run beside: each method's
    :data:`UB_METHOD_SMS` over ``num_sms``, weighted by the time its collectives take (``method_ms``: method -> ms, a
    part of ``coll_ms``; what is not named is ring exchange). None: all ring exchange."""
    coll = np.asarray(coll_ms, dtype=float)
    named = {m: np.asarray(v, dtype=float) for m, v in (method_ms or {}).items()}
    unknown = set(named) - set(UB_METHOD_SMS)
    if unknown:
        raise ValueError(f"userbuffers method(s) {sorted(unknown)} unknown: one of {sorted(UB_METHOD_SMS)}")
    rest = np.maximum(coll - sum(named.values(), np.zeros_like(coll)), 0.0)
    sms = rest * UB_METHOD_SMS["ring_exchange"] + sum(
        (UB_METHOD_SMS[m] * np.minimum(v, coll) for m, v in named.items()), np.zeros_like(coll))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_sms = np.where(coll > 0, sms / coll, float(UB_METHOD_SMS["ring_exchange"]))
    return np.minimum(np.maximum(mean_sms, 0.0) / max(int(num_sms), 1), 1.0)


def tp_overlap_layer_ms(gemm_ms, coll_ms, *, tp: int, num_sms: int, gemm_hbm=None, coll_hbm_bytes=0.0,
                        hbm_gbps=None, method_ms: dict | None = None):
    """Time of a layer's TP collectives and the GEMMs they are pipelined with under ``--tp-comm-overlap``
    (userbuffers: ``tp`` chunks, one exposed). ``method_ms``: the part of ``coll_ms`` each userbuffers method other
    than the ring exchange runs (``pipeline``: the forward reduce-scatters; ``bulk``: the backward's input re-gathers
    and dgrad reduce-scatters; the rest is ring exchange): each holds :data:`UB_METHOD_SMS` SMs from the GEMMs while
    it runs (:func:`ub_sm_share`, the pairs pooled per direction). ``gemm_hbm``: the GEMMs' (memory-bound ms, their
    bytes, the other GEMMs' bytes), ``coll_hbm_bytes`` the collectives' DRAM traffic (:func:`collective_hbm_bytes`
    with ``userbuffers``), ``hbm_gbps`` the achievable DRAM bandwidth: the two share it (:func:`hbm_stretch`; None:
    the SMs alone)."""
    coll = np.asarray(coll_ms, dtype=float)
    share = ub_sm_share(coll, num_sms, method_ms)
    stretch = None
    if hbm_gbps is not None:
        mem_ms, mem_b, oth_b = gemm_hbm if gemm_hbm is not None else (0.0, 0.0, 0.0)
        stretch = hbm_stretch(gemm_ms, coll, share=share, mem_ms=mem_ms, mem_bytes=mem_b, other_bytes=oth_b,
                              comm_hbm_bytes=coll_hbm_bytes, hbm_gbps=hbm_gbps)
    return overlapped_ms(gemm_ms, coll, share=share, first_chunk_ms=coll / max(int(tp), 1), stretch=stretch)


def ep_overlap_layer_ms(f_compute_ms, b_compute_ms, a2a_f_ms, a2a_b_ms, *, num_sms: int, mlp_f_ms, mlp_b_ms,
                        dispatch_f_ms, dispatch_b_ms, hbm: dict | None = None):
    """What a layer's expert-parallel all-to-alls add to its forward and to its backward under Megatron-Core's
    ``--overlap-moe-expert-parallel-comm`` (arrays per layer, ms).

    Megatron-Core's batch-level overlap (the idea of DeepSeek-V3's DualPipe) merges the forward of one micro-batch (A)
    and the backward of another (B) into one task, layer by layer, and pairs each all-to-all with one sub-module of the
    other micro-batch (``combined_1f1b``: ``schedule_layer_1f1b``), in this order, each pair waiting for the one before:

    1. B's combine backward beside A's attention forward (everything of the layer's forward but the experts: norms,
       attention, router, permute);
    2. A's dispatch beside B's experts' backward (``mlp_b_ms``: the routed experts with the dispatcher's re-sort, and
       the shared experts: ``submodule_moe_forward`` runs them there);
    3. B's dispatch backward beside A's experts' forward (``mlp_f_ms``);
    4. A's combine beside B's attention backward.

    Each pair costs ``overlapped_ms(compute, all-to-all)`` (NCCL's SMs taken from the computation while both run; an
    all-to-all longer than its partner is exposed for the rest); what the four add to ``f + b`` is split between the
    forward and the backward in proportion to their all-to-all times. ``dispatch_f_ms`` / ``dispatch_b_ms``: the
    dispatch's share of ``a2a_f_ms`` / ``a2a_b_ms`` (the rest is the combine's). Until stop 37 the four all-to-alls
    were pooled against the whole forward and backward (optimistic: a stop-36 audit measured about 0.8 s on
    DeepSeek-V3). A pipeline's unpaired tasks are the caller's (``_comm_parts``).

    ``hbm``: the DRAM bandwidth the pairs share (:func:`hbm_stretch`; None: the SMs alone): ``gbps`` the achievable
    bandwidth, ``f`` / ``b`` / ``mlp_f`` / ``mlp_b`` each a (memory-bound ms, their bytes, other bytes) of the forward,
    the backward and their experts' computation, ``a2a_f_bytes`` / ``a2a_b_bytes`` the all-to-alls' DRAM traffic
    (:func:`collective_hbm_bytes`), spread over each direction's all-to-alls in proportion to their time."""
    f = np.asarray(f_compute_ms, dtype=float)
    b = np.asarray(b_compute_ms, dtype=float)
    af = np.asarray(a2a_f_ms, dtype=float)
    ab = np.asarray(a2a_b_ms, dtype=float)
    comm = af + ab
    share = sm_share(NCCL_SMS, num_sms)
    mf = np.minimum(np.asarray(mlp_f_ms, dtype=float), f)
    mb = np.minimum(np.asarray(mlp_b_ms, dtype=float), b)
    df = np.minimum(np.asarray(dispatch_f_ms, dtype=float), af)
    db = np.minimum(np.asarray(dispatch_b_ms, dtype=float), ab)
    pairs = ((f - mf, ab - db), (mb, df), (mf, db), (b - mb, af - df))
    if hbm is None:
        extra = sum(overlapped_ms(c, a, share=share) for c, a in pairs) - (f + b)
    else:
        hf, hb, hmf, hmb = (tuple(np.asarray(x, dtype=float) for x in hbm[k]) for k in ("f", "b", "mlp_f", "mlp_b"))
        with np.errstate(invalid="ignore", divide="ignore"):
            rate_f = np.where(af > 0, np.asarray(hbm["a2a_f_bytes"], dtype=float) / af, 0.0)  # bytes per ms
            rate_b = np.where(ab > 0, np.asarray(hbm["a2a_b_bytes"], dtype=float) / ab, 0.0)
        attn_f = tuple(np.maximum(x - y, 0.0) for x, y in zip(hf, hmf))
        attn_b = tuple(np.maximum(x - y, 0.0) for x, y in zip(hb, hmb))
        extra = -(f + b)
        for (c, a), h, rate in zip(pairs, (attn_f, hmb, hmf, attn_b), (rate_b, rate_f, rate_b, rate_f)):
            st = hbm_stretch(c, a, share=share, mem_ms=h[0], mem_bytes=h[1], other_bytes=h[2], comm_hbm_bytes=rate * a,
                             hbm_gbps=hbm["gbps"])
            extra = extra + overlapped_ms(c, a, share=share, stretch=st)
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(comm > 0, af / comm, 0.0)
    return extra * frac, extra * (1.0 - frac)


def async_tp_backward_save_ms(names, phase, op_class, group, layer, time_ms, *, num_sms: int,
                              host_floor_ms: float = 0.0) -> np.ndarray:
    """Per row of a costed rank graph (in its order), the ms of backward TP communication that Megatron-Core's
    column-parallel linear layers hide without ``--tp-comm-overlap`` (0 elsewhere): what a row's time is to be
    lowered by.

    Transformer Engine's ``LayerNormLinear`` / ``Linear`` backward (TE 2.20.2 ``module/layernorm_linear.py``) starts
    the sequence-parallel all-gather of its saved input asynchronously (l. 787-790) before the input-gradient (dgrad)
    GEMM (l. 862) and waits for it before the weight-gradient GEMM (l. 985-987); it starts the dgrad's reduce-scatter
    (or, without sequence parallelism, all-reduce) asynchronously (l. 904-910) before the wgrad GEMM (l. 1063) and
    waits at the end (l. 1125-1130); ``module/layernorm_mlp.py`` l. 1600-1606 the same. Megatron-Core's local layers
    do the same (megatron-core 0.16.1 ``tensor_parallel/layers.py`` l. 520-535 and 544-624). So in the graph: a TP
    module's entry gradient (``<m>.enter.grad`` / ``<m>.enter.all_gather.grad``, the dgrad collective) runs beside the
    ``.wgrad`` GEMMs of the linear layers just before it (the run of linear / TP-collective rows it closes), and a
    linear's ``.input_all_gather`` beside its ``.dgrad``; each pair costs :func:`overlapped_ms` with NCCL's SMs
    taken from the GEMM (:data:`NCCL_SMS`). The row-parallel layers' output-gradient all-gather is needed before
    their dgrad: not hidden. ``host_floor_ms``: a TP collective's host-bound floor (``collective_host_floor_ms``):
    the host issues the GEMM only once the collective's call returns, so that much of it is never hidden (a
    host-bound step, such as Megatron-LM's CI tests, hides nothing)."""
    names = pd.Series(np.asarray(names, dtype=object)).astype(str).reset_index(drop=True)
    t = np.asarray(time_ms, dtype=float)
    hideable = np.maximum(t - max(float(host_floor_ms), 0.0), 0.0)
    bwd = np.asarray(phase) == "backward"
    is_coll = np.asarray(op_class) == "collective"
    tp = is_coll & (np.asarray(group, dtype=object).astype(str) == "tp")
    is_lin = np.asarray(op_class) == "linear"
    share = sm_share(NCCL_SMS, num_sms)
    save = np.zeros(len(t))
    # dgrad collective beside the module's wgrad GEMMs: runs of backward linear / TP-collective rows
    enter = bwd & tp & names.str.contains(r"\.enter(?:\.all_gather)?\.grad$", regex=True).to_numpy()
    if enter.any():
        # a linear's bias gradient (``.bgrad``, a reduction row between its wgrad and the collective) stays in the run:
        # Transformer Engine fuses it into the wgrad / dgrad work; so do autograd's sums of the input gradients of
        # linears that share their input (``<m>.enter.grad_accumulate<i>`` / ``.grad_split_cat``: separate q/k/v or
        # gate/up projections, as the hf Llama graphs have), which come before the module's collective: until the stop 53
        # audit they ended the run, and --async-tp-comm hid nothing of a Llama's all-reduces under hf
        # (featurize/op_graph.py builds those rows; Megatron-Core's fused projections have none)
        seg = np.cumsum(~(bwd & (is_lin | tp | names.str.endswith(".bgrad").to_numpy()
                                 | names.str.contains(r"\.grad_(?:accumulate\d+|split_cat)$", regex=True).to_numpy())))
        wgrad = bwd & is_lin & names.str.endswith(".wgrad").to_numpy()
        w_seg = np.bincount(seg, weights=np.where(wgrad, t, 0.0))
        c_seg = np.bincount(seg, weights=np.where(enter, hideable, 0.0))
        w, c = w_seg[seg[enter]], c_seg[seg[enter]]
        hidden = w + c - overlapped_ms(w, c, share=share)  # of the segment's collectives, shared in proportion
        with np.errstate(invalid="ignore", divide="ignore"):
            save[enter] = np.where(c > 0, hidden * hideable[enter] / c, 0.0)
    # sequence-parallel input all-gather beside the same linear's dgrad GEMM
    ag = bwd & tp & names.str.endswith(".input_all_gather").to_numpy()
    if ag.any():
        lay = np.asarray(layer)
        lin = bwd & is_lin
        dgrad_ms = pd.Series(t[lin], index=pd.MultiIndex.from_arrays([lay[lin], names[lin].to_numpy()]))
        dgrad_ms = dgrad_ms[~dgrad_ms.index.duplicated()]
        want = pd.MultiIndex.from_arrays([lay[ag], names[ag].str.replace(r"\.input_all_gather$", ".dgrad",
                                                                          regex=True).to_numpy()])
        d = np.nan_to_num(dgrad_ms.reindex(want).to_numpy(dtype=float))
        save[ag] = d + hideable[ag] - overlapped_ms(d, hideable[ag], share=share)
    return save
