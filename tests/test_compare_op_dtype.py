"""A comparison's bool output (labelled fp8 by the ONNX / torch.export importers) does not make its kernel an fp8 one:
(the ONNX importer costs a comparison as an `add` kernel) the node reads its float inputs at the model's width (stop 47 review: the fp32-region rule of HF RMSNorm must fire
for float dtypes only)."""
from wattcast.featurize.op_graph import GraphBuilder


def _node(out_dtype):
    b = GraphBuilder("bf16")
    x = b.input((64, 4096))
    b.elementwise("add", x, x, name="cmp", out_dtype=out_dtype, grad=False)
    nodes = b.build().nodes
    return nodes[nodes["name"] == "cmp"].iloc[0]


def test_bool_output_keeps_the_model_dtype():
    row = _node("fp8")
    assert row["dtype"] == "bf16"
    assert row["bytes"] == 2 * 64 * 4096 * 2 + 64 * 4096 * 1  # two bf16 reads, a one-byte write


def test_float_out_dtype_still_sets_the_kernel_dtype():
    assert _node("fp32")["dtype"] == "fp32"
