"""Hugging Face ``config.json`` files, read without ``transformers``: field aliases and model families.

:func:`load_hf_config` accepts a path, a dict or a built-in name (:data:`BUILTIN_MODELS`) and returns a
:class:`HFConfig` with normalised fields; :func:`graph_from_hf_config` dispatches on ``model_type`` to
the generators in :mod:`wattcast.featurize.hf_models`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from wattcast.featurize.op_graph import GraphError

#: aliases, in order of preference, for each normalised field
ALIASES: dict[str, tuple[str, ...]] = {
    "hidden": ("hidden_size", "n_embd", "n_embed", "d_model", "dim", "model_dim"),
    "n_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_encoder_layers"),
    "n_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads"),
    "n_kv_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "encoder_ffn_dim", "ffn_hidden_size"),
    "vocab": ("vocab_size", "n_vocab", "padded_vocab_size"),
    "max_positions": ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length"),
    "activation": ("activation_function", "hidden_act", "activation", "dense_act_fn", "feed_forward_proj"),
    "head_dim": ("head_dim", "d_kv", "kv_channels"),
}

#: model_type -> generator family (see hf_models.GENERATORS)
MODEL_TYPES: dict[str, str] = {
    "gpt2": "gpt2", "gpt": "gpt2", "megatron-gpt": "gpt2", "gpt3": "gpt2",
    "opt": "opt",
    "llama": "llama", "mistral": "llama", "qwen2": "llama", "gemma": "gemma",
    "mpt": "mpt", "gpt_neox": "gpt_neox", "bloom": "bloom", "falcon": "falcon", "refinedweb": "falcon",
    "refinedwebmodel": "falcon",
    "mixtral": "mixtral",
    "bert": "bert",
    "switch_transformers": "switch", "t5": "switch",
}

_BUILTIN_DIR = Path(__file__).resolve().parent / "hf_configs"


def builtin_models() -> list[str]:
    return sorted(p.stem for p in _BUILTIN_DIR.glob("*.json"))


@dataclass(frozen=True)
class HFConfig:
    """Normalised view of a Hugging Face config (raw fields kept in ``raw``)."""

    model_type: str
    family: str
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    max_positions: int
    activation: str
    name: str = "model"
    raw: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    @property
    def total_layers(self) -> int:
        """Blocks of the whole model: encoder plus decoder for encoder-decoder families."""
        if self.family == "switch":
            return self.n_layers + int(self.get("num_decoder_layers") or self.n_layers)
        return self.n_layers

    @property
    def n_experts(self) -> int | None:
        """Experts per MoE layer, or None for a dense model."""
        n = self.get("num_local_experts") or self.get("num_experts")
        return int(n) if n else None


def _first(raw: Mapping[str, Any], key: str) -> Any:
    for alias in ALIASES[key]:
        if raw.get(alias) is not None:
            return raw[alias]
    return None


def _positive_int(value: Any, what: str, origin: str) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise GraphError(f"{origin}: {what} must be an integer, got {value!r}") from None
    if v <= 0 or v != value and not (isinstance(value, float) and value.is_integer()):
        raise GraphError(f"{origin}: {what} must be a positive integer, got {value!r}")
    return v


def normalise_config(raw: Mapping[str, Any], *, name: str = "model", origin: str = "config") -> HFConfig:
    """Normalise field aliases and check the numbers a graph needs."""
    if not isinstance(raw, Mapping):
        raise GraphError(f"{origin}: a config must be a JSON object")
    mt = str(raw.get("model_type", "")).strip().lower()
    if not mt:
        raise GraphError(f"{origin}: no 'model_type' field; known types: {', '.join(sorted(MODEL_TYPES))}")
    if mt not in MODEL_TYPES:
        raise GraphError(f"{origin}: unknown model_type {mt!r}; known types: {', '.join(sorted(MODEL_TYPES))}")
    need = {}
    for key in ("hidden", "n_layers", "n_heads", "vocab"):
        v = _first(raw, key)
        if v is None:
            raise GraphError(f"{origin}: missing {key} (one of {', '.join(ALIASES[key])})")
        need[key] = _positive_int(v, ALIASES[key][0] if _first(raw, key) is None else next(a for a in ALIASES[key] if raw.get(a) is not None), origin)
    hidden, heads = need["hidden"], need["n_heads"]
    family = MODEL_TYPES[mt]
    hd = _first(raw, "head_dim")
    if hd is None:
        if hidden % heads:
            raise GraphError(f"{origin}: hidden size {hidden} is not divisible by {heads} heads")
        hd = hidden // heads
    hd = _positive_int(hd, "head_dim", origin)
    kv = _first(raw, "n_kv_heads")
    kv = heads if kv is None else _positive_int(kv, "num_key_value_heads", origin)
    ffn = _first(raw, "ffn")
    if family == "mpt":  # MosaicML MPT: nested attention options and an MLP expansion ratio
        attn = raw.get("attn_config") or {}
        if not isinstance(attn, Mapping):
            raise GraphError(f"{origin}: attn_config must be a JSON object")
        kind = str(attn.get("attn_type", "multihead_attention"))
        if kind == "multiquery_attention":
            kv = 1
        elif kind == "grouped_query_attention":
            kv = _positive_int(attn.get("kv_n_heads"), "attn_config.kv_n_heads", origin)
        elif kind != "multihead_attention":
            raise GraphError(f"{origin}: unknown attn_config.attn_type {kind!r}")
        if ffn is None and raw.get("expansion_ratio") is not None:
            er = raw["expansion_ratio"]
            if not isinstance(er, (int, float)) or er <= 0:
                raise GraphError(f"{origin}: expansion_ratio must be a positive number, got {er!r}")
            ffn = int(er * hidden)
    if family == "falcon" and not raw.get("new_decoder_architecture") and raw.get("multi_query", True):
        kv = 1  # FalconAttention: num_kv_heads counts only in the new decoder or without multi_query
    if heads % kv:
        raise GraphError(f"{origin}: {heads} attention heads are not divisible by {kv} key/value heads")
    ffn = 4 * hidden if ffn is None else _positive_int(ffn, "intermediate size", origin)
    maxpos = _first(raw, "max_positions")
    maxpos = 0 if maxpos is None else int(maxpos)
    act = str(_first(raw, "activation") or ("gelu_new" if family == "gpt2" else "gelu")).lower()
    return HFConfig(model_type=mt, family=family, hidden=hidden, n_layers=need["n_layers"], n_heads=heads, n_kv_heads=kv,
                    head_dim=hd, ffn=ffn, vocab=need["vocab"], max_positions=maxpos, activation=act, name=name, raw=dict(raw))


def load_hf_config(model: str | Path | Mapping[str, Any]) -> HFConfig:
    """A config from a dict, a ``config.json`` path, or a built-in name (case-insensitive)."""
    if isinstance(model, Mapping):
        return normalise_config(model, name=str(model.get("_name_or_path", "model")))
    p = Path(model)
    if not p.is_file():
        key = str(model).strip().lower().replace("-", "_")
        cand = _BUILTIN_DIR / f"{key}.json"
        if cand.is_file():
            p = cand
        else:
            raise GraphError(f"{model}: not a file and not a built-in model (built-ins: {', '.join(builtin_models())})")
    name = p.parent.name if p.name == "config.json" else p.stem
    return _load_config_file(str(p.resolve()), p.stat().st_mtime, name, str(p))


@lru_cache(maxsize=256)
def _load_config_file(path: str, mtime: float, name: str, origin: str) -> HFConfig:
    """A config file, read once per modification time (predictions in a search loop ask again and again)."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GraphError(f"{origin}: cannot read as a JSON config: {e}") from None
    return normalise_config(raw, name=name, origin=origin)
