"""Audit 54e (model workloads for ``predict``): an ExportedProgram's batch/seq, a tied LM head's weight in the memory
working set, ONNX models without a sequence axis on a cluster, an ONNX graph that cannot run at its bound dims, and a
bad ``hidden_act`` naming the field and the file. Each test fails on the code before the fix."""

from __future__ import annotations

import json

import pytest

import wattcast
from wattcast.featurize.op_graph import GraphError

DEV = "H100-SXM5-80GB"


# ---------------------------------------------------------------- 1. torch.export programs: the shapes costed
torch = pytest.importorskip("torch")
nn = torch.nn


class _TinyLM(nn.Module):
    def __init__(self, vocab=500, d=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        return self.head(self.mlp(self.emb(ids)))


def _ep(dynamic=None):
    return torch.export.export(_TinyLM(), (torch.randint(0, 500, (2, 32)),), dynamic_shapes=dynamic)


def test_an_exported_program_reports_the_shapes_it_was_costed_at():
    """Before: settings said batch 1 / seq 1,024 (no batch/seq given) and tokens_per_s came from them, while the step
    was costed at the export's 2 x 32."""
    d = wattcast.predict(_ep(), DEV, mode="inference").to_dict()
    assert (d["settings"]["batch"], d["settings"]["seq"]) == (2, 32)
    assert d["tokens_per_s"] == pytest.approx(2 * 32 / (d["step_time_ms"] / 1e3), rel=1e-9)


def test_an_exported_program_refuses_a_batch_its_fixed_dims_cannot_take():
    """Before: batch=8, seq=128 were reported in settings (and tokens/s) beside the 2 x 32 step."""
    with pytest.raises(GraphError, match=r"batch dim .* fixed at 2, so batch 8 cannot be applied"):
        wattcast.predict(_ep(), DEV, mode="inference", batch=8, seq=128)
    # its own shapes are accepted
    own = wattcast.predict(_ep(), DEV, mode="inference", batch=2, seq=32).to_dict()
    assert (own["settings"]["batch"], own["settings"]["seq"]) == (2, 32)


def test_an_exported_program_applies_batch_and_seq_to_its_dynamic_dims():
    """With torch.export.Dim on batch and seq the program is costed at the shapes given: the same step as the
    nn.Module at those shapes (before: the export's 2 x 32 step, reported as 8 x 128)."""
    b, s = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=1024)
    ep = _ep(({0: b, 1: s},))
    got = wattcast.predict(ep, DEV, mode="inference", batch=8, seq=128).to_dict()
    want = wattcast.predict(_TinyLM(), DEV, mode="inference", batch=8, seq=128).to_dict()
    assert got["flops"] == want["flops"]
    assert got["step_time_ms"] == pytest.approx(want["step_time_ms"], rel=1e-12)
    assert (got["settings"]["batch"], got["settings"]["seq"]) == (8, 128)
    with pytest.raises(GraphError, match=r"batch 100 is outside the range .* \(1\.\.64\)"):
        wattcast.predict(ep, DEV, mode="inference", batch=100)
    # only the batch dynamic: a seq is refused, naming it
    with pytest.raises(GraphError, match=r"seq dim .* fixed at 32, so seq 128"):
        wattcast.predict(_ep(({0: b},)), DEV, mode="inference", batch=4, seq=128)


# ---------------------------------------------------------------- 2. a tied LM head's weight is resident
def _gpt(tied: bool) -> dict:
    return {"model_type": "gpt2", "n_embd": 256, "n_head": 4, "n_layer": 2, "n_positions": 1024, "vocab_size": 50257,
            "activation_function": "gelu_new", "tie_word_embeddings": tied, "_name_or_path": f"gpt-tied-{tied}"}


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_a_tied_head_weight_is_not_counted_again_in_the_working_set(mode):
    """The tied and the untied model differ only in the head's weight being its own: weights differ by vocab x
    hidden x 2 B, the largest kernel's working set (transient) is the same. Before, the tied head (param_count 0)
    kept its 50,257 x 256 x 2 B = 25.7 MB weight in the transient."""
    tied = wattcast.predict(_gpt(True), DEV, batch=1, seq=128, mode=mode).memory
    untied = wattcast.predict(_gpt(False), DEV, batch=1, seq=128, mode=mode).memory
    assert untied.transient_gb == pytest.approx(tied.transient_gb, rel=1e-12)
    head_gb = 50257 * 256 * (2 if mode == "inference" else 2 + 4) / 1e9  # bf16 weights (+ fp32 master in training)
    assert untied.weights_gb - tied.weights_gb == pytest.approx(head_gb, rel=1e-9)


def test_gemma_2b_inference_memory_holds_its_tied_head_once():
    """Gemma 2B at batch 1 x 128 tokens of inference: before 6.06 GB, 1.05 GB of them the tied head's weight
    (256,000 x 2,048 x 2 B) counted again as the transient; the largest working set is now its logits' size class."""
    m = wattcast.predict("gemma_2b", DEV, batch=1, seq=128, mode="inference").memory
    assert m.transient_gb < 0.05
    assert m.total_gb == pytest.approx(m.weights_gb + m.transient_gb, rel=1e-12)


def test_a_tied_head_in_a_kv_cached_decode_is_not_counted_again():
    cfg = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
           "num_key_value_heads": 8, "intermediate_size": 1024, "vocab_size": 64000, "max_position_embeddings": 4096}
    tied = wattcast.predict(dict(cfg, tie_word_embeddings=True), DEV, batch=1, seq=1, kv_context=1024,
                            mode="inference").memory
    untied = wattcast.predict(dict(cfg, tie_word_embeddings=False), DEV, batch=1, seq=1, kv_context=1024,
                              mode="inference").memory
    assert tied.transient_gb == pytest.approx(untied.transient_gb, rel=1e-12)
    assert tied.transient_gb < 64000 * 512 * 2 / 1e9 / 10


def test_one_gpu_cluster_and_one_device_agree_on_states_and_activations_of_a_tied_model():
    """The one-GPU cluster path counts the CUDA context and cuBLAS workspace (buffers), one device none; both the
    largest kernel's transient (the cluster's from stop 55). Without the buffers they hold the same bytes (before, the
    device's transient carried the tied head's weight: 0.58 GB more than the cluster's total for Gemma 2B)."""
    one = wattcast.predict(_gpt(True), DEV, batch=1, seq=128)
    cl = wattcast.predict_cluster(_gpt(True), "DGX-H100", gpus=1, batch=1, seq=128)
    pd = cl.to_dict()["memory"]
    assert one.memory.total_gb == pytest.approx(pd["total_gb"] - pd["buffers_gb"], rel=1e-9)
    assert pd["transient_gb"] == pytest.approx(one.memory.transient_gb, rel=1e-12)
    # the transient is what the untied model's is (its logits' kernels), not the head's weight on top
    untied = wattcast.predict(_gpt(False), DEV, batch=1, seq=128).memory
    assert one.memory.transient_gb == pytest.approx(untied.transient_gb, rel=1e-12)


# ---------------------------------------------------------------- 3. ONNX models without a sequence axis on a cluster
onnx = pytest.importorskip("onnx")


def _mlp_onnx(path, batch="batch"):
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np

    w1 = numpy_helper.from_array(np.zeros((256, 512), np.float32), "w1")
    w2 = numpy_helper.from_array(np.zeros((512, 256), np.float32), "w2")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
                           helper.make_node("Relu", ["h"], ["r"], name="act"),
                           helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")], "mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 256])], [w1, w2])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_an_onnx_mlp_runs_on_a_cluster_without_seq(tmp_path):
    """Before: "the ONNX file's input dims are fixed (batch 1), so seq 1024 cannot be applied" for any model without
    a sequence axis, --seq given or not."""
    path = _mlp_onnx(tmp_path / "mlp.onnx")
    one = wattcast.predict(path, DEV, batch=8)
    cl = wattcast.predict_cluster(path, "DGX-H100", gpus=2, dp=2, batch=16)
    assert cl.flops == pytest.approx(2 * one.flops, rel=1e-12)
    assert cl.meta["settings"]["seq"] is None and one.meta["settings"]["seq"] is None


def test_a_seq_on_a_model_without_a_sequence_axis_says_so(tmp_path):
    """Before: "input dims are fixed (batch 4)", the 4 being the user's batch bound to the symbolic axis, and advice to
    re-export with dynamic axes, which cannot give an MLP a sequence."""
    path = _mlp_onnx(tmp_path / "mlp.onnx")
    with pytest.raises(GraphError) as e:
        wattcast.predict(path, DEV, batch=4, seq=16)
    msg = str(e.value)
    assert "no sequence axis" in msg and "seq 16 cannot be applied" in msg
    assert "fixed" not in msg and "re-export" not in msg
    # seq 1 (one position per sample) is the model's own
    assert wattcast.predict(path, DEV, batch=4, seq=1).flops == wattcast.predict(path, DEV, batch=4).flops


def test_the_cli_cluster_path_takes_an_onnx_files_own_dims(tmp_path):
    from typer.testing import CliRunner

    from wattcast.cli import app

    path = _mlp_onnx(tmp_path / "mlp.onnx")
    r = CliRunner().invoke(app, ["predict", "-m", path, "--cluster", "DGX-H100", "--gpus", "2", "--dp", "2", "-b", "16",
                                 "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout[r.stdout.index("{"):])
    assert d["settings"]["batch"] == 16 and d["settings"]["seq"] is None
    # a fixed-dim file: its own batch and seq without --seq (before: "seq 1024 cannot be applied")
    fixed = _mlp_onnx(tmp_path / "mlp8.onnx", batch=8)
    with pytest.raises(GraphError, match=r"input dims are fixed \(batch 8\), so batch 4 cannot be applied"):
        wattcast.predict(fixed, DEV, batch=4)


# ---------------------------------------------------------------- 4. an ONNX graph that cannot run at its bound dims
def _baked_reshape_onnx(path):
    """Scores x (1, seq, 64) @ x^T, then @ v, v = (x @ W) reshaped to the constant (1, 128, -1): the traced length
    baked in, as a legacy dynamo=False export does. The file runs at seq 128 only (at 256: 256 @ 128 rows)."""
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np

    w = numpy_helper.from_array(np.zeros((64, 64), np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 128, -1], np.int64), "shape")
    g = helper.make_graph([helper.make_node("Transpose", ["x"], ["xt"], name="xt", perm=[0, 2, 1]),
                           helper.make_node("MatMul", ["x", "xt"], ["s"], name="scores"),
                           helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
                           helper.make_node("Reshape", ["h", "shape"], ["v"], name="baked_reshape"),
                           helper.make_node("MatMul", ["s", "v"], ["y"], name="mix")], "baked",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", 64])], [w, shape])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_an_onnx_graph_that_cannot_run_at_the_bound_dims_is_refused(tmp_path):
    """Before: a warning ("costed by the roofline") and a prediction (exit 0) of a graph that cannot run."""
    path = _baked_reshape_onnx(tmp_path / "baked.onnx")
    assert wattcast.predict(path, DEV, seq=128, mode="inference").flops > 0  # its export's dims
    with pytest.raises(GraphError) as e:
        wattcast.predict(path, DEV, seq=256, mode="inference")
    msg = str(e.value)
    assert "'mix'" in msg and "seq=256" in msg and "cannot run at the dims" in msg


# ---------------------------------------------------------------- 5. a bad hidden_act names the field and the file
def test_a_bad_hidden_act_names_the_field_and_the_file(tmp_path):
    """Before: "unsupported activation function 'frobnicate'", naming neither."""
    cfg = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 512, "vocab_size": 1000, "hidden_act": "frobnicate"}
    path = tmp_path / "badact.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(GraphError) as e:
        wattcast.predict(str(path), DEV)
    msg = str(e.value)
    assert str(path) in msg and "field 'hidden_act'" in msg and "'frobnicate'" in msg and "silu" in msg
    gpt = {"model_type": "gpt2", "n_embd": 256, "n_head": 4, "n_layer": 2, "vocab_size": 1000,
           "activation_function": "nope"}
    with pytest.raises(GraphError, match=r"field 'activation_function' is 'nope'"):
        wattcast.predict(gpt, DEV)
