"""Validate FSDP training predictions on MosaicML's published MPT throughput table.

``endtoend/mpt/mpt_training_benchmarks.csv`` (llm-foundry ``scripts/train/benchmarking/README.md``) lists
139 MPT training runs, 125M to 70B parameters, sequence 512 to 65,536, on 8 to 128 A100s (40 GB and 80 GB)
with PyTorch FSDP ``FULL_SHARD``, BF16, FlashAttention and, for some, activation checkpointing, each with
its measured tokens per second per GPU. Every row is predicted as:

- the model: ``model_type: mpt`` with the sizes of ``mpt_model_dims.csv``; learned position embeddings of
  the run's sequence length, no ALiBi (the table's ``NumParams`` grows by exactly seq x d_model with the
  sequence, so the benchmarked models carried a position table), no biases, GELU MLP;
- the strategy: ZeRO-3 (FSDP full sharding) over all GPUs, the table's micro-batch and gradient
  accumulation, full recomputation where activation checkpointing was on, flash attention, AdamW;
- the gradient reduce-scatter dtype: the row's ``MP Mode`` (Composer's ``mixed_precision``): fp32 for DEFAULT
  (59 rows, the 80 GB ones but 70B), bf16 for PURE (80 rows) (:data:`MP_MODE_REDUCE_DTYPE`; until stop 41 every
  row reduced in fp32);
- the attention kernel: the FlashAttention-1 / Triton class (``attention="flash1"``). The table does not name
  it; MPT's recipes of the time used ``attn_impl: triton`` (MosaicML's Triton FlashAttention, the one that took
  ALiBi). Measured support: with today's FlashAttention-2 class the error grows with the sequence (mean -13%
  at <= 2k tokens, -34% to -39% beyond 8k, both head dims), with the older class it does not (-8% to +0%);
  ``at_scale.py`` prints both readings;
- the hardware: 8-GPU A100 SXM nodes with 8 x 200 Gb/s between nodes (the table's "1600 Gbps node-node
  interconnect (RoCE)"; the ``DGX-A100`` preset with the 40 GB or 80 GB GPU). The table does not say SXM;
  8-GPU nodes with one 200 Gb/s NIC per GPU are HGX (SXM) systems, so the 80 GB rows are taken as
  A100-SXM4-80GB, not the project's held-out A100 80GB PCIe.

Nothing is fitted here: the rows only measure the finished models (kernels, collectives, scheduler, memory).
Because every row ran, the memory model is checked too: each one should be predicted to fit.
"""

from __future__ import annotations

import pandas as pd

from wattcast.data.kernel_datasets import resolve_data_root
from wattcast.simulate.distributed import FRAMEWORK_HOST_MS, predict_distributed
from wattcast.simulate.options import DistributedOptions
from wattcast.simulate.parallel import ParallelConfig
from wattcast.validation.step_breakdown import ood_band_columns, step_terms
from wattcast.validation.validation_rows import error_stats, predict_rows

MPT_DEVICE = {"a100_40gb": "A100-SXM4-40GB", "a100_80gb": "A100-SXM4-80GB"}
MPT_CLUSTER = "DGX-A100"
_COLUMNS = {"Model": "model", "SeqLen (T)": "seq", "# GPUs": "gpus", "GPU": "gpu", "MFU": "mfu_pct",
            "MicroBatchSize": "micro_batch", "GradAccum": "grad_accum", "GlobalBatchSize": "batch",
            "Throughput (T/s/GPU)": "tokens_per_s_per_gpu", "Precision": "precision",
            "Activation Checkpointing": "checkpointing", "NumParams": "num_params"}
#: optional: Composer's ``fsdp_config.mixed_precision`` of the run
_MP_MODE_COLUMN = "MP Mode"
#: FSDP's gradient reduce-scatter dtype under each of Composer's mixed-precision modes (``composer/distributed/
#: mosaic_parallelism.py`` ``get_mixed_precision``, mosaicml 0.32.1): DEFAULT reduces in fp32, PURE in the
#: parameters' dtype (bf16 here: None, the hf framework's default, ``simulate.distributed.dp_reduce_bytes``)
MP_MODE_REDUCE_DTYPE = {"DEFAULT": "fp32", "PURE": None}
_DIM_COLUMNS = ("model", "d_model", "n_heads", "n_layers", "expansion_ratio", "vocab_size")


def load_mpt(root=None) -> pd.DataFrame:
    """The benchmark table joined with the model sizes; one row per run, measured step time in ms."""
    base = resolve_data_root(root) / "endtoend" / "mpt"
    runs_f, dims_f = base / "mpt_training_benchmarks.csv", base / "mpt_model_dims.csv"
    for f in (runs_f, dims_f):
        if not f.is_file():
            raise FileNotFoundError(f"MPT benchmark file not found: {f}")
    runs = pd.read_csv(runs_f)
    dims = pd.read_csv(dims_f)
    for f, frame, need in ((runs_f, runs, _COLUMNS), (dims_f, dims, _DIM_COLUMNS)):
        missing = [c for c in need if c not in frame.columns]
        if missing:
            raise ValueError(f"{f}: missing column(s) {missing}")
    # Composer's FSDP mixed-precision mode of each run (PURE / DEFAULT), when the table has it
    runs = runs.rename(columns=dict(_COLUMNS, **{_MP_MODE_COLUMN: "mp_mode"}))
    runs = runs[list(_COLUMNS.values()) + (["mp_mode"] if "mp_mode" in runs.columns else [])]
    runs["model"] = runs["model"].astype(str)
    df = runs.merge(dims[list(_DIM_COLUMNS)].astype({"model": str}), on="model", how="left", validate="many_to_one")
    unknown = sorted(set(df.loc[df["d_model"].isna(), "model"]))
    if unknown:
        raise ValueError(f"{runs_f}: model(s) {unknown} have no sizes in {dims_f.name}")
    # measured step: global batch x seq tokens at the measured per-GPU rate on every GPU
    df["measured_ms"] = 1e3 * df["batch"] * df["seq"] / (df["tokens_per_s_per_gpu"] * df["gpus"])
    return df


def mpt_config(r) -> dict:
    return {"model_type": "mpt", "d_model": int(r.d_model), "n_heads": int(r.n_heads), "n_layers": int(r.n_layers),
            "expansion_ratio": float(r.expansion_ratio), "vocab_size": int(r.vocab_size), "max_seq_len": int(r.seq),
            "attn_config": {"alibi": False, "attn_pdrop": 0.0}, "learned_pos_emb": True, "no_bias": True,
            "emb_pdrop": 0.0, "resid_pdrop": 0.0, "_name_or_path": f"mpt-{r.model}"}


#: the attention kernel class of the benchmark's runs (see the module docstring)
MPT_ATTENTION = "flash1"


def split_mpt(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(fitting half, evaluation half) of the MPT table, by model: the models in order of size, alternately (125M,
    760M, 3B, 13B, 70B fit; 350M, 1B, 7B, 30B evaluate). Whole models, not rows: a model's rows at other GPU
    counts and sequences are near copies of each other."""
    order = df.groupby("model")["num_params"].min().sort_values().index.tolist()
    fit_models = set(order[0::2])
    fit = df["model"].isin(fit_models)
    return df[fit], df[~fit]


def fit_zero3_prefetch(df: pd.DataFrame, *, progress=None) -> tuple[bool, dict[bool, float]]:
    """The ``zero3_prefetch`` setting that predicts ``df`` (the fitting half, :func:`split_mpt`) best, by mean absolute
    error, and that error for each setting: how FSDP's collectives met the computation in these runs
    (``simulate.distributed.FRAMEWORK_ZERO3_PREFETCH`` records the choice)."""
    err = {}
    for setting in (True, False):
        ok = predict_mpt(df, progress=progress, zero3_prefetch=setting)
        ok = ok[ok["status"] == "ok"]
        err[setting] = float(ok["error_pct"].abs().mean())
    return min(err, key=err.get), err


def mpt_reduce_dtype(r) -> str | None:
    """FSDP's reduce dtype of an MPT row (:data:`MP_MODE_REDUCE_DTYPE`; a row without a mode: the framework's)."""
    mode = getattr(r, "mp_mode", None)
    if not isinstance(mode, str):
        return None
    if mode.upper() not in MP_MODE_REDUCE_DTYPE:
        raise ValueError(f"MPT run with an unknown mixed-precision mode {mode!r} (known: {', '.join(MP_MODE_REDUCE_DTYPE)})")
    return MP_MODE_REDUCE_DTYPE[mode.upper()]


#: the optimizer step's kernels of llm-foundry's MPT recipes: ``optimizer: name: decoupled_adamw`` (llm-foundry 0.22.0
#: llmfoundry/optim/__init__.py registers it as Composer's DecoupledAdamW), a per-tensor loop of eight in-place
#: passes (mosaicml 0.32.1 composer/optim/decoupled_weight_decay.py l. 268-295), 80 B a parameter as PyTorch's
#: foreach AdamW moves (``featurize.training_graph.FOREACH_OPTIMIZER_BYTES_PER_PARAM``), not one fused pass
MPT_OPTIMIZER_IMPL = "foreach"


def predict_mpt(df: pd.DataFrame, *, progress=None, coll_model=None, attention: str = MPT_ATTENTION,
                zero3_prefetch: bool | None = None) -> pd.DataFrame:
    """Every row predicted (``zero3_prefetch`` None: the hf framework's default for FSDP's collectives)."""
    def one(r):
        gpus = int(r.gpus)
        par = ParallelConfig(gpus=gpus, dp=gpus, micro_batch=int(r.micro_batch), zero=3,
                             recompute="full" if bool(r.checkpointing) else "none")
        p = predict_distributed(mpt_config(r), MPT_CLUSTER, par, DistributedOptions(
            batch=int(r.batch), seq=int(r.seq), dtype="bf16", attention=attention, optimizer="adamw", framework="hf",
            optimizer_impl=MPT_OPTIMIZER_IMPL, device=MPT_DEVICE[r.gpu], coll_model=coll_model, zero3_prefetch=zero3_prefetch,
            fsdp_reduce_dtype=mpt_reduce_dtype(r)))
        return p.step_time_ms, dict(predicted_mfu_pct=100 * p.mfu, predicted_params=p.meta.get("param_count"),
                                    memory_gb=p.memory_gb, fits=bool(p.fits), exposed_comm_ms=p.exposed_comm_ms,
                                    **step_terms(p, FRAMEWORK_HOST_MS["hf"][1]), **ood_band_columns(p))

    return predict_rows(df, one, progress=progress)


def summarise_mpt(pred: pd.DataFrame) -> pd.DataFrame:
    """Mean / max |error| and signed mean per GPU and overall; rows predicted not to fit although they ran."""
    both = pd.concat([pred.assign(group=pred["gpu"]), pred.assign(group="all")])
    out = error_stats(both, "group")
    ok = both[both["status"] == "ok"]
    not_fit = (~ok["fits"].astype(bool)).groupby(ok["group"]).sum()
    out["predicted_not_to_fit"] = not_fit.reindex(out["group"]).to_numpy(dtype=int)
    return out
