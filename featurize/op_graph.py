"""The typed operator graph every workload importer produces, and the builder that makes it.

One row per kernel (``OpGraph.nodes``, a pandas frame) plus data-dependency edges (``OpGraph.edges``,
an ``(E, 2)`` int array of node ids). Importers (Hugging Face configs, ONNX, ``torch.export``) call the
:class:`GraphBuilder` methods for the *forward* pass; each method also records the backward kernels of
the op, so :func:`wattcast.featurize.training_graph.training_graph` can derive backward, recomputation
and the optimizer step from any importer's graph.

Node columns (units in names):

- ``name``; ``op_class``: one of :data:`OP_CLASSES` (``collective`` is reserved for the distributed
  scheduler); ``kernel``: the kernel-surrogate op (vocabulary of ``wattcast.data.kernel_ops``) or ``""``
  when no surrogate models it (then ``method`` says how it is costed);
- ``method``: ``surrogate`` (the learned kernel model), ``proxy`` (a memory-bound op costed as an
  elementwise kernel moving the same bytes), ``flash`` (the fused-attention cost model), ``roofline``
  (no model at all: the analytical roofline, flagged as a fallback);
- ``dtype``; the NeuSight shape columns ``B, M, N, K, H`` and conv columns (NaN when unused);
- ``flops``, ``bytes`` (read + written), ``scale`` (multiplier on the surrogate time of ``kernel``: a
  backward kernel that moves 1.5x the bytes of the forward kernel it is costed as has 1.5),
  ``param_count`` (parameters the op owns);
- ``layer`` (-1 before the first block, ``n_layers`` after the last), ``scope`` (module path),
  ``phase`` (``forward``/``backward``/``optimizer``), ``fwd_id`` (for backward nodes: the forward node
  they differentiate; -1 otherwise), ``recompute`` (a forward op re-run in backward), ``tag``
  (``attn_core`` for the ops selective recomputation re-runs), ``group`` (for ``collective`` nodes: the
  parallel group it runs over, ``tp``/``ep``; ``bytes`` is then the message size per rank with
  nccl-tests semantics).

Tensor parallelism (Megatron-LM) is built in, not bolted on: a builder made with ``tp > 1`` gives every
``linear(..., parallel="col")`` 1/tp of the output features and ``parallel="row"`` 1/tp of the input
features, so downstream shapes are one rank's shard; ``tp_enter``/``tp_exit`` emit the f/g operators
(identity/all-reduce, or with sequence parallelism all-gather/reduce-scatter), each with its conjugate as
its backward rule. ``ep > 1`` shards experts and emits the all-to-alls.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import pandas as pd

from wattcast.data.collective_ops import COLLECTIVES
from wattcast.data.kernel_ops import (BINARY_OPS, CONV_COLS, DTYPE_BYTES, FLASH_KERNELS, FLOPS_PER_ELEMENT, UNARY_OPS,
                                      canonical_dtype)
from wattcast.featurize.conv_gemm import tf32_conv_on_tensor_cores
from wattcast.featurize.context_parallel import cp_refuses_window, cp_ring_size
from wattcast.featurize.fp8_recipes import (CURRENT_SCALE_KERNEL_BYTES, E5M6_BYTES, activation_cast_copies,
                                            cast_scale_bytes, checked_fp8_recipe, scale_bytes)
from wattcast.featurize.te_attention import attention_output_shared

OP_CLASSES = (
    "linear", "bmm", "conv", "elementwise", "layernorm", "softmax", "reduction", "embedding", "memory",
    "dropout", "flash_attention", "loss", "optimizer", "collective", "other",
)
PHASES = ("forward", "backward", "optimizer")
METHODS = ("surrogate", "proxy", "flash", "roofline", "collective")
SHAPE_COLUMNS = ("B", "M", "N", "K", "H", *CONV_COLS[1:])
#: a graph's node columns. ``model_share``: the part of a node's ``flops`` that counts as model FLOPs (MFU's numerator,
#: simulate/single_device.model_flops); 1 but in eager attention (:func:`attention_pair_share`,
#: hf_blocks.eager_attention, and the matmul-written cores the ONNX and torch.export importers recognise), whose kernels
#: compute the masked pairs and the softmax work on the scores that the model FLOPs leave out (hardware FLOPs only)
NODE_COLUMNS = (
    "name", "op_class", "kernel", "method", "dtype", *SHAPE_COLUMNS, "flops", "bytes", "scale", "param_count",
    "layer", "scope", "phase", "fwd_id", "recompute", "tag", "group", "model_share",
)
#: collectives the graph can hold (costed by wattcast.models.collectives)
COLLECTIVE_OPS = COLLECTIVES
#: Backward time / forward time of the fused backward kernels PyTorch runs for LayerNorm (dX plus the
#: dgamma/dbeta reduction): the median ratio of measured ``bw_latency`` to ``fw_latency`` over the NeuSight
#: label-CSV nodes of the *training* GPUs (MI100, MI210, V100; 42 LN nodes; held-out GPUs not used). The
#: backward is costed as the forward kernel times this. FP32 kernels are costed without the isolated-timing
#: floor (simulate/single_device.py), so for them the ratio is taken in-stream, floor off both times: median
#: (bw - floor) / (fw - floor) over the same nodes, 2.95 (quartiles 2.34-3.2).
BACKWARD_RATIO = {"layernorm": 2.37}
BACKWARD_RATIO_IN_STREAM = {"layernorm": 2.95}
#: row width of the LayerNorm-shaped kernel a training-mode BatchNorm is costed as (GraphBuilder.batchnorm): its
#: per-channel statistics run over N*H*W elements, no row of the LN kernel data; its elements are laid out in rows of
#: a hidden size central to that data (BERT-large / GPT-2-medium's 1024; NeuSight LN labels), where the model is in
#: distribution for every tensor size. A channel's plane width (H*W: 49 to 12,544 in ResNet-50) is not: at width 64
#: the LN model flags the shape out of distribution.
NORM_EQUIV_WIDTH = 1024
#: softmax_backward_data (dx = y * (dy - sum(dy * y))) is memory-bound: it reads y and dy, reduces each
#: row, and reads them again to write dx. It is costed as the two-tensor ``mul`` kernel of the same (B, H)
#: times this factor: the median of measured ``bw_latency`` / predicted ``mul`` time (timing floor taken
#: off) over the 12 softmax nodes of the training-GPU train labels (MI100, MI210, V100; range 2.0-2.4,
#: flat in H from 512 to 2048; held-out GPUs not used). A ratio to the forward kernel is not: PyTorch's
#: forward softmax switches algorithm above H=1024 (measured bw/fw falls from ~2.5 to ~1.5 there).
SOFTMAX_BACKWARD_MUL = 2.1
#: op classes whose kernels run in TF32 when the step's dtype is tf32 (the rest stays fp32)
TF32_CLASSES = ("linear", "bmm", "conv", "flash_attention")
#: arithmetic ops that have a tensor-tensor and a tensor-scalar kernel in the surrogate vocabulary
_ARITH = ("add", "sub", "mul", "div", "pow")
#: selection ops (no kernel of their own): costed as ``add`` when they stream two tensors, else ``addu``
_SELECT = ("where", "masked_fill", "maximum", "minimum")
#: the float dtypes a cast (:meth:`GraphBuilder.copy` with ``out_dtype``) converts between ("fp8" also marks bool masks)
_FLOAT_DTYPES = ("fp32", "bf16", "fp16")


def _autograd_saves(op: str, big: list, no_grad: set) -> list:
    """The operands a product or quotient keeps for backward, as autograd's formulas need them (aten
    derivatives.yaml): ``a * b`` keeps ``b`` for ``a``'s gradient and ``a`` for ``b``'s, so a factor is kept only when
    another one needs a gradient (RoPE's ``q * cos`` keeps ``cos``, not ``q``); ``a / b`` keeps ``b`` whenever either
    needs a gradient and ``a`` only for ``b``'s. Other ops (pow, the fused SiLU-mul) keep every tensor operand."""
    needs = [t.tid not in no_grad for t in big]
    if op == "mul":
        return [t for i, t in enumerate(big) if any(n for j, n in enumerate(needs) if j != i)]
    if op == "div" and len(big) == 2:
        return [big[1]] + ([big[0]] if needs[1] else [])
    return list(big)


#: a broadcast operand smaller than 1/_CACHED_BROADCAST of an elementwise op's output bytes is read from
#: DRAM once and then hit in cache for every repetition, so the op costs like its one-tensor (scalar)
#: kernel; a larger one (OPT's (B,1,S,S) additive mask, 1/heads of the scores) is re-read every
#: repetition and the op costs like the two-tensor kernel. On the NeuSight label CSVs of the training GPUs
#: the BERT (B,1,1,S) mask add and the GPT-2 (1,1,S,S) bool-mask where run within ~10% of the scalar
#: division next to them, while OPT's mask add runs at the two-tensor add's time.
_CACHED_BROADCAST = 64


#: the largest tensor (bytes) a graph records: its byte counts are int64 arrays
_MAX_TENSOR_BYTES = np.iinfo(np.int64).max


#: the tag prefix naming the imported op an opaque (roofline) kernel stands for (GraphBuilder.opaque)
OP_TYPE_TAG = "op_type:"


def op_type_of_tag(tag) -> str:
    """The imported op type in a kernel's ``tag`` (``"attn_core,op_type:FrobnicateXYZ"`` -> ``"FrobnicateXYZ"``), else
    ""."""
    return next((t[len(OP_TYPE_TAG):] for t in str(tag or "").split(",") if t.startswith(OP_TYPE_TAG)), "")


def unmapped_ops_warning(unmapped: dict) -> str | None:
    """The warning of a graph with imported ops no cost model knows (op type -> count; None when there are none):
    they are costed by the roofline from their inputs and outputs, flagged in ``fallback_ops`` with their op type."""
    if not unmapped:
        return None
    items = list(unmapped.items())
    return (f"{sum(unmapped.values())} op(s) have no cost model and are costed by the roofline from their inputs and "
            f"outputs (flagged in fallback_ops): " + ", ".join(f"{k} x{v}" for k, v in items[:8])
            + (f", ... ({len(items) - 8} more op types)" if len(items) > 8 else ""))


class GraphError(ValueError):
    """A workload cannot be turned into an operator graph (bad shape, unknown op, ...)."""


def _numel(shape: Sequence[int]) -> int:
    return int(math.prod(map(int, shape))) if len(shape) else 1


def attention_pair_share(s: int, skv: int, *, causal: bool, window: int | None = None) -> float:
    """The share of the s x skv query-key pairs an attention's mask keeps (one device, no context parallelism): what a
    fused kernel computes (``GraphBuilder.flash_attention``'s FLOPs) and what model FLOPs count of attention's score
    and context products whatever the kernel (an eager attention computes all s x skv; hf_blocks.eager_attention).
    Causal self-attention keeps half: Megatron-LM's model FLOPs for MFU count it so (megatron-core 0.19.2
    megatron/training/training.py ``num_floating_point_operations`` l. 703-710: the "Core-attention (L^2) part: QK^T and
    (softmax(QK^T)) V", ``/ 2  # causal mask (only half of the mask is non-zero)``; l. 666-676 likewise for MLA), the two
    products alone (no softmax term)."""
    frac = 0.5 if causal and s == skv else 1.0
    if causal and s < skv:
        # queries at the end of a longer key sequence (a KV cache: s new tokens after skv - s cached ones): query i
        # sees skv - s + i + 1 keys, s x skv - s(s - 1)/2 pairs (a decode step, s = 1: all skv keys)
        frac = 1.0 - (s - 1) / (2.0 * skv)
    if window and causal and s == skv and s > window:
        # pairs (i, j) with 0 <= i - j < window, over the S x S square
        frac = (window * s - window * (window - 1) / 2.0) / float(s * s)
    return frac


def _frame_of_rows(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    """``pd.DataFrame(rows, columns=columns)`` built column by column (one list per column rather than pandas'
    row-by-row dict walk: the same frame, several times faster on graphs of 10^4-10^5 nodes). Every row must hold every
    column (the graph builders write them all); an empty ``rows``, or one missing a column, goes through pandas."""
    try:
        cols = {c: [r[c] for r in rows] for c in columns}
    except KeyError:  # a row without some column: pandas fills it with NaN
        cols = None
    if not rows or cols is None:
        return pd.DataFrame(rows, columns=columns)
    return pd.DataFrame(cols, columns=columns)


class _computed_once:
    """A read-only attribute computed on first access and stored in the instance's ``__dict__`` (later reads find it
    there without calling anything): ``functools.cached_property`` without the lock Python 3.11's takes on every first
    access, which cost more than the sizes it cached."""

    def __init__(self, fn):
        self.fn, self.name = fn, fn.__name__
        self.__doc__ = fn.__doc__

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


@dataclass(frozen=True)
class Tensor:
    """A value flowing through the graph: shape, dtype, the node that produced it (-1 = graph input)."""

    shape: tuple[int, ...]
    dtype: str
    node: int = -1
    tid: int = -1

    # computed once per tensor (a graph build asks each tensor's size many times); _computed_once writes the
    # instance __dict__ directly, so the frozen dataclass's fields, equality and hash are unchanged
    @_computed_once
    def numel(self) -> int:
        return _numel(self.shape)

    @_computed_once
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES.get(self.dtype, 4)


@dataclass(frozen=True)
class OpGraph:
    """Nodes (one row per kernel), edges (src, dst node ids) and metadata about the workload.

    Not changed in place once built: the step-graph caches share graphs, and the predict caches
    (``featurize/graph_cache.py`` ``GraphMemo``) keep what they derived from a graph for as long as it lives; to change
    a graph, build another (``dataclasses.replace`` with a new nodes frame or meta dict)."""

    nodes: pd.DataFrame
    edges: np.ndarray
    meta: dict = field(default_factory=dict)
    #: bytes of every activation tensor saved for backward, and per forward node the saved tensor ids
    saved: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def param_count(self) -> int:
        return int(self.meta.get("param_count", 0))

    def phase(self, name: str) -> pd.DataFrame:
        return self.nodes[self.nodes["phase"] == name]


@dataclass
class _Node:
    values: dict
    inputs: list[int]
    saves: list[int]
    backward: list[dict]
    input_tids: list[int]  # the tensors it reads (a recomputed module keeps those made outside it)


#: Megatron-Core's cross-entropy implementations (``cross_entropy_loss_fusion`` off: None; on: its
#: ``cross_entropy_fusion_impl``, "native" or "te")
CE_FUSIONS = (None, "native", "te")


def loss_working_bytes(logits: float, dtype_bytes: int, *, fp32_saved: bool, fused: str | None,
                       upcast: bool = True) -> float:
    """Bytes a cross-entropy loss holds at its peak beyond what the graph saves for its backward (``cross_entropy``:
    the logits in their dtype on the unfused PyTorch path, the fp32 probabilities on Megatron's, the logits' copy under
    Transformer Engine's kernel), for ``logits`` elements (one rank's vocabulary shard of one micro-batch). The memory
    estimate's transient of the loss's kernels (simulate/memory.py ``kernel_working_bytes``), for one device and every
    pipeline stage that holds a loss alike.

    - PyTorch's cross-entropy (``fp32_saved`` False: Hugging Face and any eager PyTorch loss). transformers 5.24
      ``loss/loss_utils.py`` ``ForCausalLMLoss`` upcasts ``logits = logits.float()`` (l. 61; autocast runs
      ``cross_entropy`` in fp32 as well) and calls ``nn.functional.cross_entropy`` (l. 42): ``log_softmax``, which
      saves its fp32 output, then ``nll_loss``. Forward peak: the logits, their fp32 copy and the log-probabilities,
      (db + 8) per logit; backward (the model's outputs, and so its logits, dropped by then): ``nll_loss``'s backward
      makes a full fp32 gradient and ``log_softmax``'s backward a new one beside it and the saved log-probabilities,
      12 per logit, the larger. Beyond the db the graph saves: (12 - db) per logit (8 in fp32, 10 in bf16; these
      autograd rules -- ``_log_softmax`` saves ``result``, its backward returns a new tensor -- are cited from
      torch's derivatives.yaml from memory).
    - flash-attn's Triton ``CrossEntropyLoss`` (``upcast`` False: llm-foundry 0.22.0's MPT default, ``loss_fn=
      'fused_crossentropy'``, models/mpt/modeling_mpt.py l. 1461 and 1495-1503): one kernel over the logits in their
      dtype that saves them (no copy) with fp32 per-row statistics, and a backward that writes the gradient into a new
      tensor of their shape and dtype (``inplace_backward`` False, its default; flash_attn/ops/triton/cross_entropy.py,
      cited from memory): db per logit.
    - Megatron-Core's ``vocab_parallel_cross_entropy`` (``fp32_saved``, unfused; megatron-core 0.16.1
      ``tensor_parallel/cross_entropy.py``): ``.float()`` (l. 28) makes the fp32 buffer the loss then works in place
      (``-=`` l. 45, ``exp(out=)`` l. 65, ``div_`` l. 80) and saves as the probabilities; its backward turns that buffer
      into the gradient in place (``mul_`` l. 117) and autograd casts it to the logits' dtype. The logits stay alive
      through the loss (``GPTModel.forward`` holds them, models/gpt/gpt_model.py l. 685-714), and the cast gradient
      sits beside the fp32 one: db per logit beyond the saved probabilities (0 in fp32: ``.float()`` returns the
      logits themselves, the loss works in them).
    - Its fused variant (``--cross-entropy-loss-fusion``, "native", ``fusions/fused_cross_entropy.py``): the same fp32
      buffer, in place, and the backward's ``grad_input.to(torch.bfloat16)`` (l. 82): db per logit, 0 in fp32.
    - Transformer Engine's kernel ("te"): the logits and the copy it saves in their dtype (forward), the gradient
      written over that copy (backward): db per logit beyond the copy.

    Until stop 55 the loss's transient was its largest kernel's bytes read and written (4 per logit for the bf16
    PyTorch loss, 8 for Megatron's in-place fp32 kernels), and a cluster's stages had none."""
    db = float(dtype_bytes)
    if not fp32_saved:
        return (12.0 - db) * logits if upcast else db * logits
    if fused == "te":
        return db * logits
    return 0.0 if db >= 4 else db * logits


def ce_collectives(fusion: str | None, tokens: int, tp: int) -> tuple[tuple[str, str, float], ...]:
    """(collective, what, bytes per rank as nccl-tests counts them) of a vocabulary-parallel loss over ``tp`` ranks:
    unfused, three all-reduces of one fp32 a token (max, target logit, sum of exponentials;
    megatron/core/tensor_parallel/cross_entropy.py); Megatron-Core's fused path batches the last two into one
    (``torch.cat((predicted_logits, sum_exp_logits))``, fusions/fused_cross_entropy.py); Transformer Engine's gathers
    four fp32 a token from every rank in one ``all_gather_into_tensor`` (pytorch/triton/cross_entropy.py)."""
    if fusion == "te":
        return (("all_gather", "stats", 16.0 * tokens * tp),)
    if fusion == "native":
        return (("all_reduce", "max", 4.0 * tokens), ("all_reduce", "target_sum_exp", 8.0 * tokens))
    return tuple(("all_reduce", k, 4.0 * tokens) for k in ("max", "target", "sum_exp"))


class GraphBuilder:
    """Record forward kernels (and their backward rules) while an importer walks a model."""

    def __init__(self, dtype: str = "fp32", *, train: bool = False, name: str = "model", tp: int = 1, sp: bool = False,
                 ep: int = 1, cp: int = 1, gemm_dtype: str | None = None, flash_kernel: str = "fa2",
                 etp: int | None = None, fp8_recipe: str = "delayed", fp8_transpose: bool = True,
                 cp_comm: str = "p2p", cp_a2a: int = 1) -> None:
        self.dtype = canonical_dtype(dtype)
        if self.dtype not in DTYPE_BYTES:
            raise GraphError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)}")
        self.train = train  # dropout is active only in training
        if int(tp) < 1 or int(ep) < 1:
            raise GraphError(f"tp and ep must be >= 1, got tp={tp}, ep={ep}")
        self.tp, self.sp, self.ep = int(tp), bool(sp) and int(tp) > 1, int(ep)
        #: the experts' tensor-parallel degree (Megatron-Core's --expert-tensor-parallel-size; None: tp), used inside
        #: :meth:`expert_tp`
        self.etp = self.tp if etp is None else int(etp)
        if self.etp < 1:
            raise GraphError(f"etp must be >= 1, got etp={etp}")
        #: the group name the TP collectives of the current region run over ("tp"; "etp" inside :meth:`expert_tp`)
        self._tp_group = "tp"
        if int(cp) < 1:
            raise GraphError(f"cp must be >= 1, got cp={cp}")
        self.cp = int(cp)
        #: context parallelism's communication (StepOptions.cp_comm) and its all-to-all group size (StepOptions.cp_a2a)
        self.cp_comm, self.cp_a2a = str(cp_comm), max(int(cp_a2a), 1)
        if self.cp % self.cp_a2a:
            raise GraphError(f"the context-parallel all-to-all size ({cp_a2a}) must divide cp ({cp})")
        #: mixture-of-experts routing: tokens this rank's experts process over the balanced share (StepOptions.moe_load)
        self.moe_load = 1.0
        #: every expert padded to its capacity (StepOptions.moe_pad_to_capacity; ``moe_load`` the capacity factor)
        self.moe_pad = False
        #: set by a top-k routed MoE layer (the layers ``moe_load`` applies to)
        self.routed_moe = False
        #: MoE layers as vLLM's fused MoE kernels (StepOptions.fused_moe; hf_models.fused_moe_layer), and whether
        #: one was built so
        self.fused_moe = False
        self.fused_moe_built = False
        #: Megatron-Core's MoE token dispatcher ("alltoall" / "allgather"; StepOptions.moe_token_dispatcher)
        self.moe_dispatcher = "alltoall"
        #: a KV-cached inference step (StepOptions.kv_context): tokens already cached per sequence; None: no cache
        self.kv_context: int | None = None
        #: the inference LM head computes the last position's logits only (StepOptions.logits "last")
        self.logits_last = False
        #: Megatron-Core's fused cross-entropy implementation ("native" / "te"; StepOptions.cross_entropy_loss_fusion),
        #: None: the unfused vocab-parallel loss
        self.ce_fusion: str | None = None
        #: bytes of the KV cache the step holds (every layer's keys and values, context + new tokens) and its tensors
        self.kv_cache_bytes = 0
        self.kv_cache_tids: list[int] = []
        #: an FP8 recipe (Transformer Engine): the linear layers' GEMMs in this dtype with their casts, the rest in
        #: ``dtype`` (see ``linear``)
        self.gemm_dtype = gemm_dtype
        #: the (rows, columns) of the token-embedding tables (``embedding(..., word=True)``), over the whole vocabulary
        #: (padded, not this rank's shard): a linear whose weight has such a shape is the output layer (see ``linear``)
        self._word_tables: set[tuple[int, int]] = set()
        #: the FP8 scaling recipe (Megatron-Core's --fp8-recipe; featurize/fp8_recipes.py): the casts' extra passes and
        #: the block scales of the FP8 copies
        self.fp8_recipe = checked_fp8_recipe(fp8_recipe)
        #: FP8 copy tensor id -> the tensor it quantises (``linear``'s saved input copies, ``glu``'s cached input): under
        #: DeepSeek-V3's storage a copy of a recomputed output is re-made with it (simulate/memory.py kept_tensors)
        self._fp8_source: dict[int, int] = {}
        #: per-tensor recipes: the casts write the transpose too (False on data-centre Blackwell, where TE's FP8
        #: GEMMs take non-TN layouts: featurize/fp8_recipes.py fp8_writes_transpose)
        self.fp8_transpose = bool(fp8_transpose)
        #: Transformer Engine's attention backend under Megatron-Core, "flash" or "fused" (StepOptions.te_attention_backend;
        #: featurize/te_attention.py): whether the attention output it saves is linear_proj's saved input
        self.te_attention_backend = "flash"
        #: tensor id -> the tensor whose storage it is (a view or a no-op ``contiguous()`` the graph draws as its own
        #: tensor): a saved tensor counts once, under the storage's id (simulate/memory.py kept_tensors)
        self._storage_of: dict[int, int] = {}
        #: tensor id -> the tensors a checkpointed module (Megatron-Core's ``tensor_parallel.checkpoint``) holds in its
        #: place when it keeps it as an input (``rotary_checkpoint_inputs``; simulate/memory.py kept_tensors)
        self._checkpoint_saves: dict[int, tuple[int, ...]] = {}
        #: which fused-attention implementation class the flash nodes run (models/attention.py FLASH_KERNELS)
        if flash_kernel not in FLASH_KERNELS:
            raise GraphError(f"unknown flash attention kernel {flash_kernel!r}; use one of {', '.join(FLASH_KERNELS)}")
        self.flash_kernel = flash_kernel
        self.name = name
        self._nodes: list[_Node] = []
        self._tensor_bytes: list[int] = []
        self._tensor_dtype: list[str] = []  # each tensor's dtype (its gradient's, for autograd's accumulation)
        self._out_bytes: list[int] = []
        self._tensor_node: list[int] = []
        self._layer = -1
        self._scope = ""
        self._tag = ""
        self._model_share = 1.0  # the ``model_share`` of the nodes recorded (``model_share``)
        self.param_count = 0
        self.param_bytes = 0
        self.meta: dict = {}
        self._no_grad: set[int] = set()  # tensor ids that need no gradient (see ``input``)
        self._tensor_shape: list[tuple[int, ...]] = []
        # tensor id -> element counts of the views through which ops took a gradient-carrying input
        self._grad_uses: dict[int, list[int]] = {}
        # sequence parallelism: the all-gathered tensor id -> the local shard it was gathered from. A linear layer
        # that consumes a gathered input saves the shard for its weight gradient and all-gathers it again in backward
        # (Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication; Korthikanti et al. 2022 Sec. 4.2.2: the
        # QKV and FC1 inputs are stored sharded, 2sbh/t each)
        self._sp_shard: dict[int, Tensor] = {}
        # tensors whose slices' gradients land in one buffer (a grouped GEMM's dgrad over contiguous rows per expert):
        # no split-cat to assemble them (``contiguous_grad``)
        self._contiguous_grads: set[int] = set()
        self._sp_regathered: set[int] = set()  # gathered tensors whose shard a linear re-gathers in backward
        self._sp_wide: set[int] = set()  # gathered tensors a non-FP8 op reads (gathered in the model's dtype)

    # ------------------------------------------------------------------ context
    @contextmanager
    def _setting(self, **attrs: Any) -> Iterator[None]:
        """Set builder attributes (``_layer``, ``_scope``, ``_tag``) for the ops recorded inside the block."""
        old = {k: getattr(self, k) for k in attrs}
        for k, v in attrs.items():
            setattr(self, k, v)
        try:
            yield
        finally:
            for k, v in old.items():
                setattr(self, k, v)

    def layer(self, index: int, scope: str = ""):
        return self._setting(_layer=int(index), _scope=scope or self._scope)

    def scope(self, scope: str):
        return self._setting(_scope=scope)

    def expert_tp(self):
        """The routed experts' region: its linears split over the expert-tensor-parallel group (``etp`` ranks,
        Megatron-Core's MoE parallel folding) and its TP collectives run over that group ("etp"). The ETP ranks hold
        different tokens whenever there are several (the sequence shards of sequence parallelism, or other
        data-parallel ranks' tokens when etp exceeds tp), so the dispatcher gathers them (``sp``)."""
        return self._setting(tp=self.etp, sp=self.etp > 1 and (self.sp or self.etp != self.tp), _tp_group="etp")

    def tag(self, tag: str):
        """Tag the ops recorded inside the block (a tag inside another adds to it: ``moe,moe_act``)."""
        return self._setting(_tag=f"{self._tag},{tag}" if self._tag and tag else (tag or self._tag))

    def model_share(self, share: float):
        """Record the ops inside the block with ``model_share`` ``share`` (their backward kernels inherit it): the part of
        their FLOPs that counts as model FLOPs (eager attention: hf_blocks.eager_attention)."""
        if not 0.0 <= share <= 1.0:
            raise GraphError(f"model_share must be in [0, 1], got {share}")
        return self._setting(_model_share=float(share))

    # ------------------------------------------------------------------ plumbing
    @property
    def dbytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def input(self, shape: Sequence[int], dtype: str | None = None, *, requires_grad: bool = True) -> Tensor:
        """A graph input (token ids, images, ...). ``requires_grad=False`` for constants off the gradient
        path (attention masks, rotary tables): autograd computes no gradient for them, so elementwise ops
        emit no backward kernel (e.g. no broadcast-reduction) for such an operand."""
        t = self._tensor(shape, dtype or self.dtype, -1)
        if not requires_grad:
            self._no_grad.add(t.tid)
        return t

    def _tensor(self, shape: Sequence[int], dtype: str, node: int) -> Tensor:
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise GraphError(f"negative dimension in shape {shape}")
        t = Tensor(shape, dtype, node, len(self._tensor_bytes))
        if t.nbytes > _MAX_TENSOR_BYTES:  # the graph keeps byte counts as int64: refuse before they overflow
            raise GraphError(f"tensor of shape {shape} ({dtype}) holds {t.nbytes:.3g} bytes, beyond the int64 byte counts "
                             "a graph keeps; a batch, sequence or dimension this large is not a real workload")
        self._tensor_bytes.append(t.nbytes)
        self._tensor_dtype.append(dtype)
        self._tensor_node.append(node)
        self._tensor_shape.append(shape)
        return t

    def add_params(self, n: int) -> None:
        self.param_count += int(n)
        self.param_bytes += int(n) * self.dbytes

    def own_params(self, t: Tensor, n: int) -> None:
        """Attribute ``n`` (possibly negative) more parameters to the node that produced ``t`` (a pipeline stage
        counts the parameters of the forward nodes it holds, simulate/distributed.py)."""
        if n == 0:
            return
        if t.node < 0:
            raise GraphError("parameters must belong to a kernel")
        self._nodes[t.node].values["param_count"] += int(n)
        self.add_params(n)

    @property
    def node_mark(self) -> int:
        """How many forward nodes the graph holds so far (a start for :meth:`hold_params`)."""
        return len(self._nodes)

    def hold_params(self, first: int, copies: int) -> None:
        """``copies`` more of the parameters that the forward nodes from index ``first`` on own, held on the rank but
        not run: a mixture of experts' idle experts (``featurize.hf_models._moe_experts``), resident like the ones that
        run. Each node keeps its share (its scope, dtype and layer count them as before); no kernel, no bytes read."""
        if copies < 0:
            raise GraphError(f"hold_params: copies must be >= 0, got {copies}")
        for node in self._nodes[first:]:
            n = node.values["param_count"] * int(copies)
            if n:
                node.values["param_count"] += n
                self.add_params(n)

    def _add(self, name: str, op_class: str, kernel: str, method: str, inputs: Sequence[Tensor], out_shape,
             *, flops: float, bytes_: float, params: int = 0, saves: Sequence[Tensor] = (),
             backward: Sequence[dict] = (), out_dtype: str | None = None, grad_inputs: Sequence[Tensor] | None = None,
             node_dtype: str | None = None, scale: float = 1.0, **shape) -> Tensor:
        """Record one forward kernel. ``grad_inputs``: the inputs the op sends a gradient to in backward (default:
        all); a tensor that receives gradients from several uses gets autograd's accumulation (see ``build``)."""
        for t in inputs if grad_inputs is None else grad_inputs:
            if t.node >= 0 and t.tid >= 0 and t.tid not in self._no_grad:
                self._grad_uses.setdefault(t.tid, []).append(t.numel)
        for t in inputs:
            if t.tid in self._sp_shard and op_class != "linear":  # a sequence-parallel gather read in the model's dtype
                self._sp_wide.add(t.tid)
                self._nodes[t.node].values["bytes"] = float(self._tensor_bytes[t.tid])
        # TF32 is a tensor-core mode for matrix products; everything else runs on fp32 data as fp32
        dtype = node_dtype or (self.dtype if self.dtype != "tf32" or op_class in TF32_CLASSES else "fp32")
        values = dict(name=name, op_class=op_class, kernel=kernel, method=method, dtype=dtype,
                      flops=float(flops), bytes=float(bytes_), scale=float(scale), param_count=int(params), layer=self._layer,
                      scope=self._scope, tag=self._tag, group=shape.pop("group", ""),
                      model_share=self._model_share)
        for c in SHAPE_COLUMNS:
            values[c] = float(shape[c]) if c in shape else np.nan
        nid = len(self._nodes)
        if params:
            self.add_params(params)
        self._nodes.append(_Node(values, [t.node for t in inputs if t.node >= 0], [t.tid for t in saves], list(backward),
                                 [t.tid for t in inputs if t.tid >= 0]))
        out = self._tensor(out_shape, out_dtype or self.dtype, nid)
        self._out_bytes.append(out.nbytes)
        return out

    @staticmethod
    def _bw(name: str, op_class: str, kernel: str, method: str = "surrogate", *, flops: float, bytes_: float,
            scale: float = 1.0, dtype: str | None = None, **shape) -> dict:
        """A backward kernel's row; ``dtype`` (None: the node's own) a kernel of another dtype than its node's."""
        return dict(name=name, op_class=op_class, kernel=kernel, method=method, flops=float(flops), bytes=float(bytes_),
                    scale=float(scale), **shape, **({"dtype": dtype} if dtype else {}))

    # ------------------------------------------------------------------ GEMMs
    def linear(self, x: Tensor, out_features: int, *, bias: bool = True, name: str = "linear",
               weight_params: bool = True, needs_input_grad: bool = True, parallel: str | None = None,
               fp8: bool = True, fp8_cast_gemms: int = 1) -> Tensor:
        """``nn.Linear(in, out)`` on ``x`` (..., in). ``weight_params=False`` for a tied weight.

        ``parallel``: ``col`` (output features split over tp ranks), ``row`` (input features already
        split: ``x`` is a column-parallel output; the result is a partial sum for ``tp_exit``).

        ``fp8_cast_gemms`` (under an FP8 recipe): how many GEMMs of this shape the linear's input cast and output
        gradient cast cover. 1: its own (Transformer Engine's ``Linear``); n > 1: one GEMM of a grouped linear
        whose n GEMMs' inputs are cast by one multi-tensor kernel per direction (TE's ``GroupedLinear``: one
        ``tex.split_quantize`` / ``tex.group_quantize`` over all splits of the input, and of the output gradient in
        backward, in TE 2.20's pytorch/module/grouped_linear.py), carried by this one with n times the bytes; 0: the
        other GEMMs of such a group (no cast kernel of their own; their FP8 input is still saved)."""
        if not x.shape:
            raise GraphError(f"{name}: linear needs a tensor with at least one dimension")
        n, k = int(x.shape[-1]), self._local_out_features(name, out_features, parallel)
        m = _numel(x.shape[:-1])
        db = self.dbytes
        # a row-parallel bias is added once, after the reduction: it is owned by every rank in full
        params = (n * k if weight_params else 0) + (k if bias else 0)
        # FP8 recipe (Transformer Engine's Linear under fp8_autocast, NVIDIA's default delayed-scaling recipe): the GEMMs
        # run in FP8 (E4M3 forward; E5M2 gradients in the HYBRID format: one "fp8" kernel dtype), operands read at 1 B;
        # the input is cast (with its transpose for the weight gradient and an amax) before the GEMM, the output
        # gradient likewise in backward; the weight's cast is once per step (training_graph); the output and dgrad
        # come out in the model's dtype. The FP8 input is what is saved for the weight gradient (1 B per element).
        # ``fp8=False``: a layer the recipe keeps in bf16 (output layer, router). The output layer is also recognised
        # by what it is, whatever its name (``lm_head``, BERT's ``cls.predictions.decoder``, T5's and Switch's
        # ``lm_head``): the projection onto the vocabulary, its (vocab x hidden) weight shaped like the token embedding
        # (tied to it or not). Megatron-Core builds it as a ``tensor_parallel.ColumnParallelLinear``, not a Transformer
        # Engine module, and its FP8 context wraps the transformer block alone (Megatron-Core 0.16.1
        # models/gpt/gpt_model.py l. 241-253, models/bert/bert_model.py l. 140-149, transformer/transformer_block.py
        # l. 711-721 ``get_fp8_context``): the output layer's GEMMs run in bf16
        output_layer = parallel != "row" and (int(out_features), n) in self._word_tables
        fp8 = fp8 and self.gemm_dtype == "fp8" and not output_layer
        gb = DTYPE_BYTES["fp8"] if fp8 else db  # bytes per GEMM operand element
        gdt = "fp8" if fp8 else None
        shard = self._sp_shard.get(x.tid)  # sequence parallelism: x was all-gathered from this shard
        saved = x if shard is None else shard
        bw = [] if shard is None else self._sp_regather(x, shard, name, fp8=fp8)
        if int(fp8_cast_gemms) != fp8_cast_gemms or fp8_cast_gemms < 0:
            raise GraphError(f"{name}: fp8_cast_gemms must be a non-negative integer, got {fp8_cast_gemms!r}")
        rec = self.fp8_recipe
        sm = _numel(saved.shape[:-1]) if saved.shape else 1  # rows of the (sharded) input the cast quantises
        if fp8 and fp8_cast_gemms:
            g = int(fp8_cast_gemms)  # GEMM inputs this cast covers (a grouped linear's fused cast: all of them)
            if rec == "tensorwise":  # current scaling: an amax pass over the input, then its scale, before the cast
                self._fp8_amax(f"{name}.fp8_amax", saved, g * saved.numel * db)
                bw.extend(self._fp8_amax_bw(f"{name}.grad_fp8_amax", g * m * k * db))
            # the cast writes the row-wise data and its transpose / column-wise copy (1 B each) and their block scales;
            # per-tensor recipes on a GPU whose FP8 GEMMs take non-TN layouts (data-centre Blackwell) the data alone
            # (TE 2.20.2 csrc/quantizer.cpp l. 361-375: no transpose when is_non_tn_fp8_gemm_supported); inference
            # (no grad) the row-wise data and scales alone, every recipe (fp8_recipes.activation_cast_copies)
            copies = activation_cast_copies(rec, transpose=self.fp8_transpose, train=self.train)
            self._add(f"{name}.fp8_cast", "fp8_cast", "", "proxy", [saved], saved.shape, flops=g * saved.numel,
                      bytes_=g * (saved.numel * (db + copies * gb) + cast_scale_bytes(rec, sm, n, train=self.train)),
                      grad_inputs=[])
            bw.append(self._bw(f"{name}.grad_fp8_cast", "fp8_cast", "", "proxy", flops=g * m * k,
                               bytes_=g * (m * k * (db + copies * gb) + cast_scale_bytes(rec, m, k))))
        if fp8:
            src_tid = saved.tid
            saved = self._tensor(saved.shape, "fp8", -1)  # the FP8 copy (sharded under SP), kept for backward
            self._fp8_source[saved.tid] = src_tid
            # its column-wise block scales (mxfp8, blockwise), kept for the weight gradient: none without a backward
            col_scales = scale_bytes(rec, sm, n, columnwise=True) if self.train else 0
            if col_scales:
                saved = [saved, self._tensor((col_scales,), "fp8", -1)]
                self._fp8_source[saved[1].tid] = src_tid
        if needs_input_grad:  # dX = dY (M,K) @ W (K,N)
            bw.append(dict(self._bw(f"{name}.dgrad", "linear", "bmm", flops=2.0 * m * n * k,
                                    bytes_=(m * k + k * n) * gb + m * n * db, B=1, M=m, N=k, K=n), **({"dtype": gdt} if fp8 else {})))
        # dW = X^T (N,M) @ dY (M,K)  (computed for tied weights too: they still get a gradient)
        bw.append(dict(self._bw(f"{name}.wgrad", "linear", "bmm", flops=2.0 * m * n * k,
                                bytes_=(m * n + m * k) * gb + n * k * db, B=1, M=n, N=m, K=k), **({"dtype": gdt} if fp8 else {})))
        if bias:  # db = sum over rows of dY
            bw.append(self._bw(f"{name}.bgrad", "reduction", "", "proxy", flops=m * k, bytes_=(m * k + k) * db))
        if not weight_params:
            # a tied weight (the LM head's, the token embedding's table): held once, in the parameters of the layer
            # that owns it; this node reads it all the same. Recorded by node name so the memory estimate counts the
            # weight as resident, not again in this kernel's working set (simulate/memory.py)
            self.meta.setdefault("tied_weight_params", {})[name] = n * k
        return self._add(name, "linear", "linear" if bias else "bmm", "surrogate", [x], (*x.shape[:-1], k),
                         flops=2.0 * m * n * k + (m * k if bias else 0),
                         bytes_=(m * n + n * k) * gb + (m * k + (k if bias else 0)) * db,
                         params=params, saves=saved if isinstance(saved, list) else [saved], backward=bw,
                         node_dtype=gdt,
                         grad_inputs=[x] if needs_input_grad else [], B=1, M=m, N=n, K=k)

    def _local_out_features(self, name: str, out_features: int, parallel: str | None) -> int:
        """A linear layer's output features on one rank: divided by the tensor parallelism when column-parallel."""
        k = int(out_features)
        if parallel == "col" and self.tp > 1:
            if k % self.tp:
                raise GraphError(f"{name}: {k} output features are not divisible by tensor parallelism {self.tp}")
            k //= self.tp
        elif parallel not in (None, "col", "row"):
            raise GraphError(f"{name}: parallel must be 'col', 'row' or None, got {parallel!r}")
        return k

    def grouped_linear(self, x: Tensor, groups: int, rows: int, out_features: int, *, name: str,
                       parallel: str | None = None) -> Tensor:
        """One fused grouped-GEMM launch over ``groups`` weight matrices (in_features = ``x.shape[-1]``, out_features,
        split like :meth:`linear` by ``parallel``), which together multiply ``rows`` rows of ``x``, each group its own
        share (vLLM's fused MoE kernel over the active experts, ``featurize.hf_models._moe_vllm_fused``: the routed
        (token, expert) pairs, split ``rows // groups`` and one more as ``hf_models.expert_row_split`` does). Costed
        as one batched GEMM of B = ``groups`` and M = ``rows / groups`` (the mean share, fractional when the split is
        uneven, so that B x M is every row: the FLOPs 2 x rows x in x out and the bytes, each group's weights read once
        and every row read and written, are exact), by the same GEMM surrogate as every linear layer; one node, so one
        launch and one host cost. Its parameters are the groups' weights (the caller adds the idle ones with
        :meth:`own_params`). Inference only: no backward. Under an FP8 recipe the GEMM runs in FP8 (operands at 1 B) after one cast kernel of its input."""
        if self.train:
            raise GraphError(f"{name}: the fused grouped GEMM is built for inference (no backward)")
        n, k = int(x.shape[-1]), self._local_out_features(name, out_features, parallel)
        g, db = int(groups), self.dbytes
        if g < 1 or int(rows) < g:
            raise GraphError(f"{name}: {int(rows)} rows cannot run {g} groups (each takes at least one row)")
        m = int(rows) / g  # the mean rows of a group (B x M = rows)
        fp8 = self.gemm_dtype == "fp8"
        gb = DTYPE_BYTES["fp8"] if fp8 else db
        if fp8:  # the input's quantisation: one kernel reading the rows in the model's dtype, writing 1 B each
            self._add(f"{name}.fp8_cast", "fp8_cast", "", "proxy", [x], x.shape, flops=x.numel,
                      bytes_=x.numel * (db + gb), grad_inputs=[])
        r = int(rows)
        return self._add(name, "linear", "bmm", "surrogate", [x], (r, k), flops=2.0 * r * n * k,
                         bytes_=g * n * k * gb + r * (n * gb + k * db), params=g * n * k,
                         node_dtype="fp8" if fp8 else None, grad_inputs=[], B=g, M=m, N=n, K=k)

    def _fp8_amax(self, name: str, x: Tensor, read_bytes: float) -> None:
        """Current scaling's (``--fp8-recipe tensorwise``) passes before a forward cast: ``nvte_compute_amax`` reads
        the input (``read_bytes``), ``nvte_compute_scale_from_amax`` turns the amax into the scale (TE 2.20
        csrc/quantizer.cpp ``Float8CurrentScalingQuantizer::quantize_impl``), two memory-bound kernels."""
        self._add(name, "fp8_cast", "", "proxy", [x], (1,), flops=read_bytes, bytes_=read_bytes, grad_inputs=[],
                  out_dtype="fp32")
        self._add(f"{name}.scale", "fp8_cast", "", "proxy", [x], (1,), flops=1.0, bytes_=CURRENT_SCALE_KERNEL_BYTES,
                  grad_inputs=[], out_dtype="fp32")

    def _fp8_amax_bw(self, name: str, read_bytes: float) -> list[dict]:
        """The backward's amax and scale kernels before an output gradient's cast (as :meth:`_fp8_amax`)."""
        return [self._bw(name, "fp8_cast", "", "proxy", flops=read_bytes, bytes_=read_bytes),
                self._bw(f"{name}.scale", "fp8_cast", "", "proxy", flops=1.0, bytes_=CURRENT_SCALE_KERNEL_BYTES)]

    def _sp_regather(self, gathered: Tensor, shard: Tensor, name: str, *, fp8: bool) -> list[dict]:
        """What a linear layer reading the sequence-parallel all-gather ``gathered`` (of ``shard``) adds to its
        backward: Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication saves the shard and all-gathers it
        again for the weight gradient (overlapped with the input-gradient GEMM), once per gathered tensor (the
        fused QKV / FC1 GEMM; here the first linear to read it). Under an FP8 recipe Transformer Engine casts the
        shard before gathering: the forward gather and this one move the FP8 copy (1 B an element) when every linear
        reading the tensor is FP8; the input gradient's reduce-scatter stays in the model's dtype."""
        if not fp8:
            self._sp_wide.add(gathered.tid)
        n = _numel(self._tensor_shape[gathered.tid])
        wide = gathered.tid in self._sp_wide
        self._nodes[gathered.node].values["bytes"] = float(self._tensor_bytes[gathered.tid] if wide else n * DTYPE_BYTES["fp8"])
        if gathered.tid in self._sp_regathered:
            return []
        self._sp_regathered.add(gathered.tid)
        size = float(n * (DTYPE_BYTES["fp8"] if fp8 else self.dbytes))
        return [dict(self._bw(f"{name}.input_all_gather", "collective", "all_gather", "collective", flops=0,
                              bytes_=size), group=self._tp_group)]

    def matmul(self, a: Tensor, b: Tensor, *, name: str = "matmul") -> Tensor:
        """``torch.matmul`` of (..., M, N) by (..., N, K), batch dims broadcast."""
        if len(a.shape) < 2 or len(b.shape) < 2:
            raise GraphError(f"{name}: matmul needs two tensors of rank >= 2, got {a.shape} and {b.shape}")
        if a.shape[-1] != b.shape[-2]:
            raise GraphError(f"{name}: contraction dims differ: {a.shape} @ {b.shape}")
        try:
            lead = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        except ValueError as e:
            raise GraphError(f"{name}: batch dims do not broadcast: {a.shape} @ {b.shape}") from e
        m, n, k = int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1])
        bsz = _numel(lead)
        db = self.dbytes
        flops = 2.0 * bsz * m * n * k
        bw = [
            self._bw(f"{name}.grad_a", "bmm", "bmm", flops=flops, bytes_=(bsz * m * k + b.numel + a.numel) * db, B=bsz, M=m, N=k, K=n),
            self._bw(f"{name}.grad_b", "bmm", "bmm", flops=flops, bytes_=(a.numel + bsz * m * k + b.numel) * db, B=bsz, M=n, N=m, K=k),
        ]
        return self._add(name, "bmm", "bmm", "surrogate", [a, b], (*lead, m, k), flops=flops,
                         bytes_=(a.numel + b.numel + bsz * m * k) * db, saves=[a, b], backward=bw, B=bsz, M=m, N=n, K=k)

    def conv2d(self, x: Tensor, out_channels: int, kernel_size: int, *, stride: int = 1, padding: int = 0,
               bias: bool = False, name: str = "conv") -> Tensor:
        """``nn.Conv2d`` on (B, C, S, S) (square images and kernels, as the conv surrogate knows them)."""
        if len(x.shape) != 4 or x.shape[2] != x.shape[3]:
            raise GraphError(f"{name}: conv2d needs a (B, C, S, S) input, got {x.shape}")
        b, c, s = x.shape[0], x.shape[1], x.shape[2]
        o = (s + 2 * padding - kernel_size) // stride + 1
        if o <= 0:
            raise GraphError(f"{name}: kernel {kernel_size} larger than the padded input {s}+2*{padding}")
        flops = 2.0 * b * out_channels * o * o * c * kernel_size * kernel_size
        db = self.dbytes
        out_n = b * out_channels * o * o
        w = out_channels * c * kernel_size * kernel_size
        shape = dict(B=b, Input_Channel=c, Output_Channel=out_channels, Kernel_Size=kernel_size, Input_Size=s,
                     Stride=stride, Padding=padding)
        # backward: the gradient w.r.t. the input (``conv_dgrad``) and w.r.t. the weights (``conv_wgrad``), each its
        # own kernel with the forward's FLOPs, given by the forward's shape: the kernel models cost them as their
        # implicit GEMMs on tensor cores, else by the conv surrogate at this shape (featurize/conv_gemm.py,
        # models/kernel_predictor.py _route_convs). Until stop 57 both were costed by the roofline at the dense peak,
        # which made a CNN's backward faster than its forward (audit 57d finding 3). No dgrad for a graph input that
        # needs no gradient (the images): aten's convolution_backward computes grad_input only when the input requires
        # grad (output_mask[0])
        # a TF32 convolution with input channels cuDNN's TF32 tensor-core kernels do not take runs in FP32, its
        # backward kernels too (featurize/conv_gemm.py TF32_CONV_CHANNEL_MULTIPLE: AlexNet's conv1, Cin = 3, on the
        # A100 trace)
        simt = self.dtype == "tf32" and not bool(tf32_conv_on_tensor_cores(c))
        kdt = "fp32" if simt else None
        bw = [self._bw(f"{name}.wgrad", "conv", "conv_wgrad", flops=flops, bytes_=(out_n + x.numel + w) * db, dtype=kdt,
                       **shape)]
        if x.node >= 0 and x.tid not in self._no_grad:
            bw.insert(0, self._bw(f"{name}.dgrad", "conv", "conv_dgrad", flops=flops, bytes_=(out_n + w + x.numel) * db,
                                  dtype=kdt, **shape))
        out = self._add(name, "conv", "conv", "surrogate", [x], (b, out_channels, o, o), flops=flops,
                        bytes_=(x.numel + w + out_n) * db, params=w, saves=[x], backward=bw,
                        node_dtype="fp32" if simt else None, **shape)
        if bias:  # the bias add owns the bias parameters (so the per-layer optimizer step counts them)
            out = self.elementwise("add", out, self._tensor((out_channels, 1, 1), self.dtype, -1), name=f"{name}.bias",
                                   params=out_channels)
        return out

    # ------------------------------------------------------------------ vector ops
    def _compute_dtype(self, out_dtype: str | None) -> tuple[str | None, int]:
        """(the dtype a node's kernels are labelled with, None for the model's; bytes an element they move) of an
        elementwise op or reduction told to write ``out_dtype``: an op told to write another float dtype (HF
        RMSNorm's fp32 region) computes in it, and autograd sends its gradients in it too, so its kernels (forward and
        backward) are that dtype's, at its bytes an element (a float dtype only: a comparison's bool output is
        labelled fp8 by the importers, and its kernel reads its float inputs at the model's width)."""
        node_dtype = out_dtype if out_dtype in _FLOAT_DTYPES and out_dtype != self.dtype else None
        return node_dtype, (DTYPE_BYTES[node_dtype] if node_dtype else self.dbytes)

    def elementwise(self, op: str, *inputs: Tensor | float, name: str | None = None, out_dtype: str | None = None,
                    grad: bool = True, params: int = 0) -> Tensor:
        """An elementwise op on tensors (and Python scalars), broadcasting.

        Arithmetic ops (add, sub, mul, div, pow) become the tensor-tensor kernel when two inputs have more
        than one element, else the scalar variant (``addu``...). Other ops must be in the surrogate
        vocabulary (relu, gelu, tanh, silu, exp, sigmoid, neg, sqrt, rsqrt, copy); ``where``/masking ops
        are costed as ``add`` (two tensor reads, one write). ``grad=False`` for ops off the gradient path
        (mask and position computations).
        """
        name = name or op
        tensors = [t for t in inputs if isinstance(t, Tensor)]
        if not tensors:
            raise GraphError(f"{name}: elementwise op without a tensor input")
        try:
            # one shape (most elementwise ops) broadcasts to itself: numpy only for differing shapes
            shape = (tuple(map(int, tensors[0].shape)) if all(t.shape == tensors[0].shape for t in tensors)
                     else tuple(np.broadcast_shapes(*[t.shape for t in tensors])))
        except ValueError as e:
            raise GraphError(f"{name}: shapes do not broadcast: {[t.shape for t in tensors]}") from e
        big = [t for t in tensors if t.numel > 1]
        n = _numel(shape)
        node_dtype, db = self._compute_dtype(out_dtype)
        out_b = n * DTYPE_BYTES.get(out_dtype or self.dtype, db)
        # operands the kernel streams from memory: full-size ones, and broadcast ones too large to stay
        # cache-resident between repetitions (see _CACHED_BROADCAST); a small broadcast operand (BERT's
        # (B,1,1,S) mask, GPT-2's (1,1,S,S) bool causal mask) costs like a scalar
        streamed = [t for t in big if t.numel == n or t.nbytes * _CACHED_BROADCAST > out_b]
        if op in _ARITH:
            kernel = op if len(streamed) >= 2 else op + "u"
        elif op in _SELECT:
            # where(cond, x, scalar) / max(x, 0-d tensor) read one tensor and write one, like a scalar add
            kernel = "add" if len(streamed) >= 2 else "addu"
        elif op in BINARY_OPS or op in UNARY_OPS:
            kernel = op
        else:
            raise GraphError(f"{name}: elementwise op {op!r} is not in the kernel vocabulary")
        bytes_ = sum(t.nbytes for t in tensors) + out_b
        b, h = _numel(shape[:-1]), (shape[-1] if shape else 1)
        flops = FLOPS_PER_ELEMENT.get(kernel, 1) * n
        bw: list[dict] = []
        saves: list[Tensor] = []
        # operands autograd differentiates (constants such as masks get no gradient)
        need = [t for t in big if t.tid not in self._no_grad]
        if grad and tensors and all(t.tid in self._no_grad for t in tensors):
            grad = False  # nothing upstream needs a gradient
        if grad and op in _SELECT:
            saves = big if op in ("maximum", "minimum") else [t for t in big if t.tid in self._no_grad]  # where keeps its mask
            for i in range(max(len(need), 1)):
                if op in ("where", "masked_fill"):  # where(cond, grad, 0): one masked copy of the gradient
                    bw.append(self._bw(f"{name}.grad{i}", "elementwise", "addu", flops=n, bytes_=2 * n * db, B=b, H=h))
                else:
                    # max/min (aten derivatives.yaml): where(self == other, grad / 2, grad).masked_fill_(self < other, 0):
                    # two compares writing bool masks (5 of the 8 bytes/element of a scalar add), grad / 2,
                    # a three-input where, an in-place masked fill
                    bw += [self._bw(f"{name}.grad{i}.eq", "elementwise", "addu", flops=n, bytes_=(db + 1) * n, scale=(db + 1) / (2 * db), B=b, H=h),
                           self._bw(f"{name}.grad{i}.half", "elementwise", "divu", flops=n, bytes_=2 * n * db, B=b, H=h),
                           self._bw(f"{name}.grad{i}.where", "elementwise", "add", flops=n, bytes_=(3 * db + 1) * n, B=b, H=h),
                           self._bw(f"{name}.grad{i}.lt", "elementwise", "addu", flops=n, bytes_=(db + 1) * n, scale=(db + 1) / (2 * db), B=b, H=h),
                           self._bw(f"{name}.grad{i}.fill", "elementwise", "addu", flops=n, bytes_=(2 * db + 1) * n, scale=(2 * db + 1) / (2 * db), B=b, H=h)]
        elif grad:
            # gradient kernels: add/sub pass the gradient through (no kernel unless broadcast-reduced);
            # a product or quotient needs one kernel per tensor input; unary functions one fused kernel
            # reading (grad, saved input)
            n_grad = len(need)
            if kernel in ("add", "sub", "addu", "subu") and op in _ARITH:
                reduce = [t for t in need if t.numel < n]
                for i, _ in enumerate(reduce):
                    bw.append(self._bw(f"{name}.grad_reduce{i}", "reduction", "", "proxy", flops=n, bytes_=2 * n * db))
            elif kernel in ("addu", "subu", "copy"):
                pass
            elif kernel in ("mul", "div", "silu_mul", "pow") or (op in _ARITH and op not in ("add", "sub") and len(big) >= 2):
                saves = _autograd_saves(op, big, self._no_grad)
                for i in range(max(n_grad, 1)):
                    bw.append(self._bw(f"{name}.grad{i}", "elementwise", "mul", flops=n, bytes_=3 * n * db, B=b, H=h))
            elif kernel == "powu":  # grad * p * x^(p-1): pow, scalar mul, mul
                saves = big[:1]
                bw += [self._bw(f"{name}.grad_pow", "elementwise", "powu", flops=10 * n, bytes_=2 * n * db, B=b, H=h),
                       self._bw(f"{name}.grad_scale", "elementwise", "mulu", flops=n, bytes_=2 * n * db, B=b, H=h),
                       self._bw(f"{name}.grad", "elementwise", "mul", flops=n, bytes_=3 * n * db, B=b, H=h)]
            else:  # unary with a derivative (mulu, divu, gelu, tanh, ...)
                saves = big[:1] if kernel not in ("mulu", "divu", "neg") else []
                bwk = "mulu" if kernel in ("mulu", "divu", "neg") else "mul"
                bw.append(self._bw(f"{name}.grad", "elementwise", bwk, flops=FLOPS_PER_ELEMENT.get(kernel, 1) * n,
                                   bytes_=(2 if bwk == "mulu" else 3) * n * db, B=b, H=h))
        if node_dtype:
            bw = [dict(spec, dtype=node_dtype) for spec in bw]
        return self._add(name, "elementwise", kernel, "surrogate", tensors, shape, flops=flops, bytes_=bytes_,
                         params=params, saves=saves, backward=bw, out_dtype=out_dtype, grad_inputs=need if grad else [],
                         node_dtype=node_dtype, B=b, H=h)

    def glu(self, x: Tensor, *, name: str = "glu", fp8_input_cache: bool = False) -> Tensor:
        """A fused gated activation over a fused gate-and-up projection (Megatron-Core's ``bias_swiglu_impl``):
        ``x`` (..., 2n) -> (..., n), one kernel reading 2n and writing n elements like a binary op. It saves its input;
        its backward is one kernel reading the gradient and the input and writing the input's gradient (..., 2n)
        directly (5n elements against the binary op's 3n): no split, cat or accumulation.

        ``fp8_input_cache`` (under :attr:`deepseek_storage`): DeepSeek-V3's MoE SwiGLU (tech report Sec. 3.3.3 (2):
        "we cache the inputs of the SwiGLU operator and recompute its output in the backward pass ... stored in FP8
        with our fine-grained quantization method"): it keeps an FP8 copy of its input (1 B an element and its 1x128
        fp32 tile scales) instead of the input; the caller tags it ``fp8_swiglu`` (re-run in the backward, its output's
        FP8 copy re-made: featurize/training_graph.py, simulate/memory.py)."""
        if not x.shape or x.shape[-1] % 2:
            raise GraphError(f"{name}: a gated activation needs an even last dimension, got {x.shape}")
        shape = (*x.shape[:-1], x.shape[-1] // 2)
        n = _numel(shape)
        db = self.dbytes
        b, h = _numel(shape[:-1]), shape[-1]
        bw = [self._bw(f"{name}.grad", "elementwise", "mul", flops=FLOPS_PER_ELEMENT.get("mul", 1) * n,
                       bytes_=5 * n * db, scale=5.0 / 3.0, B=b, H=h)]
        saves = [x]
        if fp8_input_cache and self.deepseek_storage:
            rows = _numel(x.shape[:-1])
            copy = self._tensor(x.shape, "fp8", -1)
            self._fp8_source[copy.tid] = x.tid
            saves = [copy, self._tensor((scale_bytes(self.fp8_recipe, rows, x.shape[-1], columnwise=False),), "fp8", -1)]
            self._fp8_source[saves[1].tid] = x.tid
        return self._add(name, "elementwise", "mul", "surrogate", [x], shape, flops=FLOPS_PER_ELEMENT.get("mul", 1) * n,
                         bytes_=3 * n * db, saves=saves, backward=bw, B=b, H=h)

    @property
    def deepseek_storage(self) -> bool:
        """DeepSeek-V3's low-precision storage and communication (``--fp8-recipe deepseek`` with FP8 GEMMs;
        featurize/fp8_recipes.py)."""
        return self.gemm_dtype == "fp8" and self.fp8_recipe == "deepseek"

    def e5m6_attention_output(self, att: Tensor, proj: Tensor) -> None:
        """DeepSeek-V3's storage of the input of the linear after the attention operator (tech report Sec. 3.3.3 (1):
        "These activations are also used in the backward pass of the attention operator ... We adopt a customized
        E5M6 data format exclusively for these activations", 1x128 tiles with power-of-2 scales): one copy of the
        attention output ``att`` (1.5 B an element, its 1x128 fp32 tile scales) kept for both the fused attention's
        backward and the weight gradient of the projection ``proj`` (whose own FP8 copy of its input it replaces)."""
        if not self.deepseek_storage or att.node < 0 or proj.node < 0:
            return
        rows, k = _numel(att.shape[:-1]), int(att.shape[-1])
        e = self._tensor(att.shape, "fp8", -1)
        self._tensor_bytes[e.tid] = int(math.ceil(att.numel * E5M6_BYTES)) + scale_bytes(self.fp8_recipe, rows, k,
                                                                                        columnwise=False)
        self._fp8_source[e.tid] = att.tid
        a_saves = self._nodes[att.node].saves
        self._nodes[att.node].saves = [e.tid if t == att.tid else t for t in a_saves]
        # the projection's saved FP8 input (and its scales): made by no op, the first of what it saves
        self._nodes[proj.node].saves = [e.tid] + [t for t in self._nodes[proj.node].saves
                                                  if self._tensor_node[t] >= 0]

    def dropout(self, x: Tensor, p: float, *, name: str = "dropout") -> Tensor:
        """Dropout: a kernel writing output and a 1-byte mask in training, nothing in inference."""
        if not self.train or p <= 0:
            return x
        n = x.numel
        b, h = _numel(x.shape[:-1]), x.shape[-1]
        db = self.dbytes
        mask = self._tensor(x.shape, "fp8", -1)  # bool mask, 1 byte per element
        bw = [self._bw(f"{name}.grad", "dropout", "mul", flops=n, bytes_=(2 * db + 1) * n, B=b, H=h)]
        return self._add(name, "dropout", "mul", "surrogate", [x], x.shape, flops=2 * n, bytes_=(2 * db + 1) * n,
                         saves=[mask], backward=bw, B=b, H=h)

    def fused_dropout_mask(self, out: Tensor, p: float) -> None:
        """A dropout fused into the kernel that produced ``out`` (Megatron-LM's bias-dropout-add): no kernel of its
        own, but its 1-byte mask is saved for backward (Korthikanti et al. 2022 Table 2: sbh per dropout)."""
        if not self.train or p <= 0 or out.node < 0:
            return
        mask = self._tensor(out.shape, "fp8", -1)
        self._nodes[out.node].saves.append(mask.tid)

    def layernorm(self, x: Tensor, *, name: str = "layernorm", bias: bool = True, rms: bool = False,
                  module: str = "") -> Tensor:
        """LayerNorm (or RMSNorm, ``rms=True``) over the last dim, as one fused kernel. ``module``: its recompute module
        (``layernorm`` for a block's input and pre-MLP norms: featurize/recompute.py)."""
        h = int(x.shape[-1])
        b = _numel(x.shape[:-1])
        db = self.dbytes
        kernel = "rmsnorm" if rms else "ln"
        bw = [self._bw(f"{name}.grad", "layernorm", kernel, flops=2 * FLOPS_PER_ELEMENT[kernel] * b * h, bytes_=(3 * b * h + 2 * h) * db,
                       scale=(BACKWARD_RATIO_IN_STREAM if self.dtype in ("fp32", "tf32") else BACKWARD_RATIO)["layernorm"],
                       B=b, H=h)]
        params = h * (1 if rms or not bias else 2)
        with self.tag(module):
            return self._add(name, "layernorm", kernel, "surrogate", [x], x.shape, flops=FLOPS_PER_ELEMENT[kernel] * b * h,
                             bytes_=(2 * b * h + params) * db, params=params, saves=[x], backward=bw, B=b, H=h)

    def batchnorm(self, x: Tensor, *, name: str = "batchnorm", affine: bool = True, batch_stats: bool = True) -> Tensor:
        """BatchNorm over the channel dim (dim 1) of ``x`` (N, C, ...), as the two importers find it (torch.export's
        ``aten.batch_norm`` / ``_native_batch_norm_legit*``, ONNX's ``BatchNormalization``).

        ``batch_stats`` (training mode: ``training=True`` / ONNX ``training_mode=1``): one kernel that reduces the
        per-channel mean and variance and normalizes, costed by the LayerNorm kernel model (``ln``, the family of a
        statistics pass plus a normalize pass in one kernel) on the same elements laid out in rows of
        :data:`NORM_EQUIV_WIDTH`; its backward one kernel reading x and dy and writing dx plus the dgamma/dbeta
        reduction, the LayerNorm backward at :data:`BACKWARD_RATIO` (the measured LN bw/fw ratio, the closest
        evidence: same structure). PyTorch on CUDA runs it as cuDNN's ``bn_fw_tr_1C11_*`` and ``bn_bw_1C11_*``, one
        kernel each way (the V100 ResNet-50 trace, datasets/traces/v100_rank0.json.gz; there BN backward / forward
        kernel time is 1.92, against LN's 2.37). It saves its input and the per-channel fp32 ``save_mean`` /
        ``save_invstd`` (aten derivatives.yaml ``native_batch_norm_backward(grad, input, weight, running_mean,
        running_var, result1, result2, ...)``). Until stop 57 torch.export costed it by the roofline at peak
        bandwidth and saved nothing, ONNX as one per-channel multiply (audit 57f finding 4).

        Without ``batch_stats`` (inference mode, running statistics): the per-channel affine, one elementwise
        multiply by a (C, 1, ...) vector."""
        if len(x.shape) < 2:
            raise GraphError(f"{name}: batch norm needs an (N, C, ...) input, got {x.shape}")
        c = int(x.shape[1])
        params = 2 * c if affine else 0
        if not batch_stats:
            scale = self.input((c, *([1] * (len(x.shape) - 2))))
            return self.elementwise("mul", x, scale, name=name, params=params)
        n = x.numel
        h = min(n, NORM_EQUIV_WIDTH)
        b = -(-n // max(h, 1))
        fit = n / max(b * h, 1)  # the last row's share when the elements do not fill whole rows
        db = self.dbytes
        kernel = "ln"
        bw = [self._bw(f"{name}.grad", "layernorm", kernel, flops=2 * FLOPS_PER_ELEMENT[kernel] * n,
                       bytes_=(3 * n + 2 * c) * db,
                       scale=fit * (BACKWARD_RATIO_IN_STREAM if self.dtype in ("fp32", "tf32") else BACKWARD_RATIO)["layernorm"],
                       B=b, H=h)]
        out = self._add(name, "layernorm", kernel, "surrogate", [x], x.shape, flops=FLOPS_PER_ELEMENT[kernel] * n,
                        bytes_=(2 * n + params) * db, params=params, saves=[x], backward=bw, scale=fit, B=b, H=h)
        self._nodes[out.node].saves.append(self._tensor((2, c), "fp32", out.node).tid)  # save_mean, save_invstd
        return out

    def saves_result(self, t: Tensor) -> None:
        """The op that made ``t`` keeps ``t`` (its result) for backward instead of its input: ReLU (aten
        derivatives.yaml ``relu: threshold_backward(grad, result, 0)``). The next op reading ``t`` (a convolution)
        saves the same tensor, counted once (simulate/memory.kept_tensors keeps tensors by id), as PyTorch keeps one
        storage (audit 57f finding 1: a ReLU -> conv chain was counted as two tensors)."""
        if t.node < 0:
            return
        node = self._nodes[t.node]
        if node.saves:
            node.saves = [t.tid]

    def softmax(self, x: Tensor, *, name: str = "softmax", out_dtype: str | None = None) -> Tensor:
        """Softmax over the last dim; backward reads output and gradient (one kernel).

        ``out_dtype`` (another float dtype than the model's, ``torch.softmax(x, dim, dtype=torch.float32)``): the
        kernel computes and writes that dtype, reading ``x`` at its own width, and its backward reads the gradient and
        the saved output in that dtype and writes ``x``'s gradient at ``x``'s width (aten ``_softmax`` /
        ``_softmax_backward_data(grad, output, dim, input_dtype)``). Both are labelled with ``out_dtype``'s kernel,
        scaled to the bytes they move (an fp16 input read by an fp32 softmax, CUDA's ``half_to_float``: 6 of the fp32
        kernel's 8 bytes an element; its backward 10 of 12), as :meth:`copy` costs a cast."""
        h = int(x.shape[-1])
        b = _numel(x.shape[:-1])
        n = b * h
        node_dtype, db = self._compute_dtype(out_dtype)
        if node_dtype:
            in_b = DTYPE_BYTES[x.dtype]
            fw_bytes, bw_bytes = n * (in_b + db), n * (2 * db + in_b)
            fw_scale, bw_scale = fw_bytes / (2.0 * n * db), SOFTMAX_BACKWARD_MUL * bw_bytes / (3.0 * n * db)
        else:
            fw_bytes, bw_bytes, fw_scale, bw_scale = 2 * n * db, 3 * n * db, 1.0, SOFTMAX_BACKWARD_MUL
        out = self._add(name, "softmax", "softmax", "surrogate", [x], x.shape, flops=5 * n, bytes_=fw_bytes,
                        backward=[self._bw(f"{name}.grad", "softmax", "mul", flops=4 * n, bytes_=bw_bytes,
                                           scale=bw_scale, dtype=node_dtype, B=b, H=h)],
                        out_dtype=out_dtype, node_dtype=node_dtype, scale=fw_scale, B=b, H=h)
        # softmax saves its output
        self._nodes[out.node].saves.append(out.tid)
        return out

    def reduction(self, x: Tensor, out_shape: Sequence[int], *, name: str = "reduce", grad: bool = True,
                  out_dtype: str | None = None) -> Tensor:
        """A reduction (mean, sum, max...) of ``x`` to ``out_shape``: memory-bound, costed by proxy. ``out_dtype``: as
        for :meth:`elementwise` (a reduction in another float dtype, its kernels that dtype's at its bytes)."""
        n_out = _numel(out_shape)
        node_dtype, db = self._compute_dtype(out_dtype)
        bw = [self._bw(f"{name}.grad", "elementwise", "", "proxy", flops=x.numel, bytes_=(n_out + x.numel) * db,
                       dtype=node_dtype)] if grad else []
        return self._add(name, "reduction", "", "proxy", [x], out_shape, flops=x.numel, bytes_=(x.numel + n_out) * db, backward=bw,
                         grad_inputs=None if grad else [], out_dtype=out_dtype, node_dtype=node_dtype)

    # ------------------------------------------------------------------ memory ops
    def view(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        """A view / reshape of a contiguous tensor: no kernel."""
        shape = tuple(int(s) for s in shape)
        if _numel(shape) != x.numel:
            raise GraphError(f"view of {x.shape} as {shape} changes the element count")
        return Tensor(shape, x.dtype, x.node, x.tid)

    def copy(self, x: Tensor, shape: Sequence[int] | None = None, *, name: str = "copy", grad: bool = True,
             expand: bool = False, out_dtype: str | None = None) -> Tensor:
        """A materialising copy (``.contiguous()`` after a transpose, cat, cast...): one copy kernel.

        ``expand=True`` allows a larger output (``expand(...).reshape`` as in grouped-query attention's
        repeat_kv); its backward sums the copies back (a reduction). ``out_dtype``: a cast (``x.float()``) writes
        this dtype (default the model's)."""
        shape = tuple(shape) if shape is not None else x.shape
        n_out = _numel(shape)
        if n_out != x.numel and not (expand and n_out >= x.numel):
            raise GraphError(f"{name}: copy of {x.shape} as {shape} changes the element count")
        b, h = _numel(shape[:-1]), (shape[-1] if shape else 1)
        to = out_dtype or self.dtype
        bytes_ = x.nbytes + n_out * DTYPE_BYTES.get(to, self.dbytes)
        # a cast (``x.float()``, ``.to(bf16)``) reads one float dtype and writes another: costed as the wider dtype's
        # copy kernel (the NeuSight copy reads and writes its dtype) scaled to the bytes it moves (a bf16 <-> fp32
        # cast moves 6 of the fp32 copy's 8 bytes an element); its gradient is the cast the other way, as many bytes
        wide = max((x.dtype, to), key=lambda d: DTYPE_BYTES.get(d, 0))
        node_dtype = wide if (x.dtype != to and wide != self.dtype
                              and x.dtype in _FLOAT_DTYPES and to in _FLOAT_DTYPES) else None
        scale = bytes_ / (2.0 * n_out * DTYPE_BYTES[node_dtype]) if node_dtype and n_out == x.numel and n_out else 1.0
        if not grad:
            bw = []
        elif n_out == x.numel:
            bw = [self._bw(f"{name}.grad", "memory", "copy", flops=0, bytes_=bytes_, scale=scale, dtype=node_dtype,
                           B=b, H=h)]
        else:
            bw = [self._bw(f"{name}.grad", "reduction", "", "proxy", flops=n_out, bytes_=bytes_, dtype=node_dtype)]
        return self._add(name, "memory", "copy", "surrogate", [x], shape, flops=0, bytes_=bytes_, backward=bw,
                         grad_inputs=None if grad else [], out_dtype=out_dtype, node_dtype=node_dtype,
                         scale=scale, B=b, H=h)

    def embedding(self, ids: Tensor, vocab: int, dim: int, *, name: str = "embedding", params: bool = True,
                  parallel: bool = False, word: bool = False) -> Tensor:
        """``nn.Embedding(vocab, dim)`` gather; backward is a scatter-add into a zeroed (vocab, dim) gradient.

        ``parallel=True``: vocabulary-parallel over tp ranks (each holds vocab/tp rows; the caller reduces
        the partial lookups with ``tp_exit``). ``word=True``: the token embedding (``vocab`` rows: the whole
        vocabulary), whose shape marks the output layer (:meth:`linear`)."""
        t = ids.numel
        db = self.dbytes
        if word:
            self._word_tables.add((int(vocab), int(dim)))
        if parallel and self.tp > 1:
            vocab = -(-vocab // self.tp)
        bw = [self._bw(f"{name}.grad_zero", "memory", "", "proxy", flops=0, bytes_=vocab * dim * db),
              self._bw(f"{name}.grad", "embedding", "", "proxy", flops=t * dim, bytes_=(2 * t * dim + t) * db)]
        return self._add(name, "embedding", "", "proxy", [ids], (*ids.shape, dim), flops=0,
                         bytes_=(2 * t * dim) * db + t * 8, params=vocab * dim if params else 0, saves=[], backward=bw,
                         grad_inputs=[])

    # ------------------------------------------------------------------ collectives
    def collective(self, op: str, x: Tensor, out_shape: Sequence[int], *, group: str, size_bytes: float, name: str,
                   backward: Sequence[tuple[str, float]] = (), grad: bool = True) -> Tensor:
        """A collective over ``group`` (``tp``, ``ep``, ...); ``size_bytes`` per rank as nccl-tests counts it;
        ``backward``: (op, size_bytes) collectives of its gradient. ``grad=False``: no gradient flows back into ``x``
        through it (a statistic of ``x``, such as the vocabulary-parallel loss's per-token max: not a use of ``x`` that
        autograd accumulates a gradient for)."""
        if op not in COLLECTIVE_OPS:
            raise GraphError(f"{name}: unknown collective {op!r}; use one of {', '.join(COLLECTIVE_OPS)}")
        bw = [dict(self._bw(f"{name}.grad", "collective", o, "collective", flops=0, bytes_=sz), group=group)
              for o, sz in backward]
        return self._add(name, "collective", op, "collective", [x], out_shape, flops=0, bytes_=size_bytes, backward=bw,
                         group=group, grad_inputs=None if grad else [])

    def _bw_only(self, name: str, x: Tensor, bw: list[dict]) -> Tensor:
        """A forward no-op carrying backward kernels (Megatron's f operator): a zero-time node."""
        return self._add(name, "collective", "", "collective", [x], x.shape, flops=0, bytes_=0, backward=bw,
                         group=self._tp_group)

    def tp_enter(self, x: Tensor, *, name: str = "tp.enter", saved_sharded: bool = True) -> Tensor:
        """Before a column-parallel linear: identity (backward all-reduce of dX); with sequence parallelism
        an all-gather of the sequence shards (backward reduce-scatter). ``saved_sharded``: the GEMMs that read the
        gathered tensor keep the shard for backward and gather it again (Megatron's sequence-parallel linear layers);
        False where the gather is not theirs (Megatron-Core's MoE dispatcher: the experts keep the gathered rows)."""
        if self.tp == 1:
            return x
        full = x.nbytes * (self.tp if self.sp else 1)
        if self.sp:
            shape = (x.shape[0], x.shape[1] * self.tp, *x.shape[2:]) if len(x.shape) >= 3 else (x.shape[0] * self.tp, *x.shape[1:])
            out = self.collective("all_gather", x, shape, group=self._tp_group, size_bytes=full, name=f"{name}.all_gather",
                                  backward=[("reduce_scatter", full)])
            if saved_sharded:
                self._sp_shard[out.tid] = x
            return out
        bw = [dict(self._bw(f"{name}.grad", "collective", "all_reduce", "collective", flops=0, bytes_=full),
                   group=self._tp_group)]
        return self._bw_only(name, x, bw)

    def tp_exit(self, x: Tensor, *, name: str = "tp.exit", fp8_grad: bool = True) -> Tensor:
        """After a row-parallel linear: all-reduce of the partial sums (backward identity); with sequence
        parallelism a reduce-scatter into sequence shards (backward all-gather). ``fp8_grad=False``: the gradient
        is gathered in the model's dtype even when ``x`` comes from an FP8 GEMM (Megatron-Core's MoE dispatcher, whose
        combine gathers in bf16)."""
        if self.tp == 1:
            return x
        full = x.nbytes
        if self.sp:
            if len(x.shape) >= 3:
                if x.shape[1] % self.tp:
                    raise GraphError(f"{name}: sequence length {x.shape[1]} is not divisible by tensor parallelism {self.tp}")
                shape = (x.shape[0], x.shape[1] // self.tp, *x.shape[2:])
            else:
                shape = (x.shape[0] // self.tp, *x.shape[1:])
            # the backward all-gathers the output gradient; Transformer Engine casts it to FP8 first when the
            # row-parallel GEMM it feeds runs in FP8 (its dgrad and wgrad read the FP8 gradient)
            src = self._nodes[x.node].values if x.node >= 0 else {}
            fp8 = fp8_grad and src.get("op_class") == "linear" and src.get("dtype") == "fp8"
            grad_bytes = x.numel * DTYPE_BYTES["fp8"] if fp8 else full
            return self.collective("reduce_scatter", x, shape, group=self._tp_group, size_bytes=full,
                                   name=f"{name}.reduce_scatter",
                                   backward=[("all_gather", grad_bytes)])
        return self.collective("all_reduce", x, x.shape, group=self._tp_group, size_bytes=full, name=f"{name}.all_reduce")

    def contiguous_grad(self, x: Tensor) -> None:
        """The gradients of ``x``'s slices are written into one buffer by the ops that read them (Transformer Engine's
        grouped GEMM over the experts' contiguous rows): autograd assembles nothing (no ``grad_split_cat``)."""
        self._contiguous_grads.add(x.tid)

    def all_to_all(self, x: Tensor, *, group: str = "ep", name: str = "all_to_all", fp8: bool = False) -> Tensor:
        """Token dispatch/combine across expert-parallel ranks (backward: the reverse all-to-all). ``fp8`` (under
        :attr:`deepseek_storage`): DeepSeek-V3's dispatch (tech report Sec. 3.3.3, Low-Precision Communication: "we
        quantize the activation before MoE up-projections into FP8 and then apply dispatch components"): the forward
        sends 1 B an element and the 1x128 tile scales; the backward stays in the model's dtype (the report states FP8
        for the forward dispatch only, BF16 for both combines)."""
        size = x.nbytes
        if fp8 and self.deepseek_storage and x.shape:
            size = x.numel * DTYPE_BYTES["fp8"] + scale_bytes(self.fp8_recipe, _numel(x.shape[:-1]), int(x.shape[-1]),
                                                              columnwise=False)
        return self.collective("all_to_all", x, x.shape, group=group, size_bytes=size, name=name,
                               backward=[("all_to_all", x.nbytes)])

    # ------------------------------------------------------------------ attention and loss
    def flash_attention(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, name: str = "flash_attention",
                        window: int | None = None) -> Tensor:
        """Fused attention (FlashAttention-2): q (B, h, S, d), k (B, h_kv, S_kv, d), v (B, h_kv, S_kv, dv) ->
        (B, h, S, dv); no S x S tensor in memory.
        ``window``: causal sliding-window attention (each query sees the last ``window`` keys; Mistral, Gemma 2/3
        local layers): the kernel skips the blocks outside the band."""
        if len(q.shape) != 4 or len(k.shape) != 4:
            raise GraphError(f"{name}: flash attention needs (B, heads, S, d) tensors, got {q.shape}, {k.shape}")
        b, h, s, d = q.shape
        skv = k.shape[2]
        if k.shape[3] != d:
            raise GraphError(f"{name}: query and key head dims differ: q {q.shape}, k {k.shape}")
        frac = attention_pair_share(s, skv, causal=causal, window=window if self.cp == 1 else None)
        kv_reads = 1
        kb, km = b * h, s  # the kernel's batch x heads and query rows
        ring = 1  # KV-ring steps whose outputs are merged (the cp_out_correction below): the ring's size
        if self.cp > 1:
            # context parallelism (ring attention, Megatron-Core / Transformer Engine): this rank's queries (s = seq/cp
            # tokens, two load-balanced chunks) meet every rank's keys and values as they pass round the ring; with the
            # causal mask balanced over the ranks the work is half of s x (s x cp): 1/cp of the full causal attention.
            # One node carries it (its FLOPs, bytes, saved tensors); under a KV ring it is timed as the ring's per-step
            # kernels (``meta["cp_ring_attention"]``: node name -> ring size; context_parallel.ring_attention_steps,
            # simulate/single_device.py _flash_ms: one causal s x s step and ring - 1 steps of s x s/2 or s/2 x s;
            # until stop 58 as one s x (s x cp) kernel, at 642 TFLOP/s from cp 1 to 32 on an H100). The cp - 1 KV
            # exchanges are the scheduler's, each overlapped with one step's kernel
            a2a = self.cp_a2a
            ring = cp_ring_size(self.cp_comm, self.cp, a2a)
            skv, kv_reads = skv * self.cp, (self.cp // a2a if self.cp_comm != "allgather" else self.cp)
            frac = 0.5 if causal else 1.0
            if window and causal:
                # Transformer Engine runs a sliding window under CP without a KV ring only (cp_refuses_window); a2a
                # and all-gather restrict each rank's keys to the window (a2a: the whole sequence's kernel with the
                # window; all-gather: get_kv_seq_info_after_all_gather)
                if cp_refuses_window(self.cp_comm, self.cp, a2a):
                    raise GraphError(f"{name}: sliding-window attention (window {window}) under context parallelism "
                                     f"with cp_comm_type {self.cp_comm}: Transformer Engine refuses it (a2a and "
                                     f"allgather only)")
                if skv > window:  # this rank's 1/cp of the windowed pairs (the load-balanced chunks)
                    frac = (window * skv - window * (window - 1) / 2.0) / float(skv * skv)
            if a2a > 1:
                # a2a / a2a+p2p (TE AttnFuncWithCPAndQKVOA2A.forward, the a2a part of AttnFuncWithCPAndKVP2P): the
                # all-to-all gathers the a2a group's sequence and scatters the heads, so the kernel runs h / a2a heads
                # over s x a2a queries (same FLOPs: the a2a group's queries over the same keys)
                kb, km = b * (h // a2a), s * a2a
        # QK^T over the query/key head dim, PV over the value head dim (they differ under DeepSeek's MLA: 192 and 128);
        # the output has the value head dim: (B, h, S, dv)
        dv = v.shape[3] if len(v.shape) == 4 else d
        d_eff = (d + dv) / 2.0
        flops = 4.0 * b * h * s * skv * d_eff * frac
        db = self.dbytes
        out_shape = (b, h, s, dv)
        io = (q.numel + (k.numel + v.numel) * kv_reads + _numel(out_shape)) * db
        fk = self.flash_kernel
        # Megatron-Core checkpoints the core attention whatever its kernel (``core_attn``: the fused kernel's forward
        # re-run in backward, its output and log-sum-exp not kept by it); legacy Megatron-LM and Hugging Face do not
        with self.tag("attn_core" if getattr(self, "framework", "hf") == "megatron" else ""):
            out = self._add(name, "flash_attention", fk, "flash", [q, k, v], out_shape, flops=flops, bytes_=io,
                            saves=[q, k, v], B=kb, M=km, N=int(round(d_eff)), K=skv,
                            backward=[self._bw(f"{name}.grad", "flash_attention", fk, "flash", flops=2.5 * flops,
                                               bytes_=2 * io + b * h * s * 4, B=kb, M=km, N=int(round(d_eff)),
                                               K=skv)])
            if self.cp > 1 and ring > 1:
                self.meta.setdefault("cp_ring_attention", {})[name] = ring
                # Transformer Engine's ring attention merges each of the cp - 1 further steps into the output (the
                # softmax-LSE and output correction: reads the step's output and the running one, writes it) and, in
                # backward, accumulates each step's dQ and the dK/dV passed round the ring: memory-bound kernels,
                # costed as the binary add over those tensors, (cp - 1) times (one launch counted)
                steps = float(ring - 1)
                n_out, n_q, n_kv = b * h * s * dv, q.numel, k.numel + v.numel
                self._add(f"{name}.cp_out_correction", "elementwise", "add", "surrogate", [out], out_shape,
                          flops=steps * n_out, bytes_=steps * 3 * n_out * db, grad_inputs=[],
                          backward=[self._bw(f"{name}.cp_dq_accumulate", "elementwise", "add", flops=steps * n_q,
                                             bytes_=steps * 3 * n_q * db, scale=steps, B=b * h * s, H=d),
                                    self._bw(f"{name}.cp_dkv_accumulate", "elementwise", "add", flops=steps * n_kv,
                                             bytes_=steps * 3 * n_kv * db, scale=steps, B=n_kv // max(d, 1), H=d)],
                          scale=steps, B=b * h * s, H=dv)
                # the ring's working set is one step's, not its cp - 1 steps' together: Transformer Engine 2.20.2
                # AttnFuncWithCPAndKVP2P.forward (attention/dot_product_attention/context_parallel.py l. 1900-1944,
                # 2038-2231) keeps two per-step outputs and LSEs (``out_per_step[i % 2]``) and two KV buffers
                # (``p2p_comm_buffers[(i + 1) % 2]`` received while step i runs on ``[i % 2]``), and corrects one
                # step at a time (``flash_attn_fwd_out_correction(out, out_per_step[(i - 1) % 2], ...)``). So the
                # correction node (costed as the cp - 1 passes) holds one pass, 3 x out; the attention node, one
                # node over all cp KV chunks (timed as the per-step kernels), holds q, the step's K/V, the next
                # step's arriving, and the output (simulate/memory.py kernel_working_bytes reads
                # ``meta["working_set_share"]``; until stop 57 the whole node was read as one kernel's working set:
                # Llama 3 405B at 8,192 tokens a rank, CP16, 1.51 GB of transient where cp 1 has 0.49 GB)
                share = self.meta.setdefault("working_set_share", {})
                one_step = {f"{name}.cp_out_correction": 1.0 / steps}
                if kv_reads > 2:
                    one_step[name] = (q.numel + 2 * (k.numel + v.numel) + _numel(out_shape)) * db / io
                for node_name, frac in one_step.items():  # a name shared by layers of other shapes: the largest
                    share[node_name] = max(share.get(node_name, 0.0), frac)
            if self.cp > 1 and self.cp_a2a > 1:
                # flash_attn_a2a_communicate (TE context_parallel.py): each all-to-all'd tensor is copied twice on the
                # GPU, the movedim(...).contiguous() that lays the heads out for all_to_all_single and the
                # index_select reorder of the 2 x a2a sequence chunks (forward: q, k, v before the attention, the
                # output after; backward: dout before, dq, dk, dv after), one kernel each; the all-to-alls themselves
                # are the scheduler's (simulate/distributed.py cp_comm_ms)
                for t_name, n_el in (("q", q.numel), ("k", k.numel), ("v", v.numel), ("out", b * h * s * dv)):
                    for step in ("layout", "reorder"):
                        self._add(f"{name}.cp_a2a_{t_name}_{step}", "memory", "copy", "surrogate", [out], out_shape,
                                  flops=0, bytes_=2.0 * n_el * db, grad_inputs=[], B=max(n_el // max(d, 1), 1), H=d,
                                  backward=[self._bw(f"{name}.cp_a2a_d{t_name}_{step}", "memory", "copy", flops=0,
                                                     bytes_=2.0 * n_el * db, B=max(n_el // max(d, 1), 1), H=d)])
            if self.cp > 1 and self.cp_comm == "allgather":
                # AttnFuncWithCPAndKVAllGather (TE context_parallel.py): forward, the index_select reorder of the
                # gathered K and of V (cp x this rank's); backward, the same for the K/V gathered again, the dK/dV
                # accumulation of its two query chunks into the gathered-size buffers and their reorder before the
                # reduce-scatter: memory-bound passes over cp x K and cp x V, one kernel each
                for t_name, n_el in (("k", self.cp * k.numel), ("v", self.cp * v.numel)):
                    rows = max(n_el // max(d, 1), 1)
                    self._add(f"{name}.cp_allgather_{t_name}_reorder", "memory", "copy", "surrogate", [out], out_shape,
                              flops=0, bytes_=2.0 * n_el * db, grad_inputs=[], B=rows, H=d,
                              backward=[self._bw(f"{name}.cp_allgather_d{t_name}_{step}", "memory", "copy", flops=0,
                                                 bytes_=2.0 * n_el * db, B=rows, H=d)
                                        for step in ("regather_reorder", "accumulate", "reorder")])
        # FlashAttention-2 saves q, k, v, the output and the fp32 log-sum-exp of every row (B, h, S) for backward
        # (flash_attn_interface.FlashAttnFunc: ctx.save_for_backward(q, k, v, out_padded, softmax_lse, ...))
        self._nodes[out.node].saves += [out.tid, self._tensor((b, h, s), "fp32", out.node).tid]
        return out

    def te_attention_output(self, q: Tensor, out: Tensor, merged: Tensor) -> None:
        """Megatron-Core (``framework`` "megatron", training): ``merged``, the (B, S, h*dv) tensor ``linear_proj`` reads
        (and saves), is the storage of ``out``, the fused-attention output the kernel saves, when Transformer Engine's
        backend returns a view of it (featurize/te_attention.py ``attention_output_shared``: cuDNN's FusedAttention
        always, FlashAttention at micro-batch 1); then the two count once. ``q``: the attention's query (its head dim).
        The merge's copy node stays as it was (its time unchanged)."""
        if getattr(self, "framework", "hf") != "megatron" or not self.train:
            return
        bs, dv = int(out.shape[0]), int(out.shape[-1])
        if merged.nbytes == out.nbytes and attention_output_shared(self.te_attention_backend, bs, self.cp,
                                                                   int(q.shape[-1]), dv, cp_comm=self.cp_comm,
                                                                   cp_a2a=self.cp_a2a):
            self._storage_of[merged.tid] = out.tid

    def rotary_checkpoint_inputs(self, roped: Tensor, fused_qkv: Tensor, q_heads: int, kv_heads: int,
                                 head_dim: int) -> None:
        """Megatron-Core (``framework`` "megatron", training): ``roped`` is one tensor standing for the rotated query
        and key and the value (one fused RoPE node over the QKV output, its time as costed), ``fused_qkv`` the
        ``linear_qkv`` output it was made from. What a checkpointed core attention keeps of them is its arguments as they
        sit in memory (``CheckpointFunction.forward``: ``ctx.save_for_backward(*args)``, megatron-core 0.16.1
        tensor_parallel/random.py l. 528; ``_checkpointed_attention_forward`` passes query, key, value, attention.py
        l. 381-415): ``get_query_key_value_tensors`` splits the fused output into views (attention.py l. 1457-1462),
        ``apply_rotary_pos_emb`` writes a new query and key (l. 1097-1116), the value stays a view, so the whole fused
        QKV storage stays alive beside the new query (``q_heads``) and key (``kv_heads``); with fewer key/value groups
        than TP ranks that storage is the all-gathered output of every rank (l. 1398-1415). Recorded here as a new tensor
        of the rotated query and key (made by the RoPE node) and the fused output, kept in place of ``roped`` by a
        checkpointed module (simulate/memory.py kept_tensors); nothing else reads it."""
        if getattr(self, "framework", "hf") != "megatron" or not self.train:
            return
        bs, sq = int(roped.shape[0]), int(roped.shape[1])  # (batch, seq, heads x head dim)
        qk = self._tensor((bs, int(q_heads + kv_heads), sq, int(head_dim)), roped.dtype, roped.node)
        self._checkpoint_saves[roped.tid] = (qk.tid, fused_qkv.tid)

    def kv_cache(self, k: Tensor, v: Tensor, *, cache_len: int, name: str = "kv_cache") -> tuple[Tensor, Tensor]:
        """Append this step's keys and values ``k``/``v`` (B, h_kv, S_new, d) to a KV cache of ``cache_len`` tokens per
        sequence (context + the new ones) and return the cache's (B, h_kv, cache_len, d) keys and values for attention
        to read. The append is one memory-bound kernel reading the new K and V and writing them into the cache (vLLM's
        ``reshape_and_cache``, one launch for both; transformers' ``DynamicCache.update`` is a ``torch.cat`` that
        copies the whole cache, not modelled: serving engines preallocate it). Inference only (no backward)."""
        if self.train:
            raise GraphError(f"{name}: a KV cache is an inference structure; a training step has none")
        bs, hkv, s_new, d = k.shape
        dv = v.shape[3]
        n_new = bs * hkv * s_new * (d + dv)
        db = self.dbytes
        self._add(f"{name}.append", "memory", "copy", "surrogate", [k, v], (bs, hkv, s_new, d + dv), flops=0,
                  bytes_=2.0 * n_new * db, grad_inputs=[], B=bs * hkv * s_new, H=d + dv)
        kc = self.input((bs, hkv, int(cache_len), d), requires_grad=False)
        vc = self.input((bs, hkv, int(cache_len), dv), requires_grad=False)
        self.kv_cache_bytes += kc.nbytes + vc.nbytes
        self.kv_cache_tids += [kc.tid, vc.tid]
        return kc, vc

    def cross_entropy(self, logits: Tensor, *, name: str = "loss", vocab_parallel: bool = False,
                      fp32_saved: bool = False, fusion: str | None = None, upcast: bool = True) -> Tensor:
        """Cross-entropy over the last dim of ``logits`` (log_softmax + nll); backward = softmax - onehot.

        ``vocab_parallel``: the logits are a tp rank's vocabulary shard (Megatron's parallel cross-entropy:
        three all-reduces of one float per token: max, target logit, sum of exponentials).
        ``fusion`` (with ``fp32_saved``, Megatron-Core's ``--cross-entropy-loss-fusion``): "native" (Megatron-Core's
        ``fused_vocab_parallel_cross_entropy``, :meth:`_cross_entropy_fused_native`) or "te" (Transformer Engine's
        ``parallel_cross_entropy`` Triton kernels, :meth:`_cross_entropy_te`); None: unfused. ``upcast`` (without
        ``fp32_saved``): PyTorch's cross-entropy on fp32 logits (transformers' ``ForCausalLMLoss``, autocast), else a
        kernel on the logits in their dtype (flash-attn's, llm-foundry's MPT): their working set
        (:func:`loss_working_bytes`), the kernels' cost the same."""
        if fusion not in CE_FUSIONS:
            raise GraphError(f"{name}: unknown cross-entropy fusion {fusion!r}; use one of {', '.join(map(str, CE_FUSIONS))}")
        src = self._nodes[logits.node].values if logits.node >= 0 else {}
        if src.get("op_class") == "linear" and src.get("dtype") == "fp8":
            # the linear feeding a loss is an output layer, which the FP8 recipe keeps in bf16 (see ``linear``): a
            # model generator that leaves one in FP8 is a bug, not a prediction
            raise GraphError(f"{name}: its logits come from {src['name']!r}, an FP8 GEMM; the output layer feeding a "
                             f"loss stays bf16 under an FP8 recipe (build it with linear(..., fp8=False))")
        v = int(logits.shape[-1])
        t = _numel(logits.shape[:-1])
        db = self.dbytes
        fused = fusion if fp32_saved else None
        first = len(self._nodes)
        out = self._cross_entropy_kernels(logits, name, t, v, db, vocab_parallel, fp32_saved, fused)
        # every forward kernel of the loss -> the bytes live at the loss's peak beyond what the graph saves for its
        # backward (the memory estimate's transient: simulate/memory.py kernel_working_bytes), per rank and
        # micro-batch: the logits shard is t x v here
        work = loss_working_bytes(t * v, db, fp32_saved=fp32_saved, fused=fused, upcast=upcast)
        names = self.meta.setdefault("loss_working_bytes", {})
        for node in self._nodes[first:]:
            names[node.values["name"]] = work
        return out

    def _cross_entropy_kernels(self, logits: Tensor, name: str, t: int, v: int, db: int, vocab_parallel: bool,
                               fp32_saved: bool, fused: str | None) -> Tensor:
        if vocab_parallel and self.tp > 1:
            for op, k, size in ce_collectives(fused, t, self.tp):
                # statistics of the logits inside one autograd Function (Megatron's _VocabParallelCrossEntropy; its
                # backward is softmax - onehot): no gradient reaches the logits through them
                self.collective(op, logits, (t,), group="tp", size_bytes=size, name=f"{name}.{op}_{k}", grad=False)
        if fused == "native":
            return self._cross_entropy_fused_native(logits, name, t, v)
        if fused == "te":
            return self._cross_entropy_te(logits, name, t, v)
        # ``fp32_saved``: the loss runs on ``logits.float()`` and keeps fp32 probabilities for backward (Megatron-LM's
        # vocab_parallel_cross_entropy; Korthikanti et al. 2022 Sec. 4.3: 4sbv/t bytes)
        if fp32_saved and self.dtype != "fp32":
            return self._cross_entropy_fp32(logits, name, t, v)
        out = self._add(name, "loss", "softmax", "surrogate", [logits], (), flops=5 * t * v, bytes_=2 * t * v * db,
                        saves=[logits], B=t, H=v,
                        backward=[self._bw(f"{name}.grad", "loss", "softmax", flops=4 * t * v, bytes_=4 * t * v * db, scale=2.0, B=t, H=v)])
        return out

    def _cross_entropy_fused_native(self, logits: Tensor, name: str, t: int, v: int) -> Tensor:
        """Megatron-Core's ``fused_vocab_parallel_cross_entropy`` (megatron/core/fusions/fused_cross_entropy.py, the
        "native" ``cross_entropy_fusion_impl``): four functions under ``jit_fuser`` (megatron/core/jit.py:
        ``torch.compile`` from PyTorch 2.2), each one generated kernel over the logits (the per-token gather, mask
        and one-hot scatter kernels, t elements each, are left out as in the unfused path):

        - ``calculate_logits_max``: ``logits.float()`` and the row max in one reduction that also writes the fp32 copy
          (read db, write 4 bytes a logit; fp32 logits: no copy, ``float()`` returns them);
        - ``calculate_predicted_logits``: the in-place subtraction of the max, ``exp`` into the same buffer and the row
          sum in one reduction (read 4, write 4);
        - ``calculate_cross_entropy_loss``: the in-place divide by the sum (read 4, write 4); the fp32 probabilities
          are what it saves for backward, as the unfused path (4 bytes a logit);
        - backward ``calculate_gradients``: the in-place multiply by the loss gradient, written back into the saved
          buffer (a mutated input of the compiled function), and the cast to bf16 it returns (read 4, write 4 + db).

        32 bytes a logit in bf16 over 4 kernels, where the unfused path moves 52 over 8 (:meth:`_cross_entropy_fp32`)."""
        db, n = self.dbytes, t * v
        probs = self._tensor(logits.shape, "fp32", len(self._nodes))
        bw = [dict(self._bw(f"{name}.calculate_gradients", "loss", "", "proxy", flops=2 * n, bytes_=(8.0 + db) * n),
                   dtype="fp32")]
        x = self._add(f"{name}.calculate_logits_max", "loss", "", "proxy", [logits], logits.shape, flops=n,
                      bytes_=(db + (0.0 if db == 4 else 4.0)) * n + 4.0 * t, backward=bw, out_dtype="fp32",
                      node_dtype="fp32")
        x = self._add(f"{name}.calculate_predicted_logits", "loss", "", "proxy", [x], logits.shape,
                      flops=(1 + FLOPS_PER_ELEMENT.get("exp", 1) + 1) * n, bytes_=8.0 * n + 4.0 * t, grad_inputs=[],
                      node_dtype="fp32")
        return self._add(name, "loss", "", "proxy", [x], (), flops=n, bytes_=8.0 * n + 4.0 * t, grad_inputs=[],
                         saves=[probs], node_dtype="fp32")

    def _cross_entropy_te(self, logits: Tensor, name: str, t: int, v: int) -> Tensor:
        """Transformer Engine's ``parallel_cross_entropy`` (the "te" ``cross_entropy_fusion_impl``; TE 2.20
        transformer_engine/pytorch/triton/cross_entropy.py and common/triton/cross_entropy.py): forward one Triton
        kernel per row (``cross_entropy_forward_kernel``, or ``cross_entropy_tp_pre_kernel`` under TP) reads the logits
        once for an online softmax (max and sum together) and copies them into the buffer it saves (Megatron-Core
        passes ``overwrite_input`` False: read db, write db bytes a logit), plus, under TP, a per-row kernel over the
        gathered statistics (t x tp x 16 bytes, left out with the target gathers); backward
        ``cross_entropy_backward_kernel`` rebuilds softmax - onehot from the saved copy and the per-row statistics and
        writes the gradient over the copy (read db, write db). 4 x db bytes a logit (8 in bf16) over 2 kernels; it
        saves the logits' copy in their own dtype (db bytes a logit, half the fp32 probabilities of the other two
        paths in bf16) and two fp32 statistics a row."""
        db, n = self.dbytes, t * v
        copy = self._tensor(logits.shape, self.dtype, len(self._nodes))
        stats = self._tensor((t, 2), "fp32", len(self._nodes))
        bw = [self._bw(f"{name}.cross_entropy_backward_kernel", "loss", "", "proxy", flops=4 * n, bytes_=2.0 * db * n)]
        return self._add(name, "loss", "", "proxy", [logits], (), flops=(2 + FLOPS_PER_ELEMENT.get("exp", 1)) * n,
                         bytes_=2.0 * db * n + 12.0 * t, backward=bw, saves=[copy, stats])

    def _cross_entropy_fp32(self, logits: Tensor, name: str, t: int, v: int) -> Tensor:
        """Megatron-LM's ``vocab_parallel_cross_entropy(output.float(), labels)`` kernel by kernel
        (megatron/core/tensor_parallel/cross_entropy.py, unfused, the default): forward ``logits.float()``, max over
        the vocabulary, in-place subtract, exp into the same buffer, sum, in-place divide (the fp32 probabilities it
        keeps for backward: Korthikanti et al. 2022 Sec. 4.3, 4sbv/t bytes); backward the in-place multiply by the
        loss gradient (the one-hot update touches one logit per token) and the cast back to the logits' dtype.
        About 52 bytes per logit where one fused softmax reads and writes 2 x 2 (the tiny target-gather and mask
        kernels are left out)."""
        db, n = self.dbytes, t * v
        probs = self._tensor(logits.shape, "fp32", len(self._nodes))
        bw = [dict(self._bw(f"{name}.grad", "loss", "mulu", flops=n, bytes_=8.0 * n, B=t, H=v), dtype="fp32"),
              dict(self._bw(f"{name}.float.grad", "loss", "copy", flops=0, bytes_=(4.0 + db) * n, B=t, H=v), dtype="fp32")]
        x = self._add(f"{name}.float", "loss", "copy", "surrogate", [logits], logits.shape, flops=0,
                      bytes_=(db + 4.0) * n, backward=bw, out_dtype="fp32", node_dtype="fp32", B=t, H=v)
        steps = (("max", "reduction", "", "proxy", 4.0), ("sub", "loss", "subu", "surrogate", 8.0),
                 ("exp", "loss", "exp", "surrogate", 8.0), ("sum_exp", "reduction", "", "proxy", 4.0),
                 ("div", "loss", "divu", "surrogate", 8.0))
        for i, (step, op_class, kernel, method, per_elem_bytes) in enumerate(steps):
            last = i == len(steps) - 1
            x = self._add(name if last else f"{name}.{step}", op_class, kernel, method, [x], () if last else logits.shape,
                          flops=FLOPS_PER_ELEMENT.get(kernel, 1) * n, bytes_=per_elem_bytes * n, grad_inputs=[],
                          saves=[probs] if last else (), node_dtype="fp32", B=t, H=v)
        return x

    # ------------------------------------------------------------------ other
    def opaque(self, name: str, inputs: Sequence[Tensor], out_shape: Sequence[int], *, flops: float = 0.0,
               bytes_: float | None = None, op_class: str = "other", grad: bool = True,
               op_type: str | None = None) -> Tensor:
        """An op with no surrogate: costed by the roofline of its FLOPs and bytes, and flagged. ``op_type``: the
        imported op it stands for (an ONNX op type, an aten op), tagged ``op_type:<type>`` on its kernels (forward and
        backward) so that ``fallback_ops`` can name it (:func:`op_type_of_tag`)."""
        out_n = _numel(out_shape)
        b = bytes_ if bytes_ is not None else (sum(t.nbytes for t in inputs) + out_n * self.dbytes)
        bw = [self._bw(f"{name}.grad", op_class, "", "roofline", flops=2 * flops, bytes_=2 * b)] if grad else []
        with self.tag(f"{OP_TYPE_TAG}{op_type}" if op_type else ""):
            return self._add(name, op_class, "", "roofline", list(inputs), out_shape, flops=flops, bytes_=b, backward=bw)

    # ------------------------------------------------------------------ result
    def _backward_with_accumulation(self) -> list[list[dict]]:
        """Each node's backward rules, preceded by autograd's gradient accumulation for its output tensor.

        A tensor used by k ops receives k gradients, and the autograd engine sums them (``InputBuffer``: one
        add kernel per extra gradient) before the producer's backward runs: a residual stream feeding a
        norm and the residual add, an input shared by the q/k/v or gate/up projections. Slices of one tensor
        (q/k/v views of a fused projection) come back through one ``cat`` (split's backward) instead; when the
        whole tensor is used too, that assembled gradient is added like any other."""
        rules = [list(n.backward) for n in self._nodes]
        for tid, uses in self._grad_uses.items():
            node = self._tensor_node[tid]
            if node < 0 or len(uses) < 2:
                continue
            shape = self._tensor_shape[tid]
            n = _numel(shape)
            if n == 0:
                continue
            full = sum(1 for u in uses if u >= n)
            part = len(uses) - full
            adds = max(full - 1, 0) + (1 if part and full else 0)
            db = self._tensor_bytes[tid] / n
            b, h = _numel(shape[:-1]), (shape[-1] if shape else 1)
            name = self._nodes[node].values["name"]
            split_cat = part >= 2 and tid not in self._contiguous_grads
            acc = [self._bw(f"{name}.grad_split_cat", "memory", "copy", flops=0, bytes_=2 * n * db, B=b, H=h)] if split_cat else []
            # a tensor of another float dtype (HF RMSNorm's fp32 input copy) gets its gradients in that dtype
            own = self._tensor_dtype[tid]
            kw = {"dtype": own} if own != self.dtype and own in _FLOAT_DTYPES else {}
            acc += [self._bw(f"{name}.grad_accumulate{i}", "elementwise", "add", flops=n, bytes_=3 * n * db, B=b, H=h,
                             **kw) for i in range(adds)]
            rules[node] = acc + rules[node]
        return rules

    def build(self, **meta) -> OpGraph:
        """The forward graph (``phase == 'forward'``); backward rules stay attached for training_graph."""
        nodes = _frame_of_rows([n.values for n in self._nodes],
                               [c for c in NODE_COLUMNS if c not in ("phase", "fwd_id", "recompute")])
        nodes["phase"] = "forward"
        nodes["fwd_id"] = -1
        nodes["recompute"] = False
        nodes = nodes[list(NODE_COLUMNS)]
        edges = [(src, dst) for dst, n in enumerate(self._nodes) for src in n.inputs]
        edges_arr = np.array(edges, dtype=np.int64).reshape(-1, 2)
        m = dict(self.meta)
        m.update(meta)
        m.setdefault("name", self.name)
        if self.kv_cache_tids:
            m["kv_cache_tids"] = list(self.kv_cache_tids)
        m["param_count"] = int(self.param_count)
        m["dtype"] = self.dtype
        saved = dict(tensor_bytes=np.array(self._tensor_bytes, dtype=np.int64), tensor_node=np.array(self._tensor_node, dtype=np.int64),
                     by_node=[n.saves for n in self._nodes], backward=self._backward_with_accumulation(),
                     inputs=[n.inputs for n in self._nodes], out_bytes=np.array(self._out_bytes, dtype=np.int64),
                     input_tids=[n.input_tids for n in self._nodes],
                     fp8_source=dict(self._fp8_source), storage_of=dict(self._storage_of),
                     checkpoint_saves=dict(self._checkpoint_saves))
        return OpGraph(nodes=nodes, edges=edges_arr, meta=m, saved=saved)
