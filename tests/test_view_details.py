"""The details a class meets in the views, each checked without a browser: which quantity a number
is, what a missing baseline shows, axis ticks, labels set off the curves, tables with no empty
columns, and the hints that a box scrolls. The browser tests check the same pages drawn."""

from __future__ import annotations

import re

import pytest

from specviz import Sampling, autoregressive_generate, speculative_generate
from specviz.recording import Recording
from specviz.measure.speedup import SpeedupEstimate, estimate
from specviz.views import round_html, speedup_figure, stats_html, summary, sweep_figure
from specviz.views.batch import batch_lanes_html
from specviz.views.charts import TOOLBAR_PX, acceptance_figure
from specviz.views.compare import compare_figure, compare_html
from specviz.views.scroll import scroll_x
from specviz.measure.sweep import sweep_stream
from tests.conftest import tiny_lm


@pytest.fixture(scope="module")
def runs():
    drafter, target = tiny_lm(vocab=16, layers=1, seed=1, init=0.3), tiny_lm(vocab=16, layers=2, seed=2, init=0.3)
    kw = dict(sampling=Sampling(1.0), max_new_tokens=60, seed=3)
    spec = speculative_generate([1, 2, 3], drafter, target, gamma=4, **kw)
    base = autoregressive_generate([1, 2, 3], target, **kw)
    sweep = None
    for sweep in filter(None, sweep_stream([1, 2, 3], drafter, target, gammas=(1, 2), **kw)):
        pass
    return spec, base, sweep


def _value(html: str, key: str) -> str:
    return re.search(rf'data-key="{re.escape(key)}">([^<]*)<', html).group(1)


def test_the_decoding_speedup_is_the_ratio_of_decoding_times_with_the_stretches_spread():
    """The headline is the two runs' decoding times over the same tokens (prefill excluded), which a round's
    tokens over its time in steps of the target alone add up to; the middle half of the stretches is its
    spread. The whole-run ratio carries the prefills and may lie outside (1.03x against 1.06-1.33x was seen)."""
    est = SpeedupEstimate(speedup=0.9, windows=[1.4, 1.0, 1.3, 1.2, 1.1, 0.6, 1.25, 1.15], low=0, high=0)
    assert est.decode_speedup == pytest.approx(1.175)  # without a decoding ratio (older estimates): the median
    from tests.test_speedup import _trace

    # A slow prefill on the speculative side (two models) pulls the whole run below every stretch.
    spec = _trace("speculative", [(4, 10.0)] * 4 + [(4, 14.0)] * 4, prefill=200.0)
    base = _trace("autoregressive", [(1, 5.0)] * 32, prefill=50.0)
    est = estimate(spec, base, windows=2)
    assert est.speedup < est.low  # prefill included: outside the decoding spread
    assert est.decode_speedup == pytest.approx(32 * 5.0 / (4 * 10.0 + 4 * 14.0))
    assert est.low <= est.decode_speedup <= est.high
    html = stats_html(spec, base)
    assert _value(html, "speedup") == f"{est.decode_speedup:.2f}×"
    assert f"interquartile range {est.low:.2f}–{est.high:.2f}× (the middle half" in html and "prefill excluded" in html
    assert _value(html, "whole-run tok/s ratio") == f"{est.speedup:.2f}×"
    s = summary(spec, base)
    assert s["decode_speedup_low"] <= s["decode_speedup"] <= s["decode_speedup_high"]


def test_a_run_without_a_baseline_says_so_instead_of_loading(runs):
    spec, _, _ = runs
    html = stats_html(spec)  # a notebook's trace, or a run stopped before its baseline finished
    assert "…" not in html and "needs the autoregressive baseline" in html
    assert _value(html, "speedup") == "–" and _value(html, "alpha") == f"{spec.alpha:.2f}"
    assert "…" not in spec._repr_html_()
    streaming = stats_html(spec, pending=True)  # the baseline is still running: numbers to come
    assert _value(streaming, "speedup") == "…" and "needs the autoregressive" not in streaming


def test_the_bonus_tokens_table_has_no_empty_columns(runs):
    spec, _, _ = runs
    for i, r in enumerate(spec.rounds):
        table = re.search(r'<table class="sv-top".*?</table>', round_html(spec, i), re.S)
        if table is None:
            continue
        heads = re.findall(r"<th[^>]*>(.*?)</th>", table.group(0))
        rows = re.findall(r'<tr class="sv-top-row.*?</tr>', table.group(0), re.S)
        # the last column is the "sampled" mark; every other heading names its column
        assert all(h for h in heads[:-1]), heads
        assert len(heads) == (5 if r.final_kind == "correction" else 3)
        for row in rows:
            spans = sum(int(c) if c else 1 for c in re.findall(r'<td(?: colspan="(\d)")?', row))
            assert spans == len(heads)


def test_draft_positions_are_whole_numbers_on_the_compare_axis(runs):
    spec, base, _ = runs

    class Comparison:
        runs = {"model": (spec, base)}

    fig = compare_figure(Comparison())
    assert fig.layout.xaxis.dtick == 1 and fig.layout.xaxis.tick0 == 1
    assert "interquartile range" in compare_html(Comparison()) or len(estimate(spec, base).windows) < 2


def test_theory_labels_are_set_off_the_curves(runs):
    spec, base, sweep = runs
    for fig in (speedup_figure(spec, base), sweep_figure(sweep)):
        assert not any("text" in (t.mode or "") for t in fig.data)  # no label drawn at its point, on the line
        labels = [a for a in fig.layout.annotations if a.showarrow]
        assert labels and all(a.ay and a.bgcolor for a in labels)
    texts = [a.text for a in speedup_figure(spec, base).layout.annotations]
    assert any(t.startswith("optimal γ") for t in texts) and any(t.startswith("measured") for t in texts)


def test_titles_sit_below_the_chart_toolbar(runs):
    spec, base, sweep = runs
    for fig in (acceptance_figure(spec), speedup_figure(spec, base), sweep_figure(sweep)):
        title = fig.layout.title
        assert title.yref == "container" and title.y == 1 and title.pad.t == TOOLBAR_PX
        assert fig.layout.margin.t >= TOOLBAR_PX + 40


def test_wide_boxes_show_that_they_scroll(runs):
    spec, _, _ = runs
    box = scroll_x("<table></table>")
    assert "overflow-x:auto" in box and box.count("radial-gradient") == 2 and "local" in box
    assert round_html(spec, 0).count("radial-gradient") >= 1

    class Batch:
        traces = [spec, spec]
        rounds = [[0, 1]] * len(spec.rounds)

        def summary(self):
            return dict(rows=2, tokens=2 * len(spec.output_ids), target_passes=len(spec.rounds) + 1, padded_positions=0,
                        positions=1, padding_share=0.0, tokens_per_s=1.0)

    html = batch_lanes_html(Batch())
    assert "radial-gradient" in html and f"{len(spec.rounds)} batch rounds" in html and "scroll sideways" in html


def test_exported_file_lays_figures_out_for_any_width(runs):
    from specviz.views.export import export_html

    spec, base, sweep = runs
    html = export_html(Recording(spec, base, sweep))
    assert "minmax(min(100%, 420px), 1fr)" in html and "auto-fill" in html  # one column on a phone, no sideways scroll
    assert "ResizeObserver" in html and "relayout" in html  # figures follow their box, not only the window
    assert "sv-tip" in html  # a tapped token's details stay inside the window


def test_small_items_a_class_tripped_on(runs):
    """Issue 52, item 8: "All 1 drafts were accepted"; a one-round chart with round ticks at 0.6-1.4; the time axis
    in ms (5k, 10k)."""
    from dataclasses import replace

    from specviz.views import timeline_figure

    spec, base, _ = runs
    bonus = next(i for i, r in enumerate(spec.rounds) if r.final_kind == "bonus" and r.drafts)
    one = replace(spec, rounds=[replace(spec.rounds[bonus], drafts=spec.rounds[bonus].drafts[:1])])
    assert "The one draft was accepted" in round_html(one, 0) and "All 1 drafts" not in round_html(one, 0)
    assert re.search(r"All \d+ drafts were accepted", round_html(spec, bonus)) or len(spec.rounds[bonus].drafts) == 1
    fig = acceptance_figure(one)
    assert fig.layout.xaxis.dtick == 1 and fig.layout.xaxis.tick0 == 1 and fig.layout.xaxis.tickformat == "d"
    timeline = timeline_figure(spec, base)
    assert timeline.layout.xaxis.title.text == "wall time (s)"
    assert max(timeline.data[0].x) == pytest.approx(spec.rounds[-1].end_ms / 1000.0)


def test_a_tree_round_lists_its_rejected_siblings_with_q_p_and_u():
    """Issue 52, item 4: a tree round listed only its accepted path; the rejected siblings' q, p and u appeared only on
    hover in the tree figure. The table now lists them beneath the path, each with its test."""
    from specviz.engine.tree.loop import tree_generate
    from specviz.engine.tree.spec import TreeSpec

    drafter, target = tiny_lm(vocab=16, layers=1, seed=1, init=0.3), tiny_lm(vocab=16, layers=2, seed=2, init=0.3)
    trace = tree_generate(
        [1, 2, 3], drafter, target, TreeSpec.static((3, 2, 1)), sampling=Sampling(1.0), max_new_tokens=24, seed=3
    )
    shown = 0
    for i, r in enumerate(trace.rounds):
        rejected = [n for n in r.tree.nodes if n.verdict == "rejected"]
        html = round_html(trace, i)
        assert html.count('class="sv-draft-row"') == len(r.drafts) + len(rejected)
        for node in rejected:
            assert f"u = {node.u:.3f} ≥ {node.accept_prob:.3f}" in html and f"depth {node.depth}, under" in html
            shown += 1
        if rejected:
            assert "Rejected siblings" in html
    assert shown  # the run had rejected siblings to show


def test_a_greedy_round_shows_no_u_that_decides_nothing():
    """Issue 52, item 8: greedy, q and p are one-hot and a draft is kept when it is the target's argmax; the replay
    showed a u beside each test all the same."""
    drafter, target = tiny_lm(vocab=16, layers=1, seed=1, init=0.3), tiny_lm(vocab=16, layers=2, seed=2, init=0.3)
    spec = speculative_generate([1, 2, 3], drafter, target, gamma=4, sampling=Sampling(0.0), max_new_tokens=24, seed=3)
    pages = [round_html(spec, i) for i in range(len(spec.rounds))]
    assert not any("u = " in html for html in pages)
    assert any("greedy: the target's argmax: kept" in html for html in pages) or not spec.accepted
    if spec.rejected:
        assert any("not the target's argmax" in html for html in pages)


def test_a_tree_round_with_fewer_nodes_than_its_shape_says_why():
    """Issue 52, item 4: the menu said "3-2-2-1 (33 nodes)" while round 1 had 11, unexplained. Top-p leaves the
    tiny drafter's q few tokens with mass, so its rounds grow fewer nodes than the shape; the round says so."""
    from specviz.engine.tree.loop import tree_generate
    from specviz.engine.tree.spec import TreeSpec

    drafter, target = tiny_lm(vocab=16, layers=1, seed=1, init=0.3), tiny_lm(vocab=16, layers=2, seed=2, init=0.3)
    spec = TreeSpec.static((3, 2, 2, 1))
    trace = tree_generate(
        [1, 2, 3], drafter, target, spec, sampling=Sampling(1.0, top_p=0.5), max_new_tokens=20, seed=3
    )
    most = trace.settings["tree"]["nodes"]
    fewer = [i for i, r in enumerate(trace.rounds) if len(r.tree.nodes) < most]
    assert fewer, "top-p 0.5 should leave some round short of the shape"
    for i, r in enumerate(trace.rounds):
        html = round_html(trace, i)
        assert (f"{len(r.tree.nodes)} of the shape&#x27;s {most} nodes" in html) == (i in fewer), i


def test_every_token_class_has_a_colour_and_a_legend_entry():
    """A token from p in a round that drafted nothing (prompt lookup with nothing to copy) was uncoloured and missing
    from the legend: every class a token can have is coloured and in it."""
    from specviz.trace import Round
    from specviz.views.tokens import LEGEND, STYLES, legend_html, round_spans

    classes = set(STYLES) - {"prompt"}
    assert {k for k, _ in LEGEND} == classes and all(STYLES[k] for k in classes)
    legend = legend_html()
    assert all(STYLES[k] in legend for k in classes) and "no draft" in legend
    empty = Round(
        drafts=[],
        emitted_ids=[7],
        final_token_id=7,
        final_text="x",
        final_kind="target",
        final_prob=0.4,
        draft_ms=0.0,
        verify_ms=1.0,
        end_ms=1.0,
    )
    (span,) = round_spans(0, empty)
    assert STYLES["target"] in span and "no draft" in span
