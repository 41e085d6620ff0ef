"""`wattcast train power`: build utilisation/power rows from shared/datasets/power, fit g, leave one GPU out,
fit the clock response on Perseus's sweeps, check power limits against Zeus / Perseus runs, log to MLflow,
gated write of ``models/artifacts/power_manifest.json``.

What the rows are (all workload averages: average power over a window with a known amount of work):

* **Perseus stage profiles** (A100 SXM4 80GB, bf16; GPT-3 175B and BLOOM-176B pipeline-stage slices, forward
  and backward of one microbatch at every SM clock 855-1410 MHz). FLOPs are not in the files: we take the
  Megatron-style setup of Perseus's large-scale emulation as stated here (8 pipeline stages as in the files,
  12 of GPT-3's 96 layers per stage, BLOOM 9 per stage and 7 + the LM head on the last; tensor parallel 8,
  microbatch 1, sequence 2048; backward = 2 x forward FLOPs, no recomputation, which the measured
  backward/forward time ratio of ~1.85 supports). The two models then land at the same ~0.73 compute
  utilisation at 1410 MHz, which supports the layer split; the TP x microbatch factor is an assumption
  (utilisation scales with it). HBM bytes come from a per-layer traffic count (weights, GEMM inputs and
  outputs, unfused attention scores, layer-norm/residual/dropout/GeLU passes): +/-50%. The boards drew up to
  480 W, above the 400 W catalog TDP: the A100 80GB SXM allows a 500 W limit with custom cooling, so these
  rows use tdp 500 W (idle stays 0.15 x 400 W). Only the 1410 MHz rows train g; the sweep fits alpha (power
  vs clock) and u_ref (time vs clock).
* **Zeus NSDI'23** (V100 PCIe, P100 PCIe, Quadro RTX 6000; FP32 PyTorch): ResNet-50/ImageNet (1,281,167
  images, 3 x 8.2 GFLOP per image for forward + backward) and BERT-base/SQuAD v1.1 (88,641 features of 384
  tokens, 6 x 85M non-embedding parameters per token + attention) at the top power limit, median over
  optimizers per batch size. FP32 is supported by the measured throughput (V100 ResNet-50 ~365 img/s, the
  FP32 figure; mixed precision would be ~3x). Bytes: ~0.5 GB of activation traffic per ImageNet image plus
  6 x the weights per step; BERT from the same per-layer count as Perseus in FP32. Time per epoch includes
  data loading: utilisation is the epoch average, as is the power. Not derivable (left out of g, used for the
  power-limit response only): ShuffleNetV2/CIFAR-100 and DeepSpeech2 (FLOPs per epoch depend on details the
  files do not give), BERT/Sentiment140 (sequence length not given), NCF/MovieLens (the GPU waits on the host:
  its power, 34-69 W, is the measured floor behind ``IDLE_FRACTION_OF_TDP``).
* **ML.ENERGY v2** (A100 SXM4 40GB, vLLM LLM text generation, chat and code): per-GPU power = derived power
  / (TP x PP). FLOPs = 2 x active parameters per generated token plus an assumed prompt (256 tokens chat, 128
  code; not in the files) per request; bytes per decode step = the weights (all experts: batches of 32+
  touch them all) plus the KV cache of the running batch at (prompt + half the output) tokens, x 1/TPOT.
  Architecture numbers per model are in :data:`LLM_ARCH`. Multimodal and diffusion rows are left out (image
  tokens / denoising steps make the work unknown).

Not used: AccelWattch V100 kernels (no runtime or utilisation columns; reported as a range check only),
Perseus/EnvPipe plan iterations (per-rank power mixes compute and bubbles of unknown share).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.data.catalog import resolve_device
from wattcast.data.device_spec import DeviceSpec
from wattcast.data.profiles.power_logs import TDP_FACTOR
from wattcast.training.gate_force import shipped_reference, verdict
from wattcast.training.holdout import heldout_twin
from wattcast.featurize.power_features import IDLE_FRACTION_OF_TDP, device_idle_w, kernel_power_features
from wattcast.models.power import (
    CURVE_FEATURES,
    LGBM_FEATURES,
    MANIFEST,
    MIN_CLOCK_RATIO,
    PowerModel,
    apply_power_limit,
    lgbm_matrix,
    install_power_model,
    resolve_power_folder,
    shipped_folder,
)

EXPERIMENT = "power"


class PowerDataError(ValueError):
    """A power-measurement file cannot be read, lacks a needed column, or holds values that are not numbers."""


def _read_power_csv(path: Path, columns: tuple[str, ...], numeric: tuple[str, ...] = (),
                    complete: tuple[str, ...] = ()) -> pd.DataFrame:
    """``path`` as a frame with ``columns`` (PowerDataError naming the file and the missing columns otherwise);
    ``numeric`` columns parsed as numbers (a cell that is not one is an error; empty cells stay NaN);
    ``complete`` columns must have no empty cells."""
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise PowerDataError(f"{path}: cannot read as CSV: {e}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise PowerDataError(f"{path}: missing column(s) {', '.join(repr(c) for c in missing)}; the file needs "
                             f"{', '.join(columns)} (it has {', '.join(map(str, df.columns)) or 'no columns'})")
    for c in numeric:
        v = pd.to_numeric(df[c], errors="coerce")
        bad = (v.isna() & df[c].notna()).to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise PowerDataError(f"{path}: column {c!r} must hold numbers; data row {i + 1} has {df[c].iloc[i]!r}")
        df[c] = v
    for c in complete:
        empty = df[c].isna().to_numpy()
        if empty.any():
            raise PowerDataError(f"{path}: column {c!r} is empty on data row {int(np.flatnonzero(empty)[0]) + 1}")
    return df

#: the gate: a new model may be at most this much (relative) worse than the shipped one on the same rows
GATE_TOLERANCE = 0.02
LGBM_PARAMS = {
    "objective": "regression", "learning_rate": 0.05, "num_leaves": 7, "min_data_in_leaf": 8, "lambda_l2": 1.0,
    "verbose": -1, "num_threads": 1, "seed": 1, "deterministic": True,
}
LGBM_ROUNDS = 200
#: the forms compared leave-one-GPU-out (curve: one tied slope; curve_free: a0, a_c, a_m; lgbm: LightGBM)
FORMS = ("curve", "curve_free", "lgbm")
#: rows used to train g get this total weight per device (sources of very different sizes count alike)
PER_DEVICE_WEIGHT = 1.0

# --------------------------------------------------------------------------------------- Perseus stages
PERSEUS_GPU = "A100-SXM4-80GB"
PERSEUS_TDP_W = 500.0  # A100 80GB SXM with custom cooling; the measured 480 W at 1410 MHz needs it
PERSEUS_TP = 8
PERSEUS_MBS = 1
PERSEUS_STAGES = 8
PERSEUS_MODELS = {
    # name: hidden, heads, layers, vocab, seq
    "gpt3-175b": dict(h=12288, a=96, L=96, V=50257, s=2048),
    "bloom": dict(h=14336, a=112, L=70, V=250880, s=2048),
}


def transformer_layer_fwd(h: int, a: int, s: int, b: int = 1, tp: int = 1, elem_bytes: int = 2) -> tuple[float, float]:
    """(FLOPs, HBM bytes) of one transformer layer's forward on one tensor-parallel rank.

    FLOPs: 24 s h^2 + 4 s^2 h per sequence (Megatron / Narayanan et al. 2021). Bytes: weights 12 h^2 / tp;
    GEMM inputs and outputs (4 + 12/tp) s h; layer norms, residual adds, dropouts, GeLU (14 + 8/tp) s h;
    unfused attention scores written, softmaxed, dropped out and read: 6 a s^2 / tp."""
    flops = b * (24.0 * s * h * h + 4.0 * s * s * h) / tp
    elems = 12.0 * h * h / tp + b * ((18.0 + 24.0 / tp) * s * h + 6.0 * a * s * s / tp)
    return flops, elems * elem_bytes


def _perseus_stage_work(model: str, stage: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one stage's forward for one microbatch on one rank (see the module docstring)."""
    c = PERSEUS_MODELS[model]
    per = -(-c["L"] // PERSEUS_STAGES)  # ceil: 12 (GPT-3), 9 (BLOOM)
    layers = per if stage < PERSEUS_STAGES - 1 else c["L"] - per * (PERSEUS_STAGES - 1)
    f1, b1 = transformer_layer_fwd(c["h"], c["a"], c["s"], PERSEUS_MBS, PERSEUS_TP)
    flops, bytes_ = layers * f1, layers * b1
    if stage == PERSEUS_STAGES - 1:  # LM head (vocab-parallel) + logits through softmax/cross-entropy
        flops += 2.0 * PERSEUS_MBS * c["s"] * c["h"] * c["V"] / PERSEUS_TP
        bytes_ += 2.0 * (c["h"] * c["V"] / PERSEUS_TP + 4.0 * PERSEUS_MBS * c["s"] * c["V"] / PERSEUS_TP)
    return flops, bytes_


def load_perseus_stages(root: Path) -> pd.DataFrame:
    """Distinct (model, stage, instruction, frequency) rows with FLOPs and bytes attached."""
    folder = root / "perseus" / "stage_profile"
    frames = []
    for model in PERSEUS_MODELS:
        hits = sorted(folder.glob(f"{model}+a100_sxm_bf16.csv"))
        if not hits:
            continue
        cols = ("stage", "instruction", "frequency", "time", "energy")
        df = _read_power_csv(hits[0], cols, numeric=("stage", "frequency", "time", "energy"), complete=cols)
        df["model"] = model
        frames.append(df)
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    # stages 0..6 are identical copies in the files: keep distinct measurements only
    df = df.drop_duplicates(subset=["model", "instruction", "frequency", "time", "energy"]).reset_index(drop=True)
    work = [_perseus_stage_work(m, int(s)) for m, s in zip(df["model"], df["stage"])]
    mult = np.where(df["instruction"] == "backward", 2.0, 1.0)
    df["flops"] = np.array([w[0] for w in work]) * mult
    df["bytes"] = np.array([w[1] for w in work]) * mult
    df["power_w"] = df["energy"] / df["time"]
    df["time_ms"] = df["time"] * 1e3
    df["workload"] = df["model"] + "/stage" + df["stage"].astype(str) + "/" + df["instruction"]
    return df


# ------------------------------------------------------------------------------------------------ Zeus
ZEUS_GPUS = {"v100": "V100-PCIe-32GB", "p100": "Tesla-P100-PCIe-16GB", "rtx6000": "Quadro-RTX-6000"}
#: columns a Zeus ``summary_power_<gpu>.csv`` must have
ZEUS_COLUMNS = ("dataset", "network", "batch_size", "power_limit", "time_per_epoch", "average_power")
IMAGENET_IMAGES = 1_281_167
RESNET50_TRAIN_FLOPS = 3 * 8.2e9  # forward 4.1 GMAC = 8.2 GFLOP per 224x224 image; backward 2x forward
RESNET50_ACT_BYTES = 0.5e9  # ~100 MB of FP32 activations per image, written once and read ~4x fwd+bwd
RESNET50_PARAM_BYTES = 25.6e6 * 4
SQUAD_FEATURES = 88_641
BERT_BASE = dict(h=768, a=12, L=12, s=384)
BERT_BASE_PARAM_BYTES = 110e6 * 4
#: per step: read weights fwd + bwd, write grads, optimizer reads/writes of weights and state
WEIGHT_PASSES_PER_STEP = 6.0


def _zeus_work(network: str, dataset: str, batch_size: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(FLOPs, bytes) per epoch, or None when the files do not determine them."""
    bs = np.asarray(batch_size, dtype=float)
    if network == "resnet50" and dataset == "imagenet":
        steps = IMAGENET_IMAGES / bs
        return (np.full(bs.shape, IMAGENET_IMAGES * RESNET50_TRAIN_FLOPS),
                IMAGENET_IMAGES * RESNET50_ACT_BYTES + steps * WEIGHT_PASSES_PER_STEP * RESNET50_PARAM_BYTES)
    if network == "bert_base_uncased" and dataset == "squad":
        c = BERT_BASE
        f1, b1 = transformer_layer_fwd(c["h"], c["a"], c["s"], 1, 1, elem_bytes=4)
        w1 = 12.0 * c["h"] ** 2 * 4  # weights are counted per step below, not per sequence
        per_feat_flops = 3.0 * c["L"] * f1
        per_feat_bytes = 3.0 * c["L"] * (b1 - w1)
        steps = SQUAD_FEATURES / bs
        return (np.full(bs.shape, SQUAD_FEATURES * per_feat_flops),
                SQUAD_FEATURES * per_feat_bytes + steps * WEIGHT_PASSES_PER_STEP * BERT_BASE_PARAM_BYTES)
    return None


def load_zeus(root: Path) -> pd.DataFrame:
    """Every Zeus power-limit row: gpu, device, workload, batch size, limit, time per epoch, power (medians
    over optimizers), with FLOPs and bytes per epoch where derivable (NaN otherwise)."""
    frames = []
    for key, dev in ZEUS_GPUS.items():
        p = root / "zeus" / f"summary_power_{key}.csv"
        if not p.is_file():
            continue
        z = _read_power_csv(p, ZEUS_COLUMNS, numeric=("batch_size", "power_limit", "time_per_epoch", "average_power"),
                            complete=("dataset", "network", "batch_size", "power_limit"))
        z = (z.groupby(["dataset", "network", "batch_size", "power_limit"], as_index=False)
             [["time_per_epoch", "average_power"]].median())
        z["device"] = dev
        z["max_limit"] = z["power_limit"].max()
        frames.append(z)
    if not frames:
        return pd.DataFrame()
    z = pd.concat(frames, ignore_index=True)
    z["flops"] = np.nan
    z["bytes"] = np.nan
    for (net, ds), idx in z.groupby(["network", "dataset"]).groups.items():
        w = _zeus_work(net, ds, z.loc[idx, "batch_size"].to_numpy())
        if w is not None:
            z.loc[idx, "flops"], z.loc[idx, "bytes"] = w
    z["workload"] = z["network"] + "/" + z["dataset"] + "/bs" + z["batch_size"].astype(str)
    z["power_w"] = z["average_power"]
    return z


# ------------------------------------------------------------------------------------------- ML.ENERGY
#: (total params, active params, layers, KV heads, head dim) from each model's published config
LLM_ARCH = {
    "google/gemma-2-2b-it": (2.61e9, 2.61e9, 26, 4, 256),
    "google/gemma-2-9b-it": (9.24e9, 9.24e9, 42, 8, 256),
    "google/gemma-2-27b-it": (27.2e9, 27.2e9, 46, 16, 128),
    "meta-llama/Meta-Llama-3.1-8B-Instruct": (8.03e9, 8.03e9, 32, 8, 128),
    "meta-llama/Meta-Llama-3.1-70B-Instruct": (70.6e9, 70.6e9, 80, 8, 128),
    "microsoft/Phi-3-mini-4k-instruct": (3.82e9, 3.82e9, 32, 32, 96),
    "microsoft/Phi-3-small-8k-instruct": (7.39e9, 7.39e9, 32, 8, 128),
    "microsoft/Phi-3-medium-4k-instruct": (14.0e9, 14.0e9, 40, 10, 128),
    "mistralai/Mistral-7B-Instruct-v0.3": (7.25e9, 7.25e9, 32, 8, 128),
    "mistralai/Mistral-Nemo-Instruct-2407": (12.2e9, 12.2e9, 40, 8, 128),
    "mistralai/Mistral-Large-Instruct-2407": (123e9, 123e9, 88, 8, 128),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": (46.7e9, 12.9e9, 32, 8, 128),
    "mistralai/Mixtral-8x22B-Instruct-v0.1": (141e9, 39.1e9, 56, 8, 128),
    "bigcode/starcoder2-3b": (3.03e9, 3.03e9, 30, 2, 128),
    "bigcode/starcoder2-7b": (7.17e9, 7.17e9, 32, 4, 128),
    "bigcode/starcoder2-15b": (15.96e9, 15.96e9, 40, 4, 128),
    "codellama/CodeLlama-7b-hf": (6.74e9, 6.74e9, 32, 32, 128),
    "codellama/CodeLlama-13b-hf": (13.0e9, 13.0e9, 40, 40, 128),
    "codellama/CodeLlama-34b-hf": (33.7e9, 33.7e9, 48, 8, 128),
    "codellama/CodeLlama-70b-hf": (69.0e9, 69.0e9, 80, 8, 128),
    "google/codegemma-1.1-2b": (2.51e9, 2.51e9, 18, 1, 256),
    "google/codegemma-7b": (8.54e9, 8.54e9, 28, 16, 256),
}
#: assumed mean prompt length (tokens) per task: not in the published files
PROMPT_TOKENS = {"llm_text_generation/chat": 256, "llm_text_generation/code": 128}
MLENERGY_GPUS = {"NVIDIA A100-SXM4-40GB": "A100-SXM4-40GB", "NVIDIA H100 80GB HBM3": "H100-SXM5-80GB"}
#: columns the ML.ENERGY table must have: text, then numbers
MLENERGY_TEXT_COLUMNS = ("_task", "Model", "GPU", "_config")
MLENERGY_NUMERIC_COLUMNS = ("_derived_avg_power_W_all_gpus", "TP", "PP", "Token tput (tok/s)", "Avg Output Tokens",
                            "Avg TPOT (s)", "Avg BS (reqs)")


def load_mlenergy(root: Path) -> pd.DataFrame:
    p = root / "mlenergy" / "v2_a100_h100_configs.csv"
    if not p.is_file():
        return pd.DataFrame()
    m = _read_power_csv(p, MLENERGY_TEXT_COLUMNS + MLENERGY_NUMERIC_COLUMNS, numeric=MLENERGY_NUMERIC_COLUMNS)
    m = m[m["_derived_avg_power_W_all_gpus"].notna() & m["_task"].isin(list(PROMPT_TOKENS))
          & m["Model"].isin(list(LLM_ARCH)) & m["GPU"].isin(list(MLENERGY_GPUS))].copy()
    if m.empty:
        return m
    arch = np.array([LLM_ARCH[x] for x in m["Model"]], dtype=float)
    total, active, layers, kvh, hd = arch.T
    n_gpu = m["TP"].fillna(1).to_numpy() * m["PP"].fillna(1).to_numpy()
    tput = m["Token tput (tok/s)"].to_numpy(dtype=float)
    out_tok = m["Avg Output Tokens"].to_numpy(dtype=float)
    prompt = m["_task"].map(PROMPT_TOKENS).to_numpy(dtype=float)
    tpot = m["Avg TPOT (s)"].to_numpy(dtype=float)
    bs = m["Avg BS (reqs)"].to_numpy(dtype=float)
    flops_s = 2.0 * active * (tput + tput / out_tok * prompt)
    kv_per_tok = 2.0 * layers * kvh * hd * 2.0
    bytes_s = (2.0 * total + bs * (prompt + out_tok / 2.0) * kv_per_tok) / tpot
    # one second of serving on one GPU
    m["device"] = m["GPU"].map(MLENERGY_GPUS)
    m["flops"] = flops_s / n_gpu
    m["bytes"] = bytes_s / n_gpu
    m["time_ms"] = 1000.0
    m["power_w"] = m["_derived_avg_power_W_all_gpus"].to_numpy(dtype=float) / n_gpu
    m["dtype"] = "bf16"
    m["workload"] = m["Model"].str.split("/").str[-1] + "/" + m["_config"].astype(str)
    return m


# ------------------------------------------------------------------------------------------ the rows
def _row_frame(src: str, df: pd.DataFrame, spec: DeviceSpec, dtype: str, time_ms) -> pd.DataFrame:
    feats = kernel_power_features(df["flops"].to_numpy(), df["bytes"].to_numpy(), np.asarray(time_ms, dtype=float),
                                  dtype, spec)
    feats.insert(0, "source", src)
    feats.insert(1, "device", spec.name)
    feats.insert(2, "workload", df["workload"].to_numpy())
    feats["power_w"] = df["power_w"].to_numpy(dtype=float)
    return feats


def build_rows(root: Path) -> dict[str, pd.DataFrame]:
    """{'train': rows that fit g, 'perseus_sweep': all Perseus clocks, 'zeus': every Zeus row, 'zeus_train':
    the Zeus part of train with its compute_util, 'a100_pcie_limits': Perseus zeus_global runs}."""
    out: dict[str, pd.DataFrame] = {}
    parts = []
    ps = load_perseus_stages(root)
    if len(ps):
        base = resolve_device(PERSEUS_GPU)
        spec = dataclasses.replace(base, tdp_w=PERSEUS_TDP_W, idle_power_w=IDLE_FRACTION_OF_TDP * base.tdp_w)
        feats = _row_frame("perseus", ps, spec, "bf16", ps["time_ms"].to_numpy())
        feats["frequency_mhz"] = ps["frequency"].to_numpy()
        feats["time_ms"] = ps["time_ms"].to_numpy()
        feats["flops"] = ps["flops"].to_numpy()
        out["perseus_sweep"] = feats
        parts.append(feats[feats["frequency_mhz"] == feats["frequency_mhz"].max()].drop(columns=["frequency_mhz", "time_ms", "flops"]))
    z = load_zeus(root)
    if len(z):
        out["zeus"] = z
        top = z[(z["power_limit"] == z["max_limit"]) & z["flops"].notna()]
        for dev, g in top.groupby("device"):
            feats = _row_frame("zeus", g, resolve_device(dev), "fp32", g["time_per_epoch"].to_numpy() * 1e3)
            parts.append(feats)
    m = load_mlenergy(root)
    if len(m):
        for dev, g in m.groupby("device"):
            parts.append(_row_frame("mlenergy", g, resolve_device(dev), "bf16", g["time_ms"].to_numpy()))
    a100 = root / "perseus" / "zeus_baseline" / "A100_zeus_global.csv"
    if a100.is_file():
        out["a100_pcie_limits"] = _read_power_csv(a100, ("model_name", "power_limit_0", "time", "energy"),
                                                  numeric=("power_limit_0", "time", "energy"),
                                                  complete=("model_name", "power_limit_0", "time", "energy"))
    if not parts:
        return out
    train = pd.concat(parts, ignore_index=True)
    train["g"] = ((train["power_w"] - train["idle_w"]) / (train["tdp_w"] - train["idle_w"])).clip(0.0, 1.0)
    out["train"] = train
    return out


# ------------------------------------------------------------------------------------ imported profiles
#: what an imported power sample needs besides its power to train g: the work done while it was measured (FLOPs,
#: HBM bytes), over how long (ms) and in which dtype, so that compute_util = FLOPs / (time x peak) and memory_util =
#: bytes / (time x bandwidth) are computed as for every shipped row. nvidia-smi / DCGM logs do not record them (their
#: utilization.gpu is the share of time a kernel ran, not the share of peak FLOP/s; not used in their place).
PROFILE_POWER_COLUMNS = ("flops", "bytes", "time_ms", "dtype")
#: why an imported power sample could not join the training rows (counted under the first that applies)
PROFILE_POWER_REASONS = {
    "missing_columns": f"power.csv lacks column(s) of {', '.join(PROFILE_POWER_COLUMNS)}",
    "no_power": "no positive power_w",
    "no_work": "empty or negative flops / bytes, or no positive time_ms",
    "unknown_dtype": "a dtype wattcast does not know",
    "unknown_device": "a GPU the catalog does not know (empty 'Device')",
    "heldout_device": "a held-out GPU (L4, A100 80GB PCIe: never trained on; matched by its figures too)",
    "impossible_power": "a power no board draws: above 1.5x its TDP, or below half its idle power",
}
#: a sample below this fraction of the GPU's idle power (``featurize.power_features.device_idle_w``: the spec's
#: idle_power_w, else 0.15 x TDP) is not a measurement of a powered GPU (a unit mix-up: kW or mW, a corrupt cell). The
#: shipped training rows (Perseus, Zeus, ML.ENERGY: 203 rows on 5 GPUs) draw 1.6-8.0x their idle power; an idle
#: datacenter GPU's floor is near the spec figure (the A100s' measured 34-69 W behind IDLE_FRACTION_OF_TDP). Above,
#: ``profile import``'s rule: more than ``data.profiles.power_logs.TDP_FACTOR`` (1.5) x the catalog TDP
MIN_IDLE_FRACTION = 0.5
#: rows named in the message when samples are left out for an impossible power
NAMED_ROWS = 5


def load_profile_power(folders) -> tuple[pd.DataFrame, dict]:
    """Training rows (as :func:`build_rows` makes them, ``source`` 'profile') from the power samples of imported profile
    folders that carry the work they measured (:data:`PROFILE_POWER_COLUMNS`), and counts: ``rows``, ``used``, one per
    :data:`PROFILE_POWER_REASONS` key, and ``missing`` ({folder: [missing column names]})."""
    from wattcast.data.kernel_ops import DTYPE_BYTES
    from wattcast.data.profiles.tables import read_table

    counts: dict = {"rows": 0, "used": 0, **{k: 0 for k in PROFILE_POWER_REASONS}, "missing": {}, "impossible": [],
                    "heldout": {}}
    parts = []
    for folder in map(Path, folders):
        t = read_table(folder, "power")
        n = len(t)
        counts["rows"] += n
        if n == 0:
            continue
        missing = [c for c in PROFILE_POWER_COLUMNS if c not in t.columns]
        if missing:
            counts["missing_columns"] += n
            counts["missing"][str(folder)] = missing
            continue
        power = pd.to_numeric(t["power_w"], errors="coerce").to_numpy(float)
        flops, bytes_, tms = (pd.to_numeric(t[c], errors="coerce").to_numpy(float) for c in ("flops", "bytes", "time_ms"))
        dtype = t["dtype"].astype(object).fillna("").astype(str).str.strip().str.lower().to_numpy()
        dev = t["Device"].astype(object).fillna("").astype(str).to_numpy()
        why = np.full(n, "", dtype=object)

        def flag(key: str, bad: np.ndarray) -> None:
            why[(why == "") & bad] = key

        flag("no_power", ~(np.isfinite(power) & (power > 0)))
        # zero work is a measurement too (an idle GPU: g = 0); unknown or negative work is not
        flag("no_work", ~(np.isfinite(flops) & np.isfinite(bytes_) & np.isfinite(tms) & (flops >= 0) & (bytes_ >= 0)
                          & (tms > 0)))
        flag("unknown_dtype", ~np.isin(dtype, list(DTYPE_BYTES)))
        known = {}
        for d in np.unique(dev[why == ""]):
            try:
                known[d] = resolve_device(d) if d else None
            except Exception:  # not a catalog GPU: counted below
                known[d] = None
        flag("unknown_device", np.array([known.get(d) is None for d in dev]) & (why == ""))
        # the project's held-out GPUs are never trained on, by name or by figures (training/holdout.py)
        held = {d: heldout_twin(s) for d, s in known.items() if s is not None}
        flag("heldout_device", np.array([held.get(d) is not None for d in dev]) & (why == ""))
        # the importer's rule (above TDP_FACTOR x TDP is no measurement), and below half the idle power
        tdp = np.array([known[d].tdp_w if known.get(d) is not None else np.nan for d in dev], dtype=float)
        idle = np.array([device_idle_w(known[d])[0] if known.get(d) is not None else np.nan for d in dev], dtype=float)
        high, low = (power > TDP_FACTOR * tdp), (power < MIN_IDLE_FRACTION * idle)
        flag("impossible_power", (high | low) & (why == ""))
        for i in np.flatnonzero(why == "impossible_power")[:max(0, NAMED_ROWS - len(counts["impossible"]))]:
            lim = (f"above {TDP_FACTOR:g}x the {known[dev[i]].name} TDP {tdp[i]:g} W" if high[i] else
                   f"below {MIN_IDLE_FRACTION:g}x its idle power {idle[i]:g} W")
            counts["impossible"].append(f"{folder / 'power.csv'} data row {i + 1}: power_w {power[i]:g} W {lim}")
        for d in sorted({dev[i] for i in np.flatnonzero(why == "heldout_device")}):
            counts["heldout"].setdefault(str(folder), []).append(f"{d} (the held-out {held[d]})" if held[d] != d else d)
        for k in PROFILE_POWER_REASONS:
            counts[k] += int((why == k).sum())
        use = why == ""
        counts["used"] += int(use.sum())
        if not use.any():
            continue
        src = t["source"].astype(object).fillna("").astype(str).to_numpy()
        sel = pd.DataFrame({"flops": flops[use], "bytes": bytes_[use], "time_ms": tms[use], "dtype": dtype[use],
                            "power_w": power[use], "device": dev[use],
                            "workload": [f"{folder.name}/{s}/{i}" for s, i in zip(src[use], np.flatnonzero(use))]})
        for (d, dt), g in sel.groupby(["device", "dtype"], sort=True):
            parts.append(_row_frame("profile", g, known[d], dt, g["time_ms"].to_numpy()))
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if len(rows):
        rows["g"] = ((rows["power_w"] - rows["idle_w"]) / (rows["tdp_w"] - rows["idle_w"])).clip(0.0, 1.0)
    return rows, counts


def profile_power_text(counts: dict) -> str:
    """'N of M imported power samples used (left out: ...)', naming the missing columns per folder."""
    left = [f"{counts[k]:,} {k.replace('_', ' ')}" for k in PROFILE_POWER_REASONS if counts.get(k)]
    miss = "; ".join(f"{f}/power.csv lacks {', '.join(repr(c) for c in cols)}" for f, cols in counts["missing"].items())
    held = "; ".join(f"{f}/power.csv has samples of {', '.join(d)}, never trained on"
                     for f, d in (counts.get("heldout") or {}).items())
    bad = counts.get("impossible") or []
    imp = (f"; {counts['impossible_power']:,} sample(s) with a power no board draws left out "
           f"(above {TDP_FACTOR:g}x the GPU's TDP, the rule of `profile import`, or below {MIN_IDLE_FRACTION:g}x its "
           f"idle power): {'; '.join(bad)}" + (" ..." if counts["impossible_power"] > len(bad) else "")
           if counts.get("impossible_power") else "")
    return (f"{counts['used']:,} of {counts['rows']:,} imported power samples used"
            + (f" (left out: {', '.join(left)})" if left else "") + (f"; {miss}" if miss else "")
            + (f"; {held}" if held else "") + imp)


def fingerprint(train: pd.DataFrame) -> str:
    cols = ["source", "device", "workload", "compute_util", "memory_util", "power_w"]
    h = hashlib.sha256(pd.util.hash_pandas_object(train[cols].round(6), index=False).values.tobytes())
    return h.hexdigest()[:12]


def _weights(train: pd.DataFrame) -> np.ndarray:
    n = train.groupby("device")["device"].transform("size").to_numpy(dtype=float)
    return PER_DEVICE_WEIGHT / n


# -------------------------------------------------------------------------------------------- fitting
def _curve_loss(a: np.ndarray, uc, um, idle, tdp, y, w) -> np.ndarray:
    """Weighted squared relative power error of g = 1 - exp(-a (u_c + u_m)) for each slope in ``a``."""
    z = np.outer(a, uc + um)
    pred = idle + (tdp - idle) * (1.0 - np.exp(-z))
    return (w * ((pred - y) / y) ** 2).sum(axis=1)


def fit_curve(train: pd.DataFrame, w: np.ndarray | None = None) -> dict[str, float]:
    """The shipped curve: g = 1 - exp(-a (compute_util + memory_util)), one slope ``a`` >= 0 (a0 = 0: no
    activity is idle; one slope for both units: the free fit below puts them within 15% of each other, and
    tying them is what carries over to unseen GPUs, see the leave-one-GPU-out table). Weighted least squares
    on relative power error: a grid, then golden-section refinement."""
    uc, um = train["compute_util"].to_numpy(float), train["memory_util"].to_numpy(float)
    idle, tdp = train["idle_w"].to_numpy(float), train["tdp_w"].to_numpy(float)
    y = train["power_w"].to_numpy(float)
    w = np.ones(len(y)) if w is None else np.asarray(w, float)
    grid = np.arange(0.05, 20.0, 0.05)
    i = int(np.argmin(_curve_loss(grid, uc, um, idle, tdp, y, w)))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    gr = (np.sqrt(5) - 1) / 2
    for _ in range(40):
        c, d = hi - gr * (hi - lo), lo + gr * (hi - lo)
        lc, ld = _curve_loss(np.array([c, d]), uc, um, idle, tdp, y, w)
        lo, hi = (lo, d) if lc < ld else (c, hi)
    a = float((lo + hi) / 2)
    return {"a0": 0.0, "a_c": a, "a_m": a}


def fit_curve_free(train: pd.DataFrame, w: np.ndarray | None = None, iters: int = 60) -> dict[str, float]:
    """a0, a_c, a_m >= 0 of g = 1 - exp(-(a0 + a_c u_c + a_m u_m)), weighted least squares on power relative
    error (Gauss-Newton with step halving, projected onto >= 0; starts from the linearised fit). Reported
    for comparison: on unseen GPUs the two slopes are not identified (training rows move u_c and u_m together)."""
    uc = train["compute_util"].to_numpy(float)
    um = train["memory_util"].to_numpy(float)
    idle, tdp = train["idle_w"].to_numpy(float), train["tdp_w"].to_numpy(float)
    y = train["power_w"].to_numpy(float)
    w = np.ones(len(y)) if w is None else np.asarray(w, float)
    X = np.column_stack([np.ones_like(uc), uc, um])
    gt = np.clip((y - idle) / (tdp - idle), 1e-3, 0.97)
    sw = np.sqrt(w)
    theta = np.clip(np.linalg.lstsq(X * sw[:, None], -np.log1p(-gt) * sw, rcond=None)[0], 0.0, None)

    def resid(th):
        z = np.maximum(X @ th, 0.0)
        pred = idle + (tdp - idle) * (1.0 - np.exp(-z))
        return (pred - y) / y * sw, z

    r, z = resid(theta)
    loss = float(r @ r)
    for _ in range(iters):
        J = ((tdp - idle) * np.exp(-z) / y * sw)[:, None] * X * (z > 0)[:, None]
        step = np.linalg.lstsq(J, -r, rcond=None)[0]
        lam = 1.0
        improved = False
        while lam > 1e-4:
            th = np.clip(theta + lam * step, 0.0, None)
            r2, z2 = resid(th)
            l2 = float(r2 @ r2)
            if l2 < loss - 1e-12:
                theta, r, z, loss, improved = th, r2, z2, l2, True
                break
            lam /= 2
        if not improved:
            break
    return {"a0": float(theta[0]), "a_c": float(theta[1]), "a_m": float(theta[2])}


def fit_lgbm(train: pd.DataFrame, w: np.ndarray | None = None):
    import lightgbm as lgb

    X = lgbm_matrix(train)
    mono = [1 if c in ("compute_util", "memory_util") else 0 for c in LGBM_FEATURES]
    params = dict(LGBM_PARAMS, monotone_constraints=mono, monotone_constraints_method="advanced")
    ds = lgb.Dataset(X, label=train["g"].to_numpy(float), weight=w, feature_name=list(LGBM_FEATURES),
                     free_raw_data=False, params={"verbose": -1})
    return lgb.train(params, ds, num_boost_round=LGBM_ROUNDS)


def baseline_w(frame: pd.DataFrame) -> np.ndarray:
    """TDP x utilisation (the busier unit), floored at idle: the naive baseline."""
    u = np.maximum(frame["compute_util"].to_numpy(float), frame["memory_util"].to_numpy(float))
    return np.clip(frame["tdp_w"].to_numpy(float) * u, frame["idle_w"].to_numpy(float), frame["tdp_w"].to_numpy(float))


def _ape(pred, meas) -> np.ndarray:
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    return np.abs(pred - meas) / meas


def lodo(train: pd.DataFrame) -> pd.DataFrame:
    """Predictions for each GPU from models fitted on the other GPUs (curve and LightGBM)."""
    out = train[["source", "device", "workload", "compute_util", "memory_util", "power_w", "tdp_w", "idle_w"]].copy()
    for k in FORMS:
        out[f"pred_{k}"] = np.nan
    for dev in sorted(train["device"].unique()):
        te = (train["device"] == dev).to_numpy()
        tr = train[~te]
        w = _weights(tr)
        curve = PowerModel(form="curve", params=fit_curve(tr, w))
        out.loc[te, "pred_curve"] = curve.predict_w(train[te])[0]
        free = PowerModel(form="curve", params=fit_curve_free(tr, w))
        out.loc[te, "pred_curve_free"] = free.predict_w(train[te])[0]
        lg = PowerModel(form="lgbm", params={}, booster=fit_lgbm(tr, w))
        out.loc[te, "pred_lgbm"] = lg.predict_w(train[te])[0]
    out["pred_baseline"] = baseline_w(train)
    for k in (*FORMS, "baseline"):
        out[f"ape_{k}"] = _ape(out[f"pred_{k}"], out["power_w"])
    return out


def lodo_table(pred: pd.DataFrame, chosen: str) -> pd.DataFrame:
    rows = []
    for (dev, src), g in pred.groupby(["device", "source"]):
        rows.append({"device": dev, "source": src, "rows": len(g),
                     "measured_w_mean": g["power_w"].mean(),
                     "compute_util_mean": g["compute_util"].mean(), "memory_util_mean": g["memory_util"].mean(),
                     "curve_mape_pct": g["ape_curve"].mean() * 100, "curve_free_mape_pct": g["ape_curve_free"].mean() * 100,
                     "lgbm_mape_pct": g["ape_lgbm"].mean() * 100,
                     "baseline_mape_pct": g["ape_baseline"].mean() * 100,
                     "chosen_mape_pct": g[f"ape_{chosen}"].mean() * 100,
                     "chosen_run_avg_err_pct": (g[f"pred_{chosen}"].mean() / g["power_w"].mean() - 1) * 100})
    return pd.DataFrame(rows).round(2)


# ------------------------------------------------------------------------------ the clock response
#: grids of the knee clock law's fit (:func:`fit_knee`): knee clock ratio and voltage slope, coarse then fine
KNEE_GRID = np.arange(0.40, 1.0001, 0.005)
SLOPE_GRID = np.arange(0.0, 4.0001, 0.01)


def _knee_fraction(s: np.ndarray, knee: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """:func:`wattcast.models.power.clock_power_fraction` of the knee law, broadcast over parameter grids."""
    v = 1.0 + slope * np.maximum(s - knee, 0.0)
    v1 = 1.0 + slope * np.maximum(1.0 - knee, 0.0)
    return s * (v / v1) ** 2


def fit_knee(s: np.ndarray, p_w: np.ndarray, p_top: np.ndarray, idle: np.ndarray) -> tuple[float, float, float]:
    """(knee_clock_ratio, voltage_slope, power MAPE %) of the knee law (models/power.py) fitted to measured power at
    clock ratios ``s`` below the boost clock: least squares on the relative power error
    ``(idle + (p_top - idle) x fraction(s) - p_w) / p_w``, a grid (:data:`KNEE_GRID` x :data:`SLOPE_GRID`) then a
    finer one around its best point."""
    s, p_w, p_top, idle = (np.asarray(a, float) for a in (s, p_w, p_top, idle))

    def best(knees, slopes):
        k, b = np.meshgrid(knees, slopes, indexing="ij")
        k, b = k.reshape(-1, 1), b.reshape(-1, 1)
        pred = idle + (p_top - idle) * _knee_fraction(s[None, :], k, b)
        loss = np.sum(((pred - p_w) / p_w) ** 2, axis=1)
        i = int(np.argmin(loss))
        return float(k[i, 0]), float(b[i, 0])

    k0, b0 = best(KNEE_GRID, SLOPE_GRID)
    k1, b1 = best(np.clip(np.arange(k0 - 0.005, k0 + 0.00501, 0.0005), 0.05, 1.0),
                  np.clip(np.arange(b0 - 0.01, b0 + 0.01001, 0.0005), 0.0, None))
    pred = idle + (p_top - idle) * _knee_fraction(s, k1, b1)
    return k1, b1, float(_ape(pred, p_w).mean() * 100)


def fit_clock_response(sweep: pd.DataFrame) -> dict[str, float]:
    """The clock law on Perseus's A100 SXM sweeps: alpha of the shipped power law (P(f) - idle) / (P(f_max) - idle) =
    (f / f_max)^alpha (least squares in log space, all Perseus rows), the knee law's knee clock ratio and voltage slope
    (:func:`fit_knee`; evaluated, not shipped: models/power.py says why), and phi / u_ref from
    t(f) / t(f_max) = (1 - phi) + phi f_max / f (per row, then pooled)."""
    rows = []
    for wl, g in sweep.groupby("workload"):
        g = g.sort_values("frequency_mhz")
        top = g.iloc[-1]
        s = g["frequency_mhz"].to_numpy(float) / top["frequency_mhz"]
        idle = float(top["idle_w"])
        yp = (g["power_w"].to_numpy(float) - idle) / (top["power_w"] - idle)
        yt = g["time_ms"].to_numpy(float) / top["time_ms"]
        rows.append(pd.DataFrame({"workload": wl, "s": s, "yp": yp, "yt": yt, "u_top": top["compute_util"],
                                  "p_w": g["power_w"].to_numpy(float), "p_top": top["power_w"], "idle": idle,
                                  "t_ms": g["time_ms"].to_numpy(float), "t_top": top["time_ms"]}))
    d = pd.concat(rows, ignore_index=True)
    m = d["s"] < 1.0
    ls, lp = np.log(d.loc[m, "s"]), np.log(np.clip(d.loc[m, "yp"], 1e-6, None))
    alpha = float((ls @ lp) / (ls @ ls))
    # time: yt - 1 = phi (1/s - 1)
    xs = 1.0 / d.loc[m, "s"] - 1.0
    phi = float((xs @ (d.loc[m, "yt"] - 1.0)) / (xs @ xs))
    u_top = float(d["u_top"].mean())
    u_ref = u_top / min(max(phi, 1e-3), 1.0)
    # free static-power fit, for the report: P = c + k s^alpha2, grid over alpha2
    best = None
    for a2 in np.arange(1.0, 4.01, 0.05):
        X = np.column_stack([np.ones(m.sum()), d.loc[m, "s"] ** a2])
        pr = d.loc[m, "p_w"].to_numpy() / d.loc[m, "p_top"].to_numpy()
        coef, res, *_ = np.linalg.lstsq(X, pr, rcond=None)
        sse = float(np.sum((X @ coef - pr) ** 2))
        if best is None or sse < best[0]:
            best = (sse, a2, coef[0])
    pred_p = d["idle"] + (d["p_top"] - d["idle"]) * d["s"] ** alpha
    pred_t = d["t_top"] * ((1 - phi) + phi / d["s"])
    knee, slope, knee_mape = fit_knee(d.loc[m, "s"], d.loc[m, "p_w"], d.loc[m, "p_top"], d.loc[m, "idle"])
    low = m & (d["s"] < 0.7)  # below the knee: where the two laws part
    pred_k = d["idle"] + (d["p_top"] - d["idle"]) * _knee_fraction(d["s"].to_numpy(float), knee, slope)
    return {
        "knee_clock_ratio": knee, "voltage_slope": slope, "sweep_knee_power_mape_pct": knee_mape,
        "sweep_knee_power_mape_below_0.7_pct": float(_ape(pred_k[low], d.loc[low, "p_w"]).mean() * 100),
        "sweep_power_law_mape_below_0.7_pct": float(_ape(pred_p[low], d.loc[low, "p_w"]).mean() * 100),
        "alpha": alpha, "phi": phi, "u_ref": u_ref, "u_top_mean": u_top,
        "alpha_free_static": float(best[1]), "static_share_free": float(best[2]),
        "sweep_power_mape_pct": float(_ape(pred_p[m], d.loc[m, "p_w"]).mean() * 100),
        # signed means beside the MAPEs (predicted / measured - 1, %; + = predicted above measured)
        "sweep_power_signed_pct": float(((pred_p[m] / d.loc[m, "p_w"]) - 1.0).mean() * 100),
        "sweep_knee_power_signed_pct": float(((pred_k[m] / d.loc[m, "p_w"]) - 1.0).mean() * 100),
        "sweep_time_mape_pct": float(_ape(pred_t[m], d.loc[m, "t_ms"]).mean() * 100),
        "sweep_rows": int(m.sum()), "sweep_clock_min_mhz": float(sweep["frequency_mhz"].min()),
    }


def limit_response(model: PowerModel, zeus: pd.DataFrame, a100: pd.DataFrame | None) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Predicted vs measured time and power under lower power limits, starting from the measured run at
    the top limit (so only the response is tested). Time needs compute utilisation: ResNet-50 and
    BERT/SQuAD rows only; power uses every workload."""
    rows = []
    for dev, g in zeus.groupby("device"):
        spec = resolve_device(dev)
        for wl, w in g.groupby("workload"):
            top = w[w["power_limit"] == w["max_limit"]]
            if top.empty:
                continue
            t0, p0 = float(top["time_per_epoch"].iloc[0]), float(top["average_power"].iloc[0])
            uc = np.nan
            if np.isfinite(top["flops"].iloc[0]):
                uc = float(kernel_power_features(top["flops"].iloc[0], top["bytes"].iloc[0], t0 * 1e3, "fp32", spec)
                           ["compute_util"].iloc[0])
            for _, r in w[w["power_limit"] < w["max_limit"]].iterrows():
                t1, p1 = apply_power_limit(t0, p0, float(r["power_limit"]), spec, 0.0 if np.isnan(uc) else uc, model)
                rows.append({"source": "zeus", "device": dev, "workload": wl, "limit_w": r["power_limit"],
                             "capped": p0 > r["power_limit"], "has_util": np.isfinite(uc),
                             "t_meas": r["time_per_epoch"], "t_pred": float(t1), "t_top": t0,
                             "p_meas": r["average_power"], "p_pred": float(p1), "p_top": p0})
    if a100 is not None and len(a100):
        spec = resolve_device("A100-PCIe-80GB")
        for mdl, g in a100.groupby("model_name"):
            top = g[g["power_limit_0"] == g["power_limit_0"].max()]
            t0 = float(top["time"].iloc[0])
            p0 = float(top["energy"].iloc[0]) / t0 / 4.0  # 4 GPUs
            for _, r in g[g["power_limit_0"] < g["power_limit_0"].max()].iterrows():
                # compute utilisation unknown: time predicted for a fully compute-bound step (upper bound)
                t1, p1 = apply_power_limit(t0, p0, float(r["power_limit_0"]), spec, 1.0, model)
                # held-out hardware (A100 80GB PCIe): evaluated here, never fitted or selected on
                rows.append({"source": "perseus-a100-pcie", "device": "A100-PCIe-80GB", "workload": mdl,
                             "limit_w": r["power_limit_0"], "capped": p0 > r["power_limit_0"], "has_util": False,
                             "t_meas": r["time"], "t_pred": float(t1), "t_top": t0,
                             "p_meas": float(r["energy"]) / float(r["time"]) / 4.0, "p_pred": float(p1), "p_top": p0})
    d = pd.DataFrame(rows)
    if d.empty:
        return d, d, {}
    d["p_ape"] = _ape(d["p_pred"], d["p_meas"])
    d["p_ape_nochange"] = _ape(d["p_top"], d["p_meas"])
    d["t_ape"] = _ape(d["t_pred"], d["t_meas"])
    d["t_ape_nochange"] = _ape(d["t_top"], d["t_meas"])
    d["t_err"] = d["t_pred"] / d["t_meas"] - 1.0
    d["e_ratio_meas"] = d["t_meas"] * d["p_meas"] / (d["t_top"] * d["p_top"])
    d["e_ratio_pred"] = d["t_pred"] * d["p_pred"] / (d["t_top"] * d["p_top"])
    d["e_err"] = d["e_ratio_pred"] / d["e_ratio_meas"] - 1.0
    d["heldout"] = d["device"].map(lambda x: heldout_twin(resolve_device(x)) is not None)
    summ = []
    for (src, dev), g in d.groupby(["source", "device"]):
        c = g[g["capped"]]
        cu = c[c["has_util"]] if c["has_util"].any() else c  # the held-out A100 PCIe rows: time at compute_util 1
        emin = _energy_minimum(g)
        summ.append({"source": src, "device": dev, "heldout": bool(g["heldout"].iloc[0]), "rows": len(g),
                     "capped_rows": len(c),
                     "capped_time_bias_pct": cu["t_err"].mean() * 100 if len(cu) else np.nan,
                     "capped_energy_ratio_mape_pct": cu["e_err"].abs().mean() * 100 if len(cu) else np.nan,
                     "capped_energy_ratio_bias_pct": cu["e_err"].mean() * 100 if len(cu) else np.nan,
                     "emin_limit_match_share": emin["match"].mean() if len(emin) else np.nan,
                     "emin_limit_offset_w": (emin["pred_w"] - emin["meas_w"]).mean() if len(emin) else np.nan,
                     "power_mape_pct": g["p_ape"].mean() * 100,
                     "power_mape_nochange_pct": g["p_ape_nochange"].mean() * 100,
                     "capped_power_mape_pct": c["p_ape"].mean() * 100 if len(c) else np.nan,
                     "capped_time_mape_pct": cu["t_ape"].mean() * 100 if len(cu) else np.nan,
                     "capped_time_mape_nochange_pct": cu["t_ape_nochange"].mean() * 100 if len(cu) else np.nan,
                     "capped_time_rows": len(cu) if g["has_util"].any() else 0,
                     "meas_slowdown_pct": (cu["t_meas"] / cu["t_top"] - 1).mean() * 100 if len(cu) else np.nan,
                     "pred_slowdown_pct": (cu["t_pred"] / cu["t_top"] - 1).mean() * 100 if len(cu) else np.nan})
    s = pd.DataFrame(summ).round(2)
    metrics = {}
    for _, r in s.iterrows():
        key = f"{r['source']}_{r['device']}"
        metrics[f"limit_{key}_power_mape_pct"] = r["power_mape_pct"]
        if np.isfinite(r["capped_time_mape_pct"]):
            metrics[f"limit_{key}_time_mape_pct"] = r["capped_time_mape_pct"]
            metrics[f"limit_{key}_time_nochange_mape_pct"] = r["capped_time_mape_nochange_pct"]
            metrics[f"limit_{key}_time_bias_pct"] = r["capped_time_bias_pct"]
            metrics[f"limit_{key}_energy_ratio_mape_pct"] = r["capped_energy_ratio_mape_pct"]
            metrics[f"limit_{key}_energy_ratio_bias_pct"] = r["capped_energy_ratio_bias_pct"]
            metrics[f"limit_{key}_emin_offset_w"] = r["emin_limit_offset_w"]
    return d, s, metrics


def _energy_minimum(g: pd.DataFrame) -> pd.DataFrame:
    """Per workload of limit-response rows (:func:`limit_response`; time needs a compute utilisation, so rows without
    one are left out unless none has one): the limit (W) at which the measured and the predicted energy per unit of work
    are lowest, the top limit (ratio 1) included, and whether they agree."""
    g = g[g["has_util"]] if g["has_util"].any() else g
    out = []
    for wl, w in g.groupby("workload"):
        top = float(w["limit_w"].max() + 1.0)  # the uncapped run: its own row is not in the table; ratio 1
        lim = np.append(w["limit_w"].to_numpy(float), np.inf)
        em, ep = np.append(w["e_ratio_meas"].to_numpy(float), 1.0), np.append(w["e_ratio_pred"].to_numpy(float), 1.0)
        lim = np.where(np.isfinite(lim), lim, top)
        out.append({"workload": wl, "meas_w": lim[int(np.argmin(em))], "pred_w": lim[int(np.argmin(ep))]})
    e = pd.DataFrame(out)
    if len(e):
        e["match"] = e["meas_w"] == e["pred_w"]
    return e


def clock_checks(model: PowerModel, sweep: pd.DataFrame | None, zeus: pd.DataFrame | None) -> dict[str, float]:
    """How ``model``'s clock law fits what it is fitted and checked on (the gate compares a retrain with the working
    model on these): ``clock_sweep_power_mape_pct``, power at every clock of Perseus's A100 SXM sweeps from the
    top clock's measured power; ``clock_zeus_time_mape_pct``, the mean over the Zeus GPUs of the capped-time MAPE
    (:func:`limit_response` without the held-out A100 PCIe rows)."""
    from wattcast.models.power import clock_power_fraction

    out: dict[str, float] = {}
    if sweep is not None and len(sweep):
        parts = []
        for _, g in sweep.groupby("workload"):
            top = g.loc[g["frequency_mhz"].idxmax()]
            s = g["frequency_mhz"].to_numpy(float) / float(top["frequency_mhz"])
            pred = top["idle_w"] + (top["power_w"] - top["idle_w"]) * clock_power_fraction(s, model)
            parts.append(_ape(pred, g["power_w"].to_numpy(float))[s < 1.0])
        out["clock_sweep_power_mape_pct"] = float(np.concatenate(parts).mean() * 100)
    if zeus is not None and len(zeus):
        _, summ, _ = limit_response(model, zeus, None)
        t = summ["capped_time_mape_pct"].dropna() if len(summ) else pd.Series(dtype=float)
        if len(t):
            out["clock_zeus_time_mape_pct"] = float(t.mean())
    return out


def accelwattch_range(root: Path, model: PowerModel) -> dict[str, float]:
    """The 26 AccelWattch Volta kernels have no utilisation: only check that they sit in [idle, TDP] for a
    250 W Volta board and where they fall on the model's g axis."""
    p = root / "hw_power_validation_volta.csv"
    if not p.is_file():
        return {}
    a = _read_power_csv(p, ("mean HW_power",), numeric=("mean HW_power",), complete=("mean HW_power",))
    spec = resolve_device("V100-PCIe-32GB")
    from wattcast.models.power import idle_power_w

    idle, tdp = idle_power_w(spec), float(spec.tdp_w)
    w = a["mean HW_power"].to_numpy(float)
    return {"accelwattch_kernels": float(len(w)), "accelwattch_in_idle_tdp_frac": float(np.mean((w >= idle) & (w <= tdp))),
            "accelwattch_min_w": float(w.min()), "accelwattch_max_w": float(w.max())}


# ------------------------------------------------------------------------------------------------ gate
def gate_decision(new: PowerModel, target: Path, train: pd.DataFrame, new_lodo_pct: float,
                  clock_rows: tuple[pd.DataFrame | None, pd.DataFrame | None] | None = None,
                  force: bool = False) -> tuple[bool, str, dict]:
    """(replace?, why, gate metrics): the new model against the target's live one (versioned or flat layout) on the
    current rows, device-weighted, overall and per part (shipped datasets' rows, imported profiles' rows: neither may
    get worse by more than ``GATE_TOLERANCE``), and on the recorded leave-one-GPU-out figure; with ``clock_rows``
    (Perseus sweep rows, Zeus rows) its clock law too (:func:`clock_checks`: neither the sweep's power nor the Zeus
    capped time may get worse by more than ``GATE_TOLERANCE``; until stop 56 the clock law was not judged). A target with no working
    model (a new --out) is compared with the shipped one, the model ``predict`` uses without --power-model (until
    stop 54 it was written unjudged: 0.25 W samples at 1e14 FLOP/s, LODO 7455%, became a fresh folder's model).
    ``force``: replace whatever the gate says, the reason saying what it would have refused (training/gate_force.py
    ``verdict``)."""
    against = None
    try:
        live = resolve_power_folder(target)
        missing = None if (live / MANIFEST).is_file() else "no power model at the target"
    except ValueError as e:  # a pointer to a missing version: there is no working model to keep
        missing = f"the existing power model does not load ({e})"
    old = None
    if missing is None:
        try:
            old = PowerModel.load(target)
            old_ape = _ape(old.predict_w(train)[0], train["power_w"])
        except Exception as e:  # an unreadable old artifact is not a working model
            missing, old = f"the existing power model does not load or predict ({e})", None
    if old is None:
        try:
            old = PowerModel.load(shipped_reference(target, shipped_folder()))
            old_ape = _ape(old.predict_w(train)[0], train["power_w"])
        except Exception:  # no shipped model to compare with (a stripped install, or the target is it)
            return True, f"{missing}: {'writing the new one' if missing.startswith('no power') else 'replacing it'}", {}
        against = missing
    ok, why, m = _judge(new, old, old_ape, train, new_lodo_pct, clock_rows)
    return (*verdict(ok, why, force, "power model", "--power-model", against=against), m)


def _judge(new: PowerModel, old: PowerModel, old_ape: np.ndarray, train: pd.DataFrame, new_lodo_pct: float,
           clock_rows=None):
    """The gate proper (:func:`gate_decision`) with the working model ``old`` and its errors on ``train``."""
    new_ape = _ape(new.predict_w(train)[0], train["power_w"])
    w = _weights(train)
    n_, o_ = float(np.average(new_ape, weights=w) * 100), float(np.average(old_ape, weights=w) * 100)
    m = {"gate_new_mape_pct": n_, "gate_old_mape_pct": o_}
    imported = (train["source"] == "profile").to_numpy()
    worse = []
    if imported.any():
        for part, sel in (("shipped", ~imported), ("imported", imported)):
            if not sel.any():
                continue
            pn = float(np.average(new_ape[sel], weights=w[sel]) * 100)
            po = float(np.average(old_ape[sel], weights=w[sel]) * 100)
            m[f"gate_{part}_new_mape_pct"], m[f"gate_{part}_old_mape_pct"] = pn, po
            if pn > po * (1 + GATE_TOLERANCE) + 1e-9:
                worse.append(f"{part} rows {pn:.2f}% vs {po:.2f}%")
    old_lodo = old.meta.get("metrics", {}).get("lodo_mean_gpu_mape_pct")
    what = f"{n_:.2f}% vs {o_:.2f}% device-weighted MAPE on {len(train)} rows"
    if n_ > o_ * (1 + GATE_TOLERANCE) + 1e-9:
        return False, f"kept the existing power model: the new one fits worse ({what})", m
    if worse:
        return False, f"kept the existing power model: the new one regresses {'; '.join(worse)} ({what})", m
    if old_lodo is not None and new_lodo_pct > float(old_lodo) * (1 + GATE_TOLERANCE) + 1e-9:
        return False, (f"kept the existing power model: leave-one-GPU-out {new_lodo_pct:.2f}% vs {float(old_lodo):.2f}% "
                       f"({what})"), m
    if clock_rows is not None:
        cn, co = clock_checks(new, *clock_rows), clock_checks(old, *clock_rows)
        clock_worse = []
        for k in sorted(set(cn) & set(co)):
            m[f"gate_new_{k}"], m[f"gate_old_{k}"] = cn[k], co[k]
            if cn[k] > co[k] * (1 + GATE_TOLERANCE) + 1e-9:
                clock_worse.append(f"{k} {cn[k]:.2f} vs {co[k]:.2f}")
        if clock_worse:
            return False, f"kept the existing power model: its clock law fits worse ({'; '.join(clock_worse)}; {what})", m
        what += "; clock law " + ", ".join(f"{k} {cn[k]:.2f} vs {co[k]:.2f}" for k in sorted(set(cn) & set(co)))
    return True, f"new power model validates no worse ({what})", m


# ---------------------------------------------------------------------------------------------- plots
def _plot(pred: pd.DataFrame, chosen: str, limits: pd.DataFrame | None, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    ax = axes[0]
    for dev, g in pred.groupby("device"):
        ax.scatter(g["power_w"], g[f"pred_{chosen}"], s=10, alpha=0.6,
                   label=f"{dev} ({g[f'ape_{chosen}'].mean()*100:.1f}%, base {g['ape_baseline'].mean()*100:.0f}%)")
    hi = float(max(pred["power_w"].max(), pred[f"pred_{chosen}"].max())) * 1.05
    ax.plot([0, hi], [0, hi], "k--", lw=1)
    ax.set_xlabel("measured average power per GPU (W)")
    ax.set_ylabel(f"predicted, GPU held out ({chosen}) (W)")
    ax.set_title("Leave-one-GPU-out power (MAPE; TDP x util baseline)")
    ax.legend(fontsize=7)
    ax = axes[1]
    if limits is not None and len(limits):
        c = limits[limits["capped"] & limits["has_util"]]
        for dev, g in c.groupby("device"):
            ax.scatter(g["t_meas"] / g["t_top"], g["t_pred"] / g["t_top"], s=12, alpha=0.7, label=dev)
        lo_hi = [0.95, float(max(1.2, (c["t_meas"] / c["t_top"]).max() * 1.05 if len(c) else 1.2))]
        ax.plot(lo_hi, lo_hi, "k--", lw=1)
        ax.legend(fontsize=8)
    ax.set_xlabel("measured slowdown under the power limit")
    ax.set_ylabel("predicted slowdown")
    ax.set_title("Power-limit response (Zeus, ResNet-50 & BERT)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ run
def run_train_power(data=None, out_dir=None, tracking_dir="mlruns", use_mlflow: bool = True, log=print,
                    profiles=(), force: bool = False) -> dict:
    """Build rows, fit, evaluate leave-one-GPU-out, fit the clock response, check power limits, gate, log; install the
    model as the target's new live version (models/power.py ``install_power_model``) when it validates (against the
    target's working model, or at a new target the shipped one). ``force``: install it even when the gate refuses it
    (the reason says what it overrode), like ``train kernels --force``.

    ``profiles``: imported profile folders whose power samples carry the work they measured
    (:data:`PROFILE_POWER_COLUMNS`) join the training rows; the others are counted per reason
    (``result["imported"]``), and a PowerDataError names the missing columns when none can be used.

    Returns ``{"summary": DataFrame (per GPU and source), "metrics": dict, "replaced": bool, "reason": str,
    "run_id": str|None, "tables": {name: DataFrame}, "out_dir": Path, "imported": counts or None}``."""
    from wattcast.data.kernel_datasets import DataNotFoundError, resolve_data_root

    t0 = time.time()
    root = resolve_data_root(data) / "power"
    if not root.is_dir():
        raise DataNotFoundError(f"power data folder not found: {root} (expected shared/datasets/power with the "
                                "Perseus, Zeus and ML.ENERGY files). Point to the datasets folder with --data PATH "
                                "or WATTCAST_DATA.")
    profiles = [Path(p) for p in profiles or ()]
    icounts = None
    if profiles:
        prof_rows, icounts = load_profile_power(profiles)
        if icounts["used"] == 0:
            raise PowerDataError(
                f"--data {', '.join(map(str, profiles))}: no imported power sample can train the power model: "
                f"{profile_power_text(icounts)}" + (
                    ". The model fits g(compute_util, memory_util), and those come from the work each sample measured: "
                    f"add the columns {', '.join(PROFILE_POWER_COLUMNS)} (FLOPs and HBM bytes done during the sample's "
                    "time_ms window, in that dtype) to use the samples; nvidia-smi / DCGM utilisation percentages are "
                    "not a substitute" if icounts["missing_columns"] else ""))
        log(("power: warning: " if icounts["impossible_power"] or icounts["heldout_device"] else "power: ")
            + profile_power_text(icounts))
    rows = build_rows(root)
    train = rows.get("train")
    if train is None or train.empty:
        raise DataNotFoundError(f"no usable power rows under {root}")
    held = train["device"].map(lambda d: heldout_twin(resolve_device(d)) is not None).to_numpy()
    if held.any():  # the shared power data holds none today; never trained on if it does
        log(f"power: left out {int(held.sum())} shared rows of held-out GPUs "
            f"({', '.join(sorted(set(train.loc[held, 'device'])))}): never trained on")
        train = train[~held].reset_index(drop=True)
    if profiles:
        train = pd.concat([train, prof_rows[list(train.columns)]], ignore_index=True)
    if "perseus_sweep" not in rows:
        raise DataNotFoundError(f"{root}/perseus/stage_profile: the Perseus stage sweeps fit the clock response; not found")
    fp = fingerprint(train)
    log(f"power: {len(train)} rows on {train['device'].nunique()} GPUs "
        f"({', '.join(f'{k}: {v}' for k, v in train['source'].value_counts().items())}); fingerprint {fp}")

    pred = lodo(train)
    per_gpu = {k: pred.groupby("device")[f"ape_{k}"].mean() * 100 for k in (*FORMS, "baseline")}
    mean_gpu = {k: float(v.mean()) for k, v in per_gpu.items()}
    chosen = min(FORMS, key=lambda k: mean_gpu[k])
    log(f"power: leave-one-GPU-out mean per-GPU MAPE curve {mean_gpu['curve']:.1f}%, free curve "
        f"{mean_gpu['curve_free']:.1f}%, LightGBM {mean_gpu['lgbm']:.1f}%, TDP x utilisation "
        f"{mean_gpu['baseline']:.1f}% -> {chosen}")

    clock = fit_clock_response(rows["perseus_sweep"])
    w = _weights(train)
    params = fit_curve_free(train, w) if chosen == "curve_free" else fit_curve(train, w)
    params_free = fit_curve_free(train, w)
    booster = fit_lgbm(train, w) if chosen == "lgbm" else None
    # band: quantiles of log(measured / predicted) on held-out GPUs
    lr = np.log(pred["power_w"] / pred[f"pred_{chosen}"])
    band = (float(np.quantile(lr, 0.1)), float(np.quantile(lr, 0.9)))
    support = {c: (float(train[c].min()), float(train[c].max())) for c in ("compute_util", "memory_util")}
    support["tdp_w"] = (float(train["tdp_w"].min()), float(train["tdp_w"].max()))

    metrics: dict[str, float] = {
        "lodo_mean_gpu_mape_pct": mean_gpu[chosen],
        "lodo_curve_mean_gpu_mape_pct": mean_gpu["curve"],
        "lodo_curve_free_mean_gpu_mape_pct": mean_gpu["curve_free"],
        "lodo_lgbm_mean_gpu_mape_pct": mean_gpu["lgbm"],
        "baseline_tdp_x_util_mean_gpu_mape_pct": mean_gpu["baseline"],
        "lodo_row_mape_pct": float(pred[f"ape_{chosen}"].mean() * 100),
        **{f"clock_{k}": float(v) for k, v in clock.items()},
        "train_rows": float(len(train)),
    }
    for dev in per_gpu["curve"].index:
        metrics[f"lodo_{dev}_mape_pct"] = float(per_gpu[chosen][dev])
        metrics[f"lodo_{dev}_curve_mape_pct"] = float(per_gpu["curve"][dev])
        metrics[f"lodo_{dev}_curve_free_mape_pct"] = float(per_gpu["curve_free"][dev])
        metrics[f"lodo_{dev}_lgbm_mape_pct"] = float(per_gpu["lgbm"][dev])
        metrics[f"baseline_{dev}_mape_pct"] = float(per_gpu["baseline"][dev])
    summary = lodo_table(pred, chosen)
    for _, r in summary.iterrows():
        metrics[f"run_avg_err_{r['device']}_{r['source']}_pct"] = float(r["chosen_run_avg_err_pct"])

    model = PowerModel(
        form="lgbm" if chosen == "lgbm" else "curve", params=params, alpha=clock["alpha"], u_ref=clock["u_ref"], band_log=band, support=support,
        booster=booster,
        meta={
            "trained_on": {src: sorted(g["device"].unique().tolist()) for src, g in train.groupby("source")},
            "rows": int(len(train)), "dataset_fingerprint": fp,
            "target": "g = (P - P_idle) / (TDP - P_idle); P_idle = spec idle_power_w or 0.15 x TDP",
            "assumptions": {
                "perseus": f"TP {PERSEUS_TP}, microbatch {PERSEUS_MBS}, seq 2048, {PERSEUS_STAGES} stages, tdp {PERSEUS_TDP_W} W",
                "zeus": "FP32; ResNet-50 24.6 GFLOP/img, BERT-base SQuAD 88,641 x 384 tokens",
                "mlenergy": f"prompt tokens {PROMPT_TOKENS}; weights + KV per decode step",
            },
            "clock_fit": {k: round(float(v), 4) for k, v in clock.items()},
            "lgbm_params": LGBM_PARAMS if chosen == "lgbm" else {},
        },
    )
    limit_rows, limits, lim_metrics = limit_response(model, rows.get("zeus", pd.DataFrame()), rows.get("a100_pcie_limits"))
    metrics.update(lim_metrics)
    metrics.update(accelwattch_range(root, model))
    model.meta["metrics"] = {k: round(float(v), 3) for k, v in metrics.items()
                             if k.startswith(("lodo_mean", "lodo_curve_mean", "lodo_lgbm_mean", "baseline_tdp", "clock_alpha",
                                              "clock_u_ref", "clock_knee", "clock_voltage", "clock_sweep_knee"))}
    if icounts is not None:  # before/after on the imported samples: held-out GPU figure, TDP x utilisation
        imp = (train["source"] == "profile").to_numpy()
        metrics["imported_samples_used"] = float(icounts["used"])
        metrics["imported_samples_read"] = float(icounts["rows"])
        for k in PROFILE_POWER_REASONS:
            if icounts[k]:
                metrics[f"imported_left_out_{k}"] = float(icounts[k])
        metrics["lodo_imported_mape_pct"] = float(pred.loc[imp, f"ape_{chosen}"].mean() * 100)
        metrics["baseline_imported_mape_pct"] = float(pred.loc[imp, "ape_baseline"].mean() * 100)
        model.meta["imported"] = {"profiles": [str(p) for p in profiles], "samples": int(icounts["used"]),
                                  "samples_read": int(icounts["rows"]),
                                  "left_out": {k: int(icounts[k]) for k in PROFILE_POWER_REASONS if icounts[k]}}

    target = Path(out_dir) if out_dir else shipped_folder()
    replaced, reason, gate = gate_decision(model, target, train, mean_gpu[chosen],
                                           clock_rows=(rows.get("perseus_sweep"), rows.get("zeus")), force=force)
    metrics.update(gate)
    if replaced:
        # a new version beside the old one, loaded and checked there, then one atomic pointer switch
        install_power_model(model, target)
    else:  # kept apart for inspection, as train kernels/collectives keep theirs: <target>/power_refused/<name>/
        from wattcast.models.power import REFUSED
        from wattcast.training.gate_force import keep_refused

        reason += keep_refused(lambda: install_power_model(model, target, activate=False), target, REFUSED,
                               "power model", "--power-model")
    metrics["train_seconds"] = time.time() - t0
    log(f"power: alpha {clock['alpha']:.2f} (dynamic power ~ clock^alpha; sweep power MAPE "
        f"{clock['sweep_power_mape_pct']:.1f}%; the knee law, evaluated and not shipped: knee {clock['knee_clock_ratio']:.3f} "
        f"x boost, voltage slope {clock['voltage_slope']:.3f}, {clock['sweep_knee_power_mape_pct']:.1f}%), "
        f"u_ref {clock['u_ref']:.2f}; {reason}")

    tables = {"lodo_by_gpu": summary, "power_limits": limits}
    run_id = None
    if use_mlflow:
        from wattcast.training.tracking import log_run

        params_log = {
            "form": chosen, "train_rows": len(train), "train_devices": ",".join(sorted(train["device"].unique())),
            "sources": ",".join(sorted(train["source"].unique())), "dataset_fingerprint": fp,
            "split": "leave-one-GPU-out", "perseus_tp": PERSEUS_TP, "perseus_mbs": PERSEUS_MBS,
            "perseus_tdp_w": PERSEUS_TDP_W, "idle_fraction_of_tdp": IDLE_FRACTION_OF_TDP,
            "min_clock_ratio": MIN_CLOCK_RATIO, "curve_features": ",".join(CURVE_FEATURES),
            "chosen": chosen, "profiles": ",".join(map(str, profiles)), "force": force,
            **{f"curve_{k}": round(v, 4) for k, v in params.items()},
            **{f"curve_free_{k}": round(v, 4) for k, v in params_free.items()},
        }
        run_id = log_run(tracking_dir, experiment=EXPERIMENT, params=params_log, metrics=metrics,
                         tags={"replaced": str(replaced), "gate": reason}, tables=tables,
                         figures=[lambda d: _plot(pred, chosen, limit_rows, d / "power_lodo_and_limits.png")],
                         documents={MANIFEST: model.to_manifest()})
    return {"summary": summary, "metrics": metrics, "replaced": replaced, "reason": reason, "run_id": run_id,
            "tables": tables, "out_dir": target, "imported": icounts}

