"""Why a long job (a sweep, a comparison, a batch) ends early, asked once per round inside it.

A ``Halt`` is the one stop check such a job hands the engine (``specviz.engine.stopping``): the engine asks it before
every round of every run, so the Stop button, a client that hung up (``specviz.ui.page.state.client_gone``), the job's
time cap and the device share (``specviz.ui.running.share``: the job has had its share while another visitor's job runs
or waits; asked once the job holds its ``device_turn``) each end the job within the round under way, not after the whole
batch or drafter kind. It remembers the first reason it saw, so the job's last message can say what stopped it.

On ZeroGPU the device half runs in a forked worker, where the page's state (the Stop button, the
queue) cannot be read: it gets the deadline alone (``for_device``), and the handler asks the whole
check between the worker's yields.
"""

from __future__ import annotations

import time

from specviz.engine.stopping import Deadline, StopCheck
from specviz.serving.gpu import on_zerogpu
from specviz.ui.running import share
from specviz.ui.page import state

BY_YOU, GONE, LIMIT, SHARED = "by you", "client gone", "time limit", "device shared"


def _now() -> float:
    return time.monotonic()


class Halt:
    """The stop check of one job: True once Stop was pressed in its session, its client is gone,
    ``cap_s`` seconds have passed since it was made, or (inside its ``device_turn``) it has had its share of
    the device while another visitor's job runs or waits. ``reason`` is the first of BY_YOU, GONE, LIMIT,
    SHARED it answered True for (None while it has not)."""

    def __init__(self, request, cap_s: float):
        self.request = request
        self.session = state.session_of(request)
        self.cap_s = cap_s
        self.started = _now()
        self.reason: str | None = None
        self.turn: share.LongTurn | None = None

    def __call__(self) -> bool:
        if self.reason is None:
            if state.should_stop(self.session):
                self.reason = BY_YOU
            elif state.client_gone(self.request):
                self.reason = GONE
            elif _now() - self.started >= self.cap_s:
                self.reason = LIMIT
            elif self.turn is not None and self.turn.over():
                self.reason = SHARED
        return self.reason is not None

    def device_turn(self) -> share.LongTurn:
        """``with halt.device_turn() as turn:`` wait for the job's turn on the device (asking this check while it
        waits), then hold it with its share asked every round; ``turn.started`` is False when this check ended the
        wait."""
        self.turn = share.LongTurn(self.request, self)
        return self.turn

    def for_device(self) -> StopCheck:
        """The check to pass the device half: this one, or the deadline alone on ZeroGPU (see the module docstring)."""
        return Deadline(time.monotonic() + self.cap_s - (_now() - self.started)) if on_zerogpu() else self

    def said(self) -> str:
        """What stopped the job, as the end of "Stopped ...": "by you", "at its time limit of N s" or that it gave
        the device up."""
        if self.reason == BY_YOU:
            return "by you"
        if self.reason == SHARED:
            return shared_said()
        return f"at its time limit of {self.cap_s:.0f} s"


def shared_said() -> str:
    """How a long job that gave the device up says so, after "Stopped "."""
    return (f"to give the device to another visitor's job (while others run or wait, a long job keeps it at most "
            f"{share.SHARE_S:.0f} s; try again when the queue is empty)")
