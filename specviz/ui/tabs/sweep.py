"""The Theory tab's gamma sweep: the prompt decoded at gamma 1..8 and each point plotted against the theory."""

from __future__ import annotations

import gradio as gr

from specviz.measure.sweep import Sweep
from specviz.recording import Recording
from specviz.ui.page import state
from specviz.ui.running.device import sweep_on_device
from specviz.ui.guard.downloads import save_for_download
from specviz.ui.running.halting import BY_YOU, GONE, SHARED, Halt, shared_said
from specviz.ui.guard.limits import SWEEP_GAMMAS, SWEEP_SECONDS_MAX
from specviz.ui.running.pairs import ensure_pair
from specviz.ui.running.sizing import sized, sweep_steps
from specviz.ui.guard.request import RunRequest
from specviz.views import sweep_figure
from specviz.views.theory import sweep_label


def cut_short(points: list, max_new_tokens: int, by_you: bool, shared: bool = False) -> str:
    """Why a sweep ended before its last gamma, which gammas were left, and (at the time limit) that
    fewer tokens would finish it, with a guess: the sweep's time grows about in proportion to the
    tokens, so the share of the gammas measured is the share of the tokens that fits."""
    done = {p.gamma for p in points}
    left = [g for g in SWEEP_GAMMAS if g not in done]
    after = f"after gamma {points[-1].gamma}" if points else "before any gamma finished"
    missing = f"gamma {', '.join(map(str, left))} {'was' if len(left) == 1 else 'were'} not measured."
    if by_you:
        return f"by you {after}: {missing}"
    if shared:
        return f"{shared_said()} {after}: {missing}"
    fits = max(1, max_new_tokens * len(done) // len(SWEEP_GAMMAS))
    guess = (
        f" At {max_new_tokens} tokens {len(done)} of {len(SWEEP_GAMMAS)} gammas fit, so about {fits} should fit all of "
        "them."
        if done
        else ""
    )
    return (
        f"at its time limit of {SWEEP_SECONDS_MAX:.0f} s {after}: {missing} Fewer max new tokens would finish it "
        f"(each gamma decodes them twice, speculative and autoregressive).{guess}"
    )


def run_sweep(
    pair_name,
    prompt,
    temperature,
    top_k,
    top_p,
    max_new_tokens,
    seed,
    rec: Recording | None,
    chat=True,
    custom_drafter="",
    custom_target="",
    repetition_penalty=1.0,
    drafter_kind="model",
    gamma_schedule="constant",
    progress=gr.Progress(),
    request: gr.Request = None,
):
    """Decode the prompt with gamma = 1..8 (same seed, sampling, drafter kind and gamma schedule; a
    schedule starts each run at its gamma) and plot each against the theory.

    Yields dicts keyed "sweep_plot", "sweep_status", and at the end "recording" (the shown run with the
    sweep attached), "download" (that recording's JSON, so the download holds the sweep as README says)
    and "export_file" (emptied: an HTML export made before the sweep would lack it). With no run shown,
    the sweep is plotted but saved nowhere. The Stop button, a client that hung up and SWEEP_SECONDS_MAX
    end it within the round under way (``specviz.ui.running.halting``), without the gamma under way, and so does its
    share of the device once another visitor's job runs or waits (``specviz.ui.running.share``: it starts only when no
    other visitor's run is on the device).
    """
    req = RunRequest.checked(
        pair_name,
        prompt,
        SWEEP_GAMMAS[-1],
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
    )
    label = sweep_label(Sweep(0.0, 0.0, drafter=req.drafter_kind, schedule=req.gamma_schedule))
    doing = (
        f"Sweep ({label}): measuring the autoregressive baseline, then gamma {SWEEP_GAMMAS[0]}..{SWEEP_GAMMAS[-1]}, "
        "each in turns with a baseline of its own…"
    )
    pair = ensure_pair(
        req.pair_name, req.custom_drafter, req.custom_target, progress, doing, owner=state.device_owner(request)
    )
    # on a CPU: the tokens that fit its cap
    req, note = sized(req, pair, sweep_steps(len(SWEEP_GAMMAS)), SWEEP_SECONDS_MAX)
    yield dict(sweep_status=doing + note)  # what runs, at once (the first point comes after a whole baseline)
    halt = Halt(request, SWEEP_SECONDS_MAX)
    session = halt.session
    sweep = None
    with state.job(session), halt.device_turn() as turn:  # its turn and share of the device (specviz.ui.running.share)
        measured = (
            sweep_on_device(req, halt.for_device(), device_owner=state.device_owner(request)) if turn.started else ()
        )
        for sweep in filter(None, measured):  # None: a step of a run (a device step each)
            if halt():  # asked here too: on ZeroGPU the worker sees only the deadline
                break
            done = len(sweep.points)
            sweep.drafter = sweep.drafter or req.drafter_kind  # labelled from the first yield on
            yield dict(
                sweep_plot=sweep_figure(sweep),
                sweep_status=f"Sweep ({sweep_label(sweep)}): "
                             f"{'baseline measured' if not done else f'gamma {sweep.points[-1].gamma} done'} "
                f"({done} of {len(SWEEP_GAMMAS)})…",
            )
    if halt.reason == GONE:
        return  # nobody listens: the device went to the next visitor within a round
    points = sweep.points if sweep is not None else []
    why = cut_short(points, req.max_new_tokens, halt.reason == BY_YOU, halt.reason == SHARED)
    if not points:
        yield dict(sweep_plot=sweep_figure(sweep), sweep_status=f"Sweep stopped {why}")
        return
    best = max(points, key=lambda p: sweep.speedup(p) or 0.0)
    fastest = (
        f"fastest measured gamma {best.gamma} (whole-run tok/s ratio {sweep.speedup(best):.2f}×, prefill included)"
    )
    if len(points) == len(SWEEP_GAMMAS):
        status = f"Sweep done ({sweep_label(sweep)}): {fastest}."
    else:
        status = f"Sweep ({sweep_label(sweep)}) stopped {why} Of those measured: {fastest}."
    out = dict(sweep_plot=sweep_figure(sweep), sweep_status=status)
    if rec is not None:
        out["recording"] = Recording(
            rec.speculative, rec.baseline, sweep, rec.title, rec.prompt, rec.chat, rec.auto, rec.made_by
        )
        out["download"] = gr.DownloadButton(value=save_for_download(out["recording"], session), interactive=True)
        out["export_file"] = None
    yield out
