"""The Compare drafters view: each drafter kind's coloured output and numbers side by side."""

from __future__ import annotations

from html import escape

import plotly.graph_objects as go

from specviz import theory
from specviz.records.kinds import LABELS as DRAFTER_LABELS
from specviz.records.speedup import estimate
from specviz.views.charts import style_figure
from specviz.views.stats import SPEEDUP_DECODING, spread_words
from specviz.views.text import left_at_pace, run_label
from specviz.views.tokens import tokens_html

COLOURS = {
    "model": "#0072B2",
    "argmax": "#56B4E9",
    "ngram": "#009E73",
    "early-exit": "#CC79A7",
    "quantized": "#E69F00",
    "eagle": "#D55E00",
    "tree": "#F0E442",
    "cross-tokenizer": "#000000",
}
LABELS = {**DRAFTER_LABELS, "tree": "drafter model, token tree"}  # the drafters' table, and the tree beside the chain


def _num(value, digits: int = 2, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def _numbers(spec, baseline) -> list[tuple[str, str, str]]:
    # A run stopped before its baseline started has no baseline: no c and no speedup.
    c = theory.cost_coefficient(spec, baseline) if baseline is not None else None
    est = estimate(spec, baseline) if baseline is not None else None
    speed, spread = "–", ""
    # the decoding speedup and its spread: one quantity (specviz.records.speedup), in the stats' words
    if est is not None:
        speed = f"{est.decode_speedup:.2f}×"
        spread = "; " + spread_words(est.low, est.high, len(est.windows), len(spec.rounds), est.decode_speedup)
    masses = [d.shared_mass for r in spec.rounds for d in r.drafts if d.shared_mass is not None]
    shared = (
        [
            (
                "shared-vocabulary mass",
                _num(sum(masses) / len(masses), 3),
                f"mean over {len(masses)} drafts of the drafter's mass on the tokens both vocabularies share",
            )
        ]
        if masses
        else []
    )
    return shared + [
        (
            "tokens per round",
            _num(spec.mean_tokens_per_round),
            f"{len(spec.output_ids)} tokens / {len(spec.rounds)} rounds",
        ),
        ("alpha", _num(spec.alpha, 3), f"accepted / tested = {spec.accepted} / {spec.accepted + spec.rejected}"),
        (
            "draft acceptance rate",
            _num(spec.acceptance_rate, 3),
            f"accepted / drafted = {spec.accepted} / {spec.drafted}",
        ),
        ("cost coefficient c", _num(c, 3), "drafting ms per draft / target step ms"),
        (
            "speedup",
            speed,
            f"{SPEEDUP_DECODING} (Generate's headline quantity); in turns with its own baseline on this "
            f"machine{spread}",
        ),
    ]


def compare_html(
    comparison,
    kinds=None,
    tree: bool = False,
    stopped: str | None = None,
    asked: int | None = None,
    elapsed_s: float | None = None,
) -> str:
    """Columns, one per kind the comparison runs (``kinds``, default ``comparison.kinds``): its label,
    the numbers with their denominators, the coloured output (with ``tree``, a column for the drafter
    model's token tree beside its chain). A kind not finished yet says it is running; once the
    comparison was ``stopped`` (how, in words: "by you", "at its time limit of 180 s"), the kind it
    stopped says how far its run got, and the kinds after it that they were not run. ``asked``: the
    page's max new tokens; where the runs were given fewer (``specviz.ui.running.sizing``), a line under the
    columns says why their speedups are not Generate's. ``elapsed_s``: seconds since the comparison started; while
    kinds remain, a line above the columns says how many are done and about how long the rest take at that pace
    (``progress_line``)."""
    if comparison is None or not comparison.runs:
        return (
            '<div class="sv-compare" style="color:#666;">Press Compare: the prompt and settings of the page run with '
            'each '
            "drafter kind (drafter model, prompt lookup, early exit, quantized target, and the EAGLE head where one is "
            "trained for "
            "the target), each beside its own baseline.</div>"
        )
    kinds = kinds or getattr(comparison, "kinds", None) or tuple(LABELS)
    cols = []
    for kind in kinds:
        if kind not in comparison.runs:
            doing = f"not run: the comparison was stopped {escape(stopped)}" if stopped else "running…"
            cols.append(
                f'<div class="sv-compare-col" style="flex:1 1 300px;min-width:0;color:#888;">{LABELS[kind]}: '
                f'{doing}</div>'
            )
            continue
        spec, baseline = comparison.runs[kind]
        cut = _cut_short(spec, baseline, stopped)
        rows = "".join(
            f'<tr><td style="padding:2px 6px;">{escape(name)}</td><td style="padding:2px '
            f'6px;font-weight:600;">{escape(value)}</td>'
            f'<td style="padding:2px 6px;color:#666;font-size:12px;">{escape(note)}</td></tr>'
            for name, value, note in _numbers(spec, baseline)
        )
        cols.append(
            '<div class="sv-compare-col" style="flex:1 1 300px;min-width:0;border-top:4px solid '
            f'{COLOURS[kind]};padding-top:6px;">'
            f'<b>{escape(LABELS[kind])}</b><div style="color:#555;font-size:12px;">{escape(run_label(spec))}</div>{cut}'
            f'<table style="border-collapse:collapse;margin:6px 0;font-size:13px;">{rows}</table>'
            f'<div style="max-height:360px;overflow:auto;">{tokens_html(spec, show_prompt=False)}</div></div>'
        )
    progress = progress_line(sum(k in comparison.runs for k in kinds), len(kinds), elapsed_s) if not stopped else ""
    return (
        progress
        + f'<div class="sv-compare" style="display:flex;flex-wrap:wrap;gap:16px;">{"".join(cols)}</div>'
        + _versus_generate(comparison, asked)
    )


def progress_line(done: int, total: int, elapsed_s: float | None) -> str:
    """ "k of K kinds done in T s; about R s left at that pace" while kinds remain (R: the mean time of a kind done
    so far, its baseline included, times the kinds left); "" when all are done or nothing is timed yet."""
    left = left_at_pace(done, total, elapsed_s)
    if not left:
        return ""
    return (
        f'<p class="sv-compare-progress" style="color:#555;font-size:13px;margin:0 0 6px;">{done} of {total} kinds '
        'done in '
        f"{elapsed_s:.0f} s; {left} (each kind runs beside its own baseline).</p>"
    )


def _versus_generate(comparison, asked: int | None) -> str:
    """Why a kind's speedup here differs from Generate's headline for the same prompt and seed: fewer tokens."""
    given = max((r[0].settings.get("max_new_tokens") or 0 for r in comparison.runs.values()), default=0)
    if not asked or not given or given >= asked:
        return ""
    return (
        f'<p class="sv-compare-note" style="color:#555;font-size:13px;">Each kind decoded at most {given} tokens here, '
        'not '
        f"the page's {asked}: what fits this comparison's time for every kind on this CPU. A shorter text has its own "
        "acceptance and a larger share of start-up, so its speedup is not Generate's for the same prompt and seed: "
        f"compare the kinds with each other here; Generate measures the {asked} tokens.</p>"
    )


def _cut_short(spec, baseline, how: str | None) -> str:
    """A line saying how far a run stopped before its end got (empty for a finished run)."""
    if "stopped" not in (spec.stop_reason, getattr(baseline, "stop_reason", None)):
        return ""
    asked = spec.settings.get("max_new_tokens")
    of = f" of {asked}" if asked else ""
    base = f"its baseline {len(baseline.output_ids)}" if baseline is not None else "its baseline had not started"
    return (
        f'<div style="color:#a33;font-size:12px;">Stopped {escape(how or "early")} after {len(spec.output_ids)}{of} '
        'tokens in '
        f"{len(spec.rounds)} rounds ({escape(base)}): the numbers below are of those rounds.</div>"
    )


def compare_figure(comparison) -> go.Figure:
    """Acceptance by draft position (rounds whose i-th draft was accepted / rounds that drafted an
    i-th draft), one line per drafter kind."""
    fig = go.Figure()
    from specviz.theory.tree import acceptance_by_depth

    for kind, (spec, _) in comparison.runs.items() if comparison is not None else []:
        # A tree's position is its depth: rounds whose path reached it / rounds offered children there.
        counts = acceptance_by_depth(spec) if kind == "tree" else theory.acceptance_by_position(spec)
        fig.add_trace(
            go.Scatter(
                x=list(range(1, len(counts) + 1)),
                y=[a / n if n else None for n, a in counts],
                name=LABELS.get(kind, kind),
                mode="lines+markers",
                line=dict(color=COLOURS.get(kind)),
                customdata=[[a, n] for n, a in counts],
                hovertemplate="position %{x}: %{customdata[0]} / %{customdata[1]}<extra></extra>",
            )
        )
    fig.update_layout(yaxis=dict(range=[0, 1.05]))
    fig.update_xaxes(dtick=1, tick0=1)  # draft positions are whole numbers: no tick at 1.5
    return style_figure(
        fig, "Acceptance by draft position", "draft position in the round", "accepted / drafted at that position"
    )
