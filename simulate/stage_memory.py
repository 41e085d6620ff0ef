"""Memory of one pipeline stage of a distributed training step, term by term, as the frameworks allocate it.

Pure functions over counts (parameters held by the stage, activation bytes of one micro-batch per model chunk);
every term cites the equation or the framework code it follows. Units are in the names.

- Model states, mixed precision (Megatron-LM ``megatron/training/theoretical_memory_usage.py``; Rajbhandari et al.
  2020, ZeRO Sec. 3.1): half-precision weights (2 B/param), fp32 main gradients (4 B/param: Megatron's
  ``main_grad`` buffer, DeepSpeed's fp32 gradient partitions, PyTorch AMP's fp32 ``.grad``), fp32 master weights
  (4 B/param) and Adam's two fp32 moments (8 B/param): 18 B/param without sharding. The distributed optimizer /
  ZeRO-1 shards master weights and moments over the data-parallel group (Megatron: 6 + 12/d B/param), ZeRO-2 also
  the gradients, ZeRO-3 / FSDP the weights too. Full precision (fp32): 4 + 4 + 8 = 16 B/param. ``--optimizer
  adamw-bf16`` (Megatron-Core's precision-aware optimizer with bf16 moments, DeepSeek-V3's AdamW) keeps the moments
  at 2 B each: 6 + 8/d B/param under the distributed optimizer. PyTorch FSDP (``hf``, ZeRO-3) under mixed precision
  holds no half-precision shard and no separate master copy: its one persistent parameter is the fp32 sharded flat
  parameter the optimizer steps, so 4 + 4 + 8 = 16/d B/param (:func:`weight_and_master_bytes`, torch 2.13 source
  cited there); DeepSpeed ZeRO-3 keeps both (``stage3.py`` ``_create_fp32_partitions``: an fp32 clone of each
  half-precision partition).
- Expert parameters of a mixture of experts are sharded over the expert-data-parallel group instead, the ranks that
  hold the same experts: world / (etp x ep x pp) ranks (Megatron-Core ``parallel_state``'s expert mesh; its
  ``DistributedDataParallel`` keeps the expert parameters in their own grad/param buffers over
  ``get_expert_data_parallel_group()`` and ``get_megatron_optimizer`` builds their distributed optimizer over that
  group; DeepSpeed's MoE parameter groups are partitioned over its expert-data-parallel group likewise). The graph
  builder splits each expert over the TP ranks like a dense MLP (expert TP = TP), so that group is dp x cp / ep:
  an expert parameter's master weights and moments take 12·ep/(dp·cp) B under the distributed optimizer, not
  12/(dp·cp) (``expert_params``, ``expert_dp``: with ep = 1 the group is the DP group and nothing changes).
- Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Eq. 1-6):
  per layer and micro-batch what the rank graph saves for backward (``activation_bytes_by_layer``; 34·s·b·h/t under
  sequence parallelism with selective recomputation, s·b·h·(34 + 5as/h)/t with SP and no recomputation,
  2·s·b·h/t kept per layer under full recomputation plus one layer re-materialised); the first stage holds as many
  micro-batches as 1F1B keeps in flight (p, Sec. 4.2.3: L/p layers x p micro-batches = L layers' worth), the
  interleaved schedule (1 + (p-1)/(p·v)) times that (Narayanan et al. SC21 Sec. 2.2.2), GPipe every micro-batch.
  Each saved tensor counts on the stage whose layer keeps it (simulate/memory.py ``kept_tensors``): a stage (a model
  chunk) holds the input it received and not the output it sent, which Megatron-LM frees once sent
  (``deallocate_pipeline_outputs = True``, megatron/training/argument_utils.py l. 305, megatron-core 0.19.2;
  pipeline_parallel/schedules.py l. 166 ``deallocate_output_tensor``); so the first stage holds its layers and the
  embedding's dropout mask, the last its layers and its head, as Megatron-LM's ``theoretical_memory_usage`` has them.
- The largest kernel's working set (``transient_gb``): each stage's layers' largest forward kernel's inputs + output
  beyond the held weights, the loss's on the last stage (what the framework's cross-entropy holds beyond what it
  saves: PyTorch's fp32 loss 12 - db bytes a logit, Megatron-Core's db; featurize/op_graph.py loss_working_bytes),
  per micro-batch and TP rank's vocabulary shard, held beside the activations as one device holds its own; under
  context parallelism's KV ring one ring step's (Transformer Engine's two per-step buffers, not the cp - 1 steps the
  graph costs as one node: featurize/op_graph.py ``flash_attention``)
  (simulate/memory.py ``transient_bytes_by_layer``; until stop 55 a stage had none, and a one-GPU cluster of GPT-2 at
  batch 96 x 1,024 tokens fitted an A100 80GB at 67.4 GB where ``predict`` said 86.7 GB).
- Framework buffers (their own line): PyTorch DDP's gradient buckets are a second copy of the gradients unless
  ``gradient_as_bucket_view=True`` (``torch.nn.parallel.DistributedDataParallel`` docs: the saving "will be equal
  to the total gradients size"), allocated with the model, so held during the passes; FSDP holds the unsharded
  parameters of the running and the prefetched unit (one transformer block each: llm-foundry wraps per block,
  ``forward_prefetch``/``backward_prefetch``) and of its root unit, everything outside the blocks (embeddings, final
  norm, an untied LM head), which it gathers at the start of the forward and does not reshard until the backward
  ends (PyTorch 2.13 FSDP1 ``torch/distributed/fsdp/_runtime_utils.py`` ``_post_forward_reshard``: "Do not free the
  root's parameters in the post-forward for ``FULL_SHARD``", ``free_unsharded_flat_param = not state._is_root and
  ...``; FSDP2 ``_fully_shard/_fsdp_state.py`` ``_lazy_init``: "For the root, do not reshard after forward",
  ``post_forward_mesh_info = None``): 2.1 GB in bf16 for Llama 3 8B's 128,256 x 4,096 embedding and head. FSDP's
  unsharded gradients are their own line (:func:`fsdp_inflight_gradient_bytes` during the backward); at its end no
  block is unsharded, and the root unit's gradient is made beside the first block's in reduction
  (:func:`fsdp_end_of_backward_bytes`). DeepSpeed below ZeRO-2 flattens gradients into reduce buckets of up to
  ``reduce_bucket_size`` = 5e8 elements (DeepSpeed's default config) when it reduces them, after the last
  micro-batch's backward (activations freed by then: a second peak, not added to the first); at ZeRO-2/3 it holds
  that bucket (and ZeRO-3 its prefetch bucket) through the passes and makes fp32 gradients at the step
  (:func:`deepspeed_buffer_bytes`); Megatron-LM's
  distributed optimizer reduces and gathers in place in its contiguous grad and param buffers (no extra copy).
  Plus the cuBLAS workspace of the compute stream (PyTorch: 32 MiB on sm90 and later, ``CUBLAS_WORKSPACE_CONFIG``
  default): taken as 32 MiB.
- Gradients are held in the dtype the framework keeps them in: fp32 for PyTorch AMP (fp32 parameters) and for
  Megatron-LM with bf16 (``--accumulate-allreduce-grads-in-fp32``, which Megatron sets for bf16; its theoretical
  memory formula assumes it; bf16 under ``--grad-reduce-in-bf16``, ``grad_accum_dtype="bf16"``),
  the half-precision dtype for Megatron-LM fp16 (without ``--accumulate-allreduce-grads-in-fp32``; from either
  half-precision buffer Megatron-Core makes an fp32 copy of the rank's shard after the backward, its optimizer at
  ZeRO-0/1, Megatron-FSDP's buffer at ZeRO-2/3: :func:`megatron_main_grad_bytes`, :func:`main_grad_cast_bytes`),
  DeepSpeed ZeRO-2/3's gradient
  partitions (:func:`held_gradient_bytes`) and DeepSpeed's fp16 engine (its fp32
  master gradients are made at the optimizer step, after the activations are freed), half plus fp32 for
  DeepSpeed's ``BF16_Optimizer`` (it accumulates into fp32 gradients after every micro-batch), which
  ``megatron-deepspeed`` with bf16 below ZeRO-2 is taken to run by default (:func:`held_gradient_bytes`); at ZeRO-1
  with ``grad_accum_dtype="bf16"`` (DeepSpeed's ``data_types.grad_accum_dtype``, whose absence means the model's
  dtype in DeepSpeed 0.19.8) its ZeRO optimizer instead: bf16 gradients, and at the step a flat bf16 copy and an
  fp32 copy of the rank's partition (:func:`deepspeed_zero1_step_bytes`).

- Transformer Engine's userbuffers under ``--tp-comm-overlap`` (TE 2.9 ``transformer_engine/pytorch/module/base.py``
  ``initialize_ub``): one communication buffer per overlapped GEMM of a transformer layer, shared by every layer --
  ring-exchange qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad; pipeline proj_fprop, fc2_fprop; bulk qkv_dgrad,
  qkv_wgrad, fc1_dgrad, fc1_wgrad; external proj_wgrad, fc2_wgrad: 12 -- each of the shape Megatron-LM passes,
  (sequence x micro-batch / cp, hidden) (``megatron/training/initialize.py`` ``_initialize_tp_communicators``), in
  the parameters' dtype; under an FP8 recipe the 8 that feed all-gathers hold uint8 (``fp8_buf``), and TE repeats its
  cuBLAS workspace for its 3 userbuffer streams (``_NUM_MAX_UB_STREAMS``; 2 more than the compute stream's):
  :func:`userbuffer_bytes`, held for the whole step with the other buffers.
- The CUDA context with cuBLAS/NCCL handles: 0.5 GB (an assumption: PyTorch reports 0.3-0.6 GB per process on
  Ampere/Hopper with CUDA's lazy module loading), with the buffers.
- Capacity: a catalog "80 GB" is binary (HBM stacks of 2^n GiB: nvidia-smi shows 81,920 MiB on an A100 80GB, 32,768
  MiB on a V100 32GB), so the memory a stage may use is ``memory_gb`` GiB = 85.9 GB for 80 (:func:`capacity_gb`).

Not counted (stated): allocator fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wattcast.data.kernel_ops import DTYPE_BYTES
from wattcast.featurize.training_graph import optimizer_state_bytes

GB = 1e9
#: cuBLAS workspace of one stream (PyTorch's default on sm90+, ``CUBLAS_WORKSPACE_CONFIG``): 32 MiB
CUBLAS_WORKSPACE_BYTES = 32 * 2**20
#: the CUDA context with cuBLAS and NCCL handles (an assumption; 0.3-0.6 GB measured per process with lazy loading)
CUDA_CONTEXT_BYTES = 0.5e9
GIB = 2**30
#: DeepSpeed's default ``reduce_bucket_size`` (elements): its gradient reduce buckets are flattened copies
DEEPSPEED_BUCKET_ELEMENTS = 5e8
#: DeepSpeed's default ``stage3_prefetch_bucket_size`` (elements; DeepSpeed 0.19.8 ``runtime/zero/config.py``
#: ``prefetch_bucket_size: int = Field(pp_int(5e7))``): ZeRO-3 parameters gathered ahead of the running module
DEEPSPEED_PREFETCH_BUCKET_ELEMENTS = 5e7
#: DeepSpeed's default ``sub_group_size`` (elements; ``runtime/zero/config.py`` ``Field(pp_int(1e9))``): ZeRO-3 steps
#: its partition sub-group by sub-group, making each one's fp32 gradient as it goes
DEEPSPEED_SUB_GROUP_ELEMENTS = 1e9
#: Transformer Engine's userbuffers (``initialize_ub``, TE 2.9): the buffers of the 8 overlapped GEMMs whose
#: communication is an all-gather (FP8 under an FP8 recipe: ``layers_all_gather_overlap``) and of the other 4
UB_ALL_GATHER_BUFFERS = 8
UB_OTHER_BUFFERS = 4
#: the extra cuBLAS workspaces TE allocates for its userbuffer streams (``get_workspace().repeat(3)``: 3 in all, one
#: of which stands for the compute stream's counted in :data:`CUBLAS_WORKSPACE_BYTES`)
UB_EXTRA_WORKSPACES = 2


def userbuffer_bytes(*, tokens: float, hidden: int, dtype_bytes: int, fp8: bool) -> float:
    """Bytes of Transformer Engine's userbuffers for TP communication overlap (module docstring): 12 buffers of
    ``tokens`` (sequence x micro-batch / cp) x ``hidden`` elements, the 8 all-gather ones at 1 B under an FP8 recipe,
    plus the workspaces of TE's userbuffer streams."""
    elems = float(tokens) * float(hidden)
    ag_bytes = 1 if fp8 else dtype_bytes
    return elems * (UB_ALL_GATHER_BUFFERS * ag_bytes + UB_OTHER_BUFFERS * dtype_bytes) \
        + UB_EXTRA_WORKSPACES * CUBLAS_WORKSPACE_BYTES


def _sharded(nbytes, params, expert_params, d: int, de: int):
    """``nbytes(params) / d`` with the expert parameters' share over ``de`` ranks instead (their expert-data-parallel
    group): ``nbytes(params - expert) / d + nbytes(expert) / de``. When the two groups are one (no experts, ep = 1, or
    a term not sharded) the plain ``nbytes(params) / d``, the same floating-point figure as before experts counted."""
    if de == d:
        return nbytes(params) / d
    return nbytes(params - expert_params) / d + nbytes(expert_params) / de


def pytorch_fsdp(framework: str, zero: int) -> bool:
    """Whether ZeRO stage ``zero`` is PyTorch FSDP (``hf`` with ZeRO-2 or 3: ``ShardingStrategy.SHARD_GRAD_OP``,
    :func:`fsdp_shard_grad_op`, or ``FULL_SHARD``): both shard the flat parameter and reduce-scatter each unit's
    gradients as its backward ends."""
    return framework == "hf" and int(zero) >= 2


def megatron_fsdp(framework: str, zero: int) -> bool:
    """Whether ZeRO stage ``zero`` is Megatron-FSDP (``megatron`` with ZeRO-2, ``optim_grads``, or ZeRO-3,
    ``optim_grads_params``; megatron-core 0.16.1 ``distributed/fsdp/src/megatron_fsdp``): :func:`pytorch_fsdp`'s
    counterpart for Megatron-LM."""
    return framework == "megatron" and int(zero) >= 2


def fsdp_shard_grad_op(framework: str, zero: int) -> bool:
    """Whether ZeRO-2 is PyTorch FSDP's ``ShardingStrategy.SHARD_GRAD_OP`` (``hf``, ``zero`` 2): unit by unit, as ZeRO-3
    (simulate/distributed.py ``_dp_times``' per-unit collectives, in series or prefetched as its
    ``zero3_prefetch`` says), but the forward's
    gathers are kept for the backward (torch 2.13 ``torch/distributed/fsdp``):

    - ``_init_utils.py`` l. 72 maps it to ``HandleShardingStrategy.SHARD_GRAD_OP``, which ``_flat_param.py`` l. 112-119
      puts in ``NO_RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES``, not ``RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES``;
    - every micro-batch's forward all-gathers each unit (``_pre_forward_unshard`` -> ``_unshard``,
      ``_runtime_utils.py`` l. 411): the post-backward of the previous one freed it (``_post_backward_reshard``
      l. 793-799 with ``_should_free_in_backward`` l. 811-827: True while ``_sync_gradients``, i.e. outside
      ``no_sync()``);
    - ``_post_forward_reshard`` (l. 486-500) does not free it (``free_unsharded_flat_param`` needs a
      reshard-after-forward strategy), so the backward's ``_pre_backward_hook`` ``_unshard`` (l. 673-684) finds it
      unsharded: ``FlatParamHandle.needs_unshard`` (``_flat_param.py`` l. 1385-1393) is False and ``unshard``
      returns before ``_all_gather_flat_param`` (l. 1371-1382): no backward re-gather;
    - each unit's gradient is reduce-scattered as its backward ends (``_post_backward_hook`` l. 701 ->
      ``_reduce_grad`` l. 831), every micro-batch, the shard accumulated in ``_saved_grad_shard`` (l. 918-926).

    ``no_sync()`` (which skips the reduce-scatters and keeps the unsharded parameters between micro-batches,
    l. 743 and 825) is not modelled: every micro-batch reduces."""
    return framework == "hf" and int(zero) == 2


def _zero_groups(zero: int, dp: int, expert_dp: int | None, framework: str | None = None) -> dict[int, tuple[int, int]]:
    """Per ZeRO level (1: master weights and moments, 2: gradients, 3: weights) the ranks (DP group, expert-DP group)
    a term of that level is sharded over under ZeRO stage ``zero``: both groups from that stage on (at least 1; the
    expert-DP group is the DP group unless given), else (1, 1). PyTorch FSDP's ZeRO-2 (``framework`` ``hf``, ``zero``
    2: ``SHARD_GRAD_OP``) shards the weights too: its persistent parameter is the flat parameter's shard, the unsharded
    one lives from a unit's forward to the end of its backward (:func:`buffer_bytes`)."""
    dp = max(int(dp), 1)
    edp = dp if expert_dp is None else max(int(expert_dp), 1)
    sgo = fsdp_shard_grad_op(framework, zero)
    return {k: (dp, edp) if zero >= k or (k == 3 and sgo) else (1, 1) for k in (1, 2, 3)}


@dataclass(frozen=True)
class StageMemory:
    """Bytes of one stage's device, term by term (see the module docstring for each equation). The peak is the
    larger of the passes' (model states + activations + buffers) and the gradient reduction's after the last
    backward (model states + ``post_backward_buffers_bytes``, activations freed)."""

    weights_bytes: float
    master_weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float
    post_backward_buffers_bytes: float = 0.0
    #: FSDP's unsharded gradients held beside the activations in the backward (:func:`fsdp_inflight_gradient_bytes`)
    unsharded_gradients_bytes: float = 0.0
    #: the stage's largest kernel working set beside its activations (simulate/memory.py transient_bytes_by_layer)
    transient_bytes: float = 0.0

    @property
    def states_bytes(self) -> float:
        return self.weights_bytes + self.master_weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return self.states_bytes + max(self.activations_bytes + self.transient_bytes
                                       + (self.buffers_bytes + self.unsharded_gradients_bytes),
                                       self.post_backward_buffers_bytes)

    def to_gb_dict(self) -> dict:
        # by hand rather than dataclasses.asdict (a deep copy): this runs per stage of every configuration a search
        # evaluates
        return dict(weights_gb=self.weights_bytes / GB, master_weights_gb=self.master_weights_bytes / GB,
                    gradients_gb=self.gradients_bytes / GB, optimizer_gb=self.optimizer_bytes / GB,
                    activations_gb=self.activations_bytes / GB, buffers_gb=self.buffers_bytes / GB,
                    post_backward_buffers_gb=self.post_backward_buffers_bytes / GB,
                    unsharded_gradients_gb=self.unsharded_gradients_bytes / GB,
                    transient_gb=self.transient_bytes / GB, total_gb=self.total_bytes / GB)


#: the terms of :meth:`StageMemory.to_gb_dict` held at each of a stage's two peaks (:func:`peak_breakdown`): the model
#: states always; in the passes the activations, the buffers held through them (userbuffers included) and FSDP's
#: unsharded gradients; after the last backward (activations freed) the buffers made then
STATE_TERMS = ("weights_gb", "master_weights_gb", "gradients_gb", "optimizer_gb")
PEAK_TERMS = {"backward": STATE_TERMS + ("activations_gb", "transient_gb", "buffers_gb", "unsharded_gradients_gb"),
              "after_backward": STATE_TERMS + ("post_backward_buffers_gb",)}


def peak_breakdown(terms: dict) -> dict:
    """Which of a stage's two peaks its ``total_gb`` is, and the terms held there: ``terms`` are one stage's
    :meth:`StageMemory.to_gb_dict` (or a ``stage_memory_gb`` row), whose ``total_gb`` is states + max(activations +
    buffers + unsharded gradients, post-backward buffers) -- so the terms of the dict do not add up to it (ZeRO-3 /
    FSDP: both sides non-zero). ``peak_phase``: "backward" (the passes, the last micro-batch's backward beginning with
    every in-flight activation held) or "after_backward" (the gradient reduction / optimizer step's temporaries after
    the activations are freed; a tie is "backward"); ``peak_terms_gb``: the :data:`PEAK_TERMS` of that phase, which
    sum to ``total_gb`` (the same additions in GB)."""
    during = (terms["activations_gb"] + terms.get("transient_gb", 0.0)) + terms["buffers_gb"] \
        + terms["unsharded_gradients_gb"]
    phase = "backward" if during >= terms["post_backward_buffers_gb"] else "after_backward"
    return dict(peak_phase=phase, peak_terms_gb={k: float(terms[k]) for k in PEAK_TERMS[phase]})


#: the values of DeepSpeed's ``data_types.grad_accum_dtype`` wattcast models (``DistributedOptions.grad_accum_dtype``)
GRAD_ACCUM_DTYPES = ("fp32", "bf16")


def deepspeed_zero_optimizer_bf16(framework: str, dtype: str, zero: int, grad_accum_dtype: str | None) -> bool:
    """Whether DeepSpeed runs its ZeRO stage-1 optimizer on bf16 gradients rather than ``BF16_Optimizer``:
    ``megatron-deepspeed`` with bf16 parameters at ZeRO-1 and ``grad_accum_dtype`` "bf16". DeepSpeed 0.19.8
    ``runtime/engine.py`` ``_do_optimizer_sanity_check`` (l. 2294-2323) picks ``BFLOAT16`` (``BF16_Optimizer``) at
    stage 1 only for ``model_dtype == torch.bfloat16 and grad_accum_dtype == torch.float32`` (l. 2305-2310), else
    ``ZERO_OPTIMIZATION`` (``stage_1_and_2.py``); ``get_data_types`` (l. 1799-1810) takes the model's dtype when the
    config has no ``data_types.grad_accum_dtype``. At ZeRO-0 and ZeRO-2/3 the option changes nothing here (the
    option's notes say why)."""
    return (framework == "megatron-deepspeed" and dtype == "bf16" and int(zero) == 1
            and grad_accum_dtype == "bf16")


def deepspeed_bf16_optimizer_accum(framework: str, dtype: str, zero: int, grad_accum_dtype: str | None) -> str | None:
    """The gradient-accumulation dtype ("fp32" / "bf16") of DeepSpeed's ``BF16_Optimizer`` when DeepSpeed 0.19.8 runs
    it for ``megatron-deepspeed`` (whose model is a ``PipelineModule``, ``GPTModelPipe``, at ZeRO-0/1), else None.
    ``runtime/engine.py`` ``_do_optimizer_sanity_check`` (l. 2294-2323): ZeRO-1 with bf16 runs it only under
    ``grad_accum_dtype`` fp32 (l. 2305-2310; "bf16" there is the ZeRO optimizer, :func:`deepspeed_zero_optimizer_bf16`;
    None, wattcast's default here, is fp32: BLOOM-176B's); ZeRO-2/3 never (l. 2311: ``ZERO_OPTIMIZATION``); ZeRO-0
    with bf16 and a pipeline runs it with the model's dtype as accumulation dtype (l. 2313-2320, ``get_data_types``
    l. 1799-1810 takes the model's dtype without ``data_types.grad_accum_dtype``: "bf16", the value for None). ZeRO-0
    with ``grad_accum_dtype`` fp32 raises ``NotImplementedError`` in 0.19.8 (l. 2323); the older DeepSpeed BLOOM ran
    (stage 0, bf16, fp32 accumulation) did it: costed so, with a warning (``distributed.grad_accum_dtype_notes``)."""
    if framework != "megatron-deepspeed" or dtype != "bf16" or int(zero) >= 2:
        return None
    if int(zero) == 1:
        return None if grad_accum_dtype == "bf16" else "fp32"
    return "fp32" if grad_accum_dtype == "fp32" else "bf16"


def effective_grad_accum(framework: str, dtype: str, zero: int, grad_accum_dtype: str | None) -> str | None:
    """What the stage-memory functions take as ``grad_accum_dtype`` (:func:`stage_memory`): the accumulation dtype of
    DeepSpeed's bf16 optimizer for megatron-deepspeed with bf16 at ZeRO-0/1 -- ``BF16_Optimizer``'s
    (:func:`deepspeed_bf16_optimizer_accum`) or, ZeRO-1 with "bf16", the ZeRO optimizer's -- else None."""
    acc = deepspeed_bf16_optimizer_accum(framework, dtype, zero, grad_accum_dtype)
    if acc is None and deepspeed_zero_optimizer_bf16(framework, dtype, zero, grad_accum_dtype):
        return "bf16"
    return acc


def bf16_optimizer_runs(framework: str, zero: int, grad_accum_dtype: str | None) -> bool:
    """Whether the effective ``grad_accum_dtype`` (:func:`effective_grad_accum`) is ``BF16_Optimizer``'s: ZeRO-0 with
    either dtype, ZeRO-1 with fp32 (ZeRO-1 with bf16 is the ZeRO optimizer)."""
    return (framework == "megatron-deepspeed" and grad_accum_dtype in GRAD_ACCUM_DTYPES
            and (int(zero) == 0 or (int(zero) == 1 and grad_accum_dtype == "fp32")))


def bf16_optimizer_state_zero(framework: str, zero: int, grad_accum_dtype: str | None) -> int:
    """The ZeRO level the model states are sharded at: 1 under ``BF16_Optimizer`` at ZeRO-0 (it shards its fp32
    master weights and moments over the data-parallel group whatever the stage: DeepSpeed 0.19.8
    ``runtime/bf16_optimizer.py`` ``_setup_for_real_optimizer`` l. 152-183, ``partition_count`` the DP world size,
    ``fp32_groups_flat_partition`` the rank's partition of the flat bf16 weights cast to fp32, the optimizer's only
    parameter, l. 225; its gradients stay whole, l. 191), else ``zero``."""
    return 1 if int(zero) == 0 and bf16_optimizer_runs(framework, zero, grad_accum_dtype) else int(zero)


def megatron_main_grad_bytes(dtype: str, grad_accum_dtype: str | None = None) -> int:
    """Bytes per element of Megatron-LM's main-gradient buffer (``main_grad``, which the weight-gradient GEMMs
    accumulate into and the data-parallel reduce-scatter / all-reduce moves). Megatron-Core 0.16.1
    ``distributed/distributed_data_parallel.py`` l. 147: ``grad_dtype = torch.float if
    self.ddp_config.grad_reduce_in_fp32 else param.dtype``; Megatron-LM passes ``grad_reduce_in_fp32 =
    args.accumulate_allreduce_grads_in_fp32`` (``megatron/training/training.py`` l. 1988 of the 0.19.2 tree), which
    ``arguments.py`` (l. 1181-1194) turns on for ``--bf16`` unless ``--grad-reduce-in-bf16`` (read only under
    ``--bf16``). ``grad_accum_dtype`` (wattcast's one name for the gradient-accumulation dtype): "bf16" is
    ``--grad-reduce-in-bf16`` (the parameters' bf16; no effect under fp16 / fp32 parameters, as in Megatron-LM),
    "fp32" ``--accumulate-allreduce-grads-in-fp32`` (fp32 under fp16 parameters too), None Megatron-LM's default
    (fp32 for bf16, else the parameters' dtype)."""
    db = DTYPE_BYTES.get(dtype, 4)
    if db >= 4 or grad_accum_dtype == "fp32":
        return 4
    if grad_accum_dtype == "bf16":
        return db
    return 4 if dtype == "bf16" else db


#: bytes per parameter Megatron-Core moves to cast a half-precision (bf16 / fp16) main gradient to the fp32 gradient its
#: Adam reads (read 2, write 4), once per step after the gradients are reduced: the distributed optimizer's
#: ``_copy_model_grads_to_main_grads`` (megatron-core 0.16.1 ``optimizer/distrib_optimizer.py`` l. 2386-2419,
#: ``shard_main_param.grad = shard_model_grad.float()``, the rank's shard), ``Float16OptimizerWithFloat16Params``'
#: (``optimizer/optimizer.py`` l. 754-761, ``main_param.grad = model_param.main_grad.float()``, every parameter) and
#: Megatron-FSDP's ``update_main_grads`` (``distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py``
#: l. 2615-2667: ``optimizer_grad = optimizer_grad.to(param.dtype)``, the fp32 main weight's dtype, of the rank's shard,
#: ``get_item(item_id, only_shard=sharded_optimizer_state)``), which ``finish_grad_sync`` runs after the gradient
#: reduce-scatter (``megatron_fsdp.py`` l. 1183-1204, ``attach_grad_to_optimizer_state`` l. 1175-1181); with fp32 main
#: gradients ``.float()`` / ``.to(torch.float32)`` return the tensor itself (no pass, no copy)
MEGATRON_GRAD_CAST_BYTES_PER_PARAM = 2.0 + 4.0
#: the fp32 gradient that cast makes, held until the next ``zero_grad`` (bytes per parameter whose step the rank runs):
#: ``main_param.grad`` (distributed optimizer, ``Float16OptimizerWithFloat16Params``), Megatron-FSDP's
#: ``dist_main_grad`` entry (``param_and_grad_buffer.py`` l. 2649-2664, dropped by ``zero_grad`` l. 2470-2480)
MEGATRON_GRAD_CAST_HELD_BYTES_PER_PARAM = 4.0


def megatron_grad_cast(framework: str, dtype: str, zero: int, optimizer: str,
                       grad_accum_dtype: str | None = None) -> bool:
    """Whether Megatron-Core casts half-precision main gradients to fp32 once per step
    (:data:`MEGATRON_GRAD_CAST_BYTES_PER_PARAM`): ``megatron`` with a 2-byte main-gradient buffer
    (:func:`megatron_main_grad_bytes`: bf16 under ``--grad-reduce-in-bf16``, fp16 under ``--fp16`` without
    ``--accumulate-allreduce-grads-in-fp32``), an optimizer with a step, and not the precision-aware optimizer
    (``adamw-bf16``: ``shard_main_param.decoupled_grad = shard_model_grad``, the half-precision view,
    ``distrib_optimizer.py`` l. 2411-2417), at every ZeRO stage: the distributed optimizer (ZeRO-1) and
    ``Float16OptimizerWithFloat16Params`` (ZeRO-0) in ``_copy_model_grads_to_main_grads``, Megatron-FSDP (ZeRO-2/3,
    where that method returns early, l. 2397-2398) in its buffer's ``update_main_grads`` (``param_and_grad_buffer.py``
    l. 2646-2648, when the group has an fp32 ``main_weight_buffer``, made whenever ``preserve_fp32_weights``, the
    default: l. 2004-2016, ``distributed_data_parallel_config.py`` l. 94). ``zero`` is not read (every stage casts).
    Megatron-FSDP reads ``use_precision_aware_optimizer`` off its buffer with ``getattr`` (``param_and_grad_buffer.py``
    l. 2647, 2674), which nothing in megatron-core 0.16.1 sets: adamw-bf16 is taken
    to hand the shard over uncast there too, as it must for TE's FusedAdam with ``use_decoupled_grad``
    (``optimizer/__init__.py`` l. 377-384) to find a gradient. Until stop 51 ZeRO-2/3 and fp16 were not charged."""
    return (framework == "megatron"
            and str(optimizer).lower() not in ("none", "adamw-bf16")
            and megatron_main_grad_bytes(dtype, grad_accum_dtype) == 2)


def main_grad_cast_bytes(params, expert_params, groups: tuple[int, int], cast: bool):
    """Bytes of the fp32 gradients Megatron-Core makes from half-precision main gradients once per step
    (:data:`MEGATRON_GRAD_CAST_HELD_BYTES_PER_PARAM` per parameter whose step the rank runs: sharded over ``groups``,
    ZeRO's level 1, as the master weights -- Megatron-FSDP's ``main_weight_buffer`` and ``main_grad_buffer`` share
    one group per parameter group, the FSDP group or, for experts, the expert one,
    ``get_fsdp_group(is_expert_parallel=group.is_expert_param)``, ``param_and_grad_buffer.py`` l. 1918-1921,
    2004-2032), held after the last backward beside the model states; 0 unless ``cast``
    (:func:`megatron_grad_cast`)."""
    if not cast:
        return 0.0
    return _sharded(lambda x: x * MEGATRON_GRAD_CAST_HELD_BYTES_PER_PARAM, params, expert_params, *groups)


def held_gradient_bytes(framework: str, dtype: str, dtype_bytes: int, zero: int = 0,
                        grad_accum_dtype: str | None = None) -> int:
    """Bytes per parameter of the gradients a framework holds through the backward passes (module docstring).
    DeepSpeed at ZeRO-2/3 (``megatron-deepspeed``, ``zero`` >= 2) keeps its gradient partitions in the model's dtype:
    ZeRO-2 ``grads_in_partition`` (``dtype=self.dtype``, DeepSpeed 0.19.8 ``runtime/zero/stage_1_and_2.py``
    ``copy_grads_in_partition``), ZeRO-3 ``grad_partitions_flat_buffer`` in ``gradient_accumulation_dtype``, which the
    engine sets to the model's dtype unless the config's ``data_types.grad_accum_dtype`` says otherwise
    (``runtime/engine.py`` ``get_data_types``); its fp32 gradients are made at the optimizer step
    (:func:`deepspeed_buffer_bytes`).

    Below ZeRO-2 bf16 is taken to run DeepSpeed's ``BF16_Optimizer`` (:func:`deepspeed_bf16_optimizer_accum`; it
    shards the fp32 master weights and moments itself, ``fp32_groups_flat_partition``, at ZeRO-0 too:
    :func:`bf16_optimizer_state_zero`): the bf16 ``param.grad`` (kept: ``clear_lp_grads`` zeroes it in place) and the
    accumulation buffer of the whole model (``bf16_optimizer.py``: ``fp32_flat_buffer = torch.zeros_like(
    self.bf16_groups_flat[i], dtype=self.grad_acc_dtype)``), not sharded: 6 B/param with fp32 accumulation (ZeRO-1's
    default here, BLOOM-176B's), 4 B/param with bf16 (ZeRO-0's in DeepSpeed 0.19.8, engine.py l. 2313-2320). Until
    stop 43 ZeRO-0 was costed as fp32 accumulation with unsharded master weights and moments.
    DeepSpeed 0.19.8 gives ``zero_optimization.stage: 1`` with bf16 that optimizer only under
    ``data_types.grad_accum_dtype: fp32`` (``_do_optimizer_sanity_check``: ``model_dtype == torch.bfloat16 and
    grad_accum_dtype == torch.float32 and ... stage() == 1``); by default ``get_data_types`` takes the model's dtype and
    the ZeRO optimizer (``stage_1_and_2.py``: ``self.dtype != self.gradient_accumulation_dtype`` is False, so no
    separate accumulation buffer, l. 394-404) holds 2 B/param of bf16 ``param.grad``: ``grad_accum_dtype="bf16"``
    at ZeRO-1 (:func:`deepspeed_zero_optimizer_bf16`; its step-time copies: :func:`deepspeed_zero1_step_bytes`).
    The default at ZeRO-1 (None or "fp32") is ``BF16_Optimizer``, BLOOM's. ``grad_accum_dtype`` here is the value
    given (None: the default), resolved with ``zero``."""
    if dtype_bytes >= 4:
        return dtype_bytes
    if framework == "megatron":  # the main-gradient buffer (--grad-reduce-in-bf16: grad_accum_dtype "bf16")
        return megatron_main_grad_bytes(dtype, grad_accum_dtype)
    if framework == "megatron-deepspeed":
        acc = deepspeed_bf16_optimizer_accum(framework, dtype, zero, grad_accum_dtype)
        # BF16_Optimizer: the bf16 param.grad + its whole flat accumulation buffer in grad_acc_dtype (l. 191)
        return dtype_bytes + (0 if acc is None else (4 if acc == "fp32" else 2))
    return 4  # PyTorch AMP: fp32 parameters, fp32 gradients


def weight_and_master_bytes(framework: str | None, zero: int, dtype_bytes: int) -> tuple[int, int]:
    """(held weights, fp32 master weights) bytes per parameter, before sharding (module docstring). PyTorch FSDP
    (``hf`` with ZeRO-2/3, ``SHARD_GRAD_OP`` / ``FULL_SHARD``: both shard the flat parameter the same way) under mixed
    precision holds one persistent parameter, its sharded flat parameter in the
    model's own dtype, fp32 (Accelerate upcasts a model loaded in half precision: ``accelerator.py`` ``prepare_model``,
    "Upcasted low precision parameters ... because mixed precision turned on in FSDP"; llm-foundry builds in
    ``_MASTER_WEIGHTS_PRECISION = 'float32'``), which the optimizer steps: no separate master copy, and no
    persistent half-precision shard -- FSDP1's ``_mp_shard`` is allocated in ``FlatParamHandle._use_low_precision_shard``
    before the all-gather and freed in ``_free_low_precision_sharded_param`` after it (torch 2.13
    ``torch/distributed/fsdp/_flat_param.py``), FSDP2 casts the fp32 shard into the all-gather buffer
    (``_fully_shard/_fsdp_param.py`` ``all_gather_inputs``: ``_to_dtype_if_needed(sharded_param_data, param_dtype)``).
    So (4, 0), as in full precision; everything else (dtype, 4 fp32 master under mixed precision, else 0)."""
    mixed = dtype_bytes < 4
    if mixed and pytorch_fsdp(framework, zero):
        return 4, 0
    return dtype_bytes, (4 if mixed else 0)


#: the multi-tensor ("foreach") AdamW step's temporary: torch 2.13 optim/adam.py l. 790 ``exp_avg_sq_sqrt =
#: torch._foreach_sqrt(device_exp_avg_sqs)`` allocates an fp32 copy of the second moments for the step (torch's own
#: ``_foreach_doc``, optim/optimizer.py l. 255-257: foreach "uses ~ sizeof(params) more peak memory"); the fused
#: kernel (one pass, in place) none. Bytes per parameter the rank's optimizer holds the states of
FOREACH_STEP_TEMP_BYTES_PER_PARAM = 4.0


def foreach_step_bytes(optimizer_bytes, optimizer: str, optimizer_impl: str | None):
    """Bytes of the optimizer step's temporary under ``optimizer_impl`` (:data:`FOREACH_STEP_TEMP_BYTES_PER_PARAM`
    per parameter whose states the rank holds: ``optimizer_bytes`` / the optimizer's state bytes per parameter; 0 for
    the fused step and for an optimizer without states). Held after the last backward, beside the model states."""
    if optimizer_impl != "foreach":
        return 0.0
    opt_b = optimizer_state_bytes(optimizer)
    if opt_b <= 0:
        return 0.0
    return optimizer_bytes * (FOREACH_STEP_TEMP_BYTES_PER_PARAM / opt_b)


def model_state_bytes(params: float, *, dtype_bytes: int, optimizer: str, zero: int, dp: int,
                      grad_bytes: float | None = None, expert_params: float = 0.0, expert_dp: int | None = None,
                      framework: str | None = None, muon_fraction=None, layer_wise_shares=None) -> dict:
    """Weights, fp32 master weights, gradients and optimizer states of ``params`` parameters (bytes), sharded over
    ``dp`` ranks as ZeRO stage ``zero`` shards them. Mixed precision when ``dtype_bytes`` < 4; ``grad_bytes``: bytes
    per parameter of the held gradients (default fp32 under mixed precision, Megatron's formula). ``expert_params``
    of the ``params`` are experts, sharded over their ``expert_dp`` ranks instead (default ``dp``; module docstring).
    ``framework``: ``hf`` with ZeRO-3 (PyTorch FSDP) holds fp32 weights and no master copy
    (:func:`weight_and_master_bytes`); None: the Megatron formula. ``muon_fraction``: the share of parameters Muon
    steps (training_graph.optimizer_state_bytes). ``layer_wise_shares``: (master weights, optimizer states) the
    busiest DP rank holds of them under Megatron-Core's LayerWiseDistributedOptimizer, which deals whole tensors
    (simulate.distributed.layer_wise_state_shares), in place of ZeRO-1's even 1 / dp."""
    mixed = dtype_bytes < 4
    opt_b = optimizer_state_bytes(optimizer, muon_fraction)
    g = _zero_groups(zero, dp, expert_dp, framework)
    w_b, m_b = weight_and_master_bytes(framework, zero, dtype_bytes)
    if grad_bytes is None:
        grad_bytes = 4 if mixed else dtype_bytes
    master, opt = _level1_bytes(params, expert_params, g[1], m_b, opt_b, layer_wise_shares)
    return dict(
        weights_bytes=_sharded(lambda x: x * w_b, params, expert_params, *g[3]),
        master_weights_bytes=master,
        gradients_bytes=_sharded(lambda x: x * grad_bytes, params, expert_params, *g[2]),
        optimizer_bytes=opt,
    )


def _level1_bytes(params, expert_params, groups: tuple[int, int], master_b: float, opt_b, layer_wise_shares=None):
    """(fp32 master weights, optimizer states) bytes one rank holds: sharded evenly over ``groups`` (ZeRO's level 1,
    :func:`_zero_groups`), or the busiest rank's ``layer_wise_shares`` (master, optimizer) of the whole ``params``
    under Megatron-Core's LayerWiseDistributedOptimizer (whole tensors per rank)."""
    if layer_wise_shares is None:
        return (_sharded(lambda x: x * master_b, params, expert_params, *groups),
                _sharded(lambda x: x * opt_b, params, expert_params, *groups))
    m_share, o_share = layer_wise_shares
    return params * master_b * m_share, params * opt_b * o_share


def fp8_copy_bytes(params, *, fp8_param_fraction: float, zero: int, dp: int, expert_params=0.0,
                   expert_dp: int | None = None, bytes_per_param: float = 2.0, framework: str | None = None):
    """Bytes of Transformer Engine's cached fp8 weight and transpose (``bytes_per_param`` per FP8-GEMM parameter, the
    share ``fp8_param_fraction`` of ``params``: 2 B, plus the block scales under --fp8-recipe mxfp8 or blockwise,
    ``featurize.fp8_recipes.weight_copy_bytes_per_param``), sharded with the weights under ZeRO-3 (experts over
    ``expert_dp``).

    PyTorch FSDP (``framework`` ``hf``, ZeRO-2/3: :func:`pytorch_fsdp`) holds none: Transformer Engine 2.20.2 run
    under FSDP2 neither caches the FP8 weight (pytorch/module/linear.py l. 2443: ``cache_name = None if
    (is_first_microbatch is None or self.is_fsdp2)``) nor saves it for the backward (l. 738-741: "FSDP2: Don't save
    FP8 workspace for non-quantized weights. Backward will re-quantize from the FSDP2 all-gathered weight"); the
    forward quantizes the gathered weight row-wise only (l. 563), module by module, and frees it after the GEMM: one
    linear module's copy at a time (Llama 3 8B: 59 MB), below the step's largest kernel working set, so no term of
    its own. (TE's manual FSDP1 path, ``fsdp_group``, scatters the saved copy over the group instead, l. 723-728, and
    TE steers away from it: "use FSDP2 or MCore FSDP", l. 192; torchao's float8 under FSDP2 keeps no FP8 copy
    either.) Until stop 58 ZeRO-3 held 2 B a parameter / dp (audit 58e finding 4: +1.75 GB on Llama 3 8B over 8
    H100s, matching no recipe) and ZeRO-2 2 B a parameter."""
    if pytorch_fsdp(framework or "", zero):
        return 0.0 * params
    weights_groups = _zero_groups(zero, dp, expert_dp)[3]
    return _sharded(lambda x: bytes_per_param * x * fp8_param_fraction, params, expert_params, *weights_groups)


def inflight_chunks(stage: int, *, pp: int, interleave: int, n_micro: int, schedule: str) -> int:
    """Model chunks' activations of one micro-batch that stage ``stage`` holds at its peak: 1F1B keeps pp - stage
    micro-batches in flight (Narayanan et al. SC21 Sec. 2.2.1), interleaved 1F1B (pp - stage - 1)·2 + (v-1)·pp + 1
    chunks (Megatron-LM's warm-up count, ``get_forward_backward_func``) and, with exactly pp micro-batches, every chunk
    (Megatron-LM runs all the forwards first then: ``all_warmup_microbatches``), GPipe every micro-batch, DualPipe
    pp + 1 (DeepSeek-V3 report Table 2)."""
    return int(inflight_chunks_by_stage(pp=pp, interleave=interleave, n_micro=n_micro, schedule=schedule)[stage])


def buffer_bytes(framework: str, *, params: float, grad_bytes: int, dtype_bytes: int, zero: int, dp: int,
                 block_params: float, root_params: float = 0.0, reduce_bytes: int | None = None,
                 grad_accum_dtype: str | None = None) -> tuple[float, float]:
    """(held during the passes, made after the last backward) bytes of the framework's communication buffers for
    ``params`` parameters of a stage; the first includes the cuBLAS workspace. ``grad_bytes``: bytes per gradient
    element the reduction moves; ``block_params``: parameters of one transformer block on this rank (FSDP's unit);
    ``root_params``: the stage's parameters outside the blocks (FSDP's root unit: embeddings, final norm, untied
    head), unsharded from the start of the forward to the end of the backward (module docstring). ``reduce_bytes``:
    FSDP's reduce-scatter dtype bytes (``MixedPrecision.reduce_dtype``; default the parameters' dtype).

    PyTorch FSDP's ZeRO-2 (``SHARD_GRAD_OP``) holds every unit unsharded instead (``params`` x the parameters' dtype:
    all of them are gathered by the end of a forward and each is freed only as its backward ends; the additive total
    counts them beside the activations, an upper bound as the backward frees both).
    After the last backward under FSDP (:func:`fsdp_end_of_backward_bytes`): the root unit's parameters and gradient
    (:func:`fsdp_root_gradient_bytes`) beside the first block's gradient in reduction, no block's parameters.
    Megatron-FSDP's ZeRO-3 (``megatron``, ``optim_grads_params``) holds its running and prefetched units and the
    parameters outside them (:func:`megatron_fsdp_gathered_bytes`; ``root_params`` those).
    DeepSpeed at ZeRO-2/3 holds its reduce bucket through the passes and, ZeRO-3, its prefetched parameters; it
    makes fp32 gradient partitions at the step (:func:`deepspeed_buffer_bytes`). DeepSpeed's ZeRO-1 optimizer on bf16
    gradients (``grad_accum_dtype="bf16"``, the effective value: :func:`deepspeed_zero_optimizer_bf16`) makes its
    partition's flat and fp32 copies at the step (:func:`deepspeed_zero1_step_bytes`), after the reduce bucket is
    released: the larger of the two."""
    during, after = float(CUBLAS_WORKSPACE_BYTES + CUDA_CONTEXT_BYTES), 0.0
    if dp > 1:
        if pytorch_fsdp(framework, zero):
            # FSDP FULL_SHARD: the running and the prefetched unit and the root unit, unsharded; SHARD_GRAD_OP
            # (ZeRO-2): every unit's, gathered in the forward and not resharded until its backward ends
            # (distributed.fsdp_shard_grad_op: torch 2.13 _runtime_utils.py _post_forward_reshard l. 486-500)
            held = during
            during = held + ((2.0 * block_params + root_params) if zero >= 3 else params) * dtype_bytes
            rb = dtype_bytes if reduce_bytes is None else reduce_bytes
            # at the backward's end no block is unsharded: the root unit's parameters, the first block's
            # gradient still being reduce-scattered and the root's gradient (fsdp_end_of_backward_bytes)
            after = held + fsdp_end_of_backward_bytes(block_params=block_params, root_params=root_params,
                                                      dtype_bytes=dtype_bytes, reduce_bytes=rb, dp=dp)
        elif megatron_fsdp(framework, zero) and zero >= 3:
            # Megatron-FSDP optim_grads_params: the running and prefetched TransformerLayers and the parameters outside
            # them, unsharded (megatron_fsdp_gathered_bytes); until stop 46 none were counted
            during = during + megatron_fsdp_gathered_bytes(params=params, block_params=block_params,
                                                           root_params=root_params, dtype_bytes=dtype_bytes)
        elif framework == "hf" and zero == 0:  # DDP: bucket buffers are a second copy of the gradients
            during += params * grad_bytes
        elif framework == "megatron-deepspeed":
            if zero >= 2:
                held, step = deepspeed_buffer_bytes(params=params, dtype_bytes=dtype_bytes, zero=zero, dp=dp)
                during = during + held
                after = during + step
            elif bf16_optimizer_runs(framework, zero, grad_accum_dtype):
                after = bf16_optimizer_reduce_bytes(params, grad_accum_dtype)
            else:  # flattened reduce buckets when the gradients are reduced
                after = np.minimum(params, DEEPSPEED_BUCKET_ELEMENTS) * grad_bytes
    if framework == "megatron-deepspeed" and int(zero) == 1 and grad_accum_dtype == "bf16":
        after = np.maximum(after, deepspeed_zero1_step_bytes(params=params, dtype_bytes=dtype_bytes, dp=dp))
    return during, after


def bf16_optimizer_reduce_bytes(params, grad_accum_dtype: str):
    """Bytes ``BF16_Optimizer``'s data-parallel all-reduce makes (DeepSpeed 0.19.8, the pipeline engine's
    ``_exec_reduce_grads`` -> ``_bf16_reduce_grads`` -> ``buffered_allreduce_fallback``, ``runtime/pipe/engine.py``
    l. 286-297): the reduced tensors are the optimizer's flat accumulation buffers, one per parameter group
    (``get_grads_for_reduction``, ``bf16_optimizer.py`` l. 541-544, ``engine.py`` l. 3923-3925); ``allreduce_no_retain``
    (l. 3828-3839) sends a buffer alone once it passes the 5e8-element bucket, so ``allreduce_bucket`` (l. 3795-3821)
    flattens a single tensor -- a view, no copy (torch ``_flatten_dense_tensors`` of one tensor) -- and casts it to
    ``communication_data_type``, by default the model's bf16 (``communication_data_type`` l. 1719-1730, config default
    None: ``constants.py`` l. 216). fp32 accumulation: a bf16 copy of the whole group, 2 B/param (the weight-decay group
    holds all but the biases and norms: the stage's parameters, an upper bound); bf16 accumulation: no cast, nothing
    made."""
    return np.asarray(params, dtype=float) * (2.0 if grad_accum_dtype == "fp32" else 0.0)


def deepspeed_zero1_step_bytes(*, params, dtype_bytes: int, dp: int):
    """Bytes DeepSpeed's ZeRO stage-1 optimizer makes at the step when it runs on half-precision gradients
    (``grad_accum_dtype`` the model's; DeepSpeed 0.19.8 ``runtime/zero/stage_1_and_2.py`` ``step``, l. 3111-3119):
    the rank's partition of the gradients flattened into a new tensor in the model's dtype
    (``flat_grad_partition = self.flatten(self.averaged_gradients[i])``; ``averaged_gradients`` are views of
    ``param.grad``, ``get_flat_partition(..., return_tensor_list=True)`` l. 1046-1053) and its fp32 copy
    (``single_grad_partition = flat_grad_partition.to(self.single_partition_of_fp32_groups[i].dtype)``), the flat one
    deleted after the cast: params / dp x (dtype + 4). Not subtracted: the other ranks' gradients it frees just
    before (``free_grad_in_param_list(self.params_not_in_partition[i])``, l. 3103), one parameter group at a time (an
    upper bound when dp > 1)."""
    return np.asarray(params, dtype=float) / max(int(dp), 1) * (dtype_bytes + 4.0)


def deepspeed_buffer_bytes(*, params, dtype_bytes: int, zero: int, dp: int) -> tuple:
    """(held through the passes, made at the optimizer step) bytes of DeepSpeed's ZeRO-2/3 buffers (DeepSpeed 0.19.8):

    - the reduce bucket, ``reduce_bucket_size`` (5e8) elements in the gradients' dtype (the model's by default):
      ZeRO-3 allocates it with the optimizer (``runtime/zero/stage3.py`` ``__init__``: ``bucket.buffer =
      torch.empty(self.reduce_bucket_size, dtype=dtype)``, one per dtype), ZeRO-2 at the first backward hook
      (``stage_1_and_2.py`` ``setup_buckets``: one, a second only with ``overlap_comm``, off by default below
      ZeRO-3, ``zero/config.py`` ``overlap_comm_valid``); the full size whatever the model's, not sharded: it holds
      whole gradients before their reduce-scatter;
    - ZeRO-3's prefetched parameters, ``stage3_prefetch_bucket_size`` (5e7) elements in the model's dtype, gathered
      ahead of the running module (``partitioned_param_coordinator.py`` ``fetch_sub_module``; under
      ``stage3_max_live_parameters``, 1e9). The running module's own gathered parameters are not counted;
    - at the step, fp32 gradients of the rank's partition: ZeRO-2 the whole partition
      (``stage_1_and_2.py`` ``step``: ``single_grad_partition = flat_grad_partition.to(fp32)``), ZeRO-3 one
      ``sub_group_size`` (1e9) sub-group at a time (``stage3.py`` ``_prepare_fp32_grad_for_sub_group``)."""
    held = DEEPSPEED_BUCKET_ELEMENTS * dtype_bytes
    part = np.asarray(params, dtype=float) / max(int(dp), 1)
    if zero >= 3:
        held = held + DEEPSPEED_PREFETCH_BUCKET_ELEMENTS * dtype_bytes
        part = np.minimum(part, DEEPSPEED_SUB_GROUP_ELEMENTS)
    return held, part * 4.0


def fsdp_root_gradient_bytes(*, root_params, dtype_bytes: int, reduce_bytes: int, dp: int):
    """Bytes PyTorch FSDP makes for its root unit's gradient at the end of the backward, beyond the buffers held
    through the passes (torch 2.13 ``torch/distributed/fsdp``): the root's flat parameter is one leaf whose unsharded
    views (``_flat_param.py`` ``_get_unflat_views_unaligned``: ``torch.split`` then ``view``) its modules use, so
    autograd's ``SplitWithSizesBackward`` waits for every view's gradient (the head's from the start of the backward,
    the embedding's at its end) and concatenates them into a new flat gradient: the views' gradients and the flat
    one, 2 x root in the parameters' dtype, while the root's parameters are still unsharded (counted in the held
    buffers). Then ``_post_backward_hook`` reshards them (``_post_backward_reshard``), casts the gradient to
    ``reduce_dtype`` if it differs (``flat_param.grad.to(handle._reduce_dtype)``, the uncast one kept alive by
    ``_no_dispatch_record_stream`` until the reduce-scatter ends) and reduce-scatters into a new shard
    (``_get_reduce_scatter_tensors``: ``torch.empty_like(chunks[0])``): root x (dtype + reduce dtype if it differs
    + reduce / dp) - root x dtype of freed parameters. The larger of the two moments."""
    root = np.asarray(root_params, dtype=float)
    cast = reduce_bytes if reduce_bytes != dtype_bytes else 0
    split = 2.0 * root * dtype_bytes
    reduce = root * (dtype_bytes + cast) + root / max(int(dp), 1) * reduce_bytes - root * dtype_bytes
    return np.maximum(split, reduce)


def fsdp_reducing_unit_bytes(*, block_params, dtype_bytes: int, reduce_bytes: int, dp: int):
    """Bytes of one FSDP unit's gradient while ``_post_backward_hook`` reduce-scatters it (torch 2.13
    ``torch/distributed/fsdp/_runtime_utils.py`` ``_post_backward_hook`` / ``_reduce_grad``): the unsharded gradient in
    the parameters' dtype (``autograd_computed_grad``, kept by ``_no_dispatch_record_stream(autograd_computed_grad,
    state._post_backward_stream)`` until the reduce-scatter on that stream ends), its ``reduce_dtype`` cast when that
    differs (``flat_param.grad.to(handle._reduce_dtype)``) and the new shard (``_get_reduce_scatter_tensors``:
    ``torch.empty_like(chunks[0])``, 1/dp of the unit in the reduce dtype)."""
    cast = reduce_bytes if reduce_bytes != dtype_bytes else 0
    return block_params * (dtype_bytes + cast) + block_params / max(int(dp), 1) * reduce_bytes


def fsdp_end_of_backward_bytes(*, block_params, root_params, dtype_bytes: int, reduce_bytes: int, dp: int):
    """Bytes PyTorch FSDP1 (``hf``, ZeRO-3) holds beyond the cuBLAS workspace and CUDA context when the root unit's
    gradient is made and reduced at the end of the backward (torch 2.13 ``torch/distributed/fsdp``):

    - no block's unsharded parameters. The last block of the backward (the first of the model) frees its own in its
      ``_post_backward_hook`` (``_post_backward_reshard`` -> ``_reshard(free_unsharded_flat_param=True)``,
      ``_runtime_utils.py``), which runs on its flat parameter's ``AccumulateGrad`` before the embedding's backward
      that completes the root's gradient; and nothing is prefetched for it: ``_get_handle_to_prefetch`` ->
      ``get_handle_to_backward_prefetch`` (``_exec_order_utils.py``) takes the handle before it in post-forward order,
      and the first block's is the first (index 0 -> none; the root's, last in that order, ran its pre-backward hook
      at the start of the backward, ``_needs_pre_backward_unshard = False``, and is still unsharded anyway);
    - the root unit's parameters, unsharded until its own ``_post_backward_hook`` (``root_params`` x dtype);
    - that first block's gradient, still in its reduce-scatter on the post-backward stream
      (:func:`fsdp_reducing_unit_bytes`): the root's gradient is made right after it on the compute stream;
    - the root's gradient (:func:`fsdp_root_gradient_bytes`).

    Stop 42 had the running and the prefetched block's unsharded parameters (2 x block x dtype, the during-the-passes
    buffers) here instead of the reduced block's gradient. FSDP2 (``_fully_shard``) differs, stated not modelled: it
    waits for the previous group's reduce-scatter (``_fsdp_param_group.py`` ``post_backward``:
    ``reduce_scatter_states`` capped at ``reduce_scatter_max_input_buffers`` = 1) and has no flat parameter to
    concatenate."""
    root = np.asarray(root_params, dtype=float)
    return (root * dtype_bytes
            + fsdp_reducing_unit_bytes(block_params=block_params, dtype_bytes=dtype_bytes, reduce_bytes=reduce_bytes,
                                       dp=dp)
            + fsdp_root_gradient_bytes(root_params=root, dtype_bytes=dtype_bytes, reduce_bytes=reduce_bytes, dp=dp))


def fsdp_inflight_gradient_bytes(*, block_params: float, head_params, dtype_bytes: int, reduce_bytes: int, dp: int,
                                 prefetch: bool):
    """Bytes of unsharded gradients PyTorch FSDP (``hf``, ZeRO-3) holds during the backward beside the activations
    (torch 2.13 ``torch/distributed/fsdp/_runtime_utils.py``):

    - the root unit's head-side gradient: the LM head's (an untied head's weight, or a tied embedding's use as the
      head) is the backward's first, made in the parameters' dtype (the unsharded flat parameter is in
      ``param_dtype``), and waits in ``SplitWithSizesBackward``'s input until the embedding's, the backward's last,
      before the root's ``_post_backward_hook`` reduces it (:func:`fsdp_root_gradient_bytes`): ``head_params`` x dtype;
    - the gradient of the unit being reduce-scattered: ``_post_backward_hook`` runs ``_reduce_grad`` on the
      post-backward stream: the unsharded gradient (``autograd_computed_grad``, parameters' dtype, kept by
      ``_no_dispatch_record_stream`` until the reduce-scatter ends), its ``reduce_dtype`` cast when that differs
      (``flat_param.grad.to(handle._reduce_dtype)``) and the new shard (``_get_reduce_scatter_tensors``:
      ``torch.empty_like(chunks[0])``, 1/dp of the unit in the reduce dtype): :func:`fsdp_reducing_unit_bytes`;
    - with the collectives prefetched beside the computation (``prefetch``) the next unit's gradient is made on the
      compute stream meanwhile: a second block's unsharded gradient in the parameters' dtype.

    Never more units, however slow the network: nothing on the host caps FSDP1's reduce-scatters in flight, but the
    all-gathers and reduce-scatters of one process group run in issue order on one NCCL stream (``api.py`` 96-100),
    unit k+2's all-gather is issued after unit k's reduce-scatter (BACKWARD_PRE: ``_runtime_utils.py`` 693, 1264-1271;
    BACKWARD_POST: 807) and a unit's backward waits for its all-gather (685), so a slow reduce-scatter stalls the
    compute rather than letting gradients pile up; FSDP2 caps it at one reduce-scatter in flight
    (``_fully_shard/_fsdp_param_group.py`` ``reduce_scatter_max_input_buffers``, 647-657)."""
    # (head + units x block) x dtype + cast + shard: fsdp_reducing_unit_bytes's terms, in stop 42's order of addition
    cast = reduce_bytes if reduce_bytes != dtype_bytes else 0
    units = 2.0 if prefetch else 1.0
    return (np.asarray(head_params, dtype=float) * dtype_bytes
            + block_params * (units * dtype_bytes + cast) + block_params / max(int(dp), 1) * reduce_bytes)


#: Megatron-FSDP's floor on its communication unit, in elements: ``_init_fsdp_param_and_grad_buffer`` takes
#: ``max(1_000_000_000, suggested_communication_unit_size)`` ("Cap to 1B elements", a floor in fact: megatron-core
#: 0.16.1 ``distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py`` l. 392-396) when
#: ``--suggested-communication-unit-size`` is not given; the reduce-scatter queue's capacity is that unit, the
#: all-gather prefetch half of it (l. 398-399)
MFSDP_MIN_COMM_UNIT_ELEMENTS = 1e9


def megatron_fsdp_comm_unit_elements(zero: int, *, block_params: float, bucket_params: float) -> float:
    """Megatron-FSDP's ``suggested_communication_unit_size`` (elements) when Megatron-LM leaves it unset (megatron-core
    0.16.1 ``megatron_fsdp.py`` l. 375-396): ``optim_grads_params`` (``--zero 3``) twice the mean FSDP unit (a
    TransformerLayer's parameters on this rank, ``block_params``: "process the current FSDP module and attempt to
    prefetch the next"), ``optim_grads`` (``--zero 2``) the gradient bucket size when there is one (``bucket_params``
    finite), else 1e9; then at least :data:`MFSDP_MIN_COMM_UNIT_ELEMENTS`."""
    if int(zero) >= 3:
        unit = 2.0 * float(block_params)
    else:
        unit = float(bucket_params) if np.isfinite(bucket_params) else MFSDP_MIN_COMM_UNIT_ELEMENTS
    return max(MFSDP_MIN_COMM_UNIT_ELEMENTS, unit)


def megatron_fsdp_inflight_grad_elements(*, params, bucket_params: float, queue_elements: float):
    """Elements of unsharded main-grad buckets Megatron-FSDP holds at once in a backward (``--framework megatron
    --zero 2/3``, megatron-core 0.16.1 ``distributed/fsdp/src/megatron_fsdp``), buckets of ``bucket_params`` each
    (``--zero 2``: Megatron-LM's ``--ddp-bucket-size``; ``--zero 3``: one TransformerLayer) out of the stage's
    ``params``:

    - a parameter's first gradient allocates its whole bucket (``megatron_fsdp.py`` ``_grad_acc`` l. 546-575:
      ``param.get_main_grad()`` -> ``DataParallelBuffer.fetch_bucket``, ``param_and_grad_buffer.py`` l. 917-957,
      the temporary allocator's ``torch.empty`` when the buffer is sharded): one bucket filling;
    - a full bucket's reduce-scatter is queued (``GradReducePipeline.reduce_gradients``, l. 3048-3090) after
      ``wait_for_previous_grad_reduce(suggested_queue_capacity=...)`` (l. 3092-3125) pops the oldest entries, waiting
      for their reduce-scatters and freeing their buckets (``free_up_grad_bucket`` -> ``free_bucket_storage``,
      l. 3313-3327, 968-984), only while the queue holds more than ``queue_elements``
      (:func:`megatron_fsdp_comm_unit_elements`): a bucket stays allocated after its reduce-scatter ends until
      then, at the latest the backward's end (``reset``, l. 3029-3046);
    - so in steady state floor(queue / bucket) buckets queued after the pops, the one just launched, and the one
      filling: (floor(queue / bucket) + 2) buckets, at most the stage's ``params`` (one bucket of the whole stage
      without bucketing: ``bucket_params`` inf). Equal buckets taken: ``--zero 2`` buckets close at the first
      parameter that takes them past the size (``_get_parameter_groups`` l. 1399-1413), and the embedding's and
      head's bucket is larger than a layer's under ``--zero 3``."""
    params = np.asarray(params, dtype=float)
    if not np.isfinite(bucket_params) or bucket_params <= 0:
        return params
    n = np.floor(queue_elements / bucket_params) + 2.0
    return np.minimum(params, n * bucket_params)


def megatron_fsdp_grad_bucket_bytes(*, params, grad_bytes: int, zero: int = 2, bucket_params: float = float("inf"),
                                    block_params: float = 0.0):
    """Bytes of the unsharded gradient buckets Megatron-FSDP (``--framework megatron --zero 2`` = ``optim_grads``,
    ``--zero 3`` = ``optim_grads_params``) holds during each backward beside the activations, in the main-grad
    buffer's dtype (fp32 under ``grad_reduce_in_fp32``, ``param_and_grad_buffer.py`` l. 2030: ``grad_bytes``):
    :func:`megatron_fsdp_inflight_grad_elements` of buckets of ``bucket_params`` (``--zero 2``: Megatron-LM's
    ``--ddp-bucket-size``, :func:`wattcast.simulate.distributed.dp_bucket_params`; inf: one bucket per group, the
    whole stage's) or, ``--zero 3``, of one TransformerLayer (``block_params``: Megatron-LM's adapter makes
    ``TransformerLayer`` the FSDP unit under ``optim_grads_params``, ``mcore_fsdp_adapter.py`` l. 93-99, and
    ``_get_parameter_groups`` one group per unit, ``param_and_grad_buffer.py`` l. 1300-1366, 1399-1406: a unit's group is not split by the bucket size). Between micro-batches
    only the sharded buffer is held (the gradients line, 1/dp). Until stop 46 ``--zero 2`` held one bucket of the
    whole stage (Megatron-LM's ``get_model`` sets the bucket size before wrapping the model: see ``dp_bucket_params``)
    and ``--zero 3`` none."""
    bucket = float(block_params) if int(zero) >= 3 else float(bucket_params)
    queue = megatron_fsdp_comm_unit_elements(zero, block_params=block_params, bucket_params=bucket_params)
    return megatron_fsdp_inflight_grad_elements(params=params, bucket_params=bucket, queue_elements=queue) * grad_bytes


def megatron_fsdp_gathered_bytes(*, params, block_params: float, root_params, dtype_bytes: int):
    """Bytes of the unsharded parameters Megatron-FSDP ``optim_grads_params`` (``--framework megatron --zero 3``)
    holds through the passes beside the activations (megatron-core 0.16.1 ``distributed/fsdp/src/megatron_fsdp``),
    in the parameters' dtype:

    - the running TransformerLayer (the FSDP unit, ``mcore_fsdp_adapter.py`` l. 93-99) and the ones prefetched
      after it: ``AllGatherPipeline.all_gather_params`` (``param_and_grad_buffer.py`` l. 3447-3627) adds the next
      units in pass order while fewer than ``suggested_AG_prefetch_size`` elements are prefetched, half the
      communication unit (``megatron_fsdp.py`` l. 398-399; :func:`megatron_fsdp_comm_unit_elements`), so
      ceil(prefetch / unit) units beyond the running one; each unit is freed after its forward (``_post_forward`` ->
      ``release_module_parameters``, l. 871-893) and its backward (``_post_backward_release_module``, l. 594-614),
      the backward gathering again in reverse order (``_pre_backward_param_unshard``, l. 808-829);
    - the parameters outside the units (``root_params``: embedding, final norm, output layer), gathered by their
      modules' pre-forward hooks (``module.parameters(recurse=False)``, l. 680-710) and released only by
      ``synchronize_param_gather`` at the step's end (``finish_grad_sync`` l. 1205-1206 -> ``AllGatherPipeline.reset``,
      l. 1155-1161): ``_root_pre_backward`` marks only the units' buckets releasable (l. 844-858).

    At most the stage's ``params``."""
    root = np.asarray(root_params, dtype=float)
    prefetch = megatron_fsdp_comm_unit_elements(3, block_params=block_params, bucket_params=float("inf")) // 2
    ahead = np.ceil(prefetch / block_params) if block_params > 0 else 0.0
    return np.minimum(np.asarray(params, dtype=float), root + (1.0 + ahead) * block_params) * dtype_bytes


def _fsdp_grads(framework: str, zero: int, dp: int, *, params=0.0, grad_bytes: int = 4,
                grad_bucket_params: float = float("inf"), **kw):
    """Unsharded gradients held during the backward beside the activations: :func:`fsdp_inflight_gradient_bytes`
    under FSDP (``hf``, ZeRO-2/3, dp > 1: each unit's reduce-scatter as its backward ends either way),
    :func:`megatron_fsdp_grad_bucket_bytes` under Megatron-FSDP (``megatron``, ZeRO-2 ``optim_grads`` with
    ``grad_bucket_params`` per bucket, ZeRO-3 ``optim_grads_params`` a TransformerLayer's; dp > 1), else 0."""
    if megatron_fsdp(framework, zero) and dp > 1:
        return megatron_fsdp_grad_bucket_bytes(params=params, grad_bytes=grad_bytes, zero=zero,
                                               bucket_params=grad_bucket_params, block_params=kw["block_params"])
    if not pytorch_fsdp(framework, zero) or dp <= 1:
        return 0.0
    if kw["reduce_bytes"] is None:
        kw["reduce_bytes"] = kw["dtype_bytes"]
    return fsdp_inflight_gradient_bytes(dp=dp, **kw)


def stage_memory(*, params: float, act_bytes_per_chunk: float, inflight: int, full_recompute_extra_bytes: float,
                 dtype_bytes: int, grad_bytes: int, held_grad_bytes: float, optimizer: str, zero: int, dp: int,
                 framework: str, block_params: float, fp8_param_fraction: float = 0.0,
                 fp8_copy_bytes_per_param: float = 2.0, expert_params: float = 0.0,
                 expert_dp: int | None = None, root_params: float = 0.0, head_params: float = 0.0,
                 reduce_bytes: int | None = None, zero3_prefetch: bool = False,
                 grad_accum_dtype: str | None = None,
                 grad_bucket_params: float = float("inf"), optimizer_impl: str | None = None,
                 muon_fraction=None, layer_wise_shares=None, main_grad_cast: bool = False,
                 transient_bytes: float = 0.0) -> StageMemory:
    """One stage's memory: model states, ``inflight`` chunks of activations (plus the layer re-materialised under
    full recomputation), and buffers. ``fp8_param_fraction``: the share of parameters in FP8 GEMMs under an FP8
    recipe, whose fp8 weight and transpose Transformer Engine caches (2 B/param, counted with the weights).
    ``expert_params`` of the stage's ``params`` are sharded over ``expert_dp`` ranks (default ``dp``). FSDP
    (``hf``, ZeRO-3): ``root_params`` outside the blocks, ``head_params`` of them the LM head's (or a tied
    embedding's), ``reduce_bytes`` its reduce-scatter dtype's (default the parameters'), ``zero3_prefetch`` its
    collectives beside the computation (:func:`fsdp_inflight_gradient_bytes`). ``grad_accum_dtype``: the effective
    value (:func:`effective_grad_accum`: DeepSpeed's bf16 optimizer at ZeRO-0/1, its buffers and state sharding).
    ``grad_bucket_params``: Megatron-FSDP ``optim_grads``' gradient bucket (``megatron``, ZeRO-2:
    :func:`megatron_fsdp_grad_bucket_bytes`; inf: one bucket of the stage)."""
    st = model_state_bytes(params, dtype_bytes=dtype_bytes, optimizer=optimizer,
                           zero=bf16_optimizer_state_zero(framework, zero, grad_accum_dtype), dp=dp, grad_bytes=held_grad_bytes,
                           expert_params=expert_params, expert_dp=expert_dp, framework=framework,
                           muon_fraction=muon_fraction, layer_wise_shares=layer_wise_shares)
    st["weights_bytes"] += fp8_copy_bytes(params, fp8_param_fraction=fp8_param_fraction, zero=zero, dp=dp,
                                          expert_params=expert_params, expert_dp=expert_dp,
        bytes_per_param=fp8_copy_bytes_per_param, framework=framework)
    during, after = buffer_bytes(framework, params=params, grad_bytes=grad_bytes, dtype_bytes=dtype_bytes, zero=zero, dp=dp,
                                 block_params=block_params, root_params=root_params, reduce_bytes=reduce_bytes,
                                 grad_accum_dtype=grad_accum_dtype)
    after = after + foreach_step_bytes(st["optimizer_bytes"], optimizer, optimizer_impl)  # 0 unless foreach
    after = after + main_grad_cast_bytes(params, expert_params,
                                         _zero_groups(bf16_optimizer_state_zero(framework, zero, grad_accum_dtype), dp,
                                                      expert_dp, framework)[1], main_grad_cast)
    grads = _fsdp_grads(framework, zero, dp, params=params, grad_bytes=grad_bytes, block_params=block_params,
                        head_params=head_params,
                        dtype_bytes=dtype_bytes, reduce_bytes=reduce_bytes, prefetch=zero3_prefetch,
                        grad_bucket_params=grad_bucket_params)
    return StageMemory(**st, activations_bytes=act_bytes_per_chunk * inflight + full_recompute_extra_bytes,
                       buffers_bytes=during, post_backward_buffers_bytes=after, unsharded_gradients_bytes=float(grads),
                       transient_bytes=float(transient_bytes))


def inflight_chunks_by_stage(*, pp: int, interleave: int, n_micro: int, schedule: str) -> np.ndarray:
    """:func:`inflight_chunks` of every stage at once (int64 array of ``pp``)."""
    s = np.arange(pp, dtype=np.int64)
    if schedule == "dualpipe":
        # DeepSeek-V3 report Table 2: PP + 1 micro-batches' activations on every rank (of its two chunks, stage s and
        # stage pp-1-s; the caller averages their per-micro-batch activations)
        return np.full(pp, min(pp + 1, n_micro), dtype=np.int64)
    if schedule == "gpipe" or (interleave > 1 and n_micro == pp):
        return np.full(pp, n_micro * interleave, dtype=np.int64)
    if interleave == 1:
        return np.minimum(pp - s, n_micro)
    return np.minimum((pp - s - 1) * 2 + (interleave - 1) * pp + 1, n_micro * interleave)


def interleaved_peak_bytes(chunk_bytes: np.ndarray, *, n_micro: int) -> np.ndarray:
    """Peak saved activations of each stage under interleaved 1F1B (``chunk_bytes``: (v, pp), one micro-batch's
    activations of model chunk c on stage s), replaying Megatron-LM's order: forward j runs chunk
    ``(j mod pp v) div pp``, backward k chunk ``v - 1 -`` that; stage s warms up with (pp - s - 1) 2 + (v - 1) pp
    forwards (every one when n_micro = pp), then alternates one forward and one backward. The peak comes after a
    forward: sum of the forwards so far minus the backwards done. With equal chunks it is :func:`inflight_chunks`
    times a chunk; a chunk that holds the head's fp32 logits is in flight once on the last stage, not as often as the
    others."""
    v, pp = chunk_bytes.shape
    total = n_micro * v
    j = np.arange(total)
    fwd_chunk = (j % (pp * v)) // pp
    warm = inflight_chunks_by_stage(pp=pp, interleave=v, n_micro=n_micro, schedule="1f1b") - 1
    # every stage at once (row s): a cumulative sum along each row adds in the same order as the stage's own
    a = np.ascontiguousarray(np.asarray(chunk_bytes, dtype=float).T)
    cum_f = np.cumsum(a[:, fwd_chunk], axis=1)
    cum_b = np.zeros((pp, total + 1))
    np.cumsum(a[:, v - 1 - fwd_chunk], axis=1, out=cum_b[:, 1:])
    w = np.minimum(warm, total - 1)
    back = np.maximum(j[None, :] - w[:, None], 0) + (np.arange(pp) * (total + 1))[:, None]
    return np.max(cum_f - cum_b.ravel()[back], axis=1)


def stage_memory_gb(*, params: np.ndarray, act_bytes_per_chunk: np.ndarray, inflight: np.ndarray,
                    full_recompute_extra_bytes: float, dtype_bytes: int, grad_bytes: int, held_grad_bytes: float,
                    optimizer: str, zero: int, dp: int, framework: str, block_params: float,
                    fp8_param_fraction: float = 0.0,
                    fp8_copy_bytes_per_param: float = 2.0, expert_params: np.ndarray | float = 0.0,
                    expert_dp: int | None = None, userbuffers_bytes: float = 0.0,
                    root_params: np.ndarray | float = 0.0, head_params: np.ndarray | float = 0.0,
                    reduce_bytes: int | None = None, zero3_prefetch: bool = False,
                    grad_accum_dtype: str | None = None,
                    grad_bucket_params: float = float("inf"), optimizer_impl: str | None = None,
                    muon_fraction=None, layer_wise_shares=None, main_grad_cast: bool = False,
                    transient_bytes: np.ndarray | float = 0.0) -> dict[str, np.ndarray]:
    """:func:`stage_memory` of every stage at once (arrays of stages in, the keys of :meth:`StageMemory.to_gb_dict`
    out, one array each): the same equations, term for term, in the same order of operations."""
    params = np.asarray(params, dtype=float)
    expert_params = np.asarray(expert_params, dtype=float)
    st = model_state_bytes(params, dtype_bytes=dtype_bytes, optimizer=optimizer,
                           zero=bf16_optimizer_state_zero(framework, zero, grad_accum_dtype), dp=dp,
                           grad_bytes=held_grad_bytes, expert_params=expert_params, expert_dp=expert_dp,
                           framework=framework, muon_fraction=muon_fraction, layer_wise_shares=layer_wise_shares)
    st["weights_bytes"] = st["weights_bytes"] + fp8_copy_bytes(params, fp8_param_fraction=fp8_param_fraction, zero=zero,
                                                               dp=dp, expert_params=expert_params, expert_dp=expert_dp,
        bytes_per_param=fp8_copy_bytes_per_param, framework=framework)
    during, after = buffer_bytes(framework, params=params, grad_bytes=grad_bytes, dtype_bytes=dtype_bytes, zero=zero,
                                 dp=dp, block_params=block_params, root_params=root_params, reduce_bytes=reduce_bytes,
                                 grad_accum_dtype=grad_accum_dtype)
    after = after + foreach_step_bytes(st["optimizer_bytes"], optimizer, optimizer_impl)  # 0 unless foreach
    after = after + main_grad_cast_bytes(params, expert_params,
                                         _zero_groups(bf16_optimizer_state_zero(framework, zero, grad_accum_dtype), dp,
                                                      expert_dp, framework)[1], main_grad_cast)
    grads = _fsdp_grads(framework, zero, dp, params=params, grad_bytes=grad_bytes, block_params=block_params,
                        head_params=head_params,
                        dtype_bytes=dtype_bytes, reduce_bytes=reduce_bytes, prefetch=zero3_prefetch,
                        grad_bucket_params=grad_bucket_params)
    n = len(params)

    def arr(v) -> np.ndarray:
        return v if isinstance(v, np.ndarray) else np.full(n, float(v))

    during, after, grads = arr(during), arr(after), arr(grads)
    act = np.asarray(act_bytes_per_chunk, dtype=float) * inflight + full_recompute_extra_bytes
    tr = arr(transient_bytes)
    w, m, g, o = (arr(st[k]) for k in ("weights_bytes", "master_weights_bytes", "gradients_bytes", "optimizer_bytes"))
    # the same order of additions as stage_state_parts + stage_total_from_parts
    total = w + m + g + o + np.maximum((act + tr) + ((during + grads) + userbuffers_bytes), after)
    during = during + userbuffers_bytes
    return dict(weights_gb=w / GB, master_weights_gb=m / GB, gradients_gb=g / GB, optimizer_gb=o / GB,
                activations_gb=act / GB, buffers_gb=during / GB, post_backward_buffers_gb=after / GB,
                unsharded_gradients_gb=grads / GB, transient_gb=tr / GB, total_gb=total / GB)


def stage_total_gb(*, params: np.ndarray, act_bytes_per_chunk: np.ndarray, inflight: np.ndarray,
                   full_recompute_extra_bytes: float, dtype_bytes: int, grad_bytes: int, held_grad_bytes: float,
                   optimizer: str, zero: int, dp: int, framework: str, block_params: float,
                   fp8_param_fraction: float = 0.0,
                   fp8_copy_bytes_per_param: float = 2.0, expert_params: np.ndarray | float = 0.0,
                   expert_dp: int | None = None, userbuffers_bytes: float = 0.0,
                   root_params: np.ndarray | float = 0.0, head_params: np.ndarray | float = 0.0,
                   reduce_bytes: int | None = None, zero3_prefetch: bool = False,
                   grad_accum_dtype: str | None = None,
                   grad_bucket_params: float = float("inf"), optimizer_impl: str | None = None,
                   muon_fraction=None, layer_wise_shares=None, main_grad_cast: bool = False,
                   transient_bytes: np.ndarray | float = 0.0) -> np.ndarray:
    """``stage_memory_gb(...)["total_gb"]`` alone (what a search compares with the capacity): the same equations in
    the same order of operations, so the same floating-point figures (tested), without the per-term arrays."""
    parts = stage_state_parts(params=params, dtype_bytes=dtype_bytes, grad_bytes=grad_bytes,
                              held_grad_bytes=held_grad_bytes, optimizer=optimizer, zero=zero, dp=dp, framework=framework,
                              block_params=block_params, fp8_param_fraction=fp8_param_fraction,
                              fp8_copy_bytes_per_param=fp8_copy_bytes_per_param, expert_params=expert_params,
                              expert_dp=expert_dp, root_params=root_params,
                              head_params=head_params, reduce_bytes=reduce_bytes, zero3_prefetch=zero3_prefetch,
                              grad_accum_dtype=grad_accum_dtype, grad_bucket_params=grad_bucket_params,
                              optimizer_impl=optimizer_impl, muon_fraction=muon_fraction,
                              layer_wise_shares=layer_wise_shares, main_grad_cast=main_grad_cast)
    return stage_total_from_parts(parts, act_bytes_per_chunk, inflight, full_recompute_extra_bytes, userbuffers_bytes,
                                  transient_bytes)


def stage_state_parts(*, params: np.ndarray, dtype_bytes: int, grad_bytes: int, held_grad_bytes: float, optimizer: str,
                      zero: int, dp: int, framework: str, block_params: float,
                      fp8_param_fraction: float = 0.0,
                      fp8_copy_bytes_per_param: float = 2.0, expert_params: np.ndarray | float = 0.0,
                      expert_dp: int | None = None, root_params: np.ndarray | float = 0.0,
                      head_params: np.ndarray | float = 0.0, reduce_bytes: int | None = None,
                      zero3_prefetch: bool = False, grad_accum_dtype: str | None = None,
                      grad_bucket_params: float = float("inf"), optimizer_impl: str | None = None,
                      muon_fraction=None, layer_wise_shares=None, main_grad_cast: bool = False) -> tuple:
    """What :func:`stage_total_gb` needs besides the activations, which alone depend on the schedule (a search
    keeps it per stage split, ZeRO stage, DP and expert-DP size): (weights + master weights + gradients + optimizer
    states, in that order of addition; buffers held during the passes; buffers after the last backward), bytes per
    stage (the buffers held during the passes with FSDP's unsharded gradients). ``expert_params`` of ``params``
    are sharded over ``expert_dp`` ranks (default ``dp``)."""
    params = np.asarray(params, dtype=float)
    ex = np.asarray(expert_params, dtype=float)
    mixed = dtype_bytes < 4
    opt_b = optimizer_state_bytes(optimizer, muon_fraction)
    g = _zero_groups(bf16_optimizer_state_zero(framework, zero, grad_accum_dtype), dp, expert_dp, framework)
    w_b, m_b = weight_and_master_bytes(framework, zero, dtype_bytes)
    if held_grad_bytes is None:
        held_grad_bytes = 4 if mixed else dtype_bytes
    w = _sharded(lambda x: x * w_b, params, ex, *g[3])
    w = w + fp8_copy_bytes(params, fp8_param_fraction=fp8_param_fraction, zero=zero, dp=dp, expert_params=ex,
                           expert_dp=expert_dp,
        bytes_per_param=fp8_copy_bytes_per_param, framework=framework)
    during, after = buffer_bytes(framework, params=params, grad_bytes=grad_bytes, dtype_bytes=dtype_bytes, zero=zero,
                                 dp=max(int(dp), 1), block_params=block_params, root_params=root_params,
                                 reduce_bytes=reduce_bytes, grad_accum_dtype=grad_accum_dtype)
    grads = _fsdp_grads(framework, zero, max(int(dp), 1), params=params, grad_bytes=grad_bytes,
                        block_params=block_params, head_params=head_params,
                        dtype_bytes=dtype_bytes, reduce_bytes=reduce_bytes, prefetch=zero3_prefetch,
                        grad_bucket_params=grad_bucket_params)
    during = during + grads
    master, o = _level1_bytes(params, ex, g[1], m_b, opt_b, layer_wise_shares)
    states = (w + master
              + _sharded(lambda x: x * held_grad_bytes, params, ex, *g[2])
              + o)
    after = after + foreach_step_bytes(o, optimizer, optimizer_impl)  # the foreach step's temporary (else 0)
    after = after + main_grad_cast_bytes(params, ex, g[1], main_grad_cast)  # Megatron's fp32 copy of bf16 grads
    return states, during, after


def stage_total_from_parts(parts: tuple, act_bytes_per_chunk: np.ndarray, inflight: np.ndarray,
                           full_recompute_extra_bytes: float, userbuffers_bytes: float = 0.0,
                           transient_bytes: np.ndarray | float = 0.0) -> np.ndarray:
    """Total GB per stage from :func:`stage_state_parts` and the activations: ``inflight`` chunks of
    ``act_bytes_per_chunk`` plus the layer re-materialised under full recomputation and the stage's largest kernel
    working set (``transient_bytes``); ``userbuffers_bytes`` (TP overlap's, :func:`userbuffer_bytes`) held with the
    other buffers."""
    states, during, after = parts
    act = np.asarray(act_bytes_per_chunk, dtype=float) * inflight + full_recompute_extra_bytes
    return (states + np.maximum((act + transient_bytes) + (during + userbuffers_bytes), after)) / GB


def capacity_gb(memory_gb: float) -> float:
    """A GPU's memory in GB (1e9 bytes, the unit of every memory figure here) from its catalog figure, which vendors
    give in binary units (80 GB = 80 GiB = 85.9e9 bytes)."""
    return float(memory_gb) * GIB / 1e9
