"""Predict kernel latencies for a table of kernels on one device (the `wattcast kernels` engine)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.catalog_match import catalog_twin, compute_twin, power_siblings
from wattcast.data.device_spec import DeviceSpec
from wattcast.featurize.conv_gemm import (CONV_KERNELS, TENSOR_CORE_CONV_DTYPES, conv_out_size, implicit_gemm_conv_ms,
                                          implicit_gemm_shape, padded_channels, pointwise_conv_rows,
                                          pointwise_gemm_shape, tf32_conv_on_tensor_cores)
from wattcast.featurize.kernel_features import featurize_kernels
from wattcast.data.kernel_ops import (CONV_COLS, DTYPE_BYTES, GEMM_COLS, MATMUL_FAMILIES, MAX_SHAPE_DIM, MAX_TENSOR_BYTES,
                                     MEASURED_AS, OP_ALIASES, OP_FAMILY, SHAPE_COLS, VEC_COLS, bad_shape_values,
                                     canonical_dtype, min_shape_value, required_columns)
from wattcast.models.gemm_floor import (blend_weight, blended_log_ratio, ceiling_log_ratio, ceiling_model,
                                        own_dtype_ceiling, row_ceilings)
from wattcast.models.kernel_bundle import OOD_BAND_FACTOR, KernelBundle, load_bundle
from wattcast.models.coverage import device_excess_log, dtype_coverage_for, dtype_support_checks
from wattcast.models.kernel_surrogates import RooflineSurrogate, fnv1a_rows, predict_distinct
from wattcast.models.power_derating import fp32_gemm_floor_ms, spec_fp32_fraction

#: columns the output adds (the contract of `wattcast kernels`), then wattcast's extras
PRED_COLUMNS = ("pred_latency_ms", "pred_low_ms", "pred_high_ms", "ood")
EXTRA_COLUMNS = ("roofline_ms", "model", "ood_reason", "error")

_COLUMN_ALIASES = {"OPName": "op", "Kernel_Szie": "Kernel_Size"}


def _resolve(device: DeviceSpec | str | Path) -> DeviceSpec:
    if isinstance(device, DeviceSpec):
        return device
    from wattcast.data.catalog import resolve_device

    return resolve_device(device)


def _numeric(col: pd.Series) -> np.ndarray:
    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=float)


def _text_column(uniques, codes: np.ndarray):
    """The column ``np.array(uniques, dtype=object)[codes]`` would make in a frame, without a Python object
    per row when pandas stores text natively (every entry of ``uniques`` is a str or missing)."""
    objs = np.empty(len(uniques), dtype=object)
    objs[:] = list(uniques)
    # the dtype pandas infers for an object array of str: ``str`` in pandas 3, object before (missing entries, such as
    # an op cell left empty, stay missing in it)
    sample = next((u for u in uniques if isinstance(u, str)), None)
    dt = pd.Series([sample if sample is not None else ""]).dtype
    if len(codes) == 0 or dt == object:
        return objs[codes]
    return pd.array(objs, dtype=dt).take(codes)


def _text_codes(values: np.ndarray) -> tuple[np.ndarray, list]:
    """(codes, uniques) of an object array of str."""
    codes, uniq = pd.factorize(values)
    return codes, list(uniq)


#: the input columns wattcast reads (any spelling) or writes: each may appear once
_USED_COLUMNS = frozenset(("op", "dtype", *_COLUMN_ALIASES, *_COLUMN_ALIASES.values(), *SHAPE_COLS,
                           *PRED_COLUMNS, *EXTRA_COLUMNS))


#: the dtype a vector kernel (softmax, norm, elementwise: not a GEMM family) of a matrix-unit dtype runs in: TF32 is
#: fp32 data (``predict --dtype tf32`` builds its vector ops in fp32); under Transformer Engine's FP8 recipe only the
#: linear layers' GEMMs run in FP8 and every softmax, norm and elementwise op in bf16 (``predict --dtype fp8``,
#: featurize/workload.py ``_hf_forward``; TE casts the GEMM inputs itself), so an fp8 vector row is costed at bf16's
#: 2 bytes an element, not fp8's 1
VECTOR_DTYPE_OF = {"tf32": "fp32", "fp8": "bf16"}

#: the dtypes whose kernels need tensor-core units of their own: (the spec's peak field, which GPUs have it)
_TENSOR_CORE_PEAKS = {"fp8": ("peak_fp8_tflops", "(A100, V100, MI250 and older); use bf16"),
                      "tf32": ("peak_tf32_tflops", "(Ampere and later; PyTorch's TF32 setting does nothing on older "
                                                   "GPUs); use fp32")}


def unknown_op_error(op: str) -> str:
    """The ``error`` of a row whose op wattcast has no model for: the ops it knows (and the spellings it reads)."""
    aliases = ", ".join(f"{a} ({c})" for a, c in OP_ALIASES.items())
    return f"unknown op {op!r}; known: {', '.join(sorted(OP_FAMILY))} (also read: {aliases})"


def unknown_dtype_error(dtype: str) -> str:
    """The ``error`` of a row whose dtype wattcast has no model for: the dtypes it knows (spellings such as bfloat16,
    torch.float16 or float8_e4m3fn read as them)."""
    return (f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)} (also read: bfloat16, float16, half, float32, "
            "float8_e4m3fn, float8_e5m2, torch.* names)")


def half_dtype_of(spec) -> str:
    """The 16-bit dtype ``spec`` runs (what a refusal of fp8 suggests, as ``predict`` does): bf16 where the spec has a
    BF16 peak, else fp16 (V100, T4: ``predict`` refuses bf16 there), else fp32."""
    return "bf16" if spec.peak_bf16_tflops else "fp16" if spec.peak_fp16_tflops else "fp32"


def unbf16_gemm_error(spec) -> str:
    """The error of a bf16 GEMM / conv row on a spec without ``peak_bf16_tflops`` (``predict --dtype bf16`` refuses
    such a GPU alike, ``data.device_spec.unsupported_step_dtype``)."""
    from wattcast.data.device_spec import bf16_missing_why

    return (f"dtype bf16 GEMM/conv needs BF16 tensor cores, but {spec.name}'s spec has no peak_bf16_tflops "
            f"({bf16_missing_why(spec)}; predict --dtype bf16 is refused there too); use {half_dtype_of(spec)}")


def unfp16_gemm_error(spec) -> str:
    """The error of an fp16 GEMM / conv row on a spec with ``peak_bf16_tflops`` but no ``peak_fp16_tflops``
    (``predict --dtype fp16`` refuses such a spec alike, ``data.device_spec.unsupported_step_dtype``)."""
    return (f"dtype fp16 GEMM/conv needs the spec's FP16 tensor peak, but {spec.name}'s spec has peak_bf16_tflops "
            f"({spec.peak_bf16_tflops:g}) and no peak_fp16_tflops: add the datasheet's dense FP16 tensor peak (equal to "
            "the BF16 one on every NVIDIA GPU with BF16), or use bf16; predict --dtype fp16 is refused there too")


def unpeaked_dtype_error(spec, dtype: str) -> str | None:
    """Why ``spec`` cannot run ``dtype``'s (canonical) tensor-core kernels: the spec has no peak for them (None when it
    has, or the dtype needs no unit of its own)."""
    if dtype not in _TENSOR_CORE_PEAKS or getattr(spec, _TENSOR_CORE_PEAKS[dtype][0]):
        return None
    field, why = _TENSOR_CORE_PEAKS[dtype]
    if dtype == "fp8":
        from wattcast.data.device_spec import fp8_missing_why
        why = f"({fp8_missing_why(spec)}); use {half_dtype_of(spec)}"
    return f"dtype {dtype} needs {dtype.upper()} tensor cores, but {spec.name}'s spec has no {field} {why}"


def resolve_default_dtype(dtype: str, spec, label: str = "--dtype") -> str:
    """``dtype`` (the dtype of rows that give none: ``wattcast kernels --dtype``, ``predict_kernels(dtype=)``) in its
    canonical spelling; a ValueError naming ``label`` when it is unknown or ``spec`` has no peak for it."""
    from wattcast.data.kernel_ops import canonical_dtype

    dtype = canonical_dtype(dtype)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"{label}: unknown dtype {dtype!r}; use {', '.join(DTYPE_BYTES)}")
    if (why := unpeaked_dtype_error(spec, dtype)) is not None:
        raise ValueError(f"{label} {dtype}: {why}")
    return dtype


def with_default_dtype(frame: pd.DataFrame, dtype: str):
    """(``frame`` with ``dtype`` in its ``dtype`` column wherever a row has none: no column, or an empty cell; the
    (0-based data row, dtype) of each row whose own dtype is another one). ``dtype`` is canonical."""
    from wattcast.data.kernel_ops import canonical_dtype

    if "dtype" not in frame.columns:
        return frame.assign(dtype=dtype), []
    own = frame["dtype"].astype(str).where(frame["dtype"].notna(), "")  # a frame's missing cell (NaN, None): none
    empty = own.str.strip() == ""
    canon = own.map(canonical_dtype)
    clash = ~empty & (canon != dtype)
    conflicts = list(zip(frame.index[clash].tolist(), own[clash].tolist()))
    return frame.assign(dtype=own.where(~empty, dtype)), conflicts


def default_dtype_conflict_error(dtype: str, conflicts: list, source: str, label: str = "--dtype") -> str:
    """The error for rows of ``source`` whose own dtype is not the default ``dtype`` (:func:`with_default_dtype`)."""
    return (f"{label} {dtype} conflicts with the dtype of {len(conflicts)} row(s) of {source} ("
            + ", ".join(f"data row {i + 1}: {d}" for i, d in conflicts[:5]) + (", ..." if len(conflicts) > 5 else "")
            + f"); {label} only fills rows without one: drop it or fix those rows")


def frame_with_default_dtype(frame: pd.DataFrame, dtype: str, spec, source: str, label: str = "--dtype") -> pd.DataFrame:
    """``frame`` with ``dtype`` filled in where a row gives none (``wattcast kernels --dtype``,
    ``predict_kernels(dtype=)``): ``dtype`` in its canonical spelling (:func:`resolve_default_dtype`, a ValueError
    naming ``label`` when it is unknown or ``spec`` has no peak for it) set on those rows (:func:`with_default_dtype`),
    and a ValueError (:func:`default_dtype_conflict_error`, naming ``source``) when a row's own dtype is another one."""
    dtype = resolve_default_dtype(dtype, spec, label)
    frame, conflicts = with_default_dtype(frame, dtype)
    if conflicts:
        raise ValueError(default_dtype_conflict_error(dtype, conflicts, source, label))
    return frame


def check_kernel_frame(frame) -> pd.DataFrame:
    """``frame`` if it is a table of kernels wattcast can read, else a ValueError saying what is wrong:
    not a pandas DataFrame, or a column it reads/writes (``OPName``/``op``, ``dtype``, shape columns,
    prediction columns) given more than once."""
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(
            "kernel predictions need a pandas DataFrame with an 'OPName' (or 'op') column, one row per kernel "
            f"(plus its shape columns), got {type(frame).__name__}"
            + (" (a single row: use series.to_frame().T)" if isinstance(frame, pd.Series) else "")
        )
    cols = pd.Index(frame.columns)
    dup = cols[cols.duplicated()]
    dup = sorted({str(c) for c in dup if c in _USED_COLUMNS})
    if dup:
        raise ValueError(f"input has duplicate column(s) {', '.join(map(repr, dup))}; give each column once")
    return frame


def normalise_kernel_frame(frame: pd.DataFrame, plausible_shapes: bool = True) -> tuple[pd.DataFrame, np.ndarray]:
    """Canonical ``op``/``dtype``/shape columns plus a per-row error message ('' = row is fine).

    A tf32 row of a vector family (norms, softmax, elementwise) becomes fp32: TF32 changes only matrix products.
    With ``plausible_shapes`` a shape value beyond :data:`~wattcast.data.kernel_ops.MAX_SHAPE_DIM` or a tensor beyond
    :data:`~wattcast.data.kernel_ops.MAX_TENSOR_BYTES` is an error naming the column(s) (see :func:`predict_kernels`).

    Raises ValueError for anything but a DataFrame, a frame without ``OPName``/``op``, or one that repeats
    a column wattcast reads (see :func:`check_kernel_frame`)."""
    check_kernel_frame(frame)
    df = frame.rename(columns={k: v for k, v in _COLUMN_ALIASES.items() if k in frame and v not in frame})
    if "op" not in df:
        raise ValueError("input has no 'OPName' (or 'op') column")
    n = len(df)
    # work on the distinct spellings (a few) and per-row codes, not on per-row strings: strip, lower-case and
    # resolve aliases once per spelling
    raw_codes, raw_uniq = pd.factorize(df["op"], use_na_sentinel=False)
    spelled = [u if pd.isna(u) else str(u).strip().lower() for u in raw_uniq]
    canon = np.array([OP_ALIASES.get(u, u) for u in spelled], dtype=object)
    codes_of_raw, op_uniq = pd.factorize(canon, use_na_sentinel=False)
    op_codes, op_uniq = codes_of_raw[raw_codes], list(op_uniq)
    op = pd.Series(_text_column(op_uniq, op_codes), index=df.index)
    if "dtype" in df:
        raw = df["dtype"]
        blank = raw.isna().to_numpy() | (raw.astype(str).str.strip() == "").to_numpy()
        # canonical_dtype once per distinct spelling
        raw_codes, raw_uniq = _text_codes(np.where(blank, "fp32", raw.astype(str).to_numpy()))
        dt_codes, dt_uniq = pd.factorize(np.array([canonical_dtype(u) for u in raw_uniq], dtype=object))
        dt_codes, dt_uniq = dt_codes[raw_codes], list(dt_uniq)
    else:
        dt_codes, dt_uniq = np.zeros(n, dtype=np.intp), ["fp32"]
    # TF32 and FP8 are matrix-unit modes (:data:`VECTOR_DTYPE_OF`): a tf32 / fp8 softmax, norm or elementwise kernel
    # runs on the vector units in the dtype the step gives it, so it is predicted as that kernel (the row keeps the
    # dtype it gave in the output)
    for mode_dtype, vector_dtype in VECTOR_DTYPE_OF.items():
        if mode_dtype not in dt_uniq:
            continue
        vector_op = np.array([OP_FAMILY.get(u) not in MATMUL_FAMILIES for u in op_uniq], dtype=bool)[op_codes]
        as_vec = (dt_codes == dt_uniq.index(mode_dtype)) & vector_op
        if as_vec.any():
            if vector_dtype not in dt_uniq:
                dt_uniq = dt_uniq + [vector_dtype]
            dt_codes = np.where(as_vec, dt_uniq.index(vector_dtype), dt_codes)
    dtype_col = _text_column(dt_uniq, dt_codes)
    err = np.full(n, "", dtype=object)
    fine = np.ones(n, dtype=bool)  # err == '' kept as a mask, not recomputed over strings
    known_uniq = np.array([u in OP_FAMILY for u in op_uniq], dtype=bool)
    known = known_uniq[op_codes]
    if not known.all():  # one message per distinct op, not per row
        msgs = np.empty(len(op_uniq), dtype=object)
        msgs[~known_uniq] = [unknown_op_error(u) for u, k in zip(op_uniq, known_uniq) if not k]
        err[~known] = msgs[op_codes[~known]]
        fine &= known
    bad_dtype = ~np.array([u in DTYPE_BYTES for u in dt_uniq], dtype=bool)[dt_codes] & fine
    if bad_dtype.any():
        msgs = np.empty(len(dt_uniq), dtype=object)
        msgs[:] = [None if u in DTYPE_BYTES else unknown_dtype_error(u) for u in dt_uniq]
        err[bad_dtype] = msgs[dt_codes[bad_dtype]]
        fine &= ~bad_dtype
    shape = [c for c in SHAPE_COLS if c in df]
    # numeric columns convert element by element: convert each once and validate on slices of it
    values = {c: _numeric(df[c]) for c in shape}
    numeric = {c: pd.api.types.is_numeric_dtype(df[c].dtype) for c in shape}
    for code in pd.unique(op_codes[known]):
        ops = op_uniq[code]
        cols = required_columns(ops)
        rows = (op_codes == code) & fine
        for c in cols:
            if c not in df:
                err[rows] = f"missing column {c!r} for op {ops!r}"
                fine &= ~rows
                break
            v = values[c][rows] if numeric[c] else _numeric(df.loc[rows, c])
            bad = bad_shape_values(v, c)
            with np.errstate(invalid="ignore"):
                huge = ~bad & (v > MAX_SHAPE_DIM) if plausible_shapes else np.zeros(len(v), dtype=bool)
            if bad.any():
                idx = np.flatnonzero(rows)[bad]
                err[idx] = [f"bad value {df[c].iloc[i]!r} in column {c!r} (need a whole number >= {min_shape_value(c)})" for i in idx]
                fine[idx] = False
            if huge.any():
                idx = np.flatnonzero(rows)[huge]
                err[idx] = [f"implausible value {df[c].iloc[i]!r} in column {c!r}: beyond 2**40 = {MAX_SHAPE_DIM:,} "
                            "(no real tensor dimension is; a typo or another unit?)" for i in idx]
                fine[idx] = False
            rows = rows & fine
    if plausible_shapes:
        _refuse_huge_tensors(op_uniq, op_codes, dt_uniq, dt_codes, values, fine, err)
    # ops no training source measured are predicted as their measured stand-in (kernel_ops.MEASURED_AS)
    if any(u in MEASURED_AS for u in op_uniq):
        op_col = _text_column([MEASURED_AS.get(u, u) for u in op_uniq], op_codes)
    else:
        op_col = op.to_numpy() if n == 0 else op.array
    out = pd.DataFrame({"op": op_col, "dtype": dtype_col, **values}, index=df.index)
    # a convolution whose kernel does not fit the padded input has no output: say so, do not predict it (nor its
    # backward kernels, which carry its shape)
    if any(u in CONV_KERNELS for u in op_uniq):
        conv = np.isin(op_codes, [i for i, u in enumerate(op_uniq) if u in CONV_KERNELS]) & fine
        if conv.any():
            size = out["Input_Size"].to_numpy() + 2 * out["Padding"].to_numpy() - out["Kernel_Size"].to_numpy()
            bad = conv & (size < 0)
            err[bad] = "conv kernel larger than the padded input (Kernel_Size > Input_Size + 2 x Padding): no output"
    return out, err


def _refuse_huge_tensors(op_uniq: list, op_codes: np.ndarray, dt_uniq: list, dt_codes: np.ndarray,
                         values: dict[str, np.ndarray], fine: np.ndarray, err: np.ndarray) -> None:
    """Mark (in ``err`` and ``fine``, in place) the valid rows one of whose tensors (an operand or the result) holds
    more than :data:`~wattcast.data.kernel_ops.MAX_TENSOR_BYTES`, naming the tensor's shape columns: every dim may be
    plausible on its own while their product is not (B = M = K = 2**30)."""
    fam_codes = np.array([("gemm", "conv").index(OP_FAMILY[u]) if OP_FAMILY.get(u) in ("gemm", "conv") else 2
                          for u in op_uniq], dtype=np.int8)[op_codes] if len(op_uniq) else np.zeros(0, dtype=np.int8)
    eb = np.array([float(DTYPE_BYTES.get(d, 4)) for d in dt_uniq])[dt_codes]
    for code, cols in enumerate((GEMM_COLS, CONV_COLS, VEC_COLS)):
        idx = np.flatnonzero(fine & (fam_codes == code))
        if not len(idx):
            continue
        g = {c: values[c][idx] for c in cols}  # the family's required columns: present on its valid rows
        with np.errstate(invalid="ignore", over="ignore"):
            if code == 0:
                B, M, N, K = g["B"], g["M"], g["N"], g["K"]
                tensors = [("B x M x N", B * M * N), ("B x N x K", B * N * K), ("B x M x K", B * M * K)]
            elif code == 1:
                B, cin, cout, ks, s_in = (g[c] for c in ("B", "Input_Channel", "Output_Channel", "Kernel_Size", "Input_Size"))
                out = np.floor((s_in + 2 * g["Padding"] - ks) / np.where(g["Stride"] > 0, g["Stride"], 1)) + 1
                tensors = [("B x Input_Channel x Input_Size^2", B * cin * s_in ** 2),
                           ("Output_Channel x Input_Channel x Kernel_Size^2", cout * cin * ks ** 2),
                           ("B x Output_Channel x output size^2", B * cout * out ** 2)]
            else:
                tensors = [("B x H", g["B"] * g["H"])]
        left = np.ones(len(idx), dtype=bool)
        for what, elems in tensors:
            size = elems * eb[idx]
            over = left & (size > MAX_TENSOR_BYTES)
            if over.any():
                err[idx[over]] = [f"implausible shape: the {what} tensor holds {b:.3g} bytes, beyond "
                                  f"{MAX_TENSOR_BYTES:.0e} (1 PB, thousands of times any GPU's memory); check those columns"
                                  for b in size[over]]
                fine[idx[over]] = False
                left &= ~over


#: dedupe rows before featurising/predicting when at most this fraction of them is distinct
_DEDUP_MAX_DISTINCT = 0.8


def _group_codes(columns: list[tuple[np.ndarray, int]], n: int) -> tuple[np.ndarray, int]:
    """(group number of every row, number of groups) of ``n`` rows given per column (codes in ``0 .. k-1``, ``k``):
    rows are in one group when all their codes are; groups are numbered in order of their first row."""
    key = np.zeros(n, dtype=np.int64)
    size = 1
    for codes, k in columns:
        if size * k >= 2**62:  # keep the combined key in int64: renumber it first
            key, u = pd.factorize(key)
            size = len(u)
        key = key * k + codes
        size *= k
    inverse, uniq = pd.factorize(key)
    return inverse, len(uniq)


def _groups(inverse: np.ndarray, n_groups: int, max_distinct: float) -> tuple[np.ndarray, np.ndarray] | None:
    """(representative row of each group, ``inverse``), or None when there are more than ``max_distinct`` x rows
    groups, or no two rows share one."""
    n = len(inverse)
    if n_groups == n or n_groups > max_distinct * n:
        return None
    rep = np.empty(n_groups, dtype=np.intp)
    rep[inverse] = np.arange(n)  # any row of each group represents it
    return rep, inverse


def _distinct_rows(df: pd.DataFrame, max_distinct: float = _DEDUP_MAX_DISTINCT
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """(representative row of each distinct row, distinct-row number of every row), or None when more than
    ``max_distinct`` of the rows are distinct (or all are). Rows are equal when every column is (NaN equals NaN):
    predictions are row-wise, so equal rows get equal predictions and each distinct row needs predicting once."""
    n = len(df)
    if n < 2:
        return None
    columns = []
    for c in df.columns:
        codes, uniq = pd.factorize(df[c], use_na_sentinel=True)  # NaN -> -1
        columns.append((codes + 1, len(uniq) + 1))
    return _groups(*_group_codes(columns, n), max_distinct)


#: the input columns the predictions read (any spelling): rows equal in these get equal outputs
_READ_COLUMNS = frozenset(("op", "dtype", *_COLUMN_ALIASES, *_COLUMN_ALIASES.values(), *SHAPE_COLS))


def _exact_key(col: pd.Series) -> np.ndarray | None:
    """Per row, an integer equal for two cells only when they hold the same value in every bit: a float's bit
    pattern (-0.0 is not 0.0), an integer itself, a text cell's code among the column's strings, for a missing text
    cell a code per kind of missing value (None and NaN print differently). None for any other column (mixed Python
    objects: 1, 1.0 and True are equal keys but print differently in an error message)."""
    dt = col.dtype
    if isinstance(dt, np.dtype) and dt.kind in "biuf":
        v = col.to_numpy()
        return v.view(f"i{dt.itemsize}") if dt.kind == "f" else v
    if not (isinstance(dt, pd.StringDtype)
            or (dt == object and pd.api.types.infer_dtype(col, skipna=True) in ("string", "empty"))):
        return None
    codes, uniq = pd.factorize(col, use_na_sentinel=True)
    missing = np.flatnonzero(codes < 0)
    if len(missing):
        codes = codes.copy()
        if dt == object:  # None, NaN, pd.NA: one code per kind (and printed form) of missing cell
            kinds = [f"{type(v).__qualname__}:{v!r}" for v in col.to_numpy()[missing]]
            codes[missing] = len(uniq) + pd.factorize(np.array(kinds, dtype=object))[0]
        else:  # a text dtype has one missing value
            codes[missing] = len(uniq)
    return codes


def _distinct_input_rows(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_distinct_rows` on the raw input, before any normalising: (representative row of each group of rows
    identical in every column the predictions read (:func:`_exact_key`: bit for bit), group of every row), or None
    when more than :data:`_DEDUP_MAX_DISTINCT` of the rows differ or a read column is not plain numbers or text. Every
    step from :func:`normalise_kernel_frame` on is row-wise, so a group's rows get its representative's outputs (its
    error message too), and a table that repeats its kernels is normalised and predicted once per kernel."""
    n = len(frame)
    if n < 2 or not any(c in frame for c in ("op", "OPName")):
        return None
    keys = []
    for c in frame.columns:
        if c in _READ_COLUMNS:
            k = _exact_key(frame[c])
            if k is None:
                return None
            keys.append(k)
    # one FNV-1a hash of the row's keys (kernel_surrogates.fnv1a_rows),
    # then every group checked column by column; a collision (two different rows, one hash) takes the exact codes
    inverse, uniq = pd.factorize(fnv1a_rows(keys, n))
    n_groups = len(uniq)
    if n_groups == n or n_groups > _DEDUP_MAX_DISTINCT * n:
        return None
    rep = np.empty(n_groups, dtype=np.intp)
    rep[inverse] = np.arange(n)
    if not all(np.array_equal(k[rep][inverse], k) for k in keys):
        return _groups(*_group_codes([(c, len(u)) for c, u in map(pd.factorize, keys)], n), _DEDUP_MAX_DISTINCT)
    return rep, inverse


def _family_matrix(X: pd.DataFrame, cols: list[str], rows: np.ndarray | None) -> np.ndarray:
    """X[cols] (restricted to ``rows``) as a column-major float64 array, gathered column by column."""
    A = np.empty((len(cols), len(X) if rows is None else len(rows)))
    for j, c in enumerate(cols):
        v = X[c].to_numpy(dtype=np.float64)
        if rows is None:
            A[j] = v
        else:
            np.take(v, rows, out=A[j])
    return A.T


def _family_columns(fm, X: pd.DataFrame) -> list[str]:
    """The model's features, then the support features it does not use: one matrix serves both."""
    feats = set(fm.features)
    return list(fm.features) + [c for c in fm.support_columns(X.columns) if c not in feats]


#: bytes of the contraction one tensor-core MMA k-tile holds: GEMM kernels stage K in shared memory in 128-byte rows
#: (CUTLASS's SM90 collective builders pick the 128-byte swizzled K-major atom ``GMMA::Layout_K_SW128_Atom<T>`` when the
#: tile's K is a multiple of 128 B / sizeof(T): include/cutlass/gemm/collective/builders/sm90_common.inl
#: ``ss_smem_selector``; its Hopper examples use 128 x 128 x 64 tiles in bf16/fp16 (examples/48_hopper_warp_specialized_gemm)
#: and K = 128 in fp8 (examples/54_hopper_fp8_warp_specialized_gemm); AMD's GPUs are given the same depth, an
#: assumption not checked against hipBLASLt's kernel tables here): 64 bf16/fp16, 128 fp8, 32 tf32 elements
K_TILE_BYTES = 128


def _k_tile_elems(dtypes: np.ndarray) -> np.ndarray:
    """Per row of ``dtypes`` (canonical names): the contraction of one MMA k-tile (:data:`K_TILE_BYTES` over the
    element size) for the tensor-core dtypes, 0 for fp32 (FP32 GEMMs run on the vector units: no k-tile to pad to)."""
    codes, names = pd.factorize(np.asarray(dtypes, dtype=object))
    per = np.array([0.0 if d == "fp32" else K_TILE_BYTES / DTYPE_BYTES[d] for d in names])
    return per[codes] if len(codes) else np.zeros(0)


#: the ops of the GEMM family (the k-tile padding's rows)
_GEMM_OPS = np.array(sorted(o for o, f in OP_FAMILY.items() if f == "gemm"), dtype=object)


def _pad_contraction(canon: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """(``canon`` with every tensor-core GEMM row's contraction ``N`` raised to one MMA k-tile, the positions of the
    rows raised). A contraction below the k-tile is padded to it (out-of-bounds loads fill zeros) and the kernel runs
    one k-iteration of full MMAs, so its time is the k-tile's: neither less nor, as the floor/ceiling members'
    hand-over predicted it, more (B200 fp8 4096 x 45 x 4096: 23.3 us against 14.2 at 128). ``N`` is the contraction of
    ``bmm``/``matmul`` and ``linear`` rows alike (``nn.Linear(N, K)``)."""
    if "N" not in canon or not len(canon):
        return canon, np.zeros(0, dtype=np.intp)
    gemm = np.isin(canon["op"].to_numpy(), _GEMM_OPS)
    if not gemm.any():
        return canon, np.zeros(0, dtype=np.intp)
    tile = np.where(gemm, _k_tile_elems(canon["dtype"].to_numpy()), 0.0)
    nv = canon["N"].to_numpy(dtype=float)
    raised = np.flatnonzero(nv < tile)
    if not len(raised):
        return canon, raised
    out = canon.copy()
    out["N"] = np.maximum(nv, tile)
    return out, raised


#: the ops of the elementwise family (the rows :func:`_fold_wide_rows` refolds)
_ELEMENTWISE_OPS = np.array(sorted(o for o, f in OP_FAMILY.items() if f == "elementwise"), dtype=object)
#: the widest row (``H``) of an elementwise kernel the training data measures at more than one row: Vidur's profiles
#: reach H = 28,672 (B up to 32,768), NeuSight's 16,384 (neusight/kernels_test, B 16,384 to 4,194,304); wider rows
#: there are LLMCompass's twelve B = 1 GELUs alone ($WATTCAST_DATA/tensorcore, data/kernel_datasets.py load_kernels)
WIDE_ROW_MAX_H = 28672
#: the row width a wider elementwise row is refolded to: NeuSight's widest (neusight/kernels_test)
FOLD_ROW_H = 16384


def _fold_wide_rows(canon: pd.DataFrame) -> pd.DataFrame:
    """``canon`` with every elementwise row wider than :data:`WIDE_ROW_MAX_H` refolded to rows of :data:`FOLD_ROW_H`
    (``B x H`` elements kept: ``B' = B x H / FOLD_ROW_H``). An elementwise kernel's time is its element count's: over
    NeuSight's measurements, the same (device, op, dtype, element count) at two or more (B, H) splits differ by 0.1%
    at the median and 3.4% at most from 4 M elements up (1,399 groups; 24% at most over all 1,531, small kernels), so
    the split carries no information the count does not. Rows wider than the data measure it at (a flattened 1-D
    tensor: B = 1, H = 268 M) came out 3-7x slower than the same count in a measured shape (H100 bf16 add: 1.76 ms at
    1 x 268,435,456 against 0.51 ms at 16,384 x 16,384), unflagged: each feature alone is inside the training range
    (LLMCompass's B = 1 GELUs), their combination is not."""
    if "H" not in canon or not len(canon):
        return canon
    h = canon["H"].to_numpy(dtype=float)
    wide = (h > WIDE_ROW_MAX_H) & np.isin(canon["op"].to_numpy(), _ELEMENTWISE_OPS)
    if not wide.any():
        return canon
    out = canon.copy()
    b = out["B"].to_numpy(dtype=float)
    out["B"] = np.where(wide, b * h / FOLD_ROW_H, b)
    out["H"] = np.where(wide, float(FOLD_ROW_H), h)
    return out


#: tensor-core linear rows with a contraction (``N``) of at most MONOTONE_MAX_N are held to "a longer contraction never
#: takes less time" (:func:`_predict_rows`): LoRA ranks (16-256) and MLA's latent (DeepSeek-V3's kv_lora_rank 512)
MONOTONE_MAX_N = 512
#: tensor-core linear rows with at least MONOTONE_MIN_M and fewer than MONOTONE_MAX_M rows (``M``) are held to "more
#: rows never take less time", bounded by the same GEMM at every power of two above them up to MONOTONE_MAX_M
#: (:func:`_predict_rows`)
MONOTONE_MAX_M = 4096
MONOTONE_MIN_M = 1


#: the per-row physical floor (ms) the predictions carry between :func:`_predict_features` and :func:`_predict_rows`
_FLOOR_KEY = "_floor_ms"
#: the per-row time at the device's measured matmul ceiling (ms, 0 where none; :func:`_ceiling_clip_ms`) the band's
#: low end carries between the same two
_CLIP_KEY = "_ceiling_clip_ms"


#: the families whose 16-bit (bf16 / fp16) rows :func:`_predict_rows` holds to "never slower than the same kernel in
#: fp32": memory-bound vector kernels that compute in fp32 registers whatever their storage dtype, so a 16-bit one
#: moves half the bytes of its fp32 twin for the same arithmetic. PyTorch's elementwise CUDA kernels compute in
#: ``at::opmath_type<scalar_t>``, float for Half and BFloat16 ("For FP16 or BFloat16 inputs, ops should perform internal
#: math in FP32": ATen/OpMathType.h l. 15-27, torch 2.13); its LayerNorm / RMSNorm and softmax kernels accumulate in
#: ``at::acc_type<T, /*is_cuda=*/true>``, float for both (ATen/AccumulateType.h l. 131-132; used by
#: aten/src/ATen/native/cuda/layer_norm_kernel.cu and SoftMax.cu); Apex's and Transformer Engine's fused norms and
#: softmax compute in fp32 alike.
HALF_TWIN_FAMILIES = ("elementwise", "ln", "softmax")
#: the 16-bit dtypes the guard applies to (an fp8 vector row is bf16 by now, :data:`VECTOR_DTYPE_OF`)
_HALF_DTYPES = ("bf16", "fp16")
#: the ops of :data:`HALF_TWIN_FAMILIES`
_HALF_TWIN_OPS = np.array(sorted(o for o, f in OP_FAMILY.items() if f in HALF_TWIN_FAMILIES), dtype=object)
#: the ``model`` suffix of a row whose prediction is its fp32 twin's (:func:`_predict_rows`), as ``+floor`` marks the
#: GEMM floor member's rows
FP32_TWIN_SUFFIX = "+fp32-twin"


def _half_vector_rows(canon: pd.DataFrame) -> np.ndarray:
    """The positions of ``canon``'s bf16 / fp16 rows of a :data:`HALF_TWIN_FAMILIES` op."""
    if not len(canon):
        return np.zeros(0, dtype=np.intp)
    return np.flatnonzero(np.isin(canon["dtype"].to_numpy(), _HALF_DTYPES)
                          & np.isin(canon["op"].to_numpy(), _HALF_TWIN_OPS))


#: the spec field of each tensor-core convolution dtype's dense peak (:data:`TENSOR_CORE_CONV_DTYPES`)
_CONV_PEAK_FIELD = {"tf32": "peak_tf32_tflops", "bf16": "peak_bf16_tflops", "fp16": "peak_fp16_tflops",
                    "fp8": "peak_fp8_tflops"}
#: the ``model`` suffix of a convolution row costed as its implicit GEMM by the GEMM family (:func:`_route_convs`)
IMPLICIT_GEMM_SUFFIX = "+implicit-gemm"
#: the ``model`` suffix of a tf32 convolution row cuDNN runs in FP32 on the vector units (too few input channels for
#: its tensor-core kernels: featurize/conv_gemm.py TF32_CONV_CHANNEL_MULTIPLE), costed by the conv surrogate as fp32
FP32_SIMT_SUFFIX = "+fp32-simt"
#: the ``model`` suffix of a backward convolution row (``conv_dgrad`` / ``conv_wgrad``) off the tensor cores, costed by
#: the conv surrogate at its forward convolution's shape (the same FLOPs, and the same three tensors read or written)
FORWARD_SHAPE_SUFFIX = "+fwd-shape"
#: the ``model`` suffix of an FP32 1 x 1 stride-1 unpadded convolution row (forward, dgrad or wgrad) costed as the
#: batched GEMM it is by the GEMM family (:func:`_route_convs`; featurize/conv_gemm.py ``pointwise_gemm_shape``)
POINTWISE_GEMM_SUFFIX = "+sgemm-1x1"


def _put_gemm_shape(out: pd.DataFrame, rows: np.ndarray, bmnk) -> None:
    """Write the GEMM shape ``bmnk`` (B, M, N, K arrays, one value per row of ``rows``) into ``out``'s rows ``rows``
    (the other rows keep theirs; a column ``out`` lacks is made, NaN elsewhere)."""
    for col, v in zip(("B", "M", "N", "K"), bmnk):
        full = out[col].to_numpy(dtype=float, copy=True) if col in out else np.full(len(out), np.nan)
        full[rows] = v
        out[col] = full


def _route_convs(canon: pd.DataFrame, spec: DeviceSpec) -> tuple[pd.DataFrame, dict | None]:
    """(``canon`` with its convolution rows as the kernels that cost them, the routes: per-row masks ``conv``,
    ``gemm``, ``simt`` and ``bwd``; None when ``canon`` holds no convolution).

    - A convolution kernel (``conv``, ``conv_dgrad``, ``conv_wgrad``) of a tensor-core dtype (tf32, bf16, fp16, fp8)
      on a spec with that dtype's peak becomes the ``bmm`` (B = 1) of its implicit GEMM
      (:func:`wattcast.featurize.conv_gemm.implicit_gemm_shape`; 16-bit channels padded as cuDNN pads them,
      :func:`~wattcast.featurize.conv_gemm.padded_channels`), predicted by the GEMM family. The conv surrogate learned
      NeuSight's FP32 convolutions of V100 / P100 / T4 alone: on tensor-core dtypes it extrapolated, non-monotonically
      (an A100 bf16 1x1 conv 1.75x slower than the 3x3 on the same tensors, audit 57d finding 4). The GEMM family has
      the tensor-core data: AlexNet's conv3-5 on an A100 in TF32 come out +8.5 / +9.5 / +5.6% over the measured
      kernels as implicit GEMMs (-12 / -29 / -19% by the conv surrogate; benchmarks/conv_alexnet.py).
    - A tf32 convolution whose input channels cuDNN's TF32 tensor-core kernels do not take
      (:func:`~wattcast.featurize.conv_gemm.tf32_conv_on_tensor_cores`) runs in FP32: the conv surrogate's fp32 row.
    - A backward kernel off the tensor cores is the conv surrogate's forward row of its shape (the same FLOPs and
      tensors; the surrogate has no backward data). Until stop 57 a step costed them by the roofline at the dense peak.
    - An FP32 (after the rule above) 1 x 1 convolution of stride 1 and no padding, forward, dgrad or wgrad, becomes
      the ``bmm`` of B images it is (:func:`~wattcast.featurize.conv_gemm.pointwise_gemm_shape`), predicted by the
      GEMM family as FP32 (route ``sgemm``). cuDNN runs them as cuBLAS SGEMMs or GEMM-shaped implicit-GEMM kernels:
      on the V100 ResNet-50 trace (benchmarks/resnet50_v100_trace.py) ``volta_sgemm_64x64_nn`` / ``_32x128_nn``
      forward, ``volta_sgemm_*_nt`` dgrad, ``volta_sgemm_*_tn`` wgrad at 10-13 TFLOP/s, where the conv surrogate
      (NeuSight's conv data) put them at 6.5-8.
    """
    op = canon["op"].to_numpy()
    conv = np.isin(op, CONV_KERNELS)
    if not conv.any():
        return canon, None
    dt = canon["dtype"].to_numpy()
    codes, names = pd.factorize(dt)
    peaked = np.array([d in TENSOR_CORE_CONV_DTYPES and bool(getattr(spec, _CONV_PEAK_FIELD[d], None) or 0)
                       for d in names], dtype=bool)[codes]
    cin = canon["Input_Channel"].to_numpy(dtype=float)
    simt = conv & (dt == "tf32") & ~tf32_conv_on_tensor_cores(cin)
    gemm = conv & peaked & ~simt
    sgemm = conv & ~gemm & ((dt == "fp32") | simt) & pointwise_conv_rows(
        *(canon[c].to_numpy(dtype=float) for c in ("Kernel_Size", "Stride", "Padding")))
    bwd = conv & (op != "conv")
    out = canon.copy()
    new_op = np.where(gemm | sgemm, "bmm", np.where(conv, "conv", op)).astype(object)
    out["op"] = new_op
    if simt.any():
        out["dtype"] = np.where(simt, "fp32", dt).astype(object)
    if gemm.any():
        g = np.flatnonzero(gemm)
        eb = np.array([float(DTYPE_BYTES[d]) for d in names])[codes][g]
        c = {col: canon[col].to_numpy(dtype=float)[g] for col in CONV_COLS}
        m, n_, k = implicit_gemm_shape(op[g], c["B"], padded_channels(c["Input_Channel"], eb),
                                       padded_channels(c["Output_Channel"], eb), c["Kernel_Size"], c["Input_Size"],
                                       c["Stride"], c["Padding"])
        _put_gemm_shape(out, g, (np.ones(len(g)), m, n_, k))
    if sgemm.any():
        g = np.flatnonzero(sgemm)
        c = {col: canon[col].to_numpy(dtype=float)[g] for col in CONV_COLS}
        _put_gemm_shape(out, g, pointwise_gemm_shape(op[g], c["B"], c["Input_Channel"], c["Output_Channel"],
                                                     c["Input_Size"]))
    if gemm.any() or sgemm.any():
        g = np.flatnonzero(gemm | sgemm)
        for col in CONV_COLS[1:]:
            full = out[col].to_numpy(dtype=float, copy=True)
            full[g] = np.nan
            out[col] = full
    return out, {"conv": conv, "gemm": gemm, "simt": simt & ~sgemm, "bwd": bwd & ~sgemm, "sgemm": sgemm}


#: the output-channel counts a tensor-core convolution row is also costed at (:func:`_predict_rows`): powers of two and
#: 1.5 x powers of two (ResNet's and VGG's 64 .. 2048, AlexNet's 192 and 384, UNet's and ConvNeXt's 96 .. 768 are on it)
#: from 1 to 2048; a row with more output channels is as predicted
CONV_COUT_LADDER = np.unique(np.concatenate([2.0 ** np.arange(12), 3.0 * 2.0 ** np.arange(10)]))


def _cout_ladder_probes(canon: pd.DataFrame, rows: np.ndarray
                        ) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(probe rows, the canonical row each belongs to, the guarded rows, per guarded row the index of its probe at the
    ladder value at or below its ``Output_Channel`` and the log weight of the one above): for every row of ``rows``
    (tensor-core convolution rows) with 1 <= ``Output_Channel`` < the top of :data:`CONV_COUT_LADDER`, the row at
    each ladder value from the one at or below its ``Output_Channel`` to the top, ascending (one segment per row)."""
    cout = canon["Output_Channel"].to_numpy(dtype=float)
    lad = CONV_COUT_LADDER
    sel = rows[(cout[rows] >= lad[0]) & (cout[rows] < lad[-1])]
    if not len(sel):
        return canon.iloc[:0], np.zeros(0, dtype=np.intp), sel, np.zeros(0, dtype=np.intp), np.zeros(0)
    lo = np.searchsorted(lad, cout[sel], side="right") - 1
    steps = len(lad) - lo
    probes, owner, first, k = _log2_grid(canon, sel, 0, steps)
    probes["Output_Channel"] = lad[np.repeat(lo, steps) + k]
    w = np.log(cout[sel] / lad[lo]) / np.log(lad[lo + 1] / lad[lo])
    return probes, owner, sel, first.astype(np.intp), np.clip(w, 0.0, 1.0)


def _predict_rows(canon: pd.DataFrame, spec: DeviceSpec, bundle: KernelBundle) -> dict[str, np.ndarray]:
    """:func:`_predict_cout_guarded_rows`, a tensor-core k x k convolution never faster than the 1 x 1 convolution
    over the same tensors.

    A k x k convolution whose output is the size a 1 x 1 one of the same stride makes of the same input ("same"
    padding: ResNet's, VGG's 3x3, AlexNet's conv2-5) reads that input and writes that output, and does k^2 times the
    1 x 1's multiply-adds (Winograd's F(2x2, 3x3) still 16 / 4 = 4 per output against the 1 x 1's 1; Lavin & Gray,
    "Fast Algorithms for Convolutional Neural Networks", CVPR 2016, eq. 7), so it cannot take less time. The GEMM
    model, where the k x k conv is memory-bound (its time its GEMM's efficiency on the conv's own bytes,
    featurize/conv_gemm.py ``implicit_gemm_conv_ms``) and the 1 x 1's GEMM is the same bytes, put the two within its
    own noise of each other, either way round (bf16 64->64 at 56 x 56, B 32, on an H100 SXM: 3x3 13.0 us, 1x1 14.8).
    Each such row is predicted with its 1 x 1 twin (the same row, ``Kernel_Size`` 1, ``Padding`` 0; each Cout-guarded
    as below, so the larger of two non-increasing series stays non-increasing in Cout) in the same pass, and takes
    the larger time and band."""
    op = canon["op"].to_numpy() if "op" in canon else np.zeros(0)
    conv = np.flatnonzero(np.isin(op, CONV_KERNELS))
    if len(conv):
        c = canon.iloc[conv]
        k, size, stride, pad = (c[col].to_numpy(dtype=float)
                                for col in ("Kernel_Size", "Input_Size", "Stride", "Padding"))
        same = (k > 1) & (conv_out_size(size, k, stride, pad) == conv_out_size(size, 1, stride, 0))
        conv = conv[_tensor_core_conv(c, spec) & same]
    if not len(conv):
        return _predict_cout_guarded_rows(canon, spec, bundle)
    n = len(canon)
    one_by_one = canon.iloc[conv].assign(Kernel_Size=1.0, Padding=0.0)
    out, res = _with_extra_rows(_predict_cout_guarded_rows, canon, one_by_one, spec, bundle)
    twin = np.arange(n, n + len(conv))
    for key in ("pred_latency_ms", "pred_low_ms", "pred_high_ms"):
        out[key] = np.array(out[key], dtype=float)
        out[key][conv] = np.maximum(out[key][conv], res[key][twin])
    return out


def _predict_cout_guarded_rows(canon: pd.DataFrame, spec: DeviceSpec, bundle: KernelBundle) -> dict[str, np.ndarray]:
    """:func:`_predict_conv_rows`, a tensor-core convolution with fewer output channels never slower.

    A convolution of Cout filters is also run by the kernel of any Cout' > Cout filters (the extra filters zeros,
    their outputs dropped: cuDNN pads 16-bit channels so already, featurize/conv_gemm.py TC_CHANNEL_ALIGN_BYTES), so
    the Cout' conv's time bounds the Cout conv's. The GEMM model does not know it: a narrow output is a GEMM with few
    output columns, and its tensor-core training rows have K >= 8 (DeepBench fp16: 6 rows at K = 8, 39 at 16, all with
    M <= 8448; Vidur, LLMCompass and XLA K >= 32; and no tensor-core row has M >= 65536, where a conv's B x Ho x Wo
    usually is), so across Cout it wiggled (tf32 3x3 128->Cout, B 64 at 64 x 64 on an A100-80GB, after the memory
    correction of :func:`~wattcast.featurize.conv_gemm.implicit_gemm_conv_ms`: 0.1256 ms at Cout 8, 0.1232 at 16;
    bf16 dgrad on an H100 up to 10% between neighbouring Couts). Each tensor-core conv row with 1 <= Cout < 2048 is
    costed at the :data:`CONV_COUT_LADDER` values from the one at or below its Cout up to 2048, made non-decreasing by
    a running minimum from the top, and interpolated log-linearly in Cout between the two ladder values around it
    (the band scaled alike; never below the row's own roofline): non-increasing as Cout falls up to 2048, and on a
    ladder value never above the row's own prediction (AlexNet's conv2-5, Cout 192 / 384 / 256 / 256, each the
    fastest of the ladder above it, keep their own). The ladder rows are predicted in the same pass, each distinct one
    once; a row's result depends on its own ladder only."""
    op = canon["op"].to_numpy() if "op" in canon else np.zeros(0)
    conv = np.flatnonzero(np.isin(op, CONV_KERNELS))
    rows = conv[_tensor_core_conv(canon.iloc[conv], spec)] if len(conv) else conv
    probes, owner, sel, lo_i, w = _cout_ladder_probes(canon, rows) if len(rows) else (canon.iloc[:0],) + (conv,) * 4
    if not len(probes):
        return _predict_conv_rows(canon, spec, bundle)
    n = len(canon)
    out, res = _with_extra_rows(_predict_conv_rows, canon, probes, spec, bundle)
    # the running minimum from the top of each row's ladder (comparisons only: a ladder value's time stays exact)
    g, start = _segment_monotone(np.asarray(res["pred_latency_ms"][n:], dtype=float), owner, suffix_min=True)
    end = np.append(start, len(g))[np.searchsorted(start, lo_i, side="right")] - 1
    m_lo, m_hi = g[lo_i], g[np.minimum(lo_i + 1, end)]
    with np.errstate(divide="ignore", invalid="ignore"):  # (clipped: rounding must not step past a neighbour)
        t_new = np.where(w > 0, np.clip(m_lo * (m_hi / m_lo) ** w, m_lo, m_hi), m_lo)
    t_old = np.asarray(out["pred_latency_ms"], dtype=float)[sel]
    f = np.where(t_old > 0, t_new / np.where(t_old > 0, t_old, 1.0), 1.0)
    roof = np.where(_strided_subset_rows(canon, sel), 0.0, np.asarray(out["roofline_ms"], dtype=float)[sel])
    for k in ("pred_latency_ms", "pred_low_ms", "pred_high_ms"):
        out[k] = np.array(out[k], dtype=float)
        out[k][sel] = np.maximum(t_new if k == "pred_latency_ms" else out[k][sel] * f, roof)
    return out


def _strided_subset_rows(canon: pd.DataFrame, at: np.ndarray) -> np.ndarray:
    """Per row ``at`` of ``canon`` (convolution kernels): a forward or wgrad kernel whose filter is narrower than its
    stride, which reads only the strided pixels of its input (their channels contiguous in NHWC), fewer bytes than the
    row's own ``roofline_ms`` counts (the whole input tensor): its floor is the lower of that and its implicit GEMM's
    roofline (:func:`_predict_routed_rows`)."""
    k, st = (canon[c].to_numpy(dtype=float)[at] for c in ("Kernel_Size", "Stride"))
    return (canon["op"].to_numpy()[at] != "conv_dgrad") & (k < st)


def _tensor_core_conv(conv_rows: pd.DataFrame, spec: DeviceSpec) -> np.ndarray:
    """Per row of ``conv_rows`` (convolution kernels): it runs as an implicit GEMM on tensor cores (a tensor-core dtype
    whose peak the spec has; a tf32 conv only with Cin a multiple of 4), as :func:`_route_convs` routes it."""
    dt = conv_rows["dtype"].to_numpy()
    codes, names = pd.factorize(dt)
    peaked = np.array([d in TENSOR_CORE_CONV_DTYPES and bool(getattr(spec, _CONV_PEAK_FIELD[d], None) or 0)
                       for d in names], dtype=bool)[codes] if len(dt) else np.zeros(0, dtype=bool)
    cin = conv_rows["Input_Channel"].to_numpy(dtype=float)
    return peaked & ~((dt == "tf32") & ~tf32_conv_on_tensor_cores(cin))


def _predict_conv_rows(canon: pd.DataFrame, spec: DeviceSpec, bundle: KernelBundle) -> dict[str, np.ndarray]:
    """:func:`_predict_routed_rows`, a tf32 convolution on tensor cores never slower than the same convolution in FP32.

    ``torch.backends.cudnn.allow_tf32`` leaves an fp32 convolution's descriptor at cuDNN's default math type
    (aten/src/ATen/cudnn/Descriptors.h ``ConvolutionDescriptor::set``: ``CUDNN_FMA_MATH`` only when TF32 is not
    allowed), under which cuDNN may run TF32 tensor-core kernels or FP32 ones, and PyTorch takes the algorithm cuDNN
    ranks fastest (aten/src/ATen/native/cudnn/Conv_v7.cpp: ``cudnnFind*`` timing every algorithm under
    ``cudnn.benchmark``, the ``cudnnGet*_v7`` heuristics' first pick otherwise): the FP32 kernels are still among the
    candidates. So a tf32 row on tensor cores is predicted with its fp32 twin (same op and shape; the conv surrogate,
    :data:`FORWARD_SHAPE_SUFFIX` for the backward kernels) in the same pass, and where the twin is faster the row
    takes the twin's time and band (never below the row's own roofline) and its ``model`` becomes the twin's with
    :data:`FP32_SIMT_SUFFIX`; ``roofline_ms``, ``ood`` and ``ood_reason`` stay the row's own. Before the implicit-GEMM
    memory correction (featurize/conv_gemm.py ``implicit_gemm_conv_ms``), a tf32 3x3 128->4 conv of B = 64 at
    64 x 64 on an A100-80GB came out 1.087 ms against 0.778 in fp32 (audit 57f finding 3); after it the twin binds
    only on GPUs whose TF32 peak is at most 2x their FP32 one (A10, A40, L40S) on large compute-bound convs, where
    the conv surrogate's fp32 time is mostly below its own FP32 roofline (an extrapolation left as it is here)."""
    op = canon["op"].to_numpy() if "op" in canon else np.zeros(0)
    conv = np.flatnonzero(np.isin(op, CONV_KERNELS) & (canon["dtype"].to_numpy() == "tf32")) if len(op) else op
    tw = conv[_tensor_core_conv(canon.iloc[conv], spec)] if len(conv) else np.zeros(0, dtype=np.intp)
    if not len(tw):
        return _predict_routed_rows(canon, spec, bundle)
    n = len(canon)
    out, res = _with_extra_rows(_predict_routed_rows, canon, canon.iloc[tw].assign(dtype="fp32"), spec, bundle)
    twin = np.arange(n, n + len(tw))
    faster = res["pred_latency_ms"][twin] < out["pred_latency_ms"][tw]
    if faster.any():
        at, src = tw[faster], twin[faster]
        roof = np.where(_strided_subset_rows(canon, at), 0.0, np.asarray(out["roofline_ms"], dtype=float)[at])
        for k in ("pred_latency_ms", "pred_low_ms", "pred_high_ms"):
            out[k] = np.array(out[k], dtype=float)
            out[k][at] = np.maximum(res[k][src], roof)
        tcodes, tnames = res["model"]
        out["model"] = _relabelled(out["model"], at, np.asarray(tnames, dtype=object)[tcodes[src]] + FP32_SIMT_SUFFIX)
    return out


def _with_extra_rows(predict, canon: pd.DataFrame, extra: pd.DataFrame, spec: DeviceSpec,
                     bundle: KernelBundle) -> tuple[dict, dict]:
    """(the predictions of ``canon``'s rows, those of ``canon`` followed by ``extra``): ``predict`` run once over both,
    identical rows predicted once (:func:`_distinct_rows`), for a rule comparing a row with a variant of it (a twin in
    another dtype, another filter size, a ladder of channel counts); the extra rows' results start at ``len(canon)``."""
    both = pd.concat([canon, extra], ignore_index=True)
    groups = _distinct_rows(both)
    res = (_take(predict(both.iloc[groups[0]], spec, bundle), groups[1]) if groups is not None
           else predict(both, spec, bundle))
    return _take(res, slice(None, len(canon))), res


def _relabelled(model: tuple, at: np.ndarray, labels) -> tuple:
    """``model`` (the ``model`` column as (codes, names)) with the rows ``at`` labelled ``labels`` (one per row, e.g.
    a row's model name plus the suffix saying how it was costed), new names appended after the old ones."""
    codes, names = model
    codes = codes.copy()
    new_codes, new_names = pd.factorize(np.asarray(labels, dtype=object))
    codes[at] = len(names) + new_codes
    return codes, list(names) + [str(t) for t in new_names]


def _predict_routed_rows(canon: pd.DataFrame, spec: DeviceSpec, bundle: KernelBundle) -> dict[str, np.ndarray]:
    """:func:`_predict_unrouted_rows` with the convolution rows routed to the kernels that cost them
    (:func:`_route_convs`): their ``roofline_ms`` stays their own (the convolution's FLOPs and its tensors' bytes, in
    the row's dtype), their ``model`` says how they were costed (:data:`IMPLICIT_GEMM_SUFFIX`,
    :data:`FP32_SIMT_SUFFIX`, :data:`FORWARD_SHAPE_SUFFIX`, :data:`POINTWISE_GEMM_SUFFIX`)."""
    routed, route = _route_convs(canon, spec)
    out = _predict_unrouted_rows(routed, spec, bundle)
    if route is None:
        return out
    conv = np.flatnonzero(route["conv"])
    own = canon.iloc[conv].assign(op="conv")  # a backward kernel's FLOPs and tensors are its forward's
    out["roofline_ms"] = np.array(out["roofline_ms"], dtype=float)
    gemm_roof_ms = out["roofline_ms"].copy()  # the routed rows' own: an implicit GEMM's, over its unfolded operand
    out["roofline_ms"][conv] = featurize_kernels(own, spec)["t_roof_ms"].to_numpy()
    g = np.flatnonzero(route["gemm"])
    if len(g):  # the GEMM's efficiency on the convolution's own bytes (featurize/conv_gemm.py implicit_gemm_conv_ms)
        dt = canon["dtype"].to_numpy()[g]
        eb = np.array([float(DTYPE_BYTES[d]) for d in dt])
        cin_run, cout_run = (padded_channels(canon[c].to_numpy(dtype=float)[g], eb)
                             for c in ("Input_Channel", "Output_Channel"))
        run = canon.iloc[g].assign(op="conv", Input_Channel=cin_run, Output_Channel=cout_run)
        conv_roof_ms = featurize_kernels(run, spec)["t_roof_ms"].to_numpy()
        # ResNet's 1x1 stride-2 shortcut reads a quarter of its input: floored at its GEMM's roofline if that is lower
        own_ms = out["roofline_ms"][g]
        floor_ms = np.where(_strided_subset_rows(canon, g), np.minimum(own_ms, gemm_roof_ms[g]), own_ms)
        for k in ("pred_latency_ms", "pred_low_ms", "pred_high_ms"):
            out[k] = np.array(out[k], dtype=float)
            out[k][g] = implicit_gemm_conv_ms(out[k][g], gemm_roof_ms[g], conv_roof_ms, floor_ms)
    p = np.flatnonzero(route["sgemm"])
    if len(p):  # the GEMM's own time: it reads and writes the convolution's tensors as they lie (no unfolded operand)
        for k in ("pred_latency_ms", "pred_low_ms", "pred_high_ms"):
            out[k] = np.array(out[k], dtype=float)
            out[k][p] = np.maximum(out[k][p], out["roofline_ms"][p])
    codes, names = out["model"]
    suffix = np.where(route["sgemm"], POINTWISE_GEMM_SUFFIX, np.where(route["gemm"], IMPLICIT_GEMM_SUFFIX,
                      np.where(route["simt"], FP32_SIMT_SUFFIX, np.where(route["bwd"], FORWARD_SHAPE_SUFFIX, ""))))
    at = np.flatnonzero(suffix != "")
    if len(at):
        out["model"] = _relabelled(out["model"], at, np.asarray(names, dtype=object)[codes[at]] + suffix[at])
    return out


def _predict_unrouted_rows(canon: pd.DataFrame, spec: DeviceSpec, bundle: KernelBundle) -> dict[str, np.ndarray]:
    """Predictions for valid canonical rows (:func:`_predict_kernel_rows`), a 16-bit vector row never slower than
    the same kernel in fp32.

    A bf16 / fp16 row of a :data:`HALF_TWIN_FAMILIES` op (norms, softmax, elementwise) moves half the bytes of its
    fp32 twin (same op and shape, dtype fp32) and does the same fp32 arithmetic, so it takes no longer. The learned
    families do not know it: their 16-bit vector rows are Vidur's and LLMCompass's on A100 / A40 alone (AMD's are
    NeuSight's fp32 rows). Before stop 55, 748 of 28,288 (16-bit row, fp32 twin) pairs of Llama/GPT shapes over the
    catalog but the held-out GPUs (rows 2k-64k x hidden 2k-16k; softmax over 1k-8k on 2k-2M rows; bf16 and fp16
    alike) came out slower in 16 bits: LayerNorm up to 1.60x (MI355X 16384 x 2048; MI300X 1.42x), softmax up to 1.31x
    (MI355X; H100 SXM 1.25x on 8192 x 1024), tanh / silu / silu_mul up to 1.27x (MI250), RMSNorm up to 1.10x. Such a
    row is predicted with its twin in the same pass (the twins deduplicated with the batch, as the grid rows are:
    bf16 and fp16 rows share one, an fp32 row of the batch may be it), and where the twin is faster, the row's time,
    band low end and band top become the element-wise minimum of its own and the twin's (the band still holds the
    point; its low end stays the lower of the two) and its ``model`` gains :data:`FP32_TWIN_SUFFIX`; ``roofline_ms``,
    ``ood`` and ``ood_reason`` stay the row's own."""
    half = _half_vector_rows(canon)
    if not len(half):
        return _predict_kernel_rows(canon, spec, bundle)
    n = len(canon)
    # bf16 and fp16 rows share a twin, and the batch may hold it already: deduplicated with the batch
    out, res = _with_extra_rows(_predict_kernel_rows, canon, canon.iloc[half].assign(dtype="fp32"), spec, bundle)
    twin_ms = res["pred_latency_ms"][n:]
    faster = twin_ms < out["pred_latency_ms"][half]
    if faster.any():
        at, tw = half[faster], n + np.flatnonzero(faster)
        for k in ("pred_latency_ms", "pred_low_ms", "pred_high_ms"):
            out[k] = np.array(out[k], dtype=float)
            out[k][at] = np.minimum(out[k][at], res[k][tw])
        codes, names = out["model"]
        out["model"] = _relabelled(out["model"], at, np.asarray(names, dtype=object)[codes[at]] + FP32_TWIN_SUFFIX)
    return out


def _predict_kernel_rows(canon: pd.DataFrame, spec: DeviceSpec, bundle: KernelBundle) -> dict[str, np.ndarray]:
    """Predictions for valid canonical rows: the output columns as arrays aligned with ``canon``.

    A tensor-core ``linear`` row is predicted as the ``bmm`` of its GEMM plus its bias epilogue
    (:func:`_linear_as_gemm`, :func:`_bias_epilogue_ms`; since stop 52), its roofline its own.

    A tensor-core GEMM's contraction ``N`` below one MMA k-tile is predicted at the k-tile (:func:`_pad_contraction`;
    ``roofline_ms`` stays the row's own). A tensor-core linear layer (as below) with a contraction of at most
    :data:`MONOTONE_MAX_N` (LoRA-B's rank, MLA's latent) is held to "a longer contraction never takes less time": its
    time is the same GEMM's predicted (with the small-M guard below) at k-tile x 2**j from the grid point at or below its
    ``N`` up to MONOTONE_MAX_N, made non-decreasing by a running minimum from the top (padding a contraction to a longer
    one is always a valid kernel, so the longer one bounds it), interpolated log-linearly in ``N``. Before, the floor
    and ceiling members' hand-over (0.5-2 GFLOP) and the ceiling member's multiple, learnt on hardly any small
    contraction (the training data's tensor-core GEMMs have N >= 128 but for 2 LLMCompass rows), made a longer
    contraction faster in 473 of 475 (device, dtype, M, K) series over N = 8..512 on H100, B200, GB200, MI300X and
    MI355X (B200 fp8 4096 x 45 x 4096: 23.3 us, 13.8 at 72; now 14.2 at both).

    A tensor-core linear layer (a ``linear`` row, or a single matmul: ``bmm`` with B = 1, as a step graph costs its
    projections) with :data:`MONOTONE_MIN_M` <= ``M`` < :data:`MONOTONE_MAX_M` rows (decode steps, a few tokens per
    expert, short sequences) is bound by reading its weights, and where the floor and ceiling members hand over
    (0.5-2 GFLOP) or the learned multiple wiggles, a larger ``M`` could come out faster (a DeepSeek-V3 step on an L4
    shrank as its batch grew; M = 769 beat 768). Such a row's time is the same GEMM's predicted at the powers of two
    from the one at or below its ``M`` up to MONOTONE_MAX_M, made non-decreasing by a running minimum from the top
    (padding a GEMM's rows to a larger ``M`` is always a valid kernel, so the larger one bounds it), interpolated
    log-linearly in ``M`` between the two around it (the band scaled alike): non-decreasing in ``M`` over the range,
    and at a grid point never above what the members predict for the row itself. Until stop 52 the guard was a running
    maximum from M = 1, which carried a time inflated where the members hand over up the ladder: B200 fp8
    4096 x 4096 x 4096 came out 14.8 us at M = 64 (the ceiling member, extrapolating below the XLA rows' M >= 256)
    and so at M = 128, 256 and 512 too, above bf16 and +60% over the measured 9.2 us at M = 256 (now 9.4; issue 14).
    The grid rows are predicted in the same pass, each distinct one once. FP32 rows (the roofline member, NeuSight's
    data), attention's batched products (B > 1) and larger ``M`` (compute-bound; tile quantisation can still move
    them by 1-4%) are as predicted.

    Batched products (B > 1) are not monotone either: in bf16 a smaller ``M`` comes out more than 2% slower in 88-190 of
    192 (B, N, K) series on A100-SXM4-80GB, H100-SXM5-80GB, MI300X and B200 (decode attention's B = 1024, N = 128,
    K = 1024 on B200: 129 us at M = 1, 63 us at M = 8), and a smaller ``B`` in 5-144 of 300 (M, N, K) series (B200's
    M = 256, N = K = 128: 5.4 us at B = 1, 4.6 at B = 2). They are left unguarded for speed, measured: guarding them
    as linear rows are (every bmm in the selection below) took benchmarks/bench_kernels.py from 0.9-1.2 M to 0.35-0.54
    M rows/s and --distinct from 183 k to 56 k rows/s (every such row needs its own M = 1, 2, 4, ... grid: about 11
    more tensor-core rows, each through the floor and ceiling members)."""
    gemm_view, lin = _linear_as_gemm(canon)
    padded, raised = _pad_contraction(_fold_wide_rows(gemm_view))
    probes, owner, sel, lo_i, w = _n_grid_probes(padded)
    if not len(probes):
        out = _predict_guarded(padded, spec, bundle)
    else:
        n = len(padded)
        rows = pd.concat([padded, probes], ignore_index=True)
        # grid rows repeat one another (a series' share theirs) and the rows themselves (a contraction on the grid)
        groups = _distinct_rows(rows)
        if groups is not None:
            res = _predict_guarded(rows.iloc[groups[0]], spec, bundle)
            res = _take(res, groups[1])
        else:
            res = _predict_guarded(rows, spec, bundle)
        out = _take(res, slice(None, n))
        _apply_grid(out, sel, res["pred_latency_ms"][n:], owner, lo_i, w, suffix_min=True)
    if len(raised):  # the row's own roofline, not the padded kernel's
        out["roofline_ms"] = np.array(out["roofline_ms"], dtype=float)
        out["roofline_ms"][raised] = featurize_kernels(canon.iloc[raised], spec)["t_roof_ms"].to_numpy()
    out.pop(_FLOOR_KEY, None)  # internal: the padded kernel's floor, at or above the row's own
    # the band's low end no faster than the device's measured best achievable matmul (with its slack, never above the
    # prediction): the learned band reached the dense peak itself (a 4096^3 bf16 GEMM on an A100-SXM4-80GB at 1.00 of
    # peak, MI355X 0.96 where MAMF measured 0.68), a speed no one measured (issue 14). Applied last, on the band as the
    # guards left it: clipped before them, a band they scale up (more rows never take less time) rose with its clip,
    # and 19 of Vidur's A100 and 59 of its A40 rows fell below it.
    clip = out.pop(_CLIP_KEY, None)  # the padded kernel's (its MMAs are the padded ones)
    if clip is not None:
        out["pred_low_ms"] = np.maximum(out["pred_low_ms"], np.minimum(clip, out["pred_latency_ms"]))
    if len(lin):  # the GEMM's time (its band as clipped) plus the bias epilogue's (:func:`_bias_epilogue_ms`)
        X = featurize_kernels(canon.iloc[lin], spec)
        epilogue_ms = _bias_epilogue_ms(canon.iloc[lin], X)
        out["roofline_ms"] = np.array(out["roofline_ms"], dtype=float)
        out["roofline_ms"][lin] = X["t_roof_ms"].to_numpy()  # the row's own
        for k in ("pred_latency_ms", "pred_low_ms", "pred_high_ms"):
            out[k] = np.array(out[k], dtype=float)
            out[k][lin] += epilogue_ms
    return out


def _linear_as_gemm(canon: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """(``canon`` with every tensor-core ``linear`` row (any dtype but FP32) as the single matmul of the same GEMM:
    ``bmm`` with B = 1 and ``B x M`` rows (``nn.Linear`` shares its weights over the batch), the positions of those
    rows). :func:`_predict_rows` predicts them as that GEMM and adds the bias epilogue's work at the roofline (its
    ``K`` bias elements read, ``B x M x K`` adds): cuBLASLt's fused bias epilogue (``CUBLASLT_EPILOGUE_BIAS`` in
    PyTorch's ``at::cuda::blas::gemm_and_bias``, aten/src/ATen/cuda/CUDABlas.cpp, which ``addmm_out_cuda_impl`` in
    aten/src/ATen/native/cuda/Blas.cpp calls for ``nn.Linear``'s 1-D bias).

    The members' ``is_linear`` feature is no physics of the kernel: the only tensor-core ``linear`` rows of the
    training data are Vidur's (A100-SXM4-80GB and A40 fp16, torch.profiler record_function times of Sarathi's
    layers), every other tensor-core GEMM is a ``bmm``/dot (XLA, DeepBench, LLMCompass), so the feature carries
    Vidur against the others, and on a GPU Vidur never measured it moved a linear off its own GEMM: on B200 every
    B = 1 XLA shape >= 1 GFLOP came out +6.3% (bf16) / +7.4% (fp8) slower as ``linear`` than as ``bmm`` on average,
    up to +27% (issue 14). FP32 ``linear`` rows (NeuSight's, the held-out figures) keep their own prediction, as
    the same single GEMM too: a ``B`` > 1 FP32 row has its ``B x M`` rows in ``M`` (every FP32 linear row of the data
    has B = 1; until stop 54 a Tesla-T4 2048 x 4096 x 4096 linear read 19.0 ms as B = 1, M = 2048 and 1,047.6 ms as
    B = 2048, M = 1, its band to 86 s)."""
    if not len(canon) or "M" not in canon:
        return canon, np.zeros(0, dtype=np.intp)
    is_lin = canon["op"].to_numpy() == "linear"
    fp32 = canon["dtype"].to_numpy() == "fp32"
    if "B" in canon and (is_lin & fp32).any():
        b = canon["B"].to_numpy(dtype=float)
        batched = np.flatnonzero(is_lin & fp32 & (b != 1))
        if len(batched):
            canon = canon.copy()
            m = canon["M"].to_numpy(dtype=float, copy=True)
            b = b.copy()
            m[batched] *= b[batched]
            b[batched] = 1.0
            canon["B"], canon["M"] = b, m
    lin = np.flatnonzero(is_lin & ~fp32)
    if not len(lin):
        return canon, lin
    out = canon.copy()
    op = out["op"].to_numpy(dtype=object, copy=True)
    op[lin] = "bmm"
    out["op"] = op
    if "B" in out:
        b = out["B"].to_numpy(dtype=float, copy=True)
        m = out["M"].to_numpy(dtype=float, copy=True)
        m[lin] *= b[lin]
        b[lin] = 1.0
        out["B"], out["M"] = b, m
    return out, lin


def _bias_epilogue_ms(rows: pd.DataFrame, X: pd.DataFrame) -> np.ndarray:
    """Per ``linear`` row (``X``: its features): the bias epilogue's own roofline, ms: its ``B x M x K`` adds at the
    dtype's matrix rate or its ``K`` bias elements read at DRAM bandwidth, whichever is longer (the rates are the row's
    own: its FLOPs over its compute time, its bytes over its memory time). Non-decreasing in ``M`` and independent of
    the contraction ``N``, so the guards' monotonicity carries over to the linear row."""
    b = rows["B"].to_numpy(dtype=float) if "B" in rows else np.ones(len(rows))
    m, k = rows["M"].to_numpy(dtype=float), rows["K"].to_numpy(dtype=float)
    codes, names = pd.factorize(rows["dtype"].to_numpy())
    ebytes = np.array([float(DTYPE_BYTES[d]) for d in names])[codes]
    flops_per_ms = X["flops"].to_numpy() / X["t_compute_ms"].to_numpy()
    bytes_per_ms = X["bytes"].to_numpy() / X["t_mem_ms"].to_numpy()
    return np.maximum(b * m * k / flops_per_ms, k * ebytes / bytes_per_ms)


def _take(res: dict, idx) -> dict:
    """``res``'s per-row arrays at ``idx`` (an index array or a slice); a ``(array, meta)`` entry keeps its meta."""
    return {k: ((v[0][idx], v[1]) if isinstance(v, tuple) else v[idx]) for k, v in res.items()}


def _predict_guarded(canon: pd.DataFrame, spec: DeviceSpec, bundle: KernelBundle) -> dict[str, np.ndarray]:
    """:func:`_predict_rows` on rows whose contraction is already padded: the small-M guard."""
    probes, owner, sel, lo_i, w = _m_grid_probes(canon)
    if not len(probes):
        X = featurize_kernels(canon, spec)
        return _predict_features(X, bundle, canon["dtype"], power_floor_ms=_power_floor_ms(X, canon["dtype"], spec),
                                 device=spec)
    n = len(canon)
    groups = _distinct_rows(probes)  # grid rows repeat one another (a model's projections share N and K)
    if groups is not None:
        probes, take = probes.iloc[groups[0]], groups[1]
    else:
        take = np.arange(len(probes))
    rows = pd.concat([canon, probes], ignore_index=True)
    X = featurize_kernels(rows, spec)
    res = _predict_features(X, bundle, rows["dtype"], power_floor_ms=_power_floor_ms(X, rows["dtype"], spec),
                            device=spec)
    out = _take(res, slice(None, n))
    _apply_grid(out, sel, res["pred_latency_ms"][n:][take], owner, lo_i, w, suffix_min=True)
    return out


def _apply_grid(out: dict[str, np.ndarray], sel: np.ndarray, grid_ms: np.ndarray, owner: np.ndarray,
                lo_i: np.ndarray, w: np.ndarray, suffix_min: bool) -> None:
    """Replace (in ``out``, scaling the band alike) the predicted time of the guarded rows ``sel`` by their grid's:
    ``grid_ms`` holds each row's grid predictions (contiguous segments per ``owner``, ascending in the guarded
    dimension), made non-decreasing within each segment -- a running maximum from below, or with ``suffix_min`` a
    running minimum from above -- then interpolated log-linearly between the grid point ``lo_i`` and the next with
    weight ``w``. A row's result depends on its own segment only (bit for bit, whatever else is in the batch)."""
    g, start = _segment_monotone(np.log(np.maximum(grid_ms, 1e-30)), owner, suffix_min)
    # the grid point above ``lo_i``, within its own segment (w = 0 at a segment's top: the point itself)
    end = np.append(start, len(g))[np.searchsorted(start, lo_i, side="right")] - 1
    t_new = np.exp((1.0 - w) * g[lo_i] + w * g[np.minimum(lo_i + 1, end)])
    t = out["pred_latency_ms"]
    f = np.ones(len(t))
    f[sel] = t_new / np.where(t[sel] > 0, t[sel], 1.0)
    for k in ("pred_latency_ms", "pred_low_ms", "pred_high_ms"):
        out[k] = out[k] * f
    if _FLOOR_KEY in out:  # an interpolated time, as any other, at or above the row's own physical floor
        for k in ("pred_latency_ms", "pred_low_ms"):
            out[k] = np.maximum(out[k], out[_FLOOR_KEY])
        out["pred_high_ms"] = np.maximum(out["pred_high_ms"], out["pred_latency_ms"])


def _segment_monotone(g: np.ndarray, owner: np.ndarray, suffix_min: bool) -> tuple[np.ndarray, np.ndarray]:
    """(``g`` made non-decreasing within each run of equal ``owner`` -- a running maximum from the run's start, or
    with ``suffix_min`` a running minimum from its end --, the index of each run's first element).

    The runs are the columns of a (longest run) x (runs) matrix padded with -inf (+inf), swept row by row (a grid has
    at most 13 points: M = 1 .. 4096): only comparisons, so each run's values are its own, exactly. Offsetting each run
    by its position in the batch and running one accumulate over all, as before, rounded: a guarded row's time moved
    by up to 2e-13 (relative) with the other rows of its batch and their order."""
    n = len(g)
    brk = np.empty(n, dtype=bool)
    brk[:1] = True
    np.not_equal(owner[1:], owner[:-1], out=brk[1:])
    start = np.flatnonzero(brk)
    runs = len(start)
    length = np.diff(start, append=n)
    # element i of run r sits at (i - start[r], r)
    flat = np.arange(0, n * runs, runs) + np.repeat(np.arange(runs) - start * runs, length)
    grid = np.full((int(length.max(initial=0)), runs), np.inf if suffix_min else -np.inf)
    grid.ravel()[flat] = g
    if suffix_min:
        for k in range(len(grid) - 2, -1, -1):
            np.minimum(grid[k], grid[k + 1], out=grid[k])
    else:
        for k in range(1, len(grid)):
            np.maximum(grid[k], grid[k - 1], out=grid[k])
    return grid.ravel()[flat], start


def _no_probes(canon: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What :func:`_m_grid_probes` / :func:`_n_grid_probes` return when no row is guarded."""
    return (canon.iloc[:0], np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp),
            np.zeros(0))


def _linear_layer_rows(canon: pd.DataFrame) -> np.ndarray:
    """Per row: a linear layer, i.e. a ``linear`` row or a single matmul (``bmm`` with B = 1) a step graph costs it as."""
    op = canon["op"].to_numpy()
    b = canon["B"].to_numpy(dtype=float) if "B" in canon else np.ones(len(canon))
    return (op == "linear") | ((op == "bmm") & (b == 1))


def _log2_grid(canon: pd.DataFrame, sel: np.ndarray, start, steps: np.ndarray
               ) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    """Each row ``sel[i]`` of ``canon`` repeated ``steps[i]`` times, contiguously and in order: (the repeated rows, the
    canonical row each is, the index of each row's first repeat, the log2 exponent of each repeat: ``start[i]``
    (scalar or per selected row), ``start[i] + 1``, ...). The caller sets the guarded column from the exponents."""
    first = np.cumsum(steps) - steps
    owner = np.repeat(sel, steps)
    k = np.arange(len(owner)) - np.repeat(first, steps)
    exp = (start if np.ndim(start) == 0 else np.repeat(start, steps)) + k
    return canon.iloc[owner].copy(), owner, first, exp


def _m_grid_probes(canon: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(grid rows, the canonical row each belongs to, the guarded rows, per guarded row the index of its grid point at
    or below its ``M`` and the log2 weight of the one above): for every tensor-core linear-layer row (see
    :func:`_predict_rows`) with MONOTONE_MIN_M <= ``M`` < MONOTONE_MAX_M, the same row at each power of two from the
    one at or below ``M`` up to MONOTONE_MAX_M, ascending."""
    if "M" not in canon:
        return _no_probes(canon)
    m = canon["M"].to_numpy(dtype=float)
    # (a row at MONOTONE_MAX_M is its own grid: nothing to guard)
    sel = np.flatnonzero((m >= MONOTONE_MIN_M) & (m < MONOTONE_MAX_M) & _linear_layer_rows(canon)
                         & (canon["dtype"].to_numpy() != "fp32"))
    if not len(sel):
        return _no_probes(canon)
    lm = np.log2(m[sel])
    lo = np.floor(lm + 1e-12)
    top = np.log2(MONOTONE_MAX_M)
    probes, owner, first, exp = _log2_grid(canon, sel, lo, (top - lo + 1).astype(int))
    probes["M"] = np.exp2(exp)
    return probes, owner, sel, first.astype(np.intp), np.clip(lm - lo, 0.0, 1.0)


def _n_grid_probes(canon: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(grid rows, the canonical row each belongs to, the guarded rows, per guarded row the index of its grid point at
    or below its ``N`` and the log2 weight of the one above): for every tensor-core linear-layer row (as the small-M
    guard selects them, :func:`_m_grid_probes`) whose contraction ``N`` (already padded to one k-tile,
    :func:`_pad_contraction`) is at most MONOTONE_MAX_N, the same row at each k-tile x 2**j from the one at or below
    ``N`` up to MONOTONE_MAX_N, ascending."""
    if "N" not in canon or not len(canon):
        return _no_probes(canon)
    nv = canon["N"].to_numpy(dtype=float)
    tile = _k_tile_elems(canon["dtype"].to_numpy())
    # (a row at MONOTONE_MAX_N is its own grid: nothing to guard)
    sel = np.flatnonzero((tile > 0) & (nv < MONOTONE_MAX_N) & _linear_layer_rows(canon))
    if not len(sel):
        return _no_probes(canon)
    ln = np.log2(nv[sel] / tile[sel])  # >= 0: padded to one k-tile
    lo = np.floor(ln + 1e-12)
    top = np.floor(np.log2(MONOTONE_MAX_N / tile[sel]) + 1e-12)
    probes, owner, first, exp = _log2_grid(canon, sel, lo, (top - lo + 1).astype(int))
    probes["N"] = tile[owner] * np.exp2(exp)
    return probes, owner, sel, first.astype(np.intp), np.clip(ln - lo, 0.0, 1.0)


def _power_floor_ms(X: pd.DataFrame, dtype, spec: DeviceSpec) -> np.ndarray | None:
    """The power-limited time of FP32 GEMMs on a board whose TDP cannot feed its FP32 lanes at boost clock
    (:mod:`wattcast.models.power_derating`); None when the device is not power-limited."""
    frac = spec_fp32_fraction(spec)
    if frac >= 1.0:
        return None
    fp32_gemm = (X["family"].to_numpy() == "gemm") & (np.asarray(dtype, dtype=object) == "fp32")
    if not fp32_gemm.any():
        return None
    return np.where(fp32_gemm, fp32_gemm_floor_ms(X["flops"].to_numpy(), spec.peak_fp32_tflops, frac), 0.0)


#: families whose device descriptors depend on the dtype class (tensor-core vs vector peak: the matmul families, see
#: ``featurize.kernel_features``); only they are checked against their dtype class's device support. Every other
#: family's kernels run on the vector units whatever their dtype, so its descriptors are the same for a bf16 and an
#: fp32 kernel and the family's support (every dtype, widened by what leave-one-generation-out covered) applies.
DTYPE_CLASS_FAMILIES = frozenset({"gemm", "conv"})
#: ood_reason from (shape_ood, device_ood): code = shape_ood + 2 x device_ood
_OOD_REASONS = ["", "shape", "device", "shape+device"]


def _ceiling_device(device: DeviceSpec) -> str:
    """The name the bundle's measured matmul ceilings (MAMF's, keyed by catalog name) are looked up under for
    ``device``: the catalog device its figures are (:func:`wattcast.data.catalog_match.catalog_twin`: its own name's
    entry when the figures match, or the entry whose figures it repeats under another name), else '' (no device's
    own ceiling: its vendor's median). A name alone is not the hardware: a copy of the MI300X entry named "MyMI300X"
    keeps MI300X's ceiling, another GPU's figures named "MI300X" do not get it."""
    twin = catalog_twin(device)
    return "" if twin is None else twin.name


def _ceiling_name(device: DeviceSpec, cm: dict) -> str:
    """The name ``device``'s matmul ceiling is read under in a bundle's ceiling member ``cm``: the device's own
    (:func:`_ceiling_device`) where the member lists it, else the listed device with the same compute silicon
    (:func:`~wattcast.data.catalog_match.compute_twin`: an A100 SXM4 40 GB takes the 80 GB's measured ceiling, a V100
    SXM2 32 GB the 16 GB's: the same tensor cores at the same clock and power; until stop 41 only fused attention
    looked the twin up and the GEMMs of an A100 SXM4 40 GB ran at NVIDIA's median ceiling, 0.804 of peak where its
    chip measures 0.869), else the own name (its vendor's median; :func:`_device_ceilings` bounds it by the same
    silicon's measurements at other power limits)."""
    dev = _ceiling_device(device)
    if dev not in cm["ceilings"]:
        dev = compute_twin(device, cm["ceilings"]) or dev
    return dev


def _device_ceilings(device: DeviceSpec, cm: dict, dtypes) -> np.ndarray:
    """Per row of ``dtypes``: ``device``'s matmul ceiling (:func:`~wattcast.models.gemm_floor.row_ceilings` under
    :func:`_ceiling_name`) and, for a device with no measured ceiling of its own, that ceiling held between what the
    same silicon measured at other power limits (:func:`~wattcast.data.catalog_match.power_siblings`): at least the
    best of those at a limit no higher (it can be capped to theirs), at most the least of those at a limit no lower.
    Until stop 58 a B200 spec at 1,500 W took its die's median (0.752 of the bf16 peak for B200's measured 0.776)
    and ran every large GEMM 3% slower than at 1,000 W (audit 57g); the held-out A100 80GB PCIe (300 W) keeps its
    vendor's median (0.864), above the 250 W A100 PCIe 40GB's 0.811."""
    name = _ceiling_name(device, cm)
    c = row_ceilings(name, device.vendor, dtypes, cm, arch=device.arch)
    if name in cm["ceilings"]:
        return c
    lower, upper = power_siblings(device, cm["ceilings"])
    if not lower and not upper:
        return c
    dts = np.asarray(dtypes, dtype=object).astype(str)

    def measured(sib: str) -> np.ndarray:  # the sibling's own ceilings (its 16-bit twin's too), NaN where it has none
        return np.array([own_dtype_ceiling(cm["ceilings"][sib], d, np.nan) for d in dts], dtype=float)

    for sib in lower:
        c = np.fmax(c, measured(sib))
    for sib in upper:
        c = np.fmin(c, measured(sib))
    return c


#: the slack over a device's measured matmul ceiling the band's low end is clipped at (:func:`_ceiling_clip_ms`): the
#: largest excess of a measured training GEMM over its device's own ceiling, rounded up. The ceilings are not maxima:
#: LLMCompass's A100 rows reach 0.939 of the dense peak where MAMF's best achievable is 0.869 (x 1.081, 7 of its 20
#: rows above), Vidur's A40 rows 0.901 where its ceiling is their 99th percentile, 0.833 (x 1.082, 240 of 21,924
#: rows above); B200 tf32 x 1.035, MI300X fp8 x 1.030, every other device and dtype x 1.004 or less (stop 51,
#: every tensor-core GEMM row of the kernel sources with the extra XLA table of MI300X, held-out GPUs left out). With it no
#: such row lies below the clip (0 of 62,088); at the ceiling itself 263 would.
CEILING_CLIP_SLACK = 1.09


def _ceiling_clip_ms(fm, X: pd.DataFrame, rows: np.ndarray | None, tensor: np.ndarray, dt_codes: np.ndarray,
                     dt_names: list[str], device: DeviceSpec | None) -> np.ndarray | None:
    """Per row of a GEMM family's ``rows`` of ``X``: the time of its matrix work at :data:`CEILING_CLIP_SLACK` x the
    device's own measured matmul ceiling (capped at the dense peak), the least the band's low end may be; 0 where the
    device has none (None for all rows: no ceiling member, no device or no ceiling of the device's own).

    "Own" is a measurement of that chip: the MAMF table's best achievable matmul (a brute-force torch.mm shape search,
    ``tensorcore/SOURCE-mlengineering_mamf.md``) or a training device's 99th percentile of measured efficiency, read
    under :func:`_ceiling_name` (a compute-silicon twin included), in the row's dtype or its 16-bit twin (as
    :func:`~wattcast.models.gemm_floor.row_ceilings`). A device that takes its vendor's median or the default ceiling
    is not clipped: that figure is no measurement of the GPU, and the fastest any GPU of the vendor was measured at
    leaves nothing to clip on NVIDIA (V100 0.919 x the slack is over the peak; LLMCompass's A100 reaches 0.939) and
    would hold a new AMD part to 0.76 of its peak (MI300X fp8 0.694 x the slack), where MI355X's mixed-format fp8
    XLA kernels reach 0.90 of it (benchmarks/leave_one_generation_out.py)."""
    cm = fm.ceiling_member
    if not cm or device is None or not tensor.any():
        return None
    own = cm["ceilings"].get(_ceiling_name(device, cm))
    if not own:
        return None
    per_dtype = np.array([own_dtype_ceiling(own, d, np.nan) for d in dt_names], dtype=float)
    c = per_dtype[dt_codes if rows is None else dt_codes[rows]]
    ok = tensor & np.isfinite(c)
    if not ok.any():
        return None
    idx = slice(None) if rows is None else rows
    t_compute = X["t_compute_ms"].to_numpy()[idx]
    return np.where(ok, t_compute / np.minimum(np.where(ok, c, 1.0) * CEILING_CLIP_SLACK, 1.0), 0.0)


def attention_mma_scale(device: DeviceSpec, dtypes, bundle: KernelBundle, reference: str) -> np.ndarray:
    """Per row of ``dtypes``: ``device``'s achievable-matmul ceiling over the ``reference`` device's, from the
    bundle's GEMM ceiling member (:func:`row_ceilings`: the MAMF table's best achievable matmul over the peak where it
    lists the device, a training device's own, else the median of its die's or its generation's listed devices, else the
    vendor's median, else the default), what a fused attention
    kernel calibrated on ``reference`` scales its tensor-core efficiency by (models/attention.py). The device is looked
    up as the GEMM family looks it up (:func:`_ceiling_name`, its compute-silicon twin included: an A100 SXM4 40 GB
    is the reference's own chip). All ones without a GEMM ceiling member (older bundles)."""
    names, codes = np.unique(np.asarray(dtypes, dtype=object).astype(str), return_inverse=True)
    fm = bundle.families.get("gemm")
    cm = fm.ceiling_member if fm is not None else None
    if not cm:
        return np.ones(len(codes))
    from wattcast.data.catalog import load_catalog

    ref = load_catalog()[reference]
    own = _device_ceilings(device, cm, names)
    base = row_ceilings(reference, ref.vendor, names, cm, arch=ref.arch)
    return (own / base)[codes.reshape(-1)]


def _floor_blend(fm, X: pd.DataFrame, A: np.ndarray, rows: np.ndarray | None, p: np.ndarray,
                 t_roof_ms: np.ndarray, dtype_names: np.ndarray, device: DeviceSpec | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the family's log ratios ``p`` with its small tensor-core GEMMs blended with the floor member and, for a
    ``device`` whose vendor the ceiling member covers, the roofline member's part taken by the ceiling member
    (:mod:`wattcast.models.gemm_floor`), the positions in ``p`` of the rows the floor member weighed in on, those the
    ceiling member did); each member runs only on the rows it weighs in. ``dtype_names``: the rows' dtypes."""
    idx = slice(None) if rows is None else rows
    lo, hi = fm.floor_blend["gflop"]
    w = blend_weight(X["flops"].to_numpy(dtype=float)[idx] / 1e9, lo, hi)
    tensor = X["is_tensor_dtype"].to_numpy()[idx] > 0.5
    out = np.array(p, dtype=np.float64, copy=True)
    ceil_sel = np.zeros(0, dtype=np.intp)
    cm = fm.ceiling_member
    model = ceiling_model(fm.ceiling_lgbm, device.vendor) if cm and device is not None else None
    if model is not None:
        ceil_sel = np.flatnonzero(tensor & (w > 0.0))
        if len(ceil_sel):
            if model.features == fm.features:
                pc = predict_distinct(model.predict_matrix, np.ascontiguousarray(A[ceil_sel, : len(fm.features)]))
            else:  # a member reading features of its own (the manifest entry's ``features``), in its order
                cols = [fm.features.index(f) for f in model.features]
                pc = predict_distinct(model.predict_matrix, np.ascontiguousarray(A[np.ix_(ceil_sel, cols)]))
            c = _device_ceilings(device, cm, dtype_names[ceil_sel])
            out[ceil_sel] = ceiling_log_ratio(pc, t_roof_ms[ceil_sel], cm["floor_ms"], c)
    sel = np.flatnonzero(tensor & (w < 1.0))
    if not len(sel):
        return out, sel, ceil_sel
    p_floor = predict_distinct(fm.floor_lgbm.predict_matrix, np.ascontiguousarray(A[sel, : len(fm.features)]))
    out[sel] = blended_log_ratio(out[sel], p_floor, t_roof_ms[sel], fm.floor_blend["floors_ms"][fm.floor_blend["source"]],
                                 w[sel])
    return out, sel, ceil_sel


def _descriptor_text(f: str, v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Per row of values ``v`` of device descriptor ``f`` (outside [``lo``, ``hi``]): "bw_gbps 1.79e+03 below the
    covered 1.94e+03 to 8e+03" (a ``dev_log_`` descriptor shown as its value, not its log)."""
    name, conv = (f[len("dev_log_"):], np.exp) if f.startswith("dev_log_") else (f[len("dev_"):] if f.startswith("dev_") else f, lambda x: x)
    lo_v, hi_v = float(conv(lo)), float(conv(hi))
    codes, uniq = pd.factorize(pd.Series(v))
    text = np.array([f"{name} {float(conv(u)):.3g} {'below' if u < lo else 'above'} the covered {lo_v:.3g} to "
                     f"{hi_v:.3g}" for u in uniq], dtype=object)
    return text[codes] if len(uniq) else np.full(len(v), "", dtype=object)


def _device_ood_detail(fm, A: np.ndarray, cols: list[str], X: pd.DataFrame, rows, matmul: bool,
                       dev_ood: np.ndarray, dtype_checks=()) -> np.ndarray:
    """Per row of a family's rows: the device descriptors its check looks at (``fm.checked_descriptors``) beyond the range
    leave-one-generation-out covered (the family's pooled support, and for matmul families its dtype class's, each
    widened as the OOD check widens it),
    "; "-joined ("" where none), for ``ood_reason`` to say which descriptor made a row device-OOD."""
    n = len(A)
    out = np.full(n, "", dtype=object)
    where = {c: j for j, c in enumerate(cols)}
    found: dict[str, tuple[np.ndarray, np.ndarray, float, float]] = {}
    for i, f in enumerate(fm._sup_names):
        if not fm._sup_dev[i] or fm._sup_skip[i] or f not in where:
            continue
        v = A[:, where[f]]
        bad = dev_ood & ((v < fm._sup_lo[i]) | (v > fm._sup_hi[i]))
        if bad.any():
            found[f] = (bad, v, float(fm._sup_lo[i]), float(fm._sup_hi[i]))
    for cls, f, bad, v, lo, hi in ([*fm.dtype_class_support_checks(X, rows), *dtype_checks] if matmul else ()):
        bad = dev_ood & bad
        for k, hit in found.items():  # a row an earlier range already names this descriptor for: named once
            if k.split("#")[0] == f:
                bad &= ~hit[0]
        if bad.any():
            found[f"{f}#{cls}"] = (bad, v, lo, hi)
    if not found:
        return out
    # one text per distinct combination of (descriptor out, its value): a row's key in mixed radix, texts joined once
    key = np.zeros(n, dtype=np.int64)
    parts = []
    for f, (bad, v, lo, hi) in found.items():
        codes, uniq = pd.factorize(pd.Series(np.where(bad, v, np.nan)))  # NaN (not out) -> -1
        parts.append((len(uniq) + 1, _descriptor_text(f.split("#")[0], np.asarray(uniq, dtype=float), lo, hi)))
        key = key * (len(uniq) + 1) + (codes + 1)
    kcodes, kuniq = pd.factorize(key)
    texts = []
    for k in kuniq:
        got = []
        for radix, text in reversed(parts):
            c = int(k % radix)
            k //= radix
            if c:
                got.append(text[c - 1])
        texts.append("; ".join(reversed(got)))
    return np.asarray(texts, dtype=object)[kcodes]


def _predict_features(X: pd.DataFrame, bundle: KernelBundle, dtype, power_floor_ms: np.ndarray | None = None,
                      device: DeviceSpec | None = None) -> dict[str, object]:
    """The output columns for the featurised rows ``X`` (per-family surrogates + OOD check): arrays, and
    for the text columns ``model``/``ood_reason`` (codes, distinct strings). ``dtype`` (the rows' canonical
    dtype names) picks each row's latency floor; ``power_floor_ms`` (per row, 0 where none) is the power-limited
    time no prediction goes below (:func:`_power_floor_ms`); ``device`` (the rows' GPU) picks the GEMM ceiling
    member's vendor model and matmul ceiling (without it, the roofline member predicts)."""
    fam = X["family"].to_numpy()
    t_roof = X["t_roof_ms"].to_numpy()
    n = len(X)
    lr = np.zeros(n)
    lo = np.zeros(n)
    hi = np.zeros(n)
    clip_ms = np.zeros(n)
    o = np.zeros(n, dtype=bool)
    model_codes, model_names = np.zeros(n, dtype=np.intp), [""]
    why_codes, why_names = np.zeros(n, dtype=np.intp), list(_OOD_REASONS)

    def code(names: list[str], name: str) -> int:
        if name not in names:
            names.append(name)
        return names.index(name)

    dt_codes, dt_names = pd.factorize(np.asarray(dtype, dtype=object))
    dt_names = [str(d) for d in dt_names]
    families = pd.unique(fam)
    for f in families:
        rows = None if len(families) == 1 else np.flatnonzero(fam == f)
        m = slice(None) if rows is None else rows
        fm = bundle.families.get(f)
        if fm is None:
            lr[m], lo[m], hi[m] = 0.0, -np.log(2.0), np.log(2.0)
            o[m] = True
            model_codes[m] = code(model_names, "roofline-fallback")
            why_codes[m] = code(why_names, f"no surrogate for family {f!r}")
            continue
        cols = _family_columns(fm, X)
        A = _family_matrix(X, cols, rows)
        p, spread = fm.predict_log_ratio_matrix(A[:, : len(fm.features)])
        blended, ceiled = None, None
        if fm.floor_lgbm is not None and fm.floor_blend:
            dt_m = np.asarray(dt_names, dtype=object)[dt_codes[m]]
            p, blended, ceiled = _floor_blend(fm, X, A, rows, p, t_roof[m], dt_m, device)
        matmul = f in DTYPE_CLASS_FAMILIES
        shape_ood, dev_ood = fm.ood_mask_matrix(A, cols)
        dchecks = []  # a tensor-core row against the GPUs that measured its dtype (models/coverage.py, stop 58)
        if matmul:
            dev_ood |= fm.dtype_class_device_ood(X, rows)
            dchecks = dtype_support_checks(dtype_coverage_for(bundle), f, X, rows,
                                           np.asarray(dt_names, dtype=object)[dt_codes[m]], fm.checked_descriptors)
            for check in dchecks:
                dev_ood |= check[2]
        oo = shape_ood | dev_ood
        # a shape beyond training: the flat factor; a device beyond coverage: widened by its distance beyond it
        # (models/coverage.py, stop 58: continuous at the coverage edge, growing with the extrapolation up to the cap)
        widen = np.where(shape_ood, OOD_BAND_FACTOR, 1.0)
        ext_lo, ext_hi = device_excess_log(fm, A, cols, X, rows, matmul, dchecks) if dev_ood.any() else (0.0, 0.0)
        tensor_m = X["is_tensor_dtype"].to_numpy()[m] > 0.5 if "is_tensor_dtype" in X else np.zeros(len(p), dtype=bool)
        band = fm.band_log_rows(tensor_m)
        # the distance's widening is capped at the flat factor's (models/coverage.py's docstring: the folds show no
        # error growing with extrapolation, so beyond that the assumption would outrun every measurement)
        ext_lo = np.minimum(ext_lo, (OOD_BAND_FACTOR - 1.0) * np.abs(band[0]))
        ext_hi = np.minimum(ext_hi, (OOD_BAND_FACTOR - 1.0) * np.abs(band[1]))
        lo_m = p + band[0] * widen - spread - ext_lo
        if f == "gemm":  # the least the band's low end may be, applied once the guards have moved the row (_predict_rows)
            # (not the bytes at the datasheet bandwidth: operands a GEMM finds in the L2 beat it, as 5 of the held-out
            # L4's 2,092 bmm rows do with its 48 MB L2; the physical floor counts the bytes beyond the cache)
            clip = _ceiling_clip_ms(fm, X, rows, tensor_m, dt_codes, dt_names, device)
            if clip is not None:
                clip_ms[m] = clip
        if fm.latency_floor_ms > 0:
            # never faster than the fastest kernel of this family ever measured in the row's dtype (launch
            # overhead): the learned ratio does not extrapolate to one-element tensors
            floor_ms = fm.floor_ms(dt_names)[dt_codes[m]]
            floor = np.log(floor_ms / t_roof[m])
            p = np.maximum(p, floor)
            lo_m = np.maximum(lo_m, floor)
        if power_floor_ms is not None:
            pf = power_floor_ms[m]
            capped = pf > 0
            if capped.any():
                # a power-limited board: the GEMM runs no faster than the FP32 rate its TDP sustains; the band moves
                # with the prediction (the learned band is about the trees' error around what they predict)
                lim = np.log(np.where(capped, pf, 1.0) / t_roof[m])
                shift = np.where(capped, np.maximum(lim - p, 0.0), 0.0)
                p = p + shift
                lo_m = lo_m + shift
        lr[m] = p
        lo[m] = lo_m
        hi[m] = p + band[1] * widen + spread + ext_hi
        o[m] = oo
        model_codes[m] = code(model_names, fm.choice if fm.choice != RooflineSurrogate.name else "roofline-fallback")
        if ceiled is not None and len(ceiled):
            # rows the ceiling member predicted (models/gemm_floor.py) say so, and which of the two members weighed in
            model_codes[ceiled if rows is None else rows[ceiled]] = code(model_names, "ceiling")
        if blended is not None and len(blended):
            # rows the floor member weighed in on (models/gemm_floor.py) say so
            both = np.intersect1d(blended, ceiled) if ceiled is not None and len(ceiled) else np.zeros(0, dtype=np.intp)
            only = np.setdiff1d(blended, both)
            model_codes[only if rows is None else rows[only]] = code(model_names, f"{fm.choice}+floor")
            if len(both):
                model_codes[both if rows is None else rows[both]] = code(model_names, "ceiling+floor")
        why_codes[m] = shape_ood + 2 * dev_ood.astype(np.intp)
        if dev_ood.any():  # name the device descriptor(s) beyond the covered range after the leading "device"
            detail = _device_ood_detail(fm, A, cols, X, rows, matmul, dev_ood, dchecks)
            at = np.flatnonzero(detail != "")
            if len(at):
                base = np.asarray(why_names, dtype=object)[why_codes[m][at]]
                full = base + " (" + detail[at] + ")"
                dcodes, duniq = pd.factorize(full)
                idx = at if rows is None else rows[at]
                why_codes[idx] = len(why_names) + dcodes
                why_names.extend(str(u) for u in duniq)
    floor_ms = X["t_floor_ms"].to_numpy() if "t_floor_ms" in X else np.zeros(n)
    lr, lo = _at_physical_floor(lr, lo, floor_ms, t_roof)
    return {
        "pred_latency_ms": t_roof * np.exp(lr),
        "pred_low_ms": t_roof * np.exp(np.minimum(lo, lr)),
        "pred_high_ms": t_roof * np.exp(np.maximum(hi, lr)),
        "ood": o,
        "roofline_ms": t_roof,
        "model": (model_codes, model_names),
        "ood_reason": (why_codes, why_names),
        _FLOOR_KEY: floor_ms,
        _CLIP_KEY: clip_ms,
    }


def _at_physical_floor(lr: np.ndarray, lo: np.ndarray, floor_ms: np.ndarray, t_roof_ms: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """The log ratios to the roofline of the prediction ``lr`` and the band's low end ``lo``, neither below the
    kernel's physical floor (``featurize.kernel_features.physical_floor_ms``: its GEMM work at the dense peak, or
    the traffic that cannot stay in the last-level cache at DRAM bandwidth). The learned band's width is about the
    trees' error and says nothing of physics: before, the low end sat under the floor on 119-228 of 425 rows a device
    of a user's grid (an A100-SXM4-80GB fp32 16384 x 1024 x 4096 linear 2.74 ms against 7.06 ms of FP32 work). No
    measured row of the training sources lies below it (0 of 446,251)."""
    with np.errstate(divide="ignore"):
        fl = np.log(np.where(floor_ms > 0, floor_ms, 0.0) / t_roof_ms)
    return np.maximum(lr, fl), np.maximum(lo, fl)


def _given_dtypes(frame: pd.DataFrame) -> np.ndarray:
    """Each row's dtype as the frame gives it, canonical (a blank cell or no column: fp32), before
    :data:`VECTOR_DTYPE_OF` maps a vector row's."""
    from wattcast.data.kernel_ops import canonical_dtype

    if "dtype" not in frame.columns:
        return np.full(len(frame), "fp32", dtype=object)
    raw = frame["dtype"]
    blank = raw.isna().to_numpy() | (raw.astype(str).str.strip() == "").to_numpy()
    codes, uniq = _text_codes(np.where(blank, "fp32", raw.astype(str).to_numpy()))
    return np.array([canonical_dtype(u) for u in uniq], dtype=object)[codes]


def _refuse_matmul_dtype(canon: pd.DataFrame, err: np.ndarray, dtype: str, msg: str) -> np.ndarray:
    """``err`` with ``msg`` on the GEMM / conv rows of ``dtype`` not refused already (a copy when any is)."""
    rows = (canon["dtype"].to_numpy() == dtype) & (err == "") & np.isin(
        canon["op"].to_numpy(), [o for o, f in OP_FAMILY.items() if f in MATMUL_FAMILIES])
    if rows.any():
        err = err.copy()
        err[rows] = msg
    return err


def _unpeaked_half_gemms(canon: pd.DataFrame, err: np.ndarray, spec: DeviceSpec) -> np.ndarray:
    """The valid bf16/fp16 GEMM and conv rows of ``canon`` on ``spec``, a spec with no 16-bit matrix peak, that must
    not be predicted: ``peak_matrix_tflops`` would cost them at the FP32 peak, an order of magnitude slow on any GPU
    with tensor cores whose spec merely omits the figure (a NeuSight JSON of an unknown GPU). A catalog device
    (:func:`~wattcast.data.catalog_match.catalog_twin`: by its figures, whatever the name) states that it has no 16-bit
    path (the Tesla P4: FP16 at 1/64 rate, run through FP32 by cuBLAS), and keeps the FP32 rate its entry describes.
    Vector families (norms, softmax, elementwise) read no matrix peak and are predicted either way."""
    dt = canon["dtype"].to_numpy()
    half = np.isin(dt, ("bf16", "fp16")) & (err == "")
    if not half.any():
        return half
    half &= np.isin(canon["op"].to_numpy(), [o for o, f in OP_FAMILY.items() if f in MATMUL_FAMILIES])
    if half.any() and catalog_twin(spec) is not None:
        half[:] = False
    return half


def predict_kernels(
    frame: pd.DataFrame,
    device: DeviceSpec | str | Path,
    bundle: KernelBundle | str | Path | None = None,
    *,
    plausible_shapes: bool = True,
) -> pd.DataFrame:
    """Every input row, plus ``pred_latency_ms``, ``pred_low_ms``, ``pred_high_ms``, ``ood`` and extras.

    Rows that cannot be predicted (unknown op, missing/invalid shape; a shape value beyond 2**40 or a tensor beyond
    1e15 bytes, likely a typo; a dtype the device's spec has no peak for) keep NaN predictions and say why in
    ``error``; the rest of the frame is still predicted. ``frame`` that is not a pandas DataFrame, has no
    ``OPName``/``op`` column or repeats a column wattcast reads is a ValueError saying so. ``plausible_shapes=False``
    skips the size bounds: for rows a step graph generated, which its builders bound themselves (tokens per step,
    int64 tensor bytes), so that a step they accept is costed as before.
    """
    check_kernel_frame(frame)
    spec = _resolve(device)
    if bundle is None or isinstance(bundle, (str, Path)):
        bundle = load_bundle(str(bundle) if bundle else None)
    # a table of kernels repeats itself (every layer of a model runs the same shapes): normalise and predict each
    # distinct input row once and copy its outputs to its repeats
    groups = _distinct_input_rows(frame)
    cols = None
    if groups is not None:
        rep, inverse = groups
        cols = _kernel_columns(frame.iloc[rep], spec, bundle, plausible_shapes, counts=np.bincount(inverse))
        if cols is not None:
            cols = {k: (v[0][inverse], v[1]) if isinstance(v, tuple) else v[inverse] for k, v in cols.items()}
    if cols is None:
        cols = _kernel_columns(frame, spec, bundle, plausible_shapes)
    out = frame.copy()
    for c in PRED_COLUMNS + EXTRA_COLUMNS:
        v = cols[c]
        out[c] = _text_column(v[1], v[0]) if isinstance(v, tuple) else v
    return out


def _kernel_columns(frame: pd.DataFrame, spec: DeviceSpec, bundle: KernelBundle, plausible_shapes: bool,
                    counts: np.ndarray | None = None) -> dict[str, object] | None:
    """The output columns of :func:`predict_kernels` for ``frame``'s rows: arrays, and for the text columns
    (``model``, ``ood_reason``, ``error``) (per-row codes, distinct strings). The valid canonical rows are deduped
    (:func:`_distinct_rows`) when at most :data:`_DEDUP_MAX_DISTINCT` of them differ.

    With ``counts``, ``frame`` holds the distinct rows of a table, each standing for ``counts`` of its rows: the rows
    predicted are then those the whole table's would be (the valid rows' distinct canonical kernels, in the order of
    their first row), so every output is the table's bit for bit; None when the table's would be its valid rows with
    their repeats (fewer repeats than the rule above dedupes), which only the whole table gives."""
    canon, err = normalise_kernel_frame(frame, plausible_shapes=plausible_shapes)
    n = len(canon)
    # dtypes of tensor-core units the spec has no peak for (a tf32 vector row is fp32 by now and predicted; an fp8
    # vector row, bf16 by now, is refused with the fp8 GEMMs: no FP8 step runs on such a GPU)
    for dt in _TENSOR_CORE_PEAKS:
        if (msg := unpeaked_dtype_error(spec, dt)) is not None:
            rows = (canon["dtype"].to_numpy() == dt) & (err == "")
            if dt == "fp8":
                rows |= (_given_dtypes(frame) == "fp8") & (err == "")
            if rows.any():
                err = err.copy()
                err[rows] = msg
    if not spec.peak_bf16_tflops and (spec.peak_fp16_tflops or catalog_twin(spec) is not None):
        # a GPU without BF16 (V100, T4; the Tesla P4's entry): its bf16 GEMMs are refused, as predict refuses bf16
        # there (until stop 48 they were costed at the FP16 tensor peak, or the P4's FP32 rate)
        err = _refuse_matmul_dtype(canon, err, "bf16", unbf16_gemm_error(spec))
    if spec.peak_bf16_tflops and not spec.peak_fp16_tflops and catalog_twin(spec) is None:
        # a spec with a BF16 peak but none for FP16: refused as ``predict --dtype fp16`` refuses it
        # (``unsupported_step_dtype``); until audit 14 its fp16 GEMMs went to the general model as non-tensor-core work
        # with the device out of distribution (an RTX 5090 bf16 8192^3 band top 11.6 ms, fp16 24.9 ms)
        err = _refuse_matmul_dtype(canon, err, "fp16", unfp16_gemm_error(spec))
    if not (spec.peak_bf16_tflops or spec.peak_fp16_tflops):
        half = _unpeaked_half_gemms(canon, err, spec)
        if half.any():
            err = err.copy()
            err[half] = [f"dtype {d} GEMM/conv needs a 16-bit matrix peak, but {spec.name}'s spec has neither "
                         "peak_bf16_tflops nor peak_fp16_tflops (a NeuSight JSON carries FP32 figures only): add them to "
                         "the spec, or give dtype fp32 for a GPU without a 16-bit path" for d in canon["dtype"].to_numpy()[half]]
    ok = err == ""
    n_ok = int(ok.sum())
    cols: dict[str, object] = {
        "pred_latency_ms": np.full(n, np.nan), "pred_low_ms": np.full(n, np.nan), "pred_high_ms": np.full(n, np.nan),
        "ood": np.zeros(n, dtype=bool), "roofline_ms": np.full(n, np.nan),
    }
    # text columns are built from (per-row codes, distinct strings)
    text = {"model": (np.zeros(n, dtype=np.intp), [""]), "ood_reason": (np.zeros(n, dtype=np.intp), [""])}
    if n_ok:
        sub = canon if n_ok == n else canon[ok]
        # predict each distinct kernel once and copy the results to its repeats
        groups = _distinct_rows(sub, _DEDUP_MAX_DISTINCT if counts is None else 1.0)
        if counts is not None:  # the distinct rows may still repeat a kernel (another spelling of an op)
            n_table, n_kernels = int(counts[ok].sum()), len(sub) if groups is None else len(groups[0])
            if not (n_table >= 2 and n_kernels <= _DEDUP_MAX_DISTINCT * n_table) and n_kernels != n_table:
                return None
        rep, inverse = (None, None) if groups is None else groups
        res = _predict_rows(sub if rep is None else sub.iloc[rep], spec, bundle)
        for k, v in res.items():
            if k in text:
                codes, uniq = v
                if inverse is not None:
                    codes = codes[inverse]
                if n_ok < n:  # rows with an error get ''
                    full = np.full(n, len(uniq), dtype=np.intp)
                    full[ok] = codes
                    codes, uniq = full, uniq + [""]
                text[k] = (codes, uniq)
                continue
            if inverse is not None:
                v = v[inverse]
            if n_ok == n:
                cols[k] = v
            else:
                cols[k][ok] = v
    cols.update(text)
    cols["error"] = (np.zeros(n, dtype=np.intp), [""]) if n_ok == n else _text_codes(err)
    return cols
