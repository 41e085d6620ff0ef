"""How pipeline transfers meet the computation, per framework (simulate/distributed.py ``p2p_blocking``):
Megatron's 1F1B and DeepSpeed's engine block the sender for each transfer (batched send/recv waited on; blocking
sends), Megatron-Core's interleaved schedule overlaps them, and DeepSpeed partitions what it sends over the TP group."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.simulate.parallel import ParallelConfigError

KW = dict(gpus=32, batch=64, seq=2048, tp=1, pp=4, micro_batch=1, dtype="bf16", attention="flash")


def _pp(framework, **kw):
    r = wattcast.predict_cluster("gpt3_2.7b", "DGX-A100", framework=framework, **dict(KW, **kw))
    return r, r.exposed_comm_split_ms["pp"], r.comm["p2p_ms"], r.comm["layouts"]


def test_megatron_1f1b_blocks_the_sender_every_micro_batch_and_hf_only_on_the_dependency():
    r, exposed, p2p, _ = _pp("megatron")
    n_micro = r.meta["n_micro"]
    assert p2p > 0 and n_micro == 8
    # the slowest stage spends its own transfers every micro-batch (forward and backward sends)
    assert exposed > n_micro * p2p
    r_hf, exposed_hf, p2p_hf, _ = _pp("hf")
    assert p2p_hf == pytest.approx(p2p)
    # fill and drain only: 2 (pp - 1) transfers, besides the tied embedding's once-a-step gradient all-reduce between
    # the first and the last stage (also in the "pp" class; tests/test_tied_embedding_pipeline.py)
    tied_ms = r_hf.comm["embedding_grad_allreduce_ms"]
    assert tied_ms > 0
    assert exposed_hf - tied_ms <= 2 * (4 - 1) * p2p * 1.01
    # Megatron-Core's interleaved schedule overlaps its transfers (--overlap-p2p-communication)
    _, exposed_v2, _, _ = _pp("megatron", interleave=2)
    assert exposed_v2 < exposed


def test_deepspeed_partitions_its_transfers_over_tp_and_has_no_interleaving():
    _, _, p2p_ds, _ = _pp("megatron-deepspeed", tp=2, dtype="fp16", attention="eager")
    _, _, p2p_mg, _ = _pp("megatron", tp=2, dtype="fp16", attention="eager")
    assert p2p_ds < p2p_mg  # 1/tp over the link, then an all-gather on NVLink
    with pytest.raises(ParallelConfigError, match="no interleaved schedule"):
        _pp("megatron-deepspeed", interleave=2, dtype="fp16", attention="eager")
