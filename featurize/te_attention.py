"""Transformer Engine's attention backend under Megatron-Core (``TEDotProductAttention``), and whether the attention
output it saves for backward is the very tensor ``linear_proj`` saves as its input (one storage, counted once).

Megatron-Core's default ``--attention-backend auto`` sets ``NVTE_FLASH_ATTN=1`` and ``NVTE_FUSED_ATTN=1``
(megatron-core 0.16.1 ``models/common/language_module/language_module.py`` l. 123-125) and lets Transformer Engine
choose. TE 2.20.2 ``pytorch/attention/dot_product_attention/utils.py`` ``get_attention_backend``:

- FlashAttention 2 needs sm80+ (l. 640-643), FlashAttention 3 sm90 only (l. 647-650), FusedAttention (cuDNN) sm80+
  (l. 644-646); a bf16 causal self-attention with head dim 128 passes every other filter of both;
- "Select FusedAttention for performance": with both available on compute capability >= 9.0 FlashAttention is
  dropped (l. 1892-1898), so Hopper (sm90) and Blackwell (sm100, sm120) run cuDNN's FusedAttention; below 9.0 (A100
  sm80, sm86, Ada sm89) FlashAttention 2 wins (l. 1900-1903) whenever flash-attn is installed (l. 1863-1864; NVIDIA's
  PyTorch containers ship it, assumed here).

What each keeps for backward, and what it returns to ``linear_proj`` (TE 2.20.2 ``.../backends.py``):

- FusedAttention: ``FusedAttnFunc`` saves q, k, v, ``out`` and the aux tensors (fp32 softmax stats, rng state;
  l. 1773-1851, ``ctx.save_for_backward`` l. 2272) and returns ``output.view(s, b, -1)`` (l. 2637): a view of the
  saved ``out``. ``linear_proj`` (TE ``Linear``, bf16) saves its input object itself (``module/linear.py``
  l. 535 ``cast_if_needed`` is a no-op in bf16, l. 715-717 ``saved_inputmat = inputmat``): one storage, referenced
  twice.
- FlashAttention (2 or 3): flash-attn's ``FlashAttnFunc`` (``flash_attn_interface.py``, flash-attn 2.x; its source
  is not unpacked here) saves q, k, v, ``out_padded`` (the output itself at head dim 128), the fp32 ``softmax_lse``
  and the rng state; TE's wrapper turns the (b, s, h, d) output into Megatron's
  (s, b, h*d) by ``output.view(b, s, -1).transpose(0, 1)`` and returns ``output.contiguous()`` (l. 1428 and 1436): a
  copy when b > 1, the same storage when b == 1 (a size-1 dimension's stride does not break contiguity, so
  ``contiguous()`` returns the tensor itself). So two copies of the output at micro-batch > 1, one at micro-batch 1.

Context parallelism (since stop 50; two copies before): the ring (p2p) and allgather functions save the tensor they
return, so the rule above holds; the all-to-all ones (a2a, a2a+p2p) save the output before their all-to-all (two
copies). Not covered (two copies, the pre-stop-46 count): Megatron-DeepSpeed and Hugging Face; query and value head dims that differ
(MLA) under FlashAttention are two copies by the rule (TE pads and trims them, ``dot_product_attention.py``
l. 2966-2967). A GPU below sm80 (where TE falls back to its unfused attention, l. 640-646, which wattcast does not
model under ``--attention flash``) and one of unknown capability (AMD: TE's ROCm port is not read here) get
FlashAttention's rule."""

from __future__ import annotations

from wattcast.featurize.fp8_recipes import compute_capability

#: Transformer Engine's attention backends wattcast tells apart: "flash" (FlashAttention 2/3, flash-attn) and
#: "fused" (FusedAttention, cuDNN)
TE_ATTENTION_BACKENDS = ("flash", "fused")

#: get_attention_backend prefers FusedAttention from this compute capability on (TE 2.20.2 utils.py l. 1893)
FUSED_PREFERRED_FROM_CC = (9, 0)


def te_attention_backend(spec) -> str:
    """The backend Transformer Engine 2.20.2 picks for Megatron-Core's bf16 causal attention (head dim 128) on ``spec``:
    "fused" from compute capability 9.0 (H100, B200, RTX PRO Blackwell), else "flash" (A100; a GPU of unknown
    capability, e.g. AMD, keeps "flash", the old count)."""
    cc = compute_capability(spec)
    return "fused" if cc is not None and cc >= FUSED_PREFERRED_FROM_CC else "flash"


def attention_output_shared(backend: str, batch: int, cp: int, head_dim_qk: int, head_dim_v: int, *,
                            cp_comm: str = "p2p", cp_a2a: int = 1) -> bool:
    """Whether the attention output TE's backend saves for backward and the tensor it hands ``linear_proj`` (which
    saves it) are one storage: always under FusedAttention; under FlashAttention when the micro-batch is 1 (the
    (s, b, h*d) transpose is then already contiguous) and the head dims agree. Under context parallelism the same
    rule with the KV ring (``cp_comm`` p2p without an all-to-all group) and with allgather, whose functions save the
    tensor they return (TE 2.20.2 context_parallel.py l. 2166-2176, 2254-2255, 2297-2305, 2349-2356: the ring's
    accumulator kept in the partial outputs' dtype, ``out.to(dtype)`` of it the tensor itself; allgather: one
    output buffer, l. 3495, 3826-3832, 3861-3880, 3928-3929); not with an all-to-all (a2a, a2a+p2p): that saves the
    rank's output before the all-to-all and returns the tensor the all-to-all writes (l. 2259-2271, 4925-4950).
    a2a+p2p with an all-to-all group of 1 (``--hierarchical-cp-sizes 1,N``) runs no all-to-all: TE's
    ``AttnFuncWithCPAndKVP2P`` takes its ``flash_attn_a2a_communicate`` branches only when ``cp_size_a2a > 1`` (the
    same branches the l. 2259-2271 output exchange sits in), so it saves and returns one output as the plain ring does
    (the graph adds no all-to-all copies for it either: ``GraphBuilder.flash_attention``, ``cp_a2a > 1``; issue 15:
    until then its activations were charged the a2a's extra output, 5% more than p2p at an identical step time).
    ``cp_a2a``: the all-to-all group's size (a2a: cp, whatever is passed)."""
    runs_a2a = str(cp_comm) == "a2a" or (str(cp_comm) == "a2a+p2p" and int(cp_a2a) > 1)
    if int(cp) > 1 and runs_a2a:
        return False
    if backend == "fused":
        return True
    return int(batch) == 1 and int(head_dim_qk) == int(head_dim_v)


def vllm_flash_kernel(spec) -> str:
    """The fused-attention class (data/kernel_ops.FLASH_KERNELS) vLLM's serving step runs on ``spec``: "fa3" on Hopper
    and data-centre Blackwell (compute capability 9.0 <= cc < 12.0), "fa2" elsewhere (Ampere, Ada, consumer Blackwell,
    AMD: FA2 is native there, the pre-stop-58 costing).

    From memory, not verified against vLLM's source here (no vLLM installed): vLLM's FlashAttention backend runs its
    own FA3 build on sm90 (``vllm/attention/utils/fa_utils.py`` ``get_flash_attn_version``: 3 when the device's major
    capability is 9), and on sm100 its default backend is FlashInfer, whose Blackwell kernels (TRT-LLM / cuDNN) use
    the generation's instruction; both are the ``fa3`` class (models/attention.py)."""
    cc = compute_capability(spec)
    return "fa3" if cc is not None and (9, 0) <= cc < (12, 0) else "fa2"
