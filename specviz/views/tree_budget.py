"""The auto tree's lesson, drawn: predicted speedup against the node budget on this device, the chosen
tree, and the acceptance by depth and sibling rank it was chosen from (``specviz.theory.sequoia``).

Pure functions: of a choice's description (``specviz.engine.tree.auto.AutoTree.describe``, plain
JSON data) and of traces. Every number shown carries its denominator; every prediction its formula
and inputs.
"""

from __future__ import annotations

from html import escape

import plotly.graph_objects as go

from specviz.theory.sequoia import acceptance_by_rank, verify_cost_at
from specviz.trace import Trace
from specviz.views.charts import BLUE, GREEN, GREY, ORANGE, VERMILLION, legend_room, style_figure
from specviz.views.stats import speedup_formula, spread_words, summary

TREE, CHAIN, MEASURED, HAND = BLUE, ORANGE, VERMILLION, GREEN
MAX_RANKS_SHOWN = 6  # table columns; wider ranks are summed into the last ("rank 6+")

FORMULA = (
    "predicted speedup = E[tokens per round] / (depth × c_tree + v(n) + overhead(n)), with E[tokens per round] = "
    "1 + the sum over the tree's nodes of the product of p(depth, rank) along the path to each (Sequoia, Chen et al. "
    "2024), "
    "p(depth, rank) being the measured rate given that the child exists times the chance that it does (under top-p or "
    "top-k sampling the drafter's nucleus may hold fewer tokens than the shape asks); "
    "a chain's: gamma × c + v(gamma) + overhead(gamma). v(n) is the target's bare pass over n nodes; overhead(n) the "
    "rest "
    "of a round's time, judging included (the target's p at every node: under top-p a ranking of the most probable "
    "tokens per node), "
    "a line through the calibration chain's and tree's rounds where they were run (left out where the calibration was "
    "teacher-forced). "
    "Costs are in target steps (one autoregressive step = 1)."
)


def measured_point(spec: Trace | None, baseline: Trace | None) -> dict | None:
    """This run's point for the budget figure: nodes drafted per round, tokens per round (emitted / rounds,
    the bonus or correction token included), and the speedup, the headline's (``specviz.views.stats.summary``:
    autoregressive decoding time / speculative decoding time over the same tokens, prefill excluded), with its
    basis and its spread in the stats table's words ("spread"); None without rounds."""
    if spec is None or not spec.rounds:
        return None
    rounds = len(spec.rounds)
    point = {
        "rounds": rounds,
        "drafted": spec.drafted,
        "emitted": len(spec.output_ids),
        "nodes_per_round": spec.drafted / rounds,
        "tokens_per_round": len(spec.output_ids) / rounds,
        "speedup": None,
        "basis": None,
        "spread": "",
    }
    if baseline is not None:
        s = summary(spec, baseline)
        point.update(
            speedup=s["measured_speedup"],
            basis=s["measured_speedup_basis"],
            spread=spread_words(
                s["decode_speedup_low"], s["decode_speedup_high"], s["decode_stretches"], rounds, s["measured_speedup"]
            )
            if s["measured_speedup_basis"] == "decoding"
            else "",
        )
    return point


def budget_figure(choice: dict, measured: dict | None = None) -> go.Figure:
    """Predicted speedup of the best tree of n nodes, n = 1, 2, ... (a line that rises while a node buys
    more than it costs, then falls); the chain of every gamma (a line, gamma nodes); the hand-made shapes
    (points); the chosen shape (a star); and, after a run, its measured speedup at its measured nodes per
    round (``measured``: {"nodes_per_round", "speedup"}).

    ``choice``: an ``AutoTree.describe()`` dict."""
    fig = go.Figure()
    if choice.get("by_budget"):
        points = [(c["budget"], c["speedup"]) for c in choice["by_budget"]]
        name = "best tree of n nodes"
    else:  # an older description: the fastest tree within n nodes
        points = [tuple(p) for p in choice.get("speedup_by_budget") or []]
        name = "best tree within n nodes"
    fig.add_trace(
        go.Scatter(
            x=[n for n, _ in points],
            y=[s for _, s in points],
            mode="lines",
            name=f"{name} (predicted)",
            line=dict(color=TREE, width=2),
            hovertemplate="n = %{x}: %{y:.2f}x<extra></extra>",
        )
    )
    chains = choice.get("chains") or []
    if chains:
        fig.add_trace(
            go.Scatter(
                x=[c["nodes"] for c in chains],
                y=[c["speedup"] for c in chains],
                mode="lines+markers",
                name="chain of gamma = n drafts (predicted)",
                line=dict(color=CHAIN, width=2, dash="dot"),
                marker=dict(size=6),
                hovertemplate="gamma %{x}: %{y:.2f}x<extra></extra>",
            )
        )
    chain = choice["best_chain"]
    fig.add_trace(
        go.Scatter(
            x=[chain["gamma"]],
            y=[chain["predicted_speedup"]],
            mode="markers",
            name=f"best chain, gamma {chain['gamma']}",
            marker=dict(color=CHAIN, size=12, symbol="diamond", line=dict(width=1, color="#111")),
        )
    )
    for h in choice.get("hand_made") or []:
        fig.add_trace(
            go.Scatter(
                x=[h["nodes"]],
                y=[h["speedup"]],
                mode="markers+text",
                name=f"{h['label']} ({h['nodes']} nodes, predicted)",
                text=[h["label"].removeprefix("tree ")],
                textposition="top center",
                marker=dict(color=HAND, size=10, symbol="square"),
            )
        )
    fig.add_trace(
        go.Scatter(
            x=[choice["nodes"]],
            y=[choice["predicted_speedup"]],
            mode="markers",
            name=f"chosen: {choice['chosen']}",
            marker=dict(
                color=TREE if choice.get("kind") == "tree" else CHAIN,
                size=18,
                symbol="star",
                line=dict(width=1, color="#111"),
            ),
        )
    )
    if measured and measured.get("speedup") is not None:
        fig.add_trace(
            go.Scatter(
                x=[measured["nodes_per_round"]],
                y=[measured["speedup"]],
                mode="markers",
                name="this run, measured (nodes drafted per round, its speedup)",
                marker=dict(color=MEASURED, size=12, symbol="x"),
            )
        )
    fig.add_hline(y=1.0, line=dict(color=GREY, width=1))
    style_figure(
        fig,
        "Predicted speedup against the node budget on this device",
        "nodes verified per round (n)",
        "speedup over autoregressive",
    )
    return legend_room(fig, 340)


def placeholder_figure(text: str) -> go.Figure:
    """A short empty figure whose title says why it is empty."""
    fig = style_figure(go.Figure(), text, None, None)
    fig.update_layout(height=140)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def why_sentence(choice: dict) -> str:
    """One sentence on why this device wants this size: the chosen tree against the best tree of about twice
    its nodes (and v(n) at both), or, where a chain won, against the best tree; from the description's
    predictions and measured v(n)."""
    curve = {int(n): float(v) for n, v in (choice.get("inputs", {}).get("verify_cost_by_nodes") or {}).items()}
    where = choice.get("device") or "this device"
    by = {c["budget"]: c for c in choice.get("by_budget") or []}
    chain = choice["best_chain"]
    if not curve or not by:
        return ""

    def v(n):
        return verify_cost_at(curve, n)

    if choice.get("kind") != "tree":
        best = max(by.values(), key=lambda c: c["speedup"])
        return (
            f"On this {where}, the best tree ({best['nodes']} nodes, depth {best['depth']}) would bring "
            f"{best['tokens_per_round']:.2f} tokens per round against the chain's "
            f"{chain['predicted_tokens_per_round']:.2f}, "
            f"but cost {best['cost']:.2f} target steps a round against {chain['predicted_cost']:.2f} "
            f"(v({best['nodes']}) = {v(best['nodes']):.2f}, v({chain['gamma']}) = {v(chain['gamma']):.2f}): "
            f"predicted {best['speedup']:.2f}x against {chain['predicted_speedup']:.2f}x, so the chain of gamma "
            f"{chain['gamma']} wins."
        )
    n = choice["nodes"]
    larger = [m for m in by if m > n]
    if not larger:
        return (
            f"On this {where}, v(n) stays low up to the largest budget weighed: v(1) = {v(1):.2f}, v({n}) = {v(n):.2f} "
            "target steps, "
            f"so every node still buys more than it costs and the {n}-node tree wins "
            f"(predicted {choice['predicted_speedup']:.2f}x, the best chain {chain['predicted_speedup']:.2f}x)."
        )
    m = min(larger, key=lambda k: abs(k - 2 * n))
    big = by[m]
    return (
        f"On this {where}, v(n) climbs from {v(n):.2f} at n = {n} to {v(m):.2f} target steps at n = {m}: "
        f"the best {m}-node tree would add {big['tokens_per_round'] - choice['predicted_tokens_per_round']:.2f} tokens "
        "per round "
        f"({choice['predicted_tokens_per_round']:.2f} → {big['tokens_per_round']:.2f}) for "
        f"{big['cost'] - choice['predicted_cost']:.2f} more target steps a round ({choice['predicted_cost']:.2f} → "
        f"{big['cost']:.2f}), "
        f"predicted {big['speedup']:.2f}x against {choice['predicted_speedup']:.2f}x, so the {n}-node tree wins "
        f"(the best chain, gamma {chain['gamma']}: {chain['predicted_speedup']:.2f}x)."
    )


def auto_note_markdown(choice: dict | None, measured: dict | None, run_label: str = "") -> str:
    """The section's text: for an auto run, the sentence on why, the prediction against this run's
    measurement (with denominators), the formula and its measured inputs; otherwise how to get it."""
    if choice is None:
        ran = f"This run drafted {run_label}. " if run_label else ""
        return (
            f"{ran}Choose **auto: fastest for this device** under *token tree* and Generate: a short calibration on "
            "held-out prompts "
            "measures the drafter's acceptance by depth and sibling rank and this device's verify cost v(n), then "
            "picks the tree "
            "(or chain) with the most predicted tokens per unit of time, and this section draws the prediction against "
            "the node budget."
        )
    lines = [
        f"**Chosen: {escape(choice['chosen'])}** — predicted {choice['predicted_tokens_per_round']:.2f} tokens per "
        "round at "
        f"{choice['predicted_cost']:.2f} target steps a round, {choice['predicted_speedup']:.2f}x.",
        "",
    ]
    if choice["predicted_speedup"] < 1.0:  # the best shape weighed still loses: say so first, in plain words
        lines = [
            f"**No shape pays here: predicted {choice['predicted_speedup']:.2f}x at best** "
            f"({escape(choice['chosen'])}, "
            "the fastest of the trees and chains weighed): on this device and pair the target alone is faster, "
            "and the run below shows it.",
            "",
        ] + lines
    why = why_sentence(choice)
    if why:
        lines += [escape(why), ""]
    if measured:
        err = measured["tokens_per_round"] / choice["predicted_tokens_per_round"] - 1.0
        line = (
            f"This run: {measured['emitted']} tokens / {measured['rounds']} rounds = "
            f"**{measured['tokens_per_round']:.2f} tokens per round** "
            f"(predicted {choice['predicted_tokens_per_round']:.2f}, {err:+.0%}); {measured['drafted']} nodes / "
            f"{measured['rounds']} rounds = "
            f"{measured['nodes_per_round']:.1f} drafted per round"
        )
        if measured.get("speedup") is not None:
            basis = measured.get("basis")
            formula = speedup_formula(basis) + (
                ": the headline's" if basis != "whole run" else ": too few rounds for stretches"
            )
            line += (
                f"; speedup {measured['speedup']:.2f}× ({formula}"
                + (f"; {escape(measured['spread'])}" if measured.get("spread") else "")
                + ")"
            )
        lines += [
            line + ". One prompt is a small sample; the calibration's own prompts are held out from the page's.",
            "",
        ]
    inp = choice.get("inputs", {})
    curve = ", ".join(f"v({n}) = {v:.2f}" for n, v in (inp.get("verify_cost_by_nodes") or {}).items())
    lines.append(
        f"<small>{escape(FORMULA)} Inputs measured on {inp.get('calibration_prompts')} held-out prompts × "
        f"{inp.get('calibration_tokens')} tokens: c_tree = {inp.get('tree_pass_cost', 0):.3f} and c = "
        f"{inp.get('chain_step_cost', 0):.3f} "
        f"target steps per drafter pass; {curve}; one target step = {inp.get('target_step_ms', 0):.1f} ms; "
        "p(depth, rank) from the table below (a cell offered fewer than 20 times takes its rank's rate over all depths)"
        + (
            f"; the counts of {escape(inp['refined_with'])}, on the same prompts (run, or walked over the target's own "
            "text), replace the wide tree's where it measured them"
            if inp.get("refined_with")
            else ""
        )
        + ".</small>"
    )
    return "\n".join(lines)


def rank_counts_html(counts, caption: str) -> str:
    """An HTML table of ``sequoia.acceptance_by_rank`` counts: per depth d (rows) and sibling rank k (columns),
    accepted / offered and the rate; ranks past MAX_RANKS_SHOWN summed into the last column. "" without counts."""
    counts = [[(int(o), int(a)) for o, a in row] for row in counts or []]
    if not counts:
        return ""
    ranks = min(MAX_RANKS_SHOWN, max(len(row) for row in counts))
    wider = max(len(row) for row in counts) > MAX_RANKS_SHOWN
    head = "".join(f"<th>rank {k}{'+' if wider and k == ranks else ''}</th>" for k in range(1, ranks + 1))
    rows = []
    for d, row in enumerate(counts, start=1):
        if len(row) > ranks:
            row = row[: ranks - 1] + [(sum(o for o, _ in row[ranks - 1 :]), sum(a for _, a in row[ranks - 1 :]))]
        cells = "".join(f"<td>{a} / {o} ({a / o:.2f})</td>" if o else "<td>0 / 0</td>" for o, a in row)
        cells += "<td></td>" * (ranks - len(row))
        rows.append(f"<tr><th>depth {d}</th>{cells}</tr>")
    return ("<table "
            f"class='sv-rank-table'><caption>{escape(caption)}</caption><tr><th></th>{head}</tr>{''.join(rows)}</table>")


def rank_table_html(*traces: Trace) -> str:
    """``rank_counts_html`` of the traces' tree rounds (the reached nodes of depth d - 1 with at least k
    children, and those whose k-th child was accepted); "" when no trace has a tree round."""
    return rank_counts_html(
        acceptance_by_rank(*traces), "Acceptance by depth and sibling rank: accepted / offered (rate)"
    )


CALIBRATION_CAPTION = (
    "Calibration (what the choice used): at depth d, of the reached nodes offered a k-th child, how many "
    "had that child accepted — accepted / offered (rate)"
)
RUN_CAPTION = "This run: accepted / offered (rate), counted the same way over its tree rounds"


def tree_tables_html(choice: dict | None, spec: Trace | None) -> str:
    """The calibration's table (when there is a choice) and this run's (when it drafted trees)."""
    parts = []
    if choice is not None:
        parts.append(rank_counts_html(choice.get("inputs", {}).get("acceptance_by_rank"), CALIBRATION_CAPTION))
    if spec is not None:
        parts.append(rank_counts_html(acceptance_by_rank(spec), RUN_CAPTION))
    return "<div class='sv-rank-tables'>" + "".join(p for p in parts if p) + "</div>" if any(parts) else ""


def largest_round(spec: Trace | None) -> int | None:
    """The index of the tree round with the most nodes (the first of them): the whole chosen shape, as
    drafted; None without tree rounds."""
    if spec is None:
        return None
    sizes = [(len(r.tree.nodes), -i) for i, r in enumerate(spec.rounds) if r.tree is not None]
    return -max(sizes)[1] if sizes else None


def chosen_tree_figure(spec: Trace | None) -> go.Figure:
    """The chosen tree as this run drafted it (its largest round, ``specviz.views.tree.tree_figure``), or a
    placeholder that says why there is none."""
    from specviz.views.tree import tree_figure

    i = largest_round(spec)
    if i is None:
        return placeholder_figure("The tree: this run drafted a chain (no tree to draw)")
    fig = tree_figure(spec, i)
    r = spec.rounds[i]
    return fig.update_layout(
        title_text=f"The tree as drafted in round {i + 1}: {len(r.tree.nodes)} nodes, {len(r.tree.path)} accepted"
    )
