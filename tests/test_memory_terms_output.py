"""A cluster step's memory as the refusal and the text table say it (audit 59a finding 2).

Until stop 59 the out-of-memory refusal of a cluster step listed weights, gradients, optimizer, activations and buffers,
and the text per-stage table the same columns: Llama 3 8B under FSDP (hf, ZeRO-3) at micro-batch 8 x seq 8,192 was
refused at 147.0 GB naming 61.4 GB of terms; the rest was the loss's fp32 working set (``transient_gb``, 84.1 GB = 10 B
x 8 x 8,192 x 128,256) and ``unsharded_gradients_gb`` (1.5), and the remedies offered (--recompute, --zero) do not
shrink it. Now both list every non-zero term of ``memory.peak_terms_gb`` (its names and order), which sum to the total,
and the refusal says what shrinks the largest."""
import json
import re

import pytest
from conftest import flat, run_cli

import wattcast

ARGS = ("predict", "-m", "llama3_8b", "--cluster", "DGX-H100", "--gpus", "16", "--seq", "8192", "--framework", "hf",
        "--zero", "3", "--recompute", "full")


def _terms(text: str) -> tuple[dict[str, float], float]:
    """The "name x + name y = total GB at the ... peak" list of a refusal, as numbers (terms, total)."""
    m = re.search(r"\(([a-z_]+ [\d.]+(?: \+ [a-z_]+ [\d.]+)*) = ([\d.]+) GB at the", text)
    assert m, text
    terms = {k: float(v) for k, v in (t.split(" ") for t in m.group(1).split(" + "))}
    return terms, float(m.group(2))


def test_refusal_lists_every_peak_term_and_the_largest_ones_remedy():
    r = run_cli(*ARGS, "--batch", "128", "--micro-batch", "8")
    said = flat(r.stdout + r.stderr)
    assert r.returncode == 3 and "does not fit: stage 0 needs 147.0 GB" in said, said
    terms, total = _terms(said)
    d = json.loads(run_cli(*ARGS, "--batch", "128", "--micro-batch", "8", "--allow-oom", "--json").stdout)
    peak = d["memory"]["peak_terms_gb"]
    # every non-zero term of the JSON, in its names and order, and their sum is the total
    assert list(terms) == [k.removesuffix("_gb") for k, v in peak.items() if v > 0]
    assert [terms[k.removesuffix("_gb")] for k, v in peak.items() if v > 0] == [round(v, 1) for v in peak.values() if v > 0]
    assert total == round(d["memory"]["total_gb"], 1) == 147.0
    assert sum(terms.values()) == pytest.approx(total, abs=0.05 * len(terms))
    assert terms["transient"] == 84.1 and terms["unsharded_gradients"] == 1.5
    # the remedy for the largest term: the logits' working set shrinks with the micro-batch, not with --recompute/--zero
    assert "the largest, transient 84.1 GB" in said and "a smaller --micro-batch shrinks it" in said
    assert "--recompute and --zero do not" in said


def test_refusal_names_the_activations_remedy_when_they_are_the_largest():
    r = run_cli("predict", "-m", "llama3_8b", "--cluster", "DGX-H100", "--gpus", "8", "--batch", "64", "--seq", "8192",
                "--micro-batch", "8", "--framework", "megatron", "--zero", "1", "--recompute", "full")
    said = flat(r.stdout + r.stderr)
    assert r.returncode == 3, said
    terms, total = _terms(said)
    assert max(terms, key=terms.get) == "activations" and "master_weights" in terms
    assert sum(terms.values()) == pytest.approx(total, abs=0.05 * len(terms))
    assert re.search(r"the largest, activations [\d.]+ GB: --recompute", said)


def test_per_device_peak_terms_sum_to_each_stage_total():
    r = wattcast.predict_cluster("llama3_8b", "DGX-H100", gpus=8, batch=64, seq=8192, tp=2, pp=4, micro_batch=2,
                                 zero=1, framework="megatron")
    for row in r.per_device:
        assert sum(row["peak_terms_gb"].values()) == pytest.approx(row["memory_gb"], rel=1e-12)
        assert row["peak_phase"] in ("backward", "after_backward")
    worst = max(r.per_device, key=lambda x: x["memory_gb"])
    assert worst["peak_terms_gb"] == r.memory["peak_terms_gb"]


def test_text_table_shows_the_transient_and_unsharded_gradients():
    r = run_cli(*ARGS, "--batch", "64", "--micro-batch", "4")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = next(i for i, x in enumerate(lines) if "┃ stage" in x)
    cols = [c.strip() for c in lines[head].strip("┃ ").split("┃")]
    assert cols[-1] == "total GB" and "transient" in cols and "unsharded_gradients" in cols
    row = [c.strip() for c in lines[head + 2].strip("│ ").split("│")]
    got = dict(zip(cols, row))
    assert got["transient"] == "42.03" and got["unsharded_gradients"] == "1.51" and got["total GB"] == "80.01"
    shown = [float(got[c]) for c in cols[3:-1]]  # stage, layers, busy ms, the terms, total
    assert sum(shown) == pytest.approx(80.01, abs=0.005 * len(shown))
