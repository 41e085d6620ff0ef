"""Imported profile folders as training input (the reading side of ``wattcast train ... --data DIR``)."""

from __future__ import annotations

from pathlib import Path

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


def kernel_training_rows(folders) -> tuple[pd.DataFrame, dict]:
    """Mapped kernel rows of the profile folders in the user CSV schema, plus counts of what was left out and why
    (rows with no wattcast op / shape, no measured time, or a GPU the catalog does not know)."""
    frames, counts = [], {"rows": 0, "used": 0, "unmapped": 0, "no_time": 0, "unknown_device": 0}
    for f in folders:
        k = read_table(f, "kernels")
        counts["rows"] += len(k)
        # a mapped row must pass the checks of a user kernel CSV (row_checks; the importers keep a failing row
        # unmapped, a hand-edited or older folder may not): named here by its line in the folder's kernels.csv,
        # not by a line of the temporary file the training reads
        problems = kernel_row_problems(k, zero_time_ok=True)
        if (problems != "").any():
            bad = problems[problems != ""]
            lines = [f"line {i + 2}: {why}" for i, why in zip(bad.index, bad)]  # the header is line 1
            raise ProfileImportError(
                f"{Path(f) / TABLE_FILES['kernels']}: {len(bad):,} mapped kernel row(s) fail the checks a kernel CSV "
                f"passes: {shown(lines)}. Re-import the source file (`wattcast profile import ... --overwrite` keeps "
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
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=USER_KERNEL_COLUMNS)
    return out, counts
