"""Who may join the queue: a bound per kind of work, and one waiting job per session per endpoint.

Gradio's queue has one size for every event (``max_size``): 33 queued lab runs answered every later
Generate with "Queue is full". ``admit`` wraps the queue's ``push`` so that each kind of work
(Gradio's concurrency id) may hold at most ``QUEUE_MAX[kind]`` waiting jobs, which keeps the rest
of the queue for the main Generate, and a session may have at most one job of an endpoint waiting
(a second is refused until the first starts or is cancelled). Refusals answer like a full queue
(HTTP 503 with a message naming the limit).
"""

from __future__ import annotations

import gradio as gr
from gradio import route_utils

from specviz.ui.limits import QUEUE_MAX


def waiting(demo: gr.Blocks, concurrency_id: str) -> int:
    """Jobs of ``concurrency_id`` waiting in the queue now."""
    q = demo._queue.event_queue_per_concurrency_id.get(concurrency_id)
    return len(q.queue) if q is not None else 0


def admit(demo: gr.Blocks, limits: dict[str, int] = QUEUE_MAX) -> None:
    """Install the admission rules on ``demo``'s queue (after ``demo.queue()``)."""
    queue = demo._queue
    push = queue.push

    async def admitted(body, request, username):
        try:
            fn = route_utils.get_fn(demo, None, body)
        except Exception:  # noqa: BLE001 - an unknown event: Gradio's own push answers it
            return await push(body, request, username)
        events = queue.event_queue_per_concurrency_id.get(fn.concurrency_id)
        if events is not None:
            bound = limits.get(fn.concurrency_id)
            if bound is not None and len(events.queue) >= bound:
                return False, f"Queue is full for this kind of work: at most {bound} waiting. Try again in a minute.", "queue_full"
            if body.session_hash and any(e.session_hash == body.session_hash and e.fn._id == fn._id for e in events.queue):
                return False, "This session already has one such job waiting: at most one per session.", "queue_full"
        return await push(body, request, username)

    queue.push = admitted
