"""The Race tab: the speculative run and its baseline replayed side by side."""

from __future__ import annotations

from specviz.recording import Recording
from specviz.ui.guard.checks import mistake
from specviz.ui.guard.downloads import nonce
from specviz.ui.guard.limits import PACES
from specviz.views import race_html, slowdown_for


def start_race(rec: Recording | None, pace: str):
    """The race HTML for the current run, restarted."""
    if rec is None:
        raise mistake("Generate a run (or load a recording) first: the race replays it.", title="Nothing to race")
    spec, base = rec.speculative, rec.baseline
    slow = 1.0 if pace == PACES[1] else slowdown_for(spec, base)
    return race_html(spec, base, slow, nonce())
