"""Import an ONNX model as a forward :class:`~wattcast.featurize.op_graph.OpGraph`.

:func:`graph_from_onnx` walks the ONNX graph once (O(nodes)) and records one
:class:`~wattcast.featurize.op_graph.GraphBuilder` call per kernel, so
:func:`wattcast.featurize.training_graph.training_graph` can derive the training step from the result.

Shapes are what is needed: the file is read with ``load_external_data=False`` (weights in a missing external-data
file are fine; only the tied-weight check below reads values from it), symbolic input dims are bound from ``batch``/``seq``/``dims``
and ``onnx.shape_inference`` fills in every intermediate shape (what it misses -- shape arithmetic it
cannot propagate -- is folded here with the ONNX reference ops on the small constant tensors).

Mapping (ONNX op -> builder call):

- MatMul with an initializer operand -> ``linear`` (a following ``Add`` of a 1-D initializer is fused as
  its bias); MatMul of two activations -> ``matmul``; Gemm -> ``linear`` (``transB``, bias = ``C``);
- Conv: 2-D, square input and kernel, one group, symmetric padding, no dilation -> ``conv2d``; any
  other Conv / ConvTranspose -> ``opaque`` conv roofline with its real FLOPs;
- elementwise ops -> ``elementwise`` with the nearest vocabulary kernel (Add/Sub/Mul/Div/Pow, Relu, Tanh,
  Sigmoid, Exp, Sqrt, Neg, Gelu/FastGelu/BiasGelu; Reciprocal -> ``divu``; Erf, Sin, Cos -> ``tanh``;
  Where/Max/Min -> ``where``/``maximum``/``minimum`` (costed as ``add``); comparisons -> ``sub``, no
  gradient); an Erf-based GELU subgraph (x/sqrt2 -> Erf -> +1 -> *x -> *0.5) and the tanh approximation
  (0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))), ``x^3`` as Pow or x*(x*x), as ``torch.onnx.export(dynamo=False)``
  writes ``F.gelu(approximate="tanh")``) collapse into one ``gelu``; bool / 8-bit tensors are 1 B per element
  (labelled ``fp8`` as the torch.export importer labels them), so a broadcast (S, S) mask stays a cache-resident
  operand of its Where (``GraphBuilder.elementwise``'s rule) and reads its own S*S bytes;
  Cast -> ``copy`` writing its target float type (another float type than the file's keeps its width: an fp32
  region of a bf16 file is costed at 4 B an element), free when it does not change the type; Softmax (and
  elementwise ops) in their tensor's type; the exporters' Softmax -> Cast(FLOAT) is the upcast softmax;
- LayerNormalization / SimplifiedLayerNormalization / RMSNormalization (and the decomposed
  ReduceMean-Sub-Pow-ReduceMean-Add-Sqrt-Div[-Mul-Add] LayerNorm and Pow-ReduceMean-Add-Sqrt-Div|Mul
  RMSNorm patterns) -> ``layernorm``; Softmax / LogSoftmax -> ``softmax``;
- Gather of an initializer -> ``embedding``; Gather of activations -> ``copy`` of the gathered size;
- Transpose, Concat, Slice, Split, Expand, Tile, Pad, ... -> ``copy``. A Transpose feeding a MatMul is a copy too:
  eager ``torch.matmul`` folds 4-D operands' batch dims with ``reshape``, which cannot view a head-permuted tensor,
  so PyTorch copies q, k^T and v before its bmm (as ``hf_blocks.eager_attention``'s ``strided`` copies). A Split
  whose parts are read only (through views) by Transposes or linears is a view, as ``torch.split`` is: those
  kernels read the strided part. A Transpose that moves only size-1 dims is free. Reshape, Squeeze, Unsqueeze,
  Flatten, Identity -> free views; Shape, Constant, ConstantOfShape and anything computed from constants
  only -> no kernel (an inference runtime folds them);
- ReduceMean / ReduceSum / ReduceMax ..., pooling, ArgMax, TopK, CumSum -> ``reduction``;
  BatchNormalization -> ``GraphBuilder.batchnorm``, as torch.export's ``aten.batch_norm``: in training mode
  (``training_mode=1``, or the running-statistics outputs before opset 14) the LayerNorm kernel over its elements
  (statistics and normalisation, saving its input), else one per-channel ``mul``; Group/InstanceNormalization ->
  ``layernorm`` over the group; Relu keeps its result for backward (the tensor a following conv saves: one storage);
  Resize / Upsample -> ``copy`` of the size its constant scales / sizes give (``shapes._rule_resize``; unknown: the
  roofline, with a warning); Dropout -> ``dropout`` (train mode only); Einsum -> ``opaque`` with its FLOPs;
- a Conv the conv model does not cover (grouped / depthwise, non-square, dilated, 1-D / 3-D) and ConvTranspose ->
  ``opaque`` with its FLOPs, named in ``unmapped_ops`` and its warning as torch.export names such convs;
- com.microsoft fused ops: SkipLayerNormalization / SkipSimplifiedLayerNormalization -> ``add`` +
  ``layernorm``; FusedMatMul -> ``linear``/``matmul``; FastGelu, BiasGelu, QuickGelu, BiasAdd -> ``elementwise``;
- the attention core (MatMul -> (Div|Mul) -> (Add|Where mask) -> Softmax -> (Dropout) -> MatMul) is
  tagged ``attn_core`` and counts in model FLOPs as hf_blocks.eager_attention's: the two MatMuls at
  ``attention_pair_share`` (half when the mask's ancestry shows it causal: ``patterns._mask_is_causal``), the nodes
  between them at 0 (``model_share``); an opset-23 ``Attention`` op -> ``flash_attention``;
- control flow: ``Loop`` and ``Scan`` -> their bodies unrolled, one walk per iteration (trip count: the constant
  ``M``, ``loop_trip_count`` given by the user, or the scanned length; unknown -> :class:`GraphError` naming the node
  and the option); ``If`` -> the branch of a constant condition, else the more expensive one, flagged (``control.py``);
  any other node with a subgraph -> :class:`GraphError` naming it (one tiny op in its place would be a silently wrong
  step);
- any other op -> ``opaque`` (0 FLOPs, bytes from its input/output shapes: costed by the roofline and
  flagged) and counted in ``graph.meta["unmapped_ops"]``. An output shape neither inferred nor computed is taken as
  its op's input's, counted in ``meta["unknown_shapes"]`` and warned about.

Parameters are the float initializers an op uses as weights (GEMM/conv/embedding/norm weights, biases
and other vectors added or multiplied into activations), each counted once: tied weights (an LM head
reusing the embedding table, also when the exporter stored it as a transposed copy) are recognised from
the ``torch.onnx`` node metadata or by comparing the values: in the file, or in its external-data file (read with
onnx's own loader, ``params._tied_by_value``; a missing data file leaves the tie undecided, said in ``warnings``).
A static float input of a copy op is a parameter too (a ViT's class token in ``cat([cls.expand(B, -1, -1), x])``).
A scatter's output has its ``data`` input's shape (``ops._scatter``). A Gather of a weight table at constant indices
beyond its rows (a learned position table at ``Range(0, seq)`` with a longer ``seq``) refuses the model
(``assemble._refuse_gather_beyond_table``). ``meta["attention_costed"]`` names the attention the graph holds
("eager": a recognised MatMul -> Softmax -> MatMul core; "flash": an ``Attention`` op; None: none).


The package by concern: ``load`` reads the file and binds the symbolic dims, ``shapes`` infers shapes and folds
constants, ``patterns`` recognises fused subgraphs, ``params`` counts parameters, ``ops`` holds the mapping
tables and per-op handlers, ``control`` costs Loop / Scan / If bodies, ``assemble`` walks the model into the graph.
"""

from wattcast.featurize.onnx.assemble import graph_from_onnx
from wattcast.featurize.onnx.load import BATCH_DIM_NAMES, SEQ_DIM_NAMES

__all__ = ["graph_from_onnx", "BATCH_DIM_NAMES", "SEQ_DIM_NAMES"]
