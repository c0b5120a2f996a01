"""Which visitors' sessions the server keeps: a bounded store that a flood of fresh sessions cannot
turn against the sessions already in it.

Gradio keeps each session's state (``gr.State``: the shown run's Recording) in a ``StateHolder``
bounded by ``state_session_capacity``, evicting the least recently used session whenever a new one
comes (``gradio/state_holder.py``). A session is made by any event naming a fresh session hash, and by
each heartbeat connection closed (its unload event): 40 joins with fresh hashes, or 500 heartbeats
opened and closed, pushed a visitor's shown run out ("nothing to export").

``SessionStore`` admits a new session only when there is room, or when it can make room by dropping
a session that shows no run and has been idle for IDLE_S seconds (or whose page closed), least
recently used first. A session that shows a run is never dropped for a newcomer: Gradio's own
expiry (``SESSION_TTL_S`` on the state) frees it. A session that finds no room is still answered,
from a state of its own that is not kept (its page works; what it shows is not remembered until
room frees up). So the store never holds more than its capacity, and no newcomer evicts a run.

``KeepSessions`` (ASGI middleware) puts the store in place of the app's ``StateHolder`` at the first
request, keeping everything in it.
"""

from __future__ import annotations

import datetime
import threading

from gradio.state_holder import SessionState, StateHolder

IDLE_S = 60.0  # a session that shows no run may give its place to a newcomer after this long unused


def shows_run(session: SessionState) -> bool:
    """Whether the session's state holds anything (the page's only ``gr.State`` is its shown Recording)."""
    return any(value is not None for value in session.state_data.values())


class SessionStore(StateHolder):
    """Gradio's ``StateHolder`` with the admission rule of the module docstring instead of LRU eviction."""

    idle_s = IDLE_S

    def __getitem__(self, session_id: str) -> SessionState:
        with self.lock:
            if session_id not in self.session_data:
                if len(self.session_data) >= self.capacity and not self._make_room():
                    return SessionState(self.blocks)  # answered, not kept
                self.session_data[session_id] = SessionState(self.blocks)
            self.session_data.move_to_end(session_id)
            self.time_last_used[session_id] = datetime.datetime.now()
            return self.session_data[session_id]

    def update(self, session_id: str) -> None:
        with self.lock:
            if session_id in self.session_data:
                self.session_data.move_to_end(session_id)

    def _make_room(self) -> bool:
        """Drop the least recently used session that shows no run and is idle or closed; whether one went."""
        now = datetime.datetime.now()
        for session_id, session in self.session_data.items():
            idle = (now - self.time_last_used.get(session_id, now)).total_seconds()
            if not shows_run(session) and (session.is_closed or idle > self.idle_s):
                del self.session_data[session_id]
                self.time_last_used.pop(session_id, None)
                return True
        return False


# The holder is reached by every request handler: swapping its class keeps its sessions and its lock.
_swap = threading.Lock()


def install(app) -> None:
    """Make ``app``'s state holder a ``SessionStore`` (once; a no-op for an app without one)."""
    holder = getattr(app, "state_holder", None)
    if holder is None or isinstance(holder, SessionStore):
        return
    with _swap:
        if type(holder) is StateHolder:
            holder.__class__ = SessionStore


class KeepSessions:
    """ASGI middleware: installs the ``SessionStore`` in the app (``scope["app"]``) before the first request is served."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        install(scope.get("app"))
        return await self.app(scope, receive, send)
