"""Property tests of one position's maths on random p and q (hypothesis).

The probability of emitting token x at one position, in closed form:
    P(x) = q(x) min(1, p(x)/q(x)) + (1 - beta) r(x),  beta = sum_y q(y) min(1, p(y)/q(y)),
with r the engine's own residual. Exactness means P == p for every p and q
(Leviathan et al. 2023, Appendix A.1).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specviz.engine import rejection


def distribution(n: int, zeros: bool):
    weights = st.floats(0.0 if zeros else 1e-3, 1.0, allow_nan=False, allow_infinity=False)
    return st.lists(weights, min_size=n, max_size=n).filter(lambda w: sum(w) > 1e-3)


@st.composite
def p_and_q(draw):
    n = draw(st.integers(2, 12))
    zeros = draw(st.booleans())
    p = np.array(draw(distribution(n, zeros)), dtype=np.float64)
    q = np.array(draw(distribution(n, zeros)), dtype=np.float64)
    return torch.tensor(p / p.sum()), torch.tensor(q / q.sum())


@settings(max_examples=400, deadline=None)
@given(p_and_q())
def test_emission_probability_equals_p(pq):
    p, q = pq
    keep = torch.where(q > 0, torch.minimum(torch.ones_like(p), p / q.clamp_min(1e-300)), torch.zeros_like(p))
    beta = (q * keep).sum()
    emitted = q * keep + (1 - beta) * rejection.residual(p[None], q[None])[0]
    assert torch.allclose(emitted, p, atol=1e-9)


@settings(max_examples=200, deadline=None)
@given(p_and_q())
def test_residual_is_a_distribution_without_nan(pq):
    p, q = pq
    r = rejection.residual(p[None], q[None])[0]
    assert torch.isfinite(r).all()
    assert r.sum().item() == 1.0 or abs(r.sum().item() - 1.0) < 1e-9
    assert (r >= 0).all()
    # r puts mass only where p exceeds q (or is p itself when p == q).
    if (p > q).any():
        assert (r[p <= q] == 0).all()


# u as torch.rand draws it: float32 in [0, 1).
UNIFORM = st.floats(0.0, 1.0, exclude_max=True, width=32)


@given(UNIFORM, st.floats(2.0**-20, 1.0, width=32))
def test_zero_target_probability_is_never_accepted(u, q):
    assert not rejection.accept(torch.tensor([u]), torch.tensor([q]), torch.tensor([0.0]))[0]


@given(UNIFORM, st.floats(2.0**-20, 1.0, width=32), st.floats(0.0, 1.0, width=32))
def test_p_at_least_q_is_always_accepted(u, q, extra):
    p = max(q, min(1.0, q + extra * (1 - q)))
    assert rejection.accept(torch.tensor([u]), torch.tensor([q]), torch.tensor([p]))[0]


def test_identical_p_and_q_give_no_nan():
    p = torch.tensor([[0.5, 0.25, 0.25, 0.0]])
    r = rejection.residual(p, p.clone())
    assert torch.isfinite(r).all()
    assert torch.equal(r, p)


def test_a_fault_reaches_only_the_runs_it_is_passed_to():
    """The lab passes a fault to its own runs as their steps: nothing of specviz.engine.rejection is
    replaced, so a run beside it (another visitor's) is the exact algorithm, token for token."""
    from specviz import Sampling, speculative_generate
    from specviz.lab import PROMPT, models
    from specviz.lab.faults import FAULTS, fault_steps

    drafter, target = models("unlike")
    before = {name: getattr(rejection, name) for name in rejection.STEP_NAMES}
    broken = fault_steps("residual_is_p")
    differ = 0
    for seed in range(6):
        def run(**kw):
            return speculative_generate(
                PROMPT, drafter, target, gamma=3, sampling=Sampling(1.0), max_new_tokens=12, seed=seed, **kw
            )

        alone = run()
        faulty = run(steps=broken)
        beside = run()
        assert beside.output_ids == alone.output_ids
        differ += faulty.output_ids != alone.output_ids
    assert differ  # the fault did reach its own runs
    assert {name: getattr(rejection, name) for name in rejection.STEP_NAMES} == before
    assert all(fault_steps(name) is not None for name in FAULTS)
    with pytest.raises(TypeError, match="verify"):  # not one of the four steps
        rejection.Steps(verify=lambda: None)


def test_a_cpu_draw_is_distributed_as_its_row_and_never_draws_a_zero():
    """Inverse transform sampling (one uniform per row): 200,000 draws from a row with zeros
    between its masses never draw a zero and pass a chi-square against the row at 1e-4; the
    control, the same draws moved one token later (a boundary off by one), is rejected."""
    from scipy.stats import chisquare

    p = torch.tensor([0.0, 0.15, 0.0, 0.0, 0.45, 0.1, 0.0, 0.3], dtype=torch.float64)
    rows = p.repeat(200_000, 1)
    draws = rejection.sample_rows(rows, False, torch.Generator().manual_seed(3))
    counts = torch.bincount(draws, minlength=8).double()
    assert counts[p == 0].sum() == 0
    support = p > 0
    expected = (p[support] * 200_000).numpy()
    _, pvalue = chisquare(counts[support].numpy(), expected)
    assert pvalue > 1e-4, pvalue
    # control: a sampler that puts the boundary one token late (x - 1 -> x) is caught
    shifted = torch.bincount((draws + 1).clamp_max(7), minlength=8).double()
    observed = shifted[support].numpy()
    _, control = chisquare(observed, expected * observed.sum() / expected.sum())
    assert control < 1e-4


def test_a_cpu_draw_refuses_rows_without_finite_mass_and_rows_follow_their_own_generators():
    for bad in ([0.0, 0.0, 0.0], [float("nan"), 0.5, 0.5], [float("inf"), 0.0, 1.0]):
        with pytest.raises(ValueError, match="NaN or infinite"):
            rejection.sample_rows(torch.tensor([bad]), False, torch.Generator().manual_seed(0))
    probs = torch.softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(1)), dim=-1)
    gens = [torch.Generator().manual_seed(s) for s in (5, 6, 7)]
    together = rejection.sample_rows(probs, False, gens)
    alone = [
        int(rejection.sample_rows(probs[i : i + 1], False, torch.Generator().manual_seed(s)))
        for i, s in enumerate((5, 6, 7))
    ]
    assert together.tolist() == alone
