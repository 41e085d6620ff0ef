"""Switch Transformers' expert rows are the tokens the router keeps, each computed once
(``featurize.hf_switch.switch_processed_tokens``, split over the hit experts by ``expert_row_split``).

Fails on the code before stop 55's fix, which gave every local expert ``expert_capacity`` rows when the config set one
(google/switch-base-8: 64, so 8 x 64 = 512 rows for any batch and sequence: 512 for 16 tokens, 512 for 8 x 512 = 4,096)
and ``round(tokens / num_experts)`` rows when it did not (8 x 2 = 16 rows for 13 tokens, 8 x 13 = 104 for 100), and
under sequence parallelism the shard's tokens only. transformers' router caps each expert at ``expert_capacity`` tokens
per sequence (cumsum along the sequence) and the experts gather exactly the kept tokens: balanced top-1 routing keeps
min(capacity, seq // n or one more) per expert and sequence, all the tokens without a capacity.
"""

from __future__ import annotations

import json

import pytest

import wattcast
from wattcast.featurize.hf_config import _BUILTIN_DIR
from wattcast.featurize.hf_switch import switch_processed_tokens
from wattcast.featurize.op_graph import GraphError
from wattcast.featurize.workload import StepOptions, step_graph
from wattcast.simulate.single_device import model_flops

EXPERT_OUT = r"experts\.\d+\.wo$"  # each expert's last GEMM: its rows once
EXPERT_GEMM = r"experts\.\d+\.(wi(_0|_1)?|wo)(\.dgrad|\.wgrad)?$"  # forward and backward GEMMs


def _config(capacity: int | None) -> dict:
    raw = json.loads((_BUILTIN_DIR / "switch_base_8.json").read_text())
    raw["_name_or_path"] = f"switch_base_8_cap{capacity}"
    if capacity is None:
        raw.pop("expert_capacity")
    else:
        raw["expert_capacity"] = capacity
    return raw


def _expert_rows(g) -> dict[int, float]:
    n = g.nodes
    m = n[(n["phase"] == "forward") & n["name"].astype(str).str.match(EXPERT_OUT)]
    assert len(m), "no expert GEMMs in the graph"
    return (m["B"] * m["M"]).groupby(m["layer"]).sum().round(6).to_dict()


def test_processed_tokens():
    assert switch_processed_tokens(3, 13, 8, None) == 39  # no capacity: every token
    assert switch_processed_tokens(1, 16, 8, 64) == 16  # under the capacity: every token
    assert switch_processed_tokens(2, 1000, 8, 64) == 2 * 8 * 64  # 125 a sequence over 64: 61 dropped per expert
    # 13 tokens over 8 experts: 5 experts take 2, 3 take 1; capacity 1 keeps 8 of a sequence
    assert switch_processed_tokens(4, 13, 8, 1) == 4 * 8
    assert switch_processed_tokens(1, 3, 8, 1) == 3  # fewer tokens than experts
    with pytest.raises(GraphError, match="batch"):
        switch_processed_tokens(0, 3, 8, None)


@pytest.mark.parametrize("capacity", [None, 64, 4])
def test_rows_add_up_to_the_kept_tokens(capacity):
    cfg = _config(capacity)
    n_sparse = cfg["num_sparse_encoder_layers"] + cfg["num_sparse_decoder_layers"]
    for batch in (1, 2, 3, 5):
        for seq in (1, 7, 13, 16, 100, 127, 512, 600):
            want = switch_processed_tokens(batch, seq, 8, capacity)
            if capacity is None:
                assert want == batch * seq
            g = step_graph(cfg, StepOptions(batch=batch, seq=seq, mode="train", dtype="bf16"))
            rows = _expert_rows(g)
            assert len(rows) == n_sparse and set(rows.values()) == {want}, (batch, seq, rows)


@pytest.mark.parametrize("tp,sp,ep", [(2, True, 1), (2, False, 2), (1, False, 4), (4, True, 2)])
def test_parallel_rank_rows(tp, sp, ep):
    # one rank's graph: its batch's kept tokens, over the full sequence under sequence parallelism (the dispatch
    # buffer's gather); expert parallelism: a balanced all-to-all receives as many rows as the rank sends
    for capacity in (None, 64):
        for batch, seq in ((1, 16), (3, 100), (2, 1000)):
            g = step_graph(_config(capacity), StepOptions(batch=batch, seq=seq, mode="train", dtype="bf16", tp=tp,
                                                          sp=sp, ep=ep))
            assert set(_expert_rows(g).values()) == {switch_processed_tokens(batch, seq, 8, capacity)}, (batch, seq)


@pytest.mark.parametrize("capacity,batch,seq", [(None, 3, 100), (None, 1, 13), (64, 4, 512), (64, 2, 600)])
def test_expert_model_flops(capacity, batch, seq):
    # the MFU numerator's expert part: 6 x kept tokens x one expert's parameters (2 x d_model x d_ff) in every sparse
    # layer; without a capacity 6 x tokens x the active (top-1) expert parameters
    cfg = _config(capacity)
    r = wattcast.predict(cfg, "H100", batch=batch, seq=seq, mode="train")
    n = r.nodes
    exp = n[n["name"].astype(str).str.match(EXPERT_GEMM) & (n["op_class"] == "linear")]
    n_sparse = cfg["num_sparse_encoder_layers"] + cfg["num_sparse_decoder_layers"]
    kept = switch_processed_tokens(batch, seq, 8, capacity)
    want = 6 * n_sparse * kept * 2 * cfg["d_model"] * cfg["d_ff"]
    assert model_flops(exp)[0] == pytest.approx(want, rel=1e-12)
