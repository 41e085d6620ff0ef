"""One entry point for every profiling format: ``import_files(paths) -> Profile`` (format told from the content)."""

from __future__ import annotations

from pathlib import Path

from wattcast.data.profiles.tables import Profile, ProfileImportError

FORMATS = ("kineto", "nsys", "nccl-tests", "nvidia-smi", "dcgm")


def detect_format(path: str | Path) -> str:
    """The format of ``path`` from its first bytes (not its name); ProfileImportError when it is none we read."""
    p = Path(path)
    if not p.is_file():
        raise ProfileImportError(f"{p}: no such file" if not p.exists() else f"{p}: not a file")
    if p.suffix == ".nsys-rep" or p.suffix == ".qdrep":
        raise ProfileImportError(f"{p}: a binary Nsight Systems report; export it first: "
                                 f"nsys export --type sqlite --output {p.stem}.sqlite {p.name}")
    try:
        with p.open("rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise ProfileImportError(f"{p}: cannot read ({e.strerror or e})") from None
    if not head:
        raise ProfileImportError(f"{p}: empty file")
    if head[:2] == b"\x1f\x8b" or head.lstrip()[:1] in (b"{", b"["):
        return "kineto"
    if head.startswith(b"SQLite format 3\x00"):
        return "nsys"
    from wattcast.data.profiles.nccl_tests import looks_like_nccl_tests
    from wattcast.data.profiles.power_logs import sniff

    text = head.decode("utf-8", errors="replace")
    if looks_like_nccl_tests(text) or "nThread" in text:
        return "nccl-tests"
    kind = sniff(text)
    if kind:
        return kind
    if "xla.GemmPerfTable" in text or p.suffix in (".whl", ".txtpb"):
        raise ProfileImportError(f"{p}: an XLA GEMM table (or a wheel that may embed one) is not a profile; give it to "
                                 f"`wattcast train kernels --xla-table {p.name}` (or WATTCAST_XLA_TABLE), see "
                                 "data/xla_perf_table.py")
    raise ProfileImportError(f"{p}: not a format wattcast imports ({', '.join(FORMATS)}): PyTorch profiler JSON "
                             "(.json/.json.gz), Nsight Systems SQLite export, nccl-tests stdout, nvidia-smi CSV, DCGM dmon log")


def import_file(profile: Profile, path: str | Path, device: str | None = None, collective: str | None = None) -> dict:
    """Add one file's rows to ``profile``; returns its notes (row counts, unmapped reasons)."""
    kind = detect_format(path)
    if kind == "kineto":
        from wattcast.data.profiles.kineto import import_kineto

        k, c, notes = import_kineto(path, device)
        profile.add("kernels", k)
        profile.add("collectives", c)
    elif kind == "nsys":
        from wattcast.data.profiles.nsys import import_nsys

        k, c, notes = import_nsys(path, device)
        profile.add("kernels", k)
        profile.add("collectives", c)
    elif kind == "nccl-tests":
        from wattcast.data.profiles.nccl_tests import import_nccl_tests

        c, notes = import_nccl_tests(path, collective, device)
        profile.add("collectives", c)
    else:
        from wattcast.data.profiles.power_logs import import_dcgm, import_nvidia_smi

        w, notes = (import_nvidia_smi if kind == "nvidia-smi" else import_dcgm)(path, device)
        profile.add("power", w)
    profile.files.append(notes)
    return notes


def import_files(paths, device: str | None = None, collective: str | None = None) -> Profile:
    prof = Profile()
    for p in paths:
        import_file(prof, p, device, collective)
    return prof
