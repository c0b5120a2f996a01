"""The exactness lab's figure and verdict: pure functions of a ``specviz.records.lab.Result``."""

from __future__ import annotations

from html import escape

import numpy as np
import plotly.graph_objects as go

from specviz.records.lab import ALPHA, VOCAB, Fault, Result
from specviz.views.charts import BLUE, GREY, VERMILLION, style_figure

CELLS_SHOWN = 24


def lab_figure(result: Result | None) -> go.Figure:
    """The most likely two-token continuations: exact probability under the target against the
    frequency among the speculative samples so far."""
    if result is None or result.runs == 0:
        fig = go.Figure()
        fig.add_annotation(
            text="press Run: thousands of seeded speculative samples, counted as they come",
            showarrow=False,
            x=0.5,
            y=0.5,
            xref="paper",
            yref="paper",
        )
        return style_figure(fig, "Exactness lab", "", "")
    order = np.argsort(-result.exact)[:CELLS_SHOWN]
    labels = [f"{i // VOCAB},{i % VOCAB}" for i in order]
    freq = result.counts[order] / result.runs
    fig = go.Figure(
        [
            go.Bar(x=labels, y=result.exact[order], name="exact target probability", marker_color=GREY),
            go.Bar(x=labels, y=freq, name=f"speculative samples ({result.runs})", marker_color=BLUE),
        ]
    )
    fig.update_layout(barmode="group")
    return style_figure(
        fig, f"First two tokens: target law vs {result.runs} speculative samples", "tokens (x1, x2)", "probability"
    )


def lab_html(result: Result | None, fault: Fault) -> str:
    """The verdict: chi-square and p-value, total variation, the same for as many draws from the
    exact law (the sampling noise of a correct engine), and what the planted fault should do."""
    if result is None or result.runs == 0:
        return ""
    stat, p = result.test()
    reference = result.reference()
    ref_stat, ref_p = result.test(reference)
    ref_tv = 0.5 * float(np.abs(reference / result.runs - result.exact).sum())
    verdict = "rejected: the output is not the target's law" if p < ALPHA else "no evidence against exactness"
    colour = VERMILLION if p < ALPHA else "#009E73"
    rate = f"{result.accepted / result.drafted:.2f}" if result.drafted else "…"
    rows = [
        (
            "speculative samples",
            f"χ² = {stat:.1f}, p = {p:.3g}",
            f"total variation {result.total_variation:.4f}; draft acceptance rate {rate}",
        ),
        (
            "as many exact draws",
            f"χ² = {ref_stat:.1f}, p = {ref_p:.3g}",
            f"total variation {ref_tv:.4f}: the noise of a correct sampler",
        ),
    ]
    cells = "".join(
        f"<tr><td style='padding:2px 10px 2px 0;'>{escape(a)}</td><td style='padding:2px "
        f"10px;font-weight:600;'>{escape(b)}</td>"
        f"<td style='color:#555;'>{escape(c)}</td></tr>"
        for a, b, c in rows
    )
    seen = f" Seen in: {escape(fault.seen)}." if fault.seen else ""
    return (
        f"<div class='sv-lab' style='font-size:14px;'><p style='font-size:16px;color:{colour};font-weight:600;'>"
        f"{escape(verdict)} (significance {ALPHA:g})</p><table>{cells}</table>"
        f"<p style='color:#444;'>Planted: {escape(fault.name)}.{seen} Expected: {escape(fault.expect)}.</p>"
        f"<p style='color:#555;font-size:13px;'>{escape(threshold_note(p))}</p></div>"
    )


def threshold_note(p: float) -> str:
    """Why the significance is ALPHA and what this run's p says against it, in plain words."""
    per = round(1 / ALPHA)
    where = (
        f"This run's p = {p:.3g} is below it: a law this far from the target's is what a planted fault gives "
        "(a fault that shifts the law drives p towards 0 as the samples grow)."
        if p < ALPHA
        else f"This run's p = {p:.3g} is above it: no evidence against exactness (a correct engine's p is spread "
             "evenly "
        "over 0 to 1, so any value above the threshold is what it gives)."
    )
    return (
        f"Why {ALPHA:g} and not 0.05: under exactness the p-value is uniform on [0, 1], so a correct engine is "
        f"wrongly rejected once in {per:,} runs at this threshold, where at 0.05 a class pressing Run twenty times "
        f"would see a false alarm about once (many tests, one threshold). {where}"
    )
