"""The house rules of the layout, checked on the source: which folder may import which."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: folder -> the wattcast packages it must never import (at module level or inside functions)
FORBIDDEN = {
    "data": {"featurize", "models", "simulate", "lifecycle", "planning", "training", "validation"},
    "featurize": {"models", "simulate", "lifecycle", "planning", "training", "validation"},
    "models": {"simulate", "lifecycle", "planning", "training", "validation"},
    "simulate": {"lifecycle", "planning", "training", "validation"},
    # cost and carbon of a run: on top of data only (a run's step time and power come in as numbers)
    "lifecycle": {"featurize", "models", "simulate", "planning", "training", "validation"},
    # the strategy search ranks whole runs by their cost and CO2e: above simulate and lifecycle, below the API
    "planning": {"training", "validation"},
    "training": {"simulate", "lifecycle", "planning", "validation"},
}
#: file -> the forbidden packages it may still import, each edge named (none today: the search that ranks runs by
#: cost and CO2e moved above lifecycle, into planning/)
ALLOWED: dict[str, set[str]] = {}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("wattcast."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("wattcast.")}
    return out


def test_no_folder_imports_what_is_downstream_of_it():
    broken = []
    for folder, banned in FORBIDDEN.items():
        for f in sorted((REPO / folder).rglob("*.py")):
            bad = _imports(f) & banned - ALLOWED.get(f.relative_to(REPO).as_posix(), set())
            if bad:
                broken.append(f"{f.relative_to(REPO)} imports wattcast.{{{', '.join(sorted(bad))}}}")
    assert not broken, "\n".join(broken)


def test_allowed_edges_are_still_used():
    """An exception in ALLOWED that no longer exists must be removed, so the table cannot hide a new edge."""
    stale = [f"{f} -> {pkg}" for f, pkgs in ALLOWED.items() for pkg in pkgs
             if not (REPO / f).is_file() or pkg not in _imports(REPO / f)]
    assert not stale, "stale ALLOWED entries: " + ", ".join(stale)


def test_validation_is_its_own_package():
    assert (REPO / "validation" / "__init__.py").is_file()
    for name in ("e2e_run", "e2e_labels", "mpt_validation", "distributed_validation", "footprint_validation",
                 "validation_rows", "trace_validation"):
        assert (REPO / "validation" / f"{name}.py").is_file() and not (REPO / "training" / f"{name}.py").exists()


def test_lifecycle_is_its_own_package():
    assert (REPO / "lifecycle" / "__init__.py").is_file()
    for name in ("energy", "cost", "goodput", "assumptions", "footprint"):
        assert (REPO / "lifecycle" / f"{name}.py").is_file()
    assert not (REPO / "simulate" / "lifecycle.py").exists()
