"""Asking a long loop to end between rounds: a stop check, a plain callable its caller owns.

A loop that runs many rounds before it returns (a batch, ``specviz.engine.batch``) and the
measurements that chain several runs (``specviz.measure``: a comparison, a sweep, the throughput of
a batch) take ``stop``: a callable with no arguments that answers whether to end now. It is asked
once before each round, so a run asked to stop ends within the round under way. The engine never
asks why (a Stop button, a client that hung up, a time cap): the caller knows, and says so.

A loop that ends this way marks each unfinished trace ``stop_reason = STOPPED``; its rounds so far
are kept and are valid, only shorter than asked. A step whose partial result means nothing (a
calibration, whose choice needs all its runs) raises ``Stopped`` instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from specviz.trace import STOPPED  # the stop_reason of a trace its caller ended early, defined with the trace

StopCheck = Callable[[], bool]
# A long step's progress, told to its caller as it goes: (parts done, parts in all), e.g. a calibration's passes.
ProgressReport = Callable[[int, int], None]


class Stopped(Exception):
    """Raised by a step with no partial result to keep (a calibration) when its stop check asked it to end."""


def asked(stop: StopCheck | None) -> bool:
    """Whether ``stop`` (None: never) asks to end now."""
    return stop is not None and bool(stop())


def either(*checks: StopCheck | None) -> StopCheck:
    """A stop check that answers True when any of ``checks`` does (None: never), asked in order."""
    return lambda: any(asked(c) for c in checks)


def run_steps(steps, progress: ProgressReport | None = None):
    """Run a long step's generator to its end and return its value: ``steps`` yields between short pieces of work
    (a server's device thread runs other jobs' steps there; ``specviz.serving.device_thread``), each item a
    (parts done, parts in all) told to ``progress`` (None: nobody; an item None is told to nobody)."""
    while True:
        try:
            told = next(steps)
        except StopIteration as end:
            return end.value
        if progress is not None and told is not None:
            progress(*told)


def finish(stream, stop: StopCheck | None = None):
    """Run an engine stream (one that yields the same growing Trace after every round) to its end and return
    the last Trace (None if it yielded none), asking ``stop`` (None: never) after every round.

    Raises:
        Stopped: ``stop`` asked to end; the run ends within the round under way.
    """
    last = None
    for last in stream:
        if asked(stop):
            raise Stopped
    return last


def mark_stopped(trace, total_ms: float | None = None, tokenizer=None) -> None:
    """End an unfinished ``specviz.trace.Trace`` here: ``stop_reason`` STOPPED, its text decoded (with
    ``tokenizer``), ``total_ms`` set when given (ms). A finished trace (None included) is left as it is."""
    if trace is None or trace.stop_reason:
        return
    trace.stop_reason = STOPPED
    if total_ms is not None:
        trace.total_ms = total_ms
    trace.output_text = tokenizer.decode(trace.output_ids) if tokenizer is not None else ""


@dataclass(frozen=True)
class Deadline:
    """A stop check that answers True from ``at`` on (``time.monotonic()`` seconds).

    Plain data, so it survives being pickled into another process (a ZeroGPU worker), where a
    check that reads the page's state could not be asked.
    """

    at: float

    @classmethod
    def after(cls, seconds: float) -> "Deadline":
        """The deadline ``seconds`` from now."""
        return cls(time.monotonic() + seconds)

    def __call__(self) -> bool:
        return time.monotonic() >= self.at
