"""The demo in a real browser: headless Chromium driven by Playwright.

Starts ``python app.py`` on a free port, presses Generate with the defaults, and checks what
a visitor sees: coloured tokens, the numbers, both charts drawn by plotly. Screenshots go to
$SPECVIZ_SCREENSHOTS (default: a temporary folder).
"""

from __future__ import annotations

import contextlib

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port

# The tests share one page, in order: pyproject's --dist loadfile keeps them on one worker.
pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def app_url():
    port = free_port()
    # as deployed: the default pair warmed up before the page serves (the tests' conftest turns that off)
    env = os.environ | {"GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_DISABLE_TELEMETRY": "1", "SPECVIZ_WARM_UP": "1"}
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(url, timeout=1)
                break
            except OSError:
                assert proc.poll() is None, "app.py exited during start-up"
                time.sleep(0.5)
        else:
            pytest.fail("app.py did not start within 120 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def page(app_url):
    if not Path(CHROMIUM).exists():
        # CI installs it (.ci/run); elsewhere say what is missing instead of failing the suite.
        message = "Debian's chromium is not installed: apt-get install chromium"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
            ],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(app_url)
        yield page
        browser.close()


def expect(locator):
    from playwright.sync_api import expect as _expect

    return _expect(locator)


def press_generate(page) -> None:
    """Click Generate until a run starts (the status changes). A click that lands while the last
    run's event is still ending (its final outputs on screen, its clean-up under way on the server)
    is dropped by Gradio, as a second click on a pending event is; CI once lost one that way."""
    before = page.evaluate("() => document.querySelector('#sv-status')?.textContent ?? ''")
    for _ in range(4):
        page.get_by_role("button", name="Generate").click()
        try:
            page.wait_for_function(
                "(before) => (document.querySelector('#sv-status')?.textContent ?? '') !== before",
                arg=before,
                timeout=15_000,
            )
            return
        except Exception:  # playwright's TimeoutError: the click was dropped, or the run is slow to show
            continue
    pytest.fail("Generate did not start a run after 4 clicks")


def shots() -> Path:
    folder = Path(os.environ.get("SPECVIZ_SCREENSHOTS", "/tmp/specviz-screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()
    page.wait_for_timeout(300)


@contextlib.contextmanager
def pair_chosen(page, name: str):
    """The page's pair menu set to ``name`` for the block, then back to what it was: a test of a tab's wiring (Batch,
    the sweep) runs on the embedded pair, as fast as a pair gets, and the tests after it find the page as it was."""
    menu = page.locator("#sv-pair input").first
    before = menu.input_value()

    def choose(option: str) -> None:
        menu.click()
        page.get_by_role("option", name=option, exact=True).click()
        expect(menu).to_have_value(option)

    choose(name)
    try:
        yield
    finally:
        choose(before)


def drawn(page, elem_id: str) -> dict:
    """What plotly drew in a chart: traces given and traces it accepted, and bar/point counts."""
    page.locator(f"#{elem_id} .main-svg").first.wait_for(timeout=30_000)
    return page.evaluate(
        """(id) => {
          const gd = document.querySelector('#' + id + ' .js-plotly-plot');
          const ys = gd._fullData.map(t => Array.from(t.y || []));
          return {data: gd.data.length, full: gd._fullData.filter(t => t.visible !== false).length,
                  numeric: ys.every(y => y.every(v => v === null || typeof v === 'number')),
                  marks: gd.querySelectorAll(
                    '.barlayer path, .scatterlayer .point, .scatterlayer path.js-line').length};
        }""",
        elem_id,
    )


def fits(page, elem_id: str) -> bool:
    """Whether the figure in ``elem_id`` is drawn at its box's width (one drawn in a hidden tab took
    plotly's default 700 px and was cut; polled, since the page redraws it when the box shows)."""
    js = """(id) => { const gd = document.querySelector('#' + id + '.js-plotly-plot, #' + id + ' .js-plotly-plot');
                      return gd && gd._fullLayout
                             && Math.abs(gd._fullLayout.width - gd.getBoundingClientRect().width) <= 2; }"""
    for _ in range(40):
        if page.evaluate(js, elem_id):
            return True
        page.wait_for_timeout(250)
    return False


def tip_of_rightmost_token(page, within: str) -> dict:
    """Focus (as a tap does) the token whose right edge is furthest right in ``within``, and return
    where its details box and the token are, with the window's width."""
    return page.evaluate(
        """(sel) => {
          const spans = [...document.querySelectorAll(sel + ' [data-tip]')]
                          .filter(e => e.getClientRects().length === 1);
          const el = spans.reduce(
            (a, b) => (b.getBoundingClientRect().right > a.getBoundingClientRect().right ? b : a));
          el.scrollIntoView({block: 'center'}); el.focus();
          const tip = document.querySelector('.sv-tip');
          return {token: el.getBoundingClientRect().toJSON(),
                  tip: tip && !tip.hidden ? tip.getBoundingClientRect().toJSON() : null,
                  width: document.documentElement.clientWidth, text: tip ? tip.textContent : ''};
        }""",
        within,
    )


def test_generate_with_defaults_shows_tokens_stats_and_charts(page):
    # A lecture's setting, as a class would use it: the Quick button sets max new tokens in the page (no request), and
    # every run of this file after it (replay, sweep, compare, batch) decodes that many tokens of the default pair.
    from specviz.ui.guard.limits import QUICK_TOKENS

    page.locator("#sv-quick").click()
    expect(page.get_by_label("number input for max new tokens")).to_have_value(str(QUICK_TOKENS))
    started = time.perf_counter()
    press_generate(page)
    page.locator("#sv-output .sv-accepted, #sv-output .sv-correction, #sv-output .sv-bonus").first.wait_for(
        timeout=60_000
    )
    first_round_s = time.perf_counter() - started
    expect(page.locator("#sv-status")).to_contain_text("Done:", timeout=120_000)
    assert page.locator("#sv-output .sv-accepted").count() > 0
    assert page.locator("#sv-output .sv-correction, #sv-output .sv-bonus").count() > 0
    stats = page.locator("#sv-stats").inner_text()
    assert "speedup" in stats and "×" in stats and "…" not in stats
    for chart in ("sv-acceptance", "sv-timeline"):
        d = drawn(page, chart)
        assert d["data"] == d["full"] and d["numeric"] and d["marks"] > 0, d
        assert fits(page, chart), chart
    title = page.locator("#sv-output .sv-accepted").first.get_attribute("title")
    assert "q(x) =" in title and "u =" in title
    page.screenshot(path=str(shots() / "demo.png"), full_page=True)
    print(f"\nfirst round on screen {first_round_s:.2f} s after the click")


def test_plotly_major_matches_the_front_end(page):
    """Figures are built by plotly.py for its bundled plotly.js; Gradio draws them with its own."""
    from plotly.offline import get_plotlyjs_version

    front = page.evaluate("() => window.Plotly && window.Plotly.version")
    assert front, "Gradio's front end did not expose plotly.js"
    print(f"\nplotly.js in the page {front}, plotly.py builds for {get_plotlyjs_version()}")
    assert front.split(".")[0] == get_plotlyjs_version().split(".")[0]


def test_replay_steps_through_rounds(page):
    tab(page, "Replay")
    panel = page.locator("#sv-replay")
    title = panel.locator(".sv-round-title")
    title.wait_for(timeout=30_000)
    n = int(title.inner_text().split()[-1])
    assert title.inner_text() == f"Round 1 of {n}"  # a finished run replays from round 1
    page.locator("#sv-next").click()
    page.get_by_text(f"Round 2 of {n}").wait_for(timeout=30_000)
    page.locator("#sv-next").click()
    page.get_by_text(f"Round 3 of {n}").wait_for(timeout=30_000)
    page.locator("#sv-prev").click()
    page.get_by_text(f"Round 2 of {n}").wait_for(timeout=30_000)
    assert panel.locator(".sv-draft-row").count() >= 1
    assert "min(1, p/q)" in panel.inner_text() and "u = " in panel.inner_text()
    # step on until a round ends in a correction, to show the residual
    for _ in range(n):
        if "norm(max(0, p − q))" in panel.inner_text() and "sampled" in panel.inner_text():
            break
        page.locator("#sv-next").click()
        page.wait_for_timeout(250)
    assert "◀ sampled" in panel.inner_text()
    panel.screenshot(path=str(shots() / "replay.png"))


def test_theory_and_gamma_sweep(page):
    tab(page, "Theory")
    for chart in ("sv-speedup", "sv-histogram", "sv-position"):
        d = drawn(page, chart)
        assert d["data"] == d["full"] and d["marks"] > 0, (chart, d)
        assert fits(page, chart), chart  # drawn while the tab was hidden, redrawn to its box when it opens
    assert page.locator("#sv-speedup").get_by_text("optimal γ").count() > 0
    assert page.locator("#sv-speedup").get_by_text("measured").count() > 0
    with pair_chosen(page, "embedded"):  # the sweep's wiring: eight gammas of the English pair took a minute
        page.locator("#sv-sweep-button").click()
        page.locator("#sv-sweep-status").get_by_text(re.compile("Sweep done|stopped at its time limit")).wait_for(
            timeout=180_000
        )
        page.wait_for_timeout(500)
    d = drawn(page, "sv-sweep")
    # Each gamma done draws its measured tokens per round and speedup. On a busy machine the sweep of
    # the default (English) pair may stop at its time limit, and says after which gamma.
    status = page.locator("#sv-sweep-status").inner_text()
    cut = re.search(r"stopped at its time limit of \d+ s after gamma (\d+)", status)
    points = int(cut.group(1)) if cut else 8
    assert points >= 1 and d["full"] >= 4 and d["marks"] >= 2 * points, (status, d)
    page.locator("#sv-speedup").scroll_into_view_if_needed()
    page.screenshot(path=str(shots() / "theory.png"), full_page=True)


def test_race_replays_both_runs(page):
    tab(page, "Race")
    page.get_by_label("true timing").check()
    page.locator("#sv-race-button").click()
    race = page.locator("#sv-race .sv-race")
    race.wait_for(timeout=30_000)
    assert race.locator(".sv-race-lane").count() == 2
    # both runs' tokens: 32 each, unless one stopped at its end early
    assert race.locator(".sv-race-token").count() > 40
    # At true timing both runs finish within seconds (later on a loaded machine: polled, not slept).
    expect(race.locator(".sv-race-done").nth(1)).to_have_css("opacity", "1", timeout=60_000)
    page.get_by_label("slow motion").check()
    page.locator("#sv-race-button").click()
    page.wait_for_timeout(4_000)  # mid-race: the autoregressive lane is still growing
    page.locator("#sv-race").screenshot(path=str(shots() / "race.png"))


def test_save_and_load_recordings(page, tmp_path):
    tab(page, "Save / load")
    with page.expect_download() as info:
        page.locator("#sv-download").click()
    saved = tmp_path / "run.json"
    info.value.save_as(saved)
    from specviz.recording import Recording

    rec = Recording.load(saved)
    assert rec.baseline is not None and rec.speculative.rounds
    # A malformed file gets a message, and the page still works.
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "specviz-recording", "speculative": {"mode": "speculative", "rounds": "no"}}')
    page.locator("#sv-upload input[type=file]").set_input_files(str(bad))
    page.get_by_text("cannot be replayed").first.wait_for(timeout=30_000)
    # A hostile recording (markup in gamma and the title) is refused; no script runs.
    import json

    from specviz.demo import RECORDINGS

    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    hostile = json.loads((RECORDINGS / "sampled-gamma8.json").read_text())
    hostile["baseline"] = None
    hostile["speculative"]["settings"]["gamma"] = '<img src=x onerror="alert(3)">'
    (tmp_path / "hostile.json").write_text(json.dumps(hostile))
    page.locator("#sv-upload input[type=file]").set_input_files(str(tmp_path / "hostile.json"))
    page.get_by_text("settings.gamma").first.wait_for(timeout=30_000)
    hostile = json.loads((RECORDINGS / "sampled-gamma8.json").read_text())
    hostile["title"] = '<img src=x onerror="alert(5)"> ![t](http://example.invalid/t.png)'
    (tmp_path / "title.json").write_text(json.dumps(hostile))
    page.locator("#sv-upload input[type=file]").set_input_files(str(tmp_path / "title.json"))
    page.get_by_text("Replaying a recording").first.wait_for(timeout=30_000)
    page.wait_for_timeout(1000)
    assert not dialogs and page.locator("#sv-status img").count() == 0
    # A prepared recording replays with no model and sets every control to its settings.
    page.get_by_label("Prompt", exact=True).fill("something else")
    page.get_by_role("button", name="Load prepared recording").click()
    from specviz.demo import _examples
    from specviz.recording import Recording

    prepared = Recording.load(RECORDINGS / f"{_examples()[0]}.json")
    # The status line already says "controls are set" from the previous load: wait for the prompt itself.
    expect(page.get_by_label("Prompt", exact=True)).to_have_value(
        prepared.prompt or prepared.speculative.prompt_text, timeout=60_000
    )
    assert page.locator("#sv-output .sv-accepted").count() > 0
    # where the button is, a line says what was loaded
    expect(page.locator("#sv-load-status")).to_contain_text(
        f"{len(prepared.speculative.rounds)} rounds, replayed with no model"
    )
    page.screenshot(path=str(shots() / "files.png"), full_page=True)
    tab(page, "Replay")
    page.get_by_text("Round 1 of").or_(page.locator("#sv-replay .sv-round-title")).first.wait_for(timeout=30_000)


def test_compare_drafters_shows_each_kind(page):
    page.get_by_label("Prompt", exact=True).fill(
        "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
        "    def scale(self, k):\n        return Point(self.x * k, self.y * k)\n\n    def shift(self, dx, dy):"
    )
    tab(page, "Compare drafters")
    page.locator("#sv-compare-button").click()
    # the quantized target too (CPU), and the EAGLE head (the English pair has one)
    expect(page.locator("#sv-compare .sv-compare-col")).to_have_count(5, timeout=30_000)
    page.get_by_text("early exit (layer").first.wait_for(timeout=180_000)
    page.get_by_text("quantized target (int8)").first.wait_for(timeout=180_000)
    assert page.locator("#sv-compare .sv-accepted").count() > 0
    d = drawn(page, "sv-compare-plot")
    assert d["marks"] > 0
    page.locator("#sv-compare").screenshot(path=str(shots() / "compare.png"))


def test_batch_tab_shows_lanes_and_throughput(page):
    """Four rows decoded together: a lane per row, rounds as columns, padding shown, and the
    throughput chart drawn for batch sizes 1, 2 and 4."""
    tab(page, "Batch")
    with pair_chosen(page, "embedded"):  # the tab's wiring: the English pair's batches took 90 s
        page.locator("#sv-batch-button").click()
        page.get_by_text("Done: batch sizes 1, 2, 4").first.wait_for(timeout=180_000)
    lanes = page.locator("#sv-batch tbody tr")
    expect(lanes).to_have_count(4)
    assert page.locator("#sv-batch .sv-accepted").count() > 0
    expect(
        page.locator("#sv-batch").get_by_text("tok/s ratio, speculative / batched autoregressive decoding")
    ).to_be_visible()
    d = drawn(page, "sv-batch-plot")
    assert d["marks"] > 0
    page.locator("#sv-batch").screenshot(path=str(shots() / "batch.png"))
    page.locator("#sv-batch-plot").screenshot(path=str(shots() / "batch-chart.png"))


def test_exactness_lab_runs_and_gives_a_verdict(page):
    tab(page, "Exactness lab")
    samples = page.get_by_label("number input for samples")  # the smallest a visitor may ask: the wiring, not the power
    samples.fill("500")
    samples.press("Enter")
    expect(samples).to_have_value("500")
    page.locator("#sv-lab-run").click()
    page.get_by_text("no evidence against exactness").first.wait_for(timeout=120_000)
    page.locator("#sv-lab-plot").get_by_text("500 speculative samples").wait_for(timeout=120_000)  # the run's end
    d = drawn(page, "sv-lab-plot")
    assert d["marks"] > 0
    page.screenshot(path=str(shots() / "lab.png"), full_page=False)


def test_explanation_renders_the_formulas(page):
    tab(page, "Explanation")
    panel = page.locator("#sv-explain")
    panel.get_by_text("How one round works").wait_for(timeout=30_000)
    assert panel.locator(".katex").count() >= 10  # LaTeX typeset, not raw dollars
    for term in ("acceptance rate", "cost coefficient", "tokens per round", "optimal gamma"):
        assert term in panel.inner_text()
    panel.screenshot(path=str(shots() / "explain.png"))


def test_bad_input_shows_a_message_and_the_page_keeps_working(page):
    box = page.get_by_label("Prompt", exact=True)
    box.fill("")
    page.get_by_role("button", name="Generate").click()
    page.get_by_text("The prompt is empty").first.wait_for(timeout=30_000)
    # the status says nothing new was generated, instead of "Error" over the last run's message
    expect(page.locator("#sv-status")).to_contain_text("the request was refused or failed", timeout=30_000)
    assert "Error" not in page.locator("#sv-status").inner_text()
    page.screenshot(path=str(shots() / "empty-prompt.png"))
    box.fill("def add(a, b):\n")
    press_generate(page)
    # the status, not any "Done:" on the page: the next test must start after this run has ended
    expect(page.locator("#sv-status")).to_contain_text("Done:", timeout=120_000)


def test_stop_says_the_run_was_stopped(page):
    """Stop mid-run: the status says so (not the streaming line, not "Error"), the baseline's numbers
    say they need a baseline instead of '…', and the page takes the next run."""
    # A long run (gamma 1, 256 tokens), and Stop pressed the moment the first round shows: the
    # embedded pair is fast enough to finish a default run before a click from here arrives.
    status = page.locator("#sv-status")
    expect(status).not_to_contain_text("Speculative decoding: round", timeout=120_000)  # no run under way
    for label, value in (
        ("number input for gamma (drafted tokens per round)", "1"),
        ("number input for max new tokens", "256"),
    ):
        box = page.get_by_label(label)
        box.fill(value)
        box.press("Enter")
        expect(box).to_have_value(value)
    page.evaluate("""() => {
        const status = document.querySelector('#sv-status');
        const watch = new MutationObserver(() => {
          if (status.textContent.includes('Speculative decoding: round')) {
            watch.disconnect(); document.querySelector('#sv-stop').click();
          }
        });
        watch.observe(status, {childList: true, subtree: true, characterData: true});
    }""")
    press_generate(page)
    expect(status).to_contain_text("Stopped by you after", timeout=60_000)
    page.wait_for_timeout(2_000)  # nothing of the stopped run arrives later
    assert status.inner_text().startswith("Stopped by you after") and "Error" not in status.inner_text()
    stats = page.locator("#sv-stats").inner_text()
    assert "…" not in stats and "needs the autoregressive baseline" in stats and "Error" not in stats
    page.evaluate("document.querySelector('#sv-status').scrollIntoView({block: 'center'})")
    page.screenshot(path=str(shots() / "after-stop.png"), full_page=False)
    for label, value in (
        ("number input for gamma (drafted tokens per round)", "4"),
        ("number input for max new tokens", "32"),
    ):
        box = page.get_by_label(label)
        box.fill(value)
        box.press("Enter")
    press_generate(page)
    expect(status).to_contain_text("Done:", timeout=120_000)


def test_phone_viewport_reaches_every_tab(page, app_url):
    """At 390 x 844 every tab is in view and opens; a prepared recording replays; the replay's table scrolls in its
    box."""
    phone = page.context.browser.new_page(viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True)
    try:
        phone.goto(app_url)
        names = [
            "Charts",
            "Replay",
            "Theory",
            "Race",
            "Save / load",
            "Compare drafters",
            "Batch",
            "Exactness lab",
            "Explanation",
        ]
        for name in names:
            t = phone.get_by_role("tab", name=name)
            expect(t).to_be_visible(timeout=30_000)
        phone.get_by_role("tab", name="Save / load").click()
        phone.get_by_role("button", name="Load prepared recording").click()
        phone.get_by_text("The controls are set to its settings").first.wait_for(timeout=60_000)
        phone.get_by_role("tab", name="Replay").click()
        phone.locator("#sv-replay .sv-round-title").first.wait_for(timeout=30_000)
        box = phone.locator("#sv-replay .sv-scroll").first.evaluate("e => [e.clientWidth, e.scrollWidth]")
        assert box[0] <= 390 and box[1] >= box[0]  # the table scrolls inside its box, the page does not widen
        assert phone.evaluate("document.documentElement.scrollWidth") <= 400
        phone.screenshot(path=str(shots() / "phone-replay.png"), full_page=False)
        phone.get_by_role("tab", name="Compare drafters").click()
        phone.screenshot(path=str(shots() / "phone-compare.png"), full_page=False)
        # a tapped token's details stay inside the screen, even for the token furthest right
        where = tip_of_rightmost_token(phone, "#sv-output")
        assert where["tip"] and ("q(x) =" in where["text"] or "probability" in where["text"]), where
        assert where["token"]["right"] > 0.7 * where["width"], where  # the token is at the right edge
        assert 0 <= where["tip"]["left"] and where["tip"]["right"] <= where["width"], where
        phone.screenshot(path=str(shots() / "phone-tooltip.png"), full_page=False)
        # the figures of the Charts tab fit the phone's width
        phone.get_by_role("tab", name="Charts").click()
        for chart in ("sv-acceptance", "sv-timeline"):
            assert fits(phone, chart), chart
        # the Explanation's names keep their words whole: the first column is as wide as its longest word
        phone.get_by_role("tab", name="Explanation").click()
        first = phone.locator("#sv-explain table td:first-child").first
        first.scroll_into_view_if_needed()
        widths = phone.evaluate(
            "() => [...document.querySelectorAll('#sv-explain table td:first-child')].map(td => td.clientWidth)"
        )
        assert widths and all(w >= 90 for w in widths), widths  # it was about 40 px: "dra ft acc ept anc e"
        phone.screenshot(path=str(shots() / "phone-explain.png"), full_page=False)
        assert phone.evaluate("document.documentElement.scrollWidth") <= 400
    finally:
        phone.close()


def test_the_output_is_where_the_eye_is(page, app_url):
    """At 1920 x 1080 the output, its stats and the tabs fill the right beside the controls (the tabs
    had started about 1,980 px down under an empty right column) and chart text is legible on a
    projector; at 390 x 844 the output follows the prompt and Generate (it had started 3,400 px down
    a 6,600 px page, under every setting)."""
    where = """() => { const y = (s) => Math.round(document.querySelector(s).getBoundingClientRect().top
                                                  + window.scrollY);
                       const right = (s) => Math.round(document.querySelector(s).getBoundingClientRect().left);
                       return {output: y('#sv-output'), tabs: y('[role=tablist]'), settings: y('#sv-settings'),
                         run: y('#sv-run'),
                               show_left: right('#sv-show'), run_left: right('#sv-run'), drafter: y('#sv-drafter-kind'),
                               height: document.documentElement.scrollHeight}; }"""
    for size, is_phone in (({"width": 1920, "height": 1080}, False), ({"width": 390, "height": 844}, True)):
        other = page.context.browser.new_page(viewport=size, has_touch=is_phone, is_mobile=is_phone)
        try:
            other.goto(app_url)
            other.locator("#sv-output").wait_for(timeout=30_000)
            # every element measured is on the page (the output can show before the tabs and settings are built)
            other.wait_for_function(
                """() => ['#sv-output', '[role=tablist]', '#sv-settings', '#sv-run', '#sv-show',
                                                 '#sv-drafter-kind'].every(s => document.querySelector(s))""",
                timeout=30_000,
            )
            m = other.evaluate(where)
            if not is_phone:
                # after a run on the embedded pair (128 tokens fill the output and the stats)
                other.locator("#sv-pair input").first.click()
                other.get_by_role("option", name="embedded", exact=True).click()
                press_generate(other)
                expect(other.locator("#sv-status")).to_contain_text("Done:", timeout=120_000)
                m = other.evaluate(where)
                assert m["show_left"] > m["run_left"] + 300 and m["settings"] > m["run"], m  # beside the controls
                # near the top under the intro (its "How it works" line included), not 1,980 px down
                assert m["output"] < 450 and m["tabs"] < 1300, m
                other.get_by_role("tab", name="Charts").click()
                other.locator("#sv-acceptance .main-svg .xtick text").first.wait_for(timeout=30_000)
                font = other.evaluate(
                    "() => parseFloat(getComputedStyle(document.querySelector('#sv-acceptance .main-svg .xtick "
                    "text')).fontSize)"
                )
                assert font >= 14, font
            else:
                assert m["output"] < m["drafter"] and m["output"] < 1600, m  # before the settings, within two screens
            other.screenshot(path=str(shots() / f"layout-{size['width']}.png"), full_page=True)
        finally:
            other.close()
