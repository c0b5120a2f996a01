"""Text from a trace or a recording, made safe for the page: never markup."""

from __future__ import annotations

import re
from html import escape

_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")


def markdown_literal(text: str) -> str:
    """``text`` for a Markdown component, shown as typed: HTML escaped and Markdown's punctuation
    backslash-escaped, so a recording's title cannot add a tag, a link or an image."""
    return _MARKDOWN.sub(r"\\\1", escape(text, quote=True)).replace("\n", " ")
