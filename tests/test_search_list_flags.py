"""`wattcast search`'s repeatable list flags take commas too (issue 15 new-user audit, stop 50): `--cp 2,4,8` failed to
parse ("Input should be a valid integer") while `--hierarchical-cp-sizes A,B` and `--recompute-modules a,b` take commas;
a sweep spec's `space: {cp: "2,4"}` was one bad choice. Both forms now give the same candidates; a bad element is named."""

from __future__ import annotations

import json

import pytest

from conftest import flat, run_cli

ARGS = ("search", "--model", "gpt2", "--cluster", "DGX-H100", "--gpus", "16", "--batch", "32", "--seq", "1024",
        "--framework", "megatron", "--max-configs", "40", "--workers", "1", "--json")


def _rows(*extra: str) -> list[tuple]:
    r = run_cli(*ARGS, *extra)
    assert r.returncode == 0, r.stderr
    return [(row["strategy"], row["cp"], row["zero"]) for row in json.loads(r.stdout)["ranked"]]


def test_search_list_flags_take_commas_as_repeats():
    commas = _rows("--cp", "1,2", "--zero", "0,1", "--cp-comm-type", "p2p,a2a")
    repeats = _rows("--cp", "1", "--cp", "2", "--zero", "0", "--zero", "1", "--cp-comm-type", "p2p", "--cp-comm-type", "a2a")
    assert commas == repeats
    assert {(cp, z) for _, cp, z in commas} == {(1, 0), (1, 1), (2, 0), (2, 1)}
    assert _rows("--cp", "1,2", "--zero", "0", "--zero", "1") == _rows("--cp", "1", "--cp", "2", "--zero", "0,1")


def test_search_tp_pp_micro_batch_flags():
    """--tp/--pp/--micro-batch (audit 54a: the CLI had none; Python's search(tp=, pp=, micro_batch=) had): the searched
    candidates have exactly those values, commas and repeats alike."""
    def got(*extra):
        r = run_cli(*ARGS, "--zero", "1", *extra)
        assert r.returncode == 0, r.stderr
        return sorted({(row["tp"], row["pp"], row["micro_batch"]) for row in json.loads(r.stdout)["ranked"]})

    commas = got("--tp", "2", "--pp", "2,4", "--micro-batch", "1,2")
    assert commas == [(2, 2, 1), (2, 2, 2), (2, 4, 1), (2, 4, 2)]
    assert got("--tp", "2", "--pp", "2", "--pp", "4", "--micro-batch", "1", "--micro-batch", "2") == commas


@pytest.mark.parametrize("flag,value,bad,what", [
    ("--tp", "2,x", "'x'", "a positive integer"), ("--pp", "0", "'0'", "a positive integer"),
    ("--micro-batch", "1,2.5", "'2.5'", "a positive integer"),
    ("--cp", "2,x", "'x'", "a positive integer"), ("--ep", "2,0", "'0'", "a positive integer"),
    ("--zero", "1,-1", "'-1'", "an integer of at least 0"), ("--recompute-num-layers", "2,", "''", "a positive integer"),
    ("--etp", "1.5", "'1.5'", "a positive integer")])
def test_search_list_flag_names_a_bad_element(flag, value, bad, what):
    r = run_cli(*ARGS, flag, value)
    msg = flat(r.stderr)
    assert r.returncode == 2 and "valid integer" not in msg
    long_flag = "--expert-tensor-parallel-size" if flag == "--etp" else flag
    assert f"{long_flag}: every value must be {what}, got {bad}" in msg
    assert "separate values by commas" in msg


def test_search_space_takes_comma_text():
    from wattcast.planning.search import _choices

    assert _choices("cp", "2,4, 8") == (2, 4, 8)
    assert _choices("zero", "0,1") == (0, 1)
    assert _choices("cp_comm_type", "p2p,a2a") == ("p2p", "a2a")
    assert _choices("tp", "2,2,4") == (2, 4)
    with pytest.raises(ValueError, match=r"search-space option tp: every choice must be a positive integer, got 'x'"):
        _choices("tp", "2,x")
    with pytest.raises(ValueError, match="zero: every choice must be 0, 1, 2 or 3, got 4"):
        _choices("zero", "1,4")
