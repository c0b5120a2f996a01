"""The Exactness lab tab: seeded speculative samples of tiny models against the exact law, with a
teaching fault planted or none."""

from __future__ import annotations

from html import escape

import gradio as gr

from specviz import Sampling
from specviz.lab.experiment import stream as lab_stream
from specviz.lab.faults import FAULTS
from specviz.lab.models import KINDS as LAB_KINDS
from specviz.lab.models import models as lab_models
from specviz.pair.precision import cpu_form
from specviz.serving import device_thread
from specviz.ui.page import state
from specviz.ui.guard.checks import mistake, number
from specviz.ui.running.halting import GONE, Halt
from specviz.ui.guard.limits import LAB_CHUNK, LAB_DRAW_EVERY, LAB_RUNS_MAX, LAB_SECONDS_MAX
from specviz.views.lab import lab_figure, lab_html


def run_lab(kind, fault, temperature, top_k, top_p, gamma, runs, request: gr.Request = None):
    """The exactness lab: stream seeded speculative samples of tiny models against the exact law,
    with one teaching fault planted (or none); yields (figure, verdict HTML) every 250 samples.

    Before every sample's run it asks its stop check (``specviz.ui.running.halting``), as Generate does between rounds:
    the Stop button and LAB_SECONDS_MAX end it there and its last output says so with the samples it has; a
    client that is gone (``specviz.ui.page.state.client_gone``: its stream closed, or never opened) ends it
    sending nothing more."""
    if not isinstance(kind, str) or not isinstance(fault, str) or kind not in LAB_KINDS or fault not in FAULTS:
        raise mistake("Pick a drafter and a fault from the menus.", title="Unknown lab setting")
    for value, lo, hi, name in ((gamma, 1, 8, "gamma"), (top_k, 0, 8, "top-k"), (runs, 100, LAB_RUNS_MAX, "samples")):
        if not number(value) or value != int(value) or not lo <= value <= hi:
            raise mistake(f"{name} must be a whole number from {lo} to {hi}.", title=f"Bad {name}")
    if not number(temperature) or not 0.1 <= temperature <= 2 or not number(top_p) or not 0.1 <= top_p <= 1:
        raise mistake("temperature must be from 0.1 to 2 and top-p from 0.1 to 1.", title="Bad sampling settings")
    sampling = Sampling(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
    # The lab's tiny models run in the form a full-size pair runs in on this CPU (bf16 or fp32,
    # specviz.pair.precision), so its verdict is about that form's arithmetic.
    owner = state.device_owner(request)
    form = device_thread.run(cpu_form, owner=owner)
    drafter, target = device_thread.run(lab_models, kind, dtype=form.dtype, owner=owner)
    # The stop check (the Stop button, a client gone, LAB_SECONDS_MAX) is asked before every sample's run;
    # the chart is redrawn every LAB_DRAW_EVERY samples, and Gradio's cancel lands between chunks of LAB_CHUNK.
    # Each sample is one step on the device thread, in its turn with other visitors' steps (least used first):
    # a visitor's Generate beside a lab run waits for at most one sample (milliseconds) at a time, where a
    # chunk of 50 samples held it for seconds (a 16-token Generate took 25.8x its time alone).
    # The fault goes to these runs only (their steps, see lab.faults.fault_steps): nothing global changes.
    halt = Halt(request, LAB_SECONDS_MAX)
    planted_fault = FAULTS[fault]
    form_note = f"<p>Models in {escape(form.name)} ({escape(form.reason)}); probabilities in float32.</p>"
    result, said = None, False
    with state.job(halt.session):  # the Stop button finds the lab as it finds a run
        for result in device_thread.stepped(lab_stream(drafter, target, sampling, int(gamma), int(runs), every=1,
                                                       fault=fault, stop=halt), owner=owner):
            if halt.reason == GONE:
                return  # nobody listens: nothing more is sent
            if result.runs % LAB_DRAW_EVERY == 0 or result.runs == int(runs) or halt.reason:
                said = halt.reason is not None
                yield lab_figure(result), lab_html(result, planted_fault) + _stopped(halt, result.runs) + form_note
            elif result.runs % LAB_CHUNK == 0:
                yield gr.skip(), gr.skip()
    if halt.reason in (None, GONE) or said:
        return
    if result is None:  # stopped before its first sample
        yield lab_figure(None), f"<p>The experiment stopped {escape(halt.said())} before its first sample.</p>"
        return
    yield lab_figure(result), lab_html(result, planted_fault) + _stopped(halt, result.runs) + form_note


def _stopped(halt: Halt, samples: int) -> str:
    """The note of a lab run that ended early (empty while it has not)."""
    return f"<p>Stopped {escape(halt.said())} after {samples} samples.</p>" if halt.reason else ""
