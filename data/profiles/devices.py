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
