"""predict_distributed / schedule_context take (model, cluster, parallel, DistributedOptions); the old keyword form
builds the same options object and gives the same figures; mixing the forms or a wrong keyword is a TypeError."""

from __future__ import annotations

import dataclasses
import json

import pytest

from wattcast.simulate.distributed import predict_distributed, schedule_context
from wattcast.simulate.options import OPTION_NAMES, DistributedOptions
from wattcast.simulate.parallel import ParallelConfig


def _same(a, b) -> bool:
    return json.dumps(a.to_dict(), sort_keys=True, default=str) == json.dumps(b.to_dict(), sort_keys=True, default=str)


def test_keyword_form_and_options_form_agree():
    par = ParallelConfig(gpus=8, tp=2, pp=2, micro_batch=1, zero=1)
    opts = DistributedOptions(batch=16, seq=256, dtype="fp16", attention="eager", framework="megatron", trace=True)
    new = predict_distributed("gpt2", "DGX-A100", par, opts)
    old = predict_distributed("gpt2", "DGX-A100", gpus=8, batch=16, seq=256, parallel=ParallelConfig(tp=2, pp=2, micro_batch=1, zero=1),
                              dtype="fp16", attention="eager", framework="megatron", trace=True)
    assert _same(new, old) and new.events == old.events
    assert new.step_time_ms > 0 and new.parallel.tp == 2 and new.exposed_comm_split_ms
    # the keyword form's gpus= sets the strategy's GPU count; parallel=None is ParallelConfig(gpus=gpus)
    assert _same(predict_distributed("gpt2", "DGX-A100", gpus=8, batch=16, seq=256),
                 predict_distributed("gpt2", "DGX-A100", ParallelConfig(gpus=8), DistributedOptions(batch=16, seq=256)))
    # an option changes the figures (the object is read, not ignored)
    split = predict_distributed("gpt2", "DGX-A100", par, dataclasses.replace(opts, comm_split=False, trace=False))
    assert split.exposed_comm_split_ms == {} and split.step_time_ms == new.step_time_ms


def test_schedule_context_takes_the_same_object():
    par = ParallelConfig(gpus=4, tp=2)
    opts = DistributedOptions(batch=8, seq=128, prune_oom=True, exact_pipeline=False, comm_split=False)
    ctx = schedule_context("gpt2", "DGX-A100", par, opts)
    assert ctx.prune_oom and not ctx.exact_pipeline and not ctx.comm_split and ctx.par.tp == 2 and ctx.batch == 8
    old = schedule_context("gpt2", "DGX-A100", gpus=4, batch=8, seq=128, parallel=ParallelConfig(tp=2), prune_oom=True,
                           exact_pipeline=False, comm_split=False)
    assert (old.par, old.n_micro, old.seq, old.dtype, old.prune_oom) == (ctx.par, ctx.n_micro, ctx.seq, ctx.dtype, ctx.prune_oom)


def test_options_name_every_old_keyword():
    assert set(OPTION_NAMES) == {"batch", "seq", "dtype", "attention", "compile", "optimizer", "framework", "device",
                                 "trace", "host_ms", "power_limit_w", "clock_cap_mhz", "comm_split", "prune_oom",
                                 "exact_pipeline", "loop_trip_count", "moe_load_imbalance", "moe_capacity_factor",
                                 "moe_pad_to_capacity", "moe_token_dispatcher", "zero3_prefetch", "scatter_gather_p2p", "fsdp_reduce_dtype", "grad_accum_dtype",
                                 "deepspeed_clear_lp_grads",
                                 "fp8_param_gather", "fp8_recipe", "mtp_num_layers",
                                 "cross_entropy_loss_fusion",
                                 "cross_entropy_fusion_impl", "data_load_ms", "data_workers", "bundle", "coll_model",
                                 "power_model", "optimizer_impl", "split_headroom_gb", "host_us"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        DistributedOptions(batch=1, seq=8).seq = 16


@pytest.mark.parametrize("call, match", [
    (lambda: predict_distributed("gpt2", "DGX-A100", ParallelConfig(gpus=8), DistributedOptions(batch=8, seq=64), dtype="fp16"),
     "either in options= or as keywords.*dtype"),
    (lambda: predict_distributed("gpt2", "DGX-A100", ParallelConfig(gpus=8), DistributedOptions(batch=8, seq=64), gpus=8),
     "not both.*gpus.*parallel.gpus"),
    (lambda: predict_distributed("gpt2", "DGX-A100", None, DistributedOptions(batch=8, seq=64)), "ParallelConfig"),
    (lambda: predict_distributed("gpt2", "DGX-A100", ParallelConfig(gpus=8), {"batch": 8, "seq": 64}),
     "options must be a DistributedOptions, got dict"),
    (lambda: predict_distributed("gpt2", "DGX-A100", gpus=8, batch=8, seq=64, dtpye="fp16"), "unexpected keyword.*dtpye"),
    (lambda: predict_distributed("gpt2", "DGX-A100", batch=8, seq=64), "missing required keyword.*gpus"),
    (lambda: schedule_context("gpt2", "DGX-A100", gpus=8, seq=64), "schedule_context.*missing.*batch"),
])
def test_bad_calls_name_the_argument(call, match):
    with pytest.raises(TypeError, match=match):
        call()
