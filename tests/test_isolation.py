"""No visitor can read, hold or switch another visitor's work: the app launched in this process and
driven over HTTP from two client addresses on the loopback network (127.0.0.2 and 127.0.0.3), each
request loop bounded in count and time.

- Files: each session's downloads and exports live in a folder named by a random token, each file
  named by another; the folder goes when the session ends.
- The queue: at most one waiting engine job per client address (with the one running); a visitor
  with nothing running goes ahead of a flooding address's waiting job.
- A job whose client hung up, or never opened its result stream, stops within a round.
- A pair request that cannot be served leaves the resident pair loaded.
- Uploads: a per-address and a total budget (429 past either).
- Fields of the wrong type are refused with a message naming the field.
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
import uuid

import httpx
import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


pytestmark = pytest.mark.slow

A, B = "127.0.0.2", "127.0.0.3"
CAP_S = 240  # "answered": generous on a busy two-core machine


def client(address: str) -> httpx.Client:
    """An HTTP client whose connections leave from ``address`` (the server sees that peer)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=60)


@functools.lru_cache(maxsize=None)
def fn_index(url: str, api_name: str) -> int:
    deps = httpx.get(f"{url}/config", timeout=30).json()["dependencies"]
    return next(d["id"] for d in deps if d.get("api_name") == api_name)


def run_data(tokens: int) -> list:
    return ["embedded", "def f(x):", 4, 0.0, 0, 1.0, tokens, 0, True, "model", "constant", 1.0, "chain"]


def join(
    http: httpx.Client, url: str, data: list, api_name: str = "run", session: str | None = None
) -> tuple[httpx.Response, str]:
    session = session or uuid.uuid4().hex
    body = {
        "data": data,
        "fn_index": fn_index(url, api_name),
        "session_hash": session,
        "event_data": None,
        "trigger_id": None,
    }
    return http.post(f"{url}/gradio_api/queue/join", json=body), session


def listen(
    http: httpx.Client, url: str, session: str, until: str = "process_completed", cap_s: float = CAP_S
) -> list[dict]:
    """Read the session's event stream until a message of kind ``until`` (or the cap)."""
    seen = []
    end = time.monotonic() + cap_s
    with http.stream("GET", f"{url}/gradio_api/queue/data", params={"session_hash": session}, timeout=cap_s) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                msg = json.loads(line[5:])
                seen.append(msg)
                if msg.get("msg") == until:
                    break
            if time.monotonic() > end:
                break
    return seen


def device_queue(demo):
    q = demo._queue.event_queue_per_concurrency_id.get("device")
    return list(q.queue) if q is not None else []


def device_busy(demo) -> bool:
    return any(e.concurrency_id == "device" for jobs in demo._queue.active_jobs if jobs for e in jobs)


def wait_idle(demo, cap_s: float = CAP_S) -> None:
    end = time.monotonic() + cap_s
    while time.monotonic() < end and (device_busy(demo) or device_queue(demo)):
        time.sleep(0.2)


# ---- files ------------------------------------------------------------------------------------


def test_two_sessions_cannot_derive_each_others_file_names():
    from specviz.recording import Recording
    from specviz.ui.guard import downloads
    from specviz.trace import Trace

    rec = Recording(Trace(mode="speculative", prompt_ids=[1, 2], output_ids=[3]))
    a1, a2 = downloads.save_for_download(rec, "session-a"), downloads.save_for_download(rec, "session-a")
    b1 = downloads.save_for_download(rec, "session-b")
    paths = [os.path.relpath(p, downloads.folder()) for p in (a1, a2, b1)]
    folders = [p.split(os.sep)[0] for p in paths]
    assert folders[0] == folders[1] != folders[2]  # one folder per session
    for part in [*folders, *(os.path.basename(p) for p in paths)]:
        token = re.sub(r"^specviz-run-|\.json$", "", part)
        assert len(token) >= 21 and not token.isdigit()  # at least 128 random bits, no counter, no time
    assert not re.search(r"\d{8}-\d{6}", "".join(paths))  # no timestamp in any name
    assert os.path.basename(paths[0]) != os.path.basename(paths[1])
    downloads.session_ended(type("R", (), {"session_hash": "session-a"})())
    assert not os.path.exists(a1) and not os.path.exists(os.path.dirname(a1)) and os.path.exists(b1)
    downloads.forget_session("session-b")


def test_a_guessed_name_of_another_sessions_file_is_not_there(app):
    from specviz.recording import Recording
    from specviz.trace import Trace
    from specviz.ui.guard import downloads

    url = app[1]
    real = downloads.save_for_download(Recording(Trace(mode="speculative", prompt_ids=[1], output_ids=[2])), "victim")
    # What the old names let an attacker do: step a counter and a timestamp in a path it knows.
    guess = os.path.join(os.path.dirname(real), "specviz-run-20261125-120000-2.json")
    with client(A) as http:
        assert http.get(f"{url}/gradio_api/file={guess}").status_code != 200
        assert http.get(f"{url}/gradio_api/file={os.path.dirname(real)}").status_code != 200  # no listing
    downloads.forget_session("victim")


# ---- the queue ----------------------------------------------------------------------------------


def test_a_flood_from_one_address_leaves_another_served_after_the_running_job(app):
    demo, url = app
    wait_idle(demo)
    with client(A) as a, client(B) as b:
        admitted = refused = 0
        sessions = []
        for _ in range(40):  # 40 /run calls from one address, each with a fresh session hash
            r, session = join(a, url, run_data(256))
            ok = r.status_code == 200 and r.json().get("event_id")
            admitted += bool(ok)
            refused += not ok
            if ok:
                sessions.append(session)
        print(f"\nflood from {A}: {admitted} admitted, {refused} refused of 40")
        waiting_from_a = [e for e in device_queue(demo) if e.request.client.host == A]
        # one running, and at most half the queue's places waiting (others hold none): the rest refused, saying why
        from specviz.ui.guard import admission

        half = admission.places(demo._queue.max_size, 0, 0)
        assert admitted <= 1 + half and refused >= 40 - 1 - half and len(waiting_from_a) <= half
        start = time.monotonic()
        r, session = join(b, url, run_data(8))
        assert r.status_code == 200
        addresses = [e.request.client.host for e in device_queue(demo)]
        # started beside the flood's running job (a short job of another address: ``admission.dispatching``), or,
        # with one slot (``SPECVIZ_CONCURRENCY=1``), first in line, ahead of the flood's waiting jobs
        assert B not in addresses or addresses[0] == B, addresses
        seen = listen(b, url, session)
        waited = time.monotonic() - start
        print(f"the other address's 8-token run answered in {waited:.1f} s, after at most the one running job")
        assert seen and seen[-1].get("msg") == "process_completed" and seen[-1].get("success"), seen[-1:]
    for s in sessions:  # end the flood's jobs
        httpx.post(
            f"{url}/gradio_api/cancel",
            json={"session_hash": s, "fn_index": fn_index(url, "run"), "event_id": ""},
            timeout=CAP_S,
        )
    wait_idle(demo)


def test_a_job_whose_client_hung_up_stops_within_a_round(app):
    demo, url = app
    wait_idle(demo)
    with client(A) as a:
        r, session = join(a, url, run_data(256))
        assert r.status_code == 200
        listen(a, url, session, until="process_starts", cap_s=60)  # then hang up
    start = time.monotonic()
    end = start + CAP_S
    while time.monotonic() < end and device_busy(demo):
        time.sleep(0.2)
    freed = time.monotonic() - start
    print(f"\na 256-token run whose client hung up freed the device after {freed:.1f} s")
    assert not device_busy(demo)


def test_a_job_whose_result_stream_is_never_opened_stops(app, monkeypatch):
    """POST /call/run and never GET its stream: the job stops at a round once the grace period is over,
    and another address's 8-token run is served. The device is slowed to at least 0.1 s per round here
    (a stand-in for a slow machine), so the 256-token job outlasts the grace period on any machine."""
    from specviz.ui.tabs import api
    from specviz.ui.running import listening

    demo, url = app
    wait_idle(demo)
    real = api.run_on_device

    def slowed(req, stop=None, device_owner=None):
        for event in real(req, stop, device_owner=device_owner):
            time.sleep(0.1)
            yield event

    monkeypatch.setattr(api, "run_on_device", slowed)
    monkeypatch.setattr(listening, "GRACE_S", 1.0)
    with client(A) as a, client(B) as b:
        r = a.post(f"{url}/gradio_api/call/run", json={"data": run_data(256)})
        assert r.status_code == 200
        event_id = r.json()["event_id"]  # and its stream is never opened
        start = time.monotonic()
        end = start + 60
        while time.monotonic() < end and not device_busy(demo):
            time.sleep(0.05)
        r, session = join(b, url, run_data(8))
        assert r.status_code == 200
        seen = listen(b, url, session)
        waited = time.monotonic() - start
        assert seen and seen[-1].get("msg") == "process_completed" and seen[-1].get("success"), seen[-1:]
        text = a.get(f"{url}/gradio_api/call/run/{event_id}", timeout=CAP_S).text  # read only now: how the job ended
    print(
        f"\na 256-token /run nobody read stopped; the other address's 8-token run answered {waited:.1f} s after it was "
        "posted"
    )
    # Whichever comes first stops it: nobody reading it past the grace period, or (the device queue by size) the
    # other address's much shorter run waiting for the device.
    assert "event: error" in text and ("the run stopped" in text or "Device shared" in text), text[-300:]
    wait_idle(demo)


def test_event_streams_are_known_by_their_route():
    from specviz.ui.running.listening import stream_key

    def scope(path, query=b"", method="GET"):
        return {"type": "http", "method": method, "path": path, "query_string": query}

    assert stream_key(scope("/gradio_api/call/run/abc123")) == "abc123"
    assert stream_key(scope("/gradio_api/call/v2/run/abc123")) == "abc123"
    assert stream_key(scope("/gradio_api/queue/data", b"session_hash=s1")) == "s1"
    assert stream_key(scope("/gradio_api/call/run", method="POST")) is None
    assert stream_key(scope("/gradio_api/queue/data")) is None
    assert stream_key(scope("/gradio_api/upload")) is None
    # Anchored (issue 39): a 404 path that merely ends like a stream route is no stream.
    assert stream_key(scope("/x/gradio_api/call/run/abc123")) is None
    assert stream_key(scope("/gradio_api/call/run/abc123/more")) is None
    assert stream_key(scope("/x/gradio_api/queue/data", b"session_hash=s1")) is None
    assert stream_key({**scope("/x/gradio_api/call/run/abc123"), "root_path": "/x"}) == "abc123"  # mounted under /x


@pytest.mark.parametrize("status", [200, 404])
def test_a_stream_counts_as_opened_only_when_the_app_answers_it(status):
    """A GET the app refuses (404: no such event) opens no stream: its job stays unheard."""
    import asyncio

    from specviz.ui.running import listening

    key = f"event-{status}"

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def send(message):
        pass

    scope = {"type": "http", "method": "GET", "path": f"/gradio_api/call/run/{key}", "query_string": b""}
    asyncio.run(listening.StreamWatch(app)(scope, None, send))
    event = type("Event", (), dict(session_hash=key, _id=key, enqueue_time=0.0))()
    assert listening.heard(event) == (status == 200)


# ---- pairs ----------------------------------------------------------------------------------------


def test_a_refused_pair_leaves_the_resident_pair_loaded(monkeypatch):
    from specviz.pair import cache, loading
    from specviz.pair.errors import PairError

    from specviz.pair.catalogue import english_available

    if not english_available():
        pytest.skip("the English pair's offline target is not installed")
    cache.load_pair("embedded")
    before = list(cache.resident_pairs())
    assert before
    monkeypatch.setattr(loading, "available_memory_bytes", lambda dev: 1)  # nothing fits, even after unloading
    monkeypatch.setattr(cache, "resident_limit", lambda: 1)
    with pytest.raises(PairError, match="stays loaded"):
        cache.load_pair("english")
    assert list(cache.resident_pairs()) == before


# ---- uploads --------------------------------------------------------------------------------------


def test_uploads_over_the_budget_are_refused(app, monkeypatch):
    from specviz.ui.guard import budgets, server

    url = app[1]
    monkeypatch.setattr(
        server, "UPLOADS", budgets.UploadBudget(per_client=int(3.5 * 2**20), total=int(5.5 * 2**20), window_s=600)
    )
    blob = os.urandom(2**20)
    codes = {A: [], B: []}
    for address in (A, A, A, A, B, B, B):
        with client(address) as http:
            r = http.post(f"{url}/gradio_api/upload", files={"files": ("x.json", blob, "application/json")})
            codes[address].append(r.status_code)
    print(f"\nuploads of 1 MB from {A}: {codes[A]}; from {B}: {codes[B]}")
    assert codes[A][:3] == [200] * 3 and codes[A][3] == 429  # per visitor
    assert codes[B][:2] == [200] * 2 and codes[B][2] == 429  # in all


def test_the_upload_budget_counts_per_address_and_in_all():
    from specviz.ui.guard.budgets import UploadBudget

    budget = UploadBudget(per_client=10, total=15, window_s=60)
    assert budget.take("a", 10) is None and "per visitor" in budget.take("a", 1)
    assert budget.take("b", 5) is None and "at most" in budget.take("b", 1)


# ---- fields -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, name",
    [
        (0, ["embedded"], "pair"),
        (12, ["chain"], "token tree"),
        (12, {"a": 1}, "token tree"),
        (8, "yes", "chat"),
        (8, None, "chat"),
    ],
)
def test_run_refuses_fields_of_the_wrong_type_naming_them(app, field, value, name):
    url = app[1]
    data = run_data(8)
    data[field] = value
    with client(A) as http:
        r = http.post(f"{url}/gradio_api/call/run", json={"data": data})
        text = http.get(f"{url}/gradio_api/call/run/{r.json()['event_id']}", timeout=CAP_S).text
    assert "event: error" in text, text[-300:]
    message = text.split("event: error", 1)[1]
    assert name in message and "<" not in message, message[-300:]


def test_the_apis_default_pair_is_the_pages():
    import inspect

    from specviz.pair import default_pair
    from specviz.ui.tabs.api import run_api

    assert inspect.signature(run_api).parameters["pair_name"].default == default_pair()
