"""Notebook display: a Trace or a Recording shows itself as the coloured tokens and the stats table.

Registered from the views' side for the trace (``_repr_html_``, which Jupyter looks up on the object), so the trace
knows nothing of the views; the first use of specviz's public names registers it, and gives
``specviz.recording.Recording`` ``recording_html`` (the recording sits above the views, which do not import it, and
imports no views).
"""

from __future__ import annotations

from html import escape

from specviz.trace import Trace
from specviz.views.stats import stats_html
from specviz.views.tokens import legend_html, tokens_html


def trace_html(trace: Trace) -> str:
    """The coloured tokens, with the legend and the stats table for a speculative trace."""
    if trace.mode != "speculative":
        return tokens_html(trace)
    return legend_html() + tokens_html(trace) + stats_html(trace)


def recording_html(rec) -> str:
    """A ``specviz.recording.Recording``'s title, the coloured tokens and the stats against the baseline."""
    title = f"<p><b>{escape(rec.title)}</b></p>" if rec.title else ""
    return title + legend_html() + tokens_html(rec.speculative) + stats_html(rec.speculative, rec.baseline)


def register() -> None:
    """Give Trace its notebook view (idempotent)."""
    Trace._repr_html_ = trace_html


register()
