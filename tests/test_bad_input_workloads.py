"""Bad input for cluster specs, Hugging Face configs and ONNX files: a clear error naming the field and the value
(ClusterSpecError / GraphError), never an unrelated traceback or a silently defaulted number."""

from __future__ import annotations

import copy
import json

import pytest

import wattcast
from wattcast.data.cluster_spec import (ClusterSpecError, cluster_from_dict, from_astra_network, load_cluster_file,
                                        resolve_cluster)
from wattcast.featurize.hf_config import load_hf_config
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph

DEVICE = "H100-SXM5-80GB"
CLUSTER = dict(name="x", device=DEVICE, gpus_per_node=8, source="test",
               intra=dict(kind="nvswitch", bandwidth_gb_per_s=450, latency_us=3),
               inter=dict(kind="infiniband", nics_per_node=8, nic_bandwidth_gbit_per_s=400, latency_us=5))
ASTRA = {"topology": ["Switch", "Switch"], "npus_count": [8, 2], "bandwidth": [300, 50], "latency": [500, 2000]}


def _cluster(**changes):
    d = copy.deepcopy(CLUSTER)
    for path, v in changes.items():
        *head, last = path.split("__")
        node = d
        for h in head:
            node = node[h]
        node[last] = v
    return d


def _builtin(name: str, **changes) -> dict:
    cfg = load_hf_config(name).raw
    return dict(cfg, **changes)


# ------------------------------------------------------------------ 1. cluster YAML: type confusions
def test_redteam_cluster_yaml_with_intra_list(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\ndevice: H100-SXM5-80GB\ngpus_per_node: 8\nintra: [1, 2]\n"
                 "inter: {kind: infiniband, nics_per_node: 8, nic_bandwidth_gbit_per_s: 400, latency_us: 5}\n")
    with pytest.raises(ClusterSpecError, match=r"bad\.yaml.*field 'intra' must be a mapping.*\[1, 2\]"):
        load_cluster_file(p)
    with pytest.raises(ClusterSpecError, match=r"field 'intra' must be a mapping"):
        resolve_cluster(str(p))


@pytest.mark.parametrize("changes,msg", [
    (dict(intra=[1, 2]), r"field 'intra' must be a mapping.*\[1, 2\]"),
    (dict(inter=[1, 2]), r"field 'inter' must be a mapping.*\[1, 2\]"),
    (dict(intra="nvswitch"), r"field 'intra' must be a mapping.*'nvswitch'"),
    (dict(inter={}), r"required field\(s\) inter.kind, inter.nics_per_node"),
    (dict(intra__extra=1), r"unknown field\(s\) intra.extra"),
    (dict(gpus_per_node="8"), r"field 'gpus_per_node' must be a number, got '8'"),
    (dict(gpus_per_node=True), r"field 'gpus_per_node' must be a number, got True"),
    (dict(gpus_per_node=[8]), r"field 'gpus_per_node' must be a number, got \[8\]"),
    (dict(gpus_per_node=8.5), r"field 'gpus_per_node' must be a whole number, got 8.5"),
    (dict(intra__bandwidth_gb_per_s="450"), r"field 'intra.bandwidth_gb_per_s' must be a number, got '450'"),
    (dict(inter__latency_us=[5]), r"field 'inter.latency_us' must be a number, got \[5\]"),
    (dict(inter__oversubscription="2"), r"field 'inter.oversubscription' must be a number, got '2'"),
    (dict(inter__rail_optimized="false"), r"field 'inter.rail_optimized' must be true or false, got 'false'"),
    (dict(max_nodes="4"), r"field 'max_nodes' must be a number, got '4'"),
    (dict(name=["x"]), r"field 'name' must be a string, got \['x'\]"),
    (dict(device=["H100"]), r"field 'device' must be a string"),
    (dict(aliases="dgx"), r"field 'aliases' must be a list of names, got 'dgx'"),
    (dict(aliases=[1]), r"field 'aliases' must be a list of names"),
    (dict(sources=["a"]), r"field 'sources' must be a mapping"),
    (dict(sources={"intra.latency_us": 3}), r"field 'sources' must map field names to source strings"),
    (dict(source=["s"]), r"field 'source' must be a string"),
    (dict(schema_version="1"), r"field 'schema_version' is '1'"),
])
def test_cluster_type_confusions_name_the_field(changes, msg):
    with pytest.raises(ClusterSpecError, match=msg):
        cluster_from_dict(_cluster(**changes))


def test_cluster_non_string_keys_are_unknown_fields():
    d = _cluster()
    d[1] = 2
    with pytest.raises(ClusterSpecError, match=r"unknown field\(s\) 1;"):
        cluster_from_dict(d)
    d = _cluster()
    d["intra"][1] = 2
    with pytest.raises(ClusterSpecError, match=r"unknown field\(s\) intra.1;"):
        cluster_from_dict(d)


def test_cluster_whole_floats_become_ints_and_valid_specs_are_unchanged():
    c = cluster_from_dict(_cluster(gpus_per_node=8.0, inter__nics_per_node=8.0, max_nodes=4.0))
    assert (c.gpus_per_node, c.inter.nics_per_node, c.max_nodes) == (8, 8, 4)
    assert all(isinstance(v, int) for v in (c.gpus_per_node, c.inter.nics_per_node, c.max_nodes))
    assert cluster_from_dict(_cluster(inter=None)).inter is None
    assert resolve_cluster("dgx-h100").gpus_per_node == 8


# ------------------------------------------------------------------ 2. ASTRA-sim network YAML
@pytest.mark.parametrize("changes,msg", [
    (dict(npus_count=[8.7, 2]), r"'npus_count\[0\]' must be a whole number of NPUs, got 8.7"),
    (dict(npus_count=[8, 2.5]), r"'npus_count\[1\]' must be a whole number of NPUs, got 2.5"),
    (dict(npus_count=["8", 2]), r"'npus_count\[0\]' must be a number, got '8'"),
    (dict(npus_count=[True, 2]), r"'npus_count\[0\]' must be a number, got True"),
    (dict(npus_count=[8, 0]), r"'npus_count\[1\]' must be positive, got 0"),
    (dict(bandwidth=["300", 50]), r"'bandwidth\[0\]' must be a number, got '300'"),
    (dict(latency=[[500], 2000]), r"'latency\[0\]' must be a number"),
    (dict(topology="Switch"), r"field 'topology' must be a list"),
    (dict(topology=[1, "Switch"]), r"'topology\[0\]' must be a topology name"),
    (dict(npus_count=[8]), r"must have the same length"),
    (dict(device=["H100"]), r"field 'device' must be a string"),
])
def test_astra_network_bad_values(changes, msg):
    d = {**ASTRA, "device": DEVICE, **changes}
    with pytest.raises(ClusterSpecError, match=msg):
        cluster_from_dict(d)


def test_astra_network_whole_float_counts_are_accepted():
    c = from_astra_network(dict(ASTRA, npus_count=[8.0, 2.0]), device=DEVICE)
    assert (c.gpus_per_node, c.max_nodes) == (8, 2) and isinstance(c.gpus_per_node, int)


def test_astra_network_device_override_reaches_cluster_loading(tmp_path):
    p = tmp_path / "astra_nodev.yaml"
    p.write_text(json.dumps(ASTRA))
    with pytest.raises(ClusterSpecError, match="names no GPU"):
        resolve_cluster(str(p))
    assert resolve_cluster(str(p), device=DEVICE).device == DEVICE
    assert load_cluster_file(p, device=DEVICE).device == DEVICE
    assert cluster_from_dict(ASTRA, device=DEVICE).gpus_per_node == 8
    # the override also replaces a preset's GPU (as --device does for a distributed prediction)
    assert resolve_cluster("dgx-h100", device="A100-SXM4-80GB").device == "A100-SXM4-80GB"
    assert resolve_cluster("dgx-h100").device == DEVICE


def test_astra_network_device_override_end_to_end(tmp_path):
    p = tmp_path / "astra_nodev.yaml"
    p.write_text(json.dumps(ASTRA))
    from wattcast.simulate.distributed import predict_distributed
    from wattcast.simulate.options import DistributedOptions
    from wattcast.simulate.parallel import ParallelConfig

    r = predict_distributed("gpt2", str(p), ParallelConfig(gpus=8), DistributedOptions(batch=8, seq=128, device=DEVICE))
    assert r.step_time_ms > 0


# ------------------------------------------------------------------ 3. mixture-of-experts counts: 0 is not "absent"
@pytest.mark.parametrize("field", ["num_local_experts", "num_experts_per_tok"])
@pytest.mark.parametrize("value,msg", [(0, "must be a positive integer, got 0"), (-2, "must be a positive integer, got -2"),
                                       (2.5, "must be an integer, got 2.5"), ("8", "must be an integer, got '8'"),
                                       (True, "must be an integer, got True")])
def test_mixtral_expert_counts_must_be_positive_integers(field, value, msg):
    cfg = _builtin("mixtral_8x7b", **{field: value})
    with pytest.raises(GraphError, match=f"field '{field}' {msg}"):
        load_hf_config(cfg)
    with pytest.raises(GraphError, match=f"field '{field}'"):
        wattcast.predict(cfg, DEVICE, batch=1, seq=128)


def test_mixtral_top_k_above_the_expert_count():
    with pytest.raises(GraphError, match=r"field 'num_experts_per_tok' \(4\) must be between 1 and .*num_local_experts=2"):
        load_hf_config(_builtin("mixtral_8x7b", num_local_experts=2, num_experts_per_tok=4))


def test_mixtral_defaults_only_when_the_field_is_absent():
    cfg = _builtin("mixtral_8x7b")
    cfg.pop("num_local_experts")
    cfg.pop("num_experts_per_tok")
    assert load_hf_config(cfg).n_experts == 8  # the number the graph builds (MixtralConfig's default)
    full = step_graph("mixtral_8x7b", StepOptions(batch=1, seq=128, blocks=1))
    assert step_graph(cfg, StepOptions(batch=1, seq=128, blocks=1)).param_count == full.param_count
    fewer = step_graph(_builtin("mixtral_8x7b", num_local_experts=4), StepOptions(batch=1, seq=128, blocks=1))
    assert fewer.param_count < full.param_count


@pytest.mark.parametrize("field,value,msg", [
    ("num_experts", 0, "must be a positive integer, got 0"),
    ("num_experts", "8", "must be an integer, got '8'"),
    ("expert_capacity", 0, "must be a positive integer, got 0"),
    ("expert_capacity", 12.5, "must be an integer, got 12.5"),
    ("num_decoder_layers", 0, "must be a positive integer, got 0"),
    ("encoder_sparse_step", -1, "must be an integer >= 0, got -1"),
    ("num_sparse_decoder_layers", "6", "must be an integer, got '6'"),
    ("relative_attention_num_buckets", 0, "must be a positive integer, got 0"),
    ("dropout_rate", "x", "must be a number between 0 and 1, got 'x'"),
    ("dropout_rate", 1.5, "must be a number between 0 and 1, got 1.5"),
])
def test_switch_fields_name_the_field(field, value, msg):
    cfg = _builtin("switch_base_8", **{"num_layers": 2, "num_decoder_layers": 2, field: value})
    for attention in ("eager", "flash"):
        with pytest.raises(GraphError, match=f"field '{field}' {msg}"):
            wattcast.predict(cfg, DEVICE, batch=1, seq=128, attention=attention)


def test_switch_zero_dropout_means_no_dropout():
    cfg = _builtin("switch_base_8", num_layers=2, num_decoder_layers=2)
    with_p = step_graph(cfg, StepOptions(batch=1, seq=64, mode="train"))
    without = step_graph(dict(cfg, dropout_rate=0.0), StepOptions(batch=1, seq=64, mode="train"))
    assert len(without) < len(with_p)  # dropout_rate 0 used to fall back to 0.1


def test_switch_sparse_step_zero_is_dense_as_in_transformers():
    cfg = _builtin("switch_base_8", num_layers=2, num_decoder_layers=2)
    sparse = step_graph(cfg, StepOptions(batch=1, seq=64))
    dense = step_graph(dict(cfg, encoder_sparse_step=0, decoder_sparse_step=0), StepOptions(batch=1, seq=64))
    assert dense.param_count < sparse.param_count


# ------------------------------------------------------------------ 4. boolean fields are JSON booleans
@pytest.mark.parametrize("model", ["gpt2", "llama2_7b", "mixtral_8x7b", "switch_base_8", "opt_1.3b", "bloom_560m"])
@pytest.mark.parametrize("value", ["yes", "false", 1, 0])
def test_tie_word_embeddings_must_be_a_boolean(model, value):
    with pytest.raises(GraphError, match=f"field 'tie_word_embeddings' must be true or false, got {value!r}"):
        wattcast.predict(_builtin(model, tie_word_embeddings=value), DEVICE, batch=1, seq=128)


@pytest.mark.parametrize("model,field", [("falcon_7b", "multi_query"), ("falcon_7b", "parallel_attn"),
                                         ("pythia_160m", "use_parallel_residual"), ("opt_1.3b", "do_layer_norm_before"),
                                         ("llama2_7b", "attention_bias"), ("switch_base_8", "router_bias"),
                                         ("mpt_7b", "no_bias")])
def test_other_boolean_fields(model, field):
    with pytest.raises(GraphError, match=f"field '{field}' must be true or false, got 'no'"):
        wattcast.predict(_builtin(model, **{field: "no"}), DEVICE, batch=1, seq=128)


def test_mpt_nested_boolean_and_dropout():
    attn = dict(load_hf_config("mpt_7b").raw["attn_config"])
    with pytest.raises(GraphError, match=r"field 'attn_config.alibi' must be true or false, got 'yes'"):
        wattcast.predict(_builtin("mpt_7b", attn_config=dict(attn, alibi="yes")), DEVICE, batch=1, seq=128)
    with pytest.raises(GraphError, match=r"field 'attn_config.attn_pdrop' must be a number between 0 and 1"):
        wattcast.predict(_builtin("mpt_7b", attn_config=dict(attn, attn_pdrop="0.1")), DEVICE, batch=1, seq=128)


def test_tied_flag_true_false_still_work():
    t = step_graph(_builtin("llama2_7b", tie_word_embeddings=True), StepOptions(batch=1, seq=64, blocks=1))
    u = step_graph(_builtin("llama2_7b", tie_word_embeddings=False), StepOptions(batch=1, seq=64, blocks=1))
    assert t.param_count < u.param_count


# ------------------------------------------------------------------ other config numbers
@pytest.mark.parametrize("model,field,value,msg", [
    ("gpt2", "embd_pdrop", "0.1", "must be a number between 0 and 1, got '0.1'"),
    ("gpt2", "attn_pdrop", 1.5, "must be a number between 0 and 1, got 1.5"),
    ("pythia_160m", "rotary_pct", 2, "must be a number between 0 and 1, got 2"),
    ("opt_1.3b", "word_embed_proj_dim", 0, "must be a positive integer, got 0"),
    ("bert_base", "type_vocab_size", 0, "must be a positive integer, got 0"),
])
def test_other_fields_name_the_field(model, field, value, msg):
    with pytest.raises(GraphError, match=f"field '{field}' {msg}"):
        wattcast.predict(_builtin(model, **{field: value}), DEVICE, batch=1, seq=128)


def test_required_counts_reject_booleans():
    with pytest.raises(GraphError, match=r"n_layer must be an integer, got True"):
        load_hf_config(_builtin("gpt2", n_layer=True))


# ------------------------------------------------------------------ 5. learned absolute positions
@pytest.mark.parametrize("value,msg", [(0, "must be a positive integer, got 0"), (-1, "must be a positive integer, got -1"),
                                       ("128", "must be an integer, got '128'"), (12.5, "must be an integer, got 12.5")])
def test_max_positions_must_be_a_positive_integer(value, msg):
    with pytest.raises(GraphError, match=f"n_positions {msg}"):
        load_hf_config(_builtin("gpt2", n_positions=value))


@pytest.mark.parametrize("model", ["gpt2", "opt_1.3b", "bert_base", "mpt_7b"])
def test_learned_position_families_reject_longer_sequences(model):
    cfg = _builtin(model)
    for k in ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"):
        if k in cfg:
            cfg[k] = 128
    with pytest.raises(GraphError, match="seq 256 exceeds the model's"):
        wattcast.predict(cfg, DEVICE, batch=1, seq=256)


# ------------------------------------------------------------------ 6. ONNX file without nodes
def test_onnx_graph_without_nodes(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from wattcast.featurize.onnx import graph_from_onnx

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    model = helper.make_model(helper.make_graph([], "empty", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    p = tmp_path / "empty.onnx"
    onnx.save(model, str(p))
    with pytest.raises(GraphError, match="has no nodes"):
        graph_from_onnx(p)
    with pytest.raises(GraphError, match="has no nodes"):
        graph_from_onnx(model)
    with pytest.raises(GraphError, match="has no nodes"):
        wattcast.predict(str(p), DEVICE)


# ------------------------------------------------------------------ the Python API's step options
@pytest.mark.parametrize("kw, needle", [
    (dict(batch=2.5), "batch must be a positive whole number"),
    (dict(batch="2"), "batch must be a positive whole number"),
    (dict(batch=True), "batch must be a positive whole number"),
    (dict(seq=0), "seq must be a positive whole number"),
    (dict(batch=10**12, seq=128), "tokens in one step"),
    (dict(compile="false"), "compile must be True or False"),
    (dict(grad_accumulation="x"), "grad_accumulation must be True or False"),
    (dict(dims=[1, 2]), "dims must map input dim names"),
])
def test_predict_options_are_checked_not_coerced(kw, needle):
    import wattcast

    with pytest.raises(GraphError, match=needle):
        wattcast.predict("gpt2", "A10", **kw)


def test_predict_takes_numpy_counts_and_module_example_inputs():
    import numpy as np
    import torch

    import wattcast

    a = wattcast.predict("gpt2", "A10", batch=np.int64(2), seq=np.int32(128)).step_time_ms
    assert a == wattcast.predict("gpt2", "A10", batch=2, seq=128).step_time_ms
    layer = torch.nn.TransformerEncoderLayer(256, 4, batch_first=True)
    x = torch.randn(8, 128, 256, device="meta")
    r = wattcast.predict(layer, "A100-SXM4-80GB", example_inputs=(x,))
    assert r.step_time_ms > 0 and r.meta["batch"] == 8
    with pytest.raises(GraphError, match="not both"):
        wattcast.predict(layer, "A100-SXM4-80GB", example_inputs=(x,), batch=8)
    with pytest.raises(GraphError, match="torch.nn.Module"):
        wattcast.predict("gpt2", "A10", example_inputs=(x,))


def test_t5_relative_position_bias_is_part_of_the_model_with_any_attention_kernel():
    """The bias table is a parameter and its lookups run whatever the attention kernel (flash is the default now): the
    parameter count does not depend on the kernel (a bad bucket count is named with flash too: the test above)."""
    eager = wattcast.predict("switch_base_8", DEVICE, batch=1, seq=128, attention="eager")
    flash = wattcast.predict("switch_base_8", DEVICE, batch=1, seq=128, attention="flash")
    assert eager.meta["param_count"] == flash.meta["param_count"]
