"""Per-session state kept by the server beside Gradio's ``gr.State`` (which holds the Recording).

While a run streams, its session is in ``following``: True while the replay follows the newest
round; a visitor who steps back stops the following, stepping forward to the newest round resumes it.
"""

from __future__ import annotations

import gradio as gr

following: dict[str, bool] = {}


def session_of(request: gr.Request | None) -> str | None:
    """The session's key (Gradio's session hash), or None outside a page session (a plain API call)."""
    return getattr(request, "session_hash", None)
