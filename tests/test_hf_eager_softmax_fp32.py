"""Hugging Face eager attention's fp32 softmax (transformers 5.24.0 ``eager_attention_forward``:
``nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)`` in Llama and its relatives,
GPT-NeoX, DeepSeek; BLOOM's ``F.softmax(..., dtype=torch.float32).to(query_layer.dtype)``; OPT as transformers 4.36.2
ran it, in fp16 only): in bf16 a cast to fp32, the fp32 softmax and a cast back, forward and backward (aten
``softmax(input, dim, dtype)`` -> ``_to_copy`` + ``_softmax``); in CUDA fp16 one softmax kernel reading fp16 and writing
fp32 (``half_to_float``) and the cast back. Until this change the graph had one softmax kernel in the model's dtype.
fp32 models, GPT-2, BERT, Falcon (rotary), gpt-oss and llm-foundry's MPT (no upcast in their source) keep the one
kernel."""

from __future__ import annotations

import pytest

from wattcast.featurize.workload import step_graph
from wattcast.simulate.memory import kept_tensors

S = 1024
HEADS = 32  # Llama 3 8B's query heads
N = HEADS * S * S  # scores of one layer at batch 1


def _attn(nodes, phase):
    a = nodes[(nodes["layer"] == 0) & (nodes["phase"] == phase) & nodes["name"].str.startswith("attn.")]
    return a.set_index("name")


@pytest.fixture(scope="module")
def bf16_train():
    return step_graph("llama3_8b", mode="train", batch=1, seq=S, dtype="bf16", attention="eager")


def test_bf16_forward_is_cast_fp32_softmax_cast(bf16_train):
    f = _attn(bf16_train.nodes, "forward")
    assert list(f.index) == ["attn.qk", "attn.scale", "attn.mask", "attn.softmax.to_fp32", "attn.softmax",
                             "attn.softmax.to_dtype", "attn.pv"]
    assert list(f.loc[["attn.softmax.to_fp32", "attn.softmax", "attn.softmax.to_dtype"], "kernel"]) == \
        ["copy", "softmax", "copy"]
    assert set(f.loc[["attn.softmax.to_fp32", "attn.softmax", "attn.softmax.to_dtype"], "dtype"]) == {"fp32"}
    # bf16 -> fp32 cast: read 2 B, write 4 B; the softmax reads and writes fp32; the cast back 4 + 2 B
    assert f.loc["attn.softmax.to_fp32", "bytes"] == 6 * N and f.loc["attn.softmax.to_fp32", "scale"] == pytest.approx(0.75)
    assert f.loc["attn.softmax", "bytes"] == 8 * N and f.loc["attn.softmax", "scale"] == 1.0
    assert f.loc["attn.softmax.to_dtype", "bytes"] == 6 * N
    # the GEMMs around it stay bf16
    assert f.loc["attn.qk", "dtype"] == f.loc["attn.pv", "dtype"] == "bf16"


def test_bf16_backward_casts_the_gradient_both_ways(bf16_train):
    b = _attn(bf16_train.nodes, "backward")
    names = list(b.index)
    i = names.index("attn.softmax.to_dtype.grad")
    assert names[i:i + 3] == ["attn.softmax.to_dtype.grad", "attn.softmax.grad", "attn.softmax.to_fp32.grad"]
    assert set(b.loc[names[i:i + 3], "dtype"]) == {"fp32"}
    assert b.loc["attn.softmax.grad", "bytes"] == 12 * N  # fp32 gradient and output in, fp32 gradient out
    assert b.loc["attn.softmax.to_dtype.grad", "bytes"] == b.loc["attn.softmax.to_fp32.grad", "bytes"] == 6 * N


def test_bf16_keeps_the_fp32_probabilities_and_the_bf16_copy(bf16_train):
    """``_softmax`` saves its fp32 result for backward and the PV matmul its bf16 input: both held."""
    tb = bf16_train.saved["tensor_bytes"]
    sizes = sorted(int(tb[t]) for t, lay in kept_tensors(bf16_train).items() if lay == 0)
    assert 4 * N in sizes and 2 * N in sizes


def test_fp16_is_one_half_to_float_softmax_and_a_cast():
    n = step_graph("llama3_8b", mode="train", batch=1, seq=S, dtype="fp16", attention="eager").nodes
    f = _attn(n, "forward")
    assert "attn.softmax.to_fp32" not in f.index
    assert list(f.index[f.index.str.startswith("attn.softmax")]) == ["attn.softmax", "attn.softmax.to_dtype"]
    sm = f.loc["attn.softmax"]
    assert (sm["dtype"], sm["bytes"], sm["scale"]) == ("fp32", 6 * N, pytest.approx(0.75))
    assert f.loc["attn.softmax.to_dtype", "bytes"] == 6 * N
    g = _attn(n, "backward").loc["attn.softmax.grad"]
    # _softmax_backward_data(grad32, out32, dim, input_dtype=Half): 4 + 4 B read, 2 B written
    assert g["dtype"] == "fp32" and g["bytes"] == 10 * N and g["scale"] == pytest.approx(2.1 * 10 / 12)


def test_fp32_model_has_one_softmax_kernel():
    f = _attn(step_graph("llama3_8b", mode="train", batch=1, seq=S, dtype="fp32", attention="eager").nodes, "forward")
    assert list(f.index) == ["attn.qk", "attn.scale", "attn.mask", "attn.softmax", "attn.pv"]
    assert f.loc["attn.softmax", "bytes"] == 8 * N


def test_decode_step_casts_too():
    n = step_graph("llama3_8b", mode="inference", batch=4, seq=1, dtype="bf16", attention="eager",
                   kv_context=2048).nodes
    f = _attn(n, "forward")
    assert {"attn.softmax.to_fp32", "attn.softmax.to_dtype"} <= set(f.index)
    assert f.loc["attn.softmax", "H"] == 2049  # over the cached keys and the new one


@pytest.mark.parametrize("model,upcast", [
    ("gpt2", False), ("bert_base", False), ("falcon_7b", False), ("mpt_7b", False), ("gpt_oss_20b", False),
    ("bloom_560m", True), ("opt_1.3b", False), ("pythia_160m", True), ("qwen3_8b", True), ("mixtral_8x7b", True),
    ("gemma2_9b", True), ("phi3_mini", True), ("deepseek_v3", True),
])
def test_which_families_upcast(model, upcast):
    n = step_graph(model, mode="inference", batch=1, seq=16, dtype="bf16", attention="eager", blocks=1).nodes
    names = set(n.loc[n["layer"] == 0, "name"])
    assert ("attn.softmax.to_fp32" in names) is upcast
    assert ("attn.softmax.to_dtype" in names) is upcast
    sm = n[(n["layer"] == 0) & (n["name"] == "attn.softmax")]
    assert len(sm) == 1 and sm["dtype"].iloc[0] == ("fp32" if upcast else "bf16")


def test_megatron_attention_keeps_its_one_softmax():
    """Megatron-Core's unfused core attention (FusedScaleMaskSoftmax) is not transformers': DeepSeek under
    --framework megatron and Llama's Megatron graph keep one softmax kernel in the model's dtype."""
    for model in ("deepseek_v3", "llama3_8b"):
        n = step_graph(model, mode="train", batch=1, seq=16, dtype="bf16", attention="eager", blocks=1,
                       framework="megatron").nodes
        names = set(n["name"])
        assert not any(s.startswith("attn.softmax.to_") or ".softmax.to_" in s for s in names)


def test_opt_upcasts_fp16_only_after_its_clamp():
    """transformers 4.36.2 modeling_opt.py l. 232-242 (the OPT NeuSight's labels ran): mask, ``torch.max(w, finfo.min)``,
    then ``softmax(dtype=torch.float32).to(torch.float16)`` in fp16 alone; bf16 and fp32 keep one softmax kernel."""
    def names(dtype):
        n = step_graph("opt_1.3b", mode="train", batch=1, seq=64, dtype=dtype, attention="eager", blocks=1).nodes
        f = n[(n["layer"] == 0) & (n["phase"] == "forward") & n["name"].str.startswith("attn.")]
        return list(f["name"]), f.set_index("name")
    fp16, f16 = names("fp16")
    assert fp16[fp16.index("attn.mask"):fp16.index("attn.pv")] == ["attn.mask", "attn.clamp", "attn.softmax",
                                                                   "attn.softmax.to_dtype"]
    assert f16.loc["attn.softmax", "dtype"] == "fp32"
    for dtype in ("bf16", "fp32"):
        got, f = names(dtype)
        assert got[got.index("attn.mask"):got.index("attn.pv")] == ["attn.mask", "attn.clamp", "attn.softmax"]
        assert f.loc["attn.softmax", "dtype"] == dtype
