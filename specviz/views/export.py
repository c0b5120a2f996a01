"""One self-contained HTML file of a recording: it opens from disk in any modern browser, with no
server and no network (plotly.js is inlined, fonts are the system's).

It holds the coloured tokens (hover or tap for q, p, min(1, p/q) and u), the stats, the round-by-round replay (buttons,
and the arrow keys; a token tree run draws each round's tree), the charts, the theory figures and the sweep when the
recording has one. Every part is one of specviz's views, so the file shows what the page shows; every string from the
recording is escaped by those views.

``rec`` below is a ``specviz.recording.Recording``, read by its fields (speculative, baseline, sweep, title):
the views sit below the recording and do not import it.
"""

from __future__ import annotations

import functools
import json
from html import escape

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.utils import PlotlyJSONEncoder

from specviz.theory import target_step_ms
from specviz.views.charts import FIT_SCRIPT, acceptance_figure, round_costs_figure, timeline_figure
from specviz.views.replay import round_html
from specviz.views.stats import stats_html
from specviz.views.theory import accepted_histogram_figure, alpha_html, position_figure, speedup_figure, sweep_figure
from specviz.views.scroll import scroll_x
from specviz.views.tree import tree_figure, verify_cost_figure
from specviz.views.verdict import headline_html, verdict
from specviz.views.tokens import TIP_CSS, TIP_SCRIPT, legend_html, tokens_html

# Figures sit in a grid of columns at least 420 px wide (one column on a phone: min(100%, ...)
# keeps a narrow screen from scrolling sideways); auto-fill keeps the columns' width whether one
# figure or all are drawn yet.
_STYLE = (
    """
body {
  font-family: ui-sans-serif, system-ui, sans-serif; max-width: 1200px; margin: 24px auto; padding: 0 16px; color: #111;
}
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
.sv-figs { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 420px), 1fr)); gap: 12px; }
.sv-figs > div, .sv-fig { min-width: 0; }
.sv-round { display: none; } .sv-round.sv-shown { display: block; }
.sv-controls { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; margin: 8px 0; }
.sv-controls button { font-size: 14px; padding: 4px 12px; }
"""
    + TIP_CSS
)

_SCRIPT = (
    """
(function () {
  const rounds = document.querySelectorAll('.sv-round');
  const label = document.getElementById('sv-round-label');
  let i = 0;
  const treeData = document.getElementById('sv-tree-data');
  const trees = treeData ? JSON.parse(treeData.textContent) : null;
  const treeBox = document.getElementById('sv-tree');
  function show(k) {
    i = Math.max(0, Math.min(rounds.length - 1, k));
    rounds.forEach((r, j) => r.classList.toggle('sv-shown', j === i));
    label.textContent = 'round ' + (i + 1) + ' of ' + rounds.length;
    if (trees && treeBox) {
      const fig = trees[i];
      treeBox.style.display = fig ? 'block' : 'none';
      if (fig) Plotly.react(treeBox, fig.data, Object.assign({}, fig.layout, {autosize: true, width: null}),
                            {displaylogo: false, responsive: true});
    }
  }
  document.getElementById('sv-prev').onclick = () => show(i - 1);
  document.getElementById('sv-next').onclick = () => show(i + 1);
  document.addEventListener('keydown', (e) => {
    if (e.key === 'ArrowLeft') show(i - 1);
    if (e.key === 'ArrowRight') show(i + 1);
  });
  show(0);
})();
"""
    + FIT_SCRIPT
    + TIP_SCRIPT
)


# What an exported page costs, per part, in bytes: fitted over eleven exports of chain and tree runs
# of 22 to 108 rounds on a tiny pair (within 3.2 % of every one: 14.6 kB per round, 1.66 kB per
# chain draft, 0.98 kB per tree node, 12.5 bytes per character of token text at its worst, markup
# characters that escaping lengthens), then rounded up, so the estimate errs large.
_PAGE_BYTES = 64 * 1024  # the page's own text, styles and scripts, beside plotly.js
_ROUND_BYTES = 16 * 1024  # a speculative round: its replay, its points in the charts (and a tree's figure frame)
_BASELINE_ROUND_BYTES = 512  # a baseline round: its points in the timeline
_DRAFT_BYTES = 2 * 1024  # a chain's draft: its token, tip, replay row
_NODE_BYTES = 1200  # a token tree's node: its marker and text in the round's figure, its replay row
_SIBLING_BYTES = 2 * 1024  # a tree's rejected sibling: its row in the replay's table, as a chain's draft
_SIBLINGS_NOTE_BYTES = 512  # the line above a tree round's rejected siblings
_CHAR_BYTES = 14  # a character of token text, escaped, in the places it appears


def export_units(rec) -> int:
    """The parts an export renders one by one: the rounds of both runs and what each speculative round
    drafted, a chain's drafts or every node of its token tree (a tree round's ``drafts`` hold only its
    accepted path, so they undercount the tree the page draws)."""
    spec, base = rec.speculative, rec.baseline
    return len(spec.rounds) + sum(r.drafted_count for r in spec.rounds) + (len(base.rounds) if base is not None else 0)


def _text_chars(rec) -> int:
    """Characters of token text in both runs (drafts, tree nodes, final tokens and their top tokens)."""
    return sum(
        len(r.final_text or "")
        + sum(len(d.text or "") for d in r.drafts)
        + sum(len(x.text or "") for x in r.final_top)
        + (sum(len(n.text or "") for n in r.tree.nodes) if r.tree is not None else 0)
        for t in (rec.speculative, rec.baseline)
        if t is not None
        for r in t.rounds
    )


def export_bytes(rec) -> int:
    """The size ``export_html(rec)`` would have, in bytes (UTF-8), estimated from counts alone (no
    rendering; linear in the rounds), with the per-part costs above: it errs large."""
    spec, base = rec.speculative, rec.baseline
    nodes = sum(len(r.tree.nodes) for r in spec.rounds if r.tree is not None)
    drafts = sum(len(r.drafts) for r in spec.rounds if r.tree is None)
    siblings = [r.tree.rejected for r in spec.rounds if r.tree is not None]
    return (
        _plotly_js_bytes()
        + _PAGE_BYTES
        + _ROUND_BYTES * len(spec.rounds)
        + _DRAFT_BYTES * drafts
        + _NODE_BYTES * nodes
        + _SIBLING_BYTES * sum(siblings)
        + _SIBLINGS_NOTE_BYTES * sum(1 for n in siblings if n)
        + _BASELINE_ROUND_BYTES * (len(base.rounds) if base is not None else 0)
        + _CHAR_BYTES * _text_chars(rec)
    )


@functools.cache
def _plotly_js_bytes() -> int:
    return len(get_plotlyjs().encode())


def _figure(fig: go.Figure, elem_id: str) -> str:
    """The figure drawn to fill its box's width (``autosize``; FIT_SCRIPT redraws it when the box changes)."""
    fig = go.Figure(fig).update_layout(autosize=True, width=None)
    html = fig.to_html(
        full_html=False,
        include_plotlyjs=False,
        div_id=elem_id,
        default_width="100%",
        config={"displaylogo": False, "responsive": True},
    )
    return f'<div class="sv-fig">{html}</div>'


def _scroll_wide(html: str) -> str:
    """A table wider than a phone (the numbers with their notes) scrolls inside its own box."""
    return scroll_x(html)


def _trees(spec, base) -> tuple[str, list[str]]:
    """For a token tree run: the replay's tree box with every round's figure as JSON data (the script
    draws the shown round's), and the v(n) figure when there is a baseline. Plotly's JSON holds the
    token text already escaped (``specviz.views.tree.escape``); every ``<`` is written ``\\u003c`` (the
    same string to JSON) so nothing in it can close or confuse the script element."""
    if not spec.has_tree:
        return "", []
    figs = [tree_figure(spec, i).to_plotly_json() if r.tree is not None else None for i, r in enumerate(spec.rounds)]
    data = json.dumps(figs, cls=PlotlyJSONEncoder).replace("<", "\\u003c")
    box = f'<div id="sv-tree" class="sv-fig"></div><script type="application/json" id="sv-tree-data">{data}</script>'
    measured = base is not None and target_step_ms(base)
    extra = [_figure(verify_cost_figure(base, spec, names=["this run"]), "sv-verify-cost")] if measured else []
    return box, extra


def _verdict_sentence(spec, base) -> str:
    """The recording's verdict as a paragraph: faster or slower than the target alone, and why (escaped)."""
    text = verdict(spec, base) or "This recording holds no autoregressive baseline, so it measures no speedup."
    return f'<p class="sv-verdict" style="color:#333;">{escape(text)}</p>'


def export_html(rec) -> str:
    """The recording as one HTML document (str), plotly.js inlined: about 5 MB.

    Raises nothing for a valid Recording; a recording without a baseline leaves out the figures
    that need one (they say so).
    """
    spec, base = rec.speculative, rec.baseline
    title = escape(rec.title or "specviz recording")
    rounds = "".join(
        f'<div class="sv-round" data-round="{i + 1}">{round_html(spec, i)}</div>' for i in range(len(spec.rounds))
    )
    figures = [
        _figure(acceptance_figure(spec), "sv-acceptance"),
        _figure(timeline_figure(spec, base), "sv-timeline"),
        _figure(round_costs_figure(spec, base), "sv-round-costs"),
        _figure(speedup_figure(spec, base), "sv-speedup"),
        _figure(accepted_histogram_figure(spec), "sv-histogram"),
        _figure(position_figure(spec), "sv-position"),
    ]
    tree_box, tree_figures = _trees(spec, base)
    figures += tree_figures
    sweep = f"<h2>Gamma sweep</h2>{_figure(sweep_figure(rec.sweep), 'sv-sweep')}" if rec.sweep is not None else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title><style>{_STYLE}</style><script>{get_plotlyjs()}</script></head>
<body>
<h1>{title}</h1>
<p>Speculative decoding, recorded by specviz: each draft accepted when u &lt; min(1, p/q), the first rejected one
replaced by a correction sampled from norm(max(0, p − q)), a bonus token from p when every draft is accepted.</p>
{headline_html(spec, base)}{_verdict_sentence(spec, base)}
{legend_html()}{tokens_html(spec)}
<h2>Numbers</h2>{_scroll_wide(stats_html(spec, base))}{alpha_html(spec, table=False)}
<h2>Round by round</h2>
<div class="sv-controls"><button id="sv-prev">◀ previous</button><span id="sv-round-label"></span>
<button id="sv-next">next ▶</button>
<span style="color:#666;font-size:13px;">(or the arrow keys)</span></div>
{rounds}{tree_box}
<h2>Charts and theory</h2><div class="sv-figs">{"".join(figures)}</div>
{sweep}
<script>{_SCRIPT}</script>
</body></html>
"""
