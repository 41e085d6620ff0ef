"""An fp8 step runs everything but its linear GEMMs in bf16: a spec without peak_bf16_tflops is refused for it."""

from __future__ import annotations
import dataclasses

import pytest

import wattcast
from conftest import run_cli
from wattcast.data.catalog import resolve_device
from wattcast.data.device_spec import peak_ratio_notes, unsupported_step_dtype


# ------------------------------------------------------------------ 3. an fp8 step needs a BF16 peak
@pytest.mark.parametrize("drop", [dict(peak_bf16_tflops=None), dict(peak_bf16_tflops=None, peak_fp16_tflops=None)])
def test_fp8_step_refused_without_a_bf16_peak(drop):
    spec = dataclasses.replace(resolve_device("H100-SXM5-80GB"), **drop)
    assert "peak_bf16_tflops" in unsupported_step_dtype(spec, "fp8")
    with pytest.raises(ValueError, match="peak_bf16_tflops"):
        wattcast.predict("gpt2", spec, batch=1, seq=128, dtype="fp8")
    with pytest.raises(ValueError, match="peak_bf16_tflops"):
        wattcast.predict_cluster("gpt2", "DGX-H100", device=spec, gpus=8, batch=8, seq=128, dtype="fp8")
    assert any("without peak_bf16_tflops" in n for n in peak_ratio_notes(spec))
    assert unsupported_step_dtype(resolve_device("H100-SXM5-80GB"), "fp8") is None


def test_fp8_step_refused_for_a_spec_file_without_bf16(tmp_path):
    src = resolve_device("H100-SXM5-80GB")
    p = tmp_path / "nobf16.yaml"
    import yaml

    d = {k: v for k, v in dataclasses.asdict(src).items() if v is not None and k not in ("aliases", "sources")}
    d.update(name="NoBF16", schema_version=1)
    d.pop("peak_bf16_tflops", None)
    p.write_text(yaml.safe_dump(d))
    r = run_cli("predict", "-m", "gpt2", "-d", str(p), "--batch", "1", "--seq", "128", "--dtype", "fp8", "--force")
    assert r.returncode != 0 and "peak_bf16_tflops" in r.stdout + r.stderr
