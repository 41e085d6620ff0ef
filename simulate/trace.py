"""Chrome trace JSON (opens in Perfetto / chrome://tracing) of a predicted step: one track per stream."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from wattcast.simulate.defaults import shown_dtype
from wattcast.simulate.overlap import OVERLAP_FLAGS
from wattcast.simulate.step_band import band_keys


def _ns(ms: float) -> int:
    """A time in ms as whole nanoseconds: every event's start and end are rounded once, so that consecutive events of
    one track meet exactly (``dur`` = end - start, never a nanosecond over the next one's start)."""
    return int(round(float(ms) * 1e6))


def _us(ns: int) -> float:
    """Whole nanoseconds as the trace's microseconds (3 decimals, exact to the nanosecond)."""
    return round(ns / 1e3, 3)


def chrome_trace_events(res) -> list[dict]:
    """Complete ('X') events, microseconds, kernels back to back on the compute stream in graph order. Each kernel's
    start and end are the running sums rounded once to the nanosecond, so slices meet without overlapping.

    The power counter charges what ``energy_j`` charges (:func:`wattcast.simulate.energy.energy_of`,
    :func:`wattcast.simulate.data_loading.one_device`): a kernel's ``power_w`` over its GPU time (``gpu_ms``), the idle
    power (``meta["idle_power_w"]``) over its launch gap (``time_ms - gpu_ms``) and over the batch's loading, so that
    the counter's integral over the step is the step's energy. A served iteration (``meta["serving"]``) draws the
    engine's host, prefill and TP-sync time after the GPU step (:func:`_serving_events`)."""
    nodes = res.nodes
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"{res.device}"}},
              {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "compute"}}]
    t_ms = 0.0
    data_ms = float((res.meta.get("data_loading") or {}).get("step_ms", 0.0))
    if data_ms > 0:  # the batch's loading and copy come before the step's first kernel
        events.append({"name": "data_loading", "cat": "data", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0,
                       "dur": _us(_ns(data_ms)), "args": res.meta["data_loading"]["per_micro"]["single"]})
        t_ms = data_ms
    has_power = "power_w" in nodes
    idle_w = res.meta.get("idle_power_w")
    cols = ["name", "op_class", "phase", "layer", "kernel", "method", "time_ms", "gpu_ms", "flops", "bytes", "ood"]
    # each kernel's dtype (an fp8 step's fp8 GEMMs next to its bf16 ones); a frame without the column gives none
    dtypes = nodes["dtype"].astype(str).to_numpy() if "dtype" in nodes else None
    power = nodes["power_w"].to_numpy(dtype=float) if has_power else None
    last_w = None

    def counter(ts_ns: int, w: float) -> None:
        nonlocal last_w
        w = round(float(w), 3)
        if w != last_w:  # a counter track: board power, a sample where it changes
            events.append({"name": "power", "ph": "C", "pid": 0, "ts": _us(ts_ns), "args": {"board_w": w}})
            last_w = w

    if has_power and idle_w is not None and data_ms > 0:
        counter(0, idle_w)  # the GPU idles while the batch loads
    start = _ns(t_ms)
    for i, r in enumerate(nodes[cols].itertuples(index=False)):
        t0_ms = t_ms
        t_ms += float(r.time_ms)
        end = max(_ns(t_ms), start)
        events.append({"name": r.name, "cat": f"{r.phase},{r.op_class}", "ph": "X", "pid": 0, "tid": 0, "ts": _us(start),
                       "dur": _us(end - start), "args": {"layer": int(r.layer), "kernel": r.kernel, "method": r.method,
                                                         "gpu_ms": float(r.gpu_ms), "flops": float(r.flops),
                                                         "bytes": float(r.bytes), "ood": bool(r.ood),
                                                         **({"dtype": dtypes[i]} if dtypes is not None else {})}})
        if has_power and end > start:
            busy_end = min(max(_ns(t0_ms + max(float(r.gpu_ms), 0.0)), start), end) if idle_w is not None else end
            if busy_end > start:
                counter(start, power[i])
            if busy_end < end:  # the launch gap: the GPU idles
                counter(busy_end, idle_w)
        start = end
    serving = res.meta.get("serving")
    if serving:  # a serving engine's iteration: what it adds after the GPU step (simulate/serving.py), in series
        _serving_events(events, serving, start, counter if has_power else None)
    return events


#: the parts a serving iteration adds after its GPU step (simulate/serving.py ``with_serving``), in the order drawn:
#: (event name = the per-op class, ``meta["serving"]`` key of its time, key of the power its energy charges)
SERVING_PARTS = (("serving_host", "exposed_host_ms", "host_power_w"),
                 ("serving_prefill", "prefill_ms", "prefill_power_w"),
                 ("serving_tp_sync", "tp_sync_ms", "tp_sync_power_w"))
#: the track (thread id) of a single-device trace on which those parts are drawn
SERVING_TID = 1


def _serving_events(events: list[dict], serving: dict, start: int, counter) -> None:
    """Append the serving engine's host, amortised prefill and (TP > 1) TP-sync time after the GPU step (which ends
    at ``start`` ns) on their own track, each named as its per-op class, and (``counter``) the power its energy
    charges (``meta["serving"]``'s ``*_power_w``: idle over the host and sync, the prefill step's mean power over
    the prefill's share), so that the trace ends at ``step_time_ms`` and its counter integrates to ``energy_j``."""
    events.insert(2, {"name": "thread_name", "ph": "M", "pid": 0, "tid": SERVING_TID,
                      "args": {"name": f"serving engine ({serving.get('engine')}): host, prefill, TP sync"}})
    t_ns = start
    end_ms = start / 1e6
    for name, ms_key, w_key in SERVING_PARTS:
        ms = float(serving.get(ms_key) or 0.0)
        if ms <= 0:
            continue
        end_ms += ms
        end = max(_ns(end_ms), t_ns)
        if end <= t_ns:
            continue
        args = {"time_ms": ms}
        if name == "serving_prefill":
            args.update(requests=serving.get("prefill_requests"), prompt_tokens=serving.get("prompt_tokens"),
                        prefill_step_ms=serving.get("prefill_step_ms"))
        events.append({"name": name, "cat": "serving", "ph": "X", "pid": 0, "tid": SERVING_TID, "ts": _us(t_ns),
                       "dur": _us(end - t_ns), "args": args})
        if counter is not None and serving.get(w_key) is not None:
            counter(t_ns, serving[w_key])
        t_ns = end


def _write_trace(path: str | Path, events: list[dict], other: dict) -> Path:
    """Write a Chrome trace atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}))
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)  # no half-written file left behind
        raise
    return path


def write_chrome_trace(res, path: str | Path) -> Path:
    """One device's step as a Chrome trace; ``otherData`` names the model, device, mode, dtype and step time, then
    (added after, never replacing them) the :data:`TRACE_SETTINGS` the step ran with, as ``predict --json``'s
    ``settings`` gives them: the FP8 recipe under fp8 (audit 58a: only the cluster trace had it; a delayed and a
    tensorwise trace could be told apart by their kernel names alone), framework, batch, seq, optimizer, attention;
    and the step's 90% band and OOD fractions, as predict --json gives them (audit 58d)."""
    other = {"model": res.meta.get("name"), "device": res.device, "mode": res.mode, "dtype": shown_dtype(res.meta),
             "step_time_ms": res.step_time_ms, **band_keys(getattr(res, "step_band", None) or {}),
             "ood_time_fraction": getattr(res, "ood_time_fraction", None),
             "ood_kernel_time_fraction": getattr(res, "ood_kernel_time_fraction", None),
             **_memory_keys(res)}
    other.update({k: v for k, v in trace_settings(res).items() if k not in other})
    return _write_trace(path, chrome_trace_events(res), other)


def _memory_keys(res) -> dict:
    """A trace's memory, as ``predict --json`` gives it (audit 59a: a trace had none): ``memory_gb`` (one device's
    total; a cluster step's worst stage's), ``memory_terms_gb`` (the terms that sum to it: a cluster step's
    ``memory.peak_terms_gb``, one device's ``memory`` terms but ``total_gb``), ``memory`` (the JSON's ``memory``
    block), ``memory_capacity_gb`` and ``fits``."""
    mem = res.memory if isinstance(res.memory, dict) else res.memory.to_dict()
    terms = mem.get("peak_terms_gb") if "peak_terms_gb" in mem else {k: v for k, v in mem.items() if k != "total_gb"}
    return {"memory_gb": res.memory_gb, "memory_terms_gb": dict(terms or {}), "memory": dict(mem),
            "memory_capacity_gb": res.memory_capacity_gb, "fits": res.fits}


#: the tracks (thread ids) of a distributed trace, per pipeline stage (process): the computation, then one per kind
#: of communication that can run at the same time as another (each on its own NCCL stream / group): an event's kind is
#: its name's prefix (``cp.ring_kv3`` -> cp; ZeRO-3's ``zero3.*`` share the data-parallel track)
TRACKS = {"compute": (0, "compute"), "dp": (1, "comm: dp (gradient reduce, ZeRO)"), "cp": (2, "comm: cp (ring KV exchange)"),
          "pp": (3, "comm: pp (send/recv, tied embedding grads)"), "ep": (4, "comm: ep (all-to-all)"), "tp": (5, "comm: tp"),
          "comm": (6, "comm: other")}
_TRACK_OF = {"zero3": "dp", "tp_ep": "ep"}
#: the cp track's name and the plot's legend entry per --cp-comm-type (simulate.distributed.cp_collectives: what each
#: type runs); p2p keeps :data:`TRACKS`' name, which other tools read
CP_TRACK_NAMES = {"p2p": TRACKS["cp"][1], "a2a": "comm: cp (all-to-all of Q, K, V, output)",
                  "allgather": "comm: cp (KV all-gather, dK/dV reduce-scatter)",
                  "a2a+p2p": "comm: cp (all-to-all of Q, K, V, output; ring KV exchange)"}
CP_LEGEND = {"p2p": "context-parallel ring KV exchange", "a2a": "context-parallel all-to-all (Q, K, V, output)",
             "allgather": "context-parallel KV all-gather / dK, dV reduce-scatter",
             "a2a+p2p": "context-parallel all-to-all + ring KV exchange"}


def _cp_comm_type(res) -> str:
    """The step's --cp-comm-type (p2p where the result does not say)."""
    return str(getattr(getattr(res, "parallel", None), "cp_comm_type", None) or "p2p")
#: extra lanes of a track (events of one kind that partly overlap: e.g. a ring exchange outlasting its task) start here
_LANE_TID = 100


def _track(e: dict) -> str:
    """The track (key of :data:`TRACKS`) of one timeline event."""
    if e["stream"] == "compute":
        return "compute"
    kind = str(e["name"]).split(".", 1)[0]
    kind = _TRACK_OF.get(kind, kind)
    return kind if kind in TRACKS else "comm"


def _lanes(spans: list[tuple[int, int, int]]) -> dict[int, int]:
    """Lane of each span (start ns, end ns, index) so that the spans of one lane are sequential or nested, never
    partly overlapping (Perfetto and chrome://tracing draw those wrongly): lane 0 where possible, else the first lane
    where it fits."""
    stacks: list[list[int]] = []  # per lane: the ends of the open (enclosing) spans
    out = {}
    for a, b, i in sorted(spans, key=lambda x: (x[0], -x[1], x[2])):
        for lane, st in enumerate(stacks):
            while st and st[-1] <= a:
                st.pop()
            if not st or b <= st[-1]:
                st.append(b)
                out[i] = lane
                break
        else:
            stacks.append([b])
            out[i] = len(stacks) - 1
    return out


def distributed_trace_events(res) -> list[dict]:
    """Chrome trace of a distributed step: one process per pipeline stage; a compute thread, and a thread per kind of
    communication (:data:`TRACKS`: dp/ZeRO, cp, pp, ep, tp), each named by thread_name metadata. Starts and ends are
    rounded once to the nanosecond (``dur`` = end - start), and events of one thread are sequential or nested: ones
    that would partly overlap go to an extra lane of their kind (tid 100 + ...)."""
    ev = []
    stages = sorted({e["stage"] for e in res.events})
    spans = {}  # (stage, track) -> [(start ns, end ns, event index)]
    for i, e in enumerate(res.events):
        a = _ns(e["start_ms"])
        spans.setdefault((e["stage"], _track(e)), []).append((a, max(_ns(e["end_ms"]), a), i))
    tids: dict[int, int] = {}
    names: dict[tuple[int, int], str] = {}
    for (s, track), sp in spans.items():
        base, label = TRACKS[track]
        if track == "cp":
            label = CP_TRACK_NAMES.get(_cp_comm_type(res), label)
        lanes = _lanes(sp)
        for _, _, i in sp:
            lane = lanes[i]
            tid = base if lane == 0 else _LANE_TID + 10 * base + lane
            tids[i] = tid
            names[(s, tid)] = label if lane == 0 else f"{label} ({lane + 1})"
    for s in stages:
        ev.append({"name": "process_name", "ph": "M", "pid": s, "args": {"name": f"stage {s} ({res.device})"}})
        ev.append({"name": "process_sort_index", "ph": "M", "pid": s, "args": {"sort_index": s}})
        own = sorted({tid for (st, tid) in names if st == s} | {0})
        for tid in own:
            label = names.get((s, tid), TRACKS["compute"][1])
            ev.append({"name": "thread_name", "ph": "M", "pid": s, "tid": tid, "args": {"name": label}})
            ev.append({"name": "thread_sort_index", "ph": "M", "pid": s, "tid": tid, "args": {"sort_index": tid}})
    for (s, track), sp in spans.items():
        for a, b, i in sp:
            e = res.events[i]
            x = {"name": e["name"], "ph": "X", "pid": s, "tid": tids[i], "ts": _us(a), "dur": _us(b - a),
                 "cat": e["stream"]}
            if e.get("args"):  # a task's place in the schedule, a pipeline transfer's ends and bytes
                x["args"] = e["args"]
            ev.append(x)
            if e.get("parts"):  # the optimizer step's parts, back to back inside it (the last ends with it)
                ev.extend(_part_events(e["parts"], s, tids[i], a, b))
    # power counter per stage: what the stage's energy_j charges (simulate/distributed.py)
    for d in res.per_device:
        s = d["stage"]
        if d.get("busy_power_w") is None:
            continue
        for ts, w in _stage_power_samples(d, spans.get((s, "compute"), ()), spans.get((s, "dp"), ()), res.events):
            ev.append({"name": "power", "ph": "C", "pid": s, "ts": _us(ts), "args": {"board_w": w}})
    return ev


def _part_events(parts, pid: int, tid: int, a: int, b: int) -> list[dict]:
    """Complete events of an event's ``parts`` ((trace name, part, ms), in order) from its start ``a`` (ns), back to
    back on its thread, each end the running sum rounded once to the nanosecond and the last one the event's end ``b``:
    nested in it, they add up to its duration (the cluster optimizer's adamw.step, clip_grad_norm, loss_scale.unscale,
    ... as the one-device trace names its kernels; args: its op class, per_op part and ms)."""
    out, t, acc = [], a, 0.0
    for j, (name, key, ms) in enumerate(parts):
        acc += float(ms)
        end = b if j == len(parts) - 1 else min(max(a + _ns(acc), t), b)
        op_class, _, part = str(key).partition("|")
        out.append({"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": _us(t), "dur": _us(end - t), "cat": "compute",
                    "args": {"op_class": op_class, **({"part": part} if part else {}), "ms": float(ms)}})
        t = end
    return out


def _union(spans) -> list[tuple[int, int]]:
    """Sorted, merged (start ns, end ns) intervals of ``spans``."""
    out: list[list[int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        elif b > a:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _capped(times: np.ndarray, levels: np.ndarray, cap_w: float, tasks: list[tuple[int, int]]) -> np.ndarray:
    """``levels`` (W from each of ``times`` (ns) to the next; the last one holds to the end of the step) with no level
    above ``cap_w`` and the same integral. The counter draws the tasks at their MEAN power and the hidden
    communication's extra energy on top, so a span can show more than the cap while the energy model caps the actual
    computation + collective there (energy.overlap_power): what a span shows above the cap is taken off it and given
    to the stage's task spans below the cap (whose mean power it is part of) in proportion to their headroom, or,
    if they have too little, to every span of the step below the cap (the last, open-ended one excepted)."""
    if levels.size < 2 or not (levels > cap_w).any():
        return levels
    dur = np.diff(times).astype(float)  # ns of every span but the last
    lv = levels[:-1]
    removed = float(np.sum(np.clip(lv - cap_w, 0.0, None) * dur))  # W x ns
    lv = np.minimum(lv, cap_w)
    room = (cap_w - lv) * dur
    mid = (times[:-1] + times[1:]) / 2
    in_task = np.zeros(lv.size, dtype=bool)
    for a, b in tasks:
        in_task |= (mid > a) & (mid < b)
    for where in (in_task, np.ones(lv.size, dtype=bool)):
        total_room = float(np.sum(room[where]))
        if total_room >= removed > 0:
            lv = lv + np.where(where, (cap_w - lv) * (removed / total_room), 0.0)
            return np.append(lv, levels[-1])
    return levels  # the step's energy does not fit under the cap: shown as charged (energy_j is what the trace keeps)


def _stage_power_samples(d: dict, compute, dp, events) -> list[tuple[int, float]]:
    """(ns, W) samples of one stage's power counter, charging what its ``energy_j`` charges: the tasks (F / B, the
    steady state not drawn) at ``busy_power_w``, the optimizer at ``optimizer_power_w``, the rest of the step (pipeline
    bubble, exposed communication, host time: the GPU waits) at ``wait_power_w``, and the communication hidden after
    the tasks (``hidden_comm_extra_j`` less the wait power over ``hidden_comm_stretch_ms``, which the wait already
    charges) on top, over the data-parallel events' overlap with the tasks (the DP sync beside the last backward) or,
    where there is none (the parameter all-gather hidden beside the first forward, drawn only as its exposed part), over
    the stage's first task. No sample goes above ``overlap_cap_w`` (the power limit, else the TDP: what the energy
    model caps computation + a hidden collective at): what the mean power plus the extra shows above it is moved onto
    the other task spans (:func:`_capped`), so the integral stays the stage's ``energy_j``."""
    busy_w, wait_w = d["busy_power_w"], d["wait_power_w"]
    opt_w = d.get("optimizer_power_w")
    name = lambda i: str(events[i]["name"])  # noqa: E731
    tasks = _union((a, b) for a, b, i in compute if not name(i).startswith(("host.", "data_loading", "optimizer")))
    deltas: dict[int, float] = {0: 0.0}

    def add(a: int, b: int, w: float) -> None:
        if b > a and w != 0.0:
            deltas[a] = deltas.get(a, 0.0) + w
            deltas[b] = deltas.get(b, 0.0) - w

    for a, b in tasks:
        add(a, b, busy_w - wait_w)
    if opt_w is not None:
        for a, b, i in compute:
            if name(i) == "optimizer":
                add(a, b, opt_w - wait_w)
    extra_j = d.get("hidden_comm_extra_j", 0.0) - wait_w * d.get("hidden_comm_stretch_ms", 0.0) / 1e3
    if extra_j != 0.0:
        hidden = [(max(a, x), min(b, y)) for a, b in _union((a, b) for a, b, _ in dp) for x, y in tasks
                  if min(b, y) > max(a, x)]
        hidden = hidden or tasks[:1]
        hidden_ns = sum(b - a for a, b in hidden)
        for a, b in hidden:
            add(a, b, extra_j * 1e9 / hidden_ns)  # J over ns -> W
    times = np.array(sorted(deltas), dtype=np.int64)
    levels = wait_w + np.cumsum([deltas[t] for t in times])
    cap_w = d.get("overlap_cap_w")
    if cap_w is not None:
        levels = _capped(times, levels, float(cap_w), tasks)
    out, last = [], None
    for t, w in zip(times.tolist(), levels.tolist()):
        shown = round(w, 3)
        if shown != last:
            out.append((t, shown))
            last = shown
    return out


#: the step settings (beyond the parallel name, the overlaps and the dtype) a distributed trace's ``otherData`` records,
#: each as ``predict --cluster --json``'s ``settings`` has it (``wattcast.predict_cluster``): every one changes the step
#: (audit 54a: a trace did not say its framework, batch, FP8 recipe or gradient dtype). ``fp8_recipe`` only under fp8;
#: ``grad_accum_dtype`` is bf16 for Megatron-LM's --grad-reduce-in-bf16 too
TRACE_SETTINGS = ("framework", "seq", "batch", "micro_batch", "fp8_recipe", "grad_accum_dtype", "fsdp_reduce_dtype",
                  "fp8_param_gather", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "optimizer",
                  "optimizer_impl", "attention", "flash_kernel", "zero3_prefetch", "mtp_num_layers", "data_load_ms",
                  "data_workers", "moe_token_dispatcher")
#: those the step's graph records itself (``res.meta``), for a result made without the API's settings
#: (``simulate.distributed.predict_distributed`` called directly): the meta's own key for each
_META_SETTINGS = {"attention": "attention", "flash_kernel": "flash_kernel", "optimizer": "optimizer",
                  "optimizer_impl": "optimizer_impl", "grad_accum_dtype": "grad_accum_dtype", "fp8_recipe": "fp8_scaling"}


def trace_settings(res) -> dict:
    """The :data:`TRACE_SETTINGS` ``res`` ran with: its ``meta["settings"]`` (``wattcast.predict_cluster``), else what
    its graph's meta records; a setting neither holds is left out."""
    given = res.meta.get("settings") or {}
    out = {k: given[k] for k in TRACE_SETTINGS if k in given}
    if not given:
        out = {k: res.meta[m] for k, m in _META_SETTINGS.items() if res.meta.get(m) is not None}
    return out


def write_distributed_trace(res, path: str | Path) -> Path:
    other = {"model": res.model, "cluster": res.cluster, "parallel": res.parallel.describe(),
             # the resolved overlap flags (the name writes only some)
             "overlaps": {k: getattr(res.parallel, k) for k in OVERLAP_FLAGS},
             "dtype": shown_dtype(res.meta),
             "step_time_ms": res.step_time_ms,
             "exposed_comm_split_ms": res.exposed_comm_split_ms,
             "truncated": res.meta.get("trace_truncated"),
             "moe_load": res.meta.get("moe_load", 1.0),
             # the step's 90% band and OOD shares, as predict --cluster --json gives them (stop 58)
             **band_keys(getattr(res, "step_band", None) or {}),
             **{k: (res.meta.get("ood_shares") or {}).get(k) for k in ("ood_time_fraction", "ood_kernel_time_fraction")},
             # the worst stage's memory and its peak's terms, as predict --cluster --json's memory block (audit 59a)
             **_memory_keys(res)}
    # the other settings that change the step, added after (never replacing) the keys above
    other.update({k: v for k, v in trace_settings(res).items() if k not in other})
    return _write_trace(path, distributed_trace_events(res), other)


#: timeline colours: compute tasks by kind, communication by parallel group, and the exposed part of communication
TIMELINE_COLOURS = {"forward": "#4C72B0", "backward": "#DD8452", "pair": "#937860", "optimizer": "#55A868",
                    "not drawn": "#DDDDDD",
                    "host": "#CCB974", "dp": "#8172B3", "cp": "#64B5CD", "comm": "#999999", "exposed": "#C44E52"}


def _timeline_kind(e: dict) -> str:
    """The legend entry of one event."""
    name = str(e["name"])
    if e["stream"] == "compute":
        if name.startswith("FB"):  # DualPipe's overlapped forward + backward pair
            return "pair"
        if name.startswith("W"):  # DualPipe's weight-gradient part of a backward
            return "backward"
        if name.startswith("F"):
            return "forward"
        if name.startswith("B"):
            return "backward"
        if name == "optimizer":
            return "optimizer"
        if name.startswith(("host.", "data_loading")):
            return "host"
        return "not drawn" if name.startswith("[") else "optimizer"
    group = name.split(".", 1)[0]
    return group if group in ("dp", "cp") else "comm"


def exposed_comm_intervals(res) -> list[tuple[int, float, float]]:
    """(stage, start_ms, end_ms) of the communication on the comm stream during which the stage's compute stream is
    idle: what the step waits for. (TP time, and the pipeline send/recv of a blocking schedule (Megatron's 1F1B), is
    inside the F/B tasks and is not among these; a non-blocking pipeline transfer is drawn on its receiver, after the
    sending task (DualPipe's: from the later of its two ends' posts), so what of it the receiver idles for is;
    ``res.exposed_comm_split_ms`` has every class.)"""
    out = []
    for s in sorted({e["stage"] for e in res.events}):
        busy = sorted((e["start_ms"], e["end_ms"]) for e in res.events if e["stage"] == s and e["stream"] == "compute")
        merged: list[list[float]] = []
        for a, b in busy:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        comm = sorted((e["start_ms"], e["end_ms"]) for e in res.events if e["stage"] == s and e["stream"] == "comm")
        for a, b in comm:
            t = a
            for c, d in merged:  # subtract the compute spans from [a, b)
                if d <= t or c >= b:
                    continue
                if c > t:
                    out.append((s, t, c))
                t = max(t, d)
                if t >= b:
                    break
            if t < b:
                out.append((s, t, b))
    # overlapping comm events of one stage would count the same gap twice: merge per stage
    merged_out: list[tuple[int, float, float]] = []
    for s, a, b in sorted(out):
        if merged_out and merged_out[-1][0] == s and a <= merged_out[-1][2]:
            merged_out[-1] = (s, merged_out[-1][1], max(merged_out[-1][2], b))
        elif b > a:
            merged_out.append((s, a, b))
    return merged_out


def timeline_figure(res):
    """The matplotlib figure of :func:`plot_timeline` (for tests and notebooks)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    stages = sorted({e["stage"] for e in res.events}) or [0]
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.55 * len(stages) * 2))
    # one collection per (row, colour), not one per event: every broken_barh call updates the data limits, so a
    # 405B pipeline's 12,555 events took 190 s (audit of issue 15); the axis limits are set once below
    ax.set_autoscale_on(False)
    spans: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for e in res.events:
        y = e["stage"] * 2 + (0 if e["stream"] == "compute" else 1)
        spans.setdefault((y, _timeline_kind(e)), []).append((e["start_ms"], e["end_ms"] - e["start_ms"]))
    used = [kind for _, kind in spans]
    for (y, kind), xr in spans.items():
        ax.broken_barh(xr, (y - 0.4, 0.8), facecolors=TIMELINE_COLOURS[kind], edgecolors="white", linewidth=0.3)
    exposed: dict[int, list[tuple[float, float]]] = {}
    for s, a, b in exposed_comm_intervals(res):
        exposed.setdefault(s, []).append((a, b - a))
    for s, xr in exposed.items():  # over the comm row, hatched: the compute stream waits for it
        ax.broken_barh(xr, (s * 2 + 1 - 0.4, 0.8), facecolors="none", edgecolors=TIMELINE_COLOURS["exposed"],
                       hatch="////", linewidth=0.8)
        ax.broken_barh(xr, (s * 2 + 0.35, 0.1), facecolors=TIMELINE_COLOURS["exposed"])
    t0_ms = min((e["start_ms"] for e in res.events), default=0.0)
    t1_ms = max((e["end_ms"] for e in res.events), default=1.0)
    pad_ms = 0.05 * max(t1_ms - t0_ms, 1e-9)  # matplotlib's default axes.xmargin (rcParams): the same picture
    ax.set_xlim(t0_ms - pad_ms, t1_ms + pad_ms)
    y0, y1 = min(stages) * 2 - 0.4, max(stages) * 2 + 1.4  # the bars' extent, and the same default margin
    ax.set_ylim(y0 - 0.05 * (y1 - y0), y1 + 0.05 * (y1 - y0))
    ax.set_yticks([s * 2 + k for s in stages for k in (0, 1)], [f"stage {s} {n}" for s in stages for n in ("compute", "comm")])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    labels = {"forward": "forward", "backward": "backward", "pair": "forward + backward pair (DualPipe)",
              "optimizer": "optimizer", "not drawn": "steady state (not drawn)",
              "host": "host (data loading, framework iteration time: the GPU waits)",
              "dp": "data-parallel comm (gradient reduce / param gather)", "cp": CP_LEGEND.get(_cp_comm_type(res), CP_LEGEND["p2p"]),
              "comm": "other comm"}
    handles = [Patch(facecolor=TIMELINE_COLOURS[k], label=v) for k, v in labels.items() if k in used]
    handles.append(Patch(facecolor="none", edgecolor=TIMELINE_COLOURS["exposed"], hatch="////",
                         label="exposed comm (the compute stream waits)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.1 / max(len(stages), 1)), ncol=3,
              fontsize=8, frameon=False)
    split = ", ".join(f"{k} {v:.1f}" for k, v in (res.exposed_comm_split_ms or {}).items() if v > 0) or "none"
    ax.set_title(f"{res.model} on {res.gpus} x {res.device} ({res.parallel.describe()}): step {res.step_time_ms:.1f} ms, "
                 f"bubble {res.bubble_ms:.1f} ms, exposed comm {res.exposed_comm_ms:.1f} ms\n"
                 f"exposed comm by class (ms): {split}; TP transfers (and pipeline ones that block their sender) run "
                 f"inside the F/B tasks", fontsize=9)
    return fig


def plot_timeline(res, path: str | Path) -> Path:
    """A PNG of the per-stage timeline (forward, backward, optimizer on compute; DP buckets on comm), with a legend,
    the exposed communication hatched in red and the exposed time of every class in the title."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fig = timeline_figure(res)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
