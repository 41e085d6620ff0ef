"""One prediction request: the options of ``wattcast.predict`` / ``wattcast.predict_cluster`` in one frozen object.

``wattcast predict`` parses its flags into a :class:`PredictRequest` and calls :meth:`PredictRequest.predict`, which
calls the same public function a Python user calls (``wattcast.predict`` on one device, ``wattcast.predict_cluster``
with a cluster); the command line only parses flags and renders the result. A Python user may build a request too::

    req = PredictRequest("gpt2", cluster="DGX-A100", batch=16, parallel=ParallelOptions(gpus=8, tp=2))
    res = req.predict()          # == wattcast.predict_cluster("gpt2", "DGX-A100", gpus=8, tp=2, batch=16)

Defaults are those of the Python API (``simulate/defaults.py``).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from wattcast.simulate.defaults import DEFAULTS


class StepTokensUnknownError(ValueError):
    """``tokens=`` was given for a graph whose batch and sequence dims are not known (an ONNX file exported with fixed
    dims that are not named batch/sequence): the tokens one step trains on, hence the run's step count, are unknown."""


def check_inference_options(mode: Any, *, optimizer: Any = None, recompute: Any = None, optimizer_impl: Any = None,
                            recompute_modules: Any = None, grad_accumulation: bool = False, cli: bool = False,
                            default_optimizer: str | None = None) -> None:
    """The training-only options an inference step (``mode`` in ``featurize.workload.INFERENCE_MODES``) refuses, one
    check for ``wattcast predict`` (``cli=True``: messages name the flags) and the Python API (``wattcast.predict``,
    ``wattcast.predict_cluster(kv_context=...)``, :class:`PredictRequest`; messages name the keywords): an optimizer or a
    recomputation (``featurize.workload.check_training_only_options``), Megatron's recompute modules, the optimizer
    step's kernels (``optimizer_impl``) and gradient accumulation. A ValueError; nothing in a training step."""
    from wattcast.featurize.workload import INFERENCE_MODES, check_training_only_options

    if str(mode).lower() not in INFERENCE_MODES:
        return
    mode_name = "--mode inference" if cli else "mode='inference'"
    if recompute_modules is not None:
        raise ValueError(f"{'--recompute-modules' if cli else 'recompute_modules='} describe a training step; "
                         f"{mode_name} runs the forward pass only")
    check_training_only_options(mode, optimizer, recompute, default_optimizer=default_optimizer,
                                names="--optimizer and --recompute" if cli else "optimizer= and recompute=")
    if optimizer_impl is not None:
        raise ValueError(f"{'--optimizer-impl' if cli else 'optimizer_impl='} (the optimizer step's kernels) describes a "
                         f"training step; {mode_name} runs the forward pass only")
    if grad_accumulation:
        raise ValueError(f"{'--grad-accumulation' if cli else 'grad_accumulation='} (gradients summed over "
                         f"micro-batches) describes a training step; {mode_name} runs the forward pass only")


@dataclass(frozen=True)
class RunOptions:
    """A training run of ``tokens`` tokens and its lifecycle options (``--tokens`` and the flags that need it; the
    ``tokens=`` options of ``wattcast.predict``); every ``None`` takes the shipped assumption (``wattcast.lifecycle``)."""

    tokens: float | None = None
    region: str | None = None
    pue: float | None = None
    lifetime_years: float | None = None
    grid_kgco2e_per_kwh: float | None = None
    cloud_usd_per_gpu_hour: float | None = None
    mtbf_gpu_hours: float | None = None
    checkpoint_write_s: float | None = None
    electricity_usd_per_kwh: float | None = None
    pricing: str | None = None
    node_overhead_share: float | None = None
    market_based: bool | None = None

    def given_without_tokens(self) -> list[str]:
        """The run options given although ``tokens`` is not (they would be ignored)."""
        if self.tokens is not None:
            return []
        return [k for k, v in asdict(self).items() if v is not None]

    def kwargs(self) -> dict:
        """``tokens=`` and the run options given (not None), as ``wattcast.predict`` / ``predict_cluster`` take them."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class ParallelOptions:
    """How a step is split over ``gpus`` GPUs (the keyword arguments of ``wattcast.predict_cluster``; ``dp`` and
    ``micro_batch`` default from the others, the overlaps from the framework)."""

    gpus: int
    tp: int = 1
    pp: int = 1
    dp: int | None = None
    micro_batch: int | None = None
    zero: int = 0
    sp: bool = False
    ep: int = 1
    interleave: int = 1
    schedule: str = "1f1b"
    cp: int = 1
    pp_first_stage_layers: int | None = None
    pp_last_stage_layers: int | None = None
    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool | None = None
    tp_comm_overlap: bool | None = None
    overlap_moe_expert_parallel_comm: bool | None = None
    overlap_p2p_comm: bool | None = None
    #: the column-parallel linears' backward TP collective beside their weight-gradient GEMM (None: the framework's)
    async_tp_comm: bool | None = None
    recompute_num_layers: int | None = None
    #: Megatron's --recompute-method (block or uniform); None: not given (block applies to ``recompute_num_layers``).
    #: Given, it needs ``recompute="full"``
    recompute_method: str | None = None
    #: Megatron-Core's --expert-tensor-parallel-size (MoE); None: tp
    etp: int | None = None
    #: Megatron-Core's --cp-comm-type (p2p, a2a, allgather, a2a+p2p) and --hierarchical-context-parallel-sizes
    #: (None: p2p, the ring)
    cp_comm_type: str | None = None
    hierarchical_cp_sizes: tuple | None = None


#: the recomputation method that applies to ``recompute_num_layers`` when none is given (Megatron's block method)
RECOMPUTE_METHOD_DEFAULT = "block"


def parallel_defaults() -> dict:
    """The parallel options' fixed defaults (tp 1, pp 1, ZeRO 0, no SP, ep 1, interleave 1, 1F1B, cp 1, and the block
    recomputation method), from :class:`ParallelOptions`; ``wattcast.predict_cluster`` fills in all but the method,
    which applies only with ``recompute_num_layers`` (a method given without full recomputation is an error)."""
    out = {f.name: f.default for f in fields(ParallelOptions) if f.default is not MISSING and f.default is not None}
    out["recompute_method"] = RECOMPUTE_METHOD_DEFAULT
    return out


@dataclass(frozen=True)
class PredictRequest:
    """One step of ``model`` on ``device`` (``cluster`` None) or on ``parallel.gpus`` GPUs of ``cluster``.

    ``batch`` is the global batch with a cluster (required there), ``dims`` binds symbolic ONNX input dims (one device
    only), ``timeline`` keeps a cluster step's event timeline (for a trace or a plot), ``run`` the training run."""

    model: Any
    device: Any = None
    cluster: Any = None
    parallel: ParallelOptions | None = None
    batch: int | None = None
    seq: int | None = None
    mode: str = "train"
    dtype: str = DEFAULTS.dtype
    attention: str = DEFAULTS.attention
    compile: bool = False
    optimizer: str = DEFAULTS.optimizer
    #: the optimizer step's kernels (training): "fused" or "foreach"; None: the framework's
    optimizer_impl: str | None = None
    recompute: str = "none"
    power_limit_w: float | None = None
    clock_cap_mhz: float | None = None
    framework: str = DEFAULTS.framework
    dims: tuple[tuple[str, int], ...] = ()
    #: iterations of an ONNX model's run-time Loops (one device or a cluster): an int, or ((node, count), ...)
    loop_trip_count: int | tuple[tuple[str, int], ...] | None = None
    timeline: bool = False
    #: mixture-of-experts routing on a cluster (``wattcast.predict_cluster``'s options of the same names)
    moe_load_imbalance: float = 1.0
    moe_capacity_factor: float | None = None
    moe_pad_to_capacity: bool = False
    #: Megatron-Core's --moe-token-dispatcher-type on a cluster ("alltoall" or "allgather")
    moe_token_dispatcher: str = "alltoall"
    #: ZeRO-3 / FSDP collectives beside the computation (True) or in series (False); None: the framework's
    zero3_prefetch: bool | None = None
    #: pipeline transfers scattered over the TP group (Megatron-LM 2021 / DeepSpeed); None: the framework's
    scatter_gather_p2p: bool | None = None
    #: PyTorch FSDP's MixedPrecision.reduce_dtype (hf, ZeRO-3): "fp32", "bf16", "fp16"; None: the parameters' dtype
    fsdp_reduce_dtype: str | None = None
    #: DeepSpeed's data_types.grad_accum_dtype (megatron-deepspeed): "fp32" (BF16_Optimizer) or "bf16" (at ZeRO-1 its
    #: ZeRO optimizer on bf16 gradients); None: the framework's ("fp32"). Under megatron the main-gradient buffer's
    #: dtype: "bf16" is Megatron-LM's --grad-reduce-in-bf16
    grad_accum_dtype: str | None = None
    #: Megatron-Core's --fp8-param-gather (a cluster step with dtype fp8, ZeRO >= 1, framework megatron)
    fp8_param_gather: bool = False
    #: Megatron-Core's --fp8-recipe (with dtype fp8, one device or a cluster): delayed (None: the default), tensorwise,
    #: mxfp8 or blockwise
    fp8_recipe: str | None = None
    #: Megatron-Core's --mtp-num-layers (a cluster step, framework megatron, DeepSeek-V2/V3 configs)
    mtp_num_layers: int = 0
    #: the host's time per kernel launch, us (``wattcast.predict``'s / ``predict_cluster``'s host_us); None: the default
    host_us: float | None = None
    #: Megatron-Core's --cross-entropy-loss-fusion (a cluster step, framework megatron; None: the framework's default,
    #: on for megatron) and --cross-entropy-fusion-impl ("native" or "te")
    cross_entropy_loss_fusion: bool | None = None
    cross_entropy_fusion_impl: str = "native"
    #: use this many of each node's GPUs (None: all of them)
    gpus_per_node: int | None = None
    #: data loading: the loader's host ms per micro-batch (one device: per step) and its workers (None: the framework's)
    data_load_ms: float = 0.0
    data_workers: int | None = None
    #: inference with a KV cache (one device, or with ``cluster`` one node's tensor-parallel group): tokens already
    #: cached per sequence (``wattcast.predict``'s / ``wattcast.predict_cluster``'s kv_context)
    kv_context: int | None = None
    #: inference LM head positions: "last" (default in inference) or "all" (``wattcast.predict``'s logits)
    logits: str | None = None
    #: a serving engine's decode iteration (one device or TP group): "vllm" or None (off), with the requests' mean prompt and
    #: output tokens (``wattcast.predict``'s serving / prompt_tokens / output_tokens)
    serving: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    #: ``torch.backends.cudnn.allow_tf32`` (one device): an fp32 model's convolutions in TF32 where the GPU has it
    #: (True, PyTorch's default) or FP32 (``wattcast.predict``'s cudnn_tf32)
    cudnn_tf32: bool = True
    run: RunOptions = field(default_factory=RunOptions)
    #: folders of retrained models (``wattcast train kernels|collectives|power --out``): the kernel bundle, the
    #: collective model, the power model; None: ``$WATTCAST_MODELS`` / ``$WATTCAST_COLLECTIVES`` /
    #: ``$WATTCAST_POWER_MODEL``, else the shipped ones (``wattcast.predict``'s models= / collectives= / power_model=)
    models: Any = None
    collectives: Any = None
    power_model: Any = None

    @property
    def distributed(self) -> bool:
        return self.cluster is not None

    def predict(self):
        """The prediction, from ``wattcast.predict`` (one device) or ``wattcast.predict_cluster`` (a cluster):
        a StepPrediction or a DistributedPrediction, with ``.run`` when ``run.tokens`` is set."""
        import wattcast

        loops = self.loop_trip_count
        common = dict(batch=self.batch, seq=self.seq, dtype=self.dtype, attention=self.attention, compile=self.compile,
                      optimizer=self.optimizer, recompute=self.recompute, power_limit_w=self.power_limit_w,
                      clock_cap_mhz=self.clock_cap_mhz, loop_trip_count=dict(loops) if isinstance(loops, tuple) else loops,
                      **({"fp8_recipe": self.fp8_recipe} if self.fp8_recipe is not None else {}),
                      **({"optimizer_impl": self.optimizer_impl} if self.optimizer_impl is not None else {}),
                      **({"host_us": self.host_us} if self.host_us is not None else {}),
                      models=self.models, collectives=self.collectives, power_model=self.power_model,
                      **self.run.kwargs())
        if not self.distributed:
            if self.parallel is not None or self.timeline or self.framework != DEFAULTS.framework:
                raise ValueError("parallel=, timeline= and framework= describe a cluster step: give cluster= too")
            from wattcast.simulate.moe_routing import ROUTING_DEFAULTS, given_routing

            if given_routing({k: getattr(self, k) for k in ROUTING_DEFAULTS}):
                raise ValueError("the MoE routing options describe expert-parallel ranks of a cluster step: give cluster= too")
            if self.fp8_param_gather:
                raise ValueError("fp8_param_gather= is the distributed optimizer's FP8 parameter gather: give cluster= too")
            if self.fsdp_reduce_dtype is not None or self.zero3_prefetch is not None:
                raise ValueError("fsdp_reduce_dtype= and zero3_prefetch= describe FSDP's ZeRO-2/3 data parallelism "
                                 "(ZeRO-3; ZeRO-2 as SHARD_GRAD_OP under framework='hf'): give cluster= too")
            if self.grad_accum_dtype is not None:
                raise ValueError("grad_accum_dtype= is the gradient-accumulation dtype of a distributed step: give "
                                 "cluster= and framework='megatron-deepspeed' (DeepSpeed's) or 'megatron' (Megatron-LM's "
                                 "main gradients) too")
            if self.mtp_num_layers:
                raise ValueError("mtp_num_layers= is Megatron-Core's multi-token prediction: give cluster= and "
                                 "framework='megatron' too")
            if self.cross_entropy_loss_fusion is not None or str(self.cross_entropy_fusion_impl).lower() != "native":
                raise ValueError("cross_entropy_loss_fusion= / cross_entropy_fusion_impl= are Megatron-Core's fused loss: "
                                 "give cluster= and framework='megatron' too")
            return wattcast.predict(self.model, self.device, mode=self.mode, dims=dict(self.dims) or None,
                                    kv_context=self.kv_context, logits=self.logits, serving=self.serving,
                                    prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens,
                                    data_load_ms=self.data_load_ms, data_workers=self.data_workers,
                                    **({"cudnn_tf32": False} if not self.cudnn_tf32 else {}), **common)
        if not self.cudnn_tf32:
            raise ValueError("cudnn_tf32=False applies to one device: a cluster step costs an fp32 model's convolutions "
                             "as PyTorch's default runs them (TF32 where the GPU has it)")
        served = dict(kv_context=self.kv_context, logits=self.logits, serving=self.serving,
                      prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens)
        if self.kv_context is None and any(v is not None for v in served.values()):
            raise ValueError("logits= / serving= / prompt_tokens= / output_tokens= on a cluster describe KV-cached "
                             "inference on one node's tensor-parallel group: give kv_context= too")
        if self.parallel is None:
            raise ValueError("a cluster step needs parallel= (at least ParallelOptions(gpus=N))")
        if self.kv_context is not None:
            from wattcast.featurize.workload import INFERENCE_MODES

            if str(self.mode).lower() not in INFERENCE_MODES:
                raise ValueError("kv_context= describes an inference step with a KV cache (mode='inference')")
            if self.dims:
                raise ValueError("dims= applies to single-device predictions of ONNX models")
            check_inference_options(self.mode, optimizer=common.pop("optimizer"), recompute=self.recompute,
                                    optimizer_impl=common.pop("optimizer_impl", None),
                                    default_optimizer=DEFAULTS.optimizer)
            return wattcast.predict_cluster(self.model, self.cluster, device=self.device, framework=self.framework,
                                            gpus_per_node=self.gpus_per_node, **served, **asdict(self.parallel),
                                            **common)
        if str(self.mode).lower() not in ("train", "training"):
            raise ValueError("distributed prediction is for training steps (mode='train')")
        if self.dims:
            raise ValueError("dims= applies to single-device predictions of ONNX models")
        # seq None: predict_cluster's default (1,024, or an ONNX file's own)
        return wattcast.predict_cluster(self.model, self.cluster, device=self.device, trace=self.timeline,
                                        framework=self.framework, moe_load_imbalance=self.moe_load_imbalance,
                                        moe_capacity_factor=self.moe_capacity_factor,
                                        moe_pad_to_capacity=self.moe_pad_to_capacity,
                                        moe_token_dispatcher=self.moe_token_dispatcher, gpus_per_node=self.gpus_per_node,
                                        zero3_prefetch=self.zero3_prefetch, fsdp_reduce_dtype=self.fsdp_reduce_dtype,
                                        scatter_gather_p2p=self.scatter_gather_p2p, data_load_ms=self.data_load_ms,
                                        grad_accum_dtype=self.grad_accum_dtype,
                                        data_workers=self.data_workers, fp8_param_gather=self.fp8_param_gather,
                                        mtp_num_layers=self.mtp_num_layers,
                                        cross_entropy_loss_fusion=self.cross_entropy_loss_fusion,
                                        cross_entropy_fusion_impl=self.cross_entropy_fusion_impl,
                                        **asdict(self.parallel), **common)
