"""Every top-level key of `predict --json` (one device, training and inference) is named in README.md's key list."""

from __future__ import annotations

from pathlib import Path

import pytest

import wattcast

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.parametrize("mode", ["train", "inference"])
def test_every_top_level_predict_json_key_is_documented(mode):
    d = wattcast.predict("gpt2", "H100-SXM5-80GB", batch=1, seq=128, mode=mode).to_dict()
    text = README.read_text()
    missing = [k for k in d if f"`{k}`" not in text]
    assert missing == [], f"undocumented predict --json keys: {missing}"
    assert "ood_time_fraction" in d
