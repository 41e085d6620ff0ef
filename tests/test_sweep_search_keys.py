"""A sweep's rows carry their search's ``warnings`` and ``unranked_clusters`` (JSON text of what ``wattcast search
--json`` gives under those keys), and the CLI's ``--json`` gives them back as search does."""

from __future__ import annotations

import json

import wattcast
from conftest import flat, run_cli
from wattcast.sweep import SEARCH_KEYS, part_columns, read_sweep, run_sweep, search_keys, summary

# pythia-160m: rotary positions up to 2,048 (seq 4,096 warns); FP8 on A100s: no valid strategy
SPEC = dict(models=["pythia_160m"], clusters=["DGX-A100", "DGX-H100"], gpus=[8], batch=8, seq=4096, dtype="fp8",
            max_configs=2, space=dict(tp=[1], pp=[1], zero=[1]))


def _search(cluster):
    return wattcast.search("pythia_160m", cluster, 8, 8, 4096, dtype="fp8", max_configs=2, tp=[1], pp=[1], zero=[1],
                           attention="flash", framework="hf", workers=1)


def test_sweep_rows_carry_the_searchs_warnings_and_unranked_clusters(tmp_path):
    df = read_sweep(run_sweep(SPEC, tmp_path / "s.parquet", workers=0).output)
    assert list(df.columns) == part_columns(False)
    a100, h100 = (df[df["cluster"] == c] for c in ("DGX-A100", "DGX-H100"))
    assert set(a100["status"]) == {"no valid strategy"} and set(h100["status"]) == {"ok"}
    for rows, cluster in ((a100, "DGX-A100"), (h100, "DGX-H100")):
        res = _search(cluster)
        assert any("max_position_embeddings" in w for w in res.warnings)
        for v in rows["warnings"]:
            assert search_keys(v) == list(res.warnings)
        for v in rows["unranked_clusters"]:
            assert search_keys(v) == res.unranked_clusters()
    assert list(search_keys(a100["unranked_clusters"].iloc[0])) == ["DGX-A100"]
    assert search_keys(h100["unranked_clusters"].iloc[0]) == {}
    assert set(SEARCH_KEYS) <= set(summary(df).columns)


def test_sweep_cli_gives_them_as_search_does(tmp_path):
    import yaml

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    r = run_cli("sweep", spec, "--output", tmp_path / "o", "--workers", "0", "--json")
    assert r.returncode == 0, r.stderr
    best = {b["cluster"]: b for b in json.loads(r.stdout)["best"]}
    assert list(best["DGX-A100"]["unranked_clusters"]) == ["DGX-A100"] and best["DGX-H100"]["unranked_clusters"] == {}
    assert all(any("max_position_embeddings" in w for w in b["warnings"]) for b in best.values())
    t = run_cli("sweep", spec, "--output", tmp_path / "o", "--workers", "0")  # resumed: the notes from the parts
    assert t.returncode == 0, t.stderr
    out = flat(t.stdout)
    assert "cluster DGX-A100 has no valid strategy:" in out and "beyond max_position_embeddings" in out
