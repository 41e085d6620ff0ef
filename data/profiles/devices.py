"""Device names recorded by profilers -> catalog names."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=256)
def catalog_name(name: str) -> str:
    """The catalog name for a profiler's GPU name (``NVIDIA A100-PG509-200``, ``Tesla V100-SXM2-32GB``...),
    or '' when the catalog has no such device (the raw name stays in the ``device_name`` column)."""
    from wattcast.data.catalog import find_device

    text = str(name or "").strip()
    if not text:
        return ""
    spec = find_device(text)
    if spec is None and text.lower().startswith(("nvidia ", "tesla ")):
        spec = find_device(text.split(" ", 1)[1])
    return spec.name if spec is not None else ""


def device_labels(recorded: str, device: str | None) -> tuple[str, str]:
    """(device_name, Device) of a row: ``device_name`` is the GPU name as the file records it (the ``--device`` name
    only when the file records none), ``Device`` the ``--device`` override, else the recorded name's catalog name."""
    recorded = str(recorded or "")
    if device:
        return recorded or device, catalog_name(device) or device
    return recorded, catalog_name(recorded)


def override_warning(recorded_names, device: str | None) -> str | None:
    """A warning when ``--device`` names another GPU than a catalog GPU the file records (an A100 trace imported as
    L4 relabels every row); None when they agree, nothing is recorded, or the recorded name is not in the catalog
    (naming such a GPU is what --device is for)."""
    if not device:
        return None
    want = catalog_name(device) or device
    other = sorted({f"{n} (= {catalog_name(n)})" for n in recorded_names if catalog_name(n) and catalog_name(n) != want})
    if not other:
        return None
    return (f"--device {device} disagrees with the GPU the file records: {', '.join(other)}; its rows are labelled "
            f"{want} as asked ('Device'), 'device_name' keeps the recorded name: check --device")
