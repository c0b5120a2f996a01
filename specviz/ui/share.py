"""The device shared between visitors: a job gives the device up after its share while another visitor
waits, and the queue serves the visitors who used it least first.

Fair order per address alone let one heavy run hold the device for 121 s (two runs of RUN_SECONDS_MAX)
and two attacker addresses make a victim wait 245 s. So:

- ``must_yield``: a device job (Generate, /run) that has run SHARE_S seconds while a job of another
  address waits for the device stops at its next round, so a visitor who joins waits at most about
  SHARE_S plus a round for each job ahead of it (alone on the device a job keeps its full time limit);
- ``charge`` / ``used``: the device seconds each address used over the last WINDOW_S seconds; the
  admission order (``specviz.ui.admission``) puts the waiting jobs of the addresses that used least first,
  so a visitor who has used nothing goes ahead of every flooding address's waiting jobs.

The long jobs (Compare, Batch, the gamma sweep) run beside Generate, in a queue of their own, on the same
device: a heavy batch from one address slowed every other address's short run for its whole 180 s. So
they share the device too (``LongTurn``):

- a long job starts only once no Generate or /run job of another address runs or waits (those are short,
  and come first); while it waits for that turn it counts as waiting for the device, so a Generate or /run
  job beside it gives the device up after its share as it would for a waiting run;
- once started it keeps the device SHARE_S seconds while a job of another address runs or waits (a
  Generate or /run job, or another long job), then stops at its next round and says why; alone it keeps
  its own time limit. A short run that comes while a long job runs waits at most about SHARE_S and a round;
- its seconds are charged to its address like a run's.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from specviz.ui.address import client_address

SHARE_S = float(os.environ.get("SPECVIZ_SHARE_SECONDS", "10"))  # device seconds a job keeps while another visitor waits
WINDOW_S = 600.0  # device time is remembered this long
DEVICE = "device"  # the concurrency id of Generate and /run (specviz.ui.layout)
LONG = "long"  # the concurrency id of Compare, Batch and the sweep
TURN_POLL_S = 0.1  # how often a long job waiting for its turn looks again

_lock = threading.Lock()
_log: deque[tuple[float, str, float]] = deque()  # (when, address, device seconds)
_used: dict[str, float] = {}
_turns: dict[str, int] = {}  # long jobs waiting for their turn on the device, per address


def _expire(now: float) -> None:
    while _log and now - _log[0][0] > WINDOW_S:
        _, address, seconds = _log.popleft()
        _used[address] -= seconds
        if _used[address] <= 1e-9:
            del _used[address]


def charge(address: str, seconds: float) -> None:
    """Count ``seconds`` of device time against ``address``."""
    now = time.monotonic()
    with _lock:
        _expire(now)
        _log.append((now, address, seconds))
        _used[address] = _used.get(address, 0.0) + seconds


def used(address: str) -> float:
    """Device seconds ``address`` used over the last WINDOW_S seconds."""
    with _lock:
        _expire(time.monotonic())
        return _used.get(address, 0.0)


def _queue_of(inner):
    get_blocks = getattr(getattr(inner, "app", None), "get_blocks", None)
    return getattr(get_blocks() if callable(get_blocks) else None, "_queue", None)


def others_waiting(request, waiting: tuple[str, ...] = (DEVICE,), running: tuple[str, ...] = ()) -> bool:
    """Whether a job of another address than ``request``'s waits in one of the ``waiting`` queues (or for its
    turn as a long job), or runs in one of the ``running`` ones (False outside a served app)."""
    inner = getattr(request, "request", request)
    queue = _queue_of(inner)
    if queue is None:
        return False
    mine = client_address(inner)
    with _lock:
        if any(address != mine for address in _turns):
            return True
    for concurrency_id in waiting:
        events = queue.event_queue_per_concurrency_id.get(concurrency_id)
        if events is not None and any(client_address(e.request) != mine for e in list(events.queue)):
            return True
    return bool(running) and any(e.concurrency_id in running and e.alive and client_address(e.request) != mine
                                 for jobs in list(queue.active_jobs) if jobs for e in list(jobs))


def must_yield(request, started: float, share_s: float | None = None, waiting: tuple[str, ...] = (DEVICE,),
               running: tuple[str, ...] = ()) -> bool:
    """Whether a device job that started at ``started`` (time.monotonic) has had its share while others wait
    (``others_waiting`` with ``waiting`` and ``running``)."""
    share_s = SHARE_S if share_s is None else share_s
    return time.monotonic() - started > share_s and others_waiting(request, waiting, running)


def yielded_note(seconds: float) -> str:
    """What a job that gave the device up says."""
    return (f"Stopped after {seconds:.0f} s on the device so that another visitor waiting could run: while others wait, each "
            f"job keeps the device at most {SHARE_S:.0f} s. Ask for fewer tokens, or try again when the queue is empty.")


class Held:
    """One device job's hold, for the handlers that run jobs: ``over()`` once it has had its share while
    another address waits (in the ``waiting`` queues) or runs (in the ``running`` ones), ``note()`` what it
    then says, and on leaving the ``with`` block its seconds are charged to its address.

    Usage: ``with Held(request) as held: ... if held.over(): ...``.
    """

    def __init__(self, request, waiting: tuple[str, ...] = (DEVICE,), running: tuple[str, ...] = ()):
        self.request, self.started = request, time.monotonic()
        self.waiting, self.running = waiting, running

    def over(self) -> bool:
        return must_yield(self.request, self.started, waiting=self.waiting, running=self.running)

    def note(self) -> str:
        return yielded_note(time.monotonic() - self.started)

    def __enter__(self) -> "Held":
        return self

    def __exit__(self, *exc) -> None:
        charge(client_address(self.request), time.monotonic() - self.started)


class LongTurn:
    """A long job's turn on the device (see the module docstring): entering waits, asking ``stop`` every
    TURN_POLL_S seconds, until no Generate or /run job of another address runs or waits; then the job holds
    the device (``held``: over once it has had SHARE_S seconds while any job of another address runs or waits)
    and its seconds are charged on leaving. ``started`` says whether the turn came (False: ``stop`` ended the wait)."""

    def __init__(self, request, stop):
        self.request, self.stop = getattr(request, "request", request), stop
        self.held: Held | None = None
        self.started = False

    def __enter__(self) -> "LongTurn":
        address = client_address(self.request)
        with _lock:
            _turns[address] = _turns.get(address, 0) + 1
        try:
            while others_waiting(self.request, (DEVICE,), (DEVICE,)):
                if self.stop():
                    return self
                time.sleep(TURN_POLL_S)
        finally:
            with _lock:
                _turns[address] -= 1
                if not _turns[address]:
                    del _turns[address]
        self.held = Held(self.request, waiting=(DEVICE, LONG), running=(DEVICE,))
        self.started = True
        return self

    def over(self) -> bool:
        return self.held is not None and self.held.over()

    def __exit__(self, *exc) -> None:
        if self.held is not None:
            self.held.__exit__(*exc)
