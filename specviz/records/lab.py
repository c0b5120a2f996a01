"""The exactness lab's record: the counts of an experiment against the exact law, and a planted fault's description.

The experiment that fills a ``Result`` is ``specviz.lab.experiment``; the faults are ``specviz.lab.faults``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import chisquare

VOCAB = 8  # the lab's own models' vocabulary
ALPHA = 1e-4  # the significance level of the chi-square test


@dataclass
class Result:
    """The state of an experiment after some runs.

    Attributes:
        counts: (vocab * vocab,) how often each two-token continuation came out.
        exact: (vocab * vocab,) its exact probability under the target.
        runs: speculative runs so far.
        accepted, drafted: draft verdicts over the runs.
    """

    counts: np.ndarray
    exact: np.ndarray
    runs: int
    accepted: int = 0
    drafted: int = 0

    def test(self, counts: np.ndarray | None = None) -> tuple[float, float]:
        """(chi-square statistic, p-value) of ``counts`` (default: this experiment's) against the exact law.

        Cells expected under 5 are pooled into one; a pooled cell the law says is impossible must
        stay empty (else the p-value is 0).
        """
        counts = self.counts if counts is None else counts
        n = counts.sum()
        expected = self.exact * n
        big = expected >= 5
        observed = np.append(counts[big], counts[~big].sum())
        wanted = np.append(expected[big], expected[~big].sum())
        if wanted[-1] == 0:
            if observed[-1] > 0:
                return float("inf"), 0.0
            observed, wanted = observed[:-1], wanted[:-1]
        if len(wanted) < 2:
            return 0.0, 1.0
        stat, pvalue = chisquare(observed, wanted * observed.sum() / wanted.sum())
        return float(stat), float(pvalue)

    @property
    def total_variation(self) -> float:
        """TV distance between the empirical frequencies and the exact law: half the L1 distance."""
        return 0.5 * float(np.abs(self.counts / max(1, self.runs) - self.exact).sum())

    def reference(self, seed: int = 0) -> np.ndarray:
        """Counts of as many independent draws from the exact law (what the target alone would give):
        the sampling noise a correct engine shows at this sample size."""
        return np.random.default_rng(seed).multinomial(self.runs, self.exact / self.exact.sum()).astype(float)


@dataclass(frozen=True)
class Fault:
    """A planted fault: its name, where it was seen, and what the lab should show."""

    name: str
    seen: str
    expect: str
