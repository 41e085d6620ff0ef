"""Hugging Face ``config.json`` files, read without ``transformers``: field aliases and model families.

:func:`load_hf_config` accepts a path, a model folder, a dict, a built-in name (:func:`builtin_models`) or a Hub id in
the local Hugging Face cache (:mod:`wattcast.featurize.hub_cache`) and returns a :class:`HFConfig` with normalised
fields, validated on the pydantic v2 model :class:`HFConfigModel` (optional fields the graph builders read go through
the same pydantic types: :func:`int_field`, :func:`bool_field`, :func:`fraction_field`); ``model_type`` picks the
generator family (:data:`MODEL_TYPES`) in :mod:`wattcast.featurize.hf_models`.
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Mapping

from pydantic import (AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError,
                      model_validator)

from wattcast.data.checks import DuplicateKeyError, json_loads_unique
from wattcast.data.spec_model import FIELD, NAME, first_problem, problem
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
    "qwen3": "qwen3", "phi3": "phi3", "gemma2": "gemma2", "gemma3_text": "gemma3",
    "qwen2_moe": "qwen2_moe", "qwen3_moe": "qwen3_moe", "gpt_oss": "gpt_oss",
    "deepseek_v2": "deepseek", "deepseek_v3": "deepseek",
    "bert": "bert",
    "switch_transformers": "switch", "t5": "switch",
}

_BUILTIN_DIR = Path(__file__).resolve().parent / "hf_configs"

#: layers (blocks) of a model wattcast builds: the largest published models have 100-200 (GPT-3 96, Llama 3 405B 126,
#: PaLM 118); the graph is built block by block, so a billion layers would run for hours and exhaust memory
MAX_LAYERS = 1024
#: experts per MoE layer (Switch-C 2,048, DeepSeek-V3 256), and experts over all layers (each expert is its own kernels)
MAX_EXPERTS = 4096
MAX_LAYER_EXPERTS = 32_768
#: the widest layer of a config wattcast builds (a hidden size, an MLP's or an expert's width, a head's, the attention's
#: heads x head size, a low-rank projection's): the widest published are 65,536-73,728 (T5-XXL's, PaLM 540B's and
#: Nemotron-4 340B's MLPs; hidden sizes reach 18,432-20,480, MoE experts are narrower, DeepSeek-V3's 2,048); 2**20 is
#: 14x that, so a wider one is a typo (an extra digit, a product pasted in) and is refused naming its field, not
#: costed as an astronomic step
MAX_WIDTH = 2**20
#: vocabulary (and token-type table) sizes: the largest published are about 250,000 (BLOOM 250,880, Gemma 3 262,208;
#: XLM-V 901,629); 2**24 is 16.7 million
MAX_VOCAB = 2**24
#: optional fields read with :func:`int_field` / :meth:`HFConfig.count` that have a plausibility bound beside the type:
#: widths (:data:`MAX_WIDTH`), expert counts (:data:`MAX_EXPERTS`; the routed experts' count is bounded per layer
#: and over all layers by :func:`_check_size`) and table sizes (:data:`MAX_VOCAB`)
BOUNDED_FIELDS: dict[str, str] = {"moe_intermediate_size": "width", "shared_expert_intermediate_size": "width",
                                  "n_shared_experts": "experts",
                                  # DeepSeek's multi-head latent attention, OPT's embedding projection
                                  "q_lora_rank": "width", "kv_lora_rank": "width", "qk_nope_head_dim": "width",
                                  "qk_rope_head_dim": "width", "v_head_dim": "width", "word_embed_proj_dim": "width",
                                  "type_vocab_size": "vocab"}


def default_ffn_width(model_type: str, hidden: int, origin: str) -> int:
    """The MLP width of a ``model_type`` config that gives none (:data:`FFN_DEFAULTS`); a GraphError naming the field
    for a type without a known default."""
    if model_type not in FFN_DEFAULTS:
        raise GraphError(f"{origin}: no MLP width: give field 'intermediate_size' (model_type {model_type!r} has no "
                         "known default for it)")
    width = FFN_DEFAULTS[model_type]
    return 4 * hidden if width is None else width


def ffn_default_note(cfg) -> str | None:
    """The warning of a config whose MLP width was not given and took its config class's default (None where the
    config gave it, or where the model's own rule is 4 x hidden: :data:`FFN_DEFAULTS`)."""
    if FFN_DEFAULTS.get(cfg.model_type, 0) is None or any(cfg.raw.get(a) is not None for a in ALIASES["ffn"]):
        return None
    return (f"{cfg.name}: no field '{_FFN_FIELD.get(cfg.model_type, 'intermediate_size')}' (the MLP width) in the "
            f"config: defaulted to {cfg.ffn:,}, the default of transformers' {cfg.model_type} config class (what it "
            "would build); give the field if the model's differs")


#: the MLP width's field in the config classes that do not call it ``intermediate_size``
_FFN_FIELD = {"opt": "ffn_dim", "t5": "d_ff", "switch_transformers": "d_ff"}


#: families whose attention splits the hidden size evenly over the heads (transformers' GPT2Attention, OPTAttention,
#: BloomAttention, GPTNeoXAttention, FalconAttention, MptAttention, BertSelfAttention: head size = hidden / heads, an
#: error when it does not divide, a ``head_dim`` field not read); the others read ``head_dim`` when the config gives it
EVEN_HEAD_FAMILIES = ("gpt2", "opt", "bloom", "gpt_neox", "falcon", "mpt", "bert")
#: ``torch_dtype`` / ``dtype`` values ``transformers`` writes (read for checking only: --dtype sets the step's dtype)
TORCH_DTYPES = ("float32", "float", "float16", "half", "bfloat16", "float64", "double", "float8_e4m3fn",
                "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "int8", "uint8", "auto")
#: families whose positions are rotary (RoPE): a sequence beyond max_position_embeddings still runs (the step is well
#: defined) but is outside the trained context unless rope_scaling extends it; a warning, not an error
ROPE_FAMILIES = ("llama", "gemma", "mixtral", "gpt_neox", "falcon", "qwen3", "phi3", "gemma2", "gemma3", "deepseek",
                 "qwen2_moe", "qwen3_moe", "gpt_oss")
#: Qwen's sparse MoE families (Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock): ``decoder_sparse_step`` and
#: ``mlp_only_layers`` pick the sparse layers, the others are dense
QWEN_MOE_FAMILIES = ("qwen2_moe", "qwen3_moe")
#: ``transformers``' defaults of the Qwen MoE configs (Qwen2MoeConfig, Qwen3MoeConfig): experts per layer and top-k
_QWEN_MOE_DEFAULTS = {"qwen2_moe": (60, 4), "qwen3_moe": (128, 8)}
#: ``transformers``' GptOssConfig defaults of the fields a gpt-oss config may leave out (both published models set them
#: all): experts per layer, top-k, the head size (not hidden / heads: 2,880 / 64 would be 45), each expert's width,
#: the sliding window of the local layers
GPT_OSS_DEFAULTS = {"num_local_experts": 128, "num_experts_per_tok": 4, "head_dim": 64, "intermediate_size": 2880,
                    "sliding_window": 128}
#: ``transformers``' DeepseekV3Config defaults (configuration_deepseek_v3.py) of the fields a ``deepseek_v3`` config may
#: leave out: what DeepseekV3ForCausalLM builds from such a config, so what the model is (the published file sets
#: them all; ``q_lora_rank`` set to null is a full-rank ``q_proj``)
DEEPSEEK_V3_DEFAULTS = {"intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
                        "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
                        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                        "v_head_dim": 128}
#: DeepSeek-V2's (``deepseek_v2``): the latent attention's sizes, dense first blocks and layer frequency as DeepSeek's
#: configuration_deepseek.py (trust_remote_code) and transformers' DeepseekV2Config both default them, no routed
#: experts unless ``n_routed_experts`` says so. The rest (``q_lora_rank``, the experts' width, shared experts and
#: top-k, the dense MLP's width) are refused when absent (:data:`DEEPSEEK_V2_REQUIRED`): a guess would be a silently
#: different model (V2 has q_lora_rank 1536, V2-Lite null; 2 shared experts of 1,536 / 1,408)
DEEPSEEK_V2_DEFAULTS = {"n_routed_experts": 0, "first_k_dense_replace": 0, "moe_layer_freq": 1, "kv_lora_rank": 512,
                        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
DEEPSEEK_V2_REQUIRED = ("q_lora_rank", "moe_intermediate_size", "n_shared_experts", "num_experts_per_tok",
                        "intermediate_size")
DEEPSEEK_DEFAULTS = {"deepseek_v3": DEEPSEEK_V3_DEFAULTS, "deepseek_v2": DEEPSEEK_V2_DEFAULTS}
#: model_type -> the MLP width transformers builds from a config without its width field: a number is the config
#: class's default (transformers 5.24.0, ``models/<type>/configuration_<type>.py``: LlamaConfig l.65 11,008,
#: MistralConfig l.64 14,336, Qwen2Config l.62 22,016, GemmaConfig l.68 24,576, GPTNeoXConfig l.65 24,576,
#: MixtralConfig l.68 14,336, Qwen3Config l.63 22,016, Phi3Config l.62 8,192, Gemma2Config l.69 9,216,
#: Gemma3TextConfig l.75 9,216, Qwen2MoeConfig l.80 5,632, Qwen3MoeConfig l.82 6,144, DeepseekV2Config l.77 11,008,
#: DeepseekV3Config and GptOssConfig as their defaults above, BertConfig l.48 3,072, OPTConfig ``ffn_dim`` l.56 3,072,
#: T5Config / SwitchTransformersConfig ``d_ff`` l.46 / l.60 2,048). None is "4 x hidden", the model's own rule, not a
#: default: GPT2MLP (modeling_gpt2.py l.252, ``n_inner`` None), FalconConfig (l.95-96, ``ffn_hidden_size`` None),
#: BloomMLP (modeling_bloom.py l.321, no field), MptConfig (``expansion_ratio`` 4, l.122), and Megatron-LM's GPT
#: (``--ffn-hidden-size`` defaults to 4 x ``--hidden-size``, megatron/training/arguments.py) for the non-transformers
#: GPT types. Before, every missing width was 4 x hidden: a Llama-2-7B config without it was 8.85 B parameters, not 6.74.
FFN_DEFAULTS: dict[str, int | None] = {
    "llama": 11008, "mistral": 14336, "qwen2": 22016, "gemma": 24576, "gpt_neox": 24576, "mixtral": 14336,
    "qwen3": 22016, "phi3": 8192, "gemma2": 9216, "gemma3_text": 9216, "qwen2_moe": 5632, "qwen3_moe": 6144,
    "deepseek_v2": 11008,
    "deepseek_v3": DEEPSEEK_V3_DEFAULTS["intermediate_size"], "gpt_oss": GPT_OSS_DEFAULTS["intermediate_size"],
    "bert": 3072, "opt": 3072,
    "t5": 2048, "switch_transformers": 2048,
    "gpt2": None, "gpt": None, "megatron-gpt": None, "gpt3": None, "falcon": None, "refinedweb": None,
    "refinedwebmodel": None, "bloom": None, "mpt": None,
}
#: per model_type, transformers' config class and the defaults it gives the fields a config may leave out (transformers
#: 5.24.0, ``models/<type>/configuration_<type>.py``, the line of each default cited), as the class builds the model.
#: ``head_dim`` (T5's ``d_kv``) and ``num_key_value_heads``: a number is the class's default, filled in when a config
#: omits the field (:func:`normalise_config`; the prediction's warnings list what was filled); None is "derived as
#: wattcast's generic rule does" (head size hidden / heads, a key/value head per query head: the class sets them so, or
#: the architecture has no such field). A model_type without an entry for one of the two takes the generic rule with a
#: warning naming the field. The sizes (``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
#: ``num_attention_heads``, ``max_position_embeddings``) are filled only into a multimodal wrapper's ``text_config``
#: (:func:`unwrap_text_config`): transformers writes a sub-config without the fields equal to its class's defaults, so
#: the published Gemma 3 4B/12B/27B and LLaVA-1.5 files leave them out; a top-level config that omits one is refused,
#: naming it. (The MLP width's defaults are :data:`FFN_DEFAULTS`.)
CONFIG_CLASS_DEFAULTS: dict[str, tuple[str, dict[str, int | None]]] = {
    # LlamaConfig l.63-70 (num_key_value_heads None, l.88-89: = num_attention_heads), l.83 head_dim None (l.87: hidden
    # / heads)
    "llama": ("LlamaConfig", {"vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
                              "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None,
                              "max_position_embeddings": 2048}),
    # MistralConfig l.62-70: num_key_value_heads 8, head_dim None (l.83), max_position_embeddings 4096 * 32
    "mistral": ("MistralConfig", {"vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
                                  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None,
                                  "max_position_embeddings": 131072}),
    # MixtralConfig l.66-74: num_key_value_heads 8, head_dim None
    "mixtral": ("MixtralConfig", {"vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
                                  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None,
                                  "max_position_embeddings": 131072}),
    # Qwen2Config l.60-67: num_key_value_heads 32 (None only if set null, l.84-85); no head_dim field (Qwen2Attention:
    # getattr(config, "head_dim", hidden // heads))
    "qwen2": ("Qwen2Config", {"vocab_size": 151936, "hidden_size": 4096, "num_hidden_layers": 32,
                              "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": None,
                              "max_position_embeddings": 32768}),
    # Qwen3Config l.61-69: num_key_value_heads 32, head_dim 128
    "qwen3": ("Qwen3Config", {"vocab_size": 151936, "hidden_size": 4096, "num_hidden_layers": 32,
                              "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
                              "max_position_embeddings": 32768}),
    # Qwen2MoeConfig l.78-85: num_key_value_heads 16, no head_dim field
    "qwen2_moe": ("Qwen2MoeConfig", {"vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 24,
                                     "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": None,
                                     "max_position_embeddings": 32768}),
    # Qwen3MoeConfig l.80-87: num_key_value_heads 4, no head_dim field (modeling_qwen3_moe.py l.129: getattr(config,
    # "head_dim", hidden // heads))
    "qwen3_moe": ("Qwen3MoeConfig", {"vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 24,
                                     "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": None,
                                     "max_position_embeddings": 32768}),
    # Phi3Config l.60-70: num_key_value_heads None (l.83-84: = heads), no head_dim field
    "phi3": ("Phi3Config", {"vocab_size": 32064, "hidden_size": 3072, "num_hidden_layers": 32,
                            "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None,
                            "max_position_embeddings": 4096}),
    # GemmaConfig l.66-74: num_key_value_heads 16, head_dim 256
    "gemma": ("GemmaConfig", {"vocab_size": 256000, "hidden_size": 3072, "num_hidden_layers": 28,
                              "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
                              "max_position_embeddings": 8192}),
    # Gemma2Config l.67-75: num_key_value_heads 4, head_dim 256
    "gemma2": ("Gemma2Config", {"vocab_size": 256000, "hidden_size": 2304, "num_hidden_layers": 26,
                                "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                                "max_position_embeddings": 8192}),
    # Gemma3TextConfig (models/gemma3/configuration_gemma3.py) l.73-81: num_key_value_heads 4, head_dim 256
    "gemma3_text": ("Gemma3TextConfig", {"vocab_size": 262208, "hidden_size": 2304, "num_hidden_layers": 26,
                                         "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                                         "max_position_embeddings": 131072}),
    # GptOssConfig l.51-63: head_dim 64 (not hidden / heads: 2,880 / 64 would be 45), num_key_value_heads 8
    "gpt_oss": ("GptOssConfig", {"vocab_size": 201088, "hidden_size": 2880, "num_hidden_layers": 36,
                                 "num_attention_heads": 64, "num_key_value_heads": 8,
                                 "head_dim": GPT_OSS_DEFAULTS["head_dim"],
                                 "max_position_embeddings": 131072}),
    # T5Config l.45 / SwitchTransformersConfig l.59: d_kv 64 (the attention is num_heads x d_kv wide, not d_model);
    # no key/value-head field (every head has its keys and values)
    "t5": ("T5Config", {"d_kv": 64, "num_key_value_heads": None}),
    "switch_transformers": ("SwitchTransformersConfig", {"d_kv": 64, "num_key_value_heads": None}),
    # FalconConfig l.75: num_kv_heads None (= heads; multi_query and new_decoder_architecture decide: normalise_config)
    "falcon": ("FalconConfig", {"num_kv_heads": None}),
    "refinedweb": ("FalconConfig", {"num_kv_heads": None}),
    "refinedwebmodel": ("FalconConfig", {"num_kv_heads": None}),
    # DeepseekV2Config l.80 num_key_value_heads None (= heads), DeepseekV3Config l.87 128 (l.119-120: None = heads):
    # multi-head latent attention expands keys and values per query head (kv_b_proj), so wattcast keeps a key/value
    # head per query head; the head size is v_head_dim (normalise_config)
    "deepseek_v2": ("DeepseekV2Config", {"num_key_value_heads": None}),
    "deepseek_v3": ("DeepseekV3Config", {"num_key_value_heads": None}),
    # one key/value head per query head, the hidden size split evenly over the heads, by architecture (no such fields:
    # GPT2Config, OPTConfig, BloomConfig, GPTNeoXConfig, MptConfig (attn_config: normalise_config), BertConfig; and
    # Megatron-LM's GPT: --num-query-groups and --kv-channels default to heads and hidden / heads,
    # megatron/training/arguments.py)
    **{t: (c, {"num_key_value_heads": None}) for t, c in (
        ("gpt2", "GPT2Config"), ("gpt", "Megatron-LM GPT"), ("megatron-gpt", "Megatron-LM GPT"),
        ("gpt3", "Megatron-LM GPT"), ("opt", "OPTConfig"), ("bloom", "BloomConfig"), ("gpt_neox", "GPTNeoXConfig"),
        ("mpt", "MptConfig"), ("bert", "BertConfig"))},
}
#: the fields of :data:`CONFIG_CLASS_DEFAULTS` filled into any config that omits them (the others only into a
#: wrapper's text_config)
_HEAD_KEYS = ("head_dim", "n_kv_heads")


def class_default(model_type: str, key: str) -> tuple[str, str, int | None] | None:
    """(the config field, the config class, its default: None when the class derives it as wattcast's generic rule)
    of the normalised field ``key`` (an :data:`ALIASES` key) for ``model_type``; None when wattcast knows no rule."""
    cls, defaults = CONFIG_CLASS_DEFAULTS.get(model_type, (None, {}))
    name = next((a for a in ALIASES[key] if a in defaults), None)
    return None if name is None else (name, cls, defaults[name])


#: DeepSeek fields that may be 0 (no shared experts, no routed experts, no dense first blocks)
_DEEPSEEK_ZERO_OK = ("n_shared_experts", "n_routed_experts", "first_k_dense_replace")
#: the attention kinds of gpt-oss's ``layer_types``: a causal window of ``sliding_window`` keys, or the whole prefix
GPT_OSS_LAYER_TYPES = ("sliding_attention", "full_attention")


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
    #: the multimodal wrapper's model_type when the config was its ``text_config`` (:func:`unwrap_text_config`)
    wrapper: str | None = None
    #: fields the config left out, as (field, value taken, config class): the class's default
    #: (:data:`CONFIG_CLASS_DEFAULTS`), or wattcast's generic rule where the class is None (:func:`config_warnings`)
    defaulted: tuple[tuple[str, int, str | None], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    # typed reads of optional fields: a field set to null counts as absent, any other value must have the
    # field's type (0 is a count, not "absent"; "yes" is not a boolean); errors name the field and the value
    def count(self, *keys: str, default: int | None = None, minimum: int = 1) -> int | None:
        """The first of ``keys`` the config sets, as a whole number >= ``minimum``; ``default`` if none is set."""
        for k in keys:
            if self.raw.get(k) is not None:
                return int_field(self.raw, k, self.name, minimum=minimum)
        return default

    def flag(self, key: str, default: bool) -> bool:
        """A boolean field (JSON true/false); ``default`` if the config does not set it."""
        return bool_field(self.raw, key, self.name, default)

    def fraction(self, *keys: str, default: float = 0.0) -> float:
        """The first of ``keys`` the config sets, as a number in [0, 1] (a probability or a ratio)."""
        for k in keys:
            if self.raw.get(k) is not None:
                return fraction_field(self.raw, k, self.name)
        return default

    @property
    def total_layers(self) -> int:
        """Blocks of the whole model: encoder plus decoder for encoder-decoder families."""
        if self.family == "switch":
            return self.n_layers + self.count("num_decoder_layers", default=self.n_layers)
        return self.n_layers

    @property
    def n_experts(self) -> int | None:
        """Experts per MoE layer, or None for a dense model (Mixtral and Switch default to 8 as in
        ``transformers``, the number their graphs build)."""
        if self.family == "mixtral":
            return self.count("num_local_experts", "num_experts", default=8)
        if self.family == "gpt_oss":
            return self.count("num_local_experts", "num_experts", default=GPT_OSS_DEFAULTS["num_local_experts"])
        if self.family == "deepseek":  # routed experts (the shared ones run on every token, outside the router)
            return deepseek_field(self, "n_routed_experts") or None
        if self.family == "switch":
            return self.count("num_experts", default=8) if self.model_type != "t5" else None
        if self.family in QWEN_MOE_FAMILIES:  # 0 experts, or every layer in mlp_only_layers: a dense model
            n_exp = self.count("num_experts", default=_QWEN_MOE_DEFAULTS[self.family][0], minimum=0)
            return n_exp if any(self.moe_layer(i) for i in range(self.n_layers)) else None
        # dense families: an expert count is not read by the graph; 0 says "no experts"
        return self.count("num_local_experts", "num_experts", default=0, minimum=0) or None

    @property
    def experts_per_token(self) -> int:
        """The router's top-k (``num_experts_per_tok``; default 2, Qwen2-MoE's 4, Qwen3-MoE's 8, gpt-oss's 4,
        DeepSeek-V3's 8 as in ``transformers``; DeepSeek-V2 must give it), between 1 and the expert count."""
        n_exp = self.n_experts or 0
        default = (_QWEN_MOE_DEFAULTS[self.family][1] if self.family in QWEN_MOE_FAMILIES
                   else GPT_OSS_DEFAULTS["num_experts_per_tok"] if self.family == "gpt_oss" else 2)
        top_k = (deepseek_field(self, "num_experts_per_tok") if self.family == "deepseek"
                 else self.count("num_experts_per_tok", default=default))
        if top_k > n_exp:
            key = next((k for k in ("num_local_experts", "num_experts", "n_routed_experts") if self.raw.get(k) is not None),
                       "num_experts" if self.family in QWEN_MOE_FAMILIES else "num_local_experts")
            raise GraphError(f"{self.name}: field 'num_experts_per_tok' ({top_k}) must be between 1 and the number of "
                             f"experts ({key}={n_exp})")
        return top_k

    def moe_layer(self, layer: int) -> bool:
        """Whether block ``layer`` of a decoder is a sparse MoE block (else a dense MLP): every block of Mixtral;
        Qwen2MoeDecoderLayer's rule (not in ``mlp_only_layers``, ``num_experts`` > 0, (layer + 1) % ``decoder_sparse_step``
        == 0); DeepSeek's blocks from ``first_k_dense_replace`` on, every ``moe_layer_freq``-th; False for a dense
        model. (Switch's encoder-decoder blocks are its own: :mod:`wattcast.featurize.hf_switch`.)"""
        if self.family in QWEN_MOE_FAMILIES:
            n_exp = self.count("num_experts", default=_QWEN_MOE_DEFAULTS[self.family][0], minimum=0)
            return (n_exp > 0 and layer not in qwen_mlp_only_layers(self)
                    and (layer + 1) % self.count("decoder_sparse_step", default=1) == 0)
        if not self.n_experts:
            return False
        if self.family == "deepseek":
            return (layer >= deepseek_field(self, "first_k_dense_replace")
                    and layer % deepseek_field(self, "moe_layer_freq") == 0)
        return True

    @property
    def layers_alike(self) -> bool:
        """Whether every block of the decoder is of one kind (all sparse or all dense; for gpt-oss also all of one
        attention kind: gpt-oss's default alternates sliding-window and full layers, which are not alike; Qwen2's
        window starts at ``max_window_layers``: :func:`attention_windows`)."""
        if len(set(attention_windows(self))) > 1:
            return False
        return len({self.moe_layer(i) for i in range(self.n_layers)}) <= 1


def qwen_mlp_only_layers(cfg: HFConfig) -> frozenset[int]:
    """Qwen-MoE's ``mlp_only_layers``: the layer indices that keep a dense MLP (absent or null: none), a JSON list of
    whole numbers >= 0 (:func:`check_qwen_moe` checks them against the layer count)."""
    v = cfg.raw.get("mlp_only_layers")
    if v is None:
        return frozenset()
    if not isinstance(v, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in v):
        raise GraphError(f"{cfg.name}: field 'mlp_only_layers' must be a list of layer indices (whole numbers from 0), "
                         f"got {v!r}")
    return frozenset(v)


#: ``transformers``' default ``sliding_window`` of the families whose attention passes one to the kernel when the
#: config leaves the field out (an explicit null is no window): MistralConfig 4096 (configuration_mistral.py;
#: MistralAttention passes ``sliding_window=config.sliding_window`` to flash/SDPA on every layer), Gemma2Config and
#: Gemma3TextConfig 4096, GptOssConfig 128; MixtralConfig and Phi3Config default to None (no window)
SLIDING_WINDOW_DEFAULTS = {"mistral": 4096, "gemma2": 4096, "gemma3_text": 4096, "gpt_oss": GPT_OSS_DEFAULTS["sliding_window"]}
#: Gemma's default local/global pattern where the config gives no ``layer_types``: Gemma2Config alternates (even
#: layers "sliding_attention"), Gemma3TextConfig's ``sliding_window_pattern`` (default 6) makes layer i local unless
#: (i + 1) % pattern == 0 (configuration_gemma2.py, configuration_gemma3.py)
GEMMA_WINDOW_PATTERN = {"gemma2": 2, "gemma3_text": 6}
#: families whose window applies to every layer when the config sets one (MistralAttention, MixtralAttention,
#: Phi3Attention: ``sliding_window=getattr(config, "sliding_window", None)``, no per-layer choice)
ALL_LAYER_WINDOW_TYPES = ("mistral", "mixtral", "phi3")
#: dense Qwen configs (Qwen2Config, Qwen3Config, transformers >= 4.53): ``sliding_window`` counts only under
#: ``use_sliding_window`` (default false), and then only on the layers from ``max_window_layers`` (default 28) on:
#: ``layer_types[i] = "sliding_attention" if sliding_window is not None and i >= max_window_layers``, and
#: Qwen2Attention takes ``config.sliding_window`` on its "sliding_attention" layers only
QWEN_WINDOW_TYPES = ("qwen2", "qwen3")
QWEN_MAX_WINDOW_LAYERS = 28


def _sliding_window(cfg: HFConfig) -> int | None:
    """The config's ``sliding_window`` (keys per query) as the model's attention reads it: None for an explicit null,
    the family's ``transformers`` default when absent (:data:`SLIDING_WINDOW_DEFAULTS`)."""
    if "sliding_window" in cfg.raw and cfg.raw["sliding_window"] is None:
        return None
    return cfg.count("sliding_window", default=SLIDING_WINDOW_DEFAULTS.get(cfg.model_type))


def layer_types(cfg: HFConfig) -> tuple[str, ...] | None:
    """The config's ``layer_types`` (one :data:`GPT_OSS_LAYER_TYPES` kind per layer, the first ``cfg.n_layers``), None
    when it gives none. Current ``transformers`` configs (Gemma 2/3, Qwen2/3, gpt-oss) write it, and the attention
    reads it in place of the older fields (``sliding_window_pattern``, ``max_window_layers``), which only build its
    default; :func:`check_layer_types` checks its length when the config is loaded."""
    v = cfg.raw.get("layer_types")
    if v is None:
        return None
    if not isinstance(v, (list, tuple)) or any(t not in GPT_OSS_LAYER_TYPES for t in v):
        bad = v if not isinstance(v, (list, tuple)) else next(t for t in v if t not in GPT_OSS_LAYER_TYPES)
        raise GraphError(f"{cfg.name}: field 'layer_types' must be a list of {' or '.join(map(repr, GPT_OSS_LAYER_TYPES))}"
                         f" (one per layer), got {bad!r}")
    return tuple(v[:cfg.n_layers])


def _gemma_pattern(cfg: HFConfig) -> int:
    """Gemma 3's ``sliding_window_pattern`` (saved by transformers as ``_sliding_window_pattern``; default 6), Gemma
    2's 2 (alternating)."""
    if cfg.model_type == "gemma3_text":
        return cfg.count("sliding_window_pattern", "_sliding_window_pattern", default=GEMMA_WINDOW_PATTERN["gemma3_text"])
    return GEMMA_WINDOW_PATTERN[cfg.model_type]


def _default_layer_types(cfg: HFConfig) -> tuple[str, ...]:
    """The kinds a window family's config builds when it gives no ``layer_types``."""
    n = cfg.n_layers
    if cfg.family == "gpt_oss":  # GptOssConfig: even layers sliding
        return tuple(GPT_OSS_LAYER_TYPES[i % 2] for i in range(n))
    if cfg.model_type in GEMMA_WINDOW_PATTERN:
        p = _gemma_pattern(cfg)
        return tuple(GPT_OSS_LAYER_TYPES[0 if (i + 1) % p else 1] for i in range(n))
    if cfg.model_type in QWEN_WINDOW_TYPES:
        first = cfg.count("max_window_layers", default=QWEN_MAX_WINDOW_LAYERS, minimum=0)
        return tuple(GPT_OSS_LAYER_TYPES[0 if i >= first else 1] for i in range(n))
    return (GPT_OSS_LAYER_TYPES[0],) * n  # Mistral, Mixtral, Phi-3: the window (if any) on every layer


#: model types whose attention takes a sliding window (:func:`attention_windows`)
WINDOW_TYPES = ("gpt_oss", *ALL_LAYER_WINDOW_TYPES, *QWEN_WINDOW_TYPES, *GEMMA_WINDOW_PATTERN)


def check_layer_types(cfg: HFConfig, origin: str) -> None:
    """``layer_types`` of a window family (:data:`WINDOW_TYPES`): one known kind per layer, and ``sliding_window`` a
    positive integer or null."""
    if cfg.model_type not in WINDOW_TYPES:
        return
    given = layer_types(cfg)
    if given is not None and len(cfg.raw["layer_types"]) != cfg.n_layers:
        raise GraphError(f"{origin}: field 'layer_types' lists {len(cfg.raw['layer_types'])} layers, but "
                         f"{_alias(cfg.raw, 'n_layers')} is {cfg.n_layers}: it needs one entry per layer")
    attention_windows(cfg)


def attention_windows(cfg: HFConfig) -> tuple[int | None, ...]:
    """Per decoder block, the sliding window (keys per query) its attention kernel is given, None for full causal
    attention. gpt-oss: its ``layer_types`` (:func:`layer_types`, else GptOssConfig's even-sliding default); Mistral, Mixtral, Phi-3: ``sliding_window`` on every layer
    (:data:`ALL_LAYER_WINDOW_TYPES`); Qwen2 / Qwen3: the layers from ``max_window_layers`` on under
    ``use_sliding_window`` (:data:`QWEN_WINDOW_TYPES`); Gemma 2 alternating, Gemma 3 by ``sliding_window_pattern``
    (:data:`GEMMA_WINDOW_PATTERN`); other families none. A ``layer_types`` list, where the config gives one, decides
    which layers are "sliding_attention" (:func:`layer_types`), as the transformers attention reads it.
    (Eager attention still computes the whole S x S scores under a mask; the flash kernel skips the blocks outside
    the window.)"""
    if cfg.model_type not in WINDOW_TYPES:
        return (None,) * cfg.n_layers
    # Qwen2Config: sliding_window = sliding_window if use_sliding_window else None, whatever the layer kinds
    w = (None if cfg.model_type in QWEN_WINDOW_TYPES and not cfg.flag("use_sliding_window", False)
         else _sliding_window(cfg))
    types = layer_types(cfg) or _default_layer_types(cfg)
    return tuple(w if t == "sliding_attention" else None for t in types)


def quantization_note(cfg: HFConfig) -> str | None:
    """A warning when the config describes a quantized checkpoint (``quantization_config``, as transformers'
    quantizers read it: ``quant_method`` "mxfp4" for gpt-oss's experts, "fp8" for DeepSeek-V3's block-wise FP8
    weights, ...): wattcast does not model the stored format; weights, their memory and the kernels are costed at
    --dtype (gpt-oss-20b's MXFP4 experts at 4.25 bits a parameter are costed at 16)."""
    q = cfg.raw.get("quantization_config")
    if q is None:
        return None
    method = q.get("quant_method") if isinstance(q, Mapping) else None
    kept = q.get("modules_to_not_convert") if isinstance(q, Mapping) else None
    return (f"{cfg.name}: the checkpoint is quantized (quantization_config.quant_method {method!r}"
            + (f", modules_to_not_convert {list(kept)!r}" if isinstance(kept, (list, tuple)) and kept else "")
            + "): not modelled; the weights (and their memory) and the kernels are costed at --dtype, as the "
            "dequantized model would run")


@dataclass(frozen=True)
class ProjectionBiases:
    """Which projections of a Llama-architecture block carry a bias: ``qkv`` (q/k/v, or Phi-3's fused ``qkv_proj``;
    Megatron-Core's ``linear_qkv``), ``o`` (``o_proj``; ``linear_proj``) and ``mlp`` (the dense MLP's gate/up/down;
    ``linear_fc1``/``linear_fc2``). MoE experts, routers and shared experts are not covered (their builders say)."""

    qkv: bool = False
    o: bool = False
    mlp: bool = False


#: per model_type, where its transformers modelling file takes each projection's bias from (transformers 5.24.0,
#: models/<type>/modeling_<type>.py): a config field and its default (the configuration file's), True/False where the
#: file hard-codes ``bias=`` whatever the config says, in the order (qkv, o, mlp)
#: - llama: LlamaAttention q/k/v/o ``bias=config.attention_bias``, LlamaMLP gate/up/down ``bias=config.mlp_bias``
#:   (configuration_llama.py: both default False);
#: - mistral, mixtral, phi3: MistralAttention/MistralMLP, MixtralAttention (MixtralExperts: bias-free 3-D weights),
#:   Phi3Attention/Phi3MLP: ``bias=False`` on every projection (no attention_bias field in their configs);
#: - qwen2: Qwen2Attention q/k/v ``bias=True``, o_proj ``bias=False``, Qwen2MLP ``bias=False`` (no field);
#: - qwen2_moe: Qwen2MoeAttention q/k/v ``bias=config.qkv_bias`` (configuration_qwen2_moe.py: default True; earlier
#:   transformers hard-coded True), o_proj and the MLPs ``bias=False``;
#: - qwen3, qwen3_moe, gemma, gemma2, gemma3_text: q/k/v/o ``bias=config.attention_bias`` (default False), MLP
#:   ``bias=False``;
#: - gpt_oss: GptOssAttention q/k/v/o ``bias=config.attention_bias`` (configuration_gpt_oss.py: default True)
_BIAS_SOURCES: dict[str, tuple[Any, Any, Any]] = {
    "llama": (("attention_bias", False), ("attention_bias", False), ("mlp_bias", False)),
    "mistral": (False, False, False), "mixtral": (False, False, False), "phi3": (False, False, False),
    "qwen2": (True, False, False),
    "qwen2_moe": (("qkv_bias", True), False, False),
    **{t: (("attention_bias", False), ("attention_bias", False), False)
       for t in ("qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text")},
    "gpt_oss": (("attention_bias", True), ("attention_bias", True), False),
}


def projection_biases(cfg: HFConfig) -> ProjectionBiases:
    """The projection biases of a Llama-architecture config as its transformers modelling file builds them
    (:data:`_BIAS_SOURCES`); both graph builders (``--framework hf`` and ``megatron``) read them from here."""
    if cfg.model_type not in _BIAS_SOURCES:
        raise GraphError(f"{cfg.name}: no projection-bias rule for model_type {cfg.model_type!r}")
    return ProjectionBiases(*(cfg.flag(*src) if isinstance(src, tuple) else src
                              for src in _BIAS_SOURCES[cfg.model_type]))


def ignored_bias_fields(cfg: HFConfig) -> list[str]:
    """The bias fields (``attention_bias``, ``mlp_bias``, ``qkv_bias``) a config sets true that its model_type's
    transformers modelling file does not read (:data:`_BIAS_SOURCES`): e.g. ``attention_bias`` on a Mistral config."""
    read = {src[0] for src in _BIAS_SOURCES.get(cfg.model_type, ()) if isinstance(src, tuple)}
    return [k for k in ("attention_bias", "mlp_bias", "qkv_bias")
            if k not in read and cfg.raw.get(k) is True]


def class_default_notes(cfg: HFConfig) -> list[str]:
    """The warnings of the fields a config left out (``cfg.defaulted``): one naming those that took their config
    class's default (:data:`CONFIG_CLASS_DEFAULTS`; a multimodal wrapper's text_config's fill included), one per field
    that took wattcast's generic rule because no class default is known for the model_type."""
    out = []
    by_class = [(f, v, c) for f, v, c in cfg.defaulted if c is not None]
    if by_class:
        where = "the text_config" if cfg.wrapper else "the config"
        classes = " / ".join(dict.fromkeys(c for _, _, c in by_class))
        out.append(f"{cfg.name}: {', '.join(f'{f} {v:,}' for f, v, _ in by_class)}: not in {where}, so taken from "
                   f"transformers' {classes} defaults (what transformers would build); give the field if the model's "
                   "differs")
    for f, v, c in cfg.defaulted:
        if c is None:
            rule = "hidden size / attention heads" if f == "head_dim" else "one per attention head (multi-head attention)"
            out.append(f"{cfg.name}: no field '{f}' in the config and no known default of model_type {cfg.model_type!r}'s "
                       f"config class for it: taken as {v:,} ({rule}), wattcast's generic rule; give the field")
    return out


def config_warnings(cfg: HFConfig) -> list[str]:
    """What the config asks for that the graph does not model as asked (predicted anyway; ``meta["warnings"]``,
    printed by the CLI): a Qwen-MoE config with ``use_sliding_window`` (costed without a window: which of its layers
    Qwen2MoeAttention / Qwen3MoeAttention window is not modelled); a Gemma 3 ``layer_types`` that contradicts its
    ``sliding_window_pattern`` (the list is used); a quantized checkpoint (:func:`quantization_note`); a bias field
    set true that the family's transformers modelling file does not read (:func:`ignored_bias_fields`)."""
    out = []
    ffn_note = ffn_default_note(cfg)
    if ffn_note:
        out.append(ffn_note)
    out.extend(class_default_notes(cfg))
    given = layer_types(cfg)
    if given is not None and cfg.model_type == "gemma3_text" and any(
            cfg.raw.get(k) is not None for k in ("sliding_window_pattern", "_sliding_window_pattern")):
        implied = _default_layer_types(cfg)
        if given != implied:
            out.append(f"{cfg.name}: layer_types and sliding_window_pattern ({_gemma_pattern(cfg)}) disagree "
                       f"({sum(t == 'full_attention' for t in given)} vs {sum(t == 'full_attention' for t in implied)} "
                       "full-attention layers): layer_types is used, as Gemma3TextConfig does (the pattern only builds "
                       "the default layer_types)")
    if cfg.wrapper:
        out.append(f"{cfg.name}: a multimodal {cfg.wrapper} config: its language model (text_config, model_type "
                   f"{cfg.model_type}) is costed; the vision tower (vision_config) and the projector are not modelled, "
                   "nor the image tokens a prompt would add")
    quant = quantization_note(cfg)
    if quant:
        out.append(quant)
    if cfg.model_type in _BIAS_SOURCES and ignored_bias_fields(cfg):
        out.append(f"{cfg.name}: {', '.join(ignored_bias_fields(cfg))} set true, but transformers' {cfg.model_type} "
                   "modelling file does not read it (its projections' biases are fixed): ignored, as transformers "
                   "ignores it")
    if cfg.family in QWEN_MOE_FAMILIES and cfg.flag("use_sliding_window", False):
        out.append(f"{cfg.name}: use_sliding_window is true, but the sliding window of a {cfg.model_type} config is not "
                   "modelled: every layer is costed with full causal attention (an upper bound on the flash kernel's "
                   "work)")
    return out

def check_gpt_oss(cfg: HFConfig, origin: str) -> None:
    """The rules of a gpt-oss config, naming the field: ``layer_types`` one known kind per layer, ``sliding_window`` a
    positive integer, ``num_experts_per_tok`` between 1 and ``num_local_experts``, and the OpenAI key
    ``experts_per_token`` (the published files carry both) equal to it when given."""
    check_layer_types(cfg, origin)
    top_k = cfg.experts_per_token
    other = cfg.count("experts_per_token")
    if other is not None and other != top_k:
        raise GraphError(f"{origin}: field 'experts_per_token' ({other}) differs from 'num_experts_per_tok' ({top_k}): "
                         "transformers routes by num_experts_per_tok; give one value")
    cfg.flag("attention_bias", True)


def check_qwen_moe(cfg: HFConfig, origin: str) -> None:
    """The rules of a Qwen-MoE config over several fields, naming the field: ``mlp_only_layers`` indices within the
    layers, ``decoder_sparse_step`` >= 1, and where a layer is sparse: ``num_experts_per_tok`` <= ``num_experts``,
    ``moe_intermediate_size`` given (the experts' width; no default: a wrong one would be a silently wrong
    size), Qwen2-MoE's ``shared_expert_intermediate_size`` given, a positive integer."""
    bad = sorted(i for i in qwen_mlp_only_layers(cfg) if i >= cfg.n_layers)
    if bad:
        raise GraphError(f"{origin}: field 'mlp_only_layers' names layer {bad[0]}, but the model has {cfg.n_layers} layers "
                         f"(indices 0 to {cfg.n_layers - 1})")
    cfg.count("decoder_sparse_step", default=1)  # (read only on layers outside mlp_only_layers: checked here too)
    if not cfg.n_experts:
        return
    cfg.experts_per_token
    need = ["moe_intermediate_size"] + (["shared_expert_intermediate_size"] if cfg.family == "qwen2_moe" else [])
    for key in need:
        if cfg.raw.get(key) is None:
            what = "each routed expert's" if key.startswith("moe") else "the shared expert's"
            raise GraphError(f"{origin}: field '{key}' is missing: a {cfg.model_type} config with sparse layers must give "
                             f"{what} MLP width (wattcast assumes no default)")
        cfg.count(key)


def deepseek_field(cfg: HFConfig, key: str) -> int | None:
    """A DeepSeek-V2/V3 size as the model is built from the config: the config's value, else the model type's default
    (:data:`DEEPSEEK_DEFAULTS`); ``q_lora_rank`` set to null is None (a full-rank ``q_proj``); a field without a
    default (:data:`DEEPSEEK_V2_REQUIRED`) missing is a :class:`GraphError` naming it. The one place the defaults are
    read (the config check, the graph, the context-parallel ring's key/value width)."""
    if key == "q_lora_rank" and key in cfg.raw and cfg.raw[key] is None:
        return None
    value = cfg.count(key, default=DEEPSEEK_DEFAULTS[cfg.model_type].get(key),
                      minimum=0 if key in _DEEPSEEK_ZERO_OK else 1)
    if value is None:
        hint = " (null for a full-rank q_proj, as DeepSeek-V2-Lite; DeepSeek-V2 has 1536)" if key == "q_lora_rank" else ""
        raise GraphError(f"{cfg.name}: field '{key}' is missing: a {cfg.model_type} config must give it{hint}; its "
                         "default differs between DeepSeek's remote code and transformers' DeepseekV2Config, and "
                         "wattcast does not guess a model's size")
    return value


def check_deepseek(cfg: HFConfig, origin: str) -> None:
    """The fields of a DeepSeek-V2/V3 config, read when it is loaded (the graph reads them again), naming the field:
    the multi-head latent attention's sizes (positive, within :data:`MAX_WIDTH`); ``first_k_dense_replace`` >= 0 and
    ``moe_layer_freq`` >= 1; ``num_experts_per_tok`` between 1 and ``n_routed_experts``; the expert groups of the
    router (``n_group`` dividing ``n_routed_experts``, ``topk_group`` between 1 and ``n_group``: DeepseekV3TopkRouter
    views the scores as n_group groups; not costed, the router's GEMM is the same); ``moe_intermediate_size`` (each
    expert's width) and ``n_shared_experts`` within their bounds (:data:`BOUNDED_FIELDS`), and the shared experts'
    SwiGLU, ``n_shared_experts`` x ``moe_intermediate_size`` wide, within :data:`MAX_WIDTH`. Absent fields take the
    model type's default or are refused (:func:`deepseek_field`)."""
    for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank", "q_lora_rank",
                "first_k_dense_replace", "moe_layer_freq"):
        deepseek_field(cfg, key)
    if not all(cfg.moe_layer(i) for i in range(cfg.n_layers)):  # a dense MLP somewhere: its width is read
        deepseek_field(cfg, "intermediate_size")
    if cfg.n_experts:
        cfg.experts_per_token
        groups = cfg.count("n_group")
        if groups is not None and cfg.n_experts % groups:
            raise GraphError(f"{origin}: field 'n_group' ({groups}) must divide n_routed_experts ({cfg.n_experts}): the "
                             "router splits the experts into that many equal groups")
        top_groups = cfg.count("topk_group")  # (without n_group, transformers' default applies: not checked here)
        if top_groups is not None and groups is not None and top_groups > groups:
            raise GraphError(f"{origin}: field 'topk_group' ({top_groups}) must be between 1 and n_group ({groups}): "
                             "the router keeps that many of the expert groups")
    if not cfg.n_experts:
        return
    moe_ffn, shared = deepseek_field(cfg, "moe_intermediate_size"), deepseek_field(cfg, "n_shared_experts")
    if shared * moe_ffn > MAX_WIDTH:
        raise GraphError(f"{origin}: field 'n_shared_experts' ({shared:,}) x moe_intermediate_size ({moe_ffn:,}) is "
                         f"{shared * moe_ffn:,}: the shared experts run as one MLP that wide, over {MAX_WIDTH:,}, wider "
                         "than any published model's layers; wattcast refuses it as a likely typo")


# ------------------------------------------------------------------ validation: pydantic types and the config model
def _whole(minimum: int = 1, ref: str = FIELD):
    """A whole number >= ``minimum`` (8.0 is 8; True, "8", 2.5 and 0 for a count are errors), returned as an int.
    ``ref`` is how the message names the field (:data:`FIELD` "field 'x'", :data:`NAME` "x")."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
            raise problem("wc_type", f"{ref} must be an integer, got {v!r}")
        if v < minimum:
            raise problem("wc_value", f"{ref} must be {what}, got {v!r}")
        return int(v)

    return check


def _flag(v: Any) -> bool:
    if not isinstance(v, bool):
        raise problem("wc_type", f"{FIELD} must be true or false, got {v!r}")
    return v


def _fraction(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise problem("wc_value", f"{FIELD} must be a number between 0 and 1, got {v!r}")
    return float(v)


def _at_most(kind: str, ref: str = FIELD):
    """The plausibility bound of a ``kind`` of field (:data:`BOUNDED_FIELDS`) on a whole number already checked."""
    limit, what = {"width": (MAX_WIDTH, "wider than any published model's layers (the widest MLPs have 65,536-73,728)"),
                   "experts": (MAX_EXPERTS, "more experts than any published model (Switch-C has 2,048 per layer)"),
                   "vocab": (MAX_VOCAB, "a larger table than any published model's (the largest vocabularies have "
                                        "about 250,000 tokens)")}[kind]

    def check(v: int) -> int:
        if v > limit:
            raise problem("wc_plausible", f"{ref} is {v:,}: over {limit:,}, {what}; wattcast refuses it as a likely "
                                          "typo rather than cost an astronomic step")
        return v

    return check


def _layers(v: int) -> int:
    if v > MAX_LAYERS:
        raise problem("wc_plausible", f"{FIELD} is {v:,}: over {MAX_LAYERS:,} layers, beyond any published model (the "
                                      "largest have 100-200); wattcast refuses it rather than build a graph for hours")
    return v


def _rope_theta(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise problem("wc_value", f"{FIELD} must be a positive number (the RoPE base, e.g. 10000), got {v!r}")
    return v


def _rope_scaling(v: Any) -> Any:
    """``rope_scaling``: a JSON object (null or absent: no scaling) whose ``factor``, when set, is a positive number
    (Llama 3.1's {"rope_type": "llama3", "factor": 8.0, ...}; a scheme without a factor, such as Phi-3's longrope
    lists, passes). The factor extends the trained context (:func:`position_warning`)."""
    if not isinstance(v, Mapping):
        raise problem("wc_type", f"{FIELD} must be a JSON object such as "
                                 f"{{\"rope_type\": \"linear\", \"factor\": 2.0}} (or null), got {v!r}")
    factor = v.get("factor")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0):
        raise problem("wc_value", f"field 'rope_scaling.factor' must be a positive number (the context extension, "
                                  f"e.g. 8.0), got {factor!r}")
    for key in ("rope_type", "type"):
        kind = v.get(key)
        if kind is not None and (not isinstance(kind, str) or not kind.strip()):
            raise problem("wc_type", f"field 'rope_scaling.{key}' must be a scaling scheme's name (e.g. \"linear\", "
                                     f"\"llama3\", \"yarn\"), got {kind!r}")
    return v


def _torch_dtype(v: Any) -> Any:
    name = v.strip().lower().removeprefix("torch.") if isinstance(v, str) else None
    if name not in TORCH_DTYPES:
        raise problem("wc_value", f"{FIELD} is {v!r}, not a torch dtype; expected one of {', '.join(TORCH_DTYPES)} "
                                  "(the step's dtype is set by --dtype)")
    return v


def _activation(v: Any) -> Any:
    if not isinstance(v, str) or not v.strip():
        raise problem("wc_type", f"{FIELD} must be an activation name, got {v!r}")
    return v


_COUNT = Annotated[Any, AfterValidator(_whole(ref=NAME))]
_WIDTH = Annotated[Any, AfterValidator(_whole(ref=NAME)), AfterValidator(_at_most("width", NAME))]


def _aliases(key: str, *default: None) -> Any:
    """A normalised field read from the first of its :data:`ALIASES` the config sets (errors name that alias);
    required unless a ``default`` is given."""
    return Field(*default, validation_alias=AliasChoices(*ALIASES[key]))


def _non_finite(raw: Mapping[str, Any], prefix: str = "") -> tuple[str, Any] | None:
    """The first field (nested objects and lists too) holding NaN or an infinity, as (dotted name, value)."""
    for k, v in raw.items():
        key = f"{prefix}{k}"
        if isinstance(v, float) and not math.isfinite(v):
            return key, v
        if isinstance(v, Mapping):
            hit = _non_finite(v, key + ".")
            if hit:
                return hit
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                if isinstance(x, float) and not math.isfinite(x):
                    return f"{key}[{i}]", x
                if isinstance(x, Mapping):
                    hit = _non_finite(x, f"{key}[{i}].")
                    if hit:
                        return hit
    return None


class HFConfigModel(BaseModel):
    """The validation model of the Hugging Face config fields wattcast reads: the ones every graph needs (read from
    their :data:`ALIASES`, errors naming the alias the config used), ``rope_theta``, ``rope_scaling``, ``torch_dtype`` /
    ``dtype`` and ``tie_word_embeddings``; NaN or an infinity anywhere in the file, and an unknown ``model_type``, are
    refused first. A field set to null counts as absent. Other fields pass (a config has many); the graph builders read
    the ones they use with :func:`int_field`, :func:`bool_field` and :func:`fraction_field`, on the same types."""

    model_config = ConfigDict(extra="allow", frozen=True, protected_namespaces=())

    @model_validator(mode="before")
    @classmethod
    def _whole_file(cls, raw: Any) -> Any:
        if not isinstance(raw, Mapping):
            raise problem("wc_type", "a config must be a JSON object")
        bad = _non_finite(raw)
        if bad:
            raise problem("wc_value", f"field '{bad[0]}' is {bad[1]!r}: not a finite number (a broken or hand-edited "
                                      "config)")
        mt = str(raw.get("model_type", "")).strip().lower()
        if not mt:
            raise problem("wc_missing", f"no 'model_type' field; known types: {', '.join(sorted(MODEL_TYPES))}")
        if mt not in MODEL_TYPES:
            raise problem("wc_value", f"unknown model_type {mt!r}; known types: {', '.join(sorted(MODEL_TYPES))}")
        return {k: v for k, v in raw.items() if v is not None and isinstance(k, str)}

    model_type: Annotated[Any, AfterValidator(lambda v: str(v).strip().lower())]
    hidden: Annotated[_WIDTH, _aliases("hidden")]
    n_layers: Annotated[Any, AfterValidator(_whole(ref=NAME)), AfterValidator(_layers), _aliases("n_layers")]
    n_heads: Annotated[_COUNT, _aliases("n_heads")]
    vocab: Annotated[Any, AfterValidator(_whole(ref=NAME)), AfterValidator(_at_most("vocab", NAME)), _aliases("vocab")]
    head_dim: Annotated[_WIDTH, _aliases("head_dim", None)]
    n_kv_heads: Annotated[_COUNT, _aliases("n_kv_heads", None)]
    ffn: Annotated[_WIDTH, _aliases("ffn", None)]
    #: the position table's size; absent: no limit known
    max_positions: Annotated[_COUNT, _aliases("max_positions", None)]
    activation: Annotated[Any, AfterValidator(_activation), _aliases("activation", None)]
    rope_theta: Annotated[Any, AfterValidator(_rope_theta)] = None
    rope_scaling: Annotated[Any, AfterValidator(_rope_scaling)] = None
    torch_dtype: Annotated[Any, AfterValidator(_torch_dtype)] = None
    dtype: Annotated[Any, AfterValidator(_torch_dtype)] = None
    tie_word_embeddings: Annotated[Any, AfterValidator(_flag)] = None


#: the normalised field of each alias, and its aliases (for "missing hidden (one of hidden_size, n_embd, ...)")
_KEY_OF_ALIAS = {a: k for k, aliases in ALIASES.items() for a in aliases}


def _missing(alias: str) -> str:
    key = _KEY_OF_ALIAS.get(alias, alias)
    return f"missing {key} (one of {', '.join(ALIASES[key])})" if key in ALIASES else f"missing {alias}"


@lru_cache(maxsize=None)
def _adapter(check: str, minimum: int = 1) -> TypeAdapter:
    """The pydantic type of a field read outside :class:`HFConfigModel`: "count" (a whole number >= ``minimum``,
    named "field 'x'"), "size" (the same, named "x"), "flag", "fraction", or a bounded count (a kind of
    :data:`BOUNDED_FIELDS`: "width", "experts", "vocab")."""
    if check in ("width", "experts", "vocab"):
        return TypeAdapter(Annotated[Any, AfterValidator(_whole(minimum)), AfterValidator(_at_most(check))])
    v = {"count": lambda: _whole(minimum), "size": lambda: _whole(minimum, NAME), "flag": lambda: _flag,
         "fraction": lambda: _fraction}[check]()
    return TypeAdapter(Annotated[Any, AfterValidator(v)])


def _read(check: str, value: Any, key: str, origin: str, *, minimum: int = 1) -> Any:
    """``value`` (of the field ``key``, dotted when nested) as :func:`_adapter` (``check``) types it, or
    :class:`GraphError` naming the field."""
    try:
        return _adapter(check, minimum).validate_python(value)
    except ValidationError as e:
        raise GraphError(f"{origin}: {first_problem(e, at=tuple(key.split('.')))}") from None


def int_field(raw: Mapping[str, Any], key: str, origin: str, *, minimum: int = 1) -> int:
    """``raw[key]`` as a whole number >= ``minimum`` (8.0 is 8; True, "8", 2.5 and 0 for a count are errors), within
    its plausibility bound when it has one (:data:`BOUNDED_FIELDS`)."""
    return _read(BOUNDED_FIELDS.get(key, "count"), raw.get(key), key, origin, minimum=minimum)


def bool_field(raw: Mapping[str, Any], key: str, origin: str, default: bool) -> bool:
    """``raw[key]`` as a JSON boolean; ``default`` when absent or null."""
    return default if raw.get(key) is None else _read("flag", raw[key], key, origin)


def fraction_field(raw: Mapping[str, Any], key: str, origin: str) -> float:
    """``raw[key]`` as a number in [0, 1]."""
    return _read("fraction", raw.get(key), key, origin)


def _check_size(cfg: HFConfig, raw: Mapping[str, Any], origin: str) -> None:
    """Refuse models too large to build (a billion layers would hang), naming the field: the rules over several
    fields (encoder plus decoder layers, experts per layer and in all); one stack's layers are a field rule."""
    decoder = cfg.total_layers - cfg.n_layers
    if decoder > MAX_LAYERS:
        raise GraphError(f"{origin}: field 'num_decoder_layers' is {decoder:,}: over {MAX_LAYERS:,} layers, beyond any "
                         "published model (the largest have 100-200); wattcast refuses it rather than build a graph "
                         "for hours")
    if cfg.total_layers > MAX_LAYERS:
        raise GraphError(f"{origin}: {cfg.total_layers:,} encoder plus decoder layers, over {MAX_LAYERS:,} "
                         "(fields num_layers and num_decoder_layers)")
    n_exp = cfg.n_experts or 0
    key = next((k for k in ("num_local_experts", "num_experts", "n_routed_experts") if raw.get(k) is not None),
               "num_local_experts")
    if n_exp > MAX_EXPERTS:
        raise GraphError(f"{origin}: field '{key}' is {n_exp:,}: over {MAX_EXPERTS:,} experts per layer (Switch-C has "
                         "2,048); wattcast refuses it rather than build a graph for hours")
    if n_exp * cfg.total_layers > MAX_LAYER_EXPERTS:
        raise GraphError(f"{origin}: field '{key}' is {n_exp:,} over {cfg.total_layers:,} layers: "
                         f"{n_exp * cfg.total_layers:,} experts in all, over {MAX_LAYER_EXPERTS:,}; wattcast refuses it "
                         "rather than build a graph for hours")


#: families whose graph does not read the activation field: BLOOM's and Falcon's MLPs are GELU by architecture,
#: gpt-oss's experts run its clamped SwiGLU, Gemma reads ``hidden_activation`` instead (hf_models.llama)
_ACTIVATION_UNREAD = ("bloom", "falcon", "gpt_oss", "gemma", "gemma2", "gemma3")


def _check_activation(raw: Mapping[str, Any], family: str, act: str | None, origin: str) -> None:
    """A config's activation (``hidden_act`` or its alias; Gemma's ``hidden_activation``) must be one the graph
    builders cost (hf_blocks.ACTIVATIONS): refused here naming the file and the field, not when the graph is built
    (until stop 54: "unsupported activation function 'frobnicate'", naming neither)."""
    from wattcast.featurize.hf_blocks import ACTIVATIONS

    if family in ("gemma", "gemma2", "gemma3"):
        key, value = "hidden_activation", raw.get("hidden_activation")
        if not isinstance(value, str):
            return  # absent (the default) or not a string (refused by the builder naming the field)
    elif act is None or family in _ACTIVATION_UNREAD:
        return
    else:
        key, value = _alias(raw, "activation"), raw.get(_alias(raw, "activation"))
    name = value.strip().lower()
    if family == "switch":
        name = name.removeprefix("gated-")  # (Switch's: SwitchTransformersConfig reads dense_act_fn only)
    if name not in ACTIVATIONS:
        raise GraphError(f"{origin}: field '{key}' is {value!r}, an activation wattcast does not cost; expected one of "
                         f"{', '.join(ACTIVATIONS)}")


def t5_feed_forward(raw: Mapping[str, Any], origin: str) -> tuple[str, bool]:
    """(activation, gated) of a ``t5`` config's feed-forward blocks, as T5Config derives them (transformers 5.24.0
    models/t5/configuration_t5.py): ``feed_forward_proj`` (l.55, default "relu") is "ACT" or "gated-ACT" (l.86-94
    refuses any other form); l.68-70 ``dense_act_fn = act_info[-1]``, ``is_gated_act = act_info[0] == "gated"``, l.73-74
    "gated-gelu" runs "gelu_new"; a ``dense_act_fn`` / ``is_gated_act`` the file saves (T5 v1.1 and Flan-T5 write both)
    is set over them afterwards (configuration_utils.py l.499-505: leftover keys are ``setattr``). A gated block is
    T5DenseGatedActDense (modeling_t5.py l.98-123: ``wi_0``, ``wi_1``, ``act(wi_0(x)) * wi_1(x)``, ``wo``), else
    T5DenseActDense (l.76-82: ``wi``, ``act``, ``wo``): T5LayerFF l.130-133 picks by ``is_gated_act``. An activation
    wattcast does not cost is refused naming its field."""
    from wattcast.featurize.hf_blocks import ACTIVATIONS

    proj = raw.get("feed_forward_proj", "relu")
    if proj is None:
        proj = "relu"
    parts = proj.strip().lower().split("-") if isinstance(proj, str) else []
    if not parts or not all(parts) or len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise GraphError(f"{origin}: field 'feed_forward_proj' is {proj!r}: T5Config expects 'ACT' or 'gated-ACT' "
                         "(e.g. 'relu', 'gated-gelu')")
    act = "gelu_new" if parts == ["gated", "gelu"] else parts[-1]
    if raw.get("dense_act_fn") is not None:
        act = raw["dense_act_fn"].strip().lower() if isinstance(raw["dense_act_fn"], str) else raw["dense_act_fn"]
        if not isinstance(act, str) or not act:
            raise GraphError(f"{origin}: field 'dense_act_fn' must be an activation name, got {raw['dense_act_fn']!r}")
    if act not in ACTIVATIONS:
        key = "dense_act_fn" if raw.get("dense_act_fn") is not None else "feed_forward_proj"
        raise GraphError(f"{origin}: field '{key}' is {raw.get(key)!r}, an activation wattcast does not cost; expected "
                         f"one of {', '.join(ACTIVATIONS)}")
    return act, bool_field(raw, "is_gated_act", origin, parts[0] == "gated")


def _alias(raw: Mapping[str, Any], key: str) -> str:
    """The alias of ``key`` the config sets (for messages)."""
    return next((a for a in ALIASES[key] if raw.get(a) is not None), ALIASES[key][0])


def model_warnings(cfg: HFConfig, seq: int) -> list[str]:
    """The warnings a step of ``cfg`` over ``seq`` tokens gets whatever its parallel split or batch (its graph's
    ``meta["warnings"]``): a sequence beyond a rotary model's positions (:func:`position_warning`), then what the config
    asks for that the graph does not model (:func:`config_warnings`). ``search`` reports them once per search."""
    return [w for w in (position_warning(cfg, seq), *config_warnings(cfg)) if w]


def position_warning(cfg: HFConfig, seq: int) -> str | None:
    """A warning when ``seq`` tokens exceed a rotary-position model's ``max_position_embeddings`` (and any
    ``rope_scaling`` factor): the step is predicted (RoPE runs any length), but the model was not trained there.
    Learned-position families refuse such a ``seq`` instead (see :func:`wattcast.featurize.workload`)."""
    if cfg.family not in ROPE_FAMILIES or not cfg.max_positions or seq <= cfg.max_positions:
        return None
    scaling = cfg.raw.get("rope_scaling")
    factor = scaling.get("factor") if isinstance(scaling, Mapping) else None
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 0 \
            and seq <= cfg.max_positions * factor:
        return None
    field_name = _alias(cfg.raw, "max_positions")
    return (f"{cfg.name}: seq {seq:,} is beyond {field_name} {cfg.max_positions:,}: rotary-position (RoPE) models "
            "run longer sequences, so the step is predicted, but the model was not trained at this length (a warning, "
            "not an error; set rope_scaling in the config for a context-extended model)")


#: multimodal wrappers whose language model is their ``text_config`` (transformers' Gemma3Config, Mistral3Config,
#: Llama4Config: ``text_config`` a Gemma3TextConfig / MistralConfig / Llama4TextConfig, ``vision_config`` the vision
#: tower's), and the text model_type their config class assumes when ``text_config`` names none
MULTIMODAL_WRAPPERS = {"gemma3": "gemma3_text", "mistral3": "mistral", "llama4": "llama4_text",
                       # LlavaConfig (transformers 5.24.0 models/llava/configuration_llava.py l.67): text_config
                       # SubConfigSpec(config_class=AutoConfig, model_type="llama")
                       "llava": "llama"}


def unwrap_text_config(raw: Mapping[str, Any], origin: str
                       ) -> tuple[Mapping[str, Any], str | None, tuple[tuple[str, int, str], ...]]:
    """(the language model's config, the wrapper's model_type or None, the fields filled in): a multimodal wrapper's
    ``text_config`` (:data:`MULTIMODAL_WRAPPERS`, or any config of an unknown model_type that carries one) is the model
    wattcast builds; the vision tower is not modelled (:func:`config_warnings` says so). The fields the text_config
    leaves out take its text model_type's config class defaults (:data:`CONFIG_CLASS_DEFAULTS`), as transformers
    builds the sub-config: Gemma 3 4B's text_config gives no heads and no vocabulary (Gemma3TextConfig's 8, 4 and
    262,208), LLaVA-1.5's only the vocabulary and positions (LlamaConfig's 4,096 hidden, 32 layers, 32 heads); these
    are returned as (field, value, config class) for the warning. A wrapper without a ``text_config``, or whose text
    model_type is not one wattcast builds, is refused naming the fix."""
    if not isinstance(raw, Mapping):
        return raw, None, ()
    mt = str(raw.get("model_type", "")).strip().lower()
    if mt in MODEL_TYPES or (mt not in MULTIMODAL_WRAPPERS and not isinstance(raw.get("text_config"), Mapping)):
        return raw, None, ()
    sub = raw.get("text_config")
    if not isinstance(sub, Mapping):
        raise GraphError(f"{origin}: model_type {mt!r} is a multimodal wrapper (its language model is in 'text_config', "
                         f"a {MULTIMODAL_WRAPPERS[mt]} config), but this config has no text_config object; pass the "
                         f"language model's own config (model_type {MULTIMODAL_WRAPPERS[mt]!r})")
    text_mt = str(sub.get("model_type") or MULTIMODAL_WRAPPERS.get(mt, "")).strip().lower()
    if text_mt not in MODEL_TYPES:
        raise GraphError(f"{origin}: model_type {mt!r} is a multimodal wrapper; its text_config is model_type "
                         f"{text_mt!r}, which wattcast does not build (known types: {', '.join(sorted(MODEL_TYPES))})")
    # the wrapper's quantization_config describes the whole checkpoint: kept for its warning
    quant = {"quantization_config": raw["quantization_config"]} if raw.get("quantization_config") is not None else {}
    cls, defaults = CONFIG_CLASS_DEFAULTS.get(text_mt, (None, {}))
    if defaults.get("hidden_size") and FFN_DEFAULTS.get(text_mt):  # the MLP width's class default (FFN_DEFAULTS) too
        defaults = {**defaults, "intermediate_size": FFN_DEFAULTS[text_mt]}
    filled = tuple((name, value, cls) for name, value in defaults.items()
                   if value is not None and _KEY_OF_ALIAS.get(name) not in _HEAD_KEYS  # (normalise_config fills those)
                   and not any(sub.get(a) is not None for a in ALIASES[_KEY_OF_ALIAS[name]]))
    return {**quant, **sub, **{name: value for name, value, _ in filled}, "model_type": text_mt}, mt, filled


def normalise_config(raw: Mapping[str, Any], *, name: str = "model", origin: str = "config") -> HFConfig:
    """Validate ``raw`` on :class:`HFConfigModel`, normalise field aliases and derive what the config leaves out
    (head size, key/value heads, MLP width); :class:`GraphError` naming the field on bad input. A multimodal
    wrapper's ``text_config`` is read in its place (:func:`unwrap_text_config`)."""
    raw, wrapper, filled = unwrap_text_config(raw, origin)
    defaulted = list(filled)
    if wrapper:
        origin = f"{origin} (text_config)"
    try:
        m = HFConfigModel.model_validate(raw)
    except ValidationError as e:
        raise GraphError(f"{origin}: {first_problem(e, missing=_missing)}") from None
    mt, hidden, heads = m.model_type, m.hidden, m.n_heads
    family = MODEL_TYPES[mt]
    hd = m.head_dim
    generic_hd = False
    if hd is None and family not in EVEN_HEAD_FAMILIES and family != "deepseek":
        rule = class_default(mt, "head_dim")  # the config class's default (Gemma's 256, gpt-oss's 64), not hidden / heads
        if rule is not None and rule[2] is not None:
            hd = rule[2]
            defaulted.append((rule[0], hd, rule[1]))
        generic_hd = rule is None
    if hd is None and family == "deepseek":
        # multi-head latent attention sizes its heads by qk_nope + qk_rope (queries, keys) and v_head_dim (values):
        # the hidden size need not divide by the heads; the nominal head size is the value head's
        hd = int_field(raw, "v_head_dim", origin) if raw.get("v_head_dim") is not None else DEEPSEEK_DEFAULTS[mt]["v_head_dim"]
    if hd is None or family in EVEN_HEAD_FAMILIES:
        if hidden % heads:
            raise GraphError(f"{origin}: hidden size {hidden} ({_alias(raw, 'hidden')}) is not divisible by {heads} heads "
                             f"({_alias(raw, 'n_heads')})")
        if hd is not None and hd != hidden // heads:  # a field this family's attention does not read
            raise GraphError(f"{origin}: field '{_alias(raw, 'head_dim')}' is {hd}, but the attention of model_type {mt} "
                             f"splits the hidden size {hidden} evenly over its {heads} heads: {hidden // heads} each "
                             f"(transformers does not read the field); remove it or make it {hidden // heads}")
        hd = hidden // heads
        if generic_hd:  # no known rule of the model_type's class: wattcast's own, said in the warnings
            defaulted.append(("head_dim", hd, None))
    if heads * hd > MAX_WIDTH:
        raise GraphError(f"{origin}: field '{_alias(raw, 'n_heads')}' ({heads:,}) x head size {hd:,} is {heads * hd:,}: "
                         f"the attention's projections that wide, over {MAX_WIDTH:,}, wider than any published model's; "
                         "wattcast refuses it as a likely typo")
    kv = m.n_kv_heads
    kv_key = _alias(raw, "n_kv_heads")  # (for messages: the field kv was read from)
    if kv is None:  # the config class's default (Mistral's 8, Gemma 2/3's 4), else one per query head
        rule = class_default(mt, "n_kv_heads")
        kv = heads if rule is None or rule[2] is None else rule[2]
        if rule is None or rule[2] is not None:
            defaulted.append((kv_key if rule is None else rule[0], kv, None if rule is None else rule[1]))
        if rule is not None and rule[2] is not None:
            kv_key = f"{rule[0]} absent: {rule[1]}'s default"
    ffn = m.ffn
    if family == "mpt":  # MosaicML MPT: nested attention options and an MLP expansion ratio
        attn = raw.get("attn_config")
        attn = {} if attn is None else attn
        if not isinstance(attn, Mapping):
            raise GraphError(f"{origin}: attn_config must be a JSON object, got {attn!r}")
        kind = attn.get("attn_type", "multihead_attention")
        if kind == "multiquery_attention":
            kv = 1
        elif kind == "grouped_query_attention":
            kv = _read("size", attn.get("kv_n_heads"), "attn_config.kv_n_heads", origin)
            kv_key = "attn_config.kv_n_heads"
        elif kind != "multihead_attention":
            raise GraphError(f"{origin}: unknown attn_config.attn_type {kind!r}")
        if ffn is None and raw.get("expansion_ratio") is not None:
            er = raw["expansion_ratio"]
            if isinstance(er, bool) or not isinstance(er, (int, float)) or not er > 0 or int(er * hidden) < 1:
                raise GraphError(f"{origin}: expansion_ratio must be a positive number, got {er!r}")
            ffn = int(er * hidden)
            if ffn > MAX_WIDTH:
                raise GraphError(f"{origin}: field 'expansion_ratio' ({er:g}) x {_alias(raw, 'hidden')} ({hidden:,}) is "
                                 f"an MLP {ffn:,} wide, over {MAX_WIDTH:,}, wider than any published model's; wattcast "
                                 "refuses it as a likely typo")
    if family == "falcon" and not bool_field(raw, "new_decoder_architecture", origin, False) \
            and bool_field(raw, "multi_query", origin, True):
        kv = 1  # FalconAttention: num_kv_heads counts only in the new decoder or without multi_query
    if heads % kv:
        raise GraphError(f"{origin}: {heads} attention heads ({_alias(raw, 'n_heads')}) are not divisible by {kv} "
                         f"key/value heads ({kv_key}): each key/value head serves an equal group of query heads")
    if ffn is None:  # what transformers' config class of the model_type gives (FFN_DEFAULTS), or refused
        ffn = default_ffn_width(mt, hidden, origin)
    maxpos = m.max_positions or 0  # 0 = not given (no limit known)
    act = (m.activation or ("gelu_new" if family == "gpt2" else "gelu")).lower()
    if mt == "t5":  # T5Config derives the activation (and the gate) from feed_forward_proj: t5_feed_forward
        act = t5_feed_forward(raw, origin)[0]
    else:
        _check_activation(raw, family, act if m.activation else None, origin)
    cfg = HFConfig(model_type=mt, family=family, hidden=hidden, n_layers=m.n_layers, n_heads=heads, n_kv_heads=kv,
                   head_dim=hd, ffn=ffn, vocab=m.vocab, max_positions=maxpos, activation=act, name=name, raw=dict(raw),
                   wrapper=wrapper, defaulted=tuple(defaulted))
    # the rules over several fields, on the normalised config
    _check_size(cfg, raw, origin)
    if family == "mixtral" and cfg.n_experts:
        cfg.experts_per_token
    if family == "deepseek":
        check_deepseek(cfg, origin)
    if family in QWEN_MOE_FAMILIES:
        check_qwen_moe(cfg, origin)
    if family == "gpt_oss":
        check_gpt_oss(cfg, origin)
    else:
        check_layer_types(cfg, origin)
    return cfg


#: the file look-ups of a ``pinned_files`` block: (kind, model reference) -> what the look-up found
_PINNED: ContextVar[dict | None] = ContextVar("wattcast_pinned_files", default=None)


@contextmanager
def pinned_files():
    """Inside the block, the file look-up of each model reference (is it a file or a built-in name, its real path and
    modification time) is made once and reused: a strategy search asks for the same model thousands of times and the
    files do not change under it. Nested blocks share the outer one's look-ups."""
    if _PINNED.get() is not None:
        yield
        return
    token = _PINNED.set({})
    try:
        yield
    finally:
        _PINNED.reset(token)


def pinned(key: tuple, look_up):
    """``look_up()``, once per ``key`` inside a :func:`pinned_files` block (every time outside one; errors are not kept)."""
    memo = _PINNED.get()
    if memo is None:
        return look_up()
    if key not in memo:
        memo[key] = look_up()
    return memo[key]


def load_hf_config(model: str | Path | Mapping[str, Any]) -> HFConfig:
    """A config from a dict, a ``config.json`` path, or a built-in name (case-insensitive)."""
    if isinstance(model, Mapping):
        return normalise_config(model, name=str(model.get("_name_or_path", "model")))
    return _load_config_file(*pinned(("config", str(model)), lambda: _locate_config(model)))


def locate_model_config(model: str | Path) -> tuple[Path, str, str] | None:
    """(config file, model name, kind: "folder", "builtin" or "hub") of a model reference that is not a plain file:
    a Hugging Face model folder (its ``config.json``), a built-in name, or a Hub id in the local Hub cache
    (:mod:`wattcast.featurize.hub_cache`; ``org/name`` not in the cache raises a
    :class:`~wattcast.featurize.hub_cache.HubCacheError` saying where it looked). None when it is none of these."""
    from wattcast.featurize.hub_cache import cached_config, repo_name

    p = Path(model)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise GraphError(f"{p} is a folder without a config.json; give an ONNX file, a config.json, a Hugging Face "
                             "model folder, a Hub id in the local cache or a built-in name")
        return p / "config.json", p.resolve().name, "folder"
    cand = _BUILTIN_DIR / f"{str(model).strip().lower().replace('-', '_')}.json"
    if cand.is_file():
        return cand, cand.stem, "builtin"
    if isinstance(model, str):
        # "org/name" can only be a Hub id (refused, saying where it looked, when not cached); a bare name is one only
        # when the cache has it (else: the unknown built-in name it more likely is)
        hub = cached_config(model, required="/" in model.split("@", 1)[0])
        if hub is not None:
            return hub, repo_name(model), "hub"
    return None


def _locate_config(model: str | Path) -> tuple[str, float, str, str]:
    """(real path, modification time, name, origin) of a config file, model folder, built-in name or cached Hub id."""
    p = Path(model)
    if p.is_file():
        name = p.parent.name if p.name == "config.json" else p.stem
    else:
        found = locate_model_config(model)
        if found is None:
            raise GraphError(f"{model}: not a file and not a built-in model (built-ins: {', '.join(builtin_models())}; "
                             "a Hugging Face model folder or a Hub id in the local Hub cache also works)")
        p, name, _ = found
    return str(p.resolve()), p.stat().st_mtime, name, str(p)


#: the first bytes of a zip archive (torch.save since PyTorch 1.6 and torch.export.save write one) and of a pickle
#: (protocol 2+ starts with PROTO, 0x80: the pickle module's opcode table)
_ZIP_MAGIC, _PICKLE_PROTO = b"PK\x03\x04", b"\x80"


def saved_torch_model_hint(path: str | Path) -> str | None:
    """What to do with a saved PyTorch model (a torch.export.save ``.pt2``, a torch.save ``.pt``/``.pth``) given where
    a config or ONNX file goes; None for any other file. wattcast does not load it: torch.load unpickles (running
    whatever code the file names) and torch.export.load reads its weights back through torch.load too, so an untrusted
    file is not safe to open; the user loads their own in Python instead."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    suffix = Path(path).suffix.lower()
    if not (head == _ZIP_MAGIC or head[:1] == _PICKLE_PROTO or suffix in (".pt2", ".pt", ".pth")):
        return None
    return ("a saved PyTorch model (torch.export.save / torch.save), not a JSON config or ONNX file; wattcast does not "
            "unpickle model files (loading one runs code it names). Load it yourself in Python and pass the program: "
            "ep = torch.export.load(path); wattcast.predict(ep, device) (or ep.module(), with example_inputs=); or "
            "export ONNX for the CLI: torch.onnx.export(model, args, 'model.onnx', dynamo=True)")


@lru_cache(maxsize=256)
def _load_config_file(path: str, mtime: float, name: str, origin: str) -> HFConfig:
    """A config file, read once per modification time (predictions in a search loop ask again and again)."""
    try:
        raw = json_loads_unique(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        hint = saved_torch_model_hint(path)
        raise GraphError(f"{origin}: {hint}" if hint else f"{origin}: cannot read as a JSON config: {e}") from None
    except DuplicateKeyError as e:
        raise GraphError(f"{origin}: {e}") from None
    return normalise_config(raw, name=name, origin=origin)
