"""Issue 14 / audit 57g: predicted kernel times move the physical way with the spec-sheet figures.

A better figure (more bandwidth, a higher power limit, a larger L2) never makes a kernel slower; twice the bandwidth
never makes a DRAM-streaming kernel more than twice as fast. The opt-in recipe (``wattcast train kernels
--spec-monotone``, training/kernels.py TrainConfig.spec_monotone) fits the LightGBM members monotone in those figures
(models/kernel_surrogates.py SPEC_MONOTONE / MEMORY_BOUND_MONOTONE) and the vector families without the TDP
(training/kernels.py VECTOR_MONOTONE_DROPPED); the default recipe, which the shipped bundle is refitted with, is the one
before (its retraining with the constraints was refused by the gate). Shipped: a spec of a listed chip's silicon at
another power limit has its matmul ceiling held between what that silicon measured at lower and higher limits
(data/catalog_match.py power_siblings)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from wattcast.data.catalog import resolve_device
from wattcast.featurize.kernel_features import VEC_FEATURES
from wattcast.models.kernel_bundle import load_bundle
from wattcast.models.kernel_predictor import _device_ceilings, predict_kernels
from wattcast.models.kernel_surrogates import MEMORY_BOUND_MONOTONE, SPEC_MONOTONE, LGBMSurrogate
from wattcast.training.generation_calibration import fitted_monotone
from wattcast.training.kernels import TrainConfig, family_features

#: tensor-core GEMMs of >= 0.5 GFLOP (the LightGBM floor and ceiling members predict them, models/gemm_floor.py)
GEMMS = [(1, 1024, 4096, 4096, "bmm"), (1, 4096, 4096, 4096, "bmm"), (1, 8192, 8192, 8192, "bmm"),
         (1, 8192, 4096, 14336, "linear"), (32, 2048, 128, 2048, "bmm"), (1, 512, 2048, 2048, "bmm"),
         (1, 256, 4096, 4096, "linear")]
#: DRAM-streaming kernels (the vector families)
VECTOR = [("softmax", 65536, 4096), ("ln", 8192, 4096), ("rmsnorm", 8192, 4096), ("add", 8192, 4096),
          ("gelu", 16384, 14336), ("mul", 1024, 1024), ("softmax", 4096, 1024), ("add", 1024, 65536)]
#: slack on "never slower" for the GEMM grid: the ceiling and floor members are monotone by construction (LightGBM's
#: constraints), so what remains is float rounding and the guards' probe grids; 0.5% is far below what the audit
#: found (B200 fp8 1024x4096x4096 +15.6% at 1.5x bandwidth, +18.7% at 2x; 2x L2 +4-7%)
SLOWER_TOL = 0.01


def _gemm_rows(dtypes) -> pd.DataFrame:
    return pd.DataFrame([dict(op=op, B=b, M=m, N=n, K=k, dtype=t) for b, m, n, k, op in GEMMS for t in dtypes])


def _vector_rows() -> pd.DataFrame:
    return pd.DataFrame([dict(op=op, B=b, H=h, dtype=t) for op, b, h in VECTOR for t in ("bf16", "fp32")])


def _copy(spec, **figures):
    return dataclasses.replace(spec, name=f"{spec.name}-copy", aliases=(), **figures)


def _ratio(rows: pd.DataFrame, spec, copy) -> np.ndarray:
    """Predicted time on ``copy`` over on ``spec``, per row."""
    base = predict_kernels(rows, spec)["pred_latency_ms"].to_numpy()
    return predict_kernels(rows, copy)["pred_latency_ms"].to_numpy() / base


def test_every_constrained_feature_is_a_kernel_feature_and_the_opt_in_fits_carry_the_constraints():
    """Each listed feature exists (a renamed feature would drop its constraint silently) and every family's LightGBM
    is fitted with them when the recipe asks; the vector families take the DRAM-bound directions."""
    feats = set(family_features("gemm", spec_monotone=True)) | set(VEC_FEATURES)
    assert set(SPEC_MONOTONE) <= feats and set(MEMORY_BOUND_MONOTONE) <= feats
    gemm = LGBMSurrogate(family_features("gemm", spec_monotone=True), spec_monotone=True).params
    assert gemm["monotone_constraints_method"] == "advanced"
    mono = dict(zip(family_features("gemm", spec_monotone=True), gemm["monotone_constraints"]))
    assert mono["log_t_mem_ms"] == 1 and mono["dev_log_bw_gbps"] == -1 and mono["dev_log_w_per_tflop"] == -1
    assert mono["wave_eff_128x128"] == -1 and mono["dev_log_ridge"] == 0 and mono["log_t_roof_ms"] == 0
    for fam in ("ln", "softmax", "elementwise"):
        f = family_features(fam, spec_monotone=True)
        m = dict(zip(f, LGBMSurrogate(f, spec_monotone=True).params["monotone_constraints"]))
        assert m["log_t_mem_ms"] == -1 and m["log_ws_over_l2"] == 1 and m["log_numel_per_sm"] == 1, fam
    # a feature set with nothing to constrain gets no constraint parameters at all
    assert "monotone_constraints" not in LGBMSurrogate(["log_bytes"], spec_monotone=True).params


def test_the_default_recipe_is_the_one_before_the_constraints():
    """The shipped bundle is refitted with the default recipe: no LightGBM fit is constrained (its parameters exactly
    those before stop 58) and the vector families read the watts per TFLOP, as the shipped bundle's do."""
    for fam in ("gemm", "conv", "ln", "softmax", "elementwise"):
        p = LGBMSurrogate(family_features(fam)).params
        assert not any(k.startswith("monotone") for k in p), fam
        assert p == LGBMSurrogate(family_features(fam), spec_monotone=False).params
    for fam in ("ln", "softmax", "elementwise"):
        assert family_features(fam)[-1] == "dev_log_w_per_tflop", fam
        assert family_features(fam, spec_monotone=True) == family_features(fam)[:-1], fam
    assert family_features("gemm", spec_monotone=True) == family_features("gemm")
    assert TrainConfig().spec_monotone is False and TrainConfig.quick().spec_monotone is False
    shipped = load_bundle()
    for fam in ("ln", "softmax", "elementwise"):
        assert shipped.families[fam].features == family_features(fam), fam


def test_a_fit_on_data_falling_with_the_dram_time_comes_out_flat_not_falling():
    """Training rows whose log ratio falls as log_t_mem_ms rises (what the unconstrained trees learned for B200's
    mid-size fp8 GEMMs) fit to a ratio that never falls with it."""
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"log_t_mem_ms": rng.uniform(-4, 0, 2000), "log_bytes": rng.uniform(10, 20, 2000)})
    y = -0.5 * X["log_t_mem_ms"].to_numpy() + 0.1 * X["log_bytes"].to_numpy() + rng.normal(0, 0.01, 2000)
    grid = pd.DataFrame({"log_t_mem_ms": np.linspace(-4, 0, 41), "log_bytes": np.full(41, 15.0)})
    free = LGBMSurrogate(["log_t_mem_ms", "log_bytes"], num_boost_round=50).fit(X, y)
    assert np.diff(free.predict(grid)).min() < -0.01  # the default recipe follows the data down
    lg = LGBMSurrogate(["log_t_mem_ms", "log_bytes"], num_boost_round=50, spec_monotone=True).fit(X, y)
    assert np.all(np.diff(lg.predict(grid)) >= -1e-12)


def test_the_generation_calibration_refits_a_family_as_its_manifest_says_it_was_fitted():
    """The band is that of the trees a family predicts with: refitted monotone where the bundle's ``spec_monotone``
    record lists directions for it (a --spec-monotone run), free where it is empty or absent (before stop 58)."""
    b = load_bundle()
    assert not any(fitted_monotone(b, f) for f in b.families)  # the shipped bundle: fitted without
    meta = {"spec_monotone": {"gemm": {"log_t_mem_ms": 1}, "ln": {}}}
    fake = dataclasses.replace(b, meta=meta)
    assert fitted_monotone(fake, "gemm") and not fitted_monotone(fake, "ln") and not fitted_monotone(fake, "softmax")


def _gemm_fitted_monotone() -> bool:
    return "gemm" in (load_bundle().meta.get("spec_monotone") or {})


def _vector_reads_tdp() -> bool:
    return any("dev_log_w_per_tflop" in load_bundle().families[f].features for f in ("ln", "softmax", "elementwise"))


#: the bundle tests below check the bundle predictions use (the shipped one, or $WATTCAST_MODELS). The shipped bundle is
#: fitted without the constraints (stop 58's retraining with them was refused by the gate, so they are opt-in: README
#: "Monotone in the spec sheet"): on it they must fail (strict xfail: the audit's findings are still there), on a
#: bundle fitted with --spec-monotone they must pass
_OLD_GEMM = pytest.mark.xfail(condition="not _gemm_fitted_monotone()", strict=True,
                              reason="the bundle's GEMM family was fitted without SPEC_MONOTONE (audit 57g)")
_OLD_VECTOR = pytest.mark.xfail(condition="_vector_reads_tdp()", strict=True,
                                reason="the bundle's vector families read dev_log_w_per_tflop (audit 57g)")


@_OLD_GEMM
def test_a_better_figure_never_slows_a_tensor_core_gemm():
    """Audit 57g: B200 fp8 1024x4096x4096 +15.6% at 1.5x bandwidth, +18.7% at 2x; H100 fp8 +7.8% at 2x; every B200
    GEMM >= 1024x4096x4096 ~3% slower at 1.5x TDP (its measured ceiling lost); 2x L2 up to +4%."""
    rows = _gemm_rows(("bf16", "fp8"))
    worse = []
    for device in ("H100-SXM5-80GB", "B200"):
        s = resolve_device(device)
        for change, copy in (("bw1.5", _copy(s, memory_bandwidth_gbps=1.5 * s.memory_bandwidth_gbps)),
                             ("bw2", _copy(s, memory_bandwidth_gbps=2 * s.memory_bandwidth_gbps)),
                             ("tdp1.5", _copy(s, tdp_w=1.5 * s.tdp_w)),
                             ("l2x2", _copy(s, l2_cache_mb=2 * s.l2_cache_mb))):
            r = _ratio(rows, s, copy)
            worse += [f"{device} {change} {o.op} {o.B}x{o.M}x{o.N}x{o.K} {o.dtype}: x{x:.4f}"
                      for o, x in zip(rows.itertuples(), r) if x > 1 + SLOWER_TOL]
    assert not worse, "\n".join(worse)


@_OLD_VECTOR
def test_a_power_limit_leaves_a_streaming_kernel_alone():
    """Audit 57g: B200 rmsnorm 14.8% slower at 1.5x TDP, softmax 7.4% faster at 0.75x. Nothing a vector family reads
    depends on the TDP."""
    rows = _vector_rows()
    for device in ("H100-SXM5-80GB", "B200", "A100-SXM4-80GB", "MI300X"):
        s = resolve_device(device)
        for f in (0.75, 1.5):
            np.testing.assert_allclose(_ratio(rows, s, _copy(s, tdp_w=f * s.tdp_w)), 1.0, rtol=1e-12,
                                       err_msg=f"{device} TDP x{f}")


def test_a_power_limit_moves_a_listed_chips_matmul_ceiling_only_the_physical_way():
    """More power than a listed chip's: at least its measured ceiling (B200 at 1.5 kW took its die's median, 3% lower);
    less power: at most it. The held-out A100 80GB PCIe (300 W) keeps its vendor's median: it lies above the 250 W
    A100 PCIe 40GB's measurement, the only sibling at a lower limit."""
    cm = load_bundle().families["gemm"].ceiling_member
    dts = np.array(["bf16", "fp8", "tf32"])
    b200 = resolve_device("B200")
    own = np.array([cm["ceilings"]["B200"][d] for d in dts])
    np.testing.assert_array_equal(_device_ceilings(_copy(b200, tdp_w=1.5 * b200.tdp_w), cm, dts), own)
    assert np.all(_device_ceilings(_copy(b200, tdp_w=0.75 * b200.tdp_w), cm, dts) <= own)
    a100 = resolve_device("A100-PCIe-80GB")
    from wattcast.models.gemm_floor import row_ceilings
    from wattcast.models.kernel_predictor import _ceiling_name
    np.testing.assert_array_equal(_device_ceilings(a100, cm, dts),
                                  row_ceilings(_ceiling_name(a100, cm), "nvidia", dts, cm, arch=a100.arch))
