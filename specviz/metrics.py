"""The pooled metrics of speculative decoding, each defined once, as arithmetic on counts and times.

A Trace, a sweep point, a whole sweep and both benchmarks compute these from their own sums
through the functions below, so a metric has one definition and one denominator everywhere.
Each returns None when its denominator is zero (nothing to measure), never a made-up 0.

Terms (Leviathan et al. 2023; vLLM's metric names):
- alpha = accepted / (accepted + rejected): the share of tested drafts that were accepted,
  Leviathan et al.'s per-draft acceptance probability (Sec. 3.1, alpha = E[beta]). Discarded
  drafts (after a rejection) were never tested and are not in the denominator.
- draft acceptance rate = accepted / drafted (vLLM's name): discarded drafts count.
- tokens per round = emitted tokens / rounds, the correction or bonus token included.
- c, the cost coefficient = drafter step time / target step time (Sec. 3.2), where a drafter
  step is one drafter forward pass.
- v, the verify cost = the target's verify pass per round / one autoregressive target step.
"""

from __future__ import annotations

from collections.abc import Iterable

# Drafter kinds that draft without a forward pass (prompt lookup copies from the sequence).
PASSLESS_DRAFTERS = frozenset({"ngram"})


def ratio(part: float, whole: float) -> float | None:
    """part / whole, or None when whole is 0 (or None)."""
    return part / whole if whole else None


def alpha(accepted: int, rejected: int) -> float | None:
    """accepted / (accepted + rejected); None when nothing was tested."""
    return ratio(accepted, accepted + rejected)


def draft_acceptance_rate(accepted: int, drafted: int) -> float | None:
    """accepted / drafted (discarded drafts counted); None when nothing was drafted."""
    return ratio(accepted, drafted)


def tokens_per_round(tokens: int, rounds: int) -> float | None:
    """Emitted tokens / rounds; None without rounds."""
    return ratio(tokens, rounds)


def tokens_per_second(tokens: int, ms: float) -> float | None:
    """tokens / (ms / 1000), in tokens/s; None without time."""
    return tokens / (ms / 1000.0) if ms and ms > 0 else None


def mean(values: Iterable[float]) -> float | None:
    """The mean of ``values``; None when there are none."""
    values = list(values)
    return ratio(sum(values), len(values))


def drafter_passes(kind: str | None, drafted: int) -> int:
    """Drafter forward passes of a single-sequence run that drafted ``drafted`` tokens: one per
    draft for a drafter model (and early exit), none for a drafter kind in PASSLESS_DRAFTERS."""
    return 0 if kind in PASSLESS_DRAFTERS else drafted


def step_ms(ms: float, steps: int) -> float | None:
    """Mean time of one step (a forward pass, a round), in ms; None without steps."""
    return ratio(ms, steps)


def cost_coefficient(drafter_step_ms: float | None, target_step_ms: float | None) -> float | None:
    """c = drafter step / target step (ms / ms); None when either is unknown or zero."""
    return drafter_step_ms / target_step_ms if drafter_step_ms is not None and target_step_ms else None


def verify_cost(verify_ms_per_round: float | None, target_step_ms: float | None) -> float | None:
    """v = verify pass per round / target step (ms / ms); None when either is unknown or zero."""
    return cost_coefficient(verify_ms_per_round, target_step_ms)
