"""Derive a training step (forward, backward, optimizer) from any importer's forward graph.

Backward kernels come from the rules each :class:`~wattcast.featurize.op_graph.GraphBuilder` method
attached to its forward node (a GEMM gives two GEMMs, a LayerNorm its backward and weight-gradient
reduction, softmax its backward, ...), emitted in reverse topological order. Recomputation re-runs forward
kernels inside backward: ``full`` the whole block (layer) before its backward, ``selective`` only the
attention core (QK^T, mask, softmax, dropout, PV; Korthikanti et al. 2022). The optimizer step is
memory-bound and costed per layer from the bytes it moves per parameter (:data:`OPTIMIZER_BYTES_PER_PARAM`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from wattcast.featurize.fp8_recipes import CURRENT_SCALE_KERNEL_BYTES, DEFAULT_FP8_RECIPE, weight_copy_bytes_per_param
from wattcast.featurize.op_graph import NODE_COLUMNS, SHAPE_COLUMNS, TF32_CLASSES, GraphError, OpGraph, _frame_of_rows
from wattcast.featurize.recompute import (MODULE_TAGS, RecomputeError, module_layers_end, node_tags, parse_recompute,
                                         recompute_setting, recompute_tags, storage_rerun_tags)

#: ``adamw-bf16``: AdamW with its two moments held in bf16 (Megatron-Core's precision-aware optimizer,
#: ``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``: Transformer Engine's FusedAdam
#: computing in fp32 and storing the moments in bf16; DeepSeek-V3's AdamW, tech report Sec. 3.3.2); fp32 master weights
#: ``muon``: Muon (Keller Jordan 2024; Liu et al. 2025, arXiv:2502.16982) on the transformer blocks' 2-D linear weights,
#: AdamW on every other parameter (embeddings, output layer, norms, biases), as Megatron-Core 0.16.1 splits them
#: (megatron/core/optimizer/muon.py l. 251-258) and torch.optim.Muon's documentation asks (torch 2.13 optim/_muon.py
#: l. 262-263, 278-291): :func:`muon_matrices`, :func:`muon_rows`
OPTIMIZERS = ("adamw", "adam", "adamw-bf16", "sgd", "muon", "none")

#: bytes read + written per parameter by one optimizer step, run as ONE fused kernel pass (the "fused" implementation:
#: torch.optim.AdamW(fused=True), ``_fused_adamw_``; apex / Transformer Engine FusedAdam, Megatron-Core's optimizer,
#: megatron-core 0.16.1 megatron/core/optimizer/__init__.py l. 13 and 19; DeepSpeed's FusedAdam, which
#: Megatron-DeepSpeed runs; Hugging Face Trainer's default ``adamw_torch_fused`` with torch >= 2.8, transformers 5.24.0
#: training_args.py l. 806-811, trainer_optimizer.py l. 206-207).
#: fp32 AdamW reads param, grad, exp_avg, exp_avg_sq and writes param, exp_avg, exp_avg_sq: 7 x 4 B.
#: Mixed precision (fp16/bf16 params) keeps fp32 master weights: it also reads the 2-byte grad and
#: writes the 2-byte param copy: 7 x 4 + 2 + 2 B. bf16 moments read and write 2 B each instead of 4 (-8 B).
#: SGD without momentum (torch default): p, g -> p.
OPTIMIZER_BYTES_PER_PARAM = {
    ("adamw", False): 28, ("adamw", True): 32,
    ("adamw-bf16", False): 20, ("adamw-bf16", True): 24,
    ("sgd", False): 12, ("sgd", True): 16,
}
#: the optimizer step's kernel implementations (StepOptions.optimizer_impl): "fused" (one pass, above) or "foreach"
#: (PyTorch's multi-tensor path, the default of torch.optim.Adam/AdamW when neither fused nor foreach is given:
#: torch 2.13 optim/adam.py l. 937-939 calls ``_default_to_fused_or_foreach(..., use_fused=False)``)
OPTIMIZER_IMPLS = ("fused", "foreach")
#: each framework's default implementation: every framework wattcast models runs a fused AdamW (hf: transformers >=
#: 5.x with torch >= 2.8 defaults to adamw_torch_fused; megatron: TE/apex FusedAdam; megatron-deepspeed: DeepSpeed's
#: or apex's FusedAdam). llm-foundry (Composer's DecoupledAdamW, a per-tensor loop) is costed as "foreach"
#: by its validation (validation/mpt_validation.py)
FRAMEWORK_OPTIMIZER_IMPL = {"hf": "fused", "megatron": "fused", "megatron-deepspeed": "fused"}
#: "foreach" AdamW: torch 2.13 ``_multi_tensor_adam`` (optim/adam.py), decoupled weight decay on (torch.optim.AdamW's
#: default weight_decay=1e-2, optim/adamw.py), capturable off, one kernel launch per ``torch._foreach_*`` call over the
#: fp32 state (the step counters are CPU tensors, l. 166 and 680-683: no GPU pass):
#:   l. 691 ``_foreach_mul_(params)``               read p, write p          8 B
#:   l. 704 ``_foreach_lerp_(exp_avgs, grads)``      read m, g, write m      12 B
#:   l. 708 ``_foreach_mul_(exp_avg_sqs, beta2)``    read v, write v          8 B
#:   l. 721 ``_foreach_addcmul_(exp_avg_sqs, g, g)`` read v, g, write v      12 B (g passed twice, read once from DRAM)
#:   l. 790 ``_foreach_sqrt(exp_avg_sqs)``           read v, write tmp        8 B
#:   l. 792 ``_foreach_div_(tmp, bc2_sqrt)``         read tmp, write tmp      8 B
#:   l. 793 ``_foreach_add_(tmp, eps)``              read tmp, write tmp      8 B
#:   l. 794 ``_foreach_addcdiv_(params, m, tmp)``    read p, m, tmp, write p 16 B
#: = 80 B (8 passes) against the fused kernel's 28. Composer's DecoupledAdamW (llm-foundry's ``decoupled_adamw``;
#: mosaicml 0.32.1 composer/optim/decoupled_weight_decay.py l. 283-295, weight decay 0 as llm-foundry's MPT recipes
#: set it) moves the same 80 B per parameter: mul_ + add_ (8 + 12), mul_ + addcmul_ (8 + 12), sqrt, div, add_
#: (8 + 8 + 8), addcdiv_ (16). Mixed precision adds the same 2 + 2 B as the fused step. SGD without momentum is one
#: pass either way (``_foreach_add_(params, grads)``); bf16 moments are Transformer Engine's FusedAdam only.
#: ``--optimizer adam`` is costed as AdamW (optimizer_key): torch.optim.Adam at its default weight_decay 0 skips l. 691's
#: pass (72 B foreach, 8 B over-counted); the fused step's one pass is the same either way.
FOREACH_OPTIMIZER_BYTES_PER_PARAM = {("adamw", False): 80, ("adamw", True): 84, ("sgd", False): 12, ("sgd", True): 16}
#: FLOPs per parameter of one step (AdamW: moments, bias correction, sqrt, division, decay, update)
OPTIMIZER_FLOPS_PER_PARAM = {"adamw": 14, "adamw-bf16": 14, "sgd": 2}
#: bytes per parameter of the optimizer's states (Adam's two moments; SGD without momentum keeps none)
OPTIMIZER_STATE_BYTES_PER_PARAM = {"adamw": 8, "adamw-bf16": 4, "sgd": 0, "none": 0}
#: Muon keeps one fp32 momentum buffer per Muon parameter, no second moment: Megatron-Core 0.16.1 muon.py l. 208-212
#: (``momentum_buffer = torch.zeros_like(p.data)`` of the fp32 main parameter its Float16OptimizerWithFloat16Params
#: steps, l. 300-303), torch 2.13 optim/_muon.py l. 156-159 (``zeros_like(p.grad)``); its AdamW parameters keep the
#: two moments (Megatron-Core muon.py l. 214-220): :func:`optimizer_state_bytes` mixes them by the Muon share
MUON_STATE_BYTES_PER_PARAM = 4
#: Newton-Schulz iterations per step: Megatron-Core 0.16.1 optimizer_config.py l. 275 (muon_num_ns_steps = 5), torch 2.13
#: optim/_muon.py l. 28 (DEFAULT_NS_STEPS = 5); each runs A = X X^T, B = bA + cAA, X = aX + BX on the (m, n) matrix with
#: m <= n (transposed otherwise): _muon.py l. 56-66 (Keller Jordan's reference muon.py, quintic coefficients l. 25-27)
MUON_NS_STEPS = 5
#: the GEMM dtype of the Newton-Schulz iteration per framework. Megatron-Core runs it on the fp32 momentum under
#: ``fp32_matmul_prec="medium"`` (optimizer_config.py l. 272; muon.py l. 56, 106): torch's
#: ``set_float32_matmul_precision("medium")`` makes CUDA fp32 matmuls TensorFloat32 (torch 2.13 __init__.py l. 1669-1675:
#: "If 'high' or 'medium' are set then the TensorFloat32 datatype will be used", i.e. allow_tf32; cuBLAS has no bf16
#: mode for it), so tf32. torch.optim.Muon (hf) casts to bf16 first (_muon.py l. 55: ``grad.bfloat16()``)
MUON_NS_DTYPE = {"megatron": "tf32", "hf": "bf16"}
#: bytes per Muon parameter of the step's elementwise passes over the fp32 state (mixed precision adds the 2 + 2 B of
#: the bf16 gradient read and parameter copy, as :data:`OPTIMIZER_BYTES_PER_PARAM` does for AdamW).
#: hf, torch.optim.Muon (torch 2.13 optim/_muon.py, nesterov on by default, l. 93): l. 333 ``buf.lerp_(grad)`` 12 B,
#: l. 334 ``grad.lerp(buf)`` (Nesterov) 12, l. 55 ``.bfloat16()`` read 4 write 2 = 6, l. 59 ``norm`` + ``div_`` on bf16
#: 2 + 4 = 6, l. 340 ``param.mul_`` (decay) 8, l. 341 ``param.add_(update)`` read 4 + 2, write 4 = 10: 54 B.
#: megatron (emerging_optimizers' OrthogonalizedOptimizer, not installable here: the passes are the algorithm's as
#: Megatron-Core configures it, not read from its source): decoupled weight decay (muon.py l. 51-52, 98) 8 B, the
#: momentum update (no Nesterov: optimizer_config.py l. 266) 12, the normalisation before Newton-Schulz (norm + div
#: on fp32) 12, the scale ``orth_grad * scale_factor * extra_scale_factor`` (muon.py l. 90: two passes) 16, the update
#: ``p.add_`` 12: 60 B
MUON_UPDATE_BYTES_PER_PARAM = {("hf", False): 54, ("hf", True): 58, ("megatron", False): 60, ("megatron", True): 64}
#: FLOPs per Muon parameter of those passes (lerp 2, decay 1, norm 2, div 1, scale / update 2 each): about 10
MUON_UPDATE_FLOPS_PER_PARAM = 10
#: Gradient clipping before the step, at norm 1.0: the default of Hugging Face Trainer (max_grad_norm),
#: Megatron-LM (--clip-grad) and DeepSpeed (gradient_clipping in its examples). torch.nn.utils.clip_grad_norm_
#: reads every gradient for the norm (_foreach_norm) and multiplies them all by the clamped coefficient
#: (_foreach_mul_): 3 passes over fp32 gradients (mixed precision clips the fp32 main gradients).
CLIP_BYTES_PER_PARAM = 3 * 4
#: FP16 mixed precision scales the loss (dynamic loss scaling: torch.amp.GradScaler, Megatron's and DeepSpeed's fp16
#: optimizers) and unscales the gradients before the step, checking them for inf/NaN in the same pass
#: (_amp_foreach_non_finite_check_and_unscale_ / Megatron's _unscale_main_grads_and_check_for_nan): read and write
#: the fp32 gradients once. BF16 needs no loss scaling.
LOSS_SCALE_BYTES_PER_PARAM = 2 * 4
#: Frameworks whose fp16/bf16 steps run PyTorch AMP (``torch.autocast`` over fp32 parameters): the parameters'
#: gradients are fp32 (README "PyTorch AMP's fp32 gradients"; ``simulate.stage_memory.held_gradient_bytes``,
#: ``simulate.distributed._grad_bytes``), as the clip and loss-scale passes above read them. Megatron-LM and DeepSpeed
#: hold the model in its dtype, so ``param.grad`` is bf16/fp16 there (Megatron's fp32 ``main_grad`` is a buffer of its
#: own). An embedding's weight gradient under AMP: ``aten::embedding`` has no Autocast kernel (torch 2.13:
#: ``torch._C._dispatch_has_kernel_for_dispatch_key("aten::embedding", "AutocastCUDA")`` is False; the Autocast keys
#: fall through), so the lookup runs in its fp32 weight's dtype, the gradient reaching ``embedding_dense_backward`` is
#: fp32, and the op allocates its ``grad_weight`` from that gradient (the decomposition torch 2.13 ships,
#: ``torch/_decomp/decompositions.py`` l. 1411: ``grad_weight = grad_output.new_zeros((num_weights,) + ...)``). Run on
#: the wheel (CPU autocast, bf16, whose fallthrough is the same): embedding out fp32, linear out bf16,
#: ``embedding_dense_backward`` in and out fp32, ``weight.grad`` fp32.
AMP_FRAMEWORKS = ("hf",)
#: bytes of one gradient element under AMP
AMP_GRAD_BYTES = 4


def _embedding_grad_spec(spec: dict, framework: str, dtype: str) -> dict:
    """An embedding's backward rule (``GraphBuilder.embedding``) as the step runs it.

    ``{name}.grad_zero``, ``embedding_dense_backward``'s zero-filled ``grad_weight``, is ``at::zeros``: a fill kernel,
    ``aten::zero_`` -> ``aten::fill_`` -> ``vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>`` (the
    Kineto traces in ``../shared/datasets/traces``: ``v100_df_index_resolver`` 2,020 such launches under
    ``aten::zero_``, 40 under ``aten::new_zeros``; the traces' ``gpu_memset`` events are launched under ``aten::mm``,
    ``addmm``, ``sum``, ``convolution_backward`` and fbgemm's embedding op, none under a zero fill), so an
    ``elementwise`` kernel (its time counts with the model's elementwise kernels, not as a layout copy, ``memcpy``).
    Under PyTorch AMP (:data:`AMP_FRAMEWORKS`, fp16/bf16) ``grad_weight`` is fp32 (:data:`AMP_FRAMEWORKS`' note): the
    fill writes :data:`AMP_GRAD_BYTES` per element, and the scatter-add (``{name}.grad``, ``flops`` = the tokens x dim
    elements it adds into ``grad_weight``) writes them at that width too; it reads the incoming gradient at the
    graph's activation width as every backward row does.
    The graph is built without the parallel configuration, so ``hf`` at ZeRO-3 (PyTorch FSDP) is costed the same way
    although FSDP with a half-precision ``MixedPrecision.param_dtype`` computes the gradient in that dtype (Composer's
    DEFAULT and PURE modes both set it: mosaicml 0.32.1 ``composer/distributed/mosaic_parallelism.py`` l. 78-85): there
    the fill is over-counted by 2 B an element (llm-foundry's MPT rows of ``benchmarks/at_scale.py``: +0.7 ms median,
    at most +13.6 ms, of steps of seconds, 0.03% at most)."""
    name = str(spec.get("name", ""))
    amp = str(framework).lower() in AMP_FRAMEWORKS and dtype in ("fp16", "bf16")
    db = 2
    if name.endswith(".grad_zero"):
        spec = dict(spec, op_class="elementwise")
        if amp:
            spec.update(bytes=float(spec["bytes"]) * AMP_GRAD_BYTES / db, dtype="fp32")
    elif amp and name.endswith(".grad") and spec.get("op_class") == "embedding":
        spec = dict(spec, bytes=float(spec["bytes"]) + float(spec["flops"]) * (AMP_GRAD_BYTES - db))
    return spec


def optimizer_key(optimizer: str) -> str:
    o = str(optimizer).lower()
    if o not in OPTIMIZERS:
        raise GraphError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
    return "adamw" if o == "adam" else o


def optimizer_impl_key(impl: str | None, framework: str = "hf", optimizer: str = "adamw") -> str:
    """The optimizer step's implementation: ``impl`` checked (None: the framework's, :data:`FRAMEWORK_OPTIMIZER_IMPL`);
    GraphError for an unknown one, or for "foreach" with bf16 moments (Transformer Engine's FusedAdam only)."""
    if impl is None:
        return FRAMEWORK_OPTIMIZER_IMPL.get(str(framework).lower(), "fused")
    i = str(impl).lower()
    if i not in OPTIMIZER_IMPLS:
        raise GraphError(f"unknown optimizer implementation {impl!r}; use one of {', '.join(OPTIMIZER_IMPLS)}")
    if i == "foreach" and str(optimizer).lower() == "adamw-bf16":
        raise GraphError("optimizer adamw-bf16 (bf16 moments) is Transformer Engine's FusedAdam (Megatron-Core's "
                         "precision-aware optimizer): it has no foreach implementation; use --optimizer-impl fused")
    if i == "foreach" and str(optimizer).lower() == "muon":
        raise GraphError("optimizer muon: its AdamW part is costed as the framework runs it (fused: Transformer Engine's "
                         "FusedAdam under Megatron-Core, adamw_torch_fused under hf); --optimizer-impl foreach with "
                         "Muon is not modelled")
    return i


def optimizer_step_bytes(opt: str, mixed: bool, impl: str = "fused") -> int:
    """Bytes per parameter one optimizer step moves (:data:`OPTIMIZER_BYTES_PER_PARAM` fused,
    :data:`FOREACH_OPTIMIZER_BYTES_PER_PARAM` foreach)."""
    table = FOREACH_OPTIMIZER_BYTES_PER_PARAM if impl == "foreach" else OPTIMIZER_BYTES_PER_PARAM
    return table[(opt, bool(mixed))]


def optimizer_state_bytes(optimizer: str, muon_fraction: float | None = None) -> int | float | np.ndarray:
    """Bytes per parameter of ``optimizer``'s states (:func:`optimizer_key` names it; GraphError when unknown). Muon:
    ``muon_fraction`` of the parameters keep its one fp32 momentum (:data:`MUON_STATE_BYTES_PER_PARAM`), the rest
    AdamW's two moments; ``muon_fraction`` is required for it (the graph's ``meta["muon_param_count"]`` / its
    parameters)."""
    o = optimizer_key(optimizer)
    if o == "muon":
        if muon_fraction is None:
            raise GraphError("optimizer muon: the state bytes per parameter need the share of parameters Muon steps "
                             "(muon_fraction; a training graph's meta muon_param_count / param_count)")
        f = np.clip(np.asarray(muon_fraction, dtype=float), 0.0, 1.0)
        f = float(f) if f.ndim == 0 else f
        return MUON_STATE_BYTES_PER_PARAM * f + OPTIMIZER_STATE_BYTES_PER_PARAM["adamw"] * (1.0 - f)
    return OPTIMIZER_STATE_BYTES_PER_PARAM[o]


def muon_fraction(meta: dict) -> float | None:
    """The share of a training graph's parameters Muon steps (None when its optimizer is not Muon)."""
    if meta.get("optimizer") != "muon":
        return None
    total = float(meta.get("param_count") or 0.0)
    return float(meta.get("muon_param_count") or 0.0) / total if total > 0 else 0.0


def muon_framework(framework: str) -> str:
    """The Muon implementation a framework runs: Megatron-Core's TensorParallelMuon (megatron) or torch.optim.Muon
    (hf); GraphError for megatron-deepspeed (DeepSpeed's Muon is not modelled)."""
    fw = str(framework).lower()
    if fw not in MUON_NS_DTYPE:
        raise GraphError(f"optimizer muon is modelled as Megatron-Core 0.16.1 runs it (--framework megatron) and as "
                         f"torch.optim.Muon (--framework hf); not under {framework!r}")
    return fw


def muon_ns_flops(m, n, steps: int = MUON_NS_STEPS):
    """FLOPs of the Newton-Schulz iteration on one (m, n) matrix (either orientation: it runs on the (min, max) one):
    per step A = X X^T (2 m^2 n), B = bA + cAA (2 m^3), X = aX + BX (2 m^2 n), i.e. 5 x (4 m^2 n + 2 m^3) for 5
    steps (the additions inside torch.addmm are not counted)."""
    a, b = np.minimum(m, n), np.maximum(m, n)
    return steps * (4.0 * a * a * b + 2.0 * a ** 3)


def muon_matrices(fwd: OpGraph, framework: str = "megatron") -> pd.DataFrame:
    """The matrices Muon steps, one row per (node, split): ``layer``, ``rows``, ``cols`` (the rank's shard of the
    weight, out x in), ``count`` (matrices of that shape the node holds: a mixture of experts' held copies),
    ``params`` (their elements). Every linear node with a weight inside the transformer blocks (layers 0 .. n_layers-1;
    embeddings, the output layer, norms and biases go to AdamW: Megatron-Core muon.py l. 251-258). Megatron-Core
    splits the fused QKV weight into its query, key and value matrices before Newton-Schulz (``muon_split_qkv``
    default True, optimizer_config.py l. 263; muon.py l. 136-159), by the per-group shapes the graph's meta
    ``qkv_group_rows`` names."""
    n = fwd.nodes
    n_layers = int(fwd.meta.get("n_layers", 0)) or 1 << 30
    lay = n["layer"].to_numpy()
    sel = ((n["op_class"].to_numpy() == "linear") & (n["phase"].to_numpy() == "forward")
           & (n["param_count"].to_numpy() > 0) & (lay >= 0) & (lay < n_layers))
    sub = n[sel]
    cols = sub["N"].to_numpy(dtype=float)  # in features (the contraction dim of the forward GEMM)
    rows = sub["K"].to_numpy(dtype=float)  # out features on this rank
    bias = sub["kernel"].to_numpy() == "linear"  # GraphBuilder.linear: kernel "linear" with a bias, "bmm" without
    per = cols * rows + np.where(bias, rows, 0.0)
    count = np.maximum(np.round(sub["param_count"].to_numpy(dtype=float) / per), 0.0)
    out = pd.DataFrame({"layer": sub["layer"].to_numpy(dtype=np.int64), "rows": rows, "cols": cols, "count": count,
                        "name": sub["name"].to_numpy()})
    out = out[(out["count"] > 0) & (out["rows"] > 0) & (out["cols"] > 0)]
    split = fwd.meta.get("qkv_group_rows")
    if framework == "megatron" and split:
        g = float(sum(split))
        qkv = _is_qkv(out) & _qkv_splits(out["rows"], split)
        if qkv.any():
            parts = [out[~qkv]]
            for r in split:  # query, key, value: num_query_groups x their rows per group
                q = out[qkv].copy()
                q["rows"] = q["rows"] / g * float(r)
                parts.append(q)
            out = pd.concat(parts, ignore_index=True)
    out["params"] = out["rows"] * out["cols"] * out["count"]
    return out.reset_index(drop=True)


def _is_qkv(mats: pd.DataFrame) -> pd.Series:
    return mats["name"].astype(str).str.endswith("linear_qkv")


def _qkv_splits(rows: pd.Series, split) -> pd.Series:
    """Whether a linear_qkv shard of ``rows`` rows views as whole query groups of ``split`` rows each (Megatron-Core
    muon.py l. 143-148: ``grad.view(grad_shape[0] // sum(split), sum(split), -1)``)."""
    g = float(sum(split))
    return (rows % g == 0) & (rows >= g)


def muon_qkv_warning(fwd: OpGraph, framework: str) -> str | None:
    """The warning of a Megatron-Core Muon graph whose linear_qkv shard holds less than one query group (TP larger
    than the key/value groups: the groups replicated, one per rank, hf_models.llama_megatron's kv_gather), else None.
    Megatron-Core 0.16.1's QKV split (``muon_split_qkv``, default True, optimizer_config.py l. 263) then views the
    shard with 0 groups and fails (muon.py l. 143-148; torch raises "shape '[0, ...]' is invalid"); wattcast costs
    the shard as one matrix, as ``muon_split_qkv=False`` runs it."""
    split = fwd.meta.get("qkv_group_rows")
    if framework != "megatron" or not split:
        return None
    mats = muon_matrices(fwd, "hf")  # unsplit shapes
    qkv = mats[_is_qkv(mats)]
    bad = qkv[~_qkv_splits(qkv["rows"], split)]
    if not len(bad):
        return None
    return (f"--optimizer muon: linear_qkv's shard ({int(bad['rows'].iloc[0])} rows per TP rank) holds less than one "
            f"query group ({int(sum(split))} rows: TP larger than the key/value groups); Megatron-Core 0.16.1's Muon "
            f"QKV split (muon_split_qkv, default True) cannot view it and fails (optimizer/muon.py l. 143-148): costed "
            f"as one unsplit matrix, as muon_split_qkv=False runs it")


def muon_rows(mats: pd.DataFrame, lay: int, scope: str, framework: str, mixed: bool, dtype: str) -> list[dict]:
    """Optimizer-phase rows of Muon's step over one layer's matrices ``mats`` (:func:`muon_matrices`): per matrix
    shape the Newton-Schulz iteration's three GEMMs (``muon_newton_schulz.gram`` A = X X^T, ``.poly`` B = bA + cAA,
    ``.apply`` X = aX + BX; costed by the GEMM surrogate as ``bmm`` (B, M, N, K) with N the contraction, times the
    steps x matrices) and one ``muon_update`` row of the elementwise passes (bytes, :data:`MUON_UPDATE_BYTES_PER_PARAM`)."""
    ns_dtype = MUON_NS_DTYPE[framework]
    db = 4 if ns_dtype == "tf32" else 2
    out = []
    shapes = mats.assign(m=np.minimum(mats["rows"], mats["cols"]), n=np.maximum(mats["rows"], mats["cols"]))
    shapes = shapes.groupby(["m", "n"], sort=True)["count"].sum()
    for (m, n), c in shapes.items():
        reps = float(c) * MUON_NS_STEPS
        for part, (M, N, K) in (("gram", (m, n, m)), ("poly", (m, m, m)), ("apply", (m, m, n))):
            r = _opt_row(f"muon_newton_schulz.{part}[{lay}]", "muon_newton_schulz", lay, scope,
                         2.0 * M * N * K * reps, (M * N + N * K + M * K) * db * reps, ns_dtype, "optimizer")
            r.update(kernel="bmm", method="surrogate", dtype=ns_dtype, B=1.0, M=float(M), N=float(N), K=float(K),
                     scale=reps)
            out.append(r)
    p = float(mats["params"].sum())
    out.append(_opt_row(f"muon_update[{lay}]", "muon_update", lay, scope, MUON_UPDATE_FLOPS_PER_PARAM * p,
                        MUON_UPDATE_BYTES_PER_PARAM[(framework, bool(mixed))] * p, dtype, "optimizer"))
    return out


def _column_values(nodes: pd.DataFrame) -> dict[str, list]:
    """Each column's values as ``nodes.to_dict("records")`` holds them (Python scalars), one list per column: the
    records' values without building a dict per row (``Series.tolist`` gives the Python scalars ``itertuples`` does, NaN
    for a missing string; a frame with an object column, which ``to_dict`` would box, takes the records path)."""
    if any(dt == object for dt in nodes.dtypes):
        recs = nodes.to_dict("records")
        return {c: [r[c] for r in recs] for c in nodes.columns}
    return {c: nodes[c].tolist() for c in nodes.columns}


def _bw_row(spec: dict, layer: int, scope: str, tag: str, fwd_id: int, dtype: str, model_share: float = 1.0) -> dict:
    """A backward kernel's row; it counts in model FLOPs as its forward node does (``model_share``) unless its spec
    says otherwise."""
    row = dict(_BW_DEFAULTS, model_share=model_share)
    row.update(spec)
    dtype = spec.get("dtype") or dtype  # an FP8 recipe's GEMMs name their own dtype
    if dtype == "tf32" and spec.get("op_class") not in TF32_CLASSES:
        dtype = "fp32"  # TF32 is a matrix-product mode
    row.update(dtype=dtype, param_count=0, layer=layer, scope=scope, phase="backward",
               fwd_id=fwd_id, recompute=False, tag=tag)
    for c in _SHAPE_SET.intersection(spec):  # the defaults are NaN already
        row[c] = float(row[c]) if row[c] is not None else np.nan
    return row


#: a backward row before its rule's values: no shape, scale 1, no group
_BW_DEFAULTS = {**{c: np.nan for c in SHAPE_COLUMNS}, "scale": 1.0, "group": ""}
_SHAPE_SET = frozenset(SHAPE_COLUMNS)


def _check_modules(fwd: OpGraph, recompute: str) -> None:
    """A recompute module named explicitly must have ops in the model's layers (``mla_up_proj`` needs multi-head latent
    attention, ``moe`` a mixture of experts...). The attention core may have none: outside Megatron-Core a fused
    attention kernel is not checkpointed (it keeps no scores), and selective recomputation then re-runs nothing."""
    mods = [m for m in parse_recompute(recompute)[1] if m != "core_attn"]
    if not mods:
        return  # every training graph passes here: no walk of its tags without a module to look for
    n = fwd.nodes
    n_layers = int(fwd.meta.get("n_layers", 0)) or 1 << 30
    lay = n["layer"].to_numpy()
    present = set().union(*(node_tags(t) for t in n.loc[(lay >= 0) & (lay < n_layers), "tag"].unique()))
    missing = [m for m in mods if MODULE_TAGS[m] not in present]
    if missing:
        raise GraphError(f"recompute module(s) {', '.join(missing)}: this model has no such part in its layers "
                         f"(its graph tags ops of: {', '.join(m for m, t in MODULE_TAGS.items() if t in present) or 'none'})")


def training_graph(fwd: OpGraph, *, optimizer: str = "adamw", recompute: str = "none",
                   grad_accumulation: bool = False, clip_grad: bool = True, optimizer_impl: str = "fused",
                   framework: str = "hf") -> OpGraph:
    """Forward + backward (+ recomputation) + optimizer step of a forward graph.

    ``grad_accumulation`` adds the AccumulateGrad kernel per parameter (gradients summed into existing
    ``.grad`` tensors, as in gradient accumulation over micro-batches). ``clip_grad``: with an optimizer,
    clip the gradients' norm first (``CLIP_BYTES_PER_PARAM``). ``optimizer_impl``: the step's kernels, "fused" (one pass)
    or "foreach" (PyTorch's multi-tensor passes, :data:`FOREACH_OPTIMIZER_BYTES_PER_PARAM`); the step's kernel rows
    are named ``{optimizer}.step[layer]`` / ``{optimizer}.foreach_step[layer]``. ``optimizer="muon"``: Muon's rows
    (:func:`muon_rows`, as ``framework`` runs it: :func:`muon_framework`) over the layer's matrices and an
    ``adamw.step`` row over its other parameters. An embedding's weight gradient is zero-filled by a fill kernel and,
    under ``framework``'s PyTorch AMP in fp16/bf16, held in fp32 (:func:`_embedding_grad_spec`).
    """
    if "backward" not in fwd.saved:
        raise GraphError("graph has no backward rules (was it built by GraphBuilder?)")
    try:
        recompute = recompute_setting(recompute)
        rerun = set().union(*recompute_tags(recompute))  # the selective modules' tags
    except RecomputeError as e:
        raise GraphError(str(e)) from None
    _check_modules(fwd, recompute)
    opt = optimizer_key(optimizer)
    impl = optimizer_impl_key(optimizer_impl, optimizer=opt)
    muon = None
    if opt == "muon":
        muon_fw = muon_framework(framework)
        muon = muon_matrices(fwd, muon_fw)
        muon_by_layer = {int(k): v for k, v in muon.groupby("layer")} if len(muon) else {}
    # DeepSeek-V3's MoE SwiGLU outputs, re-made from their FP8-cached inputs (--fp8-recipe deepseek), with or without
    # a recompute setting; under full recomputation the whole layer re-runs anyway
    stored = storage_rerun_tags(fwd.meta, recompute)
    rerun |= stored
    nodes = fwd.nodes
    dtype = fwd.meta.get("dtype", "fp32")
    fwd_cols = _column_values(nodes)
    rules = fwd.saved["backward"]
    n_fwd = len(nodes)
    fwd_layer, fwd_scope, fwd_tag = fwd_cols["layer"], fwd_cols["scope"], fwd_cols["tag"]
    fwd_share = fwd_cols["model_share"]
    fwd_class = fwd_cols["op_class"]
    out_rows: list[dict] = []
    edges: list[tuple[int, int]] = [tuple(e) for e in fwd.edges.tolist()]
    first_bw: dict[int, int] = {}  # forward id -> its first backward node id
    last_bw: dict[int, int] = {}
    prev = n_fwd - 1  # backward starts after the last forward kernel
    layers = nodes["layer"].to_numpy()
    tags = nodes["tag"].to_numpy()
    seen_layers: set[int] = set()
    end = fwd.meta.get("n_layers", 1 << 30) if recompute == "full" else module_layers_end(fwd.meta)
    for i in range(n_fwd - 1, -1, -1):
        lay = int(layers[i])
        if (recompute != "none" or stored) and 0 <= lay < end and lay not in seen_layers:
            seen_layers.add(lay)
            sel = np.flatnonzero(layers == lay)
            if recompute != "full":
                sel = sel[[bool(node_tags(t) & rerun) for t in tags[sel]]]
            for j in sel:
                r = {c: v[j] for c, v in fwd_cols.items()}
                r.update(phase="backward", fwd_id=int(j), recompute=True, param_count=0, name=f"{r['name']}.recompute")
                nid = n_fwd + len(out_rows)
                out_rows.append(r)
                edges.append((prev, nid))
                prev = nid
        specs = rules[i]
        if not specs:
            continue
        embedding = fwd_class[i] == "embedding"
        for k, spec in enumerate(specs):
            if embedding:
                spec = _embedding_grad_spec(spec, framework, dtype)
            nid = n_fwd + len(out_rows)
            out_rows.append(_bw_row(spec, fwd_layer[i], fwd_scope[i], fwd_tag[i], i, dtype, fwd_share[i]))
            edges.append((i, nid))
            edges.append((prev, nid))
            if k == 0:
                first_bw[i] = nid
            last_bw[i] = nid
            prev = nid
    # gradient flow: dst's backward feeds src's backward
    for src, dst in fwd.edges.tolist():
        if dst in last_bw and src in first_bw:
            edges.append((last_bw[dst], first_bw[src]))
    n_params = fwd.meta.get("param_count", 0)
    if grad_accumulation or opt != "none":
        by_layer = nodes.groupby("layer", sort=True)["param_count"].sum()
        fp8_rows = nodes["dtype"].to_numpy() == "fp8"
        # the FP8 GEMMs' weights per layer, one entry per module (its node's name and parameters): Transformer Engine
        # casts each module's weight on its own (below)
        fp8_w = nodes.loc[fp8_rows & (nodes["param_count"].to_numpy(dtype=float) > 0), ["layer", "name", "param_count"]]
        fp8_weights_by_layer = {int(k): list(zip(v["name"], v["param_count"].astype(float)))
                                for k, v in fp8_w.groupby("layer", sort=False)} if len(fp8_w) else {}
        recipe = fwd.meta.get("fp8_scaling") or DEFAULT_FP8_RECIPE
        fp8_transpose = bool(fwd.meta.get("fp8_transpose", True))
        mixed = dtype in ("fp16", "bf16")
        db = 2 if mixed else 4
        for lay, p in by_layer.items():
            if p <= 0:
                continue
            scope = f"layer {lay}"
            if grad_accumulation:
                out_rows.append(_opt_row(f"accumulate_grad[{lay}]", "elementwise", lay, scope, float(p), 3.0 * p * db, dtype, "backward"))
                edges.append((prev, n_fwd + len(out_rows) - 1))
            if opt != "none" and dtype == "fp16":
                out_rows.append(_opt_row(f"loss_scale.unscale[{lay}]", "optimizer", lay, scope, float(p),
                                         LOSS_SCALE_BYTES_PER_PARAM * float(p), dtype, "optimizer"))
                edges.append((prev, n_fwd + len(out_rows) - 1))
            if opt != "none" and clip_grad:
                out_rows.append(_opt_row(f"clip_grad_norm[{lay}]", "optimizer", lay, scope, 2.0 * float(p),
                                         CLIP_BYTES_PER_PARAM * float(p), dtype, "optimizer"))
                edges.append((prev, n_fwd + len(out_rows) - 1))
            if opt == "muon":
                mats = muon_by_layer.get(int(lay))
                p_muon = float(mats["params"].sum()) if mats is not None else 0.0
                if p - p_muon > 0:  # the layer's other parameters: AdamW (Megatron-Core muon.py l. 321-333)
                    out_rows.append(_opt_row(f"adamw.step[{lay}]", "optimizer", lay, scope,
                                             OPTIMIZER_FLOPS_PER_PARAM["adamw"] * float(p - p_muon),
                                             optimizer_step_bytes("adamw", mixed, impl) * float(p - p_muon), dtype,
                                             "optimizer"))
                    edges.append((prev, n_fwd + len(out_rows) - 1))
                if mats is not None:
                    for r in muon_rows(mats, lay, scope, muon_fw, mixed, dtype):
                        out_rows.append(r)
                        edges.append((prev, n_fwd + len(out_rows) - 1))
            elif opt != "none":
                step = "foreach_step" if impl == "foreach" else "step"
                out_rows.append(_opt_row(f"{opt}.{step}[{lay}]", "optimizer", lay, scope, OPTIMIZER_FLOPS_PER_PARAM[opt] * float(p),
                                         optimizer_step_bytes(opt, mixed, impl) * float(p), dtype, "optimizer"))
                edges.append((prev, n_fwd + len(out_rows) - 1))
            # Transformer Engine casts the updated bf16 weight of each FP8 module once per step (cached over the
            # micro-batches, Megatron's is_first_microbatch), one quantize kernel per module weight: TE 2.20.2
            # pytorch/module/linear.py l. 575-585 (``quantize_weight`` of the module's weight, ``update_workspace``
            # on the first micro-batch), layernorm_linear.py l. 352-357 (Megatron's fused QKV), layernorm_mlp.py
            # l. 505-538 (fc1 and fc2, one each), base.py l. 792-880 (``quantize_weight``: one ``tex.quantize`` or
            # ``quantize_`` of the workspace per call); Megatron-Core's grouped experts (TE GroupedLinear, whose
            # default ``single_grouped_weight=False``, grouped_linear.py l. 1593 / 1642, keeps one parameter per
            # expert) quantize each local expert's weight on its own (l. 841-855), one per expert GEMM node here (the
            # single grouped weight's one ``tex.group_quantize``, l. 270-310, is an option). Until stop 58 one cast per layer
            # carried all its modules' bytes (HF path: 7 modules a layer, Megatron: 4). Each reads 2 B a parameter
            # and writes the fp8 copy and its transpose (mxfp8 / blockwise: row-wise and column-wise copies with their
            # block scales; per-tensor recipes on data-centre Blackwell: the data alone,
            # fp8_recipes.weight_copy_bytes_per_param)
            for wname, fp8_p in fp8_weights_by_layer.get(int(lay), ()):
                if recipe == "tensorwise":
                    # current scaling (Float8CurrentScalingQuantizer::quantize_impl, csrc/quantizer.cpp): an amax pass
                    # over the bf16 weight, then the one-element scale kernel, before its cast (as every activation
                    # cast's, op_graph._fp8_amax)
                    out_rows.append(_opt_row(f"fp8_weight_amax[{lay}].{wname}", "fp8_cast", lay, scope, fp8_p,
                                             2.0 * fp8_p, dtype, "optimizer"))
                    edges.append((prev, n_fwd + len(out_rows) - 1))
                    out_rows.append(_opt_row(f"fp8_weight_amax[{lay}].{wname}.scale", "fp8_cast", lay, scope, 1.0,
                                             float(CURRENT_SCALE_KERNEL_BYTES), dtype, "optimizer"))
                    edges.append((prev, n_fwd + len(out_rows) - 1))
                out_rows.append(_opt_row(f"fp8_weight_cast[{lay}].{wname}", "fp8_cast", lay, scope, fp8_p,
                                         (2.0 + weight_copy_bytes_per_param(recipe, fp8_transpose)) * fp8_p, dtype,
                                         "optimizer"))
                edges.append((prev, n_fwd + len(out_rows) - 1))
    extra = _frame_of_rows(out_rows, list(NODE_COLUMNS))
    all_nodes = pd.concat([nodes, extra], ignore_index=True) if len(extra) else nodes.copy()
    all_nodes["recompute"] = all_nodes["recompute"].astype(bool)
    all_nodes["fwd_id"] = all_nodes["fwd_id"].astype(np.int64)
    all_nodes["layer"] = all_nodes["layer"].astype(np.int64)
    warnings = list(fwd.meta.get("warnings") or [])
    if opt == "muon":
        qkv_note = muon_qkv_warning(fwd, muon_fw)
        if qkv_note and qkv_note not in warnings:
            warnings.append(qkv_note)
    if recompute != "none" and not all_nodes["recompute"].any():
        # e.g. selective recomputation (the attention core) with a fused attention kernel, which keeps no scores
        warnings.append(f"--recompute {recompute}: nothing in this model's layers is recomputed (a fused attention "
                        "kernel keeps no attention scores to drop); Megatron-Core's --recompute-modules choose other "
                        "parts under --framework megatron")
    meta = dict(fwd.meta, mode="train", optimizer=opt, optimizer_impl=impl, recompute=recompute, grad_accumulation=bool(grad_accumulation),
                clip_grad=bool(clip_grad and opt != "none"),
                optimizer_param_count=int(n_params), **({"warnings": warnings} if warnings else {}),
                **(_muon_meta(muon, muon_fw, dtype in ("fp16", "bf16")) if muon is not None else {}))
    return replace(fwd, nodes=all_nodes, edges=np.array(edges, dtype=np.int64).reshape(-1, 2), meta=meta)


def optimizer_param_tensors(g: OpGraph) -> pd.DataFrame:
    """The parameter tensors a Muon training graph's optimizer steps, one row each in the graph's order: ``layer``,
    ``numel``, ``ns_flops`` (Newton-Schulz FLOPs, 0 for an AdamW tensor), ``step_bytes`` (bytes its elementwise passes
    move: Muon's :data:`MUON_UPDATE_BYTES_PER_PARAM`, AdamW's fused step), ``muon`` (whether Muon steps it). What
    Megatron-Core's LayerWiseDistributedOptimizer splits over the DP ranks (whole tensors: layer_wise_optimizer.py
    l. 92-136). A Muon matrix is one tensor (its query / key / value split is inside its step); every other node with
    parameters counts as one AdamW tensor (a linear layer's bias with its weight's AdamW row: not split out).
    GraphError for a graph :func:`training_graph` did not build with ``optimizer="muon"``."""
    if g.meta.get("optimizer") != "muon" or "muon_framework" not in g.meta or "muon_mixed" not in g.meta:
        raise GraphError("optimizer_param_tensors needs a training graph built with optimizer muon (its meta's "
                         "muon_framework and muon_mixed)")
    fw, mixed = g.meta["muon_framework"], bool(g.meta["muon_mixed"])
    fwd = OpGraph(g.nodes[g.nodes["phase"] == "forward"].reset_index(drop=True), g.edges, g.meta, g.saved)
    mats = muon_matrices(fwd, fw)
    mats = mats.assign(flops=muon_ns_flops(mats["rows"], mats["cols"]) * mats["count"])
    whole = mats.groupby(["layer", "name"], sort=False).agg(numel=("params", "sum"), flops=("flops", "sum"),
                                                            count=("count", "first")).reset_index()
    own = fwd.nodes.loc[fwd.nodes["param_count"] > 0, ["layer", "name", "param_count"]].reset_index(drop=True)
    own = own.assign(layer=own["layer"].astype(np.int64)).merge(
        whole.assign(layer=whole["layer"].astype(np.int64)), on=["layer", "name"], how="left", sort=False)
    pc = own["param_count"].to_numpy(dtype=float)
    m_numel = own["numel"].fillna(0.0).to_numpy(dtype=float)
    m_flops = own["flops"].fillna(0.0).to_numpy(dtype=float)
    is_m = own["numel"].notna().to_numpy()
    c = np.where(is_m, np.maximum(own["count"].fillna(1.0).to_numpy(dtype=float), 1.0), 0.0).astype(np.int64)
    adam = np.where(is_m, pc - m_numel, pc)  # a node's parameters outside its Muon matrices: one AdamW tensor
    lay = own["layer"].to_numpy(dtype=np.int64)
    node = np.arange(len(own))
    # a mixture of experts' held copies: one tensor each, then the node's AdamW remainder
    mi = np.repeat(node, c)
    ai = node[adam > 0]
    idx = np.r_[mi, ai]
    order = np.lexsort((np.r_[np.zeros(len(mi)), np.ones(len(ai))], idx))
    cc = np.maximum(c, 1).astype(float)
    numel = np.r_[(m_numel / cc)[mi], adam[ai]][order]
    muon = np.r_[np.ones(len(mi), dtype=bool), np.zeros(len(ai), dtype=bool)][order]
    step_b = np.where(muon, MUON_UPDATE_BYTES_PER_PARAM[(fw, mixed)], optimizer_step_bytes("adamw", mixed)) * numel
    return pd.DataFrame({"layer": lay[idx[order]], "numel": numel,
                         "ns_flops": np.r_[(m_flops / cc)[mi], np.zeros(len(ai))][order],
                         "step_bytes": step_b, "muon": muon})


def _muon_meta(mats: pd.DataFrame, framework: str, mixed: bool) -> dict:
    """A Muon training graph's meta: the parameters Muon steps (in all and per layer, for the memory and the
    layer-wise distributed optimizer's split), its implementation, whether its step runs under mixed precision (the
    bytes of its passes) and its Newton-Schulz GEMM dtype."""
    by_layer = mats.groupby("layer")["params"].sum() if len(mats) else pd.Series(dtype=float)
    return dict(muon_param_count=float(mats["params"].sum()) if len(mats) else 0.0, muon_framework=framework,
                muon_mixed=bool(mixed),
                muon_ns_dtype=MUON_NS_DTYPE[framework], muon_tp_mode="blockwise",
                muon_params_by_layer={int(k): float(v) for k, v in by_layer.items()})


def _opt_row(name: str, op_class: str, layer: int, scope: str, flops: float, bytes_: float, dtype: str, phase: str) -> dict:
    dtype = "fp32" if dtype == "tf32" else dtype  # the optimizer's arithmetic is not a matrix product
    row = {c: np.nan for c in SHAPE_COLUMNS}
    row.update(name=name, op_class=op_class, kernel="", method="proxy", dtype=dtype, flops=flops, bytes=bytes_, scale=1.0,
               param_count=0, layer=int(layer), scope=scope, phase=phase, fwd_id=-1, recompute=False, tag="", group="",
               model_share=1.0)
    return row
