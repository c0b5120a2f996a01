"""The page's package without a server: the request object, the keyed outputs, the sweep's drafter
and schedule (fast; the endpoints themselves are driven in test_app.py and test_abuse.py)."""

from __future__ import annotations

import json

import pytest

from specviz import Sampling, speculative_generate
from specviz.drafters import make_drafter
from specviz.recording import Recording
from specviz.engine.schedules import make_schedule
from specviz.measure.sweep import sweep_stream
from tests.conftest import tiny_lm


@pytest.fixture(scope="module")
def models():
    return tiny_lm(vocab=16, layers=1, seed=1, init=0.3), tiny_lm(vocab=16, layers=2, seed=2, init=0.3)


def test_the_sweep_runs_the_drafter_kind_and_schedule_it_is_given(models):
    """Each point is the run of that drafter and schedule at its gamma (same counts as a single run),
    and the sweep names both; it survives a recording's round trip, and the figure is labelled."""
    drafter_model, target = models
    kw = dict(sampling=Sampling(1.0), max_new_tokens=30, seed=3)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    ngram = make_drafter("ngram", target=target)
    items = list(sweep_stream(prompt, ngram, target, gammas=(1, 3), schedule="heuristic", **kw))
    sweep = items[-1]
    # None after every step of every run (a device step each on a server), the sweep after the baseline and each gamma
    assert [i for i in items if i is not None] == [sweep] * 3 and items.count(None) > 30
    assert (sweep.drafter, sweep.schedule) == ("ngram", "heuristic")
    for point in sweep.points:
        single = speculative_generate(prompt, make_drafter("ngram", target=target), target, gamma=point.gamma,
                                      schedule=make_schedule("heuristic", point.gamma), **kw)
        assert (point.drafted, point.accepted, point.rounds) == (single.drafted, single.accepted, len(single.rounds))
    rec = Recording(single, None, sweep)
    back = Recording.from_json(rec.to_json())
    assert (back.sweep.drafter, back.sweep.schedule) == ("ngram", "heuristic")
    from specviz.views import sweep_figure

    assert "prompt lookup, heuristic gamma schedule" in json.dumps(sweep_figure(back.sweep).to_plotly_json())


def test_a_sweep_naming_markup_is_refused(models):
    drafter_model, target = models
    kw = dict(sampling=Sampling(1.0), max_new_tokens=8, seed=3)
    sweep = None
    drafter = make_drafter("model", drafter_model=drafter_model)
    for sweep in filter(None, sweep_stream([1, 2, 3], drafter, target, gammas=(2,), **kw)):
        pass
    single = speculative_generate([1, 2, 3], make_drafter("model", drafter_model=drafter_model), target, gamma=2, **kw)
    d = json.loads(Recording(single, None, sweep).to_json())
    d["sweep"]["drafter"] = '<a href="http://x">model</a>'
    with pytest.raises(ValueError, match="sweep.drafter") as err:
        Recording.from_json(json.dumps(d))
    assert "<a" not in str(err.value)
