"""The building blocks every Hugging Face graph generator shares (:mod:`wattcast.featurize.hf_models` and
:mod:`wattcast.featurize.hf_switch` both import them, neither imports the other's internals): head views and merges,
eager and fused attention, activations, RMSNorm, RoPE, logit soft-capping, the LM head with its loss, and the
vocabulary-parallel embedding."""

from __future__ import annotations

from wattcast.featurize.op_graph import GraphBuilder, GraphError, Tensor, attention_pair_share



def heads(b: GraphBuilder, x: Tensor, n: int, d: int) -> Tensor:
    """(B, S, n*d) -> (B, n, S, d) as a view (transpose without a copy)."""
    bs, s = x.shape[0], x.shape[1]
    return b.view(x, (bs, n, s, d))


def merge_heads(b: GraphBuilder, x: Tensor, name: str = "merge_heads") -> Tensor:
    """(B, n, S, d) -> (B, S, n*d): the transpose + contiguous/reshape copy every eager model does."""
    bs, n, s, d = x.shape
    return b.copy(x, (bs, s, n * d), name=name)


def eager_attention(b: GraphBuilder, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: str, mask: str,
                    dropout_p: float, window: int | None = None, mask_shape: tuple[int, ...] | None = None,
                    clamp_min: bool = False,
                    strided: tuple[bool, bool, bool] = (False, False, False),
                    bias_shape: tuple[int, ...] | None = None, softcap: float | None = None,
                    sinks: bool = False, softmax_dtype: str | None = None, softmax_fp32: bool = False) -> Tensor:
    """QK^T, scaling (``scores_div``/``scores_mul``/``none``; ``q`` scaling is the caller's), an additive
    position bias of ``bias_shape`` (ALiBi's (1, h, 1, S); none by default), mask (``where`` causal with a
    bool (1, 1, S, S) mask, ``add`` additive, ``none``), softmax, dropout, PV. Tagged ``attn_core``.

    ``sinks`` (gpt-oss's ``eager_attention_forward``): each head's learned sink logit joins every row of the masked
    scores as one more column (``torch.cat``: a copy of the (B, h, S, S) scores to (B, h, S, S+1); its backward hands
    each input a view of the gradient, no kernel), the row max is subtracted (a max reduction to (B, h, S, 1) and a
    broadcast subtract, both differentiated by autograd), the softmax runs over S+1 columns and the sink column is
    dropped by ``probs[..., :-1]``: a view, no kernel (``torch.matmul`` folds its batch dims without a copy and the
    GEMM reads rows of stride S+1); dropout (none at p = 0) and PV read that view. The view's backward (a zero-filled
    (B, h, S, S+1) gradient with the (B, h, S, S) one copied in) is not a kernel here: the builder has no
    backward-only op. The sink parameters are the caller's.

    ``strided`` (q, k, v): the operand is a head-permuted view ``x.view(B, S, h, d).permute(0, 2, 1, 3)``
    of a projection. ``torch.matmul`` on 4-D operands folds the batch dims with ``reshape``, which cannot
    view such a tensor (its batch and head strides do not merge), so it copies the operand to a contiguous
    (B*h, ., .) buffer before the bmm: GPT-2 and BERT attention pay these copies (two before QK^T, one
    before PV); OPT makes q/k/v contiguous itself, and RoPE outputs are contiguous already.

    ``softmax_dtype`` "fp32" (Megatron's ``forward_torch_softmax`` with ``softmax_in_fp32``, megatron-core 0.16.1
    megatron/core/fusions/fused_softmax.py l. 313-341): the scores cast to fp32 (``input.float()``) before the
    scaling and the mask, the softmax in fp32 and its probabilities cast back (``probs.half()``); each cast's
    backward is the cast the other way.

    ``softmax_fp32`` (Hugging Face eager attention): the softmax as ``softmax(scores, dim=-1,
    dtype=torch.float32).to(query.dtype)`` (:func:`softmax_upcast`).

    Model FLOPs (``causal``, ``window``: the mask the model's attention applies): the kernels compute every one of the
    S x S_kv query-key pairs, masked or not, and the softmax work on the scores; the model's attention is its score and
    context products over the pairs its mask keeps, as the fused kernel computes them (``GraphBuilder.flash_attention``):
    QK^T and PV (and their gradients) count in model FLOPs at :func:`~wattcast.featurize.op_graph.attention_pair_share`
    (causal self-attention: half), the scale, mask, softmax and dropout kernels between them not at all (hardware FLOPs,
    HFU, only), so MFU does not depend on the kernel (``model_share``)."""
    bs, h, s, d = q.shape
    skv = k.shape[2]
    share = attention_pair_share(s, skv, causal=causal, window=window)
    with b.tag("attn_core"), b.model_share(0.0):
        if strided[0]:
            q = b.copy(q, name="attn.q_reshape")
        k_t = Tensor((bs, k.shape[1], d, skv), k.dtype, k.node, k.tid)  # transposed view, no kernel
        if strided[1]:
            k_t = b.copy(k_t, name="attn.k_reshape")
        with b.model_share(share):
            scores = b.matmul(q, k_t, name="attn.qk")
        wide = softmax_dtype if softmax_dtype and softmax_dtype != scores.dtype else None
        if wide:
            scores = b.copy(scores, name="attn.softmax_float", out_dtype=wide)
        if scale == "scores_div":
            scores = b.elementwise("div", scores, 1.0, name="attn.scale", out_dtype=wide)
        elif scale == "scores_mul":
            scores = b.elementwise("mul", scores, 1.0, name="attn.scale", out_dtype=wide)
        if softcap:  # Gemma 2: cap * tanh(scores / cap)
            scores = softcap_logits(b, scores, softcap, "attn.softcap")
        if bias_shape is not None:
            scores = b.elementwise("add", scores, b.input(bias_shape, requires_grad=False), name="attn.position_bias")
        if mask != "none":
            m = b.input(mask_shape or (1, 1, s, skv), "fp8" if mask == "where" else None, requires_grad=False)
            scores = b.elementwise("where" if mask == "where" else "add", scores, m, name="attn.mask", out_dtype=wide)
        if clamp_min:
            scores = b.elementwise("maximum", scores, 0.0, name="attn.clamp")
        if sinks:
            sink_shape = (bs, h, s, skv + 1)
            cat = b.copy(Tensor(sink_shape, scores.dtype, scores.node, scores.tid), name="attn.sinks_cat", grad=False)
            row_max = b.reduction(cat, (bs, h, s, 1), name="attn.sinks_max")
            scores = b.elementwise("sub", cat, row_max, name="attn.sinks_sub_max")
        if softmax_fp32:
            probs = softmax_upcast(b, scores)
        else:
            probs = b.softmax(scores, name="attn.softmax", out_dtype=wide)
            if wide:
                probs = b.copy(probs, name="attn.softmax_half", out_dtype=b.dtype)
        if sinks:  # probs[..., :-1]: the sink column dropped by a view
            probs = Tensor((bs, h, s, skv), probs.dtype, probs.node, probs.tid)
        probs = b.dropout(probs, dropout_p, name="attn.dropout")
        if strided[2]:
            v = b.copy(v, name="attn.v_reshape")
        with b.model_share(share):
            return b.matmul(probs, v, name="attn.pv")


def softmax_upcast(b: GraphBuilder, scores: Tensor) -> Tensor:
    """Hugging Face's eager softmax in fp32: ``nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32)
    .to(query.dtype)`` (transformers 5.24.0 ``eager_attention_forward`` of Llama l. 197, Mistral, Qwen2/3, Qwen2/3-MoE,
    Mixtral, Phi-3, Gemma 1-3, DeepSeek-V2/V3, GPT-NeoX l. 158; BLOOM l. 284
    ``F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_layer.dtype)``); OPT as transformers 4.36.2 ran it
    calls this for fp16 alone (featurize/hf_models.opt).

    What PyTorch runs for it (aten/src/ATen/native/SoftMax.cpp ``softmax(input, dim, dtype)``; checked against the
    torch 2.13 wheel by logging the dispatched aten ops, a FakeTensor on a CUDA device for the forward, meta tensors
    for the backward, the CPU for the bf16 path's backward):

    - bf16 (and any half dtype but CUDA fp16): ``input.toType(Float)`` (``aten._to_copy``: a cast kernel) then
      ``_softmax(x32, dim, half_to_float=False)`` in fp32; in backward ``_softmax_backward_data`` on the fp32
      gradient and saved fp32 output, and the cast's ``ToCopyBackward0`` casting the gradient back;
    - CUDA fp16: ``_softmax(input, dim, half_to_float=True)``, one kernel reading fp16 and writing fp32; its backward
      ``_softmax_backward_data(grad32, out32, dim, input_dtype=Half)`` writes the fp16 gradient directly (no cast);
    - both: ``.to(query.dtype)`` a cast back (``_to_copy``) whose backward casts the gradient to fp32.

    The softmax saves its fp32 output for backward (4 B an element, twice the half-precision one); the casts save
    nothing. In fp32 / tf32 the dtype is the tensor's own and ``.to`` a no-op: the one softmax kernel as before."""
    if b.dbytes >= 4:
        return b.softmax(scores, name="attn.softmax")
    if b.dtype != "fp16":
        scores = b.copy(scores, name="attn.softmax.to_fp32", out_dtype="fp32")
    probs = b.softmax(scores, name="attn.softmax", out_dtype="fp32")
    return b.copy(probs, name="attn.softmax.to_dtype", out_dtype=b.dtype)


def attention(b: GraphBuilder, q: Tensor, k: Tensor, v: Tensor, *, impl: str, causal: bool, **eager_kw) -> Tensor:
    if impl == "flash":
        return b.flash_attention(q, k, v, causal=causal, name="attn.flash")
    return eager_attention(b, q, k, v, causal=causal, **eager_kw)


def repeat_kv(b: GraphBuilder, x: Tensor, n_rep: int, name: str) -> Tensor:
    """Grouped-query attention's keys or values copied to every query head (eager attention's; a fused kernel reads the
    shared heads). Its backward sums the copies' gradients: hardware FLOPs only (``model_share`` 0), as the fused
    kernel's own summing of them is not counted either (model FLOPs independent of the kernel, eager_attention)."""
    if n_rep == 1:
        return x
    bs, h, s, d = x.shape
    with b.model_share(0.0):
        return b.copy(x, (bs, h * n_rep, s, d), name=name, expand=True)


#: the Hugging Face ``hidden_act`` strings :func:`activation` costs, by the kernels they run
GELU_TANH_COMPOSITE = ("gelu_new", "gelu_pytorch_tanh_composite", "gelu_fast")
GELU_ONE_KERNEL = ("gelu", "gelu_python", "gelu_pytorch_tanh", "gelu_accurate", "quick_gelu")
ACTIVATIONS = (*GELU_TANH_COMPOSITE, *GELU_ONE_KERNEL, "relu", "silu", "swish", "tanh")


def activation(b: GraphBuilder, x: Tensor, act: str) -> Tensor:
    """The activation kernels eager PyTorch runs for a Hugging Face ``hidden_act`` string (:data:`ACTIVATIONS`)."""
    a = act.lower()
    if a in GELU_TANH_COMPOSITE:
        # NewGELUActivation: 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))) -> 8 kernels
        half = b.elementwise("mul", x, 0.5, name="gelu.half")
        cube = b.elementwise("pow", x, 3.0, name="gelu.cube")
        cube = b.elementwise("mul", cube, 0.044715, name="gelu.coef")
        inner = b.elementwise("add", x, cube, name="gelu.inner")
        inner = b.elementwise("mul", inner, 0.7978845608, name="gelu.scale")
        t = b.elementwise("tanh", inner, name="gelu.tanh")
        t = b.elementwise("add", t, 1.0, name="gelu.one")
        return b.elementwise("mul", half, t, name="gelu.out")
    if a in GELU_ONE_KERNEL:
        return b.elementwise("gelu", x, name="gelu")
    if a in ("relu",):  # keeps its result for backward, the tensor the next linear layer saves: counted once
        y = b.elementwise("relu", x, name="relu")
        b.saves_result(y)  # aten derivatives.yaml, relu: threshold_backward(grad, result, 0)
        return y
    if a in ("silu", "swish"):
        return b.elementwise("silu", x, name="silu")
    if a == "tanh":
        y = b.elementwise("tanh", x, name="tanh")
        b.saves_result(y)  # aten derivatives.yaml, tanh: tanh_backward(grad, result)
        return y
    raise GraphError(f"unsupported activation function {act!r} (supported: {', '.join(ACTIVATIONS)})")


def rms_norm_eager(b: GraphBuilder, x: Tensor, name: str, module: str = "") -> Tensor:
    """LlamaRMSNorm / T5LayerNorm as eager PyTorch runs it: pow, mean, add eps, rsqrt, mul, mul weight
    (plus fp32 casts when the model runs in half precision). ``module``: as for ``GraphBuilder.layernorm``.

    transformers 5.24.0 models/llama/modeling_llama.py l. 62-67 (``LlamaRMSNorm.forward``): ``hidden_states.to(
    torch.float32)``, ``pow(2).mean(-1, keepdim=True)``, ``* torch.rsqrt(variance + eps)``, then ``self.weight *
    hidden_states.to(input_dtype)``: every kernel between the two casts runs on (and autograd differentiates) fp32
    tensors, so those nodes are fp32 kernels at 4 B an element (their gradients too); the weight product is the
    model's dtype."""
    h = x.shape[-1]
    half = b.dbytes < 4  # a tf32 model's tensors are fp32 already: no cast
    with b.scope(name), b.tag(module):
        # hidden_states.to(torch.float32): the normalisation runs on (and autograd keeps) fp32 tensors, 4 B an element
        if half:
            x32 = b.copy(x, name=f"{name}.to_fp32", out_dtype="fp32")
        else:
            x32 = x
        f32 = "fp32" if half else None
        sq = b.elementwise("pow", x32, 2.0, name=f"{name}.pow", out_dtype=f32)
        var = b.reduction(sq, (*x.shape[:-1], 1), name=f"{name}.mean", out_dtype=f32)
        var = b.elementwise("add", var, 1e-6, name=f"{name}.eps", out_dtype=f32)
        r = b.elementwise("rsqrt", var, name=f"{name}.rsqrt", out_dtype=f32)
        y = b.elementwise("mul", x32, r, name=f"{name}.normalise", out_dtype=f32)
        if half:
            y = b.copy(y, name=f"{name}.to_dtype", out_dtype=b.dtype)
        w = b.input((h,))
        # the weight's h parameters belong to the kernel that reads them, so a stage that holds the norm counts them
        # (simulate/distributed.py sums the forward nodes' param_count per pipeline stage)
        return b.elementwise("mul", w, y, name=f"{name}.weight", params=h)


def rope(b: GraphBuilder, x: Tensor, name: str) -> Tensor:
    """apply_rotary_pos_emb on one of q/k: x*cos + rotate_half(x)*sin (neg of a half, cat, 2 muls, add)."""
    bs, h, s, d = x.shape
    cos = b.input((bs, 1, s, d), requires_grad=False)
    a = b.elementwise("mul", x, cos, name=f"{name}.cos")
    half = Tensor((bs, h, s, d // 2), x.dtype, x.node, x.tid)
    neg = b.elementwise("neg", half, name=f"{name}.neg")
    rot = b.copy(Tensor((bs, h, s, d), x.dtype, neg.node, neg.tid), name=f"{name}.cat")
    c = b.elementwise("mul", rot, cos, name=f"{name}.sin")
    return b.elementwise("add", a, c, name=f"{name}.add")


def megatron_rope(b: GraphBuilder, q: Tensor, k: Tensor, *, fused: bool, prefix: str = "self_attention"
                  ) -> tuple[Tensor, Tensor]:
    """Megatron-Core's ``apply_rotary_pos_emb`` on one layer's query and key: ``SelfAttention.forward`` calls it once
    on each (``fused_single_qkv_rope`` off, its default; megatron-core 0.19.2 transformer/attention.py,
    transformer_config.py).

    ``fused`` (``TransformerConfig.apply_rope_fusion``): Transformer Engine's ``fused_apply_rotary_pos_emb``, one
    memory-bound kernel on q and one on k (each reads and writes its tensor and saves only the frequencies), one kernel
    each on their gradients. Unfused: ``_apply_rotary_pos_emb_bshd`` (models/common/embeddings/rope_utils.py), which
    on every call makes its cos/sin tables from the fp32 frequencies (``(torch.cos(freqs) * mscale).to(t.dtype)`` and
    the same for sin: six kernels on the (S, 1, 1, d) table, off the gradient path; cos/sin costed as ``exp``, the
    kernel vocabulary's transcendental unary, data/kernel_ops.py), then ``t * cos + rotate_half(t) * sin``
    (:func:`rope`'s kernels) and ``torch.cat((t, t_pass))`` (one copy; ``t_pass`` is empty at ``rotary_percent`` 1)."""
    if fused:
        return (b.elementwise("mul", q, 1.0, name=f"{prefix}.rope.q"),
                b.elementwise("mul", k, 1.0, name=f"{prefix}.rope.k"))
    out = []
    for t, which in ((q, "q"), (k, "k")):
        name = f"{prefix}.rope.{which}"
        freqs = b.input((t.shape[2], 1, 1, t.shape[3]), "fp32", requires_grad=False)
        for fn in ("cos", "sin"):
            table = b.elementwise("exp", freqs, name=f"{name}.{fn}", out_dtype="fp32", grad=False)
            table = b.elementwise("mul", table, 1.0, name=f"{name}.{fn}.mscale", out_dtype="fp32", grad=False)
            b.copy(table, name=f"{name}.{fn}.cast", grad=False)
        out.append(b.copy(rope(b, t, name), name=f"{name}.cat_pass"))
    return out[0], out[1]


def lm_head_and_loss(b: GraphBuilder, x: Tensor, vocab: int, *, tied: bool, train: bool, bias: bool = False,
                     fp32_loss: bool = False, softcap: float | None = None, shared: bool = False,
                     loss_upcast: bool = True) -> Tensor:
    """LM head (column-parallel over the vocabulary under tensor parallelism) and the cross-entropy loss
    (``fp32_loss``: on ``logits.float()``, as Megatron-LM's GPT computes it, keeping fp32 probabilities;
    ``softcap``: Gemma 2's final logit soft-capping before the loss; ``shared``: the output layer of another head on
    the same stage, multi-token prediction's: no parameters and no copy of its own; ``loss_upcast`` False: a loss
    kernel on the logits in their dtype, flash-attn's, not PyTorch's fp32 cross-entropy: ``GraphBuilder.cross_entropy``)."""
    if b.logits_last and not train and len(x.shape) == 3:
        # generation needs the last position's logits only: transformers' ``generate`` passes ``logits_to_keep=1``
        # (LlamaForCausalLM.forward: ``self.lm_head(hidden_states[:, slice_indices, :])``), vLLM gathers the last
        # token of each sequence before its logits processor (LogitsProcessor._prune_hidden_states); the slice is a
        # view (no kernel). Without it a 32 x 8,192-token Llama 3 prefill makes 67 GB of bf16 logits
        x = Tensor((x.shape[0], 1, x.shape[2]), x.dtype, x.node, x.tid)
    x = b.tp_enter(x, name="lm_head.enter")
    # Transformer Engine's recipes keep the output layer in bf16 (Megatron-Core: not a TE module; --fp8 covers the
    # transformer layers)
    logits = b.linear(x, padded_vocab(b, vocab), bias=bias, name="lm_head", weight_params=not (tied or shared),
                      parallel="col", fp8=False)
    if tied and not shared:
        # the tied weight's parameters on this rank ((padded vocab / tp) x hidden): the head holds none of its own, but a
        # pipeline's last stage keeps a copy of them (simulate/distributed.py, tied_copy_params_by_chunk)
        b.meta["tied_output_params"] = vocab_shard_params(b, vocab, int(x.shape[-1]))
    if softcap:
        logits = softcap_logits(b, logits, softcap, "lm_head.softcap")
    if train:
        # Megatron-Core's --cross-entropy-loss-fusion (featurize.workload.StepOptions.cross_entropy_loss_fusion): its
        # implementation, "native" or "te", or None (unfused); it replaces the fp32 loss only
        b.cross_entropy(logits, name="loss", vocab_parallel=True, fp32_saved=fp32_loss,
                        fusion=b.ce_fusion if fp32_loss else None, upcast=loss_upcast)
    elif b.kv_context is not None and b.tp > 1:
        # a served model's vocabulary-parallel head: each rank's logits shard gathered for sampling (vLLM's
        # LogitsProcessor._gather_logits, tensor_model_parallel_gather to rank 0 in the v0.x engine, cited from memory),
        # costed as an all-gather of the whole (tokens x padded vocabulary) logits in the model's dtype
        full = (*logits.shape[:-1], logits.shape[-1] * b.tp)
        logits = b.collective("all_gather", logits, full, group=b._tp_group, size_bytes=logits.nbytes * b.tp,
                              name="lm_head.gather_logits")
    return logits


#: Megatron-LM's --make-vocab-size-divisible-by default (megatron/training/tokenizer: _vocab_size_with_padding)
MEGATRON_VOCAB_MULTIPLE = 128


def padded_vocab(b: GraphBuilder, vocab: int) -> int:
    """The vocabulary rows the embedding and output layer hold: Megatron-LM and Megatron-DeepSpeed pad it to a
    multiple of 128 x the tensor-parallel degree (GPT-2's 50,257 -> 50,304 at TP 1, 51,200 at TP 8); a vocabulary-
    parallel layer elsewhere to a multiple of the TP degree."""
    multiple = b.tp * (MEGATRON_VOCAB_MULTIPLE if getattr(b, "framework", "hf") in ("megatron", "megatron-deepspeed") else 1)
    return -(-vocab // multiple) * multiple


def vocab_shard_params(b: GraphBuilder, vocab: int, dim: int) -> int:
    """Parameters of this rank's shard of a (padded vocabulary x ``dim``) table split over the TP ranks: what a
    pipeline's last stage holds of a tied embedding (or MTP's copy of it)."""
    return dim * (padded_vocab(b, vocab) // int(b.tp))


def local_heads(b: GraphBuilder, n: int, what: str = "attention heads") -> int:
    if n % b.tp:
        raise GraphError(f"{n} {what} are not divisible by tensor parallelism {b.tp}")
    return n // b.tp


def served_kv_heads(b: GraphBuilder, n_kv: int) -> int:
    """Key/value heads per tensor-parallel rank of a served (KV-cached) model, as vLLM's QKVParallelLinear splits
    them (vllm/model_executor/layers/linear.py and models/llama.py ``LlamaAttention``, cited from memory): ``n_kv //
    tp`` when ``tp`` divides them; with fewer KV heads than ranks each rank holds one, replicated ``tp // n_kv`` times
    (its k/v projection and its cache too), which needs ``n_kv`` to divide ``tp``. A training graph (Megatron) splits
    them only (:func:`local_heads`)."""
    if b.kv_context is None or n_kv >= b.tp:
        return local_heads(b, n_kv, "key/value heads")
    if b.tp % n_kv:
        raise GraphError(f"{n_kv} key/value heads and tensor parallelism {b.tp}: vLLM replicates KV heads over the ranks "
                         f"only when their count divides the TP degree")
    return 1


def vocab_embedding(b: GraphBuilder, ids: Tensor, vocab: int, dim: int, name: str, *, params: bool = True) -> Tensor:
    """Token embedding: vocabulary-parallel under tensor parallelism, partial lookups all-reduced. ``params=False``:
    a lookup in a table another op already holds."""
    if b.tp == 1:
        return b.embedding(ids, padded_vocab(b, vocab), dim, name=name, params=params, word=True)
    e = b.embedding(ids, padded_vocab(b, vocab), dim, name=name, parallel=True, params=params, word=True)
    return b.tp_exit(e, name=f"{name}.reduce")


def softcap_logits(b: GraphBuilder, x: Tensor, cap: float, name: str) -> Tensor:
    """cap * tanh(x / cap), as eager PyTorch runs it (Gemma2Attention / Gemma2ForCausalLM)."""
    y = b.elementwise("div", x, float(cap), name=f"{name}.div")
    y = b.elementwise("tanh", y, name=f"{name}.tanh")
    return b.elementwise("mul", y, float(cap), name=f"{name}.mul")
