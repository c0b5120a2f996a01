"""Leviathan et al. 2023, Sec. 3, beside the measurement: figures of a trace and a sweep.

alpha is the measured acceptance rate, c the measured cost coefficient (drafter step time /
target step time). The predictions assume each draft is accepted independently with
probability alpha; real drafts are not independent, which the figures make visible.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz import theory
from specviz.sweep import Sweep
from specviz.trace import Trace
from specviz.views.charts import BLUE, GREEN, ORANGE, VERMILLION, style_figure

THEORY, MEASURED = "#555555", VERMILLION
MAX_GAMMA = 16


def _empty(title: str, why: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=why, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=14, color="#666"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return style_figure(fig, title, "", "")


def _curve(fig: go.Figure, alpha: float, c: float, row=None, col=None, up_to: int = MAX_GAMMA) -> int:
    """Add the predicted speedup over gamma = 1..up_to and the best gamma in 1..16; return that gamma."""
    best = theory.optimal_gamma(alpha, c, MAX_GAMMA)
    gammas = list(range(1, max(up_to, best) + 1))
    kw = dict(row=row, col=col) if row else {}
    fig.add_trace(go.Scatter(x=gammas, y=[theory.predicted_speedup(alpha, g, c) for g in gammas], mode="lines+markers",
                             name=f"predicted (alpha {alpha:.2f}, c {c:.2f})", line=dict(color=THEORY, width=2), marker=dict(size=5)), **kw)
    fig.add_trace(go.Scatter(x=[best], y=[theory.predicted_speedup(alpha, best, c)], mode="markers+text", name=f"optimal gamma = {best}",
                             text=[f"optimal γ = {best}"], textposition="top center",
                             marker=dict(symbol="star", size=16, color=ORANGE, line=dict(color="#333", width=1))), **kw)
    return best


def speedup_figure(spec: Trace, baseline: Trace | None) -> go.Figure:
    """Predicted walltime speedup over gamma (Leviathan et al. 2023, Thm 3.8) from this run's
    alpha and c, the optimal gamma marked, and the measured speedup at the run's gamma."""
    title = "Speedup: theory vs this run"
    alpha = spec.acceptance_rate
    c = theory.cost_coefficient(spec, baseline) if baseline is not None else None
    if alpha is None or c is None:
        return _empty(title, "waiting for the autoregressive baseline, which measures c")
    fig = go.Figure()
    _curve(fig, alpha, c)
    gamma = spec.settings.get("gamma")
    measured = theory.measured_speedup(spec, baseline)
    if measured is not None and gamma:
        fig.add_trace(go.Scatter(x=[gamma], y=[measured], mode="markers+text", name=f"measured, gamma {gamma}", text=[f"measured {measured:.2f}×"],
                                 textposition="bottom center", marker=dict(symbol="diamond", size=13, color=MEASURED)))
    fig.add_hline(y=1.0, line=dict(color="#999", dash="dot"), annotation_text="no speedup", annotation_position="bottom right")
    top = max([theory.predicted_speedup(alpha, g, c) for g in range(1, MAX_GAMMA + 1)] + [measured or 0.0, 1.0])
    fig.update_yaxes(range=[0, top * 1.25])
    return style_figure(fig, title, "gamma (drafted tokens per round)", "speedup over autoregressive")


def accepted_histogram_figure(trace: Trace) -> go.Figure:
    """Share of rounds with k = 0..gamma accepted drafts, against the capped geometric law
    the acceptance rate predicts (rounds cut short at the end are left out)."""
    title = "Accepted drafts per round"
    gamma = trace.settings.get("gamma")
    counts = theory.accepted_per_round(trace)
    alpha = trace.acceptance_rate
    if not counts or alpha is None or not gamma:
        return _empty(title, "no full rounds yet")
    ks = list(range(gamma + 1))
    share = [counts.count(k) / len(counts) for k in ks]
    predicted = theory.accepted_drafts_distribution(alpha, gamma)
    fig = go.Figure([
        go.Bar(x=ks, y=share, name=f"measured ({len(counts)} rounds)", marker_color=BLUE),
        go.Scatter(x=ks, y=predicted, name=f"predicted from alpha = {alpha:.2f}", mode="lines+markers", line=dict(color=THEORY, width=2, dash="dash"), marker=dict(size=8)),
    ])
    fig.update_xaxes(dtick=1)
    return style_figure(fig, title, "accepted drafts in the round", "share of rounds")


def position_figure(trace: Trace) -> go.Figure:
    """Acceptance rate by draft position (vLLM's per-position metric): the share of rounds
    whose i-th draft was accepted, against alpha^i."""
    title = "Acceptance by draft position"
    by_pos = theory.acceptance_by_position(trace)
    alpha = trace.acceptance_rate
    if not by_pos or alpha is None:
        return _empty(title, "no drafts yet")
    xs = list(range(1, len(by_pos) + 1))
    fig = go.Figure([
        go.Bar(x=xs, y=[a / n for n, a in by_pos], name="measured: accepted / rounds", marker_color=BLUE,
               customdata=[[a, n] for n, a in by_pos], hovertemplate="position %{x}: %{customdata[0]} of %{customdata[1]} rounds<extra></extra>"),
        go.Scatter(x=xs, y=[theory.position_acceptance(alpha, i) for i in xs], name=f"predicted alpha^i (alpha = {alpha:.2f})",
                   mode="lines+markers", line=dict(color=THEORY, width=2, dash="dash")),
    ])
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(range=[0, 1.05])
    return style_figure(fig, title, "draft position i in the round", "acceptance rate")


def sweep_figure(sweep: Sweep | None) -> go.Figure:
    """Measured tokens per round and speedup for each gamma of a sweep, against Eq. (1) and
    Thm 3.8 with the sweep's pooled alpha and c."""
    title = "Gamma sweep: measurement vs theory"
    if sweep is None or not sweep.points:
        return _empty(title, "press “Run gamma sweep” to measure gamma = 1..8")
    alpha, c = sweep.acceptance_rate, sweep.cost_coefficient
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens per round", "speedup over autoregressive"), horizontal_spacing=0.1)
    gs = [p.gamma for p in sweep.points]
    if alpha is not None:
        curve = list(range(1, max(gs) + 1))
        fig.add_trace(go.Scatter(x=curve, y=[theory.expected_tokens_per_round(alpha, g) for g in curve], mode="lines",
                                 name=f"Eq. (1), alpha {alpha:.2f}", line=dict(color=THEORY, dash="dash")), row=1, col=1)
    fig.add_trace(go.Scatter(x=gs, y=[p.tokens_per_round for p in sweep.points], mode="markers", name="measured tokens per round",
                             marker=dict(size=10, color=GREEN, symbol="circle")), row=1, col=1)
    if alpha is not None and c is not None:
        _curve(fig, alpha, c, row=1, col=2, up_to=max(gs))
    fig.add_trace(go.Scatter(x=gs, y=[sweep.speedup(p) for p in sweep.points], mode="markers", name="measured speedup",
                             marker=dict(size=11, color=MEASURED, symbol="diamond")), row=1, col=2)
    fig.update_xaxes(title_text="gamma", dtick=1)
    fig = style_figure(fig, title, None, None)
    fig.update_layout(height=420, legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="center", x=0.5), margin=dict(t=70, b=90))
    return fig
