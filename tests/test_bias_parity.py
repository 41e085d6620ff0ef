"""Projection biases read as each family's transformers modelling file reads them, and the same on both graph builders
(``--framework hf`` and ``--framework megatron``): parameter counts against transformers' own count of the model, and
the bias FLOPs / bias-gradient kernels of the two paths against each other.

The expected counts are computed here from the config fields with the bias rule of transformers 5.24.0's modelling
files (models/<type>/modeling_<type>.py), written out independently of hf_config._BIAS_SOURCES:

- LlamaAttention: q/k/v/o ``bias=config.attention_bias``; LlamaMLP: gate/up/down ``bias=config.mlp_bias``;
- Qwen2Attention: q/k/v ``bias=True``, o_proj ``bias=False``; Qwen2MLP ``bias=False`` (Qwen2Config has no bias field);
- MistralAttention / MistralMLP, MixtralAttention (MixtralExperts: bias-free 3-D weights, MixtralTopKRouter: a bare
  weight), Phi3Attention / Phi3MLP: ``bias=False`` on every projection, whatever ``attention_bias`` says.

When transformers is importable the same configs are also built on the meta device and their parameters counted."""

from __future__ import annotations

import pytest

from wattcast.featurize.hf_blocks import MEGATRON_VOCAB_MULTIPLE
from wattcast.featurize.hf_config import load_hf_config
from wattcast.featurize.workload import StepOptions, step_graph

#: Qwen/Qwen2-7B config.json (the sizes)
QWEN2_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
            "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 131072,
            "hidden_act": "silu", "tie_word_embeddings": False, "use_sliding_window": False, "_name_or_path": "qwen2_7b"}
#: mistralai/Mistral-7B-v0.1 config.json (the sizes)
MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
              "hidden_act": "silu", "sliding_window": 4096, "tie_word_embeddings": False, "_name_or_path": "mistral_7b"}

#: the bias rule of each modelling file (see the module docstring): (q/k/v, o_proj, MLP) given the raw config
TRANSFORMERS_BIASES = {
    "llama": lambda raw: (raw.get("attention_bias", False), raw.get("attention_bias", False), raw.get("mlp_bias", False)),
    "qwen2": lambda raw: (True, False, False),
    "mistral": lambda raw: (False, False, False),
    "mixtral": lambda raw: (False, False, False),
    "phi3": lambda raw: (False, False, False),
}


def _builtin(name: str, **changes) -> dict:
    return {**load_hf_config(name).raw, "_name_or_path": name, **changes}


def _configs() -> dict[str, dict]:
    """The parity set; ``attention_bias`` set true on Qwen2, Mistral, Mixtral and Phi-3, which transformers ignores."""
    return {
        "llama3_8b+biases": _builtin("llama3_8b", attention_bias=True, mlp_bias=True),
        "llama3_8b": _builtin("llama3_8b"),
        "qwen2_7b": QWEN2_7B,
        "qwen2_7b+attention_bias=false": {**QWEN2_7B, "attention_bias": False},
        "mistral_7b+attention_bias": {**MISTRAL_7B, "attention_bias": True},
        "mixtral_8x7b+attention_bias": _builtin("mixtral_8x7b", attention_bias=True),
        "phi3_mini+attention_bias": _builtin("phi3_mini", attention_bias=True),
    }


def transformers_param_count(raw: dict) -> int:
    """Parameters of ``<Family>ForCausalLM(config)`` from the config fields: embedding, per layer two RMSNorms,
    q/k/v/o (head_dim = hidden / heads when not given) and the MLP (gate/up/down; Mixtral: num_local_experts of them
    plus the router's experts x hidden weight), the final norm, and the LM head unless tied."""
    h, f, L = raw["hidden_size"], raw["intermediate_size"], raw["num_hidden_layers"]
    nh = raw["num_attention_heads"]
    nkv = raw.get("num_key_value_heads", nh)
    d = raw.get("head_dim") or h // nh
    qkv_b, o_b, mlp_b = TRANSFORMERS_BIASES[raw["model_type"]](raw)
    attn = h * (nh + 2 * nkv) * d + nh * d * h + qkv_b * (nh + 2 * nkv) * d + o_b * h
    mlp = 3 * h * f + mlp_b * (2 * f + h)
    if raw["model_type"] == "mixtral":
        n_exp = raw.get("num_local_experts", 8)
        mlp = n_exp * mlp + n_exp * h
    embed = raw["vocab_size"] * h * (1 if raw.get("tie_word_embeddings", False) else 2)
    return embed + L * (attn + mlp + 2 * h) + h


def transformers_bias_elements(raw: dict) -> int:
    """Bias elements of all blocks (what the bias-gradient reductions sum per token)."""
    h, f, L = raw["hidden_size"], raw["intermediate_size"], raw["num_hidden_layers"]
    nh = raw["num_attention_heads"]
    nkv = raw.get("num_key_value_heads", nh)
    d = raw.get("head_dim") or h // nh
    qkv_b, o_b, mlp_b = TRANSFORMERS_BIASES[raw["model_type"]](raw)
    return L * (qkv_b * (nh + 2 * nkv) * d + o_b * h + mlp_b * (2 * f + h))


def _graph(raw: dict, framework: str, mode: str = "inference"):
    return step_graph(raw, StepOptions(batch=1, seq=16, mode=mode, dtype="bf16", framework=framework))


def _frameworks(raw: dict) -> tuple[str, ...]:
    # Phi-3 is built on the Hugging Face path only (workload._MEGATRON_LLAMA_FAMILIES)
    return ("hf",) if raw["model_type"] == "phi3" else ("hf", "megatron")


@pytest.mark.parametrize("name", list(_configs()))
def test_param_count_matches_transformers_on_both_paths(name):
    raw = _configs()[name]
    # Megatron pads the vocabulary to a multiple of 128 x tp (--make-vocab-size-divisible-by): none of these need it,
    # so its count is transformers' too
    assert raw["vocab_size"] % MEGATRON_VOCAB_MULTIPLE == 0 or _frameworks(raw) == ("hf",)
    want = transformers_param_count(raw)
    for fw in _frameworks(raw):
        assert _graph(raw, fw).param_count == want, fw


@pytest.mark.parametrize("name", [n for n, raw in _configs().items() if "megatron" in _frameworks(raw)])
def test_bias_kernels_and_linear_flops_agree_between_paths(name):
    """The bias-gradient reductions cover the same bias elements on both paths (transformers' count), and the blocks'
    forward projection FLOPs (GEMM plus bias add) are equal: q/k/v as three linears or one ``linear_qkv``, gate/up as
    two or one ``linear_fc1``."""
    raw = _configs()[name]
    tokens = 16
    per_fw = {}
    for fw in ("hf", "megatron"):
        n = _graph(raw, fw, mode="train").nodes
        blocks = n[(n["layer"] >= 0) & (n["layer"] < raw["num_hidden_layers"])]
        bgrad = blocks[blocks["name"].str.endswith(".bgrad")]
        proj = blocks[(blocks["op_class"] == "linear") & (blocks["phase"] == "forward")
                      & ~blocks["name"].str.contains("gate$|router$", regex=True)]
        per_fw[fw] = (bgrad["flops"].sum() / tokens, proj["flops"].sum())
    assert per_fw["hf"][0] == per_fw["megatron"][0] == transformers_bias_elements(raw)
    assert per_fw["hf"][1] == pytest.approx(per_fw["megatron"][1], rel=1e-12)


def test_published_counts():
    """The formula against the published checkpoints' parameter counts (their safetensors index totals / model
    cards): Llama 3 8B 8,030,261,248; Qwen2-7B 7,615,616,512; Mistral-7B-v0.1 7,241,732,096; Mixtral-8x7B
    46,702,792,704; Phi-3-mini 3,821,079,552."""
    cfg = _configs()
    assert transformers_param_count(cfg["llama3_8b"]) == 8_030_261_248
    assert transformers_param_count(cfg["qwen2_7b"]) == 7_615_616_512
    assert transformers_param_count(MISTRAL_7B) == 7_241_732_096
    assert transformers_param_count(_builtin("mixtral_8x7b")) == 46_702_792_704
    assert transformers_param_count(_builtin("phi3_mini")) == 3_821_079_552


def test_ignored_bias_field_is_a_warning():
    """attention_bias on a Mistral config: not read by MistralAttention, so not costed, and said in the warnings."""
    warned = _graph({**MISTRAL_7B, "attention_bias": True}, "hf").meta.get("warnings") or []
    assert any("attention_bias set true" in w and "mistral" in w for w in warned)
    assert not (_graph(MISTRAL_7B, "hf").meta.get("warnings") or [])
    assert not (_graph(_builtin("llama3_8b", attention_bias=True), "hf").meta.get("warnings") or [])


def test_qwen2_moe_reads_qkv_bias():
    """Qwen2MoeAttention: q/k/v ``bias=config.qkv_bias`` (default True), not attention_bias; same on both paths."""
    raw = _builtin("qwen1.5_moe_a2.7b")
    cfg = load_hf_config(raw)
    qkv = cfg.n_layers * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    for fw in ("hf", "megatron"):
        base = _graph(raw, fw).param_count
        assert _graph({**raw, "attention_bias": False}, fw).param_count == base
        assert base - _graph({**raw, "qkv_bias": False}, fw).param_count == qkv


def test_meta_device_transformers_count():
    """The same counts from transformers' own modules on the meta device (when transformers is installed)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    for name, raw in _configs().items():
        fields = {k: v for k, v in raw.items() if not k.startswith("_") and k != "model_type"}
        config = transformers.AutoConfig.for_model(raw["model_type"], **fields)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        assert sum(p.numel() for p in model.parameters()) == transformers_param_count(raw), name


def test_qwen3_attention_bias_on_both_paths():
    """Qwen3Attention: q/k/v/o ``bias=config.attention_bias``; the megatron graph ignored it (8,190,735,360 against
    the hf path's 8,191,104,000 for Qwen3-8B with it set)."""
    raw = _builtin("qwen3_8b")
    cfg = load_hf_config(raw)
    added = cfg.n_layers * ((cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim + cfg.hidden)
    for fw in ("hf", "megatron"):
        assert _graph({**raw, "attention_bias": True}, fw).param_count - _graph(raw, fw).param_count == added, fw
