"""A speculative run beside its autoregressive baseline, in turns, on the same settings.

The page, ``record``, the drafter comparison and the gamma sweep all measure a speedup this way:
the two runs advance in turns (``specviz.measure.speedup.interleave``), so machine noise falls on both,
and the baseline stops at the speculative run's token count (equal work). The baseline runs on the engine the
speculative run got (``on_the_same_engine``): on a GPU both replay CUDA graphs, or, when the speculative run took the
dynamic cache (its graphs held by other runs, or an EAGLE run), both run eagerly, so the speedup compares
drafting alone.
"""

from __future__ import annotations

from collections.abc import Iterator

from specviz.engine.chain import autoregressive_stream, speculative_stream
from specviz.engine.schedules import GammaSchedule
from specviz.engine.stopping import StopCheck, asked, mark_stopped, run_steps
from specviz.measure.speedup import interleave
from specviz.trace import Trace


class Latest:
    """A trace stream that keeps the trace it yielded last (``latest``; None before its first)."""

    def __init__(self, stream: Iterator[Trace]):
        self.stream = stream
        self.latest: Trace | None = None

    def __iter__(self):
        return self

    def __next__(self) -> Trace:
        self.latest = next(self.stream)
        return self.latest


# the engines a baseline reruns as named (a trace's engine is the loops' ``cached``); graphs serve one run at a time
SAME_ENGINE = ("dynamic", "re-fed", "static")


def on_the_same_engine(speculative: Latest, input_ids: list[int], target, **common) -> Iterator[Trace]:
    """The autoregressive baseline of ``speculative``, started after its first round, on the engine it ran on
    (its settings' "engine": one of SAME_ENGINE as it is, graphs and anything else "auto")."""
    engine = speculative.latest.settings.get("engine") if speculative.latest is not None else None
    yield from autoregressive_stream(input_ids, target, cached=engine if engine in SAME_ENGINE else "auto", **common)


def paired(
    speculative: Iterator[Trace], input_ids: list[int], target, **common
) -> Iterator[tuple[Trace | None, Trace | None]]:
    """``interleave`` of ``speculative`` and its baseline on the same engine (``on_the_same_engine``): the
    speculative run always takes the first turn, so its engine is known when the baseline starts."""
    spec = Latest(speculative)
    return interleave(spec, on_the_same_engine(spec, input_ids, target, **common))


def with_baseline_stream(
    input_ids: list[int],
    drafter,
    target,
    gamma: int = 4,
    schedule: str | GammaSchedule = "constant",
    tree=None,
    **common,
) -> Iterator[tuple[Trace | None, Trace | None]]:
    """Yield (speculative trace, baseline trace) after each step of either run (None before a run starts).

    Args:
        input_ids, drafter, target, gamma, schedule, tree: as ``speculative_stream`` (the baseline takes none of them).
        common: sampling, max_new_tokens, eos_token_id, seed, tokenizer, vocab_size: shared by
            both runs, so they differ only in how tokens are drafted.

    Raises:
        ValueError: as ``speculative_stream`` and ``autoregressive_stream``.
    """
    return paired(
        speculative_stream(input_ids, drafter, target, gamma=gamma, schedule=schedule, tree=tree, **common),
        input_ids,
        target,
        **common,
    )


def with_baseline(
    input_ids: list[int],
    drafter,
    target,
    gamma: int = 4,
    schedule: str | GammaSchedule = "constant",
    tree=None,
    stop: StopCheck | None = None,
    **common,
) -> tuple[Trace | None, Trace | None]:
    """Both runs of ``with_baseline_stream`` to the end: (speculative trace, baseline trace).

    ``stop`` (``specviz.engine.stopping``) is asked before each step of either run; when it answers True
    both end there: each unfinished trace is marked "stopped", and a run not started yet is None.
    """
    return run_steps(
        with_baseline_steps(input_ids, drafter, target, gamma=gamma, schedule=schedule, tree=tree, stop=stop, **common)
    )


def with_baseline_steps(
    input_ids: list[int],
    drafter,
    target,
    gamma: int = 4,
    schedule: str | GammaSchedule = "constant",
    tree=None,
    stop: StopCheck | None = None,
    **common,
):
    """``with_baseline`` as steps (``specviz.engine.stopping.run_steps``): a generator yielding None after each step
    of either run (a server's device thread may take another job's step there), whose value is (speculative trace,
    baseline trace). Arguments, ``stop`` and errors as ``with_baseline``."""
    steps = with_baseline_stream(input_ids, drafter, target, gamma=gamma, schedule=schedule, tree=tree, **common)
    spec = base = None
    while not asked(stop):
        step = next(steps, None)
        if step is None:
            return spec, base
        spec, base = step
        yield None
    for trace in (spec, base):
        mark_stopped(trace, tokenizer=common.get("tokenizer"))
    return spec, base
