"""The wheel carries every package: pyproject lists packages by hand (the folders map onto ``wattcast.*``), so a new
sub-package left out of the list works in an editable install and is missing from a wheel
(``wattcast.featurize.torch_import`` was, until stop 35: ``wattcast.predict`` on a ``torch.nn.Module`` failed there)."""

from __future__ import annotations

import tomllib

from conftest import REPO


def test_every_package_folder_is_in_the_wheel():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    dirs = {name: REPO / folder for name, folder in cfg["package-dir"].items()}
    found = set()
    for name, root in dirs.items():
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            if "__pycache__" in rel.parts:
                continue
            found.add(".".join([name, *rel.parts]))
    assert found - listed == set(), f"package folders missing from pyproject's packages: {sorted(found - listed)}"
    assert listed - found == set(), f"packages listed without a folder: {sorted(listed - found)}"
