"""One entry point from a model reference to the operator graph of a step.

``model`` may be an ONNX file (``.onnx``), a Hugging Face ``config.json`` (or any ``.json`` config),
a built-in model name (:func:`wattcast.featurize.hf_config.builtin_models`), a config dict, or a
``torch.nn.Module`` (traced with ``torch.export`` on the meta device).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from wattcast.data.checks import is_count, is_int, real_in
from wattcast.data.kernel_ops import DTYPE_BYTES, FLASH_KERNELS, canonical_dtype
from wattcast.featurize.te_attention import TE_ATTENTION_BACKENDS
from wattcast.featurize.graph_cache import GraphMemo, RowsCache, rows_cached
from wattcast.featurize.hf_config import HFConfig, load_hf_config, locate_model_config, model_warnings, pinned
from wattcast.featurize.op_graph import GraphBuilder, GraphError, OpGraph
from wattcast.featurize.recompute import RecomputeError, recompute_setting
from wattcast.featurize.training_graph import optimizer_impl_key, optimizer_key, training_graph

MODES = ("train", "inference")
#: "flash" is today's fused attention as the framework runs it (PyTorch SDPA's FlashAttention-2 under "hf" and
#: Megatron-DeepSpeed's flash-attn 2.x: kernel "fa2"; Transformer Engine's cuDNN fused attention under "megatron" on
#: compute capability >= 9.0: "fa3", below it FA2), "flash1" the 2022-23 class (FlashAttention-1, Triton
#: FlashAttention), "flash3" the generation's own fused kernel whatever the framework (FlashAttention-3 / cuDNN, e.g.
#: SDPA with FA3 registered, ``torch.nn.attention.activate_flash_attention_impl("FA3")``); all build the same fused
#: node, costed per class (models/attention.py)
ATTENTION = ("eager", "flash", "flash1", "flash3")
_FLASH_KERNEL_OF = {"flash": "fa2", "flash1": "fa1", "flash3": "fa3"}


@dataclass(frozen=True)
class StepOptions:
    """What one step runs: shapes, precision, attention kernel, fusion, optimizer, recomputation."""

    #: sequences and tokens per sequence; None: not given (a Hugging Face config or module takes 1 and 1,024, an
    #: ONNX file keeps its own fixed dims or binds its symbolic ones to those defaults)
    batch: int | None = 1
    seq: int | None = 1024
    mode: str = "train"
    dtype: str = "fp32"
    attention: str = "eager"
    compile: bool = False
    optimizer: str = "adamw"
    recompute: str = "none"
    grad_accumulation: bool = False
    #: the graph of one tensor-parallel rank: tp degree, sequence parallelism, expert parallelism
    tp: int = 1
    sp: bool = False
    ep: int = 1
    #: context parallelism: ``seq`` is then this rank's share of the sequence (seq / cp tokens), and attention reads
    #: the whole sequence's keys and values through the ring (``GraphBuilder.flash_attention``)
    cp: int = 1
    #: how context parallelism communicates (ParallelConfig.cp_comm_type: p2p, a2a, allgather, a2a+p2p) and the size of
    #: its all-to-all group (a2a: cp; a2a+p2p: the inner size; else 1): the attention kernel's shape follows them
    cp_comm: str = "p2p"
    cp_a2a: int = 1
    #: the routed experts' tensor-parallel degree (Megatron-Core's --expert-tensor-parallel-size); None: ``tp``
    etp: int | None = None
    #: multi-token-prediction depths (Megatron-Core's --mtp-num-layers; DeepSeek-style models under "megatron")
    mtp_layers: int = 0
    #: whose kernels and host costs: "hf" (Hugging Face eager modules), "megatron" (Megatron-LM's fused
    #: kernels; GPT only) or "megatron-deepspeed" (the same kernels driven by DeepSpeed's engine)
    framework: str = "hf"
    #: build only this many transformer blocks of a Hugging Face config (0: all of them); for models whose
    #: blocks are all alike, a short graph stands for the whole one (simulate/distributed.py)
    blocks: int = 0
    #: other symbolic ONNX input dims, bound by name: ((name, value), ...)
    dims: tuple = ()
    #: the fused-attention implementation class (data/kernel_ops.FLASH_KERNELS); set from ``attention`` by validated()
    flash_kernel: str = "fa2"
    #: iterations of the ONNX Loops whose trip count is known only at run time: a count, or ((node name, count), ...)
    loop_trip_count: Any = None
    #: mixture-of-experts routing: tokens this rank's experts process over the balanced share (>= 1; see
    #: ``simulate.moe_routing.moe_load_factor``): the busiest expert-parallel rank, which every layer waits for
    moe_load: float = 1.0
    #: Megatron-Core's ``--moe-pad-expert-input-to-capacity`` (``simulate.moe_routing``; ``moe_load`` is then the
    #: capacity factor): every expert, reached by a token or not, runs on its capacity's rows
    #: (``featurize.hf_models.padded_expert_capacity``)
    moe_pad_to_capacity: bool = False
    #: Megatron-Core's ``--moe-token-dispatcher-type`` (``framework="megatron"`` MoE layers): "alltoall" (the recipes'
    #: and wattcast's default) or "allgather" (``TransformerConfig.moe_token_dispatcher_type``'s own default,
    #: megatron-core 0.16.1 transformer_config.py l. 675; ``featurize.hf_models._moe_allgather``)
    moe_token_dispatcher: str = "alltoall"
    #: inference with a KV cache (Llama-architecture Hugging Face configs): tokens already in each sequence's cache.
    #: The step runs ``seq`` new tokens per sequence against ``kv_context + seq`` keys/values (seq 1: one decode
    #: step; context 0: a prefill that fills the cache). None: the bare forward, no cache
    kv_context: int | None = None
    #: which positions the inference LM head computes logits for: "last" (generation: transformers'
    #: ``logits_to_keep=1`` in ``generate``, vLLM's last-token gather before its logits processor) or "all" (the
    #: plain ``model(input_ids)`` forward); None: "last" in inference. Training always computes all of them
    logits: str | None = None
    #: Megatron-Core's ``--cross-entropy-loss-fusion`` (``TransformerConfig.cross_entropy_loss_fusion``) and its
    #: ``cross_entropy_fusion_impl`` ("native": megatron/core/fusions/fused_cross_entropy.py; "te": Transformer
    #: Engine's ``parallel_cross_entropy``); None: the framework's default (:func:`ce_fusion_default`)
    cross_entropy_loss_fusion: bool | None = None
    cross_entropy_fusion_impl: str = "native"
    #: under ``dtype="fp8"``: Megatron-Core's ``--fp8-recipe`` (delayed, tensorwise, mxfp8, blockwise;
    #: featurize/fp8_recipes.py); None: its default, delayed. Given with another dtype: a GraphError
    fp8_recipe: str | None = None
    #: under ``dtype="fp8"`` with a per-tensor recipe (delayed, tensorwise): whether Transformer Engine writes the FP8
    #: transpose of each cast tensor and cached weight, as on Hopper (True), or not, as on data-centre Blackwell
    #: (``featurize.fp8_recipes.fp8_writes_transpose``; the callers that know the GPU set it from its spec)
    fp8_transpose: bool = True
    #: Transformer Engine's attention backend under Megatron-Core (``framework="megatron"``, ``attention="flash"``):
    #: "flash" (FlashAttention 2/3) or "fused" (cuDNN's FusedAttention), which decides whether the attention output is
    #: kept once or twice (featurize/te_attention.py; the callers that know the GPU set it from its spec:
    #: ``te_attention_backend``). Elsewhere it is read as "flash" (no effect)
    te_attention_backend: str = "flash"
    #: mixture-of-experts layers as vLLM's fused MoE runs them (``featurize.hf_models._moe_vllm_fused``: top-k softmax,
    #: align, ONE grouped-GEMM launch for gate_up and one for down over the active experts, silu_and_mul, moe_sum) in
    #: place of transformers' per-expert loop; set by the paths that cost a vLLM serving step (``predict(serving=
    #: "vllm")``, ``predict_cluster(kv_context=...)``). Inference under framework "hf" only
    fused_moe: bool = False
    #: the optimizer step's kernels: "fused" (one pass) or "foreach" (PyTorch's multi-tensor passes);
    #: None: the framework's (``featurize.training_graph.FRAMEWORK_OPTIMIZER_IMPL``)
    optimizer_impl: str | None = None
    #: ``torch.backends.cudnn.allow_tf32`` (True, PyTorch's default): an fp32 model's convolutions run in TF32 on a GPU
    #: with TF32 tensor cores (``simulate.single_device.with_cudnn_tf32``); False keeps them FP32. The graph carries it
    #: as ``meta["cudnn_tf32"]`` (absent: True)
    cudnn_tf32: bool = True

    def validated(self) -> "StepOptions":
        mode = {"inf": "inference", "infer": "inference", "training": "train"}.get(str(self.mode).lower(), str(self.mode).lower())
        if mode not in MODES:
            raise GraphError(f"unknown mode {self.mode!r}; use train or inference")
        dtype = checked_dtype(self.dtype)
        att = str(self.attention).lower()
        if att not in ATTENTION:
            raise GraphError(f"unknown attention {self.attention!r}; use eager, flash, flash1 or flash3")
        for name in ("batch", "seq"):
            v = getattr(self, name)
            if v is not None and not _is_count(v):
                raise GraphError(f"{name} must be a positive whole number, got {v!r}")
        _check_tokens(self.batch, self.seq)
        for name in ("compile", "grad_accumulation", "sp", "fp8_transpose", "moe_pad_to_capacity", "fused_moe",
                     "cudnn_tf32"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise GraphError(f"{name} must be True or False, got {getattr(self, name)!r}")
        try:
            dims = tuple(sorted(dict(self.dims).items()))
        except (TypeError, ValueError):
            raise GraphError(f"dims must map input dim names to sizes (e.g. {{'past_len': 128}}), got {self.dims!r}") from None
        for k, v in dims:
            if not _is_count(v):
                raise GraphError(f"dim {k} must be a positive whole number, got {v!r}")
        try:
            recompute = recompute_setting(self.recompute)
        except RecomputeError as e:
            raise GraphError(str(e)) from None
        opt = optimizer_key(self.optimizer)
        # "flash1" / "flash3" are the fused node with that kernel class; validated twice, the class stays what it was
        # set to
        fk = _FLASH_KERNEL_OF[att] if att in ("flash1", "flash3") else str(self.flash_kernel)
        if fk not in FLASH_KERNELS:
            raise GraphError(f"unknown flash attention kernel {self.flash_kernel!r}; use one of {', '.join(FLASH_KERNELS)}")
        if att in _FLASH_KERNEL_OF:
            att = "flash"
        te_backend = str(self.te_attention_backend).lower()
        if te_backend not in TE_ATTENTION_BACKENDS:
            raise GraphError(f"unknown Transformer Engine attention backend {self.te_attention_backend!r}; use one of "
                             f"{', '.join(TE_ATTENTION_BACKENDS)}")
        framework = canonical_framework(self.framework)
        if framework == "megatron" and att == "flash" and te_backend == "fused" and fk == "fa2":
            fk = "fa3"  # TE's cuDNN FusedAttention (compute capability >= 9.0): the generation's own kernel
        if self.fused_moe and (mode != "inference" or framework != "hf"):
            raise GraphError(f"fused_moe (vLLM's fused MoE kernels) describes an inference step under framework 'hf', "
                             f"not a {mode} step under {framework!r}")
        if not (framework == "megatron" and att == "flash" and mode == "train"):
            te_backend = "flash"  # no effect there: one cache key
        if self.optimizer_impl is not None and opt == "none":
            raise GraphError(f"optimizer_impl {self.optimizer_impl!r} describes the optimizer step's kernels: optimizer "
                             f"'none' runs no step (drop --optimizer-impl, or give an optimizer)")
        opt_impl = optimizer_impl_key(self.optimizer_impl, framework, opt)
        return StepOptions(None if self.batch is None else int(self.batch), None if self.seq is None else int(self.seq),
                           mode, dtype, att, bool(self.compile), opt,
                           recompute, bool(self.grad_accumulation), int(self.tp), bool(self.sp), int(self.ep),
                           cp=int(self.cp), cp_comm=str(self.cp_comm), cp_a2a=int(self.cp_a2a), framework=framework, blocks=int(self.blocks),
                           dims=tuple((str(k), int(v)) for k, v in dims), flash_kernel=fk,
                           loop_trip_count=_trip_count_option(self.loop_trip_count), moe_load=_moe_load(self.moe_load),
                           moe_pad_to_capacity=bool(self.moe_pad_to_capacity),
                           etp=_etp_option(self.etp), mtp_layers=_mtp_option(self.mtp_layers),
                           moe_token_dispatcher=moe_dispatcher_option(self.moe_token_dispatcher),
                           kv_context=_kv_context_option(self.kv_context, mode), logits=_logits_option(self.logits, mode),
                           fp8_recipe=fp8_recipe_option(self.fp8_recipe, dtype),
                           fp8_transpose=bool(self.fp8_transpose) or dtype != "fp8", te_attention_backend=te_backend,
                           fused_moe=bool(self.fused_moe), optimizer_impl=opt_impl, cudnn_tf32=bool(self.cudnn_tf32),
                           **ce_fusion_options(self.cross_entropy_loss_fusion, self.cross_entropy_fusion_impl,
                                               framework))

    def with_default_shape(self) -> "StepOptions":
        """Batch 1 and 1,024 tokens where they were not given (batch x seq then checked against
        :data:`MAX_TOKENS_PER_STEP`: a batch given alone meets the default length here)."""
        out = replace(self, batch=1 if self.batch is None else self.batch, seq=1024 if self.seq is None else self.seq)
        _check_tokens(out.batch, out.seq)
        return out


def fp8_recipe_option(recipe: Any, dtype: str) -> str | None:
    """The FP8 recipe of a step in ``dtype``: under fp8 the checked name (None: Megatron-Core's default, delayed);
    under any other dtype None, and a recipe given there is a GraphError (it would change nothing)."""
    from wattcast.featurize.fp8_recipes import DEFAULT_FP8_RECIPE, FP8RecipeError, checked_fp8_recipe

    if dtype != "fp8":
        if recipe is not None:
            raise GraphError(f"--fp8-recipe {recipe} is the scaling recipe of an FP8 step: it needs --dtype fp8 "
                             f"(got {dtype})")
        return None
    try:
        return DEFAULT_FP8_RECIPE if recipe is None else checked_fp8_recipe(recipe)
    except FP8RecipeError as e:
        raise GraphError(str(e)) from None


#: Megatron-Core's cross-entropy fusion implementations (``--cross-entropy-fusion-impl``)
CE_FUSION_IMPLS = ("native", "te")


def ce_fusion_default(framework: str) -> bool:
    """Whether a framework fuses the cross-entropy loss when not told. "megatron": yes, as the published recipes
    run it (the same rule as the overlaps, ``simulate.overlap.overlap_defaults``): Megatron-Bridge 0.6.2's
    ``GPTModelProvider`` defaults ``cross_entropy_loss_fusion = True`` (megatron/bridge/models/gpt_provider.py) and
    its Llama 3 / 3.1 pretraining recipes (recipes/llama/h100/llama3.py) and GPT-3 175B recipe
    (recipes/gpt/h100/gpt3_175b.py) set it (Megatron-Core's own ``TransformerConfig`` and Megatron-LM's
    ``--cross-entropy-loss-fusion`` default to off: pass ``cross_entropy_loss_fusion=False`` for a plain Megatron-LM
    run). Megatron-DeepSpeed and Hugging Face have no such option: no."""
    return framework == "megatron"


def ce_fusion_options(fusion: Any, impl: Any, framework: str) -> dict:
    """``cross_entropy_loss_fusion`` resolved (None: :func:`ce_fusion_default`) and checked with its implementation
    (a GraphError names a bad one, or the fusion asked of a framework without it)."""
    if fusion is not None and not isinstance(fusion, (bool, np.bool_)):
        raise GraphError(f"cross_entropy_loss_fusion must be True, False or None (the framework's default), got {fusion!r}")
    s = str(impl).lower()
    if s not in CE_FUSION_IMPLS:
        raise GraphError(f"cross_entropy_fusion_impl must be one of {', '.join(CE_FUSION_IMPLS)}, got {impl!r}")
    on = ce_fusion_default(framework) if fusion is None else bool(fusion)
    if on and framework != "megatron":
        raise GraphError(f"--cross-entropy-loss-fusion is Megatron-Core's (--framework megatron), not {framework}'s")
    return dict(cross_entropy_loss_fusion=on, cross_entropy_fusion_impl=s)


def checked_dtype(v) -> str:
    """``v`` as a canonical dtype name (BF16, bfloat16, half ... accepted), or a GraphError naming it."""
    dtype = canonical_dtype(v)
    if dtype not in DTYPE_BYTES:
        raise GraphError(f"unknown dtype {v!r}; use one of fp32, tf32, bf16, fp16, fp8")
    return dtype


#: tokens of one step on one device (batch x seq) that the graph builders cost; beyond it, index arithmetic
#: (tokens x hidden x vocabulary bytes) leaves int64 and no real device holds the activations anyway
MAX_TOKENS_PER_STEP = 2**32


def _check_tokens(batch, seq) -> None:
    """GraphError when batch x seq, or the one of them given (the other None: not given yet), is beyond
    :data:`MAX_TOKENS_PER_STEP`."""
    if batch is not None and seq is not None:
        if int(batch) * int(seq) > MAX_TOKENS_PER_STEP:
            raise GraphError(f"batch x seq = {int(batch) * int(seq):,} tokens in one step is beyond what wattcast "
                             f"costs ({MAX_TOKENS_PER_STEP:,}); for a distributed run give the global batch to the cluster "
                             "prediction, which splits it into micro-batches")
        return
    for name, v in (("batch", batch), ("seq", seq)):
        if v is not None and int(v) > MAX_TOKENS_PER_STEP:
            raise GraphError(f"{name} = {int(v):,} alone is beyond the {MAX_TOKENS_PER_STEP:,} tokens in one step "
                             "(batch x seq) that wattcast costs; for a distributed run give the global batch to the "
                             "cluster prediction, which splits it into micro-batches")


#: the largest MoE routing load modelled (a busiest rank 1,000x the mean is a typo, not a router)
MOE_LOAD_MAX = 1e3


def _kv_context_option(v: Any, mode: str) -> int | None:
    """``kv_context`` checked: None, or a whole number >= 0 of tokens, for an inference step only."""
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)) or not (is_int(v) or (isinstance(v, float) and float(v).is_integer())) or v < 0:
        raise GraphError(f"kv_context (tokens already in the KV cache per sequence) must be a whole number >= 0, got {v!r}")
    if mode != "inference":
        raise GraphError("kv_context (--kv-context) describes an inference step with a KV cache; a training step "
                         "(mode train) has no cache: use mode inference")
    if int(v) > MAX_TOKENS_PER_STEP:
        raise GraphError(f"kv_context {int(v):,} is beyond the {MAX_TOKENS_PER_STEP:,} tokens wattcast costs")
    return int(v)


#: the names ``mode`` takes for an inference step (the CLI's --mode and the API's mode=)
INFERENCE_MODES = ("inference", "inf", "infer")


def check_training_only_options(mode: Any, optimizer: Any, recompute: Any, names: str = "optimizer= and recompute=",
                                default_optimizer: str | None = None) -> None:
    """An inference step runs the forward pass only: an optimizer (other than None/"none", or ``default_optimizer``,
    the default an API keyword carries when not given) or a recomputation (other than None/"none") describes a training
    step, a ValueError naming ``names`` (the CLI's --optimizer and --recompute, the API's keywords)."""
    if str(mode).lower() not in INFERENCE_MODES:
        return
    opt = None if optimizer is None else str(optimizer).lower()
    rec = None if recompute is None else str(recompute).lower()
    if opt not in (None, "none", default_optimizer) or rec not in (None, "none"):
        mode_name = "--mode inference" if names.startswith("--") else "mode='inference'"
        raise ValueError(f"{names} describe a training step; {mode_name} runs the forward pass only")


def _logits_option(v: Any, mode: str) -> str:
    """``logits``: "last" or "all" (None: "last" in inference, "all" in training, where the loss needs every one)."""
    if v is None:
        return "all" if mode == "train" else "last"
    s = str(v).lower()
    if s not in ("last", "all"):
        raise GraphError(f"logits must be 'last' (the last position's, as generation computes them) or 'all', got {v!r}")
    if mode == "train" and s != "all":
        raise GraphError("logits='last' applies to inference: a training step's loss reads the logits of every position")
    return s


def _etp_option(v: Any) -> int | None:
    if v is None:
        return None
    if not _is_count(v):
        raise GraphError(f"etp (the experts' tensor-parallel degree) must be a positive whole number, got {v!r}")
    return int(v)


def _mtp_option(v: Any) -> int:
    if not (_is_count(v) or (is_int(v) and v == 0)):
        raise GraphError(f"mtp_layers (--mtp-num-layers) must be a whole number >= 0, got {v!r}")
    return int(v)


#: Megatron-Core's token dispatchers wattcast builds (``--moe-token-dispatcher-type``; its "flex" (DeepEP / HybridEP)
#: is not modelled)
MOE_DISPATCHERS = ("alltoall", "allgather")


def moe_dispatcher_option(v: Any) -> str:
    """A ``--moe-token-dispatcher-type`` value, lower-cased; anything but :data:`MOE_DISPATCHERS` is a GraphError."""
    name = str(v).strip().lower()
    if name not in MOE_DISPATCHERS:
        raise GraphError(f"unknown MoE token dispatcher {v!r}; use one of {', '.join(MOE_DISPATCHERS)} (Megatron-Core's "
                         f"--moe-token-dispatcher-type; flex is not modelled)")
    return name


def _moe_load(v: Any) -> float:
    f = real_in(v, 1.0, MOE_LOAD_MAX)
    if f is None:
        raise GraphError(f"moe_load (tokens of the busiest expert-parallel rank over the balanced share) must be a number "
                         f"from 1 to 1000, got {v!r}")
    return f


def _trip_count_option(v: Any) -> Any:
    """``loop_trip_count`` checked and hashable: None, a count, or sorted ((node name, count), ...)."""
    if v is None:
        return None
    from wattcast.featurize.onnx.assemble import check_trip_count

    v = check_trip_count(dict(v) if isinstance(v, tuple) else v)
    return tuple(sorted(v.items())) if isinstance(v, dict) else v


def _is_count(v) -> bool:
    """A positive whole number: a Python or numpy integer, or a float with no fraction (4.0); not a bool."""
    return is_count(v, whole_floats=True)


def is_onnx_path(model: Any) -> bool:
    """Whether ``model`` names an ONNX file (by its suffix)."""
    return isinstance(model, (str, Path)) and str(model).lower().endswith(".onnx")


def canonical_framework(f: str) -> str:
    """``f`` lower-cased, checked to be a framework the graph builders know (hf, megatron, megatron-deepspeed)."""
    f = str(f).lower()
    if f not in ("hf", "megatron", "megatron-deepspeed"):
        raise GraphError(f"unknown framework {f!r}; use hf, megatron or megatron-deepspeed")
    return f


#: families Megatron-Core's GPTModel builds as :func:`wattcast.featurize.hf_models.llama_megatron` (RMSNorm, SwiGLU,
#: RoPE; Qwen3's qk-layernorm; Megatron-Core's MoE layer on the sparse layers)
_MEGATRON_LLAMA_FAMILIES = ("llama", "mixtral", "qwen3", "qwen2_moe", "qwen3_moe")


def _hf_forward(cfg: HFConfig, opts: StepOptions) -> OpGraph:
    from wattcast.featurize.hf_models import GENERATORS

    # tf32 runs fp32 tensors on tensor cores: the graph's tensors are fp32-sized, the kernels tf32
    # fp8: Transformer Engine's recipe, the linear layers' GEMMs in FP8 (with their casts), everything else in bf16
    fp8 = opts.dtype == "fp8"
    b = GraphBuilder("bf16" if fp8 else opts.dtype, train=opts.mode == "train", name=cfg.name, tp=opts.tp, sp=opts.sp,
                     ep=opts.ep, cp=opts.cp, cp_comm=opts.cp_comm, cp_a2a=opts.cp_a2a, gemm_dtype="fp8" if fp8 else None,
                     flash_kernel=opts.flash_kernel, etp=opts.etp,
                     fp8_recipe=fp8_recipe_option(opts.fp8_recipe, opts.dtype) or "delayed",
                     fp8_transpose=opts.fp8_transpose)
    b.moe_load = float(opts.moe_load)
    b.moe_pad = bool(opts.moe_pad_to_capacity)
    b.moe_dispatcher = opts.moe_token_dispatcher
    b.fused_moe = bool(opts.fused_moe)  # read by hf_models.fused_moe_layer
    _check_kv_cache(cfg, opts)
    #: the KV-cached step (GraphBuilder.kv_context, read by hf_models._llama_attention) and the inference LM head's
    #: positions (hf_blocks.lm_head_and_loss)
    b.kv_context = opts.kv_context
    b.logits_last = opts.mode != "train" and opts.logits == "last"
    if cfg.family == "gpt_oss" and opts.framework in ("megatron", "megatron-deepspeed"):
        raise GraphError(f"{cfg.name}: gpt-oss (model_type gpt_oss) is built for the Hugging Face path only (--framework "
                         f"hf), not {opts.framework}: its attention sinks and clamped SwiGLU experts are not modelled in "
                         f"{'Megatron-Core' if opts.framework == 'megatron' else 'Megatron-DeepSpeed'}'s layer spec here")
    if opts.framework == "megatron-deepspeed" and cfg.family != "gpt2":
        raise GraphError(f"framework 'megatron-deepspeed' models GPT (gpt2-type configs) only, not {cfg.model_type}")
    if opts.framework == "megatron" and cfg.family not in ("gpt2", *_MEGATRON_LLAMA_FAMILIES, "deepseek"):
        raise GraphError(f"framework 'megatron' models GPT (gpt2-type), Llama-architecture, Mixtral, Qwen3, Qwen2-MoE, "
                         f"Qwen3-MoE and DeepSeek-V2/V3 configs (Megatron-Core's GPTModel, with its MoE layer, "
                         f"qk-layernorm and multi-latent attention), not {cfg.model_type}")
    if cfg.family == "gpt2" and cfg.n_experts and opts.framework != "megatron":
        # the GPT graph builds experts only as Megatron-Core's MoELayer (hf_models.gpt2); elsewhere it would build the
        # dense MLP and predict a dense model without a word
        key = next(k for k in ("num_local_experts", "num_experts") if cfg.get(k))
        raise GraphError(f"{cfg.name}: field '{key}' ({cfg.n_experts}) on a GPT (model_type {cfg.model_type}) under "
                         f"--framework {opts.framework}: only --framework megatron builds a GPT's experts (Megatron-Core's "
                         f"MoE layer); drop the field for the dense GPT, or use --framework megatron")
    b.framework = opts.framework
    b.te_attention_backend = opts.te_attention_backend  # read by GraphBuilder.te_attention_output (megatron)
    # Megatron-Core's fused cross-entropy, read by hf_blocks.lm_head_and_loss (the fp32 loss of the megatron graphs)
    b.ce_fusion = opts.cross_entropy_fusion_impl if opts.cross_entropy_loss_fusion else None
    if (opts.framework == "megatron" and cfg.family in (*_MEGATRON_LLAMA_FAMILIES, "deepseek")
            and str(cfg.activation).lower() not in ("silu", "swish", "gelu")):  # (gelu: the default when not given)
        raise GraphError(f"{cfg.name}: hidden_act {cfg.activation!r} under --framework megatron: Megatron-Core's --swiglu "
                         f"MLPs gate with SiLU (hidden_act silu); this config's activation is not one")
    if opts.mtp_layers and not (opts.framework == "megatron" and cfg.family == "deepseek"):
        raise GraphError(f"--mtp-num-layers {opts.mtp_layers}: multi-token prediction is built for DeepSeek-V2/V3 configs "
                         f"under --framework megatron (Megatron-Core's MultiTokenPredictionBlock), not {cfg.model_type} "
                         f"under {opts.framework}")
    if opts.blocks:
        if cfg.total_layers != cfg.n_layers:
            raise GraphError(f"{cfg.name}: an encoder-decoder model cannot be built with fewer blocks")
        cfg = replace(cfg, n_layers=min(int(opts.blocks), cfg.n_layers))
    # learned position tables end at max_positions (MPTModel.forward refuses longer inputs even with ALiBi)
    if opts.seq * opts.cp > cfg.max_positions > 0 and cfg.family in ("gpt2", "opt", "bert", "mpt"):
        limit = f"max_seq_len {cfg.max_positions}" if cfg.family == "mpt" else f"{cfg.max_positions} learned positions"
        raise GraphError(f"{cfg.name}: seq {opts.seq * opts.cp} exceeds the model's {limit}")
    # rotary positions run beyond the table: predicted, with a warning in meta["warnings"] (printed by the CLI)
    # with a KV cache the new tokens sit at positions kv_context .. kv_context + seq - 1
    # what the config asks for that the graph does not model (a Qwen-MoE window, ...): predicted, with a warning
    warnings = model_warnings(cfg, opts.seq * opts.cp + (opts.kv_context or 0))
    if opts.framework == "megatron" and cfg.family in _MEGATRON_LLAMA_FAMILIES:
        from wattcast.featurize.hf_models import llama_megatron

        llama_megatron(cfg, b, opts.batch, opts.seq, impl=opts.attention)
    elif opts.framework == "megatron" and cfg.family == "deepseek":
        from wattcast.featurize.hf_models import deepseek

        deepseek(cfg, b, opts.batch, opts.seq, impl=opts.attention, megatron=True, mtp_layers=opts.mtp_layers)
    else:
        GENERATORS[cfg.family](cfg, b, opts.batch, opts.seq, impl=opts.attention)
    if (opts.moe_load != 1.0 or opts.moe_pad_to_capacity) and not b.routed_moe:
        raise GraphError(f"{cfg.name}: the MoE routing load applies to Mixtral/Qwen-MoE/DeepSeek-style MoE layers (routed by "
                         f"top-k with permuted tokens); this model has none")
    n_layers = cfg.total_layers
    return b.build(name=cfg.name, model_type=cfg.model_type, family=cfg.family, n_layers=n_layers, batch=opts.batch,
                   seq=opts.seq, tokens=opts.batch * opts.seq, attention=opts.attention, source="hf_config",
                   hidden=cfg.hidden, vocab=cfg.vocab, **({"warnings": warnings} if warnings else {}),
                   logits=opts.logits,
                   **({"kv_context": opts.kv_context, "kv_cache_bytes": float(b.kv_cache_bytes),
                       "kv_bytes_per_token": float(b.kv_cache_bytes) / (opts.batch * (opts.kv_context + opts.seq))}
                      if opts.kv_context is not None else {}),
                   **({"moe_load": float(opts.moe_load)} if opts.moe_load != 1.0 else {}),
                   **({"moe_pad_to_capacity": True} if opts.moe_pad_to_capacity else {}),
                   **({"moe_kernels": "vllm_fused"} if opts.fused_moe and b.fused_moe_built else {}),
                   **({"precision": "fp8", "fp8_recipe": "Transformer Engine: linear-layer GEMMs in FP8 (E4M3/E5M2) with "
                      "cast kernels, attention, norms, embedding and output layer in bf16, fp32 master weights",
                      "fp8_scaling": b.fp8_recipe, "fp8_transpose": bool(b.fp8_transpose)} if fp8 else {}))


#: the families whose attention takes a KV cache (those built by hf_models._llama_attention: Llama, Mistral, Qwen2/3,
#: Gemma 1-3, Phi-3, Mixtral, Qwen-MoE, gpt-oss)
KV_CACHE_FAMILIES = ("llama", "gemma", "qwen3", "phi3", "gemma2", "gemma3", "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")


def _check_kv_cache(cfg: HFConfig, opts: StepOptions) -> None:
    """GraphError when a KV-cached step (``kv_context``) is asked of a model or framework it is not built for."""
    if opts.kv_context is None:
        return
    if cfg.family not in KV_CACHE_FAMILIES:
        extra = (" (DeepSeek's multi-latent attention caches a compressed latent and decodes with absorbed "
                 "projections: not modelled)" if cfg.family == "deepseek" else "")
        raise GraphError(f"{cfg.name}: kv_context (a KV-cached inference step) is built for Llama-architecture decoders "
                         f"({', '.join(KV_CACHE_FAMILIES)}), not {cfg.model_type}{extra}")
    if opts.framework != "hf" or opts.cp != 1 or opts.ep != 1 or opts.sp or opts.blocks:
        raise GraphError("kv_context (a KV-cached inference step) is built for one device, or one node's tensor-parallel "
                         "group (tp), under --framework hf")


@rows_cached(max_entries=256)
def cached_path_graph(path: str, mtime: float, opts: StepOptions) -> OpGraph:
    return _build(path, opts, forward_key=(path, mtime))


#: the forward graphs the last training graphs of a file or built-in name were built from, by (path, modification
#: time, the step options less ``recompute``): recomputation is :func:`training_graph`'s alone (the forward builders
#: never read it), so a strategy search's rank graphs with and without full recomputation (the same group key but
#: ``recompute``; planning.search evaluates such siblings one after the other) share one forward build, the larger
#: half of a DeepSeek-V3 rank graph's build. Few entries and rows (the newest always stays): only a sibling built
#: next needs it; :func:`training_graph` reads the forward graph and never changes it (frames are copied or concatenated).
FORWARD_CACHE_ROWS = 250_000
_FORWARDS = RowsCache(max_rows=FORWARD_CACHE_ROWS, max_entries=2)


def _clear_path_graphs() -> None:
    """``cached_path_graph.cache_clear()``: the path graphs and the forward graphs they were built from (a cleared cache
    builds cold)."""
    cached_path_graph.cache.clear()
    _FORWARDS.clear()


cached_path_graph.cache_clear = _clear_path_graphs


def _onnx_forward(path, opts: StepOptions) -> OpGraph:
    """An ONNX file's forward graph. Options the user gave that the file's fixed input dims cannot take are an
    error (a step at another batch or length would be a silently wrong number); the defaults only bind
    symbolic dims."""
    from wattcast.featurize.onnx import graph_from_onnx

    d = opts.with_default_shape()
    trips = dict(opts.loop_trip_count) if isinstance(opts.loop_trip_count, tuple) else opts.loop_trip_count
    fwd = graph_from_onnx(path, batch=d.batch, seq=d.seq, dtype=opts.dtype, train=opts.mode == "train", dims=dict(opts.dims) or None,
                          loop_trip_count=trips)
    ignored = {o.split("=")[0] for o in fwd.meta.get("ignored_options", ())}
    # a batch / sequence axis with a name not read as one, bound by --dim: the option contradicts that value
    for o, p in (fwd.meta.get("options_bound_by_dims") or {}).items():
        if o in ignored and getattr(opts, o) is not None:
            raise GraphError(f"{fwd.meta.get('name')}: {o} {getattr(opts, o)} contradicts --dim {p}={fwd.meta['dims'][p]}: "
                             f"the symbolic dim {p!r} is the file's {'batch' if o == 'batch' else 'sequence'} axis; "
                             f"give its size once, with --dim {p}=...")
    given = [o for o in ("batch", "seq") if o in ignored and getattr(opts, o) is not None]
    if given:
        raise GraphError(onnx_dims_refusal(fwd.meta, {o: getattr(opts, o) for o in given}))
    bound = set(fwd.meta.get("dims") or ())
    unknown = [k for k, _ in opts.dims if k not in bound and ":" not in k]
    if unknown:
        raise GraphError(f"{fwd.meta.get('name')}: no symbolic input dim named {', '.join(unknown)}"
                         + (f" (its symbolic dims: {', '.join(sorted(bound))})" if bound else " (its input dims are fixed)"))
    return fwd


def onnx_dims_refusal(meta: dict, given: dict[str, int]) -> str:
    """Why an ONNX file cannot take the batch / seq ``given`` (options its input dims do not bind), per axis: a dim the
    file fixes (its value; re-export with dynamic axes, or give that value), or an axis the model has not (an MLP's
    or an image model's input has no sequence axis: leave seq out, re-exporting cannot help). Until stop 54 every
    case said "the input dims are fixed (batch 16)", the 16 being the user's own batch bound to a symbolic axis,
    and advised a re-export with dynamic axes that cannot give an MLP a sequence."""
    name = meta.get("name")
    axes = meta.get("input_axes") or {}
    first = meta.get("first_input") or "?"
    parts = []
    fixed = [o for o in given if axes.get(o) == "fixed" or (o not in axes and meta.get(o) is not None)]
    if fixed:
        # the dims the file fixes (a symbolic batch bound to the user's value is not one of them)
        held = [o for o in ("batch", "seq") if axes.get(o) == "fixed" and meta.get(o) is not None] \
            or [o for o in fixed if meta.get(o) is not None]
        what = ("input dims are" if all(axes.get(o) in ("fixed", None) for o in ("batch", "seq")) or not axes
                else f"{' and '.join(held)} dim{'s are' if len(held) > 1 else ' is'}")
        own = ", ".join(f"{o} {meta[o]}" for o in held)
        parts.append(f"the ONNX file's {what} fixed" + (f" ({own})" if own else "")
                     + f", so {' and '.join(f'{o} {given[o]}' for o in fixed)} cannot be applied (first input "
                     f"{first}); re-export it with dynamic axes (torch.onnx.export(..., dynamic_shapes=...)) or give "
                     "the shapes it was exported with")
    missing = [o for o in given if o not in fixed]
    for o in missing:
        what = "sequence" if o == "seq" else "batch"
        parts.append(f"the model has no {what} axis (first input {first}"
                     + ("; a sequence axis is dim 1 of (batch, seq) token ids or (batch, seq, hidden) activations, "
                        "dim 2 of a 1-D convolution's (batch, channels, length) input" if o == "seq" else "")
                     + f"), so {o} {given[o]} cannot be applied: leave {o} (--{o}) out"
                     + (" (or give 1: one position per sample)" if o == "seq" else ""))
    return f"{name}: " + "; ".join(parts)


def _build(model: Any, opts: StepOptions, example_inputs: tuple | None = None, forward_key: tuple | None = None) -> OpGraph:
    """The step graph of ``model`` under ``opts``. ``forward_key``: what names the model file's contents (path and
    modification time, :func:`cached_path_graph`'s): the forward graph of a training step is then kept in
    :data:`_FORWARDS` and reused by a step that differs only in its recomputation."""
    is_onnx = is_onnx_path(model)
    if (forward_key is not None and opts.mode == "train" and not is_onnx and example_inputs is None
            and isinstance(model, (str, Path))):
        fkey = (forward_key, replace(opts, recompute="none"))
        fwd = _FORWARDS.get(fkey)
        if fwd is None:
            fwd = _FORWARDS.put(fkey, _build_forward_and_step(model, fkey[1], forward_only=True))
        return _training_of(fwd, opts)
    return _build_forward_and_step(model, opts, example_inputs)


def _training_of(fwd: OpGraph, opts: StepOptions) -> OpGraph:
    return training_graph(fwd, optimizer=opts.optimizer, recompute=opts.recompute, grad_accumulation=opts.grad_accumulation,
                          optimizer_impl=optimizer_impl_key(opts.optimizer_impl, opts.framework, opts.optimizer),
                          framework=opts.framework)


def _build_forward_and_step(model: Any, opts: StepOptions, example_inputs: tuple | None = None,
                            forward_only: bool = False) -> OpGraph:
    is_onnx = is_onnx_path(model)
    if (opts.tp > 1 or opts.ep > 1) and not (isinstance(model, dict) or (isinstance(model, (str, Path)) and not is_onnx)):
        raise GraphError("tensor and expert parallelism need a model from a Hugging Face config or a built-in name "
                         "(ONNX and torch.export graphs carry no column/row-parallel structure); use --dp/--pp/--zero")
    if opts.blocks and not (isinstance(model, dict) or (isinstance(model, (str, Path)) and not is_onnx)):
        raise GraphError("building fewer blocks needs a model from a Hugging Face config or a built-in name")
    if opts.dtype == "fp8" and not (isinstance(model, dict) or (isinstance(model, (str, Path)) and not is_onnx)):
        raise GraphError("--dtype fp8 is Transformer Engine's recipe over a model's linear layers: it needs a Hugging Face "
                         "config or a built-in name (an ONNX or torch.export graph does not say which ops TE would run in "
                         "FP8); use --dtype bf16")
    if opts.kv_context is not None and not (isinstance(model, dict) or (isinstance(model, (str, Path)) and not is_onnx)):
        raise GraphError("kv_context (a KV-cached inference step) needs a Hugging Face config or a built-in name: an ONNX "
                         "or torch.export graph carries no cache structure (an ONNX decoder with past inputs binds them "
                         "with --dim)")
    if opts.dims and not is_onnx:
        raise GraphError("named input dims (--dim) apply to ONNX models; a config or module takes --batch and --seq")
    if opts.loop_trip_count is not None and not is_onnx:
        raise GraphError("loop_trip_count (--loop-trip-count) applies to ONNX models with Loop nodes")
    if not is_onnx and not isinstance(model, (str, Path, dict)) and _is_exported_program(model):
        # a torch.export program runs as the module it unlifts to, on the inputs it was exported with, reshaped to the
        # batch / seq given where its dynamic dims allow (exported_program_inputs); its own shapes are then what the
        # graph's meta (hence settings and tokens_per_s) reports, not the 1 x 1,024 default of a module
        if example_inputs is None:
            example_inputs = exported_program_inputs(model, opts.batch, opts.seq)
            # (a program that kept no example inputs: token ids of (batch, seq), as a module gets them)
            opts = replace(opts, batch=None, seq=None) if example_inputs is not None else opts.with_default_shape()
        model = model.module()
    elif not is_onnx and example_inputs is None:
        opts = opts.with_default_shape()
    if isinstance(model, dict):
        fwd = _hf_forward(load_hf_config(model), opts)
    elif is_onnx:
        fwd = _onnx_forward(model, opts)
    elif isinstance(model, (str, Path)):
        fwd = _hf_forward(load_hf_config(model), opts)
    else:
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is an optional extra
            raise GraphError("a PyTorch module needs torch installed (pip install 'wattcast[train]')") from None
        if not isinstance(model, torch.nn.Module):
            raise GraphError(f"cannot build a graph from a {type(model).__name__}; pass an ONNX file, a config.json, "
                             "a built-in model name, a config dict, a torch.nn.Module or a torch.export.ExportedProgram")
        from wattcast.featurize.torch_import import graph_from_module

        fwd = graph_from_module(model, example_inputs, batch=opts.batch, seq=opts.seq, dtype=opts.dtype,
                                train=opts.mode == "train", attention=opts.attention,
                                flash_kernel=opts.flash_kernel)
    if opts.compile:
        from wattcast.featurize.fusion import fuse_elementwise

        fwd = fuse_elementwise(fwd)
    meta = dict(fwd.meta, mode=opts.mode, compile=opts.compile, attention=opts.attention,
                **({"flash_kernel": opts.flash_kernel} if opts.attention == "flash" else {}))
    fwd = OpGraph(fwd.nodes, fwd.edges, meta, fwd.saved)
    if opts.mode == "train" and not forward_only:
        return _training_of(fwd, opts)
    return fwd


def _is_exported_program(model: Any) -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is an optional extra
        return False
    return isinstance(model, torch.export.ExportedProgram)


def exported_program_inputs(ep: Any, batch: int | None, seq: int | None) -> tuple | None:
    """The positional inputs to cost a ``torch.export.ExportedProgram`` on: those it was exported with, with ``batch``
    (the first input's dim 0) and ``seq`` (dim 1 of a first input of token ids, integer (batch, seq)) applied where
    they are given. A dim given a value must be dynamic in the export (a ``torch.export.Dim``, within its range: the
    program's ``range_constraints``) or already that value; every input dim of the same symbol takes it. Anything
    else is a GraphError naming the dim and what the export allows: a program traced at 2 x 128 costs 2 x 128, and
    until stop 54 ``batch=8, seq=512`` were reported beside that step (settings, tokens_per_s) without being applied."""
    import torch

    args, kwargs = ep.example_inputs or ((), {})
    if kwargs:
        raise GraphError("this ExportedProgram was exported with keyword inputs: pass "
                         "wattcast.predict(ep.module(), ..., example_inputs=(...)) with positional ones")
    args = tuple(args)
    if not args:
        return None  # no example inputs kept: the caller gives the module token ids of (batch, seq)
    if batch is None and seq is None:
        return args
    redo = ("re-export it with torch.export.export(..., dynamic_shapes=...) giving that dim a torch.export.Dim, pass "
            "wattcast.predict(ep.module(), ..., example_inputs=(...)) at the shapes to cost, or give the shapes it was "
            "exported with")
    if not all(isinstance(a, torch.Tensor) for a in args):
        raise GraphError("batch/seq apply to an ExportedProgram whose positional inputs are tensors; pass "
                         "wattcast.predict(ep.module(), ..., example_inputs=(...)) at the shapes to cost")
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    vals = [placeholders[u].meta.get("val") for u in ep.graph_signature.user_inputs if u in placeholders]
    if len(vals) != len(args) or any(v is None for v in vals):
        raise GraphError("cannot tell this ExportedProgram's input dims apart (its user inputs do not match its "
                         f"example inputs); {redo}")
    first = vals[0]
    token_ids = len(first.shape) == 2 and not first.dtype.is_floating_point
    shape = "x".join(str(int(d)) for d in args[0].shape)
    subs: dict = {}
    for option, axis, value in (("batch", 0, batch), ("seq", 1, seq)):
        if value is None:
            continue
        if option == "seq" and not token_ids:
            raise GraphError(f"seq {value}: this ExportedProgram's first input is a {args[0].dtype} tensor of shape "
                             f"{shape}, not token ids (batch, seq), so it has no sequence axis to apply seq to; pass "
                             "wattcast.predict(ep.module(), ..., example_inputs=(...)) at the shapes to cost")
        if len(first.shape) <= axis:
            raise GraphError(f"{option} {value}: this ExportedProgram's first input (shape {shape}) has no dim {axis}")
        d = first.shape[axis]
        if not isinstance(d, torch.SymInt):
            if int(d) != int(value):
                raise GraphError(f"this ExportedProgram's {option} dim (dim {axis} of its first input, shape {shape}) is "
                                 f"fixed at {int(d)}, so {option} {value} cannot be applied; {redo}")
            continue
        expr = d.node.expr
        if not expr.is_Symbol:
            raise GraphError(f"this ExportedProgram's {option} dim (dim {axis} of its first input) is {expr}, derived "
                             f"from other dims, so {option} {value} cannot be applied to it; {redo}")
        rng = ep.range_constraints.get(expr)
        lo, hi = (rng.lower, rng.upper) if rng is not None else (None, None)
        if (lo is not None and lo.is_finite and value < int(lo)) or (hi is not None and hi.is_finite and value > int(hi)):
            raise GraphError(f"{option} {value} is outside the range this ExportedProgram's {option} dim was exported "
                             f"with ({int(lo) if lo.is_finite else '-inf'}..{int(hi) if hi.is_finite else 'inf'}); "
                             f"{redo}")
        subs[expr] = int(value)
    out = []
    for a, v in zip(args, vals):
        dims = []
        for given, d in zip(a.shape, v.shape):
            if isinstance(d, torch.SymInt):
                e = d.node.expr.subs(subs)
                dims.append(int(e) if e.is_number else int(given))
            else:
                dims.append(int(given))
        out.append(torch.empty(dims, dtype=a.dtype, device="meta"))
    return tuple(out)


@rows_cached(max_entries=64)
def _cached_dict_graph(config_json: str, opts: StepOptions) -> OpGraph:
    return _build(json.loads(config_json), opts)


def _locate_model_file(model: str | Path) -> tuple[str, float]:
    """(real path, modification time) of a model file or a Hugging Face folder's config.json; (the name, 0) for a
    built-in name; (the Hub id, its cached config's modification time) for a Hub id in the local Hub cache (the id
    is kept so the graph is named after the model, not the snapshot hash)."""
    p = Path(model)
    if p.is_file():
        return str(p.resolve()), p.stat().st_mtime
    if is_onnx_path(model):
        return str(model), 0.0  # a missing ONNX file: the importer names it
    found = locate_model_config(model)
    if found is None or found[2] == "builtin":
        return str(model), 0.0  # a built-in name, or an unknown one (load_hf_config names it)
    config, _, kind = found
    return (str(config.resolve()) if kind == "folder" else str(model)), config.stat().st_mtime


def step_graph(model: Any, opts: StepOptions | None = None, example_inputs: tuple | None = None, **kw) -> OpGraph:
    """The operator graph of one step of ``model`` (cached for files, built-in names and JSON-able config dicts).
    ``example_inputs``: the positional inputs of a ``torch.nn.Module``'s forward (default: token ids of shape
    (batch, seq)); only shapes and dtypes are used."""
    opts = replace(opts or StepOptions(), **kw).validated()
    # the graph does not depend on cuDNN's TF32 switch (the costing reads it from meta): built, and cached, once for both
    g = _step_graph(model, replace(opts, cudnn_tf32=True), example_inputs)
    if opts.cudnn_tf32:
        return g
    # cuDNN's TF32 off: the graph says so (its meta), one graph object per built graph (the cost caches key on it)
    return _NO_CUDNN_TF32.get_or_build(g, (g.nodes, g.meta), lambda: replace(g, meta=dict(g.meta, cudnn_tf32=False)))


#: per step graph: the same graph with ``meta["cudnn_tf32"]`` False (StepOptions.cudnn_tf32)
_NO_CUDNN_TF32 = GraphMemo(max_entries=64)


def _step_graph(model: Any, opts: StepOptions, example_inputs: tuple | None) -> OpGraph:
    if example_inputs is not None:
        if isinstance(model, (str, Path, dict)):
            raise GraphError("example_inputs apply to a torch.nn.Module; a config or ONNX file has its own inputs")
        if opts.batch is not None or opts.seq is not None:
            raise GraphError("give example_inputs or batch/seq (token ids of shape (batch, seq)), not both")
        return _build(model, opts, tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,))
    if isinstance(model, (str, Path)):
        return cached_path_graph(*pinned(("graph", str(model)), lambda: _locate_model_file(model)), opts)
    if isinstance(model, dict):
        try:
            key = json.dumps(model, sort_keys=True)
        except (TypeError, ValueError):  # not plain JSON: build it every time
            return _build(model, opts)
        return _cached_dict_graph(key, opts)
    return _build(model, opts)
