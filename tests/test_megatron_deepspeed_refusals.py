"""--framework megatron-deepspeed refuses the Megatron-Core options it does not have: ring context parallelism (--cp;
its long-sequence option is DeepSpeed-Ulysses) and Megatron-Core's first/last pipeline stage layer counts (DeepSpeed's
PipelineModule partitions the stages itself). Until stop 48 both were accepted and costed as Megatron-Core runs them;
search generated cp > 1 candidates for it by default."""

from __future__ import annotations

import json

import pytest

import wattcast
from conftest import run_cli
from wattcast.planning.search import search
from wattcast.simulate.parallel import ParallelConfigError

KW = dict(gpus=16, batch=8, seq=2048, tp=4, micro_batch=1, framework="megatron-deepspeed", attention="flash")


@pytest.mark.parametrize("kw,flag", [
    (dict(cp=2), "--cp 2"),
    (dict(pp=2, pp_first_stage_layers=13), "--pp-first-stage-layers 13"),
    (dict(pp=2, pp_last_stage_layers=13), "--pp-last-stage-layers 13"),
])
def test_megatron_deepspeed_refuses_megatron_core_only_flags(kw, flag):
    with pytest.raises(ParallelConfigError, match=f"{flag}.*Megatron-Core option.*megatron-deepspeed"):
        wattcast.predict_cluster("gpt3_xl", "DGX-H100", **KW, **kw)
    # Megatron-Core itself takes them
    r = wattcast.predict_cluster("gpt3_xl", "DGX-H100", **dict(KW, framework="megatron"), **kw)
    assert r.step_time_ms > 0


def test_megatron_deepspeed_cli_names_flag_and_framework():
    r = run_cli("predict", "--model", "gpt3_xl", "--cluster", "DGX-H100", "--gpus", "16", "--batch", "8", "--seq", "2048",
                "--tp", "4", "--pp", "2", "--pp-first-stage-layers", "13", "--framework", "megatron-deepspeed",
                "--attention", "flash")
    assert r.returncode == 2
    assert "--pp-first-stage-layers" in r.stderr and "megatron-deepspeed" in r.stderr and "PipelineModule" in r.stderr


def test_search_generates_no_cp_for_megatron_deepspeed(tmp_path):
    # a GPT (the model family megatron-deepspeed builds) with positions for 16,384 tokens
    model = tmp_path / "config.json"
    model.write_text(json.dumps(dict(model_type="gpt2", n_embd=1024, n_layer=4, n_head=16, n_positions=32768,
                                     vocab_size=50257, activation_function="gelu_new")))
    model = str(model)
    common = dict(dtype="bf16", attention="flash", tp=8, pp=1, micro_batch=1, zero=1, sp=True, recompute="selective",
                  interleave=1, workers=1)
    # 16,384 tokens: the default space tries cp 2 too (Megatron-Core's ring)
    mcore = search(model, "DGX-H100", 16, 8, 16384, framework="megatron", **common)
    assert 2 in set(mcore.ranked["cp"])
    ds = search(model, "DGX-H100", 16, 8, 16384, framework="megatron-deepspeed", **common)
    assert set(ds.ranked["cp"]) == {1} and not ds.rejected["config"].astype(str).str.contains("cp").any()
    # asked for, it is rejected naming the rule
    asked = search(model, "DGX-H100", 16, 8, 16384, framework="megatron-deepspeed", cp=(1, 2), **common)
    rule = asked.rejected.loc[asked.rejected["config"].astype(str).str.contains("cp2"), "rule"].tolist()
    assert rule and all("Megatron-Core option" in x for x in rule)
