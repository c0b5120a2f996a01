"""The device queue by size (issue 39): a short Generate or /run job goes ahead of long ones whoever used the
device before, a running long job gives the device up at its next round to a much shorter job of another
address, and neither rule starves long jobs or lets many tiny jobs end every run.

Under a flood of /run posts from three fresh addresses, the order by device time used put a victim who had used
a few seconds behind each attacker's 128-token job (35.75 s for an 8-token run against 1.12 s alone). Order
and giving way are asserted by positions and forward-pass counts (a stub pair), never by wall-clock time.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.test_halting import GAMMA, SESSION, stub  # noqa: F401  (the stub pair fixture)

VICTIM, ATTACKERS = "10.0.0.1", ("10.0.0.21", "10.0.0.22", "10.0.0.23")


def run_data(tokens: int, gamma: int = GAMMA, tree: str = "chain") -> list:
    return ["embedded", "def f(x):", gamma, 0.0, 0, 1.0, tokens, 0, True, "model", "constant", 1.0, tree]


def queued(address: str, tokens: int, arrived: float, api_name: str = "run", data: list | None = None):
    """A waiting Gradio queue event of ``address``: a /run (or Generate) job of ``tokens`` tokens that joined at
    ``arrived``."""
    return SimpleNamespace(
        request=SimpleNamespace(client=SimpleNamespace(host=address), headers={}),
        concurrency_id="device",
        alive=True,
        session_hash=address,
        _id=address,
        enqueue_time=arrived,
        fn=SimpleNamespace(api_name=api_name),
        data=SimpleNamespace(data=data or run_data(tokens)),
    )


def fake_queue(running: list | None = None):
    return SimpleNamespace(event_queue_per_concurrency_id={}, active_jobs=[running or []])


@pytest.fixture(autouse=True)
def fresh_share(monkeypatch):
    from specviz.ui.running import share

    monkeypatch.setattr(share, "_log", __import__("collections").deque())
    monkeypatch.setattr(share, "_used", {})
    monkeypatch.setattr(share, "_yields", {})


# ---- the order of waiting jobs --------------------------------------------------------------------------


def test_a_short_run_goes_ahead_of_long_ones_whoever_used_the_device():
    """The victim has used 5 s; three fresh attacker addresses nothing, their 128-token jobs queued before it.
    Before: the victim went last (least used first). Now it goes first."""
    from specviz.ui.running import share
    from specviz.ui.guard.admission import order

    share.charge(VICTIM, 5.0)
    waiting = [queued(a, 128, arrived=100.0 + k) for k, a in enumerate(ATTACKERS)] + [queued(VICTIM, 8, arrived=104.0)]
    order(fake_queue(), waiting, "device")
    assert [e._id for e in waiting] == [VICTIM, *ATTACKERS]


def test_a_long_job_is_passed_only_by_jobs_that_arrive_within_its_size():
    """Aging: a 128-token job that has waited longer than its expected size stays ahead of a newer 8-token job;
    a newer one within its size goes ahead. So a long job is never starved by a stream of short ones."""
    from specviz.ui.running import share
    from specviz.ui.guard.admission import order

    long_s = share.sized(GAMMA, 128)
    early, late = queued("10.0.0.2", 8, arrived=100.0 + long_s + 1), queued("10.0.0.3", 8, arrived=100.0 + 1)
    waiting = [queued(VICTIM, 128, arrived=100.0), early, late]
    order(fake_queue(), waiting, "device")
    assert [e._id for e in waiting] == ["10.0.0.3", VICTIM, "10.0.0.2"]


def test_sizes_grow_with_tokens_gamma_and_tree_and_bad_inputs_count_as_largest():
    from specviz.ui.running import share

    assert share.sized(4, 8) < share.sized(4, 128) < share.sized(4, 256)
    assert share.sized(4, 128) < share.sized(8, 128) < share.sized(4, 128, "tree 3-2-2-1 (33 nodes)")
    for bad in (
        (True, 8, "chain"),
        (4, 8.5, "chain"),
        (4, 0, "chain"),
        (4, 8, "a tree"),
        ("4", 8, "chain"),
        (99, 8, "chain"),
    ):
        assert share.sized(*bad) is None, bad
    # too few values: the job fails at once, it never jumps the queue
    odd = queued(VICTIM, 8, 0.0, data=["embedded", "x"])
    assert share.job_seconds(odd) is None and share.place(odd) == share.LARGEST_S
    generate = ["embedded", "def f(x):", GAMMA, 0.0, 0, 1.0, 8, 0, True, "", "", "model", "constant", 1.0, "chain"]
    assert share.job_seconds(queued(VICTIM, 8, 0.0, "generate", generate)) == share.sized(
        GAMMA, 8, pair=("embedded", "", "")
    )


def test_a_job_is_priced_by_its_pair_so_a_short_run_of_a_tiny_pair_does_not_give_way_to_a_larger_pairs_token():
    """A 16-token run of the embedded pair (0.5 s of the device on 2 cores) gave way to a 1-token Generate of the
    English pair (0.6 s: two prefills of a 135 M target), priced by tokens alone; each is priced by its pair's target
    now."""
    from specviz.ui.running import share, sizing

    tiny, english = ("embedded", "", ""), ("english", "", "")
    assert share.sized(4, 1, pair=english) > share.sized(4, 16, pair=tiny) / share.YIELD_RATIO
    assert share.sized(4, 16, pair=english) > share.sized(4, 16, pair=tiny)
    assert share.sized(4, 16, pair=english) == share.sized(4, 16)  # the English pair's price is the unit
    # custom ids are priced as the English pair until they load; a name that is no preset too
    assert sizing.pair_scale("embedded", "someone/model") == sizing.pair_scale("no such pair") == 1.0
    assert sizing.pair_scale("embedded") == sizing.PAIR_SCALE_MIN
    generate = ["english", "def f(x):", GAMMA, 0.0, 0, 1.0, 1, 0, True, "", "", "model", "constant", 1.0, "chain"]
    assert share.job_seconds(queued(VICTIM, 1, 0.0, "generate", generate)) == share.sized(GAMMA, 1, pair=english)


def test_a_bad_yields_setting_is_refused_naming_it(monkeypatch):
    from specviz.ui.running import share

    monkeypatch.setenv("SPECVIZ_YIELDS_PER_MINUTE", "many")
    with pytest.raises(ValueError, match="SPECVIZ_YIELDS_PER_MINUTE must be a whole number of at least 0"):
        share.whole_number("SPECVIZ_YIELDS_PER_MINUTE", 6, 0)
    for bad in ("-1", "2.5"):
        monkeypatch.setenv("SPECVIZ_YIELDS_PER_MINUTE", bad)
        with pytest.raises(ValueError, match="SPECVIZ_YIELDS_PER_MINUTE"):
            share.whole_number("SPECVIZ_YIELDS_PER_MINUTE", 6, 0)
    monkeypatch.setenv("SPECVIZ_YIELDS_PER_MINUTE", "0")
    assert share.whole_number("SPECVIZ_YIELDS_PER_MINUTE", 6, 0) == 0


# ---- a running job gives way to a much shorter one ---------------------------------------------------------


def _served(me: str = VICTIM):
    """A request from ``me``, the device queue it sees: (request, waiting list)."""
    device = SimpleNamespace(queue=[])
    queue = SimpleNamespace(event_queue_per_concurrency_id={"device": device}, active_jobs=[[]])
    app = SimpleNamespace(get_blocks=lambda: SimpleNamespace(_queue=queue))
    inner = SimpleNamespace(app=app, client=SimpleNamespace(host=me), headers={})
    return SimpleNamespace(session_hash=SESSION, request=inner), device.queue


@pytest.fixture
def api(stub, monkeypatch):  # noqa: F811
    """/run on the stub pair, a round event after every step (no redraw interval), the share rule out of the way
    (SHARE_S unbounded: only the size rule is under test): (passes, run_api)."""
    import specviz.ui.tabs.api as api_page
    import specviz.ui.running.device as device
    from specviz.ui.running import share

    monkeypatch.setattr(share, "SHARE_S", float("inf"))
    monkeypatch.setattr(device, "STREAM_INTERVAL_MS", 0)
    monkeypatch.setattr(api_page, "ensure_pair", lambda *a, **k: None)
    monkeypatch.setattr(api_page, "summary", lambda spec, baseline: {"tokens": len(spec.output_ids)})
    passes, _ = stub
    return passes, api_page.run_api


def _run(run_api, request, tokens: int):
    """(result, message): /run's result, or the message it stopped with."""
    import gradio as gr

    try:
        return run_api("embedded", "def f(x):", GAMMA, 0.0, 0, 1.0, tokens, request=request), None
    except gr.Error as err:
        return None, err.message


def test_a_long_run_gives_the_device_to_a_much_shorter_waiting_job_within_a_round(api):
    """A 128-token /run from an attacker; an 8-token job of the victim joins at its 12th pass. Before: it ran on
    for its whole share (SHARE_S, 10 s). Now it stops within the round under way, says why and what it had."""
    passes, run_api = api
    request, waiting = _served(ATTACKERS[0])
    passes.hook = lambda n: waiting.append(queued(VICTIM, 8, 0.0)) if n == 12 else None
    result, message = _run(run_api, request, 128)
    assert result is None and passes.n - 12 <= 2 * (GAMMA + 1), passes.n
    assert (
        "a shorter job of another visitor" in message and "tokens in" in message and "finished runs only" in message
    ), message


def test_no_giving_way_to_a_job_of_the_same_address_a_similar_size_or_an_8_token_run(api):
    """Control: the same 128-token run goes to its end while a job of its own address or one of 128 tokens
    waits, and an 8-token run never gives way, even to a 1-token job."""
    from specviz.ui.running import share

    passes, run_api = api
    for mine, theirs, who in ((128, 8, ATTACKERS[0]), (128, 128, VICTIM), (8, 1, VICTIM)):
        request, waiting = _served(ATTACKERS[0])
        waiting.append(queued(who, theirs, 0.0))
        passes.n = 0
        result, message = _run(run_api, request, mine)
        assert message is None and result["summary"]["tokens"] == mine, (mine, theirs, who, message)
    assert share.SHORT_S >= share.sized(GAMMA, 8)


def test_an_address_makes_others_give_way_a_few_times_a_minute_at_most(api, monkeypatch):
    """Many short jobs from one address cannot end every long run: past YIELDS_PER_MINUTE its jobs still go
    first in the queue but the running job keeps the device (until its share)."""
    from specviz.ui.running import share

    monkeypatch.setattr(share, "YIELDS_PER_MINUTE", 2)
    passes, run_api = api
    outcomes = []
    for _ in range(3):
        request, waiting = _served(ATTACKERS[0])
        waiting.append(queued(VICTIM, 8, 0.0))
        result, message = _run(run_api, request, 64)
        outcomes.append(message is not None)
    assert outcomes == [True, True, False]


# ---- heartbeat connections per address ---------------------------------------------------------------------


def test_heartbeat_connections_are_counted_per_address_and_refused_past_the_budget(monkeypatch):
    """A flood of heartbeat connections, each closed at once, had the server end a session per connection (its
    unload handler) and doubled a victim's run; the attack client itself kept 0.05 of a core busy. Now an address
    opens at most HEARTBEATS.per_client a minute: past it, 429 before the app sees the request; others go on."""
    import anyio

    from specviz.ui.guard import server

    monkeypatch.setattr(server, "HEARTBEATS", server.LogBudget(per_client=3, total=10**9, window_s=60))
    reached, statuses = [], []

    async def app(scope, receive, send):
        reached.append(scope["client"][0])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def receive():
        return {"type": "http.request", "body": b""}

    def open_one(address: str, path: str = "/gradio_api/heartbeat/abc") -> None:
        scope = {
            "type": "http",
            "path": path,
            "headers": [],
            "client": (address, 1234),
            "method": "GET",
            "query_string": b"",
        }
        anyio.run(server.Guard(app), scope, receive, send)

    for _ in range(5):
        open_one("10.0.0.30")
    open_one("10.0.0.31")
    open_one("10.0.0.30", "/gradio_api/info")  # other routes are not counted
    assert statuses == [200, 200, 200, 429, 429, 200, 200]
    assert reached == ["10.0.0.30"] * 3 + ["10.0.0.31", "10.0.0.30"]


def test_a_bad_heartbeats_setting_is_refused_naming_it(monkeypatch):
    from specviz.ui.guard import server

    for bad in ("0", "lots", "1.5"):
        monkeypatch.setenv("SPECVIZ_HEARTBEATS_PER_MINUTE", bad)
        with pytest.raises(ValueError, match="SPECVIZ_HEARTBEATS_PER_MINUTE must be a whole number of at least 1"):
            server._heartbeats_per_minute()


def test_jobs_sent_into_the_queue_are_counted_per_address_and_refused_past_the_budget(monkeypatch):
    """A flood of joins naming fresh session hashes, each refused by the queue, still cost the server a parsed
    request and a session lookup each and slowed a victim's 8-token run past 2x on 2 cores. Now an address sends
    at most JOINS.per_client jobs a minute (queue joins and /gradio_api/call/<api> posts alike): past it, 429
    before the app reads the body; other addresses and other routes go on."""
    import anyio

    from specviz.ui.guard import server

    monkeypatch.setattr(server, "JOINS", server.LogBudget(per_client=2, total=10**9, window_s=60))
    reached, statuses = [], []

    async def app(scope, receive, send):
        reached.append((scope["client"][0], scope["path"]))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def receive():
        return {"type": "http.request", "body": b"{}"}

    def post(address: str, path: str, method: str = "POST") -> None:
        scope = {
            "type": "http",
            "path": path,
            "headers": [],
            "client": (address, 1234),
            "method": method,
            "query_string": b"",
        }
        anyio.run(server.Guard(app), scope, receive, send)

    post("10.0.0.40", "/gradio_api/queue/join")
    post("10.0.0.40", "/gradio_api/call/run")
    post("10.0.0.40", "/gradio_api/queue/join")  # the third job this minute: refused
    post("10.0.0.41", "/gradio_api/queue/join")  # another address: its own budget
    post("10.0.0.40", "/gradio_api/call/run/abc", "GET")  # reading a result is not a job sent
    post("10.0.0.40", "/gradio_api/info")
    assert statuses == [200, 200, 429, 200, 200, 200]
    assert [a for a, _ in reached] == ["10.0.0.40", "10.0.0.40", "10.0.0.41", "10.0.0.40", "10.0.0.40"]


def test_a_bad_joins_setting_is_refused_naming_it(monkeypatch):
    from specviz.ui.guard import server

    for bad in ("0", "many"):
        monkeypatch.setenv("SPECVIZ_JOINS_PER_MINUTE", bad)
        with pytest.raises(ValueError, match="SPECVIZ_JOINS_PER_MINUTE must be a whole number of at least 1"):
            server._per_minute("SPECVIZ_JOINS_PER_MINUTE", 240)


def test_beside_a_running_job_only_a_short_job_of_another_address_starts():
    """With a job of the school's address running, the school's next jobs and another address's long job wait, and
    another address's short job starts in the free slot (wherever it stands in line); with only those held back
    waiting nothing starts until the running job ends, they keep their order, and then the first starts."""
    from specviz.ui.guard.admission import dispatching
    from specviz.ui.running import share

    school = "198.51.100.7"
    running = [queued(school, 16, arrived=99.0)]
    first, second = queued(school, 16, 100.0), queued(school, 16, 101.0)
    long_job, visitor = queued("203.0.113.9", 128, 102.0), queued("203.0.113.5", 16, 103.0)
    assert share.job_seconds(visitor) <= share.SHARE_S < share.job_seconds(long_job)
    queue = fake_queue(running)
    waiting = [first, second, long_job, visitor]
    device = SimpleNamespace(queue=waiting, current_concurrency=1, concurrency_limit=2)
    queue.event_queue_per_concurrency_id["device"] = device

    def get_events():  # Gradio's: the first waiting job of the device queue starts
        return ([waiting.pop(0)], False, "device") if waiting else None

    dispatch = dispatching(queue, get_events)
    assert dispatch()[0] == [visitor] and waiting == [first, second, long_job]
    assert dispatch() is None and waiting == [first, second, long_job]  # the school's job still runs
    running.clear()  # it ended
    device.current_concurrency = 0
    assert dispatch()[0] == [first] and waiting == [second, long_job]


def test_a_long_job_gives_way_to_a_much_shorter_job_of_another_address_running_beside_it():
    """A short run that started beside a long one (``dispatching``) shares the device's steps with it: the long one
    gives way at its next round, as it would to the run waiting; a job of its own address beside it, or one about as
    long, does not make it."""
    from specviz.ui.running import share

    request, _ = _served(ATTACKERS[0])
    beside = request.request.app.get_blocks()._queue.active_jobs[0]
    long_s = share.job_seconds(queued(ATTACKERS[0], 256, 0.0))
    beside.append(queued(ATTACKERS[0], 8, 0.0))  # its own address
    beside.append(queued(ATTACKERS[1], 200, 0.0))  # about as long
    assert share.shorter_other_job(request, long_s) is None
    beside.append(queued(VICTIM, 8, 0.0))
    assert share.shorter_other_job(request, long_s) == VICTIM
