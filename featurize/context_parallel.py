"""Context parallelism's group rules that the graph builder (:mod:`wattcast.featurize.op_graph`) and the scheduler
(:mod:`wattcast.simulate.parallel`, :mod:`wattcast.simulate.distributed`) share: pure functions of the
``--cp-comm-type``, the CP degree and the all-to-all group's size."""

from __future__ import annotations

import numpy as np


def cp_ring_size(cp_comm: str, cp: int, a2a: int) -> int:
    """Ranks of context parallelism's KV ring (``cp_comm``: p2p, a2a, allgather or a2a+p2p; ``a2a``: its all-to-all
    group's size, 1 without one): p2p's whole CP group, a2a+p2p's outer group of cp / a2a (the all-to-all group of
    ``a2a`` consecutive CP ranks inside it: Megatron-Core's ``--hierarchical-context-parallel-sizes``); a2a and
    allgather pass no KV round a ring (1). ``simulate.parallel.cp_group_sizes`` gives a config's."""
    return cp // a2a if cp_comm in ("p2p", "a2a+p2p") else 1


def cp_refuses_window(cp_comm: str, cp: int, a2a: int) -> bool:
    """Whether Transformer Engine refuses sliding-window attention under this context parallelism (as
    :func:`cp_ring_size`): where a KV ring runs. TE 2.20.2 attn_forward_func_with_cp (context_parallel.py
    l. 5688-5694): "Context parallelism does not support sliding window attention with cp_comm_type=..." but a2a and
    all_gather (an a2a+p2p whose ring is 1 runs as a2a, l. 5631-5636)."""
    return cp_ring_size(cp_comm, cp, a2a) > 1


def ring_attention_steps(s_q, ring, causal):
    """The fused-attention kernels one rank of a KV ring launches per direction, as Transformer Engine 2.20.2's
    ``AttnFuncWithCPAndKVP2P`` runs them (transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py): ``ring`` steps, one kernel each, on this rank's ``s_q`` queries (two load-balanced chunks of
    s_q / 2: chunks r and 2 x ring - 1 - r of the sequence) against the K/V block in hand (s_q keys, two chunks).
    Under the causal mask (the cp_size x step table and sections of forward l. 2009-2111, backward l. 2812-2851):

    - step 0 forward (the last step backward), the rank's own K/V, "diagonal": one causal s_q x s_q kernel;
    - ``rank`` steps "lower-triangle" (forward ``i <= rank``, backward ``i >= cp_size - rank - 1``): every query
      against the K/V block's first chunk (``k_part[:, 0]``, ``cu_seqlens_kv_half``, cp_p2p_fwd_prepare_qkv l. 884-
      917): s_q x s_q / 2, no mask;
    - the other ring - 1 - rank steps "upper-triangle": the second query chunk against the whole block: s_q / 2 x
      s_q, no mask.

    Every step covers s_q^2 / 2 query-key pairs, ring x s_q^2 / 2 in all: the node's FLOPs (1/cp of the full causal
    square). A rank's mix of lower and upper steps depends on its rank; the ranks step together round the ring and
    this is costed for the average rank, (ring - 1) / 2 of each. Without the mask every step is the "all" section,
    s_q x s_q full. Arrays (vectorised over rows): (s_q, s_kv, kept, count), each of shape (n, 3) for the three
    kernel kinds (diagonal, lower, upper; kept: the share of the s_q x s_kv pairs the mask keeps)."""
    s_q = np.asarray(s_q, dtype=float)
    ring = np.asarray(ring, dtype=float)
    causal = np.asarray(causal, dtype=bool)
    half = s_q / 2.0
    sq = np.stack([s_q, s_q, np.where(causal, half, s_q)], axis=-1)
    skv = np.stack([s_q, np.where(causal, half, s_q), s_q], axis=-1)
    kept = np.stack([np.where(causal, 0.5, 1.0), np.ones_like(s_q), np.ones_like(s_q)], axis=-1)
    off = ring - 1.0
    count = np.stack([np.ones_like(s_q), np.where(causal, off / 2.0, off), np.where(causal, off / 2.0, 0.0)], axis=-1)
    return sq, skv, kept, count
