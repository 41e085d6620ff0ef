"""Issue 14's new-user audit: an FP8 peak typed into a spec of an architecture without FP8 is refused; consumer
Blackwell (GB20x) has its own dense rate per SM, so its sparse figures are caught; fp16 GEMMs on a spec with a BF16
peak but no FP16 one are refused as ``predict --dtype fp16`` refuses them; kernel errors list the accepted ops and
dtypes and the bf16-GEMM refusal depends on the device; ``ood_reason`` names the device descriptors out of range; the
per-layer table says where the optimizer step is; Chrome trace kernel events carry their dtype."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

import wattcast
from conftest import REPO, flat, run_cli
from wattcast.data.catalog import list_devices, resolve_device
from wattcast.data.device_spec import DeviceSpecError, architecture_of, from_dict
from wattcast.models.kernel_predictor import predict_kernels

DEVICES = REPO / "data" / "devices"
A100 = yaml.safe_load((DEVICES / "A100-SXM4-80GB.yaml").read_text())
MI250 = yaml.safe_load((DEVICES / "MI250.yaml").read_text())

#: NVIDIA RTX Blackwell GPU architecture whitepaper, Appendix A (GeForce RTX 5090): dense BF16/FP16 209.5 TFLOP/s with
#: FP32 accumulate (419 with FP16 accumulate), FP8 419, 170 SMs, 2,407 MHz boost, 1,792 GB/s, 96 MB L2, 575 W
RTX5090 = dict(name="RTX-5090", vendor="nvidia", arch="Blackwell (GB202)", peak_fp32_tflops=104.8,
               peak_tf32_tflops=104.8, peak_fp16_tflops=209.5, peak_bf16_tflops=209.5, peak_fp8_tflops=419.0,
               memory_gb=32, memory_type="GDDR7", memory_bandwidth_gbps=1792, num_sms=170, cores_per_sm=128,
               base_clock_mhz=2017, boost_clock_mhz=2407, l2_cache_mb=96, tdp_w=575,
               source="NVIDIA RTX Blackwell GPU architecture whitepaper, Appendix A, GeForce RTX 5090 column")


def _spec(d: dict, **change):
    return from_dict({**d, "aliases": [], **change})


# ------------------------------------------------------------------ 1. FP8 peak on an architecture without FP8
@pytest.mark.parametrize("base, fp8", [(A100, 624.0), (MI250, 724.0)])
def test_a_typed_in_fp8_peak_on_an_architecture_without_fp8_is_refused_naming_the_field(base, fp8):
    with pytest.raises(DeviceSpecError) as e:
        _spec(base, name="typed", peak_fp8_tflops=fp8)
    msg = flat(str(e.value))
    assert "field 'peak_fp8_tflops'" in msg and "has no FP8 tensor cores" in msg and base["arch"] in msg, msg


@pytest.mark.parametrize("arch", ["Hopper (GH100)", "Ada Lovelace (AD102)", "CDNA3 (gfx942)", "CDNA 3", "Blackwell (GB202)"])
def test_architectures_with_fp8_keep_their_fp8_peak(arch):
    from wattcast.data.device_spec import arch_without_fp8

    assert not arch_without_fp8(arch)
    assert arch_without_fp8("CDNA (gfx908)") and arch_without_fp8("Turing (TU104)") and arch_without_fp8("Ampere (GA102)")


def test_a_catalog_a100_is_still_told_it_has_no_fp8():
    with pytest.raises(wattcast.GraphError if hasattr(wattcast, "GraphError") else Exception) as e:
        wattcast.predict("gpt2", "A100-SXM4-80GB", batch=1, seq=128, dtype="fp8")
    assert "Ampere (GA100) has no FP8 tensor cores" in flat(str(e.value))


# ------------------------------------------------------------------ 2. consumer Blackwell's dense rate
def test_consumer_blackwell_has_its_own_dense_rate_and_its_sparse_column_is_refused():
    assert architecture_of("Blackwell (GB202)")[1] == 1024.0
    assert architecture_of("Blackwell (GB100)")[1] == 8192.0 and architecture_of("Blackwell (GB110)")[1] == 8192.0
    dense = _spec(RTX5090)  # the FP32-accumulate figures (512 per SM per clock) load
    assert dense.peak_bf16_tflops == 209.5
    # FP16 with FP16 accumulate (419, 1,024 per SM per clock) is refused since stop 57: PyTorch's FP16 GEMMs
    # accumulate in FP32 (tests/test_geforce_fp16_accumulate.py); --force loads it
    with pytest.raises(DeviceSpecError, match=r"field 'peak_fp16_tflops' \(419\).*FP16-accumulate figure"):
        _spec(RTX5090, peak_fp16_tflops=419.0)
    # FP8 has an FP16-accumulate figure too (838), but PyTorch / Transformer Engine FP8 GEMMs accumulate in FP32 (419):
    # on a GeForce it is refused like BF16's, naming the accumulate rate (since stop 56;
    # tests/test_geforce_fp8_accumulate.py)
    with pytest.raises(DeviceSpecError, match=r"field 'peak_fp8_tflops' \(838\).*FP16-accumulate figure"):
        _spec(RTX5090, peak_fp8_tflops=838.0)
    # BF16 and TF32 have no FP16 accumulation: on a GeForce 419 / 209.5 are their sparse columns (since stop 50)
    with pytest.raises(DeviceSpecError, match=r"field 'peak_bf16_tflops' \(419\).*GeForce part"):
        _spec(RTX5090, peak_bf16_tflops=419.0)
    with pytest.raises(DeviceSpecError, match=r"field 'peak_fp16_tflops' \(838\).*GB20x.*sparse"):
        _spec(RTX5090, peak_fp16_tflops=838.0, peak_bf16_tflops=838.0, peak_tf32_tflops=419.0, peak_fp8_tflops=1676.0)
    # every catalog device still loads (data-centre Blackwell on its 8,192)
    assert {s.name for s in list_devices()} >= {"B200", "B300", "GB200", "GB300"}


# ------------------------------------------------------------------ 3. fp16 GEMMs on a spec with only a BF16 peak
def test_fp16_gemm_on_a_spec_with_bf16_but_no_fp16_peak_is_refused_as_predict_refuses_it():
    spec = _spec(RTX5090, peak_fp16_tflops=None)
    rows = pd.DataFrame({"OPName": ["linear", "linear", "softmax"], "dtype": ["bf16", "fp16", "fp16"],
                         "B": [1, 1, 8], "M": [8192, 8192, None], "N": [8192, 8192, None], "K": [8192, 8192, None],
                         "H": [None, None, 1024]})
    out = predict_kernels(rows, spec)
    assert out.loc[0, "error"] == "" and out.loc[0, "pred_latency_ms"] > 0
    assert "peak_fp16_tflops" in out.loc[1, "error"] and pd.isna(out.loc[1, "pred_latency_ms"])
    assert out.loc[2, "error"] == "" and out.loc[2, "pred_latency_ms"] > 0  # a vector row reads no matrix peak
    from wattcast.data.device_spec import unsupported_step_dtype
    assert "peak_fp16_tflops" in unsupported_step_dtype(spec, "fp16")


# ------------------------------------------------------------------ 5. ood_reason names the descriptor
def test_ood_reason_names_the_device_descriptor_and_keeps_its_leading_value():
    rows = pd.DataFrame({"OPName": ["add", "linear"], "dtype": ["bf16", "fp32"], "B": [1, 1], "M": [None, 4096],
                         "N": [None, 4096], "K": [None, 4096], "H": [3584, None]})
    out = predict_kernels(rows, _spec(RTX5090))
    for r in out["ood_reason"]:
        assert r.split(" (")[0] in ("device", "shape+device"), r
        assert "sms 170 above the covered" in r, r
    assert (out["ood"]).all()


# ------------------------------------------------------------------ 6. messages
def test_unknown_op_and_dtype_list_the_accepted_values():
    rows = pd.DataFrame({"OPName": ["linear", "frobnicate"], "dtype": ["int8", "bf16"], "B": [1, 1], "M": [64, 64],
                         "N": [64, 64], "K": [64, 64]})
    out = predict_kernels(rows, "H100-SXM5-80GB")
    assert out.loc[0, "error"].startswith("unknown dtype 'int8'; known: fp32, tf32, fp16, bf16, fp8")
    e = out.loc[1, "error"]
    assert e.startswith("unknown op 'frobnicate'; known: ") and "linear" in e and "rmsnorm" in e and "softmax" in e


def test_bf16_gemm_refusal_depends_on_the_device():
    gemm = pd.DataFrame({"OPName": ["linear"], "dtype": ["bf16"], "B": [1], "M": [1024], "N": [1024], "K": [1024]})
    bw = predict_kernels(gemm, _spec(RTX5090, peak_bf16_tflops=None, peak_fp8_tflops=None)).loc[0, "error"]
    assert "peak_bf16_tflops" in bw and "Blackwell (GB202) has BF16 tensor cores" in bw and "V100, T4" not in bw, bw
    v100 = predict_kernels(gemm, resolve_device("V100-SXM2-32GB")).loc[0, "error"]
    assert "Volta (GV100) has no BF16 tensor cores" in v100 and "pre-Ampere" in v100, v100


# ------------------------------------------------------------------ 4. per-layer title, 7. trace dtype
def test_per_layer_title_says_each_layer_holds_its_optimizer_step():
    r = run_cli("predict", "--model", "gpt2", "--device", "H100-SXM5-80GB", "--batch", "1", "--seq", "128")
    assert r.returncode == 0, r.stderr
    out = flat(r.stdout)
    assert "last = head, loss and optimizer" not in out and "optimizer step of its own parameters" in out, out
    res = wattcast.predict("gpt2", "H100-SXM5-80GB", batch=1, seq=128)
    n = res.nodes
    opt_layers = set(n.loc[n["op_class"].astype(str) == "optimizer", "layer"])
    assert opt_layers == set(n["layer"])  # what the title says: every layer's row holds its optimizer kernels


def test_trace_kernel_events_carry_their_dtype():
    from wattcast.simulate.trace import chrome_trace_events

    res = wattcast.predict("llama3_8b", "H100-SXM5-80GB", batch=1, seq=128, dtype="fp8")
    ev = [e for e in chrome_trace_events(res) if e["ph"] == "X" and e.get("cat") != "data"]
    assert ev and all("dtype" in e["args"] and "layer" in e["args"] for e in ev)
    gemm = {e["args"]["dtype"] for e in ev if e["cat"].endswith(",linear")}
    assert {"fp8", "bf16"} <= gemm, gemm


def test_arch_spellings_of_fp8_and_consumer_blackwell():
    """The README's own "GB20x" spelling names consumer Blackwell (1,024 dense FLOP/SM/clock, not 8,192), and a
    hyphenated "CDNA-3" has FP8 while "CDNA-2" has none (final-read mends)."""
    from wattcast.data.device_spec import architecture_of, arch_without_fp8

    assert architecture_of("Blackwell (GB20x)")[1] == 1024.0 and architecture_of("Blackwell (GB100)")[1] == 8192.0
    assert not arch_without_fp8("CDNA-3") and not arch_without_fp8("CDNA_3") and arch_without_fp8("CDNA-2")
