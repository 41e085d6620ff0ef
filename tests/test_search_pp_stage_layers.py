"""``wattcast search --pp-first-stage-layers / --pp-last-stage-layers`` (issue 15: "every new option in wattcast
predict, wattcast search and the Python API"): Megatron-Core's ``decoder_first/last_pipeline_num_layers`` on every
pp > 1 candidate. A row equals ``predict_cluster`` with the same flags (and ``wattcast predict --strategy``); a
candidate whose (pp, interleave) cannot take the counts is rejected naming the flags, never costed with another split;
the pp 1 candidates keep no split; bad values are refused naming the flag, as predict refuses them.

Llama 3 8B has 32 layers: with 6 + 6 the 4-stage candidates get 6, 10, 10, 6 (v2: 3 per chunk at the ends, 5 between),
the 2-stage ones would need 6 + 6 = 32 (rejected); with 5 + 5 the v2 candidates need 5 % 2 == 0 (rejected)."""
import json

import pytest
from typer.testing import CliRunner

import wattcast
from wattcast.cli import app
from wattcast.sweep import INT_COLUMNS, TEXT_COLUMNS, load_spec, read_sweep, run_sweep

KW = dict(framework="megatron", tp=(1,), pp=(1, 2, 4), zero=(1,), micro_batch=(1,), interleave=(1, 2),
          recompute=("none",), sp=(False,), workers=1)
JOB = ("llama3_8b", "DGX-H100", 8, 16, 2048)


def test_rows_equal_predict_with_the_same_flags():
    res = wattcast.search(*JOB, pp_first_stage_layers=6, pp_last_stage_layers=6, **KW)
    r = res.ranked
    split = r[r["pp"] > 1]
    assert sorted(split["interleave"]) == [1, 2] and set(split["pp"]) == {4}
    assert split["pp_first_stage_layers"].eq(6).all() and split["pp_last_stage_layers"].eq(6).all()
    assert split["strategy"].str.endswith("-ppf6-ppl6").all()
    one = r[r["pp"] == 1]
    assert len(one) == 1 and one["pp_first_stage_layers"].isna().all() and one["pp_last_stage_layers"].isna().all()
    for _, row in split.iterrows():
        by_strategy = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=16, seq=2048,
                                               framework="megatron", strategy=row["strategy"])
        by_flags = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=16, seq=2048, framework="megatron",
                                            tp=1, pp=4, zero=1, micro_batch=1, interleave=int(row["interleave"]),
                                            recompute="none", sp=False, pp_first_stage_layers=6,
                                            pp_last_stage_layers=6)
        for p in (by_strategy, by_flags):
            assert p.step_time_ms == row["step_time_ms"] and p.memory_gb == row["memory_gb"]
            d = p.to_dict()["parallel"]
            assert d["pipeline_layout"] == row["pipeline_layout"]
            c, v = d["stage_layers"], int(row["interleave"])  # chunk v x pp + s: virtual stage v of stage s
            assert [sum(c[i * 4 + s] for i in range(v)) for s in range(4)] == [6, 10, 10, 6]
    # the split moves the figures: the same strategies without the flags (the even 8 x 4 split) differ
    even = wattcast.search(*JOB, **KW).ranked
    even = even[even["pp"] == 4].set_index("interleave")
    assert even["pp_first_stage_layers"].isna().all() and even["pipeline_layout"].isna().all()
    for _, row in split.iterrows():
        assert even.loc[row["interleave"], "step_time_ms"] != row["step_time_ms"]
    assert split.set_index("interleave").loc[1, "pipeline_layout"] == "Et*6|(t*10|)*2t*6L"


def test_impossible_counts_are_rejected_by_the_named_rule():
    res = wattcast.search(*JOB, pp_first_stage_layers=5, pp_last_stage_layers=5, **KW)
    ranked, rej = res.ranked, res.rejected
    # pp 4 x v1 takes 5, 11, 11, 5; pp 2 needs 5 + 5 = 32; every v2 stage needs an even count
    assert set(zip(ranked["pp"], ranked["interleave"])) == {(1, 1), (4, 1)}
    rules = dict(zip(rej["config"], rej["rule"]))
    assert len(rules) == 3
    two = [rule for c, rule in rules.items() if "-pp2-" in c]
    assert len(two) == 2 and all("must add up to the model's 32 layers" in x for x in two)
    v2 = [rule for c, rule in rules.items() if "-pp4-" in c]
    assert v2 == [r for r in v2 if r.startswith("--pp-first-stage-layers 5 --pp-last-stage-layers 5: with --interleave 2, "
                                                 "every stage's layers must divide by it")] and len(v2) == 1
    # a count of every layer leaves none for the other stages
    every = wattcast.search(*JOB, pp_first_stage_layers=32, **KW)
    assert set(every.ranked["pp"]) == {1}
    assert every.rejected["rule"].str.startswith("--pp-first-stage-layers 32: ").all()
    assert every.rejected["rule"].str.contains("every stage needs at least one layer").all()
    # the asked-for pp choices none of whose candidates was costed: named with the rule (dropped_values)
    dropped = {d["value"]: d["rule"] for d in every.dropped_values if d["option"] == "pp"}
    assert set(dropped) == {2, 4} and all(x.startswith("--pp-first-stage-layers 32: ") for x in dropped.values())


@pytest.mark.parametrize("kw,msg", [
    (dict(pp_first_stage_layers=0), "--pp-first-stage-layers must be a whole number of layers, at least 1"),
    (dict(pp_last_stage_layers=-2), "--pp-last-stage-layers must be a whole number of layers, at least 1"),
    (dict(pp_first_stage_layers=2.5), "--pp-first-stage-layers must be a whole number of layers, at least 1"),
    (dict(pp_last_stage_layers=True), "--pp-last-stage-layers must be a whole number of layers, at least 1"),
    (dict(pp_first_stage_layers=4, pp=(1,)), "the search space has no pp > 1 choice"),
    (dict(pp_first_stage_layers=4, framework="megatron-deepspeed"), "--pp-first-stage-layers 4 is a Megatron-Core option"),
])
def test_bad_values_named_before_anything_runs(kw, msg):
    with pytest.raises(ValueError, match=msg):
        wattcast.search(*JOB, **{**KW, **kw})


ARGS = ["search", "-m", "llama3_8b", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "16", "--seq", "2048",
        "--framework", "megatron", "--tp", "1", "--pp", "1,2,4", "--zero", "1", "--micro-batch", "1",
        "--interleave", "1,2", "--recompute", "none", "--sp", "off", "--workers", "1"]


def test_cli_flags_accepted_and_echoed():
    r = CliRunner().invoke(app, ARGS + ["--pp-first-stage-layers", "6", "--pp-last-stage-layers", "6", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["pipeline_split"] == {"pp_first_stage_layers": 6, "pp_last_stage_layers": 6}
    split = [x for x in d["ranked"] if x["pp"] > 1]
    assert split and all(x["pp_first_stage_layers"] == 6 and x["pp_last_stage_layers"] == 6 for x in split)
    assert all(x["strategy"].endswith("-ppf6-ppl6") for x in split)
    assert all(x["pp_first_stage_layers"] is None for x in d["ranked"] if x["pp"] == 1)
    assert any("must add up to the model's 32 layers" in x["rule"] for x in d["rejected"])
    # the table echoes the split
    t = CliRunner().invoke(app, ARGS + ["--pp-first-stage-layers", "6", "--pp-last-stage-layers", "6"])
    assert t.exit_code == 0, t.output
    flat = " ".join(t.output.split())
    assert "pipeline split: --pp-first-stage-layers 6 --pp-last-stage-layers 6 on every pp > 1 candidate" in flat
    # a row predict --strategy replays with the same figures
    row = split[0]
    p = CliRunner().invoke(app, ["predict", "-m", "llama3_8b", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "16",
                                 "--seq", "2048", "--framework", "megatron", "--strategy", row["strategy"], "--json"])
    assert p.exit_code == 0, p.output
    pd_ = json.loads(p.stdout)
    assert pd_["step_time_ms"] == row["step_time_ms"] and pd_["memory_gb"] == row["memory_gb"]


@pytest.mark.parametrize("flag,value,msg", [
    ("--pp-first-stage-layers", "0", "--pp-first-stage-layers must be a whole number of layers, at least 1"),
    ("--pp-last-stage-layers", "-1", "--pp-last-stage-layers must be a whole number of layers, at least 1"),
    ("--pp-first-stage-layers", "2.5", "'--pp-first-stage-layers'"),
])
def test_cli_bad_values_name_the_flag(flag, value, msg):
    r = CliRunner().invoke(app, ARGS + [flag, value])
    assert r.exit_code == 2
    assert msg in " ".join((r.stderr if r.stderr_bytes else r.output).split())


def test_sweep_spec_key_and_columns():
    assert {"pp_first_stage_layers", "pp_last_stage_layers"} <= INT_COLUMNS
    assert not {"pp_first_stage_layers", "pp_last_stage_layers"} & TEXT_COLUMNS
    base = dict(models=["llama3_8b"], clusters=["DGX-H100"], gpus=[8], batch=16, seq=2048, framework="megatron",
                space=dict(pp=[4]))
    spec = load_spec(dict(base, pp_first_stage_layers=6, pp_last_stage_layers=6))
    (task,) = spec.tasks()
    assert task["pp_first_stage_layers"] == 6 and task["pp_last_stage_layers"] == 6
    assert task["task_id"] != load_spec(base).tasks()[0]["task_id"]
    with pytest.raises(ValueError, match="pp_first_stage_layers|--pp-first-stage-layers must be a whole number"):
        load_spec(dict(base, pp_first_stage_layers=0))
    with pytest.raises(ValueError, match="no pp > 1 choice"):
        load_spec(dict(base, space=dict(pp=[1]), pp_last_stage_layers=4))


def test_sweep_rows_carry_the_split(tmp_path):
    spec = dict(models=["llama3_8b"], clusters=["DGX-H100"], gpus=[8], batch=16, seq=2048, framework="megatron",
                top=3, space=dict(tp=[1], pp=[1, 4], zero=[1], micro_batch=[1], interleave=[1], recompute=["none"],
                                  sp=[False]),
                pp_first_stage_layers=6, pp_last_stage_layers=6)
    df = read_sweep(run_sweep(spec, tmp_path / "s.parquet", workers=0).output)
    assert str(df["pp_first_stage_layers"].dtype) == "Int64"
    four = df[df["pp"] == 4]
    assert len(four) == 1 and four["pp_first_stage_layers"].eq(6).all() and four["pp_last_stage_layers"].eq(6).all()
    assert four["pipeline_layout"].eq("Et*6|(t*10|)*2t*6L").all()
    assert df.loc[df["pp"] == 1, "pp_first_stage_layers"].isna().all()


def test_block_recompute_counts_against_the_given_split():
    # 6 + 6 on pp 4: stages 6, 10, 10, 6. A block count of 8 recomputes 8 of the middle stages' 10 layers: a strategy
    # of its own (the even split's 8 per stage would make it every layer, the plain full-recompute candidate)
    kw = dict(KW, pp=(4,), interleave=(1,), recompute=("full",), recompute_num_layers=(8,))
    split = wattcast.search(*JOB, pp_first_stage_layers=6, pp_last_stage_layers=6, **kw).ranked
    assert sorted(split["strategy"].str.extract(r"-(rcfull\d*)-")[0]) == ["rcfull", "rcfull8"]
    even = wattcast.search(*JOB, **kw).ranked
    assert list(even["strategy"].str.extract(r"-(rcfull\d*)-")[0]) == ["rcfull"]
    row = split[split["strategy"].str.contains("-rcfull8-")].iloc[0]
    p = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=16, seq=2048, framework="megatron",
                                 strategy=row["strategy"])
    assert p.step_time_ms == row["step_time_ms"] and p.memory_gb == row["memory_gb"]
