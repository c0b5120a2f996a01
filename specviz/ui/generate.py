"""The Generate button and the Stop button: a run streamed round by round, then its baseline."""

from __future__ import annotations

import gradio as gr

from specviz.gpu import on_zerogpu
from specviz.pair import free_memory
from specviz.recording import Recording
from specviz.ui import state
from specviz.ui.device import run_on_device
from specviz.ui.downloads import save_for_download
from specviz.ui.outputs import everything
from specviz.ui.pairs import ensure_pair
from specviz.ui.replay import streaming
from specviz.ui.request import RunRequest
from specviz.views import acceptance_figure, accepted_histogram_figure, position_figure, stats_html, sweep_figure, timeline_figure, tokens_html


def generate(pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat=True,
             custom_drafter="", custom_target="", drafter_kind="model", gamma_schedule="constant", repetition_penalty=1.0,
             progress=gr.Progress(), request: gr.Request = None):
    """Stream a speculative run round by round, then measure the autoregressive baseline.

    Yields dicts keyed by ``specviz.ui.outputs.RUN_OUTPUTS``; while streaming, the outputs that do
    not change are left out. A run stops at RUN_SECONDS_MAX; the Stop button cancels it between rounds.
    """
    req = RunRequest.checked(pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat, custom_drafter,
                             custom_target, drafter_kind, gamma_schedule, repetition_penalty)
    ensure_pair(req.pair_name, req.custom_drafter, req.custom_target, progress)
    session = state.session_of(request)
    state.following[session] = True
    try:
        for event in run_on_device(req):
            kind, spec = event[0], event[1]
            if kind == "round":
                status = f"Speculative decoding: round {len(spec.rounds)}, {len(spec.output_ids)} tokens (the baseline runs in turns beside it)…"
                yield dict(tokens=tokens_html(spec), stats=stats_html(spec), status=status, recording=Recording(spec, title=event[2]),
                           **streaming(spec, session))
            elif kind == "speculative_done":
                yield dict(tokens=tokens_html(spec), stats=stats_html(spec), acceptance_plot=acceptance_figure(spec),
                           timeline_plot=timeline_figure(spec), status="Finishing…", recording=Recording(spec, title=event[2]),
                           **streaming(spec, session), histogram_plot=accepted_histogram_figure(spec), position_plot=position_figure(spec),
                           sweep_plot=sweep_figure(None))
            else:  # "done"
                _, spec, baseline, title, done = event
                rec = Recording(spec, baseline, title=title, prompt=req.prompt, chat=req.chat)
                final = everything(rec, done, save_for_download(rec))
                if not state.following.get(session, True):  # the visitor is reading an earlier round: leave it in view
                    n = len(spec.rounds)
                    final["replay_slider"] = gr.Slider(maximum=max(n, 2), interactive=n > 1)
                    del final["replay"]
                yield final
    finally:
        state.following.pop(session, None)
        # A long-lived server gives each run's memory back: collect, then trim (measured: a trim
        # without the collection leaves RSS creeping up, 526 -> 542 MB over 30 runs).
        free_memory(None if not on_zerogpu() else "cpu")


def stopped(rec: Recording | None) -> dict:
    """After the Stop button: every output shows the rounds done (stats, charts, replay from round 1);
    the speedup needs the baseline, which a stopped run does not finish."""
    if rec is None or not rec.speculative.rounds:
        return dict(status="Stopped before the first round.")
    spec = rec.speculative
    status = (f"Stopped by you after {len(spec.output_ids)} tokens in {len(spec.rounds)} rounds: the stats, charts and replay "
              "show those rounds; the speedup needs a finished baseline, so it is left out.")
    return everything(Recording(spec, None, rec.sweep, rec.title, rec.prompt, rec.chat), status, None)
