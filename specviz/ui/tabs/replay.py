"""The Replay tab: step through a run's rounds; while a run streams, follow its newest round
unless the visitor stepped back."""

from __future__ import annotations

import gradio as gr

from specviz.recording import Recording
from specviz.trace import Trace
from specviz.ui.page import state
from specviz.ui.page.outputs import replay_slider
from specviz.views import round_html


def replay_step(rec: Recording | None, current, delta: int, request: gr.Request | None = None):
    """Move the replay by ``delta`` rounds; returns the slider, the round panel and the round's tree figure."""
    from specviz.ui.tabs.tree import replay_tree

    if rec is None or not rec.speculative.rounds:
        return gr.skip(), round_html(Trace(mode="speculative", prompt_ids=[]), 0), replay_tree(None, 1)
    n = len(rec.speculative.rounds)
    index = min(max(int(current or 1) + delta, 1), n)
    session = state.session_of(request)
    if session in state.following:
        state.following[session] = index == n
    return replay_slider(rec.speculative, index), round_html(rec.speculative, index - 1), replay_tree(rec, index)


def replay_previous(rec: Recording | None, current, request: gr.Request):
    return replay_step(rec, current, -1, request)


def replay_next(rec: Recording | None, current, request: gr.Request):
    return replay_step(rec, current, +1, request)


def replay_show(rec: Recording | None, current, request: gr.Request):
    """The round panel and its tree figure for the slider's value."""
    return replay_step(rec, current, 0, request)[1:]


def streaming(spec: Trace, session: str | None) -> dict:
    """Slider and panel while streaming: the newest round, or only a longer slider if the visitor stepped back."""
    if state.following.get(session, True):
        from specviz.recording import Recording
        from specviz.ui.tabs.tree import replay_tree

        out = dict(replay_slider=replay_slider(spec), replay=round_html(spec, len(spec.rounds) - 1))
        if spec.rounds[-1].tree is not None or len(spec.rounds) == 1:
            # A chain run's tree figure is the same empty one every round: drawn at the first (it clears
            # the last run's tree), left as it is after.
            out["replay_tree"] = replay_tree(Recording(spec), len(spec.rounds))
        return out
    n = len(spec.rounds)
    return dict(replay_slider=gr.Slider(maximum=max(n, 2), interactive=n > 1))
