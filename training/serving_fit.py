"""Fit the serving engine's host time per decode iteration (``simulate/serving.py``): ``a + b x batch`` ms.

Data: ML.ENERGY leaderboard v2's measured 'Avg TPOT (s)' (vLLM on A100-SXM4-40GB), the single-GPU rows (TP 1, PP 1)
of the six models wattcast builds exactly ($WATTCAST_DATA/power/mlenergy/v2_a100_h100_configs.csv;
SOURCE-mlenergy-inference-power.md: a flattening of github.com/ml-energy/leaderboard-v2 at c3af7f31, Apache-2.0).
The data does not name the vLLM version: a v0.x engine (host in series with the GPU) is assumed.

Per row: batch = round('Avg BS (reqs)'), the decode step's context = the task's prompt (training/power.py
PROMPT_TOKENS, an assumption: the files have no prompt length) + half the mean output, output_tokens = round('Avg
Output Tokens'). wattcast predicts the GPU decode step and the amortised prefill (``serving="vllm"``: both are
independent of the host constants; ``validation/serving_terms.py`` predicts them, since training/ never imports the
simulator, tests/test_layers.py), and the host time is what the measurement leaves:

    measured_ms - gpu_step_ms - prefill_ms = a + b x batch

fitted by non-negative least squares on the RELATIVE error (each row divided by its measured TPOT, so a 460 ms
row does not outweigh a 23 ms one), on the rows of HALF of the models (split by model, never by row):
:data:`HALVES`. ``python -m wattcast.validation.serving_terms --fit-half A --out models/artifacts/serving_vllm.json``
fits on one half (:func:`split_fit`) and writes the artifact (:func:`artifact`, with the provenance);
``benchmarks/bench_mlenergy_decode.py`` evaluates both splits.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from wattcast.training.power import PROMPT_TOKENS
from wattcast.training.tracking import git_commit

_CONFIGS = Path(__file__).resolve().parent.parent / "featurize" / "hf_configs"
DATA_FILE = Path("power") / "mlenergy" / "v2_a100_h100_configs.csv"
SOURCE_FILE = Path("power") / "SOURCE-mlenergy-inference-power.md"


def _cfg(name: str, **changes) -> dict:
    cfg = json.loads((_CONFIGS / f"{name}.json").read_text())
    cfg.update(changes)
    return cfg


#: the v2 models wattcast builds exactly: a built-in name, or a built-in config with the public config.json's
#: differences (Hugging Face Hub config.json of each model)
MODELS = {
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama3_8b",  # same shapes as Llama 3 8B
    "mistralai/Mistral-7B-Instruct-v0.3": _cfg("llama2_7b", num_key_value_heads=8, intermediate_size=14336,
                                               vocab_size=32768, max_position_embeddings=32768, rope_theta=1e6),
    "codellama/CodeLlama-7b-hf": _cfg("llama2_7b", vocab_size=32016, max_position_embeddings=16384, rope_theta=1e6),
    "microsoft/Phi-3-mini-4k-instruct": "phi3_mini",
    "google/gemma-2-9b-it": "gemma2_9b",
    "google/codegemma-1.1-2b": "gemma_2b",  # CodeGemma 2B is Gemma 2B's architecture
}
#: v2 models wattcast builds exactly that have tensor-parallel rows only (TP 8 on A100-SXM4-40GB): evaluation only,
#: never fitted on (``benchmarks/bench_mlenergy_decode.py --tp``). Hugging Face Hub config.json of each model
TP_ONLY_MODELS = {
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama3_70b",  # same shapes as Llama 3 70B (RoPE scaling aside)
    "codellama/CodeLlama-70b-hf": _cfg("llama2_70b", vocab_size=32016, max_position_embeddings=16384, rope_theta=1e6),
}
#: the split by model, fixed before any fit: each half has a chat and a code model and a small and a large one.
#: A (20 rows) is the fitting half of the shipped constants; B (12 rows) the evaluation half, and the swap.
HALVES = {
    "A": ("meta-llama/Meta-Llama-3.1-8B-Instruct", "microsoft/Phi-3-mini-4k-instruct", "google/codegemma-1.1-2b"),
    "B": ("mistralai/Mistral-7B-Instruct-v0.3", "codellama/CodeLlama-7b-hf", "google/gemma-2-9b-it"),
}


def data_root(root: str | Path | None = None) -> Path:
    return Path(root or os.environ.get("WATTCAST_DATA", "/work/shared/datasets"))


def rows(root: str | Path | None = None) -> pd.DataFrame:
    """The single-GPU TPOT rows of :data:`MODELS` with ``device``, ``batch``, ``context``, ``prompt_tokens``,
    ``output_tokens``, ``measured_ms`` and ``half``."""
    m = pd.read_csv(data_root(root) / DATA_FILE)
    m = m[m["_task"].isin(list(PROMPT_TOKENS)) & m["Model"].isin(list(MODELS)) & (m["TP"] == 1) & (m["PP"] == 1)]
    m = m[m["Avg TPOT (s)"].notna()].copy()
    return _row_terms(m).sort_values(["Model", "batch"]).reset_index(drop=True)


def _row_terms(m: pd.DataFrame) -> pd.DataFrame:
    """``device``, ``batch``, ``prompt_tokens``, ``output_tokens``, ``context``, ``measured_ms`` and ``half`` of the v2
    rows ``m`` (see :func:`rows`)."""
    m = m.copy()
    m["device"] = m["GPU"].map({"NVIDIA A100-SXM4-40GB": "A100-SXM4-40GB", "NVIDIA H100 80GB HBM3": "H100-SXM5-80GB"})
    m["batch"] = np.maximum(np.rint(m["Avg BS (reqs)"].to_numpy(dtype=float)), 1).astype(int)
    m["prompt_tokens"] = m["_task"].map(PROMPT_TOKENS).astype(int)
    out_tok = m["Avg Output Tokens"].to_numpy(dtype=float)
    m["output_tokens"] = np.maximum(np.rint(out_tok), 1).astype(int)
    m["context"] = np.rint(m["prompt_tokens"].to_numpy(dtype=float) + out_tok / 2).astype(int)
    m["measured_ms"] = 1e3 * m["Avg TPOT (s)"].to_numpy(dtype=float)
    m["half"] = m["Model"].map({name: h for h, names in HALVES.items() for name in names})
    return m


def tp_rows(root: str | Path | None = None) -> pd.DataFrame:
    """The tensor-parallel TPOT rows (TP > 1, PP 1) of :data:`MODELS` and :data:`TP_ONLY_MODELS`: evaluation only
    (the host constants are fitted on single-GPU rows), with the columns of :func:`rows` and ``tp``."""
    m = pd.read_csv(data_root(root) / DATA_FILE)
    m = m[m["_task"].isin(list(PROMPT_TOKENS)) & m["Model"].isin([*MODELS, *TP_ONLY_MODELS]) & (m["TP"] > 1)
          & (m["PP"] == 1) & m["Avg TPOT (s)"].notna()].copy()
    return _row_terms(m).assign(tp=lambda d: d["TP"].astype(int)).sort_values(["Model", "tp", "batch"]).reset_index(drop=True)


def fit_host(batch, gpu_step_ms, prefill_ms, measured_ms) -> tuple[float, float]:
    """(a_ms, b_ms_per_seq) >= 0 minimising sum(((gpu + prefill + a + b x batch) / measured - 1)^2)."""
    from scipy.optimize import nnls

    batch, meas = np.asarray(batch, dtype=float), np.asarray(measured_ms, dtype=float)
    resid = meas - np.asarray(gpu_step_ms, dtype=float) - np.asarray(prefill_ms, dtype=float)
    design = np.column_stack([np.ones_like(batch), batch]) / meas[:, None]
    (a, b), _ = nnls(design, resid / meas)
    return float(a), float(b)


def predicted_ms(t: pd.DataFrame, a_ms: float, b_ms: float) -> np.ndarray:
    """The serving iteration (vLLM v0.x: host in series) with host constants ``a_ms`` + ``b_ms`` x batch."""
    return (t["gpu_step_ms"].to_numpy(dtype=float) + t["prefill_ms"].to_numpy(dtype=float)
            + a_ms + b_ms * t["batch"].to_numpy(dtype=float))


def errors(t: pd.DataFrame, pred_ms, by: str | None = "Model") -> pd.DataFrame:
    """MAPE and signed bias (mean of predicted / measured - 1), %, per ``by`` group and over all rows."""
    ratio = np.asarray(pred_ms, dtype=float) / t["measured_ms"].to_numpy(dtype=float) - 1.0
    e = pd.DataFrame({"group": t[by].str.split("/").str[-1] if by else "all", "r": ratio})
    per = e.groupby("group")["r"].agg(rows="size", mape_pct=lambda r: 100 * np.mean(np.abs(r)),
                                      signed_pct=lambda r: 100 * np.mean(r)).reset_index()
    tot = pd.DataFrame([dict(group="all", rows=len(e), mape_pct=100 * np.mean(np.abs(ratio)),
                             signed_pct=100 * np.mean(ratio))])
    return pd.concat([per, tot], ignore_index=True)


def split_fit(t: pd.DataFrame, fit_half: str) -> dict:
    """Fit on ``fit_half``'s models, evaluate on the other half's: constants and per-model figures."""
    f, e = t[t["half"] == fit_half], t[t["half"] != fit_half]
    a, b = fit_host(f["batch"], f["gpu_step_ms"], f["prefill_ms"], f["measured_ms"])
    return dict(fit_half=fit_half, fit_models=list(HALVES[fit_half]), host_fixed_ms=a, host_per_seq_ms=b,
                fit=errors(f, predicted_ms(f, a, b)), evaluation=errors(e, predicted_ms(e, a, b)))


def artifact(res: dict, t: pd.DataFrame, root: Path) -> dict:
    """The shipped JSON (``simulate/serving.py`` reads it) with the fit's provenance."""
    ev = res["evaluation"].set_index("group")
    return dict(schema=1, engine="vllm", host_fixed_ms=round(res["host_fixed_ms"], 6),
                host_per_seq_ms=round(res["host_per_seq_ms"], 6), host_overlaps_gpu=False,
                provenance=dict(
                    fitted_by="training/serving_fit.py (non-negative least squares on relative TPOT error)",
                    data=f"$WATTCAST_DATA/{DATA_FILE} (ML.ENERGY leaderboard-v2 c3af7f31, Apache-2.0; {SOURCE_FILE})",
                    data_sha256=hashlib.sha256((root / DATA_FILE).read_bytes()).hexdigest(),
                    device="A100-SXM4-40GB", engine_version="vLLM v0.x ASSUMED (not stated in the data): host in series",
                    fit_models=res["fit_models"], fit_rows=int((t["half"] == res["fit_half"]).sum()),
                    evaluation_models=[m for h, ms in HALVES.items() if h != res["fit_half"] for m in ms],
                    evaluation_mape_pct=round(float(ev.loc["all", "mape_pct"]), 2),
                    evaluation_signed_pct=round(float(ev.loc["all", "signed_pct"]), 2),
                    prompt_tokens="training/power.py PROMPT_TOKENS (assumed: chat 256, code 128)",
                    wattcast_commit=git_commit(short=True)))
