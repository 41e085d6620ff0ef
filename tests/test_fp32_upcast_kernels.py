"""Hugging Face RMSNorm's fp32 region (transformers 5.24.0 models/llama/modeling_llama.py l. 62-67, ``LlamaRMSNorm``:
``hidden_states.to(torch.float32)`` ... ``self.weight * hidden_states.to(input_dtype)``): the kernels between the casts
run on fp32 tensors, so their rows are fp32 kernels with fp32 bytes, forward and backward (they were predicted as the
model's bf16 kernels on fp32 bytes: Llama 3 8B's 268 MB ``normalise`` at 6.2 TB/s on an H100 whose HBM peaks at
3.43 TB/s); the casts are the fp32 copy kernel at the 6 of its 8 bytes an element they move."""

from __future__ import annotations

import pytest

from wattcast.data.catalog import resolve_device
from wattcast.featurize.workload import step_graph
from wattcast.simulate.single_device import cost_nodes

FP32_REGION = ("pow", "mean", "eps", "rsqrt", "normalise", "to_fp32", "to_dtype")


def _norm_rows(nodes, dtype="bf16"):
    n = nodes[(nodes["layer"] == 0) & nodes["name"].str.startswith("input_layernorm.")]
    part = n["name"].str.split(".").str[1]
    return n, part


@pytest.fixture(scope="module")
def train_nodes():
    return step_graph("llama3_8b", mode="train", batch=1, seq=1024, dtype="bf16").nodes


def test_fp32_region_rows_are_fp32_kernels_forward_and_backward(train_nodes):
    n, part = _norm_rows(train_nodes)
    inside = part.isin(FP32_REGION)
    assert inside.sum() >= 2 * len(FP32_REGION)  # forward and backward rows
    assert set(n.loc[inside, "dtype"]) == {"fp32"}
    # the weight product (and its gradients) stay in the model's dtype
    assert set(n.loc[part == "weight", "dtype"]) == {"bf16"}


def test_fp32_rows_bytes_agree_with_their_dtype(train_nodes):
    n, part = _norm_rows(train_nodes)
    elems = 1024 * 4096
    fwd = n[n["phase"] == "forward"].set_index(part[n["phase"] == "forward"])
    assert fwd.loc["pow", "bytes"] == 2 * elems * 4  # reads and writes fp32
    # a cast moves 2 + 4 bytes an element: the fp32 copy scaled to them
    for cast in ("to_fp32", "to_dtype"):
        assert fwd.loc[cast, "bytes"] == 6 * elems and fwd.loc[cast, "scale"] == pytest.approx(0.75)
    grad = n[(n["phase"] == "backward") & (part == "pow") & n["name"].str.endswith(".grad")]
    assert list(grad["bytes"]) == [3 * elems * 4]


def test_tf32_model_has_no_casts():
    n = step_graph("llama3_8b", mode="train", batch=1, seq=256, dtype="tf32").nodes
    names = set(n.loc[n["layer"] == 0, "name"])
    assert not any(s.endswith((".to_fp32", ".to_dtype")) for s in names)


def test_normalise_no_faster_than_hbm_on_fp32_bytes():
    """Llama 3 8B prefill b1 x 8192 on H100: the fp32 normalise (268 MB) may not beat the HBM peak."""
    spec = resolve_device("H100")
    g = step_graph("llama3_8b", mode="inference", batch=1, seq=8192, dtype="bf16")
    c = cost_nodes(g, spec)
    row = c[(c["layer"] == 0) & (c["name"] == "input_layernorm.normalise")].iloc[0]
    assert row["dtype"] == "fp32"
    gbps = row["bytes"] / (row["time_ms"] / 1e3) / 1e9
    assert gbps <= spec.memory_bandwidth_gbps
