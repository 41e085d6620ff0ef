"""The collective vocabulary: canonical names and the aliases tools use for them."""

from __future__ import annotations

import re

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")

_ALIASES = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all", "all2all": "all_to_all", "alltoallv": "all_to_all", "a2a": "all_to_all",
    "broadcast": "broadcast", "bcast": "broadcast", "sendrecv": "send_recv", "p2p": "send_recv",
    "send": "send_recv", "recv": "send_recv", "sendreceive": "send_recv",
}
for _c in COLLECTIVES:
    _ALIASES[_c.replace("_", "")] = _c


def canonical_op(name: str) -> str:
    """The canonical collective name for ``name`` (aliases: allreduce, alltoall, sendrecv, ...)."""
    key = re.sub(r"[^a-z0-9]", "", str(name).lower())
    key = re.sub(r"perf$", "", key)
    if key.startswith("nccl"):
        key = key[4:]
    c = _ALIASES.get(key)
    if c is None:
        raise ValueError(f"unknown collective {name!r}; valid: {', '.join(COLLECTIVES)} "
                         "(aliases such as allreduce, alltoall, sendrecv are accepted)")
    return c


def busbw_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw x factor, algbw = size / time (nccl-tests doc/PERFORMANCE.md,
    ``src/*.cu`` ``*GetBw``): all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast and
    send_recv 1."""
    n = int(ranks)
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0
