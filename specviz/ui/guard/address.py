"""The visitor's address, as the queue's admission, the device share and the server's budgets tell visitors apart.

``client_address`` is the TCP peer's address. Behind a proxy (a Space) every request comes from the
proxy: set ``SPECVIZ_TRUSTED_PROXIES`` to the number of proxies in front of the app that each append
the address they saw to ``X-Forwarded-For`` (1 on a Hugging Face Space), and the visitor's address is
read from that header, counting that many entries from its right end over every line of the header
joined in order (RFC 9110 section 5.3: repeated lines are one comma-separated list; entries to the left
of them are the client's own words, never trusted). Unset or 0, the header is ignored, from loopback
too: ``specviz.ui.guard.server.launch_kwargs`` turns off uvicorn's own reading of it (which trusts 127.0.0.1 by
default and rewrites the peer before any middleware sees it).
"""

from __future__ import annotations

import os

TRUSTED_PROXIES = int(os.environ.get("SPECVIZ_TRUSTED_PROXIES", "0") or 0)


def client_address(request, trusted_proxies: int | None = None) -> str:
    """The visitor's address of a fastapi or Gradio request (see the module docstring); "" when unknown."""
    hops = TRUSTED_PROXIES if trusted_proxies is None else trusted_proxies
    if request is None:
        return ""
    if hops > 0:
        headers = getattr(request, "headers", None) or {}
        getlist = getattr(headers, "getlist", None)  # starlette's Headers: every line; a plain dict holds one
        lines = getlist("x-forwarded-for") if callable(getlist) else [headers.get("x-forwarded-for") or ""]
        forwarded = [a.strip() for line in lines for a in line.split(",") if a.strip()]
        if len(forwarded) >= hops:
            return forwarded[-hops]
    client = getattr(request, "client", None)
    return getattr(client, "host", "") or ""
