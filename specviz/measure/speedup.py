"""A measured speedup that machine noise hits alike, with its spread.

Timing the speculative run and then the autoregressive baseline lets anything else on the
machine (another process, a thermal step, a garbage collection) land on one run only: on a
shared 2-core machine five identical runs measured 0.86x to 4.42x that way. ``interleave``
advances the two runs in turns instead, a round of one then as many tokens of the other, so
each stretch of machine noise falls on both; each run's clock stops while it waits its turn
(the engine's clocks exclude time suspended at a yield), so neither is charged for the other.

``estimate`` then gives the whole-run speedup (speculative tokens/s over autoregressive
tokens/s, prefill included) and the decoding speedup with its spread: the ratio of the two runs'
decoding times over the same tokens, prefill excluded, and the middle half of that ratio over
windows of equal token counts, so a class sees how far one number can be trusted. The decoding
ratio is what a round's tokens over its time in target-alone steps gives (the headline's
decomposition adds up to it); the median of the windows, shown before, weighed a slow stretch as
much as a fast one and read 1.44x where the run's own times gave 1.56x. The whole-run number,
which carries the two prefills, can lie outside the spread.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass

from specviz.trace import Trace

# The spread beyond which the page says the speedup is too noisy to read: the middle half of
# the windows' speedups spans more than this share of the whole-run speedup.
TOO_WIDE = 0.5


def interleave(speculative: Iterator[Trace], baseline: Iterator[Trace]) -> Iterator[tuple[Trace | None, Trace | None]]:
    """Advance two trace streams in turns, the one with fewer tokens first; yield (spec, base) after each step.

    The baseline stops once it has as many tokens as the finished speculative run (or at its own
    end), so both are measured on equal work. A stream not started yet is None in the pair.
    Errors of either stream propagate.
    """
    spec = base = None
    spec_done = base_done = False
    while not (spec_done and base_done):
        spec_tokens = len(spec.output_ids) if spec is not None else 0
        base_tokens = len(base.output_ids) if base is not None else 0
        if spec_done or base_done:
            turn = "base" if spec_done else "spec"
        else:
            turn = "spec" if spec_tokens <= base_tokens else "base"
        if turn == "spec":
            spec = next(speculative, None) or spec
            spec_done = spec is None or spec.stop_reason is not None
        else:
            nxt = next(baseline, None)
            base = nxt or base
            base_done = nxt is None or base.stop_reason is not None
        if spec_done and base is not None and not base_done and len(base.output_ids) >= len(spec.output_ids):
            base.stop_reason = base.stop_reason or "max_new_tokens"  # equal work reached
            base.output_text = base.output_text or ""
            base_done = True
        yield spec, base


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
    low, high = (statistics.quantiles(ratios, n=4)[0], statistics.quantiles(ratios, n=4)[2]) if len(ratios) >= 2 else (ratios[0], ratios[0])
    spec_ms, base_ms = _time_at(spec, tokens) - _time_at(spec, 0), _time_at(baseline, tokens) - _time_at(baseline, 0)
    ratio = base_ms / spec_ms if spec_ms > 0 and base_ms > 0 else None
    return SpeedupEstimate(speedup=a / b, windows=ratios, low=low, high=high, decode_ratio=ratio)
