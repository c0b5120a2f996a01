"""Gradio's own error paths, as an attacker drove them against the running app: each is answered with a
short message naming the field (never a visitor's value unescaped), costs the log at most a line a call
within the per-address budgets, and logs no traceback.

- A queue join naming an unknown ``fn_index`` (999, -1): 404 naming the field (was 500, two tracebacks,
  99 log lines a call); a join naming none stays Gradio's own 400. A POST naming an unknown API (/call,
  /call/v2, /run, /api; for /run and /api, by the body's fn_index where it names one, as the page's own
  /run/predict does): 404 (was 500 and 78 lines).
- A menu's value outside its choices (the token tree on Generate): 400 naming the menu and its choices (was
  a 25-line traceback and Gradio's "Value: <the value, unescaped> is not in the list of choices").
- An upload refused part way (too many files, the per-address budget): the client reads the 429 and the
  next request on its connection is answered (was a 20-line traceback and a closed connection).
- A recording of a newer schema version is refused naming the field and the versions read; the upload
  budget's message says seconds under a minute.

Against the app launched in this process (the ``app`` fixture of tests/conftest.py), from loopback.
"""

from __future__ import annotations

import json
import logging
import os
import uuid

import httpx
import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

INJECT = '<img src=x onerror="alert(3)">'
GENERATE = ["embedded", "def f(x):", 4, 0.0, 0, 1.0, 8, 0, True, "", "", "model", "constant", 1.0, "chain"]


class LogCount(logging.Handler):
    """Every record the watched loggers pass on, with its formatted text (a traceback included)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))

    def emit(self, record):
        if not any(r is record for r in self.records):  # a record reaches the root and its own logger's handlers both
            self.records.append(record)

    def lines(self) -> int:
        return sum(self.format(r).count("\n") + 1 for r in self.records)


@pytest.fixture
def watched(capfd, monkeypatch):
    """(log records counter, read stderr): the app's logger at INFO (its refusals show), uvicorn's and the root
    logger watched; the per-address log budgets fresh for the test."""
    from specviz.ui.guard import budgets, checks

    monkeypatch.setattr(budgets, "MALFORMED_LOGS", budgets.LogBudget())
    monkeypatch.setattr(checks, "REFUSAL_LOGS", budgets.LogBudget())
    counter = LogCount()
    loggers = [
        logging.getLogger(),
        logging.getLogger("uvicorn"),
        logging.getLogger("uvicorn.error"),
        logging.getLogger("specviz"),
    ]
    app_log = logging.getLogger("specviz")
    level = app_log.level
    app_log.setLevel(logging.INFO)
    for logger in loggers:
        logger.addHandler(counter)
    capfd.readouterr()
    try:
        yield counter, lambda: capfd.readouterr().err
    finally:
        for logger in loggers:
            logger.removeHandler(counter)
        app_log.setLevel(level)


def quiet(counter: LogCount, err: str, calls: int) -> None:
    """No traceback anywhere, and at most one log line a call (the app's budget: at most LOG_CLIENT_MAX_LINES)."""
    from specviz.ui.guard.limits import LOG_CLIENT_MAX_LINES

    assert not any(r.exc_info for r in counter.records), [
        counter.format(r)[:300] for r in counter.records if r.exc_info
    ]
    assert "Traceback" not in err and not any("Traceback" in counter.format(r) for r in counter.records), err[-2000:]
    assert counter.lines() + len(err.splitlines()) <= min(calls, 2 * LOG_CLIENT_MAX_LINES), (
        [counter.format(r) for r in counter.records],
        err[-2000:],
    )


def join(http: httpx.Client, url: str, fn_index, data: list | None = None) -> httpx.Response:
    body = {
        "data": data or [],
        "fn_index": fn_index,
        "session_hash": uuid.uuid4().hex,
        "event_data": None,
        "trigger_id": None,
    }
    return http.post(f"{url}/gradio_api/queue/join", json=body)


def fn_index(url: str, api_name: str) -> int:
    deps = httpx.get(f"{url}/config", timeout=30).json()["dependencies"]
    return next(d["id"] for d in deps if d.get("api_name") == api_name)


def test_an_unknown_endpoint_is_a_404_naming_it_in_a_bounded_log(app, watched):
    counter, err = watched
    url = app[1]
    calls = 0
    with httpx.Client(timeout=30) as http:
        for index in (999, -1, 10**30) * 4:
            r = join(http, url, index)
            calls += 1
            assert r.status_code == 404, r.text[:300]
            detail = r.json()["detail"]
            assert "Unknown endpoint" in detail and "fn_index" in detail and len(detail) < 200, detail
        for route in ("call/nosuch", "call/v2/nosuch", "run/nosuch", "api/nosuch", f"call/{INJECT}"):
            r = http.post(f"{url}/gradio_api/{route}", json={"data": []})
            calls += 1
            assert r.status_code == 404 and "Unknown endpoint" in r.json()["detail"] and "<" not in r.text, r.text[:300]
        # /run/<api> takes the event the body's fn_index names before the name: one the app lacks is refused.
        r = http.post(
            f"{url}/gradio_api/run/predict", json={"data": [], "fn_index": 999, "session_hash": uuid.uuid4().hex}
        )
        calls += 1
        assert r.status_code == 404 and "Unknown endpoint" in r.json()["detail"], r.text[:300]
        # A join naming no fn_index, and a direct POST to an API the app has, stay Gradio's own answers.
        r = join(http, url, None)
        assert r.status_code == 400 and "No function index" in r.json()["detail"], r.text[:300]
        r = http.post(f"{url}/gradio_api/run/stop", json={"data": []})
        assert r.status_code != 500 and "Unknown endpoint" not in r.text, r.text[:300]
        # The page posts each event that skips the queue to /run/predict with its fn_index: answered by the app.
        deps = http.get(f"{url}/config").json()["dependencies"]
        # the upload's note
        note = next(d["id"] for d in deps if d.get("api_name") == "loading_note" and d.get("queue") is False)
        r = http.post(
            f"{url}/gradio_api/run/predict", json={"data": [], "fn_index": note, "session_hash": uuid.uuid4().hex}
        )
        assert r.status_code == 200 and r.json()["data"] == ["Loading the file…"], r.text[:300]
        # The same connection still serves a job of the app, its event stream included.
        r = http.post(f"{url}/gradio_api/call/stop", json={"data": []})
        assert r.status_code == 200, r.text[:300]
        text = http.get(f"{url}/gradio_api/call/stop/{r.json()['event_id']}", timeout=120).text
        assert "event: complete" in text, text[-300:]
    lines = [r for r in counter.records if "unknown endpoint" in r.getMessage()]
    assert 1 <= len(lines), [counter.format(r) for r in counter.records]
    quiet(counter, err(), calls)


def test_twenty_unknown_joins_cost_the_log_at_most_the_address_budget(app, watched):
    """20 joins naming an unknown fn_index from one address: one line each until the address's budget
    (LOG_CLIENT_MAX_LINES in LOG_WINDOW_S) is spent, then none; no traceback."""
    from specviz.ui.guard.limits import LOG_CLIENT_MAX_LINES

    counter, err = watched
    url = app[1]
    with httpx.Client(timeout=30) as http:
        for _ in range(20):
            assert join(http, url, 999).status_code == 404
    lines = [r for r in counter.records if "unknown endpoint refused (404): fn_index" in r.getMessage()]
    assert len(lines) == min(20, LOG_CLIENT_MAX_LINES), [counter.format(r) for r in counter.records]
    quiet(counter, err(), 20)


def test_a_menu_value_outside_its_choices_is_refused_naming_the_menu(app, watched):
    counter, err = watched
    url = app[1]
    with httpx.Client(timeout=30) as http:
        for tree in (INJECT, "tree 9-9-9", 3, ["chain"], {"a": 1}):
            for route in ("call", "join"):
                data = GENERATE[:-1] + [tree]
                r = (
                    http.post(f"{url}/gradio_api/call/generate", json={"data": data})
                    if route == "call"
                    else join(http, url, fn_index(url, "generate"), data)
                )
                assert r.status_code == 400, (tree, r.text[:300])
                detail = r.json()["detail"]
                assert "token tree must be one of:" in detail and "chain" in detail and "auto: fastest" in detail, (
                    detail
                )
                assert "<" not in detail and "9-9-9" not in detail, detail
    quiet(counter, err(), 10)


def test_the_menu_check_reads_a_session_s_own_choices_and_leaves_our_menus_alone():
    """``queue_refusal`` checks a plain menu as the job's session holds it (an event may have given it new
    choices, which Gradio's own check reads), skips the menus that check themselves, and passes None."""
    import gradio as gr

    from specviz.ui.guard.checks import CheckedDropdown, queue_refusal

    with gr.Blocks():
        plain = gr.Dropdown(["a", "b"], value="a", label="plain menu")
        ours = CheckedDropdown(["a", "b"], value="a", label="our menu")
        box = gr.Textbox()
    fn = type(
        "Fn", (), {"inputs": [plain, ours, box], "preprocess": True, "batch": False, "component_prop_inputs": []}
    )()
    assert queue_refusal(fn, ["a", "zzz", "zzz"]) is None
    assert queue_refusal(fn, [None, "a", ""]) is None
    title, message = queue_refusal(fn, ["c", "a", ""])
    assert title == "Bad plain menu" and message == "plain menu must be one of: a, b.", (title, message)

    class Session(dict):  # what Gradio's SessionState offers here: ``in`` and ``[]`` by block id
        pass

    updated = gr.Dropdown(["a", "b", "c"], label="plain menu", render=False)
    assert queue_refusal(fn, ["c", "a", ""], Session({plain._id: updated})) is None
    assert queue_refusal(fn, ["d", "a", ""], Session({plain._id: updated}))[1] == "plain menu must be one of: a, b, c."


def test_an_upload_refused_part_way_leaves_the_connection_usable(app, watched, monkeypatch):
    from specviz.ui.guard import budgets, server

    counter, err = watched
    url = app[1]
    monkeypatch.setattr(server, "UPLOADS", budgets.UploadBudget(per_client=2**20, total=64 * 2**20, window_s=30))
    with httpx.Client(timeout=60) as http:
        r = http.post(
            f"{url}/gradio_api/upload", files=[("files", (f"f{i}.json", b"{}", "application/json")) for i in range(10)]
        )
        assert r.status_code == 429 and "files per upload" in r.json()["detail"], r.text[:300]
        assert http.get(f"{url}/config").status_code == 200  # the same connection: was closed after the refusal
        for _ in range(2):  # past the address's budget part way through a large body: the client reads the 429
            r = http.post(
                f"{url}/gradio_api/upload", files={"files": ("big.json", b"x" * (6 * 2**20), "application/json")}
            )
            assert r.status_code == 429, r.text[:300]
            assert r.json()["detail"] == "Upload refused: at most 1 MB of uploads per visitor in 30 seconds."
            assert http.get(f"{url}/config").status_code == 200
    quiet(counter, err(), 6)


@pytest.mark.parametrize("where", ["top", "speculative", "baseline"])
def test_a_recording_of_a_newer_schema_version_is_refused_naming_the_field(where):
    from specviz.demo import RECORDINGS
    from specviz.recording import Recording
    from specviz.trace import SCHEMA_VERSION

    good = json.loads((RECORDINGS / "sampled-gamma8.json").read_text())
    Recording.from_json(json.dumps(good))
    field = "schema_version" if where == "top" else f"{where}.schema_version"
    for version, why in (
        (999, "newer than this specviz reads"),
        (SCHEMA_VERSION + 1, "newer than this specviz reads"),
        (0, "whole number"),
        (INJECT, "whole number"),
        (True, "whole number"),
        (2.5, "whole number"),
    ):
        d = json.loads(json.dumps(good))
        (d if where == "top" else d[where])["schema_version"] = version
        with pytest.raises(ValueError) as refused:
            Recording.from_json(json.dumps(d))
        message = str(refused.value)
        assert f"{field}: " in message and why in message and f"1 to {SCHEMA_VERSION}" in message, message
        assert "schema version" in message and "<" not in message and "999" not in message, message


def test_the_upload_budget_says_seconds_under_a_minute_and_rounds_up():
    from specviz.ui.guard.budgets import UploadBudget, megabytes, span

    assert (
        UploadBudget(per_client=48 * 2**20, total=2**30, window_s=30).take("a", 49 * 2**20)
        == "at most 48 MB of uploads per visitor in 30 seconds"
    )
    assert (
        UploadBudget(per_client=2**19, total=2**30, window_s=90).take("a", 2**20)
        == "at most 0.5 MB of uploads per visitor in 2 minutes"
    )
    assert (
        UploadBudget(per_client=2**30, total=2**20, window_s=300).take("a", 2**21)
        == "the server takes at most 1 MB of uploads in 5 minutes"
    )
    assert [span(s) for s in (0.2, 1, 59.5, 60, 61, 600)] == [
        "1 second",
        "1 second",
        "1 minute",
        "1 minute",
        "2 minutes",
        "10 minutes",
    ]
    assert [megabytes(n) for n in (1, 2**19, 2**20, 48 * 2**20)] == ["0.1", "0.5", "1", "48"]
