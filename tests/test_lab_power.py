"""The statistical tests' size holds its promise: at ``runs_to_catch`` runs the chi-square test of the two-token law
rejects a law at Cohen's w = MIN_EFFECT from the target's with probability POWER at ALPHA, and keeps a true one.

Simulated, not run: multinomial counts from a law moved by w (numpy), tested as the lab tests (``Result.test``), so
the noncentral chi-square approximation ``runs_to_catch`` relies on is checked where it is used, pooling included.
Control: a quarter of the runs must fall well short of the power (the check can fail).
"""

from __future__ import annotations

import numpy as np
import pytest

from specviz import Sampling
from specviz.lab import ALPHA, MIN_EFFECT, POWER, Result, exact_two_token_distribution, models, runs_to_catch

LAWS = [
    ("similar", Sampling(temperature=1.0)),
    ("unlike", Sampling(temperature=1.3, top_k=4)),
    ("target_zeros", Sampling(temperature=1.0)),
]
EXPERIMENTS = 400  # simulated experiments per law: a rejection rate of 0.99 is seen as >= 0.97 but for 1 in 100 draws


def moved(law: np.ndarray, w: float) -> np.ndarray:
    """A law at Cohen's w from ``law``: its mass moved from the half of its support with the least mass to the other
    (p1 = p0 (1 + c (z - E z)), z = +1 / -1 by half, c = w / sd(z) under p0), zero where ``law`` is zero."""
    support = np.flatnonzero(law > 0)
    z = np.ones_like(law)
    z[support[np.argsort(law[support])][: len(support) // 2]] = -1.0
    mean = (law * z).sum()
    sd = np.sqrt((law * (z - mean) ** 2).sum())
    out = law * (1.0 + w / sd * (z - mean))
    assert (out >= 0).all() and out.sum() == pytest.approx(1.0)
    assert np.sqrt(((out - law) ** 2 / np.where(law > 0, law, 1)).sum()) == pytest.approx(w)
    return out


def rejection_rate(law: np.ndarray, truth: np.ndarray, runs: int, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    result = Result(counts=np.zeros_like(law), exact=law, runs=runs)
    return float(
        np.mean([result.test(rng.multinomial(runs, truth).astype(float))[1] < ALPHA for _ in range(EXPERIMENTS)])
    )


@pytest.mark.parametrize("kind, sampling", LAWS, ids=[k for k, _ in LAWS])
def test_the_test_size_catches_the_effect_it_states_and_keeps_a_true_law(kind, sampling):
    _, target = models(kind)
    law = exact_two_token_distribution(target, sampling).ravel()
    runs = runs_to_catch(law)
    assert 100 <= runs <= 3000  # the size the suite now runs: 3000 before it was derived
    wrong = moved(law, MIN_EFFECT)
    assert rejection_rate(law, wrong, runs) >= POWER - 0.02
    assert rejection_rate(law, law, runs, seed=1) <= 0.01  # ALPHA is 1e-4: a true law is kept
    # Control: at a quarter of the runs the same wrong law is missed often (the check above could fail).
    assert rejection_rate(law, wrong, runs // 4, seed=2) < 0.9
