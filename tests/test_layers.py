"""The house rules of the layout, checked on the source: which folder may import which."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: folder -> the wattcast packages it must never import (at module level or inside functions)
FORBIDDEN = {
    "data": {"featurize", "models", "simulate", "training", "validation"},
    "featurize": {"models", "simulate", "training", "validation"},
    "models": {"simulate", "training", "validation"},
    "simulate": {"training", "validation"},
    "training": {"simulate", "validation"},
}


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
            bad = _imports(f) & banned
            if bad:
                broken.append(f"{f.relative_to(REPO)} imports wattcast.{{{', '.join(sorted(bad))}}}")
    assert not broken, "\n".join(broken)


def test_validation_is_its_own_package():
    assert (REPO / "validation" / "__init__.py").is_file()
    for name in ("e2e_run", "e2e_labels", "mpt_validation", "distributed_validation", "footprint_validation",
                 "validation_rows", "trace_validation"):
        assert (REPO / "validation" / f"{name}.py").is_file() and not (REPO / "training" / f"{name}.py").exists()
