"""A gamma sweep's record: the same prompt and seed decoded with gamma = 1..8, against one baseline.

Each point keeps the counts and times that the theory needs (Leviathan et al. 2023, Sec. 3),
so a sweep saved to JSON can be plotted again without the models. The sweep itself is run by
``specviz.measure.sweep.sweep_stream``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specviz import metrics
from specviz.trace import Trace


@dataclass
class SweepPoint:
    """One speculative run of the sweep. Times in ms.

    ``rejected`` and ``verify_ms`` are None in sweeps saved before trace schema 3;
    ``drafter_passes`` (drafter forward passes: one per draft for a model, none for prompt
    lookup) is None in sweeps saved before it was recorded, which drafted with a model.
    """

    gamma: int
    tokens: int
    rounds: int
    drafted: int
    accepted: int
    total_ms: float
    draft_ms: float
    rejected: int | None = None
    verify_ms: float | None = None
    baseline_tokens_per_second: float | None = None
    drafter_passes: int | None = None

    @classmethod
    def of(cls, trace: Trace, baseline: Trace | None = None) -> "SweepPoint":
        """The point of a speculative run, and of the baseline run in turns with it (if any)."""
        return cls(
            gamma=int(trace.settings["gamma"]), tokens=len(trace.output_ids), rounds=len(trace.rounds),
            drafted=trace.drafted, accepted=trace.accepted, total_ms=trace.total_ms, draft_ms=trace.draft_ms,
            rejected=trace.rejected, verify_ms=trace.verify_ms,
            baseline_tokens_per_second=baseline.tokens_per_second if baseline is not None else None,
            drafter_passes=trace.drafter_forward_passes,
        )

    @property
    def acceptance_rate(self) -> float | None:
        """Draft acceptance rate: accepted / drafted."""
        return metrics.draft_acceptance_rate(self.accepted, self.drafted)

    @property
    def alpha(self) -> float | None:
        """accepted / (accepted + rejected); None when unknown or nothing was tested."""
        return metrics.alpha(self.accepted, self.rejected) if self.rejected is not None else None

    @property
    def tokens_per_round(self) -> float | None:
        return metrics.tokens_per_round(self.tokens, self.rounds)

    @property
    def tokens_per_second(self) -> float | None:
        return metrics.tokens_per_second(self.tokens, self.total_ms)

    @property
    def passes(self) -> int:
        """Drafter forward passes (older sweeps, all with a drafter model: one per draft)."""
        return self.drafter_passes if self.drafter_passes is not None else self.drafted


@dataclass
class Sweep:
    """Points for several gammas and the autoregressive baseline they are compared with.

    Attributes:
        baseline_tokens_per_second: the baseline's speed, in tokens/s.
        target_step_ms: the baseline's mean time per target pass, in ms.
    """

    baseline_tokens_per_second: float
    target_step_ms: float
    points: list[SweepPoint] = field(default_factory=list)
    # the drafter kind every point ran with (None in sweeps saved before it was recorded: "model")
    drafter: str | None = None
    schedule: str | None = None  # the gamma schedule's name; a point's gamma is its first round's (None: "constant")

    def speedup(self, point: SweepPoint) -> float | None:
        """Measured speedup of one point: its tokens/s over those of the baseline run in turns with
        it (sweeps saved before that: over the sweep's one baseline)."""
        tps = point.tokens_per_second
        base = point.baseline_tokens_per_second or self.baseline_tokens_per_second
        return tps / base if tps and base else None

    @property
    def acceptance_rate(self) -> float | None:
        """Pooled over all points: accepted drafts / drafted tokens (the draft acceptance rate)."""
        return metrics.draft_acceptance_rate(sum(p.accepted for p in self.points), sum(p.drafted for p in self.points))

    @property
    def alpha(self) -> float | None:
        """Pooled over all points: accepted / (accepted + rejected); None for sweeps saved before
        trace schema 3 (they did not count rejections), since accepted / drafted is not alpha."""
        if any(p.rejected is None for p in self.points):
            return None
        return metrics.alpha(sum(p.accepted for p in self.points), sum(p.rejected for p in self.points))

    def verify_cost(self, point: SweepPoint) -> float | None:
        """v of one point: its verify time per round / the baseline's target step time (ms / ms)."""
        if point.verify_ms is None:
            return None
        return metrics.verify_cost(metrics.step_ms(point.verify_ms, point.rounds), self.target_step_ms)

    @property
    def cost_coefficient(self) -> float | None:
        """Pooled c: drafting time per drafter pass over all points / the target's step time
        (None without drafter passes: prompt lookup)."""
        drafter_ms = metrics.step_ms(sum(p.draft_ms for p in self.points), sum(p.passes for p in self.points))
        return metrics.cost_coefficient(drafter_ms, self.target_step_ms)
