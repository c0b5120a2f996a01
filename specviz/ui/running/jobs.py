"""Long jobs that no visitor can use to hold the app: a slot per kind of work held by the thread
doing the work, a wall-clock cap, and a cancellation point between chunks.

Gradio frees an event's concurrency slot as soon as the event is cancelled, while the worker
thread is still inside the generator's current chunk (it closes the generator only once that chunk
returns). Counted by Gradio alone, cancelling would start the next queued job beside the one still
running: 34 queued-and-cancelled lab runs gave 22 concurrent lab threads. ``guarded`` counts the
threads instead: a job takes its kind's slot in the thread that runs it and gives it back in the
generator's ``finally``, which runs when Gradio closes the generator after the chunk under way, or
when the job ends. A job that finds every slot of its kind taken waits up to WAIT_S (a cancelled
job ahead of it finishes its chunk meanwhile), then is refused with a message.

Every job yields once before any work (nothing changes on the page): a job cancelled while it
waited is closed there and does no work at all.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import time
from collections.abc import Callable

import gradio as gr

from specviz.ui.guard.checks import mistake

WAIT_S = float(os.environ.get("SPECVIZ_SLOT_WAIT_S", "30"))


class Slots:
    """At most ``n`` jobs of one kind at work at once, counted by the threads doing the work."""

    def __init__(self, kind: str, n: int):
        self.kind, self.n = kind, n
        self._free = threading.BoundedSemaphore(n)
        self._lock = threading.Lock()
        self.busy = 0  # jobs holding a slot now (read by tests and the load figures)
        self.peak = 0  # the most that ever held one at once

    def acquire(self, wait_s: float = WAIT_S) -> bool:
        if not self._free.acquire(timeout=wait_s):
            return False
        with self._lock:
            self.busy += 1
            self.peak = max(self.peak, self.busy)
        return True

    def release(self) -> None:
        with self._lock:
            self.busy -= 1
        self._free.release()


# Work that runs beside the device's runs without being one: the lab's chunks, loads and exports.
# They take turns, one step at a time (each kind keeps its own slot and queue as well), so a flood
# of all three holds at most one core and the GIL's share of one thread beside Generate.
# Measured on two busy cores, an 8-token generate under lab + export + load floods: median
# 16.6 s with each kind free to run beside the others, against 1.1 s idle.
BACKGROUND = threading.BoundedSemaphore(1)


class background_step:
    """``with background_step():`` one step of background work (raises gr.Error after WAIT_S)."""

    def __enter__(self):
        if not BACKGROUND.acquire(timeout=WAIT_S):
            raise mistake("The server is busy: try again in a minute.", title="Busy")

    def __exit__(self, *exc):
        BACKGROUND.release()


# One pool per kind of work; Gradio's concurrency limits (specviz.ui.page.layout) match these sizes.
SLOTS = {
    "lab": Slots("lab", 1),
    "long": Slots("long", 1),  # sweep, compare, batch
    "export": Slots("export", 1),
}


def guarded(
    kind: str,
    fn: Callable,
    cap_s: float | None,
    skip: Callable[[], object] = dict,
    on_cap: Callable[[], object] | None = None,
    background: bool = False,
):
    """``fn`` (a generator function: a Gradio handler) run under ``SLOTS[kind]`` with a wall-clock cap.

    The wrapper yields ``skip()`` first (a cancellation point before any work), then what ``fn``
    yields. Past ``cap_s`` seconds (checked between ``fn``'s yields) it closes ``fn`` and yields
    ``on_cap()`` if given. ``background``: each step of ``fn`` takes its turn with the other background
    work (``background_step``). The signature stays ``fn``'s, so Gradio still injects request and progress.

    Raises:
        gr.Error: every slot of the kind stayed taken for WAIT_S seconds.
    """
    slots = SLOTS[kind]
    assert inspect.isgeneratorfunction(fn), fn

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not slots.acquire():
            raise mistake(f"The server is busy with another {kind} job: try again in a minute.", title="Busy")
        try:
            yield skip()
            start = time.monotonic()
            inner = fn(*args, **kwargs)
            try:
                while True:
                    if background:
                        with background_step():
                            out = next(inner, StopIteration)
                    else:
                        out = next(inner, StopIteration)
                    if out is StopIteration:
                        return
                    yield out
                    if cap_s is not None and time.monotonic() - start > cap_s:
                        if on_cap is not None:
                            yield on_cap()
                        return
            finally:
                inner.close()
        finally:
            slots.release()

    return run


def guarded_call(kind: str, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` (one bounded step of background work, not a generator) under ``SLOTS[kind]``."""
    slots = SLOTS[kind]
    if not slots.acquire():
        raise mistake(f"The server is busy with another {kind} job: try again in a minute.", title="Busy")
    try:
        with background_step():
            return fn(*args, **kwargs)
    finally:
        slots.release()


def skips(n: int) -> Callable[[], tuple]:
    """A first output for a handler with ``n`` positional outputs: leave every one as it is."""
    return lambda: (gr.skip(),) * n
