"""Plotly figures of a trace: acceptance per round, tokens against wall time, and each round's time."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

from specviz import metrics
from specviz.records.speedup import _time_at
from specviz.trace import Trace

BLUE, VERMILLION, ORANGE, GREEN, GREY = "#56B4E9", "#D55E00", "#E69F00", "#009E73", "#BBBBBB"
# Orange and green mean the correction and the bonus token in the text (specviz.views.tokens): the charts
# use other colours for everything else, the two runs above all.
SPECULATIVE, AUTOREGRESSIVE, PURPLE = "#0072B2", "#777777", "#CC79A7"
SERIES = (SPECULATIVE, PURPLE, "#333333")  # several runs in one chart, in turn
TOOLBAR_PX = 30  # the height of plotly's modebar, kept free of the title

# plotly sizes a figure to its box when it draws it, and again only when the window resizes: a
# figure drawn in a hidden tab takes plotly's default 700 px and keeps it when the tab opens (cut
# on a phone and in a 600 px column), one drawn before a grid settles keeps the grid's first width.
# This script, run once in a page or an exported file, watches every figure's box and redraws the
# figure at its box's width whenever the two differ (figures added later are watched too).
FIT_SCRIPT = """
(() => {
  if (window.svFit) return;
  const fit = new ResizeObserver((entries) => entries.forEach((e) => {
    const gd = e.target, w = Math.round(e.contentRect.width);
    if (w > 0 && window.Plotly && gd._fullLayout && Math.abs(gd._fullLayout.width - w) > 1)
      window.Plotly.relayout(gd, {width: w});
  }));
  window.svFit = fit;
  const watch = (root) => {
    if (!root.querySelectorAll) return;
    const found = [...root.querySelectorAll('.js-plotly-plot')];
    if (root.classList && root.classList.contains('js-plotly-plot')) found.push(root);
    found.forEach((gd) => { if (!gd.svFit) { gd.svFit = true; fit.observe(gd); } });
  };
  new MutationObserver((changes) => changes.forEach((c) => c.addedNodes.forEach(watch)))
    .observe(document.documentElement, {childList: true, subtree: true});
  watch(document);
})();
"""


def _look() -> go.layout.Template:
    """plotly_white's look for the kinds of figure specviz draws (2-D axes, bars, lines, markers), built once.

    Assigning plotly's whole "plotly_white" template by name deep-copies and validates its defaults for
    every trace kind (3-D scenes, maps, polar axes...): 16-20 ms per figure, which made the round's
    figures cost more than the round's decoding while a run streamed (measured on a 2-core CPU). Its
    2-D part, kept once here and assigned as one object, costs about 2.5 ms."""
    white = pio.templates["plotly_white"]
    layout = white.layout.to_plotly_json()
    keep = (
        "autotypenumbers",
        "colorway",
        "font",
        "hovermode",
        "hoverlabel",
        "paper_bgcolor",
        "plot_bgcolor",
        "xaxis",
        "yaxis",
        "shapedefaults",
        "annotationdefaults",
        "title",
    )
    return go.layout.Template(
        layout={k: layout[k] for k in keep if k in layout}, data=dict(bar=white.data.bar, scatter=white.data.scatter)
    )


LOOK = _look()


def style_figure(fig: go.Figure, title: str, x: str | None, y: str | None) -> go.Figure:
    """The look every specviz figure shares: title, axis titles (None leaves them), size, legend (``legend_room``'s
    rule for a plot of 236 px). Assigned as one layout (``_restyled``)."""
    axes = {f"{axis}axis": dict(title=dict(text=text)) for axis, text in (("x", x), ("y", y)) if text is not None}
    top = TOOLBAR_PX + 44
    bottom = _legend_bottom(fig)
    return _restyled(
        fig,
        dict(
            **axes,
            # The title sits below the band plotly's toolbar (the modebar) takes at the figure's top, so
            # the toolbar never covers it: on a phone it is always shown and the title spans the width.
            title=dict(
                text=title,
                font=dict(size=18),
                x=0,
                xref="paper",
                xanchor="left",
                y=1,
                yref="container",
                yanchor="top",
                pad=dict(t=TOOLBAR_PX),
            ),
            template=LOOK,
            font=dict(size=15),  # read from the back of a room on a projector (plotly's 12 was too small)
            height=top + 236 + bottom,
            margin=dict(l=60, r=20, t=top, b=bottom),
            # below the axis title, so on a narrow screen the legend never covers the figure's title
            legend=dict(orientation="h", xanchor="left", x=0.0, yref="container", y=0, yanchor="bottom", valign="top"),
            bargap=0.15,
        ),
    )


def _restyled(fig: go.Figure, updates: dict) -> go.Figure:
    """``fig`` with its layout's properties updated by ``updates`` (nested dicts merged, as ``update_layout`` merges
    them), assigned as one layout: plotly validates a layout assigned whole once, where ``update_layout`` took 9-12 ms
    a figure through its relayout machinery (1.5 ms so), most of a finished run's page time."""
    layout = fig.layout.to_plotly_json()
    _merge(layout, updates)
    fig.layout = layout
    return fig


def _merge(into: dict, updates: dict) -> None:
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


AXIS_PX = 66  # below the plot: the x axis's tick labels and its title
LEGEND_ROW_PX = 22  # one legend entry's row at font size 15


def legend_entries(fig: go.Figure) -> int:
    """How many entries the figure's legend lists (named traces not hidden from it)."""
    return sum(1 for t in fig.data if t.name and t.showlegend is not False)


def _legend_bottom(fig: go.Figure) -> int:
    """The bottom margin ``legend_room`` gives: the axis and a row for every legend entry (at least two)."""
    return AXIS_PX + 12 + max(2, legend_entries(fig)) * LEGEND_ROW_PX


def legend_room(fig: go.Figure, plot_px: int) -> go.Figure:
    """Keep the legend below the x axis's title at any width: the legend sits at the figure's bottom
    edge (in pixels, not a share of the plot's height), and the bottom margin holds the axis and a row
    for every entry (at least two), which a phone needs when each long entry takes a row of its own
    (plotly clips a legend that overflows the margin: the Theory figure's lost its last three). The
    plot itself keeps ``plot_px`` of height."""
    bottom = _legend_bottom(fig)
    top = fig.layout.margin.t or 0
    return fig.update_layout(
        height=top + plot_px + bottom,
        margin=dict(b=bottom),
        legend=dict(yref="container", y=0, yanchor="bottom", valign="top"),
    )


def acceptance_figure(trace: Trace) -> go.Figure:
    """Stacked bars per round (accepted, rejected, discarded drafts), alpha so far (accepted /
    (accepted + rejected) over the rounds up to each), and each round's mean beta
    (sum_x min(p, q) averaged over its tested drafts; Leviathan et al. 2023, Def. 3.1)."""
    rounds = list(range(1, len(trace.rounds) + 1))

    # A tree round counts every node (its drafts hold the accepted path only).
    def count(verdict: str) -> list[int]:
        return [
            sum(d.verdict == verdict for d in (r.tree.nodes if r.tree is not None else r.drafts)) for r in trace.rounds
        ]

    running, acc, rej = [], 0, 0
    for r in trace.rounds:
        acc += r.accepted_count
        rej += r.rejected_count
        running.append(metrics.alpha(acc, rej))
    mean_beta = [
        metrics.mean(d.beta for d in r.drafts if d.verdict != "discarded" and d.beta is not None) for r in trace.rounds
    ]
    lines = [
        go.Scatter(
            x=rounds,
            y=running,
            name="alpha so far (accepted / tested)",
            yaxis="y2",
            mode="lines",
            line=dict(color="#333", width=2),
        )
    ]
    if any(b is not None for b in mean_beta):
        lines.append(
            go.Scatter(
                x=rounds,
                y=mean_beta,
                name="mean beta of the round",
                yaxis="y2",
                mode="lines+markers",
                line=dict(color=PURPLE, width=1.5, dash="dot"),
                marker=dict(size=4),
            )
        )
    gammas = [r.gamma for r in trace.rounds]
    if len({g for g in gammas if g is not None}) > 1:
        # A gamma schedule at work: each round's allowed drafts, as a step line over the bars.
        lines.append(
            go.Scatter(
                x=rounds,
                y=gammas,
                name="gamma of the round (allowed drafts)",
                mode="lines",
                line=dict(color=BLUE, width=1.5, shape="hvh", dash="dash"),
            )
        )
    fig = go.Figure(
        [
            go.Bar(x=rounds, y=count("accepted"), name="accepted", marker_color=BLUE),
            go.Bar(x=rounds, y=count("rejected"), name="rejected", marker_color=VERMILLION),
            go.Bar(x=rounds, y=count("discarded"), name="discarded after a rejection", marker_color=GREY),
            *lines,
        ]
    )
    fig.update_layout(
        barmode="stack", yaxis2=dict(overlaying="y", side="right", range=[0, 1.05], title="alpha, beta", showgrid=False)
    )
    # rounds are whole numbers: no tick at 1.4
    fig.update_xaxes(tick0=1, dtick=1 if len(rounds) <= 20 else None, tickformat="d")
    return style_figure(fig, "Drafts per round", "round", "drafted tokens")


def _steps(trace: Trace) -> tuple[list[float], list[int]]:
    """(seconds since the start, tokens generated by then) at the prefill's end and each round's."""
    xs, ys, total = [0.0, trace.prefill_ms / 1000.0], [0, 0], 0
    for r in trace.rounds:
        total += len(r.emitted_ids)
        xs.append(r.end_ms / 1000.0)
        ys.append(total)
    return xs, ys


def timeline_figure(spec: Trace, baseline: Trace | None = None) -> go.Figure:
    """Generated tokens against wall time (s) for the speculative run and, if given, the baseline."""
    traces = [(spec, "speculative", SPECULATIVE)] + (
        [(baseline, "autoregressive", AUTOREGRESSIVE)] if baseline is not None else []
    )
    fig = go.Figure(
        [
            go.Scatter(x=xs, y=ys, name=name, mode="lines", line=dict(shape="hv", color=color, width=2.5))
            for t, name, color in traces
            for xs, ys in [_steps(t)]
        ]
    )
    return style_figure(fig, "Generated tokens over time", "wall time (s)", "tokens")


def round_times(spec: Trace) -> list[tuple[float, float, float]]:
    """Each round's (drafting, verifying, the rest) in ms: ``draft_ms``, ``verify_ms``, and what is left of the
    round's wall time (from the previous round's end, or the prefill's, to its ``end_ms``: sampling, judging, the
    host's work between passes; never below 0)."""
    out, before = [], spec.prefill_ms
    for r in spec.rounds:
        out.append((r.draft_ms, r.verify_ms, max(0.0, r.end_ms - before - r.draft_ms - r.verify_ms)))
        before = r.end_ms
    return out


def target_alone_ms(baseline: Trace | None) -> float | None:
    """The target alone's time per token in ms: its decoding time for all its tokens (prefill excluded, its sampling
    and bookkeeping included) over those tokens, as the headline's speedup counts it (``specviz.records.speedup``);
    None without a baseline or a round."""
    if baseline is None or not baseline.rounds:
        return None
    tokens = sum(len(r.emitted_ids) for r in baseline.rounds)
    return metrics.step_ms(_time_at(baseline, tokens) - _time_at(baseline, 0), tokens)


def round_costs_figure(spec: Trace, baseline: Trace | None = None) -> go.Figure:
    """Per-round latency: each round's time in ms as stacked bars (drafting, verifying, the rest; ``round_times``)
    and, with a baseline, the target alone's time for the same tokens (``target_alone_ms`` x the round's tokens) as
    a marker: a round pays where its bar stays under its marker."""
    times = round_times(spec)
    xs = list(range(1, len(times) + 1))
    fig = go.Figure(
        [
            go.Bar(x=xs, y=[t[0] for t in times], name="drafting (drafter passes)", marker_color=PURPLE),
            go.Bar(x=xs, y=[t[1] for t in times], name="verifying (the target's pass)", marker_color=SPECULATIVE),
            go.Bar(x=xs, y=[t[2] for t in times], name="the rest (sampling, judging)", marker_color=GREY),
        ]
    )
    step = target_alone_ms(baseline)
    if step is not None:
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[step * len(r.emitted_ids) for r in spec.rounds],
                mode="markers",
                name=f"the target alone for the round's tokens ({step:.1f} ms a token)",
                marker=dict(symbol="line-ew-open", size=16, color=VERMILLION, line=dict(width=3, color=VERMILLION)),
            )
        )
    fig.update_layout(barmode="stack")
    return style_figure(
        fig,
        "Time per round: a round pays where its bar stays under the red mark" if step is not None else "Time per round",
        "round",
        "ms",
    )
