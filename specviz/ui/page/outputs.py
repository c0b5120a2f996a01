"""The outputs of a run, keyed by name: what Generate, Stop and every load fill in.

Handlers return (or yield) a dict keyed by the names in ``RUN_OUTPUTS``; ``specviz.ui.page.layout``
maps each name to its component and a missing name leaves its component as it is.
"""

from __future__ import annotations

import gradio as gr

from specviz.recording import Recording
from specviz.trace import Trace
from specviz.ui.guard.downloads import nonce
from specviz.views.theory import sweep_note
from specviz.views.verdict import headline_html
from specviz.views import (
    acceptance_figure,
    accepted_histogram_figure,
    position_figure,
    race_html,
    round_html,
    slowdown_for,
    speedup_figure,
    stats_html,
    sweep_figure,
    round_costs_figure,
    timeline_figure,
    tokens_html,
)

RUN_OUTPUTS = ("tokens", "stats", "acceptance_plot", "timeline_plot", "status", "recording", "replay_slider", "replay",
               "speedup_plot", "histogram_plot", "position_plot", "sweep_plot", "race", "download", "replay_tree",
               "export_file", "headline", "sweep_status", "auto_note", "budget_plot", "auto_tree_plot", "rank_table",
               "round_costs_plot")  # added last: an API client's positions of the earlier outputs stay as they were


def replay_slider(trace: Trace | None, value: int | None = None) -> gr.Slider:
    """The replay's round slider for ``trace``, at ``value`` (default: the last round)."""
    n = max(1, len(trace.rounds)) if trace is not None else 1
    # Gradio needs maximum > minimum; a one-round run gets a fixed slider (the handlers clamp).
    return gr.Slider(minimum=1, maximum=max(n, 2), value=min(value or n, n), step=1, interactive=n > 1)


def everything(rec: Recording, status: str, download: str | None) -> dict:
    """Every output of a finished (or loaded, or stopped) run; the status with the machine's details folded
    (``machine_folded``)."""
    spec, base = rec.speculative, rec.baseline
    return dict(
        tokens=tokens_html(spec),
        stats=stats_html(spec, base),
        acceptance_plot=acceptance_figure(spec),
        timeline_plot=timeline_figure(spec, base),
        round_costs_plot=round_costs_figure(spec, base),
        status=machine_folded(status),
        recording=rec,
        # a finished run or a loaded one replays from round 1
        replay_slider=replay_slider(spec, 1),
        replay=round_html(spec, 0),
        speedup_plot=speedup_figure(spec, base),
        histogram_plot=accepted_histogram_figure(spec),
        position_plot=position_figure(spec),
        sweep_plot=sweep_figure(rec.sweep),
        race=race_html(spec, base, slowdown_for(spec, base), nonce()),
        download=gr.DownloadButton(value=download, interactive=download is not None),
        replay_tree=_tree(rec, 1),
        export_file=None,  # an HTML export of the run shown before is not this run's
        # an earlier sweep's status is not this run's
        headline=headline_html(spec, base),
        sweep_status=sweep_note(rec.sweep),
        **auto_tree_outputs(rec),
    )


# The status's sentences on how this machine computes (``specviz.ui.running.device``: where the target came from, the
# dtype and the matrix-product routines, what ran the passes), in the order the status gives them, and the sentence
# after them.
MACHINE_SENTENCES = (" Target: ", " Form: ", " Passes: ")
AFTER_MACHINE = " It waited"
MACHINE_SUMMARY = "How this machine computes"
_BITS = {"bf16": "16-bit numbers (bf16)", "fp16": "16-bit numbers (fp16)", "fp32": "32-bit numbers (fp32)"}


def machine_folded(status: str) -> str:
    """The status (Markdown) with its sentences on kernels and number formats (``MACHINE_SENTENCES``) folded under a
    "How this machine computes" detail, plain words first, so that the verdict is what a class reads first; a status
    without them is returned as it is."""
    found = [i for i in (status.find(m) for m in MACHINE_SENTENCES) if i >= 0]
    if not found:
        return status
    start = min(found)
    end = status.find(AFTER_MACHINE, start)
    end = len(status) if end < 0 else end
    details = status[start:end].strip()
    form = status.find(" Form: ")
    word = status[form + 7 :].split(":", 1)[0].strip() if form >= 0 else ""
    plain = (
        "In plain words: a model's pass multiplies numbers by its tables of weights"
        + (f", and this machine holds those numbers as {_BITS[word]}" if word in _BITS else "")
        + ". The details say where the target came from, why this form, and which routines did the multiplying:"
    )
    return (status[:start] + status[end:]).rstrip() + (
        f'\n\n<details class="sv-machine"><summary>{MACHINE_SUMMARY}</summary>\n\n{plain} {details}\n\n</details>\n'
    )


STATS_WAITING = (
    '<div class="sv-stats sv-stats-empty" style="font-size:14px;color:#555;">This run\'s numbers appear with its '
    "first round.</div>"
)


def cleared_run() -> dict:
    """What a run shows before its first round (while the auto tree calibrates): no token, no number and no tree
    table of the run before it, whose counts would read as this run's."""
    return dict(
        tokens=tokens_html(Trace(mode="speculative", prompt_ids=[])), stats=STATS_WAITING, **tree_section_cleared()
    )


def tree_section_cleared() -> dict:
    """The Theory tab's token-tree section while a run streams: its note, figures and tables are drawn from the
    finished run, so those of the run before it are cleared (the rank table labelled "This run" was the last one's)."""
    from specviz.views.tree_budget import placeholder_figure

    waiting = "The token tree's section: drawn when this run ends"
    return dict(
        auto_note=f"{waiting}.",
        budget_plot=placeholder_figure(waiting),
        auto_tree_plot=placeholder_figure(waiting),
        rank_table="",
    )


def auto_tree_outputs(rec: Recording | None) -> dict:
    """The Theory tab's token-tree section for a recording: the auto choice decided again from the
    recording's calibration (``specviz.engine.tree.auto.from_record``), drawn with this run's measurement;
    a run without auto gets the note that says how to get it, and its own tree and counts where it drafted trees."""
    from specviz.views.tree_budget import (
        auto_note_markdown,
        budget_figure,
        chosen_tree_figure,
        measured_point,
        placeholder_figure,
        tree_tables_html,
    )

    spec = rec.speculative if rec is not None else None
    choice = None
    if rec is not None and rec.auto is not None:
        from specviz.engine.tree.auto import from_record

        choice = from_record(rec.auto).describe()
    measured = measured_point(spec, rec.baseline if rec is not None else None)
    return dict(
        auto_note=auto_note_markdown(choice, measured, _drafted(spec)),
        budget_plot=budget_figure(choice, measured)
        if choice is not None
        else placeholder_figure("Speedup against the node budget: choose the auto tree to draw it"),
        auto_tree_plot=chosen_tree_figure(spec),
        rank_table=tree_tables_html(choice, spec),
    )


def _drafted(spec: Trace | None) -> str:
    """What a run drafted, for the note: "a chain (drafter model, gamma 4)", "a token tree (...)"; "" before any
    round."""
    from specviz.views.text import run_label

    if spec is None or not spec.rounds:
        return ""
    return f"{'a token tree' if spec.has_tree else 'a chain'} ({run_label(spec)})"


def _tree(rec: Recording, index: int):
    from specviz.ui.tabs.tree import replay_tree

    return replay_tree(rec, index)


def in_order(values: dict, names) -> tuple:
    """``values`` as a tuple in the order of ``names``; a missing name is ``gr.skip()`` (left as it is)."""
    unknown = set(values) - set(names)
    if unknown:
        raise KeyError(f"outputs not wired: {sorted(unknown)}")
    return tuple(values.get(n, gr.skip()) for n in names)


def keyed(fn, names):
    """``fn`` (returning or yielding dicts keyed by ``names``) as a Gradio handler whose outputs are
    the components of ``names`` in that order. The signature stays ``fn``'s, so Gradio still
    injects ``gr.Request`` and ``gr.Progress`` and the API lists the same parameters."""
    import functools
    import inspect

    names = tuple(names)
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def stream(*args, **kwargs):
            for values in fn(*args, **kwargs):
                yield in_order(values, names)

        return stream

    @functools.wraps(fn)
    def once(*args, **kwargs):
        return in_order(fn(*args, **kwargs), names)

    return once
