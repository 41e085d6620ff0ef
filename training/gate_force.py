"""What the gated trainers share: ``--force``, the gate's verdict overridden when asked in the wording of ``train
kernels --force`` (training/kernel_run.py ``gate_decision``), the shipped model as the reference of a target that
holds none (``train collectives``, ``train power``), and a refused model kept apart for inspection (all three)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable


def forced(replaced: bool, reason: str, force: bool) -> tuple[bool, str]:
    """(install?, reason): the gate's verdict as is when it accepts; under ``force`` a refusal becomes an install
    that says what it overrode; otherwise the refusal gains the hint to rerun with --force."""
    if replaced:
        return replaced, reason
    if force:
        return True, f"made current by --force although the gate would have {reason[0].lower()}{reason[1:]}"
    return False, f"{reason}; rerun with --force to make it current anyway"


def shipped_reference(target, shipped) -> Path:
    """The shipped model's folder ``shipped``, the reference a new model is judged against when ``target`` holds no
    working model; ValueError when ``target`` is that folder (nothing else to compare with)."""
    if Path(target).resolve() == Path(shipped).resolve():
        raise ValueError("the target is the shipped folder")
    return Path(shipped)


def against_shipped(missing: str, why: str, kind: str, option: str) -> str:
    """The gate's verdict ``why`` on a new ``kind`` model judged against the shipped one because the target had none
    (``missing`` says why), naming the ``option`` that picks another model at prediction time."""
    why = why.replace(f"kept the existing {kind} model", "not made current (the target still has no live model)")
    return (f"{missing}, so the new model was compared with the shipped one (the model `predict` uses without "
            f"{option}): {why}")


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
