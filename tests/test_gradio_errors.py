"""Gradio's own error paths, as an attacker drove them against the running app: each is answered with a
short message naming the field (never a visitor's value unescaped), costs the log at most a line a call
within the per-address budgets, and logs no traceback.

- A queue join naming an unknown ``fn_index`` (999, -1): 404 naming the field (was 500, two tracebacks,
  99 log lines a call); a POST naming an unknown API (/call, /call/v2, /run) and an event stream of nothing
  pending: 404 (were 500 and 78 lines; 85 lines and a cut connection).
- A menu's value outside its choices (the token tree on Generate): 400 naming the menu and its choices (was
  a 25-line traceback and Gradio's "Value: <the value, unescaped> is not in the list of choices").
- A file input naming a file nobody uploaded (a path on the server, a URL the server would fetch, a plain
  string, a file gone): 400 naming the recording file and why (was "error: null" and 20 to 40 lines).
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
FILE = {"meta": {"_type": "gradio.FileData"}}


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
    from specviz.ui import checks, server

    monkeypatch.setattr(server, "MALFORMED_LOGS", server.LogBudget())
    monkeypatch.setattr(checks, "REFUSAL_LOGS", server.LogBudget())
    counter = LogCount()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("uvicorn.error"), logging.getLogger("specviz")]
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
    from specviz.ui.limits import LOG_CLIENT_MAX_LINES

    assert not any(r.exc_info for r in counter.records), [counter.format(r)[:300] for r in counter.records if r.exc_info]
    assert "Traceback" not in err and not any("Traceback" in counter.format(r) for r in counter.records), err[-2000:]
    assert counter.lines() + len(err.splitlines()) <= min(calls, 2 * LOG_CLIENT_MAX_LINES), \
        ([counter.format(r) for r in counter.records], err[-2000:])


def join(http: httpx.Client, url: str, fn_index, data: list | None = None) -> httpx.Response:
    body = {"data": data or [], "fn_index": fn_index, "session_hash": uuid.uuid4().hex, "event_data": None, "trigger_id": None}
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
        for route in ("call/nosuch", "call/v2/nosuch", "run/nosuch", f"call/{INJECT}"):
            r = http.post(f"{url}/gradio_api/{route}", json={"data": []})
            calls += 1
            assert r.status_code == 404 and "Unknown endpoint" in r.json()["detail"] and "<" not in r.text, r.text[:300]
        # The same connection still serves a job of the app, its event stream included.
        r = http.post(f"{url}/gradio_api/call/stop", json={"data": []})
        assert r.status_code == 200, r.text[:300]
        text = http.get(f"{url}/gradio_api/call/stop/{r.json()['event_id']}", timeout=120).text
        assert "event: complete" in text, text[-300:]
    lines = [r for r in counter.records if "unknown endpoint" in r.getMessage() or "nothing pending" in r.getMessage()]
    assert 1 <= len(lines), [counter.format(r) for r in counter.records]
    quiet(counter, err(), calls)


def test_a_menu_value_outside_its_choices_is_refused_naming_the_menu(app, watched):
    counter, err = watched
    url = app[1]
    with httpx.Client(timeout=30) as http:
        for tree in (INJECT, "tree 9-9-9", 3, ["chain"], {"a": 1}):
            for route in ("call", "join"):
                data = GENERATE[:-1] + [tree]
                r = (http.post(f"{url}/gradio_api/call/generate", json={"data": data}) if route == "call"
                     else join(http, url, fn_index(url, "generate"), data))
                assert r.status_code == 400, (tree, r.text[:300])
                detail = r.json()["detail"]
                assert "token tree must be one of:" in detail and "chain" in detail and "auto: fastest" in detail, detail
                assert "<" not in detail and "9-9-9" not in detail, detail
    quiet(counter, err(), 10)


def test_a_file_nobody_uploaded_is_refused_naming_the_recording_file(app, watched, tmp_path):
    from gradio.utils import get_upload_folder

    counter, err = watched
    url = app[1]
    outside = tmp_path / "x.json"
    outside.write_text("{}")
    values = [FILE | {"path": os.path.join(str(tmp_path), "gone.json")},
              FILE | {"path": os.path.join(get_upload_folder(), "gone", "x.json")},
              FILE | {"path": "http://127.0.0.1:9/x.json"}, {"path": "/etc/hostname"}, "/etc/hostname", FILE | {"path": INJECT}]
    with httpx.Client(timeout=30) as http:
        for value in values:
            r = http.post(f"{url}/gradio_api/call/load_recording", json={"data": [value]})
            assert r.status_code == 400, (value, r.text[:300])
            detail = r.json()["detail"]
            assert detail.startswith("Load a recording (.json): the file must be one uploaded to this page first"), detail
            assert "hostname" not in detail and "<" not in detail and str(tmp_path) not in detail, detail
        # A file uploaded here reaches the handler, which names what is wrong with it.
        uploaded = http.post(f"{url}/gradio_api/upload", files={"files": ("a.json", b"{}", "application/json")}).json()[0]
        r = http.post(f"{url}/gradio_api/call/load_recording", json={"data": [FILE | {"path": uploaded}]})
        assert r.status_code == 200, r.text[:300]
        text = http.get(f"{url}/gradio_api/call/load_recording/{r.json()['event_id']}", timeout=120).text
        assert "event: error" in text and "not a specviz recording" in text, text[-300:]
    quiet(counter, err(), len(values) + 1)


def test_a_recording_file_gone_is_named_without_its_path(tmp_path):
    import gradio as gr

    from specviz.ui.files import load_recording

    with pytest.raises(gr.Error) as refused:
        load_recording(str(tmp_path / "gone.json"))
    assert "recording file" in refused.value.message and str(tmp_path) not in refused.value.message, refused.value.message


def test_an_upload_refused_part_way_leaves_the_connection_usable(app, watched, monkeypatch):
    from specviz.ui import server

    counter, err = watched
    url = app[1]
    monkeypatch.setattr(server, "UPLOADS", server.UploadBudget(per_client=2**20, total=64 * 2**20, window_s=30))
    with httpx.Client(timeout=60) as http:
        r = http.post(f"{url}/gradio_api/upload", files=[("files", (f"f{i}.json", b"{}", "application/json")) for i in range(10)])
        assert r.status_code == 429 and "files per upload" in r.json()["detail"], r.text[:300]
        assert http.get(f"{url}/config").status_code == 200  # the same connection: was closed after the refusal
        for _ in range(2):  # past the address's budget part way through a large body: the client reads the 429
            r = http.post(f"{url}/gradio_api/upload", files={"files": ("big.json", b"x" * (6 * 2**20), "application/json")})
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
    for version, why in ((999, "newer than this specviz reads"), (SCHEMA_VERSION + 1, "newer than this specviz reads"),
                         (0, "whole number"), (INJECT, "whole number"), (True, "whole number"), (2.5, "whole number")):
        d = json.loads(json.dumps(good))
        (d if where == "top" else d[where])["schema_version"] = version
        with pytest.raises(ValueError) as refused:
            Recording.from_json(json.dumps(d))
        message = str(refused.value)
        assert f"{field}: " in message and why in message and f"1 to {SCHEMA_VERSION}" in message, message
        assert "schema version" in message and "<" not in message and "999" not in message, message


def test_the_upload_budget_says_seconds_under_a_minute_and_rounds_up():
    from specviz.ui.server import UploadBudget, span

    assert UploadBudget(per_client=48 * 2**20, total=2**30, window_s=30).take("a", 49 * 2**20) == \
        "at most 48 MB of uploads per visitor in 30 seconds"
    assert UploadBudget(per_client=2**19, total=2**30, window_s=90).take("a", 2**20) == \
        "at most 0.5 MB of uploads per visitor in 2 minutes"
    assert UploadBudget(per_client=2**30, total=2**20, window_s=300).take("a", 2**21) == \
        "the server takes at most 1 MB of uploads in 5 minutes"
    assert [span(s) for s in (0.2, 1, 59.5, 60, 61, 600)] == ["1 second", "1 second", "1 minute", "1 minute", "2 minutes", "10 minutes"]
