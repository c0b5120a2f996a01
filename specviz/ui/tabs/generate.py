"""The Generate button and the Stop button: a run streamed round by round, then its baseline."""

from __future__ import annotations

import time

import gradio as gr

from specviz.serving.device_thread import Owner
from specviz.serving.gpu import on_zerogpu
from specviz.pair import free_memory
from specviz.recording import Recording, made_by_here
from specviz.ui.running import share
from specviz.ui.page import state
from specviz.ui.running.device import run_on_device
from specviz.ui.guard.downloads import save_for_download
from specviz.ui.guard.limits import STOP_WAIT_S
from specviz.ui.page.outputs import cleared_run, everything, tree_section_cleared
from specviz.ui.running.pairs import ensure_pair
from specviz.ui.tabs.replay import streaming
from specviz.ui.guard.request import RunRequest
from specviz.views.verdict import headline_html
from specviz.views import (
    stats_html,
    tokens_html,
)


def generate(
    pair_name,
    prompt,
    gamma,
    temperature,
    top_k,
    top_p,
    max_new_tokens,
    seed,
    chat=True,
    custom_drafter="",
    custom_target="",
    drafter_kind="model",
    gamma_schedule="constant",
    repetition_penalty=1.0,
    tree="chain",
    progress=gr.Progress(),
    request: gr.Request = None,
):
    """Stream a speculative run round by round, then measure the autoregressive baseline.

    Yields dicts keyed by ``specviz.ui.page.outputs.RUN_OUTPUTS``; while streaming, the outputs that do
    not change are left out. A run stops at RUN_SECONDS_MAX; the Stop button stops it between rounds
    (``stop``), and its last outputs say so; so does a run that has held the device its share while
    another visitor waits, or that gives way to a much shorter job of another visitor (``specviz.ui.running.share``).
    """
    session = state.session_of(request)
    owner = state.device_owner(request)
    state.following[session] = True
    run = _started(session)
    try:
        with state.job(session):  # from the start, so a Stop pressed while the pair loads is seen
            req = RunRequest.checked(
                pair_name,
                prompt,
                gamma,
                temperature,
                top_k,
                top_p,
                max_new_tokens,
                seed,
                chat,
                custom_drafter,
                custom_target,
                drafter_kind,
                gamma_schedule,
                repetition_penalty,
                tree,
            )
            if state.client_gone(request):
                return  # it waited in the queue with nobody reading: the engine never starts
            ensure_pair(
                req.pair_name,
                req.custom_drafter,
                req.custom_target,
                progress,
                "Speculative decoding: the first round…",
                owner=owner,
            )
            if state.should_stop(session):
                yield _kept(session, run, stopped_outputs(None))
                return
            with share.Held(request, share.job_size(req, owner)) as held:
                # Asked inside the auto tree's calibration, every round (on ZeroGPU the worker cannot read the page's
                # state).
                check = (
                    None
                    if on_zerogpu()
                    else lambda: state.client_gone(request) or state.should_stop(session) or held.over()
                )
                event = None
                for event in filter(None, run_on_device(req, check, device_owner=owner)):  # None: a step's end
                    if event[0] != "done":
                        if (halted := _halted(event, request, session, held, run)) is not None:
                            yield from halted
                            return
                    yield from _shown(event, req, session, owner)
                if event is None or event[0] != "done":  # the calibration was stopped: nothing ran
                    yield from _halted(event, request, session, held, run) or [
                        dict(status="Stopped before the first round.")
                    ]
    finally:
        state.following.pop(session, None)
        if _runs.get(session) is run:
            del _runs[session]
        # A long-lived server gives each run's memory back: collect, then trim (measured: a trim
        # without the collection leaves RSS creeping up, 526 -> 542 MB over 30 runs).
        free_memory(None if not on_zerogpu() else "cpu")


# The Stop button's hand-over (``state.stopped``) belongs to one run: a Stop that gave up waiting (STOP_WAIT_S) cancels
# its run, whose step under way may still leave its outputs there after it. Untagged, the next Stop in the session
# picked them up over a newer run: the previous run's counts under a finished run, and its "…" before them.
_runs: dict[str | None, object] = {}  # the session's current Generate run
_stopped_by: dict[str | None, object] = {}  # the run whose outputs state.stopped holds for the session


def _started(session: str | None) -> object:
    """A new run of ``session``: its token, and no outputs an earlier run left for the Stop button."""
    run = object()
    _runs[session] = run
    state.stopped.pop(session, None)
    _stopped_by.pop(session, None)
    return run


def _kept(session: str | None, run: object, outputs: dict) -> dict:
    """``outputs`` handed to the Stop button as ``run``'s (``stop`` takes them only while that run is the one it
    stopped)."""
    state.stopped[session] = outputs
    _stopped_by[session] = run
    return outputs


def _taken(session: str | None, asked_of: object | None) -> dict:
    """The stopped outputs for ``stop``: those of the run it was asked to stop, else none (left by an older run)."""
    outputs, by = state.stopped.pop(session, {}), _stopped_by.pop(session, None)
    return outputs if asked_of is not None and by is asked_of else {}


CALIBRATING_HEADLINE = (
    '<div class="sv-headline sv-headline-empty" style="font-size:16px;color:#555;padding:6px 0;">'
    "Speedup: the auto tree is measuring this pair first; this run and the target alone come next…</div>"
)


def _halted(
    event: tuple | None, request, session: str | None, held: share.Held, run: object = None
) -> list[dict] | None:
    """What to show when the job must end before ``event`` (the last one ``run_on_device`` sent, None: none):
    [] when nobody listens, the rounds done when Stop was pressed or the job has had its device share; None
    when it goes on."""
    rec = Recording(event[1], title=event[2]) if event is not None and event[1] is not None else None
    if state.client_gone(request):
        return []  # nobody listens: stop within a round, the device goes to the next visitor
    if state.should_stop(session):
        # The Stop button: end here, between rounds, and show the rounds done (a finished run shows as done).
        return [_kept(session, run, stopped_outputs(rec))]
    if held.over():
        return [stopped_outputs(rec, held.note())]
    return None


def _shown(event: tuple, req: RunRequest, session: str | None, owner: Owner):
    """The outputs one event of ``run_on_device`` changes (a dict keyed by RUN_OUTPUTS); the last status says how
    long the run waited for the device behind other visitors' jobs, when it did (``owner``)."""
    kind, spec = event[0], event[1]
    if kind == "calibrating":
        # The previous run's verdict, export, text, numbers and tree tables are not this run's: cleared while the
        # calibration measures (a calibration stopped or given way leaves no run, and they stayed under its status).
        yield dict(status=event[2], headline=CALIBRATING_HEADLINE, export_file=None, **cleared_run())
    elif kind == "calibration":
        if event[2]:  # the calibration's progress; a step without news changes nothing
            yield dict(status=event[2])
    elif kind == "round":
        status = (f"Speculative decoding: round {len(spec.rounds)}, {len(spec.output_ids)} tokens (the baseline runs "
                  "in turns beside it)…")
        out = dict(
            tokens=tokens_html(spec),
            stats=stats_html(spec, pending=True),
            status=status,
            recording=Recording(spec, title=event[2]),
            **streaming(spec, session),
        )
        if len(spec.rounds) == 1:
            out["export_file"] = None  # the previous run's HTML export is not this run's
            out["headline"] = headline_html(spec, None, pending=True)  # nor its speedup
            out.update(tree_section_cleared())  # nor its tree tables ("This run" read the last run's counts)
        yield out
    elif kind == "speculative_done":
        # The text and counts now; the figures come with "done" a few steps later (the baseline runs in turns beside
        # it, so it is a round's tokens behind at most): drawn here too, they cost each run 65 ms of Python.
        yield dict(
            tokens=tokens_html(spec),
            stats=stats_html(spec, pending=True),
            status="Finishing…",
            recording=Recording(spec, title=event[2]),
            **streaming(spec, session),
            headline=headline_html(spec, None, pending=True),
        )
    else:  # "done"
        _, spec, baseline, title, done, auto = event
        if waited := owner.waited():
            done += f" It {waited}."
        rec = Recording(
            spec,
            baseline,
            title=title,
            prompt=req.prompt,
            chat=req.chat,
            auto=auto,
            made_by=made_by_here(str(spec.settings.get("device", "cpu"))),
        )
        final = everything(rec, done, save_for_download(rec, session))
        if not state.following.get(session, True):  # the visitor is reading an earlier round: leave it in view
            n = len(spec.rounds)
            final["replay_slider"] = gr.Slider(maximum=max(n, 2), interactive=n > 1)
            del final["replay"], final["replay_tree"]
        yield final


def stopped_outputs(rec: Recording | None, why: str | None = None) -> dict:
    """What a run stopped by the Stop button (or giving the device up, ``why``) shows: the rounds done
    (stats, charts, replay from round 1) and a status saying it was stopped; the speedup needs the
    baseline, which it did not finish."""
    if rec is None or not rec.speculative.rounds:
        return dict(status=why or "Stopped by you before the first round.")
    spec = rec.speculative
    done = f"{len(spec.output_ids)} tokens in {len(spec.rounds)} rounds"
    head = f"{why} It had {done}" if why else f"Stopped by you after {done}"
    status = (f"{head}: the stats, charts and replay show those rounds; the speedup needs a finished baseline, so it "
              "is left out.")
    return everything(
        Recording(spec, None, rec.sweep, rec.title, rec.prompt, rec.chat, rec.auto, rec.made_by), status, None
    )


def stop(request: gr.Request = None) -> dict:
    """The Stop button: ask this session's jobs (run, sweep, comparison, batch, lab experiment) to stop at their next
    step, wait until they have (at most STOP_WAIT_S), and return the outputs the run ended with. With nothing streaming,
    only
    the status changes (a run still waiting in the queue is then cancelled by the event after this)."""
    session = state.session_of(request)
    if session not in state.running:
        return dict(
            status="Nothing to stop: no run was in progress (one still waiting in the queue is taken out of it)."
        )
    asked_of = _runs.get(session)
    state.stop_asked.add(session)
    deadline = time.monotonic() + STOP_WAIT_S
    while session in state.running and time.monotonic() < deadline:
        time.sleep(0.05)
    return _taken(session, asked_of)


def failed() -> dict:
    """After Generate ended in an error: the status says so, instead of Gradio's "Error" over the last message."""
    return dict(
        status="Nothing more was generated: the request was refused or failed (its message is in the corner). "
        "What the page shows is from before the error."
    )
