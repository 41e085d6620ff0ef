"""The options of one distributed training step: what :func:`wattcast.simulate.distributed.predict_distributed` and
:func:`~wattcast.simulate.distributed.schedule_context` take besides the model, the cluster and the parallel strategy.

    opts = DistributedOptions(batch=16, seq=512, dtype="bf16", framework="megatron")
    res = predict_distributed("gpt2", "DGX-A100", ParallelConfig(gpus=8, tp=2), opts)

The strategy itself (gpus, tp, pp, dp, micro-batch, ZeRO, overlaps, ...) is the
:class:`~wattcast.simulate.parallel.ParallelConfig`; everything else about the step is here, once. The old keyword
form ``predict_distributed(model, cluster, gpus=..., batch=..., seq=..., parallel=..., dtype=...)`` still works: its
keywords build this object (:func:`options_from_keywords`). Values are checked where they are used (the step's
checks in ``schedule_context``), with the messages they always had.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from wattcast.data.device_spec import DeviceSpec
from wattcast.simulate.defaults import DEFAULTS
from wattcast.simulate.parallel import ParallelConfig


@dataclass(frozen=True)
class DistributedOptions:
    """One training step's settings on a cluster (all but the model, the cluster and the parallel strategy)."""

    #: global batch in sequences (split into dp x micro-batches) and tokens per sequence
    batch: int
    seq: int
    #: bf16, fp16, fp32, tf32 or fp8 (Transformer Engine's recipe: FP8 GEMMs, the rest bf16)
    dtype: str = DEFAULTS.dtype
    #: flash, flash1 or eager
    attention: str = DEFAULTS.attention
    compile: bool = False
    optimizer: str = "adamw"
    #: the optimizer step's kernels: "fused" or "foreach" (PyTorch's multi-tensor passes); None: the framework's
    #: (``featurize.training_graph.FRAMEWORK_OPTIMIZER_IMPL``)
    optimizer_impl: str | None = None
    #: whose kernels and host costs: hf, megatron or megatron-deepspeed
    framework: str = "hf"
    #: the GPU (catalog name, spec file or DeviceSpec); None: the cluster's own
    device: str | DeviceSpec | None = None
    #: keep the step's event timeline (``DistributedPrediction.events``)
    trace: bool = False
    #: (per-kernel launch floor ms, fixed per-iteration ms[, {TP group size: collective host floor ms}[, ring-attention
    #: step host floor ms[, MoE bare-op host floor ms (``distributed.moe_bare_op_mask``; None: the per-kernel one)]]]);
    #: None: the framework's (``FRAMEWORK_HOST_MS``, ``FRAMEWORK_COLLECTIVE_HOST_MS``, ``FRAMEWORK_CP_STEP_HOST_MS``)
    host_ms: tuple | None = None
    #: host time per kernel launch (us; the per-kernel launch cost of ``host_ms``, which it cannot be given with): a
    #: property of the host and framework version. None: the framework's (hf: 40 us, eager PyTorch's on the Kineto
    #: traces' typical hosts, in an in-order launch queue; ``distributed.framework_launch_ms``); 35-170 us measured
    host_us: float | None = None
    power_limit_w: float | None = None
    clock_cap_mhz: float | None = None
    #: also price each class of communication alone (``exposed_comm_split_ms``; a search leaves it out for speed)
    comm_split: bool = True
    #: memory first: a strategy that does not fit is returned unscheduled (times, MFU and energy NaN)
    prune_oom: bool = False
    #: True: the event-driven pipeline scheduler (the reference); False: the closed form where it is exact
    exact_pipeline: bool = True
    #: iterations of an ONNX model's Loops whose trip count is known only at run time: a count, {node: count} or
    #: ((node, count), ...) (``wattcast.featurize.onnx``)
    loop_trip_count: Any = None
    #: mixture-of-experts routing (``simulate/moe_routing.py``): the busiest expert-parallel rank's tokens over the mean,
    #: Megatron-Core's expert capacity factor (None: dropless) and padding every expert to its capacity
    moe_load_imbalance: float = 1.0
    moe_capacity_factor: float | None = None
    moe_pad_to_capacity: bool = False
    #: Megatron-Core's ``--moe-token-dispatcher-type`` ("alltoall", the default here, or "allgather": Megatron-Core's
    #: own default, megatron-core 0.16.1 transformer_config.py l. 675); ``featurize.hf_models._moe`` / ``_moe_allgather``
    moe_token_dispatcher: str = "alltoall"
    #: ZeRO-3 / FSDP: True, each layer's parameter all-gathers and gradient reduce-scatters run beside the computation of
    #: its neighbours (prefetched; only the SMs NCCL holds slow the computation); False, in series with the computation;
    #: None: the framework's (``simulate.distributed.FRAMEWORK_ZERO3_PREFETCH``)
    zero3_prefetch: bool | None = None
    #: PyTorch FSDP (``framework="hf"``, ZeRO-3) under half precision: the dtype its gradient reduce-scatters run in
    #: (``MixedPrecision.reduce_dtype``: "fp32", "bf16", "fp16"); None: the parameters' half-precision dtype, Accelerate's
    #: and torch's default (``simulate.distributed.dp_reduce_bytes``)
    fsdp_reduce_dtype: str | None = None
    #: DeepSpeed's ``data_types.grad_accum_dtype`` (``framework="megatron-deepspeed"`` only): "fp32" runs
    #: ``BF16_Optimizer`` (bf16 ``param.grad`` + a whole-model fp32 accumulation buffer, an fp32 accumulation pass
    #: every micro-batch), "bf16" at ZeRO-1 the ZeRO optimizer on bf16 gradients (2 B/param, partition copies at the
    #: step); None: the framework's, "fp32" as BLOOM-176B ran (``simulate.distributed.FRAMEWORK_GRAD_ACCUM_DTYPE``).
    #: Under ``framework="megatron"`` the dtype of Megatron-LM's main-gradient buffer: "bf16" is its
    #: ``--grad-reduce-in-bf16``, "fp32" ``--accumulate-allreduce-grads-in-fp32`` (None: Megatron-LM's default, fp32
    #: for bf16; ``simulate.stage_memory.megatron_main_grad_bytes``)
    grad_accum_dtype: str | None = None
    #: GB of each GPU's memory the memory-aware automatic pipeline split keeps free (``search(memory_headroom_gb=)``):
    #: the cost-balanced split gives way when its worst stage needs more than the capacity less this, and the split
    #: taken instead fits within it (``parallel.memory_fitting_split``). The step's ``fits`` stays the capacity's
    split_headroom_gb: float = 0.0
    #: DeepSpeed's ``BF16_Optimizer.clear_lp_grads`` before each backward (``framework="megatron-deepspeed"``, where
    #: BF16_Optimizer runs): "zero", DeepSpeed 0.19.8's (``torch._foreach_zero_`` on the bf16 ``param.grad``,
    #: ``bf16_optimizer.py`` l. 612-623: autograd then adds each gradient into it in place, 2 + 6 B/param per
    #: micro-batch after a step's first), or "set_to_none", DeepSpeed 0.6.5's (``param.grad = None``,
    #: ``bf16_optimizer.py`` l. 445-448, called by ``pipe/engine.py`` l. 768: no such pass; BLOOM-176B's era)
    #: (``simulate.distributed.bf16_optimizer_lp_grad_bytes``)
    deepspeed_clear_lp_grads: str = "zero"
    #: Megatron-Core's ``--fp8-param-gather`` (with ``dtype="fp8"``, the distributed optimizer, ``framework="megatron"``):
    #: the FP8 GEMMs' weights are held as FP8 (Transformer Engine's FP8 primary weights): no bf16 copy beside the FP8
    #: weight and transpose, the optimizer casts each rank's shard of them and the distributed optimizer all-gathers
    #: them at 1 B a parameter
    fp8_param_gather: bool = False
    #: with ``dtype="fp8"``: Megatron-Core's ``--fp8-recipe`` (delayed, tensorwise, mxfp8, blockwise;
    #: featurize/fp8_recipes.py); None: its default, delayed
    fp8_recipe: str | None = None
    #: Megatron-Core's ``--mtp-num-layers`` (DeepSeek-V2/V3 configs, ``framework="megatron"``): multi-token-prediction
    #: depths after the head, on the last pipeline stage (``featurize.hf_models._mtp_layer``); 0: none
    mtp_num_layers: int = 0
    #: Megatron-Core's ``--cross-entropy-loss-fusion`` (``framework="megatron"``; None: the framework's default, on for
    #: megatron as its published recipes run it: ``featurize.workload.ce_fusion_default``) and its
    #: ``--cross-entropy-fusion-impl`` ("native" or "te"; ``featurize.op_graph.GraphBuilder.cross_entropy``)
    cross_entropy_loss_fusion: bool | None = None
    cross_entropy_fusion_impl: str = "native"
    #: pipeline transfers scattered over the TP group, each TP rank sending 1/tp and the receiver all-gathering them
    #: (Megatron-LM 2021's ``--scatter-gather-tensors-in-pipeline``, DeepSpeed's PartitionedTensor); None: the
    #: framework's (``simulate.distributed.FRAMEWORK_SCATTER_GATHER_P2P``: megatron-deepspeed on, megatron off as
    #: Megatron-Core); nothing to scatter under sequence parallelism
    scatter_gather_p2p: bool | None = None
    #: data loading (``simulate/data_loading.py``): host ms the data loader takes to produce one micro-batch (0: free,
    #: a tokenised stream) and its worker processes (None: the framework's default; 0: loaded in series with the step)
    data_load_ms: float = 0.0
    data_workers: int | None = None
    #: the kernel bundle, collective model and power model (None: the shipped ones, loaded once and cached)
    bundle: Any = field(default=None, compare=False, repr=False)
    coll_model: Any = field(default=None, compare=False, repr=False)
    power_model: Any = field(default=None, compare=False, repr=False)


#: ``gpus=`` not given (None is a value: the step's checks refuse it, as they always did)
MISSING: Any = object()

#: the keyword arguments the options object stands for (``predict_distributed``'s old keyword form)
OPTION_NAMES = tuple(f.name for f in fields(DistributedOptions))


def checked_headroom_gb(value, label: str) -> float:
    """A memory margin in GB as a float: finite and at least 0, else a ValueError naming it by ``label`` (search's
    ``memory_headroom_gb``, :attr:`DistributedOptions.split_headroom_gb`: a negative margin would let the memory-aware
    pipeline split pick stages over the capacity)."""
    try:
        gb = float(value)
    except (TypeError, ValueError):
        gb = float("nan")
    if isinstance(value, bool) or not math.isfinite(gb) or gb < 0:
        raise ValueError(f"{label} must be a finite number of GB, 0 or more; got {value!r}")
    return gb


def options_from_keywords(caller: str, parallel: ParallelConfig | None, options: DistributedOptions | None,
                          gpus: Any, keywords: dict) -> tuple[ParallelConfig, DistributedOptions]:
    """(parallel strategy, options) of a ``predict_distributed`` / ``schedule_context`` call in either form:
    ``(model, cluster, parallel, options)``, or the old keywords (``gpus=``, ``batch=``, ``seq=``, ``parallel=``,
    ``dtype=``, ...; ``gpus`` sets the strategy's GPU count, ``parallel`` None: ``ParallelConfig(gpus=gpus)``).
    Mixing the two, an unknown keyword or a missing required one is a TypeError naming it."""
    unknown = sorted(set(keywords) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"{caller}() got unexpected keyword argument(s) {', '.join(unknown)}")
    if options is not None:
        if not isinstance(options, DistributedOptions):
            raise TypeError(f"{caller}(): options must be a DistributedOptions, got {type(options).__name__}")
        if keywords or gpus is not MISSING:
            given = sorted(keywords) + (["gpus"] if gpus is not MISSING else [])
            raise TypeError(f"{caller}(): give the step's settings either in options= or as keywords, not both "
                            f"(got options= and {', '.join(given)}); the GPU count is parallel.gpus")
        if not isinstance(parallel, ParallelConfig):
            raise TypeError(f"{caller}(): with options= give the strategy as a ParallelConfig (at least "
                            f"ParallelConfig(gpus=N)), got {type(parallel).__name__}")
        return parallel, options
    missing = [k for k, given in (("gpus", gpus is not MISSING), ("batch", "batch" in keywords),
                                  ("seq", "seq" in keywords)) if not given]
    if missing:
        raise TypeError(f"{caller}() missing required keyword argument(s) {', '.join(missing)} "
                        "(or give parallel and options=DistributedOptions(...))")
    if parallel is not None and not isinstance(parallel, ParallelConfig):
        raise TypeError(f"{caller}(): parallel must be a ParallelConfig, got {type(parallel).__name__}")
    par = replace(parallel or ParallelConfig(gpus=gpus), gpus=gpus)
    return par, DistributedOptions(**keywords)
