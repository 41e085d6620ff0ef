"""A Hugging Face ReLU (OPT's FFN) keeps its result for backward (aten derivatives.yaml, relu:
``threshold_backward(grad, result, 0)``), the very tensor the next linear layer saves: one storage. Until stop 57 the
config path saved the ReLU's input (the fc1 output) as well, one B x S x ffn tensor a layer too many (OPT-1.3B, batch 4
x 1024, bf16: 7.714 GB of activations, 6.103 now); the importers were fixed the same way earlier in the stop (audit
57f finding 1). A one-kernel GELU keeps its input (gelu_backward(grad, self)), so a GELU layer holds that tensor
besides the fc2 input and the ReLU layer holds exactly one fewer."""

from __future__ import annotations

import json

import wattcast
from conftest import REPO

B, S = 4, 1024


def _activations_bytes(cfg: dict) -> float:
    r = wattcast.predict(cfg, "A100-SXM4-80GB", batch=B, seq=S, dtype="bf16", mode="train")
    return r.memory.activations_gb * 1e9, r.step_time_ms


def test_a_relu_layer_holds_one_ffn_tensor_fewer_than_a_gelu_one():
    cfg = json.loads((REPO / "featurize" / "hf_configs" / "opt_1.3b.json").read_text())
    assert cfg["activation_function"] == "relu" and not cfg.get("activation_dropout")
    relu_b, relu_ms = _activations_bytes(cfg)
    gelu_b, _ = _activations_bytes({**cfg, "activation_function": "gelu"})
    per_layer = B * S * cfg["ffn_dim"] * 2  # one bf16 (B, S, ffn) tensor
    assert abs((gelu_b - relu_b) - cfg["num_hidden_layers"] * per_layer) <= 1e-6 * gelu_b
    assert relu_ms > 0
