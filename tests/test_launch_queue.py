"""Eager PyTorch's in-order launch queue (simulate/single_device.py launch_queue_ms, cost_nodes host_model="queue")."""

import numpy as np
import pytest

import wattcast
from wattcast.data.catalog import resolve_device
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.distributed import FRAMEWORK_HOST_MODEL, FRAMEWORK_HOST_MS, framework_launch_ms
from wattcast.simulate.single_device import (CUDA_LAUNCH_MS, EAGER_HOST_LAUNCH_MS, STREAM_TINY_KERNEL_MS, _expanded_order,
                                             cost_nodes, host_sync_before, launch_queue_ms, queued_node_ms)


def _loop(gpu, host, sync_before):
    """The queue as a plain loop: issue H_k = H_{k-1} + h_k (after a sync: from the stream's end), start at
    max(end_{k-1}, H_k)."""
    H = end = 0.0
    out = []
    for k, (g, h) in enumerate(zip(gpu, host)):
        if sync_before[k]:
            H = max(H, end)
        H += h
        new = max(end, H) + g
        out.append(new - end)
        end = new
    return np.array(out)


@pytest.mark.parametrize("seed", range(5))
def test_queue_matches_the_loop(seed):
    rng = np.random.default_rng(seed)
    n = 400
    gpu = rng.lognormal(-3.5, 1.5, n)  # 1 us .. several ms
    host = rng.choice([0.0, 0.02, 0.04, 0.2], n)
    sync = rng.random(n) < 0.02
    got = launch_queue_ms(gpu, host, sync)
    np.testing.assert_allclose(got, _loop(gpu, host, sync), rtol=1e-12, atol=1e-12)
    assert (got >= gpu - 1e-15).all()  # a kernel adds at least its own GPU time


def test_queue_limits():
    gpu = np.array([0.001, 0.5, 0.001, 0.001, 0.001])
    # no host cost: the GPU times exactly (not a float-noise copy of them)
    assert np.array_equal(launch_queue_ms(gpu, 0.0), gpu)
    # host-bound tiny kernels: one host cost each, the last kernel's GPU time after the last issue
    tiny = np.full(10, 0.001)
    assert launch_queue_ms(tiny, 0.04).sum() == pytest.approx(10 * 0.04 + 0.001)
    # a long kernel hides the launches queued behind it: 0.04 (issue) + 0.001, then 0.5 from 0.08 ...
    t = launch_queue_ms(gpu, 0.04)
    assert t.sum() == pytest.approx(0.08 + 0.5 + 0.003)
    assert t[2:] == pytest.approx([0.001] * 3)  # issued while the 0.5 ms kernel ran: no gap
    # a sync before kernel 2: the host waits for the stream, the next launch costs its host time again
    s = launch_queue_ms(gpu, 0.04, np.array([False, False, True, False, False]))
    assert s.sum() == pytest.approx(0.08 + 0.5 + 3 * 0.04 + 0.001)


def test_expanded_order_and_mean_of_copies():
    reps = np.array([1, 3, 3, 1, 1, 3, 1])
    assert _expanded_order(reps).tolist() == [0, 1, 2, 1, 2, 1, 2, 3, 4, 5, 5, 5, 6]
    rng = np.random.default_rng(0)
    gpu = rng.lognormal(-4, 1.5, len(reps))
    sync = np.zeros(len(reps), bool)
    t = queued_node_ms(gpu, 0.04, sync, reps)
    full = launch_queue_ms(gpu[_expanded_order(reps)], 0.04)
    assert (t * reps).sum() == pytest.approx(full.sum(), rel=1e-12)


def _gpt2_train(batch=1, seq=32):
    return step_graph("gpt2", StepOptions(batch=batch, seq=seq, mode="train", dtype="bf16"))


def test_one_sync_before_the_optimizer_phase():
    g = _gpt2_train()
    sync = host_sync_before(g.nodes)
    phase = g.nodes["phase"].to_numpy()
    assert sync.sum() == 1
    i = int(np.flatnonzero(sync)[0])
    assert phase[i] == "optimizer" and phase[i - 1] == "backward"
    inf = step_graph("gpt2", StepOptions(batch=1, seq=32, mode="inference", dtype="bf16"))
    assert not host_sync_before(inf.nodes).any()


def test_gpu_times_do_not_move_with_the_host_model():
    """The NeuSight timing constant is not the host launch cost: the kernels' GPU times are the same whatever the
    host model and cost (an FP32 graph, where the isolated-timing floor applies)."""
    assert STREAM_TINY_KERNEL_MS == 0.006 and EAGER_HOST_LAUNCH_MS == 0.040
    g = step_graph("gpt2", StepOptions(batch=1, seq=32, mode="train", dtype="fp32"))
    spec = resolve_device("A100-SXM4-40GB")
    base = cost_nodes(g, spec, launch_overhead_ms=0.0)
    assert np.array_equal(base["time_ms"].to_numpy(), base["gpu_ms"].to_numpy())
    for kw in (dict(), dict(launch_overhead_ms=0.1), dict(host_model="max"), dict(host_model="max", launch_overhead_ms=0.006)):
        c = cost_nodes(g, spec, **kw)
        assert np.array_equal(c["gpu_ms"].to_numpy(), base["gpu_ms"].to_numpy())
    q = cost_nodes(g, spec)
    # the queue's step is at least the GPU's and at least the host's (every launch once)
    t, gpu = q["time_ms"].to_numpy(), q["gpu_ms"].to_numpy()
    assert t.sum() >= gpu.sum() and t.sum() >= 0.040 * len(t) * 0.99
    with pytest.raises(ValueError, match="host_model"):
        cost_nodes(g, spec, host_model="lifo")


def test_predict_host_us_and_cluster_agreement():
    """A host-bound step (gpt2, batch 1, 32 tokens): the step grows with the host cost; predict_cluster on one GPU (its
    3-block short graph, block 1 standing for 10) costs the same queue as predict's whole graph."""
    r40 = wattcast.predict("gpt2", "A100-SXM4-80GB", batch=1, seq=32)
    r100 = wattcast.predict("gpt2", "A100-SXM4-80GB", batch=1, seq=32, host_us=100)
    r0 = wattcast.predict("gpt2", "A100-SXM4-80GB", batch=1, seq=32, host_us=0)
    gpu = float(r40.nodes["gpu_ms"].sum())
    kernels = lambda r: float(r.nodes["time_ms"].sum())  # the step's kernels (not the batch's copy)
    assert kernels(r0) == pytest.approx(gpu, rel=1e-9)
    assert r0.step_time_ms < r40.step_time_ms < r100.step_time_ms
    n = len(r40.nodes)
    assert kernels(r100) >= 0.1 * n  # host-bound: at least every launch's host time
    assert r40.overheads["launch_gap_ms"] == pytest.approx(kernels(r40) - gpu, rel=1e-9)
    assert r100.meta is not None and wattcast.predict("gpt2", "A100-SXM4-80GB", batch=1, seq=32,
                                                      host_us=100).to_dict()["settings"]["host_us"] == 100.0
    for host_us, single in ((None, r40), (100, r100)):
        c = wattcast.predict_cluster("gpt2", "DGX-A100", gpus=1, batch=1, seq=32, host_us=host_us)
        assert c.step_time_ms == pytest.approx(single.step_time_ms, rel=1e-6)


def test_host_us_checks_and_framework_presets():
    with pytest.raises(ValueError, match="host_us"):
        wattcast.predict("gpt2", "A100-SXM4-80GB", batch=1, seq=32, host_us=-1)
    with pytest.raises(ValueError, match="host_us"):
        wattcast.predict("gpt2", "A100-SXM4-80GB", batch=1, seq=32, host_us=float("nan"))
    from wattcast.simulate.distributed import predict_distributed
    from wattcast.simulate.options import DistributedOptions
    from wattcast.simulate.parallel import ParallelConfig

    with pytest.raises(ValueError, match="host_us"):
        predict_distributed("gpt2", "DGX-A100", ParallelConfig(gpus=1),
                            DistributedOptions(batch=1, seq=32, host_us=50, host_ms=(0.05, 0.0)))
    # eager PyTorch queues its launches; the Megatron presets keep their per-kernel floors as fitted / shipped
    assert FRAMEWORK_HOST_MODEL == {"hf": "queue", "megatron": "max", "megatron-deepspeed": "max"}
    assert FRAMEWORK_HOST_MS["megatron"][0] == 0.006 and FRAMEWORK_HOST_MS["megatron-deepspeed"][0] == 0.0725
    assert framework_launch_ms("hf") == EAGER_HOST_LAUNCH_MS
    assert framework_launch_ms("hf", compile=True) == CUDA_LAUNCH_MS
    assert framework_launch_ms("megatron", host_us=100) == pytest.approx(0.1)


def test_cli_host_us(tmp_path):
    from typer.testing import CliRunner

    from wattcast.cli import app

    r = CliRunner().invoke(app, ["predict", "-m", "gpt2", "--device", "A100-SXM4-80GB", "--batch", "1", "--seq", "32",
                                 "--host-us", "-5"])
    assert r.exit_code == 2 and "--host-us" in r.output


def test_a_clock_cap_stretch_fills_the_launch_gaps():
    """A clock cap's slower kernels are queued again (simulate.single_device.requeued): in a host-bound step the
    stretch fills the launch gaps instead of adding to every kernel's slot."""
    kw = dict(batch=1, seq=32)
    base = wattcast.predict("gpt2", "A100-SXM4-80GB", **kw)
    cap = wattcast.predict("gpt2", "A100-SXM4-80GB", clock_cap_mhz=700, **kw)
    n, n0 = cap.nodes, base.nodes
    stretch = n["gpu_ms"].sum() - n0["gpu_ms"].sum()
    assert stretch > 0
    np.testing.assert_allclose(n["time_ms"], launch_queue_ms(n["gpu_ms"].to_numpy(), EAGER_HOST_LAUNCH_MS,
                                                             host_sync_before(n)), rtol=1e-12, atol=1e-15)
    grown = n["time_ms"].sum() - n0["time_ms"].sum()
    assert 0 <= grown < stretch


def test_search_takes_the_host_cost_and_its_rows_are_predict_clusters():
    """``search(host_us=)`` and ``wattcast search --host-us``: every candidate is costed with that host cost (a
    host-bound gpt2 job changes its best layout with it) and the best row is predict_cluster's for the same host cost."""
    best = {}
    for h in (None, 0.0):
        s = wattcast.search("gpt2", "DGX-A100", 8, 8, 128, host_us=h, max_configs=20)
        r = s.best
        p = wattcast.predict_cluster("gpt2", "DGX-A100", seq=128, strategy=r["strategy"], host_us=h)
        assert p.step_time_ms == pytest.approx(r["step_time_ms"], rel=1e-12, abs=0)
        best[h] = r["step_time_ms"]
    assert best[0.0] < best[None]
    from typer.testing import CliRunner

    from wattcast.cli import app

    r = CliRunner().invoke(app, ["search", "-m", "gpt2", "--cluster", "DGX-A100", "--gpus", "8", "--batch", "8",
                                 "--seq", "128", "--host-us", "-1"])
    assert r.exit_code == 2 and "--host-us" in r.output
