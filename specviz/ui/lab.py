"""The Exactness lab tab: seeded speculative samples of tiny models against the exact law, with a
teaching fault planted or none."""

from __future__ import annotations

from specviz import Sampling
from specviz.lab.experiment import stream as lab_stream
from specviz.lab.faults import FAULTS, planted
from specviz.lab.models import KINDS as LAB_KINDS
from specviz.lab.models import models as lab_models
from specviz.ui.checks import mistake, number, shown
from specviz.ui.limits import LAB_RUNS_MAX
from specviz.views.lab import lab_figure, lab_html


def run_lab(kind, fault, temperature, top_k, top_p, gamma, runs):
    """The exactness lab: stream seeded speculative samples of tiny models against the exact law,
    with one teaching fault planted (or none); yields (figure, verdict HTML) every 250 samples."""
    if kind not in LAB_KINDS or fault not in FAULTS:
        raise mistake("Pick a drafter and a fault from the menus.", title="Unknown lab setting")
    for value, lo, hi, name in ((gamma, 1, 8, "gamma"), (top_k, 0, 8, "top-k"), (runs, 100, LAB_RUNS_MAX, "samples")):
        if not number(value) or value != int(value) or not lo <= value <= hi:
            raise mistake(f"{name} must be a whole number from {lo} to {hi}, got {shown(value)}.", title=f"Bad {name}")
    try:
        sampling = Sampling(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
    except (TypeError, ValueError) as err:
        raise mistake(str(err), title="Bad sampling settings") from err
    drafter, target = lab_models(kind)
    results = lab_stream(drafter, target, sampling, int(gamma), int(runs))
    while True:
        # The fault is planted for one chunk at a time, on this thread only (see lab.faults.planted).
        with planted(fault) as planted_fault:
            result = next(results, None)
        if result is None:
            return
        yield lab_figure(result), lab_html(result, planted_fault)
