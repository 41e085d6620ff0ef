"""A Chrome trace's memory (audit 59a finding 3): ``otherData`` had no memory at all, so a trace could not be checked
against ``predict --json`` / ``search`` / ``predict_cluster`` for the same step. It now carries the worst stage's total
(``memory_gb``), the terms of its peak that sum to it (``memory_terms_gb``, the JSON's ``memory.peak_terms_gb``), the
JSON's ``memory`` block, ``memory_capacity_gb`` and ``fits``: the same numbers as the three others."""
import json

import pytest
from conftest import run_cli

import wattcast

KW = dict(gpus=8, batch=32, seq=4096, tp=2, pp=2, interleave=2, micro_batch=1, zero=1, sp=True, recompute="selective",
          framework="megatron")
ARGS = ("predict", "-m", "llama3_8b", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "32", "--seq", "4096",
        "--tp", "2", "--pp", "2", "--interleave", "2", "--micro-batch", "1", "--zero", "1", "--sp",
        "--recompute", "selective", "--framework", "megatron")


def test_cluster_trace_memory_agrees_with_json_search_and_api(tmp_path):
    trace = tmp_path / "cli.json"
    r = run_cli(*ARGS, "--trace", trace, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    other = json.loads(trace.read_text())["otherData"]
    assert other["memory_gb"] == d["memory_gb"] == d["memory"]["total_gb"]
    assert other["memory_terms_gb"] == d["memory"]["peak_terms_gb"]
    assert sum(other["memory_terms_gb"].values()) == pytest.approx(other["memory_gb"], rel=1e-12)
    assert other["memory"] == d["memory"]
    assert other["memory_capacity_gb"] == d["memory_capacity_gb"] and other["fits"] is d["fits"] is True
    # the Python API's trace: the same
    api_trace = tmp_path / "api.json"
    res = wattcast.predict_cluster("llama3_8b", "DGX-H100", trace=str(api_trace), **KW)
    api_other = json.loads(api_trace.read_text())["otherData"]
    assert api_other["memory_gb"] == res.memory_gb == other["memory_gb"]
    assert api_other["memory_terms_gb"] == res.memory["peak_terms_gb"] == other["memory_terms_gb"]
    # the search row of the same strategy
    s = wattcast.search("llama3_8b", "DGX-H100", 8, 32, 4096, framework="megatron", tp=(2,), pp=(2,), interleave=(2,),
                        micro_batch=(1,), zero=(1,), sp=(True,), recompute=("selective",), workers=1)
    same = s.ranked[s.ranked["config"] == d["parallel"]["name"]]
    assert len(same) == 1, d["parallel"]["name"]
    assert float(same.iloc[0]["memory_gb"]) == other["memory_gb"]


def test_single_device_trace_memory_agrees_with_json(tmp_path):
    trace = tmp_path / "one.json"
    r = run_cli("predict", "-m", "gpt2", "-d", "h100", "--batch", "8", "--seq", "512", "--mode", "train", "--trace",
                trace, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    other = json.loads(trace.read_text())["otherData"]
    assert other["memory_gb"] == d["memory_gb"] == d["memory"]["total_gb"]
    assert other["memory"] == d["memory"]
    assert other["memory_terms_gb"] == {k: v for k, v in d["memory"].items() if k != "total_gb"}
    assert sum(other["memory_terms_gb"].values()) == pytest.approx(other["memory_gb"], rel=1e-12)
