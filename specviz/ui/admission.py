"""Who may join the queue: a bound per kind of work, one waiting job per visitor per kind, and a fair
order between visitors.

Gradio's queue has one size for every event (``max_size``): 33 queued lab runs answered every later
Generate with "Queue is full". ``admit`` wraps the queue's ``push`` so that

- each kind of work (Gradio's concurrency id) holds at most ``QUEUE_MAX[kind]`` waiting jobs, which
  keeps the rest of the queue for the main Generate;
- a visitor, known by the client's address (``client_address``) and not by the session hash a client
  names itself, has at most one job of each kind waiting: with the one running, at most one running
  and one waiting engine job per address (40 /run calls with fresh session hashes once filled the
  queue for everyone);
- a visitor with no job of that kind at work goes ahead of the waiting jobs of visitors who have one;
  then Generate and /run jobs go by arrival plus expected device time (``specviz.ui.share.place``: a short
  run ahead of long ones, a long one passed only by jobs that arrive less than its size after it), and the
  other kinds by the device time their address used in the last minutes (``specviz.ui.share``). A running
  Generate or /run job gives the device up at its next round to a much shorter waiting one of another
  address, and any job after its share (``specviz.ui.share.SHARE_S``) while others wait, so a flood from
  one address or several delays a short run by about a round of the job already running.

A job from an address that already holds its cap of sessions, each showing a run, naming a session the
server does not keep yet, is refused with a message saying so (``specviz.ui.sessions``): its run would not
be remembered; and an address makes at most ``NEW_SESSIONS.per_client`` new sessions a minute
(``SPECVIZ_NEW_SESSIONS_PER_MINUTE``), past which its jobs naming fresh session hashes are refused.

Refusals answer like a full queue (HTTP 503 with a message naming the limit); a job with fewer
values in ``data`` than its endpoint takes is refused at once (HTTP 400 naming the count), where
Gradio would queue it and fail it with ``error: null``.

``client_address`` (``specviz.ui.address``) tells visitors apart.
"""

from __future__ import annotations


import gradio as gr
from gradio import route_utils

from specviz.ui import share
from specviz.ui.address import client_address
from specviz.ui.limits import QUEUE_MAX, whole_number
from specviz.ui.server import LogBudget
from specviz.ui.sessions import SessionStore

# New sessions (page loads, fresh session hashes) per address per minute: a flood of fresh hashes costs the
# server an event each (its session made, its job run), which slowed everyone's runs.
NEW_SESSIONS = LogBudget(per_client=whole_number("SPECVIZ_NEW_SESSIONS_PER_MINUTE", 60, 1), total=10**9, window_s=60)


def waiting(demo: gr.Blocks, concurrency_id: str) -> int:
    """Jobs of ``concurrency_id`` waiting in the queue now."""
    q = demo._queue.event_queue_per_concurrency_id.get(concurrency_id)
    return len(q.queue) if q is not None else 0


def _running_addresses(queue, concurrency_id: str) -> set[str]:
    return {client_address(e.request) for jobs in queue.active_jobs if jobs for e in jobs
            if e.concurrency_id == concurrency_id and e.alive}


def order(queue, waiting: list, concurrency_id: str) -> None:
    """Sort ``waiting`` (the jobs of ``concurrency_id`` in ``queue``, Gradio's) in place, first to run first:
    visitors with nothing of this kind at work first; then Generate and /run jobs by arrival plus expected device
    time (short ones first, long ones aged: ``specviz.ui.share.place``), the other kinds by the device time their
    address used lately (stable otherwise)."""
    busy = _running_addresses(queue, concurrency_id)
    if concurrency_id == share.DEVICE:
        waiting.sort(key=lambda e: (client_address(e.request) in busy, share.place(e)))
    else:
        waiting.sort(key=lambda e: (client_address(e.request) in busy, share.used(client_address(e.request))))


def admit(demo: gr.Blocks, limits: dict[str, int] = QUEUE_MAX) -> None:
    """Install the admission rules on ``demo``'s queue (after ``demo.queue()``)."""
    queue = demo._queue
    push = queue.push

    async def admitted(body, request, username):
        address = client_address(request)
        store = getattr(demo, "state_holder", None)
        session = getattr(body, "session_hash", None)
        if isinstance(store, SessionStore) and session and address and session not in store.session_data \
                and NEW_SESSIONS.take(address) is None:
            return False, (f"Too many new sessions from your address: at most {NEW_SESSIONS.per_client} a minute. "
                           "Try again in a minute."), "queue_full"
        if isinstance(store, SessionStore) and not store.admits(session, address):
            return False, (f"Too many sessions of this page from your address: at most {store.per_address} are kept at once, and each "
                           "of yours shows a run. Close one of your tabs of this page and reload, or try again later."), "queue_full"
        try:
            fn = route_utils.get_fn(demo, None, body)
        except Exception:  # noqa: BLE001 - an unknown event: Gradio's own push answers it
            return await push(body, request, username)
        if not isinstance(body.data, list) or len(body.data) < len(fn.inputs):
            # Gradio would take the job and fail it with a bare "error: null"
            return False, (f"This endpoint takes {len(fn.inputs)} values in \"data\" (its controls, in the order /info lists); "
                           f"got {len(body.data) if isinstance(body.data, list) else 0}."), "error"
        events = queue.event_queue_per_concurrency_id.get(fn.concurrency_id)
        if events is not None:
            bound = limits.get(fn.concurrency_id)
            if bound is not None and len(events.queue) >= bound:
                return False, f"Queue is full for this kind of work: at most {bound} waiting. Try again in a minute.", "queue_full"
            if body.session_hash and any(e.session_hash == body.session_hash and e.fn._id == fn._id for e in events.queue):
                return False, "This session already has one such job waiting: at most one per session.", "queue_full"
            if address and any(client_address(e.request) == address for e in events.queue):
                return False, ("Queue is full for you: you already have a job of this kind waiting (at most one running and one waiting "
                              "per visitor)."), "queue_full"
        result = await push(body, request, username)
        events = queue.event_queue_per_concurrency_id.get(fn.concurrency_id)
        if result[0] and events is not None and len(events.queue) > 1:
            order(queue, events.queue, fn.concurrency_id)
        return result

    queue.push = admitted
