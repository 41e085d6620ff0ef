"""Switch Transformers (and dense T5) encoder-decoder graphs, as Hugging Face's eager classes run them.

SwitchTransformersForConditionalGeneration: shared token embedding; T5 blocks with RMS-style
T5LayerNorm (eager: pow, mean, add, rsqrt, mul, mul weight), bias-free q/k/v/o projections, no score
scaling, a relative position bias computed in the first block of each stack (bucketing kernels on an
S x S grid, an embedding lookup, broadcast-add of the mask) and added to the scores in every block;
the decoder adds causal self-attention and cross-attention; every ``*_sparse_step``-th feed-forward is
a Switch MoE layer: a router (linear to ``num_experts`` logits in fp32, softmax, argmax, one-hot,
cumsum capacity mask) and one FFN per expert that has tokens, on exactly the tokens it kept (no padding to
the capacity: :func:`switch_expert_rows`), scattered back and scaled by the router probability. The LM head is tied to the embedding and scaled by ``d_model**-0.5``. The decoder input is
as long as the encoder input (``seq``); training adds cross-entropy over the decoder logits.
"""

from __future__ import annotations

from wattcast.featurize.hf_config import HFConfig, t5_feed_forward
from wattcast.featurize.hf_blocks import (activation, local_heads, merge_heads, padded_vocab, rms_norm_eager, vocab_embedding,
                                          vocab_shard_params)
from wattcast.featurize.op_graph import GraphBuilder, GraphError, Tensor, attention_pair_share


def _position_bias(b: GraphBuilder, cfg: HFConfig, batch: int, s_q: int, s_kv: int, *, name: str) -> Tensor:
    """The relative position bias (B, heads, S_q, S_kv) of the first block of a stack."""
    nb = cfg.count("relative_attention_num_buckets", default=32)
    grid = b.input((s_q, s_kv))
    with b.scope(name):
        # _relative_position_bucket: ~14 small kernels on the (S_q, S_kv) grid (sub, compare, abs, log,
        # divisions, min, where...), none on the gradient path; costed as scalar-op kernels of that size
        t = grid
        for k in range(13):
            t = b.elementwise("add", t, 1.0, name=f"{name}.bucket{k}", grad=False)
        t = b.elementwise("where", t, b.input((s_q, s_kv)), name=f"{name}.bucket_where", grad=False)
        emb = b.embedding(t, nb, cfg.n_heads, name=f"{name}.relative_attention_bias")
        hl = local_heads(b, cfg.n_heads)  # each tensor-parallel rank uses its heads' slice
        emb = b.copy(Tensor((1, hl, s_q, s_kv), emb.dtype, emb.node, emb.tid), name=f"{name}.permute")
        return b.elementwise("add", emb, b.input((batch, 1, 1, s_kv), requires_grad=False), name=f"{name}.mask")


def _attention(b: GraphBuilder, cfg: HFConfig, x: Tensor, kv: Tensor | None, bias: Tensor | None, *, impl: str, causal: bool,
               prefix: str) -> Tensor:
    x = b.tp_enter(x, name=f"{prefix}.enter")
    kv = x if kv is None else b.tp_enter(kv, name=f"{prefix}.enter_kv")
    bs, s, _ = x.shape
    skv = kv.shape[1]
    d = cfg.head_dim
    nh = local_heads(b, cfg.n_heads)
    inner = cfg.n_heads * d
    q = b.linear(x, inner, bias=False, name=f"{prefix}.q", parallel="col")
    k = b.linear(kv, inner, bias=False, name=f"{prefix}.k", parallel="col")
    v = b.linear(kv, inner, bias=False, name=f"{prefix}.v", parallel="col")
    q4 = Tensor((bs, nh, s, d), q.dtype, q.node, q.tid)
    k4 = Tensor((bs, nh, skv, d), k.dtype, k.node, k.tid)
    v4 = Tensor((bs, nh, skv, d), v.dtype, v.node, v.tid)
    if impl == "flash":
        a = b.flash_attention(q4, k4, v4, causal=causal, name=f"{prefix}.flash")
    else:
        # model FLOPs: the two products over the pairs the mask keeps, the score-side kernels none (as
        # hf_blocks.eager_attention counts them)
        share = attention_pair_share(s, skv, causal=causal)
        with b.tag("attn_core"), b.model_share(0.0):
            with b.model_share(share):
                scores = b.matmul(q4, Tensor((bs, nh, d, skv), k.dtype, k.node, k.tid), name=f"{prefix}.qk")
            pb = bias if bias is not None else b.input((bs, nh, s, skv))
            scores = b.elementwise("add", scores, pb, name=f"{prefix}.position_bias")
            probs = b.softmax(scores, name=f"{prefix}.softmax")
            probs = b.dropout(probs, cfg.fraction("dropout_rate", default=0.1), name=f"{prefix}.dropout")
            with b.model_share(share):
                a = b.matmul(probs, v4, name=f"{prefix}.pv")
    a = merge_heads(b, a, name=f"{prefix}.contiguous")
    return b.tp_exit(b.linear(a, cfg.hidden, bias=False, name=f"{prefix}.o", parallel="row"), name=f"{prefix}.exit")


def _dense_ff(b: GraphBuilder, cfg: HFConfig, x: Tensor, prefix: str, *, tp_region: bool = True) -> Tensor:
    if tp_region:
        x = b.tp_enter(x, name=f"{prefix}.enter")
    if cfg.model_type == "t5" and t5_feed_forward(cfg.raw, cfg.name)[1]:
        # T5DenseGatedActDense (T5 v1.1, Flan-T5, mT5; transformers 5.24.0 models/t5/modeling_t5.py l.98-123):
        # act(wi_0(x)) * wi_1(x), two input projections d_model -> d_ff
        g = activation(b, b.linear(x, cfg.ffn, bias=False, name=f"{prefix}.wi_0", parallel="col"), cfg.activation)
        up = b.linear(x, cfg.ffn, bias=False, name=f"{prefix}.wi_1", parallel="col")
        y = b.elementwise("mul", g, up, name=f"{prefix}.gate")
    else:  # T5DenseActDense (modeling_t5.py l.76-82) and SwitchTransformersDenseActDense: act(wi(x))
        y = b.linear(x, cfg.ffn, bias=False, name=f"{prefix}.wi", parallel="col")
        y = activation(b, y, cfg.activation.replace("gated-", ""))
    y = b.dropout(y, cfg.fraction("dropout_rate", default=0.1), name=f"{prefix}.dropout")
    y = b.linear(y, cfg.hidden, bias=False, name=f"{prefix}.wo", parallel="row")
    return b.tp_exit(y, name=f"{prefix}.exit") if tp_region else y


def switch_processed_tokens(batch: int, seq: int, n_experts: int, capacity: int | None) -> int:
    """The tokens a Switch MoE layer's experts compute, of ``batch`` sequences of ``seq`` tokens under top-1 routing.

    SwitchTransformersTop1Router (transformers 5.24.0 models/switch_transformers/modeling_switch_transformers.py l.104-109: ``one_hot(argmax)``,
    ``token_priority = cumsum(expert_index, dim=-2)``, ``expert_capacity_mask = token_priority <= expert_capacity``)
    counts the capacity along the sequence, so each sequence keeps at most ``expert_capacity`` tokens per expert; the
    rest skip the layer (their rows are not computed: SwitchTransformersExperts gathers each hit expert's kept tokens,
    ``torch.where(expert_mask[...])`` then ``index_add_``, l.168-180, no zero-padded capacity buffer). Balanced
    routing: a sequence sends ``seq // n`` tokens to every expert and one more to ``seq % n`` of them
    (:func:`~wattcast.featurize.hf_models.expert_row_split`'s split), each capped at the capacity. No capacity
    (None): every token, ``batch x seq`` (Switch paper, Fedus et al. 2021, eq. 3: capacity = capacity factor x tokens
    / experts; a capacity at or above the balanced share drops nothing)."""
    if batch < 1 or seq < 1 or n_experts < 1:
        raise GraphError(f"switch_processed_tokens: batch {batch}, seq {seq} and num_experts {n_experts} must be >= 1")
    if capacity is None:
        return batch * seq
    base, extra = divmod(int(seq), int(n_experts))
    per_seq = extra * min(capacity, base + 1) + (n_experts - extra) * min(capacity, base)
    return batch * per_seq


def _sparse_ff(b: GraphBuilder, cfg: HFConfig, x: Tensor, prefix: str) -> Tensor:
    # deferred: hf_models imports this module
    from wattcast.featurize.hf_models import active_local_experts, expert_row_split

    bs, s, h = x.shape
    t = bs * s
    n_exp = cfg.count("num_experts", default=8)
    if n_exp % b.ep:
        raise GraphError(f"{n_exp} experts are not divisible by expert parallelism {b.ep}")
    cap = cfg.count("expert_capacity")  # per sequence and expert (absent: no token dropped)
    sp = b.tp if (b.sp and b.tp > 1) else 1  # x is a sequence shard under sequence parallelism
    s_full = s * sp
    # the rows this rank's experts compute: its tokens' kept ones (balanced all-to-all: a rank receives as many as it
    # sends), routed on the full sequence
    rows = switch_processed_tokens(bs, s_full, n_exp, cap)
    shard_rows = -(-rows // sp)  # a sequence shard's part of the dispatch buffer (the gather is even)
    x32 = b.copy(x, name=f"{prefix}.router.to_fp32") if b.dtype != "fp32" else x
    # the router stays out of the FP8 recipe, as every MoE router here (README: "an MoE router ... stay[s] bf16"); HF
    # runs it on the fp32 copy (SwitchTransformersTop1Router, router_dtype float32)
    logits = b.linear(x32, n_exp, bias=cfg.flag("router_bias", False), name=f"{prefix}.router.classifier", fp8=False)
    probs = b.softmax(logits, name=f"{prefix}.router.softmax")
    # argmax, one_hot, cumsum, capacity mask, max: small (T, E) kernels off the gradient path
    for k, op in enumerate(("argmax", "one_hot", "cumsum", "le", "mul", "max")):
        b.opaque(f"{prefix}.router.{op}", [probs], (bs, s, n_exp), flops=float(t * n_exp), op_class="other", grad=False)
    out = b.copy(x, name=f"{prefix}.clone")
    # expert parallelism: each rank holds n_exp/ep experts and receives their rows from every rank
    disp = b.copy(Tensor((shard_rows, h), x.dtype, x.node, x.tid), name=f"{prefix}.dispatch_buffer")
    if b.ep > 1:
        disp = b.all_to_all(disp, name=f"{prefix}.dispatch")
    disp = b.tp_enter(disp, name=f"{prefix}.enter")
    local = n_exp // b.ep
    # the experts the expert-parallel group's tokens reach (transformers loops over ``expert_hit`` only), each on at
    # least one row; the rows split over them so that they add up to ``rows`` (every kept token computed once)
    active = min(active_local_experts(n_exp, 1, bs * s_full * b.ep, b.ep), rows)
    for e, per in enumerate(expert_row_split(rows, active)):
        mark = b.node_mark
        with b.scope(f"{prefix}.experts.{e}"):
            buf = b.copy(Tensor((per, h), disp.dtype, disp.node, disp.tid), name=f"experts.{e}.gather")
            y = _dense_ff(b, cfg, buf, f"experts.{e}", tp_region=False)
            out = b.copy(Tensor((per, h), y.dtype, y.node, y.tid), name=f"experts.{e}.scatter")
    b.hold_params(mark, local - active)  # the idle experts' weights: resident, not read
    comb = b.tp_exit(Tensor((shard_rows * sp, h), out.dtype, out.node, out.tid), name=f"{prefix}.exit")
    if b.ep > 1:
        comb = b.all_to_all(comb, name=f"{prefix}.combine")
    out = Tensor((bs, s, h), comb.dtype, comb.node, comb.tid)
    pmax = b.input((bs, s, 1))
    return b.elementwise("mul", pmax, out, name=f"{prefix}.router_scale")


def _is_sparse(i: int, step: int, n_sparse: int) -> bool:
    """SwitchTransformersStack: block i is sparse when ``i % step == 1`` (or step 1); step 0 makes none sparse."""
    return n_sparse > 0 and step > 0 and (step == 1 or i % step == 1)


def _stack(b: GraphBuilder, cfg: HFConfig, x: Tensor, *, decoder: bool, enc: Tensor | None, impl: str, n_layers: int,
           layer_offset: int, batch: int) -> Tensor:
    p = cfg.fraction("dropout_rate", default=0.1)
    kind = "decoder" if decoder else "encoder"
    step = cfg.count(f"{kind}_sparse_step", default=1, minimum=0)
    n_sparse = cfg.count(f"num_sparse_{kind}_layers", default=0, minimum=0)
    if cfg.model_type == "t5":
        n_sparse = 0
    s = x.shape[1] * (b.tp if b.sp else 1)  # the full sequence (x is a sequence shard under SP)
    bias = cross_bias = None
    for i in range(n_layers):
        with b.layer(layer_offset + i, f"{kind}.block.{i}"):
            if i == 0:
                # the relative position bias (its bucket table is a parameter) is computed whatever the attention
                # kernel: a fused kernel takes it as an additive mask (SDPA's attn_mask), it does not make it away
                bias = _position_bias(b, cfg, batch, s, s, name=f"{kind}.position_bias")
            y = rms_norm_eager(b, x, "layer_norm_sa", module="layernorm")
            a = _attention(b, cfg, y, None, bias, impl=impl, causal=decoder, prefix="SelfAttention")
            x = b.elementwise("add", x, b.dropout(a, p, name="sa.dropout"), name="sa.residual")
            if decoder and enc is not None:
                y = rms_norm_eager(b, x, "layer_norm_ca", module="layernorm")
                a = _attention(b, cfg, y, enc, cross_bias, impl=impl, causal=False, prefix="EncDecAttention")
                x = b.elementwise("add", x, b.dropout(a, p, name="ca.dropout"), name="ca.residual")
            y = rms_norm_eager(b, x, "layer_norm_ff", module="layernorm")
            sparse = _is_sparse(i, step, n_sparse)
            with b.tag("moe" if sparse else "mlp"):  # Megatron-Core's recompute modules (featurize/recompute.py)
                y = _sparse_ff(b, cfg, y, "mlp") if sparse else _dense_ff(b, cfg, y, "DenseReluDense")
            x = b.elementwise("add", x, b.dropout(y, p, name="ff.dropout"), name="ff.residual")
    return x


def switch(cfg: HFConfig, b: GraphBuilder, batch: int, seq: int, *, impl: str) -> None:
    p = cfg.fraction("dropout_rate", default=0.1)
    n_enc = cfg.n_layers
    n_dec = cfg.total_layers - n_enc  # num_decoder_layers, default the encoder's
    with b.layer(-1, "encoder.embed_tokens"):
        x = vocab_embedding(b, b.input((batch, seq), "fp32"), cfg.vocab, cfg.hidden, name="shared")
        x = b.dropout(x, p, name="encoder.dropout")
    x = _stack(b, cfg, x, decoder=False, enc=None, impl=impl, n_layers=n_enc, layer_offset=0, batch=batch)
    total = n_enc + n_dec
    with b.layer(n_enc - 1, "encoder.final_layer_norm"):
        enc = b.dropout(rms_norm_eager(b, x, "encoder.final_layer_norm"), p, name="encoder.final_dropout")
        y = b.embedding(b.input((batch, seq), "fp32"), cfg.vocab, cfg.hidden, name="decoder.embed_tokens", params=False,
                        parallel=True)
        y = b.tp_exit(y, name="decoder.embed_tokens.reduce")
        y = b.dropout(y, p, name="decoder.dropout")
    y = _stack(b, cfg, y, decoder=True, enc=enc, impl=impl, n_layers=n_dec, layer_offset=n_enc, batch=batch)
    with b.layer(total, "lm_head"):
        y = b.dropout(rms_norm_eager(b, y, "decoder.final_layer_norm"), p, name="decoder.final_dropout")
        tied = cfg.flag("tie_word_embeddings", True)
        if tied:
            y = b.elementwise("mul", y, cfg.hidden ** -0.5, name="lm_head.scale")
        logits = b.linear(b.tp_enter(y, name="lm_head.enter"), padded_vocab(b, cfg.vocab), bias=False, name="lm_head",
                          weight_params=not tied, parallel="col")
        if tied:  # the shared embedding: a pipeline's last stage holds a copy (simulate/distributed.py)
            b.meta["tied_output_params"] = vocab_shard_params(b, cfg.vocab, cfg.hidden)
        if b.train:
            b.cross_entropy(logits, name="loss", vocab_parallel=True)
