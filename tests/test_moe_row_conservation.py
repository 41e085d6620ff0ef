"""Every routed (token, expert) pair is computed exactly once: the expert rows of a MoE layer add up to T x k
(``featurize.hf_models.expert_row_split``).

Fails on the code before stop 55's fix, which rounded each running expert's rows on its own (``round(rows / active)``
for every one of them): Qwen3-30B-A3B (128 experts, top-8) at 16 tokens ran 82 experts x 2 rows = 164 rows for the
128 routed pairs, at 8 tokens 52 x 1 = 52 for 64; gpt-oss-120b training at 128 tokens 126 x 4 = 504 for 512. The decode
step's matrix-multiply GFLOP per token moved with the batch (2.70 at batch 8, 3.55 at 16, 3.01 at 64 against 3.04),
and the MFU numerator of gpt-oss-120b at seq 128 was 1.1% low. The routing model itself is unchanged: uniform top-k
routing reaching n (1 - (1 - k/n)^T) experts (``active_local_experts``), each rank's received rows split over its
running experts, rows // active each and one more on rows % active of them.
"""

from __future__ import annotations

import pytest

import wattcast
from wattcast.featurize.hf_config import load_hf_config
from wattcast.featurize.hf_models import active_local_experts, expert_row_split
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.single_device import model_flops

EXPERT_OUT = r"(experts\.\d+\.(down_proj|linear_fc2)|moe\.experts\.w2)$"  # each expert's last GEMM: its rows once


def _expert_rows(g) -> dict[int, float]:
    """Rows through the routed experts' last GEMM, per MoE layer, in the forward (B x M: a grouped launch's groups)."""
    n = g.nodes
    m = n[(n["phase"] == "forward") & n["name"].astype(str).str.match(EXPERT_OUT)]
    assert len(m), "no expert GEMMs in the graph"
    # a grouped launch's M is its groups' mean rows (fractional when they differ): B x M to the nearest 1e-6
    return (m["B"] * m["M"]).groupby(m["layer"]).sum().round(6).to_dict()


@pytest.mark.parametrize("n_exp,top_k", [(128, 8), (8, 2), (256, 8), (60, 4), (128, 4), (32, 4)])
@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_split_conserves_every_ranks_rows(n_exp, top_k, ep):
    # decode batches 1..64 and training micro-batches: each rank's t tokens x top_k rows (balanced all-to-all: a rank
    # receives as many rows as it sends), split over the local experts the group's t x ep tokens reach
    if n_exp % ep:
        pytest.skip("experts not divisible by ep")
    for t in [*range(1, 65), 96, 128, 512, 1024, 4096]:
        rows = t * top_k
        active = min(active_local_experts(n_exp, top_k, t * ep, ep), rows)
        split = expert_row_split(rows, active)
        assert sum(split) == rows and len(split) == active, (t, ep)
        assert max(split) - min(split) <= 1 and min(split) >= 1
        if active == n_exp // ep and rows % active == 0:  # every local expert, the balanced share: as before
            assert set(split) == {rows * ep // n_exp}


def test_split_refuses_more_experts_than_rows():
    assert expert_row_split(512, 126) == [5] * 8 + [4] * 118
    assert expert_row_split(128, 82) == [2] * 46 + [1] * 36
    with pytest.raises(GraphError, match="routed rows"):
        expert_row_split(3, 4)


DECODE_GRID = [1, 2, 3, 5, 8, 13, 16, 24, 31, 64]


@pytest.mark.parametrize("model", ["qwen3_30b_a3b", "mixtral_8x7b", "gpt_oss_120b"])
def test_hf_graph_rows_add_up_to_tokens_times_top_k(model):
    k = load_hf_config(model).experts_per_token
    for batch in DECODE_GRID:  # Hugging Face's loop over the hit experts, a KV-cached decode step
        g = step_graph(model, StepOptions(batch=batch, seq=1, mode="inference", dtype="bf16", kv_context=256))
        assert set(_expert_rows(g).values()) == {batch * k}, batch
    for seq in (16, 128, 1000):  # training micro-batches, both forward and (through the same nodes) backward
        g = step_graph(model, StepOptions(batch=1, seq=seq, mode="train", dtype="bf16", blocks=2))
        assert set(_expert_rows(g).values()) == {seq * k}, seq


@pytest.mark.parametrize("model", ["qwen3_30b_a3b", "mixtral_8x7b"])
def test_vllm_fused_grouped_gemm_rows_add_up(model):
    k = load_hf_config(model).experts_per_token
    for batch in DECODE_GRID:
        g = step_graph(model, StepOptions(batch=batch, seq=1, mode="inference", dtype="bf16", kv_context=256,
                                          fused_moe=True))
        n = g.nodes
        w13 = n[n["name"] == "moe.experts.w13"].iloc[0]
        assert set(_expert_rows(g).values()) == {batch * k} and w13.B * w13.M == pytest.approx(batch * k), batch
        # the FLOPs are every routed row's: 2 x rows x in x out
        assert w13.flops == 2 * batch * k * w13.N * w13.K


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_megatron_expert_parallel_rank_rows_add_up(dispatcher, ep):
    # one rank's graph: its t tokens' t x k rows (all-to-all: received as sent; all-gather: the t x ep tokens' rows
    # that reach its n / ep experts); over the ep ranks, T x k for the group's T = t x ep tokens
    for t in (1, 3, 8, 16, 64, 512):
        g = step_graph("qwen3_30b_a3b", StepOptions(batch=1, seq=t, mode="train", dtype="bf16", blocks=2, ep=ep,
                                                    framework="megatron", moe_token_dispatcher=dispatcher))
        assert set(_expert_rows(g).values()) == {t * 8}, t
    # padded to capacity: every local expert on its capacity x ep rows (the padded model, unchanged)
    g = step_graph("qwen3_30b_a3b", StepOptions(batch=1, seq=16, mode="train", dtype="bf16", blocks=2, ep=ep,
                                                framework="megatron", moe_token_dispatcher=dispatcher, moe_load=2.0,
                                                moe_pad_to_capacity=True))
    per = {"alltoall": 2 * ep, "allgather": 2 * ep}[dispatcher]  # capacity ceil(16 x 8 / 128 x 2) = 2 from each rank
    assert set(_expert_rows(g).values()) == {per * 128 // ep}


def _active_linear_params(nodes, n_exp: int, top_k: int) -> float:
    """A token's matrix-multiply parameters: every non-expert linear's, and top_k / n of the experts' (all n held)."""
    fwd = nodes[(nodes["phase"] == "forward") & (nodes["op_class"] == "linear")]
    exp = fwd["scope"].astype(str).str.contains(r"experts\.") | fwd["name"].astype(str).str.contains(r"experts\.")
    return float(fwd.loc[~exp, "param_count"].sum() + fwd.loc[exp, "param_count"].sum() * top_k / n_exp)


@pytest.mark.parametrize("model,seq,rel", [("qwen3_30b_a3b", 16, 0.0), ("qwen3_30b_a3b", 8, 0.0),
                                           ("mixtral_8x7b", 12, 0.0),
                                           # biased linears: a bias is one add a row, not 6 FLOPs a parameter
                                           ("gpt_oss_120b", 128, 1e-4)])
def test_model_flops_are_six_times_active_params_times_tokens(model, seq, rel):
    # the MFU numerator's matrix-multiply part: 6 x active parameters x tokens (was 164 / 128 rows in Qwen3-30B-A3B's
    # experts at seq 16, and gpt-oss-120b 1.1% low at 128)
    cfg = load_hf_config(model)
    r = wattcast.predict(model, "H100", batch=1, seq=seq, mode="train")
    n = r.nodes
    linear = model_flops(n[n["op_class"] == "linear"])[0]
    want = 6 * seq * _active_linear_params(n, cfg.n_experts, cfg.experts_per_token)
    assert linear == pytest.approx(want, rel=rel, abs=0)
    assert r.flops >= linear


def test_decode_matmul_flops_per_token_do_not_move_with_the_batch():
    # Qwen3-30B-A3B decode on one H100: 3.04 GFLOP a token of linear work at every batch (was 2.70 at 8, 3.55 at 16)
    per_tok = []
    for batch in (1, 8, 16, 64):
        r = wattcast.predict("qwen3_30b_a3b", "H100", batch=batch, seq=1, kv_context=1024, mode="inference")
        n = r.nodes
        per_tok.append(float(n.loc[n["op_class"] == "linear", "flops"].sum()) / batch / 2 / 1e9)
    assert max(per_tok) - min(per_tok) < 1e-9 * max(per_tok) and per_tok[0] == pytest.approx(3.0417, abs=1e-3)
