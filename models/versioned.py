"""Versioned model folders with one atomic pointer switch (shared by the kernel bundle, the collective correction
and the power model).

A retrained model's target folder holds ``<versions>/<name>/`` (each version written) and a pointer file naming the
live one. A new version is written to ``<versions>/.tmp-<name>/``, loaded and checked there, renamed to
``<versions>/<name>/`` and made live by writing the pointer to a temporary file and renaming it over the old pointer
(one ``os.replace``, atomic on POSIX). So a kill at any moment leaves either the previous version live (and at most a
``.tmp-*`` folder or an unreferenced version, pruned later) or the new one. A folder without the pointer (the shipped
``models/artifacts/`` flat layout, older retrained folders) is itself the model.

Each kind of model has its own pointer and versions folder (:class:`Layout`), so the three can share a target folder
(the shipped ``models/artifacts/`` holds all three) without one's pruning touching another's versions.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

#: versions a folder keeps besides the live one and the one before it
KEEP_OLD_VERSIONS = 3
#: models the gate refused kept in ``target/<refused>/`` (the newest ones; pruned on their own, never counted against
#: the rollback versions: until stop 46b three refused bundles in ``versions/`` pruned four real rollback versions)
KEEP_REFUSED = 3
#: a ``.tmp-*`` version folder older than this (s) is a crashed write: removed at the next switch
STALE_TMP_SECONDS = 3600.0


@dataclass(frozen=True)
class Layout:
    """Where one kind of model keeps its versions: ``target/<versions>/<name>/`` and the pointer ``target/<pointer>``."""

    pointer: str
    versions: str
    what: str  # named in errors: "bundle", "collective model", "power model"
    #: the folder (under the target) a model the gate refused is kept in, apart from ``versions``; "" when this kind
    #: of model has no gate that keeps refused ones
    refused: str = ""


def read_pointer(folder: str | Path, layout: Layout, error: type[Exception] = ValueError) -> str | None:
    """The version name ``folder/<pointer>`` holds (None without a pointer); ``error`` for a malformed one."""
    ptr = Path(folder) / layout.pointer
    if not ptr.is_file():
        return None
    name = ptr.read_text(encoding="utf-8", errors="replace").strip()
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise error(f"{ptr}: not a {layout.what} version name ({name!r})")
    return name


def resolve_live(folder: str | Path, layout: Layout, error: type[Exception] = ValueError) -> Path:
    """The folder holding the live model: ``folder/<versions>/<pointer's name>`` when ``folder`` has a pointer, else
    ``folder`` itself (flat layout). ``error`` (naming the pointer) when it names a missing version."""
    folder = Path(folder)
    name = read_pointer(folder, layout, error)
    if name is None:
        return folder
    live = folder / layout.versions / name
    if not live.is_dir():
        raise error(f"{folder / layout.pointer} names {layout.what} version {name!r}, but {live} is missing")
    return live


def new_version_name() -> str:
    """A unique version name that sorts by creation time: UTC time to the microsecond + 8 random hex digits
    (``20261125T201723.123456-1a2b3c4d``; pruning keeps the newest by name)."""
    now = time.time()
    return (time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}-" + uuid.uuid4().hex[:8])


def install_version(target: str | Path, layout: Layout, write: Callable[[Path], object], check: Callable[[Path], object],
                    keep: int | None = None, activate: bool = True) -> Path:
    """Write a new version of a model under ``target/<versions>/`` with ``write(folder)``, run ``check(folder)`` on it
    (load it back, compare; raise to refuse it), then make it live with one atomic rename of the pointer, under a lock
    on ``target/.lock`` (concurrent trainings serialise their switches). Versions other than the new one, the one it
    replaces and the ``keep`` (default :data:`KEEP_OLD_VERSIONS`) newest others are pruned. Returns the new version's folder.

    A failure (or a kill) before the pointer's rename leaves the previous model live; the half-written or unreferenced
    version is removed here when the failure is an exception, and pruned by a later switch when it was a kill.

    ``activate=False`` writes and checks the model the same way into ``target/<layout.refused>/<name>/`` instead and
    leaves the pointer and ``versions`` alone: a model the gate did not accept is kept apart from the rollback versions
    (usable by its folder, never made live); that folder keeps its :data:`KEEP_REFUSED` newest, pruned on their own."""
    import fcntl

    target = Path(target)
    if not activate:
        if not layout.refused:
            raise ValueError(f"a {layout.what} has no folder for refused models (Layout.refused)")
        return _keep_refused(target / layout.refused, write, check)
    versions = target / layout.versions
    final = _write_checked(versions, write, check)
    name = final.name
    with open(target / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            ptr_tmp = target / f".{layout.pointer}.{name}.tmp"
            try:
                previous = read_pointer(target, layout)
            except ValueError:  # a malformed pointer: nothing worth keeping
                previous = None
            try:
                ptr_tmp.write_text(name + "\n", encoding="utf-8")
                os.replace(ptr_tmp, target / layout.pointer)
            except BaseException:
                # the switch did not happen: the previous version stays live; drop what this install wrote
                ptr_tmp.unlink(missing_ok=True)
                shutil.rmtree(final, ignore_errors=True)
                raise
            prune(versions, {name, previous}, KEEP_OLD_VERSIONS if keep is None else keep)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return final


def _keep_refused(folder: Path, write: Callable[[Path], object], check: Callable[[Path], object]) -> Path:
    """Write and check a refused model as ``folder/<name>/`` (temporary name, then a rename) and prune ``folder`` to
    its :data:`KEEP_REFUSED` newest. OSError (e.g. a read-only install) is the caller's to report."""
    final = _write_checked(folder, write, check)
    prune(folder, {final.name}, KEEP_REFUSED - 1)
    return final


def _write_checked(folder: Path, write: Callable[[Path], object], check: Callable[[Path], object]) -> Path:
    """A new version in ``folder``: written and checked under a temporary name, then renamed (whole or absent)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = new_version_name()
    tmp, final = folder / f".tmp-{name}", folder / name
    try:
        write(tmp)
        check(tmp)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def prune(versions: Path, keep_names: set, keep: int) -> None:
    """Remove the versions in ``versions`` other than ``keep_names`` and the ``keep`` newest others, and ``.tmp-*``
    folders older than :data:`STALE_TMP_SECONDS` (crashed writes; a concurrent install's fresh one is left alone)."""
    old = sorted(p for p in versions.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in keep_names)
    for p in old[:-keep] if keep else old:
        shutil.rmtree(p, ignore_errors=True)
    now = time.time()
    for p in versions.glob(".tmp-*"):
        try:
            if p.is_dir() and now - p.stat().st_mtime > STALE_TMP_SECONDS:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass
