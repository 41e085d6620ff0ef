"""The `wattcast` command line (typer + rich)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import List, Optional

import typer
from rich.console import Console as _RichConsole
from rich.table import Table
from rich.text import Text

from wattcast.simulate.defaults import DEFAULTS

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Forecast DL step time, power, cost and CO2e on hardware you do not have.")
train_app = typer.Typer(no_args_is_help=True, help="Retrain surrogates from measurements.")
app.add_typer(train_app, name="train")
validate_app = typer.Typer(no_args_is_help=True, help="Check predictions against measurements.")
# options every training and validation job takes
_DATA_OPTION = typer.Option(None, "--data", help="Dataset root (default: $WATTCAST_DATA, then ../shared/datasets).")
_TRAIN_DATA_OPTION = typer.Option([], "--data", help="Dataset root (default: $WATTCAST_DATA, then ../shared/datasets) "
                                  "and/or folders written by `wattcast profile import` / `profile run` (repeatable).")
_MLRUNS_OPTION = typer.Option(Path("mlruns"), "--mlruns", help="MLflow store folder (sqlite DB + artifacts).")
_NO_MLFLOW_OPTION = typer.Option(False, "--no-mlflow", help="Do not log to MLflow.")
_OUT_OPTION = typer.Option(None, "--out", help="Artifact folder to write (default: the shipped one in the package).")
app.add_typer(validate_app, name="validate")
# options of every command that computes a whole training run (--tokens): predict, predict --cluster, search
_PUE_OPTION = typer.Option(None, "--pue", help="Data-centre PUE (default 1.2).")
_LIFETIME_OPTION = typer.Option(None, "--lifetime-years", help="Hardware lifetime for amortising embodied carbon and CapEx (default 5).")
_GRID_OPTION = typer.Option(None, "--grid-kgco2e-per-kwh", help="Grid intensity (overrides --region).")
_MTBF_OPTION = typer.Option(None, "--mtbf-gpu-hours", help="Mean time between failures of one GPU, hours (the run's goodput: failures, restarts, checkpoints; default from the shipped assumptions).")
_CHECKPOINT_OPTION = typer.Option(None, "--checkpoint-write-s", help="Seconds to write one checkpoint (Young/Daly interval and its cost; a run shorter than the interval writes none; 0 to 86,400 s; default from the shipped assumptions).")
_CLOUD_OPTION = typer.Option(None, "--cloud-usd-per-gpu-hour", help="Cloud price per GPU-hour for the run's cloud cost (default: a cluster spec's own price, else the table's price for a catalog GPU under --pricing).")
_PRICING_OPTION = typer.Option(None, "--pricing", help="Cloud pricing of the run's cloud cost: on-demand (default), reserved-1y or reserved-3y (committed-use list prices, cloud_prices.yaml).")
_ELECTRICITY_OPTION = typer.Option(None, "--electricity-usd-per-kwh", help="Electricity price (USD/kWh) for the run's OpEx; wins over --region's price (default: the region's price from the shipped table, else the global 0.08).")
# the retrained models a prediction uses (models/selection.py): flag > environment variable > shipped
_MODELS_OPTION = typer.Option(None, "--models", help="A retrained kernel surrogate bundle folder (what `wattcast train kernels --out FOLDER` writes; default: $WATTCAST_MODELS, else the shipped one).")
_COLLECTIVES_MODEL_OPTION = typer.Option(None, "--collectives", help="A retrained collective model folder (`wattcast train collectives --out FOLDER`; default: $WATTCAST_COLLECTIVES, else the shipped one).")
_POWER_MODEL_OPTION = typer.Option(None, "--power-model", help="A retrained power model folder (`wattcast train power --out FOLDER`; default: $WATTCAST_POWER_MODEL, else the shipped one).")
profile_app = typer.Typer(no_args_is_help=True, help="Import profiling files (or measure this machine's GPU) into measurement tables.")
app.add_typer(profile_app, name="profile")


def Console(**kw) -> _RichConsole:
    """A rich console that prints text literally (``markup=False``): messages, warnings, names and table cells quote
    user text and exception messages, where ``[batch]`` or ``[bold]`` read as rich markup would vanish or restyle the
    rest. Colour goes through ``style=`` or :class:`rich.text.Text` instead."""
    kw.setdefault("markup", False)
    return _RichConsole(**kw)


err = Console(stderr=True)


def pd_isna(v) -> bool:
    """A missing table cell (None or NaN) without importing pandas at CLI start-up."""
    return v is None or (isinstance(v, float) and v != v)


def _dtype_flag(given: str | None, *, device=None, clusters=()) -> str:
    """--dtype as given, else the default (bf16), or fp16 when a GPU the command runs on has no BF16 (a V100, T4 or
    P100: today's mixed precision there is fp16 AMP); a note on stderr says so. A device or cluster that cannot be
    resolved is left to the command's own error."""
    if given is not None:
        return given
    from wattcast.data.catalog import resolve_device
    from wattcast.data.cluster_spec import resolve_cluster
    from wattcast.simulate.defaults import lacking_precision, resolve_dtype

    try:  # a given device is the GPU (of the cluster too); else each cluster's own
        specs = ([resolve_device(device)] if device is not None
                 else [resolve_device(resolve_cluster(c).device) for c in clusters])
    except Exception:  # reported by the command itself, with its own message
        return DEFAULTS.dtype
    got = {s.name: resolve_dtype(DEFAULTS.dtype, s) for s in specs}
    lacking = sorted(n for n, d in got.items() if d != DEFAULTS.dtype)
    if lacking:
        out = "fp32" if "fp32" in got.values() else "fp16"  # one precision every GPU of the command has
        err.print(f"note: {', '.join(lacking)} has no {lacking_precision(out)}: --dtype {out} (the default is "
                  f"bf16 where the GPU has it; give --dtype to choose)", style="yellow")
        return out
    return DEFAULTS.dtype


def _fail(msg: str, code: int = 2) -> None:
    err.print(Text.assemble(("error:", "bold red"), " ", str(msg)))
    raise typer.Exit(code)


def _model_folders(models=None, collectives=None, power_model=None, kinds=("models", "collectives", "power_model")):
    """The model folders a command predicts with (flag > $WATTCAST_MODELS / $WATTCAST_COLLECTIVES /
    $WATTCAST_POWER_MODEL > shipped; only ``kinds``, the ones the command uses), checked: a folder without such a model
    is a one-line error naming the flag (or variable), the folder and what is missing (exit 2)."""
    from wattcast.models.selection import ModelFolderError, resolve_folders

    try:
        return resolve_folders(models, collectives, power_model, kinds=kinds, labels=dict(
            models="--models", collectives="--collectives", power_model="--power-model"))
    except ModelFolderError as e:
        _fail(str(e))


def _input_file(path: Path, what: str) -> Path:
    """An existing regular file, or a clear error."""
    if path.is_dir():
        _fail(f"{what} {path} is a directory, not a file")
    if not path.is_file():
        _fail(f"{what} {path} does not exist")
    return path


_OVERWRITE_OPTION = typer.Option(False, "--overwrite", help="Replace an existing --output file (without it, an existing "
                                 "file is an error).")


def _output_file(path: Path, what: str, suffixes: tuple[str, ...] = (), protect: tuple[Path, ...] = (),
                 overwrite: bool | None = None) -> Path:
    """A file path we can write: not a directory, not one of the inputs (``protect``), with an allowed suffix;
    missing parent folders are created. ``overwrite=False`` (a command with ``--overwrite`` not given): an existing
    file is an error; None: not checked. Checked before any work is done."""
    if path.is_dir():
        _fail(f"{what} {path} is a directory; give a file name")
    if suffixes and path.suffix.lower() not in suffixes:
        _fail(f"{what} {path}: use one of {', '.join(suffixes)}")
    for p in protect:
        if p is not None and _same_file(path, p):
            _fail(f"{what} {path} is the input file; refusing to overwrite it")
    if overwrite is False and path.exists():
        _fail(f"{what} {path} already exists; refusing to overwrite it (pass --overwrite to replace it, or give another "
              "file name)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _fail(f"cannot create the folder of {what} {path}: {e.strerror or e}")
    return path


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one existing file (symlinks and hard links alike: one device and inode)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # either is missing (or unreadable): not one file
        return False


def _sig(v: float, digits: int = 3) -> str:
    """``v`` to ``digits`` significant figures, never rounded to 0 when it is not: 0.0078 -> '0.0078', 6.9e-05 ->
    '6.9e-05', 56.74 -> '56.7', 12,345.6 -> '12,346' (a whole number once it has ``digits`` digits)."""
    import math

    v = float(v)
    if not math.isfinite(v) or v == 0 or abs(v) < 1:
        return f"{v:.{digits}g}"
    return f"{v:,.{max(0, digits - 1 - int(math.floor(math.log10(abs(v)))))}f}"


def _gb_and_gib(gb: float) -> str:
    """A capacity in 1e9-byte GB (every memory figure's unit) with the GiB it is (vendors' "80 GB" are 80 GiB)."""
    return f"{gb:.1f} GB ({gb * 1e9 / 2**30:.0f} GiB)"


def _output_dir(path: Path, what: str) -> Path:
    """A folder to write into (created if missing), or a clear error when a file is in the way."""
    if path.exists() and not path.is_dir():
        _fail(f"{what} {path} is a file; give a folder")
    return path


def _write(what: str, path: Path, write) -> None:
    """Run ``write()``; an operating-system error becomes a one-line message, not a traceback."""
    try:
        write()
    except OSError as e:
        _fail(f"cannot write {what} {path}: {e.strerror or e}")


def _job_paths(mlruns: Path | None = None, out: Path | None = None, output: Path | None = None,
               overwrite: bool | None = None) -> None:
    """Check a training or validation job's output locations before it runs for minutes."""
    if mlruns is not None:
        _output_dir(mlruns, "--mlruns")
    if out is not None:
        _output_dir(out, "--out")
    if output is not None:
        _output_file(output, "--output", overwrite=overwrite)


_FORCE_OPTION = typer.Option(False, "--force", help="Accept figures outside the plausible ranges (a deliberately exotic "
                             "device, cluster or assumption); without it they are refused as likely unit mix-ups.")


def _forceable(command):
    """Run a command with the plausibility ranges off when it was given ``--force`` (its ``force`` parameter)."""
    import functools

    @functools.wraps(command)
    def run(*args, **kwargs):
        from wattcast.data.checks import allow_exotic

        with allow_exotic(bool(kwargs.get("force"))):
            return command(*args, **kwargs)

    return run


def _check_pricing_flag(pricing: Optional[str]) -> None:
    """--pricing names a cloud pricing plan (refused before any evaluation, listing the valid ones)."""
    if pricing is None:
        return
    from wattcast.data.carbon import CarbonDataError, check_pricing

    try:
        check_pricing(pricing)
    except CarbonDataError as e:
        _fail(str(e))


def _table_console() -> Console:
    """stdout for tables: the terminal's width, or when piped / redirected (``wattcast devices | head``) room for every
    column at full width (rich would otherwise squeeze the table into 80 columns and cut names to "MI1…")."""
    con = Console()
    return con if con.is_terminal else Console(width=1000)


def _resolve_device_arg(name: str, what: str):
    """The DeviceSpec ``name`` gives (a catalog name or alias, or a spec file), or a clear error (exit 2). A catalog
    name wins over a file of that name; an existing path that is not a spec file (a folder, a .csv) is said to be
    one, not reported as an unknown device with the catalog's closest names."""
    from wattcast.data.catalog import SPEC_SUFFIXES, find_device, resolve_device
    from wattcast.data.device_spec import DeviceSpecError

    p = Path(str(name).strip()).expanduser()
    if str(name).strip() and p.exists() and find_device(str(name)) is None:
        if p.is_dir():
            _fail(f"{what} {p} is a directory, not a device spec file (.yaml/.yml/.json, own schema or NeuSight JSON)")
        if p.suffix.lower() not in SPEC_SUFFIXES:
            _fail(f"{what} {p} is not a device spec file: give a .yaml/.yml/.json spec (own schema or NeuSight JSON) "
                  "or a catalog name (see `wattcast devices`)")
    try:
        return resolve_device(name)
    except (DeviceSpecError, FileNotFoundError, ValueError) as e:
        _fail(str(e))


def _positive(**values) -> None:
    """Reject counts below 1, naming the option."""
    for name, v in values.items():
        if v is not None and v < 1:
            _fail(f"--{name.replace('_', '-')} must be at least 1, got {v}")


@app.command()
@_forceable
def kernels(
    device: str = typer.Option(..., "--device", "-d", help="Catalog name (case-insensitive) or a spec file (own YAML/JSON or NeuSight JSON)."),
    input: Path = typer.Option(..., "--input", "-i", help="CSV with OPName + NeuSight shape columns (+ optional dtype)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the predictions here (default: CSV on stdout)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="The dtype of rows that give none (a CSV without a dtype column, or an empty cell): fp32, tf32, fp16, bf16 or fp8. A row whose own dtype differs is an error (the CSV's dtype is never overridden). Default: such rows are fp32."),
    overwrite: bool = _OVERWRITE_OPTION,
    models: Optional[Path] = _MODELS_OPTION,
    force: bool = _FORCE_OPTION,
) -> None:
    """Predict the latency of every kernel in a CSV on DEVICE."""
    import pandas as pd

    from wattcast.models.kernel_predictor import (EXTRA_COLUMNS, PRED_COLUMNS, frame_with_default_dtype,
                                                  predict_kernels, resolve_default_dtype)

    spec = _resolve_device_arg(device, "--device")
    if dtype is not None:
        try:  # an unknown --dtype, or one the device lacks, fails before the input is read
            resolve_default_dtype(dtype, spec, "--dtype")
        except ValueError as e:
            _fail(str(e))
    _input_file(input, "input file")
    if output:
        _output_file(output, "--output", protect=(input,), overwrite=overwrite)
    models = _model_folders(models, kinds=("models",)).models
    try:
        text = input.read_text(encoding="utf-8-sig")  # read once: checked below, then parsed
    except (OSError, UnicodeDecodeError) as e:
        _fail(f"cannot read {input} as CSV: {e}")
    from wattcast.data.checks import csv_header_problem

    if msg := csv_header_problem(text, str(input)):  # a repeated column would be renamed B.1 and silently ignored
        _fail(msg)
    # a row with more fields than the header would make pandas shift every column (or drop cells): an error
    import csv
    import io

    widths = [(i, len(r)) for i, r in enumerate(csv.reader(io.StringIO(text, newline="")), start=1) if r]
    longer = [i for i, n in widths[1:] if n > widths[0][1]] if widths else []
    if longer:
        _fail(f"{input}: line(s) {', '.join(map(str, longer[:5]))} have more fields than the header ({widths[0][1]})")
    try:
        # read as text so the output repeats every input cell exactly as given
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, index_col=False)
    except Exception as e:  # pandas raises several types for unreadable CSVs
        _fail(f"cannot read {input} as CSV: {e}")
    from wattcast.data.checks import without_blank_rows

    frame = without_blank_rows(frame).reset_index(drop=True)  # a spreadsheet's empty ',,,' rows are no kernels
    if dtype is not None:
        try:
            frame = frame_with_default_dtype(frame, dtype, spec, str(input), "--dtype")
        except ValueError as e:
            _fail(str(e))
    replaced = [c for c in PRED_COLUMNS + EXTRA_COLUMNS if c in frame.columns]
    if replaced:
        err.print(f"the input already has column(s) {', '.join(replaced)}; the output replaces them", style="yellow")
        frame = frame.drop(columns=replaced)
    try:
        out = predict_kernels(frame, spec, bundle=models)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    if not len(out):
        _fail(f"{input} has a header but no kernel rows: nothing to predict", code=1)
    bad = (out["error"] != "").sum()
    if output:
        _write("--output", output, lambda: out.to_csv(output, index=False))
    else:
        out.to_csv(sys.stdout, index=False)
    ok = out[out["error"] == ""]
    from wattcast.data.device_spec import spec_notes
    _print_warnings(spec_notes(spec, power=False))  # the spec's (sparse-looking peaks, no tdp_w)
    err.print(Text.assemble(
        (f"{len(ok):,}", "green"), " kernels predicted on ", (spec.name, "bold"),
        f", total {ok['pred_latency_ms'].sum():.3f} ms" if len(ok) else "",
        *([", ", (f"{int(ok['ood'].sum()):,} out of distribution", "yellow")] if len(ok) and ok["ood"].any() else []),
        *([", ", (f"{bad:,} rows with errors", "red"), " (see the 'error' column)"] if bad else []),
        f" -> {output}" if output else "",
    ))
    if bad == len(out):
        raise typer.Exit(1)  # nothing could be predicted: the rows' 'error' column says why


@app.command()
@_forceable
def devices(
    name: Optional[str] = typer.Argument(None, help="Show one device's spec (name, alias or spec file)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: the list of specs, or one spec (own schema, a valid spec file)."),
    force: bool = _FORCE_OPTION,
) -> None:
    """List the device catalog, or show one spec with its sources."""
    from wattcast.data.catalog import list_devices

    con = _table_console()
    if name:
        spec = _resolve_device_arg(name, "device")
        from wattcast.data.device_spec import spec_notes
        _print_warnings(spec_notes(spec))  # what predictions with it will warn about (stderr)
        if as_json:  # the spec in its own schema (a valid spec file): 'source' and the per-field 'sources'
            print(json.dumps(spec.to_dict(), indent=2))
            return
        t = Table(title=spec.name)
        t.add_column("field", no_wrap=True)
        t.add_column("value")
        t.add_column("source")
        for k, v in spec.to_dict().items():
            if k in ("sources", "source"):
                continue
            t.add_row(k, str(v), spec.source_of(k) if isinstance(v, (int, float)) and not isinstance(v, bool) else "")
        con.print(t)
        return
    specs = list_devices()
    if as_json:
        print(json.dumps([s.to_dict() for s in specs], indent=2))
        return
    t = Table(title="wattcast device catalog")
    for c in ("name", "vendor", "FP32 TFLOP/s", "FP16 TFLOP/s", "BF16 TFLOP/s", "FP8 TFLOP/s", "GB", "GB/s", "SMs", "L2 MB", "TDP W"):
        t.add_column(c, no_wrap=c == "name")
    f = lambda v: "" if v is None else f"{v:g}"  # noqa: E731
    for s in specs:
        t.add_row(s.name, s.vendor, f(s.peak_fp32_tflops), f(s.peak_fp16_tflops), f(s.peak_bf16_tflops), f(s.peak_fp8_tflops),
                  f(s.memory_gb), f(s.memory_bandwidth_gbps), f(s.num_sms), f(s.l2_cache_mb), f(s.tdp_w))
    con.print(t)


@app.command()
@_forceable
def predict(
    ctx: typer.Context,
    model: str = typer.Option(..., "--model", "-m", help="An ONNX file, a Hugging Face config.json or model folder, a Hub id (org/name) in the local Hugging Face cache, or a built-in name (`wattcast models` lists them)."),
    device: Optional[str] = typer.Option(None, "--device", "-d", help="Catalog name (case-insensitive) or a spec file (default with --cluster: the cluster's GPU)."),
    batch: Optional[int] = typer.Option(None, "--batch", "-b", help="Sequences per step (the global batch with --cluster; default 1, or an ONNX file's own fixed dims)."),
    seq: Optional[int] = typer.Option(None, "--seq", "-s", help="Tokens per sequence (default 1024, or an ONNX file's own fixed dims)."),
    mode: str = typer.Option("train", "--mode", help="train (forward + backward + optimizer) or inference (forward)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16 (default; fp16 on a GPU without BF16: V100, T4, P100), fp16, fp32, tf32 or fp8 (Transformer Engine recipe: linear-layer GEMMs in FP8, the rest bf16)."),
    attention: str = typer.Option(DEFAULTS.attention, "--attention", help="flash (the fused kernel the framework runs, default: PyTorch SDPA's FlashAttention-2 under hf and megatron-deepspeed's flash-attn 2; Transformer Engine's cuDNN attention under megatron from Hopper on; vLLM's FA3 on Hopper; settings.flash_kernel says fa2 or fa3), flash3 (FlashAttention-3 / cuDNN class whatever the framework, e.g. SDPA with FA3 registered), flash1 (FlashAttention-1 / Triton class, 2022-23 runs) or eager (bmm + softmax + bmm)."),
    compile: bool = typer.Option(False, "--compile", help="Approximate torch.compile: fuse elementwise chains."),
    optimizer: Optional[str] = typer.Option(None, "--optimizer", help="adamw (default), adamw-bf16 (bf16 moments: Megatron-Core's precision-aware optimizer, DeepSeek-V3's AdamW), muon (Muon on the blocks' 2-D weights, AdamW on the rest: Megatron-Core 0.16.1's TensorParallelMuon, blockwise TP, --zero 1 = its LayerWiseDistributedOptimizer; torch.optim.Muon with --framework hf, --zero 0), sgd or none; training only."),
    optimizer_impl: Optional[str] = typer.Option(None, "--optimizer-impl", help="The optimizer step's kernels: fused (one pass over the fp32 state: torch's fused=True, apex / Transformer Engine / DeepSpeed FusedAdam; every framework's default, Hugging Face Trainer's adamw_torch_fused included) or foreach (PyTorch's multi-tensor default when neither fused nor foreach is given: 8 passes, 80 B a parameter for AdamW against 28); training only."),
    recompute: str = typer.Option("none", "--recompute", help="Activation recomputation: none, selective or full."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write a Chrome trace (Perfetto) of the step (an existing file only with --overwrite; never one of the inputs)."),
    allow_oom: bool = typer.Option(False, "--allow-oom", help="Report a configuration that does not fit instead of failing."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs of the job (distributed prediction; needs --cluster)."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree (Megatron column/row splits)."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel stages."),
    dp: Optional[int] = typer.Option(None, "--dp", help="Data-parallel degree (default gpus / (tp x pp x cp))."),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", help="Sequences per micro-batch."),
    zero: int = typer.Option(0, "--zero", help="ZeRO stage 0-3 over the data-parallel group (3 = FSDP). With --framework megatron: 1 = the distributed optimizer (--use-distributed-optimizer), 2 / 3 = Megatron-FSDP's --data-parallel-sharding-strategy optim_grads / optim_grads_params (2 reduce-scatters the gradients in every micro-batch's backward, as Megatron-FSDP does: see README). With --framework hf: 3 = PyTorch FSDP FULL_SHARD, 2 = SHARD_GRAD_OP (each layer's parameters all-gathered in every micro-batch's forward and kept through its backward, each layer's gradients reduce-scattered as its backward ends; no_sync is not modelled)."),
    sp: bool = typer.Option(False, "--sp", help="Sequence parallelism (with --tp)."),
    ep: int = typer.Option(1, "--ep", help="Expert-parallel degree (mixture-of-experts models)."),
    etp: Optional[int] = typer.Option(None, "--expert-tensor-parallel-size", "--etp", help="Megatron-Core: the routed experts' tensor-parallel degree, folded with --ep over tp x cp x dp (default: --tp)."),
    interleave: int = typer.Option(1, "--interleave", help="Virtual pipeline stages per GPU (interleaved 1F1B)."),
    schedule: str = typer.Option("1f1b", "--schedule", help="Pipeline schedule: 1f1b, gpipe or dualpipe (DeepSeek-V3's: even --pp, an even micro-batch count of at least 2 x pp)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="Cluster preset name or file (own YAML or ASTRA-sim network YAML)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a timeline PNG (distributed prediction; an existing file only with --overwrite)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Let --trace / --plot replace an existing file (never an input: the model, device or cluster file)."),
    power_limit_w: Optional[float] = typer.Option(None, "--power-limit-w", help="Board power limit per GPU (W): clocks drop, time and power respond."),
    framework: str = typer.Option("hf", "--framework", help="Whose kernels and host costs: hf, megatron (Megatron-Core: GPT, Llama, Qwen3, Mixtral, Qwen-MoE, DeepSeek) or megatron-deepspeed (GPT)."),
    clock_cap_mhz: Optional[float] = typer.Option(None, "--clock-cap-mhz", help="SM clock cap (MHz): time and power respond."),
    tokens: Optional[float] = typer.Option(None, "--tokens", help="Tokens of the whole run (a training run's, or the tokens an inference deployment serves on one device): adds the run's time, energy, CO2e and cost (`run`)."),
    region: Optional[str] = typer.Option(None, "--region", help="Grid region for the run's carbon: country (ISO code or name) or cloud region (gcp:us-central1)."),
    pue: Optional[float] = _PUE_OPTION,
    lifetime_years: Optional[float] = _LIFETIME_OPTION,
    grid_kgco2e_per_kwh: Optional[float] = _GRID_OPTION,
    cloud_usd_per_gpu_hour: Optional[float] = _CLOUD_OPTION,
    mtbf_gpu_hours: Optional[float] = _MTBF_OPTION,
    checkpoint_write_s: Optional[float] = _CHECKPOINT_OPTION,
    pricing: Optional[str] = _PRICING_OPTION,
    electricity_usd_per_kwh: Optional[float] = _ELECTRICITY_OPTION,
    dim: List[str] = typer.Option([], "--dim", help="Bind a symbolic ONNX input dim: NAME=VALUE (repeatable)."),
    loop_trip_count: Optional[int] = typer.Option(None, "--loop-trip-count", help="Iterations of an ONNX model's Loops whose trip count is known only at run time (each body is costed this many times)."),
    pp_first_stage_layers: Optional[int] = typer.Option(None, "--pp-first-stage-layers", help="Transformer layers of the first pipeline stage (Megatron-Core's decoder_first_pipeline_num_layers); the other stages split the rest evenly."),
    pp_last_stage_layers: Optional[int] = typer.Option(None, "--pp-last-stage-layers", help="Transformer layers of the last pipeline stage (decoder_last_pipeline_num_layers)."),
    cp: int = typer.Option(1, "--cp", help="Context-parallel degree: the sequence split over this many ranks (ring attention; needs --framework megatron and --attention flash or flash3)."),
    cp_comm_type: Optional[str] = typer.Option(None, "--cp-comm-type", help="Megatron-Core/TE: how context parallelism communicates: p2p (the KV ring, default), a2a (all-to-all of Q/K/V and output, heads scattered), allgather (K/V all-gathered) or a2a+p2p (a2a inside, ring across; needs --hierarchical-cp-sizes)."),
    hierarchical_cp_sizes: Optional[str] = typer.Option(None, "--hierarchical-cp-sizes", help="With --cp-comm-type a2a+p2p: A,B = the inner all-to-all and outer ring sizes, A x B = --cp (Megatron-LM --hierarchical-context-parallel-sizes)."),
    overlap_grad_reduce: Optional[bool] = typer.Option(None, "--overlap-grad-reduce/--no-overlap-grad-reduce", help="Megatron-Core: reduce gradient buckets during the last backward (default on with --framework megatron)."),
    overlap_param_gather: Optional[bool] = typer.Option(None, "--overlap-param-gather/--no-overlap-param-gather", help="Megatron-Core: all-gather the distributed optimizer's parameters during the next forward (default on with --framework megatron and --zero >= 1)."),
    tp_comm_overlap: Optional[bool] = typer.Option(None, "--tp-comm-overlap/--no-tp-comm-overlap", help="Megatron-Core/TE: pipeline the TP all-gathers/reduce-scatters with their GEMMs (default on with --framework megatron, --tp > 1 and --sp, when the TP group sits inside one node: NVLink domain; refused across nodes)."),
    overlap_moe_expert_parallel_comm: Optional[bool] = typer.Option(None, "--overlap-moe-expert-parallel-comm/--no-overlap-moe-expert-parallel-comm", help="Megatron-Core: run each micro-batch's MoE all-to-alls beside another micro-batch's computation (batch-level overlap, as DeepSeek-V3's DualPipe; off by default; needs --ep > 1 and --framework megatron)."),
    overlap_p2p_comm: Optional[bool] = typer.Option(None, "--overlap-p2p-communication/--no-overlap-p2p-communication", help="Megatron-Core: the interleaved schedule's pipeline transfers run beside the computation (default on with --framework megatron; off: each blocks, as Megatron-LM 2021 ran them)."),
    async_tp_comm: Optional[bool] = typer.Option(None, "--async-tp-comm/--no-async-tp-comm", help="Megatron: the column-parallel linears' backward TP collective runs beside the weight-gradient GEMM (default on with --framework megatron, as Megatron-Core; off: Megatron-LM 2021's synchronous all-reduce, or --no-async-tensor-model-parallel-allreduce). Needs --tp > 1 (not with --schedule dualpipe); off by default under hf and megatron-deepspeed."),
    moe_load_imbalance: float = typer.Option(1.0, "--moe-load-imbalance", help="MoE routing: the busiest expert-parallel rank's tokens over the mean (1 = balanced); every MoE layer waits for it."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="Use this many of each node's GPUs (e.g. 64 of an NVL72 rack's 72, the rest spares); NICs in proportion."),
    moe_expert_capacity_factor: Optional[float] = typer.Option(None, "--moe-expert-capacity-factor", help="Megatron-Core's expert capacity: each expert keeps at most this many times its balanced share of tokens (the rest are dropped)."),
    moe_pad_expert_input_to_capacity: bool = typer.Option(False, "--moe-pad-expert-input-to-capacity", help="Megatron-Core: pad every expert's input to its capacity (needs --moe-expert-capacity-factor)."),
    moe_token_dispatcher_type: str = typer.Option("alltoall", "--moe-token-dispatcher-type", help="Megatron-Core's MoE token dispatcher: alltoall (default here) or allgather (Megatron-Core's own default: all-gathers over the expert-TP x EP ranks, a reduce-scatter back). Needs --cluster, --gpus and --framework megatron."),
    mtp_num_layers: int = typer.Option(0, "--mtp-num-layers", help="Megatron-Core (--framework megatron, DeepSeek-V2/V3 configs): multi-token-prediction depths on the last pipeline stage (DeepSeek-V3 trained with 1)."),
    fp8_param_gather: bool = typer.Option(False, "--fp8-param-gather", help="Megatron-Core (--dtype fp8, --zero >= 1, --framework megatron): keep the FP8 GEMMs' weights as FP8 (no bf16 copy), cast each rank's shard after the step and all-gather them at 1 B a parameter."),
    fp8_recipe: Optional[str] = typer.Option(None, "--fp8-recipe", help="With --dtype fp8: Megatron-Core's --fp8-recipe, Transformer Engine's scaling: delayed (the default: per-tensor scale from an amax history), tensorwise (current scaling: an amax pass before each cast), mxfp8 (data-centre Blackwell only: 1x32 E8M0 block scales) or blockwise (Hopper/Blackwell: 1x128 activation, 128x128 weight fp32 scales); deepseek: blockwise's scales plus DeepSeek-V3's low-precision storage and FP8 dispatch (tech report Sec. 3.3.3: E5M6 attention output, FP8-cached MoE SwiGLU inputs with the output recomputed, no FP8 copy of a recomputed norm output). Changes the cast kernels and the FP8 copies' bytes, not the GEMMs' speed."),
    zero3_prefetch: Optional[bool] = typer.Option(None, "--zero3-prefetch/--no-zero3-prefetch", help="With --zero 3 (FSDP; and --framework hf --zero 2, FSDP SHARD_GRAD_OP): run each layer's parameter all-gathers and gradient reduce-scatters beside the computation, or in series with it (default: in series for --framework hf, as measured on MosaicML's PyTorch FSDP runs; prefetched for megatron and megatron-deepspeed)."),
    scatter_gather_p2p: Optional[bool] = typer.Option(None, "--scatter-gather-p2p/--no-scatter-gather-p2p", help="Pipeline transfers scattered over the TP group and all-gathered on arrival (Megatron-LM 2021's --scatter-gather-tensors-in-pipeline, DeepSpeed's PartitionedTensor; default: the framework's, on for megatron-deepspeed, off for megatron; nothing to scatter under --sp)."),
    fsdp_reduce_dtype: Optional[str] = typer.Option(None, "--fsdp-reduce-dtype", help="With --framework hf and --zero 2 or 3 (PyTorch FSDP) under bf16/fp16: MixedPrecision.reduce_dtype, the dtype of the gradient reduce-scatters: fp32, bf16 or fp16 (default: the parameters' dtype, as Accelerate and torch's MixedPrecision have it; Composer/llm-foundry's mixed_precision DEFAULT is fp32)."),
    grad_accum_dtype: Optional[str] = typer.Option(None, "--grad-accum-dtype", help="fp32 or bf16. Under --framework megatron-deepspeed DeepSpeed's data_types.grad_accum_dtype, with --dtype bf16 at --zero 0/1 only (no effect at --zero 2/3 nor under fp16/fp32: a warning): at --zero 1 fp32 runs BF16_Optimizer (bf16 gradients + a whole-model fp32 accumulation buffer, 6 B/param, an fp32 accumulation pass every micro-batch; BLOOM-176B's, the default) and bf16 DeepSpeed's ZeRO optimizer (2 B/param of bf16 gradients, flat bf16 + fp32 copies of the rank's partition at the step); at --zero 0 DeepSpeed 0.19.8 runs BF16_Optimizer with a bf16 buffer (bf16, the default there; fp32, which it refuses, is costed as the older DeepSpeed BLOOM ran, with a warning). Under --framework megatron the dtype of Megatron-LM's main-gradient buffer at every --zero: bf16 is --grad-reduce-in-bf16 (with --dtype bf16/fp8; no effect under fp16/fp32, a warning), fp32 --accumulate-allreduce-grads-in-fp32 (Megatron-LM's default for bf16; under fp16 it replaces the default fp16 buffer). A half-precision buffer is cast to fp32 once per step for Adam (read 2, write 4 B/param of the rank's shard, 4 B/param held after the backward). Refused under --framework hf."),
    grad_reduce_in_bf16: bool = typer.Option(False, "--grad-reduce-in-bf16", help="Megatron-LM's --grad-reduce-in-bf16 (--framework megatron only, --dtype bf16/fp8): the main-gradient buffer in bf16 instead of fp32, the same as --grad-accum-dtype bf16 there: 2 B/param of gradients instead of 4, the data-parallel reduce-scatter / all-reduce (Megatron-FSDP's too) and the tied-embedding all-reduce in bf16 (half the bytes), and the cast of the rank's gradient shard to fp32 once per step (the optimizer's at --zero 0/1, Megatron-FSDP's update_main_grads at --zero 2/3: read 2, write 4 B/param, held 4 B/param after the backward). DeepSpeed has no such flag: under --framework megatron-deepspeed it is an error (DeepSpeed's data_types.grad_accum_dtype is --grad-accum-dtype bf16)."),
    data_load_ms: float = typer.Option(0.0, "--data-load-ms", help="Data loading: the loader's host time to produce one micro-batch (one device: one step), ms (default 0: a tokenised stream). Exposed in full with 0 workers, else what the workers cannot hide behind the step."),
    data_workers: Optional[int] = typer.Option(None, "--data-workers", help="Data-loader worker processes (default: the framework's; hf 0, megatron and megatron-deepspeed 2)."),
    host_us: Optional[float] = typer.Option(None, "--host-us", help="The host's time per kernel launch, us (a property of the CPU, Python and framework version): eager PyTorch issues each kernel after this much host time, into an in-order stream, so small kernels leave the GPU waiting. Default 40 (--framework hf: eager PyTorch on the profiled hosts, which measured 35-170 us; 6 with --compile); with --framework megatron / megatron-deepspeed it replaces their per-kernel floor (6 / 72.5 us). Not with --serving."),
    recompute_method: Optional[str] = typer.Option(None, "--recompute-method", help="With --recompute full and --recompute-num-layers: Megatron's block (the first N layers of each stage recomputed; the default) or uniform (every layer; the input of each group of N layers kept). Without --recompute full it is an error, as in Megatron."),
    recompute_modules: Optional[str] = typer.Option(None, "--recompute-modules", help="Megatron-Core's selective recomputation modules, comma-separated: core_attn (the default), mlp, moe, shared_experts, moe_act, layernorm, mla_up_proj (the last three discard their outputs too and re-make them in backward). Implies --recompute selective; with --recompute full it is an error."),
    recompute_num_layers: Optional[int] = typer.Option(None, "--recompute-num-layers", help="With --recompute full: Megatron's block recomputation (--recompute-method block): only the first N transformer layers of each pipeline stage (each virtual stage) are recomputed, the others keep their activations."),
    cross_entropy_loss_fusion: Optional[bool] = typer.Option(None, "--cross-entropy-loss-fusion/--no-cross-entropy-loss-fusion", help="Megatron-Core (--framework megatron): the fused cross-entropy loss (default on with --framework megatron, as Megatron-Bridge's GPT/Llama recipes run it; off elsewhere; Megatron-LM's own flag defaults to off)."),
    cross_entropy_fusion_impl: str = typer.Option("native", "--cross-entropy-fusion-impl", help="With --cross-entropy-loss-fusion: native (Megatron-Core's jit-fused loss, 32 B a bf16 logit; the default) or te (Transformer Engine's Triton kernels, 8 B a logit, a bf16 copy of the logits saved; Megatron-Bridge's Llama 3 pretraining recipes)."),
    force: bool = _FORCE_OPTION,
    kv_context: Optional[int] = typer.Option(None, "--kv-context", help="Inference with a KV cache (one device, or one tensor-parallel group with --cluster --gpus TP --tp TP --mode inference; Llama-architecture configs): tokens already cached per sequence. The step runs --seq new tokens per sequence against context + seq keys/values (--seq 1: one decode step; --kv-context 0: a prefill); the memory holds the cache."),
    serving: Optional[str] = typer.Option(None, "--serving", help="With --kv-context and --seq 1: the decode step as one iteration of a serving engine: vllm (v0.x, continuous batching: host time a + b x batch in series with the GPU step, fitted on ML.ENERGY v2 A100 rows, plus each request's prefill amortised over its output; needs --prompt-tokens and --output-tokens). Default: off, the bare GPU step."),
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", help="With --serving: the requests' mean prompt length (tokens), prefilled once per request."),
    output_tokens: Optional[int] = typer.Option(None, "--output-tokens", help="With --serving: the requests' mean output length (tokens), over which each prefill is amortised."),
    logits: Optional[str] = typer.Option(None, "--logits", help="Inference: the LM head's positions, last (default: the last position's, as generation computes them) or all (every position, a plain forward)."),
    strategy: Optional[str] = typer.Option(None, "--strategy", help="A strategy string as `wattcast search` prints it (e.g. tp2-pp1-dp32-cp1-ep1-mb2-ga8-zero1-v1-sp-rcnone-1f1b): sets the parallel options, --gpus and (with ga) --batch; needs --cluster."),
    cudnn_tf32: bool = typer.Option(True, "--cudnn-tf32/--no-cudnn-tf32", help="With --dtype fp32 on a GPU with TF32 tensor cores: run the model's convolutions in TF32, as PyTorch does by default (torch.backends.cudnn.allow_tf32 = True; those with input channels not a multiple of 4 stay FP32), or keep them FP32 (--no-cudnn-tf32, allow_tf32 = False). One device; the result's conv_math says what was costed."),
    models: Optional[Path] = _MODELS_OPTION,
    collectives: Optional[Path] = _COLLECTIVES_MODEL_OPTION,
    power_model: Optional[Path] = _POWER_MODEL_OPTION,
) -> None:
    """Predict one training step (or inference pass) of a model on one device or a cluster.

    With --cluster (and --gpus), --batch is the global batch in sequences and the step runs under the
    parallel strategy given by --tp/--pp/--dp/--micro-batch/--zero/--sp/--ep/--interleave, or by --strategy."""
    flags = SimpleNamespace(**locals())  # the parsed flags by name (the first statement: nothing else is defined yet)
    flags.grad_accum_dtype = _grad_accum_flag(flags.framework, flags.grad_accum_dtype, flags.grad_reduce_in_bf16)
    req = _predict_request(ctx, flags)
    res = _request_prediction(req)
    if req.distributed and req.kv_context is None:
        _show_cluster_prediction(res, req, flags)
    else:
        _show_step_prediction(res, flags)


_RUN_FLAGS_MESSAGE = ("--region/--pue/--lifetime-years/--grid-kgco2e-per-kwh/--cloud-usd-per-gpu-hour/--mtbf-gpu-hours/"
                      "--checkpoint-write-s/--pricing/--electricity-usd-per-kwh describe a run: give --tokens too")
_PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".tif", ".tiff", ".webp", ".eps", ".ps")


def _predict_request(ctx, f):
    """`predict`'s flags ``f`` as one :class:`wattcast.request.PredictRequest`, or a clear error naming the flag
    (all checked before any work is done)."""
    from wattcast.request import RunOptions

    run = RunOptions(tokens=f.tokens, region=f.region, pue=f.pue, lifetime_years=f.lifetime_years,
                     grid_kgco2e_per_kwh=f.grid_kgco2e_per_kwh, cloud_usd_per_gpu_hour=f.cloud_usd_per_gpu_hour,
                     mtbf_gpu_hours=f.mtbf_gpu_hours, checkpoint_write_s=f.checkpoint_write_s, pricing=f.pricing,
                     electricity_usd_per_kwh=f.electricity_usd_per_kwh)
    if run.given_without_tokens():
        _fail(_RUN_FLAGS_MESSAGE)
    _check_pricing_flag(f.pricing)
    par = _parallel_flags(ctx, f)
    from wattcast.featurize.workload import INFERENCE_MODES
    from wattcast.request import check_inference_options

    if str(f.mode).lower() in INFERENCE_MODES:
        try:  # the check wattcast.predict makes (there with the API's default optimizer allowed)
            check_inference_options(f.mode, optimizer=f.optimizer, recompute=par["recompute"],
                                    optimizer_impl=f.optimizer_impl, cli=True)
        except ValueError as e:
            _fail(str(e))
    elif f.kv_context is not None:
        _fail("--kv-context describes an inference step with a KV cache (--mode inference); a training step has none")
    elif f.logits is not None and str(f.logits).lower() != "all":
        _fail("--logits last applies to --mode inference: a training step's loss reads the logits of every position")
    if f.kv_context is not None and f.kv_context < 0:
        _fail(f"--kv-context must be a whole number >= 0 (tokens already in the KV cache), got {f.kv_context}")
    dims = _dims(f.dim)
    _predict_outputs(f)
    folders = _model_folders(f.models, f.collectives, f.power_model)
    common = dict(model=f.model, device=f.device, mode=f.mode, models=folders.models, collectives=folders.collectives,
                  power_model=folders.power_model,
                  dtype=_dtype_flag(f.dtype, device=f.device, clusters=[f.cluster] if f.cluster is not None else []),
                  attention=f.attention, compile=f.compile,
                  optimizer=f.optimizer or DEFAULTS.optimizer, recompute=par.pop("recompute"),
                  power_limit_w=f.power_limit_w, clock_cap_mhz=f.clock_cap_mhz, run=run, fp8_recipe=f.fp8_recipe,
                  optimizer_impl=f.optimizer_impl, host_us=_host_us_flag(f.host_us))
    if f.cluster is not None or par["gpus"] is not None:
        if dims:
            _fail("--dim applies to single-device predictions of ONNX models")
        if f.kv_context is None and (f.logits is not None or f.serving is not None or f.prompt_tokens is not None
                                     or f.output_tokens is not None):
            _fail("--logits/--serving/--prompt-tokens/--output-tokens on a cluster describe KV-cached inference on one "
                  "node's tensor-parallel group: give --kv-context (and --mode inference) too")
        return _cluster_request(f, par, common)
    return _step_request(f, par, dims, common)


def _host_us_flag(v: float | None) -> float | None:
    """--host-us checked (finite, >= 0; a clear error naming the flag), None when not given."""
    if v is None:
        return None
    from wattcast.simulate.single_device import check_host_us

    try:
        return check_host_us(v)
    except ValueError:
        _fail(f"--host-us must be a finite number of microseconds >= 0 (the host's time per kernel launch; 35-170 us "
              f"measured), got {v}")


def _predict_inputs(f) -> dict[str, Path]:
    """The files `predict` reads, by flag: the model (a file, or a folder's config.json), a device spec file and a
    cluster file (names of built-ins and Hub ids are not files and are left out)."""
    out = {}
    for flag, v in (("--model", f.model), ("--device", f.device), ("--cluster", f.cluster)):
        if v is None:
            continue
        p = Path(str(v)).expanduser()
        if p.is_dir():
            p = p / "config.json"
        if p.is_file():
            out[flag] = p
    return out


def _predict_outputs(f) -> None:
    """--trace / --plot: never one of the inputs (symlinks and hard links resolved), never the same file twice, an
    existing file only with --overwrite (as `kernels --output`); checked before any work, so nothing is written."""
    inputs = _predict_inputs(f)
    outs = [(flag, path, suf) for flag, path, suf in (("--trace", f.trace, ()), ("--plot", f.plot, _PLOT_SUFFIXES)) if path]
    for flag, path, _ in outs:
        for src, p in inputs.items():
            if _same_file(path, p):
                _fail(f"{flag} {path} is the {src} input file ({p}); refusing to overwrite it: give another file name")
    if len(outs) == 2 and (_same_file(outs[0][1], outs[1][1]) or
                           Path(outs[0][1]).expanduser().absolute() == Path(outs[1][1]).expanduser().absolute()):
        _fail(f"--trace and --plot name the same file {outs[0][1]}; give each its own")
    for flag, path, suf in outs:
        _output_file(path, flag, suf, overwrite=bool(f.overwrite))


def _cp_sizes_flag(text):
    """--hierarchical-cp-sizes A,B as (A, B); None when not given (a malformed value: a CLI error naming it)."""
    from wattcast.simulate.parallel import cp_sizes_pair

    if text is None:
        return None
    pair = cp_sizes_pair(str(text))
    if pair is None:
        _fail(f"--hierarchical-cp-sizes must be two positive integers A,B (inner a2a size, outer ring size), got {text!r}")
    return pair


def _list_elements(values) -> list[str]:
    """A repeatable flag's values with each value's comma-separated elements spread out (--cp 2,4 --cp 8: 2, 4, 8)."""
    return [e.strip() for v in (values or ()) for e in str(v).split(",")]


def _int_list_flag(values, flag: str, minimum: int = 1) -> tuple[int, ...] | None:
    """A repeatable integer flag (``--cp 2 --cp 4`` or ``--cp 2,4``) as a tuple; None when not given; a bad element is
    a CLI error naming the flag and the element."""
    if not values:
        return None
    out = []
    for e in _list_elements(values):
        if not e.lstrip("-").isdigit() or int(e) < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
            _fail(f"{flag}: every value must be {what}, got {e!r} (repeat the flag or separate values by commas, "
                  f"e.g. {flag} {minimum + 1},{minimum + 3} or {flag} {minimum + 1} {flag} {minimum + 3})")
        out.append(int(e))
    return tuple(out)


#: what a boolean list flag (search's --sp) takes for on and for off, case aside
_BOOL_WORDS = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}


def _bool_list_flag(values, flag: str) -> tuple[bool, ...] | None:
    """A repeatable on/off flag (search's ``--sp on,off``; true/false, yes/no, 1/0 alike) as a tuple of choices, each
    once; None when not given; a bad element is a CLI error naming the flag and the element."""
    if not values:
        return None
    out: list[bool] = []
    for e in _list_elements(values):
        v = _BOOL_WORDS.get(e.lower())
        if v is None:
            _fail(f"{flag}: every value must be on or off (true/false, yes/no, 1/0), got {e!r} (repeat the flag or "
                  f"separate values by commas, e.g. {flag} on,off)")
        if v not in out:
            out.append(v)
    return tuple(out)


def _recompute_list_flag(values, modules: str | None) -> tuple[str, ...] | None:
    """search's ``--recompute none,selective,full`` (repeatable) with ``--recompute-modules`` as the search's recompute
    choices: each element a mode (featurize/recompute.py), the selective one with the modules when given; without
    --recompute, --recompute-modules searches none, selective on those modules and full (as since it came). None when
    neither is given (the search's default). A bad element, or modules without a selective choice, is a CLI error
    naming the flag."""
    from wattcast.featurize.recompute import RecomputeError, recompute_setting

    if not values:
        return ("none", _recompute_flag("selective", modules), "full") if modules else None
    out: list[str] = []
    for e in _list_elements(values):
        if e.lower() not in ("none", "selective", "full"):
            _fail(f"--recompute: every value must be none, selective or full, got {e!r} (repeat the flag or separate "
                  "values by commas, e.g. --recompute none,full; the selective candidates' modules go in "
                  "--recompute-modules)")
        try:
            v = recompute_setting(e.lower(), modules if e.lower() == "selective" else None)
        except RecomputeError as err:
            _fail(f"--recompute/--recompute-modules: {err}")
        if v not in out:
            out.append(v)
    if modules and not any(v.startswith("selective") for v in out):
        _fail(f"--recompute-modules sets what the selective candidates recompute, but --recompute "
              f"{','.join(out)} has no selective choice: add selective (--recompute {','.join(out)},selective) or "
              "drop --recompute-modules")
    return tuple(out)


def _str_list_flag(values) -> tuple[str, ...] | None:
    """A repeatable text flag (``--cp-comm-type p2p --cp-comm-type a2a`` or ``p2p,a2a``) as a tuple; None when not given
    (the search checks each element, naming it)."""
    return tuple(_list_elements(values)) or None


def _parallel_flags(ctx, f) -> dict:
    """The parallel flags (and --batch, --recompute, --schedule) by their strategy names, merged with --strategy."""
    values = dict(gpus=f.gpus, batch=f.batch, tp=f.tp, pp=f.pp, dp=f.dp, micro_batch=f.micro_batch, zero=f.zero, sp=f.sp,
                  ep=f.ep, interleave=f.interleave, recompute=_recompute_flag(f.recompute, f.recompute_modules),
                  schedule=f.schedule, cp=f.cp,
                  pp_first_layers=f.pp_first_stage_layers, pp_last_layers=f.pp_last_stage_layers,
                  overlap_grad_reduce=f.overlap_grad_reduce, overlap_param_gather=f.overlap_param_gather,
                  tp_comm_overlap=f.tp_comm_overlap, overlap_moe_expert_parallel_comm=f.overlap_moe_expert_parallel_comm,
                  overlap_p2p_comm=f.overlap_p2p_comm, async_tp_comm=f.async_tp_comm,
                  recompute_num_layers=f.recompute_num_layers, recompute_method=f.recompute_method, etp=f.etp,
                  cp_comm_type=f.cp_comm_type, hierarchical_cp_sizes=_cp_sizes_flag(f.hierarchical_cp_sizes))
    if f.strategy is None:
        return values
    if f.cluster is None:
        _fail("--strategy names a parallel strategy: it needs --cluster NAME|FILE")
    values = dict(_strategy_options(ctx, f.strategy, values))
    if values.get("batch") is None:
        _fail("--strategy without ga<N> (micro-batches per step) needs --batch (the global batch)")
    return values


def _recompute_flag(recompute: str, modules: str | None) -> str:
    """--recompute with --recompute-modules as one setting (featurize/recompute.py), or a clear error."""
    from wattcast.featurize.recompute import RecomputeError, recompute_setting

    try:
        return recompute_setting(recompute, modules)
    except RecomputeError as e:
        _fail(f"--recompute/--recompute-modules: {e}")


def _dims(given: list[str]) -> dict[str, int]:
    """--dim NAME=VALUE flags as {name: value}."""
    dims = {}
    for d in given:
        k, sep, v = d.partition("=")
        if not sep or not k.strip() or not v.strip().lstrip("-").isdigit():
            _fail(f"--dim {d!r}: use NAME=VALUE with an integer value, e.g. --dim past_len=128")
        dims[k.strip()] = int(v)
    return dims


def _grad_accum_flag(framework: str, grad_accum_dtype: str | None, grad_reduce_in_bf16: bool) -> str | None:
    """--grad-accum-dtype with --grad-reduce-in-bf16 folded in (Megatron-LM's flag is the bf16 of wattcast's one
    gradient-accumulation dtype under --framework megatron): simulate.distributed.folded_grad_accum_dtype, its
    ValueError (another framework, or another --grad-accum-dtype) a CLI error."""
    from wattcast.simulate.distributed import folded_grad_accum_dtype

    try:
        return folded_grad_accum_dtype(framework, grad_accum_dtype, grad_reduce_in_bf16)
    except ValueError as e:
        _fail(str(e))


def _cluster_request(f, par: dict, common: dict):
    """A distributed request (--cluster): --batch is the global batch (default 1), --gpus defaults to tp x pp x dp."""
    from wattcast.request import ParallelOptions, PredictRequest

    if f.cluster is None:
        _fail("--gpus needs --cluster NAME|FILE (presets: wattcast clusters)")
    if not f.cudnn_tf32:
        _fail("--no-cudnn-tf32 applies to one device (a CNN step); a cluster step costs an fp32 model's convolutions as "
              "PyTorch's default runs them (TF32 where the GPU has it)")
    if str(f.mode).lower() not in ("train", "training") and f.kv_context is None:
        _fail("distributed prediction is for training steps (--mode train), or KV-cached inference on one node's "
              "tensor-parallel group (--mode inference --kv-context N --tp TP --gpus TP)")
    batch = par.pop("batch")
    from wattcast.featurize.workload import is_onnx_path

    # seq not given: 1,024, or an ONNX file's own (predict_cluster decides: its fixed sequence dim, none for an MLP or
    # a CNN; until stop 54 1,024 was applied to every ONNX file)
    batch = 1 if batch is None else batch
    seq = f.seq if f.seq is not None or is_onnx_path(common["model"]) else 1024
    _positive(gpus=par["gpus"], batch=batch, seq=seq)
    if par["gpus"] is None:
        par["gpus"] = par["tp"] * par["pp"] * (par["dp"] or 1)
    parallel = ParallelOptions(pp_first_stage_layers=par.pop("pp_first_layers"),
                               pp_last_stage_layers=par.pop("pp_last_layers"), **par)
    return PredictRequest(cluster=f.cluster, parallel=parallel, batch=batch, seq=seq, framework=f.framework,
                          timeline=bool(f.trace or f.plot), loop_trip_count=f.loop_trip_count,
                          moe_load_imbalance=f.moe_load_imbalance, moe_capacity_factor=f.moe_expert_capacity_factor,
                          moe_pad_to_capacity=f.moe_pad_expert_input_to_capacity,
                          moe_token_dispatcher=f.moe_token_dispatcher_type, gpus_per_node=f.gpus_per_node,
                          zero3_prefetch=f.zero3_prefetch, fsdp_reduce_dtype=f.fsdp_reduce_dtype,
                          scatter_gather_p2p=f.scatter_gather_p2p, grad_accum_dtype=f.grad_accum_dtype,
                          data_load_ms=f.data_load_ms, data_workers=f.data_workers,
                          fp8_param_gather=f.fp8_param_gather, mtp_num_layers=f.mtp_num_layers,
                          cross_entropy_loss_fusion=f.cross_entropy_loss_fusion,
                          cross_entropy_fusion_impl=f.cross_entropy_fusion_impl, kv_context=f.kv_context,
                          logits=f.logits, serving=f.serving, prompt_tokens=f.prompt_tokens,
                          output_tokens=f.output_tokens, **common)


def _step_request(f, par: dict, dims: dict, common: dict):
    """A single-device request: parallel, pipeline and cluster-only flags are refused rather than ignored."""
    from wattcast.request import PredictRequest
    from wattcast.simulate.overlap import OVERLAP_FLAGS

    if any(par[k] != d for k, d in (("tp", 1), ("pp", 1), ("zero", 0), ("ep", 1), ("interleave", 1), ("cp", 1))) \
            or par["dp"] or par["micro_batch"] or par["sp"] \
            or par["pp_first_layers"] is not None or par["pp_last_layers"] is not None \
            or par["recompute_num_layers"] is not None or par["recompute_method"] is not None or par["etp"] is not None \
            or any(par[k] is not None for k in OVERLAP_FLAGS):
        _fail("parallel options (--tp/--pp/--dp/--cp/--micro-batch/--zero/--sp/--ep/--interleave/--pp-first-stage-layers/"
              "--pp-last-stage-layers/--recompute-num-layers/--recompute-method/--expert-tensor-parallel-size/--overlap-*/"
              "--tp-comm-overlap/--async-tp-comm) need --cluster and --gpus")
    if str(par.get("cp_comm_type") or "p2p").lower() != "p2p" or par.get("hierarchical_cp_sizes") is not None:
        _fail("--cp-comm-type/--hierarchical-cp-sizes say how context parallelism communicates: they need --cluster, "
              "--gpus and --cp > 1")
    if par["schedule"] != "1f1b":
        _fail("--schedule is a pipeline schedule: it needs --cluster and --pp")
    if f.gpus_per_node is not None:
        _fail("--gpus-per-node says how much of each node of a cluster a job uses: it needs --cluster and --gpus")
    if f.zero3_prefetch is not None:
        _fail("--zero3-prefetch/--no-zero3-prefetch say how FSDP's collectives (ZeRO-3, or ZeRO-2 as SHARD_GRAD_OP under "
              "--framework hf) meet the computation: they need --cluster, --gpus and --zero 3 (or --zero 2 with "
              "--framework hf)")
    if f.scatter_gather_p2p is not None:
        _fail("--scatter-gather-p2p/--no-scatter-gather-p2p say how pipeline transfers cross nodes: they need --cluster, "
              "--gpus and --pp")
    if f.fsdp_reduce_dtype is not None:
        _fail("--fsdp-reduce-dtype is PyTorch FSDP's gradient reduce-scatter dtype: it needs --cluster, --gpus, --zero 3 "
              "or 2 (FSDP's FULL_SHARD or SHARD_GRAD_OP) and --framework hf")
    if f.grad_accum_dtype is not None:
        _fail("--grad-accum-dtype / --grad-reduce-in-bf16 is the gradient-accumulation dtype of a distributed step: "
              "it needs --cluster, --gpus and --framework megatron-deepspeed (DeepSpeed's) or megatron (Megatron-LM's "
              "main gradients)")
    if f.mtp_num_layers:
        _fail("--mtp-num-layers is Megatron-Core's multi-token prediction: it needs --cluster, --gpus and --framework "
              "megatron")
    if f.fp8_param_gather:
        _fail("--fp8-param-gather is the distributed optimizer's FP8 parameter gather: it needs --cluster, --gpus, "
              "--zero 1 or more, --dtype fp8 and --framework megatron")
    if f.cross_entropy_loss_fusion is not None or str(f.cross_entropy_fusion_impl).lower() != "native":
        _fail("--cross-entropy-loss-fusion/--cross-entropy-fusion-impl are Megatron-Core's fused loss: they need "
              "--cluster, --gpus and --framework megatron")
    from wattcast.simulate.moe_routing import given_routing

    if given_routing(dict(moe_load_imbalance=f.moe_load_imbalance, moe_capacity_factor=f.moe_expert_capacity_factor,
                          moe_pad_to_capacity=f.moe_pad_expert_input_to_capacity)):
        _fail("--moe-load-imbalance/--moe-expert-capacity-factor/--moe-pad-expert-input-to-capacity describe the "
              "expert-parallel ranks of a cluster step: they need --cluster and --gpus")
    if str(f.moe_token_dispatcher_type).lower() != "alltoall":
        _fail("--moe-token-dispatcher-type is Megatron-Core's MoE layer on a cluster: it needs --cluster, --gpus and "
              "--framework megatron")
    if f.plot:
        _fail("--plot draws the distributed timeline (--cluster); for one device use --trace (Chrome trace)")
    if f.device is None:
        _fail("--device is required (or --cluster for a distributed prediction)")
    if str(f.framework).lower() != "hf":
        _fail("--framework applies to distributed predictions (--cluster); one device uses Hugging Face's eager kernels")
    return PredictRequest(batch=par["batch"], seq=f.seq, dims=tuple(dims.items()), loop_trip_count=f.loop_trip_count,
                          data_load_ms=f.data_load_ms, data_workers=f.data_workers, kv_context=f.kv_context,
                          logits=f.logits, serving=f.serving, prompt_tokens=f.prompt_tokens,
                          output_tokens=f.output_tokens, cudnn_tf32=bool(f.cudnn_tf32), **common)


def _request_prediction(req):
    """``req`` predicted by the Python API (``wattcast.predict`` / ``wattcast.predict_cluster``); its errors become
    one-line messages."""
    from wattcast.data.cluster_spec import ClusterSpecError
    from wattcast.data.device_spec import DeviceSpecError
    from wattcast.featurize.op_graph import GraphError
    from wattcast.request import StepTokensUnknownError

    try:
        return req.predict()
    except StepTokensUnknownError as e:
        why = ("this ONNX model has no sequence axis (an MLP's or an image model's input)" if "no sequence axis" in str(e)
               else "this ONNX graph's batch and sequence dims are fixed by the file and not named batch/sequence")
        _fail(f"--tokens needs the step's tokens: {why}, so wattcast cannot tell how many tokens a step trains on")
    except (GraphError, DeviceSpecError, ClusterSpecError, FileNotFoundError, ValueError) as e:
        _fail(str(e))


def _show_step_prediction(res, f) -> None:
    """A single-device prediction: warnings, --trace, the JSON or tables, and the out-of-memory exit (code 3)."""
    # (ops without a cost model are one of the graph's warnings: featurize.op_graph.unmapped_ops_warning)
    _print_warnings(res.meta.get("warnings"))
    if f.trace:
        from wattcast.simulate.trace import write_chrome_trace

        _write("--trace", f.trace, lambda: write_chrome_trace(res, f.trace))
    if f.as_json:
        _print_json(res)
    else:
        _print_prediction(res)
        if res.run is not None:
            _print_run(res.run)
    capacity_gb = res.memory_capacity_gb
    refused = not res.fits and not f.allow_oom
    _warn_memory(res, refused=refused)
    if refused:
        m = res.memory
        _fail(f"does not fit: predicted {res.memory_gb:.1f} GB on {res.device} with "
              f"{_gb_and_gib(capacity_gb)} (weights {m.weights_gb:.1f}, gradients {m.gradients_gb:.1f}, optimizer "
              f"{m.optimizer_gb:.1f}, activations {m.activations_gb:.1f}, largest kernel {m.transient_gb:.1f} GB"
              + (f", KV cache {m.kv_cache_gb:.1f} GB" if m.kv_cache_gb else "") + "); "
              + _tight_refusal(res) + _oom_hint(f.mode, getattr(f, "kv_context", None)), code=3)


def _oom_hint(mode, kv_context) -> str:
    """What to change when one device's step does not fit: an inference step has no recomputation (refused there) and
    its KV cache grows with --kv-context."""
    from wattcast.featurize.workload import INFERENCE_MODES

    if str(mode).lower() in INFERENCE_MODES:
        return ("lower --batch" + (", --kv-context or --seq" if kv_context is not None else " or --seq")
                + ", use a smaller --dtype or more GPUs (--cluster with --tp), or pass --allow-oom")
    return "lower --batch/--seq, use --recompute, a smaller --dtype, or pass --allow-oom"


def _print_warnings(warnings) -> None:
    """Warnings on stderr: a prediction's (``meta["warnings"]``: a sequence beyond a RoPE model's positions, ...) or a
    search's (``SearchResult.warnings``)."""
    for w in warnings or ():
        err.print(f"warning: {w}", style="yellow")


#: predict's parallel options as the strategy names them -> their flags
_STRATEGY_FLAGS = dict(gpus="--gpus", batch="--batch", tp="--tp", pp="--pp", dp="--dp", micro_batch="--micro-batch", zero="--zero",
                       sp="--sp", ep="--ep", interleave="--interleave", recompute="--recompute", schedule="--schedule", cp="--cp",
                       pp_first_layers="--pp-first-stage-layers", pp_last_layers="--pp-last-stage-layers",
                       overlap_grad_reduce="--overlap-grad-reduce", overlap_param_gather="--overlap-param-gather",
                       tp_comm_overlap="--tp-comm-overlap",
                       overlap_moe_expert_parallel_comm="--overlap-moe-expert-parallel-comm",
                       overlap_p2p_comm="--overlap-p2p-communication", async_tp_comm="--async-tp-comm",
                       recompute_num_layers="--recompute-num-layers", recompute_method="--recompute-method",
                       etp="--expert-tensor-parallel-size", cp_comm_type="--cp-comm-type",
                       hierarchical_cp_sizes="--hierarchical-cp-sizes")
_STRATEGY_PARAMS = dict(pp_first_layers="pp_first_stage_layers", pp_last_layers="pp_last_stage_layers")


def _strategy_options(ctx, text: str, values: dict) -> dict:
    """--strategy merged with the parallel flags given on the command line (a flag that disagrees is an error naming
    it; a malformed string names the bad token)."""
    from wattcast.simulate.strategy import StrategyError, strategy_values

    given = {}
    for k, v in values.items():
        src = ctx.get_parameter_source(_STRATEGY_PARAMS.get(k, k)) if ctx is not None else None
        # typer may bundle its own click: the source is compared by name
        if getattr(src, "name", None) in ("COMMANDLINE", "ENVIRONMENT") and v is not None:
            given[k] = v
    try:
        return strategy_values(text, given, label=lambda k: _STRATEGY_FLAGS[k])
    except StrategyError as e:
        _fail(f"--strategy: {e}")


def _tight_refusal(res) -> str:
    """The part of a "does not fit" refusal (exit 3) that says the prediction is over capacity by less than the
    memory estimate's error (``memory_flag`` "tight", :data:`~wattcast.simulate.memory.TIGHT_MEMORY_FRACTION`), so
    the refusal does not read as certain; empty when the step is plainly over. One verdict: the separate "memory is
    tight" warning is not printed beside a refusal (``_warn_memory(refused=True)``)."""
    from wattcast.simulate.memory import TIGHT_MEMORY_FRACTION

    if res.memory_flag != "tight":
        return ""
    gb, cap = res.memory_gb, res.memory_capacity_gb
    return (f"predicted {gb:.1f} GB of {cap:.1f} GB: over by {100 * (gb / cap - 1):.1f}%, inside the "
            f"\u00b1{100 * TIGHT_MEMORY_FRACTION:.0f}% the memory estimate cannot resolve (allocator fragmentation and "
            "framework buffers are not modelled), so it may run: check on the hardware (--allow-oom predicts it "
            "anyway); to be sure it fits, ")


def _warn_memory(res, *, refused: bool = False) -> None:
    """Say when the memory prediction is near the device's capacity (``res.memory_flag``); not the "tight" warning
    when the step is refused (``refused``: over capacity without --allow-oom), whose message says it instead
    (:func:`_tight_refusal`)."""
    from wattcast.simulate.memory import MEMORY_PRESSURE_FRACTION, TIGHT_MEMORY_FRACTION

    gb, cap = res.memory_gb, res.memory_capacity_gb
    if res.memory_flag == "tight" and refused:
        return
    if res.memory_flag == "tight":
        err.print(f"memory is tight: predicted {gb:.1f} GB of {_gb_and_gib(cap)}, within "
                  f"{100 * TIGHT_MEMORY_FRACTION:.0f}% of capacity, where the estimate cannot tell fitting from not "
                  "(allocator fragmentation and framework buffers are not modelled); check on the hardware", style="yellow")
    elif res.memory_flag == "pressure":
        err.print(f"memory pressure: predicted {gb:.1f} GB is {100 * gb / cap:.0f}% of {cap:.1f} GB "
                  f"({cap * 1e9 / 2**30:.0f} GiB; from "
                  f"{100 * MEMORY_PRESSURE_FRACTION:.0f}%); eager training steps this close to capacity ran their forward "
                  "pass 1.8-2.8x slower than its kernels on the measured GPUs (allocator frees and retries), so the step "
                  "time may be underestimated", style="yellow")


def _print_json(res) -> None:
    """One JSON object: the prediction (``to_dict``, with ``run`` and ``run_details`` when --tokens was given, the
    ``settings`` it ran with and an always-present ``warnings``)."""
    print(json.dumps(res.to_dict(), indent=2, default=str))


def _print_run(run) -> None:
    from wattcast.lifecycle import format_footprint

    # plain text: the "[power source]" in brackets is not rich markup (it would vanish)
    Console().print(format_footprint(run), highlight=False)


def _show_cluster_prediction(res, req, f) -> None:
    """A distributed prediction: warnings, --trace, --plot, the JSON or tables, and the out-of-memory exit (code 3)."""
    _print_warnings(res.meta.get("warnings"))
    if f.trace:
        from wattcast.simulate.trace import write_distributed_trace

        _write("--trace", f.trace, lambda: write_distributed_trace(res, f.trace))
    if f.plot:
        from wattcast.simulate.trace import plot_timeline

        _write("--plot", f.plot, lambda: plot_timeline(res, f.plot))
    if f.as_json:
        _print_json(res)
    else:
        _print_cluster_tables(res, req.batch, res.meta.get("settings", {}).get("seq", req.seq))
        if res.run is not None:
            _print_run(res.run)
    capacity_gb = res.memory_capacity_gb
    refused = not res.fits and not f.allow_oom
    _warn_memory(res, refused=refused)
    if refused:
        m = res.memory  # the worst stage's (the JSON's memory): its peak terms sum to its total
        _fail(f"does not fit: stage {m['stage']} needs {m['total_gb']:.1f} GB per GPU on {res.device} with "
              f"{_gb_and_gib(capacity_gb)} ({_peak_terms_text(m)}; {_largest_term_advice(res, m)}); "
              + _tight_refusal(res) + _fitting_flags(req, res)
              + "use --zero, --recompute, more --tp/--pp, a smaller --micro-batch, or pass --allow-oom", code=3)


def _peak_terms_text(m: dict) -> str:
    """A stage's memory (``memory`` / a ``per_device`` row) as the terms of its peak that are not zero, in the JSON's
    ``peak_terms_gb`` names and order, and their sum: "weights 2.0 + gradients 2.0 + ... = 147.0 GB at the backward
    peak"."""
    terms = {k: v for k, v in m["peak_terms_gb"].items() if v > 0}
    phase = "the backward" if m["peak_phase"] == "backward" else "the after-backward (gradient reduction)"
    return (" + ".join(f"{k.removesuffix('_gb')} {v:.1f}" for k, v in terms.items())
            + f" = {sum(terms.values()):.1f} GB at {phase} peak")


def _largest_term_advice(res, m: dict) -> str:
    """What shrinks the largest term of the worst stage's peak (``m``: ``res.memory``), in the flags that exist."""
    terms = m["peak_terms_gb"]
    name = max(terms, key=terms.get)
    p = res.parallel
    fw = str(res.meta.get("settings", {}).get("framework") or res.meta.get("framework") or "")
    holds_loss = p.pp == 1 or m["stage"] == p.pp - 1 or (p.schedule == "dualpipe" and m["stage"] == 0)
    more_tp = "more --tp" + (" with --sp" if fw == "megatron" and not p.sp else "")
    advice = {
        "weights_gb": "--zero 3 shards the weights over data parallel; more --tp/--pp split them",
        "master_weights_gb": "a higher --zero shards the fp32 master weights over data parallel; more --tp/--pp split them",
        "gradients_gb": "--zero 2 or 3 shards the gradients over data parallel; more --tp/--pp split them",
        "optimizer_gb": "--zero 1 or higher shards the optimizer states over data parallel; more --tp/--pp split them",
        "activations_gb": (f"--recompute (selective or full), a smaller --micro-batch, {more_tp}"
                           + (", --cp" if fw == "megatron" else "") + " or more --pp"),
        "transient_gb": ("the largest kernel's working set" + (
            ", here the loss over the logits (micro-batch x seq x vocabulary" + (" / tp" if fw != "hf" else "") + ")"
            if holds_loss else "") + ": a smaller --micro-batch" + (" or more --tp" if fw != "hf" else "")
            + " shrinks it; --recompute and --zero do not"),
        "buffers_gb": "the communication and gradient buffers: more --tp/--pp split them",
        "unsharded_gradients_gb": "a unit's gradients before their reduce-scatter: more --tp/--pp split them",
        "post_backward_buffers_gb": "the gradient reduction's buffers: more --tp/--pp split them",
    }.get(name, "more --tp/--pp")
    return f"the largest, {name.removesuffix('_gb')} {terms[name]:.1f} GB: {advice}"


def _fitting_flags(req, res) -> str:
    """The refusal's first advice: the Megatron-LM flags that change no parallel layout and each alone make the step
    fit, re-predicted (their GB named): ``--grad-reduce-in-bf16`` (bf16 main gradients, 2 B/param instead of 4) when
    the buffer is fp32 under bf16/FP8 parameters, ``--no-tp-comm-overlap`` (no Transformer Engine userbuffers) when
    it is on; empty when neither applies or neither fits."""
    from dataclasses import replace

    p = res.parallel
    tries = []
    if (str(req.framework).lower() == "megatron" and str(req.dtype).lower() in ("bf16", "fp8")
            and res.meta.get("grad_accum_dtype") == "fp32"):
        tries.append(("--grad-reduce-in-bf16", replace(req, grad_accum_dtype="bf16", timeline=False)))
    if p.tp_comm_overlap and req.parallel is not None:
        tries.append(("--no-tp-comm-overlap", replace(req, parallel=replace(req.parallel, tp_comm_overlap=False),
                                                      timeline=False)))
    fit = []
    for flag, alt in tries:
        try:
            r = alt.predict()
        except ValueError:  # a combination the alternative's rules refuse: not advice
            continue
        if r.fits:
            fit.append(f"{flag} ({r.memory_gb:.1f} GB" + (", tight" if r.memory_flag == "tight" else "") + ")")
    return f"pass {' or '.join(fit)} ({'each fits' if len(fit) > 1 else 'it fits'} alone, re-predicted); or " if fit else ""


def _print_band(con: Console, band: dict) -> None:
    """The step's 90% band (simulate/step_band.py), where it has one."""
    if band:
        con.print(f"step time 90% band: {band['low_ms']:.1f} .. {band['high_ms']:.1f} ms ({band['basis']})")


def _print_cluster_tables(res, batch: int, seq: int | None) -> None:
    """The tables of a distributed prediction: totals, exposed communication, per pipeline stage, energy."""
    con = Console()
    from wattcast.simulate.defaults import shown_dtype

    t = Table(title=f"{res.model} on {res.gpus} x {res.device} ({res.cluster}), {res.parallel.describe()}, global batch {batch}{'' if seq is None else f' x seq {seq}'}, {shown_dtype(res.meta)}")
    for c in ("step ms", "MFU", "TFLOP/s/GPU", "HFU", "exposed comm ms", "bubble ms", "memory GB (worst)", "fits"):
        t.add_column(c, justify="right")
    t.add_row(f"{res.step_time_ms:.1f}", f"{100 * res.mfu:.1f}%", f"{res.tflops_per_gpu:.1f}", f"{100 * res.hfu:.1f}%",
              f"{res.exposed_comm_ms:.1f}", f"{res.bubble_ms:.1f}", f"{res.memory_gb:.1f}", "yes" if res.fits else "NO")
    con.print(t)
    _print_band(con, res.step_band)
    split = {k: v for k, v in res.exposed_comm_split_ms.items() if v > 0}
    p = res.parallel
    over = [n for n, on in (("grad reduce", p.overlap_grad_reduce), ("param gather", p.overlap_param_gather),
                            ("TP comm", p.tp_comm_overlap), ("MoE all-to-all", p.overlap_moe_expert_parallel_comm),
                            ("pipeline transfers", p.overlap_p2p_comm and p.interleave > 1),
                            # on only with tp > 1 and not under DualPipe (resolve_parallel); --tp-comm-overlap's
                            # userbuffers pipeline the same collectives instead
                            ("TP backward async", p.async_tp_comm and not p.tp_comm_overlap)) if on]
    con.print("exposed communication by class: " + (", ".join(f"{k} {v:.1f} ms" for k, v in split.items()) or "none")
              + ("; overlapped: " + ", ".join(over) if over else ""))
    dl = res.comm.get("data_loading") or {}
    if dl.get("step_ms", 0) > 0:
        parts = {k: sum(v[f"{k}_ms"] for v in dl["per_micro"].values()) for k in ("loader", "h2d", "broadcast", "kernels")}
        con.print(f"data loading: {dl['step_ms']:.2f} ms of the step on the busiest reading stage (per micro-batch: "
                  + ", ".join(f"{k} {v:.3f} ms" for k, v in parts.items() if v > 0)
                  + f"; {dl['workers']} loader worker(s), {dl['load_ms']:g} ms host load per micro-batch)")
    if res.meta.get("moe_load", 1.0) != 1.0:
        con.print(f"MoE routing: the busiest expert-parallel rank's experts process {res.meta['moe_load']:.2f}x their "
                  "balanced share of tokens (every MoE layer waits for it; energy counts every rank so)")
    _print_cluster_per_op(con, res)
    d = Table(title="per pipeline stage (one GPU of each; GB: the terms of each stage's peak, memory.peak_terms_gb's "
                    "names, which sum to its total)")
    layers = _stage_layers_cells(res)
    from wattcast.simulate.stage_memory import PEAK_TERMS

    # every term of a stage's peak that is not zero on some stage, in the JSON's order (the backward peak's, then the
    # after-backward peak's own); "-" where a stage's peak does not hold it
    order = list(dict.fromkeys(PEAK_TERMS["backward"] + PEAK_TERMS["after_backward"]))
    shown = [k for k in order if any(r["peak_terms_gb"].get(k, 0.0) > 0 for r in res.per_device)]
    for c in ("stage", *(("layers",) if layers else ()), "busy ms", *(k.removesuffix("_gb") for k in shown), "total GB"):
        d.add_column(c, justify="right")
    for r in res.per_device:
        d.add_row(str(r["stage"]), *((layers[r["stage"]],) if layers else ()), f"{r['busy_ms']:.1f}",
                  *(f"{r['peak_terms_gb'][k]:.2f}" if k in r["peak_terms_gb"] else "-" for k in shown),
                  f"{r['memory_gb']:.2f}")
    # piped or captured: room for every column, as search's tables (a terminal fits the table to its width)
    (con if con.is_terminal else Console(width=200)).print(d)
    after = [str(r["stage"]) for r in res.per_device if r["peak_phase"] == "after_backward"]
    if after:
        con.print(f"stage{'s' if len(after) > 1 else ''} {', '.join(after)}: the peak is after the backward (the "
                  "gradient reduction's buffers, the activations freed)")
    con.print(f"energy per step {res.energy_j / 1e3:.2f} kJ (all GPUs), average board power {res.avg_power_w:.0f} W per GPU"
              + (f" under a {res.power_limit_w:g} W limit" if res.power_limit_w else ""))


def _stage_layers_cells(res) -> list[str] | None:
    """Each pipeline stage's (rank's) transformer layers as the per-stage table shows them (``parallel.stage_layers``,
    the chunks in pipeline order): "11=5+6" for a stage's virtual-stage chunks under --interleave, or under DualPipe
    its two stages (s and pp-1-s); None without the split."""
    counts, P, V = res.meta.get("stage_layers"), res.parallel.pp, res.parallel.interleave
    if not counts or len(counts) != P * V:
        return None
    if res.parallel.schedule == "dualpipe":
        parts = [[counts[s], counts[P - 1 - s]] for s in range(P)]
    else:
        parts = [[counts[v * P + s] for v in range(V)] for s in range(P)]
    return [f"{sum(x)}={'+'.join(map(str, x))}" if len(x) > 1 else str(x[0]) for x in parts]


def _launch_gaps_label(settings: dict) -> str:
    """The per-op tables' launch-gaps row, naming the host cost per launch the step assumed (``settings["host_us"]``)
    and how it composes: eager PyTorch's (or torch.compile's) in-order launch queue, or a per-kernel floor max(GPU,
    host) for a served step (vLLM's CUDA graphs) and the Megatron framework presets."""
    h = settings.get("host_us")
    if h is None:
        return "launch gaps (inside the rows above)"
    if settings.get("serving"):  # (host_us is refused with --serving: its host time is the engine's fitted term)
        return f"launch gaps (inside the rows above): each kernel >= {h:g} us, {settings['serving']}'s CUDA graphs"
    if settings.get("framework", "hf") != "hf":
        how = f"each kernel >= {h:g} us of host, the {settings['framework']} preset"
    else:
        how = f"host {h:g} us a launch, {'torch.compile' if settings.get('compile') else 'eager PyTorch'}'s launch queue"
    return f"launch gaps (inside the rows above): {how} (--host-us sets it)"


def _print_cluster_per_op(con: Console, res) -> None:
    """A distributed step's ``per_op`` table: the step's kernels by op class (every micro-batch, the whole model at the
    TP degree, every stage's optimizer step as one of its GPUs runs it: sharded under ZeRO / the distributed optimizer /
    FSDP), the named parts as "of which" lines, shares of the table's total (with pipeline stages it exceeds the step,
    which one GPU spends about 1/pp of)."""
    if not res.per_op:
        return
    total = sum(float(r["time_ms"]) for r in res.per_op)
    n_micro = res.meta.get("n_micro")
    micro = "" if n_micro is None else f"{n_micro} micro-batch{'' if n_micro == 1 else 'es'}, "
    t = Table(title=f"per op class over the step ({micro}the whole model at TP {res.parallel.tp}, one GPU of each "
                    f"stage; total {total:.1f} ms)")
    for c in ("op class", "kernels", "time ms", "share"):
        t.add_column(c, justify="right" if c != "op class" else "left")
    share = lambda ms: f"{100 * ms / max(total, 1e-12):.1f}%"  # noqa: E731
    for r in res.per_op:
        t.add_row(r["op_class"], f"{r['count']:,}", f"{r['time_ms']:.2f}", share(r["time_ms"]))
        for p in r.get("parts") or []:
            label = _PART_LABELS.get(p["name"], p["name"]) + (f" ({p['impl']})" if p.get("impl") else "")
            # (a pass the graph has no kernels for, costed by its bytes, counts none)
            t.add_row(f"  {label}", f"{p['count']:,}" if p["count"] else "", f"{p['time_ms']:.2f}", share(p["time_ms"]),
                      style="dim")
    gap_ms = sum(float(r.get("launch_gap_ms") or 0.0) for r in res.per_op)
    if any("launch_gap_ms" in r for r in res.per_op):
        t.add_row(_launch_gaps_label(res.meta.get("settings") or {}), "", f"{gap_ms:.2f}", share(gap_ms), style="dim")
    con.print(t)


_SEARCH_OUTPUT_SUFFIXES = (".json", ".csv", ".parquet")
#: rows the search table shows without --top
SEARCH_TABLE_TOP = 10


@app.command()
@_forceable
def search(
    model: str = typer.Option(..., "--model", "-m", help="A Hugging Face config.json, a Hub id (org/name) in the local Hugging Face cache, or a built-in name."),
    cluster: List[str] = typer.Option(..., "--cluster", help="Cluster preset name or file; repeat it to compare hardware."),
    gpus: int = typer.Option(..., "--gpus", help="GPUs of the job."),
    batch: int = typer.Option(..., "--batch", "-b", help="Global batch in sequences."),
    seq: int = typer.Option(1024, "--seq", "-s", help="Tokens per sequence (default 1,024, as predict's)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="As for predict (default bf16; fp16 when a cluster's GPU has no BF16)."),
    attention: str = typer.Option(DEFAULTS.attention, "--attention", help="As for predict (default flash)."),
    optimizer: str = typer.Option(DEFAULTS.optimizer, "--optimizer", help="As for predict (default adamw; adamw-bf16: bf16 moments; muon: Muon + AdamW, see predict --help)."),
    optimizer_impl: Optional[str] = typer.Option(None, "--optimizer-impl", help="As for predict: fused (the default) or foreach."),
    max_configs: int = typer.Option(20000, "--max-configs", help="Evaluate at most this many valid configurations per cluster (spread over the whole space; the rows it leaves out are counted in the warnings)."),
    tokens: Optional[float] = typer.Option(None, "--tokens", help="Tokens of the whole run: adds its days, cloud cost, energy, TCO and CO2e."),
    region: Optional[str] = typer.Option(None, "--region", help="Grid region for the run's carbon (with --tokens; `wattcast regions` lists them)."),
    pue: Optional[float] = _PUE_OPTION,
    lifetime_years: Optional[float] = _LIFETIME_OPTION,
    grid_kgco2e_per_kwh: Optional[float] = _GRID_OPTION,
    cloud_usd_per_gpu_hour: Optional[float] = _CLOUD_OPTION,
    mtbf_gpu_hours: Optional[float] = _MTBF_OPTION,
    checkpoint_write_s: Optional[float] = _CHECKPOINT_OPTION,
    pricing: Optional[str] = _PRICING_OPTION,
    electricity_usd_per_kwh: Optional[float] = _ELECTRICITY_OPTION,
    objective: str = typer.Option("time", "--objective", help="Rank by: time (step time, default), cost (the run's cloud cost under --pricing), tco (owned TCO), co2e or energy (the run's; without --tokens the step's energy). All but time and energy need --tokens."),
    max_usd: Optional[float] = typer.Option(None, "--max-usd", help="Keep runs whose cloud cost is at most this (USD; needs --tokens)."),
    deadline_days: Optional[float] = typer.Option(None, "--deadline-days", help="Keep runs that finish within this many days, failures included (needs --tokens)."),
    max_tco2e: Optional[float] = typer.Option(None, "--max-tco2e", help="Keep runs of at most this many tCO2e, embodied included (needs --tokens)."),
    pareto: bool = typer.Option(False, "--pareto", help="Keep only the Pareto front over run time x cloud cost x CO2e (needs --tokens)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write every kept row to FILE (.json, .csv or .parquet, told by the suffix)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Let --output / --plot replace an existing file."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG: run time vs cloud cost, coloured by CO2e, the Pareto front highlighted (needs --tokens; an existing file only with --overwrite)."),
    top: Optional[int] = typer.Option(None, "--top", help="Rows to show: the table's (default 10) and, when given, --json's ranked (default every ranked row; --output writes every row)."),
    as_json: bool = typer.Option(False, "--json", help="Print the ranked table and the Pareto front as JSON."),
    tp: Optional[List[str]] = typer.Option(None, "--tp", help="Tensor-parallel degrees to search (repeatable or comma-separated: --tp 4,8; default every power of two up to the GPUs of a node)."),
    pp: Optional[List[str]] = typer.Option(None, "--pp", help="Pipeline-parallel sizes to search (repeatable or comma-separated: --pp 2,3,6; default every divisor of the GPUs over tp x cp, at most the model's layers)."),
    micro_batch: Optional[List[str]] = typer.Option(None, "--micro-batch", help="Micro-batch sizes to search (repeatable or comma-separated: --micro-batch 1,2; default every power of two up to 16 that divides the batch per data-parallel rank)."),
    cp: Optional[List[str]] = typer.Option(None, "--cp", help="Context-parallel degrees to search (repeatable or comma-separated: --cp 2,4,8; default 1, 2 too from 8,192 tokens per sequence, 4 and 8 from 16,384, 16 from 131,072; --framework megatron only)."),
    cp_comm_type: Optional[List[str]] = typer.Option(None, "--cp-comm-type", help="Megatron-Core/TE context-parallel communication types to search for cp > 1 candidates (repeatable or comma-separated: p2p, a2a, allgather, a2a+p2p; default p2p)."),
    hierarchical_cp_sizes: Optional[str] = typer.Option(None, "--hierarchical-cp-sizes", help="With --cp-comm-type a2a+p2p: A,B = inner all-to-all and outer ring sizes; a2a+p2p is tried on the candidates with cp = A x B."),
    ep: Optional[List[str]] = typer.Option(None, "--ep", help="Expert-parallel degrees to search (repeatable or comma-separated; default 1, and for a mixture-of-experts model every power of two dividing its experts)."),
    etp: Optional[List[str]] = typer.Option(None, "--expert-tensor-parallel-size", "--etp", help="Megatron-Core: the routed experts' tensor-parallel degrees to search (repeatable or comma-separated; default: each candidate's tp, and 1 too for a mixture-of-experts model under --framework megatron; a degree equal to the candidate's tp is that candidate)."),
    moe_load_imbalance: float = typer.Option(1.0, "--moe-load-imbalance", help="MoE routing: the busiest expert-parallel rank's tokens over the mean (1 = balanced)."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="Use this many of each node's GPUs on every cluster (e.g. 64 of an NVL72 rack's 72)."),
    moe_expert_capacity_factor: Optional[float] = typer.Option(None, "--moe-expert-capacity-factor", help="Megatron-Core's expert capacity factor (tokens beyond it dropped)."),
    moe_pad_expert_input_to_capacity: bool = typer.Option(False, "--moe-pad-expert-input-to-capacity", help="Megatron-Core: pad every expert's input to its capacity."),
    moe_token_dispatcher_type: str = typer.Option("alltoall", "--moe-token-dispatcher-type", help="As for predict: Megatron-Core's MoE token dispatcher for every candidate (alltoall or allgather)."),
    mtp_num_layers: int = typer.Option(0, "--mtp-num-layers", help="As for predict: multi-token-prediction depths (Megatron-Core; DeepSeek-V2/V3 configs)."),
    cross_entropy_loss_fusion: Optional[bool] = typer.Option(None, "--cross-entropy-loss-fusion/--no-cross-entropy-loss-fusion", help="As for predict: Megatron-Core's fused cross-entropy loss for every candidate (default on with --framework megatron)."),
    cross_entropy_fusion_impl: str = typer.Option("native", "--cross-entropy-fusion-impl", help="As for predict: native or te."),
    compile: bool = typer.Option(False, "--compile", help="As for predict: cost every candidate as torch.compile runs it (fused elementwise chains, compiled launch cost); recorded in each row's compile column and the JSON settings."),
    fp8_param_gather: bool = typer.Option(False, "--fp8-param-gather", help="As for predict: candidates with --zero >= 1 keep FP8 weights and gather them at 1 B (needs --dtype fp8 --framework megatron)."),
    fp8_recipe: Optional[str] = typer.Option(None, "--fp8-recipe", help="As for predict (with --dtype fp8): delayed (default), tensorwise, mxfp8, blockwise or deepseek for every candidate; a cluster whose GPU cannot run the recipe gets none."),
    memory_headroom_gb: float = typer.Option(0.0, "--memory-headroom-gb", help="A candidate fits only when its predicted worst-stage memory is at most the GPU's capacity less this many GB (default 0): the rows nearest the memory limit are predicted too fast."),
    zero: Optional[List[str]] = typer.Option(None, "--zero", help="ZeRO stages to search (repeatable or comma-separated: 0, 1, 2, 3; default 0 and 1)."),
    interleave: Optional[List[str]] = typer.Option(None, "--interleave", help="Virtual pipeline stages per GPU to search (interleaved 1F1B; repeatable or comma-separated: --interleave 1,2,5; default 1 and 2; above 1 only on the pp > 1 candidates)."),
    pp_first_stage_layers: Optional[int] = typer.Option(None, "--pp-first-stage-layers", help="As for predict, on every pp > 1 candidate: the first pipeline stage's transformer layers (Megatron-Core's decoder_first_pipeline_num_layers; the other stages split the rest evenly). A candidate whose pp / --interleave cannot take it is rejected naming the rule; pp 1 candidates keep none."),
    pp_last_stage_layers: Optional[int] = typer.Option(None, "--pp-last-stage-layers", help="As for predict, on every pp > 1 candidate: the last pipeline stage's transformer layers (Megatron-Core's decoder_last_pipeline_num_layers)."),
    recompute: Optional[List[str]] = typer.Option(None, "--recompute", help="Activation recomputation to search (repeatable or comma-separated: none, selective, full; default none and selective, none and full with --attention flash, the default; --recompute-modules sets the selective candidates' modules)."),
    sp: Optional[List[str]] = typer.Option(None, "--sp", help="Sequence parallelism to search (repeatable or comma-separated: on, off, or both: --sp on,off; default both; on only for the tp > 1 candidates)."),
    zero3_prefetch: Optional[bool] = typer.Option(None, "--zero3-prefetch/--no-zero3-prefetch", help="ZeRO-3 (FSDP) candidates: collectives beside the computation, or in series with it (default: the framework's; in series for hf). Needs ZeRO-3 candidates (--zero 3; or --zero 2 with --framework hf)."),
    scatter_gather_p2p: Optional[bool] = typer.Option(None, "--scatter-gather-p2p/--no-scatter-gather-p2p", help="As for predict, for every candidate: Pipeline transfers scattered over the TP group and all-gathered on arrival (Megatron-LM 2021's --scatter-gather-tensors-in-pipeline, DeepSpeed's PartitionedTensor; default: the framework's, on for megatron-deepspeed, off for megatron; nothing to scatter under --sp)."),
    fsdp_reduce_dtype: Optional[str] = typer.Option(None, "--fsdp-reduce-dtype", help="As for predict: PyTorch FSDP's MixedPrecision.reduce_dtype for the ZeRO-3 candidates under --framework hf (fp32, bf16 or fp16; default: the parameters' dtype)."),
    grad_accum_dtype: Optional[str] = typer.Option(None, "--grad-accum-dtype", help="As for predict, for every candidate under --framework megatron-deepspeed: DeepSpeed's data_types.grad_accum_dtype, fp32 (BF16_Optimizer, the default) or bf16 (at ZeRO-1 the ZeRO optimizer on bf16 gradients); under --framework megatron the main-gradient buffer's dtype (bf16 = --grad-reduce-in-bf16)."),
    grad_reduce_in_bf16: bool = typer.Option(False, "--grad-reduce-in-bf16", help="As for predict, for every candidate: Megatron-LM's bf16 main-gradient buffer (--framework megatron only; = --grad-accum-dtype bf16 there; an error under megatron-deepspeed, whose DeepSpeed option is --grad-accum-dtype bf16)."),
    data_load_ms: float = typer.Option(0.0, "--data-load-ms", help="The data loader's host time per micro-batch, ms (default 0); as `wattcast predict`."),
    data_workers: Optional[int] = typer.Option(None, "--data-workers", help="Data-loader worker processes (default: the framework's)."),
    host_us: Optional[float] = typer.Option(None, "--host-us", help="As for predict, for every candidate: the host's time per kernel launch, us (default 40 with --framework hf, eager PyTorch on the profiled hosts, which measured 35-170 us; with megatron / megatron-deepspeed it replaces their per-kernel floor)."),
    recompute_num_layers: Optional[List[str]] = typer.Option(None, "--recompute-num-layers", help="Also search Megatron's block recomputation of this many layers per pipeline stage (repeatable or comma-separated; adds full recomputation to the choices)."),
    recompute_modules: Optional[str] = typer.Option(None, "--recompute-modules", help="Megatron-Core's selective recomputation modules (as for predict, comma-separated): the selective candidates recompute these (searched besides none and full; with --recompute, its selective choice's modules)."),
    framework: str = typer.Option("hf", "--framework", help="Whose kernels, host costs and overlaps: hf, megatron or megatron-deepspeed."),
    no_overlap: bool = typer.Option(False, "--no-overlap", help="With --framework megatron: none of Megatron-Core's overlaps (grad reduce, param gather, TP comm, MoE all-to-all, the interleaved schedule's pipeline transfers, which then block as in Megatron-LM 2021, and the asynchronous TP backward collective, --no-async-tp-comm: Megatron-LM 2021's synchronous all-reduce)."),
    overlap_grad_reduce: Optional[bool] = typer.Option(None, "--overlap-grad-reduce/--no-overlap-grad-reduce", help="As for predict, for every candidate: Megatron-Core reduces gradient buckets during the last backward (default on with --framework megatron; the --no- form turns it off for every candidate)."),
    overlap_param_gather: Optional[bool] = typer.Option(None, "--overlap-param-gather/--no-overlap-param-gather", help="As for predict: Megatron-Core all-gathers the distributed optimizer's parameters during the next forward (default on with --framework megatron and ZeRO >= 1). The positive form means on wherever allowed (the ZeRO >= 1 candidates; ZeRO 0 ones are still searched), the --no- form off for every candidate."),
    tp_comm_overlap: Optional[bool] = typer.Option(None, "--tp-comm-overlap/--no-tp-comm-overlap", help="As for predict: Megatron-Core/TE pipeline the TP all-gathers/reduce-scatters with their GEMMs (default on with --framework megatron, tp > 1 and SP, the TP group inside one node: off across nodes). The positive form means on wherever allowed (the tp > 1 candidates with SP; the others are still searched), the --no- form off for every candidate."),
    async_tp_comm: Optional[bool] = typer.Option(None, "--async-tp-comm/--no-async-tp-comm", help="As for predict: Megatron: the column-parallel linears' backward TP collective runs beside the weight-gradient GEMM (default on with --framework megatron, as Megatron-Core; off: Megatron-LM 2021's synchronous all-reduce, or --no-async-tensor-model-parallel-allreduce). The positive form means on wherever allowed (the tp > 1 candidates, not DualPipe ones; accepted under every framework), the --no- form off for every candidate."),
    force: bool = _FORCE_OPTION,
    simulate_oom: bool = typer.Option(False, "--simulate-oom", help="Also simulate the steps of configurations that do not fit (slower; by default memory comes first and their times are left empty)."),
    workers: int = typer.Option(min(2, os.cpu_count() or 1), "--workers", help="Processes to evaluate on (default: the CPUs, at most 2); from 400 candidates on they split the search, with the same results as one."),
    exact_pipeline: bool = typer.Option(False, "--exact-pipeline", help="Time every pipeline with the event-driven scheduler (the reference) instead of the closed form where it applies."),
    models: Optional[Path] = _MODELS_OPTION,
    collectives: Optional[Path] = _COLLECTIVES_MODEL_OPTION,
    power_model: Optional[Path] = _POWER_MODEL_OPTION,
) -> None:
    """Evaluate every valid parallel strategy (TP x PP x DP x CP (and its communication type) x EP (and expert TP) x
    micro-batch x ZeRO x SP x recompute x interleave), on one cluster or across several; with --tokens, rank and filter whole runs by time, cost and CO2e."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from wattcast import search as _search
    from wattcast.data.cluster_spec import ClusterSpecError
    from wattcast.simulate.overlap import OVERLAP_FLAGS
    from wattcast.featurize.op_graph import GraphError

    _positive(gpus=gpus, batch=batch, seq=seq, max_configs=max_configs, top=top, workers=workers)
    grad_accum_dtype = _grad_accum_flag(framework, grad_accum_dtype, grad_reduce_in_bf16)
    run_opts = dict(region=region, pue=pue, lifetime_years=lifetime_years, grid_kgco2e_per_kwh=grid_kgco2e_per_kwh,
                    cloud_usd_per_gpu_hour=cloud_usd_per_gpu_hour, mtbf_gpu_hours=mtbf_gpu_hours,
                    checkpoint_write_s=checkpoint_write_s, pricing=pricing, electricity_usd_per_kwh=electricity_usd_per_kwh)
    _check_pricing_flag(pricing)
    if tokens is None:
        given = [f"--{k.replace('_', '-')}" for k, v in run_opts.items() if v is not None]
        given += [f for f, v in (("--max-usd", max_usd), ("--deadline-days", deadline_days), ("--max-tco2e", max_tco2e),
                                 ("--pareto", pareto or None), ("--plot", plot)) if v is not None]
        if str(objective).lower() in ("cost", "tco", "co2e"):
            given.append(f"--objective {objective}")
        if given:
            what = "sets the carbon of a run" if given == ["--region"] else "describe(s) a whole training run"
            _fail(f"{'/'.join(given)} {what}: give --tokens too")
    # an ONNX model is searched with --tp 1 (and --cp / --ep 1): planning.search.graph_model_space names the flags
    if output is not None:
        _output_file(output, "--output", _SEARCH_OUTPUT_SUFFIXES, overwrite=overwrite)
        if output.suffix.lower() == ".parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                _fail("--output .parquet needs pyarrow (pip install pyarrow), or use .csv or .json")
    if plot is not None:
        _output_file(plot, "--plot", (".png",), overwrite=overwrite)  # as --output: an existing file only with --overwrite
    # Megatron-Core's overlaps for every candidate: --no-overlap turns them all off; each flag sets its own (as
    # predict's flags; not given: the framework's default); a positive one only where the candidate's rules allow it
    # (planning.search.candidate_overlaps: on wherever possible, not a filter)
    overlaps = dict.fromkeys(OVERLAP_FLAGS, False) if no_overlap else {}
    for name, flag, v in (("overlap_grad_reduce", "--overlap-grad-reduce", overlap_grad_reduce),
                          ("overlap_param_gather", "--overlap-param-gather", overlap_param_gather),
                          ("tp_comm_overlap", "--tp-comm-overlap", tp_comm_overlap),
                          ("async_tp_comm", "--async-tp-comm", async_tp_comm)):
        if v is None:
            continue
        if no_overlap and v:
            _fail(f"--no-overlap turns every overlap off: it cannot be given with {flag}")
        overlaps[name] = v
    # the repeatable list flags: --cp 2 --cp 4 or --cp 2,4 (or both), each element checked naming the flag
    tp, pp, micro_batch, cp, ep, etp, zero, recompute_num_layers = (
        _int_list_flag(v, flag, minimum=lo) for v, flag, lo in (
            (tp, "--tp", 1), (pp, "--pp", 1), (micro_batch, "--micro-batch", 1),
            (cp, "--cp", 1), (ep, "--ep", 1), (etp, "--expert-tensor-parallel-size", 1), (zero, "--zero", 0),
            (recompute_num_layers, "--recompute-num-layers", 1)))
    interleave = _int_list_flag(interleave, "--interleave", minimum=1)
    sp = _bool_list_flag(sp, "--sp")
    recompute = _recompute_list_flag(recompute, recompute_modules)
    cp_comm_type = _str_list_flag(cp_comm_type)
    try:  # a bad count is named before anything runs (predict's check)
        from wattcast.planning.search import check_stage_layers_option

        check_stage_layers_option(pp_first_stage_layers, pp_last_stage_layers, framework, pp, gpus)
    except ValueError as e:
        _fail(str(e))
    folders = _model_folders(models, collectives, power_model)
    try:
        with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err) as prog:
            task = prog.add_task("evaluating strategies", total=None)

            def progress(done: int, total: int) -> None:  # per cluster: every candidate counts, rejected ones too
                prog.update(task, completed=done, total=total)

            fkw = {k: v for k, v in run_opts.items() if v is not None}
            res = _search(model, list(cluster), gpus, batch, seq, dtype=_dtype_flag(dtype, clusters=list(cluster)),
                          attention=attention, optimizer=optimizer, optimizer_impl=optimizer_impl,
                          max_configs=max_configs,
                          tokens=tokens, footprint_kw=fkw or None,
                          progress=progress,
                          framework=framework,
                          overlaps=overlaps or None,
                          objective=objective, max_usd=max_usd, deadline_days=deadline_days, max_tco2e=max_tco2e,
                          pareto=pareto, prune_oom=not simulate_oom, workers=workers, exact_pipeline=exact_pipeline,
                          models=folders.models, collectives=folders.collectives, power_model=folders.power_model,
                          gpus_per_node=gpus_per_node, zero3_prefetch=zero3_prefetch, data_load_ms=data_load_ms,
                          scatter_gather_p2p=scatter_gather_p2p,
                          fp8_param_gather=fp8_param_gather, fp8_recipe=fp8_recipe, mtp_num_layers=mtp_num_layers,
                          compile=compile, pp_first_stage_layers=pp_first_stage_layers,
                          pp_last_stage_layers=pp_last_stage_layers,
                          cross_entropy_loss_fusion=cross_entropy_loss_fusion,
                          cross_entropy_fusion_impl=cross_entropy_fusion_impl, fsdp_reduce_dtype=fsdp_reduce_dtype,
                          grad_accum_dtype=grad_accum_dtype, memory_headroom_gb=memory_headroom_gb,
                          data_workers=data_workers, host_us=_host_us_flag(host_us),
                          moe_routing=dict(moe_load_imbalance=moe_load_imbalance,
                                           moe_capacity_factor=moe_expert_capacity_factor,
                                           moe_pad_to_capacity=moe_pad_expert_input_to_capacity),
                          moe_token_dispatcher=moe_token_dispatcher_type,
                          **(dict(tp=tp) if tp else {}), **(dict(pp=pp) if pp else {}),
                          **(dict(micro_batch=micro_batch) if micro_batch else {}),
                          **(dict(cp=cp) if cp else {}), **(dict(ep=ep) if ep else {}),
                          **(dict(zero=zero) if zero else {}),
                          **(dict(cp_comm_type=cp_comm_type) if cp_comm_type else {}),
                          **(dict(hierarchical_cp_sizes=_cp_sizes_flag(hierarchical_cp_sizes))
                             if hierarchical_cp_sizes else {}),
                          **(dict(etp=etp) if etp else {}),
                          **(dict(recompute_num_layers=recompute_num_layers) if recompute_num_layers else {}),
                          **(dict(recompute=recompute) if recompute else {}),
                          **(dict(interleave=interleave) if interleave else {}), **(dict(sp=sp) if sp else {}))
    except (GraphError, ClusterSpecError, FileNotFoundError, ValueError) as e:
        _fail(str(e))
    _print_warnings(res.warnings)  # the clusters' and GPUs' own, once (as predict --cluster gives them)
    limits = {"--max-usd": max_usd, "--deadline-days": deadline_days, "--max-tco2e": max_tco2e}
    if res.ranked.empty and res.excluded.empty:
        _fail("no valid configuration: " + (res.invalid_reason() or "none generated"))
    if output is not None:
        _write("--output", output, lambda: _write_table(res.ranked, output))
    if plot is not None and not res.ranked.empty:
        from wattcast.planning.search import plot_runs

        _write("--plot", plot, lambda: plot_runs(res.ranked, plot))
    unranked = _unranked_clusters(res)
    if as_json:
        # a given --top keeps that many rows of the ranking, as the table shows them; ranked_total counts them all
        print(json.dumps({"ranked": _records(res.ranked if top is None else res.ranked.head(top)),
                          "ranked_total": len(res.ranked),
                          "pareto": _records(res.pareto),
                          "rejected": _records(res.rejected), "excluded": _records(res.excluded),
                          "warnings": list(res.warnings), "unranked_clusters": unranked,
                          "dropped_values": list(res.dropped_values),
                          # the options no strategy string records (SearchResult.settings): replay a row with them
                          "settings": dict(res.settings, memory_headroom_gb=memory_headroom_gb),
                          # --pp-first/last-stage-layers as given (null: not), on the pp > 1 candidates (their rows'
                          # pp_first/last_stage_layers columns and strategy ppf/ppl tokens)
                          "pipeline_split": {"pp_first_stage_layers": pp_first_stage_layers,
                                             "pp_last_stage_layers": pp_last_stage_layers}}, indent=2,
                         default=str))
        _fail_if_none_fits(res, limits, memory_headroom_gb)
        return
    con = Console()
    if not con.is_terminal:  # piped or captured: room for every column
        con = Console(width=200)
    many = len(res.clusters) > 1  # the distinct clusters (a repeat is searched once)
    top = SEARCH_TABLE_TOP if top is None else top
    shown = res.ranked.head(top)
    by = {"time": "step time", "cost": f"cloud cost ({pricing or 'on-demand'})", "tco": "TCO", "co2e": "CO2e",
          "energy": "energy"}.get(str(objective).lower(), objective)
    tables = [(f"best {top} of {len(res.ranked)} configurations by {by}"
               + (" (Pareto front: run time x cloud cost x CO2e)" if pareto else ""), shown)]
    if not pareto:
        tables.append(("Pareto front (step time vs memory)", res.pareto))
    for title, frame in tables:
        t = Table(title=title)
        run = "run_hours" in frame
        # (header, key, format); run figures replace the communication columns to keep the table narrow
        cols = ([("cluster", "cluster", "{}")] if many else []) + [
            ("strategy", "strategy", "{}"), ("step ms", "step_time_ms", "{:.1f}"),
            ("90% band ms", "step_time_band_low_ms", "{:.1f}"), ("MFU", "mfu", "{:.1%}"),
            ("GB", "memory_gb", "{:.1f}"), ("fits", "fits", "{}"), ("W/GPU", "avg_power_w", "{:.0f}")] + (
            # run figures to 3 significant figures (_sig): a small run's 6.9e-05 tCO2e is not shown as 0.00
            [("days", "run_days", _sig), ("cloud $", "run_cloud_usd", _sig), ("TCO $", "run_tco_usd", _sig),
             ("MWh", "run_energy_mwh", _sig), ("tCO2e", "run_tco2e", _sig)] if run else
            [("exposed comm ms", "exposed_comm_ms", "{:.1f}"), ("bubble ms", "bubble_ms", "{:.1f}")]) + (
            # the column the ranking uses: without --tokens, --objective energy ranks by the step's energy
            [("step J", "energy_j", "{:,.0f}")] if str(objective).lower() == "energy" and not run else [])
        for head, key, _ in cols:
            t.add_column(head, justify="left" if key in ("cluster", "strategy") else "right",
                         no_wrap=key in ("cluster", "strategy"))
        for r in frame.to_dict("records"):
            cells = []
            for _, k, fmt in cols:
                v = r.get(k)
                fmt = fmt.format if isinstance(fmt, str) else fmt  # a format string, or a function (_sig)
                cell = "" if pd_isna(v) else ("yes" if v else "NO") if k == "fits" else fmt(v)
                if k == "step_time_band_low_ms" and cell:  # the step's 90% band (simulate/step_band.py), low-high
                    cell += "-" + fmt(r.get("step_time_band_high_ms"))
                if k == "memory_gb" and r.get("memory_flag") == "tight":
                    cell += " tight"
                cells.append(cell)
            t.add_row(*cells)
        con.print(t)
    if "run_hours" in res.ranked and len(res.ranked):
        _print_run_sources(con, res.ranked)
    if "memory_flag" in shown and (shown["memory_flag"] == "tight").any():
        con.print("tight: predicted within 5% of the GPU's memory, where the estimate cannot tell fitting from "
                  "not; check on the hardware", style="yellow")
    # rows whose pipeline split Megatron-Core builds only with a split flag (framework megatron, an uneven automatic
    # split: the row's pipeline_layout; predict --strategy warns with the --pp-first/last-stage-layers when they do)
    laid: dict[str, list[str]] = {}  # layout -> the shown rows' strategies with it, once each
    for _, frame in tables:
        for r in frame.to_dict("records") if "pipeline_layout" in frame else ():
            if not (pd_isna(r.get("pp_first_stage_layers")) and pd_isna(r.get("pp_last_stage_layers"))):
                continue  # the split --pp-first/last-stage-layers asked for: those flags build it (said below)
            if isinstance(r.get("pipeline_layout"), str) and r["pipeline_layout"]:
                rows = laid.setdefault(r["pipeline_layout"], [])
                if r["strategy"] not in rows:
                    rows.append(r["strategy"])
    for layout, strategies in laid.items():
        con.print(f"note: {', '.join(strategies)}: an uneven pipeline split, which Megatron-Core builds only with a "
                  f"split flag: --pipeline-model-parallel-layout \"{layout}\" (the row's pipeline_layout; predict "
                  "--strategy names --pp-first/last-stage-layers where those build it)", style="yellow", soft_wrap=True)
    if pp_first_stage_layers is not None or pp_last_stage_layers is not None:
        from wattcast.simulate.parallel import stage_flags_text

        con.print(f"pipeline split: {stage_flags_text(pp_first_stage_layers, pp_last_stage_layers)} on every pp > 1 "
                  "candidate (pp 1 ones have no stages to split; candidates whose pp / interleave cannot take them are "
                  "rejected)", soft_wrap=True)
    if len(res.excluded):
        counts = res.excluded["excluded_by"].value_counts()
        con.print("left out: " + ", ".join(f"{n} by {k}" for k, n in counts.items()))
    for d in res.dropped_values:  # a value asked for (--cp 2, --ep 8, ...) absent from the tables: say why
        con.print(f"note: {d['note']}", style="yellow", soft_wrap=True)
    for name, why in unranked.items():  # a searched cluster absent from the tables: say why
        con.print(f"note: cluster {name} has no valid strategy: {why}", style="yellow", soft_wrap=True)
    for w in res.warnings:  # the model's and the clusters' warnings (also on stderr), beside the tables
        con.print(f"note: {w}", style="yellow", soft_wrap=True)
    _fail_if_none_fits(res, limits, memory_headroom_gb)


def _unranked_clusters(res) -> dict[str, str]:
    """Per searched cluster with no evaluated strategy, why (``SearchResult.unranked_clusters``)."""
    return res.unranked_clusters()


def _records(frame) -> list[dict]:
    """Rows as JSON-ready dicts: a missing figure (NaN) is null, numpy scalars are plain numbers."""
    import numpy as np

    out = []
    for r in frame.to_dict("records"):
        out.append({k: (None if pd_isna(v) else v.item() if isinstance(v, np.generic) else v) for k, v in r.items()})
    return out


def _write_table(frame, path: Path) -> None:
    """``frame`` to ``path`` in the format its suffix names (.json: a list of records, .csv, .parquet)."""
    suf = path.suffix.lower()
    if suf == ".json":
        path.write_text(json.dumps(_records(frame), indent=2, default=str), encoding="utf-8")
    elif suf == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)


def _print_run_sources(con, ranked) -> None:
    """Say where the run's prices and grid intensity come from, and whether they are the region's own (each once)."""
    fit = ranked[ranked["fits"]]
    if fit.empty:
        return
    seen = set()
    for dev, r in fit.drop_duplicates("device").set_index("device").iterrows():
        lines = [
            f"grid {r['grid_kgco2e_per_kwh']:.3f} kgCO2e/kWh, {r['grid_region'] or 'no region'} ({r['grid_basis']}, "
            f"{'site-specific' if r['grid_region_specific'] else 'NOT region-specific'}; source: {r['grid_source']})",
            f"electricity {r['electricity_usd_per_kwh']:g} USD/kWh ("
            f"{'site-specific' if r['electricity_region_specific'] else 'NOT region-specific'}; source: {r['electricity_source']})",
            f"PUE {r['pue']:g}",
            (f"{dev}: cloud price unknown (cloud $ empty; give --cloud-usd-per-gpu-hour)" if pd_isna(r["cloud_usd_per_gpu_hour"])
             else f"{dev}: cloud {r['cloud_usd_per_gpu_hour']:g} USD/GPU-h, {r.get('cloud_pricing', 'on-demand')} "
                  f"(source: {r['cloud_price_source']})")]
        if "accelerator_price_usd" in r and not pd_isna(r["accelerator_price_usd"]):  # TCO's and CO2e's own inputs
            lines += [f"{dev}: purchase USD {r['accelerator_price_usd']:,.0f} per GPU (source: "
                      f"{r['accelerator_price_source']}); embodied {r['embodied_kgco2e_per_gpu']:,.0f} kgCO2e per GPU "
                      "over its life"]
        for line in lines:
            if line not in seen:
                seen.add(line)
                con.print(line, soft_wrap=True)


def _fail_if_none_fits(res, limits: dict | None = None, memory_headroom_gb: float = 0.0) -> None:
    """Exit 3 (as predict does for a configuration that does not fit) when no evaluated strategy fits (with
    ``--memory-headroom-gb``: within the capacity less it, named); exit 1 when some fit but a constraint (--max-usd,
    --deadline-days, --max-tco2e) leaves none, saying what the best would need."""
    import pandas as pd

    every = pd.concat([f for f in (res.ranked, res.excluded) if len(f)]) if len(res.excluded) else res.ranked
    if not every["fits"].any():
        where = (f"within the GPU's capacity less --memory-headroom-gb {memory_headroom_gb:g}" if memory_headroom_gb
                 else "in memory")
        _fail(f"none of the {len(every)} valid configurations fits {where} (smallest: "
              f"{every['memory_gb'].min():.1f} GB per GPU); add GPUs, lower --batch/--seq, or use a larger-memory cluster"
              + (", or a smaller --memory-headroom-gb" if memory_headroom_gb else ""), code=3)
    if res.ranked.empty:
        fit = every[every["fits"]]
        best = []
        # 3 significant figures (_sig): a need of 0.0078 days is not printed as "0.0 days" (as if it were met)
        for flag, col, fmt in (("--max-usd", "run_cloud_usd", "${}"), ("--deadline-days", "run_days", "{} days"),
                               ("--max-tco2e", "run_tco2e", "{} tCO2e")):
            lim = (limits or {}).get(flag)
            if lim is not None and col in fit and fit[col].notna().any() and fit[col].min() > lim:
                best.append(f"{flag} {lim:g}: the best fitting configuration needs {fmt.format(_sig(fit[col].min()))}")
        _fail(f"no configuration meets the constraints ({len(fit)} fit in memory)" + "".join("; " + b for b in best)
              + ("; each can be met alone, but no configuration meets them together" if not best else ""), code=1)


@app.command()
@_forceable
def clusters(
    name: Optional[str] = typer.Argument(None, help="Show one cluster preset (or file)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: the list of presets (one cluster is always JSON)."),
    force: bool = _FORCE_OPTION,
) -> None:
    """List the cluster presets, or show one."""
    from wattcast.data.cluster_spec import ClusterSpecError, list_clusters, resolve_cluster

    if name:
        try:
            c = resolve_cluster(name)
        except ClusterSpecError as e:
            _fail(str(e))
        print(json.dumps(c.to_dict(), indent=2))
        return
    presets = list_clusters()
    if as_json:
        print(json.dumps([c.to_dict() for c in presets], indent=2))
        return
    t = Table(title="wattcast cluster presets")
    for col in ("name", "device", "GPUs/node", "in-node", "GB/s per GPU", "across nodes", "GB/s per GPU"):
        t.add_column(col, no_wrap=col in ("name", "device"))
    for c in presets:
        mesh = " (full mesh)" if c.intra.topology == "full_mesh" else ""
        t.add_row(c.name, c.device, str(c.gpus_per_node), c.intra.kind + mesh, f"{c.intra.bandwidth_gb_per_s:g}",
                  (f"{c.inter.nics_per_node} x {c.inter.nic_bandwidth_gbit_per_s:g} Gb/s {c.inter.kind}" if c.inter else "-"),
                  f"{c.inter_bandwidth_per_gpu_gb_per_s:g}")
    _table_console().print(t)


@app.command()
def sweep(
    spec: Path = typer.Argument(..., help="Sweep spec (YAML): models, clusters, gpus, batch, seq; optional regions, tokens, dtype, attention, framework, objective, top, max_configs, space, output, moe_routing, gpus_per_node, zero3_prefetch, fsdp_reduce_dtype, grad_accum_dtype, grad_reduce_in_bf16, fp8_recipe, scatter_gather_p2p, cross_entropy_loss_fusion, cross_entropy_fusion_impl, data_load_ms, data_workers, optimizer, optimizer_impl, model_folders, cloud_usd_per_gpu_hour, footprint (the README's sweep section)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Output folder of Parquet parts (default: the spec's 'output', else sweep.parquet); a rerun resumes it."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Address of a running Dask scheduler (tcp://host:8786); default: a LocalCluster on this machine."),
    workers: int = typer.Option(2, "--workers", help="LocalCluster worker processes (0: run the tasks in this process, one by one, without Dask)."),
    as_json: bool = typer.Option(False, "--json", help="Print the best row of every task as JSON."),
    backend: str = typer.Option("dask", "--backend", help="dask or ray (optional extra: pip install \"wattcast\\[ray]\"; local Ray with --workers CPUs, or --ray-address)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Address of a running Ray cluster (with --backend ray; e.g. ray://host:10001 or auto)."),
    models: Optional[Path] = typer.Option(None, "--models", help="A retrained kernel surrogate bundle folder (`wattcast train kernels --out FOLDER`) for every task, over the spec's model_folders (default: $WATTCAST_MODELS, else the shipped one)."),
    collectives: Optional[Path] = typer.Option(None, "--collectives", help="A retrained collective model folder for every task, over the spec's model_folders (default: $WATTCAST_COLLECTIVES, else the shipped one)."),
    power_model: Optional[Path] = typer.Option(None, "--power-model", help="A retrained power model folder for every task, over the spec's model_folders (default: $WATTCAST_POWER_MODEL, else the shipped one)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Remove the output folder's parts first (each removed file is named on stderr, the first 10, and listed as removed_parts with --json): needed to write a spec into a folder holding another spec's parts (refused otherwise)."),
) -> None:
    """Sweep models x clusters x GPU counts x regions (a strategy search per task) on Dask or Ray; results to Parquet as tasks finish.

    Exit 0 when every task has a result (ok, none fits or no valid strategy); 1 when a task failed to run or ended
    with status error (listed: on stderr, and under "failed" with --json); 2 for bad input."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from wattcast.sweep import (BACKENDS, SEARCH_KEYS, SweepBackendError, SweepSpecError, import_ray, load_spec, read_sweep,
                                run_sweep, search_keys, summary)

    _input_file(spec, "sweep spec")
    if workers < 0:
        _fail(f"--workers must be 0 or more, got {workers}")
    if backend not in BACKENDS:
        _fail(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "ray":
        if scheduler is not None:
            _fail("--scheduler is a Dask scheduler address; with --backend ray use --ray-address")
        if workers == 0 and ray_address is None:
            _fail("--workers 0 runs the tasks in this process without a backend; with --backend ray give --workers 1 or more")
        try:
            import_ray()
        except SweepBackendError as e:
            _fail(str(e))  # messages quote [ray]: _fail prints them literally
    elif ray_address is not None:
        _fail("--ray-address needs --backend ray")
    from wattcast.models.selection import ModelFolders

    given = ModelFolders(models, collectives, power_model).given()
    if given:  # checked here, naming the flag
        _model_folders(**given, kinds=tuple(given))
    try:
        sp = load_spec(spec)
    except SweepSpecError as e:
        _fail(str(e))  # messages quote [ray]: _fail prints them literally
    for n in sp.notes:  # a value given twice: run once, said
        err.print(f"note: {n}", style="yellow", soft_wrap=True)
    try:
        with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TimeRemainingColumn(), console=err) as prog:
            task = prog.add_task("sweep tasks", total=None)
            res = run_sweep(sp, output, scheduler=scheduler, workers=workers, backend=backend, ray_address=ray_address,
                            progress=lambda d, t: prog.update(task, completed=d, total=t), overwrite=overwrite,
                            on_removed=_say_removed_parts, **{k: str(v) for k, v in given.items()})
    except (SweepSpecError, SweepBackendError, OSError) as e:
        _fail(str(e))  # messages quote [ray]: _fail prints them literally
    best = summary(read_sweep(res.output))
    # tasks whose part says status error (a task that could not run) and tasks whose run raised or whose worker was
    # lost: SweepOutcome.failed_tasks, one dict per task (task_id, model, cluster, gpus, region, status, error)
    if as_json:
        rows = json.loads(best.to_json(orient="records"))
        for r in rows:  # the search's warnings and unranked clusters as search --json gives them (not JSON text)
            r.update({k: search_keys(r[k]) for k in SEARCH_KEYS if k in r})
        print(json.dumps(dict(output=str(res.output), tasks=res.total, skipped=res.skipped, ran=res.ran,
                              failed=res.failed_tasks, best=rows, removed_parts=list(res.removed_parts)),
                         indent=2))
    else:
        t = Table(title=f"sweep: best strategy per task ({res.total} tasks; {res.skipped} already done, {res.ran} run)")
        shown = [c for c in best.columns if c not in SEARCH_KEYS]  # said below the table, as search says them
        for c in shown:
            t.add_column(str(c))
        for _, r in best[shown].iterrows():
            t.add_row(*[f"{v:.4g}" if isinstance(v, float) else str(v) for v in r])
        con = _table_console()
        con.print(t)
        for _, r in best.iterrows():
            task = f"{r['model']} on {r['gpus']} x {r['cluster']}" + (f" ({r['region']})" if r.get("region") else "")
            for name, why in (search_keys(r.get("unranked_clusters")) or {}).items():
                con.print(f"note: {task}: cluster {name} has no valid strategy: {why}", style="yellow",
                          soft_wrap=True)
            for d in search_keys(r.get("dropped_values")) or ():
                con.print(f"note: {task}: {d['note']}", style="yellow", soft_wrap=True)
            for w in search_keys(r.get("warnings")) or ():
                con.print(f"note: {task}: {w}", style="yellow", soft_wrap=True)
        err.print(f"results: {res.output} (pandas.read_parquet or wattcast.sweep.read_sweep)")
    for f in sorted(res.failed_tasks, key=lambda f: f["status"] != "error"):  # those with status error first
        said = (f" ({f['model']} on {f['gpus']} x {f['cluster']}" + (f", {f['region']}" if f["region"] else "")
                + ") ended with status error") if f["status"] == "error" else " failed"
        err.print(f"task {f['task_id']}{said}: {f['error']}", style="red", soft_wrap=True)
    if res.failed_tasks:
        raise typer.Exit(1)


#: the part files `wattcast sweep --overwrite` names one a line; beyond these, how many more
SWEEP_REMOVED_SHOWN = 10


def _say_removed_parts(out: Path, names: list[str]) -> None:
    """What `wattcast sweep --overwrite` deleted before running (on stderr): how many parts, then each file, the
    first :data:`SWEEP_REMOVED_SHOWN` of them."""
    err.print(f"--overwrite removed {len(names)} part file{'s' if len(names) != 1 else ''} of an earlier sweep from "
              f"{out}:", soft_wrap=True, highlight=False)
    for n in names[:SWEEP_REMOVED_SHOWN]:
        err.print(f"  {out / n}", soft_wrap=True, highlight=False)
    if len(names) > SWEEP_REMOVED_SHOWN:
        err.print(f"  ... and {len(names) - SWEEP_REMOVED_SHOWN} more", highlight=False)


@app.command()
def regions(
    text: Optional[str] = typer.Argument(None, help="Show only regions whose name or label contains this text (e.g. us-east, France)."),
    kind: Optional[str] = typer.Option(None, "--kind", help="country, cloud or zone (default: all)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the region names --region takes (countries, cloud regions, grid zones) with their grid intensity and
    electricity price (USD/kWh; empty where the shipped table has none: a run there uses the global default)."""
    from wattcast.data.carbon import CarbonDataError, cost_defaults, electricity_price, grid_intensity, list_regions

    try:
        names = list_regions(kind)
    except CarbonDataError as e:
        _fail(str(e))
    rows = []
    for n in names:
        g = grid_intensity(n)
        if text and text.strip().lower() not in f"{n} {g.name}".lower():
            continue
        ep = electricity_price(n)
        rows.append(dict(region=n, name=g.name, kgco2e_per_kwh=g.kgco2e_per_kwh, basis=g.basis, year=g.year,
                         grid_source=g.source, grid_region_specific=g.region_specific,
                         electricity_usd_per_kwh=None if ep is None else ep.usd_per_kwh,
                         electricity_location=None if ep is None else ep.location,
                         electricity_year=None if ep is None else ep.year,
                         electricity_source=None if ep is None else ep.source,
                         electricity_approximate=None if ep is None else ep.approximate))
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        _fail(f"no region matches {text!r}" + (f" among --kind {kind}" if kind else "") + "; `wattcast regions` lists them all", code=1)
    t = Table(title=f"wattcast regions ({len(rows)}): grid intensity, location-based; electricity price (industrial)")
    for col in ("region", "name", "kgCO2e/kWh", "USD/kWh", "price of"):
        t.add_column(col)
    for r in rows:
        price = r["electricity_usd_per_kwh"]
        t.add_row(r["region"], r["name"], f"{r['kgco2e_per_kwh']:.3f}" + ("" if r["grid_region_specific"] else " *"),
                  "" if price is None else f"{price:.3f}",
                  "" if price is None else f"{r['electricity_location']} {r['electricity_year']}")
    con = _table_console()
    con.print(t)
    if not all(r["grid_region_specific"] for r in rows):
        con.print("*: not a region's own figure: the world average ('world' itself, or standing in for a region whose "
                  "source has no figure, a missing value), flagged in a run's output")
    missing = sum(r["electricity_usd_per_kwh"] is None for r in rows)
    con.print(f"USD/kWh: {len(rows) - missing} regions priced (electricity_prices.yaml; figures approximate, see "
              f"--json for each source); {missing} without a price use the global default "
              f"{cost_defaults()['electricity_usd_per_kwh'].value:g} USD/kWh, flagged in a run's output.")


#: how the per-op table names a row's parts (single_device.OP_PARTS)
_PART_LABELS = {"optimizer_step": "of which optimizer step", "clip_grad_norm": "of which clip_grad_norm",
                "loss_scaling": "of which loss scaling", "grad_accumulation": "of which grad accumulation",
                "memcpy": "of which memcpy", "main_grad_cast": "of which main-gradient cast",
                "grad_buffer": "of which gradient-buffer passes"}


def _print_prediction(res) -> None:
    con = Console()
    b, s = res.meta.get("batch"), res.meta.get("seq")
    shape = (f"batch {b} x seq {s}" if b is not None and s is not None else
             "input dims as exported in the file" + (f", batch {b}" if b is not None else "") + (f", seq {s}" if s is not None else ""))
    from wattcast.simulate.defaults import shown_dtype

    head = Table(title=f"{res.meta.get('name')} on {res.device} ({res.mode}, {shown_dtype(res.meta)}, {shape})")
    for c in ("forward ms", "backward ms", "optimizer ms", "step ms", "memory GB", "TFLOP/step", "kernels", "OOD kernels"):
        head.add_column(c, justify="right")
    head.add_row(f"{res.forward_ms:.2f}", f"{res.backward_ms:.2f}", f"{res.optimizer_ms:.2f}", f"{res.step_time_ms:.2f}",
                 f"{res.memory_gb:.2f}" + ("" if res.fits else " (does not fit)"), f"{res.flops / 1e12:.2f}",
                 f"{len(res.nodes):,}", f"{100 * res.ood_fraction:.0f}%")
    con.print(head)
    _print_band(con, res.step_band)
    if res.mode != "train" and res.tokens_per_s is not None:
        kv = res.meta.get("kv_context")
        con.print(f"{res.tokens_per_s:,.0f} tokens/s, {res.ms_per_token:.3f} ms per token of a sequence"
                  + (f" (KV cache: context {kv:,} + {s} new tokens per sequence, {res.memory.kv_cache_gb:.2f} GB)"
                     if kv is not None else " (no KV cache: a bare forward)")
                  + f"; logits for {'the last position' if res.meta.get('logits') == 'last' else 'every position'}")
        sv = res.meta.get("serving")
        if sv:
            con.print(f"serving ({sv['engine']}): GPU step {sv['gpu_step_ms']:.2f} ms + host {sv['exposed_host_ms']:.2f} ms "
                      f"({sv['host_fixed_ms']:.3f} ms + {1e3 * sv['host_per_seq_ms']:.1f} us x {res.meta.get('batch')} "
                      f"sequences, {'overlapped' if sv['host_overlaps_gpu'] else 'in series'}) + prefill "
                      f"{sv['prefill_ms']:.2f} ms ({sv['requests_per_iteration']:.3f} requests of {sv['prompt_tokens']} "
                      f"prompt tokens per iteration, {sv['output_tokens']} output tokens each)")
    tpi = res.meta.get("tensor_parallel")
    if tpi:
        ar = tpi["collectives"].get("all_reduce", {})
        con.print(f"tensor parallel: {tpi['tp']} GPUs of {tpi['cluster']} (figures above per GPU; JSON tensor_parallel); "
                  f"{ar.get('count', 0)} all-reduces ({', '.join(f'{b / 1e6:.2f}' for b in ar.get('bytes', []))} MB) and "
                  f"the logits gather: {tpi['collective_ms']:.2f} ms; the group's energy {tpi['energy_all_gpus_j']:.1f} J "
                  f"per step, {tpi['avg_power_all_gpus_w']:.0f} W")
    t = Table(title="per op class")
    for c in ("op class", "kernels", "time ms", "share"):
        t.add_column(c, justify="right" if c != "op class" else "left")
    share = lambda ms: f"{100 * ms / max(res.step_time_ms, 1e-12):.1f}%"  # noqa: E731
    for r in res.per_op:
        t.add_row(r["op_class"], f"{r['count']:,}", f"{r['time_ms']:.2f}", share(r["time_ms"]))
        for p in r.get("parts") or []:  # the step's named overheads inside the row (optimizer step, clipping, ...)
            label = _PART_LABELS.get(p['name'], p['name']) + (f" ({p['impl']})" if p.get("impl") else "")
            t.add_row(f"  {label}", f"{p['count']:,}", f"{p['time_ms']:.2f}",
                      share(p["time_ms"]), style="dim")
    gap_ms = sum(float(r.get("launch_gap_ms") or 0.0) for r in res.per_op)
    if "launch_gap_ms" in (res.per_op[0] if res.per_op else {}):
        t.add_row(_launch_gaps_label(res.meta.get("settings") or {}), "", f"{gap_ms:.2f}", share(gap_ms), style="dim")
    con.print(t)
    layers = res.per_layer
    if layers:
        t = Table(title="per layer (-1 = embeddings, last = head and loss; each row includes the optimizer step of its "
                          "own parameters)")
        for c in ("layer", "kernels", "time ms"):
            t.add_column(c, justify="right")
        shown = layers if len(layers) <= 12 else layers[:5] + [None] + layers[-5:]
        for r in shown:
            if r is None:
                t.add_row("...", "", "")
                continue
            t.add_row(str(r["layer"]), f"{r['count']:,}", f"{r['time_ms']:.2f}")
        for o in res.outside_layers:  # loading the batch, a serving engine's costs: in the step, in no layer
            t.add_row(f"({o['op_class']}, no layer)", f"{o['count']:,}", f"{o['time_ms']:.2f}", style="dim")
        con.print(t)
    con.print(f"energy per step {res.energy_j:.1f} J, average board power {res.avg_power_w:.0f} W"
              + (f" under a {res.power_limit_w:g} W limit" if res.power_limit_w else ""))
    if res.fallback_ops:
        con.print(Text.assemble(("ops without their own learned model", "yellow"), " (proxy = costed as a copy moving the same bytes; "
                  "roofline = analytical): "
                  + ", ".join(f"{f['op_class']}" + (f" {f['op_type']}" if f.get("op_type") else "")
                              + f" ({f['method']}, {f['count']}, {f['time_ms']:.2f} ms)" for f in res.fallback_ops)))


@app.command()
@_forceable
def footprint(
    device: str = typer.Option(..., "--device", "-d", help="Catalog name or spec file."),
    gpus: int = typer.Option(..., "--gpus", help="Accelerators in the run."),
    hours: float = typer.Option(..., "--hours", help="Wall-clock hours of the run (as published footprints report)."),
    avg_power_w: Optional[float] = typer.Option(None, "--avg-power-w", help="Measured all-in average power per accelerator (W); default: the power surrogate at --utilisation plus node overhead."),
    utilisation: Optional[float] = typer.Option(None, "--utilisation", help="Compute utilisation (0-1) for the power surrogate (default 0.5); not with --avg-power-w, which gives the power itself."),
    pue: Optional[float] = typer.Option(None, "--pue", help="Data-centre PUE (default 1.2)."),
    region: Optional[str] = typer.Option(None, "--region", help="Grid region: country (ISO code or name) or cloud region."),
    grid_kgco2e_per_kwh: Optional[float] = typer.Option(None, "--grid-kgco2e-per-kwh", help="Grid intensity (overrides --region's; the region still gives the electricity price and cloud offer)."),
    lifetime_years: Optional[float] = typer.Option(None, "--lifetime-years", help="Hardware lifetime (default 5)."),
    market_based: bool = typer.Option(False, "--market-based", help="Market-based grid factor for the region (cloud regions only: location x (1 - the provider's declared renewable-matching share, CodeCarbon offsetRatio), a proxy, not a published Scope-2 factor; a 0 is the provider's claim, flagged)."),
    node_overhead_share: Optional[float] = typer.Option(None, "--node-overhead-share", help="Host CPUs, DRAM, NICs, fans per GPU as a share of the GPU's TDP, added to its power (default: 0.3 on the power surrogate's GPU power; 0 with --avg-power-w, which is all-in, so a share given with it treats that power as GPU-only)."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="GPUs of each node the run uses (with --node-gpus): the rest of every node it occupies are idle spares, charged with the run (e.g. 64 of an NVL72 rack's 72)."),
    node_gpus: Optional[int] = typer.Option(None, "--node-gpus", help="GPUs each node has (with --gpus-per-node; 72 for an NVL72 rack)."),
    cloud_usd_per_gpu_hour: Optional[float] = _CLOUD_OPTION,
    pricing: Optional[str] = _PRICING_OPTION,
    electricity_usd_per_kwh: Optional[float] = _ELECTRICITY_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    force: bool = _FORCE_OPTION,
) -> None:
    """Energy, CO2e and cost of a run described by its hours (the calculator behind predict --tokens)."""
    from wattcast import footprint as _footprint
    from wattcast.data.device_spec import DeviceSpecError

    # (--region with --grid-kgco2e-per-kwh: the explicit figure wins, the region still prices electricity, as predict)
    if avg_power_w is not None and utilisation is not None:
        _fail("--utilisation sets the power surrogate's load; --avg-power-w gives the power itself: give one of them")
    if utilisation is None:
        utilisation = 0.5
    _check_pricing_flag(pricing)
    from wattcast.lifecycle import check_plausible

    try:
        check_plausible("hours", hours)  # (the Python API takes computed hours from footprint_from_step unchecked)
        fp = _footprint(device, gpus=gpus, hours=hours, avg_power_w=avg_power_w, utilisation=utilisation, pue=pue, region=region,
                        grid_kgco2e_per_kwh=grid_kgco2e_per_kwh, lifetime_years=lifetime_years,
                        market_based=market_based or None, node_overhead_share=node_overhead_share,
                        cloud_usd_per_gpu_hour=cloud_usd_per_gpu_hour, pricing=pricing,
                        electricity_usd_per_kwh=electricity_usd_per_kwh, gpus_per_node=gpus_per_node,
                        node_gpus=node_gpus)
    except (DeviceSpecError, FileNotFoundError, ValueError) as e:
        _fail(str(e))
    if as_json:
        d = fp.to_dict()
        d["run"] = fp.run_dict()
        print(json.dumps(d, indent=2, default=str))
    else:
        _print_run(fp)


@app.command("models")
def list_models(
    as_json: bool = typer.Option(False, "--json", help="Print JSON: each built-in's name, model_type and main sizes."),
) -> None:
    """List the built-in model configs (usable as --model NAME)."""
    from wattcast import builtin_models

    if not as_json:
        for name in builtin_models():
            print(name)
        return
    from wattcast.featurize.hf_config import load_hf_config

    rows = []
    for name in builtin_models():
        c = load_hf_config(name)
        rows.append(dict(name=name, model_type=c.model_type, family=c.family, n_layers=c.total_layers, hidden=c.hidden,
                         n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim, ffn=c.ffn, vocab=c.vocab,
                         max_positions=c.max_positions or None, n_experts=c.n_experts, source=c.get("_source")))
    print(json.dumps(rows, indent=2))


@validate_app.command("labels")
def validate_labels(
    data: Optional[Path] = _DATA_OPTION,
    mlruns: Path = _MLRUNS_OPTION,
    no_mlflow: bool = _NO_MLFLOW_OPTION,
    output: Optional[Path] = typer.Option(None, "--output", help="Write every label's prediction to this CSV."),
    overwrite: bool = _OVERWRITE_OPTION,
    models: Optional[Path] = _MODELS_OPTION,
    collectives: Optional[Path] = _COLLECTIVES_MODEL_OPTION,
    power_model: Optional[Path] = _POWER_MODEL_OPTION,
) -> None:
    """Predict every single-GPU NeuSight label end to end; per-GPU errors; log to MLflow."""
    from wattcast.validation.e2e_labels import FW_OVER_BW_CONSISTENT_MAX
    from wattcast.validation.e2e_run import run_validate_labels

    _job_paths(None if no_mlflow else mlruns, output=output, overwrite=overwrite)
    from wattcast.models.selection import using_folders

    try:
        with using_folders(_model_folders(models, collectives, power_model)):
            outcome = run_validate_labels(data=data, tracking_dir=mlruns, use_mlflow=not no_mlflow, output=output)
    except FileNotFoundError as e:
        _fail(str(e))
    con = Console()
    summ = outcome["summary"]
    t = Table(title="NeuSight labels, end to end (absolute % error)")
    for c in summ.columns:
        t.add_column(str(c))
    for _, r in summ.iterrows():
        t.add_row(*[f"{v:.1f}" if isinstance(v, float) else str(v) for v in r])
    con.print(t)
    split = outcome["train_split"]
    if len(split):
        t = Table(title="Training labels: forward and backward apart (absolute % error; fw/bw time ratio, median)")
        short = {"fw_mean_abs_error_pct": "forward %", "bw_mean_abs_error_pct": "backward %", "step_mean_abs_error_pct": "step %",
                 "measured_fw_over_bw": "fw/bw measured", "predicted_fw_over_bw": "fw/bw predicted",
                 "fw_inconsistent": f"fw/bw > {FW_OVER_BW_CONSISTENT_MAX}"}
        for c in split.columns:
            t.add_column(short.get(c, str(c)))
        for _, r in split.iterrows():
            t.add_row(*[(f"{v:.2f}" if "_over_" in c else f"{v:.1f}") if isinstance(v, float) else str(v) for c, v in r.items()])
        con.print(t)
        con.print(f"A training label whose measured forward is over {FW_OVER_BW_CONSISTENT_MAX} of its measured backward "
                  "carries time its kernels do not (a dense forward is about half the backward); the labels table's "
                  "'all-fw-consistent' rows leave those out, 'all' keeps every label.")
    _print_source_anomalies(con, summ, outcome.get("source_consistency"), outcome.get("source_anomalies"))
    if outcome.get("run_id"):
        con.print(f"MLflow run {outcome['run_id']} in {mlruns}/")


def _print_source_anomalies(con, summ, consistency, flagged) -> None:
    """Per device: every label (the headline) beside the labels the per-kernel source check leaves in, and the
    flagged labels with their statistic (``validation/label_consistency.py``)."""
    if consistency is None or not len(consistency):
        return
    thr = float(consistency["threshold"].iloc[0])
    s = summ.set_index(["device", "kind"])
    t = Table(title="NeuSight labels: all (headline) and without source anomalies (% error: mean |e| / signed mean)")
    for c in ("device", "held out", "labels", "MAPE", "signed", "w/o anomalies: labels", "MAPE", "signed", "flagged"):
        t.add_column(c)
    n_flag = consistency.groupby("device")["flagged"].sum()
    for dev in summ.loc[summ["kind"] == "all", "device"]:
        a = s.loc[(dev, "all")]
        w = s.loc[(dev, "all-without-source-anomalies")] if (dev, "all-without-source-anomalies") in s.index else None
        t.add_row(str(dev), "yes" if a["heldout"] else "", str(int(a["labels"])), f"{a['mean_abs_error_pct']:.1f}",
                  f"{a['mean_signed_error_pct']:+.1f}", str(int(w["labels"])) if w is not None else "0",
                  f"{w['mean_abs_error_pct']:.1f}" if w is not None else "-",
                  f"{w['mean_signed_error_pct']:+.1f}" if w is not None else "-", str(int(n_flag.get(dev, 0))))
    con.print(t)
    con.print(f"A label is a source anomaly when a measured phase exceeds the sum of its own per-kernel timings "
              f"(NeuSight's CSV, one layer x num_layer, host-only rows out) by more than {100 * thr:.1f}% "
              "(Tukey's far-out fence of the training GPUs' labels; one-sided: a kernel sum above the measurement is the "
              "isolated-timing floor). Labels without a per-kernel CSV cannot be checked and stay in.")
    if flagged is not None and len(flagged):
        t = Table(title="Source anomalies: measured phase / own kernel sum - 1 (%)")
        for c in ("device", "label", "forward excess %", "backward excess %"):
            t.add_column(c)
        for r in flagged.itertuples(index=False):
            t.add_row(str(r.device), str(r.label), f"{100 * r.fw_excess:+.1f}",
                      "-" if r.bw_excess != r.bw_excess else f"{100 * r.bw_excess:+.1f}")
        con.print(t)


@validate_app.command("step-band")
def validate_step_band(
    data: Optional[Path] = _DATA_OPTION,
    mlruns: Path = _MLRUNS_OPTION,
    no_mlflow: bool = _NO_MLFLOW_OPTION,
    output: Optional[Path] = typer.Option(None, "--output", help="Write the calibration (JSON, the shipped file's format) here."),
    overwrite: bool = _OVERWRITE_OPTION,
    models: Optional[Path] = _MODELS_OPTION,
    collectives: Optional[Path] = _COLLECTIVES_MODEL_OPTION,
    power_model: Optional[Path] = _POWER_MODEL_OPTION,
) -> None:
    """Calibrate the step's 90% band on measured steps (NeuSight labels; vTrain, MPT) and check it on the rows it was
    not fitted on; the shipped band is python -m wattcast.validation.step_band's."""
    from wattcast.models.selection import using_folders
    from wattcast.validation.step_band import run_step_band, setting_line, source_table

    _job_paths(None if no_mlflow else mlruns, output=output, overwrite=overwrite)
    try:
        with err.status("predicting every measured step ..."), using_folders(_model_folders(models, collectives, power_model)):
            res = run_step_band(data, output=output, tracking_dir=mlruns, use_mlflow=not no_mlflow)
    except FileNotFoundError as e:
        _fail(str(e))
    con = Console()
    for setting, s in res["band"]["settings"].items():
        con.print(setting_line(setting, s))
    tab = source_table(res["band"])
    t = Table(title="step band by source (% = measured / predicted - 1; signed = predicted / measured - 1)")
    for c in tab.columns:
        t.add_column(str(c), justify="left" if c in ("setting", "source", "role") else "right")
    for r in tab.itertuples(index=False):
        t.add_row(*[f"{v:.1f}" if isinstance(v, float) else str(v) for v in r])
    con.print(t)
    if res.get("run_id"):
        con.print(f"MLflow run {res['run_id']} in {mlruns}/")


@train_app.command("kernels")
def train_kernels(
    data: List[Path] = _TRAIN_DATA_OPTION,
    holdout: List[str] = typer.Option(["L4", "A100-PCIe-80GB"], "--holdout", help="A GPU never trained, tuned or selected on (repeatable): a catalog name or alias, a spec file, or the name (or an alias) of a --spec GPU. Each one adds to the default held-out GPUs (L4, A100-PCIe-80GB), which are always held out, as is a --spec with their figures under another name."),
    csv: Optional[Path] = typer.Option(None, "--csv", help="Your own profiling CSV (schema in README) to train on as well."),
    only_csv: bool = typer.Option(False, "--only-csv", help="Train on --csv alone, without the shared datasets."),
    spec: List[Path] = typer.Option([], "--spec", help="Spec file for a GPU of your CSV that is not in the catalog (repeatable)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Bundle folder to write (default: the shipped one in the package)."),
    quick: bool = typer.Option(False, "--quick", help="Small, fast fits (smoke tests); not for shipping."),
    family: List[str] = typer.Option([], "--family", help="Retrain only this op family (gemm, conv, elementwise, ln, softmax; repeatable) and keep the others of the bundle at --out as they are."),
    spec_monotone: bool = typer.Option(False, "--spec-monotone", help="Fit every LightGBM member monotone in the spec-sheet figures (more bandwidth, L2 or power never slower; 2x bandwidth at most 2x faster for the vector kernels, which then read no power limit). Opt-in: the shipped bundle is fitted without (its retraining with it validated worse; README 'Monotone in the spec sheet')."),
    xla_table: List[Path] = typer.Option([], "--xla-table", help="An extra XLA GEMM table (a JAX CUDA plugin wheel, its .so, the .txtpb or a CSV from python -m wattcast.data.xla_perf_table; repeatable; default: $WATTCAST_XLA_TABLE)."),
    mlruns: Path = _MLRUNS_OPTION,
    no_mlflow: bool = _NO_MLFLOW_OPTION,
    force: bool = typer.Option(False, "--force", help="Make the new bundle current even when the gate refuses it: it validates worse on all validation rows by more than 2 standard errors of the paired per-row difference (bootstrap; training/kernel_run.py GATE_NOISE_SE: a bundle worse within that noise is let through without --force), or over 5% worse on one part of them (the shared rows, your CSV's held-out rows); an --only-csv run holds out fewer than 20 of your rows to judge it on; it has no fitted model and the working one has; it lacks a family the working one has fitted (retrain only yours with --family); an --only-csv bundle is over 2x the working one's MAPE on the shared measurements of its GPUs and families (the shared-data veto), or that veto cannot be run (its rows cannot be predicted); or there are no validation rows for the retrained families. Without it such a bundle is kept apart under OUT/refused/ (the newest few), not current, and the command exits 1."),
) -> None:
    """Train, evaluate (held-out GPUs), log to MLflow and ship the kernel latency surrogates."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from wattcast.data.device_spec import DeviceSpecError
    from wattcast.training.kernel_run import run_train_kernels

    data, profiles = _train_data(data)
    if only_csv and csv is None and not profiles:
        _fail("--only-csv needs --csv FILE (or an imported profile folder in --data)")
    if csv is not None:
        _input_file(csv, "--csv")
    for x in xla_table:
        _input_file(x, "--xla-table")
    _job_paths(None if no_mlflow else mlruns, out=out)
    from wattcast.data.catalog import resolve_device
    from wattcast.training.holdout import holdout_name

    try:
        specs = [resolve_device(str(s)) for s in spec]
    except (DeviceSpecError, FileNotFoundError) as e:
        _fail(str(e))
    holdout_names = []
    for h in holdout:  # a catalog GPU, a spec file, or a GPU of this run's --spec files by its name or an alias
        try:
            holdout_names.append(holdout_name(h, specs))
        except DeviceSpecError as e:
            _fail(f"--holdout: {e}")
    tmp = csv_origin = None
    if profiles:
        csv, tmp, csv_origin = _imported_kernel_csv(profiles, csv)
    try:
        with Progress(TextColumn("{task.description}", markup=False), BarColumn(), TextColumn("{task.completed} fits"), TimeElapsedColumn(), console=err) as prog:
            task = prog.add_task("training kernel surrogates", total=None)
            outcome = run_train_kernels(
                data=data, csv=csv, only_csv=only_csv, holdout=tuple(holdout_names), out_dir=out,
                spec_files=tuple(str(s) for s in spec), quick=quick, tracking_dir=mlruns, use_mlflow=not no_mlflow,
                progress=lambda what, n: prog.advance(task, n), log=lambda m: prog.console.print(m),
                xla_tables=tuple(str(x) for x in xla_table) or None, families=tuple(family) or None, force=force,
                csv_origin=csv_origin, spec_monotone=spec_monotone,
            )
    except (FileNotFoundError, ValueError, DeviceSpecError) as e:
        _fail(str(e))
    finally:
        if tmp is not None:
            tmp.cleanup()
    con = Console()
    for name in ("heldout_by_family", "in_distribution", "tensorcore_lodo", "generation_calibration"):
        t = outcome.tables.get(name)
        if t is None or len(t) == 0:
            continue
        tab = Table(title=name.replace("_", " "))
        frame = t if name in ("tensorcore_lodo", "generation_calibration") else t.reset_index()
        for c in frame.columns:
            tab.add_column(str(c))
        for _, r in frame.iterrows():
            tab.add_row(*[f"{v:.2f}" if isinstance(v, float) else str(v) for v in r])
        con.print(tab)
    colour = "green" if outcome.replaced else "yellow"
    con.print(Text.assemble((str(outcome.reason), colour), f" -> {outcome.out_dir}"))
    if outcome.run_id:
        con.print(f"MLflow run {outcome.run_id} in {mlruns}/ (mlflow ui --backend-store-uri sqlite:///{mlruns}/mlflow.db)")
    if not outcome.replaced:
        raise typer.Exit(1)


def _train_data(data: List[Path]) -> tuple[Optional[Path], list[Path]]:
    """(dataset root, imported profile folders) from the repeatable --data option of the train commands."""
    from wattcast.data.profiles.tables import ProfileImportError
    from wattcast.data.profiles.training_input import split_data_args

    for d in data:
        if not d.is_dir():
            _fail(f"--data {d} is not a folder" if d.exists() else f"--data {d} does not exist")
    try:
        return split_data_args(data)
    except ProfileImportError as e:
        _fail(str(e))


def _imported_kernel_csv(profiles: list[Path], csv: Optional[Path]):
    """(path, its TemporaryDirectory, origin): a temporary user-schema CSV holding the imported profiles' usable kernel
    rows (plus --csv's rows), and where each of its rows came from: a frame indexed by the row's line in the temporary
    file, with the ``file`` (a folder's kernels.csv, or --csv) and ``line`` there, so that the checks and MLflow name
    the user's own files, never the temporary one (``run_train_kernels(csv_origin=...)``)."""
    import tempfile

    import pandas as pd

    from wattcast.data.checks import without_blank_rows
    from wattcast.data.profiles.tables import ProfileImportError
    from wattcast.data.profiles.training_input import kernel_training_rows, table_lines

    try:
        rows, counts = kernel_training_rows(profiles)
    except ProfileImportError as e:
        _fail(str(e))
    left = {k: v for k, v in counts.items() if k not in ("rows", "used") and v}
    err.print(f"imported profiles: {counts['used']:,} of {counts['rows']:,} kernel rows used"
              + (" (left out: " + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in left.items()) + ")" if left else ""))
    if counts["used"] == 0:
        _fail(f"--data {', '.join(map(str, profiles))}: no kernel row with a wattcast op, a measured time and a catalog GPU")
    files, lines = list(rows.attrs["files"]), list(rows.attrs["lines"])
    if csv is not None:
        from wattcast.data.kernel_datasets import load_user_kernels

        try:  # checked on its own first: a bad row is named by the line of --csv, not of the merged temporary file
            load_user_kernels(csv)
        except ValueError as e:
            _fail(f"--csv: {e}")
        try:  # read as load_user_kernels reads it, so that each row's index gives its line
            own = without_blank_rows(pd.read_csv(csv, dtype=str, keep_default_na=False, skip_blank_lines=False))
        except Exception as e:  # pandas raises several types for unreadable CSVs
            _fail(f"--csv {csv}: not a readable CSV ({e})")
        files, lines = [str(csv)] * len(own) + files, table_lines(own.index).tolist() + lines
        own = own.rename(columns={"op": "OPName", "Latency": "latency_ms", "Latency (ms)": "latency_ms", "device": "Device"})
        rows = pd.concat([own, rows.astype(object)], ignore_index=True)
    tmp = tempfile.TemporaryDirectory(prefix="wattcast-imported-")
    path = Path(tmp.name) / "imported_kernels.csv"
    rows.to_csv(path, index=False)
    origin = pd.DataFrame({"file": files, "line": lines}, index=table_lines(rows.index))
    return path, tmp, origin


def _print_train_result(res: dict, title: str) -> None:
    """The summary table of a training run, the gate's verdict and the MLflow run; exit 1 if not replaced."""
    con = Console()
    summ = res["summary"]
    t = Table(title=title)
    for c in summ.columns:
        t.add_column(str(c))
    for _, r in summ.iterrows():
        t.add_row(*[f"{v:.1f}" if isinstance(v, float) else str(v) for v in r])
    con.print(t)
    con.print(f"{res['reason']}" + (f"; MLflow run {res['run_id']}" if res.get("run_id") else ""))
    if not res["replaced"]:
        raise typer.Exit(1)


@train_app.command("collectives")
def train_collectives(
    data: List[Path] = _TRAIN_DATA_OPTION,
    out: Optional[Path] = _OUT_OPTION,
    quick: bool = typer.Option(False, "--quick", help="Small, fast fits (smoke tests); not for shipping."),
    mlruns: Path = _MLRUNS_OPTION,
    no_mlflow: bool = _NO_MLFLOW_OPTION,
    cluster: Optional[str] = typer.Option(None, "--cluster", help="Cluster preset name or file the imported profiles' collective rows were measured on (needed with profile folders in --data: a profile does not record its fabric)."),
    force: bool = typer.Option(False, "--force", help="Make the new model current even when the gate refuses it: on the same data its leave-one-configuration-out MAPE is worse than the working model's; on other data its MAPE on all current rows is worse, or over 5% worse on one part of them with at least 5 rows (the nccl-tests rows, your imported rows; training/collectives.py PART_TOLERANCE). The working model is the one at --out, or the shipped one when --out holds none (a new folder). Without it such a model is kept apart under OUT/collective_refused/ (the newest few; --collectives that folder predicts with it), not current, and the command exits 1; with it the message says what the gate would have refused."),
) -> None:
    """Train the learned correction of the collective cost model on nccl-tests data (H100; Polaris evaluated only),
    plus the collective rows of imported profile folders given with --data."""
    from wattcast.training.collectives import run_train_collectives

    root, profiles = _train_data(data)
    if cluster is not None and not profiles:
        _fail("--cluster names the cluster of imported profile rows; give the profile folder(s) with --data DIR")
    _job_paths(None if no_mlflow else mlruns, out=out)
    try:
        res = run_train_collectives(data=root, out_dir=out, tracking_dir=mlruns, use_mlflow=not no_mlflow, quick=quick,
                                    log=lambda m: err.print(m), profiles=profiles, cluster=cluster, force=force)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    _print_train_result(res, "collectives: leave-one-configuration-out MAPE %")


@train_app.command("power")
def train_power(
    data: List[Path] = _TRAIN_DATA_OPTION,
    out: Optional[Path] = _OUT_OPTION,
    mlruns: Path = _MLRUNS_OPTION,
    no_mlflow: bool = _NO_MLFLOW_OPTION,
    force: bool = typer.Option(False, "--force", help="Make the new model current even when the gate refuses it: its device-weighted MAPE on the current rows, or on one part of them (the shipped datasets' rows, your imported rows), or its leave-one-GPU-out MAPE is over 2% (relative) worse than the working model's (training/power.py GATE_TOLERANCE). The working model is the one at --out, or the shipped one when --out holds none (a new folder). Without it such a model is kept apart under OUT/power_refused/ (the newest few; --power-model that folder predicts with it), not current, and the command exits 1; with it the message says what the gate would have refused."),
) -> None:
    """Fit the power surrogate on the measured power data (plus the usable power rows of imported profile folders
    given with --data); leave-one-GPU-out errors to MLflow; gated write."""
    from wattcast.training.power import run_train_power

    root, profiles = _train_data(data)
    _job_paths(None if no_mlflow else mlruns, out=out)
    try:
        res = run_train_power(data=root, out_dir=out, tracking_dir=mlruns, use_mlflow=not no_mlflow,
                              log=lambda m: err.print(m), profiles=profiles, force=force)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    _print_train_result(res, "power: leave-one-GPU-out error %")


@validate_app.command("distributed")
def validate_distributed(
    data: Optional[Path] = _DATA_OPTION,
    sample: Optional[int] = typer.Option(None, "--sample", help="Evaluate at most this many vTrain / MPT rows per file (speed)."),
    mlruns: Path = _MLRUNS_OPTION,
    no_mlflow: bool = _NO_MLFLOW_OPTION,
    output: Optional[Path] = typer.Option(None, "--output", help="Write every vTrain and MPT row's prediction to this CSV."),
    overwrite: bool = _OVERWRITE_OPTION,
    models: Optional[Path] = _MODELS_OPTION,
    collectives: Optional[Path] = _COLLECTIVES_MODEL_OPTION,
    power_model: Optional[Path] = _POWER_MODEL_OPTION,
) -> None:
    """NeuSight's 4-GPU labels, vTrain's iteration times and MosaicML's MPT FSDP throughput: predicted vs measured."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from wattcast.validation.distributed_validation import run_validate_distributed

    _positive(sample=sample)
    _job_paths(None if no_mlflow else mlruns, output=output, overwrite=overwrite)
    from wattcast.models.selection import using_folders

    folders = _model_folders(models, collectives, power_model)
    try:
        with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err) as prog, using_folders(folders):
            task = prog.add_task("predicting vTrain and MPT configurations", total=None)
            res = run_validate_distributed(data, tracking_dir=mlruns, use_mlflow=not no_mlflow, sample=sample, output=output,
                                           progress=lambda i, n: prog.update(task, completed=i, total=n))
    except FileNotFoundError as e:
        _fail(str(e))
    con = Console()
    t = Table(title="NeuSight 4-GPU labels (A100-SXM4-40GB, FP32, global batch 4)")
    for c in ("strategy", "measured ms", "predicted ms", "error %", "NeuSight's error %"):
        t.add_column(c, justify="right")
    for r in res["neusight"].itertuples(index=False):
        t.add_row(r.strategy, f"{r.measured_ms:.1f}", f"{r.predicted_ms:.1f}", f"{r.error_pct:+.1f}", f"{r.neusight_error_pct:.1f}")
    con.print(t)
    t = Table(title="vTrain (A100 FP16 Megatron-DeepSpeed): absolute % error")
    for c in ("set", "rows", "mean", "median", "max", "signed mean", "within 10%"):
        t.add_column(c, justify="right")
    for name in ("single", "multi"):
        s = res[f"summary_{name}"]
        t.add_row(name + (" (evaluation half)" if name == "single" else ""), str(s["rows"]), f"{s['mean_abs_pct']:.1f}",
                  f"{s['median_abs_pct']:.1f}", f"{s['max_abs_pct']:.1f}", f"{s['mean_signed_pct']:+.1f}", f"{100 * s['within_10pct']:.0f}%")
    con.print(t)
    t = Table(title="vTrain by tensor-parallel degree: absolute and signed % error")
    for c in ("set", "TP", "rows", "mean", "signed mean"):
        t.add_column(c, justify="right")
    for r in res["vtrain_by_tp"].itertuples(index=False):
        t.add_row(str(r.set), str(r.tp), str(r.rows), f"{r.mean_abs_pct:.1f}", f"{r.mean_signed_pct:+.1f}")
    con.print(t)
    t = Table(title="MosaicML MPT (FSDP full shard, BF16, Triton flash attention; A100 40/80 GB): step time, absolute % error")
    for c in ("GPU", "rows", "mean", "median", "max", "signed mean", "within 10%", "predicted not to fit"):
        t.add_column(c, justify="right")
    for r in res["summary_mpt"].itertuples(index=False):
        t.add_row(str(r.group), str(r.rows), f"{r.mean_abs_pct:.1f}", f"{r.median_abs_pct:.1f}", f"{r.max_abs_pct:.1f}",
                  f"{r.mean_signed_pct:+.1f}", f"{100 * r.within_10pct:.0f}%", str(r.predicted_not_to_fit))
    con.print(t)
    if res.get("run_id"):
        con.print(f"MLflow run {res['run_id']} in {mlruns}/")


@profile_app.command("import")
def profile_import(
    files: List[Path] = typer.Argument(..., help="PyTorch profiler JSON(.gz), Nsight Systems SQLite export, nccl-tests stdout, nvidia-smi CSV or DCGM dmon log (format told from the content)."),
    output: Path = typer.Option(..., "--output", "-o", help="Folder to write kernels.csv / collectives.csv / power.csv / profile.json into."),
    device: Optional[str] = typer.Option(None, "--device", "-d", help="GPU of the files when they do not record it (or to override it)."),
    collective: Optional[str] = typer.Option(None, "--collective", help="Collective of an nccl-tests log that does not name it (all_reduce, all_gather, ...)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the tables / profile.json an earlier import or run wrote into --output (as its profile.json records; its stale tables are removed; other files are kept). Without it, an existing one is an error; a table no profile.json records (a user's own) is refused even with it."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="Ranks (GPUs) per node of the profiled job (torchrun's --nproc-per-node). A trace does not record which node each rank ran on; this fills collectives.csv's nodes / gpus_per_node, which `train collectives` needs. Nodes = the trace's world size (distributedInfo.world_size) / this, unless --nodes gives them; a group whose global ranks the trace lists is placed rank by rank (rank r on node r // this, torchrun's order)."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="Nodes the profiled job ran on (with --gpus-per-node, or alone when the trace records its world size); checked against the trace's world size."),
) -> None:
    """Import profiling files into wattcast's measurement tables (schema in the README)."""
    from wattcast.data.profiles.importers import import_file
    from wattcast.data.profiles.tables import Profile, ProfileImportError, check_output_folder

    _positive(gpus_per_node=gpus_per_node, nodes=nodes)
    _output_dir(output, "--output")
    try:
        check_output_folder(output, overwrite=overwrite)
    except ProfileImportError as e:
        _fail(str(e))
    for f in files:
        _input_file(f, "input file")
    files = _distinct_inputs(files)
    if device is not None:
        from wattcast.data.catalog import resolve_device
        from wattcast.data.device_spec import DeviceSpecError

        try:
            device = resolve_device(device).name  # a spec file's GPU is named by its spec
        except (DeviceSpecError, FileNotFoundError, ValueError) as e:
            _fail(f"--device: {e}")
    prof = Profile()
    for f in files:
        try:
            notes = import_file(prof, f, device=device, collective=collective, nodes=nodes, gpus_per_node=gpus_per_node)
        except ProfileImportError as e:
            _fail(str(e))  # messages may quote NVTX ranges such as 'bmm[int8] ...': _fail prints them literally
        _print_import_notes(notes)
    if device is not None:  # the GPU the user named is known even when the catalog does not list it (spec file)
        for frames in prof.frames.values():
            for fr in frames:
                fr.loc[(fr["Device"].fillna("") == "") & (fr["device_name"] == device), "Device"] = device
    _write("--output", output, lambda: prof.write(output))
    k = prof.table("kernels")
    mapped = int((k["OPName"].fillna("") != "").sum()) if len(k) else 0
    err.print(Text.assemble(
        (f"{mapped:,}", "green"), " kernel rows mapped to wattcast ops",
        *([", ", (f"{len(k) - mapped:,} kept unmapped", "yellow"), " (OPName '', see 'reason')"] if len(k) - mapped else []),
        f", {len(prof.table('collectives')):,} collective rows, {len(prof.table('power')):,} power samples -> {output}"))
    unknown = sorted({str(n) for t in ("kernels", "collectives", "power") for n, d in
                      zip(prof.table(t)["device_name"].fillna(""), prof.table(t)["Device"].fillna("")) if n and not d})
    if unknown:
        err.print(f"GPU(s) not in the catalog: {', '.join(unknown)}; their rows have an empty 'Device' "
                  "(give --device NAME or a spec file to train on them)", style="yellow")


def _distinct_inputs(files: list[Path]) -> list[Path]:
    """``files`` without repeats: a path given twice (same resolved path) or a copy (same sha256 of the content) is
    imported once, said on stderr (importing it twice duplicated every row). Only files whose size another one shares
    are hashed: a trace of a distinct size is read once, by its import."""
    from collections import Counter

    from wattcast.models.manifest import sha256_file

    sizes = [f.stat().st_size for f in files]
    shared = Counter(sizes)
    seen: dict[str, Path] = {}
    out = []
    for f, size in zip(files, sizes):
        if shared[size] < 2:
            out.append(f)
            continue
        key = sha256_file(f)
        if key in seen:
            same = "the same file as" if f.resolve() == seen[key].resolve() else "the same content as"
            err.print(f"{f}: {same} {seen[key]}, already imported: skipped (its rows would be counted twice)", style="yellow")
            continue
        seen[key] = f
        out.append(f)
    return out


@profile_app.command("run")
def profile_run(
    output: Path = typer.Option(..., "--output", "-o", help="Folder to write the measured tables (and device.json) into."),
    backend: str = typer.Option("auto", "--backend", help="auto (CUDA when a GPU is visible, else CPU), cuda or cpu."),
    dtype: List[str] = typer.Option(["fp32"], "--dtype", help="Dtypes to sweep (repeatable): fp32, tf32, fp16, bf16."),
    quick: bool = typer.Option(False, "--quick", help="A small sweep (minutes -> seconds) to check the setup."),
    repeats: int = typer.Option(5, "--repeats", help="Timed loops per shape (the median is kept)."),
    collectives: bool = typer.Option(True, "--collectives/--no-collectives", help="Sweep all_reduce/all_gather/reduce_scatter sizes inside a torch.distributed job (torchrun)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the tables / device.json / profile.json an earlier run or import wrote into --output (as its profile.json records; its stale tables are removed; other files are kept). Without it, an existing one is an error; a table no profile.json records (a user's own) is refused even with it."),
) -> None:
    """Measure this machine's GPU on a sweep of GEMM/elementwise/norm/softmax (and collective) shapes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from wattcast.data.kernel_ops import DTYPE_BYTES, canonical_dtype
    from wattcast.data.profiles.collector import SweepOptions, make_backend, run_sweep
    from wattcast.data.profiles.tables import DEVICE_FILE, ProfileImportError, check_output_folder

    _output_dir(output, "--output")
    try:  # before the sweep runs: the same rule as `profile import`
        check_output_folder(output, overwrite=overwrite, writes=(DEVICE_FILE,))
    except ProfileImportError as e:
        _fail(str(e))
    _positive(repeats=repeats)
    dts = tuple(dict.fromkeys(canonical_dtype(d) for d in dtype))
    bad = [d for d in dts if d not in DTYPE_BYTES or d == "fp8"]
    if bad:
        _fail(f"--dtype: cannot sweep {', '.join(bad)}; use fp32, tf32, fp16 or bf16")
    try:
        be = make_backend(backend)
    except ProfileImportError as e:
        _fail(str(e))
    opts = SweepOptions(dtypes=dts, quick=quick, repeats=repeats, collectives=collectives)
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err) as prog:
        task = prog.add_task(f"measuring on {be.device_name} ({be.name})", total=None)
        prof, notes = run_sweep(be, opts, progress=lambda i, n: prog.update(task, completed=i, total=n))
    _write("--output", output, lambda: prof.write(output, extra={DEVICE_FILE: json.dumps(notes["spec"], indent=2)}))
    err.print(Text.assemble(
        (f"{notes['kernel_rows'] - notes['failed_points']:,}", "green"), " kernel shapes measured",
        *([", ", (f"{notes['failed_points']} not measurable", "yellow"), " (see 'reason')"] if notes["failed_points"] else []),
        f", {notes['collective_rows']} collective rows, {notes['power_rows']} power samples on {be.device_name} -> {output}"))
    if be.name == "cpu":
        err.print("CPU timer backend: these rows time the CPU, not a GPU (for checking the sweep only)", style="yellow")


def _copies_text(busy: dict) -> str:
    """'882 memcpy/memset events, 54.75 ms (HtoD 150 x 50.66 ms, ...; not in the kernel rows or union_busy_ms)'."""
    kinds = sorted((busy.get("copies") or {}).items(), key=lambda x: -x[1]["ms"])
    return (f"{busy['copy_events']:,} memcpy/memset events, {busy['copy_ms']:.2f} ms ("
            + ", ".join(f"{k} {v['events']:,} x {v['ms']:.2f} ms" for k, v in kinds)
            + "; not in the kernel rows or union_busy_ms)")


def _print_import_notes(notes: dict) -> None:
    parts = [f"{notes.get('format')}: {notes.get('file')}"]
    for key in ("kernel_rows", "mapped_rows", "unmapped_rows", "collective_rows", "power_rows"):
        if key in notes:
            parts.append(f"{key.replace('_', ' ')} {notes[key]:,}")
    skipped = notes.get("skipped_reasons") or {}  # lines not imported at all (nccl-tests), apart from kept rows
    if notes.get("skipped_rows"):
        parts.append(f"skipped lines {notes['skipped_rows']:,} (not imported)")
    err.print(", ".join(parts))
    busy = notes.get("busy") or {}
    if busy.get("steps_ms"):
        st = busy["steps_ms"]
        err.print(f"  measured step time: {len(st)} ProfilerStep# GPU span(s) {min(st):.2f}-{max(st):.2f} ms (first to "
                  "last GPU event each step launched)"
                  + (f"; CPU-side spans {min(busy['steps_cpu_ms']):.2f}-{max(busy['steps_cpu_ms']):.2f} ms"
                     if busy.get("steps_cpu_ms") else ""))
    if busy.get("copy_events"):
        err.print(f"  {_copies_text(busy)}")
    pl = notes.get("placement")
    if pl:  # the placement profile import's flags gave the collective rows (importers.place_collectives)
        job = (f"{pl['nodes']} node(s) x {pl['gpus_per_node']} GPUs" if pl.get("nodes") is not None
               else f"{pl['gpus_per_node']} GPUs per node, nodes unknown")
        err.print(f"  placement from {pl['from']}: job of {job}"
                  + (f" ({pl['derived']})" if pl.get("derived") else "")
                  + f"; {pl['placed']:,} collective row(s) placed"
                  + (f" ({pl['from_ranks']:,} by their group's global ranks, rank r on node r // "
                     f"{pl['gpus_per_node']})" if pl.get("from_ranks") else "")
                  + (f", {pl['kept']:,} kept the file's own" if pl.get("kept") else ""))
    if notes.get("warning"):  # literal (err has no markup): warnings quote NVTX ranges such as 'bmm[int8] ...'
        err.print(notes["warning"], style="yellow")
    reasons = sorted((notes.get("unmapped_reasons") or {}).items(), key=lambda x: -x[1])
    for why, n in reasons[:6]:
        err.print(f"  {'skipped' if why in skipped else 'unmapped'}: {n:,} x {why}")
    if len(reasons) > 6:  # the rest counted, not dropped unsaid (profile.json lists every reason)
        err.print(f"  ... and {len(reasons) - 6} more reason(s) ({sum(n for _, n in reasons[6:]):,} rows; every reason "
                  "in profile.json 'unmapped_reasons')")


@validate_app.command("trace")
def validate_trace_cmd(
    files: List[Path] = typer.Argument(..., help="Profiling file(s) with kernel times and shapes (PyTorch profiler JSON(.gz) or Nsight Systems SQLite)."),
    device: str = typer.Option(..., "--device", "-d", help="Device to predict on (catalog name, alias or spec file)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (rows, mape_pct, bias_pct, by_op, measured_busy_ms, predicted_busy_ms, ...)."),
    trace_device: Optional[str] = typer.Option(None, "--trace-device", help="GPU of a trace that does not record it."),
    models: Optional[Path] = _MODELS_OPTION,
    output: Optional[Path] = typer.Option(None, "--output", help="Write every compared row (measured, predicted, error %) to this CSV."),
    overwrite: bool = _OVERWRITE_OPTION,
    in_step: bool = typer.Option(False, "--in-step", help="Compare the kernel times a predicted step uses (FP32 without the isolated-timing floor of NeuSight's one-op-at-a-time measurements; none below the GPU-side kernel floor plus its roofline time)."),
) -> None:
    """Predict every imported kernel on DEVICE and compare with its measured GPU time."""
    from wattcast.data.catalog import resolve_device
    from wattcast.data.device_spec import DeviceSpecError
    from wattcast.data.profiles.tables import ProfileImportError
    from wattcast.validation.trace_validation import json_safe, validate_trace

    for f in files:
        _input_file(f, "input file")
    if output:
        _output_file(output, "--output", suffixes=(".csv",), protect=tuple(files), overwrite=overwrite)
    try:
        resolve_device(device)
    except (DeviceSpecError, FileNotFoundError, ValueError) as e:
        _fail(f"--device: {e}")
    models = _model_folders(models, kinds=("models",)).models
    try:
        summary, rows = validate_trace(files, device, bundle=models, trace_device=trace_device, in_step=in_step)
    except (ProfileImportError, ValueError, FileNotFoundError) as e:
        _fail(str(e))  # messages may quote NVTX ranges such as 'bmm[int8] ...': _fail prints them literally
    if output:
        _write("--output", output, lambda: rows.to_csv(output, index=False))
    if summary["trace_catalog_devices"] and summary["device"] not in summary["trace_catalog_devices"]:
        err.print(f"the trace ran on {', '.join(summary['trace_devices'])}; predicting on {summary['device']}", style="yellow")
    if as_json:
        print(json.dumps(json_safe(summary), indent=2, default=str, allow_nan=False))
        return
    con = Console()
    t = Table(title=f"{summary['rows']:,} kernel rows on {summary['device']}: predicted vs measured (% error; signed + = over-prediction)")
    for c in ("op class", "rows", "MAPE %", "median APE %", "signed bias %", "measured ms", "predicted ms"):
        t.add_column(c, justify="right")
    for cls, v in summary["by_op"].items():
        t.add_row(cls, f"{v['rows']:,}", f"{v['mape_pct']:.1f}", f"{v['median_ape_pct']:.1f}", f"{v['bias_pct']:+.1f}",
                  f"{v['measured_ms']:.3f}", f"{v['predicted_ms']:.3f}")
    t.add_row("all", f"{summary['rows']:,}", f"{summary['mape_pct']:.1f}", f"{summary['median_ape_pct']:.1f}",
              f"{summary['bias_pct']:+.1f}", f"{summary['measured_busy_ms']:.3f}", f"{summary['predicted_busy_ms']:.3f}")
    con.print(t)
    union = f", union of busy intervals {summary['union_busy_ms']:.3f} ms" if summary.get("union_busy_ms") is not None else ""
    steps = (f"; {summary['steps']} ProfilerStep# GPU spans {summary['step_ms_min']:.1f}-{summary['step_ms_max']:.1f} ms"
             + (f" (CPU spans {summary['step_cpu_ms_min']:.1f}-{summary['step_cpu_ms_max']:.1f} ms)"
                if summary.get("step_cpu_ms_min") is not None else "")
             if summary.get("steps") else "")
    if summary.get("copy_events"):
        steps += f"; {_copies_text(summary)}"
    con.print(f"trace GPU busy {summary['trace_busy_ms']:.3f} ms summed over {summary['kernels']:,} kernels (compute "
              f"{summary['compute_busy_ms']:.3f}, NCCL {summary['comm_busy_ms']:.3f}{union}){steps}")
    con.print(f"{summary['unmapped_rows']:,} compute rows ({summary['unmapped_busy_ms']:.3f} ms) not compared:")
    for why, n in list(summary["unmapped_reasons"].items())[:8]:
        con.print(f"  {n:,} x {why}")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
