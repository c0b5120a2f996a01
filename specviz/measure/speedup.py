"""A measured speedup that machine noise hits alike, with its spread.

Timing the speculative run and then the autoregressive baseline lets anything else on the
machine (another process, a thermal step, a garbage collection) land on one run only: on a
shared 2-core machine five identical runs measured 0.86x to 4.42x that way. ``interleave``
advances the two runs in turns instead, a round of one then as many tokens of the other, so
each stretch of machine noise falls on both; each run's clock stops while it waits its turn
(the engine's clocks exclude time suspended at a yield), so neither is charged for the other.

``estimate`` (``specviz.records.speedup``, re-exported here) then gives the whole-run speedup and the decoding
speedup with its spread.
"""

from __future__ import annotations

from collections.abc import Iterator

from specviz.records.speedup import TOO_WIDE, SpeedupEstimate, _time_at, estimate  # noqa: F401  (a pure function of two traces: it lives with them)
from specviz.trace import Trace


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
