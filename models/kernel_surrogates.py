"""Kernel latency surrogates behind one fit/predict interface (the :class:`Surrogate` protocol) and a registry by name.

Every surrogate predicts ``log(latency / roofline)`` for one op family from the features of
``wattcast.featurize.kernel_features``; latency = roofline x exp(prediction). Families:

- :class:`RooflineSurrogate`: the analytical baseline (prediction 0, i.e. latency = roofline) and,
  with a per-family calibration constant, the fallback when no learned model is available.
- :class:`LGBMSurrogate`: gradient-boosted trees (LightGBM); saved as LightGBM text.
- :class:`MLPSurrogate`: a NeuSight-style MLP predicting the achieved fraction of the roofline,
  ``eff = EFF_MAX x sigmoid(z)``, so latency is bounded below by roofline / EFF_MAX. It is trained with
  torch (``training/``) and runs in numpy here, so prediction needs no torch; weights in safetensors.

:data:`SURROGATES` maps the names a bundle's manifest uses to these classes, :data:`CHOICES` a family's model choice
(``lgbm``, ``mlp``, ``ens`` = the mean of both, ``roofline`` = the fallback) to the surrogates it runs; code that picks a
predictor by string goes through :func:`surrogate_class` and :func:`choice_members`, which name the known ones on a miss.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Protocol, Sequence, runtime_checkable

import numpy as np
import pandas as pd

from wattcast.data.checks import did_you_mean
from wattcast.featurize.kernel_features import TILES

#: the MLP's efficiency ceiling against the DRAM roofline; above 1 because L2-resident kernels beat DRAM
EFF_MAX = 2.0

#: rows from which a LightGBM surrogate may predict with its compiled forest (models/lgbm_forest.py: the same numbers
#: in about 0.3x the CPU time); below, LightGBM's own predict
COMPILED_MIN_ROWS = 2048
#: ... once the process has predicted this many rows of such matrices with LightGBM (ski rental): the compiled path
#: costs once per process ~0.5-1 s (numba's start, ~0.1 s per family to build the forest), about what LightGBM spends
#: on this many rows, so a one-off table never pays more than about twice the cheaper path and a process that keeps
#: predicting (a sweep, a service, a benchmark after its warm-up run) gets the faster one
COMPILE_AFTER_ROWS = 65_536
_lgbm_large_rows = [0]  # rows of matrices >= COMPILED_MIN_ROWS LightGBM predicted in this process

#: rows per block of the MLP forward pass (2048 x 128 float32 activations = 1 MiB).
#:
#: How a row's MLP prediction stays the same bits whatever it is predicted with (tests/test_surrogate_protocol.py checks
#: it): each layer's GEMM takes float32 activations and weights, accumulates in float64 and rounds to float32. A
#: product of two float32 values is exact in float64 (24 + 24 < 53 mantissa bits), so the float64 sums of a row differ
#: between BLAS code paths (micro-tile remainders, one-row gemv, a CPU's own kernels: OpenBLAS DYNAMIC_ARCH picks
#: Haswell, SkylakeX or Zen kernels, and a small-matrix path below a size threshold) by a few float64 ulps at most,
#: which the rounding to float32 removes unless the sum lies that close to a float32 rounding midpoint (about 1e-8
#: of elements). Before (stop 51), float32 GEMMs padded to whole 64-row micro-tiles were exact on one CPU and not on
#: another: an AMD EPYC rounded ~1 float32 ulp differently for 16 of 2,420 rows depending on the batch.
_MLP_BLOCK = 2048

_blas_lock = threading.Lock()
_blas = {"controller": None, "limiter": None, "depth": 0}


@contextmanager
def _single_thread_blas() -> Iterator[None]:
    """Run BLAS on one thread inside (re-entrant and thread-safe; a no-op without threadpoolctl).

    The MLP's GEMMs are narrow (128 columns): a second BLAS thread gains little on them, and when the
    other core is busy every GEMM waits for its descheduled helper thread (tens of ms per call
    instead of a fraction of one). Other threads of the process also get one BLAS thread meanwhile.
    """
    with _blas_lock:
        if _blas["depth"] == 0:
            if _blas["controller"] is None:
                try:
                    from threadpoolctl import ThreadpoolController

                    _blas["controller"] = ThreadpoolController()
                except Exception:  # threadpoolctl missing or failing: leave BLAS as it is
                    _blas["controller"] = False
            if _blas["controller"]:
                try:
                    _blas["limiter"] = _blas["controller"].limit(limits=1, user_api="blas")
                except Exception:
                    _blas["limiter"] = None
        _blas["depth"] += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas["depth"] -= 1
            if _blas["depth"] == 0 and _blas["limiter"] is not None:
                limiter, _blas["limiter"] = _blas["limiter"], None
                limiter.restore_original_limits()


#: LightGBM's OpenMP threads for predictions (0: OpenMP's default, every core). A forked search worker sets 1
#: (:func:`single_threaded_predictions`): GNU OpenMP's thread pool does not survive fork, and a child that enters a
#: parallel region the parent's pool had served waits forever (a search with workers=2 after a prediction in the same
#: process hung in ``booster.predict``).
PREDICT_THREADS = [0]


def single_threaded_predictions() -> None:
    """Run every LightGBM call of this process on one thread (a forked worker's initializer): predictions
    (``PREDICT_THREADS``) and LightGBM's own OpenMP loops, model loading included (``LGBM_SetMaxThreads``, LightGBM
    >= 4.0 c_api.h). GNU libgomp's state does not survive fork: ``Booster(model_str=...)`` parses its trees in a
    ``#pragma omp parallel for`` (LightGBM gbdt_model_text.cpp, LoadModelFromString), and a search worker loading a
    user's model folder hung there forever (audit 57c; tests/test_search_workers_user_bundle.py, which hangs without
    this cap); a one-thread region runs without a thread team."""
    PREDICT_THREADS[0] = 1
    import ctypes

    from lightgbm.basic import _LIB, _safe_call

    _safe_call(_LIB.LGBM_SetMaxThreads(ctypes.c_int(1)))


#: FNV-1a's 64-bit offset basis and prime (Fowler, Noll, Vo: http://www.isthe.com/chongo/tech/comp/fnv/)
_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, np.uint64(0x100000001B3)


def fnv1a_rows(columns, n: int) -> np.ndarray:
    """One FNV-1a hash per row over ``columns`` (each ``n`` integers, taken as 64-bit words): equal rows hash
    equal; two different rows can collide, so a caller checks its groups."""
    h = np.full(n, _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in columns:
            h ^= k.astype(np.uint64, copy=False)
            h *= _FNV_PRIME
    return h


def distinct_matrix_rows(A: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(a representative of each group of identical rows of the float64 matrix ``A``, the group of every row), rows
    identical when every value is, bit for bit; None when no two rows are (or a hash collision would merge two that
    differ: every group is checked). A row's surrogate prediction depends on that row alone (LightGBM walks each row
    through the trees; the MLP's GEMMs accumulate in float64 and round to float32, :data:`_MLP_BLOCK`), so identical rows --
    two kernels that differ only where no feature looks, ``add`` and ``mul`` of one shape -- need predicting once."""
    n = len(A)
    if n < 2 or A.ndim != 2 or A.dtype != np.float64:
        return None
    bits = np.ascontiguousarray(A).view(np.uint64)
    inverse, uniq = pd.factorize(fnv1a_rows(bits.T, n))
    if len(uniq) == n:
        return None
    rep = np.empty(len(uniq), dtype=np.intp)
    rep[inverse] = np.arange(n)
    if not np.array_equal(bits[rep][inverse], bits):  # a collision: predict every row
        return None
    return rep, inverse


def predict_distinct(predict, A: np.ndarray) -> np.ndarray:
    """``predict(A)`` (one value per row of ``A``), computed once per group of identical rows
    (:func:`distinct_matrix_rows`): the same numbers, bit for bit."""
    groups = distinct_matrix_rows(A)
    if groups is None:
        return predict(A)
    rep, inverse = groups
    return np.asarray(predict(np.ascontiguousarray(A[rep])))[inverse]


@runtime_checkable
class Surrogate(Protocol):
    """What every kernel latency surrogate offers (vidur's execution-time predictors share one base the same way).

    ``name`` is its key in :data:`SURROGATES` and in a bundle's manifest; ``fit(X, y)`` learns ``y = log(latency /
    roofline)`` from the feature frame ``X`` and returns the surrogate; ``predict(X)`` gives that log ratio per row of
    ``X``; ``predict_matrix(A)`` the same on an (n, len(features)) float array whose columns are the surrogate's
    features in order (the fast path of ``models/kernel_predictor.py``). Persistence differs by kind and stays with
    the class: LightGBM text files (``save(path)`` / ``load(path, features)``), MLP arrays (``weights()`` into the
    bundle's safetensors file), the roofline's single offset in the manifest."""

    name: str

    def fit(self, X: pd.DataFrame, y: np.ndarray) -> "Surrogate": ...

    def predict(self, X: pd.DataFrame) -> np.ndarray: ...

    def predict_matrix(self, A: np.ndarray) -> np.ndarray: ...


class RooflineSurrogate:
    """latency = roofline x exp(offset); offset 0 is the plain roofline."""

    name = "roofline"

    def __init__(self, offset: float = 0.0):
        self.offset = float(offset)

    def fit(self, X: pd.DataFrame, y: np.ndarray) -> "RooflineSurrogate":
        self.offset = float(np.median(y))
        return self

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        return self.predict_matrix(X)

    def predict_matrix(self, A) -> np.ndarray:
        return np.full(len(A), self.offset)


#: The direction every LightGBM kernel member's learned log ratio takes, in the opt-in recipe (``LGBMSurrogate(...,
#: spec_monotone=True)``, ``wattcast train kernels --spec-monotone``; the shipped bundle is fitted without: its
#: retraining was refused by the gate, README "Monotone in the spec sheet"), in the features that carry a spec-sheet
#: figure (LightGBM ``monotone_constraints``: +1 non-decreasing, -1 non-increasing, holding the other features fixed;
#: method "advanced", as training/power.py). Each member learns ``log(time / reference)`` with a reference that never
#: grows when the GPU gets more capable (the roofline ``max(flops / peak, bytes / bandwidth)``; roofline + a measuring
#: floor for the floor member; roofline / the device's matmul ceiling for the ceiling member, models/gemm_floor.py),
#: so a ratio that does not grow along a capability makes the predicted time non-increasing in it. A feature is listed
#: only where the direction is physically right whichever figure moves it; the shape direction of a mixed feature is
#: carried by an unconstrained shape feature next to it (``log_bytes`` for ``log_t_mem_ms``, ``log_numel`` for
#: ``log_numel_per_sm``), so the constraint binds the device direction. Not listed, on purpose:
#: ``dev_log_ridge`` and ``log_intensity_over_ridge`` (peak / bandwidth: more bandwidth and more peak move them in
#: opposite directions, and the ratio to the roofline peaks where a kernel's compute and memory times meet: not
#: monotone in either), ``dev_log_l2bw_over_dram`` (SMs x clock / bandwidth: same conflict), ``dev_log_peak_tflops``
#: and ``dev_log_peak_vec_tflops`` (a higher peak is reached at a lower fraction: B200's measured matmul ceiling is
#: 0.78 of peak, A100's 0.81-0.87, so the ratio rightly grows with it), ``dev_log_sms`` and
#: ``dev_log_flops_per_sm_clock`` (at a fixed total peak, more and slower SMs make a one-tile kernel slower),
#: ``log_waves_*`` / ``log_tiles_128x128_per_sm`` (fewer waves amortise a kernel's fixed cost over less work),
#: ``log_t_compute_ms`` / ``log_t_roof_ms`` (the roofline itself: larger kernels reach a larger fraction of it),
#: ``dev_log_mem_gb`` (capacity, no speed) and the clocks (measured and dropped: see below the vector table). Audit 57g (issue 14) measured the unconstrained trees: B200 fp8
#: 1024x4096x4096 15.6% slower at 1.5x bandwidth (the ceiling member's ratio fell with ``log_t_mem_ms``: +0.40 of log
#: ratio of its +0.18), 163 vs 148 SMs (peaks scaled) 3.7% slower on 1024x4096x4096 (``wave_eff_128x128``).
SPEC_MONOTONE: dict[str, int] = {
    # DRAM time of the kernel's bytes: more bytes (at the same log_bytes-free rest) or less bandwidth can never make
    # it faster, and more bandwidth never slower, compute-bound or not (issue 14's "time = max(compute, memory)")
    "log_t_mem_ms": +1,
    # the bandwidth itself, at the same DRAM time: the same argument from the device side
    "dev_log_bw_gbps": -1,
    # working set over the L2: a larger cache (or a smaller working set at the same bytes) keeps more of it on chip;
    # a cache never slows a kernel down (audit 57g: 2x L2 made small H100 kernels 4-7% slower)
    "log_ws_over_l2": +1,
    "dev_log_l2_mb": -1,
    # watts per dense TFLOP: a board with more power per unit of compute throttles less, never more (a higher limit
    # can always be capped down to a lower one); a higher peak at the same TDP may rightly reach a smaller fraction of
    # it (power-starved designs, models/power_derating.py). Audit 57g: B200 at 1.5x TDP ran rmsnorm 14.8% slower
    "dev_log_w_per_tflop": -1,
    # the fraction of the SMs the last wave of output tiles fills (tiles / (waves x SMs)): a kernel's time is its
    # waves x a tile's time, the roofline its tiles x a tile's work over every SM, so the ratio is 1 / wave efficiency
    # (more SMs at the same waves lower the efficiency exactly as they lower the roofline: time unchanged)
    **{f"wave_eff_{a}x{b}": -1 for a, b in TILES},
    "row_wave_eff": -1,
    # a vector kernel's work per SM (log_numel, log_B carry its size): fewer SMs for the same tensor never speed it up
    "log_numel_per_sm": +1,
    "log_rows_per_sm": +1,
    "log_elem_waves": +1,
}


#: The vector families (softmax, LayerNorm/RMSNorm, elementwise: the features of ``featurize.kernel_features``
#: VEC_FEATURES, told apart by ``log_numel``) stream their tensors through DRAM: their time is at least the DRAM time of
#: what does not stay in the cache, so more bandwidth speeds them up by at most the bandwidth ratio and more vector
#: peak not at all. For them these replace or add to :data:`SPEC_MONOTONE` (the ratio is to the DRAM time there):
MEMORY_BOUND_MONOTONE: dict[str, int] = {
    # less DRAM time at the same bytes (more bandwidth) never lowers the ratio to it: a 2x bandwidth gives at most 2x
    # (audit 57g: B200 LayerNorm 2.07x, add 2.06x; A100 SXM4 fp32 add 2.27x). This is the opposite of the GEMMs'
    # sign: there a compute-bound kernel's roofline does not move with the bandwidth, here it moves in proportion
    "log_t_mem_ms": -1,
}
# Measured at stop 58 and left out (validation rows of the shared datasets, the family's LightGBM alone, 400 rounds on
# 80,000 rows): the vector ridge point (-1) and intensity over it (+1), physically right for a DRAM-bound kernel both
# ways (more bandwidth: at most its ratio of speed-up; more vector peak: never slower), took elementwise 2.41 -> 2.65%
# MAPE (gelu 2.2 -> 2.8, P100 fp32 gelu 4.1 -> 8.9 in the bundle: transcendental-heavy fp32 kernels are not purely
# DRAM-bound on the older GPUs), 2.46% without them; the boost clock (-1) and base over boost (-1) cost the GEMM
# family's main member 7.40 -> 7.42% and its ceiling member 5.30 -> 5.33% and fix nothing the audit found


def spec_monotone_constraints(features: Sequence[str]) -> list[int]:
    """LightGBM's ``monotone_constraints`` for ``features`` in order (:data:`SPEC_MONOTONE`, with
    :data:`MEMORY_BOUND_MONOTONE` over it for the vector families' features; 0 for the others)."""
    table = {**SPEC_MONOTONE, **MEMORY_BOUND_MONOTONE} if "log_numel" in features else SPEC_MONOTONE
    return [int(table.get(f, 0)) for f in features]


class LGBMSurrogate:
    """LightGBM regressor on the log roofline ratio. ``spec_monotone``: fit it monotone in the spec-sheet features of
    :data:`SPEC_MONOTONE` (opt-in, ``wattcast train kernels --spec-monotone``: the shipped bundle is fitted without,
    README "Monotone in the spec sheet")."""

    name = "lgbm"

    def __init__(self, features: Sequence[str], params: dict | None = None, num_boost_round: int = 400,
                 spec_monotone: bool = False):
        self.features = list(features)
        self.params = {
            "objective": "l2",
            "learning_rate": 0.05,
            "num_leaves": 63,
            "min_data_in_leaf": 20,
            "feature_fraction": 0.8,
            "bagging_fraction": 0.8,
            "bagging_freq": 1,
            "lambda_l2": 1.0,
            "verbose": -1,
            "num_threads": 0,
            "seed": 0,
            "deterministic": True,
            # LightGBM otherwise picks row- or col-wise histograms by timing a test build, so a loaded machine can
            # pick the other one and a refit differs (its docs: set one with ``deterministic``); col-wise is what it
            # picks for these tables on an idle machine
            "force_col_wise": True,
            **(self.monotone_params(self.features) if spec_monotone else {}),
            **(params or {}),
        }
        self.num_boost_round = num_boost_round
        self.booster = None
        self._model_text: str | None = None  # the text model it was loaded from (compile_forest reads it)
        self._forest = None  # the compiled forest (models/lgbm_forest.py): built on first use, False if it cannot be

    @staticmethod
    def monotone_params(features: Sequence[str]) -> dict:
        """The LightGBM parameters that make a fit on ``features`` monotone in :data:`SPEC_MONOTONE` ({} when none of
        them is read). "advanced" constrains each leaf against the leaves it can be compared with, not the whole
        subtree ("basic" over-constrains: LightGBM docs, ``monotone_constraints_method``)."""
        mono = spec_monotone_constraints(features)
        if not any(mono):
            return {}
        return {"monotone_constraints": mono, "monotone_constraints_method": "advanced"}

    def fit(self, X: pd.DataFrame, y: np.ndarray) -> "LGBMSurrogate":
        import lightgbm as lgb

        ds = lgb.Dataset(X[self.features].to_numpy(dtype=np.float64), label=np.asarray(y), feature_name=self.features, free_raw_data=True)
        self.booster = lgb.train(self.params, ds, num_boost_round=self.num_boost_round)
        self._model_text, self._forest = None, None
        return self

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        return self.predict_matrix(X[self.features].to_numpy(dtype=np.float64))

    def predict_matrix(self, A: np.ndarray) -> np.ndarray:
        """Like :meth:`predict` on an (n, len(features)) array whose columns are ``features`` in order."""
        if self.booster is None:
            raise RuntimeError("LGBMSurrogate is not fitted")
        A = np.ascontiguousarray(A, dtype=np.float64)
        if len(A) >= COMPILED_MIN_ROWS:
            if self._forest is not None or _lgbm_large_rows[0] >= COMPILE_AFTER_ROWS:
                forest = self.compiled_forest()
                if forest is not None:  # bit-identical to the booster's (tests/test_lgbm_forest.py)
                    # rows of similar roofline time share a chunk: their specialised trees are shallowest
                    key = self.features.index("log_t_roof_ms") if "log_t_roof_ms" in self.features else None
                    return forest.predict(A, order_by=key)
            _lgbm_large_rows[0] += len(A)
        # a C-contiguous float64 matrix goes to LightGBM without another copy
        return self.booster.predict(A, num_threads=PREDICT_THREADS[0])

    def compiled_forest(self):
        """The booster as a numba-compiled forest (:mod:`wattcast.models.lgbm_forest`), built once; None when numba
        is unavailable or the model has something the compiled walk does not reproduce."""
        if self._forest is None:
            from wattcast.models.lgbm_forest import compile_forest

            self._forest = compile_forest(self.booster, self._model_text) or False
            self._model_text = None  # parsed: no need to keep 2 MB of text
        return self._forest or None

    def save(self, path: Path) -> None:
        self.booster.save_model(str(path))

    @classmethod
    def load(cls, path: Path, features: Sequence[str]) -> "LGBMSurrogate":
        import lightgbm as lgb

        m = cls(features)
        m.booster = lgb.Booster(model_file=str(path))  # LightGBM text format: no pickle
        # the same text, for compile_forest when a large table comes (faster than booster.model_to_string)
        m._model_text = Path(path).read_text(errors="replace")
        if list(m.booster.feature_name()) != list(features):
            raise ValueError(f"{path}: the booster's features differ from the manifest's")
        return m


class MLPSurrogate:
    """Numpy forward pass of a trained MLP: standardise -> (Linear, SiLU)* -> Linear -> efficiency."""

    name = "mlp"

    def __init__(self, features: Sequence[str], weights: dict[str, np.ndarray]):
        self.features = list(features)
        self.mean = weights["mean"].astype(np.float64)
        self.std = weights["std"].astype(np.float64)
        self.fill = weights["fill"].astype(np.float64)  # imputation for NaN inputs (training medians)
        # inputs are clipped to the training range: an MLP extrapolates linearly and without bound
        # outside it, a tree does not (leave-one-device-out chose this, see training/kernel_mlp.py)
        self.lo = weights["lo"].astype(np.float64) if "lo" in weights else None
        self.hi = weights["hi"].astype(np.float64) if "hi" in weights else None
        self.clip = self.lo is not None
        n_layers = sum(1 for k in weights if k.startswith("w"))
        # float32 like the torch net it came from; transposed once here, not per call
        self.layers = [
            (np.ascontiguousarray(weights[f"w{i}"].T, dtype=np.float32), weights[f"b{i}"].astype(np.float32)) for i in range(n_layers)
        ]
        # the same float32 values held as float64 for the forward pass's float64 accumulation (predict_matrix)
        self._layers64 = [(wt.astype(np.float64), b.astype(np.float64)) for wt, b in self.layers]

    def weights(self) -> dict[str, np.ndarray]:
        """The arrays that rebuild this model (saved as safetensors)."""
        out = {"mean": self.mean, "std": self.std, "fill": self.fill}
        if self.clip:
            out["lo"], out["hi"] = self.lo, self.hi
        for i, (wt, b) in enumerate(self.layers):
            out[f"w{i}"] = wt.T
            out[f"b{i}"] = b
        return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}

    def fit(self, X, y):  # pragma: no cover - training lives in wattcast.training
        raise NotImplementedError("MLPSurrogate is trained by wattcast.training.kernel_mlp.fit_mlp")

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        return self.predict_matrix(X[self.features].to_numpy(dtype=np.float64))

    def predict_matrix(self, A: np.ndarray) -> np.ndarray:
        """Like :meth:`predict` on an (n, len(features)) array whose columns are ``features`` in order.

        The arithmetic of the plain forward pass (impute, clip, standardise in float64, then float32 layers
        with SiLU(z) = z x 1 / (1 + exp(-z))), done in place, in row blocks, with BLAS on one thread. A row's
        result does not depend on the other rows: each GEMM accumulates in float64 and rounds to float32 (see the
        comment above :data:`_MLP_BLOCK`; float32 BLAS could round a row ~1 float32 ulp of the logit differently
        with the batch, so a kernel's cached prediction depended on what else was predicted with it first).
        """
        z = np.array(A, dtype=np.float64, order="C", copy=True)  # worked on in place below
        if len(z) == 0:
            return np.zeros(0)
        nan = np.isnan(z)
        if nan.any():
            np.copyto(z, np.broadcast_to(self.fill, z.shape), where=nan)
        if self.clip:
            np.clip(z, self.lo, self.hi, out=z)
        z -= self.mean
        z /= self.std
        x = z.astype(np.float32)
        out = np.empty(len(x), dtype=np.float64)
        last = len(self.layers) - 1
        with _single_thread_blas():
            # row blocks: each layer's activations stay in cache through the SiLU passes
            for s in range(0, len(x), _MLP_BLOCK):
                h = x[s : s + _MLP_BLOCK]
                rows = len(h)
                t = None
                for i, (wt, b) in enumerate(self._layers64):
                    acc = h.astype(np.float64) @ wt  # exact float32 products, float64 sums
                    acc += b
                    h = acc.astype(np.float32)
                    if i < last:  # SiLU, in place: h *= 1 / (1 + exp(-clip(h, -60, 60)))
                        if t is None or t.shape != h.shape:
                            t = np.empty_like(h)
                        np.clip(h, -60.0, 60.0, out=t)
                        np.negative(t, out=t)
                        np.exp(t, out=t)
                        t += 1.0
                        np.reciprocal(t, out=t)
                        h *= t
                out[s : s + rows] = h[:rows, 0]
        # eff = EFF_MAX * sigmoid(out); log ratio = -log(eff)
        log_sig = -np.logaddexp(0.0, -out)
        return -(np.log(EFF_MAX) + log_sig)


#: surrogate classes by the name a bundle's manifest uses for them
SURROGATES: dict[str, type[Surrogate]] = {c.name: c for c in (RooflineSurrogate, LGBMSurrogate, MLPSurrogate)}

#: a family's model choice -> the learned surrogates it runs: one of them, the mean of both (``ens``, whose spread is
#: the half-difference), or none (``roofline``: the fallback offset)
CHOICES: dict[str, tuple[str, ...]] = {
    LGBMSurrogate.name: (LGBMSurrogate.name,),
    MLPSurrogate.name: (MLPSurrogate.name,),
    "ens": (LGBMSurrogate.name, MLPSurrogate.name),
    RooflineSurrogate.name: (),
}

#: the choices training compares by leave-one-device-out error, in order (the roofline is the fallback, not a candidate)
CANDIDATES: tuple[str, ...] = tuple(c for c, members in CHOICES.items() if members)


def _unknown(what: str, name, known) -> ValueError:
    hint = did_you_mean(str(name), known, " (did you mean {}?)", quote=True, n=1)
    return ValueError(f"unknown {what} {name!r}{hint}; known: {', '.join(known)}")


def surrogate_class(name: str) -> type[Surrogate]:
    """The surrogate class registered as ``name``; a ValueError naming the known ones (and the closest) otherwise."""
    try:
        return SURROGATES[name]
    except (KeyError, TypeError):
        raise _unknown("kernel surrogate", name, SURROGATES) from None


def choice_members(choice: str) -> tuple[str, ...]:
    """The names of the surrogates a family's model ``choice`` runs (see :data:`CHOICES`); a ValueError naming the
    known choices (and the closest) otherwise."""
    try:
        return CHOICES[choice]
    except (KeyError, TypeError):
        raise _unknown("kernel model choice", choice, CHOICES) from None
