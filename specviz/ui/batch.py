"""The Batch tab: up to BATCH_MAX prompts decoded together, and throughput against batch size."""

from __future__ import annotations

import gradio as gr

from specviz.measure.throughput import batch_sizes_up_to
from specviz.serving.gpu import on_zerogpu
from specviz.pair import free_memory
from specviz.ui import state
from specviz.ui.checks import check_batch_prompts
from specviz.ui.device import batch_on_device
from specviz.ui.pairs import ensure_pair
from specviz.ui.request import RunRequest
from specviz.views.batch import batch_figure, batch_lanes_html


def run_batch(pair_name, prompts_text, batch_size, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat=True,
              custom_drafter="", custom_target="", drafter_kind="model", gamma_schedule="constant", repetition_penalty=1.0,
              progress=gr.Progress(), request: gr.Request = None):
    """Decode up to 8 prompts together (one per line; rows beyond the prompts repeat them), then
    measure throughput at the smaller batch sizes.

    Yields dicts keyed "batch_view" (lanes HTML), "batch_plot" (throughput against batch size) and
    "batch_status" (Markdown) as measurements come. The Stop button ends it after the batch under way.
    """
    prompts = check_batch_prompts(prompts_text, batch_size)
    reqs = [RunRequest.checked(pair_name, p, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat, custom_drafter,
                               custom_target, drafter_kind, gamma_schedule, repetition_penalty) for p in prompts]
    req = reqs[0]
    size = int(batch_size)
    sizes = batch_sizes_up_to(size)
    doing = (f"Decoding {size} row{'s' * (size > 1)} together, then measuring batch sizes {', '.join(map(str, sizes))} "
             "(speculative and autoregressive in turns)…")
    ensure_pair(req.pair_name, req.custom_drafter, req.custom_target, progress, doing)
    yield dict(batch_status=doing)  # what runs, at once
    session = state.session_of(request)
    try:
        with state.job(session):
            for main, points in batch_on_device(req, prompts, size):
                done = sum(len(p.speculative) for p in points)
                if state.client_gone(request):
                    return  # nobody listens: stop after the run under way, the device goes to the next visitor
                if state.should_stop(session):
                    yield dict(batch_status=f"Stopped by you after measuring {done} of {2 * len(sizes)} batches.")
                    return
                status = (f"Measured {done} of {2 * len(sizes)} batches (batch sizes {', '.join(map(str, sizes))}, two runs each, "
                          "speculative and autoregressive in turns)…")
                main_point = next((p for p in points if p.batch_size == size), None)
                shown = dict(batch_view=batch_lanes_html(main, main_point), batch_plot=batch_figure(points))
                yield shown | dict(batch_status=status)
        yield shown | dict(batch_status=f"Done: batch sizes {', '.join(map(str, sizes))}, each measured twice.")
    finally:
        free_memory(None if not on_zerogpu() else "cpu")
