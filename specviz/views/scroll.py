"""A box that scrolls sideways and shows that it does.

A wide table on a narrow screen scrolls inside its box instead of widening the page; on a
phone nothing says so, and the columns past the edge look absent. The box's background draws
a shadow at each edge that still hides content (the classic ``background-attachment: local``
cover): a white cover scrolls with the content and hides the shadow where the content ends,
so a shadow shows exactly where there is more to scroll to. Inline styles only, so the hint
works in the page, in an exported file and in a notebook alike.
"""

from __future__ import annotations

_SHADOWS = (
    "background:"
    "linear-gradient(to right,#fff 30%,rgba(255,255,255,0)) left center/40px 100% no-repeat local,"
    "linear-gradient(to left,#fff 30%,rgba(255,255,255,0)) right center/40px 100% no-repeat local,"
    "radial-gradient(farthest-side at 0 50%,rgba(0,0,0,0.28),rgba(0,0,0,0)) left center/14px 100% no-repeat scroll,"
    "radial-gradient(farthest-side at 100% 50%,rgba(0,0,0,0.28),rgba(0,0,0,0)) right center/14px 100% no-repeat scroll,"
    "#fff;"
)


def scroll_x(inner: str, style: str = "", cls: str = "sv-scroll") -> str:
    """``inner`` (HTML) in a box that scrolls sideways, with a shadow at each edge beyond which
    more content lies. ``style`` adds inline CSS to the box (a border, a height limit)."""
    return (f'<div class="{cls}" style="overflow-x:auto;-webkit-overflow-scrolling:touch;{_SHADOWS}{style}">'
            f"{inner}</div>")
