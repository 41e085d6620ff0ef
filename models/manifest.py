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
