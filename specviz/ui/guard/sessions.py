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
they filled the store within seconds. A fixed cap of sessions per address stopped that, and locked a class
out: a school's students reach a Space through one public address, and the ninth was refused for 30 minutes.
So the store is bounded by memory, and an address by its fair share of it, not by a count:

- **Sessions are priced by what they hold** (``session_bytes``): a session that shows no run costs
  ``EMPTY_SESSION_BYTES``, one that shows a run ``RECORD_BYTES`` per record of its recording (rounds, drafts,
  tree nodes, top-token entries; ``recording_records``) on top, measured (below). The store holds at most
  ``MEMORY_BYTES`` in all (``SPECVIZ_SESSION_MEMORY_MB``, default 1,024 MB: what 36 of the largest loadable
  recordings took before) and at most ``capacity`` sessions (``SPECVIZ_MAX_SESSIONS``).
- **Making room** for a newcomer, or after a run pushed the total over, takes first a session that shows
  nothing and is idle for ``IDLE_S`` or closed, from the address holding the most sessions (such a session
  loses nothing: its next event makes it again), then one of the newcomer's own address that shows nothing; then the
  least recently used session (one showing nothing first) of the address furthest over its **fair share** of the store's
  bytes or of its sessions (``MEMORY_BYTES`` or ``capacity`` divided by the addresses holding sessions, the newcomer's
  counted), or of the newcomer's own address when it holds its whole share (alone on the server, a class's oldest run
  makes room for its newest). A session with a job waiting, running or streaming is never taken, and another address
  within both shares loses nothing. So forty students behind one address, alone on the server, may hold the whole store;
  beside attackers they keep their share; an attacker's many sessions can only push out the attacker's own.
- A session that finds no room is still answered, from a state of its own that is not kept, and the queue
  refuses its jobs with a message naming the limit and when it lifts (``admits``, ``refusal``; asked by
  ``specviz.ui.guard.admission``).

Measured prices (``tests/test_bounds.py`` checks them against tracemalloc): the shipped recordings took 373-628
bytes of Python objects per record when loaded, the largest loadable one (an 8 MB upload) 259; the page keeps
its rendered views beside the recording (RSS grew about 15 MB per session holding that 10 MB recording), so a
record is priced at 1,000 bytes. A session that shows nothing (``LeanSessionState``) takes under 20 KiB.

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
(``specviz.ui.guard.server``), so nothing reads it. For the page's 142 components it cost 203 KiB and 49 ms of the
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
from specviz.ui.page import state
from specviz.ui.guard.address import client_address
from specviz.ui.guard.limits import SESSION_TTL_S, whole_number

IDLE_S = 60.0  # a session that shows no run may give its place to a newcomer after this long unused
EMPTY_SESSION_BYTES = 20 * 1024  # a LeanSessionState that shows nothing (measured under 20 KiB)
RECORD_BYTES = 1000  # per record of a shown recording, its rendered views included (module docstring)
MEMORY_BYTES = whole_number("SPECVIZ_SESSION_MEMORY_MB", 1024, 16) * 2**20  # all sessions' prices together, at most
# Handing memory back (a full garbage collection: 0.3 s of the server's time, the interpreter held) at most this
# often: under a flood of fresh sessions some expire every second, and a collection each second slowed other visitors.
FREE_EVERY_S = 15.0

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


def recording_records(recording) -> int:
    """Records a Recording holds, the unit of its memory: rounds, drafts, tree nodes and top-token entries of its
    two traces (speculative and baseline), and a sweep's points (numbers, no trace). O(rounds); 0 for anything that
    is not a Recording."""
    traces = [getattr(recording, "speculative", None), getattr(recording, "baseline", None)]
    records = len(getattr(getattr(recording, "sweep", None), "points", None) or ())
    for trace in traces:
        for r in getattr(trace, "rounds", None) or ():
            tree = getattr(r, "tree", None)
            records += 1 + len(r.drafts) + len(r.final_top) + (len(tree.nodes) if tree is not None else 0)
    return records


def session_bytes(session: SessionState) -> int:
    """A session's price in bytes (module docstring): ``EMPTY_SESSION_BYTES``, plus ``RECORD_BYTES`` per record of
    what its state shows."""
    return EMPTY_SESSION_BYTES + RECORD_BYTES * sum(
        recording_records(v) for v in session.state_data.values() if v is not None
    )


class SessionStore(StateHolder):
    """Gradio's ``StateHolder`` with the admission rules of the module docstring instead of LRU eviction."""

    idle_s = IDLE_S
    memory_bytes = MEMORY_BYTES
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
        """The address each kept session was made from (sessions made outside a request: "")."""
        return self._own_dict("_owners")

    @property
    def _prices(self) -> dict[str, tuple[tuple, int]]:
        """Each session's price, with what it was computed from (the ids of its state's values)."""
        return self._own_dict("_price_cache")

    def price(self, session_id: str) -> int:
        """``session_bytes`` of a kept session, computed again only when its state's values changed."""
        session = self.session_data[session_id]
        key = tuple(id(v) for v in session.state_data.values() if v is not None)
        cached = self._prices.get(session_id)
        if cached is None or cached[0] != key:
            cached = self._prices[session_id] = (key, session_bytes(session))
        return cached[1]

    def __getitem__(self, session_id: str) -> SessionState:
        with self.lock:
            if session_id not in self.session_data:
                address = current_address.get()
                victims = self._victims(address, EMPTY_SESSION_BYTES, 1)
                if victims is None:
                    return LeanSessionState(self.blocks)  # answered, not kept
                for victim in victims:
                    self._drop(victim)
                self.session_data[session_id] = LeanSessionState(self.blocks)
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
        return [s for s in self.session_data if owners.get(s, "") == address]

    def fair_share(self, address: str | None) -> int:
        """Bytes one address may hold when the store is full: ``memory_bytes`` over the addresses holding sessions,
        ``address`` counted among them (None: only those)."""
        addresses = {self.owners.get(s, "") for s in self.session_data} | ({address} if address is not None else set())
        return self.memory_bytes // max(1, len(addresses))

    def admits(self, session_id: str | None, address: str) -> bool:
        """Whether a job naming ``session_id`` from ``address`` would find its session kept: the session exists,
        or there is room for one more, or room can be made by the rules of the module docstring."""
        with self.lock:
            if not session_id or session_id in self.session_data:
                return True
            return self._victims(address, EMPTY_SESSION_BYTES, 1) is not None

    def refusal(self, address: str) -> str:
        """Why a new session from ``address`` is not kept, and when that lifts (the page shows it)."""
        with self.lock:
            now = datetime.datetime.now()
            left = [self.ttl_s - (now - self.time_last_used.get(s, now)).total_seconds() for s in self.session_data]
            minutes = max(1, round(min(left, default=self.ttl_s) / 60))
            return (
                f"The server is full: it keeps at most {self.memory_bytes / 2**20:.0f} MB of visitors' shown runs "
                f"({len(self.session_data)} sessions now), and every session it could let go belongs to a visitor "
                "within a "
                f"fair share ({self.fair_share(address) / 2**20:.0f} MB per address). Your run would be shown but not "
                "kept. "
                f"The oldest of them expires in about {minutes} min (SPECVIZ_SESSION_MEMORY_MB raises the limit)."
            )

    def _victims(self, address: str, need_bytes: int, need_count: int) -> list[str] | None:
        """The sessions to drop so that ``need_count`` more sessions costing ``need_bytes`` fit (module docstring's
        order), or None when no such set exists; drops nothing."""
        total = sum(self.price(s) for s in self.session_data)
        count, chosen = len(self.session_data), []
        while count + need_count > self.capacity or total + need_bytes > self.memory_bytes:
            victim = self._victim(address, set(chosen))
            if victim is None:
                return None
            chosen.append(victim)
            count, total = count - 1, total - self.price(victim)
        return chosen

    def _victim(self, address: str | None, taken: set[str]) -> str | None:
        """The next session to let go for a newcomer from ``address`` (None: none comes), none of ``taken`` nor any
        with a job running: a session that shows nothing and is idle or closed, from the address holding the most;
        else the least recently used session (one that shows nothing first) of the address furthest over its fair
        share of the store's sessions or bytes, or of the newcomer's own address when it holds its whole share; None
        when every address is within both and the newcomer's is under its share."""
        now = datetime.datetime.now()
        owners = self.owners
        held: dict[str, list[str]] = {}
        for s in self.session_data:
            if s not in taken and not self._busy(s):
                held.setdefault(owners.get(s, ""), []).append(s)
        for owner in sorted(held, key=lambda a: -len(held[a])):  # nothing is lost: its next event makes it again
            for s in held[owner]:
                session = self.session_data[s]
                idle = (now - self.time_last_used.get(s, now)).total_seconds()
                if not shows_run(session) and (session.is_closed or idle > self.idle_s):
                    return s
        for s in held.get(address, ()):  # the newcomer's own address: a session of its that shows nothing
            if not shows_run(self.session_data[s]):
                return s
        addresses = {owners.get(s, "") for s in self.session_data if s not in taken} | (
            {address} if address is not None else set()
        )
        count_share, byte_share = self.capacity / max(1, len(addresses)), self.memory_bytes / max(1, len(addresses))
        count, cost = dict.fromkeys(held, 0), dict.fromkeys(held, 0)
        for s in self.session_data:
            owner = owners.get(s, "")
            if s not in taken and owner in held:
                count[owner] += 1
                cost[owner] += self.price(s)
        over = {a: max(count[a] / count_share, cost[a] / byte_share) for a in held}
        worst = max(over, key=over.get, default=None)
        if worst is None or over[worst] <= 1:
            # at its share, the newcomer's own address makes room from its own sessions (it pushes out only its own)
            if address is None or address not in held or over[address] < 1:
                return None
            worst = address
        mine = held[worst]
        return next((s for s in mine if not shows_run(self.session_data[s])), mine[0])

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
            stale = [
                s for s in self.session_data if (now - self.time_last_used.get(s, now)).total_seconds() > self.ttl_s
            ]
            for session_id in stale:
                self._drop(session_id)
            shed = self._shed()
        forgotten = self._forget_queue_records()
        self._owes_free = self._owes_free or bool(stale or shed or forgotten)
        if self._owes_free and time.monotonic() - self._freed_at >= self.free_every_s:
            self._owes_free, self._freed_at = False, time.monotonic()
            free_memory("cpu")

    def _forget_queue_records(self) -> int:
        """Drop Gradio's queue records (message queue, unread event ids) of hashes orphaned for ``ttl_s``; how many
        went.

        Runs on the event loop, as the queue's own changes to these records do, so none changes under it."""
        queue = getattr(getattr(self, "blocks", None), "_queue", None)
        if queue is None:
            return 0
        messages, unread, live = (
            queue.pending_messages_per_session,
            queue.pending_event_ids_session,
            queue.event_ids_to_events,
        )
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
        self._prices.pop(session_id, None)

    def _busy(self, session_id: str) -> bool:
        """Whether a job of the session streams, waits in the queue or runs: its state is written when the job ends."""
        if session_id in state.running:
            return True
        queue = getattr(getattr(self, "blocks", None), "_queue", None)
        if queue is None:
            return False
        live = queue.event_ids_to_events
        return any(event in live for event in queue.pending_event_ids_session.get(session_id, ()))

    def _shed(self) -> int:
        """Let go of sessions, in the order of the module docstring, while the store costs more than
        ``memory_bytes`` (a run shown since admission can push it over); how many went."""
        gone, total = 0, sum(self.price(s) for s in self.session_data)
        while total > self.memory_bytes and (victim := self._victim(None, set())) is not None:
            total -= self.price(victim)
            self._drop(victim)
            gone += 1
        return gone


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
