"""Load every public kernel-latency source into one table (``load_kernels``).

The measurement files live outside the project (``../shared/datasets`` or a path the user
gives, see ``resolve_data_root``); they are read, never copied. Nothing is cached on disk.

Unified table (``COLUMNS``), one row per measured kernel:

``op, dtype, B, M, N, K, H, Input_Channel, Output_Channel, Kernel_Size, Input_Size, Stride,
Padding, device, latency_ms, source, origin``

Shape convention (NeuSight's, used everywhere in wattcast):

- ``bmm``    B, M, N, K: torch.bmm of (B, M, N) by (B, N, K): **N is the contraction dim**, output (B, M, K).
- ``linear`` B, M, N, K: nn.Linear(N, K, bias=True) on (B, M, N): N is the contraction dim.
  NeuSight's own linear sweeps always have B = 1, so every other source folds leading dims into M.
- elementwise ops, ``ln``, ``rmsnorm``, ``softmax``, ``silu_mul``: a (B, H) tensor.
- ``conv``   B, Input_Channel, Output_Channel, Kernel_Size, Input_Size, Stride, Padding:
  nn.Conv2d without bias on (B, C, S, S) (NeuSight's CSV spells the kernel column ``Kernel_Szie``).

Per-source decisions (evidence in brackets):

- ``neusight/kernels``, ``neusight/kernels_test``: FP32 (PyTorch 2.1 default: TF32 off for matmul).
  kernels_test/vec.csv = elem.csv + ln.csv + softmax.csv row for row [checked: 5,624 = 4,558 + 533 + 533,
  no new row after concatenation], so exact duplicates (all unified columns but ``origin``) are
  dropped, keeping the first file in sorted order (elem/ln/softmax).
- ``xla`` (``tensorcore/xla_matmul_perf_table.csv``): ``dot`` of lhs (b, m, k) by rhs (b, k, n), k the
  contraction (XLA's standard dot, flops = 2*b*m*n*k) -> bmm B=b, M=m, N=k, K=n. [On B200 the shape
  with the small output (m=n=256, k=4096) is the slowest of its three permutations, 10.1 us vs 6.0 us,
  as expected when k is reduced.] latency = 2*b*m*n*k / flops_per_s. One row per shape and input dtype
  (``XLA_DTYPES``): bf16->bf16 = bf16, f16->f16 = fp16, f8e4m3fn x f8e4m3fn -> bf16 = fp8 (the
  configuration both devices have); the other output types and the mixed e4m3/e5m2 pairs re-time the
  same shape and are left out so each (shape, dtype, device) has one label. f32 on sm_100 (B200) is
  **labelled tf32**, not fp32: it reaches 870 TFLOPS (median 291), ten times the B200's ~80 TFLOPS
  FP32 vector peak, so XLA's default precision ran it on TF32 tensor cores. f32 on gfx950 (MI355X) is
  **left out**: 1,023 TFLOPS against a 157 TFLOPS FP32 peak, and gfx950 has no TF32, so the precision it
  really ran in is unknown. Devices: sm_100_B200 -> B200, gfx950 -> MI355X (sm_90 has no rows here).
  **Extra XLA tables** (``xla_tables=`` or the ``WATTCAST_XLA_TABLE`` environment variable, see
  ``data/xla_perf_table.py``): the same textproto as compiled into the JAX CUDA plugin wheel carries more devices;
  their rows join the ``xla`` source (a shape the shared CSV has keeps the shared row). sm_90 (H100) rows are
  **left out**: the shared datasets withhold the Hopper generation on purpose (``WITHHELD_DEVICES``), and a table
  from elsewhere does not bring it back. gfx942 -> MI300X (the MI325X is gfx942 too, with the same peaks; MI300X
  assumed): bf16, f16 and f8e4m3fnuz x f8e4m3fnuz -> bf16 as fp8 (CDNA3's FP8 is the fnuz variant); f32 left out
  as on gfx950 (252 TFLOPS, 1.54x the FP32 peak: TF32 or not is unknown). sm_107 has no catalog device (excluded,
  counted).
  xla_hlo_op_profiles.csv (cycles per element, not latencies) and the MAMF table (a ceiling, not a
  sweep) are not read.
- ``deepbench``: C(M x N) = A(M x K) B(K x N), K the contraction (cuBLAS GEMM naming; the DeepSpeech rows
  M=1760, N=16..128 batch, K=1760 fit it) -> bmm B=1, M=M, N=K, K=N. Only non-transposed (NN) rows are
  kept (the layout of NeuSight's bmm): 77 of the 83 shapes per GPU/precision are timed NN, 77 of those
  again as TN or NT with up to 4x different times [TN/NT over NN: median 1.02, range 0.52-3.99]; the
  table has no transpose column, so keeping them would give one shape several labels. The 6 shapes
  timed only as NT are left out with the other transposed rows. "Float" = fp32; "16 bit inputs ..." = fp16
  (V100/T4 tensor-core mixed precision; P100 "pseudo FP16" = FP16 storage with FP32 math, which is
  what an FP16 GEMM on a P100 is). Form factors: SOURCE-deepbench.md names none, but the V100 FP32
  sheet peaks at 14.78 TFLOPS, above the V100-PCIe FP32 peak (14.0) and below the SXM2's (15.7): V100 ->
  V100-SXM2-16GB (memory size not stated; 16 GB was the 2017-18 part). P100 peaks at 9.12 TFLOPS,
  under the PCIe 16 GB part's 9.3: P100 -> Tesla-P100-PCIe-16GB. T4 -> Tesla-T4. 1080Ti is not in the
  catalog: its rows are excluded (logged, ``attrs["excluded"]``).
- ``vidur``: FP16, the ``median`` time of each op. a100 -> A100-SXM4-80GB (SOURCE-vidur.md: "A100 (80GB
  DGX)"), a40 -> A40. GEMMs become ``linear`` rows with B=1, M=num_tokens, head_dim = n_embd/n_head,
  TP = num_tensor_parallel_workers: attn_pre_proj N=n_embd, K=(n_head+2*n_kv_head)*head_dim/TP;
  attn_post_proj N=n_head*head_dim/TP, K=n_embd; mlp_up_proj N=n_embd, K=(2 if gated else 1)*
  n_expanded_embd/TP; mlp_down_proj N=n_expanded_embd/TP, K=n_embd. input_layernorm /
  post_attention_layernorm -> ``rmsnorm`` (Llama family, Qwen, InternLM) or ``ln`` (phi-2, a LayerNorm
  model; it has no post_attention_layernorm column) with B=num_tokens, H=n_embd; add -> ``add``
  (B=num_tokens, H=n_embd); mlp_act -> ``silu_mul`` when gated, else ``gelu`` (B=num_tokens,
  H=n_expanded_embd/TP). emb and attn_rope are skipped.
- ``llmcompass`` (FP16): matmul_*.csv columns M, N, K with inputs (M, K) @ (K, N) (its test_matmul.py),
  -> bmm B=1, M=M, N=K, K=N; softmax/layernorm: latency = M*N / (GEPS*1e9) s -> ``softmax``/``ln`` with
  B=M, H=N; gelu: latency = M / (GEPS*1e9) s -> ``gelu`` with B=1, H=M. The A100's form factor is not
  stated ("A100-80GB" in its transformer_layer file) and may be the held-out A100 80GB PCIe, so its rows
  get device ``A100-80GB-unknown`` (``split_heldout`` keeps them out of training and evaluation);
  MI210 -> MI210. The transformer_layer files (a whole TP=4 layer) are not kernels and are not read.

Bad data is never dropped silently: rows with a NaN/non-positive latency or shape are removed, logged
with a count, and counted per origin in ``df.attrs["dropped"]``; rows from devices outside the catalog
are counted in ``df.attrs["excluded"]``. A file that lacks a needed column raises ``KernelDataError``.

``load_label_nodes`` turns NeuSight's per-node torch.fx label graphs into rows of the same table, and
``load_user_kernels`` reads a user's own profiling CSV.
"""

from __future__ import annotations

import ast
import logging
import os
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from wattcast.data.checks import without_blank_rows
from wattcast.data.kernel_ops import DTYPE_BYTES, MAX_SHAPE_DIM, OP_FAMILY, bad_shape_values, canonical_dtype

log = logging.getLogger(__name__)

__all__ = [
    "COLUMNS",
    "SHAPE_COLUMNS",
    "LABEL_COLUMNS",
    "ALL_SOURCES",
    "SOURCE_NAMES",
    "CANONICAL_DEVICES",
    "DEVICE_MAP",
    "UNKNOWN_A100_80GB",
    "HELDOUT_DEVICES",
    "AMBIGUOUS_DEVICES",
    "XLA_DTYPES",
    "WITHHELD_DEVICES",
    "DataNotFoundError",
    "KernelDataError",
    "resolve_data_root",
    "load_kernels",
    "load_xla_fp8_combinations",
    "read_xla_tables",
    "load_label_nodes",
    "load_user_kernels",
    "split_heldout",
]


class DataNotFoundError(FileNotFoundError):
    """The public measurement data (or one of its folders) is not where we looked."""


class KernelDataError(ValueError):
    """A kernel CSV lacks a needed column or holds rows that cannot be used."""


# --------------------------------------------------------------------------------------------
# Table layout, sources, devices
# --------------------------------------------------------------------------------------------

GEMM_COLUMNS = ("B", "M", "N", "K")
VECTOR_COLUMNS = ("B", "H")
CONV_COLUMNS = ("B", "Input_Channel", "Output_Channel", "Kernel_Size", "Input_Size", "Stride", "Padding")
SHAPE_COLUMNS = ("B", "M", "N", "K", "H", "Input_Channel", "Output_Channel", "Kernel_Size", "Input_Size", "Stride", "Padding")
COLUMNS = ("op", "dtype", *SHAPE_COLUMNS, "device", "latency_ms", "source", "origin")
#: extra columns of ``load_label_nodes``
LABEL_COLUMNS = (*COLUMNS, "model", "mode", "node", "fw_latency_ms", "bw_latency_ms")

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")

ALL_SOURCES = ("neusight", "neusight_test", "xla", "deepbench", "vidur", "llmcompass")
#: ``sources`` key -> value of the ``source`` column
SOURCE_NAMES = {
    "neusight": "neusight/kernels",
    "neusight_test": "neusight/kernels_test",
    "xla": "xla",
    "deepbench": "deepbench",
    "vidur": "vidur",
    "llmcompass": "llmcompass",
}

CANONICAL_DEVICES = (
    "Tesla-P4", "Tesla-P100-PCIe-16GB", "Tesla-T4", "V100-PCIe-32GB", "V100-SXM2-16GB", "V100-SXM2-32GB",
    "A10", "A40", "A100-PCIe-40GB", "A100-PCIe-80GB", "A100-SXM4-40GB", "A100-SXM4-80GB", "L4", "L40S",
    "H100-PCIe-80GB", "H100-SXM5-80GB", "H200-SXM-141GB", "B200",
    "MI100", "MI210", "MI250", "MI250X", "MI300X", "MI355X",
)
#: an A100 80GB whose form factor the source does not state (LLMCompass); may be the held-out PCIe card
UNKNOWN_A100_80GB = "A100-80GB-unknown"
HELDOUT_DEVICES = ("L4", "A100-PCIe-80GB")
#: rows on these devices are neither training nor held-out data (see ``split_heldout``)
AMBIGUOUS_DEVICES = (UNKNOWN_A100_80GB,)

#: source -> raw device name -> catalog name. NeuSight names come from its ``Device`` column; label
#: folder names are the same with spaces replaced by underscores.
DEVICE_MAP: dict[str, dict[str, str]] = {
    "neusight": {
        "Tesla P4": "Tesla-P4",
        "Tesla P100-PCIE-16GB": "Tesla-P100-PCIe-16GB",
        "Tesla T4": "Tesla-T4",
        "Tesla V100-PCIE-32GB": "V100-PCIe-32GB",
        "NVIDIA A100-PCIE-40GB": "A100-PCIe-40GB",
        "NVIDIA A100 80GB PCIe": "A100-PCIe-80GB",
        "NVIDIA A100-SXM4-40GB": "A100-SXM4-40GB",
        "NVIDIA H100 80GB HBM3": "H100-SXM5-80GB",
        "NVIDIA L4": "L4",
        "AMD Instinct MI100": "MI100",
        "AMD Instinct MI210": "MI210",
        "AMD Instinct MI250": "MI250",
    },
    "xla": {"sm_100_B200": "B200", "gfx950": "MI355X", "sm_90": "H100-SXM5-80GB", "gfx942": "MI300X"},
    # SOURCE-deepbench.md names no form factor; chosen from the measured FP32 peaks (module docstring)
    "deepbench": {"V100": "V100-SXM2-16GB", "P100": "Tesla-P100-PCIe-16GB", "T4": "Tesla-T4"},
    # SOURCE-vidur.md: "A100 (80GB DGX)" = SXM4 80GB
    "vidur": {"a100": "A100-SXM4-80GB", "a40": "A40"},
    "llmcompass": {"A100": UNKNOWN_A100_80GB, "MI210": "MI210"},
}

#: Hardware the shared datasets deliberately withhold (``datasets/README.md``: some hardware is absent from every
#: folder, kept aside to measure how the surrogates do on hardware they never saw, "do not try to recover it
#: elsewhere"): the Hopper generation's compute measurements were taken out of each copy (the XLA matmul table's and
#: HLO profiles' sm_90 rows, Vidur's h100 profiles, the MAMF table's H100 / GH200 rows, NeuSight's H100 labels; each
#: SOURCE file still names them). An extra XLA table (the JAX CUDA plugin wheel's carries sm_90) would bring them
#: back: its rows on these devices are left out and counted in ``attrs["excluded"]``. Spec sheets, the nccl-tests
#: logs and ML.ENERGY's power figures (a network and a board's power, not a GPU's kernels) are not withheld.
WITHHELD_DEVICES = ("H100-SXM5-80GB", "H100-PCIe-80GB", "H200-SXM-141GB")

#: XLA (lhs, rhs, out) dtypes kept, per device, and the dtype label they get (module docstring)
XLA_DTYPES: dict[str, dict[tuple[str, str, str], str]] = {
    "sm_100_B200": {
        ("bf16", "bf16", "bf16"): "bf16",
        ("f32", "f32", "f32"): "tf32",  # 870 TFLOPS measured: TF32 tensor cores, not FP32
        ("f8e4m3fn", "f8e4m3fn", "bf16"): "fp8",
    },
    "gfx950": {
        ("bf16", "bf16", "bf16"): "bf16",
        ("f16", "f16", "f16"): "fp16",
        ("f8e4m3fn", "f8e4m3fn", "bf16"): "fp8",
        # f32 left out: 1,023 TFLOPS > 157 TFLOPS FP32 peak and no TF32 on gfx950 -> precision unknown
    },
    # only from an extra table (xla_tables / WATTCAST_XLA_TABLE; module docstring); sm_90 is withheld (WITHHELD_DEVICES)
    "gfx942": {
        ("bf16", "bf16", "bf16"): "bf16",
        ("f16", "f16", "f16"): "fp16",
        ("f8e4m3fnuz", "f8e4m3fnuz", "bf16"): "fp8",
        # f32 left out: 252 TFLOPS, 1.54x the FP32 peak -> precision unknown (as gfx950)
    },
}

#: Vidur models whose norms are LayerNorm; every other Vidur model uses RMSNorm
VIDUR_LAYERNORM_MODELS = ("phi-2",)

NEUSIGHT_OPS = ("bmm", "linear", "conv", "add", "addu", "div", "divu", "mul", "mulu", "pow", "powu",
                "relu", "gelu", "tanh", "ln", "softmax")
GEMM_OPS = ("bmm", "linear", "matmul")
CONV_OPS = ("conv",)


def _known_ops() -> frozenset[str]:
    return frozenset(OP_FAMILY)


def _shape_columns_for(op: str) -> tuple[str, ...]:
    if op in GEMM_OPS:
        return GEMM_COLUMNS
    if op in CONV_OPS:
        return CONV_COLUMNS
    return VECTOR_COLUMNS


# --------------------------------------------------------------------------------------------
# Data root
# --------------------------------------------------------------------------------------------


def resolve_data_root(path: str | os.PathLike[str] | None = None) -> Path:
    """Find the public datasets folder.

    Order: ``path``; env ``WATTCAST_DATA``; ``../shared/datasets`` from the working directory;
    ``../shared/datasets`` from the repository root. An explicit ``path`` or ``WATTCAST_DATA`` that
    does not exist is an error (no silent fall-back to another folder).
    """
    hint = "Point to it with --data PATH or the WATTCAST_DATA environment variable."
    if path is not None:
        p = Path(path).expanduser()
        if p.is_dir():
            return p.resolve()
        raise DataNotFoundError(f"kernel data folder not found: {p} (given explicitly). {hint}")
    env = os.environ.get("WATTCAST_DATA")
    if env:
        p = Path(env).expanduser()
        if p.is_dir():
            return p.resolve()
        raise DataNotFoundError(f"kernel data folder not found: {p} (from WATTCAST_DATA). {hint}")
    candidates = [
        Path.cwd() / ".." / "shared" / "datasets",
        Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets",
    ]
    for c in candidates:
        if c.is_dir():
            return c.resolve()
    looked = ", ".join(str(c.resolve()) for c in candidates)
    raise DataNotFoundError(f"kernel data folder not found; looked in: {looked} (WATTCAST_DATA unset). {hint}")


def _rel(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def _need_dir(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise DataNotFoundError(f"{what} not found at {path}. Point to the datasets folder with --data PATH or WATTCAST_DATA.")
    return path


def _need_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DataNotFoundError(f"{what} not found at {path}. Point to the datasets folder with --data PATH or WATTCAST_DATA.")
    return path


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def _pick(header: Sequence[str], alternatives: str | Sequence[str], origin: str) -> str:
    """The first of ``alternatives`` present in ``header``, else KernelDataError naming file and column."""
    alts = (alternatives,) if isinstance(alternatives, str) else tuple(alternatives)
    for a in alts:
        if a in header:
            return a
    extra = f" (also accepted: {', '.join(repr(a) for a in alts[1:])})" if len(alts) > 1 else ""
    raise KernelDataError(f"{origin}: missing column {alts[0]!r}{extra}")


def _header(path: Path) -> list[str]:
    return [str(c) for c in pd.read_csv(path, nrows=0).columns]


def _frame(n: int, **cols) -> pd.DataFrame:
    """A unified-table frame of ``n`` rows; missing shape columns are NaN."""
    data = {}
    for c in COLUMNS:
        v = cols.get(c, np.nan if c in SHAPE_COLUMNS else None)
        if isinstance(v, pd.Series):
            v = v.to_numpy()
        if v is None or np.isscalar(v):
            v = np.full(n, v if v is not None else np.nan, dtype=float if c in SHAPE_COLUMNS or c == "latency_ms" else object)
        data[c] = v
    return pd.DataFrame(data, columns=list(COLUMNS))


def _num(s) -> np.ndarray:
    return pd.to_numeric(pd.Series(s), errors="coerce").to_numpy(dtype=float)


def _bad_rows(df: pd.DataFrame) -> pd.Series:
    """True where latency or a shape column the op needs is NaN, infinite or not positive (Padding >= 0)."""
    lat = df["latency_ms"].to_numpy(dtype=float)
    bad = ~(np.isfinite(lat) & (lat > 0))
    ops = df["op"].astype(str).to_numpy()
    fam = np.where(np.isin(ops, GEMM_OPS), "gemm", np.where(np.isin(ops, CONV_OPS), "conv", "vec"))
    for f, cols in (("gemm", GEMM_COLUMNS), ("conv", CONV_COLUMNS), ("vec", VECTOR_COLUMNS)):
        sel = fam == f
        if not sel.any():
            continue
        for c in cols:
            v = df[c].to_numpy(dtype=float)[sel]
            ok = np.isfinite(v) & ((v >= 0) if c == "Padding" else (v > 0))
            bad[np.flatnonzero(sel)[~ok]] = True
    return pd.Series(bad, index=df.index)


def _finish(frames: list[pd.DataFrame], dropped: Counter, excluded: Counter, extra_cols: Sequence[str] = ()) -> pd.DataFrame:
    cols = list(COLUMNS) + list(extra_cols)
    frames = [f for f in frames if len(f)]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({c: [] for c in cols})
    for c in SHAPE_COLUMNS + ("latency_ms",):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
    bad = _bad_rows(df) if len(df) else pd.Series([], dtype=bool)
    if bad.any():
        per = df.loc[bad, "origin"].value_counts()
        for origin, n in per.items():
            dropped[origin] += int(n)
            log.warning("%s: dropped %d row(s) with NaN, infinite or non-positive latency or shape", origin, n)
        df = df.loc[~bad].reset_index(drop=True)
    for c in ("op", "dtype", "device", "source", "origin"):
        df[c] = df[c].astype(str)
    df = df[cols]
    df.attrs["dropped"] = dict(dropped)
    df.attrs["excluded"] = dict(excluded)
    return df


def _map_devices(raw: pd.Series, source: str, origin: str, excluded: Counter,
                 withheld: Counter | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Catalog names and a keep-mask; unknown devices are excluded with a log line, and so are the
    :data:`WITHHELD_DEVICES` (hardware the shared datasets keep aside, which an extra table may carry; counted in
    ``withheld`` as well)."""
    mapping = DEVICE_MAP[source]
    raw = raw.astype(str).str.strip()
    dev = raw.map(mapping)
    keep = dev.notna().to_numpy()
    if not keep.all():
        unknown = raw[~keep].value_counts()
        for name, n in unknown.items():
            log.info("%s: %d row(s) on device %r left out (not in the wattcast catalog)", origin, n, name)
        excluded[origin] += int((~keep).sum())
    held = dev.isin(WITHHELD_DEVICES).to_numpy()
    if held.any():
        for name, n in dev[held].value_counts().items():
            log.info("%s: %d row(s) on %s left out (hardware the shared datasets withhold: not recovered from "
                     "elsewhere)", origin, n, name)
        excluded[origin] += int(held.sum())
        if withheld is not None:
            withheld[origin] += int(held.sum())
        keep = keep & ~held
    return dev.to_numpy(dtype=object), keep


# --------------------------------------------------------------------------------------------
# Source readers
# --------------------------------------------------------------------------------------------

_LATENCY_ALTS = ("Latency", "Latency (ms)", "latency_ms")


def _load_neusight(root: Path, sub: str, source_key: str, dropped: Counter, excluded: Counter) -> list[pd.DataFrame]:
    base = _need_dir(root / "neusight" / sub, f"NeuSight {sub}/ folder")
    files = sorted(base.glob("*/*.csv")) if sub == "kernels" else sorted(base.glob("*.csv"))
    if not files:
        raise DataNotFoundError(f"no CSV files under {base}")
    frames = []
    for f in files:
        origin = _rel(f, root)
        hint = f.parent.name if sub == "kernels" else f.stem
        header = _header(f)
        op_c = _pick(header, ("OPName", "op"), origin)
        lat_c = _pick(header, _LATENCY_ALTS, origin)
        dev_c = _pick(header, ("Device", "device"), origin)
        shape_cols = _shape_columns_for(hint)
        src_cols = {}
        for c in shape_cols:
            src_cols[c] = _pick(header, ("Kernel_Szie", "Kernel_Size") if c == "Kernel_Size" else c, origin)
        raw = pd.read_csv(f, usecols=[op_c, lat_c, dev_c, *src_cols.values()])
        dev, keep = _map_devices(raw[dev_c], "neusight", origin, excluded)
        raw = raw.loc[keep]
        cols = {c: _num(raw[s]) for c, s in src_cols.items()}
        frames.append(_frame(
            len(raw), op=raw[op_c].astype(str).str.strip().to_numpy(dtype=object), dtype="fp32",
            device=dev[keep], latency_ms=_num(raw[lat_c]), source=SOURCE_NAMES[source_key], origin=origin, **cols,
        ))
    if sub == "kernels_test":
        df = pd.concat(frames, ignore_index=True)
        key = [c for c in COLUMNS if c != "origin"]
        dup = df.duplicated(subset=key, keep="first")
        if dup.any():
            log.info("neusight/kernels_test: %d exact duplicate row(s) removed (vec.csv repeats elem/ln/softmax.csv)", int(dup.sum()))
        frames = [df.loc[~dup]]
    return frames


_XLA_KEY = ["device", "b", "m", "n", "k", "lhs_dtype", "rhs_dtype", "out_dtype"]


def _xla_raw_tables(root: Path, extra: Sequence[Path] = ()) -> list[tuple[pd.DataFrame, str]]:
    """The shared XLA table and each extra one as raw ``(device, b, m, n, k, lhs/rhs/out dtype, flops_per_s)``
    frames with their origin; an extra table's row whose key an earlier table has is left out (the shared row wins)."""
    f = _need_file(root / "tensorcore" / "xla_matmul_perf_table.csv", "XLA matmul table")
    origin = _rel(f, root)
    header = _header(f)
    need = _XLA_KEY + ["flops_per_s"]
    for c in need:
        _pick(header, c, origin)
    shared = pd.read_csv(f, usecols=need)
    tables = [(shared, origin)]
    seen = shared[_XLA_KEY].astype(str)
    if extra:
        from wattcast.data.xla_perf_table import read_xla_gemm_table
    for path in extra:
        more = read_xla_gemm_table(path)[need]
        key = more[_XLA_KEY].astype(str)
        dup = pd.MultiIndex.from_frame(key).isin(pd.MultiIndex.from_frame(seen))
        seen = pd.concat([seen, key[~dup]], ignore_index=True)
        tables.append((more.loc[~dup].reset_index(drop=True), str(path)))
    return tables


def _extra_xla_tables(xla_tables: Sequence[str | os.PathLike[str]] | None) -> list[Path]:
    """The extra XLA tables' paths: ``xla_tables``, or (None) the ones ``WATTCAST_XLA_TABLE`` names."""
    if xla_tables is None:
        from wattcast.data.xla_perf_table import tables_from_env

        xla_tables = tables_from_env()
    return [Path(p) for p in xla_tables]


def read_xla_tables(root: str | os.PathLike[str] | None = None,
                    xla_tables: Sequence[str | os.PathLike[str]] | None = None) -> list[tuple[pd.DataFrame, str]]:
    """The shared XLA GEMM table and the extra ones (``xla_tables``; default: ``WATTCAST_XLA_TABLE``'s), read once as
    raw ``(frame, origin)`` pairs (an extra table's origin is its path): pass them as ``xla_read=`` to
    :func:`load_kernels` and :func:`load_xla_fp8_combinations`, and neither reads the files again."""
    return _xla_raw_tables(resolve_data_root(root), _extra_xla_tables(xla_tables))


def _load_xla(read: list[tuple[pd.DataFrame, str]], excluded: Counter,
              withheld: Counter | None = None) -> list[pd.DataFrame]:
    """The XLA tables ``read`` (:func:`read_xla_tables`) as unified rows (:func:`_xla_rows`)."""
    return [_xla_rows(raw, origin, excluded, withheld) for raw, origin in read]


def _xla_read(root: Path, xla_tables, xla_read) -> list[tuple[pd.DataFrame, str]]:
    """``xla_read`` (tables :func:`read_xla_tables` already read) if given, else ``xla_tables`` read now; both given
    is a ValueError."""
    if xla_read is None:
        return _xla_raw_tables(root, _extra_xla_tables(xla_tables))
    if xla_tables is not None:
        raise ValueError("give xla_tables (paths to read) or xla_read (tables read_xla_tables read), not both")
    return xla_read


def load_xla_fp8_combinations(root: str | os.PathLike[str] | None = None,
                              xla_tables: Sequence[str | os.PathLike[str]] | None = None, *,
                              xla_read: list[tuple[pd.DataFrame, str]] | None = None) -> pd.DataFrame:
    """Every XLA GEMM row with an fp8 input (``f8*`` lhs or rhs, any output) on a catalog device the shared datasets
    do not withhold, as unified ``bmm`` rows labelled ``fp8`` (shape mapping as :func:`load_kernels`), plus the
    table's ``lhs_dtype``, ``rhs_dtype``, ``out_dtype``, measured ``tflops`` and ``kept`` (the combination
    :data:`XLA_DTYPES` keeps as the device's ``fp8`` rows, i.e. the rows :func:`load_kernels` returns). A
    diagnostic of which fp8 kernel path the kept rows measure; :func:`load_kernels` is unchanged. ``xla_read``: the
    tables as :func:`read_xla_tables` read them (instead of ``xla_tables``)."""
    frames = []
    for raw, origin in _xla_read(resolve_data_root(root), xla_tables, xla_read):
        raw = raw[raw["lhs_dtype"].astype(str).str.startswith("f8") | raw["rhs_dtype"].astype(str).str.startswith("f8")]
        dev, keep = _map_devices(raw["device"], "xla", origin, Counter())
        raw = raw.loc[keep]
        kept = [label == "fp8" for label in _xla_dtype_labels(raw)]
        fr = _xla_bmm_frame(raw, "fp8", dev[keep], origin)
        frames.append(fr.assign(lhs_dtype=raw["lhs_dtype"].astype(str).to_numpy(),
                                rhs_dtype=raw["rhs_dtype"].astype(str).to_numpy(),
                                out_dtype=raw["out_dtype"].astype(str).to_numpy(),
                                tflops=_num(raw["flops_per_s"]) / 1e12, kept=np.array(kept, dtype=bool)))
    out = pd.concat(frames, ignore_index=True)
    return out[np.isfinite(out["latency_ms"]) & (out["latency_ms"] > 0)].reset_index(drop=True)


def _xla_rows(raw: pd.DataFrame, origin: str, excluded: Counter, withheld: Counter | None = None) -> pd.DataFrame:
    """XLA table rows (``device, b, m, n, k, lhs/rhs/out dtype, flops_per_s``) as unified bmm rows (docstring)."""
    dev, keep = _map_devices(raw["device"], "xla", origin, excluded, withheld)
    raw = raw.loc[keep].copy()
    raw["_dev"] = dev[keep]
    raw["_dtype"] = _xla_dtype_labels(raw)
    raw = raw[raw["_dtype"].notna()]
    return _xla_bmm_frame(raw, raw["_dtype"].to_numpy(dtype=object), raw["_dev"].to_numpy(dtype=object), origin)


def _xla_dtype_labels(raw: pd.DataFrame) -> list[str | None]:
    """Each XLA row's label in :data:`XLA_DTYPES` (its device's ``(lhs, rhs, out)`` dtype combination kept as that
    dtype's rows), None where the combination is not kept."""
    combo = zip(raw["lhs_dtype"].astype(str), raw["rhs_dtype"].astype(str), raw["out_dtype"].astype(str))
    return [XLA_DTYPES.get(d, {}).get(c) for d, c in zip(raw["device"].astype(str), combo)]


def _xla_bmm_frame(raw: pd.DataFrame, dtype, device, origin: str) -> pd.DataFrame:
    """XLA rows as unified ``bmm`` rows: (b, m, n, k) as (B, M, K, N), the latency ``2 b m n k / flops_per_s`` in ms."""
    b, m, n, k = (_num(raw[c]) for c in ("b", "m", "n", "k"))
    with np.errstate(divide="ignore", invalid="ignore"):
        lat = 2.0 * b * m * n * k / _num(raw["flops_per_s"]) * 1e3
    return _frame(len(raw), op="bmm", dtype=dtype, B=b, M=m, N=k, K=n, device=device, latency_ms=lat, source="xla",
                  origin=origin)


def _load_deepbench(root: Path, dropped: Counter, excluded: Counter) -> list[pd.DataFrame]:
    f = _need_file(root / "tensorcore" / "deepbench_train_gemm.csv", "DeepBench GEMM table")
    origin = _rel(f, root)
    header = _header(f)
    need = ["gpu", "precision", "M", "N", "K", "a_trans", "b_trans", "time_ms"]
    for c in need:
        _pick(header, c, origin)
    raw = pd.read_csv(f, usecols=need)
    nn = (raw["a_trans"].astype(str).str.upper() == "N") & (raw["b_trans"].astype(str).str.upper() == "N")
    raw = raw[nn]
    prec = raw["precision"].astype(str).str.strip().str.lower()
    dtype = pd.Series(np.where(prec == "float", "fp32", np.where(prec.str.startswith("16 bit inputs"), "fp16", "")), index=raw.index)
    unknown = dtype == ""
    if unknown.any():
        log.warning("%s: %d row(s) with unknown precision %s left out", origin, int(unknown.sum()), sorted(set(raw.loc[unknown, "precision"])))
        excluded[origin] += int(unknown.sum())
        raw, dtype = raw.loc[~unknown], dtype.loc[~unknown]
    dev, keep = _map_devices(raw["gpu"], "deepbench", origin, excluded)
    raw, dtype = raw.loc[keep], dtype.loc[keep]
    return [_frame(len(raw), op="bmm", dtype=dtype.to_numpy(dtype=object), B=1.0, M=_num(raw["M"]), N=_num(raw["K"]),
                   K=_num(raw["N"]), device=dev[keep], latency_ms=_num(raw["time_ms"]), source="deepbench", origin=origin)]


_VIDUR_SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "num_tokens", "num_tensor_parallel_workers")
_VIDUR_REQUIRED_OPS = ("input_layernorm", "attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


def _load_vidur(root: Path, dropped: Counter, excluded: Counter) -> list[pd.DataFrame]:
    base = _need_dir(root / "tensorcore" / "vidur", "Vidur profiles folder")
    files = sorted(base.glob("*/*/*/mlp.csv"))
    if not files:
        raise DataNotFoundError(f"no Vidur mlp.csv files under {base}")
    frames = []
    for f in files:
        origin = _rel(f, root)
        gpu, model = f.parts[-4], f.parts[-2]
        device = DEVICE_MAP["vidur"].get(gpu)
        header = _header(f)
        if device is None:
            n = sum(1 for _ in open(f)) - 1
            log.info("%s: %d row(s) on device %r left out (not in the wattcast catalog)", origin, n, gpu)
            excluded[origin] += n
            continue
        for c in _VIDUR_SHAPE:
            _pick(header, c, origin)
        for op in _VIDUR_REQUIRED_OPS:
            _pick(header, f"time_stats.{op}.median", origin)
        has_post_ln = "time_stats.post_attention_layernorm.median" in header
        med = [f"time_stats.{op}.median" for op in _VIDUR_REQUIRED_OPS]
        if has_post_ln:
            med.append("time_stats.post_attention_layernorm.median")
        raw = pd.read_csv(f, usecols=[*_VIDUR_SHAPE, *med])
        nh, nkv, d, dff = (_num(raw[c]) for c in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd"))
        T, tp = _num(raw["num_tokens"]), _num(raw["num_tensor_parallel_workers"])
        gated = raw["use_gated_mlp"].astype(str).str.strip().str.lower().isin(("true", "1", "1.0")).to_numpy()
        hd = d / nh
        norm_op = "ln" if model in VIDUR_LAYERNORM_MODELS else "rmsnorm"
        n = len(raw)

        def t(op):
            return _num(raw[f"time_stats.{op}.median"])

        common = dict(dtype="fp16", device=device, source="vidur", origin=origin)
        frames += [
            _frame(n, op="linear", B=1.0, M=T, N=d, K=(nh + 2 * nkv) * hd / tp, latency_ms=t("attn_pre_proj"), **common),
            _frame(n, op="linear", B=1.0, M=T, N=nh * hd / tp, K=d, latency_ms=t("attn_post_proj"), **common),
            _frame(n, op="linear", B=1.0, M=T, N=d, K=np.where(gated, 2.0, 1.0) * dff / tp, latency_ms=t("mlp_up_proj"), **common),
            _frame(n, op="linear", B=1.0, M=T, N=dff / tp, K=d, latency_ms=t("mlp_down_proj"), **common),
            _frame(n, op=norm_op, B=T, H=d, latency_ms=t("input_layernorm"), **common),
            _frame(n, op="add", B=T, H=d, latency_ms=t("add"), **common),
            _frame(n, op=np.where(gated, "silu_mul", "gelu").astype(object), B=T, H=dff / tp, latency_ms=t("mlp_act"), **common),
        ]
        if has_post_ln:
            frames.append(_frame(n, op=norm_op, B=T, H=d, latency_ms=t("post_attention_layernorm"), **common))
    return frames


def _read_headerless(f: Path, names: Sequence[str], origin: str) -> pd.DataFrame:
    raw = pd.read_csv(f, header=None, skipinitialspace=True)
    if raw.shape[1] < len(names):
        raise KernelDataError(f"{origin}: missing column {names[raw.shape[1]]!r} (expected {len(names)} unnamed columns: {', '.join(names)})")
    raw = raw.iloc[:, : len(names)]
    raw.columns = list(names)
    return raw


def _llmcompass_device(f: Path, origin: str, excluded: Counter, n: int) -> str | None:
    gpu = f.stem.rsplit("_", 1)[-1]
    dev = DEVICE_MAP["llmcompass"].get(gpu)
    if dev is None:
        log.info("%s: %d row(s) on device %r left out (not in the wattcast catalog)", origin, n, gpu)
        excluded[origin] += n
    return dev


def _load_llmcompass(root: Path, dropped: Counter, excluded: Counter) -> list[pd.DataFrame]:
    base = _need_dir(root / "tensorcore" / "llmcompass", "LLMCompass folder")
    frames = []
    for f in sorted(base.glob("matmul/matmul_*.csv")):
        origin = _rel(f, root)
        raw = _read_headerless(f, ("M", "N", "K", "latency", "tflops"), origin)
        dev = _llmcompass_device(f, origin, excluded, len(raw))
        if dev is None:
            continue
        lat = _num(raw["latency"].astype(str).str.replace("ms", "", regex=False).str.strip())
        frames.append(_frame(len(raw), op="bmm", dtype="fp16", B=1.0, M=_num(raw["M"]), N=_num(raw["K"]), K=_num(raw["N"]),
                             device=dev, latency_ms=lat, source="llmcompass", origin=origin))
    for kind, op in (("softmax", "softmax"), ("layernorm", "ln")):
        for f in sorted(base.glob(f"{kind}/{kind}_*.csv")):
            origin = _rel(f, root)
            raw = _read_headerless(f, ("M", "N", "throughput_geps"), origin)
            dev = _llmcompass_device(f, origin, excluded, len(raw))
            if dev is None:
                continue
            M, N, g = _num(raw["M"]), _num(raw["N"]), _num(raw["throughput_geps"])
            with np.errstate(divide="ignore", invalid="ignore"):
                lat = M * N / (g * 1e9) * 1e3
            frames.append(_frame(len(raw), op=op, dtype="fp16", B=M, H=N, device=dev, latency_ms=lat,
                                 source="llmcompass", origin=origin))
    for f in sorted(base.glob("gelu/gelu_*.csv")):
        origin = _rel(f, root)
        raw = _read_headerless(f, ("M", "throughput_geps"), origin)
        dev = _llmcompass_device(f, origin, excluded, len(raw))
        if dev is None:
            continue
        M, g = _num(raw["M"]), _num(raw["throughput_geps"])
        with np.errstate(divide="ignore", invalid="ignore"):
            lat = M / (g * 1e9) * 1e3
        frames.append(_frame(len(raw), op="gelu", dtype="fp16", B=1.0, H=M, device=dev, latency_ms=lat,
                             source="llmcompass", origin=origin))
    if not frames:
        raise DataNotFoundError(f"no LLMCompass CSV files under {base}")
    return frames


_LOADERS = {
    "neusight": lambda r, d, e: _load_neusight(r, "kernels", "neusight", d, e),
    "neusight_test": lambda r, d, e: _load_neusight(r, "kernels_test", "neusight_test", d, e),
    "xla": _load_xla,
    "deepbench": _load_deepbench,
    "vidur": _load_vidur,
    "llmcompass": _load_llmcompass,
}


def load_kernels(root: str | os.PathLike[str] | None = None, sources: Iterable[str] = ALL_SOURCES, *,
                 xla_tables: Sequence[str | os.PathLike[str]] | None = None,
                 xla_read: list[tuple[pd.DataFrame, str]] | None = None) -> pd.DataFrame:
    """All requested kernel-latency sources as one table with exactly ``COLUMNS``.

    ``xla_tables``: extra XLA GEMM tables (textproto, JAX plugin wheel or binary, or a CSV written by
    ``data/xla_perf_table.py``) added to the ``xla`` source; default: the paths ``WATTCAST_XLA_TABLE`` names.
    ``xla_read``: the shared and extra XLA tables as :func:`read_xla_tables` read them (instead of ``xla_tables``).
    ``df.attrs["dropped"]``: {origin: rows removed for NaN/non-positive latency or shape};
    ``df.attrs["excluded"]``: {origin: rows left out by design (device outside the catalog, ...)};
    ``df.attrs["withheld"]``: {origin: the part of those on :data:`WITHHELD_DEVICES`};
    ``df.attrs["xla_tables"]``: the extra tables read.
    """
    sources = (sources,) if isinstance(sources, str) else tuple(sources)
    unknown = [s for s in sources if s not in _LOADERS]
    if unknown:
        raise ValueError(f"unknown kernel source(s) {unknown}; choose from {list(ALL_SOURCES)}")
    data_root = resolve_data_root(root)
    dropped: Counter = Counter()
    excluded: Counter = Counter()
    withheld: Counter = Counter()
    frames: list[pd.DataFrame] = []
    extra: list[str] = []
    for s in dict.fromkeys(sources):
        if s == "xla":
            read = _xla_read(data_root, xla_tables, xla_read)
            extra = [origin for _, origin in read[1:]]  # the extra tables' paths (the shared table first)
            frames += _load_xla(read, excluded, withheld)
        else:
            frames += _LOADERS[s](data_root, dropped, excluded)
    out = _finish(frames, dropped, excluded)
    out.attrs["xla_tables"] = extra
    out.attrs["withheld"] = dict(withheld)
    return out


def split_heldout(
    df: pd.DataFrame, ambiguous_to_heldout: bool = False, holdout: Iterable[str] = HELDOUT_DEVICES
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, heldout). Held-out GPUs (``holdout``, default ``HELDOUT_DEVICES``) never reach training.

    Rows on ``AMBIGUOUS_DEVICES`` (an A100 80GB of unknown form factor, possibly the held-out
    PCIe card) are in neither frame, unless ``ambiguous_to_heldout`` puts them in the held-out one.
    """
    dev = df["device"].astype(str)
    held = dev.isin(list(holdout))
    amb = dev.isin(AMBIGUOUS_DEVICES)
    train = df.loc[~held & ~amb].copy()
    heldout = df.loc[held | (amb if ambiguous_to_heldout else False)].copy()
    return train, heldout


# --------------------------------------------------------------------------------------------
# User CSV
# --------------------------------------------------------------------------------------------


def load_user_kernels(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A user's own profiling CSV in the documented schema, as the unified table (source="user").

    Required: ``OPName`` (or ``op``), ``Latency`` in ms (or ``latency_ms`` / ``Latency (ms)``),
    ``Device`` (kept as given) and the shape columns of each op present (bmm/linear: B, M, N, K;
    elementwise/ln/softmax: B, H; conv: B, Input_Channel, Output_Channel, Kernel_Size, Input_Size,
    Stride, Padding). Optional ``dtype`` (default fp32).
    """
    p = Path(path)
    if not p.is_file():
        raise DataNotFoundError(f"user kernel CSV not found: {p}")
    origin = str(p)
    try:
        raw = pd.read_csv(p, dtype=str, keep_default_na=False, skip_blank_lines=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise KernelDataError(f"{origin}: not a readable CSV ({e})") from e
    raw.columns = [str(c).strip() for c in raw.columns]
    raw = without_blank_rows(raw)  # blank and ',,,' lines; the index keeps each row's line
    header = list(raw.columns)
    missing = []
    found = {}
    for key, alts in (("op", ("OPName", "op")), ("latency", _LATENCY_ALTS), ("device", ("Device", "device"))):
        hit = next((a for a in alts if a in header), None)
        if hit is None:
            missing.append(f"{alts[0]!r} (or {', '.join(repr(a) for a in alts[1:])})")
        found[key] = hit
    if missing:
        raise KernelDataError(f"{origin}: missing column(s) {', '.join(missing)}")
    dtype_c = next((a for a in ("dtype", "Dtype", "DType") if a in header), None)

    ops = raw[found["op"]].astype(str).str.strip().str.lower()
    known = _known_ops()
    shape_src = {c: c for c in SHAPE_COLUMNS}
    if "Kernel_Size" not in header and "Kernel_Szie" in header:
        shape_src["Kernel_Size"] = "Kernel_Szie"
    needed: dict[str, list[str]] = {}
    for op in sorted(set(ops) & known):
        for c in _shape_columns_for(op):
            if shape_src[c] not in header:
                needed.setdefault(c, []).append(op)
    if needed:
        what = "; ".join(f"{c!r} (needed by {', '.join(v)})" for c, v in needed.items())
        raise KernelDataError(f"{origin}: missing shape column(s) {what}")

    lines = raw.index.to_numpy() + 2  # header is line 1
    txt = {c: raw[c].astype(str).str.strip().to_numpy(dtype=object) for c in header}
    lat_txt = txt[found["latency"]]
    lat = _num(lat_txt)
    shapes = {c: (_num(txt[s]) if s in header else np.full(len(raw), np.nan)) for c, s in shape_src.items()}
    dtypes = (raw[dtype_c].astype(str).str.strip().str.lower() if dtype_c else pd.Series("fp32", index=raw.index))
    dtypes = dtypes.where(dtypes != "", "fp32")
    canon = dtypes.map(lambda d: canonical_dtype(d) if canonical_dtype(d) in DTYPE_BYTES else None)

    # vectorised checks first; reasons are spelled out only for the rows that fail
    op_arr = ops.to_numpy(dtype=object)
    is_known = np.isin(op_arr, list(known))
    dev_txt = txt[found["device"]]
    bad = ~is_known | ~(np.isfinite(lat) & (lat > 0)) | canon.isna().to_numpy() | (dev_txt == "")
    for c in SHAPE_COLUMNS:
        uses = is_known & np.array([c in _shape_columns_for(o) for o in op_arr], dtype=bool)
        v = shapes[c]
        # as `wattcast kernels` reads a row (models/kernel_predictor.py normalise_kernel_frame)
        with np.errstate(invalid="ignore"):
            ok = ~bad_shape_values(v, c) & (v <= MAX_SHAPE_DIM)
        bad |= uses & ~ok
    problems: list[tuple[int, str]] = []
    for i in np.flatnonzero(bad):
        op, reasons = op_arr[i], []
        if not is_known[i]:
            reasons.append(f"unknown op {op!r}")
        else:
            for c in _shape_columns_for(op):
                v, t = shapes[c][i], (str(txt[shape_src[c]][i]) if shape_src[c] in txt else "")
                if not np.isfinite(v):
                    reasons.append(f"{c}={t!r} is not a number" if t else f"{c} is empty")
                elif (v < 0) if c == "Padding" else (v <= 0):
                    reasons.append(f"{c}={t} must be {'>= 0' if c == 'Padding' else '> 0'}")
                elif v != np.round(v):
                    reasons.append(f"{c}={t} must be a whole number")
                elif v > MAX_SHAPE_DIM:
                    reasons.append(f"{c}={t} is beyond 2**40 = {MAX_SHAPE_DIM:,} (no real tensor dimension is; a typo "
                                   "or another unit?)")
        lt = str(lat_txt[i])
        if not np.isfinite(lat[i]):
            reasons.append(f"latency {lt!r} is not a number" if lt else "latency is empty")
        elif lat[i] <= 0:
            reasons.append(f"latency {lt} must be > 0")
        if dev_txt[i] == "":
            reasons.append("Device is empty")
        if pd.isna(canon.iloc[i]):
            reasons.append(f"unknown dtype {dtypes.iloc[i]!r} (use one of {', '.join(DTYPES)})")
        problems.append((int(lines[i]), "; ".join(reasons)))
    if problems:
        shown = "\n".join(f"  line {ln}: {why}" for ln, why in problems[:10])
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise KernelDataError(f"{origin}: {len(problems)} bad row(s):\n{shown}{more}")

    df = _frame(len(raw), op=ops.to_numpy(dtype=object), dtype=canon.to_numpy(dtype=object),
                device=raw[found["device"]].astype(str).str.strip().to_numpy(dtype=object), latency_ms=lat,
                source="user", origin=origin, **shapes)
    # shape columns the op does not use are NaN, as in every other source
    for c in SHAPE_COLUMNS:
        uses = np.array([c in _shape_columns_for(o) for o in df["op"]], dtype=bool)
        df.loc[~uses, c] = np.nan
    out = _finish([df], Counter(), Counter())
    # each row's line in the file (the header is line 1), for messages about rows that fail a later check (the
    # physics check of `train kernels`); every row here passed the checks above, so _finish dropped none
    # a list, not an array: pandas compares attrs when it concatenates frames, and an array's == is not a bool
    out.attrs["lines"] = [int(x) for x in lines] if len(out) == len(lines) else None
    return out


# --------------------------------------------------------------------------------------------
# NeuSight label graphs
# --------------------------------------------------------------------------------------------

_LABEL_FILE = re.compile(r"^(?P<model>.+?)-(?P<mode>train|inf)-(?P<seq>\d+)-(?P<batch>\d+)(?:-(?P<opt>.+))?$")
_SKIP_LABEL_OPTIONS = ("fusion", "dp4", "tp4", "pp4_1")
_CLASS = re.compile(r"<class '([^']+)'>")

#: binary elementwise targets -> NeuSight op (sub is the add kernel with alpha=-1 in PyTorch)
_BINARY = {
    "add": "add", "iadd": "add", "add_": "add", "sub": "add", "isub": "add", "sub_": "add", "rsub": "add",
    "mul": "mul", "imul": "mul", "mul_": "mul",
    "truediv": "div", "itruediv": "div", "div": "div", "div_": "div",
    "pow": "pow", "ipow": "pow", "pow_": "pow",
}
_UNARY = {"tanh": "tanh", "tanh_": "tanh", "gelu": "gelu", "relu": "relu", "relu_": "relu"}
#: nn.Module classes that are one kernel (composite modules such as NewGELUActivation are not here)
_MODULES = {"Linear": "linear", "Conv1D": "linear", "LayerNorm": "ln", "Softmax": "softmax",
            "ReLU": "relu", "Tanh": "tanh", "GELU": "gelu"}
_FLOAT_DTYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}


def _target_name(kind: str, target: str, meta: str) -> str:
    if kind == "call_module":
        classes = _CLASS.findall(str(meta))
        return "module:" + (classes[-1].rsplit(".", 1)[-1] if classes else str(target))
    t = str(target)
    m = re.match(r"<built-in (?:function|method) (\w+)", t) or re.match(r"<function (\w+)", t)
    if m:
        return m.group(1)
    m = re.match(r"<class '([^']+)'>", t)
    if m:
        return m.group(1)
    return t


def _prod(xs: Sequence[int]) -> float:
    return float(np.prod([float(x) for x in xs])) if len(xs) else 1.0


def _map_node(name: str, ins: list, out: tuple) -> dict | None:
    """Shape dict of one label node, or None when it is not a kernel we model."""
    if name.startswith("module:"):
        op = _MODULES.get(name[7:])
        if op is None:
            return None
    elif name == "addmm":
        op = "addmm"
    elif name in ("matmul", "bmm"):
        op = "bmm"
    elif name == "linear":
        op = "linear"
    elif name == "layer_norm":
        op = "ln"
    elif name == "softmax":
        op = "softmax"
    elif name in _BINARY:
        op = "binary"
    elif name in _UNARY:
        op = _UNARY[name]
    else:
        return None
    out = list(out) if out else []
    tensors = [list(s) for s in ins if isinstance(s, (list, tuple))]
    if op == "addmm":
        mats = [s for s in tensors if len(s) == 2]
        if len(mats) < 2 or mats[-2][1] != mats[-1][0]:
            return None
        (m, n), (_, k) = mats[-2], mats[-1]
        return dict(op="linear", B=1.0, M=float(m), N=float(n), K=float(k))
    if op == "linear":
        if not tensors or not tensors[0] or not out:
            return None
        x = tensors[0]
        return dict(op="linear", B=1.0, M=_prod(x[:-1]), N=float(x[-1]), K=float(out[-1]))
    if op == "bmm":
        if len(tensors) < 2:
            return None
        a, b = tensors[0], tensors[1]
        if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
            return None
        if len(b) == 2:  # (..., M, N) @ (N, K) is one GEMM over all leading rows
            B, M = 1.0, _prod(a[:-1])
        else:
            lead = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
            B, M = _prod(lead), float(a[-2])
        K = float(b[-1])
        if out and abs(_prod(out) - B * M * K) > 0.5:
            return None
        return dict(op="bmm", B=B, M=M, N=float(a[-1]), K=K)
    shape = tensors[0] if op == "ln" and tensors else out
    if not shape:
        return None
    B, H = _prod(shape[:-1]), float(shape[-1])
    if op == "binary":
        full = [s for s in tensors if _prod(s) > 1]
        op = _BINARY[name] + ("" if len(full) >= 2 else "u")
    return dict(op=op, B=B, H=H)


def _label_device(folder: str) -> str | None:
    return DEVICE_MAP["neusight"].get(folder.replace("_", " "))


def load_label_nodes(root: str | os.PathLike[str] | None = None, devices: Iterable[str] | None = None) -> pd.DataFrame:
    """Single-kernel nodes of NeuSight's per-node label graphs as unified-table rows.

    ``latency_ms`` is the node's forward time (``fw_latency``); extra columns ``model``, ``mode``
    (train/inf), ``node`` (fx node name), ``fw_latency_ms``, ``bw_latency_ms``. ``devices`` filters by
    label folder name (e.g. ``NVIDIA_L4``) or catalog name (``L4``). Only CSVs with a JSON twin are read;
    ``-fusion``, ``-dp4``, ``-tp4``, ``-pp4_1`` runs are skipped. ``df.attrs["skipped_targets"]`` counts
    the node targets that were not mapped (non-tensor nodes, views, dropout, embeddings, ...).

    Mapping (only nodes whose ``dtype`` is a torch float type; python-number arithmetic on sizes is
    not a kernel): ``addmm`` (GPT-2 Conv1D, (M, N) @ (N, K) + bias) and nn.Linear / F.linear ->
    ``linear`` with B=1, M = product of the input's leading dims (NeuSight's linear sweeps always use
    B=1); torch.matmul / bmm -> ``bmm`` with B = product of the broadcast batch dims, N = lhs[-1]
    (a 2-D rhs folds all lhs rows into M); LayerNorm module / F.layer_norm -> ``ln``; softmax
    (function, method or nn.Softmax, assumed over the last dim) -> ``softmax``; add/sub/mul/truediv/pow
    -> ``add``/``mul``/``div``/``pow`` when two inputs have more than one element, else the scalar
    variant ``addu``/``mulu``/``divu``/``powu`` (a 0-d tensor such as GPT-2's attention scale counts as
    a scalar); sub and rsub map to add because PyTorch runs them as the add kernel with alpha=-1;
    tanh, gelu, relu (functions, methods, or nn.Tanh/GELU/ReLU modules) -> themselves. (B, H) of
    vector ops = (product of leading dims, last dim) of the output (LayerNorm: of its input).
    Composite modules (e.g. NewGELUActivation when not traced through), Dropout, Embedding, where,
    masked_fill, mean, rsqrt, casts and views are skipped.
    """
    data_root = resolve_data_root(root)
    base = _need_dir(data_root / "neusight" / "labels", "NeuSight labels folder")
    want = None if devices is None else {str(d) for d in ([devices] if isinstance(devices, str) else devices)}
    dropped: Counter = Counter()
    excluded: Counter = Counter()
    skipped: Counter = Counter()
    rows: list[dict] = []
    need = ("op", "target", "input_shapes", "output_shape", "fw_latency", "bw_latency", "Name", "meta")
    for folder in sorted(p for p in base.iterdir() if p.is_dir()):
        device = _label_device(folder.name)
        if want is not None and folder.name not in want and device not in want:
            continue
        for f in sorted(folder.glob("*.csv")):
            origin = _rel(f, data_root)
            m = _LABEL_FILE.match(f.stem)
            if m is None or m.group("opt") is not None:
                if m is None or m.group("opt") not in _SKIP_LABEL_OPTIONS:
                    log.info("%s: not a single-GPU label run, skipped", origin)
                continue
            if not f.with_suffix(".json").is_file():
                log.info("%s: no JSON twin, skipped", origin)
                continue
            if device is None:
                log.info("%s: device folder %r not in the wattcast catalog, skipped", origin, folder.name)
                excluded[origin] += 1
                continue
            header = _header(f)
            for c in need:
                _pick(header, c, origin)
            usecols = list(need) + (["dtype"] if "dtype" in header else [])
            raw = pd.read_csv(f, usecols=usecols, dtype=str, keep_default_na=False)
            for r in raw.to_dict("records"):
                kind = r["op"]
                if kind in ("placeholder", "output", "get_attr"):
                    continue
                name = _target_name(kind, r["target"], r["meta"])
                dt = _FLOAT_DTYPES.get(r.get("dtype", "torch.float32").strip())
                mapped = None
                if dt is not None:
                    try:
                        ins = ast.literal_eval(r["input_shapes"]) if r["input_shapes"].strip() else []
                        out = ast.literal_eval(r["output_shape"]) if r["output_shape"].strip() else ()
                        mapped = _map_node(name, ins, out)
                    except (ValueError, SyntaxError, TypeError):
                        mapped = None
                if mapped is None:
                    skipped[name] += 1
                    continue
                fw = pd.to_numeric(r["fw_latency"], errors="coerce")
                bw = pd.to_numeric(r["bw_latency"], errors="coerce")
                rows.append(dict(mapped, dtype=dt, device=device, latency_ms=fw, source="neusight/labels", origin=origin,
                                 model=m.group("model"), mode=m.group("mode"), node=r["Name"] or r["op"],
                                 fw_latency_ms=fw, bw_latency_ms=bw))
    extra = ("model", "mode", "node", "fw_latency_ms", "bw_latency_ms")
    df = pd.DataFrame(rows, columns=list(LABEL_COLUMNS))
    for c in ("fw_latency_ms", "bw_latency_ms"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
    out = _finish([df], dropped, excluded, extra_cols=extra)
    for c in ("model", "mode", "node"):
        out[c] = out[c].astype(str)
    out.attrs["skipped_targets"] = skipped
    return out
