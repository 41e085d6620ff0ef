"""Import a PyTorch ``nn.Module`` as an operator graph, via ``torch.export`` on the meta device.

:func:`graph_from_module` puts the module on the meta device (no weight memory: a module whose
parameters are real is copied structure-only, the caller's module is left as it is), exports it with
``torch.export.export(..., strict=False)`` on meta example inputs and walks the exported ATen graph
(``ep.graph_module.graph``; no ``run_decompositions``), calling the :class:`GraphBuilder` method of each
op with the shapes and dtypes of the FakeTensors in ``node.meta["val"]``. A 2.7B-parameter GPT traces in
about two seconds (``benchmarks/bench_torch_export.py``).

Op mapping (ATen op packet names; in-place ``op_`` variants map like ``op``):

- GEMMs: ``linear``, ``addmm``, ``mm`` and ``matmul`` with a parameter operand (the parameter
  placeholders of ``ep.graph_signature``, also through views such as ``t``) -> ``linear`` (its
  parameters counted once: a tied weight used again, e.g. the LM head sharing the token embedding, gets
  ``weight_params=False``); ``bmm``, ``matmul`` of two activations, ``baddbmm`` -> ``matmul``; a
  two-operand ``einsum`` -> ``linear`` (activation x parameter) or ``matmul`` by its index groups;
  ``embedding`` -> ``embedding``; ``convolution``/``conv2d`` -> ``conv2d`` when square (else opaque).
- ``layer_norm``/``native_layer_norm`` -> ``layernorm``; ``rms_norm`` -> ``layernorm(rms=True)``;
  ``softmax``/``_softmax``/``_safe_softmax``/``log_softmax`` -> ``softmax``;
  ``scaled_dot_product_attention`` and its ``_flash``/``_efficient``/``_cudnn``/``_for_cpu`` kernels ->
  ``flash_attention`` (``is_causal`` from the call); ``cross_entropy_loss`` -> ``cross_entropy``.
- elementwise: ``add sub rsub mul div pow gelu relu tanh silu sigmoid exp neg sqrt rsqrt`` (tensor or
  scalar kernel by operand), ``where masked_fill maximum minimum``; ``dropout``/``native_dropout``
  (training only). Ops outside the kernel vocabulary that move the same bytes are *approximated* by a
  vocabulary kernel and counted in ``meta["approximated_ops"]``: comparisons and logical/bitwise ops
  (costed as ``add``, 1-byte output, no gradient), cheap unary ops (``abs clamp square floor`` ..., as
  ``relu``), transcendental ones (``cos sin log erf reciprocal`` ..., as ``exp``), gathers (``index``,
  ``gather``, ``index_select``: a copy of the output), regression losses (``mse_loss`` ...:
  ``sub`` + reduction), ``nll_loss`` (a reduction over the target).
- free views (no kernel): ``view reshape``\\ (of a contiguous tensor) ``expand unsqueeze squeeze permute
  transpose t slice select split chunk unbind alias detach narrow flatten unflatten``...; ``contiguous``
  of a contiguous tensor and ``to``/``type_as`` without a dtype change are free too.
- ``copy``: ``clone``, ``contiguous`` (of a strided tensor), ``_to_copy``/``to`` (a cast), ``cat``,
  ``stack``, ``copy_``, ``repeat``, ``pad``, ``roll``, ``flip``...
- ``reduction``: ``mean sum amax amin max min argmax argmin var std prod logsumexp norm``...
- tensor creation (``arange zeros ones full empty *_like rand* scalar_tensor``; ``tril``/``triu`` off the
  gradient path): no kernel.
- ``torch.no_grad``/autocast regions (``wrap_with_set_grad_enabled``/``wrap_with_autocast``) are walked
  into.
- anything else with tensor outputs (``cumsum``, ``sort``, ``topk``, ``scatter``, batch/group norm, ...)
  -> ``opaque`` (roofline, flagged) and counted in ``meta["unmapped_ops"]`` (``{"aten.sort.default": 1}``);
  a mapped op whose arguments the mapping cannot handle falls back the same way. Nothing is dropped.

Gradients: parameters require grad; inputs and buffers do not; an op requires grad when one of its tensor
inputs does, so mask and position computations get no backward kernels.

Layers: the module path of ``node.meta["nn_module_stack"]`` is the node's ``scope``; a numeric path
component after ``h``/``layers``/``layer``/``blocks``/``block`` is its layer. Ops before the first block
are layer -1, after the last ``n_layers``. The attention core (the activation-by-activation GEMM
``Q K^T``, everything elementwise from it up to the GEMM with ``V``; a fused attention) is tagged
``attn_core`` for selective recomputation. A core written out in matmuls counts in model FLOPs as
hf_blocks.eager_attention's (``attention.py``): ``Q K^T`` and ``P V`` at ``attention_pair_share`` (half when its mask
comes from ``tril``/``triu``, a triangular buffer or an ``arange`` comparison), the ops between them at 0.

The package by concern: ``tables`` holds the op-mapping tables (ATen packet -> the handler and kernel kind that
costs it, dtype labels), ``shapes`` the FakeTensor shapes and the graph Tensors kept per FX node, ``ops`` one handler
per kind of op, ``assemble`` the walk over the exported graph (parameters, layers, fallbacks) and the entry points.
"""

from wattcast.featurize.torch_import.assemble import graph_from_exported_program, graph_from_module

__all__ = ["graph_from_module", "graph_from_exported_program"]
