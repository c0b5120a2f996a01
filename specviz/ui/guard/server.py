"""Server settings: the middleware (security headers, a cap on request bodies, malformed uploads
answered 400 in one bounded log line, integers too long to parse made readable, a POST naming an API the
app lacks answered 404 before Gradio's routes fail on it) and the arguments ``demo.launch`` takes.

Every refusal here costs the log at most one short line, within a per-address ``LogBudget``
(``note_request``), and no traceback; an upload refused part way leaves its connection usable."""

from __future__ import annotations

import json
import os
import re
import sys

import anyio
import gradio as gr
from starlette.requests import ClientDisconnect

from specviz.recording import MAX_BYTES
from specviz.ui.running.listening import StreamWatch
from specviz.ui.guard.sessions import KeepSessions
from specviz.ui.page.css import CSS, HEAD
from specviz.ui.guard.disk import UPLOADS_IN_FLIGHT
from specviz.ui.guard.limits import (
    whole_number,
    BODY_MAX_BYTES,
    MAX_SESSIONS,
)

from specviz.ui.guard.budgets import UPLOADS, LogBudget, note_malformed, note_request

# Content-Security-Policy on every response: the page may load and connect only to its own
# origin (and data: or blob: URLs), so markup that slipped into a page could not fetch an outside
# image, script or font, nor send data anywhere (connect-src 'self' covers the app's own
# event stream). Gradio's front end needs 'unsafe-inline' for scripts (its page starts with
# inline scripts that set up its config; without it the page stays blank) and styles, and
# plotly.js needs 'unsafe-eval'; frames may embed the app (a Space does).
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; media-src 'self' blob: data:; "
    "object-src 'none'; base-uri 'self'; form-action 'self'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
UPLOAD_PATH = "/gradio_api/upload"  # file uploads: bounded by Gradio's max_file_size instead
DEEP_LINK_PATH = "/gradio_api/deep_link"  # refused: the page offers no deep links
UPLOAD_FILES_MAX = 4  # files in one upload request (the page sends one recording)


HEARTBEAT_PATH = "/gradio_api/heartbeat/"


def _per_minute(name: str, default: int) -> int:
    """A per-address, per-minute limit (``specviz.ui.guard.limits.whole_number``, at least 1)."""
    return whole_number(name, default, 1)


def _heartbeats_per_minute() -> int:
    return _per_minute("SPECVIZ_HEARTBEATS_PER_MINUTE", 120)


# Heartbeat connections one address opens a minute (a page opens one, and again after a network break): past it they
# are answered 429 before Gradio makes or ends a session for them.
HEARTBEATS = LogBudget(per_client=_heartbeats_per_minute(), total=10**9, window_s=60)
# Jobs one address sends into the queue a minute (a click on the page is one; /gradio_api/call/<api> is one): a flood of
# joins refused by the queue still cost the server a request parsed and a session looked up each, and slowed a victim's
# run past 2x on 2 cores; refused here, before Gradio reads the body, they cost next to nothing.
JOINS = LogBudget(per_client=_per_minute("SPECVIZ_JOINS_PER_MINUTE", 240), total=10**9, window_s=60)
JOIN_PATH = "/gradio_api/queue/join"
CALL_PATH = "/gradio_api/call/"


def _budget_for(path: str, method: str) -> tuple[LogBudget, str] | None:
    """The per-address budget a request to ``path`` draws on, with the refusal's text, or None."""
    if HEARTBEAT_PATH in path:
        return HEARTBEATS, (
            f"Too many heartbeat connections from your address: at most {HEARTBEATS.per_client} a minute. "
            "Reload the page in a minute."
        )
    if method == "POST" and (path.rstrip("/").endswith(JOIN_PATH) or CALL_PATH in path):
        return JOINS, (
            f"Too many jobs sent from your address: at most {JOINS.per_client} a minute. Try again in a minute."
        )
    return None


MALFORMED = (
    "Upload refused: the body is not a well-formed multipart/form-data upload (every part must carry a file name)."
)


# An integer in a JSON body with more digits than Python parses (sys.get_int_max_str_digits(): 4,300 by default)
# fails the whole body, and the client got the framework's bare "There was an error parsing the body" naming no
# field. Such an integer is read as this stand-in of its sign instead: beyond every bound the app takes (the widest,
# a seed, has 19 digits), so the field's own check refuses it, naming the field and its range.
LONG_INTEGER_STANDIN = 10**100


def _digits_limit(max_digits: int | None) -> int:
    """``max_digits``, or Python's limit (0, none, before 3.10.7)."""
    return getattr(sys, "get_int_max_str_digits", lambda: 0)() if max_digits is None else max_digits


def has_long_digits(body: bytes, max_digits: int | None = None) -> bool:
    """Whether ``body`` holds a run of more than ``max_digits`` digits (None: Python's limit; 0: no limit),
    in one linear scan (a run is tried from its first digit only)."""
    limit = _digits_limit(max_digits)
    return bool(limit) and re.search(rb"(?<![0-9])[0-9]{%d}" % (limit + 1), body) is not None


def readable_numbers(body: bytes, max_digits: int | None = None) -> bytes:
    """A JSON body with every integer longer than ``max_digits`` digits (None: Python's limit,
    ``sys.get_int_max_str_digits``) written as +-LONG_INTEGER_STANDIN; any other body as it is (a body
    that is not JSON, too, for the framework to refuse)."""
    limit = _digits_limit(max_digits)
    if not has_long_digits(body, limit):  # the common case: one scan, no parse
        return body
    stood_in = False

    def integer(text: str) -> int:
        nonlocal stood_in
        if len(text.lstrip("-")) <= limit:
            return int(text)
        stood_in = True
        return -LONG_INTEGER_STANDIN if text.startswith("-") else LONG_INTEGER_STANDIN

    try:
        value = json.loads(body, parse_int=integer)
    except ValueError:  # not JSON (or not UTF-8): the framework refuses it as before
        return body
    return json.dumps(value).encode() if stood_in else body


# What Gradio's multipart parser raises on a body it cannot read (a part without a file name:
# AttributeError with an upload_id, TypeError without); anything else keeps its traceback.
PARSE_ERRORS = (AttributeError, TypeError, ValueError, LookupError)


# Gradio's routes that name an endpoint in their path (POST; matched against the whole path after the app's root path):
# /call/<api> and /run/<api> raised FnIndexInferError for a name the app lacks, /call/v2/<api> a KeyError, each answered
# 500 with a 78-line traceback in the log. /run/<api> and /api/<api> take the event the body's fn_index names before
# the name: the page posts every event that skips the queue to /run/predict with its fn_index, so those two are judged
# only once the body is read. The event streams (GET) stay Gradio's: the page opens its own stream before its job is
# seen in the queue, so a stream cannot be judged "of nothing pending" here without refusing the page's own.
API_ROUTE = re.compile(r"/gradio_api/(call/v2|call|run|api)/([^/]+)/?")
UNKNOWN_API = "Unknown endpoint: this app has no API of that name (GET /gradio_api/info lists its endpoints)."


def _app_path(scope) -> str:
    """The request's path after the app's root path."""
    path, root = scope.get("path", ""), (scope.get("root_path") or "").rstrip("/")
    return path[len(root) :] if root and path.startswith(root + "/") else path


def api_route(scope) -> tuple[str, str] | None:
    """(route, api name) of a POST to one of Gradio's routes that name an endpoint (``API_ROUTE``: "call", "call/v2",
    "run" or "api"), or None."""
    found = API_ROUTE.fullmatch(_app_path(scope)) if scope.get("method") == "POST" else None
    return found.groups() if found is not None else None


def unknown_api(blocks, scope, body: bytes | None = None) -> bool:
    """Whether a POST names an endpoint ``blocks`` (the demo) lacks, as Gradio's route would look it up: for /call/<api>
    any event's api_name (``route_utils.get_fn``); for /call/v2/<api> one its API info lists (not a private one); for
    /run/<api> and /api/<api> the event the JSON ``body``'s fn_index names (in the session the body names, where it is
    kept), or, with no fn_index, any event's api_name. False where this cannot tell, leaving the request to Gradio: no
    demo, a /run or /api POST whose body is not given (None) or not a JSON object, an fn_index that is not an
    integer."""
    found = api_route(scope)
    if found is None or blocks is None:
        return False
    route, name = found
    fns = blocks.fns
    if route in ("run", "api"):
        try:
            sent = json.loads(body) if body is not None else None
        except ValueError:
            return False
        if not isinstance(sent, dict):
            return False
        index, session = sent.get("fn_index"), sent.get("session_hash")
        if isinstance(session, str):
            kept = getattr(getattr(blocks, "state_holder", None), "session_data", {}).get(session)
            fns = getattr(getattr(kept, "blocks_config", None), "fns", None) or fns
        if index is not None:
            return index not in fns if isinstance(index, int) and not isinstance(index, bool) else False
    named = [fn for fn in fns.values() if fn.api_name]
    if route == "call/v2":
        named = [fn for fn in named if fn.fn is not None and getattr(fn, "api_visibility", "public") != "private"]
    return name not in {fn.api_name for fn in named}


async def _refuse_unknown_api(scope, send) -> None:
    """Answer a POST naming an endpoint the app lacks (``unknown_api``): 404, one log line (``note_request``)."""
    from starlette.requests import Request

    from specviz.ui.guard.address import client_address

    note_request(client_address(Request(scope)), "unknown endpoint refused (404): api name")
    await _refused(send, 404, UNKNOWN_API)


def _blocks(scope):
    """The demo the app serves (Gradio's ``App.get_blocks``), or None."""
    get = getattr(scope.get("app"), "get_blocks", None)
    try:
        return get() if get is not None else None
    except Exception:  # noqa: BLE001 - no demo yet: Gradio's routes answer
        return None


class Guard:
    """ASGI middleware: the security headers on every HTTP response, a cap on request bodies, the
    upload budget and file count, and no deep-link route.

    A body longer than BODY_MAX_BYTES (declared, or counted as it arrives) is answered with 413
    before the app reads it, except on the upload route, where Gradio's ``max_file_size`` applies
    to one file and ``UPLOADS`` to a visitor's and everyone's bytes (429 past either). An upload
    Gradio's multipart parser fails on (a part without a file name raises AttributeError or
    TypeError inside Gradio, which the server would log as a full traceback) is answered 400 and
    logged in one line within ``MALFORMED_LOGS``; one refused part way (429) or cut off by its client
    ends there, with no traceback and the connection left usable. A JSON body is read whole (within the
    cap) and passed on through ``readable_numbers``. A POST naming an API the app lacks (``unknown_api``;
    /run and /api once their JSON body is read, since its fn_index names the event first) is answered 404
    with one log line within ``MALFORMED_LOGS``, before Gradio's routes fail on it; event streams (GET) are
    left to Gradio."""

    def __init__(self, app, body_max: int = BODY_MAX_BYTES):
        self.app, self.body_max = app, body_max

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        # the page offers no deep links: Gradio's route writes a file per call
        if path.rstrip("/").endswith(DEEP_LINK_PATH):
            return await _refused(send, 404, "Not found.")
        budget = _budget_for(path, scope.get("method", ""))
        if budget is not None:
            from starlette.requests import Request

            from specviz.ui.guard.address import client_address

            if budget[0].take(client_address(Request(scope))) is None:
                return await _refused(send, 429, budget[1])
        route = api_route(scope)
        # the path decides
        if route is not None and route[0] in ("call", "call/v2") and unknown_api(_blocks(scope), scope):
            return await _refuse_unknown_api(scope, send)
        capped = not path.endswith(UPLOAD_PATH)
        if capped:
            declared = dict(scope.get("headers") or []).get(b"content-length")
            if declared is not None and (not declared.isdigit() or int(declared) > self.body_max):
                return await _too_large(send, self.body_max)

        refused = False

        async def with_headers(message):
            if refused:  # a 413 went out already: the app's own answer is dropped
                return
            if message["type"] == "http.response.start":
                message["headers"] = [
                    h for h in message.get("headers", []) if h[0].lower() not in {k for k, _ in HEADERS}
                ] + HEADERS
            await send(message)

        if not capped:
            return await self._upload(scope, receive, send, with_headers)
        if _read_as_json(scope):
            return await self._json(scope, receive, with_headers)
        seen = 0

        async def counted():
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.body_max:  # answer 413 now; the app reads a disconnect and stops
                    refused = True
                    await _too_large(send, self.body_max)
                    return {"type": "http.disconnect"}
            return message

        try:
            return await self.app(scope, counted, with_headers)
        except ClientDisconnect:  # refused (413 sent) or the client left: nothing more to answer, no traceback to log
            return

    async def _json(self, scope, receive, send):
        """A JSON body: read whole (answered 413 past the cap as it arrives), then handed to the app
        through ``readable_numbers``, with its content-length corrected where that changed it; a /run or
        /api POST whose body names no event of the app (``unknown_api``) is answered 404 instead."""
        parts, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before its body ended: the app sees that
                return await self.app(scope, _replay(message, receive), send)
            parts.append(message.get("body", b""))
            seen += len(parts[-1])
            if seen > self.body_max:
                return await _too_large(send, self.body_max)
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        # The parse, when a long run of digits asks for one, off the event loop: it calls back for every integer.
        readable = await anyio.to_thread.run_sync(readable_numbers, body) if has_long_digits(body) else body
        route = api_route(scope)
        if route is not None and route[0] in ("run", "api") and unknown_api(_blocks(scope), scope, readable):
            return await _refuse_unknown_api(scope, send)
        if readable is not body:
            headers = [(k, v) for k, v in scope.get("headers") or [] if k.lower() != b"content-length"]
            scope = dict(scope, headers=headers + [(b"content-length", str(len(readable)).encode())])
        return await self.app(
            scope, _replay({"type": "http.request", "body": readable, "more_body": False}, receive), send
        )

    async def _upload(self, scope, receive, send, with_headers):
        """The upload route: the budget (``UPLOADS``) and at most UPLOAD_FILES_MAX files per request,
        counted as the bytes arrive; the uploads in flight counted for ``specviz.ui.guard.disk``'s sweep."""
        from starlette.requests import Request

        from specviz.ui.guard.address import client_address

        address = client_address(Request(scope))
        marker = b"--" + _boundary(scope)
        tail, delimiters, refused = b"", 0, False

        async def budgeted():
            nonlocal refused, tail, delimiters
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                body = message.get("body", b"")
                over = UPLOADS.take(address, len(body))
                if marker != b"--":  # delimiters seen so far: one per file and one to close
                    delimiters += (tail + body).count(marker)
                    tail = (tail + body)[-(len(marker) - 1) :]
                    if delimiters > UPLOAD_FILES_MAX + 1:
                        over = f"at most {UPLOAD_FILES_MAX} files per upload"
                if over:
                    refused = True
                    await _refused(send, 429, f"Upload refused: {over}.")
                    return {"type": "http.disconnect"}
            return message

        started = False

        async def answered(message):
            nonlocal started
            if not refused:
                started = started or message["type"] == "http.response.start"
                await with_headers(message)

        UPLOADS_IN_FLIGHT.begin()
        try:
            return await self.app(scope, budgeted, answered)
        except ClientDisconnect:
            # Refused part way (the 429 went out and the parser then read a disconnect), or the client left. Returning
            # is the whole answer: uvicorn reads and drops the rest of the body and keeps the connection for the next
            # request; the exception let through made it log a 20-line traceback and close the connection, so the
            # next request on it failed and a client still sending a large body saw "Server disconnected", not the 429.
            return
        except PARSE_ERRORS as exc:  # Gradio's parser on a malformed body: a 400, not a traceback
            if not (refused or started):
                await _refused(send, 400, MALFORMED)
            if not refused:
                note_malformed(address, exc)
        finally:
            await anyio.to_thread.run_sync(UPLOADS_IN_FLIGHT.end)


def _replay(first: dict, receive):
    """A receive that gives ``first``, then what ``receive`` gives (a disconnect, for the app to see)."""
    pending = [first]

    async def replayed():
        return pending.pop() if pending else await receive()

    return replayed


def _read_as_json(scope) -> bool:
    """Whether the framework reads this request's body as JSON: a body-carrying method with no content-type,
    or application/json or application/*+json."""
    if scope.get("method") not in ("POST", "PUT", "PATCH", "DELETE"):
        return False
    kind = dict(scope.get("headers") or []).get(b"content-type", b"").split(b";")[0].strip().lower()
    return not kind or kind == b"application/json" or (kind.startswith(b"application/") and kind.endswith(b"+json"))


def _boundary(scope) -> bytes:
    """The multipart boundary a request's content-type names (b"" if none)."""
    content_type = dict(scope.get("headers") or []).get(b"content-type", b"")
    for part in content_type.split(b";"):
        key, _, value = part.strip().partition(b"=")
        if key.lower() == b"boundary":
            return value.strip(b'"')
    return b""


async def _too_large(send, limit: int) -> None:
    await _refused(send, 413, f"Request body too large: at most {limit // 1024} kB.")


async def _refused(send, status: int, text: str) -> None:
    """Answer ``status`` with ``{"detail": text}``, as the framework's own refusals: the page shows a refusal's
    ``detail`` (a body it cannot parse as JSON it reports as a broken connection)."""
    body = json.dumps({"detail": text}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())] + HEADERS,
        }
    )
    await send({"type": "http.response.body", "body": body})


# The GIL's switch interval while serving: a thread doing Python work beside the device thread (an export rendering
# its HTML, a pair's load on the load thread) holds the GIL for this long before the device thread, which lets it go
# at every torch operation, may take it back. A 16-token Generate on the embedded pair (0.43 s alone) beside one
# visitor's exports, 2-core CPU: 6.0 s at Python's 5 ms, 3.6 s at 0.5 ms, 2.1 s at 0.05 ms
# (python -m specviz.visitors.attack --floods exports --victim-tokens 16). A thread alone never switches.
GIL_SWITCH_S = 0.05e-3


def launch_kwargs(port: int | None = None) -> dict:
    """Arguments for ``demo.launch``: local only, no share link, the app's theme, a Content-Security-Policy.

    Also turns off uvicorn's reading of X-Forwarded-For (``FORWARDED_ALLOW_IPS``, which trusts 127.0.0.1
    by default and rewrites the client's address before any middleware runs): the app reads the header
    itself, as deep as ``SPECVIZ_TRUSTED_PROXIES`` says (``specviz.ui.guard.address.client_address``)."""
    from starlette.middleware import Middleware

    os.environ["FORWARDED_ALLOW_IPS"] = ""  # read by uvicorn.Config when launch builds the server
    sys.setswitchinterval(GIL_SWITCH_S)

    return dict(
        # StreamWatch: specviz.ui.running.listening; KeepSessions: specviz.ui.guard.sessions
        app_kwargs={"middleware": [Middleware(Guard), Middleware(StreamWatch), Middleware(KeepSessions)]},
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=port or int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        theme=gr.themes.Soft(),
        css=CSS,
        head=HEAD,
        show_error=False,
        max_file_size=MAX_BYTES,  # uploads are recordings; Gradio refuses larger files itself
        # Gradio keeps each session's state (its Recording: about 1.2 MB of objects for the largest
        # recording the engine writes) and its last outputs (the rendered HTML) until the session
        # expires (SESSION_TTL_S); past this many sessions a newcomer takes the place of an idle session
        # that shows no run, or is answered without being kept (specviz.ui.guard.sessions), so memory is
        # bounded by design (measured: about 5 MB of RSS per session holding a 0.8 MB recording).
        state_session_capacity=int(os.environ.get("SPECVIZ_MAX_SESSIONS", str(MAX_SESSIONS))),
    )
