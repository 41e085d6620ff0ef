"""Hugging Face configs read as transformers' config classes build them: T5's gated feed-forward (T5 v1.1, Flan-T5),
the per-model_type defaults of fields a config leaves out (Gemma's head size, the key/value heads), and multimodal
wrappers whose ``text_config`` leaves fields to the text model's config class (Gemma 3 4B/12B/27B, LLaVA-1.5). Each
count is checked against the published (or a by-hand) parameter count."""

from __future__ import annotations

import pytest

from wattcast.featurize.hf_config import load_hf_config
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph


def _graph(model, **kw):
    return step_graph(model, StepOptions(**{"batch": 1, "seq": 16, "mode": "inference", "dtype": "bf16", **kw}))


#: google/flan-t5-base config.json (the fields the model reads)
FLAN_T5_BASE = {"model_type": "t5", "d_ff": 2048, "d_kv": 64, "d_model": 768, "dense_act_fn": "gelu_new",
                "dropout_rate": 0.1, "feed_forward_proj": "gated-gelu", "is_encoder_decoder": True,
                "is_gated_act": True, "layer_norm_epsilon": 1e-6, "n_positions": 512, "num_decoder_layers": 12,
                "num_heads": 12, "num_layers": 12, "relative_attention_max_distance": 128,
                "relative_attention_num_buckets": 32, "tie_word_embeddings": False, "vocab_size": 32128,
                "_name_or_path": "flan-t5-base"}
#: google-t5/t5-small config.json (feed_forward_proj absent: T5Config's "relu", ungated)
T5_SMALL = {"model_type": "t5", "d_ff": 2048, "d_kv": 64, "d_model": 512, "num_heads": 8, "num_layers": 6,
            "n_positions": 512, "relative_attention_num_buckets": 32, "vocab_size": 32128, "_name_or_path": "t5-small"}


def test_flan_t5_gated_feed_forward_has_two_input_projections_and_the_published_parameter_count():
    """T5LayerFF builds T5DenseGatedActDense when ``is_gated_act`` (``feed_forward_proj`` "gated-gelu"): wi_0, wi_1
    and wo, 3 x 768 x 2,048 per block. flan-t5-base has 247,577,856 parameters (2 x 24,674,304 embedding and head +
    12 x 7,079,424 encoder + 12 x 9,439,488 decoder blocks + norms and position buckets); the one-projection graph
    had 209,829,120, 24 x 768 x 2,048 short."""
    g = _graph(FLAN_T5_BASE)
    assert g.param_count == 247_577_856
    names = g.nodes["name"]
    assert names.str.endswith("DenseReluDense.wi_0").sum() == 24 and names.str.endswith("DenseReluDense.wi_1").sum() == 24
    assert not names.str.endswith("DenseReluDense.wi").any()
    # the gate's FLOPs: each block's input GEMMs are two d_model x d_ff products over the tokens
    n = g.nodes[(g.nodes["phase"] == "forward") & names.str.contains(r"DenseReluDense\.wi_[01]$")]
    assert n["flops"].sum() == pytest.approx(24 * 2 * 2 * 16 * 768 * 2048)
    # t5-small (relu, ungated): one wi per block, its published 60,506,624 unchanged
    small = _graph(T5_SMALL)
    assert small.param_count == 60_506_624
    assert small.nodes["name"].str.endswith("DenseReluDense.wi").sum() == 12


def test_t5_gate_follows_feed_forward_proj_and_the_saved_is_gated_act():
    """T5Config: ``is_gated_act = feed_forward_proj.split('-')[0] == "gated"`` and "gated-gelu" runs gelu_new; a saved
    ``is_gated_act`` / ``dense_act_fn`` is set over the derived ones (PreTrainedConfig sets leftover keys)."""
    base = {k: v for k, v in FLAN_T5_BASE.items() if k not in ("dense_act_fn", "is_gated_act")}
    assert _graph(base).param_count == 247_577_856
    assert load_hf_config(base).activation == "gelu_new"
    silu = load_hf_config({**base, "feed_forward_proj": "gated-silu"})
    assert silu.activation == "silu" and _graph(silu.raw).param_count == 247_577_856
    assert _graph({**FLAN_T5_BASE, "is_gated_act": False}).param_count == 247_577_856 - 24 * 768 * 2048
    with pytest.raises(GraphError, match="field 'feed_forward_proj' is 'gelu-gated'"):
        load_hf_config({**base, "feed_forward_proj": "gelu-gated"})
    with pytest.raises(GraphError, match="field 'feed_forward_proj' is 'gated-frobnicate'"):
        load_hf_config({**base, "feed_forward_proj": "gated-frobnicate"})


#: google/gemma-3-12b's text_config (hidden 3840, 16 heads, 8 KV heads, 48 layers; no head_dim) with its vocabulary
GEMMA3_12B_TEXT = {"model_type": "gemma3_text", "hidden_size": 3840, "intermediate_size": 15360,
                   "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8,
                   "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
                   "vocab_size": 262208, "_name_or_path": "gemma3-12b-text"}
#: Gemma 3 12B's language model by hand, head_dim 256: embedding 262,208 x 3,840 (tied) + 48 x (q 3,840 x 4,096,
#: k and v 3,840 x 2,048 each, o 4,096 x 3,840, gate/up/down 3 x 3,840 x 15,360, four 3,840 norms, q/k norms 2 x 256)
#: + the final norm
GEMMA3_12B_TEXT_PARAMS = 262208 * 3840 + 48 * (2 * 3840 * 4096 + 2 * 3840 * 2048 + 3 * 3840 * 15360 + 4 * 3840
                                               + 2 * 256) + 3840
#: mistralai/Mistral-7B-v0.1 (the sizes)
MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
              "tie_word_embeddings": False, "_name_or_path": "mistral"}


def _notes(cfg: dict) -> list[str]:
    from wattcast.featurize.hf_config import config_warnings

    return config_warnings(load_hf_config(cfg))


def test_gemma_without_head_dim_takes_the_config_class_default_256_not_hidden_over_heads():
    """GemmaConfig, Gemma2Config and Gemma3TextConfig default head_dim to 256 (transformers 5.24.0); Gemma 3 12B's
    text_config gives none: q_proj is 3,840 -> 4,096 and the model 11,766,034,176 parameters. hidden / heads (240)
    made it 11,624,474,880, silently."""
    assert GEMMA3_12B_TEXT_PARAMS == 11_766_034_176
    cfg = load_hf_config(GEMMA3_12B_TEXT)
    assert cfg.head_dim == 256
    assert _graph(GEMMA3_12B_TEXT).param_count == GEMMA3_12B_TEXT_PARAMS
    notes = [w for w in _notes(GEMMA3_12B_TEXT) if "head_dim" in w]
    assert len(notes) == 1 and "head_dim 256" in notes[0] and "Gemma3TextConfig" in notes[0]
    # given, it is read and no note is made
    assert not [w for w in _notes({**GEMMA3_12B_TEXT, "head_dim": 256}) if "head_dim" in w]
    for mt in ("gemma", "gemma2"):
        assert load_hf_config({**GEMMA3_12B_TEXT, "model_type": mt}).head_dim == 256


@pytest.mark.parametrize("model_type, kv, cls", [("gemma2", 4, "Gemma2Config"), ("gemma3_text", 4, "Gemma3TextConfig"),
                                                 ("mistral", 8, "MistralConfig"), ("mixtral", 8, "MixtralConfig"),
                                                 ("qwen3_moe", 4, "Qwen3MoeConfig")])
def test_missing_key_value_heads_take_the_config_class_default(model_type, kv, cls):
    """Gemma2Config / Gemma3TextConfig default num_key_value_heads to 4, MistralConfig and MixtralConfig to 8,
    Qwen3MoeConfig to 4: a config without the field is grouped-query attention, not one key/value head per query
    head. Mistral 7B without it has its 7,241,732,096 parameters (it was 8,047,038,464, multi-head)."""
    cfg = {**MISTRAL_7B, "model_type": model_type, **({"moe_intermediate_size": 768} if model_type == "qwen3_moe" else {})}
    del cfg["num_key_value_heads"]
    assert load_hf_config(cfg).n_kv_heads == kv
    notes = [w for w in _notes(cfg) if "num_key_value_heads" in w]
    assert len(notes) == 1 and f"num_key_value_heads {kv}" in notes[0] and cls in notes[0]
    if model_type == "mistral":
        assert _graph(cfg).param_count == _graph(MISTRAL_7B).param_count == 7_241_732_096


def test_classes_that_derive_the_field_as_the_generic_rule_stay_silent_and_a_qwen2_default_is_named():
    """LlamaConfig and Phi3Config set a missing num_key_value_heads to the query heads, and derive head_dim as hidden
    / heads: nothing filled, no note. Qwen2Config's default is 32 key/value heads: a 16-head config without the
    field is refused, saying the 32 is the class's default (transformers would build 32 and fail to group them)."""
    llama = {**MISTRAL_7B, "model_type": "llama"}
    del llama["num_key_value_heads"]
    cfg = load_hf_config(llama)
    assert cfg.n_kv_heads == 32 and cfg.head_dim == 128 and not cfg.defaulted and not _notes(llama)
    with pytest.raises(GraphError, match=r"16 attention heads .* not divisible by 32 key/value heads "
                                         r"\(num_key_value_heads absent: Qwen2Config's default\)"):
        load_hf_config({**llama, "model_type": "qwen2", "num_attention_heads": 16})
    # Qwen3Config's head_dim default is 128, not hidden / heads (64 here)
    assert load_hf_config({**llama, "model_type": "qwen3", "num_attention_heads": 64}).head_dim == 128


def test_t5_without_d_kv_takes_t5configs_64():
    """T5Config's d_kv is 64 whatever d_model / num_heads (mT5-small: d_model 512, 6 heads of 64): the attention is
    6 x 64 = 384 wide; hidden / heads does not even divide (it was refused)."""
    mt5_small = {k: v for k, v in T5_SMALL.items() if k != "d_kv"} | {"num_heads": 6}
    cfg = load_hf_config(mt5_small)
    assert cfg.head_dim == 64
    assert any("d_kv 64" in w and "T5Config" in w for w in _notes(mt5_small))
    assert _graph(mt5_small).param_count == _graph({**mt5_small, "d_kv": 64}).param_count


def test_every_model_type_has_a_head_rule_and_a_type_without_one_takes_the_generic_rule_with_a_warning(monkeypatch):
    """Each model_type wattcast builds has its config class's rule for the head size and the key/value heads
    (CONFIG_CLASS_DEFAULTS; gpt-oss's agrees with GptOssConfig's table); a type without one falls back to hidden /
    heads and one key/value head per query head, and the warnings name each field."""
    from wattcast.featurize import hf_config as hc

    for mt, family in hc.MODEL_TYPES.items():
        assert hc.class_default(mt, "n_kv_heads") is not None, mt
        if family not in hc.EVEN_HEAD_FAMILIES and family != "deepseek":
            assert hc.class_default(mt, "head_dim") is not None, mt
    assert hc.class_default("gpt_oss", "head_dim")[2] == hc.GPT_OSS_DEFAULTS["head_dim"]
    assert hc.class_default("gemma3_text", "head_dim") == ("head_dim", "Gemma3TextConfig", 256)
    monkeypatch.delitem(hc.CONFIG_CLASS_DEFAULTS, "gemma3_text")
    cfg = {**GEMMA3_12B_TEXT}
    del cfg["num_key_value_heads"]
    loaded = load_hf_config(cfg)
    assert loaded.head_dim == 240 and loaded.n_kv_heads == 16
    notes = _notes(cfg)
    assert any("no field 'head_dim'" in w and "240" in w and "generic rule" in w for w in notes)
    assert any("no field 'num_key_value_heads'" in w and "16" in w and "generic rule" in w for w in notes)


#: google/gemma-3-4b-it's config.json: the text_config gives no heads, key/value heads, head_dim nor vocabulary
GEMMA3_4B_MM = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "mm_tokens_per_image": 256,
                "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                                "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                                "sliding_window": 1024},
                "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                                  "model_type": "siglip_vision_model", "num_attention_heads": 16,
                                  "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False},
                "torch_dtype": "bfloat16", "_name_or_path": "gemma-3-4b-it"}
#: google/gemma-3-12b-it's: heads and key/value heads given, no head_dim nor vocabulary
GEMMA3_12B_MM = {"model_type": "gemma3", "text_config": {k: v for k, v in GEMMA3_12B_TEXT.items()
                                                         if k not in ("vocab_size", "_name_or_path")},
                 "vision_config": {"model_type": "siglip_vision_model"}, "_name_or_path": "gemma-3-12b-it"}
#: llava-hf/llava-1.5-7b-hf's config.json: the text_config (Vicuna-7B v1.5, a Llama 2 7B) gives only its vocabulary
#: and positions
LLAVA15_7B = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "image_token_index": 32000,
              "projector_hidden_act": "gelu", "tie_word_embeddings": False,
              "text_config": {"_name_or_path": "lmsys/vicuna-7b-v1.5", "architectures": ["LlamaForCausalLM"],
                              "max_position_embeddings": 4096, "model_type": "llama", "rms_norm_eps": 1e-05,
                              "torch_dtype": "float16", "vocab_size": 32064},
              "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                                "model_type": "clip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 24,
                                "patch_size": 14, "projection_dim": 768, "vocab_size": 32000},
              "vocab_size": 32064, "_name_or_path": "llava-1.5-7b"}
#: Gemma 3 4B's language model by hand (Gemma3TextConfig's 8 heads, 4 key/value heads of 256, vocabulary 262,208):
#: embedding + 34 x (q and o 2,560 x 2,048, k and v 2,560 x 1,024, gate/up/down 3 x 2,560 x 10,240, four 2,560 norms,
#: q/k norms 2 x 256) + the final norm: 3.88 B, Google's text share of the 4.3 B model
GEMMA3_4B_TEXT_PARAMS = 262208 * 2560 + 34 * (2 * 2560 * 2048 + 2 * 2560 * 1024 + 3 * 2560 * 10240 + 4 * 2560
                                              + 2 * 256) + 2560
#: Llama-2-7B (6,738,415,616 with 32,000 tokens) with LLaVA's 32,064: 64 more rows in the embedding and the untied head
LLAVA15_7B_TEXT_PARAMS = 6_738_415_616 + 2 * 64 * 4096


@pytest.mark.parametrize("config, params", [(GEMMA3_4B_MM, GEMMA3_4B_TEXT_PARAMS),
                                            (GEMMA3_12B_MM, GEMMA3_12B_TEXT_PARAMS),
                                            (LLAVA15_7B, LLAVA15_7B_TEXT_PARAMS)])
def test_published_multimodal_configs_fill_their_text_config_from_the_text_model_config_class(config, params):
    """Gemma3Config builds its text_config as a Gemma3TextConfig and LlavaConfig as the AutoConfig of its model_type
    (LlamaConfig): the fields the published files leave out are those classes' defaults. They were refused ("missing
    n_heads", "missing vocab", "missing hidden"); now built, the language model's parameters as counted by hand,
    with a warning naming every field filled and the vision tower's warning kept."""
    assert GEMMA3_4B_TEXT_PARAMS == 3_880_263_168 and LLAVA15_7B_TEXT_PARAMS == 6_738_939_904
    g = _graph(config)
    assert g.param_count == params
    warnings = g.meta["warnings"]
    assert any("vision tower" in w for w in warnings)
    cls = "LlamaConfig" if config is LLAVA15_7B else "Gemma3TextConfig"
    filled = [w for w in warnings if "not in the text_config" in w]
    assert len(filled) == 1 and cls in filled[0]
    if config is GEMMA3_4B_MM:
        for f in ("vocab_size 262,208", "num_attention_heads 8", "num_key_value_heads 4", "head_dim 256"):
            assert f in filled[0]
    if config is LLAVA15_7B:
        for f in ("hidden_size 4,096", "num_hidden_layers 32", "num_attention_heads 32", "intermediate_size 11,008"):
            assert f in filled[0]
        assert "vocab_size" not in filled[0]  # given: kept (32,064)


def test_text_config_fields_given_are_kept_and_llava_defaults_to_a_llama_text_model():
    """A field the text_config gives is read as given (not the class's default); LlavaConfig's text_config without a
    model_type is a LlamaConfig; a full text_config fills nothing."""
    cfg = load_hf_config({**GEMMA3_4B_MM, "text_config": {**GEMMA3_4B_MM["text_config"], "num_attention_heads": 16,
                                                         "num_key_value_heads": 8}})
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab) == (16, 8, 256, 262208)
    untyped = {**LLAVA15_7B, "text_config": {k: v for k, v in LLAVA15_7B["text_config"].items() if k != "model_type"}}
    assert load_hf_config(untyped).model_type == "llama" and _graph(untyped).param_count == LLAVA15_7B_TEXT_PARAMS
    full = {**LLAVA15_7B, "text_config": {**LLAVA15_7B["text_config"], "hidden_size": 4096, "intermediate_size": 11008,
                                          "num_hidden_layers": 32, "num_attention_heads": 32}}
    assert not load_hf_config(full).defaulted
