"""What the gated trainers share (``train kernels``, ``collectives``, ``power``): the gate's final message, a refusal
or, under ``--force``, an install saying what the gate would have refused (:func:`verdict`); the shipped model as the
reference of a target that holds none; and a refused model kept apart for inspection."""

from __future__ import annotations

from pathlib import Path
from typing import Callable


#: the end of a refusal's message (:func:`verdict`): the one place it is said, never inside a forced install's message
FORCE_HINT = "rerun with --force to make it current anyway"


def kept(kind: str) -> str:
    """How the gate's refusal of a new ``kind`` starts (its reason follows), as the gates' judges write it: what the
    gate does when the target has a working model. :func:`verdict` rewords it for a forced install and for a target
    with none."""
    return f"kept the existing {kind}: "


def shipped_reference(target, shipped) -> Path:
    """The shipped model's folder ``shipped``, the reference a new model is judged against when ``target`` holds no
    working model; ValueError when ``target`` is that folder (nothing else to compare with)."""
    if Path(target).resolve() == Path(shipped).resolve():
        raise ValueError("the target is the shipped folder")
    return Path(shipped)


def verdict(ok: bool, why: str, force: bool, kind: str, option: str, against: str | None = None,
            noun: str = "model", unchanged: str = "the target still has no live model") -> tuple[bool, str]:
    """(install?, reason): the gate's final word on a new ``kind`` (``bundle``, ``collective model``, ``power model``).

    ``why``: the judge's text, a refusal starting with :func:`kept`. ``against``: why the target has no working model,
    when the new one was judged against the shipped one (the ``noun`` ``predict`` uses without ``option``) instead;
    ``unchanged`` says what a refusal then leaves at the target. A refusal ends with :data:`FORCE_HINT`; under
    ``force`` it becomes an install saying what happened and why the gate would have refused it, without the
    refusal's own wording (until stop 57 the refusal was pasted whole: "made current by --force although the gate
    would have no working bundle at the target, ...: not made current ...; rerun with --force to make it current
    anyway")."""
    compared = None if against is None else (f"{against}, so the new {noun} was compared with the shipped one (the "
                                             f"{noun} `predict` uses without {option})")
    if ok:
        return True, why if compared is None else f"{compared}: {why}"
    because = why[len(kept(kind)):] if why.startswith(kept(kind)) else why
    if force:
        if compared is None:
            return True, f"made current by --force although the gate would have kept the existing {kind}: {because}"
        return True, f"made current by --force although the gate would have refused it: {compared}, and {because}"
    if compared is None:
        return False, f"{why}; {FORCE_HINT}"
    return False, f"{compared}: not made current ({unchanged}): {because}; {FORCE_HINT}"


def keep_refused(install: Callable[[], Path], target, folder: str, kind: str, option: str) -> str:
    """Keep a model the gate refused apart (``install()`` writes and checks it in ``target/<folder>/<name>/``, the
    newest few kept: models/versioned.py ``install_version(activate=False)``) and say where, with the ``option`` that
    predicts with it; when that folder cannot be written (a read-only install) say so: the working model stays live
    either way. Text to append to the gate's verdict."""
    import shlex

    try:
        kept = install()
    except OSError as e:  # PermissionError included: the refusal stands, only the copy is lost
        return (f". The new {kind} could not be kept in {Path(target) / folder} ({type(e).__name__}: {e}); "
                "rerun with --out DIR to a writable folder to keep it")
    return (f". The new {kind} is kept, not current, in {kept} (the {folder}/ folder keeps the newest few; predict "
            f"with it: {option} {shlex.quote(str(kept))})")
