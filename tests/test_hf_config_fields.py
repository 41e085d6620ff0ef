"""Hugging Face config fields that change the model transformers builds, read as transformers reads them: sliding
windows (Mistral, Mixtral, Qwen2, ``layer_types``), DeepSeek's defaults, Llama's biases, ``quantization_config`` and
the multimodal wrappers' ``text_config``. Each field is checked against a first-principles count of the model."""

from __future__ import annotations

import pytest

from wattcast.featurize.hf_config import attention_windows, load_hf_config
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph

#: mistralai/Mistral-7B-v0.1 config.json (the sizes; sliding_window 4096)
MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
              "hidden_act": "silu", "sliding_window": 4096, "tie_word_embeddings": False, "_name_or_path": "mistral"}


def _graph(model, **kw):
    return step_graph(model, StepOptions(**{"batch": 1, "seq": 16, "mode": "inference", "dtype": "bf16", **kw}))


def _flash_flops(model, seq: int, **kw) -> list[float]:
    """The forward flash-attention FLOPs of each block."""
    n = _graph(model, seq=seq, attention="flash", **kw).nodes
    fa = n[(n["op_class"] == "flash_attention") & (n["phase"] == "forward")]
    return fa.groupby("layer")["flops"].sum().tolist()


def _causal_pairs(seq: int, window: int | None) -> float:
    """(query, key) pairs a causal attention of ``seq`` tokens scores, with a sliding window of ``window`` keys."""
    if window is None or window >= seq:
        return seq * (seq + 1) / 2
    return window * seq - window * (window - 1) / 2


def test_mistral_sliding_window_limits_the_flash_kernel_on_every_layer():
    """MistralAttention passes ``sliding_window=config.sliding_window`` to the flash kernel on every layer: at 32k
    tokens with a 4,096 window each query scores at most 4,096 keys, (4096 x 32768 - 4096 x 4095 / 2) pairs against
    the causal 32768 x 32769 / 2: 4.27x fewer."""
    seq = 32768
    windowed = _flash_flops(MISTRAL_7B, seq, blocks=2)
    full = _flash_flops({**MISTRAL_7B, "sliding_window": None}, seq, blocks=2)  # an explicit null: no window
    assert len(windowed) == 2 and windowed[0] == windowed[1]
    assert full[0] / windowed[0] == pytest.approx(_causal_pairs(seq, None) / _causal_pairs(seq, 4096), rel=1e-3)
    # absent: MistralConfig's default window, 4096 (configuration_mistral.py)
    absent = {k: v for k, v in MISTRAL_7B.items() if k != "sliding_window"}
    assert attention_windows(load_hf_config(absent)) == (4096,) * 32


def test_mistral_window_reaches_the_megatron_core_graph_too():
    """``--framework megatron`` builds Llama-family models with Megatron-Core's modules (hf_models.llama_megatron);
    the window goes to the fused kernel there as TransformerConfig.window_size does (it was dropped until stop 41: the
    megatron graph scored the whole causal square)."""
    seq = 32768
    windowed = _flash_flops(MISTRAL_7B, seq, blocks=2, mode="train", framework="megatron")
    full = _flash_flops({**MISTRAL_7B, "sliding_window": None}, seq, blocks=2, mode="train", framework="megatron")
    assert len(windowed) == 2
    assert full[0] / windowed[0] == pytest.approx(_causal_pairs(seq, None) / _causal_pairs(seq, 4096), rel=1e-3)


def test_mixtral_null_window_is_full_attention():
    """MixtralConfig's sliding_window defaults to None; the published Mixtral 8x7B config sets null: no window."""
    mixtral = {**MISTRAL_7B, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}
    assert attention_windows(load_hf_config({**mixtral, "sliding_window": None})) == (None,) * 32
    assert attention_windows(load_hf_config({k: v for k, v in mixtral.items() if k != "sliding_window"})) == (None,) * 32
    assert attention_windows(load_hf_config(mixtral)) == (4096,) * 32


def test_qwen2_window_from_max_window_layers_under_use_sliding_window():
    """Qwen2Config: ``layer_types[i]`` is "sliding_attention" when use_sliding_window and i >= max_window_layers;
    Qwen2Attention gives those layers ``config.sliding_window``; without use_sliding_window no layer has a window."""
    qwen = {**MISTRAL_7B, "model_type": "qwen2", "num_hidden_layers": 4, "max_window_layers": 2,
            "use_sliding_window": True, "sliding_window": 1024}
    assert attention_windows(load_hf_config(qwen)) == (None, None, 1024, 1024)
    assert attention_windows(load_hf_config({**qwen, "use_sliding_window": False})) == (None,) * 4
    fl = _flash_flops(qwen, 8192)
    assert fl[0] == fl[1] and fl[2] == fl[3]
    assert fl[0] / fl[2] == pytest.approx(_causal_pairs(8192, None) / _causal_pairs(8192, 1024), rel=1e-3)


def test_qwen_moe_window_is_a_warning():
    """Which layers of a Qwen-MoE model the window covers is not modelled: said, not guessed."""
    qmoe = {**MISTRAL_7B, "model_type": "qwen2_moe", "num_hidden_layers": 2, "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 256, "shared_expert_intermediate_size": 512, "use_sliding_window": True}
    assert any("use_sliding_window" in w for w in _graph(qmoe).meta["warnings"])


#: google/gemma-3-270m config.json (sizes; layer_types: five sliding_attention layers to one full_attention)
GEMMA3_270M = {"model_type": "gemma3_text", "hidden_size": 640, "intermediate_size": 2048, "num_attention_heads": 4,
               "num_hidden_layers": 18, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
               "max_position_embeddings": 32768, "sliding_window": 512, "_sliding_window_pattern": 6,
               "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
               "_name_or_path": "gemma3"}


def test_gemma3_layer_types_decide_the_windows_over_the_pattern():
    """Gemma3TextConfig builds ``layer_types`` from ``sliding_window_pattern`` only when the config gives none; the
    attention reads ``layer_types``. A config listing every layer full_attention gets no window on any layer (the old
    reading kept five local layers in six), and the contradiction with the pattern is a warning."""
    seq = 8192
    allfull = {**GEMMA3_270M, "layer_types": ["full_attention"] * 18}
    assert attention_windows(load_hf_config(allfull)) == (None,) * 18
    fl = _flash_flops(allfull, seq, blocks=6)
    assert len(set(fl)) == 1  # every layer full
    mixed = _flash_flops(GEMMA3_270M, seq, blocks=6)
    assert mixed[5] == fl[0]
    assert mixed[5] / mixed[0] == pytest.approx(_causal_pairs(seq, None) / _causal_pairs(seq, 512), rel=1e-3)
    assert any("layer_types is used" in w for w in _graph(allfull).meta["warnings"])
    assert not _graph(GEMMA3_270M).meta.get("warnings")  # the published file: list and pattern agree


def test_gemma2_layer_types_and_its_default():
    """Gemma2Config alternates when ``layer_types`` is absent (even layers sliding); a given list is used."""
    g2 = {**GEMMA3_270M, "model_type": "gemma2", "num_hidden_layers": 4, "sliding_window": 4096}
    g2.pop("layer_types"), g2.pop("_sliding_window_pattern")
    assert attention_windows(load_hf_config(g2)) == (4096, None, 4096, None)
    types = ["full_attention", "full_attention", "sliding_attention", "full_attention"]
    assert attention_windows(load_hf_config({**g2, "layer_types": types})) == (None, None, 4096, None)
    with pytest.raises(GraphError, match="'layer_types' lists 3 layers, but num_hidden_layers is 4"):
        load_hf_config({**g2, "layer_types": types[:3]})
    with pytest.raises(GraphError, match="'layer_types' must be a list of"):
        load_hf_config({**g2, "layer_types": ["chunked_attention"] * 4})


#: deepseek-ai/DeepSeek-V3 config.json: every field the graph reads
DSV3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
        "n_routed_experts": 256, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "n_group": 8, "topk_group": 4, "vocab_size": 129280, "max_position_embeddings": 163840, "hidden_act": "silu",
        "tie_word_embeddings": False, "_name_or_path": "dsv3"}
DSV3_PARAMS = 671_026_404_352  # DeepSeek-V3's 671B (tech report; the checkpoint's count without the MTP module)


@pytest.mark.parametrize("missing", [("moe_intermediate_size",), ("q_lora_rank", "n_shared_experts",
                                                                  "first_k_dense_replace"),
                                     ("intermediate_size", "n_routed_experts", "num_experts_per_tok")])
def test_deepseek_v3_fields_left_out_take_deepseekv3config_defaults(missing):
    """A deepseek_v3 config without these fields is DeepseekV3Config's defaults (moe_intermediate_size 2048,
    q_lora_rank 1536, n_shared_experts 1, first_k_dense_replace 3, ...): the 671B model transformers builds. The old
    reading made the experts ``intermediate_size`` wide (5,922.7B) or dropped the query LoRA, the shared expert and
    the dense first blocks (708.9B)."""
    cfg = {k: v for k, v in DSV3.items() if k not in missing}
    assert _graph(cfg, blocks=5).param_count == _graph(DSV3, blocks=5).param_count
    assert load_hf_config(cfg).n_experts == 256


def test_deepseek_v3_full_model_parameter_count_without_the_defaulted_fields():
    cfg = {k: v for k, v in DSV3.items() if k not in ("q_lora_rank", "n_shared_experts", "first_k_dense_replace",
                                                       "moe_intermediate_size")}
    assert _graph(cfg).param_count == DSV3_PARAMS


def test_deepseek_explicit_null_q_lora_rank_is_a_full_rank_query():
    """``q_lora_rank: null`` (DeepSeek-V2-Lite) is one q_proj, not the default rank."""
    n = _graph({**DSV3, "q_lora_rank": None}, blocks=1).nodes
    assert n["name"].str.contains("q_proj").any() and not n["name"].str.contains("q_a_proj").any()


@pytest.mark.parametrize("key", ["moe_intermediate_size", "n_shared_experts", "q_lora_rank", "num_experts_per_tok"])
def test_deepseek_v2_refuses_fields_without_an_agreed_default(key):
    """DeepSeek-V2's defaults for these differ between DeepSeek's remote code and transformers: refused, named."""
    v2 = {**DSV3, "model_type": "deepseek_v2", "first_k_dense_replace": 1}
    load_hf_config(v2)
    with pytest.raises(GraphError, match=f"field '{key}' is missing: a deepseek_v2 config must give it"):
        load_hf_config({k: v for k, v in v2.items() if k != key})


def test_llama_attention_and_mlp_biases_are_read_as_llama_reads_them():
    """LlamaAttention gives q/k/v/o ``bias=config.attention_bias``, LlamaMLP gate/up/down ``bias=config.mlp_bias``:
    Llama 3.1 8B with both set has 32 x (4,096 o_proj + 2 x 14,336 gate/up + 4,096 down) = 1,179,648 more parameters
    than with only q/k/v biased (8,031,637,504 against the 8,030,457,856 read before)."""
    llama = {**MISTRAL_7B, "model_type": "llama", "vocab_size": 128256, "max_position_embeddings": 131072}
    llama.pop("sliding_window")
    plain = _graph(llama).param_count
    both = _graph({**llama, "attention_bias": True, "mlp_bias": True}).param_count
    qkv = 32 * (4096 + 2 * 1024)  # q (32 x 128) and k, v (8 x 128) biases
    assert both - plain == qkv + 32 * (4096 + 2 * 14336 + 4096)
    assert plain == 8_030_261_248 and both == 8_031_637_504
    mlp_only = _graph({**llama, "mlp_bias": True}).param_count
    assert mlp_only - plain == 32 * (2 * 14336 + 4096)
    # Qwen2Attention: q/k/v biased, o_proj never; MistralMLP never reads mlp_bias
    qwen = {**llama, "model_type": "qwen2"}
    assert _graph(qwen).param_count - plain == qkv
    assert _graph({**MISTRAL_7B, "mlp_bias": True}).param_count == _graph(MISTRAL_7B).param_count


def test_quantized_checkpoint_is_a_warning_not_silence():
    """gpt-oss-20b's published config carries ``quantization_config`` (MXFP4 experts); wattcast costs the weights at
    --dtype and says so in the prediction's warnings (the CLI prints them; the JSON keeps them)."""
    q = {**MISTRAL_7B, "quantization_config": {"quant_method": "mxfp4",
                                               "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}}
    warnings = _graph(q, blocks=1).meta.get("warnings") or []
    assert any("quant_method 'mxfp4'" in w and "costed at --dtype" in w for w in warnings)
    assert not _graph(MISTRAL_7B, blocks=1).meta.get("warnings")


def test_multimodal_wrapper_builds_its_text_config_and_says_the_vision_tower_is_not_modelled():
    """Gemma3Config (model_type gemma3) keeps the language model in ``text_config`` (a Gemma3TextConfig): built as
    that config is, with a warning; a wrapper without one, or with a text model wattcast does not build, is refused
    naming the fix (was: "unknown model_type 'gemma3'")."""
    wrapped = {"model_type": "gemma3", "text_config": {k: v for k, v in GEMMA3_270M.items() if k != "model_type"},
               "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152}, "_name_or_path": "g3mm"}
    g = _graph(wrapped, blocks=2)
    assert g.param_count == _graph(GEMMA3_270M, blocks=2).param_count
    assert any("vision tower" in w for w in g.meta["warnings"])
    with pytest.raises(GraphError, match="model_type 'mistral3' is a multimodal wrapper .* no text_config"):
        load_hf_config({**MISTRAL_7B, "model_type": "mistral3"})
    with pytest.raises(GraphError, match="its text_config is model_type 'llama4_text', which wattcast does not build"):
        load_hf_config({"model_type": "llama4", "text_config": {**MISTRAL_7B, "model_type": "llama4_text"}})


#: meta-llama/Llama-2-7b-hf config.json without its intermediate_size (11,008)
LLAMA2_7B_NO_FFN = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32,
                    "num_hidden_layers": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
                    "tie_word_embeddings": False, "_name_or_path": "llama-no-ffn"}


@pytest.mark.parametrize("model_type, width", [("llama", 11008), ("mistral", 14336), ("qwen2", 22016)])
def test_missing_mlp_width_takes_the_config_class_default_and_says_so(model_type, width):
    """A config without ``intermediate_size`` was built 4 x hidden wide (16,384: Llama-2-7B at 8.85 B parameters);
    transformers' LlamaConfig / MistralConfig / Qwen2Config default it to 11,008 / 14,336 / 22,016 (transformers
    5.24.0), and the prediction's warnings name the field and the width taken."""
    from wattcast.featurize.hf_config import config_warnings

    cfg = load_hf_config({**LLAMA2_7B_NO_FFN, "model_type": model_type})
    assert cfg.ffn == width
    notes = [w for w in config_warnings(cfg) if "intermediate_size" in w]
    assert len(notes) == 1 and f"{width:,}" in notes[0]
    given = load_hf_config({**LLAMA2_7B_NO_FFN, "intermediate_size": 11008})
    assert not [w for w in config_warnings(given) if "intermediate_size" in w]


def test_llama2_7b_without_its_mlp_width_has_llama2_7bs_parameters():
    import wattcast

    d = wattcast.predict(dict(LLAMA2_7B_NO_FFN), "H100-SXM5-80GB", batch=1, seq=128, mode="inference").to_dict()
    assert d["param_count"] == 6_738_415_616  # Llama-2-7B (its config gives intermediate_size 11008)
    assert any("intermediate_size" in w and "11,008" in w for w in d["warnings"])


def test_every_model_type_has_a_known_mlp_width_and_an_unknown_one_is_refused_naming_the_field():
    from wattcast.featurize.hf_config import FFN_DEFAULTS, MODEL_TYPES, default_ffn_width

    from wattcast.featurize.hf_config import DEEPSEEK_V3_DEFAULTS, GPT_OSS_DEFAULTS

    assert set(MODEL_TYPES) <= set(FFN_DEFAULTS)
    assert FFN_DEFAULTS["deepseek_v3"] == DEEPSEEK_V3_DEFAULTS["intermediate_size"]
    assert FFN_DEFAULTS["gpt_oss"] == GPT_OSS_DEFAULTS["intermediate_size"]
    assert default_ffn_width("gpt2", 768, "x") == 3072  # GPT2MLP: n_inner None is 4 x n_embd
    with pytest.raises(GraphError, match="intermediate_size"):
        default_ffn_width("new_model_type", 4096, "cfg.json")
