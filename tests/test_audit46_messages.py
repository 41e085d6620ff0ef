"""Messages the user audit found wrong: run options on a served cluster step, the inference out-of-memory hint, a run
option given to search as a search-space option, and footprint_kw's utilisation (accepted and ignored before)."""

from __future__ import annotations

import pytest

import wattcast

from conftest import flat, run_cli


@pytest.mark.parametrize("kw,named", [(dict(tokens=1.6e7, pue=1.0), "tokens=, pue="), (dict(pue=1.0), "pue="),
                                      (dict(tokens=1.6e7), "tokens=")])
def test_served_cluster_step_says_a_run_is_not_modelled(kw, named):
    with pytest.raises(ValueError) as e:
        wattcast.predict_cluster("llama3_8b", "DGX-H100", tp=2, batch=16, seq=1, kv_context=8000, **kw)
    msg = str(e.value)
    assert msg.startswith(named + ":") and "not modelled for KV-cached inference" in msg
    assert "give tokens= too" not in msg


def test_inference_oom_hint_names_kv_context_not_recompute():
    r = run_cli("predict", "-m", "llama3_70b", "-d", "A100-SXM4-80GB", "--mode", "inference", "--seq", "1",
                "--kv-context", "8000", "--batch", "8")
    said = flat(r.stderr)
    assert r.returncode == 3 and "does not fit" in said, said
    assert "--kv-context" in said.split("does not fit")[1] and "--recompute" not in said


def test_search_points_a_run_option_to_footprint_kw():
    with pytest.raises(ValueError, match=r"unknown search-space option 'region'.*footprint_kw=\{'region': \.\.\.\}"):
        wattcast.search("gpt2", "DGX-A100", 8, 16, 128, max_configs=2, region="FR")


def test_search_refuses_utilisation_naming_why():
    with pytest.raises(ValueError, match="unknown footprint_kw option 'utilisation'.*own GPU power from its step"):
        wattcast.search("gpt2", "DGX-A100", 8, 16, 128, max_configs=2, tokens=1e9, footprint_kw={"utilisation": 0.1})
