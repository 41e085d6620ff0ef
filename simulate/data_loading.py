"""Getting each micro-batch onto its GPU: the data-loading term of a training step.

Per micro-batch, on the ranks that read the batch (the first pipeline stage reads the tokens, the last the labels;
with one stage, both on it), three parts, each its own figure (``DistributedPrediction.comm["data_loading"]``):

- ``loader_ms``: the host time of the data loader that the step waits for. With ``workers`` = 0 the training
  process fetches and collates every micro-batch itself, in series with the step (the HF Trainer's default,
  ``dataloader_num_workers=0``); with ``workers`` > 0 worker processes prefetch in parallel and the step waits only
  when they fall behind: ``max(0, load_ms / workers - compute per micro-batch)``. ``load_ms`` (host time to produce
  one micro-batch) is the user's: a tokenised LLM stream costs ~nothing (0, the default); an image pipeline does not.
- ``h2d_ms``: the copy of the batch tensors from pinned host memory, ``copies x latency + bytes / bandwidth``
  (:data:`H2D_LATENCY_MS`, :data:`H2D_GBPS`), in series on the compute stream (``.cuda(non_blocking=True)`` on the
  current stream, as the frameworks below issue it).
- ``broadcast_ms`` (Megatron with TP > 1): tensor-parallel rank 0 reads the batch and broadcasts it to the others,
  each broadcast a collective over the TP group (costed like the rank graph's, host floor included).
- ``kernels``: small GPU kernels that derive tensors from the batch on the device (Megatron-DeepSpeed's
  ``get_ltor_masks_and_position_ids`` and label slicing), each at least the framework's launch cost.

What each framework moves per micro-batch (:data:`BATCH_LAYOUT`):

- ``hf`` (transformers' Trainer with a causal-LM collator): ``input_ids``, ``attention_mask`` and ``labels``, three
  int64 tensors of micro-batch x seq; nothing derived on the GPU; no broadcast (every rank loads its own).
- ``megatron`` (Megatron-Core's ``get_batch_on_this_tp_rank``, attention mask not created in the data loader, as
  the recipes with fused attention run): the first stage ``tokens`` and ``position_ids`` (int64), the last
  ``labels`` (int64) and ``loss_mask`` (fp32); TP rank 0 copies them and broadcasts each tensor.
- ``megatron-deepspeed`` (Megatron-DeepSpeed's ``get_batch``): ``text``, micro-batch x (seq + 1) int64, on every
  stage that reads the batch; ``broadcast_data`` sends the sizes, then the data (two broadcasts); then 8 kernels on
  the GPU (tokens and labels as contiguous slices, the causal mask's ones/tril/compare, loss mask, EOD mask, position
  ids).

The H2D constants are fitted on a real profile: the 150 pinned host-to-device copies of
``../shared/datasets/traces/a100_trace_diff_control.json.gz`` (PyTorch profiler on an A100 system; 4 B to 7 MB;
least squares on time: 7.9 us + 8.6 GB/s, large copies 7.6-12 GB/s; ``tests/test_data_loading.py`` refits them).
A PCIe Gen4 x16 link's datasheet rate is 32 GB/s per direction; this system reached about a quarter of it, which is
what a pageable-staging or switch-shared host path gives; the figure is the measured one, not the datasheet's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wattcast.data.checks import nonneg_finite, real_in

#: fixed cost of one pinned host-to-device copy (ms) and its bandwidth (GB/s): least squares on the A100 profile's
#: 150 copies (module docstring)
H2D_LATENCY_MS = 0.0079
H2D_GBPS = 8.6

#: data-loader worker processes by framework when not given: transformers' ``TrainingArguments.
#: dataloader_num_workers`` defaults to 0; Megatron-LM's and Megatron-DeepSpeed's ``--num-workers`` to 2
DEFAULT_WORKERS = {"hf": 0, "megatron": 2, "megatron-deepspeed": 2}


@dataclass(frozen=True)
class BatchLayout:
    """What one framework moves per micro-batch: bytes per token and host-to-device copies for the first and the last
    pipeline stage (a single stage reads both sets once: ``single_*``), broadcasts over the TP group per stage when
    TP > 1, and kernels derived on the GPU per stage that reads the batch."""

    first_bytes_per_token: float
    first_copies: int
    last_bytes_per_token: float
    last_copies: int
    single_bytes_per_token: float
    single_copies: int
    #: broadcasts over the TP group: per tensor copied (``broadcast_per_copy``) or per stage; 0: every rank loads its own
    tp_broadcasts: int
    broadcast_per_copy: bool
    derived_kernels: int
    extra_tokens: int = 0  # tokens per sequence beyond seq (Megatron-DeepSpeed reads seq + 1 and shifts)


BATCH_LAYOUT = {
    "hf": BatchLayout(24.0, 3, 24.0, 3, 24.0, 3, 0, False, 0),
    "megatron": BatchLayout(16.0, 2, 12.0, 2, 28.0, 4, 1, True, 0),
    "megatron-deepspeed": BatchLayout(8.0, 1, 8.0, 1, 8.0, 1, 2, False, 8, extra_tokens=1),
}


def h2d_copy_ms(total_bytes: float, copies: int, *, latency_ms: float = H2D_LATENCY_MS, gbps: float = H2D_GBPS) -> float:
    """``copies`` pinned host-to-device copies moving ``total_bytes`` together (ms)."""
    if copies <= 0:
        return 0.0
    return copies * latency_ms + total_bytes / (gbps * 1e9) * 1e3


def loader_exposed_ms(load_ms: float, workers: int, compute_ms: float) -> float:
    """Host loading time the step waits for per micro-batch: all of it without workers, else what ``workers``
    prefetching processes cannot hide behind ``compute_ms`` of the step per micro-batch."""
    if load_ms <= 0:
        return 0.0
    if workers <= 0:
        return float(load_ms)
    return max(float(load_ms) / workers - float(compute_ms), 0.0)


def resolve_workers(framework: str, workers: int | None) -> int:
    """The data-loader workers: ``workers`` as given (an int >= 0), else the framework's default."""
    if workers is None:
        return DEFAULT_WORKERS.get(framework, 0)
    v = real_in(workers, 0.0, math.inf)
    if v is None or not v.is_integer():
        raise ValueError(f"data_workers (--data-workers) must be a whole number >= 0 (data-loader worker processes), "
                         f"got {workers!r}")
    return int(workers)


def check_load_ms(load_ms: float) -> float:
    """``data_load_ms`` checked: a finite number >= 0 (host ms to produce one micro-batch)."""
    return nonneg_finite(load_ms, "data_load_ms (--data-load-ms)", "milliseconds")


def stage_copy(framework: str, micro_batch: int, seq: int, where: str) -> tuple[float, int, list[float], int]:
    """(bytes, copies, TP broadcast message sizes in bytes, derived kernels) of one micro-batch on a stage that reads
    the batch: ``where`` is ``single`` (one pipeline stage), ``first`` or ``last``. Bytes are what TP rank 0 copies
    (every rank with hf); the broadcasts apply only with TP > 1."""
    lay = BATCH_LAYOUT.get(framework, BATCH_LAYOUT["hf"])
    per_token, copies = getattr(lay, f"{where}_bytes_per_token"), getattr(lay, f"{where}_copies")
    nbytes = float(micro_batch) * (seq + lay.extra_tokens) * per_token
    if lay.broadcast_per_copy:  # one broadcast per tensor (Megatron-Core)
        sizes = [nbytes / copies] * (copies * lay.tp_broadcasts)
    elif lay.tp_broadcasts:  # broadcast_data: the sizes (a few int64), then every tensor flattened together
        sizes = [8.0 * 4] * (lay.tp_broadcasts - 1) + [nbytes]
    else:
        sizes = []
    return nbytes, copies, sizes, lay.derived_kernels


#: what ``data_loading.note`` says of a graph whose inputs are not a known token batch (no copy is costed)
NOT_A_TOKEN_BATCH = ("the batch's copy is not modelled: this graph's inputs are not known as a token batch (an imported "
                     "ONNX / torch graph)")


def stage_figures(stage: int, *, h2d_ms: float, nbytes: float, copies: int, broadcast_ms: float = 0.0,
                  broadcasts: int = 0, kernels_ms: float = 0.0, kernels: int = 0, loader_ms: float = 0.0) -> dict:
    """One reading stage's data-loading figures per micro-batch, as the JSON's ``data_loading.per_micro`` holds them."""
    return dict(stage=int(stage), loader_ms=loader_ms, h2d_ms=h2d_ms, broadcast_ms=broadcast_ms, kernels_ms=kernels_ms,
                total_ms=loader_ms + h2d_ms + broadcast_ms + kernels_ms, bytes=nbytes, copies=copies,
                broadcasts=broadcasts, kernels=kernels)


def one_device(res, *, load_ms: float = 0.0, workers: int | None = None, idle_power_w: float = 0.0):
    """A single-device :class:`~wattcast.simulate.single_device.StepPrediction` with the step's data loading (the HF
    Trainer's batch: ``input_ids``, ``attention_mask`` and, training, ``labels``, int64; copied when the graph's batch
    and sequence are known, i.e. a token model) at the start of the forward pass: in ``forward_ms`` and so
    ``step_time_ms`` (still forward + backward + optimizer), ``per_op`` (``data_loading``), ``overheads``
    (``data_loading_ms``), the energy (the GPU idles while it waits) and ``meta["data_loading"]``."""
    from dataclasses import replace

    load_ms = check_load_ms(load_ms)
    workers = resolve_workers("hf", workers)
    b, s = res.meta.get("batch"), res.meta.get("seq")
    tokens = bool(b and s and res.meta.get("hidden"))
    nbytes, copies = stage_copy("hf", b, s, "single")[:2] if tokens else (0.0, 0)
    if tokens and res.mode != "train":  # inference: no labels
        nbytes, copies = nbytes * (copies - 1) / copies, copies - 1
    fig = stage_figures(0, h2d_ms=h2d_copy_ms(nbytes, copies), nbytes=nbytes, copies=copies,
                        loader_ms=loader_exposed_ms(load_ms, workers, res.step_time_ms))
    total = fig["total_ms"]
    info = dict(per_micro=dict(single=fig), load_ms=load_ms, workers=workers, step_ms=total,
                **({} if tokens else {"note": NOT_A_TOKEN_BATCH}))
    if total <= 0:
        return replace(res, meta=dict(res.meta, data_loading=info), overheads=dict(res.overheads, data_loading_ms=0.0))
    per_op = sorted([*res.per_op, dict(op_class="data_loading", count=copies, time_ms=total, flops=0.0,
                                             launch_gap_ms=0.0)],
                    key=lambda o: -o["time_ms"])
    step = res.step_time_ms + total
    energy = res.energy_j + idle_power_w * total / 1e3
    return replace(res, forward_ms=res.forward_ms + total, step_time_ms=step, per_op=per_op,
                   overheads=dict(res.overheads, data_loading_ms=total),
                   energy_j=energy, avg_power_w=energy / (step / 1e3), meta=dict(res.meta, data_loading=info))
