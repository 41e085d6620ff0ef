"""``--compile``: approximate ``torch.compile`` (Inductor) by fusing chains of memory-bound ops.

Connected runs of elementwise, dropout, copy, reduction, softmax and LayerNorm nodes inside one layer
become one kernel that reads only the tensors coming from outside the run and writes only the tensors used
outside it (or the graph's outputs); GEMMs, embeddings and attention kernels stay as they are. A fused
kernel is memory-bound and costed as a ``proxy`` (a copy moving the same bytes). Its backward is one fused
kernel moving twice the forward bytes (gradients in and out plus the saved inputs), an approximation.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from wattcast.featurize.op_graph import NODE_COLUMNS, SHAPE_COLUMNS, OpGraph

FUSIBLE = ("elementwise", "dropout", "memory", "reduction", "softmax", "layernorm")


def _find(parent: np.ndarray, i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def fuse_elementwise(g: OpGraph) -> OpGraph:
    nodes = g.nodes.reset_index(drop=True)
    n = len(nodes)
    if n == 0:
        return g
    fusible = nodes["op_class"].isin(FUSIBLE).to_numpy() & (nodes["method"].to_numpy() != "roofline")
    layer = nodes["layer"].to_numpy()
    parent = np.arange(n)
    for s, d in g.edges.tolist():
        if fusible[s] and fusible[d] and layer[s] == layer[d]:
            a, b = _find(parent, s), _find(parent, d)
            if a != b:
                parent[max(a, b)] = min(a, b)
    root = np.array([_find(parent, i) for i in range(n)])
    sizes = np.bincount(root, minlength=n)
    grouped = fusible & (sizes[root] > 1)
    if not grouped.any():
        return g
    out_bytes = np.asarray(g.saved["out_bytes"], dtype=float)
    inputs = g.saved["inputs"]
    consumers: list[list[int]] = [[] for _ in range(n)]
    for s, d in g.edges.tolist():
        consumers[s].append(d)
    bytes_ = nodes["bytes"].to_numpy(dtype=float)
    last = {}
    for i in range(n):
        if grouped[i]:
            last[int(root[i])] = i
    old_tids = g.saved.get("input_tids")
    old_tnode = np.asarray(g.saved["tensor_node"])
    rows, by_node, backward, new_inputs, new_out, new_tids = [], [], [], [], [], []
    new_id = np.full(n, -1, dtype=np.int64)
    members: dict[int, list[int]] = {}
    for i in range(n):
        if grouped[i]:
            members.setdefault(int(root[i]), []).append(i)
    recs = nodes.to_dict("records")
    for i in range(n):
        if grouped[i] and last[int(root[i])] != i:
            continue
        nid = len(rows)
        if not grouped[i]:
            new_id[i] = nid
            rows.append(recs[i])
            by_node.append(list(g.saved["by_node"][i]))
            backward.append(list(g.saved["backward"][i]))
            new_inputs.append(list(inputs[i]))
            new_out.append(out_bytes[i])
            if old_tids is not None:
                new_tids.append(list(old_tids[i]))
            continue
        grp = members[int(root[i])]
        gs = set(grp)
        ext = 0.0
        for m in grp:
            internal_in = sum(out_bytes[p] for p in inputs[m] if p in gs)
            ext += max(bytes_[m] - out_bytes[m] - internal_in, 0.0)
            if not consumers[m] or any(c not in gs for c in consumers[m]):
                ext += out_bytes[m]
        for m in grp:
            new_id[m] = nid
        first = recs[grp[0]]
        row = {c: np.nan for c in SHAPE_COLUMNS}
        row.update(name="fused[" + ",".join(recs[m]["name"] for m in grp[:4]) + (",..." if len(grp) > 4 else "") + "]",
                   op_class="fused", kernel="", method="proxy", dtype=first["dtype"],
                   flops=float(sum(recs[m]["flops"] for m in grp)), bytes=ext, scale=1.0,
                   param_count=int(sum(recs[m]["param_count"] for m in grp)), layer=first["layer"], scope=first["scope"],
                   phase="forward", fwd_id=-1, recompute=False, tag=first["tag"], group="")
        # the members' model FLOPs over their FLOPs (each member's ``model_share`` weighted by its FLOPs)
        model = float(sum(recs[m]["flops"] * recs[m]["model_share"] for m in grp))
        row["model_share"] = model / row["flops"] if row["flops"] > 0 else 1.0
        rows.append(row)
        saves = sorted({t for m in grp for t in g.saved["by_node"][m]})
        by_node.append(saves)
        has_bw = any(g.saved["backward"][m] for m in grp)
        backward.append([dict(name=f"{row['name']}.grad", op_class="fused", kernel="", method="proxy",
                              flops=2 * row["flops"], bytes=2 * ext, scale=1.0)] if has_bw else [])
        new_inputs.append(sorted({p for m in grp for p in inputs[m] if p not in gs}))
        if old_tids is not None:  # the tensors the fused kernel reads: its members' inputs made outside the group
            new_tids.append(sorted({int(t) for m in grp for t in old_tids[m] if int(old_tnode[t]) not in gs}))
        new_out.append(float(sum(out_bytes[m] for m in grp if not consumers[m] or any(c not in gs for c in consumers[m]))))
    new_inputs = [sorted({int(new_id[p]) for p in ins if new_id[p] != nid}) for nid, ins in enumerate(new_inputs)]
    edges = sorted({(s, d) for d, ins in enumerate(new_inputs) for s in ins})
    tensor_node = np.asarray(g.saved["tensor_node"])
    tensor_node = np.where(tensor_node >= 0, new_id[np.maximum(tensor_node, 0)], -1)
    saved = dict(g.saved, by_node=by_node, backward=backward, inputs=new_inputs, out_bytes=np.array(new_out),
                 tensor_node=tensor_node)
    if old_tids is not None:
        # one list a fused node (until stop 58 the unfused graph's lists were kept, one per original node: misaligned
        # with the fused nodes, so a compiled graph's block inputs and a recomputed module's inputs read wrong rows)
        saved["input_tids"] = new_tids
    frame = pd.DataFrame(rows, columns=list(NODE_COLUMNS))
    frame["layer"] = frame["layer"].astype(np.int64)
    frame["fwd_id"] = frame["fwd_id"].astype(np.int64)
    frame["recompute"] = frame["recompute"].astype(bool)
    meta = dict(g.meta, fused_groups=len(members), fused_nodes=int(grouped.sum()))
    return OpGraph(frame, np.array(edges, dtype=np.int64).reshape(-1, 2), meta, saved)
