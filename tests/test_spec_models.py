"""Spec and config validation on pydantic v2 models (issue 18): the models carry the rules, the dataclasses other code
uses are built from what they accept with the figures as given, several problems are reported in one order, and the
hand-written checkers the validators replaced are gone."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import yaml
from pydantic import BaseModel, ValidationError

from conftest import REPO, USER_SPEC

from wattcast.data import cluster_spec, device_spec
from wattcast.data.catalog import list_devices
from wattcast.data.checks import allow_exotic
from wattcast.data.cluster_spec import ClusterSpecError, ClusterSpecModel, cluster_from_dict, list_clusters
from wattcast.data.device_spec import DeviceSpec, DeviceSpecError, DeviceSpecModel, from_dict
from wattcast.featurize import hf_config
from wattcast.featurize.hf_config import HFConfigModel, bool_field, fraction_field, int_field, normalise_config
from wattcast.featurize.op_graph import GraphError


def test_the_rules_live_in_pydantic_models_not_in_hand_written_checkers():
    for model in (DeviceSpecModel, ClusterSpecModel, cluster_spec.IntraNodeModel, cluster_spec.InterNodeModel,
                  cluster_spec.AstraNetworkModel, HFConfigModel):
        assert issubclass(model, BaseModel)
    for module, gone in ((device_spec, "check_values"), (device_spec, "_PLAUSIBLE"), (cluster_spec, "_positive"),
                         (cluster_spec, "_text"), (cluster_spec, "_section"), (cluster_spec, "_astra_number"),
                         (hf_config, "_positive_int"), (hf_config, "_check_fields"), (hf_config, "_first")):
        assert not hasattr(module, gone), f"{module.__name__}.{gone} is back: one copy of each rule"


def test_every_shipped_spec_validates_on_its_model():
    for spec in list_devices():
        DeviceSpecModel.model_validate(spec.to_dict(), context={"cite": True})
    for c in list_clusters():
        d = dataclasses.asdict(c)
        d = {k: v for k, v in d.items() if v is not None}
        ClusterSpecModel.model_validate(d)


def test_device_figures_are_kept_as_given():
    s = DeviceSpec(**{**USER_SPEC, "l2_cache_mb": np.float32(0.5), "num_sms": np.int64(100), "memory_gb": 80})
    assert type(s.l2_cache_mb) is np.float32 and s.l2_cache_mb == np.float32(0.5)
    assert type(s.num_sms) is np.int64 and type(s.memory_gb) is int
    # pydantic would coerce "80" to 80.0 in lax mode: a figure given as text is refused, naming it
    with pytest.raises(DeviceSpecError, match=r"field 'memory_gb' must be a number, got '80'"):
        DeviceSpec(**{**USER_SPEC, "memory_gb": "80"})


@pytest.mark.parametrize("change, drop, expected", [
    # an unknown field first (a misspelt name also leaves a required one missing) ...
    ({"l2_cache": 40, "memory_gb": "80"}, "l2_cache_mb", r"unknown field\(s\) l2_cache"),
    # ... then a missing one, a wrong type, an out-of-range value, an implausible unit, a rule between fields
    ({"memory_gb": "80", "tdp_w": 0.4}, "l2_cache_mb", r"required field 'l2_cache_mb' is missing"),
    ({"tdp_w": 0.4, "memory_gb": "80"}, None, r"field 'memory_gb' must be a number, got '80'"),
    ({"tdp_w": 0.4, "num_sms": -3}, None, r"field 'num_sms' must be a positive finite number, got -3"),
    ({"tdp_w": 0.4, "base_clock_mhz": 1e9}, None, r"field 'tdp_w' is 0.4, under 5: it looks like kW"),
    ({"base_clock_mhz": 3000.0, "source": ""}, None, r"field 'base_clock_mhz' \(3000.0\) exceeds boost_clock_mhz"),
])
def test_several_problems_are_reported_in_one_order(change, drop, expected):
    d = {**USER_SPEC, **change}
    if drop:
        d.pop(drop)
    with pytest.raises(DeviceSpecError, match=expected):
        from_dict(d)


def test_citations_are_a_rule_of_spec_files_only():
    d = {**USER_SPEC, "source": ""}
    DeviceSpecModel.model_validate(d)  # in code, a spec needs no citation
    with pytest.raises(ValidationError, match="has no source"):
        DeviceSpecModel.model_validate(d, context={"cite": True})
    with pytest.raises(DeviceSpecError, match=r"field 'peak_fp32_tflops' has no source"):
        from_dict(d)


def test_force_lifts_only_the_plausibility_validators():
    with pytest.raises(DeviceSpecError, match="tdp_w"):
        DeviceSpec(**{**USER_SPEC, "tdp_w": 0.45})
    with allow_exotic():
        assert DeviceSpec(**{**USER_SPEC, "tdp_w": 0.45}).tdp_w == 0.45
        with pytest.raises(DeviceSpecError, match=r"field 'tdp_w' must be a positive finite number, got -1"):
            DeviceSpec(**{**USER_SPEC, "tdp_w": -1})  # hard rules still hold


def _dgx(**change) -> dict:
    d = yaml.safe_load((REPO / "data" / "clusters" / "dgx-a100.yaml").read_text())
    d = copy.deepcopy(d)
    for k, v in change.items():
        sec, _, f = k.partition("__")
        if f:
            d[sec][f] = v
        else:
            d[k] = v
    return d


def test_cluster_model_names_nested_fields_and_keeps_counts_whole():
    c = cluster_from_dict(_dgx(gpus_per_node=8.0, inter__nics_per_node=8.0))
    assert type(c.gpus_per_node) is int and type(c.inter.nics_per_node) is int
    assert c == cluster_from_dict(_dgx())
    with pytest.raises(ClusterSpecError, match=r"required field\(s\) intra.latency_us missing"):
        cluster_from_dict(_dgx(intra__latency_us=None))  # null is missing, not a wrong type
    with pytest.raises(ClusterSpecError, match=r"field 'inter.kind' must be one of infiniband, roce"):
        cluster_from_dict(_dgx(inter__kind="nvlink"))
    with pytest.raises(ClusterSpecError, match=r"field 'inter.oversubscription' must be >= 1 \(1 = full bisection\)"):
        cluster_from_dict(_dgx(inter__oversubscription=0.5))  # the range rule before the (also broken) plausibility


def test_cluster_device_override_is_validated_too():
    from wattcast.data.cluster_spec import resolve_cluster

    with pytest.raises(ClusterSpecError, match=r"field 'device' must be a string, got 5 \(int\)"):
        resolve_cluster("dgx-a100", device=5)


def test_hf_fields_name_the_alias_the_config_used():
    gpt = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 10}
    with pytest.raises(GraphError, match=r"cfg: n_embd must be an integer, got '64'"):
        normalise_config(dict(gpt, n_embd="64"), origin="cfg")
    with pytest.raises(GraphError, match=r"cfg: hidden_size must be a positive integer, got 0"):
        normalise_config(dict(gpt, hidden_size=0), origin="cfg")  # the preferred alias, when set, is the one read
    # a field set to null counts as absent: the next alias is read
    assert normalise_config(dict(gpt, hidden_size=None)).hidden == 64
    with pytest.raises(GraphError, match=r"missing vocab \(one of vocab_size, n_vocab, padded_vocab_size\)"):
        normalise_config({k: v for k, v in gpt.items() if k != "vocab_size"})


def test_optional_hf_fields_read_through_the_same_types():
    assert int_field({"k": 8.0}, "k", "cfg") == 8 and type(int_field({"k": 8.0}, "k", "cfg")) is int
    assert int_field({"k": 0}, "k", "cfg", minimum=0) == 0
    with pytest.raises(GraphError, match=r"cfg: field 'k' must be an integer >= 0, got -1"):
        int_field({"k": -1}, "k", "cfg", minimum=0)
    with pytest.raises(GraphError, match=r"cfg: field 'a.b' must be true or false, got 1"):
        bool_field({"a.b": 1}, "a.b", "cfg", False)
    assert bool_field({}, "x", "cfg", True) is True
    assert fraction_field({"p": 1}, "p", "cfg") == 1.0
    with pytest.raises(GraphError, match=r"field 'p' must be a number between 0 and 1, got True"):
        fraction_field({"p": True}, "p", "cfg")


def test_an_int_too_large_for_a_float_is_a_spec_error_not_an_overflow():
    import dataclasses

    from wattcast.data.catalog import resolve_device
    from wattcast.data.device_spec import DeviceSpecError

    with pytest.raises(DeviceSpecError, match=r"field 'memory_gb' must be a positive finite number"):
        dataclasses.replace(resolve_device("h100"), memory_gb=10**400)
