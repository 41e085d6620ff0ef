"""Transformer Engine's attention backend under Megatron-Core and the attention output it keeps for backward
(featurize/te_attention.py): cuDNN's FusedAttention (sm90+) hands linear_proj a view of the output it saves, so the
output is kept once; FlashAttention (sm80) hands it a ``contiguous()`` copy of the (b, s, h, d) output transposed to
(s, b, h*d), a second copy at micro-batch > 1 and the same storage at micro-batch 1."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from wattcast.data.catalog import resolve_device
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.te_attention import attention_output_shared, te_attention_backend
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.memory import activation_bytes_by_layer

sys.path.insert(0, str(Path(__file__).parent))
from test_megatron_memory import TABLE3, _cfg  # noqa: E402  (Korthikanti's Table 3 GPT configs)

S = 2048


@pytest.mark.parametrize("device,backend", [("A100 80GB SXM", "flash"), ("L40S", "flash"), ("H100 SXM", "fused"),
                                            ("B200", "fused"), ("MI300X", "flash")])
def test_backend_follows_te_get_attention_backend(device, backend):
    # utils.py l. 1893-1898: FusedAttention preferred from sm90; below it FlashAttention 2; unknown capability: "flash"
    assert te_attention_backend(resolve_device(device)) == backend


def test_output_shared_rule():
    assert attention_output_shared("fused", 4, 1, 128, 128)
    assert attention_output_shared("fused", 1, 1, 192, 128)  # MLA under cuDNN: a view still
    assert attention_output_shared("flash", 1, 1, 128, 128)
    assert not attention_output_shared("flash", 2, 1, 128, 128)  # the transpose's contiguous() copies
    assert not attention_output_shared("flash", 1, 1, 192, 128)  # TE pads v and trims the output: a copy
    # context parallelism (since stop 50): the ring's and allgather's functions save the tensor they return, the
    # all-to-all ones save the output before their all-to-all
    assert attention_output_shared("fused", 1, 2, 128, 128)
    assert attention_output_shared("fused", 2, 4, 128, 128, cp_comm="allgather")
    assert attention_output_shared("flash", 1, 2, 128, 128, cp_comm="p2p")
    assert not attention_output_shared("flash", 2, 2, 128, 128)
    assert not attention_output_shared("fused", 1, 2, 128, 128, cp_comm="a2a")
    assert not attention_output_shared("fused", 1, 4, 128, 128, cp_comm="a2a+p2p", cp_a2a=2)
    # a2a+p2p whose all-to-all group is 1 runs no all-to-all (TE: the a2a branches need cp_size_a2a > 1): the ring's
    assert attention_output_shared("fused", 1, 4, 128, 128, cp_comm="a2a+p2p", cp_a2a=1)
    assert not attention_output_shared("fused", 1, 4, 128, 128, cp_comm="a2a", cp_a2a=1)  # a2a: its group is cp


def test_flash_attn_wrapper_copy_only_above_micro_batch_one():
    """The premise, on torch itself: TE's FlashAttention returns ``out.view(b, s, -1).transpose(0, 1).contiguous()``
    (backends.py l. 1428, 1436): the same storage at b == 1, a new one at b > 1."""
    torch = pytest.importorskip("torch")
    for b, same in ((1, True), (2, False)):
        out = torch.randn(b, 16, 4, 8)
        ret = out.view(b, 16, -1).transpose(0, 1).contiguous()
        assert (ret.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()) is same


def _layer_sbh_over_t(backend: str, batch: int, recompute: str, *, framework: str = "megatron", cp: int = 1,
                      cp_comm: str = "p2p", cp_a2a: int = 1) -> float:
    """One layer's saved activations over s b h / t, s the tokens of a rank (S / cp of the model's S positions;
    StepOptions.seq is the rank's)."""
    d = TABLE3["gpt3_175b"]
    s_rank = S // cp
    opts = StepOptions(batch=batch, seq=s_rank, mode="train", dtype="bf16", attention="flash", recompute=recompute,
                       framework=framework, tp=d["t"], sp=True, te_attention_backend=backend, cp=cp, cp_comm=cp_comm,
                       cp_a2a=cp_a2a)
    per_layer, _ = activation_bytes_by_layer(step_graph(_cfg("gpt3_175b"), opts, blocks=3))
    return per_layer[1] / (s_rank * batch * d["h"] / d["t"])


# Korthikanti et al. 2022's 34 sbh/t (Table 2, SP) with the 5as/h score terms gone under a fused kernel, plus its fp32
# log-sum-exp: 4 bytes x a/t heads x s x b = 4a/h sbh/t (GPT-3 175B: 96 heads, hidden 12,288 -> 0.03125)
LSE = 4 * 96 / 12288


@pytest.mark.parametrize("backend,batch,want", [("fused", 1, 34 + LSE), ("fused", 2, 34 + LSE),
                                                ("flash", 1, 34 + LSE), ("flash", 2, 36 + LSE)])
def test_gpt3_layer_keeps_the_output_as_te_does(backend, batch, want):
    # before stop 46 every case came out 36.03: the output counted twice whatever the backend and micro-batch
    assert _layer_sbh_over_t(backend, batch, "none") == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("backend,batch,cp,comm,a2a,want", [
    ("fused", 1, 2, "p2p", 1, 34 + LSE), ("fused", 2, 4, "allgather", 1, 34 + LSE), ("flash", 1, 2, "p2p", 1, 34 + LSE),
    ("flash", 2, 2, "p2p", 1, 36 + LSE), ("fused", 1, 2, "a2a", 2, 36 + LSE), ("fused", 1, 4, "a2a+p2p", 2, 36 + LSE)])
def test_context_parallel_layer_keeps_the_output_as_te_does(backend, batch, cp, comm, a2a, want):
    """Under context parallelism a rank's layer keeps what a cp 1 layer of its s / cp tokens keeps (Korthikanti's
    34 sbh/t less the scores plus the log-sum-exp, s the rank's tokens) with the KV ring and allgather: their TE
    functions save the output they return (TE 2.20.2 context_parallel.py). Until stop 50 every CP case counted it
    twice (36 + LSE): Llama 3 405B at 128k, CP16, 68.01 GB of activations on stage 1 against 63.98 at 8k, CP1."""
    assert _layer_sbh_over_t(backend, batch, "none", cp=cp, cp_comm=comm, cp_a2a=a2a) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("backend", ["flash", "fused"])
def test_selective_recomputation_unchanged(backend):
    assert _layer_sbh_over_t(backend, 2, "selective") == pytest.approx(34.0, rel=1e-9)


def test_megatron_deepspeed_keeps_the_old_count():
    # Megatron-DeepSpeed runs flash-attn itself, not through TE: not covered, two copies as before
    assert _layer_sbh_over_t("fused", 1, "none", framework="megatron-deepspeed") == pytest.approx(36 + LSE, rel=1e-9)


def test_backend_option_checked_and_normalised():
    with pytest.raises(GraphError):
        StepOptions(te_attention_backend="cudnn", framework="megatron", attention="flash").validated()
    # only Megatron-Core's flash attention in training reads it: elsewhere one cache key
    assert StepOptions(te_attention_backend="fused", framework="hf").validated().te_attention_backend == "flash"
    assert (StepOptions(te_attention_backend="fused", framework="megatron", attention="flash", mode="train")
            .validated().te_attention_backend == "fused")


def test_predict_distributed_takes_the_backend_from_the_device():
    """The same Megatron step on DGX A100 (FlashAttention 2) and DGX H100 (cuDNN) at micro-batch 2: the H100 keeps
    the attention output once (2 bytes x s x b x h/t a layer less), the A100 twice; step times are not touched here."""
    from wattcast.simulate.distributed import predict_distributed
    from wattcast.simulate.options import DistributedOptions
    from wattcast.simulate.parallel import ParallelConfig

    cfg = dict(_cfg("gpt3_175b"), n_embd=1024, n_head=16, n_layer=8, _name_or_path="gpt_small_te")
    act, inflight = {}, set()
    for cl in ("dgx-a100", "dgx-h100"):
        r = predict_distributed(cfg, cl, ParallelConfig(gpus=8, tp=2, pp=2, sp=True, micro_batch=2),
                                DistributedOptions(batch=16, seq=S, dtype="bf16", attention="flash",
                                                   framework="megatron"))
        act[cl] = r.memory["activations_gb"]
        inflight.add((r.memory["stage"], r.memory["inflight_chunks"]))
    assert len(inflight) == 1  # the same worst stage, the same micro-batches in flight
    per_layer_gb = 2 * S * 2 * 1024 / 2 / 1e9  # bf16 x s x b x h / t
    layers = inflight.pop()[1] * 4  # its 4 layers per micro-batch in flight
    assert act["dgx-a100"] - act["dgx-h100"] == pytest.approx(layers * per_layer_gb, rel=1e-6)
