"""The repetition penalty keeps speculative decoding exact when each position gets its own context.

transformers' RepetitionPenaltyLogitsProcessor changes a position's logits by the tokens before
it, so q and p of a draft must both be processed with the context that draft really has: the
prompt, the output so far and the drafts before it in the round. Tests:
- greedy output equals ``target.generate(do_sample=False, repetition_penalty=...)`` token for token;
- the first two tokens' law matches the exact law enumerated with the penalty (chi-square at
  significance 1e-4, 2,000 seeded runs, as tests/test_exactness.py);
- planted control: the verify pass processes every row with the round's start context (the
  drafts before a row left out of it), and the same test at the same size rejects it.
"""

from __future__ import annotations

import pytest
import torch

from specviz import Sampling, autoregressive_generate, speculative_generate

from specviz.engine import rejection
from specviz.lab import ALPHA, VOCAB, chi_square
from tests.conftest import assert_same_greedy, noisy_copy, tiny_lm

RUNS = None  # chi_square's own: runs_to_catch of each case's two-token law (specviz.lab.MIN_EFFECT; 2,000 before)


def pvalue(drafter, target, sampling: Sampling, gamma: int) -> float:
    """The exactness lab's chi-square (specviz.lab): its exact law processes each position with its own context."""
    _, p, _ = chi_square(drafter, target, sampling, gamma, runs=RUNS)
    return p


@pytest.fixture(scope="module")
def models():
    target = tiny_lm(vocab=VOCAB, layers=2, seed=3, init=0.3, n_positions=32)
    return noisy_copy(target, 0.03, seed=4), target


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_with_a_penalty_equals_transformers(gamma):
    target = tiny_lm(vocab=32, layers=2, seed=2, init=0.3)
    drafter = noisy_copy(target, 0.05, seed=1)
    sampling = Sampling(0.0, repetition_penalty=1.4)
    for prompt in ([5, 7, 9], [3, 3, 3, 3, 1]):
        want = target.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=30,
            repetition_penalty=1.4,
            pad_token_id=0,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        )[0, len(prompt) :].tolist()
        got = speculative_generate(
            prompt, drafter, target, gamma=gamma, sampling=sampling, max_new_tokens=30, eos_token_id=0
        )
        assert_same_greedy(target, prompt, got.output_ids, want)
        assert (
            autoregressive_generate(prompt, target, sampling=sampling, max_new_tokens=30, eos_token_id=0).output_ids
            == want
        )
        assert (
            want
            != target.generate(
                torch.tensor([prompt]),
                do_sample=False,
                max_new_tokens=30,
                pad_token_id=0,
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            )[0, len(prompt) :].tolist()
        )


@pytest.mark.slow
def test_sampled_with_a_penalty_keeps_the_targets_law(models):
    drafter, target = models
    p = pvalue(drafter, target, Sampling(temperature=1.0, top_k=6, repetition_penalty=5.0), gamma=3)
    print(f"\nrepetition penalty 5.0, top-k 6, gamma 3: chi-square p = {p:.3g}")
    assert p > ALPHA


@pytest.mark.slow
def test_planted_round_start_context_is_caught(models, monkeypatch):
    real = rejection.target_probs

    def round_start_context(logits, sampling, warpers, context=None):
        # Fault: every verify row penalised by the context at the round's start (row 0).
        return real(logits, sampling, warpers, None if context is None else context[:1].expand_as(context))

    monkeypatch.setattr(rejection.EXACT, "target_probs", round_start_context)
    drafter, target = models
    p = pvalue(drafter, target, Sampling(temperature=1.0, top_k=6, repetition_penalty=5.0), gamma=3)
    print(f"\nplanted round-start context: chi-square p = {p:.3g}")
    assert p < ALPHA


def test_penalty_needs_a_context_and_a_valid_value():
    with pytest.raises(ValueError, match="repetition_penalty"):
        Sampling(1.0, repetition_penalty=0.0)
    with pytest.raises(ValueError, match="repetition_penalty"):
        Sampling(1.0, repetition_penalty=float("nan"))
    with pytest.raises(ValueError, match="context"):
        Sampling(1.0, repetition_penalty=1.2).probs(torch.zeros(1, 4))
