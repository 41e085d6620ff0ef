"""Context parallelism's KV ring holds one step's buffers at a time (audit 57a, issue 1).

Transformer Engine 2.20.2 ``AttnFuncWithCPAndKVP2P.forward`` (pytorch/attention/dot_product_attention/
context_parallel.py l. 1900-1944, 2038-2231) runs cp attention steps with two KV buffers (``p2p_comm_buffers[i % 2]``
in use, ``[(i + 1) % 2]`` arriving) and two per-step outputs and LSEs (``out_per_step[i % 2]``), and corrects the output
one step at a time (``flash_attn_fwd_out_correction(out, out_per_step[(i - 1) % 2], ...)``). The graph costs the
cp - 1 corrections as one node and the cp steps as one attention node (their time and bytes the whole ring's); their
working set (simulate/memory.py ``kernel_working_bytes``, the stage's ``transient_gb``) is one step's. Until stop 57
the node's whole bytes were read as one kernel's: ``transient_gb`` grew with cp at a fixed per-rank token count.
"""

from __future__ import annotations

import numpy as np
import pytest

from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.distributed import predict_distributed
from wattcast.simulate.memory import kernel_working_bytes, resident_weight_bytes, transient_bytes_by_layer
from wattcast.simulate.options import DistributedOptions
from wattcast.simulate.parallel import ParallelConfig

TOKENS = 8192  # per CP rank
DB = 2  # bf16


def _graph(model, cp: int, cp_comm: str = "p2p", tp: int = 8):
    kw = dict(cp=cp, cp_comm=cp_comm) if cp > 1 else {}
    opts = StepOptions(batch=1, seq=TOKENS, mode="train", dtype="bf16", attention="flash", recompute="none",
                       framework="megatron", tp=tp, sp=True, **kw)
    return step_graph(model, opts, blocks=3)


def _work(g, name: str, layer: int = 1) -> tuple[float, float]:
    """(bytes, working set) of the forward node ``name`` in ``layer``."""
    fwd = g.nodes[g.nodes["phase"] == "forward"]
    work = kernel_working_bytes(g, fwd, resident_weight_bytes(g, fwd, DB))
    i = np.flatnonzero((fwd["name"] == name).to_numpy() & (fwd["layer"] == layer).to_numpy())
    assert len(i) == 1, name
    return float(fwd["bytes"].iloc[i[0]]), float(work[i[0]])


@pytest.mark.parametrize("cp", [4, 16])
def test_out_correction_costs_the_ring_and_holds_one_step(cp):
    """Llama 3 405B on TP8: 16 query heads of 128 a rank. The correction node still costs cp - 1 passes over the
    output (read the step's and the running one, write it); its working set is one pass."""
    g = _graph("llama3_405b", cp)
    n_out = 1 * (128 // 8) * TOKENS * 128
    total, work = _work(g, "attn.flash.cp_out_correction")
    assert total == (cp - 1) * 3 * n_out * DB  # the cost, unchanged
    assert work == pytest.approx(3 * n_out * DB)  # 100.7 MB (1.51 GB at cp 16 before)


def test_transient_does_not_grow_with_cp_at_fixed_tokens_per_rank():
    """Each layer's largest working set at 8,192 tokens a rank is FC1's at every cp (0.487 GB; 1.51 GB at cp 16
    before)."""
    base = transient_bytes_by_layer(_graph("llama3_405b", 1))
    for cp in (2, 8, 16):
        assert transient_bytes_by_layer(_graph("llama3_405b", cp)) == pytest.approx(base, rel=1e-12)


GPT_MHA = {"model_type": "gpt2", "n_embd": 12288, "n_head": 96, "n_layer": 96, "n_positions": 16 * TOKENS,
           "vocab_size": 51200, "activation_function": "gelu", "_name_or_path": "gpt3_175b_cp_ring"}


def test_ring_attention_holds_two_kv_chunks_all_gather_holds_all():
    """Without GQA the KV chunks dominate: the p2p attention node reads cp of them (its cost) but holds q, the running
    chunk, the arriving one and the output; the all-gather implementation gathers every rank's K and V
    (AttnFuncWithCPAndKVAllGather), so its working set stays the whole node's."""
    cp = 16
    q = kv = 1 * (96 // 8) * TOKENS * 128  # q, and each of k and v, a rank: 12 heads x 8,192 tokens x 128
    total, work = _work(_graph(GPT_MHA, cp), "attn.flash")
    assert total == (q + cp * 2 * kv + q) * DB
    assert work == pytest.approx((q + 2 * 2 * kv + q) * DB)  # 151 MB (856 MB before)
    total_ag, work_ag = _work(_graph(GPT_MHA, cp, "allgather"), "attn.flash")
    assert work_ag == total_ag == total


def test_cluster_transient_same_at_every_cp():
    """The audit's sweep: Llama 3 70B TP8 PP8 SP, 8,192 tokens a CP rank: ``transient_gb`` 0.2517 GB at cp 1, 8 and
    16 (0.3523 and 0.755 before), activations unchanged by cp."""
    out = {}
    for cp in (1, 8, 16):
        par = ParallelConfig(gpus=64 * cp, tp=8, pp=8, cp=cp, dp=1, micro_batch=1, sp=True, zero=1)
        r = predict_distributed("llama3_70b", "DGX-H100", par, DistributedOptions(
            batch=16, seq=TOKENS * cp, dtype="bf16", attention="flash", framework="megatron"))
        out[cp] = (r.memory["transient_gb"], r.memory["activations_gb"])
    assert out[8] == pytest.approx(out[1], rel=1e-12) and out[16] == pytest.approx(out[1], rel=1e-12)
