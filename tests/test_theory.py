"""Leviathan et al.'s theory holds where its assumption holds, and the right alpha is what makes it hold.

A drafter and a target whose logits do not depend on the context (tests.conftest.ConstantLM)
have the same beta = sum_x min(p(x), q(x)) at every position, so each tested draft is accepted
independently with probability alpha = beta: Leviathan et al. 2023, Sec. 3.1's assumption, true
by construction. Then
- accepted drafts per round follow the capped geometric law at alpha (chi-square test),
- mean tokens per round matches Eq. (1) (z-test on the mean, standard error from the rounds),
- accepted / (accepted + rejected) matches mean beta (binomial z-test),
each with alpha estimated as accepted / (accepted + rejected). The planted control takes alpha
as accepted / drafted (the draft acceptance rate, whose denominator counts discarded drafts)
and the same tests must reject it.

Thresholds: chi-square p-value > 1e-4; |z| < 4 (two-sided p about 6e-5). Seeds are fixed, so
the statistics are reproducible on any machine up to fp32 differences in p and q, which move
no verdict here (beta is about 0.7, far from any u).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import chisquare

from specviz import Sampling, speculative_generate, theory
from specviz.trace import Trace
from tests.conftest import constant_lm

GAMMA = 4
Z_MAX = 4.0
P_MIN = 1e-4


@pytest.fixture(scope="module")
def traces() -> list[Trace]:
    # p and q over 6 tokens, fixed at every position: beta = sum min(p, q) is about 0.70.
    target = constant_lm([1.2, 0.8, 0.3, -0.2, -0.5, -1.0], seed=1)
    drafter = constant_lm([0.1, 0.9, 1.1, -0.4, -0.8, 0.2], seed=2)
    sampling = Sampling(temperature=1.0)
    return [
        speculative_generate([1, 2], drafter, target, gamma=GAMMA, sampling=sampling, max_new_tokens=200, seed=s)
        for s in range(8)
    ]


def full_rounds(traces):
    """Rounds that drafted all GAMMA drafts (the cut last round of a run is left out)."""
    return [r for t in traces for r in t.rounds if len(r.drafts) == GAMMA]


def pooled(traces):
    accepted = sum(t.accepted for t in traces)
    rejected = sum(t.rejected for t in traces)
    drafted = sum(t.drafted for t in traces)
    return accepted, rejected, drafted


def histogram_pvalue(counts: list[int], alpha: float) -> float:
    """Chi-square of accepted-drafts-per-round counts against the capped geometric law at alpha
    (one parameter estimated: ddof = 1); cells under 5 expected are pooled into their neighbour."""
    observed = np.bincount(counts, minlength=GAMMA + 1).astype(float)
    expected = np.array(theory.accepted_drafts_distribution(alpha, GAMMA)) * len(counts)
    assert expected.min() >= 5, "the construction keeps every cell testable"
    return chisquare(observed, expected * observed.sum() / expected.sum(), ddof=1).pvalue


def tokens_z(rounds, alpha: float) -> float:
    """z of the measured mean tokens per full round against Eq. (1) at alpha."""
    tokens = np.array([r.accepted_count + 1 for r in rounds], dtype=float)  # accepted drafts + correction or bonus
    return (tokens.mean() - theory.expected_tokens_per_round(alpha, GAMMA)) / (
        tokens.std(ddof=1) / math.sqrt(len(tokens))
    )


def test_beta_is_the_same_everywhere_and_alpha_estimates_it(traces):
    betas = [d.beta for t in traces for r in t.rounds for d in r.drafts]
    # fp32 sums of the same two vectors: equal up to rounding, whatever the pass shape.
    assert max(betas) - min(betas) < 1e-5
    beta = betas[0]
    accepted, rejected, drafted = pooled(traces)
    tested = accepted + rejected
    z = (accepted / tested - beta) / math.sqrt(beta * (1 - beta) / tested)
    print(f"\nbeta {beta:.4f}; alpha = accepted / tested = {accepted}/{tested} = {accepted / tested:.4f}; z = {z:.2f}")
    assert abs(z) < Z_MAX
    assert traces[0].mean_beta == pytest.approx(beta)


def test_eq1_and_the_capped_geometric_law_hold_at_alpha(traces):
    rounds = full_rounds(traces)
    accepted, rejected, _ = pooled(traces)
    alpha = accepted / (accepted + rejected)
    z = tokens_z(rounds, alpha)
    pvalue = histogram_pvalue([r.accepted_count for r in rounds], alpha)
    print(
        f"\n{len(rounds)} rounds, alpha {alpha:.4f}: tokens per round z = {z:.2f}; histogram chi-square p = "
        f"{pvalue:.3g}"
    )
    assert len(rounds) >= 300
    assert abs(z) < Z_MAX
    assert pvalue > P_MIN


def test_planted_control_draft_acceptance_rate_as_alpha_is_rejected(traces):
    """The same tests with alpha = accepted / drafted (discarded drafts in the denominator) must fail."""
    rounds = full_rounds(traces)
    accepted, _, drafted = pooled(traces)
    wrong = accepted / drafted
    z = tokens_z(rounds, wrong)
    pvalue = histogram_pvalue([r.accepted_count for r in rounds], wrong)
    print(
        f"\nplanted: alpha taken as accepted / drafted = {wrong:.4f}: tokens per round z = {z:.2f}; histogram "
        f"chi-square p = {pvalue:.3g}"
    )
    assert abs(z) > Z_MAX
    assert pvalue < P_MIN


def test_verify_cost_prediction_reduces_to_thm_3_8():
    for alpha, gamma, c in [(0.6, 4, 0.2), (0.9, 8, 0.05), (0.3, 1, 0.5)]:
        assert theory.predicted_speedup_with_verify_cost(alpha, gamma, c, 1.0) == pytest.approx(
            theory.predicted_speedup(alpha, gamma, c)
        )
        assert theory.predicted_speedup_with_verify_cost(alpha, gamma, c, 1.4) < theory.predicted_speedup(
            alpha, gamma, c
        )
    assert theory.verify_cost_at(4, 1.4, 4) == pytest.approx(1.4)
    assert theory.verify_cost_at(8, 1.4, 4) == pytest.approx(1.8)
    # a verify pass that grows with gamma favours shorter drafts
    assert theory.optimal_gamma(0.8, 0.05, v=2.0, gamma_measured=4) < theory.optimal_gamma(0.8, 0.05)


def _rounds_z(runs, at) -> tuple[float, list[int], float]:
    """z of the mean tokens per round against the mean over the rounds of Eq. (1) at ``at(round)`` drafts, alpha
    pooled from the runs; also each round's drafts and alpha. A run's last round (maybe cut by max_new_tokens) is
    left out."""
    rounds = [r for t in runs for r in t.rounds[:-1]]
    accepted, rejected, _ = pooled(runs)
    alpha = accepted / (accepted + rejected)
    tokens = np.array([r.accepted_count + 1 for r in rounds], dtype=float)
    expected = np.mean([theory.expected_tokens_per_round(alpha, at(r)) for r in rounds])
    z = (tokens.mean() - expected) / (tokens.std(ddof=1) / math.sqrt(len(tokens)))
    return z, [len(r.drafts) for r in rounds], alpha


def test_rounds_of_varying_length_keep_eq1_round_by_round():
    """Adaptive schedules draft rounds of their own lengths; under the same i.i.d. acceptance the mean tokens per
    round matches the mean of Eq. (1) at each round's own drafts (``predicted_speedup_for_rounds``'s numerator),
    z-tested, for transformers' heuristic (+2 after a round that kept every draft, -1 otherwise: rounds of many
    lengths) and the path-confidence schedule (here q's largest is about 0.33 everywhere, so every round stops after
    two drafts). The planted control, Eq. (1) at the gamma the rounds were allowed (8, what a constant gamma 8
    would give), must miss the path schedule's."""
    target = constant_lm([1.2, 0.8, 0.3, -0.2, -0.5, -1.0], seed=1)
    drafter = constant_lm([0.1, 0.9, 1.1, -0.4, -0.8, 0.2], seed=2)

    def runs(schedule, gamma):
        return [
            speculative_generate([1, 2], drafter, target, gamma=gamma, schedule=schedule, sampling=Sampling(1.0),
                                 max_new_tokens=200, seed=s)
            for s in range(8)
        ]

    heuristic, path = runs("heuristic", 2), runs("path", 8)
    z_heuristic, drafts, alpha = _rounds_z(heuristic, lambda r: len(r.drafts))
    z_path, path_drafts, _ = _rounds_z(path, lambda r: len(r.drafts))
    z_planted, _, _ = _rounds_z(path, lambda r: r.gamma)
    print(f"\nheuristic: {len(drafts)} rounds of {sorted(set(drafts))} drafts, alpha {alpha:.3f}: z {z_heuristic:.2f};"
          f" path: {len(path_drafts)} rounds of {sorted(set(path_drafts))} drafts: z {z_path:.2f}, planted "
          f"{z_planted:.2f}")
    assert len(set(drafts)) >= 4 and len(drafts) >= 300 and set(path_drafts) == {2}
    assert abs(z_heuristic) < Z_MAX and abs(z_path) < Z_MAX
    assert abs(z_planted) > Z_MAX
    c, v = 0.1, 1.2
    assert theory.predicted_speedup_for_rounds(alpha, drafts, c, v) == pytest.approx(
        np.mean([theory.expected_tokens_per_round(alpha, g) for g in drafts]) / (np.mean(drafts) * c + v)
    )
    assert theory.predicted_speedup_for_rounds(alpha, [4] * 5, c, v) == pytest.approx(
        theory.predicted_speedup_with_verify_cost(alpha, 4, c, v)
    )
    assert theory.predicted_speedup_for_rounds(alpha, [], c) is None


def test_alpha_and_draft_acceptance_rate_from_the_rounds(traces):
    t = traces[0]
    assert t.rejected == sum(r.final_kind == "correction" for r in t.rounds)
    assert t.alpha == t.accepted / (t.accepted + t.rejected)
    assert t.acceptance_rate == t.accepted / t.drafted
    d = t.to_dict()
    assert d["alpha"] == t.alpha and d["rejected"] == t.rejected
    assert all(r["gamma"] is not None for r in d["rounds"])
