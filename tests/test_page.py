"""The page's handlers without a server or a model: what the download holds after a sweep, what the
export box offers after a load, what the page says while a long job starts and when a sweep runs
out of time. The device halves are replaced by fakes that yield plain data, as the real ones do."""

from __future__ import annotations

import pytest

from specviz import Sampling, speculative_generate
from specviz.drafters import make_drafter
from specviz.measure.sweep import Sweep, SweepPoint
from specviz.recording import Recording
from specviz.ui.guard.limits import SWEEP_GAMMAS
from tests.conftest import tiny_lm


class Progress:
    """A stand-in for gr.Progress that records every call."""

    def __init__(self):
        self.calls = []

    def __call__(self, progress, desc=None, **kw):
        self.calls.append((progress, desc))


def _point(gamma: int) -> SweepPoint:
    accepted = 8 * gamma - 6  # 6 of the 8 rounds end in a rejection
    return SweepPoint(
        gamma=gamma,
        tokens=accepted + 8,
        rounds=8,
        drafted=8 * gamma,
        accepted=accepted,
        total_ms=400.0,
        draft_ms=50.0,
        rejected=6,
        verify_ms=300.0,
        baseline_tokens_per_second=30.0,
        drafter_passes=8 * gamma,
    )


def _sweeps(gammas):
    """What sweep_on_device yields: the growing sweep, first with the baseline alone, and None between (a step of a
    run)."""
    sweep = Sweep(baseline_tokens_per_second=30.0, target_step_ms=30.0, drafter="model", schedule="constant")
    yield None
    yield sweep
    for g in gammas:
        yield None
        sweep.points.append(_point(g))
        yield sweep


@pytest.fixture
def shown_run():
    target = tiny_lm(vocab=16, layers=2, seed=2, init=0.3)
    drafter = tiny_lm(vocab=16, layers=1, seed=1, init=0.3)
    spec = speculative_generate(
        [1, 2, 3],
        make_drafter("model", drafter_model=drafter),
        target,
        gamma=2,
        sampling=Sampling(1.0),
        max_new_tokens=6,
        seed=0,
    )
    return Recording(spec, None, None, "a run", "the prompt", True)


def _sweep(monkeypatch, rec, gammas, progress=None):
    import specviz.ui.tabs.sweep as page

    monkeypatch.setattr(page, "ensure_pair", lambda *a, **k: None)
    monkeypatch.setattr(page, "sweep_on_device", lambda req, stop=None, device_owner=None: _sweeps(gammas))
    return list(page.run_sweep("embedded", "def f():", 0.7, 40, 0.9, 16, 0, rec, progress=progress or Progress()))


def test_the_download_holds_a_sweep_run_after_generate(monkeypatch, shown_run):
    """README: the JSON download holds the trace, the baseline and the sweep. A sweep run after
    Generate writes a new download that holds it, and empties the HTML export made before it."""
    last = _sweep(monkeypatch, shown_run, SWEEP_GAMMAS)[-1]
    assert last["recording"].sweep is not None
    saved = Recording.load(last["download"].value["path"])
    assert [p.gamma for p in saved.sweep.points] == list(SWEEP_GAMMAS)
    assert saved.speculative.output_ids == shown_run.speculative.output_ids and saved.title == "a run"
    assert last["export_file"] is None


def test_a_sweep_with_no_run_shown_saves_nothing(monkeypatch):
    last = _sweep(monkeypatch, None, SWEEP_GAMMAS)[-1]
    assert "download" not in last and "recording" not in last


def test_loading_a_recording_empties_the_export_box():
    """The export box offered the previous run's HTML after another recording was loaded: every
    output of a loaded (or finished, or stopped) run now empties it."""
    from specviz.ui.tabs.files import examples, load_example
    from specviz.ui.page.outputs import RUN_OUTPUTS

    assert "export_file" in RUN_OUTPUTS
    out = load_example(examples()[0])
    assert "export_file" in out and out["export_file"] is None


def test_a_resident_pairs_loaded_message_gives_way_to_what_runs(monkeypatch):
    """ "english is loaded - 100.0%" stood 4-12 s over a sweep, comparison or batch while nothing
    loaded: after the pair is ready, the job's own words replace it, with no bar."""
    import specviz.ui.running.pairs as pairs

    monkeypatch.setattr(
        pairs, "load_pair", lambda progress=None, **ids: progress(1.0, "english is loaded") or "the pair"
    )
    progress = Progress()
    assert pairs.ensure_pair("english", "", "", progress, "Sweep: the baseline…") == "the pair"
    assert progress.calls[-1] == (None, "Sweep: the baseline…")


@pytest.mark.parametrize("job", ["sweep", "compare", "batch"])
def test_a_long_job_says_what_runs_before_its_first_measurement(monkeypatch, job):
    """The first thing a sweep, a comparison or a batch shows, at once, is what it is running;
    the same words stand in the progress line (no device work has started)."""
    import importlib

    page = importlib.import_module(f"specviz.ui.tabs.{job}")
    progress = Progress()
    monkeypatch.setattr(page, "ensure_pair", lambda *a, **k: progress(None, desc=a[4]))
    monkeypatch.setattr(
        page, f"{job}_on_device", lambda *a, **k: pytest.fail("the device half ran before the first words")
    )
    fn = getattr(page, f"run_{job}")
    if job == "sweep":
        first = next(fn("embedded", "x", 0.7, 40, 0.9, 16, 0, None, progress=progress))["sweep_status"]
        assert first.startswith(
            "Sweep (drafter model, constant gamma): measuring the autoregressive baseline, then gamma 1..8"
        )
    elif job == "compare":
        first = next(fn("embedded", "x", 4, 0.7, 40, 0.9, 16, 0, progress=progress))["compare_view"]
        assert "Comparing drafters: the drafter model first" in first and "baseline" in first
    else:
        first = next(fn("embedded", "a\nb", 2, 4, 0.7, 40, 0.9, 16, 0, progress=progress))["batch_status"]
        assert first.startswith("Decoding 2 rows together, then measuring batch sizes 1, 2")
    assert progress.calls[-1][1] in first and "loaded" not in first


def test_a_sweep_at_its_time_limit_names_the_gammas_left_and_asks_for_fewer_tokens(monkeypatch, shown_run):
    """The sweep ran out of time after gamma 4 on the English pair at 128 tokens and said only that it
    stopped: now it names the gammas not measured and says fewer tokens would finish it."""
    import specviz.ui.tabs.sweep as page

    monkeypatch.setattr(page, "SWEEP_SECONDS_MAX", 90.0)
    last = _sweep(monkeypatch, shown_run, (1, 2, 3, 4))[-1]
    status = last["sweep_status"]
    assert status.startswith(
        "Sweep (drafter model, constant gamma) stopped at its time limit of 90 s after gamma 4: "
    ), status
    assert "gamma 5, 6, 7, 8 were not measured. Fewer max new tokens would finish it" in status
    assert "At 16 tokens 4 of 8 gammas fit, so about 8 should fit all of them." in status
    assert [p.gamma for p in last["recording"].sweep.points] == [1, 2, 3, 4]  # what was measured is kept
    none = _sweep(monkeypatch, shown_run, ())[-1]["sweep_status"]
    assert none == (
        "Sweep stopped at its time limit of 90 s before any gamma finished: gamma 1, 2, 3, 4, 5, 6, 7, 8 were not "
        "measured. Fewer max new tokens would finish it (each gamma decodes them twice, speculative and "
        "autoregressive)."
    )


def test_the_batch_tab_and_readme_say_one_thing_and_quote_the_measured_tables():
    """The Batch tab said the speedup falls as the batch grows, README that batches of 2 and 4 gain on this
    CPU: both now say what the bf16 tables measured, and every speedup the tab quotes is in docs/benchmarks.md."""
    import re
    from pathlib import Path

    from specviz.views import BATCH_NOTE

    root = Path(__file__).resolve().parent.parent
    readme, bench = (root / "README.md").read_text(), (root / "docs" / "benchmarks.md").read_text()
    pairs = (root / "docs" / "pairs.md").read_text()  # README's English pair section, moved there
    assert "batches of 2 gain a little, batches of 4 and more lose" in BATCH_NOTE
    assert "batches of 2 gain a little, 4 and more lose" in readme
    said = re.search(
        r"Batches, in the bf16 form used now \(gamma 4\): (\d\.\d\d)x at batch 2, and\nthey lose at 4 and 8 "
        r"\((\d\.\d\d)x, (\d\.\d\d)x",
        bench,
    )
    assert said, "the English pair's sentence on batches (README's figures, moved to docs/benchmarks.md)"
    assert "Batches gain a little at 2 rows and lose from 4 on a bf16 CPU" in pairs
    for x in said.groups():
        assert re.search(rf"\| 4 \| [^\n]*\| {re.escape(x)}x \|", bench), x  # a gamma-4 row of the bf16 batch table
    quoted = re.findall(r"(\d\.\d\d)×", BATCH_NOTE.split("When a batch gains")[1])
    assert len(quoted) == 12
    for x in quoted:
        assert re.search(rf"\| {re.escape(x)}x \|", bench), x


def _eq1(a: float, g: int) -> float:
    """Leviathan et al. 2023, Eq. (1), written here: 1 + a + ... + a^g."""
    return sum(a**i for i in range(g + 1))


def test_the_explanations_measured_figures_are_computed_from_the_recordings_given(shown_run):
    """The Explanation tab stated the embedded pair's results as typed text ("within 1 % ... within 4 %"):
    its figures now come from the recordings and logs it is given, each naming its pair."""
    from specviz.views import explanation_markdown

    sweep = list(_sweeps(range(1, 9)))[-1]
    rec = Recording(shown_run.speculative, None, sweep, "t")
    gaps = []
    for g in range(1, 9):
        # _point's counts: accepted / (accepted + rejected), tokens / rounds
        alpha, tpr = (8 * g - 6) / (8 * g), (8 * g + 2) / 8
        gaps.append(abs(_eq1(alpha, g) - tpr) / tpr)
    worst = max(gaps)
    logs = {
        "English drafter": {
            "held_out_mean_beta": {"greedy": {"mean_beta": 0.5, "positions": 10}, "t1": {"mean_beta": 2.0}}
        },
        "EAGLE head": {"held_out_first_draft": {"greedy": {"first_draft_mean_beta": 0.25, "top1_agreement": 0.125}}},
    }
    text = explanation_markdown([("mypair", "my-sweep", rec)], logs)
    assert "**`mypair` pair**" in text and "`my-sweep`" in text
    assert (
        f"within {worst:.1%} (the largest gap, at gamma {gaps.index(worst) + 1}; mean gap {sum(gaps) / 8:.1%})" in text
    )
    assert "Alpha (accepted / tested drafts) 0.25–0.91" in text
    # a share over 1 is refused
    assert "mean beta 0.500 (greedy) over 10 drafted positions each" in text and "2.000" not in text
    assert "greedy: mean beta 0.250, top-1 agreement 0.125" in text
    assert "within 1 %" not in text and "What was measured" in explanation_markdown()


def test_the_explanation_on_the_page_names_the_pairs_of_the_shipped_files():
    """The page's Explanation reports every prepared recording with a sweep (the English and the
    embedded pair's), from the files themselves."""
    import json

    from specviz.assets import ASSETS
    from specviz.ui.page.evidence import explanation
    from specviz.ui.page.defaults import RECORDINGS

    text = explanation()
    rec = Recording.load(RECORDINGS / "english-greedy-gamma3-sweep.json")
    gaps = [
        abs(_eq1(p.accepted / (p.accepted + p.rejected), p.gamma) - p.tokens / p.rounds) / (p.tokens / p.rounds)
        for p in rec.sweep.points
    ]
    assert "**`english` pair**" in text and f"within {max(gaps):.1%}" in text.split("`english-greedy-gamma3-sweep`")[1]
    assert "**`embedded` pair**" in text and "`greedy-gamma4-sweep`" in text and "`sampled-gamma4-sweep`" in text
    beta = json.loads((ASSETS / "models" / "smollm2-drafter" / "training_log.json").read_text())["held_out_mean_beta"][
        "greedy"
    ]["mean_beta"]
    assert f"mean beta {beta:.3f} (greedy)" in text


def test_names_from_files_reach_the_explanation_as_inert_code():
    from specviz.views.explain import _code

    assert _code("<img src=x onerror=alert(1)>`x`") == "`?img?src?x?onerror?alert?1???x?`"


def test_a_sweep_whose_client_has_gone_stops_after_the_point_under_way(monkeypatch, shown_run):
    """A sweep, like Generate, ends when nobody reads it (stream closed or never opened): the
    device half is not advanced past the point under way. Control: the same sweep with its client
    listening runs every gamma."""
    import specviz.ui.page.state as state

    advanced = []

    def counted(gammas):
        for sweep in _sweeps(gammas):
            if sweep is not None:
                advanced.append(len(sweep.points))
            yield sweep

    import specviz.ui.tabs.sweep as page

    monkeypatch.setattr(page, "ensure_pair", lambda *a, **k: None)
    monkeypatch.setattr(page, "sweep_on_device", lambda req, stop=None, device_owner=None: counted(SWEEP_GAMMAS))
    monkeypatch.setattr(state, "client_gone", lambda request: len(advanced) >= 3)
    outputs = list(page.run_sweep("embedded", "def f():", 0.7, 40, 0.9, 16, 0, shown_run, progress=Progress()))
    assert advanced == [0, 1, 2] and all("download" not in o for o in outputs)
    advanced.clear()
    monkeypatch.setattr(state, "client_gone", lambda request: False)
    list(page.run_sweep("embedded", "def f():", 0.7, 40, 0.9, 16, 0, shown_run, progress=Progress()))
    assert advanced == list(range(len(SWEEP_GAMMAS) + 1))


def test_the_drafter_menu_follows_a_pair_whose_drafter_has_its_own_tokenizer():
    """Picking a pair whose drafter has its own tokenizer picks the cross-tokenizer kind ("model" would be refused);
    leaving it goes back to the drafter model; other kinds stay as chosen."""
    from specviz.pair import CROSS, EMBEDDED
    from specviz.ui.page.layout import kind_for_pair
    from specviz.ui.page.defaults import DRAFTER_CHOICES

    assert ("drafter model with its own tokenizer", "cross-tokenizer") in DRAFTER_CHOICES
    assert kind_for_pair(CROSS, "model")["value"] == "cross-tokenizer"
    assert kind_for_pair(EMBEDDED, "cross-tokenizer")["value"] == "model"
    assert "value" not in kind_for_pair(CROSS, "ngram") and "value" not in kind_for_pair(EMBEDDED, "early-exit")


def test_a_pair_brings_its_own_prompt_and_chat_setting_and_a_prompt_the_visitor_wrote_stays():
    from specviz.pair import CROSS, EMBEDDED, ENGLISH
    from specviz.ui.page.layout import chat_for_pair, prompt_for_pair
    from specviz.ui.page.defaults import CODE_EXAMPLES, ENGLISH_EXAMPLES

    if ENGLISH_EXAMPLES:
        assert prompt_for_pair(CROSS, ENGLISH_EXAMPLES[0])["value"] == CODE_EXAMPLES[0]
        assert prompt_for_pair(ENGLISH, CODE_EXAMPLES[1])["value"] == ENGLISH_EXAMPLES[0]
    assert prompt_for_pair(CROSS, "")["value"] == CODE_EXAMPLES[0]
    assert "value" not in prompt_for_pair(CROSS, "Tell me about prime numbers.")  # the visitor's own words
    assert "value" not in prompt_for_pair(EMBEDDED, CODE_EXAMPLES[2])
    assert chat_for_pair(CROSS) == {"__type__": "update", "value": False, "interactive": False}
    assert chat_for_pair(EMBEDDED)["value"] is False and chat_for_pair(ENGLISH)["value"] is True


def test_each_pair_offers_its_own_kind_of_example_prompt():
    """Python prompts only under the embedded pair and the cross pair (its code drafter); English chat prompts
    under every other preset; switching the pair shows the matching box and hides the other."""
    from specviz.pair import CROSS, EMBEDDED, PRESETS
    from specviz.ui.page.layout import example_boxes
    from specviz.ui.page.defaults import ENGLISH_EXAMPLES, example_kind

    assert example_kind(EMBEDDED) == "code" and example_kind(CROSS) == "code"
    for name in PRESETS:
        if name not in (EMBEDDED, CROSS):
            assert example_kind(name) == ("english" if ENGLISH_EXAMPLES else "code"), name
    english, code = example_boxes("english")
    assert english["visible"] is bool(ENGLISH_EXAMPLES) and code["visible"] is not bool(ENGLISH_EXAMPLES)
    english, code = example_boxes(EMBEDDED)
    assert english["visible"] is False and code["visible"] is True


def test_readme_says_what_a_cpu_without_bf16_shows_and_states_the_defaults_as_the_code_has_them():
    """README's Quick start says what a CPU without bf16 instructions shows (its speedup now, and the slowdown before
    routed fp32 products); SPECVIZ_PRELOAD's default is the page's default pair (english where it loads offline, else
    embedded), and the pair table has that
    pair's row (the settings table, the pair table and the Speed section moved from README to docs/)."""
    import re
    from pathlib import Path

    from specviz.pair import EMBEDDED, ENGLISH

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    settings, pairs, speed = ((root / "docs" / f"{name}.md").read_text() for name in ("settings", "pairs", "speed"))
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "without bf16 instructions" in quick and "slower than the target alone" in quick and "0.94x" in quick
    assert "routed" in quick and "1.24x" in quick
    preload = re.search(r"^\| `SPECVIZ_PRELOAD` \| (.*?) \|", settings, re.M).group(1)  # README's settings table, moved
    assert f"`{ENGLISH}`" in preload and f"`{EMBEDDED}`" in preload
    table = pairs.split("| Pair (drafter → target) |", 1)[1].split("\n\n", 1)[0]
    assert re.search(rf"^\| `{ENGLISH}` \(the default\) \|", table, re.M) and re.search(
        rf"^\| `{EMBEDDED}` \|", table, re.M
    )
    speed = speed.split("# Speed", 1)[1].split("\n## ", 1)[0]
    assert "31.5 minutes" in speed and "noisy" in speed


def test_the_quick_button_sets_a_lectures_run_length_in_the_browser():
    """ "Quick (32 tokens)" sets max new tokens in the page itself (no request, no queue), to a length the slider
    takes."""
    from specviz.demo import build_demo
    from specviz.ui.guard.limits import MAX_NEW_TOKENS_RANGE, QUICK_TOKENS

    demo = build_demo(preload=False)
    quick = [c for c in demo.config["components"] if c.get("props", {}).get("elem_id") == "sv-quick"]
    assert quick and f"{QUICK_TOKENS} tokens" in quick[0]["props"]["value"]
    deps = [d for d in demo.config["dependencies"] if any(t[0] == quick[0]["id"] for t in d["targets"])]
    assert len(deps) == 1 and deps[0]["js"] == f"() => {QUICK_TOKENS}" and not deps[0]["backend_fn"]
    assert MAX_NEW_TOKENS_RANGE[0] <= QUICK_TOKENS <= MAX_NEW_TOKENS_RANGE[1]
