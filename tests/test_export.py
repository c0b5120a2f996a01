"""A recording exported as one HTML file opens from disk with the network blocked: the replay steps
with buttons and arrow keys, and every chart is drawn by the inlined plotly.js."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from specviz.demo import RECORDINGS
from specviz.recording import Recording
from tests.test_browser import fits, shots, tip_of_rightmost_token

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every prepared recording exported: the first by ``python -m specviz export`` in a process of its own (the command
    as typed), the rest by the same command line in this process (``specviz.cli.main``: a new interpreter each cost
    about 8 s of imports on a 2-core CPU)."""
    from specviz.cli import main

    out = tmp_path_factory.mktemp("export")
    files = {}
    for k, path in enumerate(sorted(RECORDINGS.glob("*.json"))):
        html = out / f"{path.stem}.html"
        if k == 0:
            done = subprocess.run(
                [sys.executable, "-m", "specviz", "export", str(path), "--out", str(html)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
        else:
            with pytest.raises(SystemExit) as end:
                main(["export", str(path), "--out", str(html)])
            assert end.value.code in (0, None)
        files[path.stem] = (html, Recording.load(path))
    return files


def test_every_prepared_recording_opens_offline_and_replays(exported):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        try:
            for name, (html, rec) in exported.items():
                page = browser.new_page(viewport={"width": 1300, "height": 900})
                asked = []
                page.route(
                    "**/*",
                    lambda route: (
                        route.continue_()
                        if route.request.url.startswith("file://")
                        else (asked.append(route.request.url), route.abort())
                    ),
                )
                page.goto(html.as_uri())
                n = len(rec.speculative.rounds)
                assert page.locator(".sv-round.sv-shown .sv-round-title").inner_text() == f"Round 1 of {n}"
                page.locator("#sv-next").click()
                page.keyboard.press("ArrowRight")
                assert page.locator(".sv-round.sv-shown .sv-round-title").inner_text() == f"Round 3 of {n}"
                page.keyboard.press("ArrowLeft")
                assert page.locator(".sv-round.sv-shown .sv-round-title").inner_text() == f"Round 2 of {n}"
                charts = ["sv-acceptance", "sv-timeline", "sv-speedup", "sv-histogram", "sv-position"] + (
                    ["sv-sweep"] if rec.sweep else []
                )
                for chart in charts:
                    page.locator(f"#{chart} .main-svg").first.wait_for(timeout=30_000)
                assert page.locator(".sv-tokens [data-tip]").count() > 0
                assert not asked, asked  # nothing outside the file was requested
                page.close()
            # At a desktop's and a phone's width: every figure is drawn at its box's width (the first
            # was drawn 1,200 px wide in a 594 px cell), nothing scrolls sideways, a tapped token's
            # details stay on screen.
            html, rec = exported["sampled-gamma4-sweep"]
            for width, height, phone in ((1400, 1000, False), (390, 844, True)):
                page = browser.new_page(viewport={"width": width, "height": height}, is_mobile=phone, has_touch=phone)
                page.goto(html.as_uri())
                page.locator("#sv-sweep .main-svg").first.wait_for(timeout=30_000)
                for elem_id in (
                    "sv-acceptance",
                    "sv-timeline",
                    "sv-speedup",
                    "sv-histogram",
                    "sv-position",
                    "sv-sweep",
                ):
                    assert fits(page, elem_id), (width, elem_id)
                assert page.evaluate("document.documentElement.scrollWidth") <= width
                page.screenshot(path=str(shots() / f"export-{width}.png"), full_page=True)
                where = tip_of_rightmost_token(page, ".sv-tokens")
                assert where["tip"] and 0 <= where["tip"]["left"] and where["tip"]["right"] <= where["width"], where
                if phone:
                    page.screenshot(path=str(shots() / "export-390-tooltip.png"), full_page=False)
                page.close()
        finally:
            browser.close()


@pytest.fixture(scope="module")
def tree_export(tmp_path_factory):
    """A token tree run on the lab's tiny pair, one node's text made markup, exported."""
    from specviz import Sampling, autoregressive_generate
    from specviz.lab import PROMPT, models
    from specviz.engine.tree.loop import tree_generate
    from specviz.engine.tree.spec import TreeSpec
    from specviz.views.export import export_html

    drafter, target = models("different")
    spec = tree_generate(
        PROMPT, drafter, target, TreeSpec.static((3, 2)), sampling=Sampling(1.0), max_new_tokens=12, seed=1
    )
    base = autoregressive_generate(PROMPT, target, sampling=Sampling(1.0), max_new_tokens=12, seed=1)
    spec.rounds[0].tree.nodes[0].text = "</script><img src=x onerror=alert(1)>"
    html = tmp_path_factory.mktemp("tree") / "tree.html"
    html.write_text(export_html(Recording(spec, base, title="tree")))
    return html, spec


def test_a_tree_runs_export_holds_each_rounds_tree_as_data(tree_export):
    import json
    import re

    html, spec = tree_export
    text = html.read_text()
    data = re.search(r'<script type="application/json" id="sv-tree-data">(.*?)</script>', text, re.S).group(1)
    assert "<" not in data  # nothing inside can close the script element
    figs = json.loads(data)
    assert len(figs) == len(spec.rounds) and all(f is not None for f in figs)
    assert "<img" not in text and "&lt;/script&gt;&lt;img" in json.dumps(figs[0])
    assert 'id="sv-verify-cost"' in text


def test_a_tree_runs_export_draws_the_shown_rounds_tree(tree_export):
    from playwright.sync_api import sync_playwright

    html, spec = tree_export
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            dialogs = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(html.as_uri())
            title = page.locator("#sv-tree .gtitle")
            title.wait_for(timeout=30_000)
            assert title.text_content().startswith("Round 1:")
            page.keyboard.press("ArrowRight")
            page.wait_for_function(
                "document.querySelector('#sv-tree .gtitle').textContent.startsWith('Round 2:')", timeout=10_000
            )
            page.locator("#sv-verify-cost .main-svg").first.wait_for(timeout=30_000)
            assert not dialogs
        finally:
            browser.close()
