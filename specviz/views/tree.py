"""Token trees drawn and summarised: a round's tree, acceptance by depth, v against nodes.

Colours are the page's Okabe-Ito ones (``specviz.views.charts``, ``specviz.views.tokens``):
sky blue accepted, vermillion rejected, grey never tested, orange the correction token, bluish
green the bonus token. The accepted path is drawn bold; a rejected node also has a crossed marker,
so colour is never the only cue.
"""

from __future__ import annotations

from html import escape as _escape
from textwrap import wrap

import plotly.graph_objects as go

from specviz import theory as chain_theory
from specviz.trace import Round, Trace
from specviz.theory import tree as theory
from specviz.views.charts import BLUE, GREEN, GREY, ORANGE, SERIES, TOOLBAR_PX, VERMILLION, legend_room, style_figure
from specviz.views.tokens import _visible

VERDICT_COLOURS = {"accepted": BLUE, "rejected": VERMILLION, "discarded": GREY}
VERDICT_SYMBOLS = {"accepted": "circle", "rejected": "x", "discarded": "circle-open"}
def escape(text: str) -> str:
    """Token text for plotly: its < > & escaped so it is never read as plotly's markup; quotes stay
    (plotly shows &quot; as typed)."""
    return _escape(text, quote=False)


RULES = {
    "without-replacement": "recursive rejection sampling without replacement: distinct fixed children, accepted with "
                           "p'(x)",
    "with-replacement": "recursive rejection sampling with replacement (SpecInfer's multi-step rule): children drawn "
                        "from q, "
    "accepted with min(1, p'(x)/q(x))",
}


def _layout(r: Round) -> dict[int, tuple[float, float]]:
    """(x, y) per node (-1: the pending token): x the depth, leaves one row each in depth-first order,
    a parent at the middle of its children."""
    kids: dict[int, list[int]] = {}
    for i, n in enumerate(r.tree.nodes):
        kids.setdefault(n.parent, []).append(i)
    pos: dict[int, tuple[float, float]] = {}
    row = [0]

    def place(node: int, depth: int) -> float:
        children = kids.get(node, [])
        if not children:
            y = float(row[0])
            row[0] += 1
        else:
            ys = [place(c, depth + 1) for c in children]
            y = (min(ys) + max(ys)) / 2
        pos[node] = (float(depth), y)
        return y

    place(-1, 0)
    return pos


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.4f}"


def tree_figure(trace: Trace, index: int) -> go.Figure:
    """Round ``index`` (0-based) of a tree trace as a plotly figure: every node at its depth,
    coloured by verdict and labelled with its token and, once tested, its acceptance probability (the test: min(1,
    p'/q) with replacement, p' without), the accepted path bold, hover for p, q, p', the test and u, and the share
    of p the earlier siblings left (the residual's mass); under each node with children the drafter's
    entropy H(q) in bits there (``TreeNode.q_entropy``); the final token closes the path.

    Raises:
        IndexError: ``index`` outside the trace's rounds. ValueError: the round has no tree.
    """
    if not 0 <= index < len(trace.rounds):
        raise IndexError(f"round {index} of a trace with {len(trace.rounds)} rounds")
    r = trace.rounds[index]
    if r.tree is None:
        raise ValueError("this round drafted a chain, not a tree")
    tree, pos = r.tree, _layout(r)
    on_path = set(tree.path)
    fig = go.Figure()
    ex, ey, px, py = [], [], [], []
    for i, n in enumerate(tree.nodes):
        x0, y0 = pos[n.parent]
        x1, y1 = pos[i]
        xs, ys = (px, py) if i in on_path else (ex, ey)
        xs += [x0, x1, None]
        ys += [y0, y1, None]
    end = tree.path[-1] if tree.path else -1
    if r.final_token_id is not None:
        # A bonus closes a leaf: one depth further, on its row (no node can be there). A correction
        # comes where the end node's children were all rejected: half a depth out, where no node is.
        fx, fy = pos[end][0] + (0.5 if r.final_kind == "correction" else 1.0), pos[end][1]
        px += [pos[end][0], fx, None]
        py += [pos[end][1], fy, None]
    fig.add_trace(
        go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="#c8c8c8", width=1.2), hoverinfo="skip", showlegend=False)
    )
    fig.add_trace(
        go.Scatter(x=px, y=py, mode="lines", line=dict(color="#111", width=4), hoverinfo="skip", name="accepted path")
    )
    fig.add_trace(
        go.Scatter(
            x=[0],
            y=[pos[-1][1]],
            mode="markers+text",
            marker=dict(size=16, color="#555", symbol="square"),
            text=["pending"],
            textposition="top center",
            hovertemplate="the pending token: its children are depth 1<extra></extra>",
            showlegend=False,
        )
    )
    for verdict, label in (("accepted", "accepted"), ("rejected", "rejected"), ("discarded", "never tested")):
        idx = [i for i, n in enumerate(tree.nodes) if n.verdict == verdict]
        if not idx:
            continue
        hover = []
        for i in idx:
            n = tree.nodes[i]
            hover.append(
                escape(
                    f"“{_visible(n.text)}” (id {n.token_id}), depth {n.depth}: {label}\n"
                    f"p(x) = {n.p:.4f}   q(x) = {n.q:.4f}\np'(x) = {_fmt(n.p_residual)}   test = {_fmt(n.accept_prob)} "
                    f"  u = {_fmt(n.u)}\n"
                    f"share of p left by earlier siblings = {_fmt(n.mass)}"
                    + (
                        f"\ndrawn where the drafter's entropy H(q) = {n.q_entropy:.2f} bits"
                        if n.q_entropy is not None
                        else ""
                    )
                ).replace("\n", "<br>")
            )
        fig.add_trace(
            go.Scatter(
                x=[pos[i][0] for i in idx],
                y=[pos[i][1] for i in idx],
                mode="markers+text",
                name=label,
                marker=dict(
                    size=[20 if i in on_path else 14 for i in idx],
                    color=VERDICT_COLOURS[verdict],
                    symbol=VERDICT_SYMBOLS[verdict],
                    line=dict(
                        width=[3 if i in on_path else 1 for i in idx],
                        color="#111" if verdict == "accepted" else VERDICT_COLOURS[verdict],
                    ),
                ),
                # the accepted path's nodes say so in their label (a tick), beside the legend and the bold line
                # each tested node's acceptance probability beside its token, so the tree reads without hovering
                text=[
                    ("✓ " if verdict == "accepted" and i in on_path else "")
                    + (escape(_visible(tree.nodes[i].text)) or "␀")
                    + (f" · {tree.nodes[i].accept_prob:.2f}" if tree.nodes[i].accept_prob is not None else "")
                    for i in idx
                ],
                textposition=["top center" if i in on_path else "middle right" for i in idx],
                textfont=dict(family="ui-monospace, monospace", size=12),
                hovertext=hover,
                hoverinfo="text",
            )
        )
    _entropy_labels(fig, tree, pos)
    if r.final_token_id is not None:
        colour = {"correction": ORANGE, "bonus": GREEN}.get(r.final_kind or "", "#555")
        where = "last residual p'" if r.final_kind == "correction" else "p"
        fig.add_trace(
            go.Scatter(
                x=[fx],
                y=[fy],
                mode="markers+text",
                name=f"{r.final_kind} token",
                marker=dict(size=20, color=colour, symbol="diamond"),
                # a correction sits half a depth past the last accepted node, whose label is above: its own goes below
                text=[f"{r.final_kind}: " + (escape(_visible(r.final_text or "")) or "␀")],
                textposition="bottom center" if r.final_kind == "correction" else "top center",
                textfont=dict(family="ui-monospace, monospace", size=12),
                hovertext=[
                    escape(
                        f"{r.final_kind} token “{_visible(r.final_text or '')}”, sampled from {where}: probability "
                        f"{r.final_prob:.4f}"
                    )
                ],
                hoverinfo="text",
            )
        )
    rows = int(max(y for _, y in pos.values())) + 1
    fig.update_xaxes(title="depth", dtick=1, range=[-0.8, tree.depth + 1.8], zeroline=False)
    fig.update_yaxes(visible=False, range=[rows - 0.5, -0.5])
    # A short title that fits a phone's width; the rule below it in small type, wrapped (one long line was cut at the
    # right).
    title = f"Round {index + 1}: {len(tree.nodes)} nodes, {len(tree.path)} accepted"
    rule = f"depth {tree.depth}; {RULES.get(tree.rule, tree.rule)}"
    style_figure(fig, title, None, None)
    fig.update_layout(
        title_subtitle=dict(text="<br>".join(wrap(rule, 48)), font=dict(size=12, color="#555")),
        margin=dict(t=TOOLBAR_PX + 44 + 34),
        hoverlabel=dict(align="left"),
    )
    return legend_room(fig, max(160, 38 * rows + 40))  # a row clears a path label above its node


def _entropy_labels(fig: go.Figure, tree, pos: dict) -> None:
    """Under every node that has children (the pending token included), the drafter's entropy H(q) in
    bits at that node: how spread the distribution its children were drawn from was (``TreeNode.q_entropy``
    of its first child; siblings share it). Nothing for prompt lookup or recordings without it."""
    at: dict[int, float] = {}
    for n in tree.nodes:
        if n.q_entropy is not None:
            at.setdefault(n.parent, n.q_entropy)
    if not at:
        return
    fig.add_trace(
        go.Scatter(
            # a third of a row under the node: text alone has no marker to stand clear of, and drawn at the node the
            # marker hid it
            x=[pos[k][0] for k in at],
            y=[pos[k][1] + 0.34 for k in at],
            mode="text",
            name="H(q): drafter's entropy (bits)",
            text=[f"H {h:.2f}" for h in at.values()],
            textposition="middle center",
            textfont=dict(family="ui-monospace, monospace", size=10, color="#666"),
            hovertext=[
                f"the drafter's entropy where these children were drawn: H(q) = {h:.2f} bits" for h in at.values()
            ],
            hoverinfo="text",
        )
    )


def depth_figure(*traces: Trace, names: list[str] | None = None) -> go.Figure:
    """Acceptance by depth: per depth d, rounds whose path reached d / rounds offered children there,
    one bar group per trace (a chain's too)."""
    fig = go.Figure()
    for k, trace in enumerate(traces):
        counts = theory.acceptance_by_depth(trace)
        name = names[k] if names else f"run {k + 1}"
        fig.add_trace(
            go.Bar(
                x=list(range(1, len(counts) + 1)),
                y=[a / o if o else None for o, a in counts],
                name=name,
                marker_color=SERIES[k % 3],
                hovertext=[
                    f"{a} of {o} rounds offered children at depth {d + 1} accepted one"
                    for d, (o, a) in enumerate(counts)
                ],
                hoverinfo="text",
            )
        )
    fig.update_yaxes(range=[0, 1.05])
    return style_figure(fig, "Acceptance by depth (accepted / offered)", "depth", "share of rounds")


def verify_cost_figure(baseline: Trace, *traces: Trace, names: list[str] | None = None) -> go.Figure:
    """v against the drafted tokens the pass verified: each round's verify time / the baseline's mean
    target step, one marker per round, with the mean at each node count."""
    step = chain_theory.target_step_ms(baseline)
    fig = go.Figure()
    for k, trace in enumerate(traces):
        by_n = theory.verify_ms_by_nodes(trace)
        name = names[k] if names else f"run {k + 1}"
        fig.add_trace(
            go.Scatter(
                x=list(by_n),
                y=[ms / step for ms, _ in by_n.values()],
                mode="markers",
                name=name,
                marker=dict(size=10, color=SERIES[k % 3]),
                hovertext=[f"{n} nodes: mean of {c} rounds" for n, (_, c) in by_n.items()],
                hoverinfo="text+y",
            )
        )
    return style_figure(fig, "Verify cost v(n): target pass / target step", "drafted nodes verified", "v")
