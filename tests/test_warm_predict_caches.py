"""A warm predict re-uses what depends on the graph alone (its kernel table and row hashes, its memory estimate, its
string columns' masks), and those caches never answer for another graph: two models in one process give their own
answers, a graph with other nodes or meta (a new graph: an OpGraph is frozen) is costed again, and a cached mask cannot be written to."""

from __future__ import annotations

import gc
import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import wattcast
from wattcast.data.catalog import resolve_device
from wattcast.featurize import graph_cache
from wattcast.featurize.graph_cache import GraphMemo, column_is, column_values
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.models.kernel_bundle import load_bundle
from wattcast.simulate import memory, single_device as sd

OPTS = StepOptions(batch=2, seq=128, mode="train", dtype="fp16")


def _clear() -> None:
    sd._PLANS.clear()
    memory._MEMORY.clear()
    graph_cache._COLUMNS.clear()


def _json(res) -> str:
    return json.dumps(res.to_dict(nodes=True), default=str, sort_keys=True)


def test_two_models_in_one_process_keep_their_own_answers():
    spec = resolve_device("A100-SXM4-80GB")
    cold = {}
    for m in ("gpt2", "bert_base"):
        _clear()
        cold[m] = _json(wattcast.predict(m, spec, batch=2, seq=128, dtype="fp16"))
    assert cold["gpt2"] != cold["bert_base"]
    for m in ("gpt2", "bert_base", "gpt2", "bert_base"):  # warm, interleaved: every cache holds both graphs
        assert _json(wattcast.predict(m, spec, batch=2, seq=128, dtype="fp16")) == cold[m]
    assert sd._PLANS.hits >= 2 and len(sd._PLANS) >= 2


def test_a_graph_given_other_nodes_or_meta_is_costed_again():
    spec, bundle = resolve_device("A100-SXM4-80GB"), load_bundle()
    g = step_graph("gpt2", OPTS)
    before = sd.cost_nodes(g, spec, bundle)
    # twice the work on every kernel, in a new graph and then in the same graph object given new nodes
    nodes = g.nodes.copy()
    nodes["scale"] = nodes["scale"] * 2.0
    nodes["flops"] = nodes["flops"] * 2.0
    g2 = replace(g, nodes=nodes)
    _clear()
    want = sd.cost_nodes(g2, spec, bundle)
    sd.cost_nodes(g, spec, bundle)  # g's plan is cached again
    assert want["time_ms"].sum() > before["time_ms"].sum()
    pd.testing.assert_frame_equal(sd.cost_nodes(g2, spec, bundle), want)
    pd.testing.assert_frame_equal(sd.cost_nodes(g, spec, bundle), before)
    # the memory estimate follows the graph's meta (another optimizer: other optimizer state)
    sgd = replace(g, meta=dict(g.meta, optimizer="sgd"))
    assert memory.graph_memory(g) == memory.estimate_memory(g)
    assert memory.graph_memory(sgd) == memory.estimate_memory(sgd) != memory.graph_memory(g)


def test_a_graph_memo_entry_goes_with_its_graph():
    memo = GraphMemo(max_entries=4)
    g = step_graph("gpt2", replace(OPTS, seq=96))
    g = replace(g)  # not held by the step-graph cache
    calls = []
    assert memo.get_or_build(g, (g.nodes,), lambda: calls.append(1) or "v") == "v"
    assert memo.get_or_build(g, (g.nodes,), lambda: calls.append(1) or "w") == "v" and len(calls) == 1
    del g
    gc.collect()
    assert len(memo) == 0


def test_cached_column_masks_follow_the_column_and_are_read_only():
    f = pd.DataFrame({"name": ["clip_grad_norm.sq", "layer.0.fc", "loss_scale.unscale"], "op_class": ["x", "memory", "x"],
                      "phase": ["optimizer", "forward", "optimizer"], "time_ms": [1.0, 2.0, 4.0]})
    assert sd.op_part_labels(f).tolist() == ["clip_grad_norm", "memcpy", "loss_scaling"]
    g = f.copy()  # shares f's (immutable) string columns: the same cached masks
    assert column_values(g, "name") is column_values(f, "name")
    g.loc[0, "name"] = "layer.1.fc"
    g.loc[1, "op_class"] = "linear"
    assert sd.op_part_labels(g).tolist() == ["optimizer_step", "", "loss_scaling"]
    assert sd.op_part_labels(f).tolist() == ["clip_grad_norm", "memcpy", "loss_scaling"]
    mask = column_is(f, "op_class", "memory")
    with pytest.raises(ValueError):
        mask[0] = True
    # a column that is not pyarrow-backed is read every call
    h = f.astype({"op_class": object})
    assert column_is(h, "op_class", "memory").tolist() == [False, True, False]
    h.loc[0, "op_class"] = "memory"
    assert column_is(h, "op_class", "memory").tolist() == [True, True, False]
    assert np.array_equal(column_is(f, "op_class", "memory"), [False, True, False])
