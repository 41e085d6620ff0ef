"""Sweep spec keys ``optimizer`` and ``optimizer_impl`` reach each task's search (the same step time as
wattcast.search with them) and its task id; bad values are refused before any task runs."""

from __future__ import annotations

import pytest

import wattcast
from wattcast.sweep import SweepSpecError, load_spec, read_sweep, run_sweep

SPACE = dict(tp=[2], pp=[1], zero=[1], sp=[True], micro_batch=[1], recompute=["none"], interleave=[1])
SPEC = dict(models=["llama3_8b"], clusters=["DGX-H100"], gpus=[8], batch=16, seq=2048, framework="megatron",
            max_configs=5, top=1, space=SPACE)


def test_optimizer_impl_reaches_the_rows_as_search_gives_them(tmp_path):
    rows = {}
    for impl in ("fused", "foreach"):
        df = read_sweep(run_sweep(dict(SPEC, optimizer_impl=impl), tmp_path / impl, workers=0).output)
        assert df["status"].iloc[0] == "ok", df["error"].iloc[0]
        rows[impl] = df["step_time_ms"].iloc[0]
        ref = wattcast.search("llama3_8b", "DGX-H100", 8, 16, 2048, framework="megatron", max_configs=5,
                              optimizer_impl=impl, **SPACE)
        assert rows[impl] == pytest.approx(ref.ranked["step_time_ms"].iloc[0], rel=1e-12)
    assert rows["foreach"] > rows["fused"]  # 8 passes over the fp32 state against one

    df = read_sweep(run_sweep(dict(SPEC, optimizer="sgd"), tmp_path / "sgd", workers=0).output)
    ref = wattcast.search("llama3_8b", "DGX-H100", 8, 16, 2048, framework="megatron", max_configs=5,
                          optimizer="sgd", **SPACE)
    assert df["step_time_ms"].iloc[0] == pytest.approx(ref.ranked["step_time_ms"].iloc[0], rel=1e-12)


def test_optimizer_keys_in_the_task_and_its_id_only_when_given():
    plain = load_spec(SPEC).tasks()[0]
    impl = load_spec(dict(SPEC, optimizer_impl="Foreach")).tasks()[0]
    opt = load_spec(dict(SPEC, optimizer="SGD")).tasks()[0]
    assert "optimizer" not in plain and "optimizer_impl" not in plain
    assert impl["optimizer_impl"] == "foreach" and opt["optimizer"] == "sgd"
    assert len({plain["task_id"], impl["task_id"], opt["task_id"]}) == 3
    # "adam" is costed as AdamW (training_graph.optimizer_key): one canonical name, one task id
    adam, adamw = (load_spec(dict(SPEC, optimizer=o)).tasks()[0] for o in ("adam", "AdamW"))
    assert adam["optimizer"] == adamw["optimizer"] == "adamw" and adam["task_id"] == adamw["task_id"]


@pytest.mark.parametrize("patch, needle", [
    (dict(optimizer="lamb"), "'optimizer': unknown optimizer 'lamb'"),
    (dict(optimizer_impl="apex"), "'optimizer_impl': unknown optimizer implementation 'apex'"),
    (dict(optimizer="adamw-bf16", optimizer_impl="foreach"), "'optimizer_impl': optimizer adamw-bf16"),
    (dict(optimizer_ipml="fused"), "optimizer_impl"),  # a typo is an unknown key with a hint
])
def test_bad_optimizer_values_are_refused(patch, needle):
    with pytest.raises(SweepSpecError, match=needle):
        load_spec(dict(SPEC, **patch))
