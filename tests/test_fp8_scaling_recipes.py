"""--fp8-recipe (Megatron-Core 0.16's delayed / tensorwise / mxfp8 / blockwise; Transformer Engine 2.20's recipes):
the casts' extra passes, the FP8 copies' block scales, the cached weights' scales, and the GPUs each recipe runs on."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattcast
from conftest import flat, run_cli
from wattcast.data.catalog import resolve_device
from wattcast.featurize.fp8_recipes import (blockwise_scale_bytes, compute_capability, fp8_writes_transpose,
                                            mxfp8_scale_bytes, unsupported_fp8_recipe, weight_copy_bytes_per_param,
                                            weight_scale_bytes_per_param)
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.parallel import ParallelConfigError

KW = dict(batch=1, seq=2048, dtype="fp8", attention="flash")


def _graph(recipe):
    return step_graph("llama3_8b", StepOptions(batch=1, seq=1024, mode="train", dtype="fp8", attention="flash",
                                               fp8_recipe=recipe), blocks=2)


def test_scale_bytes_follow_te_quantizer_shapes():
    # TE 2.20 csrc/quantizer.cpp MXFP8Quantizer::get_scale_shape: row-wise {roundup(M,128), roundup(K/32,4)},
    # column-wise {roundup(M/32,4), roundup(K,128)}, 1 B (E8M0) each
    assert mxfp8_scale_bytes(2048, 4096, columnwise=False) == 2048 * 128
    assert mxfp8_scale_bytes(2048, 4096, columnwise=True) == 64 * 4096
    assert mxfp8_scale_bytes(96, 32, columnwise=False) == 128 * 4  # padded rows and scale columns
    assert mxfp8_scale_bytes(96, 32, columnwise=True) == 4 * 128
    # Float8BlockQuantizer::get_scale_shape, fp32 (4 B): 1x128 row-wise {ceil(K/128), roundup(M,4)}, column-wise
    # {ceil(M/128), roundup(K,4)}; 128x128 row-wise {ceil(M/128), roundup(ceil(K/128),4)}
    assert blockwise_scale_bytes(2048, 4096, columnwise=False) == 32 * 2048 * 4
    assert blockwise_scale_bytes(2048, 4096, columnwise=True) == 16 * 4096 * 4
    assert blockwise_scale_bytes(4096, 14336, columnwise=False, block_dim=2) == 32 * 112 * 4
    assert blockwise_scale_bytes(4096, 14336, columnwise=True, block_dim=2) == 112 * 32 * 4
    assert weight_copy_bytes_per_param("delayed") == weight_copy_bytes_per_param("tensorwise") == 2.0
    assert weight_scale_bytes_per_param("mxfp8") == 2 / 32 and weight_scale_bytes_per_param("blockwise") == 8 / 128**2


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "mxfp8", "blockwise"])
def test_cast_kernels_bytes_per_recipe(recipe):
    n = _graph(recipe).nodes
    lin = n[(n["phase"] == "forward") & (n["dtype"] == "fp8") & (n["op_class"] == "linear")]
    casts = n[(n["phase"] == "forward") & (n["op_class"] == "fp8_cast")].set_index(["layer", "name"])["bytes"]
    scales = {"mxfp8": mxfp8_scale_bytes, "blockwise": blockwise_scale_bytes}.get(recipe)
    for layer, name, m, k in lin[["layer", "name", "M", "N"]].itertuples(index=False):
        m, k = int(m), int(k)
        extra = 0 if scales is None else scales(m, k, columnwise=False) + scales(m, k, columnwise=True)
        # read bf16, write the row-wise data and its transpose / column-wise copy, and their block scales
        assert casts[(layer, f"{name}.fp8_cast")] == m * k * (2 + 2) + extra
        if recipe == "tensorwise":  # current scaling's amax pass reads the input once more
            assert casts[(layer, f"{name}.fp8_amax")] == m * k * 2
        else:
            assert (layer, f"{name}.fp8_amax") not in casts.index
    opt = n[(n["phase"] == "optimizer") & (n["op_class"] == "fp8_cast")]
    fp8_p = lin["param_count"].sum()
    per_param = 2 + weight_copy_bytes_per_param(recipe) + (2 if recipe == "tensorwise" else 0)
    # one cast per module weight (stop 58: TE quantizes each module's weight, linear.py l. 575-585); tensorwise adds
    # each weight's amax and its one-element scale kernel (12 B: CURRENT_SCALE_KERNEL_BYTES)
    weights = int((lin["param_count"] > 0).sum())
    assert (opt["name"].str.startswith("fp8_weight_cast")).sum() == weights
    assert len(opt) == weights * (3 if recipe == "tensorwise" else 1)
    assert opt["bytes"].sum() == pytest.approx(per_param * fp8_p + (12 * weights if recipe == "tensorwise" else 0),
                                               rel=1e-12)


def test_default_is_delayed_bit_for_bit():
    base = wattcast.predict("llama3_8b", "H100-SXM5-80GB", **KW)
    delayed = wattcast.predict("llama3_8b", "H100-SXM5-80GB", fp8_recipe="delayed", **KW)
    assert base.step_time_ms == delayed.step_time_ms and base.memory_gb == delayed.memory_gb
    assert base.energy_j == delayed.energy_j
    assert base.to_dict()["settings"]["fp8_recipe"] == "delayed"
    n = base.nodes  # delayed scaling: no amax pass, 4 B a parameter for the weight cast, 1 B a saved element
    assert not n["name"].str.contains("amax").any()
    kw = dict(gpus=8, batch=8, seq=2048, tp=8, sp=True, dtype="fp8", attention="flash", framework="megatron")
    a = wattcast.predict_cluster("llama3_8b", "DGX-H100", **kw)
    b = wattcast.predict_cluster("llama3_8b", "DGX-H100", fp8_recipe="delayed", **kw)
    assert a.step_time_ms == b.step_time_ms and a.to_dict()["memory"] == b.to_dict()["memory"]


def test_delayed_on_hopper_matches_the_figures_before_fp8_recipe():
    """Pinned to the code before --fp8-recipe (d5e73e4^, computed there with the same shipped models): delayed scaling on
    H100, where the no-transpose rule of data-centre Blackwell does not apply, is what it was."""
    p = wattcast.predict("llama3_8b", "H100-SXM5-80GB", **KW)
    # since the eager RMSNorm owns its weight (tests/test_stage_params_norms.py) the optimizer steps the 65 norms'
    # 266,240 weights too: optimizer_ms +0.0033 ms (was 253.8355307525473 ms, 148.07928143058945 J; nothing else moved)
    # since the eager RMSNorm's fp32 region is costed as fp32 kernels (tests/test_fp32_upcast_kernels.py): 253.83881968486335
    # ms, 172.94015692800002 GB (its fp32 variance, +0.5 MB), 148.0813403651539 J before; the Megatron cluster below
    # (fused norms) unchanged
    # stop 47: an fp8 GEMM's bf16 output is counted at 2 bytes in its roofline features (featurize.kernel_features,
    # data.kernel_ops.MATMUL_OUT_BYTES): 262.7365104895299 -> 262.7550786357907 ms, 153.3918495633836 ->
    # 153.40370937173898 J (cluster 159.17351249893227 -> 159.17114451025014 ms, 713.9114920707688 -> 715.8537119180994 J)
    # stop 47, the GEMM family retrained on those features (MLflow c04b85fb; the floor, ceiling and MLP members refit):
    # 262.7550786357907 -> 262.7815153901664 ms, 153.40370937173898 -> 153.4169438743002 J (cluster
    # 159.17114451025014 -> 159.10641549621118 ms, 715.8537119180994 -> 713.5740832692321 J); memory unchanged
    # stop 49: no learned kernel below its roofline time + GPU_KERNEL_FLOOR_MS (3 us, the A100 trace's CUPTI floor,
    # tests/test_gpu_kernel_floor.py): 262.7815153901664 -> 266.9032690507636 ms, 153.4169438743002 ->
    # 155.16719290781705 J (cluster 159.10641549621118 -> 159.86999331299475 ms, 713.5740832692321 ->
    # 716.2542764963907 J); memory unchanged
    # stop 51: the kernel MLP's GEMMs accumulate in float64 and round to float32 (models/kernel_surrogates.py
    # _MLP_BLOCK), the same bits on any CPU: 266.9032690507636 -> 266.90326706814795 ms, 155.16719290781705 ->
    # 155.1671922398196 J (cluster 159.86999331299475 -> 159.8699929570144 ms, 716.2542764963907 -> 716.2542760917726 J)
    # stop 55: the loss's working set per framework and the largest kernel's transient on every cluster stage
    # (featurize/op_graph.loss_working_bytes; tests/test_loss_transient.py): memory 172.940689408 -> 174.516699136 GB
    # (cluster 30.523426048 -> 31.18612608 GB), times unchanged; then the NVIDIA vendor ceiling counting each
    # matrix-unit device once (training/gemm_floor.vendor_ceilings, 0.8041 -> 0.8635; the H100 takes it):
    # 266.90326706814795 -> 261.3905727290267 ms, 155.1671922398196 -> 152.90626543433635 J (cluster
    # 159.8699929570144 -> 158.9264057966511 ms, 716.2542760917726 -> 699.8930543263428 J)
    # stop 56: the embedding's weight gradient under AMP is fp32, its zero fill an elementwise kernel
    # (tests/test_embedding_grad_dtype.py): 261.3905727290267 -> 261.77663825157856 ms, 152.90626543433635 ->
    # 153.12967155080642 J; then eager PyTorch's host cost, 40 us a launch in an in-order launch queue (was max(GPU,
    # 6 us) per kernel; simulate/single_device.py EAGER_HOST_LAUNCH_MS): the many small cast and norm kernels leave
    # launch gaps (the gradient's extra 0.39 ms of GPU time sits under them): 276.9797827303096 ms,
    # 154.72600172107317 J; memory and the Megatron cluster (its own per-kernel floor) unchanged
    # stop 58: one FP8 weight cast per module weight, as Transformer Engine launches them (7 a layer here, 4 under
    # Megatron; tests/test_fp8_weight_casts.py), the same bytes: 276.9797827303096 -> 277.1959952634472 ms,
    # 154.72600172107317 -> 154.80684970338788 J (cluster 158.9264057966511 -> 159.2321447307619 ms,
    # 699.8930543263428 -> 700.7259776912235 J); memory unchanged
    # stop 58: PyTorch SDPA's FlashAttention-2 runs off its native instruction on H100, 35% of peak (FA3 paper;
    # tests/test_fa2_off_native.py): 277.1959952634472 -> 282.44780869803174 ms, 154.80684970338788 ->
    # 156.5240856389212 J; the Megatron cluster (TE's cuDNN attention, the fa3 class) and memory unchanged
    assert p.step_time_ms == pytest.approx(282.44780869803174, rel=1e-9)
    assert p.memory_gb == pytest.approx(174.516699136, rel=1e-9)
    assert p.energy_j == pytest.approx(156.5240856389212, rel=1e-9)
    c = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=8, seq=2048, tp=8, sp=True, dtype="fp8",
                                 attention="flash", framework="megatron")
    # stop 59: Transformer Engine's userbuffers hold the SMs TE 2.20.2's initialize_ub defaults give each overlap
    # method (pipeline / bulk 16, ring exchange 1; was 2 for all: simulate/overlap.py UB_METHOD_SMS,
    # tests/test_overlap.py): the cluster 159.2321447307619 -> 159.304871592645 ms, 700.7259776912235 ->
    # 700.7888066390028 J; memory unchanged
    assert c.step_time_ms == pytest.approx(159.304871592645, rel=1e-9)
    assert c.memory_gb == pytest.approx(31.18612608, rel=1e-9)
    assert c.energy_j == pytest.approx(700.7888066390028, rel=1e-9)


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_per_tensor_recipes_write_no_transpose_on_datacentre_blackwell(recipe):
    """TE 2.20.2 (pytorch/utils.py is_non_tn_fp8_gemm_supported: compute capability 10.x; csrc/quantizer.cpp l. 361-375):
    on B200 a per-tensor cast writes the FP8 data alone and the cached weight copy is 1 B a parameter."""
    def graph(transpose):
        return step_graph("llama3_8b", StepOptions(batch=1, seq=1024, mode="train", dtype="fp8", attention="flash",
                                                   fp8_recipe=recipe, fp8_transpose=transpose), blocks=2)

    hop, bw = graph(True), graph(False)
    casts = lambda g: g.nodes[g.nodes["name"].str.endswith("fp8_cast")].set_index("name")  # noqa: E731
    ch, cb = casts(hop), casts(bw)
    assert len(ch) and (ch.index == cb.index).all()
    # 2 + 1 + 1 B an element (bf16 read, data, transpose) -> 2 + 1
    assert np.allclose(cb["bytes"].to_numpy() / ch["bytes"].to_numpy(), 3.0 / 4.0)
    wc = lambda g: g.nodes.loc[g.nodes["name"].str.startswith("fp8_weight_cast"), "bytes"].sum()  # noqa: E731
    assert wc(bw) / wc(hop) == pytest.approx(3.0 / 4.0)  # read 2 B, write 2 -> 1
    assert weight_copy_bytes_per_param(recipe, transpose=False) == 1.0
    # the device decides it: the same model on B200 holds 1 B a FP8 parameter less than on H100
    h = wattcast.predict("llama3_8b", "H100-SXM5-80GB", fp8_recipe=recipe, **KW)
    b = wattcast.predict("llama3_8b", "B200", fp8_recipe=recipe, **KW)
    n = h.nodes
    fp8_p = float(n.loc[(n["phase"] == "forward") & (n["dtype"] == "fp8"), "param_count"].sum())
    assert h.memory_gb - b.memory_gb == pytest.approx(fp8_p / 1e9, rel=1e-9)
    assert fp8_writes_transpose(resolve_device("H100-SXM5-80GB")) and not fp8_writes_transpose(resolve_device("B200"))


def _gpu(arch, name="x", vendor="nvidia"):
    from types import SimpleNamespace

    return SimpleNamespace(arch=arch, name=name, vendor=vendor)


@pytest.mark.parametrize("arch, name, cc", [
    ("Blackwell (GB100)", "B200", (10, 0)), ("Blackwell (GB110)", "B300", (10, 3)), ("Blackwell (GB202)", "x", (12, 0)),
    ("Blackwell (GB10)", "DGX Spark", (12, 1)), ("Blackwell", "My Blackwell", (10, 0)),
    ("Blackwell", "GeForce RTX 5090", (12, 0)), ("Hopper (GH100)", "H100", (9, 0)), ("Ada Lovelace (AD102)", "L40S", (8, 9)),
    ("Ampere (GA100)", "A100", (8, 0)), ("Ampere (GA102)", "A10", (8, 6)), ("Rubin", "R100", None)])
def test_compute_capability_rule(arch, name, cc):
    assert compute_capability(_gpu(arch, name)) == cc
    assert compute_capability(_gpu("CDNA3 (gfx942)", "MI300X", "amd")) is None


def test_recipe_support_follows_te_compute_capability():
    """TE 2.20.2 quantization.py: MXFP8 10.0 <= cc < 12.0; block scaling cc >= 9.0 (GB20x included)."""
    assert unsupported_fp8_recipe(_gpu("Blackwell (GB202)", "RTX 5090"), "blockwise") is None
    assert "mxfp8 needs" in unsupported_fp8_recipe(_gpu("Blackwell (GB202)", "RTX 5090"), "mxfp8")
    assert "mxfp8 needs" in unsupported_fp8_recipe(_gpu("Blackwell", "GeForce RTX 5080"), "mxfp8")
    assert unsupported_fp8_recipe(_gpu("Blackwell", "custom B200"), "mxfp8") is None
    assert unsupported_fp8_recipe(_gpu("Hopper (GH100)"), "blockwise") is None
    assert "blockwise needs" in unsupported_fp8_recipe(_gpu("Ada Lovelace (AD102)"), "blockwise")
    # consumer Blackwell keeps the transposes (12.x is outside is_non_tn_fp8_gemm_supported)
    assert fp8_writes_transpose(_gpu("Blackwell (GB202)")) and not fp8_writes_transpose(_gpu("Blackwell (GB110)"))
    # one data-centre Blackwell range (10.x) for both rules
    from wattcast.featurize.fp8_recipes import datacentre_blackwell
    assert datacentre_blackwell((10, 0)) and datacentre_blackwell((10, 3))
    assert not any(datacentre_blackwell(cc) for cc in (None, (9, 0), (12, 0), (12, 1), (13, 0)))


def test_block_scales_in_saved_copies_and_cached_weights():
    res = {r: wattcast.predict("llama3_8b", "B200", fp8_recipe=r, **KW) for r in ("delayed", "mxfp8", "blockwise")}
    n = res["delayed"].nodes
    lin = n[(n["phase"] == "forward") & (n["dtype"] == "fp8") & (n["op_class"] == "linear")]
    fp8_p = float(lin["param_count"].sum())
    for r, scales in (("mxfp8", mxfp8_scale_bytes), ("blockwise", blockwise_scale_bytes)):
        # each FP8 linear keeps its input's column-wise copy for the weight gradient, with its scales
        col = sum(scales(int(m), int(k), columnwise=True) for m, k in lin[["M", "N"]].itertuples(index=False))
        assert res[r].memory.activations_gb - res["delayed"].memory.activations_gb == pytest.approx(col / 1e9, rel=1e-6)
        # B200: delayed keeps the FP8 data alone (no transpose, 1 B), the block-scaled recipes both copies and scales
        assert res[r].memory.weights_gb - res["delayed"].memory.weights_gb == pytest.approx(
            (1.0 + weight_scale_bytes_per_param(r)) * fp8_p / 1e9, rel=1e-6)
    # the GEMMs are the same FP8 GEMMs (no measured per-recipe GEMM speed): their time is unchanged
    # (their GPU time: since stop 56 a kernel's time_ms also holds the launch gap before it, which the casts around it move)
    gemm = lambda p: p.nodes.loc[p.nodes["op_class"] == "linear", "gpu_ms"].sum()  # noqa: E731
    assert gemm(res["mxfp8"]) == gemm(res["delayed"]) == gemm(res["blockwise"])


def test_tensorwise_amax_pass_costs_time():
    d = wattcast.predict("llama3_8b", "H100-SXM5-80GB", **KW)
    t = wattcast.predict("llama3_8b", "H100-SXM5-80GB", fp8_recipe="tensorwise", **KW)
    cast = lambda p: p.nodes.loc[p.nodes["op_class"] == "fp8_cast", "gpu_ms"].sum()  # noqa: E731
    amax = t.nodes[t.nodes["name"].str.contains("amax")]
    # the step grows by the amax and scale kernels' GPU time and at most their launches' host time on top (eager
    # PyTorch's launch queue since stop 56, 40 us a launch: this step is partly host-bound, 30.6 ms for 10.3 ms of GPU
    # time and 928 launches)
    extra = len(t.nodes) - len(d.nodes)
    assert len(amax) and cast(t) - cast(d) <= t.step_time_ms - d.step_time_ms <= cast(t) - cast(d) + 0.040 * extra
    h0 = {k: wattcast.predict("llama3_8b", "H100-SXM5-80GB", host_us=0, **r, **KW) for k, r in
          (("d", {}), ("t", dict(fp8_recipe="tensorwise")))}
    assert np.isclose(h0["t"].step_time_ms - h0["d"].step_time_ms, cast(t) - cast(d), rtol=0.05)  # the GPU's step
    assert cast(t) > cast(d) * 1.3 and t.memory_gb == pytest.approx(d.memory_gb, rel=1e-9)
    assert t.to_dict()["settings"]["fp8_recipe"] == "tensorwise"


@pytest.mark.parametrize("device, recipe", [("H100-SXM5-80GB", "mxfp8"), ("MI300X", "mxfp8"), ("L40S", "mxfp8"),
                                            ("L40S", "blockwise"), ("MI300X", "blockwise")])
def test_recipe_refused_where_te_does_not_run_it(device, recipe):
    with pytest.raises(ValueError, match=rf"--fp8-recipe {recipe} needs .*{device}"):
        wattcast.predict("gpt2", device, dtype="fp8", fp8_recipe=recipe)


def test_recipe_errors_cluster_cli_and_search():
    with pytest.raises(ParallelConfigError, match="mxfp8 needs MXFP8.*H100"):
        wattcast.predict_cluster("gpt2", "DGX-H100", gpus=8, batch=8, tp=8, dtype="fp8", fp8_recipe="mxfp8")
    with pytest.raises(ValueError, match="needs --dtype fp8"):
        wattcast.predict("gpt2", "H100-SXM5-80GB", dtype="bf16", fp8_recipe="tensorwise")
    with pytest.raises(ValueError, match="unknown --fp8-recipe 'nvfp4'"):
        wattcast.predict("gpt2", "H100-SXM5-80GB", dtype="fp8", fp8_recipe="nvfp4")
    r = run_cli("predict", "--model", "gpt2", "--device", "H100-SXM5-80GB", "--dtype", "fp8", "--fp8-recipe", "mxfp8")
    assert r.returncode == 2 and "mxfp8 needs MXFP8" in flat(r.stderr) and "Traceback" not in r.stderr
    r = run_cli("predict", "--model", "gpt2", "--cluster", "DGX-B200", "--gpus", "4", "--tp", "4", "--dtype", "fp8",
                "--framework", "megatron", "--fp8-recipe", "mxfp8", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["settings"]["fp8_recipe"] == "mxfp8"
    s = run_cli("search", "--model", "gpt2", "--cluster", "DGX-H100", "--cluster", "DGX-B200", "--gpus", "8", "--batch",
                "8", "--dtype", "fp8", "--fp8-recipe", "mxfp8", "--max-configs", "5", "--json")
    assert s.returncode == 0, s.stderr
    out = json.loads(s.stdout)
    assert {r["cluster"] for r in out["ranked"]} == {"DGX-B200"}
    assert "mxfp8 needs MXFP8" in out["unranked_clusters"]["DGX-H100"]
