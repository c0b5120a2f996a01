"""Whether anybody opened a queued job's result stream: a job nobody reads stops instead of holding the device.

What Gradio 6 records (``gradio/queueing.py``, ``gradio/routes.py``): a client joins the queue
(POST ``/gradio_api/queue/join``, or POST ``/gradio_api/call/<api>``, which answers an event id) and
then reads the results from an event stream: GET ``/gradio_api/queue/data?session_hash=<session>``
(the page, Gradio's own clients) or GET ``/gradio_api/call/<api>/<event id>`` (``/call``'s clients;
an event posted without a session hash is its own session). When an open stream's request
disconnects, ``Queue.clean_events`` marks the session's jobs not ``alive``. A stream that is never
opened leaves no trace at all: the job stays alive and runs to its end with nobody listening, its
messages piling up in ``pending_messages_per_session``.

So ``StreamWatch`` (ASGI middleware) counts the event streams opened, by the key their route names (the session hash or
the event id) and the time the last one opened. A stream counts only on its route's whole path (after the app's root
path: ``/x/gradio_api/call/run/<id>`` is no stream, it is a 404) and only once the app answers it with status 200, so a
request the app refuses opens nothing; ``unheard`` says a job has had no stream for its session or its own id since it
joined the queue, for longer than ``GRACE_S`` seconds. ``specviz.ui.page.state.client_gone`` counts such a job as
abandoned: it stops at its next round (or before its engine starts, when it waited longer than that in the queue).
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from urllib.parse import parse_qs

GRACE_S = 10.0  # seconds a queued job waits for its result stream to be opened
KEYS_MAX = 4096  # stream keys remembered (oldest forgotten first): bounded memory however many clients come

# Matched against the whole path (re.fullmatch), after the app's root path.
_CALL_STREAM = re.compile(r"/gradio_api/call/(?:v2/)?[^/]+/([^/]+)/?")
_QUEUE_STREAM = re.compile(r"/gradio_api/queue/data/?")

_lock = threading.Lock()
_open: dict[str, int] = {}  # streams open now, per key
_opened: OrderedDict[str, float] = OrderedDict()  # when a stream for the key last opened (time.monotonic)


def stream_key(scope) -> str | None:
    """The session hash or event id an HTTP request's event stream reads, or None when it is no such stream."""
    if scope.get("type") != "http" or scope.get("method") != "GET":
        return None
    path, root = scope.get("path", ""), (scope.get("root_path") or "").rstrip("/")
    if root and path.startswith(root + "/"):
        path = path[len(root):]
    if match := _CALL_STREAM.fullmatch(path):
        return match.group(1)
    if _QUEUE_STREAM.fullmatch(path):
        query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
        session = query.get("session_hash", [""])[0]
        return session or None
    return None


def _enter(key: str) -> None:
    with _lock:
        _open[key] = _open.get(key, 0) + 1
        _opened[key] = time.monotonic()
        _opened.move_to_end(key)
        while len(_opened) > KEYS_MAX:
            _opened.popitem(last=False)


def _leave(key: str) -> None:
    with _lock:
        _open[key] -= 1
        if not _open[key]:
            del _open[key]


class StreamWatch:
    """ASGI middleware: notes each event stream a client opens, from the moment the app answers it with
    status 200 until the request ends (see the module docstring); passes everything through."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        key = stream_key(scope)
        if key is None:
            return await self.app(scope, receive, send)
        opened = False

        async def watched(message):
            nonlocal opened
            if message.get("type") == "http.response.start" and message.get("status") == 200 and not opened:
                _enter(key)
                opened = True
            await send(message)

        try:
            return await self.app(scope, receive, watched)
        finally:
            if opened:
                _leave(key)


def heard(event) -> bool:
    """Whether a stream for ``event`` (a Gradio queue ``Event``: its session hash or its own id) is open now or
    opened since it joined."""
    keys = {event.session_hash, event._id}
    with _lock:
        return any(_open.get(k) for k in keys) or any(_opened.get(k, float("-inf")) >= event.enqueue_time for k in keys)


def unheard(event, now: float | None = None, grace_s: float | None = None) -> bool:
    """Whether ``event`` has waited more than ``grace_s`` (default GRACE_S) seconds since it joined the queue with no
    stream opened for it."""
    now = time.monotonic() if now is None else now
    grace_s = GRACE_S if grace_s is None else grace_s
    return now - event.enqueue_time > grace_s and not heard(event)
