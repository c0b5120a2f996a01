"""Leviathan et al. 2023, Sec. 3, beside the measurement: figures of a trace and a sweep.

alpha is estimated as accepted / (accepted + rejected) (``Trace.alpha``: the share of tested
drafts accepted), c is the measured cost coefficient (drafter step time / target step time) and
v the measured verify cost (target pass over gamma + 1 tokens / target step). The predictions
assume each tested draft is accepted independently with probability alpha.
"""

from __future__ import annotations

from html import escape

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz import theory
from specviz.records.sweep import Sweep
from specviz.trace import Trace
from specviz.views.charts import BLUE, PURPLE, TOOLBAR_PX, VERMILLION, legend_room, style_figure

THEORY, MEASURED, VERIFY = "#555555", VERMILLION, "#0072B2"
MAX_GAMMA = 16
# a sweep point's measurement: not the headline's speedup
SWEEP_RATIO = "measured tok/s ratio, whole run (prefill included)"


def _empty(title: str, why: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(
        text=why, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=14, color="#666")
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return style_figure(fig, title, "", "")


def _curve(fig: go.Figure, alpha: float, c: float, row=None, col=None, up_to: int = MAX_GAMMA) -> int:
    """Add Thm 3.8's predicted speedup over gamma = 1..up_to and its best gamma in 1..16; return that gamma."""
    best = theory.optimal_gamma(alpha, c, MAX_GAMMA)
    gammas = list(range(1, max(up_to, best) + 1))
    kw = dict(row=row, col=col) if row else {}
    fig.add_trace(
        go.Scatter(
            x=gammas,
            y=[theory.predicted_speedup(alpha, g, c) for g in gammas],
            mode="lines+markers",
            name=f"Thm 3.8, v = 1 (alpha {alpha:.2f}, c {c:.2f})",
            line=dict(color=THEORY, width=2),
            marker=dict(size=5),
        ),
        **kw,
    )
    top = theory.predicted_speedup(alpha, best, c)
    fig.add_trace(
        go.Scatter(
            x=[best],
            y=[top],
            mode="markers",
            name=f"optimal gamma, Thm 3.8 = {best}",
            marker=dict(symbol="star", size=16, color=PURPLE, line=dict(color="#333", width=1)),
        ),
        **kw,
    )
    _label(fig, best, top, f"optimal γ = {best}", above=True, **kw)
    return best


def _label(fig: go.Figure, x: float, y: float, text: str, above: bool, **kw) -> None:
    """A point's label, set off from it by a short leader line on a white ground, so it never
    sits on a curve it would have to be read through (above the curves' top, below their bottom)."""
    fig.add_annotation(
        x=x,
        y=y,
        text=text,
        showarrow=True,
        arrowhead=0,
        arrowwidth=1,
        arrowcolor="#777",
        ax=0,
        ay=-34 if above else 34,
        bgcolor="rgba(255,255,255,0.9)",
        borderpad=2,
        font=dict(size=14, color="#222"),
        **kw,
    )


def _verify_curve(fig: go.Figure, alpha: float, c: float, v: float, gamma_measured: float) -> int:
    """Add the prediction with the measured verify cost, v(gamma) = 1 + (v - 1) gamma / gamma_measured,
    and its best gamma; return that gamma."""
    gammas = list(range(1, MAX_GAMMA + 1))
    ys = [
        theory.predicted_speedup_with_verify_cost(alpha, g, c, theory.verify_cost_at(g, v, gamma_measured))
        for g in gammas
    ]
    best = theory.optimal_gamma(alpha, c, MAX_GAMMA, v=v, gamma_measured=gamma_measured)
    below = " (below 1: see the stats table)" if v < 1.0 else ""
    fig.add_trace(
        go.Scatter(
            x=gammas,
            y=ys,
            mode="lines+markers",
            name=f"with measured verify cost v = {v:.2f} at γ {gamma_measured:.3g}{below}",
            line=dict(color=VERIFY, width=2, dash="dash"),
            marker=dict(size=5),
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[best],
            y=[ys[best - 1]],
            mode="markers",
            name=f"with the measured v: optimal γ = {best}",
            marker=dict(symbol="star", size=14, color=VERIFY, line=dict(color="#333", width=1)),
        )
    )
    _label(fig, best, ys[best - 1], f"with v: γ = {best}", above=False)
    return best


def speedup_figure(spec: Trace, baseline: Trace | None) -> go.Figure:
    """Predicted walltime speedup over gamma from this run's alpha and c (Leviathan et al. 2023,
    Thm 3.8, which takes a verify pass to cost one target step), the same with the verify cost
    v measured in this run (E[tokens per round] / (gamma c + v), v scaled linearly in gamma),
    the optimal gamma of each, and the measured speedup at the run's gamma (an adaptive gamma schedule's: at its mean
    drafts per round, beside the curves a constant gamma would follow)."""
    title = "Speedup: theory vs this run"
    alpha = spec.alpha
    c = theory.cost_coefficient(spec, baseline) if baseline is not None else None
    if alpha is None or c is None:
        return _empty(title, "waiting for the autoregressive baseline, which measures c")
    if spec.has_tree:
        return _tree_speedup_figure(spec, baseline)
    from specviz.views.stats import summary, verify_cost_shown

    s = summary(spec, baseline)  # the page's one measured speedup, as the status and the stats table name it
    fig = go.Figure()
    _curve(fig, alpha, c)
    gamma = theory.typical_gamma(spec)
    # An adaptive schedule's rounds draft their own numbers: its point stands at its mean drafts per round, and the
    # curves (a constant gamma's) are what a constant gamma would have given at this alpha and c.
    varying = s["varying_gamma"] and s["mean_drafts_per_round"]
    at = s["mean_drafts_per_round"] if varying else gamma
    v = verify_cost_shown(s)  # None where the run made too few passes to measure it (the stats table says so)
    tops = [theory.predicted_speedup(alpha, g, c) for g in range(1, MAX_GAMMA + 1)]
    if v is not None and at:
        _verify_curve(fig, alpha, c, v, at)
    measured, basis = s["measured_speedup"], s["measured_speedup_basis"]
    if measured is not None and at:
        what = f"{at:.1f} drafts a round on average (up to {gamma})" if varying else f"gamma {gamma}"
        fig.add_trace(
            go.Scatter(
                x=[at],
                y=[measured],
                mode="markers",
                name=f"measured speedup ({basis}), {what}",
                marker=dict(symbol="diamond", size=13, color=MEASURED),
            )
        )
        # The label points into the plot from the side with more room: right of a gamma in the left half of the axis,
        # left of one in the right half (a label right of gamma 12 of 16 ran past a phone's plot).
        left_half = at <= (1 + MAX_GAMMA) / 2
        fig.add_annotation(
            x=at,
            y=measured,
            text=f"measured speedup {measured:.2f}×",
            showarrow=True,
            arrowhead=0,
            arrowwidth=1,
            arrowcolor="#777",
            ax=40 if left_half else -40,
            ay=40,
            xanchor="left" if left_half else "right",
            bgcolor="rgba(255,255,255,0.9)",
            borderpad=2,
            font=dict(size=14, color=MEASURED),
        )
    fig.add_hline(
        y=1.0,
        line=dict(color="#999", dash="dot"),
        annotation_text="no speedup",
        annotation_position="bottom right",
        annotation=dict(bgcolor="rgba(255,255,255,0.9)", font=dict(size=13, color="#666")),
    )
    top = max(tops + [measured or 0.0, 1.0])
    fig.update_yaxes(range=[0, top * 1.35])  # room above the top curve for the optimal gamma's label
    return style_figure(fig, title, "gamma (drafted tokens per round)", "speedup over autoregressive")


def _tree_speedup_figure(spec: Trace, baseline: Trace) -> go.Figure:
    """A tree run has no gamma to sweep: its predicted speedup (tokens per round predicted from the
    acceptance by depth, over a round's drafting plus v, in target steps) beside the measured one."""
    from specviz.views.stats import summary

    s = summary(spec, baseline)
    bars = [
        ("predicted: E[tokens] / (drafting + v)", s["predicted_speedup_verify"], THEORY),
        (f"measured speedup ({s['measured_speedup_basis']})", s["measured_speedup"], MEASURED),
    ]
    bars = [(name, y, colour) for name, y, colour in bars if y is not None]
    fig = go.Figure(
        go.Bar(
            x=[b[0] for b in bars],
            y=[b[1] for b in bars],
            marker_color=[b[2] for b in bars],
            text=[f"{b[1]:.2f}×" for b in bars],
            textposition="outside",
            showlegend=False,
        )
    )
    fig.add_hline(
        y=1.0, line=dict(color="#999", dash="dot"), annotation_text="no speedup", annotation_position="bottom right"
    )
    fig.update_yaxes(range=[0, max([b[1] for b in bars] + [1.0]) * 1.3])
    return style_figure(fig, "Speedup: the token tree's prediction vs this run", "", "speedup over autoregressive")


def _tree_histogram_figure(trace: Trace, title: str) -> go.Figure:
    """Accepted path length per round against the law the acceptance by depth predicts."""
    from specviz.theory import tree as tree_theory

    depth = tree_theory.typical_depth(trace)
    lengths = tree_theory.path_lengths(trace, depth) if depth else []
    if not lengths:
        return _empty(title, "no full-depth tree rounds yet")
    rates = tree_theory.depth_rates(tree_theory.acceptance_by_depth(trace))
    ks = list(range(depth + 1))
    fig = go.Figure(
        [
            go.Bar(
                x=ks,
                y=[lengths.count(k) / len(lengths) for k in ks],
                name=_measured_rounds(len(lengths), len(trace.rounds)),
                marker_color=BLUE,
                hovertemplate=f"%{{y:.2f}} of the {len(lengths)} rounds of depth {depth}<extra></extra>",
            ),
            go.Scatter(
                x=ks,
                y=tree_theory.path_length_distribution(rates, depth),
                name="predicted from the acceptance by depth",
                mode="lines+markers",
                line=dict(color=THEORY, width=2, dash="dash"),
                marker=dict(size=8),
            ),
        ]
    )
    fig.update_xaxes(dtick=1)
    return style_figure(fig, title, "accepted path length (nodes) in the round", "share of rounds")


def _measured_rounds(counted: int, rounds: int) -> str:
    """The histogram's legend entry: the rounds it counts out of the run's (a run of 65 rounds whose
    last two were cut short by the token budget counts 63: "63 of 65 rounds"); which ones it counts
    goes in the bars' hover."""
    if counted == rounds:
        return f"measured, all {rounds} rounds"
    return f"measured, {counted} of {rounds} rounds"  # short enough for a phone's legend; the hover says which


def accepted_histogram_figure(trace: Trace) -> go.Figure:
    """Share of rounds with k = 0..gamma accepted drafts, against the capped geometric law at
    alpha = accepted / (accepted + rejected) (rounds that drafted fewer than gamma are left out).
    A tree run: the accepted path's length against ``specviz.theory.tree.path_length_distribution``."""
    title = "Accepted drafts per round"
    if trace.has_tree:
        return _tree_histogram_figure(trace, title)
    gamma = theory.typical_gamma(trace)
    counts = theory.accepted_per_round(trace, gamma)
    alpha = trace.alpha
    if not counts or alpha is None or not gamma:
        return _empty(title, "no full rounds yet")
    ks = list(range(gamma + 1))
    share = [counts.count(k) / len(counts) for k in ks]
    predicted = theory.accepted_drafts_distribution(alpha, gamma)
    fig = go.Figure(
        [
            go.Bar(
                x=ks,
                y=share,
                name=_measured_rounds(len(counts), len(trace.rounds)),
                marker_color=BLUE,
                hovertemplate=f"%{{y:.2f}} of the {len(counts)} rounds that drafted all {gamma} (of "
                              f"{len(trace.rounds)} in the run)<extra></extra>",
            ),
            go.Scatter(
                x=ks,
                y=predicted,
                name=f"predicted from alpha = {alpha:.2f}",
                mode="lines+markers",
                line=dict(color=THEORY, width=2, dash="dash"),
                marker=dict(size=8),
            ),
        ]
    )
    fig.update_xaxes(dtick=1)
    return style_figure(fig, title, "accepted drafts in the round", "share of rounds")


def position_figure(trace: Trace) -> go.Figure:
    """Acceptance rate by draft position (vLLM's per-position metric): the share of rounds
    whose i-th draft was accepted, against alpha^i with alpha = accepted / (accepted + rejected)."""
    if trace.has_tree:  # a tree's positions are its depths, offered several children each
        from specviz.views.tree import depth_figure

        return depth_figure(trace, names=["measured: accepted / offered"])
    title = "Acceptance by draft position"
    by_pos = theory.acceptance_by_position(trace)
    alpha = trace.alpha
    if not by_pos or alpha is None:
        return _empty(title, "no drafts yet")
    xs = list(range(1, len(by_pos) + 1))
    fig = go.Figure(
        [
            go.Bar(
                x=xs,
                y=[a / n for n, a in by_pos],
                name="measured: accepted / rounds",
                marker_color=BLUE,
                customdata=[[a, n] for n, a in by_pos],
                hovertemplate="position %{x}: %{customdata[0]} of %{customdata[1]} rounds<extra></extra>",
            ),
            go.Scatter(
                x=xs,
                y=[theory.position_acceptance(alpha, i) for i in xs],
                name=f"predicted alpha^i (alpha = {alpha:.2f})",
                mode="lines+markers",
                line=dict(color=THEORY, width=2, dash="dash"),
            ),
        ]
    )
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(range=[0, 1.05])
    return style_figure(fig, title, "draft position i in the round", "acceptance rate")


def sweep_figure(sweep: Sweep | None) -> go.Figure:
    """Measured tokens per round and the whole-run tok/s ratio (speculative / its baseline's, prefill included: what
    a sweep point keeps) for each gamma of a sweep, against Eq. (1) and Thm 3.8 with the sweep's pooled alpha and c,
    and each point's prediction with its own measured verify cost v."""
    title = "Gamma sweep: measurement vs theory"  # short enough for a phone; the drafter and schedule go below it
    if sweep is None or not sweep.points:
        return _empty(title, "press “Run gamma sweep” to measure gamma = 1..8")
    alpha, c = sweep.alpha, sweep.cost_coefficient
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("tokens per round", "speedup (predicted) and tok/s ratio (measured)"),
        horizontal_spacing=0.1,
    )
    gs = [p.gamma for p in sweep.points]
    if alpha is not None:
        curve = list(range(1, max(gs) + 1))
        fig.add_trace(
            go.Scatter(
                x=curve,
                y=[theory.expected_tokens_per_round(alpha, g) for g in curve],
                mode="lines",
                name=f"Eq. (1), alpha {alpha:.2f}",
                line=dict(color=THEORY, dash="dash"),
            ),
            row=1,
            col=1,
        )
    fig.add_trace(
        go.Scatter(
            x=gs,
            y=[p.tokens_per_round for p in sweep.points],
            mode="markers",
            name="measured tokens per round",
            marker=dict(size=10, color=MEASURED, symbol="circle"),
        ),
        row=1,
        col=1,
    )
    if alpha is not None and c is not None:
        _curve(fig, alpha, c, row=1, col=2, up_to=max(gs))
        with_v = [
            (p.gamma, theory.predicted_speedup_with_verify_cost(alpha, p.gamma, c, v))
            for p in sweep.points
            for v in [sweep.verify_cost(p)]
            if v is not None
        ]
        if with_v:
            fig.add_trace(
                go.Scatter(
                    x=[g for g, _ in with_v],
                    y=[y for _, y in with_v],
                    mode="lines+markers",
                    name="with each gamma's measured verify cost",
                    line=dict(color=VERIFY, dash="dash"),
                    marker=dict(size=7),
                ),
                row=1,
                col=2,
            )
    # A sweep point keeps its run's totals, not its rounds' times: its measurement is the whole-run tok/s ratio (prefill
    # included), named for what it divides, not the decoding speedup the headline shows.
    fig.add_trace(
        go.Scatter(
            x=gs,
            y=[sweep.speedup(p) for p in sweep.points],
            mode="markers",
            name=SWEEP_RATIO,
            marker=dict(size=11, color=MEASURED, symbol="diamond"),
        ),
        row=1,
        col=2,
    )
    fig.update_xaxes(title_text="gamma", dtick=1)
    fig = style_figure(fig, title, None, None)
    # The legend below both x axes' titles, in pixels (a share of the plot's height put it over them).
    if sweep.drafter or sweep.schedule:
        fig.update_layout(title_subtitle=dict(text=sweep_label(sweep), font=dict(size=12, color="#555")))
    fig.update_layout(legend=dict(xanchor="center", x=0.5), margin=dict(t=TOOLBAR_PX + 70))
    return legend_room(fig, 260)


def sweep_note(sweep: Sweep | None) -> str:
    """The line beside the sweep button for a shown run (plain text): the run's own sweep, or what the
    button does. A run or a loaded recording replaces whatever an earlier sweep left there."""
    if sweep is None or not sweep.points:
        return (
            "Same prompt, seed, sampling, drafter and gamma schedule (the page's controls); one baseline, "
            "then each gamma in turns with a baseline of its own."
        )
    gammas = ", ".join(str(p.gamma) for p in sweep.points)
    return (f"This run's sweep ({sweep_label(sweep)}): gamma {gammas}, {len(sweep.points)} "
            f"point{'s' * (len(sweep.points) != 1)}.")


def sweep_label(sweep: Sweep) -> str:
    """The sweep's drafter and schedule in words, plain text: "prompt lookup, heuristic gamma schedule".
    Sweeps saved before they were recorded ran the drafter model with a constant gamma."""
    from specviz.records.kinds import LABELS

    kind, schedule = sweep.drafter or "model", sweep.schedule or "constant"
    return f"{LABELS.get(kind, kind)}, {'constant gamma' if schedule == 'constant' else f'{schedule} gamma schedule'}"


def alpha_html(trace: Trace, table: bool = True) -> str:
    """Two estimates of Leviathan's alpha side by side, with their denominators, and why they agree.

    accepted / (accepted + rejected) counts verdicts; mean beta averages beta = sum_x min(p, q)
    over the same tested drafts. Both estimate alpha = E[beta] (Leviathan et al. 2023, Def. 3.1,
    Cor. 3.6): a tested draft at a position is accepted with probability beta there.
    ``table=False`` gives the explanation alone, for a page whose stats table already holds the rows.
    """
    tested = trace.accepted + trace.rejected
    rows = [
        ("alpha from verdicts", trace.alpha, f"accepted / tested = {trace.accepted} / {tested}"),
        ("mean beta", trace.mean_beta, f"mean of Σ min(p, q) over the same {tested} tested drafts"),
        (
            "draft acceptance rate",
            trace.acceptance_rate,
            f"accepted / drafted = {trace.accepted} / {trace.drafted}: not alpha, "
            "its denominator counts drafts discarded after a rejection, never tested",
        ),
    ]
    cells = "".join(
        f'<tr><td style="padding:3px 10px 3px 0;color:#444;">{escape(name)}</td>'
        '<td style="padding:3px '
        f'10px;font-weight:600;font-variant-numeric:tabular-nums;">{"…" if value is None else f"{value:.3f}"}</td>'
        f'<td style="padding:3px 0;color:#666;font-size:12px;">{escape(note)}</td></tr>'
        for name, value, note in rows
    )
    why = (
        "Alpha from verdicts and mean beta both estimate Leviathan's alpha = E[beta]: a tested draft is accepted with "
        "probability "
        "beta = Σ min(p, q) at its position, so the verdicts count, coin flip by coin flip, what beta gives directly. "
        "Mean beta varies less, since it needs no coin flip; the two differ by sampling noise alone."
    )
    table_html = f'<table style="border-collapse:collapse;">{cells}</table>' if table else ""
    return (
        f'<div class="sv-alpha" style="font-size:14px;">{table_html}'
        f'<p style="color:#555;font-size:13px;margin:6px 0 0;">{escape(why)}</p></div>'
    )


# The what-if sliders' ranges (the Theory tab): alpha, gamma, c and v as a teacher moves them.
WHATIF = {"alpha": (0.0, 0.99, 0.01), "gamma": (1, MAX_GAMMA, 1), "c": (0.0, 1.0, 0.01), "v": (0.5, 4.0, 0.01)}
WHATIF_DEFAULT = {"alpha": 0.6, "gamma": 4, "c": 0.1, "v": 1.2}


def whatif_values(spec: Trace | None, baseline: Trace | None) -> dict[str, float]:
    """The what-if sliders' values for a run: its alpha, typical gamma, c and v where measured (clipped to the sliders'
    ranges, ``WHATIF``, and rounded to their steps), else ``WHATIF_DEFAULT``'s."""
    out = dict(WHATIF_DEFAULT)
    if spec is not None and baseline is not None and not spec.has_tree:
        from specviz.views.stats import summary, verify_cost_shown

        s = summary(spec, baseline)
        found = {"alpha": s["alpha"], "gamma": s["gamma"], "c": s["cost_coefficient"], "v": verify_cost_shown(s)}
        for key, value in found.items():
            if value is not None:
                lo, hi, step = WHATIF[key]
                out[key] = round(min(max(value, lo), hi) / step) * step  # on the slider's steps, as a slider shows it
                out[key] = int(out[key]) if isinstance(step, int) else round(out[key], 2)
    return out


def whatif_markdown(alpha: float, gamma: int, c: float, v: float) -> str:
    """The what-if's two predictions for the sliders' values, each with its formula and inputs (Markdown)."""
    tokens = theory.expected_tokens_per_round(alpha, gamma)
    speedup = theory.predicted_speedup_with_verify_cost(alpha, gamma, c, v)
    best = theory.optimal_gamma(alpha, c, MAX_GAMMA, v=v, gamma_measured=gamma)
    verdict = "faster than the target alone" if speedup > 1.0 else "no faster than the target alone"
    return (
        f"**E[tokens per round] = (1 − α^(γ+1)) / (1 − α) = {tokens:.2f}** (Leviathan et al. 2023, Eq. 1; "
        f"α {alpha:.2f}, γ {gamma}).  \n"
        f"**Predicted speedup = E[tokens per round] / (γ c + v) = {tokens:.2f} / ({gamma} × {c:.2f} + {v:.2f}) = "
        f"{speedup:.2f}×**: {verdict} (Thm 3.8 with a verify pass of v target steps). The best γ for these α, c "
        f"and v: {best}."
    )


def whatif_figure(
    alpha: float, gamma: int, c: float, v: float, spec: Trace | None = None, baseline: Trace | None = None
) -> go.Figure:
    """The predicted speedup over gamma = 1..MAX_GAMMA for the sliders' alpha, c and v (v given at the sliders'
    gamma, scaled as ``theory.verify_cost_at``), the sliders' gamma marked; with a finished chain run, its measured
    speedup at its gamma marked too (the headline's quantity, ``specviz.views.stats.summary``)."""
    gammas = list(range(1, MAX_GAMMA + 1))
    ys = [theory.predicted_speedup_with_verify_cost(alpha, g, c, theory.verify_cost_at(g, v, gamma)) for g in gammas]
    fig = go.Figure(
        go.Scatter(
            x=gammas,
            y=ys,
            mode="lines+markers",
            name=f"predicted (α {alpha:.2f}, c {c:.2f}, v {v:.2f} at γ {gamma})",
            line=dict(color=VERIFY, width=2),
            marker=dict(size=5),
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[gamma],
            y=[ys[gamma - 1]],
            mode="markers",
            name=f"your γ = {gamma}: {ys[gamma - 1]:.2f}×",
            marker=dict(symbol="star", size=16, color=PURPLE, line=dict(color="#333", width=1)),
        )
    )
    measured = None
    if spec is not None and baseline is not None and not spec.has_tree:
        from specviz.views.stats import summary

        s = summary(spec, baseline)
        measured, run_gamma = s["measured_speedup"], s["gamma"]
        if measured is not None and run_gamma:
            fig.add_trace(
                go.Scatter(
                    x=[run_gamma],
                    y=[measured],
                    mode="markers",
                    name=f"this run: measured speedup {measured:.2f}× ({s['measured_speedup_basis']}), γ {run_gamma}",
                    marker=dict(symbol="diamond", size=13, color=MEASURED),
                )
            )
    fig.add_hline(
        y=1.0,
        line=dict(color="#999", dash="dot"),
        annotation_text="no speedup",
        annotation_position="bottom right",
        annotation=dict(bgcolor="rgba(255,255,255,0.9)", font=dict(size=13, color="#666")),
    )
    fig.update_yaxes(range=[0, max(ys + [measured or 0.0, 1.0]) * 1.2])
    return style_figure(
        fig,
        "What if? The predicted speedup for your α, c and v",
        "gamma (drafted tokens per round)",
        "predicted speedup",
    )
