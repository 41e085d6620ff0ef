"""Megatron-Core's multi-token prediction (--mtp-num-layers; DeepSeek-V3 tech report Sec. 2.2) on the last pipeline
stage, and DeepSeek's latent attention under sequence parallelism (it did not build: the latents are gathered to the
whole sequence, the attention ran on the shard's length)."""

from __future__ import annotations

import json

import pytest

import wattcast
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.parallel import ParallelConfigError

# a small DeepSeek-V3-shaped model: latent attention, 1 dense block then MoE blocks with a shared expert
H, VOCAB, HEADS = 1024, 32000, 16
DSV3 = {"model_type": "deepseek_v3", "hidden_size": H, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
        "num_hidden_layers": 4, "intermediate_size": 2816, "moe_intermediate_size": 352, "n_routed_experts": 64,
        "n_shared_experts": 1, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "kv_lora_rank": 128,
        "q_lora_rank": 384, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "vocab_size": VOCAB,
        "max_position_embeddings": 4096}
KW = dict(gpus=16, batch=32, seq=2048, tp=2, sp=True, pp=2, ep=4, zero=1, micro_batch=1, dtype="bf16",
          attention="flash", framework="megatron")


def _graph(mtp: int, **kw):
    opts = dict(batch=1, seq=1024, dtype="bf16", attention="flash", framework="megatron", mtp_layers=mtp)
    opts.update(kw)
    return step_graph(DSV3, StepOptions(**opts))


def _block_params(g, layer: int) -> float:
    n = g.nodes
    return float(n.loc[(n["layer"] == layer) & (n["phase"] == "forward"), "param_count"].sum())


def test_mtp_depth_is_embedding_norms_projection_block_and_shared_head():
    """One depth: a lookup in the word embedding (no table of its own on one rank: the pipeline's last-stage copy is the
    scheduler's), two RMSNorms, eh_proj (2h -> h), one MoE block like the decoder's last, a final norm, and the output
    layer shared with the head (no parameters) with a second loss."""
    g0, g1 = _graph(0), _graph(1)
    n = g1.nodes
    mtp = n[(n["phase"] == "forward") & n["scope"].astype(str).str.startswith(("mtp.", "moe.experts"))
            & (n["layer"] == 4)]
    eh = mtp[mtp["name"] == "mtp.layers.0.eh_proj"].iloc[0]
    assert (eh["N"], eh["K"]) == (2 * H, H)
    assert (n.loc[(n["layer"] == 4) & (n["phase"] == "forward"), "name"] == "lm_head").sum() == 2
    assert (n.loc[(n["layer"] == 4) & (n["phase"] == "forward"), "name"] == "loss").sum() == 2
    added = g1.param_count - g0.param_count
    norms = 3 * H  # enorm, hnorm, final_layernorm
    # the MTP block's parameters equal a decoder MoE block's (layer 3); its latent norms' weights (q_lora_rank +
    # kv_lora_rank) sit on their kernel nodes since the eager RMSNorm owns its weight (tests/test_stage_params_norms.py)
    block = _block_params(g0, 3)
    assert added == pytest.approx(norms + 2 * H * H + block, rel=1e-9)
    assert g1.meta["mtp_embedding_params"] == VOCAB * H


def test_mtp_sits_on_the_last_stage():
    off = wattcast.predict_cluster(DSV3, "DGX-H100", **KW)
    on = wattcast.predict_cluster(DSV3, "DGX-H100", **KW, mtp_num_layers=1)
    two = wattcast.predict_cluster(DSV3, "DGX-H100", **KW, mtp_num_layers=2)
    assert on.per_device[0]["params"] == off.per_device[0]["params"]
    assert on.per_device[1]["params"] > off.per_device[1]["params"] + VOCAB * H / 2  # its embedding copy, TP-split
    # a second depth adds a block, norms and a projection but no second embedding table
    depth = on.per_device[1]["params"] - off.per_device[1]["params"]
    assert two.per_device[1]["params"] - on.per_device[1]["params"] == pytest.approx(depth - VOCAB * H / 2, rel=1e-9)
    # one rank (no pipeline): the MTP looks up the embedding the first stage holds anyway, no copy, no all-reduce
    one = dict(KW, gpus=8, pp=1, batch=16)
    p0 = wattcast.predict_cluster(DSV3, "DGX-H100", **one)
    p1 = wattcast.predict_cluster(DSV3, "DGX-H100", **one, mtp_num_layers=1)
    assert p1.per_device[0]["params"] - p0.per_device[0]["params"] == pytest.approx(depth - VOCAB * H / 2, rel=1e-9)
    assert "embedding_grad_allreduce_bytes" not in p1.comm
    # the embedding copy's gradient is all-reduced with the first stage (fp32 main grads under bf16), in the pp class
    assert "embedding_grad_allreduce_bytes" not in off.comm
    assert on.comm["embedding_grad_allreduce_bytes"] == pytest.approx(VOCAB * H / 2 * 4)
    assert on.step_time_ms > off.step_time_ms and on.flops > off.flops
    assert on.to_dict()["settings"]["mtp_num_layers"] == 1


@pytest.mark.parametrize("model, kw, match", [
    ("llama3_8b", dict(framework="megatron"), "built for DeepSeek-V2/V3"),
    (DSV3, dict(framework="hf"), "under --framework megatron"),
    (DSV3, dict(mtp_num_layers=-1), "whole number >= 0"),
])
def test_mtp_rules(model, kw, match):
    args = dict(KW, mtp_num_layers=1)
    args.update(kw)
    if model == "llama3_8b":
        args.update(ep=1)
    with pytest.raises((GraphError, ParallelConfigError), match=match):
        wattcast.predict_cluster(model, "DGX-H100", **args)


def test_latent_attention_under_sequence_parallelism_attends_over_the_whole_sequence():
    g = _graph(0, tp=2, sp=True)
    n = g.nodes
    flash = n[(n["name"] == "attn.flash") & (n["phase"] == "forward")].iloc[0]
    assert flash["M"] == 1024  # the sequence, not the 512-token shard
    assert g.meta.get("n_layers") == 4


def test_cli_mtp_num_layers():
    from typer.testing import CliRunner

    from wattcast.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["predict", "-m", "deepseek_v3", "--mtp-num-layers", "1"])
    assert bad.exit_code != 0 and "--mtp-num-layers" in bad.output
    cfg = json.dumps(DSV3)
    import tempfile, pathlib

    with tempfile.TemporaryDirectory() as d:
        p = pathlib.Path(d) / "config.json"
        p.write_text(cfg)
        args = ["predict", "-m", str(p), "--cluster", "DGX-H100", "--gpus", "16", "--batch", "32", "--seq", "2048",
                "--tp", "2", "--sp", "--pp", "2", "--ep", "4", "--zero", "1", "--micro-batch", "1", "--dtype", "bf16",
                "--attention", "flash", "--framework", "megatron", "--json"]
        off = runner.invoke(app, args)
        on = runner.invoke(app, args + ["--mtp-num-layers", "1"])
    assert off.exit_code == 0 and on.exit_code == 0, on.output
    assert json.loads(on.stdout)["step_time_ms"] > json.loads(off.stdout)["step_time_ms"]


def test_search_takes_mtp_num_layers():
    kw = dict(gpus=16, batch=32, seq=2048, dtype="bf16", attention="flash", framework="megatron", tp=(2,), pp=(2,),
              ep=(4,), sp=(True,), zero=(1,), recompute=("none",), micro_batch=(1,), interleave=(1,), workers=1,
              prune_oom=False)
    off = wattcast.search(DSV3, "DGX-H100", **kw).ranked.iloc[0]
    on = wattcast.search(DSV3, "DGX-H100", **kw, mtp_num_layers=1).ranked.iloc[0]
    assert on["step_time_ms"] > off["step_time_ms"]
    p = wattcast.predict_cluster(DSV3, "DGX-H100", strategy=on["strategy"], seq=2048, dtype="bf16", attention="flash",
                                 framework="megatron", mtp_num_layers=1)
    assert p.step_time_ms == pytest.approx(on["step_time_ms"], rel=1e-9)


def test_mtp_block_recomputes_its_modules_like_the_decoders():
    """Megatron-Core builds the MTP layer from the same config: --recompute-modules re-run its norms, latent
    up-projections and expert activations in the backward as the decoder's; the head's own ops are not recomputed."""
    rc = "selective:layernorm,mla_up_proj,moe_act"
    n0, n1 = _graph(0, recompute=rc).nodes, _graph(1, recompute=rc).nodes
    assert not n0.loc[n0["layer"] == 4, "recompute"].any()
    mtp_rc = n1[(n1["layer"] == 4) & n1["recompute"].astype(bool)]
    moe_block = n1[(n1["layer"] == 3) & n1["recompute"].astype(bool)]
    assert len(mtp_rc) == len(moe_block) > 0
    assert not mtp_rc["name"].str.startswith(("lm_head", "loss", "mtp.layers.0.")).any()


def test_latent_attention_heads_need_not_divide_the_hidden_size():
    """MLA sizes its heads by qk_nope + qk_rope and v_head_dim: 12 heads over hidden 1024 is a valid DeepSeek config
    (it was refused: 'hidden size 1024 is not divisible by 12 heads'); under context parallelism each ring step passes
    the up-projected keys and values (qk_nope + qk_rope + v per head, not 2 x a nominal head size)."""
    cfg = dict(DSV3, num_attention_heads=12, num_key_value_heads=12)
    assert step_graph(cfg, StepOptions(batch=1, seq=256, dtype="bf16", attention="flash")).param_count > 0
    r = wattcast.predict_cluster(DSV3, "DGX-H100", gpus=8, batch=8, seq=8192, tp=2, cp=4, sp=True, micro_batch=1,
                                 dtype="bf16", attention="flash", framework="megatron")
    from wattcast.simulate.distributed import schedule_context
    from wattcast.simulate.options import DistributedOptions
    from wattcast.simulate.parallel import ParallelConfig

    ctx = schedule_context(DSV3, "DGX-H100", ParallelConfig(gpus=8, tp=2, cp=4, sp=True, micro_batch=1),
                           DistributedOptions(batch=8, seq=8192, dtype="bf16", attention="flash", framework="megatron"))
    assert ctx.cp_kv_bytes == 1 * (8192 // 4) * (HEADS // 2) * (64 + 32 + 64) * 2
    assert r.step_time_ms > 0
