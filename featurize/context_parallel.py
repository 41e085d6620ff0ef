"""Context parallelism's group rules that the graph builder (:mod:`wattcast.featurize.op_graph`) and the scheduler
(:mod:`wattcast.simulate.parallel`, :mod:`wattcast.simulate.distributed`) share: pure functions of the
``--cp-comm-type``, the CP degree and the all-to-all group's size."""

from __future__ import annotations


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
