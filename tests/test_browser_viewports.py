"""The page at a classroom's three screens, in a real browser (tests/test_browser.py's app and Chromium): 1920 x 1080
(a desktop), 1280 x 720 (a projector) and 390 x 844 (a phone).

At each, one Generate on the embedded pair (24 tokens), then: the headline is there, the line under it adds up to its
number (tokens per round over drafting + scoring + other work, within 2 % for the rounding of what is shown), the
cost bar stays inside the headline's box, nothing scrolls the page sideways, and in the Replay tab the drafts table
fits its box with its verdict column inside the window and inside the table's visible part. Columns folded to fit
(β; on a phone q(x) and p(x)) come back with the switch above the table. On the phone the prompt, Generate and the
headline come first, within the first screen, and the settings after them. Screenshots go where tests/test_browser.py
puts them.
"""

from __future__ import annotations

import re

import pytest

from tests.test_browser import app_url, expect, page, press_generate, shots  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.browser]

VIEWPORTS = [(1920, 1080), (1280, 720), (390, 844)]

# Where things are: y from the page's top, x and widths in the window.
WHERE = """() => {
  const box = (s) => { const e = document.querySelector(s); if (!e) return null; const b = e.getBoundingClientRect();
                       return {left: b.left, right: b.right, top: b.top + scrollY, bottom: b.bottom + scrollY,
                               width: b.width}; };
  const generate = [...document.querySelectorAll('button')].find(b => b.textContent.trim() === 'Generate');
  const g = generate.getBoundingClientRect();
  const inside = document.querySelector('#sv-headline');
  const right = Math.max(...[...document.querySelectorAll('#sv-headline .sv-cost-bar, #sv-headline .sv-cost-bar *')]
                          .map(e => e.getBoundingClientRect().right));
  return {generate: {top: g.top + scrollY, bottom: g.bottom + scrollY}, headline: box('#sv-headline'),
          prompt: box('#sv-prompt'),
          settings: box('#sv-settings'), cost_right: right, headline_right: inside.getBoundingClientRect().right,
          page_width: document.documentElement.scrollWidth, window_width: document.documentElement.clientWidth};
}"""

# The drafts table's verdict cells (its heading included) against the window and the table's scrolling box.
VERDICTS = """() => {
  const table = document.querySelector('#sv-replay table.sv-drafts');
  const scroller = table.closest('.sv-scroll');
  const s = scroller.getBoundingClientRect();
  const cells = [...table.querySelectorAll('.sv-col-verdict')].map(e => e.getBoundingClientRect())
                 .filter(b => b.width > 0);
  return {cells: cells.map(b => [b.left, b.right]), box: [s.left + scroller.clientLeft,
          s.left + scroller.clientLeft + scroller.clientWidth],
          client: scroller.clientWidth, scroll: scroller.scrollWidth, scrolled: scroller.scrollLeft,
          window: document.documentElement.clientWidth, rows: table.querySelectorAll('.sv-draft-row').length};
}"""


def _number(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.parametrize("width,height", VIEWPORTS, ids=[f"{w}x{h}" for w, h in VIEWPORTS])
def test_a_default_generate_fits_the_screen(page, app_url, width, height):  # noqa: F811
    phone = width < 500
    view = page.context.browser.new_page(viewport={"width": width, "height": height}, has_touch=phone, is_mobile=phone)
    try:
        view.goto(app_url)
        # every element measured is on the page (Gradio builds it in parts)
        view.wait_for_function(
            """() => ['#sv-settings', '#sv-prompt', '#sv-headline', '#sv-pair'].every(s => document.querySelector(s))
                                     && [...document.querySelectorAll('button')]
                                          .some(b => b.textContent.trim() === 'Generate')""",
            timeout=30_000,
        )
        # before a run: the prompt and Generate in the first screen, above the headline, the settings after them
        if phone:
            m = view.evaluate(WHERE)
            assert m["prompt"]["top"] < m["generate"]["top"] < m["headline"]["top"] < m["settings"]["top"], m
            assert m["generate"]["bottom"] < height and m["headline"]["top"] < height, m
        view.locator("#sv-pair input").first.click()
        view.get_by_role("option", name="embedded", exact=True).click()
        tokens = view.get_by_label("number input for max new tokens")
        tokens.fill("24")
        tokens.press("Enter")
        expect(tokens).to_have_value("24")
        press_generate(view)
        expect(view.locator("#sv-status")).to_contain_text("Done:", timeout=120_000)

        # The headline, and the line under it adding up to its number.
        shown = view.locator("#sv-headline .sv-headline-speedup")
        expect(shown).to_be_visible(timeout=30_000)
        speedup = _number(re.match(r"\s*([\d.,]+)×", shown.inner_text()).group(1))
        why = view.locator("#sv-headline .sv-headline-why").inner_text()
        parts = re.search(
            r"([\d.]+) tokens for ([\d.]+) steps .*?\(drafting ([\d.]+) \+ scoring ([\d.]+) \+ other work ([\d.]+)\)",
            why,
        )
        assert parts, why
        tokens_per_round, cost, drafting, verify, other = (_number(x) for x in parts.groups())
        assert tokens_per_round / (drafting + verify + other) == pytest.approx(speedup, rel=0.02), why
        assert drafting + verify + other == pytest.approx(cost, abs=0.02), why
        view.evaluate("window.scrollTo(0, 0)")
        m = view.evaluate(WHERE)
        assert m["cost_right"] <= m["headline_right"] + 1, m  # the cost bar stays in the headline's box
        assert m["page_width"] <= m["window_width"], m  # nothing scrolls the page sideways
        if phone:
            assert m["generate"]["bottom"] < height and m["headline"]["top"] < height, m
            assert m["headline"]["top"] < m["settings"]["top"], m
        else:
            assert m["headline"]["top"] < height and m["generate"]["bottom"] < height, m
        view.screenshot(path=str(shots() / f"viewport-{width}x{height}.png"), full_page=False)

        # The replay: the drafts table fits its box, the verdict column in view without scrolling sideways.
        view.get_by_role("tab", name="Replay").click()
        view.locator("#sv-replay .sv-round-title").wait_for(timeout=30_000)
        view.locator("#sv-replay table.sv-drafts").first.scroll_into_view_if_needed()
        v = view.evaluate(VERDICTS)
        assert v["rows"] >= 1 and len(v["cells"]) == v["rows"] + 1, v  # the heading and every draft's verdict
        assert v["scroll"] <= v["client"] + 1 and v["scrolled"] == 0, v  # the table fits its box
        for left, right in v["cells"]:
            assert 0 <= left and right <= v["window"], v
            assert v["box"][0] - 0.5 <= left and right <= v["box"][1] + 0.5, v
        assert view.evaluate("document.documentElement.scrollWidth") <= view.evaluate(
            "document.documentElement.clientWidth"
        )
        view.screenshot(path=str(shots() / f"viewport-{width}x{height}-replay.png"), full_page=False)

        # No number is gone: β shows, or a switch above the table brings the folded columns back.
        beta = view.locator("#sv-replay th.sv-col-beta")
        if not beta.is_visible():
            view.locator("#sv-replay-all input").check()
            expect(beta).to_be_visible()
            if phone:
                expect(view.locator("#sv-replay th.sv-col-qp").first).to_be_visible()
            view.screenshot(path=str(shots() / f"viewport-{width}x{height}-every-column.png"), full_page=False)
        else:
            assert not view.locator("#sv-replay-all").is_visible()  # nothing folded, no switch
        view.screenshot(path=str(shots() / f"viewport-{width}x{height}-full.png"), full_page=True)
    finally:
        view.close()


@pytest.mark.parametrize("width,height", VIEWPORTS, ids=[f"{w}x{h}" for w, h in VIEWPORTS])
def test_the_speedup_is_named_alike_in_the_headline_stats_explanation_and_auto_tree_note(page, app_url, width, height):  # noqa: F811
    """Issue 61: for one run (the auto tree on the embedded pair, Quick), the headline's quantity, its formula in words
    under the big number, is found word for word in the stats table, the Explanation tab and the auto tree's note."""
    from specviz.ui.tabs.tree import AUTO

    phone = width < 500
    view = page.context.browser.new_page(viewport={"width": width, "height": height}, has_touch=phone, is_mobile=phone)
    try:
        view.goto(app_url)
        view.wait_for_function(
            "() => ['#sv-pair', '#sv-tree', '#sv-quick'].every(s => document.querySelector(s))", timeout=30_000
        )
        view.locator("#sv-pair input").first.click()
        view.get_by_role("option", name="embedded", exact=True).click()
        view.locator("#sv-tree input").first.click()
        view.get_by_role("option", name=AUTO, exact=True).click()
        view.locator("#sv-quick").click()
        press_generate(view)
        expect(view.locator("#sv-status")).to_contain_text("Done:", timeout=300_000)
        formula = view.locator("#sv-headline .sv-headline-formula")
        expect(formula).to_be_visible(timeout=30_000)
        named = re.match(r"speedup = (.+?);", formula.inner_text()).group(1)
        assert "/" in named, named
        assert named in view.locator("#sv-stats").inner_text()
        view.get_by_role("tab", name="Explanation").click()
        expect(view.locator("#sv-explain")).to_contain_text(named)
        view.get_by_role("tab", name="Theory").click()
        expect(view.locator("#sv-auto-note")).to_contain_text("Chosen: ", timeout=30_000)
        expect(view.locator("#sv-auto-note")).to_contain_text(named)
    finally:
        view.close()
