"""The session store's admission by memory and fair share (issue 53), on a store of its own: no server, no model.

A class behind one address must never be locked out; an attacker's many sessions push out only the attacker's own;
a session whose job is under way is never let go; and the price a session is given covers what its recording takes.
"""

from __future__ import annotations

import datetime
import gc
import threading
import tracemalloc
from collections import OrderedDict
from types import SimpleNamespace

import gradio as gr
import pytest

from specviz.recording import Recording
from specviz.trace import Round
from specviz.ui.guard import sessions
from specviz.ui.page import state
from specviz.ui.page.defaults import RECORDINGS
from specviz.ui.guard.sessions import EMPTY_SESSION_BYTES, RECORD_BYTES, SessionStore, recording_records


@pytest.fixture(scope="module")
def blocks():
    with gr.Blocks() as demo:
        gr.State(None)
    return demo


def store_of(blocks, capacity: int, memory_mb: float) -> SessionStore:
    """An empty store of ``capacity`` sessions and ``memory_mb`` MB, as the server's would be after ``install``."""
    store = SessionStore.__new__(SessionStore)
    store.blocks, store.capacity, store.lock = blocks, capacity, threading.RLock()
    store.session_data, store.time_last_used = OrderedDict(), {}
    store.memory_bytes = int(memory_mb * 2**20)
    return store


def recording(rounds: int, drafts: int = 4) -> SimpleNamespace:
    """A stand-in Recording of ``rounds`` rounds of ``drafts`` drafts (only what pricing reads)."""
    one = SimpleNamespace(drafts=[None] * drafts, final_top=[], tree=None)
    return SimpleNamespace(speculative=SimpleNamespace(rounds=[one] * rounds), baseline=None, sweep=None)


def visit(store: SessionStore, address: str, session: str, shows: SimpleNamespace | None = None) -> bool:
    """A visitor's event from ``address`` naming ``session``, then its run shown; whether the session is kept."""
    token = sessions.current_address.set(address)
    try:
        page = store[session]
    finally:
        sessions.current_address.reset(token)
    if shows is not None:
        page.state_data[0] = shows
    return session in store.session_data


def test_a_class_of_forty_behind_one_address_is_kept_whole(blocks):
    """A fixed cap of 8 sessions per address locked the ninth student out for 30 minutes."""
    store = store_of(blocks, capacity=2000, memory_mb=64)
    kept = [visit(store, "203.0.113.9", f"student{i}", recording(128)) for i in range(40)]
    assert all(kept) and len(store.session_data) == 40
    assert all(store.admits(f"student{i}", "203.0.113.9") for i in range(40))
    assert store.admits("student40", "203.0.113.9")


def test_an_attackers_many_sessions_push_out_only_its_own(blocks):
    """Runs of 600 records (about 0.6 MB each): an attacker fills a 16 MB store; a class then comes from another
    address and keeps every run, each pushing out the attacker's least recently used session; the class, within its
    fair share (half the store), loses nothing to the attacker's next runs."""
    store = store_of(blocks, capacity=2000, memory_mb=16)
    big = recording(600, drafts=0)  # 600 records
    for i in range(60):
        visit(store, "198.51.100.1", f"attack{i}", big)
    store._shed()
    assert sum(store.price(s) for s in store.session_data) <= store.memory_bytes
    students = [f"student{i}" for i in range(12)]
    for s in students:
        assert visit(store, "203.0.113.9", s, big)
        store._shed()
    assert all(s in store.session_data for s in students)
    attacker = [s for s in store.session_data if s.startswith("attack")]
    assert sum(store.price(s) for s in store.session_data) <= store.memory_bytes
    assert attacker == [f"attack{i}" for i in range(60 - len(attacker), 60)]  # its least recently used went
    for i in range(5):  # the attacker goes on: now it pushes out its own
        visit(store, "198.51.100.1", f"attack-again{i}", big)
        store._shed()
    assert all(s in store.session_data for s in students)  # within its share: nothing of the class goes
    assert sum(store.price(s) for s in store.session_data) <= store.memory_bytes


def test_a_flood_of_empty_sessions_gives_way_to_another_address(blocks):
    """Fresh session hashes that show nothing fill the count; a newcomer from elsewhere takes the place of the
    flood's least recently used one (nothing is lost: its next event makes it again)."""
    store = store_of(blocks, capacity=6, memory_mb=64)
    for i in range(24):
        visit(store, "198.51.100.1", f"flood{i}")
    assert len(store.session_data) == 6
    for i in range(3):
        assert visit(store, "203.0.113.9", f"visitor{i}", recording(10))
    assert len(store.session_data) == 6 and all(f"visitor{i}" in store.session_data for i in range(3))


def test_a_session_with_a_job_under_way_is_never_let_go(blocks):
    store = store_of(blocks, capacity=2, memory_mb=64)
    visit(store, "198.51.100.1", "a")
    visit(store, "198.51.100.1", "b")
    state.running["a"] = state.running["b"] = 1
    try:
        assert not visit(store, "203.0.113.9", "c")  # answered, not kept
        assert not store.admits("c", "203.0.113.9")
        message = store.refusal("203.0.113.9")
        assert (
            "keeps at most 64 MB" in message
            and "expires in about" in message
            and "SPECVIZ_SESSION_MEMORY_MB" in message
        )
    finally:
        del state.running["a"], state.running["b"]
    assert visit(store, "203.0.113.9", "c")


def test_a_session_shown_past_the_memory_is_let_go_at_the_next_check(blocks):
    """A run shown after admission can push the store over its memory: the expiry check sheds the least recently
    used run of the address furthest over its share."""
    store = store_of(blocks, capacity=100, memory_mb=1)
    visit(store, "198.51.100.1", "old", recording(400, drafts=0))
    visit(store, "198.51.100.1", "new", recording(700, drafts=0))
    store.time_last_used["old"] = datetime.datetime.now() - datetime.timedelta(seconds=5)
    assert store._shed() == 1 and list(store.session_data) == ["new"]


def test_a_sessions_price_covers_what_its_recording_takes():
    """RECORD_BYTES per record is an upper bound of the Python objects a loaded recording holds (tracemalloc; the
    shipped recordings and a large one), and within 5x of it: a price far above would turn classes away early."""
    Recording.from_json((RECORDINGS / "sampled-gamma8.json").read_bytes())  # first load: imports, caches
    texts = [p.read_bytes() for p in sorted(RECORDINGS.glob("*.json"))]
    for text in texts:
        gc.collect()
        tracemalloc.start()
        try:
            loaded = Recording.from_json(text)
            taken, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        price = RECORD_BYTES * recording_records(loaded) + EMPTY_SESSION_BYTES
        assert taken <= price <= 5 * taken, (taken, price)


def test_records_count_rounds_drafts_tree_nodes_and_top_tokens():
    one = Round(
        drafts=[None, None],
        emitted_ids=[1],
        final_token_id=1,
        final_text="a",
        final_kind="bonus",
        final_prob=1.0,
        draft_ms=0.0,
        verify_ms=0.0,
        end_ms=0.0,
        final_top=[None] * 3,
        tree=SimpleNamespace(nodes=[None] * 5),
    )
    rec = SimpleNamespace(
        speculative=SimpleNamespace(rounds=[one, one]),
        baseline=SimpleNamespace(rounds=[one]),
        sweep=SimpleNamespace(points=[None] * 8),
    )
    assert recording_records(rec) == 3 * (1 + 2 + 3 + 5) + 8
    assert recording_records(None) == 0


def test_an_address_holding_its_whole_share_makes_room_from_its_own(blocks):
    """Alone on a full store, an address's newcomer takes the place of its own least recently used session (it was
    answered but not kept, and its jobs refused); another address within its share would lose nothing."""
    store = store_of(blocks, capacity=4, memory_mb=64)
    for i in range(4):
        visit(store, "203.0.113.9", f"student{i}", recording(10))
    assert visit(store, "203.0.113.9", "student4", recording(10))
    assert list(store.session_data) == ["student1", "student2", "student3", "student4"]
