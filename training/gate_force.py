"""``--force`` for the gated trainers (``train collectives``, ``train power``): the gate's verdict, overridden when
asked, in the wording of ``train kernels --force`` (training/kernel_run.py ``gate_decision``)."""

from __future__ import annotations


def forced(replaced: bool, reason: str, force: bool) -> tuple[bool, str]:
    """(install?, reason): the gate's verdict as is when it accepts; under ``force`` a refusal becomes an install
    that says what it overrode; otherwise the refusal gains the hint to rerun with --force."""
    if replaced:
        return replaced, reason
    if force:
        return True, f"made current by --force although the gate would have {reason[0].lower()}{reason[1:]}"
    return False, f"{reason}; rerun with --force to make it current anyway"
