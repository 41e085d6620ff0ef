"""PyTorch FSDP's gradient reduce-scatter dtype (framework hf, ZeRO-3): ``MixedPrecision.reduce_dtype``. Hugging Face
Accelerate 1.15 sets it to the parameters' dtype for ``mixed_precision="bf16"`` (``accelerate/utils/dataclasses.py``
``set_mixed_precision``: ``{"param_dtype": dtype, "reduce_dtype": dtype}``), torch's ``MixedPrecision`` does the same
when it is None (torch 2.13 ``torch/distributed/fsdp/api.py``), Composer's ``PURE`` too, its ``DEFAULT`` reduces in
fp32 (``composer/distributed/mosaic_parallelism.py`` ``get_mixed_precision``). Until stop 41 every hf run reduced fp32
gradients (4 B), twice the bytes."""

from __future__ import annotations

import numpy as np
import pytest

import wattcast
from wattcast.simulate.distributed import collective_model

KW = dict(gpus=16, batch=32, seq=1024, micro_batch=2, zero=3, attention="flash", dtype="bf16", framework="hf")


class Recording:
    """The shipped collective model, recording each DP-group (16-rank) call's (op, bytes)."""

    def __init__(self):
        self.inner, self.calls = collective_model(), []

    def predict_us_memo(self, op, size, n, gpus_per_node, cluster, **kw):
        if n == 16:
            self.calls.extend((op, float(b)) for b in np.atleast_1d(size))
        return self.inner.predict_us_memo(op, size, n, gpus_per_node, cluster, **kw)


def _sizes(**kw):
    from wattcast.simulate.distributed import predict_distributed
    from wattcast.simulate.options import DistributedOptions
    from wattcast.simulate.parallel import ParallelConfig

    rec = Recording()
    par = ParallelConfig(gpus=16, dp=16, micro_batch=2, zero=3)
    predict_distributed("gpt2-medium", "DGX-A100", par, DistributedOptions(
        batch=32, seq=1024, dtype="bf16", attention="flash", framework="hf", coll_model=rec, **kw))
    ag = {b for op, b in rec.calls if op == "all_gather"}
    rs = {b for op, b in rec.calls if op == "reduce_scatter"}
    # one unit's forward gather and its backward re-gather (smaller: without the root unit, kept gathered through the
    # backward since stop 58), one unit's reduce-scatter
    assert len(ag) == 2 and len(rs) == 1 and min(ag) < max(ag)
    return max(ag), rs.pop()


def test_fsdp_reduces_bf16_gradients_by_default_and_fp32_when_told():
    ag, rs = _sizes()
    assert rs == pytest.approx(ag, rel=1e-12)  # the unit's bf16 parameters gathered, its bf16 gradients reduced
    ag32, rs32 = _sizes(fsdp_reduce_dtype="fp32")  # Composer's mixed_precision: DEFAULT
    assert ag32 == ag and rs32 == pytest.approx(2 * ag, rel=1e-12)


def test_the_step_moves_with_it_and_bad_values_are_named():
    bf16 = wattcast.predict_cluster("gpt2-medium", "DGX-A100", **KW)
    fp32 = wattcast.predict_cluster("gpt2-medium", "DGX-A100", fsdp_reduce_dtype="fp32", **KW)
    assert fp32.comm["dp_zero3_ms_per_micro"] > bf16.comm["dp_zero3_ms_per_micro"]
    assert fp32.step_time_ms > bf16.step_time_ms
    assert bf16.to_dict()["settings"]["fsdp_reduce_dtype"] is None
    # DDP (ZeRO-0) all-reduces PyTorch AMP's fp32 .grad: the option does not change it
    ddp = [wattcast.predict_cluster("gpt2-medium", "DGX-A100", **dict(KW, zero=0), fsdp_reduce_dtype=d).step_time_ms
           for d in (None, "bf16")]
    assert ddp[0] == ddp[1]
    with pytest.raises(ValueError, match="fsdp_reduce_dtype must be one of"):
        wattcast.predict_cluster("gpt2-medium", "DGX-A100", fsdp_reduce_dtype="int8", **KW)
    with pytest.raises(ValueError, match="needs framework hf"):
        wattcast.predict_cluster("gpt2-medium", "DGX-A100", fsdp_reduce_dtype="fp32", **dict(KW, framework="megatron"))


def test_mpt_rows_reduce_in_their_mode():
    from wattcast.validation.mpt_validation import MP_MODE_REDUCE_DTYPE, mpt_reduce_dtype

    class Row:
        mp_mode = "DEFAULT"

    assert mpt_reduce_dtype(Row()) == "fp32" and MP_MODE_REDUCE_DTYPE["PURE"] is None


def test_search_takes_it_for_every_fsdp_candidate_as_predict_does():
    kw = dict(max_configs=40, zero=(3,), tp=(1,), pp=(1,))
    plain = wattcast.search("gpt2-medium", "DGX-A100", 16, 32, 1024, **kw).ranked
    fp32 = wattcast.search("gpt2-medium", "DGX-A100", 16, 32, 1024, fsdp_reduce_dtype="fp32", **kw).ranked
    assert len(plain) and len(plain) == len(fp32)
    m = plain.merge(fp32, on="strategy", suffixes=("_bf16", "_fp32"))
    assert len(m) == len(plain) and (m["step_time_ms_fp32"] > m["step_time_ms_bf16"]).all()
    # a row is the step predict_cluster gives that strategy with the same option
    row = fp32.iloc[0]
    one = wattcast.predict_cluster("gpt2-medium", "DGX-A100", gpus=16, batch=32, seq=1024, strategy=row["strategy"],
                                   framework="hf", fsdp_reduce_dtype="fp32")
    assert one.step_time_ms == pytest.approx(row["step_time_ms"], rel=1e-9)
    with pytest.raises(ValueError, match="fsdp_reduce_dtype must be one of"):
        wattcast.search("gpt2-medium", "DGX-A100", 16, 32, 1024, fsdp_reduce_dtype="int8", **kw)
    with pytest.raises(ValueError, match="needs framework hf"):
        wattcast.search("gpt2-medium", "DGX-A100", 16, 32, 1024, fsdp_reduce_dtype="fp32", framework="megatron", **kw)


def test_search_cli_and_sweep_spec_take_it(monkeypatch):
    """The search command passes it on (its space has no ZeRO-3 candidates unless asked through the API, so the flag
    is checked by what reaches wattcast.search) and names a bad value; a sweep spec carries it into its tasks."""
    from typer.testing import CliRunner

    import wattcast.cli as cli
    from wattcast.sweep import SweepSpecError, load_spec

    args = ["search", "--model", "gpt2-medium", "--cluster", "DGX-A100", "--gpus", "16", "--batch", "32", "--seq",
            "1024", "--max-configs", "1", "--workers", "1", "--json"]
    seen = {}
    real = wattcast.search

    def spy(*a, **kw):
        seen.update(kw)
        return real(*a, **kw)

    monkeypatch.setattr(wattcast, "search", spy)
    ok = CliRunner().invoke(cli.app, [*args, "--fsdp-reduce-dtype", "fp32"])
    assert ok.exit_code == 0, ok.output
    assert seen["fsdp_reduce_dtype"] == "fp32"
    bad = CliRunner().invoke(cli.app, [*args, "--fsdp-reduce-dtype", "int8"])
    assert bad.exit_code != 0 and "fsdp_reduce_dtype must be one of" in " ".join(bad.output.split())

    spec = dict(models=["gpt2-medium"], clusters=["DGX-A100"], gpus=[16], batch=32, seq=1024)
    plain, fp32 = load_spec(spec).tasks()[0], load_spec(dict(spec, fsdp_reduce_dtype="fp32")).tasks()[0]
    assert "fsdp_reduce_dtype" not in plain and fp32["fsdp_reduce_dtype"] == "fp32"
    assert fp32["task_id"] != plain["task_id"]
    with pytest.raises(SweepSpecError, match="fsdp_reduce_dtype must be one of"):
        load_spec(dict(spec, fsdp_reduce_dtype="int8"))
    with pytest.raises(SweepSpecError, match="needs framework hf"):
        load_spec(dict(spec, fsdp_reduce_dtype="fp32", framework="megatron"))


def test_fsdp_reduce_dtype_is_read_as_dtype_is_and_named_where_it_does_nothing():
    """Review mends (stop 41): 'FP32' / 'float32' are fp32 as --dtype reads them; a value given where it changes
    nothing (ZeRO below 3, fp32 training) is a warning, not silence; a single-device request refuses it as it refuses
    the other cluster-only options."""
    import wattcast
    from wattcast.request import PredictRequest
    from wattcast.simulate.distributed import checked_fsdp_reduce_dtype

    assert checked_fsdp_reduce_dtype("hf", "FP32") == "fp32" and checked_fsdp_reduce_dtype("hf", "float32") == "fp32"
    kw = dict(model="gpt2", cluster="DGX-A100", batch=16, seq=512, dtype="bf16")
    a = wattcast.predict_cluster(**kw, gpus=8, zero=3, fsdp_reduce_dtype="FP32")
    b = wattcast.predict_cluster(**kw, gpus=8, zero=3, fsdp_reduce_dtype="fp32")
    assert a.step_time_ms == b.step_time_ms
    z1 = wattcast.predict_cluster(**kw, gpus=8, zero=1, fsdp_reduce_dtype="fp32")
    assert any("no effect at ZeRO-1" in w for w in z1.meta["warnings"])
    with pytest.raises(ValueError, match="cluster="):
        PredictRequest(model="gpt2", device="A100-SXM4-80GB", batch=1, seq=128, fsdp_reduce_dtype="fp32").predict()
