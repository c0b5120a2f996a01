"""The Theory tab's token-tree section in a real browser: a run with the auto tree on the embedded pair
fills it (the sentence on why this size, the budget figure, the chosen tree, the tables with their
counts). Screenshots go to $SPECVIZ_SCREENSHOTS (default: a temporary folder)."""

from __future__ import annotations

import pytest

from tests.test_browser import app_url, drawn, expect, page, press_generate, shots, tab  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_an_auto_tree_run_fills_the_theory_tabs_tree_section(page):  # noqa: F811
    from specviz.ui.tabs.tree import AUTO

    tab(page, "Theory")
    note = page.locator("#sv-auto-note")
    # before any run: how to get it
    expect(note).to_contain_text("Choose auto: fastest for this device", timeout=30_000)
    page.locator("#sv-pair input").first.click()
    page.get_by_role("option", name="embedded", exact=True).click()
    page.locator("#sv-tree input").first.click()
    page.get_by_role("option", name=AUTO, exact=True).click()
    press_generate(page)
    expect(page.locator("#sv-status")).to_contain_text("Done:", timeout=300_000)
    expect(page.locator("#sv-status")).to_contain_text("auto: ")
    tab(page, "Theory")
    expect(note).to_contain_text("Chosen: ")
    expect(note).to_contain_text("tokens per round")
    text = note.inner_text()
    assert " tokens / " in text and " rounds = " in text and "E[tokens per round]" in text and "v(1) = " in text
    d = drawn(page, "sv-budget")
    assert d["data"] == d["full"] and d["numeric"] and d["marks"] > 0, d
    names = page.evaluate("() => document.querySelector('#sv-budget .js-plotly-plot').data.map(t => t.name)")
    assert any(n.startswith("best chain, gamma") for n in names) and any(n.startswith("chosen: ") for n in names)
    assert any(n.startswith("tree 3-2-2-1") for n in names) and any(n.startswith("this run, measured") for n in names)
    table = page.locator("#sv-rank-table")
    expect(table).to_contain_text("accepted / offered")
    assert " / " in table.locator("td").first.inner_text()
    page.locator("#sv-auto-head").scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    page.locator("#sv-auto-head").screenshot(path=str(shots() / "auto-tree-head.png"))
    for elem, name in (
        ("#sv-auto-note", "auto-tree-note"),
        ("#sv-budget", "auto-tree-budget"),
        ("#sv-auto-tree", "auto-tree-tree"),
        ("#sv-rank-table", "auto-tree-table"),
    ):
        page.locator(elem).screenshot(path=str(shots() / f"{name}.png"))
