"""Cost every node of an operator graph on one device and compose a step (one stream, in order).

Per node, by ``method`` (see :mod:`wattcast.featurize.op_graph`):

- ``surrogate``: the learned kernel model for ``kernel`` at the node's shape, times ``scale``;
- ``proxy``: a memory-bound op (embedding gather, reductions, optimizer step, fused chains) costed as the
  learned scalar-add kernel (``addu``: one read, one write) that moves the same bytes (so it inherits the
  device's achieved bandwidth);
- ``flash``: fused attention costed as its two GEMMs (QK^T and PV, each by the learned GEMM model) times
  the fraction of the score matrix computed (1/2 when causal) times FLOPs relative to forward (backward
  2.5x, FlashAttention-2's recompute + 4 GEMMs); the S x S tensor never touches memory;
- ``roofline``: no model: max(FLOPs / dtype peak, bytes / bandwidth); reported in ``fallback_ops``.

Each kernel also pays a host launch cost (``launch_overhead_ms``), composed by ``host_model``: ``queue`` (eager
PyTorch, :data:`EAGER_HOST_LAUNCH_MS`): the CPU issues the kernels in program order, one every ``h`` of host time,
into an in-order stream, so kernel k starts at max(the previous kernel's end, its issue time) and a node's time is
what it adds to the stream's end (:func:`launch_queue_ms`); ``max`` (the Megatron presets' fitted floors): a node
takes max(GPU time, launch cost). On the GPU
a learned node's kernel takes at least its roofline time plus a fixed :data:`GPU_KERNEL_FLOOR_MS` (measured in a
profiler trace; it shows where the host floor is below it or the kernel is memory-bound and above a few MB).
Distinct kernels are predicted once (a 96-layer model repeats ~100 shapes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from wattcast.data.device_spec import DeviceSpec, spec_notes, unsupported_step_dtype
from wattcast.featurize.context_parallel import ring_attention_steps
from wattcast.featurize.conv_gemm import CONV_KERNELS, cudnn_tf32_rows
from wattcast.featurize.fp8_recipes import compute_capability, unsupported_fp8_recipe
from wattcast.simulate.step_band import (OOD_OF_KERNEL_TIME, band_keys, fp8_step_warning, ood_band_log, ood_warning,
                                          step_band)
from wattcast.data.kernel_ops import DTYPE_BYTES
from wattcast.featurize.graph_cache import (GraphMemo, column_codes, column_derived, column_is, column_values,
                                            columns_derived)
from wattcast.featurize.op_graph import OpGraph, SHAPE_COLUMNS, op_type_of_tag
from wattcast.models.attention import (BACKWARD_FLOP_RATIO, DEFAULT_FLASH_KERNEL, OFF_NATIVE_REFERENCE_DEVICE,
                                       REFERENCE_DEVICE, flash_attention_ms, off_native, scalar_fp32_tflops)
from wattcast.models.collectives import collective_band_log
from wattcast.models.kernel_bundle import KernelBundle, load_bundle
from wattcast.models.kernel_predictor import attention_mma_scale, predict_kernels
from wattcast.simulate.memory import MemoryEstimate, estimate_memory, graph_memory, memory_flag
from wattcast.simulate.stage_memory import capacity_gb

#: What one tiny kernel still costs back to back in a stream, of the fixed floor an isolated, event-timed kernel
#: measurement carries (ms): NeuSight's timing convention (:func:`_timing_floor_ms` takes the surrogate's prediction
#: for a tiny add less this off every learned FP32 kernel). A property of how the kernel data were timed, not of a
#: host: it stays 6 us whatever the host launch cost below (it was the same constant as the old launch floor; kept
#: apart so that the kernels' GPU times do not move with the host model).
STREAM_TINY_KERNEL_MS = 0.006
#: Host time eager PyTorch spends per kernel launch (ms): the Python op, the dispatcher, autograd and the CUDA launch,
#: between one GPU op's launch and the next. Measured on the real Kineto traces in ``../shared/datasets/traces``
#: (host span of a step's launches less the time blocked in syncs, over its launches; stop-56 research, scripts in
#: the README "Host launch queue"): median 43 us (A100, ``a100_trace_diff_control``, DLRM-like training), 35 us (V100,
#: ``v100_rank0``, ResNet DDP), 43 us (V100-16GB, ``a100_trace_diff_test``), and 84 / 172 us on two hosts whose ops
#: launch many small kernels from Python (``v100_df_index_resolver``, ``a100_nccl_data``): 40 us is the three
#: typical hosts' value; the range seen is 35-170 us (``--host-us`` sets it). Composed as an in-order launch queue
#: (``host_model="queue"``), which reproduces the traces' GPU-stream step times at each trace's own host cost (median
#: signed error -3.3 / -0.3 / +4.5 / -0.1%); the per-kernel max(GPU, host) over-predicts the GPU-bound V100 rank by
#: +24% at its real host cost. The NeuSight training labels are GPU-bound: unchanged by it (see README).
EAGER_HOST_LAUNCH_MS = 0.040
#: The CUDA launch cost alone (ms), without eager PyTorch's Python and dispatcher: ``torch.compile``'d steps (Inductor's
#: generated wrapper launches its Triton kernels directly) and served decode steps (vLLM's CUDA graphs; its host time
#: is ``simulate/serving.py``'s fitted term). The former default of every step, kept for these (not measured here).
CUDA_LAUNCH_MS = 0.006
#: The default host cost per launch of an eager PyTorch step (ms): :data:`EAGER_HOST_LAUNCH_MS`
DEFAULT_LAUNCH_OVERHEAD_MS = EAGER_HOST_LAUNCH_MS
#: How a step composes the host launch cost with the kernels' GPU times (:func:`cost_nodes`)
HOST_MODELS = ("queue", "max")


def check_host_us(v) -> float:
    """A host time per kernel launch in us (``--host-us`` / ``host_us``): finite and >= 0 (ValueError naming it)."""
    from wattcast.data.checks import nonneg_finite

    return nonneg_finite(v, "host_us (host time per kernel launch)", unit="us")


def step_host_cost(*, compile: bool = False, served: bool = False, host_us: float | None = None) -> tuple[float, str]:
    """(host cost per launch in ms, host model) of a one-device step (``wattcast.predict``): eager PyTorch's launch
    queue at ``host_us`` (us, checked) or :data:`EAGER_HOST_LAUNCH_MS`; a ``torch.compile``'d step's queue at
    :data:`CUDA_LAUNCH_MS`; a served decode step (vLLM: CUDA graphs, its host time the serving term fitted with this
    GPU step) max(GPU, :data:`CUDA_LAUNCH_MS`) per kernel, as that fit had it (``host_us`` refused there)."""
    if served:
        if host_us is not None:
            raise ValueError("host_us does not apply to a served step (--serving): the engine's host time is its own "
                             "fitted term (simulate/serving.py)")
        return CUDA_LAUNCH_MS, "max"
    if host_us is not None:
        return check_host_us(host_us) / 1e3, "queue"
    return (CUDA_LAUNCH_MS if compile else EAGER_HOST_LAUNCH_MS), "queue"
#: GPU-side fixed time of one kernel (ms): a kernel occupies its stream for at least this plus its roofline time, however
#: few bytes it moves (separate from the host launch cost above: a node takes max(GPU time, host floor)). Measured, not
#: assumed: the CUPTI kernel durations of a PyTorch-profiler trace of a training job on an A100-SXM4-40GB (HTA's
#: ``tests/data/trace_diff/control``, ``../shared/datasets/traces/a100_trace_diff_control.json.gz``) never go below 3 us
#: (1,368 elementwise kernels up to 100 KB: none below 3 us, 879 at exactly 3, median 3; integer-us CUPTI durations)
#: and grow as ~3 us + bytes at the memory bandwidth above that. Fitted on the trace's fitting half (split by shape)
#: as the additive floor with the lowest MAPE of the in-step kernel times over its elementwise rows, grid 0-6 us in
#: 0.25 us steps (``benchmarks/fit_gpu_kernel_floor.py``); its other half and the V100 trace are the reported error
#: (README, ``validate trace --in-step``).
GPU_KERNEL_FLOOR_MS = 0.003
#: row width used to shape a proxy (bytes-equivalent copy) kernel
_PROXY_WIDTH = 4096
#: (B, H) of the scalar-add kernel whose predicted latency is the device's isolated-timing floor: 16 KB,
#: inside the surrogate's training range, far too small to take measurable time on any GPU
_FLOOR_SHAPE = (16, 256)
#: (B, H) of the fp32 scalar add that measures a device's streaming bandwidth (128 MiB each way)
_STREAM_SHAPE = (8192, 4096)


@dataclass(frozen=True)
class StepPrediction:
    """One step (training or inference) of a workload on one device."""

    device: str
    mode: str
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    step_time_ms: float
    memory_gb: float
    memory: MemoryEstimate
    fits: bool
    flops: float
    per_op: list[dict]
    per_layer: list[dict]
    fallback_ops: list[dict]
    ood_fraction: float
    ood_time_fraction: float
    nodes: pd.DataFrame = field(repr=False)
    meta: dict = field(default_factory=dict, repr=False)
    #: one step on one GPU: energy (J) and average board power (W), from the power surrogate
    energy_j: float = 0.0
    avg_power_w: float = 0.0
    power_limit_w: float | None = None
    #: the device's memory (GB): ``memory_flag`` compares the prediction with it
    memory_capacity_gb: float = 0.0
    #: the whole run (wattcast.lifecycle.RunFootprint) when a run length in tokens was given, else None
    run: object = field(default=None, repr=False)
    #: named overheads of the step (ms; see step_overheads): optimizer, clipping, accumulation, casts, copies, launch gaps
    overheads: dict = field(default_factory=dict)
    #: the step's 90% band from measured steps (simulate/step_band.py: low_ms, high_ms, basis, generation)
    step_band: dict = field(default_factory=dict)
    #: the dense matrix peak MFU is quoted against (FLOP/s; :func:`mfu_peak_flops`), 0 where not known
    peak_matrix_flops: float = 0.0
    #: the OOD kernels' share of the kernels' GPU time (``gpu_ms``, host launch gaps aside), in [0, 1]: what the OOD
    #: warning reads (``ood_time_fraction`` is their share of the costed kernels' ``time_ms``, gaps included: the step
    #: band's input)
    ood_kernel_time_fraction: float = 0.0

    @property
    def mfu(self) -> float | None:
        """A training step's model FLOPs utilisation: ``flops`` (the model's, no recomputation: :func:`model_flops`)
        over step time x the dense matrix peak (:func:`mfu_peak_flops`), as a cluster step's ``mfu`` with one GPU;
        None for inference or where the peak or the step time is not known."""
        if self.mode != "train" or self.peak_matrix_flops <= 0 or self.step_time_ms <= 0:
            return None
        return float(self.flops / (self.step_time_ms / 1e3 * self.peak_matrix_flops))

    @property
    def memory_flag(self) -> str:
        """"tight", "pressure" (a training step near capacity) or "" (see simulate.memory.memory_flag)."""
        return memory_flag(self.memory_gb, self.memory_capacity_gb, eager_training=self.mode == "train")

    @property
    def tokens_per_s(self) -> float | None:
        """An inference step's new tokens per second: batch x seq / step time (None in training or when the graph's
        batch and sequence are not known)."""
        b, s = self.meta.get("batch"), self.meta.get("seq")
        if self.mode == "train" or not b or not s or self.step_time_ms <= 0:
            return None
        return float(b) * float(s) / (self.step_time_ms / 1e3)

    @property
    def ms_per_token(self) -> float | None:
        """An inference step's time per new token of one sequence: step time / seq (a decode step, seq 1: the time
        per output token, TPOT); None in training or when the sequence is not known."""
        s = self.meta.get("seq")
        if self.mode == "train" or not s:
            return None
        return self.step_time_ms / float(s)

    @property
    def outside_layers(self) -> list[dict]:
        """The step's time in no layer of the graph (op class, count, time_ms): the ``per_op`` rows added after the
        graph was costed (loading the batch, a serving engine's host, prefill and TP costs), so that ``per_layer``'s
        times and these add up to ``step_time_ms``; [] when there are none."""
        graph_classes = set(self.nodes["op_class"].astype(str)) if "op_class" in self.nodes else set()
        return [dict(op_class=o["op_class"], count=o["count"], time_ms=o["time_ms"]) for o in self.per_op
                if o["op_class"] not in graph_classes]

    def to_dict(self, *, nodes: bool = False) -> dict:
        d = dict(device=self.device, mode=self.mode, forward_ms=self.forward_ms, backward_ms=self.backward_ms,
                 optimizer_ms=self.optimizer_ms, step_time_ms=self.step_time_ms, **band_keys(self.step_band),
                 memory_gb=self.memory_gb,
                 memory=self.memory.to_dict(), fits=self.fits, flops=self.flops, per_op=self.per_op, per_layer=self.per_layer,
                 fallback_ops=self.fallback_ops, ood_fraction=self.ood_fraction, ood_time_fraction=self.ood_time_fraction,
                 ood_kernel_time_fraction=self.ood_kernel_time_fraction,
                 model=self.meta.get("name"), param_count=self.meta.get("param_count"), kernels=int(len(self.nodes)),
                 energy_j=self.energy_j, avg_power_w=self.avg_power_w, power_limit_w=self.power_limit_w,
                 memory_capacity_gb=self.memory_capacity_gb, memory_flag=self.memory_flag, overheads=self.overheads,
                 data_loading=self.meta.get("data_loading"), outside_layers=self.outside_layers)
        if self.meta.get("tensor_parallel"):  # a served TP group (simulate/tp_inference.py): the group's figures
            d["tensor_parallel"] = dict(self.meta["tensor_parallel"])
        if self.mode == "train":  # model FLOPs utilisation, as a cluster step's (the same FLOPs, the same peak)
            d["mfu"] = self.mfu
        if self.mode != "train":  # inference: throughput and per-token latency; the KV cache's context when there is one
            d.update(tokens_per_s=self.tokens_per_s, ms_per_token=self.ms_per_token, kv_context=self.meta.get("kv_context"),
                     logits=self.meta.get("logits"))
            if self.meta.get("serving"):  # a serving engine's decode iteration (simulate/serving.py)
                d["serving"] = dict(self.meta["serving"])
        # e.g. a sequence beyond a RoPE model's trained positions, an ONNX op's fallback; always there ([] when none)
        d["warnings"] = list(self.meta.get("warnings") or [])
        if self.meta.get("fp8_vs_bf16"):  # an FP8 step against its bf16 twin (wattcast.predict; fp8_host_bound)
            d["fp8_vs_bf16"] = dict(self.meta["fp8_vs_bf16"])
        if self.meta.get("conv_math"):  # fp32 convolutions costed as TF32 (with_cudnn_tf32)
            d["conv_math"] = dict(self.meta["conv_math"])
        if self.meta.get("settings"):  # the options the public API ran with (wattcast.predict sets them)
            d["settings"] = dict(self.meta["settings"])
        if self.run is not None:  # predict(..., tokens=): the whole run's time, energy, cost and carbon
            d["run"] = self.run.run_dict()
            d["run_details"] = self.run.to_dict()
        if nodes:
            d["nodes"] = self.nodes.to_dict("records")
        return d


def _hash_rows(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each distinct row, inverse) of a frame."""
    h = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    return first, inverse


#: per (device spec, bundle id): (the bundle, kernel-row hash -> (latency, low, high, ood, error)); a search over
#: batch sizes, strategies or devices re-uses every kernel it has already predicted
_PREDICTION_CACHE: dict[tuple[str, int], tuple] = {}
_CACHE_MAX_ROWS = 500_000


def _spec_key(spec: DeviceSpec) -> str:
    return json.dumps(spec.to_dict(), sort_keys=True, default=str)


def _surrogate_rows(frame: pd.DataFrame, hashed: tuple[np.ndarray, np.ndarray], spec: DeviceSpec,
                    bundle: KernelBundle) -> list[tuple]:
    """(latency, low, high, ood, error, roofline_ms) per distinct kernel row of ``frame`` (``hashed``: its distinct row
    hashes and the first row of each, :func:`_kernel_hashes`), predicting only those this process has not predicted
    before on this device with this bundle."""
    uh, first = hashed
    key = (_spec_key(spec), id(bundle))
    held = _PREDICTION_CACHE.get(key)
    # the bundle is held by its entry, so its id is not reused while cached (two bundles of one process, e.g. a
    # retrained one beside the shipped one, never share predictions)
    if held is None or held[0] is not bundle:
        if len(_PREDICTION_CACHE) >= 64:  # devices x bundles seen: drop the lot rather than grow without bound
            _PREDICTION_CACHE.clear()
        held = _PREDICTION_CACHE[key] = (bundle, {})
    cache = held[1]
    if len(cache) > _CACHE_MAX_ROWS:  # before the lookup: clearing after it lost the rows it had found cached
        cache.clear()
    keys = uh.tolist()
    missing = [i for i, k in enumerate(keys) if k not in cache]
    if missing:
        rows = frame.iloc[first[missing]].reset_index(drop=True)
        # a step graph's rows: sized by its builders' own bounds (featurize.workload.MAX_TOKENS_PER_STEP)
        out = predict_kernels(rows, spec, bundle=bundle, plausible_shapes=False)
        vals = zip(out["pred_latency_ms"].to_numpy(dtype=float), out["pred_low_ms"].to_numpy(dtype=float),
                   out["pred_high_ms"].to_numpy(dtype=float), out["ood"].to_numpy(dtype=bool), out["error"].astype(str).tolist(),
                   out["roofline_ms"].to_numpy(dtype=float))
        for i, v in zip(missing, vals):
            cache[int(uh[i])] = v
    return [cache[k] for k in keys]


def _kernel_hashes(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct row hashes, first row of each, inverse) of kernel rows (op, dtype, shape columns)."""
    h = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    return np.unique(h, return_index=True, return_inverse=True)


def _surrogate_times(frame: pd.DataFrame, spec: DeviceSpec, bundle: KernelBundle) -> pd.DataFrame:
    """pred_latency_ms / low / high / ood / error / roofline_ms for kernel rows (op, dtype, shape columns).

    Distinct rows are predicted once, and only those this process has not predicted before on this
    device with this bundle."""
    cols = ["pred_latency_ms", "pred_low_ms", "pred_high_ms", "ood", "error", "roofline_ms"]
    if frame.empty:
        return pd.DataFrame({c: [] for c in cols})
    uh, first, inverse = _kernel_hashes(frame)
    table = pd.DataFrame(_surrogate_rows(frame, (uh, first), spec, bundle), columns=cols)
    return table.iloc[inverse].reset_index(drop=True)


def _peak_tflops(dtype: np.ndarray, spec: DeviceSpec, unknown: str) -> np.ndarray:
    """The dense matrix peak (TFLOP/s) of each row's dtype (``unknown`` for a dtype wattcast does not know), looked
    up once per distinct dtype."""
    names, inv = np.unique(np.asarray(dtype, dtype=str), return_inverse=True)
    return np.array([spec.peak_matrix_tflops(d if d in DTYPE_BYTES else unknown) for d in names], dtype=float)[inv.ravel()]


def _roofline_ms(flops: np.ndarray, bytes_: np.ndarray, dtype: np.ndarray, spec: DeviceSpec) -> np.ndarray:
    peak = _peak_tflops(dtype, spec, "fp32") * 1e12
    return np.maximum(flops / peak, bytes_ / (spec.memory_bandwidth_gbps * 1e9)) * 1e3


def _flash_mma_scale(dtype: np.ndarray, spec: DeviceSpec, bundle: KernelBundle,
                     reference: str = REFERENCE_DEVICE) -> np.ndarray:
    """Per row: the device's matmul ceiling over the ``reference``'s (the A100 the FA2 shares were measured on, or
    the H100 SXM5 of the off-native FA2 share; :func:`attention_mma_scale`), looked up once per device, bundle,
    reference and dtype."""
    names, inv = np.unique(np.asarray(dtype, dtype=str), return_inverse=True)
    key = (id(spec), id(bundle), reference, tuple(names.tolist()))
    hit = _FLASH_SCALE_CACHE.get(key)
    # both objects are held (a spec is frozen), so their ids are not reused while cached
    if hit is None or hit[0] is not spec or hit[1] is not bundle:
        if len(_FLASH_SCALE_CACHE) > 256:
            _FLASH_SCALE_CACHE.clear()
        hit = (spec, bundle, attention_mma_scale(spec, names, bundle, reference))
        _FLASH_SCALE_CACHE[key] = hit
    return hit[2][inv.ravel()]


_FLASH_SCALE_CACHE: dict = {}


#: the band of a fused-attention kernel (x low, x high of its time): a stated ASSUMPTION, not a calibration (issue
#: 14). No held-out fused-attention timing exists in the shared data to calibrate it: Vidur's attention profiles are
#: not in the snapshot (tensorcore/SOURCE-vidur.md: attention.csv absent), the HTA traces hold no flash/fmha kernel,
#: the LLMCompass and XLA tables time GEMMs and single vector ops; the whole-step rows that run flash attention (MPT,
#: Megatron CI) time steps, not the kernel. The model is pinned to the FlashAttention-2 paper's shares (Dao 2023,
#: arXiv:2307.08691), not fitted, so nothing in it measures its error either.
FLASH_BAND_RATIO = (0.8, 1.25)


def _flash_ms(f: pd.DataFrame, flops: np.ndarray, bytes_: np.ndarray, dtype: np.ndarray,
              spec: DeviceSpec, bundle: KernelBundle, ring: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fused attention nodes (B = batch x heads, M = queries, N = head dim, K = keys): the spec-sheet model of
    models/attention.py, with a band of -20% / +25% (:data:`FLASH_BAND_RATIO`, an assumption: no held-out timing
    measures it). Its
    tensor-core part scales with the device's matmul ceiling as the bundle's GEMM family takes it, its softmax part
    runs at the device's single-issue FP32 rate.

    ``ring`` (per node; None: 1 each): a context-parallel KV ring's size, whose node (M queries against K = M x ring
    keys) is timed as the kernels Transformer Engine launches per ring step
    (:func:`~wattcast.featurize.context_parallel.ring_attention_steps`: one causal M x M, the others M x M/2 or
    M/2 x M, the same FLOPs), each step reading 1/ring of the node's bytes. Returns (ms, low, high, the diagonal
    step's share of the node's time: 0 off a ring), the last for the scheduler's per-step overlap of the KV
    transfers (simulate/distributed.py _comm_parts)."""
    B, M, N, K = (f[c].to_numpy(dtype=float) for c in ("B", "M", "N", "K"))
    # a recomputed forward (activation checkpointing's re-run, in the backward phase) is the forward kernel again
    # (torch.utils.checkpoint re-runs the module's forward: the same flash-attention forward launch), with the
    # forward's FLOPs: costing it as a backward kernel read its FLOPs as 2.5x fewer scores (kept / 2.5) at the
    # backward's efficiency, 1.33x the forward's time on an A100 (fa1)
    rc = f["recompute"].to_numpy(dtype=bool) if "recompute" in f.columns else np.zeros(len(f), dtype=bool)
    bwd = (f["phase"].to_numpy() == "backward") & ~rc
    # the graph's FLOPs are exact (half the square when causal): the share of the scores the mask keeps
    kept = flops / np.maximum(4.0 * B * M * N * K * np.where(bwd, BACKWARD_FLOP_RATIO, 1.0), 1.0)
    kernel = np.where(f["kernel"].astype(str).to_numpy() == "", DEFAULT_FLASH_KERNEL, f["kernel"].astype(str).to_numpy())
    peak = _peak_tflops(dtype, spec, "bf16")
    fp32 = scalar_fp32_tflops(spec.peak_fp32_tflops, spec.num_sms, spec.cores_per_sm, spec.boost_clock_mhz)
    mma = _flash_mma_scale(dtype, spec, bundle)
    # FA2 off its native tensor-core instruction (Hopper, data-centre Blackwell): the H100's share, scaled by the
    # device's matmul ceiling over the H100 SXM5's (models/attention.py, off-native FA2)
    cc = compute_capability(spec)
    offn = bool(len(kernel)) and any(off_native(k, cc) for k in np.unique(kernel.astype(str)))
    mma_h = _flash_mma_scale(dtype, spec, bundle, OFF_NATIVE_REFERENCE_DEVICE) if offn else 1.0
    ms = flash_attention_ms(kernel=kernel, phase=np.where(bwd, "backward", "forward"), bh=B, s_q=M, s_kv=K,
                            head_dim=N, kept=kept, io_bytes=bytes_, peak_tflops=peak, fp32_tflops=fp32,
                            memory_gbps=spec.memory_bandwidth_gbps, sms=spec.num_sms, mma_scale=mma,
                            compute_capability=cc, off_native_mma_scale=mma_h)
    diag = np.zeros(len(ms))
    r = np.ones(len(ms)) if ring is None else np.asarray(ring, dtype=float)
    on = np.flatnonzero((r > 1) & (np.abs(K - M * r) < 0.5))  # a ring node: M queries against ring x M keys
    if len(on):
        # the node's kept share: 0.5 under the causal mask (the ring's balanced half), 1 without
        sq, skv, kp, count = ring_attention_steps(M[on], r[on], kept[on] < 0.75)

        def rep(a):  # each ring node's value for its three step kinds
            return np.repeat(np.asarray(a)[on], 3)
        step = flash_attention_ms(kernel=rep(kernel), phase=rep(np.where(bwd, "backward", "forward")), bh=rep(B),
                                  s_q=sq.ravel(), s_kv=skv.ravel(), head_dim=rep(N), kept=kp.ravel(),
                                  io_bytes=rep(bytes_ / r), peak_tflops=rep(peak), fp32_tflops=fp32,
                                  memory_gbps=spec.memory_bandwidth_gbps, sms=spec.num_sms,
                                  mma_scale=np.broadcast_to(mma, ms.shape)[on].repeat(3), compute_capability=cc,
                                  off_native_mma_scale=np.broadcast_to(mma_h, ms.shape)[on].repeat(3)).reshape(-1, 3)
        ms = ms.copy()
        ms[on] = (step * count).sum(axis=1)
        diag[on] = step[:, 0] / ms[on]
    return ms, ms * FLASH_BAND_RATIO[0], ms * FLASH_BAND_RATIO[1], diag


def _addu_ms(spec: DeviceSpec, bundle: KernelBundle, b: int, h: int) -> float:
    """The surrogate's latency for one fp32 scalar add of (b, h) on ``spec`` (cached per device and bundle)."""
    key = (_spec_key(spec), id(bundle), b, h)
    hit = _ADDU_CACHE.get(key)
    if hit is not None and hit[0] is bundle:  # the bundle is held, so its id is not reused while cached
        return hit[1]
    k = pd.DataFrame({"op": ["addu"], "dtype": ["fp32"], **{c: [np.nan] for c in SHAPE_COLUMNS}})
    k["B"], k["H"] = float(b), float(h)
    v = float(_surrogate_times(k[["op", "dtype", *SHAPE_COLUMNS]], spec, bundle)["pred_latency_ms"].iloc[0])
    _ADDU_CACHE[key] = (bundle, v)
    return v


_ADDU_CACHE: dict = {}


def in_stream_kernel_ms(pred: pd.DataFrame, spec: DeviceSpec, bundle: KernelBundle | None = None,
                        gpu_floor_ms: float = GPU_KERNEL_FLOOR_MS) -> np.ndarray:
    """Kernel times as a step costs them, from ``predict_kernels`` output (:func:`stream_ms`): FP32 rows without the
    isolated-timing floor (:func:`_timing_floor_ms`), never below their roofline time; other dtypes as predicted; none
    below ``gpu_floor_ms`` plus its roofline time. What a profiler trace of a running model measures per kernel."""
    bundle = bundle or load_bundle()
    floor = _timing_floor_ms(spec, bundle)
    dtype = pred["dtype"].astype(str).to_numpy() if "dtype" in pred else np.full(len(pred), "fp32")
    return stream_ms(pred["pred_latency_ms"].to_numpy(dtype=float), pred["roofline_ms"].to_numpy(dtype=float),
                     np.where(dtype == "fp32", floor, 0.0), 1.0, gpu_floor_ms)


def stream_ms(lat_ms: np.ndarray, roofline_ms: np.ndarray, timing_floor_ms: np.ndarray, mult, gpu_floor_ms: float
              ) -> np.ndarray:
    """A kernel's time in a stream from its learned latency ``lat_ms`` (times ``mult``): minus the isolated-timing
    floor where one applies (``timing_floor_ms`` > 0: FP32), then never below ``gpu_floor_ms`` (the GPU-side fixed
    time of a kernel, :data:`GPU_KERNEL_FLOOR_MS`) plus its roofline time. A row without a roofline (NaN) counts it 0."""
    roof = np.nan_to_num(roofline_ms, nan=0.0)
    own = np.maximum(lat_ms - timing_floor_ms, np.where(timing_floor_ms > 0, roof, 0.0)) * mult
    return np.maximum(own, roof * mult + gpu_floor_ms)


def _timing_floor_ms(spec: DeviceSpec, bundle: KernelBundle) -> float:
    """What an isolated, event-timed kernel measurement adds over the kernel's cost inside a stream (ms).

    The kernel surrogates learned latencies timed one op at a time with CUDA events; on every device the
    smallest kernels still read ~0.015-0.045 ms (NeuSight's kernel CSVs: e.g. a 16x256 scalar add takes
    as long as a 1M-element one), a fixed cost of timing an op alone. Back to back in one eager stream a
    tiny kernel costs only :data:`STREAM_TINY_KERNEL_MS`. So the surrogate's own prediction for a 16x256 scalar
    add (a kernel that is all overhead) minus that is taken off every learned FP32 kernel time (see cost_nodes);
    being a prediction, it needs no measurement of the device. The host's launch cost is not in it (it is composed
    by :func:`cost_nodes`' host model)."""
    v = _addu_ms(spec, bundle, *_FLOOR_SHAPE)
    return max(v - STREAM_TINY_KERNEL_MS, 0.0) if np.isfinite(v) else 0.0


def stream_bandwidth_gbps(spec: DeviceSpec, bundle: KernelBundle | None = None) -> float:
    """Memory bandwidth a large streaming kernel achieves on ``spec`` (GB/s): the learned scalar add of
    ``_STREAM_SHAPE`` (read + write), for costing passes over whole tensors that are not graph nodes."""
    bundle = bundle or load_bundle()
    b, h = _STREAM_SHAPE
    ms = _addu_ms(spec, bundle, b, h)
    if not np.isfinite(ms) or ms <= 0:
        return float(spec.memory_bandwidth_gbps)
    return 2.0 * b * h * 4 / (ms / 1e3) / 1e9


@dataclass(frozen=True)
class _CostPlan:
    """What :func:`cost_nodes` reads of a graph that no device, bundle or setting changes (arrays read-only)."""

    nodes: pd.DataFrame  # the graph's nodes, index reset
    method: np.ndarray
    dtype: np.ndarray
    flops: np.ndarray
    bytes_: np.ndarray
    #: (node idx, FP32 rows, multiplier) per part of the kernel table (surrogate nodes, then proxy nodes)
    parts: tuple
    covered: np.ndarray  # nodes costed from the kernel table
    kernels: pd.DataFrame | None  # the kernel table (op, dtype, shape columns), None without one
    hashes: tuple | None  # _kernel_hashes of it
    any_fp32: bool
    flash: np.ndarray  # node idx of fused attention
    flash_nodes: pd.DataFrame
    flash_ring: np.ndarray  # per fused-attention node, its context-parallel KV ring's size (1: none)
    coll: np.ndarray
    real: np.ndarray  # collectives that move data (a kernel name: not a zero-time marker)


def _read_only(*arrays) -> None:
    for a in arrays:
        a.flags.writeable = False


def _cost_plan_of(nodes: pd.DataFrame, rings: dict | None = None) -> _CostPlan:
    """``rings``: the graph's ``meta["cp_ring_attention"]`` (forward node name -> KV ring size; its backward and
    recomputed forward, ``.grad`` / ``.recompute``, are the same ring's)."""
    n = len(nodes)
    method = nodes["method"].to_numpy()
    dtype = nodes["dtype"].to_numpy()
    db = np.array([DTYPE_BYTES.get(d, 4) for d in dtype], dtype=float)
    scale = nodes["scale"].to_numpy(dtype=float)
    flops = nodes["flops"].to_numpy(dtype=float).copy()
    bytes_ = nodes["bytes"].to_numpy(dtype=float).copy()
    # one kernel table for every node that needs the learned models
    parts: list[tuple[np.ndarray, pd.DataFrame, np.ndarray]] = []  # (node idx, kernel rows, multiplier)
    sur = np.flatnonzero(method == "surrogate")
    if len(sur):
        k = nodes.loc[sur, ["kernel", "dtype", *SHAPE_COLUMNS]].rename(columns={"kernel": "op"})
        parts.append((sur, k, scale[sur]))
    prx = np.flatnonzero(method == "proxy")
    if len(prx):
        # a scalar add reads and writes one tensor: 2 x elements x dtype bytes
        elems = np.maximum(bytes_[prx] / (2.0 * db[prx]), 1.0)
        width = np.minimum(elems, _PROXY_WIDTH).round()
        rows = np.maximum(np.round(elems / width), 1.0)
        k = pd.DataFrame({"op": "addu", "dtype": dtype[prx], "B": rows, "H": width})
        parts.append((prx, k, scale[prx] * elems / (rows * width)))
    kernels = hashes = None
    covered = np.zeros(n, dtype=bool)
    any_fp32 = False
    if parts:
        frame = pd.concat([p[1] for p in parts], ignore_index=True)
        for c in SHAPE_COLUMNS:
            if c not in frame:
                frame[c] = np.nan
        kernels = frame[["op", "dtype", *SHAPE_COLUMNS]]
        hashes = _kernel_hashes(kernels)
        _read_only(*hashes)
        any_fp32 = bool((frame["dtype"].to_numpy() == "fp32").any())
        for idx, _, _ in parts:
            covered[idx] = True
    parts_out = tuple((idx, rows["dtype"].to_numpy() == "fp32", mult) for idx, rows, mult in parts)
    for p in parts_out:
        _read_only(*p)
    fl = np.flatnonzero(method == "flash")
    flash_ring = np.ones(len(fl))
    if rings and len(fl):
        base = nodes["name"].iloc[fl].astype(str).str.replace(r"\.(grad|recompute)$", "", regex=True)
        flash_ring = base.map(rings).fillna(1).to_numpy(dtype=float)
    coll = method == "collective"
    real = coll & (nodes["kernel"].to_numpy() != "")
    method = method.copy()
    dtype = dtype.copy()
    _read_only(method, dtype, flops, bytes_, covered, fl, flash_ring, coll, real)
    return _CostPlan(nodes=nodes, method=method, dtype=dtype, flops=flops, bytes_=bytes_, parts=parts_out,
                     covered=covered, kernels=kernels, hashes=hashes, any_fp32=any_fp32, flash=fl,
                     flash_nodes=nodes.iloc[fl], flash_ring=flash_ring, coll=coll, real=real)


#: per graph (by identity, while it lives; made again for a graph given another nodes frame): its :class:`_CostPlan`
_PLANS = GraphMemo(max_entries=64)


def _cost_plan(graph: OpGraph) -> _CostPlan:
    return _PLANS.get_or_build(graph, (graph.nodes,), lambda: _cost_plan_of(graph.nodes.reset_index(drop=True),
                                                                            graph.meta.get("cp_ring_attention")))


#: pandas copies on write (pandas 3; pandas 2 with the option on): a frame shallow-copied and then given new columns
#: leaves the frame it came from as it was
_COPY_ON_WRITE = int(pd.__version__.split(".")[0]) >= 3 or bool(pd.get_option("mode.copy_on_write") is True)


def frame_copy(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` to add or replace columns in (shallow under copy-on-write: the same values, no data copied)."""
    return frame.copy(deep=not _COPY_ON_WRITE)


def launch_queue_ms(gpu_ms, host_ms, sync_before=None) -> np.ndarray:
    """Per kernel, in program order, what it adds to the end of an in-order stream fed by one CPU thread (ms).

    Kernel k is issued once the host has spent ``host_ms`` on it and on every kernel before it (H_k, the cumulative
    host time) and runs when the stream is free: end_k = max(end_{k-1}, H_k) + gpu_k, end_0 = 0. With G the
    cumulative GPU time, end_k = G_k + max(0, max_{j<=k}(H_j - G_{j-1})): one cumulative maximum, no loop. The result
    is end_k - end_{k-1} (>= gpu_k: the excess is the time the GPU waited for the host, a launch gap), so the kernels'
    sum is the stream's end and every sum over a subset (a phase, an op class, a layer) is its share of it.

    ``sync_before``: kernels before which the host waits for the GPU (a host sync: ``.item()``, a blocking copy): the
    host resumes at the stream's end, so the queue starts again empty there (each segment is its own queue, offset by
    the end of the last). A node with ``host_ms`` 0 and ``gpu_ms`` 0 adds nothing."""
    gpu = np.asarray(gpu_ms, dtype=float)
    host = np.broadcast_to(np.asarray(host_ms, dtype=float), gpu.shape)
    starts = [0]
    if sync_before is not None:
        starts += [int(i) for i in np.flatnonzero(np.asarray(sync_before, dtype=bool)) if i > 0]
    bounds = [*starts, len(gpu)]
    out = np.empty(len(gpu))
    for a, z in zip(bounds[:-1], bounds[1:]):
        if z <= a:
            continue
        g = gpu[a:z]
        G = np.cumsum(g)
        # the host's cumulative delay of the stream (end_k - G_k): non-decreasing, exactly 0 while the host keeps ahead
        wait = np.maximum(np.maximum.accumulate(np.cumsum(host[a:z]) - (G - g)), 0.0)
        out[a:z] = g + np.diff(wait, prepend=0.0)
    return out


def host_sync_before(nodes: pd.DataFrame) -> np.ndarray:
    """Per node of a step graph (program order): whether the host waits for the GPU before launching it.

    One sync per training micro-batch, between its backward and the optimizer phase: Hugging Face's Trainer checks each
    micro-batch's loss for inf/NaN on the host (transformers 5.24.0 trainer.py l. 1918-1922, ``torch.isnan(tr_loss_step)
    or torch.isinf(tr_loss_step)`` in a Python ``if``: a ``bool()`` of a CUDA tensor, a device-to-host copy; on by
    default, training_args.py l. 1022 ``logging_nan_inf_filter=True``), so the optimizer's launches start on an idle
    GPU. None where the step goes on without one: ``torch.nn.utils.clip_grad_norm_`` scales by the clamped coefficient
    on the device (torch 2.13 nn/utils/clip_grad.py l. 168-173; its ``error_if_nonfinite`` check, l. 109, is off by
    default), NCCL collectives are enqueued on a stream, not waited for, by the host (torch 2.13
    distributed/distributed_c10d.py l. 1624-1627: "CUDA execution is async", the process blocks only under
    ``TORCH_NCCL_BLOCKING_WAIT``; a collective is one launch in the queue), and the step's start is a sync already (the
    next batch's host-to-device copy). Not modelled: FP16's ``GradScaler.step``, which reads
    ``found_inf`` on the host before the optimizer step (torch 2.13 amp/grad_scaler.py l. 371), a second sync inside
    the optimizer phase (its few launches at most)."""
    ph = column_values(nodes, "phase")
    opt = ph == "optimizer"
    prev = np.r_[False, opt[:-1]]
    return opt & ~prev & (np.arange(len(ph)) > 0)


def _expanded_order(repeats: np.ndarray) -> np.ndarray:
    """Node index of each kernel of the full step a short graph stands for, in program order: a run of consecutive
    nodes that each stand for m > 1 blocks (``distributed._layer_multiplicity``: the repeated block(s) of a forward,
    backward or optimizer phase) is that run m times over."""
    r = np.asarray(repeats, dtype=np.int64)
    cut = np.flatnonzero(np.diff(r)) + 1
    parts = []
    for a, z in zip(np.r_[0, cut], np.r_[cut, len(r)]):
        run = np.arange(a, z)
        parts.append(np.tile(run, int(r[a])) if r[a] > 1 else run)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def queued_node_ms(gpu_ms: np.ndarray, host_ms, sync_before: np.ndarray, repeats=None) -> np.ndarray:
    """:func:`launch_queue_ms` of a graph's nodes; with ``repeats`` (per node, how many blocks of the full model it
    stands for in a short graph) the queue runs over the full step's kernel sequence (:func:`_expanded_order`) and
    each node gets the mean of its copies' times (so that node x repeats sums to the full step exactly)."""
    host = np.broadcast_to(np.asarray(host_ms, dtype=float), np.shape(gpu_ms))
    if repeats is None or np.all(np.asarray(repeats) <= 1):
        return launch_queue_ms(gpu_ms, host, sync_before)
    idx = _expanded_order(repeats)
    first = np.zeros(len(idx), dtype=bool)
    first[np.unique(idx, return_index=True)[1]] = True
    inc = launch_queue_ms(gpu_ms[idx], host[idx], sync_before[idx] & first)
    return np.bincount(idx, weights=inc, minlength=len(gpu_ms)) / np.asarray(repeats, dtype=float)


def _queued(gpu: np.ndarray, marker: np.ndarray, launch_overhead_ms, nodes: pd.DataFrame, repeats) -> np.ndarray:
    """Each node's time in the launch queue (:func:`queued_node_ms`): the host cost per launch (one number or one per
    node), none for a zero-time collective ``marker``, with :func:`host_sync_before`'s syncs of ``nodes``."""
    host = np.where(marker, 0.0, np.broadcast_to(np.asarray(launch_overhead_ms, dtype=float), gpu.shape))
    return queued_node_ms(gpu, host, host_sync_before(nodes), repeats)


#: per graph: its fp32 convolutions relabelled tf32 (:func:`with_cudnn_tf32`), None when it has none to relabel
_TF32_GRAPHS = GraphMemo(max_entries=64)


def with_cudnn_tf32(graph: OpGraph, spec: DeviceSpec) -> OpGraph:
    """``graph`` with its fp32 convolution kernels relabelled ``tf32`` where PyTorch runs them so on ``spec``: a GPU
    with TF32 tensor cores (``peak_tf32_tflops``) under ``torch.backends.cudnn.allow_tf32`` (PyTorch's default; a graph
    built with ``StepOptions(cudnn_tf32=False)`` has ``meta["cudnn_tf32"]`` False: its convolutions stay FP32), those
    whose input channels the TF32 kernels take (``featurize.conv_gemm.cudnn_tf32_rows``). The kernel models then cost
    them as TF32 implicit GEMMs (``models.kernel_predictor._route_convs``). ``meta["conv_math"]`` says what was
    costed. The graph itself when nothing changes; the relabelled graph is made once per graph."""
    if not spec.peak_tf32_tflops or "conv_math" in graph.meta:
        return graph
    out = _TF32_GRAPHS.get_or_build(graph, (graph.nodes, graph.meta), lambda: _tf32_conv_graph(graph))
    return graph if out is None else out


def _tf32_conv_graph(graph: OpGraph) -> OpGraph | None:
    """:func:`with_cudnn_tf32`'s graph: None when no fp32 convolution could run TF32; else the relabelled graph (or, with
    ``meta["cudnn_tf32"]`` False, the graph as it is), with ``meta["conv_math"]`` saying what is costed."""
    nodes = graph.nodes
    if "Input_Channel" not in nodes or not len(nodes):
        return None
    tf32 = cudnn_tf32_rows(nodes["kernel"].to_numpy(), nodes["dtype"].to_numpy(), nodes["method"].to_numpy(),
                           nodes["Input_Channel"].to_numpy(dtype=float))
    if not tf32.any():
        return None
    on = bool(graph.meta.get("cudnn_tf32", True))
    conv = np.isin(nodes["kernel"].to_numpy(), CONV_KERNELS)
    if on:
        nodes = nodes.copy()
        nodes["dtype"] = np.where(tf32, "tf32", nodes["dtype"].to_numpy()).astype(object)
    meta = dict(graph.meta, conv_math=dict(cudnn_tf32=on, tf32_conv_kernels=int(tf32.sum()) if on else 0,
                                           fp32_conv_kernels=int((conv & (nodes["dtype"].to_numpy() == "fp32")).sum())))
    return replace(graph, nodes=nodes, meta=meta)


def cost_nodes(graph: OpGraph, spec: DeviceSpec, bundle: KernelBundle | None = None, *,
               launch_overhead_ms: float = DEFAULT_LAUNCH_OVERHEAD_MS, collective_ms=None,
               gpu_floor_ms: float = GPU_KERNEL_FLOOR_MS, host_model: str = "queue", repeats=None) -> pd.DataFrame:
    """The graph's nodes plus ``time_ms``, ``low_ms``, ``high_ms``, ``ood`` and ``gpu_ms`` columns.
    ``launch_overhead_ms``: each node's host cost, one number or one per graph node (``distributed.node_launch_ms``);
    ``host_model`` how it composes with the GPU times (:data:`HOST_MODELS`): ``queue``, eager PyTorch's in-order launch
    queue (:func:`launch_queue_ms`, with :func:`host_sync_before`'s syncs), each node's ``time_ms`` what it adds to
    the step; ``max``, a node takes max(GPU time, host cost) (a per-kernel floor, as the Megatron presets were fitted).
    ``repeats`` (queue only): per node, the blocks of the full model it stands for (a short graph's repeated block,
    ``distributed._layer_multiplicity``), so that the queue runs over the full step's kernels (:func:`queued_node_ms`).
    A zero-time collective marker costs nothing either way.
    ``gpu_floor_ms``: the GPU-side fixed time of a learned (surrogate or proxy) node's kernel, on top of its roofline
    time (:func:`stream_ms`).

    ``collective_ms(kernel, bytes, group) -> (ms, ood)`` (numpy arrays) costs collective nodes; without it a
    graph must hold none (a single-device graph has only the zero-time markers of tensor parallelism).
    What depends on the graph alone (its kernel table and the table's row hashes) is made once per graph
    (:func:`_cost_plan`)."""
    bundle = bundle or load_bundle()
    graph = with_cudnn_tf32(graph, spec)
    plan = _cost_plan(graph)
    nodes = plan.nodes
    n = len(nodes)
    t = np.full(n, np.nan)
    lo = np.full(n, np.nan)
    hi = np.full(n, np.nan)
    ood = np.zeros(n, dtype=bool)
    method, dtype, flops, bytes_ = plan.method, plan.dtype, plan.flops, plan.bytes_
    if plan.parts:
        res = _surrogate_rows(plan.kernels, plan.hashes[:2], spec, bundle)
        inverse = plan.hashes[2]
        lat, low, high, r_ood, err, roofline = (np.asarray(c)[inverse] for c in zip(*res))
        lat, low, high, roofline = (np.asarray(c, dtype=float) for c in (lat, low, high, roofline))
        floor = _timing_floor_ms(spec, bundle) if plan.any_fp32 else 0.0
        pos = 0
        covered = plan.covered
        t[covered] = lo[covered] = hi[covered] = 0.0
        for idx, fp32, mult in plan.parts:
            r = slice(pos, pos + len(idx))
            pos += len(idx)
            bad = err[r] != ""
            # the floor is a property of NeuSight's one-op-at-a-time FP32 timings; the tensor-core sources
            # behind fp16/bf16/tf32/fp8 kernels were timed otherwise (and vTrain's FP16 fitting half is
            # predicted worse with it: 9.7% vs 8.3% mean, host costs refitted either way)
            # Taking the floor off never makes a kernel beat its roofline time (a 1-5 MB add measured at
            # about the floor still moves its bytes).
            # Nor does any kernel take less than the GPU-side fixed time of a kernel plus its roofline time.
            f_ms = np.where(fp32, floor, 0.0)
            p, pl, ph = (stream_ms(v[r], roofline[r], f_ms, mult, gpu_floor_ms) for v in (lat, low, high))
            np.add.at(t, idx, np.where(bad, np.nan, p))
            np.add.at(lo, idx, np.where(bad, np.nan, pl))
            np.add.at(hi, idx, np.where(bad, np.nan, ph))
            ood[idx] |= r_ood[r].astype(bool) | bad
    fl = plan.flash
    ring_diag = None
    if len(fl):
        t[fl], lo[fl], hi[fl], diag = _flash_ms(plan.flash_nodes, flops[fl], bytes_[fl], dtype[fl], spec, bundle,
                                                plan.flash_ring)
        if (plan.flash_ring > 1).any():
            ring_diag = np.zeros(n)
            ring_diag[fl] = diag
    coll, real = plan.coll, plan.real
    if coll.any():
        t[coll] = 0.0
        lo[coll] = 0.0
        hi[coll] = 0.0
        if real.any():
            if collective_ms is None:
                raise ValueError("the graph holds collectives but no cluster was given to cost them")
            ms, c_ood = collective_ms(nodes["kernel"].to_numpy()[real], bytes_[real], nodes["group"].to_numpy()[real])
            t[real] = ms
            # the collective model's held-out 90% band, in or out of its support (models/artifacts/collective_band.json,
            # training/collective_band.py: leave-one-configuration-out on DGX-H100, the unseen Polaris system); was
            # x0.8 / x1.25, unsourced, which held 87% of the first and 24% of the second
            (in_lo, in_hi), (out_lo, out_hi) = collective_band_log()
            c_ood = np.asarray(c_ood, dtype=bool)
            lo[real] = ms * np.exp(np.where(c_ood, out_lo, in_lo))
            hi[real] = ms * np.exp(np.where(c_ood, out_hi, in_hi))
            ood[real] = c_ood
    # roofline: nodes without a model, and any node the models could not predict (flagged)
    need = np.isnan(t)
    if need.any():
        rf = _roofline_ms(flops[need], bytes_[need], dtype[need], spec)
        t[need], lo[need], hi[need] = rf, rf * 0.5, rf * 2.0
        method = method.copy()
        method[need] = "roofline"
    gpu = t.copy()
    marker = coll & (gpu == 0)
    if host_model == "queue":
        t = _queued(gpu, marker, launch_overhead_ms, nodes, repeats)
        gap = t - gpu
        lo, hi = np.where(t == 0, 0.0, lo + gap), np.where(t == 0, 0.0, hi + gap)
    elif host_model == "max":
        t = np.where(marker, 0.0, np.maximum(t, launch_overhead_ms))
        lo = np.where(t == 0, 0.0, np.maximum(lo, launch_overhead_ms))
        hi = np.where(t == 0, 0.0, np.maximum(hi, launch_overhead_ms))
    else:
        raise ValueError(f"host_model must be one of {', '.join(HOST_MODELS)}, got {host_model!r}")
    out = frame_copy(nodes)
    if method is not plan.method:  # else the graph's own column, as it is (and its cached masks with it)
        out["method"] = method
    out["gpu_ms"] = gpu
    out["time_ms"] = t
    out["low_ms"] = lo
    out["high_ms"] = hi
    out["ood"] = ood
    if ring_diag is not None:  # a context-parallel KV ring: its diagonal step's share of each attention node's time
        out[RING_DIAG_SHARE] = ring_diag
    return out


#: the costed frame's column (a graph with a context-parallel KV ring only) of each fused-attention node's diagonal
#: ring step's share of its time (the rest is the ring - 1 off-diagonal steps': :func:`_flash_ms`)
RING_DIAG_SHARE = "cp_ring_diag_share"


def requeued(costed: pd.DataFrame, before: pd.DataFrame, launch_overhead_ms=DEFAULT_LAUNCH_OVERHEAD_MS,
             host_model: str = "queue", repeats=None) -> pd.DataFrame:
    """``costed`` (``before`` after ``simulate.energy.apply_power``: a power limit or clock cap stretched some kernels'
    ``gpu_ms``, each added to its slot) with the launch queue run again on the new GPU times (``host_model`` "queue"):
    a kernel's stretch fills the launch gap before its successor where there is one, as the stream would; its band
    moves with its gap. ``costed`` itself where nothing was stretched or the host model is the per-kernel max."""
    gpu = costed["gpu_ms"].to_numpy(dtype=float)
    old = before["gpu_ms"].to_numpy(dtype=float)
    if host_model != "queue" or np.array_equal(gpu, old):
        return costed
    coll = column_is(costed, "op_class", "collective") if "op_class" in costed else np.zeros(len(gpu), dtype=bool)
    t = _queued(gpu, coll & (old == 0), launch_overhead_ms, costed, repeats)
    shift = (t - gpu) - (before["time_ms"].to_numpy(dtype=float) - old)  # the new gap less the old one
    out = frame_copy(costed)
    out["time_ms"] = t
    out["low_ms"] = np.where(t == 0, 0.0, before["low_ms"].to_numpy(dtype=float) + shift)
    out["high_ms"] = np.where(t == 0, 0.0, before["high_ms"].to_numpy(dtype=float) + shift)
    return out


def group_totals(keys: np.ndarray, time_ms: np.ndarray, flops: np.ndarray, name: str, *, by_time: bool = True,
                 codes: tuple[np.ndarray, np.ndarray] | None = None) -> list[dict]:
    """count / time_ms / flops per distinct key (numpy; a pandas groupby costs more than the costing). ``codes``:
    ``pd.factorize(keys, sort=not by_time)`` where the caller has it (:func:`column_codes`)."""
    codes, uniq = pd.factorize(keys, sort=not by_time) if codes is None else codes
    k = len(uniq)
    cnt = np.bincount(codes, minlength=k)
    t = np.bincount(codes, weights=time_ms, minlength=k)
    f = np.bincount(codes, weights=flops, minlength=k)
    order = np.argsort(-t, kind="stable") if by_time else np.arange(k)
    conv = int if name == "layer" else str
    return [{name: conv(uniq[i]), "count": int(cnt[i]), "time_ms": float(t[i]), "flops": float(f[i])} for i in order]


def fallback_summary(costed: pd.DataFrame) -> list[dict]:
    """Kernels costed without their own learned model, by op class and method (count, time); the kernels of an imported
    op no cost model knows (an ONNX op type, an aten op: tagged by ``GraphBuilder.opaque``) in rows of their own that
    name it in ``op_type``."""
    fb, codes, keys = columns_derived(costed, ("op_class", "method", "tag") if "tag" in costed else ("op_class", "method"),
                                      "fallback_keys", _fallback_keys)
    if not fb.any():
        return []
    t = costed["time_ms"].to_numpy()[fb]
    rows = []
    for r in group_totals(None, t, np.zeros(len(t)), "key", codes=(codes, keys)):
        cls, how, op = r["key"].split("|", 2)
        rows.append(dict(op_class=cls, method=how, count=r["count"], time_ms=r["time_ms"], **({"op_type": op} if op else {})))
    return rows


def _fallback_keys(op_class: np.ndarray, method: np.ndarray, tag: np.ndarray | None = None):
    """(the kernels costed without their own model, the first-seen codes of their "op_class|method|op_type" keys,
    the keys) of a costed graph's columns (:func:`fallback_summary`)."""
    fb = np.isin(method, ["roofline", "proxy", "flash"])
    if not fb.any():
        return fb, np.zeros(0, dtype=np.intp), np.zeros(0, dtype=object)
    codes, tags = pd.factorize(tag[fb], use_na_sentinel=False) if tag is not None else (np.zeros(int(fb.sum()), int), [""])
    op_type = np.array([op_type_of_tag(t) for t in tags], dtype=object)[codes]
    key = op_class[fb].astype(object) + "|" + method[fb].astype(object) + "|" + op_type
    codes, keys = pd.factorize(key, sort=False)
    return fb, codes, keys


def predict_graph(graph: OpGraph, spec: DeviceSpec, bundle: KernelBundle | None = None, *,
                  launch_overhead_ms: float = DEFAULT_LAUNCH_OVERHEAD_MS, power_limit_w: float | None = None,
                  power_model=None, clock_cap_mhz: float | None = None, collective_ms=None,
                  host_model: str = "queue") -> StepPrediction:
    """Step time (sum over one in-order stream), per-op and per-layer breakdown, memory, energy and flags.

    ``launch_overhead_ms`` / ``host_model``: the host's cost per kernel launch and how it composes (:func:`cost_nodes`;
    by default eager PyTorch's launch queue at :data:`EAGER_HOST_LAUNCH_MS`).

    ``collective_ms``: costs the graph's collectives (:func:`cost_nodes`; a tensor-parallel rank's graph of one node's
    group, ``simulate/tp_inference.py``), each in series with the kernels around it.

    ``power_limit_w``: a board power cap; kernels that would exceed it run at a lower clock (slower).
    ``clock_cap_mhz``: an SM clock cap. Both must be finite and above 0 (ValueError naming the parameter, checked
    before any costing); a cap below the lowest modelled clock and a limit no clock can meet for this step are
    refused too (see :mod:`wattcast.simulate.energy`)."""
    from wattcast.models.power import check_power_settings, idle_power_w, power_setting_notes
    from wattcast.simulate.energy import apply_power, energy_of

    power_limit_w, clock_cap_mhz = check_power_settings(power_limit_w, clock_cap_mhz, spec)
    graph = with_cudnn_tf32(graph, spec)  # an fp32 model's convolutions as PyTorch runs them on this GPU (meta says so)
    why = unsupported_step_dtype(spec, "fp8" if graph.meta.get("precision") == "fp8" else graph.meta.get("dtype", ""))
    why = why or unsupported_fp8_recipe(spec, graph.meta.get("fp8_scaling"))  # mxfp8: Blackwell; blockwise: Hopper+
    if why:
        raise ValueError(why)
    costed = cost_nodes(graph, spec, bundle, launch_overhead_ms=launch_overhead_ms, collective_ms=collective_ms,
                        host_model=host_model)
    ood = ood_band_log(costed)  # before a power limit stretches time_ms (the kernels' bands are about their own time)
    costed = requeued(apply_power(costed, spec, power_model, power_limit_w=power_limit_w, clock_cap_mhz=clock_cap_mhz),
                      costed, launch_overhead_ms, host_model)
    res = summarise_costed(graph, costed, spec)
    e = sum(energy_of(costed, spec))
    step_s = res.step_time_ms / 1e3
    tensor = bool(((column_is(costed, "op_class", "linear") | column_is(costed, "op_class", "bmm"))
                   & ~column_is(costed, "dtype", "fp32")).any())
    if ood:
        ood = dict(ood, share=res.ood_time_fraction)
    fp8 = graph.meta.get("precision") == "fp8"
    band = step_band(res.step_time_ms, "single", spec, res.per_op, bundle or load_bundle(), tensor=tensor, ood=ood,
                     fp8=fp8)
    warns = [w for w in (ood_warning(res.ood_kernel_time_fraction, OOD_OF_KERNEL_TIME), fp8_step_warning(spec, fp8)) if w]
    meta = with_warnings(dict(res.meta, idle_power_w=idle_power_w(spec)),
                         [*spec_notes(spec), *power_setting_notes(power_limit_w, clock_cap_mhz, spec), *warns])
    return replace(res, energy_j=e, avg_power_w=e / step_s if step_s > 0 else 0.0, power_limit_w=power_limit_w,
                   step_band=band, meta=meta, peak_matrix_flops=mfu_peak_flops(spec, graph.meta))


def mfu_peak_flops(spec: DeviceSpec, meta: dict) -> float:
    """The dense matrix peak (FLOP/s) a step's MFU is quoted against: the step dtype's, an FP8 recipe's the BF16 peak
    (Megatron-LM / NeMo's convention, as ``simulate.distributed`` quotes a cluster step's); 0 when not known. An fp32
    step whose convolutions were costed in TF32 (``meta["conv_math"]``, :func:`with_cudnn_tf32`: a CNN's matrix work)
    is quoted against the TF32 peak (against the FP32 one a ResNet-50 step on an A100 read an MFU of 1.8)."""
    dtype = "bf16" if meta.get("precision") == "fp8" else str(meta.get("dtype") or "")
    if dtype == "fp32" and (meta.get("conv_math") or {}).get("tf32_conv_kernels"):
        dtype = "tf32"
    try:
        return spec.peak_matrix_tflops(dtype) * 1e12
    except (ValueError, StopIteration):  # an unknown dtype (DeviceSpecError is a ValueError) or no matrix peak
        return 0.0


def step_overheads(costed: pd.DataFrame) -> dict:
    """The parts of a step that are not the model's layers, by name (ms; each is also inside ``per_op`` and the
    phase totals, not on top of them): the optimizer update, gradient-norm clipping, FP16 loss scaling (unscaling and
    the inf/NaN check of the gradients), gradient accumulation, FP8 casts,
    memory copies (layout copies), and the launch gaps: host time in which the GPU waited for the next small kernel
    (a kernel's time beyond its GPU time, where the CPU could not keep up)."""
    t = costed["time_ms"].to_numpy(dtype=float)
    gpu = costed["gpu_ms"].to_numpy(dtype=float) if "gpu_ms" in costed else t
    clip, scale, acc, optimizer = _overhead_masks(costed)
    return {"optimizer_step_ms": float(t[optimizer & ~clip & ~scale].sum()),
            "clip_grad_norm_ms": float(t[clip].sum()),
            "loss_scaling_ms": float(t[scale].sum()),
            "grad_accumulation_ms": float(t[acc].sum()),
            "fp8_cast_ms": float(t[column_is(costed, "op_class", "fp8_cast")].sum()),
            "memcpy_ms": float(t[column_is(costed, "op_class", "memory")].sum()),
            "launch_gap_ms": float(np.maximum(t - gpu, 0.0).sum())}


#: the named step overheads a ``per_op`` row's ``parts`` can hold (as in :func:`step_overheads`; the first that applies)
OP_PARTS = ("clip_grad_norm", "loss_scaling", "grad_accumulation", "memcpy", "optimizer_step")


def op_part_labels(costed: pd.DataFrame) -> np.ndarray:
    """Per costed kernel: the named overhead of :data:`OP_PARTS` it belongs to, "" for the model's own kernels (the
    same masks as :func:`step_overheads`; each kernel in one part only)."""
    clip, scale, acc, optimizer = _overhead_masks(costed)
    memory = column_is(costed, "op_class", "memory")
    return np.select((clip, scale, acc, memory, optimizer), OP_PARTS, default="").astype(object)


def _overhead_masks(costed: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per costed kernel: (gradient-norm clipping, FP16 loss scaling, gradient accumulation, the optimizer phase
    without its FP8 casts), the masks :func:`step_overheads` and :func:`op_part_labels` name overheads by."""
    clip, scale, acc = column_derived(costed, "name", "overhead_name_masks", _name_masks)
    opt = column_is(costed, "phase", "optimizer") & ~column_is(costed, "op_class", "fp8_cast")
    return clip, scale, acc, opt


def _name_masks(name: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gradient-norm clipping, FP16 loss scaling, gradient accumulation) by kernel name, as ``str.startswith`` (a
    missing name is none of them)."""
    s = pd.Series(name, dtype=object).astype(str)
    return tuple(s.str.startswith(prefix, na=False).to_numpy(dtype=bool) for prefix in ("clip_grad_norm", "loss_scale.", "accumulate_grad"))


def with_op_parts(per_op: list[dict], costed: pd.DataFrame, optimizer_impl: str | None = None) -> list[dict]:
    """``per_op`` (one row per op class) with each row's named overheads: ``launch_gap_ms`` (host time in which the GPU
    waited for the row's next small kernel, inside its ``time_ms``) and, where the row holds any, ``parts``: the
    :data:`OP_PARTS` among its kernels (name, count, time_ms; inside its ``time_ms``, not on top of it: the optimizer
    row splits into optimizer_step + clip_grad_norm + loss_scaling). Rows, keys and totals are kept. ``optimizer_impl``
    (the graph's, "fused" or "foreach") is named on the optimizer_step part as ``impl``."""
    oc = column_values(costed, "op_class")
    t = costed["time_ms"].to_numpy(dtype=float)
    gap = np.maximum(t - (costed["gpu_ms"].to_numpy(dtype=float) if "gpu_ms" in costed else t), 0.0)
    part = op_part_labels(costed)
    named = part != ""
    parts: dict[str, list[dict]] = {}
    if named.any():
        key = oc[named].astype(object) + "|" + part[named]
        for r in group_totals(key, t[named], np.zeros(int(named.sum())), "key", by_time=False):
            cls, nm = r["key"].split("|")
            parts.setdefault(cls, []).append(dict(name=nm, count=r["count"], time_ms=r["time_ms"],
                                                  **({"impl": optimizer_impl} if nm == "optimizer_step" and optimizer_impl
                                                     else {})))
    codes, uniq = column_codes(costed, "op_class")
    gaps = dict(zip(uniq, np.bincount(codes, weights=gap, minlength=len(uniq))))
    order = {n: i for i, n in enumerate(("optimizer_step", "clip_grad_norm", "loss_scaling", "grad_accumulation", "memcpy"))}
    return [dict(r, launch_gap_ms=float(gaps.get(r["op_class"], 0.0)),
                 **({"parts": sorted(parts[r["op_class"]], key=lambda q: order[q["name"]])}
                    if r["op_class"] in parts else {})) for r in per_op]


#: an FP8 step's note on its host-bound launches (:func:`fp8_host_bound`) is given when its launch gaps exceed its bf16
#: twin's by more than this share of the FP8 step
FP8_HOST_NOTE_SHARE = 0.01


def fp8_host_bound(fp8: StepPrediction, bf16: StepPrediction, host_us: float) -> tuple[dict, str | None]:
    """(``fp8_vs_bf16``: the FP8 step against the same step in bf16, its twin, ms: step, GPU time (the step less its
    launch gaps) and launch gaps of each, the FP8 cast launches and their host time at ``host_us``; the note, or None).
    The note says so when the FP8 step's launch gaps (host time in which the GPU waited for the next small kernel)
    exceed the twin's by more than :data:`FP8_HOST_NOTE_SHARE` of the step: the FP8 recipe's cast kernels add launches,
    and in a host-bound step (eager PyTorch's 40 us a launch, a small batch x seq) the host queue, not the GPU, sets the
    pace, so the GPU time the FP8 GEMMs save is partly or wholly lost (audit 58a: Llama 3 8B at 2,048 tokens on a
    B200 predicted 11.9% slower in FP8)."""
    def gaps(r):
        return float(r.overheads.get("launch_gap_ms", 0.0))

    casts = sum(int(o.get("count", 0)) for o in fp8.per_op if o.get("op_class") == "fp8_cast")
    gpu_b, gpu_f = bf16.step_time_ms - gaps(bf16), fp8.step_time_ms - gaps(fp8)
    out = dict(bf16_step_ms=bf16.step_time_ms, fp8_step_ms=fp8.step_time_ms, bf16_gpu_ms=gpu_b, fp8_gpu_ms=gpu_f,
               bf16_launch_gap_ms=gaps(bf16), fp8_launch_gap_ms=gaps(fp8), fp8_cast_launches=casts,
               fp8_cast_host_ms=casts * host_us / 1e3, host_us=host_us)
    if not (gaps(fp8) - gaps(bf16) > FP8_HOST_NOTE_SHARE * fp8.step_time_ms and gpu_f > 0 and fp8.step_time_ms > 0):
        return out, None
    step_x, gpu_x = bf16.step_time_ms / fp8.step_time_ms, gpu_b / gpu_f
    return out, (f"FP8 is host-bound here: the step is {fp8.step_time_ms:.1f} ms against {bf16.step_time_ms:.1f} ms in "
                 f"bf16 ({step_x:.2f}x), where its GPU time alone is {gpu_f:.1f} against {gpu_b:.1f} ms ({gpu_x:.2f}x). "
                 f"The FP8 recipe adds {casts:,} cast launches ({casts * host_us / 1e3:.1f} ms of host time at "
                 f"{host_us:g} us a launch) and the GPU waits for the host longer: launch gaps {gaps(bf16):.1f} ms in "
                 f"bf16, {gaps(fp8):.1f} ms in FP8. More tokens a step (batch x seq) give each launch more GPU work "
                 "(fp8_vs_bf16)")


def with_warnings(meta: dict, notes) -> dict:
    """``meta`` with ``notes`` appended to its ``warnings`` (a new dict and list: a graph's meta is shared and stays as it
    was); ``meta`` itself when there are none."""
    return dict(meta, warnings=[*(meta.get("warnings") or []), *notes]) if notes else meta


#: model FLOPs count a fused attention's backward at 2x its forward (the two matrix products' gradients, the
#: convention of Megatron-LM's and PaLM's MFU); its kernel does 2.5x (FlashAttention recomputes the scores QK^T), which
#: is hardware work (HFU), not model work
FLASH_BACKWARD_MODEL_SHARE = 2.0 / 2.5


def model_flops(nodes: pd.DataFrame, mult=1.0) -> tuple[float, float, float]:
    """(model FLOPs, the fused attention's own recomputation, eager attention's work beyond the model's) of a step
    graph's nodes, each node counted ``mult`` times: the forward and backward kernels without the optimizer step and
    without recomputation (activation checkpointing's re-run forward, FlashAttention's backward recomputing its scores:
    hardware FLOPs, not the model's), each at its ``model_share``: an eager attention's products over the pairs its mask
    drops (causal: half the S x S) and its softmax-side kernels are hardware FLOPs only, so that the model FLOPs are the
    fused kernel's whatever the attention kernel (featurize/op_graph.attention_pair_share). The second and third add up
    to the hardware FLOPs (HFU) beyond the model's, recomputation aside. One device and a cluster's ranks count the same
    way."""
    f = nodes["flops"].to_numpy(dtype=float) * mult
    work = ~column_is(nodes, "phase", "optimizer") & ~nodes["recompute"].to_numpy(dtype=bool)
    share = nodes["model_share"].to_numpy(dtype=float)
    kept = f * share
    # the fused attention's own backward kernels (a recomputed forward under full recomputation sits in the backward
    # phase too, and is out already)
    flash_b = float(kept[work & column_is(nodes, "phase", "backward")
                         & column_is(nodes, "op_class", "flash_attention")].sum())
    flash_rc = flash_b * (1.0 - FLASH_BACKWARD_MODEL_SHARE)
    return float(kept[work].sum()) - flash_rc, flash_rc, float((f - kept)[work].sum())


def summarise_costed(graph: OpGraph, costed: pd.DataFrame, spec: DeviceSpec) -> StepPrediction:
    """Sum a costed graph into a StepPrediction (shared by single-device and per-rank predictions)."""
    t = costed["time_ms"].to_numpy()
    fwd, bwd, opt = (float(t[column_is(costed, "phase", p)].sum()) for p in ("forward", "backward", "optimizer"))
    flops = costed["flops"].to_numpy(dtype=float)
    per_op = with_op_parts(group_totals(None, t, flops, "op_class", codes=column_codes(costed, "op_class")), costed,
                           optimizer_impl=graph.meta.get("optimizer_impl"))
    per_layer = group_totals(costed["layer"].to_numpy(), t, flops, "layer", by_time=False)
    fallback = fallback_summary(costed)
    total = fwd + bwd + opt
    ood = costed["ood"].to_numpy(dtype=bool)
    gpu = costed["gpu_ms"].to_numpy(dtype=float) if "gpu_ms" in costed else t
    gpu_total = float(gpu.sum())
    mem = graph_memory(graph)
    return StepPrediction(overheads=step_overheads(costed),
        device=spec.name, mode=str(graph.meta.get("mode", "inference")), forward_ms=fwd, backward_ms=bwd, optimizer_ms=opt,
        step_time_ms=total, memory_gb=mem.total_gb, memory=mem, fits=bool(mem.total_gb <= capacity_gb(spec.memory_gb)),
        memory_capacity_gb=capacity_gb(spec.memory_gb),
        flops=model_flops(costed)[0],
        per_op=per_op, per_layer=per_layer, fallback_ops=fallback,
        ood_fraction=float(ood.mean()) if len(ood) else 0.0,
        ood_time_fraction=float(t[ood].sum() / total) if total > 0 else 0.0,
        ood_kernel_time_fraction=float(gpu[ood].sum() / gpu_total) if gpu_total > 0 else 0.0,
        nodes=costed, meta=dict(graph.meta),
    )
