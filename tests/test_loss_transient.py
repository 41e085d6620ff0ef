"""The largest kernel's working set (the loss's, for a language model) on one device and on every pipeline stage of a
cluster (audit 55b #1): until stop 55 ``predict`` added it and ``predict_cluster`` / ``search`` did not, so a one-GPU
cluster of GPT-2 at batch 96 x 1,024 tokens "fitted" an A100 80GB at 67.4 GB where ``predict`` said 86.7 GB."""

import warnings

import pytest

import wattcast

GPT2_VOCAB = 50257
GPT2_PADDED_MEGATRON = 50304  # Megatron pads to a multiple of 128 at TP 1


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_loss_working_bytes_per_framework():
    from wattcast.featurize.op_graph import loss_working_bytes
    n = 1e6
    # PyTorch's fp32 cross-entropy (Hugging Face's ForCausalLMLoss upcasts): 12 bytes a logit at its backward peak,
    # less the logits the graph saves in their dtype
    assert loss_working_bytes(n, 2, fp32_saved=False, fused=None) == 10 * n
    assert loss_working_bytes(n, 4, fp32_saved=False, fused=None) == 8 * n
    # Megatron-Core: the logits (or the cast gradient) beside the fp32 probabilities it saves, unfused and fused
    for fused in (None, "native", "te"):
        assert loss_working_bytes(n, 2, fp32_saved=True, fused=fused) == 2 * n
    assert loss_working_bytes(n, 4, fp32_saved=True, fused=None) == 0.0  # in place in the fp32 logits
    assert loss_working_bytes(n, 4, fp32_saved=True, fused="te") == 4 * n  # TE's copy beside the logits


def test_one_gpu_cluster_carries_predicts_transient():
    a = wattcast.predict("gpt2", "A100-SXM4-80GB", batch=8, seq=1024)
    c = wattcast.predict_cluster("gpt2", "dgx-a100", gpus=1, batch=8, seq=1024)
    assert a.step_time_ms == pytest.approx(c.step_time_ms, rel=1e-12)
    # the hf loss's 10 bytes a logit (bf16), the largest working set of the step, on both paths
    assert a.memory.transient_gb == pytest.approx(10 * 8 * 1024 * GPT2_VOCAB / 1e9)
    assert c.memory["transient_gb"] == pytest.approx(a.memory.transient_gb)
    assert c.per_device[0]["transient_gb"] == pytest.approx(a.memory.transient_gb)
    # the rest: the cluster's CUDA context and cuBLAS workspace (0.53 GB) only
    assert c.memory_gb - a.memory_gb == pytest.approx(c.memory["buffers_gb"], abs=1e-6)


def test_audit_case_no_longer_fits_on_the_cluster_path():
    a = wattcast.predict("gpt2", "A100-SXM4-80GB", batch=96, seq=1024)
    c = wattcast.predict_cluster("gpt2", "dgx-a100", gpus=1, batch=96, seq=1024)
    assert not a.fits and not c.fits
    assert c.memory_gb > a.memory_gb > 100  # 116.3 / 116.9 GB (was 86.7 / 67.4)


def test_search_prunes_by_the_same_figure():
    res = wattcast.search("gpt2", "dgx-a100", 1, 96, 1024, tp=[1], pp=[1], micro_batch=[96], zero=[0])
    rows = res.ranked[res.ranked["recompute"] == "none"]
    assert len(rows), "the search returned no row"
    c = wattcast.predict_cluster("gpt2", "dgx-a100", gpus=1, batch=96, seq=1024)
    assert rows["memory_gb"].min() == pytest.approx(c.memory_gb)
    assert not rows["fits"].any()  # 116.9 GB (was 67.4 GB, "fits")


def test_megatron_last_stage_carries_its_loss_per_vocab_shard():
    mb, seq, tp = 2, 2048, 2
    c = wattcast.predict_cluster("llama3_8b", "dgx-h100", gpus=8, tp=tp, pp=2, batch=16, seq=seq, micro_batch=mb,
                                 framework="megatron")
    first, last = c.per_device[0]["transient_gb"], c.per_device[-1]["transient_gb"]
    vocab_shard = 128256 // tp
    # the output layer's GEMM (its input and the bf16 logits shard) or the loss's bf16 logits beside its fp32 buffer
    assert last >= 2 * mb * seq * vocab_shard / 1e9
    assert last < 2 * 2 * mb * seq * vocab_shard / 1e9
    assert first < last
