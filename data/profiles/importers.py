"""One entry point for every profiling format: ``import_files(paths) -> Profile`` (format told from the content),
and the placement of collective rows (``place_collectives``: ``profile import --nodes / --gpus-per-node``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.profiles.tables import Profile, ProfileImportError

#: the flags that give the placement a file does not record
PLACEMENT_FLAGS = "--gpus-per-node G [--nodes N]"

FORMATS = ("kineto", "nsys", "nccl-tests", "nvidia-smi", "dcgm")


def detect_format(path: str | Path) -> str:
    """The format of ``path`` from its first bytes (not its name); ProfileImportError when it is none we read."""
    p = Path(path)
    if not p.is_file():
        raise ProfileImportError(f"{p}: no such file" if not p.exists() else f"{p}: not a file")
    if p.suffix == ".nsys-rep" or p.suffix == ".qdrep":
        raise ProfileImportError(f"{p}: a binary Nsight Systems report; export it first: "
                                 f"nsys export --type sqlite --output {p.stem}.sqlite {p.name}")
    try:
        with p.open("rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise ProfileImportError(f"{p}: cannot read ({e.strerror or e})") from None
    if not head:
        raise ProfileImportError(f"{p}: empty file")
    if head[:2] == b"\x1f\x8b" or head.lstrip()[:1] in (b"{", b"["):
        return "kineto"
    if head.startswith(b"SQLite format 3\x00"):
        return "nsys"
    from wattcast.data.profiles.nccl_tests import looks_like_nccl_tests
    from wattcast.data.profiles.power_logs import sniff

    text = head.decode("utf-8", errors="replace")
    if looks_like_nccl_tests(text) or "nThread" in text:
        return "nccl-tests"
    kind = sniff(text)
    if kind:
        return kind
    if "xla.GemmPerfTable" in text or p.suffix in (".whl", ".txtpb"):
        raise ProfileImportError(f"{p}: an XLA GEMM table (or a wheel that may embed one) is not a profile; give it to "
                                 f"`wattcast train kernels --xla-table {p.name}` (or WATTCAST_XLA_TABLE), see "
                                 "data/xla_perf_table.py")
    raise ProfileImportError(f"{p}: not a format wattcast imports ({', '.join(FORMATS)}): PyTorch profiler JSON "
                             "(.json/.json.gz), Nsight Systems SQLite export, nccl-tests stdout, nvidia-smi CSV, DCGM dmon log")


def job_placement(path, nodes: int | None, gpus_per_node: int | None, world_size: int | None) -> tuple:
    """(nodes, GPUs per node) of the profiled job from ``--nodes`` / ``--gpus-per-node`` and the world size the file
    records (``world_size``, None when it records none); either may stay None when nothing gives it. A
    ProfileImportError names the flags when they contradict the file."""
    n, g, w = nodes, gpus_per_node, world_size
    recorded = f"{path} records a world size of {w} ranks (distributedInfo.world_size)"
    if n is not None and g is not None:
        if w is not None and n * g != w:
            raise ProfileImportError(f"--nodes {n} x --gpus-per-node {g} = {n * g} ranks, but {recorded}: give the "
                                     "placement of the job the file profiled")
        return n, g
    if w is None:
        if n is not None:
            raise ProfileImportError(f"--nodes {n} without --gpus-per-node: {path} records no world size to divide "
                                     "among the nodes; give --gpus-per-node too")
        return None, g
    if g is not None and w % g:
        raise ProfileImportError(f"--gpus-per-node {g}, but {recorded}, not a multiple of it: give the ranks each "
                                 f"node ran (torchrun's --nproc-per-node), e.g. --gpus-per-node {w} --nodes 1 for one node")
    if n is not None and w % n:
        raise ProfileImportError(f"--nodes {n}, but {recorded}, which does not divide among {n} nodes")
    return (w // g, g) if g is not None else (n, w // n)


def place_collectives(c: pd.DataFrame, nodes: int | None, gpus_per_node: int) -> tuple[pd.DataFrame, dict]:
    """``c`` (collective rows) with ``nodes`` / ``gpus_per_node`` filled where the file left them empty, from the
    placement of the profiled job (``nodes`` x ``gpus_per_node``; ``nodes`` None: unknown, only rows whose group
    ranks are known are placed), and counts: ``placed``, ``from_ranks`` (of them, by the group's global ranks),
    ``kept`` (the file's own placement), ``unplaced`` per reason. A row is placed when

    - its group's global ranks are known (a trace's ``_ranks``): rank r ran on node r // gpus_per_node, the node-major
      order torchrun gives ranks (global rank = the node's first rank + LOCAL_RANK, nodes in turn:
      torch/distributed/elastic/agent/server/api.py ``SimpleElasticAgent._assign_worker_ranks``); a group with
      unequal ranks per node is left unplaced (the model takes the same GPUs on every node);
    - its group is the whole job (group size = nodes x gpus_per_node, or no group size in the file): nodes x
      gpus_per_node;
    - the job ran on one node: 1 x its group size.

    Any other group is left unplaced, counted: which nodes its ranks span is not known."""
    out = c.copy()
    n_rows = len(out)
    col = lambda name: (pd.to_numeric(out[name], errors="coerce").to_numpy(float, copy=True) if name in out  # noqa: E731
                        else np.full(n_rows, np.nan))
    have_n, have_g, world = col("nodes"), col("gpus_per_node"), col("world_size")
    job = nodes * gpus_per_node if nodes is not None else None
    kept = np.isfinite(have_n) & np.isfinite(have_g)
    new_n, new_g = have_n.copy(), have_g.copy()
    why = np.full(n_rows, "", dtype=object)
    ranks = out["_ranks"].to_numpy(dtype=object) if "_ranks" in out else np.full(n_rows, None, dtype=object)
    by_ranks = np.zeros(n_rows, bool)
    for i in np.flatnonzero(~kept & np.array([isinstance(r, (list, tuple)) and len(r) > 0 for r in ranks], bool)):
        r = ranks[i]
        if job is not None and max(r) >= job:
            why[i] = f"group ranks beyond the job's {job} ranks"
            continue
        per_node = Counter(int(x) // gpus_per_node for x in r)
        if len(set(per_node.values())) > 1:
            why[i] = "a group with unequal ranks per node"
            continue
        new_n[i], new_g[i], by_ranks[i] = len(per_node), next(iter(per_node.values())), True
    rest = ~kept & ~by_ranks & (why == "")
    if job is not None:
        whole = rest & (~np.isfinite(world) | (world == job))
        new_n[whole], new_g[whole], world[whole] = nodes, gpus_per_node, job
        one = rest & ~whole & np.isfinite(world) & (world <= gpus_per_node) & (nodes == 1)
        new_n[one], new_g[one] = 1, world[one]
        rest &= ~whole & ~one
        why[rest & (world > job)] = "a group larger than the job"
    why[rest & (why == "")] = ("a sub-group of the job whose ranks the file does not list (which nodes they span is "
                               "unknown)" if job is not None else "no --nodes and no world size in the file")
    placed = ~kept & (why == "")
    out["nodes"], out["gpus_per_node"], out["world_size"] = new_n, new_g, world
    unplaced = Counter(why[why != ""])
    counts = {"nodes": nodes, "gpus_per_node": gpus_per_node, "world_size": job, "placed": int(placed.sum()),
              "from_ranks": int(by_ranks.sum()), "kept": int(kept.sum()), "unplaced": dict(unplaced)}
    return out, counts


def _placement_notes(notes: dict, c: pd.DataFrame, path, nodes: int | None, gpus_per_node: int | None
                     ) -> pd.DataFrame:
    """``c`` placed by the flags (``place_collectives``), the counts in ``notes["placement"]``; without the flags, a
    warning counting the rows left without a placement and naming the flags that give it."""
    if not len(c):
        return c
    if nodes is None and gpus_per_node is None:
        n = len(c)
        if "nodes" in c and "gpus_per_node" in c:
            n = int((pd.to_numeric(c["nodes"], errors="coerce").isna()
                     | pd.to_numeric(c["gpus_per_node"], errors="coerce").isna()).sum())
        if n:
            notes["unplaced_collective_rows"] = n
            what = ("a trace does not record which node each rank ran on" if notes.get("format") in ("kineto", "nsys")
                    else "the file records no placement")
            _warn(notes, f"{n:,} collective row(s) have no nodes / gpus_per_node ({what}); `train collectives` "
                         f"cannot use them: give the profiled job's placement with {PLACEMENT_FLAGS}")
        return c
    w = (notes.get("distributed") or {}).get("world_size")
    w = int(w) if isinstance(w, int) and not isinstance(w, bool) and w >= 1 else None
    n, g = job_placement(path, nodes, gpus_per_node, w)  # g is known: given, or derived from --nodes
    c, counts = place_collectives(c, n, g)
    counts["from"] = " and ".join(f"{f} {v}" for f, v in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node)) if v is not None)
    if n is not None and (nodes is None or gpus_per_node is None):
        counts["derived"] = (f"{'nodes' if nodes is None else 'gpus_per_node'} = {w} ranks (distributedInfo.world_size)"
                             f" / {counts['from']}")
    notes["placement"] = counts
    if counts["unplaced"]:
        _warn(notes, f"{sum(counts['unplaced'].values()):,} collective row(s) left without a placement: "
                     + "; ".join(f"{k} x {v:,}" for k, v in counts["unplaced"].items()))
    return c


def _warn(notes: dict, text: str) -> None:
    notes["warning"] = f"{notes['warning']}; {text}" if notes.get("warning") else text


def import_file(profile: Profile, path: str | Path, device: str | None = None, collective: str | None = None,
                nodes: int | None = None, gpus_per_node: int | None = None) -> dict:
    """Add one file's rows to ``profile``; returns its notes (row counts, unmapped reasons). ``nodes`` /
    ``gpus_per_node``: the placement of the profiled job (``profile import --nodes / --gpus-per-node``), which fills
    the collective rows the file leaves unplaced (``place_collectives``)."""
    kind = detect_format(path)
    if kind == "kineto":
        from wattcast.data.profiles.kineto import import_kineto

        k, c, notes = import_kineto(path, device)
        profile.add("kernels", k)
        profile.add("collectives", _placement_notes(notes, c, path, nodes, gpus_per_node))
    elif kind == "nsys":
        from wattcast.data.profiles.nsys import import_nsys

        k, c, notes = import_nsys(path, device)
        profile.add("kernels", k)
        profile.add("collectives", _placement_notes(notes, c, path, nodes, gpus_per_node))
    elif kind == "nccl-tests":
        from wattcast.data.profiles.nccl_tests import import_nccl_tests

        c, notes = import_nccl_tests(path, collective, device)
        profile.add("collectives", _placement_notes(notes, c, path, nodes, gpus_per_node))
    else:
        from wattcast.data.profiles.power_logs import import_dcgm, import_nvidia_smi

        w, notes = (import_nvidia_smi if kind == "nvidia-smi" else import_dcgm)(path, device)
        profile.add("power", w)
    profile.files.append(notes)
    return notes


def import_files(paths, device: str | None = None, collective: str | None = None, nodes: int | None = None,
                 gpus_per_node: int | None = None) -> Profile:
    prof = Profile()
    for p in paths:
        import_file(prof, p, device, collective, nodes, gpus_per_node)
    return prof
