"""Leviathan et al. 2023, Sec. 3: what the acceptance rate and the cost coefficient predict.

alpha: the acceptance rate, taken as the probability that one draft is accepted (Sec. 3.1
assumes it is the same at every position). c: the cost coefficient, the time of one drafter
forward pass over the time of one target forward pass (Sec. 3.2).
"""

from __future__ import annotations

from specviz.trace import Trace


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    """(1 - alpha^(gamma+1)) / (1 - alpha): Leviathan et al. 2023, Eq. (1); gamma + 1 when alpha = 1."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """Walltime speedup (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)): Leviathan et al. 2023, Thm. 3.8."""
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + 1.0)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 16) -> int:
    """The gamma in 1..max_gamma with the largest predicted speedup."""
    return max(range(1, max_gamma + 1), key=lambda g: predicted_speedup(alpha, g, c))


def drafter_step_ms(*specs: Trace) -> float | None:
    """Mean drafting time per drafter forward pass over one or more speculative traces, in ms."""
    passes = sum(t.drafter_forward_passes for t in specs)
    return sum(t.draft_ms for t in specs) / passes if passes else None


def target_step_ms(*baselines: Trace) -> float | None:
    """Mean time of one single-token target pass over one or more autoregressive traces, in ms."""
    steps = sum(len(t.rounds) for t in baselines)
    return sum(t.verify_ms for t in baselines) / steps if steps else None


def cost_coefficient(spec: Trace, baseline: Trace) -> float | None:
    """c = drafter step time / target step time, both measured in the same session (ms / ms)."""
    d, t = drafter_step_ms(spec), target_step_ms(baseline)
    return d / t if d is not None and t else None


def measured_speedup(spec: Trace, baseline: Trace) -> float | None:
    """Speculative tokens/s over autoregressive tokens/s."""
    a, b = spec.tokens_per_second, baseline.tokens_per_second
    return a / b if a and b else None


def accepted_drafts_distribution(alpha: float, gamma: int) -> list[float]:
    """P(k drafts accepted in a round), k = 0..gamma, if each is accepted with probability alpha
    independently: (1 - alpha) alpha^k for k < gamma, alpha^gamma for k = gamma (the capped
    geometric law behind Leviathan et al. 2023, Eq. (1); its mean + 1 is that equation)."""
    return [(1.0 - alpha) * alpha**k for k in range(gamma)] + [alpha**gamma]


def position_acceptance(alpha: float, position: int) -> float:
    """alpha^i: the chance that the i-th draft (1-based) of a round is accepted, under the same assumption."""
    return alpha**position


def round_gamma(trace: Trace, r) -> int | None:
    """The gamma a round was allowed: its own (schema 3), else the run's setting (older traces)."""
    return r.gamma if r.gamma is not None else trace.settings.get("gamma")


def accepted_per_round(trace: Trace, gamma: int | None = None) -> list[int]:
    """Accepted drafts in each round that drafted the full gamma of the run's setting (or of
    ``gamma`` when given); rounds cut short near max_new_tokens are left out."""
    gamma = gamma if gamma is not None else trace.settings.get("gamma")
    return [r.accepted_count for r in trace.rounds if r.drafts and len(r.drafts) == gamma]


def acceptance_by_position(trace: Trace) -> list[tuple[int, int]]:
    """(rounds that drafted position i, rounds whose i-th draft was accepted) for i = 1, 2, ...

    accepted / drafted at position i is vLLM's per-position acceptance rate; compare it with
    ``position_acceptance``.
    """
    counts: list[list[int]] = []
    for r in trace.rounds:
        for i, d in enumerate(r.drafts):
            if i == len(counts):
                counts.append([0, 0])
            counts[i][0] += 1
            counts[i][1] += d.accepted
    return [(n, a) for n, a in counts]
