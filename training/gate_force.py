"""What the gated trainers (``train collectives``, ``train power``) share: ``--force``, the gate's verdict overridden
when asked in the wording of ``train kernels --force`` (training/kernel_run.py ``gate_decision``), and the shipped
model as the reference of a target that holds none."""

from __future__ import annotations

from pathlib import Path


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
    why = why.replace(f"kept the existing {kind} model", "not made current (the target is left as it was)")
    return (f"{missing}, so the new model was compared with the shipped one (the model `predict` uses without "
            f"{option}): {why}")
