"""Hugging Face Hub ids (``meta-llama/Llama-3.1-8B``) resolved from the local Hub cache, without the network and
without ``huggingface_hub``.

The cache layout is the one ``huggingface_hub`` writes (``huggingface-cli download``, ``from_pretrained``)::

    <cache>/models--<org>--<name>/refs/main              the commit hash the branch points at
    <cache>/models--<org>--<name>/snapshots/<hash>/config.json

``<cache>`` is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub`` (the order ``huggingface_hub`` uses). ``org/name@REV`` picks another branch or tag
(``refs/REV``) or a commit hash (``snapshots/REV``); without ``@`` the snapshot is the one ``refs/main`` names.
Nothing is downloaded: a model that is not in the cache is an error saying where wattcast looked and how to get
the file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from wattcast.featurize.op_graph import GraphError

#: ``org/name`` or ``name``, optionally ``@revision``: the characters the Hub allows in repo ids and revisions
_HUB_ID = re.compile(r"^(?:(?P<org>[A-Za-z0-9][\w.-]*)/)?(?P<name>[A-Za-z0-9][\w.-]*)(?:@(?P<rev>[\w.\-/]+))?$")


_FILE_SUFFIXES = (".json", ".onnx", ".yaml", ".yml", ".pt", ".bin", ".safetensors")


class HubCacheError(GraphError):
    """A Hub id whose config.json is not in the local cache (or the cache entry is broken)."""


def hub_cache_dir() -> Path:
    """The Hub cache folder, from the environment as ``huggingface_hub`` reads it."""
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HUGGINGFACE_HUB_CACHE"):  # the older name, still honoured by huggingface_hub
        return Path(env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    xdg = env.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def parse_hub_id(model: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) when ``model`` is shaped like a Hub id (``org/name``, ``org/name@rev``; a bare
    ``name`` too), else None; a file name (``x/config.json``, ``m.onnx``) is not. The shape alone says nothing about
    the cache."""
    m = _HUB_ID.match(str(model).strip())
    if m is None or m.group("name") in (".", "..") or m.group("name").lower().endswith(_FILE_SUFFIXES):
        return None
    repo = f"{m.group('org')}/{m.group('name')}" if m.group("org") else m.group("name")
    return repo, m.group("rev")


def _repo_folder(repo: str) -> str:
    return "models--" + repo.replace("/", "--")


def _how_to_get(repo: str, rev: str | None) -> str:
    rev_opt = f" --revision {rev}" if rev else ""
    return (f"download it with `huggingface-cli download {repo} config.json{rev_opt}` (or `hf download ...`) on a "
            f"machine with network access and copy the cache folder, set HF_HUB_CACHE / HF_HOME to the cache that has "
            f"it, or pass the config.json file itself (--model path/to/config.json)")


def repo_name(model: str) -> str:
    """The name part of a Hub id (``Llama-3.1-8B`` of ``meta-llama/Llama-3.1-8B@main``): what a model folder's name
    would be."""
    parsed = parse_hub_id(model)
    return parsed[0].rsplit("/", 1)[-1] if parsed else str(model)


def cached_config(model: str, *, required: bool = True) -> Path | None:
    """The cached ``config.json`` of the Hub id ``model``; None when ``model`` is not shaped like a Hub id or, with
    ``required=False``, when the cache has no entry for it. With ``required`` (the default) a Hub-shaped id that is
    not in the cache raises :class:`HubCacheError` naming the folder looked in and how to get the file."""
    parsed = parse_hub_id(model)
    if parsed is None:
        return None
    repo, rev = parsed
    cache = hub_cache_dir()
    entry = cache / _repo_folder(repo)
    where = f"{model}: Hugging Face Hub id"
    if not entry.is_dir():
        if not required:
            return None
        raise HubCacheError(f"{model}: not a file and not a built-in model, and as a Hugging Face Hub id not in the local "
                            f"Hub cache (looked for {entry}; the cache is $HF_HUB_CACHE, else $HF_HOME/hub, else "
                            f"~/.cache/huggingface/hub; wattcast never downloads): " + _how_to_get(repo, rev))
    ref_name = rev or "main"
    ref = entry / "refs" / ref_name
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
        if not re.fullmatch(r"[0-9a-fA-F]{7,64}", commit):
            raise HubCacheError(f"{where}: {ref} does not hold a commit hash (got {commit[:80]!r}); the cache entry is "
                                f"broken: " + _how_to_get(repo, rev))
    elif rev is not None and (entry / "snapshots" / rev).is_dir():
        commit = rev  # a commit hash given directly
    else:
        snaps = sorted(p.name for p in (entry / "snapshots").glob("*") if p.is_dir())
        have = f" (snapshots there: {', '.join(snaps)}; pass {repo}@HASH to pick one)" if snaps else ""
        raise HubCacheError(f"{where}: {ref} is missing, so no snapshot is known as {ref_name!r}{have}; "
                            + _how_to_get(repo, rev))
    config = entry / "snapshots" / commit / "config.json"
    if not config.is_file():  # missing, or a symlink to a blob that was never downloaded
        raise HubCacheError(f"{where}: snapshot {commit} has no config.json (looked for {config}); "
                            + _how_to_get(repo, rev))
    return config
