"""`wattcast validate labels`: the per-label op-class breakdown it writes."""

from __future__ import annotations

import numpy as np
import pytest


def test_label_per_op_carries_the_real_flops(data_root):
    """Audit stop 54 #8: every per_op entry of `validate labels --output` read 'flops': 0.0 (zeros were passed)."""
    from wattcast.featurize.workload import StepOptions, step_graph
    from wattcast.models.kernel_bundle import load_bundle
    from wattcast.validation.e2e_labels import find_labels, predict_label

    lab = next(x for x in find_labels(data_root) if x.folder == "Tesla_V100-PCIE-32GB" and x.model == "bert_large"
               and x.mode == "train" and x.option == "")
    row = predict_label(lab, data_root, load_bundle())
    assert row["status"] == "ok"
    per = {o["op_class"]: o for o in row["per_op"]}
    assert per["linear"]["flops"] > 0 and all(o["flops"] >= 0 for o in row["per_op"])
    # the same FLOPs the step graph gives its forward (less the loss) and backward nodes, by op class
    g = step_graph(data_root / "neusight" / "models" / f"{lab.model}.json",
                   StepOptions(batch=lab.batch, seq=lab.seq, mode="train", dtype="fp32", attention="eager",
                               optimizer="none"))
    n = g.nodes
    ph, cls = n["phase"].to_numpy(), n["op_class"].to_numpy()
    keep = ((ph == "forward") & (cls != "loss")) | (ph == "backward")
    f = n["flops"].to_numpy(dtype=float)
    for c, o in per.items():
        assert o["flops"] == pytest.approx(float(f[keep & (cls == c)].sum()), rel=1e-9), c
    assert sum(o["flops"] for o in row["per_op"]) == pytest.approx(float(f[keep].sum()), rel=1e-9)
    assert np.isfinite(row["predicted_ms"])
