"""The JSON's figures agree with each other and with the trace (audit of stop 44): a served TP group's all-GPU figures
are in the JSON, a cluster's forward_ms / backward_ms are the scheduled tasks the trace draws, per_device carries the
memory block's master weights and unsharded gradients, and per_layer with outside_layers adds up to the step."""

from __future__ import annotations

import json
import re

import pytest

import wattcast


def test_served_tp_group_json_carries_the_groups_energy_and_power():
    r = wattcast.predict_cluster("llama2_7b", "dgx-a100", device="A100-SXM4-40GB", gpus=2, tp=2, batch=16, seq=1,
                                 dtype="bf16", attention="flash", kv_context=256)
    d = json.loads(json.dumps(r.to_dict()))
    tp = d["tensor_parallel"]
    assert tp["tp"] == 2 and tp["gpus"] == 2
    # energy_j / avg_power_w are one GPU's; the block has the group's
    assert tp["energy_all_gpus_j"] == pytest.approx(2 * d["energy_j"], rel=1e-12)
    assert tp["avg_power_all_gpus_w"] == pytest.approx(2 * d["avg_power_w"], rel=1e-12)
    assert tp["collectives"]["all_reduce"]["count"] > 0 and tp["collective_ms"] > 0
    assert "tensor_parallel" not in wattcast.predict("gpt2", "H100", batch=1, seq=128, mode="inference").to_dict()


def _trace_phase_ms(events: list[dict]) -> dict:
    out = {"F": 0.0, "B": 0.0}
    for e in events:
        m = re.fullmatch(r"([FB])\d+(\.c\d+)?", e["name"])
        if m and e["stream"] == "compute":
            out[m.group(1)] += e["end_ms"] - e["start_ms"]
    return out


@pytest.mark.parametrize("overlap", [True, False])
def test_cluster_forward_and_backward_are_the_scheduled_tasks_of_the_trace(overlap):
    r = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, tp=4, pp=2, sp=True, batch=8, seq=2048,
                                 micro_batch=1, framework="megatron", recompute="selective", tp_comm_overlap=overlap,
                                 trace=True)
    got = _trace_phase_ms(r.events)
    assert r.forward_ms == pytest.approx(got["F"], rel=1e-9)
    assert r.backward_ms == pytest.approx(got["B"], rel=1e-9)
    d = r.to_dict()
    assert d["forward_serial_ms"] > 0 and d["backward_serial_ms"] > 0
    if overlap:  # the TP collectives hidden beside their GEMMs: the scheduled tasks are shorter than the serial sums
        assert r.forward_ms < d["forward_serial_ms"] and r.backward_ms < d["backward_serial_ms"]
    else:  # in series: the tasks add loading, the blocking pipeline sends and the accumulation pass to the sums (the
        # backward's dgrad collectives run beside the wgrad GEMMs even so since stop 47: its tasks may be shorter)
        assert r.forward_ms > d["forward_serial_ms"]


@pytest.mark.parametrize("kw", [dict(framework="megatron", zero=1, tp=2, pp=2),
                                dict(framework="hf", zero=3)])
def test_per_device_carries_the_memory_blocks_master_weights_and_unsharded_gradients(kw):
    r = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=8, seq=2048, micro_batch=1,
                                 recompute="selective", **kw)
    m = r.memory
    dev = r.per_device[m["stage"]]
    assert dev["master_weights_gb"] == m["master_weights_gb"]
    assert dev["unsharded_gradients_gb"] == m["unsharded_gradients_gb"]
    # per_device's weights_gb is the weights with the master weights (as the table's "weights+master GB" column)
    assert dev["weights_gb"] - dev["master_weights_gb"] == pytest.approx(m["weights_gb"], rel=1e-12)
    if kw["framework"] == "hf":
        assert dev["unsharded_gradients_gb"] > 0 and dev["master_weights_gb"] == 0.0


def test_per_layer_with_outside_layers_adds_up_to_the_step():
    r = wattcast.predict("gpt2", "H100", batch=1, seq=512)
    d = r.to_dict()
    outside = d["outside_layers"]
    assert [o["op_class"] for o in outside] == ["data_loading"] and outside[0]["time_ms"] > 0
    layers = sum(x["time_ms"] for x in d["per_layer"])
    assert layers + sum(o["time_ms"] for o in outside) == pytest.approx(d["step_time_ms"], rel=1e-12)
    assert all(isinstance(x["layer"], int) for x in d["per_layer"])  # per_layer keeps the graph's layers alone


def test_cluster_json_carries_the_step_mode_as_single_device_json_does():
    """`wattcast predict --cluster ... --json` had no top-level `mode` (a single device's has it): a pipelined cluster
    step is a training step, a served TP group's an inference one, and `mode` says so in both."""
    train = wattcast.predict_cluster("gpt2", "DGX-H100", gpus=2, tp=1, pp=2, batch=4, seq=256).to_dict()
    assert train["mode"] == "train" == train["settings"]["mode"]
    served = wattcast.predict_cluster("llama2_7b", "dgx-a100", device="A100-SXM4-40GB", gpus=2, tp=2, batch=4, seq=1,
                                      dtype="bf16", attention="flash", kv_context=64).to_dict()
    assert served["mode"] == "inference" == served["settings"]["mode"]
    single = wattcast.predict("gpt2", "H100", batch=1, seq=128).to_dict()
    assert single["mode"] == "train"
