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
#: v2 models with tensor-parallel rows whose configs are typed here FROM MEMORY of their Hugging Face Hub config.json
#: (not checked against the files: no internet): evaluation only in both splits of the TP fit, never fitted on
TP_EVAL_MODELS = {
    "codellama/CodeLlama-13b-hf": _cfg("llama2_7b", hidden_size=5120, num_hidden_layers=40, num_attention_heads=40,
                                       num_key_value_heads=40, intermediate_size=13824, vocab_size=32016,
                                       max_position_embeddings=16384, rope_theta=1e6),  # TP 2
    "codellama/CodeLlama-34b-hf": _cfg("llama2_70b", num_hidden_layers=48, intermediate_size=22016,
                                       max_position_embeddings=16384, rope_theta=1e6),  # TP 4
}
#: the split of the TP fit (``fit_tp_sync``) by model, fixed before any fit: each half has a TP2 and a TP8 model, a
#: chat and a code one. A is the fitting half of the shipped constant; B the evaluation half, and the swap;
#: TP_EVAL_MODELS are in neither
TP_HALVES = {
    "A": ("codellama/CodeLlama-7b-hf", "meta-llama/Meta-Llama-3.1-70B-Instruct"),
    "B": ("google/gemma-2-9b-it", "codellama/CodeLlama-70b-hf"),
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
    m = m[m["_task"].isin(list(PROMPT_TOKENS)) & m["Model"].isin([*MODELS, *TP_ONLY_MODELS, *TP_EVAL_MODELS])
          & (m["TP"] > 1) & (m["PP"] == 1) & m["Avg TPOT (s)"].notna()].copy()
    t = _row_terms(m).assign(tp=lambda d: d["TP"].astype(int))
    t["half"] = t["Model"].map({name: h for h, names in TP_HALVES.items() for name in names}).fillna("eval")
    return t.sort_values(["Model", "tp", "batch"]).reset_index(drop=True)


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


def tp_sync_x(t: pd.DataFrame) -> np.ndarray:
    """The TP cost's regressor per row: n_layers x log2(tp) (``simulate/serving.py`` ``tp_sync_ms``)."""
    return t["n_layers"].to_numpy(dtype=float) * np.log2(t["tp"].to_numpy(dtype=float))


def fit_tp_sync(t: pd.DataFrame, fit_half: str) -> dict:
    """The TP engine cost ``k`` (ms per layer per log2 TP) >= 0 minimising sum(((pred + k x L x log2 TP) / measured
    - 1)^2) on ``fit_half``'s TP models (``TP_HALVES``); ``t`` has :func:`tp_rows`' columns, ``n_layers`` and
    ``pred_ms`` (the served iteration without the TP cost, ``validation/serving_terms.py tp_terms``). MAPE and signed
    bias on the fitting half, the other half and ``TP_EVAL_MODELS``, before (``pred_ms``) and after."""
    meas = t["measured_ms"].to_numpy(dtype=float)
    x, y = tp_sync_x(t) / meas, (meas - t["pred_ms"].to_numpy(dtype=float)) / meas
    f = (t["half"] == fit_half).to_numpy()
    k = max(float(np.sum(x[f] * y[f]) / np.sum(x[f] ** 2)), 0.0)
    after = t["pred_ms"].to_numpy(dtype=float) + k * tp_sync_x(t)
    out = dict(fit_half=fit_half, fit_models=list(TP_HALVES[fit_half]), tp_sync_ms_per_layer_log2_tp=k)
    for name, sel in (("fit", f), ("evaluation", ((t["half"] != fit_half) & (t["half"] != "eval")).to_numpy()),
                      ("never_fitted", (t["half"] == "eval").to_numpy())):
        if not sel.any():
            continue
        b = errors(t[sel], t.loc[sel, "pred_ms"]).rename(columns={"mape_pct": "before_mape_pct",
                                                                     "signed_pct": "before_signed_pct"})
        out[name] = b.merge(errors(t[sel], after[sel]), on=["group", "rows"])
    return out


def artifact(res: dict, t: pd.DataFrame, root: Path, tp_res: dict | None = None) -> dict:
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
                    wattcast_commit=git_commit(short=True)),
                **({} if tp_res is None else _tp_artifact(tp_res)))


def _tp_artifact(r: dict) -> dict:
    ev = r["evaluation"].set_index("group").loc["all"]
    return dict(tp_sync_ms_per_layer_log2_tp=round(r["tp_sync_ms_per_layer_log2_tp"], 6), tp_provenance=dict(
        fitted_by="training/serving_fit.py fit_tp_sync (least squares >= 0 on relative TPOT error of the TP rows)",
        form="tp_sync_ms = k x n_layers x log2(tp), in series with the iteration, tp > 1 only (simulate/serving.py)",
        fit_models=r["fit_models"], evaluation_models=[m for h, ms in TP_HALVES.items() if h != r["fit_half"] for m in ms],
        never_fitted_models=list(TP_EVAL_MODELS), cluster="dgx-a100 ASSUMED (ML.ENERGY v2 does not name its servers)",
        evaluation_mape_pct=round(float(ev["mape_pct"]), 2), evaluation_signed_pct=round(float(ev["signed_pct"]), 2),
        evaluation_before_mape_pct=round(float(ev["before_mape_pct"]), 2),
        evaluation_before_signed_pct=round(float(ev["before_signed_pct"]), 2)))
