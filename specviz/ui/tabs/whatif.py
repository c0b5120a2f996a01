"""The Theory tab's what-if: sliders for alpha, gamma, c and v move the predicted speedup and E[tokens per round]
(``specviz.views.theory.whatif_figure``, ``whatif_markdown``), with the shown run's measured speedup marked; "Set to
this run" puts the sliders at the run's own alpha, gamma, c and v. Arithmetic only: no model, no device."""

from __future__ import annotations

import gradio as gr

from specviz.recording import Recording
from specviz.ui.guard.checks import CheckedSlider, mistake
from specviz.views.theory import WHATIF, WHATIF_DEFAULT, whatif_figure, whatif_markdown, whatif_values

LABELS = {"alpha": "α: the chance a draft is accepted", "gamma": "γ: drafts per round",
          "c": "c: a drafter pass, in target passes", "v": "v: the verify pass, in target passes"}


def sliders() -> dict[str, gr.Slider]:
    """The four sliders, at ``WHATIF_DEFAULT``, each refusing a value outside ``WHATIF`` by name."""
    return {
        key: CheckedSlider(lo, hi, value=WHATIF_DEFAULT[key], step=step, label=LABELS[key], elem_id=f"sv-whatif-{key}")
        for key, (lo, hi, step) in WHATIF.items()
    }


def _run(rec) -> tuple:
    """(speculative trace, baseline) of the shown recording, or (None, None)."""
    return (rec.speculative, rec.baseline) if isinstance(rec, Recording) else (None, None)


def whatif(alpha, gamma, c, v, rec: Recording | None = None) -> dict:
    """The what-if's note and figure for the sliders' values (the sliders check their ranges; gamma is a whole number).

    Raises:
        gr.Error: gamma is not a whole number.
    """
    if float(gamma) != int(gamma):
        raise mistake(f"{LABELS['gamma']} must be a whole number from 1 to {WHATIF['gamma'][1]}.", title="Bad gamma")
    spec, baseline = _run(rec)
    return dict(
        whatif_note=whatif_markdown(float(alpha), int(gamma), float(c), float(v)),
        whatif_plot=whatif_figure(float(alpha), int(gamma), float(c), float(v), spec, baseline),
    )


def whatif_from_run(rec: Recording | None = None) -> dict:
    """The sliders at the shown run's alpha, gamma, c and v (``whatif_values``), and the note and figure for them."""
    values = whatif_values(*_run(rec))
    values["gamma"] = int(round(values["gamma"]))
    return {f"whatif_{key}": gr.update(value=value) for key, value in values.items()} | whatif(**values, rec=rec)
