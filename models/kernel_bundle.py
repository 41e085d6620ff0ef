"""A trained set of kernel surrogates (one per op family) and the manifest that describes it.

On disk (``models/artifacts/`` for the shipped bundle, any folder for a retrained one):
- ``kernel_manifest.json``: schema version, per-family feature list, the chosen model
  (``lgbm`` | ``mlp`` | ``ens``), band quantiles, training support ranges, fallback offset, metrics;
- ``kernel_<family>.lgbm.txt``: LightGBM text models;
- ``kernel_mlp.safetensors``: MLP weights, keys ``<family>/<array>``.
Nothing is pickled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wattcast.featurize.kernel_features import DEVICE_FEATURES
from wattcast.models.kernel_surrogates import LGBMSurrogate, MLPSurrogate, RooflineSurrogate

MANIFEST = "kernel_manifest.json"
MLP_FILE = "kernel_mlp.safetensors"
BUNDLE_SCHEMA = 1
#: widen the band (in log space) for out-of-distribution rows
OOD_BAND_FACTOR = 2.0
#: tolerance on support ranges, as a fraction of the range
SUPPORT_SLACK = 0.02


@dataclass
class FamilyModel:
    family: str
    features: list[str]
    choice: str  # lgbm | mlp | ens | roofline
    band_log: tuple[float, float]  # quantiles of log(measured / predicted) on unseen devices
    support: dict[str, tuple[float, float]]  # feature -> (min, max) over training rows
    fallback_offset: float
    lgbm: LGBMSurrogate | None = None
    mlp: MLPSurrogate | None = None

    def predict_log_ratio(self, X: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Return (log ratio, ensemble spread >= 0)."""
        preds = {}
        if self.lgbm is not None and self.choice in ("lgbm", "ens"):
            preds["lgbm"] = self.lgbm.predict(X)
        if self.mlp is not None and self.choice in ("mlp", "ens"):
            preds["mlp"] = self.mlp.predict(X)
        if not preds:
            return RooflineSurrogate(self.fallback_offset).predict(X), np.zeros(len(X))
        stack = np.vstack(list(preds.values()))
        spread = np.abs(stack[0] - stack[-1]) / 2 if len(stack) > 1 else np.zeros(len(X))
        return stack.mean(axis=0), spread

    def ood_mask(self, X: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(shape_ood, device_ood): a feature outside the training support (NaN device figures excluded)."""
        shape_ood = np.zeros(len(X), dtype=bool)
        dev_ood = np.zeros(len(X), dtype=bool)
        for f, (lo, hi) in self.support.items():
            if f not in X:
                continue
            v = X[f].to_numpy(dtype=float)
            slack = SUPPORT_SLACK * max(hi - lo, 1e-9)
            out = (v < lo - slack) | (v > hi + slack)
            if f in DEVICE_FEATURES:
                dev_ood |= out
            else:
                shape_ood |= out
        return shape_ood, dev_ood


@dataclass
class KernelBundle:
    families: dict[str, FamilyModel]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def train_devices(self) -> list[str]:
        return list(self.meta.get("train_devices", []))

    def save(self, folder: Path) -> None:
        from safetensors.numpy import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        fams = {}
        tensors: dict[str, np.ndarray] = {}
        for name, fm in self.families.items():
            entry = {
                "features": fm.features,
                "choice": fm.choice,
                "band_log": list(fm.band_log),
                "support": {k: list(v) for k, v in fm.support.items()},
                "fallback_offset": fm.fallback_offset,
                "lgbm": None,
                "mlp": fm.mlp is not None,
            }
            if fm.lgbm is not None:
                fn = f"kernel_{name}.lgbm.txt"
                fm.lgbm.save(folder / fn)
                entry["lgbm"] = fn
            if fm.mlp is not None:
                for k, v in fm.mlp.weights().items():
                    tensors[f"{name}/{k}"] = v
            fams[name] = entry
        if tensors:
            save_file(tensors, str(folder / MLP_FILE))
        manifest = {"schema": BUNDLE_SCHEMA, "families": fams, **self.meta}
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))

    @classmethod
    def load(cls, folder: Path) -> "KernelBundle":
        folder = Path(folder)
        mpath = folder / MANIFEST
        if not mpath.is_file():
            raise FileNotFoundError(f"no kernel surrogate manifest at {mpath}")
        manifest = json.loads(mpath.read_text())
        if manifest.get("schema") != BUNDLE_SCHEMA:
            raise ValueError(f"{mpath}: bundle schema {manifest.get('schema')} is not {BUNDLE_SCHEMA}")
        tensors: dict[str, np.ndarray] = {}
        if (folder / MLP_FILE).is_file():
            from safetensors.numpy import load_file

            tensors = load_file(str(folder / MLP_FILE))
        fams = {}
        for name, e in manifest["families"].items():
            lg = LGBMSurrogate.load(folder / e["lgbm"], e["features"]) if e.get("lgbm") else None
            mlp = None
            if e.get("mlp"):
                w = {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith(name + "/")}
                mlp = MLPSurrogate(e["features"], w)
            fams[name] = FamilyModel(
                family=name,
                features=list(e["features"]),
                choice=e["choice"],
                band_log=tuple(e["band_log"]),
                support={k: tuple(v) for k, v in e["support"].items()},
                fallback_offset=float(e["fallback_offset"]),
                lgbm=lg,
                mlp=mlp,
            )
        meta = {k: v for k, v in manifest.items() if k not in ("schema", "families")}
        return cls(fams, meta)


def shipped_folder() -> Path:
    return Path(str(files("wattcast.models") / "artifacts"))


@lru_cache(maxsize=8)
def load_bundle(folder: str | None = None) -> KernelBundle:
    """The shipped bundle (default) or one from ``folder``; cached per folder."""
    return KernelBundle.load(Path(folder) if folder else shipped_folder())
