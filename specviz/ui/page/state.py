"""Per-session state kept by the server beside Gradio's ``gr.State`` (which holds the Recording).

While a run streams, its session is in ``following``: True while the replay follows the newest
round; a visitor who steps back stops the following, stepping forward to the newest round resumes it.

The Stop button stops a run, a sweep, a comparison or a batch between its steps, by asking: the
job sees ``stop_asked`` at its next step (a round, a gamma, a drafter kind, a batch), ends itself
and shows what it has (Gradio's own cancel cannot interrupt a
round in progress, and a job it cancels leaves "Error" on every output). ``running`` counts the
jobs streaming in a session; ``stopped`` hands the outputs a stopped run ended with to the Stop
button's handler, which waits for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import gradio as gr

from specviz.serving.device_thread import Owner
from specviz.ui.running import listening
from specviz.ui.guard.address import client_address

following: dict[str, bool] = {}
running: dict[str, int] = {}
stop_asked: set[str] = set()
stopped: dict[str, dict] = {}


def session_of(request: gr.Request | None) -> str | None:
    """The session's key (Gradio's session hash), or None outside a page session (a plain API call)."""
    return getattr(request, "session_hash", None)


def device_owner(request: gr.Request | None) -> Owner:
    """Whom a request's device steps are for (``specviz.serving.device_thread``: the device is shared by address,
    then by page session, least used first)."""
    return Owner(client_address(request), session_of(request) or "")


@contextmanager
def job(session: str | None) -> Iterator[None]:
    """Count a streaming job (a run, a sweep, a comparison, a batch) as running in ``session`` while the block runs; the
    session's stop request ends with its last job."""
    if session is None:
        yield
        return
    running[session] = running.get(session, 0) + 1
    try:
        yield
    finally:
        running[session] -= 1
        if not running[session]:
            del running[session]
            stop_asked.discard(session)


def client_gone(request: gr.Request | None) -> bool:
    """Whether nobody listens to this request's job any more: Gradio marks a job not alive when its
    client's event stream closes (a tab closed, a client that hung up), and a job whose result stream
    was never opened within ``specviz.ui.running.listening.GRACE_S`` of joining the queue counts as gone too
    (Gradio keeps no trace of that; ``specviz.ui.running.listening`` does). A job checks before its engine starts
    and between rounds and stops, so an abandoned run holds the device for at most one more round. The
    job is found by its own request (not by its session, whose earlier events may have ended); unknown,
    it counts as listened to."""
    inner = getattr(request, "request", None)
    app = getattr(inner, "app", None)
    get_blocks = getattr(app, "get_blocks", None)
    blocks = get_blocks() if callable(get_blocks) else None
    queue = getattr(blocks, "_queue", None)
    if queue is None or inner is None:
        return False
    mine = [e for jobs in queue.active_jobs if jobs for e in jobs if e.request is inner]
    return bool(mine) and (not any(e.alive for e in mine) or all(listening.unheard(e) for e in mine))


def should_stop(session: str | None) -> bool:
    """Whether the Stop button was pressed in ``session`` since its jobs started."""
    return session is not None and session in stop_asked
