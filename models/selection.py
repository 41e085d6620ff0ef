"""Which trained models a prediction uses: the shipped ones, or folders a user retrained into.

``wattcast train kernels|collectives|power --out FOLDER`` writes a versioned folder (a pointer file naming the live
version, models/versioned.py) or, for older trainings, a flat one. Three settings choose the folders a prediction
reads, each resolved as **argument > environment variable > shipped** (``models/artifacts/`` in the package):

============  =====================================  ==========================  ============================
model         CLI flag                               Python keyword              environment variable
============  =====================================  ==========================  ============================
kernels       ``--models FOLDER``                    ``models=``                 ``WATTCAST_MODELS``
collectives   ``--collectives FOLDER``               ``collectives=``            ``WATTCAST_COLLECTIVES``
power         ``--power-model FOLDER``               ``power_model=``            ``WATTCAST_POWER_MODEL``
============  =====================================  ==========================  ============================

The public entry points (``wattcast.predict``, ``predict_cluster``, ``search``, ``run_sweep``, the CLI commands that
predict steps) resolve and check the folders once (:func:`resolve_folders`: a folder that is missing or holds no such
model is a :class:`ModelFolderError` naming it and the file that is missing) and run under :func:`using_folders`,
which every default load (``load_bundle()``, ``load_collective_model()``, ``load_power_model()``) consults first.
A search's worker processes get the resolved paths (never the loaded objects) and enter the same context, so they
load the very same versions.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

#: setting -> (environment variable, what the folder holds, the training command that writes one)
KINDS = {
    "models": ("WATTCAST_MODELS", "kernel bundle", "wattcast train kernels --out"),
    "collectives": ("WATTCAST_COLLECTIVES", "collective model", "wattcast train collectives --out"),
    "power_model": ("WATTCAST_POWER_MODEL", "power model", "wattcast train power --out"),
}

_ACTIVE: ContextVar = ContextVar("wattcast_model_folders", default=None)


class ModelFolderError(ValueError):
    """A model folder given by a flag, a keyword or an environment variable that holds no usable model."""


@dataclass(frozen=True)
class ModelFolders:
    """The live folders (absolute paths) of the three models a prediction uses; None: the shipped one. Picklable and
    hashable: what a search's workers get and what its caches key on."""

    models: str | None = None
    collectives: str | None = None
    power_model: str | None = None

    def given(self) -> dict:
        return {k: v for k, v in (("models", self.models), ("collectives", self.collectives),
                                  ("power_model", self.power_model)) if v is not None}


def _env_folder(kind: str) -> str | None:
    v = os.environ.get(KINDS[kind][0], "").strip()
    return v or None


def active_folder(kind: str) -> str | None:
    """The folder a default load of ``kind`` reads: the running entry point's (:func:`using_folders`), else the
    environment variable's, else None (the shipped model). The environment's is checked as the entry points check
    theirs (a bad one is a :class:`ModelFolderError`, never a silent fallback)."""
    cur = _ACTIVE.get()
    if cur is not None:
        return getattr(cur, kind)
    env = _env_folder(kind)
    return None if env is None else check_folder(kind, env, KINDS[kind][0])


def _label(kind: str, source: str | None) -> str:
    return source or kind + "="


def check_folder(kind: str, folder, source: str | None = None) -> str:
    """``folder`` checked to hold a usable ``kind`` model (loaded once, so a damaged file is found here): the live
    version's absolute path. A :class:`ModelFolderError` names the folder, where it came from (``source``: a flag,
    keyword or environment variable) and what is missing."""
    env, what, train = KINDS[kind]
    where = f"{source}={folder}" if source == env else f"{_label(kind, source)} {folder}"
    p = Path(str(folder)).expanduser()
    if not p.exists():
        raise ModelFolderError(f"{where}: no such folder (a {what} folder is what `{train} FOLDER` writes)")
    if not p.is_dir():
        raise ModelFolderError(f"{where} is a file; give the folder `{train} FOLDER` wrote")
    p = p.resolve()
    try:
        live = _LIVE[kind](p)
    except (OSError, ValueError) as e:
        raise ModelFolderError(f"{where}: {e}") from None
    manifest = live / _MANIFEST[kind]()
    if not manifest.is_file():
        raise ModelFolderError(f"{where} holds no {what}: {manifest.name} is missing"
                               + (f" from {live}" if live != p else "") + f" (`{train} {folder}` writes one)")
    try:
        _LOAD[kind](str(live))
    except Exception as e:  # noqa: BLE001 - a damaged model file: LightGBM, safetensors and JSON errors alike
        raise ModelFolderError(f"{where}: the {what} cannot be used: {e}") from None
    return str(live)


def resolve_folders(models=None, collectives=None, power_model=None, *, labels: dict | None = None,
                    kinds=tuple(KINDS)) -> ModelFolders:
    """The three settings resolved (argument > environment variable > shipped) and checked (:func:`check_folder`).
    ``labels``: the names to give each argument in errors (a CLI passes its flags). ``kinds``: the settings to
    resolve (a command that reads only the kernel bundle leaves the others shipped, unchecked)."""
    labels = labels or {}
    out = {}
    for kind, given in (("models", models), ("collectives", collectives), ("power_model", power_model)):
        if kind not in kinds:
            out[kind] = None
        elif given is not None and str(given).strip():
            out[kind] = check_folder(kind, given, labels.get(kind))
        elif (env := _env_folder(kind)) is not None:
            out[kind] = check_folder(kind, env, KINDS[kind][0])
        else:
            out[kind] = None
    return ModelFolders(**out)


@contextmanager
def using_folders(folders: ModelFolders | None):
    """Run the block with ``folders`` as the models every default load reads (None: leave the current setting)."""
    if folders is None:
        yield
        return
    token = _ACTIVE.set(folders)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def current_folders() -> ModelFolders:
    """The folders the running code reads (the active entry point's, else the environment's, checked)."""
    cur = _ACTIVE.get()
    return cur if cur is not None else resolve_folders()


def manifest_path(kind: str, live) -> Path:
    """The manifest of the ``kind`` model in the live folder ``live``."""
    return Path(live) / _MANIFEST[kind]()


def _live_bundle(p: Path) -> Path:
    from wattcast.models.kernel_bundle import resolve_bundle_folder

    return resolve_bundle_folder(p)


def _live_collectives(p: Path) -> Path:
    from wattcast.models.collectives import resolve_collective_folder

    return resolve_collective_folder(p)


def _live_power(p: Path) -> Path:
    from wattcast.models.power import resolve_power_folder

    return resolve_power_folder(p)


def _load_bundle(live: str):
    from wattcast.models.kernel_bundle import _load_live

    return _load_live(live)


def _load_collectives(live: str):
    from wattcast.models.collectives import CollectiveModel, _load_collective_live

    m = _load_collective_live(live)
    if m.booster is None:  # the shipped loader's alpha-beta fallback: a user's folder must hold a model
        CollectiveModel.load(live)  # raises, naming what is wrong
        raise ValueError(m.fallback_reason or "no usable model")
    return m


def _load_power(live: str):
    from wattcast.models.power import _load_power_live

    return _load_power_live(live)


def _manifest_bundle() -> str:
    from wattcast.models.kernel_bundle import MANIFEST

    return MANIFEST


def _manifest_collectives() -> str:
    from wattcast.models.collectives import MANIFEST

    return MANIFEST


def _manifest_power() -> str:
    from wattcast.models.power import MANIFEST

    return MANIFEST


_LIVE = {"models": _live_bundle, "collectives": _live_collectives, "power_model": _live_power}
_LOAD = {"models": _load_bundle, "collectives": _load_collectives, "power_model": _load_power}
_MANIFEST = {"models": _manifest_bundle, "collectives": _manifest_collectives, "power_model": _manifest_power}
