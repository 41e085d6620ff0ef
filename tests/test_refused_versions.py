"""A model the gate refused is kept in ``<target>/refused/``, pruned on its own, never counted against the rollback
versions (the review of stop 46: 5 accepted installs, 3 refused and 1 accepted left [good5, good6, refused0-2], the
rollback versions good1-4 deleted)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from wattcast.models.versioned import KEEP_REFUSED, Layout, install_version, read_pointer

L = Layout("CURRENT", "versions", "bundle", refused="refused")


def _writer(tag: str):
    def write(p: Path) -> None:
        p.mkdir(parents=True)
        (p / "tag").write_text(tag)
    return write


def _tags(folder: Path) -> list[str]:
    return sorted((p / "tag").read_text() for p in folder.iterdir() if not p.name.startswith("."))


def test_refused_installs_never_prune_rollback_versions(tmp_path):
    t = tmp_path / "target"
    for tag in ["good1", "good2", "good3", "good4", "good5"]:
        install_version(t, L, _writer(tag), lambda p: None, keep=3)
        time.sleep(0.002)
    for i in range(5):
        kept = install_version(t, L, _writer(f"refused{i}"), lambda p: None, keep=3, activate=False)
        assert kept.parent == t / "refused"
        time.sleep(0.002)
    assert _tags(t / "versions") == ["good1", "good2", "good3", "good4", "good5"]
    install_version(t, L, _writer("good6"), lambda p: None, keep=3)
    # live good6, the one before it good5, and the 3 newest others: good2-4 (good1 pruned as before)
    assert _tags(t / "versions") == ["good2", "good3", "good4", "good5", "good6"]
    assert (t / "versions" / read_pointer(t, L) / "tag").read_text() == "good6"
    # the refused folder keeps its newest few, on its own
    assert _tags(t / "refused") == [f"refused{i}" for i in range(5 - KEEP_REFUSED, 5)]


def test_refused_bundles_in_the_package_folder_are_gitignored():
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(["git", "check-ignore", "-q", "models/artifacts/refused/20261128T000000.000000-abcdef12/x"],
                       cwd=root, capture_output=True)
    assert r.returncode == 0, "models/artifacts/refused/ is not gitignored"
