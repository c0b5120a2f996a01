"""Gamma schedules: how many drafts each round may propose.

- ``constant``: the same gamma every round (Leviathan et al. 2023).
- ``heuristic``: transformers' assisted-generation schedule: gamma + 2 after a round that accepted
  every draft, otherwise gamma - 1, never below 1 (capped here at MAX_GAMMA).
- ``confidence``: draft until the drafter's largest q falls below a threshold (the draft that fell
  below it is the round's last), at most gamma drafts; under greedy decoding, where q is one-hot,
  the drafter's softmax at temperature 1 stands in for q; transformers'
  ``assistant_confidence_threshold`` tests the drafted token's probability instead.
- ``path``: draft until the path's confidence, the product of the drafter's largest q over the round's drafts so
  far, falls below a threshold (EAGLE-2's path value, Li et al. 2024, Sec. 4, as a chain's stop rule; see
  ``PathConfidence``), at most gamma drafts.
- ``optimal``: each round, the gamma in 1..MAX_GAMMA that maximises Leviathan et al.'s predicted
  speedup (Thm. 3.8) from the alpha and cost measured so far in the run (see ``Optimal``).

Any schedule keeps the output exact: a round's gamma depends only on earlier rounds, and the
confidence stop only on the drafter's own draws, never on the target's verdicts of this round
(the drafts are tested one by one with the same rule, however many there are).
"""

from __future__ import annotations

import torch

from specviz import metrics
from specviz.theory import predicted_speedup
from specviz.trace import MAX_GAMMA

SCHEDULES = ("constant", "heuristic", "confidence", "path", "optimal")
LABELS = {"constant": "constant", "heuristic": "heuristic (+2 / -1)", "confidence": "confidence threshold",
          "path": "path confidence (up to gamma)", "optimal": "theory-guided (best predicted gamma)"}
# The thresholds a schedule takes when none is given: a draft's own largest q (``confidence``, transformers'
# default) and the path's product of them (``path``: ``PathConfidence``'s docstring says why 0.3).
DEFAULT_THRESHOLDS = {"confidence": 0.4, "path": 0.3}


class GammaSchedule:
    """A constant gamma; the base of the others.

    Args:
        gamma: drafts per round (1..MAX_GAMMA); the first round's for adaptive schedules.

    Raises:
        ValueError: gamma out of range.
    """

    name = "constant"

    def __init__(self, gamma: int):
        if not isinstance(gamma, int) or isinstance(gamma, bool) or not 1 <= gamma <= MAX_GAMMA:
            raise ValueError(f"gamma must be a whole number in 1..{MAX_GAMMA}, got {gamma!r}")
        self.gamma = gamma

    def next_gamma(self) -> int:
        """The most drafts the next round may propose."""
        return self.gamma

    @property
    def most(self) -> int:
        """The most drafts any round of the run may propose: gamma, or MAX_GAMMA for a schedule that raises it."""
        return self.gamma

    def keep_drafting(self, q: torch.Tensor) -> bool:
        """After a draft drawn from q (1, vocab): may the round draft another?"""
        return True

    def observe(self, drafted: int, accepted: int, tested: int, draft_ms: float, verify_ms: float) -> None:
        """Told each round's outcome: drafts proposed, accepted, tested (accepted + rejected), times in ms."""

    def describe(self) -> dict:
        return {"name": self.name, "gamma": self.gamma}


class Heuristic(GammaSchedule):
    """transformers' heuristic: +2 after a round that accepted every draft, -1 otherwise (floor 1)."""

    name = "heuristic"
    most = MAX_GAMMA

    def observe(self, drafted, accepted, tested, draft_ms, verify_ms):
        if drafted == 0:
            return
        self.gamma = min(MAX_GAMMA, self.gamma + 2) if accepted == drafted else max(1, self.gamma - 1)


class Confidence(GammaSchedule):
    """Stop drafting once the drafter's largest q is below ``threshold`` (in (0, 1)); at most gamma drafts.

    Each test reads one number from the device, a synchronisation per draft.

    Raises:
        ValueError: threshold outside (0, 1).
    """

    name = "confidence"

    def __init__(self, gamma: int, threshold: float = DEFAULT_THRESHOLDS["confidence"]):
        super().__init__(gamma)
        if not 0.0 < float(threshold) < 1.0:
            raise ValueError(f"the confidence threshold must be in (0, 1), got {threshold!r}")
        self.threshold = float(threshold)

    def keep_drafting(self, q):
        return float(q.max()) >= self.threshold

    def describe(self):
        return {"name": self.name, "gamma": self.gamma, "threshold": self.threshold}


class PathConfidence(Confidence):
    """Stop drafting once the path's confidence, the product of the drafter's largest q over this round's drafts,
    is below ``threshold`` (in (0, 1)); at most gamma drafts.

    The drafter's largest q estimates the chance that its draft is accepted (under greedy decoding its softmax at
    temperature 1 stands in, as for ``confidence``), so the product over the round estimates the chance that every
    draft so far is accepted: that the next draft would be tested at all. EAGLE-2 (Li et al. 2024, Sec. 4) ranks
    tree nodes by this path value; here it ends a chain. One more draft costs c target steps and pays about path *
    alpha tokens, so it is worth drafting while path > S c / alpha, S the run's tokens per target step: near 0.3
    for the English pair on a CPU (c 0.11, alpha 0.55, S 1.5), the default; measured there, 0.2-0.3 predict within
    1 % of each other greedy and 0.3 the most of 0.25-0.5 at T 0.7 top-p 0.9 (``docs/drafters.md``). Unlike a
    per-draft threshold it drafts long after a run of sure drafts and stops early after two doubtful ones.

    The product restarts at each round's ``next_gamma``; a batch gives every row its own copy of the schedule.

    Raises:
        ValueError: threshold outside (0, 1).
    """

    name = "path"

    def __init__(self, gamma: int, threshold: float = DEFAULT_THRESHOLDS["path"]):
        super().__init__(gamma, threshold)
        self.path = 1.0

    def next_gamma(self) -> int:
        self.path = 1.0
        return self.gamma

    def keep_drafting(self, q):
        self.path *= float(q.max())
        return self.path >= self.threshold


class Optimal(GammaSchedule):
    """Each round, argmax over g of Thm 3.8's speedup (1 - a^(g+1)) / ((1 - a)(g c + 1)).

    a is alpha from the run so far with one accepted and one rejected draft added as a prior,
    (accepted + 1) / (tested + 2), so a few lucky rounds cannot send gamma to its cap. c is the
    drafting time per draft over the verify pass's time per round, both measured so far in this
    run (the speculative run has no autoregressive step to divide by; the verify pass is its
    nearest stand-in). The first round uses ``gamma``.
    """

    name = "optimal"
    most = MAX_GAMMA

    def __init__(self, gamma: int):
        super().__init__(gamma)
        self.accepted = self.tested = self.drafted = 0
        self.draft_ms = self.verify_ms = 0.0
        self.rounds = 0

    def observe(self, drafted, accepted, tested, draft_ms, verify_ms):
        self.accepted += accepted
        self.tested += tested
        self.drafted += drafted
        self.draft_ms += draft_ms
        self.verify_ms += verify_ms
        self.rounds += 1
        if self.drafted and self.verify_ms > 0:
            alpha = metrics.alpha(self.accepted + 1, self.tested - self.accepted + 1)  # one of each as a prior
            c = metrics.cost_coefficient(
                metrics.step_ms(self.draft_ms, self.drafted), metrics.step_ms(self.verify_ms, self.rounds)
            )
            self.gamma = max(range(1, MAX_GAMMA + 1), key=lambda g: predicted_speedup(alpha, g, c))


def make_schedule(name: str, gamma: int, threshold: float | None = None) -> GammaSchedule:
    """The schedule called ``name`` (one of SCHEDULES), starting at ``gamma``; ``threshold`` is the confidence
    schedules' (None: theirs in DEFAULT_THRESHOLDS) and unused by the others.

    Raises:
        ValueError: an unknown name, gamma or threshold out of range.
    """
    kinds = {"constant": GammaSchedule, "heuristic": Heuristic, "confidence": Confidence, "path": PathConfidence,
             "optimal": Optimal}
    if name not in kinds:
        raise ValueError(f"gamma schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")
    if name in DEFAULT_THRESHOLDS:
        return kinds[name](gamma, DEFAULT_THRESHOLDS[name] if threshold is None else threshold)
    return kinds[name](gamma)
