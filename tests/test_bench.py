"""The benchmarks' arithmetic and set-up, on tiny models (no timing is asserted)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specviz import Sampling, theory
from specviz.engine.batch import autoregressive_generate_batch, speculative_generate_batch
from specviz.measure.bench import hf_counterpart
from specviz.measure.batch_bench import METHODS, _batch_row, format_batch_report
from specviz.measure.common import PROMPT_SETS, benchmark_prompts
from specviz.drafters import PromptLookupDrafter
from specviz.lab import models

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 1, 2], [3], [1, 2, 3, 1, 2]]


@pytest.mark.parametrize("schedule", ["confidence", "heuristic"])
def test_transformers_counterpart_leaves_the_pairs_drafter_alone(schedule):
    drafter, target = models("similar")
    before = drafter.generation_config.to_dict()
    pair = SimpleNamespace(drafter=drafter, target=target)
    name, kwargs = hf_counterpart("model", schedule, pair, 3, confidence=0.7)
    assistant = kwargs["assistant_model"]
    assert assistant is not drafter
    assert all(a is b for a, b in zip(assistant.parameters(), drafter.parameters()))  # the same weights, no copy
    x = torch.tensor([[1, 2, 3]])
    target.generate(
        x,
        attention_mask=torch.ones_like(x),
        do_sample=False,
        max_new_tokens=8,
        min_new_tokens=8,
        pad_token_id=0,
        **kwargs,
    )
    assert drafter.generation_config.to_dict() == before  # neither the call nor transformers' generate wrote into it
    assert ("confidence threshold 0.7" in name) == (schedule == "confidence")


def _results(drafter, target, repeats=2):
    common = dict(sampling=Sampling(1.0), max_new_tokens=10, eos_token_id=None)
    spec = [speculative_generate_batch(PROMPTS, drafter, target, gamma=3, seed=r, **common) for r in range(repeats)]
    base = [autoregressive_generate_batch(PROMPTS, target, seed=r, **common) for r in range(repeats)]
    return spec, base


@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_batch_benchmark_c_counts_the_batchs_drafter_passes_and_predicts_from_alpha_c_v(kind):
    drafter, target = models("different")
    drafter = drafter if kind == "model" else PromptLookupDrafter(max_ngram=2)
    spec, base = _results(drafter, target)
    b = len(PROMPTS)
    tps = {(m, b): [10.0, 12.0] for m in METHODS}
    row = _batch_row(b, tps, {("speculative", b): spec, ("autoregressive", b): base}, 3, 10, "constant", kind)
    if kind == "ngram":
        assert all(res.drafter_step_passes == 0 for res in spec)
        assert row["cost_coefficient"] is None and row["predicted_speedup_verify"] is None  # no pass to divide by
        assert "-" in format_batch_report({"rows": [row]})
        return
    for res in spec:
        # One drafter pass per draft step of each round: as many as the round's widest row drafted.
        widest = [
            max(len(res.traces[i].rounds[sum(i in a for a in res.rounds[:k])].drafts) for i in active)
            for k, active in enumerate(res.rounds)
        ]
        assert res.drafter_step_passes == sum(widest) and res.drafter_passes == res.drafter_prefill_passes + sum(widest)
    step = sum(res.verify_ms for res in base) / sum(len(res.rounds) for res in base)
    c = sum(res.draft_ms for res in spec) / sum(res.drafter_step_passes for res in spec) / step
    v = sum(res.verify_ms for res in spec) / sum(len(res.rounds) for res in spec) / step
    assert row["cost_coefficient"] == pytest.approx(c) and row["verify_cost"] == pytest.approx(v)
    traces = [t for res in spec for t in res.traces]
    alpha = sum(t.accepted for t in traces) / sum(t.accepted + t.rejected for t in traces)
    assert row["alpha"] == pytest.approx(alpha)
    # A prediction from alpha, c and v (Eq. 1 over gamma c + v), not the measured rounds.
    assert row["predicted_speedup_verify"] == pytest.approx(theory.predicted_speedup_with_verify_cost(alpha, 3, c, v))
    assert "pred" in format_batch_report({"rows": [row]})


def test_prompt_sets_name_what_they_are():
    assert set(PROMPT_SETS) == {"held-out", "grounded", "english"}
    assert len(benchmark_prompts(3, "grounded")) == 3 and benchmark_prompts(2) != benchmark_prompts(2, "grounded")
    import specviz.measure.bench as bench

    assert not hasattr(bench, "held_out_prompts")  # the grounded prompts were never held out of anything
    with pytest.raises(ValueError, match="prompt set must be one of"):
        benchmark_prompts(1, "train")


def test_bench_says_how_long_it_ran_and_that_single_runs_are_noisy(capsys):
    """The text report ends with its running time and the noise warning the page gives; JSON stays the report alone."""
    import argparse
    import json

    from specviz.measure.common import NOISE_NOTE, run_command

    args = argparse.Namespace(temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.0, json=False)
    assert run_command(args, lambda a, sampling: {"speedup": 1.0}, lambda report: "table") == 0
    out = capsys.readouterr().out
    assert out.startswith("table\nRan in ") and " min " in out and NOISE_NOTE in out and "noisy" in NOISE_NOTE
    args.json = True
    assert run_command(args, lambda a, sampling: {"speedup": 1.0}, lambda report: "table") == 0
    assert json.loads(capsys.readouterr().out) == {"speedup": 1.0}
