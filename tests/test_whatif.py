"""The Theory tab's what-if: the sliders' prediction is the theory's own arithmetic, and "Set to this run" puts the
sliders at the run's measured alpha, gamma, c and v, with the run's measured speedup marked in the figure."""

from __future__ import annotations

import pytest

from specviz import theory
from specviz.recording import Recording
from specviz.ui.page.defaults import RECORDINGS
from specviz.views.stats import summary, verify_cost_shown
from specviz.views.theory import WHATIF, WHATIF_DEFAULT, whatif_figure, whatif_markdown, whatif_values


@pytest.fixture(scope="module")
def rec() -> Recording:
    return Recording.load(RECORDINGS / "sampled-gamma8.json")


@pytest.mark.parametrize("alpha, gamma, c, v", [(0.6, 4, 0.1, 1.2), (0.9, 8, 0.05, 1.0), (0.3, 2, 0.5, 2.5)])
def test_the_prediction_is_eq1_over_gamma_c_plus_v(alpha, gamma, c, v):
    tokens = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    speedup = tokens / (gamma * c + v)
    text = whatif_markdown(alpha, gamma, c, v)
    assert f"= {tokens:.2f}**" in text and f"= {speedup:.2f}×**" in text
    assert ("faster than the target alone" in text) == (speedup > 1) or "no faster" in text
    fig = whatif_figure(alpha, gamma, c, v)
    curve, mine = fig.data[0], fig.data[1]
    assert list(curve.x) == list(range(1, 17))
    assert curve.y[gamma - 1] == pytest.approx(speedup)  # at the sliders' gamma, v is the sliders' v
    assert list(mine.x) == [gamma] and mine.y[0] == pytest.approx(speedup)
    assert curve.y[0] == pytest.approx(
        theory.predicted_speedup_with_verify_cost(alpha, 1, c, theory.verify_cost_at(1, v, gamma))
    )


def test_set_to_this_run_takes_the_runs_own_numbers(rec):
    s = summary(rec.speculative, rec.baseline)
    values = whatif_values(rec.speculative, rec.baseline)
    measured = {"alpha": s["alpha"], "gamma": s["gamma"], "c": s["cost_coefficient"], "v": verify_cost_shown(s)}
    for k, x in measured.items():  # within the sliders' ranges, on their steps
        assert values[k] == pytest.approx(min(max(x, WHATIF[k][0]), WHATIF[k][1]), abs=WHATIF[k][2] / 2 + 1e-9)
    fig = whatif_figure(values["alpha"], values["gamma"], values["c"], values["v"], rec.speculative, rec.baseline)
    run = fig.data[2]
    assert list(run.x) == [s["gamma"]] and run.y[0] == pytest.approx(s["measured_speedup"])
    assert f"{s['measured_speedup']:.2f}×" in run.name


def test_without_a_run_the_defaults_and_no_measured_mark():
    assert whatif_values(None, None) == WHATIF_DEFAULT
    assert len(whatif_figure(**WHATIF_DEFAULT).data) == 2


def test_the_handler_refuses_a_fractional_gamma_and_sets_the_sliders(rec):
    gr = pytest.importorskip("gradio")
    from specviz.ui.tabs.whatif import whatif, whatif_from_run

    with pytest.raises(gr.Error):
        whatif(0.5, 2.5, 0.1, 1.0)
    out = whatif_from_run(rec)
    # on the slider's 0.01 steps
    assert out["whatif_gamma"]["value"] == 8 and out["whatif_alpha"]["value"] == pytest.approx(
        rec.speculative.alpha, abs=0.005
    )
    assert "E[tokens per round]" in out["whatif_note"]
