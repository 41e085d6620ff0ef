"""Sweeps that outgrow one process: models x clusters x GPU counts x regions, each task a strategy search, on Dask
(default) or Ray (the optional extra ``pip install "wattcast[ray]"``; ``backend="ray"``, ``--backend ray``).

``wattcast sweep SPEC.yaml`` (and :func:`run_sweep`) reads a spec like::

    models: [llama3_8b, gpt3_175b]        # built-in names, config.json or ONNX paths
    clusters: [DGX-H100, DGX-A100]        # presets or cluster files
    gpus: [64, 128]                       # GPU counts (each a whole number of nodes of every cluster)
    batch: 512                            # global batch, sequences
    seq: 4096
    regions: [aws:us-east-1, gcp:europe-west4]   # optional; one task per region (needs tokens)
    tokens: 1.0e12                        # optional: whole-run time, cost, energy and CO2e per row
    dtype: bf16                           # optional, as `wattcast search`
    attention: flash
    framework: hf
    objective: time                       # time | cost | tco | co2e | energy
    top: 3                                # rows kept per task (the best fitting ones)
    max_configs: 500                      # per task
    space: {tp: [1, 2, 4, 8], zero: [1, 3]}  # optional search-space options of `wattcast.search`
    moe_routing: {moe_load_imbalance: 1.2}  # optional: MoE routing for every strategy (as `search(moe_routing=)`)
    gpus_per_node: 64                     # optional: use this many of each node's GPUs (as `--gpus-per-node`)
    compile: true                         # optional: torch.compile for every strategy (as `--compile`)
    zero3_prefetch: true                  # optional: ZeRO-3/FSDP collectives beside the computation (as `--zero3-prefetch`;
                                          # needs a zero choice with them: 3, or 2 under framework hf)
    scatter_gather_p2p: false             # optional: pipeline transfers scattered over TP (as `--scatter-gather-p2p`)
    fsdp_reduce_dtype: fp32               # optional: FSDP's gradient reduce dtype, framework hf (as `--fsdp-reduce-dtype`)
    grad_accum_dtype: bf16                # optional: DeepSpeed's grad accumulation dtype, framework megatron-deepspeed
                                          # (as `--grad-accum-dtype`; default fp32, BF16_Optimizer)
    grad_reduce_in_bf16: true             # optional: Megatron-LM's bf16 main gradients, framework megatron (as
                                          # `--grad-reduce-in-bf16`; = grad_accum_dtype bf16 there)
    fp8_recipe: mxfp8                     # optional, with dtype fp8: Megatron-Core's --fp8-recipe (as `--fp8-recipe`)
    overlaps: {tp_comm_overlap: false}    # optional: Megatron-Core's overlap flags for every strategy (search's overlaps=)
    moe_token_dispatcher: allgather       # optional: Megatron-Core's MoE token dispatcher (as `--moe-token-dispatcher-type`)
    cross_entropy_loss_fusion: false      # optional: Megatron-Core's fused cross-entropy loss (framework megatron;
    cross_entropy_fusion_impl: native     # default on there, as the recipes run it): false for a plain Megatron-LM run
    data_load_ms: 5.0                     # optional: data loader's host ms per micro-batch (as `--data-load-ms`)
    data_workers: 4                       # optional: data-loader worker processes (as `--data-workers`)
    pp_first_stage_layers: 6              # optional: the first / last pipeline stage's layers on every pp > 1 strategy
    pp_last_stage_layers: 6               # (as `--pp-first-stage-layers` / `--pp-last-stage-layers`)
    optimizer: adamw                      # optional: the optimizer (as `--optimizer`; default adamw)
    optimizer_impl: foreach               # optional: its kernels, fused or foreach (as `--optimizer-impl`)
    model_folders: {models: retrained/}   # optional: retrained models (models, collectives, power_model), as the
                                          # --models / --collectives / --power-model flags (which override them)

Every (model, cluster, gpus, region) is one task: a :func:`wattcast.search` whose ``top`` best fitting rows (or one
row saying why there are none: ``status`` "none fits" when strategies were evaluated and none fits in memory, "no valid
strategy" when every candidate broke a rule, with the rules in ``error``; see :data:`STATUSES`) are written, as soon
as the task finishes, to its own Parquet part in the output folder (``OUT.parquet/part-<task id>.parquet``, written
to a temporary name and renamed, so a part is whole or absent). Every row also carries its search's ``warnings``
, ``unranked_clusters`` and ``dropped_values`` (:data:`SEARCH_KEYS`: JSON text of what ``wattcast search --json``
gives under those keys).
The folder reads as one table
(``pandas.read_parquet(OUT)``). A rerun with the same output skips the tasks whose parts are there, so an interrupted
sweep resumes; a worker killed mid-task loses only that task, which Dask runs again on another worker (on Ray: the
actor is restarted and the task retried). Both backends, and the in-process run, go through one loop that writes the
parts, so their output is the same. Task ids hash the task and the settings that change its result, so a changed spec
does not reuse stale parts (it replaces them: :func:`prepare_folder`); for a cluster file they hash what it resolves to (its figures, and those of a device spec
file it names) and for a model file its bytes, so editing a file and rerunning into the same folder reruns its tasks
(a preset or built-in name keeps the id it always had). Retrained model folders (``model_folders``, the flags, else
``$WATTCAST_MODELS`` / ``$WATTCAST_COLLECTIVES`` / ``$WATTCAST_POWER_MODEL``) are resolved to their live versions before
any task runs; every task gets those paths (a worker on another machine needs them at the same place) and its id hashes
their manifests, so a sweep rerun with another bundle does not reuse the parts of the first. Every task id also hashes
the manifests of the shipped models it reads (those no folder replaces) and wattcast's version, so a sweep resumed
after an upgrade that changed the models (or the version) recomputes its tasks instead of keeping rows costed by the
old ones (this made every id change once, from the version that added it).

Bad input is refused before anything runs: an unknown key (named), an empty list, a GPU count or batch that is
not a positive whole number, an unknown model, cluster or region.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import product
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from wattcast.data.checks import did_you_mean
from wattcast.models.selection import KINDS, ModelFolders

#: spec keys and what they hold
SPEC_KEYS = {
    "models": "list of models (built-in names, config.json or ONNX paths)",
    "clusters": "list of clusters (preset names or files)",
    "gpus": "list of GPU counts",
    "batch": "global batch (sequences)",
    "seq": "sequence length (tokens)",
    "regions": "list of regions (wattcast regions); needs tokens",
    "tokens": "whole-run length in tokens",
    "dtype": "precision (fp32, tf32, bf16, fp16, fp8)",
    "attention": "eager, flash, flash1 or flash3",
    "optimizer": "adamw (default), adam, adamw-bf16, muon, sgd or none (as --optimizer)",
    "optimizer_impl": "fused or foreach: the optimizer step's kernels (as --optimizer-impl; default: the framework's, "
                      "fused)",
    "framework": "hf, megatron or megatron-deepspeed",
    "objective": "time, cost, tco, co2e or energy",
    "top": "rows kept per task",
    "max_configs": "strategies evaluated per task",
    "space": "search-space options of wattcast.search (tp, pp, micro_batch, zero, sp, recompute, interleave, ep, cp, "
             "schedule, recompute_num_layers)",
    "moe_routing": "MoE routing for every strategy: moe_load_imbalance, moe_capacity_factor, moe_pad_to_capacity",
    "gpus_per_node": "use this many of each node's GPUs (e.g. 64 of an NVL72 rack's 72)",
    "compile": "true or false: every strategy as torch.compile runs it (as `--compile`; default false: eager)",
    "zero3_prefetch": "true or false: ZeRO-3 / FSDP collectives beside the computation or in series (default: the framework's)",
    "scatter_gather_p2p": "true or false: pipeline transfers scattered over the TP group and all-gathered on arrival "
                          "(default: the framework's)",
    "fsdp_reduce_dtype": "fp32, bf16 or fp16: PyTorch FSDP's MixedPrecision.reduce_dtype (framework hf, ZeRO-3; default: "
                         "the parameters' dtype)",
    "grad_accum_dtype": "fp32 or bf16: DeepSpeed's data_types.grad_accum_dtype (framework megatron-deepspeed; default "
                        "fp32, BF16_Optimizer; bf16 at ZeRO-1: the ZeRO optimizer on bf16 gradients); framework "
                        "megatron: the main-gradient buffer's dtype (bf16 = --grad-reduce-in-bf16)",
    "grad_reduce_in_bf16": "true or false: Megatron-LM's --grad-reduce-in-bf16 (framework megatron): the main-gradient "
                           "buffer in bf16, the same as grad_accum_dtype bf16 there (default false: fp32)",
    "fp8_recipe": "with dtype fp8: delayed (default), tensorwise, mxfp8 or blockwise: Megatron-Core's --fp8-recipe for "
                  "every strategy (a cluster whose GPU cannot run it gets none)",
    "moe_token_dispatcher": "alltoall (default) or allgather: Megatron-Core's --moe-token-dispatcher-type for every "
                            "strategy (framework megatron, a mixture-of-experts model)",
    "cross_entropy_loss_fusion": "true or false: Megatron-Core's fused cross-entropy loss (framework megatron; default: "
                                 "on there, as Megatron-Bridge's recipes run it; false for a plain Megatron-LM run)",
    "cross_entropy_fusion_impl": "native or te: the fused loss's implementation (Megatron-Core's "
                                 "--cross-entropy-fusion-impl; default native)",
    "overlaps": "Megatron-Core's overlap flags for every strategy, a mapping of overlap_grad_reduce, "
                "overlap_param_gather, tp_comm_overlap, overlap_moe_expert_parallel_comm, overlap_p2p_comm, "
                "async_tp_comm to true or false (wattcast.search's overlaps=; as --[no-]overlap-grad-reduce, "
                "--[no-]async-tp-comm etc.; default: the framework's)",
    "data_load_ms": "the data loader's host ms to produce one micro-batch (default 0)",
    "memory_headroom_gb": "a strategy fits only when its memory is at least this many GB below the GPU's capacity "
                          "(memory_gb <= capacity - X; as --memory-headroom-gb; default 0)",
    "data_workers": "data-loader worker processes (default: the framework's)",
    "pp_first_stage_layers": "transformer layers of the first pipeline stage on every pp > 1 strategy (Megatron-Core's "
                             "decoder_first_pipeline_num_layers; as --pp-first-stage-layers; strategies whose pp / "
                             "interleave cannot take it are rejected naming the rule)",
    "pp_last_stage_layers": "transformer layers of the last pipeline stage on every pp > 1 strategy (as "
                            "--pp-last-stage-layers)",
    "cloud_usd_per_gpu_hour": "cloud price per GPU-hour (USD) for every task's run (as --cloud-usd-per-gpu-hour); needs "
                              "tokens: what objective cost/tco needs where the shipped table has no price",
    "footprint": "other run options of every task (wattcast.search's footprint_kw: pue, pricing, lifetime_years, "
                 "electricity_usd_per_kwh, ...; the region comes from 'regions'); needs tokens",
    "output": "output folder (.parquet); the --output flag overrides it",
    "model_folders": "retrained model folders: a mapping of models (kernel bundle), collectives and power_model "
                     "(what `wattcast train ... --out` wrote); the --models/--collectives/--power-model flags override them",
}
#: the keys of ``model_folders``
MODEL_FOLDER_KEYS = tuple(KINDS)
#: a task's ``status``: "ok" (its best rows), "none fits" (strategies were evaluated, none fits in memory),
#: "no valid strategy" (every candidate broke a rule, e.g. an FP8 run on A100s, or GPUs that do not fill whole nodes:
#: ``error`` names the rules) or "error" (the task could not run; ``error`` says why)
STATUSES = ("ok", "none fits", "no valid strategy", "error")
NO_VALID_STRATEGY = "no valid strategy"
#: columns every written row has besides the search's own
TASK_COLUMNS = ("task_id", "model", "cluster", "gpus", "region", "status", "error", "rank", "task_seconds")
#: the type of each column of a part (every part has them all, a task without a result too: pyarrow's dataset read,
#: ``pandas.read_parquet(OUT)``, takes one part's schema for the folder, so a 9-column part of a failed task read
#: first hid the other 32). Whole numbers are nullable int64, flags nullable bool, text '' when absent, the rest
#: float64 (``planning.search.COLUMNS`` / ``RUN_COLUMNS``; ``test_sweep_parts`` checks these against a search)
INT_COLUMNS = frozenset(("gpus", "rank", "tp", "pp", "dp", "cp", "micro_batch", "zero", "ep", "interleave",
                         "grad_accum", "seq", "pp_first_stage_layers", "pp_last_stage_layers"))
BOOL_COLUMNS = frozenset(("sp", "fits", "scheduled", "electricity_region_specific", "grid_region_specific", "run_pareto",
                          "fp8_param_gather", "compile"))
TEXT_COLUMNS = frozenset(("task_id", "model", "cluster", "region", "status", "error", "device", "config", "recompute",
                          "strategy", "schedule", "memory_flag", "dtype", "attention", "framework", "etp",
                          "cloud_price_source", "electricity_source", "grid_region", "grid_basis", "grid_source",
                          "cloud_pricing", "accelerator_price_source", "warnings", "unranked_clusters", "dropped_values",
                          "cp_comm_type", "hierarchical_cp_sizes", "fp8_recipe", "step_time_band_basis",
                          "step_time_band_generation", "pipeline_layout"))
#: a search's own findings, on every row of its task as JSON text (the keys and values of ``wattcast search --json``):
#: ``warnings`` (a list: the model's, e.g. a sequence beyond its positions, and the cluster's and GPU's,
#: ``SearchResult.warnings``) and ``unranked_clusters`` (an object: the searched cluster, when it has no valid strategy,
#: and why: ``SearchResult.unranked_clusters``) and ``dropped_values`` (a list: each value the task's space asked for
#: that every candidate with it broke a rule, ``SearchResult.dropped_values``); '' on a task that could not run
SEARCH_KEYS = ("warnings", "unranked_clusters", "dropped_values")


def part_columns(tokens: bool) -> list[str]:
    """Every column of a task's part, in order (the run columns when the sweep gives ``tokens``)."""
    from wattcast.planning.search import COLUMNS, RUN_COLUMNS

    return ["task_id", "model", "cluster", "gpus", "region", "rank", *[c for c in COLUMNS if c != "cluster"],
            *(RUN_COLUMNS if tokens else ()), "status", "error", *SEARCH_KEYS, "task_seconds"]


def _text(v: Any) -> str:
    """A text cell: '' for a missing value (None, NaN, pd.NA), else the value as text."""
    if isinstance(v, str):
        return v
    try:
        missing = v is None or bool(pd.isna(v))
    except (TypeError, ValueError):  # a list-like value
        missing = False
    return "" if missing else str(v)


def _part_frame(frame: pd.DataFrame) -> tuple[pd.DataFrame, Any]:
    """``frame`` with each known column in its part type, and the pyarrow schema to write it with."""
    import pyarrow as pa

    out = frame.copy()
    fields = []
    for c in out.columns:
        if c in INT_COLUMNS:
            out[c] = pd.to_numeric(out[c], errors="coerce").astype("Int64")
            fields.append(pa.field(c, pa.int64()))
        elif c in BOOL_COLUMNS:
            out[c] = out[c].astype("boolean")
            fields.append(pa.field(c, pa.bool_()))
        elif c in TEXT_COLUMNS or out[c].dtype == object:  # mixed-type object columns (a NaN among strings) as text
            out[c] = out[c].map(_text).astype(object)
            fields.append(pa.field(c, pa.string()))
        else:
            out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
            fields.append(pa.field(c, pa.float64()))
    return out, pa.schema(fields)


class SweepSpecError(ValueError):
    """A sweep spec that cannot run: the message names the key and what is wrong."""


@dataclass(frozen=True)
class SweepSpec:
    models: tuple
    clusters: tuple
    gpus: tuple
    batch: int
    seq: int
    regions: tuple = (None,)
    tokens: float | None = None
    dtype: str = "bf16"
    attention: str = "flash"
    framework: str = "hf"
    objective: str = "time"
    top: int = 1
    max_configs: int = 500
    space: dict = field(default_factory=dict)
    output: str | None = None
    moe_routing: dict = field(default_factory=dict)
    gpus_per_node: int | None = None
    zero3_prefetch: bool | None = None
    #: torch.compile for every strategy (search's ``compile``)
    compile: bool = False
    scatter_gather_p2p: bool | None = None
    fsdp_reduce_dtype: str | None = None
    grad_accum_dtype: str | None = None
    fp8_recipe: str | None = None
    moe_token_dispatcher: str | None = None
    cross_entropy_loss_fusion: bool | None = None
    cross_entropy_fusion_impl: str | None = None
    data_load_ms: float = 0.0
    data_workers: int | None = None
    optimizer: str | None = None
    optimizer_impl: str | None = None
    memory_headroom_gb: float = 0.0
    #: the first / last pipeline stage's layers on every pp > 1 strategy (search's pp_first/last_stage_layers)
    pp_first_stage_layers: int | None = None
    pp_last_stage_layers: int | None = None
    #: Megatron-Core's overlap flags for every strategy (search's ``overlaps``), only those given
    overlaps: dict = field(default_factory=dict)
    #: model folders by kind (models, collectives, power_model) as given; resolved (with the environment's) by tasks()
    model_folders: dict = field(default_factory=dict)
    #: run options of every task's footprint (search's footprint_kw, without region), cloud_usd_per_gpu_hour included
    footprint: dict = field(default_factory=dict)
    #: what load_spec said about the spec (a value given twice, run once); not in any task id
    notes: tuple = ()

    def tasks(self, allow_exotic: bool = False) -> list[dict]:
        """One dict per (model, cluster, gpus, region), with its id. ``allow_exotic``: every task runs with the
        plausibility ranges lifted (:func:`wattcast.allow_exotic`), which :func:`run_sweep` passes when it is called
        inside that block: a context variable does not reach a Dask worker or a Ray actor, the task carries it (and
        its id, so a strict and a lifted run of one spec do not share parts: whole-node rules differ)."""
        settings = {k: getattr(self, k) for k in ("batch", "seq", "tokens", "dtype", "attention", "framework", "objective",
                                                  "top", "max_configs")}
        if allow_exotic:  # only when on: the ids of every other sweep stay what they were
            settings["allow_exotic"] = True
        settings["space"] = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in sorted(self.space.items())}
        # only when given: the ids of sweeps that set neither stay what they were
        if self.moe_routing:
            settings["moe_routing"] = dict(sorted(self.moe_routing.items()))
        if self.overlaps:
            settings["overlaps"] = dict(sorted(self.overlaps.items()))
        for k in ("gpus_per_node", "zero3_prefetch", "scatter_gather_p2p", "fsdp_reduce_dtype", "grad_accum_dtype", "fp8_recipe",
                  "moe_token_dispatcher", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "optimizer",
                  "optimizer_impl", "pp_first_stage_layers", "pp_last_stage_layers"):
            if getattr(self, k) is not None:
                settings[k] = getattr(self, k)
        if self.compile:  # only when on: the ids of eager sweeps stay what they were
            settings["compile"] = True
        if self.data_load_ms:
            settings["data_load_ms"] = self.data_load_ms
        if self.data_workers is not None:
            settings["data_workers"] = self.data_workers
        if self.memory_headroom_gb:
            settings["memory_headroom_gb"] = self.memory_headroom_gb
        if self.footprint:
            settings["footprint"] = dict(sorted(self.footprint.items()))
        from wattcast.models.selection import resolve_folders

        try:  # given > environment > shipped, each checked; the live versions' paths
            folders = resolve_folders(**{k: self.model_folders.get(k) for k in MODEL_FOLDER_KEYS}).given()
        except ValueError as e:
            raise SweepSpecError(f"sweep spec: model_folders: {e}") from None
        if folders:  # only when given: the paths every task's search gets
            settings["model_folders"] = folders
        # the manifests of the models the tasks read (the given folders' live versions, else the shipped ones) and
        # wattcast's version: a sweep resumed after an upgrade that changed them recomputes, not keeps stale parts
        settings["model_manifests"] = _manifest_digests({k: folders.get(k) or _shipped_folder(k)
                                                         for k in MODEL_FOLDER_KEYS})
        settings["wattcast_version"] = _package_version()
        # and the code's own digest: a change of a formula (not of a model file) also moves the figures
        settings["wattcast_code"] = _code_digest()
        out = []
        figures = {str(c): cluster_fingerprint(c) for c in self.clusters}
        contents = {str(m): model_fingerprint(m) for m in self.models}
        for m, c, g, r in product(self.models, self.clusters, self.gpus, self.regions):
            t = dict(model=str(m), cluster=str(c), gpus=int(g), region=r, **settings)
            # a cluster, device or model file: what it says is in the id, so an edited file does not reuse stale parts
            # (a preset or built-in name is in the id as it always was)
            if figures[str(c)] is not None:
                t["cluster_figures"] = figures[str(c)]
            if contents[str(m)] is not None:
                t["model_file"] = contents[str(m)]
            t["task_id"] = hashlib.sha256(json.dumps(t, sort_keys=True, default=str).encode()).hexdigest()[:16]
            out.append(t)
        return out


def _manifest_digests(folders: dict) -> dict:
    """Per model folder (live version), the sha256 of its manifest (which holds every model file's hash, or the
    model itself); "absent" for a folder without one (the power model's analytical fallback)."""
    from wattcast.models.selection import manifest_path

    def digest(k: str, v: Any) -> str:
        f = manifest_path(k, v)
        return hashlib.sha256(f.read_bytes()).hexdigest()[:16] if f.is_file() else "absent"

    return {k: digest(k, v) for k, v in sorted(folders.items())}


def _shipped_folder(kind: str) -> str:
    """The shipped ``kind`` model's folder (``models/artifacts/``, itself the live version)."""
    from wattcast.models import collectives, kernel_bundle, power

    return str({"models": kernel_bundle, "collectives": collectives, "power_model": power}[kind].shipped_folder())


@lru_cache(maxsize=1)
def _code_digest() -> str:
    """sha256 (16 hex digits) of the wattcast package's Python sources, read once per process: a sweep resumed after a
    code change that moves predictions recomputes (the version alone stays 0.1.0 across stops)."""
    import wattcast

    h = hashlib.sha256()
    roots = {Path(wattcast.__file__).resolve().parent}
    for sub in ("data", "featurize", "models", "simulate", "lifecycle", "planning"):
        mod = __import__(f"wattcast.{sub}", fromlist=["__file__"])
        roots.add(Path(mod.__file__).resolve().parent)
    for root in sorted(roots):
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _package_version() -> str:
    """The running wattcast's version (``wattcast.__version__``, as pyproject.toml's)."""
    import wattcast

    return str(wattcast.__version__)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cluster_fingerprint(cluster: Any) -> str | None:
    """A digest of what a cluster file resolves to: its figures (the file as read, so a comment does not count) and,
    when it names its GPU by a spec file (``device: my_gpu.yaml``), that spec's figures; None for a preset name
    (whose figures are wattcast's own) or a cluster that does not resolve (the spec check refuses it first)."""
    from wattcast.data.catalog import SPEC_SUFFIXES, load_spec_file
    from wattcast.data.cluster_spec import ClusterSpec, resolve_cluster

    if not isinstance(cluster, ClusterSpec):
        p = Path(str(cluster))
        if not (p.suffix.lower() in (".yaml", ".yml", ".json") or p.is_file()):
            return None  # a preset name
    try:
        c = cluster if isinstance(cluster, ClusterSpec) else resolve_cluster(cluster)
    except (ValueError, OSError):
        return None
    d = c.to_dict()
    dev = Path(str(c.device)).expanduser()
    if dev.suffix.lower() in SPEC_SUFFIXES and dev.is_file():
        d["device_spec"] = load_spec_file(dev).to_dict()
    return _digest(d)


def model_fingerprint(model: Any) -> str | None:
    """A digest of a model file's bytes (an ONNX file, a ``config.json``, or a model folder's ``config.json``); None
    for a built-in name or Hub id."""
    p = Path(str(model)).expanduser()
    f = p / "config.json" if p.is_dir() else p
    if not f.is_file():
        return None
    return hashlib.sha256(f.read_bytes()).hexdigest()[:16]


def _as_list(key: str, v: Any) -> tuple:
    items = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    if not items:
        raise SweepSpecError(f"sweep spec: '{key}' is an empty list; give at least one {SPEC_KEYS[key].split(' (')[0]}")
    return items


def _unique(key: str, values: tuple, canon: Callable[[Any], Any], notes: list) -> tuple:
    """``values`` without the repeats of one value (as ``canon`` names it), first seen kept; each repeat noted."""
    seen: dict = {}
    for v in values:
        k = canon(v)
        if k in seen:
            notes.append(f"'{key}': {v!r} repeats {seen[k]!r}" + (f" (both {k})" if str(k) not in (str(v), str(seen[k]))
                                                                  else "") + ": run once")
        else:
            seen[k] = v
    return tuple(seen.values())


def _cluster_key(c: Any) -> Any:
    """A cluster as it resolves (a preset's canonical name, a file's figures); as given when it does not resolve (the
    spec check names it)."""
    from wattcast.data.cluster_spec import resolve_cluster

    try:
        cl = resolve_cluster(c)
    except Exception:  # noqa: BLE001 - _resolve_names refuses it, naming it
        return ("as given", str(c))
    return cl.name if cluster_fingerprint(c) is None else (cl.name, cluster_fingerprint(c))


def _region_key(r: Any) -> Any:
    """A region as the grid table names it (``FR`` and ``FRA`` are one); as given when unknown or None."""
    if r is None:
        return None
    from wattcast.data.carbon import grid_intensity

    try:
        return grid_intensity(str(r)).region
    except (ValueError, KeyError):
        return ("as given", str(r))


def _count(key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or int(v) < 1:
        raise SweepSpecError(f"sweep spec: '{key}' must be a positive whole number, got {v!r}")
    return int(v)


def load_spec(source: str | Path | dict) -> SweepSpec:
    """A validated :class:`SweepSpec` from a YAML/JSON file or a dict; models, clusters and regions are resolved
    here, before any task runs. A figure outside its plausible range (a price of 350 USD/GPU-h, a cluster file's NIC in
    Tbit/s) is a :class:`SweepSpecError` naming the key, without the ``--force`` that ``search`` offers: ``wattcast
    sweep`` has no such switch, and the tasks run in other processes."""
    from wattcast.data.checks import without_force_hint

    try:
        return _load_spec(source)
    except SweepSpecError as e:
        raise SweepSpecError(without_force_hint(str(e))) from None


def _load_spec(source: str | Path | dict) -> SweepSpec:
    """:func:`load_spec`'s work."""
    if isinstance(source, dict):
        raw, where = dict(source), "sweep spec"
    else:
        import yaml

        from wattcast.data.checks import yaml_load_unique

        path = Path(source)
        if not path.is_file():
            raise SweepSpecError(f"sweep spec {path} is not a file")
        try:
            raw = yaml_load_unique(path.read_text(encoding="utf-8"))  # a key given twice is refused, naming it
        except yaml.YAMLError as e:
            raise SweepSpecError(f"sweep spec {path} is not valid YAML ({e})") from None
        where = str(path)
        if not isinstance(raw, dict):
            raise SweepSpecError(f"sweep spec {path}: expected a mapping of keys ({', '.join(SPEC_KEYS)})")
    unknown = sorted(set(raw) - set(SPEC_KEYS))
    if unknown:
        hints = [f"{k!r}" + did_you_mean(k, SPEC_KEYS, " (did you mean {}?)", quote=True, n=1) for k in unknown]
        raise SweepSpecError(f"{where}: unknown key(s) {', '.join(hints)}; known: {', '.join(SPEC_KEYS)}")
    for k in ("models", "clusters", "gpus", "batch", "seq"):
        if k not in raw:
            raise SweepSpecError(f"{where}: missing key '{k}' ({SPEC_KEYS[k]})")
    models, clusters = _as_list("models", raw["models"]), _as_list("clusters", raw["clusters"])
    gpus = tuple(_count("gpus", g) for g in _as_list("gpus", raw["gpus"]))
    regions = _as_list("regions", raw["regions"]) if raw.get("regions") is not None else (None,)
    # a value given twice (gpus: [8, 8], a preset alias or another spelling of a cluster or region) would run the
    # same search twice: kept once, in first-seen order, and said
    notes = []
    models, clusters, gpus, regions = (_unique(key, vals, canon, notes) for key, vals, canon in (
        ("models", models, str), ("clusters", clusters, _cluster_key), ("gpus", gpus, int),
        ("regions", regions, _region_key)))
    tokens = raw.get("tokens")
    if tokens is not None:
        try:
            tokens = float(tokens)
        except (TypeError, ValueError):
            raise SweepSpecError(f"{where}: 'tokens' must be a number, got {raw['tokens']!r}") from None
        if not tokens > 0:
            raise SweepSpecError(f"{where}: 'tokens' must be above 0, got {raw['tokens']!r}")
    if regions != (None,) and tokens is None:
        raise SweepSpecError(f"{where}: 'regions' price and weigh a whole run: give 'tokens' (the run length) too")
    space = raw.get("space") or {}
    if not isinstance(space, dict):
        raise SweepSpecError(f"{where}: 'space' must be a mapping of search options, got {space!r}")
    routing = raw.get("moe_routing") or {}
    if not isinstance(routing, dict):
        raise SweepSpecError(f"{where}: 'moe_routing' must be a mapping ({SPEC_KEYS['moe_routing']}), got {routing!r}")
    per_node = raw.get("gpus_per_node")
    z3 = raw.get("zero3_prefetch")
    if z3 is not None and not isinstance(z3, bool):
        raise SweepSpecError(f"{where}: 'zero3_prefetch' must be true or false, got {z3!r}")
    compiled = raw.get("compile", False)
    if not isinstance(compiled, bool):
        raise SweepSpecError(f"{where}: 'compile' must be true or false, got {compiled!r}")
    sg = raw.get("scatter_gather_p2p")
    if sg is not None and not isinstance(sg, bool):
        raise SweepSpecError(f"{where}: 'scatter_gather_p2p' must be true or false, got {sg!r}")
    reduce_dtype = raw.get("fsdp_reduce_dtype")
    if reduce_dtype is not None:
        from wattcast.featurize.workload import canonical_framework
        from wattcast.simulate.distributed import checked_fsdp_reduce_dtype

        try:
            checked_fsdp_reduce_dtype(canonical_framework(str(raw.get("framework", "hf"))), reduce_dtype)
        except ValueError as e:
            raise SweepSpecError(f"{where}: 'fsdp_reduce_dtype': {e}") from None
    accum_dtype = raw.get("grad_accum_dtype")
    bf16_reduce = raw.get("grad_reduce_in_bf16")
    if bf16_reduce is not None and not isinstance(bf16_reduce, bool):
        raise SweepSpecError(f"{where}: 'grad_reduce_in_bf16' must be true or false, got {bf16_reduce!r}")
    if bf16_reduce:  # Megatron-LM's flag (framework megatron): the bf16 of the one gradient-accumulation dtype
        from wattcast.simulate.distributed import folded_grad_accum_dtype

        try:
            accum_dtype = folded_grad_accum_dtype(str(raw.get("framework", "hf")), accum_dtype, bf16_reduce,
                                                  accum_name="'grad_accum_dtype'", bf16_name="'grad_reduce_in_bf16'",
                                                  fsdp_name="'fsdp_reduce_dtype'")
        except ValueError as e:
            raise SweepSpecError(f"{where}: {e}") from None
    if accum_dtype is not None:
        from wattcast.featurize.workload import canonical_framework
        from wattcast.simulate.distributed import checked_grad_accum_dtype

        try:
            accum_dtype = checked_grad_accum_dtype(canonical_framework(str(raw.get("framework", "hf"))), accum_dtype)
        except ValueError as e:
            raise SweepSpecError(f"{where}: 'grad_accum_dtype': {e}") from None
    fp8_recipe = raw.get("fp8_recipe")
    if fp8_recipe is not None:  # search's check: a known name, with dtype fp8 (featurize.workload.fp8_recipe_option)
        from wattcast.featurize.workload import checked_dtype, fp8_recipe_option

        try:
            fp8_recipe = fp8_recipe_option(fp8_recipe, checked_dtype(str(raw.get("dtype", "bf16"))))
        except ValueError as e:
            raise SweepSpecError(f"{where}: 'fp8_recipe': {e}") from None
    dispatcher = raw.get("moe_token_dispatcher")
    if dispatcher is not None:  # search's check (featurize.workload.moe_dispatcher_option)
        from wattcast.featurize.workload import moe_dispatcher_option

        try:
            dispatcher = moe_dispatcher_option(dispatcher)
        except ValueError as e:
            raise SweepSpecError(f"{where}: 'moe_token_dispatcher': {e}") from None
    ce_fusion, ce_impl = raw.get("cross_entropy_loss_fusion"), raw.get("cross_entropy_fusion_impl")
    if ce_fusion is not None or ce_impl is not None:  # the checks search makes (featurize.workload.ce_fusion_options)
        from wattcast.featurize.workload import canonical_framework, ce_fusion_options

        fw = canonical_framework(str(raw.get("framework", "hf")))
        if ce_fusion is not None and not isinstance(ce_fusion, bool):
            raise SweepSpecError(f"{where}: 'cross_entropy_loss_fusion' must be true or false, got {ce_fusion!r}")
        try:
            ce_fusion_options(ce_fusion, "native", fw)
        except ValueError as e:
            raise SweepSpecError(f"{where}: 'cross_entropy_loss_fusion': {e}") from None
        if ce_impl is not None:
            try:
                ce_impl = ce_fusion_options(ce_fusion, ce_impl, fw)["cross_entropy_fusion_impl"]
            except ValueError as e:
                raise SweepSpecError(f"{where}: 'cross_entropy_fusion_impl': {e}") from None
    from wattcast.simulate.data_loading import check_load_ms, resolve_workers

    try:
        load_ms = check_load_ms(raw.get("data_load_ms", 0.0))
        data_workers = raw.get("data_workers")
        if data_workers is not None:
            resolve_workers("hf", data_workers)
    except ValueError as e:
        raise SweepSpecError(f"{where}: {e}") from None
    optimizer, optimizer_impl = _optimizer_options(raw, where)
    from wattcast.planning.search import checked_memory_headroom_gb

    try:
        headroom_gb = checked_memory_headroom_gb(raw.get("memory_headroom_gb", 0.0))
    except ValueError as e:
        raise SweepSpecError(f"{where}: {e}") from None
    first, last = raw.get("pp_first_stage_layers"), raw.get("pp_last_stage_layers")
    if first is not None or last is not None:  # search's check (a whole number >= 1, a pp > 1 choice, the framework)
        from wattcast.planning.search import _choices, check_stage_layers_option

        try:
            pps = _choices("pp", space.get("pp"))
        except ValueError:  # a bad pp choice is the search's to name
            pps = None
        try:
            check_stage_layers_option(first, last, str(raw.get("framework", "hf")), pps, 0)
        except ValueError as e:
            raise SweepSpecError(f"{where}: {e}") from None
    run_opts = _run_options(raw, tokens, where)
    folders = raw.get("model_folders") or {}
    if not isinstance(folders, dict) or set(folders) - set(MODEL_FOLDER_KEYS):
        raise SweepSpecError(f"{where}: 'model_folders' must be a mapping of {', '.join(MODEL_FOLDER_KEYS)} to folders, "
                             f"got {folders!r}")
    spec = SweepSpec(models=models, clusters=clusters, gpus=gpus, batch=_count("batch", raw["batch"]),
                     seq=_count("seq", raw["seq"]), regions=regions, tokens=tokens,
                     dtype=str(raw.get("dtype", "bf16")), attention=str(raw.get("attention", "flash")),
                     framework=str(raw.get("framework", "hf")), objective=str(raw.get("objective", "time")),
                     top=_count("top", raw.get("top", 1)), max_configs=_count("max_configs", raw.get("max_configs", 500)),
                     space=dict(space), output=raw.get("output"), moe_routing=dict(routing),
                     gpus_per_node=None if per_node is None else _count("gpus_per_node", per_node),
                     zero3_prefetch=z3, scatter_gather_p2p=sg, compile=compiled, fsdp_reduce_dtype=reduce_dtype,
                     grad_accum_dtype=accum_dtype, fp8_recipe=fp8_recipe, moe_token_dispatcher=dispatcher,
                     cross_entropy_loss_fusion=ce_fusion, cross_entropy_fusion_impl=ce_impl, data_load_ms=load_ms, data_workers=data_workers,
                     optimizer=optimizer, optimizer_impl=optimizer_impl, memory_headroom_gb=headroom_gb,
                     pp_first_stage_layers=first, pp_last_stage_layers=last,
                     overlaps=_overlaps_option(raw, where),
                     model_folders={k: v for k, v in folders.items() if v is not None}, footprint=run_opts,
                     notes=tuple(notes))
    _resolve_names(spec, where)
    return spec


def _overlaps_option(raw: dict, where: str) -> dict:
    """The spec's ``overlaps``: a mapping of Megatron-Core's overlap flags (simulate.overlap.OVERLAP_FLAGS) to true or
    false, checked here (an unknown flag or a non-boolean value is named); {} when absent. Whether a flag applies to a
    strategy (framework, TP with SP, ZeRO, experts, interleaving) is search's check, made when the task runs."""
    from wattcast.simulate.overlap import OVERLAP_FLAGS

    given = raw.get("overlaps")
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise SweepSpecError(f"{where}: 'overlaps' must be a mapping of {', '.join(OVERLAP_FLAGS)} to true or false, "
                             f"got {given!r}")
    unknown = sorted(set(map(str, given)) - set(OVERLAP_FLAGS))
    if unknown:
        raise SweepSpecError(f"{where}: 'overlaps': unknown flag(s) {', '.join(unknown)}; known: {', '.join(OVERLAP_FLAGS)}")
    bad = {k: v for k, v in given.items() if not isinstance(v, bool)}
    if bad:
        raise SweepSpecError(f"{where}: 'overlaps': each flag must be true or false, got {bad!r}")
    return dict(given)


def _optimizer_options(raw: dict, where: str) -> tuple[str | None, str | None]:
    """The spec's ``optimizer`` and ``optimizer_impl`` (None where not given), checked as search checks them
    (featurize.training_graph.optimizer_key / optimizer_impl_key, with the spec's framework)."""
    opt, impl = raw.get("optimizer"), raw.get("optimizer_impl")
    if opt is None and impl is None:
        return None, None
    from wattcast.featurize.training_graph import optimizer_impl_key, optimizer_key
    from wattcast.featurize.workload import canonical_framework

    if opt is not None:
        try:
            opt = optimizer_key(str(opt))  # canonical ("adam" is costed as AdamW: one task id for both)
        except ValueError as e:
            raise SweepSpecError(f"{where}: 'optimizer': {e}") from None
    if impl is not None and opt == "none":
        raise SweepSpecError(f"{where}: 'optimizer_impl': optimizer 'none' runs no step; drop 'optimizer_impl'")
    if impl is not None:
        try:
            impl = optimizer_impl_key(str(impl), canonical_framework(str(raw.get("framework", "hf"))), opt or "adamw")
        except ValueError as e:
            raise SweepSpecError(f"{where}: 'optimizer_impl': {e}") from None
    return opt, impl


def _run_options(raw: dict, tokens, where: str) -> dict:
    """The spec's ``footprint`` mapping and ``cloud_usd_per_gpu_hour`` as one footprint_kw (checked as search checks
    it), refused without tokens and for a region (the spec's ``regions`` give those)."""
    opts = raw.get("footprint") or {}
    if not isinstance(opts, dict):
        raise SweepSpecError(f"{where}: 'footprint' must be a mapping of run options ({SPEC_KEYS['footprint']}), got {opts!r}")
    opts = dict(opts)
    if "region" in opts:
        raise SweepSpecError(f"{where}: 'footprint': give the region(s) in 'regions', not in 'footprint'")
    price = raw.get("cloud_usd_per_gpu_hour")
    if price is not None:
        if "cloud_usd_per_gpu_hour" in opts and opts["cloud_usd_per_gpu_hour"] != price:
            raise SweepSpecError(f"{where}: 'cloud_usd_per_gpu_hour' given twice with different values (top level "
                                 f"{price!r}, footprint {opts['cloud_usd_per_gpu_hour']!r})")
        opts["cloud_usd_per_gpu_hour"] = price
    if "cloud_usd_per_gpu_hour" in opts:
        v = opts["cloud_usd_per_gpu_hour"]
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise SweepSpecError(f"{where}: 'cloud_usd_per_gpu_hour' must be a number (USD per GPU-hour), got {v!r}") from None
        if not v > 0 or v != v or v == float("inf"):
            raise SweepSpecError(f"{where}: 'cloud_usd_per_gpu_hour' must be above 0 and finite, got {v!r}")
        opts["cloud_usd_per_gpu_hour"] = v
    if opts and tokens is None:
        raise SweepSpecError(f"{where}: {', '.join(sorted(opts))} describe a whole run: give 'tokens' (the run length) too")
    from wattcast.planning.search import check_footprint_kw

    try:
        check_footprint_kw(opts or None)
    except ValueError as e:
        raise SweepSpecError(f"{where}: 'footprint': {e}") from None
    # each value checked here as search checks it (lifecycle.assumptions: range, plausibility), naming the spec key, so
    # a price of 350 USD/GPU-h or a PUE of 0.5 is a spec error, not a sweep of tasks ending in status error
    from wattcast.lifecycle.assumptions import check_run_options

    top = price is not None

    def key(k: str) -> str:
        return f"'{k}'" if k == "cloud_usd_per_gpu_hour" and top else f"'footprint.{k}'"

    try:
        check_run_options(opts, label=key)
    except ValueError as e:
        raise SweepSpecError(f"{where}: {e}") from None
    return opts


def _resolve_names(spec: SweepSpec, where: str) -> None:
    """Every model, cluster and region exists and every search option is known, before any task runs."""
    from wattcast.data.cluster_spec import resolve_cluster
    from wattcast.featurize.workload import StepOptions
    from wattcast.planning.search import SPACE_DEFAULTS

    bad = sorted(set(spec.space) - set(SPACE_DEFAULTS))
    if bad:
        raise SweepSpecError(f"{where}: unknown search option(s) {bad} in 'space'; known: {', '.join(SPACE_DEFAULTS)}")
    from wattcast.planning.search import check_space_choices

    try:  # every element of every option, as search checks it: else each task would end with status error
        check_space_choices(spec.space)
    except ValueError as e:
        raise SweepSpecError(f"{where}: 'space': {e}") from None
    if spec.objective not in ("time", "cost", "tco", "co2e", "energy"):
        raise SweepSpecError(f"{where}: 'objective' must be time, cost, tco, co2e or energy, got {spec.objective!r}")
    try:
        StepOptions(dtype=spec.dtype, attention=spec.attention, framework=spec.framework).validated()
    except ValueError as e:
        raise SweepSpecError(f"{where}: {e}") from None
    from wattcast.planning.search import check_zero3_prefetch_space

    try:  # search's own rule, said in the spec's keys: else every task would end with status error
        check_zero3_prefetch_space(spec.zero3_prefetch, spec.framework, spec.space.get("zero"))
    except ValueError as e:
        raise SweepSpecError(f"{where}: 'zero3_prefetch': {e}: add 3 to the zeros of 'space' (space: {{zero: [..., 3]}}) "
                             "or leave 'zero3_prefetch' out") from None
    from wattcast.data.cluster_spec import using_gpus_per_node
    from wattcast.simulate.moe_routing import check_routing

    try:
        check_routing(spec.moe_routing)
    except ValueError as e:
        raise SweepSpecError(f"{where}: moe_routing: {e}") from None
    for c in spec.clusters:
        try:
            using_gpus_per_node(resolve_cluster(c), spec.gpus_per_node)
        except Exception as e:  # noqa: BLE001 - any failure to resolve is the spec's error, named
            raise SweepSpecError(f"{where}: cluster {c!r}: {e}") from None
    from wattcast.featurize.workload import is_onnx_path
    from wattcast.simulate.distributed import model_config

    for m in spec.models:
        try:
            if not is_onnx_path(m):
                model_config(m)
            elif not Path(m).is_file():
                raise ValueError(f"no such ONNX file {m}")
        except Exception as e:  # noqa: BLE001
            raise SweepSpecError(f"{where}: model {m!r}: {e}") from None
    from wattcast.models.selection import check_folder

    for k, v in spec.model_folders.items():
        try:
            check_folder(k, v, f"model_folders.{k}")
        except ValueError as e:
            raise SweepSpecError(f"{where}: {e}") from None
    if spec.regions != (None,):
        from wattcast.data.carbon import grid_intensity

        for r in spec.regions:
            try:
                grid_intensity(str(r))
            except (ValueError, KeyError) as e:
                raise SweepSpecError(f"{where}: region {r!r}: {e}") from None


def run_task(task: dict) -> pd.DataFrame:
    """One task: a strategy search; its ``top`` best fitting rows (or one row saying why there are none). The search
    runs with the plausibility ranges of the task's own ``allow_exotic`` (set by :func:`run_sweep` from the caller's
    :func:`wattcast.allow_exotic`), not with whatever this process or worker thread happens to have."""
    from wattcast import search
    from wattcast.data.checks import allow_exotic

    t0 = time.time()
    base = {k: task[k] for k in ("task_id", "model", "cluster", "gpus")}
    base["region"] = task["region"] or ""
    found = dict.fromkeys(SEARCH_KEYS, "")  # the search's warnings and unranked clusters (none without a search)
    try:
        kw = dict(dtype=task["dtype"], attention=task["attention"], framework=task["framework"],
                  max_configs=task["max_configs"], objective=task["objective"], **task["space"],
                  moe_routing=task.get("moe_routing"), gpus_per_node=task.get("gpus_per_node"),
                  zero3_prefetch=task.get("zero3_prefetch"), fsdp_reduce_dtype=task.get("fsdp_reduce_dtype"),
                  compile=bool(task.get("compile", False)),
                  scatter_gather_p2p=task.get("scatter_gather_p2p"), grad_accum_dtype=task.get("grad_accum_dtype"),
                  fp8_recipe=task.get("fp8_recipe"), moe_token_dispatcher=task.get("moe_token_dispatcher") or "alltoall",
                  cross_entropy_loss_fusion=task.get("cross_entropy_loss_fusion"),
                  cross_entropy_fusion_impl=task.get("cross_entropy_fusion_impl") or "native",
                  data_load_ms=task.get("data_load_ms", 0.0),
                  data_workers=task.get("data_workers"), optimizer_impl=task.get("optimizer_impl"),
                  memory_headroom_gb=task.get("memory_headroom_gb", 0.0), overlaps=task.get("overlaps") or None,
                  pp_first_stage_layers=task.get("pp_first_stage_layers"),
                  pp_last_stage_layers=task.get("pp_last_stage_layers"),
                  **({"optimizer": task["optimizer"]} if task.get("optimizer") else {}),
                  **(task.get("model_folders") or {}))
        if task["tokens"] is not None:
            run = {**(task.get("footprint") or {}), **({"region": task["region"]} if task["region"] else {})}
            kw.update(tokens=task["tokens"], footprint_kw=run or None)
        with allow_exotic(bool(task.get("allow_exotic", False))):
            res = search(task["model"], task["cluster"], task["gpus"], task["batch"], task["seq"], **kw)
        found = dict(warnings=json.dumps(list(res.warnings)), unranked_clusters=json.dumps(res.unranked_clusters()),
                     dropped_values=json.dumps(list(res.dropped_values), default=str))
        fit = res.ranked[res.ranked["fits"].astype(bool)] if len(res.ranked) else res.ranked
        if len(fit):
            out = fit.head(task["top"]).reset_index(drop=True)
            out.insert(0, "rank", range(1, len(out) + 1))
            status, error = "ok", ""
        elif len(res.ranked):  # strategies were evaluated: memory is what leaves none
            out = pd.DataFrame({"rank": [0]})
            status = "none fits"
            error = f"{len(res.ranked)} strategies evaluated, none fits in memory"
        else:  # every candidate broke a rule (or none was generated): the rules, most common first
            out = pd.DataFrame({"rank": [0]})
            status = NO_VALID_STRATEGY
            why = res.invalid_reason()
            error = f"no valid strategy ({len(res.rejected)} broke a rule)" + (f": {why}" if why else "")
    except (ValueError, RuntimeError) as e:  # a task that cannot run is a row saying why, not a lost sweep
        out, status, error = pd.DataFrame({"rank": [0]}), "error", _in_sweep_terms(str(e))
    out = out.drop(columns=[k for k in base if k in out.columns])  # the search's own cluster name: the task's is kept
    for k, v in reversed(list(base.items())):
        out.insert(0, k, v)
    out["status"], out["error"] = status, error
    for k, v in found.items():
        out[k] = v
    out["task_seconds"] = time.time() - t0
    full = part_columns(task.get("tokens") is not None)  # a task without a result has every column too (empty)
    return out.reindex(columns=full + [c for c in out.columns if c not in full])


def _in_sweep_terms(message: str) -> str:
    """A search's error with, where it names a run option to give, how a sweep spec gives it (and no offer of
    ``--force``, which a sweep does not have: :func:`load_spec`)."""
    from wattcast.data.checks import without_force_hint

    message = without_force_hint(message)
    if "cloud_usd_per_gpu_hour" in message:
        return message + ("; in a sweep spec: the key cloud_usd_per_gpu_hour: USD (every task), or leave out the "
                          "regions with no price")
    return message


def task_homes(tasks: list[dict], workers: list[str]) -> dict[str, list[str]]:
    """A home worker per task id for the Ray backend's actor queues, balancing the load: tasks that share a model go to
    one actor, which builds the model's graphs and caches once (an idle actor still takes work from the longest queue).
    The grouping is the coarsest of model, (model, cluster), (model, cluster, gpus) that gives every worker work.
    Empty with fewer than two workers."""
    if len(workers) < 2:
        return {}
    for keys in (("model",), ("model", "cluster"), ("model", "cluster", "gpus"), ("task_id",)):
        groups: dict[tuple, list[str]] = {}
        for t in tasks:
            groups.setdefault(tuple(str(t[k]) for k in keys), []).append(t["task_id"])
        if len(groups) >= len(workers):
            break
    load = {w: 0 for w in workers}
    home = {}
    for _, ids in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):  # largest first onto the least loaded
        w = min(workers, key=lambda a: (load[a], a))
        load[w] += len(ids)
        home.update({i: [w] for i in ids})
    return home


#: a part's file name: part-<task id, 16 hex digits>.parquet (a user's part-mine.parquet is not one)
_SWEEP_PART = re.compile(r"part-[0-9a-f]{16}\.parquet")


def _part_path(folder: Path, task_id: str) -> Path:
    return folder / f"part-{task_id}.parquet"


#: the file in a sweep's output folder recording the spec its parts are of and the code/model versions that wrote them
#: (a leading "_": pyarrow's dataset read, ``pandas.read_parquet(OUT)``, skips it)
FOLDER_RECORD = "_wattcast_sweep.json"
#: the columns naming a task's place in the sweep (one task per key)
TASK_KEY = ("model", "cluster", "gpus", "region")


#: task dict keys that are not settings of the task: its place (:data:`TASK_KEY`), its id, and the code and model
#: versions that answer it (those are in the id, not in :func:`task_settings_digest`)
# (nor what a cluster or model file says: an edited file recomputes its tasks, as a code or model change does; the
# settings digest tells a changed spec, whose old results prepare_folder keeps unless --overwrite)
_NOT_SETTINGS = (*TASK_KEY, "task_id", "model_manifests", "wattcast_version", "wattcast_code", "cluster_figures",
                 "model_file")


@functools.cache
def _field_defaults() -> dict:
    """Each :class:`SweepSpec` field's default (the required ones left out)."""
    import dataclasses

    out = {}
    for f in dataclasses.fields(SweepSpec):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal as a spec reads them (a list and a tuple of the same items are the same)."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def spec_digest(spec: SweepSpec) -> str:
    """A digest of what a spec asks for: the fields that differ from their defaults (so a field a later version adds,
    with a default, leaves every older spec's digest as it was), but ``output``; model folders as the absolute paths
    given, by the spec or the environment. Recorded in the folder for information: parts are judged per task
    (:func:`task_settings_digest`, :func:`prepare_folder`)."""
    from wattcast.models.selection import KINDS as _KINDS

    defaults = _field_defaults()
    d = {k: getattr(spec, k) for k in spec.__dataclass_fields__ if k not in ("output", "model_folders")
         and not (k in defaults and _same(getattr(spec, k), defaults[k]))}
    folders = {k: spec.model_folders.get(k) or os.environ.get(_KINDS[k][0], "").strip() or None for k in MODEL_FOLDER_KEYS}
    folders = {k: str(Path(v).expanduser().resolve()) for k, v in sorted(folders.items()) if v}
    if folders:
        d["model_folders"] = folders
    return _digest(d)


def task_settings_digest(task: dict) -> str:
    """A digest of what one task asks for besides its place: the spec's settings it runs with (those at their
    defaults left out), the model folders and what a cluster/model file says; not the code or model versions. Its id
    hashes all of these and those versions, so a part whose id is the task's has the task's settings."""
    defaults = _field_defaults()
    return _digest({k: v for k, v in task.items() if k not in _NOT_SETTINGS
                    and not (k in defaults and _same(v, defaults[k]))})


def _task_key(task: dict) -> tuple:
    return (str(task["model"]), str(task["cluster"]), int(task["gpus"]), str(task["region"] or ""))


def _part_keys(folder: Path, ids) -> dict[str, tuple]:
    """The task key of each part ``ids`` in ``folder`` (read from the part's own columns)."""
    out = {}
    for i in ids:
        row = pd.read_parquet(_part_path(folder, i), columns=list(TASK_KEY)).head(1)
        out[i] = _task_key(row.iloc[0].to_dict()) if len(row) else None
    return out


def _read_record(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _write_record(out: Path, record: dict) -> None:
    """``record`` as ``out``'s :data:`FOLDER_RECORD`: written under a temporary name, then renamed (whole or absent)."""
    tmp = out / f".{FOLDER_RECORD}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, out / FOLDER_RECORD)


def part_status(frame: pd.DataFrame) -> dict:
    """What the folder record keeps of a written part (under its task's ``"part"``): how many of its rows say status
    error and their distinct messages, in row order (a resume lists the first, as reading the part would)."""
    bad = frame.loc[frame["status"] == "error", "error"].map(str)
    return {"error_rows": int(len(bad)), "errors": list(dict.fromkeys(bad))}


def _part_error(folder: Path, task_id: str, entries: dict | None = None) -> str | None:
    """The ``error`` of a part whose task ended with status error, else None: from the folder record's ``entries``
    when it holds the part's status (:func:`part_status`), else read from the part (a folder written before the
    record kept it, or a run stopped before it flushed)."""
    entry = (entries or {}).get(task_id)
    status = entry.get("part") if isinstance(entry, dict) else None
    if isinstance(status, dict) and isinstance(status.get("errors"), list):
        return str(status["errors"][0]) if status["errors"] else None
    try:
        df = pd.read_parquet(_part_path(folder, task_id), columns=["status", "error"])
    except Exception:  # noqa: BLE001 - an unreadable part is read_sweep's to report
        return None
    bad = df[df["status"] == "error"]
    return str(bad["error"].iloc[0]) if len(bad) else None


def prepare_folder(out: Path, spec: SweepSpec, tasks: list[dict], overwrite: bool = False) -> dict[str, list[str]]:
    """Check ``out`` against ``spec``'s tasks before anything runs and record them in it (:data:`FOLDER_RECORD`: per
    task id its place and :func:`task_settings_digest`, and the code and model versions).

    Judged per task, by its place (model, cluster, GPU count, region): a part whose id is a task's is reused (same
    settings, code and models); a part of one of the spec's places under another id (other settings, or other code or
    model versions) is stale: returned per current task id, to be replaced once that task's new part is written (at once
    when it is there already), so every place has one part; a place whose recorded settings differ (the spec changed,
    not only the code or models) is refused unless ``overwrite``, as is a part of a place the spec does not have
    (:class:`SweepSpecError`) unless ``overwrite``, which removes every part first: a spec extended with more tasks
    reuses the parts it shares, one that leaves tasks out does not delete theirs unasked."""
    return _prepare_folder(out, spec, tasks, overwrite)[0]


def _prepare_folder(out: Path, spec: SweepSpec, tasks: list[dict], overwrite: bool) -> tuple[dict, set, dict, list]:
    """:func:`prepare_folder`'s work: the stale parts per task id, the task ids whose part is in ``out`` once it is
    done, the record it wrote (so :func:`run_sweep` lists the folder once and reads the parts' statuses from it) and
    the part files ``overwrite`` removed (names, sorted)."""
    ids = {t["task_id"] for t in tasks}
    have = done_tasks(out)
    record_path = out / FOLDER_RECORD
    record = _read_record(record_path)
    # a file the sweep did not write (not a part-<16 hex>.parquet, not a name pyarrow's dataset read skips: a leading
    # "_" or "."): pandas.read_parquet(OUT) would fail on it, so the folder is refused, naming it, unless --overwrite
    # (which keeps it: only the sweep's own parts are ever removed)
    others = sorted(p.name for p in out.iterdir() if not (_SWEEP_PART.fullmatch(p.name) or p.name[:1] in "_.")) \
        if out.is_dir() else []
    if others and not overwrite:
        raise SweepSpecError(f"output {out} holds files a sweep did not write ({', '.join(others[:5])}"
                             + (f" and {len(others) - 5} more" if len(others) > 5 else "") + "), which "
                             "pandas.read_parquet(OUT) cannot read: give a new output folder (--output), or --overwrite "
                             "to write beside them (they are kept)")
    removed: list[str] = []  # the parts --overwrite removes, named to the caller (wattcast sweep prints them)
    if overwrite:  # only the parts this folder's record says a sweep wrote (its own naming and record)
        recorded = set((record or {}).get("tasks") or {})
        for i in sorted(have & recorded):
            _part_path(out, i).unlink(missing_ok=True)
            removed.append(_part_path(out, i).name)
        have = have - recorded
    foreign = sorted(have - ids)
    recorded = (record or {}).get("tasks") or {}
    keys = {i: tuple(recorded[i]["key"]) for i in foreign
            if isinstance(recorded.get(i), dict) and isinstance(recorded[i].get("key"), list)}
    keys.update(_part_keys(out, [i for i in foreign if i not in keys]))
    by_key = {_task_key(t): t["task_id"] for t in tasks}
    outside = [i for i in foreign if keys[i] not in by_key]
    if outside:
        eg = keys[outside[0]]
        eg = "unreadable part" if eg is None else (f"{eg[0]} on {eg[2]} x {eg[1]}" + (f", region {eg[3]}" if eg[3] else ""))
        raise SweepSpecError(f"output {out} holds {len(outside)} part(s) of tasks this spec does not have (e.g. {eg})"
                             + ("" if record is not None else ", with no record of the spec that wrote them")
                             + ": give a new output folder (--output), put those tasks back in the spec, or "
                             "--overwrite (run_sweep(overwrite=True)) to remove every part and write this spec's")
    # a place whose recorded settings differ from the spec's (not only the code or model versions): the user changed
    # the spec, so its old results are kept unless --overwrite (a code or model change alone recomputes them)
    settings = {t["task_id"]: task_settings_digest(t) for t in tasks}
    # (a part with no recorded settings, from a folder written before the record or the per-task one, cannot be told
    # apart from a changed spec: refused too, once; --overwrite or a new folder)
    changed = [i for i in foreign if not isinstance(recorded.get(i), dict) or recorded[i].get("settings") is None
               or recorded[i]["settings"] != settings[by_key[keys[i]]]]
    if changed:
        eg = keys[changed[0]]
        eg = f"{eg[0]} on {eg[2]} x {eg[1]}" + (f", region {eg[3]}" if eg[3] else "")
        raise SweepSpecError(f"output {out} holds {len(changed)} part(s) of this spec's tasks run with other settings "
                             f"{'' if all(isinstance(recorded.get(i), dict) for i in changed) else '(or unrecorded ones) '}"
                             f"(e.g. {eg}): give a new output folder (--output) to keep both, or --overwrite "
                             "(run_sweep(overwrite=True)) to remove every part and write this spec's")
    out.mkdir(parents=True, exist_ok=True)
    first = tasks[0] if tasks else {}
    entries = {i: e for i, e in recorded.items() if i in have and i not in ids}  # stale parts, until replaced
    entries.update({t["task_id"]: {"key": list(_task_key(t)), "settings": settings[t["task_id"]]} for t in tasks})
    for i in have & ids:  # a part already there keeps the status recorded when it was written (its id fixes its rows)
        if isinstance(recorded.get(i), dict) and "part" in recorded[i]:
            entries[i]["part"] = recorded[i]["part"]
    record = {"spec_digest": spec_digest(spec), "wattcast_version": first.get("wattcast_version"),
              "wattcast_code": first.get("wattcast_code"), "model_manifests": first.get("model_manifests"),
              "tasks": entries}
    _write_record(out, record)
    stale: dict[str, list[str]] = {}
    for old in foreign:
        new = by_key[keys[old]]
        if new in have:
            _part_path(out, old).unlink(missing_ok=True)
            have.discard(old)
        else:
            stale.setdefault(new, []).append(old)
    return stale, have, record, removed


def write_part(folder: Path, task_id: str, frame: pd.DataFrame) -> Path:
    """One task's rows as its own part: written under a temporary name, then renamed (whole or absent)."""
    folder.mkdir(parents=True, exist_ok=True)
    final = _part_path(folder, task_id)
    tmp = folder / f".tmp-{task_id}-{os.getpid()}.parquet"
    frame, schema = _part_frame(frame)
    frame.to_parquet(tmp, index=False, schema=schema)
    os.replace(tmp, final)
    return final


def done_tasks(folder: Path) -> set[str]:
    """Task ids whose part is already in ``folder`` (a rerun skips them)."""
    if not folder.is_dir():
        return set()
    return {p.stem[len("part-"):] for p in folder.glob("part-*.parquet") if _SWEEP_PART.fullmatch(p.name)}


def read_sweep(folder: str | Path) -> pd.DataFrame:
    """Every part of a sweep's output folder as one table."""
    parts = sorted(p for p in Path(folder).glob("part-*.parquet") if _SWEEP_PART.fullmatch(p.name))  # not a user's
    if not parts:
        return pd.DataFrame(columns=list(TASK_COLUMNS))
    df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    keys = [c for c in ("model", "cluster", "gpus", "region", "rank") if c in df.columns]
    return df.sort_values(keys, kind="stable").reset_index(drop=True)


@dataclass
class SweepOutcome:
    output: Path
    total: int
    skipped: int
    ran: int
    #: every task without a result, one dict each (task_id, model, cluster, gpus, region, status, error): status
    #: "error" for a task whose part says it could not run (this run's or an earlier one's), "failed" for one whose
    #: run raised or whose workers were lost (no part: a rerun retries it). ``wattcast sweep --json`` lists these as
    #: ``failed``
    failed_tasks: list = field(default_factory=list)
    seconds: float = 0.0
    #: the part files (names in ``output``) that ``overwrite`` removed before the run, sorted
    removed_parts: list = field(default_factory=list)


def _failure(task: dict, status: str, error: str) -> dict:
    """A :attr:`SweepOutcome.failed_tasks` entry, from the task's own dict."""
    return dict(task_id=task["task_id"], model=str(task["model"]), cluster=str(task["cluster"]), gpus=int(task["gpus"]),
                region=str(task["region"] or ""), status=status, error=str(error))


#: seconds at least between two writes of the folder record while parts are written (each write is the whole record,
#: so one per part would cost O(tasks^2) on a large sweep; it is written once more when the run ends, and a part whose
#: status a killed run did not record is read on resume)
RECORD_FLUSH_S = 2.0

#: where :func:`run_sweep` runs the tasks
BACKENDS = ("dask", "ray")
RAY_INSTALL_HINT = 'pip install "wattcast[ray]"'


class SweepBackendError(RuntimeError):
    """A backend that cannot start (not installed, or options that do not go together); the message says why."""


def import_ray():
    """The ``ray`` module, or a :class:`SweepBackendError` saying how to install it (Ray is an optional extra)."""
    try:
        import ray
    except ImportError as e:
        raise SweepBackendError(f"backend 'ray' needs Ray, which is not installed ({e}); install it with: "
                                f"{RAY_INSTALL_HINT}") from None
    return ray


def _in_process_results(todo: list[dict]):
    """Tasks one by one in this process."""
    for t in todo:
        yield t, run_task(t)


def _dask_results(todo: list[dict], scheduler: str | None, workers: int, client_hook):
    """Tasks on Dask (a LocalCluster of ``workers`` processes, or the scheduler at ``scheduler``), as they finish."""
    from dask.distributed import Client, LocalCluster, as_completed

    cluster = None
    if scheduler is None:
        cluster = LocalCluster(n_workers=max(int(workers), 1), threads_per_worker=1, processes=True,
                               host="127.0.0.1", dashboard_address=None, silence_logs=40)
        client = Client(cluster)
    else:
        client = Client(scheduler)
    try:
        if client_hook:
            client_hook(client)
        # no worker preferences: a model's tasks kept on one Dask worker measured no gain (README, sweep)
        futures = {client.submit(run_task, t, key=f"wattcast-task-{t['task_id']}", retries=2, pure=False): t
                   for t in todo}
        for fut in as_completed(futures):
            t = futures[fut]
            try:
                yield t, fut.result()
            except Exception as e:  # a task whose workers kept dying: recorded, the rest go on  # noqa: BLE001
                yield t, e
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


class TaskRunner:
    """A Ray actor (one long-lived process) that runs tasks; it keeps the graphs and caches of the models it has seen,
    as a Dask worker does."""

    def run(self, task: dict) -> pd.DataFrame:
        return run_task(task)

    def pid(self) -> int:
        return os.getpid()


#: Ray actor restarts, and retries of the task that was running when an actor's process died
RAY_MAX_RESTARTS = 2
RAY_MAX_TASK_RETRIES = 2


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """A ``host:port`` or ``ray://host:port`` Ray address answers a TCP connect (``ray.init`` would retry for minutes);
    ``auto`` and other forms are left to Ray."""
    import socket

    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise SweepBackendError(f"ray_address (--ray-address) {address!r}: nothing answers at {host}:{port} ({e})") from None


def _ray_results(todo: list[dict], address: str | None, workers: int, client_hook):
    """Tasks on a pool of Ray actors, as they finish (``ray.wait``).

    Ray is used as found when ``ray.init`` was already called; else it is started here, at ``address`` (an existing
    cluster) or locally with ``workers`` CPUs, and shut down at the end. One actor per free CPU (an actor holds its CPU
    for its life, so more actors than free CPUs would wait for ever). Tasks that share a model are queued on one actor (:func:`task_homes`), so its graphs and
    caches are built once; an idle actor whose queue is empty takes the last task of the longest queue. An actor whose
    process dies is restarted and its running task retried (``max_restarts``, ``max_task_retries``); a task that
    still fails is recorded and its actor leaves the pool."""
    import logging
    from collections import deque

    ray = import_ray()
    started, actors = False, []
    if ray.is_initialized() and address is not None:
        raise SweepBackendError(f"ray_address (--ray-address) {address!r}: Ray is already initialised in this process "
                                "and cannot switch clusters; call ray.shutdown() first or leave ray_address out")
    if not ray.is_initialized():
        if address is not None:
            try:
                ray.init(address=address, logging_level=logging.WARNING)
            except Exception as e:  # noqa: BLE001 - whatever Ray raises, the address is what is wrong: named
                raise SweepBackendError(f"ray_address (--ray-address) {address!r}: cannot connect to Ray "
                                        f"({type(e).__name__}: {e})") from None
        else:
            ray.init(num_cpus=max(int(workers), 1), include_dashboard=False, logging_level=logging.WARNING)
        started = True
    try:
        free, waited = 0, time.time() + 15  # (a previous sweep's actors hand their CPUs back asynchronously)
        while True:
            free = int(ray.available_resources().get("CPU", 0))  # an actor holds its CPU: more actors than CPUs wait
            if free >= 1 or time.time() > waited:
                break
            time.sleep(0.2)
        if free < 1:
            raise SweepBackendError("the Ray cluster has no free CPU for the sweep's actors (each takes one); "
                                    f"resources now: {ray.available_resources()}")
        n = min(free, len(todo))
        runner = ray.remote(TaskRunner).options(num_cpus=1, max_restarts=RAY_MAX_RESTARTS,
                                                max_task_retries=RAY_MAX_TASK_RETRIES)
        actors = [runner.remote() for _ in range(n)]
        if client_hook:
            client_hook(actors)
        names = [str(i) for i in range(n)]
        home = task_homes(todo, names)
        queues = {i: deque() for i in range(n)}
        for t in todo:
            queues[int(home.get(t["task_id"], ["0"])[0])].append(t)
        alive = set(range(n))

        def next_task(i: int):
            if queues[i]:
                return queues[i].popleft()
            donor = max(sorted(alive), key=lambda j: len(queues[j]))
            return queues[donor].pop() if queues[donor] else None

        running: dict = {}  # object ref -> (actor index, task)

        def dispatch(i: int) -> None:
            t = next_task(i)
            if t is not None:
                running[actors[i].run.remote(t)] = (i, t)

        for i in range(n):
            dispatch(i)
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                i, t = running.pop(ref)
                try:
                    frame = ray.get(ref)
                except ray.exceptions.RayActorError as e:  # died more often than it may restart: out of the pool
                    alive.discard(i)
                    if alive:  # its queue goes to the least loaded survivor
                        queues[min(sorted(alive), key=lambda j: len(queues[j]))].extend(queues[i])
                        queues[i].clear()
                    yield t, e
                    if not alive:  # nothing left to run the rest on
                        rest = [x for q in queues.values() for x in q]
                        for q in queues.values():
                            q.clear()
                        for x in rest:
                            yield x, SweepBackendError("every Ray actor died; task not run (a rerun resumes)")
                    continue
                except Exception as e:  # noqa: BLE001 - the task raised: recorded, the rest go on
                    yield t, e
                else:
                    yield t, frame
                dispatch(i)
    finally:
        for a in actors:  # their CPUs back at once, for the next sweep on a Ray that stays up
            ray.kill(a)
        if started:
            ray.shutdown()


def run_sweep(spec: SweepSpec | str | Path | dict, output: str | Path | None = None, *, scheduler: str | None = None,
              workers: int = 2, progress: Callable[[int, int], None] | None = None,
              client_hook: Callable[[Any], None] | None = None, backend: str = "dask",
              ray_address: str | None = None, models=None, collectives=None, power_model=None,
              overwrite: bool = False, on_removed: Callable[[Path, list[str]], None] | None = None) -> SweepOutcome:
    """Run every task of ``spec`` not already in ``output``; each finished task's rows are written at once.

    ``backend="dask"``: ``scheduler`` is a Dask scheduler address (``tcp://host:8786``); None starts a LocalCluster of
    ``workers`` single-threaded worker processes on localhost. ``backend="ray"`` (the optional extra,
    ``pip install "wattcast[ray]"``): a pool of Ray actors, on the Ray already initialised in this process, else on the
    cluster at ``ray_address``, else on a local Ray with ``workers`` CPUs. ``workers=0`` runs the tasks in this process,
    one by one (no Dask; not with Ray). Every backend goes through the same loop: parts written as tasks finish, the
    same resume and the same rows. ``progress(done, total)`` after every task. ``client_hook`` is called once the
    backend is up, with the Dask client or the list of Ray actor handles (tests use it to kill a worker).
    ``models`` / ``collectives`` / ``power_model``: retrained model folders, over the spec's ``model_folders`` (then
    ``$WATTCAST_MODELS`` ...); every task gets their live versions' paths. ``output`` records the tasks
    (:func:`prepare_folder`): a folder holding parts of tasks the spec does not have is refused unless ``overwrite``
    (which removes its parts), a task whose part is there is skipped, and one whose part is stale (other settings, code
    or models) replaces it as its new part is written, unless the new one says status error (the old part is kept, the
    task listed in ``failed_tasks``). ``on_removed(output, names)``: called once, before any task runs, with the part
    files ``overwrite`` removed (also the outcome's ``removed_parts``). Called inside :func:`wattcast.allow_exotic`,
    every task (on any backend) runs with the plausibility ranges lifted, as the spec was loaded."""
    t0 = time.time()
    if backend not in BACKENDS:
        raise SweepBackendError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "ray":
        if scheduler is not None:
            raise SweepBackendError("scheduler is a Dask scheduler address; with backend 'ray' give ray_address "
                                    "(--ray-address)")
        if workers == 0 and ray_address is None:
            raise SweepBackendError("workers=0 runs the tasks in this process without a backend; with backend 'ray' "
                                    "give workers >= 1 (or use the default backend)")
        import_ray()  # before anything runs: a clear error when the extra is not installed
        if ray_address is not None:
            _check_reachable(ray_address)
    elif ray_address is not None:
        raise SweepBackendError("ray_address (--ray-address) needs backend 'ray' (--backend ray)")
    spec = spec if isinstance(spec, SweepSpec) else load_spec(spec)
    given = ModelFolders(models, collectives, power_model).given()
    if given:
        from dataclasses import replace

        spec = replace(spec, model_folders={**spec.model_folders, **given})
    out = Path(output or spec.output or "sweep.parquet")
    if out.exists() and not out.is_dir():
        raise SweepSpecError(f"output {out} exists and is not a sweep folder")
    from wattcast.data.checks import exotic_allowed

    # the caller's allow_exotic() travels with every task (a context variable stays in this process: Dask workers and
    # Ray actors would run the tasks strict, refusing the figures load_spec accepted here)
    tasks = spec.tasks(allow_exotic=exotic_allowed())
    stale, have, record, removed = _prepare_folder(out, spec, tasks, overwrite)
    if removed and on_removed is not None:
        on_removed(out, removed)
    entries = record["tasks"]
    todo = [t for t in tasks if t["task_id"] not in have]
    skipped = len(tasks) - len(todo)
    done = skipped
    if progress:
        progress(done, len(tasks))
    # the tasks already done whose part says they could not run: failed as much as this run's
    failed: list = [_failure(t, "error", e) for t in tasks if t["task_id"] in have
                    for e in [_part_error(out, t["task_id"], entries)] if e is not None]
    if not todo:
        return SweepOutcome(out, len(tasks), skipped, 0, failed, time.time() - t0, removed)
    if backend == "ray":
        results = _ray_results(todo, ray_address, workers, client_hook)
    elif workers == 0 and scheduler is None:
        results = _in_process_results(todo)
    else:
        results = _dask_results(todo, scheduler, workers, client_hook)
    ran = 0  # tasks whose part this run wrote
    flushed_s = time.monotonic()
    try:  # the one loop every backend shares: write each finished task's part at once
        for t, frame in results:
            if isinstance(frame, BaseException):
                failed.append(_failure(t, "failed", repr(frame)))
                continue
            olds = [o for o in stale.get(t["task_id"], ()) if _part_path(out, o).is_file()]
            bad = frame[frame["status"] == "error"]  # run_task's frames always carry part_columns()
            if len(bad):
                failed.append(_failure(t, "error", bad["error"].iloc[0]))
                if any(_part_error(out, o, entries) is None for o in olds):
                    # a stale result is not swapped for no result: kept, and the task retried by a rerun (a stale
                    # part that is itself an error is replaced as usual)
                    failed[-1]["error"] += (f" (the earlier part of this task, {', '.join(_part_path(out, o).name for o in olds)}"
                                            ", from other settings, code or models, is kept; a rerun retries the task)")
                    continue
            write_part(out, t["task_id"], frame)
            entries[t["task_id"]]["part"] = part_status(frame)
            ran += 1
            for old in olds:  # the same task's part from other settings, code or models: replaced
                _part_path(out, old).unlink(missing_ok=True)
            if time.monotonic() - flushed_s >= RECORD_FLUSH_S:
                _write_record(out, record)
                flushed_s = time.monotonic()
            done += 1
            if progress:
                progress(done, len(tasks))
    finally:
        results.close()
        _write_record(out, record)  # a part written since the last flush and not in it is read on resume instead
    return SweepOutcome(out, len(tasks), skipped, ran, failed, time.time() - t0, removed)


def search_keys(value: Any) -> Any:
    """A :data:`SEARCH_KEYS` cell back as what ``wattcast search --json`` gives (a list, an object); None where the
    task's search did not run (or a part written before the keys were)."""
    if not isinstance(value, str) or not value:
        return None
    return json.loads(value)


def summary(frame: pd.DataFrame, columns: Iterable[str] = ("model", "cluster", "gpus", "region", "status", "strategy",
                                                            "step_time_ms", "step_time_band_low_ms",
                                                            "step_time_band_high_ms", "mfu", "memory_gb", "energy_j",
                                                            "run_days", "run_cloud_usd", "run_tco2e", "run_energy_mwh",
                                                            "error", *SEARCH_KEYS)
            ) -> pd.DataFrame:
    """The best row of each task (rank 1, or the row saying why there is none, with its ``error`` text): its step time,
    band, MFU, memory and step energy (``energy_j``, J over all GPUs: what ``objective: energy`` ranks by without
    ``tokens``), with ``tokens`` the run's days, cloud cost, tCO2e and MWh."""
    if frame.empty:
        return frame
    best = frame[frame["rank"] <= 1]
    return best[[c for c in columns if c in best.columns]].reset_index(drop=True)
