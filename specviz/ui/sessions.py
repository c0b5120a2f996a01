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

A flood of fresh session hashes from one address made sessions that show no run but are not yet idle:
they filled the store within seconds, and every newcomer from any other address was then answered from
a state not kept (its run shown, then "nothing to export"). So each address (``specviz.ui.address``)
holds at most ``PER_ADDRESS`` sessions (``SPECVIZ_SESSIONS_PER_ADDRESS``): a new session from an address
at its cap takes the place of that address's own least recently used session that shows no run, and
when all of them show runs it is not kept, and the queue refuses its jobs with a message saying so
(``admits``, asked by ``specviz.ui.admission``). No other address's session is touched, so a flood fills
at most ``PER_ADDRESS`` places. Behind one shared address (a classroom behind one router) raise it.

Gradio frees an expired state's value but keeps the session itself (its copy of the page's configuration
and its last outputs) until it is evicted: after a flood, the sessions it made held their memory until
newcomers took their places. The store forgets a session unused for ``SESSION_TTL_S`` whole, at Gradio's
once-a-second expiry check, and then hands the freed memory back to the system (``specviz.pair.free_memory``;
the server's threads share one C heap, ``specviz.pair.one_heap``, so it can). Measured after an attack's floods had
expired, with the queue's records below forgotten too: RSS 3-18 MB above its warm start over six runs (five of two
rounds), 0-9 MB once sessions kept no configuration copy (below; five rounds in two runs), flat from round to round
(it was 10-29 MB before the queue's records went), with the live bytes of Python's objects and of the C heap below
their start: what stays is the allocators' high-water (Python's arenas and the heap's pages each still holding some
live object), not sessions.

Gradio's ``SessionState`` also keeps a copy of every component's configuration for its deep-link route
(``config_values``), made when the session is and refreshed at every event; this server refuses that route
(``specviz.ui.server``), so nothing reads it. For the page's 142 components it cost 203 KiB and 49 ms of the
server's time per new session, paid for every fresh session hash a flood sends, kept or not. The store makes
``LeanSessionState`` instead, which keeps none.

Gradio's queue keeps records of its own per session hash: a message queue (``pending_messages_per_session``,
the 2,000 most recent hashes) and the ids of the session's events not yet read to their end
(``pending_event_ids_session``, with no bound). A client that joins and never reads its stream, or any
``/call`` client (each call its own hash), leaves both behind: measured after an attack's floods had
expired, 137 hashes' queues held 121 unread messages each of their jobs' progress. So at the same check
the store also forgets the queue's records of every hash that it does not hold and none of whose events
is still queued or running, once that has been so for ``SESSION_TTL_S`` (a result not yet read stays
readable that long).

``KeepSessions`` (ASGI middleware) puts the store in place of the app's ``StateHolder`` at the first
request, keeping everything in it, and tells the store the address of the request under way (a context
variable, read where Gradio makes a session: joining the queue, a heartbeat's unload event); a session
made outside any request (Gradio's queue worker) has no address and only the store's capacity bounds it.
"""

from __future__ import annotations

import datetime
import threading
import time
from contextvars import ContextVar
from types import SimpleNamespace

from gradio.state_holder import SessionState, StateHolder
from starlette.requests import HTTPConnection

from specviz.pair import free_memory
from specviz.ui.address import client_address
from specviz.ui.limits import SESSION_TTL_S, whole_number

IDLE_S = 60.0  # a session that shows no run may give its place to a newcomer after this long unused
# Handing memory back (a full garbage collection: 0.3 s of the server's time, the interpreter held) at most this
# often: under a flood of fresh sessions some expire every second, and a collection each second slowed other visitors.
FREE_EVERY_S = 15.0
PER_ADDRESS = whole_number("SPECVIZ_SESSIONS_PER_ADDRESS", 8, 1)  # sessions one address holds at most

# The address of the request being served (set by KeepSessions); "" outside a request.
current_address: ContextVar[str] = ContextVar("specviz_session_address", default="")


class _NoConfigs(dict):
    """``SessionState.config_values`` that keeps nothing: every key reads as present and empty (Gradio then has no
    props to refresh), and whatever is stored is dropped. Iterates as empty, so the deep-link route (refused here)
    would find no components."""

    def __contains__(self, key) -> bool:
        return True

    def __getitem__(self, key) -> dict:
        return {}

    def __setitem__(self, key, value) -> None:
        pass


class LeanSessionState(SessionState):
    """Gradio's ``SessionState`` without its per-session copy of every component's configuration (module docstring).

    Gradio builds that copy in ``SessionState.__init__`` from ``blocks.default_config`` and ``blocks.blocks``;
    here it is handed the configuration with no blocks to copy, and then given ``_NoConfigs``. Raises
    AttributeError if a Gradio version reads more of ``blocks`` there (a test builds one, so that shows)."""

    def __init__(self, blocks):
        super().__init__(SimpleNamespace(default_config=blocks.default_config, blocks={}))
        self.config_values = _NoConfigs()


def shows_run(session: SessionState) -> bool:
    """Whether the session's state holds anything (the page's only ``gr.State`` is its shown Recording)."""
    return any(value is not None for value in session.state_data.values())


class SessionStore(StateHolder):
    """Gradio's ``StateHolder`` with the admission rules of the module docstring instead of LRU eviction."""

    idle_s = IDLE_S
    per_address = PER_ADDRESS
    ttl_s = SESSION_TTL_S
    free_every_s = FREE_EVERY_S
    _owes_free = False  # something went since memory was last handed back
    _freed_at = float("-inf")  # when it was (time.monotonic)

    def _own_dict(self, name: str) -> dict:
        """The store's dict ``name``, made on first use: the class is swapped in on a live holder (``install``), so
        no __init__ of ours ran."""
        return self.__dict__.setdefault(name, {})

    @property
    def owners(self) -> dict[str, str]:
        """The address each kept session was made from (sessions made outside a request have none)."""
        return self._own_dict("_owners")

    def __getitem__(self, session_id: str) -> SessionState:
        with self.lock:
            if session_id not in self.session_data:
                address = current_address.get()
                if address and not self._room_for(address):
                    return LeanSessionState(self.blocks)  # answered, not kept
                if len(self.session_data) >= self.capacity and not self._make_room():
                    return LeanSessionState(self.blocks)  # answered, not kept
                self.session_data[session_id] = LeanSessionState(self.blocks)
                if address:
                    self.owners[session_id] = address
            self.session_data.move_to_end(session_id)
            self.time_last_used[session_id] = datetime.datetime.now()
            return self.session_data[session_id]

    def update(self, session_id: str) -> None:
        with self.lock:
            if session_id in self.session_data:
                self.session_data.move_to_end(session_id)

    def held_by(self, address: str) -> list[str]:
        """The sessions ``address`` holds, least recently used first."""
        owners = self.owners
        return [s for s in self.session_data if owners.get(s) == address]

    def admits(self, session_id: str | None, address: str) -> bool:
        """Whether a job naming ``session_id`` from ``address`` would find its session kept, as far as the
        per-address cap goes: the session exists, or the address is under its cap or holds a session
        that shows no run (whose place the new one takes)."""
        with self.lock:
            if not session_id or not address or session_id in self.session_data:
                return True
            mine = self.held_by(address)
            return len(mine) < self.per_address or any(not shows_run(self.session_data[s]) for s in mine)

    @property
    def orphans(self) -> dict[str, float]:
        """Session hashes with records in Gradio's queue that the store does not hold and none of whose events
        is queued or running: when each was first seen so (``time.monotonic``)."""
        return self._own_dict("_orphans")

    def delete_all_expired_state(self) -> None:
        """Gradio's expiry of states (called every second, on the server's event loop), then forget each session
        unused for ``ttl_s`` whole and the queue's records of hashes orphaned for as long, and hand the memory
        back when anything went (at most once every ``free_every_s``)."""
        super().delete_all_expired_state()
        now = datetime.datetime.now()
        with self.lock:
            stale = [s for s in self.session_data if (now - self.time_last_used.get(s, now)).total_seconds() > self.ttl_s]
            for session_id in stale:
                self._drop(session_id)
        forgotten = self._forget_queue_records()
        self._owes_free = self._owes_free or bool(stale or forgotten)
        if self._owes_free and time.monotonic() - self._freed_at >= self.free_every_s:
            self._owes_free, self._freed_at = False, time.monotonic()
            free_memory("cpu")

    def _forget_queue_records(self) -> int:
        """Drop Gradio's queue records (message queue, unread event ids) of hashes orphaned for ``ttl_s``; how many went.

        Runs on the event loop, as the queue's own changes to these records do, so none changes under it."""
        queue = getattr(getattr(self, "blocks", None), "_queue", None)
        if queue is None:
            return 0
        messages, unread, live = queue.pending_messages_per_session, queue.pending_event_ids_session, queue.event_ids_to_events
        orphans, now, gone = self.orphans, time.monotonic(), 0
        hashes = set(messages) | set(unread)
        for session in hashes:
            if session in self.session_data or any(event in live for event in unread.get(session, ())):
                orphans.pop(session, None)
            elif now - orphans.setdefault(session, now) > self.ttl_s:
                messages.pop(session, None)
                unread.pop(session, None)
                del orphans[session]
                gone += 1
        for session in [s for s in orphans if s not in hashes]:
            del orphans[session]
        return gone

    def _drop(self, session_id: str) -> None:
        del self.session_data[session_id]
        self.time_last_used.pop(session_id, None)
        self.owners.pop(session_id, None)

    def _room_for(self, address: str) -> bool:
        """Under ``address``'s cap, or made so by dropping its own least recently used session that shows no run."""
        mine = self.held_by(address)
        if len(mine) < self.per_address:
            return True
        for session_id in mine:
            if not shows_run(self.session_data[session_id]):
                self._drop(session_id)
                return True
        return False

    def _make_room(self) -> bool:
        """Drop the least recently used session that shows no run and is idle or closed; whether one went."""
        now = datetime.datetime.now()
        for session_id, session in self.session_data.items():
            idle = (now - self.time_last_used.get(session_id, now)).total_seconds()
            if not shows_run(session) and (session.is_closed or idle > self.idle_s):
                self._drop(session_id)
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
    """ASGI middleware: installs the ``SessionStore`` in the app (``scope["app"]``) before the first request is
    served, and names the request's address to the store while the request is served."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        install(scope.get("app"))
        if scope.get("type") not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        token = current_address.set(client_address(HTTPConnection(scope)))
        try:
            return await self.app(scope, receive, send)
        finally:
            current_address.reset(token)
