"""A training step under a parallel strategy on a cluster: per-rank graph, collectives, pipeline, memory.

1. The graph of one micro-batch on one tensor-parallel rank (column/row-parallel GEMMs, TP/SP/EP
   collectives in it) is costed kernel by kernel; TP collectives are blocking (on the compute stream, as
   in Megatron-LM), each costed by the collective model on the TP group's placement.
2. Layers are cut into ``pp x interleave`` chunks (embeddings with the first, head and loss with the last);
   per chunk the forward and backward time of one micro-batch.
3. The pipeline schedule is simulated event by event (:mod:`wattcast.simulate.scheduler`), with the
   activation/gradient point-to-point transfer between stages.
4. Data-parallel gradient synchronisation per stage: buckets (all-reduce; reduce-scatter under ZeRO >= 1)
   start as the stage's last backward pass produces them and overlap with it; ZeRO >= 1 all-gathers the
   updated parameters after the optimizer step; ZeRO-3/FSDP also all-gathers each chunk's parameters
   before its forward and backward (prefetched: a task takes max(compute, gather)).
5. Optimizer step per stage (sharded over DP under ZeRO >= 1).

Outputs: step time, exposed communication (step time minus the same step with free communication),
pipeline bubble, per-device busy time and memory, MFU / HFU / model TFLOP/s per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from wattcast.data.catalog import resolve_device
from wattcast.data.cluster_spec import ClusterSpec, resolve_cluster
from wattcast.data.device_spec import DeviceSpec
from wattcast.data.kernel_ops import DTYPE_BYTES
from wattcast.featurize.hf_config import HFConfig, load_hf_config
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.models.kernel_bundle import load_bundle
from wattcast.simulate.energy import apply_power
from wattcast.simulate.memory import activation_bytes_by_layer
from wattcast.simulate.parallel import GroupLayout, ParallelConfig, group_layout, layouts, resolve_parallel
from wattcast.simulate.scheduler import overlap_buckets, simulate_pipeline
from wattcast.simulate.single_device import _group, cost_nodes, fallback_summary


@dataclass(frozen=True)
class DistributedPrediction:
    model: str
    device: str
    cluster: str
    gpus: int
    parallel: ParallelConfig
    step_time_ms: float
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    exposed_comm_ms: float
    bubble_ms: float
    mfu: float
    hfu: float
    tflops_per_gpu: float
    flops: float
    memory_gb: float
    fits: bool
    per_device: list[dict]
    per_op: list[dict]
    fallback_ops: list[dict]
    ood_fraction: float
    comm: dict
    events: list[dict] = field(default_factory=list, repr=False)
    meta: dict = field(default_factory=dict, repr=False)
    #: one step: energy of every GPU together (J) and the average board power per GPU (W)
    energy_j: float = 0.0
    avg_power_w: float = 0.0
    power_limit_w: float | None = None

    def to_dict(self) -> dict:
        p = self.parallel
        return dict(model=self.model, device=self.device, cluster=self.cluster, gpus=self.gpus,
                    parallel=dict(dp=p.dp, tp=p.tp, pp=p.pp, sp=p.sp, ep=p.ep, zero=p.zero, micro_batch=p.micro_batch,
                                  interleave=p.interleave, recompute=p.recompute, schedule=p.schedule, name=p.describe()),
                    step_time_ms=self.step_time_ms, forward_ms=self.forward_ms, backward_ms=self.backward_ms,
                    optimizer_ms=self.optimizer_ms, exposed_comm_ms=self.exposed_comm_ms, bubble_ms=self.bubble_ms,
                    mfu=self.mfu, hfu=self.hfu, tflops_per_gpu=self.tflops_per_gpu, flops=self.flops,
                    memory_gb=self.memory_gb, fits=self.fits, per_device=self.per_device, per_op=self.per_op,
                    fallback_ops=self.fallback_ops, ood_fraction=self.ood_fraction, comm=self.comm,
                    param_count=self.meta.get("param_count"), energy_j=self.energy_j, avg_power_w=self.avg_power_w,
                    power_limit_w=self.power_limit_w)


#: Host-side costs per framework: (per-kernel launch floor in ms, fixed per-iteration overhead in ms).
#: ``hf``: eager PyTorch; the NeuSight labels cannot tell 0 from 30 us (GPU-bound), 6 us is the usual CUDA
#: launch cost. ``megatron-deepspeed``: Megatron-DeepSpeed's Python-side cost per kernel (module and engine
#: hooks, autograd, fused-kernel wrappers) and per iteration (loss-scale and grad-norm checks with host
#: syncs, optimizer bookkeeping); fitted on half of vTrain's single-node rows
#: (benchmarks/fit_framework_overhead.py), the other half and the multi-node rows are the reported error.
#: ``megatron`` (Megatron-LM without DeepSpeed): no measurements to fit, so eager PyTorch's costs.
FRAMEWORK_HOST_MS = {"hf": (0.006, 0.0), "megatron": (0.006, 0.0), "megatron-deepspeed": (0.07, 20.0)}
#: Whether data-parallel gradient buckets overlap the backward pass: PyTorch DDP/FSDP do; Megatron-LM's
#: local DDP (without --overlap-grad-reduce) and DeepSpeed's ZeRO-0 engine all-reduce after backward.
FRAMEWORK_DP_OVERLAP = {"hf": True, "megatron": False, "megatron-deepspeed": False}


def _grad_bytes(framework: str, dtype: str) -> int:
    """Bytes per gradient element the data-parallel reduction moves, by framework default:
    PyTorch AMP keeps fp32 parameters, so fp32 gradients; DeepSpeed's fp16/bf16 engines all-reduce the
    half-precision gradients; Megatron-LM reduces fp16 gradients as they are but forces fp32 main-gradient
    accumulation (and reduction) for bf16 (``--accumulate-allreduce-grads-in-fp32``)."""
    db = DTYPE_BYTES[dtype]
    if db >= 4:
        return db
    if framework == "megatron-deepspeed":
        return db
    if framework == "megatron":
        return 4 if dtype == "bf16" else db
    return 4


def _collective_model():
    from wattcast.models.collectives import load_collective_model

    return load_collective_model()


def collective_ms(model, op, size_bytes, layout: GroupLayout, cluster: ClusterSpec) -> tuple[np.ndarray, np.ndarray]:
    """(ms, ood) of collectives ``op`` of ``size_bytes`` (arrays) over a group placed as ``layout``."""
    op = np.atleast_1d(np.asarray(op, dtype=object))
    size = np.atleast_1d(np.asarray(size_bytes, dtype=float))
    if layout.size <= 1:
        return np.zeros(len(size)), np.zeros(len(size), dtype=bool)
    us = np.zeros(len(size))
    ood = np.zeros(len(size), dtype=bool)
    for o in pd.unique(op):
        sel = op == o
        u, f = model.predict_us(o, size[sel], layout.size, layout.gpus_per_node, cluster, return_ood=True)
        us[sel] = np.asarray(u, dtype=float)
        ood[sel] = np.asarray(f, dtype=bool)
    return us / 1e3, ood


def _model_config(model) -> HFConfig | None:
    """The Hugging Face config behind ``model`` (a config file, dict or built-in name), else None (ONNX, torch)."""
    if isinstance(model, Mapping) or (isinstance(model, (str, Path)) and not str(model).lower().endswith(".onnx")):
        return load_hf_config(model)
    return None


def predict_distributed(model, cluster: str | ClusterSpec, *, gpus: int, batch: int, seq: int,
                        parallel: ParallelConfig | None = None, dtype: str = "bf16", attention: str = "eager",
                        compile: bool = False, optimizer: str = "adamw", device: str | DeviceSpec | None = None,
                        bundle=None, coll_model=None, trace: bool = False, framework: str = "hf",
                        host_ms: tuple[float, float] | None = None, power_limit_w: float | None = None,
                        power_model=None, clock_cap_mhz: float | None = None) -> DistributedPrediction:
    cl = resolve_cluster(cluster)
    spec = device if isinstance(device, DeviceSpec) else resolve_device(device or cl.device)
    par = parallel or ParallelConfig(gpus=gpus)
    par = replace(par, gpus=gpus)
    hf = _model_config(model)
    opts0 = StepOptions(batch=1, seq=seq, mode="train", dtype=dtype, attention=attention, compile=compile,
                        optimizer=optimizer, recompute=par.recompute, framework=framework)
    # layers: from the config, else from a single-device graph
    n_layers = hf.total_layers if hf is not None else int(step_graph(model, opts0).meta.get("n_layers", 1))
    par = resolve_parallel(par, batch=batch, n_layers=n_layers, n_heads=hf.n_heads if hf else None,
                           n_kv_heads=hf.n_kv_heads if hf else None, ffn=hf.ffn if hf else None,
                           n_experts=hf.n_experts if hf else None, seq=seq, cluster=cl)
    lay = layouts(par, cl)
    bundle = bundle or load_bundle()
    cm = coll_model or _collective_model()
    n_micro = par.n_micro(batch)
    opts = replace(opts0, batch=par.micro_batch, tp=par.tp, sp=par.sp, ep=par.ep)
    g = step_graph(model, opts)

    def coll_fn(kernel, size, group):
        ms = np.zeros(len(size))
        ood = np.zeros(len(size), dtype=bool)
        for grp in pd.unique(group):
            sel = group == grp
            m, o = collective_ms(cm, kernel[sel], size[sel], lay.get(grp, lay["tp"]), cl)
            ms[sel], ood[sel] = m, o
        return ms, ood

    launch_ms, iter_ms = host_ms or FRAMEWORK_HOST_MS[opts.framework]
    costed = cost_nodes(g, spec, bundle, collective_ms=coll_fn, launch_overhead_ms=launch_ms)
    costed = apply_power(costed, spec, power_model, power_limit_w=power_limit_w, clock_cap_mhz=clock_cap_mhz)
    return _schedule(model, g, costed, spec, cl, par, lay, cm, batch=batch, seq=seq, n_micro=n_micro, n_layers=n_layers,
                     dtype=dtype, opts=opts, trace=trace, iteration_ms=iter_ms, power_limit_w=power_limit_w)


def _chunk_of_layer(layers: np.ndarray, n_layers: int, n_chunks: int) -> np.ndarray:
    per = n_layers // n_chunks
    c = np.clip(layers, 0, n_layers - 1) // per
    c = np.where(layers < 0, 0, c)
    return np.where(layers >= n_layers, n_chunks - 1, c).astype(int)


def _schedule(model, g, costed: pd.DataFrame, spec: DeviceSpec, cl: ClusterSpec, par: ParallelConfig, lay, cm, *, batch: int,
              seq: int, n_micro: int, n_layers: int, dtype: str, opts: StepOptions, trace: bool,
              iteration_ms: float = 0.0, power_limit_w: float | None = None) -> DistributedPrediction:
    P, V = par.pp, par.interleave
    n_chunks = P * V
    layers = costed["layer"].to_numpy()
    phase = costed["phase"].to_numpy()
    t = costed["time_ms"].to_numpy()
    is_coll = costed["op_class"].to_numpy() == "collective"
    chunk = _chunk_of_layer(layers, n_layers, n_chunks)
    f_ms = np.bincount(chunk[phase == "forward"], weights=t[phase == "forward"], minlength=n_chunks)
    b_ms = np.bincount(chunk[phase == "backward"], weights=t[phase == "backward"], minlength=n_chunks)
    opt_ms = np.bincount(chunk[phase == "optimizer"], weights=t[phase == "optimizer"], minlength=n_chunks)
    fwd_nc, bwd_nc = (phase == "forward") & ~is_coll, (phase == "backward") & ~is_coll
    f_nc = np.bincount(chunk[fwd_nc], weights=t[fwd_nc], minlength=n_chunks)
    b_nc = np.bincount(chunk[bwd_nc], weights=t[bwd_nc], minlength=n_chunks)
    tp_coll = np.bincount(chunk[is_coll], weights=t[is_coll], minlength=n_chunks)
    params = costed["param_count"].to_numpy(dtype=float)
    params_chunk = np.bincount(chunk[phase == "forward"], weights=params[phase == "forward"], minlength=n_chunks)
    # expert weights are replicated only over dp / ep ranks (each EP rank holds different experts)
    is_exp = (phase == "forward") & costed["scope"].astype(str).str.contains(r"experts\.", regex=True).to_numpy()
    expert_chunk = np.bincount(chunk[is_exp], weights=params[is_exp], minlength=n_chunks)
    db = DTYPE_BYTES[dtype]
    mixed = db < 4
    # point-to-point activation transfer between stages: (micro-batch, seq [/tp with SP], hidden)
    hidden = int(g.meta.get("hidden") or 0)
    act_bytes = par.micro_batch * seq * hidden * db / (par.tp if par.sp else 1)
    if act_bytes <= 0:  # imported graphs: the tensor crossing a layer boundary, as the graph has it
        from wattcast.simulate.memory import _block_inputs

        edges = _block_inputs(g, n_layers)
        act_bytes = float(max(edges)) if edges else 0.0
    p2p_ms = 0.0
    if P > 1 and act_bytes > 0:
        pl = GroupLayout(2, 1 if lay["pp"].nodes > 1 else 2, 2 if lay["pp"].nodes > 1 else 1)
        p2p_ms = float(collective_ms(cm, ["send_recv"], [act_bytes], pl, cl)[0][0])

    def dp_times(zero: int) -> dict:
        """Per chunk: gradient sync time (bucketed), param all-gather after the step, ZeRO-3 per-task gathers.
        Computed once per prediction (``dpt`` below)."""
        dp_l = lay["dp"]
        grad_b = _grad_bytes(opts.framework, dtype)
        out = {"sync_ms": np.zeros(n_chunks), "bucket_ms": [], "gather_after_ms": np.zeros(n_chunks),
               "z3_f_ms": np.zeros(n_chunks), "z3_b_ms": np.zeros(n_chunks)}
        if dp_l.size <= 1:
            out["bucket_ms"] = [np.zeros(0)] * n_chunks
            return out
        bucket = par.bucket_mb * 1e6
        op = "reduce_scatter" if zero >= 1 else "all_reduce"
        ep_dp = group_layout(max(dp_l.size // par.ep, 1), par.tp * par.ep, cl.gpus_per_node)
        for c in range(n_chunks):
            parts = []
            for p_count, group in ((params_chunk[c] - expert_chunk[c], dp_l), (expert_chunk[c], ep_dp)):
                total = p_count * grad_b
                if total <= 0 or group.size <= 1:
                    continue
                nb = max(1, int(np.ceil(total / bucket)))
                parts.append(collective_ms(cm, [op] * nb, np.full(nb, total / nb), group, cl)[0])
            ms = np.concatenate(parts) if parts else np.zeros(0)
            out["bucket_ms"].append(ms)
            out["sync_ms"][c] = ms.sum()
            if zero >= 1:
                out["gather_after_ms"][c] = collective_ms(cm, ["all_gather"], [params_chunk[c] * db], dp_l, cl)[0][0]
            if zero == 3:
                ag = collective_ms(cm, ["all_gather"], [params_chunk[c] * db], dp_l, cl)[0][0]
                rs = collective_ms(cm, ["reduce_scatter"], [params_chunk[c] * grad_b], dp_l, cl)[0][0]
                out["z3_f_ms"][c] = ag
                out["z3_b_ms"][c] = ag + rs
        return out

    dpt = dp_times(par.zero)

    def run(comm_on: bool):
        f, b = (f_ms, b_ms) if comm_on else (f_nc, b_nc)
        if comm_on and par.zero == 3:
            f = np.maximum(f, dpt["z3_f_ms"])
            b = np.maximum(b, dpt["z3_b_ms"])
        pipe = simulate_pipeline(f, b, n_micro=n_micro, interleave=V, kind=par.schedule, p2p_ms=p2p_ms if comm_on else 0.0)
        stage_end = pipe.stage_end.copy()
        comm_events = []
        finish = stage_end.copy()
        for s in range(P):
            if not comm_on or lay["dp"].size <= 1 or par.zero == 3:
                if comm_on and par.zero == 3:
                    finish[s] = stage_end[s]
                continue
            b0, b1 = pipe.last_backward[s]
            ms = np.concatenate([dpt["bucket_ms"][c * P + s] for c in range(V)])
            n = len(ms)
            if FRAMEWORK_DP_OVERLAP.get(opts.framework, True):
                ready = b0 + (b1 - b0) * (np.arange(1, n + 1) / n)
            else:
                ready = np.full(n, stage_end[s])
            end, spans = overlap_buckets(ready, ms)
            comm_events += [(s, f"dp.{'reduce_scatter' if par.zero else 'all_reduce'}[{k}]", a, e) for k, (a, e) in enumerate(spans)]
            finish[s] = max(stage_end[s], end)
        opt_stage = np.array([opt_ms[[c * P + s for c in range(V)]].sum() for s in range(P)])
        if par.zero >= 1:
            opt_stage = opt_stage / lay["dp"].size
        gather = np.zeros(P)
        if comm_on and par.zero >= 1 and lay["dp"].size > 1:
            gather = np.array([dpt["gather_after_ms"][[c * P + s for c in range(V)]].sum() for s in range(P)])
        total = finish + opt_stage + gather + iteration_ms
        return float(total.max()), pipe, finish, opt_stage, gather, comm_events

    step, pipe, finish, opt_stage, gather, comm_events = run(True)
    step_free, pipe_free, *_ = run(False)
    # bubble: idle time of the busiest stage inside the pipeline span (no communication counted)
    span = float(pipe.stage_end.max())
    busy = pipe.stage_busy
    bubble = float(span - busy.max())
    # model FLOPs: the unsharded training graph of one micro-batch, times micro-batches and replicas
    g1 = step_graph(model, replace(opts, tp=1, sp=False, ep=1, recompute="none"))
    model_flops = float(g1.nodes.loc[g1.nodes["phase"] != "optimizer", "flops"].sum()) * n_micro * par.dp
    hw_flops = model_flops
    if par.recompute != "none":
        rc = costed["recompute"].to_numpy(dtype=bool)
        # the costed graph is one tensor-parallel rank's whole model for one micro-batch
        hw_flops += float(costed.loc[rc, "flops"].sum()) * par.tp * n_micro * par.dp
    peak = spec.peak_matrix_tflops(dtype) * 1e12
    step_s = step / 1e3
    mfu = model_flops / (step_s * par.gpus * peak)
    hfu = hw_flops / (step_s * par.gpus * peak)
    # memory per stage (one TP rank)
    acts, full_extra = activation_bytes_by_layer(g)
    act_chunk = np.zeros(n_chunks)
    for layer_id, v in acts.items():
        act_chunk[_chunk_of_layer(np.array([layer_id]), n_layers, n_chunks)[0]] += v
    per_device = []
    w_b = db + (4 if mixed else 0)
    opt_b = 8 if opts.optimizer == "adamw" else 0
    dp_n = lay["dp"].size
    worst = 0.0
    for s in range(P):
        cs = [c * P + s for c in range(V)]
        p = float(params_chunk[cs].sum())
        weights = p * w_b / (dp_n if par.zero == 3 else 1)
        grads = p * (4 if mixed else db) / (dp_n if par.zero >= 2 else 1)
        ostate = p * opt_b / (dp_n if par.zero >= 1 else 1)
        if par.schedule == "gpipe":
            inflight = n_micro * V
        elif V == 1:
            inflight = min(P - s, n_micro)
        else:
            inflight = min((P - s - 1) * 2 + (V - 1) * P + 1, n_micro * V)
        act = float(act_chunk[cs].mean()) * inflight + full_extra
        mem = (weights + grads + ostate + act) / 1e9
        worst = max(worst, mem)
        per_device.append(dict(stage=s, busy_ms=float(busy[s] + opt_stage[s]), finish_ms=float(finish[s]),
                               memory_gb=mem, weights_gb=weights / 1e9, gradients_gb=grads / 1e9, optimizer_gb=ostate / 1e9,
                               activations_gb=act / 1e9, params=p))
    phase_t = {ph: float(t[phase == ph].sum()) for ph in ("forward", "backward", "optimizer")}
    # energy per GPU of each stage: kernels at their power, host launch gaps at idle, waits at communication power
    from wattcast.models.power import comm_power_w, idle_power_w

    p_idle, p_comm = idle_power_w(spec), comm_power_w(spec)
    w = costed["power_w"].to_numpy(dtype=float)
    gpu_t = costed["gpu_ms"].to_numpy(dtype=float)
    e_node = (w * gpu_t + p_idle * np.maximum(t - gpu_t, 0.0)) / 1e3  # J
    comp = phase != "optimizer"
    e_chunk = np.bincount(chunk[comp], weights=e_node[comp], minlength=n_chunks) * n_micro
    e_opt = np.bincount(chunk[~comp], weights=e_node[~comp], minlength=n_chunks)
    stage_e = np.zeros(P)
    for s in range(P):
        cs = [c * P + s for c in range(V)]
        e_opt_s = e_opt[cs].sum() / (lay["dp"].size if par.zero >= 1 else 1)
        busy_s = busy[s] + opt_stage[s]
        # a stage waiting inside the step (pipeline bubble, exposed DP sync) sits in an NCCL kernel that polls
        # for its peer: communication power, not idle power
        stage_e[s] = e_chunk[cs].sum() + e_opt_s + p_comm * max(step - busy_s, 0.0) / 1e3
        per_device[s]["energy_j"] = float(stage_e[s])
        per_device[s]["avg_power_w"] = float(stage_e[s] / step_s)
        per_device[s]["busy_power_w"] = float(e_chunk[cs].sum() / max(busy[s] / 1e3, 1e-12))
        per_device[s]["wait_power_w"] = float(p_comm)
    energy_total = float(stage_e.sum() * par.tp * lay["dp"].size)
    per_op = _group(costed["op_class"].to_numpy(), t, costed["flops"].to_numpy(dtype=float), "op_class")
    fallback = fallback_summary(costed)
    events = []
    if trace:
        for tk in pipe.tasks:
            events.append(dict(stage=tk.stage, stream="compute", name=f"{tk.kind}{tk.micro}" + (f".c{tk.chunk}" if V > 1 else ""),
                               start_ms=tk.start, end_ms=tk.end))
        for s, name, a, e in comm_events:
            events.append(dict(stage=s, stream="comm", name=name, start_ms=a, end_ms=e))
        for s in range(P):
            if opt_stage[s] > 0:
                events.append(dict(stage=s, stream="compute", name="optimizer", start_ms=float(finish[s]),
                                   end_ms=float(finish[s] + opt_stage[s])))
    comm = dict(tp_ms_per_micro=float(tp_coll.sum()), p2p_ms=p2p_ms,
                dp_sync_ms=float(dpt["sync_ms"].sum()),
                layouts={k: dict(size=v.size, gpus_per_node=v.gpus_per_node, nodes=v.nodes) for k, v in lay.items()})
    return DistributedPrediction(
        model=str(g.meta.get("name")), device=spec.name, cluster=cl.name, gpus=par.gpus, parallel=par, step_time_ms=step,
        forward_ms=phase_t["forward"] * n_micro, backward_ms=phase_t["backward"] * n_micro,
        optimizer_ms=float(opt_stage.max()), exposed_comm_ms=max(step - step_free, 0.0), bubble_ms=max(bubble, 0.0),
        mfu=float(mfu), hfu=float(hfu), tflops_per_gpu=model_flops / step_s / par.gpus / 1e12, flops=model_flops,
        memory_gb=worst, fits=bool(worst <= spec.memory_gb), per_device=per_device, per_op=per_op, fallback_ops=fallback,
        ood_fraction=float(costed["ood"].mean()), comm=comm, events=events,
        meta=dict(g.meta, param_count=int(g1.meta.get("param_count", 0)), n_micro=n_micro),
        energy_j=energy_total, avg_power_w=energy_total / step_s / par.gpus, power_limit_w=power_limit_w)
