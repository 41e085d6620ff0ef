"""``--framework megatron --zero 2/3`` = Megatron-FSDP ``optim_grads`` / ``optim_grads_params`` as megatron-core 0.16.1
(``distributed/fsdp/src/megatron_fsdp``) and Megatron-LM's ``get_model`` run them (stop 46):

- ZeRO-2's gradients are bucketed at Megatron-LM's ``--ddp-bucket-size`` default, max(40M, 1M x dp), with
  ``--overlap-grad-reduce`` (``training.py`` sets ``ddp_config.bucket_size`` before wrapping the model, for
  Megatron-FSDP as for DDP), not one bucket of the whole model: each bucket's reduce-scatter runs beside the rest of
  the backward and the unsharded fp32 buckets in flight are those the reduce-scatter queue holds
  (``suggested_RS_queue_capacity``, at least 1e9 elements) plus the one filling;
- ZeRO-3 holds the running TransformerLayer, the ones prefetched after it (``suggested_AG_prefetch_size``, 5e8
  elements) and the parameters outside the layers unsharded, and its layers' fp32 gradient buckets in flight.

Until stop 46 the audit's Llama 3 8B case (16 H100s, 4 micro-batches) read ZeRO-2 above ZeRO-1 in memory (97.6 vs
95.6 GB: a 32.1 GB bucket) and above ZeRO-3 in time (3,354 vs 3,072 ms), ZeRO-3 counting no gathered parameter or
in-flight gradient."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wattcast.simulate.stage_memory import (
    MFSDP_MIN_COMM_UNIT_ELEMENTS,
    buffer_bytes,
    megatron_fsdp_comm_unit_elements,
    megatron_fsdp_gathered_bytes,
    megatron_fsdp_grad_bucket_bytes,
    megatron_fsdp_inflight_grad_elements,
)

# Llama 3 8B (hidden 4096, 32 layers, ffn 14336, 8 KV heads of 128, vocab 128256, untied head): one layer's
# parameters (q, o: 4096^2 each; k, v: 4096 x 1024 each; gate, up, down: 4096 x 14336 each; two RMSNorms) and those
# outside the layers (embedding + head: 128256 x 4096 each; final RMSNorm)
L8B_BLOCK = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
L8B_ROOT = 2 * 128256 * 4096 + 4096
L8B_PARAMS = 32 * L8B_BLOCK + L8B_ROOT
L8B_EMB = 128256 * 4096
CUBLAS_AND_CONTEXT = 32 * 2**20 + 0.5e9


def _audit(zero: int, **extra):
    import wattcast

    # the user audit's case: wattcast predict -m llama3_8b --cluster DGX-H100 --gpus 16 --tp 1 --pp 1 --batch 64
    # --micro-batch 1 --seq 8192 --framework megatron --recompute selective --zero {1,2,3}
    kw = dict(gpus=16, tp=1, pp=1, batch=64, micro_batch=1, seq=8192, framework="megatron", recompute="selective")
    return wattcast.predict_cluster("llama3_8b", "DGX-H100", zero=zero, **{**kw, **extra})


def test_comm_unit_and_queue_hand_counts():
    # megatron_fsdp.py l. 375-399: optim_grads_params 2 x the mean unit, optim_grads the bucket size, floor 1e9
    assert megatron_fsdp_comm_unit_elements(3, block_params=2.18e8, bucket_params=np.inf) == 1e9
    assert megatron_fsdp_comm_unit_elements(3, block_params=8e8, bucket_params=np.inf) == 1.6e9
    assert megatron_fsdp_comm_unit_elements(2, block_params=2.18e8, bucket_params=4e7) == 1e9
    assert megatron_fsdp_comm_unit_elements(2, block_params=0.0, bucket_params=2.048e9) == 2.048e9
    assert megatron_fsdp_comm_unit_elements(2, block_params=0.0, bucket_params=np.inf) == MFSDP_MIN_COMM_UNIT_ELEMENTS
    # queue of 1e9 over 40M buckets: 25 queued after the pops + the one launched + the one filling
    got = megatron_fsdp_inflight_grad_elements(params=np.array([8e9, 5e8]), bucket_params=4e7, queue_elements=1e9)
    np.testing.assert_array_equal(got, [27 * 4e7, 5e8])
    # no bucketing: the whole stage
    np.testing.assert_array_equal(
        megatron_fsdp_inflight_grad_elements(params=np.array([8e9]), bucket_params=np.inf, queue_elements=1e9), [8e9])


def test_zero3_gathered_units_and_root_hand_count():
    # prefetch 5e8 elements: 3 layers of 218.1M after the running one (2 x 218.1M < 5e8 <= 3 x 218.1M), + the root
    want = (L8B_ROOT + 4 * L8B_BLOCK) * 2
    got = megatron_fsdp_gathered_bytes(params=L8B_PARAMS, block_params=L8B_BLOCK, root_params=L8B_ROOT, dtype_bytes=2)
    assert float(got) == pytest.approx(want, rel=1e-15)
    during, after = buffer_bytes("megatron", params=L8B_PARAMS, grad_bytes=4, dtype_bytes=2, zero=3, dp=16,
                                 block_params=L8B_BLOCK, root_params=L8B_ROOT)
    assert float(during) == pytest.approx(CUBLAS_AND_CONTEXT + want, rel=1e-15) and after == 0.0
    # ZeRO-1 / 2 gather nothing into buffers (their weights are whole), nor does ZeRO-3 without data parallelism
    for zero, dp in ((1, 16), (2, 16), (3, 1)):
        assert buffer_bytes("megatron", params=L8B_PARAMS, grad_bytes=4, dtype_bytes=2, zero=zero, dp=dp,
                            block_params=L8B_BLOCK, root_params=L8B_ROOT)[0] == CUBLAS_AND_CONTEXT
    # never more than the stage's parameters (a 2-layer model is gathered whole)
    small = megatron_fsdp_gathered_bytes(params=2 * 1e7 + 5e6, block_params=1e7, root_params=5e6, dtype_bytes=2)
    assert float(small) == (2 * 1e7 + 5e6) * 2
    # the layers' in-flight fp32 gradient buckets: a queue of 1e9 holds 4 of 218.1M, + launched + filling
    g3 = megatron_fsdp_grad_bucket_bytes(params=L8B_PARAMS, grad_bytes=4, zero=3, block_params=L8B_BLOCK)
    assert float(g3) == 6 * L8B_BLOCK * 4


def test_audit_zero2_memory_below_zero1_and_zero3_counts_its_buffers():
    """Fails on stop 45's code: ZeRO-2 97.6 GB (one 32.12 GB fp32 bucket) against ZeRO-1's 95.6 GB, ZeRO-3's buffers
    0.53 GB (the cuBLAS workspace and CUDA context) and no in-flight gradient."""
    z1, z2, z3 = (_audit(z).to_dict()["memory"] for z in (1, 2, 3))
    assert z2["total_gb"] < z1["total_gb"]
    # 40M-parameter buckets at dp 16 (max(40M, 16 x 1M)): 27 in flight, fp32
    assert z2["unsharded_gradients_gb"] == pytest.approx(27 * 40e6 * 4 / 1e9, rel=1e-12)
    assert z2["gradients_gb"] == pytest.approx(L8B_PARAMS * 4 / 16 / 1e9, rel=1e-12)
    assert z1["unsharded_gradients_gb"] == 0.0 and z1["buffers_gb"] == pytest.approx(CUBLAS_AND_CONTEXT / 1e9)
    assert z3["buffers_gb"] == pytest.approx((CUBLAS_AND_CONTEXT + (L8B_ROOT + 4 * L8B_BLOCK) * 2) / 1e9, rel=1e-12)
    assert z3["unsharded_gradients_gb"] == pytest.approx(6 * L8B_BLOCK * 4 / 1e9, rel=1e-12)
    assert z3["total_gb"] < z2["total_gb"]


def test_audit_zero2_buckets_overlap_the_backward():
    """Fails on stop 45's code: one 32 GB reduce-scatter per backward, exposed whole (391.7 ms of exposed DP, a step
    3,354 ms against ZeRO-3's 3,072)."""
    z1, z2, z3 = (_audit(z) for z in (1, 2, 3))
    # the embedding's bucket (the backward's last) and the rest in 40M buckets (test_zero2_last_bucket_is_the_embeddings)
    n_buckets = 1 + math.ceil((L8B_PARAMS - L8B_EMB) / 40e6)
    assert z2.comm["dp_zero2_collectives_per_micro"] == n_buckets
    assert z2.comm["dp_zero2_bytes_per_micro"] == pytest.approx(L8B_PARAMS * 4, rel=1e-12)
    # beside the backward but the last bucket: far less exposed than one backward's reduce-scatters
    assert z2.exposed_comm_split_ms["dp"] < z2.comm["dp_zero2_ms_per_micro"]
    assert z1.step_time_ms <= z2.step_time_ms < z3.step_time_ms
    assert z2.exposed_comm_split_ms["dp"] < z3.exposed_comm_split_ms["dp"]
    # without --overlap-grad-reduce Megatron-LM leaves the bucket size None: one bucket, as before
    one = _audit(2, overlap_grad_reduce=False)
    assert one.comm["dp_zero2_collectives_per_micro"] == 1
    assert one.to_dict()["memory"]["unsharded_gradients_gb"] == pytest.approx(L8B_PARAMS * 4 / 1e9, rel=1e-12)


def _dp_terms(zero: int, **kw):
    """_dp_times' terms of the audit's case (Llama 3 8B, 16 H100s, one stage of 32 TransformerLayers), megatron."""
    from wattcast.data.cluster_spec import resolve_cluster
    from wattcast.simulate.distributed import _dp_times, collective_model, collective_ms, grad_reduce_every_micro
    from wattcast.simulate.parallel import ParallelConfig, layouts

    cl, cm = resolve_cluster("DGX-H100"), collective_model()
    par = ParallelConfig(gpus=16, tp=1, pp=1, dp=16, zero=zero, micro_batch=1, overlap_grad_reduce=True)
    lay = layouts(par, cl)
    t = _dp_times(par, lay, cl, cm, np.array([float(L8B_PARAMS)]), np.zeros(1), 4.0, 2.0, 1, 1, np.array([32]), 40e6,
                  reduce_op="reduce_scatter", reduce_every_micro=grad_reduce_every_micro("megatron", zero) is not None,
                  framework="megatron", **kw)
    return t, (lambda op, nbytes: float(collective_ms(cm, [op], [nbytes], lay["dp"], cl)[0][0]))


def test_first_bucket_hand_counts():
    """_get_parameter_groups (param_and_grad_buffer.py l. 1399-1423) closes a bucket once it reaches the bucket size,
    in named_parameters order, the embedding first: the embedding alone when it is larger."""
    from wattcast.simulate.distributed import mfsdp_first_bucket_params

    got = mfsdp_first_bucket_params(np.array([L8B_EMB, 2e7, 0.0]), np.array([8e9, 8e9, 8e9]), 40e6)
    np.testing.assert_array_equal(got, [L8B_EMB, 40e6, 0.0])
    assert float(mfsdp_first_bucket_params(L8B_EMB, 8e9, np.inf)) == 8e9  # no bucket size: one bucket of the group
    assert float(mfsdp_first_bucket_params(2e7, 3e7, 40e6)) == 3e7  # never more than the group


def test_zero3_gathers_the_parameters_outside_the_layers_once_a_step():
    """Fails on the code before stop 46's follow-up (no root_chunk: the embedding, final norm and head gathered with every micro-batch's
    units, 1/32 of them in each unit's all-gather, forward and backward). Megatron-FSDP gathers them once a step and
    keeps them until finish_grad_sync (megatron_fsdp.py l. 844-858, 1155-1161, 1205-1206; all_gather_params gathers
    only EMPTY buckets, param_and_grad_buffer.py l. 3549-3555), and reduce-scatters their gradients in every backward,
    the embedding's last."""
    head = L8B_ROOT - L8B_EMB
    t, ms = _dp_terms(3, root_chunk=np.array([float(L8B_ROOT)]), first_root_chunk=np.array([float(L8B_EMB)]))
    unit_ag = ms("all_gather", L8B_BLOCK * 2.0)
    # each micro-batch: the 32 layers' gathers, forward and backward, none of the parameters outside them
    assert t["z3_f_bytes"][0] == pytest.approx(32 * L8B_BLOCK * 2.0, rel=1e-12) and t["z3_f_n"][0] == 32
    assert t["z3_f_ms"][0] == pytest.approx(32 * unit_ag, rel=1e-12)
    # once a step: the embedding's bucket (waited for by the first forward) and the final norm + head's
    assert t["z3_root_f_bytes"][0] == pytest.approx(L8B_ROOT * 2.0, rel=1e-12) and t["z3_root_f_n"][0] == 2
    assert t["z3_root_first_f_ms"][0] == pytest.approx(ms("all_gather", L8B_EMB * 2.0), rel=1e-12)
    assert t["z3_root_f_ms"][0] == pytest.approx(ms("all_gather", L8B_EMB * 2.0) + ms("all_gather", head * 2.0),
                                                 rel=1e-12)
    # every backward: the layers' re-gathers and every gradient's fp32 reduce-scatter (32 units + the two buckets)
    assert t["z3_b_bytes"][0] == pytest.approx(32 * L8B_BLOCK * 2.0 + L8B_PARAMS * 4.0, rel=1e-12)
    assert t["z3_b_n"][0] == 32 + 32 + 2
    # the backward's last reduce-scatter, waited for at its end, is the embedding's 2.1 GB, not a unit's
    assert t["z3_first_b_ms"][0] == pytest.approx(unit_ag + ms("reduce_scatter", L8B_EMB * 4.0), rel=1e-12)
    # without root_chunk (PyTorch FSDP, DeepSpeed): the old spread, every micro-batch
    old, _ = _dp_terms(3)
    assert old["z3_f_bytes"][0] == pytest.approx(L8B_PARAMS * 2.0, rel=1e-12) and old["z3_root_f_n"][0] == 0


def test_audit_zero3_root_gathered_once_per_step():
    """Fails on the code before stop 46's follow-up (no dp_zero3_root_gather_* entries: gathered with every micro-batch's units)."""
    z3 = _audit(3)
    assert z3.comm["dp_zero3_root_gather_bytes_per_step"] == pytest.approx(L8B_ROOT * 2.0, rel=1e-12)
    one, _ = _dp_terms(3, root_chunk=np.array([float(L8B_ROOT)]), first_root_chunk=np.array([float(L8B_EMB)]))
    assert z3.comm["dp_zero3_ms_per_micro"] == pytest.approx(one["z3_f_ms"][0] + one["z3_b_ms"][0], rel=1e-9)
    # twice the micro-batches: the per-step gather is paid once either way
    z3_8 = _audit(3, batch=128)
    assert z3_8.comm["dp_zero3_root_gather_ms_per_step"] == z3.comm["dp_zero3_root_gather_ms_per_step"]


def test_zero2_last_bucket_is_the_embeddings():
    """Fails on the code before stop 46's follow-up (a 40M bucket last: 0.55 ms exposed per backward). Under optim_grads every dense
    parameter is in one group, bucketed in named_parameters order from the embedding (its 525.3M parameters alone in
    the first bucket), whose gradient is the backward's last: its 2.1 GB fp32 reduce-scatter is the one each backward
    waits for at its end."""
    t, ms = _dp_terms(2, last_bucket_chunk=np.array([float(L8B_EMB)]))
    assert t["z2_last_b_ms"][0] == pytest.approx(ms("reduce_scatter", L8B_EMB * 4.0), rel=1e-12)
    rest = math.ceil((L8B_PARAMS - L8B_EMB) / 40e6)
    assert t["z2_n"][0] == 1 + rest and t["z2_bytes"][0] == pytest.approx(L8B_PARAMS * 4.0, rel=1e-12)
    assert t["z2_b_ms"][0] == pytest.approx(t["z2_last_b_ms"][0]
                                            + rest * ms("reduce_scatter", (L8B_PARAMS - L8B_EMB) * 4.0 / rest), rel=1e-12)
    old, _ = _dp_terms(2)
    assert old["z2_last_b_ms"][0] < 0.2 * t["z2_last_b_ms"][0]
    # the audit: the step waits for it in each of its 4 backwards
    z2 = _audit(2)
    assert z2.exposed_comm_split_ms["dp"] > 4 * t["z2_last_b_ms"][0]


def test_root_parameters_are_computed_once_per_chunk_for_memory_and_time(monkeypatch):
    """Fails on the code before stop 46's review fix (the rule written twice: per stage for the memory, per chunk for
    ZeRO-3's once-a-step gathers). One per-chunk computation (``root_params_by_chunk``) feeds both: a prediction calls
    it once, and what it returns moves the stage memory's root parameters and the gathers' bytes alike."""
    import wattcast.simulate.distributed as dist
    from wattcast.simulate.distributed import root_params_by_chunk

    # the chunk's parameters less its blocks', at least 0
    assert root_params_by_chunk(np.array([10.0, 4.0, 7.0]), np.array([3.0, 4.0, 9.0])).tolist() == [7.0, 0.0, 0.0]
    base = _audit(3)
    calls = []
    real = dist.root_params_by_chunk

    def spy(params_c, block_c):
        calls.append(len(params_c))
        return real(params_c, block_c) * 0.5

    monkeypatch.setattr(dist, "root_params_by_chunk", spy)
    half = _audit(3)
    assert calls == [1]  # once (Megatron-FSDP runs pp 1: one chunk)
    monkeypatch.setattr(dist, "root_params_by_chunk", real)
    full = _audit(3)
    # the gathers carry the halved root parameters, and the memory holds fewer of them unsharded
    assert half.comm["dp_zero3_root_gather_bytes_per_step"] == pytest.approx(
        0.5 * full.comm["dp_zero3_root_gather_bytes_per_step"], rel=1e-12)
    assert half.memory_gb < full.memory_gb
    assert base.comm["dp_zero3_root_gather_bytes_per_step"] == pytest.approx(L8B_ROOT * 2.0, rel=1e-12)
