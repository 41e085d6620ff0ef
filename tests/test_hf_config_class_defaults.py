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
