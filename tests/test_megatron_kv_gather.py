"""TP larger than the key/value group count under Megatron-Core (megatron-core 0.16.1): ``num_query_groups`` must be a
multiple or a divisor of TP (transformer_config.py l. 939-945). With fewer groups than ranks, ``linear_qkv`` stays split
over the ranks (its output features / tp, ColumnParallelLinear, attention.py l. 1264-1275), its output is all-gathered
along the features and each rank takes one group's q/k/v, of whose query heads it keeps nh / tp (l. 289-296,
1398-1415, 1466-1476). Until stop 47 such a TP was refused ("key/value heads (8) must be divisible by tp (16)")."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.featurize.hf_config import load_hf_config
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.memory import activation_bytes_by_layer
from wattcast.simulate.parallel import ParallelConfig, ParallelConfigError, resolve_parallel

S = 2048


def _resolve(tp, kv, heads=64, framework="megatron"):
    return resolve_parallel(ParallelConfig(gpus=tp * 2, tp=tp, pp=1, micro_batch=1), batch=8, n_layers=8,
                            n_heads=heads, n_kv_heads=kv, ffn=28672, framework=framework)


def test_megatron_takes_tp_a_multiple_of_the_kv_groups_and_names_the_rule_otherwise():
    assert _resolve(16, 8).tp == 16
    with pytest.raises(ParallelConfigError, match="multiple or a divisor of tp .*transformer_config.py"):
        _resolve(12, 8, heads=96)  # 8 groups, 12 ranks: neither divides the other
    with pytest.raises(ParallelConfigError, match="must be divisible by tp"):
        _resolve(16, 8, framework="hf")  # the Hugging Face path splits the heads


def _graph(tp, recompute="selective"):
    return step_graph("llama3_70b", StepOptions(batch=1, seq=S, mode="train", dtype="bf16", attention="flash",
                                                recompute=recompute, framework="megatron", tp=tp, sp=True), blocks=3)


def test_each_rank_gathers_the_qkv_output_and_attends_with_one_kv_head():
    c = load_hf_config("llama3_70b")
    cols = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim
    n = _graph(16).nodes
    layer = n[(n["phase"] == "forward") & (n["layer"] == 1)].set_index("name")
    assert layer.loc["self_attention.linear_qkv", "param_count"] == c.hidden * cols / 16  # split, not replicated
    assert layer.loc["self_attention.linear_qkv", "flops"] == pytest.approx(2 * S * c.hidden * cols / 16, rel=1e-12)
    assert layer.loc["self_attention.qkv_all_gather", "bytes"] == S * cols * 2  # the whole output, bf16
    # the attention of nh / tp query heads, as at tp 8 with half the heads
    flash8 = _graph(8).nodes.query("phase == 'forward' and layer == 1 and name == 'attn.flash'")["flops"].iloc[0]
    assert layer.loc["attn.flash", "flops"] == pytest.approx(flash8 / 2, rel=1e-12)


def test_selective_recomputation_holds_the_gathered_qkv_output():
    """The checkpointed core attention holds its arguments as they sit in memory (tensor_parallel/random.py l. 528):
    the value is a view of the gathered output (t x 2(1 + 2 kv/a) sbh/t), beside the rotated query (2) and the one
    key head (2 t/a)."""
    c = load_hf_config("llama3_70b")
    t, a, kv, h = 16, c.n_heads, c.n_kv_heads, c.hidden
    per, _ = activation_bytes_by_layer(_graph(t))
    want = 10 + 6 * c.ffn / h + 2 * t * (1 + 2 * kv / a) + 2 + 2 * t / a
    assert per[1] / (S * h / t) == pytest.approx(want, rel=1e-9)


def test_predict_runs_llama3_70b_at_tp16():
    kw = dict(gpus=32, batch=8, seq=S, pp=2, micro_batch=1, sp=True, zero=1, framework="megatron", dtype="bf16",
              attention="flash")
    r16 = wattcast.predict_cluster("llama3_70b", "DGX-H100", tp=16, **kw)
    r8 = wattcast.predict_cluster("llama3_70b", "DGX-H100", tp=8, **dict(kw, gpus=16))
    # half the parameters a rank (the vocabulary padded to 128 x tp: within 1e-3), the same model FLOPs
    assert r16.per_device[0]["params"] == pytest.approx(r8.per_device[0]["params"] / 2, rel=1e-3)
    assert r16.step_time_ms > 0 and r16.flops == pytest.approx(r8.flops, rel=1e-3)
