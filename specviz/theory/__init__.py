"""Leviathan et al. 2023, Sec. 3: what alpha, the cost coefficient c and the verify cost v predict.

alpha: the probability that one tested draft is accepted, alpha = E[beta] (Sec. 3.1, Def. 3.1),
where beta = sum_x min(p(x), q(x)) at a drafted position. From a run's verdicts it is estimated
as accepted / (accepted + rejected) (``Trace.alpha``), never as accepted / drafted: drafted
tokens include those discarded after a rejection, which were never tested.
c: the cost coefficient, the time of one drafter forward pass over the time of one target
forward pass (Sec. 3.2).
v: the verify cost, the time of the target's one pass over gamma + 1 tokens over the time of one
autoregressive target step. Leviathan et al. take v = 1 (a pass costs the same whatever the
number of tokens, true while the target is memory-bound); small models on a CPU and
compute-bound GPUs have v > 1.
"""

from __future__ import annotations

from specviz import metrics
from specviz.trace import Trace


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    """(1 - alpha^(gamma+1)) / (1 - alpha): Leviathan et al. 2023, Eq. (1); gamma + 1 when alpha = 1."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """Walltime speedup (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)): Leviathan et al. 2023, Thm. 3.8."""
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + 1.0)


def predicted_speedup_with_verify_cost(alpha: float, gamma: int, c: float, v: float) -> float:
    """E[tokens per round] / (gamma c + v): Thm 3.8 with a verify pass that costs v target steps
    instead of one (v = 1 gives Thm 3.8). A round costs gamma drafter steps and one verify
    pass, and yields Eq. (1) tokens; the baseline yields one token per target step."""
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + v)


def predicted_speedup_for_rounds(alpha: float, drafts: list[int], c: float, v: float = 1.0) -> float | None:
    """Thm 3.8 for rounds of varying length, as an adaptive gamma schedule drafts them: the mean over the rounds of
    Eq. (1) at each round's own drafts g, over mean(g) c + v target steps (Leviathan et al. 2023, Eq. (1) and
    Thm 3.8, each round a chain of its g drafts; a round of no drafts gives one token for v). A constant g gives
    ``predicted_speedup_with_verify_cost``; v = 1 gives Thm 3.8's own assumption. A stop that reads only the
    drafter's q (the confidence schedules) leaves Eq. (1)'s model, each tested draft accepted with probability
    alpha, as it is for a constant gamma. None for no rounds."""
    if not drafts:
        return None
    tokens = sum(expected_tokens_per_round(alpha, g) for g in drafts) / len(drafts)
    return tokens / (c * sum(drafts) / len(drafts) + v)


def varying_gamma(trace: Trace) -> bool:
    """Whether the run's gamma schedule lets rounds draft different numbers of drafts by design (any schedule but
    the constant one; a token tree has none)."""
    schedule = trace.settings.get("gamma_schedule") or {"name": "constant"}
    return not trace.has_tree and schedule.get("name") not in (None, "constant")


def round_drafts(trace: Trace) -> list[int]:
    """The drafts of each round of a chain run, in order (0 for a round that drafted none)."""
    return [len(r.drafts) for r in trace.rounds]


def verify_cost_at(gamma: int, v: float, gamma_measured: float) -> float:
    """The verify cost at ``gamma`` from one measured at ``gamma_measured`` (in target steps):
    1 + (v - 1) gamma / gamma_measured. Assumes a pass costs a fixed part plus a part linear
    in the tokens it scores, anchored at one token = one target step; exact at gamma_measured."""
    return 1.0 + (v - 1.0) * gamma / gamma_measured if gamma_measured else v


def optimal_gamma(
    alpha: float, c: float, max_gamma: int = 16, v: float | None = None, gamma_measured: float | None = None
) -> int:
    """The gamma in 1..max_gamma with the largest predicted speedup: Thm 3.8, or, given the verify
    cost v measured at ``gamma_measured``, ``predicted_speedup_with_verify_cost`` with
    ``verify_cost_at``."""
    if v is None or not gamma_measured:
        return max(range(1, max_gamma + 1), key=lambda g: predicted_speedup(alpha, g, c))
    return max(
        range(1, max_gamma + 1),
        key=lambda g: predicted_speedup_with_verify_cost(alpha, g, c, verify_cost_at(g, v, gamma_measured)),
    )


def drafter_step_ms(*specs: Trace) -> float | None:
    """Mean drafting time per drafter forward pass over one or more speculative traces, in ms;
    None when they made no pass (prompt lookup)."""
    return metrics.step_ms(sum(t.draft_ms for t in specs), sum(t.drafter_forward_passes for t in specs))


def target_step_ms(*baselines: Trace) -> float | None:
    """Mean time of one single-token target pass over one or more autoregressive traces, in ms."""
    return metrics.step_ms(sum(t.verify_ms for t in baselines), sum(len(t.rounds) for t in baselines))


def cost_coefficient(spec: Trace, baseline: Trace) -> float | None:
    """c = drafter step time / target step time, both measured in the same session (ms / ms)."""
    return metrics.cost_coefficient(drafter_step_ms(spec), target_step_ms(baseline))


def verify_ms_per_round(*specs: Trace) -> float | None:
    """Mean time of the target's verify pass (and the round's one host transfer) per round, in ms."""
    return metrics.step_ms(sum(t.verify_ms for t in specs), sum(len(t.rounds) for t in specs))


def verify_cost(spec: Trace, baseline: Trace) -> float | None:
    """v = verify pass time per round / autoregressive target step time, both measured (ms / ms).

    Both include sampling and the one host transfer of their step, so the ratio isolates the
    cost of scoring gamma + 1 tokens instead of one."""
    return metrics.verify_cost(verify_ms_per_round(spec), target_step_ms(baseline))


def mean_gamma(*specs: Trace) -> float | None:
    """Drafts per round averaged over the rounds."""
    return metrics.ratio(sum(t.drafted for t in specs), sum(len(t.rounds) for t in specs))


def typical_gamma(trace: Trace) -> int | None:
    """The gamma most drafting rounds were allowed: the run's gamma for a constant schedule (its
    last round may be cut short near max_new_tokens); None before any round drafted."""
    counts: dict[int, int] = {}
    for r in trace.rounds:
        g = round_gamma(trace, r)
        if r.drafts and isinstance(g, int):
            counts[g] = counts.get(g, 0) + 1
    return max(counts, key=counts.get) if counts else None


def measured_speedup(spec: Trace, baseline: Trace) -> float | None:
    """Speculative tokens/s over autoregressive tokens/s."""
    a, b = spec.tokens_per_second, baseline.tokens_per_second
    return a / b if a and b else None


def accepted_drafts_distribution(alpha: float, gamma: int) -> list[float]:
    """P(k drafts accepted in a round), k = 0..gamma, if each tested draft is accepted with
    probability alpha independently: (1 - alpha) alpha^k for k < gamma, alpha^gamma for k = gamma (the capped
    geometric law behind Leviathan et al. 2023, Eq. (1); its mean + 1 is that equation)."""
    return [(1.0 - alpha) * alpha**k for k in range(gamma)] + [alpha**gamma]


def position_acceptance(alpha: float, position: int) -> float:
    """alpha^i: the chance that the i-th draft (1-based) of a round is accepted, under the same assumption."""
    return alpha**position


def round_gamma(trace: Trace, r) -> int | None:
    """The gamma a round was allowed: its own (schema 3), else the run's setting (older traces);
    None for a token tree's round (a tree has a depth, not a gamma; older tree traces recorded one)."""
    if getattr(r, "tree", None) is not None:
        return None
    return r.gamma if r.gamma is not None else trace.settings.get("gamma")


def accepted_per_round(trace: Trace, gamma: int | None = None) -> list[int]:
    """Accepted drafts in each round that drafted the full gamma it was allowed, that gamma being
    ``gamma`` (default: ``typical_gamma``, the run's own for a constant schedule); rounds cut
    short (near max_new_tokens, by a confidence stop, by a short prompt-lookup match) are left out."""
    gamma = gamma if gamma is not None else typical_gamma(trace)
    return [r.accepted_count for r in trace.rounds if r.drafts and len(r.drafts) == gamma == round_gamma(trace, r)]


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
