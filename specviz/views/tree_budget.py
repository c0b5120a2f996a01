"""The auto tree's lesson, drawn: predicted speedup against the node budget on this device, and the
acceptance by depth and sibling rank it was chosen from (``specviz.theory.sequoia``).

Pure functions: the figure of a choice's description (``specviz.measure.auto_tree.AutoTree.describe``,
plain JSON data), and the table of tree traces' counts. Every number shown carries its denominator.
"""

from __future__ import annotations

from html import escape

import plotly.graph_objects as go

from specviz.theory.sequoia import acceptance_by_rank
from specviz.trace import Trace
from specviz.views.charts import BLUE, ORANGE, VERMILLION, style_figure

TREE, CHAIN, MEASURED = BLUE, ORANGE, VERMILLION


def budget_figure(choice: dict, measured: dict | None = None) -> go.Figure:
    """Predicted speedup of the fastest tree of at most n nodes, n = 1, 2, ... (a line); the best
    chain (a point at n = gamma, and its level dashed); the chosen shape (a star); and, after a run,
    its measured speedup at its measured nodes per round (``measured``: {"nodes_per_round", "speedup"}).

    ``choice``: an ``AutoTree.describe()`` dict (keys ``speedup_by_budget``, ``best_chain``, ``nodes``,
    ``predicted_speedup``, ``chosen``)."""
    fig = go.Figure()
    points = choice.get("speedup_by_budget") or []
    fig.add_trace(go.Scatter(x=[n for n, _ in points], y=[s for _, s in points], mode="lines", name="best tree within n nodes (predicted)",
                             line=dict(color=TREE, width=2)))
    chain = choice["best_chain"]
    fig.add_trace(go.Scatter(x=[chain["gamma"]], y=[chain["predicted_speedup"]], mode="markers", name=f"best chain, gamma {chain['gamma']} (predicted)",
                             marker=dict(color=CHAIN, size=10, symbol="diamond")))
    fig.add_hline(y=chain["predicted_speedup"], line=dict(color=CHAIN, dash="dash", width=1))
    fig.add_trace(go.Scatter(x=[choice["nodes"]], y=[choice["predicted_speedup"]], mode="markers", name=f"chosen: {choice['chosen']}",
                             marker=dict(color=TREE, size=14, symbol="star")))
    if measured and measured.get("speedup") is not None:
        fig.add_trace(go.Scatter(x=[measured["nodes_per_round"]], y=[measured["speedup"]], mode="markers", name="measured",
                                 marker=dict(color=MEASURED, size=10, symbol="x")))
    return style_figure(fig, "Predicted speedup against the node budget on this device", "nodes verified per round (n)",
                        "speedup = E[tokens per round] / (drafting + v(n))")


def rank_table_html(*traces: Trace) -> str:
    """An HTML table: per depth d (rows) and sibling rank k (columns), accepted / offered and the rate
    (the reached nodes of depth d - 1 with at least k children, and those whose k-th child was
    accepted); "" when no trace has a tree round."""
    counts = acceptance_by_rank(*traces)
    if not counts:
        return ""
    ranks = max(len(row) for row in counts)
    head = "".join(f"<th>rank {k}</th>" for k in range(1, ranks + 1))
    rows = []
    for d, row in enumerate(counts, start=1):
        cells = "".join(f"<td>{a} / {o} ({a / o:.2f})</td>" if o else "<td>-</td>" for o, a in row)
        cells += "<td></td>" * (ranks - len(row))
        rows.append(f"<tr><th>depth {d}</th>{cells}</tr>")
    caption = escape("Acceptance by depth and sibling rank: accepted / offered (rate)")
    return f"<table class='sv-rank-table'><caption>{caption}</caption><tr><th></th>{head}</tr>{''.join(rows)}</table>"
