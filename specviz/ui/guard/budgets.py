"""The server's budgets: bytes uploaded and log lines, per client address and in all over a window, so no visitor can
fill the disk or grow the log without bound; and the one short log line a refusal costs (``note_request``).

Read by the middleware (``specviz.ui.guard.server``), the input checks and the queue's admission.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque

from specviz.ui.guard.limits import (
    CACHE_TTL_S,
    LOG_CLIENT_MAX_LINES,
    LOG_TOTAL_MAX_LINES,
    LOG_WINDOW_S,
    UPLOAD_CLIENT_MAX_BYTES,
    UPLOAD_TOTAL_MAX_BYTES,
)

log = logging.getLogger("specviz")


def span(seconds: float) -> str:
    """A time span for a message, rounded up: "45 seconds" under a minute, else whole minutes ("5 minutes")."""
    whole = max(1, math.ceil(seconds))
    if whole < 60:
        return f"{whole} second{'s' if whole != 1 else ''}"
    minutes = math.ceil(whole / 60)
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


def megabytes(n: int) -> str:
    """``n`` bytes in MB for a message ("48", "0.5"; never "0" for a budget under 1 MB)."""
    return f"{max(round(n / (1024 * 1024), 1), 0.1):g}"


class UploadBudget:
    """Bytes uploaded per client address and in all over the last ``window_s`` seconds (the time Gradio
    keeps an upload before its cache sweep removes it), so uploads cannot fill the disk: past either
    budget an upload is refused (HTTP 429) as its bytes arrive."""

    def __init__(
        self,
        per_client: int = UPLOAD_CLIENT_MAX_BYTES,
        total: int = UPLOAD_TOTAL_MAX_BYTES,
        window_s: float = CACHE_TTL_S,
    ):
        self.per_client, self.total, self.window_s = per_client, total, window_s
        self._log: deque[tuple[float, str, int]] = deque()
        self._per: dict[str, int] = {}  # bytes in the window per address (running totals, kept with the log)
        self._total = 0
        self._lock = threading.Lock()

    def _expire(self, now: float) -> None:
        while self._log and now - self._log[0][0] > self.window_s:
            _, address, n = self._log.popleft()
            self._total -= n
            self._per[address] -= n
            if not self._per[address]:
                del self._per[address]

    def take(self, address: str, n: int) -> str | None:
        """Count ``n`` more bytes from ``address``; the budget it breaks, or None."""
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            mine = self._per.get(address, 0) + n
            everyone = self._total + n
            if mine > self.per_client:
                return f"at most {megabytes(self.per_client)} MB of uploads per visitor in {span(self.window_s)}"
            if everyone > self.total:
                return f"the server takes at most {megabytes(self.total)} MB of uploads in {span(self.window_s)}"
            self._log.append((now, address, n))
            self._per[address] = mine
            self._total = everyone
            return None


UPLOADS = UploadBudget()


class LogBudget:
    """Log lines per client address and in all over the last ``window_s`` seconds, so no visitor can
    grow the server's log without bound: past either budget an event is still answered, only not logged.
    Only addresses with a line in the window are remembered (at most ``total`` of them)."""

    def __init__(
        self, per_client: int = LOG_CLIENT_MAX_LINES, total: int = LOG_TOTAL_MAX_LINES, window_s: float = LOG_WINDOW_S
    ):
        self.per_client, self.total, self.window_s = per_client, total, window_s
        self._log: deque[tuple[float, str]] = deque()
        self._per: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, address: str) -> int | None:
        """Count one more line from ``address``: its number in the window (1..per_client), or None past a budget."""
        now = time.monotonic()
        with self._lock:
            while self._log and now - self._log[0][0] > self.window_s:
                _, old = self._log.popleft()
                self._per[old] -= 1
                if not self._per[old]:
                    del self._per[old]
            mine = self._per.get(address, 0) + 1
            if mine > self.per_client or len(self._log) >= self.total:
                return None
            self._log.append((now, address))
            self._per[address] = mine
            return mine


MALFORMED_LOGS = LogBudget()


def note_request(address: str, what: str, budget: LogBudget | None = None) -> None:
    """One short log line for a request refused before the app's handlers (``what``: the app's own words, never
    the request's), no traceback, within ``budget`` (None: ``MALFORMED_LOGS``, which every such refusal of an
    address shares)."""
    budget = budget or MALFORMED_LOGS
    n = budget.take(address)
    if n is not None:
        log.warning(
            "%s from %s [line %d of at most %d per address in %s]",
            what,
            ascii(address[:64]),
            n,
            budget.per_client,
            span(budget.window_s),
        )


def note_malformed(address: str, exc: Exception, budget: LogBudget | None = None) -> None:
    """One short log line for a malformed upload (no traceback, nothing of the body), within ``budget``
    (None: ``MALFORMED_LOGS``)."""
    note_request(address, f"malformed upload refused (400): {type(exc).__name__}", budget)
