"""Edge cases of search, sweep, predict's JSON and outputs, the Chrome trace and the pipeline/recompute options:
search and sweep name the rules that leave no strategy, exposed_comm_split_ms names every class, --trace never
overwrites an input (nor an existing file without --overwrite), trace tracks never partly overlap, the stage-layer
options say what is wrong, --recompute-method needs full recomputation, and --json echoes the run's settings."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from typer.testing import CliRunner

import wattcast
from conftest import REPO, flat
from wattcast.cli import app
from wattcast.simulate.parallel import ParallelConfig, ParallelConfigError, resolve_parallel

runner = CliRunner()


def run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert not (r.exception and not isinstance(r.exception, SystemExit)), f"traceback: {r.exception!r}"
    return r


# ------------------------------------------------------------------ 1. search: why no strategy is valid
NODE_RULE = "12 GPUs do not fill whole nodes"


def test_search_with_no_candidate_names_the_job_rule_predict_gives():
    r = run("search", "--model", "llama3_8b", "--cluster", "DGX-H100", "--gpus", "12", "--batch", "64", "--seq", "4096")
    err = flat(r.stderr)
    assert r.exit_code == 2 and NODE_RULE in err and "--gpus-per-node" in err and "none generated" not in err
    p = run("predict", "--model", "llama3_8b", "--cluster", "DGX-H100", "--gpus", "12", "--batch", "48", "--seq", "4096")
    assert p.exit_code == 2 and NODE_RULE in flat(p.stderr)
    res = wattcast.search("llama3_8b", "DGX-H100", 12, 64, 4096)
    # since stop 54 the space holds pp 3 (12 = tp 1 x pp 3 x dp 4): those candidates are rejected by the same rule
    assert res.ranked.empty and NODE_RULE in res.why_none["DGX-H100"]
    assert res.rejected.empty or res.rejected["rule"].str.contains(NODE_RULE, regex=False).any()
    assert NODE_RULE in res.invalid_reason()


def test_search_whose_candidates_all_break_rules_gives_the_most_common_with_counts():
    # rules of the candidates themselves (heads by tp): counted, the most common first
    res = wattcast.search("gpt2", "DGX-H100", 16, 32, 512, tp=(8, 16), max_configs=12)
    assert res.ranked.empty and len(res.rejected) and not res.why_none
    why = res.invalid_reason()
    top = res.rejected["rule"].value_counts()
    assert "must be divisible by tp" in why and f"({top.iloc[0]} of {len(res.rejected)})" in why and "most common" in why
    assert why.index(top.index[0]) < why.index(top.index[1])  # most common first
    # a job-level rule leads; the candidates it rejected are counted, not repeated
    res = wattcast.search("gpt2", "DGX-H100", 12, 48, 512, max_configs=12)
    why = res.invalid_reason()
    assert why.startswith(NODE_RULE) and why.count(NODE_RULE) == 1 and f"of the {len(res.rejected)} candidate" in why
    # a precision the cluster's GPU lacks (fp8 on an A100) is a rule of the job, said once as predict says it, not
    # "k of n candidates" (audit 54a: "540 of 1252", some candidates broke another rule first); another cluster's
    # candidates keep their counted rules
    fp8_rule = "--dtype fp8 runs the GEMMs on FP8 tensor cores, but A100-SXM4-80GB's spec has no peak_fp8_tflops"
    res = wattcast.search("gpt2", "DGX-A100", 8, 32, 512, dtype="fp8", max_configs=12)
    why = res.invalid_reason()
    assert res.ranked.empty and res.why_none["DGX-A100"].startswith(fp8_rule)
    assert why.startswith(fp8_rule) and why.count(fp8_rule) == 1
    assert f"every one of the {len(res.rejected)} candidate strategies breaks it" in why
    n_fp8 = int((res.rejected["rule"] == res.why_none["DGX-A100"]).sum())
    assert 0 < n_fp8 < len(res.rejected) and f"({n_fp8} of {len(res.rejected)})" not in why
    res = wattcast.search("gpt2", ["DGX-A100", "DGX-H100"], 16, 32, 512, dtype="fp8", tp=(8, 16), max_configs=12)
    why = res.invalid_reason()
    assert why.startswith(f"cluster DGX-A100: {fp8_rule}") and why.count(fp8_rule) == 1
    assert "cluster DGX-H100: every one of" in why and "must be divisible by tp (8)" in why
    # a search space that generates nothing says which rules its configurations break
    res = wattcast.search("gpt2", "DGX-A100", 8, 32, 512, cp=[3])
    assert res.rejected.empty and "must be a multiple of tp x pp x cp" in res.why_none["DGX-A100"]


# ------------------------------------------------------------------ 2. sweep: rules are not memory
def test_sweep_status_tells_broken_rules_from_memory_and_carries_the_reason(tmp_path):
    from wattcast.sweep import read_sweep, run_sweep, summary

    spec = dict(models=["gpt2"], clusters=["DGX-A100", "DGX-H100"], gpus=[8, 12], batch=48, seq=512, max_configs=6,
                dtype="fp8")
    best = summary(read_sweep(run_sweep(spec, tmp_path / "o", workers=0).output)).set_index(["cluster", "gpus"])
    assert best.loc[("DGX-H100", 8), "status"] == "ok" and best.loc[("DGX-H100", 8), "error"] == ""
    for key in [("DGX-A100", 8), ("DGX-A100", 12), ("DGX-H100", 12)]:
        assert best.loc[key, "status"] == "no valid strategy", key
        assert best.loc[key, "error"].startswith("no valid strategy (")
    assert "has no FP8 tensor cores: A100, V100, MI250 and older" in best.loc[("DGX-A100", 8), "error"]
    assert NODE_RULE in best.loc[("DGX-H100", 12), "error"]


def test_sweep_json_best_rows_carry_the_error_text(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("models: [gpt2]\nclusters: [DGX-A100]\ngpus: [8]\nbatch: 16\nseq: 256\nmax_configs: 4\ndtype: fp8\n")
    r = run("sweep", spec, "--output", tmp_path / "o", "--workers", "0", "--json")
    assert r.exit_code == 0, r.stderr
    best = json.loads(r.stdout)["best"][0]
    assert best["status"] == "no valid strategy" and "has no FP8 tensor cores" in best["error"]


# ------------------------------------------------------------------ 3. exposed_comm_split_ms: every class
CLASSES = {"tp", "dp", "pp", "cp", "ep"}


def test_exposed_comm_split_names_every_class():
    res = wattcast.predict_cluster("gpt2", "DGX-A100", gpus=8, batch=16, seq=256, pp=2)  # tp 1, ep 1, cp 1
    assert set(res.exposed_comm_split_ms) == CLASSES
    assert res.exposed_comm_split_ms["tp"] == 0.0 and res.exposed_comm_split_ms["ep"] == 0.0
    assert set(res.to_dict()["exposed_comm_split_ms"]) == CLASSES
    tp = wattcast.predict_cluster("gpt2", "DGX-A100", gpus=8, batch=16, seq=256, tp=2)
    assert set(tp.exposed_comm_split_ms) == CLASSES and tp.exposed_comm_split_ms["tp"] > 0


# ------------------------------------------------------------------ 4. --trace never overwrites an input
def _predict_trace(model, trace, *extra):
    return run("predict", "--model", model, "--device", "H100", "--mode", "inference", "--batch", "1", "--seq", "64",
               "--trace", trace, *extra)


def test_trace_refuses_the_model_device_and_cluster_files(tmp_path):
    cfg = tmp_path / "clob.json"
    text = (REPO / "featurize" / "hf_configs" / "gpt2.json").read_text()
    cfg.write_text(text)
    r = _predict_trace(cfg, cfg)
    assert r.exit_code == 2 and "--model input" in flat(r.stderr) and cfg.read_text() == text
    link = tmp_path / "link.json"
    link.symlink_to(cfg)
    r = _predict_trace(cfg, link)
    assert r.exit_code == 2 and "--model input" in flat(r.stderr) and cfg.read_text() == text
    (tmp_path / "m").mkdir()  # a model folder: its config.json
    (tmp_path / "m" / "config.json").write_text(text)
    r = _predict_trace(tmp_path / "m", tmp_path / "m" / "config.json")
    assert r.exit_code == 2 and (tmp_path / "m" / "config.json").read_text() == text
    dev = tmp_path / "h100.json"
    dev.write_text(run("devices", "H100", "--json").stdout)
    spec = dev.read_text()
    r = run("predict", "--model", "gpt2", "--device", dev, "--mode", "inference", "--trace", dev, "--overwrite")
    assert r.exit_code == 2 and "--device input" in flat(r.stderr) and dev.read_text() == spec
    cl = tmp_path / "cl.json"
    cl.write_text(run("clusters", "DGX-H100").stdout)
    spec = cl.read_text()
    r = run("predict", "--model", "gpt2", "--cluster", cl, "--gpus", "8", "--batch", "8", "--seq", "128", "--trace",
            tmp_path / "." / "cl.json", "--overwrite")
    assert r.exit_code == 2 and "--cluster input" in flat(r.stderr) and cl.read_text() == spec
    r = run("predict", "--model", "gpt2", "--cluster", cl, "--gpus", "8", "--batch", "8", "--seq", "128", "--plot", cl)
    assert r.exit_code == 2 and cl.read_text() == spec


def test_trace_replaces_an_existing_file_only_with_overwrite(tmp_path):
    out = tmp_path / "t.json"
    out.write_text("keep me")
    r = _predict_trace("gpt2", out)
    assert r.exit_code == 2 and "--overwrite" in flat(r.stderr) and out.read_text() == "keep me"
    r = _predict_trace("gpt2", out, "--overwrite")
    assert r.exit_code == 0 and json.loads(out.read_text())["traceEvents"]
    new = tmp_path / "new" / "t2.json"
    assert _predict_trace("gpt2", new).exit_code == 0 and new.is_file()


# ------------------------------------------------------------------ 5. trace tracks never partly overlap
def _partial_overlaps(events) -> list:
    """Complete events of one (pid, tid) that overlap without nesting, on whole nanoseconds as a viewer reads them."""
    by = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            a = round(e["ts"] * 1000)
            by[(e["pid"], e["tid"])].append((a, a + round(e["dur"] * 1000), e["name"]))
    bad = []
    for key, spans in by.items():
        stack = []
        for a, b, name in sorted(spans, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1][1] <= a:
                stack.pop()
            if stack and b > stack[-1][1]:
                bad.append((key, stack[-1], (a, b, name)))
            stack.append((a, b, name))
    return bad


def test_distributed_trace_puts_each_kind_of_comm_on_its_own_named_track():
    from wattcast.simulate.trace import distributed_trace_events

    res = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=64, batch=16, seq=32768, tp=2, pp=4, dp=2, cp=4, sp=True,
                                   zero=1, micro_batch=1, interleave=2, framework="megatron", trace=True)
    ev = distributed_trace_events(res)
    assert _partial_overlaps(ev) == []
    x = [e for e in ev if e.get("ph") == "X"]
    tid_of = defaultdict(set)
    for e in x:
        tid_of[str(e["name"]).split(".")[0].rstrip("0123456789")].add(e["tid"])
    assert tid_of["cp"] and tid_of["dp"] and not (tid_of["cp"] & tid_of["dp"])
    assert not ((tid_of["cp"] | tid_of["dp"]) & (tid_of["F"] | tid_of["B"]))
    named = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    assert all((e["pid"], e["tid"]) in named for e in x)
    assert {named[(0, t)] for t in tid_of["cp"]} == {"comm: cp (ring KV exchange)"}


def test_trace_slices_meet_to_the_nanosecond():
    from wattcast.simulate.trace import chrome_trace_events, distributed_trace_events

    one = wattcast.predict("gpt2", "A100", batch=8, seq=512)
    ev = chrome_trace_events(one)
    assert _partial_overlaps(ev) == []
    xs = [e for e in ev if e["ph"] == "X"]
    ends = [round(e["ts"] * 1000) + round(e["dur"] * 1000) for e in xs]
    assert all(round(b["ts"] * 1000) == a for a, b in zip(ends, xs[1:]))  # back to back, exactly
    many = wattcast.predict_cluster("gpt2", "DGX-H100", gpus=8, pp=4, batch=2048, seq=1024, micro_batch=4, trace=True)
    assert _partial_overlaps(distributed_trace_events(many)) == []


def test_lanes_keep_partly_overlapping_events_of_one_kind_apart():
    from wattcast.simulate.trace import _lanes

    lanes = _lanes([(0, 10, 0), (2, 5, 1), (8, 12, 2), (12, 20, 3)])
    assert lanes == {0: 0, 1: 0, 2: 1, 3: 0}  # nested stays, partly overlapping moves, back to back stays


# ------------------------------------------------------------------ 6. pipeline layers and recompute method
RULES = dict(batch=8, n_layers=32, n_heads=32, seq=1024)


@pytest.mark.parametrize("kw,msg", [
    (dict(pp_first_layers=40), "--pp-first-stage-layers 40 exceeds the model's 32 transformer layers"),
    (dict(pp_last_layers=33), "--pp-last-stage-layers 33 exceeds the model's 32 transformer layers"),
    (dict(pp_first_layers=0), "--pp-first-stage-layers must be a whole number of layers, at least 1"),
    (dict(pp_last_layers=-2), "--pp-last-stage-layers must be a whole number of layers, at least 1"),
])
def test_stage_layer_options_say_what_is_wrong(kw, msg):
    with pytest.raises(ParallelConfigError) as e:
        resolve_parallel(ParallelConfig(gpus=2, pp=2, micro_batch=1, **kw), **RULES)
    assert msg in str(e.value) and "-8" not in str(e.value)


def test_stage_layer_options_on_the_command_line_and_in_a_strategy():
    base = ("predict", "--model", "llama3_8b", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "8", "--seq", "1024")
    r = run(*base, "--pp", "2", "--pp-first-stage-layers", "40")
    assert r.exit_code == 2 and "40 exceeds the model's 32 transformer layers" in flat(r.stderr)
    r = run(*base, "--pp", "4", "--pp-first-stage-layers", "20", "--pp-last-stage-layers", "20")
    assert r.exit_code == 2 and "together (40) exceed the model's 32" in flat(r.stderr)
    r = run(*base, "--pp", "2", "--pp-first-stage-layers", "0")
    assert r.exit_code == 2 and "at least 1" in flat(r.stderr)
    from wattcast.simulate.strategy import StrategyError, parse_strategy

    with pytest.raises(StrategyError, match="at least 1 layer"):
        parse_strategy("tp1-pp2-dp4-mb1-ppf0")


def test_recompute_method_needs_full_recomputation_everywhere():
    with pytest.raises(ParallelConfigError, match="--recompute-method block .* needs --recompute full \\(got selective\\)"):
        resolve_parallel(ParallelConfig(gpus=1, recompute="selective", recompute_method="block"), **RULES)
    with pytest.raises(ParallelConfigError, match="needs --recompute full \\(got none\\)"):
        wattcast.predict_cluster("gpt2", "DGX-A100", gpus=8, batch=8, recompute_method="uniform")
    from wattcast.request import ParallelOptions, PredictRequest, parallel_defaults

    with pytest.raises(ParallelConfigError, match="needs --recompute full"):
        PredictRequest("gpt2", cluster="DGX-A100", batch=8, recompute="selective",
                       parallel=ParallelOptions(gpus=8, recompute_method="block")).predict()
    assert parallel_defaults()["recompute_method"] == "block"
    base = ("predict", "--model", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", "--batch", "8", "--seq", "128")
    r = run(*base, "--recompute", "selective", "--recompute-method", "block")
    assert r.exit_code == 2 and "needs --recompute full (got selective)" in flat(r.stderr)
    r = run(*base, "--recompute-num-layers", "2")  # as before: the layer count needs full too
    assert r.exit_code == 2 and "needs --recompute full" in flat(r.stderr)
    # with full recomputation: a layer count takes the block method unless told otherwise
    r = run(*base, "--recompute", "full", "--recompute-num-layers", "2", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["parallel"]["recompute_method"] == "block"
    r = run(*base, "--recompute", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["parallel"]["recompute_method"] == "uniform"
    r = run("predict", "--model", "gpt2", "--device", "A100", "--recompute-method", "block")
    assert r.exit_code == 2 and "need --cluster" in flat(r.stderr)


# ------------------------------------------------------------------ 7. --json echoes the settings; warnings always
def test_single_device_json_has_settings_and_warnings():
    r = run("predict", "--model", "gpt2", "--device", "A100", "--batch", "2", "--seq", "128", "--dtype", "fp16",
            "--recompute", "selective", "--attention", "eager", "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["warnings"] == []
    s = d["settings"]
    assert (s["dtype"], s["batch"], s["seq"], s["attention"], s["optimizer"], s["recompute"], s["mode"], s["framework"]) \
        == ("fp16", 2, 128, "eager", "adamw", "selective", "train", "hf")
    assert s["device"] == d["device"] and s["model"] == "gpt2"
    api = wattcast.predict("gpt2", "A100", batch=2, seq=128, dtype="fp16", recompute="selective", attention="eager")
    assert api.meta["settings"] == s and api.to_dict()["settings"] == s and api.to_dict()["warnings"] == []
    inf = json.loads(run("predict", "--model", "gpt2", "--device", "A100", "--mode", "inference", "--json").stdout)
    assert inf["settings"]["mode"] == "inference" and inf["settings"]["optimizer"] is None and inf["warnings"] == []


def test_cluster_json_has_settings_and_warnings():
    r = run("predict", "--model", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", "--batch", "32", "--seq", "256",
            "--tp", "2", "--framework", "megatron", "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    s = d["settings"]
    assert d["warnings"] == [] and s["batch"] == 32 and s["seq"] == 256 and s["gpus"] == 8
    assert s["cluster"] == d["cluster"] and s["framework"] == "megatron" and s["dtype"] == "bf16"
    assert s["strategy"].startswith("tp2-pp1-dp4") and s["micro_batch"] == d["parallel"]["micro_batch"]
    assert set(d["exposed_comm_split_ms"]) == CLASSES
    # a warning is listed there as well as on stderr
    r = run("predict", "--model", "llama3_8b", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "8", "--seq", "16384",
            "--tp", "8", "--sp", "--recompute", "full", "--json", "--allow-oom")
    w = json.loads(r.stdout)["warnings"]
    assert r.exit_code == 0 and w and "max_position_embeddings" in w[0]
