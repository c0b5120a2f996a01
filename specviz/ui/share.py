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

_lock = threading.Lock()
_log: deque[tuple[float, str, float]] = deque()  # (when, address, device seconds)
_used: dict[str, float] = {}


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


def others_waiting(request) -> bool:
    """Whether a job of another address than ``request``'s waits in the device queue (False outside a served app)."""
    inner = getattr(request, "request", request)
    get_blocks = getattr(getattr(inner, "app", None), "get_blocks", None)
    queue = getattr(get_blocks() if callable(get_blocks) else None, "_queue", None)
    events = queue.event_queue_per_concurrency_id.get(DEVICE) if queue is not None else None
    if events is None:
        return False
    mine = client_address(inner)
    return any(client_address(e.request) != mine for e in list(events.queue))


def must_yield(request, started: float, share_s: float | None = None) -> bool:
    """Whether a device job that started at ``started`` (time.monotonic) has had its share while others wait."""
    share_s = SHARE_S if share_s is None else share_s
    return time.monotonic() - started > share_s and others_waiting(request)


def yielded_note(seconds: float) -> str:
    """What a job that gave the device up says."""
    return (f"Stopped after {seconds:.0f} s on the device so that another visitor waiting could run: while others wait, each "
            f"job keeps the device at most {SHARE_S:.0f} s. Ask for fewer tokens, or try again when the queue is empty.")


class Held:
    """One device job's hold, for the handlers that run jobs (Generate, /run): ``over()`` once it has had
    its share while another address waits, ``note()`` what it then says, and on leaving the ``with``
    block its seconds are charged to its address.

    Usage: ``with Held(request) as held: ... if held.over(): ...``.
    """

    def __init__(self, request):
        self.request, self.started = request, time.monotonic()

    def over(self) -> bool:
        return must_yield(self.request, self.started)

    def note(self) -> str:
        return yielded_note(time.monotonic() - self.started)

    def __enter__(self) -> "Held":
        return self

    def __exit__(self, *exc) -> None:
        charge(client_address(self.request), time.monotonic() - self.started)
