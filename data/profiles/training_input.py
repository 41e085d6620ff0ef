"""Imported profile folders as training input (the reading side of ``wattcast train ... --data DIR``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.profiles.row_checks import kernel_row_problems, shown
from wattcast.data.profiles.tables import PROFILE_MARKER, TABLE_FILES, ProfileImportError, is_profile_dir, read_table

#: the columns of the user kernel CSV schema (``wattcast.data.kernel_datasets.load_user_kernels``)
USER_KERNEL_COLUMNS = ("OPName", "B", "M", "N", "K", "H", "dtype", "latency_ms", "Device")
#: the top-level folders of the shared dataset root (shared/datasets/README.md); a --data folder with none of them
#: and no profile.json is not a dataset root
DATASET_SUBFOLDERS = ("power", "neusight", "collectives", "endtoend", "published", "specs", "tensorcore", "traces")


def split_data_args(paths) -> tuple[Path | None, list[Path]]:
    """(dataset root or None, imported profile folders) from the ``--data`` values.

    ProfileImportError when more than one folder is not a profile folder (only one dataset root is read)."""
    roots, profiles = [], []
    for p in map(Path, paths or ()):
        (profiles if is_profile_dir(p) else roots).append(p)
    for r in roots:
        tables = [n for n in TABLE_FILES.values() if (r / n).is_file()]
        if tables and not any((r / d).is_dir() for d in DATASET_SUBFOLDERS):
            raise ProfileImportError(
                f"--data {r}: it holds {', '.join(tables)} but no {PROFILE_MARKER}, so it is neither a profile folder "
                f"nor a dataset root (with {', '.join(d + '/' for d in DATASET_SUBFOLDERS[:3])} ...). A profile folder "
                f"must hold the {PROFILE_MARKER} that `wattcast profile import` / `profile run` writes next to its "
                "tables: import the measurements with `wattcast profile import FILE... --output DIR` (a kernel table "
                "in the user CSV schema can also be given as `wattcast train kernels --csv FILE`)")
    if len(roots) > 1:
        raise ProfileImportError(f"--data: {len(roots)} folders are not imported profiles ({', '.join(map(str, roots))}); "
                                 "give one dataset root plus any number of `wattcast profile import` folders")
    return (roots[0] if roots else None), profiles


def table_lines(index) -> np.ndarray:
    """Each row's line in its file, for a CSV table read with its blank lines kept and then ``without_blank_rows``
    (``tables.read_table``; ``load_user_kernels`` reads the same way): the frame's index + 2, the header being line 1.
    The one mapping from a table's rows to the lines a message names."""
    return np.asarray(index, dtype=np.int64) + 2


def kernel_training_rows(folders) -> tuple[pd.DataFrame, dict]:
    """Mapped kernel rows of the profile folders in the user CSV schema, plus counts of what was left out and why
    (rows with no wattcast op / shape, no measured time, or a GPU the catalog does not know).

    ``rows.attrs["files"]`` / ``rows.attrs["lines"]``: each row's folder ``kernels.csv`` and its line there (lists,
    one entry per row), for messages about a row that fails a later check (the physics check of ``train kernels``)."""
    frames, counts = [], {"rows": 0, "used": 0, "unmapped": 0, "no_time": 0, "unknown_device": 0}
    files: list[str] = []
    lines: list[int] = []
    for f in folders:
        k = read_table(f, "kernels")
        path = str(Path(f) / TABLE_FILES["kernels"])
        counts["rows"] += len(k)
        # a mapped row must pass the checks of a user kernel CSV (row_checks; the importers keep a failing row
        # unmapped, a hand-edited or older folder may not): named here by its line in the folder's kernels.csv,
        # not by a line of the temporary file the training reads
        problems = kernel_row_problems(k, zero_time_ok=True)
        if (problems != "").any():
            bad = problems[problems != ""]
            said = [f"line {n}: {why}" for n, why in zip(table_lines(bad.index), bad)]
            raise ProfileImportError(
                f"{path}: {len(bad):,} mapped kernel row(s) fail the checks a kernel CSV "
                f"passes: {shown(said)}. Re-import the source file (`wattcast profile import ... --overwrite` keeps "
                "such rows unmapped, with the reason) or fix / delete those lines")
        op = k["OPName"].fillna("").astype(str)
        lat = pd.to_numeric(k["latency_ms"], errors="coerce")
        dev = k["Device"].fillna("").astype(str)
        mapped = op != ""
        timed = lat > 0
        known = dev != ""
        counts["unmapped"] += int((~mapped).sum())
        counts["no_time"] += int((mapped & ~timed).sum())
        counts["unknown_device"] += int((mapped & timed & ~known).sum())
        use = k[mapped & timed & known]
        counts["used"] += len(use)
        frames.append(use[list(USER_KERNEL_COLUMNS)])
        files += [path] * len(use)
        lines += table_lines(use.index).tolist()
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=USER_KERNEL_COLUMNS)
    # lists, not arrays: pandas compares attrs when it concatenates frames, and an array's == is not a bool
    out.attrs["files"], out.attrs["lines"] = files, lines
    return out, counts
