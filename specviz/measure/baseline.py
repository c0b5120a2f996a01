"""A speculative run beside its autoregressive baseline, in turns, on the same settings.

The page, ``record``, the drafter comparison and the gamma sweep all measure a speedup this way:
the two runs advance in turns (``specviz.measure.speedup.interleave``), so machine noise falls on both,
and the baseline stops at the speculative run's token count (equal work).
"""

from __future__ import annotations

from collections.abc import Iterator

from specviz.engine.chain import autoregressive_stream, speculative_stream
from specviz.engine.schedules import GammaSchedule
from specviz.engine.stopping import StopCheck, asked, mark_stopped
from specviz.measure.speedup import interleave
from specviz.trace import Trace


def with_baseline_stream(input_ids: list[int], drafter, target, gamma: int = 4, schedule: str | GammaSchedule = "constant",
                         tree=None, **common) -> Iterator[tuple[Trace | None, Trace | None]]:
    """Yield (speculative trace, baseline trace) after each step of either run (None before a run starts).

    Args:
        input_ids, drafter, target, gamma, schedule, tree: as ``speculative_stream`` (the baseline takes none of them).
        common: sampling, max_new_tokens, eos_token_id, seed, tokenizer, vocab_size: shared by
            both runs, so they differ only in how tokens are drafted.

    Raises:
        ValueError: as ``speculative_stream`` and ``autoregressive_stream``.
    """
    return interleave(speculative_stream(input_ids, drafter, target, gamma=gamma, schedule=schedule, tree=tree, **common),
                      autoregressive_stream(input_ids, target, **common))


def with_baseline(input_ids: list[int], drafter, target, gamma: int = 4, schedule: str | GammaSchedule = "constant",
                  tree=None, stop: StopCheck | None = None, **common) -> tuple[Trace | None, Trace | None]:
    """Both runs of ``with_baseline_stream`` to the end: (speculative trace, baseline trace).

    ``stop`` (``specviz.engine.stopping``) is asked before each step of either run; when it answers True
    both end there: each unfinished trace is marked "stopped", and a run not started yet is None.
    """
    steps = with_baseline_stream(input_ids, drafter, target, gamma=gamma, schedule=schedule, tree=tree, **common)
    spec = base = None
    while not asked(stop):
        step = next(steps, None)
        if step is None:
            return spec, base
        spec, base = step
    for trace in (spec, base):
        mark_stopped(trace, tokenizer=common.get("tokenizer"))
    return spec, base
