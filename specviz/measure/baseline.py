"""A speculative run beside its autoregressive baseline, in turns, on the same settings.

The page, ``record``, the drafter comparison and the gamma sweep all measure a speedup this way:
the two runs advance in turns (``specviz.measure.speedup.interleave``), so machine noise falls on both,
and the baseline stops at the speculative run's token count (equal work).
"""

from __future__ import annotations

from collections.abc import Iterator

from specviz.engine.chain import autoregressive_stream, speculative_stream
from specviz.engine.schedules import GammaSchedule
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
                  tree=None, **common) -> tuple[Trace, Trace]:
    """Both runs of ``with_baseline_stream`` to the end: (speculative trace, baseline trace)."""
    spec = base = None
    for spec, base in with_baseline_stream(input_ids, drafter, target, gamma=gamma, schedule=schedule, tree=tree, **common):
        pass
    return spec, base
