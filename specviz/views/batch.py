"""The Batch view: a batch's rows as lanes, round by round, and throughput against batch size.

Each lane is one row (one prompt); each column one round of the batch, in which every row still
in the batch drafted and was verified in the same target pass. A cell shows what that row got:
its tested drafts (accepted, or the rejected one struck through) and its correction or bonus
token, coloured as in the main output, then grey boxes for the draft slots it left as padding
(it drafted fewer than the widest row). A row that is done leaves the batch: its lane ends.
"""

from __future__ import annotations

import re

import statistics
from html import escape

import plotly.graph_objects as go

from specviz.records.batch import BatchPoint
from specviz.trace import STOPPED
from specviz.views.charts import AUTOREGRESSIVE, SPECULATIVE, VERMILLION, style_figure
from specviz.views.scroll import scroll_x
from specviz.views.tokens import round_spans

# What the Batch tab measures: tokens/s over whole batches, prefill included (``BatchPoint``), so its ratio is named
# for what it divides, not "speedup" (the page's one speedup leaves the prefill out: ``specviz.views.stats``).
RATIO = "tok/s ratio, speculative / batched autoregressive decoding"

_PAD = ('<span title="padding: a draft slot this row did not use (the batch is as wide as its widest row)" '
        'style="display:inline-block;width:0.8em;height:1em;margin:0 1px;vertical-align:middle;'
        'background:repeating-linear-gradient(45deg,#ddd,#ddd 2px,#f6f6f6 2px,#f6f6f6 4px);border-radius:2px;"></span>')


def batch_lanes_html(result, speedup: BatchPoint | None = None, stopped: str = "stopped") -> str:
    """Lanes of a ``specviz.engine.batch.BatchResult`` (None: a prompt to press Run). A row its caller
    stopped early (``specviz.engine.stopping``) says ``stopped`` (what stopped it, in words) beside its counts."""
    if result is None:
        return (
            '<div class="sv-batch" style="color:#666;">Press Run batch: the prompts above are decoded together, one '
            "target pass per round for the whole batch, and each row appears as a lane.</div>"
        )
    traces = result.traces
    nth = [0] * len(traces)
    columns = []  # per batch round: {row: cell html}
    for active in result.rounds:
        rounds = {b: traces[b].rounds[nth[b]] for b in active}
        widest = max(len(r.drafts) for r in rounds.values())
        cells = {}
        for b, r in rounds.items():
            pad = _PAD * (widest - len(r.drafts))
            eos = frozenset(traces[b].settings.get("eos_token_id") or ())
            cells[b] = "".join(round_spans(nth[b], r, one_line=True, eos=eos)) + pad
            nth[b] += 1
        columns.append(cells)
    head = "".join(f'<th style="padding:2px 6px;color:#666;font-weight:400;">{k + 1}</th>' for k in range(len(columns)))
    body = []
    for b, trace in enumerate(traces):
        start = _own_words(trace.prompt_text).replace("\n", "\u23ce")
        start = start if len(start) <= 28 else start[:27] + "\u2026"
        label = (
            f"row {b + 1} <span style='color:#444;font-weight:400;'>{escape(start)}</span><br>"
            f"<span style='color:#666;font-size:11px;font-weight:400;'>{len(trace.output_ids)} tokens, "
            f"{len(trace.rounds)} rounds, "
            f"{escape(stopped if trace.stop_reason == STOPPED else (trace.stop_reason or '').replace('_', ' '))}</span>"
        )
        cells = "".join(
            f'<td style="padding:3px 4px;border-left:1px solid #eee;white-space:pre;vertical-align:top;">{col[b]}</td>'
            if b in col
            else '<td style="background:#fafafa;border-left:1px solid #eee;"></td>'
            for col in columns
        )
        prompt = escape(_own_words(trace.prompt_text)[:200])
        body.append(
            '<tr><th style="text-align:left;padding:3px 8px;white-space:nowrap;vertical-align:top;" '
            f'title="{prompt}">{label}</th>'
            f"{cells}</tr>"
        )
    s = result.summary()
    numbers = (
        f"{s['rows']} rows, {s['tokens']} tokens in {len(result.rounds)} batch rounds ({s['target_passes']} target "
        "passes, "
        f"prefill included); padding: {s['padded_positions']} of {s['positions']} target positions "
        f"({100 * s['padding_share']:.0f} %); {s['tokens_per_s']:.1f} tokens/s over the batch"
    )
    if speedup is not None and speedup.speedups:
        spread = speedup.speedups
        numbers += (
            f"; {RATIO} {statistics.median(spread):.2f}× (median of {len(spread)} runs: "
            f"{', '.join(f'{x:.2f}×' for x in spread)}; whole batches, prefill included, so not Generate's "
            "decoding speedup)"
        )
    # The lanes are as wide as the batch has rounds: they scroll inside their box, whose edges shade
    # where more rounds lie (specviz.views.scroll), and the line above says how many there are.
    lanes = scroll_x(
        '<table style="border-collapse:collapse;"><thead><tr><th style="padding:2px '
        f'8px;text-align:left;">round</th>{head}</tr>'
        f'</thead><tbody>{"".join(body)}</tbody></table>',
        cls="sv-tokens sv-scroll",
        style="max-height:520px;border:1px solid #ddd;border-radius:8px;"
        "font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:13px;color:#111;",
    )
    hint = (
        f'<div style="font-size:12px;color:#666;margin-bottom:4px;">{len(columns)} batch rounds, one column each'
        "; wider than the box, the lanes scroll sideways, and a shaded edge marks more rounds</div>"
    )
    return (
        f'<div class="sv-batch"><div style="font-size:13px;margin-bottom:6px;">{escape(numbers)}</div>'
        f'{hint}{lanes}</div>'
    )


def batch_figure(points: list[BatchPoint] | None) -> go.Figure:
    """Tokens/s over the batch against batch size, speculative and autoregressive (a marker per
    run), with their tok/s ratio (median of the runs' ratios, prefill included) on a second axis."""
    fig = go.Figure()
    points = sorted(points or [], key=lambda p: p.batch_size)
    sizes = [p.batch_size for p in points]
    for name, attr, colour in (
        ("speculative", "speculative", SPECULATIVE),
        ("autoregressive", "autoregressive", AUTOREGRESSIVE),
    ):
        xs = [p.batch_size for p in points for _ in getattr(p, attr)]
        ys = [v for p in points for v in getattr(p, attr)]
        medians = [statistics.median(getattr(p, attr)) if getattr(p, attr) else None for p in points]
        fig.add_trace(go.Scatter(x=sizes, y=medians, mode="lines", line=dict(color=colour), name=f"{name} (median)"))
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="markers",
                marker=dict(color=colour, size=7),
                name=f"{name} (each run)",
                hovertemplate="batch %{x}: %{y:.1f} tokens/s<extra></extra>",
            )
        )
    speed = [statistics.median(p.speedups) if p.speedups else None for p in points]
    fig.add_trace(
        go.Scatter(
            x=sizes,
            y=speed,
            mode="lines+markers",
            yaxis="y2",
            line=dict(color=VERMILLION, dash="dot"),
            name="tok/s ratio, median of the runs (right axis)",
            hovertemplate="batch %{x}: %{y:.2f}×<extra></extra>",
        )
    )
    fig.update_layout(
        xaxis=dict(type="log", tickvals=sizes or [1, 2, 4, 8], ticktext=[str(s) for s in (sizes or [1, 2, 4, 8])]),
        yaxis2=dict(overlaying="y", side="right", title="tok/s ratio (×)", rangemode="tozero", showgrid=False),
        yaxis=dict(rangemode="tozero"),
    )
    return style_figure(
        fig, "Throughput against batch size", "batch size (rows decoded together)", "tokens/s over the batch"
    )


def _own_words(prompt_text: str) -> str:
    """The visitor's own words in a prompt wrapped in a chat template (the last user turn of a
    ChatML "<|im_start|>user ... <|im_end|>" block); the text itself, stripped, when there is none.
    Every row of a chat pair's batch starts with the same system turn, so its start names no row."""
    turns = re.findall(r"<\|im_start\|>user\s*(.*?)(?:<\|im_end\|>|$)", prompt_text, flags=re.S)
    return (turns[-1] if turns else prompt_text).strip()
