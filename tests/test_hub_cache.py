"""Hugging Face Hub ids (``org/name``) resolved from the local Hub cache (issue 18): the cache layout huggingface_hub
writes, built by hand in tmp_path; no network and no huggingface_hub needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, flat, run_cli

from wattcast.featurize.hf_config import load_hf_config
from wattcast.featurize.hub_cache import HubCacheError, cached_config, hub_cache_dir, parse_hub_id
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph

REPO_ID = "acme-ai/Tiny-Llama-0.1B"
MAIN = "a" * 40
OLD = "b" * 40


def _llama(layers: int) -> dict:
    d = json.loads((REPO / "featurize" / "hf_configs" / "llama2_7b.json").read_text())
    return dict(d, num_hidden_layers=layers, _name_or_path=REPO_ID)


def _fake_cache(hub: Path, repo: str = REPO_ID, snapshots: dict | None = None, main: str | None = MAIN) -> Path:
    """The layout huggingface_hub writes: blobs/<sha>, snapshots/<commit>/config.json -> ../../blobs/<sha>,
    refs/main holding the commit."""
    entry = hub / ("models--" + repo.replace("/", "--"))
    (entry / "blobs").mkdir(parents=True)
    (entry / "refs").mkdir()
    for i, (commit, cfg) in enumerate((snapshots or {MAIN: _llama(2), OLD: _llama(3)}).items()):
        blob = entry / "blobs" / f"{i:040x}"
        blob.write_text(json.dumps(cfg))
        snap = entry / "snapshots" / commit
        snap.mkdir(parents=True)
        (snap / "config.json").symlink_to(Path("..") / ".." / "blobs" / blob.name)
    if main is not None:
        (entry / "refs" / "main").write_text(main)  # no trailing newline, as huggingface_hub writes it
    return entry


@pytest.fixture()
def hub(tmp_path, monkeypatch) -> Path:
    for k in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf" / "hub"


def test_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    for k in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache_dir() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert hub_cache_dir() == tmp_path / "cache"


@pytest.mark.parametrize("text,parsed", [
    ("meta-llama/Llama-3.1-8B", ("meta-llama/Llama-3.1-8B", None)),
    ("Qwen/Qwen3-8B@v1.0", ("Qwen/Qwen3-8B", "v1.0")),
    ("gpt2", ("gpt2", None)),
    ("some/dir/config.json", None), ("x/model.onnx", None), ("../x", None), ("/abs/path", None), ("a/b/c", None),
])
def test_hub_id_shape(text, parsed):
    assert parse_hub_id(text) == parsed


def test_refs_main_picks_the_snapshot(hub):
    entry = _fake_cache(hub)
    assert cached_config(REPO_ID) == entry / "snapshots" / MAIN / "config.json"
    cfg = load_hf_config(REPO_ID)
    assert cfg.n_layers == 2 and cfg.name == "Tiny-Llama-0.1B"  # main's snapshot, not the other one
    # refs/main moves to the other snapshot: the next look-up follows it
    (entry / "refs" / "main").write_text(OLD + "\n")
    assert load_hf_config(REPO_ID).n_layers == 3
    # a commit hash or another ref with @
    assert load_hf_config(f"{REPO_ID}@{MAIN}").n_layers == 2
    (entry / "refs" / "v2").write_text(MAIN)
    assert load_hf_config(f"{REPO_ID}@v2").n_layers == 2


def test_hub_id_graph_is_the_config_files_graph(hub, tmp_path):
    entry = _fake_cache(hub)
    opts = StepOptions(batch=1, seq=128, mode="train")
    by_id = step_graph(REPO_ID, opts)
    by_file = step_graph(str(entry / "snapshots" / MAIN / "config.json"), opts)
    assert by_id.meta["name"] == "Tiny-Llama-0.1B"
    assert by_id.param_count == by_file.param_count and len(by_id) == len(by_file)
    assert by_id.nodes["flops"].tolist() == by_file.nodes["flops"].tolist()


def test_missing_hub_id_says_where_it_looked_and_how_to_get_it(hub):
    with pytest.raises(HubCacheError) as e:
        load_hf_config("meta-llama/Llama-3.1-8B")
    msg = str(e.value)
    assert str(hub / "models--meta-llama--Llama-3.1-8B") in msg
    assert "huggingface-cli download meta-llama/Llama-3.1-8B config.json" in msg and "HF_HUB_CACHE" in msg
    assert isinstance(e.value, GraphError)  # the CLI's and API's model errors
    # a bare unknown name keeps the built-in message (and mentions the cache)
    with pytest.raises(GraphError, match="not a file and not a built-in model.*Hub id in the local Hub cache"):
        load_hf_config("no_such_model")


def test_bare_hub_name_in_the_cache(hub):
    _fake_cache(hub, repo="tiny-bare", snapshots={MAIN: _llama(2)})
    assert load_hf_config("tiny-bare").n_layers == 2
    assert load_hf_config("gpt2").n_layers == 12  # built-ins come first


def test_broken_cache_entries_are_named(hub):
    entry = _fake_cache(hub, main=None)
    with pytest.raises(HubCacheError, match=r"refs/main is missing.*snapshots there: a+, b+.*@HASH"):
        load_hf_config(REPO_ID)
    (entry / "refs" / "main").write_text("not a hash")
    with pytest.raises(HubCacheError, match="does not hold a commit hash"):
        load_hf_config(REPO_ID)
    (entry / "refs" / "main").write_text(MAIN)
    (entry / "snapshots" / MAIN / "config.json").resolve().unlink()  # the symlink's blob was never downloaded
    with pytest.raises(HubCacheError, match=f"snapshot {MAIN} has no config.json"):
        load_hf_config(REPO_ID)
    with pytest.raises(HubCacheError, match="refs/nope is missing"):
        load_hf_config(f"{REPO_ID}@nope")


def test_cli_predicts_a_cached_hub_id_and_refuses_a_missing_one(hub, monkeypatch):
    entry = _fake_cache(hub)
    args = ("-d", "h100", "--batch", "1", "--seq", "128", "--json")
    r = run_cli("predict", "-m", REPO_ID, *args)
    assert r.returncode == 0, r.stderr
    f = run_cli("predict", "-m", entry / "snapshots" / MAIN / "config.json", *args)
    assert json.loads(r.stdout)["step_time_ms"] == json.loads(f.stdout)["step_time_ms"]
    r = run_cli("predict", "-m", "meta-llama/Llama-3.1-8B", *args)
    err = flat(r.stderr)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "models--meta-llama--Llama-3.1-8B" in err and "huggingface-cli download" in err
