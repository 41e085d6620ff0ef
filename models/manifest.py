"""Reading the JSON manifest that names a shipped model's files (kernel bundle, collective correction, power)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_manifest(folder: str | Path, name: str, what: str, schema: int, *, schema_key: str = "schema") -> dict[str, Any]:
    """The manifest ``folder/name`` of a ``what`` model, checked for ``schema``; FileNotFoundError when it is
    absent, ValueError when it is unreadable or of another schema."""
    path = Path(folder) / name
    if not path.is_file():
        raise FileNotFoundError(f"no {what} manifest at {path}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a JSON manifest ({e})") from None
    if manifest.get(schema_key) != schema:
        raise ValueError(f"{path}: {what} {schema_key} {manifest.get(schema_key)} is not {schema}, the one this wattcast reads")
    return manifest


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file's bytes (hex)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_model_file(path: str | Path, sha256: str | None = None, *, what: str = "model") -> Path:
    """``path`` after checking it before any parser sees it: present, equal to ``sha256`` when the manifest records
    one, and, for a LightGBM text model, complete (LightGBM's C++ parser aborts the whole process on a truncated file).
    ValueError naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what} file {path} is missing")
    if sha256:
        got = sha256_file(path)
        if got != sha256:
            raise ValueError(f"{what} file {path} is damaged or was changed: sha256 {got[:12]}... is not the manifest's "
                             f"{sha256[:12]}...; retrain or restore it")
    if path.name.endswith(".txt"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if not text.startswith("tree") or "end of trees" not in text:
            raise ValueError(f"{what} file {path} is not a complete LightGBM text model (truncated?)")
    return path
