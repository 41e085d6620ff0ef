"""--cp > 1 with --framework hf (the default framework) is refused naming the supported framework: until stop 50 it
silently costed Megatron-Core's context parallelism (Transformer Engine's ring attention) for a Hugging Face step,
where Hugging Face's (Accelerate's ParallelismConfig cp_size over torch's context_parallel: FSDP2, SDPA, K/V
all-gathered by default) is another mechanism (simulate.parallel.HF_CP_MESSAGE)."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.request import ParallelOptions, PredictRequest
from wattcast.simulate.parallel import ParallelConfigError

from conftest import flat, run_cli

KW = dict(gpus=8, batch=8, seq=1024, tp=1, cp=2, attention="flash")


def test_predict_cluster_refuses_cp_under_hf():
    with pytest.raises(ParallelConfigError, match=r"--cp 2 .*use --framework megatron, or --cp 1.*not modelled"):
        wattcast.predict_cluster("gpt2", "dgx-h100", framework="hf", **KW)
    with pytest.raises(ParallelConfigError, match="use --framework megatron"):
        wattcast.predict_cluster("gpt2", "dgx-h100", **KW)  # hf is the default framework
    assert wattcast.predict_cluster("gpt2", "dgx-h100", framework="megatron", **KW).step_time_ms > 0
    assert wattcast.predict_cluster("gpt2", "dgx-h100", framework="hf", **{**KW, "cp": 1}).step_time_ms > 0


def test_request_and_cli_refuse_it_too():
    req = PredictRequest(model="gpt2", cluster="dgx-h100", batch=8, seq=1024, attention="flash",
                         parallel=ParallelOptions(gpus=8, cp=2))
    with pytest.raises(ParallelConfigError, match="use --framework megatron"):
        req.predict()
    r = run_cli("predict", "-m", "gpt2", "--cluster", "dgx-h100", "--gpus", "8", "--cp", "2", "--batch", "8",
                "--seq", "1024", "--attention", "flash", "--framework", "hf")
    assert r.returncode != 0 and "use --framework megatron, or --cp 1" in flat(r.stderr), r.stderr


def test_search_under_hf_tries_no_context_parallelism():
    # at 16,384 tokens the default space tries cp 2, 4 and 8 too (megatron); under hf only cp 1
    kw = dict(attention="flash", tp=(1,), pp=(1,), micro_batch=(1,), zero=(3,), recompute=("full",))
    res = wattcast.search("llama3_8b", "dgx-h100", 8, 8, 16384, framework="hf", **kw)
    assert len(res.ranked) == 1 and set(res.ranked["cp"]) == {1}
