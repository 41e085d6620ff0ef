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

Assumptions (stated, not fitted): NCCL's collectives hold 16 SMs while they run (NCCL's default of at least 16
channels on NVLink/NVSwitch systems, ``NCCL_MIN_NCHANNELS``; Megatron-LM leaves it at the default), Transformer
Engine's userbuffers ring-exchange moves data with copy engines and holds ``UB_SMS`` = 2 SMs for its
synchronisation (TE's ``userbuffers`` defaults for the pipelined all-gather/reduce-scatter: ``num_sm`` 1-16 by
method; the copy-engine ring exchange is the recommended one on NVSwitch machines).

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
#: SMs Transformer Engine's userbuffers ring exchange holds (copy engines move the data)
UB_SMS = 2


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


def overlapped_ms(compute_ms, comm_ms, *, share: float, first_chunk_ms=0.0):
    """Wall time of ``compute_ms`` of computation with ``comm_ms`` of communication run beside it (arrays or scalars).

    While both run the computation is slowed by ``share`` (the SMs the collective holds): the overlapped span
    ``min(compute, comm)`` costs ``share`` x itself more; communication beyond the computation is exposed; and
    ``first_chunk_ms`` (a pipelined collective's chunk that cannot overlap) is always exposed. Never less than
    ``max(compute, comm)``, and equal to ``compute + comm`` when there is nothing to hide behind."""
    compute = np.asarray(compute_ms, dtype=float)
    comm = np.asarray(comm_ms, dtype=float)
    first = np.minimum(np.asarray(first_chunk_ms, dtype=float), comm)
    rest = comm - first
    together = np.minimum(compute, rest)
    t = first + np.maximum(compute + share * together, rest)
    return t if t.ndim else float(t)


def tp_overlap_layer_ms(gemm_ms, coll_ms, *, tp: int, num_sms: int):
    """Time of a layer's TP collectives and the GEMMs they are pipelined with under ``--tp-comm-overlap``
    (userbuffers: ``tp`` chunks, one exposed, copy-engine transfers holding :data:`UB_SMS` SMs)."""
    coll = np.asarray(coll_ms, dtype=float)
    return overlapped_ms(gemm_ms, coll, share=sm_share(UB_SMS, num_sms), first_chunk_ms=coll / max(int(tp), 1))


def ep_overlap_layer_ms(f_compute_ms, b_compute_ms, a2a_f_ms, a2a_b_ms, *, num_sms: int, mlp_f_ms, mlp_b_ms,
                        dispatch_f_ms, dispatch_b_ms):
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
    DeepSeek-V3). A pipeline's unpaired tasks are the caller's (``_comm_parts``)."""
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
    extra = sum(overlapped_ms(c, a, share=share) for c, a in pairs) - (f + b)
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
