"""Cluster topology spec (schema version 1): GPUs in nodes, a link tier within a node and one across.

Units live in field names: ``_gb_per_s`` is gigabytes (1e9 B) per second in one direction,
``_gbit_per_s`` gigabits per second (how NICs are sold), ``_us`` microseconds. Every figure cites a
source (spec-wide ``source`` or per-field ``sources``).

- ``intra`` (within a node): ``kind`` nvswitch | nvlink | xgmi | pcie; ``bandwidth_gb_per_s``: what one
  GPU can send to its peers at once (NVLink3 on an NVSwitch: 300 GB/s per direction); ``latency_us``.
- ``inter`` (across nodes): ``kind`` infiniband | roce | ethernet | slingshot; ``nics_per_node``,
  ``nic_bandwidth_gbit_per_s`` (per NIC), ``latency_us``, ``rail_optimized`` (GPU i of every node on NIC
  rail i: a collective among same-rank GPUs crosses one switch), ``oversubscription`` (>= 1: fabric
  bisection is this many times smaller than the NICs' total).

Shipped presets live in ``data/clusters/*.yaml``; ``--cluster NAME|FILE`` resolves either. ASTRA-sim's
analytical network YAML (``topology``/``npus_count``/``bandwidth`` GB/s/``latency`` ns lists) imports too.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import yaml

from wattcast.data.device_spec import SpecRecord

SCHEMA_VERSION = 1
INTRA_KINDS = ("nvswitch", "nvlink", "xgmi", "pcie")
INTER_KINDS = ("infiniband", "roce", "ethernet", "slingshot")
_PRESETS = Path(__file__).resolve().parent / "clusters"


class ClusterSpecError(ValueError):
    """A cluster spec is missing a field, has an impossible value, or contradicts itself."""


@dataclass(frozen=True)
class IntraNode:
    kind: str
    bandwidth_gb_per_s: float
    latency_us: float


@dataclass(frozen=True)
class InterNode:
    kind: str
    nics_per_node: int
    nic_bandwidth_gbit_per_s: float
    latency_us: float
    rail_optimized: bool = True
    oversubscription: float = 1.0


@dataclass(frozen=True)
class ClusterSpec(SpecRecord):
    name: str
    device: str
    gpus_per_node: int
    intra: IntraNode
    inter: InterNode | None = None
    max_nodes: int | None = None
    aliases: tuple[str, ...] = ()
    source: str = ""
    sources: Mapping[str, str] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    # ------------------------------------------------------------------ derived
    @property
    def inter_bandwidth_per_gpu_gb_per_s(self) -> float:
        """Cross-node bandwidth one GPU gets when every GPU of the node sends at once (GB/s, one way)."""
        if self.inter is None:
            return 0.0
        total = self.inter.nics_per_node * self.inter.nic_bandwidth_gbit_per_s / 8.0
        return total / self.gpus_per_node / self.inter.oversubscription

    @property
    def inter_bandwidth_per_node_gb_per_s(self) -> float:
        if self.inter is None:
            return 0.0
        return self.inter.nics_per_node * self.inter.nic_bandwidth_gbit_per_s / 8.0 / self.inter.oversubscription


def _positive(where: str, name: str, v: Any, *, integer: bool = False, allow_zero: bool = False) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ClusterSpecError(f"{where}: field '{name}' must be a number, got {v!r}")
    if v < 0 or (v == 0 and not allow_zero):
        raise ClusterSpecError(f"{where}: field '{name}' must be positive, got {v!r}")
    if integer and int(v) != v:
        raise ClusterSpecError(f"{where}: field '{name}' must be a whole number, got {v!r}")


def validate_cluster(c: ClusterSpec) -> ClusterSpec:
    where = f"cluster {c.name!r}" if c.name else "cluster spec"
    if not c.name:
        raise ClusterSpecError("cluster spec: required field 'name' is missing")
    if not c.device:
        raise ClusterSpecError(f"{where}: required field 'device' is missing")
    _positive(where, "gpus_per_node", c.gpus_per_node, integer=True)
    if c.intra.kind not in INTRA_KINDS:
        raise ClusterSpecError(f"{where}: field 'intra.kind' must be one of {', '.join(INTRA_KINDS)}, got {c.intra.kind!r}")
    _positive(where, "intra.bandwidth_gb_per_s", c.intra.bandwidth_gb_per_s)
    _positive(where, "intra.latency_us", c.intra.latency_us, allow_zero=True)
    if c.inter is not None:
        if c.inter.kind not in INTER_KINDS:
            raise ClusterSpecError(f"{where}: field 'inter.kind' must be one of {', '.join(INTER_KINDS)}, got {c.inter.kind!r}")
        _positive(where, "inter.nics_per_node", c.inter.nics_per_node, integer=True)
        _positive(where, "inter.nic_bandwidth_gbit_per_s", c.inter.nic_bandwidth_gbit_per_s)
        _positive(where, "inter.latency_us", c.inter.latency_us, allow_zero=True)
        _positive(where, "inter.oversubscription", c.inter.oversubscription)
        if c.inter.oversubscription < 1:
            raise ClusterSpecError(f"{where}: field 'inter.oversubscription' must be >= 1 (1 = full bisection), got {c.inter.oversubscription}")
        if c.inter_bandwidth_per_gpu_gb_per_s > c.intra.bandwidth_gb_per_s * 1.001 and c.gpus_per_node > 1:
            raise ClusterSpecError(
                f"{where}: cross-node bandwidth per GPU ({c.inter_bandwidth_per_gpu_gb_per_s:.1f} GB/s) exceeds the "
                f"in-node bandwidth ({c.intra.bandwidth_gb_per_s} GB/s); check units (NICs are in Gbit/s)")
    if c.max_nodes is not None:
        _positive(where, "max_nodes", c.max_nodes, integer=True)
        if c.max_nodes > 1 and c.inter is None:
            raise ClusterSpecError(f"{where}: max_nodes is {c.max_nodes} but there is no 'inter' (cross-node) tier")
    for f in ("intra.bandwidth_gb_per_s", "intra.latency_us") + (("inter.nic_bandwidth_gbit_per_s", "inter.latency_us") if c.inter else ()):
        if not c.source_of(f):
            raise ClusterSpecError(f"{where}: field '{f}' has no source; give 'source' or 'sources.{f}'")
    if c.schema_version != SCHEMA_VERSION:
        raise ClusterSpecError(f"{where}: field 'schema_version' is {c.schema_version}, this wattcast reads {SCHEMA_VERSION}")
    return c


_TOP = {f.name for f in dataclasses.fields(ClusterSpec)}
_INTRA = {f.name for f in dataclasses.fields(IntraNode)}
_INTER = {f.name for f in dataclasses.fields(InterNode)}


def cluster_from_dict(d: Mapping[str, Any]) -> ClusterSpec:
    if not isinstance(d, Mapping):
        raise ClusterSpecError("cluster spec must be a mapping")
    if "topology" in d and "npus_count" in d:
        return from_astra_network(d)
    name = d.get("name", "?")
    for keys, known, what in ((set(d), _TOP, ""), (set(d.get("intra") or {}), _INTRA, "intra."),
                              (set(d.get("inter") or {}), _INTER, "inter.")):
        unknown = sorted(keys - known)
        if unknown:
            raise ClusterSpecError(f"cluster {name!r}: unknown field(s) {', '.join(what + u for u in unknown)}; "
                                   f"known: {', '.join(sorted(what + k for k in known))}")
    if not d.get("intra"):
        raise ClusterSpecError(f"cluster {name!r}: required field 'intra' is missing")
    try:
        intra = IntraNode(**d["intra"])
        inter = InterNode(**d["inter"]) if d.get("inter") else None
    except TypeError as e:
        raise ClusterSpecError(f"cluster {name!r}: {e}") from None
    kw = {k: v for k, v in d.items() if k not in ("intra", "inter")}
    kw["aliases"] = tuple(kw.get("aliases") or ())
    kw["sources"] = dict(kw.get("sources") or {})
    for req in ("name", "device", "gpus_per_node"):
        if kw.get(req) in (None, ""):
            raise ClusterSpecError(f"cluster {name!r}: required field '{req}' is missing")
    return validate_cluster(ClusterSpec(intra=intra, inter=inter, **kw))


def from_astra_network(d: Mapping[str, Any], *, device: str | None = None, name: str = "astra-sim network") -> ClusterSpec:
    """ASTRA-sim analytical network config: ``topology``, ``npus_count``, ``bandwidth`` (GB/s per NPU per
    dimension), ``latency`` (ns). Dimension 0 is the node; the product of the others is the node count.
    The device is not part of ASTRA-sim's file: pass it (or add a ``device`` key)."""
    try:
        topo = [str(t) for t in d["topology"]]
        npus = [int(x) for x in d["npus_count"]]
        bw = [float(x) for x in d["bandwidth"]]
        lat = [float(x) for x in d["latency"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ClusterSpecError(f"ASTRA-sim network: need topology, npus_count, bandwidth, latency lists ({e})") from None
    if not (len(topo) == len(npus) == len(bw) == len(lat)) or not topo:
        raise ClusterSpecError("ASTRA-sim network: topology, npus_count, bandwidth and latency must have the same length")
    dev = device or d.get("device")
    if not dev:
        raise ClusterSpecError("ASTRA-sim network: the file names no GPU; add 'device: NAME' or pass --device")
    src = "ASTRA-sim analytical network config"
    intra = IntraNode(kind="nvswitch" if topo[0].lower() in ("switch", "fullyconnected") else "nvlink",
                      bandwidth_gb_per_s=bw[0], latency_us=lat[0] / 1e3)
    inter = None
    nodes = int(math.prod(npus[1:])) if len(npus) > 1 else 1
    if len(npus) > 1:
        # the slowest outer dimension bounds cross-node traffic; one NIC per GPU at that rate
        j = 1 + min(range(len(bw) - 1), key=lambda i: bw[1 + i])
        inter = InterNode(kind="infiniband", nics_per_node=npus[0], nic_bandwidth_gbit_per_s=bw[j] * 8.0,
                          latency_us=lat[j] / 1e3, rail_optimized=True, oversubscription=1.0)
    return validate_cluster(ClusterSpec(name=str(d.get("name", name)), device=str(dev), gpus_per_node=npus[0], intra=intra,
                                        inter=inter, max_nodes=nodes, source=src))


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


@lru_cache(maxsize=1)
def _presets() -> dict[str, ClusterSpec]:
    out = {}
    for f in sorted(_PRESETS.glob("*.yaml")):
        c = cluster_from_dict(yaml.safe_load(f.read_text()))
        for n in (c.name, *c.aliases, f.stem):
            out[_key(n)] = c
    return out


def list_clusters() -> list[ClusterSpec]:
    seen, out = set(), []
    for c in _presets().values():
        if c.name not in seen:
            seen.add(c.name)
            out.append(c)
    return sorted(out, key=lambda c: c.name)


def load_cluster_file(path: str | Path) -> ClusterSpec:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ClusterSpecError(f"{p}: cannot read cluster file: {e}") from None
    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ClusterSpecError(f"{p}: not valid YAML/JSON: {e}") from None
    return cluster_from_dict(d)


def resolve_cluster(name_or_path: str | Path | ClusterSpec) -> ClusterSpec:
    """A preset name (case-insensitive) or a cluster file (own schema or ASTRA-sim network YAML)."""
    if isinstance(name_or_path, ClusterSpec):
        return name_or_path
    s = str(name_or_path)
    p = Path(s)
    if p.suffix.lower() in (".yaml", ".yml", ".json") or p.is_file():
        if not p.is_file():
            raise ClusterSpecError(f"cluster file {p} does not exist")
        return load_cluster_file(p)
    c = _presets().get(_key(s))
    if c is None:
        import difflib

        names = sorted({c.name for c in _presets().values()})
        near = difflib.get_close_matches(s.lower(), [n.lower() for n in names], n=3, cutoff=0.3)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise ClusterSpecError(f"unknown cluster {s!r}{hint} (presets: {', '.join(names)}; or pass a YAML file)")
    return c
