"""Parallel strategies, the pipeline scheduler, distributed predictions and their CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattcast
from conftest import flat, run_cli
from wattcast.data.cluster_spec import ClusterSpecError, cluster_from_dict, from_astra_network, resolve_cluster
from wattcast.simulate.parallel import ParallelConfig, ParallelConfigError, group_layout, resolve_parallel
from wattcast.simulate.scheduler import schedule_order, simulate_pipeline


# ------------------------------------------------------------------ cluster specs
def test_presets_resolve_and_derive_bandwidth():
    c = resolve_cluster("dgx-h100")
    assert c.gpus_per_node == 8 and c.inter_bandwidth_per_gpu_gb_per_s == pytest.approx(50.0)
    assert resolve_cluster("DGX_A100").name == "DGX-A100"
    with pytest.raises(ClusterSpecError, match="unknown cluster 'dgx-z100'"):
        resolve_cluster("dgx-z100")


def test_cluster_validation_names_the_field():
    base = dict(name="x", device="A100-SXM4-80GB", gpus_per_node=8, source="test",
                intra=dict(kind="nvswitch", bandwidth_gb_per_s=300, latency_us=3),
                inter=dict(kind="infiniband", nics_per_node=8, nic_bandwidth_gbit_per_s=200, latency_us=5))
    assert cluster_from_dict(base).name == "x"
    bad = json.loads(json.dumps(base))
    bad["intra"]["bandwidth_gb_per_s"] = -1
    with pytest.raises(ClusterSpecError, match="intra.bandwidth_gb_per_s"):
        cluster_from_dict(bad)
    bad = json.loads(json.dumps(base))
    bad["inter"]["nic_bandwidth_gbit_per_s"] = 20000  # GB/s typed as Gbit/s
    with pytest.raises(ClusterSpecError, match="check units"):
        cluster_from_dict(bad)
    bad = json.loads(json.dumps(base))
    bad["inter"]["oversubscription"] = 0.5
    with pytest.raises(ClusterSpecError, match="oversubscription"):
        cluster_from_dict(bad)
    bad = dict(base, colour="red")
    with pytest.raises(ClusterSpecError, match="unknown field"):
        cluster_from_dict(bad)


def test_astra_sim_network_import():
    c = from_astra_network({"topology": ["FullyConnected", "Switch"], "npus_count": [8, 4], "bandwidth": [150.0, 25.0],
                            "latency": [500.0, 2000.0]}, device="H100-SXM5-80GB")
    assert (c.gpus_per_node, c.max_nodes) == (8, 4)
    # ASTRA-sim's bandwidth is per link: FullyConnected 8 NPUs = 7 links of 150 GB/s per GPU, a full mesh
    assert c.intra.bandwidth_gb_per_s == 7 * 150.0 and c.intra.topology == "full_mesh" and c.intra.latency_us == 0.5
    assert c.inter_bandwidth_per_gpu_gb_per_s == pytest.approx(25.0)
    with pytest.raises(ClusterSpecError, match="names no GPU"):
        from_astra_network({"topology": ["Ring"], "npus_count": [4], "bandwidth": [50], "latency": [500]})


# ------------------------------------------------------------------ parallel rules
@pytest.mark.parametrize("kw,msg", [
    (dict(gpus=8, tp=3), "multiple of tp x pp"),
    (dict(gpus=8, tp=8, pp=1), "attention heads \\(12\\) must be divisible by tp \\(8\\)"),
    (dict(gpus=8, pp=4, interleave=2, micro_batch=1, pp_first_layers=3, pp_last_layers=3),
     "with --interleave 2, every stage's layers must divide by it"),
    (dict(gpus=8, pp=8, interleave=2, micro_batch=1), "layers \\(12\\) must be at least pp x interleave"),
    (dict(gpus=8, dp=8, micro_batch=3), "global batch \\(16\\) must be divisible by dp x micro-batch"),
    (dict(gpus=8, sp=True), "sequence parallelism\\) needs tensor parallelism"),
    (dict(gpus=8, ep=2), "needs a mixture-of-experts model"),
    (dict(gpus=8, pp=4, interleave=3, micro_batch=4), "number of micro-batches \\(2\\) to be a multiple of pp \\(4\\)"),
    (dict(gpus=8, zero=4), "--zero must be 0, 1, 2 or 3"),
])
def test_parallel_rules_say_which_rule_broke(kw, msg):
    with pytest.raises(ParallelConfigError, match=msg):
        resolve_parallel(ParallelConfig(**kw), batch=16, n_layers=12, n_heads=12, ffn=3072)


def test_parallel_defaults_and_layout():
    p = resolve_parallel(ParallelConfig(gpus=16, tp=4, pp=2), batch=32, n_layers=24, n_heads=16)
    assert p.dp == 2 and p.micro_batch == 1 and p.n_micro(32) == 16
    assert group_layout(4, 1, 8) == group_layout(4, 1, 8)
    tp = group_layout(8, 1, 8)
    assert (tp.gpus_per_node, tp.nodes) == (8, 1)
    dp = group_layout(16, 8, 8)  # dp stride = tp = 8: one member per node
    assert (dp.gpus_per_node, dp.nodes) == (1, 16)


# ------------------------------------------------------------------ scheduler
def test_1f1b_order_and_bubble():
    order = schedule_order(0, 4, 8)
    assert [k for k, _, _ in order[:4]] == ["F"] * 4 and order[-1][0] == "B"
    assert sum(k == "F" for k, _, _ in order) == 8
    f = np.full(4, 1.0)
    b = np.full(4, 2.0)
    r = simulate_pipeline(f, b, n_micro=8)
    # the textbook 1F1B step: (m + p - 1) x (f + b)
    assert r.stage_end.max() == pytest.approx((8 + 4 - 1) * 3.0)
    gp = simulate_pipeline(f, b, n_micro=8, kind="gpipe")
    assert gp.stage_end.max() == pytest.approx((8 + 4 - 1) * 3.0)


def test_interleaving_shrinks_the_bubble():
    P, M, V = 4, 8, 2
    plain = simulate_pipeline(np.full(P, 1.0), np.full(P, 2.0), n_micro=M)
    inter = simulate_pipeline(np.full(P * V, 0.5), np.full(P * V, 1.0), n_micro=M, interleave=V)
    assert inter.stage_end.max() < plain.stage_end.max()
    assert inter.stage_busy == pytest.approx(plain.stage_busy)


# ------------------------------------------------------------------ distributed predictions
def test_distributed_prediction_fields_and_tradeoffs():
    base = dict(gpus=8, batch=16, seq=1024, dtype="bf16", attention="flash")
    dp = wattcast.predict_cluster("gpt2_medium", "dgx-a100", **base)
    tp = wattcast.predict_cluster("gpt2_medium", "dgx-a100", tp=8, **base)
    pp = wattcast.predict_cluster("gpt2_medium", "dgx-a100", pp=4, micro_batch=1, **base)
    for r in (dp, tp, pp):
        d = r.to_dict()
        for k in ("mfu", "tflops_per_gpu", "hfu", "exposed_comm_ms", "bubble_ms", "memory_gb", "fits", "step_time_ms"):
            assert k in d
        assert 0 < r.mfu < 1 and r.fits
        assert d["memory_capacity_gb"] == pytest.approx(80 * 2**30 / 1e9) and d["memory_flag"] == ""  # 80 GiB GPUs
    assert pp.bubble_ms > 0 and dp.bubble_ms == 0
    # tensor parallelism shards the weights: less memory per GPU than pure data parallelism
    assert tp.memory_gb < dp.memory_gb
    # ZeRO shards optimizer state across the 8 replicas
    z = wattcast.predict_cluster("gpt2_medium", "dgx-a100", zero=1, **base)
    assert z.per_device[0]["optimizer_gb"] == pytest.approx(dp.per_device[0]["optimizer_gb"] / 8)


def test_multi_node_is_slower_than_one_node_for_the_same_dp():
    one = wattcast.predict_cluster("gpt3_2.7b", "dgx-h100", gpus=8, batch=8, seq=2048, dtype="bf16", attention="flash")
    two = wattcast.predict_cluster("gpt3_2.7b", "dgx-h100", gpus=16, batch=16, seq=2048, dtype="bf16", attention="flash")
    assert two.comm["dp_sync_ms"] > one.comm["dp_sync_ms"]
    assert two.comm["layouts"]["dp"]["nodes"] == 2


def test_search_ranks_valid_strategies_and_pareto():
    res = wattcast.search("gpt2", "nvlink-4gpu", gpus=4, batch=8, seq=1024, max_configs=40,
                          recompute=("none",), zero=(0,), interleave=(1,))
    r = res.ranked
    assert len(r) >= 4 and r["fits"].iloc[0]
    assert (np.diff(r.loc[r["fits"], "step_time_ms"].to_numpy()) >= 0).all()
    front = res.pareto
    assert (np.diff(front["step_time_ms"].to_numpy()) >= 0).all() and (np.diff(front["memory_gb"].to_numpy()) < 0).all()


# ------------------------------------------------------------------ CLI
def test_predict_cluster_json_contract(tmp_path):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    r = run_cli("predict", "--model", "gpt2_medium", "--cluster", "dgx-a100", "--gpus", "8", "--tp", "2", "--pp", "2",
                "--micro-batch", "2", "--batch", "32", "--seq", "1024", "--dtype", "bf16", "--zero", "1", "--sp",
                "--recompute", "selective", "--json", "--trace", trace, "--plot", png)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for k in ("mfu", "tflops_per_gpu", "hfu", "exposed_comm_ms", "bubble_ms", "memory_gb", "fits", "step_time_ms",
              "forward_ms", "backward_ms", "optimizer_ms", "flops", "per_op", "fallback_ops", "ood_fraction"):
        assert k in d, k
    assert d["parallel"]["dp"] == 2 and d["parallel"]["sp"] is True
    ev = json.loads(trace.read_text())["traceEvents"]
    assert {e["pid"] for e in ev if e.get("ph") == "X"} == {0, 1}
    assert {e["pid"] for e in ev if e.get("ph") == "C" and e["name"] == "power"} == {0, 1}
    assert png.stat().st_size > 1000


def test_predict_cluster_bad_rule_and_oom():
    r = run_cli("predict", "--model", "gpt2", "--cluster", "dgx-a100", "--gpus", "8", "--tp", "8", "--batch", "8")
    assert r.returncode == 2 and "attention heads (12) must be divisible by tp (8)" in flat(r.stderr)
    r = run_cli("predict", "--model", "gpt3_175b", "--cluster", "dgx-a100", "--gpus", "8", "--batch", "8", "--seq", "2048",
                "--dtype", "bf16")
    assert r.returncode == 3 and "does not fit" in flat(r.stderr) and "Traceback" not in r.stderr


# ------------------------------------------------------------------ validation on real data
#: reached by this version (NeuSight 4-GPU: |error| per strategy; vTrain: mean |error| on the evaluation half)
# tp4 was 8.0 until the collective correction was confined to the fabrics it was fitted on (the 4-GPU NVLink
# machine is not one): -6.0% -> -8.7% (README "Collectives" gives every figure the change moved); 9.0 until the GEMM
# family was retrained with extra XLA rows: -8.7% -> -9.2% (FP32 GEMMs on A100-SXM4-40GB moved); -9.1% since the
# withheld H100 rows were taken back out of its training (stop 29)
# tp4 9.5 -> 11.5 at stop 47: the backward dgrad all-reduces now run beside the wgrad GEMMs (Megatron-LM's
# LinearWithGradAccumulationAndAsyncCommunication, which accelerate's integration runs): -9.5 -> -11.0%
NEUSIGHT_4GPU_BOUND_PCT = {"dp4": 2.0, "tp4": 11.5, "pp4_1": 3.5}


@pytest.mark.e2e
def test_neusight_4gpu_labels_regression(data_root):
    from wattcast.validation.distributed_validation import neusight_distributed

    df = neusight_distributed(data_root).set_index("strategy")
    for k, bound in NEUSIGHT_4GPU_BOUND_PCT.items():
        assert abs(df.loc[k, "error_pct"]) <= bound, (k, df.loc[k, "error_pct"])


@pytest.mark.e2e
def test_vtrain_sample_regression(data_root):
    from wattcast.validation.distributed_validation import fit_split, load_vtrain, predict_vtrain, summarise_vtrain

    _, evaluation = fit_split(load_vtrain(data_root, "single"))
    s = summarise_vtrain(predict_vtrain(evaluation.sample(n=40, random_state=0)))
    assert s["failed"] == 0 and s["mean_abs_pct"] <= 12.0


def test_vtrain_errors_by_tp_degree():
    import pandas as pd

    from wattcast.validation.distributed_validation import vtrain_by_tp

    pred = pd.DataFrame({"tp": [1, 1, 8, 8, 8], "status": ["ok", "ok", "ok", "ok", "graph: x"],
                         "error_pct": [4.0, -2.0, -30.0, -10.0, 99.0]})
    t = vtrain_by_tp(pred, "single").set_index("tp")
    assert list(t.index) == [1, 8] and (t["set"] == "single").all()
    assert t.loc[1, "rows"] == 2 and t.loc[1, "mean_abs_pct"] == pytest.approx(3.0) and t.loc[1, "mean_signed_pct"] == pytest.approx(1.0)
    assert t.loc[8, "rows"] == 2 and t.loc[8, "mean_abs_pct"] == pytest.approx(20.0) and t.loc[8, "mean_signed_pct"] == pytest.approx(-20.0)


def test_search_cli():
    r = run_cli("search", "--model", "gpt2", "--cluster", "nvlink-4gpu", "--gpus", "4", "--batch", "8", "--seq", "1024",
                "--max-configs", "12", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["ranked"] and d["pareto"] and all("config" in x for x in d["ranked"])


@pytest.mark.e2e
def test_vtrain_multi_node_sample_regression(data_root):
    from wattcast.validation.distributed_validation import VTRAIN_RECOMPUTE, load_vtrain, predict_vtrain, summarise_vtrain

    multi = load_vtrain(data_root, "multi").sample(n=20, random_state=0)
    s = summarise_vtrain(predict_vtrain(multi, recompute=VTRAIN_RECOMPUTE["multi"]))
    assert s["failed"] == 0 and s["mean_abs_pct"] <= 15.0


#: reached by this version on MosaicML's MPT FSDP table (139 rows, all evaluated; nothing was fitted on them):
#: mean |error| 12.7%, signed -10.3%
MPT_MEAN_ABS_BOUND_PCT = 14.0


@pytest.mark.e2e
def test_mpt_fsdp_table_regression(data_root):
    from wattcast.validation.mpt_validation import load_mpt, predict_mpt, summarise_mpt

    pred = predict_mpt(load_mpt(data_root))
    assert (pred["status"] == "ok").all(), pred.loc[pred["status"] != "ok", "status"].tolist()
    # the generated MPT graphs carry the published parameter counts
    assert ((pred["predicted_params"] / pred["num_params"] - 1).abs() < 1e-3).all()
    s = summarise_mpt(pred).set_index("group")
    assert s.loc["all", "rows"] == len(pred) and s.loc["all", "predicted_not_to_fit"] == 0  # every run ran
    assert s.loc["all", "mean_abs_pct"] <= MPT_MEAN_ABS_BOUND_PCT


def test_mpt_loader_names_missing_columns_and_models(tmp_path):
    from wattcast.validation.mpt_validation import load_mpt

    base = tmp_path / "endtoend" / "mpt"
    base.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="mpt_training_benchmarks.csv"):
        load_mpt(tmp_path)
    (base / "mpt_model_dims.csv").write_text("model,d_model,n_heads,n_layers,expansion_ratio,vocab_size\n1b,2048,16,24,4,50368\n")
    (base / "mpt_training_benchmarks.csv").write_text("Model,SeqLen (T)\n1b,2048\n")
    with pytest.raises(ValueError, match="missing column"):
        load_mpt(tmp_path)
    head = ("Model,SeqLen (T),# GPUs,GPU,MFU,MicroBatchSize,GradAccum,GlobalBatchSize,Throughput (T/s/GPU),Precision,"
            "Activation Checkpointing,NumParams\n")
    (base / "mpt_training_benchmarks.csv").write_text(head + "2b,2048,8,a100_40gb,50,4,1,32,1000,bf16,False,1\n")
    with pytest.raises(ValueError, match=r"model\(s\) \['2b'\] have no sizes"):
        load_mpt(tmp_path)
    (base / "mpt_training_benchmarks.csv").write_text(head + "1b,2048,8,a100_40gb,50,4,1,32,1000,bf16,False,1\n")
    df = load_mpt(tmp_path)
    assert df.loc[0, "measured_ms"] == pytest.approx(1e3 * 32 * 2048 / (1000 * 8))


def test_short_graph_equals_full_graph(monkeypatch):
    """Uniform models are costed from a 3-block graph whose middle block stands for the others: every output
    must equal the full-depth graph's."""
    from wattcast.simulate import distributed as D

    cases = [("gpt3_2.7b", dict(tp=2, pp=2, micro_batch=2, zero=1, recompute="full")),
             ("llama2_7b", dict(tp=2, pp=2, micro_batch=1, sp=True, interleave=2, recompute="selective")),
             ("mixtral_8x7b", dict(tp=2, pp=1, ep=2, micro_batch=1, zero=3)),
             ("mpt_7b", dict(tp=1, pp=1, micro_batch=2, zero=3, recompute="full")),
             ("bloom_560m", dict(tp=2, pp=2, micro_batch=2, zero=1, recompute="selective")),
             ("pythia_160m", dict(tp=2, pp=1, micro_batch=4))]
    # Since stop 56 eager PyTorch's (hf) launch queue runs over the whole step's kernels, the short graph's repeated
    # nodes each taking the mean of their copies: the phase totals are the full graph's, but not how the launch gaps
    # fall on each layer (the full graph gives them to the layers where the host fell behind). Under pipeline
    # parallelism that per-layer split is read per stage (neither is exact there: each stage's host runs its own
    # queue), so those cases are compared on the GPU's times (host_us=0), where every node's time is its own, and
    # within 5% at the default host cost.
    for model, kw in cases:
        args = dict(gpus=8, batch=16, seq=1024, dtype="bf16", attention="eager")
        pp = kw.get("pp", 1) > 1
        if pp:
            args["host_us"] = 0
        short = wattcast.predict_cluster(model, "DGX-H100", **args, **kw).to_dict()
        D._COSTED.clear()
        monkeypatch.setattr(D, "_UNIFORM_FAMILIES", ())
        full = wattcast.predict_cluster(model, "DGX-H100", **args, **kw).to_dict()
        if pp:
            eager = {k: wattcast.predict_cluster(model, "DGX-H100", **dict(args, host_us=None), **kw).step_time_ms
                     for k in ("full",)}
        monkeypatch.undo()
        D._COSTED.clear()
        if pp:
            eager["short"] = wattcast.predict_cluster(model, "DGX-H100", **dict(args, host_us=None), **kw).step_time_ms
            D._COSTED.clear()
            assert eager["short"] == pytest.approx(eager["full"], rel=0.05), model
        for k in ("step_time_ms", "memory_gb", "mfu", "hfu", "energy_j", "exposed_comm_ms", "bubble_ms", "flops",
                  "forward_ms", "backward_ms", "optimizer_ms", "ood_fraction"):
            assert short[k] == pytest.approx(full[k], rel=1e-9, abs=1e-12), (model, k)
        assert short["param_count"] == full["param_count"]
        assert [(p["op_class"], p["count"]) for p in short["per_op"]] == [(p["op_class"], p["count"]) for p in full["per_op"]]
        assert [d["memory_gb"] for d in short["per_device"]] == pytest.approx([d["memory_gb"] for d in full["per_device"]])


def test_prediction_does_not_depend_on_what_ran_before(monkeypatch):
    """Audit 42: Llama 3 8B on DGX-H100 with cp=4 right after an fp8 run in the same process gave 1e-10 another step
    time than in a fresh process (the kernel prediction cache held MLP predictions made in another batch)."""
    from wattcast.simulate import distributed as D
    from wattcast.simulate import single_device as S

    def fresh():
        S._PREDICTION_CACHE.clear()
        S._ADDU_CACHE.clear()
        D._COSTED.clear()

    cp = dict(gpus=8, batch=8, seq=16384, tp=2, cp=4, sp=True, framework="megatron")
    fresh()
    alone = wattcast.predict_cluster("llama3_8b", "DGX-H100", **cp).step_time_ms
    fresh()
    wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=16, seq=2048, tp=2, sp=True, framework="megatron",
                             dtype="fp8")
    after = wattcast.predict_cluster("llama3_8b", "DGX-H100", **cp).step_time_ms
    fresh()
    assert after == alone


def test_overlap_buckets_is_a_fifo_queue():
    from wattcast.simulate.scheduler import overlap_buckets

    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 20))
        ready, dur, start = np.sort(rng.random(n) * 5), rng.random(n), float(rng.random())
        t, spans = start, []
        for r, d in zip(ready, dur):  # the plain loop
            s = max(t, r)
            t = s + d
            spans.append((s, t))
        end, got = overlap_buckets(ready, dur, start)
        assert end == pytest.approx(t) and np.allclose(got, spans)


def test_uneven_pipeline_stages():
    """DeepSpeed's pipeline partitioner splits 14 layers over 4 stages 4, 3, 4, 3; Megatron/PyTorch get the balanced
    split with the short stages first and last (they hold the embedding and the loss): 3, 4, 4, 3; explicit
    first/last stage sizes (Megatron-Core's decoder_first/last_pipeline_num_layers) split the rest evenly."""
    cfg = {"model_type": "gpt2", "n_embd": 512, "n_head": 8, "n_layer": 14, "n_positions": 512, "vocab_size": 1000}
    par = ParallelConfig(gpus=4, pp=4, micro_batch=1)
    from wattcast.simulate.distributed import chunk_of_layer, predict_distributed
    from wattcast.simulate.options import DistributedOptions

    r = predict_distributed(cfg, "nvlink-4gpu", par, DistributedOptions(batch=8, seq=256, framework="megatron-deepspeed"))
    assert r.fits and r.step_time_ms > 0 and r.meta["stage_layers"] == [4, 3, 4, 3]
    assert np.bincount(chunk_of_layer(np.arange(14), 14, 4)).tolist() == [4, 3, 4, 3]
    m = wattcast.predict_cluster(cfg, "nvlink-4gpu", gpus=4, batch=8, seq=256, pp=4, micro_batch=1, framework="megatron")
    assert m.meta["stage_layers"] == [3, 4, 4, 3] and m.to_dict()["parallel"]["stage_layers"] == [3, 4, 4, 3]
    e = wattcast.predict_cluster(cfg, "nvlink-4gpu", gpus=4, batch=8, seq=256, pp=4, micro_batch=1, framework="megatron",
                                 pp_first_stage_layers=2, pp_last_stage_layers=2)
    assert e.meta["stage_layers"] == [2, 5, 5, 2] and e.parallel.describe().endswith("-ppf2-ppl2")  # the strategy's tokens
    # the first stage's busy time follows its layers: fewer layers, less time
    busy = [d["busy_ms"] for d in e.per_device]
    assert busy[0] < busy[1]
    with pytest.raises(ParallelConfigError, match="leave 9 for the other 2 stages: they must divide evenly"):
        wattcast.predict_cluster(cfg, "nvlink-4gpu", gpus=4, batch=8, seq=256, pp=4, micro_batch=1, framework="megatron",
                                 pp_first_stage_layers=3, pp_last_stage_layers=2)
    with pytest.raises(ParallelConfigError, match="need pipeline parallelism"):
        wattcast.predict_cluster(cfg, "nvlink-4gpu", gpus=4, batch=8, seq=256, micro_batch=1, pp_first_stage_layers=3)
    with pytest.raises(ParallelConfigError, match="whole number of layers"):
        wattcast.predict_cluster(cfg, "nvlink-4gpu", gpus=4, batch=8, seq=256, pp=4, micro_batch=1, pp_first_stage_layers=-1)


def test_uneven_stages_with_interleaving():
    """Interleaved 1F1B over stages that do not divide: each stage's layers split over its virtual stages (chunk
    v x pp + s), the embedding's and the loss's chunks taking the fewer; explicit first/last stage sizes must divide
    by the virtual stages (Megatron-Core's rule)."""
    from wattcast.simulate.parallel import chunk_layers

    c = chunk_layers(126, 16, 2)  # Llama 3 405B: stages 7, 8 x 14, 7
    assert len(c) == 32 and sum(c) == 126
    stages = [c[s] + c[16 + s] for s in range(16)]
    assert stages == [7] + [8] * 14 + [7]
    assert c[0] == 3 and c[16] == 4 and c[15] == 4 and c[31] == 3
    assert chunk_layers(128, 16, 2) == [4] * 32
    assert chunk_layers(126, 16, 2, first=6, last=8) == [3] + [4] * 14 + [4] + [3] + [4] * 14 + [4]
    assert chunk_layers(14, 4, 1) == [3, 4, 4, 3]
    with pytest.raises(ParallelConfigError, match="every stage's layers must divide by it"):
        chunk_layers(126, 16, 2, first=7, last=7)
    with pytest.raises(ParallelConfigError, match="fewer than its 4 virtual stages"):
        chunk_layers(14, 4, 4)
    cfg = {"model_type": "gpt2", "n_embd": 512, "n_head": 8, "n_layer": 14, "n_positions": 512, "vocab_size": 1000}
    kw = dict(gpus=4, batch=8, seq=256, pp=4, micro_batch=1, framework="megatron")
    r = wattcast.predict_cluster(cfg, "nvlink-4gpu", interleave=2, **kw)
    assert r.meta["stage_layers"] == [1, 2, 2, 2, 2, 2, 2, 1]
    plain = wattcast.predict_cluster(cfg, "nvlink-4gpu", **kw)
    # the interleaved schedule's bubble is smaller than plain 1F1B's on the same uneven stages
    assert 0 < r.bubble_ms < plain.bubble_ms
    e = wattcast.predict_cluster(cfg, "nvlink-4gpu", interleave=2, pp_first_stage_layers=2, pp_last_stage_layers=4, **kw)
    assert e.meta["stage_layers"] == [1, 2, 2, 2, 1, 2, 2, 2]
    with pytest.raises(ParallelConfigError, match="must divide by it"):
        wattcast.predict_cluster(cfg, "nvlink-4gpu", interleave=2, pp_first_stage_layers=3, pp_last_stage_layers=3, **kw)


def test_llama3_405b_on_16_stages_is_not_refused():
    """126 layers on 16 stages (Llama 3 405B as Meta ran it: TP8 PP16) is split 7, 8 x 14, 7, never refused."""
    r = wattcast.predict_cluster("llama3_405b", "DGX-H100", gpus=2048, batch=256, seq=8192, tp=8, pp=16, micro_batch=1,
                                 sp=True, zero=1, recompute="full", attention="flash", framework="megatron")
    assert r.meta["stage_layers"] == [7] + [8] * 14 + [7]
    assert r.fits and 0.2 < r.mfu < 0.7


def test_search_across_clusters_with_run_footprint():
    r = run_cli("search", "--model", "gpt2", "--cluster", "nvlink-4gpu", "--cluster", "pcie-4gpu", "--gpus", "4", "--batch", "8",
                "--seq", "1024", "--max-configs", "6", "--tokens", "1e9", "--region", "FRA", "--json")
    assert r.returncode == 0, r.stderr
    ranked = json.loads(r.stdout)["ranked"]
    assert {x["cluster"] for x in ranked} == {"NVLink-4GPU", "PCIe-4GPU"}
    fit = [x for x in ranked if x["fits"]]
    assert fit and all(x["run_hours"] > 0 and x["run_tco2e"] > 0 and x["energy_j"] > 0 for x in fit)
    # one ranking across both clusters: fitting configurations first, fastest first
    times = [x["step_time_ms"] for x in fit]
    assert times == sorted(times) and ranked[:len(fit)] == fit


def test_gradient_accumulation_pass_per_framework():
    from wattcast.data.catalog import resolve_device
    from wattcast.simulate.distributed import grad_accumulation_bytes, predict_distributed
    from wattcast.simulate.options import DistributedOptions
    from wattcast.simulate.single_device import stream_bandwidth_gbps

    assert grad_accumulation_bytes("megatron", "bf16") == (0.0, False)  # fused into the wgrad GEMMs
    assert grad_accumulation_bytes("megatron-deepspeed", "bf16") == (18.0, True)  # BF16_Optimizer, every micro-batch
    assert grad_accumulation_bytes("megatron-deepspeed", "fp16") == (6.0, False)
    assert grad_accumulation_bytes("hf", "bf16") == (12.0, False)  # AMP: fp32 gradients

    def run(framework, batch, zero=0, dtype="fp16"):
        par = ParallelConfig(gpus=8, dp=8, micro_batch=2, zero=zero)
        return predict_distributed("gpt2", "DGX-A100", par, DistributedOptions(batch=batch, seq=512, dtype=dtype,
                                                                              framework=framework))

    one, four = run("megatron-deepspeed", 16), run("megatron-deepspeed", 64)  # 1 and 4 micro-batches
    assert one.comm["grad_accumulation_ms_per_micro"] == 0.0
    gbps = stream_bandwidth_gbps(resolve_device("A100-SXM4-80GB"))
    expect = four.meta["param_count"] * 6.0 * 3 / 4 / (gbps * 1e9) * 1e3
    assert four.comm["grad_accumulation_ms_per_micro"] == pytest.approx(expect, rel=0.02)
    assert run("megatron", 64).comm["grad_accumulation_ms_per_micro"] == 0.0
    # BF16_Optimizer, one micro-batch: fp32 accumulation at ZeRO-1 (18 B); ZeRO-0's bf16 buffer in DeepSpeed 0.19.8, a
    # bf16 add (6 B: tests/test_bf16_optimizer_source.py)
    bf = run("megatron-deepspeed", 16, zero=1, dtype="bf16").comm["grad_accumulation_ms_per_micro"]
    assert bf == pytest.approx(four.meta["param_count"] * 18.0 / (gbps * 1e9) * 1e3, rel=0.02)
    bf0 = run("megatron-deepspeed", 16, dtype="bf16").comm["grad_accumulation_ms_per_micro"]
    assert bf0 == pytest.approx(four.meta["param_count"] * 6.0 / (gbps * 1e9) * 1e3, rel=0.02)
    # ZeRO-2/3 accumulate into their gradient partition
    z2 = run("hf", 64, zero=2, dtype="bf16").comm["grad_accumulation_ms_per_micro"]
    z0 = run("hf", 64, zero=0, dtype="bf16").comm["grad_accumulation_ms_per_micro"]
    assert z2 == pytest.approx(z0 / 8)


def test_cli_uneven_stage_flags():
    base = ["predict", "--model", "gpt2", "--cluster", "nvlink-4gpu", "--gpus", "4", "--batch", "8", "--seq", "256",
            "--pp", "4", "--micro-batch", "1", "--framework", "megatron", "--json"]
    r = run_cli(*base, "--pp-first-stage-layers", "2", "--pp-last-stage-layers", "2")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["parallel"]["stage_layers"] == [2, 4, 4, 2]
    bad = run_cli(*base, "--pp-first-stage-layers", "5", "--pp-last-stage-layers", "2")
    assert bad.returncode == 2 and "must divide evenly" in bad.stderr
    one = run_cli("predict", "--model", "gpt2", "--device", "H100-SXM5-80GB", "--pp-first-stage-layers", "2")
    assert one.returncode == 2 and "need --cluster" in one.stderr


def test_compiled_pipeline_loop_matches_the_event_driven_reference():
    """The array/numba event loop (scheduler._simulate_arrays) and the Python event loop (the reference) give the same
    schedule task for task, for 1F1B, GPipe and interleaved 1F1B, with and without point-to-point time."""
    from wattcast.simulate import scheduler as sc

    rng = np.random.default_rng(7)
    kernels = [sc._kernel_py] + ([sc._kernel] if sc._kernel is not None else [])
    for _ in range(60):
        P = int(rng.integers(1, 9))
        V = int(rng.choice([1, 2, 3])) if P > 1 else 1
        kind = "1f1b" if V > 1 else str(rng.choice(["1f1b", "gpipe"]))
        m = P * int(rng.integers(1, 5)) if V > 1 else int(rng.integers(1, 30))
        f, b, p2p = rng.uniform(0.5, 3, P * V), rng.uniform(1, 6, P * V), float(rng.uniform(0, 0.5))
        ref = sc._simulate_events(f, b, n_micro=m, interleave=V, kind=kind, p2p_ms=p2p, keep_tasks=True)
        for k in kernels:
            got = sc._simulate_arrays(f, b, n_micro=m, interleave=V, kind=kind, p2p_ms=p2p, keep_tasks=True, kernel=k)
            assert np.allclose(got.stage_end, ref.stage_end) and np.allclose(got.stage_busy, ref.stage_busy)
            assert np.allclose(np.array(got.last_backward), np.array(ref.last_backward))
            np.testing.assert_array_equal(got.last_backward_by_chunk, ref.last_backward_by_chunk)
            np.testing.assert_array_equal(got.first_forward_by_chunk, ref.first_forward_by_chunk)
            key = lambda t: (t.stage, t.kind, t.micro, t.chunk)  # noqa: E731
            assert [(key(t), round(t.start, 9), round(t.end, 9)) for t in sorted(got.tasks, key=key)] == \
                   [(key(t), round(t.start, 9), round(t.end, 9)) for t in sorted(ref.tasks, key=key)]


def test_scheduler_reports_each_chunks_last_backward_and_first_forward():
    """Per stage and model chunk: the (start, end) of the chunk's last backward task and the start of its first forward,
    as the tasks have them; chunk 0's last backward is the stage's; under interleaving each chunk's last backward ends
    before the next lower chunk's starts (the order distributed.py queues the chunks' gradient buckets in)."""
    rng = np.random.default_rng(5)
    for _ in range(40):
        P = int(rng.integers(1, 7))
        V = int(rng.choice([1, 2, 3, 4])) if P > 1 else 1
        kind = "1f1b" if V > 1 else str(rng.choice(["1f1b", "gpipe"]))
        m = P * int(rng.integers(1, 5)) if V > 1 else int(rng.integers(1, 20))
        f, b, p2p = rng.uniform(0.5, 3, P * V), rng.uniform(1, 6, P * V), float(rng.uniform(0, 0.5))
        r = simulate_pipeline(f, b, n_micro=m, interleave=V, kind=kind, p2p_ms=p2p)
        lbc, ffc = r.last_backward_by_chunk, r.first_forward_by_chunk
        assert lbc.shape == (P, V, 2) and ffc.shape == (P, V)
        for s in range(P):
            for c in range(V):
                bw = [t for t in r.tasks if t.stage == s and t.chunk == c and t.kind == "B"]
                fw = [t for t in r.tasks if t.stage == s and t.chunk == c and t.kind == "F"]
                last = max(bw, key=lambda t: t.end)
                assert tuple(lbc[s, c]) == (last.start, last.end)
                assert ffc[s, c] == min(t.start for t in fw)
        np.testing.assert_array_equal(lbc[:, 0], np.array(r.last_backward))
        assert np.all(lbc[:, 1:, 1] <= lbc[:, :-1, 0])


def _stage_counter_integral_j(ev, pid, end_us):
    """The integral (J) of stage ``pid``'s power counter from its first sample to ``end_us`` (the step's end)."""
    c = sorted((e["ts"], e["args"]["board_w"]) for e in ev if e["ph"] == "C" and e["name"] == "power" and e["pid"] == pid)
    return sum(w * ((c[i + 1][0] if i + 1 < len(c) else end_us) - t) for i, (t, w) in enumerate(c)) / 1e6


@pytest.mark.parametrize("kw", [dict(), dict(interleave=2), dict(tokens=1e9), dict(power_limit_w=400.0)],
                         ids=["1f1b", "interleaved", "tokens", "power_limit"])
def test_cluster_trace_power_counter_integrates_to_each_stage_energy(kw):
    # each stage's counter charges what its energy_j charges: the tasks at busy power, the optimizer at its own power
    # (it was drawn at the tasks' power) and the DP sync hidden beside the last backward's extra power (left out): gpt2
    # tp2 pp2 on 8 H100 integrated 7.80 / 8.67 J for 7.99 / 8.85 J
    from wattcast.simulate.trace import distributed_trace_events

    r = wattcast.predict_cluster("gpt2", "dgx-h100", gpus=8, tp=2, pp=2, batch=16, seq=1024, micro_batch=2, trace=True,
                                 **kw)
    ev = distributed_trace_events(r)
    assert len(r.per_device) == 2 and r.per_device[0]["optimizer_power_w"] > r.per_device[0]["busy_power_w"]
    assert any(d["hidden_comm_extra_j"] > 0 for d in r.per_device)
    for d in r.per_device:
        assert _stage_counter_integral_j(ev, d["stage"], r.step_time_ms * 1e3) == pytest.approx(d["energy_j"], rel=1e-4)
    assert sum(d["energy_j"] for d in r.per_device) * 4 == pytest.approx(r.energy_j, rel=1e-12)  # tp 2 x dp 2 per stage
    if "tokens" in kw:  # a --tokens run costs the same step
        base = wattcast.predict_cluster("gpt2", "dgx-h100", gpus=8, tp=2, pp=2, batch=16, seq=1024, micro_batch=2)
        assert [d["energy_j"] for d in r.per_device] == [d["energy_j"] for d in base.per_device]
