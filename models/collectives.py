"""Collective-communication time on a cluster: an alpha-beta model per link tier, plus a learned correction.

Prediction-time code only (numpy + LightGBM text models; nothing here trains). Semantics follow nccl-tests:

- ``size_bytes`` is the ``size`` column nccl-tests prints: the per-rank buffer for all_reduce, broadcast and
  send_recv; the *total* (gathered / scattered) buffer for all_gather, reduce_scatter and all_to_all.
- bus bandwidth = size / time x :func:`bus_factor`: all_reduce 2(n-1)/n; all_gather, reduce_scatter and
  all_to_all (n-1)/n; broadcast and send_recv 1. ``bus_factor(op, n) x size`` is the number of bytes every
  rank must move through its links in a bandwidth-optimal algorithm on a flat network.
- send_recv is nccl-tests' ``sendrecv_perf``: every rank sends ``size`` bytes to the next rank (mod n) and
  receives as much from the previous one. A single point-to-point transfer is ``n_gpus=2``.

A query is a group of ``n_gpus`` GPUs placed ``gpus_per_node`` (g) to a node, so it spans N = ceil(n / g)
nodes. Tiers: ``intra`` (per-GPU NVLink/NVSwitch/xGMI/PCIe bandwidth B_i, latency a_i) and ``inter`` (NICs: per-GPU
share B_e = min(c, nics_per_node) x NIC rate / c / oversubscription, latency a_e), where c (``concurrent_per_node``,
>= g, default g) is how many GPUs of a node drive inter-node traffic at the same time as this collective: the group's
own g members and those of the other groups of its kind running beside it (a training job's DP groups all reduce at
once; every rank at a pipeline stage boundary sends at once). The default c = g is a group with the node's NICs to
itself, as nccl-tests measures one. Why the share: NCCL's topology search gives each channel the NIC nearest its GPU
(src/graph/search.cc, paths.cc: the NIC on the GPU's own PCIe switch first), and rail-optimised nodes (DGX A100 /
H100 / B200) have one NIC per GPU, so every GPU has its own whatever the others do. With fewer NICs than GPUs (DGX-1:
4 NICs, each on a PCIe switch with two of the 8 GPUs, NVIDIA's DGX-1 system architecture white paper; Polaris: 2 for
4; a PCIe server: 1) the GPUs behind one switch share its NIC: with c of the node's GPUs sending across at once each
gets min(c, nics)/c of one, not the min(g, nics)/g its own group's members alone would get. Every algorithm gives
per-GPU bytes on each tier and a latency term; time = latency + max(bytes_intra / B_i, bytes_inter / B_e): the tiers
run concurrently (NCCL pipelines chunks through all of them). On a ``full_mesh`` in-node tier (``intra.topology``: one
direct link to each of the node's G - 1 peers, each B_i / (G - 1)) a GPU reaches only its group's peers: B_i is
scaled by (g-1)/(G-1) for every collective of a group with g GPUs per node (ring and direct algorithms on a full mesh
drive the links to the group's peers at once) and by 1/(G-1) for send_recv (one link per transfer); a ``switch``
tier gives any group all of B_i. With f = bus_factor(op, n), S = size, N nodes:

``ring`` (NCCL's ring; with N > 1 one channel per NIC/rail, each channel leaving the node through its own
NIC, so a node's cross-node traffic is spread over its g GPUs' NICs)
    all_reduce / all_gather / reduce_scatter / broadcast: intra f S (g-1)/g, inter f S / g
    (N = 1: intra f S); latency steps x a, steps 2(n-1) for all_reduce and n-1 otherwise, a = a_e if the
    group spans nodes else a_i. Every step of an inter-node ring at a_e, not only its ~N node crossings: NCCL's
    tuning model (src/graph/tuning.cc) charges the intra steps of an inter-node ring at least its network proxy
    overhead (netOverhead, x3 for Simple), and the DGX H100 10-node all-gather / reduce-scatter rings measure ~5 us
    a step (latency intercepts 158-200 us at 4 GPUs per node, 413-519 us at 8; the crossings-only form gives
    135 / 255 us and fits the nccl-tests rows worse: README "Collectives").
    all_to_all (direct, every pair): intra S (g-1)/n, inter S (n-g)/n; latency (g-1) a_i + (n-g) a_e.
    send_recv: within a node S / B_i; across nodes S / B_1 (the intra pairs of the same group in parallel), B_1 =
    min(k, nics_per_node) x NIC rate / k / oversubscription, one pair's share of the NICs with k = c / g pairs of the
    node sending across at once: each group's ring leaves a node through one of its g members there (nccl-tests'
    single group, c = g: k = 1, a whole NIC); a pipeline's stage boundary (pairs, g = 1) sends from all c of its
    ranks on the node at once; latency a (one hop).
``tree`` (all_reduce: NCCL's double binary tree across nodes, a chain inside each node; broadcast: a
binomial tree). all_reduce: intra 2S (g > 1), inter 2S / g; latency 2 (ceil(log2 N) a_e + (g-1) a_i).
broadcast: intra S, inter 2S / g; latency ceil(log2 N) a_e + ceil(log2 g) a_i. Tree bytes are divided by 0.92
(``TREE_BW_EFFICIENCY``, the derating NCCL's tuning model applies to tree all-reduce). Other collectives have
no tree.
``hierarchical`` (explicit 2-level: intra reduce-scatter, inter collective among the N same-rank GPUs (rails)
on 1/g of the data, intra all-gather; phases pipelined)
    all_reduce: intra 2S (g-1)/g, inter 2S (N-1)/N / g; latency 2 (g-1) a_i + 2 (N-1) a_e.
    all_gather / reduce_scatter: intra S (g-1)/g, inter S (N-1)/N / g; latency (g-1) a_i + (N-1) a_e.
    broadcast: intra S (g-1)/g, inter S / g; latency (g-1) a_i + (N-1) a_e. all_to_all and send_recv: as ring.
``nvls`` (all_reduce on an NVSwitch that reduces in the switch, NVLink SHARP: Hopper and later): intra S
(each GPU sends its buffer once and receives the result once); latency 2 a_i; across nodes the inter part
of ``ring``.
``auto`` = the fastest of ring and tree per query, and of nvls for a single-node all_reduce on such a switch
(NCCL's choice, roughly; across nodes NCCL's NVLS-tree is left to the correction).

The learned correction (a LightGBM model of log(measured / auto alpha-beta), trained on nccl-tests runs)
multiplies the auto time. It is clipped below at the wire-time floor: max over tiers of (fewest bytes any
algorithm moves on that tier / its full link bandwidth), so no correction can beat the links.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from wattcast.data.collective_ops import COLLECTIVES, canonical_op  # noqa: E402  (re-exported)

ALGORITHMS = ("auto", "ring", "tree", "hierarchical", "nvls")

MANIFEST = "collective_manifest.json"
MODEL_FILE = "collective_correction.txt"
MANIFEST_SCHEMA = 1
#: a retrained model's folder: ``collective_versions/<name>/`` holds each version written, ``COLLECTIVE_CURRENT``
#: names the live one (switched with one atomic rename; models/versioned.py); a folder without the pointer (the
#: shipped ``models/artifacts/``) is itself the model. Own names, so the kernel bundle can share the folder.
POINTER = "COLLECTIVE_CURRENT"
VERSIONS = "collective_versions"
#: collective models the gate refused: ``collective_refused/<name>/`` (the newest few), apart from the versions and
#: from the kernel bundle's ``refused/`` in a shared folder; usable by their folder (--collectives), never made live
REFUSED = "collective_refused"

_OP_CODE = {c: i for i, c in enumerate(COLLECTIVES)}
AR, AG, RS, A2A, BC, SR = range(6)

#: features of the learned correction, in model column order (see :func:`correction_features`)
FEATURES = (
    "op", "log2_size", "log2_bytes_per_rank", "log2_n", "nodes", "gpus_per_node", "tiers", "crosses_nodes",
    "algorithm", "latency_frac", "inter_frac",
    "intra_bw_gb_per_s", "inter_bw_per_gpu_gb_per_s", "intra_latency_us", "inter_latency_us",
    "nics_per_gpu", "rail_optimized", "oversubscription", "nvls",
)
CATEGORICAL = ("op",)
#: link-spec features: a query whose cluster differs from every training cluster's is out of support
LINK_FEATURES = FEATURES[11:]
#: which entries of :meth:`LinkParams.link_vector` describe the in-node tier and which the inter-node tier: a query
#: is compared with the training clusters only on the tiers it crosses (in-node when g > 1, across nodes when N > 1),
#: so a single-node collective's support never depends on the NICs, nor a 1-GPU-per-node one's on NVLink
INTRA_LINK_COLUMNS = np.array([True, False, True, False, False, False])
INTER_LINK_COLUMNS = ~INTRA_LINK_COLUMNS
#: feature columns describing each tier (zeroed on rows that do not cross it; oversubscription set to 1.0, the
#: value of a cluster without that tier)
_INTRA_FEATURES = [FEATURES.index(f) for f in ("intra_bw_gb_per_s", "intra_latency_us", "nvls")]
_INTER_FEATURES = [FEATURES.index(f) for f in ("inter_bw_per_gpu_gb_per_s", "inter_latency_us", "nics_per_gpu",
                                                "rail_optimized")]
_OVERSUB_FEATURE = FEATURES.index("oversubscription")
#: the tree reaches this fraction of the link bandwidth (NCCL's own tuning model derates tree all-reduce by 0.92)
TREE_BW_EFFICIENCY = 0.92
#: bits of the out-of-support mask, and their names (``CollectivePrediction.ood_reason``)
OOD_BITS = {"fallback": 1, "op": 2, "size": 4, "group": 8, "nodes": 16, "gpus_per_node": 32, "tiers": 64, "cluster": 128}
#: relative slack on numeric support ranges
SUPPORT_SLACK = 0.02

#: GPUs whose NVSwitch reduces in the switch (NVLink SHARP): Hopper and Blackwell
_NVLS_DEVICE = re.compile(r"(?i)(?:^|[^a-z0-9])(?:gh\d{3}|h1\d\d|h20\d?|h800|gb[23]\d\d|b[123]\d\d)(?:$|[^0-9])")


# ------------------------------------------------------------------------------------------- names
def _op_codes(op, n: int) -> np.ndarray:
    if isinstance(op, str):
        return np.full(n, _OP_CODE[canonical_op(op)], dtype=np.int64)
    arr = np.asarray(op)
    if arr.dtype.kind in "iu":
        if arr.size and (arr.min() < 0 or arr.max() >= len(COLLECTIVES)):
            raise ValueError(f"collective codes must be 0..{len(COLLECTIVES) - 1} ({', '.join(COLLECTIVES)})")
        return np.broadcast_to(arr.astype(np.int64), (n,)).copy()
    uniq, inv = np.unique(arr.astype(str), return_inverse=True)
    codes = np.array([_OP_CODE[canonical_op(u)] for u in uniq], dtype=np.int64)
    return np.broadcast_to(codes[inv.reshape(arr.shape)], (n,)).copy()


def bus_factor(op, n):
    """nccl-tests' bus-bandwidth factor (busbw = size / time x factor); vectorised over ``n`` (and ``op``)."""
    n_arr = np.asarray(n, dtype=np.float64)
    codes = _op_codes(op, max(n_arr.size, 1)).reshape(n_arr.shape) if n_arr.ndim else _op_codes(op, 1)[0]
    out = _bus_factor_codes(np.asarray(codes), n_arr)
    return float(out) if np.ndim(out) == 0 else out


def _bus_factor_codes(codes: np.ndarray, n: np.ndarray) -> np.ndarray:
    nn = np.maximum(n, 1.0)
    return np.select([codes == AR, (codes == AG) | (codes == RS) | (codes == A2A)],
                     [2.0 * (nn - 1) / nn, (nn - 1) / nn], default=np.where(n > 1, 1.0, 0.0))


# ------------------------------------------------------------------------------------------ links
@dataclass(frozen=True)
class LinkParams:
    """What the alpha-beta model needs from a cluster (bandwidths in bytes per microsecond)."""

    name: str
    gpus_per_node: int
    max_nodes: int | None
    intra_bw: float  # B/us per GPU, one direction
    intra_lat: float  # us
    has_inter: bool
    nics_per_node: int
    nic_bw: float  # B/us per NIC, after oversubscription
    inter_lat: float
    rail_optimized: bool
    oversubscription: float
    nvls: bool  # the in-node switch reduces (NVLink SHARP)
    #: links from a GPU to its in-node peers on a full-mesh tier (G - 1, each intra_bw / mesh_links); 0 on a switch
    mesh_links: int = 0

    @property
    def topology(self) -> str:
        """The in-node tier's topology: ``full_mesh`` (links to each peer) or ``switch``."""
        return "full_mesh" if self.mesh_links else "switch"

    def link_vector(self) -> tuple[float, ...]:
        """(intra GB/s, inter GB/s per GPU, intra latency us, inter latency us, rail-optimised, oversubscription): the
        cluster's support coordinates; :data:`INTRA_LINK_COLUMNS` / :data:`INTER_LINK_COLUMNS` say which tier each
        describes."""
        return (self.intra_bw / 1e3, self.nic_bw / 1e3 * min(self.nics_per_node, self.gpus_per_node) / max(self.gpus_per_node, 1)
                if self.has_inter else 0.0, self.intra_lat, self.inter_lat, float(self.rail_optimized), self.oversubscription)


def _cluster_key(c) -> tuple:
    return (c.name, c.device, c.gpus_per_node, c.intra, c.inter, c.max_nodes)


_LP_CACHE: dict[tuple, LinkParams] = {}
_LP_LOCK = threading.Lock()


def link_params(cluster) -> LinkParams:
    """Cached per cluster spec (a preset name, a cluster file or a ``ClusterSpec``)."""
    if isinstance(cluster, LinkParams):
        return cluster
    if not hasattr(cluster, "intra"):
        from wattcast.data.cluster_spec import resolve_cluster

        cluster = resolve_cluster(cluster)
    key = _cluster_key(cluster)
    lp = _LP_CACHE.get(key)
    if lp is None:
        inter = cluster.inter
        osub = inter.oversubscription if inter is not None else 1.0
        lp = LinkParams(
            name=cluster.name, gpus_per_node=int(cluster.gpus_per_node), max_nodes=cluster.max_nodes,
            intra_bw=float(cluster.intra.bandwidth_gb_per_s) * 1e3, intra_lat=float(cluster.intra.latency_us),
            has_inter=inter is not None, nics_per_node=int(inter.nics_per_node) if inter else 0,
            nic_bw=float(inter.nic_bandwidth_gbit_per_s) / 8.0 * 1e3 / osub if inter else 0.0,
            inter_lat=float(inter.latency_us) if inter else 0.0,
            rail_optimized=bool(inter.rail_optimized) if inter else False, oversubscription=float(osub),
            nvls=cluster.intra.kind == "nvswitch" and bool(_NVLS_DEVICE.search(cluster.device or "")),
            mesh_links=_mesh_links(cluster),
        )
        with _LP_LOCK:
            _LP_CACHE[key] = lp
    return lp


def _mesh_links(cluster) -> int:
    """A GPU's links to its in-node peers when ``cluster``'s in-node tier is a full mesh (``intra.topology``), else 0."""
    if getattr(cluster.intra, "topology", None) != "full_mesh" or int(cluster.gpus_per_node) < 2:
        return 0
    return int(cluster.gpus_per_node) - 1


# ------------------------------------------------------------------------------------ alpha-beta
@dataclass
class CollectiveQuery:
    codes: np.ndarray
    S: np.ndarray  # bytes
    n: np.ndarray  # float
    g: np.ndarray  # GPUs per node actually used (<= n)
    N: np.ndarray  # nodes
    lp: LinkParams
    #: GPUs of a node driving inter-node traffic at once with this collective (>= g; g: the group alone)
    c: np.ndarray | None = None

    def __post_init__(self):
        if self.c is None:
            self.c = self.g


def collective_query(op, size_bytes, n_gpus, gpus_per_node, cluster, concurrent_per_node=None) -> CollectiveQuery:
    """``concurrent_per_node``: GPUs of a node driving inter-node traffic at once with this collective (the group's
    own members per node and those of the other groups running beside it: module docstring); None = the group's own
    (``gpus_per_node``), a group with the node's NICs to itself."""
    lp = link_params(cluster)
    conc = gpus_per_node if concurrent_per_node is None else concurrent_per_node
    S, n, g, c = np.broadcast_arrays(np.asarray(size_bytes, dtype=np.float64), np.asarray(n_gpus, dtype=np.float64),
                                     np.asarray(gpus_per_node, dtype=np.float64), np.asarray(conc, dtype=np.float64))
    shape = S.shape
    S, n, g, c = S.ravel(), n.ravel(), g.ravel(), c.ravel()
    if np.ndim(op) and not isinstance(op, str):
        op_arr = np.asarray(op)
        if op_arr.size != S.size:
            if S.size == 1:
                S, n, g, c = (np.broadcast_to(a, (op_arr.size,)) for a in (S, n, g, c))
                shape = op_arr.shape
            else:
                raise ValueError(f"op has {op_arr.size} entries but the sizes/groups have {S.size}")
        codes = _op_codes(op_arr.ravel(), S.size)
    else:
        codes = _op_codes(op, S.size)
    if S.size:
        if not np.all(np.isfinite(S)) or S.min() < 0:
            raise ValueError("size_bytes must be finite and >= 0")
        if n.min() < 1 or g.min() < 1 or np.any(n != np.round(n)) or np.any(g != np.round(g)):
            raise ValueError("n_gpus and gpus_per_node must be whole numbers >= 1")
        if g.max() > lp.gpus_per_node:
            raise ValueError(f"gpus_per_node {int(g.max())} exceeds the {lp.gpus_per_node} GPUs per node of cluster {lp.name!r}")
        if concurrent_per_node is not None:
            if np.any(c != np.round(c)) or np.any(c < g) or c.max() > lp.gpus_per_node:
                bad = int(np.flatnonzero((c != np.round(c)) | (c < g) | (c > lp.gpus_per_node))[0])
                raise ValueError(f"concurrent_per_node {c[bad]:g} must be a whole number between the group's gpus_per_node "
                                 f"({g[bad]:g}) and the {lp.gpus_per_node} GPUs per node of cluster {lp.name!r}")
    g = np.minimum(g, n)
    # a group inside one node drives no inter-node traffic; otherwise at least its own members per node do
    c = np.maximum(c, g)
    N = np.ceil(n / g)
    if S.size and N.max() > 1:
        if not lp.has_inter:
            raise ValueError(f"a group of {int(n[N > 1][0])} GPUs at {int(g[N > 1][0])} per node spans nodes, "
                             f"but cluster {lp.name!r} has no inter-node tier")
        if lp.max_nodes is not None and N.max() > lp.max_nodes:
            raise ValueError(f"the group spans {int(N.max())} nodes; cluster {lp.name!r} has {lp.max_nodes}")
    q = CollectiveQuery(codes, S, n, g, N, lp, c)
    q.shape = shape  # type: ignore[attr-defined]
    return q


def _inter_bw_gpu(q: CollectiveQuery) -> np.ndarray:
    """B_e: one GPU's share of its node's NICs while ``q.c`` of the node's GPUs drive inter-node traffic at once
    (module docstring: NICs paired with GPUs on rail-optimised nodes, shared behind a PCIe switch with fewer)."""
    lp = q.lp
    return np.minimum(q.c, lp.nics_per_node) * lp.nic_bw / q.c if lp.has_inter else np.zeros_like(q.g)


def _terms(q: CollectiveQuery, alg: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(latency_us, intra_bytes, inter_bytes) per GPU for algorithm ``alg``; inf latency where it does not apply."""
    c, S, n, g, N, lp = q.codes, q.S, q.n, q.g, q.N, q.lp
    multi = N > 1
    f = _bus_factor_codes(c, n)
    a_top = np.where(multi, lp.inter_lat, lp.intra_lat)
    is_a2a, is_sr, is_ar, is_bc = c == A2A, c == SR, c == AR, c == BC
    zero = np.zeros_like(S)
    if alg in ("ring", "hierarchical", "nvls"):
        steps = np.where(is_ar, 2.0 * (n - 1), n - 1)
        lat = steps * a_top
        intra = np.where(multi, f * S * (g - 1) / g, f * S)
        inter = np.where(multi, f * S / g, zero)
        # all_to_all: direct exchange with every peer
        lat = np.where(is_a2a, (g - 1) * lp.intra_lat + (n - g) * lp.inter_lat, lat)
        intra = np.where(is_a2a, S * (g - 1) / n, intra)
        inter = np.where(is_a2a, S * (n - g) / n, inter)
        # send_recv: one hop; across nodes on one pair's share B_1 of the NICs among the node's k = c / g crossing
        # pairs (one NIC for nccl-tests' single group, k = 1; inter bytes scaled so that bytes / B_e = S / B_1)
        lat = np.where(is_sr, a_top, lat)
        intra = np.where(is_sr, np.where(g > 1, S, zero), intra)
        if lp.has_inter:
            k = q.c / g
            one_nic = S * _inter_bw_gpu(q) / (np.minimum(k, lp.nics_per_node) * lp.nic_bw / k)
            inter = np.where(is_sr & multi, one_nic, inter)
        if alg == "hierarchical":
            hier = multi & (g > 1) & ~is_a2a & ~is_sr
            fN = np.where(is_ar, 2.0 * (N - 1) / N, (N - 1) / N)
            h_lat = np.where(is_ar, 2.0, 1.0) * ((g - 1) * lp.intra_lat + (N - 1) * lp.inter_lat)
            h_intra = np.where(is_ar, 2.0, 1.0) * S * (g - 1) / g
            h_inter = np.where(is_bc, S / g, fN * S / g)
            lat = np.where(hier, h_lat, lat)
            intra = np.where(hier, h_intra, intra)
            inter = np.where(hier, h_inter, inter)
        if alg == "nvls":
            ok = is_ar & lp.nvls & (n > 1)
            lat = np.where(ok, np.where(multi, lat, 2.0 * lp.intra_lat), np.inf)
            intra = np.where(ok, np.where(g > 1, S, zero), intra)
        return lat, intra, inter
    if alg == "tree":
        lg_N = np.ceil(np.log2(np.maximum(N, 1)))
        lg_g = np.ceil(np.log2(np.maximum(g, 1)))
        lat = np.where(is_ar, 2.0 * (lg_N * lp.inter_lat + (g - 1) * lp.intra_lat),
                       np.where(is_bc, lg_N * lp.inter_lat + lg_g * lp.intra_lat, np.inf))
        intra = np.where(g > 1, np.where(is_ar, 2.0 * S, S), zero) / TREE_BW_EFFICIENCY
        inter = np.where(multi, 2.0 * S / g, zero) / TREE_BW_EFFICIENCY
        return lat, intra, inter
    raise ValueError(f"unknown algorithm {alg!r}; valid: {', '.join(ALGORITHMS)}")


def intra_share(q: CollectiveQuery) -> np.ndarray | float:
    """Fraction of the per-GPU in-node bandwidth a query's GPUs can use: 1 on a switch; on a full mesh of G GPUs
    (G - 1 links per GPU) (g-1)/(G-1) for a collective of g GPUs per node, 1/(G-1) for send_recv (one link)."""
    links = q.lp.mesh_links
    if not links:
        return 1.0
    return np.where(q.codes == SR, 1.0, np.maximum(q.g - 1.0, 1.0)) / links


def _wire_us(q: CollectiveQuery, intra: np.ndarray, inter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t_intra = intra / (q.lp.intra_bw * intra_share(q))
    bw_e = _inter_bw_gpu(q)
    t_inter = np.divide(inter, bw_e, out=np.zeros_like(inter), where=inter > 0)
    return t_intra, t_inter


@dataclass
class AlphaBeta:
    """The alpha-beta estimate of a batch of queries, with what the correction and the floor need."""

    us: np.ndarray  # time (us); 0 for a single GPU
    latency_us: np.ndarray
    intra_wire_us: np.ndarray
    inter_wire_us: np.ndarray
    algorithm: np.ndarray  # int: index into ALGORITHMS of the algorithm used (auto: the fastest)
    floor_us: np.ndarray  # wire time at full link bandwidth, the fewest bytes of any algorithm per tier
    query: Any = field(repr=False, default=None)


def alpha_beta(q: CollectiveQuery, algorithm: str = "auto") -> AlphaBeta:
    algorithm = str(algorithm).lower()
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}")
    cand = (("ring", "tree", "nvls") if q.lp.nvls else ("ring", "tree")) if algorithm == "auto" else (algorithm,)
    if algorithm in ("tree", "nvls"):
        bad = ~np.isin(q.codes, (AR, BC) if algorithm == "tree" else (AR,))
        if bad.any():
            raise ValueError(f"algorithm {algorithm!r} applies to "
                             f"{'all_reduce and broadcast' if algorithm == 'tree' else 'all_reduce'} only, "
                             f"not {COLLECTIVES[int(q.codes[bad][0])]}")
        if algorithm == "nvls" and not q.lp.nvls:
            raise ValueError(f"cluster {q.lp.name!r} has no NVLink SHARP switch (nvls needs an NVSwitch, Hopper or later)")
    best = None
    for alg in cand:
        lat, intra, inter = _terms(q, alg)
        if algorithm == "auto" and alg == "nvls":  # NCCL's NVLS within a node; across nodes the correction decides
            lat = np.where(q.N > 1, np.inf, lat)
        ti, te = _wire_us(q, intra, inter)
        tot = lat + np.maximum(ti, te)
        if best is None:
            best = [tot, lat, ti, te, np.full(len(tot), ALGORITHMS.index(alg), dtype=np.int64)]
        else:
            better = tot < best[0]
            for j, v in enumerate((tot, lat, ti, te)):
                best[j] = np.where(better, v, best[j])
            best[4] = np.where(better, ALGORITHMS.index(alg), best[4])
    tot, lat, ti, te, chosen = best
    # the floor: per tier, the fewest bytes any algorithm moves, at full bandwidth
    floors_i, floors_e = [], []
    for alg in ("ring", "tree", "hierarchical") + (("nvls",) if q.lp.nvls else ()):
        lat_a, intra, inter = _terms(q, alg)
        ti_a, te_a = _wire_us(q, intra, inter)
        ok = np.isfinite(lat_a)
        floors_i.append(np.where(ok, ti_a, np.inf))
        floors_e.append(np.where(ok, te_a, np.inf))
    floor = np.maximum(np.min(floors_i, axis=0), np.min(floors_e, axis=0))
    single = q.n <= 1
    if single.any():
        tot, lat, ti, te, floor = (np.where(single, 0.0, a) for a in (tot, lat, ti, te, floor))
    return AlphaBeta(tot, lat, ti, te, chosen, floor, q)


def alpha_beta_us(op, size_bytes, n_gpus, gpus_per_node, cluster, algorithm: str = "auto",
                  concurrent_per_node=None) -> np.ndarray:
    """Alpha-beta time (us) of collective(s) ``op`` on ``size_bytes`` (nccl-tests size) among ``n_gpus`` GPUs
    placed ``gpus_per_node`` per node on ``cluster``, ``concurrent_per_node`` GPUs of a node driving inter-node traffic
    at once (None: the group's own). Vectorised: sizes, group sizes, placements and ops broadcast against each other.
    ``algorithm``: auto | ring | tree | hierarchical | nvls (module docstring)."""
    q = collective_query(op, size_bytes, n_gpus, gpus_per_node, cluster, concurrent_per_node)
    return alpha_beta(q, algorithm).us.reshape(q.shape)  # type: ignore[attr-defined]


def busbw_gb_per_s(op, size_bytes, n_gpus, time_us) -> np.ndarray:
    """nccl-tests bus bandwidth (GB/s) of a measured or predicted time."""
    n = np.asarray(n_gpus, dtype=np.float64)
    f = bus_factor(op, n)
    return np.asarray(size_bytes, dtype=np.float64) / np.asarray(time_us, dtype=np.float64) / 1e3 * f


# ------------------------------------------------------------------------------------- features
def correction_features(ab: AlphaBeta) -> np.ndarray:
    """(n, len(FEATURES)) float64 matrix of the learned correction's inputs, columns in ``FEATURES`` order.

    ``inter_bw_per_gpu_gb_per_s`` and ``nics_per_gpu`` are the GPU's share of the NICs with the query's concurrent
    senders (``q.c``): what the GPU gets, the figure the alpha-beta's inter wire time (``inter_frac``) is made of. The
    correction was fitted on single-group nccl-tests (c = g), and the gate that applies it (``_cluster_seen``, on
    :meth:`LinkParams.link_vector`) admits only clusters whose NIC rate over all the node's GPUs (the share at c = G)
    matches a training cluster's: its one training cluster (DGX-H100) has a NIC per GPU, where the share is the same
    whatever c, so on every fabric it applies to these two columns are the values it was fitted on."""
    q = ab.query
    lp = q.lp
    n_rows = len(q.S)
    X = np.empty((n_rows, len(FEATURES)), dtype=np.float64)
    multi = q.N > 1
    with np.errstate(divide="ignore", invalid="ignore"):
        X[:, 0] = q.codes
        X[:, 1] = np.log2(np.maximum(q.S, 1.0))
        X[:, 2] = np.log2(np.maximum(q.S / q.n, 1.0))
        X[:, 3] = np.log2(q.n)
        X[:, 4] = q.N
        X[:, 5] = q.g
        X[:, 6] = (q.g > 1).astype(float) + multi
        X[:, 7] = multi
        X[:, 8] = ab.algorithm
        X[:, 9] = np.where(ab.us > 0, ab.latency_us / ab.us, 0.0)
        wire = ab.intra_wire_us + ab.inter_wire_us
        X[:, 10] = np.where(wire > 0, ab.inter_wire_us / wire, 0.0)
    X[:, 11] = lp.intra_bw / 1e3
    X[:, 12] = _inter_bw_gpu(q) / 1e3 if lp.has_inter else 0.0
    X[:, 13] = lp.intra_lat
    X[:, 14] = lp.inter_lat
    X[:, 15] = np.minimum(q.c, lp.nics_per_node) / q.c if lp.has_inter else 0.0
    X[:, 16] = float(lp.rail_optimized)
    X[:, 17] = lp.oversubscription
    X[:, 18] = float(lp.nvls)
    # only the links a row crosses: a single-node collective sees no NIC feature, a 1-GPU-per-node one no NVLink one
    intra_used, inter_used = q.g > 1, multi
    X[np.ix_(~intra_used, _INTRA_FEATURES)] = 0.0
    X[np.ix_(~inter_used, _INTER_FEATURES)] = 0.0
    X[~inter_used, _OVERSUB_FEATURE] = 1.0
    return X


# ------------------------------------------------------------------------------------------ model
@dataclass
class CollectivePrediction:
    us: np.ndarray  # predicted time (us)
    alpha_beta_us: np.ndarray  # the auto alpha-beta estimate
    floor_us: np.ndarray  # wire time at full link bandwidth: the prediction never goes below it
    ood: np.ndarray  # bool: outside the training support (or no learned model)
    ood_mask: np.ndarray  # int bit mask, see OOD_BITS

    @property
    def ood_reason(self) -> np.ndarray:
        """Per query: comma-separated names of the ways it is out of support ('' when in support)."""
        mask = np.asarray(self.ood_mask)
        uniq, inv = np.unique(mask.ravel(), return_inverse=True)
        names = np.empty(len(uniq), dtype=object)
        names[:] = [",".join(k for k, b in OOD_BITS.items() if int(m) & b) for m in uniq]
        return names[inv.ravel()].reshape(mask.shape)


class CollectiveModel:
    """alpha-beta x exp(learned log-correction), clipped at the wire-time floor; on a cluster outside the correction's
    training support (``ood_reason`` "cluster") alpha-beta alone.

    ``booster`` None is the pure alpha-beta model (every query flagged ``fallback``)."""

    def __init__(self, booster=None, manifest: dict | None = None, fallback_reason: str = ""):
        self.booster = booster
        self.manifest = manifest or {}
        self.fallback_reason = fallback_reason
        sup = self.manifest.get("support", {})
        self._ops = np.array(sorted(_OP_CODE[o] for o in sup.get("ops", [])), dtype=np.int64)
        self._ranges = {k: tuple(sup[k]) for k in ("size_B", "n_gpus", "nodes", "gpus_per_node") if k in sup}
        self._tiers = np.array(sorted({tuple(t) for t in sup.get("tiers", [])}), dtype=np.float64).reshape(-1, 2)
        self._links = np.array(sup.get("links", []), dtype=np.float64).reshape(-1, 6)
        #: in-node topologies of the training clusters (a manifest written before the field: switch fabrics only)
        self._topologies = set(sup.get("topologies", ["switch"]))
        self._op_shift: dict[int, float] = {}
        self._lock = threading.Lock()
        #: id(cluster) -> (cluster, {(op, n_gpus, gpus_per_node, size): (us, ood)}); the cluster is held so
        #: that its id cannot be reused while its entries live
        self._memo: dict[int, tuple[Any, dict]] = {}
        if booster is not None and list(booster.feature_name()) != list(FEATURES):
            raise ValueError("the correction model's features differ from this wattcast's FEATURES")

    @property
    def is_fallback(self) -> bool:
        return self.booster is None

    def _ood(self, q: CollectiveQuery, ab: AlphaBeta) -> np.ndarray:
        m = np.zeros(len(q.S), dtype=np.int64)
        if self.booster is None:
            return m | OOD_BITS["fallback"]
        m |= np.where(np.isin(q.codes, self._ops), 0, OOD_BITS["op"])
        for key, col, bit in (("size_B", q.S, "size"), ("n_gpus", q.n, "group"), ("nodes", q.N, "nodes"),
                              ("gpus_per_node", q.g, "gpus_per_node")):
            if key in self._ranges:
                lo, hi = self._ranges[key]
                if key == "size_B":
                    lo, hi = lo / (1 + SUPPORT_SLACK), hi * (1 + SUPPORT_SLACK)
                m |= np.where((col < lo) | (col > hi), OOD_BITS[bit], 0)
        if len(self._tiers):
            t = np.stack([(q.g > 1).astype(float), (q.N > 1).astype(float)], axis=1)
            seen = (t[:, None, :] == self._tiers[None, :, :]).all(axis=2).any(axis=1)
            m |= np.where(seen, 0, OOD_BITS["tiers"])
        if len(self._links):
            m |= np.where(self._cluster_seen(q), 0, OOD_BITS["cluster"])
        m = np.where(q.n <= 1, 0, m)
        return m

    def _cluster_seen(self, q: CollectiveQuery) -> np.ndarray:
        """Per query: some training cluster matches this one (within ``SUPPORT_SLACK``) on every link the query
        crosses (the in-node tier when g > 1, with its topology; the inter-node tier when N > 1)."""
        v = np.array(q.lp.link_vector())
        close = np.abs(self._links - v) / np.maximum(np.abs(self._links), 1e-9) <= SUPPORT_SLACK  # (clusters, 6)
        intra_used, inter_used = q.g > 1, q.N > 1
        intra_ok = close[:, INTRA_LINK_COLUMNS].all(axis=1)  # (clusters,)
        inter_ok = close[:, INTER_LINK_COLUMNS].all(axis=1)
        ok = ((~intra_used[:, None] | intra_ok[None, :]) & (~inter_used[:, None] | inter_ok[None, :])).any(axis=1)
        return ok & (~intra_used | (q.lp.topology in self._topologies))

    def predict(self, op, size_bytes, n_gpus, gpus_per_node, cluster, concurrent_per_node=None) -> CollectivePrediction:
        """``concurrent_per_node``: GPUs of a node driving inter-node traffic at once with these collectives (the
        group's members per node and the other groups' beside it; None: the group alone, as nccl-tests runs it)."""
        q = collective_query(op, size_bytes, n_gpus, gpus_per_node, cluster, concurrent_per_node)
        ab = alpha_beta(q, "auto")
        corr = np.zeros(len(q.S))
        mask = self._ood(q, ab)
        if self.booster is not None and len(q.S):
            # the learned correction only on the fabrics it was fitted on: on a cluster outside its support it made
            # things worse than alpha-beta alone (an H100 site it never saw, 7,721 nccl-tests rows: 41.8% vs 12.7%
            # MAPE; A100 NVSwitch all-reduces 1.7x too slow against Megatron's SC21 and vTrain's multi-node TP8 runs)
            known = np.isin(q.codes, self._ops) & (q.n > 1) & ((mask & OOD_BITS["cluster"]) == 0)
            if known.any():
                X = correction_features(ab)[known]
                with self._lock:  # LightGBM boosters are not documented as thread-safe for predict
                    corr[known] = self.booster.predict(np.ascontiguousarray(X), num_threads=1)
        us = np.maximum(ab.us * np.exp(corr), ab.floor_us)
        shape = q.shape  # type: ignore[attr-defined]
        return CollectivePrediction(us.reshape(shape), ab.us.reshape(shape), ab.floor_us.reshape(shape),
                                    (mask != 0).reshape(shape), mask.reshape(shape))

    def predict_us(self, op, size_bytes, n_gpus, gpus_per_node, cluster, return_ood: bool = False,
                   concurrent_per_node=None):
        """Predicted time (us), as an array shaped like the broadcast inputs; with ``return_ood`` also the
        bool out-of-support array. ``concurrent_per_node``: :meth:`predict`."""
        p = self.predict(op, size_bytes, n_gpus, gpus_per_node, cluster, concurrent_per_node)
        return (p.us, p.ood) if return_ood else p.us

    def predict_us_memo(self, op: str, size_bytes, n_gpus: int, gpus_per_node: int, cluster,
                        concurrent_per_node: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(us, ood) of one collective ``op`` over one group placement (``concurrent_per_node``: :meth:`predict`) for
        an array of message sizes, remembered per distinct (op, group, concurrency, size, cluster): search loops ask
        for the same messages again and again, and one LightGBM call costs about a millisecond however few rows it
        has."""
        entry = self._memo.get(id(cluster))
        if entry is None or entry[0] is not cluster:
            if len(self._memo) >= 32:
                self._memo.clear()
            entry = self._memo[id(cluster)] = (cluster, {})
        memo = entry[1]
        if len(memo) > 200_000:
            memo.clear()
        conc = None if concurrent_per_node is None else int(concurrent_per_node)
        keys = [(op, int(n_gpus), int(gpus_per_node), conc, s)
                for s in np.asarray(size_bytes, dtype=float).ravel().tolist()]
        miss = [k for k in dict.fromkeys(keys) if k not in memo]
        if miss:
            u, f = self.predict_us(op, np.array([k[4] for k in miss]), n_gpus, gpus_per_node, cluster, return_ood=True,
                                   concurrent_per_node=conc)
            for k, a, b in zip(miss, np.ravel(u).tolist(), np.ravel(f).tolist()):
                memo[k] = (a, b)
        vals = [memo[k] for k in keys]
        return (np.fromiter((v[0] for v in vals), dtype=float, count=len(vals)),
                np.fromiter((v[1] for v in vals), dtype=bool, count=len(vals)))

    # ---------------------------------------------------------------------------------- disk
    def save(self, folder: str | Path) -> tuple[Path, Path]:
        """Write ``collective_correction.txt`` and ``collective_manifest.json`` into ``folder`` (each file
        written to a temporary name first, then renamed; the model before the manifest that names it)."""
        import os

        if self.booster is None:
            raise ValueError("a fallback (alpha-beta only) model has nothing to save")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        mpath, jpath = folder / MODEL_FILE, folder / MANIFEST
        tmp_m, tmp_j = folder / f".{MODEL_FILE}.tmp", folder / f".{MANIFEST}.tmp"
        self.booster.save_model(str(tmp_m))
        from wattcast.models.manifest import sha256_file

        self.manifest.update(schema=MANIFEST_SCHEMA, model_file=MODEL_FILE, features=list(FEATURES),
                             model_sha256=sha256_file(tmp_m))
        tmp_j.write_text(json.dumps(self.manifest, indent=1, sort_keys=True, default=_json_default))
        os.replace(tmp_m, mpath)
        os.replace(tmp_j, jpath)
        return mpath, jpath

    @classmethod
    def load(cls, folder: str | Path) -> "CollectiveModel":
        """Load from ``folder`` (its live version when it has a ``COLLECTIVE_CURRENT`` pointer, else the flat
        files); raises FileNotFoundError / ValueError when it is absent or unusable."""
        import lightgbm as lgb

        from wattcast.models.manifest import check_model_file, read_manifest

        folder = resolve_collective_folder(folder)
        jpath = folder / MANIFEST
        manifest = read_manifest(folder, MANIFEST, "collective model", MANIFEST_SCHEMA)
        if list(manifest.get("features", [])) != list(FEATURES):
            raise ValueError(f"{jpath}: features differ from this wattcast's")
        mpath = folder / manifest.get("model_file", MODEL_FILE)
        if not mpath.is_file():
            raise FileNotFoundError(f"{jpath} names {mpath.name}, which is missing")
        check_model_file(mpath, manifest.get("model_sha256"), what="collective model")  # before LightGBM parses it
        booster = lgb.Booster(model_file=str(mpath))  # LightGBM text: no pickle
        return cls(booster, manifest)


def _layout():
    from wattcast.models.versioned import Layout

    return Layout(pointer=POINTER, versions=VERSIONS, what="collective model", refused=REFUSED)


def resolve_collective_folder(folder: str | Path) -> Path:
    """The folder holding the live collective model: ``folder/collective_versions/<COLLECTIVE_CURRENT>`` when
    ``folder`` has the pointer, else ``folder`` (flat layout). ValueError naming the pointer when it is broken."""
    from wattcast.models.versioned import resolve_live

    return resolve_live(folder, _layout())


#: probe rows on which an installed model must predict exactly what the model in memory predicts
_PROBE_ROWS = 64


def install_collective_model(model: "CollectiveModel", target: str | Path, activate: bool = True) -> Path:
    """Write ``model`` as a new version under ``target/collective_versions/``, load it back there (hash checked) and
    check it predicts what ``model`` predicts on probe rows, then make it live with one atomic rename of
    ``target/COLLECTIVE_CURRENT`` (models/versioned.py). A kill at any moment leaves the previous model live.
    Returns the new version's folder. ``activate=False``: written and checked the same way in
    ``target/collective_refused/<name>/`` (the newest three kept), the pointer and versions unchanged (a model the
    gate did not accept)."""
    from wattcast.models.versioned import install_version

    if model.booster is None:
        raise ValueError("a fallback (alpha-beta only) model has nothing to install")
    rng = np.random.default_rng(0)
    probe = rng.uniform(0.0, 1.0, (_PROBE_ROWS, len(FEATURES))) * np.array(
        [len(COLLECTIVES) - 1, 34, 30, 10, 64, 8, 2, 1, len(ALGORITHMS) - 1, 1, 1, 900, 100, 10, 10, 1, 1, 4, 1])
    probe[:, 0] = np.floor(probe[:, 0])
    want = model.booster.predict(probe, num_threads=1)

    def check(folder: Path) -> None:
        got = CollectiveModel.load(folder).booster.predict(probe, num_threads=1)
        if not np.allclose(got, want, rtol=0, atol=1e-12):
            raise ValueError(f"the collective model written to {folder} does not predict what was trained "
                             f"(max difference {float(np.max(np.abs(got - want))):.3g})")

    final = install_version(target, _layout(), model.save, check, activate=activate)
    load_collective_model.cache_clear()
    return final


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def shipped_folder() -> Path:
    return Path(str(files("wattcast.models") / "artifacts"))


def load_collective_model(folder: str | None = None) -> CollectiveModel:
    """The shipped model (``models/artifacts/collective_*``) or the one in ``folder`` (without one: the running entry
    point's ``collectives=`` / ``--collectives``, else ``$WATTCAST_COLLECTIVES``; models/selection.py) (its live version when it holds
    retrained versions, else its flat files); cached per live version, so a model switched in by a retraining is
    picked up. Without a loadable artifact: pure alpha-beta, every prediction flagged ``ood`` (reason ``fallback``)."""
    if not folder:
        from wattcast.models.selection import active_folder

        folder = active_folder("collectives")  # a user's folder, checked: never the alpha-beta fallback
    where = Path(folder) if folder else shipped_folder()
    try:
        live = resolve_collective_folder(where)
    except (OSError, ValueError) as e:
        return CollectiveModel(None, {}, fallback_reason=f"alpha-beta only: {e}")
    return _load_collective_live(str(live))


@lru_cache(maxsize=8)
def _load_collective_live(live: str) -> CollectiveModel:
    try:
        return CollectiveModel.load(live)
    except (OSError, ValueError) as e:
        return CollectiveModel(None, {}, fallback_reason=f"alpha-beta only: {e}")
    except Exception as e:  # a corrupt LightGBM file raises LightGBMError
        return CollectiveModel(None, {}, fallback_reason=f"alpha-beta only: cannot read the model ({e})")


load_collective_model.cache_clear = _load_collective_live.cache_clear  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------ band
#: the per-kernel 90% band of a predicted collective (``training/collective_band.py`` builds it from held-out
#: nccl-tests rows; the shipped model's recipe, whichever collective model a run selects)
COLLECTIVE_BAND_FILE = shipped_folder() / "collective_band.json"


@lru_cache(maxsize=4)
def collective_band_log(path: str = str(COLLECTIVE_BAND_FILE)) -> tuple[tuple[float, float], tuple[float, float]]:
    """((low, high) in support, (low, high) out of support): log(measured / predicted) bands of one collective as the
    model flags it (``ood``), from ``path`` (checked: finite, low <= 0 <= high); a ValueError names a bad file."""
    try:
        art = json.loads(Path(path).read_text(encoding="utf-8"))
        bands = tuple(tuple(float(v) for v in art[part]["band_log"]) for part in ("in_support", "out_of_support"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: no readable collective band ({e}); rebuild it with "
                         "python -m wattcast.training.collective_band") from None
    for lo_hi in bands:
        if len(lo_hi) != 2 or not all(np.isfinite(lo_hi)) or not lo_hi[0] <= 0.0 <= lo_hi[1]:
            raise ValueError(f"{path}: a band_log must be [low <= 0 <= high], finite; got {list(lo_hi)}")
    return bands  # type: ignore[return-value]
