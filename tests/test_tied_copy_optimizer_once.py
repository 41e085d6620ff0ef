"""The optimizer step over a tied word embedding's copy on a pipeline's last stage (simulate/distributed.py
``_tied_copy_optimizer``): its time and its energy come from one evaluation per (rank view, chunking, pp), kept with
the copy's parameters, not one for the stage memory and another for the stage energy."""

from __future__ import annotations

import dataclasses

import pytest

import wattcast.simulate.distributed as dist
from wattcast.simulate.distributed import schedule_context, schedule_step
from wattcast.simulate.options import DistributedOptions
from wattcast.simulate.parallel import ParallelConfig

TIED = {"model_type": "gpt2", "n_embd": 1024, "n_head": 16, "n_layer": 8, "n_positions": 2048, "vocab_size": 50257,
        "activation_function": "gelu", "tie_word_embeddings": True, "_name_or_path": "gpt-small-tied-once"}


def _counting(monkeypatch) -> list:
    calls = []
    real = dist._tied_copy_optimizer

    def counted(view, tied_params):
        calls.append(tied_params)
        return real(view, tied_params)

    monkeypatch.setattr(dist, "_tied_copy_optimizer", counted)
    return calls


def _ctx(par: ParallelConfig):
    return schedule_context(TIED, "DGX-A100", par, DistributedOptions(batch=par.dp * par.pp * 2, seq=1024, dtype="bf16",
                                                                       attention="eager", framework="megatron"))


def test_one_evaluation_per_step(monkeypatch):
    calls = _counting(monkeypatch)
    r = schedule_step(_ctx(ParallelConfig(gpus=8, tp=2, pp=2, dp=2, micro_batch=1)))
    assert r.fits and calls == [r.comm["tied_embedding_copy_params"]] and calls[0] > 0
    # the copy's optimizer time is on the last stage only (the first stage holds the embedding itself)
    assert r.per_device[-1]["busy_ms"] > 0


def test_one_evaluation_per_view_and_pipeline_in_a_search_memo(monkeypatch):
    """Several strategies over one view and one pp (another micro-batch split, a schedule's detail): evaluated once."""
    calls = _counting(monkeypatch)
    memo: dict = {}
    par = ParallelConfig(gpus=8, tp=2, pp=2, dp=2, micro_batch=1)
    ctx = dataclasses.replace(_ctx(par), detail=False, summary=True, memo=memo)
    first = schedule_step(ctx)
    again = schedule_step(ctx)
    assert len(calls) == 1
    assert again.step_time_ms == first.step_time_ms and again.energy_j == first.energy_j


def test_no_copy_without_a_pipeline(monkeypatch):
    calls = _counting(monkeypatch)
    schedule_step(_ctx(ParallelConfig(gpus=8, tp=2, pp=1, dp=4, micro_batch=1)))
    assert calls == []


@pytest.mark.parametrize("pp", [2, 4])
def test_the_copys_optimizer_time_and_energy_are_both_counted(pp):
    """The figures the step adds are the pair one evaluation returns: the last stage's optimizer ms and J grow by it."""
    par = ParallelConfig(gpus=2 * pp, tp=1, pp=pp, dp=2, micro_batch=1)
    ctx = _ctx(par)
    with_copy = schedule_step(ctx)
    meta = {k: v for k, v in ctx.g.meta.items() if k != "tied_output_params"}
    without = schedule_step(dataclasses.replace(ctx, g=dataclasses.replace(ctx.g, meta=meta)))
    assert with_copy.energy_j > without.energy_j
    assert with_copy.per_device[-1]["busy_ms"] > without.per_device[-1]["busy_ms"]
