"""Megatron-Core's --fp8-param-gather: FP8 weights held without a bf16 copy, cast shard by shard after the optimizer
step and all-gathered by the distributed optimizer at 1 B a parameter."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.simulate.parallel import ParallelConfigError

KW = dict(gpus=8, batch=8, seq=1024, tp=2, pp=1, micro_batch=1, zero=1, sp=True, dtype="fp8", framework="megatron")


def _pair(**kw):
    args = dict(KW, **kw)
    return (wattcast.predict_cluster("llama3_8b", "dgx_h100", **args),
            wattcast.predict_cluster("llama3_8b", "dgx_h100", fp8_param_gather=True, **args))


def test_fp8_parameters_drop_the_bf16_copy_and_halve_the_parameter_gather():
    off, on = _pair(overlap_param_gather=False)
    # the FP8 GEMMs' weights: bf16 (2 B) + Transformer Engine's FP8 weight and transpose (2 B) -> FP8 and transpose
    fp8_copy_gb = off.memory["weights_gb"] - on.memory["weights_gb"]
    assert fp8_copy_gb > 0.4 * off.memory["weights_gb"]  # most of a Llama's parameters are in FP8 GEMMs
    for k in ("master_weights_gb", "gradients_gb", "optimizer_gb", "activations_gb"):
        assert on.memory[k] == pytest.approx(off.memory[k])
    # the all-gather after the step moves about half the bytes (bf16 norms and embeddings stay 2 B)
    assert 0.45 < on.comm["dp_param_gather_ms"] / off.comm["dp_param_gather_ms"] < 0.75
    assert on.comm["dp_sync_ms"] == pytest.approx(off.comm["dp_sync_ms"])  # the gradients' reduce-scatter is bf16/fp32
    assert on.exposed_comm_split_ms["dp"] < off.exposed_comm_split_ms["dp"]
    # the weight cast: each rank its shard of the master weights, then the whole weights' transposes (dp 4)
    assert on.optimizer_ms < off.optimizer_ms
    assert on.meta["settings"]["fp8_param_gather"] is True and off.meta["settings"]["fp8_param_gather"] is False


@pytest.mark.parametrize("kw, needs", [(dict(dtype="bf16"), "--dtype fp8"), (dict(framework="hf"), "--framework megatron"),
                                       (dict(zero=0), "--zero 1 or more")])
def test_what_it_needs_is_named(kw, needs):
    with pytest.raises(ParallelConfigError, match=needs.replace("-", r"\-")):
        wattcast.predict_cluster("llama3_8b", "dgx_h100", fp8_param_gather=True, **dict(KW, **kw))


def test_search_uses_it_where_the_distributed_optimizer_runs():
    def rows(flag):
        res = wattcast.search("llama3_8b", "dgx_h100", 8, 8, 1024, dtype="fp8", framework="megatron",
                              fp8_param_gather=flag, tp=(2,), pp=(1,), micro_batch=(1,), sp=(True,), zero=(0, 1),
                              recompute=("none",), interleave=(1,))
        return res.ranked.set_index("config")

    off, on = rows(False), rows(True)
    z1 = on["zero"] == 1
    assert z1.any() and (~z1).any()
    assert (on.loc[z1, "memory_gb"] < off.loc[on.index[z1], "memory_gb"]).all()
    assert (on.loc[~z1, "memory_gb"] == off.loc[on.index[~z1], "memory_gb"]).all()
    with pytest.raises(ParallelConfigError, match="--dtype fp8"):
        wattcast.search("llama3_8b", "dgx_h100", 8, 8, 1024, dtype="bf16", framework="megatron", fp8_param_gather=True)


def test_a_request_without_a_cluster_is_refused():
    from wattcast.request import PredictRequest

    with pytest.raises(ValueError, match="fp8_param_gather= .* give cluster= too"):
        PredictRequest(model="llama3_8b", device="H100-SXM5-80GB", dtype="fp8", fp8_param_gather=True).predict()
