"""Why a long job (a sweep, a comparison, a batch) ends early, asked once per round inside it.

A ``Halt`` is the one stop check such a job hands the engine (``specviz.engine.stopping``): the engine
asks it before every round of every run, so the Stop button, a client that hung up
(``specviz.ui.state.client_gone``) and the job's time cap each end the job within the round under way,
not after the whole batch or drafter kind. It remembers the first reason it saw, so the job's last
message can say what stopped it.

On ZeroGPU the device half runs in a forked worker, where the page's state (the Stop button, the
queue) cannot be read: it gets the deadline alone (``for_device``), and the handler asks the whole
check between the worker's yields.
"""

from __future__ import annotations

import time

from specviz.engine.stopping import Deadline, StopCheck
from specviz.serving.gpu import on_zerogpu
from specviz.ui import state

BY_YOU, GONE, LIMIT = "by you", "client gone", "time limit"


def _now() -> float:
    return time.monotonic()


class Halt:
    """The stop check of one job: True once Stop was pressed in its session, its client is gone, or
    ``cap_s`` seconds have passed since it was made. ``reason`` is the first of BY_YOU, GONE, LIMIT it
    answered True for (None while it has not)."""

    def __init__(self, request, cap_s: float):
        self.request = request
        self.session = state.session_of(request)
        self.cap_s = cap_s
        self.started = _now()
        self.reason: str | None = None

    def __call__(self) -> bool:
        if self.reason is None:
            if state.should_stop(self.session):
                self.reason = BY_YOU
            elif state.client_gone(self.request):
                self.reason = GONE
            elif _now() - self.started >= self.cap_s:
                self.reason = LIMIT
        return self.reason is not None

    def for_device(self) -> StopCheck:
        """The check to pass the device half: this one, or the deadline alone on ZeroGPU (see the module docstring)."""
        return Deadline(time.monotonic() + self.cap_s - (_now() - self.started)) if on_zerogpu() else self

    def said(self) -> str:
        """What stopped the job, as the end of "Stopped ...": "by you" or "at its time limit of N s"."""
        return "by you" if self.reason == BY_YOU else f"at its time limit of {self.cap_s:.0f} s"
