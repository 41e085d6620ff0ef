"""The project's held-out GPUs, for every trainer (kernels, power, collectives).

NVIDIA L4 and A100 80GB PCIe (``wattcast.data.kernel_datasets.HELDOUT_DEVICES``) are never trained, tuned or
selected on. A held-out GPU is recognised by its hardware figures, not only by its name: a spec file that copies
L4.yaml under another name is the L4 (``wattcast.data.catalog_match.catalog_twin``). ``--holdout X`` adds X to these
defaults; it never removes them.
"""

from __future__ import annotations

from typing import Iterable

from wattcast.data.kernel_datasets import HELDOUT_DEVICES


def holdout_name(name: str, specs: Iterable = ()) -> str:
    """The device a ``--holdout`` value names: a GPU of the run's ``--spec`` files (``specs``) by its name or an alias
    (matched as the catalog matches, case- and punctuation-insensitively: ``data.device_spec.normalise_name``), else
    a catalog device (name or alias) or a spec file's device (``resolve_device``). DeviceSpecError otherwise, listing
    the run's --spec GPUs too (until stop 57 a --spec GPU's name was refused: "unknown device 'MyGPU-Y'", only its
    file's path worked)."""
    from wattcast.data.catalog import resolve_device
    from wattcast.data.device_spec import DeviceSpecError, normalise_name

    specs = list(specs)
    key = normalise_name(name)
    for s in specs:
        if key in {normalise_name(n) for n in (s.name, *(s.aliases or ()))}:
            return s.name
    try:
        return resolve_device(name).name
    except DeviceSpecError as e:
        if not specs:
            raise
        raise DeviceSpecError(f"{e} Nor is it a GPU of this run's --spec files: "
                              f"{', '.join(repr(s.name) for s in specs)}.") from None


def with_default_holdout(extra: Iterable[str] = (), specs: Iterable = ()) -> tuple[str, ...]:
    """The default held-out GPUs followed by ``extra`` (device names where they resolve, the run's ``specs`` first:
    :func:`holdout_name`; order kept, no repeats): an extra --holdout adds to the defaults, never replaces them."""
    from wattcast.data.device_spec import DeviceSpecError

    specs = list(specs)
    out: list[str] = []
    # the defaults are the catalog's GPUs, whatever a --spec calls itself (a spec with the alias "L4" is not the L4)
    for name, among in [(n, []) for n in HELDOUT_DEVICES] + [(n, specs) for n in extra]:
        try:
            name = holdout_name(name, among)
        except (DeviceSpecError, FileNotFoundError, ValueError):
            pass
        if name not in out:
            out.append(name)
    return tuple(out)


def heldout_twin(spec, holdout: Iterable[str] = HELDOUT_DEVICES) -> str | None:
    """The held-out GPU (a name of ``holdout``) ``spec`` is, by its name or by its hardware figures (a renamed copy
    of a held-out catalog entry: :func:`wattcast.data.catalog_match.catalog_twin`), else None."""
    from wattcast.data.catalog_match import catalog_twin

    held = set(holdout)
    if spec is None:
        return None
    if spec.name in held:
        return spec.name
    twin = catalog_twin(spec)
    return twin.name if twin is not None and twin.name in held else None


def heldout_device_name(device: str, holdout: Iterable[str] = HELDOUT_DEVICES) -> str | None:
    """:func:`heldout_twin` of a device name, alias or spec file (None when it does not resolve)."""
    from wattcast.data.catalog import resolve_device

    held = set(holdout)
    if device in held:
        return device
    try:
        spec = resolve_device(device)
    except Exception:  # not a catalog GPU nor a spec file: nothing to match by figures
        return None
    return heldout_twin(spec, held)
