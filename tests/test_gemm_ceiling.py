"""The GEMM family's ceiling member (models/gemm_floor.py, training/gemm_floor.py): formula, ceilings, bundle entry,
vendor choice at prediction time, fit."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from wattcast.data.catalog import resolve_device
from wattcast.featurize.kernel_features import featurize_kernels
from wattcast.models.gemm_floor import (POOLED_MEMBER, ceiling_log_ratio, check_ceiling_member, ceiling_model,
                                       row_ceilings)
from wattcast.models.kernel_bundle import BundleError, KernelBundle, load_bundle
from wattcast.models.kernel_predictor import predict_kernels
from wattcast.data.device_spec import has_matrix_units
from wattcast.training.gemm_floor import (CEILING_QUANTILE, ceiling_table, fit_ceiling_member,
                                          mamf_ceilings, vendor_ceilings)

ENTRY = {"ceilings": {"A": {"bf16": 0.8, "fp8": 0.7}}, "vendor_ceilings": {"nvidia": 0.85, "amd": 0.6},
         "default_ceiling": 0.74, "floor_ms": 0.004, "lgbm": {"nvidia": "n.txt"}}


def test_ceiling_log_ratio_is_the_floor_plus_the_learned_multiple_of_the_ceiling_time():
    t_roof = np.array([0.1, 1.0])
    out = ceiling_log_ratio(np.log([1.2, 1.0]), t_roof, 0.004, np.array([0.8, 0.5]))
    assert np.exp(out) * t_roof == pytest.approx([0.004 + 1.2 * 0.1 / 0.8, 0.004 + 1.0 / 0.5])


def test_row_ceilings_take_the_device_then_its_vendor_then_the_default():
    assert list(row_ceilings("A", "nvidia", np.array(["bf16", "fp8", "tf32", "fp16"]), ENTRY)) == [0.8, 0.7, 0.85, 0.8]
    assert list(row_ceilings("new", "amd", np.array(["bf16"]), ENTRY)) == [0.6]
    assert list(row_ceilings("new", "intel", np.array(["bf16"]), ENTRY)) == [0.74]


def test_an_unlisted_spec_takes_its_dies_then_its_generations_listed_ceilings_before_its_vendors():
    """Catalog names in the table: a spec of B200's die ("Blackwell (GB100)": B200, GB200) takes their median per
    dtype (a device without the dtype counts with its median over its dtypes), one of another Blackwell die the
    generation's (B200, GB200, B300), a Hopper the vendor's; a device without matrix units (P100) never counts."""
    entry = {"ceilings": {"B200": {"bf16": 0.78, "tf32": 0.74}, "GB200": {"bf16": 0.72, "fp8": 0.70},
                          "B300": {"bf16": 0.80}, "Tesla-P100-PCIe-16GB": {"fp16": 0.47},
                          "V100-SXM2-16GB": {"fp16": 0.92}},
             "vendor_ceilings": {"nvidia": 0.86}, "default_ceiling": 0.74}
    dts = np.array(["bf16", "fp16", "tf32", "fp8"])
    np.testing.assert_allclose(row_ceilings("new", "nvidia", dts, entry, arch="Blackwell (GB100)"),
                               [0.75, 0.75, (0.74 + 0.71) / 2, (0.76 + 0.70) / 2])
    np.testing.assert_allclose(row_ceilings("new", "nvidia", dts, entry, arch="Blackwell (GB999)"),
                               [0.78, 0.78, 0.74, 0.76])
    assert list(row_ceilings("new", "nvidia", dts[:1], entry, arch="Hopper (GH100)")) == [0.86]
    assert list(row_ceilings("new", "nvidia", dts[:1], entry, arch="Pascal (GP100)")) == [0.86]  # P100: no matrix units
    assert list(row_ceilings("new", "amd", dts[:1], entry, arch="Blackwell (GB100)")) == [0.74]  # another vendor's die: no
    assert list(row_ceilings("B300", "nvidia", dts[:1], entry, arch="Blackwell (GB100)")) == [0.80]  # its own first


def test_a_b200_with_only_its_tdp_changed_keeps_its_dies_gemm_ceiling():
    """Audit 55e: a B200 spec with tdp_w 1000 -> 2000 W is no longer B200 by its figures; it took NVIDIA's median
    (0.8635 for B200's measured 0.776) and its bf16 8192^3 GEMM came out 11% faster, every-peak-doubled copies 2.2-2.3x.
    Now it takes its die's listed devices' (B200, GB200) and stays within a few % of the B200; doubling every tensor
    peak gains at most the 2x the peaks allow."""
    b200 = resolve_device("B200")
    tdp2 = dataclasses.replace(b200, name="B200tdp2", aliases=(), tdp_w=2 * b200.tdp_w)
    pk = {f: 2 * getattr(b200, f) for f in ("peak_tf32_tflops", "peak_fp16_tflops", "peak_bf16_tflops",
                                             "peak_fp8_tflops")}
    from wattcast.data.checks import allow_exotic
    with allow_exotic():
        pk2 = dataclasses.replace(b200, name="B200pk2", aliases=(), **pk)
    rows = pd.DataFrame([dict(OPName="bmm", dtype=t, B=1, M=8192, N=8192, K=8192) for t in ("bf16", "tf32", "fp8")])
    base = predict_kernels(rows, b200)["pred_latency_ms"].to_numpy()
    cm = load_bundle().families["gemm"].ceiling_member
    from wattcast.models.kernel_predictor import _ceiling_name, _device_ceilings
    die = np.median([cm["ceilings"]["B200"]["bf16"], cm["ceilings"]["GB200"]["bf16"]])
    assert row_ceilings(_ceiling_name(tdp2, cm), "nvidia", np.array(["bf16"]), cm, arch=tdp2.arch)[0] == pytest.approx(die)
    # since stop 58 (audit 57g) held at least at the B200's own: the same silicon at a lower power limit
    # (data.catalog_match.power_siblings); the die's median is 3% lower and made every large GEMM 3% slower than at 1 kW
    assert _device_ceilings(tdp2, cm, np.array(["bf16"]))[0] == cm["ceilings"]["B200"]["bf16"] > die
    ratio = base / predict_kernels(rows, tdp2)["pred_latency_ms"].to_numpy()
    assert np.all(np.abs(ratio - 1.0) < 0.05) and np.all(ratio >= 1.0 - 1e-9), ratio
    with allow_exotic():  # every tensor peak doubled reads as the sparse column: --force
        speedup = base / predict_kernels(rows, pk2)["pred_latency_ms"].to_numpy()
    assert np.all(speedup <= 2.0), speedup


@pytest.mark.parametrize("change, match", [
    ({"ceilings": {"A": {"bf16": 1.5}}}, "ceilings"),
    ({"ceilings": {"A": 0.8}}, "ceilings"),
    ({"vendor_ceilings": {"nvidia": 0.0}}, "vendor_ceilings"),
    ({"default_ceiling": "x"}, "default_ceiling"),
    ({"floor_ms": -1.0}, "floor_ms"),
    ({"lgbm": {}}, "lgbm"),
])
def test_a_bad_ceiling_member_entry_is_named(change, match):
    with pytest.raises(ValueError, match=match):
        check_ceiling_member({**ENTRY, **change}, "manifest")
    assert check_ceiling_member(ENTRY, "manifest")["vendor_ceilings"] == {"nvidia": 0.85, "amd": 0.6}


def test_a_vendor_without_its_own_ceiling_model_takes_the_pooled_one():
    own, pooled = object(), object()
    assert ceiling_model({"nvidia": own, POOLED_MEMBER: pooled}, "nvidia") is own
    assert ceiling_model({"nvidia": own, POOLED_MEMBER: pooled}, "amd") is pooled
    assert ceiling_model({"nvidia": own}, "amd") is None and ceiling_model(None, "amd") is None


def test_ceiling_table_takes_mamf_where_listed_else_the_devices_own_quantile():
    rng = np.random.default_rng(0)
    n = 200
    rows = pd.DataFrame({"device": ["X"] * n + ["Y"] * n + ["Y"] * 5, "dtype": ["bf16"] * (2 * n) + ["fp32"] * 5,
                         "latency_ms": 1.0})
    eff = np.r_[rng.uniform(0.2, 0.9, n), rng.uniform(0.1, 0.6, n), np.full(5, 0.99)]
    mamf = np.r_[np.full(n, 0.77), np.full(n + 5, np.nan)]
    table = ceiling_table(rows, eff, mamf)  # t_roof / latency = eff with latency 1 ms
    assert table["X"] == {"bf16": 0.77}
    assert table["Y"] == {"bf16": pytest.approx(np.quantile(eff[n:2 * n], CEILING_QUANTILE), abs=1e-4)}  # no fp32
    specs = {"X": resolve_device("A40"), "Y": resolve_device("Tesla-T4")}
    assert vendor_ceilings(table, specs) == {"nvidia": pytest.approx((0.77 + table["Y"]["bf16"]) / 2, abs=1e-4)}


def test_vendor_ceiling_counts_each_matrix_unit_device_once():
    """The Ampere fold's NVIDIA training devices (leave_one_generation_out.py): B200 in three dtypes, the P100 (no
    tensor cores: its fp16 peak is the half2 vector rate, 2x FP32), T4 and V100. Until stop 55 every (device, dtype)
    entry counted, the P100 too: median 0.769 where the three tensor-core devices' is T4's 0.8635."""
    table = {"B200": {"bf16": 0.7756, "fp8": 0.7628, "tf32": 0.7472}, "Tesla-P100-PCIe-16GB": {"fp16": 0.4721},
             "Tesla-T4": {"fp16": 0.8635}, "V100-SXM2-16GB": {"fp16": 0.9193}, "MI210": {"fp16": 0.6705}}
    specs = {d: resolve_device(d) for d in table}
    assert vendor_ceilings(table, specs) == {"amd": 0.6705, "nvidia": 0.8635}
    # a vendor whose only device has vector-rate 16-bit math gets no median (the default applies)
    assert vendor_ceilings({"Tesla-P100-PCIe-16GB": {"fp16": 0.4721}}, specs) == {}


@pytest.mark.parametrize("device, matrix", [("Tesla-P100-PCIe-16GB", False), ("Tesla-P4", False), ("L4", True),
                                            ("L40S", True), ("A10", True), ("A40", True), ("Tesla-T4", True),
                                            ("MI210", True), ("B200", True)])
def test_matrix_units_by_the_16_bit_over_fp32_peak(device, matrix):
    assert has_matrix_units(resolve_device(device)) is matrix


def test_the_shipped_gemm_family_carries_a_ceiling_member_per_vendor():
    fm = load_bundle().families["gemm"]
    assert set(fm.ceiling_lgbm) == {"nvidia", "amd", POOLED_MEMBER}
    cm = fm.ceiling_member
    # B200 and the A100 take MAMF's best achievable matmul (1,745 of 2,250 and 271 of 312 TFLOP/s); the A40, which
    # MAMF does not list, its own measured 99th percentile
    assert cm["ceilings"]["B200"]["bf16"] == pytest.approx(1745.0 / 2250.0, abs=0.01)
    assert cm["ceilings"]["A100-SXM4-80GB"]["fp16"] == pytest.approx(271.2 / 312.0, abs=0.01)
    assert 0.7 < cm["ceilings"]["A40"]["fp16"] < 0.95
    assert 0.7 < cm["vendor_ceilings"]["nvidia"] < 0.95
    # the held-out GPUs are nowhere in it
    assert not {"L4", "A100-PCIe-80GB"} & set(cm["ceilings"])
    assert 0.001 < cm["floor_ms"] < 0.02


def test_the_ceiling_member_predicts_large_tensor_core_gemms_of_a_vendor_it_has():
    b = load_bundle()
    fm = b.families["gemm"]
    # (a bmm: a tensor-core linear is costed as this GEMM plus its bias epilogue, tests/test_m_guard_padding.py)
    rows = pd.DataFrame([dict(op="bmm", dtype="bf16", B=1, M=8192, N=8192, K=8192),
                         dict(op="bmm", dtype="fp32", B=1, M=8192, N=8192, K=8192)])
    for dev in ("H100-SXM5-80GB", "MI300X"):
        out = predict_kernels(rows, dev, b)
        assert list(out["model"]) == ["ceiling", fm.choice]
        spec = resolve_device(dev)
        X = featurize_kernels(rows, spec)
        p = fm.ceiling_lgbm[spec.vendor].predict(X.iloc[:1])
        c = row_ceilings(spec.name, spec.vendor, np.array(["bf16"]), fm.ceiling_member)
        want = np.exp(ceiling_log_ratio(p, X["t_roof_ms"].to_numpy()[:1], fm.ceiling_member["floor_ms"], c)) * X["t_roof_ms"].to_numpy()[:1]
        assert out["pred_latency_ms"].iloc[0] == pytest.approx(float(want[0]), rel=1e-9)
        # a large bf16 GEMM on a datacenter GPU runs at 40-95% of its dense peak
        tflops = 2 * 8192**3 / (out["pred_latency_ms"].iloc[0] * 1e9)
        assert 0.4 < tflops / spec.peak_matrix_tflops("bf16") < 0.95
    # a vendor without a ceiling model of its own takes the pooled one, at the default ceiling (no vendor median)
    intel = dataclasses.replace(resolve_device("H100-SXM5-80GB"), vendor="intel", name="H100-as-intel")
    out = predict_kernels(rows, intel, b)
    assert list(out["model"]) == ["ceiling", fm.choice]
    X = featurize_kernels(rows, intel)
    p = fm.ceiling_lgbm[POOLED_MEMBER].predict(X.iloc[:1])
    t_roof = X["t_roof_ms"].to_numpy()[:1]
    want = np.exp(ceiling_log_ratio(p, t_roof, fm.ceiling_member["floor_ms"], fm.ceiling_member["default_ceiling"])) * t_roof
    assert out["pred_latency_ms"].iloc[0] == pytest.approx(float(want[0]), rel=1e-9)
    # without a pooled member (bundles of stop 31) such a vendor keeps the roofline member
    own = {v: m for v, m in fm.ceiling_lgbm.items() if v != POOLED_MEMBER}
    older = KernelBundle({**b.families, "gemm": dataclasses.replace(fm, ceiling_lgbm=own)}, b.meta)
    assert list(predict_kernels(rows, intel, older)["model"]) == [fm.choice, fm.choice]


def test_the_ceiling_member_round_trips_and_its_files_are_checked(shipped_copy, tmp_path):
    b = KernelBundle.load(shipped_copy)
    out = tmp_path / "saved"
    b.save(out)
    again = KernelBundle.load(out)
    assert again.families["gemm"].ceiling_member == b.families["gemm"].ceiling_member
    man = json.loads((out / "kernel_manifest.json").read_text())
    files = man["families"]["gemm"]["ceiling_member"]["lgbm"]
    assert set(files.values()) <= set(man["files"])
    p = out / files["amd"]
    p.write_text(p.read_text()[:-200])  # truncated
    with pytest.raises(BundleError, match=files["amd"]):
        KernelBundle.load(out)


def test_a_manifest_whose_ceiling_member_is_malformed_is_a_bundle_error(shipped_copy):
    path = shipped_copy / "kernel_manifest.json"
    man = json.loads(path.read_text())
    man["families"]["gemm"]["ceiling_member"]["ceilings"]["B200"]["bf16"] = 7.0
    path.write_text(json.dumps(man))
    with pytest.raises(BundleError, match="ceiling_member.ceilings"):
        KernelBundle.load(shipped_copy)


def test_the_ceiling_member_is_fitted_per_vendor_on_the_data(data_root):
    """Fitted on a sample of the real GEMM rows: one model per vendor with enough tensor-core rows, the MAMF table's
    ceilings where it lists the device."""
    from wattcast.data.kernel_datasets import load_kernels, split_heldout
    from wattcast.training.gemm_floor import mamf_ratio_any
    from wattcast.training.kernels import family_features

    df, _ = split_heldout(load_kernels(data_root))
    df = df[df["op"].isin(["bmm", "linear"])].sample(frac=1.0, random_state=0).groupby("device").head(1500)
    df = df.reset_index(drop=True)
    specs = {d: resolve_device(d) for d in df["device"].unique() if d != "A100-80GB-unknown"}
    specs["A100-80GB-unknown"] = resolve_device("A100-SXM4-80GB")
    X = featurize_kernels(df, specs)
    models, entry = fit_ceiling_member(df, X, specs, family_features("gemm"), {"xla": 0.004, "vidur": 0.004},
                                       mamf_ratio_any(data_root, df, specs), rounds=20, min_tensor_rows=500)
    assert set(models) == {"nvidia", "amd", POOLED_MEMBER}
    # the members read the features they were given, and the entry says which
    assert entry["features"] == family_features("gemm")
    assert all(m.features == entry["features"] for m in models.values())
    assert entry["ceilings"]["MI355X"]["bf16"] == pytest.approx(1565.0 / specs["MI355X"].peak_matrix_tflops("bf16"), abs=1e-3)
    assert "fp32" not in entry["ceilings"]["Tesla-T4"]
    with pytest.raises(ValueError, match="no vendor"):
        fit_ceiling_member(df, X, specs, family_features("gemm"), {"xla": 0.004}, mamf_ratio_any(data_root, df, specs),
                           rounds=5, min_tensor_rows=10**9)
    listed = mamf_ceilings(data_root, {d: resolve_device(d) for d in ("B200", "B300", "L40S")})
    assert set(listed) == {"B200", "B300"} and listed["B300"]["fp8"] == pytest.approx(3353.3 / resolve_device("B300").peak_matrix_tflops("fp8"), abs=1e-3)


def test_training_without_enough_tensor_core_rows_keeps_the_roofline_member(data_root, capsys):
    """A GEMM table with XLA rows but too few tensor-core rows of any vendor trains no ceiling member, and says so."""
    from wattcast.data.kernel_datasets import load_kernels, split_heldout
    from wattcast.training.kernels import TrainConfig, _fit_ceiling, family_features

    df, _ = split_heldout(load_kernels(data_root))
    df = df[df["op"].isin(["bmm", "linear"]) & df["device"].isin(["B200", "MI355X"])].groupby("device").head(50)
    df = df.reset_index(drop=True)
    specs = {d: resolve_device(d) for d in df["device"].unique()}
    X = featurize_kernels(df, specs)
    got = _fit_ceiling(df, X, np.ones(len(df), dtype=bool), specs, family_features("gemm"), {"xla": 0.004},
                       TrainConfig.quick(), data_root)
    assert got == (None, None)
    assert "ceiling member not fitted" in capsys.readouterr().out


@pytest.mark.parametrize("device", ["B200", "MI300X", "A100-SXM4-80GB"])
def test_members_log_ratio_composes_the_members_as_the_predictor_does(device):
    """The calibration and the leave-one-generation-out benchmark compose refitted members with
    ``members_log_ratio``: given the shipped members it must give what ``predict_kernels`` predicts (small GEMMs
    blended with the floor member, large ones from the vendor's ceiling member, FP32 from the roofline member)."""
    from wattcast.training.gemm_floor import members_log_ratio

    spec = resolve_device(device)
    fm = load_bundle().families["gemm"]
    sizes = [(1, 256, 256, 256), (1, 1024, 1024, 512), (4, 2048, 2048, 1024), (1, 8192, 8192, 8192)]
    # (bmm rows: a tensor-core linear is costed as the bmm of its GEMM plus its bias epilogue, which the members do
    # not compose; tests/test_m_guard_padding.py)
    k = pd.DataFrame([{"op": "bmm", "dtype": dt, "B": b, "M": m, "N": n, "K": kk}
                      for dt in ("bf16", "fp32") for b, m, n, kk in sizes])
    X = featurize_kernels(k.assign(device=device), {device: spec})
    p_roof, _ = fm.predict_log_ratio_matrix(X[fm.features].to_numpy(dtype=float))
    cm = fm.ceiling_member
    # the device's ceilings handed over as a held-out device's (MAMF's, per row) instead of the entry's
    mamf = np.where(k["dtype"] == "fp32", np.nan, row_ceilings(device, spec.vendor, k["dtype"].to_numpy(), cm))
    lr = members_log_ratio(p_roof, X, k.assign(device=device), {device: spec}, fm.floor_lgbm, fm.floor_blend,
                           fm.ceiling_lgbm, {**cm, "ceilings": {d: c for d, c in cm["ceilings"].items() if d != device}},
                           mamf)
    got = np.exp(lr) * X["t_roof_ms"].to_numpy()
    want = predict_kernels(k, spec)["pred_latency_ms"].to_numpy()
    big = X["flops"].to_numpy() > 5e8  # the smallest ones sit on the family's latency floor in the predictor
    np.testing.assert_allclose(got[big], want[big], rtol=1e-6)
    assert (k["dtype"][big] == "bf16").any() and (k["dtype"][big] == "fp32").any()


def test_a_ceiling_member_reading_a_feature_the_family_lacks_is_a_bundle_error(shipped_copy):
    path = shipped_copy / "kernel_manifest.json"
    man = json.loads(path.read_text())
    man["families"]["gemm"]["ceiling_member"]["features"] = ["log_flops", "not_a_feature"]
    path.write_text(json.dumps(man))
    with pytest.raises(BundleError, match="not_a_feature"):
        KernelBundle.load(shipped_copy)
    man["families"]["gemm"]["ceiling_member"]["features"] = "log_flops"
    path.write_text(json.dumps(man))
    with pytest.raises(BundleError, match="ceiling_member.features"):
        KernelBundle.load(shipped_copy)


def test_a_ceiling_member_with_features_of_its_own_reads_its_own_columns():
    """A member fitted on fewer features than the family (the manifest entry's ``features``: the benchmark's
    ``.../no-op-name`` variant) is fed its own columns in its own order by the predictor, and the bundle round-trips it."""
    from wattcast.models.kernel_surrogates import LGBMSurrogate

    b = load_bundle()
    fm = b.families["gemm"]
    feats = [f for f in fm.features if f not in ("is_linear", "log_B")][::-1]  # fewer, and in another order
    # (bmm rows of M >= 4096, which no guard moves: a tensor-core linear is costed as the bmm of its GEMM plus its
    # bias epilogue, tests/test_m_guard_padding.py)
    rows = pd.DataFrame([dict(op="bmm", dtype="bf16", B=1, M=m, N=n, K=k)
                         for m, n, k in ((4096, 4096, 4096), (8192, 2048, 1024), (6144, 8192, 8192))])
    spec = resolve_device("H100-SXM5-80GB")
    X = featurize_kernels(rows, spec)
    rng = np.random.default_rng(0)
    num = X[fm.features].astype(float)
    train = num.sample(n=200, replace=True, random_state=0) + rng.normal(0, 0.01, (200, num.shape[1]))
    member = LGBMSurrogate(feats, num_boost_round=5).fit(train, rng.normal(0, 0.3, 200))
    own = dataclasses.replace(fm, ceiling_lgbm={"nvidia": member}, ceiling_member={**fm.ceiling_member, "features": feats})
    mine = KernelBundle({**b.families, "gemm": own}, b.meta)
    got = predict_kernels(rows, spec, mine)
    assert list(got["model"]) == ["ceiling"] * 3
    t_roof = X["t_roof_ms"].to_numpy()
    c = row_ceilings(spec.name, spec.vendor, np.array(["bf16"] * 3), fm.ceiling_member)
    want = np.exp(ceiling_log_ratio(member.predict(X), t_roof, fm.ceiling_member["floor_ms"], c)) * t_roof
    np.testing.assert_allclose(got["pred_latency_ms"].to_numpy(), want, rtol=1e-9)


def test_a_long_contraction_scales_linearly_on_cdna_with_the_shipped_bundle():
    """CDNA's FP32 GEMMs lose 40-60% beyond a 16k contraction, its FP16 ones do not (LLMCompass MI210 flat to 32k);
    the ceiling member no longer carries the FP32 collapse to MI300X BF16 (it made a 64k-token weight gradient 4x slow
    and a bf16 bmm slower than its fp32 twin)."""
    rows = [("linear", "bf16", 1, 4096, n, 14336) for n in (16384, 32768, 65536)]
    rows += [("bmm", "bf16", 8, 64, 65536, 8192), ("bmm", "fp32", 8, 64, 65536, 8192)]
    frame = pd.DataFrame(rows, columns=["OPName", "dtype", "B", "M", "N", "K"])
    for device in ("MI300X", "MI355X"):
        t = predict_kernels(frame, device)["pred_latency_ms"].to_numpy()
        assert t[1] / t[0] == pytest.approx(2.0, rel=0.2) and t[2] / t[1] == pytest.approx(2.0, rel=0.2), (device, t)
        assert t[3] < t[4], device


def test_the_ceiling_member_leaves_out_cdna_long_contraction_fp32_rows(monkeypatch):
    """The rows a vendor in CEILING_FP32_LEFT_OUT gives its member: no FP32 row beyond the contraction threshold,
    every tensor-core row; another vendor's FP32 rows all stay."""
    import wattcast.training.gemm_floor as gf

    seen = {}

    class Recorder:
        def __init__(self, features, **kw):
            self.features = features

        def fit(self, X, y):
            seen.setdefault(len(seen), X.copy())
            return self

    monkeypatch.setattr(gf, "LGBMSurrogate", Recorder)
    k = gf.CEILING_FP32_LEFT_OUT_FROM_K
    shapes = [(1, 1024, n, 1024) for n in (1024, k, 2 * k)]
    df = pd.DataFrame([("linear", dt, *s, dev, 1.0, "xla" if dt != "fp32" else "neusight/kernels")
                       for dev in ("MI210", "A100-PCIe-40GB") for dt in ("fp32", "fp16") for s in shapes],
                      columns=["op", "dtype", "B", "M", "N", "K", "device", "latency_ms", "source"])
    specs = {d: resolve_device(d) for d in df["device"].unique()}
    X = featurize_kernels(df, specs).assign(device=df["device"].to_numpy(), dtype=df["dtype"].to_numpy(),
                                            N=df["N"].to_numpy())
    gf.fit_ceiling_member(df, X, specs, ["log_N"], {"xla": 0.004, "neusight/kernels": 0.004}, np.full(len(df), np.nan),
                          rounds=1, min_tensor_rows=1)
    amd, nvidia, pooled = seen[0], seen[1], seen[2]
    long_fp32 = lambda f: ((f["dtype"] == "fp32") & (f["N"] > k)).sum()  # noqa: E731
    assert long_fp32(amd) == 0 and (amd["dtype"] == "fp16").sum() == 3 and (amd["dtype"] == "fp32").sum() == 2
    assert long_fp32(nvidia) == 1 and len(nvidia) == 6
    assert long_fp32(pooled[pooled["device"] == "MI210"]) == 0 and len(pooled) == 11
