"""A measured speedup with its spread, from a speculative trace and its baseline.

``estimate`` gives the whole-run speedup (speculative tokens/s over autoregressive
tokens/s, prefill included) and the decoding speedup with its spread: the ratio of the two runs'
decoding times over the same tokens, prefill excluded, and the middle half of that ratio over
windows of equal token counts, so a class sees how far one number can be trusted. The decoding
ratio is what a round's tokens over its time in target-alone steps gives (the headline's
decomposition adds up to it); the median of the windows, shown before, weighed a slow stretch as
much as a fast one and read 1.44x where the run's own times gave 1.56x. The whole-run number,
which carries the two prefills, can lie outside the spread.

The runs themselves are timed in turns by ``specviz.measure.speedup.interleave``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from specviz.trace import Trace

# The spread beyond which the page says the speedup is too noisy to read: the middle half of
# the windows' speedups spans more than this share of the whole-run speedup.
TOO_WIDE = 0.5


@dataclass(frozen=True)
class SpeedupEstimate:
    """A measured speedup with its spread.

    Attributes:
        speedup: speculative tokens/s / autoregressive tokens/s over the whole runs, prefill included.
        windows: autoregressive ms / speculative ms in each window of equal token counts (prefill left out).
        low, high: the first and third quartiles of ``windows`` (the middle half of the decoding speedups).
        decode_ratio: autoregressive ms / speculative ms over all the tokens both runs emitted, prefill left out
            (None: the median of ``windows`` stands in, for estimates made before it existed).
    """

    speedup: float
    windows: list[float]
    low: float
    high: float
    decode_ratio: float | None = None

    @property
    def decode_speedup(self) -> float:
        """The decoding speedup, prefill excluded: the two runs' decoding times over the same tokens, so that a round's
        tokens over its time in steps of the target alone gives it (``specviz.views.verdict``); ``low`` and ``high``
        are its spread over stretches of the run."""
        return self.decode_ratio if self.decode_ratio is not None else statistics.median(self.windows)

    @property
    def clears_one(self) -> bool | None:
        """True when the whole middle half is above 1x, False when it is below, None when it holds 1x (no clear
        difference) or when there is a single stretch (too few rounds for a spread: fewer than 8)."""
        if len(self.windows) < 2:
            return None
        return True if self.low > 1.0 else False if self.high < 1.0 else None

    @property
    def relative_spread(self) -> float:
        """(high - low) / decode_speedup."""
        return (self.high - self.low) / self.decode_speedup

    @property
    def readable(self) -> bool:
        """False when the spread is over TOO_WIDE of the speedup: too noisy to read."""
        return self.relative_spread <= TOO_WIDE


def _time_at(trace: Trace, tokens: float) -> float:
    """ms since the start when ``trace`` had emitted at least ``tokens`` tokens, linear within a round."""
    done, before = 0, trace.prefill_ms
    for r in trace.rounds:
        n = len(r.emitted_ids)
        if done + n >= tokens:
            return before + (r.end_ms - before) * (tokens - done) / n if n else r.end_ms
        done, before = done + n, r.end_ms
    return trace.total_ms


def estimate(spec: Trace, baseline: Trace, windows: int = 8) -> SpeedupEstimate | None:
    """The whole-run speedup and its spread over up to ``windows`` windows of equal token counts.

    Each window holds at least four speculative rounds (a round's tokens arrive at once, so a
    smaller window would measure one round's luck). None when either run has no tokens or time.

    Raises nothing; a run with fewer than eight rounds gets a single window (spread 0).
    """
    a, b = spec.tokens_per_second, baseline.tokens_per_second
    tokens = min(len(spec.output_ids), len(baseline.output_ids))
    if not a or not b or tokens == 0:
        return None
    k = max(1, min(windows, len(spec.rounds) // 4))
    edges = [tokens * j / k for j in range(k + 1)]
    ratios = []
    for lo, hi in zip(edges, edges[1:]):
        spec_ms = _time_at(spec, hi) - _time_at(spec, lo)
        base_ms = _time_at(baseline, hi) - _time_at(baseline, lo)
        if spec_ms > 0 and base_ms > 0:
            ratios.append(base_ms / spec_ms)
    if not ratios:
        return None
    low, high = (
        (statistics.quantiles(ratios, n=4)[0], statistics.quantiles(ratios, n=4)[2])
        if len(ratios) >= 2
        else (ratios[0], ratios[0])
    )
    spec_ms, base_ms = _time_at(spec, tokens) - _time_at(spec, 0), _time_at(baseline, tokens) - _time_at(baseline, 0)
    ratio = base_ms / spec_ms if spec_ms > 0 and base_ms > 0 else None
    return SpeedupEstimate(speedup=a / b, windows=ratios, low=low, high=high, decode_ratio=ratio)
