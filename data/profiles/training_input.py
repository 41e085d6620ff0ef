"""Imported profile folders as training input (the reading side of ``wattcast train ... --data DIR``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from wattcast.data.profiles.tables import ProfileImportError, is_profile_dir, read_table

#: the columns of the user kernel CSV schema (``wattcast.data.kernel_datasets.load_user_kernels``)
USER_KERNEL_COLUMNS = ("OPName", "B", "M", "N", "K", "H", "dtype", "latency_ms", "Device")


def split_data_args(paths) -> tuple[Path | None, list[Path]]:
    """(dataset root or None, imported profile folders) from the ``--data`` values.

    ProfileImportError when more than one folder is not a profile folder (only one dataset root is read)."""
    roots, profiles = [], []
    for p in map(Path, paths or ()):
        (profiles if is_profile_dir(p) else roots).append(p)
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
