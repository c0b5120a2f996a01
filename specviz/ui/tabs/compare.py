"""The Compare drafters tab: one prompt decoded with each drafter kind, each beside its own baseline."""

from __future__ import annotations

import time

import gradio as gr

from specviz.serving.gpu import on_zerogpu
from specviz.pair import free_memory
from specviz.pair.catalogue import model_kind
from specviz.ui.page import state
from specviz.ui.running.device import compare_on_device
from specviz.ui.running.halting import GONE, Halt
from specviz.ui.guard.limits import COMPARE_SECONDS_MAX
from specviz.drafters import usable_kinds
from specviz.ui.running.pairs import ensure_pair
from specviz.ui.running.sizing import compare_steps, sized
from specviz.ui.guard.request import RunRequest
from specviz.views.compare import compare_figure, compare_html

# What the page says while the first kind runs (its column comes only when it and its baseline are done).
RUNNING = ("Comparing drafters: the drafter model first, then prompt lookup, early exit and the quantized target, "
           "each beside its own autoregressive baseline…")


def run_compare(
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
    gamma_schedule="constant",
    repetition_penalty=1.0,
    tree="chain",
    progress=gr.Progress(),
    request: gr.Request = None,
):
    """Decode the prompt with each drafter kind (same seed and settings); stream the columns as each finishes.

    Yields dicts keyed "compare_view" (HTML) and "compare_plot" (acceptance by draft position). With a token tree
    chosen in the controls, the drafter model's tree runs too, in a column beside the chains. On a CPU each run decodes
    the tokens that fit COMPARE_SECONDS_MAX (``specviz.ui.running.sizing``), and the first words say so. The Stop
    button, a client that hung up and COMPARE_SECONDS_MAX end it within the round under way
    (``specviz.ui.running.halting``), and so does its share of the device once another visitor's job runs or waits
    (``specviz.ui.running.share``: it starts only when no other visitor's run is on the device); then the kind it
    stopped says how far it got and why, the kinds after it that they were not run (nothing more is sent to a client
    that is gone).
    """
    # Every kind runs; the drafter model's (for a token tree) drafts as the pair's entry says: "cross-tokenizer"
    # for a drafter with a tokenizer of its own.
    custom = any(isinstance(x, str) and x.strip() for x in (custom_drafter, custom_target))
    own = "model" if custom else model_kind(pair_name)
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
        own,
        gamma_schedule,
        repetition_penalty,
        tree,
    )
    pair = ensure_pair(
        req.pair_name, req.custom_drafter, req.custom_target, progress, RUNNING, owner=state.device_owner(request)
    )
    kinds = len(usable_kinds(pair.target, pair.own_tokenizer)) + (req.tree != "chain") if pair is not None else 1
    asked = req.max_new_tokens
    req, note = sized(req, pair, compare_steps(kinds), COMPARE_SECONDS_MAX)  # on a CPU: the tokens that fit its cap
    yield dict(compare_view=f'<div class="sv-compare" style="color:#666;">{RUNNING}{note}</div>')  # what runs, at once
    halt = Halt(request, COMPARE_SECONDS_MAX)
    started = time.monotonic()
    tree_on = req.tree != "chain"
    comparison = None
    try:
        # its turn and share of the device (specviz.ui.running.share)
        with state.job(halt.session), halt.device_turn() as turn:
            for shown in (
                compare_on_device(req, halt.for_device(), device_owner=state.device_owner(request))
                if turn.started
                else ()
            ):
                if shown is None:  # a step of a run: nothing new to show (the device half asks the stop check)
                    continue
                comparison = shown
                if halt():  # asked here too: on ZeroGPU the worker sees only the deadline
                    break
                yield dict(
                    compare_view=compare_html(
                        comparison, tree=tree_on, asked=asked, elapsed_s=time.monotonic() - started
                    ),
                    compare_plot=compare_figure(comparison),
                )
        if halt.reason is None or halt.reason == GONE:
            return  # finished (the last columns are shown), or nobody listens
        if comparison is None or not comparison.runs:
            yield dict(
                compare_view=f'<div class="sv-compare" style="color:#a33;">Compare drafters stopped {halt.said()} '
                'before its '
                "first run had a round.</div>",
                compare_plot=compare_figure(None),
            )
            return
        yield dict(
            compare_view=compare_html(comparison, tree=tree_on, stopped=halt.said(), asked=asked),
            compare_plot=compare_figure(comparison),
        )
    finally:
        free_memory(None if not on_zerogpu() else "cpu")
