"""A value the caller asked for in a searched option whose every candidate broke a rule is named, with the most common
rule, under the search table and in ``--json`` as ``dropped_values`` (before, cp 2 of a sliding-window model under the
default p2p ring vanished from the results without a word)."""

import json

from typer.testing import CliRunner

import wattcast
from wattcast.cli import app

#: a small Mistral-style config whose every layer has a 512-key sliding window (tests/test_cp_comm_type.py's WINDOWED):
#: Transformer Engine refuses the window under the p2p ring, so with the default --cp-comm-type every cp 2 candidate
#: is rejected
WINDOWED = {"model_type": "mistral", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 8,
            "num_hidden_layers": 2, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 8192,
            "sliding_window": 512}
SPACE = dict(tp=(1,), pp=(1,), zero=(0,), sp=(False,), recompute=("none",), interleave=(1,))


def _model(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(WINDOWED))
    return str(path)


def test_api_names_the_dropped_cp_value_and_its_rule(tmp_path):
    res = wattcast.search(_model(tmp_path), "dgx-h100", 4, 8, 4096, attention="flash", framework="megatron",
                          workers=1, cp=(1, 2), **SPACE)
    assert set(res.ranked["cp"]) == {1} and len(res.rejected)
    (d,) = res.dropped_values
    assert (d["option"], d["value"]) == ("cp", 2) and d["rejected"] == int(res.rejected["config"].str.contains("cp2").sum())
    assert "sliding window" in d["rule"] and "a2a or allgather" in d["rule"]
    assert d["note"].startswith(f"cp 2: all {d['rejected']} candidates rejected: this model's attention has a sliding")
    # with a2a the window runs under CP: cp 2 is ranked and nothing is dropped
    ok = wattcast.search(_model(tmp_path), "dgx-h100", 4, 8, 4096, attention="flash", framework="megatron",
                         workers=1, cp=(1, 2), cp_comm_type=("a2a",), **SPACE)
    assert 2 in set(ok.ranked["cp"]) and ok.dropped_values == []
    # a value the caller did not ask for (the default cps) is not reported
    assert wattcast.search(_model(tmp_path), "dgx-h100", 4, 8, 4096, attention="flash", framework="megatron",
                           workers=1, **SPACE).dropped_values == []


def test_a_value_no_candidate_has_is_named_too(tmp_path):
    """cp 3 on 4 GPUs fits no layout: no candidate is generated with it, and it is named (rejected 0) rather than
    vanishing; the values that do run are not listed."""
    from wattcast.planning.search import NO_CANDIDATE_RULE

    res = wattcast.search(_model(tmp_path), "dgx-h100", 4, 8, 4096, attention="flash", framework="megatron",
                          workers=1, cp=(1, 3), cp_comm_type=("a2a",), micro_batch=(1, 3), **SPACE)
    got = {(d["option"], d["value"]): d for d in res.dropped_values}
    assert set(got) == {("cp", 3), ("micro_batch", 3)}
    assert got[("cp", 3)]["rejected"] == 0 and got[("cp", 3)]["rule"] == NO_CANDIDATE_RULE
    assert got[("cp", 3)]["note"] == f"cp 3: {NO_CANDIDATE_RULE}"
    # micro-batch 3 is generated and every candidate with it rejected (8 sequences do not split into 4 x 3)
    assert got[("micro_batch", 3)]["rejected"] >= 1 and "divisible" in got[("micro_batch", 3)]["rule"]
    assert set(res.ranked["cp"]) == {1}


def test_cli_prints_and_json_gives_the_dropped_value(tmp_path):
    args = ["search", "-m", _model(tmp_path), "--cluster", "dgx-h100", "--gpus", "4", "--batch", "8", "--seq", "4096",
            "--attention", "flash", "--framework", "megatron", "--cp", "1", "--cp", "2", "--workers", "1"]
    run = CliRunner()
    res = run.invoke(app, args)
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "note: cp 2: all " in text and "candidates rejected: this model's attention has a sliding window" in text
    res = run.invoke(app, args + ["--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout[res.stdout.index("{"):])
    assert {"ranked", "pareto", "rejected", "excluded", "warnings", "unranked_clusters"} <= set(d)
    assert [(x["option"], x["value"]) for x in d["dropped_values"]] == [("cp", 2)]


def test_sweep_rows_carry_the_dropped_values(tmp_path):
    from wattcast.sweep import SEARCH_KEYS, read_sweep, run_sweep, search_keys

    spec = dict(models=[_model(tmp_path)], clusters=["dgx-h100"], gpus=[4], batch=8, seq=4096, attention="flash",
                framework="megatron", space=dict(SPACE, cp=[1, 2]))
    df = read_sweep(run_sweep(spec, tmp_path / "s.parquet", workers=0).output)
    assert "dropped_values" in SEARCH_KEYS and set(df["status"]) == {"ok"}
    for v in df["dropped_values"]:
        (d,) = search_keys(v)
        assert (d["option"], d["value"]) == ("cp", 2) and "sliding window" in d["rule"]
