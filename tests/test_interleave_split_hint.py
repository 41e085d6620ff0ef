"""First/last stage layers that do not divide by --interleave are refused (Megatron-Core 0.16.1's rule on
num_layers_in_first/last_pipeline_stage); since the issue-15 audit (stop 50) the refusal says what wattcast's automatic
split builds for the model and which Megatron-Core flags express it, so Meta's Llama 3 405B layout (7, 8 x 14, 7 over
16 stages) is not called inexpressible."""

from __future__ import annotations

import pytest

from wattcast.simulate.parallel import ParallelConfigError, account_split_chunks, chunk_layers


def _refusal(*args, **kw) -> str:
    with pytest.raises(ParallelConfigError) as e:
        chunk_layers(*args, **kw)
    return str(e.value)


def test_llama3_405b_first_last_7_with_interleave_names_the_automatic_split():
    msg = _refusal(126, 16, 2, first=7, last=7)
    assert "stage 0 has 7" in msg  # the rule itself is kept
    assert ("Leave out --pp-first-stage-layers/--pp-last-stage-layers: wattcast's automatic split of the model's 126 "
            "layers gives stages [7, 8 x 14, 7] as 32 virtual-stage chunks [3, 4 x 30, 3]") in msg
    assert "stage 0's virtual stages 3 + 4, stage 15's 4 + 3" in msg
    assert ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split" in msg
            and "--pipeline-model-parallel-layout" in msg)
    # and that automatic split is what the hint says (the stages Meta ran)
    auto = chunk_layers(126, 16, 2)
    assert auto == [3] + [4] * 30 + [3] == account_split_chunks(126, 32)
    assert [auto[s] + auto[16 + s] for s in range(16)] == [7] + [8] * 14 + [7]


def test_hint_names_only_the_layout_when_the_account_flags_do_not_build_it():
    msg = _refusal(126, 16, 3, first=7, last=7)  # 128 does not divide by 48 chunks
    assert "account-for" not in msg and "built with" not in msg
    assert msg.endswith("Megatron-Core builds this split with --pipeline-model-parallel-layout")
    msg = _refusal(80, 4, 2, first=21, last=19)  # 80 layers split evenly by default
    assert msg.endswith("[10 x 8] in pipeline order (stage 0's virtual stages 10 + 10, stage 3's 10 + 10); "
                        "Megatron-Core's default even split (no flag)")


def test_account_split_chunks_follows_megatron_core():
    assert account_split_chunks(126, 16) == [7] + [8] * 14 + [7]
    assert account_split_chunks(126, 48) is None  # (126 + 2) % 48: Megatron-Core refuses
    assert account_split_chunks(2, 4) is None  # a chunk with no layer
