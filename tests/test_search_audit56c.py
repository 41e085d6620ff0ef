"""Audit 56c (issue 15, training-infra lead), findings 3-5 on `search`.

3. A space of ZeRO >= 1 only, where every layout has one data-parallel rank (``--tp 16 --pp 1 --zero 1`` on 16 GPUs),
   generated no candidate (``candidate_configs`` skipped ``zero and dp*cp == 1``) and the error blamed another rule
   (``--interleave needs pipeline parallelism``); ``predict`` takes the same strategy. Such candidates are now searched;
   where their step is ZeRO 0's (Megatron's distributed optimizer over one rank shards nothing) the twin rows are listed
   once, and where it is not (megatron-deepspeed's ZeRO optimizer) both are ranked. ``why_no_candidates`` names the
   rule that actually left the space empty.
4. The default search tries cp 2 from 8,192 tokens (NVIDIA's Llama 3 8B / 70B recipes run CP 2 there), so Llama 3 8B
   on 8 H100s at 8,192 tokens finds tp1-pp1-dp4-cp2.
5. ``wattcast search`` takes ``--interleave``, ``--recompute`` and ``--sp`` (comma-separated or repeated), as the
   Python ``search(interleave=, recompute=, sp=)``; bad values are named with their flag.
"""

from __future__ import annotations

import json

import pytest

import wattcast
from conftest import flat, run_cli
from wattcast.planning.search import (ZERO_FOLDED_RULE, candidate_configs, default_cps, why_no_candidates)

GPT2 = dict(model="gpt2", cluster="DGX-H100", seq=1024)


def _search(gpus, batch, **kw):
    return wattcast.search(GPT2["model"], GPT2["cluster"], gpus, batch, GPT2["seq"], workers=1, **kw)


# --- finding 3: ZeRO >= 1 over one data-parallel rank ---------------------------------------------------------------

def test_zero1_only_space_at_one_data_parallel_rank_is_searched_as_predict_takes_it():
    res = _search(4, 8, framework="megatron", tp=(4,), pp=(1,), micro_batch=(1,), zero=(1,))
    assert len(res.ranked) > 0, res.invalid_reason()
    assert set(res.ranked["zero"]) == {1} and set(res.ranked["dp"]) == {1}
    row = res.ranked.iloc[0]
    p = wattcast.predict_cluster("gpt2", "DGX-H100", gpus=4, batch=8, seq=1024, framework="megatron",
                                 strategy=row["strategy"])
    assert p.step_time_ms == pytest.approx(row["step_time_ms"], rel=1e-12)
    assert p.memory_gb == pytest.approx(row["memory_gb"], rel=1e-12)


def test_zero_twins_over_one_rank_are_listed_once_under_megatron():
    """Megatron: ZeRO 1 over one rank is ZeRO 0's step to the digit, so the ranking is the ZeRO-0 one, and the asked-for
    stage 1 (which has no row left) is said why in dropped_values, not "it fits none of the job's layouts"."""
    kw = dict(framework="megatron", tp=(4,), pp=(1,), micro_batch=(1,))
    both = _search(4, 8, zero=(0, 1), **kw)
    zero0 = _search(4, 8, zero=(0,), **kw)
    zero1 = _search(4, 8, zero=(1,), **kw)
    assert list(both.ranked["strategy"]) == list(zero0.ranked["strategy"])
    assert list(zero1.ranked["step_time_ms"]) == list(zero0.ranked["step_time_ms"])
    notes = [d for d in both.dropped_values if d["option"] == "zero"]
    assert [(d["value"], d["rule"], d["folded"]) for d in notes] == [(1, ZERO_FOLDED_RULE, len(zero1.ranked))]
    assert both.folded_rows == len(zero1.ranked) and zero0.folded_rows == zero1.folded_rows == 0


def test_zero1_over_one_rank_kept_where_its_step_differs():
    """megatron-deepspeed's ZeRO-1 is DeepSpeed's ZeRO optimizer, not BF16_Optimizer, even over one rank: another
    step and memory, so it is ranked beside ZeRO 0 (until stop 56 the search never tried it)."""
    res = _search(4, 8, framework="megatron-deepspeed", tp=(4,), pp=(1,), micro_batch=(1,), zero=(0, 1), sp=(False,),
                  recompute=("none",))
    by_zero = {int(r["zero"]): r for _, r in res.ranked.iterrows()}
    assert set(by_zero) == {0, 1}
    assert by_zero[1]["memory_gb"] != by_zero[0]["memory_gb"]
    p = wattcast.predict_cluster("gpt2", "DGX-H100", gpus=4, batch=8, seq=1024, framework="megatron-deepspeed",
                                 strategy=by_zero[1]["strategy"])
    assert p.step_time_ms == pytest.approx(by_zero[1]["step_time_ms"], rel=1e-12)


def test_audit_command_zero1_tp16_is_ranked():
    r = run_cli("search", "-m", "llama3_8b", "--cluster", "DGX-H100", "--gpus", "16", "-b", "128", "-s", "8192",
                "--framework", "megatron", "--tp", "16", "--pp", "1", "--micro-batch", "1", "--zero", "1",
                "--recompute", "none", "--workers", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["ranked"]
    assert rows and {row["zero"] for row in rows} == {1} and "interleave" not in flat(r.stderr)


def test_why_no_candidates_names_the_cp_comm_rule_that_left_the_space_empty():
    """A cp 2 space whose only communication type is a2a+p2p with sizes 2,2 (product 4) has no candidate; the error
    named "--interleave needs pipeline parallelism" (the only rule resolve_parallel found), now the cp-comm rule."""
    res = _search(8, 16, framework="megatron", tp=(4,), pp=(1,), cp=(2,), micro_batch=(1,), interleave=(1,),
                  cp_comm_type=("a2a+p2p",), hierarchical_cp_sizes=(2, 2))
    assert res.ranked.empty
    why = res.invalid_reason()
    assert "cp 2: no --cp-comm-type choice applies" in why and "interleave" not in why


def test_why_no_candidates_never_says_every_configuration_breaks_a_rule_when_some_pass():
    """The message counts what it checks: configurations that pass resolve_parallel are not "broken"."""
    from wattcast.data.cluster_spec import resolve_cluster

    cl = resolve_cluster("DGX-H100")
    rules = dict(batch=8, n_layers=12, n_heads=12, n_kv_heads=12, ffn=3072, n_experts=0, seq=1024, cluster=cl,
                 uneven_stages=False, framework="megatron", moe_token_dispatcher="alltoall")
    space = dict(tp=(4,), pp=(1,), micro_batch=(1,), zero=(1,), sp=(False,), recompute=("none",), interleave=(1, 2))
    msg = why_no_candidates(cl, 4, 8, 1024, space, rules)
    assert "every one of" not in msg and "break no per-strategy rule" in msg
    assert candidate_configs("gpt2", cl, 4, 8, 1024, **space)  # and the search does generate it now


# --- finding 4: cp 2 by default from 8,192 tokens ---------------------------------------------------------------------

def test_default_cp_degrees():
    assert default_cps(8191) == (1,)
    assert default_cps(8192) == (1, 2)
    assert default_cps(16383) == (1, 2)
    assert default_cps(16384) == (1, 2, 4, 8)
    assert default_cps(131072) == (1, 2, 4, 8, 16)


def test_default_search_at_8k_finds_nemo_llama3_8b_layout():
    """Llama 3 8B on 8 H100s at 8,192 tokens: NVIDIA's recipe tp1 pp1 cp2 (Megatron-Bridge 0.3.1
    recipes/llama/llama3.py l. 225-249) is the only tp1 layout without recomputation that fits, and it is the fastest;
    the default space (no --cp) now holds it."""
    res = wattcast.search("llama3_8b", "DGX-H100", 8, 128, 8192, framework="megatron", tp=(1, 2), pp=(1,),
                          micro_batch=(1, 2), workers=1)
    assert set(res.ranked["cp"]) == {1, 2}
    best = res.best
    assert (best["tp"], best["pp"], best["dp"], best["cp"], best["recompute"]) == (1, 1, 4, 2, "none")
    assert best["step_time_ms"] < res.ranked[(res.ranked["cp"] == 1) & res.ranked["fits"]]["step_time_ms"].min()


# --- finding 5: --interleave, --recompute, --sp on the CLI ------------------------------------------------------------

ARGS = ("search", "--model", "gpt2", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "16", "--seq", "1024",
        "--framework", "megatron", "--tp", "2", "--pp", "2,4", "--micro-batch", "1", "--zero", "1", "--workers", "1",
        "--json")


def _cli_rows(*extra: str) -> list[tuple]:
    r = run_cli(*ARGS, *extra)
    assert r.returncode == 0, r.stderr
    return sorted((row["strategy"], row["interleave"], row["recompute"], row["sp"])
                  for row in json.loads(r.stdout)["ranked"])


def test_cli_space_flags_match_the_python_api():
    commas = _cli_rows("--interleave", "1,3", "--recompute", "none,full", "--sp", "on")
    repeats = _cli_rows("--interleave", "1", "--interleave", "3", "--recompute", "none", "--recompute", "full",
                        "--sp", "true")
    assert commas == repeats
    assert {(v, rc, sp) for _, v, rc, sp in commas} == {(v, rc, True) for v in (1, 3) for rc in ("none", "full")}
    py = _search(8, 16, framework="megatron", tp=(2,), pp=(2, 4), micro_batch=(1,), zero=(1,), interleave=(1, 3),
                 recompute=("none", "full"), sp=(True,))
    assert sorted(py.ranked["strategy"]) == [s for s, *_ in commas]


def test_cli_sp_off_and_defaults():
    off = _cli_rows("--sp", "off", "--interleave", "1", "--recompute", "none")
    assert {sp for *_, sp in off} == {False}
    default = _cli_rows("--interleave", "1", "--recompute", "none")
    assert {sp for *_, sp in default} == {False, True}  # not given: both, as the Python API's default
    assert {v for _, v, _, _ in _cli_rows("--recompute", "none", "--sp", "on")} == {1, 2}  # default interleave 1, 2


def test_cli_recompute_with_modules():
    rows = _cli_rows("--interleave", "1", "--sp", "on", "--recompute", "none,selective", "--recompute-modules", "mlp")
    assert {rc for _, _, rc, _ in rows} == {"none", "selective:mlp"}
    # --recompute-modules alone: none, selective on the modules, full (as before --recompute came)
    rows = _cli_rows("--interleave", "1", "--sp", "on", "--recompute-modules", "mlp")
    assert {rc for _, _, rc, _ in rows} == {"none", "selective:mlp", "full"}


@pytest.mark.parametrize("extra,msg", [
    (("--interleave", "1,0"), "--interleave: every value must be a positive integer, got '0'"),
    (("--interleave", "x"), "--interleave: every value must be a positive integer, got 'x'"),
    (("--sp", "on,maybe"), "--sp: every value must be on or off (true/false, yes/no, 1/0), got 'maybe'"),
    (("--recompute", "none,partial"), "--recompute: every value must be none, selective or full, got 'partial'"),
    (("--recompute", "none,full", "--recompute-modules", "mlp"),
     "--recompute-modules sets what the selective candidates recompute, but --recompute none,full has no selective"),
    (("--recompute", "selective", "--recompute-modules", "bogus"), "--recompute/--recompute-modules: unknown recompute"),
])
def test_cli_space_flags_name_a_bad_value(extra, msg):
    r = run_cli(*ARGS, *extra)
    assert r.returncode == 2, r.stdout
    assert msg in flat(r.stderr)


def test_cli_searches_nemo_llama3_70b_recipe_with_five_virtual_stages():
    """NeMo's Llama 3 70B recipe (tp4 pp4 cp2 vp5, Megatron-Bridge 0.3.1 recipes/llama/llama3.py l. 658-682) could only
    be priced with predict: the CLI searched interleave 1 and 2 only."""
    r = run_cli("search", "-m", "llama3_70b", "--cluster", "DGX-H100", "--gpus", "64", "-b", "128", "-s", "8192",
                "--framework", "megatron", "--tp", "4", "--pp", "4", "--cp", "2", "--interleave", "1,2,5",
                "--recompute", "none", "--sp", "on", "--micro-batch", "1", "--zero", "1", "--workers", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["ranked"]
    assert sorted(row["interleave"] for row in rows) == [1, 2, 5]
    assert {(row["recompute"], row["sp"]) for row in rows} == {("none", True)}
    v5 = next(row for row in rows if row["interleave"] == 5)
    p = wattcast.predict_cluster("llama3_70b", "DGX-H100", gpus=64, batch=128, seq=8192, framework="megatron",
                                 strategy=v5["strategy"])
    assert p.step_time_ms == pytest.approx(v5["step_time_ms"], rel=1e-12)
