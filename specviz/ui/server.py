"""Server settings: the Content-Security-Policy middleware and the arguments ``demo.launch`` takes."""

from __future__ import annotations

import os

import gradio as gr

from specviz.recording import MAX_BYTES
from specviz.ui.css import CSS
from specviz.ui.limits import MAX_SESSIONS

# Content-Security-Policy on every response: the page may load and connect only to its own
# origin (and data: or blob: URLs), so markup that slipped into a page could not fetch an outside
# image, script or font, nor send data anywhere. Gradio's front end needs inline scripts and
# styles and plotly.js needs eval, so those stay allowed; frames may embed the app (a Space does).
CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self' ws: wss:; media-src 'self' blob: data:; "
       "object-src 'none'; base-uri 'self'; form-action 'self'")


class ContentSecurityPolicy:
    """ASGI middleware adding the CSP header to every HTTP response."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_csp(message):
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [(b"content-security-policy", CSP.encode())]
            await send(message)

        return await self.app(scope, receive, with_csp)


def launch_kwargs(port: int | None = None) -> dict:
    """Arguments for ``demo.launch``: local only, no share link, the app's theme, a Content-Security-Policy."""
    from starlette.middleware import Middleware

    return dict(
        app_kwargs={"middleware": [Middleware(ContentSecurityPolicy)]},
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=port or int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        theme=gr.themes.Soft(),
        css=CSS,
        show_error=False,
        max_file_size=MAX_BYTES,  # uploads are recordings; Gradio refuses larger files itself
        # Gradio keeps each session's state (its Recording: about 1.2 MB of objects for the largest
        # recording the engine writes) and its last outputs (the rendered HTML) until the session
        # expires (SESSION_TTL_S); past this many sessions the oldest are dropped, so memory is
        # bounded by design (measured: about 5 MB of RSS per session holding a 0.8 MB recording).
        state_session_capacity=int(os.environ.get("SPECVIZ_MAX_SESSIONS", str(MAX_SESSIONS))),
    )
