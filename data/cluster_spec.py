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

from wattcast.data.checks import did_you_mean, exotic_allowed, implausible
from wattcast.data.device_spec import SpecRecord

SCHEMA_VERSION = 1
INTRA_KINDS = ("nvswitch", "nvlink", "xgmi", "pcie")
INTER_KINDS = ("infiniband", "roce", "ethernet", "slingshot")
_PRESETS = Path(__file__).resolve().parent / "clusters"


#: field -> (lowest, highest plausible value, what a too-small figure probably is, what a too-large one is, the unit).
#: Wide of every real system: PCIe 3 x4 (4 GB/s) to NVLink 5 (900 GB/s per direction); 1 GbE to 1.6 Tb/s NICs;
#: 1-72 GPUs per node (NVL72); latencies of a few microseconds. Outside them a figure is almost surely in another unit.
PLAUSIBLE: dict[str, tuple[float, float, str, str, str]] = {
    "gpus_per_node": (1, 1024, "-", "the GPUs of the whole cluster, not of one node", "GPUs per node"),
    "intra.bandwidth_gb_per_s": (0.5, 20_000.0, "TB/s", "B/s, KB/s or MB/s (or Gbit/s x 1,000)", "GB/s per direction"),
    "intra.latency_us": (0.0, 1_000.0, "-", "nanoseconds", "microseconds"),
    "inter.nics_per_node": (1, 256, "-", "the NICs of the whole cluster, not of one node", "NICs per node"),
    "inter.nic_bandwidth_gbit_per_s": (0.1, 20_000.0, "Tbit/s", "bit/s, kbit/s or Mbit/s", "Gbit/s per NIC"),
    "inter.latency_us": (0.0, 10_000.0, "-", "nanoseconds", "microseconds"),
    "inter.oversubscription": (1.0, 128.0, "-", "a percent or a port count, not a ratio", "a ratio >= 1"),
    "cloud_usd_per_gpu_hour": (0.01, 500.0, "-", "cents, or the price of a whole node or month", "USD per GPU-hour"),
}


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
    #: optional: what this cluster costs per GPU-hour in the cloud (USD); wins over the device price table for a
    #: run on it (the output names this spec as the source; cite it in ``sources.cloud_usd_per_gpu_hour``)
    cloud_usd_per_gpu_hour: float | None = None
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
        raise ClusterSpecError(f"{where}: field '{name}' must be a number, got {v!r}{_yaml_number_hint(v)}")
    if v < 0 or (v == 0 and not allow_zero):
        raise ClusterSpecError(f"{where}: field '{name}' must be positive, got {v!r}")
    if integer and int(v) != v:
        raise ClusterSpecError(f"{where}: field '{name}' must be a whole number, got {v!r}")


def _yaml_number_hint(v: Any) -> str:
    """YAML 1.1 (PyYAML) reads 9e11 (no dot) as text: say how to write the number."""
    if isinstance(v, str):
        try:
            x = float(v)
        except ValueError:
            return ""
        if math.isfinite(x):
            return f" (text: YAML reads an exponent without a dot as a string; write {x:.1e})"
    return ""


def _text(where: str, name: str, v: Any, *, required: bool = True) -> None:
    """A name-like field: a non-empty string (a YAML number, list or mapping is not a name)."""
    if v is None or v == "":
        if required:
            raise ClusterSpecError(f"{where}: required field '{name}' is missing")
        return
    if not isinstance(v, str):
        raise ClusterSpecError(f"{where}: field '{name}' must be a string, got {v!r} ({type(v).__name__}); quote it in YAML")


def validate_cluster(c: ClusterSpec) -> ClusterSpec:
    where = f"cluster {c.name!r}" if c.name else "cluster spec"
    if not c.name:
        raise ClusterSpecError("cluster spec: required field 'name' is missing")
    _text(where, "name", c.name)
    _text(where, "device", c.device)
    _positive(where, "gpus_per_node", c.gpus_per_node, integer=True)
    if not isinstance(c.intra, IntraNode):
        raise ClusterSpecError(f"{where}: field 'intra' must be a mapping of {', '.join(sorted(_INTRA))}, got {c.intra!r}")
    if c.inter is not None and not isinstance(c.inter, InterNode):
        raise ClusterSpecError(f"{where}: field 'inter' must be a mapping of {', '.join(sorted(_INTER))}, got {c.inter!r}")
    if not isinstance(c.intra.kind, str) or c.intra.kind not in INTRA_KINDS:
        raise ClusterSpecError(f"{where}: field 'intra.kind' must be one of {', '.join(INTRA_KINDS)}, got {c.intra.kind!r}")
    _positive(where, "intra.bandwidth_gb_per_s", c.intra.bandwidth_gb_per_s)
    _positive(where, "intra.latency_us", c.intra.latency_us, allow_zero=True)
    if c.inter is not None:
        if not isinstance(c.inter.kind, str) or c.inter.kind not in INTER_KINDS:
            raise ClusterSpecError(f"{where}: field 'inter.kind' must be one of {', '.join(INTER_KINDS)}, got {c.inter.kind!r}")
        _positive(where, "inter.nics_per_node", c.inter.nics_per_node, integer=True)
        _positive(where, "inter.nic_bandwidth_gbit_per_s", c.inter.nic_bandwidth_gbit_per_s)
        _positive(where, "inter.latency_us", c.inter.latency_us, allow_zero=True)
        _positive(where, "inter.oversubscription", c.inter.oversubscription)
        if not isinstance(c.inter.rail_optimized, bool):
            raise ClusterSpecError(f"{where}: field 'inter.rail_optimized' must be true or false, got {c.inter.rail_optimized!r}")
        if c.inter.oversubscription < 1:
            raise ClusterSpecError(f"{where}: field 'inter.oversubscription' must be >= 1 (1 = full bisection), got {c.inter.oversubscription}")
    # figures 1,000x off (a unit mix-up) are refused unless --force (allow_exotic); checked before the consistency
    # rule below, which would misname them
    for name, v in (("gpus_per_node", c.gpus_per_node), ("intra.bandwidth_gb_per_s", c.intra.bandwidth_gb_per_s),
                    ("intra.latency_us", c.intra.latency_us)) + ((
                        ("inter.nics_per_node", c.inter.nics_per_node),
                        ("inter.nic_bandwidth_gbit_per_s", c.inter.nic_bandwidth_gbit_per_s),
                        ("inter.latency_us", c.inter.latency_us),
                        ("inter.oversubscription", c.inter.oversubscription)) if c.inter is not None else ()):
        msg = implausible(f"field '{name}'", v, *PLAUSIBLE[name])
        if msg:
            raise ClusterSpecError(f"{where}: {msg}")
    if c.inter is not None and c.inter_bandwidth_per_gpu_gb_per_s > c.intra.bandwidth_gb_per_s * 1.001 \
            and c.gpus_per_node > 1 and not exotic_allowed():  # a units check too: --force lets it through
        raise ClusterSpecError(
            f"{where}: cross-node bandwidth per GPU ({c.inter_bandwidth_per_gpu_gb_per_s:.1f} GB/s) exceeds the "
            f"in-node bandwidth ({c.intra.bandwidth_gb_per_s} GB/s); check units (NICs are in Gbit/s), or pass --force "
            "for a system that is really built so")
    if c.max_nodes is not None:
        _positive(where, "max_nodes", c.max_nodes, integer=True)
        if c.max_nodes > 1 and c.inter is None:
            raise ClusterSpecError(f"{where}: max_nodes is {c.max_nodes} but there is no 'inter' (cross-node) tier")
    if c.cloud_usd_per_gpu_hour is not None:
        _positive(where, "cloud_usd_per_gpu_hour", c.cloud_usd_per_gpu_hour)
        msg = implausible("field 'cloud_usd_per_gpu_hour'", c.cloud_usd_per_gpu_hour, *PLAUSIBLE["cloud_usd_per_gpu_hour"])
        if msg:
            raise ClusterSpecError(f"{where}: {msg}")
    if not isinstance(c.aliases, tuple) or not all(isinstance(a, str) and a for a in c.aliases):
        raise ClusterSpecError(f"{where}: field 'aliases' must be a list of names, got {c.aliases!r}")
    _text(where, "source", c.source, required=False)
    if not isinstance(c.sources, Mapping):
        raise ClusterSpecError(f"{where}: field 'sources' must be a mapping of field name to source, got {c.sources!r}")
    for k, v in c.sources.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ClusterSpecError(f"{where}: field 'sources' must map field names to source strings, got {k!r}: {v!r}")
    for f in ("intra.bandwidth_gb_per_s", "intra.latency_us") + (("inter.nic_bandwidth_gbit_per_s", "inter.latency_us") if c.inter else ()):
        if not c.source_of(f):
            raise ClusterSpecError(f"{where}: field '{f}' has no source; give 'source' or 'sources.{f}'")
    if isinstance(c.schema_version, bool) or c.schema_version != SCHEMA_VERSION:
        raise ClusterSpecError(f"{where}: field 'schema_version' is {c.schema_version!r}, this wattcast reads {SCHEMA_VERSION}")
    # whole numbers given as 8.0 are kept as ints (GPU and NIC counts index and divide)
    c = dataclasses.replace(c, gpus_per_node=int(c.gpus_per_node), max_nodes=None if c.max_nodes is None else int(c.max_nodes))
    if c.inter is not None and not isinstance(c.inter.nics_per_node, int):
        c = dataclasses.replace(c, inter=dataclasses.replace(c.inter, nics_per_node=int(c.inter.nics_per_node)))
    return c


_TOP = {f.name for f in dataclasses.fields(ClusterSpec)}
_INTRA = {f.name for f in dataclasses.fields(IntraNode)}
_INTER = {f.name for f in dataclasses.fields(InterNode)}


def _section(name: str, what: str, v: Any, known: set[str], required: tuple[str, ...]) -> dict[str, Any]:
    """The ``intra``/``inter`` mapping: a mapping with only known fields and every required one."""
    where = f"cluster {name!r}"
    if not isinstance(v, Mapping):
        raise ClusterSpecError(f"{where}: field '{what}' must be a mapping (kind: ..., {required[1]}: ...), "
                               f"got {v!r} ({type(v).__name__})")
    unknown = sorted((k for k in v if k not in known), key=str)
    if unknown:
        raise ClusterSpecError(f"{where}: unknown field(s) {', '.join(f'{what}.{u}' for u in unknown)}; "
                               f"known: {', '.join(sorted(f'{what}.{k}' for k in known))}")
    missing = [k for k in required if v.get(k) is None]
    if missing:
        raise ClusterSpecError(f"{where}: required field(s) {', '.join(f'{what}.{k}' for k in missing)} missing")
    return dict(v)


def cluster_from_dict(d: Mapping[str, Any], *, device: str | None = None) -> ClusterSpec:
    """A cluster from its dict (own schema, or ASTRA-sim's analytical network config). ``device`` names the GPU
    when the dict has none (an ASTRA-sim file names none); given, it overrides the dict's own."""
    if not isinstance(d, Mapping):
        raise ClusterSpecError(f"cluster spec must be a mapping of fields, got {type(d).__name__}")
    if device is not None:
        _text("cluster spec", "device", device)
    if "topology" in d and "npus_count" in d:
        return from_astra_network(d, device=device)
    name = d.get("name", "?")
    unknown = sorted((k for k in d if k not in _TOP), key=str)
    if unknown:
        raise ClusterSpecError(f"cluster {name!r}: unknown field(s) {', '.join(map(str, unknown))}; "
                               f"known: {', '.join(sorted(_TOP))}")
    if d.get("intra") is None:
        raise ClusterSpecError(f"cluster {name!r}: required field 'intra' is missing")
    intra = IntraNode(**_section(name, "intra", d["intra"], _INTRA, ("kind", "bandwidth_gb_per_s", "latency_us")))
    inter = None
    if d.get("inter") is not None:
        inter = InterNode(**_section(name, "inter", d["inter"], _INTER,
                                     ("kind", "nics_per_node", "nic_bandwidth_gbit_per_s", "latency_us")))
    kw = {k: v for k, v in d.items() if k not in ("intra", "inter")}
    if device is not None:
        kw["device"] = device
    for req in ("name", "device", "gpus_per_node"):
        if kw.get(req) in (None, ""):
            raise ClusterSpecError(f"cluster {name!r}: required field '{req}' is missing")
    aliases = kw.get("aliases")
    if aliases is None:
        kw["aliases"] = ()
    elif isinstance(aliases, (list, tuple)):
        kw["aliases"] = tuple(aliases)
    else:
        raise ClusterSpecError(f"cluster {name!r}: field 'aliases' must be a list of names, got {aliases!r}")
    sources = kw.get("sources")
    if sources is None:
        kw["sources"] = {}
    elif isinstance(sources, Mapping):
        kw["sources"] = dict(sources)
    else:
        raise ClusterSpecError(f"cluster {name!r}: field 'sources' must be a mapping of field name to source, got {sources!r}")
    if kw.get("source") is None:
        kw.pop("source", None)
    return validate_cluster(ClusterSpec(intra=intra, inter=inter, **kw))


def _astra_list(d: Mapping[str, Any], key: str) -> list:
    v = d.get(key)
    if v is None:
        raise ClusterSpecError(f"ASTRA-sim network: required field '{key}' is missing "
                               "(need topology, npus_count, bandwidth, latency lists, one entry per dimension)")
    if not isinstance(v, (list, tuple)):
        raise ClusterSpecError(f"ASTRA-sim network: field '{key}' must be a list (one entry per dimension), got {v!r}")
    return list(v)


def _astra_number(key: str, i: int, v: Any, *, integer: bool = False, allow_zero: bool = False) -> float | int:
    what = f"{key}[{i}]"
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ClusterSpecError(f"ASTRA-sim network: field '{what}' must be a number, got {v!r}")
    if v < 0 or (v == 0 and not allow_zero):
        raise ClusterSpecError(f"ASTRA-sim network: field '{what}' must be positive, got {v!r}")
    if integer:
        if int(v) != v:
            raise ClusterSpecError(f"ASTRA-sim network: field '{what}' must be a whole number of NPUs, got {v!r}")
        return int(v)
    return float(v)


def from_astra_network(d: Mapping[str, Any], *, device: str | None = None, name: str = "astra-sim network") -> ClusterSpec:
    """ASTRA-sim analytical network config: ``topology``, ``npus_count``, ``bandwidth`` (GB/s per NPU per
    dimension), ``latency`` (ns). Dimension 0 is the node; the product of the others is the node count.
    The device is not part of ASTRA-sim's file: pass it (or add a ``device`` key)."""
    if not isinstance(d, Mapping):
        raise ClusterSpecError(f"ASTRA-sim network: the config must be a mapping, got {type(d).__name__}")
    topo = _astra_list(d, "topology")
    for i, t in enumerate(topo):
        if not isinstance(t, str) or not t:
            raise ClusterSpecError(f"ASTRA-sim network: field 'topology[{i}]' must be a topology name (Ring, Switch, "
                                   f"FullyConnected), got {t!r}")
    npus = [_astra_number("npus_count", i, x, integer=True) for i, x in enumerate(_astra_list(d, "npus_count"))]
    bw = [_astra_number("bandwidth", i, x) for i, x in enumerate(_astra_list(d, "bandwidth"))]
    lat = [_astra_number("latency", i, x, allow_zero=True) for i, x in enumerate(_astra_list(d, "latency"))]
    if not (len(topo) == len(npus) == len(bw) == len(lat)) or not topo:
        raise ClusterSpecError("ASTRA-sim network: topology, npus_count, bandwidth and latency must have the same length "
                               f"(one entry per dimension), got {len(topo)}, {len(npus)}, {len(bw)}, {len(lat)}")
    dev = device if device is not None else d.get("device")
    if dev is None or dev == "":
        raise ClusterSpecError("ASTRA-sim network: the file names no GPU; add 'device: NAME' or pass --device")
    _text("ASTRA-sim network", "device", dev)
    cname = d.get("name", name)
    _text("ASTRA-sim network", "name", cname)
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
    return validate_cluster(ClusterSpec(name=cname, device=dev, gpus_per_node=npus[0], intra=intra,
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


def load_cluster_file(path: str | Path, *, device: str | None = None) -> ClusterSpec:
    """A cluster file (own schema or ASTRA-sim network YAML); ``device`` as in :func:`cluster_from_dict`."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ClusterSpecError(f"{p}: cannot read cluster file: {e}") from None
    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ClusterSpecError(f"{p}: not valid YAML/JSON: {e}") from None
    try:
        return cluster_from_dict(d, device=device)
    except ClusterSpecError as e:
        raise ClusterSpecError(f"{p}: {e}") from None


def resolve_cluster(name_or_path: str | Path | ClusterSpec, *, device: str | None = None) -> ClusterSpec:
    """A preset name (case-insensitive) or a cluster file (own schema or ASTRA-sim network YAML).

    ``device`` (a catalog name) replaces the cluster's GPU; an ASTRA-sim file, which names none, needs it
    unless the file has a ``device`` key."""
    if isinstance(name_or_path, ClusterSpec):
        c = name_or_path
    else:
        c = _resolve_cluster(name_or_path, device)
    if device is not None and c.device != device:
        _text(f"cluster {c.name!r}", "device", device)
        c = dataclasses.replace(c, device=device)
    return c


def _resolve_cluster(name_or_path: str | Path, device: str | None) -> ClusterSpec:
    s = str(name_or_path)
    p = Path(s)
    if p.suffix.lower() in (".yaml", ".yml", ".json") or p.is_file():
        if not p.is_file():
            raise ClusterSpecError(f"cluster file {p} does not exist")
        return load_cluster_file(p, device=device)
    c = _presets().get(_key(s))
    if c is None:
        names = sorted({c.name for c in _presets().values()})
        hint = did_you_mean(s.lower(), [n.lower() for n in names], "; did you mean {}?", n=3, cutoff=0.3)
        raise ClusterSpecError(f"unknown cluster {s!r}{hint} (presets: {', '.join(names)}; or pass a YAML file)")
    return c
