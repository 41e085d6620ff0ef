"""A training step under a parallel strategy on a cluster: per-rank graph, collectives, pipeline, memory.

1. The graph of one micro-batch on one tensor-parallel rank (column/row-parallel GEMMs, TP/SP/EP
   collectives in it) is costed kernel by kernel; TP collectives are blocking (on the compute stream, as
   in Megatron-LM), each costed by the collective model on the TP group's placement.
2. Layers are cut into ``pp x interleave`` chunks (embeddings with the first, head and loss with the last);
   per chunk the forward and backward time of one micro-batch.
3. The pipeline schedule is simulated event by event (:mod:`wattcast.simulate.scheduler`), with the
   activation/gradient point-to-point transfer between stages; beyond ``MAX_EXACT_MICRO`` micro-batches its
   steady state is extrapolated (``meta["schedule_extrapolated"]``; a trace then draws the head and the tail
   of the schedule, ``meta["trace_truncated"]``).
4. Data-parallel gradient synchronisation per stage: buckets (all-reduce; reduce-scatter under ZeRO >= 1)
   start as the stage's last backward pass produces them and overlap with it (interleaved: each model chunk's
   once that chunk's own last backward is done, as Megatron-Core launches them); ZeRO >= 1 all-gathers the
   updated parameters after the optimizer step (``--overlap-param-gather``: before the next step's first forward,
   interleaved chunk by chunk before each chunk's); ZeRO-3/FSDP also all-gathers each chunk's parameters
   before its forward and backward (prefetched: a task takes max(compute, gather)).
   A model whose LM head is tied to the token embedding keeps, with a pipeline, a copy of the word-embedding matrix
   on the last stage (a parameter there: memory, DP buckets, optimizer), and the first and the last stage all-reduce
   its gradient once per step (Megatron-Core's ``_allreduce_embedding_grads`` after the DP sync; DeepSpeed's
   ``_exec_reduce_tied_grads`` before it): ``tied_copy_params_by_chunk``, ``tied_grad_sync_ms``; charged to the "pp"
   class of the exposed-communication split.
5. Optimizer step per stage (sharded over DP under ZeRO >= 1).

Outputs: step time, exposed communication (step time minus the same step with free communication),
pipeline bubble, per-device busy time and memory, MFU / HFU / model TFLOP/s per GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Mapping, NamedTuple

import numpy as np
import pandas as pd

from wattcast.data.checks import is_count, is_int, nonneg_finite
from wattcast.data.catalog import resolve_device
from wattcast.data.cluster_spec import ClusterSpec, device_link_notes, resolve_cluster
from wattcast.data.device_spec import DeviceSpec, unsupported_step_dtype
from wattcast.data.device_spec import spec_notes as device_spec_notes
from wattcast.data.kernel_ops import DTYPE_BYTES, canonical_dtype
from wattcast.featurize.context_parallel import cp_refuses_window
from wattcast.featurize.fp8_recipes import (activation_cast_copies, fp8_writes_transpose, unsupported_fp8_recipe,
                                            weight_copy_bytes_per_param)
from wattcast.featurize.te_attention import te_attention_backend
from wattcast.featurize.graph_cache import RowsCache
from wattcast.featurize.hf_config import HFConfig, attention_windows, deepseek_field, load_hf_config, pinned
from wattcast.featurize.op_graph import NODE_COLUMNS, GraphError
from wattcast.featurize.recompute import node_tags
from wattcast.featurize.training_graph import (CLIP_BYTES_PER_PARAM, MUON_STATE_BYTES_PER_PARAM, optimizer_key,
                                               optimizer_param_tensors, optimizer_state_bytes)
from wattcast.featurize.workload import (MAX_TOKENS_PER_STEP, StepOptions, canonical_framework, checked_dtype,
                                        fp8_recipe_option, is_onnx_path, moe_dispatcher_option, step_graph)
from wattcast.models.kernel_bundle import load_bundle
from wattcast.models.power import check_power_settings, power_setting_notes
from wattcast.simulate.defaults import step_dtype
from wattcast.simulate.energy import apply_power, overlap_cap_w, overlap_power, stream_power_w
from wattcast.simulate.memory import activation_bytes_by_layer, memory_flag, transient_bytes_by_layer
from wattcast.simulate.moe_routing import ROUTING_DEFAULTS, MoERoutingError, given_routing, moe_load_factor
from wattcast.simulate.parallel import (CP_SUBGROUPS, GroupLayout, ParallelConfig, ParallelConfigError, chunk_layers,
                                        memory_fitting_split,
                                        cp_group_sizes, embedding_group_layout, expert_dp, expert_tp, group_layout,
                                        layouts, pair_layout_across, pp_hop_crosses_nodes, pp_senders_per_node,
                                        pipeline_split_report, resolve_parallel, stage_layers, straddling_group_notes,
                                        tp_overlap_notes,
                                        _PAIR_ONE_NODE)
from wattcast.simulate.data_loading import (NOT_A_TOKEN_BATCH, check_load_ms, h2d_copy_ms, loader_exposed_ms,
                                            resolve_workers, stage_copy, stage_figures)
from wattcast.simulate.dualpipe import (dualpipe_summary, mirrored, paired_share as dualpipe_paired_share,
                                        peak_activation_bytes as dualpipe_peak_bytes)
from wattcast.simulate.pipeline_fast import time_pipeline
from wattcast.simulate.scheduler import bucket_spans
from wattcast.simulate.single_device import (CUDA_LAUNCH_MS, EAGER_HOST_LAUNCH_MS, RING_DIAG_SHARE, check_host_us,
                                             cost_nodes, fallback_summary, requeued,
                                             group_totals, model_flops, op_part_labels, step_overheads,
                                             stream_bandwidth_gbps, with_warnings)
from wattcast.simulate.single_device import _peak_tflops
from wattcast.simulate.step_band import (band_keys, fp8_step_warning, ood_from_sums, ood_kernel_band_log, ood_warning,
                                          step_band)
from wattcast.simulate.options import MISSING, DistributedOptions, checked_headroom_gb, options_from_keywords
from wattcast.simulate.overlap import (NCCL_SMS, async_tp_backward_save_ms, ep_overlap_layer_ms, overlapped_ms, sm_share,
                                      tp_overlap_layer_ms)
from wattcast.simulate.overlap import collective_hbm_bytes, hbm_stretch, nccl_hbm_bytes_per_byte
from wattcast.simulate.stage_memory import (DEEPSPEED_BUCKET_ELEMENTS, GRAD_ACCUM_DTYPES, bf16_optimizer_runs,
                                            fsdp_shard_grad_op, megatron_fsdp, pytorch_fsdp,
                                            capacity_gb, deepspeed_bf16_optimizer_accum, effective_grad_accum,
                                            held_gradient_bytes, inflight_chunks_by_stage,
                                            MEGATRON_GRAD_CAST_BYTES_PER_PARAM, megatron_grad_cast,
                                            megatron_main_grad_bytes,
                                            interleaved_peak_bytes, stage_memory_gb, stage_state_parts,
                                            stage_total_from_parts, userbuffer_bytes, weight_and_master_bytes,
                                            peak_breakdown)


@dataclass(frozen=True)
class DistributedPrediction:
    model: str
    device: str
    cluster: str
    gpus: int
    parallel: ParallelConfig
    step_time_ms: float
    #: the whole model's forward / backward tasks as scheduled, over all micro-batches, summed over the stages and
    #: chunks (the trace's F / B events; since stop 44, before it the serial sums now in forward_serial_ms)
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    exposed_comm_ms: float
    bubble_ms: float
    mfu: float
    hfu: float
    tflops_per_gpu: float
    flops: float
    memory_gb: float
    fits: bool
    per_device: list[dict]
    per_op: list[dict]
    fallback_ops: list[dict]
    ood_fraction: float
    comm: dict
    events: list[dict] = field(default_factory=list, repr=False)
    meta: dict = field(default_factory=dict, repr=False)
    #: one step: energy of every GPU together (J) and the average board power per GPU (W)
    energy_j: float = 0.0
    avg_power_w: float = 0.0
    power_limit_w: float | None = None
    #: one GPU's memory (GB): ``memory_flag`` compares the worst device's prediction with it
    memory_capacity_gb: float = 0.0
    #: step time minus the same step with one class of communication free (ms): tp, ep, cp, pp, dp
    exposed_comm_split_ms: dict = field(default_factory=dict)
    #: the worst stage's memory term by term (GB): weights, master_weights, gradients, optimizer, activations,
    #: buffers, total; with its stage index and the chunks of activations it holds
    memory: dict = field(default_factory=dict)
    #: the whole run (wattcast.lifecycle.RunFootprint) when a run length in tokens was given, else None
    run: object = field(default=None, repr=False)
    #: the step's 90% band from measured steps (simulate/step_band.py: low_ms, high_ms, basis, generation; empty
    #: without a calibration or a simulated step)
    step_band: dict = field(default_factory=dict)
    #: the whole model's forward and backward over all micro-batches as the rank graph costs them, its kernels and
    #: collectives added in series, before the schedule (no overlap, loading, accumulation or pipeline sends):
    #: ``forward_ms`` / ``backward_ms`` until stop 44; NaN when not simulated
    forward_serial_ms: float = float("nan")
    backward_serial_ms: float = float("nan")

    @property
    def exposed_comm_unattributed_ms(self) -> float | None:
        """``exposed_comm_ms`` less the sum of ``exposed_comm_split_ms`` (ms; may be negative): each class's figure is
        a what-if (the step with that class alone free), and classes that hide behind one another or share a wait do
        not add up to the exposed total (freeing two saves more, or less, than the two savings); with it the parts
        sum to ``exposed_comm_ms``. None without a split (a search leaves it out)."""
        if not self.exposed_comm_split_ms:
            return None
        return float(self.exposed_comm_ms - sum(self.exposed_comm_split_ms.values()))

    @property
    def pipeline_layout(self) -> str | None:
        """Megatron-Core's ``--pipeline-model-parallel-layout`` that builds this step's uneven pipeline split (framework
        megatron; ``parallel.pipeline_layout`` in the JSON, :func:`parallel.pipeline_split_report`); None for an even
        split, no pipeline or another framework."""
        return self.meta.get("pipeline_layout")

    @property
    def memory_flag(self) -> str:
        """"tight" or "" (see simulate.memory.memory_flag; "pressure" was measured on eager single-GPU
        training only, not under these frameworks: a vTrain run predicted at 81.2 GB of 80 ran 5.7% faster)."""
        return memory_flag(self.memory_gb, self.memory_capacity_gb, eager_training=False)

    def to_dict(self) -> dict:
        p = self.parallel
        return dict(model=self.model, device=self.device, cluster=self.cluster, gpus=self.gpus,
                    # as a single device's JSON: a pipelined step is always a training step (build_stage_graphs)
                    mode=self.meta.get("mode", "train"),
                    parallel=dict(dp=p.dp, tp=p.tp, pp=p.pp, cp=p.cp, sp=p.sp, ep=p.ep, etp=expert_tp(p), zero=p.zero,
                                  micro_batch=p.micro_batch,
                                  # --cp-comm-type always (p2p, the ring, by default and where cp is 1);
                                  # --hierarchical-cp-sizes where not the ring (a p2p step's JSON has no such key)
                                  cp_comm_type=p.cp_comm_type,
                                  **(dict(hierarchical_cp_sizes=list(p.hierarchical_cp_sizes or ()) or None)
                                     if p.cp_comm_type != "p2p" else {}),
                                  overlap_grad_reduce=p.overlap_grad_reduce, overlap_param_gather=p.overlap_param_gather,
                                  tp_comm_overlap=p.tp_comm_overlap,
                                  overlap_moe_expert_parallel_comm=p.overlap_moe_expert_parallel_comm,
                                  overlap_p2p_comm=p.overlap_p2p_comm, async_tp_comm=p.async_tp_comm,
                                  interleave=p.interleave, recompute=p.recompute,
                                  recompute_num_layers=p.recompute_layers,
                                  recompute_method=p.recompute_method if p.recompute_num_layers is not None else None,
                                  schedule=p.schedule, name=p.describe(),
                                  stage_layers=self.meta.get("stage_layers"),
                                  # framework megatron, an uneven split: the --pipeline-model-parallel-layout that
                                  # builds it (parallel.pipeline_split_report; None otherwise)
                                  pipeline_layout=self.pipeline_layout,
                                  zero3_prefetch=self.meta.get("zero3_prefetch"),
                                  scatter_gather_p2p=self.meta.get("scatter_gather_p2p"),
                                  grad_accum_dtype=self.meta.get("grad_accum_dtype")),
                    step_time_ms=self.step_time_ms, **band_keys(self.step_band),
                    forward_ms=self.forward_ms, backward_ms=self.backward_ms,
                    forward_serial_ms=self.forward_serial_ms, backward_serial_ms=self.backward_serial_ms,
                    optimizer_ms=self.optimizer_ms, exposed_comm_ms=self.exposed_comm_ms,
                    exposed_comm_split_ms=self.exposed_comm_split_ms,
                    exposed_comm_unattributed_ms=self.exposed_comm_unattributed_ms, bubble_ms=self.bubble_ms,
                    mfu=self.mfu, hfu=self.hfu, tflops_per_gpu=self.tflops_per_gpu, flops=self.flops,
                    memory_gb=self.memory_gb, memory=self.memory, fits=self.fits, per_device=self.per_device, per_op=self.per_op,
                    fallback_ops=self.fallback_ops, ood_fraction=self.ood_fraction,
                    # as a single device's JSON (stop 58): the critical rank's OOD shares (None where not simulated)
                    ood_time_fraction=(self.meta.get("ood_shares") or {}).get("ood_time_fraction"),
                    ood_kernel_time_fraction=(self.meta.get("ood_shares") or {}).get("ood_kernel_time_fraction"),
                    comm=self.comm,
                    data_loading=self.comm.get("data_loading"),
                    param_count=self.meta.get("param_count"), energy_j=self.energy_j, avg_power_w=self.avg_power_w,
                    power_limit_w=self.power_limit_w, memory_capacity_gb=self.memory_capacity_gb,
                    memory_flag=self.memory_flag,
                    # set when the pipeline schedule of a huge micro-batch count was extrapolated past its exact part
                    schedule_extrapolated=self.meta.get("schedule_extrapolated"),
                    # --schedule dualpipe: per-rank busy time and bubble, and Table 2's bubble (simulate/dualpipe.py)
                    **({"dualpipe": self.meta["dualpipe"]} if self.meta.get("dualpipe") else {}),
                    warnings=list(self.meta.get("warnings") or []),  # always there: [] when there are none
                    # the options the public API ran with (wattcast.predict_cluster sets them; None for the simulator's own)
                    **({"settings": dict(self.meta["settings"])} if self.meta.get("settings") else {}),
                    **(dict(run=self.run.run_dict(), run_details=self.run.to_dict()) if self.run is not None else {}))


#: Host-side costs per framework: (per-kernel launch cost in ms, fixed per-iteration overhead in ms), composed per
#: :data:`FRAMEWORK_HOST_MODEL`. ``hf``: eager PyTorch's host time per launch,
#: ``single_device.EAGER_HOST_LAUNCH_MS`` (40 us: the Kineto traces' typical hosts, 35-43 us; ``host_us`` sets it),
#: in an in-order launch queue, as ``wattcast predict`` costs one device (a ``torch.compile``'d step:
#: ``single_device.CUDA_LAUNCH_MS``, :func:`framework_launch_ms`); was 6 us per kernel as max(GPU, 6 us) (the
#: NeuSight labels cannot tell 0 from 45 us either way: GPU-bound). ``megatron-deepspeed``: Megatron-DeepSpeed's Python-side cost per kernel (module and engine
#: hooks, autograd, fused-kernel wrappers) and per iteration (loss-scale and grad-norm checks with host
#: syncs, optimizer bookkeeping); fitted on half of vTrain's single-node rows
#: (benchmarks/fit_framework_overhead.py), the other half and the multi-node rows are the reported error.
#: Refitted when the graphs gained autograd's gradient-accumulation kernels (0.08 -> 0.07 ms per kernel;
#: 7.5% on the fitting half, 7.4% before with one kernel fewer per fan-out). Refitted again when each micro-batch's
#: data loading became a term of its own (``simulate/data_loading.py``: get_batch's copy, its two TP broadcasts and
#: 8 derived kernels): per iteration 10 -> 5 ms, per kernel 0.07 kept (grid 0.06-0.075 x 5/10 ms on all 720 fitting
#: rows: 6.50% mean, signed -0.9; 0.07 / 10 ms 6.66%, +1.3). Refitted when the GEMM family was retrained without the
#: withheld H100 rows (stop 29), on a finer grid (benchmarks/fit_framework_overhead.py: 0.006-0.14 ms per kernel, in
#: 0.0025 ms steps from 0.065 to 0.0775, x 0 / 2.5 / 5 / 10 / 20 / 30 ms; the 720 fitting rows): 0.0725 / 2.5 ms 6.25%
#: mean (median 5.04, signed -0.1), 0.075 / 0 ms 6.28%, 0.0725 / 5 ms 6.33%, 0.07 / 5 ms 6.47%: the per-iteration
#: cost is not pinned apart from the per-kernel one (their sum over a step is); the TP8 collective floor refitted with
#: it stayed 0.35 ms (0.30 since stop 54: FRAMEWORK_COLLECTIVE_HOST_MS).
#: ``megatron`` (Megatron-LM without DeepSpeed): no measurements to fit its preset; 6 us per kernel as max(GPU, 6 us),
#: as shipped before the launch queue (left as is: Megatron-LM's CI, the one host-bound measurement, is read with
#: its own fitted host costs, ``validation/megatron_ci.py`` ``CI_HOST_FIT``; the preset predicts it -67% "as shipped").
FRAMEWORK_HOST_MS = {"hf": (EAGER_HOST_LAUNCH_MS, 0.0), "megatron": (0.006, 0.0), "megatron-deepspeed": (0.0725, 2.5)}
#: How each framework's per-kernel host cost composes with the GPU times (``single_device.cost_nodes``' host_model):
#: eager PyTorch (hf) an in-order launch queue; the Megatron presets a per-kernel max(GPU, host), as their costs
#: were fitted (megatron-deepspeed's on vTrain) or shipped (megatron). The queue refitted for megatron-deepspeed lost on
#: vTrain's fitting half at stop 59 (``benchmarks/fit_framework_overhead.py --host-model queue``: best 9.03% mean, 139
#: rows > 15%, against the max's 5.80% / 59): it draws the host-bound plateau's turn (hidden 1,024 TP2 micro-batch 4
#: +19 -> +11%) but its GPU-bound rows come out too short (TP4 -15 -> -25%), so the max's host charge is standing in
#: for GPU time missing at TP4, the term to look for next. Looked for at stop 59 (benchmarks/vtrain_tp_terms.py, README
#: "vTrain's TP rows: the per-layer term"): a fixed cost per layer and micro-batch at TP > 1 (0.75-1.3 / 1.3-1.8 / ~2.3
#: ms at TP2 / 4 / 8), flat in the all-reduce size from 16 to 32 MB, so no bandwidth or kernel term; not shipped
FRAMEWORK_HOST_MODEL = {"hf": "queue", "megatron": "max", "megatron-deepspeed": "max"}


def framework_launch_ms(framework: str, compile: bool = False, host_us: float | None = None) -> float:
    """A framework's per-kernel host cost (ms): ``host_us`` (us; :func:`check_host_us`) where given, else its
    :data:`FRAMEWORK_HOST_MS` entry; an hf step under ``torch.compile`` launches Inductor's kernels without eager
    PyTorch's per-op Python and dispatcher: ``single_device.CUDA_LAUNCH_MS``."""
    if host_us is not None:
        return check_host_us(host_us) / 1e3
    if framework == "hf" and compile:
        return CUDA_LAUNCH_MS
    return FRAMEWORK_HOST_MS[framework][0]

#: Host-bound floor of one collective inside the rank graph (the TP all-reduces, EP all-to-alls), in ms, per framework
#: and by group size (the entry of the largest size <= the group's applies; smaller groups take the launch floor).
#: Each such collective is a barrier across the group: while the ranks' hosts, not their GPUs, set the pace, it waits
#: for the slowest rank's launches. vTrain's single-node rows show it (per micro-batch per layer, micro-batch 1,
#: hidden 1,024: 3.0 / 3.3 / 3.4 ms at TP1 / 2 / 4 and 5.0 at TP8; TP4 x DP2 on the same 8 GPUs costs what TP4 does,
#: so it is the 8-GPU group, not 8 busy hosts). ``megatron-deepspeed``: fitted on the fitting half of those rows
#: (``benchmarks/fit_framework_overhead.py --collective``; TP8 mean error 23.6% -> 9.9%, signed -23.6 -> +0.4; TP2
#: and TP4 floors above the launch floor made their rows worse), the evaluation half is the reported error. The
#: other frameworks have no host-bound TP measurements: none. Refitted at stop 54 (the same grid, 0.2-0.6 ms, the 720
#: fitting rows, the code of d9b593b): 0.30 ms 5.80% mean (59 rows beyond 15%; TP8 5.6 / +1.3) against 0.35 ms 5.87%
#: (64; TP8 7.2 / +6.0) and 0.25 ms 5.82%. The fitting half preferred 0.30 at stop 48 too, when 0.35 was kept for the
#: multi-node rows' median (an evaluation set; it moves 7.24 -> 7.19% now, the single-node evaluation half 4.16 -> 4.10%
#: median, 5.74 -> 5.59% mean, signed -0.32 -> -0.63).
FRAMEWORK_COLLECTIVE_HOST_MS: dict[str, dict[int, float]] = {"megatron-deepspeed": {8: 0.30}}


#: Host-bound floor of one ring-attention step under context parallelism (ms, per framework; each direction of a
#: layer's cp - 1 steps). Transformer Engine's ring attention (``AttnFuncWithCPAndKVP2P`` in
#: transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py) runs each step from Python: a
#: ``batch_isend_irecv`` of the next K/V block (backward: K/V and their gradients), the attention of the block in hand,
#: the softmax-LSE and output corrections (backward: the dQ / dK / dV accumulations), on two streams with events
#: between them. Where the host, not the GPU, sets the pace (small models, Megatron-LM's CI) that work is the step's
#: length. No framework's default has one: the one measurement (Megatron-LM CI's context-parallel tests) is read with
#: the Megatron-Core host costs fitted on it (``validation/megatron_ci.py`` ``CI_HOST_FIT``), not the ``megatron``
#: preset (a large model's host runs ahead of its GPUs).
FRAMEWORK_CP_STEP_HOST_MS: dict[str, float] = {}


def check_cp_step_floor_ms(v) -> float:
    """A ring-step host floor (ms): finite and >= 0 (ValueError naming it otherwise)."""
    return nonneg_finite(v, "host_ms's ring-step floor")


def moe_bare_op_mask(nodes: pd.DataFrame) -> np.ndarray:
    """Per node, whether it is one of Megatron-Core's MoE layer's bare torch ops (tag ``moe``): the router (its
    ``router_gating_linear``, softmax, top-k), the dispatcher's permute / unpermute index ops and collectives, and
    SequentialMLP's per-expert loop ops (bias, activation, probability scaling), the shared experts' activation and
    their sigmoid gate (``SharedExpertMLP.forward``: ``torch.nn.functional.linear`` on a bare ``gate_weight``
    parameter, then a sigmoid and a multiply, megatron-core 0.16.1 transformer/moe/shared_experts.py l. 57, 125-131),
    but not the Transformer Engine modules' linears, which keep the per-kernel host cost of TE's per-module Python:
    the routed experts' (``TEColumnParallelLinear`` / ``TERowParallelLinear``: megatron-core 0.16.1
    extensions/transformer_engine_spec_provider.py ``grouped_mlp_modules`` without grouped GEMM) and the shared
    experts' ``linear_fc1`` / ``linear_fc2`` (models/gpt/moe_module_specs.py l. 42-60: ``SharedExpertMLP`` built on
    the backend's ``column_parallel_linear`` / ``row_parallel_linear``, TE's under the TE spec)."""
    tags = nodes["tag"].fillna("").astype(str)
    moe = tags.map({t: "moe" in node_tags(t) for t in tags.unique()}).to_numpy(dtype=bool)
    linear = nodes["op_class"].to_numpy() == "linear"
    routed = nodes["scope"].astype(str).str.startswith("moe.experts.").to_numpy()
    shared = nodes["name"].astype(str).str.startswith("mlp.shared_experts.linear_fc").to_numpy()
    return moe & ~(linear & (routed | shared))


def node_launch_ms(nodes: pd.DataFrame, launch_ms: float, moe_op_ms: float | None):
    """The per-kernel host floor of each node (ms): ``launch_ms``, as a scalar, where no MoE per-op cost is given; else
    ``moe_op_ms`` on the MoE layer's bare ops (:func:`moe_bare_op_mask`) and ``launch_ms`` on every other node."""
    if moe_op_ms is None:
        return launch_ms
    return np.where(moe_bare_op_mask(nodes), float(moe_op_ms), float(launch_ms))


def check_moe_op_host_ms(v) -> float | None:
    """A MoE bare-op host cost (ms): None (not given) or finite and >= 0 (ValueError naming it otherwise)."""
    return None if v is None else nonneg_finite(v, "host_ms's MoE per-op host cost")


def collective_host_floor_ms(framework: str, group_size: int, table: dict[int, float] | None = None) -> float:
    """The host-bound floor of one rank-graph collective over ``group_size`` ranks (``table``, by default the
    framework's entry of FRAMEWORK_COLLECTIVE_HOST_MS)."""
    table = FRAMEWORK_COLLECTIVE_HOST_MS.get(framework, {}) if table is None else table
    sizes = [k for k in table if k <= group_size]
    return float(table[max(sizes)]) if group_size > 1 and sizes else 0.0
#: Whether data-parallel gradient buckets overlap the backward pass: PyTorch DDP/FSDP do; Megatron-LM's
#: local DDP (without --overlap-grad-reduce) and DeepSpeed's ZeRO-0 engine all-reduce after backward.
FRAMEWORK_DP_OVERLAP = {"hf": True, "megatron": False, "megatron-deepspeed": False}
#: whether a framework's ZeRO-3 / FSDP collectives run beside the computation
#: (``DistributedOptions.zero3_prefetch``). megatron / megatron-deepspeed: True (DeepSpeed ZeRO-3 prefetches
#: parameters, ``stage3_prefetch_bucket_size``; no measurement here says otherwise). hf (PyTorch FSDP): False, an
#: EMPIRICAL COMPENSATION, not what FSDP does. FSDP1 as MosaicML's llm-foundry / Composer runs it (``FULL_SHARD``,
#: ``backward_prefetch=BACKWARD_POST``, no forward prefetch, ``limit_all_gathers``) overlaps its collectives: torch
#: 2.13 distributed/fsdp/_runtime_utils.py issues a unit's forward all-gather from its pre-forward hook
#: (``_pre_forward_unshard`` l. 411) while the GPU still runs the unit before (the rate limiter, ``_unshard`` l.
#: 297-303 with _limiter_utils.py's two in-flight gathers, keeps the CPU one unit ahead, not in step) and the
#: backward's next gather from the post-backward hook (``_post_backward_reshard`` l. 793-807). On the MPT table
#: (``../shared/datasets/endtoend/mpt``; ``validation/mpt_validation.py``) a unit's collectives are at most 0.28 of
#: its computation, so all but a micro-batch's first gather and last reduce-scatter hide, and prefetched is right
#: where the collectives are large: 30B 32 / 128 GPUs -2.0 / -1.9% (in series +5.8 / +3.8), 13B 16-128 GPUs -0.4 to
#: +1.3% (in series +1.9 to +4.3). In series is kept because the fitting half (``fit_zero3_prefetch``; whole models
#: 125M, 760M, 3B, 13B, 70B) prefers it: mean |error| 3.91% in series, 5.60% prefetched (evaluation half 3.28 /
#: 3.58%, whole table 3.63 / 4.70%). Three quarters of that gap is 125M-3B (their share of the fitting mean 1.98 ->
#: 3.27 points; 13B and 70B 1.93 -> 2.33, from rows already too fast in series: 70B on 64 GPUs -20.3 -> -31.6%, 13B
#: on 8 x 40 GB -8.3..-10.7 -> -12.0..-14.6%), which prefetched predicts too fast by 1.1-4.5x their whole collective
#: time, 8-GPU single-node rows included. What is missing there is not the collectives' time (stop-59 study,
#: prefetched, per-term breakdowns of every row):
#: - on 8 GPUs it is per micro-batch, not per step (3B 80 GB at 20,480 tokens a micro-batch: 36.3 / 36.1 ms a
#:   micro-batch at 6 / 2 micro-batches a step, seq 1024 / 2048) and grows with the sequence at fixed tokens (1B 40
#:   GB 31 -> 76 ms, seq 512 -> 16k); that growth follows the predicted attention time at head dim 128 only (8 GPUs,
#:   no checkpointing, an offset per model and GPU: slope 0.044 on the fitting half, 0.060 on the evaluation half;
#:   head dim 64: -0.012 / +0.016), i.e. a FlashAttention-1 / Triton head-dim-128 kernel ~5% slower than the fa1
#:   class (``models/attention.py``: 40% / 30% of peak, the ends of the FlashAttention-2 abstract's "25-40%"); no
#:   source pins such a share, and it leaves the sequence-independent part (30-40 ms a micro-batch for 760M-3B on 40
#:   GB);
#: - not the vocabulary (loss, embedding and head are fixed at fixed tokens per micro-batch while the miss moves,
#:   125M 40 GB -4 -> +73 ms; 125M, where they weigh most, misses least on 40 GB), not kernel launches (GPU-bound,
#:   launch gaps ~0), not the learned position table (<= 33.5M parameters, 1B at 16k), not memory pressure
#:   (correlation -0.18 with predicted memory over capacity); the 80 GB (DEFAULT) and 40 GB (PURE) sections miss
#:   differently (125M at seq <= 4096: 21-23 ms a micro-batch on 80 GB, -4 to +5 on 40 GB);
#: - across nodes (40 GB, seq 2048, one micro-batch a step) the miss is about the predicted collective time (3B
#:   0.93-1.00x at 16-128 GPUs, 1B 0.96-1.10x, 760M 0.97-1.97x, 350M 0.42-1.22x, 125M 1.27-2.96x) and grows with the
#:   GPU count at a fixed per-GPU batch (350M, micro-batch 18, 16 -> 128 GPUs: +45 ms a step measured, +41 ms of
#:   latency-bound collectives predicted, +6 ms prefetched), which is what in series adds. An unmodelled per-step
#:   host cost (Composer's per-tensor DecoupledAdamW loop and FSDP's per-tensor clip_grad_norm_, 8 + 2 eager launches
#:   a parameter tensor at EAGER_HOST_LAUNCH_MS, if the optimizer saw the original parameters) would take 4.21% /
#:   3.14% (fitting / evaluation) prefetched, still behind in series on the fitting half, and overshoots 350M on 16
#:   GPUs (-0.9 -> +7.7%); not adopted.
#: So in series stands in for small-model time the model lacks, not for FSDP1's schedule; FSDP2 / torchtitan runs
#: (their own prefetch): pass ``--zero3-prefetch`` (README).
FRAMEWORK_ZERO3_PREFETCH = {"hf": False, "megatron": True, "megatron-deepspeed": True}


def zero3_prefetch(framework: str, given: bool | None) -> bool:
    """Whether ZeRO-3 / FSDP collectives are prefetched beside the computation: ``given``, else the framework's."""
    if given is None:
        return FRAMEWORK_ZERO3_PREFETCH.get(framework, True)
    if not isinstance(given, (bool, np.bool_)):
        raise ValueError(f"zero3_prefetch must be True, False or None (the framework's default), got {given!r}")
    return bool(given)

def check_zero3_prefetch_flag(given, framework: str, zero) -> None:
    """An explicit ``zero3_prefetch`` (``--zero3-prefetch`` / ``--no-zero3-prefetch``; None, the framework's default, is
    never refused) needs per-unit data-parallel collectives (:func:`per_unit_collectives`: ZeRO-3, or FSDP's ZeRO-2
    under ``hf``), the only ones it times: anywhere else it would change nothing, so it is refused (ValueError), as
    ``--cp-comm-type`` at cp 1. A ``zero`` that is not a stage (0-3) is left to the parallel rules' own message."""
    if given is None or not (is_int(zero) and int(zero) in (0, 1, 2, 3)):
        return
    if per_unit_collectives(framework, int(zero)):
        return
    flag = "--zero3-prefetch" if given else "--no-zero3-prefetch"
    raise ValueError(f"{flag} says how ZeRO-3 / FSDP's per-unit parameter gathers and gradient reduce-scatters meet the "
                     f"computation: it needs --zero 3 (or --zero 2 with --framework hf, FSDP's SHARD_GRAD_OP); --zero "
                     f"{int(zero)} under --framework {framework} runs no such collectives, so the flag would change "
                     f"nothing")


#: whether a framework's pipeline transfers are scattered over the TP group and gathered on arrival
#: (``DistributedOptions.scatter_gather_p2p``): each TP rank sends 1/tp of the activation (or its gradient) to its peer
#: on the next stage, the receiving stage all-gathers the pieces over its TP group (NVLink). megatron-deepspeed: True
#: (DeepSpeed's pipeline engine sends a PartitionedTensor over the TP group, deepspeed/runtime/pipe/engine.py
#: ``_exec_send_activations``). megatron: False, Megatron-Core's (megatron/core/pipeline_parallel/p2p_communication.py
#: sends the whole tensor from every TP rank; Megatron-LM 2021's ``--scatter-gather-tensors-in-pipeline``, default on,
#: megatron/p2p_communication.py ``_communicate`` with mpu.split_tensor_into_1d_equal_chunks / gather_split_1d_tensor,
#: was dropped with it; turn it on to cost 2021 Megatron-LM runs, e.g. SC21's). hf: False (no pipeline engine).
#: Under sequence parallelism the tensor crossing stages is already 1/tp of the sequence: nothing is left to scatter
#: (Megatron-LM v3.0 _communicate skips scatter/gather when args.sequence_parallel).
FRAMEWORK_SCATTER_GATHER_P2P = {"hf": False, "megatron": False, "megatron-deepspeed": True}


def scatter_gather_p2p(framework: str, given: bool | None) -> bool:
    """Whether pipeline transfers are scattered over the TP group and all-gathered on arrival: ``given``, else the
    framework's (``FRAMEWORK_SCATTER_GATHER_P2P``). Sequence parallelism and TP 1 leave nothing to scatter (the step
    checks those)."""
    if given is None:
        return FRAMEWORK_SCATTER_GATHER_P2P.get(framework, False)
    if not isinstance(given, (bool, np.bool_)):
        raise ValueError(f"scatter_gather_p2p must be True, False or None (the framework's default), got {given!r}")
    return bool(given)


def check_fp8_param_gather(given, *, graph_dtype: str, framework: str, zero: int) -> bool:
    """``fp8_param_gather`` as a bool, or a ParallelConfigError naming what it needs: Megatron-Core's FP8 parameters
    (``--fp8-param-gather``) are an FP8 recipe's weights (``--dtype fp8``) gathered by its distributed optimizer
    (``--zero`` >= 1, ``--framework megatron``)."""
    if not isinstance(given, (bool, np.bool_)):
        raise ParallelConfigError(f"fp8_param_gather must be True or False, got {given!r}")
    if not given:
        return False
    missing = [need for need, ok in (("--dtype fp8", graph_dtype == "fp8"), ("--framework megatron", framework == "megatron"),
                                     ("--zero 1 or more (the distributed optimizer)", int(zero) >= 1)) if not ok]
    if missing:
        raise ParallelConfigError(f"--fp8-param-gather keeps Megatron-Core's FP8 weights and gathers them in FP8: it needs "
                                  f"{', '.join(missing)}")
    return True


def _grad_bytes(framework: str, dtype: str, grad_accum_dtype: str | None = None) -> int:
    """Bytes per gradient element the data-parallel reduction moves, by framework default:
    PyTorch AMP keeps fp32 parameters, so fp32 gradients; DeepSpeed's fp16/bf16 engines all-reduce the
    half-precision gradients; Megatron-LM reduces its main-gradient buffer, whose dtype
    :func:`stage_memory.megatron_main_grad_bytes` gives (fp32 for bf16 unless ``--grad-reduce-in-bf16``,
    ``grad_accum_dtype`` "bf16" here)."""
    db = DTYPE_BYTES[dtype]
    if db >= 4:
        return db
    if framework == "megatron-deepspeed":
        return db
    if framework == "megatron":
        return megatron_main_grad_bytes(dtype, grad_accum_dtype)
    return 4


#: the dtypes FSDP's ``MixedPrecision.reduce_dtype`` may name here (``DistributedOptions.fsdp_reduce_dtype``)
FSDP_REDUCE_DTYPES = ("fp32", "bf16", "fp16")


def dp_reduce_bytes(framework: str, dtype: str, zero: int, reduce_dtype: str | None = None,
                    grad_accum_dtype: str | None = None) -> int:
    """Bytes per gradient element the data-parallel reduction moves: :func:`_grad_bytes`, except under PyTorch FSDP
    (``hf`` with ZeRO-2/3: ``SHARD_GRAD_OP`` / ``FULL_SHARD``) with half precision, which reduce-scatters in ``MixedPrecision.reduce_dtype``: ``reduce_dtype``
    if given, else the parameters' half-precision dtype (2 B; an fp8 recipe's are bf16). That default is what Hugging
    Face Accelerate 1.15 sets for ``mixed_precision="bf16"``/``"fp16"`` (``accelerate/utils/dataclasses.py``
    ``FullyShardedDataParallelPlugin.set_mixed_precision``: ``{"param_dtype": dtype, "reduce_dtype": dtype}``), what
    torch's ``MixedPrecision`` does with ``reduce_dtype=None`` ("takes on the ``param_dtype`` value, still running
    gradient reduction in low precision", torch 2.13 ``torch/distributed/fsdp/api.py``) and Composer's / llm-foundry's
    ``mixed_precision: PURE``; Composer's ``DEFAULT`` reduces in fp32 (``composer/distributed/mosaic_parallelism.py``
    ``get_mixed_precision``: ``reduce_dtype = torch.float32``): ``reduce_dtype="fp32"``. ``grad_accum_dtype``:
    Megatron's main-gradient dtype (:func:`_grad_bytes`; ignored by the other frameworks here)."""
    if reduce_dtype is not None:
        if reduce_dtype not in FSDP_REDUCE_DTYPES:
            raise ValueError(f"fsdp_reduce_dtype must be one of {', '.join(FSDP_REDUCE_DTYPES)} or None (the "
                             f"parameters' dtype), got {reduce_dtype!r}")
        if framework != "hf":
            raise ValueError(f"fsdp_reduce_dtype is PyTorch FSDP's MixedPrecision.reduce_dtype: it needs framework hf "
                             f"(got {framework})")
    if not pytorch_fsdp(framework, zero) or DTYPE_BYTES[dtype] >= 4:
        return _grad_bytes(framework, dtype, grad_accum_dtype if framework == "megatron" else None)
    return DTYPE_BYTES[reduce_dtype] if reduce_dtype is not None else 2


def checked_fsdp_reduce_dtype(framework: str, given: str | None) -> str | None:
    """``given`` in its canonical name (``FP32`` / ``float32`` -> ``fp32``, as ``--dtype`` reads it) once
    :func:`dp_reduce_bytes` accepts it (a ValueError naming the rule otherwise)."""
    if given is not None:
        given = canonical_dtype(given)
    dp_reduce_bytes(framework, "bf16", 3, given)
    return given


def fsdp_reduce_dtype_notes(given: str | None, framework: str, zero: int, dtype: str) -> list[str]:
    """A warning when ``fsdp_reduce_dtype`` was given where it changes nothing: no ZeRO-2/3 (FSDP's sharded reduce) or
    full precision (the gradients reduce in fp32 whatever it says)."""
    if given is None or framework != "hf":
        return []
    if int(zero) < 2:
        return [f"fsdp_reduce_dtype={given} has no effect at ZeRO-{int(zero)}: it is PyTorch FSDP's (ZeRO-2/3) "
                "MixedPrecision.reduce_dtype"]
    if DTYPE_BYTES.get(dtype, 2) >= 4:
        return [f"fsdp_reduce_dtype={given} has no effect under {dtype}: full-precision gradients reduce in fp32"]
    return []


#: each framework's DeepSpeed ``data_types.grad_accum_dtype`` when none is given (``DistributedOptions.grad_accum_dtype``):
#: megatron-deepspeed "fp32", ``BF16_Optimizer`` with its fp32 gradient accumulation, as BLOOM-176B ran (DeepSpeed
#: stage 0 with bf16 and a pipeline; benchmarks/published_runs.py: "ZeRO-1 (DeepSpeed BF16_Optimizer)"); the other
#: frameworks do not run DeepSpeed
FRAMEWORK_GRAD_ACCUM_DTYPE = {"megatron-deepspeed": "fp32"}


def checked_grad_accum_dtype(framework: str, given: str | None) -> str | None:
    """``given`` in its canonical name ("float32" -> "fp32", "bfloat16" -> "bf16", as ``--dtype`` reads them), or None;
    a ValueError unless it is one of :data:`GRAD_ACCUM_DTYPES` under ``framework`` megatron-deepspeed (DeepSpeed's
    ``data_types.grad_accum_dtype``) or megatron (the dtype of Megatron-LM's main-gradient buffer, one concept under
    one name: "bf16" is Megatron-LM's ``--grad-reduce-in-bf16``, "fp32" its ``--accumulate-allreduce-grads-in-fp32``,
    the default for bf16: :func:`stage_memory.megatron_main_grad_bytes`). PyTorch AMP (hf) keeps fp32 gradients of
    fp32 parameters; its FSDP reduces in ``--fsdp-reduce-dtype``."""
    if given is None:
        return None
    name = canonical_dtype(given)
    if name not in GRAD_ACCUM_DTYPES:
        raise ValueError(f"grad_accum_dtype must be one of {', '.join(GRAD_ACCUM_DTYPES)} or None (the framework's "
                         f"default), got {given!r}")
    if framework not in ("megatron-deepspeed", "megatron"):
        raise ValueError(f"grad_accum_dtype (--grad-accum-dtype; under megatron --grad-reduce-in-bf16 is its bf16) "
                         f"is the gradient-accumulation dtype of DeepSpeed (framework megatron-deepspeed: "
                         f"data_types.grad_accum_dtype) or of Megatron-LM's main-gradient buffer (framework megatron: "
                         f"--grad-reduce-in-bf16 / --accumulate-allreduce-grads-in-fp32); framework {framework} "
                         f"(PyTorch AMP) keeps the fp32 gradients of its fp32 parameters: under FSDP (--zero 2/3) "
                         f"choose the reduce-scatter dtype with --fsdp-reduce-dtype")
    return name


def folded_grad_accum_dtype(framework: str, grad_accum_dtype: str | None, grad_reduce_in_bf16: bool, *,
                            accum_name: str = "--grad-accum-dtype", bf16_name: str = "--grad-reduce-in-bf16",
                            fsdp_name: str = "--fsdp-reduce-dtype") -> str | None:
    """``grad_accum_dtype`` with Megatron-LM's ``--grad-reduce-in-bf16`` (``grad_reduce_in_bf16``) folded in: "bf16"
    when it is given, else ``grad_accum_dtype`` as given (:func:`checked_grad_accum_dtype` checks it next). The CLI's
    ``predict`` / ``search`` and a sweep spec's ``load_spec`` call it, each with its own names for the options
    (``accum_name``, ``bf16_name``, ``fsdp_name``: the flags, or the spec's keys) for the message of the ValueError it
    raises when

    - the framework is not ``megatron``: the flag is Megatron-LM's alone (``megatron/training/arguments.py``,
      ``--grad-reduce-in-bf16``, read with ``--bf16``; Megatron-Core 0.16.1 ``distributed_data_parallel.py`` l. 147
      makes the main-gradient buffer ``param.dtype`` without ``grad_reduce_in_fp32``). DeepSpeed has no such option:
      under ``megatron-deepspeed`` its gradient-accumulation dtype is ``data_types.grad_accum_dtype``, given as
      ``accum_name`` bf16 (until stop 51 the flag was silently taken as that: another optimizer at ZeRO-1);
      ``hf`` (PyTorch AMP) keeps fp32 gradients, and its FSDP's reduce dtype is ``fsdp_name``;
    - ``grad_accum_dtype`` names another dtype than bf16: the two contradict each other."""
    if not grad_reduce_in_bf16:
        return grad_accum_dtype
    framework = str(framework).lower()
    if framework == "megatron-deepspeed":
        raise ValueError(f"{bf16_name} is Megatron-LM's bf16 main-gradient buffer (framework megatron); DeepSpeed has "
                         f"no such option: for DeepSpeed's data_types.grad_accum_dtype under framework "
                         f"megatron-deepspeed give {accum_name} bf16")
    if framework != "megatron":
        raise ValueError(f"{bf16_name} is Megatron-LM's bf16 main-gradient buffer: it needs framework megatron; framework "
                         f"{framework} (PyTorch AMP) keeps the fp32 gradients of its fp32 parameters: under FSDP "
                         f"(--zero 2/3) choose the reduce-scatter dtype with {fsdp_name}")
    if grad_accum_dtype is not None and canonical_dtype(str(grad_accum_dtype)) != "bf16":
        raise ValueError(f"{bf16_name} is {accum_name} bf16 under framework megatron; it contradicts {accum_name} "
                         f"{grad_accum_dtype}")
    return "bf16"


def resolved_grad_accum_dtype(framework: str, given: str | None, dtype: str, zero: int = 1) -> str | None:
    """The grad_accum_dtype a step reports (``parallel.grad_accum_dtype`` of its JSON): ``given`` (checked), else the
    framework's (:data:`FRAMEWORK_GRAD_ACCUM_DTYPE`) at ZeRO-1 and, at ZeRO-0/2/3, DeepSpeed 0.19.8's default, the
    model's bf16 (``get_data_types``, engine.py l. 1799-1810: ``BF16_Optimizer`` with a bf16 buffer at ZeRO-0, bf16
    gradient partitions at ZeRO-2/3), for megatron-deepspeed with bf16 parameters; for megatron the main-gradient
    buffer's dtype ("fp32" / "bf16", :func:`stage_memory.megatron_main_grad_bytes`) with bf16 parameters or when
    "fp32" was given; None elsewhere (DeepSpeed's fp16 engine and full precision are costed without it)."""
    if framework == "megatron":
        if dtype == "bf16" or given == "fp32":
            return "fp32" if megatron_main_grad_bytes(dtype, given) == 4 else "bf16"
        return None
    if framework != "megatron-deepspeed" or dtype != "bf16":
        return None
    if given is not None:
        return given
    return FRAMEWORK_GRAD_ACCUM_DTYPE[framework] if int(zero) == 1 else "bf16"


def grad_accum_dtype_notes(given: str | None, framework: str, zero: int, dtype: str) -> list[str]:
    """A warning when ``grad_accum_dtype`` was given where it changes nothing (framework megatron-deepspeed: it
    selects DeepSpeed's optimizer at ZeRO-1 with bf16 alone, :func:`stage_memory.deepspeed_zero_optimizer_bf16`;
    framework megatron: "bf16", ``--grad-reduce-in-bf16``, under fp16 / fp32 parameters, which Megatron-LM reads only
    with ``--bf16``, ``arguments.py`` l. 1181-1194 of the 0.19.2 tree, and "fp32" under fp32 parameters)."""
    if given is None:
        return []
    if framework == "megatron":
        if given == "bf16" and dtype != "bf16":
            return [f"grad_accum_dtype=bf16 (--grad-reduce-in-bf16) has no effect under {dtype}: Megatron-LM reads it "
                    "only with --bf16 (arguments.py); the main gradients are in the parameters' dtype (Megatron-Core "
                    "DistributedDataParallel: grad_dtype = param.dtype without grad_reduce_in_fp32)"]
        if given == "fp32" and DTYPE_BYTES.get(dtype, 2) >= 4:
            return [f"grad_accum_dtype=fp32 has no effect under {dtype}: the main gradients are fp32 already"]
        return []
    if framework != "megatron-deepspeed":
        return []
    if dtype != "bf16":
        return [f"grad_accum_dtype={given} has no effect under {dtype}: it chooses between DeepSpeed's BF16_Optimizer "
                "and its ZeRO optimizer on bf16 parameters (fp16 and fp32 gradient accumulation in the ZeRO optimizer "
                "under fp16 is not modelled)"]
    if int(zero) == 0 and given == "fp32":
        return ["grad_accum_dtype=fp32 at ZeRO-0: DeepSpeed 0.19.8 refuses bf16 parameters with fp32 accumulation "
                "without ZeRO (engine.py _do_optimizer_sanity_check: NotImplementedError); costed as the older "
                "DeepSpeed BLOOM-176B ran it, BF16_Optimizer with an fp32 accumulation buffer (ZeRO-0's default, "
                "grad_accum_dtype bf16, is BF16_Optimizer with a bf16 one)"]
    if int(zero) >= 2:
        return [f"grad_accum_dtype={given} has no effect at ZeRO-{int(zero)}: DeepSpeed's ZeRO-2/3 gradient partitions "
                "are costed in the model's dtype (fp32 partitions under grad_accum_dtype fp32 are not modelled)"]
    return []


def deepspeed_zero_search_notes(framework: str, dtype: str, grad_accum_dtype: str | None,
                                zero_stages=(0, 1)) -> list[str]:
    """A search's note on why ZeRO-0 can rank ahead of ZeRO-1 for megatron-deepspeed with bf16 and the default
    ``grad_accum_dtype``: DeepSpeed 0.19.8 runs ``BF16_Optimizer`` at both (``engine.py``
    ``_do_optimizer_sanity_check`` l. 2294-2323), which at ZeRO-0 too shards its step over the DP group, all-reduces
    the gradients and all-gathers the weights (``bf16_optimizer.py`` l. 152-183, 593-603): the same communication
    and states. ZeRO-0's accumulation buffer is bf16 (the model's dtype, ``get_data_types`` l. 1799-1810), ZeRO-1's
    here fp32 (BLOOM-176B's, :data:`FRAMEWORK_GRAD_ACCUM_DTYPE`), so ZeRO-0 streams fewer bytes per micro-batch and
    holds 2 B/param less. Only when the searched ZeRO stages (``zero_stages``) include both 0 and 1 (until stop 44 it
    showed whatever the stages)."""
    if framework != "megatron-deepspeed" or canonical_dtype(str(dtype)) != "bf16" or grad_accum_dtype is not None:
        return []
    if not {0, 1} <= {int(z) for z in zero_stages}:
        return []
    return ["megatron-deepspeed with bf16: ZeRO-0 and ZeRO-1 both run DeepSpeed 0.19.8's BF16_Optimizer, which shards "
            "the optimizer step, all-reduces the gradients and all-gathers the weights at ZeRO-0 too; ZeRO-0 "
            "accumulates in bf16 (DeepSpeed's default there) and ZeRO-1 in fp32 (wattcast's default there, as "
            "BLOOM-176B ran), so ZeRO-0 can rank ahead (fewer bytes per micro-batch, 2 B/param less memory). "
            "--grad-accum-dtype bf16 makes ZeRO-1 DeepSpeed's ZeRO optimizer instead"]


def grad_accumulation_bytes(framework: str, dtype: str, grad_accum_dtype: str | None = None,
                            zero: int = 1) -> tuple[float, bool]:
    """(bytes per parameter, every micro-batch?) of the pass that accumulates a micro-batch's gradients.

    - PyTorch (``hf``; AMP keeps fp32 parameters) and DeepSpeed's fp16/fp32 engines: autograd's AccumulateGrad
      adds each new gradient into ``.grad`` in place (read both, write one, in the gradient dtype), for every
      micro-batch after the first.
    - DeepSpeed's ``BF16_Optimizer`` (``megatron-deepspeed`` with bf16): ``backward`` copies/accumulates the
      bf16 gradients into fp32 ones after every micro-batch (``update_hp_grads``: ``hp.add_(lp.to(fp32))``,
      a cast writing an fp32 temporary, then the add: 2 + 4 + 4 + 4 + 4 bytes), the first one included; with a
      bf16 accumulation buffer (its ZeRO-0 default in DeepSpeed 0.19.8, ``stage_memory.deepspeed_bf16_optimizer_accum``)
      the cast returns the gradient itself and the add reads 2 + 2 and writes 2 bytes (``bf16_optimizer.py``
      ``_update_hp_grad`` l. 508-525). It runs at ZeRO-0/1 only: at ZeRO-2/3 DeepSpeed runs its ZeRO optimizer
      (``engine.py`` l. 2305-2311), autograd's accumulation as below (over the rank's gradient partition).
      DeepSpeed's ZeRO-1 optimizer on bf16 gradients instead (``grad_accum_dtype`` "bf16", the effective value:
      ``stage_memory.deepspeed_zero_optimizer_bf16``) has no such pass: autograd accumulates into the bf16
      ``param.grad`` (DeepSpeed 0.19.8 ``stage_1_and_2.py``: no separate accumulation buffer when the accumulation
      dtype is the model's, l. 394-404; stage 1 reduces only at the accumulation boundary, ``engine.py``
      ``allreduce_gradients`` l. 3088-3092), as the fp16 engine.
    - Megatron-LM: gradient-accumulation fusion, the default, accumulates into the main gradients (fp32, bf16 under
      ``--grad-reduce-in-bf16``) inside the weight-gradient GEMMs: no separate pass.
    """
    if framework == "megatron":
        return 0.0, False
    acc = deepspeed_bf16_optimizer_accum(framework, dtype, zero, grad_accum_dtype)
    if acc is not None:
        return (18.0 if acc == "fp32" else 6.0), True
    return 3.0 * _grad_bytes(framework, dtype), False


def grad_reduce_every_micro(framework: str, zero: int) -> str | None:
    """How a framework's ZeRO-2 reduces the gradients when a step has several micro-batches: "overlapped" or "series"
    (every micro-batch's backward reduces them), None (once a step, after the last backward: ZeRO-0/1; ZeRO-3 and the
    ``hf`` framework's ZeRO-2, PyTorch FSDP ``SHARD_GRAD_OP`` (:func:`fsdp_shard_grad_op`), have their own per-unit
    path in :func:`_dp_times`).

    - ``megatron`` (Megatron-FSDP ``optim_grads``, megatron-core 0.16.1 ``distributed/fsdp/src/megatron_fsdp``):
      every parameter's post-accumulate-grad hook (``megatron_fsdp.py`` l. 1007-1011) calls
      ``_process_post_backward_gradients``, which reduce-scatters on every backward under a gradient-sharding strategy
      (``grad_reduce_every_bprop``, l. 654-662); ``GradReducePipeline.reduce_gradients`` (``param_and_grad_buffer.py``
      l. 3048-3090) launches a bucket's ``reduce_scatter_tensor`` (l. 3244) on its side stream once all its parameters'
      gradients are in, beside the rest of the backward, in the main-grad buffer's dtype (fp32 with
      ``grad_reduce_in_fp32``, Megatron-LM's for bf16: l. 2030), and the root post-backward callback (l. 764-795,
      queued by ``_root_pre_backward``, l. 868) reduces what is left and ``reset()``s the pipeline
      (``wait_for_previous_grad_reduce(0)``, l. 3029-3031): the compute stream waits for every reduce-scatter at the
      end of each backward. So "overlapped": all buckets but the last beside the backward, the last exposed; the
      reduced shard is added into the sharded main-grad buffer (l. 3254-3257), nothing is left for the step's end.
    - ``megatron-deepspeed`` (DeepSpeed 0.19.8 ZeRO-2, ``partition_gradients``): the gradient hooks
      (``stage_1_and_2.py`` ``create_gradient_handling_hooks`` l. 1354-1380 -> ``process_gradients`` l. 2284-2291)
      reduce in every backward at stage 2 (``reduce_ready_partitions_and_remove_grads``, l. 2293-2295:
      ``partition_gradients or is_gradient_accumulation_boundary()``; stage 1 only at the boundary) in
      ``reduce_bucket_size`` buckets (l. 1414-1425), the rest at the backward's end (``engine.py``
      ``allreduce_gradients`` l. 3084-3086: "ZeRO stage >= 2 communicates during non gradient accumulation
      boundaries as well"), on the compute stream since ``overlap_comm`` is off below ZeRO-3 (``zero/config.py``
      l. 384-386; ``reduce_ipg_grads`` l. 2239-2248, ``average_tensor`` l. 1594): "series"."""
    if int(zero) != 2:
        return None
    return {"megatron": "overlapped", "megatron-deepspeed": "series"}.get(framework)


def per_unit_collectives(framework: str, zero: int) -> bool:
    """Whether the data-parallel collectives run unit by unit, every micro-batch (:func:`_dp_times`' ``z3_*`` terms):
    ZeRO-3 in every framework, and PyTorch FSDP's ZeRO-2 (:func:`fsdp_shard_grad_op`)."""
    return int(zero) == 3 or fsdp_shard_grad_op(framework, zero)


def muon_layer_wise(framework: str, optimizer: str | None, zero: int) -> bool:
    """Whether the step runs Muon under Megatron-Core's LayerWiseDistributedOptimizer: ``--optimizer muon`` with
    ``--framework megatron`` at ZeRO-1. Megatron-Core 0.16.1's Muon refuses the distributed optimizer
    (optimizer/muon.py l. 190-193: "muon with dist optimizer is not supported") and shards its states over the DP
    ranks with that wrapper instead (muon.py l. 343-349): whole parameters per rank, sorted by size and dealt
    ping-pong (layer_wise_optimizer.py l. 92-136), the gradients all-reduced by DDP (l. 35), each rank stepping its
    own, then one all-gather of the updated parameters inside the step (l. 146-182, 221-229): not overlapped with
    the next forward. wattcast's ``--zero 1`` with Muon is that wrapper."""
    return str(optimizer).lower() == "muon" and framework == "megatron" and int(zero) >= 1


def check_muon_parallel(par: ParallelConfig, raw_overlap_param_gather, framework: str, optimizer: str | None,
                        dual: bool = False) -> ParallelConfig:
    """``par`` as Muon runs it (:func:`muon_layer_wise`: no overlapped parameter gather), or ParallelConfigError for
    a combination wattcast does not model: hf above ZeRO-0 (torch.optim.Muon orthogonalises whole 2-D matrices;
    FSDP / ZeRO shards are not), megatron above ZeRO-1 (the layer-wise optimizer keeps Megatron's distributed
    optimizer and FSDP off, layer_wise_optimizer.py l. 31), expert parallelism or DualPipe with the layer-wise
    optimizer (its expert-DP split, l. 127-131, and DualPipe's mirrored stages are not modelled), an explicit
    --overlap-param-gather (its gather runs inside the step, l. 221-229)."""
    if str(optimizer).lower() != "muon":
        return par
    if framework == "hf" and int(par.zero) >= 1:
        raise ParallelConfigError("--optimizer muon with --framework hf is torch.optim.Muon on whole 2-D matrices: "
                                  "ZeRO / FSDP sharding (--zero 1-3) with it is not modelled; use --zero 0")
    if framework == "megatron" and int(par.zero) >= 2:
        raise ParallelConfigError("--optimizer muon with --framework megatron: Megatron-Core 0.16.1 runs Muon without "
                                  "the distributed optimizer (optimizer/muon.py l. 190-193) or with its "
                                  "LayerWiseDistributedOptimizer (--zero 1 here); --zero 2/3 (Megatron-FSDP) is not "
                                  "supported with it")
    if muon_layer_wise(framework, optimizer, par.zero):
        if par.ep > 1:
            raise ParallelConfigError("--optimizer muon at --zero 1 (Megatron-Core's LayerWiseDistributedOptimizer) with "
                                      "--ep > 1: its expert-data-parallel split is not modelled; use --zero 0 or --ep 1")
        if dual:
            raise ParallelConfigError("--optimizer muon at --zero 1 (LayerWiseDistributedOptimizer) with the DualPipe "
                                      "schedule is not modelled")
        if raw_overlap_param_gather:
            raise ParallelConfigError("--overlap-param-gather with --optimizer muon: Megatron-Core's "
                                      "LayerWiseDistributedOptimizer all-gathers the updated parameters inside its step "
                                      "(layer_wise_optimizer.py l. 221-229), not in the next forward")
        par = replace(par, overlap_param_gather=False)
    return par


def _ping_pong_rank_sums(numel: np.ndarray, stage: np.ndarray, P: int, dp: int, weights: np.ndarray) -> np.ndarray:
    """(P, dp, k) sums of the ``weights`` columns (n, k) each DP rank of each pipeline stage holds under
    Megatron-Core's LayerWiseDistributedOptimizer: a stage's tensors sorted by ``numel`` (a stable sort, as Python's
    ``list.sort``) and dealt to the ranks ping-pong, 0..dp-1 then dp-1..0 (layer_wise_optimizer.py l. 104-136)."""
    stage = np.asarray(stage, dtype=np.int64)
    weights = np.asarray(weights, dtype=float).reshape(len(stage), -1)
    order = np.lexsort((np.asarray(numel, dtype=float), stage))  # by stage, then by size; stable
    st = stage[order]
    first = np.searchsorted(st, np.arange(P))
    pos = np.arange(len(order)) - first[st]  # each tensor's place in its stage's sorted list
    loop = np.r_[np.arange(dp), np.arange(dp)[::-1]]
    cell = st * dp + loop[pos % len(loop)]
    out = np.stack([np.bincount(cell, weights=weights[order, j], minlength=P * dp) for j in range(weights.shape[1])],
                   axis=-1)
    return out.reshape(P, dp, -1)


def layer_wise_shares(tensors: pd.DataFrame, stage: np.ndarray, P: int, dp: int, ns_tflops: float,
                      mem_gbps: float) -> np.ndarray:
    """Per pipeline stage, the slowest DP rank's share of the stage's optimizer step under Megatron-Core's
    LayerWiseDistributedOptimizer: the stage's parameter tensors (``tensors``: training_graph.optimizer_param_tensors
    of the whole model in its order, ``stage`` each one's) dealt as :func:`_ping_pong_rank_sums` deals them; each
    tensor weighs its Newton-Schulz FLOPs at ``ns_tflops`` plus its elementwise bytes at ``mem_gbps``; the share is
    the heaviest rank's weight over the stage's."""
    out = np.full(P, 1.0 / max(int(dp), 1))
    if dp <= 1 or not len(tensors):
        return np.ones(P) if dp <= 1 else out
    w_all = (tensors["ns_flops"].to_numpy(dtype=float) / (ns_tflops * 1e12)
             + tensors["step_bytes"].to_numpy(dtype=float) / (mem_gbps * 1e9))
    per_rank = _ping_pong_rank_sums(tensors["numel"].to_numpy(dtype=float), stage, P, dp, w_all)[..., 0]
    total = per_rank.sum(axis=1)
    return np.where(total > 0, per_rank.max(axis=1) / np.where(total > 0, total, 1.0), out)


def layer_wise_state_shares(tensors: pd.DataFrame, stage: np.ndarray, P: int, dp: int,
                            master_bytes_per_param: float) -> tuple[np.ndarray, np.ndarray]:
    """Per pipeline stage, the busiest DP rank's shares (fp32 master weights, optimizer states) of the stage's under
    Megatron-Core's LayerWiseDistributedOptimizer, which keeps both for its own whole tensors only (the master copy is
    made after the split, "to avoid unnecessary master weight creation": layer_wise_optimizer.py l. 60-80; the
    states by the wrapped optimizers of those parameters): the tensors dealt as :func:`_ping_pong_rank_sums` deals
    them, a Muon tensor keeping one fp32 momentum (training_graph.MUON_STATE_BYTES_PER_PARAM), an AdamW one two
    moments, each ``master_bytes_per_param`` of master weight; the busiest rank is the one holding the most of the
    two together (a model whose largest tensors are few, e.g. the embedding and output layer at a small DP size, puts
    well over 1 / dp on it). 1 / dp for a stage without tensors; all of it at dp 1."""
    if dp <= 1:
        return np.ones(P), np.ones(P)
    even = np.full(P, 1.0 / dp)
    if not len(tensors):
        return even, even.copy()
    numel = tensors["numel"].to_numpy(dtype=float)
    opt_b = np.where(tensors["muon"].to_numpy(dtype=bool), MUON_STATE_BYTES_PER_PARAM,
                     optimizer_state_bytes("adamw"))
    w = np.stack([numel * float(master_bytes_per_param), numel * opt_b], axis=1)
    per_rank = _ping_pong_rank_sums(numel, stage, P, dp, w)  # (P, dp, 2)
    busiest = per_rank.sum(axis=2).argmax(axis=1)
    held = per_rank[np.arange(P), busiest]  # (P, 2)
    total = per_rank.sum(axis=1)
    shares = np.where(total > 0, held / np.where(total > 0, total, 1.0), 1.0 / dp)
    return shares[:, 0], shares[:, 1]


def model_param_tensors(g, src_layer_ids: np.ndarray, stage_of_full_layer: np.ndarray,
                        tens: pd.DataFrame | None = None) -> tuple[pd.DataFrame, np.ndarray]:
    """The whole model's optimizer tensors in order (training_graph.optimizer_param_tensors of the costed graph, a
    short graph's repeated block once per layer it stands for: ``src_layer_ids`` each full layer's graph layer) and
    each one's pipeline stage (``stage_of_full_layer``). ``tens``: the graph's optimizer_param_tensors if known."""
    tens = optimizer_param_tensors(g) if tens is None else tens
    if not len(tens) and g.meta.get("param_count"):
        raise ValueError("model_param_tensors: no optimizer tensors (a graph without its rows: pass the view's "
                         "muon_tensors)")
    lay = tens["layer"].to_numpy(dtype=np.int64)
    order = np.argsort(lay, kind="stable")  # each graph layer's rows, in the graph's order within it
    keys, first, n_rows = np.unique(lay[order], return_index=True, return_counts=True)
    if not len(keys):
        return tens.iloc[:0], np.zeros(0, dtype=np.int64)
    src = np.asarray(src_layer_ids, dtype=np.int64)
    k = np.minimum(np.searchsorted(keys, src), len(keys) - 1)
    hit = keys[k] == src  # full layers whose graph layer holds parameters
    k, st = k[hit], np.asarray(stage_of_full_layer, dtype=np.int64)[hit]
    reps = n_rows[k]
    if not reps.sum():
        return tens.iloc[:0], np.zeros(0, dtype=np.int64)
    # each full layer's rows: its graph layer's run of ``order``, concatenated in the full layers' order
    start = np.repeat(first[k] - np.r_[0, np.cumsum(reps)[:-1]], reps) + np.arange(reps.sum())
    return tens.iloc[order[start]].reset_index(drop=True), np.repeat(st, reps)


def dp_reduce_op(framework: str, zero: int, bf16_optimizer: bool = False) -> str:
    """The collective of the data-parallel gradient reduction below ZeRO-3: "reduce_scatter" for a distributed
    optimizer (ZeRO-1/2) except DeepSpeed's, else "all_reduce".

    DeepSpeed 0.19.8 (``megatron-deepspeed``) all-reduces at every stage below 3. ``BF16_Optimizer``:
    ``allreduce_bucket`` (``runtime/engine.py`` l. 3795-3821, ``dist.all_reduce``). The ZeRO-1/2 optimizer
    (``runtime/zero/stage_1_and_2.py``): ``average_tensor`` (l. 1590-1720) with its ``reduce_scatter`` config on
    (``zero/config.py`` l. 108, default True) puts every partition's slice of a bucket under the key
    ``("allreduce", process_group)`` when ``use_multi_rank_bucket_allreduce`` is on (l. 119, default True; l. 1693-1697),
    and ``allreduce_and_scatter`` -> ``allreduce_and_copy_with_multiple_ranks`` -> ``allreduce_bucket`` (l. 1516-1588,
    2359-2392, ``rank=None``) all-reduces the whole bucket (up to ``reduce_bucket_size``, 5e8 elements, l. 113;
    ``reduce_ipg_grads`` l. 2205-2231), each rank then keeping its partition's slice; ``reduce_scatter: false``
    all-reduces too (``gradient_reduction_w_predivide``, l. 1485-1514) and ``use_multi_rank_bucket_allreduce: false``
    issues one ``dist.reduce`` per destination rank (l. 2385-2387), neither a reduce-scatter. Until stop 44 the ZeRO-1/2
    optimizer was costed with a reduce-scatter (half the all-reduce's bytes on a ring)."""
    if framework == "megatron-deepspeed" or bf16_optimizer:
        return "all_reduce"
    return "reduce_scatter" if int(zero) >= 1 else "all_reduce"


#: ``DistributedOptions.deepspeed_clear_lp_grads``: what ``BF16_Optimizer.clear_lp_grads`` does before each backward,
#: "zero" (DeepSpeed 0.19.8, ``bf16_optimizer.py`` l. 612-623) or "set_to_none" (DeepSpeed 0.6.5, l. 445-448)
DEEPSPEED_CLEAR_LP_GRADS = ("zero", "set_to_none")


def checked_clear_lp_grads(value: str) -> str:
    """``DistributedOptions.deepspeed_clear_lp_grads`` checked (ValueError naming the choices)."""
    if value not in DEEPSPEED_CLEAR_LP_GRADS:
        raise ValueError(f"deepspeed_clear_lp_grads must be one of {', '.join(DEEPSPEED_CLEAR_LP_GRADS)} "
                         f"(DeepSpeed 0.19.8's zeroing / 0.6.5's param.grad = None), got {value!r}")
    return value


#: bytes per parameter of the bf16 ``param.grad`` passes ``BF16_Optimizer`` runs each micro-batch after a step's first
#: (DeepSpeed 0.19.8): ``clear_lp_grads`` zeroes the bf16 gradients before every backward (``torch._foreach_zero_``,
#: ``bf16_optimizer.py`` l. 612-623; called by the pipeline engine, ``runtime/pipe/engine.py`` l. 838-840, and by
#: ``backward_prologue``, l. 500-501), writing 2 B, rather than freeing them, so autograd's AccumulateGrad adds each
#: new weight gradient into the zeroed one in place (read 2 + 2, write 2) instead of taking the GEMM's output. The
#: step's ``zero_grad`` (``engine.py`` l. 3521-3526 -> ``bf16_optimizer.py`` l. 625-627, ``set_to_none=True``) frees
#: them, so the first micro-batch of a step has neither pass (``clear_lp_grads`` skips ``None`` gradients).
BF16_OPTIMIZER_LP_GRAD_BYTES_PER_PARAM = 2.0 + 3 * 2.0


def bf16_optimizer_lp_grad_bytes(framework: str, dtype: str, grad_accum_dtype: str | None = None,
                                 zero: int = 1, clear_lp_grads: str = "zero") -> float:
    """Bytes per parameter, per micro-batch after a step's first, of ``BF16_Optimizer``'s bf16 ``param.grad`` zeroing
    and autograd's in-place accumulation into it (:data:`BF16_OPTIMIZER_LP_GRAD_BYTES_PER_PARAM`), on top of
    :func:`grad_accumulation_bytes`' copy into its accumulation buffer; 0 where it does not run (until stop 44 these
    passes were not costed), and 0 with ``clear_lp_grads`` "set_to_none": DeepSpeed 0.6.5's ``clear_lp_grads``
    (``bf16_optimizer.py`` l. 445-448) sets ``param.grad = None`` before each backward (``pipe/engine.py`` l. 768),
    so every micro-batch's weight gradient is the GEMM's output, neither zeroed nor added into."""
    if deepspeed_bf16_optimizer_accum(framework, dtype, zero, grad_accum_dtype) is None:
        return 0.0
    if checked_clear_lp_grads(clear_lp_grads) == "set_to_none":
        return 0.0
    return BF16_OPTIMIZER_LP_GRAD_BYTES_PER_PARAM


def bf16_optimizer_step_bytes(accum: str, dp: int, clip_grad: bool = True) -> tuple[float, float]:
    """(bytes per parameter of the stage's whole gradient, bytes per parameter of the rank's 1/dp partition) that
    DeepSpeed 0.19.8's ``BF16_Optimizer`` moves once per step beyond the graph's optimizer rows (gradient clipping,
    12 B, and the mixed-precision AdamW step, 32 B, both sharded over the DP group, ``featurize/training_graph.py``),
    with an accumulation buffer in ``accum`` ("fp32" / "bf16"):

    - the DP reduction (pipeline engine ``_bf16_reduce_grads`` -> ``buffered_allreduce_fallback`` ->
      ``allreduce_bucket``, ``engine.py`` l. 3795-3821, on the flat accumulation buffer): with fp32 it casts the buffer
      to the bf16 ``communication_data_type`` (read 4, write 2), post-scales the reduced bf16 tensor by 1 / dp
      (``mul_``, read 2, write 2, only when dp != ``gradient_predivide_factor`` 1.0) and copies it back into the fp32
      buffer (read 2, write 4): 16 B (12 at dp 1, where the casts still run); with bf16 only the scale, 4 B (0 at dp 1);
    - ``step`` (``bf16_optimizer.py`` l. 384-433): the gradient norm over every gradient of the stage, not the
      partition (``get_grads_for_norm``, l. 547-591; ``get_global_norm_of_tensors``, ``utils.py`` l. 946-953,
      ``tensor.float().norm()``: read 4 B, or a bf16 buffer's fp32 copy and its read, 2 + 4 + 4 B), always computed;
      with clipping the whole gradient scaled in place (``clip_tensors_by_global_norm``, ``utils.py`` l. 974-991:
      8 B fp32, 4 B bf16), replacing the graph's clipping row, which the scheduler shards over dp (-12 B on the
      partition); a bf16 buffer's partition cast to fp32 for the optimizer (l. 414-418: read 2, write 4 on the
      partition); the step itself on the fp32 partition (28 B) and ``update_lp_params``' copy of it into the bf16
      weights (l. 593-597: read 4, write 2), 34 B against the graph row's 32;
    - the accumulation buffer zeroed twice, by ``clear_hp_grads`` at the end of ``step`` (l. 433, 605-610) and again by
      the engine's ``zero_grad`` (``engine.py`` l. 3521-3526 -> l. 625-627): 2 x 4 B fp32, 2 x 2 B bf16.

    The clipping scale is an upper bound: DeepSpeed multiplies only when the norm is above ``max_norm``
    (``clip_coef < 1``, ``utils.py`` l. 987-990); it is charged every step (clipping active).

    Not modelled: ``allreduce_no_retain`` (``engine.py`` l. 3828-3839) gathers the flat buffers (one per optimizer
    parameter group, ``bf16_optimizer.py`` l. 190-196) into buckets until one passes 5e8 elements; a bucket of several
    buffers is flattened into a new tensor (``allreduce_bucket`` l. 3796, a cat) and copied back
    (``allreduce_and_copy`` l. 3823-3826): +2 x (4 + 4) B/param fp32, 2 x (2 + 2) bf16 over those buffers, once per
    step. A bucket of one buffer costs nothing (torch ``_flatten_dense_tensors`` of one tensor is a view, and
    ``copy_`` of a tensor onto its own data returns at once). With Megatron-DeepSpeed's weight-decay and no-decay
    groups (its ``megatron/optimizer`` source is not at hand to confirm their number and order) it applies to a stage
    whose weight-decay buffer holds at most 5e8 elements; BLOOM-176B's stages (~3.7e9) do not."""
    parts = bf16_optimizer_step_parts(accum, dp, clip_grad)
    # (every term a whole number of bytes: the sums are exact in any order)
    return sum(w for w, _ in parts.values()), sum(p for _, p in parts.values())


def bf16_optimizer_norm_clip_bytes(accum: str, clip_grad: bool = True) -> tuple[float, float]:
    """(the norm's, the clipping's) bytes per parameter of the whole gradient that DeepSpeed's ``BF16_Optimizer`` moves
    in its ``clip_grad_norm`` part (:func:`bf16_optimizer_step_bytes`): the norm reads 4 B (fp32) or casts and reads
    2 + 4 + 4 B (bf16), the clipping scales 8 B (fp32) or 4 B (bf16), 0 without clipping."""
    acc4 = accum == "fp32"
    return (4.0 if acc4 else 10.0), ((8.0 if acc4 else 4.0) if clip_grad else 0.0)


def bf16_optimizer_step_parts(accum: str, dp: int, clip_grad: bool = True) -> dict[str, tuple[float, float]]:
    """:func:`bf16_optimizer_step_bytes` by the ``per_op`` part it adds to (name -> (bytes per parameter of the stage's
    whole gradient, of the rank's partition)): ``grad_buffer`` the casts and scale around the DP all-reduce and the
    buffer zeroed twice, ``clip_grad_norm`` the norm and clipping over the whole gradient less the graph's clipping row
    (which the scheduler shards), ``optimizer_step`` the step's bytes beyond the graph's row (``update_lp_params``' copy,
    a bf16 buffer's partition cast)."""
    acc4 = accum == "fp32"
    multi = int(dp) > 1
    reduce_b = (12.0 + (4.0 if multi else 0.0)) if acc4 else (4.0 if multi else 0.0)
    norm_b, clip_b = bf16_optimizer_norm_clip_bytes(accum, clip_grad)
    zero_b = 2 * (4.0 if acc4 else 2.0)
    return {"grad_buffer": (reduce_b + zero_b, 0.0),
            "clip_grad_norm": (norm_b + clip_b, -(CLIP_BYTES_PER_PARAM if clip_grad else 0.0)),
            "optimizer_step": (0.0, (34.0 - 32.0) + (0.0 if acc4 else 6.0))}


def tied_copy_params_by_chunk(tied_output_params: float, pp: int, n_chunks: int) -> np.ndarray:
    """Parameters per model chunk (one TP rank) of the output layer's copy of a tied word embedding: with a pipeline
    (``pp`` > 1) the last stage holds its own (padded vocab / tp) x hidden weight for the output layer, on its last
    model chunk (the last chunk overall under interleaving), a real parameter with its gradient and optimizer state;
    without one the head uses the embedding's weight (zeros).

    Megatron-LM / Megatron-Core: ``LanguageModule.setup_embeddings_and_output_layer`` (megatron/core/models/common/
    language_module/language_module.py) allocates ``output_layer.weight`` on the last stage, zeroes it and all-reduces
    it from the first stage's embedding over the embedding group; ``shared_embedding_or_output_weight`` returns it there.
    Its ``theoretical_memory_usage.py`` counts ``embedding_size`` on the most loaded shard for that reason (a second
    one only when untied with pp == 1). DeepSpeed's ``PipelineModule`` builds a ``TiedLayerSpec`` on every stage that
    uses it (Megatron-DeepSpeed's ``GPTModelPipe``: ``EmbeddingPipe`` tied as ``embed`` on the first and last stage)."""
    out = np.zeros(int(n_chunks))
    if pp > 1 and tied_output_params > 0:
        out[-1] = float(tied_output_params)
    return out


def tied_grad_bytes(framework: str, dtype: str, grad_accum_dtype: str | None = None, zero: int = 1) -> int:
    """Bytes per element of the tied embedding's gradient that the first and last stage all-reduce.

    - Megatron-LM / Megatron-Core: ``_allreduce_word_embedding_grads`` (megatron/core/distributed/finalize_model_grads.py)
      all-reduces the weight's ``main_grad``: fp32 under bf16 (``--accumulate-allreduce-grads-in-fp32``), else the
      parameter's dtype (:func:`_grad_bytes`);
    - DeepSpeed's pipeline engine (``PipelineEngine._exec_reduce_tied_grads``): ``weight._hp_grad`` (fp32) under its
      ``BF16_Optimizer``, else ``weight.grad`` (fp16 / fp32; bf16 under its ZeRO-1 optimizer, ``grad_accum_dtype``
      "bf16": DeepSpeed 0.19.8 ``runtime/pipe/engine.py`` l. 283); ``_hp_grad`` is in ``BF16_Optimizer``'s
      accumulation dtype (``stage_memory.deepspeed_bf16_optimizer_accum``: bf16 at ZeRO-0 by default in 0.19.8), and
      no ``BF16_Optimizer`` runs at ZeRO-2/3;
    - PyTorch (``hf``): AMP's fp32 ``.grad``.

    Under Megatron ``grad_accum_dtype`` is the main-gradient buffer's dtype (bf16: ``--grad-reduce-in-bf16``)."""
    if framework == "megatron-deepspeed":
        acc = deepspeed_bf16_optimizer_accum(framework, dtype, zero, grad_accum_dtype)
        return DTYPE_BYTES[dtype] if acc is None else DTYPE_BYTES[acc]
    return _grad_bytes(framework, dtype, grad_accum_dtype if framework == "megatron" else None)


def tied_grads_before_dp(framework: str) -> bool:
    """Whether the tied embedding's all-reduce runs before the data-parallel gradient reduction (DeepSpeed's
    ``TrainSchedule`` issues ``ReduceTiedGrads`` then ``ReduceGrads``) or after it (Megatron-Core's
    ``finalize_model_grads``: ``finish_grad_sync`` of every chunk, then ``_allreduce_embedding_grads``; PyTorch: after
    DDP's reduction, in the training loop)."""
    return framework == "megatron-deepspeed"


def tied_grad_sync_ms(end_ms: np.ndarray, allreduce_ms: float) -> tuple[np.ndarray, float]:
    """(each stage's end, the all-reduce's start) after the tied embedding's gradient all-reduce between the first and
    the last stage: a 2-rank collective is a barrier, so it starts when the later of the two is there and both end
    ``allreduce_ms`` later; the other stages are not in the group."""
    out = np.array(end_ms, dtype=float, copy=True)
    start = float(max(out[0], out[-1]))
    out[0] = out[-1] = start + float(allreduce_ms)
    return out, start


#: the share of a clipping row's bytes (featurize/training_graph.py CLIP_BYTES_PER_PARAM: the norm reads the fp32
#: gradient once, 4 B; the clipping multiplies it in place, read and write 4 B each) that the local norm moves: the part
#: of clip_grad_norm a stage runs before the norm's all-reduce
CLIP_NORM_SHARE = 4.0 / CLIP_BYTES_PER_PARAM
#: the 4-byte fp32 scalar each all-reduce of :func:`optimizer_barriers` sends (the squared norm, the found-inf flag)
GRAD_STATS_BYTES = 4.0


def optimizer_barriers(framework: str, dtype: str, clip_grad: bool, bf16_opt: bool, pp: int,
                       optimizer: str | None = "adamw") -> tuple[str, ...]:
    """The all-reduces over the pipeline's stages the optimizer step waits for, in the order it runs them: each is a
    barrier (no stage goes on before every stage has sent its scalar), so no stage clips or steps before the last
    stage to finish its backward (and its DP sync) has reached it. None without a pipeline (the ranks of one stage's
    groups do the same work) or an optimizer.

    - ``"found_inf"``: fp16's loss-scale check under megatron (megatron-core 0.16.1 optimizer/optimizer.py l. 511-519:
      ``all_reduce(found_inf, MAX, group=get_grad_stats_parallel_group())`` and ``.item()`` in prepare_grads, before
      the clipping) and megatron-deepspeed (DeepSpeed 0.19.8 runtime/utils.py l. 297-321 ``has_overflow``, over
      ``mpu.get_model_parallel_group()``; zero/stage_1_and_2.py l. 3237-3246 likewise).
    - ``"grad_norm"``: clipping by the global norm. Megatron-Core ``clip_grad_norm`` -> ``get_grad_norm_fp32``
      (optimizer/optimizer.py l. 203-219, 606-607; clip_grads.py l. 96-127: ``all_reduce(total_norm, SUM,
      group=grad_stats_parallel_group)`` then ``.item()``), the group the model-parallel one (tp x pp) or, under the
      distributed optimizer, every rank of the instance (optimizer/__init__.py l. 446-466), the default
      ``clip_grad`` 1.0 (optimizer_config.py l. 331). DeepSpeed's BF16_Optimizer takes the norm every step, with or
      without clipping (bf16_optimizer.py l. 389-391), and ``get_global_norm_of_tensors`` all-reduces it over
      ``mpu.get_model_parallel_group()`` (utils.py l. 956-959), the pipeline grid's pipe x model ranks
      (pipe/topology.py l. 298-315, 452-453); its fp16 optimizers clip by the same global norm. hf: a pipeline runs
      torch.distributed.pipelining, whose clipping in torchtitan 0.3.0 (distributed/utils.py l. 599-672
      ``clip_grad_norm_(..., pp_mesh)``) all-reduces the norm over the pipeline mesh; torch's own
      ``clip_grad_norm_`` over one stage's parameters would clip by that stage's norm alone."""
    if int(pp) <= 1 or not optimizer or optimizer == "none":
        return ()
    out = []
    if dtype == "fp16" and framework in ("megatron", "megatron-deepspeed"):
        out.append("found_inf")
    if clip_grad or bf16_opt:
        out.append("grad_norm")
    return tuple(out)


def grad_stats_group_layout(framework: str, dist_opt: bool, lay: Mapping[str, GroupLayout], gpus: int,
                            gpus_per_node: int) -> GroupLayout:
    """Where the group of :func:`optimizer_barriers`' all-reduces sits: under megatron's distributed optimizer
    (``dist_opt``) every rank (the optimizer instance, megatron-core 0.16.1 optimizer/__init__.py l. 446-459),
    otherwise the model-parallel ranks, tp x pp (megatron's ``model_parallel_group``, DeepSpeed's pipe x model grid,
    torchtitan's pipeline mesh with each stage's TP norm): each TP group's members of a node times the pipeline
    group's (``lay``'s "tp" and "pp" layouts), the nodes that many per node take."""
    if framework == "megatron" and dist_opt:
        return group_layout(int(gpus), 1, int(gpus_per_node), int(gpus))
    size = lay["tp"].size * lay["pp"].size
    per = min(lay["tp"].gpus_per_node * lay["pp"].gpus_per_node, size)
    return GroupLayout(size, per, -(-size // per)) if size > 1 else GroupLayout(1, 1, 1)


def optimizer_segments(opt_parts: Mapping[str, np.ndarray], opt_stage: np.ndarray, barriers: tuple[str, ...],
                       norm_share: float) -> tuple[list[list[tuple[str, np.ndarray]]], list[np.ndarray]]:
    """The optimizer phase of each stage cut at ``barriers`` (:func:`optimizer_barriers`): (per segment, ("op_class|part",
    ms per stage) of :func:`sharded_optimizer_parts`' ``opt_parts`` in :data:`OPTIMIZER_TRACE_ORDER` (any other after
    them); per segment, its ms per stage). Before the found-inf check: the main gradients' cast, a DeepSpeed buffer's
    passes and the unscaling; before the norm's all-reduce: the local norm, ``norm_share`` of the clip_grad_norm part;
    after the last barrier the clipping's scale, the step and the casts after it. The last segment's ms are
    ``opt_stage`` less the others', so per stage the segments add up to ``opt_stage``. Without barriers one segment,
    the whole phase (``opt_stage``)."""
    order = [k for k in OPTIMIZER_TRACE_ORDER if k in opt_parts] + [k for k in opt_parts if k not in OPTIMIZER_TRACE_ORDER]
    ms = {k: np.asarray(opt_parts[k][0], dtype=float) for k in order}
    total = np.asarray(opt_stage, dtype=float)
    if not barriers:
        return [[(k, ms[k]) for k in order]], [total]
    pre_keys = ("optimizer|main_grad_cast", "optimizer|grad_buffer", "optimizer|loss_scaling")
    clip_key = "optimizer|clip_grad_norm"
    pre = [(k, ms[k]) for k in order if k in pre_keys]
    norm = [(clip_key, ms[clip_key] * norm_share)] if clip_key in ms else []
    post = ([(clip_key, ms[clip_key] * (1.0 - norm_share))] if clip_key in ms else []) + \
        [(k, ms[k]) for k in order if k not in pre_keys and k != clip_key]
    if "found_inf" in barriers and "grad_norm" in barriers:
        segs = [pre, norm, post]
    elif "found_inf" in barriers:
        segs = [pre, norm + post]
    else:
        segs = [pre + norm, post]
    seg_ms = [sum((m for _, m in sg), np.zeros_like(total)) for sg in segs[:-1]]
    return segs, seg_ms + [total - sum(seg_ms, np.zeros_like(total))]


def barrier_optimizer_ms(finish: np.ndarray, seg_ms: list[np.ndarray],
                         barrier_ms: list[float]) -> tuple[np.ndarray, list[np.ndarray], list[tuple[float, float]]]:
    """(each stage's end of its optimizer phase, each segment's start per stage, each barrier's (start, end)) of an
    optimizer phase of segments ``seg_ms`` (ms per stage) that starts at ``finish`` (each stage's end of its backward
    and gradient sync) with an all-reduce of ``barrier_ms[i]`` between segments i and i + 1: a barrier starts when the
    last stage reaches it and every stage goes on when it ends. One segment: ``finish + seg_ms[0]``."""
    t = np.asarray(finish, dtype=float)
    starts, spans = [], []
    for i, m in enumerate(seg_ms):
        starts.append(t)
        t = t + m
        if i < len(seg_ms) - 1:
            a = float(t.max())
            spans.append((a, a + float(barrier_ms[i])))
            t = np.full_like(t, a + float(barrier_ms[i]))
    return t, starts, spans


def collective_model():
    from wattcast.models.collectives import load_collective_model

    return load_collective_model()


def collective_ms(model, op, size_bytes, layout: GroupLayout, cluster: ClusterSpec) -> tuple[np.ndarray, np.ndarray]:
    """(ms, ood) of collectives ``op`` of ``size_bytes`` (arrays) over a group placed as ``layout``; with the node's
    GPUs that send across nodes at once (``layout.concurrent``: the other groups of the kind beside this one) sharing
    its NICs (models/collectives.py ``concurrent_per_node``)."""
    op = np.atleast_1d(np.asarray(op, dtype=object))
    size = np.atleast_1d(np.asarray(size_bytes, dtype=float))
    if layout.size <= 1:
        return np.zeros(len(size)), np.zeros(len(size), dtype=bool)
    # the group alone passes nothing (any model with predict_us_memo's five arguments still serves it)
    conc = {} if layout.concurrent is None else dict(concurrent_per_node=layout.concurrent)
    kinds = list(dict.fromkeys(op.tolist()))  # first-seen order, as pd.unique (a search calls this thousands of times)
    if len(kinds) == 1:
        u, f = model.predict_us_memo(kinds[0], size, layout.size, layout.gpus_per_node, cluster, **conc)
        return np.asarray(u, dtype=float) / 1e3, np.asarray(f, dtype=bool)
    us = np.zeros(len(size))
    ood = np.zeros(len(size), dtype=bool)
    for o in kinds:
        sel = op == o
        u, f = model.predict_us_memo(o, size[sel], layout.size, layout.gpus_per_node, cluster, **conc)
        us[sel] = np.asarray(u, dtype=float)
        ood[sel] = np.asarray(f, dtype=bool)
    return us / 1e3, ood


#: costed rank graphs by (identities of graph, device, models, cluster; group placements; host and power
#: settings); each entry holds the objects whose ids it uses, so no id is reused while it lives. Least recently used
#: out, once the costed graphs hold more than ``featurize.graph_cache.GRAPH_CACHE_ROWS`` kernel rows (a whole
#: 36-layer gpt-oss-120b graph has 156,000: ~150 MB with its costed frame) or there are more than ``_COSTED_MAX``
_COSTED_MAX = 1024  # a GPT-3 search over TP, SP, CP, micro-batch and recomputation has 140 rank graphs
_COSTED = RowsCache(max_entries=_COSTED_MAX)


def model_config(model) -> HFConfig | None:
    """The Hugging Face config behind ``model`` (a config file, dict or built-in name), else None (ONNX, torch)."""
    if isinstance(model, Mapping) or (isinstance(model, (str, Path)) and not is_onnx_path(model)):
        return load_hf_config(model)
    return None


def graph_model_layers(model, seq: int) -> int:
    """Transformer layers of a model without a config (an ONNX file, a torch module): its training graph's
    ``meta["n_layers"]`` (1 when it names none), as :func:`schedule_context` counts them (the layer assignment is the
    import's, whatever the step's dtype or optimizer); the probe runs one sequence of ``seq`` tokens, an ONNX file with
    fixed dims its own batch. What a search gives ``resolve_parallel`` and the pipeline's default stage counts."""
    opts = StepOptions(batch=None if is_onnx_path(model) else 1, seq=seq, mode="train")
    return int(step_graph(model, opts).meta.get("n_layers", 1))


#: global tokens of one step (batch x seq) a prediction takes: int64, what tables and JSON readers hold
MAX_GLOBAL_TOKENS = 2**63 - 1


def _require_dtype(spec: DeviceSpec, dtype: str) -> None:
    """BF16 needs a BF16 peak, an FP8 recipe FP8 tensor cores: a spec without the field is refused, naming it."""
    why = unsupported_step_dtype(spec, dtype)
    if why:
        raise ParallelConfigError(why)


def _require_fp8_recipe(spec: DeviceSpec, recipe, graph_dtype: str) -> str | None:
    """The step's FP8 recipe (featurize/workload.py fp8_recipe_option), or a ParallelConfigError: a recipe under
    another dtype, an unknown one, or one ``spec`` cannot run (featurize/fp8_recipes.py unsupported_fp8_recipe)."""
    try:
        recipe = fp8_recipe_option(recipe, graph_dtype)
    except GraphError as e:
        raise ParallelConfigError(str(e)) from None
    why = recipe and unsupported_fp8_recipe(spec, recipe)
    if why:
        raise ParallelConfigError(why)
    return recipe


def _count(v, label: str) -> int:
    """``v`` as an int if it is a positive whole number (Python or numpy integer, not a bool), else a
    ParallelConfigError naming ``label``."""
    if is_count(v):
        return int(v)
    raise ParallelConfigError(f"{label} must be a positive integer, got {v!r}")


def predict_distributed(model, cluster: str | ClusterSpec, parallel: ParallelConfig | None = None,
                        options: DistributedOptions | None = None, *, gpus=MISSING, **keywords) -> DistributedPrediction:
    """One training step of ``model`` on ``cluster`` under the strategy ``parallel`` (its ``gpus`` GPUs), with the
    step's settings in ``options`` (:class:`~wattcast.simulate.options.DistributedOptions`: batch, seq, dtype,
    attention, framework, ...); see the module docstring. ``options.comm_split``: also price each class of
    communication alone (``exposed_comm_split_ms``; a search leaves it out for speed). ``options.prune_oom``: memory
    first; a strategy that does not fit is returned without simulating its step (times, MFU and energy NaN,
    ``meta["scheduled"]`` False: what a search does). ``options.exact_pipeline`` False: the pipeline is timed in closed
    form where that is exact (:mod:`wattcast.simulate.pipeline_fast`), else by the event-driven scheduler.

    The old keyword form ``predict_distributed(model, cluster, gpus=, batch=, seq=, parallel=, dtype=, ...)`` still
    works: its keywords build the options object (``options_from_keywords``)."""
    parallel, options = options_from_keywords("predict_distributed", parallel, options, gpus, keywords)
    return schedule_step(schedule_context(model, cluster, parallel, options))


def schedule_context(model, cluster: str | ClusterSpec, parallel: ParallelConfig | None = None,
                     options: DistributedOptions | None = None, *, gpus=MISSING, **keywords) -> "ScheduleContext":
    """:func:`predict_distributed`'s checks, rank graph and costing: the :class:`ScheduleContext` of one step (same
    arguments, either form)."""
    parallel, dopts = options_from_keywords("schedule_context", parallel, options, gpus, keywords)
    batch, seq, dtype, attention, device = dopts.batch, dopts.seq, dopts.dtype, dopts.attention, dopts.device
    trace, power_limit_w, power_model = dopts.trace, dopts.power_limit_w, dopts.power_model
    # names and counts first: every table lookup and rule below takes them as given
    framework = canonical_framework(dopts.framework)  # case-insensitive; an unknown one is a GraphError naming it
    dtype = checked_dtype(dtype)  # BF16, bfloat16, half ... as the single-device path takes them
    graph_dtype = dtype
    if dtype == "fp8":
        # Transformer Engine's recipe: the graph holds FP8 GEMMs; weights, activations, gradients and the
        # communication they need are bf16 (the casts are kernels in the graph), and MFU is quoted against the bf16
        # dense peak (Megatron-LM / NeMo's convention)
        graph_dtype, dtype = "fp8", "bf16"
    seq = _count(seq, "--seq (tokens per sequence)")
    if is_count(batch):
        batch = int(batch)  # the rules below check it; a numpy integer must not wrap around in batch x seq
        if batch * seq > MAX_GLOBAL_TOKENS:
            raise ParallelConfigError(f"global batch x seq = {batch:,} x {seq:,} = {batch * seq:,} tokens in one step is "
                                      f"beyond what wattcast models (2^63 - 1); use a smaller --batch")
    # the device (if given) is resolved first: it names the GPU of a cluster file that has none (ASTRA-sim)
    spec = device if isinstance(device, DeviceSpec) or device is None else resolve_device(device)
    cl = resolve_cluster(cluster, device=spec.name if spec is not None else None)
    spec = spec or resolve_device(cl.device)
    par = parallel
    hf = model_config(model)
    resolved = step_dtype(dopts.dtype, spec)
    if resolved is not dopts.dtype:  # the default bf16 on a GPU without BF16
        graph_dtype = dtype = resolved
    # the layer-count probe runs one sequence; an ONNX file with fixed dims keeps its own batch instead
    _require_dtype(spec, graph_dtype)
    fp8_recipe = _require_fp8_recipe(spec, dopts.fp8_recipe, graph_dtype)
    opts0 = StepOptions(batch=None if is_onnx_path(model) else 1, seq=seq, mode="train", dtype=graph_dtype,
                        attention=attention, compile=dopts.compile, optimizer=dopts.optimizer,
                        optimizer_impl=dopts.optimizer_impl, recompute=par.recompute,
                        framework=framework, loop_trip_count=_hashable_trips(dopts.loop_trip_count),
                        mtp_layers=dopts.mtp_num_layers, cross_entropy_loss_fusion=dopts.cross_entropy_loss_fusion,
                        cross_entropy_fusion_impl=dopts.cross_entropy_fusion_impl, fp8_recipe=fp8_recipe,
                        fp8_transpose=fp8_writes_transpose(spec), te_attention_backend=te_attention_backend(spec))
    # layers: from the config, else from a single-device graph
    n_layers = hf.total_layers if hf is not None else int(step_graph(model, opts0).meta.get("n_layers", 1))
    par = resolve_parallel(par, batch=batch, n_layers=n_layers, n_heads=hf.n_heads if hf else None,
                           n_kv_heads=hf.n_kv_heads if hf else None, ffn=hf.ffn if hf else None,
                           n_experts=hf.n_experts if hf else None, seq=seq, cluster=cl,
                           uneven_stages=framework == "megatron-deepspeed", framework=framework,
                           moe_token_dispatcher=dopts.moe_token_dispatcher)
    par = check_muon_parallel(par, parallel.overlap_param_gather, framework, dopts.optimizer,
                              dual=par.schedule == "dualpipe")
    mb = int(par.micro_batch)
    if mb * seq > MAX_TOKENS_PER_STEP:
        whole = par.pp == 1 and parallel.micro_batch is None
        raise ParallelConfigError(
            f"micro-batch x seq = {mb:,} x {seq:,} = {mb * seq:,} tokens in one micro-batch is beyond what wattcast costs "
            f"({MAX_TOKENS_PER_STEP:,}); " + ("without pipeline parallelism a replica's whole batch is one micro-batch "
                                              "unless --micro-batch is given" if whole else "use a smaller --micro-batch"))
    lay = layouts(par, cl)
    bundle = dopts.bundle or load_bundle()
    cm = dopts.coll_model or collective_model()
    n_micro = par.n_micro(batch)
    cp_kv_bytes = 0.0
    cp_qkvo_bytes = (0.0, 0.0, 0.0, 0.0)
    if par.cp > 1:
        if hf is None or hf.family in ("bert", "switch"):
            raise ParallelConfigError("--cp (context parallelism) splits the sequence of a causal decoder language model "
                                      "(a GPT, Llama, MPT, ... config); this model is not one")
        if str(attention).lower() not in ("flash", "flash3"):  # flash3: the fa3 class (models/attention.py)
            raise ParallelConfigError("--cp (context parallelism) runs ring attention on fused attention kernels "
                                      "(Transformer Engine / FlashAttention): use --attention flash")
        if any(attention_windows(hf)) and cp_refuses_window(par.cp_comm_type, par.cp, cp_group_sizes(par)[0]):
            raise ParallelConfigError(
                f"this model's attention has a sliding window (window {max(w for w in attention_windows(hf) if w)}): "
                f"under context parallelism Transformer Engine supports it with --cp-comm-type a2a or allgather only, "
                f"not {par.cp_comm_type} (context_parallel.py: \"Context parallelism does not support sliding window "
                f"attention with cp_comm_type\")")
        cp_qkvo_bytes = cp_tensor_bytes(hf, micro_batch=par.micro_batch, seq_rank=seq // par.cp, tp=par.tp,
                                        dtype_bytes=DTYPE_BYTES[dtype])
        # K and V of this rank's share of the sequence, one layer: what each ring step passes on (multi-head latent
        # attention passes its up-projected keys, qk_nope + qk_rope wide, and values, v_head_dim wide, per head)
        cp_kv_bytes = cp_qkvo_bytes[1] + cp_qkvo_bytes[2]
    moe_load = 1.0
    if given_routing({k: getattr(dopts, k) for k in ROUTING_DEFAULTS}):
        if hf is None or not hf.n_experts:
            raise ParallelConfigError("the MoE routing options (--moe-load-imbalance, --moe-expert-capacity-factor, "
                                      "--moe-pad-expert-input-to-capacity) need a mixture-of-experts model")
        try:
            moe_load = moe_load_factor(imbalance=dopts.moe_load_imbalance, capacity_factor=dopts.moe_capacity_factor,
                                       pad_to_capacity=dopts.moe_pad_to_capacity, ep=par.ep)
        except MoERoutingError as e:
            raise ParallelConfigError(str(e)) from None
    opts = replace(opts0, batch=par.micro_batch, tp=par.tp, sp=par.sp, ep=par.ep, cp=par.cp, seq=seq // par.cp,
                   moe_load=moe_load, etp=par.etp,
                   # padding to capacity: every expert runs on its capacity's rows (hf_models.padded_expert_capacity)
                   **(dict(moe_pad_to_capacity=True) if dopts.moe_pad_to_capacity else {}),
                   **(dict(cp_comm=par.cp_comm_type, cp_a2a=cp_group_sizes(par)[0])
                      if par.cp > 1 and par.cp_comm_type != "p2p" else {}))
    dispatcher = moe_dispatcher_option(dopts.moe_token_dispatcher)  # an unknown one: a GraphError naming the choices
    if dispatcher != "alltoall":  # the default leaves the options (and so every cache key) as before
        if hf is None or not hf.n_experts or framework != "megatron":
            raise ParallelConfigError("--moe-token-dispatcher-type is Megatron-Core's MoE layer's: it needs a "
                                      "mixture-of-experts model and --framework megatron")
        opts = replace(opts, moe_token_dispatcher=dispatcher)
    g, n_rep, _, period = _rank_graph(model, hf, opts)

    def coll_fn(kernel, size, group):
        ms = np.zeros(len(size))
        ood = np.zeros(len(size), dtype=bool)
        for grp in pd.unique(group):
            sel = group == grp
            gl = lay.get(grp, lay["tp"])
            m, o = collective_ms(cm, kernel[sel], size[sel], gl, cl)
            ms[sel], ood[sel] = np.maximum(m, collective_host_floor_ms(opts.framework, gl.size, coll_floor)), o
        return ms, ood

    # host_ms: (per-kernel launch, per-iteration[, {TP group size: collective floor}[, ring-step floor[, MoE bare-op
    # cost]]]) overriding the framework's
    if dopts.host_ms is not None and dopts.host_us is not None:
        raise ValueError("host_us sets the per-kernel launch cost that host_ms holds too: give one of them")
    launch_ms, iter_ms, *rest = dopts.host_ms or FRAMEWORK_HOST_MS[opts.framework]
    if dopts.host_ms is None:
        launch_ms = framework_launch_ms(opts.framework, bool(opts.compile), dopts.host_us)
    host_model = FRAMEWORK_HOST_MODEL[opts.framework]
    coll_floor = dict(rest[0]) if rest else None  # None: the framework's (collective_host_floor_ms)
    cp_step_floor_ms = check_cp_step_floor_ms(rest[1] if len(rest) > 1 else FRAMEWORK_CP_STEP_HOST_MS.get(opts.framework, 0.0))
    moe_op_ms = check_moe_op_host_ms(rest[2] if len(rest) > 2 else None)  # None: every node at launch_ms
    # the costed rank graph depends on the graph, the device, the models, the TP/EP group placements and the
    # host and power settings, not on DP, PP or ZeRO: strategies that share those share it (search loops)
    def costed_view(graph, reps: int, period: int) -> tuple:
        pins = (graph, spec, bundle, cm, cl, power_model)  # reps follows from the graph
        key = (tuple(map(id, pins)), lay["tp"], lay["ep"], lay["etp"], lay["tp_ep"], launch_ms, host_model, power_limit_w,
               dopts.clock_cap_mhz,
               None if coll_floor is None else tuple(coll_floor.items()), moe_op_ms)
        hit = _COSTED.get(key)
        if hit is None:
            # the queue runs over the whole step's kernels: a short graph's repeated block as often as it stands for
            node_host_ms = node_launch_ms(graph.nodes, launch_ms, moe_op_ms)
            repeats = _layer_multiplicity(graph.nodes["layer"].to_numpy(), reps, period) if host_model == "queue" else None
            costed = cost_nodes(graph, spec, bundle, collective_ms=coll_fn, launch_overhead_ms=node_host_ms,
                                host_model=host_model, repeats=repeats)
            # the OOD kernels' bands before a power limit stretches time_ms (as predict_graph: about their own time)
            ood_log = ood_kernel_band_log(costed)
            costed = requeued(apply_power(costed, spec, power_model, power_limit_w=power_limit_w,
                                          clock_cap_mhz=dopts.clock_cap_mhz), costed, node_host_ms, host_model, repeats)
            tp_floor = collective_host_floor_ms(opts.framework, lay["tp"].size, coll_floor)
            _COSTED[key] = hit = (pins, costed, _rank_view(graph, costed, spec, reps, period, ood_log=ood_log,
                                                           tp_host_floor_ms=tp_floor),
                                 stream_bandwidth_gbps(spec, bundle))
        return hit

    hit = costed_view(g, n_rep, period)
    keep_view = None
    if par.recompute == "full":
        # Megatron's block recomputation (--recompute-num-layers) mixes recomputed layers with layers that keep their
        # activations: the latter's view, costed on first use (a search's other members of the group may not need it)
        def keep_view():
            g_keep, reps, _, per = _rank_graph(model, hf, replace(opts, recompute="none"))
            return costed_view(g_keep, reps, per)[2]
    # model FLOPs and parameters: the unsharded graph of one micro-batch without recomputation
    # (balanced routing: model FLOPs are the useful ones, whatever a busiest rank or padding adds); in a search, once
    # per micro-batch (the figures are kept, not the graph)
    # (an experts' degree of 1 is the unsharded graph's own, None's: one key, one build for etp None and 1)
    opts1 = replace(opts, tp=1, sp=False, ep=1, cp=1, cp_comm="p2p", cp_a2a=1, seq=seq, recompute="none", moe_load=1.0,
                   moe_pad_to_capacity=False, etp=None if opts.etp == 1 else opts.etp)
    model_totals = pinned(("model_totals", id(model), opts1), lambda: _model_totals(*_rank_graph(model, hf, opts1)))
    return ScheduleContext(model=model, g=g, view=hit[2], keep_view=keep_view, spec=spec, cl=cl, par=par, lay=lay, cm=cm,
                           batch=batch, seq=seq,
                           n_micro=n_micro, n_layers=n_layers, dtype=dtype, opts=opts, trace=trace, iteration_ms=iter_ms,
                           power_limit_w=power_limit_w, model_totals=model_totals,
                           clock_cap_mhz=check_power_settings(power_limit_w, dopts.clock_cap_mhz, spec)[1],
                           stream_gbps=hit[3], power_model=power_model, cp_kv_bytes=cp_kv_bytes,
                           cp_qkvo_bytes=cp_qkvo_bytes, comm_split=dopts.comm_split,
                           prune_oom=dopts.prune_oom, exact_pipeline=dopts.exact_pipeline,
                           split_headroom_gb=checked_headroom_gb(
                               0.0 if dopts.split_headroom_gb is None else dopts.split_headroom_gb,
                               "split_headroom_gb (GB the memory-aware pipeline split keeps free)"),
                           zero3_prefetch=zero3_prefetch(framework, dopts.zero3_prefetch), launch_ms=float(launch_ms),
                           scatter_gather_p2p=scatter_gather_p2p(framework, dopts.scatter_gather_p2p),
                           fsdp_reduce_dtype=checked_fsdp_reduce_dtype(framework, dopts.fsdp_reduce_dtype),
                           grad_accum_dtype=checked_grad_accum_dtype(framework, dopts.grad_accum_dtype),
                           deepspeed_clear_lp_grads=checked_clear_lp_grads(dopts.deepspeed_clear_lp_grads),
                           fp8_param_gather=check_fp8_param_gather(dopts.fp8_param_gather, graph_dtype=graph_dtype,
                                                                   framework=framework, zero=par.zero),
                           coll_floor=coll_floor, cp_step_floor_ms=cp_step_floor_ms, bundle=bundle,
                           data_load_ms=check_load_ms(dopts.data_load_ms),
                           data_workers=resolve_workers(framework, dopts.data_workers),
                           # the spec's own oddities (spec_notes), then the power settings': warnings, the figures
                           # as given
                           notes=(*spec_notes(cl, spec),
                                  *power_setting_notes(*check_power_settings(power_limit_w, dopts.clock_cap_mhz, spec),
                                                       spec),
                                  *fsdp_reduce_dtype_notes(dopts.fsdp_reduce_dtype, framework, par.zero, dtype),
                                  *grad_accum_dtype_notes(checked_grad_accum_dtype(framework, dopts.grad_accum_dtype),
                                                          framework, par.zero, dtype),
                                  # an FP8 step on a generation no FP8 step was measured on (simulate/step_band.py)
                                  *filter(None, [fp8_step_warning(spec, graph_dtype == "fp8")])))


def spec_notes(cl: ClusterSpec, spec: DeviceSpec) -> list[str]:
    """The warnings cluster ``cl`` with GPU ``spec`` gives whatever the strategy: tensor peaks out of their datasheet
    ratios, dense rates and defaulted figures (``spec_notes``), an in-node tier faster than the GPU's own link (``device_link_notes``). A prediction
    carries them in ``meta["warnings"]``, a search once in ``SearchResult.warnings``."""
    return [*device_spec_notes(spec), *device_link_notes(cl, spec)]


def _hashable_trips(v):
    """An ONNX loop trip count as :class:`StepOptions` holds it: a ``{node: count}`` mapping as sorted pairs (the
    step options key caches); a count or None as given (``StepOptions.validated`` checks either)."""
    if isinstance(v, Mapping):
        return tuple(sorted(v.items(), key=lambda kv: str(kv[0])))
    return v


#: families whose transformer blocks are all alike. Their rank graph is built with ``_SHORT_LAYERS`` blocks and
#: the middle block stands for blocks 1 .. L-2 (every per-layer and whole-model sum counts it L-2 times): exact,
#: and L/3 times cheaper to build, which is what makes strategy search fast for 100-layer models. Qwen-MoE configs
#: are alike only when every layer is sparse (or every one dense), gpt-oss configs only when every layer has one
#: attention kind: ``HFConfig.layers_alike``, checked per config. Blocks of these families that are not alike but whose
#: kinds (:func:`_layer_kinds`) repeat with a period P (gpt-oss's default alternates sliding-window and full layers,
#: P = 2; a Qwen-MoE sparse every ``decoder_sparse_step``) take the same shortcut one period at a time: blocks 1 .. P
#: stand for the middle blocks of their kinds (:func:`_periodic_plan`). Gemma 2/3 are always built whole.
_UNIFORM_FAMILIES = ("gpt2", "mpt", "gpt_neox", "bloom", "falcon", "opt", "llama", "gemma", "mixtral", "bert", "qwen3", "phi3",
                     "qwen2_moe", "qwen3_moe", "gpt_oss")
_SHORT_LAYERS = 3


def _rank_graph(model, hf: HFConfig | None, opts: StepOptions) -> tuple:
    """(graph, n_rep, block_params, period): the step graph of ``model``; for uniform configs with more than 4 blocks
    a 3-block graph whose block 1 repeats ``n_rep`` = L-2 times, and the parameters of one block as the
    builder counts them (some, e.g. RMSNorm weights, sit on no kernel node), period 1; for configs whose block kinds
    repeat every ``period`` > 1 blocks, a short graph whose blocks 1 .. period repeat ``n_rep`` times and the
    parameters of one such period (:func:`_periodic_plan`); else the whole graph, 1, 0, 1.
    Inside a :func:`~wattcast.featurize.hf_config.pinned_files` block (a search) each (model, options) is looked up
    once while the block's graphs hold at most ``graph_cache.GRAPH_CACHE_ROWS`` kernel rows (least recently used
    out): the model object is held by the caller for the block, so its id names it."""
    graphs = pinned(("rank_graphs",), RowsCache)  # the block's own (outside one, a new empty cache: no look-up kept)
    return graphs.get_or_build((id(model), opts), lambda: _build_rank_graph(model, hf, opts))


def _build_rank_graph(model, hf: HFConfig | None, opts: StepOptions) -> tuple:
    if (hf is None or hf.family not in _UNIFORM_FAMILIES or hf.n_layers != hf.total_layers
            or hf.n_layers <= _SHORT_LAYERS + 1):
        return step_graph(model, opts), 1, 0, 1
    small = replace(opts, batch=1, seq=8, mode="inference", tp=1, sp=False, ep=1, recompute="none", compile=False)
    if not hf.layers_alike:
        plan = _periodic_plan(_layer_kinds(hf))
        if plan is None:
            return step_graph(model, opts), 1, 0, 1
        built, period, n_rep = plan
        # the parameters of one repeated period: blocks 1 + period .. 2 x period of a graph ending with them
        block_params = (step_graph(model, small, blocks=2 * period + 1).param_count
                        - step_graph(model, small, blocks=period + 1).param_count)
        return step_graph(model, opts, blocks=built), n_rep, block_params, period
    block_params = (step_graph(model, small, blocks=_SHORT_LAYERS).param_count
                    - step_graph(model, small, blocks=_SHORT_LAYERS - 1).param_count)
    return step_graph(model, opts, blocks=_SHORT_LAYERS), hf.n_layers - (_SHORT_LAYERS - 1), block_params, 1


def _layer_kinds(hf: HFConfig) -> tuple:
    """Per decoder block of a :data:`_UNIFORM_FAMILIES` config, what makes its graph differ from another block's (as
    ``HFConfig.layers_alike`` compares them): a sparse or dense MLP, and the attention's sliding window (gpt-oss's
    sliding_attention layers, Qwen2's from max_window_layers on: :func:`attention_windows`)."""
    windows = attention_windows(hf)
    return tuple((hf.moe_layer(i), windows[i]) for i in range(hf.n_layers))


def _periodic_plan(kinds: tuple) -> tuple[int, int, int] | None:
    """(blocks to build, period P, repeats R) of a short graph for blocks whose ``kinds`` repeat every P blocks
    (the smallest such P), None when no short graph is smaller than the whole less one block. The short graph is
    block 0, one period (blocks 1 .. P, each repeated R times: the middle blocks 1 .. R x P of the model) and a tail
    of T blocks (1 <= T <= P) standing for the model's last T blocks, T such that the tail's kinds are theirs:
    L = 1 + R x P + T. Exact as the 3-block graph is: a block's kernels depend on its kind, and on being the first
    or the last block, not on its position otherwise."""
    n = len(kinds)
    for p in range(1, n):
        if all(kinds[i] == kinds[i % p] for i in range(n)):
            break
    else:
        return None
    tail = (n - 2) % p + 1  # (n - 1 - tail) divisible by p
    built = 1 + p + tail
    if n <= built + 1:
        return None
    return built, p, (n - 1 - tail) // p


def _layer_multiplicity(layers: np.ndarray, n_rep: int, period: int = 1) -> np.ndarray:
    """How many blocks of the full model each node of a (short) graph stands for."""
    if n_rep <= 1:
        return np.ones(len(layers), dtype=np.int64)
    return np.where(layers == 1, n_rep, 1) if period == 1 else np.where((layers >= 1) & (layers <= period), n_rep, 1)


def _full_layer_ids(ids: np.ndarray, n_rep: int, period: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(layer ids of the full model in order, index into ``ids`` for each): block 1 of a short graph becomes blocks
    1 .. n_rep, later ids shift by n_rep - 1; with a ``period`` P, block j (1 <= j <= P) becomes blocks j, j + P, ...,
    j + (n_rep - 1) x P, later ids shift by (n_rep - 1) x P."""
    if n_rep <= 1:
        return ids, np.arange(len(ids))
    out, src = [], []
    for j, lid in enumerate(ids.tolist()):
        if 1 <= lid <= period:
            out += range(lid, lid + n_rep * period, period)
            src += [j] * n_rep
        else:
            out.append(lid + ((n_rep - 1) * period if lid > period else 0))
            src.append(j)
    out, src = np.array(out, dtype=np.int64), np.array(src, dtype=np.int64)
    if period > 1:
        order = np.argsort(out, kind="stable")
        out, src = out[order], src[order]
    return out, src



def _model_totals(g1, n_rep: int, block_params: int, period: int = 1) -> dict:
    """Model FLOPs of one micro-batch (optimizer excluded), the hardware FLOPs beyond the model's (the fused attention's
    own recomputation, ``flash_rc_flops``; an eager attention's masked pairs and softmax-side work,
    ``eager_attn_extra_flops``) and the parameter count, from the unsharded graph."""
    hit = _TOTALS.get(id(g1))
    if hit is not None and hit[0] is g1:
        return hit[1]
    nodes = g1.nodes
    flops, flash_rc, eager_extra = model_flops(nodes, _layer_multiplicity(nodes["layer"].to_numpy(), n_rep, period))
    # block_params: the parameters of the repeated block (of one repeated period)
    params = int(g1.meta.get("param_count", 0)) + (n_rep - 1) * int(block_params)
    out = dict(flops=flops, flash_rc_flops=flash_rc, eager_attn_extra_flops=eager_extra, param_count=params)
    _TOTALS[id(g1)] = (g1, out)
    return out


#: model totals by the identity of the graph they were taken from (held by the entry, so its id is not reused)
_TOTALS = RowsCache(max_entries=256)


@dataclass(frozen=True)
class _RankView:
    """A costed rank graph summed per layer (index ``layer_ids``): what scheduling a strategy needs, so that
    strategies sharing the graph never walk its kernels again."""

    layer_ids: np.ndarray
    f_ms: np.ndarray  # forward time of one micro-batch, collectives included
    b_ms: np.ndarray
    opt_ms: np.ndarray
    f_nc_ms: np.ndarray  # the same without collectives
    b_nc_ms: np.ndarray
    coll_ms: np.ndarray
    attn_f_ms: np.ndarray  # fused attention kernels' time (what ring attention's KV exchange overlaps with)
    attn_b_ms: np.ndarray  # the backward's own (not a recomputed forward)
    attn_rc_ms: np.ndarray  # the fused attention's forward re-run in the backward (recomputation: its ring runs again)
    # under a context-parallel KV ring, the diagonal ring step's kernel time of each of the three (0 elsewhere): the
    # one causal s x s step of the ring's per-step kernels (single_device._flash_ms), the others each
    # (attn - diag) / (ring - 1)
    attn_diag_f_ms: np.ndarray
    attn_diag_b_ms: np.ndarray
    attn_diag_rc_ms: np.ndarray
    gemm_f_ms: np.ndarray  # linear layers' GEMMs (what --tp-comm-overlap pipelines the TP collectives with)
    gemm_b_ms: np.ndarray
    coll_by_group: dict  # collective group ("tp", "ep") -> (forward ms, backward ms) per layer
    # the experts' computation (Megatron-Core's MoE "mlp" sub-module: the routed experts with the dispatcher's re-sort
    # around them, and the shared experts) and the dispatch all-to-all's share of the ep collectives (the rest is the combine's): what
    # --overlap-moe-expert-parallel-comm pairs each all-to-all with (simulate.overlap.ep_overlap_layer_ms)
    moe_mlp_f_ms: np.ndarray
    moe_mlp_b_ms: np.ndarray
    a2a_dispatch_f_ms: np.ndarray
    a2a_dispatch_b_ms: np.ndarray
    params: np.ndarray  # parameters held (forward nodes)
    expert_params: np.ndarray
    fp8_params: np.ndarray  # the parameters of FP8 GEMMs (an FP8 recipe keeps their FP8 weight and transpose)
    # energy of one micro-batch's forward and backward without collectives (the step charges communication apart),
    # and their time x compute utilisation at the boost clock (what a collective hidden beside them adds to their
    # power, and a power limit's clock does to their time: simulate.energy.overlap_power)
    e_f_nc_j: np.ndarray
    e_b_nc_j: np.ndarray
    cu_f_ms: np.ndarray
    cu_b_ms: np.ndarray
    e_opt_j: np.ndarray
    opt_cast_ms: np.ndarray  # the optimizer phase's FP8 weight cast (every DP rank casts its whole weights: not sharded)
    e_opt_cast_j: np.ndarray
    act_bytes: np.ndarray  # saved activations of one micro-batch
    # under full recomputation, each transformer layer's full activations (what its backward re-makes; 0 for the
    # embedding, the head and every layer without recomputation): a stage adds its largest (recompute_extra_by_stage)
    full_extra_bytes: np.ndarray
    # each layer's largest forward kernel's working set (memory.transient_bytes_by_layer; the loss's in the head's
    # layer): a stage adds its layers' largest, once (transient_by_stage)
    transient_bytes: np.ndarray
    block_input_bytes: tuple
    phase_ms: dict
    recompute_flops: float
    overheads: dict  # single_device.step_overheads of the whole rank graph (one micro-batch; the optimizer once)
    #: the whole rank graph's forward and backward kernels of one micro-batch per op class (count, time_ms, flops,
    #: launch_gap_ms, parts: single_device.with_op_parts' rows without the optimizer phase); a step's ``per_op`` is
    #: them n_micro times with the optimizer phase as the ranks run it (:func:`step_per_op`)
    per_op_fb: list
    fallback_ops: list
    ood_fraction: float
    # out-of-distribution time per layer (simulate/step_band.py: the step band's OOD term, read for the critical rank):
    # the non-collective OOD kernels' ms in the forward and backward of one micro-batch and in the optimizer step,
    # each also at its band's low and high edge (ms x exp(low_log), ms x exp(high_log)); collectives outside the
    # collective model's support (forward and backward), reported apart
    #: Muon's parameters per layer (training_graph.muon_matrices; None without Muon) and each layer's id in the costed
    #: graph (a short graph's block 1 stands for many): the layer-wise optimizer's split (layer_wise_shares)
    muon_params: np.ndarray = None
    src_layer_ids: np.ndarray = None
    #: the costed graph's optimizer tensors under Muon (training_graph.optimizer_param_tensors; None without Muon), kept
    #: here because a search's schedule context drops the graph's rows (ScheduleContext.without_kernels): until this
    #: field the layer-wise optimizer's split fell back to an even 1 / dp in every search
    muon_tensors: pd.DataFrame = None
    ood_fb_ms: np.ndarray = None
    ood_fb_low_ms: np.ndarray = None
    ood_fb_high_ms: np.ndarray = None
    ood_opt_ms: np.ndarray = None
    ood_opt_low_ms: np.ndarray = None
    ood_opt_high_ms: np.ndarray = None
    ood_coll_ms: np.ndarray = None
    # the backward's weight-gradient kernels (each linear layer's ``.wgrad`` GEMM and ``.bgrad`` bias reduction,
    # featurize/op_graph.py): DualPipe's W, what its zero-bubble steps run apart from the input gradient
    wgrad_ms: np.ndarray = None
    # the backward TP ms the column-parallel linears' asynchronous collectives hide without --tp-comm-overlap
    # (overlap.async_tp_backward_save_ms: dgrad collective beside the wgrad GEMM, SP input all-gather beside dgrad)
    tp_b_async_save_ms: np.ndarray = None
    # per layer (aligned with layer_ids), its dense parameters' sizes (no routed experts: Megatron-Core keeps those in
    # a buffer of their own) in Megatron-Core's registration order (dense_param_sequence): what
    # mcore_ddp_bucket_numels walks to cut the distributed-data-parallel gradient buckets
    dense_param_seq: tuple = None
    #: the optimizer phase's kernels per "op_class|part" (part: single_device.op_part_labels', "" for none, e.g. the FP8
    #: weight casts), each a (4, layers) array: per layer their ms, launch gaps (ms inside the first), kernels and FLOPs,
    #: before ZeRO sharding (:func:`sharded_optimizer_parts` shards them as the step's optimizer time)
    opt_parts: dict = None
    #: the DRAM traffic of the computation a collective runs beside (overlap.hbm_stretch), per layer: key -> a (3,
    #: layers) array of the memory-bound kernels' ms (roofline: bytes / bandwidth above FLOPs / peak), their bytes and
    #: the other kernels' bytes; keys f, b (forward / backward without collectives), gemm_f, gemm_b (linear layers),
    #: mlp_f, mlp_b (the experts' sub-module, as moe_mlp_*)
    hbm: dict = None
    #: the collectives' nccl-tests bytes per group and op: group -> op -> (forward, backward) per layer (what their
    #: DRAM traffic follows from: overlap.collective_hbm_bytes)
    coll_bytes_by_group: dict = None
    #: the TP collectives' ms per layer that Transformer Engine's userbuffers run by a method other than the ring
    #: exchange under --tp-comm-overlap (overlap.UB_METHOD_SMS): the forward reduce-scatters (``pipeline``) and the
    #: backward's input re-gathers and dgrad reduce-scatters (``bulk``); None: none known (all ring exchange)
    tp_pipeline_f_ms: np.ndarray = None
    tp_bulk_b_ms: np.ndarray = None


#: the attention output projection (Megatron-Core's ``linear_proj``) as the graph builders --framework megatron runs
#: name it (featurize/hf_models.py; featurize/workload.py refuses the other families under megatron): the Llama family's
#: ``self_attention.linear_proj`` (l. 1172), GPT-2/GPT-3's ``attn.c_proj`` (l. 190), multi-head latent attention's
#: (DeepSeek-V2/V3) ``self_attn.o_proj`` (l. 1234)
ATTN_OUT_PROJ_NAMES = ("self_attention.linear_proj", "attn.c_proj", "self_attn.o_proj")
#: multi-head latent attention's input projections (featurize/hf_models.py _mla): the first of its query path
#: (``q_a_proj``; ``q_proj`` without ``q_lora_rank``), its key-value down-projection, and the query path's last
MLA_Q_FIRST_NAMES = ("self_attn.q_a_proj", "self_attn.q_proj")
MLA_KV_DOWN_NAMES = ("self_attn.kv_a_proj_with_mqa",)
MLA_Q_LAST_NAMES = ("self_attn.q_b_proj", "self_attn.q_proj")


def _named(names: np.ndarray, roles: tuple) -> np.ndarray:
    """Which graph node names are one of ``roles`` (the name itself or its last dotted components)."""
    return np.logical_or.reduce([(names == r) | np.char.endswith(names, "." + r) for r in roles])


def dense_param_sequence(names: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """One layer's parameter sizes (its forward nodes' ``param_count`` > 0, in graph order) reordered as Megatron-Core
    registers them, which is the order ``module.named_parameters()`` (and so _ParamAndGradBuffer) sees. The graph
    runs an attention's input projections before its output projection (:data:`ATTN_OUT_PROJ_NAMES`, whatever the
    family calls it), but every Megatron-Core attention builds ``linear_proj`` first: ``Attention.__init__``
    (megatron-core 0.16.1 transformer/attention.py l. 349) before ``SelfAttention`` builds ``linear_qkv`` (l. 1267),
    ``MultiLatentAttention.__init__`` (multi_latent_attention.py l. 169) before ``MLASelfAttention`` builds its query
    projections and then its key-value ones (l. 393-483).

    With Transformer Engine (Megatron-LM's default ``--transformer-impl``) a standard attention's input norm is
    ``linear_qkv``'s own ``layer_norm_weight`` (``TELayerNormColumnParallelLinear``; ``input_layernorm`` an IdentityOp):
    its output projection moves to the front of the layer (proj, norm, qkv, norm, fc1, fc2). Multi-head latent
    attention keeps ``input_layernorm`` a module of its own (a TENorm, models/gpt/gpt_layer_specs.py l. 248), built
    before the attention (transformer_layer.py l. 287 vs 304): its output projection moves to just before the
    attention's first input projection, and the key-value down-projection after the query path (norm, o_proj,
    q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, ...)."""
    names = np.asarray(names, dtype=str)
    key = np.arange(len(names), dtype=float)
    proj = np.flatnonzero(_named(names, ATTN_OUT_PROJ_NAMES))
    # each attention block runs from the output projection before it on; its first latent-attention input
    # projection, if it has one before its output projection (len(names): none)
    mla_first = np.append(np.flatnonzero(_named(names, MLA_Q_FIRST_NAMES + MLA_KV_DOWN_NAMES)), len(names))
    first = mla_first[np.searchsorted(mla_first, np.concatenate([[0], proj[:-1] + 1]))]
    key[proj] = np.where(first < proj, first - 0.5, -1.0)
    kv = np.flatnonzero(_named(names, MLA_KV_DOWN_NAMES))
    q_last = np.flatnonzero(_named(names, MLA_Q_LAST_NAMES))
    nxt = np.searchsorted(q_last, kv)  # the query path's last projection after each key-value down-projection
    has = nxt < len(q_last)
    key[kv[has]] = q_last[nxt[has]] + 0.5
    return np.asarray(counts, dtype=float)[np.argsort(key, kind="stable")]


#: the order of a ``per_op`` row's ``parts``: single_device.with_op_parts' (optimizer_step, clip_grad_norm,
#: loss_scaling, grad_accumulation, memcpy) with a cluster step's own optimizer passes (:func:`optimizer_extra_parts`)
#: after loss scaling
OP_PART_ORDER = ("optimizer_step", "clip_grad_norm", "loss_scaling", "main_grad_cast", "grad_buffer",
                 "grad_accumulation", "memcpy")


def op_rows(op_class: np.ndarray, part: np.ndarray, time_ms: np.ndarray, gap_ms: np.ndarray,
            flops: np.ndarray) -> list[dict]:
    """``per_op`` rows (op_class, count, time_ms, flops, launch_gap_ms and, where the class holds any named overhead,
    ``parts``: name, count, time_ms) of kernels given as arrays, each with its ``part`` (single_device.op_part_labels,
    "" for none) and launch gap: single_device.with_op_parts' rows, from arrays (a repeated short graph's rows need no
    frame of their own)."""
    rows = group_totals(op_class, time_ms, flops, "op_class")
    codes, uniq = pd.factorize(op_class)
    gaps = dict(zip(map(str, uniq), np.bincount(codes, weights=gap_ms, minlength=len(uniq)).tolist()))
    named = part != ""
    parts: dict[str, list[dict]] = {}
    if named.any():
        key = op_class[named].astype(str).astype(object) + "|" + part[named].astype(str)
        for r in group_totals(key, time_ms[named], np.zeros(int(named.sum())), "key", by_time=False):
            cls, nm = r["key"].split("|")
            parts.setdefault(cls, []).append(dict(name=nm, count=r["count"], time_ms=r["time_ms"]))
    return [dict(r, launch_gap_ms=float(gaps.get(r["op_class"], 0.0)),
                 **({"parts": sorted(parts[r["op_class"]], key=lambda q: OP_PART_ORDER.index(q["name"]))}
                    if r["op_class"] in parts else {})) for r in rows]


def _rank_view(g, costed: pd.DataFrame, spec: DeviceSpec, n_rep: int = 1, period: int = 1,
               ood_log: tuple | None = None, tp_host_floor_ms: float = 0.0) -> _RankView:
    """Per-layer sums of a costed rank graph; with ``n_rep`` > 1 (a short graph, see ``_rank_graph``) block 1
    is repeated into blocks 1 .. n_rep (with a ``period`` P, blocks 1 .. P into blocks 1 .. n_rep x P). ``ood_log``:
    :func:`~wattcast.simulate.step_band.ood_kernel_band_log` of the graph before a power limit (None: read here).
    ``tp_host_floor_ms``: a TP collective's host-bound floor (what asynchronous launch cannot hide of it)."""
    from wattcast.models.power import idle_power_w
    from wattcast.simulate.memory import block_input_bytes

    layers = costed["layer"].to_numpy()
    ids, li = np.unique(layers, return_inverse=True)
    n = len(ids)
    mult = _layer_multiplicity(layers, n_rep, period)
    full_ids, src = _full_layer_ids(ids, n_rep, period)
    phase = costed["phase"].to_numpy()
    t = costed["time_ms"].to_numpy(dtype=float)
    fwd, bwd, opt = phase == "forward", phase == "backward", phase == "optimizer"
    op_class = costed["op_class"].to_numpy()
    is_coll = op_class == "collective"
    is_attn = op_class == "flash_attention"
    # a KV ring's attention: the diagonal step's share of each node's time (single_device.RING_DIAG_SHARE)
    diag = (costed[RING_DIAG_SHARE].to_numpy(dtype=float) if RING_DIAG_SHARE in costed.columns
            else np.zeros(len(costed)))
    is_gemm = op_class == "linear"
    group = costed["group"].astype(str).to_numpy()
    params = costed["param_count"].to_numpy(dtype=float)
    in_experts = costed["scope"].astype(str).str.contains(r"experts\.", regex=True).to_numpy()
    is_exp = fwd & in_experts
    names = costed["name"].astype(str)
    # Megatron-Core's "mlp" sub-module (fine_grained_callables' submodule_moe_forward): the routed experts with the
    # dispatcher's re-sort, and the shared experts
    is_mlp = ~is_coll & (in_experts | names.str.startswith(("moe.sort_chunks", "moe.unsort_chunks")).to_numpy()
                         | costed["tag"].astype(str).str.contains("shared_experts", regex=False).to_numpy())
    is_dispatch = is_coll & names.str.startswith("moe.dispatch").to_numpy()
    w = costed["power_w"].to_numpy(dtype=float)
    gpu_t = costed["gpu_ms"].to_numpy(dtype=float)
    # kernels at their power, host launch gaps at idle
    e_node = (w * gpu_t + idle_power_w(spec) * np.maximum(t - gpu_t, 0.0)) / 1e3
    cu = costed["compute_util"].to_numpy(dtype=float) if "compute_util" in costed else np.zeros(len(costed))

    def per_layer(mask, v):
        return np.bincount(li[mask], weights=v[mask], minlength=n)[src]

    acts, full_layers = activation_bytes_by_layer(g)

    def layer_array(by_layer: dict) -> np.ndarray:
        out = np.zeros(n)
        if by_layer:
            keys = np.fromiter(by_layer.keys(), dtype=np.int64, count=len(by_layer))
            pos = np.searchsorted(ids, keys)
            ok = (pos < n) & (ids[np.minimum(pos, n - 1)] == keys)
            np.add.at(out, pos[ok], np.fromiter(by_layer.values(), dtype=float, count=len(by_layer))[ok])
        return out[src]

    act, full_extra = layer_array(acts), layer_array(full_layers)
    transient = layer_array(transient_bytes_by_layer(g))
    n_layers = int(g.meta.get("n_layers", 0) or 0)
    rc = costed["recompute"].to_numpy(dtype=bool)
    flops = costed["flops"].to_numpy(dtype=float)
    whole = costed
    if n_rep > 1:  # whole-model summaries count block 1 n_rep times
        whole = costed[["op_class", "method", "time_ms", "flops", "ood"]].iloc[np.repeat(np.arange(len(costed)), mult)]
    wt = whole["time_ms"].to_numpy(dtype=float)
    wphase = np.repeat(phase, mult)
    ood_k, ood_lo, ood_hi = ood_log if ood_log is not None else ood_kernel_band_log(costed)
    k_ood = ood_k & ~is_coll
    c_ood = costed["ood"].to_numpy(dtype=bool) & is_coll & (fwd | bwd)
    t_lo, t_hi = t * np.exp(ood_lo), t * np.exp(ood_hi)
    # each distinct layer's dense parameters in registration order (repeated layers share the array)
    held = fwd & (params > 0) & ~is_exp
    name_arr = names.to_numpy()
    rows = np.flatnonzero(held)
    rows = rows[np.argsort(li[rows], kind="stable")]  # graph order within each layer
    cuts = np.searchsorted(li[rows], np.arange(n + 1))
    seq_by_id = [dense_param_sequence(name_arr[rows[a:z]], params[rows[a:z]]) for a, z in zip(cuts[:-1], cuts[1:])]
    muon_by_layer = {int(k): float(v) for k, v in (g.meta.get("muon_params_by_layer") or {}).items()}
    # per_op's rows: the forward and backward kernels (whole model, one micro-batch) with their named parts and launch
    # gaps, and the optimizer phase per layer and part (sharded per stage by the step)
    part = op_part_labels(costed)
    gap = np.maximum(t - gpu_t, 0.0)
    rep = np.repeat(np.arange(len(costed)), mult) if n_rep > 1 else slice(None)
    w_fb = ~opt[rep]
    per_op_fb = op_rows(op_class[rep][w_fb], part[rep][w_fb], wt[w_fb], gap[rep][w_fb], flops[rep][w_fb])
    # the DRAM traffic of what a collective can overlap (overlap.hbm_stretch): each kernel memory-bound or not by the
    # roofline of the spec sheet (single_device._roofline_ms' two terms), its bytes as the graph counts them
    nbytes = costed["bytes"].to_numpy(dtype=float) if "bytes" in costed.columns else np.zeros(len(costed))
    mem_bound = ~is_coll & (nbytes / (spec.memory_bandwidth_gbps * 1e9)
                            > flops / (_peak_tflops(costed["dtype"].to_numpy(), spec, "fp32") * 1e12))

    def hbm_of(mask):
        return np.stack([per_layer(mask & mem_bound, t), per_layer(mask & mem_bound, nbytes),
                         per_layer(mask & ~mem_bound, nbytes)])

    hbm = {"f": hbm_of(fwd & ~is_coll), "b": hbm_of(bwd & ~is_coll), "gemm_f": hbm_of(fwd & is_gemm),
           "gemm_b": hbm_of(bwd & is_gemm), "mlp_f": hbm_of(fwd & is_mlp), "mlp_b": hbm_of(bwd & is_mlp)}
    ci = np.flatnonzero(is_coll)  # the collectives' bytes per group and op, over their rows alone
    c_li, c_b, c_grp, c_fwd = li[ci], nbytes[ci], group[ci], fwd[ci]
    c_kern, c_bwd = costed["kernel"].to_numpy()[ci].astype(str), bwd[ci]

    def coll_layer(m):
        return np.bincount(c_li[m], weights=c_b[m], minlength=n)[src]

    coll_bytes = {str(grp): {str(k): (coll_layer(c_fwd & (c_grp == grp) & (c_kern == k)),
                                      coll_layer(c_bwd & (c_grp == grp) & (c_kern == k)))
                             for k in pd.unique(c_kern[c_grp == grp])}
                  for grp in pd.unique(c_grp)}
    # the TP collectives TE's userbuffers run under --tp-comm-overlap, by method (overlap.UB_METHOD_SMS; TE 2.20.2
    # initialize_ub l. 350-360): forward all-gathers (``<m>.enter.all_gather``) ring exchange, forward reduce-scatters
    # (``<m>.exit.reduce_scatter``) pipeline; backward, the row-parallel layers' output-gradient all-gathers
    # (``<m>.exit.reduce_scatter.grad``) ring exchange, the column-parallel layers' dgrad reduce-scatters
    # (``<m>.enter.all_gather.grad``) and input re-gathers (``.input_all_gather``) bulk
    kern = costed["kernel"].to_numpy().astype(str)
    ub_coll = is_coll & (group == "tp")
    opt_parts = {}
    if opt.any():
        okey = np.where(opt, op_class.astype(str).astype(object) + "|" + part, "")
        ones = np.ones(len(t))
        for k in pd.unique(okey[opt]):
            m = okey == k
            opt_parts[str(k)] = np.stack([per_layer(m, t), per_layer(m, gap), per_layer(m, ones), per_layer(m, flops)])
    return _RankView(
        per_op_fb=per_op_fb, opt_parts=opt_parts, hbm=hbm, coll_bytes_by_group=coll_bytes,
        muon_params=layer_array(muon_by_layer) if g.meta.get("optimizer") == "muon" else None,
        muon_tensors=optimizer_param_tensors(g) if g.meta.get("optimizer") == "muon" else None,
        src_layer_ids=ids[src],
        dense_param_seq=tuple(seq_by_id[j] for j in src),
        ood_fb_ms=per_layer(k_ood & (fwd | bwd), t), ood_fb_low_ms=per_layer(k_ood & (fwd | bwd), t_lo),
        ood_fb_high_ms=per_layer(k_ood & (fwd | bwd), t_hi), ood_opt_ms=per_layer(k_ood & opt, t),
        ood_opt_low_ms=per_layer(k_ood & opt, t_lo), ood_opt_high_ms=per_layer(k_ood & opt, t_hi),
        ood_coll_ms=per_layer(c_ood, t),
        wgrad_ms=per_layer(bwd & ~is_coll & names.str.endswith((".wgrad", ".bgrad")).to_numpy(), t),
        tp_b_async_save_ms=per_layer(bwd, async_tp_backward_save_ms(name_arr, phase, op_class, group, layers, t,
                                                                     num_sms=spec.num_sms,
                                                                     host_floor_ms=tp_host_floor_ms)),
        layer_ids=full_ids, f_ms=per_layer(fwd, t), b_ms=per_layer(bwd, t), opt_ms=per_layer(opt, t),
        f_nc_ms=per_layer(fwd & ~is_coll, t), b_nc_ms=per_layer(bwd & ~is_coll, t), coll_ms=per_layer(is_coll, t),
        attn_f_ms=per_layer(fwd & is_attn, t), attn_b_ms=per_layer(bwd & is_attn & ~rc, t),
        attn_rc_ms=per_layer(bwd & is_attn & rc, t),
        attn_diag_f_ms=per_layer(fwd & is_attn, t * diag), attn_diag_b_ms=per_layer(bwd & is_attn & ~rc, t * diag),
        attn_diag_rc_ms=per_layer(bwd & is_attn & rc, t * diag),
        gemm_f_ms=per_layer(fwd & is_gemm, t), gemm_b_ms=per_layer(bwd & is_gemm, t),
        tp_pipeline_f_ms=per_layer(fwd & ub_coll & (kern == "reduce_scatter"), t),
        tp_bulk_b_ms=per_layer(bwd & ub_coll & ((kern == "reduce_scatter")
                                                | names.str.endswith(".input_all_gather").to_numpy()), t),
        coll_by_group={str(grp): (per_layer(fwd & is_coll & (group == grp), t), per_layer(bwd & is_coll & (group == grp), t))
                       for grp in pd.unique(group[is_coll])},
        moe_mlp_f_ms=per_layer(fwd & is_mlp, t), moe_mlp_b_ms=per_layer(bwd & is_mlp, t),
        a2a_dispatch_f_ms=per_layer(fwd & is_dispatch, t), a2a_dispatch_b_ms=per_layer(bwd & is_dispatch, t),
        params=per_layer(fwd, params), expert_params=per_layer(is_exp, params),
        fp8_params=per_layer(fwd & (costed["dtype"].to_numpy() == "fp8"), params),
        e_f_nc_j=per_layer(fwd & ~is_coll, e_node), e_b_nc_j=per_layer(bwd & ~is_coll, e_node),
        cu_f_ms=per_layer(fwd & ~is_coll, cu * t), cu_b_ms=per_layer(bwd & ~is_coll, cu * t),
        e_opt_j=per_layer(opt, e_node), opt_cast_ms=per_layer(opt & (op_class == "fp8_cast"), t),
        e_opt_cast_j=per_layer(opt & (op_class == "fp8_cast"), e_node), act_bytes=act, full_extra_bytes=full_extra,
        transient_bytes=transient,
        block_input_bytes=tuple(block_input_bytes(g, n_layers)) if not g.meta.get("hidden") else (),
        phase_ms={ph: float(wt[wphase == ph].sum()) for ph in ("forward", "backward", "optimizer")},
        recompute_flops=float((flops * mult)[rc].sum()),
        overheads=step_overheads(costed.iloc[np.repeat(np.arange(len(costed)), mult)] if n_rep > 1 else costed),
        fallback_ops=fallback_summary(whole), ood_fraction=float(whole["ood"].mean()))


def fsdp_fp8_cast_share(meta: Mapping, n_micro: int) -> float:
    """The FP8 weight casts of a step under PyTorch FSDP (``hf``, ZeRO-2/3) over the graph's once-a-step casts
    (``featurize.training_graph``: one per module weight, reading 2 B a parameter and writing the FP8 copy and its
    transpose, ``weight_copy_bytes_per_param`` c). Transformer Engine 2.20.2 under FSDP2 caches no FP8 weight and
    saves none for the backward (pytorch/module/linear.py l. 2443, l. 738-741): every micro-batch's forward quantizes
    the gathered weight row-wise only (l. 563: read 2 B, write c / k, k = ``activation_cast_copies``: 2 with a
    transpose, else 1) and its backward re-quantizes it for the dgrad GEMM with both usages (l. 1356-1368: read 2 B,
    write c). Share = n_micro x ((2 + c / k) + (2 + c)) / (2 + c): 1.75 a micro-batch under delayed scaling on H100.
    Until stop 58 an FSDP step cast once a step, as Transformer Engine's cache (Megatron's ``is_first_microbatch``)
    does, while its memory held the cast copy sharded (audit 58e finding 4)."""
    recipe = meta.get("fp8_scaling") or "delayed"
    transpose = bool(meta.get("fp8_transpose", True))
    c = weight_copy_bytes_per_param(recipe, transpose)
    k = activation_cast_copies(recipe, transpose=transpose, train=True)
    return float(max(int(n_micro), 1)) * ((2.0 + c / k) + (2.0 + c)) / (2.0 + c)


def sharded_optimizer_parts(raw: dict, opt_share, cast_share, extra: Mapping[str, np.ndarray] | None = None) -> dict:
    """The optimizer phase of one GPU of each pipeline stage per "op_class|part" (a (4, stages) array: ms, launch gaps,
    kernels, FLOPs), from the stages' whole optimizer kernels ``raw`` (the schedule's per-stage sums of
    :attr:`_RankView.opt_parts`) as the step charges them: the FP8 weight casts times ``cast_share``, every other kernel
    (step, clipping, loss scaling, Muon's) times ``opt_share`` (ZeRO / the distributed optimizer / FSDP: each rank's
    shard; 1 without sharding), the kernel counts unscaled (a rank launches the same kernels over its shard), and
    ``extra`` (per "op_class|part", ms per stage: the passes the graph has no rows for, :func:`optimizer_extra_parts`)
    added. Per stage the ms add up to the step's ``opt_stage``."""
    out = {}
    for k, a in raw.items():
        share = np.asarray(cast_share if k.startswith("fp8_cast|") else opt_share, dtype=float)
        b = np.array(a, dtype=float)
        b[[0, 1, 3]] *= share
        out[k] = b
    for k, ms in (extra or {}).items():
        ms = np.asarray(ms, dtype=float)
        if k not in out:
            out[k] = np.zeros((4, len(ms)))
        out[k][0] += ms
    return out


def optimizer_extra_parts(bf16_opt: bool, megatron_cast: bool, ds_acc, dp: int, clip_grad: bool, params_stage,
                          opt_share, stream_gbps: float, bf16_step_ms) -> dict:
    """The optimizer-phase passes a step adds to the graph's rows (its ``bf16_step_ms`` per stage), per "op_class|part":
    DeepSpeed's ``BF16_Optimizer`` by :func:`bf16_optimizer_step_parts` (whole-gradient norm and clipping into
    ``clip_grad_norm``, its step's extra bytes into ``optimizer_step``, the buffer casts and zeroing as
    ``grad_buffer``), Megatron-Core's cast of half-precision main gradients to fp32 as ``main_grad_cast``."""
    if bf16_opt:
        parts = bf16_optimizer_step_parts(ds_acc, dp, clip_grad)
        if not np.any(bf16_step_ms):
            return {}
        return {f"optimizer|{name}": params_stage * (w + p * opt_share) / (stream_gbps * 1e9) * 1e3
                for name, (w, p) in parts.items() if w or p}
    if megatron_cast and np.any(bf16_step_ms):
        return {"optimizer|main_grad_cast": np.asarray(bf16_step_ms, dtype=float)}
    return {}


#: the optimizer phase's parts in the order a step runs them ("op_class|part" -> the trace's name; the optimizer step's
#: is the graph's kernel name, :func:`optimizer_trace_parts`): Megatron-Core's MixedPrecisionOptimizer.step copies the
#: main gradients (prepare_grads: _copy_model_grads_to_main_grads, then the unscale and inf/NaN check), clips them, then
#: steps (megatron-core 0.16.1 optimizer/optimizer.py l. 524-557, 593-623); DeepSpeed's ZeRO-1/2 step checks overflow,
#: takes the norm, then unscales and clips in one multiply before the step (0.19.8 zero/stage_1_and_2.py l. 3013-3120,
#: 3193-3220); the FP8 weight casts follow the step
OPTIMIZER_TRACE_ORDER = {"optimizer|main_grad_cast": "main_grad_cast",
                         "optimizer|grad_buffer": "bf16_optimizer.grad_buffer",
                         "optimizer|loss_scaling": "loss_scale.unscale", "optimizer|clip_grad_norm": "clip_grad_norm",
                         "muon_newton_schulz|optimizer_step": "muon_newton_schulz", "optimizer|optimizer_step": None,
                         "muon_update|optimizer_step": "muon_update", "fp8_cast|": "fp8_weight_cast"}


def optimizer_trace_parts(opt_parts: dict, optimizer: str | None, optimizer_impl: str | None) -> list[tuple]:
    """(trace name, "op_class|part", ms per stage) of :func:`sharded_optimizer_parts`' parts in
    :data:`OPTIMIZER_TRACE_ORDER` (any other after them, named by its key): the optimizer step named as the graph's
    kernels (``adamw.step``, ``adamw.foreach_step``; Muon's AdamW rows ``adamw.step``)."""
    opt = optimizer_key(optimizer) if optimizer and optimizer != "none" else "optimizer"
    step_name = "adamw.step" if opt == "muon" else f"{opt}.{'foreach_step' if optimizer_impl == 'foreach' else 'step'}"
    known = [k for k in OPTIMIZER_TRACE_ORDER if k in opt_parts]
    out = [(OPTIMIZER_TRACE_ORDER[k] or step_name, k, opt_parts[k][0]) for k in known]
    return out + [(k.rstrip("|").replace("|", "."), k, a[0]) for k, a in opt_parts.items()
                  if k not in OPTIMIZER_TRACE_ORDER]


def step_per_op(per_op_fb: list[dict], n_micro: int, opt_parts: dict, optimizer_impl: str | None = None,
                extra_rows: tuple = ()) -> list[dict]:
    """A step's ``per_op``: the whole model at the rank graph's TP degree (every stage's layers, one GPU of each stage)
    over the step: ``per_op_fb`` (the forward and backward of one micro-batch) ``n_micro`` times, the optimizer phase of
    :func:`sharded_optimizer_parts` summed over the stages (its op classes' rows, the named parts of each:
    optimizer_step with its ``impl``, clip_grad_norm, loss_scaling, main_grad_cast, grad_buffer), and ``extra_rows``
    (e.g. data loading over the step), by time. Its time adds up to the step's forward_serial_ms +
    backward_serial_ms + the extra rows + every stage's optimizer ms (pp 1: optimizer_ms)."""
    n = int(n_micro)
    rows: dict[str, dict] = {}
    for r in per_op_fb:
        o = rows[r["op_class"]] = dict(r, count=r["count"] * n, time_ms=r["time_ms"] * n, flops=r["flops"] * n,
                                       launch_gap_ms=r.get("launch_gap_ms", 0.0) * n)
        if "parts" in r:
            o["parts"] = [dict(q, count=q["count"] * n, time_ms=q["time_ms"] * n) for q in r["parts"]]
    for k, a in opt_parts.items():
        cls, part = k.split("|", 1)
        ms, gap, cnt, fl = (float(x) for x in np.asarray(a, dtype=float).sum(axis=1))
        o = rows.setdefault(cls, dict(op_class=cls, count=0, time_ms=0.0, flops=0.0, launch_gap_ms=0.0))
        o.update(count=o["count"] + int(round(cnt)), time_ms=o["time_ms"] + ms, flops=o["flops"] + fl,
                 launch_gap_ms=o["launch_gap_ms"] + gap)
        if part:
            ps = o.setdefault("parts", [])
            q = next((q for q in ps if q["name"] == part), None)
            if q is None:
                q = dict(name=part, count=0, time_ms=0.0)
                if part == "optimizer_step" and optimizer_impl:
                    q["impl"] = optimizer_impl
                ps.append(q)
            q.update(count=q["count"] + int(round(cnt)), time_ms=q["time_ms"] + ms)
    for o in rows.values():
        if "parts" in o:
            o["parts"] = sorted(o["parts"], key=lambda q: OP_PART_ORDER.index(q["name"]))
    out = [o for o in rows.values() if o["count"] > 0 or o["time_ms"] > 0]
    return sorted([*out, *extra_rows], key=lambda o: -o["time_ms"])


def critical_rank_ood_sums(stage: dict, n_micro: int, opt_ms: float, opt_raw_ms: float) -> tuple:
    """(kernel ms, OOD kernel ms, the same at their band's low and high edge, OOD collective ms) of one pipeline stage's
    rank over the step: ``stage`` holds its per-micro-batch sums of the :class:`_RankView` fields ``f_ms``, ``b_ms``
    and ``ood_*`` (its chunks' layers), run ``n_micro`` times, and its optimizer ``ood_opt_*`` (before ZeRO sharding,
    ``opt_raw_ms`` in all) scaled to the step's ``opt_ms`` (after it). The kernel time is the stage's whole costed
    graph time, its collectives included (as costed: what the overlap models hide of them is not taken out)."""
    f = opt_ms / opt_raw_ms if opt_raw_ms > 0 else 0.0
    total = n_micro * (stage["f_ms"] + stage["b_ms"]) + opt_ms
    return (total, *(n_micro * stage[f"ood_fb{e}_ms"] + f * stage[f"ood_opt{e}_ms"] for e in ("", "_low", "_high")),
            n_micro * stage["ood_coll_ms"])


def critical_rank_ood(stage: dict, n_micro: int, opt_ms: float, opt_raw_ms: float) -> dict:
    """The step band's OOD term (:func:`~wattcast.simulate.step_band.ood_from_sums`, with ``collective_share``) of one
    pipeline stage's rank, from :func:`critical_rank_ood_sums`."""
    return ood_from_critical_sums(critical_rank_ood_sums(stage, n_micro, opt_ms, opt_raw_ms))


def ood_from_critical_sums(sums: tuple) -> dict:
    """:func:`critical_rank_ood` from the rank's :func:`critical_rank_ood_sums` already summed."""
    total, ood_ms, low_ms, high_ms, coll_ms = sums
    out = ood_from_sums(total, ood_ms, low_ms, high_ms)
    coll = coll_ms / total if total > 0 else 0.0
    return dict(out, collective_share=coll) if coll > 0 else out


def _ood_shares(ood: dict, sums: tuple, coll_ms: float) -> dict:
    """The cluster JSON's ``ood_time_fraction`` (the critical rank's OOD kernels' share of its costed time, collectives
    included: what the step band and the warning read, ``step_time_band.ood_time_share``) and
    ``ood_kernel_time_fraction`` (their share of that rank's kernel time, its in-graph collectives ``coll_ms`` taken
    out), the two keys a single device's ``predict --json`` has (audit 58d)."""
    total, ood_ms = float(sums[0]), float(sums[1])
    kernel = total - coll_ms
    return {"ood_time_fraction": float(ood.get("share", 0.0)),
            "ood_kernel_time_fraction": float(ood_ms / kernel) if kernel > 0 and ood_ms > 0 else 0.0}


def _tied_copy_optimizer(view: _RankView, tied_params: float) -> tuple[float, float]:
    """(ms, J) of the optimizer step (with its clipping and unscaling) over a tied embedding's copy of ``tied_params``
    parameters: the embedding layer's own per parameter (the same weight's kernels, memory-bound and linear in the
    parameters), scaled to the copy."""
    emb = view.layer_ids < 0
    p = float(view.params[emb].sum())
    if p <= 0:
        return 0.0, 0.0
    f = tied_params / p
    return float(view.opt_ms[emb].sum()) * f, float(view.e_opt_j[emb].sum()) * f


def edge_layer_equivalents(view: _RankView, n_layers: int) -> tuple[float, float] | None:
    """(embedding, output layer + loss) of ``view`` in transformer-layer equivalents: their forward + backward time of
    one micro-batch (collectives included) over the mean transformer layer's; what the automatic pipeline split weighs
    the first and the last stage's extra work by (``parallel.balanced_stage_layers``). Layer ids below 0 are the
    embedding, ``n_layers`` and above the final norm, the output layer, the loss (and MTP blocks); None when the
    transformer layers cost nothing or there are none (a graph without layers: an ONNX export)."""
    if n_layers <= 0:
        return None
    ids = view.layer_ids
    fb_ms = view.f_ms + view.b_ms
    layer_ms = float(fb_ms[(ids >= 0) & (ids < n_layers)].sum()) / n_layers
    if not layer_ms > 0:
        return None
    return float(fb_ms[ids < 0].sum()) / layer_ms, float(fb_ms[ids >= n_layers].sum()) / layer_ms


def chunk_of_layer(layers: np.ndarray, n_layers: int, n_chunks: int, counts: list[int] | None = None) -> np.ndarray:
    """Model chunk of each layer: contiguous runs of ``counts`` layers (``parallel.stage_layers``; by default
    DeepSpeed's balanced split); embeddings with the first chunk, head and loss with the last."""
    counts = counts or stage_layers(n_layers, n_chunks, deepspeed=True)
    ends = np.cumsum(counts)
    c = np.searchsorted(ends, np.clip(layers, 0, n_layers - 1), side="right")
    c = np.where(layers < 0, 0, c)
    return np.where(layers >= n_layers, n_chunks - 1, c).astype(int)


#: the per-layer arrays of a _RankView (block recomputation picks each layer's from one of two views)
_PER_LAYER_FIELDS = ("f_ms", "b_ms", "opt_ms", "f_nc_ms", "b_nc_ms", "coll_ms", "attn_f_ms", "attn_b_ms", "attn_rc_ms",
                     "attn_diag_f_ms", "attn_diag_b_ms", "attn_diag_rc_ms",
                     "gemm_f_ms", "moe_mlp_f_ms", "moe_mlp_b_ms", "a2a_dispatch_f_ms", "a2a_dispatch_b_ms",
                     "gemm_b_ms", "params", "expert_params", "fp8_params", "e_f_nc_j", "e_b_nc_j", "cu_f_ms",
                     "cu_b_ms", "e_opt_j", "opt_cast_ms", "e_opt_cast_j", "act_bytes", "transient_bytes", "ood_fb_ms", "ood_fb_low_ms",
                     "ood_fb_high_ms", "ood_opt_ms", "ood_opt_low_ms", "ood_opt_high_ms", "ood_coll_ms", "wgrad_ms",
                     "tp_b_async_save_ms", "tp_pipeline_f_ms", "tp_bulk_b_ms")


#: the per-layer sums :func:`critical_rank_ood` reads
_OOD_STAGE_FIELDS = ("f_ms", "b_ms", "ood_fb_ms", "ood_fb_low_ms", "ood_fb_high_ms", "ood_opt_ms", "ood_opt_low_ms",
                     "ood_opt_high_ms", "ood_coll_ms")


def _position_in_chunk(layer_ids: np.ndarray, chunk: np.ndarray, counts, n_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """(is a transformer block, its position among its chunk's blocks) for each layer id (``counts``: the chunks'
    block counts in chunk order, ``chunk``: each layer's chunk)."""
    starts = np.cumsum(counts) - np.asarray(counts)
    return (layer_ids >= 0) & (layer_ids < n_layers), layer_ids - starts[chunk]


def recomputed_layers(layer_ids: np.ndarray, chunk: np.ndarray, counts, n_layers: int, num_layers: int) -> np.ndarray:
    """Which layers Megatron's block recomputation (``--recompute-granularity full --recompute-method block
    --recompute-num-layers N``) recomputes: the first ``N`` transformer layers of every model chunk (each pipeline
    stage, or virtual stage under interleaving: Megatron-Core's ``TransformerBlock`` checkpoints its first N layers);
    a chunk with fewer layers recomputes them all. Embeddings, head and loss are never recomputed."""
    block, pos = _position_in_chunk(layer_ids, chunk, counts, n_layers)
    return block & (pos < int(num_layers))


def _blend_rows(keep: list[dict], full: list[dict], keys: tuple[str, ...], w: float) -> list[dict]:
    """Whole-model rows (``per_op``, ``fallback_ops``) of a model whose blocks are a share ``w`` of ``full``'s and the
    rest ``keep``'s: every block is one or the other, so the totals are linear in ``w`` (exact for models whose blocks
    are alike, the families a short rank graph stands for)."""
    out: dict = {}
    sub: dict = {}  # a per_op row's parts, by its keys: blended as rows of their own
    for i, (rows, f) in enumerate(((keep, 1.0 - w), (full, w))):
        for r in rows:
            # (a row's labels: its keys' strings, e.g. a fallback row's op_type; the numbers are blended)
            k = tuple(r.get(c) for c in keys)
            o = out.setdefault(k, {c: (v if isinstance(v, str) else 0.0) for c, v in r.items() if c != "parts"})
            for c, v in r.items():
                if c == "parts":
                    sub.setdefault(k, ([], []))[i].extend(v)
                elif not isinstance(v, str):
                    o[c] += f * v
    for k, (kp, fp) in sub.items():
        out[k]["parts"] = sorted(_blend_rows(kp, fp, ("name",), w), key=lambda q: OP_PART_ORDER.index(q["name"]))
    rows = [dict(r, count=int(round(r["count"]))) if "count" in r else r for r in out.values()]
    rows = [r for r in rows if r.get("count", 1) > 0 or r.get("time_ms", 0.0) > 0]
    return sorted(rows, key=lambda r: -r.get("time_ms", 0.0))


def _block_recompute_view(full: _RankView, keep: _RankView, chunk: np.ndarray, counts, n_layers: int,
                          num_layers: int) -> _RankView:
    """The view of a step under block recomputation: each layer's time, energy and saved activations from ``full``
    (recomputed: only its input kept, its forward re-run in the backward) or ``keep`` (activations kept), per
    :func:`recomputed_layers`; whole-model summaries blended by the share of blocks recomputed; the transient of
    re-running one layer (``full_extra_bytes``) is the recomputed layers' alone."""
    if not np.array_equal(full.layer_ids, keep.layer_ids):  # both from one model: never expected, never silent
        raise ValueError("block recomputation: the recomputed and the plain rank graphs have different layers")
    rc = recomputed_layers(full.layer_ids, chunk, counts, n_layers, num_layers)
    n_block = int(((full.layer_ids >= 0) & (full.layer_ids < n_layers)).sum())
    w = float(rc.sum()) / max(n_block, 1)
    fields = {name: np.where(rc, getattr(full, name), getattr(keep, name)) for name in _PER_LAYER_FIELDS}
    zeros = np.zeros(len(rc))
    groups = dict.fromkeys(list(full.coll_by_group) + list(keep.coll_by_group))
    fields["coll_by_group"] = {grp: tuple(np.where(rc, full.coll_by_group.get(grp, (zeros, zeros))[i],
                                                   keep.coll_by_group.get(grp, (zeros, zeros))[i]) for i in (0, 1))
                               for grp in groups}
    if full.hbm is not None and keep.hbm is not None:  # the DRAM traffic of each layer's computation and collectives
        fields["hbm"] = {k: np.where(rc, full.hbm[k], keep.hbm[k]) for k in full.hbm}
        cb = {}
        for src_cb in (keep.coll_bytes_by_group, full.coll_bytes_by_group):
            for grp, ops in src_cb.items():
                for op in ops:
                    cb.setdefault(grp, {})[op] = tuple(
                        np.where(rc, full.coll_bytes_by_group.get(grp, {}).get(op, (zeros, zeros))[i],
                                 keep.coll_bytes_by_group.get(grp, {}).get(op, (zeros, zeros))[i]) for i in (0, 1))
        fields["coll_bytes_by_group"] = cb
    blend = {k: (1.0 - w) * keep.phase_ms.get(k, 0.0) + w * v for k, v in full.phase_ms.items()}
    over = {k: (1.0 - w) * keep.overheads.get(k, 0.0) + w * v for k, v in full.overheads.items()}
    return replace(full, **fields, phase_ms=blend, overheads=over,
                   full_extra_bytes=np.where(rc, full.full_extra_bytes, 0.0),
                   recompute_flops=w * full.recompute_flops,
                   per_op_fb=_blend_rows(keep.per_op_fb, full.per_op_fb, ("op_class",), w),
                   fallback_ops=_blend_rows(keep.fallback_ops, full.fallback_ops, ("op_class", "method", "op_type"), w),
                   ood_fraction=(1.0 - w) * keep.ood_fraction + w * full.ood_fraction)


def _uniform_recompute_view(full: _RankView, chunk: np.ndarray, counts, n_layers: int, num_layers: int) -> _RankView:
    """The view of a step under Megatron's uniform recomputation (``--recompute-method uniform --recompute-num-layers
    N``): every layer is recomputed (times as ``full``), but each model chunk keeps only the input of every group of N
    layers, and the backward re-makes a whole group at once (its N layers' full activations, held on its first layer;
    Megatron-Core's ``_checkpointed_forward`` uniform branch checkpoints ``custom(l, l + recompute_num_layers)``,
    transformer_block.py l. 495-509, megatron-core 0.16.1). Until stop 47 N times the largest layer of all (the head's
    included) was added on every stage."""
    block, pos = _position_in_chunk(full.layer_ids, chunk, counts, n_layers)
    keeps_input = ~block | (pos % int(num_layers) == 0)
    # each group's full activations on its first layer (a group: the chunk's blocks pos // N, in layer order)
    grp = np.cumsum(keeps_input & block) - 1
    group_bytes = np.bincount(np.where(block, grp, 0), weights=np.where(block, full.full_extra_bytes, 0.0),
                              minlength=int(grp.max()) + 1 if len(grp) else 1)
    extra = np.where(keeps_input & block, group_bytes[np.maximum(grp, 0)], 0.0)
    return replace(full, act_bytes=np.where(keeps_input, full.act_bytes, 0.0), full_extra_bytes=extra)


def recompute_extra_by_stage(full_extra_bytes: np.ndarray, chunk: np.ndarray, n_chunks: int, pp: int,
                             dual: bool = False) -> np.ndarray:
    """Bytes each pipeline rank re-makes at once under full recomputation: the largest of its chunks' recomputed
    layers' (groups', under uniform recomputation) full activations (``_RankView.full_extra_bytes``; chunk c of stage s
    is chunk c x P + s, DualPipe's rank s holds stages s and P-1-s). A stage with no recomputed layer adds nothing."""
    by_chunk = np.zeros(n_chunks)
    np.maximum.at(by_chunk, chunk, np.asarray(full_extra_bytes, dtype=float))
    by_stage = by_chunk.reshape(-1, pp).max(axis=0)
    return np.maximum(by_stage, by_stage[::-1]) if dual else by_stage


def _unscheduled(g, spec: DeviceSpec, cl: ClusterSpec, par: ParallelConfig, n_layers: int, n_micro: int, counts,
                 model_totals: dict, worst: float, worst_terms: dict | None, capacity: float, view: "_RankView",
                 power_limit_w: float | None, notes=(), per_op: list | None = None,
                 pipeline_layout: str | None = None) -> DistributedPrediction:
    """A strategy that does not fit, with its memory and without a schedule (``prune_oom``): every time, throughput
    and energy figure is NaN (not simulated), never a made-up number; ``meta["scheduled"]`` is False. ``per_op``: its
    kernels as costed (:func:`step_per_op`, without the passes and loading the schedule adds)."""
    nan = float("nan")
    meta = dict(g.meta, n_layers=n_layers, param_count=model_totals["param_count"], n_micro=n_micro, stage_layers=counts,
                pipeline_layout=pipeline_layout, scheduled=False, note="does not fit in memory: the step was not simulated (memory-first pruning)")
    meta = with_warnings(meta, notes)
    return DistributedPrediction(
        model=str(g.meta.get("name")), device=spec.name, cluster=cl.name, gpus=par.gpus, parallel=par, step_time_ms=nan,
        forward_ms=nan, backward_ms=nan, optimizer_ms=nan, exposed_comm_ms=nan, bubble_ms=nan, mfu=nan, hfu=nan,
        tflops_per_gpu=nan, flops=model_totals["flops"] * n_micro * par.dp, memory_gb=worst, memory=worst_terms or {},
        fits=False, memory_capacity_gb=capacity, per_device=[],
        per_op=per_op if per_op is not None else step_per_op(view.per_op_fb, n_micro, {}),
        fallback_ops=view.fallback_ops,
        ood_fraction=view.ood_fraction, comm={}, meta=meta, energy_j=nan, avg_power_w=nan, power_limit_w=power_limit_w)


#: the kernels of a graph without any (:meth:`ScheduleContext.without_kernels`); read-only
_NO_NODES = pd.DataFrame({c: [] for c in NODE_COLUMNS})
_NO_EDGES = np.zeros((0, 2), dtype=np.int64)
_NO_EDGES.flags.writeable = False


@dataclass(frozen=True)
class ScheduleContext:
    """Everything :func:`schedule_step` needs to time one strategy: the costed rank graph and its per-layer view, the
    device, cluster, strategy and group placements, the collective model, the step's sizes and settings. Built by
    :func:`schedule_context` (``predict_distributed``'s checks and caches); a search re-targets one to another
    strategy sharing its rank graph with :meth:`with_parallel`."""

    model: object
    g: object  # the rank graph (featurize.op_graph.OpGraph)
    view: _RankView
    spec: DeviceSpec
    cl: ClusterSpec
    par: ParallelConfig  # resolved
    lay: dict  # group -> GroupLayout (``parallel.layouts``)
    cm: object  # collective model
    batch: int
    seq: int
    n_micro: int
    n_layers: int
    dtype: str
    opts: StepOptions
    trace: bool = False
    iteration_ms: float = 0.0
    power_limit_w: float | None = None
    #: the SM clock cap (checked; None: none): the graph's kernels are costed under it, and the waits' communication
    #: power and the gradient-accumulation streaming pass follow it in :func:`schedule_step`
    clock_cap_mhz: float | None = None
    model_totals: dict | None = None
    stream_gbps: float = 1e3
    power_model: object = None
    cp_kv_bytes: float = 0.0
    #: context parallelism's per-rank Q, K, V and output bytes of one layer (cp_tensor_bytes): what a2a / allgather move
    cp_qkvo_bytes: tuple = (0.0, 0.0, 0.0, 0.0)
    comm_split: bool = True
    prune_oom: bool = False
    #: True: the pipeline is timed by the event-driven scheduler (the reference); False: by the closed form
    #: (:mod:`wattcast.simulate.pipeline_fast`) where it applies
    exact_pipeline: bool = True
    #: ZeRO-3 / FSDP collectives prefetched beside the computation (True) or in series with it (resolved
    #: ``DistributedOptions.zero3_prefetch``)
    zero3_prefetch: bool = True
    #: pipeline transfers scattered over the TP group and all-gathered on arrival (resolved
    #: ``DistributedOptions.scatter_gather_p2p``)
    scatter_gather_p2p: bool = False
    #: ``DistributedOptions.fsdp_reduce_dtype`` (checked): FSDP's gradient reduce-scatter dtype, None the default
    fsdp_reduce_dtype: str | None = None
    #: ``DistributedOptions.grad_accum_dtype`` (checked): DeepSpeed's gradient-accumulation dtype, None the default
    grad_accum_dtype: str | None = None
    #: ``DistributedOptions.deepspeed_clear_lp_grads`` (checked)
    deepspeed_clear_lp_grads: str = "zero"
    #: ``DistributedOptions.fp8_param_gather`` (checked)
    fp8_param_gather: bool = False
    #: the framework's per-kernel launch floor (ms) and TP collective host floors (None: the framework's table), for
    #: the data-loading kernels and broadcasts (``simulate/data_loading.py``)
    launch_ms: float = 0.0
    coll_floor: dict | None = None
    #: the host-bound floor of one ring-attention step under context parallelism (ms; ``FRAMEWORK_CP_STEP_HOST_MS``)
    cp_step_floor_ms: float = 0.0
    #: data loading: host ms per micro-batch and the loader's worker processes (resolved)
    data_load_ms: float = 0.0
    data_workers: int = 0
    #: False: leave ``per_device`` empty (a search reads the step's totals only)
    detail: bool = True
    #: the kernel bundle the rank graph was costed with (the step band's generation term reads its folds)
    bundle: object = field(default=None, compare=False, repr=False)
    #: shared across the contexts of one search: per-chunk sums and data-parallel message times by what they depend
    #: on (None: nothing kept)
    memo: dict | None = field(default=None, compare=False, repr=False)
    #: True: :func:`schedule_step` returns a :class:`StepSummary` (the figures of a search row, the same numbers) instead
    #: of a DistributedPrediction; implies ``detail`` False
    summary: bool = False
    #: settings accepted without effect (a clock cap at or above boost, a power limit above the TDP:
    #: ``models.power.power_setting_notes``), added to the prediction's ``warnings``
    notes: tuple = ()
    #: with full recomputation: a function giving the view of the same rank graph without recomputation (block
    #: recomputation, ``ParallelConfig.recompute_num_layers``, takes its layers from both); None otherwise
    keep_view: object = field(default=None, compare=False, repr=False)
    #: the automatic pipeline split's stage totals when the cost-balanced one does not fit the device memory
    #: (``parallel.memory_fitting_split``, chosen by :func:`schedule_step`); None: the cost-balanced split
    stage_split: tuple | None = None
    #: True: :func:`schedule_step` returns each stage's memory (GB) alone, no schedule (the probes of
    #: ``parallel.memory_fitting_split``)
    memory_probe: bool = False
    #: GB the memory-aware automatic split keeps free (``DistributedOptions.split_headroom_gb``: a search's margin)
    split_headroom_gb: float = 0.0

    def with_split(self, stages, *, probe: bool = False) -> "ScheduleContext":
        """This context with the automatic split's stage totals ``stages`` (:attr:`stage_split`), as a memory probe or
        not (a shallow copy, as :meth:`with_parallel`)."""
        out = object.__new__(ScheduleContext)
        out.__dict__.update(self.__dict__)
        out.__dict__["stage_split"], out.__dict__["memory_probe"] = tuple(int(n) for n in stages), probe
        return out

    def without_kernels(self) -> "ScheduleContext":
        """This context with its rank graph's metadata only, no kernel rows: :func:`schedule_step` reads nothing else
        of the graph (the per-layer view holds its costed sums), so a search keeps one per rank graph without pinning
        the graphs (a whole gpt-oss-120b rank graph is ~100 MB); they stay in the bounded graph caches."""
        g = self.g
        if not len(g.nodes):
            return self
        # shared empty ones (an empty slice of the graph's would be a view keeping its whole memory alive)
        return replace(self, g=replace(g, nodes=_NO_NODES, edges=_NO_EDGES, saved={}))

    def with_parallel(self, par: ParallelConfig) -> "ScheduleContext":
        """This context for another resolved strategy with the same rank graph (tp, sp, ep, cp, micro-batch and
        recomputation equal): its group placements and micro-batch count."""
        # a shallow copy with three fields set: dataclasses.replace re-runs __init__, copy.copy goes through __reduce_ex__
        out = object.__new__(ScheduleContext)
        d = out.__dict__
        d.update(self.__dict__)
        d["par"], d["lay"], d["n_micro"] = par, layouts(par, self.cl), par.n_micro(self.batch)
        return out


@lru_cache(maxsize=4096)
def _split_report(counts: tuple, n_layers: int, pp: int, interleave: int, framework: str, explicit: bool,
                  dual: bool) -> tuple[str | None, tuple[str, ...]]:
    """:func:`parallel.pipeline_split_report` once per split (a search meets the same split many times)."""
    layout, notes = pipeline_split_report(counts, n_layers, pp, interleave, framework=framework, explicit=explicit,
                                          dualpipe=dual)
    return layout, tuple(notes)


class StepSummary(NamedTuple):
    """What a search row needs of one step (``ScheduleContext.summary``): the DistributedPrediction fields of the same
    names, with the same values; a strategy that does not fit (memory-first pruning) has NaN times and energy and
    ``scheduled`` False."""

    device: str
    parallel: ParallelConfig
    step_time_ms: float
    mfu: float
    tflops_per_gpu: float
    flops: float
    memory_gb: float
    fits: bool
    exposed_comm_ms: float
    bubble_ms: float
    energy_j: float
    avg_power_w: float
    memory_capacity_gb: float
    scheduled: bool
    #: the step band's terms (``simulate/step_band.py``; a search makes its rows' bands from them, over the rows at once):
    #: the critical rank's :func:`critical_rank_ood_sums` (None: no OOD time on any rank), the rank graph's per-op
    #: totals of one micro-batch's forward and backward (the generation term's weights) and the data loading's ms per
    #: micro-batch (which the prediction's ``per_op`` adds to them, as below)
    ood_sums: tuple | None = None
    rank_per_op: list | None = None
    data_loading_ms: float = 0.0
    #: the prediction's ``per_op`` is ``rank_per_op`` (forward and backward of one micro-batch) and the loading
    #: ``n_micro`` times, with ``optimizer_per_op`` (the step's optimizer-phase rows, every stage's sharded step)
    n_micro: int = 1
    optimizer_per_op: list | None = None
    #: Megatron-Core's ``--pipeline-model-parallel-layout`` of an uneven split (the prediction's
    #: ``parallel.pipeline_layout``; None for an even split, no pipeline or another framework)
    pipeline_layout: str | None = None

    @property
    def memory_flag(self) -> str:
        return memory_flag(self.memory_gb, self.memory_capacity_gb, eager_training=False)


#: Megatron-Core's default gradient bucket, in parameters: ``max(40M, 1M x the data-parallel size with context
#: parallelism)`` (``DistributedDataParallel``, when ``--ddp-bucket-size`` is not given: "large enough for ring
#: collectives at scale"), and one bucket for everything without ``--overlap-grad-reduce``
MCORE_BUCKET_PARAMS_MIN, MCORE_BUCKET_PARAMS_PER_DP_RANK = 40e6, 1e6


def dp_bucket_params(framework: str, par: ParallelConfig, dp_size: int, grad_b: float) -> float:
    """Parameters per gradient bucket: Megatron-Core's heuristic for ``megatron`` (inf: one bucket, when it does not
    overlap the reduction), DeepSpeed's 5e8 elements for ``megatron-deepspeed``, else ``par.bucket_mb`` of gradients
    (PyTorch DDP's 25 MB).

    A ring collective's latency grows with its group (``dp - 1`` steps), so at a large data-parallel size 25 MB buckets
    cost the step their latency hundreds of times (Llama 3 8B, ZeRO-1, 2,048 H100s: 19.8 s exposed); Megatron-Core
    grows its buckets with the group instead (2,048M parameters there: 4 buckets)."""
    if framework == "megatron":
        # Megatron-FSDP (--zero 2, optim_grads) buckets by DistributedDataParallelConfig.bucket_size too
        # (mcore_fsdp_adapter.py l. 88 and megatron_fsdp.py l. 255, 345 pass it to _get_parameter_groups, which splits
        # the groups outside FSDP units at it, param_and_grad_buffer.py l. 1399-1406; optim_grads has no units,
        # mcore_fsdp_adapter.py l. 96-99), and Megatron-LM's get_model sets it before wrapping the model, for
        # Megatron-FSDP as for DDP: "In the Megatron FSDP and DDP use path, we need to initialize the bucket size",
        # max(40M, 1M x dp x cp) unless --ddp-bucket-size, None without --overlap-grad-reduce (megatron/training/
        # training.py l. 1848-1855 and resolve_ddp_bucket_size l. 1552-1567, as shipped in the megatron-core 0.19.2
        # wheel; 0.16.1 ships no megatron/training). Until stop 46 --zero 2 was costed with one bucket of the whole
        # model (DistributedDataParallelConfig.bucket_size's None default taken as what Megatron-LM passes)
        if not par.overlap_grad_reduce:
            return float("inf")
        return max(MCORE_BUCKET_PARAMS_MIN, MCORE_BUCKET_PARAMS_PER_DP_RANK * dp_size)
    if framework == "megatron-deepspeed":
        # DeepSpeed's engine reduces the gradients in buckets of its config's ``reduce_bucket_size`` (ZeRO 1/2) /
        # ``allreduce_bucket_size`` (no ZeRO), both 5e8 elements by default (deepspeed/runtime/zero/config.py,
        # deepspeed/runtime/constants.py); until stop 40 PyTorch DDP's 25 MB: GPT-3 2.7B ZeRO-1 on 2,048 A100s spent
        # 2.2 s in 216 buckets' ring latencies (a 2.6 s step against 0.55 s without ZeRO)
        return DEEPSPEED_BUCKET_ELEMENTS
    return par.bucket_mb * 1e6 / grad_b


def root_params_by_chunk(params_chunk: np.ndarray, block_params_chunk: np.ndarray) -> np.ndarray:
    """Per model chunk, its parameters outside the transformer blocks (embeddings, final norm, untied head, a
    pipeline's tied copy): the chunk's parameters less its blocks', at least 0. What FSDP's root unit (hf, ZeRO-3) and
    Megatron-FSDP's ``optim_grads_params`` (megatron, ZeRO-3) keep outside their per-block units: the stage memory's
    root parameters are its chunks' sum, the ZeRO-3 time's once-a-step gathers (:func:`_dp_times` ``root_chunk``) the
    per-chunk values."""
    return np.maximum(np.asarray(params_chunk, dtype=float) - np.asarray(block_params_chunk, dtype=float), 0.0)


def mfsdp_first_bucket_params(embedding_params, group_params, bucket_params: float):
    """Parameters in Megatron-FSDP's bucket that holds the embedding (``--framework megatron --zero 2/3``), of a
    group of ``group_params`` it opens (the rank's dense parameters under ``optim_grads``, which has no FSDP units;
    under ``optim_grads_params`` the parameters outside the TransformerLayer units): ``_get_parameter_groups``
    (megatron-core 0.16.1 ``distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py`` l. 1399-1423) fills the
    buckets in ``module.named_parameters()`` order, the embedding first, and closes one as soon as its parameters
    reach ``suggested_bucket_size`` (Megatron-LM's ``--ddp-bucket-size``, :func:`dp_bucket_params`; a shared
    embedding gets a bucket of its own, l. 1316-1327): the embedding alone when it is at least ``bucket_params``
    (Llama 3 8B: 525.3M against 40M), else it and the parameters after it up to about ``bucket_params``; the whole
    group without a bucket size (``bucket_params`` inf). 0 where there is no embedding. Its gradient is the
    backward's last (the embedding's backward is the last op), so its reduce-scatter is the one each backward waits
    for at its end (``_root_post_backward`` -> ``GradReducePipeline.reset``, ``megatron_fsdp.py`` l. 763-785)."""
    emb = np.asarray(embedding_params, dtype=float)
    group = np.asarray(group_params, dtype=float)
    first = np.maximum(emb, bucket_params) if np.isfinite(bucket_params) else group
    return np.where(emb > 0, np.minimum(first, group), 0.0)


#: the distributed optimizer's alignment of a parameter's start in the grad buffer (elements: 128 bytes at >= 16-bit,
#: megatron-core 0.16.1 distributed/param_and_grad_buffer.py l. 658-665) and of a bucket's end (a multiple of
#: lcm(dp, 128), l. 638-656; lcm(dp, 128, 2^16) with --ddp-pad-buckets-for-high-nccl-busbw, off by default:
#: distributed_data_parallel_config.py l. 46)
MCORE_PARAM_ALIGN_ELEMENTS, MCORE_BUCKET_ALIGN_ELEMENTS = 64, 128


def mcore_ddp_bucket_numels(numels, bucket_params: float, *, own_bucket=None, dist_opt: bool = False,
                            dp: int = 1) -> np.ndarray:
    """Megatron-Core's gradient buckets of one ``_ParamAndGradBuffer`` (``--framework megatron`` DDP / distributed
    optimizer), elements each in buffer order (bucket 0 first: the end of the model chunk; the last holds its first
    parameters). ``numels``: the parameters' sizes in registration order (the embedding first); ``bucket_params``:
    the bucket size (inf: one bucket); ``own_bucket``: per parameter, whether it is a shared embedding. The walk of
    megatron-core 0.16.1 distributed/param_and_grad_buffer.py l. 711-743: the parameters in reverse order ("to
    roughly follow backprop order"), each start padded to 64 elements under the distributed optimizer; under it a
    shared embedding closes the open bucket before it and gets one of its own
    (``_does_param_require_new_bucket``, l. 698-709: tied embeddings / MTP on the first stage of a pipeline,
    language_module.py l. 203-210); else a bucket closes at the first parameter that takes it to >= the bucket size
    (l. 729-736), what is left at the end is the last bucket; under the distributed optimizer every bucket's end is
    padded to lcm(dp, 128) (l. 638-656). So the last bucket, reduced as the backward ends, is the embedding and what
    the bucket before it left open (Llama 3 8B TP2, 40M buckets: 262.7M + the first layer's 21.0M attention
    projections), or the embedding alone when shared."""
    n = np.asarray(numels, dtype=float)
    # l. 698-709: a shared embedding's own bucket only under the distributed optimizer
    own = (np.zeros(len(n), dtype=bool) if own_bucket is None else np.asarray(own_bucket, dtype=bool)) & bool(dist_opt)
    div = math.lcm(int(dp), MCORE_BUCKET_ALIGN_ELEMENTS)

    def pad(i: float, d: int) -> float:
        return math.ceil(i / d) * d if dist_opt else i

    out: list[float] = []
    start = b_start = end = 0.0
    open_params = 0
    for k in range(len(n) - 1, -1, -1):
        start = pad(start, MCORE_PARAM_ALIGN_ELEMENTS)
        if own[k] and open_params:  # l. 718-721: close the open bucket first
            start = pad(start, div)
            out.append(start - b_start)
            b_start, open_params = start, 0
        end = start + n[k]
        open_params += 1
        if (np.isfinite(bucket_params) and end - b_start >= bucket_params) or own[k]:  # l. 729-736
            start = pad(end, div)
            out.append(start - b_start)
            b_start, open_params = start, 0
        else:
            start = end
    if open_params:  # l. 740-742: the remaining parameters
        out.append(pad(end, div) - b_start)
    return np.array(out)


def _last_bucket_msgs(c: int, op: str, group, last: float, p_count: float, grad_b: float, bucket_params: float,
                      last_role: str, rest_role: str) -> tuple[list[tuple], tuple]:
    """A chunk's gradient messages when the backward's last bucket (the embedding's, ``last`` of its ``p_count``
    parameters) stands apart: (the rest's equal buckets of at most ``bucket_params`` each, one message for all nb of
    them; none when nothing is left), the last bucket's message; :func:`_dp_times`' (chunk, role, op, bytes, group,
    count) tuples (Megatron-FSDP's ZeRO-2; Megatron-Core's DDP / distributed optimizer walks its buckets exactly,
    :func:`mcore_ddp_bucket_numels`)."""
    rest = p_count - last
    nb = max(1, int(np.ceil(rest / bucket_params))) if np.isfinite(bucket_params) else 1
    return ([(c, rest_role, op, rest * grad_b / nb, group, nb)] if rest > 0 else []), (c, last_role, op, last * grad_b, group, 1)


def _dp_times(par: ParallelConfig, lay: dict, cl: ClusterSpec, cm, params_chunk: np.ndarray, expert_chunk: np.ndarray,
              grad_b: float, db: float, P: int, V: int, units: np.ndarray, bucket_params: float | None = None,
              gather_b_chunk: np.ndarray | None = None, bucketed_first_chunk_only: bool = False, first_chunks=(0,),
              reduce_op: str | None = None, reduce_every_micro: bool = False, framework: str | None = None,
              root_chunk: np.ndarray | None = None, first_root_chunk: np.ndarray | None = None,
              last_bucket_chunk: np.ndarray | None = None, ddp_buckets_chunk: dict | None = None,
              fsdp_root_chunk: np.ndarray | None = None) -> dict:
    """Per chunk: gradient sync time (bucketed), param all-gather after the step (ZeRO-1/2), ZeRO-3's gathers and
    reduce-scatters per task; and per stage its buckets in order (``bucket_pad``: stages x most buckets, zero-padded;
    ``bucket_n``: each stage's count). ``gather_b_chunk``: bytes of each chunk's gathered parameters (default
    ``params_chunk`` x ``db``; FP8 parameters gather at 1 B). ``bucketed_first_chunk_only``: only chunk 0 (the first
    stage's first model chunk; ``first_chunks`` the chunks that hold it: under DualPipe rank 0 and rank P-1) splits its
    gradients into buckets, every other chunk reduces them as one message
    (Megatron-Core's DistributedDataParallel).

    ZeRO-3 / FSDP gathers and reduces unit by unit (``units``: the chunk's wrapped modules, one per transformer block
    as FSDP's auto-wrap policies and DeepSpeed's per-module fetch have it), so each chunk pays ``units`` collectives of
    a unit's bytes (their latency grows with the group: a ring takes ``dp - 1`` steps each): ``z3_f_ms`` the forward's
    gathers, ``z3_b_ms`` the backward's gathers and reduce-scatters, ``z3_first_*`` the one unit's worth that waits
    for nothing to hide behind (the first gather of a pass, and the backward's last reduce-scatter); ``z3_f_bytes``,
    ``z3_f_n``, ``z3_b_bytes``, ``z3_b_n`` the bytes and count of a micro-batch's forward and backward collectives.
    ``framework``'s PyTorch FSDP ZeRO-2 (``hf``, :func:`fsdp_shard_grad_op`): the same per-unit collectives
    (:func:`per_unit_collectives`), but the forward's gathered parameters are kept for the backward: ``z3_b_ms`` the
    reduce-scatters alone (None: no framework's ZeRO-2 is FSDP's).

    ``reduce_every_micro`` (ZeRO-2 of a framework that reduces every micro-batch's gradients,
    :func:`grad_reduce_every_micro`): each chunk's buckets are reduced in every backward, not once after the last:
    ``z2_b_ms`` their time per backward, ``z2_last_b_ms`` the last bucket's (launched as the backward ends); no
    bucketed sync after the step (``sync_ms`` 0), the parameter all-gather after it as ZeRO-1's.

    ``root_chunk`` (Megatron-FSDP ``optim_grads_params``, ``--framework megatron --zero 3``:
    :func:`root_params_by_chunk`) each chunk's parameters outside its units (embedding, final norm, output layer),
    ``first_root_chunk`` of them the embedding's bucket (:func:`mfsdp_first_bucket_params`: the forward's first
    parameters and the backward's last gradient). They are gathered once a step, not with each micro-batch's units:
    ``z3_root_f_ms`` their all-gathers per step (one per bucket, the embedding's and the rest's),
    ``z3_root_first_f_ms`` the embedding's, waited for by the step's first forward; their gradients are
    reduce-scattered in every backward as their own buckets (in ``z3_b_ms``), the embedding's last, as the backward
    ends (``z3_first_b_ms`` holds it instead of a unit's reduce-scatter). ``last_bucket_chunk`` (Megatron-FSDP
    ``optim_grads``, ``--zero 2``: :func:`mfsdp_first_bucket_params`): the parameters of each chunk's last gradient
    bucket of a backward (the embedding's), ``z2_last_b_ms`` its reduce-scatter; the rest in ``bucket_params``
    buckets. Without ``reduce_every_micro`` (Megatron-Core's DDP / distributed optimizer) ``ddp_buckets_chunk``
    (chunk -> :func:`mcore_ddp_bucket_numels`) gives the bucketed chunk's buckets as the source cuts them: the last
    one (the embedding's) as it is, the others at their mean size.

    ``sync_bytes`` / ``gather_bytes``: each chunk's gradient buckets' and parameter all-gathers' nccl-tests bytes (what
    their DRAM traffic beside the computation follows from: overlap.collective_hbm_bytes).

    ``fsdp_root_chunk`` (PyTorch FSDP ZeRO-3, ``--framework hf --zero 3``: :func:`root_params_by_chunk`): each chunk's
    parameters of FSDP's root unit (embeddings, final norm, output layer), spread over the chunk's units as before,
    which the root keeps unsharded from its forward through the backward: the backward's re-gathers leave them out.
    FSDP1 frees no root parameter after the forward (torch 2.13 distributed/fsdp/_runtime_utils.py l. 493-500:
    ``free_unsharded_flat_param = not state._is_root and ...``); FSDP2's root, with ``reshard_after_forward`` left at
    its default, gets no post-forward reshard (_fully_shard/_fsdp_state.py l. 203-207: ``post_forward_mesh_info =
    None``), as the memory model holds it (stage_memory: the root's unsharded parameters through the backward). Until
    stop 58 the backward re-gathered them (audit 58e: 85.49 ms = 2.00 x the forward's 42.70 ms on Llama 3 8B, 8 H100)."""
    n_chunks = P * V
    dp_l = lay["dp"]
    out = {"sync_ms": np.zeros(n_chunks), "bucket_ms": [], "gather_after_ms": np.zeros(n_chunks),
           "gather_last_ms": np.zeros(n_chunks),
           "z3_f_ms": np.zeros(n_chunks), "z3_b_ms": np.zeros(n_chunks), "z3_first_f_ms": np.zeros(n_chunks),
           "z3_first_b_ms": np.zeros(n_chunks), "z2_b_ms": np.zeros(n_chunks), "z2_last_b_ms": np.zeros(n_chunks),
           "z2_bytes": np.zeros(n_chunks), "z2_n": np.zeros(n_chunks, dtype=np.int64),
           "z3_f_bytes": np.zeros(n_chunks), "z3_f_n": np.zeros(n_chunks, dtype=np.int64),
           "z3_b_bytes": np.zeros(n_chunks), "z3_b_n": np.zeros(n_chunks, dtype=np.int64),
           "z3_root_f_ms": np.zeros(n_chunks), "z3_root_first_f_ms": np.zeros(n_chunks),
           "z3_root_f_bytes": np.zeros(n_chunks), "z3_root_f_n": np.zeros(n_chunks, dtype=np.int64),
           "sync_bytes": np.zeros(n_chunks), "gather_bytes": np.zeros(n_chunks)}
    root_chunk = np.zeros(n_chunks) if root_chunk is None else np.asarray(root_chunk, dtype=float)
    first_root_chunk = (np.zeros(n_chunks) if first_root_chunk is None
                        else np.minimum(np.asarray(first_root_chunk, dtype=float), root_chunk))
    shard_grad_op = fsdp_shard_grad_op(framework, par.zero)
    per_unit = per_unit_collectives(framework, par.zero)
    units = np.maximum(np.asarray(units, dtype=int), 1)
    if dp_l.size <= 1 and expert_dp(par) <= 1:  # (expert parameters reduce over expert-DP even when dp x cp is 1)
        out["bucket_ms"] = [np.zeros(0)] * n_chunks
        return _stage_buckets(out, P, V)
    if bucket_params is None:  # parameters per gradient bucket (dp_bucket_params): par.bucket_mb of gradients
        bucket_params = par.bucket_mb * 1e6 / grad_b
    op = reduce_op or ("reduce_scatter" if par.zero >= 1 else "all_reduce")
    # the expert-data-parallel group: the ranks after the experts' etp x ep (Megatron-Core's MoE parallel folding)
    ep_dp = group_layout(expert_dp(par), expert_tp(par) * par.ep, cl.gpus_per_node, par.gpus)
    # every message of the step first, then one (memoised) prediction per collective and group
    msgs: list[tuple[int, str, str, float, GroupLayout, int]] = []  # (chunk, role, op, bytes, group, count)
    for c in range(n_chunks):
        for gi, (p_count, group) in enumerate(((params_chunk[c] - expert_chunk[c], dp_l), (expert_chunk[c], ep_dp))):
            total = p_count * grad_b
            # ZeRO-3 reduces each unit's gradients as its backward ends (z3_rs below), no bucketed sync after it (until
            # stop 40 one was costed here and reported as dp_sync_ms, though the step never ran it)
            if total <= 0 or group.size <= 1 or per_unit:
                continue
            last = (min(float(last_bucket_chunk[c]), p_count)
                    if last_bucket_chunk is not None and reduce_every_micro and gi == 0 else 0.0)
            bucketed = np.isfinite(bucket_params) and not (bucketed_first_chunk_only and c not in first_chunks)
            if ddp_buckets_chunk is not None and not reduce_every_micro and gi == 0 and bucketed \
                    and len(ddp_buckets_chunk.get(c, ())) > 0:
                # Megatron-Core's DDP / distributed optimizer: _ParamAndGradBuffer's buckets (mcore_ddp_bucket_numels:
                # megatron-core 0.16.1 distributed/param_and_grad_buffer.py l. 711-743), the embedding in the last,
                # the backward's last (until stop 47 the chunk was cut into equal buckets, the embedding spread over
                # them; until stop 48 the last bucket was max(embedding, bucket size), the others ceil(rest / size))
                bk = np.asarray(ddp_buckets_chunk[c], dtype=float)
                nb = len(bk) - 1
                if nb:
                    msgs.append((c, "bucket", op, float(bk[:-1].sum()) * grad_b / nb, group, nb))
                msgs.append((c, "bucket", op, float(bk[-1]) * grad_b, group, 1))
                continue
            if last > 0:
                # the last bucket of the backward as the source builds it (the embedding's), then the rest's buckets
                rest_m, last_m = _last_bucket_msgs(c, op, group, last, p_count, grad_b, bucket_params, "z2_rs_last",
                                                   "z2_rs_rest")
                msgs.extend([last_m, *rest_m])
                continue
            nb = max(1, int(np.ceil(p_count / bucket_params))) if bucketed else 1
            msgs.append((c, "z2_rs" if reduce_every_micro else "bucket", op, total / nb, group, nb))
        gather_b = params_chunk[c] * db if gather_b_chunk is None else gather_b_chunk[c]
        if per_unit:
            u = int(units[c])
            root, first = float(root_chunk[c]), float(first_root_chunk[c])
            # Megatron-FSDP ZeRO-3: the units' gathers and reduce-scatters without the parameters outside them, which
            # are gathered once a step in their own buckets (the embedding's, the rest's) and reduce-scattered in
            # every backward (the embedding's last)
            msgs.append((c, "z3_ag", "all_gather", max(gather_b - root * db, 0.0) / u, dp_l, u))
            msgs.append((c, "z3_rs", "reduce_scatter", max(params_chunk[c] - root, 0.0) * grad_b / u, dp_l, u))
            fsdp_root = 0.0 if fsdp_root_chunk is None else min(float(fsdp_root_chunk[c]), float(params_chunk[c]))
            if fsdp_root > 0 and not shard_grad_op and params_chunk[c] > 0:
                # FSDP's root unit stays gathered through the backward: its re-gathers are the blocks' alone
                kept_b = fsdp_root * gather_b / params_chunk[c]
                msgs.append((c, "z3_ag_bwd", "all_gather", max(gather_b - kept_b, 0.0) / u, dp_l, u))
            for role, n_params in (("z3_root_first", first), ("z3_root", root - first)):
                if n_params > 0:
                    msgs.append((c, role + "_ag", "all_gather", n_params * db, dp_l, 1))
                    msgs.append((c, role + "_rs", "reduce_scatter", n_params * grad_b, dp_l, 1))
        elif par.zero >= 1:
            # the distributed optimizer gathers each parameter over the ranks that shard it: dense ones over the DP
            # group, expert ones over the expert-DP group (their own buffers in Megatron-Core), one after the other
            ex = expert_chunk[c] / params_chunk[c] if params_chunk[c] > 0 else 0.0
            bk = None if ddp_buckets_chunk is None else ddp_buckets_chunk.get(c)
            if bk is not None and len(bk) and ex <= 0 and params_chunk[c] > 0:
                # Megatron-Core gathers bucket group by bucket group (_ParamAndGradBucketGroup.start_param_sync, one
                # coalesced all-gather each: param_and_grad_buffer.py l. 250-290; DistributedDataParallel.
                # start_param_sync loops over them, distributed_data_parallel.py l. 482-483), the bucketed chunk's
                # buckets as its gradient's: the last (the embedding's, the first forward's) apart, at the chunk's
                # bytes per parameter (FP8 ones at 1 B); until stop 48 one all-gather of the whole chunk
                per_param_b = gather_b / params_chunk[c]
                bk = np.asarray(bk, dtype=float)
                if len(bk) > 1:
                    msgs.append((c, "gather", "all_gather", float(bk[:-1].mean()) * per_param_b, dp_l, len(bk) - 1))
                msgs.append((c, "gather_last", "all_gather", float(bk[-1]) * per_param_b, dp_l, 1))
            elif ex <= 0 or ep_dp == dp_l:
                msgs.append((c, "gather", "all_gather", gather_b, dp_l, 1))
            else:
                for share, group in ((1.0 - ex, dp_l), (ex, ep_dp)):
                    if share > 0 and group.size > 1:
                        msgs.append((c, "gather", "all_gather", gather_b * share, group, 1))
    ms_of = np.zeros(len(msgs))
    by_kind: dict[tuple, list[int]] = {}
    for i, m in enumerate(msgs):
        by_kind.setdefault((m[2], m[4]), []).append(i)
    for (o, grp), idx in by_kind.items():
        ms_of[idx] = collective_ms(cm, [o] * len(idx), [msgs[i][3] for i in idx], grp, cl)[0]
    buckets: list[list[np.ndarray]] = [[] for _ in range(n_chunks)]
    for (c, role, _o, msg_b, _g, nb), t_ms in zip(msgs, ms_of):
        if role == "bucket":
            buckets[c].append(np.full(nb, t_ms))
            out["sync_bytes"][c] += nb * msg_b
        elif role == "gather":
            out["gather_after_ms"][c] += nb * t_ms
            out["gather_bytes"][c] += nb * msg_b
        elif role == "gather_last":  # the bucketed chunk's last bucket's gather (what its first forward waits for)
            out["gather_after_ms"][c] += t_ms
            out["gather_bytes"][c] += msg_b
            out["gather_last_ms"][c] = t_ms
        elif role in ("z2_rs", "z2_rs_last", "z2_rs_rest"):
            # ZeRO-2 every micro-batch: nb buckets of t_ms each per backward, the last at its end (z2_rs: equal buckets,
            # the last one of them; z2_rs_last: Megatron-FSDP's last bucket, the embedding's, and z2_rs_rest the others)
            out["z2_b_ms"][c] += nb * t_ms
            if role != "z2_rs_rest":
                out["z2_last_b_ms"][c] += t_ms
            out["z2_bytes"][c] += nb * msg_b
            out["z2_n"][c] += nb
        elif role in ("z3_root_first_ag", "z3_root_ag"):  # once a step: the parameters outside the units' gathers
            out["z3_root_f_ms"][c] += t_ms
            out["z3_root_f_bytes"][c] += msg_b
            out["z3_root_f_n"][c] += 1
            if role == "z3_root_first_ag":
                out["z3_root_first_f_ms"][c] += t_ms
        elif role in ("z3_root_first_rs", "z3_root_rs"):  # every backward: their buckets' reduce-scatters
            out["z3_b_ms"][c] += t_ms
            out["z3_b_bytes"][c] += msg_b
            out["z3_b_n"][c] += 1
            if role == "z3_root_first_rs":  # the embedding's, the backward's last (instead of a unit's)
                out["z3_first_b_ms"][c] += t_ms
        else:  # ZeRO-3 (and FSDP's ZeRO-2): nb units' collectives of t_ms each
            if role == "z3_ag":
                out["z3_f_ms"][c] = nb * t_ms
                out["z3_first_f_ms"][c] = t_ms
                out["z3_f_bytes"][c] += nb * msg_b
                out["z3_f_n"][c] += nb
                if shard_grad_op:  # the forward's gathers are kept through the backward: no re-gather
                    continue
                if fsdp_root_chunk is not None and float(fsdp_root_chunk[c]) > 0:
                    continue  # the backward's re-gathers without FSDP's root unit: z3_ag_bwd
            out["z3_b_ms"][c] += nb * t_ms
            if not (role == "z3_rs" and first_root_chunk[c] > 0):  # else the embedding's reduce-scatter is the last
                out["z3_first_b_ms"][c] += t_ms
            out["z3_b_bytes"][c] += nb * msg_b
            out["z3_b_n"][c] += nb
    for c in range(n_chunks):
        ms = np.concatenate(buckets[c]) if buckets[c] else np.zeros(0)
        out["bucket_ms"].append(ms)
        out["sync_ms"][c] = ms.sum()
    return _stage_buckets(out, P, V)


def dp_zero2_meta(dpt: dict, by_stage, *, every_micro: bool, shard_grad_op: bool) -> dict:
    """The ``dp_zero2_*`` entries of a prediction's ``comm`` from :func:`_dp_times`' terms ``dpt`` (``by_stage``: a
    chunk array's per-stage sums), the busiest stage's figures of one micro-batch's backward, or {} for any other ZeRO:

    - ZeRO-2 reducing every micro-batch (``every_micro``, :func:`grad_reduce_every_micro`: Megatron-FSDP
      optim_grads, DeepSpeed stage 2): the gradient reductions of one backward (``dp_sync_ms`` is then 0: nothing
      left after the step), their bytes and count (a rank's collectives, the dense and the expert groups');
    - PyTorch FSDP's ZeRO-2 (``shard_grad_op``, SHARD_GRAD_OP: :func:`fsdp_shard_grad_op`): the units'
      reduce-scatters of one backward as above, and the forward's parameter all-gathers (kept for the backward: none
      in it), ``dp_zero2_gather_*``."""
    if not (every_micro or shard_grad_op):
        return {}
    ms, nbytes, count = ("z3_b_ms", "z3_b_bytes", "z3_b_n") if shard_grad_op else ("z2_b_ms", "z2_bytes", "z2_n")
    out = dict(dp_zero2_ms_per_micro=float(by_stage(dpt[ms]).max()),
               dp_zero2_bytes_per_micro=float(by_stage(dpt[nbytes]).max()),
               dp_zero2_collectives_per_micro=int(by_stage(dpt[count]).max()))
    if shard_grad_op:
        out.update(dp_zero2_gather_ms_per_micro=float(by_stage(dpt["z3_f_ms"]).max()),
                   dp_zero2_gather_bytes_per_micro=float(by_stage(dpt["z3_f_bytes"]).max()),
                   dp_zero2_gathers_per_micro=int(by_stage(dpt["z3_f_n"]).max()))
    return out


def _stage_buckets(out: dict, P: int, V: int) -> dict:
    """``out`` with each stage's buckets (its chunks' in chunk order) as one zero-padded matrix."""
    per_stage = [np.concatenate([out["bucket_ms"][c * P + s] for c in range(V)]) for s in range(P)]
    n = np.array([len(x) for x in per_stage], dtype=np.int64)
    pad = np.zeros((P, int(n.max()) if len(n) else 0))
    for s, x in enumerate(per_stage):
        pad[s, : len(x)] = x
    out["bucket_pad"], out["bucket_n"] = pad, n
    return out


def chunk_reduce_spans_ms(chunk_ms: np.ndarray, ready_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end), each (stages, chunks) in ms, of every model chunk's gradient reduction on its stage's one
    data-parallel stream under interleaved 1F1B with Megatron-Core's per-chunk grad buffers. ``chunk_ms``: the time of a
    chunk's buckets together; ``ready_ms``: when the chunk's reduction is launched (the end of its last backward on the
    stage). The chunks' last backwards come in the order v-1..0 (the stage's final backward tasks cycle through the
    chunks that way), so the chunks queue in that order: each one's buckets back to back from when it is ready and the
    stream is free (the FIFO of :func:`~wattcast.simulate.scheduler.bucket_spans`, per chunk; a chunk without buckets
    takes no time)."""
    d = np.asarray(chunk_ms, dtype=float)[:, ::-1]
    start, end = bucket_spans(np.where(d > 0, np.asarray(ready_ms, dtype=float)[:, ::-1], -np.inf), d)
    return start[:, ::-1], end[:, ::-1]


def param_gather_ms(f_first_ms: np.ndarray, gather_ms: np.ndarray, n_buckets: np.ndarray, share: float, *,
                    first_forward_ms: np.ndarray | None = None, first_stages=(0,), stretch=None) -> np.ndarray:
    """What the overlapped parameter all-gather (``--overlap-param-gather``, one model chunk a stage) adds to each
    stage's step, ms: gathered bucket by bucket in the next step's forward pre-hooks, the first bucket waited for, the
    rest beside the first micro-batch's forward (slowing it by ``share``), what outlasts that forward exposed.
    ``first_forward_ms`` (per stage, from the step's start): Megatron-Core's bucketing, where a stage after the first
    gathers its parameters in one piece (no buckets past the first stage), dispatched as the step starts and waited for
    before its first forward, which the warm-up reaches late anyway: such a stage is late by what outlasts that wait,
    and by at least the first stage's delay, which its inputs carry. ``first_stages``: the stages (ranks) holding the
    first stage's chunk (DualPipe: rank 0 and rank P-1), bucketed as it. ``stretch``: overlapped_ms' (the SMs and the
    DRAM bandwidth the gathers share with the forward, overlap.hbm_stretch; None: ``share`` of the SMs alone)."""
    f = np.asarray(f_first_ms, dtype=float)
    g = np.asarray(gather_ms, dtype=float)
    exposed = overlapped_ms(f, g, share=share, first_chunk_ms=g / n_buckets, stretch=stretch) - f
    if first_forward_ms is not None and len(g) > 1:
        first = np.isin(np.arange(len(g)), first_stages)
        later = np.maximum(g - np.asarray(first_forward_ms, dtype=float), 0.0)
        exposed = np.where(first, exposed, np.maximum(later, exposed[first].max()))
    return exposed


def interleaved_param_gather_ms(gather_ms: np.ndarray, first_forward_ms: np.ndarray, share: float) -> np.ndarray:
    """What the distributed optimizer's overlapped parameter all-gather (``--overlap-param-gather``) adds to each stage's
    step under interleaved 1F1B, ms per stage. ``gather_ms`` (stages, chunks): each chunk's all-gather;
    ``first_forward_ms`` (stages, chunks): when each chunk's first forward starts in the step without it.

    Megatron-Core with virtual pipeline stages (``align_param_gather``, Megatron-LM's default under interleaving):
    ``forward_backward_pipelining_with_interleaving`` dispatches the all-gathers of chunks 0 and 1 when the step starts
    (each chunk's ``DistributedDataParallel.start_param_sync``: all of the chunk's bucket groups) and chunk c >= 2's
    while chunk c-1 is about to run its first micro-batch, and the forward pre-hooks only wait (``finish_param_sync`` with
    ``skip_next_bucket_dispatch``). They run one after the other on the data-parallel communicator, and a chunk's bucket
    groups are dispatched in bucket order, the end of the chunk first (``_ParamAndGradBuffer`` fills buckets walking the
    parameters backwards): chunk 0's first forward waits for the whole of chunk 0's gather, and chunk c's first forward
    for the gathers of chunks 0..c. With ``cum_c`` the end of chunk c's gather and ``lead_c`` the time from chunk 0's first
    forward to chunk c's, the stage starts ``max_c (cum_c - lead_c)`` late (at least chunk 0's gather); the gathers it
    does not wait for run beside its computation and slow it by ``share`` (NCCL's SMs, simulate/overlap.py). Every
    stage dispatches at the step's start, so a later stage's gathers also run during its warm-up wait: it is late by
    what outlasts its own first forwards (``first_forward_ms`` from the step's start), and by at least the first
    stage's delay, which its inputs carry (until stop 37 each stage was charged from its own first forward on). Stated
    simplification: chunk c >= 2's gather is queued from the step's start (Megatron-Core dispatches it p + rank forward
    tasks before the chunk's first forward; the same unless a chunk's gather outlasts that lead)."""
    g = np.asarray(gather_ms, dtype=float)
    ff = np.asarray(first_forward_ms, dtype=float)
    cum = np.cumsum(g, axis=1)
    own = np.maximum(np.max(cum - (ff - ff[:1, :1]), axis=1), 0.0)
    late = np.maximum(own, own[0])
    return late + share * np.maximum(cum[:, -1] - late, 0.0)


def cp_tensor_bytes(hf, *, micro_batch: int, seq_rank: int, tp: int, dtype_bytes: float) -> tuple:
    """(Q, K, V, output) bytes of one layer on one context-parallel rank: ``seq_rank`` tokens (seq / cp), the heads of
    one TP rank (multi-head latent attention: queries and keys qk_nope + qk_rope wide, values and output v_head_dim)."""
    if hf.family == "deepseek":
        qk = sum(deepseek_field(hf, k) for k in ("qk_nope_head_dim", "qk_rope_head_dim"))
        vw = deepseek_field(hf, "v_head_dim")
    else:
        qk = vw = hf.head_dim
    tok = float(micro_batch * seq_rank) * dtype_bytes
    # one key/value head a rank when there are fewer than TP ranks (Megatron-Core's gathered group: parallel.py)
    h, hkv = hf.n_heads // tp, max(hf.n_kv_heads // tp, 1)
    return (tok * h * qk, tok * hkv * qk, tok * hkv * vw, tok * h * vw)


def cp_collectives(comm_type: str, cp: int, qkvo_bytes) -> tuple[list, list]:
    """The collectives context parallelism runs besides any KV ring, per layer: (forward, backward) lists of (kernel,
    bytes), bytes as the rank graph's collectives give them (an all-to-all: the tensor; an all-gather / reduce-scatter:
    the gathered tensor). From Transformer Engine 2.x transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py:

    - a2a and the a2a part of a2a+p2p (``AttnFuncWithCPAndQKVOA2A``, ``AttnFuncWithCPAndKVP2P`` with cp_size_a2a > 1,
      both through ``flash_attn_a2a_communicate``): forward, one ``all_to_all_single`` each of Q, K, V before the
      attention and of the output after it; backward, of dout before and dQ, dK, dV after. Each waits before the
      attention (the next tensor's all-to-all overlaps only the previous one's reorder copy): exposed.
    - allgather (``AttnFuncWithCPAndKVAllGather``, "KV all-gather between CP ranks is exposed"): forward,
      ``gather_along_first_dim`` of K and of V (cp x this rank's); backward, the same two all-gathers again (the
      gathered K/V are not kept: ``save_for_backward`` holds this rank's q, k, v, out) and ``reduce_scatter_along_first_dim``
      of dK and dV (gathered size in, this rank's out)."""
    q, k, v, o = (float(x) for x in qkvo_bytes)
    if comm_type in ("a2a", "a2a+p2p"):
        return ([("all_to_all", q), ("all_to_all", k), ("all_to_all", v), ("all_to_all", o)],
                [("all_to_all", o), ("all_to_all", q), ("all_to_all", k), ("all_to_all", v)])
    if comm_type == "allgather":
        ag = [("all_gather", cp * k), ("all_gather", cp * v)]
        return ag, ag + [("reduce_scatter", cp * k), ("reduce_scatter", cp * v)]
    return [], []


def cp_collective_ms(cm, cl: ClusterSpec, par: ParallelConfig, qkvo_bytes, lay: dict, *, host_floor_ms=None) -> tuple:
    """(forward, backward) ms per layer of :func:`cp_collectives` (0, 0 for the ring alone), each collective at least the
    framework's host floor for its group (``host_floor_ms(group size)``; None: none). The all-to-all group of a2a+p2p
    is the inner one (``lay["cp_a2a"]``: consecutive CP ranks, tp apart); a2a's and allgather's the CP group
    (``lay``: :func:`~wattcast.simulate.parallel.layouts` of ``par``)."""
    if par.cp <= 1 or par.cp_comm_type == "p2p":
        return 0.0, 0.0
    gl = lay["cp_a2a" if par.cp_comm_type != "allgather" else "cp"]
    floor = 0.0 if host_floor_ms is None else float(host_floor_ms(gl.size))
    out = []
    for coll in cp_collectives(par.cp_comm_type, par.cp, qkvo_bytes):
        if not coll:
            out.append(0.0)
            continue
        ms = collective_ms(cm, [c[0] for c in coll], [c[1] for c in coll], gl, cl)[0]
        out.append(float(np.maximum(ms, floor).sum()))
    return tuple(out)


def _cp_collective_layers(view: _RankView) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per layer, whether it runs the CP all-to-alls / all-gathers (:func:`cp_collectives`, exposed) of one attention
    layer: (in its forward, in its backward the backward's, in its backward the forward's again). Every attention layer
    runs them; a recomputed attention runs its forward's again (Megatron-Core checkpoints the whole core attention,
    collectives included)."""
    return view.attn_f_ms > 0, view.attn_b_ms > 0, view.attn_rc_ms > 0


def _plus_cp_collectives(view: _RankView, cp_coll_ms: tuple, f_ms=0.0, b_ms=0.0) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, ``f_ms`` and ``b_ms`` (forward, backward) plus the CP all-to-alls / all-gathers where
    :func:`_cp_collective_layers` runs them (``cp_coll_ms``: their (forward, backward) ms, :func:`cp_collective_ms`)."""
    cf, cb = cp_coll_ms
    on_f, on_b, on_rc = _cp_collective_layers(view)
    return f_ms + np.where(on_f, cf, 0.0), b_ms + np.where(on_b, cb, 0.0) + np.where(on_rc, cf, 0.0)


def ring_backward_steps(ring: int) -> tuple[int, int]:
    """The ring attention backward's steps by what they send: (steps sending one K/V-sized block, steps sending two).
    Transformer Engine 2.20.2 ``AttnFuncWithCPAndKVP2P.backward`` (transformer_engine/pytorch/attention/
    dot_product_attention/context_parallel.py l. 2694-2730, waits l. 2952-2954) runs ``cp_size`` steps over the ring
    (``ring`` ranks); step 0 sends K/V only (``send_tensor[0]``), the last dK/dV only (``send_tensor[1]``), the steps
    between both, and each step's transfer is waited for after that step's attention block: 2 one-block steps and
    ring - 2 two-block steps, 2 x (ring - 1) blocks in all (until stop 48: ring - 1 two-block steps, one block fewer to
    hide behind)."""
    return (2, ring - 2) if ring > 1 else (0, 0)


def cp_event_args(what: str, direction: str, micro: int, transfer_ms: float, exposed_ms: float, ring: int,
                  kv_step_ms: tuple, cp_comm_type: str) -> dict:
    """The args of one trace event of context parallelism's communication (``cp.ring_kv``, ``cp.a2a_qkvo``,
    ``cp.allgather_kv``): the event lasts ``exposed_ms``, what it adds to its task (as the tp.* / ep.* events);
    ``transfer_ms`` is what the communication takes, hidden or not, ``hidden_ms`` the part of it behind the
    attention's ring steps (a ring's KV exchange; the all-to-alls and all-gathers are waited for: none hidden)."""
    out = dict(micro_batch=int(micro), direction=direction, cp_comm_type=str(cp_comm_type),
               duration="exposed: what it adds to the task", transfer_ms=float(transfer_ms),
               exposed_ms=float(exposed_ms), hidden_ms=float(max(transfer_ms - exposed_ms, 0.0)))
    if what == "ring_kv":
        out.update(ring_ranks=int(ring), kv_step_ms=float(kv_step_ms[0]), kv_and_grad_step_ms=float(kv_step_ms[1]))
    return out


def _ring_step_ms(attn_ms: np.ndarray, diag_ms: np.ndarray, ring: int) -> tuple[np.ndarray, np.ndarray]:
    """(the diagonal ring step's kernel time, each off-diagonal step's) per layer, from a layer's ring attention time
    ``attn_ms`` (its ``ring`` per-step kernels) and its diagonal step's ``diag_ms``; a layer without the split (0) takes
    the mean step, attn / ring, for both."""
    attn, diag = np.asarray(attn_ms, dtype=float), np.asarray(diag_ms, dtype=float)
    split = (diag > 0) & (ring > 1)
    mean = attn / ring
    return np.where(split, diag, mean), np.where(split, (attn - diag) / max(ring - 1, 1), mean)


def ring_backward_transfer_ms(ring: int, xf_ms, xb_ms):
    """What the ring attention backward's transfers take per layer, hidden or not (:func:`ring_backward_steps`; xf_ms:
    a one-block step, xb_ms: a two-block step)."""
    n1, n2 = ring_backward_steps(ring)
    return n1 * xf_ms + n2 * xb_ms


def _comm_parts(view: _RankView, par: ParallelConfig, spec: DeviceSpec, cm, cl: ClusterSpec, lay: dict,
                cp_kv_bytes: float, per_chunk, *, cp_step_floor_ms: float = 0.0,
                ep_unpaired: np.ndarray | None = None, cp_coll_ms: tuple = (0.0, 0.0), async_tp_b: bool = False,
                hbm_gbps: float | None = None) -> tuple:
    """Per communication class, what it adds to each chunk's forward and backward (ms), the ring attention's KV step
    times and its exposed time per layer: (f_parts, b_parts, cp_step_ms, cp_f_ms, cp_b_ms).

    ``cp_step_floor_ms``: a ring step takes at least this long (the host's work for it: ``FRAMEWORK_CP_STEP_HOST_MS``).
    ``cp_coll_ms``: (forward, backward) ms per attention layer of the CP all-to-alls / all-gathers (cp_collective_ms),
    exposed in full (a recomputed attention runs its forward ones again in the backward); the ring, where
    ``--cp-comm-type`` has one (p2p; a2a+p2p's outer group), has ``cp_group_sizes(par)[1]`` ranks.
    ``ep_unpaired``: per chunk, the share of its tasks the MoE all-to-all overlap finds no partner for (a stage's
    warm-up forwards and cool-down backwards): their all-to-alls are exposed in full.
    ``async_tp_b``: the column-parallel linears start their backward TP collectives asynchronously (Megatron-Core, TE
    or local layers): without ``--tp-comm-overlap`` the backward's TP time is lowered by ``view.tp_b_async_save_ms``.
    ``hbm_gbps``: the achievable DRAM bandwidth the overlapped collectives share with the computation
    (overlap.hbm_stretch; None: they share its SMs alone)."""
    # context parallelism: ring attention passes K and V round the cp ranks in cp - 1 steps, each overlapped with the
    # attention of the block in hand; the backward runs cp steps (step 0 sends K/V, the last dK/dV, the others both:
    # ring_backward_steps); what a step's transfer takes beyond that block's attention is exposed (Liu et al. 2023,
    # Ring Attention; Megatron-Core / TE's implementation). A step is never shorter than its host work where the host
    # sets the pace (``cp_step_floor_ms``).
    cp_f_ms = cp_b_ms = np.zeros(len(view.layer_ids))
    cp_step_ms = (0.0, 0.0)
    ring = cp_group_sizes(par)[1]
    if par.cp > 1 and cp_kv_bytes > 0 and ring > 1:
        # the ring's KV block is the same size under a2a+p2p (after the inner all-to-all a rank holds a2a x its tokens
        # of 1/a2a of the heads: AttnFuncWithCPAndKVP2P); its ranks are a2a x tp apart (``lay["cp_ring"]``)
        xf, xb = collective_ms(cm, ["send_recv", "send_recv"], [cp_kv_bytes, 2.0 * cp_kv_bytes], lay["cp_ring"], cl)[0]
        xf, xb = max(float(xf), cp_step_floor_ms), max(float(xb), cp_step_floor_ms)
        cp_step_ms = (float(xf), float(xb))
        # each transfer against the ring step it runs beside (TE 2.20.2 AttnFuncWithCPAndKVP2P, context_parallel.py):
        # forward, step i sends the K/V of step i + 1 while step i's kernel runs (l. 1925-1943: wait for step i's,
        # start i + 1's), so the cp - 1 transfers overlap the diagonal step 0 and cp - 2 off-diagonal steps; backward,
        # step i's transfer starts before its kernel and is waited for after it (l. 2721-2729, 2952-2954): step 0
        # (K/V only) and steps 1 .. cp - 2 (K/V and dK/dV) beside off-diagonal steps, the last (dK/dV only) beside the
        # diagonal one (l. 2816). The diagonal is causal s x s, the others s x s/2 or s/2 x s, timed apart
        # (single_device._flash_ms); until stop 58 every step was the attention's mean, a 1/ring share of one kernel
        f_diag, f_off = _ring_step_ms(view.attn_f_ms, view.attn_diag_f_ms, ring)
        b_diag, b_off = _ring_step_ms(view.attn_b_ms, view.attn_diag_b_ms, ring)
        cp_f_ms = np.where(view.attn_f_ms > 0, np.maximum(xf - f_diag, 0.0)
                           + (ring - 2) * np.maximum(xf - f_off, 0.0), 0.0)
        _, n2 = ring_backward_steps(ring)  # (2, ring - 2): step 0 and the last send one block
        cp_b_ms = np.where(view.attn_b_ms > 0, np.maximum(xf - b_off, 0.0) + np.maximum(xf - b_diag, 0.0)
                           + n2 * np.maximum(xb - b_off, 0.0), 0.0)
        # a recomputed attention (selective or full recomputation) re-runs its forward ring in the backward: its KV
        # steps again, each beside a step of the re-run forward (until stop 36 the re-run's time hid the backward's
        # transfers instead, and the recomputed ring was free)
        rc_diag, rc_off = _ring_step_ms(view.attn_rc_ms, view.attn_diag_rc_ms, ring)
        cp_b_ms = cp_b_ms + np.where(view.attn_rc_ms > 0, np.maximum(xf - rc_diag, 0.0)
                                     + (ring - 2) * np.maximum(xf - rc_off, 0.0), 0.0)
    if par.cp > 1 and (cp_coll_ms[0] > 0 or cp_coll_ms[1] > 0):
        cp_f_ms, cp_b_ms = _plus_cp_collectives(view, cp_coll_ms, cp_f_ms, cp_b_ms)
    # per communication class, what it adds to each chunk's forward and backward (collectives in the rank graph by
    # group; --tp-comm-overlap pipelines the TP ones with the GEMMs: simulate/overlap.py)
    f_parts = {"cp": per_chunk(cp_f_ms)}
    b_parts = {"cp": per_chunk(cp_b_ms)}
    for grp, (cf, cb) in view.coll_by_group.items():
        # the experts' TP collectives (the dispatcher's gather over the etp group) report as TP; Transformer Engine's
        # --tp-comm-overlap pipelines the TE linear layers' own collectives only, not the MoE dispatcher's
        key = "tp" if grp in ("", "etp") else grp
        # the overlapped collectives' DRAM traffic, forward and backward (overlap.collective_hbm_bytes)
        cbytes = (view.coll_bytes_by_group or {}).get(grp, {})
        hbm_on = hbm_gbps is not None and view.hbm is not None
        if grp in ("", "tp") and par.tp_comm_overlap:
            ub_f, ub_b = (collective_hbm_bytes({o: v[i] for o, v in cbytes.items()}, par.tp, userbuffers=True)
                          for i in (0, 1))
            # each userbuffers method's SMs (overlap.UB_METHOD_SMS: ring exchange 1, pipeline and bulk 16); until stop
            # 59 every one held 2
            cf = tp_overlap_layer_ms(view.gemm_f_ms, cf, tp=par.tp, num_sms=spec.num_sms, coll_hbm_bytes=ub_f,
                                     gemm_hbm=view.hbm["gemm_f"] if hbm_on else None,
                                     hbm_gbps=hbm_gbps if hbm_on else None,
                                     method_ms=None if view.tp_pipeline_f_ms is None or grp != "tp"
                                     else {"pipeline": view.tp_pipeline_f_ms}) - view.gemm_f_ms
            cb = tp_overlap_layer_ms(view.gemm_b_ms, cb, tp=par.tp, num_sms=spec.num_sms, coll_hbm_bytes=ub_b,
                                     gemm_hbm=view.hbm["gemm_b"] if hbm_on else None,
                                     hbm_gbps=hbm_gbps if hbm_on else None,
                                     method_ms=None if view.tp_bulk_b_ms is None or grp != "tp"
                                     else {"bulk": view.tp_bulk_b_ms}) - view.gemm_b_ms
        elif grp == "tp" and async_tp_b and view.tp_b_async_save_ms is not None:
            cb = np.maximum(cb - view.tp_b_async_save_ms, 0.0)
        elif key == "ep" and par.overlap_moe_expert_parallel_comm:
            pf, pb = ep_overlap_layer_ms(view.f_nc_ms, view.b_nc_ms, cf, cb, num_sms=spec.num_sms,
                                         mlp_f_ms=view.moe_mlp_f_ms, mlp_b_ms=view.moe_mlp_b_ms,
                                         dispatch_f_ms=view.a2a_dispatch_f_ms, dispatch_b_ms=view.a2a_dispatch_b_ms,
                                         hbm=dict(gbps=hbm_gbps, f=view.hbm["f"], b=view.hbm["b"],
                                                  mlp_f=view.hbm["mlp_f"], mlp_b=view.hbm["mlp_b"],
                                                  **{f"a2a_{d}_bytes": collective_hbm_bytes(
                                                      {o: v[i] for o, v in cbytes.items()}, par.ep)
                                                     for i, d in enumerate("fb")}) if hbm_on else None)
            u = 0.0 if ep_unpaired is None else ep_unpaired  # the unpaired tasks keep their all-to-alls in series
            f_parts[key] = f_parts.get(key, 0.0) + (1.0 - u) * per_chunk(pf) + u * per_chunk(cf)
            b_parts[key] = b_parts.get(key, 0.0) + (1.0 - u) * per_chunk(pb) + u * per_chunk(cb)
            continue
        f_parts[key] = f_parts.get(key, 0.0) + per_chunk(cf)
        b_parts[key] = b_parts.get(key, 0.0) + per_chunk(cb)
    return f_parts, b_parts, cp_step_ms, cp_f_ms, cp_b_ms


#: the trace's TP / EP collective events: class of ``_comm_parts`` -> event name (the collectives it runs)
_TASK_COMM_EVENTS = {"tp": ("tp.all_reduce", "tp.all_gather+reduce_scatter"), "ep": "ep.all_to_all",
                     "tp_ep": "tp_ep.all_gather+reduce_scatter"}


def _task_comm_names(par: ParallelConfig, dispatcher: str, f_parts: dict) -> list[tuple[str, str]]:
    """(class, event name) of the TP and EP collectives a trace draws per task: ``tp`` (Megatron's all-reduces, or
    under sequence parallelism its all-gathers and reduce-scatters; the experts' TP gather too), ``ep`` (the MoE
    all-to-alls; the all-gather dispatcher's ep group: all-gathers and reduce-scatters) and ``tp_ep`` (the all-gather
    dispatcher's expert-TP x EP group), where the step has them."""
    out = []
    for key, name in _TASK_COMM_EVENTS.items():
        if key not in f_parts:
            continue
        if key == "tp":
            name = name[1] if par.sp else name[0]
        elif key == "ep" and str(dispatcher).lower() == "allgather":
            name = "ep.all_gather+reduce_scatter"
        out.append((key, name))
    return out


def _data_loading(ctx: ScheduleContext, f_nc: np.ndarray, b_nc: np.ndarray, P: int, V: int) -> tuple[np.ndarray, dict | None]:
    """(ms per micro-batch added to each chunk's forward, the figures by stage; None for a search's summary) of loading
    the batch: the first chunk reads the tokens, the last the labels (one chunk: both). The loader's exposed time
    depends on each stage's computation per micro-batch (``f_nc`` + ``b_nc``: what prefetching workers hide it behind);
    the rest on the framework, the micro-batch and the TP group alone (kept in the search's memo)."""
    n_chunks = P * V
    framework = ctx.opts.framework
    tp_lay = ctx.lay["tp"]
    memo = ctx.memo if ctx.memo is not None else {}
    base = (framework, ctx.par.micro_batch, ctx.seq, tp_lay, id(ctx.cm), id(ctx.cl), ctx.launch_ms,
            None if ctx.coll_floor is None else tuple(ctx.coll_floor.items()))
    where = {0: "single"} if n_chunks == 1 else {0: "first", n_chunks - 1: "last"}
    # an imported graph (ONNX, torch.export): its inputs are not known as a token batch, so no copy is costed
    tokens = bool(ctx.g.meta.get("hidden"))
    static_key = ("data_f", P, V, tokens, base)
    hit = memo.get(static_key)
    if hit is None:  # what does not depend on the computation: once per (pipeline split, micro-batch, TP group)
        static = np.zeros(n_chunks)
        parts = {}
        for c, w in where.items():
            nbytes, copies, sizes, kernels = (stage_copy(framework, ctx.par.micro_batch, ctx.seq, w) if tokens
                                              else (0.0, 0, [], 0))
            bcast = 0.0
            if sizes and tp_lay.size > 1:
                ms, _ = collective_ms(ctx.cm, ["broadcast"] * len(sizes), sizes, tp_lay, ctx.cl)
                floor = max(collective_host_floor_ms(framework, tp_lay.size, ctx.coll_floor), ctx.launch_ms)
                bcast = float(np.maximum(ms, floor).sum())
            parts[w] = stage_figures(c % P, h2d_ms=h2d_copy_ms(nbytes, copies), nbytes=nbytes, copies=copies,
                                     broadcast_ms=bcast, broadcasts=len(sizes) if tp_lay.size > 1 else 0,
                                     kernels_ms=kernels * ctx.launch_ms, kernels=kernels)
            static[c] = parts[w]["total_ms"]
        hit = memo[static_key] = (static, parts)
    static, parts = hit
    out = static
    loaders = {}
    if ctx.data_load_ms > 0:
        stage_compute = (f_nc + b_nc).reshape(V, P).sum(axis=0)
        out = static.copy()
        for c, w in where.items():
            loaders[w] = loader_exposed_ms(ctx.data_load_ms, ctx.data_workers, float(stage_compute[c % P]))
            out[c] += loaders[w]
    if ctx.summary:
        return out, None
    info = {w: dict(parts[w], loader_ms=loaders.get(w, 0.0), total_ms=float(out[c])) for c, w in where.items()}
    return out, dict(per_micro=info, load_ms=ctx.data_load_ms, workers=ctx.data_workers,
                     step_ms=float(out.reshape(V, P).sum(axis=0).max() * ctx.n_micro),
                     **({} if tokens else {"note": NOT_A_TOKEN_BATCH}))


def _pp_send_event(stage: int, forward: bool, micro: int, suffix: str, start_ms: float, end_ms: float, **args) -> dict:
    """A pipeline transfer's trace event on ``stage``'s communication stream: ``pp.send_activations<micro>`` (a
    forward's activations on to the next stage) or ``pp.send_input_grad<micro>`` (a backward's input gradient back),
    ``suffix`` after it (the chunk under interleaving), ``args`` its ends, micro-batch, bytes, ... (simulate/trace.py)."""
    name = ("pp.send_activations" if forward else "pp.send_input_grad") + f"{micro}{suffix}"
    return dict(stage=stage, stream="comm", name=name, start_ms=start_ms, end_ms=end_ms, args=args)


def schedule_step(ctx: ScheduleContext) -> DistributedPrediction:
    """One step of ``ctx.par`` (see the module docstring, items 2-5)."""
    (model, g, view, spec, cl, par, lay, cm, batch, seq, n_micro, n_layers, dtype, opts, trace, iteration_ms,
     power_limit_w, model_totals, stream_gbps, power_model, cp_kv_bytes, comm_split, prune_oom) = (
        ctx.model, ctx.g, ctx.view, ctx.spec, ctx.cl, ctx.par, ctx.lay, ctx.cm, ctx.batch, ctx.seq, ctx.n_micro,
        ctx.n_layers, ctx.dtype, ctx.opts, ctx.trace, ctx.iteration_ms, ctx.power_limit_w, ctx.model_totals,
        ctx.stream_gbps, ctx.power_model, ctx.cp_kv_bytes, ctx.comm_split, ctx.prune_oom)
    P, V = par.pp, par.interleave
    n_chunks = P * V
    deepspeed = opts.framework == "megatron-deepspeed"
    memo = ctx.memo
    # DualPipe (simulate/dualpipe.py): rank s holds stage s and stage P-1-s, its figures are the two chunks' (rank_sum)
    dual = par.schedule == "dualpipe"
    # (P, V), not their product: chunk_layers splits the layers by both (pp 8 x v 1 and pp 4 x v 2 differ), and a
    # search's memo met them in either order (an order-dependent step time until stop 47)
    chunk_key = ("chunks", id(view), n_layers, P, V, par.pp_first_layers, par.pp_last_layers, deepspeed, dual,
                 ctx.stage_split)
    hit = memo.get(chunk_key) if memo is not None else None
    if hit is None:
        # the automatic split of layers that do not divide the stages balances the stages' work, the embedding on the
        # first and the output layer with the loss on the last counted at their cost (parallel.balanced_stage_layers);
        # not under DualPipe (rank s runs stages s and P-1-s: both ends on each outer rank) nor DeepSpeed's partitioner
        edge = None if dual or deepspeed else edge_layer_equivalents(view, n_layers)
        counts = chunk_layers(n_layers, P, V, first=par.pp_first_layers, last=par.pp_last_layers, deepspeed=deepspeed,
                              edge_layers=edge, stages=ctx.stage_split)
        chunk = chunk_of_layer(view.layer_ids, n_layers, n_chunks, counts)
        # the edge costs when the split is the cost-balanced one (what a split that does not fit is replaced from)
        auto_edge = (edge if edge is not None and ctx.stage_split is None and par.pp_first_layers is None
                     and par.pp_last_layers is None and P > 1 and n_layers % P else None)
        hit = (counts, chunk, {}, auto_edge)
        if memo is not None:
            memo[chunk_key] = hit
    counts, chunk, sums, auto_edge = hit
    # Megatron-Core's --pipeline-model-parallel-layout of an uneven split (parallel.pipeline_layout) and the warning
    # an automatic uneven split carries (the split, and the flags Megatron-Core builds it with)
    split_layout, split_notes = _split_report(tuple(int(x) for x in counts), n_layers, P, V, opts.framework,
                                              par.pp_first_layers is not None or par.pp_last_layers is not None, dual)
    if par.recompute_num_layers is not None:  # resolve_parallel's rule: only with full recomputation
        mix_key = ("block_rc", id(view), par.recompute_num_layers, par.recompute_method, tuple(counts))
        mixed = memo.get(mix_key) if memo is not None else None
        if mixed is None:
            if par.recompute_method == "uniform":
                mixed = _uniform_recompute_view(view, chunk, counts, n_layers, par.recompute_num_layers)
            elif ctx.keep_view is None:
                raise ParallelConfigError("--recompute-num-layers needs a context built with --recompute full")
            else:
                mixed = _block_recompute_view(view, ctx.keep_view(), chunk, counts, n_layers, par.recompute_num_layers)
            if memo is not None:
                memo[mix_key] = mixed
        view = mixed
        # per-chunk sums of this view are its own
        sums = sums.setdefault(("block_rc_sums", par.recompute_num_layers, par.recompute_method), {})

    def per_chunk(v: np.ndarray) -> np.ndarray:
        return np.bincount(chunk, weights=v, minlength=n_chunks)

    def chunk_sum(name: str) -> np.ndarray:
        """``per_chunk`` of a field of the view, once per (view, chunking) in a search."""
        out = sums.get(name)
        if out is None:
            out = sums[name] = per_chunk(getattr(view, name))
        return out

    def by_stage(v: np.ndarray) -> np.ndarray:
        """Per stage, the sum over its chunks (chunk c of stage s is v[c x P + s])."""
        return v.reshape(V, P).sum(axis=0)

    def rank_sum(v: np.ndarray) -> np.ndarray:
        """What each rank holds: ``by_stage``, or under DualPipe its two chunks' sum (stage s and stage P-1-s)."""
        return mirrored(v) if dual else by_stage(v)

    def rank_tasks(v: np.ndarray) -> np.ndarray:
        """A per-micro-batch figure of each rank's tasks: ``by_stage``, or under DualPipe the mean of its two chunks'
        (half the step's micro-batches run on each)."""
        return mirrored(v) / 2 if dual else by_stage(v)

    def opt_parts_stage() -> dict:
        """Per "op_class|part", each stage's (rank's) optimizer-phase kernels before sharding (a (4, P) array of
        :attr:`_RankView.opt_parts`' sums; the last stage's with the tied embedding copy's, as ``opt_by_stage``: the
        embedding's own per parameter, one more kernel of each kind), once per (view, chunking) in a search."""
        key = ("opt_parts", P, V)
        out = sums.get(key)
        if out is None:
            emb = view.layer_ids < 0
            p_emb = float(view.params[emb].sum())
            out = {}
            for k, a in (view.opt_parts or {}).items():
                c = np.stack([per_chunk(x) for x in a])
                if tied_params > 0 and p_emb > 0:
                    copy = a[:, emb].sum(axis=1) * (tied_params / p_emb)
                    copy[2] = float(a[2, emb].sum() > 0)
                    c[:, -1] += copy
                out[k] = np.stack([rank_sum(x) for x in c])
            sums[key] = out
        return out

    def root_chunk() -> np.ndarray:
        """:func:`root_params_by_chunk` of ``params_chunk`` (the chunks' parameters with a pipeline's tied copy), once
        per (view, chunking) in a search: the stage memory's root parameters and ZeRO-3's per-chunk gathers share it."""
        key = ("root_params_chunk", P, V)
        out = sums.get(key)
        if out is None:
            in_block = (view.layer_ids >= 0) & (view.layer_ids < n_layers)
            out = sums[key] = root_params_by_chunk(params_chunk, per_chunk(np.where(in_block, view.params, 0.0)))
        return out

    # memory per stage (one TP rank), term by term (simulate/stage_memory.py cites each equation); it needs no
    # schedule, so it comes first: a search skips the schedule of a strategy that does not fit (``prune_oom``)
    params_chunk = chunk_sum("params")
    # a pipeline's last stage holds the output layer's copy of a tied word embedding (tied_copy_params_by_chunk): its
    # weights, gradients and optimizer states in the stage's memory terms, its gradient in the DP buckets and its share
    # of the distributed optimizer's gather, like any parameter of the stage
    # (multi-token prediction's embedding lookup on the last stage needs the same copy: one table for both)
    # Under DualPipe rank 0 holds the first stage (the embedding) and the last (the head, multi-token prediction's
    # embedding lookup): one physical table and gradient, no copy and no embedding-group all-reduce (DeepSeek-V3 tech
    # report arXiv 2412.19437 Sec. 3.2.3, "Shared Embedding and Output Head for Multi-Token Prediction": "we deploy the
    # shallowest layers (including the embedding layer) and deepest layers (including the output head) of the model on
    # the same PP rank. This arrangement enables the physical sharing of parameters and gradients"); a tied output
    # layer's copy likewise
    tied_params = (max(float(g.meta.get("tied_output_params") or 0.0), float(g.meta.get("mtp_embedding_params") or 0.0))
                   if P > 1 and not dual else 0.0)
    if tied_params > 0:  # once per (view, chunking, pp) in a search
        # with the (ms, J) of the last stage's optimizer step over the copy: the stage memory below adds its ms, the
        # stage energy (reached only by a strategy that is not pruned, maybe in a later call) its J
        hit = sums.get(("params+tied", P))
        if hit is None:
            hit = sums[("params+tied", P)] = (params_chunk + tied_copy_params_by_chunk(tied_params, P, n_chunks),
                                              _tied_copy_optimizer(view, tied_params))
        params_chunk, tied_opt = hit
    act_chunk = chunk_sum("act_bytes")
    db = DTYPE_BYTES[dtype]
    dp_n = lay["dp"].size
    block_params = sums.get("block_params")
    if block_params is None:
        in_model = (view.layer_ids >= 0) & (view.layer_ids < n_layers)
        block_params = sums["block_params"] = float(view.params[in_model].max()) if in_model.any() else 0.0
    stage_key = ("stage", P, V)  # one chunking (n_chunks) is several (pp, interleave) splits
    hit = sums.get(stage_key)
    if hit is None:
        p_stage = rank_sum(params_chunk)
        # each stage's share of FP8-GEMM parameters (its own layers': the embedding's and the head's stages have fewer)
        fp8_stage = np.divide(rank_sum(chunk_sum("fp8_params")), p_stage, out=np.zeros(P), where=p_stage > 0)
        opt_c = chunk_sum("opt_ms").copy()
        if tied_params > 0:  # the last stage's optimizer also steps the tied embedding's copy
            opt_c[-1] += tied_opt[0]
        opt_s = rank_sum(opt_c)
        ex_stage = rank_sum(chunk_sum("expert_params"))
        hit = sums[stage_key] = (p_stage, rank_tasks(act_chunk) if dual else act_chunk.reshape(V, P).mean(axis=0),
                                 opt_s, fp8_stage, rank_sum(chunk_sum("opt_cast_ms")), ex_stage,
                                 # what the model states are computed from, as a key (below)
                                 p_stage.tobytes() + ex_stage.tobytes() + fp8_stage.tobytes())
    params_stage, act_stage, opt_by_stage, fp8_frac, opt_cast_stage, expert_stage, stage_bytes = hit
    inf_key = ("inflight", P, V, n_micro, par.schedule)
    inflight_s = memo.get(inf_key) if memo is not None else None
    if inflight_s is None:
        inflight_s = inflight_chunks_by_stage(pp=P, interleave=V, n_micro=n_micro, schedule=par.schedule)
        if memo is not None:
            memo[inf_key] = inflight_s
    if dual:
        # each rank's peak over the reference order with its two chunks at their own sizes (rank 0 holds mostly the
        # first stage's, not the mean of the first and the last): dualpipe.peak_activation_bytes
        peak_key = ("dualpipe_peak", P, n_micro)
        act_stage = sums.get(peak_key)
        if act_stage is None:
            act_stage = sums[peak_key] = dualpipe_peak_bytes(act_chunk, n_micro) / inflight_s
    if V > 1 and par.schedule != "gpipe":
        # interleaved: chunks differ (the embedding's, the head's), each in flight as often as Megatron's order has it;
        # the stage's peak over its in-flight count stands for its mean chunk
        peak_key = ("interleaved_peak", P, V, n_micro)
        act_stage = sums.get(peak_key)
        if act_stage is None:
            act_stage = sums[peak_key] = interleaved_peak_bytes(act_chunk.reshape(V, P), n_micro=n_micro) / inflight_s

    # full recomputation's re-made layer: each rank's largest (its chunks' transformer layers', recomputed ones)
    extra_key = ("recompute_extra", P, V)
    extra_stage = sums.get(extra_key)
    if extra_stage is None:
        extra_stage = sums[extra_key] = recompute_extra_by_stage(view.full_extra_bytes, chunk, n_chunks, P, dual)
    # each rank's largest kernel working set (its chunks' layers'; the last stage's the loss's, per micro-batch and
    # vocabulary shard), held beside its activations as one device holds its own (memory.estimate_memory's transient)
    transient_key = ("transient", P, V)
    transient_stage = sums.get(transient_key)
    if transient_stage is None:
        transient_stage = sums[transient_key] = recompute_extra_by_stage(view.transient_bytes, chunk, n_chunks, P, dual)

    def stage_terms(s: int) -> dict:
        return {k: float(v[s]) for k, v in mem.items()}

    # DeepSpeed's bf16 optimizer (megatron-deepspeed, bf16, ZeRO-0/1): BF16_Optimizer's accumulation dtype, or "bf16"
    # for the ZeRO-1 optimizer (stage_memory.effective_grad_accum; None elsewhere): its gradients, reduce and
    # step-time buffers, state sharding, accumulation pass and tied-embedding gradient
    ds_acc = effective_grad_accum(opts.framework, dtype, par.zero, ctx.grad_accum_dtype)
    # BF16_Optimizer shards its step over the DP group and all-gathers the bf16 weights after it at ZeRO-0 too
    # (DeepSpeed 0.19.8 bf16_optimizer.py l. 152-183 and update_lp_params -> all_gather_dp_groups, l. 593-603), and
    # all-reduces the whole gradient buffer (allreduce_bucket: dist.all_reduce, engine.py l. 3808-3816), not the
    # reduce-scatter a distributed optimizer runs
    bf16_opt = bf16_optimizer_runs(opts.framework, par.zero, ds_acc)
    # Megatron-Core casting half-precision main gradients (bf16 under --grad-reduce-in-bf16, fp16 without
    # --accumulate-allreduce-grads-in-fp32) to fp32 once per step: its optimizer at ZeRO-0/1, Megatron-FSDP's
    # update_main_grads at ZeRO-2/3 (stage_memory.megatron_grad_cast)
    megatron_cast = megatron_grad_cast(opts.framework, dtype, par.zero, opts.optimizer, ctx.grad_accum_dtype)
    par_dp = replace(par, zero=max(int(par.zero), 1)) if bf16_opt else par
    dp_op = dp_reduce_op(opts.framework, par.zero, bf16_opt)
    layer_wise = muon_layer_wise(opts.framework, opts.optimizer, par.zero)
    if layer_wise:  # LayerWiseDistributedOptimizer: DDP all-reduces the gradients (layer_wise_optimizer.py l. 35)
        dp_op = "all_reduce"
    summary = ctx.summary
    capacity = capacity_gb(spec.memory_gb)
    # expert states are sharded over the expert-data-parallel group (tp x cp x dp / (etp x ep): _dp_times' ep_dp), not
    # the DP group
    edp_n = expert_dp(par)
    # what one device's share of the optimizer step is under ZeRO >= 1, per stage: dense parameters sharded over the DP
    # group, expert ones over the expert-DP group (1 / dp without experts or with ep 1)
    def layer_wise_tensors() -> tuple[pd.DataFrame, np.ndarray]:
        """The whole model's optimizer tensors and each one's stage (model_param_tensors), once per (view, chunking)."""
        out = sums.get(("layer_wise_tensors", P, V))
        if out is None:
            # the view's (a search's context has no graph rows left to read them from)
            out = sums[("layer_wise_tensors", P, V)] = model_param_tensors(g, view.src_layer_ids,
                                                                           np.asarray(chunk) % P, view.muon_tensors)
        return out

    share_key = ("opt_share", P, V, par_dp.zero >= 1, dp_n, edp_n, layer_wise)
    opt_share = sums.get(share_key)
    if opt_share is None:
        if layer_wise:  # each rank steps whole tensors: the slowest rank's share of its stage's step
            ns_dtype = g.meta.get("muon_ns_dtype", "tf32")
            tens, stage_t = layer_wise_tensors()
            opt_share = layer_wise_shares(tens, stage_t, P, dp_n, spec.peak_matrix_tflops(ns_dtype),
                                          spec.memory_bandwidth_gbps)
        elif par_dp.zero >= 1:
            exp_frac = np.divide(expert_stage, params_stage,
                                 out=np.zeros(P), where=params_stage > 0) if edp_n != dp_n else np.zeros(P)
            opt_share = (1.0 - exp_frac) / dp_n + exp_frac / edp_n
        else:
            opt_share = np.ones(P)
        sums[share_key] = opt_share
    # the FP8 weight cast after the step: every DP rank casts its whole FP8 weights (read bf16, write FP8 and transpose:
    # 4 B a parameter); with FP8 parameters (--fp8-param-gather) each casts its shard of the fp32 master weights (read
    # 4 B, write 1) and, after the FP8 all-gather, makes the whole weights' transposes (read 1, write 1)
    cast_share = 0.5 + 1.25 * opt_share if ctx.fp8_param_gather else 1.0
    if pytorch_fsdp(opts.framework, par.zero):
        cast_share = fsdp_fp8_cast_share(g.meta, n_micro)
    # FSDP's root unit (hf, ZeRO-3): each stage's parameters outside the transformer blocks (embeddings, final norm,
    # untied head, a pipeline's tied copy), unsharded through the passes (simulate/stage_memory.py buffer_bytes)
    # and of them the LM head's (the layers after the blocks, or a tied embedding's use as the head, on the last
    # stage), whose gradient is the backward's first and waits for the root's reduce-scatter at its end
    # (stage_memory.fsdp_inflight_gradient_bytes)
    root_stage = head_stage = None
    fsdp = pytorch_fsdp(opts.framework, par.zero)  # FULL_SHARD and SHARD_GRAD_OP (fsdp_shard_grad_op)
    # Megatron-FSDP's optim_grads_params (megatron, ZeRO-3) holds the parameters outside its units (TransformerLayers)
    # gathered through the step too (stage_memory.megatron_fsdp_gathered_bytes)
    mfsdp3 = megatron_fsdp(opts.framework, par.zero) and par.zero >= 3
    if fsdp or mfsdp3:
        root_key = ("root_params", P, V)
        hit = sums.get(root_key)
        if hit is None:
            root = by_stage(root_chunk())  # DualPipe (rank_sum's mirror) runs ZeRO <= 1 only
            head = by_stage(per_chunk(np.where(view.layer_ids >= n_layers, view.params, 0.0)))
            head[-1] += float(g.meta.get("tied_output_params") or 0.0)
            hit = sums[root_key] = (root, np.minimum(head, root))
        root_stage, head_stage = hit
    muon_frac = None
    if g.meta.get("optimizer") == "muon":  # each stage's share of parameters Muon steps (its one fp32 momentum)
        mkey = ("muon_fraction", P, V)
        muon_frac = sums.get(mkey)
        if muon_frac is None:
            m_stage = rank_sum(per_chunk(view.muon_params))
            muon_frac = sums[mkey] = np.divide(m_stage, params_stage, out=np.zeros(P), where=params_stage > 0)
    # the layer-wise optimizer's busiest rank holds the master weights and states of its whole tensors, not 1 / dp
    lw_state = None
    if layer_wise:
        lw_key = ("layer_wise_state", P, V, dp_n, db, opts.framework)
        lw_state = sums.get(lw_key)
        if lw_state is None:
            tens, stage_t = layer_wise_tensors()
            lw_state = sums[lw_key] = layer_wise_state_shares(
                tens, stage_t, P, dp_n, weight_and_master_bytes(opts.framework, par.zero, db)[1])
    state_kw = dict(dtype_bytes=db, grad_bytes=_grad_bytes(opts.framework, dtype, ctx.grad_accum_dtype),
                    held_grad_bytes=held_gradient_bytes(opts.framework, dtype, db, par.zero, ctx.grad_accum_dtype),
                    optimizer=opts.optimizer, optimizer_impl=g.meta.get("optimizer_impl"),
                    zero=par.zero, dp=dp_n, framework=opts.framework, block_params=block_params,
                    fp8_param_fraction=np.zeros(P) if ctx.fp8_param_gather else fp8_frac, expert_params=expert_stage,
                    expert_dp=edp_n, root_params=0.0 if root_stage is None else root_stage,
                    head_params=0.0 if head_stage is None else head_stage,
                    reduce_bytes=dp_reduce_bytes(opts.framework, dtype, par.zero, ctx.fsdp_reduce_dtype) if fsdp else None,
                    zero3_prefetch=bool(ctx.zero3_prefetch) if fsdp else False, grad_accum_dtype=ds_acc,
                    # Megatron-FSDP optim_grads' gradient buckets (stage_memory.megatron_fsdp_grad_bucket_bytes)
                    grad_bucket_params=(dp_bucket_params(opts.framework, par, dp_n, 4.0)
                                        if megatron_fsdp(opts.framework, par.zero) and par.zero == 2 else float("inf")),
                    fp8_copy_bytes_per_param=weight_copy_bytes_per_param(g.meta.get("fp8_scaling") or "delayed",
                                                                         bool(g.meta.get("fp8_transpose", True))),
                    muon_fraction=muon_frac, layer_wise_shares=lw_state,
                    # Megatron-Core's fp32 copy of half-precision main gradients once per step
                    main_grad_cast=megatron_cast)
    # Transformer Engine's userbuffers for TP communication overlap (simulate/stage_memory.py userbuffer_bytes): the
    # (seq x micro-batch / cp, hidden) shape Megatron-LM gives them, FP8 all-gather buffers under an FP8 recipe
    ub_bytes = (userbuffer_bytes(tokens=seq * par.micro_batch / par.cp, hidden=int(g.meta.get("hidden") or 0),
                                 dtype_bytes=db, fp8=g.meta.get("precision") == "fp8")
                if par.tp_comm_overlap and g.meta.get("hidden") else 0.0)
    if summary:  # the total alone (same figures); the model states per (stage split, ZeRO, DP, expert DP) once per search
        mem = None
        # keyed by what they are computed from (the search's memo: the rank graphs of one tp, pp and interleave
        # share their parameters whatever the micro-batch, SP, CP or recomputation), else per view and chunking
        state_key = (("states", stage_bytes, np.asarray(state_kw["root_params"], dtype=float).tobytes(),
                      np.asarray(state_kw["head_params"], dtype=float).tobytes(), ctx.fp8_param_gather,
                      *(state_kw[k] for k in ("dtype_bytes", "grad_bytes", "held_grad_bytes", "optimizer", "zero", "dp",
                                              "framework", "block_params", "expert_dp", "reduce_bytes",
                                              "zero3_prefetch", "grad_accum_dtype", "fp8_copy_bytes_per_param",
                                              "grad_bucket_params", "optimizer_impl", "main_grad_cast")),
                      None if muon_frac is None else muon_frac.tobytes(),
                      None if lw_state is None else np.concatenate(lw_state).tobytes())
                     if memo is not None else ("states", P, V, par.zero, dp_n, edp_n, ctx.fp8_param_gather,
                                               state_kw["reduce_bytes"], state_kw["zero3_prefetch"], ds_acc,
                                               state_kw["fp8_copy_bytes_per_param"], state_kw["grad_bucket_params"],
                                               state_kw["optimizer_impl"],
                                               None if muon_frac is None else muon_frac.tobytes(),
                                               None if lw_state is None else np.concatenate(lw_state).tobytes()))
        cache = memo if memo is not None else sums
        mem_parts = cache.get(state_key)
        if mem_parts is None:
            mem_parts = cache[state_key] = stage_state_parts(params=params_stage, **state_kw)
        total_gb = stage_total_from_parts(mem_parts, act_stage, inflight_s, extra_stage, ub_bytes, transient_stage)
        w_stage = int(np.argmax(total_gb))
        worst = float(total_gb[w_stage])
        worst_terms = None
    else:
        mem = stage_memory_gb(params=params_stage, act_bytes_per_chunk=act_stage, inflight=inflight_s,
                              full_recompute_extra_bytes=extra_stage, userbuffers_bytes=ub_bytes,
                              transient_bytes=transient_stage, **state_kw)
        w_stage = int(np.argmax(mem["total_gb"]))  # the first of the fullest stages
        worst = float(mem["total_gb"][w_stage])
        worst_terms = dict(stage=w_stage, inflight_chunks=int(inflight_s[w_stage]), **stage_terms(w_stage))
        worst_terms.update(peak_breakdown(worst_terms))  # which peak total_gb is and the terms that sum to it
    fits = bool(worst <= capacity)
    if ctx.memory_probe:
        return total_gb if summary else mem["total_gb"]
    # the memory the automatic split is chosen against: the capacity, less a search's margin (--memory-headroom-gb;
    # until the stop 53 audit the split was chosen against the full capacity and a candidate could then fail the
    # margin although another split fitted within it)
    split_cap = capacity - ctx.split_headroom_gb
    if worst > split_cap and auto_edge is not None:
        # the cost-balanced split does not fit: the least slowest-stage work of the automatic splits whose every stage
        # fits, by this memory model (each probe: the per-stage memory of that split, no schedule); none fitting, the
        # cost-balanced split stays and is refused naming its memory
        tried = rank_sum(np.asarray(counts, dtype=float)).astype(int).tolist()
        alt = memory_fitting_split(
            n_layers, P, auto_edge, lambda c: schedule_step(ctx.with_split(c, probe=True)) <= split_cap,
            tried=tried, tried_fits=(total_gb if summary else mem["total_gb"]) <= split_cap, min_layers=V)
        if alt is not None:
            margin = (f" less the {ctx.split_headroom_gb:g} GB memory headroom" if ctx.split_headroom_gb else "")
            out = ctx.with_split(alt)
            out.__dict__["notes"] = (*ctx.notes, (
                f"automatic pipeline split: stages [{', '.join(map(str, alt))}] instead of the cost-balanced "
                f"[{', '.join(map(str, tried))}], whose stage {w_stage} needs {worst:.1f} GB of the {capacity:.1f} GB "
                f"per GPU{margin}: the fastest automatic split that fits"))
            return schedule_step(out)
    if prune_oom and not fits:
        if summary:
            nan = float("nan")
            return StepSummary(spec.name, par, nan, nan, nan, model_totals["flops"] * n_micro * par.dp, worst, False,
                               nan, nan, nan, nan, capacity, False, pipeline_layout=split_layout)
        return _unscheduled(g, spec, cl, par, n_layers, n_micro, counts, model_totals, worst, worst_terms, capacity,
                            view, power_limit_w,
                            (*ctx.notes, *split_notes, *straddling_group_notes(par, ctx.cl.gpus_per_node),
                             *tp_overlap_notes(par, ctx.cl, ctx.opts.framework)),
                            step_per_op(view.per_op_fb, n_micro,
                                        sharded_optimizer_parts(opt_parts_stage(), opt_share, cast_share),
                                        g.meta.get("optimizer_impl")), pipeline_layout=split_layout)

    ep_unpaired = None
    if par.overlap_moe_expert_parallel_comm and dual:  # the tasks outside DualPipe's F&B pairs (its reference order)
        ep_unpaired = 1.0 - dualpipe_paired_share(P, n_micro)
    elif par.overlap_moe_expert_parallel_comm:
        # Megatron-Core's batch-level overlap merges one micro-batch's forward with another's backward: a stage's
        # warm-up forwards and cool-down backwards (its in-flight count of each; one of each without a pipeline) run
        # alone, their all-to-alls exposed (until stop 36 every task was charged as paired)
        ep_unpaired = np.tile(np.minimum(inflight_s / float(n_micro * V), 1.0), V)  # chunk c is on stage c mod P
    # Megatron-Core's linear layers (--async-tp-comm, par.async_tp_comm: on by default under megatron, until stop 53
    # a framework == "megatron" rule): overlap.async_tp_backward_save_ms; not under DualPipe, whose W runs apart (TE's
    # delay_wgrad_compute puts the wgrad GEMM in its WeightGradStore, layernorm_linear.py l. 1068-1079, and the dgrad
    # collective is waited for at the end of the same backward, l. 1128-1130: nothing of the module's left beside it)
    async_tp_b = bool(par.async_tp_comm) and not dual
    parts_key = ("parts", bool(par.tp_comm_overlap), async_tp_b, bool(par.overlap_moe_expert_parallel_comm), par.cp, cp_kv_bytes,
                 ctx.cp_step_floor_ms, None if ep_unpaired is None else ep_unpaired.tobytes(), par.cp_comm_type,
                 par.hierarchical_cp_sizes)
    parts = sums.get(parts_key)
    if parts is None:
        # the CP all-to-alls / all-gathers of one attention layer (none for the ring), each at least the framework's
        # host floor for a collective over its group (as the rank graph's TP / EP collectives: coll_fn)
        cp_coll = cp_collective_ms(cm, cl, par, ctx.cp_qkvo_bytes, lay,
                                   host_floor_ms=lambda n: collective_host_floor_ms(opts.framework, n, ctx.coll_floor))
        parts = sums[parts_key] = (*_comm_parts(view, par, spec, cm, cl, lay, cp_kv_bytes, per_chunk,
                                                cp_step_floor_ms=ctx.cp_step_floor_ms, ep_unpaired=ep_unpaired,
                                                cp_coll_ms=cp_coll, async_tp_b=async_tp_b, hbm_gbps=stream_gbps), cp_coll)
    f_parts, b_parts, cp_step_ms, cp_f_ms, cp_b_ms, cp_coll = parts
    f_nc, b_nc, opt_ms = chunk_sum("f_nc_ms"), chunk_sum("b_nc_ms"), chunk_sum("opt_ms")
    tp_coll = chunk_sum("coll_ms")
    # expert weights are replicated only over dp / ep ranks (each EP rank holds different experts)
    expert_chunk = chunk_sum("expert_params")
    # point-to-point activation transfer between stages: (micro-batch, seq [/tp with SP], hidden)
    hidden = int(g.meta.get("hidden") or 0)
    act_bytes = par.micro_batch * seq * hidden * db / (par.tp if par.sp else 1) / par.cp
    if act_bytes <= 0:  # imported graphs: the tensor crossing a layer boundary, as the graph has it
        act_bytes = float(max(view.block_input_bytes)) if view.block_input_bytes else 0.0
    p2p_ms = 0.0
    # scatter/gather (FRAMEWORK_SCATTER_GATHER_P2P: DeepSpeed's PartitionedTensor, Megatron-LM 2021's
    # --scatter-gather-tensors-in-pipeline): each TP rank sends 1/tp, the receiver all-gathers it over its TP group;
    # otherwise (Megatron-Core) every TP rank sends the whole tensor. With SP the tensor is already 1/tp
    partitioned = ctx.scatter_gather_p2p and par.tp > 1 and not par.sp
    # per hop: a transfer between two stages on one node runs over NVLink, across nodes over the network (stop 47:
    # until then every hop was charged as inter-node once the pipeline spanned nodes; stop 48: the scheduler's
    # non-blocking dependency edges too, scheduler.edge_p2p_ms); p2p_ms, the reported figure, stays the pp group's
    # worst hop
    hop_ms = None
    if P > 1 and act_bytes > 0:
        # across nodes every rank of a node at the stage boundary sends at once, sharing the node's NICs
        pair_across = pair_layout_across(pp_senders_per_node(par.tp, par.cp, par.dp or 1, P, cl.gpus_per_node))
        p2p_key = ("p2p", act_bytes, id(cl), id(cm), partitioned and lay["tp"], pair_across)
        in_out = memo.get(p2p_key) if memo is not None else None
        if in_out is None:
            in_out = []
            for pl in (_PAIR_ONE_NODE, pair_across):  # a pair on one node, on two
                if partitioned:
                    in_out.append(float(collective_ms(cm, ["send_recv"], [act_bytes / par.tp], pl, cl)[0][0]
                                        + collective_ms(cm, ["all_gather"], [act_bytes], lay["tp"], cl)[0][0]))
                else:
                    in_out.append(float(collective_ms(cm, ["send_recv"], [act_bytes], pl, cl)[0][0]))
            if memo is not None:
                memo[p2p_key] = in_out
        p2p_ms = in_out[1] if lay["pp"].nodes > 1 else in_out[0]
        cross = pp_hop_crosses_nodes(par.tp, par.cp, par.dp or 1, P, cl.gpus_per_node)
        hop_ms = np.where(cross, in_out[1], in_out[0])  # hop_ms[s]: stage s to stage s + 1 (mod P)
    # how the transfers meet the computation: Megatron-LM / Megatron-Core's 1F1B waits on each batched send/recv before
    # its next computation (send_forward_recv_backward: both ends blocked) and DeepSpeed's engine sends blocking, so
    # each chunk that sends spends the transfer (the receiver then waits for nothing more); Megatron-Core's
    # interleaved schedule overlaps them (overlap_p2p_comm, its default there; Megatron-LM 2021's did not: its
    # _communicate waited on every request and synchronised the device, so with it off each chunk's transfer blocks)
    # and other frameworks are charged on the dependency edge only (the receiver waits, the sender runs on)
    p2p_blocking = (opts.framework in ("megatron", "megatron-deepspeed") and P > 1 and (V == 1 or not par.overlap_p2p_comm)
                    and not dual)  # DualPipe sends asynchronously (its comm.py: isend/irecv), the transfer on the edge
    # every chunk but the last sends its activations on, every chunk but the first its input gradient back
    send_f, send_b = np.ones(n_chunks), np.ones(n_chunks)
    send_f[-1] = send_b[0] = 0.0
    if hop_ms is not None and p2p_ms > 0 and not dual:
        # each transfer over its own hop: a blocked sender spends it, a non-blocking edge waits for it (the scheduler's
        # per-hop edges, scheduler.edge_p2p_ms; until stop 48 every non-blocking edge paid the worst hop): chunk c (on
        # stage c mod P) sends forward to stage c + 1 mod P and its gradient back to stage c - 1 mod P; send_* scale
        # the p2p_ms they multiply (the transfers each task runs, as the blocking path)
        stage = np.arange(n_chunks) % P
        send_f = send_f * hop_ms[stage] / p2p_ms
        send_b = send_b * hop_ms[(stage - 1) % P] / p2p_ms

    # the bf16 bytes BF16_Optimizer's all-reduce sends (DeepSpeed 0.19.8 casts its fp32 buffer to the default
    # communication_data_type, the model's bf16: stage_memory.bf16_optimizer_reduce_bytes), as the ZeRO optimizer's
    grad_b = dp_reduce_bytes(opts.framework, dtype, par.zero, ctx.fsdp_reduce_dtype, ctx.grad_accum_dtype)
    bucket_params = dp_bucket_params(opts.framework, par, lay["dp"].size, grad_b)
    # the tied embedding's gradient all-reduce between the first and the last stage (Megatron-Core's
    # _allreduce_embedding_grads, DeepSpeed's _exec_reduce_tied_grads): once per step, a 2-rank all-reduce of the copy's
    # gradient over the embedding group, usually across nodes; in the "pp" class. The whole gradient, whatever the ZeRO
    # stage: ZeRO-2/3 partition each stage's flat parameters, so the two stages' shards of the table do not line up
    # (DeepSpeed runs the reduction before partitioning; the Megatron frameworks refuse ZeRO-2 with a pipeline)
    tied_ar_ms = tied_ar_bytes = 0.0
    if tied_params > 0:
        tied_ar_bytes = tied_params * tied_grad_bytes(opts.framework, dtype, ctx.grad_accum_dtype, par.zero)
        emb_l = embedding_group_layout(par.tp, par.cp, par.dp, P, cl.gpus_per_node)
        tied_key = ("tied_ar", tied_ar_bytes, emb_l, id(cl), id(cm))
        tied_ar_ms = memo.get(tied_key) if memo is not None else None
        if tied_ar_ms is None:
            tied_ar_ms = float(collective_ms(cm, ["all_reduce"], [tied_ar_bytes], emb_l, cl)[0][0])
            if memo is not None:
                memo[tied_key] = tied_ar_ms
    tied_first = tied_grads_before_dp(opts.framework)
    # the distributed optimizer's parameter all-gather: bf16 weights, FP8 ones at 1 B with --fp8-param-gather
    gather_b_chunk = (params_chunk * db - chunk_sum("fp8_params") * (db - DTYPE_BYTES["fp8"]) if ctx.fp8_param_gather
                      else params_chunk * db)
    # Megatron-Core buckets the gradients of the first stage's first model chunk only (DistributedDataParallel: "Turn
    # off bucketing if we are on a pipeline stage that is not the first ..."; Megatron-LM's get_model passes
    # disable_bucketing for model chunks after the first): the others reduce as one message when their last backward
    # is done (with align_grad_reduce the later stages launch it after their final backward, "during the pipeline
    # bubble")
    first_only = opts.framework == "megatron" and bool(par.overlap_grad_reduce)
    # the ranks holding the first stage: under DualPipe rank P-1 holds it too (its reverse direction's stage 0)
    first_ranks = (0, P - 1) if dual else (0,)
    if dual:  # each DualPipe rank reduces both its chunks' gradients (the two copies' sum approximated as inside it)
        params_chunk, expert_chunk, gather_b_chunk = mirrored(params_chunk), mirrored(expert_chunk), mirrored(gather_b_chunk)
    # ZeRO-2 reducing every micro-batch's gradients (grad_reduce_every_micro): "overlapped", "series" or None
    z2_mode = grad_reduce_every_micro(opts.framework, par_dp.zero)
    # PyTorch FSDP's ZeRO-2 (SHARD_GRAD_OP): ZeRO-3's per-unit collectives without the backward's re-gathers
    sgo = fsdp_shard_grad_op(opts.framework, par_dp.zero)
    per_unit = per_unit_collectives(opts.framework, par_dp.zero)
    # Megatron-FSDP (megatron, ZeRO-2/3): the bucket holding the embedding, the backward's last gradient, and under
    # ZeRO-3 the parameters outside the units, gathered once a step (_dp_times' root_chunk); until stop 46's follow-up
    # ZeRO-3 gathered them with every micro-batch's units and ZeRO-2's last bucket was a bucket_params one
    root_c = first_root_c = last_c = None
    mfsdp = megatron_fsdp(opts.framework, par_dp.zero)
    if mfsdp and not dual:
        emb_c = per_chunk(np.where(view.layer_ids < 0, view.params, 0.0))  # the embedding's parameters a chunk
        if par_dp.zero == 3:
            root_c = root_chunk()
            first_root_c = mfsdp_first_bucket_params(emb_c, root_c, bucket_params)
        else:
            last_c = mfsdp_first_bucket_params(emb_c, params_chunk - expert_chunk, bucket_params)
    # PyTorch FSDP's FULL_SHARD (hf, ZeRO-3): the root unit's parameters stay gathered through the backward, which
    # re-gathers the blocks' alone (_dp_times' fsdp_root_chunk)
    fsdp_root_c = root_chunk() if (pytorch_fsdp(opts.framework, par_dp.zero) and not sgo and not dual) else None
    ddp_buckets = None
    if not mfsdp and first_only and not dual and np.isfinite(bucket_params) and view.dense_param_seq is not None:
        # Megatron-Core's DDP / distributed optimizer (ZeRO 0/1): the bucketed first chunk's gradient buckets as
        # _ParamAndGradBuffer cuts them (mcore_ddp_bucket_numels); its last, the embedding's, is the backward's last
        # reduction and the first parameter all-gather bucket its forward waits for. The embedding is a shared one
        # (its own bucket under the distributed optimizer) with a tied output layer's or MTP's copy on the last
        # stage (tied_params; language_module.py l. 203-210)
        bk_key = ("ddp_buckets", P, V, bucket_params, tied_params > 0, par_dp.zero >= 1, lay["dp"].size)
        ddp_buckets = sums.get(bk_key)
        if ddp_buckets is None:
            ddp_buckets = {}
            # the shared one is the word embeddings' weight, the embedding's first parameter
            # (LanguageModelEmbedding builds word_embeddings before position_embeddings: models/common/embeddings/
            # language_model_embedding.py l. 56, 67)
            shared = tied_params > 0
            for c in first_ranks:
                sel = np.flatnonzero(chunk == c)  # the chunk's layers in model order (the embedding first)
                seqs = [view.dense_param_seq[i] for i in sel]
                own = [(np.arange(len(q)) == 0) & bool(shared and view.layer_ids[i] < 0) for i, q in zip(sel, seqs)]
                if seqs:
                    ddp_buckets[c] = mcore_ddp_bucket_numels(np.concatenate(seqs), bucket_params,
                                                             own_bucket=np.concatenate(own),
                                                             dist_opt=par_dp.zero >= 1, dp=lay["dp"].size)
            sums[bk_key] = ddp_buckets
        last_c = np.zeros(n_chunks)
        for c, bk in ddp_buckets.items():
            last_c[c] = bk[-1] if len(bk) else 0.0
    dp_key = ("dp", par_dp.zero, z2_mode, sgo, dp_op, lay["dp"], par.ep, par.tp, par.etp, bucket_params, grad_b, db, P, V, id(cl), id(cm),
              params_chunk.tobytes(), expert_chunk.tobytes(), gather_b_chunk.tobytes(), tuple(counts), first_only,
              first_ranks, *(None if x is None else x.tobytes() for x in (root_c, first_root_c, last_c, fsdp_root_c)),
              None if ddp_buckets is None else tuple((c, bk.tobytes()) for c, bk in sorted(ddp_buckets.items())))
    dpt = memo.get(dp_key) if memo is not None else None
    if dpt is None:
        dpt = _dp_times(par_dp, lay, cl, cm, params_chunk, expert_chunk, grad_b, db, P, V, np.asarray(counts),
                        bucket_params, gather_b_chunk, bucketed_first_chunk_only=first_only, reduce_op=dp_op,
                        first_chunks=first_ranks, reduce_every_micro=z2_mode is not None, framework=opts.framework,
                        root_chunk=root_c, first_root_chunk=first_root_c, last_bucket_chunk=last_c,
                        ddp_buckets_chunk=ddp_buckets, fsdp_root_chunk=fsdp_root_c)
        if memo is not None:
            memo[dp_key] = dpt
    # accumulating each micro-batch's gradients: a streaming pass over the chunk's gradients (partitioned over
    # the data-parallel ranks with ZeRO-2/3, which reduce every micro-batch), added to every backward task
    acc_b, every = grad_accumulation_bytes(opts.framework, dtype, ctx.grad_accum_dtype, par.zero)
    share = 1.0 if every else (n_micro - 1) / n_micro
    shard = lay["dp"].size if par.zero >= 2 else 1
    # BF16_Optimizer also zeroes the bf16 param.grad before each backward and autograd adds into it in place, every
    # micro-batch after a step's first (bf16_optimizer_lp_grad_bytes)
    acc_b = acc_b * share + bf16_optimizer_lp_grad_bytes(opts.framework, dtype, ctx.grad_accum_dtype, par.zero,
                                                         ctx.deepspeed_clear_lp_grads) * (n_micro - 1) / n_micro
    acc_ms = params_chunk / shard * acc_b / (stream_gbps * 1e9) * 1e3
    # BF16_Optimizer's once-per-step passes beyond the graph's (sharded) clipping and step rows: the casts and scale
    # around its DP all-reduce, the norm and clipping over the whole gradient, the buffer zeroed twice
    # (bf16_optimizer_step_bytes), streamed on each stage's parameters, in the optimizer phase
    bf16_step_ms = np.zeros(P)
    if bf16_opt and g.meta.get("optimizer", "none") != "none":
        whole_b, part_b = bf16_optimizer_step_bytes(ds_acc, dp_n, bool(g.meta.get("clip_grad", True)))
        bf16_step_ms = np.maximum(params_stage * (whole_b + part_b * opt_share), 0.0) / (stream_gbps * 1e9) * 1e3
    elif megatron_cast:
        # Megatron-Core's cast of the half-precision main gradients of the parameters the rank steps to fp32 for its
        # Adam (stage_memory.MEGATRON_GRAD_CAST_BYTES_PER_PARAM), streamed in the optimizer phase: after the gradient
        # reduction, before the step (Megatron-FSDP: finish_grad_sync -> update_main_grads)
        bf16_step_ms = params_stage * opt_share * MEGATRON_GRAD_CAST_BYTES_PER_PARAM / (stream_gbps * 1e9) * 1e3
    # those passes by the per_op part they add to (per_op, the trace's optimizer parts)
    opt_extra = optimizer_extra_parts(bf16_opt and g.meta.get("optimizer", "none") != "none", megatron_cast, ds_acc,
                                      dp_n, bool(g.meta.get("clip_grad", True)), params_stage, opt_share, stream_gbps,
                                      bf16_step_ms)
    b_nc = b_nc + acc_ms
    # getting each micro-batch onto the GPU (simulate/data_loading.py): the loader's exposed host time, the copy, the
    # TP broadcast and the derived kernels, in the forward of the chunks that read the batch (first and last)
    data_f, data_info = _data_loading(ctx, f_nc, b_nc, P, V)
    f_nc = f_nc + data_f

    classes = sorted(set(f_parts) | {"pp", "dp"})
    # device figures that no strategy changes: once per search (held with the spec, whose id keys them)
    clock_cap = ctx.clock_cap_mhz
    dev_key = ("device", id(spec), dtype, power_limit_w, clock_cap, stream_gbps, id(power_model))
    dev = memo.get(dev_key) if memo is not None else None
    if dev is None or dev[0] is not spec:
        from wattcast.models.power import comm_power_w, idle_power_w

        p_stream = stream_power_w(spec, stream_gbps, power_model)
        if power_limit_w is not None or clock_cap is not None:
            # the streaming pass is memory-bound: under a limit or a clock cap its power drops (as the graph's own
            # kernels' do, simulate.energy.apply_power), its time stays
            from wattcast.models.power import apply_power_limit

            p_stream = float(apply_power_limit(1.0, p_stream, power_limit_w, spec, 0.0, model=power_model,
                                               clock_cap_mhz=clock_cap)[1])
        # waits (bubbles, exposed communication) and collectives: communication power, under the clock cap too
        # (models.power.comm_power_w says why)
        dev = (spec, spec.peak_matrix_tflops(dtype) * 1e12, comm_power_w(spec, power_limit_w, clock_cap, power_model),
               p_stream, idle_power_w(spec))
        if memo is not None:
            memo[dev_key] = dev
    _, peak, p_comm, p_stream, p_idle = dev
    # what each chunk's computation (no collectives) draws per micro-batch: kernels at their power, launch gaps and
    # loading the micro-batch at idle, the gradient-accumulation pass (not a graph kernel) at a streaming kernel's; its
    # mean power and compute utilisation per chunk and per stage (forward, backward: what runs beside hidden transfers)
    # the forward's figures depend on the micro-batch's loading (data_f), the backward's on the accumulation pass
    # (acc_ms, which ZeRO-2/3 and the micro-batch count change): each kept apart, per stage split (P)
    cap_w = overlap_cap_w(spec, power_limit_w)  # the board's cap on computation + a hidden collective
    dyn_w = max(p_comm - p_idle, 0.0)

    def mean(num, den, empty):
        return np.divide(num, den, out=np.full(len(den), float(empty)), where=den > 0)

    def pass_power(kind: str, extra_ms: np.ndarray, extra_w: float) -> tuple:
        """(J per chunk, per-chunk (W, utilisation, cap binds), per-stage ones) of the forward ("f") or backward ("b")
        computation with ``extra_ms`` per chunk at ``extra_w`` added."""
        key = ("pass_power", kind, P, extra_ms.tobytes(), p_comm, extra_w, cap_w)
        hit = sums.get(key)
        if hit is None:
            t_nc = f_nc if kind == "f" else b_nc
            e_nc = chunk_sum(f"e_{kind}_nc_j") + extra_ms * extra_w / 1e3
            w, w_s = mean(e_nc * 1e3, t_nc, p_idle), mean(by_stage(e_nc) * 1e3, by_stage(t_nc), p_idle)  # W
            cu = chunk_sum(f"cu_{kind}_ms")
            hit = sums[key] = (e_nc, (w, mean(cu, t_nc, 0.0), w + dyn_w > cap_w),
                               (w_s, mean(by_stage(cu), by_stage(t_nc), 0.0), w_s + dyn_w > cap_w))
        return hit

    e_f_nc, pow_f, pow_fs = pass_power("f", data_f, p_idle)
    e_b_nc, pow_b, pow_bs = pass_power("b", acc_ms, p_stream)
    cpow = dict(f=pow_f, b=pow_b, fs=pow_fs, bs=pow_bs)
    dyn_kw = dyn_w / 1e3
    # the communication each chunk runs per micro-batch, by class, whether exposed or hidden: the rank graph's
    # collectives by group (as _comm_parts names them) and the ring attention's KV steps (_comm_parts' count)
    tot_key = ("comm_totals", parts_key)
    comm_tot = sums.get(tot_key)
    if comm_tot is None:
        tf, tb = {}, {}
        for grp, (cf, cb) in view.coll_by_group.items():
            key = "tp" if grp in ("", "etp") else grp
            tf[key] = tf.get(key, 0.0) + per_chunk(cf)
            tb[key] = tb.get(key, 0.0) + per_chunk(cb)
        n_ring = cp_group_sizes(par)[1]
        if par.cp > 1 and cp_step_ms[0] > 0:
            xf, xb = cp_step_ms
            tf["cp"] = per_chunk(np.where(view.attn_f_ms > 0, (n_ring - 1) * xf, 0.0))
            tb["cp"] = per_chunk(np.where(view.attn_b_ms > 0, ring_backward_transfer_ms(n_ring, xf, xb), 0.0)
                                 + np.where(view.attn_rc_ms > 0, (n_ring - 1) * xf, 0.0))
        if par.cp > 1 and (cp_coll[0] > 0 or cp_coll[1] > 0):  # the exposed a2a / allgather collectives
            coll_f, coll_b = _plus_cp_collectives(view, cp_coll)
            tf["cp"] = tf.get("cp", 0.0) + per_chunk(coll_f)
            tb["cp"] = tb.get("cp", 0.0) + per_chunk(coll_b)
        comm_tot = sums[tot_key] = (tf, tb)

    def hidden_power(hidden_ms, where):
        """(stretch ms, extra J) of communication hidden beside the computation ``where`` ("f", "b" per chunk; "fs", "bs"
        per stage): simulate.energy.overlap_power, called only where the cap can bind (else: the dynamic power)."""
        w, u, binds = cpow[where]
        if (binds & (hidden_ms > 0)).any():
            return overlap_power(hidden_ms, w, u, p_comm, spec, power_model, power_limit_w=power_limit_w)
        return 0.0, dyn_kw * hidden_ms

    nccl_share = sm_share(NCCL_SMS, spec.num_sms)
    n_dp = lay["dp"].size

    def hbm_chunk(phase: str, stage: bool = False) -> np.ndarray:
        """Per chunk (``stage``: per stage), the (memory-bound ms, their bytes, other bytes) of one micro-batch's forward
        ("f") or backward ("b") computation: what a data-parallel collective beside it shares the DRAM with
        (overlap.hbm_stretch)."""
        key = ("hbm_chunk", phase, stage)
        out = sums.get(key)
        if out is None:
            out = np.stack([per_chunk(row) for row in view.hbm[phase]])
            out = sums[key] = np.stack([by_stage(row) for row in out]) if stage else out
        return out

    def dp_stretch(compute_ms, comm_ms, comm_bytes, op: str, phase: str, stage: bool = False):
        """(compute, communication) factors of data-parallel collectives of ``comm_bytes`` (nccl-tests, ``op`` over the
        DP group) beside a chunk's (``stage``: a stage's) computation: NCCL's SMs and the DRAM bandwidth they share
        (overlap.hbm_stretch at the achievable stream bandwidth)."""
        if view.hbm is None:  # (a view without the kernels' traffic: the SMs alone)
            return hbm_stretch(compute_ms, comm_ms, share=nccl_share)
        h = hbm_chunk(phase, stage)
        return hbm_stretch(compute_ms, comm_ms, share=nccl_share, mem_ms=h[0], mem_bytes=h[1], other_bytes=h[2],
                           comm_hbm_bytes=nccl_hbm_bytes_per_byte(op, n_dp) * np.asarray(comm_bytes, dtype=float),
                           hbm_gbps=stream_gbps)

    dp_st: dict = {}  # dp_stretch's factors of the step's gradient buckets, once a step
    dp_overlaps = bool(FRAMEWORK_DP_OVERLAP.get(opts.framework, True) or par.overlap_grad_reduce)

    dp_group = lay["dp"].size > 1 or edp_n > 1  # a data-parallel sync to run (the dense or the experts' group)

    every_class = frozenset(classes)
    # a forward's ZeRO-3 gathers: its units' and, Megatron-FSDP's, the parameters outside them gathered once a step
    # (the embedding's bucket waited for by the step's first forward), spread over the step's micro-batches
    z3_f_ms = dpt["z3_f_ms"] + dpt["z3_root_f_ms"] / n_micro
    z3_first_f_ms = dpt["z3_first_f_ms"] + dpt["z3_root_first_f_ms"] / n_micro

    # the all-reduces over the stages the optimizer step waits for (optimizer_barriers: the global norm's, fp16's
    # found-inf check): the phase cut there (optimizer_segments), each barrier a 4-byte all-reduce over the group that
    # reduces the norm (grad_stats_group_layout), in the "pp" class
    opt_parts = sharded_optimizer_parts(opt_parts_stage(), opt_share, cast_share, opt_extra)
    clip_on = bool(g.meta.get("clip_grad", True))
    barriers = optimizer_barriers(opts.framework, dtype, clip_on, bf16_opt, P, g.meta.get("optimizer", "none"))
    barrier_ms = 0.0
    if barriers:
        stats_l = grad_stats_group_layout(opts.framework, par.zero >= 1, lay, par.gpus, cl.gpus_per_node)
        stats_key = ("grad_stats_ar", stats_l, id(cl), id(cm))
        barrier_ms = memo.get(stats_key) if memo is not None else None
        if barrier_ms is None:
            barrier_ms = float(collective_ms(cm, ["all_reduce"], [GRAD_STATS_BYTES], stats_l, cl)[0][0])
            if memo is not None:
                memo[stats_key] = barrier_ms
    if bf16_opt:  # BF16_Optimizer's clip_grad_norm part: its whole-gradient norm and clipping (the graph row cancels)
        norm_b, clip_b = bf16_optimizer_norm_clip_bytes(ds_acc, clip_on)
        norm_share = norm_b / (norm_b + clip_b)
    else:
        norm_share = CLIP_NORM_SHARE
    # ZeRO shards the optimizer step over the DP group; the FP8 weight cast after it is every rank's whole share. The
    # same in every run below (no communication class made free changes it): the phase and its cut made once
    opt_stage = (opt_by_stage - opt_cast_stage) * opt_share + opt_cast_stage * cast_share + bf16_step_ms
    opt_segs, seg_ms = optimizer_segments(opt_parts, opt_stage, barriers, norm_share)

    def run(free: frozenset = frozenset(), energy: bool = True):
        """The step with the communication classes in ``free`` made free (everything else as costed); ``energy``
        False: the step's time alone (``work`` None), what the runs for the exposed communication need."""
        # every class free: no transfer is left to hide (the task's communication, p2p and ZeRO-3 are all free), so no
        # stretch and no extra energy (hidden_power of zeros: 0.0); a time-only run skips computing them
        quiet = not energy and free >= every_class
        comm_key = (parts_key, "comm", free)
        comm = sums.get(comm_key)
        if comm is None:  # what the classes not made free add, per chunk (forward, backward)
            comm = sums[comm_key] = (sum(v for k, v in f_parts.items() if k not in free),
                                     sum(v for k, v in b_parts.items() if k not in free))
        f = f_nc + comm[0]
        b = b_nc + comm[1]
        dp_on = "dp" not in free
        if dp_on and per_unit:
            # prefetched: each unit's collectives run beside the computation of its neighbours, taking NCCL's SMs from
            # it while they run (simulate/overlap.py), one unit's worth per pass with nothing to hide behind; not
            # prefetched: in series with the computation (their sum: overlapped_ms with share 1 would still hide the
            # computation behind collectives longer than it)
            if ctx.zero3_prefetch:
                # (and the DRAM bandwidth: overlap.hbm_stretch; the backward's gathers and reduce-scatters move alike)
                st_f = dp_stretch(f, z3_f_ms, dpt["z3_f_bytes"] + dpt["z3_root_f_bytes"] / n_micro, "all_gather", "f")
                st_b = dp_stretch(b, dpt["z3_b_ms"], dpt["z3_b_bytes"], "reduce_scatter", "b")
                f = overlapped_ms(f, z3_f_ms, share=nccl_share, first_chunk_ms=z3_first_f_ms, stretch=st_f)
                b = overlapped_ms(b, dpt["z3_b_ms"], share=nccl_share, first_chunk_ms=dpt["z3_first_b_ms"], stretch=st_b)
            else:
                f = f + z3_f_ms
                b = b + dpt["z3_b_ms"]
        if dp_on and z2_mode is not None:
            # ZeRO-2 reducing every micro-batch (grad_reduce_every_micro): Megatron-FSDP's buckets beside the rest of
            # the backward on its side stream (NCCL's SMs taken from it), the last one, launched as the backward ends,
            # waited for (GradReducePipeline.reset); DeepSpeed's on the compute stream, in series with it
            if z2_mode == "overlapped":
                b = overlapped_ms(b, dpt["z2_b_ms"], share=nccl_share, first_chunk_ms=dpt["z2_last_b_ms"],
                                  stretch=dp_stretch(b, dpt["z2_b_ms"], dpt["z2_bytes"], dp_op, "b"))
            else:
                b = b + dpt["z2_b_ms"]
        p2p = 0.0 if "pp" in free else p2p_ms
        # the scheduler's dependency edges, each over its own hop (DualPipe: the worst, its mirrored stages)
        p2p_edges = p2p if p2p <= 0 or hop_ms is None or dual else hop_ms
        if not quiet:
            # every transfer a chunk's task runs, exposed or hidden (the rest of f, b beyond the computation is exposed)
            tot_free = (tot_key, free)
            t_fb = sums.get(tot_free)
            if t_fb is None:
                t_fb = sums[tot_free] = tuple(sum((v for k, v in d.items() if k not in free), np.zeros(n_chunks))
                                              for d in comm_tot)
            t_f, t_b = t_fb
            if p2p > 0:
                t_f, t_b = t_f + send_f * p2p, t_b + send_b * p2p
            if dp_on and per_unit:
                t_f = t_f + z3_f_ms
                t_b = t_b + dpt["z3_b_ms"]
            if dp_on and z2_mode is not None:
                t_b = t_b + dpt["z2_b_ms"]
        if p2p_blocking and p2p > 0:  # the sender is blocked for its transfer; it is done when the task ends
            f = f + send_f * p2p
            b = b + send_b * p2p
            p2p = p2p_edges = 0.0
        if not quiet:
            # communication hidden beside a task's computation: its dynamic power on top of the computation's, and
            # under a power limit the computation's clock where the sum would exceed it (simulate.energy.overlap_power)
            # (no more than the computation: transfers beyond it, or side by side, are exposed or share its span)
            hid_f, hid_b = np.clip(t_f - (f - f_nc), 0.0, f_nc), np.clip(t_b - (b - b_nc), 0.0, b_nc)
            st_f, xj_f = hidden_power(hid_f, "f")
            st_b, xj_b = hidden_power(hid_b, "b")
            f = f + st_f
            b = b + st_b
        keep = trace and not free
        pipe_key = ("pipe", f.tobytes(), b.tobytes(), n_micro, V, par.schedule, np.asarray(p2p_edges).tobytes(),
                    ctx.exact_pipeline)
        hit = memo.get(pipe_key) if memo is not None and not keep else None
        if hit is None:  # strategies that differ only where the pipeline does not see it (ZeRO 0/1, ...) share it
            pipe = time_pipeline(f, b, n_micro=n_micro, interleave=V, kind=par.schedule, p2p_ms=p2p_edges,
                                 keep_tasks=keep, exact=ctx.exact_pipeline, w_ms=chunk_sum("wgrad_ms") if dual else None)
            hit = (pipe, pipe.last_backward_array)
            if memo is not None and not keep:
                memo[pipe_key] = hit
        pipe, lb = hit
        stage_end = pipe.stage_end.copy()
        comm_events = []
        tied_on = tied_ar_ms > 0 and "pp" not in free
        tied_start = 0.0
        if tied_on and tied_first:  # DeepSpeed: ReduceTiedGrads, then ReduceGrads
            stage_end, tied_start = tied_grad_sync_ms(stage_end, tied_ar_ms)
        finish = stage_end.copy()
        st_dp = xj_dp = st_g = xj_g = 0.0
        if dp_on and dp_group and par.zero != 3 and dpt["bucket_pad"].shape[1]:
            # every stage's buckets at once: rows padded with empty buckets that are never ready (they change nothing)
            ms, n = dpt["bucket_pad"], dpt["bucket_n"]
            pre = dpt.get("bucket_pre")
            if pre is None:  # what depends on the buckets alone, once per set of buckets
                k = np.arange(1, ms.shape[1] + 1)
                cum = np.cumsum(ms, axis=1)
                pre = dpt["bucket_pre"] = (k[None, :] <= n[:, None], k[None, :] / np.maximum(n, 1)[:, None], cum,
                                           cum - ms, (np.arange(P), np.maximum(n - 1, 0)), n > 0)
            valid, frac, cum, cum_before, last_idx, has = pre
            op = dp_op
            # NCCL's SMs and the DRAM bandwidth the buckets share with the backward (overlap.hbm_stretch): the stage's
            # computation and the buckets each longer by (factor - 1) x the time they run together
            # (once a step: the same for every run)
            if "buckets" not in dp_st:
                dp_st["buckets"] = tuple(np.broadcast_to(x, (P,)) for x in dp_stretch(
                    by_stage(b_nc), by_stage(dpt["sync_ms"]), by_stage(dpt["sync_bytes"]), dp_op, "b", stage=True))
            dp_fc, dp_fr = dp_st["buckets"]
            if dp_overlaps and V > 1:
                # interleaved: Megatron-Core keeps a grad buffer per model chunk and launches a chunk's reduction when
                # its last micro-batch's backward is done (forward_backward_pipelining_with_interleaving calls the
                # chunk's start_grad_sync after it: align_grad_reduce, Megatron-LM's default), so chunk c's buckets
                # go at chunk c's own last backward on the stage, before the stage's final backward (chunk 0's, whose
                # buckets follow it), and queue on the one data-parallel stream (chunk_reduce_spans_ms). Stated
                # simplifications: Megatron-Core aligns the launches over the pipeline (stage r launches chunk c's r
                # backward tasks after its last one, chunk 0's after the stage's final backward); the reductions' time
                # before the stage ends is charged as slowing its computation (below) though part of it may fall in
                # the drain's idle gaps
                chunk_ms, ready_c = dpt["sync_ms"].reshape(V, P).T, pipe.last_backward_by_chunk[:, :, 1]
                c_start, c_end = chunk_reduce_spans_ms(chunk_ms, ready_c)
                # reductions beside the stage's computation take SMs from it (simulate/overlap.py): it ends later
                over = np.maximum(np.minimum(c_end, stage_end[:, None]) - c_start, 0.0)
                hidden = over.sum(axis=1)
                scale = np.ones_like(chunk_ms)
                if np.any(dp_fr > 1.0):  # and each chunk's reductions longer by what they share the DRAM with
                    stretched = chunk_ms + (dp_fr[:, None] - 1.0) * over
                    scale = np.divide(stretched, chunk_ms, out=scale, where=chunk_ms > 0)
                    c_start, c_end = chunk_reduce_spans_ms(stretched, ready_c)
                end = np.where(has, c_end.max(axis=1), 0.0)
                if trace:  # each chunk's buckets back to back from its start, numbered in the stage's queue order
                    for s in range(P):
                        j = 0
                        for c in range(V - 1, -1, -1):
                            t = float(c_start[s, c])
                            for x in dpt["bucket_ms"][c * P + s].tolist():
                                x = x * float(scale[s, c])
                                comm_events.append((s, f"dp.{op}[{j}].c{c}", t, t + x))
                                t, j = t + x, j + 1
            else:
                if dp_overlaps:
                    ready = lb[:, :1] + (lb[:, 1:] - lb[:, :1]) * frac
                else:
                    ready = np.repeat(stage_end[:, None], ms.shape[1], axis=1)
                ready = np.where(valid, ready, -np.inf)
                ends = cum + np.maximum(np.maximum.accumulate(ready - cum_before, axis=1), 0.0)
                starts = ends - ms
                # buckets reduced during the last backward take SMs from it (simulate/overlap.py): it ends later
                if dp_overlaps:
                    over = np.where(valid, np.maximum(np.minimum(ends, stage_end[:, None]) - starts, 0.0), 0.0)
                    hidden = over.sum(axis=1)
                    if np.any(dp_fr > 1.0):  # and each bucket longer by what it shares the DRAM with: queued again
                        ms_x = ms + (dp_fr[:, None] - 1.0) * over
                        cum_x = np.cumsum(ms_x, axis=1)
                        ends = cum_x + np.maximum(np.maximum.accumulate(ready - (cum_x - ms_x), axis=1), 0.0)
                        starts = ends - ms_x
                else:
                    hidden = np.zeros(P)
                end = np.where(has, ends[last_idx], 0.0)
                if trace:
                    chunk_of = [np.concatenate([np.full(len(dpt["bucket_ms"][c * P + s]), c) for c in range(V)])
                                for s in range(P)] if V > 1 else None  # the buckets in chunk order (_stage_buckets)
                    comm_events += [(s, f"dp.{op}[{j}]" + (f".c{int(chunk_of[s][j])}" if V > 1 else ""),
                                     float(starts[s, j]), float(ends[s, j])) for s in range(P) for j in range(int(n[s]))]
            st_dp, xj_dp = hidden_power(hidden, "bs")
            finish = np.where(has, np.maximum(stage_end + (dp_fc - 1.0) * hidden + st_dp, end),
                              np.maximum(stage_end, 0.0))
        if tied_on and not tied_first:  # Megatron-Core's finalize_model_grads: the DP sync, then the embedding's
            finish, tied_start = tied_grad_sync_ms(finish, tied_ar_ms)
        if tied_on and trace:
            comm_events += [(s, "pp.embedding_grad_all_reduce", tied_start, tied_start + tied_ar_ms) for s in (0, P - 1)]
        gather = np.zeros(P)
        if dp_on and par_dp.zero >= 1 and dp_group:
            if par.overlap_param_gather and V > 1:
                # interleaved: chunk by chunk, each before that chunk's first forward (interleaved_param_gather_ms)
                # (the gathers' share of the SMs and the DRAM bandwidth: the forward's factor, overlap.hbm_stretch)
                g_fc = dp_stretch(by_stage(f_nc), by_stage(dpt["gather_after_ms"]), by_stage(dpt["gather_bytes"]),
                                  "all_gather", "f", stage=True)[0]
                gather = interleaved_param_gather_ms(dpt["gather_after_ms"].reshape(V, P).T, pipe.first_forward_by_chunk,
                                                     g_fc - 1.0)
                st_g, xj_g = hidden_power(np.maximum(by_stage(dpt["gather_after_ms"]) - gather, 0.0), "fs")
                gather = gather + st_g
            else:
                gather = dpt.get("gather_by_stage")
                if gather is None:
                    gather = dpt["gather_by_stage"] = by_stage(dpt["gather_after_ms"])
                if par.overlap_param_gather:
                    # gathered bucket by bucket in the next step's forward pre-hooks: the first bucket waits, the rest
                    # run beside the first micro-batch's forward (slowing it), what outlasts that forward is exposed
                    n_b = (np.maximum(np.ceil(params_stage / bucket_params), 1.0) if np.isfinite(bucket_params)
                           else np.ones(P))
                    if last_c is not None and not mfsdp:
                        # the first forward waits for the embedding's bucket (the buffer's last): its share of the
                        # stage's gather, not 1 / n_b (Megatron-Core gathers the bucket groups in forward order)
                        emb_first = by_stage(last_c)
                        n_b = np.where(emb_first > 0, params_stage / np.maximum(emb_first, 1.0), n_b)
                        # with the bucketed chunk gathered bucket by bucket (_dp_times' gather_last_ms), that bucket's
                        # own all-gather (its latency included), not its share of the stage's
                        g_last = by_stage(dpt["gather_last_ms"])
                        n_b = np.where(g_last > 0, gather / np.maximum(g_last, 1e-12), n_b)
                    total_g = gather
                    gather = param_gather_ms(f[:P], gather, n_b, nccl_share,
                                             first_forward_ms=pipe.first_forward_by_chunk[:, 0] if first_only else None,
                                             first_stages=first_ranks,
                                             stretch=dp_stretch(f[:P], gather, by_stage(dpt["gather_bytes"]),
                                                                "all_gather", "f", stage=True))
                    # beside the first forward what is not exposed; a later stage's one piece (first_only) goes in its
                    # warm-up wait, charged as waiting
                    hid = np.maximum(total_g - gather, 0.0)
                    if first_only:
                        hid[np.isin(np.arange(P), first_ranks, invert=True)] = 0.0
                    st_g, xj_g = hidden_power(hid, "fs")
                    gather = gather + st_g
        # the optimizer phase (cut at its barriers above): no stage clips or steps before every stage has taken its norm
        opt_end, seg_start, bar_spans = barrier_optimizer_ms(finish, seg_ms, [0.0 if "pp" in free else barrier_ms]
                                                             * len(barriers))
        total = opt_end + gather + iteration_ms
        phase = (opt_end, opt_segs, seg_ms, seg_start, bar_spans)
        if not energy:
            return float(total.max()), pipe, finish, opt_stage, gather, comm_events, None, phase
        # the computation's time per stage (the stretches a power limit puts on the overlapped spans included) and its
        # energy with what the hidden communication adds: the rest of the step is exposed communication or waiting
        # (task_f_ms, task_b_ms: each chunk's forward and backward task as scheduled, per micro-batch: what the trace's
        # F / B events last)
        work = dict(task_cmp_ms=rank_tasks((f_nc + st_f + b_nc + st_b) * n_micro),
                    task_extra_j=rank_tasks((xj_f + xj_b) * n_micro),
                    task_hidden_ms=rank_tasks((hid_f + hid_b) * n_micro),
                    task_stretch_ms=rank_tasks((np.zeros(n_chunks) + st_f + st_b) * n_micro),
                    after_cmp_ms=st_dp + st_g, after_extra_j=xj_dp + xj_g, task_f_ms=f, task_b_ms=b)
        return float(total.max()), pipe, finish, opt_stage, gather, comm_events, work, phase

    step, pipe, finish, opt_stage, gather, comm_events, work, phase = run()
    opt_end, opt_segs, seg_ms, seg_start, bar_spans = phase
    step_free = run(every_class, energy=False)[0]
    # exposed communication per class: what the step would save if that class alone were free
    # every class is named, 0.0 where the strategy has none (tp 1, ep 1, ...); a search leaves the split out
    exposed_split = ({k: max(step - run(frozenset([k]), energy=False)[0], 0.0) if k in classes else 0.0
                      for k in sorted({"tp", "dp", "pp", "cp", "ep"} | set(classes))} if comm_split else {})
    # bubble: idle time of the busiest stage inside the pipeline span (no communication counted)
    span = float(pipe.stage_end.max())
    busy = pipe.stage_busy
    bubble = float(span - busy.max())
    # model FLOPs: the unsharded training graph of one micro-batch, times micro-batches and replicas
    model_flops = model_totals["flops"] * n_micro * par.dp
    # hardware FLOPs beyond the model's: FlashAttention's recomputed scores, eager attention's masked pairs and softmax
    hw_extra = model_totals["flash_rc_flops"] + model_totals["eager_attn_extra_flops"]
    hw_flops = model_flops + hw_extra * n_micro * par.dp
    if par.recompute != "none":
        # the costed graph is one tensor-parallel rank's whole model for one micro-batch
        hw_flops += view.recompute_flops * par.tp * par.cp * n_micro * par.dp
    step_s = step / 1e3
    mfu = model_flops / (step_s * par.gpus * peak)
    hfu = hw_flops / (step_s * par.gpus * peak)
    phase_t = view.phase_ms
    # energy per GPU of each stage: the computation's kernels at their power, host launch gaps and loading the
    # micro-batches at idle, the gradient-accumulation passes (not graph kernels) at a streaming kernel's power
    # (e_f_nc, e_b_nc), the optimizer's kernels; the rest of the step is exposed communication or a wait (pipeline
    # bubble, exposed DP sync), both in an NCCL kernel that polls for its peer: communication power (p_comm);
    # communication hidden beside the computation adds its dynamic power to the computation's (work["*_extra_j"],
    # simulate.energy.overlap_power: the idle part is paid once; under a power limit the sum is capped)
    e_opt_key = ("e_opt_stage", P, V)
    e_opt_s = sums.get(e_opt_key)
    if e_opt_s is None:
        e_opt_c = chunk_sum("e_opt_j").copy()
        if tied_params > 0:
            e_opt_c[-1] += tied_opt[1]
        e_opt_s = sums[e_opt_key] = (rank_sum(e_opt_c), rank_sum(chunk_sum("e_opt_cast_j")))
    # the tasks (forward and backward of every micro-batch) over their busy time
    e_task_s = (rank_tasks((e_f_nc + e_b_nc) * n_micro) + work["task_extra_j"]
                + p_comm * np.maximum(busy - work["task_cmp_ms"], 0.0) / 1e3)
    busy_all = busy + opt_stage
    # the optimizer phase's energy per stage, term by term: its kernels sharded as its time (opt_stage), the FP8 weight
    # cast after it (cast_share), BF16_Optimizer's extra passes at a streaming kernel's power
    e_opt_j, e_opt_cast_j, e_bf16_step_j = ((e_opt_s[0] - e_opt_s[1]) * opt_share, e_opt_s[1] * cast_share,
                                            bf16_step_ms * p_stream / 1e3)
    e_opt_stage = e_opt_j + e_opt_cast_j + e_bf16_step_j
    # its terms added in their own places, not as e_opt_stage: the sum keeps the floating-point order the energy figures
    # were always computed in (adding e_opt_stage moves their last bits)
    stage_e = (e_task_s + e_opt_j + e_opt_cast_j + work["after_extra_j"] + e_bf16_step_j
               + p_comm * np.maximum(step - busy_all - work["after_cmp_ms"], 0.0) / 1e3)
    if summary:
        energy_total = float(stage_e.sum() * par.tp * lay["dp"].size)
        # the band's OOD term as the prediction reads it below (its critical rank's sums), once per chunking; nothing
        # per strategy where no rank has OOD time (the usual case)
        ood_stage = sums.get(("ood_stage", P, V), False)
        if ood_stage is False:
            a = np.array([rank_tasks(chunk_sum(k)) for k in _OOD_STAGE_FIELDS])
            ood_stage = sums[("ood_stage", P, V)] = a if a[2:].any() else None
        ood_sums = None
        if ood_stage is not None:
            crit = int(np.argmax(opt_end + gather))
            ood_sums = critical_rank_ood_sums(dict(zip(_OOD_STAGE_FIELDS, ood_stage[:, crit].tolist())), n_micro,
                                              float(opt_stage[crit] - bf16_step_ms[crit]), float(opt_by_stage[crit]))
        return StepSummary(spec.name, par, step, float(mfu), model_flops / step_s / par.gpus / 1e12, model_flops, worst,
                           fits, max(step - step_free, 0.0), max(bubble, 0.0), energy_total,
                           energy_total / step_s / par.gpus, capacity, True, ood_sums, view.per_op_fb,
                           float(data_f.sum()), n_micro, step_per_op([], 1, opt_parts), pipeline_layout=split_layout)
    # per stage: busy time, memory (computed before the schedule, above) and energy; a search reads none of it
    per_device = []
    after_j, after_ms = (np.broadcast_to(np.asarray(work[k], dtype=float), (P,)) for k in ("after_extra_j", "after_cmp_ms"))
    for s in range(P if ctx.detail else 0):
        terms = stage_terms(s)
        per_device.append(dict(stage=s, busy_ms=float(busy_all[s]), finish_ms=float(finish[s]),
                               # weights_gb: the weights with the fp32 master weights (``memory``'s weights_gb +
                               # master_weights_gb); master_weights_gb and unsharded_gradients_gb as in ``memory``
                               memory_gb=terms["total_gb"], weights_gb=terms["weights_gb"] + terms["master_weights_gb"],
                               master_weights_gb=terms["master_weights_gb"],
                               gradients_gb=terms["gradients_gb"], optimizer_gb=terms["optimizer_gb"],
                               activations_gb=terms["activations_gb"], buffers_gb=terms["buffers_gb"],
                               post_backward_buffers_gb=terms["post_backward_buffers_gb"],
                               unsharded_gradients_gb=terms["unsharded_gradients_gb"],
                               transient_gb=terms["transient_gb"],
                               # which peak memory_gb is and its terms, which sum to it (as ``memory``'s)
                               **peak_breakdown(terms), params=float(params_stage[s]),
                               energy_j=float(stage_e[s]), avg_power_w=float(stage_e[s] / step_s),
                               busy_power_w=float(e_task_s[s] / max(busy[s] / 1e3, 1e-12)), wait_power_w=float(p_comm),
                               # what the trace's power counter draws beyond busy_power_w over the tasks and
                               # wait_power_w elsewhere (simulate/trace.py): the optimizer phase's power over its span,
                               # and the communication hidden after the tasks (the DP sync beside the last backward, the
                               # parameter all-gather beside the first forward): its extra J and the ms it stretches
                               optimizer_power_w=float(e_opt_stage[s] / (opt_stage[s] / 1e3)) if opt_stage[s] > 0 else None,
                               hidden_comm_extra_j=float(after_j[s]), hidden_comm_stretch_ms=float(after_ms[s]),
                               # the communication hidden inside the tasks (TP under --tp-comm-overlap, TE's async TP
                               # backward, ...), over the step: its ms, the ms the board's cap adds to the tasks where
                               # computation + its dynamic power would exceed it (energy.overlap_power), and the J it
                               # adds to the computation's (in busy_power_w; dynamic power x ms where the cap does not bind)
                               task_hidden_comm_ms=float(work["task_hidden_ms"][s]),
                               task_hidden_comm_stretch_ms=float(work["task_stretch_ms"][s]),
                               task_hidden_comm_extra_j=float(work["task_extra_j"][s]),
                               # the board's cap on computation + a hidden collective (energy.overlap_cap_w: the
                               # power limit, else the TDP), which no sample of the trace's counter goes above
                               overlap_cap_w=float(cap_w)))
    energy_total = float(stage_e.sum() * par.tp * lay["dp"].size)
    fallback = view.fallback_ops
    events = []
    # the TP and EP collective classes a task carries (the trace's tp.* / ep.* events, comm's per-stage figures)
    task_comm = _task_comm_names(par, opts.moe_token_dispatcher, f_parts)
    if trace:
        # context parallelism: each task's ring KV exchange on the communication stream, from the task's start, for the
        # chunk's layers x (cp - 1) steps (it overlaps the task's attention; what it cannot hide is in the task)
        # per chunk, its attention layers, those of its backward and its recomputed ones (a recomputed ring and its
        # collectives run again in the backward): the layers _cp_collective_layers runs the CP collectives on
        n_attn, n_attn_b, n_attn_rc = (per_chunk(on.astype(float)) for on in _cp_collective_layers(view))
        n_ring = cp_group_sizes(par)[1]
        cp_coll_name = "allgather_kv" if par.cp_comm_type == "allgather" else "a2a_qkvo"
        z3_trace = per_unit and lay["dp"].size > 1
        # the pipeline's send/recv per task (1F1B, interleaved; DualPipe's mirrored transfers from its replay, below);
        # each TP rank sends the whole activation, or 1/tp of it then all-gathered over TP (scatter/gather,
        # ``partitioned``)
        pp_trace = P > 1 and p2p_ms > 0 and not dual
        pp_send_bytes = act_bytes / par.tp if partitioned else act_bytes
        if dual and P > 1 and p2p_ms > 0:
            # DualPipe (simulate/dualpipe.DualTransfer): each message from the later of its two ends' posts (the
            # commits' batch_isend_irecv) to its completion, as the replay timed it. Both ends' commits wait for it
            # (req.wait() on sends too) and neither end computes meanwhile; drawn once, as 1F1B's asynchronous ones, on
            # the receiver's pp track (it consumes it: its next task starts after it), the sender's post in the args
            for x in (pipe.extra or {}).get("transfers", ()):
                events.append(_pp_send_event(x.dst_rank, x.kind == 0, x.micro, "", x.start_ms, x.end_ms,
                                             from_stage=int(x.src_rank), to_stage=int(x.dst_rank),
                                             micro_batch=int(x.micro), chunk=int(x.direction),
                                             bytes=float(pp_send_bytes), blocking=False, direction=int(x.direction),
                                             from_model_stage=int(x.src_stage), to_model_stage=int(x.dst_stage),
                                             send_posted_ms=float(x.send_posted_ms),
                                             recv_posted_ms=float(x.recv_posted_ms)))
        chunk_first = np.concatenate(([0], np.cumsum(np.asarray(counts, dtype=int))))
        z2_name = f"zero2.{dp_op}" if z2_mode is not None else None
        # the TP and EP collectives: what each class adds to the task (_comm_parts: exposed, or what the overlap leaves
        # of it with the slowdown it causes), one event per task and class on the class's track from the task's start
        for tk in pipe.tasks:
            # a DualPipe task (simulate/dualpipe.DualTask) runs the chunk of its model_stage on rank tk.stage; an F&B
            # pair is named FB<forward micro-batch>+<backward micro-batch>, its two parts in forward_part_ms /
            # backward_part_ms (forward_ms / backward_ms count them)
            c = tk.model_stage if dual else tk.chunk * P + tk.stage
            pair = dual and tk.kind == "FB"
            ev = dict(stage=tk.stage, stream="compute", name=(f"FB{tk.micro}+{tk.micro_b}" if pair else f"{tk.kind}{tk.micro}")
                      + (f".c{tk.chunk}" if V > 1 else ""), start_ms=tk.start, end_ms=tk.end,
                      # the trace's args (simulate/trace.py): where the task sits in the schedule and what it runs
                      args=dict(stage=int(tk.stage), micro_batch=int(tk.micro), chunk=int(tk.chunk), virtual_stage=int(c),
                                layers=f"{chunk_first[c]}-{chunk_first[c] + int(counts[c]) - 1}"))
            if pair:
                ev.update(forward_part_ms=float(work["task_f_ms"][tk.model_stage]),
                          backward_part_ms=float(work["task_b_ms"][tk.stage_b]))
                ev["args"].update(micro_batch_b=int(tk.micro_b))
            events.append(ev)
            if pp_trace and tk.kind in ("F", "B"):
                # the pipeline transfer the task ends with (activations on to chunk c + 1, the input gradient back to
                # chunk c - 1), send_* x p2p_ms over its own hop as the schedule charges it: a blocked sender
                # (p2p_blocking) spends it at the end of its task, on the sender's pp track; otherwise it runs on the
                # dependency edge after the task, which the receiver waits for: on the receiver's pp track
                fwd_send = tk.kind == "F"
                x = float((send_f if fwd_send else send_b)[c]) * p2p_ms
                if x > 0:
                    dst = (c + 1 if fwd_send else c - 1) % P
                    a, e = (tk.end - x, tk.end) if p2p_blocking else (tk.end, tk.end + x)
                    events.append(_pp_send_event(tk.stage if p2p_blocking else dst, fwd_send, tk.micro,
                                                 f".c{tk.chunk}" if V > 1 else "", a, e,
                                                 from_stage=int(tk.stage), to_stage=int(dst), micro_batch=int(tk.micro),
                                                 chunk=int(tk.chunk), bytes=float(pp_send_bytes),
                                                 blocking=bool(p2p_blocking)))
            fwd = tk.kind in ("F", "FB")
            if fwd and data_f[c] > 0:  # loading the micro-batch: the start of the forward that reads it
                events.append(dict(stage=tk.stage, stream="compute", name=f"data_loading{tk.micro}", start_ms=tk.start,
                                   end_ms=tk.start + float(data_f[c])))
            if z3_trace:
                # ZeRO-3 / FSDP: the task's blocks' gathers (backward: gathers and reduce-scatters) on the communication
                # stream from the task's start; in series with the computation they are inside the task's time
                z3 = (z3_f_ms if tk.kind == "F" else dpt["z3_b_ms"])[c]
                if z3 > 0:  # (FSDP's ZeRO-2, SHARD_GRAD_OP: the backward's reduce-scatters alone)
                    what = ("all_gather" if tk.kind == "F" else "reduce_scatter" if sgo
                            else "all_gather+reduce_scatter")
                    events.append(dict(stage=tk.stage, stream="comm", name=f"zero{2 if sgo else 3}.{what}{tk.micro}",
                                       start_ms=tk.start,
                                       end_ms=tk.start + float(z3)))
            if z2_name and tk.kind == "B" and dpt["z2_b_ms"][c] > 0:
                # ZeRO-2 every micro-batch: the backward's gradient reductions on the communication stream, ending
                # with the task (the last bucket, launched as its backward ends, is waited for inside it)
                z2 = float(dpt["z2_b_ms"][c])
                events.append(dict(stage=tk.stage, stream="comm", name=f"{z2_name}{tk.micro}",
                                   start_ms=max(tk.end - z2, tk.start), end_ms=tk.end))
            if task_comm and tk.kind != "W":  # a W (DualPipe's weight-gradient part): its collectives are in its B
                parts = ([(f_parts, c, tk.micro)] if fwd else []) + (
                    [(b_parts, tk.stage_b if pair else c, tk.micro_b if pair else tk.micro)] if tk.kind != "F" else [])
                for key, name in task_comm:
                    t0 = tk.start
                    for d, cc, m in parts:
                        x = float(np.asarray(d[key])[cc])
                        if x > 0:
                            events.append(dict(stage=tk.stage, stream="comm", name=f"{name}{m}", start_ms=t0,
                                               end_ms=t0 + x))
                            t0 += x
            if par.cp > 1 and tk.kind != "W":  # a W (DualPipe's weight-gradient part) runs no attention
                # (forward ring, backward ring) of the task: an F&B pair runs its forward's, then its backward's; the
                # a2a / allgather collectives (cp_collectives) as their own events, named by their kind. Each lasts
                # what it adds to the task, as the tp.* / ep.* events (_comm_parts' cp class: the ring's exposed
                # steps; the collectives, exposed in full), args: the whole transfer and its hidden part (until stop
                # 58 a ring event lasted its whole transfer, mostly hidden, and an a2a / allgather one its exposed
                # time: the track's meaning changed with --cp-comm-type, audit 58b finding 3)
                rings = []
                if fwd:
                    coll = n_attn[c] * cp_coll[0]
                    rings.append((tk.micro, "forward", "ring_kv", n_attn[c] * (n_ring - 1) * cp_step_ms[0],
                                  float(np.asarray(f_parts["cp"])[c]) - coll))
                    rings.append((tk.micro, "forward", cp_coll_name, coll, coll))
                if tk.kind != "F":
                    cb, mb = (tk.stage_b, tk.micro_b) if pair else (c, tk.micro)
                    coll = n_attn_b[cb] * cp_coll[1] + n_attn_rc[cb] * cp_coll[0]
                    rings.append((mb, "backward", "ring_kv", n_attn[cb] * ring_backward_transfer_ms(n_ring, *cp_step_ms)
                                  + n_attn_rc[cb] * (n_ring - 1) * cp_step_ms[0],
                                  float(np.asarray(b_parts["cp"])[cb]) - coll))
                    rings.append((mb, "backward", cp_coll_name, coll, coll))
                t0 = tk.start
                for m, direction, what, moved, exposed in rings:
                    if moved > 0:  # a ring hidden in full is an event of 0 ms: its args say what it moved
                        exposed = min(max(exposed, 0.0), moved)
                        events.append(dict(stage=tk.stage, stream="comm", name=f"cp.{what}{m}", start_ms=t0,
                                           end_ms=t0 + exposed, args=cp_event_args(
                                               what, direction, m, moved, exposed, n_ring, cp_step_ms,
                                               par.cp_comm_type)))
                        t0 += exposed
        for s, name, a, e in comm_events:
            events.append(dict(stage=s, stream="comm", name=name, start_ms=a, end_ms=e))
        for s, a, e, n_hidden in pipe.trace_gaps:  # an extrapolated step: its steady state is not drawn
            events.append(dict(stage=s, stream="compute", name=f"[{n_hidden:,} tasks of the steady state not drawn]",
                               start_ms=float(a), end_ms=float(e)))
        trace_name = {part: name for name, part, _ in optimizer_trace_parts(opt_parts, g.meta.get("optimizer"),
                                                                             g.meta.get("optimizer_impl"))}
        for s in range(P):
            # the optimizer phase, one event per segment between its barriers (optimizer_segments; one without a
            # pipeline): its parts in the step's order (trace name, part, ms; they add up to it), each drawn inside it
            for i, (seg, m) in enumerate(zip(opt_segs, seg_ms)):
                if m[s] > 0:
                    t = float(seg_start[i][s])
                    parts = [(trace_name[part], part, float(ms[s])) for part, ms in seg if ms[s] > 0]
                    events.append(dict(stage=s, stream="compute", name="optimizer", start_ms=t, end_ms=t + float(m[s]),
                                       args={f"{name}_ms": ms for name, _, ms in parts}, parts=parts))
                if i < len(bar_spans):  # every stage in the all-reduce from the last one's arrival to its end
                    a, e = bar_spans[i]
                    events.append(dict(stage=s, stream="comm", name=f"pp.{barriers[i]}_all_reduce", start_ms=a, end_ms=e))
            t = float(opt_end[s])
            if gather[s] > 0:  # the distributed optimizer's parameter all-gather: what of it the step waits for
                events.append(dict(stage=s, stream="comm", name="dp.param_all_gather", start_ms=t, end_ms=t + float(gather[s])))
            t += float(gather[s])
            if iteration_ms > 0:  # the framework's per-iteration host time (the GPU waits)
                events.append(dict(stage=s, stream="compute", name="host.iteration", start_ms=t, end_ms=t + float(iteration_ms)))
    meta = dict(g.meta, n_layers=n_layers, param_count=model_totals["param_count"], n_micro=n_micro, stage_layers=counts,
                pipeline_layout=split_layout, zero3_prefetch=ctx.zero3_prefetch if per_unit else None,
                # DeepSpeed's gradient-accumulation dtype (None: not a DeepSpeed bf16 step)
                grad_accum_dtype=resolved_grad_accum_dtype(opts.framework, ctx.grad_accum_dtype, dtype, par.zero),
                # whether pipeline transfers were scattered over TP and all-gathered (None: no pipeline transfers)
                scatter_gather_p2p=bool(partitioned) if P > 1 else None)
    # the step band's OOD term: the critical rank's (the stage that ends the step), its OOD kernels' share of its time
    crit = int(np.argmax(opt_end + gather))
    crit_sums = critical_rank_ood_sums({k: float(rank_tasks(chunk_sum(k))[crit]) for k in _OOD_STAGE_FIELDS}, n_micro,
                                       float(opt_stage[crit] - bf16_step_ms[crit]), float(opt_by_stage[crit]))
    ood = ood_from_critical_sums(crit_sums)
    warn = ood_warning(float(ood.get("share", 0.0)))
    meta["ood_band"] = dict(ood)  # the step band's OOD term (validation/step_band.py scores rows with it)
    meta["ood_shares"] = _ood_shares(ood, crit_sums, n_micro * float(rank_tasks(chunk_sum("coll_ms"))[crit]))
    meta = with_warnings(meta, [*ctx.notes, *split_notes, *straddling_group_notes(par, ctx.cl.gpus_per_node),
                                *tp_overlap_notes(par, ctx.cl, ctx.opts.framework), *([warn] if warn else [])])
    if dual:
        meta["dualpipe"] = dualpipe_summary(pipe)
    if pipe.extrapolated:
        meta["schedule_extrapolated"] = dict(
            simulated_micro=int(pipe.simulated_micro), period_ms=float(np.max(pipe.period_ms)),
            note=f"{n_micro:,} micro-batches: the pipeline schedule was simulated task by task for "
                 f"{pipe.simulated_micro:,} and its steady state extrapolated (one more micro-batch adds "
                 f"{float(np.max(pipe.period_ms)):.6g} ms)")
        if trace:
            meta["trace_truncated"] = ("the trace draws the first half and the last quarter of the tasks of a "
                                       f"{pipe.simulated_micro:,} micro-batch schedule, the latter at the end of the step; "
                                       "one event per stage marks the steady state between them, not drawn")
    data_micro = float(data_f.sum())
    data_rows = ()
    if data_micro > 0:  # every micro-batch's loading, on the stages that read it
        n_ops = sum(v["copies"] + v["broadcasts"] + v["kernels"] for v in data_info["per_micro"].values())
        data_rows = (dict(op_class="data_loading", count=int(n_ops) * n_micro, time_ms=data_micro * n_micro, flops=0.0,
                          launch_gap_ms=0.0),)
    per_op = step_per_op(view.per_op_fb, n_micro, opt_parts, g.meta.get("optimizer_impl"), data_rows)
    comm = dict(tp_ms_per_micro=float(tp_coll.sum()), p2p_ms=p2p_ms,
                # named overheads of one rank's graph: per micro-batch, the optimizer and clipping once per step
                # (before ZeRO sharding); the accumulation pass between micro-batches is grad_accumulation_ms_per_micro;
                # data_loading_ms: loading one micro-batch on the stages that read it (first and last, summed)
                rank_overheads_ms=dict(view.overheads, data_loading_ms=data_micro),
                data_loading=data_info,
                rank_overheads_scope=("the whole model at this TP degree, one micro-batch; optimizer and clipping before "
                                      "the pipeline split and ZeRO sharding (optimizer_ms is what one device spends; "
                                      "per_op and optimizer_parts_ms_by_stage are the step's, sharded)"),
                # the optimizer phase of one GPU of each stage by part (trace name -> ms per stage; per stage they add
                # up to its optimizer step, optimizer_ms the busiest's): sharded as the step charges it, as the trace's
                # optimizer parts
                optimizer_parts_ms_by_stage={name: np.asarray(ms, dtype=float).tolist()
                                             for name, _, ms in optimizer_trace_parts(opt_parts, g.meta.get("optimizer"),
                                                                                      g.meta.get("optimizer_impl"))},
                optimizer_ms_by_stage=np.asarray(opt_stage, dtype=float).tolist(),
                # a pipeline's optimizer barriers (optimizer_barriers: "found_inf", "grad_norm"), the 4-byte
                # all-reduce each one costs, and per stage the time its optimizer phase waits at them (the all-reduces
                # included): each stage's phase ends at finish_ms + optimizer_ms_by_stage + this
                **(dict(optimizer_barriers=list(barriers), optimizer_barrier_all_reduce_ms=barrier_ms,
                        optimizer_barrier_wait_ms_by_stage=np.maximum(opt_end - finish - opt_stage, 0.0).tolist())
                   if barriers else {}),
                cp_exposed_ms_per_micro=float((cp_f_ms + cp_b_ms).sum()), cp_kv_step_ms=list(cp_step_ms),
                # per class (tp, ep; tp_ep under the all-gather dispatcher), per stage: what its collectives add to one
                # micro-batch's tasks (forward + backward of the stage's chunks; exposed, or what an overlap leaves
                # with the slowdown it causes): the trace's tp.* / ep.* events per micro-batch
                # (and cp, with context parallelism: the ring's exposed steps and the a2a / allgather collectives,
                # the trace's cp.* events, whose args give the whole transfer and its hidden part)
                task_comm_ms_per_micro_by_stage={
                    k: np.asarray(rank_tasks(np.asarray(f_parts[k]) + np.asarray(b_parts[k])), dtype=float).tolist()
                    for k in [k for k, _ in task_comm] + (["cp"] if par.cp > 1 else [])},
                **(dict(cp_comm_type=par.cp_comm_type, cp_collective_ms=list(cp_coll),
                        hierarchical_cp_sizes=list(par.hierarchical_cp_sizes or ()) or None)
                   if par.cp > 1 and par.cp_comm_type != "p2p" else {}),
                # the data-parallel gradient sync and parameter all-gather one GPU runs (its stage's chunks), ms: the
                # busiest stage's (each stage's in *_by_stage; until stop 40 the stages' were summed)
                dp_sync_ms=float(by_stage(dpt["sync_ms"]).max()),
                dp_param_gather_ms=float(by_stage(dpt["gather_after_ms"]).max()),
                dp_sync_ms_by_stage=by_stage(dpt["sync_ms"]).tolist(),
                dp_param_gather_ms_by_stage=by_stage(dpt["gather_after_ms"]).tolist(),
                # ZeRO-3 / FSDP: each unit's parameter all-gathers (forward and backward) and gradient reduce-scatters,
                # per micro-batch, the busiest stage's (how much of it is hidden: exposed_comm_split_ms's dp)
                **(dict(dp_zero3_ms_per_micro=float(by_stage(dpt["z3_f_ms"] + dpt["z3_b_ms"]).max()))
                   if par.zero == 3 else {}),
                # Megatron-FSDP's ZeRO-3: the parameters outside its units gathered once a step (not in the above)
                **(dict(dp_zero3_root_gather_ms_per_step=float(by_stage(dpt["z3_root_f_ms"]).max()),
                        dp_zero3_root_gather_bytes_per_step=float(by_stage(dpt["z3_root_f_bytes"]).max()))
                   if par.zero == 3 and root_c is not None else {}),
                **dp_zero2_meta(dpt, by_stage, every_micro=z2_mode is not None, shard_grad_op=sgo),
                grad_accumulation_ms_per_micro=float(acc_ms.sum()),
                # a tied word embedding under a pipeline: the last stage's copy (parameters per TP rank) and the
                # first/last stage gradient all-reduce, once per step
                **(dict(tied_embedding_copy_params=tied_params, embedding_grad_allreduce_bytes=tied_ar_bytes,
                        embedding_grad_allreduce_ms=tied_ar_ms) if tied_params > 0 else {}),
                # inter_senders_per_node: the node's GPUs sending across nodes at once with the group's collectives
                # (its kind's other groups beside it: GroupLayout.concurrent), for groups that span nodes
                layouts={k: dict(size=v.size, gpus_per_node=v.gpus_per_node, nodes=v.nodes,
                                 **({} if v.concurrent is None else dict(inter_senders_per_node=v.concurrent)))
                         for k, v in lay.items() if k not in CP_SUBGROUPS})
    return DistributedPrediction(
        model=str(g.meta.get("name")), device=spec.name, cluster=cl.name, gpus=par.gpus, parallel=par, step_time_ms=step,
        # the scheduled tasks (overlap, exposed communication, loading, accumulation: the trace's F / B events), summed
        forward_ms=float(work["task_f_ms"].sum()) * n_micro, backward_ms=float(work["task_b_ms"].sum()) * n_micro,
        forward_serial_ms=phase_t["forward"] * n_micro, backward_serial_ms=phase_t["backward"] * n_micro,
        optimizer_ms=float(opt_stage.max()), exposed_comm_ms=max(step - step_free, 0.0), bubble_ms=max(bubble, 0.0),
        exposed_comm_split_ms=exposed_split,
        mfu=float(mfu), hfu=float(hfu), tflops_per_gpu=model_flops / step_s / par.gpus / 1e12, flops=model_flops,
        memory_gb=worst, memory=worst_terms or {}, fits=fits,
        memory_capacity_gb=capacity, per_device=per_device, per_op=per_op, fallback_ops=fallback,
        ood_fraction=view.ood_fraction, comm=comm, events=events,
        meta=meta,
        energy_j=energy_total, avg_power_w=energy_total / step_s / par.gpus, power_limit_w=power_limit_w,
        step_band=step_band(step, "cluster", spec, per_op, ctx.bundle, tensor=dtype != "fp32", ood=ood,
                            fp8=g.meta.get("precision") == "fp8"))
