"""One predicted training step split into the terms an at-scale error is traced to (the house rule of issue 15).

For a row whose error is large, the question is *which term* is wrong: the GEMMs, attention, the other kernels,
the exposed communication of one class (TP, DP/ZeRO, PP, CP), the pipeline bubble, the optimizer or the host
overheads. :func:`step_terms` flattens a :class:`~wattcast.simulate.distributed.DistributedPrediction` into those
columns (``*_ms``), so a validation table carries them next to the measurement and neighbouring rows that differ
in one knob can be compared term by term.

Kernel terms are per pipeline stage: the rank graph's time per op class for one micro-batch, times the
micro-batches, divided by the stages (the average stage; with an uneven split the busiest stage is longer).
Communication terms are what the step would save if that class alone were free (``exposed_comm_split_ms``), so
they do not add up to the step exactly (overlaps); ``other_ms`` is the step minus every listed term, i.e. what
the terms leave unexplained (negative where overlapping terms are counted twice).
"""

from __future__ import annotations

#: op classes of the rank graph reported as "attention": the score and value batched GEMMs, softmax and the fused
#: kernels (eager attention's mask and dropout sit in elementwise / dropout with the other layers' ones)
ATTENTION_CLASSES = ("bmm", "softmax", "flash_attention")
#: op classes reported as "optimizer" inside the kernel terms (the step's optimizer time is its own term)
_NOT_COMPUTE = ("collective", "optimizer")
#: the columns step_terms returns, in print order
TERM_COLUMNS = ("n_micro", "gemm_ms", "attention_ms", "other_kernels_ms", "exposed_tp_ms", "exposed_dp_ms",
                "exposed_pp_ms", "exposed_cp_ms", "bubble_ms", "optimizer_ms", "launch_gap_ms", "iteration_ms",
                "other_ms")


def step_terms(p, iteration_ms: float = 0.0) -> dict:
    """The per-term breakdown of prediction ``p`` (a DistributedPrediction), in ms of the step (see the module
    docstring). ``iteration_ms``: the framework's fixed per-iteration host cost the prediction used."""
    n_micro = int(p.meta.get("n_micro") or 1)
    per_stage = n_micro / max(int(p.parallel.pp), 1)
    by_class = {o["op_class"]: float(o["time_ms"]) for o in p.per_op}
    gemm = by_class.get("linear", 0.0) * per_stage
    attn = sum(by_class.get(c, 0.0) for c in ATTENTION_CLASSES) * per_stage
    other = sum(v for k, v in by_class.items() if k not in ("linear", *ATTENTION_CLASSES, *_NOT_COMPUTE)) * per_stage
    split = p.exposed_comm_split_ms or {}
    launch = float((p.comm.get("rank_overheads_ms") or {}).get("launch_gap_ms", 0.0)) * per_stage
    out = dict(n_micro=n_micro, gemm_ms=gemm, attention_ms=attn, other_kernels_ms=other,
               exposed_tp_ms=float(split.get("tp", 0.0)) + float(split.get("ep", 0.0)),
               exposed_dp_ms=float(split.get("dp", 0.0)), exposed_pp_ms=float(split.get("pp", 0.0)),
               exposed_cp_ms=float(split.get("cp", 0.0)), bubble_ms=float(p.bubble_ms), optimizer_ms=float(p.optimizer_ms),
               launch_gap_ms=launch, iteration_ms=float(iteration_ms))
    listed = sum(v for k, v in out.items() if k not in ("n_micro", "launch_gap_ms"))  # launch gaps sit inside the kernels
    out["other_ms"] = float(p.step_time_ms) - listed
    return out
