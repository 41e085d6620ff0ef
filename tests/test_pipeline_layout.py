"""An uneven pipeline split and how Megatron-Core builds it (audit 59a finding 1).

Megatron-Core 0.16.1 without a split flag asserts ``num_layers % pipeline_model_parallel_size == 0`` and, under a
virtual pipeline, every stage's layers % vp == 0 (transformer/transformer_block.py ``get_num_layers_to_build``
l. 155-157, l. 174-176); its ``--pipeline-model-parallel-layout`` (transformer/pipeline_parallel_layer_layout.py) sets
every chunk's count and so builds any split. wattcast's automatic split of layers that do not divide (Llama 3 8B's 32
on 3 stages x 2 virtual stages: chunks 5, 6, 5, 6, 6, 4) was silent (``warnings`` []) and ``search`` ranked it first
without saying it needs a flag. Now: a warning naming the flags (--pp-first/last-stage-layers when they build it, else
the layout), ``parallel.pipeline_layout`` in the JSON and a ``pipeline_layout`` search column, and a layers column in
the text per-stage table. The layout strings below were checked with Megatron-Core 0.16.1's own parser
(``PipelineParallelLayerLayout(s, pp)``: its chunks' decoder counts, ``validate_layer_layout(num_layers, None)``)."""
import json

import pytest
from typer.testing import CliRunner

import wattcast
from wattcast.cli import app
from wattcast.simulate.parallel import (chunk_layers, first_last_flags_for, pipeline_layout_string,
                                        pipeline_split_report)
from wattcast.sweep import TEXT_COLUMNS

KW = dict(gpus=6, gpus_per_node=6, batch=12, seq=4096, pp=3, interleave=2, zero=1, micro_batch=1)
LAYOUT_32_3_2 = "Et*5|t*6|t*5|(t*6|)*2t*4L"


def test_layout_strings_in_megatron_syntax():
    assert pipeline_layout_string([5, 6, 5, 6, 6, 4]) == LAYOUT_32_3_2
    assert pipeline_layout_string([13, 14, 14, 14, 14, 14, 13]) == "Et*13|(t*14|)*5t*13L"
    assert pipeline_layout_string([6, 7, 7, 7, 7, 7, 7, 7, 7, 6, 6, 6]) == "Et*6|(t*7|)*8(t*6|)*2t*6L"
    assert pipeline_layout_string([1, 2, 1]) == "Et|t*2|tL"
    assert pipeline_layout_string([4]) == "Et*4L"


def test_first_last_flags_where_they_build_the_split():
    assert first_last_flags_for([13] + [14] * 5 + [13], 96, 7) == (13, 13)
    assert first_last_flags_for([10, 11, 11], 32, 3) == (10, None)
    assert first_last_flags_for([11, 11, 10], 32, 3) == (None, 10)
    # 32 on 3 x 2: stages 11, 12, 9 (11 and 9 do not divide by 2), nor 80 on 4 x 3 (20 per stage, 20 % 3)
    assert first_last_flags_for([5, 6, 5, 6, 6, 4], 32, 3, 2) is None
    assert first_last_flags_for(chunk_layers(80, 4, 3), 80, 4, 3) is None
    # what the flags give is the split they were found for
    assert chunk_layers(96, 7, first=13, last=13) == [13] + [14] * 5 + [13]


def test_report_only_for_an_automatic_uneven_split():
    assert pipeline_split_report([8] * 4, 32, 4) == (None, [])
    assert pipeline_split_report([32], 32, 1) == (None, [])
    # given first/last flags: the layout, no warning
    layout, notes = pipeline_split_report([10, 11, 11], 32, 3, explicit=True)
    assert layout == "Et*10|t*11|t*11L" and notes == []
    # another framework: no layout, the split said
    layout, notes = pipeline_split_report([5, 6, 5, 6, 6, 4], 32, 3, 2, framework="hf")
    assert layout is None and len(notes) == 1 and "stages [11, 12, 9]" in notes[0]
    assert "pipeline-model-parallel-layout" not in notes[0]
    # megatron-deepspeed refuses --pp-first/last-stage-layers (DeepSpeed partitions the stages): not offered
    layout, notes = pipeline_split_report([3, 2, 3, 2, 2], 12, 5, framework="megatron-deepspeed")
    assert layout is None and "stages [3, 2, 3, 2, 2] (DeepSpeed's PipelineModule" in notes[0]
    assert "--pp-first-stage-layers" not in notes[0]
    layout, notes = pipeline_split_report([13] + [14] * 5 + [13], 96, 7, framework="megatron")
    assert "--pp-first-stage-layers 13 --pp-last-stage-layers 13" in notes[0]
    assert "--decoder-first-pipeline-num-layers 13" in notes[0] and "96 % 7" in notes[0]


def test_predict_warns_and_gives_the_layout():
    r = wattcast.predict_cluster("llama3_8b", "DGX-H100", framework="megatron", **KW)
    d = r.to_dict()
    assert d["parallel"]["stage_layers"] == [5, 6, 5, 6, 6, 4]  # the split itself is unchanged
    assert d["parallel"]["pipeline_layout"] == LAYOUT_32_3_2
    w = [x for x in d["warnings"] if "do not divide" in x]
    assert len(w) == 1 and f'--pipeline-model-parallel-layout "{LAYOUT_32_3_2}"' in w[0]
    assert "32 % 3" in w[0] and "stages [11, 12, 9]" in w[0]
    # the flags' split: no warning, the layout still given (it is uneven)
    given = wattcast.predict_cluster("llama3_8b", "DGX-H100", framework="megatron", pp_first_stage_layers=10,
                                     pp_last_stage_layers=10, **KW).to_dict()
    assert given["parallel"]["stage_layers"] == [5, 6, 5, 5, 6, 5]
    assert given["parallel"]["pipeline_layout"] == "Et*5|t*6|(t*5|)*2t*6|t*5L"
    assert not [x for x in given["warnings"] if "do not divide" in x]
    # hf keeps its split and says what it is, with no Megatron flag
    hf = wattcast.predict_cluster("llama3_8b", "DGX-H100", framework="hf", gpus=6, gpus_per_node=6, batch=12,
                                  seq=4096, pp=3, micro_batch=1).to_dict()
    assert hf["parallel"]["pipeline_layout"] is None
    w = [x for x in hf["warnings"] if "do not divide" in x]
    assert len(w) == 1 and f"stages [{', '.join(map(str, hf['parallel']['stage_layers']))}]" in w[0]


def test_even_split_has_no_layout_and_no_warning():
    d = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=16, seq=4096, tp=2, pp=4, zero=1,
                                 micro_batch=1, framework="megatron").to_dict()
    assert d["parallel"]["pipeline_layout"] is None
    assert not [x for x in d["warnings"] if "do not divide" in x]


def test_search_rows_carry_the_layout_as_predict_gives_it():
    assert "pipeline_layout" in TEXT_COLUMNS
    res = wattcast.search("llama3_8b", "DGX-H100", 6, 12, 4096, framework="megatron", gpus_per_node=6, tp=(1,),
                          pp=(3,), zero=(1,), micro_batch=(1,), interleave=(1, 2), recompute=("none",), sp=(False,),
                          workers=1)
    assert len(res.ranked) == 2
    for _, row in res.ranked.iterrows():
        p = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=6, batch=12, seq=4096, framework="megatron",
                                     gpus_per_node=6, strategy=row["strategy"])
        assert row["pipeline_layout"] == p.to_dict()["parallel"]["pipeline_layout"]
    assert res.ranked.iloc[0]["pipeline_layout"] == LAYOUT_32_3_2


def test_cli_shows_the_layers_and_the_search_note(tmp_path):
    args = ["-m", "llama3_8b", "--cluster", "DGX-H100", "--gpus-per-node", "6", "--gpus", "6", "--batch", "12",
            "--seq", "4096", "--framework", "megatron", "--pp", "3", "--micro-batch", "1", "--zero", "1"]
    out = CliRunner().invoke(app, ["predict", *args, "--interleave", "2"])
    assert out.exit_code == 0, out.output
    assert "layers" in out.output and "11=5+6" in out.output and "9=5+4" in out.output
    res = CliRunner().invoke(app, ["search", *args, "--tp", "1", "--interleave", "1,2", "--sp", "off",
                                   "--recompute", "none", "--workers", "1", "-o", str(tmp_path / "s.json")])
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "s.json").read_text())
    assert {r["pipeline_layout"] for r in rows} == {LAYOUT_32_3_2, "Et*11|t*12|t*9L"}
    assert f'--pipeline-model-parallel-layout "{LAYOUT_32_3_2}"' in " ".join(res.output.split())
