"""Exactness against a reference law written here, independent of the engine's sampling code.

The lab's law (``specviz.lab.exact_two_token_distribution``) is built with the engine's own
``Sampling.probs``: a filter bug shared by p and q would shift the engine's output and the law
alike, and pass. Here the law comes from the target's raw logits through temperature, top-k and
top-p written out below in float64 (transformers' semantics: top-k keeps every token tied with
the k-th; top-p keeps a token while the mass of the tokens ranked above it is under top_p), and
the lab's law is checked against it.

- Two tokens, gamma 3: the first round's drafts and its correction or bonus.
- Three tokens, gamma 1: the joint law of tokens 1..3 spans two or three rounds, so every
  rejection is followed by a rollback of both caches and a new round from the corrected context.

Significance: Pearson's chi-square at ALPHA = 1e-4 per case, cells expected under 5 pooled, fixed
seeds. Controls, at the same sample sizes: top-k off by one in the sampling code (shared by p and
q, so the engine's own law moves with it: the lab's law accepts it, this reference rejects it),
and a rollback that leaves the caches uncropped (the next round attends to the rejected drafts'
keys and values, tokens that are not in the output).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import TopKLogitsWarper

from specviz import Sampling, speculative_generate
from specviz.lab import ALPHA, PROMPT, VOCAB, exact_two_token_distribution, models, runs_to_catch
from specviz.engine.runner import ModelRunner

pytestmark = pytest.mark.slow


def reference_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """(rows, V) logits -> (rows, V) float64 probabilities after temperature, top-k, top-p (in that order)."""
    z = logits.astype(np.float64) / temperature
    out = np.zeros_like(z)
    for r, row in enumerate(z):
        keep = np.ones(row.shape, dtype=bool)
        if top_k:
            kth = np.sort(row)[::-1][min(top_k, row.size) - 1]
            keep &= row >= kth
        w = np.where(keep, np.exp(row - row[keep].max()), 0.0)
        w /= w.sum()
        if top_p < 1.0:
            order = np.argsort(-w, kind="stable")
            above = np.concatenate([[0.0], np.cumsum(w[order])[:-1]])  # mass ranked above each token
            nucleus = np.zeros(row.shape, dtype=bool)
            nucleus[order[above < top_p]] = True
            w = np.where(nucleus, w, 0.0)
            w /= w.sum()
        out[r] = w
    return out


def reference_law(target, settings: tuple[float, int, float], tokens: int, prompt: list[int] = PROMPT) -> np.ndarray:
    """P(x1 .. x_tokens | prompt), shape (VOCAB,) * tokens, from the target's raw logits."""
    prefixes, law = [()], np.ones(1)
    for depth in range(tokens):
        batch = torch.tensor([list(prompt) + list(p) for p in prefixes])
        with torch.inference_mode():
            logits = target(batch).logits[:, -1, :VOCAB].numpy()
        step = reference_probs(logits, *settings)  # (len(prefixes), VOCAB)
        law = (law[:, None] * step).reshape(-1)
        prefixes = list(itertools.product(range(VOCAB), repeat=depth + 1))
    return law.reshape([VOCAB] * tokens)


def pearson(counts: np.ndarray, law: np.ndarray) -> tuple[float, float]:
    """(statistic, p-value) of ``counts`` against ``law`` (same shape), cells expected under 5 pooled;
    an outcome the law forbids gives p = 0."""
    counts, law = counts.ravel(), law.ravel()
    expected = law * counts.sum()
    if counts[law == 0].sum():
        return float("inf"), 0.0
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    wanted = np.append(expected[big], expected[~big].sum())
    if wanted[-1] == 0:  # nothing pooled
        observed, wanted = observed[:-1], wanted[:-1]
    stat, pvalue = chisquare(observed, wanted * observed.sum() / wanted.sum())
    return float(stat), float(pvalue)


def sample_counts(drafter, target, sampling: Sampling, gamma: int, tokens: int, runs: int) -> np.ndarray:
    counts = np.zeros([VOCAB] * tokens)
    for seed in range(runs):
        out = speculative_generate(
            PROMPT, drafter, target, gamma=gamma, sampling=sampling, max_new_tokens=tokens, seed=seed
        ).output_ids
        counts[tuple(out[:tokens])] += 1
    return counts


def _settings(s: Sampling) -> tuple[float, int, float]:
    return (s.temperature, s.top_k, s.top_p)


def test_the_labs_law_is_the_reference_law():
    _, target = models("similar")
    for s in (Sampling(1.0), Sampling(0.7, top_k=5, top_p=0.9), Sampling(1.3, top_k=4), Sampling(1.0, top_p=0.8)):
        np.testing.assert_allclose(
            exact_two_token_distribution(target, s), reference_law(target, _settings(s), 2), atol=1e-6
        )


TWO = [
    ("similar", Sampling(temperature=0.7, top_k=5, top_p=0.9), 3),
    ("unlike", Sampling(temperature=1.3, top_k=4), 3),
    ("different", Sampling(temperature=1.0, top_p=0.8), 3),
]
THREE = [("different", Sampling(temperature=0.8, top_k=6, top_p=0.95), 1), ("unlike", Sampling(temperature=1.0), 1)]
# Each case runs runs_to_catch of its reference law (specviz.lab: a wrong law at Cohen's w 0.25 from it rejected with
# probability 0.99 at ALPHA; 1,100-1,300 runs for two tokens, 1,700-1,900 for three), its control at the same size.
# Every case ran 3,000 before the size was derived; the controls' faults gave chi-square inf and 920 there.


@pytest.mark.parametrize("kind, sampling, gamma", TWO, ids=[c[0] for c in TWO])
def test_two_tokens_follow_the_reference_law(kind, sampling, gamma):
    drafter, target = models(kind)
    law = reference_law(target, _settings(sampling), 2)
    stat, pvalue = pearson(sample_counts(drafter, target, sampling, gamma, 2, runs_to_catch(law)), law)
    print(f"\n{kind} {sampling} gamma={gamma}: chi2={stat:.1f} p={pvalue:.3g}")
    assert pvalue > ALPHA


@pytest.mark.parametrize("kind, sampling, gamma", THREE, ids=[c[0] for c in THREE])
def test_three_tokens_over_several_rounds_follow_the_reference_law(kind, sampling, gamma):
    drafter, target = models(kind)
    law = reference_law(target, _settings(sampling), 3)
    runs = runs_to_catch(law)
    assert (law * runs >= 5).sum() >= 30, "too few testable cells for power"
    stat, pvalue = pearson(sample_counts(drafter, target, sampling, gamma, 3, runs), law)
    print(f"\n{kind} {sampling} gamma={gamma} tokens 1..3: chi2={stat:.1f} p={pvalue:.3g}")
    assert pvalue > ALPHA


def test_control_a_filter_bug_shared_by_p_and_q_is_caught(monkeypatch):
    """top-k off by one in the sampling code: p and q both keep 6 tokens for top_k=5. The engine's
    law (the lab's) moves with the bug and accepts the output; the reference rejects it."""
    real = Sampling.warpers

    def off_by_one(self):
        return type(real(self))(
            TopKLogitsWarper(self.top_k + 1) if isinstance(w, TopKLogitsWarper) else w for w in real(self)
        )

    kind, sampling, gamma = "similar", Sampling(temperature=1.0, top_k=5), 3
    drafter, target = models(kind)
    runs = runs_to_catch(reference_law(target, _settings(sampling), 2))
    monkeypatch.setattr(Sampling, "warpers", off_by_one)
    counts = sample_counts(drafter, target, sampling, gamma, 2, runs)
    own_law = exact_two_token_distribution(target, sampling)  # built with the same faulty code
    monkeypatch.undo()
    _, p_own = pearson(counts, own_law)
    stat, pvalue = pearson(counts, reference_law(target, _settings(sampling), 2))
    print(
        f"\nplanted top-k off by one: against the engine's own law p={p_own:.3g}; against the reference "
        f"chi2={stat:.1f} p={pvalue:.3g}"
    )
    assert p_own > ALPHA  # why the reference must be independent
    assert pvalue < ALPHA


def test_control_a_rollback_that_keeps_the_rejected_drafts_is_caught(monkeypatch):
    """A rollback that moves the runner's length back but leaves the KV cache uncropped: after a
    rejection the next round attends to the rejected drafts' keys and values (and its positions
    shift), so the tokens of later rounds follow the wrong context. The three-token test rejects it."""

    def pointer_only(self, length):
        if self.keeps_cache and self.seen > length:
            self.seen = length  # the fault: no self.cache.crop

    monkeypatch.setattr(ModelRunner, "rollback", pointer_only)
    kind, sampling, gamma = THREE[1]
    drafter, target = models(kind)
    runs = runs_to_catch(reference_law(target, _settings(sampling), 3))
    counts = sample_counts(drafter, target, sampling, gamma, 3, runs)
    monkeypatch.undo()
    stat, pvalue = pearson(counts, reference_law(target, _settings(sampling), 3))
    print(f"\nplanted uncropped rollback: chi2={stat:.1f} p={pvalue:.3g}")
    assert pvalue < ALPHA
