"""Load the nccl-tests collective measurements into one table (``load_collectives``).

Files (under ``<data root>/collectives/``, see ``wattcast.data.kernel_datasets.resolve_data_root``; read,
never copied):

- ``nccl_h100_per_size.csv`` (Apache-2.0, xxrjun/nccl-tests-cluster): H100 SXM clusters, nccl-tests 2.17.8,
  NCCL 2.29.2, sizes 32 MiB .. 16 GiB. Site ``example-cluster01`` -> cluster preset ``DGX-H100`` (8 GPUs per
  node; 2-node busbw ~40-48 GB/s per GPU = one 400 Gb/s NIC per GPU, the DGX H100 fabric). Site
  ``example-cluster00`` (pairwise 2-node alltoall/sendrecv only) gets **no preset** (``cluster`` = ''):
  its fabric is undocumented and measures ~3x slower than example-cluster01 on the very same
  configurations (sendrecv 2x1: 13.5 vs 39.5 GB/s busbw; alltoall 2x8: 7-20 vs 92 GB/s), so it is
  not a DGX H100 fabric. Smoke-test rows have no nodes/GPUs-per-node columns: they are read from the log
  file name (``..._N2_G1_...``).
- ``nccl_polaris_per_size.csv`` (**no licence**: internal evaluation only, never training data for a shipped
  model; ``licence`` column says so): ALCF Polaris, 4x A100 per node, Slingshot-11 -> preset ``Polaris``.
  ``setup`` = the file's ``env_setup`` (1..5 progressively tuned NCCL/libfabric settings, 5 = best;
  '2023-1'/'2023-2' = unlabelled 2023 runs). Sizes 0 .. 1 GiB.

Unified table (``COLUMNS``), one row per measured (run, size):

``op`` (canonical, ``wattcast.data.collective_ops.COLLECTIVES``), ``size_B`` (nccl-tests size: per-rank buffer
for all_reduce/send_recv, total buffer for all_gather/reduce_scatter/all_to_all), ``nodes``,
``gpus_per_node``, ``world_size``, ``time_us`` (out-of-place), ``busbw_GBs`` (out-of-place), ``algbw_GBs``,
``ip_time_us`` (in-place), ``source``, ``cluster`` (preset name or ''), ``site``, ``mode``, ``setup``,
``nccl``, ``run``, ``licence``.

Rows with size 0 or a non-positive/NaN time are dropped, counted in ``df.attrs["dropped"]`` and logged.
A file that is empty, has a header but no rows, or lacks a needed column raises ``CollectiveDataError`` naming
the file (and the column).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from wattcast.data.kernel_datasets import DataNotFoundError, resolve_data_root
from wattcast.data.collective_ops import canonical_op

log = logging.getLogger(__name__)

__all__ = ["COLUMNS", "SOURCES", "CollectiveDataError", "DataNotFoundError", "load_collectives", "collectives_dir",
           "load_profile_collectives", "PROFILE_REASONS"]

COLUMNS = ("op", "size_B", "nodes", "gpus_per_node", "world_size", "time_us", "busbw_GBs", "algbw_GBs", "ip_time_us",
           "source", "cluster", "site", "mode", "setup", "nccl", "run", "licence")
SOURCES = ("h100", "polaris")
H100_FILE = "nccl_h100_per_size.csv"
POLARIS_FILE = "nccl_polaris_per_size.csv"
#: site of the H100 file -> cluster preset ('' = no preset describes its fabric)
H100_SITES = {"example-cluster01": "DGX-H100", "example-cluster00": ""}
H100_LICENCE = "Apache-2.0"
POLARIS_LICENCE = "none (internal evaluation only; do not train shipped models on it)"

_H100_NEED = ("cluster", "mode", "run", "file", "test", "nodes", "gpus_per_node", "world_size", "size_B",
              "oop_time_us", "oop_algbw_GBs", "oop_busbw_GBs", "ip_time_us")
_POLARIS_NEED = ("nccl_version_dir", "run_dir", "nodes", "gpus_per_node", "world_size", "test", "env_setup", "size_B",
                 "oop_time_us", "oop_algbw_GBs", "oop_busbw_GBs", "ip_time_us")


class CollectiveDataError(ValueError):
    """A collectives CSV lacks a needed column or holds values that cannot be used."""


def collectives_dir(data: str | Path | None = None) -> Path:
    root = resolve_data_root(data)
    d = root / "collectives"
    if not d.is_dir():
        raise DataNotFoundError(f"collective measurements not found at {d}. Point to the datasets folder with --data PATH "
                                "or WATTCAST_DATA.")
    return d


def _read(path: Path, need: Sequence[str]) -> pd.DataFrame:
    if not path.is_file():
        raise DataNotFoundError(f"{path.name} not found at {path}. Point to the datasets folder with --data PATH or WATTCAST_DATA.")
    try:
        df = pd.read_csv(path, dtype={"env_setup": str, "run": str, "run_dir": str})
    except pd.errors.EmptyDataError:
        raise CollectiveDataError(f"{path}: empty file (no header row, no data); expected the columns {', '.join(need)}") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise CollectiveDataError(f"{path}: not a readable CSV ({e})") from e
    except OSError as e:
        raise CollectiveDataError(f"{path}: cannot read ({e.strerror or e})") from e
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise CollectiveDataError(f"{path}: missing column {missing[0]!r}" + (f" (and {', '.join(map(repr, missing[1:]))})" if len(missing) > 1 else "")
                                  + f"; needed: {', '.join(need)}")
    if df.empty:
        raise CollectiveDataError(f"{path}: header only, no measurement rows")
    return df


def _ops(test: pd.Series, origin: str) -> np.ndarray:
    def one(t: str) -> str:
        base = re.sub(r"\(.*\)$", "", str(t)).strip()  # Polaris: "all_reduce(unlabelled,2023 run)"
        try:
            return canonical_op(base)
        except ValueError as e:
            raise CollectiveDataError(f"{origin}: column 'test' has an unknown collective {t!r}") from e

    codes, uniq = pd.factorize(test.astype(str))
    names = np.array([one(u) for u in uniq], dtype=object)
    return names[codes]


def _num(df: pd.DataFrame, col: str) -> np.ndarray:
    return pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)


def _load_h100(path: Path) -> pd.DataFrame:
    raw = _read(path, _H100_NEED)
    nodes, gpn = _num(raw, "nodes"), _num(raw, "gpus_per_node")
    # smoke logs carry no nodes/GPUs columns: nccl_smoke_N2_G1_<hosts>.log
    parsed = raw["file"].astype(str).str.extract(r"_N(\d+)_G(\d+)_").astype(float).to_numpy()
    nodes = np.where(np.isnan(nodes), parsed[:, 0], nodes)
    gpn = np.where(np.isnan(gpn), parsed[:, 1], gpn)
    site = raw["cluster"].astype(str)
    return pd.DataFrame({
        "op": _ops(raw["test"], str(path)),
        "size_B": _num(raw, "size_B"),
        "nodes": nodes,
        "gpus_per_node": gpn,
        "world_size": _num(raw, "world_size"),
        "time_us": _num(raw, "oop_time_us"),
        "busbw_GBs": _num(raw, "oop_busbw_GBs"),
        "algbw_GBs": _num(raw, "oop_algbw_GBs"),
        "ip_time_us": _num(raw, "ip_time_us"),
        "source": "nccl-tests/h100 (xxrjun/nccl-tests-cluster)",
        "cluster": site.map(H100_SITES).fillna("").to_numpy(dtype=object),
        "site": site.to_numpy(dtype=object),
        "mode": raw["mode"].astype(str).to_numpy(dtype=object),
        "setup": "default",
        "nccl": "2.29.2",
        "run": (raw["run"].astype(str) + "/" + raw["file"].astype(str)).to_numpy(dtype=object),
        "licence": H100_LICENCE,
    })


def _load_polaris(path: Path) -> pd.DataFrame:
    raw = _read(path, _POLARIS_NEED)
    ver = raw["nccl_version_dir"].astype(str).str.replace("nccl_", "", regex=False).str.replace("_", ".", regex=False)
    return pd.DataFrame({
        "op": _ops(raw["test"], str(path)),
        "size_B": _num(raw, "size_B"),
        "nodes": _num(raw, "nodes"),
        "gpus_per_node": _num(raw, "gpus_per_node"),
        "world_size": _num(raw, "world_size"),
        "time_us": _num(raw, "oop_time_us"),
        "busbw_GBs": _num(raw, "oop_busbw_GBs"),
        "algbw_GBs": _num(raw, "oop_algbw_GBs"),
        "ip_time_us": _num(raw, "ip_time_us"),
        "source": "nccl-tests/polaris (argonne-lcf/alcf-nccl-tests)",
        "cluster": "Polaris",
        "site": "alcf-polaris",
        "mode": "multi-node",
        "setup": raw["env_setup"].astype(str).to_numpy(dtype=object),
        "nccl": ver.to_numpy(dtype=object),
        "run": raw["run_dir"].astype(str).to_numpy(dtype=object),
        "licence": POLARIS_LICENCE,
    })


def load_collectives(data: str | Path | None = None, sources: Sequence[str] = SOURCES) -> pd.DataFrame:
    """Both nccl-tests tables normalised into ``COLUMNS`` (see the module docstring)."""
    unknown = sorted(set(sources) - set(SOURCES))
    if unknown:
        raise ValueError(f"unknown collective source(s) {unknown}; choose from {list(SOURCES)}")
    d = collectives_dir(data)
    frames = []
    if "h100" in sources:
        frames.append(_load_h100(d / H100_FILE))
    if "polaris" in sources:
        frames.append(_load_polaris(d / POLARIS_FILE))
    df = pd.concat(frames, ignore_index=True)[list(COLUMNS)]
    bad_shape = ~(np.isfinite(df["nodes"]) & np.isfinite(df["gpus_per_node"]) & (df["nodes"] >= 1) & (df["gpus_per_node"] >= 1))
    if bad_shape.any():
        raise CollectiveDataError(f"{int(bad_shape.sum())} row(s) have no usable nodes/gpus_per_node "
                                  f"(first: source {df.loc[bad_shape, 'source'].iloc[0]}, run {df.loc[bad_shape, 'run'].iloc[0]})")
    drop = ~(np.isfinite(df["time_us"]) & (df["time_us"] > 0) & np.isfinite(df["size_B"]) & (df["size_B"] > 0))
    dropped = df.loc[drop].groupby("source").size().to_dict() if drop.any() else {}
    if drop.any():
        log.info("collectives: dropped %d row(s) with size 0 or no positive time: %s", int(drop.sum()), dropped)
    df = df.loc[~drop].reset_index(drop=True)
    for c in ("nodes", "gpus_per_node", "world_size", "size_B"):
        df[c] = df[c].astype(np.int64)
    df.attrs["dropped"] = dropped
    return df


# ------------------------------------------------------------------------------------ imported profiles
#: why an imported collective row could not join the training frame (keys of the counts ``load_profile_collectives``
#: returns, in the order they are checked; a row is counted under the first that applies)
PROFILE_REASONS = {
    "not_measured": "the importer/collector recorded it as not measured (its 'reason' column)",
    "unknown_op": "an op that is not one of the modelled collectives",
    "no_time_or_size": "no positive size_B / time_us",
    "no_placement": "no nodes / gpus_per_node (a trace imported without profile import --gpus-per-node / --nodes, an "
                    "nccl-tests log without '# Rank' lines, or a collector row)",
    "inconsistent_group": "nodes x gpus_per_node differs from world_size",
    "single_gpu": "a group of one GPU (nothing is communicated)",
    "no_cluster": "no cluster given for the imported rows (train collectives --cluster NAME|FILE)",
    "device_differs_from_cluster": "the row's GPU is not the cluster's GPU",
    "does_not_fit_cluster": "more GPUs per node or more nodes than the cluster has (or several nodes, no inter-node tier)",
}
PROFILE_LICENCE = "user data (imported profile)"


def load_profile_collectives(folders: Sequence[str | Path], cluster: str | Path | None = None) -> tuple[pd.DataFrame, dict]:
    """The collective rows of imported profile folders (``wattcast profile import`` / ``profile run``:
    ``collectives.csv``) in this module's ``COLUMNS``, measured on ``cluster`` (a preset name or cluster file: the
    links the alpha-beta model and the correction's link features are computed from; a profile does not record its
    fabric), plus counts: ``rows`` read, ``used``, and one count per :data:`PROFILE_REASONS` key for the rows left out
    (never silently dropped). ``cluster`` is kept as given (the training frame resolves it again)."""
    from wattcast.data.profiles.tables import read_table

    counts = {"rows": 0, "used": 0, **{k: 0 for k in PROFILE_REASONS}}
    spec = None
    if cluster is not None:
        from wattcast.data.cluster_spec import resolve_cluster

        spec = resolve_cluster(cluster)  # ClusterSpecError (a ValueError) names an unknown preset / bad file
        is_file = Path(str(cluster)).suffix.lower() in (".yaml", ".yml", ".json") or Path(str(cluster)).is_file()
        cluster = str(cluster) if is_file else spec.name  # a preset by its canonical name
    frames = []
    for folder in map(Path, folders):
        t = read_table(folder, "collectives")
        n = len(t)
        counts["rows"] += n
        if n == 0:
            continue
        reason = t["reason"].astype(object).fillna("").astype(str).str.strip().to_numpy()
        ops = np.full(n, "", dtype=object)
        raw_ops = t["op"].astype(object).fillna("").astype(str)
        for u in raw_ops.unique():
            try:
                ops[(raw_ops == u).to_numpy()] = canonical_op(u)
            except ValueError:
                pass
        size, time_us = _num(t, "size_B"), _num(t, "time_us")
        nodes, gpn, world = _num(t, "nodes"), _num(t, "gpus_per_node"), _num(t, "world_size")
        world = np.where(np.isfinite(world), world, nodes * gpn)
        dev = t["Device"].astype(object).fillna("").astype(str).to_numpy()
        why = np.full(n, "", dtype=object)

        def flag(key: str, bad: np.ndarray) -> None:
            why[(why == "") & bad] = key

        flag("not_measured", reason != "")
        flag("unknown_op", ops == "")
        flag("no_time_or_size", ~(np.isfinite(size) & (size > 0) & np.isfinite(time_us) & (time_us > 0)))
        flag("no_placement", ~(np.isfinite(nodes) & np.isfinite(gpn) & (nodes >= 1) & (gpn >= 1)))
        flag("inconsistent_group", ~np.isclose(nodes * gpn, world))
        flag("single_gpu", world < 2)
        if spec is None:
            flag("no_cluster", np.ones(n, dtype=bool))
        else:
            flag("device_differs_from_cluster", (dev != "") & (dev != spec.device))
            too_big = gpn > spec.gpus_per_node
            if spec.max_nodes is not None:
                too_big |= nodes > spec.max_nodes
            if spec.inter is None:
                too_big |= nodes > 1
            flag("does_not_fit_cluster", too_big)
        for k in PROFILE_REASONS:
            counts[k] += int((why == k).sum())
        use = why == ""
        counts["used"] += int(use.sum())
        if not use.any():
            continue
        src = t["source"].astype(object).fillna("").astype(str).to_numpy()
        frames.append(pd.DataFrame({
            "op": ops[use], "size_B": size[use], "nodes": nodes[use], "gpus_per_node": gpn[use], "world_size": world[use],
            "time_us": time_us[use], "busbw_GBs": _num(t, "busbw_GBs")[use], "algbw_GBs": _num(t, "algbw_GBs")[use],
            "ip_time_us": _num(t, "ip_time_us")[use],
            "source": np.char.add(f"profile:{folder.name}:", src[use].astype(str)).astype(object),
            "cluster": str(cluster), "site": f"profile:{folder}", "mode": "imported", "setup": "imported", "nccl": "",
            "run": str(folder), "licence": PROFILE_LICENCE,
        }))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
    df = df[list(COLUMNS)]
    if len(df):
        for c in ("nodes", "gpus_per_node", "world_size", "size_B"):
            df[c] = np.round(df[c].astype(float)).astype(np.int64)
    return df, counts


def profile_counts_text(counts: dict) -> str:
    """'N of M collective rows used (left out: ...)' for logs and errors."""
    left = [f"{counts[k]:,} {k.replace('_', ' ')}" for k in PROFILE_REASONS if counts.get(k)]
    return (f"{counts['used']:,} of {counts['rows']:,} imported collective rows used"
            + (f" (left out: {', '.join(left)})" if left else ""))
