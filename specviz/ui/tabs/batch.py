"""The Batch tab: up to BATCH_MAX prompts decoded together, and throughput against batch size."""

from __future__ import annotations

import time

import gradio as gr

from specviz.measure.throughput import batch_sizes_up_to
from specviz.serving.gpu import on_zerogpu
from specviz.pair import free_memory
from specviz.ui.page import state
from specviz.ui.guard.checks import check_batch_prompts
from specviz.ui.running.device import batch_on_device
from specviz.ui.running.halting import GONE, Halt
from specviz.ui.guard.limits import BATCH_SECONDS_MAX
from specviz.ui.running.pairs import ensure_pair
from specviz.ui.running.sizing import batch_steps, sized
from specviz.ui.guard.request import RunRequest
from specviz.views.batch import batch_figure, batch_lanes_html
from specviz.views.text import measured_so_far


def _form(main) -> str:
    """The form the batch ran in, as the note above the lanes asks the visitor to compare (" Form: bfloat16 on
    cpu.")."""
    settings = main.traces[0].settings if main is not None and main.traces else {}
    return f" Form: {settings['dtype']} on {settings.get('device', 'this device')}." if settings.get("dtype") else ""


def run_batch(
    pair_name,
    prompts_text,
    batch_size,
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
    progress=gr.Progress(),
    request: gr.Request = None,
):
    """Decode up to 8 prompts together (one per line; rows beyond the prompts repeat them), then
    measure throughput at the smaller batch sizes.

    Yields dicts keyed "batch_view" (lanes HTML), "batch_plot" (throughput against batch size) and "batch_status"
    (Markdown) as measurements come. On a CPU each row decodes the tokens that fit BATCH_SECONDS_MAX
    (``specviz.ui.running.sizing``), and the first status says so. The Stop button, a client that hung up and
    BATCH_SECONDS_MAX end it within the round under way (``specviz.ui.running.halting``), and so does its share of the
    device once another visitor's job runs or waits (``specviz.ui.running.share``: it starts only when no other
    visitor's run is on the device); then the status says what stopped it and how many batches were measured, and a full
    batch stopped while under way shows each row as far as it got (nothing more is sent to a client that is gone).
    """
    prompts = check_batch_prompts(prompts_text, batch_size)
    reqs = [
        RunRequest.checked(
            pair_name,
            p,
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
        )
        for p in prompts
    ]
    req = reqs[0]
    size = int(batch_size)
    sizes = batch_sizes_up_to(size)
    listed = ", ".join(map(str, sizes))
    doing = (
        f"Decoding {size} row{'s' * (size > 1)} together, then measuring batch sizes {listed} "
        "(speculative and autoregressive in turns)…"
    )
    pair = ensure_pair(
        req.pair_name, req.custom_drafter, req.custom_target, progress, doing, owner=state.device_owner(request)
    )
    req, note = sized(req, pair, batch_steps(size), BATCH_SECONDS_MAX)  # on a CPU: the tokens per row that fit its cap
    yield dict(batch_status=doing + note)  # what runs, at once
    halt = Halt(request, BATCH_SECONDS_MAX)
    main, points = None, []
    started = time.monotonic()
    try:
        # its turn and share of the device (specviz.ui.running.share)
        with state.job(halt.session), halt.device_turn() as turn:
            measured = (
                batch_on_device(req, prompts, size, halt.for_device(), device_owner=state.device_owner(request))
                if turn.started
                else ()
            )
            for main, points in filter(None, measured):  # None: a round's end (a device step each)
                if halt():  # asked here too: on ZeroGPU the worker sees only the deadline
                    break
                status = _progress(_measured(points), 2 * len(sizes), listed, time.monotonic() - started)
                yield _shown(main, points, size, halt) | dict(batch_status=status)
        if halt.reason == GONE:
            return  # nobody listens
        if halt.reason is None:
            yield _shown(main, points, size, halt) | dict(
                batch_status=f"Done: batch sizes {listed}, each measured twice.{_form(main)}"
            )
            return
        status = f"Stopped {halt.said()} after measuring {_measured(points)} of {2 * len(sizes)} batches."
        if main is not None and main.stopped:
            status += (
                f" The batch of {size} rows was stopped after {len(main.rounds)} rounds: each row shows the tokens "
                "it had by then."
            )
        elif main is None:
            status += f" The batch of {size} rows did not finish a round before it: nothing to show."
        yield _shown(main, points, size, halt) | dict(batch_status=status)
    finally:
        free_memory(None if not on_zerogpu() else "cpu")


def _progress(measured: int, total: int, listed: str, elapsed_s: float) -> str:
    """ "Measured k of K batches (...) in T s; about R s left at that pace…" (``specviz.views.text.measured_so_far``;
    the first, the full batch decoded, is timed in T too)."""
    return (
        measured_so_far(
            measured,
            total,
            f"batches (batch sizes {listed}, two runs each, speculative and autoregressive in turns)",
            elapsed_s,
        )
        + "…"
    )


def _measured(points) -> int:
    """Batches measured: pairs of runs (speculative and autoregressive) finished, over the batch sizes."""
    return sum(len(p.speculative) for p in points)


def _shown(main, points, size: int, halt: Halt) -> dict:
    main_point = next((p for p in points if p.batch_size == size), None)
    why = f"stopped {halt.said()}" if halt.reason else "stopped"
    return dict(batch_view=batch_lanes_html(main, main_point, stopped=why), batch_plot=batch_figure(points))
