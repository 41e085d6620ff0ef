"""MoE layers build only the experts their tokens reach (``featurize.hf_models.active_local_experts``).

T tokens, each routed to k of n experts, reach n (1 - (1 - k/n)^T) distinct experts on average under uniform routing
(each token misses a given expert with probability 1 - k/n). Frameworks run only those: transformers' Qwen3-MoE /
Mixtral loop over ``expert_hit``, vLLM's fused MoE reads only the routed experts' weights. A decode step at batch 1
therefore reads k experts' weights per layer, not n; a training micro-batch (T k >> n) still runs all of them, as
before. The idle experts' weights stay resident (parameter counts and weights memory unchanged).
"""

from __future__ import annotations

import numpy as np
import pytest

import wattcast
from wattcast.featurize.hf_config import load_hf_config
from wattcast.featurize.hf_models import active_local_experts, expected_experts_hit
from wattcast.featurize.workload import StepOptions, step_graph

H200 = "H200-SXM-141GB"


def _decode(model: str, batch: int, **kw):
    return step_graph(model, StepOptions(batch=batch, seq=1, mode="inference", dtype="bf16", kv_context=1024, **kw))


def _expert_gemms(g, layer: int = 1):
    n = g.nodes
    return n[(n["layer"] == layer) & (n["phase"] == "forward") & (n["op_class"] == "linear")
             & n["scope"].astype(str).str.contains(r"experts\.")]


def test_expected_experts_hit_matches_a_simulated_router():
    # k distinct experts of n per token, uniformly, T tokens: the mean count of distinct experts hit over many draws
    rng = np.random.default_rng(0)
    for n, k, t in [(128, 8, 1), (128, 8, 8), (8, 2, 3), (60, 4, 16)]:
        hits = [len(set(np.concatenate([rng.choice(n, k, replace=False) for _ in range(t)]))) for _ in range(3000)]
        assert expected_experts_hit(n, k, t) == pytest.approx(np.mean(hits), rel=0.02), (n, k, t)
    assert expected_experts_hit(128, 8, 1) == 8.0 and expected_experts_hit(8, 2, 1) == 2.0
    assert active_local_experts(128, 8, 8, 1) == 52  # 128 (1 - (15/16)^8) = 51.6, to nearest
    assert active_local_experts(128, 8, 256, 1) == 128 and active_local_experts(128, 8, 1024 * 8, 8) == 16
    assert active_local_experts(128, 8, 1, 8) == 1  # one token on 8 ranks: 1 expert expected here, at least one


@pytest.mark.parametrize("model,k", [("qwen3_30b_a3b", 8), ("mixtral_8x7b", 2)])
def test_batch_1_decode_reads_only_the_routed_experts(model, k):
    cfg = load_hf_config(model)
    ffn = cfg.count("moe_intermediate_size") if model.startswith("qwen") else cfg.ffn
    one, big = _decode(model, 1), _decode(model, 256)
    e1, e256 = _expert_gemms(one), _expert_gemms(big)
    # k experts x (gate, up, down) at batch 1; all n at batch 256 (n (1 - (1 - k/n)^256) rounds to n for both)
    assert len(e1) == 3 * k and len(e256) == 3 * cfg.n_experts
    weight_bytes = 3 * cfg.hidden * ffn * 2  # one expert's three bf16 matrices
    assert e1["bytes"].sum() == pytest.approx(k * weight_bytes, rel=0.01)
    assert e256["bytes"].sum() >= cfg.n_experts * weight_bytes
    # every token's k rows: one row per running expert at batch 1
    assert set(e1["M"]) == {1.0}
    # the idle experts' weights are still held: the same parameters at batch 1 as at 256, counted as experts
    assert one.param_count == big.param_count
    assert _expert_gemms(one)["param_count"].sum() == _expert_gemms(big)["param_count"].sum()


def test_decode_step_time_follows_the_routed_experts():
    kw = dict(mode="inference", seq=1, kv_context=1024)
    b1 = wattcast.predict("qwen3_30b_a3b", H200, batch=1, **kw)
    b256 = wattcast.predict("qwen3_30b_a3b", H200, batch=256, **kw)
    assert b1.step_time_ms < 0.3 * b256.step_time_ms  # was 255 ms vs 265 ms: all 128 experts at batch 1
    assert b1.memory.weights_gb == b256.memory.weights_gb  # every expert resident


def test_training_micro_batch_runs_every_expert_with_the_balanced_rows():
    # 1,024 tokens x top-8 over 128 experts: 64 rows each, all 128 experts (T k >> n): the graph as before
    g = step_graph("qwen3_30b_a3b", StepOptions(batch=1, seq=1024, mode="train", dtype="bf16", blocks=2))
    e = _expert_gemms(g)
    assert len(e) == 3 * 128 and set(e["M"]) == {64.0}
    assert e["param_count"].sum() == 128 * 3 * 2048 * 768


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_expert_parallel_ranks_count_every_ranks_tokens(dispatcher):
    # Megatron-Core, ep 4, one token per rank: 4 tokens reach a rank's 32 of 128 experts;
    # 32 (1 - (15/16)^4) = 7.3 -> 7 experts run (FC1 and FC2 each), on the rank's 4 x 8 / 4 ranks = 8 rows: one
    # expert 2, six 1 (expert_row_split; until stop 55 each was rounded to 1, 7 rows for 8)
    g = step_graph("qwen3_30b_a3b", StepOptions(batch=1, seq=1, mode="train", dtype="bf16", blocks=2, ep=4,
                                                framework="megatron", moe_token_dispatcher=dispatcher))
    e = _expert_gemms(g)
    assert len(e) == 2 * 7 and sorted(e["M"]) == [1.0] * 12 + [2.0] * 2
    assert e["param_count"].sum() == 32 * 3 * 2048 * 768  # the rank's 32 experts' weights, resident


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_padding_to_capacity_runs_every_local_expert_on_its_capacity(dispatcher):
    """Fails on the code before stop 46's follow-up (no ``moe_pad_to_capacity``: 7 of the rank's 32 experts ran, as unpadded). Megatron-Core's
    --moe-pad-expert-input-to-capacity makes the router's map the capacity mask (moe_utils.py l. 838-856) and the
    all-to-all dispatcher gives each local expert capacity x tp x ep rows (token_dispatcher.py l. 485-505): every
    expert runs, reached by a token or not. One token per rank, top-8 of 128, ep 4: capacity ceil(1 x 8 / 128 x C)."""
    from wattcast.featurize.hf_models import padded_expert_capacity

    assert padded_expert_capacity(1, 8, 128, 1.0) == 1 and padded_expert_capacity(16, 8, 128, 2.0) == 2
    assert padded_expert_capacity(4096, 8, 128, 1.25) == 320
    for c, rows in ((1.0, 4), (2.0, 4)):  # capacity 1 either way: 1 row from each of the 4 ranks
        g = step_graph("qwen3_30b_a3b", StepOptions(batch=1, seq=1, mode="train", dtype="bf16", blocks=2, ep=4,
                                                    framework="megatron", moe_token_dispatcher=dispatcher,
                                                    moe_load=c, moe_pad_to_capacity=True))
        e = _expert_gemms(g)
        assert len(e) == 2 * 32 and set(e["M"]) == {float(rows)}
        assert g.meta["moe_pad_to_capacity"] is True
    # 16 tokens per rank at capacity factor 2: capacity 2, 8 rows per expert (unpadded: 4 rows, 31 experts)
    g = step_graph("qwen3_30b_a3b", StepOptions(batch=1, seq=16, mode="train", dtype="bf16", blocks=2, ep=4,
                                                framework="megatron", moe_token_dispatcher=dispatcher, moe_load=2.0,
                                                moe_pad_to_capacity=True))
    assert set(_expert_gemms(g)["M"]) == {8.0} and len(_expert_gemms(g)) == 2 * 32


def test_padding_flag_reaches_the_builder_from_predict_cluster():
    """Fails on the code before stop 46's follow-up: --moe-pad-expert-input-to-capacity at capacity factor 1 left the graph unpadded (the
    step identical to no padding). Qwen3-30B-A3B, ep 4, one token a rank: 7 experts of 32 ran; padded, all 32."""
    kw = dict(gpus=4, ep=4, tp=1, pp=1, batch=4, micro_batch=1, seq=1, framework="megatron", moe_capacity_factor=1.0)
    plain = wattcast.predict_cluster("qwen3_30b_a3b", "DGX-H100", **kw)
    padded = wattcast.predict_cluster("qwen3_30b_a3b", "DGX-H100", moe_pad_to_capacity=True, **kw)
    # the forward's computation: 32 experts' GEMMs a layer, not 7 (15.4 -> 39.3 ms; the step adds the optimizer's)
    assert padded.forward_serial_ms > 2 * plain.forward_serial_ms and padded.step_time_ms > plain.step_time_ms
    # model FLOPs stay the balanced routing's (padding is not useful work)
    assert padded.flops == plain.flops


def _fwd_bytes(g, name: str, layer: int = 1) -> float:
    n = g.nodes
    return float(n[(n["layer"] == layer) & (n["phase"] == "forward") & (n["name"] == name)]["bytes"].sum())


def test_padded_unpermute_reads_every_padded_row_at_any_capacity_factor():
    """Fails on the code before stop 46's review fix: at any capacity factor but exactly 1.0 the combined tensor shrank
    back to the rank's t x top_k rows before the unpermute (Qwen3-30B-A3B, ep 4, one token: 36,864 B read at factor
    1.0001 or 2.0 against 528,384 B at 1.0, with the same capacity 1). Megatron-Core's unpermute under drop_and_pad
    (megatron-core 0.16.1 moe_utils.py l. 425-466) scatter-adds all capacity x experts rows whatever the factor."""
    got = {}
    for c in (1.0, 1.0001, 2.0):  # capacity ceil(1 x 8 / 128 x c) = 1 for all three
        g = step_graph("qwen3_30b_a3b", StepOptions(batch=1, seq=1, mode="train", dtype="bf16", blocks=2, ep=4,
                                                    framework="megatron", moe_load=c, moe_pad_to_capacity=True))
        got[c] = _fwd_bytes(g, "moe.unpermute")
    h = 2048
    # reads 128 padded rows x h bf16 (524,288 B) and writes the token's (1, h) row (4,096 B)
    assert got[1.0] == got[1.0001] == got[2.0] == 128 * h * 2 + h * 2
    # unpadded, a capacity factor above 1 still reads back only the rank's own t x top_k rows
    g = step_graph("qwen3_30b_a3b", StepOptions(batch=1, seq=1, mode="train", dtype="bf16", blocks=2, ep=4,
                                                framework="megatron", moe_load=2.0))
    assert _fwd_bytes(g, "moe.unpermute") == 8 * h * 2 + h * 2


def test_padded_rows_follow_each_dispatchers_source():
    """Fails on the code before stop 46's review fix (no shared ``padded_expert_rows``: each dispatcher computed its rows
    inline). Megatron-Core 0.16.1 sizes a padded expert's input per dispatcher: the all-to-all at the capacity,
    uncapped (token_dispatcher.py l. 485-505, l. 708-715), the all-gather at the capacity mask's count,
    min(capacity, tokens) (l. 289-301 over moe_utils.py l. 838-856). Mixtral 8x7B, ep 2, one token a rank, factor 5:
    capacity ceil(1 x 2 / 8 x 5) = 2: all-to-all 2 rows x 2 ranks = 4 per expert, all-gather 1 x 2 = 2."""
    from wattcast.featurize.hf_models import padded_expert_rows

    assert padded_expert_rows(1, 2, 8, 5.0, "alltoall") == 2 and padded_expert_rows(1, 2, 8, 5.0, "allgather") == 1
    assert padded_expert_rows(64, 2, 8, 1.0, "alltoall") == padded_expert_rows(64, 2, 8, 1.0, "allgather") == 16
    with pytest.raises(Exception, match="dispatcher"):
        padded_expert_rows(1, 2, 8, 1.0, "flex")
    for dispatcher, m in (("alltoall", 4.0), ("allgather", 2.0)):
        g = step_graph("mixtral_8x7b", StepOptions(batch=1, seq=1, mode="train", dtype="bf16", blocks=2, ep=2,
                                                   framework="megatron", moe_token_dispatcher=dispatcher, moe_load=5.0,
                                                   moe_pad_to_capacity=True))
        assert set(_expert_gemms(g)["M"]) == {m}
