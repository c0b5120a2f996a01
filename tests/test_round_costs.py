"""The per-round latency picture draws the run's own numbers: each round's drafting, verifying and the rest in ms,
adding up to the round's wall time, and the target alone's time for the same tokens from the baseline."""

from __future__ import annotations

import pytest

from specviz.recording import Recording
from specviz.ui.page.defaults import RECORDINGS
from specviz.views.charts import round_costs_figure, round_times, target_alone_ms


@pytest.fixture(scope="module")
def rec() -> Recording:
    return Recording.load(RECORDINGS / "sampled-gamma8.json")


def test_the_bars_are_the_rounds_own_times(rec):
    spec = rec.speculative
    fig = round_costs_figure(spec, rec.baseline)
    drafting, verifying, rest, alone = fig.data
    assert list(drafting.y) == [r.draft_ms for r in spec.rounds]
    assert list(verifying.y) == [r.verify_ms for r in spec.rounds]
    before = spec.prefill_ms
    for r, d, v, o in zip(spec.rounds, drafting.y, verifying.y, rest.y):
        # the three parts stack to the round's wall time (the rest is never negative; ms, to float rounding)
        assert d + v + o == pytest.approx(max(r.end_ms - before, d + v), abs=1e-6)
        before = r.end_ms
    assert list(drafting.x) == list(range(1, len(spec.rounds) + 1))


def test_the_mark_is_the_target_alone_for_the_rounds_tokens(rec):
    spec, base = rec.speculative, rec.baseline
    step = (base.rounds[-1].end_ms - base.prefill_ms) / sum(len(r.emitted_ids) for r in base.rounds)
    assert target_alone_ms(base) == pytest.approx(step)
    alone = round_costs_figure(spec, base).data[3]
    assert list(alone.y) == pytest.approx([step * len(r.emitted_ids) for r in spec.rounds])
    assert f"{step:.1f} ms a token" in alone.name
    from specviz.views.charts import VERMILLION

    assert alone.marker.color == VERMILLION  # the red mark the title names


def test_without_a_baseline_only_the_bars(rec):
    fig = round_costs_figure(rec.speculative, None)
    assert len(fig.data) == 3 and target_alone_ms(None) is None
    assert len(round_times(rec.speculative)) == len(rec.speculative.rounds)

