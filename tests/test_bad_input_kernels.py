"""Bad input to the kernel path (`wattcast kernels`, ``predict_kernels``) and absurd step sizes: a clear error naming
the field or value, or an explicit per-row error; never a traceback or a silently wrong number. In-process (typer's
runner) to stay fast."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from conftest import flat
from wattcast.cli import app
from wattcast.data.catalog import load_catalog
from wattcast.models.kernel_predictor import predict_kernels

runner = CliRunner()
H100 = "H100-SXM5-80GB"


def run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert not (r.exception and not isinstance(r.exception, SystemExit)), f"traceback: {r.exception!r}"
    return r


def _gemms() -> pd.DataFrame:
    """Large bf16/fp16 tensor-core GEMMs (the ceiling member predicts them) and an fp32 one."""
    return pd.DataFrame({"OPName": ["linear", "bmm", "linear"], "dtype": ["bf16", "fp16", "fp32"],
                         "B": [1, 32, 1], "M": [8192, 1024, 4096], "N": [4096, 128, 4096], "K": [4096, 1024, 4096]})


# ------------------------------------------------------------------ 1. absurd batch / seq of a step
@pytest.mark.parametrize("flag", ["--batch", "--seq"])
def test_an_absurd_batch_or_seq_is_refused_before_the_graph_is_built(flag):
    r = run("predict", "--model", "gpt2", "--device", "H100", flag, "99999999999")
    assert r.exit_code == 2
    msg = flat(r.stderr)
    assert "99,999,999,999" in msg and "4,294,967,296" in msg and flag[2:] in msg


def test_a_batch_given_alone_meets_the_default_length_in_the_token_bound():
    from wattcast.featurize.op_graph import GraphError
    from wattcast.featurize.workload import StepOptions

    opts = StepOptions(batch=2**23, seq=None).validated()  # alone plausible: 2**23 sequences
    with pytest.raises(GraphError, match=r"batch x seq = 8,589,934,592"):
        opts.with_default_shape()  # x 1,024 tokens


def test_the_graph_builder_refuses_a_tensor_beyond_int64_bytes_not_overflowerror():
    from wattcast.featurize.op_graph import GraphBuilder, GraphError

    b = GraphBuilder("fp32")
    with pytest.raises(GraphError, match=r"shape \(4294967296, 4294967296\)"):
        b.input((2**32, 2**32))


# ------------------------------------------------------------------ 2. the measured ceiling goes with the figures
def test_the_matmul_ceiling_follows_the_hardware_figures_not_the_name():
    cat = load_catalog()
    mi = predict_kernels(_gemms(), cat["MI300X"])
    # the MI300X entry copied under a name of its own keeps MI300X's measured ceiling: identical predictions
    copy = dataclasses.replace(cat["MI300X"], name="MyMI300X", aliases=())
    assert predict_kernels(_gemms(), copy)["pred_latency_ms"].tolist() == mi["pred_latency_ms"].tolist()
    assert set(mi["model"].iloc[:2]) == {"ceiling"}
    # an H100's figures under the name MI300X are the H100, not the MI300X: its predictions, not MI300X's ceiling
    impostor = dataclasses.replace(cat[H100], name="MI300X", aliases=())
    h = predict_kernels(_gemms(), cat[H100])
    assert predict_kernels(_gemms(), impostor)["pred_latency_ms"].tolist() == h["pred_latency_ms"].tolist()
    # compute figures of no catalog device, named MI300X (another TDP): not the MI300X's own measured ceiling by its
    # name; since stop 55 an unlisted spec takes the listed devices of its die (its `arch`, gfx942: the MI300X alone)
    # before its vendor's median (models/gemm_floor.row_ceilings), so its GEMMs are the MI300X's; the same figures on a
    # die and a generation no listed device has take AMD's median, and differ
    other = dataclasses.replace(cat["MI300X"], tdp_w=600.0, aliases=())
    assert predict_kernels(_gemms(), other)["pred_latency_ms"].iloc[0] == pytest.approx(mi["pred_latency_ms"].iloc[0])
    unseen = dataclasses.replace(other, arch="CDNA9 (gfx999)")
    assert predict_kernels(_gemms(), unseen)["pred_latency_ms"].iloc[0] != pytest.approx(mi["pred_latency_ms"].iloc[0])
    # the MI300X's compute silicon with other memory (its compute twin, as an A100 SXM4 40 GB is the 80 GB's): its
    # measured ceiling
    from wattcast.models.kernel_bundle import load_bundle
    from wattcast.models.kernel_predictor import _ceiling_name

    cm = load_bundle().families["gemm"].ceiling_member
    assert _ceiling_name(dataclasses.replace(cat["MI300X"], memory_gb=96.0, aliases=()), cm) == "MI300X"
    assert _ceiling_name(other, cm) not in cm["ceilings"]


def test_catalog_twin_matches_by_figures_and_catalog_spec_matches_by_name():
    from wattcast.data.catalog_match import catalog_spec_matches, catalog_twin
    from wattcast.lifecycle import catalog_spec_matches as lifecycle_matches

    cat = load_catalog()
    assert lifecycle_matches is catalog_spec_matches
    copy = dataclasses.replace(cat["MI300X"], name="MyMI300X", aliases=())
    assert catalog_twin(cat["MI300X"]) is cat["MI300X"] and catalog_twin(copy) is cat["MI300X"]
    assert not catalog_spec_matches(copy)  # name-keyed prices stay with the name's own figures
    impostor = dataclasses.replace(cat["L40S"], name="MI300X", aliases=())
    assert catalog_twin(impostor) is cat["L40S"] and not catalog_spec_matches(impostor)
    assert catalog_twin(dataclasses.replace(cat["L40S"], tdp_w=123.0)) is None


# ------------------------------------------------------------------ 3. tf32 outside matmuls is fp32
def test_tf32_vector_kernels_are_predicted_as_fp32():
    ops = ["softmax", "ln", "rmsnorm", "add", "gelu", "addu"]
    frame = pd.DataFrame({"OPName": ops * 2, "dtype": ["tf32"] * len(ops) + ["fp32"] * len(ops),
                          "B": 4096, "H": 4096})
    out = predict_kernels(frame, H100)
    assert (out["error"] == "").all()
    tf32, fp32 = out.iloc[: len(ops)], out.iloc[len(ops):]
    for c in ("pred_latency_ms", "pred_low_ms", "pred_high_ms", "roofline_ms"):
        assert tf32[c].tolist() == fp32[c].tolist(), c
    assert out["dtype"].tolist() == frame["dtype"].tolist()  # the output repeats the input's cells
    # a tf32 GEMM still runs on the tensor cores: not the fp32 prediction
    g = pd.DataFrame({"OPName": ["linear", "linear"], "dtype": ["tf32", "fp32"], "B": 1, "M": 4096, "N": 4096, "K": 4096})
    p = predict_kernels(g, H100)["pred_latency_ms"]
    assert p.iloc[0] < p.iloc[1] / 2


# ------------------------------------------------------------------ 4. 16-bit GEMMs on a spec without a 16-bit peak
def test_half_precision_gemms_on_a_spec_without_a_16_bit_peak_are_per_row_errors():
    h = load_catalog()[H100]
    bare = dataclasses.replace(h, name="Unknown GPU", aliases=(), peak_tf32_tflops=None, peak_fp16_tflops=None,
                               peak_bf16_tflops=None, peak_fp8_tflops=None)
    frame = pd.concat([_gemms(), pd.DataFrame({"OPName": ["add"], "dtype": ["bf16"], "B": [64], "H": [4096]})],
                      ignore_index=True)
    out = predict_kernels(frame, bare)
    for i, d in ((0, "bf16"), (1, "fp16")):
        e = out["error"].iloc[i]
        assert f"dtype {d}" in e and "peak_bf16_tflops" in e and "peak_fp16_tflops" in e
        assert np.isnan(out["pred_latency_ms"].iloc[i])
    # the rest of the file is predicted: the fp32 GEMM, and a bf16 add (the vector units read no matrix peak)
    assert (out["error"].iloc[2:] == "").all() and out["pred_latency_ms"].iloc[2:].notna().all()


def test_a_catalog_gpu_without_a_16_bit_path_keeps_its_fp32_rate_gemms():
    """The Tesla P4's entry states it has no 16-bit path: an fp16 GEMM there is predicted as before."""
    out = predict_kernels(_gemms().iloc[[1]], "Tesla-P4")
    assert out["error"].iloc[0] == "" and out["pred_latency_ms"].iloc[0] > 0


# ------------------------------------------------------------------ 5. a header-only CSV
def test_a_header_only_kernels_csv_exits_1(tmp_path):
    f = tmp_path / "empty.csv"
    f.write_text("OPName,dtype,B,M,N,K,H\n")
    r = run("kernels", "--device", H100, "--input", f)
    assert r.exit_code == 1 and "no kernel rows" in flat(r.stderr)


# ------------------------------------------------------------------ 6. `devices` on a file that is not a spec
def test_devices_on_a_non_spec_file_or_folder_says_so(tmp_path):
    f = tmp_path / "kernels.csv"
    f.write_text("OPName,B,H\nadd,1,1\n")
    r = run("devices", f)
    assert r.exit_code == 2 and "not a device spec file" in flat(r.stderr) and "Closest catalog" not in r.stderr
    r = run("devices", tmp_path)
    assert r.exit_code == 2 and "is a directory, not a device spec file" in flat(r.stderr)
    r = run("kernels", "--device", f, "--input", f)
    assert r.exit_code == 2 and "not a device spec file" in flat(r.stderr)
    assert run("devices", "h100").exit_code == 0


# ------------------------------------------------------------------ 7. implausible shape values
def test_implausible_shape_values_are_per_row_errors_naming_the_column(tmp_path):
    f = tmp_path / "k.csv"
    f.write_text("OPName,dtype,B,M,N,K,H\n"
                 "linear,fp32,1,1e300,4096,4096,\n"    # a dim beyond 2**40
                 "add,fp32,1e7,,,,1e9\n"                # each dim plausible, the tensor 4e16 bytes
                 "linear,fp32,1,4096,4096,4096,\n")
    r = run("kernels", "--device", H100, "--input", f)
    assert r.exit_code == 0
    out = pd.read_csv(__import__("io").StringIO(r.stdout), keep_default_na=False)
    assert "column 'M'" in out["error"][0] and "2**40" in out["error"][0]
    assert "B x H" in out["error"][1] and "1e+15" in out["error"][1]
    assert out["error"][2] == "" and float(out["pred_latency_ms"][2]) > 0
    assert "e+" not in flat(r.stderr) and len(flat(r.stderr)) < 200  # no 300-digit total


def test_step_rows_skip_the_kernel_size_bounds():
    frame = pd.DataFrame({"op": ["add"], "dtype": ["fp32"], "B": [1e7], "H": [1e9]})
    assert predict_kernels(frame, H100)["error"].iloc[0] != ""
    assert predict_kernels(frame, H100, plausible_shapes=False)["error"].iloc[0] == ""
