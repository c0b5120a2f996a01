"""Who may join the queue: a bound per kind of work, one waiting job per page and a share of the queue per
address for each kind, and a fair order between visitors.

Gradio's queue has one size for every event (``max_size``): 33 queued lab runs answered every later
Generate with "Queue is full". ``admit`` wraps the queue's ``push`` so that

- each kind of work (Gradio's concurrency id) holds at most ``QUEUE_MAX[kind]`` waiting jobs, which
  keeps the rest of the queue for the main Generate;
- a page (session) has at most one job of each kind waiting, and an address (``client_address``, not the
  session hash a client names itself) at most half the places the other addresses leave free (``places``,
  at least one): 40 /run calls with fresh session hashes once filled the queue for everyone, and a fixed
  one-per-address rule made a class behind one router queue one run at a time;
- a visitor with no job of that kind at work goes ahead of the waiting jobs of visitors who have one;
  then Generate and /run jobs go by arrival plus expected device time (``specviz.ui.running.share.place``: a short
  run ahead of long ones, a long one passed only by jobs that arrive less than its size after it), and the
  other kinds by the device time their address used in the last minutes (``specviz.ui.running.share``). A running
  Generate or /run job gives the device up at its next round to a much shorter waiting one of another
  address, and any job after its share (``specviz.ui.running.share.SHARE_S``) while others wait, so a flood from
  one address or several delays a short run by about a round of the job already running;
- beside a running Generate or /run job, another starts only if it is short and of another address
  (``dispatching``), so a visitor's short run starts beside another visitor's run (or pair load) instead of after it.

A job naming a session the server could not keep (the store full of runs of addresses within their fair
share, ``specviz.ui.guard.sessions``) is refused with a message saying so: its run would not be remembered; and an
address makes at most ``NEW_SESSIONS.per_client`` new sessions a minute (``SPECVIZ_NEW_SESSIONS_PER_MINUTE``,
default 120: a class of forty opening the page at once, each reloading twice), past which its jobs naming
fresh session hashes are refused.

Refusals answer HTTP 429 with a message naming the limit, why, and when it lifts (the page shows it; for a 503 it would
show only "This application is currently busy"), and Retry-After; a job with fewer values in ``data`` than its endpoint
takes is refused at once (HTTP 400 naming the count), where Gradio would queue it and fail it with ``error: null``. So
is a job naming no event of the app (an unknown ``fn_index``: HTTP 404, where Gradio's push raised KeyError, answered
500 with two tracebacks, 99 log lines), and one with a value Gradio would fail on before the handler
(``specviz.ui.guard.checks.queue_refusal``: a plain menu's value outside its choices; HTTP 400 naming the menu and its
choices, where Gradio logged a 25-line traceback and echoed the value unescaped). Each costs the log one line, within
the per-address budgets (``specviz.ui.guard.budgets.note_request``, ``specviz.ui.guard.checks.note_refusal``). A job
with no ``fn_index`` is left to Gradio's own answer (400, "No function index provided.").

``client_address`` (``specviz.ui.guard.address``) tells visitors apart.
"""

from __future__ import annotations


import html
from typing import NoReturn

import gradio as gr
from fastapi import HTTPException
from gradio import route_utils

from specviz.ui.running import share
from specviz.ui.guard.address import client_address
from specviz.ui.guard.checks import excerpt, note_refusal, queue_refusal
from specviz.ui.guard.limits import QUEUE_MAX, whole_number
from specviz.ui.guard.budgets import LogBudget, note_request
from specviz.ui.guard.sessions import SessionStore

# New sessions (page loads, fresh session hashes) per address per minute: a flood of fresh hashes costs the
# server an event each (its session made, its job run), which slowed everyone's runs.
NEW_SESSIONS = LogBudget(per_client=whole_number("SPECVIZ_NEW_SESSIONS_PER_MINUTE", 120, 1), total=10**9, window_s=60)


def waiting(demo: gr.Blocks, concurrency_id: str) -> int:
    """Jobs of ``concurrency_id`` waiting in the queue now."""
    q = demo._queue.event_queue_per_concurrency_id.get(concurrency_id)
    return len(q.queue) if q is not None else 0


def _running_addresses(queue, concurrency_id: str) -> set[str]:
    return {client_address(e.request) for e in share.running_jobs(queue, (concurrency_id,))}


def order(queue, waiting: list, concurrency_id: str) -> None:
    """Sort ``waiting`` (the jobs of ``concurrency_id`` in ``queue``, Gradio's) in place, first to run first:
    visitors with nothing of this kind at work first; then Generate and /run jobs by arrival plus expected device
    time (short ones first, long ones aged: ``specviz.ui.running.share.place``), the other kinds by the device time
    their
    address used lately (stable otherwise)."""
    busy = _running_addresses(queue, concurrency_id)
    if concurrency_id == share.DEVICE:
        waiting.sort(key=lambda e: (client_address(e.request) in busy, share.place(e)))
    else:
        waiting.sort(key=lambda e: (client_address(e.request) in busy, share.used(client_address(e.request))))


def dispatching(queue, get_events):
    """``get_events`` (Gradio's queue's: the next jobs to start) with some of the device's waiting jobs (Generate and
    /run) held back while a device job runs: those of an address that has one running (one per address at once), and
    those expected to take longer than a job's share (``specviz.ui.running.share.SHARE_S``; unsized ones too). So
    the device's other slots (``specviz.ui.guard.limits.CONCURRENCY``) let another visitor's short run start beside a
    running job, its steps first while its address has used less, instead of waiting for all of it.

    Why each is held back (2-core CPU with AVX-512 BF16): two jobs of one address at once cost both, one's Python (its
    page, its streaming) running beside the other's passes: forty students behind one address pressing Generate
    within 10 s then waited 1.59x and 1.91x what a queue of their own would have made them wait (median), against
    1.08x one at a time (``python -m specviz.visitors.classroom --students 40 --span-s 10 --no-hostile --tokens 16
    --pair embedded``). Long jobs beside each other: three addresses looping the auto tree (its calibration's cap
    sizes each) filled both slots, and a victim's 16-token run took 0.9-2.7 s against 0.3 s alone, 0.4-0.5 s with
    one slot (``python -m specviz.visitors.attack --floods "auto trees"``)."""

    def held_back(event, busy: set) -> bool:
        # read once per job: Gradio asks for the next jobs every millisecond while a slot is free
        kind = getattr(event, "_specviz_kind", None)
        if kind is None:
            expected = share.job_seconds(event)
            kind = event._specviz_kind = (client_address(event.request), expected is None or expected > share.SHARE_S)
        return kind[0] in busy or kind[1]

    def dispatched():
        events = queue.event_queue_per_concurrency_id.get(share.DEVICE)
        if events is None or not events.queue or not events.current_concurrency or (
            events.concurrency_limit is not None and events.current_concurrency >= events.concurrency_limit
        ):
            return get_events()  # nothing runs, or no slot is free: Gradio's own choice
        busy = _running_addresses(queue, share.DEVICE)
        waiting = list(events.queue)
        if not any(held_back(e, busy) for e in waiting):
            return get_events()
        events.queue[:] = [e for e in waiting if not held_back(e, busy)]
        started = None
        try:
            started = get_events()
        finally:
            gone = started[0] if started else []
            events.queue[:] = [e for e in waiting if not any(e is g for g in gone)]
        return started

    return dispatched


RESERVED = 4  # a kind's queue keeps a quarter of its places for the addresses that hold none of them


def places(size: int, mine: int, waiting: int) -> int:
    """Waiting jobs of one kind that one address may have: the places the other addresses leave free, less a
    quarter of the queue kept for addresses that come later, at least one. ``size``: the kind's queue places;
    ``mine``: the address's waiting jobs; ``waiting``: everyone's. A class behind one school router pressing
    Generate together queues as many runs as three quarters of the queue (72 of the default 96: a class of 40 is
    served in order), and no address, alone or flooding, leaves the next one without a place; the order then
    puts the address that used the device least first (``order``)."""
    return max(1, size - (waiting - mine) - size // RESERVED)


def _refuse(message: str, retry_after_s: float):
    """Refuse a job with HTTP 429 and ``message``: the page shows a refusal's text for every status but 503, which
    it answers with "This application is currently busy"; Retry-After says when to try again."""
    raise HTTPException(status_code=429, detail=message, headers={"Retry-After": str(max(1, round(retry_after_s)))})


def refuse_unknown_event(fn_index, address: str) -> NoReturn:
    """Refuse a job whose ``fn_index`` names no event of the app, in one log line for ``address`` within the
    per-address budget (``note_request``): Gradio's push raised KeyError on it, answered 500 and logged two tracebacks.

    Raises:
        HTTPException: always, 404, naming fn_index (at most 24 characters of the value sent, HTML-escaped)."""
    note_request(address, "unknown endpoint refused (404): fn_index")
    raise HTTPException(
        status_code=404,
        detail=html.escape(
            f"Unknown endpoint: fn_index {excerpt(fn_index, 24)} names no event of this app (GET /config lists them, "
            "with their ids).",
            quote=False,
        ),
    )


def admit(demo: gr.Blocks, limits: dict[str, int] = QUEUE_MAX) -> None:
    """Install the admission rules on ``demo``'s queue (after ``demo.queue()``).

    A refused job is answered HTTP 429 with a message naming the limit, why, and when it lifts (HTTP 400 for a
    job with too few values in ``data`` or a value ``queue_refusal`` refuses; HTTP 404 for an unknown ``fn_index``)."""
    queue = demo._queue
    push = queue.push

    async def admitted(body, request, username):
        address = client_address(request)
        store = getattr(demo, "state_holder", None)
        session = getattr(body, "session_hash", None)
        if (
            isinstance(store, SessionStore)
            and session
            and address
            and session not in store.session_data
            and NEW_SESSIONS.take(address) is None
        ):
            _refuse(
                f"Too many new sessions from your address: at most {NEW_SESSIONS.per_client} a minute "
                "(SPECVIZ_NEW_SESSIONS_PER_MINUTE). Try again in a minute.",
                60,
            )
        if isinstance(store, SessionStore) and not store.admits(session, address):
            _refuse(store.refusal(address), 60)
        if body.fn_index is None:  # Gradio's own push answers it: "No function index provided." (400)
            return await push(body, request, username)
        try:
            fn = route_utils.get_fn(demo, None, body)
        except KeyError:  # the fn_index names no event (Gradio's push would raise this KeyError: 500, two tracebacks)
            refuse_unknown_event(body.fn_index, address)
        except Exception:  # noqa: BLE001 - anything else Gradio's own push answers, as before
            return await push(body, request, username)
        if not isinstance(body.data, list) or len(body.data) < len(fn.inputs):
            # Gradio would take the job and fail it with a bare "error: null"
            return (
                False,
                (
                    f"This endpoint takes {len(fn.inputs)} values in \"data\" (its controls, in the order /info "
                    "lists); "
                    f"got {len(body.data) if isinstance(body.data, list) else 0}."
                ),
                "error",
            )
        refused = queue_refusal(fn, body.data, getattr(store, "session_data", {}).get(session) if session else None)
        # Gradio would fail it before the handler: a traceback logged, a message naming no field
        if refused is not None:
            note_refusal(*refused, address=address)
            return False, html.escape(refused[1], quote=False), "error"
        events = queue.event_queue_per_concurrency_id.get(fn.concurrency_id)
        if events is not None:
            size = limits.get(fn.concurrency_id) or queue.max_size or 32
            if len(events.queue) >= size:
                _refuse(
                    f"The queue is full for this kind of work: at most {size} jobs wait at once. "
                    "Try again when one has started (about a minute).",
                    60,
                )
            if body.session_hash and any(
                e.session_hash == body.session_hash and e.fn._id == fn._id for e in events.queue
            ):
                _refuse(
                    "This page already has this job waiting: at most one per session (page) at a time. It starts in "
                    "its turn.",
                    30,
                )
            mine = sum(client_address(e.request) == address for e in events.queue) if address else 0
            if address and mine >= places(size, mine, len(events.queue)):
                _refuse(
                    f"Your address already has {mine} jobs of this kind waiting: at most the places the others leave "
                    "free, "
                    f"less a quarter kept for other visitors ({places(size, mine, len(events.queue))} of {size} now). "
                    "Try again when one of them has started.",
                    30,
                )
        result = await push(body, request, username)
        events = queue.event_queue_per_concurrency_id.get(fn.concurrency_id)
        if result[0] and events is not None and len(events.queue) > 1:
            order(queue, events.queue, fn.concurrency_id)
        return result

    queue.push = admitted
    queue.get_events = dispatching(queue, queue.get_events)
