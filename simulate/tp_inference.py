"""Tensor-parallel KV-cached inference inside one node, as vLLM runs it (``wattcast.predict_cluster(...,
kv_context=N, seq=1[, serving="vllm"])``, CLI ``wattcast predict --cluster C --gpus TP --tp TP --kv-context N``).

One tensor-parallel group of ``tp`` GPUs on one node serves the model (Megatron-style layers, Shoeybi et al. 2019
Sec. 3; vLLM's ``ColumnParallelLinear`` / ``RowParallelLinear`` / ``QKVParallelLinear`` /
``VocabParallelEmbedding``): each rank runs the graph of its shard (``featurize.workload.StepOptions.tp``), with

- attention heads, the MLP's intermediate width and the vocabulary split over the ranks; KV heads split too, or
  replicated when there are fewer than ranks (``featurize.hf_blocks.served_kv_heads``), and the KV cache with them;
- the graph's collectives: the embedding's all-reduce, two all-reduces per layer (after ``o_proj`` and after
  ``down_proj``, each tokens x hidden x dtype bytes) and the gather of the last position's logits, all in series
  with the kernels (a decode step has nothing to overlap them with), costed by the shipped collective model over
  the node's intra-node link (NCCL's algorithms; vLLM's custom all-reduce kernel for small messages is not
  modelled);
- weights and KV cache per GPU (the graph of one rank), checked against one GPU's memory.

All ranks run the same graph, so the group's step time is one rank's; the result is a
:class:`~wattcast.simulate.single_device.StepPrediction` of one GPU (memory, energy and power per GPU) with
``meta["tensor_parallel"]`` holding the group's figures. Served (``serving="vllm"``), the iteration adds the engine's
fitted TP cost (``simulate/serving.py`` ``tp_sync_ms``: the all-reduces as costed here are not what TP2/TP8 decode
iterations measure slow by). Groups across nodes, pipeline or data parallelism, and
anything a training step takes (ZeRO, sequence/context/expert parallelism, recomputation, ...) are refused.
"""

from __future__ import annotations

import numpy as np

from wattcast.simulate.parallel import GroupLayout, ParallelConfigError

#: predict_cluster's options that describe a training step or a layout a served TP group does not have, with the value
#: that means "not given" (None: nothing given)
_NOT_SERVED = {"pp": (None, 1), "dp": (None, 1), "cp": (None, 1), "ep": (None, 1), "zero": (None, 0),
               "sp": (None, False), "interleave": (None, 1), "micro_batch": (None,), "recompute": (None, "none"),
               "recompute_modules": (None,), "strategy": (None,), "etp": (None,), "schedule": (None, "1f1b"),
               "pp_first_stage_layers": (None,), "pp_last_stage_layers": (None,), "recompute_num_layers": (None,),
               "recompute_method": (None,), "overlap_grad_reduce": (None,), "overlap_param_gather": (None,),
               "tp_comm_overlap": (None,), "overlap_moe_expert_parallel_comm": (None,), "overlap_p2p_comm": (None,),
               "async_tp_comm": (None,),
               "zero3_prefetch": (None,), "fsdp_reduce_dtype": (None,), "grad_accum_dtype": (None,), "scatter_gather_p2p": (None,),
               "fp8_param_gather": (None, False), "mtp_num_layers": (None, 0), "cross_entropy_loss_fusion": (None,),
               "tokens": (None,), "optimizer_impl": (None,)}


def check_tp_serving(*, gpus, tp, gpus_per_node: int, framework: str, given: dict) -> int:
    """The TP degree of a served group, checked: ``gpus`` equals ``tp`` (one group), within one node of
    ``gpus_per_node`` GPUs, under ``framework`` "hf", and nothing in ``given`` (predict_cluster's other options) that a
    served TP group does not have. ParallelConfigError (a ValueError) naming what is wrong otherwise."""
    tp = 1 if tp is None else tp
    if not isinstance(tp, (int, np.integer)) or isinstance(tp, bool) or tp < 1:
        raise ParallelConfigError(f"tp must be a positive whole number, got {tp!r}")
    for k, v in given.items():
        if v not in _NOT_SERVED.get(k, (None,)):
            what = ("pipeline-parallel serving is not modelled" if k == "pp" else
                    "one tensor-parallel group serves the model (no data parallelism: give --gpus equal to --tp)"
                    if k == "dp" else "it describes a training step or a layout other than one tensor-parallel group")
            raise ParallelConfigError(f"kv_context (--kv-context: KV-cached inference on a cluster) runs one node's "
                                      f"tensor-parallel group as vLLM serves it; {k}={v!r} is not modelled: {what}")
    gpus = tp if gpus is None else gpus
    if gpus != tp:
        raise ParallelConfigError(f"kv_context (--kv-context) on a cluster serves the model on one tensor-parallel "
                                  f"group: gpus ({gpus}) must equal tp ({tp})")
    if tp > int(gpus_per_node):
        raise ParallelConfigError(f"tp {tp} spans more than one node ({gpus_per_node} GPUs per node): tensor-parallel "
                                  f"serving across nodes is not modelled")
    if str(framework).lower() != "hf":
        raise ParallelConfigError(f"kv_context (--kv-context) on a cluster models vLLM's serving of Hugging Face "
                                  f"models with the eager kernels of --framework hf, not {framework!r}")
    return int(tp)


def tp_collective_fn(model, cluster, tp: int):
    """``collective_ms(kernel, bytes, group) -> (ms, ood)`` for the graph of one rank of a ``tp``-GPU group on one
    node of ``cluster`` (``simulate.single_device.cost_nodes``), by the collective model ``model``."""
    from wattcast.simulate.distributed import collective_ms

    layout = GroupLayout(int(tp), int(tp), 1)

    def fn(kernel, size, group):
        return collective_ms(model, kernel, size, layout, cluster)

    return fn


def tp_summary(graph, res, *, tp: int, cluster_name: str) -> dict:
    """The group's figures of a served TP step: its collectives (count and bytes per kind, from the graph; their
    time, from ``res.per_op``), the GPUs and their total energy and power."""
    n = graph.nodes
    coll = n[(n["op_class"] == "collective") & (n["kernel"] != "")]
    kinds = {}
    for k, g in coll.groupby("kernel"):
        kinds[str(k)] = dict(count=int(len(g)), bytes=[float(x) for x in sorted(set(g["bytes"].tolist()))],
                             total_bytes=float(g["bytes"].sum()))
    coll_ms = float(sum(o["time_ms"] for o in res.per_op if o.get("op_class") == "collective"))
    return dict(tp=int(tp), gpus=int(tp), cluster=cluster_name, collectives=kinds, collective_ms=coll_ms,
                energy_all_gpus_j=float(res.energy_j) * tp, avg_power_all_gpus_w=float(res.avg_power_w) * tp)
