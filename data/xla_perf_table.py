"""XLA's measured GEMM table (``xla.GemmPerfTable``) from wherever a user has it: the textproto, or the JAX GPU plugin.

OpenXLA measures every ``dot`` of a grid (b in {1, 2, 4}; m, n, k in {256 ... 4096}) on each GPU it models with
``xla/tools/matmul_perf_table_gen.cc`` (CUPTI kernel times, 5 traced runs after a warm-up) and keeps the result as
``xla/service/gpu/model/default_matmul_perf_table.txtpb`` (Apache-2.0). The shared dataset's
``tensorcore/xla_matmul_perf_table.csv`` is that file from an August 2026 snapshot with the B200 and MI355X rows
only. The same textproto is compiled into the JAX CUDA plugin as an embedded file, so the wheel on PyPI carries it
whole: ``jax-cuda13-pjrt==0.12.0.1`` (built 2026-10-20) holds sm_100_B200 and gfx950 (identical, row for row, to
the shared CSV), plus **sm_90 (H100)**, **gfx942 (MI300X class)** and sm_107. The kernel loader keeps the gfx942
rows and leaves sm_90's out: the shared datasets withhold the Hopper generation on purpose
(``data.kernel_datasets.WITHHELD_DEVICES``).

    pip download jax-cuda13-pjrt==0.12.0.1 --no-deps -d /tmp/jax
    python -m wattcast.data.xla_perf_table /tmp/jax/jax_cuda13_pjrt-*.whl --output xla_gemm_table.csv
    export WATTCAST_XLA_TABLE=$PWD/xla_gemm_table.csv      # or the .whl / .so / .txtpb itself

:func:`read_xla_gemm_table` reads a ``.txtpb``/``.textproto`` file, a CSV written by this module, a binary with the
textproto embedded (the plugin's ``xla_cuda_plugin.so``) or a wheel/zip holding such a binary, and returns the
shared CSV's columns (``device, b, m, n, k, lhs_dtype, rhs_dtype, out_dtype, flops_per_s, tflops,
derived_time_us``). ``data.kernel_datasets.load_kernels`` adds its rows to the ``xla`` source (the shared CSV's rows
win where both have a shape) when ``WATTCAST_XLA_TABLE`` or its ``xla_tables`` argument names one. The file is read
where it is, never copied into the project.
"""

from __future__ import annotations

import argparse
import os
import re
import zipfile
from pathlib import Path

import pandas as pd

#: environment variable naming extra XLA GEMM tables (os.pathsep-separated paths)
XLA_TABLE_ENV = "WATTCAST_XLA_TABLE"
#: the columns of the shared ``tensorcore/xla_matmul_perf_table.csv`` (and of this module's output)
TABLE_COLUMNS = ("device", "b", "m", "n", "k", "lhs_dtype", "rhs_dtype", "out_dtype", "flops_per_s", "tflops",
                 "derived_time_us")
_MESSAGE = b"xla.GemmPerfTable"
_DEVICE_RE = re.compile(r'^entries \{\s*\n\s*key: "([^"]+)"\s*\n(.*?)^\}', re.S | re.M)
_ENTRY_RE = re.compile(r"entries \{\s*b: (\d+)\s+m: (\d+)\s+n: (\d+)\s+k: (\d+)\s+((?:flops \{[^}]*\}\s*)+)\}", re.S)
_FLOPS_RE = re.compile(r'flops \{ key: "([^"]+)" value: (\d+) \}')
_PRINTABLE_RUN = re.compile(rb"[\t\n\r\x20-\x7e]{512,}")


class XlaTableError(ValueError):
    """A file that holds no readable XLA GEMM table, or one whose entries are malformed."""


def _tables_in_bytes(blob: bytes) -> list[str]:
    """Every embedded GemmPerfTable textproto in a binary: the printable runs that declare the message."""
    out = []
    for m in _PRINTABLE_RUN.finditer(blob):
        if _MESSAGE in m.group(0):
            out.append(m.group(0).decode("ascii"))
    return out


def table_texts(path: str | os.PathLike[str]) -> list[str]:
    """The GemmPerfTable textproto(s) in ``path`` (a .txtpb/.textproto file, a binary, or a wheel/zip of binaries)."""
    p = Path(path)
    if not p.is_file():
        raise XlaTableError(f"{p}: no such file" if not p.exists() else f"{p}: not a file")
    if zipfile.is_zipfile(p):
        texts: list[str] = []
        with zipfile.ZipFile(p) as z:
            for info in z.infolist():
                name = info.filename
                if name.endswith((".so", ".txtpb", ".textproto")) or ".so." in name:
                    texts += _tables_in_bytes(z.read(info))
        if not texts:
            raise XlaTableError(f"{p}: no xla.GemmPerfTable in any .so/.txtpb of this archive (a JAX GPU plugin "
                                "wheel such as jax-cuda13-pjrt 0.12 carries one)")
        return texts
    blob = p.read_bytes()
    if _MESSAGE not in blob and b"flops { key:" not in blob:
        raise XlaTableError(f"{p}: not an XLA GEMM table (no 'xla.GemmPerfTable' textproto in it)")
    if b"\x00" not in blob[:4096]:  # a text file: the textproto itself
        return [blob.decode("utf-8", errors="replace")]
    texts = _tables_in_bytes(blob)
    if not texts:
        raise XlaTableError(f"{p}: names xla.GemmPerfTable but holds no readable table text")
    return texts


def parse_gemm_perf_table(text: str, origin: str = "<text>") -> pd.DataFrame:
    """One row per (device, b, m, n, k, lhs x rhs -> out) of a GemmPerfTable textproto, in :data:`TABLE_COLUMNS`.

    XLA's dot: lhs (b, m, k) by rhs (b, k, n), k the contraction; ``flops_per_s`` = 2 b m n k / kernel time."""
    rows = []
    for dev in _DEVICE_RE.finditer(text):
        device, body = dev.group(1), dev.group(2)
        n_open = body.count("entries {")
        found = 0
        for e in _ENTRY_RE.finditer(body):
            found += 1
            b, m, n, k = (int(v) for v in e.groups()[:4])
            for key, val in _FLOPS_RE.findall(e.group(5)):
                head, sep, out = key.partition("->")
                lhs, x, rhs = head.partition("x")
                if not sep or not x:
                    raise XlaTableError(f"{origin}: device {device!r}: flops key {key!r} is not 'LHSxRHS->OUT'")
                rows.append((device, b, m, n, k, lhs, rhs, out, int(val)))
        if found != n_open:
            raise XlaTableError(f"{origin}: device {device!r}: {n_open - found} of {n_open} entries are not "
                                "'b: m: n: k: flops {...}' blocks")
    if not rows:
        raise XlaTableError(f"{origin}: no GEMM entries (expected 'entries {{ key: \"sm_..\" value {{ entries {{ b: .. "
                            "m: .. n: .. k: .. flops {{ key: .. value: .. }} }} }} }}')")
    df = pd.DataFrame(rows, columns=list(TABLE_COLUMNS[:-2]))
    bad = df["flops_per_s"] <= 0
    if bad.any():
        raise XlaTableError(f"{origin}: {int(bad.sum())} entries have a non-positive flops value")
    df["tflops"] = df["flops_per_s"] / 1e12
    df["derived_time_us"] = 2.0 * df["b"] * df["m"] * df["n"] * df["k"] / df["flops_per_s"] * 1e6
    return df


def read_xla_gemm_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """The GEMM rows of ``path`` (textproto, CSV in :data:`TABLE_COLUMNS`, plugin binary or wheel), duplicates
    across embedded copies dropped."""
    p = Path(path)
    if p.suffix.lower() == ".csv":
        if not p.is_file():
            raise XlaTableError(f"{p}: no such file")
        df = pd.read_csv(p)
        missing = [c for c in TABLE_COLUMNS[:-2] if c not in df.columns]
        if missing:
            raise XlaTableError(f"{p}: missing column(s) {missing} (expected {list(TABLE_COLUMNS)})")
        return df
    frames = [parse_gemm_perf_table(t, str(p)) for t in table_texts(p)]
    df = pd.concat(frames, ignore_index=True)
    return df.drop_duplicates(subset=list(TABLE_COLUMNS[:8]), keep="first").reset_index(drop=True)


def tables_from_env() -> list[Path]:
    """The paths :data:`XLA_TABLE_ENV` names (none when it is unset or empty)."""
    raw = os.environ.get(XLA_TABLE_ENV, "")
    return [Path(s).expanduser() for s in raw.split(os.pathsep) if s.strip()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Extract XLA's measured GEMM table to a CSV (see the module docstring).")
    ap.add_argument("source", help=".txtpb, a JAX GPU plugin wheel (.whl) or its xla_cuda_plugin.so")
    ap.add_argument("--output", required=True, help="CSV to write (the shared xla_matmul_perf_table.csv's columns)")
    a = ap.parse_args(argv)
    df = read_xla_gemm_table(a.source)
    out = Path(a.output)
    if out.exists() and out.resolve() == Path(a.source).resolve():
        raise SystemExit(f"--output {out} is the source file; choose another path")
    df.to_csv(out, index=False)
    counts = df.groupby("device").size()
    print(f"{out}: {len(df)} rows; " + ", ".join(f"{d} {n}" for d, n in counts.items()))


if __name__ == "__main__":
    main()
