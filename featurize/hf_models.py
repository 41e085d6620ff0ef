"""Operator-graph generators for Hugging Face model families, from their config alone.

Each generator emits the kernels the matching ``transformers`` class launches in eager PyTorch
(``attn_implementation="eager"``), in order, for a batch of ``batch`` sequences of ``seq`` tokens:

- ``gpt2`` (GPT2LMHeadModel; also GPT-3 / Megatron-style GPT configs): learned positions (rotary ones with ``position_embedding_type: rope``), Conv1D (addmm)
  projections, ``gelu_new`` as its 8 elementwise kernels, causal ``where`` mask, tied LM head.
- ``opt`` (OPTForCausalLM): learned positions (offset 2), q scaled after q_proj, q/k/v made contiguous,
  bmm attention, additive causal mask then ``max`` with the dtype minimum, ReLU MLP, tied LM head.
- ``llama`` (LlamaForCausalLM, also mistral/qwen2): RMSNorm as its eager kernels, RoPE, grouped-query
  attention (repeat_kv copies), SwiGLU MLP, untied LM head unless ``tie_word_embeddings``.
- ``mixtral`` (MixtralForCausalLM): llama attention plus a top-k router over ``num_local_experts`` experts;
  tokens are assumed balanced over experts (``tokens * top_k / n_experts`` each; stated, not measured).
- ``qwen2_moe`` / ``qwen3_moe`` (Qwen2MoeForCausalLM / Qwen3MoeForCausalLM): Qwen2's / Qwen3's attention, sparse
  blocks of ``num_experts`` experts of ``moe_intermediate_size`` (Qwen2-MoE adds a gated shared expert) on the layers
  ``decoder_sparse_step`` and ``mlp_only_layers`` pick, dense SwiGLU MLPs on the others.
- ``gpt_oss`` (GptOssForCausalLM): biased q/k/v/o projections, per-head attention sinks, sliding-window and full
  layers as ``layer_types`` alternates them, a sparse block on every layer: a biased router, top-k then softmax, experts
  with biased ``gate_up_proj``/``down_proj`` and the clamped SwiGLU (:func:`gpt_oss`).
- ``bert`` (BertForPreTraining for training with MLM + NSP heads and losses;
  BertForSequenceClassification for inference).
- ``switch`` (SwitchTransformersForConditionalGeneration / T5): see :mod:`wattcast.featurize.hf_switch`.

``attention="flash"`` replaces the eager QK^T / mask / softmax / dropout / PV chain by one fused kernel.
In training the loss (cross-entropy over the logits) is part of the forward graph. The building blocks the
generators share (attention, activations, RMSNorm, RoPE, LM head) are in :mod:`wattcast.featurize.hf_blocks`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Mapping

from wattcast.featurize.hf_blocks import (activation, attention, eager_attention, heads, lm_head_and_loss, local_heads,
                                          served_kv_heads,
                                          megatron_rope, merge_heads, padded_vocab, repeat_kv, rms_norm_eager, rope, vocab_embedding,
                                          vocab_shard_params)
from wattcast.featurize.hf_config import (QWEN_MOE_FAMILIES, HFConfig, attention_windows, bool_field, deepseek_field,
                                          fraction_field, projection_biases)
from wattcast.featurize.hf_switch import switch
from wattcast.featurize.op_graph import GraphBuilder, GraphError, Tensor


def _p(cfg: HFConfig, *keys: str, default: float = 0.0) -> float:
    """A dropout probability: the first of ``keys`` the config sets, a number in [0, 1] (0 is 0, not the default)."""
    return cfg.fraction(*keys, default=default)


def _nested(cfg: HFConfig, section: str, key: str) -> dict:
    """``{"section.key": value}`` of a nested options object (MPT's ``attn_config``), for the typed field readers."""
    sub = cfg.get(section)
    return {f"{section}.{key}": sub.get(key) if isinstance(sub, Mapping) else None}


# --------------------------------------------------------------------------------------------
# GPT-2 / GPT-3 style
# --------------------------------------------------------------------------------------------

#: Megatron-LM's ``--position-embedding-type`` values the GPT graph represents (default ``learned_absolute``;
#: megatron-core 0.19.2, megatron/training/arguments.py)
GPT_POSITION_EMBEDDINGS = ("learned_absolute", "rope")


def gpt_position_embedding(cfg: HFConfig) -> str:
    """A GPT config's ``position_embedding_type`` (Megatron-Core's ``--position-embedding-type``): ``learned_absolute``
    (GPT-2's learned table, the default) or ``rope``."""
    v = cfg.get("position_embedding_type")
    if v is None:
        return "learned_absolute"
    if v not in GPT_POSITION_EMBEDDINGS:
        raise GraphError(f"{cfg.name}: position_embedding_type {v!r} is not one of {list(GPT_POSITION_EMBEDDINGS)}")
    return v


#: Threads per block of Megatron's fused softmax kernels (megatron/fused_kernels/scaled_masked_softmax.h,
#: ``get_batch_per_block``; cited from memory: the header is not in the megatron-core wheel, which imports the built
#: ``scaled_masked_softmax_cuda`` extension) and the key-length bound of ``is_kernel_available`` (megatron-core 0.16.1
#: megatron/core/fusions/fused_softmax.py l. 253-258: ``16 < sk <= 4096``), applied under megatron-deepspeed too:
#: Megatron-DeepSpeed's own megatron/model/fused_softmax.py is not on PyPI and could not be read offline, so no other
#: bound is claimed for it (the SC21 and vTrain rows it runs have 2,048 keys)
FUSED_SOFTMAX_THREADS_PER_BLOCK = 128
FUSED_SOFTMAX_MAX_SK = 4096


def fused_softmax_batch_per_block(sk: int) -> int:
    """Rows of attention batches one block of Megatron's fused softmax handles (``get_batch_per_block``): the key length
    rounded up to a power of two, a warp of min(that, 32) threads, 128 threads a block, two batches a warp up to 128
    keys, else one (4 for the usual sk > 128)."""
    pow2 = 1 << max(int(sk) - 1, 0).bit_length()
    warp = min(pow2, 32)
    return (FUSED_SOFTMAX_THREADS_PER_BLOCK // warp) * (2 if pow2 <= 128 else 1)


def megatron_fused_softmax_available(dtype: str, batch: int, heads_per_rank: int, sq: int, sk: int,
                                     causal: bool = True) -> bool:
    """Megatron's ``FusedScaleMaskSoftmax.is_kernel_available`` (megatron-core 0.16.1 fused_softmax.py l. 238-270;
    applied to Megatron-DeepSpeed as well, whose copy was not checked: :data:`FUSED_SOFTMAX_MAX_SK`): fp16/bf16
    input, 16 < sk <= 4096, sq and sk multiples of 4, micro-batch x heads per TP rank a multiple of 4 and of the
    block's batches (causal; a padding mask: sq a multiple of them). Else ``forward_torch_softmax`` runs: GPT's 16 heads at TP 8 and micro-batch 1 (2 x 1 batches) do."""
    attn_batches = int(batch) * int(heads_per_rank)
    if dtype not in ("fp16", "bf16") or not 16 < sk <= FUSED_SOFTMAX_MAX_SK:
        return False
    if sq % 4 or sk % 4 or attn_batches % 4:
        return False
    per_block = fused_softmax_batch_per_block(sk)
    return (attn_batches if causal else sq) % per_block == 0


#: Megatron's ``apply_query_key_layer_scaling`` default per framework, where the config does not set it: Megatron-DeepSpeed
#: keeps Megatron-LM 2021's ``--no-query-key-layer-scaling`` (store_false: layer scaling on by default, which forces
#: ``attention_softmax_in_fp32`` True and hands FusedScaleMaskSoftmax the layer number as ``scale``; megatron/arguments.py
#: and megatron/model/transformer.py, cited from memory); Megatron-LM 0.19.2 defaults it off (megatron/training/
#: arguments.py l. 1659-1660) and ``--attention-softmax-in-fp32`` is store_true (off; TransformerConfig's own True is
#: among the "incompatible defaults" the arguments override, l. 2279)
MEGATRON_QK_LAYER_SCALING = {"megatron": False, "megatron-deepspeed": True}


def megatron_torch_softmax(cfg: HFConfig, framework: str) -> tuple[bool, bool]:
    """Megatron's ``forward_torch_softmax`` settings: (``softmax_in_fp32``: the scores cast to fp32 and the probabilities
    back, ``scale`` not None: the scores multiplied by the layer number), from the config's
    ``apply_query_key_layer_scaling`` / ``attention_softmax_in_fp32`` or the framework's defaults."""
    scaling = cfg.flag("apply_query_key_layer_scaling", MEGATRON_QK_LAYER_SCALING.get(framework, False))
    return bool(scaling or cfg.flag("attention_softmax_in_fp32", False)), bool(scaling)


def megatron_softmax_kwargs(cfg: HFConfig, b: GraphBuilder, batch: int, heads_per_rank: int, seq: int) -> dict:
    """``eager_attention`` settings of Megatron's core attention, whose softmax is ``FusedScaleMaskSoftmax`` in the GPT
    path, Megatron-Core's ``DotProductAttention`` (megatron-core 0.16.1 megatron/core/transformer/
    dot_product_attention.py l. 100-109: the same FusedScaleMaskSoftmax, the 1/sqrt(d) scale folded into the
    ``baddbmm``) and so in the Llama and MLA graphs under Megatron-Core: the one fused causal scale-mask-softmax kernel
    where :func:`megatron_fused_softmax_available` allows it, else ``forward_torch_softmax``: the scores cast to fp32
    where ``softmax_in_fp32`` (:func:`megatron_torch_softmax`; half-precision input only), the layer-number scale under
    query-key layer scaling, the causal mask's ``masked_fill`` and torch's softmax (cast back after)."""
    fused = megatron_fused_softmax_available(b.dtype, batch, heads_per_rank, seq, seq)
    softmax_fp32, layer_scale = megatron_torch_softmax(cfg, getattr(b, "framework", "megatron"))
    return dict(scale="scores_mul" if layer_scale and not fused else "none", mask="none" if fused else "where",
                softmax_dtype="fp32" if not fused and softmax_fp32 and b.dtype in ("fp16", "bf16") else None)


def gpt2(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    """GPT-2 as Hugging Face runs it; with ``b.framework`` "megatron"/"megatron-deepspeed" as Megatron-LM runs a GPT
    (fused scale-mask-softmax, fused bias-GeLU, fused bias-dropout-add; Megatron's GPT *is* GPT-2's
    architecture)."""
    fused = getattr(b, "framework", "hf") in ("megatron", "megatron-deepspeed")
    # Megatron-Core's TransformerConfig options a GPT config may set (megatron-core 0.19.2, transformer_config.py):
    # ``qk_layernorm`` (``--qk-layernorm``, default False: the ``normalization`` type, LayerNorm here, over each head's
    # query and key) and ``add_bias_linear`` (``--disable-bias-linear`` sets it False, default True: no bias in any
    # linear layer; the fused bias-GeLU and bias-dropout-add then run without the bias, one kernel each still)
    qk_norm = cfg.flag("qk_layernorm", False)
    lin_bias = cfg.flag("add_bias_linear", True)
    # ``position_embedding_type`` "rope" (``--position-embedding-type rope``): no learned position table (its parameters,
    # gradient and optimizer state go, and the add of it to the word embeddings), rotary embeddings on q and k in every
    # layer instead (hf_blocks.megatron_rope). ``apply_rope_fusion``: Megatron-LM's ``--no-rope-fusion`` is
    # ``store_false`` into ``apply_rope_fusion``, so a rope run is fused unless told (validate_args turns it off only for
    # other position types; megatron-core 0.19.2 megatron/training/arguments.py; TransformerConfig's own default, False,
    # is for direct users of Megatron-Core). Hugging Face's path applies transformers' eager rotary kernels (hf_blocks.rope)
    rotary = gpt_position_embedding(cfg) == "rope"
    rope_fused = cfg.flag("apply_rope_fusion", True)
    # Megatron's fused scale-mask-softmax kernel runs only where FusedScaleMaskSoftmax.is_kernel_available says so
    # (fp16/bf16 input and the shape rules of megatron_fused_softmax_available); elsewhere forward_torch_softmax runs:
    # masked_fill of the causal mask, then torch's softmax (in fp32 between two casts where softmax_in_fp32)
    hl = local_heads(b, cfg.n_heads)
    softmax_kw = megatron_softmax_kwargs(cfg, b, batch, hl, seq) if fused else dict(scale="scores_div", mask="where")
    # ``num_experts`` under --framework megatron: Megatron-Core's MoELayer on every layer (--num-experts,
    # --moe-router-topk as ``num_experts_per_tok``), each expert Megatron-Core's SequentialMLP GeLU MLP of the FFN width
    # (``moe_ffn_hidden_size`` defaults to ``ffn_hidden_size``, megatron/training/arguments.py); under other frameworks
    # an expert count on a GPT is refused (featurize/workload.py), not built dense
    moe = getattr(b, "framework", "hf") == "megatron" and bool(cfg.n_experts)
    h, nh, d = cfg.hidden, cfg.n_heads, cfg.head_dim
    embd_p, attn_p, resid_p = _p(cfg, "embd_pdrop", default=0.1), _p(cfg, "attn_pdrop", default=0.1), _p(cfg, "resid_pdrop", default=0.1)
    ids = b.input((batch, seq), "fp32")
    with b.layer(-1, "transformer.embeddings"):
        x = tok = vocab_embedding(b, ids, cfg.vocab, h, name="wte")
        if not rotary:
            pos = b.embedding(b.input((1, tok.shape[1]), "fp32"), max(cfg.max_positions, seq), h, name="wpe")
            x = b.elementwise("add", tok, pos, name="embed.add")
        x = b.dropout(x, embd_p, name="embed.dropout")
    for i in range(cfg.n_layers):
        with b.layer(i, f"transformer.h.{i}"):
            y = b.layernorm(x, name="ln_1", module="layernorm")
            y = b.tp_enter(y, name="attn.enter")
            qkv = b.linear(y, 3 * h, name="attn.c_attn", parallel="col", bias=lin_bias)
            q = heads(b, Tensor((batch, seq, hl * d), qkv.dtype, qkv.node, qkv.tid), hl, d)
            k = v = q
            if qk_norm:  # Megatron-Core: q_layernorm / k_layernorm on the split heads (SelfAttention.get_query_key_value_tensors)
                q = b.layernorm(q, name="attn.q_layernorm")
                k = b.layernorm(k, name="attn.k_layernorm")
            if rotary and fused:  # Megatron-Core: after the q/k layer norms (SelfAttention.forward)
                q, k = megatron_rope(b, q, k, fused=rope_fused, prefix="attn")
            elif rotary:
                q, k = rope(b, q, "attn.rope.q"), rope(b, k, "attn.rope.k")
            # Megatron: the scale is folded into baddbmm and mask + softmax are one fused kernel
            a = attention(b, q, k, v, impl=impl, causal=True, dropout_p=attn_p, **softmax_kw,
                          strided=(not fused and not rotary,) * 2 + (not fused,))  # rotary q/k: fresh tensors
            core = a
            a = merge_heads(b, a)
            if impl == "flash":  # Megatron-Core: TE's backend may hand linear_proj a view of the output it saves
                b.te_attention_output(q, core, a)
            a = b.tp_exit(b.linear(a, h, name="attn.c_proj", parallel="row", bias=lin_bias), name="attn.exit")
            if not fused:
                a = b.dropout(a, resid_p, name="attn.resid_dropout")
            # Megatron: one fused bias-dropout-add kernel (its dropout mask saved with it)
            x = b.elementwise("add", a, x, name="residual_1")
            if fused:
                b.fused_dropout_mask(x, resid_p)
            y = b.layernorm(x, name="ln_2", module="layernorm")
            if moe:  # Megatron-Core's MoELayer in place of the MLP (its own recompute module)
                with b.tag("moe"):
                    y = _moe(cfg, b, y, batch, seq, megatron=True, expert=_gpt_megatron_expert(lin_bias))
            else:
                with b.tag("mlp"):  # Megatron-Core's recompute module (featurize/recompute.py), its TP collectives
                    y = b.linear(b.tp_enter(y, name="mlp.enter"), cfg.ffn, name="mlp.c_fc", parallel="col",
                                 bias=lin_bias)
                    # Megatron: fused bias-GeLU (one kernel)
                    y = b.elementwise("gelu", y, name="mlp.bias_gelu") if fused else activation(b, y, cfg.activation)
                    y = b.tp_exit(b.linear(y, h, name="mlp.c_proj", parallel="row", bias=lin_bias), name="mlp.exit")
            if not fused:
                y = b.dropout(y, resid_p, name="mlp.dropout")
            x = b.elementwise("add", x, y, name="residual_2")
            if fused:
                b.fused_dropout_mask(x, resid_p)
    with b.layer(cfg.n_layers, "lm_head"):
        x = b.layernorm(x, name="ln_f")
        lm_head_and_loss(b, x, cfg.vocab, tied=cfg.flag("tie_word_embeddings", True), train=b.train, fp32_loss=fused)


# --------------------------------------------------------------------------------------------
# MosaicML MPT
# --------------------------------------------------------------------------------------------

def mpt(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    """MPT as llm-foundry's ``MPTForCausalLM`` runs it: pre-norm blocks with one fused ``Wqkv`` projection
    (grouped-query when the config asks), ALiBi (``attn_config.alibi``: a (1, h, 1, S) bias added to the
    scores in torch attention; FlashAttention-2 takes ALiBi slopes inside its kernel) and/or learned positions
    (``learned_pos_emb``, default true as in ``MPTConfig``),
    a GELU MLP of ``expansion_ratio``, no biases under ``no_bias``, a final norm, and the LM head tied to the
    token embedding. Dropouts follow ``emb_pdrop``, ``resid_pdrop``, ``attn_config.attn_pdrop`` (MPT's
    pretraining configs set them to 0)."""
    alibi = bool_field(_nested(cfg, "attn_config", "alibi"), "attn_config.alibi", cfg.name, False)
    bias = not cfg.flag("no_bias", False)
    h, nh, d = cfg.hidden, cfg.n_heads, cfg.head_dim
    pdrop = _nested(cfg, "attn_config", "attn_pdrop")
    attn_p = 0.0 if pdrop["attn_config.attn_pdrop"] is None else fraction_field(pdrop, "attn_config.attn_pdrop", cfg.name)
    emb_p, resid_p = _p(cfg, "emb_pdrop"), _p(cfg, "resid_pdrop")
    ids = b.input((batch, seq), "fp32")
    hl = local_heads(b, nh)
    kvl = local_heads(b, cfg.n_kv_heads, "key/value heads")
    with b.layer(-1, "transformer.embeddings"):
        x = vocab_embedding(b, ids, cfg.vocab, h, name="wte")
        if cfg.flag("learned_pos_emb", True):  # MPTModel builds ``wpe`` whenever the flag is set, ALiBi or not
            pos = b.embedding(b.input((1, seq), "fp32"), max(cfg.max_positions, seq), h, name="wpe")
            x = b.elementwise("add", x, pos, name="embed.add")
        x = b.dropout(x, emb_p, name="emb_drop")
    for i in range(cfg.n_layers):
        with b.layer(i, f"transformer.blocks.{i}"):
            y = b.tp_enter(b.layernorm(x, name="norm_1", bias=bias, module="layernorm"), name="attn.enter")
            qkv = b.linear(y, (nh + 2 * cfg.n_kv_heads) * d, bias=bias, name="attn.Wqkv", parallel="col")
            q = heads(b, Tensor((batch, seq, hl * d), qkv.dtype, qkv.node, qkv.tid), hl, d)
            kv = heads(b, Tensor((batch, seq, kvl * d), qkv.dtype, qkv.node, qkv.tid), kvl, d)
            if impl != "flash" and kvl != hl:
                kv = repeat_kv(b, kv, hl // kvl, "attn.repeat_kv")
            # llm-foundry 0.22.0 layers/attention.py l. 240: ``torch.softmax(attn_weight, dim=-1)``, in the model's
            # dtype (transformers' own MptAttention upcasts with ``.float()``; this is llm-foundry's)
            a = attention(b, q, kv, kv, impl=impl, causal=True, scale="scores_mul", mask="where", dropout_p=attn_p,
                          strided=(True, True, True), bias_shape=(1, hl, 1, seq) if alibi else None)
            a = merge_heads(b, a)
            a = b.tp_exit(b.linear(a, h, bias=bias, name="attn.out_proj", parallel="row"), name="attn.exit")
            a = b.dropout(a, resid_p, name="resid_attn_dropout")
            x = b.elementwise("add", x, a, name="residual_1")
            y = b.layernorm(x, name="norm_2", bias=bias, module="layernorm")
            with b.tag("mlp"):  # Megatron-Core's recompute module (featurize/recompute.py), its TP collectives with it
                y = b.linear(b.tp_enter(y, name="ffn.enter"), cfg.ffn, bias=bias, name="ffn.up_proj", parallel="col")
                y = activation(b, y, cfg.activation)
                y = b.tp_exit(b.linear(y, h, bias=bias, name="ffn.down_proj", parallel="row"), name="ffn.exit")
            y = b.dropout(y, resid_p, name="resid_ffn_dropout")
            x = b.elementwise("add", x, y, name="residual_2")
    with b.layer(cfg.n_layers, "lm_head"):
        x = b.layernorm(x, name="norm_f", bias=bias)
        # llm-foundry's default loss_fn, flash-attn's Triton cross-entropy on the bf16 logits (llm-foundry 0.22.0
        # models/mpt/modeling_mpt.py l. 1461, 1495-1503): its memory, not PyTorch's fp32 loss's (op_graph.loss_working_bytes)
        lm_head_and_loss(b, x, cfg.vocab, tied=cfg.flag("tie_word_embeddings", True), train=b.train, loss_upcast=False)


# --------------------------------------------------------------------------------------------
# GPT-NeoX (Pythia) and BLOOM
# --------------------------------------------------------------------------------------------

def _partial_rope(b: GraphBuilder, x: Tensor, rot: int, name: str) -> Tensor:
    """apply_rotary_pos_emb on the first ``rot`` dims of each head (GPT-NeoX's ``rotary_pct``), then the
    cat with the untouched dims (a copy of the whole tensor when ``rot`` < head dim)."""
    bs, h, s, d = x.shape
    if rot >= d:
        return rope(b, x, name)
    part = rope(b, Tensor((bs, h, s, rot), x.dtype, x.node, x.tid), name)
    return b.copy(Tensor((bs, h, s, d), part.dtype, part.node, part.tid), name=f"{name}.cat_pass")


def gpt_neox(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    """``GPTNeoXForCausalLM`` (Pythia, GPT-NeoX-20B) as Hugging Face's eager attention runs it: one fused
    ``query_key_value`` projection viewed as (B, heads, S, 3d) and chunked, rotary embeddings on the first
    ``rotary_pct`` of each head, QK^T then scaling, additive causal mask, softmax, PV on the strided value
    chunk, and the parallel residual (``use_parallel_residual``: x + attn(ln1(x)) + mlp(ln2(x))); an untied
    ``embed_out`` unless ``tie_word_embeddings``."""
    h, nh, d = cfg.hidden, cfg.n_heads, cfg.head_dim
    rot = int(d * cfg.fraction("rotary_pct", default=0.25))
    parallel = cfg.flag("use_parallel_residual", True)
    bias = cfg.flag("attention_bias", True)
    attn_p, hid_p = _p(cfg, "attention_dropout"), _p(cfg, "hidden_dropout")
    ids = b.input((batch, seq), "fp32")
    hl = local_heads(b, nh)
    with b.layer(-1, "gpt_neox.embed_in"):
        x = vocab_embedding(b, ids, cfg.vocab, h, name="embed_in")
        x = b.dropout(x, hid_p, name="emb_dropout")
    for i in range(cfg.n_layers):
        with b.layer(i, f"gpt_neox.layers.{i}"):
            y = b.tp_enter(b.layernorm(x, name="input_layernorm", module="layernorm"), name="attention.enter")
            qkv = b.linear(y, 3 * h, bias=bias, name="attention.query_key_value", parallel="col")
            chunk = Tensor((batch, hl, seq, d), qkv.dtype, qkv.node, qkv.tid)  # q/k/v: strided views of qkv
            q = _partial_rope(b, chunk, rot, "rope.q") if rot > 0 else chunk
            k = _partial_rope(b, chunk, rot, "rope.k") if rot > 0 else chunk
            a = attention(b, q, k, chunk, impl=impl, causal=True, scale="scores_mul", mask="add", dropout_p=attn_p,
                          mask_shape=(batch, 1, seq, seq), strided=(rot == 0, rot == 0, True),
                          softmax_fp32=True)  # transformers 5.24.0 gpt_neox l. 158
            a = merge_heads(b, a, name="attention.reshape")
            a = b.tp_exit(b.linear(a, h, bias=bias, name="attention.dense", parallel="row"), name="attention.exit")
            a = b.dropout(a, hid_p, name="post_attention_dropout")
            if not parallel:
                a = x = b.elementwise("add", a, x, name="residual_1")
            m = b.layernorm(x, name="post_attention_layernorm", module="layernorm")
            with b.tag("mlp"):
                m = b.linear(b.tp_enter(m, name="mlp.enter"), cfg.ffn, name="mlp.dense_h_to_4h", parallel="col")
                m = activation(b, m, cfg.activation)
                m = b.tp_exit(b.linear(m, h, name="mlp.dense_4h_to_h", parallel="row"), name="mlp.exit")
            m = b.dropout(m, hid_p, name="post_mlp_dropout")
            if parallel:
                x = b.elementwise("add", b.elementwise("add", m, a, name="residual_mlp_attn"), x, name="residual")
            else:
                x = b.elementwise("add", m, a, name="residual_2")
    with b.layer(cfg.n_layers, "lm_head"):
        x = b.layernorm(x, name="final_layer_norm")
        lm_head_and_loss(b, x, cfg.vocab, tied=cfg.flag("tie_word_embeddings", False), train=b.train)


def _bloom_gelu(b: GraphBuilder, x: Tensor) -> Tensor:
    """``bloom_gelu_forward``: x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x))), nine kernels."""
    sq = b.elementwise("mul", x, x, name="gelu.sq")
    t = b.elementwise("mul", sq, 0.044715, name="gelu.coef")
    t = b.elementwise("add", t, 1.0, name="gelu.one_a")
    t = b.elementwise("mul", x, t, name="gelu.x_inner")
    t = b.elementwise("mul", t, 0.79788456, name="gelu.scale")
    t = b.elementwise("tanh", t, name="gelu.tanh")
    t = b.elementwise("add", t, 1.0, name="gelu.one_b")
    half = b.elementwise("mul", x, 0.5, name="gelu.half")
    return b.elementwise("mul", half, t, name="gelu.out")


def bloom(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    """``BloomForCausalLM`` as Hugging Face runs it: embedding LayerNorm, fused ``query_key_value`` split into
    three strided copies, ALiBi through ``alibi.baddbmm`` (the (B*h, 1, S) bias broadcast into the scores,
    scaled inside the GEMM), additive causal mask, fp32 softmax, PV, BLOOM's tanh GeLU (nine kernels),
    dropout-add residuals, and the LM head tied to the embedding."""
    h, nh = cfg.hidden, cfg.n_heads
    hl = local_heads(b, nh)
    attn_p, hid_p = _p(cfg, "attention_dropout"), _p(cfg, "hidden_dropout")
    post_ln = cfg.flag("apply_residual_connection_post_layernorm", False)
    ids = b.input((batch, seq), "fp32")
    with b.layer(-1, "transformer.word_embeddings"):
        x = vocab_embedding(b, ids, cfg.vocab, h, name="word_embeddings")
        x = b.layernorm(x, name="word_embeddings_layernorm")
    for i in range(cfg.n_layers):
        with b.layer(i, f"transformer.h.{i}"):
            y = b.layernorm(x, name="input_layernorm", module="layernorm")
            res = y if post_ln else x
            y = b.tp_enter(y, name="self_attention.enter")
            qkv = b.linear(y, 3 * h, name="self_attention.query_key_value", parallel="col")
            q = heads(b, Tensor((batch, seq, hl * cfg.head_dim), qkv.dtype, qkv.node, qkv.tid), hl, cfg.head_dim)
            a = attention(b, q, q, q, impl=impl, causal=True, scale="none", mask="add", dropout_p=attn_p,
                          mask_shape=(batch, 1, seq, seq), strided=(True, True, True), bias_shape=(batch, hl, 1, seq),
                          softmax_fp32=True)  # transformers 5.24.0 bloom l. 284
            a = merge_heads(b, a, name="self_attention.merge_heads")
            a = b.tp_exit(b.linear(a, h, name="self_attention.dense", parallel="row"), name="self_attention.exit")
            x = b.elementwise("add", res, b.dropout(a, hid_p, name="attn.dropout"), name="residual_1")
            y = b.layernorm(x, name="post_attention_layernorm", module="layernorm")
            res = y if post_ln else x
            with b.tag("mlp"):
                y = b.linear(b.tp_enter(y, name="mlp.enter"), cfg.ffn, name="mlp.dense_h_to_4h", parallel="col")
                y = _bloom_gelu(b, y)
                y = b.tp_exit(b.linear(y, h, name="mlp.dense_4h_to_h", parallel="row"), name="mlp.exit")
            x = b.elementwise("add", res, b.dropout(y, hid_p, name="mlp.dropout"), name="residual_2")
    with b.layer(cfg.n_layers, "lm_head"):
        x = b.layernorm(x, name="ln_f")
        lm_head_and_loss(b, x, cfg.vocab, tied=cfg.flag("tie_word_embeddings", True), train=b.train)


def falcon(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    """``FalconForCausalLM`` as Hugging Face's eager attention runs it: one ``query_key_value`` projection
    (multi-query for Falcon-7B, ``num_kv_heads`` groups with ``new_decoder_architecture``), rotary embeddings
    on q and k, QK^T / sqrt(d) + additive mask, softmax, PV; attention and MLP in parallel off one LayerNorm
    (two, ``ln_attn``/``ln_mlp``, in the new architecture), ``mlp + attention`` then dropout-add onto the
    residual; biases only with ``bias``; the LM head tied to the embedding."""
    h, nh, nkv, d = cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    bias = cfg.flag("bias", False)
    new_arch = cfg.flag("new_decoder_architecture", False)
    parallel = cfg.flag("parallel_attn", True) or new_arch
    hl, kvl = local_heads(b, nh), local_heads(b, nkv, "key/value heads")
    attn_p, hid_p = _p(cfg, "attention_dropout"), _p(cfg, "hidden_dropout")
    ids = b.input((batch, seq), "fp32")
    with b.layer(-1, "transformer.word_embeddings"):
        x = vocab_embedding(b, ids, cfg.vocab, h, name="word_embeddings")
    for i in range(cfg.n_layers):
        with b.layer(i, f"transformer.h.{i}"):
            ln_a = b.layernorm(x, name="ln_attn" if new_arch else "input_layernorm", module="layernorm")
            y = b.tp_enter(ln_a, name="self_attention.enter")
            qkv = b.linear(y, (nh + 2 * nkv) * d, bias=bias, name="self_attention.query_key_value", parallel="col")
            q = rope(b, Tensor((batch, hl, seq, d), qkv.dtype, qkv.node, qkv.tid), "rope.q")
            k = rope(b, Tensor((batch, kvl, seq, d), qkv.dtype, qkv.node, qkv.tid), "rope.k")
            v = Tensor((batch, kvl, seq, d), qkv.dtype, qkv.node, qkv.tid)
            if impl != "flash" and kvl != hl:
                k, v = repeat_kv(b, k, hl // kvl, "repeat_kv.k"), repeat_kv(b, v, hl // kvl, "repeat_kv.v")
            # transformers 5.24.0 falcon l. 352 (rotary): ``F.softmax(..., dtype=hidden_states.dtype)``, no upcast
            a = attention(b, q, k, v, impl=impl, causal=True, scale="scores_div", mask="add", dropout_p=attn_p,
                          mask_shape=(batch, 1, seq, seq), strided=(False, False, kvl == hl))
            a = merge_heads(b, a, name="self_attention.merge_heads")
            a = b.tp_exit(b.linear(a, h, bias=bias, name="self_attention.dense", parallel="row"), name="self_attention.exit")
            if parallel:
                m_in = b.layernorm(x, name="ln_mlp", module="layernorm") if new_arch else ln_a
                res = x
            else:
                res = x = b.elementwise("add", x, b.dropout(a, attn_p, name="attn.dropout"), name="residual_1")
                m_in = b.layernorm(x, name="post_attention_layernorm", module="layernorm")
            with b.tag("mlp"):
                m = b.linear(b.tp_enter(m_in, name="mlp.enter"), cfg.ffn, bias=bias, name="mlp.dense_h_to_4h",
                             parallel="col")
                m = b.elementwise("gelu", m, name="mlp.act")
                m = b.tp_exit(b.linear(m, h, bias=bias, name="mlp.dense_4h_to_h", parallel="row"), name="mlp.exit")
            if parallel:
                m = b.elementwise("add", m, a, name="mlp_plus_attention")
            x = b.elementwise("add", res, b.dropout(m, hid_p, name="mlp.dropout"), name="residual")
    with b.layer(cfg.n_layers, "lm_head"):
        x = b.layernorm(x, name="ln_f")
        lm_head_and_loss(b, x, cfg.vocab, tied=cfg.flag("tie_word_embeddings", True), train=b.train)


# --------------------------------------------------------------------------------------------
# OPT
# --------------------------------------------------------------------------------------------

def opt(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    h, nh, d = cfg.hidden, cfg.n_heads, cfg.head_dim
    p, attn_p = _p(cfg, "dropout", default=0.1), _p(cfg, "attention_dropout")
    proj = cfg.count("word_embed_proj_dim", default=h)
    pre_ln = cfg.flag("do_layer_norm_before", True)
    ids = b.input((batch, seq), "fp32")
    hl = local_heads(b, nh)
    with b.layer(-1, "model.decoder.embeddings"):
        x = vocab_embedding(b, ids, cfg.vocab, proj, name="embed_tokens")
        if proj != h:
            x = b.linear(x, h, bias=False, name="project_in")
        # causal mask (S, S) and the expanded additive mask (B, 1, S, S), off the gradient path
        b.elementwise("where", b.input((seq, seq)), b.input((seq, seq)), name="causal_mask", grad=False)
        b.elementwise("where", b.input((batch, 1, seq, seq)), b.input((batch, 1, seq, seq)), name="expand_mask", grad=False)
        pos = b.embedding(b.input((batch, x.shape[1]), "fp32"), max(cfg.max_positions, seq) + 2, h, name="embed_positions")
        x = b.elementwise("add", x, pos, name="embed.add")
        x = b.dropout(x, p, name="embed.dropout")
    for i in range(cfg.n_layers):
        with b.layer(i, f"model.decoder.layers.{i}"):
            res = x
            y = b.layernorm(x, name="self_attn_layer_norm", module="layernorm") if pre_ln else x
            y = b.tp_enter(y, name="self_attn.enter")
            q = b.linear(y, h, name="self_attn.q_proj", parallel="col")
            q = b.elementwise("mul", q, 1.0, name="self_attn.q_scale")
            k = b.linear(y, h, name="self_attn.k_proj", parallel="col")
            k = b.copy(k, (batch, hl, seq, d), name="self_attn.k_contiguous")
            v = b.linear(y, h, name="self_attn.v_proj", parallel="col")
            v = b.copy(v, (batch, hl, seq, d), name="self_attn.v_contiguous")
            q = b.copy(q, (batch, hl, seq, d), name="self_attn.q_contiguous")
            a = attention(b, q, k, v, impl=impl, causal=True, scale="none", mask="add", dropout_p=attn_p,
                          mask_shape=(batch, 1, seq, seq), clamp_min=True,
                          softmax_fp32=b.dtype == "fp16")
            # transformers 4.36.2 models/opt/modeling_opt.py OPTAttention.forward, the version whose OPT this graph
            # follows (q_proj(x) * scaling, l. 182; NeuSight's OPT labels ran it): the mask added then
            # ``torch.max(attn_weights, finfo.min)`` (l. 232-235, the clamp) and the softmax upcast for fp16 only
            # (l. 238-242: ``if attn_weights.dtype == torch.float16: softmax(..., dtype=torch.float32)
            # .to(torch.float16) else softmax(...)``); transformers 5.x drops the clamp and upcasts in every dtype
            a = merge_heads(b, a, name="self_attn.reshape")
            a = b.tp_exit(b.linear(a, h, name="self_attn.out_proj", parallel="row"), name="self_attn.exit")
            a = b.dropout(a, p, name="dropout_1")
            x = b.elementwise("add", res, a, name="residual_1")
            if not pre_ln:
                x = b.layernorm(x, name="self_attn_layer_norm")
            res = x
            y = b.layernorm(x, name="final_layer_norm", module="layernorm") if pre_ln else x
            with b.tag("mlp"):
                y = b.linear(b.tp_enter(y, name="mlp.enter"), cfg.ffn, name="fc1", parallel="col")
                y = activation(b, y, cfg.activation)
                y = b.dropout(y, _p(cfg, "activation_dropout"), name="activation_dropout")
                y = b.tp_exit(b.linear(y, h, name="fc2", parallel="row"), name="mlp.exit")
            y = b.dropout(y, p, name="dropout_2")
            x = b.elementwise("add", res, y, name="residual_2")
            if not pre_ln:
                x = b.layernorm(x, name="final_layer_norm")
    with b.layer(cfg.n_layers, "lm_head"):
        if pre_ln and not cfg.flag("_remove_final_layer_norm", False):
            x = b.layernorm(x, name="final_layer_norm")
        if proj != h:
            x = b.linear(x, proj, bias=False, name="project_out")
        lm_head_and_loss(b, x, cfg.vocab, tied=cfg.flag("tie_word_embeddings", True), train=b.train)


# --------------------------------------------------------------------------------------------
# Llama / Mistral / Mixtral
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LlamaVariant:
    """What a Llama-architecture family changes (every field off is plain Llama / Mistral / Qwen2).

    - ``qk_norm``: RMSNorm over each head's query and key before RoPE (Qwen3, Gemma 3);
    - ``fused_qkv`` / ``fused_gate_up``: one projection for q, k, v (one for gate and up) split by views (Phi-3);
    - ``sandwich``: a norm after attention and around the MLP too, four per block (Gemma 2 and 3);
    - ``attn_softcap`` / ``final_softcap``: logits soft-capped as cap * tanh(x / cap) (Gemma 2): three elementwise
      kernels on the S x S scores (eager; fused into the flash kernel) and on the vocabulary logits;
    - ``windows``: per block, the sliding window its attention kernel gets (None: full causal attention), from
      :func:`~wattcast.featurize.hf_config.attention_windows` (Gemma 2's alternating layers, Gemma 3's five local to
      one global, Mistral's every layer, ``layer_types`` where the config gives it), filled in by :func:`llama`;
    - ``gpt_oss``: GptOssAttention's q/k/v/o projections with biases (``attention_bias``, default true), its RoPE
      (:func:`_gpt_oss_rope`) and per-head learned sinks (``num_attention_heads`` parameters: one logit per head
      joined to every row of the scores, :func:`~wattcast.featurize.hf_blocks.eager_attention` with ``sinks``; in the
      flash kernel, FlashAttention-3 / FlexAttention with the sinks as ``s_aux``, one extra logit per query row, no
      kernel of their own)."""

    gemma: bool = False
    qk_norm: bool = False
    fused_qkv: bool = False
    fused_gate_up: bool = False
    sandwich: bool = False
    attn_softcap: float | None = None
    final_softcap: float | None = None
    gpt_oss: bool = False
    windows: tuple[int | None, ...] = ()

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of block ``layer``'s attention, None for full causal attention."""
        return self.windows[layer] if self.windows else None


def _llama_attention(cfg: HFConfig, b: GraphBuilder, x: Tensor, batch: int, seq: int, impl: str,
                     var: LlamaVariant = LlamaVariant(), layer: int = 0) -> Tensor:
    nh, nkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    nhl, nkvl = local_heads(b, nh), served_kv_heads(b, nkv)
    # q/k/v and o_proj biases as the family's transformers modelling file builds them (hf_config.projection_biases)
    biases = projection_biases(cfg)
    bias, o_bias = biases.qkv, biases.o
    x = b.tp_enter(x, name="self_attn.enter")
    if var.fused_qkv:  # Phi-3: one qkv_proj, split into q, k, v by views
        # (the widths per rank times tp: equal to the config's unless vLLM replicates KV heads, hf_blocks.served_kv_heads)
        qkv = b.linear(x, (nhl + 2 * nkvl) * d * b.tp, bias=bias, name="self_attn.qkv_proj", parallel="col")
        bs_, s_ = qkv.shape[0], qkv.shape[1]
        q, k, v = (heads(b, Tensor((bs_, s_, n * d), qkv.dtype, qkv.node, qkv.tid), n, d)
                   for n in (nhl, nkvl, nkvl))
    else:
        q = heads(b, b.linear(x, nh * d, bias=bias, name="self_attn.q_proj", parallel="col"), nhl, d)
        k = heads(b, b.linear(x, nkvl * d * b.tp, bias=bias, name="self_attn.k_proj", parallel="col"), nkvl, d)
        v = heads(b, b.linear(x, nkvl * d * b.tp, bias=bias, name="self_attn.v_proj", parallel="col"), nkvl, d)
    if var.qk_norm:  # Qwen3 / Gemma 3: RMSNorm over the head dim of q and k
        q = rms_norm_eager(b, q, "self_attn.q_norm")
        k = rms_norm_eager(b, k, "self_attn.k_norm")
    rotate = _gpt_oss_rope if var.gpt_oss else rope
    q = rotate(b, q, "rope.q")
    k = rotate(b, k, "rope.k")
    window = var.layer_window(layer)
    kv_len = seq
    if b.kv_context is not None:
        # a KV-cached step: the new keys/values appended to the cache, attention over context + new tokens. A
        # sliding-window layer keeps (and reads) at most its window of past tokens plus the new ones (transformers'
        # SlidingWindowCache / HybridCache hold window tokens per local layer)
        kv_len = b.kv_context + seq
        if window:
            kv_len = min(kv_len, int(window) + seq - 1) if seq > 1 else min(kv_len, int(window))
        k, v = b.kv_cache(k, v, cache_len=kv_len, name="self_attn.kv_cache")
    if impl != "flash":
        k = repeat_kv(b, k, nhl // nkvl, "repeat_kv.k")
        v = repeat_kv(b, v, nhl // nkvl, "repeat_kv.v")
    # v is a transposed view unless repeat_kv copied it; q and k come out of RoPE contiguous
    if impl == "flash":
        a = b.flash_attention(q, k, v, causal=True, name="attn.flash", window=window if kv_len == seq else None)
    else:
        a = eager_attention(b, q, k, v, causal=True, window=window if kv_len == seq else None, scale="scores_mul",
                            mask="add", dropout_p=_p(cfg, "attention_dropout"), mask_shape=(batch, 1, seq, kv_len),
                            strided=(False, False, nhl == nkvl and b.kv_context is None),
                            softcap=var.attn_softcap, sinks=var.gpt_oss,
                            # transformers 5.24.0: softmax(dtype=torch.float32).to(query.dtype) in every Llama-family
                            # eager_attention_forward but gpt-oss's (l. 250: ``dtype=combined_logits.dtype``)
                            softmax_fp32=not var.gpt_oss)
    if var.gpt_oss:
        b.own_params(a, nhl)  # self_attn.sinks: one logit per (local) head, owned by the attention that reads them
    a = merge_heads(b, a, name="self_attn.transpose")
    return b.tp_exit(b.linear(a, cfg.hidden, bias=o_bias, name="self_attn.o_proj", parallel="row"),
                     name="self_attn.exit")


def _swiglu(cfg: HFConfig, b: GraphBuilder, x: Tensor, ffn: int, prefix: str, *, tp_region: bool = True,
            act: str | None = None, fused: bool = False, act_tag: str = "", bias: bool = False) -> Tensor:
    """SwiGLU MLP (GeGLU with ``act``); ``tp_region=False`` when the caller already entered (and will exit) the
    tensor-parallel region; ``fused``: one gate_up_proj of twice the width, split by views (Phi-3); ``act_tag``: the
    recompute module of the activation and product (``moe_act`` in an expert); ``bias``: biased gate/up/down
    projections (Llama's ``mlp_bias``)."""
    if tp_region:
        x = b.tp_enter(x, name=f"{prefix}.enter")
    if fused:
        gu = b.linear(x, 2 * ffn, bias=bias, name=f"{prefix}.gate_up_proj", parallel="col")
        half = (*gu.shape[:-1], gu.shape[-1] // 2)
        g, u = Tensor(half, gu.dtype, gu.node, gu.tid), Tensor(half, gu.dtype, gu.node, gu.tid)
    else:
        g = b.linear(x, ffn, bias=bias, name=f"{prefix}.gate_proj", parallel="col")
        u = b.linear(x, ffn, bias=bias, name=f"{prefix}.up_proj", parallel="col")
    with b.tag(act_tag):
        g = activation(b, g, act or (cfg.activation if cfg.activation != "gelu" else "silu"))
        y = b.elementwise("mul", g, u, name=f"{prefix}.mul")
    y = b.linear(y, cfg.hidden, bias=bias, name=f"{prefix}.down_proj", parallel="row")
    return b.tp_exit(y, name=f"{prefix}.exit") if tp_region else y


def _moe(cfg: HFConfig, b: GraphBuilder, x: Tensor, batch: int, seq: int, *, expert_ffn: int | None = None,
         scoring: str = "softmax", megatron: bool = False, normalise: bool = True, router_bias: bool = False,
         topk_first: bool = False, expert: Callable[..., Tensor] | None = None) -> Tensor:
    """Mixtral sparse MoE block (HF eager: per expert gather, SwiGLU, scale by the routing weight, index_add).

    Expert parallelism (``b.ep``) gives each rank num_experts/ep experts; tokens travel by all-to-all to
    their experts and back. The experts' tensor parallelism (``b.etp`` ranks: the model's tp unless Megatron-Core's
    ``--expert-tensor-parallel-size`` says otherwise) splits each expert's FFN like a dense MLP. ``expert_ffn``: each
    expert's width (default the config's FFN); ``scoring``: the router's softmax, or DeepSeek-V3's sigmoid.

    ``normalise``: the top-k weights renormalised to sum to one (one division; Mixtral always, Qwen-MoE under
    ``norm_topk_prob``; Megatron-Core's router without ``--moe-router-pre-softmax``).

    ``megatron``: Megatron-Core's ``MoELayer`` with the all-to-all token dispatcher and grouped GEMMs
    (``--moe-token-dispatcher-type alltoall --moe-grouped-gemm``, the Mixtral/DeepSeek recipes): the permuted tokens
    are contiguous per expert (no per-expert gather), each local expert's FC1 (gate and up) -> fused SwiGLU -> FC2
    (the grouped GEMM costed as its per-expert GEMMs, one launch each; under FP8, one fused input cast and one
    gradient cast per grouped FC1 and FC2 for all local experts), and one fused unpermute that weights by the
    routing probabilities and sums each token's top-k rows (``moe_unpermute``).

    gpt-oss (GptOssTopKRouter, GptOssExperts): ``router_bias``: the router ``Linear`` has a bias (named ``moe.router``,
    HF's ``mlp.router``); ``topk_first``: top-k on the logits, then the softmax over the k chosen values ((tokens, k):
    the weights sum to one, nothing to renormalise; the top-k values carry the gradient back to the logits);
    ``expert``: each expert's layers, ``expert(cfg, b, rows, ffn, prefix)`` in place of the SwiGLU (Hugging Face path)."""
    n_exp, top_k = cfg.n_experts, cfg.experts_per_token  # checked: positive integers, top_k <= n_exp
    ffn = expert_ffn or cfg.ffn
    if n_exp % b.ep:
        raise GraphError(f"{n_exp} experts are not divisible by expert parallelism {b.ep}")
    h = cfg.hidden
    t = x.numel // h  # this rank's tokens (a sequence shard under sequence parallelism)
    flat = b.view(x, (t, h))
    # the router stays in bf16
    logits = b.linear(flat, n_exp, bias=router_bias, name="moe.router" if router_bias else "moe.gate", fp8=False)
    if fused_moe_layer(b, megatron=megatron, expert=expert):
        out = _moe_vllm_fused(cfg, b, flat, logits, n_exp, top_k, ffn, normalise=normalise)
        return Tensor(x.shape, out.dtype, out.node, out.tid)
    if topk_first:  # gpt-oss: softmax over the top-k logits
        top = b.opaque("moe.topk", [logits], (t, top_k), flops=float(t * n_exp), op_class="other")
        w = b.softmax(top, name="moe.router_softmax")
    else:
        probs = (b.elementwise("sigmoid", logits, name="moe.router_sigmoid") if scoring == "sigmoid"
                 else b.softmax(logits, name="moe.router_softmax"))
        b.opaque("moe.topk", [probs], (t, top_k), flops=float(t * n_exp), op_class="other", grad=False)
        w = Tensor((t, top_k), probs.dtype, probs.node, probs.tid)
    if normalise and not topk_first:
        w = b.elementwise("div", w, b.input((t, 1)), name="moe.normalise")
    if megatron and b.moe_dispatcher == "allgather":
        b.routed_moe = True
        out = _moe_allgather(cfg, b, flat, w, n_exp, top_k, ffn, expert)
        return Tensor(x.shape, out.dtype, out.node, out.tid)
    # routing: every expert gets tokens * top_k / n_experts tokens when balanced; ``b.moe_load`` scales what this rank's
    # experts receive (the busiest expert-parallel rank, or capacity padding: simulate/moe_routing.py)
    routed = b.copy(Tensor((t * top_k, h), flat.dtype, flat.node, flat.tid), name="moe.permute")
    b.routed_moe = True
    if b.moe_pad:  # every expert's capacity, reached or not: capacity x experts rows (token_dispatcher.py l. 493)
        routed = Tensor((padded_expert_rows(t, top_k, n_exp, b.moe_load, "alltoall") * n_exp, h), routed.dtype,
                        routed.node, routed.tid)
    elif b.moe_load != 1.0:
        routed = Tensor((max(1, round(t * top_k * b.moe_load)), h), routed.dtype, routed.node, routed.tid)
    if b.ep > 1:  # in FP8 under DeepSeek-V3's storage (GraphBuilder.all_to_all)
        routed = b.all_to_all(routed, name="moe.dispatch", fp8=True)
    with b.expert_tp():  # the experts' tensor parallelism (etp ranks; tp unless --expert-tensor-parallel-size)
        combined = _moe_experts(cfg, b, routed, n_exp, ffn, megatron, expert, top_k=top_k, tokens=t)
    if b.ep > 1:
        combined = b.all_to_all(combined, name="moe.combine")
    # back to this rank's own tokens' top-k rows; padded, the unpermute scatter-adds every padded row (megatron-core
    # 0.16.1 moe_utils.py ``unpermute`` l. 425-466 under drop_and_pad: capacity x experts rows, whatever the factor)
    if b.moe_load != 1.0 and not b.moe_pad:
        combined = Tensor((t * top_k, h), combined.dtype, combined.node, combined.tid)
    if megatron:
        out = b.reduction(combined, (t, h), name="moe.unpermute")  # weights and sums each token's top-k rows
        return Tensor(x.shape, out.dtype, out.node, out.tid)
    combined = b.elementwise("mul", combined, Tensor((t * top_k, 1), w.dtype, w.node, w.tid), name="moe.weight")
    out = b.reduction(combined, (t, h), name="moe.index_add")
    return Tensor(x.shape, out.dtype, out.node, out.tid)


def fused_moe_layer(b: GraphBuilder, *, megatron: bool, expert: Callable[..., Tensor] | None) -> bool:
    """Whether a MoE layer is built as vLLM's fused MoE (:func:`_moe_vllm_fused`): the graph is a vLLM serving step
    (``b.fused_moe``: ``StepOptions.fused_moe``, set by the serving and TP-inference paths), the layer is Hugging
    Face's (not Megatron-Core's), its experts are the SwiGLU ones (Mixtral, Qwen2-MoE, Qwen3-MoE; gpt-oss's clamped,
    biased experts run vLLM's other MoE back-ends over MXFP4 weights: not modelled, its Hugging Face loop kept) and not
    padded to capacity (a Megatron-Core option)."""
    return b.fused_moe and not megatron and expert is None and not b.moe_pad


def _moe_vllm_fused(cfg: HFConfig, b: GraphBuilder, flat: Tensor, logits: Tensor, n_exp: int, top_k: int, ffn: int,
                    *, normalise: bool) -> Tensor:
    """A MoE layer as vLLM's ``FusedMoE`` runs it (vllm/model_executor/layers/fused_moe: ``fused_topk`` then
    ``fused_experts``), on this rank's ``flat`` (t, h) tokens and the router's ``logits`` (t, n) (the replicated gate
    GEMM, built by the caller): kernels, in order,

    - ``topk_softmax``: softmax over the experts and top-k in one CUDA kernel (``fused_topk``), writing the (t, k)
      weights (fp32) and expert ids (int32); the renormalisation of the k weights (``renormalize``: Mixtral, Qwen-MoE
      under ``norm_topk_prob``) one division kernel;
    - ``moe_align_block_size``: sorts the t x k (token, expert) pairs by expert (padded per expert to the kernel's
      block of rows; the padding is not costed: masked rows of a weight-bound kernel read no extra weights);
    - ``invoke_fused_moe_kernel`` for w13 (gate and up fused, 2 x ffn / tp columns): ONE launch over every routed
      pair, each active expert's weights read once (:meth:`GraphBuilder.grouped_linear`: one batched GEMM of
      B = active experts, M = their mean routed rows, B x M = the t x k pairs (:func:`expert_row_split`);
      :func:`active_local_experts` of n (1 - (1 - k/n)^t) hit);
    - ``silu_and_mul``: one kernel, (t k, 2 ffn / tp) -> (t k, ffn / tp);
    - ``invoke_fused_moe_kernel`` for w2 (ffn / tp -> hidden, the routing weights multiplied in its epilogue,
      ``mul_routed_weight``): one launch;
    - ``moe_sum``: each token's k rows summed, one kernel;
    - the tensor-parallel all-reduce of the partial sums (``FusedMoE``'s ``reduce_results``), as a row-parallel layer.

    Experts are split by tensor parallelism on their intermediate dim (w13 by columns, w2 by rows), as vLLM shards
    them without expert parallelism. Nothing is copied to permute the tokens: the kernel reads them through the sorted
    ids. The idle experts' weights stay resident, not read."""
    h = cfg.hidden
    t = flat.shape[0]
    b.routed_moe = b.fused_moe_built = True
    b.opaque("moe.topk_softmax", [logits], (t, top_k), flops=float(t * n_exp), op_class="other", grad=False,
             bytes_=float(logits.nbytes + t * top_k * (4 + 4)))  # fp32 weights and int32 ids out
    w = b.input((t, top_k), "fp32")
    if normalise:
        w = b.elementwise("div", w, b.input((t, 1), "fp32"), name="moe.normalise")
    # sorted token ids, expert ids per block, padded count: int32 reads and writes of the t x k pairs
    b.opaque("moe.align_block_size", [w], (t * top_k,), flops=float(t * top_k), op_class="other", grad=False,
             bytes_=float(3 * t * top_k * 4))
    rows = max(1, round(t * top_k * b.moe_load))  # the routed (token, expert) pairs
    active = min(active_local_experts(n_exp, top_k, t, 1), rows)
    with b.expert_tp():
        x = b.tp_enter(flat, name="moe.enter")
        # all ``rows`` pairs over the active experts (expert_row_split): one launch, its rows summed over the groups
        gu = b.grouped_linear(x, active, rows, 2 * ffn, name="moe.experts.w13", parallel="col")
        with b.tag("moe_act"):
            y = b.glu(gu, name="moe.silu_and_mul")
        y = b.grouped_linear(y, active, rows, h, name="moe.experts.w2", parallel="row")
        ffn_local = gu.shape[-1] // 2  # this rank's share of each expert's intermediate dim
        # the idle experts' w13 (h x 2 ffn_local) and w2 (ffn_local x h): resident on this rank, not read
        b.own_params(gu, (n_exp - active) * h * 2 * ffn_local)
        b.own_params(y, (n_exp - active) * ffn_local * h)
        out = b.reduction(y, (t, h), name="moe.sum", grad=False)
        return b.tp_exit(out, name="moe.exit")


def expected_experts_hit(n_experts: int, top_k: int, tokens: int) -> float:
    """Expected number of distinct experts that ``tokens`` tokens, each routed to ``top_k`` of ``n_experts`` experts,
    reach under uniform routing: ``n (1 - (1 - k/n)^T)``. Derivation: a token picks k distinct experts of n uniformly,
    so it misses a given expert with probability 1 - k/n; the T tokens route independently, so the expert receives
    none with probability (1 - k/n)^T, and by linearity of expectation n (1 - (1 - k/n)^T) experts receive some.
    T = 1: exactly k; T k >> n: n (Qwen3-30B-A3B, 128 experts top-8: 8.0 at T 1, 51.6 at T 8, 128 - 8e-6 at T 256)."""
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)


def padded_expert_capacity(tokens: int, top_k: int, n_experts: int, capacity_factor: float) -> int:
    """Rows each expert takes from one rank's ``tokens`` under Megatron-Core's ``--moe-pad-expert-input-to-capacity``:
    its capacity, ``ceil(tokens x top_k / n_experts x capacity_factor)`` (megatron-core 0.16.1
    ``transformer/moe/moe_utils.py`` ``get_capacity`` l. 193-211, called on the rank's ``num_tokens x topk`` by the
    router's ``apply_router_token_dropping`` l. 832-836 and the all-to-all dispatcher's ``preprocess`` under
    ``drop_and_pad``, ``token_dispatcher.py`` l. 485-505: each local expert then gets ``capacity x tp x ep`` rows,
    ``num_out_tokens = capacity x num_experts``). Padded, every expert runs on that many rows whether or not a token
    chose it (the router's ``final_map`` is the capacity mask itself, ``moe_utils.py`` l. 854-856), so at small token
    counts (decode) every expert runs: Qwen3-30B-A3B (128 experts, top 8) at one token, capacity factor 1: 1 row each
    of all 128, where unpadded ~8 experts run (:func:`active_local_experts`)."""
    return max(1, math.ceil(tokens * top_k / n_experts * capacity_factor))


def padded_expert_rows(tokens: int, top_k: int, n_experts: int, capacity_factor: float, dispatcher: str) -> int:
    """Rows one expert takes from each source rank's ``tokens`` under ``--moe-pad-expert-input-to-capacity``, per
    Megatron-Core's token dispatcher (megatron-core 0.16.1). Both start from the same router: the capacity
    (:func:`padded_expert_capacity`) and a routing map that is the capacity mask (``moe_utils.py``
    ``apply_router_token_dropping`` l. 832-856: all ``tokens`` rows of every expert's column when the capacity exceeds
    them, l. 838-840, else the capacity's top rows). The dispatchers then size the expert input differently:

    - ``"alltoall"``: the capacity itself, uncapped. ``token_dispatcher.py`` ``preprocess`` l. 485-505 sets
      ``num_out_tokens = capacity x num_experts`` and every split to the capacity, and ``dispatch_postprocess`` views
      the received tokens as ``(tp x ep, local experts, capacity, h)`` (l. 708-715): the permuted buffer has capacity
      rows per expert even where the rank has fewer tokens (TE's fused permute allocates ``num_out_tokens`` rows; the
      unfused ``permute``, ``moe_utils.py`` l. 339-360, keeps ``min(capacity, tokens)`` indices and its
      ``view(num_experts, capacity)`` then fails, so a capacity above the tokens runs only fused).
    - ``"allgather"``: the capacity mask's count, ``min(capacity, tokens)``: ``MoEAllGatherTokenDispatcher``
      ``dispatch_postprocess`` l. 289-301 takes ``tokens_per_expert = local_map.sum(dim=0)`` and permutes without
      ``drop_and_pad`` (no capacity-sized buffer).

    Mixtral 8x7B (8 experts, top 2), one token a rank, factor 5: capacity ceil(1 x 2 / 8 x 5) = 2; all-to-all 2 rows,
    all-gather 1."""
    capacity = padded_expert_capacity(tokens, top_k, n_experts, capacity_factor)
    if dispatcher == "alltoall":
        return capacity
    if dispatcher == "allgather":
        return min(capacity, tokens)
    raise GraphError(f"unknown MoE token dispatcher {dispatcher!r} (alltoall or allgather)")


def active_local_experts(n_experts: int, top_k: int, tokens: int, ep: int) -> int:
    """How many of one expert-parallel rank's ``n_experts / ep`` local experts run a kernel when ``tokens`` tokens (the
    whole expert-parallel group's, each rank's experts seeing every token's choice) route ``top_k`` of ``n_experts``:
    its share of :func:`expected_experts_hit`, rounded to the nearest whole expert (halves up), at least one (the
    rank's dispatch and combine still run) and at most all of them. Real frameworks touch only those: transformers'
    Qwen3-MoE / Mixtral loop over ``expert_hit`` (experts with a token; modeling_qwen3_moe.py, modeling_mixtral.py),
    vLLM's fused MoE reads only the routed experts' weights; Megatron-Core's ``SequentialMLP`` runs a zero-token expert
    on empty tensors (megatron-core 0.16.1 experts.py l. 910-923) and its grouped GEMM gets an m_split of 0 (taken to
    read no weights; Transformer Engine's grouped GEMM not checked here). Training-size T (T k >> n) gives every local
    expert: the graph as before."""
    local = n_experts // ep
    return min(local, max(1, math.floor(local * expected_experts_hit(n_experts, top_k, tokens) / n_experts + 0.5)))


def _moe_experts(cfg: HFConfig, b: GraphBuilder, routed: Tensor, n_exp: int, ffn: int, megatron: bool,
                 expert: Callable[..., Tensor] | None = None, *, top_k: int, tokens: int) -> Tensor:
    """The routed experts of one rank on the rows it received (after the expert-parallel dispatch): the dispatcher's
    gather over the expert-tensor-parallel group, the local experts, its scatter back; inside
    :meth:`GraphBuilder.expert_tp`, so ``b.tp`` is the experts' degree. ``expert``: a Hugging Face expert other than
    the SwiGLU (gpt-oss's, :func:`_gpt_oss_expert`). ``tokens``: this rank's tokens before the gather (``top_k`` routed
    rows each): only the local experts they are expected to reach run (:func:`active_local_experts`)."""
    h = cfg.hidden
    # under sequence parallelism: gathers every shard's tokens, which the experts keep for backward (the gather is the
    # dispatcher's, Megatron-Core's gather_from_sequence_parallel_region, not their linear layers')
    received = routed.shape[0]
    routed = b.tp_enter(routed, name="moe.enter", saved_sharded=False)
    rows = routed.shape[0]
    local = n_exp // b.ep
    # the tokens whose choices reach this rank's experts: every expert-parallel rank's, after the expert-TP gather
    # (padded to capacity: every local expert, on its capacity's rows)
    active = local if b.moe_pad else active_local_experts(n_exp, top_k, tokens * (rows // received) * b.ep, b.ep)
    active = min(active, rows)  # an expert that runs takes at least one of the rank's rows
    # the received rows come grouped by source rank: Megatron-Core's dispatcher re-sorts them by local expert
    # (sort_chunks_by_idxs) before the grouped GEMM, and back before the combine
    sort_chunks = megatron and b.ep > 1 and local > 1
    if sort_chunks:
        routed = b.copy(routed, name="moe.sort_chunks")
    if megatron and expert is None:
        b.contiguous_grad(routed)  # the grouped GEMM's input gradient is one buffer
    outs = []
    for e, per in enumerate(expert_row_split(rows, active)):
        mark = b.node_mark
        with b.scope(f"moe.experts.{e}"):
            if megatron and expert is not None:  # Megatron-Core's SequentialMLP: each local expert on its contiguous rows
                ye = expert(cfg, b, Tensor((per, h), routed.dtype, routed.node, routed.tid), ffn, f"experts.{e}")
            elif megatron:  # under FP8: the first expert's FC1 and FC2 carry their grouped linear's one fused cast
                ye = _swiglu_megatron(b, Tensor((per, h), routed.dtype, routed.node, routed.tid), ffn, h, f"experts.{e}",
                                      act_tag="moe_act", fp8_cast_gemms=active if e == 0 else 0, moe_swiglu=True)
            else:
                xe = b.copy(Tensor((per, h), routed.dtype, routed.node, routed.tid), name=f"experts.{e}.index")
                ye = (expert(cfg, b, xe, ffn, f"experts.{e}") if expert is not None
                      else _swiglu(cfg, b, xe, ffn, f"experts.{e}", tp_region=False, act_tag="moe_act"))
            outs.append(ye)
    b.hold_params(mark, local - active)  # the idle experts' weights: resident, not read
    combined = _sequential_cat(b, outs, rows, h, megatron and expert is not None)
    if sort_chunks:
        combined = b.copy(combined, name="moe.unsort_chunks")
    return b.tp_exit(combined, name="moe.exit", fp8_grad=False)  # the dispatcher's gather, in bf16


def expert_row_split(rows: int, active: int) -> list[int]:
    """The rows each of a rank's ``active`` running experts takes of the ``rows`` (token, expert) pairs it received:
    ``rows // active`` each and one more on the first ``rows % active``, so that they add up to ``rows`` exactly (every
    routed pair is computed once; per-expert rounding did not conserve them: Qwen3-30B-A3B's 16 tokens x top-8 = 128
    pairs over 82 experts came out 164 rows, gpt-oss-120b's 512 over 126 experts 504). Every local expert running
    (a training micro-batch, T k >> n): ``rows x ep / n_experts`` each when that divides, the balanced share; the
    busiest rank's or the padded rows (``b.moe_load``, :func:`padded_expert_rows`) split the same way. Balanced:
    which experts take the extra row is not modelled (the first ones, the same kernels either way)."""
    if active < 1 or rows < active:
        raise GraphError(f"{rows} routed rows cannot keep {active} experts running (each takes at least one row)")
    base, extra = divmod(int(rows), int(active))
    return [base + 1] * extra + [base] * (active - extra)


def _sequential_cat(b: GraphBuilder, outs: list[Tensor], rows: int, h: int, sequential: bool) -> Tensor:
    """The local experts' outputs as one (rows, h) tensor: Megatron-Core's ``SequentialMLP`` cats them
    (``torch.cat(output_local_list)``, megatron-core 0.16.1 experts.py l. 911-925: one copy kernel, its backward the
    split's views); the grouped GEMM and the Hugging Face loop write them in place."""
    last = outs[-1]
    combined = Tensor((rows, h), last.dtype, last.node, last.tid)
    if sequential and len(outs) > 1:
        combined = b.copy(combined, name="moe.experts_cat")
    return combined


def _moe_allgather(cfg: HFConfig, b: GraphBuilder, flat: Tensor, w: Tensor, n_exp: int, top_k: int, ffn: int,
                   expert: Callable[..., Tensor] | None) -> Tensor:
    """Megatron-Core's ``MoEAllGatherTokenDispatcher`` (``--moe-token-dispatcher-type allgather``, TransformerConfig's
    default; megatron-core 0.16.1 megatron/core/transformer/moe/token_dispatcher.py l. 208-345) around the local experts,
    on this rank's ``flat`` (t, h) tokens (a sequence shard under sequence parallelism) and router weights ``w``.

    Over the ``tp_ep`` group (the expert-TP x expert-parallel ranks, g = etp x ep; l. 72, 256-278), when g > 1: three
    all-gathers, of the routing map ((t, E) bools, 1 B each; under ``no_grad``), of the probabilities ((t, E) in the
    router's dtype, ``type_as(logits)``: moe_utils.py l. 711-721; backward a reduce-scatter) and of the hidden states
    ((t, h); backward a reduce-scatter): every rank then holds the group's t x g tokens. ``dispatch_postprocess``
    (l. 280-308): the local experts' columns of the map and of the probabilities made contiguous (two copies), the
    tokens per expert summed (a reduction; its ``.cpu()`` is a host sync, not costed), and ``permute`` unfused
    (``moe_permute_fusion`` False by default, transformer_config.py l. 708; moe_utils.permute: the map transposed
    (a copy), the token indices ``masked_select``-ed, the rows ``index_select``-ed: t x g x top_k / ep rows when
    balanced, scaled by ``b.moe_load``), and the probabilities ``.T.contiguous().masked_select`` (a copy and a
    select). The local experts (:func:`_moe_experts`' loop, without its TP gather and scatter: the gather above
    already spans the expert-TP ranks, each expert's FC1/FC2 split over etp) take the permuted rows.
    ``combine_preprocess`` (l. 310-326): ``unpermute`` unfused, without probabilities (the experts applied them):
    a zeroed (t x g, h) output and an ``index_add`` of the rows into it; ``token_combine`` (l. 328-341): a
    reduce-scatter of that (t x g, h) tensor over ``tp_ep`` in the probabilities' dtype, back to (t, h) (backward an
    all-gather): it sums the expert-TP partial sums and returns each rank its own tokens."""
    h, db = cfg.hidden, b.dbytes
    t = flat.shape[0]
    g = b.etp * b.ep  # the tp_ep group (token_dispatcher.py l. 72: pg_collection.tp_ep)
    local = n_exp // b.ep
    probs = Tensor((t, n_exp), w.dtype, w.node, w.tid)  # the router's (t, E) probabilities (zeros off the top-k)
    hidden = flat
    if g > 1:  # token_dispatch, l. 259-278
        gathered = t * g
        b.collective("all_gather", probs, (gathered, n_exp), group="tp_ep", size_bytes=float(gathered * n_exp),
                     name="moe.dispatch.routing_map.all_gather", grad=False)  # torch.bool: 1 B an element
        probs = b.collective("all_gather", probs, (gathered, n_exp), group="tp_ep",
                             size_bytes=float(gathered * n_exp * db), name="moe.dispatch.probs.all_gather",
                             backward=[("reduce_scatter", float(gathered * n_exp * db))])
        hidden = b.collective("all_gather", flat, (gathered, h), group="tp_ep", size_bytes=float(gathered * h * db),
                              name="moe.dispatch.all_gather", backward=[("reduce_scatter", float(gathered * h * db))])
    tg = hidden.shape[0]
    # dispatch_postprocess, l. 287-308
    local_map = b.copy(Tensor((tg, local), probs.dtype, probs.node, probs.tid), name="moe.local_map", grad=False)
    local_probs = b.copy(Tensor((tg, local), probs.dtype, probs.node, probs.tid), name="moe.local_probs")
    b.reduction(local_map, (local,), name="moe.tokens_per_expert", grad=False)
    map_t = b.copy(local_map, (local, tg), name="moe.permute.map_transpose", grad=False)  # moe_utils.permute
    b.opaque("moe.permute.masked_select", [map_t], (tg * top_k * local // n_exp,), flops=float(tg * local),
             op_class="other", grad=False)
    rows = max(1, round(tg * top_k * b.moe_load / b.ep))  # rows routed to this rank's experts
    if b.moe_pad:
        # padded to capacity: each expert takes the capacity mask's rows of every source rank (padded_expert_rows)
        rows = local * g * padded_expert_rows(t, top_k, n_exp, b.moe_load, "allgather")
    routed = b.copy(Tensor((rows, h), hidden.dtype, hidden.node, hidden.tid), name="moe.permute")  # index_select
    probs_t = b.copy(local_probs, (local, tg), name="moe.local_probs_transpose")
    b.opaque("moe.local_probs.masked_select", [probs_t, map_t], (rows,), flops=float(tg * local), op_class="other")
    with b.expert_tp():  # each expert's linears split over etp; no gather of their own
        # the gathered tokens reach this rank's experts (padded to capacity: all of them)
        active = local if b.moe_pad else min(active_local_experts(n_exp, top_k, tg, b.ep), rows)
        outs = []
        for e, per in enumerate(expert_row_split(rows, active)):  # rows / local each when every local expert runs
            mark = b.node_mark
            with b.scope(f"moe.experts.{e}"):
                xe = Tensor((per, h), routed.dtype, routed.node, routed.tid)
                outs.append(expert(cfg, b, xe, ffn, f"experts.{e}") if expert is not None
                            else _swiglu_megatron(b, xe, ffn, h, f"experts.{e}", act_tag="moe_act",
                                                  fp8_cast_gemms=active if e == 0 else 0, moe_swiglu=True))
        b.hold_params(mark, local - active)  # the idle experts' weights: resident, not read
        if expert is None:
            b.contiguous_grad(routed)  # the grouped GEMM's input gradient is one buffer
        combined = _sequential_cat(b, outs, rows, h, expert is not None)
    # combine_preprocess, l. 310-326: unpermute into a zeroed (t x g, h) tensor
    # torch.zeros: one fill kernel, costed as a copy of its (t x g, h) bytes
    b.copy(Tensor((tg, h), combined.dtype, combined.node, combined.tid), name="moe.unpermute.zeros", grad=False)
    out = b.reduction(combined, (tg, h), name="moe.unpermute.index_add")
    if g > 1:  # token_combine, l. 328-341
        out = b.collective("reduce_scatter", out, (t, h), group="tp_ep", size_bytes=float(tg * h * db),
                           name="moe.combine.reduce_scatter", backward=[("all_gather", float(tg * h * db))])
    return out


def _gpt_megatron_expert(lin_bias: bool) -> Callable[..., Tensor]:
    """One expert of Megatron-Core's ``SequentialMLP`` in a GPT (``MLP`` with GeLU, megatron-core 0.16.1
    megatron/core/transformer/mlp.py ``MLP.forward``): ``linear_fc1`` (column-parallel over the expert-TP ranks,
    ``skip_bias_add``), the bias add and GeLU, the routing probabilities multiplied in (``per_token_scale``; the fused
    bias-GeLU takes no ``per_token_scale``: "Only support fusion of swiglu and quick_gelu with per_token_scale"),
    ``linear_fc2`` (row-parallel), and its bias scaled by the probabilities and added (``output += output_bias *
    per_token_scale``: a multiply and an add)."""
    def expert(cfg: HFConfig, b: GraphBuilder, x: Tensor, ffn: int, prefix: str) -> Tensor:
        y = b.linear(x, ffn, name=f"{prefix}.linear_fc1", parallel="col", bias=False)
        if lin_bias:
            y = b.elementwise("add", y, b.input((y.shape[-1],)), name=f"{prefix}.fc1_bias")
        with b.tag("moe_act"):
            y = b.elementwise("gelu", y, name=f"{prefix}.gelu")
            y = b.elementwise("mul", y, b.input((x.shape[0], 1)), name=f"{prefix}.probs_mul")
        y = b.linear(y, cfg.hidden, name=f"{prefix}.linear_fc2", parallel="row", bias=False)
        if lin_bias:
            sb = b.elementwise("mul", b.input((x.shape[0], 1)), b.input((cfg.hidden,)), name=f"{prefix}.fc2_bias_scale")
            y = b.elementwise("add", y, sb, name=f"{prefix}.fc2_bias_add")
        return y
    return expert


def _dense_mlp(cfg: HFConfig, b: GraphBuilder, x: Tensor, ffn: int, prefix: str, megatron: bool,
               moe_swiglu: bool = False) -> Tensor:
    """A dense SwiGLU MLP of width ``ffn`` in its tensor-parallel region: Hugging Face's gate/up/down projections, or
    Megatron-Core's ``MLP`` (one ``linear_fc1``, the fused SwiGLU, ``linear_fc2``); DeepSeek's dense blocks and shared
    experts, Qwen2-MoE's shared expert."""
    if not megatron:
        return _swiglu(cfg, b, x, ffn, prefix)
    return b.tp_exit(_swiglu_megatron(b, b.tp_enter(x, name=f"{prefix}.enter"), ffn, cfg.hidden, prefix,
                                      moe_swiglu=moe_swiglu), name=f"{prefix}.exit")


def _gated_shared_expert(cfg: HFConfig, b: GraphBuilder, x: Tensor, ffn: int, megatron: bool) -> Tensor:
    """Qwen2-MoE's shared expert: a SwiGLU of ``ffn`` on every token, scaled by sigmoid(``shared_expert_gate``, a
    Linear(hidden, 1) without bias) (Qwen2MoeSparseMoeBlock; Megatron-Core's ``SharedExpertMLP`` with
    ``--moe-shared-expert-gate``: its ``gate_weight`` on this rank's tokens, replicated over TP, not an FP8 GEMM)."""
    prefix = "mlp.shared_experts" if megatron else "mlp.shared_expert"
    with b.tag("shared_experts"):
        y = _dense_mlp(cfg, b, x, ffn, prefix, megatron)
        g = b.linear(x, 1, bias=False, name=f"{prefix}.gate" if megatron else "mlp.shared_expert_gate", fp8=False)
        g = b.elementwise("sigmoid", g, name=f"{prefix}.gate_sigmoid")
        return b.elementwise("mul", y, g, name=f"{prefix}.gate_mul")


def _moe_block(cfg: HFConfig, b: GraphBuilder, x: Tensor, batch: int, seq: int, *, megatron: bool = False) -> Tensor:
    """The sparse block of a Mixtral or Qwen-MoE layer (``x``: the post-attention norm's output): the routed experts
    (:func:`_moe`; Qwen's of ``moe_intermediate_size``, renormalised only under ``norm_topk_prob``), plus Qwen2-MoE's
    gated shared expert of ``shared_expert_intermediate_size`` added to their output."""
    if cfg.family not in QWEN_MOE_FAMILIES:
        return _moe(cfg, b, x, batch, seq, megatron=megatron)
    y = _moe(cfg, b, x, batch, seq, expert_ffn=cfg.count("moe_intermediate_size"), megatron=megatron,
             normalise=cfg.flag("norm_topk_prob", False))
    if cfg.family == "qwen2_moe":
        sh = _gated_shared_expert(cfg, b, x, cfg.count("shared_expert_intermediate_size"), megatron)
        y = b.elementwise("add", y, sh, name="mlp.shared_add")
    return y


def llama(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str, moe: bool = False,
          var: LlamaVariant = LlamaVariant()) -> None:
    """Llama / Mistral / Qwen2 (and Mixtral and Qwen-MoE with ``moe``: :func:`_moe_block` on the layers
    ``cfg.moe_layer`` names; Gemma, Qwen3, Phi-3, Gemma 2 and 3 with ``var``, see :class:`LlamaVariant`) as Hugging
    Face runs them.

    Gemma differs by: the embedding scaled by sqrt(hidden) (one scalar multiply), a GeGLU MLP with the tanh
    GELU (``hidden_activation``, default ``gelu_pytorch_tanh``, whatever ``hidden_act`` says), RMSNorm weights
    applied as (1 + w) (a hidden-sized add, costed with the norm) and the LM head tied to the embedding."""
    gemma = var.gemma
    windows = attention_windows(cfg)  # Gemma 2/3's local layers, Mistral's, Mixtral's, Phi-3's, Qwen2's windows
    if any(windows):
        var = replace(var, windows=windows)
    ids = b.input((batch, seq), "fp32")
    with b.layer(-1, "model.embed_tokens"):
        x = vocab_embedding(b, ids, cfg.vocab, cfg.hidden, name="embed_tokens")
        if gemma:
            x = b.elementwise("mul", x, float(cfg.hidden) ** 0.5, name="embed_tokens.normalizer")
    act = None
    if gemma:
        act = cfg.get("hidden_activation")
        if act is None:
            act = "gelu_pytorch_tanh"
        elif not isinstance(act, str):
            raise GraphError(f"{cfg.name}: field 'hidden_activation' must be an activation name, got {act!r}")
    for i in range(cfg.n_layers):
        with b.layer(i, f"model.layers.{i}"):
            y = rms_norm_eager(b, x, "input_layernorm", module="layernorm")
            a = _llama_attention(cfg, b, y, batch, seq, impl, var, i)
            if var.sandwich:  # Gemma 2/3: the attention output is normalised before the residual add
                a = rms_norm_eager(b, a, "post_attention_layernorm")
            x = b.elementwise("add", x, a, name="residual_1")
            y = rms_norm_eager(b, x, "pre_feedforward_layernorm" if var.sandwich else "post_attention_layernorm",
                               module="layernorm")
            sparse = moe and cfg.moe_layer(i)  # Qwen-MoE: dense MLPs between the sparse blocks
            with b.tag("moe" if sparse else "mlp"):  # Megatron-Core's recompute modules (featurize/recompute.py)
                y = (_moe_block(cfg, b, y, batch, seq) if sparse
                     else _swiglu(cfg, b, y, cfg.ffn, "mlp", act=act, fused=var.fused_gate_up,
                                  bias=projection_biases(cfg).mlp))
            if var.sandwich:
                y = rms_norm_eager(b, y, "post_feedforward_layernorm")
            x = b.elementwise("add", x, y, name="residual_2")
    with b.layer(cfg.n_layers, "lm_head"):
        x = rms_norm_eager(b, x, "norm")
        lm_head_and_loss(b, x, cfg.vocab, tied=cfg.flag("tie_word_embeddings", gemma), train=b.train,
                         softcap=var.final_softcap)


def _swiglu_megatron(b: GraphBuilder, x: Tensor, ffn: int, hidden: int, prefix: str, act_tag: str = "",
                     fp8_cast_gemms: int = 1, bias: bool = False, moe_swiglu: bool = False) -> Tensor:
    """Megatron-Core's SwiGLU MLP (Transformer Engine spec), ``x`` already in the tensor-parallel region:
    ``linear_fc1`` (gate and up in one weight: one GEMM of 2 x ffn outputs; under an FP8 recipe one cast of its
    input, one FP8 copy saved; its input gradient comes out of one dgrad GEMM, with no accumulation), the fused SwiGLU
    kernel (``bias_swiglu_impl``: reads 2 x ffn, writes ffn, saves its input), ``linear_fc2``.

    ``fp8_cast_gemms``: one expert of ``TEGroupedMLP`` (``--moe-grouped-gemm``), whose FC1 and FC2 are Transformer
    Engine ``GroupedLinear`` modules over the local experts: their FP8 casts are one multi-tensor kernel per linear
    and direction for all local experts, carried by the first expert (the number of local experts) and absent from
    the others (0) (:meth:`GraphBuilder.linear`).

    ``bias``: biased ``linear_fc1``/``linear_fc2`` (``--add-bias-linear``; a Llama config's ``mlp_bias``), costed in the
    GEMMs and their bias-gradient reductions as the Hugging Face path costs LlamaMLP's.

    ``moe_swiglu``: the SwiGLU of a MoE layer's expert (routed or shared: DeepSeekMoE's FFNs, tech report Sec. 2.1.2,
    Eq. 12), which DeepSeek-V3's storage caches in FP8 (:meth:`GraphBuilder.glu`)."""
    fc1 = b.linear(x, 2 * ffn, bias=bias, name=f"{prefix}.linear_fc1", parallel="col", fp8_cast_gemms=fp8_cast_gemms)
    # DeepSeek-V3's MoE SwiGLU (--fp8-recipe deepseek; tech report Sec. 3.3.3 (2)): its input cached in FP8, its output
    # re-made in the backward (tag ``fp8_swiglu``: featurize/recompute.py)
    cache = moe_swiglu and b.deepseek_storage
    with b.tag(",".join(t for t in (act_tag, "fp8_swiglu" if cache else "") if t)):
        act = b.glu(fc1, name=f"{prefix}.swiglu", fp8_input_cache=cache)
    return b.linear(act, hidden, bias=bias, name=f"{prefix}.linear_fc2", parallel="row", fp8_cast_gemms=fp8_cast_gemms)


def llama_megatron(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    """A Llama-architecture model as Megatron-Core's GPTModel runs it with the Transformer Engine layer spec
    (``--normalization RMSNorm --swiglu --position-embedding-type rope --group-query-attention
    --untie-embeddings-and-output-weights --disable-bias-linear``; the Llama recipes of Megatron-LM/NeMo):

    - RMSNorm as one fused kernel (TE's ``LayerNormLinear`` norm; it saves its input, and the QKV GEMM its output);
    - one fused QKV GEMM ((heads + 2 x kv heads) x head_dim outputs, ``linear_qkv``);
    - fused RoPE (``apply_rotary_pos_emb`` with ``--apply-rope-fusion``): one memory-bound kernel over q/k/v that
      saves nothing but its frequencies;
    - core attention: TE's flash kernel (``attention="flash"``), or Megatron's unfused path (K/V expanded to every
      query head inside the core, fused scale-mask-softmax where FusedScaleMaskSoftmax allows it, else its torch fallback:
      :func:`megatron_softmax_kwargs`; no dropout: Llama's ``attention_dropout`` is 0);
    - output projection; the residual add (bias-dropout-add with hidden dropout 0: no mask);
    - ``linear_fc1`` (gate and up, 2 x ffn outputs, costed as two GEMMs of ffn) and the fused SwiGLU kernel
      (``bias_swiglu_impl``: reads 2 x ffn, writes ffn, saves its input), ``linear_fc2``.

    Saved per layer under sequence parallelism with selective recomputation (sbh/t units, 2-byte activations):
    2 + 2 (the norms' inputs) + 2 + 2 (QKV and FC1 inputs, sharded) + 2(1 + 2 kv/heads) + 2 + 2 kv/heads (the fused
    QKV output, v's storage, and the rotated q and k the checkpointed core attention holds:
    GraphBuilder.rotary_checkpoint_inputs) + 2 (projection input) + 6 ffn/h (SwiGLU input and FC2 input) — Korthikanti
    et al. 2022's accounting with the GPT MLP's 4h GeLU replaced by SwiGLU's 2 x ffn input and ffn output, multi-head
    K/V by grouped ones, and RoPE's new q and k beside the QKV views.

    Mixture-of-experts configs (Mixtral, Qwen-MoE) take Megatron-Core's ``MoELayer`` in place of the MLP on their
    sparse layers (``_moe`` with ``megatron``: all-to-all dispatcher, grouped GEMMs, fused permute/unpermute; Qwen2-MoE's
    shared expert as its ``SharedExpertMLP`` with ``--moe-shared-expert-gate``).

    Qwen3 and Qwen3-MoE (``--qk-layernorm``): a fused RMSNorm over each head's query and key after ``linear_qkv``,
    then RoPE on q and on k (two fused kernels).

    Projection biases as the config's transformers modelling file builds them (:func:`projection_biases`, the same
    rule as the Hugging Face path, so both count the same parameters, bias FLOPs and bias-gradient kernels): Qwen2 and
    Qwen2-MoE (``--add-qkv-bias``): ``linear_qkv`` biased; a Llama config's ``attention_bias``: ``linear_qkv`` and
    ``linear_proj``, its ``mlp_bias``: ``linear_fc1``/``linear_fc2`` (both: ``--add-bias-linear``; Megatron-Core has no
    flag for one without the other: a custom layer spec); Qwen3's ``attention_bias``: ``linear_qkv`` and
    ``linear_proj``; Mistral and Mixtral: none. The experts of a MoE layer are bias-free here as in transformers."""
    nh, nkv, d, h = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.hidden
    qk_norm = cfg.family in ("qwen3", "qwen3_moe")
    # linear_qkv's rows per query group (query heads of the group, key, value): Megatron-Core's Muon splits the weight
    # by them (megatron-core 0.16.1 optimizer/muon.py l. 234-238; training_graph.muon_matrices)
    b.meta["qkv_group_rows"] = [nh // nkv * d, d, d]
    biases = projection_biases(cfg)
    nhl = local_heads(b, nh)
    # fewer key/value groups than TP ranks (Megatron-Core accepts TP a multiple of num_query_groups,
    # transformer_config.py l. 939-945, megatron-core 0.16.1): linear_qkv stays split over the ranks, its output is
    # all-gathered along the features and each rank takes one group's q/k/v (attention.py l. 289-296, 1398-1415), of
    # whose query heads it keeps its nh / tp (l. 1466-1476): one key/value head per rank
    kv_gather = b.tp > nkv and b.tp % nkv == 0
    nkvl = 1 if kv_gather else local_heads(b, nkv, "key/value heads")
    # per-layer sliding windows (Mistral's sliding_window, Qwen's use_sliding_window, a layer_types list): Megatron-Core
    # gives them to the fused kernel as TransformerConfig.window_size (Transformer Engine's DotProductAttention
    # window_size); the unfused core attention computes the whole scores under its mask, as HF's eager path
    windows = attention_windows(cfg)
    ids = b.input((batch, seq), "fp32")
    with b.layer(-1, "embedding"):
        x = vocab_embedding(b, ids, cfg.vocab, h, name="word_embeddings")
    for i in range(cfg.n_layers):
        with b.layer(i, f"decoder.layers.{i}"):
            y = b.tp_enter(b.layernorm(x, name="input_layernorm", rms=True, bias=False, module="layernorm"), name="self_attention.enter")
            qkv = b.linear(y, (nh + 2 * nkv) * d, bias=biases.qkv, name="self_attention.linear_qkv", parallel="col")
            if kv_gather:  # all_gather_last_dim_from_tensor_parallel_region (backward: reduce-scatter of the gradient)
                full = (*qkv.shape[:-1], qkv.shape[-1] * b.tp)
                qkv = b.collective("all_gather", qkv, full, group="tp", size_bytes=qkv.nbytes * b.tp,
                                   name="self_attention.qkv_all_gather", backward=[("reduce_scatter", qkv.nbytes * b.tp)])
                gathered = qkv
                # this rank's query heads and its group's key and value: views of the gathered output
                qkv = Tensor((*qkv.shape[:-1], (nhl + 2) * d), qkv.dtype, qkv.node, qkv.tid)
            if qk_norm:  # q_layernorm / k_layernorm on the split heads, then RoPE on each
                sq = qkv.shape[1]
                q = b.layernorm(Tensor((batch, nhl, sq, d), qkv.dtype, qkv.node, qkv.tid),
                                name="self_attention.q_layernorm", rms=True, bias=False)
                k = b.layernorm(Tensor((batch, nkvl, sq, d), qkv.dtype, qkv.node, qkv.tid),
                                name="self_attention.k_layernorm", rms=True, bias=False)
                q, k = megatron_rope(b, q, k, fused=True)
            else:
                fused_qkv = gathered if kv_gather else qkv
                qkv = b.elementwise("mul", qkv, 1.0, name="self_attention.rope")  # fused RoPE over q and k (v passes)
                # a checkpointed core attention keeps the new q and k and the fused QKV (v is its view)
                b.rotary_checkpoint_inputs(qkv, fused_qkv, nhl, nkvl, d)
                sq = qkv.shape[1]
                q = Tensor((batch, nhl, sq, d), qkv.dtype, qkv.node, qkv.tid)
                k = Tensor((batch, nkvl, sq, d), qkv.dtype, qkv.node, qkv.tid)
            v = Tensor((batch, nkvl, sq, d), qkv.dtype, qkv.node, qkv.tid)
            if impl == "flash":
                a = b.flash_attention(q, k, v, causal=True, name="attn.flash", window=windows[i])
            else:
                with b.tag("attn_core"):
                    k = repeat_kv(b, k, nhl // nkvl, "core_attention.expand_k")
                    v = repeat_kv(b, v, nhl // nkvl, "core_attention.expand_v")
                a = eager_attention(b, q, k, v, causal=True, window=windows[i], dropout_p=0.0,
                                    **megatron_softmax_kwargs(cfg, b, batch, nhl, sq))
            core = a
            a = merge_heads(b, a, name="self_attention.merge_heads")
            if impl == "flash":  # TE's backend may hand linear_proj a view of the output it saves (te_attention.py)
                b.te_attention_output(q, core, a)
            a = b.tp_exit(b.linear(a, h, bias=biases.o, name="self_attention.linear_proj", parallel="row"),
                          name="self_attention.exit")
            x = b.elementwise("add", x, a, name="residual_1")
            if cfg.moe_layer(i):
                y = b.layernorm(x, name="pre_mlp_layernorm", rms=True, bias=False, module="layernorm")
                with b.tag("moe"):  # Megatron-Core's recompute modules (featurize/recompute.py)
                    y = _moe_block(cfg, b, y, batch, seq, megatron=True)
            else:
                y = b.layernorm(x, name="pre_mlp_layernorm", rms=True, bias=False, module="layernorm")
                with b.tag("mlp"):  # its sequence-parallel all-gather and reduce-scatter with it (linear_fc1/fc2's)
                    y = b.tp_exit(_swiglu_megatron(b, b.tp_enter(y, name="mlp.enter"), cfg.ffn, h, "mlp",
                                                   bias=biases.mlp), name="mlp.exit")
            x = b.elementwise("add", x, y, name="residual_2")
    with b.layer(cfg.n_layers, "output_layer"):
        x = b.layernorm(x, name="final_layernorm", rms=True, bias=False)
        lm_head_and_loss(b, x, cfg.vocab, tied=cfg.flag("tie_word_embeddings", False), train=b.train, fp32_loss=True)


def _mla(cfg: HFConfig, b: GraphBuilder, x: Tensor, batch: int, seq: int, impl: str, hf_softmax: bool = True) -> Tensor:
    """DeepSeek-V2/V3 multi-head latent attention as DeepseekV3Attention runs it: queries through a low-rank
    ``q_a_proj`` -> RMSNorm -> ``q_b_proj`` (or one ``q_proj`` without ``q_lora_rank``); keys and values from one
    compressed ``kv_a_proj_with_mqa`` (``kv_lora_rank`` + a shared rotary key of ``qk_rope_head_dim``) -> RMSNorm ->
    ``kv_b_proj``; RoPE on the rotary parts; queries and keys concatenated (copies) from their no-rope and rope parts;
    attention with query/key head dim ``qk_nope + qk_rope`` and value head dim ``v_head_dim``; ``o_proj``.
    ``hf_softmax``: the eager softmax as transformers' (in fp32, hf_blocks.softmax_upcast); off under Megatron-Core."""
    nh = cfg.n_heads
    nhl = local_heads(b, nh)
    nope, rdim, vdim, kv_rank, q_rank = (deepseek_field(cfg, k) for k in ("qk_nope_head_dim", "qk_rope_head_dim",
                                                                          "v_head_dim", "kv_lora_rank", "q_lora_rank"))
    qd = nope + rdim
    bs, s_ = x.shape[0], x.shape[1]
    qa = b.linear(x, q_rank, bias=False, name="self_attn.q_a_proj") if q_rank else None
    ckv = b.linear(x, kv_rank + rdim, bias=False, name="self_attn.kv_a_proj_with_mqa")
    # the up-projections with their latent norms and the rotary parts: Megatron-Core's ``mla_up_proj`` recompute module
    with b.tag("mla_up_proj"):
        if q_rank:  # the low-rank query path is replicated across tp ranks; q_b_proj is column-parallel
            qa = rms_norm_eager(b, qa, "self_attn.q_a_layernorm")
            qa = b.tp_enter(qa, name="self_attn.enter")
            q = b.linear(qa, nh * qd, bias=False, name="self_attn.q_b_proj", parallel="col")
        else:
            q = b.linear(b.tp_enter(x, name="self_attn.enter"), nh * qd, bias=False, name="self_attn.q_proj", parallel="col")
        c = rms_norm_eager(b, Tensor((bs, s_, kv_rank), ckv.dtype, ckv.node, ckv.tid), "self_attn.kv_a_layernorm")
        c = b.tp_enter(c, name="self_attn.kv_enter")
        kv = b.linear(c, nh * (nope + vdim), bias=False, name="self_attn.kv_b_proj", parallel="col")
        # under sequence parallelism the down-projections ran on this rank's shard and their (small) outputs were
        # gathered: from here on the whole sequence (Megatron-Core's MLA gathers the latents and the rotary key)
        s_ = kv.shape[1]
        q4 = heads(b, q, nhl, qd)
        q_pe = rope(b, Tensor((bs, nhl, s_, rdim), q4.dtype, q4.node, q4.tid), "rope.q")
        rope(b, Tensor((bs, 1, s_, rdim), ckv.dtype, ckv.node, ckv.tid), "rope.k")
        qs = b.copy(Tensor((bs, nhl, s_, qd), q_pe.dtype, q_pe.node, q_pe.tid), name="self_attn.q_cat")
        ks = b.copy(Tensor((bs, nhl, s_, qd), kv.dtype, kv.node, kv.tid), name="self_attn.k_cat")
    v = Tensor((bs, nhl, s_, vdim), kv.dtype, kv.node, kv.tid)
    if impl == "flash":
        a = b.flash_attention(qs, ks, v, causal=True, name="attn.flash")
    else:
        # transformers' eager MLA: scale, additive mask, the fp32 softmax; Megatron-Core's MLA core attention: its
        # DotProductAttention's FusedScaleMaskSoftmax (megatron_softmax_kwargs)
        softmax_kw = (dict(scale="scores_mul", mask="add", mask_shape=(batch, 1, seq, seq), softmax_fp32=True)
                      if hf_softmax else megatron_softmax_kwargs(cfg, b, batch, nhl, s_))
        a = eager_attention(b, qs, ks, v, causal=True, dropout_p=_p(cfg, "attention_dropout"),
                            strided=(False, False, True),
                            **softmax_kw)
    att = a
    a = merge_heads(b, a, name="self_attn.transpose")
    if impl == "flash":  # under Megatron-Core, TE's backend may hand linear_proj a view of its output (te_attention.py)
        b.te_attention_output(qs, att, a)
    o = b.linear(a, cfg.hidden, bias=False, name="self_attn.o_proj", parallel="row")
    if impl == "flash":  # DeepSeek-V3's E5M6 copy of o_proj's input under --fp8-recipe deepseek (Sec. 3.3.3 (1))
        b.e5m6_attention_output(att, o)
    return b.tp_exit(o, name="self_attn.exit")


def deepseek(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str, megatron: bool = False,
             mtp_layers: int = 0) -> None:
    """DeepSeek-V2 / V3 (``deepseek_v2``, ``deepseek_v3``) as Hugging Face runs them: multi-head latent attention
    (:func:`_mla`) in every block; the first ``first_k_dense_replace`` blocks a dense SwiGLU MLP of
    ``intermediate_size``, the rest DeepSeekMoE: ``n_routed_experts`` experts of ``moe_intermediate_size`` with
    ``num_experts_per_tok`` per token (V3 scores them by a sigmoid, V2 by a softmax) plus ``n_shared_experts``
    shared experts run as one SwiGLU of n_shared x ``moe_intermediate_size`` on every token. The multi-token-prediction
    module (V3's ``num_nextn_predict_layers``) is not part of the Hugging Face model and is not built.

    ``megatron``: as Megatron-Core's GPTModel runs it (``--multi-latent-attention``, the DeepSeek-V3 recipe): the
    block norms as fused RMSNorm kernels, the MoE layers as Megatron-Core's ``MoELayer`` (``_moe`` with ``megatron``),
    the dense MLPs and the shared experts as its ``MLP`` (one ``linear_fc1``, the fused SwiGLU), the loss on fp32 logits; the attention keeps the latent projections and norms of :func:`_mla`.

    ``mtp_layers`` (Megatron-Core's ``--mtp-num-layers``, with ``megatron``; DeepSeek-V3 trains with 1): multi-token
    prediction after the head, on the last pipeline stage (:func:`_mtp_layer`)."""
    # a block's two norms (Megatron-Core's ``layernorm`` recompute module) and the final one
    norm = ((lambda t, name, module="": b.layernorm(t, name=name, rms=True, bias=False, module=module)) if megatron
            else (lambda t, name, module="": rms_norm_eager(b, t, name, module)))

    def mlp(t: Tensor, ffn: int, prefix: str, moe_swiglu: bool = False) -> Tensor:  # Megatron-Core's: one linear_fc1
        return _dense_mlp(cfg, b, t, ffn, prefix, megatron, moe_swiglu)  # and the fused SwiGLU
    ids = b.input((batch, seq), "fp32")
    with b.layer(-1, "model.embed_tokens"):
        x = vocab_embedding(b, ids, cfg.vocab, cfg.hidden, name="embed_tokens")
    moe_ffn = deepseek_field(cfg, "moe_intermediate_size") if cfg.n_experts else None
    shared = deepseek_field(cfg, "n_shared_experts") if cfg.n_experts else 0
    scoring = "sigmoid" if cfg.model_type == "deepseek_v3" else "softmax"
    def block(x: Tensor, moe: bool) -> Tensor:
        y = norm(x, "input_layernorm", "layernorm")
        a = _mla(cfg, b, y, batch, seq, impl, hf_softmax=not megatron)
        x = b.elementwise("add", x, a, name="residual_1")
        y = norm(x, "post_attention_layernorm", "layernorm")
        if moe:
            with b.tag("moe"):  # Megatron-Core's recompute modules (featurize/recompute.py)
                m = _moe(cfg, b, y, batch, seq, expert_ffn=moe_ffn, scoring=scoring, megatron=megatron)
                if shared:
                    with b.tag("shared_experts"):
                        sh = mlp(y, shared * moe_ffn, "mlp.shared_experts", moe_swiglu=True)
                    m = b.elementwise("add", m, sh, name="mlp.shared_add")
            y = m
        else:
            with b.tag("mlp"):
                y = mlp(y, cfg.ffn, "mlp")
        return b.elementwise("add", x, y, name="residual_2")

    is_moe = cfg.moe_layer  # from first_k_dense_replace on, every moe_layer_freq-th block

    for i in range(cfg.n_layers):
        with b.layer(i, f"model.layers.{i}"):
            x = block(x, is_moe(i))
    with b.layer(cfg.n_layers, "lm_head"):
        h = x
        x = norm(x, "norm")
        lm_head_and_loss(b, x, cfg.vocab, tied=cfg.flag("tie_word_embeddings", False), train=b.train, fp32_loss=megatron)
        for k in range(mtp_layers):
            h = _mtp_layer(cfg, b, h, ids, k, norm=norm, block=lambda t: block(t, is_moe(cfg.n_layers + k)))


def _mtp_layer(cfg: HFConfig, b: GraphBuilder, h: Tensor, ids: Tensor, k: int, *, norm, block) -> Tensor:
    """One multi-token-prediction depth (DeepSeek-V3 tech report Sec. 2.2, Megatron-Core's
    ``MultiTokenPredictionLayer``): the embedding of the tokens k + 1 ahead (the word embedding's table; under a pipeline
    the last stage's copy of it, its gradient all-reduced with the first stage's), RMSNorms of it and of the hidden states ``h``, their concatenation projected
    from 2 x hidden to hidden (``eh_proj``, column-parallel with its output gathered over TP), one transformer block of
    the decoder's kind (``block``), a final norm, and the output layer (shared with the main head: no parameters of its
    own) with its loss. Returns the block's output (the next depth's hidden states)."""
    p = f"mtp.layers.{k}"
    with b.scope(p):
        # the word embedding's table: the first stage's own (one rank without a pipeline); a pipeline's last stage
        # holds one copy of it (every depth reads the same table), whose gradient joins the embedding group's all-reduce
        # (simulate/distributed.py, as a tied output layer's copy)
        e = vocab_embedding(b, ids, cfg.vocab, cfg.hidden, name=f"{p}.embedding", params=False)
        b.meta["mtp_embedding_params"] = vocab_shard_params(b, cfg.vocab, cfg.hidden)
        e = norm(e, f"{p}.enorm")
        hn = norm(h, f"{p}.hnorm")
        cat = b.copy(Tensor((*hn.shape[:-1], 2 * cfg.hidden), hn.dtype, hn.node, hn.tid), name=f"{p}.cat")
        y = b.linear(b.tp_enter(cat, name=f"{p}.eh_proj.enter"), cfg.hidden, bias=False, name=f"{p}.eh_proj",
                     parallel="col", fp8=False)
        if b.tp > 1:  # all_gather_last_dim_from_tensor_parallel_region, then back to this rank's sequence shard
            full = (*y.shape[:-1], cfg.hidden)
            g = b.collective("all_gather", y, full, group="tp", size_bytes=math.prod(full) * b.dbytes,
                             name=f"{p}.eh_proj.all_gather", backward=[("reduce_scatter", math.prod(full) * b.dbytes)])
            y = Tensor(hn.shape, g.dtype, g.node, g.tid) if b.sp else g
        x = block(y)
        out = norm(x, f"{p}.final_layernorm")
        lm_head_and_loss(b, out, cfg.vocab, tied=False, shared=True, train=b.train, fp32_loss=True)
    return x


def gemma(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    llama(cfg, b, batch, seq, impl=impl, var=LlamaVariant(gemma=True))


def _opt_float(cfg: HFConfig, key: str) -> float | None:
    v = cfg.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise GraphError(f"{cfg.name}: field '{key}' must be a positive number or null, got {v!r}")
    return float(v)


def qwen3(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    """Qwen3 (dense): Llama with RMSNorm on each head's query and key (``q_norm``/``k_norm``), no qkv bias."""
    llama(cfg, b, batch, seq, impl=impl, var=LlamaVariant(qk_norm=True))


def phi3(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    """Phi-3: Llama with one fused ``qkv_proj`` and one fused ``gate_up_proj`` (sliding window when the config
    sets ``sliding_window``, as Phi3Attention passes it to the kernel)."""
    llama(cfg, b, batch, seq, impl=impl, var=LlamaVariant(fused_qkv=True, fused_gate_up=True))


def gemma2(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    """Gemma 2: Gemma with sandwich norms (four RMSNorms per block), attention and final logit soft-capping
    (``attn_logit_softcapping``, ``final_logit_softcapping``) and sliding-window attention
    (``sliding_window``) on every other layer (even layers local, as Gemma2DecoderLayer), or on the
    "sliding_attention" layers of ``layer_types`` when the config gives it."""
    llama(cfg, b, batch, seq, impl=impl, var=LlamaVariant(
        gemma=True, sandwich=True, attn_softcap=_opt_float(cfg, "attn_logit_softcapping"),
        final_softcap=_opt_float(cfg, "final_logit_softcapping")))


def gemma3(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    """Gemma 3 (text): Gemma 2's sandwich norms plus query/key RMSNorm, no soft-capping by default, and
    ``sliding_window_pattern`` (default 6): five local layers to one global, or the "sliding_attention" layers of
    ``layer_types`` when the config gives it (authoritative, as in Gemma3TextConfig; a warning if the pattern says
    otherwise)."""
    llama(cfg, b, batch, seq, impl=impl, var=LlamaVariant(
        gemma=True, sandwich=True, qk_norm=True, attn_softcap=_opt_float(cfg, "attn_logit_softcapping"),
        final_softcap=_opt_float(cfg, "final_logit_softcapping")))


def mixtral(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    llama(cfg, b, batch, seq, impl=impl, moe=True)


def qwen2_moe(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    """Qwen2-MoE (Qwen1.5-MoE): Qwen2's attention (q/k/v bias), Qwen2MoeSparseMoeBlock on the sparse layers (top-k
    softmax router, experts of ``moe_intermediate_size``, the gated shared expert), dense MLPs on the others."""
    llama(cfg, b, batch, seq, impl=impl, moe=True)


def qwen3_moe(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    """Qwen3-MoE: Qwen3's attention (per-head q/k RMSNorm, no bias), Qwen3MoeSparseMoeBlock on the sparse layers (top-k
    softmax router, experts of ``moe_intermediate_size``, no shared expert), dense MLPs on the others."""
    llama(cfg, b, batch, seq, impl=impl, moe=True, var=LlamaVariant(qk_norm=True))


# --------------------------------------------------------------------------------------------
# OpenAI gpt-oss
# --------------------------------------------------------------------------------------------

def _gpt_oss_rope(b: GraphBuilder, x: Tensor, name: str) -> Tensor:
    """gpt-oss's ``_apply_rotary_emb`` on one of q/k: the two halves of each head (``torch.chunk``: views) against
    (B, 1, S, d/2) cos and sin tables, ``x1 * cos - x2 * sin`` and ``x2 * cos + x1 * sin`` (four multiplies, a
    subtract and an add on half-width tensors), then their ``torch.cat`` (a copy to (B, h, S, d); its backward hands
    each half a view of the gradient, no kernel)."""
    bs, h, s, d = x.shape
    half = (bs, h, s, d // 2)
    cos = b.input((bs, 1, s, d // 2), requires_grad=False)
    sin = b.input((bs, 1, s, d // 2), requires_grad=False)
    x1, x2 = Tensor(half, x.dtype, x.node, x.tid), Tensor(half, x.dtype, x.node, x.tid)
    first = b.elementwise("sub", b.elementwise("mul", x1, cos, name=f"{name}.x1_cos"),
                          b.elementwise("mul", x2, sin, name=f"{name}.x2_sin"), name=f"{name}.first")
    b.elementwise("add", b.elementwise("mul", x2, cos, name=f"{name}.x2_cos"),
                  b.elementwise("mul", x1, sin, name=f"{name}.x1_sin"), name=f"{name}.second")
    return b.copy(Tensor((bs, h, s, d), first.dtype, first.node, first.tid), name=f"{name}.cat", grad=False)


def _gpt_oss_expert(cfg: HFConfig, b: GraphBuilder, x: Tensor, ffn: int, prefix: str) -> Tensor:
    """One expert of GptOssExperts' eager loop on its gathered rows ``x``: ``x @ gate_up_proj[e] + gate_up_proj_bias[e]``
    (a GEMM to 2 x ffn and a bias add: two kernels), the gate and up halves as strided views (``[..., ::2]``,
    ``[..., 1::2]``), the clamped SwiGLU (``_apply_gate``: gate.clamp(max=limit), up.clamp(-limit, limit),
    gate * alpha, sigmoid, gate * sigmoid, up + 1, (up + 1) * glu: seven elementwise kernels, ``swiglu_limit`` 7 and
    ``swiglu_alpha`` 1.702 changing none of them), then ``@ down_proj[e] + down_proj_bias[e]`` (GEMM and bias add).

    The clamps are costed as scalar selects; their backward is clamp_backward's compares and ``where``: the one-sided
    clamp as a ``where`` (one masked copy of the gradient), the two-sided one as a ``minimum`` (compare, select and fill
    kernels, keeping the input as clamp does). Under expert tensor parallelism gate_up is split by columns and
    down_proj by rows like a dense MLP (Hugging Face's path has none; Megatron-Core's folding is modelled generically)."""
    limit = 7.0
    gu = b.linear(x, 2 * ffn, bias=False, name=f"{prefix}.gate_up_proj", parallel="col")
    width = gu.shape[-1]
    gu = b.elementwise("add", gu, b.input((width,)), name=f"{prefix}.gate_up_proj_bias", params=width)
    half = (*gu.shape[:-1], width // 2)
    gate, up = Tensor(half, gu.dtype, gu.node, gu.tid), Tensor(half, gu.dtype, gu.node, gu.tid)
    with b.tag("moe_act"):  # the experts' activation (Megatron-Core's recompute module name)
        gate = b.elementwise("where", gate, limit, name=f"{prefix}.clamp_gate")
        up = b.elementwise("minimum", up, limit, name=f"{prefix}.clamp_up")
        z = b.elementwise("mul", gate, 1.702, name=f"{prefix}.alpha")
        z = b.elementwise("sigmoid", z, name=f"{prefix}.sigmoid")
        glu = b.elementwise("mul", gate, z, name=f"{prefix}.glu")
        up = b.elementwise("add", up, 1.0, name=f"{prefix}.up_plus_one")
        y = b.elementwise("mul", up, glu, name=f"{prefix}.gated")
    y = b.linear(y, cfg.hidden, bias=False, name=f"{prefix}.down_proj", parallel="row")
    return b.elementwise("add", y, b.input((cfg.hidden,)), name=f"{prefix}.down_proj_bias", params=cfg.hidden)


def gpt_oss(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    """OpenAI gpt-oss (``gpt_oss``) as ``transformers``' GptOssForCausalLM runs it: token embedding; per block an
    RMSNorm, :func:`_llama_attention` with the gpt-oss variant (:class:`LlamaVariant`: biases, its RoPE, learned
    sinks; eager attention computes the full S x S scores under a mask on every layer, the flash kernel skips the
    blocks outside the window) with a sliding window of ``sliding_window`` keys, default 128, on the
    ``sliding_attention`` layers of ``layer_types``, default the even ones; the odd ones attend to the whole prefix),
    the residual add, an RMSNorm and the sparse block on every layer (GptOssMLP): the router ``Linear(hidden,
    num_local_experts)`` with a bias, top-k (``num_experts_per_tok``) on its logits and a softmax over the k chosen,
    each token's rows gathered to its experts (tokens balanced over experts, as for Mixtral), each expert
    :func:`_gpt_oss_expert` of ``intermediate_size``, the outputs weighted by the routing scores and summed back
    (``index_add_``); a final RMSNorm and the untied LM head (``tie_word_embeddings`` default false). The RMSNorms are
    Llama's eager kernels (gpt-oss applies the weight before the cast back, an equal count).

    Hugging Face's path only: :func:`wattcast.featurize.workload` refuses ``--framework megatron`` for it."""
    # per layer: sliding_window (absent: GptOssConfig's 128; an explicit null: none) on the sliding_attention layers
    windows = attention_windows(cfg)
    ids = b.input((batch, seq), "fp32")
    with b.layer(-1, "model.embed_tokens"):
        x = vocab_embedding(b, ids, cfg.vocab, cfg.hidden, name="embed_tokens")
    for i in range(cfg.n_layers):
        with b.layer(i, f"model.layers.{i}"):
            y = rms_norm_eager(b, x, "input_layernorm", module="layernorm")
            # a sliding_attention layer's window (none on a full_attention one), with the sinks and gpt-oss's RoPE
            var = LlamaVariant(gpt_oss=True, windows=windows)
            a = _llama_attention(cfg, b, y, batch, seq, impl, var, i)
            x = b.elementwise("add", x, a, name="residual_1")
            y = rms_norm_eager(b, x, "post_attention_layernorm", module="layernorm")
            with b.tag("moe"):  # Megatron-Core's recompute module name (featurize/recompute.py)
                y = _moe(cfg, b, y, batch, seq, normalise=False, router_bias=True, topk_first=True,
                         expert=_gpt_oss_expert)
            x = b.elementwise("add", x, y, name="residual_2")
    with b.layer(cfg.n_layers, "lm_head"):
        x = rms_norm_eager(b, x, "norm")
        lm_head_and_loss(b, x, cfg.vocab, tied=cfg.flag("tie_word_embeddings", False), train=b.train)


# --------------------------------------------------------------------------------------------
# BERT
# --------------------------------------------------------------------------------------------

def bert(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    h, nh, d = cfg.hidden, cfg.n_heads, cfg.head_dim
    p, attn_p = _p(cfg, "hidden_dropout_prob", default=0.1), _p(cfg, "attention_probs_dropout_prob", default=0.1)
    ids = b.input((batch, seq), "fp32")
    with b.layer(-1, "bert.embeddings"):
        # the extended attention mask (1 - mask) * min, (B, 1, 1, S), off the gradient path
        b.elementwise("sub", b.input((batch, 1, 1, seq)), 1.0, name="extended_mask", grad=False)
        x = vocab_embedding(b, ids, cfg.vocab, h, name="word_embeddings")
        tt = b.embedding(b.input((batch, x.shape[1]), "fp32"), cfg.count("type_vocab_size", default=2), h, name="token_type_embeddings")
        x = b.elementwise("add", x, tt, name="embed.add_type")
        pos = b.embedding(b.input((1, x.shape[1]), "fp32"), max(cfg.max_positions, seq), h, name="position_embeddings")
        x = b.elementwise("add", x, pos, name="embed.add_pos")
        x = b.layernorm(x, name="embeddings.LayerNorm")
        x = b.dropout(x, p, name="embeddings.dropout")
    for i in range(cfg.n_layers):
        with b.layer(i, f"bert.encoder.layer.{i}"):
            hl = local_heads(b, nh)
            xe = b.tp_enter(x, name="attention.enter")
            q = heads(b, b.linear(xe, h, name="attention.self.query", parallel="col"), hl, d)
            k = heads(b, b.linear(xe, h, name="attention.self.key", parallel="col"), hl, d)
            v = heads(b, b.linear(xe, h, name="attention.self.value", parallel="col"), hl, d)
            a = attention(b, q, k, v, impl=impl, causal=False, scale="scores_div", mask="add", dropout_p=attn_p,
                          mask_shape=(batch, 1, 1, seq), strided=(True, True, True))
            a = merge_heads(b, a, name="attention.self.contiguous")
            a = b.tp_exit(b.linear(a, h, name="attention.output.dense", parallel="row"), name="attention.exit")
            a = b.dropout(a, p, name="attention.output.dropout")
            x = b.layernorm(b.elementwise("add", a, x, name="attention.output.residual"), name="attention.output.LayerNorm")
            with b.tag("mlp"):
                y = b.linear(b.tp_enter(x, name="mlp.enter"), cfg.ffn, name="intermediate.dense", parallel="col")
                y = activation(b, y, cfg.activation)
                y = b.tp_exit(b.linear(y, h, name="output.dense", parallel="row"), name="mlp.exit")
            y = b.dropout(y, p, name="output.dropout")
            x = b.layernorm(b.elementwise("add", y, x, name="output.residual"), name="output.LayerNorm")
    with b.layer(cfg.n_layers, "heads"):
        if b.sp:  # gather the sequence shards back for the heads
            x = b.collective("all_gather", x, (batch, seq, h), group="tp", size_bytes=batch * seq * h * b.dbytes,
                             name="heads.all_gather", backward=[("reduce_scatter", batch * seq * h * b.dbytes)])
        cls_tok = b.copy(Tensor((batch, h), x.dtype, x.node, x.tid), name="pooler.first_token")
        pooled = b.elementwise("tanh", b.linear(cls_tok, h, name="pooler.dense"), name="pooler.activation")
        if b.train:
            y = b.linear(x, h, name="cls.predictions.transform.dense")
            y = activation(b, y, cfg.activation)
            y = b.layernorm(y, name="cls.predictions.transform.LayerNorm")
            # (under sequence parallelism the heads already run on the gathered sequence)
            scores = b.linear(y if b.sp else b.tp_enter(y, name="cls.enter"), padded_vocab(b, cfg.vocab), bias=True,
                              name="cls.predictions.decoder", weight_params=False, parallel="col")
            # tied to the word embedding: a pipeline's last stage holds a copy (simulate/distributed.py)
            b.meta["tied_output_params"] = vocab_shard_params(b, cfg.vocab, h)
            # the next-sentence head feeds its own loss: an output layer, bf16 under FP8 (Megatron-Core 0.16.1
            # models/bert/bert_model.py l. 152-156: ``binary_head`` is a torch.nn.Linear, outside Transformer Engine)
            nsp = b.linear(pooled, 2, name="cls.seq_relationship", fp8=False)
            b.cross_entropy(scores, name="loss.mlm", vocab_parallel=True)
            b.cross_entropy(nsp, name="loss.nsp")
        else:
            pooled = b.dropout(pooled, p, name="dropout")
            # the classification head: the model's output layer, bf16 under FP8 as the LM heads
            b.linear(pooled, cfg.count("num_labels", default=2), name="classifier", fp8=False)


GENERATORS: dict[str, Callable[..., None]] = {
    "gpt2": gpt2, "mpt": mpt, "gpt_neox": gpt_neox, "bloom": bloom, "falcon": falcon, "opt": opt, "llama": llama, "gemma": gemma, "mixtral": mixtral,
    "qwen3": qwen3, "phi3": phi3, "gemma2": gemma2, "gemma3": gemma3, "deepseek": deepseek, "bert": bert, "switch": switch,
    "qwen2_moe": qwen2_moe, "qwen3_moe": qwen3_moe, "gpt_oss": gpt_oss,
}
