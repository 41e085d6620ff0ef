"""Peak device memory of one step: weights, gradients, optimizer states, activations.

- weights: parameters x dtype bytes; mixed precision (fp16/bf16) training adds fp32 master weights (4 B);
- gradients (training): parameters x dtype bytes; under mixed precision fp32 (4 B: PyTorch AMP's ``.grad`` of its fp32
  parameters, as the cluster path's ``hf`` framework holds them, ``stage_memory.held_gradient_bytes``), so one device
  and a one-GPU cluster count the same 18 B/param of model states with AdamW;
- optimizer states: AdamW two fp32 moments (8 B/param), SGD none (torch's default, no momentum);
- activations (training): every tensor a forward op saves for backward, each counted once (the input of
  q/k/v projections is one tensor); ``selective`` recomputation drops what its modules make and keeps their inputs
  (the attention core by default; Megatron-Core's ``--recompute-modules``: :func:`kept_tensors`), ``full`` keeps
  only each block's input plus one block's activations (re-made during its backward);
- transient: the largest single kernel's inputs + output beyond the above, which is what tips a large-vocabulary
  model over the edge; the weights a kernel reads are not in it, a tied LM head's included
  (:func:`resident_weight_bytes`); a loss's kernels hold what its framework's loss holds beyond what it saves
  (``featurize.op_graph.loss_working_bytes``: PyTorch's fp32 cross-entropy 12 - db bytes a logit, Megatron's db).
  A cluster's pipeline stage adds its own layers' largest the same way (``transient_gb``; the loss's on the last
  stage), so one device and a one-GPU cluster carry the same transient;
- inference: weights plus the largest kernel's working set (no saved activations), plus the KV cache of a KV-cached
  step (``kv_context``: batch x (context + new tokens) x 2 x layers x KV heads x head dim x dtype bytes, its own term
  ``kv_cache_gb``; the working set then leaves out the cache it reads). Under an FP8 recipe the linear layers'
  weights are held in FP8, the row-wise copy alone (1 B, plus its block scales under mxfp8 / blockwise;
  :func:`inference_weight_bytes`).

Not counted (stated): the CUDA context and allocator fragmentation (typically 0.3-1 GB on the device).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from wattcast.data.kernel_ops import DTYPE_BYTES
from wattcast.featurize.graph_cache import GraphMemo
from wattcast.featurize.fp8_recipes import (DEFAULT_FP8_RECIPE, inference_weight_bytes_per_param,
                                            weight_copy_bytes_per_param)
from wattcast.featurize.op_graph import OpGraph
from wattcast.featurize.recompute import module_layers_end, node_tags, recompute_tags, storage_rerun_tags
from wattcast.featurize.training_graph import muon_fraction, optimizer_state_bytes
from wattcast.simulate.stage_memory import foreach_step_bytes, held_gradient_bytes

GB = 1e9

#: relative band around a device's capacity inside which "fits" / "does not fit" is within the memory
#: estimate's error (one of vTrain's 968 measured runs was predicted at 81.2 GB on 80 GB and ran)
TIGHT_MEMORY_FRACTION = 0.05
#: fraction of a device's capacity (its catalog GB read as GiB, ``stage_memory.capacity_gb``: 64 GB = 68.7e9 bytes) from
#: which an eager single-GPU training step's forward ran slower than its kernels on the NeuSight labels (the caching
#: allocator frees and retries as activations pile up): MI210's train runs predicted at 84% and 92% of its 68.7 GB ran
#: their forward 2.8x and 1.8x the predicted kernel time (backward within 4%), its runs at 64% and below within 10%;
#: set between the two on that training GPU (0.85 of 64e9 bytes until stop 34 compared against decimal GB: the same
#: 54.4e9 bytes). (Held-out, not used to set it: the A100 80GB's runs at 67% and 75% had their forward within 8%.)
MEMORY_PRESSURE_FRACTION = 0.79


def memory_flag(predicted_gb: float, capacity_gb: float, *, eager_training: bool) -> str:
    """``"tight"`` within :data:`TIGHT_MEMORY_FRACTION` of capacity either way (fit or not is inside the
    estimate's error), ``"pressure"`` for an eager training step from :data:`MEMORY_PRESSURE_FRACTION` of
    capacity up to the tight band (it fits, its step time may be low), else ``""``."""
    if capacity_gb <= 0:
        return ""
    frac = predicted_gb / capacity_gb
    if abs(frac - 1.0) <= TIGHT_MEMORY_FRACTION:
        return "tight"
    if eager_training and MEMORY_PRESSURE_FRACTION <= frac < 1.0 - TIGHT_MEMORY_FRACTION:
        return "pressure"
    return ""


@dataclass(frozen=True)
class MemoryEstimate:
    weights_gb: float
    gradients_gb: float
    optimizer_gb: float
    activations_gb: float
    transient_gb: float
    #: the KV cache of a KV-cached inference step (0 otherwise)
    kv_cache_gb: float = 0.0

    @property
    def total_gb(self) -> float:
        return (self.weights_gb + self.gradients_gb + self.optimizer_gb + self.activations_gb + self.transient_gb
                + self.kv_cache_gb)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total_gb"] = self.total_gb
        return d


#: per graph (by identity, while it lives; made again for a graph given other nodes, saved tensors or meta): its
#: :func:`estimate_memory`
_MEMORY = GraphMemo(max_entries=256)


def graph_memory(graph: OpGraph) -> MemoryEstimate:
    """:func:`estimate_memory` of ``graph``, made once per graph (a MemoryEstimate is frozen: shared safely)."""
    return _MEMORY.get_or_build(graph, (graph.nodes, graph.saved, graph.meta), lambda: estimate_memory(graph))


def estimate_memory(graph: OpGraph) -> MemoryEstimate:
    meta = graph.meta
    dtype = meta.get("dtype", "fp32")
    db = DTYPE_BYTES.get(dtype, 4)
    params = float(meta.get("param_count", 0))
    train = meta.get("mode") == "train"
    weights = params * db
    grads = opt = acts = 0.0
    nodes = graph.nodes
    fwd = nodes[nodes["phase"] == "forward"]
    # working set of the largest kernel (inputs + output), minus weights it reads
    own_w = resident_weight_bytes(graph, fwd, db)
    if not train:
        return _inference_memory(graph, fwd, own_w, db)
    transient = float(np.max(kernel_working_bytes(graph, fwd, own_w))) if len(fwd) else 0.0
    # an FP8 recipe: Transformer Engine keeps each FP8 GEMM's weight cast (and its transpose) between steps, 2 B/param
    weights += fp8_weight_copy_bytes(graph)
    if train:
        if db < 4:
            weights += params * 4  # fp32 master copy
        grads = params * held_gradient_bytes("hf", dtype, db)
        optimizer = meta.get("optimizer", "adamw")
        opt = params * optimizer_state_bytes(optimizer, muon_fraction(meta))
        step_tmp = foreach_step_bytes(opt, optimizer, meta.get("optimizer_impl"))
        recompute = meta.get("recompute", "none")
        tbytes = graph.saved.get("tensor_bytes", np.zeros(0))
        kept = kept_tensors(graph)
        if recompute == "full":
            n_layers = int(meta.get("n_layers", 0)) or 1
            per_layer = {}
            outside = 0.0
            for t, lay in kept.items():
                if 0 <= lay < n_layers:
                    per_layer[lay] = per_layer.get(lay, 0.0) + float(tbytes[t])
                else:
                    outside += float(tbytes[t])
            # a block's input is the previous block's output: hidden-size activation per layer
            block_in = [float(v) for v in block_input_bytes(graph, n_layers)]
            acts = outside + sum(block_in) + (max(per_layer.values()) if per_layer else 0.0)
        else:
            acts = float(sum(float(tbytes[t]) for t in kept))
        # the step runs after the backward has freed the activations: its temporary (foreach AdamW's fp32 copy of the
        # second moments, stage_memory.foreach_step_bytes) is the peak's only where it exceeds them and the largest
        # kernel's working set: peak = states + max(activations + transient, step temporary)
        transient = max(transient, step_tmp - acts)
    return MemoryEstimate(weights / GB, grads / GB, opt / GB, acts / GB, max(transient, 0.0) / GB)


def kernel_working_bytes(graph: OpGraph, fwd, own_w: np.ndarray) -> np.ndarray:
    """Each forward kernel's working set of a training step beyond the held weights (``own_w``,
    :func:`resident_weight_bytes`): its inputs + output, except a loss's kernels, which hold what
    ``featurize.op_graph.loss_working_bytes`` says (``meta["loss_working_bytes"]``: node name -> bytes; the framework's
    loss beyond what the graph saves). The largest is the step's transient, on one device
    (:func:`estimate_memory`) and per pipeline stage (:func:`transient_bytes_by_layer`).

    A node costed as several launches run one after another holds one launch's share of its bytes
    (``meta["working_set_share"]``: node name -> share; context parallelism's KV ring, whose cp - 1 output corrections
    are one node and whose attention node reads all cp KV chunks while Transformer Engine keeps two per-step buffers:
    featurize/op_graph.py ``flash_attention``, TE 2.20.2 context_parallel.py l. 1900-1944, 2038-2231)."""
    work = fwd["bytes"].to_numpy(dtype=float)
    share = graph.meta.get("working_set_share") or {}
    if share:
        work = work * fwd["name"].map(share).fillna(1.0).to_numpy(dtype=float)
    work = work - own_w
    loss = graph.meta.get("loss_working_bytes") or {}
    if loss:
        over = fwd["name"].map(loss).to_numpy(dtype=float)
        work = np.where(np.isnan(over), work, over)
    return work


def transient_bytes_by_layer(graph: OpGraph) -> dict[int, float]:
    """Per layer of a training graph, its largest forward kernel's working set (:func:`kernel_working_bytes`): what a
    pipeline stage adds to its activations at its peak (its layers' largest; the last stage's is the loss's, per
    micro-batch and TP rank's vocabulary shard), as one device adds the whole graph's largest. Empty for inference."""
    if graph.meta.get("mode") != "train":
        return {}
    nodes = graph.nodes
    fwd = nodes[nodes["phase"] == "forward"]
    if not len(fwd):
        return {}
    db = DTYPE_BYTES.get(graph.meta.get("dtype", "fp32"), 4)
    work = kernel_working_bytes(graph, fwd, resident_weight_bytes(graph, fwd, db))
    ids, inv = np.unique(fwd["layer"].to_numpy(), return_inverse=True)
    top = np.full(len(ids), -np.inf)
    np.maximum.at(top, inv, work)
    return dict(zip(ids.astype(int).tolist(), top.tolist()))


def resident_weight_bytes(graph: OpGraph, fwd, db: int) -> np.ndarray:
    """Bytes of weights each forward node reads that are held as the model's weights (not in its working set): its
    own parameters, and a tied weight it reads (``meta["tied_weight_params"]``: node name -> parameters, recorded by
    ``GraphBuilder.linear``), whose parameters are counted once, in the layer that owns them. Until stop 54 a tied LM
    head (param_count 0) had its weight counted again in the largest kernel's working set: 1.05 GB of Gemma 2B's
    6.06 GB at batch 1 x 128 tokens of inference (256,000 x 2,048 x 2 B), 77 MB for GPT-2."""
    own = fwd["param_count"].to_numpy(dtype=float)
    tied = graph.meta.get("tied_weight_params") or {}
    if tied:
        own = own + fwd["name"].map(tied).fillna(0.0).to_numpy(dtype=float)
    return own * db


def _inference_memory(graph: OpGraph, fwd, own_w: np.ndarray, db: int) -> MemoryEstimate:
    """An inference step: the weights as held (:func:`inference_weight_bytes`), the KV cache (its own term) and the
    largest kernel's working set beyond both (a decode attention kernel reads its layer's cache: not counted twice)."""
    kv_tids = graph.meta.get("kv_cache_tids") or []
    kv = 0.0
    work = fwd["bytes"].to_numpy(dtype=float) - own_w
    if kv_tids:
        tbytes = graph.saved["tensor_bytes"]
        kv = float(tbytes[kv_tids].sum())
        cached = set(int(t) for t in kv_tids)
        reads = np.array([float(sum(tbytes[t] for t in tids if t in cached)) for tids in graph.saved["input_tids"]])
        work = work - reads[: len(work)] if len(reads) == len(graph.nodes) else work
    transient = float(np.max(work)) if len(work) else 0.0
    return MemoryEstimate(inference_weight_bytes(graph, db) / GB, 0.0, 0.0, 0.0, max(transient, 0.0) / GB, kv / GB)


def inference_weight_bytes(graph: OpGraph, db: int) -> float:
    """Bytes of the weights an inference step holds: parameters x dtype bytes, except the FP8 linear layers' weights,
    held in FP8 (1 B a parameter, their biases in the model's dtype) and read by the FP8 GEMMs as they are, with no
    per-forward cast: serving engines load FP8 checkpoints so (vLLM's Fp8LinearMethod keeps ``layer.weight`` in
    float8_e4m3fn; TensorRT-LLM's FP8 checkpoints; Transformer Engine's ``fp8_model_init`` builds the modules with FP8
    parameters and no higher-precision copy). Embedding, norms and output layer stay in the model's dtype, as the
    training recipe keeps them (hf_blocks.lm_head_and_loss; vLLM does not quantize ``lm_head`` or the embedding).
    Until stop 41 inference held the weights in bf16 plus the largest FP8 cast (16.1 GB for Llama 3 8B, whose FP8
    serving checkpoint is 9.1 GB). The FP8 weight is the row-wise copy alone, with its row-wise block scales under
    mxfp8 / blockwise (:func:`~wattcast.featurize.fp8_recipes.inference_weight_bytes_per_param`: no transpose or
    column-wise copy without a backward; until stop 45 the block scales were not counted).

    The FP8 weights are every FP8 linear layer's weights the model holds, not the ones the step runs: a MoE layer's
    idle experts are parameters of its running experts' nodes (``GraphBuilder.hold_params`` for the Hugging Face loop,
    ``own_params`` for vLLM's fused grouped GEMM, featurize/hf_models.py ``_moe_experts`` / ``_moe_vllm_fused``), and
    an FP8 checkpoint holds them in FP8 as well (vLLM's ``Fp8MoEMethod`` creates ``w13_weight`` / ``w2_weight`` of all
    ``num_experts`` in float8_e4m3fn). A node's parameters are whole copies of its weight plus its bias: N x K + K each
    for a biased linear (kernel ``linear``), N x K for one without (``bmm``; the grouped GEMM's B matrices), none for a
    tied weight (counted where it is owned). Until stop 57 each node was capped at one N x K matrix, so the experts a
    step did not route stayed at the model's dtype: Mixtral 8x7B FP8 held 80.8 GB at batch 1 (46.97 GB from batch 64,
    every expert routed) and 86.4 GB served (the fused node's 8 experts capped at one), refused as OOM on one H100."""
    n = graph.nodes
    params = float(graph.meta.get("param_count", 0))
    sel = ((n["phase"] == "forward") & (n["dtype"] == "fp8") & (n["op_class"] == "linear")).to_numpy()
    if not sel.any():
        return params * db
    lin = n.loc[sel]
    p = lin["param_count"].to_numpy(dtype=float)
    in_f = lin["N"].to_numpy(dtype=float)
    # the weight's share of a node's parameters: N x K of every N x K + K (biased), all of them unbiased, none tied
    share = np.where(lin["kernel"].to_numpy() == "linear", in_f / (in_f + 1.0), 1.0)
    tied = graph.meta.get("tied_weight_params") or {}
    if tied:
        share = np.where(lin["name"].isin(list(tied)).to_numpy(), 0.0, share)
    fp8_w = float(np.sum(p * share))
    recipe = graph.meta.get("fp8_scaling") or DEFAULT_FP8_RECIPE
    return (params - fp8_w) * db + fp8_w * inference_weight_bytes_per_param(recipe)


def fp8_weight_copy_bytes(graph: OpGraph) -> float:
    """Bytes of the FP8 weight copies an FP8 recipe holds. Training: Transformer Engine keeps the fp8 weight and its
    transpose (for the dgrad GEMM; the data alone on data-centre Blackwell under a per-tensor recipe: the graph's
    ``fp8_transpose``) of every FP8 linear layer between steps (``is_first_microbatch`` caching): 2 B per
    parameter. (Inference holds its linear weights in FP8 instead of a bf16 copy: :func:`inference_weight_bytes`.)"""
    n = graph.nodes
    sel = (n["phase"] == "forward") & (n["dtype"] == "fp8")
    if not sel.any():
        return 0.0
    # mxfp8 / blockwise: the copies' block scales on top (featurize/fp8_recipes.py)
    per_param = weight_copy_bytes_per_param(graph.meta.get("fp8_scaling") or DEFAULT_FP8_RECIPE,
                                            bool(graph.meta.get("fp8_transpose", True)))
    return per_param * float(n.loc[sel, "param_count"].to_numpy(dtype=float).sum())


def kept_tensors(graph: OpGraph) -> dict[int, int]:
    """The tensors a training step's forward keeps for backward -> the layer each belongs to: the layer of the op
    that keeps it (the first such op's), not of the op that made it, under the graph's recomputation
    (``featurize/recompute.py``). A layer's output is kept by the next layer's input norm, so it counts there: a
    pipeline stage holds the input it received (its first layer's) and not the output it sent, which Megatron-LM
    frees once sent (``kw_args['deallocate_pipeline_outputs'] = True``, megatron-core 0.19.2
    megatron/training/argument_utils.py l. 305; megatron/core/pipeline_parallel/schedules.py l. 166
    ``deallocate_output_tensor`` pseudo-frees its storage). Until stop 57 a tensor counted in its maker's layer: the
    first stage held its last layer's output too (+2·s·b·h/t per micro-batch in flight under SP, 0.54 GB on Llama 3
    405B's stage 0 at 8,192 tokens), the last stage missed its received input. Not counted (stated): DeepSpeed's
    pipeline engine (``megatron-deepspeed``) keeps each sent output, its 1/tp partition under TP, until that
    micro-batch's backward (DeepSpeed 0.19.8 runtime/pipe/engine.py l. 731-751, 864-865). ``full`` keeps everything
    here (``estimate_memory`` keeps block inputs). Selective, per recomputed module (the ops of a transformer layer
    tagged with it):

    - a recomputed module keeps its inputs (the tensors its ops read that were made outside it, in their own dtype)
      and nothing made inside it or by no op (an FP8 copy, a dropout mask): re-made in the backward. Its outputs stay
      where an op outside keeps them (the attention core's: Korthikanti et al. 2022 Sec. 5 drops exactly the 5as^2
      terms and keeps q, k, v). Under RoPE in Megatron-Core the checkpoint's inputs are the rotated q and k and v, a
      view of the fused QKV output, whose whole storage it holds (``saved["checkpoint_saves"]``); without
      recomputation Transformer Engine copies that v contiguous (its strides match no layout beside the new k: TE
      2.20.2 ``get_qkv_layout``, attention/dot_product_attention/utils.py l. 2963-2966) and saves the copy, so there the
      fused output is not kept and selective holds more than none, by the rotated q and k less the fp32
      log-sum-exp (``tests/test_megatron_memory.py``, stop 52);
    - an output-discarding module (``moe_act``, ``layernorm``, ``mla_up_proj``: Megatron-Core's
      ``CheckpointWithoutOutput``) also gives up its outputs, whoever keeps them (re-made before the consumer's
      backward); an FP8 GEMM's own FP8 copy of such an output stays (Transformer Engine keeps it).

    Under DeepSeek-V3's storage (``--fp8-recipe deepseek``, tech report arXiv 2412.19437): an FP8 copy of a tensor
    that an output-discarding module or a MoE SwiGLU (tag ``fp8_swiglu``) makes is not kept either -- re-made with
    the output it quantises (Sec. 3.2.3: recomputing RMSNorm and the MLA up-projections "eliminat[es] the need to
    persistently store their output activations"; Sec. 3.3.3 (2): the SwiGLU output is recomputed in the backward);
    and ``moe_act`` is the recipe's own SwiGLU recomputation (its FP8-cached input kept, not the bf16 one).

    A tensor any op keeps under these rules is kept; one that is another's storage (``saved["storage_of"]``: Transformer
    Engine's attention output and the view of it ``linear_proj`` saves, featurize/te_attention.py) is kept once, as
    that one."""
    nodes = graph.nodes
    fwd = nodes[nodes["phase"] == "forward"]
    layers = fwd["layer"].to_numpy()
    tbytes = graph.saved.get("tensor_bytes", np.zeros(0))
    tnode = graph.saved.get("tensor_node", np.full(len(tbytes), -1))
    ckpt, discard = recompute_tags(graph.meta.get("recompute", "none"))
    stored = storage_rerun_tags(graph.meta, graph.meta.get("recompute", "none"))  # DeepSeek-V3's storage's re-runs
    deepseek = bool(stored)
    fp8_source = graph.saved.get("fp8_source") or {}
    remade: set = set()  # tags whose outputs' FP8 copies are re-made with them (DeepSeek-V3's storage)
    if deepseek:
        discard = discard - {"moe_act"}
        remade = discard | stored
    rec = ckpt | discard
    # the modules' tags of each op of a transformer layer (the final norm, the embedding and the head are not
    # recomputed; multi-token prediction's block, in the head's layer, is: recompute.module_layers_end)
    end = module_layers_end(graph.meta)
    tags = [node_tags(t) if 0 <= lay < end else frozenset() for t, lay in zip(fwd["tag"].to_numpy(), layers)] \
        if rec or deepseek else None
    input_tids = graph.saved.get("input_tids")
    # a tensor that is another's storage (Transformer Engine's attention output handed to linear_proj as a view:
    # GraphBuilder.te_attention_output) is kept, once, as that one
    storage_of = graph.saved.get("storage_of") or {}
    # a tensor a checkpointed module keeps as its input -> what it holds in memory instead (Megatron-Core's rotated
    # q and k beside the fused QKV output, v's storage: GraphBuilder.rotary_checkpoint_inputs)
    ckpt_saves = graph.saved.get("checkpoint_saves") or {}
    kept: dict[int, int] = {}

    def keep(t: int, keeper: int, checkpointed: bool = False) -> None:
        if checkpointed and t in ckpt_saves:
            for u in ckpt_saves[t]:
                keep(u, keeper)
            return
        t = storage_of.get(t, t)
        if t not in kept:
            kept[t] = int(layers[keeper])

    def remade_copy(t: int) -> bool:  # an FP8 copy of an output DeepSeek-V3's storage re-makes
        of = fp8_source.get(t)
        return of is not None and int(tnode[of]) >= 0 and bool(tags[int(tnode[of])] & remade)

    for i, ids in enumerate(graph.saved.get("by_node", [])):
        inside = tags[i] & rec if tags is not None else frozenset()
        checkpointed = bool(tags[i] & ckpt) if tags is not None else False
        for t in ids:
            src = int(tnode[t])
            if deepseek and remade_copy(t):
                continue
            if tags is not None:
                made_by = tags[src] if src >= 0 else frozenset()
                if made_by & discard or (inside and (src < 0 or made_by & inside)):
                    continue  # an output-discarding module's tensor, or one a recomputed module re-makes
            keep(t, i, checkpointed)
        if inside and input_tids is not None:
            for t in input_tids[i]:  # the module's inputs, made outside it (unless an output-discarding module made them)
                src = int(tnode[t])
                if src >= 0 and not (tags[src] & inside) and not (tags[src] & discard):
                    keep(t, i, checkpointed)
    return kept


def block_input_bytes(graph: OpGraph, n_layers: int) -> list[float]:
    """Bytes of each block's input, what a fully recomputed (checkpointed) block keeps: the tensors its forward nodes
    read that the node just before the block made (the residual stream, s·b·h in the model's dtype: Korthikanti et
    al. 2022 Sec. 4.2, 2·s·b·h bytes a layer under full recomputation). ``torch.utils.checkpoint`` keeps exactly the
    checkpointed function's arguments (torch 2.13 utils/checkpoint.py l. 271 ``ctx.save_for_backward(*tensor_inputs)``,
    reentrant; l. 1657-1688 ``recompute_fn`` re-runs ``fn(*args, **kwargs)`` on the forward's arguments,
    non-reentrant), whatever the kernels inside it are. Until stop 58 the whole output of the node before the block
    was taken: under ``--compile`` that node is a fused kernel (featurize/fusion.py) also writing the previous
    block's post-attention norm output, two residual-sized tensors, so a compiled full-recompute step held (L - 1)
    residuals too many (+2.08 GB on Llama 3 8B at 8,192 tokens). A graph without per-node tensor inputs keeps the
    node's whole output, as before."""
    out_bytes = graph.saved.get("out_bytes")
    input_tids = graph.saved.get("input_tids")
    tbytes = graph.saved.get("tensor_bytes")
    tnode = graph.saved.get("tensor_node")
    nodes = graph.nodes
    fwd_layers = nodes.loc[nodes["phase"] == "forward", "layer"].to_numpy()
    by_tensor = input_tids is not None and tbytes is not None and tnode is not None and len(input_tids) >= len(fwd_layers)
    res = []
    for lay in range(n_layers):
        idx = np.flatnonzero(fwd_layers == lay)
        if len(idx) and idx[0] > 0 and out_bytes is not None:
            prev = idx[0] - 1
            if by_tensor:
                read = {int(t) for i in idx for t in input_tids[i] if int(tnode[t]) == prev}
                res.append(float(sum(float(tbytes[t]) for t in read)) if read else float(out_bytes[prev]))
            else:
                res.append(float(out_bytes[prev]))
    return res


def activation_bytes_by_layer(graph: OpGraph) -> tuple[dict[int, float], dict[int, float]]:
    """(saved activation bytes per layer for one micro-batch, full activations of each transformer layer under
    ``full`` recomputation).

    Under ``full`` recomputation a transformer layer keeps only its input; the second value holds, per transformer
    layer, what it re-materialises during its backward (a stage adds its largest one, once: its layers' backwards run
    one after another). Only transformer layers are checkpointed: Megatron-Core's ``TransformerBlock._checkpointed_forward``
    wraps its layers alone (megatron-core 0.16.1 transformer/transformer_block.py l. 446-560), and the output layer and
    the loss run outside the block (models/gpt/gpt_model.py l. 685, 714), their activations saved as usual (counted on
    the last stage by the first value). Until stop 47 the largest layer of all was taken, the head's fp32 logits
    included (2.1 GB for Llama 3 8B at TP 2, seq 8192), and added on every stage. Empty without full recomputation."""
    tbytes = graph.saved.get("tensor_bytes", np.zeros(0))
    recompute = graph.meta.get("recompute", "none")
    per: dict[int, float] = {}
    for t, lay in kept_tensors(graph).items():
        per[lay] = per.get(lay, 0.0) + float(tbytes[t])
    if recompute != "full":
        return per, {}
    n_layers = int(graph.meta.get("n_layers", 0))
    # (a graph that does not say how many transformer layers it has: every layer is taken for one)
    full = {k: v for k, v in per.items() if 0 <= k < (n_layers if n_layers > 0 else np.inf)}
    block_in = block_input_bytes(graph, n_layers)
    for lay in range(n_layers):
        if lay in per:
            per[lay] = block_in[lay] if lay < len(block_in) else 0.0
    return per, full
