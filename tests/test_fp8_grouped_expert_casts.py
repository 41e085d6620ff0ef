"""--dtype fp8 with Megatron-Core's grouped experts: Transformer Engine's GroupedLinear casts all local experts' GEMM
inputs in one multi-tensor kernel per direction (TE 2.20 grouped_linear.py: ``tex.split_quantize`` /
``tex.group_quantize`` over the input's splits forward, the output gradient's backward), not one per expert."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.featurize.hf_config import load_hf_config as builtin_config
from wattcast.featurize.workload import StepOptions, step_graph

MOE = "qwen3_30b_a3b"  # 128 experts of moe_intermediate_size, top-8


def _graph(model: str, dtype: str = "fp8", **kw):
    opts = dict(batch=1, seq=1024, mode="train", dtype=dtype, attention="flash", blocks=3, framework="megatron")
    return step_graph(model, StepOptions(**dict(opts, **kw))).nodes


def _expert_casts(n, layer: int):
    return n[(n["layer"] == layer) & (n["op_class"] == "fp8_cast") & n["name"].str.contains("experts")
             & (n["phase"] != "optimizer")]


@pytest.mark.parametrize("ep", [1, 4])
def test_grouped_experts_cast_once_per_linear_and_direction_with_all_bytes(ep):
    cfg = builtin_config(MOE)
    n = _graph(MOE, ep=ep)
    lay = int(n.loc[n["name"].str.contains("experts"), "layer"].iloc[0])
    c = _expert_casts(n, lay)
    # FC1 and FC2: one input cast forward and one output-gradient cast backward each, whatever the local experts
    # (128 / ep); the old graph had one per expert: 2 x 128 / ep per direction
    assert (c["phase"] == "forward").sum() == 2
    assert (c["phase"] == "backward").sum() == 2
    # the bytes of every local expert: this rank's t x top-k routed rows, read at 2 B, written as FP8 with its
    # transpose (2 x 1 B): FC1's input (hidden) and FC2's (ffn) forward, their output gradients (2 ffn, hidden) backward
    rows = 1024 * cfg.experts_per_token
    h, ffn = cfg.hidden, cfg.count("moe_intermediate_size")
    fwd = c.loc[c["phase"] == "forward", "bytes"].sum()
    bwd = c.loc[c["phase"] == "backward", "bytes"].sum()
    assert fwd == pytest.approx(rows * (h + ffn) * 4.0, rel=1e-9)
    assert bwd == pytest.approx(rows * (2 * ffn + h) * 4.0, rel=1e-9)
    # every expert's GEMMs still run in FP8 and keep their FP8 input for backward
    gemms = n[(n["layer"] == lay) & (n["op_class"] == "linear") & n["name"].str.contains("experts")
              & (n["phase"] == "forward")]
    assert len(gemms) == 2 * cfg.n_experts // ep and (gemms["dtype"] == "fp8").all()


def test_sequential_hf_experts_keep_one_cast_per_expert_linear():
    cfg = builtin_config(MOE)
    n = _graph(MOE, framework="hf")
    lay = int(n.loc[n["name"].str.contains("experts"), "layer"].iloc[0])
    c = _expert_casts(n, lay)
    # Hugging Face's experts are a Python loop of nn.Linear: gate, up and down projections, each its own cast
    assert (c["phase"] == "forward").sum() == 3 * cfg.n_experts
    assert (c["phase"] == "backward").sum() == 3 * cfg.n_experts


def test_fp8_moe_cast_kernels_per_micro_batch_at_scale():
    kw = dict(gpus=16, batch=64, seq=4096, tp=1, pp=1, ep=1, zero=1, micro_batch=1, framework="megatron",
              attention="flash")
    f8 = wattcast.predict_cluster(MOE, "DGX-H100", dtype="fp8", **kw)
    layers = builtin_config(MOE).n_layers
    cast = [o for o in f8.per_op if o["op_class"] == "fp8_cast"]
    # per layer and micro-batch: QKV and projection (2 each), grouped FC1 and FC2 (2 each); plus, once a step, one
    # weight cast per module weight: QKV, projection and each expert's FC1 and FC2 (TE GroupedLinear's default keeps
    # one parameter per expert and quantizes each, grouped_linear.py l. 841-855; until stop 58 one cast per layer);
    # the old graph: 4 + 4 x 128 + 1 a layer (24,816). per_op is the step's: 4 micro-batches (64 / 16)
    n_micro = f8.meta["n_micro"]
    experts = builtin_config(MOE).n_experts
    assert n_micro == 4 and cast[0]["count"] == layers * ((4 + 4) * n_micro + 2 + 2 * experts)


def test_dense_fp8_graphs_keep_one_cast_per_linear():
    for model, kw in (("llama3_8b", dict(tp=2, sp=True)), ("llama3_8b", dict(framework="hf"))):
        n = _graph(model, **kw)
        casts = n[n["op_class"] == "fp8_cast"]
        fwd_fp8 = ((n["phase"] == "forward") & (n["dtype"] == "fp8")).sum()
        assert (casts["phase"] == "forward").sum() == fwd_fp8
        assert (casts["phase"] == "backward").sum() == fwd_fp8
        # each cast moves its own GEMM input's bytes: elements x (2 B read + 2 x 1 B written)
        lin = n[(n["phase"] == "forward") & (n["dtype"] == "fp8")].set_index("name")
        fc = casts[casts["phase"] == "forward"]
        for name, b in zip(fc["name"], fc["bytes"]):
            r = lin.loc[name.removesuffix(".fp8_cast")]
            elems = r["M"] * r["N"] / (kw.get("tp", 1) if kw.get("sp") and name.endswith(("qkv.fp8_cast", "fc1.fp8_cast")) else 1)
            assert b == pytest.approx(elems * 4.0)


def test_fp8_cast_gemms_checked():
    from wattcast.featurize.op_graph import GraphBuilder, GraphError
    b = GraphBuilder("bf16", train=True, gemm_dtype="fp8")
    x = b.input((8, 16))
    with pytest.raises(GraphError, match="fp8_cast_gemms"):
        b.linear(x, 32, fp8_cast_gemms=-1)
    with pytest.raises(GraphError, match="fp8_cast_gemms"):
        b.linear(x, 32, fp8_cast_gemms=1.5)
