"""Per-kernel GPU power, the power of the rest of the timeline, power limits / clock caps, node overhead.

The model is physically shaped::

    P = P_idle + (TDP - P_idle) * g(features),   0 <= g <= 1

``g`` is learned by ``wattcast train power`` (``training/power.py``) on the measured data in
``shared/datasets/power`` and shipped as ``models/artifacts/power_manifest.json`` (plus
``power_g.lgbm.txt`` when the LightGBM form won leave-one-device-out). Three forms are fitted and the one
with the lower mean per-GPU leave-one-device-out error ships:

* ``curve``: ``g = 1 - exp(-a * (compute_util + memory_util))``, one slope (monotone in both utilisations,
  idle at no activity, saturating at TDP); the shipped form, a = 1.96 (leave-one-GPU-out 13.1% mean per-GPU
  MAPE on 5 GPUs vs 33.1% for TDP x utilisation; MLflow experiment "power", run 24565af4cc49);
* ``curve_free``: ``g = 1 - exp(-(a0 + a_c * compute_util + a_m * memory_util))``, ``a_* >= 0``: the two
  slopes are not identified on unseen GPUs (training rows move both utilisations together);
* ``lgbm``: a small LightGBM on the utilisations and device descriptors, monotone increasing in both
  utilisations, predicting ``g`` (clipped to [0, 1]).

Both curve forms are stored as ``params = {a0, a_c, a_m}``.

Without the artifact :func:`load_power_model` returns the same ``curve`` form with stated prior
parameters (:data:`ANALYTICAL_PARAMS`), flagged ``fallback=True``.

Clock and power limits (:func:`apply_clock`, :func:`apply_power_limit`): when a kernel would draw more
than the limit, the SM clock drops to the ratio ``s = f / f_boost`` at which it fits. Dynamic power
(``P - P_idle``) scales as :func:`clock_power_fraction` of the clock ratio. The shipped clock law is ``power``:
``s ** alpha`` (``f * V**2`` with the voltage falling along the DVFS curve; ``alpha`` is fitted on Perseus's A100 SXM
stage sweeps, 855-1410 MHz: 2.03, 4.7% power MAPE over the sweep; stored in the manifest); compute-bound time scales
as ``1/s``, memory-bound time barely moves: ``t' = t * ((1 - phi) + phi / s)`` with
``phi = clip(compute_util / u_ref, 0, 1)`` (``u_ref`` fitted on the same sweeps: 0.99, i.e. phi ~ compute
utilisation; 1.8% time MAPE). Both time and power respond.

How far that holds (``python benchmarks/power_limits.py``, the full single-device / cluster pipeline against the
measured ratios to the uncapped run; README "Power, energy, TCO and carbon"): the time cost of a deep limit is
under-predicted and the energy it saves over-stated. Zeus BERT-base / SQuAD (FP32), limits at most half the TDP:
time ratio bias -19.7% on the V100 PCIe (100 W: 1.50x predicted, 2.0x measured), -30.7% on the Quadro RTX 6000, energy
ratio bias -13% / -22%, and the predicted energy keeps falling to the lowest limit where the measured one is least
at 150 W. On the held-out A100 80GB PCIe (Perseus, gpt3-xl 4-stage pipeline) moderate limits are under-predicted
too: 1.12x time at 175 W against 1.77x measured, 0.83x energy against 1.06x.

Where the error comes from (stop 56; the terms taken one at a time on the Zeus rows):

* the power law below the sweep's range. The sweeps show a voltage floor: power falls steeply from 1410 down to
  ~1100 MHz, then only linearly with the clock (gpt3-175b stage 0 backward: 477 W at 1395, 295 W at 1095, 239 W at
  855 MHz), as GPU DVFS power models have it (dynamic power ~ V^2 f along the chip's voltage/frequency table, the
  voltage flat over the lowest levels: GPUWattch, Leng et al., ISCA'13; AccelWattch, Kandiah et al., MICRO'21;
  Guerreiro et al., HPCA'18). ``s ** 2.03`` extrapolated to :data:`MIN_CLOCK_RATIO` puts dynamic power at 0.087 of
  the boost figure where the floor puts it near 0.21, so a deep limit is met at too high a clock. The ``knee`` law
  (``s (v(s) / v(1))^2``, ``v(s) = 1 + beta max(s - s_k, 0)``: V at its floor below the knee clock ratio ``s_k``,
  rising ``beta`` per unit of clock ratio above it; fitted on the same sweeps, 0.762 and 0.871, 2.2% power MAPE)
  cuts the deep-limit time bias (V100 -19.7% -> -14.8%, RTX 6000 -30.7% -> -25.8%), but the sweeps are steeper than
  ``s ** 2.03`` above the knee too, so it predicts less slowdown at moderate limits, and on the held-out A100 PCIe
  it is no better: the pipeline's figures do not move (no kernel reaches the knee there) and the replay of the
  measured uncapped runs gets worse (time ratio MAPE 10.2% -> 12.1%). It is implemented and evaluated, not shipped.
* the uncapped power level: the surrogate puts BERT-base at 213 W on the V100 (228 W measured), so a 225 W limit
  does not bind (measured: 1.02x);
* where the board runs without a limit: the response starts at the boost clock, but a board whose TDP is below
  what its die draws at boost is already throttled there (the A100 80GB PCIe is the GA100 die of the A100 SXM
  sweeps, which drew ~470 W at 1410 MHz, in a 300 W board), so a limit acts on the flat part of the curve and slows
  it far more. Not modelled: the shipped data do not give the stock clock of a board under load;
* the board keeps its average under a binding limit by 2-7% (V100 at 225 W draws 210 W), so the energy of moderate
  limits is over-predicted (+3-6%) even where the time is right.

The ``knee`` law is used by a manifest with ``clock_law: knee`` (``training/power.py`` fits and reports it); a
manifest without ``clock_law`` (every one until stop 56, the shipped one) has the ``power`` law.

Bad settings are refused (:func:`check_power_settings`): a power limit or clock cap must be a finite
positive number; a clock cap below the lowest clock modelled (:data:`MIN_CLOCK_RATIO` x boost) is refused
rather than silently clamped to it, and a cap at or above the boost clock does not bind (no change). A
power limit below what the step draws at that lowest clock (:func:`check_power_limit_attainable`) is refused
by the prediction paths (:mod:`wattcast.simulate.energy`), since no clock could meet it.

Nothing here imports ``wattcast.training``; artifacts are JSON and LightGBM text (no pickles).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wattcast.data.device_spec import DeviceSpec
from wattcast.featurize.power_features import device_idle_w, device_tdp_w

MANIFEST = "power_manifest.json"
LGBM_FILE = "power_g.lgbm.txt"
POWER_SCHEMA = 1
#: a retrained model's folder: ``power_versions/<name>/`` holds each version written, ``POWER_CURRENT`` names the
#: live one (switched with one atomic rename; models/versioned.py); a folder without the pointer (the shipped
#: ``models/artifacts/``) is itself the model. Own names, so the kernel bundle can share the folder.
POINTER = "POWER_CURRENT"
VERSIONS = "power_versions"
#: power models the gate refused: ``power_refused/<name>/`` (the newest few), apart from the versions and from the
#: kernel bundle's ``refused/`` in a shared folder; usable by their folder (--power-model), never made live
REFUSED = "power_refused"

#: features the learned ``g`` may use (columns of ``kernel_power_features``)
CURVE_FEATURES = ("compute_util", "memory_util")
LGBM_FEATURES = ("compute_util", "memory_util", "tensor", "dtype_bytes", "tdp_w", "boost_clock_mhz", "process_node_nm")

#: Analytical fallback (no artifact): the curve form with slope 2 on compute + memory utilisation: a GPU
#: whose units add up to ~1 (a training GEMM at 0.75 of peak with 0.25 of DRAM bandwidth) draws ~86% of its
#: dynamic range, a decode step at ~0.25 draws ~40% (what the measured data in shared/datasets/power shows;
#: the trained fit lands at 1.96). Stated prior, flagged ``fallback`` (every row ood) wherever it is used.
ANALYTICAL_PARAMS = {"a0": 0.0, "a_c": 2.0, "a_m": 2.0}
#: Dynamic power ~ f * V(f)^2. Without a fitted value: ~2.5 (V roughly linear in f near the top of the DVFS
#: curve gives 3, a voltage floor gives 1). The shipped manifest carries the value fitted on Perseus.
DEFAULT_ALPHA = 2.5
#: the clock laws :func:`clock_power_fraction` knows: ``power`` (``s ** alpha``, the shipped one) and ``knee`` (voltage
#: floor below ``knee_clock_ratio``, V rising linearly above it: evaluated, not shipped; module docstring)
CLOCK_LAWS = ("power", "knee")
#: the ``knee`` law's parameters where a manifest with that law does not give them: the clock ratio below which the
#: DVFS voltage stays at its floor, and the rise of V / V_floor per unit of clock ratio above it, as fitted on
#: Perseus's A100 SXM stage sweeps (``training/power.py`` ``fit_clock_response``: 0.762, 0.871; V(boost) / V_floor
#: = 1.21), rounded
DEFAULT_KNEE_CLOCK_RATIO = 0.76
DEFAULT_VOLTAGE_SLOPE = 0.87
#: compute utilisation at which a kernel's time is fully clock-bound (fallback; the manifest has the fit)
DEFAULT_U_REF = 0.8
#: lowest SM clock ratio a power limit can push a GPU to (A100: 210 of 1410 MHz is 0.15; drivers rarely
#: go that low under a power cap; 0.3 keeps the extrapolation inside a sane range)
MIN_CLOCK_RATIO = 0.3
#: the lowest clock ratio the clock law was fitted at: Perseus's A100 SXM stage sweeps reach 855 of 1410 MHz
#: (``training/power.py`` ``clock_fit.sweep_clock_min_mhz``); a clock cap below it is extrapolated (noted in warnings)
FITTED_MIN_CLOCK_RATIO = 855.0 / 1410.0
#: a power limit at or below this fraction of the TDP is a deep one: the Zeus runs (BERT-base / SQuAD, FP32) at such
#: limits took longer and saved less energy than predicted (``benchmarks/power_limits.py``: time ratio bias -19.7% on
#: the V100 PCIe, -30.7% on the Quadro RTX 6000, energy ratio -13% / -22%); noted in warnings
DEEP_LIMIT_TDP_FRACTION = 0.5
#: GPU power while only communicating or waiting (NCCL kernels spinning on a few SMs, clocks up, HBM and
#: links active; pipeline bubbles wait inside NCCL receives): idle + this fraction of (TDP - idle).
#: Assumption, not fitted: what the learned g gives a link-bound kernel with no math and ~10-15% of DRAM
#: bandwidth (NCCL ring traffic), and in line with the measured floor of busy-but-waiting training loops
#: (Zeus NCF rows: 0.15-0.27 x TDP). Perseus (SOSP'24) names this "blocking" power as the energy bloat it
#: removes; its artifact publishes no separate measurement of it, so we do not claim one.
COMM_DYNAMIC_FRACTION = 0.2
#: band (log of measured / predicted power) used when a model has none: +/- ~15%
DEFAULT_BAND_LOG = (-0.15, 0.15)
#: widen the band (log space) of a row outside the power model's training support: a stated ASSUMPTION, as the kernel
#: bundle's (models/kernel_bundle.py ``OOD_BAND_FACTOR``, issue 14): no held-out power measurement beyond the support
#: exists to calibrate it
OOD_BAND_FACTOR = 2.0


# --------------------------------------------------------------------------------------------- model
@dataclass
class PowerModel:
    form: str  # curve | lgbm
    params: dict[str, float]  # curve parameters (also kept for the lgbm form: it is the fallback inside)
    alpha: float = DEFAULT_ALPHA  # the ``power`` clock law's exponent (unused by the ``knee`` law)
    u_ref: float = DEFAULT_U_REF
    clock_law: str = "power"  # see CLOCK_LAWS / clock_power_fraction
    knee_clock_ratio: float = DEFAULT_KNEE_CLOCK_RATIO
    voltage_slope: float = DEFAULT_VOLTAGE_SLOPE
    band_log: tuple[float, float] = DEFAULT_BAND_LOG
    support: dict[str, tuple[float, float]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    booster: Any = None  # lightgbm.Booster for the lgbm form
    fallback: bool = False  # True: the analytical prior, no trained artifact

    # ---------------------------------------------------------------- g
    def g_curve(self, features: pd.DataFrame) -> np.ndarray:
        p = self.params
        z = (p.get("a0", 0.0) + p.get("a_c", 0.0) * features["compute_util"].to_numpy(dtype=float)
             + p.get("a_m", 0.0) * features["memory_util"].to_numpy(dtype=float))
        return 1.0 - np.exp(-np.maximum(z, 0.0))

    def g(self, features: pd.DataFrame) -> np.ndarray:
        if self.form == "lgbm" and self.booster is not None and len(features):
            X = lgbm_matrix(features)
            return np.clip(self.booster.predict(X, num_threads=1), 0.0, 1.0)
        return self.g_curve(features)

    def ood(self, features: pd.DataFrame) -> np.ndarray:
        """Outside what the model was fitted on: utilisations or TDP beyond the training range (2% slack),
        or a non-tensor/tensor mix it never saw. The analytical fallback flags every row."""
        n = len(features)
        if self.fallback:
            return np.ones(n, dtype=bool)
        out = np.zeros(n, dtype=bool)
        for col, (lo, hi) in self.support.items():
            if col not in features:
                continue
            v = features[col].to_numpy(dtype=float)
            slack = 0.02 * max(hi - lo, 1e-9)
            out |= (v < lo - slack) | (v > hi + slack)
        return out

    def predict_w(self, features: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(watts, low, high, ood) per row of ``kernel_power_features`` output; all within [idle, TDP]."""
        idle = features["idle_w"].to_numpy(dtype=float)
        tdp = features["tdp_w"].to_numpy(dtype=float)
        g = self.g(features)
        w = idle + (tdp - idle) * g
        ood = self.ood(features)
        lo_q, hi_q = self.band_log
        widen = np.where(ood, OOD_BAND_FACTOR, 1.0)
        low = np.clip(w * np.exp(lo_q * widen), idle, tdp)
        high = np.clip(w * np.exp(hi_q * widen), idle, tdp)
        return w, np.minimum(low, w), np.maximum(high, w), ood

    # ---------------------------------------------------------------- io
    def to_manifest(self) -> dict[str, Any]:
        law = {} if self.clock_law == "power" else {  # a power-law manifest stays as every one before stop 56
            "clock_law": self.clock_law, "knee_clock_ratio": float(self.knee_clock_ratio),
            "voltage_slope": float(self.voltage_slope)}
        return {
            "schema_version": POWER_SCHEMA,
            "form": self.form,
            "params": {k: float(v) for k, v in self.params.items()},
            "alpha": float(self.alpha),
            "u_ref": float(self.u_ref),
            **law,
            "band_log": [float(self.band_log[0]), float(self.band_log[1])],
            "support": {k: [float(a), float(b)] for k, (a, b) in self.support.items()},
            "lgbm_features": list(LGBM_FEATURES) if self.form == "lgbm" else [],
            "meta": self.meta,
        }

    def save(self, folder: str | Path) -> None:
        """Write the manifest (and the LightGBM text) atomically: temp file in the folder, then rename."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        manifest = self.to_manifest()
        files_out = {}
        if self.form == "lgbm" and self.booster is not None:
            import hashlib

            files_out[LGBM_FILE] = self.booster.model_to_string()
            manifest["lgbm_sha256"] = hashlib.sha256(files_out[LGBM_FILE].encode("utf-8")).hexdigest()
        elif (folder / LGBM_FILE).exists():
            (folder / LGBM_FILE).unlink()
        files_out[MANIFEST] = json.dumps(manifest, indent=1, default=str)
        for name in sorted(files_out, key=lambda n: n == MANIFEST):  # manifest last: it names the rest
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(files_out[name])
            os.chmod(tmp, 0o644)  # mkstemp makes 0600; a shipped artifact is read by everyone
            os.replace(tmp, folder / name)

    @classmethod
    def load(cls, folder: str | Path) -> "PowerModel":
        """Load from ``folder`` (its live version when it has a ``POWER_CURRENT`` pointer, else the flat files)."""
        from wattcast.models.manifest import read_manifest

        folder = resolve_power_folder(folder)
        m = read_manifest(folder, MANIFEST, "power model", POWER_SCHEMA, schema_key="schema_version")
        booster = None
        if m["form"] == "lgbm":
            import lightgbm as lgb

            from wattcast.models.manifest import check_model_file

            path = check_model_file(folder / LGBM_FILE, m.get("lgbm_sha256"), what="power model")  # before LightGBM
            booster = lgb.Booster(model_str=path.read_text(encoding="utf-8"))
        # a manifest without a clock law (every one written before stop 56) has the power law
        law = str(m.get("clock_law", "power"))
        if law not in CLOCK_LAWS:
            raise ValueError(f"{folder / MANIFEST}: clock_law {law!r} is not one of {', '.join(CLOCK_LAWS)}")
        knee = float(m.get("knee_clock_ratio", DEFAULT_KNEE_CLOCK_RATIO))
        slope = float(m.get("voltage_slope", DEFAULT_VOLTAGE_SLOPE))
        if law == "knee" and not (0.0 < knee <= 1.0 and math.isfinite(slope) and slope >= 0.0):
            raise ValueError(f"{folder / MANIFEST}: the knee clock law needs 0 < knee_clock_ratio <= 1 and "
                             f"voltage_slope >= 0, got {knee!r} and {slope!r}")
        return cls(form=m["form"], params=dict(m["params"]), alpha=float(m["alpha"]), u_ref=float(m["u_ref"]),
                   band_log=tuple(m["band_log"]), support={k: tuple(v) for k, v in m.get("support", {}).items()},
                   meta=m.get("meta", {}), booster=booster, clock_law=law, knee_clock_ratio=knee, voltage_slope=slope)


def lgbm_matrix(features: pd.DataFrame) -> np.ndarray:
    cols = []
    for c in LGBM_FEATURES:
        v = features[c].to_numpy(dtype=float) if c in features else np.full(len(features), np.nan)
        cols.append(v)
    return np.ascontiguousarray(np.column_stack(cols), dtype=np.float64) if cols else np.zeros((len(features), 0))


def analytical_model() -> PowerModel:
    return PowerModel(form="curve", params=dict(ANALYTICAL_PARAMS), alpha=DEFAULT_ALPHA, u_ref=DEFAULT_U_REF,
                      band_log=(-0.3, 0.3), fallback=True,
                      meta={"note": "analytical prior (no trained power artifact found); every row flagged ood"})


def shipped_folder() -> Path:
    return Path(str(files("wattcast.models") / "artifacts"))


def _layout():
    from wattcast.models.versioned import Layout

    return Layout(pointer=POINTER, versions=VERSIONS, what="power model", refused=REFUSED)


def resolve_power_folder(folder: str | Path) -> Path:
    """The folder holding the live power model: ``folder/power_versions/<POWER_CURRENT>`` when ``folder`` has the
    pointer, else ``folder`` (flat layout). ValueError naming the pointer when it is broken."""
    from wattcast.models.versioned import resolve_live

    return resolve_live(folder, _layout())


def _probe_features() -> pd.DataFrame:
    """Rows on which an installed power model must predict what the model in memory predicts."""
    u = np.linspace(0.0, 1.0, 11)
    cu, mu = np.meshgrid(u, u)
    n = cu.size
    return pd.DataFrame({"compute_util": cu.ravel(), "memory_util": mu.ravel(), "tensor": np.arange(n) % 2,
                         "dtype_bytes": np.where(np.arange(n) % 2, 2.0, 4.0), "tdp_w": 300.0 + np.arange(n) * 3.0,
                         "boost_clock_mhz": 1400.0, "process_node_nm": 7.0, "idle_w": 50.0})


def install_power_model(model: "PowerModel", target: str | Path, activate: bool = True) -> Path:
    """Write ``model`` as a new version under ``target/power_versions/``, load it back there (hash checked) and check
    it predicts what ``model`` predicts on probe rows, then make it live with one atomic rename of
    ``target/POWER_CURRENT`` (models/versioned.py). A kill at any moment leaves the previous model live. Returns the
    new version's folder. ``activate=False``: written and checked the same way in ``target/power_refused/<name>/``
    (the newest three kept), the pointer and versions unchanged (a model the gate did not accept)."""
    from wattcast.models.versioned import install_version

    probe = _probe_features()
    want = model.predict_w(probe)[0]

    def check(folder: Path) -> None:
        back = PowerModel.load(folder)
        got = back.predict_w(probe)[0]
        if back.form != model.form or not np.allclose(got, want, rtol=0, atol=1e-9):
            raise ValueError(f"the power model written to {folder} does not predict what was trained")

    final = install_version(target, _layout(), model.save, check, activate=activate)
    load_power_model.cache_clear()
    return final


def load_power_model(folder: str | None = None) -> PowerModel:
    """The shipped power model (default; or the running entry point's ``power_model=`` / ``--power-model``, else
    ``$WATTCAST_POWER_MODEL``: models/selection.py) or one from ``folder`` (its live version when it holds retrained versions,
    else its flat files); cached per live version. The flagged analytical prior when absent."""
    if not folder:
        from wattcast.models.selection import active_folder

        folder = active_folder("power_model")
    target = resolve_power_folder(Path(folder) if folder else shipped_folder())
    return _load_power_live(str(target))


@lru_cache(maxsize=8)
def _load_power_live(live: str) -> PowerModel:
    if not (Path(live) / MANIFEST).is_file():
        return analytical_model()
    return PowerModel.load(live)


load_power_model.cache_clear = _load_power_live.cache_clear  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------- rest of the timeline
def idle_power_w(spec: DeviceSpec) -> float:
    """Board power with nothing running (spec's ``idle_power_w``, else ``IDLE_FRACTION_OF_TDP`` x TDP)."""
    return device_idle_w(spec)[0]


def comm_power_w(spec: DeviceSpec, power_limit_w: float | None = None, clock_cap_mhz: float | None = None,
                 model: PowerModel | None = None) -> float:
    """GPU power while only communicating or waiting (collectives, pipeline bubbles): see :data:`COMM_DYNAMIC_FRACTION`.
    An SM clock cap lowers its dynamic part as it lowers any kernel's (:func:`apply_clock` at compute utilisation 0:
    the wait's time is not clock-bound); a board power limit then caps it (never below idle).

    Why the cap applies: this power is not idle power but NCCL kernels polling for their peer on a few SMs, clocks up
    (:data:`COMM_DYNAMIC_FRACTION`); under a clock cap (``nvidia-smi -lgc``) those SMs run at the capped clock and a
    lower voltage like every other kernel, so their dynamic power falls, and the static (idle) floor stays. Until stop
    55 a capped step's waits kept the uncapped figure: at 1000 of an H100's 1980 MHz its computation drew 208 W and
    its bubbles 224 W. The model scales all of a kernel's power above idle by the clock law, memory-bound kernels' too
    (their DRAM share does not follow the SM clock), and so it does here: part of this dynamic power is HBM and link
    traffic, which the fraction, an assumption, does not separate. A power limit only binds where the wait draws more
    than it (the clock is lowered only as far as the limit needs: :func:`clock_ratio_for_limit`), hence ``min``."""
    idle = idle_power_w(spec)
    w = idle + COMM_DYNAMIC_FRACTION * (device_tdp_w(spec) - idle)
    if clock_cap_mhz is not None and spec.boost_clock_mhz:
        s = min(float(clock_cap_mhz) / float(spec.boost_clock_mhz), 1.0)
        w = float(apply_clock(1.0, w, s, spec, 0.0, model)[1])
    return w if power_limit_w is None else max(idle, min(w, float(power_limit_w)))


# ---------------------------------------------------------------------------- clock and power limits
def _model(model: PowerModel | None) -> PowerModel:
    return model if model is not None else load_power_model()


def _knee_voltage(s, knee: float, slope: float) -> np.ndarray:
    """V(s) / V_floor: 1 at and below the knee clock ratio, rising ``slope`` per unit of clock ratio above it."""
    return 1.0 + slope * np.maximum(np.asarray(s, dtype=float) - knee, 0.0)


def clock_power_fraction(clock_ratio, model: PowerModel | None = None) -> np.ndarray:
    """The share of a kernel's dynamic power (power above idle, at the boost clock) it draws at ``clock_ratio`` x boost:
    ``s (v(s) / v(1))^2`` under the ``knee`` law (module docstring), ``s ** alpha`` under the ``power`` law. 1 at the boost
    clock, increasing in the clock. Vectorised."""
    m = _model(model)
    s = np.asarray(clock_ratio, dtype=float)
    if m.clock_law == "power":
        return s ** float(m.alpha)
    k, b = float(m.knee_clock_ratio), float(m.voltage_slope)
    return s * (_knee_voltage(s, k, b) / _knee_voltage(1.0, k, b)) ** 2


def clock_ratio_for_fraction(fraction, model: PowerModel | None = None) -> np.ndarray:
    """The clock ratio at which a kernel draws ``fraction`` of its dynamic power (the inverse of
    :func:`clock_power_fraction`; 1 where ``fraction`` >= 1, 0 where it is <= 0; not clipped to the lowest modelled
    clock). Vectorised; the knee law's cubic above the knee is solved by Newton's method from the boost clock (the
    function is increasing and convex there, so the iterates fall monotonically onto the root)."""
    m = _model(model)
    r = np.clip(np.asarray(fraction, dtype=float), 0.0, 1.0)
    if m.clock_law == "power":
        return r ** (1.0 / float(m.alpha))
    k, b = float(m.knee_clock_ratio), float(m.voltage_slope)
    c = r * _knee_voltage(1.0, k, b) ** 2  # s v(s)^2 = c
    s = np.where(c <= k, c, 1.0)  # below the knee v = 1: s = c
    above = c > k
    if above.any():
        x = np.ones(int(above.sum()))
        ca = c[above]
        for _ in range(60):
            v = 1.0 + b * (x - k)
            f = x * v * v - ca
            step = f / (v * v + 2.0 * b * x * v)
            x = np.maximum(x - step, k)
            if np.all(np.abs(step) <= 1e-13):
                break
        s[above] = x
    return s


def time_clock_fraction(compute_util, u_ref: float) -> np.ndarray:
    """phi: the share of a kernel's time that scales as 1/clock."""
    return np.clip(np.asarray(compute_util, dtype=float) / max(u_ref, 1e-6), 0.0, 1.0)


def apply_clock(time_ms, power_w, clock_ratio, spec: DeviceSpec, compute_util, model: PowerModel | None = None):
    """(time_ms, power_w) at SM clock ``clock_ratio`` x boost (<= 1): dynamic power x
    :func:`clock_power_fraction`, compute-bound time / ratio, memory-bound time unchanged. Vectorised."""
    m = _model(model)
    t = np.asarray(time_ms, dtype=float)
    p = np.asarray(power_w, dtype=float)
    s = np.clip(np.asarray(clock_ratio, dtype=float), MIN_CLOCK_RATIO, 1.0)
    idle = idle_power_w(spec)
    phi = time_clock_fraction(compute_util, float(m.u_ref))
    t2 = t * ((1.0 - phi) + phi / s)
    p2 = idle + np.maximum(p - idle, 0.0) * clock_power_fraction(s, m)
    return t2, np.minimum(p2, p)


def clock_ratio_for_limit(power_w, limit_w, spec: DeviceSpec, model: PowerModel | None = None) -> np.ndarray:
    """The clock ratio at which power ``power_w`` (drawn at boost) fits under ``limit_w`` (1 where it fits)."""
    m = _model(model)
    p = np.asarray(power_w, dtype=float)
    idle = idle_power_w(spec)
    lim = np.asarray(limit_w, dtype=float)
    dyn = np.maximum(p - idle, 1e-9)
    head = np.maximum(lim - idle, 0.0)
    s = np.where(p > lim, clock_ratio_for_fraction(head / dyn, m), 1.0)
    return np.clip(s, MIN_CLOCK_RATIO, 1.0)


def _finite_positive(value, name: str, option: str, unit: str) -> float:
    """``value`` as a float, or a ValueError naming the parameter (and its CLI option) and the value."""
    if isinstance(value, bool):
        raise ValueError(f"{name} ({option}) must be a number in {unit}, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} ({option}) must be a number in {unit}, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} ({option}) must be a finite number of {unit} above 0, got {value!r}")
    return v


def lowest_clock_mhz(spec: DeviceSpec) -> float:
    """The lowest SM clock the clock/power-limit model goes to: :data:`MIN_CLOCK_RATIO` x the boost clock."""
    return MIN_CLOCK_RATIO * float(spec.boost_clock_mhz)


def check_power_settings(power_limit_w, clock_cap_mhz, spec: DeviceSpec) -> tuple[float | None, float | None]:
    """``(power_limit_w, clock_cap_mhz)`` as floats (None stays None), or a ValueError naming the parameter.

    Both must be finite and above 0. A clock cap below :func:`lowest_clock_mhz` (``MIN_CLOCK_RATIO`` x boost:
    the model's time and power response is not extrapolated further; drivers rarely go lower under a cap) is
    refused, not clamped: clamping would report the step at a clock the user did not ask for. A cap at or
    above the boost clock does not bind (time and power unchanged)."""
    limit = None if power_limit_w is None else _finite_positive(power_limit_w, "power_limit_w", "--power-limit-w", "W")
    cap = None if clock_cap_mhz is None else _finite_positive(clock_cap_mhz, "clock_cap_mhz", "--clock-cap-mhz", "MHz")
    if cap is not None:
        low = lowest_clock_mhz(spec)
        if cap < low * (1 - 1e-9):
            raise ValueError(
                f"clock_cap_mhz (--clock-cap-mhz) {cap:g} MHz is below the lowest clock wattcast models on {spec.name}: "
                f"{MIN_CLOCK_RATIO:g} x its {float(spec.boost_clock_mhz):g} MHz boost = {low:g} MHz (time and power are "
                f"not extrapolated below it); give a cap of at least {math.ceil(low):g} MHz")
    return limit, cap


def power_setting_notes(power_limit_w, clock_cap_mhz, spec: DeviceSpec) -> list[str]:
    """Notes for settings accepted but without effect (checked values, as :func:`check_power_settings` returns them):
    a clock cap at or above the boost clock, a power limit above the TDP (the board's own limit: no kernel is
    predicted above it, so a higher one never binds; raising a board's limit past its TDP is not modelled). The
    prediction paths put them in ``warnings``: a user who typed a cap expects it to act, or to be told it did not.
    Also for settings whose figures are known to be biased (stop 56, audit 56d finding 1): a clock cap below the lowest
    fitted clock (:data:`FITTED_MIN_CLOCK_RATIO`), a power limit at or below :data:`DEEP_LIMIT_TDP_FRACTION` of the TDP."""
    notes = []
    if clock_cap_mhz is not None and spec.boost_clock_mhz and clock_cap_mhz < FITTED_MIN_CLOCK_RATIO * float(spec.boost_clock_mhz):
        notes.append(f"clock_cap_mhz (--clock-cap-mhz) {clock_cap_mhz:g} MHz is below {FITTED_MIN_CLOCK_RATIO:.2f} x the "
                     f"{spec.name}'s {float(spec.boost_clock_mhz):g} MHz boost clock, the lowest clock the power-vs-clock "
                     "law was fitted at (Perseus A100 sweeps, 855 of 1410 MHz): power is extrapolated and likely "
                     "under-predicted there (measured power falls only linearly with the clock below ~0.78 x boost), so "
                     "the energy saved is likely over-stated")
    if power_limit_w is not None and spec.tdp_w and power_limit_w <= DEEP_LIMIT_TDP_FRACTION * float(spec.tdp_w):
        notes.append(f"power_limit_w (--power-limit-w) {power_limit_w:g} W is at most {DEEP_LIMIT_TDP_FRACTION:g} x the "
                     f"{spec.name}'s {float(spec.tdp_w):g} W TDP: at such limits measured steps took longer and saved less "
                     "energy than wattcast predicts (Zeus BERT-base runs: time ratio bias -20% on a V100 PCIe, -31% on a "
                     "Quadro RTX 6000; energy ratio bias -13% / -22%; benchmarks/power_limits.py), and a board that is already "
                     "power-throttled without a limit slows more under any limit (README: power limits)")
    if clock_cap_mhz is not None and spec.boost_clock_mhz and clock_cap_mhz >= float(spec.boost_clock_mhz):
        notes.append(f"clock_cap_mhz (--clock-cap-mhz) {clock_cap_mhz:g} MHz is at or above the {spec.name}'s "
                     f"{float(spec.boost_clock_mhz):g} MHz boost clock: it does not bind (time and power as uncapped)")
    if power_limit_w is not None and spec.tdp_w and power_limit_w > float(spec.tdp_w):
        notes.append(f"power_limit_w (--power-limit-w) {power_limit_w:g} W is above the {spec.name}'s {float(spec.tdp_w):g} W "
                     "TDP: it does not bind (kernels are predicted at or under the TDP; a board limit raised past it "
                     "is not modelled)")
    return notes


def power_at_lowest_clock_w(power_w, spec: DeviceSpec, compute_util=0.0, model: PowerModel | None = None) -> np.ndarray:
    """What kernels drawing ``power_w`` at boost draw at the lowest modelled clock (:func:`lowest_clock_mhz`):
    the least board power any power limit can bring them to. Vectorised."""
    p = np.asarray(power_w, dtype=float)
    return apply_clock(np.ones(p.shape), p, MIN_CLOCK_RATIO, spec, compute_util, model)[1]


def check_power_limit_attainable(limit_w: float, power_w, spec: DeviceSpec, compute_util=0.0,
                                 model: PowerModel | None = None, what: str = "this step") -> None:
    """Refuse a power limit no clock can meet: below the idle power, or below what the most power-hungry of
    the kernels (``power_w`` at boost) still draws at the lowest modelled clock. Under a limit at or above
    that floor every kernel fits (idle gaps draw idle power, below it), so a step's average power stays
    under the limit it is reported with."""
    p = np.asarray(power_w, dtype=float).reshape(-1)
    floor = float(idle_power_w(spec))
    if p.size:
        floor = max(floor, float(np.max(power_at_lowest_clock_w(p, spec, compute_util, model))))
    if limit_w < floor * (1 - 1e-9):
        raise ValueError(
            f"power_limit_w (--power-limit-w) {limit_w:g} W is below the {floor:.1f} W the {spec.name} draws running "
            f"{what} at its lowest clock ({MIN_CLOCK_RATIO:g} x its {float(spec.boost_clock_mhz):g} MHz boost = "
            f"{lowest_clock_mhz(spec):g} MHz; idle alone is {idle_power_w(spec):.0f} W): no clock meets it; give a "
            f"limit of at least {math.ceil(floor):g} W")


def apply_power_limit(time_ms, power_w, limit_w, spec: DeviceSpec, compute_util, model: PowerModel | None = None,
                      clock_cap_mhz: float | None = None):
    """(time_ms, power_w) under a board power limit ``limit_w`` (W; None = TDP, no change) and an optional
    SM clock cap. Where the predicted power exceeds the limit the clock drops until it fits
    (:func:`clock_ratio_for_limit`), then :func:`apply_clock` moves time and power; a limit below what the
    lowest clock (:data:`MIN_CLOCK_RATIO`) allows leaves power above it here (measured runs are replayed
    through this); the prediction paths refuse such a limit first (:func:`check_power_limit_attainable`).
    ``limit_w`` and ``clock_cap_mhz`` are checked by :func:`check_power_settings` (finite, above 0, cap not
    below the lowest modelled clock). Vectorised over kernels.

    Applied per kernel this assumes the power controller reacts within a kernel; for a steady workload
    pass the step's average power and average compute utilisation instead."""
    limit_w, clock_cap_mhz = check_power_settings(limit_w, clock_cap_mhz, spec)
    t = np.asarray(time_ms, dtype=float)
    p = np.asarray(power_w, dtype=float)
    s = np.ones(np.broadcast(t, p).shape)
    if clock_cap_mhz is not None:
        s = np.minimum(s, float(clock_cap_mhz) / float(spec.boost_clock_mhz))
    if limit_w is not None:
        # the power the kernel would draw at the capped clock, then the ratio to get under the limit
        _, p_cap = apply_clock(t, p, s, spec, compute_util, model)
        s = s * clock_ratio_for_limit(p_cap, limit_w, spec, model)
    return apply_clock(t, p, s, spec, compute_util, model)
