"""`wattcast search` takes predict's per-flag overlap switches (--overlap-grad-reduce/--no-..., --overlap-param-gather/
--no-..., --tp-comm-overlap/--no-...) for every candidate; until stop 48 it had only --no-overlap (every overlap off)."""

from __future__ import annotations

import json

from conftest import run_cli

ARGS = ("search", "--model", "gpt2", "--cluster", "DGX-H100", "--gpus", "16", "--batch", "32", "--seq", "1024",
        "--framework", "megatron", "--zero", "1", "--max-configs", "40", "--workers", "1", "--json")


def _strategies(*extra: str) -> list[str]:
    r = run_cli(*ARGS, *extra)
    assert r.returncode == 0, r.stderr
    return [row["strategy"] for row in json.loads(r.stdout)["ranked"]]


def test_search_switches_one_overlap_off():
    default = _strategies()
    assert default and not any("noogr" in s or "notpo" in s for s in default)
    # grad reduce off: every candidate, and the param gather's default follows it (Megatron-LM's rule)
    no_ogr = _strategies("--no-overlap-grad-reduce")
    assert len(no_ogr) == len(default) and all(s.endswith("-noogr-noopg") for s in no_ogr)
    # TP comm overlap off: the candidates where it is on by default (tp > 1 with SP), the others unchanged
    no_tpo = _strategies("--no-tp-comm-overlap")
    assert any("notpo" in s for s in no_tpo) and not any("noogr" in s for s in no_tpo)
    assert all(("notpo" in s) == ("-sp-" in s) for s in no_tpo)  # (SP needs tp > 1)
    # the param gather alone off keeps the grad reduce's overlap
    no_opg = _strategies("--no-overlap-param-gather")
    assert all(s.endswith("-noopg") and "noogr" not in s for s in no_opg)


def test_search_refuses_an_overlap_with_no_overlap():
    r = run_cli(*ARGS, "--no-overlap", "--tp-comm-overlap")
    assert r.returncode == 2 and "turns every overlap off" in r.stderr and "--tp-comm-overlap" in r.stderr


def test_search_positive_overlap_flags_mean_on_where_allowed_not_a_filter():
    """Review of stop 48: a positive flag is what the default does already (on wherever allowed); until then it was
    forced on every candidate, so --tp-comm-overlap rejected every tp 1 / no-SP strategy (150 of them) and
    --overlap-param-gather every ZeRO-0 one."""
    default = _strategies()
    assert any(s.startswith("tp1-") for s in default)
    for flag in ("--tp-comm-overlap", "--overlap-param-gather", "--overlap-grad-reduce"):
        assert _strategies(flag) == default, flag
    r = run_cli(*ARGS, "--tp-comm-overlap")
    assert not any("tp-comm-overlap" in x["rule"] for x in json.loads(r.stdout)["rejected"])
    # ZeRO-0 candidates stay in the search under --overlap-param-gather (which needs the distributed optimizer)
    r = run_cli(*ARGS, "--zero", "0", "--overlap-param-gather")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert any(row["zero"] == 0 for row in d["ranked"])
    assert not any("overlap-param-gather" in x["rule"] for x in d["rejected"])


def test_search_refuses_a_positive_overlap_outside_megatron():
    import pytest
    from wattcast.planning.search import search
    with pytest.raises(ValueError, match="Megatron-Core option"):
        search("gpt2", "DGX-H100", 16, 32, 1024, framework="hf", overlaps={"tp_comm_overlap": True}, max_configs=4)


def test_candidate_overlaps_gives_the_moe_overlap_to_expert_parallel_candidates_only():
    """``overlap_moe_expert_parallel_comm`` needs ep > 1 (parallel.resolve_parallel): an explicit True goes to the
    expert-parallel candidates only, as the other positive overlaps (until stop 48's last review it rejected every
    ep 1 candidate); an explicit False still goes to every candidate."""
    from wattcast.planning.search import candidate_overlaps
    from wattcast.simulate.parallel import ParallelConfig

    on = {"overlap_moe_expert_parallel_comm": True}
    assert candidate_overlaps(ParallelConfig(ep=2), on)["overlap_moe_expert_parallel_comm"] is True
    assert candidate_overlaps(ParallelConfig(ep=1), on)["overlap_moe_expert_parallel_comm"] is None
    off = {"overlap_moe_expert_parallel_comm": False}
    assert candidate_overlaps(ParallelConfig(ep=1), off)["overlap_moe_expert_parallel_comm"] is False
