"""Cluster topology spec (schema version 1): GPUs in nodes, a link tier within a node and one across.

Units live in field names: ``_gb_per_s`` is gigabytes (1e9 B) per second in one direction,
``_gbit_per_s`` gigabits per second (how NICs are sold), ``_us`` microseconds. Every figure cites a
source (spec-wide ``source`` or per-field ``sources``).

- ``intra`` (within a node): ``kind`` nvswitch | nvlink | xgmi | pcie; ``bandwidth_gb_per_s``: what one
  GPU can send to its peers at once (NVLink3 on an NVSwitch: 300 GB/s per direction); ``latency_us``;
  ``topology`` (optional) switch | full_mesh: how that bandwidth reaches a peer. ``switch``: every GPU has its whole
  bandwidth to any group of peers (an NVSwitch, a PCIe switch). ``full_mesh``: one direct link to each of the node's
  n - 1 other GPUs, each 1/(n-1) of the bandwidth, so a group of g GPUs of the node gets (g-1)/(n-1) of it and one
  point-to-point transfer 1/(n-1) (the links to the group's peers only). Absent: :func:`default_intra_topology`
  (``full_mesh`` for ``xgmi`` on an 8-GPU MI300X/MI325X platform, else ``switch``, the former behaviour).
- ``inter`` (across nodes): ``kind`` infiniband | roce | ethernet | slingshot; ``nics_per_node``,
  ``nic_bandwidth_gbit_per_s`` (per NIC), ``latency_us``, ``rail_optimized`` (GPU i of every node on NIC
  rail i: a collective among same-rank GPUs crosses one switch), ``oversubscription`` (>= 1: fabric
  bisection is this many times smaller than the NICs' total).

Validation is a pydantic v2 model, :class:`ClusterSpecModel` (with :class:`IntraNodeModel`, :class:`InterNodeModel`;
ASTRA-sim files :class:`AstraNetworkModel`), its validators in :mod:`wattcast.data.spec_model`.

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
from typing import Annotated, Any, Mapping

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo, model_validator

from wattcast.data.checks import did_you_mean, exotic_allowed, is_count, yaml_load_unique
from wattcast.data.device_spec import SpecRecord
from wattcast.data.spec_model import (FIELD, first_problem, number, one_of, optional, plausible, problem, required, schema,
                                      text, yaml_number_hint)

SCHEMA_VERSION = 1
INTRA_KINDS = ("nvswitch", "nvlink", "xgmi", "pcie")
#: how the in-node bandwidth reaches a peer (module docstring; models/collectives.py divides by it)
INTRA_TOPOLOGIES = ("switch", "full_mesh")
#: MI300X-class GPUs (CDNA 3: MI300X, MI325X) whose 8-GPU platform is a full xGMI mesh: "AMD Instinct MI300X
#: Platform" data sheet (amd.com): 8 MI300X "fully connected" by Infinity Fabric, 7 links per GPU, 896 GB/s aggregate
#: bidirectional peer-to-peer bandwidth per GPU (= 7 x 128 GB/s: one 64 GB/s-each-way link to each peer); AMD CDNA 3
#: architecture white paper (MI300X OAM on the 8-GPU UBB: a fully connected Infinity Fabric mesh); the MI325X
#: platform is the same UBB board. MI250X nodes (xGMI, not a full mesh) keep the switch default.
_FULL_MESH_XGMI_DEVICE = re.compile(r"(?i)mi3[02]\dx")
INTER_KINDS = ("infiniband", "roce", "ethernet", "slingshot")
_PRESETS = Path(__file__).resolve().parent / "clusters"


#: field -> (lowest, highest plausible value, what a too-small figure probably is, what a too-large one is, the unit).
#: Wide of every real system: PCIe 3 x4 (4 GB/s) to NVLink 5 (900 GB/s per direction); 1 GbE to 1.6 Tb/s NICs (a NIC
#: under 1 Gbit/s is one given in Tbit/s: 0.4 for 400G); 1-72 GPUs per node (NVL72); latencies of a few microseconds
#: (the presets: 3-10 us; NCCL over TCP sockets some tens), so a latency over 100 us is one given in nanoseconds.
#: Outside them a figure is almost surely in another unit.
PLAUSIBLE: dict[str, tuple[float, float, str, str, str]] = {
    "gpus_per_node": (1, 1024, "-", "the GPUs of the whole cluster, not of one node", "GPUs per node"),
    "intra.bandwidth_gb_per_s": (0.5, 20_000.0, "TB/s", "B/s, KB/s or MB/s (or Gbit/s x 1,000)", "GB/s per direction"),
    "intra.latency_us": (0.0, 100.0, "-", "nanoseconds", "microseconds"),
    "inter.nics_per_node": (1, 256, "-", "the NICs of the whole cluster, not of one node", "NICs per node"),
    "inter.nic_bandwidth_gbit_per_s": (1.0, 20_000.0, "Tbit/s", "bit/s, kbit/s or Mbit/s", "Gbit/s per NIC"),
    "inter.latency_us": (0.0, 100.0, "-", "nanoseconds", "microseconds"),
    "inter.oversubscription": (1.0, 128.0, "-", "a percent or a port count, not a ratio", "a ratio >= 1"),
    # the same ceiling as the footprint's --cloud-usd-per-gpu-hour (lifecycle/checks.py PLAUSIBLE: the dearest list
    # price shipped is 12.29 USD/GPU-h; a figure in cents or for a whole node lies above 30)
    "cloud_usd_per_gpu_hour": (0.01, 30.0, "-", "cents, or the price of a whole node or month", "USD per GPU-hour"),
}


#: the most the in-node bandwidth per GPU may exceed the cross-node one (NICs per node x Gbit/s / 8 / GPUs per node /
#: oversubscription): the presets' widest gap is 24x (DGX-1, Polaris); a cluster of 8 NVSwitch GPUs on one 10 GbE NIC
#: is ~2,000x. A NIC given in Tbit/s (0.4 for 400G) is refused by its own range; one above 1 (1.6 for 1.6T) shared by
#: a node's GPUs is caught here, one per GPU by :data:`INTRA_OVER_NIC_MAX`. Lifted by --force.
INTRA_OVER_INTER_MAX = 10_000.0
#: the most the in-node bandwidth per GPU may exceed ONE NIC's rate (Gbit/s / 8), whatever the NIC count: the per-GPU
#: gap above is wide because a node may share one slow NIC among its GPUs, a NIC's own rate has no such excuse. The
#: slowest NICs beside the fastest in-node tiers: 10 GbE (1.25 GB/s) beside NVLink 5's 900 GB/s is 720x, 1 GbE beside
#: V100's NVLink 2 (150 GB/s) 1,200x; the presets' widest is 18x (DGX-B200, GB200-NVL72: 400G beside 900 GB/s). A NIC
#: typed in Tbit/s above the range's 1 Gbit/s floor is 2,250x (1.6 beside NVLink 4's 450 GB/s, 3.2 beside NVLink 5's
#: 900) to 4,500x (1.6 beside 900): refused naming Tbit/s. Lifted by --force.
INTRA_OVER_NIC_MAX = 2_000.0
#: the most ONE NIC's rate (Gbit/s / 8) may exceed a GPU's in-node bandwidth: a GPU's cross-node traffic crosses its own
#: PCIe / NVLink-C2C port, so a NIC much faster than the in-node tier is one whose in-node figure was given in TB/s
#: (NVLink 5's 1.8 TB/s typed as 1.8). The presets' highest is 0.5x (PCIe-4GPU: one 100G NIC, 12.5 GB/s, beside
#: 25 GB/s of PCIe 4); 10x leaves room for a slow PCIe 3 box on a 400G NIC (50 GB/s beside ~12 GB/s: 4x). Lifted by --force.
NIC_OVER_INTRA_MAX = 10.0
#: the most a device spec's ``interconnect_bandwidth_gbps`` (both directions) may exceed the cluster's in-node
#: ``bandwidth_gb_per_s`` (one direction): the presets with their own GPU are at 2x-2.6x (DGX-1: 300 / 150; PCIe-4GPU:
#: 64 / 25), any catalog GPU on any preset at most 72x (a B200, 1800, on PCIe-4GPU's 25 GB/s); an in-node figure given in
#: TB/s (1.8 for NVLink 5) is 1,000x-2,000x. Lifted by --force.
DEVICE_OVER_INTRA_MAX = 100.0


class ClusterSpecError(ValueError):
    """A cluster spec is missing a field, has an impossible value, or contradicts itself."""


@dataclass(frozen=True)
class IntraNode:
    kind: str
    bandwidth_gb_per_s: float
    latency_us: float
    #: switch | full_mesh (module docstring); None: by kind, filled in when the ClusterSpec is built
    topology: str | None = None


def default_intra_topology(kind: str, device: str | None, gpus_per_node: int) -> str:
    """The in-node topology of a cluster whose ``intra`` gives none: ``full_mesh`` where the kind says it unambiguously
    (``xgmi`` on an 8-GPU MI300X/MI325X platform, :data:`_FULL_MESH_XGMI_DEVICE`), else ``switch`` (an ``nvswitch`` is
    one; for ``nvlink``, ``pcie`` and other ``xgmi`` nodes it is the former assumption, every group getting the whole
    per-GPU bandwidth: a file says ``topology: full_mesh`` for a directly linked node, as the NVLink-4GPU and Polaris
    presets do)."""
    if kind == "xgmi" and int(gpus_per_node) == 8 and _FULL_MESH_XGMI_DEVICE.search(str(device or "")):
        return "full_mesh"
    return "switch"


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

    def __post_init__(self) -> None:
        # every construction path (files, ASTRA-sim import, presets, dataclasses.replace, user code) is checked on
        # ClusterSpecModel, as a DeviceSpec is: a NaN NIC bandwidth, gpus_per_node 0 or a negative latency is a
        # ClusterSpecError naming the field, never a NaN step time. (Citations are the rule of files: validate_cluster.)
        m = _check(_values(self))
        intra = _tier(IntraNode, m.intra)
        if intra.topology is None:
            intra = dataclasses.replace(intra, topology=default_intra_topology(intra.kind, m.device, m.gpus_per_node))
        object.__setattr__(self, "intra", intra)
        object.__setattr__(self, "inter", None if m.inter is None else _tier(InterNode, m.inter))
        for f in ("gpus_per_node", "max_nodes", "aliases", "sources"):  # counts given as 8.0 become ints
            object.__setattr__(self, f, getattr(m, f))

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


#: YAML 1.1 (PyYAML) reads 9e11 (no dot) as text: say how to write the number
_yaml_number_hint = yaml_number_hint


def _figure(name: str | None = None, *, zero: bool = False, count: bool = False) -> Any:
    """A number field: finite, positive (>= 0 with ``zero``), whole with ``count`` (kept as an int: GPU and NIC
    counts index and divide), inside :data:`PLAUSIBLE` [``name``] unless --force."""
    checks = [AfterValidator(number(zero=zero, integer=count, hint=_yaml_number_hint,
                                    finite_msg="must be a finite number, got {v!r}"))]
    if count:
        checks.append(AfterValidator(int))
    if name is not None:
        checks.append(AfterValidator(plausible(*PLAUSIBLE[name])))
    return Annotated[(Any, *checks)]


def _flag(v: Any) -> Any:
    if not isinstance(v, bool):
        raise problem("wc_type", f"{FIELD} must be true or false, got {v!r}")
    return v


def _full_bisection(v: Any) -> Any:
    if v < 1:
        raise problem("wc_value", f"{FIELD} must be >= 1 (1 = full bisection), got {v}")
    return v


def _drop_absent(d: Any, needed: tuple[str, ...]) -> Any:
    """(A before-validator's work) a required field given as null or "" is missing, named as such, not a wrong type."""
    if isinstance(d, Mapping):
        return {k: v for k, v in d.items() if not (k in needed and (v is None or v == ""))}
    return d


def _aliases(v: Any) -> Any:
    v = () if v is None else tuple(v) if isinstance(v, (list, tuple)) else v
    if not isinstance(v, tuple) or not all(isinstance(a, str) and a for a in v):
        raise problem("wc_type", f"{FIELD} must be a list of names, got {v!r}")
    return v


def _sources(v: Any) -> Any:
    v = {} if v is None else v
    if not isinstance(v, Mapping):
        raise problem("wc_type", f"{FIELD} must be a mapping of field name to source, got {v!r}")
    for k, c in v.items():
        if not isinstance(k, str) or not isinstance(c, str):
            raise problem("wc_type", f"{FIELD} must map field names to source strings, got {k!r}: {c!r}")
    return dict(v)


_NAME = text(type_msg="must be a string, got {v!r} ({t}); quote it in YAML")


class IntraNodeModel(BaseModel):
    """The link tier within a node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _absent(cls, d: Any) -> Any:
        return _drop_absent(d, ("kind", "bandwidth_gb_per_s", "latency_us"))

    kind: Annotated[Any, AfterValidator(one_of(INTRA_KINDS, "must be one of {choices}, got {v!r}"))]
    bandwidth_gb_per_s: _figure("intra.bandwidth_gb_per_s")
    latency_us: _figure("intra.latency_us", zero=True)
    topology: Annotated[Any, AfterValidator(optional(one_of(INTRA_TOPOLOGIES, "must be one of {choices}, got {v!r}")))] = None


class InterNodeModel(BaseModel):
    """The link tier across nodes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _absent(cls, d: Any) -> Any:
        return _drop_absent(d, ("kind", "nics_per_node", "nic_bandwidth_gbit_per_s", "latency_us"))

    kind: Annotated[Any, AfterValidator(one_of(INTER_KINDS, "must be one of {choices}, got {v!r}"))]
    nics_per_node: _figure("inter.nics_per_node", count=True)
    nic_bandwidth_gbit_per_s: _figure("inter.nic_bandwidth_gbit_per_s")
    latency_us: _figure("inter.latency_us", zero=True)
    rail_optimized: Annotated[Any, AfterValidator(_flag)] = True
    oversubscription: Annotated[Any, AfterValidator(number(hint=_yaml_number_hint)), AfterValidator(_full_bisection),
                                AfterValidator(plausible(*PLAUSIBLE["inter.oversubscription"]))] = 1.0


class ClusterSpecModel(BaseModel):
    """The validation model of a cluster spec (the fields of :class:`ClusterSpec`, in the order problems are
    reported): types, required fields, positive figures and whole counts, plausible ranges (units off by 1,000x,
    lifted by :func:`wattcast.data.checks.allow_exotic` / ``--force``), the rules between tiers and the citation of
    every link figure. Counts given as 8.0 come out as ints; every other value as given."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _absent(cls, d: Any) -> Any:
        return _drop_absent(d, ("name", "device", "gpus_per_node", "intra"))

    name: Annotated[Any, AfterValidator(required), AfterValidator(_NAME)]
    device: Annotated[Any, AfterValidator(required), AfterValidator(_NAME)]
    gpus_per_node: _figure("gpus_per_node", count=True)
    intra: IntraNodeModel
    inter: InterNodeModel | None = None
    max_nodes: Annotated[Any, AfterValidator(optional(number(integer=True, hint=_yaml_number_hint))),
                         AfterValidator(optional(int))] = None
    cloud_usd_per_gpu_hour: Annotated[Any, AfterValidator(optional(number(hint=_yaml_number_hint))),
                                      AfterValidator(optional(plausible(*PLAUSIBLE["cloud_usd_per_gpu_hour"])))] = None
    aliases: Annotated[Any, BeforeValidator(_aliases)] = ()
    source: Annotated[Any, BeforeValidator(lambda v: "" if v is None else v), AfterValidator(_NAME)] = ""
    sources: Annotated[Any, BeforeValidator(_sources)] = {}
    schema_version: Annotated[Any, AfterValidator(schema(SCHEMA_VERSION))] = SCHEMA_VERSION

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> "ClusterSpecModel":
        c = self
        if c.inter is not None and not exotic_allowed():  # units checks: --force lifts them
            per_gpu = c.inter.nics_per_node * c.inter.nic_bandwidth_gbit_per_s / 8.0 / c.gpus_per_node / c.inter.oversubscription
            if c.gpus_per_node > 1 and per_gpu > c.intra.bandwidth_gb_per_s * 1.001:
                raise problem("wc_rule", f"cross-node bandwidth per GPU ({per_gpu:.1f} GB/s) exceeds the in-node bandwidth "
                                         f"({c.intra.bandwidth_gb_per_s} GB/s); check units (NICs are in Gbit/s), or pass "
                                         "--force for a system that is really built so")
            if per_gpu * INTRA_OVER_INTER_MAX < c.intra.bandwidth_gb_per_s:
                raise problem("wc_plausible", f"cross-node bandwidth per GPU ({per_gpu:.3g} GB/s: {c.inter.nics_per_node} "
                              f"x {c.inter.nic_bandwidth_gbit_per_s:g} Gbit/s NICs over {c.gpus_per_node} GPUs) is "
                              f"{c.intra.bandwidth_gb_per_s / per_gpu:,.0f}x below the in-node bandwidth "
                              f"({c.intra.bandwidth_gb_per_s:g} GB/s), over the {INTRA_OVER_INTER_MAX:,.0f}x of any "
                              "cluster: was inter.nic_bandwidth_gbit_per_s given in Tbit/s (a 400G NIC is 400, not "
                              "0.4)? Give it in Gbit/s per NIC, or pass --force (in Python wattcast.allow_exotic()) for "
                              "a system that is really built so")
            nic_gb_per_s = c.inter.nic_bandwidth_gbit_per_s / 8.0
            if nic_gb_per_s * INTRA_OVER_NIC_MAX < c.intra.bandwidth_gb_per_s:
                intra = c.intra.bandwidth_gb_per_s
                raise problem("wc_plausible", f"one NIC's bandwidth ({c.inter.nic_bandwidth_gbit_per_s:g} Gbit/s = "
                              f"{nic_gb_per_s:.3g} GB/s) is {intra / nic_gb_per_s:,.0f}x below a GPU's in-node "
                              f"bandwidth ({intra:g} GB/s), over the {INTRA_OVER_NIC_MAX:,.0f}x of any GPU cluster "
                              "(10 GbE beside NVLink 5 is 720x): was inter.nic_bandwidth_gbit_per_s given in Tbit/s (a "
                              "1.6T NIC is 1600, not 1.6)? Give it in Gbit/s per NIC, or pass --force (in Python "
                              "wattcast.allow_exotic()) for a system that is really built so")
        if c.inter is not None and c.gpus_per_node > 1 and not exotic_allowed():
            nic_gb_per_s, intra = c.inter.nic_bandwidth_gbit_per_s / 8.0, c.intra.bandwidth_gb_per_s
            if nic_gb_per_s > intra * NIC_OVER_INTRA_MAX:
                raise problem("wc_plausible", f"field 'intra.bandwidth_gb_per_s' ({intra:g} GB/s per GPU each way) is "
                              f"{nic_gb_per_s / intra:,.0f}x below one NIC's bandwidth (inter.nic_bandwidth_gbit_per_s "
                              f"{c.inter.nic_bandwidth_gbit_per_s:g} Gbit/s = {nic_gb_per_s:.3g} GB/s), over the "
                              f"{NIC_OVER_INTRA_MAX:g}x of any GPU cluster: was intra.bandwidth_gb_per_s given in TB/s "
                              "(NVLink 5's 1.8 TB/s bidirectional is 900 GB/s each way)? Give GB/s per direction, or pass "
                              "--force (in Python wattcast.allow_exotic()) for a system that is really built so")
        if c.max_nodes is not None and c.max_nodes > 1 and c.inter is None:
            raise problem("wc_rule", f"max_nodes is {c.max_nodes} but there is no 'inter' (cross-node) tier")
        for f in ("intra.bandwidth_gb_per_s", "intra.latency_us") + (("inter.nic_bandwidth_gbit_per_s", "inter.latency_us")
                                                                     if c.inter else ()):
            if not (info.context and info.context.get("cite")):
                break
            if not (c.sources.get(f) or c.source):
                raise problem("wc_citation", f"field '{f}' has no source; give 'source' or 'sources.{f}'")
        return c


_SECTIONS = {"": ClusterSpecModel, "intra": IntraNodeModel, "inter": InterNodeModel}


def _not_mapping(field_name: str, v: Any) -> str:
    second = "bandwidth_gb_per_s" if field_name == "intra" else "nics_per_node"
    return f"field '{field_name}' must be a mapping (kind: ..., {second}: ...), got {v!r} ({type(v).__name__})"


def _check(d: Mapping[str, Any], *, cite: bool = False) -> ClusterSpecModel:
    """The fields ``d`` (sections as mappings) validated on :class:`ClusterSpecModel` (``cite``: with the citation rule
    of files); :class:`ClusterSpecError` naming the first problem's field and value (and the cluster)."""
    try:
        return ClusterSpecModel.model_validate(d, context={"cite": cite})
    except ValidationError as e:
        name = d.get("name")
        where = f"cluster {name!r}" if name not in (None, "") else "cluster spec"
        raise ClusterSpecError(f"{where}: " + first_problem(
            e, known=lambda section: _SECTIONS[section].model_fields, not_mapping=_not_mapping)) from None


def _validated(d: Mapping[str, Any]) -> ClusterSpec:
    """The :class:`ClusterSpec` of the fields ``d`` (sections as mappings), validated on :class:`ClusterSpecModel`
    with the citation rule; :class:`ClusterSpecError` naming the first problem's field and value (and the cluster)."""
    m = _check(d, cite=True)
    _check_device_link(m)
    return ClusterSpec(intra=_tier(IntraNode, m.intra), inter=None if m.inter is None else _tier(InterNode, m.inter),
                       **{f: getattr(m, f) for f in ClusterSpecModel.model_fields if f not in ("intra", "inter")})


def _check_device_link(m: ClusterSpecModel) -> None:
    """Refuse (unless --force) an in-node ``intra.bandwidth_gb_per_s`` more than :data:`DEVICE_OVER_INTRA_MAX` times
    below the ``interconnect_bandwidth_gbps`` of the cluster's device spec (when it gives one): a figure given in TB/s.
    A device that does not resolve is left to the code that loads it (it names the problem there)."""
    if exotic_allowed() or m.gpus_per_node < 2:
        return
    from wattcast.data.catalog import resolve_device  # (catalog -> device_spec; no cycle, but kept off import time)
    from wattcast.data.device_spec import DeviceSpecError
    try:
        spec = resolve_device(m.device)
    except DeviceSpecError:
        return
    ic = getattr(spec, "interconnect_bandwidth_gbps", None)
    bw = m.intra.bandwidth_gb_per_s
    if not ic or bw * DEVICE_OVER_INTRA_MAX >= ic:
        return
    raise ClusterSpecError(
        f"cluster {m.name!r}: field 'intra.bandwidth_gb_per_s' ({bw:g} GB/s per GPU each way) is {ic / bw:,.0f}x below "
        f"{spec.name}'s interconnect_bandwidth_gbps ({ic:g} GB/s both ways), more than the {DEVICE_OVER_INTRA_MAX:g}x "
        f"of any cluster: was it given in TB/s ({ic / 1000:g} TB/s is {ic / 2:g} GB/s each way)? Give GB/s per "
        "direction, or pass --force (in Python wattcast.allow_exotic()) for a system that is really built so")


def _tier(cls: type, m: BaseModel) -> Any:
    """The IntraNode / InterNode of a validated tier model."""
    return cls(**{f: getattr(m, f) for f in type(m).model_fields})


def _values(c: ClusterSpec) -> dict[str, Any]:
    """``c``'s fields as :class:`ClusterSpecModel` reads them (the tiers as mappings)."""
    d = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
    for tier in ("intra", "inter"):
        if dataclasses.is_dataclass(d[tier]) and not isinstance(d[tier], type):
            d[tier] = dataclasses.asdict(d[tier])
    return d


def validate_cluster(c: ClusterSpec) -> ClusterSpec:
    """``c`` checked on :class:`ClusterSpecModel` with the citation rule of files (whole-number counts given as floats
    become ints; the value checks alone run whenever a ClusterSpec is built)."""
    return _validated(_values(c))


def cluster_from_dict(d: Mapping[str, Any], *, device: str | None = None) -> ClusterSpec:
    """A cluster from its dict (own schema, or ASTRA-sim's analytical network config). ``device`` names the GPU
    when the dict has none (an ASTRA-sim file names none); given, it overrides the dict's own."""
    if not isinstance(d, Mapping):
        raise ClusterSpecError(f"cluster spec must be a mapping of fields, got {type(d).__name__}")
    if "topology" in d and "npus_count" in d:
        return from_astra_network(d, device=device)
    return _validated(dict(d) if device is None else {**d, "device": device})


def _dimensions(v: Any) -> Any:
    if not isinstance(v, (list, tuple)):
        raise problem("wc_type", f"{FIELD} must be a list (one entry per dimension), got {v!r}")
    return list(v)


#: the topologies of ASTRA-sim's analytical network backend (read case-insensitively)
ASTRA_TOPOLOGIES = ("Ring", "FullyConnected", "Switch")


def _topology_name(v: Any) -> Any:
    if not isinstance(v, str) or not v:
        raise problem("wc_type", f"{FIELD} must be a topology name (Ring, Switch, FullyConnected), got {v!r}")
    if v.lower() not in {t.lower() for t in ASTRA_TOPOLOGIES}:
        hint = did_you_mean(v, ASTRA_TOPOLOGIES, "; did you mean {}?", n=1, cutoff=0.5)
        raise problem("wc_value", f"{FIELD}: unknown topology {v!r}{hint} (ASTRA-sim's analytical network has "
                                  f"{', '.join(ASTRA_TOPOLOGIES)})")
    return v


def _per_dimension(item: Any) -> Any:
    return Annotated[list[item], BeforeValidator(_dimensions)]


#: (lowest, highest plausible, what a too-small / too-large figure probably is, the unit) of an ASTRA-sim ``latency``
#: entry, in nanoseconds per link as ASTRA-sim's analytical network reads it (``bandwidth`` in GB/s). No link is under
#: 1 ns (light covers 20 cm of cable in it, before any SerDes, FEC or switch hop; NVLink and InfiniBand hops are
#: hundreds of ns): a figure under 1 is one in microseconds (0.5 for 500 ns). 0 stays allowed (an ideal link, as a
#: cluster file's latency_us 0). The top is the cluster tiers' 100 us (:data:`PLAUSIBLE`), checked here on the file's
#: own field. Lifted by --force.
ASTRA_LATENCY_NS = (1.0, 100_000.0, "microseconds (ASTRA-sim's latency is in nanoseconds per link: 0.5 us is 500)",
                    "picoseconds, or a latency beyond the 100 us of any cluster tier", "nanoseconds per link")


class AstraNetworkModel(BaseModel):
    """ASTRA-sim's analytical network config: one entry per dimension in each list, and wattcast's own ``device`` and
    ``name`` (read by :func:`from_astra_network`). Any other key is refused naming it (a misspelt ``bandwith`` would
    otherwise be ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _absent(cls, d: Any) -> Any:
        return _drop_absent(d, ("topology", "npus_count", "bandwidth", "latency"))

    topology: _per_dimension(Annotated[Any, AfterValidator(_topology_name)])
    npus_count: _per_dimension(Annotated[Any, AfterValidator(number(integer=True, whole_msg="must be a whole number of "
                                                                                            "NPUs, got {v!r}")),
                                         AfterValidator(int)])
    bandwidth: _per_dimension(Annotated[Any, AfterValidator(number()), AfterValidator(float)])
    latency: _per_dimension(Annotated[Any, AfterValidator(number(zero=True)), AfterValidator(float),
                                      AfterValidator(plausible(*ASTRA_LATENCY_NS, zero_ok=True))])
    device: Any = None  # (checked as the cluster's device)
    name: Any = None

    @model_validator(mode="after")
    def _same_length(self) -> "AstraNetworkModel":
        n = (len(self.topology), len(self.npus_count), len(self.bandwidth), len(self.latency))
        if len(set(n)) > 1 or not n[0]:
            raise problem("wc_rule", "topology, npus_count, bandwidth and latency must have the same length "
                                     f"(one entry per dimension), got {', '.join(map(str, n))}")
        return self


def _astra_intra(topology: str, npus: int, bandwidth_gb_per_s: float, latency_ns: float) -> IntraNode:
    """The in-node tier of ASTRA-sim's dimension 0. ASTRA-sim's ``bandwidth`` is per link (astra-sim analytical network
    docs, "bandwidth: link bandwidth per dimension, GB/s"): a Switch NPU has one link to the switch (its whole
    bandwidth, topology ``switch``); a FullyConnected NPU one link to each of the other ``npus`` - 1 (per-GPU bandwidth
    ``bandwidth`` x (npus - 1), topology ``full_mesh``: a pair shares one link, as in ASTRA-sim); a Ring is kept as the
    switch approximation it had (per-GPU ``bandwidth``)."""
    t = topology.lower()
    if t == "fullyconnected" and npus > 1:
        return IntraNode(kind="nvlink", bandwidth_gb_per_s=bandwidth_gb_per_s * (npus - 1), latency_us=latency_ns / 1e3,
                         topology="full_mesh")
    return IntraNode(kind="nvswitch" if t in ("switch", "fullyconnected") else "nvlink", bandwidth_gb_per_s=bandwidth_gb_per_s,
                     latency_us=latency_ns / 1e3, topology="switch")


def from_astra_network(d: Mapping[str, Any], *, device: str | None = None, name: str = "astra-sim network") -> ClusterSpec:
    """ASTRA-sim analytical network config: ``topology``, ``npus_count``, ``bandwidth`` (GB/s per NPU per
    dimension), ``latency`` (ns per link; 0, or 1 ns to 100 us: :data:`ASTRA_LATENCY_NS`). Dimension 0 is the node;
    the product of the others is the node count. The device is not part of ASTRA-sim's file: pass it (or add a ``device`` key)."""
    if not isinstance(d, Mapping):
        raise ClusterSpecError(f"ASTRA-sim network: the config must be a mapping, got {type(d).__name__}")
    try:
        m = AstraNetworkModel.model_validate(d)
    except ValidationError as e:
        msg = first_problem(e, missing=lambda f: f"required field '{f}' is missing (need topology, npus_count, "
                                                 "bandwidth, latency lists, one entry per dimension)",
                            known=lambda section: AstraNetworkModel.model_fields if not section else ())
        raise ClusterSpecError(f"ASTRA-sim network: {msg}") from None
    topo, npus, bw, lat = m.topology, m.npus_count, m.bandwidth, m.latency
    dev = device if device is not None else d.get("device")
    if dev is None or dev == "":
        raise ClusterSpecError("ASTRA-sim network: the file names no GPU; add 'device: NAME' or pass --device")
    cname = d.get("name", name)
    src = "ASTRA-sim analytical network config"
    intra = _astra_intra(topo[0], npus[0], bw[0], lat[0])
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
        c = cluster_from_dict(yaml_load_unique(f.read_text()))
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
        d = yaml_load_unique(text)
    except yaml.YAMLError as e:
        raise ClusterSpecError(f"{p}: not valid YAML/JSON: {e}") from None
    try:
        if device is None:
            d = _device_beside(d, p)
        return cluster_from_dict(d, device=device)
    except ClusterSpecError as e:
        raise ClusterSpecError(f"{p}: {e}") from None


#: the suffixes of a device spec file (``wattcast.data.catalog.SPEC_SUFFIXES``)
_SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def _device_beside(d: Any, path: Path) -> Any:
    """``d`` with a relative device file path (``device: my_gpu.yaml``, ``device: specs/x.json``) made absolute against
    the folder of the cluster file ``path``, as a file names its neighbours, not against the current directory; a
    catalog name is left as it is. A relative path with no file beside the cluster file is refused naming both."""
    dev = d.get("device") if isinstance(d, Mapping) else None
    if not isinstance(dev, str) or not dev.strip():
        return d
    rel = Path(dev.strip()).expanduser()
    if rel.is_absolute() or not (rel.suffix.lower() in _SPEC_SUFFIXES or len(rel.parts) > 1):
        return d  # an absolute path, or a catalog name (resolved as before)
    beside = path.resolve().parent / rel
    if beside.is_file():
        return {**d, "device": str(beside)}
    here = " (a file of that name is in the current directory: give its absolute path)" if rel.is_file() else ""
    raise ClusterSpecError(f"field 'device' {dev!r}: no device spec file {beside}; a relative path in a cluster file is "
                           f"read from the cluster file's folder{here}")


def resolve_cluster(name_or_path: str | Path | ClusterSpec, *, device: str | None = None) -> ClusterSpec:
    """A preset name (case-insensitive) or a cluster file (own schema or ASTRA-sim network YAML).

    ``device`` (a catalog name) replaces the cluster's GPU; an ASTRA-sim file, which names none, needs it
    unless the file has a ``device`` key."""
    if isinstance(name_or_path, ClusterSpec):
        c = name_or_path
    else:
        part = _partial_node(name_or_path)
        c = (_resolve_cluster(name_or_path, device) if part is None
             else _partial_node_cluster(*part, device))
    if device is not None and c.device != device:
        c = validate_cluster(dataclasses.replace(c, device=device))
    return c


#: the name :func:`using_gpus_per_node` gives a cluster run on n of its nodes' N GPUs ("DGX-H100 (4 of 8 GPUs per node)")
_PARTIAL_NODE_NAME = re.compile(r"^(?P<base>.+) \((?P<n>\d+) of (?P<of>\d+) GPUs per node\)$")


def _partial_node(name_or_path) -> tuple[str, int, int] | None:
    """(base cluster, n, N) of a name :func:`using_gpus_per_node` gave (a search row's ``cluster``), None otherwise (an
    existing file of that name too)."""
    s = str(name_or_path)
    m = _PARTIAL_NODE_NAME.match(s.strip())
    if m is None or Path(s).is_file():
        return None
    return m["base"], int(m["n"]), int(m["of"])


def _partial_node_cluster(base: str, n: int, of: int, device: str | None) -> ClusterSpec:
    """The cluster a partial-node name stands for: ``base`` resolved, then :func:`using_gpus_per_node` with ``n`` (its
    nodes must have ``of`` GPUs: the name says so)."""
    c = _resolve_cluster(base, device)
    if c.gpus_per_node != of:
        raise ClusterSpecError(f"cluster {base!r} ({n} of {of} GPUs per node): {c.name}'s nodes have {c.gpus_per_node} "
                               f"GPUs, not {of}")
    return using_gpus_per_node(c, n)


def device_link_notes(c: ClusterSpec, spec: Any) -> list[str]:
    """Warnings (for a prediction's ``warnings``) when cluster ``c``'s in-node tier is faster than the GPU ``spec`` (a
    DeviceSpec) can drive: its ``interconnect_bandwidth_gbps`` (both directions, so half of it each way) below the
    tier's ``bandwidth_gb_per_s`` (each way), e.g. an L4 (PCIe, 64 GB/s) put on an NVSwitch preset (450 GB/s each
    way). The cluster's figure is used as given (no number changes); every preset with its own GPU gets none."""
    ic = getattr(spec, "interconnect_bandwidth_gbps", None)
    if not ic or c.gpus_per_node < 2 or c.intra.bandwidth_gb_per_s <= ic / 2 * 1.001:
        return []
    port = f" ({spec.interconnect})" if getattr(spec, "interconnect", None) else ""
    return [f"cluster {c.name}'s in-node bandwidth ({c.intra.bandwidth_gb_per_s:g} GB/s per GPU each way, {c.intra.kind}) "
            f"exceeds what {spec.name}'s own interconnect{port} carries ({ic:g} GB/s both ways, {ic / 2:g} each): the "
            f"in-node collectives are costed at the cluster's figure; give a cluster file whose intra tier is this GPU's "
            f"(e.g. a PCIe preset for a PCIe card)"]


def using_gpus_per_node(c: ClusterSpec, n: int | None) -> ClusterSpec:
    """``c`` as a job sees it when it uses ``n`` of every node's GPUs and leaves the rest idle (64 of an NVL72 rack's
    72, the other 8 held as spares, is how such racks are often run). Each node keeps its in-node fabric (NVLink /
    NVSwitch: the per-GPU bandwidth does not change; a ``full_mesh`` node's used GPUs keep only their links to each
    other, n - 1 of the node's N - 1, so its per-GPU bandwidth becomes (n-1)/(N-1) of the figure, one link at least
    for n = 1); its NICs are counted in proportion, ``round(nics x n / gpus)``
    and at least one (a rail-optimised node has one per GPU: one per used GPU), so every used GPU keeps its share of
    the node's network bandwidth. ``n`` None or equal to the node's GPUs: ``c`` itself. Costs stay per GPU used."""
    if n is None:
        return c
    if not is_count(n, whole_floats=True):
        raise ClusterSpecError(f"--gpus-per-node must be a whole number of GPUs >= 1, got {n!r}")
    n = int(n)
    if n > c.gpus_per_node:
        raise ClusterSpecError(f"--gpus-per-node {n}: cluster {c.name}'s nodes have {c.gpus_per_node} GPUs")
    if n == c.gpus_per_node:
        return c
    inter = c.inter
    if inter is not None:
        inter = dataclasses.replace(inter, nics_per_node=max(1, round(inter.nics_per_node * n / c.gpus_per_node)))
    intra = c.intra
    if intra.topology == "full_mesh" and c.gpus_per_node > 1:
        intra = dataclasses.replace(intra, bandwidth_gb_per_s=intra.bandwidth_gb_per_s * max(n - 1, 1) / (c.gpus_per_node - 1))
    return dataclasses.replace(c, name=f"{c.name} ({n} of {c.gpus_per_node} GPUs per node)", gpus_per_node=n,
                               intra=intra, inter=inter, aliases=())


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
