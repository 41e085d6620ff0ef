"""When a device spec *is* a catalog device: the test that lets figures kept in tables keyed by catalog name (cloud
prices, MAMF's measured matmul ceilings, a die-area fallback) stand for a spec.

A name alone says nothing about the hardware: a spec file may copy a catalog entry under a name of its own, or call
another GPU by a catalog name. :func:`catalog_spec_matches` (the lifecycle's prices) trusts a name only when the
spec's hardware figures are the catalog entry's of that name; :func:`catalog_twin` (the kernel surrogates' measured
ceilings) also finds the catalog entry whose figures a spec repeats under another name, so identical figures get
identical predictions; :func:`compute_twin` the catalog device with the same compute silicon (an A100 SXM4 40 GB for
the 80 GB's measured ceiling, in fused attention's scaling), and :func:`twin_base_clock` the base clock such a device
lists when a spec leaves it out (the H200 takes the H100 SXM5's). All live here, below ``models`` and ``lifecycle``, so
either may import them.
"""

from __future__ import annotations

from dataclasses import fields

from wattcast.data.device_spec import DeviceSpec

#: DeviceSpec fields that only cite or name a figure; two specs that differ only in these are one device
CITATION_FIELDS = ("aliases", "source", "sources", "schema_version", "launch_price_usd")


def _same_hardware(ref: DeviceSpec, spec: DeviceSpec, skip: tuple[str, ...]) -> bool:
    return all(getattr(ref, f.name) == getattr(spec, f.name) for f in fields(ref) if f.name not in skip)


def catalog_spec_matches(spec: DeviceSpec) -> bool:
    """True when ``spec`` is the catalog's own device of its name: the same object, or the same hardware
    figures (citations, aliases and the launch price aside). Only then may figures kept in tables keyed by
    the catalog name (cloud price, a sibling's price, a die-area fallback) stand for ``spec``."""
    from wattcast.data.catalog import load_catalog

    ref = load_catalog().get(spec.name)
    if ref is None:
        return False
    return ref is spec or _same_hardware(ref, spec, CITATION_FIELDS)


def catalog_twin(spec: DeviceSpec) -> DeviceSpec | None:
    """The catalog device ``spec`` is, judged by its hardware figures (citations, aliases, the launch price and the
    name aside), else None:

    - the catalog entry of ``spec``'s own name when the figures match it (:func:`catalog_spec_matches`);
    - else the one catalog entry whose figures ``spec`` repeats under another name (a spec file that copies the
      MI300X entry as "MyMI300X", a NeuSight JSON named "NVIDIA H100 80GB HBM3" that fills the rest from the
      catalog): identical figures are one device and get identical predictions;
    - None for figures no catalog entry has, including a spec that borrows a catalog name for other hardware (a
      different GPU's figures named "MI300X" is not the MI300X), and figures two entries share (none today).
    """
    from wattcast.data.catalog import load_catalog

    cat = load_catalog()
    ref = cat.get(spec.name)
    if ref is not None and (ref is spec or _same_hardware(ref, spec, CITATION_FIELDS)):
        return ref
    skip = CITATION_FIELDS + ("name",)
    hits = [r for r in cat.values() if r.vendor == spec.vendor and _same_hardware(r, spec, skip)]
    return hits[0] if len(hits) == 1 else None


#: the figures of a GPU's compute silicon: two devices equal in all of them (an A100 SXM4 with 40 or 80 GB) run the same
#: tensor cores at the same clock and power and differ in memory only
COMPUTE_FIELDS = ("vendor", "arch", "num_sms", "cores_per_sm", "boost_clock_mhz", "tdp_w", "peak_fp32_tflops",
                  "peak_fp32_matrix_tflops", "peak_tf32_tflops", "peak_fp16_tflops", "peak_bf16_tflops",
                  "peak_fp8_tflops")
#: the relative difference two figures of one chip may show in the catalog (rounding: an A100's FP32 peak is 19.49 in
#: one entry and 19.492 in another)
COMPUTE_RTOL = 1e-3


def _same_figure(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= COMPUTE_RTOL * max(abs(a), abs(b))
    return a == b


def _same_compute(a: DeviceSpec, b: DeviceSpec) -> bool:
    """Whether ``a`` and ``b`` have the same compute silicon: every :data:`COMPUTE_FIELDS` figure the same."""
    return all(_same_figure(getattr(a, f), getattr(b, f)) for f in COMPUTE_FIELDS)


def compute_twin(spec: DeviceSpec, among) -> str:
    """The catalog device among the names ``among`` whose compute figures (:data:`COMPUTE_FIELDS`) equal ``spec``'s
    (numbers within :data:`COMPUTE_RTOL`), when exactly one does, else ''."""
    from wattcast.data.catalog import load_catalog

    cat = load_catalog()
    hits = [n for n in among if n in cat and _same_compute(cat[n], spec)]
    return hits[0] if len(hits) == 1 else ""


def power_siblings(spec: DeviceSpec, among) -> tuple[list[str], list[str]]:
    """(the catalog devices among the names ``among`` with ``spec``'s compute silicon at a power limit no higher than
    ``spec``'s, those at one no lower): every :data:`COMPUTE_FIELDS` figure but ``tdp_w`` the same (numbers within
    :data:`COMPUTE_RTOL`). A spec can be capped to a lower limit, so what the silicon measured there is within its
    reach (a lower bound on its matmul ceiling), and it can reach no more than the same silicon given more power (an
    upper bound): models/kernel_predictor.py ``_device_ceilings``. Both empty when ``spec`` has no ``tdp_w``."""
    from wattcast.data.catalog import load_catalog

    if not spec.tdp_w:
        return [], []
    cat = load_catalog()
    same = [f for f in COMPUTE_FIELDS if f != "tdp_w"]
    hits = [n for n in among if n in cat and cat[n].tdp_w
            and all(_same_figure(getattr(cat[n], f), getattr(spec, f)) for f in same)]
    tdp = float(spec.tdp_w)
    lower = [n for n in hits if float(cat[n].tdp_w) <= tdp * (1 + COMPUTE_RTOL)]
    upper = [n for n in hits if float(cat[n].tdp_w) >= tdp * (1 - COMPUTE_RTOL)]
    return lower, upper


def twin_base_clock(spec: DeviceSpec) -> tuple[float, tuple[str, ...]] | None:
    """The base clock (MHz) of ``spec``'s compute silicon when the spec leaves ``base_clock_mhz`` out and the catalog
    devices that list one and share every compute figure with it (:data:`COMPUTE_FIELDS`, numbers within
    :data:`COMPUTE_RTOL`: same SMs, boost clock, TDP and peaks) all list the same one: ``(MHz, their names)``. Where
    they disagree (A100 SXM4 40 GB 1095 and 80 GB 1275 MHz at the same 1410 MHz boost), the one whose every other
    hardware figure the spec repeats (a copy of the 80 GB entry without its base clock) gives it. None when the spec
    gives its own, when no such device lists one, or when they still disagree.

    The kernel-time surrogate reads the base/boost clock ratio (featurize/kernel_features.py
    ``dev_base_over_boost``), FP32 GEMMs most: with it missing LightGBM routes the spec like its training GPUs
    without one (B200, MI210, MI300X, MI355X), which moved the H200 (the H100 SXM5's GH100 die, peaks, SMs and
    1980 MHz boost; NVIDIA's H200 datasheet lists no clocks) 5-6.6% slower than the H100 on every FP32 GEMM of
    2048^3 and above. No training GPU gains a value here (tests): the features the shipped bundle was fitted on stay
    as they were."""
    if spec.base_clock_mhz:
        return None
    from wattcast.data.catalog import load_catalog

    hits = [r for r in load_catalog().values()
            if r.base_clock_mhz and _same_compute(r, spec)]
    if len({float(r.base_clock_mhz) for r in hits}) > 1:
        skip = CITATION_FIELDS + ("name", "base_clock_mhz")
        hits = [r for r in hits if _same_hardware(r, spec, skip)]
    clocks = {float(r.base_clock_mhz) for r in hits}
    if len(clocks) != 1:
        return None
    return clocks.pop(), tuple(sorted(r.name for r in hits))
