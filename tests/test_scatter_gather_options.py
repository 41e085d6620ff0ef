"""``scatter_gather_p2p`` (pipeline transfers scattered over the TP group, Megatron-LM 2021 / DeepSpeed) reaches every
path a user takes: ``wattcast predict`` and ``wattcast search`` flags, ``PredictRequest`` and the sweep spec (its task
and id), with the same figure ``predict_cluster`` gives."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import wattcast
from wattcast.cli import app
from wattcast.sweep import SweepSpecError, load_spec, read_sweep, run_sweep

# TP4 x DP2 stages of a whole node each: the pipeline hop crosses nodes (since stop 47 a hop inside a node costs
# NVLink, where scattering the tensor saves little or nothing)
JOB = dict(gpus=16, batch=32, seq=1024, tp=4, pp=2, framework="megatron-deepspeed")
ARGS = ["predict", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "16", "--batch", "32", "--seq", "1024", "--tp", "4",
        "--pp", "2", "--framework", "megatron-deepspeed", "--json"]


def test_predict_flag_and_request_match_the_api():
    runner = CliRunner()
    out = {}
    for flag, value in (("--scatter-gather-p2p", True), ("--no-scatter-gather-p2p", False)):
        r = runner.invoke(app, [*ARGS, flag])
        assert r.exit_code == 0, r.output
        d = json.loads(r.stdout)
        assert d["parallel"]["scatter_gather_p2p"] is value
        ref = wattcast.predict_cluster("gpt2", "DGX-A100", **JOB, scatter_gather_p2p=value)
        assert d["step_time_ms"] == pytest.approx(ref.step_time_ms, rel=1e-12)
        out[value] = d["exposed_comm_split_ms"]["pp"]
    assert out[False] > out[True]  # whole tensors across nodes cost more than 1/tp plus an NVLink all-gather
    req = wattcast.request.PredictRequest(model="gpt2", cluster="DGX-A100", batch=32, seq=1024, framework="megatron-deepspeed",
                                          parallel=wattcast.request.ParallelOptions(gpus=16, tp=4, pp=2),
                                          scatter_gather_p2p=False)
    got = req.predict()
    assert got.to_dict()["parallel"]["scatter_gather_p2p"] is False
    assert got.step_time_ms == pytest.approx(wattcast.predict_cluster("gpt2", "DGX-A100", **JOB,
                                                                      scatter_gather_p2p=False).step_time_ms, rel=1e-12)


def test_single_device_refuses_the_flag():
    r = CliRunner().invoke(app, ["predict", "-m", "gpt2", "-d", "A100-SXM4-80GB", "--no-scatter-gather-p2p"])
    assert r.exit_code == 2 and "need --cluster" in r.output


def test_search_flag_and_sweep_key(tmp_path):
    space = dict(tp=[2], pp=[4], zero=[0], micro_batch=[1], recompute=["none"], interleave=[1])
    kw = dict(framework="megatron-deepspeed", max_configs=2000, workers=1)
    api = wattcast.search("gpt2", "DGX-A100", 16, 32, 1024, **kw, scatter_gather_p2p=False).ranked.set_index("config")
    default = wattcast.search("gpt2", "DGX-A100", 16, 32, 1024, **kw).ranked.set_index("config")
    r = CliRunner().invoke(app, ["search", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "16", "--batch", "32",
                                 "--seq", "1024", "--framework", "megatron-deepspeed", "--max-configs", "2000",
                                 "--workers", "1", "--top", "5000", "--no-scatter-gather-p2p", "--json"])
    assert r.exit_code == 0, r.output
    cli = {row["config"]: row["step_time_ms"] for row in json.loads(r.stdout)["ranked"]}
    assert cli and all(t == pytest.approx(api.loc[c, "step_time_ms"], rel=1e-12) for c, t in cli.items())
    # the flag reached the candidates that have something to scatter (TP > 1 across pipeline stages)
    moved = [c for c in cli if api.loc[c, "tp"] > 1 and api.loc[c, "pp"] > 1 and not api.loc[c, "sp"]]
    # (whole tensors cost more across nodes; on hops inside a node, NVLink since stop 47, scattering can cost more)
    assert moved and all(cli[c] != default.loc[c, "step_time_ms"] for c in moved)
    assert any(cli[c] > default.loc[c, "step_time_ms"] for c in moved)
    ref = wattcast.search("gpt2", "DGX-A100", 16, 32, 1024, framework="megatron-deepspeed", max_configs=5,
                          scatter_gather_p2p=False, **space).ranked["step_time_ms"].iloc[0]
    spec = dict(models=["gpt2"], clusters=["DGX-A100"], gpus=[16], batch=32, seq=1024, framework="megatron-deepspeed",
                max_configs=5, top=1, space=space)
    plain, off = load_spec(spec).tasks()[0], load_spec(dict(spec, scatter_gather_p2p=False)).tasks()[0]
    assert "scatter_gather_p2p" not in plain and off["scatter_gather_p2p"] is False
    assert plain["task_id"] != off["task_id"]
    df = read_sweep(run_sweep(dict(spec, scatter_gather_p2p=False), tmp_path / "o", workers=0).output)
    assert df["step_time_ms"].iloc[0] == pytest.approx(ref, rel=1e-12)
    with pytest.raises(SweepSpecError, match="scatter_gather_p2p"):
        load_spec(dict(spec, scatter_gather_p2p="no"))
